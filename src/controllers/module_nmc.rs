//! Module -> NodeModulesConfig: whether a node's NMC lists a Module, and with which config
//! (seed 000, "Module-NMC controller decision-making flow").
//!
//! The decision is per (Module, node) and looks at the Module, the node's labels and kernel
//! and the NMC entry already there, never at the node's readiness: when and how to load is
//! the NMC controller's call. Each arm of [`decide`] is one branch of the flowchart:
//!
//! | case | action |
//! | --- | --- |
//! | Module being deleted | remove the entry |
//! | Module without `moduleLoader` | nothing: what is loaded stays loaded |
//! | node not targeted by the selector | remove the entry |
//! | node tainted (`NoSchedule`/`NoExecute`, the cordon aside) and the Module does not tolerate it, its pressure tolerations included | remove the entry |
//! | no kernel mapping for the node's kernel | remove the entry (nothing when there is none) |
//! | `version` unset | set the entry |
//! | `version` set, version-worker-pod label equal | set the entry |
//! | `version` set, label present but different | nothing: the old version keeps running |
//! | `version` set, label missing | remove the entry (ordered upgrade: unload) |
//!
//! Seed 000 does nothing when the node's kernel has no mapping; upstream, and this module,
//! remove an entry left from the previous kernel, so `desiredNumber` counts only nodes that
//! can load the module and the NMC controller forgets the status once the node has rebooted.
//!
//! The other decisions, each with its table: [`node_nmc::decide_node`] gathers these
//! entries into the one write a node's NMC gets, and [`lifecycle::decide_module`] keeps the
//! Module's finalizer, its namespace's label and its status. [`reconciler`] reads the
//! caches, asks them, and writes; [`tally`] keeps the counts the status says.

pub mod lifecycle;
pub mod node_nmc;
pub mod pending;
pub mod reconciler;
pub mod tally;

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;

use super::kernel_mapping::{self, KernelMappingError};
use super::node::{NodeFacts, labels_match};
use capstan_api::labels::{LabelError, ModuleKey};
use capstan_api::module::{DaemonSetStatus, Module};
use capstan_api::nmc::{NodeModuleSpec, NodeModulesConfig};

/// The ServiceAccount of a Module's worker pods when its `moduleLoader` names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// A Module with its checked key, as this controller decides on it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleFacts {
    /// Namespace and name.
    pub key: ModuleKey,
    /// The Module, shared with the cache it was read from.
    pub object: Arc<Module>,
}

impl ModuleFacts {
    /// Checks the Module's key. Fails as [`Module::key`].
    pub fn from_module(module: &Module) -> Result<ModuleFacts, LabelError> {
        Self::from_shared(&Arc::new(module.clone()))
    }

    /// As [`ModuleFacts::from_module`], sharing the Module (a cache's copy) instead of
    /// copying it.
    pub fn from_shared(module: &Arc<Module>) -> Result<ModuleFacts, LabelError> {
        Ok(ModuleFacts {
            key: module.key()?,
            object: module.clone(),
        })
    }

    /// True when `metadata.deletionTimestamp` is set: the module must leave every node.
    pub fn deleting(&self) -> bool {
        self.object.metadata.deletion_timestamp.is_some()
    }

    /// True when the Module's selector matches the node and the Module tolerates the node's
    /// taints (the cordon's aside: see [`NodeFacts::targetable`]) with its
    /// [`Module::loader_tolerations`], whatever the node's state.
    pub fn targets(&self, node: &NodeFacts) -> bool {
        self.selects(&node.labels) && node.targetable(&self.object.loader_tolerations())
    }

    /// True when the Module's selector matches a node with these labels.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        labels_match(labels, &self.object.spec.selector)
    }
}

/// What to do with the Module's entry in one node's NMC `spec.modules`, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct NmcEntryDecision {
    /// The write, if any.
    pub action: EntryAction,
    /// The flowchart branch that decided it.
    pub why: EntryWhy,
}

/// The write to the NMC entry.
#[derive(Clone, Debug, PartialEq)]
pub enum EntryAction {
    /// Add or replace the entry; the reconciler also labels the NMC `module-configured` and
    /// `module-in-use` for the Module.
    Set(Box<NodeModuleSpec>),
    /// Remove the entry; the reconciler also drops the NMC's `module-configured` label.
    Remove,
    /// Leave the NMC as it is.
    Unchanged,
}

/// The branch of the Module -> NMC flowchart a decision took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryWhy {
    /// The Module is being deleted.
    ModuleDeleted,
    /// The Module's selector does not match the node.
    NotTargeted,
    /// The Module has no `moduleLoader`: upstream returns before choosing nodes, so the
    /// entries already written stay and nothing is loaded or unloaded.
    NoModuleLoader,
    /// No kernel mapping covers the node's kernel.
    NoKernelMapping,
    /// The Module has no `version`: the entry follows the Module.
    Unversioned,
    /// The node's version-worker-pod label equals the Module's `version`.
    VersionLabelMatches,
    /// The node's version-worker-pod label names another version: the entry already there
    /// (the old version) stays until the label changes.
    OldVersionRunning,
    /// The Module has a `version` and the node no version-worker-pod label: the module must
    /// not run there (an ordered upgrade is unloading it).
    VersionLabelMissing,
}

/// The Module's entry for `node`, given the entry its NMC holds now (`current`).
///
/// Fails when the kernel mappings cannot be evaluated for the node's kernel (see
/// [`kernel_mapping::resolve`]); the NMC is then to be left as it is.
pub fn decide(
    module: &ModuleFacts,
    node: &NodeFacts,
    current: Option<&NodeModuleSpec>,
) -> Result<NmcEntryDecision, KernelMappingError> {
    let without_entry = |why| NmcEntryDecision {
        action: if current.is_some() {
            EntryAction::Remove
        } else {
            EntryAction::Unchanged
        },
        why,
    };
    if module.deleting() {
        return Ok(without_entry(EntryWhy::ModuleDeleted));
    }
    let spec = &module.object.spec;
    let Some(loader) = &spec.module_loader else {
        return Ok(NmcEntryDecision {
            action: EntryAction::Unchanged,
            why: EntryWhy::NoModuleLoader,
        });
    };
    if !module.targets(node) {
        return Ok(without_entry(EntryWhy::NotTargeted));
    }
    let Some(config) =
        kernel_mapping::resolve(&module.key, &loader.container, &node.kernel_version)?
    else {
        return Ok(without_entry(EntryWhy::NoKernelMapping));
    };
    let worker_pod_label = node.labels.get(&module.key.version_worker_pod_label());
    let why = match (module.object.version(), worker_pod_label) {
        (None, _) => EntryWhy::Unversioned,
        (Some(version), Some(label)) if label == version => EntryWhy::VersionLabelMatches,
        (Some(_), Some(_)) => {
            return Ok(NmcEntryDecision {
                action: EntryAction::Unchanged,
                why: EntryWhy::OldVersionRunning,
            });
        }
        (Some(_), None) => return Ok(without_entry(EntryWhy::VersionLabelMissing)),
    };
    let entry = NodeModuleSpec {
        name: module.key.name().to_string(),
        namespace: module.key.namespace().to_string(),
        // Upstream names the ServiceAccount the worker pod gets anyway.
        service_account_name: if loader.service_account_name.is_empty() {
            DEFAULT_SERVICE_ACCOUNT.to_string()
        } else {
            loader.service_account_name.clone()
        },
        image_repo_secret: spec.image_repo_secret.clone(),
        tolerations: module.object.loader_tolerations(),
        version: loader.container.version.clone(),
        config,
    };
    let action = if current == Some(&entry) {
        EntryAction::Unchanged
    } else {
        EntryAction::Set(Box::new(entry))
    };
    Ok(NmcEntryDecision { action, why })
}

/// What one NMC holds of a Module, as the Module's status counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The spec lists the Module: `desiredNumber` counts the NMC.
    pub desired: bool,
    /// The status config equals the spec's: `availableNumber` counts the NMC.
    pub available: bool,
    /// The Module is not yet gone from the node: the spec or the status lists it, or the
    /// NMC still has its `module-in-use` label, which the NMC controller drops only once
    /// no worker pod of the Module is left on the node either (a loader whose result is not
    /// in the status yet keeps it).
    pub present: bool,
}

/// What `nmc` holds of Module `key`.
pub fn held(nmc: &NodeModulesConfig, key: &ModuleKey) -> Held {
    let spec = nmc.spec_module(key);
    let status = nmc.status_module(key);
    let in_use = || nmc.labels().contains_key(&key.module_in_use_label());
    Held {
        desired: spec.is_some(),
        available: spec
            .zip(status)
            .is_some_and(|(spec, status)| status.config == spec.config),
        present: spec.is_some() || status.is_some() || in_use(),
    }
}

/// `status.moduleLoader` of the Module, as upstream counts it: `nodesMatchingSelectorNumber`
/// is the nodes the Module targets ([`ModuleFacts::targets`]: selected, and their taints
/// tolerated, whatever their state), `desiredNumber` the NMCs with an entry for the Module,
/// `availableNumber` those whose status config equals the entry's. `nodes` holds every
/// node. The controller keeps these counts up to date from each change instead
/// ([`tally::Tally`]); this is their definition.
pub fn loader_status<'a>(
    module: &ModuleFacts,
    nodes: impl IntoIterator<Item = &'a NodeFacts>,
    nmcs: impl IntoIterator<Item = &'a NodeModulesConfig>,
) -> DaemonSetStatus {
    let targeted = nodes
        .into_iter()
        .filter(|node| module.targets(node))
        .count();
    let (mut desired, mut available) = (0, 0);
    for nmc in nmcs {
        let held = held(nmc, &module.key);
        desired += usize::from(held.desired);
        available += usize::from(held.available);
    }
    loader_counts(targeted, desired, available)
}

/// The status counts, saturated to the API's `int32`.
pub fn loader_counts(targeted: usize, desired: usize, available: usize) -> DaemonSetStatus {
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    DaemonSetStatus {
        nodes_matching_selector_number: count(targeted),
        desired_number: count(desired),
        available_number: count(available),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use capstan_api::module::{
        KernelMapping, ModprobeSpec, ModuleLoaderContainerSpec, ModuleLoaderSpec, ModuleSpec,
    };
    use capstan_api::nmc::{
        ModuleConfig, NodeModuleStatus, NodeModulesConfigSpec, NodeModulesConfigStatus,
    };

    const KERNEL: &str = "6.0.15-300.fc37.x86_64";
    const OTHER_KERNEL: &str = "6.1.7-200.fc37.x86_64";
    const UNMAPPED_KERNEL: &str = "5.14.0-284.el9.x86_64";

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").unwrap()
    }

    /// The reference Module, with `version` as given ("" for none).
    fn module(version: &str) -> ModuleFacts {
        let mut object = Module::new(
            "my-kmod",
            ModuleSpec {
                selector: BTreeMap::from([("role".to_string(), "gpu".to_string())]),
                tolerations: vec![Toleration {
                    key: Some("gpu".to_string()),
                    operator: Some("Exists".to_string()),
                    ..Toleration::default()
                }],
                image_repo_secret: Some(LocalObjectReference {
                    name: "pull-secret".to_string(),
                }),
                module_loader: Some(ModuleLoaderSpec {
                    service_account_name: "kmm-worker".to_string(),
                    container: ModuleLoaderContainerSpec {
                        version: version.to_string(),
                        modprobe: ModprobeSpec {
                            module_name: "my_kmod".to_string(),
                            ..ModprobeSpec::default()
                        },
                        kernel_mappings: vec![
                            KernelMapping {
                                literal: KERNEL.to_string(),
                                container_image: "registry.example/my-kmod:lit".to_string(),
                                ..KernelMapping::default()
                            },
                            KernelMapping {
                                regexp: "^6\\.1\\.".to_string(),
                                container_image: "registry.example/my-kmod:${KERNEL_XYZ}"
                                    .to_string(),
                                ..KernelMapping::default()
                            },
                        ],
                        ..ModuleLoaderContainerSpec::default()
                    },
                }),
                device_plugin: None,
                image_rebuild_trigger_generation: None,
                ..ModuleSpec::default()
            },
        );
        object.metadata.namespace = Some("kmm-demo".to_string());
        ModuleFacts::from_module(&object).unwrap()
    }

    fn node(kernel: &str, labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: "node-1".to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            kernel_version: kernel.to_string(),
            boot_id: "boot-1".to_string(),
            ready: true,
            ..NodeFacts::default()
        }
    }

    fn gpu_node() -> NodeFacts {
        node(KERNEL, &[("role", "gpu")])
    }

    /// A targeted node whose version-worker-pod label names `version`.
    fn labelled(version: &str) -> NodeFacts {
        let mut node = gpu_node();
        node.labels
            .insert(key().version_worker_pod_label(), version.to_string());
        node
    }

    /// The entry `module` should have on `node`, computed independently of `decide`.
    fn entry(module: &ModuleFacts, image: &str, kernel: &str) -> NodeModuleSpec {
        NodeModuleSpec {
            name: "my-kmod".to_string(),
            namespace: "kmm-demo".to_string(),
            service_account_name: "kmm-worker".to_string(),
            image_repo_secret: module.object.spec.image_repo_secret.clone(),
            tolerations: module.object.loader_tolerations(),
            version: module.object.version().unwrap_or("").to_string(),
            config: ModuleConfig {
                kernel_version: kernel.to_string(),
                container_image: image.to_string(),
                modprobe: ModprobeSpec {
                    module_name: "my_kmod".to_string(),
                    ..ModprobeSpec::default()
                },
                ..ModuleConfig::default()
            },
        }
    }

    /// `(action, why, image written)` in a form a table row can state.
    fn summary(decision: NmcEntryDecision) -> (&'static str, EntryWhy, Option<String>) {
        match decision.action {
            EntryAction::Set(entry) => ("set", decision.why, Some(entry.config.container_image)),
            EntryAction::Remove => ("remove", decision.why, None),
            EntryAction::Unchanged => ("unchanged", decision.why, None),
        }
    }

    struct Row {
        name: &'static str,
        module: ModuleFacts,
        node: NodeFacts,
        current: Option<NodeModuleSpec>,
        want: (&'static str, EntryWhy, Option<&'static str>),
    }

    #[test]
    fn module_nmc_decision_table() {
        let lit = "registry.example/my-kmod:lit";
        let v1 = module("v1");
        let v1_entry = entry(&v1, lit, KERNEL);
        let unversioned = module("");
        let unversioned_entry = entry(&unversioned, lit, KERNEL);
        let mut deleting = module("");
        Arc::make_mut(&mut deleting.object)
            .metadata
            .deletion_timestamp = Some(Time("2026-03-01T10:00:00Z".parse().unwrap()));
        let mut without_loader = module("");
        Arc::make_mut(&mut without_loader.object).spec.module_loader = None;
        let not_ready_cordoned = NodeFacts {
            ready: false,
            unschedulable: true,
            ..gpu_node()
        };
        let taint = |key: &str, effect: &str| k8s_openapi::api::core::v1::Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        };
        let control_plane = NodeFacts {
            taints: vec![taint("node-role.kubernetes.io/control-plane", "NoSchedule")],
            ..gpu_node()
        };
        let cordon_tainted = NodeFacts {
            unschedulable: true,
            taints: vec![taint(
                capstan_api::labels::UNSCHEDULABLE_TAINT,
                "NoSchedule",
            )],
            ..gpu_node()
        };
        let memory_pressure = NodeFacts {
            taints: vec![taint("node.kubernetes.io/memory-pressure", "NoSchedule")],
            ..gpu_node()
        };
        let pressure_no_execute = NodeFacts {
            taints: vec![taint("node.kubernetes.io/disk-pressure", "NoExecute")],
            ..gpu_node()
        };
        let mut tolerant = module("");
        Arc::make_mut(&mut tolerant.object).spec.tolerations = vec![Toleration {
            key: Some("node-role.kubernetes.io/control-plane".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }];
        let rows = [
            Row {
                name: "upstream: tainted node the Module does not tolerate -> not targeted",
                module: unversioned.clone(),
                node: control_plane.clone(),
                current: Some(unversioned_entry.clone()),
                want: ("remove", EntryWhy::NotTargeted, None),
            },
            Row {
                name: "upstream: tainted node the Module tolerates -> targeted",
                module: tolerant,
                node: control_plane,
                current: None,
                want: ("set", EntryWhy::Unversioned, Some(lit)),
            },
            Row {
                name: "the cordon's taint never untargets a node",
                module: unversioned.clone(),
                node: cordon_tainted,
                current: Some(unversioned_entry.clone()),
                want: ("unchanged", EntryWhy::Unversioned, None),
            },
            Row {
                name: "seed: Version missing in Module -> update NMC spec",
                module: unversioned.clone(),
                node: gpu_node(),
                current: None,
                want: ("set", EntryWhy::Unversioned, Some(lit)),
            },
            Row {
                name: "Version missing, entry already up to date -> unchanged",
                module: unversioned.clone(),
                node: gpu_node(),
                current: Some(unversioned_entry.clone()),
                want: ("unchanged", EntryWhy::Unversioned, None),
            },
            Row {
                name: "Version missing, entry with an older image -> replaced",
                module: unversioned.clone(),
                node: gpu_node(),
                current: Some(entry(&unversioned, "registry.example/my-kmod:old", KERNEL)),
                want: ("set", EntryWhy::Unversioned, Some(lit)),
            },
            Row {
                name: "seed: version label equals Version -> update NMC spec",
                module: v1.clone(),
                node: labelled("v1"),
                current: None,
                want: ("set", EntryWhy::VersionLabelMatches, Some(lit)),
            },
            Row {
                name: "seed: version label not equal Version -> done, old entry kept",
                module: v1.clone(),
                node: labelled("v0"),
                current: Some(entry(&module("v0"), "registry.example/my-kmod:v0", KERNEL)),
                want: ("unchanged", EntryWhy::OldVersionRunning, None),
            },
            Row {
                name: "version label not equal Version, no entry -> nothing",
                module: v1.clone(),
                node: labelled("v0"),
                current: None,
                want: ("unchanged", EntryWhy::OldVersionRunning, None),
            },
            Row {
                name: "seed: version label missing -> delete NMC spec",
                module: v1.clone(),
                node: gpu_node(),
                current: Some(v1_entry.clone()),
                want: ("remove", EntryWhy::VersionLabelMissing, None),
            },
            Row {
                name: "version label missing, no entry -> nothing",
                module: v1.clone(),
                node: gpu_node(),
                current: None,
                want: ("unchanged", EntryWhy::VersionLabelMissing, None),
            },
            Row {
                name: "seed: no KernelMapping for node's kernel, no entry -> done",
                module: unversioned.clone(),
                node: node(UNMAPPED_KERNEL, &[("role", "gpu")]),
                current: None,
                want: ("unchanged", EntryWhy::NoKernelMapping, None),
            },
            Row {
                name: "upstream: no KernelMapping, entry from the previous kernel -> deleted",
                module: unversioned.clone(),
                node: node(UNMAPPED_KERNEL, &[("role", "gpu")]),
                current: Some(unversioned_entry.clone()),
                want: ("remove", EntryWhy::NoKernelMapping, None),
            },
            Row {
                name: "regexp mapping for a new kernel -> entry for that kernel, image expanded",
                module: unversioned.clone(),
                node: node(OTHER_KERNEL, &[("role", "gpu")]),
                current: Some(unversioned_entry.clone()),
                want: (
                    "set",
                    EntryWhy::Unversioned,
                    Some("registry.example/my-kmod:6.1.7"),
                ),
            },
            Row {
                name: "upstream: node no longer targeted -> entry deleted",
                module: unversioned.clone(),
                node: node(KERNEL, &[("role", "cpu")]),
                current: Some(unversioned_entry.clone()),
                want: ("remove", EntryWhy::NotTargeted, None),
            },
            Row {
                name: "node not targeted, no entry -> nothing",
                module: unversioned.clone(),
                node: node(KERNEL, &[]),
                current: None,
                want: ("unchanged", EntryWhy::NotTargeted, None),
            },
            Row {
                name: "seed: targeted regardless of state -> not Ready, cordoned node gets it",
                module: unversioned.clone(),
                node: not_ready_cordoned,
                current: None,
                want: ("set", EntryWhy::Unversioned, Some(lit)),
            },
            Row {
                name: "seed: Module deleted -> entry deleted",
                module: deleting.clone(),
                node: gpu_node(),
                current: Some(unversioned_entry.clone()),
                want: ("remove", EntryWhy::ModuleDeleted, None),
            },
            Row {
                name: "Module deleted, no entry -> nothing",
                module: deleting,
                node: gpu_node(),
                current: None,
                want: ("unchanged", EntryWhy::ModuleDeleted, None),
            },
            Row {
                name: "upstream: Module without moduleLoader -> entry kept",
                module: without_loader.clone(),
                node: gpu_node(),
                current: Some(unversioned_entry.clone()),
                want: ("unchanged", EntryWhy::NoModuleLoader, None),
            },
            Row {
                name: "upstream: Module without moduleLoader, node left the selector -> entry kept",
                module: without_loader,
                node: node(KERNEL, &[("role", "cpu")]),
                current: Some(unversioned_entry.clone()),
                want: ("unchanged", EntryWhy::NoModuleLoader, None),
            },
            Row {
                name: "upstream: the kubelet's memory-pressure taint -> still targeted",
                module: unversioned.clone(),
                node: memory_pressure,
                current: Some(unversioned_entry.clone()),
                want: ("unchanged", EntryWhy::Unversioned, None),
            },
            Row {
                name: "a pressure taint with NoExecute is not tolerated -> not targeted",
                module: unversioned.clone(),
                node: pressure_no_execute,
                current: Some(unversioned_entry),
                want: ("remove", EntryWhy::NotTargeted, None),
            },
        ];
        for row in rows {
            let got = summary(decide(&row.module, &row.node, row.current.as_ref()).unwrap());
            let (action, why, image) = row.want;
            assert_eq!(
                got,
                (action, why, image.map(str::to_string)),
                "{}",
                row.name
            );
        }
    }

    #[test]
    fn the_entry_carries_the_module_item_and_resolved_config() {
        let module = module("v1");
        let node = labelled("v1");
        let decision = decide(&module, &node, None).unwrap();
        let want = entry(&module, "registry.example/my-kmod:lit", KERNEL);
        assert_eq!(decision.action, EntryAction::Set(Box::new(want)));
    }

    #[test]
    fn an_entry_without_a_service_account_names_the_default_one() {
        let mut module = module("");
        if let Some(loader) = Arc::make_mut(&mut module.object)
            .spec
            .module_loader
            .as_mut()
        {
            loader.service_account_name = String::new();
        }
        let EntryAction::Set(entry) = decide(&module, &gpu_node(), None).unwrap().action else {
            panic!("an entry is set");
        };
        assert_eq!(entry.service_account_name, "default");
    }

    #[test]
    fn a_broken_mapping_is_an_error_and_no_write() {
        let mut module = module("");
        if let Some(loader) = Arc::make_mut(&mut module.object)
            .spec
            .module_loader
            .as_mut()
        {
            loader.container.kernel_mappings[1].container_image =
                "registry.example/my-kmod:${KERNEL_MAJOR}".to_string();
        }
        let err = decide(&module, &node(OTHER_KERNEL, &[("role", "gpu")]), None).unwrap_err();
        assert!(matches!(err, KernelMappingError::Template { .. }), "{err}");
    }

    #[test]
    fn what_an_nmc_holds_of_a_module() {
        let module = module("");
        let spec = |image: &str| entry(&module, image, KERNEL);
        let status = |image: &str| NodeModuleStatus {
            name: "my-kmod".to_string(),
            namespace: "kmm-demo".to_string(),
            config: spec(image).config,
            ..NodeModuleStatus::default()
        };
        let held_by = |spec: Option<NodeModuleSpec>, status: Option<NodeModuleStatus>, in_use| {
            let mut nmc = NodeModulesConfig::new(
                "node-1",
                NodeModulesConfigSpec {
                    modules: spec.into_iter().collect(),
                },
            );
            nmc.status = Some(NodeModulesConfigStatus {
                modules: status.into_iter().collect(),
            });
            if in_use {
                nmc.metadata.labels = Some(BTreeMap::from([(
                    module.key.module_in_use_label(),
                    String::new(),
                )]));
            }
            let Held {
                desired,
                available,
                present,
            } = held(&nmc, &module.key);
            (desired, available, present)
        };
        // (spec, status, module-in-use label) -> (desired, available, present)
        let cases = [
            (Some(spec("a")), Some(status("a")), true, (true, true, true)),
            (
                Some(spec("b")),
                Some(status("a")),
                true,
                (true, false, true),
            ),
            (Some(spec("a")), None, true, (true, false, true)),
            (None, Some(status("a")), true, (false, false, true)),
            (None, None, true, (false, false, true)),
            (None, None, false, (false, false, false)),
        ];
        for (spec, status, in_use, want) in cases {
            let case = format!("{spec:?} {status:?} {in_use}");
            assert_eq!(held_by(spec, status, in_use), want, "{case}");
        }
    }

    /// A `gpu` node with one taint.
    fn tainted(key: &str, effect: &str) -> NodeFacts {
        NodeFacts {
            taints: vec![k8s_openapi::api::core::v1::Taint {
                key: key.into(),
                effect: effect.into(),
                ..Default::default()
            }],
            ..gpu_node()
        }
    }

    #[test]
    fn module_loader_status_counts() {
        let module = module("");
        let config = |image: &str| entry(&module, image, KERNEL).config;
        let nmc = |name: &str, spec: Option<&str>, status: Option<&str>| {
            let mut nmc = NodeModulesConfig::new(
                name,
                NodeModulesConfigSpec {
                    modules: spec
                        .map(|image| entry(&module, image, KERNEL))
                        .into_iter()
                        .collect(),
                },
            );
            nmc.status = Some(NodeModulesConfigStatus {
                modules: status
                    .map(|image| NodeModuleStatus {
                        name: "my-kmod".to_string(),
                        namespace: "kmm-demo".to_string(),
                        config: config(image),
                        ..NodeModuleStatus::default()
                    })
                    .into_iter()
                    .collect(),
            });
            nmc
        };
        let nodes = [
            node(KERNEL, &[("role", "gpu")]),
            NodeFacts {
                ready: false,
                ..node(KERNEL, &[("role", "gpu")])
            },
            node(KERNEL, &[("role", "cpu")]),
            tainted("dedicated", "NoSchedule"),
            tainted("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ];
        let nmcs = [
            nmc("loaded", Some("a"), Some("a")),
            nmc("upgrading", Some("b"), Some("a")),
            nmc("loading", Some("a"), None),
            nmc("unloading", None, Some("a")),
            nmc("other-module-only", None, None),
        ];
        assert_eq!(
            loader_status(&module, &nodes, &nmcs),
            DaemonSetStatus {
                // Ready or not, under pressure or not; the tainted one is not targeted.
                nodes_matching_selector_number: 3,
                desired_number: 3,
                available_number: 1,
            }
        );
    }
}
