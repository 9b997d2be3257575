//! The kinds the embedded API server serves: the built-in ones and those registered
//! through CustomResourceDefinitions, with what discovery and the handlers need.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::pointer::Pointer;

use serde_json::{Value, json};

use super::scale::ScaleSubresource;
use super::schema::{BuiltinSchema, CrdSchema, FieldSchema, WithMetadata};

/// How stored objects of a resource are shown in one served version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// Stored as served; only `apiVersion` differs between versions.
    None,
    /// events.k8s.io/v1 Events are stored as core/v1 Events and converted on the way.
    EventsV1,
}

/// One resource in one served group/version.
pub struct Resource {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// The `status` subresource: main-resource writes keep status, status writes keep the rest.
    pub has_status: bool,
    /// The `scale` subresource: where the kind keeps the replicas an autoscaling/v1
    /// `Scale` shows and writes.
    pub scale: Option<ScaleSubresource>,
    /// Where objects live: one bucket per group/resource, shared by all served versions.
    pub storage: String,
    pub conversion: Conversion,
    pub schema: Arc<dyn FieldSchema>,
    /// Only for custom resources: `openAPIV3Schema` (defaults) and printer columns.
    pub custom: Option<CustomDefinition>,
}

/// What a CRD adds to a custom resource.
pub struct CustomDefinition {
    pub open_api_schema: Value,
    pub printer_columns: Vec<Value>,
}

impl Resource {
    /// `v1` for the core group, `group/version` otherwise.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as Kubernetes names a group/resource in messages (`pods`, `modules.kmm.sigs.x-k8s.io`).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether the kind has a `spec` whose changes bump `metadata.generation`.
    pub fn tracks_generation(&self) -> bool {
        self.custom.is_some()
            || matches!(
                self.plural.as_str(),
                "pods"
                    | "daemonsets"
                    | "statefulsets"
                    | "deployments"
                    | "replicasets"
                    | "replicationcontrollers"
                    | "poddisruptionbudgets"
                    | "customresourcedefinitions"
                    | "services"
            )
    }

    /// The verbs discovery advertises.
    fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
    storage: &'static str,
    conversion: Conversion,
}

const fn builtin(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
) -> Builtin {
    Builtin {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names,
        has_status,
        storage: plural,
        conversion: Conversion::None,
    }
}

const BUILTINS: &[Builtin] = &[
    builtin("", "v1", "Namespace", "namespaces", false, &["ns"], true),
    builtin("", "v1", "Node", "nodes", false, &["no"], true),
    builtin("", "v1", "Pod", "pods", true, &["po"], true),
    builtin("", "v1", "ConfigMap", "configmaps", true, &["cm"], false),
    builtin("", "v1", "Secret", "secrets", true, &[], false),
    builtin(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        true,
        &["sa"],
        false,
    ),
    builtin("", "v1", "Service", "services", true, &["svc"], true),
    builtin(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        true,
        &["rc"],
        true,
    ),
    builtin("", "v1", "Event", "events", true, &["ev"], false),
    Builtin {
        group: "events.k8s.io",
        version: "v1",
        kind: "Event",
        plural: "events",
        namespaced: true,
        short_names: &["ev"],
        has_status: false,
        storage: "events",
        conversion: Conversion::EventsV1,
    },
    builtin("apps", "v1", "DaemonSet", "daemonsets", true, &["ds"], true),
    builtin(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
        &["deploy"],
        true,
    ),
    builtin(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        true,
        &["rs"],
        true,
    ),
    builtin(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        true,
        &["sts"],
        true,
    ),
    builtin(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        true,
        &[],
        false,
    ),
    builtin(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
        &["pdb"],
        true,
    ),
    builtin(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        true,
        &[],
        false,
    ),
    // A simulated node's loaded kernel modules (see `sim::nodes`).
    builtin(
        "sim.capstan.dev",
        "v1",
        "NodeKernel",
        "nodekernels",
        false,
        &[],
        false,
    ),
    builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        &["crd", "crds"],
        true,
    ),
];

/// The categories kube-apiserver gives a built-in kind: `all` (what `kubectl get all`
/// lists) for the workloads and Services.
fn categories(group: &str, plural: &str) -> Vec<String> {
    let all = matches!(
        (group, plural),
        ("", "pods" | "services" | "replicationcontrollers")
            | (
                "apps",
                "daemonsets" | "deployments" | "replicasets" | "statefulsets"
            )
    );
    if all {
        vec!["all".to_string()]
    } else {
        Vec::new()
    }
}

/// A resource addressed by its URL parts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Address {
    group: String,
    version: String,
    plural: String,
}

/// Every served resource; CRDs add and remove theirs while the server runs.
#[derive(Default)]
pub struct Registry {
    resources: RwLock<BTreeMap<Address, Arc<Resource>>>,
}

/// The storage bucket of the CRD kind, used by the store to register custom resources.
pub const CRD_STORAGE: &str = "customresourcedefinitions";

impl Registry {
    /// A registry with the built-in kinds.
    pub fn with_builtins() -> Self {
        let registry = Registry::default();
        let schema: Arc<dyn FieldSchema> = Arc::new(BuiltinSchema);
        for b in BUILTINS {
            registry.insert(Resource {
                group: b.group.into(),
                version: b.version.into(),
                kind: b.kind.into(),
                plural: b.plural.into(),
                singular: b.kind.to_lowercase(),
                namespaced: b.namespaced,
                short_names: b.short_names.iter().map(|s| (*s).into()).collect(),
                categories: categories(b.group, b.plural),
                has_status: b.has_status,
                scale: ScaleSubresource::builtin(b.group, b.plural),
                storage: b.storage.into(),
                conversion: b.conversion,
                schema: schema.clone(),
                custom: None,
            });
        }
        registry
    }

    fn insert(&self, resource: Resource) {
        let address = Address {
            group: resource.group.clone(),
            version: resource.version.clone(),
            plural: resource.plural.clone(),
        };
        self.write().insert(address, Arc::new(resource));
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<Address, Arc<Resource>>> {
        // A panic while holding the lock leaves the map consistent: inserts and removes are single calls.
        self.resources
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<Address, Arc<Resource>>> {
        self.resources
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The resource at `/api[s]/<group>/<version>/<plural>`.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<Resource>> {
        self.read()
            .get(&Address {
                group: group.into(),
                version: version.into(),
                plural: plural.into(),
            })
            .cloned()
    }

    /// The resource serving `kind` in `apiVersion` (for owner references and events).
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<Resource>> {
        let (group, version) = split_api_version(api_version);
        self.read()
            .values()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .cloned()
    }

    /// Any served version of the resource stored in `storage` (for messages and GC).
    pub fn by_storage(&self, storage: &str) -> Option<Arc<Resource>> {
        self.read()
            .values()
            .find(|r| r.storage == storage && r.conversion == Conversion::None)
            .cloned()
    }

    /// All served resources.
    pub fn all(&self) -> Vec<Arc<Resource>> {
        self.read().values().cloned().collect()
    }

    /// Serves (or re-serves) the versions a CRD declares. Returns the storage bucket.
    pub fn register_crd(&self, crd: &Value) -> Option<String> {
        let spec = crd.get("spec")?;
        let group = spec.get("group")?.as_str()?.to_string();
        let names = spec.get("names")?;
        let plural = names.get("plural")?.as_str()?.to_string();
        let kind = names.get("kind")?.as_str()?.to_string();
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase());
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let short_names = strings(names.get("shortNames"));
        let categories = strings(names.get("categories"));
        let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
        let storage = format!("{plural}.{group}");
        self.unregister_crd(&storage);
        for version in spec.get("versions")?.as_array()? {
            if version.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let Some(name) = version.get("name").and_then(Value::as_str) else {
                continue;
            };
            let open_api_schema = version
                .at("/schema/openAPIV3Schema")
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            let has_status = version.at("/subresources/status").is_some();
            let scale = ScaleSubresource::of_crd_version(version);
            let printer_columns = version
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            self.insert(Resource {
                group: group.clone(),
                version: name.to_string(),
                kind: kind.clone(),
                plural: plural.clone(),
                singular: singular.clone(),
                namespaced,
                short_names: short_names.clone(),
                categories: categories.clone(),
                has_status,
                scale,
                storage: storage.clone(),
                conversion: Conversion::None,
                schema: Arc::new(WithMetadata(CrdSchema::new(open_api_schema.clone()))),
                custom: Some(CustomDefinition {
                    open_api_schema,
                    printer_columns,
                }),
            });
        }
        Some(storage)
    }

    /// Stops serving every version of the custom resource stored in `storage`.
    pub fn unregister_crd(&self, storage: &str) {
        self.write()
            .retain(|_, r| !(r.custom.is_some() && r.storage == storage));
    }

    /// `/api` : the core group's versions.
    pub fn core_versions(&self, server_address: &str) -> Value {
        json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        })
    }

    /// `/apis` : every named group with its versions, the storage version preferred.
    pub fn group_list(&self) -> Value {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for address in self.read().keys() {
            if address.group.is_empty() {
                continue;
            }
            let versions = groups.entry(address.group.clone()).or_default();
            if !versions.contains(&address.version) {
                versions.push(address.version.clone());
            }
        }
        let groups: Vec<Value> = groups
            .into_iter()
            .map(|(group, mut versions)| {
                versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
                let entries: Vec<Value> = versions
                    .iter()
                    .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
                    .collect();
                let preferred = entries[0].clone();
                json!({"name": group, "versions": entries, "preferredVersion": preferred})
            })
            .collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `/apis/<group>` : one group.
    pub fn group(&self, group: &str) -> Option<Value> {
        self.group_list()
            .get("groups")?
            .as_array()?
            .iter()
            .find(|g| g.get("name").and_then(Value::as_str) == Some(group))
            .map(|g| {
                let mut g = g.clone();
                g["kind"] = json!("APIGroup");
                g["apiVersion"] = json!("v1");
                g
            })
    }

    /// `/api/v1` or `/apis/<group>/<version>` : the resources of one group/version.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let resources: Vec<Arc<Resource>> = self
            .read()
            .iter()
            .filter(|(a, _)| a.group == group && a.version == version)
            .map(|(_, r)| r.clone())
            .collect();
        if resources.is_empty() {
            return None;
        }
        let mut entries = Vec::new();
        for r in &resources {
            let mut entry = json!({
                "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
                "kind": r.kind, "verbs": r.verbs(),
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                entry["categories"] = json!(r.categories);
            }
            entries.push(entry);
            if r.has_status {
                entries.push(json!({
                    "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                    "kind": r.kind, "verbs": ["get", "patch", "update"],
                }));
            }
            if r.scale.is_some() {
                entries.push(json!({
                    "name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                    "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"],
                }));
            }
            if r.plural == "pods" && r.group.is_empty() {
                entries.push(json!({
                    "name": "pods/eviction", "singularName": "", "namespaced": true,
                    "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"],
                }));
            }
        }
        let group_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        Some(json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": group_version, "resources": entries,
        }))
    }
}

/// Splits `apps/v1` into (`apps`, `v1`) and `v1` into (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// Kubernetes version priority: GA > beta > alpha, higher numbers first.
fn version_priority(version: &str) -> (u8, u32, u32) {
    let Some(rest) = version.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let major_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let major: u32 = rest[..major_end].parse().unwrap_or(0);
    let tail = &rest[major_end..];
    let (stability, minor) = if tail.is_empty() {
        (3, 0)
    } else if let Some(n) = tail.strip_prefix("beta") {
        (2, n.parse().unwrap_or(0))
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n.parse().unwrap_or(0))
    } else {
        (0, 0)
    };
    (stability, major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_sort_as_kubernetes_prefers_them() {
        let mut versions = vec!["v1alpha1", "v1beta1", "v2", "v1", "v1beta2"];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(versions, ["v2", "v1", "v1beta2", "v1beta1", "v1alpha1"]);
    }

    /// Discovery lists a `scale` subresource, as autoscaling/v1 `Scale`, for the kinds
    /// that have one: built-in workloads, and custom resources whose CRD version
    /// declares it.
    #[test]
    fn discovery_lists_scale_subresources() {
        let registry = Registry::with_builtins();
        let crd = json!({"spec": {"group": "example.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {
                "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}}}]}});
        registry.register_crd(&crd);
        let scales = |group: &str, version: &str| -> Vec<String> {
            let list = registry.resource_list(group, version).expect("served");
            list["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .filter(|r| r["kind"] == "Scale")
                .inspect(|r| {
                    assert_eq!(
                        (&r["group"], &r["version"], &r["verbs"]),
                        (
                            &json!("autoscaling"),
                            &json!("v1"),
                            &json!(["get", "patch", "update"])
                        )
                    )
                })
                .map(|r| r["name"].as_str().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(
            scales("apps", "v1"),
            [
                "deployments/scale",
                "replicasets/scale",
                "statefulsets/scale"
            ]
        );
        assert_eq!(scales("", "v1"), ["replicationcontrollers/scale"]);
        assert_eq!(scales("example.dev", "v1"), ["widgets/scale"]);
        assert!(scales("policy", "v1").is_empty());
    }

    #[test]
    fn crd_registration_serves_each_served_version() {
        let registry = Registry::with_builtins();
        let crd = json!({
            "spec": {"group": "example.dev", "scope": "Cluster",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}},
                    {"name": "v1alpha1", "served": false, "storage": false}
                ]}
        });
        assert_eq!(
            registry.register_crd(&crd).as_deref(),
            Some("widgets.example.dev")
        );
        let widget = registry
            .get("example.dev", "v1", "widgets")
            .expect("served");
        assert!(!widget.namespaced && widget.has_status);
        assert!(registry.get("example.dev", "v1alpha1", "widgets").is_none());
        registry.unregister_crd("widgets.example.dev");
        assert!(registry.get("example.dev", "v1", "widgets").is_none());
    }
}
