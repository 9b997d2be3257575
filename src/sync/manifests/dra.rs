//! KMM's rules for a Module's DRA driver (upstream's webhook on main, `validateDRA` and
//! `validateHostPathVolumes`), and those a commit must follow across its documents:
//!
//! - `spec.dra` and `spec.devicePlugin` are mutually exclusive (the CRD's CEL rule,
//!   reported here with the field);
//! - `spec.dra.driverName` and each `spec.dra.deviceClasses[].name` are DNS subdomains,
//!   the class names without repeats;
//! - hostPath volumes of `spec.dra` and `spec.devicePlugin` stay under `/dev`, `/sys`,
//!   `/var`, `/opt` or `/run`, after resolving `.` and `..` as Go's `filepath.Clean`;
//! - user volumes and mounts do not take the names or paths of the DRA driver's preset
//!   ones ([`crate::controllers::dra::preset_conflicts`]);
//! - one DeviceClass is managed by at most one Module of the commit, and is not also
//!   declared as a DeviceClass object of the commit.
//!
//! Upstream also refuses `spec.dra` on a cluster older than Kubernetes 1.34; capstan checks
//! a commit without the cluster, and its DRA controller waits for a cluster that serves
//! DeviceClasses instead.

use std::collections::BTreeMap;

use capstan_api::Module;
use capstan_api::names::dns1123_subdomain_errors;
use k8s_openapi::api::core::v1::Volume;
use serde_json::Value;

use super::ManifestError;
use super::rules::{Finding, Parsed};
use super::yaml::FieldPath;
use crate::controllers::dra::preset_conflicts;

/// Where a hostPath volume of a device plugin or DRA driver may point.
const ALLOWED_HOST_PATHS: [&str; 5] = ["/dev", "/sys", "/var", "/opt", "/run"];

/// The DRA and hostPath rules of one Module.
pub fn module_rules(module: &Module) -> Vec<Finding> {
    let mut found = Vec::new();
    let spec = &module.spec;
    if let Some(plugin) = &spec.device_plugin {
        found.extend(host_paths(
            FieldPath::of(&["spec", "devicePlugin"]),
            &plugin.volumes,
        ));
    }
    let Some(dra) = &spec.dra else {
        return found;
    };
    let at = FieldPath::of(&["spec", "dra"]);
    if spec.device_plugin.is_some() {
        found.push(finding(
            at.clone(),
            "spec.dra and spec.devicePlugin are mutually exclusive: keep one",
        ));
    }
    if dra.driver_name.is_empty() {
        found.push(finding(at.field("driverName"), "is required"));
    } else if let Some(why) = subdomain_problem(&dra.driver_name) {
        found.push(finding(at.field("driverName"), why));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, class) in dra.device_classes.iter().enumerate() {
        let name = at.field("deviceClasses").index(index).field("name");
        if class.name.is_empty() {
            found.push(finding(name, "is required"));
        } else if let Some(why) = subdomain_problem(&class.name) {
            found.push(finding(name, why));
        } else if let Some(first) = seen.insert(&class.name, index) {
            found.push(finding(
                name,
                format!(
                    "{:?} is a duplicate of spec.dra.deviceClasses[{first}].name",
                    class.name
                ),
            ));
        }
    }
    found.extend(host_paths(at.clone(), &dra.volumes));
    for (field, message) in preset_conflicts(dra) {
        found.push(finding(resolve(&field), message));
    }
    found
}

/// DeviceClasses that two Modules of the commit both declare, or that the commit also
/// declares as objects, reported at the later Module's entry.
pub fn device_classes(documents: &[Parsed]) -> Vec<ManifestError> {
    let mut declared: BTreeMap<String, String> = BTreeMap::new();
    for parsed in documents {
        let manifest = &parsed.manifest;
        if manifest.kind == "DeviceClass" && manifest.api_version.starts_with("resource.k8s.io/") {
            declared.insert(
                manifest.name.clone(),
                format!(
                    "is declared as a DeviceClass object at {}:{}",
                    manifest.file, manifest.line
                ),
            );
        }
    }
    let mut errors = Vec::new();
    for parsed in documents {
        let manifest = &parsed.manifest;
        if manifest.kind != "Module" || !manifest.api_version.starts_with("kmm.sigs.x-k8s.io/") {
            continue;
        }
        let classes = manifest
            .object
            .pointer("/spec/dra/deviceClasses")
            .and_then(Value::as_array);
        for (index, class) in classes.into_iter().flatten().enumerate() {
            let Some(name) = class.get("name").and_then(Value::as_str) else {
                continue;
            };
            let path = FieldPath::of(&["spec", "dra", "deviceClasses"])
                .index(index)
                .field("name");
            match declared.get(name) {
                Some(elsewhere) => errors.push(parsed.error(
                    &path,
                    format!(
                        "DeviceClass {name:?} {elsewhere}; a DeviceClass is managed by one Module \
                         or declared as an object, not both"
                    ),
                )),
                None => {
                    declared.insert(
                        name.to_string(),
                        format!(
                            "is managed by Module {}/{} ({}:{})",
                            manifest.namespace.as_deref().unwrap_or_default(),
                            manifest.name,
                            manifest.file,
                            manifest.line
                        ),
                    );
                }
            }
        }
    }
    errors
}

/// The hostPath volumes of `volumes` (under `at`) outside [`ALLOWED_HOST_PATHS`].
fn host_paths(at: FieldPath, volumes: &[Volume]) -> Vec<Finding> {
    volumes
        .iter()
        .enumerate()
        .filter_map(|(index, volume)| {
            let path = &volume.host_path.as_ref()?.path;
            let clean = clean_path(path);
            let allowed = ALLOWED_HOST_PATHS.iter().any(|prefix| {
                clean == *prefix
                    || clean
                        .strip_prefix(prefix)
                        .is_some_and(|rest| rest.starts_with('/'))
            });
            (!allowed).then(|| {
                finding(
                    at.field("volumes")
                        .index(index)
                        .field("hostPath")
                        .field("path"),
                    format!(
                        "hostPath {path:?} is not allowed; only /dev, /sys, /var, /opt and /run \
                         paths are permitted"
                    ),
                )
            })
        })
        .collect()
}

/// `path` as Go's `filepath.Clean` makes it: no empty or `.` segments, `..` resolved
/// lexically (not above the root of an absolute path), `.` for nothing.
fn clean_path(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => match segments.last() {
                Some(&last) if last != ".." => {
                    segments.pop();
                }
                _ if rooted => {}
                _ => segments.push(".."),
            },
            other => segments.push(other),
        }
    }
    let joined = segments.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// Why `name` is not a DNS-1123 subdomain, if it is not one.
fn subdomain_problem(name: &str) -> Option<String> {
    let errors = dns1123_subdomain_errors(name);
    (!errors.is_empty()).then(|| {
        format!(
            "{name:?} is not a valid DNS subdomain: {}",
            errors.join("; ")
        )
    })
}

/// A dotted path with indices (`spec.dra.volumes[0].name`) as a [`FieldPath`].
fn resolve(dotted: &str) -> FieldPath {
    let mut path = FieldPath::root();
    for part in dotted.split('.') {
        let (name, indices) = part.split_once('[').unwrap_or((part, ""));
        path = path.field(name);
        for index in indices.split('[').filter(|i| !i.is_empty()) {
            if let Ok(index) = index.trim_end_matches(']').parse() {
                path = path.index(index);
            }
        }
    }
    path
}

fn finding(path: FieldPath, message: impl Into<String>) -> Finding {
    Finding {
        path,
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(spec: Value) -> Module {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
            "metadata": {"name": "my-kmod", "namespace": "kmm-demo"},
            "spec": spec,
        }))
        .expect("module")
    }

    fn messages(found: Vec<Finding>) -> Vec<String> {
        found
            .into_iter()
            .map(|f| format!("{}: {}", f.path, f.message))
            .collect()
    }

    #[test]
    fn dra_rules_refuse_what_upstreams_webhook_refuses() {
        let dra = |extra: Value| {
            let mut dra = serde_json::json!({
                "driverName": "dra.example.com",
                "container": {"image": "registry.example/dra:v1"},
            });
            if let (Some(dra), Value::Object(extra)) = (dra.as_object_mut(), extra) {
                dra.extend(extra);
            }
            serde_json::json!({"selector": {}, "dra": dra})
        };
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("valid", dra(serde_json::json!({})), vec![]),
            (
                "with a device plugin too",
                {
                    let mut spec = dra(serde_json::json!({}));
                    spec["devicePlugin"] = serde_json::json!({"container": {"image": "r/dp:v1"}});
                    spec
                },
                vec!["spec.dra: spec.dra and spec.devicePlugin are mutually exclusive: keep one"],
            ),
            (
                "empty driver name",
                dra(serde_json::json!({"driverName": ""})),
                vec!["spec.dra.driverName: is required"],
            ),
            (
                "driver name not a subdomain",
                dra(serde_json::json!({"driverName": "Bad_Name"})),
                vec!["spec.dra.driverName: \"Bad_Name\" is not a valid DNS subdomain"],
            ),
            (
                "duplicate class",
                dra(serde_json::json!({"deviceClasses": [{"name": "gpu"}, {"name": "gpu"}]})),
                vec![
                    "spec.dra.deviceClasses[1].name: \"gpu\" is a duplicate of spec.dra.deviceClasses[0].name",
                ],
            ),
            (
                "host path outside the allowed roots",
                dra(serde_json::json!({"volumes": [
                    {"name": "ok", "hostPath": {"path": "/var/lib/x"}},
                    {"name": "etc", "hostPath": {"path": "/etc"}},
                    {"name": "escape", "hostPath": {"path": "/var/../etc"}},
                    {"name": "prefix", "hostPath": {"path": "/variable"}},
                ]})),
                vec![
                    "spec.dra.volumes[1].hostPath.path: hostPath \"/etc\" is not allowed",
                    "spec.dra.volumes[2].hostPath.path: hostPath \"/var/../etc\" is not allowed",
                    "spec.dra.volumes[3].hostPath.path: hostPath \"/variable\" is not allowed",
                ],
            ),
            (
                "preset volume name and mount path",
                dra(serde_json::json!({
                    "volumes": [{"name": "cdi", "emptyDir": {}}],
                    "container": {
                        "image": "r/dra:v1",
                        "volumeMounts": [{"name": "x", "mountPath": "/var/lib/kubelet/plugins/"}],
                    },
                })),
                vec![
                    "spec.dra.volumes[0].name: \"cdi\" is the name of a volume",
                    "spec.dra.container.volumeMounts[0].mountPath: \"/var/lib/kubelet/plugins/\" is already mounted",
                ],
            ),
            (
                "device plugin host path",
                serde_json::json!({"selector": {}, "devicePlugin": {
                    "container": {"image": "r/dp:v1"},
                    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                }}),
                vec!["spec.devicePlugin.volumes[0].hostPath.path: hostPath \"/\" is not allowed"],
            ),
        ];
        for (what, spec, expected) in cases {
            let found = messages(module_rules(&module(spec)));
            assert_eq!(found.len(), expected.len(), "{what}: {found:?}");
            for (found, expected) in found.iter().zip(&expected) {
                assert!(found.starts_with(expected), "{what}: {found:?}");
            }
        }
    }

    #[test]
    fn paths_clean_as_go_cleans_them() {
        let cases = [
            ("/var/lib/../../run", "/run"),
            ("/var/lib/../run", "/var/run"),
            ("/../var", "/var"),
            ("/dev//./x/", "/dev/x"),
            ("var/../..", ".."),
            ("", "."),
            ("/", "/"),
        ];
        for (path, clean) in cases {
            assert_eq!(clean_path(path), clean, "{path}");
        }
    }
}
