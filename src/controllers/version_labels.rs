//! The ordered-upgrade version-label controller (seed 002): per node and versioned Module, it
//! turns the administrator's `version-module` label (M, from Git) into KMM's internal
//! `version-worker-pod` (W) and `version-device-plugin` (D) labels, one write at a time, so
//! that the old version's device plugin stops before the old module is unloaded, and the new
//! module is loaded before the new device plugin starts.
//!
//! [`label_action`] is KMM's table, one match arm per row:
//!
//! | row | M | W | D | write |
//! | --- | --- | --- | --- | --- |
//! | 1 | missing | missing | missing | none |
//! | 2 | missing | present | present | remove D |
//! | 3 | missing | present | missing | remove W (guarded) |
//! | 4 | present | missing | missing | set W = M (guarded) |
//! | 5 | present | == M | missing | set D = M |
//! | 6 | present | == M | == M | none |
//! | 7 | present | != M | != M | remove D |
//! | 8 | present | != M | missing | remove W (guarded) |
//!
//! Any other combination is left alone, as upstream leaves it. The two guards: W is removed
//! only when no device-plugin pod of the module remains on the node, in any phase
//! ([`Guard::DevicePluginPodRemains`]); W is set only once the node has lost the module's
//! `.ready` label, i.e. the old version is unloaded ([`Guard::ModuleStillLoaded`]).
//!
//! [`decide`] adds what capstan adds around the table:
//!
//! - **Steps.** A move of M from one version to another is an upgrade, whose steps
//!   ([`UpgradeStep::for_move`]) are recorded in order as they are reached: the device
//!   plugin stopped (D gone, no device-plugin pod left), the old module unloaded (W gone,
//!   `.ready` gone), the new module loaded (W = M, `.ready` back), the device plugin started
//!   (D = M, a device-plugin pod running, or the Module has none).
//! - **Policy.** An upgrade starts only when the [`Gate`] allows it: a free slot under
//!   `maxNodesInFlight` (nodes queue in name order, see [`slot`]), and with
//!   `requirePullRequest`, a commit that merged a pull request; and never while the sync
//!   is still writing a commit, so a commit's moves start in name order (as `capstan plan`
//!   shows them) rather than in the order its labels were written. A node that may not
//!   start keeps its labels as they are.
//! - **Memory.** What cannot be read back from the labels (the version the node leaves once
//!   W is gone, the commit that asked, the last step and when it was reached, the wait
//!   already announced) is a [`Progress`] the reconciler keeps in the Node annotation
//!   [`ModuleKey::upgrade_annotation`], written in the same request as the label it goes
//!   with. A step is recorded (a history record with a deterministic name) before that
//!   request, so after a crash anywhere the step is seen again, its record is found to
//!   exist, and nothing is recorded twice or skipped.

pub mod reconciler;

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use capstan_api::labels::ModuleKey;
use capstan_api::{UpgradePolicy, UpgradeStep};

/// The three version labels of one Module on one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VersionLabels {
    /// M: `kmm.node.kubernetes.io/version-module.<ns>.<name>`, from Git.
    pub module: Option<String>,
    /// W: `beta.kmm.node.kubernetes.io/version-worker-pod.<ns>.<name>`.
    pub worker_pod: Option<String>,
    /// D: `beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name>`.
    pub device_plugin: Option<String>,
}

impl VersionLabels {
    /// The labels of `key` among a node's `labels`.
    pub fn of(key: &ModuleKey, labels: &BTreeMap<String, String>) -> VersionLabels {
        VersionLabels {
            module: labels.get(&key.version_module_label()).cloned(),
            worker_pod: labels.get(&key.version_worker_pod_label()).cloned(),
            device_plugin: labels.get(&key.version_device_plugin_label()).cloned(),
        }
    }

    /// True when none of the three is set.
    pub fn is_empty(&self) -> bool {
        self.module.is_none() && self.worker_pod.is_none() && self.device_plugin.is_none()
    }
}

/// A write of one internal label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelWrite {
    /// Set W to the version.
    SetWorkerPod(String),
    /// Remove W: the Module leaves the node's NMC, its module is unloaded.
    RemoveWorkerPod,
    /// Set D to the version: that version's device plugin may run on the node.
    SetDevicePlugin(String),
    /// Remove D: the device plugin leaves the node.
    RemoveDevicePlugin,
}

/// What holds a W write back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// W is to be removed, but a device-plugin pod of the module is still on the node.
    DevicePluginPodRemains,
    /// W is to be set, but the node still has the module's `.ready` label.
    ModuleStillLoaded,
}

/// The table's answer for one Module on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableAction {
    /// Write a label.
    Write(LabelWrite),
    /// A guarded write that must wait.
    Wait(Guard),
    /// Rows 1 and 6: nothing to do.
    Nothing,
    /// A combination of labels the table does not list: nothing is done.
    OutsideTable,
}

/// The table row `labels` are in (1 to 8), `None` outside the table.
pub fn table_row(labels: &VersionLabels) -> Option<u8> {
    let m = labels.module.as_deref();
    let w = labels.worker_pod.as_deref();
    let d = labels.device_plugin.as_deref();
    match (m, w, d) {
        (None, None, None) => Some(1),
        (None, Some(_), Some(_)) => Some(2),
        (None, Some(_), None) => Some(3),
        (Some(_), None, None) => Some(4),
        (Some(m), Some(w), None) if w == m => Some(5),
        (Some(m), Some(w), Some(d)) if w == m && d == m => Some(6),
        (Some(m), Some(w), Some(d)) if w != m && d != m => Some(7),
        (Some(m), Some(w), None) if w != m => Some(8),
        _ => None,
    }
}

/// KMM's version-label table with its two guards: the write `labels` call for, given
/// whether the node still has the module's `.ready` label (`module_loaded`) and whether a
/// device-plugin pod of the module remains on the node, in any phase
/// (`device_plugin_pod_remains`).
pub fn label_action(
    labels: &VersionLabels,
    module_loaded: bool,
    device_plugin_pod_remains: bool,
) -> TableAction {
    let remove_worker_pod = || {
        if device_plugin_pod_remains {
            TableAction::Wait(Guard::DevicePluginPodRemains)
        } else {
            TableAction::Write(LabelWrite::RemoveWorkerPod)
        }
    };
    let target = labels.module.clone().unwrap_or_default();
    match table_row(labels) {
        Some(1 | 6) => TableAction::Nothing,
        Some(2 | 7) => TableAction::Write(LabelWrite::RemoveDevicePlugin),
        Some(3 | 8) => remove_worker_pod(),
        Some(4) if module_loaded => TableAction::Wait(Guard::ModuleStillLoaded),
        Some(4) => TableAction::Write(LabelWrite::SetWorkerPod(target)),
        Some(5) => TableAction::Write(LabelWrite::SetDevicePlugin(target)),
        _ => TableAction::OutsideTable,
    }
}

/// A move of M that calls for an upgrade: the version the node has (W) and the one it is
/// to get (M). `None` when the labels are settled, outside the table, or move no version
/// (W already equals M).
pub fn pending_move(labels: &VersionLabels) -> Option<(Option<String>, Option<String>)> {
    match table_row(labels) {
        None | Some(1 | 6) => None,
        Some(_) if labels.worker_pod == labels.module => None,
        Some(_) => Some((labels.worker_pod.clone(), labels.module.clone())),
    }
}

/// Why a node may not start its upgrade: the value of [`Progress::waiting`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyWait {
    /// `maxNodesInFlight` nodes are upgrading, or nodes ahead in name order take the free
    /// slots.
    Slot,
    /// `requirePullRequest`, and the commit that changed the label merged no pull request.
    PullRequest,
}

/// Why a decision waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A table guard: the reconciler checks again soon.
    Guard(Guard),
    /// The policy: the node does not move until the gate opens.
    Policy(PolicyWait),
    /// The sync is writing a commit: the move starts once it is done.
    SyncApplying,
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
}

impl Progress {
    /// True once the upgrade started: the node holds a slot until it ends.
    pub fn upgrading(&self) -> bool {
        self.started_at.is_some()
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

/// What the controller knows about one Module on one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeModuleFacts {
    /// M, W and D.
    pub labels: VersionLabels,
    /// The node has the module's `.ready` label.
    pub module_loaded: bool,
    /// The node's `.version.ready` label for the module.
    pub loaded_version: Option<String>,
    /// A device-plugin pod of the module is on the node, in any phase, not yet gone.
    pub device_plugin_pod_remains: bool,
    /// A device-plugin pod of the module runs on the node (phase `Running`, not being
    /// deleted).
    pub device_plugin_running: bool,
    /// The Module has a device plugin; without one, the device-plugin steps are reached as
    /// soon as D is written.
    pub has_device_plugin: bool,
    /// The upgrade kept in the node's annotation.
    pub progress: Option<Progress>,
    /// The node's stamps.
    pub stamp: Stamp,
}

/// Whether a slot under `maxNodesInFlight` is free for the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The node may start (or is upgrading already).
    Free,
    /// Every slot is taken.
    Taken {
        /// Nodes upgrading now.
        upgrading: usize,
        /// Nodes waiting ahead of this one, in name order.
        ahead: usize,
        /// `maxNodesInFlight`.
        limit: u32,
    },
}

/// The policy gate: may this node start an upgrade now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The slot.
    pub slot: Slot,
    /// `requirePullRequest`.
    pub require_pull_request: bool,
    /// The sync that applies the node is writing a commit (its `GitSync` is `Applying`).
    /// A move waits until every label of the commit is in, so that the nodes of one commit
    /// start in name order whatever order the sync's writes came in.
    pub sync_applying: bool,
}

/// Where a node stands, for the slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Nothing to move.
    Settled,
    /// An upgrade started and has not ended: it holds a slot.
    Upgrading,
    /// A move waits for a slot.
    Queued,
    /// A move may not start whatever the slots (no pull request): it takes no place in line.
    Held,
}

/// Where a node stands, from the facts of each Module on it (device-plugin facts unused).
pub fn standing<'a>(
    modules: impl IntoIterator<Item = &'a NodeModuleFacts>,
    require_pull_request: bool,
) -> Standing {
    let mut standing = Standing::Settled;
    for facts in modules {
        if facts.progress.as_ref().is_some_and(Progress::upgrading) {
            return Standing::Upgrading;
        }
        let Some((from, to)) = pending_move(&facts.labels) else {
            continue;
        };
        let (_, pull_request) = move_commit(facts, &from, &to);
        if require_pull_request && pull_request.is_none() {
            if standing == Standing::Settled {
                standing = Standing::Held;
            }
        } else {
            standing = Standing::Queued;
        }
    }
    standing
}

/// The slot of `node` given every node's standing (`fleet`, this node's included or not):
/// free when it is upgrading already, or when the nodes upgrading plus the nodes queued
/// ahead of it in name order are fewer than `maxNodesInFlight`.
pub fn slot(
    node: &str,
    own: Standing,
    fleet: &[(String, Standing)],
    policy: &UpgradePolicy,
) -> Slot {
    if own == Standing::Upgrading {
        return Slot::Free;
    }
    let others = fleet.iter().filter(|(name, _)| name != node);
    let upgrading = others
        .clone()
        .filter(|(_, standing)| *standing == Standing::Upgrading)
        .count();
    let ahead = others
        .filter(|(name, standing)| *standing == Standing::Queued && name.as_str() < node)
        .count();
    let limit = policy.max_nodes_in_flight.max(1);
    if upgrading + ahead < limit as usize {
        Slot::Free
    } else {
        Slot::Taken {
            upgrading,
            ahead,
            limit,
        }
    }
}

/// A step just reached, to record before the decision's write.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReached {
    /// The step.
    pub step: UpgradeStep,
    /// The version the node leaves.
    pub from: Option<String>,
    /// The version it moves to.
    pub to: Option<String>,
    /// The commit that asked (its stamps).
    pub stamp: Stamp,
    /// Seconds since the step before, or since the upgrade started.
    pub duration_seconds: f64,
    /// The last step of the move: the upgrade is over.
    pub last: bool,
}

/// What to do for one Module on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Write a label.
    Write(LabelWrite),
    /// Wait, and why.
    Wait(Wait),
    /// Nothing to write.
    Nothing,
}

/// A decision for one Module on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The label write, or the wait.
    pub outcome: Outcome,
    /// The step just reached, if any.
    pub step: Option<StepReached>,
    /// The progress the node keeps afterwards; `None` when no upgrade waits or runs.
    pub progress: Option<Progress>,
    /// The policy wait is new: say so, once.
    pub announce: bool,
}

/// The decision for one Module on one node at `now`.
pub fn decide(facts: &NodeModuleFacts, gate: &Gate, now: Timestamp) -> Decision {
    let table = label_action(
        &facts.labels,
        facts.module_loaded,
        facts.device_plugin_pod_remains,
    );
    match facts.progress.as_ref().filter(|p| p.upgrading()) {
        Some(progress) => continue_upgrade(progress.clone(), facts, gate, table, now),
        None => begin_upgrade(facts, gate, table, now),
    }
}

/// The table's action as an outcome.
fn outcome_of(table: TableAction) -> Outcome {
    match table {
        TableAction::Write(write) => Outcome::Write(write),
        TableAction::Wait(guard) => Outcome::Wait(Wait::Guard(guard)),
        TableAction::Nothing | TableAction::OutsideTable => Outcome::Nothing,
    }
}

/// The commit of a move not started yet: the one seen when the move was first seen (a
/// later commit may change other labels of the node while it waits), unless that one
/// merged no pull request and a later one did, which approves the move.
fn move_commit(
    facts: &NodeModuleFacts,
    from: &Option<String>,
    to: &Option<String>,
) -> (Option<String>, Option<u64>) {
    match &facts.progress {
        Some(p)
            if !p.upgrading()
                && &p.from == from
                && &p.to == to
                && (p.pull_request.is_some() || facts.stamp.pull_request.is_none()) =>
        {
            (p.revision.clone(), p.pull_request)
        }
        _ => (facts.stamp.revision.clone(), facts.stamp.pull_request),
    }
}

/// No upgrade running: start one when the labels call for a move and the gate is open,
/// else wait for the policy (announcing a new wait once).
fn begin_upgrade(
    facts: &NodeModuleFacts,
    gate: &Gate,
    table: TableAction,
    now: Timestamp,
) -> Decision {
    let Some((from, to)) = pending_move(&facts.labels) else {
        // Settled, or a write that moves no version (D put back): no upgrade to track.
        return Decision {
            outcome: outcome_of(table),
            step: None,
            progress: None,
            announce: false,
        };
    };
    if gate.sync_applying {
        // Nothing is written: the node is looked at again when the sync is done.
        return Decision {
            outcome: Outcome::Wait(Wait::SyncApplying),
            step: None,
            progress: facts.progress.clone(),
            announce: false,
        };
    }
    let (revision, pull_request) = move_commit(facts, &from, &to);
    let wait = if gate.require_pull_request && pull_request.is_none() {
        Some(PolicyWait::PullRequest)
    } else if gate.slot != Slot::Free {
        Some(PolicyWait::Slot)
    } else {
        None
    };
    let progress = Progress {
        from,
        to,
        revision,
        pull_request,
        ..Progress::default()
    };
    if let Some(wait) = wait {
        let announced = facts
            .progress
            .as_ref()
            .filter(|p| p.from == progress.from && p.to == progress.to)
            .and_then(|p| p.waiting);
        return Decision {
            outcome: Outcome::Wait(Wait::Policy(wait)),
            step: None,
            progress: Some(Progress {
                waiting: Some(wait),
                ..progress
            }),
            announce: announced != Some(wait),
        };
    }
    advance(
        Progress {
            started_at: Some(now),
            ..progress
        },
        facts,
        table,
        now,
    )
}

/// An upgrade is running: follow M if it moved again (when the policy allows), then record
/// the next step if it has been reached.
fn continue_upgrade(
    mut progress: Progress,
    facts: &NodeModuleFacts,
    gate: &Gate,
    table: TableAction,
    now: Timestamp,
) -> Decision {
    if progress.to != facts.labels.module {
        if gate.require_pull_request && facts.stamp.pull_request.is_none() {
            // The new label is not approved: the node holds where it is, keeping its slot.
            let announce = progress.waiting != Some(PolicyWait::PullRequest);
            progress.waiting = Some(PolicyWait::PullRequest);
            return Decision {
                outcome: Outcome::Wait(Wait::Policy(PolicyWait::PullRequest)),
                step: None,
                progress: Some(progress),
                announce,
            };
        }
        // With W still set the node leaves W's version; once W is gone, the version it
        // left before. A new starting version is a new upgrade.
        let from = facts
            .labels
            .worker_pod
            .clone()
            .or_else(|| progress.from.clone());
        if from != progress.from {
            progress.started_at = Some(now);
            progress.step = None;
            progress.step_at = None;
        }
        progress.from = from;
        progress.to = facts.labels.module.clone();
        progress.revision = facts.stamp.revision.clone();
        progress.pull_request = facts.stamp.pull_request;
    }
    progress.waiting = None;
    advance(progress, facts, table, now)
}

/// Records the next step of `progress` if the facts show it reached; the upgrade ends with
/// its last step (or at once, for a move without steps).
fn advance(
    mut progress: Progress,
    facts: &NodeModuleFacts,
    table: TableAction,
    now: Timestamp,
) -> Decision {
    let steps = UpgradeStep::for_move(progress.from.as_deref(), progress.to.as_deref());
    let next = steps
        .iter()
        .copied()
        .find(|step| progress.step.is_none_or(|done| *step > done));
    let mut reached = None;
    let keep = match next {
        None => None,
        Some(next) if step_reached(next, facts, &progress) => {
            let since = progress.step_at.or(progress.started_at).unwrap_or(now);
            let last = steps.last() == Some(&next);
            reached = Some(StepReached {
                step: next,
                from: progress.from.clone(),
                to: progress.to.clone(),
                stamp: Stamp {
                    revision: progress.revision.clone(),
                    pull_request: progress.pull_request,
                },
                duration_seconds: now.duration_since(since).as_secs_f64().max(0.0),
                last,
            });
            progress.step = Some(next);
            progress.step_at = Some(now);
            (!last).then_some(progress)
        }
        Some(_) => Some(progress),
    };
    Decision {
        outcome: outcome_of(table),
        step: reached,
        progress: keep,
        announce: false,
    }
}

/// Whether the facts show `step` of `progress` reached.
fn step_reached(step: UpgradeStep, facts: &NodeModuleFacts, progress: &Progress) -> bool {
    let labels = &facts.labels;
    match step {
        UpgradeStep::DevicePluginStopped => {
            labels.device_plugin.is_none() && !facts.device_plugin_pod_remains
        }
        UpgradeStep::OldModuleUnloaded => labels.worker_pod.is_none() && !facts.module_loaded,
        UpgradeStep::NewModuleLoaded => {
            labels.worker_pod.is_some()
                && labels.worker_pod == progress.to
                && facts.module_loaded
                && facts
                    .loaded_version
                    .as_ref()
                    .is_none_or(|version| Some(version) == progress.to.as_ref())
        }
        UpgradeStep::DevicePluginStarted => {
            labels.device_plugin.is_some()
                && labels.device_plugin == progress.to
                && (facts.device_plugin_running || !facts.has_device_plugin)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use UpgradeStep::*;

    fn v(version: &str) -> Option<String> {
        Some(version.to_string())
    }

    /// M, W and D as table rows write them ("" for missing).
    fn labels(m: &str, w: &str, d: &str) -> VersionLabels {
        let given = |s: &str| (!s.is_empty()).then(|| s.to_string());
        VersionLabels {
            module: given(m),
            worker_pod: given(w),
            device_plugin: given(d),
        }
    }

    #[test]
    fn version_label_table_with_both_guards() {
        use LabelWrite::*;
        use TableAction::*;
        // (name, M, W, D, node has .ready, device-plugin pod on the node, want)
        let rows = [
            ("row 1: nothing set", "", "", "", false, false, Nothing),
            (
                "row 2: M removed",
                "",
                "v1",
                "v1",
                true,
                true,
                Write(RemoveDevicePlugin),
            ),
            (
                "row 3: M removed, D gone",
                "",
                "v1",
                "",
                true,
                false,
                Write(RemoveWorkerPod),
            ),
            (
                "row 3 guard: a device-plugin pod remains",
                "",
                "v1",
                "",
                true,
                true,
                Wait(Guard::DevicePluginPodRemains),
            ),
            (
                "row 4: M set",
                "v2",
                "",
                "",
                false,
                false,
                Write(SetWorkerPod("v2".into())),
            ),
            (
                "row 4 guard: the old module is still loaded",
                "v2",
                "",
                "",
                true,
                false,
                Wait(Guard::ModuleStillLoaded),
            ),
            (
                "row 5: W = M",
                "v2",
                "v2",
                "",
                false,
                false,
                Write(SetDevicePlugin("v2".into())),
            ),
            (
                "row 5 is unguarded",
                "v2",
                "v2",
                "",
                true,
                true,
                Write(SetDevicePlugin("v2".into())),
            ),
            ("row 6: all equal", "v2", "v2", "v2", true, true, Nothing),
            (
                "row 7: M moved",
                "v2",
                "v1",
                "v1",
                true,
                true,
                Write(RemoveDevicePlugin),
            ),
            (
                "row 8: M moved, D gone",
                "v2",
                "v1",
                "",
                true,
                false,
                Write(RemoveWorkerPod),
            ),
            (
                "row 8 guard: a device-plugin pod remains",
                "v2",
                "v1",
                "",
                true,
                true,
                Wait(Guard::DevicePluginPodRemains),
            ),
            (
                "not in the table: D without W",
                "v2",
                "",
                "v1",
                false,
                false,
                OutsideTable,
            ),
            (
                "not in the table: D alone",
                "",
                "",
                "v1",
                false,
                false,
                OutsideTable,
            ),
            (
                "not in the table: W = M, D differs",
                "v2",
                "v2",
                "v1",
                true,
                false,
                OutsideTable,
            ),
        ];
        for (name, m, w, d, loaded, pod, want) in rows {
            assert_eq!(label_action(&labels(m, w, d), loaded, pod), want, "{name}");
        }
        let numbered = [
            ("", "", "", 1),
            ("", "v1", "v1", 2),
            ("", "v1", "", 3),
            ("v2", "", "", 4),
            ("v2", "v2", "", 5),
            ("v2", "v2", "v2", 6),
            ("v2", "v1", "v1", 7),
            ("v2", "v1", "", 8),
        ];
        for (m, w, d, row) in numbered {
            assert_eq!(table_row(&labels(m, w, d)), Some(row), "{m} {w} {d}");
        }
    }

    #[test]
    fn pending_moves_are_from_w_to_m() {
        let cases = [
            (labels("v2", "v1", "v1"), Some((v("v1"), v("v2")))),
            (labels("v2", "v1", ""), Some((v("v1"), v("v2")))),
            (labels("v2", "", ""), Some((None, v("v2")))),
            (labels("", "v1", "v1"), Some((v("v1"), None))),
            (labels("", "v1", ""), Some((v("v1"), None))),
            (labels("v2", "v2", ""), None),
            (labels("v2", "v2", "v2"), None),
            (labels("", "", ""), None),
            (labels("v2", "", "v1"), None),
        ];
        for (labels, want) in cases {
            assert_eq!(pending_move(&labels), want, "{labels:?}");
        }
    }

    fn open() -> Gate {
        Gate {
            slot: Slot::Free,
            require_pull_request: false,
            sync_applying: false,
        }
    }

    fn stamp(sha: &str, pull_request: Option<u64>) -> Stamp {
        Stamp {
            revision: Some(format!("main@sha1:{sha}")),
            pull_request,
        }
    }

    /// One node and one Module, with the other controllers played by hand.
    struct Node {
        facts: NodeModuleFacts,
        now: Timestamp,
        /// Steps recorded, with their commit.
        steps: Vec<(UpgradeStep, Option<String>, Option<String>, Stamp)>,
        /// Label writes made, in order.
        writes: Vec<LabelWrite>,
    }

    impl Node {
        /// A node running `version` of a Module with a device plugin.
        fn running(version: &str) -> Node {
            Node {
                facts: NodeModuleFacts {
                    labels: labels(version, version, version),
                    module_loaded: true,
                    loaded_version: v(version),
                    device_plugin_pod_remains: true,
                    device_plugin_running: true,
                    has_device_plugin: true,
                    progress: None,
                    stamp: stamp("c0", Some(1)),
                },
                now: "2026-03-01T10:00:00Z".parse().unwrap(),
                steps: Vec::new(),
                writes: Vec::new(),
            }
        }

        /// A node without the Module.
        fn bare() -> Node {
            let mut node = Node::running("v1");
            node.facts.labels = VersionLabels::default();
            node.facts.module_loaded = false;
            node.facts.loaded_version = None;
            node.facts.device_plugin_pod_remains = false;
            node.facts.device_plugin_running = false;
            node
        }

        /// Git changes M, stamping the node with `commit`.
        fn relabel(&mut self, version: &str, commit: Stamp) {
            self.facts.labels.module = (!version.is_empty()).then(|| version.to_string());
            self.facts.stamp = commit;
        }

        /// Decides and applies the decision as the reconciler would, one second later.
        fn reconcile(&mut self, gate: &Gate) -> Decision {
            let decision = decide(&self.facts, gate, self.now);
            if let Some(step) = &decision.step {
                self.steps.push((
                    step.step,
                    step.from.clone(),
                    step.to.clone(),
                    step.stamp.clone(),
                ));
            }
            if let Outcome::Write(write) = &decision.outcome {
                let labels = &mut self.facts.labels;
                match write {
                    LabelWrite::SetWorkerPod(version) => labels.worker_pod = v(version),
                    LabelWrite::RemoveWorkerPod => labels.worker_pod = None,
                    LabelWrite::SetDevicePlugin(version) => labels.device_plugin = v(version),
                    LabelWrite::RemoveDevicePlugin => labels.device_plugin = None,
                }
                self.writes.push(write.clone());
            }
            self.facts.progress = decision.progress.clone();
            self.now += jiff::SignedDuration::from_secs(1);
            decision
        }

        /// The device-plugin pod is being deleted (still on the node).
        fn device_plugin_terminating(&mut self) {
            self.facts.device_plugin_running = false;
        }

        /// The device-plugin pod is gone.
        fn device_plugin_gone(&mut self) {
            self.facts.device_plugin_running = false;
            self.facts.device_plugin_pod_remains = false;
        }

        /// The NMC controller unloaded the module.
        fn unloaded(&mut self) {
            self.facts.module_loaded = false;
            self.facts.loaded_version = None;
        }

        /// The NMC controller loaded `version`.
        fn loaded(&mut self, version: &str) {
            self.facts.module_loaded = true;
            self.facts.loaded_version = v(version);
        }

        /// The device-plugin DaemonSet's pod runs.
        fn device_plugin_runs(&mut self) {
            self.facts.device_plugin_pod_remains = true;
            self.facts.device_plugin_running = true;
        }

        fn step_names(&self) -> Vec<UpgradeStep> {
            self.steps.iter().map(|(step, ..)| *step).collect()
        }
    }

    fn write(decision: &Decision) -> Option<LabelWrite> {
        match &decision.outcome {
            Outcome::Write(write) => Some(write.clone()),
            _ => None,
        }
    }

    fn step(decision: &Decision) -> Option<UpgradeStep> {
        decision.step.as_ref().map(|s| s.step)
    }

    #[test]
    fn one_commit_moves_a_node_from_v1_to_v2_in_four_steps() {
        use LabelWrite::*;
        let mut node = Node::running("v1");
        let pr = stamp("c2", Some(42));
        node.relabel("v2", pr.clone());

        let d = node.reconcile(&open());
        assert_eq!(
            write(&d),
            Some(RemoveDevicePlugin),
            "the upgrade starts with D"
        );
        assert_eq!(step(&d), None);
        let progress = d.progress.clone().expect("upgrade tracked");
        assert_eq!((progress.from, progress.to), (v("v1"), v("v2")));
        assert!(progress.started_at.is_some());

        node.device_plugin_terminating();
        let d = node.reconcile(&open());
        assert_eq!(
            d.outcome,
            Outcome::Wait(Wait::Guard(Guard::DevicePluginPodRemains)),
            "W stays while the device-plugin pod terminates"
        );
        assert_eq!(step(&d), None);

        node.device_plugin_gone();
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(DevicePluginStopped));
        assert_eq!(write(&d), Some(RemoveWorkerPod));

        let d = node.reconcile(&open());
        assert_eq!(
            d.outcome,
            Outcome::Wait(Wait::Guard(Guard::ModuleStillLoaded)),
            "W is not set while v1 is loaded"
        );
        assert_eq!(step(&d), None);

        node.unloaded();
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(OldModuleUnloaded));
        assert_eq!(write(&d), Some(SetWorkerPod("v2".into())));

        let d = node.reconcile(&open());
        assert_eq!(
            write(&d),
            Some(SetDevicePlugin("v2".into())),
            "D is unguarded"
        );
        assert_eq!(step(&d), None, "v2 is not loaded yet");

        node.loaded("v2");
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(NewModuleLoaded));
        assert_eq!(d.outcome, Outcome::Nothing);

        node.device_plugin_runs();
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(DevicePluginStarted));
        assert!(d.step.as_ref().is_some_and(|s| s.last));
        assert_eq!(d.progress, None, "the upgrade is over");

        let d = node.reconcile(&open());
        assert_eq!(
            (d.outcome, d.step, d.progress),
            (Outcome::Nothing, None, None)
        );
        assert_eq!(node.step_names(), UpgradeStep::ALL);
        assert!(
            node.steps
                .iter()
                .all(|(_, from, to, commit)| *from == v("v1") && *to == v("v2") && *commit == pr),
            "{:?}",
            node.steps
        );
        assert_eq!(
            node.writes,
            [
                RemoveDevicePlugin,
                RemoveWorkerPod,
                SetWorkerPod("v2".into()),
                SetDevicePlugin("v2".into())
            ]
        );
        assert_eq!(node.facts.labels, labels("v2", "v2", "v2"));
    }

    #[test]
    fn step_durations_count_from_the_step_before() {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(42)));
        node.reconcile(&open());
        node.device_plugin_gone();
        node.now += jiff::SignedDuration::from_secs(9);
        let d = node.reconcile(&open());
        let stopped = d.step.expect("step 1");
        assert_eq!(stopped.duration_seconds, 10.0, "since the upgrade started");
        node.unloaded();
        node.now += jiff::SignedDuration::from_secs(4);
        let d = node.reconcile(&open());
        assert_eq!(d.step.expect("step 2").duration_seconds, 5.0);
    }

    #[test]
    fn a_removal_commit_then_an_add_commit_is_two_moves() {
        use LabelWrite::*;
        // Seed 002 steps 4 and 6: the label is removed, then added with the new version.
        let mut node = Node::running("v1");
        let removal = stamp("c3", Some(43));
        node.relabel("", removal.clone());
        assert_eq!(write(&node.reconcile(&open())), Some(RemoveDevicePlugin));
        node.device_plugin_gone();
        let d = node.reconcile(&open());
        assert_eq!(
            (step(&d), write(&d)),
            (Some(DevicePluginStopped), Some(RemoveWorkerPod))
        );
        let d = node.reconcile(&open());
        assert_eq!((step(&d), write(&d)), (None, None), "v1 still loaded");
        node.unloaded();
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(OldModuleUnloaded));
        assert!(d.step.as_ref().is_some_and(|s| s.last));
        assert_eq!(d.progress, None);
        assert_eq!(node.facts.labels, VersionLabels::default());

        let add = stamp("c4", Some(44));
        node.relabel("v2", add.clone());
        let d = node.reconcile(&open());
        assert_eq!(write(&d), Some(SetWorkerPod("v2".into())));
        assert_eq!(d.progress.as_ref().map(|p| p.from.clone()), Some(None));
        node.reconcile(&open());
        node.loaded("v2");
        assert_eq!(step(&node.reconcile(&open())), Some(NewModuleLoaded));
        node.device_plugin_runs();
        assert_eq!(step(&node.reconcile(&open())), Some(DevicePluginStarted));

        assert_eq!(
            node.steps,
            [
                (DevicePluginStopped, v("v1"), None, removal.clone()),
                (OldModuleUnloaded, v("v1"), None, removal),
                (NewModuleLoaded, None, v("v2"), add.clone()),
                (DevicePluginStarted, None, v("v2"), add),
            ]
        );
    }

    #[test]
    fn a_first_label_only_loads_and_starts() {
        let mut node = Node::bare();
        node.relabel("v1", stamp("c1", Some(7)));
        let d = node.reconcile(&open());
        assert_eq!(write(&d), Some(LabelWrite::SetWorkerPod("v1".into())));
        assert_eq!(
            write(&node.reconcile(&open())),
            Some(LabelWrite::SetDevicePlugin("v1".into()))
        );
        node.loaded("v1");
        node.reconcile(&open());
        node.device_plugin_runs();
        node.reconcile(&open());
        assert_eq!(node.step_names(), [NewModuleLoaded, DevicePluginStarted]);
        assert_eq!(node.facts.progress, None);
    }

    #[test]
    fn a_removed_label_only_stops_and_unloads() {
        let mut node = Node::running("v1");
        node.relabel("", stamp("c5", None));
        node.reconcile(&open());
        node.device_plugin_gone();
        node.reconcile(&open());
        node.unloaded();
        node.reconcile(&open());
        assert_eq!(node.step_names(), [DevicePluginStopped, OldModuleUnloaded]);
        assert_eq!(node.facts.labels, VersionLabels::default());
        assert_eq!(node.facts.progress, None);
    }

    #[test]
    fn without_a_device_plugin_its_steps_follow_the_label_writes() {
        let mut node = Node::running("v1");
        node.facts.has_device_plugin = false;
        node.facts.device_plugin_pod_remains = false;
        node.facts.device_plugin_running = false;
        node.relabel("v2", stamp("c2", Some(2)));
        node.reconcile(&open());
        node.reconcile(&open());
        node.unloaded();
        node.reconcile(&open());
        node.reconcile(&open());
        node.loaded("v2");
        node.reconcile(&open());
        node.reconcile(&open());
        assert_eq!(node.step_names(), UpgradeStep::ALL);
        assert_eq!(node.facts.progress, None);
    }

    #[test]
    fn a_decision_lost_before_its_write_is_made_again() {
        // A crash after a step's record and before the node's write: the same step of the
        // same move and commit is found again (its record name is the same), with the same
        // label write.
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(42)));
        let script: [fn(&mut Node); 4] = [
            Node::device_plugin_gone,
            Node::unloaded,
            |node| node.loaded("v2"),
            Node::device_plugin_runs,
        ];
        node.reconcile(&open());
        for happen in script {
            happen(&mut node);
            let lost = decide(&node.facts, &open(), node.now);
            let again = node.reconcile(&open());
            let same = |s: &StepReached| (s.step, s.from.clone(), s.to.clone(), s.stamp.clone());
            assert!(again.step.is_some());
            assert_eq!(lost.step.as_ref().map(same), again.step.as_ref().map(same));
            assert_eq!(lost.outcome, again.outcome);
            // Between steps, the set of D happens without a step.
            if again
                .step
                .as_ref()
                .is_some_and(|s| s.step == OldModuleUnloaded)
            {
                node.reconcile(&open());
            }
        }
        assert_eq!(node.step_names(), UpgradeStep::ALL);
    }

    #[test]
    fn nodes_not_relabelled_stay_untouched() {
        let mut node = Node::running("v1");
        let d = node.reconcile(&open());
        assert_eq!(
            (d.outcome, d.step, d.progress),
            (Outcome::Nothing, None, None)
        );
    }

    fn taken() -> Gate {
        Gate {
            slot: Slot::Taken {
                upgrading: 1,
                ahead: 0,
                limit: 1,
            },
            require_pull_request: false,
            sync_applying: false,
        }
    }

    #[test]
    fn a_node_without_a_slot_waits_and_says_so_once() {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(42)));
        let d = node.reconcile(&taken());
        assert_eq!(d.outcome, Outcome::Wait(Wait::Policy(PolicyWait::Slot)));
        assert!(d.announce);
        let waiting = d.progress.expect("the wait is kept");
        assert!(!waiting.upgrading());
        assert_eq!(waiting.waiting, Some(PolicyWait::Slot));
        let d = node.reconcile(&taken());
        assert!(!d.announce, "announced once per wait");
        assert_eq!(node.facts.labels, labels("v2", "v1", "v1"), "untouched");

        // A newer commit while waiting: a new wait, announced, with the new commit.
        node.relabel("v3", stamp("c3", Some(43)));
        let d = node.reconcile(&taken());
        assert!(d.announce);
        assert_eq!(d.progress.as_ref().and_then(|p| p.to.clone()), v("v3"));

        let d = node.reconcile(&open());
        assert_eq!(write(&d), Some(LabelWrite::RemoveDevicePlugin));
        let progress = d.progress.expect("started");
        assert!(progress.upgrading());
        assert_eq!(progress.waiting, None);
        assert_eq!(progress.revision.as_deref(), Some("main@sha1:c3"));
    }

    #[test]
    fn the_commit_is_the_one_seen_when_the_move_was_first_seen() {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(42)));
        node.reconcile(&taken());
        // Another commit changes something else on the node while it waits.
        node.facts.stamp = stamp("c9", Some(49));
        node.reconcile(&open());
        node.device_plugin_gone();
        let d = node.reconcile(&open());
        assert_eq!(d.step.expect("step 1").stamp, stamp("c2", Some(42)));
    }

    #[test]
    fn a_move_waits_while_the_sync_writes_its_commit() {
        let applying = Gate {
            sync_applying: true,
            ..open()
        };
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(2)));
        let d = node.reconcile(&applying);
        assert_eq!(d.outcome, Outcome::Wait(Wait::SyncApplying));
        assert_eq!((d.step, d.progress, d.announce), (None, None, false));
        assert_eq!(node.facts.labels, labels("v2", "v1", "v1"));
        // Once the sync is done the move starts, asked for by the commit that relabelled it.
        let d = node.reconcile(&open());
        assert_eq!(write(&d), Some(LabelWrite::RemoveDevicePlugin));
        let progress = d.progress.expect("progress");
        assert_eq!(progress.revision.as_deref(), Some("main@sha1:c2"));
        assert_eq!(progress.pull_request, Some(2));
        // A move under way goes on while a later commit is written.
        node.device_plugin_gone();
        let d = node.reconcile(&applying);
        assert_eq!(write(&d), Some(LabelWrite::RemoveWorkerPod));
    }

    #[test]
    fn without_a_pull_request_the_node_is_not_moved() {
        let gate = Gate {
            slot: Slot::Free,
            require_pull_request: true,
            sync_applying: false,
        };
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", None));
        let d = node.reconcile(&gate);
        assert_eq!(
            d.outcome,
            Outcome::Wait(Wait::Policy(PolicyWait::PullRequest))
        );
        assert!(d.announce);
        assert!(!node.reconcile(&gate).announce);
        assert_eq!(node.facts.labels, labels("v2", "v1", "v1"));

        // A pull request merged later stamps the node: it moves.
        node.relabel("v2", stamp("c3", Some(3)));
        let d = node.reconcile(&gate);
        assert_eq!(write(&d), Some(LabelWrite::RemoveDevicePlugin));
        assert_eq!(d.progress.and_then(|p| p.pull_request), Some(3));
    }

    #[test]
    fn an_unapproved_relabel_during_an_upgrade_holds_the_node() {
        let gate = Gate {
            slot: Slot::Free,
            require_pull_request: true,
            sync_applying: false,
        };
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(2)));
        node.reconcile(&gate);
        node.relabel("v3", stamp("c3", None));
        node.device_plugin_gone();
        let d = node.reconcile(&gate);
        assert_eq!(
            d.outcome,
            Outcome::Wait(Wait::Policy(PolicyWait::PullRequest))
        );
        assert!(d.announce);
        assert_eq!(d.step, None);
        assert!(
            d.progress.as_ref().is_some_and(Progress::upgrading),
            "keeps its slot"
        );
        assert!(!node.reconcile(&gate).announce);
        assert_eq!(node.facts.labels, labels("v3", "v1", ""));
    }

    #[test]
    fn a_label_moved_again_during_an_upgrade_is_followed() {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(2)));
        node.reconcile(&open());
        node.device_plugin_gone();
        node.reconcile(&open()); // step 1, W removed
        // v3 arrives while v1 unloads: the same upgrade, now to v3, under the new commit.
        node.relabel("v3", stamp("c3", Some(3)));
        node.unloaded();
        let d = node.reconcile(&open());
        assert_eq!(step(&d), Some(OldModuleUnloaded));
        assert_eq!(write(&d), Some(LabelWrite::SetWorkerPod("v3".into())));
        node.reconcile(&open());
        node.loaded("v3");
        node.reconcile(&open());
        node.device_plugin_runs();
        node.reconcile(&open());
        let moves: Vec<(UpgradeStep, Option<String>, Option<String>)> = node
            .steps
            .iter()
            .map(|(step, from, to, _)| (*step, from.clone(), to.clone()))
            .collect();
        assert_eq!(
            moves,
            [
                (DevicePluginStopped, v("v1"), v("v2")),
                (OldModuleUnloaded, v("v1"), v("v3")),
                (NewModuleLoaded, v("v1"), v("v3")),
                (DevicePluginStarted, v("v1"), v("v3")),
            ]
        );
    }

    #[test]
    fn a_label_put_back_during_an_upgrade_ends_it() {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(2)));
        node.reconcile(&open()); // D removed
        node.relabel("v1", stamp("c3", Some(3)));
        let d = node.reconcile(&open());
        assert_eq!(write(&d), Some(LabelWrite::SetDevicePlugin("v1".into())));
        assert_eq!(d.progress, None);
        assert!(node.steps.is_empty());
    }

    fn fleet(nodes: &[(&str, Standing)]) -> Vec<(String, Standing)> {
        nodes.iter().map(|(n, s)| (n.to_string(), *s)).collect()
    }

    fn policy(max: u32) -> UpgradePolicy {
        UpgradePolicy {
            max_nodes_in_flight: max,
            require_pull_request: false,
        }
    }

    #[test]
    fn slots_go_in_node_name_order() {
        use Standing::*;
        let waiting = fleet(&[
            ("worker-3", Queued),
            ("worker-1", Settled),
            ("worker-2", Queued),
            ("worker-4", Held),
        ]);
        let free = |node: &str, max: u32| {
            let own = waiting
                .iter()
                .find(|(n, _)| n == node)
                .map_or(Settled, |(_, s)| *s);
            slot(node, own, &waiting, &policy(max)) == Slot::Free
        };
        assert!(free("worker-2", 1));
        assert!(!free("worker-3", 1));
        assert!(free("worker-3", 2));
        assert_eq!(
            slot("worker-3", Queued, &waiting, &policy(1)),
            Slot::Taken {
                upgrading: 0,
                ahead: 1,
                limit: 1
            }
        );

        let busy = fleet(&[
            ("worker-9", Upgrading),
            ("worker-2", Queued),
            ("worker-3", Queued),
        ]);
        assert!(
            slot("worker-9", Upgrading, &busy, &policy(1)) == Slot::Free,
            "keeps its slot"
        );
        assert!(slot("worker-2", Queued, &busy, &policy(1)) != Slot::Free);
        assert!(slot("worker-2", Queued, &busy, &policy(2)) == Slot::Free);
        assert!(slot("worker-3", Queued, &busy, &policy(2)) != Slot::Free);
    }

    #[test]
    fn standing_of_a_node() {
        let queued = NodeModuleFacts {
            labels: labels("v2", "v1", "v1"),
            stamp: stamp("c2", None),
            ..NodeModuleFacts::default()
        };
        let settled = NodeModuleFacts {
            labels: labels("v1", "v1", "v1"),
            ..NodeModuleFacts::default()
        };
        let upgrading = NodeModuleFacts {
            progress: Some(Progress {
                started_at: Some(Timestamp::UNIX_EPOCH),
                ..Progress::default()
            }),
            ..settled.clone()
        };
        assert_eq!(standing([&settled], false), Standing::Settled);
        assert_eq!(standing([&settled, &queued], false), Standing::Queued);
        assert_eq!(standing([&queued], true), Standing::Held);
        assert_eq!(standing([&queued, &upgrading], true), Standing::Upgrading);
    }

    #[test]
    fn progress_round_trips_through_its_annotation() {
        let progress = Progress {
            from: v("v1"),
            to: v("v2"),
            revision: Some("main@sha1:abc".into()),
            pull_request: Some(42),
            started_at: Some("2026-03-01T10:00:00Z".parse().unwrap()),
            step: Some(OldModuleUnloaded),
            step_at: Some("2026-03-01T10:00:05.25Z".parse().unwrap()),
            waiting: None,
        };
        let text = progress.to_annotation();
        assert!(text.contains("\"step\":\"old-module-unloaded\""), "{text}");
        assert_eq!(Progress::from_annotation(&text), Some(progress));
        assert_eq!(Progress::from_annotation("not json"), None);
        let waiting = Progress {
            waiting: Some(PolicyWait::PullRequest),
            ..Progress::default()
        };
        assert_eq!(waiting.to_annotation(), "{\"waiting\":\"pull-request\"}");
    }
}
