//! MUO's five timed drain strategies (pkg/drain), one pass of them over a node's pods
//! ([`run_pass`]), and whether the drain has failed ([`has_failed`]).
//!
//! | strategy | due after | acts on (besides on the node, not a DaemonSet's, namespace not ignored) | action |
//! | --- | --- | --- | --- |
//! | `DELETE` | `timeOut` | no PDB; not already terminating | delete, grace 0 |
//! | `DEFAULT-FINALIZER` | `timeOut` | no PDB; finalizers | strip every finalizer |
//! | `POD-STUCK-TERMINATING` | `timeOut` | no PDB; no finalizers; terminating | delete, grace 0 |
//! | `PDB-DELETE` | `PDBForceDrainTimeout` + `expectedNodeDrainTime` | PDB; not already terminating | delete, grace 0 |
//! | `PDB-FINALIZER` | `PDBForceDrainTimeout` + `expectedNodeDrainTime` | PDB; finalizers | strip every finalizer |
//!
//! A strategy is due once its wait has passed since the drain began ([`is_after`]:
//! `start + wait < now`, strictly). It is *valid* while some pod matches its filters,
//! terminating pods included even for the two that skip them when they act (so `DELETE`
//! stays valid while a pod it deleted terminates); it *executed* when it acted on a pod.
//!
//! One pass runs every due strategy, in the order of the table, each on the pods as the
//! ones before it left them: at `timeOut` a pod held by a finalizer is deleted by `DELETE`
//! (it starts terminating) and then stripped by `DEFAULT-FINALIZER`, and is gone.
//!
//! [`has_failed`] (MUO's `HasFailed`), with the strategies sorted by wait:
//!
//! | case | failed |
//! | --- | --- |
//! | start unknown | no |
//! | no strategies (`disableDrainStrategies`) | `start + timeOut < now` |
//! | a strategy not yet due is valid | no |
//! | the last due strategy's wait + `expectedNodeDrainTime` > `timeOut` | `start + that < now` |
//! | otherwise | `start + timeOut < now` |
//!
//! With `timeOut` 45, `expectedNodeDrainTime` 8 and `PDBForceDrainTimeout` 60 (PDB wait
//! 68), after `e` minutes: `e` ≤ 45 not failed; 45 < `e` ≤ 68 not failed while a PDB pod is
//! on the node, else failed once `e` > 53; `e` > 68 failed once `e` > 76.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::pods::{PodFacts, PodRef};
use capstan_api::NodeDrain;

/// The waits of one drain: the governing `nodeDrain` settings and the campaign's
/// `PDBForceDrainTimeout`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainTimes {
    /// `nodeDrain.timeOut`.
    pub time_out: SignedDuration,
    /// `nodeDrain.expectedNodeDrainTime`.
    pub expected: SignedDuration,
    /// The campaign's `PDBForceDrainTimeout`.
    pub pdb_force: SignedDuration,
}

impl DrainTimes {
    /// The waits `drain` and `pdb_force_drain_timeout` set.
    pub fn of(drain: &NodeDrain, pdb_force_drain_timeout: Duration) -> DrainTimes {
        DrainTimes {
            time_out: minutes(drain.time_out),
            expected: minutes(drain.expected_node_drain_time),
            pdb_force: SignedDuration::try_from(pdb_force_drain_timeout)
                .unwrap_or(SignedDuration::MAX),
        }
    }

    /// When the PDB strategies are due: `PDBForceDrainTimeout` + `expectedNodeDrainTime`.
    pub fn pdb_wait(&self) -> SignedDuration {
        self.pdb_force.saturating_add(self.expected)
    }
}

fn minutes(minutes: u32) -> SignedDuration {
    SignedDuration::from_mins(i64::from(minutes))
}

/// Whether `wait` has passed since `start`: `start + wait < now`, strictly (MUO's
/// `isAfter`). A time past the calendar's end never comes.
pub fn is_after(start: Timestamp, wait: SignedDuration, now: Timestamp) -> bool {
    start.checked_add(wait).is_ok_and(|end| end < now)
}

/// What a strategy does to each pod it acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodAction {
    /// Delete with grace period 0.
    Delete,
    /// Remove every finalizer.
    StripFinalizers,
}

impl PodAction {
    /// How a record says it was done to a pod.
    pub fn done(self) -> &'static str {
        match self {
            PodAction::Delete => "deleted",
            PodAction::StripFinalizers => "finalizers stripped",
        }
    }

    /// `pod` as the API server leaves it after the action; `None` once it is gone. A pod
    /// deleted with grace 0 goes at once unless finalizers hold it (then it terminates);
    /// a terminating pod goes when its finalizers do.
    fn apply(self, mut pod: PodFacts) -> Option<PodFacts> {
        match self {
            PodAction::Delete if pod.finalizers => {
                pod.terminating = true;
                Some(pod)
            }
            PodAction::Delete => None,
            PodAction::StripFinalizers if pod.terminating => None,
            PodAction::StripFinalizers => {
                pod.finalizers = false;
                Some(pod)
            }
        }
    }
}

/// One of MUO's timed drain strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Strategy {
    /// `DELETE`: pods no PDB protects are deleted.
    Delete,
    /// `DEFAULT-FINALIZER`: their finalizers are stripped.
    DefaultFinalizer,
    /// `POD-STUCK-TERMINATING`: those stuck terminating without finalizers are deleted again.
    PodStuckTerminating,
    /// `PDB-DELETE`: pods a PDB protects are deleted.
    PdbDelete,
    /// `PDB-FINALIZER`: their finalizers are stripped.
    PdbFinalizer,
}

impl Strategy {
    /// Every strategy, in the order a pass runs them (MUO's).
    pub const ALL: [Strategy; 5] = [
        Strategy::Delete,
        Strategy::DefaultFinalizer,
        Strategy::PodStuckTerminating,
        Strategy::PdbDelete,
        Strategy::PdbFinalizer,
    ];

    /// MUO's name, which records and events use.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Delete => "DELETE",
            Strategy::DefaultFinalizer => "DEFAULT-FINALIZER",
            Strategy::PodStuckTerminating => "POD-STUCK-TERMINATING",
            Strategy::PdbDelete => "PDB-DELETE",
            Strategy::PdbFinalizer => "PDB-FINALIZER",
        }
    }

    /// MUO's description.
    pub fn description(self) -> &'static str {
        match self {
            Strategy::Delete => "Default pod deletion",
            Strategy::DefaultFinalizer => "Default pod finalizer removal",
            Strategy::PodStuckTerminating => "Pod stuck terminating removal",
            Strategy::PdbDelete => "PDB pod deletion",
            Strategy::PdbFinalizer => "PDB pod finalizer removal",
        }
    }

    /// The reason of the Event that says the strategy acted.
    pub fn reason(self) -> &'static str {
        match self {
            Strategy::Delete => "DrainPodsDeleted",
            Strategy::DefaultFinalizer => "DrainFinalizersRemoved",
            Strategy::PodStuckTerminating => "DrainStuckPodsDeleted",
            Strategy::PdbDelete => "DrainPdbPodsDeleted",
            Strategy::PdbFinalizer => "DrainPdbFinalizersRemoved",
        }
    }

    /// How long after the drain began it is due.
    pub fn wait(self, times: &DrainTimes) -> SignedDuration {
        match self {
            Strategy::Delete | Strategy::DefaultFinalizer | Strategy::PodStuckTerminating => {
                times.time_out
            }
            Strategy::PdbDelete | Strategy::PdbFinalizer => times.pdb_wait(),
        }
    }

    /// What it does to a pod.
    pub fn action(self) -> PodAction {
        match self {
            Strategy::Delete | Strategy::PodStuckTerminating | Strategy::PdbDelete => {
                PodAction::Delete
            }
            Strategy::DefaultFinalizer | Strategy::PdbFinalizer => PodAction::StripFinalizers,
        }
    }

    /// Whether `pod` passes its filters, terminating or not (MUO's `IsValid`).
    pub fn applies_to(self, pod: &PodFacts) -> bool {
        pod.forceable()
            && match self {
                Strategy::Delete => !pod.pdb,
                Strategy::DefaultFinalizer => !pod.pdb && pod.finalizers,
                Strategy::PodStuckTerminating => !pod.pdb && !pod.finalizers && pod.terminating,
                Strategy::PdbDelete => pod.pdb,
                Strategy::PdbFinalizer => pod.pdb && pod.finalizers,
            }
    }

    /// Whether it acts on `pod` when it runs (MUO's `Execute`): the deletions leave pods
    /// already terminating to the others.
    pub fn acts_on(self, pod: &PodFacts) -> bool {
        let skips_terminating = matches!(self, Strategy::Delete | Strategy::PdbDelete);
        self.applies_to(pod) && !(skips_terminating && pod.terminating)
    }
}

/// A strategy that acts in a pass, and the pods it acts on (sorted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrategyRun {
    /// The strategy.
    pub strategy: Strategy,
    /// The pods, sorted by namespace and name.
    pub pods: Vec<PodRef>,
}

/// One pass of the strategies over a node's pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The strategies that act, in order.
    pub runs: Vec<StrategyRun>,
    /// The pods as the pass leaves them.
    pub left: Vec<PodFacts>,
}

/// Every strategy due at `now` for a drain begun at `start`, in order, each on `pods` as the
/// ones before it left them. A due strategy with nothing to act on is left out.
pub fn run_pass(start: Timestamp, times: &DrainTimes, pods: &[PodFacts], now: Timestamp) -> Pass {
    let mut left = pods.to_vec();
    let mut runs = Vec::new();
    for strategy in Strategy::ALL {
        if !is_after(start, strategy.wait(times), now) {
            continue;
        }
        let mut targets: Vec<PodRef> = left
            .iter()
            .filter(|pod| strategy.acts_on(pod))
            .map(|pod| pod.pod.clone())
            .collect();
        if targets.is_empty() {
            continue;
        }
        targets.sort();
        left = left
            .into_iter()
            .filter_map(|pod| {
                if targets.contains(&pod.pod) {
                    strategy.action().apply(pod)
                } else {
                    Some(pod)
                }
            })
            .collect();
        runs.push(StrategyRun {
            strategy,
            pods: targets,
        });
    }
    Pass { runs, left }
}

/// A strategy as [`has_failed`] weighs it: its wait, and whether it is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed {
    /// How long after the drain began it is due.
    pub wait: SignedDuration,
    /// Some pod passes its filters.
    pub valid: bool,
}

/// Whether the drain begun at `start` has failed at `now` (MUO's `HasFailed`, table in the
/// module doc): `strategies` are those in force (none when `disableDrainStrategies`),
/// weighed on `pods` as the pass left them.
pub fn has_failed(
    start: Option<Timestamp>,
    strategies: &[Strategy],
    times: &DrainTimes,
    pods: &[PodFacts],
    now: Timestamp,
) -> bool {
    let timed: Vec<Timed> = strategies
        .iter()
        .map(|strategy| Timed {
            wait: strategy.wait(times),
            valid: pods.iter().any(|pod| strategy.applies_to(pod)),
        })
        .collect();
    failed_after(start, &timed, times, now)
}

/// [`has_failed`] over strategies given as waits and validity.
pub fn failed_after(
    start: Option<Timestamp>,
    timed: &[Timed],
    times: &DrainTimes,
    now: Timestamp,
) -> bool {
    let mut sorted = timed.to_vec();
    // MUO's sortDuration compares the unsorted input (`ts[i]`) instead of the slice being
    // sorted; when PDBForceDrainTimeout + expectedNodeDrainTime < timeOut its order comes
    // out [t, t, p, t, p] and the last due strategy is a PDB one (see the tests).
    sorted.sort_by_key(|t| t.wait);
    failed_in_order(start, &sorted, times, now)
}

/// MUO's `HasFailed` on strategies taken in the order given.
fn failed_in_order(
    start: Option<Timestamp>,
    ordered: &[Timed],
    times: &DrainTimes,
    now: Timestamp,
) -> bool {
    let Some(start) = start else {
        return false;
    };
    if ordered.is_empty() {
        return is_after(start, times.time_out, now);
    }
    let due = |t: &&Timed| is_after(start, t.wait, now);
    let due_count = ordered.iter().filter(due).count();
    if ordered[due_count..].iter().any(|t| t.valid) {
        return false;
    }
    if let Some(last_due) = ordered.iter().rfind(due) {
        let settled = last_due.wait.saturating_add(times.expected);
        if settled > times.time_out {
            return is_after(start, settled, now);
        }
    }
    is_after(start, times.time_out, now)
}

/// When a strategy starts for a drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrategyTime {
    /// The strategy.
    pub strategy: Strategy,
    /// It runs at the first look after this time.
    pub after: Timestamp,
}

/// When each strategy starts for a drain begun at `start` under `drain` and a campaign's
/// `PDBForceDrainTimeout`, in pass order; none with `disableDrainStrategies`. A time past
/// the calendar's end reads as its end.
pub fn strategy_times(
    start: Timestamp,
    drain: &NodeDrain,
    pdb_force_drain_timeout: Duration,
) -> Vec<StrategyTime> {
    if drain.disable_drain_strategies {
        return Vec::new();
    }
    let times = DrainTimes::of(drain, pdb_force_drain_timeout);
    Strategy::ALL
        .into_iter()
        .map(|strategy| StrategyTime {
            strategy,
            after: start
                .checked_add(strategy.wait(&times))
                .unwrap_or(Timestamp::MAX),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Strategy::*;

    const NOW: &str = "2026-11-26T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("a time")
    }

    /// The drain began `minutes` before [`NOW`].
    fn began(minutes: f64) -> Timestamp {
        now() - SignedDuration::from_secs_f64(minutes * 60.0)
    }

    fn times(time_out: u32, expected: u32, pdb: u32) -> DrainTimes {
        DrainTimes {
            time_out: minutes(time_out),
            expected: minutes(expected),
            pdb_force: minutes(pdb),
        }
    }

    /// A plain pod on worker-1 in namespace `apps`.
    fn pod(name: &str) -> PodFacts {
        PodFacts {
            pod: PodRef {
                namespace: "apps".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            on_node: true,
            daemon_set: false,
            finalizers: false,
            terminating: false,
            ignored_namespace: false,
            pdb: false,
        }
    }

    fn held(name: &str) -> PodFacts {
        PodFacts {
            finalizers: true,
            ..pod(name)
        }
    }

    fn deleting(name: &str) -> PodFacts {
        PodFacts {
            terminating: true,
            ..pod(name)
        }
    }

    fn elsewhere(name: &str) -> PodFacts {
        PodFacts {
            on_node: false,
            ..pod(name)
        }
    }

    fn budgeted(pod: PodFacts) -> PodFacts {
        PodFacts { pdb: true, ..pod }
    }

    fn names(pods: &[PodRef]) -> Vec<&str> {
        pods.iter().map(|pod| pod.name.as_str()).collect()
    }

    #[test]
    fn is_after_is_strict() {
        let wait = minutes(45);
        // (minutes since start, after)
        let rows = [(44.0, false), (45.0, false), (45.01, true), (90.0, true)];
        for (elapsed, expected) in rows {
            assert_eq!(is_after(began(elapsed), wait, now()), expected, "{elapsed}");
        }
        // A start in the future (MUO: AddedAt now + 22.5 min) is not after anything.
        assert!(!is_after(began(-22.5), SignedDuration::ZERO, now()));
        assert!(
            !is_after(now(), SignedDuration::MAX, now()),
            "never, not a panic"
        );
    }

    /// Each strategy on its own, as MUO's per-strategy tests (podDeleteStrategy_test.go,
    /// removeFinalizersStrategy_test.go, stuckTerminatingStrategy_test.go) and pod_test.go.
    #[test]
    fn strategy_filter_table() {
        let ignored = |pod: PodFacts| PodFacts {
            ignored_namespace: true,
            ..pod
        };
        let both = |pod: PodFacts| PodFacts {
            terminating: true,
            ..pod
        };
        // (case, strategy, pods, acts on, valid)
        type Row<'a> = (&'a str, Strategy, Vec<PodFacts>, Vec<&'a str>, bool);
        let rows: Vec<Row> = vec![
            (
                "DELETE: pod1 on the node, pod2 deleting, pod3 elsewhere: one delete",
                Delete,
                vec![pod("pod1"), deleting("pod2"), elsewhere("pod3")],
                vec!["pod1"],
                true,
            ),
            (
                "DELETE: only deleting pods: not executed, still valid",
                Delete,
                vec![deleting("pod2")],
                vec![],
                true,
            ),
            (
                "DELETE: [deleting, deleting, normal]: the one not deleting",
                Delete,
                vec![deleting("a"), deleting("b"), pod("c")],
                vec!["c"],
                true,
            ),
            (
                "DELETE: the namespace ignored: not valid",
                Delete,
                vec![ignored(pod("pod1"))],
                vec![],
                false,
            ),
            (
                "DELETE: a DaemonSet's pod: not valid",
                Delete,
                vec![PodFacts {
                    daemon_set: true,
                    ..pod("ds")
                }],
                vec![],
                false,
            ),
            (
                "DELETE: a PDB pod is PDB-DELETE's",
                Delete,
                vec![budgeted(pod("db"))],
                vec![],
                false,
            ),
            (
                "DEFAULT-FINALIZER: pod1 held, pod2 held elsewhere, pod3 free: one strip",
                DefaultFinalizer,
                vec![held("pod1"), elsewhere("pod2"), pod("pod3")],
                vec!["pod1"],
                true,
            ),
            (
                "DEFAULT-FINALIZER: none with finalizers: not valid",
                DefaultFinalizer,
                vec![pod("pod3")],
                vec![],
                false,
            ),
            (
                "DEFAULT-FINALIZER: three pods, two held: two strips",
                DefaultFinalizer,
                vec![held("a"), held("b"), pod("c")],
                vec!["a", "b"],
                true,
            ),
            (
                "DEFAULT-FINALIZER: the namespace ignored: not valid",
                DefaultFinalizer,
                vec![ignored(held("pod1"))],
                vec![],
                false,
            ),
            (
                "POD-STUCK-TERMINATING: pod1 deleting, pod2 deleting and held, pod3 elsewhere",
                PodStuckTerminating,
                vec![
                    deleting("pod1"),
                    both(held("pod2")),
                    PodFacts {
                        terminating: true,
                        ..elsewhere("pod3")
                    },
                ],
                vec!["pod1"],
                true,
            ),
            (
                "POD-STUCK-TERMINATING: none terminating: not valid",
                PodStuckTerminating,
                vec![pod("pod1")],
                vec![],
                false,
            ),
            (
                "POD-STUCK-TERMINATING: [deleting, deleting]: both, deleting or not",
                PodStuckTerminating,
                vec![deleting("a"), deleting("b")],
                vec!["a", "b"],
                true,
            ),
            (
                "POD-STUCK-TERMINATING: the namespace ignored: not valid",
                PodStuckTerminating,
                vec![ignored(deleting("pod1"))],
                vec![],
                false,
            ),
            (
                "PDB-DELETE: the PDB pod, not the other",
                PdbDelete,
                vec![budgeted(pod("db")), pod("web")],
                vec!["db"],
                true,
            ),
            (
                "PDB-DELETE: a PDB pod already deleting: valid, not acted on",
                PdbDelete,
                vec![budgeted(deleting("db"))],
                vec![],
                true,
            ),
            (
                "PDB-FINALIZER: the held PDB pod",
                PdbFinalizer,
                vec![budgeted(held("db")), budgeted(pod("db-1")), held("web")],
                vec!["db"],
                true,
            ),
        ];
        for (case, strategy, pods, acts_on, valid) in rows {
            let acted: Vec<&str> = pods
                .iter()
                .filter(|pod| strategy.acts_on(pod))
                .map(|pod| pod.pod.name.as_str())
                .collect();
            assert_eq!(acted, acts_on, "{case}");
            assert_eq!(
                pods.iter().any(|pod| strategy.applies_to(pod)),
                valid,
                "{case}: valid"
            );
        }
    }

    /// MUO's osd_drain_strategy_test.go `Execute` cases, and one pass at each wait.
    #[test]
    fn pass_table() {
        let db = budgeted(held("db"));
        // (case, times, minutes since start, pods, runs: (strategy, pods), pods left)
        type Row<'a> = (
            &'a str,
            DrainTimes,
            f64,
            Vec<PodFacts>,
            Vec<(Strategy, Vec<&'a str>)>,
            Vec<&'a str>,
        );
        let rows: Vec<Row> = vec![
            (
                "wait 30, cordoned 45 min: executed",
                times(30, 8, 60),
                45.0,
                vec![pod("web")],
                vec![(Delete, vec!["web"])],
                vec![],
            ),
            (
                "wait 60, cordoned 45 min: not executed",
                times(60, 8, 60),
                45.0,
                vec![pod("web")],
                vec![],
                vec!["web"],
            ),
            (
                "waits 30 and 60, cordoned 45 min: only the first",
                times(30, 8, 52),
                45.0,
                vec![pod("web"), budgeted(pod("db"))],
                vec![(Delete, vec!["web"])],
                vec!["db"],
            ),
            (
                "exactly at timeOut: nothing yet (strict)",
                times(45, 8, 60),
                45.0,
                vec![pod("web")],
                vec![],
                vec!["web"],
            ),
            (
                "at timeOut a held pod is deleted, then stripped, in one pass",
                times(45, 8, 60),
                46.0,
                vec![held("cache"), pod("web")],
                vec![
                    (Delete, vec!["cache", "web"]),
                    (DefaultFinalizer, vec!["cache"]),
                ],
                vec![],
            ),
            (
                "a pod stuck terminating is deleted again; a terminating held pod is stripped",
                times(45, 8, 60),
                46.0,
                vec![
                    deleting("stuck"),
                    PodFacts {
                        terminating: true,
                        ..held("held")
                    },
                ],
                vec![
                    (DefaultFinalizer, vec!["held"]),
                    (PodStuckTerminating, vec!["stuck"]),
                ],
                vec![],
            ),
            (
                "DaemonSet pods, ignored namespaces and other nodes are never touched",
                times(45, 8, 60),
                120.0,
                vec![
                    PodFacts {
                        daemon_set: true,
                        ..pod("agent")
                    },
                    PodFacts {
                        ignored_namespace: true,
                        ..pod("kept")
                    },
                    elsewhere("other"),
                ],
                vec![],
                vec!["agent", "kept", "other"],
            ),
            (
                "before the PDB wait, a PDB pod stays",
                times(45, 8, 60),
                60.0,
                vec![pod("web"), db.clone()],
                vec![(Delete, vec!["web"])],
                vec!["db"],
            ),
            (
                "after the PDB wait, a held PDB pod is deleted, then stripped",
                times(45, 8, 60),
                69.0,
                vec![db.clone()],
                vec![(PdbDelete, vec!["db"]), (PdbFinalizer, vec!["db"])],
                vec![],
            ),
            (
                "a PDB pod stuck terminating without finalizers is not forced (no strategy for it)",
                times(45, 8, 60),
                69.0,
                vec![budgeted(deleting("db"))],
                vec![],
                vec!["db"],
            ),
        ];
        for (case, times, elapsed, pods, runs, left) in rows {
            let pass = run_pass(began(elapsed), &times, &pods, now());
            let got: Vec<(Strategy, Vec<&str>)> = pass
                .runs
                .iter()
                .map(|run| (run.strategy, names(&run.pods)))
                .collect();
            assert_eq!(got, runs, "{case}");
            let got_left: Vec<&str> = pass.left.iter().map(|p| p.pod.name.as_str()).collect();
            assert_eq!(got_left, left, "{case}: left");
        }
    }

    #[test]
    fn a_pass_names_its_pods_in_order() {
        let pods = [
            pod("b"),
            pod("a"),
            PodFacts {
                pod: PodRef {
                    namespace: "aa".into(),
                    name: "z".into(),
                    uid: "u".into(),
                },
                ..pod("z")
            },
        ];
        let pass = run_pass(began(50.0), &times(45, 8, 60), &pods, now());
        let shown: Vec<String> = pass.runs[0].pods.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["aa/z", "apps/a", "apps/b"]);
    }

    /// MUO's `HasFailed` cases with strategies given as waits (osd_drain_strategy_test.go).
    #[test]
    fn has_failed_over_waits_table() {
        let timed = |wait: u32, valid: bool| Timed {
            wait: minutes(wait),
            valid,
        };
        // (case, times, start (minutes ago), strategies, failed)
        type Row<'a> = (&'a str, DrainTimes, Option<f64>, Vec<Timed>, bool);
        let rows: Vec<Row> = vec![
            ("start unknown", times(45, 8, 0), None, vec![], false),
            (
                "no strategies, start 22.5 min ahead",
                times(45, 8, 0),
                Some(-22.5),
                vec![],
                false,
            ),
            (
                "no strategies, started 90 min ago",
                times(45, 8, 0),
                Some(90.0),
                vec![],
                true,
            ),
            (
                "waits [60, 30], started 69 min ago: last due 60 + 8 passed",
                times(15, 8, 0),
                Some(69.0),
                vec![timed(60, true), timed(30, true)],
                true,
            ),
            (
                "waits [10, 5], started 31 min ago",
                times(15, 8, 0),
                Some(31.0),
                vec![timed(10, true), timed(5, true)],
                true,
            ),
            (
                "waits [30, 10], started 20 min ago, the pending one valid",
                times(15, 8, 0),
                Some(20.0),
                vec![timed(30, true), timed(10, true)],
                false,
            ),
            (
                "waits [30, 10], started 20 min ago, the pending one not valid: 10 + 8 passed",
                times(15, 8, 0),
                Some(20.0),
                vec![timed(30, false), timed(10, true)],
                true,
            ),
            (
                "PDB wait 18 under timeOut 45, all due at 50: the last due by wait is a \
                 timeOut one, 53 not passed (MUO's misordered sort: failed, see below)",
                times(45, 8, 10),
                Some(50.0),
                vec![
                    timed(45, false),
                    timed(45, false),
                    timed(45, false),
                    timed(18, false),
                    timed(18, false),
                ],
                false,
            ),
            (
                "the last due wait + expected within timeOut: timeOut decides",
                times(45, 8, 0),
                Some(44.0),
                vec![timed(10, true)],
                false,
            ),
        ];
        for (case, times, start, timed, failed) in rows {
            let start = start.map(began);
            assert_eq!(failed_after(start, &timed, &times, now()), failed, "{case}");
        }
    }

    /// The worked example: timeOut 45, expected 8, PDBForceDrainTimeout 60, with MUO's five
    /// strategies weighed on the pods a pass leaves.
    #[test]
    fn has_failed_worked_example() {
        let times = times(45, 8, 60);
        let with_pdb_pod = vec![pod("web"), budgeted(pod("db"))];
        let without = vec![pod("web")];
        // (minutes since start, pods before the pass, failed)
        let rows: Vec<(f64, &Vec<PodFacts>, bool)> = vec![
            (45.0, &with_pdb_pod, false),
            (45.0, &without, false),
            (46.0, &with_pdb_pod, false),
            (53.0, &without, false),
            (53.5, &without, true),
            (60.0, &with_pdb_pod, false),
            (68.0, &with_pdb_pod, false),
            (70.0, &with_pdb_pod, false),
            (76.0, &with_pdb_pod, false),
            (76.5, &with_pdb_pod, true),
        ];
        for (elapsed, pods, failed) in rows {
            let pass = run_pass(began(elapsed), &times, pods, now());
            let got = has_failed(
                Some(began(elapsed)),
                &Strategy::ALL,
                &times,
                &pass.left,
                now(),
            );
            assert_eq!(got, failed, "{elapsed} min, {} pods", pods.len());
        }
    }

    /// Where MUO's misordered sort decides otherwise: PDBForceDrainTimeout 10 and
    /// expected 8 (PDB wait 18) under timeOut 45, 50 minutes in, a PDB pod stuck
    /// terminating left on the node (PDB-DELETE valid, but due).
    #[test]
    fn has_failed_sorts_by_wait_where_muo_does_not() {
        let times = times(45, 8, 10);
        let pods = [budgeted(deleting("db"))];
        let start = Some(began(50.0));
        let timed: Vec<Timed> = Strategy::ALL
            .iter()
            .map(|s| Timed {
                wait: s.wait(&times),
                valid: pods.iter().any(|p| s.applies_to(p)),
            })
            .collect();
        // Sorted: [PDB-DELETE 18, PDB-FINALIZER 18, DELETE 45, ...]; the last due is a
        // timeOut one: 45 + 8 = 53 not passed.
        assert!(!has_failed(start, &Strategy::ALL, &times, &pods, now()));
        // MUO's order [DELETE, DEFAULT-FINALIZER, PDB-DELETE, POD-STUCK-TERMINATING,
        // PDB-FINALIZER]: the last due is PDB-FINALIZER, 18 + 8 within timeOut, so timeOut
        // decides, and 50 > 45.
        // (With a PDB wait at or past timeOut the input is already in order, MUO's sort
        // swaps nothing, and both agree.)
        let muo = [timed[0], timed[1], timed[3], timed[2], timed[4]];
        assert!(failed_in_order(start, &muo, &times, now()));
    }

    #[test]
    fn strategy_times_for_a_plan() {
        let start: Timestamp = "2026-11-26T09:00:00Z".parse().unwrap();
        let drain = NodeDrain::default();
        let got: Vec<(&str, String)> = strategy_times(start, &drain, Duration::from_secs(3600))
            .iter()
            .map(|t| (t.strategy.name(), t.after.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                ("DELETE", "2026-11-26T09:45:00Z".to_string()),
                ("DEFAULT-FINALIZER", "2026-11-26T09:45:00Z".to_string()),
                ("POD-STUCK-TERMINATING", "2026-11-26T09:45:00Z".to_string()),
                ("PDB-DELETE", "2026-11-26T10:08:00Z".to_string()),
                ("PDB-FINALIZER", "2026-11-26T10:08:00Z".to_string()),
            ]
        );
        let disabled = NodeDrain {
            disable_drain_strategies: true,
            ..NodeDrain::default()
        };
        assert!(strategy_times(start, &disabled, Duration::ZERO).is_empty());
        let far = strategy_times(start, &drain, Duration::MAX);
        assert_eq!(far[3].after, Timestamp::MAX);
    }
}
