//! What the Module -> NMC controller keeps on a Module itself: the finalizer that holds its
//! deletion until it is unloaded everywhere, upstream's `kmm.node.k8s.io/contains-modules`
//! label on its namespace (which tools and upstream's namespace webhook read), and
//! `status.moduleLoader` with the `Available` and `Degraded` conditions.
//!
//! [`decide_module`] lists the writes of one reconcile, in the order they are made; a write
//! that does not go through stops those after it:
//!
//! | Module | finalizer | NMCs that list it | writes, in order |
//! | --- | --- | --- | --- |
//! | being deleted | on | none | finalizer removed; namespace label removed, when no other Module is in the namespace |
//! | being deleted | on | some | none: the Module waits until it is unloaded everywhere |
//! | being deleted | off | any | none |
//! | live | off | - | namespace labelled (as upstream's namespace labeller does when it first sees a Module); finalizer added; status, as below |
//! | live | on | - | status, as below |
//!
//! An NMC lists a Module while its spec or status does, or its `module-in-use` label is on
//! ([`Held::present`](super::Held::present)): the module is not gone from the node yet.
//!
//! | status of a live Module | write |
//! | --- | --- |
//! | counts and conditions as the status has them | none |
//! | a condition changes status | the status, at once |
//! | the counts only | the status, at the pace the reconciler keeps |
//!
//! The conditions ([`conditions`]):
//!
//! | condition | `True` when | reasons (`True` / `False`) |
//! | --- | --- | --- |
//! | `Available` | every NMC that lists the Module in its spec has it loaded (`availableNumber` = `desiredNumber`) | `Loaded` / `Loading` |
//! | `Degraded` | the Module's worker pods failed last on some node (the first [`FAILURES_SHOWN`] named) | `WorkerFailed` / `WorkersSucceed` |
//!
//! A condition keeps its `lastTransitionTime` while its status stays.

use jiff::Timestamp;

use super::tally::Counts;
use crate::controllers::failures::WorkerFailure;
use capstan_api::clock::rfc3339;
use capstan_api::labels::MODULE_FINALIZER;
use capstan_api::module::{DaemonSetStatus, ModuleCondition, ModuleStatus};

/// Most failing nodes a `Degraded` message names.
pub const FAILURES_SHOWN: usize = 3;

/// What one reconcile of a Module decides on.
#[derive(Clone, Debug, PartialEq)]
pub enum ModuleSeen<'a> {
    /// `metadata.deletionTimestamp` is set.
    Deleting {
        /// `metadata.finalizers`.
        finalizers: &'a [String],
        /// How many NMCs still list the Module.
        listed_on: usize,
        /// Another Module (another uid) is in the Module's namespace.
        others_in_namespace: bool,
    },
    /// The Module is not being deleted.
    Live {
        /// `metadata.finalizers`.
        finalizers: &'a [String],
        /// `status`, empty when unset.
        status: &'a ModuleStatus,
        /// The counts and worker failures its status should say.
        counts: &'a Counts,
        /// Now, for the conditions' transition times.
        now: Timestamp,
    },
}

/// One write of a Module's reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum ModuleWrite {
    /// Label the Module's namespace `kmm.node.k8s.io/contains-modules`.
    LabelNamespace,
    /// Write the Module's finalizers with ours added: these, on the resourceVersion read.
    AddFinalizer(Vec<String>),
    /// Write the Module's finalizers without ours: these, on the resourceVersion read.
    RemoveFinalizer(Vec<String>),
    /// Remove the namespace's `kmm.node.k8s.io/contains-modules` label.
    UnlabelNamespace,
    /// Write `status.moduleLoader` and `status.conditions`.
    Status {
        module_loader: DaemonSetStatus,
        conditions: Vec<ModuleCondition>,
        /// A condition changes status: the write is not to wait for the pace of counts.
        turns: bool,
    },
}

/// The writes one reconcile of a Module makes, in order. See the module's tables.
pub fn decide_module(seen: &ModuleSeen) -> Vec<ModuleWrite> {
    let ours = |finalizers: &[String]| finalizers.iter().any(|f| f == MODULE_FINALIZER);
    match *seen {
        ModuleSeen::Deleting {
            finalizers,
            listed_on: 0,
            others_in_namespace,
        } if ours(finalizers) => {
            let rest = finalizers
                .iter()
                .filter(|f| *f != MODULE_FINALIZER)
                .cloned()
                .collect();
            let mut writes = vec![ModuleWrite::RemoveFinalizer(rest)];
            if !others_in_namespace {
                writes.push(ModuleWrite::UnlabelNamespace);
            }
            writes
        }
        ModuleSeen::Deleting { .. } => Vec::new(),
        ModuleSeen::Live {
            finalizers,
            status,
            counts,
            now,
        } => {
            let mut writes = Vec::new();
            if !ours(finalizers) {
                let mut all = finalizers.to_vec();
                all.push(MODULE_FINALIZER.to_string());
                writes.push(ModuleWrite::LabelNamespace);
                writes.push(ModuleWrite::AddFinalizer(all));
            }
            writes.extend(status_write(status, counts, now));
            writes
        }
    }
}

/// The status write that makes `current` say `counts` at `now`; `None` when it does.
fn status_write(current: &ModuleStatus, counts: &Counts, now: Timestamp) -> Option<ModuleWrite> {
    let conditions = conditions(current, &counts.status, &counts.failures, &rfc3339(now));
    if current.module_loader == counts.status && current.conditions == conditions {
        return None;
    }
    let turns = conditions.iter().any(|condition| {
        current
            .conditions
            .iter()
            .find(|c| c.type_ == condition.type_)
            .is_none_or(|c| c.status != condition.status)
    });
    Some(ModuleWrite::Status {
        module_loader: counts.status.clone(),
        conditions,
        turns,
    })
}

/// The Module's `Available` and `Degraded` conditions for `counts` and `failures` (by
/// node), with the transition times of `current` kept where the status stays and `now`
/// where it changes.
pub fn conditions(
    current: &ModuleStatus,
    counts: &DaemonSetStatus,
    failures: &[(String, WorkerFailure)],
    now: &str,
) -> Vec<ModuleCondition> {
    let available = counts.available_number == counts.desired_number;
    let available = ModuleCondition {
        type_: "Available".into(),
        status: if available { "True" } else { "False" }.into(),
        reason: if available { "Loaded" } else { "Loading" }.into(),
        message: format!(
            "loaded on {} of {} nodes",
            counts.available_number, counts.desired_number
        ),
        last_transition_time: String::new(),
    };
    let degraded = if failures.is_empty() {
        ModuleCondition {
            type_: "Degraded".into(),
            status: "False".into(),
            reason: "WorkersSucceed".into(),
            message: String::new(),
            last_transition_time: String::new(),
        }
    } else {
        let mut shown: Vec<String> = failures
            .iter()
            .take(FAILURES_SHOWN)
            .map(|(node, failure)| {
                format!(
                    "{node}: {} failed {} time(s): {}",
                    failure.action, failure.attempts, failure.message
                )
            })
            .collect();
        if failures.len() > FAILURES_SHOWN {
            shown.push(format!(
                "and {} more nodes",
                failures.len() - FAILURES_SHOWN
            ));
        }
        ModuleCondition {
            type_: "Degraded".into(),
            status: "True".into(),
            reason: "WorkerFailed".into(),
            message: shown.join("; "),
            last_transition_time: String::new(),
        }
    };
    [available, degraded]
        .into_iter()
        .map(|mut condition| {
            let previous = current
                .conditions
                .iter()
                .find(|c| c.type_ == condition.type_);
            condition.last_transition_time = match previous {
                Some(previous) if previous.status == condition.status => {
                    previous.last_transition_time.clone()
                }
                _ => now.to_string(),
            };
            condition
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-03-01T09:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().expect("a time")
    }

    /// Counts of three targeted nodes, `desired` with an entry, `available` loaded.
    fn counts(desired: i32, available: i32) -> DaemonSetStatus {
        DaemonSetStatus {
            nodes_matching_selector_number: 3,
            desired_number: desired,
            available_number: available,
        }
    }

    fn failure() -> WorkerFailure {
        WorkerFailure {
            action: "Load".into(),
            message: "pulling image x: manifest unknown".into(),
            attempts: 2,
            last_failure: "t0".into(),
            pod_uid: "u".into(),
        }
    }

    /// The status a write of `counts` and `failures` leaves, written at `at`.
    fn written(counts: &Counts, at: &str) -> ModuleStatus {
        ModuleStatus {
            module_loader: counts.status.clone(),
            conditions: conditions(
                &ModuleStatus::default(),
                &counts.status,
                &counts.failures,
                at,
            ),
            ..ModuleStatus::default()
        }
    }

    /// A live Module, seen [`NOW`].
    fn live<'a>(
        finalizers: &'a [String],
        status: &'a ModuleStatus,
        counts: &'a Counts,
    ) -> ModuleSeen<'a> {
        ModuleSeen::Live {
            finalizers,
            status,
            counts,
            now: now(),
        }
    }

    fn deleting(
        finalizers: &[String],
        listed_on: usize,
        others_in_namespace: bool,
    ) -> ModuleSeen<'_> {
        ModuleSeen::Deleting {
            finalizers,
            listed_on,
            others_in_namespace,
        }
    }

    /// `writes` in a form a table row can state.
    fn summary(writes: Vec<ModuleWrite>) -> Vec<String> {
        writes
            .into_iter()
            .map(|write| match write {
                ModuleWrite::LabelNamespace => "label namespace".to_string(),
                ModuleWrite::AddFinalizer(finalizers) => format!("add finalizer: {finalizers:?}"),
                ModuleWrite::RemoveFinalizer(finalizers) => {
                    format!("remove finalizer: {finalizers:?}")
                }
                ModuleWrite::UnlabelNamespace => "unlabel namespace".to_string(),
                ModuleWrite::Status {
                    module_loader,
                    conditions,
                    turns,
                } => {
                    let said: Vec<String> = conditions
                        .iter()
                        .map(|c| format!("{}={}", c.type_, c.status))
                        .collect();
                    format!(
                        "status: {} of {}, {}{}",
                        module_loader.available_number,
                        module_loader.desired_number,
                        said.join(" "),
                        if turns { ", at once" } else { ", paced" }
                    )
                }
            })
            .collect()
    }

    #[test]
    fn module_lifecycle_decision_table() {
        let ours = MODULE_FINALIZER.to_string();
        let other = "example.com/keep".to_string();
        let with_ours = [other.clone(), ours.clone()];
        let without = std::slice::from_ref(&other);
        let loading = Counts {
            status: counts(3, 1),
            failures: vec![],
        };
        let loaded = Counts {
            status: counts(3, 3),
            failures: vec![],
        };
        let failing = Counts {
            status: counts(3, 1),
            failures: vec![("worker-3".to_string(), failure())],
        };
        let loading_written = written(&loading, "2026-03-01T08:00:00Z");
        let loading_more = Counts {
            status: counts(3, 2),
            failures: vec![],
        };
        let unwritten = ModuleStatus::default();
        let rows: [(&str, ModuleSeen, Vec<String>); 10] = [
            (
                "deleting, finalizer on, listed nowhere -> finalizer, then namespace label, go",
                deleting(&with_ours, 0, false),
                vec![
                    format!("remove finalizer: {without:?}"),
                    "unlabel namespace".into(),
                ],
            ),
            (
                "deleting, listed nowhere, another Module in the namespace -> its label stays",
                deleting(&with_ours, 0, true),
                vec![format!("remove finalizer: {without:?}")],
            ),
            (
                "deleting, still listed on an NMC -> the finalizer stays",
                deleting(&with_ours, 1, false),
                vec![],
            ),
            (
                "deleting, finalizer off -> nothing",
                deleting(without, 0, false),
                vec![],
            ),
            (
                "deleting, finalizer off, still listed -> nothing",
                deleting(without, 2, false),
                vec![],
            ),
            (
                "live, finalizer off -> namespace labelled, finalizer added, status",
                live(without, &unwritten, &loading),
                vec![
                    "label namespace".into(),
                    format!("add finalizer: {with_ours:?}"),
                    "status: 1 of 3, Available=False Degraded=False, at once".into(),
                ],
            ),
            (
                "live, status as counted -> nothing",
                live(&with_ours, &loading_written, &loading),
                vec![],
            ),
            (
                "live, counts changed, conditions stay -> status, paced",
                live(&with_ours, &loading_written, &loading_more),
                vec!["status: 2 of 3, Available=False Degraded=False, paced".into()],
            ),
            (
                "live, every node loaded -> Available turns, at once",
                live(&with_ours, &loading_written, &loaded),
                vec!["status: 3 of 3, Available=True Degraded=False, at once".into()],
            ),
            (
                "live, a worker pod fails -> Degraded turns, at once",
                live(&with_ours, &loading_written, &failing),
                vec!["status: 1 of 3, Available=False Degraded=True, at once".into()],
            ),
        ];
        for (name, seen, want) in rows {
            assert_eq!(summary(decide_module(&seen)), want, "{name}");
        }
    }

    #[test]
    fn a_status_write_carries_the_counts_and_the_conditions_at_now() {
        let loading = Counts {
            status: counts(3, 1),
            failures: vec![],
        };
        let finalizers = [MODULE_FINALIZER.to_string()];
        let writes = decide_module(&ModuleSeen::Live {
            finalizers: &finalizers,
            status: &ModuleStatus::default(),
            counts: &loading,
            now: now(),
        });
        let [
            ModuleWrite::Status {
                module_loader,
                conditions,
                turns: true,
            },
        ] = &writes[..]
        else {
            panic!("one status write: {writes:?}");
        };
        assert_eq!(*module_loader, counts(3, 1));
        assert_eq!(conditions[0].message, "loaded on 1 of 3 nodes");
        assert!(conditions.iter().all(|c| c.last_transition_time == NOW));
    }

    #[test]
    fn conditions_table() {
        let cases = [
            ("all loaded", counts(3, 3), vec![], "True", "False"),
            ("loading", counts(3, 1), vec![], "False", "False"),
            (
                "failing",
                counts(3, 2),
                vec![("worker-3".to_string(), failure())],
                "False",
                "True",
            ),
        ];
        for (name, counts, failures, available, degraded) in cases {
            let got = conditions(&ModuleStatus::default(), &counts, &failures, "t1");
            assert_eq!(got[0].status, available, "{name}");
            assert_eq!(got[1].status, degraded, "{name}");
            assert_eq!(got[0].last_transition_time, "t1", "{name}");
        }
        let failing = conditions(
            &ModuleStatus::default(),
            &counts(3, 2),
            &[("worker-3".to_string(), failure())],
            "t1",
        );
        assert!(
            failing[1]
                .message
                .contains("worker-3: Load failed 2 time(s): pulling image x")
        );
        // A condition keeps its transition time while its status stays.
        let current = ModuleStatus {
            conditions: failing.clone(),
            ..ModuleStatus::default()
        };
        let later = conditions(&current, &counts(3, 1), &[], "t2");
        assert_eq!(later[0].last_transition_time, "t1");
        assert_eq!(later[1].last_transition_time, "t2");
    }

    #[test]
    fn a_degraded_message_names_the_first_failing_nodes_and_counts_the_rest() {
        let failures: Vec<(String, WorkerFailure)> = (1..=5)
            .map(|n| (format!("worker-{n}"), failure()))
            .collect();
        let got = conditions(&ModuleStatus::default(), &counts(5, 0), &failures, "t1");
        let message = &got[1].message;
        assert!(message.contains("worker-3: Load failed"), "{message}");
        assert!(!message.contains("worker-4"), "{message}");
        assert!(message.ends_with("; and 2 more nodes"), "{message}");
    }
}
