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
//! only when no device-plugin or DRA driver pod of the module remains on the node, in any
//! phase ([`Guard::DevicePluginPodRemains`]); W is set only once the node has lost the
//! module's `.ready` label, i.e. the old version is unloaded ([`Guard::ModuleStillLoaded`]).
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
//!
//! [`decide_node`] makes one reconcile's decision for a node: the gate from its policy
//! ([`Policies::policy_for`]) and the slots, [`decide`] per Module, and what to write
//! ([`NodePlan`]: the step records, each Module's label write and progress, which
//! [`node_patch`] turns into one patch, the wait announcements, the next look). What the
//! caches cannot be trusted with it asks to [`Confirm`] with the API server first.
//! The submodules hold the rest of what the reconciler needs decided: [`facts`] (what is
//! read off the objects) and [`records`] (what records and Events say). What the campaign
//! and drain controllers share with it (a node's [`Progress`], the [`Policies`] and who
//! asked, the campaigns' gate, a drain's state) is the upgrade layer's
//! ([`crate::controllers::upgrade`]).

pub mod facts;
pub mod pending;
pub mod reconciler;
pub mod records;

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::upgrade::drain::{Cordon, DrainRecord, DrainState, DrainStep};
use super::upgrade::guard::{self, Check, Seen, Verdict};
use super::upgrade::window::{self, WindowState};
use super::upgrade::{Campaigns, Policies, PolicyWait, Progress, Stamp};
use capstan_api::labels::ModuleKey;
use capstan_api::{FailedNode, GateWhen, HistoryRecordSpec, UpgradePolicy, UpgradeStep};
use records::{GateRecord, StepRecord, WaitEvent, gate_record, step_record, wait_event};

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
    /// The labels of `key` among a node's `labels`. A label with an empty value names no
    /// version and counts as missing, as upstream reads it.
    pub fn of(key: &ModuleKey, labels: &BTreeMap<String, String>) -> VersionLabels {
        let version = |label: String| labels.get(&label).filter(|v| !v.is_empty()).cloned();
        VersionLabels {
            module: version(key.version_module_label()),
            worker_pod: version(key.version_worker_pod_label()),
            device_plugin: version(key.version_device_plugin_label()),
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
    /// W is to be removed, but a device-plugin or DRA driver pod of the module is still on
    /// the node.
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

/// Why a decision waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A table guard: the reconciler checks again soon.
    Guard(Guard),
    /// The policy: the node does not move until the gate opens.
    Policy(PolicyWait),
    /// The sync is writing a commit: the move starts once it is done.
    SyncApplying,
    /// The upgrade runs under a campaign and its node is not drained yet.
    Drain,
    /// A gate's attempt is under way (or a canary soaks).
    Check,
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
    /// A device-plugin or DRA driver pod of the module is on the node, in any phase, not yet
    /// gone.
    pub device_plugin_pod_remains: bool,
    /// A device-plugin or DRA driver pod of the module runs on the node (phase `Running`,
    /// not being deleted).
    pub device_plugin_running: bool,
    /// The Module has a device plugin or a DRA driver; without either, the device-plugin
    /// steps are reached as soon as D is written.
    pub has_device_plugin: bool,
    /// The upgrade kept in the node's annotation.
    pub progress: Option<Progress>,
    /// The node's stamps.
    pub stamp: Stamp,
    /// The rollout's guardrails over this Module's move on the node.
    pub guardrails: Guardrails,
}

/// The guardrails over one Module's move on a node: its checks, what a failure does, and
/// what the check under way was seen to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Guardrails {
    /// The checks before the node starts (the preflight first).
    pub before: Vec<Check>,
    /// The checks after its last step.
    pub after: Vec<Check>,
    /// The node is a canary, soaking this long after its checks.
    pub soak: Option<Duration>,
    /// What the attempt the node keeps ([`Progress::check`]) was seen to do; `None` when
    /// it was not read.
    pub seen: Option<Seen>,
}

/// Whether a slot under `maxNodesInFlight` is free for the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Slot {
    /// The node may start (or is upgrading already).
    #[default]
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gate {
    /// The slot.
    pub slot: Slot,
    /// `requirePullRequest`.
    pub require_pull_request: bool,
    /// The sync that applies the node is writing a commit (its `GitSync` is `Applying`).
    /// A move waits until every label of the commit is in, so that the nodes of one commit
    /// start in name order whatever order the sync's writes came in.
    pub sync_applying: bool,
    /// The upgrade campaigns: a move to a campaign's version waits for it to start, and
    /// then drains its node first.
    pub campaigns: Campaigns,
    /// The node's drain is done (its drain state says so).
    pub drained: bool,
    /// The rollout's hold on new starts: paused, halted, outside every window, or behind
    /// the canary.
    pub hold: Option<PolicyWait>,
    /// The maintenance windows at the time of the decision.
    pub window: Option<WindowState>,
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
    campaigns: &Campaigns,
) -> Standing {
    let mut standing = Standing::Settled;
    for facts in modules {
        if facts.progress.as_ref().is_some_and(Progress::holds_slot) {
            return Standing::Upgrading;
        }
        if facts
            .progress
            .as_ref()
            .is_some_and(|p| p.soak_until.is_some())
        {
            // A canary back in service for its soak holds no slot.
            continue;
        }
        if facts.progress.as_ref().is_some_and(Progress::upgrading) {
            // Given up while the node was NotReady: back in line.
            standing = Standing::Queued;
            continue;
        }
        let Some((from, to)) = pending_move(&facts.labels) else {
            continue;
        };
        if failed_move(facts, &from, &to) {
            if standing == Standing::Settled {
                standing = Standing::Held;
            }
            continue;
        }
        let (_, pull_request) = move_commit(facts, &from, &to);
        let campaign_holds = campaigns
            .get(to.as_deref())
            .is_some_and(|campaign| !campaign.started());
        if campaign_holds || (require_pull_request && pull_request.is_none()) {
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
    /// A gate's attempt that ended, to record.
    pub check: Option<guard::Outcome>,
}

/// The decision for one Module on one node at `now`.
pub fn decide(facts: &NodeModuleFacts, gate: &Gate, now: Timestamp) -> Decision {
    let table = label_action(
        &facts.labels,
        facts.module_loaded,
        facts.device_plugin_pod_remains,
    );
    match facts.progress.as_ref().filter(|p| p.upgrading()) {
        Some(progress) if progress.released_at.is_some() => {
            resume_upgrade(progress.clone(), facts, gate, table, now)
        }
        Some(progress) => continue_upgrade(progress.clone(), facts, gate, table, now),
        None => begin_upgrade(facts, gate, table, now),
    }
}

/// An upgrade whose node gave up its slot: it goes on once a slot is free again, as a
/// node in line would start; until then nothing moves on it.
/// An upgrade under way holds where it is for `wait`, keeping its progress; the wait is
/// announced once.
fn hold(mut progress: Progress, wait: PolicyWait) -> Decision {
    let announce = progress.waiting != Some(wait);
    progress.waiting = Some(wait);
    Decision {
        outcome: Outcome::Wait(Wait::Policy(wait)),
        step: None,
        progress: Some(progress),
        announce,
        check: None,
    }
}

/// Whether the rollout's guardrails govern a move: an upgrade from one version to another.
/// A node's first load and its last unload follow the policy as they always did.
fn guarded(from: &Option<String>, to: &Option<String>) -> bool {
    from.is_some() && to.is_some()
}

/// Whether the move `from` -> `to` is one a gate failed on (or rolled back from): it stays
/// until the repository moves the node again.
fn failed_move(facts: &NodeModuleFacts, from: &Option<String>, to: &Option<String>) -> bool {
    facts
        .progress
        .as_ref()
        .is_some_and(|p| p.failed.is_some() && !p.upgrading() && &p.from == from && &p.to == to)
}

fn resume_upgrade(
    mut progress: Progress,
    facts: &NodeModuleFacts,
    gate: &Gate,
    table: TableAction,
    now: Timestamp,
) -> Decision {
    if gate.slot != Slot::Free {
        return hold(progress, PolicyWait::Slot);
    }
    progress.released_at = None;
    continue_upgrade(progress, facts, gate, table, now)
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
            check: None,
        };
    };
    if gate.sync_applying {
        // Nothing is written: the node is looked at again when the sync is done.
        return Decision {
            outcome: Outcome::Wait(Wait::SyncApplying),
            step: None,
            progress: facts.progress.clone(),
            announce: false,
            check: None,
        };
    }
    if failed_move(facts, &from, &to)
        && let Some(progress) = facts.progress.clone()
    {
        return hold(progress, PolicyWait::Failed);
    }
    let (revision, pull_request) = move_commit(facts, &from, &to);
    let campaign = gate.campaigns.get(to.as_deref());
    let wait = if campaign.is_some_and(|campaign| !campaign.started()) {
        Some(PolicyWait::Campaign)
    } else if gate.require_pull_request && pull_request.is_none() {
        Some(PolicyWait::PullRequest)
    } else if let Some(hold) = gate.hold.filter(|_| guarded(&from, &to)) {
        Some(hold)
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
            check: None,
        };
    }
    // The checks before the start run first: the first attempt begins now.
    let before = if guarded(&progress.from, &progress.to) {
        facts.guardrails.before.as_slice()
    } else {
        &[]
    };
    let check = match guard::next(before, GateWhen::Before, None, None, now) {
        (Verdict::Run(run), _) => Some(run),
        _ => None,
    };
    advance(
        Progress {
            started_at: Some(now),
            drain: campaign.is_some(),
            check,
            ..progress
        },
        facts,
        gate,
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
            return hold(progress, PolicyWait::PullRequest);
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
        // The repository moved the node again: a failure it answers is over.
        progress.failed = None;
        progress.check = None;
        progress.finished_at = None;
        progress.soak_until = None;
    }
    progress.waiting = None;
    advance(progress, facts, gate, table, now)
}

/// Records the next step of `progress` if the facts show it reached; the upgrade ends with
/// its last step (or at once, for a move without steps).
fn advance(
    mut progress: Progress,
    facts: &NodeModuleFacts,
    gate: &Gate,
    table: TableAction,
    now: Timestamp,
) -> Decision {
    let checking = |progress: Progress, check| Decision {
        outcome: Outcome::Wait(Wait::Check),
        step: None,
        progress: Some(progress),
        announce: false,
        check,
    };
    if progress.failed.is_some() {
        // A gate failed after the last step: the node stays as it is.
        return hold(progress, PolicyWait::Failed);
    }
    if let Some(run) = progress
        .check
        .clone()
        .filter(|run| run.when == GateWhen::Before)
    {
        let seen = facts.guardrails.seen.as_ref();
        match guard::next(
            &facts.guardrails.before,
            GateWhen::Before,
            Some(&run),
            seen,
            now,
        ) {
            (Verdict::Run(run), outcome) => {
                progress.check = Some(run);
                return checking(progress, outcome);
            }
            (Verdict::Passed, outcome) => {
                progress.check = None;
                if outcome.is_some() {
                    // Recorded now; the steps begin at the next look.
                    return checking(progress, outcome);
                }
            }
            (Verdict::Failed(failure), outcome) => {
                // Nothing started on the node: it gives up its slot and stays as it is.
                progress.check = None;
                progress.started_at = None;
                progress.failed = Some(failure);
                progress.waiting = Some(PolicyWait::Failed);
                return Decision {
                    outcome: Outcome::Wait(Wait::Policy(PolicyWait::Failed)),
                    step: None,
                    progress: Some(progress),
                    announce: false,
                    check: outcome,
                };
            }
        }
    }
    if progress.finished_at.is_some() {
        return after_last_step(progress, facts, now);
    }
    if progress.drain && !gate.drained {
        // Nothing moves on the node before its workloads are gone.
        return Decision {
            outcome: Outcome::Wait(Wait::Drain),
            step: None,
            progress: Some(progress),
            announce: false,
            check: None,
        };
    }
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
            if !last {
                Some(progress)
            } else {
                finished(progress, facts, now)
            }
        }
        Some(_) => Some(progress),
    };
    Decision {
        outcome: outcome_of(table),
        step: reached,
        progress: keep,
        announce: false,
        check: None,
    }
}

/// The progress once the last step is reached: the checks after the last step begin (the
/// node keeps its slot and drain until they pass), or, with none, the upgrade is over.
fn finished(mut progress: Progress, facts: &NodeModuleFacts, now: Timestamp) -> Option<Progress> {
    let unguarded = facts.guardrails.after.is_empty() && facts.guardrails.soak.is_none();
    if unguarded || !guarded(&progress.from, &progress.to) {
        return None;
    }
    progress.finished_at = Some(now);
    progress.check = match guard::next(&facts.guardrails.after, GateWhen::After, None, None, now) {
        (Verdict::Run(run), _) => Some(run),
        _ => None,
    };
    Some(progress)
}

/// The node reached its last step: its checks after it run, then a canary soaks, then the
/// upgrade is over; a failed check halts the rollout there.
fn after_last_step(mut progress: Progress, facts: &NodeModuleFacts, now: Timestamp) -> Decision {
    let guardrails = &facts.guardrails;
    let decision = |progress: Option<Progress>, outcome, check| Decision {
        outcome,
        step: None,
        progress,
        announce: false,
        check,
    };
    if let Some(until) = progress.soak_until {
        return if now >= until {
            decision(None, Outcome::Nothing, None)
        } else {
            decision(Some(progress), Outcome::Wait(Wait::Check), None)
        };
    }
    let run = progress
        .check
        .clone()
        .filter(|run| run.when == GateWhen::After);
    let seen = guardrails.seen.as_ref().filter(|_| run.is_some());
    match guard::next(&guardrails.after, GateWhen::After, run.as_ref(), seen, now) {
        (Verdict::Run(run), outcome) => {
            progress.check = Some(run);
            decision(Some(progress), Outcome::Wait(Wait::Check), outcome)
        }
        (Verdict::Passed, outcome) => {
            progress.check = None;
            match guardrails.soak {
                Some(soak) if !soak.is_zero() => {
                    progress.soak_until = Some(now + soak);
                    decision(Some(progress), Outcome::Wait(Wait::Check), outcome)
                }
                _ => decision(None, Outcome::Nothing, outcome),
            }
        }
        (Verdict::Failed(failure), outcome) => {
            progress.check = None;
            progress.failed = Some(failure);
            progress.waiting = Some(PolicyWait::Failed);
            decision(
                Some(progress),
                Outcome::Wait(Wait::Policy(PolicyWait::Failed)),
                outcome,
            )
        }
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

// ---- one reconcile of a node ----

/// Next look while a gate's attempt runs: a check pod or a query are not watched.
pub const CHECK_RECHECK: Duration = Duration::from_secs(2);
/// Next look while a guard waits (the pod and node watches usually come first).
pub const GUARD_RECHECK: Duration = Duration::from_secs(5);
/// Next look while the policy holds a node (a freed slot or a policy change come first).
pub const POLICY_RECHECK: Duration = Duration::from_secs(30);
/// Next look at a node whose upgrade waits for a module load or a device plugin.
pub const UPGRADE_RECHECK: Duration = Duration::from_secs(60);

/// Whether a node has anything to move or an upgrade to follow, from the facts of each
/// Module on it (device-plugin facts unused): a node without is not read afresh.
pub fn has_work<'a>(modules: impl IntoIterator<Item = &'a NodeModuleFacts>) -> bool {
    modules.into_iter().any(|facts| {
        facts.progress.is_some()
            || !matches!(
                label_action(&facts.labels, facts.module_loaded, false),
                TableAction::Nothing | TableAction::OutsideTable
            )
    })
}

/// A node of the fleet the slots are counted over: its name and the facts of each Module
/// on it (device-plugin facts unused).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetNode {
    /// The node's name.
    pub name: String,
    /// The facts of each Module on it.
    pub modules: Vec<NodeModuleFacts>,
    /// It carries a campaign's drain: it holds its slot until it is uncordoned, after its
    /// last step.
    pub draining: bool,
    /// Since when its Ready condition is not `True` (`None` while Ready).
    pub not_ready_since: Option<Timestamp>,
}

/// Whether a node NotReady since `since` has stayed so past the policy's
/// `notReadyTimeout` at `now`: it neither starts an upgrade nor holds a slot.
pub fn stalled(since: Option<Timestamp>, policy: &UpgradePolicy, now: Timestamp) -> bool {
    since.is_some_and(|since| {
        now.duration_since(since).as_secs() >= policy.not_ready_timeout_seconds as i64
    })
}

/// Whether a node stays out of line: NotReady past `notReadyTimeout`, or NotReady at all
/// once its upgrade gave up its slot (it takes one again only once Ready).
fn out_of_line(
    not_ready_since: Option<Timestamp>,
    modules: &[NodeModuleFacts],
    policy: &UpgradePolicy,
    now: Timestamp,
) -> bool {
    stalled(not_ready_since, policy, now) || (not_ready_since.is_some() && released(modules))
}

/// Whether a Module's upgrade on the node gave up its slot.
fn released(modules: &[NodeModuleFacts]) -> bool {
    modules.iter().any(|facts| {
        facts
            .progress
            .as_ref()
            .is_some_and(|p| p.released_at.is_some())
    })
}

/// Where each node of `fleet` stands at `now`, each under the policy that governs it.
pub fn standings(
    fleet: &[FleetNode],
    policies: &Policies,
    campaigns: &Campaigns,
    now: Timestamp,
) -> Vec<(String, Standing)> {
    fleet
        .iter()
        .map(|node| {
            let policy = policies.policy_for(&node.name);
            let standing = if out_of_line(node.not_ready_since, &node.modules, &policy, now) {
                Standing::Held
            } else if node.draining && !released(&node.modules) {
                Standing::Upgrading
            } else {
                standing(&node.modules, policy.require_pull_request, campaigns)
            };
            (node.name.clone(), standing)
        })
        .collect()
}

/// The queued nodes a freed slot lets start, in name order: those [`slot`] finds a slot
/// for, each under its own policy. They are looked at when a node's last upgrade ends,
/// rather than at their next policy recheck.
pub fn next_in_line(fleet: &[(String, Standing)], policies: &Policies) -> Vec<String> {
    let mut queued: Vec<&String> = fleet
        .iter()
        .filter(|(_, standing)| *standing == Standing::Queued)
        .map(|(name, _)| name)
        .collect();
    queued.sort();
    queued
        .into_iter()
        .filter(|node| {
            slot(node, Standing::Queued, fleet, &policies.policy_for(node)) == Slot::Free
        })
        .cloned()
        .collect()
}

/// Everything one reconcile of a node decides on.
#[derive(Clone, Debug, Default)]
pub struct NodeInputs {
    /// The node's name.
    pub node: String,
    /// Each Module on the node, as read afresh, with its facts (device-plugin pods as the
    /// cache has them).
    pub modules: Vec<(ModuleKey, NodeModuleFacts)>,
    /// The `GitSync`s: the node's policy and sync.
    pub policies: Policies,
    /// Every node, for the slots.
    pub fleet: Vec<FleetNode>,
    /// `fleet` is as the API server listed it ([`Confirm::Slots`]), not the cache.
    pub fleet_listed: bool,
    /// Per Module, whether the API server listed a device-plugin pod of it on the node
    /// ([`Confirm::DevicePluginPods`]).
    pub device_plugin_pods_listed: BTreeMap<ModuleKey, bool>,
    /// The upgrade campaigns.
    pub campaigns: Campaigns,
    /// The node's drain state (`capstan.dev/drain`).
    pub drain: Option<DrainState>,
    /// The node's cordon.
    pub cordon: Cordon,
    /// Since when the node's Ready condition is not `True` (`None` while Ready).
    pub not_ready_since: Option<Timestamp>,
    /// Per Module, what the gate attempt its progress keeps was seen to do.
    pub seen: BTreeMap<ModuleKey, Seen>,
}

/// What a node's decision rests on that the caches cannot be trusted with: the reconciler
/// reads it from the API server, adds it to the [`NodeInputs`] and decides again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Confirm {
    /// The node is about to start its upgrade: count the slots on the nodes as the API
    /// server has them (a cache that missed another node's start, after a dropped watch,
    /// would let two nodes into one slot).
    Slots,
    /// A W removal or the "device plugin stopped" step of these Modules rests on no
    /// device-plugin pod of theirs being on the node (a cache may not have seen a new pod
    /// yet).
    DevicePluginPods(Vec<ModuleKey>),
}

/// The decision for one Module of the node, with the facts it was made on.
#[derive(Clone, Debug, PartialEq)]
pub struct ModuleDecision {
    /// The Module.
    pub key: ModuleKey,
    /// Its facts, confirmed ones included.
    pub facts: NodeModuleFacts,
    /// The decision.
    pub decision: Decision,
}

/// What one reconcile of a node writes, in order: the records of the steps reached (each
/// with its Events when new), then the node's labels and annotations (see [`node_patch`]),
/// then the announcements of new policy waits; and when to look again.
#[derive(Clone, Debug, PartialEq)]
pub struct NodePlan {
    /// The gate the Modules were decided under.
    pub gate: Gate,
    /// Each Module's decision, in Module order.
    pub modules: Vec<ModuleDecision>,
    /// The steps reached.
    pub records: Vec<StepRecord>,
    /// The new policy waits.
    pub waits: Vec<WaitEvent>,
    /// The drain this reconcile starts or ends on the node.
    pub drain: Option<DrainChange>,
    /// The records of upgrades that give up their slot now, the node having stayed
    /// NotReady past `notReadyTimeout`; written before the node's patch, which marks them.
    pub released: Vec<HistoryRecordSpec>,
    /// The gate attempts that ended, recorded before the node's patch.
    pub checks: Vec<GateRecord>,
    /// The check pods to create (the attempts kept in the node's annotation whose pod is
    /// not there).
    pub check_pods: Vec<CheckPod>,
    /// When to look at the node again (`None`: on its next change).
    pub next_look: Option<Duration>,
}

/// A check pod a gate's attempt runs on the node.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckPod {
    /// The Module whose move it checks.
    pub key: ModuleKey,
    /// The attempt.
    pub run: guard::CheckRun,
    /// The pod's spec, from the gate.
    pub spec: capstan_api::PodCheck,
}

/// What holds new starts on `node` at `now` beyond its own labels: a pause, a failed gate
/// on a node of the same `GitSync`, closed windows, or canary nodes still under way.
pub fn rollout_hold(
    inputs: &NodeInputs,
    policy: &UpgradePolicy,
    window: Option<WindowState>,
) -> Option<PolicyWait> {
    let rollout = &policy.rollout;
    let node = inputs.node.as_str();
    let halted = rollout_halted(inputs);
    let canary_ahead = rollout.canary.as_ref().is_some_and(|canary| {
        !canary.nodes.iter().any(|n| n == node)
            && inputs.fleet.iter().any(|other| {
                canary.nodes.contains(&other.name)
                    && other.modules.iter().any(|facts| {
                        facts.progress.as_ref().is_some_and(|p| p.failed.is_none())
                            || pending_move(&facts.labels).is_some()
                    })
            })
    });
    if rollout.paused {
        Some(PolicyWait::Paused)
    } else if halted {
        Some(PolicyWait::Halted)
    } else if matches!(window, Some(WindowState::Closed { .. })) {
        Some(PolicyWait::Window)
    } else if canary_ahead {
        Some(PolicyWait::Canary)
    } else {
        None
    }
}

/// Whether a gate failed on a node of the `GitSync` that applies the node `inputs`
/// describe (itself included): its rollout is halted.
pub fn rollout_halted(inputs: &NodeInputs) -> bool {
    let node = inputs.node.as_str();
    let sync = inputs.policies.sync_name(node);
    let failed =
        |facts: &NodeModuleFacts| facts.progress.as_ref().is_some_and(|p| p.failed.is_some());
    inputs.modules.iter().any(|(_, facts)| failed(facts))
        || inputs.fleet.iter().any(|other| {
            other.name != node
                && inputs.policies.sync_name(&other.name) == sync
                && other.modules.iter().any(failed)
        })
}

/// The guardrails over `key`'s move on `node` under `policy`, with what its attempt was
/// seen to do.
pub fn guardrails_of(
    policy: &UpgradePolicy,
    node: &str,
    key: &ModuleKey,
    seen: Option<&Seen>,
) -> Guardrails {
    let rollout = &policy.rollout;
    let module = key.to_string();
    Guardrails {
        before: guard::checks(rollout, &module, GateWhen::Before),
        after: guard::checks(rollout, &module, GateWhen::After),
        soak: rollout
            .canary
            .as_ref()
            .filter(|canary| canary.nodes.iter().any(|n| n == node) && canary.soak_seconds > 0)
            .map(|canary| Duration::from_secs(canary.soak_seconds)),
        seen: seen.cloned(),
    }
}

/// A drain a node's reconcile starts or ends, with its record (written before the node's
/// patch, which carries the change: see [`start_patch`] and [`end_patch`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DrainChange {
    /// Start or end.
    pub step: DrainStep,
    /// The state started, or the one ended.
    pub state: DrainState,
    /// Its record.
    pub record: DrainRecord,
}

/// The drain change of a node after its Modules' decisions: one starts when an upgrade
/// under a campaign runs and the node has no drain state; one ends when the node has a
/// drain state and no upgrade under a campaign runs any more.
pub fn drain_change(
    inputs: &NodeInputs,
    modules: &[ModuleDecision],
    now: Timestamp,
) -> Option<DrainChange> {
    // The drain ends once the write of the last step is in: a reconcile that reaches it
    // still sees its upgrade in the facts, and the next one uncordons.
    let keep_cordoned =
        inputs.policies.policy_for(&inputs.node).rollout.failed_node == FailedNode::Cordoned;
    let running = |progress: Option<&Progress>| {
        progress
            .filter(|p| p.keeps_drain(keep_cordoned) && !checking_before(p))
            .cloned()
    };
    let draining = modules.iter().find_map(|m| {
        running(m.decision.progress.as_ref()).or_else(|| running(m.facts.progress.as_ref()))
    });
    let node = inputs.node.as_str();
    match (&draining, &inputs.drain) {
        (Some(progress), None) => {
            let campaign = inputs
                .campaigns
                .get(progress.to.as_deref())
                .map(|c| c.name.clone())
                .unwrap_or_default();
            let state = DrainState {
                to: progress.to.clone(),
                campaign,
                revision: progress.revision.clone(),
                pull_request: progress.pull_request,
                cordoned_at: now,
                was_cordoned: inputs.cordon.unschedulable,
                drained_at: None,
            };
            let record =
                super::drain::record(&inputs.policies, node, &state, DrainStep::Cordoned, now);
            Some(DrainChange {
                step: DrainStep::Cordoned,
                state,
                record,
            })
        }
        (None, Some(state)) => Some(DrainChange {
            step: DrainStep::Uncordoned,
            state: state.clone(),
            record: super::drain::record(&inputs.policies, node, state, DrainStep::Uncordoned, now),
        }),
        _ => None,
    }
}

/// Whether `progress` is still in its checks before the start: its drain has not begun.
fn checking_before(progress: &Progress) -> bool {
    progress
        .check
        .as_ref()
        .is_some_and(|run| run.when == GateWhen::Before)
}

/// The decision of one reconcile of a node.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeDecision {
    /// Read this from the API server first, then decide again.
    Confirm(Confirm),
    /// Write the plan (boxed: it is far larger than a confirmation).
    Act(Box<NodePlan>),
}

/// The decision for the node `inputs` describe, at `now`. It asks for each confirmation
/// once: [`Confirm::Slots`] while the fleet is the cache's and the node would start, then
/// [`Confirm::DevicePluginPods`] for the Modules not listed yet whose decision rests on
/// their device plugin being gone; so a reconcile decides at most three times.
pub fn decide_node(inputs: &NodeInputs, now: Timestamp) -> NodeDecision {
    let node = inputs.node.as_str();
    let policies = &inputs.policies;
    let policy = policies.policy_for(node);
    let own_facts: Vec<NodeModuleFacts> = inputs.modules.iter().map(|(_, f)| f.clone()).collect();
    if out_of_line(inputs.not_ready_since, &own_facts, &policy, now) {
        return NodeDecision::Act(Box::new(stalled_plan(inputs, now)));
    }
    let own = if inputs.drain.is_some() && !released(&own_facts) {
        Standing::Upgrading
    } else {
        standing(&own_facts, policy.require_pull_request, &inputs.campaigns)
    };
    let slot = slot(
        node,
        own,
        &standings(&inputs.fleet, policies, &inputs.campaigns, now),
        &policy,
    );
    if own == Standing::Queued && slot == Slot::Free && !inputs.fleet_listed {
        return NodeDecision::Confirm(Confirm::Slots);
    }
    let window =
        (!policy.rollout.windows.is_empty()).then(|| window::state(&policy.rollout.windows, now));
    let gate = Gate {
        slot,
        require_pull_request: policy.require_pull_request,
        sync_applying: policies.applying(node),
        campaigns: inputs.campaigns.clone(),
        drained: inputs.drain.as_ref().is_some_and(DrainState::drained),
        hold: rollout_hold(inputs, &policy, window),
        window,
    };
    let mut unconfirmed = Vec::new();
    let mut modules = Vec::new();
    for (key, facts) in &inputs.modules {
        let listed = inputs.device_plugin_pods_listed.get(key);
        let facts = NodeModuleFacts {
            device_plugin_pod_remains: facts.device_plugin_pod_remains || listed == Some(&true),
            guardrails: guardrails_of(&policy, node, key, inputs.seen.get(key)),
            ..facts.clone()
        };
        let decision = decide(&facts, &gate, now);
        if listed.is_none() && rests_on_device_plugin_gone(&facts, &decision) {
            unconfirmed.push(key.clone());
        }
        modules.push(ModuleDecision {
            key: key.clone(),
            facts,
            decision,
        });
    }
    if !unconfirmed.is_empty() {
        return NodeDecision::Confirm(Confirm::DevicePluginPods(unconfirmed));
    }
    let records = modules
        .iter()
        .filter_map(|m| {
            let step = m.decision.step.as_ref()?;
            Some(step_record(policies, node, &m.key, step, now))
        })
        .collect();
    let waits = modules
        .iter()
        .filter_map(|m| wait_event(policies, node, &m.key, &m.facts, &m.decision, &gate))
        .collect();
    let checks = modules
        .iter()
        .filter_map(|m| {
            let outcome = m.decision.check.as_ref()?;
            let progress = m.decision.progress.as_ref().or(m.facts.progress.as_ref())?;
            Some(gate_record(policies, node, &m.key, progress, outcome, now))
        })
        .collect();
    let check_pods = modules
        .iter()
        .filter_map(|m| check_pod(m, &inputs.seen))
        .collect();
    let next_look = next_look(&modules);
    // An upgrading node that stops being Ready is looked at again when its timeout is up:
    // a node whose kubelet is gone sends no change.
    let next_look = match inputs.not_ready_since {
        Some(since) if own == Standing::Upgrading => {
            let timeout = Duration::from_secs(policy.not_ready_timeout_seconds);
            let waited = Duration::try_from(now.duration_since(since)).unwrap_or_default();
            let left = timeout.saturating_sub(waited).max(GUARD_RECHECK);
            Some(next_look.map_or(left, |look| look.min(left)))
        }
        _ => next_look,
    };
    let drain = drain_change(inputs, &modules, now);
    NodeDecision::Act(Box::new(NodePlan {
        gate,
        modules,
        records,
        waits,
        drain,
        released: Vec::new(),
        checks,
        check_pods,
        next_look,
    }))
}

/// The check pod `m`'s attempt needs: the attempt its node keeps, of a pod gate, seen
/// without its pod (an attempt begun by this decision gets its pod once it is written, so
/// that a pod never outlives a crash between the two).
fn check_pod(m: &ModuleDecision, seen: &BTreeMap<ModuleKey, Seen>) -> Option<CheckPod> {
    let run = m.decision.progress.as_ref()?.check.as_ref()?;
    let kept = m.facts.progress.as_ref()?.check.as_ref()?;
    if run != kept || seen.get(&m.key) != Some(&Seen::Absent) {
        return None;
    }
    let checks = match run.when {
        GateWhen::Before => &m.facts.guardrails.before,
        GateWhen::After => &m.facts.guardrails.after,
    };
    let check = checks.iter().find(|check| check.name == run.name)?;
    match &check.kind {
        guard::CheckKind::Pod(spec) => Some(CheckPod {
            key: m.key.clone(),
            run: run.clone(),
            spec: spec.clone(),
        }),
        _ => None,
    }
}

/// The plan for a node NotReady past `notReadyTimeout`: nothing moves on it; an upgrade
/// that holds a slot gives it up, recorded, so that the rest of the fleet moves on. It
/// takes a slot again, in line, once the node is Ready.
fn stalled_plan(inputs: &NodeInputs, now: Timestamp) -> NodePlan {
    let node = inputs.node.as_str();
    let policies = &inputs.policies;
    let since = inputs.not_ready_since.unwrap_or(now);
    let mut released = Vec::new();
    let modules = inputs
        .modules
        .iter()
        .map(|(key, facts)| {
            let mut progress = facts.progress.clone();
            if let Some(p) = progress.as_mut().filter(|p| p.holds_slot()) {
                p.released_at = Some(now);
                released.push(records::release_record(
                    policies,
                    node,
                    key,
                    p,
                    records::Release::NotReady(since),
                    now,
                ));
            }
            ModuleDecision {
                key: key.clone(),
                facts: facts.clone(),
                decision: Decision {
                    outcome: Outcome::Nothing,
                    step: None,
                    progress,
                    announce: false,
                    check: None,
                },
            }
        })
        .collect();
    NodePlan {
        gate: Gate::default(),
        modules,
        records: Vec::new(),
        waits: Vec::new(),
        drain: None,
        released,
        checks: Vec::new(),
        check_pods: Vec::new(),
        next_look: None,
    }
}

/// Whether `decision` removes W or records the device plugin stopped on the word of
/// `facts` that no device-plugin pod remains: the module goes only once its device plugin
/// is gone.
pub fn rests_on_device_plugin_gone(facts: &NodeModuleFacts, decision: &Decision) -> bool {
    let unloads = decision.outcome == Outcome::Write(LabelWrite::RemoveWorkerPod);
    let stopped = decision
        .step
        .as_ref()
        .is_some_and(|s| s.step == UpgradeStep::DevicePluginStopped);
    (unloads || stopped) && !facts.device_plugin_pod_remains
}

/// When to look at a node again after its decisions: soon while a guard waits, later while
/// the policy or the sync holds a move, at the latest after a while during an upgrade (the
/// watches usually come first), else on its next change (`None`).
pub fn next_look(modules: &[ModuleDecision]) -> Option<Duration> {
    let waits = |kind: fn(&Wait) -> bool| {
        modules.iter().any(|m| match &m.decision.outcome {
            Outcome::Wait(wait) => kind(wait),
            _ => false,
        })
    };
    if waits(|wait| matches!(wait, Wait::Check)) {
        Some(CHECK_RECHECK)
    } else if waits(|wait| matches!(wait, Wait::Guard(_))) {
        Some(GUARD_RECHECK)
    } else if waits(|wait| matches!(wait, Wait::Policy(_) | Wait::SyncApplying | Wait::Drain)) {
        Some(POLICY_RECHECK)
    } else if modules.iter().any(|m| m.decision.progress.is_some()) {
        Some(UPGRADE_RECHECK)
    } else {
        None
    }
}

/// The JSON merge patch of a node's labels and upgrade annotations after `modules`'
/// decisions, conditional on the `resource_version` they were made on; `annotations` are
/// the node's. A step whose record was found written before (`recorded`, by Module) keeps
/// that record's time. `None` when nothing changes.
pub fn node_patch(
    resource_version: &str,
    annotations: &BTreeMap<String, String>,
    modules: &[ModuleDecision],
    recorded: &BTreeMap<ModuleKey, Timestamp>,
    drain: Option<(Map<String, Value>, Option<Value>)>,
) -> Option<Value> {
    let mut labels = Map::new();
    let mut changed = Map::new();
    let mut spec = None;
    if let Some((drain_annotations, drain_spec)) = drain {
        changed.extend(drain_annotations);
        spec = drain_spec;
    }
    for m in modules {
        let key = &m.key;
        if let Outcome::Write(write) = &m.decision.outcome {
            let (label, value) = match write {
                LabelWrite::SetWorkerPod(version) => {
                    (key.version_worker_pod_label(), json!(version))
                }
                LabelWrite::RemoveWorkerPod => (key.version_worker_pod_label(), Value::Null),
                LabelWrite::SetDevicePlugin(version) => {
                    (key.version_device_plugin_label(), json!(version))
                }
                LabelWrite::RemoveDevicePlugin => (key.version_device_plugin_label(), Value::Null),
            };
            labels.insert(label, value);
        }
        let annotation = key.upgrade_annotation();
        let wanted = m.decision.progress.as_ref().map(|progress| {
            let step_at = recorded.get(key).copied().or(progress.step_at);
            Progress {
                step_at,
                ..progress.clone()
            }
            .to_annotation()
        });
        if annotations.get(&annotation) != wanted.as_ref() {
            changed.insert(annotation, wanted.map_or(Value::Null, Value::String));
        }
    }
    if labels.is_empty() && changed.is_empty() && spec.is_none() {
        return None;
    }
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(resource_version));
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if !changed.is_empty() {
        metadata.insert("annotations".into(), Value::Object(changed));
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(spec) = spec {
        patch["spec"] = spec;
    }
    Some(patch)
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

    #[test]
    fn an_empty_version_label_counts_as_missing() {
        use LabelWrite::*;
        use TableAction::*;
        let key = ModuleKey::new("kmm-demo", "my-kmod").unwrap();
        let node = |m: Option<&str>, w: Option<&str>, d: Option<&str>| {
            let mut labels = BTreeMap::from([("role".to_string(), "gpu".to_string())]);
            for (label, value) in [
                (key.version_module_label(), m),
                (key.version_worker_pod_label(), w),
                (key.version_device_plugin_label(), d),
            ] {
                if let Some(value) = value {
                    labels.insert(label, value.to_string());
                }
            }
            VersionLabels::of(&key, &labels)
        };
        // (scenario, labels on the node, row, action with no .ready and no pod, move)
        let rows = [
            (
                "M empty alone: an unlabelled node",
                node(Some(""), None, None),
                Some(1),
                Nothing,
                None,
            ),
            (
                "M emptied while W and D name v1: the device plugin goes (row 2)",
                node(Some(""), Some("v1"), Some("v1")),
                Some(2),
                Write(RemoveDevicePlugin),
                Some((v("v1"), None)),
            ),
            (
                "M emptied, D gone: the module is unloaded (row 3)",
                node(Some(""), Some("v1"), None),
                Some(3),
                Write(RemoveWorkerPod),
                Some((v("v1"), None)),
            ),
            (
                "W and D empty under M: row 4, W is set",
                node(Some("v2"), Some(""), Some("")),
                Some(4),
                Write(SetWorkerPod("v2".into())),
                Some((None, v("v2"))),
            ),
            (
                "every label empty: nothing",
                node(Some(""), Some(""), Some("")),
                Some(1),
                Nothing,
                None,
            ),
        ];
        for (scenario, labels, row, action, moves) in rows {
            assert_eq!(table_row(&labels), row, "{scenario}");
            assert_eq!(label_action(&labels, false, false), action, "{scenario}");
            assert_eq!(pending_move(&labels), moves, "{scenario}");
        }
        assert!(node(Some(""), Some(""), Some("")).is_empty());
    }

    fn open() -> Gate {
        Gate {
            slot: Slot::Free,
            require_pull_request: false,
            sync_applying: false,
            ..Gate::default()
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
                    guardrails: Guardrails::default(),
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
            ..Gate::default()
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
            ..Gate::default()
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
            ..Gate::default()
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
            ..UpgradePolicy::default()
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
        assert_eq!(
            standing([&settled], false, &Campaigns::default()),
            Standing::Settled
        );
        assert_eq!(
            standing([&settled, &queued], false, &Campaigns::default()),
            Standing::Queued
        );
        assert_eq!(
            standing([&queued], true, &Campaigns::default()),
            Standing::Held
        );
        assert_eq!(
            standing([&queued, &upgrading], true, &Campaigns::default()),
            Standing::Upgrading
        );
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
            drain: true,
            released_at: Some("2026-03-01T10:20:00Z".parse().unwrap()),
            ..Progress::default()
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

    // ---- one reconcile of a node ----

    fn key(name: &str) -> ModuleKey {
        ModuleKey::new("kmm-demo", name).expect("a key")
    }

    #[test]
    fn a_node_has_work_while_its_labels_call_for_a_write_or_an_upgrade_runs() {
        let upgrading = NodeModuleFacts {
            labels: labels("v2", "v2", "v2"),
            progress: Some(Progress {
                started_at: Some(Timestamp::UNIX_EPOCH),
                ..Progress::default()
            }),
            ..NodeModuleFacts::default()
        };
        let facts = |m: &str, w: &str, d: &str, loaded: bool| NodeModuleFacts {
            labels: labels(m, w, d),
            module_loaded: loaded,
            ..NodeModuleFacts::default()
        };
        // (name, Modules, has work)
        let rows = [
            ("no Module", vec![], false),
            ("settled", vec![facts("v1", "v1", "v1", true)], false),
            ("relabelled", vec![facts("v2", "v1", "v1", true)], true),
            (
                "W to set while the old module is loaded: a guard to watch",
                vec![facts("v2", "", "", true)],
                true,
            ),
            (
                "outside the table",
                vec![facts("v2", "", "v1", false)],
                false,
            ),
            ("an upgrade to follow", vec![upgrading], true),
        ];
        for (name, modules, want) in rows {
            assert_eq!(has_work(&modules), want, "{name}");
        }
    }

    fn fleet_node(name: &str, modules: Vec<NodeModuleFacts>) -> FleetNode {
        FleetNode {
            name: name.to_string(),
            modules,
            ..FleetNode::default()
        }
    }

    /// worker-1, with nothing to move.
    fn quiet_fleet() -> Vec<FleetNode> {
        vec![fleet_node("worker-1", vec![])]
    }

    /// worker-1, upgrading.
    fn busy_fleet() -> Vec<FleetNode> {
        vec![fleet_node("worker-1", vec![upgrading_facts()])]
    }

    fn relabelled() -> NodeModuleFacts {
        let mut node = Node::running("v1");
        node.relabel("v2", stamp("c2", Some(2)));
        node.facts
    }

    fn upgrading_facts() -> NodeModuleFacts {
        NodeModuleFacts {
            progress: Some(Progress {
                from: v("v1"),
                to: v("v2"),
                started_at: Some(Timestamp::UNIX_EPOCH),
                ..Progress::default()
            }),
            ..relabelled()
        }
    }

    /// worker-2, relabelled from v1 to v2, its device plugin stopped per the cache: D is
    /// gone, no device-plugin pod cached.
    fn device_plugin_stopped() -> NodeModuleFacts {
        NodeModuleFacts {
            labels: labels("v2", "v1", ""),
            device_plugin_pod_remains: false,
            device_plugin_running: false,
            ..upgrading_facts()
        }
    }

    fn inputs(own: NodeModuleFacts, fleet: Vec<FleetNode>) -> NodeInputs {
        NodeInputs {
            node: "worker-2".into(),
            modules: vec![(key("my-kmod"), own)],
            policies: Policies::default(),
            fleet,
            fleet_listed: false,
            device_plugin_pods_listed: BTreeMap::new(),
            ..NodeInputs::default()
        }
    }

    /// A node upgrading, its slot given up at `released`.
    fn released_facts(released: &str) -> NodeModuleFacts {
        let mut facts = device_plugin_stopped();
        if let Some(progress) = facts.progress.as_mut() {
            progress.released_at = Some(released.parse().unwrap());
        }
        facts
    }

    #[test]
    fn a_node_not_ready_past_its_timeout_gives_up_its_slot_and_takes_one_again_once_ready() {
        let now: Timestamp = "2026-03-01T12:00:00Z".parse().unwrap();
        let minutes_ago = |m: i64| Some(now - jiff::SignedDuration::from_mins(m));
        let not_ready = |mut inputs: NodeInputs, since: Option<Timestamp>| {
            inputs.not_ready_since = since;
            inputs.fleet_listed = true;
            inputs
                .device_plugin_pods_listed
                .insert(key("my-kmod"), false);
            inputs
        };
        // (name, inputs, released now, whether the upgrade's progress afterwards holds a
        // slot)
        let rows = [
            (
                "NotReady for a while: it keeps its slot and goes on",
                not_ready(
                    inputs(device_plugin_stopped(), quiet_fleet()),
                    minutes_ago(3),
                ),
                false,
                Some(true),
            ),
            (
                "NotReady past notReadyTimeout (10m): the slot is given up, recorded",
                not_ready(
                    inputs(device_plugin_stopped(), quiet_fleet()),
                    minutes_ago(10),
                ),
                true,
                Some(false),
            ),
            (
                "given up and still NotReady: nothing more",
                not_ready(
                    inputs(released_facts("2026-03-01T11:50:00Z"), quiet_fleet()),
                    minutes_ago(1),
                ),
                false,
                Some(false),
            ),
            (
                "Ready again, a slot free: it takes it and goes on",
                not_ready(
                    inputs(released_facts("2026-03-01T11:50:00Z"), quiet_fleet()),
                    None,
                ),
                false,
                Some(true),
            ),
            (
                "Ready again, every slot taken: it waits in line",
                not_ready(
                    inputs(released_facts("2026-03-01T11:50:00Z"), busy_fleet()),
                    None,
                ),
                false,
                Some(false),
            ),
        ];
        for (name, inputs, releases, holds) in rows {
            let NodeDecision::Act(plan) = decide_node(&inputs, now) else {
                panic!("{name}: asks to confirm")
            };
            assert_eq!(plan.released.len(), usize::from(releases), "{name}");
            let progress = plan.modules[0].decision.progress.as_ref();
            assert_eq!(progress.map(Progress::holds_slot), holds, "{name}");
            if releases {
                let record = &plan.released[0];
                assert_eq!(record.type_, capstan_api::RecordType::SlotReleased);
                assert_eq!(record.step.as_deref(), Some("not-ready"), "{name}");
                assert_eq!(plan.modules[0].decision.outcome, Outcome::Nothing);
            }
        }
        // The rest of the fleet: a node past its timeout, or NotReady after giving its slot
        // up, takes no place in line; Ready again, it queues in name order.
        let policies = Policies::default();
        let node = |since: Option<Timestamp>, facts: NodeModuleFacts| FleetNode {
            not_ready_since: since,
            ..fleet_node("worker-1", vec![facts])
        };
        for (name, fleet_node, want) in [
            (
                "upgrading, Ready",
                node(None, upgrading_facts()),
                Standing::Upgrading,
            ),
            (
                "upgrading, NotReady 3m",
                node(minutes_ago(3), upgrading_facts()),
                Standing::Upgrading,
            ),
            (
                "upgrading, NotReady 10m",
                node(minutes_ago(10), upgrading_facts()),
                Standing::Held,
            ),
            (
                "given up, NotReady",
                node(minutes_ago(1), released_facts("2026-03-01T11:50:00Z")),
                Standing::Held,
            ),
            (
                "given up, Ready",
                node(None, released_facts("2026-03-01T11:50:00Z")),
                Standing::Queued,
            ),
        ] {
            let standing = standings(&[fleet_node], &policies, &Campaigns::default(), now);
            assert_eq!(standing[0].1, want, "{name}");
        }
    }

    #[test]
    fn what_a_node_confirms_with_the_api_server_before_acting() {
        use LabelWrite::*;
        #[derive(Debug, PartialEq)]
        enum Want {
            Confirm(Confirm),
            Act(Outcome),
        }
        let listed = |mut inputs: NodeInputs, fleet: Vec<FleetNode>| {
            inputs.fleet = fleet;
            inputs.fleet_listed = true;
            inputs
        };
        let pods_listed = |mut inputs: NodeInputs, remain: bool| {
            inputs
                .device_plugin_pods_listed
                .insert(key("my-kmod"), remain);
            inputs
        };
        // (name, inputs, want)
        let rows = [
            (
                "a settled node acts at once",
                inputs(Node::running("v1").facts, quiet_fleet()),
                Want::Act(Outcome::Nothing),
            ),
            (
                "about to start by the cache: the slots are counted on a live list",
                inputs(relabelled(), quiet_fleet()),
                Want::Confirm(Confirm::Slots),
            ),
            (
                "the live list agrees: it starts",
                listed(inputs(relabelled(), quiet_fleet()), quiet_fleet()),
                Want::Act(Outcome::Write(RemoveDevicePlugin)),
            ),
            (
                "the live list shows another node upgrading: it waits",
                listed(inputs(relabelled(), quiet_fleet()), busy_fleet()),
                Want::Act(Outcome::Wait(Wait::Policy(PolicyWait::Slot))),
            ),
            (
                "the cache shows the slot taken: it waits without a list",
                inputs(relabelled(), busy_fleet()),
                Want::Act(Outcome::Wait(Wait::Policy(PolicyWait::Slot))),
            ),
            (
                "an upgrading node holds its slot: no list",
                inputs(upgrading_facts(), busy_fleet()),
                Want::Act(Outcome::Write(RemoveDevicePlugin)),
            ),
            (
                "W removal on the cache's word: the pods are listed",
                inputs(device_plugin_stopped(), quiet_fleet()),
                Want::Confirm(Confirm::DevicePluginPods(vec![key("my-kmod")])),
            ),
            (
                "the list finds none: W goes",
                pods_listed(inputs(device_plugin_stopped(), quiet_fleet()), false),
                Want::Act(Outcome::Write(RemoveWorkerPod)),
            ),
            (
                "the list finds a pod the cache missed: W stays",
                pods_listed(inputs(device_plugin_stopped(), quiet_fleet()), true),
                Want::Act(Outcome::Wait(Wait::Guard(Guard::DevicePluginPodRemains))),
            ),
            (
                "the cache has a pod: W stays without a list",
                inputs(
                    NodeModuleFacts {
                        device_plugin_pod_remains: true,
                        ..device_plugin_stopped()
                    },
                    quiet_fleet(),
                ),
                Want::Act(Outcome::Wait(Wait::Guard(Guard::DevicePluginPodRemains))),
            ),
        ];
        let now: Timestamp = "2026-03-01T10:00:00Z".parse().unwrap();
        for (name, inputs, want) in rows {
            let got = match decide_node(&inputs, now) {
                NodeDecision::Confirm(confirm) => Want::Confirm(confirm),
                NodeDecision::Act(plan) => Want::Act(plan.modules[0].decision.outcome.clone()),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn a_plan_records_each_step_and_announces_each_new_wait() {
        let now: Timestamp = "2026-03-01T10:00:00Z".parse().unwrap();
        let mut inputs = inputs(device_plugin_stopped(), vec![]);
        inputs
            .device_plugin_pods_listed
            .insert(key("my-kmod"), false);
        let queued = NodeModuleFacts {
            stamp: stamp("c3", Some(3)),
            ..relabelled()
        };
        inputs.modules.push((key("other-kmod"), queued));
        let NodeDecision::Act(plan) = decide_node(&inputs, now) else {
            panic!("acts");
        };
        let steps: Vec<(&str, Option<&str>)> = plan
            .records
            .iter()
            .map(|r| (r.reason, r.spec.module.as_deref()))
            .collect();
        assert_eq!(steps, [("DevicePluginStopped", Some("kmm-demo/my-kmod"))]);
        // worker-2 holds a slot (my-kmod upgrading): other-kmod starts as well.
        assert!(plan.waits.is_empty());
        assert_eq!(
            plan.modules[1].decision.outcome,
            Outcome::Write(LabelWrite::RemoveDevicePlugin)
        );

        let mut queued = self::inputs(
            relabelled(),
            vec![fleet_node("worker-1", vec![upgrading_facts()])],
        );
        queued.fleet_listed = true;
        let NodeDecision::Act(plan) = decide_node(&queued, now) else {
            panic!("acts");
        };
        let waits: Vec<&str> = plan.waits.iter().map(|w| w.reason).collect();
        assert_eq!(waits, ["UpgradeQueued"]);
        assert!(plan.records.is_empty());
        assert_eq!(plan.next_look, Some(POLICY_RECHECK));
    }

    fn decided(outcome: Outcome, upgrading: bool) -> ModuleDecision {
        ModuleDecision {
            key: key("my-kmod"),
            facts: NodeModuleFacts::default(),
            decision: Decision {
                outcome,
                step: None,
                progress: upgrading.then(Progress::default),
                announce: false,
                check: None,
            },
        }
    }

    #[test]
    fn when_a_node_is_looked_at_again() {
        let guard = || decided(Outcome::Wait(Wait::Guard(Guard::ModuleStillLoaded)), true);
        let policy = || decided(Outcome::Wait(Wait::Policy(PolicyWait::Slot)), false);
        let applying = || decided(Outcome::Wait(Wait::SyncApplying), false);
        let upgrading = || decided(Outcome::Nothing, true);
        let settled = || decided(Outcome::Nothing, false);
        // (name, decisions, next look)
        let rows = [
            ("settled: on its next change", vec![settled()], None),
            (
                "a guard waits",
                vec![guard(), policy()],
                Some(GUARD_RECHECK),
            ),
            (
                "the policy holds it",
                vec![policy(), upgrading()],
                Some(POLICY_RECHECK),
            ),
            (
                "the sync writes a commit",
                vec![applying()],
                Some(POLICY_RECHECK),
            ),
            (
                "an upgrade waits for a load",
                vec![upgrading(), settled()],
                Some(UPGRADE_RECHECK),
            ),
        ];
        for (name, decisions, want) in rows {
            assert_eq!(next_look(&decisions), want, "{name}");
        }
    }

    #[test]
    fn the_nodes_a_freed_slot_wakes() {
        use Standing::*;
        let policies = |max: u32| {
            let mut sync = capstan_api::GitSync::new("fleet", Default::default());
            sync.status = Some(capstan_api::capstan::GitSyncStatus {
                policy: Some(policy(max)),
                ..Default::default()
            });
            Policies::of(vec![std::sync::Arc::new(sync)])
        };
        // (name, fleet, maxNodesInFlight, woken)
        let rows = [
            ("nobody waits", fleet(&[("worker-1", Settled)]), 1, vec![]),
            (
                "the first in name order",
                fleet(&[
                    ("worker-3", Queued),
                    ("worker-2", Queued),
                    ("worker-4", Held),
                ]),
                1,
                vec!["worker-2"],
            ),
            (
                "as many as there are free slots",
                fleet(&[
                    ("worker-3", Queued),
                    ("worker-2", Queued),
                    ("worker-1", Upgrading),
                ]),
                3,
                vec!["worker-2", "worker-3"],
            ),
            (
                "no free slot",
                fleet(&[("worker-3", Queued), ("worker-1", Upgrading)]),
                1,
                vec![],
            ),
            (
                "a limit of 0 counts as 1",
                fleet(&[("worker-3", Queued), ("worker-2", Queued)]),
                0,
                vec!["worker-2"],
            ),
        ];
        for (name, fleet, max, want) in rows {
            assert_eq!(next_in_line(&fleet, &policies(max)), want, "{name}");
            // The nodes woken are those the reconcile lets start.
            for (node, standing) in &fleet {
                if *standing == Queued {
                    let free = slot(node, Queued, &fleet, &policy(max)) == Slot::Free;
                    assert_eq!(want.contains(&node.as_str()), free, "{name}: {node}");
                }
            }
        }
    }

    #[test]
    fn the_node_patch_writes_labels_and_progress_together() {
        let my = key("my-kmod");
        let at: Timestamp = "2026-03-01T10:00:00Z".parse().unwrap();
        let before: Timestamp = "2026-03-01T09:59:58Z".parse().unwrap();
        let progress = Progress {
            from: v("v1"),
            to: v("v2"),
            started_at: Some(before),
            step: Some(DevicePluginStopped),
            step_at: Some(at),
            ..Progress::default()
        };
        let decision = |outcome: Outcome, progress: Option<Progress>| ModuleDecision {
            key: my.clone(),
            facts: NodeModuleFacts::default(),
            decision: Decision {
                outcome,
                step: None,
                progress,
                announce: false,
                check: None,
            },
        };
        let kept = BTreeMap::from([(my.upgrade_annotation(), progress.to_annotation())]);
        let none = BTreeMap::new();
        let not_recorded = BTreeMap::new();
        let recorded = BTreeMap::from([(my.clone(), before)]);
        let annotation = |progress: &Progress| json!(progress.to_annotation());
        // (name, node's annotations, decision, recorded step times, want)
        let rows = [
            (
                "nothing changes",
                &kept,
                decision(Outcome::Nothing, Some(progress.clone())),
                &not_recorded,
                None,
            ),
            (
                "a label write and a new progress",
                &none,
                decision(
                    Outcome::Write(LabelWrite::RemoveWorkerPod),
                    Some(progress.clone()),
                ),
                &not_recorded,
                Some(json!({"metadata": {
                    "resourceVersion": "7",
                    "labels": {my.version_worker_pod_label(): null},
                    "annotations": {my.upgrade_annotation(): annotation(&progress)},
                }})),
            ),
            (
                "a step recorded before a restart keeps its record's time",
                &kept,
                decision(Outcome::Nothing, Some(progress.clone())),
                &recorded,
                Some(json!({"metadata": {
                    "resourceVersion": "7",
                    "annotations": {my.upgrade_annotation(): annotation(&Progress {
                        step_at: Some(before),
                        ..progress.clone()
                    })},
                }})),
            ),
            (
                "the upgrade ends: its progress goes",
                &kept,
                decision(
                    Outcome::Write(LabelWrite::SetDevicePlugin("v2".into())),
                    None,
                ),
                &not_recorded,
                Some(json!({"metadata": {
                    "resourceVersion": "7",
                    "labels": {my.version_device_plugin_label(): "v2"},
                    "annotations": {my.upgrade_annotation(): null},
                }})),
            ),
        ];
        for (name, annotations, decision, recorded, want) in rows {
            assert_eq!(
                node_patch("7", annotations, &[decision], recorded, None),
                want,
                "{name}"
            );
        }
    }
}
