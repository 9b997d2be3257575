//! Device plugins: the DaemonSets that run a Module's `spec.devicePlugin` on the nodes where
//! the module is loaded (seed 002, "Implementation details", flow step 1).
//!
//! A Module has one device-plugin DaemonSet, or, during an ordered upgrade, one per version:
//! the DaemonSet of a version selects the nodes whose
//! `beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name>` label names that version,
//! so the old and the new device plugin run side by side while the version-label controller
//! moves nodes over one at a time. [`decide`] takes the Module and the DaemonSets in its
//! namespace and returns one [`Step`] per DaemonSet:
//!
//! | Module | DaemonSet | step |
//! | --- | --- | --- |
//! | being deleted | any | delete ([`Why::ModuleDeleted`]) |
//! | without `devicePlugin` | any | delete ([`Why::NoDevicePlugin`]) |
//! | with `devicePlugin` | none for the Module's version | apply ([`Why::Missing`]) |
//! | with `devicePlugin` | the Module's version, differs from the wanted one | apply ([`Why::OutOfDate`]) |
//! | with `devicePlugin` | the Module's version, as wanted | nothing ([`Why::UpToDate`]) |
//! | with `devicePlugin` | the Module's version under another name | delete ([`Why::Duplicate`]) |
//! | with `devicePlugin` | another version, status not caught up or a pod scheduled | nothing ([`Why::OldVersionInUse`]) |
//! | with `devicePlugin` | another version, observed to schedule nothing | delete ([`Why::OldVersionIdle`]) |
//! | any | already being deleted | nothing ([`Why::AlreadyDeleting`]) |
//!
//! DaemonSets of other Modules, or without the device-plugin role, are not looked at.
//!
//! A step that creates or deletes a DaemonSet is told on the Module by an Event
//! ([`Step::event`]); an update is not:
//!
//! | step | Event |
//! | --- | --- |
//! | apply, [`Why::Missing`] | `DevicePluginCreated` |
//! | delete, [`Why::OldVersionIdle`], [`Why::ModuleDeleted`], [`Why::NoDevicePlugin`] or [`Why::Duplicate`] | `DevicePluginDeleted`, saying why |
//! | any other | none |
//!
//! After the steps, [`status_step`] decides `status.devicePlugin`:
//!
//! | Module | counts ([`plugin_status`]) | status |
//! | --- | --- | --- |
//! | being deleted | any | left as it is ([`StatusStep::ModuleDeleted`]) |
//! | not being deleted | as `status.devicePlugin` says | no write ([`StatusStep::Unchanged`]) |
//! | not being deleted | different | written ([`StatusStep::Write`]) |
//!
//! An old version's DaemonSet goes only once its status, observed at its current
//! generation, shows no node that should run its pod, runs it, or still runs it wrongly
//! (`desiredNumberScheduled`, `currentNumberScheduled`, `numberMisscheduled` all 0): a node
//! still running that version's device plugin keeps it. Upstream KMM looks only at
//! `desiredNumberScheduled`, which drops to 0 while a pod is still terminating.
//!
//! The wanted DaemonSet follows upstream's pod template (`internal/controllers/
//! device_plugin_reconciler.go`): containers `device-plugin` and `device-plugin-init`,
//! privileged, the kubelet's `/var/lib/kubelet/device-plugins` host directory mounted at the
//! same path, priority class `system-node-critical`, the Module's tolerations and image pull
//! secret. Its node selector is the Module's `spec.selector`, plus, when the Module loads a
//! kernel module, the ready label and the version-device-plugin label of its version.
//! Upstream uses the Module's selector only for Modules without a module loader; keeping it
//! for the others stops the device plugin on a node leaving the selector before the module
//! is unloaded there.
//!
//! Its pods carry the finalizer `kmm.node.kubernetes.io/node-labeler`, as upstream's: the
//! [`ready_label`] labeller sets `kmm.node.kubernetes.io/<ns>.<name>.device-plugin-ready` on
//! a node while a pod is ready there, and the finalizer keeps a deleted pod until its node
//! has lost that label.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{HostPathVolumeSource, PodSpec, Volume, VolumeMount};

use super::module_daemon_sets::{
    check_version, container, has_labels, is_applied, node_selector, non_empty, non_empty_list,
    owned_daemon_set, owner, schedules_nothing, status_counts,
};
use super::module_nmc::ModuleFacts;
use super::node::NodeFacts;
use capstan_api::canonical::sha256_hex;
use capstan_api::labels::{
    DEVICE_PLUGIN_ROLE, KUBELET_DEVICE_PLUGINS_PATH, KUBELET_DEVICE_PLUGINS_VOLUME, LABEL_NAME_MAX,
    ModuleKey, NODE_LABELER_FINALIZER,
};
use capstan_api::module::{DaemonSetStatus, DevicePluginSpec};

#[cfg(test)]
pub(crate) mod module_fixtures;
pub mod ready_label;
pub mod reconciler;

/// What every device-plugin DaemonSet name starts with after the Module's name, as
/// upstream's `<module>-device-plugin-` generated names do.
pub const NAME_SUFFIX: &str = "-device-plugin";
/// Name of the device plugin container.
pub const CONTAINER_NAME: &str = "device-plugin";
/// Name of the device plugin's init container.
pub const INIT_CONTAINER_NAME: &str = "device-plugin-init";
/// Priority class of device plugin pods, as upstream: evicted last.
pub const PRIORITY_CLASS: &str = "system-node-critical";
/// Longest DaemonSet name this controller makes: the length of a DNS label, so that the
/// name fits wherever Kubernetes copies it into a label value.
const NAME_MAX: usize = LABEL_NAME_MAX;
/// Hex digits of the version digest in a name whose version had to be altered or cut.
const NAME_HASH_BYTES: usize = 4;

/// Why the wanted DaemonSet cannot be made.
pub type DevicePluginError = super::module_daemon_sets::DaemonSetError;

/// What to do with one DaemonSet, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The DaemonSet's name (in the Module's namespace).
    pub daemon_set: String,
    /// The write, if any.
    pub action: StepAction,
    /// The row of the decision table that chose it.
    pub why: Why,
}

/// The write to one DaemonSet.
pub type StepAction = super::module_daemon_sets::Action<DaemonSet>;

/// The row of the decision table a step took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The Module is being deleted: its device plugins stop so the module can be unloaded.
    ModuleDeleted,
    /// The Module has no `devicePlugin`.
    NoDevicePlugin,
    /// No DaemonSet runs the device plugin of the Module's version yet.
    Missing,
    /// The DaemonSet of the Module's version differs from the wanted one.
    OutOfDate,
    /// The DaemonSet of the Module's version is as wanted.
    UpToDate,
    /// Another DaemonSet than the wanted one runs the Module's version.
    Duplicate,
    /// A DaemonSet of another version may still have a pod on some node, or its status
    /// has not caught up with its spec.
    OldVersionInUse,
    /// A DaemonSet of another version is observed to schedule no pod anywhere.
    OldVersionIdle,
    /// The DaemonSet is already being deleted.
    AlreadyDeleting,
}

/// The steps for the Module's device-plugin DaemonSets, given every DaemonSet of its
/// namespace (`existing`); the apply, if any, comes first.
///
/// Fails when a DaemonSet is wanted but cannot be made (see [`daemon_set`]); nothing is
/// to be written then.
pub fn decide(
    module: &ModuleFacts,
    existing: &[&DaemonSet],
) -> Result<Vec<Step>, DevicePluginError> {
    let owned: Vec<&DaemonSet> = existing
        .iter()
        .copied()
        .filter(|ds| belongs_to(&module.key, ds))
        .collect();
    let removal = if module.deleting() {
        Some(Why::ModuleDeleted)
    } else if module.object.spec.device_plugin.is_none() {
        Some(Why::NoDevicePlugin)
    } else {
        None
    };
    if let Some(why) = removal {
        return Ok(owned
            .into_iter()
            .map(|ds| step_for_unwanted(ds, why))
            .collect());
    }
    let version = module.object.version();
    let wanted = daemon_set(module, version)?;
    let wanted_name = wanted.metadata.name.clone().unwrap_or_default();
    let mut steps = Vec::new();
    let current = owned
        .iter()
        .find(|ds| ds.metadata.name.as_deref() == Some(wanted_name.as_str()));
    steps.push(match current {
        Some(ds) if ds.metadata.deletion_timestamp.is_some() => {
            unchanged(&wanted_name, Why::AlreadyDeleting)
        }
        Some(ds) if is_applied(&wanted, ds) => unchanged(&wanted_name, Why::UpToDate),
        Some(_) => apply(wanted, Why::OutOfDate),
        None => apply(wanted, Why::Missing),
    });
    for ds in owned
        .into_iter()
        .filter(|ds| ds.metadata.name.as_deref() != Some(wanted_name.as_str()))
    {
        let why = if daemon_set_version(&module.key, ds) == version {
            Why::Duplicate
        } else if schedules_nothing(ds) {
            Why::OldVersionIdle
        } else {
            Why::OldVersionInUse
        };
        steps.push(step_for_unwanted(ds, why));
    }
    Ok(steps)
}

/// An Event the device-plugin controller records on the Module (type Normal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// `DevicePluginCreated` or `DevicePluginDeleted`.
    pub reason: &'static str,
    /// Which DaemonSet, and for a deletion why.
    pub note: String,
}

impl Step {
    /// The Event this step is worth on the Module once written: creations and deletions,
    /// not updates (see the module's table).
    pub fn event(&self) -> Option<Event> {
        let name = &self.daemon_set;
        let deleted = |why: &str| {
            Some(Event {
                reason: "DevicePluginDeleted",
                note: format!("deleted device-plugin DaemonSet {name}: {why}"),
            })
        };
        match (&self.action, self.why) {
            (StepAction::Apply(_), Why::Missing) => Some(Event {
                reason: "DevicePluginCreated",
                note: format!("created device-plugin DaemonSet {name}"),
            }),
            (StepAction::Delete { .. }, Why::OldVersionIdle) => {
                deleted("its version runs on no node")
            }
            (StepAction::Delete { .. }, Why::ModuleDeleted) => {
                deleted("the Module is being deleted")
            }
            (StepAction::Delete { .. }, Why::NoDevicePlugin) => {
                deleted("the Module has no devicePlugin")
            }
            (StepAction::Delete { .. }, Why::Duplicate) => deleted("another runs the same version"),
            _ => None,
        }
    }
}

/// What to do with a Module's status counts (`status.devicePlugin`, `status.dra`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StatusStep {
    /// The Module is being deleted: its status is left as it is, and it is looked at
    /// again when it changes.
    ModuleDeleted,
    /// The status already holds the counts: no write.
    Unchanged,
    /// Write these counts.
    Write(DaemonSetStatus),
}

impl StatusStep {
    /// The step for a Module whose status holds `current` and whose DaemonSets count
    /// `counts`.
    pub fn of(module: &ModuleFacts, current: &DaemonSetStatus, counts: DaemonSetStatus) -> Self {
        if module.deleting() {
            StatusStep::ModuleDeleted
        } else if counts == *current {
            StatusStep::Unchanged
        } else {
            StatusStep::Write(counts)
        }
    }
}

/// What to do with `status.devicePlugin` of the Module, which holds `current`, given the
/// nodes and every DaemonSet of its namespace (`existing`): see the module's table.
pub fn status_step<'a>(
    module: &ModuleFacts,
    current: &DaemonSetStatus,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    existing: &[&DaemonSet],
) -> StatusStep {
    StatusStep::of(module, current, plugin_status(module, nodes, existing))
}

/// `status.devicePlugin` of the Module: `nodesMatchingSelectorNumber` counts the nodes
/// its selector targets whose taints `spec.tolerations` tolerate (without the pressure
/// tolerations the module loader adds, as upstream's `GetNumTargetedNodes`), whatever
/// their state,
/// `desiredNumber` and `availableNumber` add up `desiredNumberScheduled` and
/// `numberAvailable` of its device-plugin DaemonSets (every version). All zero for a
/// Module without `devicePlugin`.
///
/// Upstream KMM reports the targeted nodes as `desiredNumber`; the DaemonSets' own count
/// is used here, so that it says how many nodes should run the device plugin now (those
/// where the module is loaded) and `availableNumber` reaches it once they all do.
pub fn plugin_status<'a>(
    module: &ModuleFacts,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    existing: &[&DaemonSet],
) -> DaemonSetStatus {
    if module.object.spec.device_plugin.is_none() {
        return DaemonSetStatus::default();
    }
    let owned = existing
        .iter()
        .copied()
        .filter(|ds| belongs_to(&module.key, ds));
    status_counts(module, nodes, owned)
}

/// True when `ds` is a device-plugin DaemonSet of the Module `key`: in its namespace, with
/// the device-plugin role and the Module's name label.
pub fn belongs_to(key: &ModuleKey, ds: &DaemonSet) -> bool {
    has_labels(&ds.metadata, DEVICE_PLUGIN_ROLE, key)
}

/// The version a device-plugin DaemonSet of `key` runs: its version-device-plugin label,
/// `None` when it has none (a Module without version).
pub fn daemon_set_version<'a>(key: &ModuleKey, ds: &'a DaemonSet) -> Option<&'a str> {
    ds.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(&key.version_device_plugin_label()))
        .map(String::as_str)
}

/// The name of the Module's device-plugin DaemonSet for `version`:
/// `<module>-device-plugin` without a version, `<module>-device-plugin-<version>` with one.
///
/// The name has at most 63 characters and is a valid object name. A version that is not already one
/// (upper case, `.` or `_`) is lower-cased with every other character made `-`, and the
/// first 8 hex digits of its SHA-256 are appended, so that versions differing only there get
/// different names; a version too long for the limit is cut, with the digest appended.
pub fn daemon_set_name(key: &ModuleKey, version: Option<&str>) -> String {
    let base = format!("{}{NAME_SUFFIX}", key.name());
    let Some(version) = version else {
        return base;
    };
    let sanitised = dns_label_part(version);
    let exact = format!("{base}-{sanitised}");
    if sanitised == version && exact.len() <= NAME_MAX {
        return exact;
    }
    let hash = sha256_hex(version.as_bytes(), NAME_HASH_BYTES);
    let mut head = if sanitised.is_empty() { base } else { exact };
    // Module names are ASCII (a DNS subdomain), and so is the sanitised version.
    head.truncate(NAME_MAX - hash.len() - 1);
    let head = head.trim_end_matches(['-', '.']);
    format!("{head}-{hash}")
}

/// The labels of the device-plugin DaemonSet of `version`, which are also its selector and
/// its pods' labels: the device-plugin role, the Module's name and, with a version, the
/// version-device-plugin label naming it (as upstream labels versioned device plugins).
pub fn daemon_set_labels(key: &ModuleKey, version: Option<&str>) -> BTreeMap<String, String> {
    super::module_daemon_sets::daemon_set_labels(DEVICE_PLUGIN_ROLE, key, version)
}

/// The wanted device-plugin DaemonSet of the Module for `version`, owned by the Module and
/// annotated with the digest of its content (see
/// [`capstan_api::labels::APPLIED_DIGEST_ANNOTATION`]).
///
/// Fails when the version cannot be a label value or the Module has no uid.
pub fn daemon_set(
    module: &ModuleFacts,
    version: Option<&str>,
) -> Result<DaemonSet, DevicePluginError> {
    let key = &module.key;
    check_version(key, version)?;
    let owner = owner(module)?;
    let spec = &module.object.spec;
    let plugin = spec.device_plugin.clone().unwrap_or_default();
    Ok(owned_daemon_set(
        daemon_set_name(key, version),
        key,
        daemon_set_labels(key, version),
        owner,
        // A deleted pod stays until its node's device-plugin-ready label is settled (see
        // `ready_label`).
        Some(vec![NODE_LABELER_FINALIZER.to_string()]),
        pod_spec(&plugin, spec, node_selector(key, spec, version)),
    ))
}

/// The device plugin pod: upstream's template, from `spec.devicePlugin` and the Module.
fn pod_spec(
    plugin: &DevicePluginSpec,
    module: &capstan_api::module::ModuleSpec,
    node_selector: BTreeMap<String, String>,
) -> PodSpec {
    let kubelet_mount = VolumeMount {
        name: KUBELET_DEVICE_PLUGINS_VOLUME.to_string(),
        mount_path: KUBELET_DEVICE_PLUGINS_PATH.to_string(),
        ..VolumeMount::default()
    };
    let kubelet_volume = Volume {
        name: KUBELET_DEVICE_PLUGINS_VOLUME.to_string(),
        host_path: Some(HostPathVolumeSource {
            path: KUBELET_DEVICE_PLUGINS_PATH.to_string(),
            type_: Some("Directory".to_string()),
        }),
        ..Volume::default()
    };
    // The kubelet's directory is mounted after the Module's own mounts.
    let mut plugin_container = container(&plugin.container, CONTAINER_NAME);
    let mounts: Vec<VolumeMount> = plugin
        .container
        .volume_mounts
        .iter()
        .cloned()
        .chain([kubelet_mount])
        .collect();
    plugin_container.volume_mounts = non_empty_list(&mounts);
    PodSpec {
        init_containers: plugin
            .init_container
            .as_ref()
            .map(|init| vec![container(init, INIT_CONTAINER_NAME)]),
        containers: vec![plugin_container],
        priority_class_name: Some(PRIORITY_CLASS.to_string()),
        image_pull_secrets: module.image_repo_secret.clone().map(|secret| vec![secret]),
        node_selector: Some(node_selector),
        service_account_name: non_empty(&plugin.service_account_name),
        automount_service_account_token: plugin.automount_service_account_token,
        volumes: Some(
            std::iter::once(kubelet_volume)
                .chain(plugin.volumes.iter().cloned())
                .collect(),
        ),
        tolerations: non_empty_list(&module.tolerations),
        ..PodSpec::default()
    }
}

/// The step for a DaemonSet that must go, unless it is already going.
fn step_for_unwanted(ds: &DaemonSet, why: Why) -> Step {
    let name = ds.metadata.name.clone().unwrap_or_default();
    if ds.metadata.deletion_timestamp.is_some() {
        return unchanged(&name, Why::AlreadyDeleting);
    }
    if why == Why::OldVersionInUse {
        return unchanged(&name, why);
    }
    Step {
        daemon_set: name,
        action: StepAction::Delete {
            uid: ds.metadata.uid.clone(),
            resource_version: ds.metadata.resource_version.clone(),
        },
        why,
    }
}

fn unchanged(name: &str, why: Why) -> Step {
    Step {
        daemon_set: name.to_string(),
        action: StepAction::Unchanged,
        why,
    }
}

fn apply(ds: DaemonSet, why: Why) -> Step {
    Step {
        daemon_set: ds.metadata.name.clone().unwrap_or_default(),
        action: StepAction::Apply(Box::new(ds)),
        why,
    }
}

/// Lower case, every character but letters and digits made `-`, runs of `-` made one,
/// none at either end.
fn dns_label_part(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::apps::v1::DaemonSetStatus as AppsStatus;
    use k8s_openapi::api::core::v1::EnvVar;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::{Value, json};

    use super::*;
    use capstan_api::labels::{APPLIED_DIGEST_ANNOTATION, MODULE_NAME_LABEL, ROLE_LABEL};
    use capstan_api::module::{DevicePluginContainerSpec, Module};

    const UID: &str = "4f1c2a9e-0000-4000-8000-000000000001";

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").unwrap()
    }

    /// The reference Module with a device plugin, `version` as given ("" for none).
    fn module(version: &str) -> ModuleFacts {
        let object: Module = serde_json::from_value(json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
            "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": UID},
            "spec": {
                "selector": {"role": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "imageRepoSecret": {"name": "pull-secret"},
                "moduleLoader": {
                    "serviceAccountName": "kmm-worker",
                    "container": {
                        "version": version,
                        "modprobe": {"moduleName": "my_kmod"},
                        "kernelMappings": [{"regexp": "^.+$", "containerImage": "registry.example/my-kmod:v1"}],
                    },
                },
                "devicePlugin": {
                    "container": {"image": "registry.example/device-plugin:v1", "args": ["--verbose"]},
                    "serviceAccountName": "kmm-device-plugin",
                },
            },
        }))
        .unwrap();
        ModuleFacts::from_module(&object).unwrap()
    }

    fn with_image(mut module: ModuleFacts, image: &str) -> ModuleFacts {
        if let Some(plugin) = Arc::make_mut(&mut module.object)
            .spec
            .device_plugin
            .as_mut()
        {
            plugin.container.image = image.to_string();
        }
        module
    }

    /// The DaemonSet `module` wants, as the API server returns it: with defaults, a
    /// uid, a resourceVersion, a generation and a status (`counts` as desired, current,
    /// misscheduled, available; observed at its generation).
    fn live(module: &ModuleFacts, counts: (i32, i32, i32, i32)) -> DaemonSet {
        let wanted = daemon_set(module, module.object.version()).unwrap();
        let mut value = serde_json::to_value(&wanted).unwrap();
        value["metadata"]["uid"] = json!(format!("uid-{}", wanted.metadata.name.unwrap()));
        value["metadata"]["resourceVersion"] = json!("42");
        value["metadata"]["generation"] = json!(1);
        value["metadata"]["annotations"]["deprecated.daemonset.template.generation"] = json!("1");
        value["spec"]["revisionHistoryLimit"] = json!(10);
        let pod = &mut value["spec"]["template"]["spec"];
        pod["dnsPolicy"] = json!("ClusterFirst");
        pod["restartPolicy"] = json!("Always");
        pod["securityContext"] = json!({});
        pod["containers"][0]["terminationMessagePath"] = json!("/dev/termination-log");
        pod["containers"][0]["imagePullPolicy"] = json!("IfNotPresent");
        pod["containers"][0]["resources"] = json!({});
        let mut ds: DaemonSet = serde_json::from_value(value).unwrap();
        ds.status = Some(status(counts, 1));
        ds
    }

    fn status(counts: (i32, i32, i32, i32), observed: i64) -> AppsStatus {
        let (desired, current, misscheduled, available) = counts;
        AppsStatus {
            desired_number_scheduled: desired,
            current_number_scheduled: current,
            number_misscheduled: misscheduled,
            number_ready: available,
            number_available: Some(available),
            observed_generation: Some(observed),
            ..AppsStatus::default()
        }
    }

    /// A live DaemonSet of `version` for the reference Module (the wanted one of a Module
    /// of that version), renamed to `name` when given.
    fn of_version(version: &str, counts: (i32, i32, i32, i32), name: Option<&str>) -> DaemonSet {
        let mut ds = live(&module(version), counts);
        if let Some(name) = name {
            ds.metadata.name = Some(name.to_string());
        }
        ds
    }

    fn deleting(mut module: ModuleFacts) -> ModuleFacts {
        Arc::make_mut(&mut module.object)
            .metadata
            .deletion_timestamp = Some(Time("2026-03-01T10:00:00Z".parse().unwrap()));
        module
    }

    fn being_deleted(mut ds: DaemonSet) -> DaemonSet {
        ds.metadata.deletion_timestamp = Some(Time("2026-03-01T10:00:00Z".parse().unwrap()));
        ds
    }

    /// `(DaemonSet, "apply" | "delete" | "unchanged", why)` for each step.
    fn summary(steps: Vec<Step>) -> Vec<(String, &'static str, Why)> {
        steps
            .into_iter()
            .map(|step| {
                let action = match step.action {
                    StepAction::Apply(_) => "apply",
                    StepAction::Delete { .. } => "delete",
                    StepAction::Unchanged => "unchanged",
                };
                (step.daemon_set, action, step.why)
            })
            .collect()
    }

    struct Row {
        name: &'static str,
        module: ModuleFacts,
        existing: Vec<DaemonSet>,
        want: Vec<(&'static str, &'static str, Why)>,
    }

    #[test]
    fn device_plugin_decision_table() {
        const V1: &str = "my-kmod-device-plugin-v1";
        const V2: &str = "my-kmod-device-plugin-v2";
        let v1 = module("v1");
        let v2 = module("v2");
        let mut without_plugin = module("v1");
        Arc::make_mut(&mut without_plugin.object).spec.device_plugin = None;
        let mut with_env = v1.clone();
        if let Some(plugin) = Arc::make_mut(&mut with_env.object)
            .spec
            .device_plugin
            .as_mut()
        {
            plugin.container.env = vec![EnvVar {
                name: "DEBUG".to_string(),
                value: Some("1".to_string()),
                ..EnvVar::default()
            }];
        }
        let env_removed = live(&with_env, (2, 2, 0, 2));
        let mut drifted = live(&v1, (2, 2, 0, 2));
        if let Some(spec) = drifted.spec.as_mut() {
            spec.template.spec.as_mut().unwrap().containers[0].image =
                Some("registry.example/device-plugin:hotfix".to_string());
        }
        let mut not_observed = of_version("v1", (0, 0, 0, 0), None);
        not_observed.metadata.generation = Some(2);
        let mut no_status = of_version("v1", (0, 0, 0, 0), None);
        no_status.status = None;
        let mut other_module = live(&v1, (0, 0, 0, 0));
        other_module.metadata.name = Some("other-device-plugin-v1".to_string());
        other_module
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MODULE_NAME_LABEL.to_string(), "other".to_string());
        let mut other_namespace = of_version("v1", (0, 0, 0, 0), None);
        other_namespace.metadata.namespace = Some("elsewhere".to_string());
        let mut without_role = of_version("v1", (0, 0, 0, 0), Some("my-kmod-loader"));
        without_role
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(ROLE_LABEL);
        let rows = [
            Row {
                name: "seed 002: no DaemonSet for the Module's version -> created",
                module: v1.clone(),
                existing: vec![],
                want: vec![(V1, "apply", Why::Missing)],
            },
            Row {
                name: "unversioned Module -> one DaemonSet without version",
                module: module(""),
                existing: vec![],
                want: vec![("my-kmod-device-plugin", "apply", Why::Missing)],
            },
            Row {
                name: "DaemonSet as wanted, with the server's defaults and status -> no write",
                module: v1.clone(),
                existing: vec![live(&v1, (2, 2, 0, 2))],
                want: vec![(V1, "unchanged", Why::UpToDate)],
            },
            Row {
                name: "device plugin image changed -> applied again",
                module: with_image(v1.clone(), "registry.example/device-plugin:v1.1"),
                existing: vec![live(&v1, (2, 2, 0, 2))],
                want: vec![(V1, "apply", Why::OutOfDate)],
            },
            Row {
                name: "a field the Module no longer sets -> applied again (digest differs)",
                module: v1.clone(),
                existing: vec![env_removed],
                want: vec![(V1, "apply", Why::OutOfDate)],
            },
            Row {
                name: "a field changed by hand -> applied again",
                module: v1.clone(),
                existing: vec![drifted],
                want: vec![(V1, "apply", Why::OutOfDate)],
            },
            Row {
                name: "seed 002: v1 -> v2, v1 still runs on a node -> v2 created, v1 kept",
                module: v2.clone(),
                existing: vec![of_version("v1", (1, 1, 0, 1), None)],
                want: vec![
                    (V2, "apply", Why::Missing),
                    (V1, "unchanged", Why::OldVersionInUse),
                ],
            },
            Row {
                name: "old version with a pod on a node it no longer selects -> kept",
                module: v2.clone(),
                existing: vec![
                    live(&v2, (2, 2, 0, 2)),
                    of_version("v1", (0, 0, 1, 0), None),
                ],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "unchanged", Why::OldVersionInUse),
                ],
            },
            Row {
                name: "old version counted current but not desired -> kept",
                module: v2.clone(),
                existing: vec![
                    live(&v2, (2, 2, 0, 2)),
                    of_version("v1", (0, 1, 0, 0), None),
                ],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "unchanged", Why::OldVersionInUse),
                ],
            },
            Row {
                name: "old version whose status is behind its generation -> kept",
                module: v2.clone(),
                existing: vec![live(&v2, (2, 2, 0, 2)), not_observed],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "unchanged", Why::OldVersionInUse),
                ],
            },
            Row {
                name: "old version without status -> kept",
                module: v2.clone(),
                existing: vec![live(&v2, (2, 2, 0, 2)), no_status],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "unchanged", Why::OldVersionInUse),
                ],
            },
            Row {
                name: "seed 002: every node moved to v2, v1 schedules nothing -> v1 deleted",
                module: v2.clone(),
                existing: vec![
                    live(&v2, (3, 3, 0, 3)),
                    of_version("v1", (0, 0, 0, 0), None),
                ],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "delete", Why::OldVersionIdle),
                ],
            },
            Row {
                name: "old version already being deleted -> left to finish",
                module: v2.clone(),
                existing: vec![
                    live(&v2, (3, 3, 0, 3)),
                    being_deleted(of_version("v1", (0, 0, 0, 0), None)),
                ],
                want: vec![
                    (V2, "unchanged", Why::UpToDate),
                    (V1, "unchanged", Why::AlreadyDeleting),
                ],
            },
            Row {
                name: "the Module's version under another name -> deleted once ours exists",
                module: v1.clone(),
                existing: vec![of_version(
                    "v1",
                    (2, 2, 0, 2),
                    Some("my-kmod-device-plugin-x7k2p"),
                )],
                want: vec![
                    (V1, "apply", Why::Missing),
                    ("my-kmod-device-plugin-x7k2p", "delete", Why::Duplicate),
                ],
            },
            Row {
                name: "wanted DaemonSet being deleted -> waited for, made again once gone",
                module: v1.clone(),
                existing: vec![being_deleted(live(&v1, (2, 2, 0, 2)))],
                want: vec![(V1, "unchanged", Why::AlreadyDeleting)],
            },
            Row {
                name: "upstream: Module deleted -> every device plugin deleted at once",
                module: deleting(v2.clone()),
                existing: vec![
                    live(&v2, (3, 3, 0, 3)),
                    of_version("v1", (1, 1, 0, 1), None),
                ],
                want: vec![
                    (V2, "delete", Why::ModuleDeleted),
                    (V1, "delete", Why::ModuleDeleted),
                ],
            },
            Row {
                name: "Module deleted, DaemonSet already going -> left to finish",
                module: deleting(v1.clone()),
                existing: vec![being_deleted(live(&v1, (0, 0, 0, 0)))],
                want: vec![(V1, "unchanged", Why::AlreadyDeleting)],
            },
            Row {
                name: "Module deleted, no DaemonSet -> nothing",
                module: deleting(v1.clone()),
                existing: vec![],
                want: vec![],
            },
            Row {
                name: "devicePlugin removed from the Module -> its DaemonSets deleted",
                module: without_plugin.clone(),
                existing: vec![live(&v1, (2, 2, 0, 2))],
                want: vec![(V1, "delete", Why::NoDevicePlugin)],
            },
            Row {
                name: "no devicePlugin, no DaemonSet -> nothing",
                module: without_plugin,
                existing: vec![],
                want: vec![],
            },
            Row {
                name: "other Modules' and other roles' DaemonSets -> not looked at",
                module: deleting(v1.clone()),
                existing: vec![other_module, other_namespace, without_role],
                want: vec![],
            },
        ];
        for row in rows {
            let existing: Vec<&DaemonSet> = row.existing.iter().collect();
            let got = summary(decide(&row.module, &existing).unwrap());
            let want: Vec<(String, &str, Why)> = row
                .want
                .into_iter()
                .map(|(name, action, why)| (name.to_string(), action, why))
                .collect();
            assert_eq!(got, want, "{}", row.name);
        }
    }

    #[test]
    fn creations_and_deletions_are_told_on_the_module_updates_are_not() {
        let step = |action: StepAction, why: Why| Step {
            daemon_set: "my-kmod-device-plugin-v1".to_string(),
            action,
            why,
        };
        let apply = || StepAction::Apply(Box::new(DaemonSet::default()));
        let delete = || StepAction::Delete {
            uid: None,
            resource_version: None,
        };
        let deleted = |why: &str| {
            Some(Event {
                reason: "DevicePluginDeleted",
                note: format!("deleted device-plugin DaemonSet my-kmod-device-plugin-v1: {why}"),
            })
        };
        let rows = [
            (
                step(apply(), Why::Missing),
                Some(Event {
                    reason: "DevicePluginCreated",
                    note: "created device-plugin DaemonSet my-kmod-device-plugin-v1".to_string(),
                }),
            ),
            (step(apply(), Why::OutOfDate), None),
            (
                step(delete(), Why::OldVersionIdle),
                deleted("its version runs on no node"),
            ),
            (
                step(delete(), Why::ModuleDeleted),
                deleted("the Module is being deleted"),
            ),
            (
                step(delete(), Why::NoDevicePlugin),
                deleted("the Module has no devicePlugin"),
            ),
            (
                step(delete(), Why::Duplicate),
                deleted("another runs the same version"),
            ),
            (step(StepAction::Unchanged, Why::UpToDate), None),
            (step(StepAction::Unchanged, Why::OldVersionInUse), None),
            (step(StepAction::Unchanged, Why::AlreadyDeleting), None),
        ];
        for (step, want) in rows {
            assert_eq!(step.event(), want, "{step:?}");
        }
    }

    #[test]
    fn the_status_is_written_when_its_counts_change_and_left_while_the_module_goes() {
        let nodes = [NodeFacts {
            labels: BTreeMap::from([("role".to_string(), "gpu".to_string())]),
            ..NodeFacts::default()
        }];
        let v1 = module("v1");
        let ds = live(&v1, (1, 1, 0, 1));
        let existing = [&ds];
        let counts = DaemonSetStatus {
            nodes_matching_selector_number: 1,
            desired_number: 1,
            available_number: 1,
        };
        let behind = DaemonSetStatus {
            available_number: 0,
            ..counts.clone()
        };
        let rows = [
            (
                "counts changed -> written",
                &v1,
                &behind,
                StatusStep::Write(counts.clone()),
            ),
            (
                "first counts of a new Module -> written",
                &v1,
                &DaemonSetStatus::default(),
                StatusStep::Write(counts.clone()),
            ),
            (
                "counts as the status says -> no write",
                &v1,
                &counts,
                StatusStep::Unchanged,
            ),
            (
                "Module being deleted -> left",
                &deleting(v1.clone()),
                &behind,
                StatusStep::ModuleDeleted,
            ),
        ];
        for (name, module, current, want) in rows {
            assert_eq!(
                status_step(module, current, &nodes, &existing),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn deletes_are_conditional_on_the_object_decided_on() {
        let v1 = of_version("v1", (0, 0, 0, 0), None);
        let steps = decide(&module("v2"), &[&v1]).unwrap();
        assert_eq!(
            steps[1].action,
            StepAction::Delete {
                uid: Some("uid-my-kmod-device-plugin-v1".to_string()),
                resource_version: Some("42".to_string()),
            }
        );
    }

    #[test]
    fn the_wanted_daemon_set_follows_upstreams_template() {
        let module = module("v1");
        let ds = serde_json::to_value(daemon_set(&module, Some("v1")).unwrap()).unwrap();
        let labels = json!({
            "kmm.node.kubernetes.io/role": "device-plugin",
            "kmm.node.kubernetes.io/module.name": "my-kmod",
            "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
        });
        let digest = ds["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION].clone();
        assert_eq!(digest.as_str().map(str::len), Some(16));
        assert_eq!(
            ds,
            json!({
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {
                    "name": "my-kmod-device-plugin-v1",
                    "namespace": "kmm-demo",
                    "labels": labels,
                    "annotations": {APPLIED_DIGEST_ANNOTATION: digest},
                    "ownerReferences": [{
                        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
                        "kind": "Module",
                        "name": "my-kmod",
                        "uid": UID,
                        "controller": true,
                        "blockOwnerDeletion": true,
                    }],
                },
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {
                            "labels": labels,
                            "finalizers": ["kmm.node.kubernetes.io/node-labeler"],
                        },
                        "spec": {
                            "containers": [{
                                "name": "device-plugin",
                                "image": "registry.example/device-plugin:v1",
                                "args": ["--verbose"],
                                "securityContext": {"privileged": true},
                                "volumeMounts": [{
                                    "name": "kubelet-device-plugins",
                                    "mountPath": "/var/lib/kubelet/device-plugins",
                                }],
                            }],
                            "imagePullSecrets": [{"name": "pull-secret"}],
                            "nodeSelector": {
                                "role": "gpu",
                                "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": "",
                                "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
                            },
                            "priorityClassName": "system-node-critical",
                            "serviceAccountName": "kmm-device-plugin",
                            "tolerations": [{"key": "gpu", "operator": "Exists"}],
                            "volumes": [{
                                "name": "kubelet-device-plugins",
                                "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
                            }],
                        },
                    },
                },
            })
        );
    }

    #[test]
    fn the_modules_containers_volumes_and_mounts_come_first() {
        let mut module = module("");
        let plugin = Arc::make_mut(&mut module.object)
            .spec
            .device_plugin
            .as_mut()
            .unwrap();
        plugin.container.volume_mounts = vec![VolumeMount {
            name: "config".to_string(),
            mount_path: "/etc/plugin".to_string(),
            ..VolumeMount::default()
        }];
        plugin.container.env = vec![EnvVar {
            name: "DEBUG".to_string(),
            value: Some("1".to_string()),
            ..EnvVar::default()
        }];
        plugin.volumes = vec![Volume {
            name: "config".to_string(),
            ..Volume::default()
        }];
        plugin.init_container = Some(DevicePluginContainerSpec {
            image: "registry.example/init:v1".to_string(),
            command: vec!["/init".to_string()],
            ..DevicePluginContainerSpec::default()
        });
        let ds = serde_json::to_value(daemon_set(&module, None).unwrap()).unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(
            pod["initContainers"],
            json!([{
                "name": "device-plugin-init",
                "image": "registry.example/init:v1",
                "command": ["/init"],
                "securityContext": {"privileged": true},
            }])
        );
        assert_eq!(
            pod["containers"][0]["env"],
            json!([{"name": "DEBUG", "value": "1"}])
        );
        let names = |list: &Value| -> Vec<String> {
            list.as_array()
                .unwrap()
                .iter()
                .map(|item| item["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            names(&pod["containers"][0]["volumeMounts"]),
            ["config", "kubelet-device-plugins"]
        );
        assert_eq!(names(&pod["volumes"]), ["kubelet-device-plugins", "config"]);
        // Unversioned: no version label anywhere, the ready label still selects.
        assert_eq!(ds["metadata"]["name"], "my-kmod-device-plugin");
        assert_eq!(
            pod["nodeSelector"],
            json!({"role": "gpu", "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": ""})
        );
        assert_eq!(
            ds["spec"]["selector"]["matchLabels"],
            json!({"kmm.node.kubernetes.io/role": "device-plugin", "kmm.node.kubernetes.io/module.name": "my-kmod"})
        );
    }

    #[test]
    fn without_a_module_loader_the_selector_alone_places_the_device_plugin() {
        let mut module = module("");
        Arc::make_mut(&mut module.object).spec.module_loader = None;
        let ds = daemon_set(&module, None).unwrap();
        let selector = ds.spec.unwrap().template.spec.unwrap().node_selector;
        assert_eq!(
            selector,
            Some(BTreeMap::from([("role".to_string(), "gpu".to_string())]))
        );
    }

    #[test]
    fn a_daemon_set_cannot_be_made_for_a_bad_version_or_a_module_without_uid() {
        let err = decide(&module("v1+build"), &[]).unwrap_err();
        assert!(
            matches!(err, DevicePluginError::InvalidVersion { ref version, .. } if version == "v1+build"),
            "{err}"
        );
        let mut unsaved = module("v1");
        Arc::make_mut(&mut unsaved.object).metadata.uid = None;
        let err = decide(&unsaved, &[]).unwrap_err();
        assert_eq!(
            err,
            DevicePluginError::MissingUid {
                module: "kmm-demo/my-kmod".to_string()
            }
        );
    }

    #[test]
    fn daemon_set_names() {
        let hash = |version: &str| sha256_hex(version.as_bytes(), NAME_HASH_BYTES);
        let long = format!("v{}", "1".repeat(60));
        let cases = [
            (None, "my-kmod-device-plugin".to_string()),
            (Some("v1"), "my-kmod-device-plugin-v1".to_string()),
            (Some("2"), "my-kmod-device-plugin-2".to_string()),
            (
                Some("V1"),
                format!("my-kmod-device-plugin-v1-{}", hash("V1")),
            ),
            (
                Some("1.2.3_rc1"),
                format!("my-kmod-device-plugin-1-2-3-rc1-{}", hash("1.2.3_rc1")),
            ),
            (
                Some(long.as_str()),
                format!(
                    "my-kmod-device-plugin-{}-{}",
                    &long[..(63 - 22 - 9)],
                    hash(&long)
                ),
            ),
        ];
        for (version, want) in cases {
            let got = daemon_set_name(&key(), version);
            assert_eq!(got, want, "{version:?}");
        }
        // Versions that sanitise alike still get different names.
        assert_ne!(
            daemon_set_name(&key(), Some("v1.0")),
            daemon_set_name(&key(), Some("v1_0"))
        );
        // The longest Module name and version still give a DNS-label-sized name.
        let longest = ModuleKey::new("k", "m".repeat(39)).unwrap();
        for version in [None, Some("v1"), Some("V.1"), Some(long.as_str())] {
            let name = daemon_set_name(&longest, version);
            assert!(name.len() <= 63, "{name}");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{name}"
            );
            assert!(!name.ends_with('-') && !name.starts_with('-'), "{name}");
        }
    }

    #[test]
    fn device_plugin_status_counts() {
        let node = |labels: &[(&str, &str)]| NodeFacts {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..NodeFacts::default()
        };
        let nodes = [
            node(&[("role", "gpu")]),
            NodeFacts {
                ready: false,
                ..node(&[("role", "gpu")])
            },
            node(&[("role", "gpu")]),
            node(&[("role", "cpu")]),
        ];
        let v2 = module("v2");
        let mut other_module = live(&v2, (5, 5, 0, 5));
        other_module
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(MODULE_NAME_LABEL.to_string(), "other".to_string());
        let existing = [
            live(&v2, (2, 2, 0, 1)),
            of_version("v1", (1, 1, 0, 1), None),
            other_module,
        ];
        let existing: Vec<&DaemonSet> = existing.iter().collect();
        assert_eq!(
            plugin_status(&v2, &nodes, &existing),
            DaemonSetStatus {
                nodes_matching_selector_number: 3,
                desired_number: 3,
                available_number: 2,
            }
        );
        let mut without_plugin = v2;
        Arc::make_mut(&mut without_plugin.object).spec.device_plugin = None;
        assert_eq!(
            plugin_status(&without_plugin, &nodes, &existing),
            DaemonSetStatus::default()
        );
    }
}
