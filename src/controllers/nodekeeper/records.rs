//! The history record of a strategy that acted: written before the strategy acts, named by
//! what it records, so a restart between the record and the action finds its record and
//! acts, and a pass that acts on nothing new records nothing.
//!
//! The message names the strategy, the node, the drain's start (the cordon taint's
//! `timeAdded`: a new cordon is a new drain) and the pods with what was done to each, in
//! order; [`crate::history::record_name`] hashes it with the sync, the node and the
//! strategy.

use jiff::Timestamp;

use super::strategies::StrategyRun;
use crate::controllers::upgrade::{Policies, Stamp};
use capstan_api::clock::rfc3339_micros;
use capstan_api::{HistoryRecordSpec, RecordType};

/// A strategy's record, and the reason of its Event on the Node.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyRecord {
    /// The record; its message and commit are the Event's too.
    pub spec: HistoryRecordSpec,
    /// The Event's reason.
    pub reason: &'static str,
}

/// The record of `run` on `node`, in the drain begun at `start`, at `now`, linked to the
/// commit `stamp` names (the node's `capstan.dev/revision` and `capstan.dev/pull-request`).
pub fn record(
    policies: &Policies,
    node: &str,
    stamp: &Stamp,
    start: Timestamp,
    run: &StrategyRun,
    now: Timestamp,
) -> StrategyRecord {
    StrategyRecord {
        spec: HistoryRecordSpec {
            time: rfc3339_micros(now),
            type_: RecordType::DrainStrategy,
            sync: policies.sync_name(node),
            commit: policies.commit_of(node, stamp),
            message: message(node, start, run),
            node: Some(node.to_string()),
            step: Some(run.strategy.name().to_string()),
            ..HistoryRecordSpec::default()
        },
        reason: run.strategy.reason(),
    }
}

/// `DELETE (Default pod deletion) on worker-1, draining since 2026-11-26T09:00:00Z: apps/web
/// deleted, apps/cache deleted`.
pub fn message(node: &str, start: Timestamp, run: &StrategyRun) -> String {
    let done = run.strategy.action().done();
    let pods: Vec<String> = run.pods.iter().map(|pod| format!("{pod} {done}")).collect();
    format!(
        "{} ({}) on {node}, draining since {start}: {}",
        run.strategy.name(),
        run.strategy.description(),
        pods.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::nodekeeper::pods::PodRef;
    use crate::controllers::nodekeeper::strategies::Strategy;
    use crate::history::record_name;

    fn run(strategy: Strategy, pods: &[&str]) -> StrategyRun {
        StrategyRun {
            strategy,
            pods: pods
                .iter()
                .map(|name| PodRef {
                    namespace: "apps".into(),
                    name: name.to_string(),
                    uid: format!("uid-{name}"),
                })
                .collect(),
        }
    }

    #[test]
    fn a_record_names_the_strategy_the_drain_and_the_pods() {
        let policies = Policies::of(Vec::new());
        let stamp = Stamp {
            revision: Some("main@sha1:3cf3bea000000000000000000000000000000000".into()),
            pull_request: Some(12),
        };
        let start: Timestamp = "2026-11-26T09:00:00Z".parse().unwrap();
        let now: Timestamp = "2026-11-26T09:46:00Z".parse().unwrap();
        let strip = run(Strategy::DefaultFinalizer, &["cache", "web"]);
        let record = record(&policies, "worker-1", &stamp, start, &strip, now);
        assert_eq!(record.reason, "DrainFinalizersRemoved");
        assert_eq!(record.spec.type_, RecordType::DrainStrategy);
        assert_eq!(record.spec.step.as_deref(), Some("DEFAULT-FINALIZER"));
        assert_eq!(record.spec.node.as_deref(), Some("worker-1"));
        assert_eq!(record.spec.commit.short_sha, "3cf3bea");
        assert_eq!(record.spec.commit.pull_request, Some(12));
        assert_eq!(
            record.spec.message,
            "DEFAULT-FINALIZER (Default pod finalizer removal) on worker-1, draining since \
             2026-11-26T09:00:00Z: apps/cache finalizers stripped, apps/web finalizers stripped"
        );

        // The same action later (after a restart) is the same record; another pod, another
        // drain or another strategy is another.
        let later = "2026-11-26T09:47:00Z".parse().unwrap();
        let again = super::record(&policies, "worker-1", &stamp, start, &strip, later);
        assert_eq!(record_name(&again.spec), record_name(&record.spec));
        let others = [
            super::record(
                &policies,
                "worker-1",
                &stamp,
                start,
                &run(Strategy::DefaultFinalizer, &["cache"]),
                now,
            ),
            super::record(&policies, "worker-1", &stamp, now, &strip, now),
            super::record(
                &policies,
                "worker-1",
                &stamp,
                start,
                &run(Strategy::PdbFinalizer, &["cache", "web"]),
                now,
            ),
            super::record(&policies, "worker-2", &stamp, start, &strip, now),
        ];
        for other in others {
            assert_ne!(
                record_name(&other.spec),
                record_name(&record.spec),
                "{}",
                other.spec.message
            );
        }
    }
}
