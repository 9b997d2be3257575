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

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::version_labels::records::asked_by;
use super::version_labels::{Policies, Stamp};
use capstan_api::clock::rfc3339_micros;
use capstan_api::labels::{
    DRAIN_ANNOTATION, MACHINE_CONFIG_STATE_WORKING, TO_VERSION_ANNOTATION, UNSCHEDULABLE_TAINT,
    UPGRADE_STATE_ANNOTATION,
};
use capstan_api::{HistoryRecordSpec, RecordType};

pub mod reconciler;
pub mod refusals;

/// A drain capstan runs on a node, as kept in its `capstan.dev/drain` annotation (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainState {
    /// The version the node moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `<namespace>/<name>` of the campaign.
    pub campaign: String,
    /// `capstan.dev/revision` of the commit that asked for the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `capstan.dev/pull-request` of that commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<u64>,
    /// When capstan cordoned the node.
    pub cordoned_at: Timestamp,
    /// The node was cordoned before the drain: it stays cordoned after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub was_cordoned: bool,
    /// When the last pod the drain moves was gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_at: Option<Timestamp>,
}

impl DrainState {
    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value; `None` when it is not a drain state.
    pub fn from_annotation(text: &str) -> Option<DrainState> {
        serde_json::from_str(text).ok()
    }

    /// The drain state a node's annotations hold.
    pub fn of(annotations: &BTreeMap<String, String>) -> Option<DrainState> {
        annotations
            .get(DRAIN_ANNOTATION)
            .and_then(|text| DrainState::from_annotation(text))
    }

    /// Every pod the drain moves is gone.
    pub fn drained(&self) -> bool {
        self.drained_at.is_some()
    }

    /// The commit's stamps.
    pub fn stamp(&self) -> Stamp {
        Stamp {
            revision: self.revision.clone(),
            pull_request: self.pull_request,
        }
    }
}

/// A node's cordon, as read off its spec.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cordon {
    /// `spec.unschedulable`.
    pub unschedulable: bool,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
}

/// The node's patch (merged into the version-label controller's) that starts `state`:
/// the cordon unless the node has one, the mark and the state.
pub fn start_patch(cordon: &Cordon, state: &DrainState) -> (Map<String, Value>, Option<Value>) {
    let annotations = Map::from_iter([
        (DRAIN_ANNOTATION.to_string(), json!(state.to_annotation())),
        (
            UPGRADE_STATE_ANNOTATION.to_string(),
            json!(MACHINE_CONFIG_STATE_WORKING),
        ),
    ]);
    if state.was_cordoned {
        return (annotations, None);
    }
    let mut taints: Vec<Taint> = cordon
        .taints
        .iter()
        .filter(|t| !is_cordon_taint(t))
        .cloned()
        .collect();
    taints.push(Taint {
        key: UNSCHEDULABLE_TAINT.to_string(),
        effect: "NoSchedule".to_string(),
        time_added: Some(Time(state.cordoned_at)),
        value: None,
    });
    let spec = json!({"unschedulable": true, "taints": taints});
    (annotations, Some(spec))
}

/// The node's patch that ends `state`: the cordon lifted unless the node had one before,
/// the mark and the state removed.
pub fn end_patch(cordon: &Cordon, state: &DrainState) -> (Map<String, Value>, Option<Value>) {
    let annotations = Map::from_iter([
        (DRAIN_ANNOTATION.to_string(), Value::Null),
        (UPGRADE_STATE_ANNOTATION.to_string(), Value::Null),
    ]);
    if state.was_cordoned {
        return (annotations, None);
    }
    let taints: Vec<&Taint> = cordon
        .taints
        .iter()
        .filter(|t| !is_cordon_taint(t))
        .collect();
    let taints = if taints.is_empty() {
        Value::Null
    } else {
        json!(taints)
    };
    (
        annotations,
        Some(json!({"unschedulable": null, "taints": taints})),
    )
}

fn is_cordon_taint(taint: &Taint) -> bool {
    taint.key == UNSCHEDULABLE_TAINT && taint.effect == "NoSchedule"
}

/// A step of a drain, as recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// The node was cordoned and marked upgrading.
    Cordoned,
    /// No pod the drain moves is left.
    Drained,
    /// The node was uncordoned and unmarked.
    Uncordoned,
}

impl DrainStep {
    /// Every step, in the order a drain takes them.
    pub const ALL: [DrainStep; 3] = [
        DrainStep::Cordoned,
        DrainStep::Drained,
        DrainStep::Uncordoned,
    ];

    /// The step a record's `step` names.
    pub fn parse(step: &str) -> Option<DrainStep> {
        DrainStep::ALL.into_iter().find(|s| s.as_str() == step)
    }

    /// The record's `step`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainStep::Cordoned => "cordoned",
            DrainStep::Drained => "drained",
            DrainStep::Uncordoned => "uncordoned",
        }
    }

    /// The Event's reason.
    pub fn reason(self) -> &'static str {
        match self {
            DrainStep::Cordoned => "NodeCordoned",
            DrainStep::Drained => "NodeDrained",
            DrainStep::Uncordoned => "NodeUncordoned",
        }
    }
}

/// A drain step to record: a history record, then, when it is new, an Event on the Node.
#[derive(Clone, Debug, PartialEq)]
pub struct DrainRecord {
    /// The record; its message and commit are the Event's too.
    pub spec: HistoryRecordSpec,
    /// The Event's reason.
    pub reason: &'static str,
    /// The Event's annotations besides the commit's.
    pub annotations: BTreeMap<String, String>,
}

/// The record of `step` of `state` on `node` at `now`.
pub fn record(
    policies: &Policies,
    node: &str,
    state: &DrainState,
    step: DrainStep,
    now: Timestamp,
) -> DrainRecord {
    let commit = policies.commit_of(node, &state.stamp());
    let to = state.to.as_deref().unwrap_or("none");
    let what = match step {
        DrainStep::Cordoned if state.was_cordoned => "marked upgrading (cordoned already)",
        DrainStep::Cordoned => "cordoned and marked upgrading",
        DrainStep::Drained => "drained",
        DrainStep::Uncordoned if state.was_cordoned => "unmarked (left cordoned as it was)",
        DrainStep::Uncordoned => "uncordoned and unmarked",
    };
    let asked = asked_by(&commit);
    let message = format!(
        "{node} {what} for its upgrade to {to} (campaign {}){asked}",
        state.campaign
    );
    let annotations = state
        .to
        .iter()
        .map(|to| (TO_VERSION_ANNOTATION.to_string(), to.clone()))
        .collect();
    DrainRecord {
        spec: HistoryRecordSpec {
            time: rfc3339_micros(now),
            type_: RecordType::Drain,
            sync: policies.sync_name(node),
            commit,
            message,
            node: Some(node.to_string()),
            step: Some(step.as_str().to_string()),
            to_version: state.to.clone(),
            ..HistoryRecordSpec::default()
        },
        reason: step.reason(),
        annotations,
    }
}

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
