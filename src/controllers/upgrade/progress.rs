//! A Module's ordered upgrade on one node, as the version-label controller keeps it in the
//! Node annotation [`capstan_api::labels::ModuleKey::upgrade_annotation`], and the stamps of
//! the commit that asked for it.

use std::collections::BTreeMap;

use capstan_api::UpgradeStep;
use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::guard::{CheckRun, GateFailure};

/// Why a node may not start its upgrade: the value of [`Progress::waiting`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyWait {
    /// `maxNodesInFlight` nodes are upgrading, or nodes ahead in name order take the free
    /// slots.
    Slot,
    /// `requirePullRequest`, and the commit that changed the label merged no pull request.
    PullRequest,
    /// An `UpgradeConfig` campaign rolls out the version and has not started (or failed).
    Campaign,
    /// The rollout is paused (`rollout.paused`).
    Paused,
    /// A gate failed on a node of the same `GitSync`: the rollout halted.
    Halted,
    /// Outside every maintenance window.
    Window,
    /// The canary nodes go first.
    Canary,
    /// A gate failed on this node: it stays until the repository moves it again.
    Failed,
}

/// An ordered upgrade of one Module on one node, as the reconciler keeps it in the Node
/// annotation [`ModuleKey::upgrade_annotation`] (JSON) while the upgrade waits or runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// The version the node leaves (W when the move was first seen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The version the node moves to (M).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `capstan.dev/revision` of the commit that asked for the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `capstan.dev/pull-request` of that commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<u64>,
    /// When the upgrade started; unset while it waits for the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The last step recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<UpgradeStep>,
    /// When the last step was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_at: Option<Timestamp>,
    /// The policy wait already announced (by an Event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<PolicyWait>,
    /// The upgrade started under a campaign: its node is drained before the first step and
    /// uncordoned after the last.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
    /// When the node gave up its slot, having stayed NotReady past `notReadyTimeout` during
    /// the upgrade: it takes a slot again, in line, before its next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Timestamp>,
    /// The gate attempt under way (`rollout.gates`, the preflight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckRun>,
    /// When the last step was reached, while the checks after it run (the node keeps its
    /// slot, and its drain, until they pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Timestamp>,
    /// A canary node that passed its checks stays under watch, back in service, until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_until: Option<Timestamp>,
    /// The gate that failed on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<GateFailure>,
}

impl Progress {
    /// True once the upgrade started, until it ends.
    pub fn upgrading(&self) -> bool {
        self.started_at.is_some()
    }

    /// True while the upgrade holds a slot: from its start to its end, unless the node gave
    /// it up or is back in service for a canary's soak.
    pub fn holds_slot(&self) -> bool {
        self.upgrading() && self.released_at.is_none() && self.soak_until.is_none()
    }

    /// True while the node must stay drained: its upgrade under a campaign runs, or a gate
    /// failed and the policy keeps the node cordoned (`keep_cordoned`).
    pub fn keeps_drain(&self, keep_cordoned: bool) -> bool {
        self.drain
            && self.upgrading()
            && self.soak_until.is_none()
            && (self.failed.is_none() || keep_cordoned)
    }

    /// The annotation value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value; `None` when it is not a progress (it is then ignored and
    /// replaced).
    pub fn from_annotation(text: &str) -> Option<Progress> {
        serde_json::from_str(text).ok()
    }
}

/// The stamps capstan's sync put on the Node: the commit that last changed its labels from
/// Git.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// `capstan.dev/revision`.
    pub revision: Option<String>,
    /// `capstan.dev/pull-request`.
    pub pull_request: Option<u64>,
}

/// The stamps capstan's sync put on a node.
pub fn stamp_of(annotations: &BTreeMap<String, String>) -> Stamp {
    Stamp {
        revision: annotations
            .get(REVISION_ANNOTATION)
            .filter(|r| !r.is_empty())
            .cloned(),
        pull_request: annotations
            .get(PULL_REQUEST_ANNOTATION)
            .and_then(|pr| pr.parse().ok()),
    }
}
