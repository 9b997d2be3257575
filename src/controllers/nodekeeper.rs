//! The nodekeeper: managed-upgrade-operator's Nodekeeper controller (its
//! controllers/nodekeeper and pkg/drain), run in process. While an upgrade campaign is
//! Upgrading, it forces the drain of a cordoned node that does not finish on its own
//! (deleting pods, stripping finalizers, once their waits have passed) and raises
//! `upgradeoperator_node_drain_timeout` for a node whose drain failed. It never cordons or
//! evicts: capstan's drain does that (`crate::controllers::drain`), as MCO does for MUO.
//!
//! [`decide`] is one reconcile of a node:
//!
//! | node | campaigns | cordon | `disableDrainStrategies` | decision |
//! | --- | --- | --- | --- | --- |
//! | labelled `node-role.kubernetes.io/master` (any value) | - | - | - | nothing (a node labelled only `control-plane` is reconciled) |
//! | - | none Upgrading | - | - | drop every node's metric (MUO resets the vector when an upgrade ends, fails or its `UpgradeConfig` is gone) |
//! | gone | some Upgrading | - | - | reset its metric |
//! | - | some Upgrading | not cordoned | - | reset its metric |
//! | - | some Upgrading | cordoned | true | no strategy; failed = `start + timeOut < now` (never with no start); metric; look again in 1 min |
//! | - | some Upgrading | cordoned, no `timeAdded` | false | error "cannot determine drain commencement time for node X" (metric untouched) |
//! | - | some Upgrading | cordoned, no strategy due | false | not failed; metric; look again in 1 min (the pods are not read: nothing depends on them) |
//! | - | some Upgrading | cordoned, a strategy due | false | read the node's pods and the PDBs, then one pass ([`strategies::run_pass`]) and [`strategies::has_failed`]; metric; look again in 1 min |
//!
//! The metric, on the cordoned path ([`MetricChange`]):
//!
//! | failed | node being deleted | node upgrading (`capstan.dev/upgrade-state` or `machineconfiguration.openshift.io/state` is `Working`) | metric |
//! | --- | --- | --- | --- |
//! | yes | yes | - | reset (0) |
//! | yes | no | yes | set (1) |
//! | yes | no | no | left as it is |
//! | no | - | - | reset (0) |
//!
//! A campaign is Upgrading when its history entry for `spec.desired.version` has phase
//! `Upgrading`; any `UpgradeConfig`, of any name in any namespace, counts. With several
//! Upgrading, the nodekeeper acts and waits for the largest `PDBForceDrainTimeout` among
//! them: a pod a PodDisruptionBudget protects is forced only once every campaign that may
//! be draining its node would allow it ([`UpgradingCampaigns`]). The `nodeDrain` settings are those
//! of the `GitSync` that governs the node (`capstan.yaml`).
//!
//! The submodules: [`cordon`] (whether a node is cordoned, since when), [`pods`] (the pod
//! predicates, PDB matching, `kubectl drain`'s filter [`evictable`]), [`strategies`] (the
//! five strategies, one pass, `HasFailed`, [`strategy_times`]), [`records`] (what each
//! strategy that acted leaves in the history) and [`reconciler`].

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

use capstan_api::NodeDrain;
use capstan_api::labels::{
    MACHINE_CONFIG_STATE_ANNOTATION, MACHINE_CONFIG_STATE_WORKING, MASTER_ROLE_LABEL,
    UPGRADE_STATE_ANNOTATION,
};
use capstan_api::upgrade_config::{UpgradeConfig, UpgradePhase};

pub mod cordon;
pub mod pods;
pub mod reconciler;
pub mod records;
pub mod strategies;

pub use cordon::Cordon;
pub use pods::{PodFacts, PodRef, evictable, protected_by_pdb};
pub use strategies::{DrainTimes, Strategy, StrategyRun, StrategyTime, strategy_times};

/// How often a cordoned node is looked at besides its changes, as MUO does.
pub const RECHECK: Duration = Duration::from_secs(60);

/// What the nodekeeper knows of a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Its name.
    pub name: String,
    /// It carries the label `node-role.kubernetes.io/master` (any value).
    pub master: bool,
    /// It is gone from the cluster (the rest is as last seen).
    pub gone: bool,
    /// It is being deleted.
    pub deleting: bool,
    /// It is upgrading: capstan's `capstan.dev/upgrade-state` or MCO's
    /// `machineconfiguration.openshift.io/state` is `Working`.
    pub upgrading: bool,
    /// Its cordon.
    pub cordon: Cordon,
}

impl NodeFacts {
    /// The facts of `node`.
    pub fn of(node: &Node) -> NodeFacts {
        let annotations = node.annotations();
        let working = |key: &str| {
            annotations.get(key).map(String::as_str) == Some(MACHINE_CONFIG_STATE_WORKING)
        };
        NodeFacts {
            name: node.name_any(),
            master: node.labels().contains_key(MASTER_ROLE_LABEL),
            gone: false,
            deleting: node.metadata.deletion_timestamp.is_some(),
            upgrading: working(UPGRADE_STATE_ANNOTATION)
                || working(MACHINE_CONFIG_STATE_ANNOTATION),
            cordon: Cordon::of(node),
        }
    }

    /// The facts of `node`, last seen before it went.
    pub fn gone(node: &Node) -> NodeFacts {
        NodeFacts {
            gone: true,
            ..NodeFacts::of(node)
        }
    }
}

/// What the nodekeeper reads of the upgrade campaigns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpgradingCampaigns {
    /// Some campaign is Upgrading.
    pub upgrading: bool,
    /// The largest `PDBForceDrainTimeout` of the Upgrading campaigns (zero with none).
    pub pdb_force_drain_timeout: Duration,
}

impl UpgradingCampaigns {
    /// What `configs` say.
    pub fn of<'a>(configs: impl IntoIterator<Item = &'a UpgradeConfig>) -> UpgradingCampaigns {
        configs
            .into_iter()
            .filter(|config| is_upgrading(config))
            .fold(UpgradingCampaigns::default(), |campaigns, config| {
                UpgradingCampaigns {
                    upgrading: true,
                    pdb_force_drain_timeout: campaigns
                        .pdb_force_drain_timeout
                        .max(config.spec.pdb_force_drain_timeout()),
                }
            })
    }
}

/// Whether `config`'s history entry for its desired version is Upgrading.
pub fn is_upgrading(config: &UpgradeConfig) -> bool {
    config
        .status
        .as_ref()
        .and_then(|status| status.history_for(&config.spec.desired.version))
        .is_some_and(|entry| entry.phase == UpgradePhase::Upgrading)
}

/// What one reconcile of a node is decided on.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// The node.
    pub node: &'a NodeFacts,
    /// The campaigns.
    pub campaigns: &'a UpgradingCampaigns,
    /// The `nodeDrain` settings that govern the node.
    pub drain: &'a NodeDrain,
    /// The node's pods, once read ([`Decision::ReadPods`]).
    pub pods: Option<&'a [PodFacts]>,
}

/// What to do with `upgradeoperator_node_drain_timeout{node_name}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricChange {
    /// Set it to 1: the drain failed.
    Set,
    /// Set it to 0.
    Reset,
    /// Leave it as it is.
    Keep,
}

/// One pass on a cordoned node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainPass {
    /// When the drain began.
    pub start: Option<Timestamp>,
    /// The strategies that act, in order, each before the next.
    pub runs: Vec<StrategyRun>,
    /// The drain has failed.
    pub failed: bool,
    /// The metric.
    pub metric: MetricChange,
}

/// What a reconcile of a node does (table in the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing; no look again until a change.
    Nothing,
    /// No campaign is Upgrading: drop every node's metric, which only a drain under one
    /// sets; no look again until a change.
    ClearMetrics,
    /// Reset the node's metric; no look again until a change.
    Reset,
    /// Read the node afresh, its pods and the PodDisruptionBudgets, and decide again.
    ReadPods,
    /// The node is cordoned, but when is not known: the strategies cannot run.
    UnknownStart,
    /// Run the pass, write the metric, look again in [`RECHECK`].
    Drain(DrainPass),
}

/// The decision for one reconcile of `inputs.node` at `now`.
pub fn decide(inputs: &Inputs, now: Timestamp) -> Decision {
    let node = inputs.node;
    if node.master {
        return Decision::Nothing;
    }
    // Every node is reconciled when a campaign changes, so the last one to stop Upgrading
    // (Upgraded, Failed or deleted) takes down every alert its drains raised.
    if !inputs.campaigns.upgrading {
        return Decision::ClearMetrics;
    }
    if node.gone || !node.cordon.cordoned {
        return Decision::Reset;
    }
    let times = DrainTimes::of(inputs.drain, inputs.campaigns.pdb_force_drain_timeout);
    if inputs.drain.disable_drain_strategies {
        let failed = strategies::has_failed(node.cordon.since, &[], &times, &[], now);
        return Decision::Drain(DrainPass {
            start: node.cordon.since,
            runs: Vec::new(),
            failed,
            metric: metric(node, failed),
        });
    }
    let Some(start) = node.cordon.since else {
        return Decision::UnknownStart;
    };
    // Before the first strategy is due (DELETE's wait is timeOut), nothing runs and every
    // strategy is pending, so the drain fails only past timeOut: the pods change nothing.
    let due = Strategy::ALL
        .iter()
        .any(|strategy| strategies::is_after(start, strategy.wait(&times), now));
    let pods = match inputs.pods {
        Some(pods) => pods,
        None if due => return Decision::ReadPods,
        None => &[],
    };
    let pass = strategies::run_pass(start, &times, pods, now);
    let failed = strategies::has_failed(Some(start), &Strategy::ALL, &times, &pass.left, now);
    Decision::Drain(DrainPass {
        start: Some(start),
        runs: pass.runs,
        failed,
        metric: metric(node, failed),
    })
}

/// MUO's `NodeDrainResult` (table in the module doc).
fn metric(node: &NodeFacts, failed: bool) -> MetricChange {
    match (failed, node.deleting, node.upgrading) {
        (true, true, _) => MetricChange::Reset,
        (true, false, true) => MetricChange::Set,
        (true, false, false) => MetricChange::Keep,
        (false, _, _) => MetricChange::Reset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;
    use serde_json::{Value, json};

    const NOW: &str = "2026-11-26T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("a time")
    }

    fn ago(minutes: i64) -> Timestamp {
        now() - SignedDuration::from_mins(minutes)
    }

    /// A worker, upgrading, cordoned `minutes` ago.
    fn cordoned(minutes: i64) -> NodeFacts {
        NodeFacts {
            name: "worker-1".into(),
            upgrading: true,
            cordon: Cordon {
                cordoned: true,
                since: Some(ago(minutes)),
            },
            ..NodeFacts::default()
        }
    }

    fn upgrading(pdb_minutes: u64) -> UpgradingCampaigns {
        UpgradingCampaigns {
            upgrading: true,
            pdb_force_drain_timeout: Duration::from_secs(pdb_minutes * 60),
        }
    }

    fn drain(time_out: u32, expected: u32, disabled: bool) -> NodeDrain {
        NodeDrain {
            time_out,
            expected_node_drain_time: expected,
            disable_drain_strategies: disabled,
            ignored_namespace_patterns: Vec::new(),
        }
    }

    fn web() -> PodFacts {
        PodFacts {
            pod: PodRef {
                namespace: "apps".into(),
                name: "web".into(),
                uid: "u-web".into(),
            },
            on_node: true,
            daemon_set: false,
            finalizers: false,
            terminating: false,
            ignored_namespace: false,
            pdb: false,
        }
    }

    fn pass(minutes: i64, runs: Vec<StrategyRun>, failed: bool, metric: MetricChange) -> Decision {
        Decision::Drain(DrainPass {
            start: Some(ago(minutes)),
            runs,
            failed,
            metric,
        })
    }

    /// MUO's nodekeeper_controller_test.go cases, its master predicate's, and the rows of
    /// the tables in the module doc.
    #[test]
    fn decision_table() {
        let on = drain(5, 8, false);
        let off = drain(5, 8, true);
        let default = NodeDrain::default();
        let idle = UpgradingCampaigns::default();
        let delete_web = vec![StrategyRun {
            strategy: Strategy::Delete,
            pods: vec![web().pod],
        }];
        let pods = [web()];
        // (case, node, campaigns, drain, pods read, decision)
        type Row<'a> = (
            &'a str,
            NodeFacts,
            UpgradingCampaigns,
            &'a NodeDrain,
            Option<&'a [PodFacts]>,
            Decision,
        );
        let rows: Vec<Row> = vec![
            (
                "no campaign Upgrading (MUO: phase Pending, or the upgrade over): every \
                 node's metric dropped, the node not looked at",
                cordoned(10),
                idle,
                &off,
                None,
                Decision::ClearMetrics,
            ),
            (
                "no campaign Upgrading, a node gone: every node's metric dropped",
                NodeFacts {
                    gone: true,
                    ..cordoned(600)
                },
                idle,
                &on,
                None,
                Decision::ClearMetrics,
            ),
            (
                "no campaign Upgrading, a master node: left alone",
                NodeFacts {
                    master: true,
                    ..cordoned(600)
                },
                idle,
                &off,
                None,
                Decision::Nothing,
            ),
            (
                "a master node, whatever its value",
                NodeFacts {
                    master: true,
                    ..cordoned(600)
                },
                upgrading(0),
                &off,
                None,
                Decision::Nothing,
            ),
            (
                "a node gone: its metric reset",
                NodeFacts {
                    gone: true,
                    ..cordoned(600)
                },
                upgrading(0),
                &off,
                None,
                Decision::Reset,
            ),
            (
                "a master node gone: left alone",
                NodeFacts {
                    gone: true,
                    master: true,
                    ..cordoned(600)
                },
                upgrading(0),
                &off,
                None,
                Decision::Nothing,
            ),
            (
                "not cordoned: reset, no look again",
                NodeFacts {
                    cordon: Cordon::default(),
                    ..cordoned(0)
                },
                upgrading(0),
                &on,
                None,
                Decision::Reset,
            ),
            (
                "disabled, timeOut 5, cordoned 10 min ago, Working: failed, set",
                cordoned(10),
                upgrading(0),
                &off,
                None,
                pass(10, vec![], true, MetricChange::Set),
            ),
            (
                "disabled, within timeOut: reset",
                cordoned(4),
                upgrading(0),
                &off,
                None,
                pass(4, vec![], false, MetricChange::Reset),
            ),
            (
                "disabled, no timeAdded: not failed (no error), reset",
                NodeFacts {
                    cordon: Cordon {
                        cordoned: true,
                        since: None,
                    },
                    ..cordoned(0)
                },
                upgrading(0),
                &off,
                None,
                Decision::Drain(DrainPass {
                    start: None,
                    runs: vec![],
                    failed: false,
                    metric: MetricChange::Reset,
                }),
            ),
            (
                "strategies on, no timeAdded: an error",
                NodeFacts {
                    cordon: Cordon {
                        cordoned: true,
                        since: None,
                    },
                    ..cordoned(0)
                },
                upgrading(0),
                &on,
                None,
                Decision::UnknownStart,
            ),
            (
                "strategies on, a strategy due: the pods are read first",
                cordoned(20),
                upgrading(0),
                &on,
                None,
                Decision::ReadPods,
            ),
            (
                "strategies on, nothing to act on, failed (MUO: 10 min; PDB wait 8 + 8 \
                 needs 16 here), Working: set",
                cordoned(20),
                upgrading(0),
                &on,
                Some(&[]),
                pass(20, vec![], true, MetricChange::Set),
            ),
            (
                "strategies on, a pod to delete: DELETE acts",
                cordoned(20),
                upgrading(0),
                &on,
                Some(&pods),
                pass(20, delete_web.clone(), true, MetricChange::Set),
            ),
            (
                "strategies on, nothing due yet: not failed, the pods not read",
                cordoned(30),
                upgrading(60),
                &default,
                None,
                pass(30, vec![], false, MetricChange::Reset),
            ),
            (
                "failed while the node is being deleted: reset",
                NodeFacts {
                    deleting: true,
                    ..cordoned(10)
                },
                upgrading(0),
                &off,
                None,
                pass(10, vec![], true, MetricChange::Reset),
            ),
            (
                "failed, not upgrading: the metric left as it is",
                NodeFacts {
                    upgrading: false,
                    ..cordoned(10)
                },
                upgrading(0),
                &off,
                None,
                pass(10, vec![], true, MetricChange::Keep),
            ),
            (
                "a node labelled only control-plane is reconciled",
                NodeFacts::of(&node(json!({
                    "metadata": {"name": "worker-1",
                                 "labels": {"node-role.kubernetes.io/control-plane": ""},
                                 "annotations": {MACHINE_CONFIG_STATE_ANNOTATION: "Working"}},
                    "spec": {"unschedulable": true, "taints": [
                        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                         "timeAdded": "2026-11-26T11:50:00Z"}]},
                }))),
                upgrading(0),
                &off,
                None,
                pass(10, vec![], true, MetricChange::Set),
            ),
        ];
        for (case, node, campaigns, drain, pods, expected) in rows {
            let inputs = Inputs {
                node: &node,
                campaigns: &campaigns,
                drain,
                pods,
            };
            assert_eq!(decide(&inputs, now()), expected, "{case}");
        }
    }

    /// timeOut 45, expected 8, PDBForceDrainTimeout 60: the worked example through
    /// [`decide`].
    #[test]
    fn a_drain_with_a_pdb_pod_over_time() {
        let db = PodFacts {
            pdb: true,
            pod: PodRef {
                namespace: "apps".into(),
                name: "db".into(),
                uid: "u-db".into(),
            },
            ..web()
        };
        let drain = NodeDrain::default();
        let campaigns = upgrading(60);
        // (minutes since the cordon, pods on the node, strategies that act, failed)
        let rows: Vec<(i64, Vec<PodFacts>, Vec<Strategy>, bool)> = vec![
            (45, vec![web(), db.clone()], vec![], false),
            (46, vec![web(), db.clone()], vec![Strategy::Delete], false),
            (54, vec![db.clone()], vec![], false),
            (54, vec![], vec![], true),
            (69, vec![db.clone()], vec![Strategy::PdbDelete], false),
            (77, vec![], vec![], true),
        ];
        for (minutes, pods, acted, failed) in rows {
            let node = cordoned(minutes);
            let inputs = Inputs {
                node: &node,
                campaigns: &campaigns,
                drain: &drain,
                pods: Some(&pods),
            };
            let Decision::Drain(pass) = decide(&inputs, now()) else {
                panic!("{minutes}: a pass");
            };
            let got: Vec<Strategy> = pass.runs.iter().map(|run| run.strategy).collect();
            assert_eq!((got, pass.failed), (acted, failed), "{minutes} min");
        }
    }

    fn node(value: Value) -> Node {
        serde_json::from_value(value).expect("a node")
    }

    fn config(version: &str, entries: Value, pdb: i32) -> UpgradeConfig {
        serde_json::from_value(json!({
            "apiVersion": "upgrade.managed.openshift.io/v1alpha1", "kind": "UpgradeConfig",
            "metadata": {"name": "c", "namespace": "fleet"},
            "spec": {"type": "OSD", "upgradeAt": "2026-11-26T09:00:00Z",
                     "PDBForceDrainTimeout": pdb, "desired": {"version": version}},
            "status": {"history": entries},
        }))
        .expect("an UpgradeConfig")
    }

    #[test]
    fn campaigns_table() {
        let entry = |version: &str, phase: &str| json!({"version": version, "phase": phase});
        let minutes = |m: u64| Duration::from_secs(m * 60);
        // (case, campaigns, upgrading, PDBForceDrainTimeout)
        let rows: Vec<(&str, Vec<UpgradeConfig>, bool, Duration)> = vec![
            ("none", vec![], false, Duration::ZERO),
            (
                "Pending",
                vec![config("v2", json!([entry("v2", "Pending")]), 60)],
                false,
                Duration::ZERO,
            ),
            (
                "Upgrading",
                vec![config("v2", json!([entry("v2", "Upgrading")]), 60)],
                true,
                minutes(60),
            ),
            (
                "an older version Upgrading, the desired one New",
                vec![config(
                    "v3",
                    json!([entry("v3", "New"), entry("v2", "Upgrading")]),
                    60,
                )],
                false,
                Duration::ZERO,
            ),
            (
                "no history",
                vec![config("v2", json!([]), 60)],
                false,
                Duration::ZERO,
            ),
            (
                "two Upgrading: the largest PDBForceDrainTimeout; a Pending one aside",
                vec![
                    config("v2", json!([entry("v2", "Upgrading")]), 30),
                    config("v3", json!([entry("v3", "Upgrading")]), 90),
                    config("v4", json!([entry("v4", "Pending")]), 600),
                ],
                true,
                minutes(90),
            ),
        ];
        for (case, configs, upgrading, pdb) in rows {
            assert_eq!(
                UpgradingCampaigns::of(&configs),
                UpgradingCampaigns {
                    upgrading,
                    pdb_force_drain_timeout: pdb
                },
                "{case}"
            );
        }
    }

    #[test]
    fn facts_of_a_node() {
        let master =
            node(json!({"metadata": {"name": "cp", "labels": {MASTER_ROLE_LABEL: "true"}}}));
        assert!(NodeFacts::of(&master).master);
        let worker = node(json!({"metadata": {"name": "w",
            "annotations": {UPGRADE_STATE_ANNOTATION: "Working"},
            "deletionTimestamp": "2026-11-26T11:00:00Z", "finalizers": ["x"]}}));
        let facts = NodeFacts::of(&worker);
        assert!(facts.upgrading && facts.deleting && !facts.master && !facts.gone);
        assert!(NodeFacts::gone(&worker).gone);
        let done = node(json!({"metadata": {"name": "w",
            "annotations": {MACHINE_CONFIG_STATE_ANNOTATION: "Done"}}}));
        assert!(!NodeFacts::of(&done).upgrading);
    }
}
