//! A Module's status counts, kept up to date from each NMC and Node change.
//!
//! Counting a Module from scratch reads every NMC and every Node: at 5,000 nodes and ten
//! Modules, counted for every status write of a rollout, those scans were most of the Module
//! reconciler's work. The tally keeps instead, per NMC, what it holds of each Module
//! ([`Held`] and the Module's last worker failure on the node), and per Module the sums of
//! those and the nodes it targets. An NMC or Node change replaces that object's
//! part, read from the cache as it is when the change is seen: the cache may already hold a
//! later version, or none when the object is gone, so a change seen late or twice leaves
//! the tally right. What it counts is [`loader_status`](super::loader_status), which the
//! tests hold it to.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::{Node, Toleration};
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::{Held, ModuleFacts, held, loader_counts};
use crate::controllers::failures::{WorkerFailure, WorkerFailures};
use crate::controllers::node::NodeFacts;
use capstan_api::labels::{ModuleKey, ModuleLabel};
use capstan_api::module::DaemonSetStatus;
use capstan_api::nmc::NodeModulesConfig;

/// The counts of every Module, fed by [`Tally::nmc`] and [`Tally::node`].
#[derive(Default)]
pub struct Tally {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Every NMC has been taken in from the cache once, after its first list.
    primed: bool,
    /// Per NMC (named after its node): what it holds of each Module it mentions.
    nmcs: HashMap<String, Vec<Part>>,
    /// Per Module: the sums of the NMCs' parts.
    modules: HashMap<ModuleKey, Sums>,
}

/// What one NMC holds of one Module.
#[derive(Clone, Debug, PartialEq)]
struct Part {
    key: ModuleKey,
    held: Held,
    failure: Option<WorkerFailure>,
}

#[derive(Default)]
struct Sums {
    desired: usize,
    available: usize,
    present: usize,
    /// The nodes whose worker pods failed last, by name.
    failures: BTreeMap<String, WorkerFailure>,
    /// The nodes the Module targets, once the Module has been counted.
    selected: Option<Selected>,
}

/// The nodes a Module targets: its selector matches them and its loader tolerations
/// tolerate their taints ([`ModuleFacts::targets`]).
struct Selected {
    /// The selector the nodes were matched with.
    selector: BTreeMap<String, String>,
    /// The tolerations their taints were matched with.
    tolerations: Vec<Toleration>,
    nodes: HashSet<String>,
}

impl Selected {
    fn targets(&self, node: &NodeFacts) -> bool {
        node.matches(&self.selector) && node.targetable(&self.tolerations)
    }
}

/// What a Module's status says of its NMCs.
#[derive(Clone, Debug, PartialEq)]
pub struct Counts {
    /// `status.moduleLoader`.
    pub status: DaemonSetStatus,
    /// The nodes whose worker pods for the Module failed last, in name order.
    pub failures: Vec<(String, WorkerFailure)>,
}

/// What a Module's conditions say of its counts: `Available` (every node with an entry has
/// it loaded) and `Degraded` (worker pods fail on some nodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub available: bool,
    pub degraded: bool,
}

impl Sums {
    fn verdict(&self) -> Verdict {
        Verdict {
            available: self.available == self.desired,
            degraded: !self.failures.is_empty(),
        }
    }

    fn is_empty(&self) -> bool {
        self.present == 0 && self.failures.is_empty() && self.selected.is_none()
    }
}

impl Tally {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes in NMC `name` as the cache holds it now (`None`: gone). Returns the Modules
    /// whose counts it changed.
    pub fn nmc(&self, name: &str, nmc: Option<&NodeModulesConfig>) -> Vec<ModuleKey> {
        let parts = nmc.map(parts).unwrap_or_default();
        self.lock().replace(name, parts)
    }

    /// Takes in Node `name` as the cache holds it now (`None`: the node is gone). Returns
    /// the Modules whose targeted nodes it changed.
    pub fn node(&self, name: &str, node: Option<&NodeFacts>) -> Vec<ModuleKey> {
        let mut inner = self.lock();
        let mut changed = Vec::new();
        for (key, sums) in &mut inner.modules {
            let Some(selected) = &mut sums.selected else {
                continue;
            };
            let matches = node.is_some_and(|node| selected.targets(node));
            let had = selected.nodes.contains(name);
            if matches && !had {
                selected.nodes.insert(name.to_string());
            } else if had && !matches {
                selected.nodes.remove(name);
            } else {
                continue;
            }
            changed.push(key.clone());
        }
        changed.sort();
        changed
    }

    /// The counts of `module`. The first call takes in every NMC of `nmcs`, and the first
    /// count of a selector and tolerations matches them against every node of `nodes`;
    /// both caches must have listed.
    pub fn count(
        &self,
        module: &ModuleFacts,
        nmcs: &Store<NodeModulesConfig>,
        nodes: &Store<Node>,
    ) -> Counts {
        let mut inner = self.lock();
        inner.prime(nmcs);
        let sums = inner.modules.entry(module.key.clone()).or_default();
        let selector = &module.object.spec.selector;
        let tolerations = module.object.loader_tolerations();
        let selected = match &mut sums.selected {
            Some(selected)
                if selected.selector == *selector && selected.tolerations == tolerations =>
            {
                selected
            }
            selected => {
                let mut targeted = Selected {
                    selector: selector.clone(),
                    tolerations,
                    nodes: HashSet::new(),
                };
                targeted.nodes = nodes
                    .state()
                    .iter()
                    .filter(|node| targeted.targets(&NodeFacts::from_node(node)))
                    .map(|node| node.name_any())
                    .collect();
                selected.insert(targeted)
            }
        };
        Counts {
            status: loader_counts(selected.nodes.len(), sums.desired, sums.available),
            failures: sums
                .failures
                .iter()
                .map(|(node, failure)| (node.clone(), failure.clone()))
                .collect(),
        }
    }

    /// What Module `key`'s conditions say of its counts now (a Module no NMC mentions is
    /// available, on none of its nodes).
    pub fn verdict(&self, key: &ModuleKey) -> Verdict {
        self.lock()
            .modules
            .get(key)
            .map_or(Sums::default().verdict(), Sums::verdict)
    }

    /// How many NMCs still list Module `key` in their spec or status (see [`Tally::count`]
    /// for `nmcs`).
    pub fn present(&self, key: &ModuleKey, nmcs: &Store<NodeModulesConfig>) -> usize {
        let mut inner = self.lock();
        inner.prime(nmcs);
        inner.modules.get(key).map_or(0, |sums| sums.present)
    }

    /// Module `key` is gone: its nodes are no longer matched (its NMC parts stay counted
    /// while NMCs mention it).
    pub fn forget(&self, key: &ModuleKey) {
        let mut inner = self.lock();
        if let Some(sums) = inner.modules.get_mut(key) {
            sums.selected = None;
            if sums.is_empty() {
                inner.modules.remove(key);
            }
        }
    }
}

impl Inner {
    /// Takes in every NMC the first time: the changes seen before may not yet have
    /// brought the whole first list.
    fn prime(&mut self, nmcs: &Store<NodeModulesConfig>) {
        if self.primed {
            return;
        }
        self.primed = true;
        for nmc in nmcs.state() {
            self.replace(&nmc.name_any(), parts(&nmc));
        }
    }

    /// Replaces NMC `name`'s parts; returns the Modules whose part changed.
    fn replace(&mut self, name: &str, parts: Vec<Part>) -> Vec<ModuleKey> {
        let old = self.nmcs.remove(name).unwrap_or_default();
        let mut changed = BTreeSet::new();
        for part in &old {
            if !parts.contains(part) {
                changed.insert(part.key.clone());
                self.add(name, part, false);
            }
        }
        for part in &parts {
            if !old.contains(part) {
                changed.insert(part.key.clone());
                self.add(name, part, true);
            }
        }
        if !parts.is_empty() {
            self.nmcs.insert(name.to_string(), parts);
        }
        for key in &changed {
            if self.modules.get(key).is_some_and(Sums::is_empty) {
                self.modules.remove(key);
            }
        }
        changed.into_iter().collect()
    }

    /// Adds `part` of NMC `name` to its Module's sums, or takes it off.
    fn add(&mut self, name: &str, part: &Part, add: bool) {
        let sums = self.modules.entry(part.key.clone()).or_default();
        let step = |sum: &mut usize, counted: bool| {
            if counted {
                *sum = if add { *sum + 1 } else { sum.saturating_sub(1) };
            }
        };
        step(&mut sums.desired, part.held.desired);
        step(&mut sums.available, part.held.available);
        step(&mut sums.present, part.held.present);
        match (&part.failure, add) {
            (Some(failure), true) => {
                sums.failures.insert(name.to_string(), failure.clone());
            }
            (Some(_), false) => {
                sums.failures.remove(name);
            }
            (None, _) => {}
        }
    }
}

/// What `nmc` holds of each Module its spec, status, `module-in-use` labels or worker
/// failures mention.
fn parts(nmc: &NodeModulesConfig) -> Vec<Part> {
    let failures = WorkerFailures::of(nmc);
    let listed = nmc
        .spec
        .modules
        .iter()
        .map(|entry| (&entry.namespace, &entry.name))
        .chain(
            nmc.status
                .iter()
                .flat_map(|status| &status.modules)
                .map(|entry| (&entry.namespace, &entry.name)),
        )
        .filter_map(|(namespace, name)| ModuleKey::new(namespace, name).ok());
    let in_use = nmc.labels().keys().flat_map(|label| {
        ModuleLabel::parse(label)
            .into_iter()
            .filter(|(kind, _)| *kind == ModuleLabel::ModuleInUse)
            .map(|(_, key)| key)
    });
    let keys: BTreeSet<ModuleKey> = listed.chain(in_use).chain(failures.modules()).collect();
    keys.into_iter()
        .map(|key| Part {
            held: held(nmc, &key),
            failure: failures.get(&key).cloned(),
            key,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    use super::*;
    use crate::controllers::failures::FAILURES_ANNOTATION;
    use crate::controllers::module_nmc::loader_status;
    use capstan_api::module::{Module, ModuleSpec};
    use capstan_api::nmc::{
        ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfigSpec,
        NodeModulesConfigStatus,
    };

    fn module(name: &str, selector: &[(&str, &str)]) -> ModuleFacts {
        let selector = selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut object = Module::new(
            name,
            ModuleSpec {
                selector,
                ..ModuleSpec::default()
            },
        );
        object.metadata.namespace = Some("kmm".to_string());
        ModuleFacts::from_module(&object).unwrap()
    }

    fn config(image: &str) -> ModuleConfig {
        ModuleConfig {
            container_image: image.to_string(),
            ..ModuleConfig::default()
        }
    }

    /// An NMC whose spec gives each Module of `spec` its image, whose status has loaded
    /// each Module of `status` with its image, and with a worker failure for each Module of
    /// `failing`.
    fn nmc(
        node: &str,
        spec: &[(&str, &str)],
        status: &[(&str, &str)],
        failing: &[&str],
    ) -> NodeModulesConfig {
        let mut nmc = NodeModulesConfig::new(
            node,
            NodeModulesConfigSpec {
                modules: spec
                    .iter()
                    .map(|(name, image)| NodeModuleSpec {
                        namespace: "kmm".to_string(),
                        name: name.to_string(),
                        config: config(image),
                        ..NodeModuleSpec::default()
                    })
                    .collect(),
            },
        );
        nmc.status = Some(NodeModulesConfigStatus {
            modules: status
                .iter()
                .map(|(name, image)| NodeModuleStatus {
                    namespace: "kmm".to_string(),
                    name: name.to_string(),
                    config: config(image),
                    ..NodeModuleStatus::default()
                })
                .collect(),
        });
        if !failing.is_empty() {
            let failures: BTreeMap<String, WorkerFailure> = failing
                .iter()
                .map(|name| {
                    let failure = WorkerFailure {
                        action: "Load".to_string(),
                        message: format!("{name} failed on {node}"),
                        attempts: 1,
                        ..WorkerFailure::default()
                    };
                    (format!("kmm/{name}"), failure)
                })
                .collect();
            nmc.metadata.annotations = Some(BTreeMap::from([(
                FAILURES_ANNOTATION.to_string(),
                serde_json::to_string(&failures).unwrap(),
            )]));
        }
        nmc
    }

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_string());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        node
    }

    /// A reflector store holding `objects`.
    fn store<K>(objects: &[K]) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (store, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for object in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        store
    }

    /// What the tally counts for `module`, against the counts from scratch.
    fn check(tally: &Tally, module: &ModuleFacts, nmcs: &[NodeModulesConfig], nodes: &[Node]) {
        let counts = tally.count(module, &store(nmcs), &store(nodes));
        let facts: Vec<NodeFacts> = nodes.iter().map(NodeFacts::from_node).collect();
        let from_scratch = loader_status(module, &facts, nmcs);
        assert_eq!(counts.status, from_scratch, "{}", module.key);
        let failures: Vec<(String, WorkerFailure)> = nmcs
            .iter()
            .filter_map(|nmc| {
                let failure = WorkerFailures::of(nmc).get(&module.key)?.clone();
                Some((nmc.name_any(), failure))
            })
            .collect();
        assert_eq!(
            tally.verdict(&module.key),
            Verdict {
                available: from_scratch.available_number == from_scratch.desired_number,
                degraded: !failures.is_empty(),
            },
            "{}",
            module.key
        );
        assert_eq!(counts.failures, failures, "{}", module.key);
        let present = nmcs
            .iter()
            .filter(|nmc| held(nmc, &module.key).present)
            .count();
        assert_eq!(tally.present(&module.key, &store(nmcs)), present);
    }

    /// Replaces the named NMC (or removes it: `None`) in `nmcs` and tells the tally.
    fn change(
        tally: &Tally,
        nmcs: &mut Vec<NodeModulesConfig>,
        name: &str,
        nmc: Option<NodeModulesConfig>,
    ) -> Vec<ModuleKey> {
        nmcs.retain(|n| n.name_any() != name);
        nmcs.extend(nmc.clone());
        nmcs.sort_by_key(|n| n.name_any());
        tally.nmc(name, nmc.as_ref())
    }

    #[test]
    fn the_tally_counts_as_the_counts_from_scratch_through_every_change() {
        let a = module("a", &[("gpu", "yes")]);
        let b = module("b", &[]);
        let mut nodes = vec![
            node("n1", &[("gpu", "yes")]),
            node("n2", &[("gpu", "yes")]),
            node("n3", &[]),
        ];
        let mut nmcs = vec![
            nmc("n1", &[("a", "v1"), ("b", "v1")], &[("a", "v1")], &[]),
            nmc("n2", &[("a", "v1")], &[], &[]),
        ];
        let tally = Tally::default();
        // Changes seen before the first count are taken in again from the cache then.
        tally.nmc("n1", Some(&nmcs[0]));
        check(&tally, &a, &nmcs, &nodes);
        check(&tally, &b, &nmcs, &nodes);

        // n2 loads a: a's availability changes, b's counts do not.
        let loaded = nmc("n2", &[("a", "v1")], &[("a", "v1")], &[]);
        let changed = change(&tally, &mut nmcs, "n2", Some(loaded));
        assert_eq!(changed, std::slice::from_ref(&a.key));
        check(&tally, &a, &nmcs, &nodes);
        check(&tally, &b, &nmcs, &nodes);

        // The same NMC again changes nothing.
        let again = nmcs[1].clone();
        assert_eq!(change(&tally, &mut nmcs, "n2", Some(again)), []);

        // An upgrade: the spec moves to v2, the status stays at v1.
        let upgrading = nmc("n1", &[("a", "v2"), ("b", "v1")], &[("a", "v1")], &[]);
        assert_eq!(
            change(&tally, &mut nmcs, "n1", Some(upgrading)),
            std::slice::from_ref(&a.key)
        );
        check(&tally, &a, &nmcs, &nodes);

        // b's worker fails on n1 and n3; n3's NMC lists nothing else.
        let failing = nmc("n1", &[("a", "v2"), ("b", "v1")], &[("a", "v1")], &["b"]);
        assert_eq!(
            change(&tally, &mut nmcs, "n1", Some(failing)),
            std::slice::from_ref(&b.key)
        );
        let only_failure = nmc("n3", &[], &[], &["b"]);
        assert_eq!(
            change(&tally, &mut nmcs, "n3", Some(only_failure)),
            std::slice::from_ref(&b.key)
        );
        check(&tally, &b, &nmcs, &nodes);
        assert_eq!(
            tally
                .count(&b, &store(&nmcs), &store(&nodes))
                .failures
                .iter()
                .map(|(node, _)| node.as_str())
                .collect::<Vec<_>>(),
            ["n1", "n3"]
        );

        // a is removed from n1's spec and unloaded from its status: no longer present.
        let unloading = nmc("n1", &[("b", "v1")], &[("a", "v1")], &["b"]);
        change(&tally, &mut nmcs, "n1", Some(unloading));
        check(&tally, &a, &nmcs, &nodes);
        let unloaded = nmc("n1", &[("b", "v1")], &[], &["b"]);
        change(&tally, &mut nmcs, "n1", Some(unloaded));
        check(&tally, &a, &nmcs, &nodes);
        check(&tally, &b, &nmcs, &nodes);

        // A loader a's spec entry no longer asks for is still at work on n3: the NMC keeps
        // a's module-in-use label, so a is still present there, until the label goes.
        let mut working = nmc("n3", &[], &[], &["b"]);
        working.metadata.labels = Some(BTreeMap::from([(
            a.key.module_in_use_label(),
            String::new(),
        )]));
        assert_eq!(
            change(&tally, &mut nmcs, "n3", Some(working)),
            std::slice::from_ref(&a.key)
        );
        check(&tally, &a, &nmcs, &nodes);
        assert_eq!(tally.present(&a.key, &store(&nmcs)), 2);
        let done = nmc("n3", &[], &[], &["b"]);
        change(&tally, &mut nmcs, "n3", Some(done));
        assert_eq!(tally.present(&a.key, &store(&nmcs)), 1);

        // NMCs go with their nodes.
        assert_eq!(
            change(&tally, &mut nmcs, "n2", None),
            std::slice::from_ref(&a.key)
        );
        check(&tally, &a, &nmcs, &nodes);

        // Node labels: n3 joins a's selector, n1 leaves it, n2 goes away.
        nodes[2] = node("n3", &[("gpu", "yes")]);
        assert_eq!(
            tally.node("n3", Some(&NodeFacts::from_node(&nodes[2]))),
            std::slice::from_ref(&a.key)
        );
        nodes[0] = node("n1", &[]);
        assert_eq!(
            tally.node("n1", Some(&NodeFacts::from_node(&nodes[0]))),
            std::slice::from_ref(&a.key)
        );
        nodes.remove(1);
        // b's empty selector matches whatever the labels: only a node leaving changes it.
        assert_eq!(tally.node("n2", None), [a.key.clone(), b.key.clone()]);
        assert_eq!(tally.node("n1", Some(&NodeFacts::from_node(&nodes[0]))), []);
        check(&tally, &a, &nmcs, &nodes);
        check(&tally, &b, &nmcs, &nodes);

        // A new selector is matched against every node.
        let narrower = module("a", &[("gpu", "yes"), ("zone", "1")]);
        check(&tally, &narrower, &nmcs, &nodes);
    }

    #[test]
    fn taints_the_module_does_not_tolerate_untarget_a_node() {
        let a = module("a", &[]);
        let tally = Tally::default();
        let taint = |key: &str| k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![k8s_openapi::api::core::v1::Taint {
                key: key.to_string(),
                effect: "NoSchedule".to_string(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let mut nodes = vec![node("n1", &[]), node("n2", &[])];
        check(&tally, &a, &[], &nodes);
        nodes[0].spec = Some(taint("dedicated"));
        let facts = NodeFacts::from_node(&nodes[0]);
        assert_eq!(tally.node("n1", Some(&facts)), std::slice::from_ref(&a.key));
        check(&tally, &a, &[], &nodes);
        // The kubelet's pressure taints are tolerated for every Module.
        nodes[1].spec = Some(taint("node.kubernetes.io/memory-pressure"));
        assert_eq!(tally.node("n2", Some(&NodeFacts::from_node(&nodes[1]))), []);
        check(&tally, &a, &[], &nodes);
        assert_eq!(
            tally
                .count(&a, &store(&[]), &store(&nodes))
                .status
                .nodes_matching_selector_number,
            1
        );
    }

    #[test]
    fn a_gone_module_leaves_nothing_behind() {
        let a = module("a", &[]);
        let tally = Tally::default();
        let nmcs = [nmc("n1", &[("a", "v1")], &[("a", "v1")], &[])];
        let nodes = [node("n1", &[])];
        check(&tally, &a, &nmcs, &nodes);
        tally.nmc("n1", Some(&nmc("n1", &[], &[], &[])));
        tally.forget(&a.key);
        assert!(tally.lock().modules.is_empty());
        assert!(tally.lock().nmcs.is_empty());
        assert_eq!(tally.node("n1", None), []);
    }
}
