//! Drains around a node's kmod steps under an upgrade campaign (seed 002: "all user-mode
//! workloads using the kernel module should be terminated" before it is unloaded).
//!
//! The version-label controller starts and ends a drain; this module holds what both it
//! and the drain controller decide about one:
//!
//! - When a node's move to a campaign's version starts, the version-label controller
//!   cordons the node as `kubectl cordon` does (`spec.unschedulable` and the
//!   `node.kubernetes.io/unschedulable:NoSchedule` taint with `timeAdded`, unless the node
//!   was cordoned already), marks it upgrading (`capstan.dev/upgrade-state: Working`, the
//!   part of MCO's `machineconfiguration.openshift.io/state`) and keeps a [`DrainState`] in
//!   `capstan.dev/drain`, all in the write that starts the move ([`start_patch`]). The
//!   kmod steps wait until the state says the drain is done.
//! - The drain controller ([`reconciler`]) evicts, through the Eviction API as
//!   `kubectl drain` does (PodDisruptionBudgets honoured), every pod of the node the drain
//!   moves ([`crate::controllers::nodekeeper::evictable`]), and once none is left marks the
//!   state drained ([`decide`]).
//! - When the node's last move ends, the version-label controller uncordons it (unless it
//!   was cordoned before the drain) and removes both annotations ([`end_patch`]).
//!
//! Each of the three is a history record and an Event on the Node linked to the commit that
//! asked for the move ([`record`]); the records have deterministic names, so a restart
//! anywhere records none twice.
//!
//! [`decide`]'s table, for a node with a drain state:
//!
//! | state | pods the drain moves | decision |
//! | --- | --- | --- |
//! | drained | - | nothing |
//! | draining | none left | mark drained (record `drained`) |
//! | draining | some, all terminating | wait for them |
//! | draining | some not terminating | evict those |

use jiff::Timestamp;

use super::upgrade::Policies;
pub use super::upgrade::drain::{
    Cordon, DrainRecord, DrainState, DrainStep, end_patch, record, start_patch,
};
use super::upgrade::policy::asked_by;

pub mod reconciler;
pub mod refusals;

/// What a drain state found at start-up says in the log: a drain or an upgrade begun by an
/// earlier capstan (a restart, or another replica that led before this one) and not over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// The node is cordoned and its pods still being moved.
    Drain,
    /// The node is drained; its kmod steps and the uncordon are to come.
    Upgrade,
}

/// Whether `state` was begun before `started_at` (when this process's drain controller
/// started): the drain, or the upgrade it is for, resumes after a restart. `None` for a
/// drain this process began.
pub fn resumed(state: &DrainState, started_at: Timestamp) -> Option<Resumed> {
    if state.cordoned_at >= started_at {
        return None;
    }
    Some(if state.drained() {
        Resumed::Upgrade
    } else {
        Resumed::Drain
    })
}

/// The log line of a drain or upgrade resumed on `node` at `now`.
pub fn resumed_message(
    policies: &Policies,
    node: &str,
    state: &DrainState,
    resumed: Resumed,
    now: Timestamp,
) -> String {
    let ago = |at: Timestamp| {
        let seconds = now.duration_since(at).as_secs().max(0);
        format!("{:#}", jiff::SignedDuration::from_secs(seconds))
    };
    let what = match (resumed, state.drained_at) {
        (Resumed::Upgrade, Some(drained)) => format!(
            "the upgrade of {node} after a restart: drained {} ago, its kmod steps and the \
             uncordon to come",
            ago(drained)
        ),
        _ => format!(
            "the drain of {node} after a restart: cordoned {} ago, its pods still to move",
            ago(state.cordoned_at)
        ),
    };
    let to = state.to.as_deref().unwrap_or("none");
    let asked = asked_by(&policies.commit_of(node, &state.stamp()));
    format!(
        "resumed {what}, for its upgrade to {to} (campaign {}){asked}",
        state.campaign
    )
}

/// A pod on a draining node, as the drain sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The drain moves it (not a DaemonSet's, a mirror pod, nor capstan's own).
    pub evictable: bool,
    /// Being deleted.
    pub terminating: bool,
}

/// What the drain controller does for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No drain to run, or it is done.
    Nothing,
    /// Evict these pods (namespace, name).
    Evict(Vec<(String, String)>),
    /// Every pod left is terminating: look again soon.
    WaitForTermination,
    /// No pod the drain moves is left: mark the state drained.
    Drained,
}

/// The drain decision for a node with `state`, given its pods.
pub fn decide(state: Option<&DrainState>, pods: &[PodFacts]) -> Decision {
    match state {
        None => return Decision::Nothing,
        Some(state) if state.drained() => return Decision::Nothing,
        Some(_) => {}
    }
    let moved: Vec<&PodFacts> = pods.iter().filter(|pod| pod.evictable).collect();
    if moved.is_empty() {
        return Decision::Drained;
    }
    let evict: Vec<(String, String)> = moved
        .iter()
        .filter(|pod| !pod.terminating)
        .map(|pod| (pod.namespace.clone(), pod.name.clone()))
        .collect();
    if evict.is_empty() {
        Decision::WaitForTermination
    } else {
        Decision::Evict(evict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::RecordType;
    use capstan_api::labels::{DRAIN_ANNOTATION, UNSCHEDULABLE_TAINT, UPGRADE_STATE_ANNOTATION};
    use k8s_openapi::api::core::v1::Taint;
    use serde_json::{Value, json};

    fn state() -> DrainState {
        DrainState {
            to: Some("v2".into()),
            campaign: "fleet/my-kmod-v2".into(),
            revision: Some("main@sha1:0123456789abcdef".into()),
            pull_request: Some(7),
            cordoned_at: Timestamp::from_second(1_800_000_000).unwrap(),
            was_cordoned: false,
            drained_at: None,
        }
    }

    fn pod(name: &str, evictable: bool, terminating: bool) -> PodFacts {
        PodFacts {
            namespace: "apps".into(),
            name: name.into(),
            evictable,
            terminating,
        }
    }

    #[test]
    fn decision_table() {
        let drained = DrainState {
            drained_at: Some(Timestamp::from_second(1_800_000_100).unwrap()),
            ..state()
        };
        let cases: &[(Option<&DrainState>, Vec<PodFacts>, Decision)] = &[
            (None, vec![pod("a", true, false)], Decision::Nothing),
            (
                Some(&drained),
                vec![pod("a", true, false)],
                Decision::Nothing,
            ),
            (Some(&state()), vec![], Decision::Drained),
            (
                Some(&state()),
                vec![pod("ds", false, false)],
                Decision::Drained,
            ),
            (
                Some(&state()),
                vec![pod("a", true, true)],
                Decision::WaitForTermination,
            ),
            (
                Some(&state()),
                vec![
                    pod("a", true, true),
                    pod("b", true, false),
                    pod("ds", false, false),
                ],
                Decision::Evict(vec![("apps".into(), "b".into())]),
            ),
        ];
        for (state, pods, expected) in cases {
            assert_eq!(&decide(*state, pods), expected, "{state:?} {pods:?}");
        }
    }

    #[test]
    fn the_state_round_trips_through_its_annotation() {
        let text = state().to_annotation();
        assert_eq!(DrainState::from_annotation(&text), Some(state()));
        assert_eq!(DrainState::from_annotation("not json"), None);
    }

    #[test]
    fn a_cordon_is_added_and_lifted_keeping_other_taints() {
        let other = Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            value: Some("gpu".into()),
            time_added: None,
        };
        let cordon = Cordon {
            unschedulable: false,
            taints: vec![other.clone()],
        };
        let (annotations, spec) = start_patch(&cordon, &state());
        assert_eq!(annotations[UPGRADE_STATE_ANNOTATION], "Working");
        let spec = spec.unwrap();
        assert_eq!(spec["unschedulable"], true);
        assert_eq!(spec["taints"][0]["key"], "dedicated");
        assert_eq!(spec["taints"][1]["key"], UNSCHEDULABLE_TAINT);
        assert_eq!(spec["taints"][1]["timeAdded"], "2027-01-15T08:00:00Z");

        let cordoned = Cordon {
            unschedulable: true,
            taints: serde_json::from_value(spec["taints"].clone()).unwrap(),
        };
        let (annotations, spec) = end_patch(&cordoned, &state());
        assert_eq!(annotations[DRAIN_ANNOTATION], Value::Null);
        let spec = spec.unwrap();
        assert_eq!(spec["unschedulable"], Value::Null);
        assert_eq!(spec["taints"], json!([other]));

        // A node cordoned before the drain keeps its cordon.
        let before = DrainState {
            was_cordoned: true,
            ..state()
        };
        assert_eq!(start_patch(&cordoned, &before).1, None);
        assert_eq!(end_patch(&cordoned, &before).1, None);
    }

    #[test]
    fn a_drain_begun_before_the_start_is_said_resumed() {
        let cordoned = state().cordoned_at;
        let drained = DrainState {
            drained_at: Some(cordoned + jiff::SignedDuration::from_secs(30)),
            ..state()
        };
        let later = |seconds: i64| cordoned + jiff::SignedDuration::from_secs(seconds);
        // (state, controller started, resumed)
        let rows = [
            (state(), later(60), Some(Resumed::Drain)),
            (drained.clone(), later(60), Some(Resumed::Upgrade)),
            // Begun by this process: its own cordon is at or after its start.
            (state(), cordoned, None),
            (state(), later(-1), None),
            (drained, later(-1), None),
        ];
        for (state, started, expected) in rows {
            assert_eq!(resumed(&state, started), expected, "{state:?} {started}");
        }
        let policies = Policies::of(Vec::new());
        let drain = resumed_message(&policies, "worker-1", &state(), Resumed::Drain, later(150));
        assert_eq!(
            drain,
            "resumed the drain of worker-1 after a restart: cordoned 2m 30s ago, its pods \
             still to move, for its upgrade to v2 (campaign fleet/my-kmod-v2), asked by 0123456 \
             (#7)"
        );
        let upgrade = DrainState {
            drained_at: Some(later(30)),
            ..state()
        };
        let upgrade = resumed_message(&policies, "worker-1", &upgrade, Resumed::Upgrade, later(90));
        assert_eq!(
            upgrade,
            "resumed the upgrade of worker-1 after a restart: drained 1m ago, its kmod steps \
             and the uncordon to come, for its upgrade to v2 (campaign fleet/my-kmod-v2), \
             asked by 0123456 (#7)"
        );
    }

    #[test]
    fn records_name_the_step_the_campaign_and_the_commit() {
        let policies = Policies::of(Vec::new());
        let at = Timestamp::from_second(1_800_000_000).unwrap();
        let cordoned = record(&policies, "worker-1", &state(), DrainStep::Cordoned, at);
        assert_eq!(cordoned.spec.type_, RecordType::Drain);
        assert_eq!(cordoned.spec.step.as_deref(), Some("cordoned"));
        assert_eq!(cordoned.reason, "NodeCordoned");
        assert_eq!(
            cordoned.spec.message,
            "worker-1 cordoned and marked upgrading for its upgrade to v2 (campaign \
             fleet/my-kmod-v2), asked by 0123456 (#7)"
        );
        let before = DrainState {
            was_cordoned: true,
            ..state()
        };
        let uncordoned = record(&policies, "worker-1", &before, DrainStep::Uncordoned, at);
        assert!(
            uncordoned.spec.message.contains("left cordoned as it was"),
            "{}",
            uncordoned.spec.message
        );
    }
}
