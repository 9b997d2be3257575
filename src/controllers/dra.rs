//! DRA drivers: the DaemonSets that run a Module's `spec.dra` kubelet plugin, one per module
//! version as the device plugin's, the cluster-scoped DeviceClasses it serves, the
//! `<ns>.<name>.dra-ready` node label ([`ModuleKey::dra_ready_label`]) and `status.dra`
//! (KMM main's `internal/controllers/dra_reconciler.go` and its node labeller).
//!
//! [`decide`] takes the Module, the DaemonSets of its namespace and the DeviceClasses that
//! carry a Module's labels, and returns one [`Step`] per DaemonSet and one [`ClassStep`]
//! per DeviceClass:
//!
//! | Module | object | step |
//! | --- | --- | --- |
//! | being deleted | its DaemonSets, its DeviceClasses | delete ([`Why::ModuleDeleted`]) |
//! | without `dra` | its DaemonSets, its DeviceClasses | delete ([`Why::NoDra`]) |
//! | with `dra` | no DaemonSet for the Module's version | apply ([`Why::Missing`]) |
//! | with `dra` | the Module's version, differs from the wanted one | apply ([`Why::OutOfDate`]) |
//! | with `dra` | the Module's version, as wanted | nothing ([`Why::UpToDate`]) |
//! | with `dra` | the Module's version under another name | delete ([`Why::Duplicate`]) |
//! | with `dra` | another version, status not caught up or a pod scheduled | nothing ([`Why::OldVersionInUse`]) |
//! | with `dra` | another version, observed to schedule nothing | delete ([`Why::OldVersionIdle`]) |
//! | with `dra` | a DeviceClass it lists, missing or different | apply ([`Why::Missing`], [`Why::OutOfDate`]) |
//! | with `dra` | a DeviceClass it lists, as wanted | nothing ([`Why::UpToDate`]) |
//! | with `dra` | a DeviceClass it lists, labelled for another Module | nothing ([`Why::OtherModule`]) |
//! | with `dra` | a DeviceClass labelled for it that it no longer lists | delete ([`Why::NotListed`]) |
//! | any | already being deleted | nothing ([`Why::AlreadyDeleting`]) |
//!
//! The Events the Module gets, each after its step's write ([`Step::event`],
//! [`ClassStep::event`]), or before every write ([`Decision::unsupported_classes`]):
//!
//! | decision | Event |
//! | --- | --- |
//! | DaemonSet applied, [`Why::Missing`] | `DraCreated` |
//! | DaemonSet deleted, [`Why::OldVersionIdle`], [`Why::ModuleDeleted`], [`Why::NoDra`] or [`Why::Duplicate`] | `DraDeleted`, saying why |
//! | DeviceClass left, [`Why::OtherModule`] | Warning `DeviceClassConflict` |
//! | `dra` lists DeviceClasses, the cluster serves none | Warning `DeviceClassesUnsupported` |
//! | any other | none |
//!
//! [`status_step`] decides `status.dra` as the device plugin's
//! ([`device_plugin::status_step`]): left as it is while the Module is being deleted,
//! written only when the counts ([`dra_status`]) changed.
//!
//! The DaemonSet of a version follows upstream's `setDRAAsDesired`: labels `module.name`,
//! `role: dra` and, with a version, the version-device-plugin label, which the DRA driver
//! shares with the device plugin so that one version-label state machine moves both; pod
//! template with containers `dra` and `dra-init`, privileged, host network, priority class
//! `system-node-critical`, the kubelet plugin, plugin registry and CDI host directories,
//! the preset environment and a gRPC liveness probe on [`HEALTHCHECK_PORT`]. Its node
//! selector is the Module's `spec.selector`, plus, with a module loader, the ready label
//! and the version's label (upstream drops the selector when there is a loader; keeping it
//! is the device plugin's rule too). Unlike upstream:
//!
//! - a DaemonSet has a fixed name, `<module>-dra[-<version>]`, so a retried create cannot
//!   make a second one;
//! - a preset environment variable the user's container sets too is left out, so the pod
//!   has one entry per name (server-side apply refuses duplicate keys; upstream's pods get
//!   both, and the user's, being last, wins);
//! - a user volume or mount that takes a preset's name or path is refused
//!   ([`preset_conflicts`]), as the commit's rules refuse it;
//! - a DeviceClass already labelled for another Module is left alone, with an Event,
//!   instead of taken over; an unlabelled one is adopted, as upstream;
//! - the pods carry no `node-labeler` finalizer: the dra-ready label is recomputed from
//!   the pods the cache holds ([`ready_labels`]), so a pod deleted while capstan was down is
//!   seen gone at the next start.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, GRPCAction, HostPathVolumeSource, ObjectFieldSelector, Pod, PodSpec,
    Probe, Volume, VolumeMount,
};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceClassSpec as KubeDeviceClassSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use thiserror::Error;

pub use super::device_plugin::StatusStep;
use super::device_plugin::{self, PRIORITY_CLASS};
pub use super::module_daemon_sets::Action;
use super::module_daemon_sets::{
    DaemonSetError, annotate_digest, check_version, container, has_labels, is_applied,
    node_selector, non_empty, non_empty_list, owned_daemon_set, owner, schedules_nothing,
    status_counts,
};
use super::module_nmc::ModuleFacts;
use super::node::NodeFacts;
use capstan_api::labels::{DRA_ROLE, MODULE_NAME_LABEL, MODULE_NAMESPACE_LABEL, ModuleKey};
use capstan_api::module::{DaemonSetStatus, DraSpec, ModuleSpec};

pub mod reconciler;

/// What every DRA DaemonSet name starts with after the Module's name.
pub const NAME_SUFFIX: &str = "-dra";
/// Name of the DRA driver container.
pub const CONTAINER_NAME: &str = "dra";
/// Name of the DRA driver's init container.
pub const INIT_CONTAINER_NAME: &str = "dra-init";
/// Port of the driver's gRPC health service, probed for liveness and given to the driver
/// as `HEALTHCHECK_PORT`.
pub const HEALTHCHECK_PORT: i32 = 51515;

/// The host directories every DRA driver pod mounts at the same path: (volume, path, type).
pub const PRESET_VOLUMES: [(&str, &str, &str); 3] = [
    (
        "kubelet-plugins",
        "/var/lib/kubelet/plugins/",
        "DirectoryOrCreate",
    ),
    (
        "kubelet-plugins-registry",
        "/var/lib/kubelet/plugins_registry/",
        "Directory",
    ),
    ("cdi", "/var/run/cdi", "DirectoryOrCreate"),
];

/// Why the wanted objects cannot be made.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DraError {
    /// What stops any Module's DaemonSet: its version, its uid.
    #[error(transparent)]
    DaemonSet(#[from] DaemonSetError),
    /// A user volume or mount takes the name or path of a preset one.
    #[error("Module {module}: {}", problems.join("; "))]
    PresetConflict {
        /// `namespace/name` of the Module.
        module: String,
        /// Each conflict, as `field: message`.
        problems: Vec<String>,
    },
}

/// What to do with one DaemonSet, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The DaemonSet's name (in the Module's namespace).
    pub daemon_set: String,
    /// The write, if any.
    pub action: Action<DaemonSet>,
    /// The row of the decision table that chose it.
    pub why: Why,
}

/// What to do with one DeviceClass, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassStep {
    /// The DeviceClass's name.
    pub device_class: String,
    /// The write, if any.
    pub action: Action<DeviceClass>,
    /// The row of the decision table that chose it.
    pub why: Why,
}

/// The row of the decision table a step took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The Module is being deleted.
    ModuleDeleted,
    /// The Module has no `dra`.
    NoDra,
    /// The object does not exist yet.
    Missing,
    /// The object differs from the wanted one.
    OutOfDate,
    /// The object is as wanted.
    UpToDate,
    /// Another DaemonSet than the wanted one runs the Module's version.
    Duplicate,
    /// A DaemonSet of another version may still have a pod on some node, or its status
    /// has not caught up with its spec.
    OldVersionInUse,
    /// A DaemonSet of another version is observed to schedule no pod anywhere.
    OldVersionIdle,
    /// A listed DeviceClass carries the labels of another Module.
    OtherModule,
    /// A DeviceClass labelled for the Module that `spec.dra.deviceClasses` no longer lists.
    NotListed,
    /// The object is already being deleted.
    AlreadyDeleting,
}

/// An Event the DRA controller records on the Module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// A `Warning` (something the Module asks for is not done) rather than `Normal`.
    pub warning: bool,
    /// `DraCreated`, `DraDeleted`, `DeviceClassConflict` or `DeviceClassesUnsupported`.
    pub reason: &'static str,
    /// What was done or left, and why.
    pub note: String,
}

/// The decision for one Module: its DaemonSets (the apply, if any, first) and its
/// DeviceClasses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The Event saying the Module's `spec.dra.deviceClasses` are not made, the cluster
    /// serving no DeviceClasses; `None` when it lists none, is being deleted, or they are
    /// served.
    pub unsupported_classes: Option<Event>,
    /// One step per DRA DaemonSet of the Module, wanted or existing.
    pub daemon_sets: Vec<Step>,
    /// One step per DeviceClass listed or labelled for the Module; empty when the cluster
    /// serves no DeviceClasses.
    pub device_classes: Vec<ClassStep>,
}

/// The steps for the Module's DRA DaemonSets, given every DaemonSet of its namespace
/// (`existing`), and for its DeviceClasses, given every DeviceClass labelled for a Module
/// (`classes`), or `None` when the cluster does not serve `resource.k8s.io/v1` DeviceClasses.
///
/// Fails when a DaemonSet is wanted but cannot be made (see [`daemon_set`]); nothing is
/// to be written then.
pub fn decide(
    module: &ModuleFacts,
    existing: &[&DaemonSet],
    classes: Option<&[&DeviceClass]>,
) -> Result<Decision, DraError> {
    let key = &module.key;
    let owned: Vec<&DaemonSet> = existing
        .iter()
        .copied()
        .filter(|ds| belongs_to(key, ds))
        .collect();
    let labelled: Vec<&DeviceClass> = classes
        .unwrap_or_default()
        .iter()
        .copied()
        .filter(|class| class_owner(class) == Some((key.namespace(), key.name())))
        .collect();
    let removal = if module.deleting() {
        Some(Why::ModuleDeleted)
    } else if module.object.spec.dra.is_none() {
        Some(Why::NoDra)
    } else {
        None
    };
    if let Some(why) = removal {
        return Ok(Decision {
            unsupported_classes: None,
            daemon_sets: owned
                .into_iter()
                .map(|ds| Step {
                    daemon_set: name_of(ds),
                    action: removal_of(ds),
                    why: if ds.metadata.deletion_timestamp.is_some() {
                        Why::AlreadyDeleting
                    } else {
                        why
                    },
                })
                .collect(),
            device_classes: labelled
                .into_iter()
                .map(|class| class_removal(class, why))
                .collect(),
        });
    }
    let version = module.object.version();
    let wanted = daemon_set(module, version)?;
    let wanted_name = name_of(&wanted);
    let current = owned
        .iter()
        .find(|ds| ds.metadata.name.as_deref() == Some(wanted_name.as_str()));
    let mut daemon_sets = vec![match current {
        Some(ds) if ds.metadata.deletion_timestamp.is_some() => Step {
            daemon_set: wanted_name.clone(),
            action: Action::Unchanged,
            why: Why::AlreadyDeleting,
        },
        Some(ds) if is_applied(&wanted, *ds) => Step {
            daemon_set: wanted_name.clone(),
            action: Action::Unchanged,
            why: Why::UpToDate,
        },
        Some(_) => Step {
            daemon_set: wanted_name.clone(),
            action: Action::Apply(Box::new(wanted)),
            why: Why::OutOfDate,
        },
        None => Step {
            daemon_set: wanted_name.clone(),
            action: Action::Apply(Box::new(wanted)),
            why: Why::Missing,
        },
    }];
    for ds in owned
        .into_iter()
        .filter(|ds| ds.metadata.name.as_deref() != Some(wanted_name.as_str()))
    {
        let why = if ds.metadata.deletion_timestamp.is_some() {
            Why::AlreadyDeleting
        } else if device_plugin::daemon_set_version(key, ds) == version {
            Why::Duplicate
        } else if schedules_nothing(ds) {
            Why::OldVersionIdle
        } else {
            Why::OldVersionInUse
        };
        let action = match why {
            Why::Duplicate | Why::OldVersionIdle => removal_of(ds),
            _ => Action::Unchanged,
        };
        daemon_sets.push(Step {
            daemon_set: name_of(ds),
            action,
            why,
        });
    }
    let (device_classes, unsupported_classes) = match classes {
        Some(classes) => (class_steps(module, classes, &labelled), None),
        None => (Vec::new(), unsupported_classes(module)),
    };
    Ok(Decision {
        unsupported_classes,
        daemon_sets,
        device_classes,
    })
}

/// The Warning for a Module with `dra` whose DeviceClasses the cluster cannot hold;
/// `None` when it lists none.
fn unsupported_classes(module: &ModuleFacts) -> Option<Event> {
    let lists_classes = module
        .object
        .spec
        .dra
        .as_ref()
        .is_some_and(|dra| !dra.device_classes.is_empty());
    lists_classes.then(|| Event {
        warning: true,
        reason: "DeviceClassesUnsupported",
        note: "the cluster serves no resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 and \
               later do); spec.dra.deviceClasses are not created"
            .to_string(),
    })
}

impl Step {
    /// The Event this step is worth on the Module once written: creations and deletions,
    /// not updates (see the module's table).
    pub fn event(&self) -> Option<Event> {
        let name = &self.daemon_set;
        let why = match (&self.action, self.why) {
            (Action::Apply(_), Why::Missing) => {
                return Some(Event {
                    warning: false,
                    reason: "DraCreated",
                    note: format!("created DRA driver DaemonSet {name}"),
                });
            }
            (Action::Delete { .. }, Why::OldVersionIdle) => "its version runs on no node",
            (Action::Delete { .. }, Why::ModuleDeleted) => "the Module is being deleted",
            (Action::Delete { .. }, Why::NoDra) => "the Module has no dra",
            (Action::Delete { .. }, Why::Duplicate) => "another runs the same version",
            _ => return None,
        };
        Some(Event {
            warning: false,
            reason: "DraDeleted",
            note: format!("deleted DRA driver DaemonSet {name}: {why}"),
        })
    }
}

impl ClassStep {
    /// The Event this step is worth on the Module: a DeviceClass another Module holds is
    /// left to it, which the Module's author must hear of.
    pub fn event(&self) -> Option<Event> {
        (self.why == Why::OtherModule).then(|| Event {
            warning: true,
            reason: "DeviceClassConflict",
            note: format!(
                "DeviceClass {} is managed by another Module; it is left as it is",
                self.device_class
            ),
        })
    }
}

/// The steps for the DeviceClasses of a Module with `dra`: every listed one, then every
/// one labelled for it that is no longer listed.
fn class_steps(
    module: &ModuleFacts,
    classes: &[&DeviceClass],
    labelled: &[&DeviceClass],
) -> Vec<ClassStep> {
    let key = &module.key;
    let listed = module
        .object
        .spec
        .dra
        .as_ref()
        .map(|dra| dra.device_classes.as_slice())
        .unwrap_or_default();
    let mut steps = Vec::new();
    for spec in listed {
        let live = classes
            .iter()
            .find(|class| class.metadata.name.as_deref() == Some(spec.name.as_str()));
        let wanted = device_class(key, spec);
        let (action, why) = match live {
            Some(class) if class.metadata.deletion_timestamp.is_some() => {
                (Action::Unchanged, Why::AlreadyDeleting)
            }
            Some(class)
                if class_owner(class)
                    .is_some_and(|owner| owner != (key.namespace(), key.name())) =>
            {
                (Action::Unchanged, Why::OtherModule)
            }
            Some(class) if is_applied(&wanted, *class) => (Action::Unchanged, Why::UpToDate),
            Some(_) => (Action::Apply(Box::new(wanted)), Why::OutOfDate),
            None => (Action::Apply(Box::new(wanted)), Why::Missing),
        };
        steps.push(ClassStep {
            device_class: spec.name.clone(),
            action,
            why,
        });
    }
    for class in labelled {
        let name = class.metadata.name.as_deref().unwrap_or_default();
        if !listed.iter().any(|spec| spec.name == name) {
            steps.push(class_removal(class, Why::NotListed));
        }
    }
    steps
}

/// The `(namespace, name)` of the Module a DeviceClass is labelled for.
pub fn class_owner(class: &DeviceClass) -> Option<(&str, &str)> {
    let labels = class.metadata.labels.as_ref()?;
    Some((
        labels.get(MODULE_NAMESPACE_LABEL)?.as_str(),
        labels.get(MODULE_NAME_LABEL)?.as_str(),
    ))
}

/// The wanted DeviceClass of a `spec.dra.deviceClasses` entry: its name, the Module's
/// labels, the entry's selectors and config, and the digest of that content.
pub fn device_class(key: &ModuleKey, spec: &capstan_api::module::DeviceClassSpec) -> DeviceClass {
    let mut class = DeviceClass {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(BTreeMap::from([
                (MODULE_NAME_LABEL.to_string(), key.name().to_string()),
                (
                    MODULE_NAMESPACE_LABEL.to_string(),
                    key.namespace().to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        spec: KubeDeviceClassSpec {
            selectors: non_empty_list(&spec.selectors),
            config: non_empty_list(&spec.config),
            ..KubeDeviceClassSpec::default()
        },
    };
    annotate_digest(&mut class.metadata, &class.spec);
    class
}

/// `status.dra` of the Module: the nodes its selector targets whose taints
/// `spec.tolerations` tolerate, and the `desiredNumberScheduled` and `numberAvailable` of
/// its DRA DaemonSets (every version), as capstan counts the device plugin's. All zero for
/// a Module without `dra`.
pub fn dra_status<'a>(
    module: &ModuleFacts,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    existing: &[&DaemonSet],
) -> DaemonSetStatus {
    if module.object.spec.dra.is_none() {
        return DaemonSetStatus::default();
    }
    let owned = existing
        .iter()
        .copied()
        .filter(|ds| belongs_to(&module.key, ds));
    status_counts(module, nodes, owned)
}

/// What to do with `status.dra` of the Module, which holds `current`, given the nodes and
/// every DaemonSet of its namespace (`existing`): see [`device_plugin::status_step`].
pub fn status_step<'a>(
    module: &ModuleFacts,
    current: &DaemonSetStatus,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    existing: &[&DaemonSet],
) -> StatusStep {
    StatusStep::of(module, current, dra_status(module, nodes, existing))
}

/// The dra-ready label changes on `nodes`: `(node, true)` where a DRA driver pod of the
/// Module runs ready and the node lacks the label, `(node, false)` where the node has the
/// label but no such pod (or the Module is gone or being deleted: `module` `None` or
/// deleting). `pods` are the DRA pods of every Module. In node-name order, so that the
/// writes come in the same order whatever order the node cache holds them in.
pub fn ready_labels<'a>(
    key: &ModuleKey,
    module: Option<&ModuleFacts>,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    pods: &[&Pod],
) -> Vec<(String, bool)> {
    let label = key.dra_ready_label();
    let active = module.is_some_and(|module| !module.deleting());
    let ready_on: BTreeSet<&str> = pods
        .iter()
        .filter(|pod| active && is_pod_of(key, pod) && pod_ready(pod))
        .filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref())
        .collect();
    let mut changes: Vec<(String, bool)> = nodes
        .into_iter()
        .filter_map(|node| {
            let wanted = ready_on.contains(node.name.as_str());
            (wanted != node.labels.contains_key(&label)).then(|| (node.name.clone(), wanted))
        })
        .collect();
    changes.sort();
    changes
}

/// Whether `pod` is a DRA driver pod of `key`: in its namespace, with the DRA role and
/// the Module's name label.
pub fn is_pod_of(key: &ModuleKey, pod: &Pod) -> bool {
    has_labels(&pod.metadata, DRA_ROLE, key)
}

/// Running, Ready, and not being deleted.
fn pod_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// True when `ds` is a DRA DaemonSet of the Module `key`: in its namespace, with the DRA
/// role and the Module's name label.
pub fn belongs_to(key: &ModuleKey, ds: &DaemonSet) -> bool {
    has_labels(&ds.metadata, DRA_ROLE, key)
}

/// The name of the Module's DRA DaemonSet for `version`: `<module>-dra` without a
/// version, `<module>-dra-<version>` with one. The version part is the device plugin's
/// (see [`device_plugin::daemon_set_name`]): the same sanitising and digest, in a name
/// shorter by the difference of the suffixes, so within the same limit.
pub fn daemon_set_name(key: &ModuleKey, version: Option<&str>) -> String {
    let plugin = device_plugin::daemon_set_name(key, version);
    let plugin_base = format!("{}{}", key.name(), device_plugin::NAME_SUFFIX);
    let version_part = plugin.strip_prefix(&plugin_base).unwrap_or_default();
    format!("{}{NAME_SUFFIX}{version_part}", key.name())
}

/// The labels of the DRA DaemonSet of `version`, which are also its selector and its
/// pods' labels: the DRA role, the Module's name and, with a version, the
/// version-device-plugin label naming it.
pub fn daemon_set_labels(key: &ModuleKey, version: Option<&str>) -> BTreeMap<String, String> {
    super::module_daemon_sets::daemon_set_labels(DRA_ROLE, key, version)
}

/// What in `spec.dra` takes the name or path of a preset volume or mount, as
/// `(field path, message)`: a volume named as a preset one (the pod would have two), a
/// driver container mount at a preset path (server-side apply keys mounts by path).
pub fn preset_conflicts(dra: &DraSpec) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (index, volume) in dra.volumes.iter().enumerate() {
        if PRESET_VOLUMES
            .iter()
            .any(|(name, _, _)| *name == volume.name)
        {
            found.push((
                format!("spec.dra.volumes[{index}].name"),
                format!(
                    "{:?} is the name of a volume capstan mounts in every DRA driver pod; choose another",
                    volume.name
                ),
            ));
        }
    }
    for (index, mount) in dra.container.volume_mounts.iter().enumerate() {
        if PRESET_VOLUMES
            .iter()
            .any(|(_, path, _)| *path == mount.mount_path)
        {
            found.push((
                format!("spec.dra.container.volumeMounts[{index}].mountPath"),
                format!(
                    "{:?} is already mounted in every DRA driver container; choose another path",
                    mount.mount_path
                ),
            ));
        }
    }
    found
}

/// The wanted DRA DaemonSet of the Module for `version`, owned by the Module and
/// annotated with the digest of its content (see
/// [`capstan_api::labels::APPLIED_DIGEST_ANNOTATION`]).
///
/// Fails when the version cannot be a label value, the Module has no uid, or a user
/// volume or mount takes a preset one's place.
pub fn daemon_set(module: &ModuleFacts, version: Option<&str>) -> Result<DaemonSet, DraError> {
    let key = &module.key;
    check_version(key, version)?;
    let spec = &module.object.spec;
    let dra = spec.dra.clone().unwrap_or_default();
    let conflicts = preset_conflicts(&dra);
    if !conflicts.is_empty() {
        return Err(DraError::PresetConflict {
            module: key.to_string(),
            problems: conflicts
                .into_iter()
                .map(|(field, message)| format!("{field}: {message}"))
                .collect(),
        });
    }
    let owner = owner(module)?;
    Ok(owned_daemon_set(
        daemon_set_name(key, version),
        key,
        daemon_set_labels(key, version),
        owner,
        None,
        pod_spec(&dra, spec, node_selector(key, spec, version)),
    ))
}

/// The DRA driver pod: upstream's template, from `spec.dra` and the Module.
fn pod_spec(
    dra: &DraSpec,
    module: &ModuleSpec,
    node_selector: BTreeMap<String, String>,
) -> PodSpec {
    let volumes = PRESET_VOLUMES
        .iter()
        .map(|(name, path, type_)| Volume {
            name: (*name).to_string(),
            host_path: Some(HostPathVolumeSource {
                path: (*path).to_string(),
                type_: Some((*type_).to_string()),
            }),
            ..Volume::default()
        })
        .chain(dra.volumes.iter().cloned())
        .collect();
    let mut driver = container(&dra.container, CONTAINER_NAME);
    let mounts: Vec<VolumeMount> = PRESET_VOLUMES
        .iter()
        .map(|(name, path, _)| VolumeMount {
            name: (*name).to_string(),
            mount_path: (*path).to_string(),
            ..VolumeMount::default()
        })
        .chain(dra.container.volume_mounts.iter().cloned())
        .collect();
    driver.volume_mounts = Some(mounts);
    driver.env = Some(
        preset_env()
            .into_iter()
            .filter(|preset| !dra.container.env.iter().any(|own| own.name == preset.name))
            .chain(dra.container.env.iter().cloned())
            .collect(),
    );
    driver.liveness_probe = Some(Probe {
        grpc: Some(GRPCAction {
            port: HEALTHCHECK_PORT,
            service: Some("liveness".to_string()),
        }),
        initial_delay_seconds: Some(30),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    });
    PodSpec {
        init_containers: dra
            .init_container
            .as_ref()
            .map(|init| vec![container(init, INIT_CONTAINER_NAME)]),
        containers: vec![driver],
        priority_class_name: Some(PRIORITY_CLASS.to_string()),
        host_network: Some(true),
        image_pull_secrets: module.image_repo_secret.clone().map(|secret| vec![secret]),
        node_selector: Some(node_selector),
        service_account_name: non_empty(&dra.service_account_name),
        automount_service_account_token: dra.automount_service_account_token,
        volumes: Some(volumes),
        tolerations: non_empty_list(&module.tolerations),
        ..PodSpec::default()
    }
}

/// The environment every DRA driver container gets, before its own (upstream's order).
fn preset_env() -> Vec<EnvVar> {
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.to_string(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    let value = |name: &str, value: &str| EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        ..EnvVar::default()
    };
    let [plugins, registry, cdi] = PRESET_VOLUMES.map(|(_, path, _)| path);
    vec![
        field("NODE_NAME", "spec.nodeName"),
        field("POD_UID", "metadata.uid"),
        value("CDI_ROOT", cdi),
        value("KUBELET_REGISTRAR_DIRECTORY_PATH", registry),
        value("KUBELET_PLUGINS_DIRECTORY_PATH", plugins),
        value("HEALTHCHECK_PORT", &HEALTHCHECK_PORT.to_string()),
    ]
}

fn name_of<K: Resource>(object: &K) -> String {
    object.meta().name.clone().unwrap_or_default()
}

/// The delete of `object` with its uid and resourceVersion as preconditions, unless it is
/// already going.
fn removal_of<K: Resource, T>(object: &K) -> Action<T> {
    let metadata = object.meta();
    if metadata.deletion_timestamp.is_some() {
        return Action::Unchanged;
    }
    Action::Delete {
        uid: metadata.uid.clone(),
        resource_version: metadata.resource_version.clone(),
    }
}

fn class_removal(class: &DeviceClass, why: Why) -> ClassStep {
    ClassStep {
        device_class: name_of(class),
        action: removal_of(class),
        why: if class.metadata.deletion_timestamp.is_some() {
            Why::AlreadyDeleting
        } else {
            why
        },
    }
}

#[cfg(test)]
mod tests;
