//! The NMC of one node, from every Module: [`decide_node`] gathers each Module's
//! [`decide`] for the node into the NMC's `spec.modules` and labels, and says the one write
//! that gets the NMC there, however many Modules changed.
//!
//! | NMC (as cached) | entries wanted | write |
//! | --- | --- | --- |
//! | none, or being deleted | none | nothing: no NMC is made to list nothing |
//! | none, or being deleted | some | create it with the entries, their labels and the Node as owner (an NMC still being deleted answers `AlreadyExists`, and its deletion brings the node back) |
//! | present | as listed, labels and owner as wanted | nothing |
//! | present | other entries, none included | merge patch of what differs: the whole `spec.modules`, the labels set or removed, the Node added to the owners while an entry is listed |
//!
//! The NMC is owned by its Node, so that it goes with it; upstream sets the owner on every
//! write, so an NMC made without one gets it with its next write that lists an entry. An
//! NMC left without entries stays: the NMC controller still unloads from its status what
//! the spec no longer lists.
//!
//! The entries wanted, and the labels that go with them, Module by Module:
//!
//! | Module | entry | `module-configured` | `module-in-use` |
//! | --- | --- | --- | --- |
//! | [`decide`] sets one, or keeps the one there | it | set | set |
//! | [`decide`] removes it, or keeps none | none | removed | untouched: the NMC controller drops it once the module is unloaded |
//! | its kernel mappings cannot be evaluated for the node's kernel | the one there, as it is (named in [`NodeDecision::unresolved`]) | set if there is one, else removed | set if there is one, else untouched |
//! | its name is one capstan cannot use | the one there, as it is | untouched | untouched |
//! | gone (deleted without its finalizer) | none | removed | untouched |
//!
//! Upstream accepts Module names capstan's labels cannot carry; such a Module's module
//! stays loaded rather than being unloaded by a controller that cannot manage it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::{EntryAction, ModuleFacts, decide};
use crate::controllers::kernel_mapping::KernelMappingError;
use crate::controllers::node::NodeFacts;
use capstan_api::labels::{ModuleKey, ModuleLabel};
use capstan_api::nmc::{NodeModuleSpec, NodeModulesConfig, NodeModulesConfigSpec};

/// What one reconcile of a node writes to its NMC.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDecision {
    /// The write, if any.
    pub write: Option<NmcWrite>,
    /// The Modules whose kernel mappings cannot be evaluated for the node's kernel, and
    /// why: their entry is left as it is.
    pub unresolved: Vec<(ModuleKey, KernelMappingError)>,
}

/// The one write that gives a node's NMC what the Modules want of it.
#[derive(Clone, Debug, PartialEq)]
pub enum NmcWrite {
    /// Create the NMC.
    Create(Box<NodeModulesConfig>),
    /// Merge-patch the NMC with what differs.
    Patch(Value),
}

/// The write that gives `node`'s NMC (`nmc`, as cached) the entries and labels `modules`
/// want of it, with `owner` (the Node, see [`node_owner`]) as its owner. `unusable` holds
/// the Modules (namespace, name) that exist but whose name capstan cannot use. See the
/// module's tables.
pub fn decide_node(
    node: &NodeFacts,
    owner: &OwnerReference,
    modules: &[ModuleFacts],
    unusable: &BTreeSet<(String, String)>,
    nmc: Option<&NodeModulesConfig>,
) -> NodeDecision {
    let nmc = nmc.filter(|nmc| nmc.metadata.deletion_timestamp.is_none());
    let (wants, unresolved) = node_wants(node, modules, unusable, nmc);
    let write = match nmc {
        None if wants.modules.is_empty() => None,
        None => Some(NmcWrite::Create(Box::new(new_nmc(node, owner, wants)))),
        Some(nmc) => nmc_patch(nmc, &wants, owner).map(NmcWrite::Patch),
    };
    NodeDecision { write, unresolved }
}

/// The Node as the owner of its NMC: deleting the Node deletes the NMC.
pub fn node_owner(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// The NMC spec and labels one node should have.
#[derive(Debug, Default, PartialEq)]
struct NodeWants {
    /// In namespace and name order.
    modules: Vec<NodeModuleSpec>,
    /// NMC labels to set (value) or remove (`None`).
    labels: BTreeMap<String, Option<String>>,
}

/// The entries and labels `modules` want on `node`, and the Modules whose kernel mappings
/// cannot be evaluated for it.
fn node_wants(
    node: &NodeFacts,
    modules: &[ModuleFacts],
    unusable: &BTreeSet<(String, String)>,
    nmc: Option<&NodeModulesConfig>,
) -> (NodeWants, Vec<(ModuleKey, KernelMappingError)>) {
    let mut wants = NodeWants::default();
    let mut unresolved = Vec::new();
    wants.modules.extend(
        nmc.into_iter()
            .flat_map(|nmc| &nmc.spec.modules)
            .filter(|entry| unusable.contains(&(entry.namespace.clone(), entry.name.clone())))
            .cloned(),
    );
    let known: BTreeSet<&ModuleKey> = modules.iter().map(|m| &m.key).collect();
    for module in modules {
        let current = nmc.and_then(|nmc| nmc.spec_module(&module.key));
        let entry = match decide(module, node, current) {
            Ok(decision) => match decision.action {
                EntryAction::Set(entry) => Some(*entry),
                EntryAction::Remove => None,
                EntryAction::Unchanged => current.cloned(),
            },
            Err(err) => {
                unresolved.push((module.key.clone(), err));
                current.cloned()
            }
        };
        match entry {
            Some(entry) => {
                wants
                    .labels
                    .insert(module.key.module_configured_label(), Some(String::new()));
                wants
                    .labels
                    .insert(module.key.module_in_use_label(), Some(String::new()));
                wants.modules.push(entry);
            }
            None => {
                wants
                    .labels
                    .insert(module.key.module_configured_label(), None);
            }
        }
    }
    // A Module deleted outright, without its finalizer, has no entry wanted above; its
    // `module-configured` label goes with the entry.
    if let Some(nmc) = nmc {
        for label in nmc.labels().keys() {
            let orphan = ModuleLabel::parse(label)
                .into_iter()
                .any(|(kind, key)| kind == ModuleLabel::ModuleConfigured && !known.contains(&key));
            if orphan {
                wants.labels.insert(label.clone(), None);
            }
        }
    }
    wants.modules.sort_by(by_module);
    (wants, unresolved)
}

/// Namespace, then name: the order of a node's entries.
fn by_module(a: &NodeModuleSpec, b: &NodeModuleSpec) -> std::cmp::Ordering {
    (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
}

/// A new NMC for `node` with what `wants` asks for, owned by `owner`.
fn new_nmc(node: &NodeFacts, owner: &OwnerReference, wants: NodeWants) -> NodeModulesConfig {
    let labels: BTreeMap<String, String> = wants
        .labels
        .into_iter()
        .filter_map(|(key, value)| Some((key, value?)))
        .collect();
    let mut nmc = NodeModulesConfig::new(
        &node.name,
        NodeModulesConfigSpec {
            modules: wants.modules,
        },
    );
    nmc.metadata.labels = Some(labels);
    nmc.metadata.owner_references = Some(vec![owner.clone()]);
    nmc
}

/// The merge patch that gives `nmc` what `wants` asks for, and `owner` as an owner while
/// it lists an entry; `None` when nothing differs.
fn nmc_patch(nmc: &NodeModulesConfig, wants: &NodeWants, owner: &OwnerReference) -> Option<Value> {
    let mut current = nmc.spec.modules.clone();
    current.sort_by(by_module);
    let mut patch = json!({});
    if current != wants.modules {
        patch["spec"] = json!({"modules": wants.modules});
    }
    let owners = nmc.metadata.owner_references.as_deref().unwrap_or_default();
    if !wants.modules.is_empty() && !owners.iter().any(|o| o.uid == owner.uid) {
        let mut owners = owners.to_vec();
        owners.push(owner.clone());
        patch["metadata"] = json!({"ownerReferences": owners});
    }
    let labels = nmc.labels();
    let mut label_patch = serde_json::Map::new();
    for (key, value) in &wants.labels {
        match value {
            Some(value) if labels.get(key) != Some(value) => {
                label_patch.insert(key.clone(), json!(value));
            }
            None if labels.contains_key(key) => {
                label_patch.insert(key.clone(), Value::Null);
            }
            _ => {}
        }
    }
    if !label_patch.is_empty() {
        patch["metadata"]["labels"] = Value::Object(label_patch);
    }
    (patch != json!({})).then_some(patch)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use capstan_api::module::{Module, ModuleSpec};

    /// A Module in `kmm` loading `name` on every kernel, on the nodes `selector` selects.
    fn module(name: &str, selector: &[(&str, &str)]) -> ModuleFacts {
        let mut spec: ModuleSpec = serde_json::from_value(json!({
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": name},
                "kernelMappings": [{"regexp": "^.+$", "containerImage": format!("registry.example/{name}:${{KERNEL_FULL_VERSION}}")}],
            }},
            "selector": {},
        }))
        .expect("spec");
        spec.selector = selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut module = Module::new(name, spec);
        module.metadata.namespace = Some("kmm".into());
        ModuleFacts::from_module(&module).expect("facts")
    }

    /// A Module whose kernel mapping names a part of the kernel version it has not got.
    fn unmappable(name: &str) -> ModuleFacts {
        let mut facts = module(name, &[]);
        if let Some(loader) = Arc::make_mut(&mut facts.object).spec.module_loader.as_mut() {
            loader.container.kernel_mappings[0].container_image =
                "registry.example/x:${KERNEL_MAJOR}".into();
        }
        facts
    }

    fn node(labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: "worker-1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            kernel_version: "6.0.15".into(),
            ready: true,
            ..NodeFacts::default()
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "worker-1".into(),
            uid: "node-uid".into(),
            ..OwnerReference::default()
        }
    }

    /// worker-1's NMC listing `entries`, with `labels` (empty values), owned by its Node
    /// when `owned`.
    fn nmc(entries: &[&NodeModuleSpec], labels: &[&str], owned: bool) -> NodeModulesConfig {
        let mut nmc = NodeModulesConfig::new(
            "worker-1",
            NodeModulesConfigSpec {
                modules: entries.iter().map(|entry| (*entry).clone()).collect(),
            },
        );
        nmc.metadata.labels = Some(
            labels
                .iter()
                .map(|k| (k.to_string(), String::new()))
                .collect(),
        );
        nmc.metadata.owner_references = owned.then(|| vec![owner()]);
        nmc
    }

    /// The entry `module` wants on a GPU node of kernel 6.0.15.
    fn entry(module: &ModuleFacts) -> NodeModuleSpec {
        match decide(module, &node(&[("gpu", "true")]), None)
            .expect("decide")
            .action
        {
            EntryAction::Set(entry) => *entry,
            other => panic!("{other:?}"),
        }
    }

    /// The write `decision` says, in a form a table row can state: `create` or `patch`
    /// with its JSON, or `none`.
    fn summary(decision: &NodeDecision) -> (&'static str, Value) {
        match &decision.write {
            None => ("none", Value::Null),
            Some(NmcWrite::Create(nmc)) => ("create", serde_json::to_value(nmc).expect("JSON")),
            Some(NmcWrite::Patch(patch)) => ("patch", patch.clone()),
        }
    }

    struct Row {
        name: &'static str,
        node: NodeFacts,
        modules: Vec<ModuleFacts>,
        unusable: BTreeSet<(String, String)>,
        nmc: Option<NodeModulesConfig>,
        want: (&'static str, Value),
    }

    #[test]
    fn node_nmc_decision_table() {
        let a = module("a", &[]);
        let b = module("b", &[("gpu", "true")]);
        let (configured_a, in_use_a) =
            (a.key.module_configured_label(), a.key.module_in_use_label());
        let (configured_b, in_use_b) =
            (b.key.module_configured_label(), b.key.module_in_use_label());
        let (entry_a, entry_b) = (entry(&a), entry(&b));
        let owner = serde_json::to_value(owner()).expect("JSON");
        let mut deleting = nmc(&[&entry_a], &[&configured_a], true);
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut upstream_only = entry_a.clone();
        upstream_only.name = "a-name-upstream-accepts".into();
        let unusable =
            BTreeSet::from([(upstream_only.namespace.clone(), upstream_only.name.clone())]);
        let none = BTreeSet::new();
        let created_a = json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
            "kind": "NodeModulesConfig",
            "metadata": {
                "name": "worker-1",
                "labels": {configured_a.clone(): "", in_use_a.clone(): ""},
                "ownerReferences": [owner.clone()],
            },
            "spec": {"modules": [entry_a.clone()]},
        });
        let rows = [
            Row {
                name: "no NMC, nothing wanted -> no NMC",
                node: node(&[]),
                modules: vec![b.clone()],
                unusable: none.clone(),
                nmc: None,
                want: ("none", Value::Null),
            },
            Row {
                name: "no NMC, one Module wanted -> created with its entry, labels and owner",
                node: node(&[]),
                modules: vec![a.clone(), b.clone()],
                unusable: none.clone(),
                nmc: None,
                want: ("create", created_a.clone()),
            },
            Row {
                name: "an NMC being deleted counts as none -> created again",
                node: node(&[]),
                modules: vec![a.clone()],
                unusable: none.clone(),
                nmc: Some(deleting),
                want: ("create", created_a.clone()),
            },
            Row {
                name: "NMC as wanted -> nothing",
                node: node(&[]),
                modules: vec![a.clone(), b.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a, &in_use_a], true)),
                want: ("none", Value::Null),
            },
            Row {
                name: "a second Module wanted -> both entries, in name order, and its labels",
                node: node(&[("gpu", "true")]),
                modules: vec![b.clone(), a.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a, &in_use_a], true)),
                want: (
                    "patch",
                    json!({
                        "spec": {"modules": [entry_a.clone(), entry_b.clone()]},
                        "metadata": {"labels": {configured_b.clone(): "", in_use_b.clone(): ""}},
                    }),
                ),
            },
            Row {
                name: "node no longer targeted -> entry and module-configured go, module-in-use stays",
                node: node(&[]),
                modules: vec![a.clone(), b.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(
                    &[&entry_a, &entry_b],
                    &[&configured_a, &in_use_a, &configured_b, &in_use_b],
                    true,
                )),
                want: (
                    "patch",
                    json!({
                        "spec": {"modules": [entry_a.clone()]},
                        "metadata": {"labels": {configured_b.clone(): null}},
                    }),
                ),
            },
            Row {
                name: "the last entry goes -> the NMC stays, empty",
                node: node(&[]),
                modules: vec![b.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_b], &[&configured_b, &in_use_b], true)),
                want: (
                    "patch",
                    json!({
                        "spec": {"modules": []},
                        "metadata": {"labels": {configured_b.clone(): null}},
                    }),
                ),
            },
            Row {
                name: "a lost module-in-use label -> put back, spec untouched",
                node: node(&[]),
                modules: vec![a.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a], true)),
                want: (
                    "patch",
                    json!({"metadata": {"labels": {in_use_a.clone(): ""}}}),
                ),
            },
            Row {
                name: "a Module gone entirely -> its entry and module-configured go",
                node: node(&[]),
                modules: vec![],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a, &in_use_a], true)),
                want: (
                    "patch",
                    json!({
                        "spec": {"modules": []},
                        "metadata": {"labels": {configured_a.clone(): null}},
                    }),
                ),
            },
            Row {
                name: "an NMC without its Node as owner -> the owner added",
                node: node(&[]),
                modules: vec![a.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a, &in_use_a], false)),
                want: (
                    "patch",
                    json!({"metadata": {"ownerReferences": [owner.clone()]}}),
                ),
            },
            Row {
                name: "an empty NMC without an owner -> none added",
                node: node(&[]),
                modules: vec![b.clone()],
                unusable: none.clone(),
                nmc: Some(nmc(&[], &[], false)),
                want: ("none", Value::Null),
            },
            Row {
                name: "a Module whose name capstan cannot use -> its entry stays",
                node: node(&[]),
                modules: vec![a.clone()],
                unusable,
                nmc: Some(nmc(
                    &[&entry_a, &upstream_only],
                    &[&configured_a, &in_use_a],
                    true,
                )),
                want: ("none", Value::Null),
            },
            Row {
                name: "kernel mappings that cannot be evaluated -> the entry there stays",
                node: node(&[]),
                modules: vec![unmappable("a")],
                unusable: none.clone(),
                nmc: Some(nmc(&[&entry_a], &[&configured_a, &in_use_a], true)),
                want: ("none", Value::Null),
            },
            Row {
                name: "kernel mappings that cannot be evaluated, no NMC -> none made",
                node: node(&[]),
                modules: vec![unmappable("a")],
                unusable: none,
                nmc: None,
                want: ("none", Value::Null),
            },
        ];
        for row in rows {
            let decision = decide_node(
                &row.node,
                &self::owner(),
                &row.modules,
                &row.unusable,
                row.nmc.as_ref(),
            );
            assert_eq!(summary(&decision), row.want, "{}", row.name);
        }
    }

    #[test]
    fn kernel_mappings_that_cannot_be_evaluated_are_named_in_the_decision() {
        let a = unmappable("a");
        let b = module("b", &[]);
        let decision = decide_node(
            &node(&[]),
            &owner(),
            &[a.clone(), b],
            &BTreeSet::new(),
            None,
        );
        let unresolved: Vec<&ModuleKey> = decision.unresolved.iter().map(|(key, _)| key).collect();
        assert_eq!(unresolved, [&a.key]);
        assert!(
            matches!(decision.write, Some(NmcWrite::Create(_))),
            "the other Module's entry is still written: {decision:?}"
        );
    }
}
