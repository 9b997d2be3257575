//! A campaign's drain of a node, as its `capstan.dev/drain` annotation keeps it: started and
//! ended in the version-label controller's write ([`start_patch`], [`end_patch`]), moved by
//! the drain controller, and recorded step by step ([`record`]). See
//! [`crate::controllers::drain`] for the whole story.

use std::collections::BTreeMap;

use capstan_api::clock::rfc3339_micros;
use capstan_api::labels::{
    DRAIN_ANNOTATION, MACHINE_CONFIG_STATE_WORKING, TO_VERSION_ANNOTATION, UNSCHEDULABLE_TAINT,
    UPGRADE_STATE_ANNOTATION,
};
use capstan_api::{HistoryRecordSpec, RecordType};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::policy::{Policies, asked_by};
use super::progress::Stamp;
use crate::controllers::context::Context;
use crate::history::{self, EventTarget};
use capstan_api::managers;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

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

/// Writes the history record of a drain step and, when the record is new, its Event on
/// the Node.
pub async fn write_record(
    ctx: &Context,
    node: &Node,
    record: &DrainRecord,
) -> Result<(), kube::Error> {
    let client = &ctx.client;
    let created = history::write_record_making_namespace(
        client,
        record.spec.clone(),
        managers::VERSION_LABELS,
    )
    .await?;
    if created
        && let Err(err) = history::record_event(
            &ctx.recorder,
            &EventTarget::node(node),
            false,
            record.reason,
            &record.spec.message,
            &record.spec.commit,
            record.annotations.clone(),
        )
        .await
    {
        tracing::warn!(%err, node = %node.name_any(), "could not record a drain event");
    }
    Ok(())
}
