//! Upgrade campaigns: an `UpgradeConfig` from Git rolls out one Module version
//! (`spec.desired.version`, a Module's `spec.moduleLoader.container.version`), no earlier
//! than `spec.upgradeAt`, and its `status.history` follows managed-upgrade-operator's
//! lifecycle so that MUO's dashboards and `kubectl get upgradeconfig` read the same.
//!
//! [`decide`] is one reconcile of a campaign, from its history entry for the desired
//! version and the tally of the nodes labelled with that version ([`NodeTally`]):
//!
//! | entry phase | facts | next entry | requeue |
//! | --- | --- | --- | --- |
//! | none | - | New (`precedingVersion` from the nodes) | at once |
//! | New | - | Pending | at once |
//! | Pending | now < `upgradeAt` | unchanged | at `upgradeAt` |
//! | Pending | now >= `upgradeAt` (however late) | Upgrading, `startTime` = now | 1 min |
//! | Upgrading | no node started, `upgradeWindow.timeOut` > 0 passed since `startTime` | Failed (`FailedUpgrade`) | none |
//! | Upgrading | no node started, `delayTrigger` passed since `startTime` | Upgrading, delay said once | 1 min |
//! | Upgrading | every labelled node finished its fourth step | Upgraded, `completeTime` | none |
//! | Upgrading | otherwise | Upgrading, steps as far as they go | 1 min |
//! | Upgraded, Failed | - | unchanged (final for the version) | none |
//!
//! A Pending or Upgrading entry without `precedingVersion` learns it from the nodes as
//! soon as they are relabelled.
//!
//! An unparsable `upgradeAt` keeps the campaign Pending, as MUO's validation does (capstan's
//! own validation refuses such a commit before it is applied).
//!
//! While Upgrading, the campaign's steps run as MUO's step runner runs them ([`run_steps`]):
//! in order, each step's condition created once (False, `startTime`), then True with
//! `completeTime` when done, the first step not done stopping the run; a new condition is
//! prepended, so `conditions[0]` is the step in progress. capstan's steps, with MUO's types:
//!
//! | condition type | done when |
//! | --- | --- |
//! | `UpgradeCommenced` | a node labelled with the version started its upgrade (`workerStartTime`) |
//! | `WorkerNodesUpgraded` | every node labelled with the version finished its fourth step (`workerCompleteTime`) |
//!
//! [`Campaigns`] is what the version-label controller reads of every campaign: a move to a
//! campaign's version is held until the campaign is Upgrading (and for good once it failed),
//! and a move under a started campaign drains its node first.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;

use super::upgrade::Progress;
pub use super::upgrade::gate::{CampaignGate, Campaigns};
use capstan_api::labels::{DRAIN_ANNOTATION, ModuleLabel};

use capstan_api::UpgradeWindow;
use capstan_api::upgrade_config::{
    ConditionStatus, UpgradeCondition, UpgradeHistory, UpgradePhase, condition_types,
};

pub mod reconciler;

/// How often an Upgrading campaign is looked at besides the node changes, as MUO does.
pub const UPGRADING_RECHECK: Duration = Duration::from_secs(60);

/// `type` of the condition MUO adds when an upgrade fails.
pub const FAILED_UPGRADE: &str = "FailedUpgrade";

/// Where the nodes labelled with a campaign's version stand, over every Module whose
/// `version-module` label names that version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTally {
    /// (node, Module) pairs whose `version-module` label is the version.
    pub labelled: usize,
    /// Of those, the ones whose upgrade runs (started, last step not reached).
    pub started: usize,
    /// Of those, the ones that run the version: internal labels caught up, no upgrade
    /// running, no drain left (the node uncordoned).
    pub finished: usize,
    /// The earliest start of the running upgrades.
    pub first_start: Option<Timestamp>,
    /// The version most of the labelled pairs leave (MUO's `precedingVersion`).
    pub preceding: Option<String>,
}

impl NodeTally {
    /// Every labelled pair runs the version, and there is at least one.
    pub fn all_finished(&self) -> bool {
        self.labelled > 0 && self.finished == self.labelled
    }
}

/// What one reconcile of a campaign is decided on.
#[derive(Clone, Debug, PartialEq)]
pub struct CampaignFacts<'a> {
    /// `spec.desired.version`.
    pub version: &'a str,
    /// `spec.upgradeAt`, `None` when it does not parse.
    pub upgrade_at: Option<Timestamp>,
    /// The history entry of the version.
    pub entry: Option<&'a UpgradeHistory>,
    /// The nodes labelled with the version.
    pub nodes: NodeTally,
}

/// What a campaign's reconcile tells people, besides its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CampaignEvent {
    /// Pending: it starts at `upgradeAt`.
    Scheduled(Timestamp),
    /// Upgrading: the moves to its version are released.
    Started,
    /// No node started `delayTrigger` minutes after the start.
    Delayed(u32),
    /// No node started within the upgrade window.
    Failed(u32),
    /// Every labelled node runs the version.
    Upgraded,
}

impl CampaignEvent {
    /// The Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            CampaignEvent::Scheduled(_) => "UpgradeScheduled",
            CampaignEvent::Started => "UpgradeStarted",
            CampaignEvent::Delayed(_) => "UpgradeDelayed",
            CampaignEvent::Failed(_) => "UpgradeFailed",
            CampaignEvent::Upgraded => "UpgradeCompleted",
        }
    }

    /// A `Warning` rather than `Normal` Event.
    pub fn warning(&self) -> bool {
        matches!(self, CampaignEvent::Delayed(_) | CampaignEvent::Failed(_))
    }

    /// The Event's message about the campaign rolling out `version`.
    pub fn message(&self, version: &str) -> String {
        match self {
            CampaignEvent::Scheduled(at) => {
                format!("the upgrade to {version} is held until {at}")
            }
            CampaignEvent::Started => {
                format!("the upgrade to {version} started: its nodes move in turn")
            }
            CampaignEvent::Delayed(minutes) => format!(
                "no node started its upgrade to {version} {minutes} minutes after the \
                 campaign began"
            ),
            CampaignEvent::Failed(minutes) => format!(
                "no node started its upgrade to {version} within the upgrade window of \
                 {minutes} minutes: the campaign failed and its moves stay held"
            ),
            CampaignEvent::Upgraded => {
                format!("every node labelled {version} runs it")
            }
        }
    }
}

/// One reconcile's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The entry to write in place of the version's (prepended when new); `None` when it
    /// stays as it is.
    pub entry: Option<UpgradeHistory>,
    /// The Event to record, once (it goes with the entry's write).
    pub event: Option<CampaignEvent>,
    /// `upgradeoperator_upgrade_window_breached`: set to 1 or reset to 0.
    pub window_breached: Option<bool>,
    /// When to look again besides the watches.
    pub requeue: Option<Duration>,
}

impl Decision {
    fn unchanged(requeue: Option<Duration>) -> Decision {
        Decision {
            entry: None,
            event: None,
            window_breached: None,
            requeue,
        }
    }
}

/// The log line of a campaign's reconcile that wrote `after` over `before` (its entry for
/// the version, `None` before the first): one line per phase change, and one when the
/// campaign is said delayed. `None` when the phase stayed and nothing is said. `campaign` is
/// `namespace/name`, `asked` the `, asked by <sha> (#<pr>)` of its commit.
pub fn phase_line(
    campaign: &str,
    before: Option<&UpgradeHistory>,
    after: &UpgradeHistory,
    event: Option<&CampaignEvent>,
    asked: &str,
) -> Option<String> {
    let version = &after.version;
    let from = before.map(|entry| entry.phase);
    if from == Some(after.phase) {
        return match event {
            Some(delayed @ CampaignEvent::Delayed(_)) => Some(format!(
                "campaign {campaign} still {:?}: {}{asked}",
                after.phase,
                delayed.message(version)
            )),
            _ => None,
        };
    }
    let what = match (after.phase, event) {
        (_, Some(event)) if !matches!(event, CampaignEvent::Delayed(_)) => event.message(version),
        (UpgradePhase::New, _) if after.preceding_version.is_empty() => {
            format!("a campaign for {version}")
        }
        (UpgradePhase::New, _) => {
            format!(
                "a campaign for {version}, its nodes leaving {}",
                after.preceding_version
            )
        }
        (UpgradePhase::Pending, _) => {
            format!("the upgrade to {version} is held until its upgradeAt, which does not parse")
        }
        (phase, _) => format!("the upgrade to {version} is {phase:?}"),
    };
    let change = match from {
        Some(from) => format!("{from:?} -> {:?}", after.phase),
        None => format!("{:?}", after.phase),
    };
    Some(format!("campaign {campaign} {change}: {what}{asked}"))
}

/// The log line of a campaign whose entry is `entry`, when it was Upgrading before
/// `started_at` (when this process's campaign controller started): it resumes after a
/// restart (or a change of leader). `None` for a campaign that is not Upgrading, or that
/// started upgrading under this process.
pub fn resumed_line(
    campaign: &str,
    entry: &UpgradeHistory,
    nodes: &NodeTally,
    started_at: Timestamp,
    asked: &str,
) -> Option<String> {
    let start = entry.start_time.as_ref()?.0;
    (entry.phase == UpgradePhase::Upgrading && start < started_at).then(|| {
        format!(
            "resumed campaign {campaign} after a restart: Upgrading to {} since {start}, {} of \
             {} labelled nodes done{asked}",
            entry.version, nodes.finished, nodes.labelled
        )
    })
}

fn minutes(minutes: u32) -> Duration {
    Duration::from_secs(u64::from(minutes) * 60)
}

fn time(at: Timestamp) -> Time {
    Time(at)
}

/// `true` when `d` has passed since `since` (strictly, as MUO's `isAfter`).
fn passed(since: Option<&Time>, d: Duration, now: Timestamp) -> bool {
    since.is_some_and(|since| since.0.checked_add(d).is_ok_and(|deadline| deadline < now))
}

/// The decision for a campaign at `now`, under the repository's upgrade window.
pub fn decide(facts: &CampaignFacts, window: &UpgradeWindow, now: Timestamp) -> Decision {
    let Some(entry) = facts.entry else {
        return Decision {
            entry: Some(UpgradeHistory {
                version: facts.version.to_string(),
                preceding_version: facts.nodes.preceding.clone().unwrap_or_default(),
                phase: UpgradePhase::New,
                conditions: Vec::new(),
                start_time: None,
                complete_time: None,
                worker_start_time: None,
                worker_complete_time: None,
            }),
            ..Decision::unchanged(Some(Duration::ZERO))
        };
    };
    // The nodes may be relabelled after the campaign's first look (by the same commit):
    // the version they leave is learnt as soon as they are.
    let learnt;
    let entry = match &facts.nodes.preceding {
        Some(preceding)
            if entry.preceding_version.is_empty()
                && matches!(entry.phase, UpgradePhase::Pending | UpgradePhase::Upgrading) =>
        {
            learnt = UpgradeHistory {
                preceding_version: preceding.clone(),
                ..entry.clone()
            };
            &learnt
        }
        _ => entry,
    };
    let mut decision = by_phase(facts, entry, window, now);
    if decision.entry.is_none() && facts.entry != Some(entry) {
        decision.entry = Some(entry.clone());
    }
    decision
}

/// The decision for a campaign with a history entry.
fn by_phase(
    facts: &CampaignFacts,
    entry: &UpgradeHistory,
    window: &UpgradeWindow,
    now: Timestamp,
) -> Decision {
    match entry.phase {
        UpgradePhase::New => Decision {
            entry: Some(UpgradeHistory {
                phase: UpgradePhase::Pending,
                ..entry.clone()
            }),
            event: facts.upgrade_at.map(CampaignEvent::Scheduled),
            ..Decision::unchanged(Some(Duration::ZERO))
        },
        UpgradePhase::Pending => match facts.upgrade_at {
            None => Decision::unchanged(None),
            Some(at) if now < at => {
                let wait = now.duration_until(at).unsigned_abs();
                Decision::unchanged(Some(wait))
            }
            Some(_) => {
                let started = UpgradeHistory {
                    phase: UpgradePhase::Upgrading,
                    start_time: Some(time(now)),
                    ..entry.clone()
                };
                let mut decision = upgrading(&started, &facts.nodes, window, now);
                decision.entry = Some(decision.entry.unwrap_or(started));
                decision.event = Some(match decision.event {
                    Some(event @ (CampaignEvent::Upgraded | CampaignEvent::Failed(_))) => event,
                    _ => CampaignEvent::Started,
                });
                decision.window_breached = Some(decision.window_breached.unwrap_or(false));
                decision
            }
        },
        UpgradePhase::Upgrading => upgrading(entry, &facts.nodes, window, now),
        UpgradePhase::Upgraded | UpgradePhase::Failed => Decision::unchanged(None),
    }
}

/// An Upgrading campaign: fail it when its window passed with no node started, else run
/// its steps.
fn upgrading(
    entry: &UpgradeHistory,
    nodes: &NodeTally,
    window: &UpgradeWindow,
    now: Timestamp,
) -> Decision {
    let commenced = entry.worker_start_time.is_some() || nodes.started > 0 || nodes.all_finished();
    let start = entry.start_time.as_ref();
    if !commenced && window.time_out > 0 && passed(start, minutes(window.time_out), now) {
        let mut failed = entry.clone();
        failed.phase = UpgradePhase::Failed;
        failed.conditions.insert(
            0,
            UpgradeCondition {
                type_: FAILED_UPGRADE.to_string(),
                status: ConditionStatus::True,
                last_probe_time: Some(time(now)),
                last_transition_time: Some(time(now)),
                start_time: Some(time(now)),
                complete_time: Some(time(now)),
                reason: "Upgrade failed".to_string(),
                message: CampaignEvent::Failed(window.time_out).message(&entry.version),
            },
        );
        return Decision {
            entry: Some(failed),
            event: Some(CampaignEvent::Failed(window.time_out)),
            window_breached: Some(true),
            requeue: None,
        };
    }
    let done = [
        (condition_types::UPGRADE_COMMENCED, commenced),
        (
            condition_types::WORKER_NODES_UPGRADED,
            commenced && nodes.all_finished(),
        ),
    ];
    let mut next = entry.clone();
    next.conditions = run_steps(&entry.conditions, &done, now);
    if commenced && next.worker_start_time.is_none() {
        next.worker_start_time = Some(time(nodes.first_start.unwrap_or(now).min(now)));
    }
    let mut event = None;
    let delayed =
        !commenced && window.delay_trigger > 0 && passed(start, minutes(window.delay_trigger), now);
    if delayed {
        let message = CampaignEvent::Delayed(window.delay_trigger).message(&entry.version);
        if let Some(condition) = next
            .conditions
            .iter_mut()
            .find(|c| c.type_ == condition_types::UPGRADE_COMMENCED)
            && condition.message != message
        {
            condition.message = message;
            event = Some(CampaignEvent::Delayed(window.delay_trigger));
        }
    }
    let mut requeue = Some(UPGRADING_RECHECK);
    if done.iter().all(|(_, done)| *done) {
        next.phase = UpgradePhase::Upgraded;
        next.complete_time = Some(time(now));
        next.worker_complete_time = Some(time(now));
        event = Some(CampaignEvent::Upgraded);
        requeue = None;
    }
    Decision {
        entry: (next != *entry).then_some(next),
        event,
        window_breached: None,
        requeue,
    }
}

/// MUO's step runner over `conditions`: each step in order gets its condition (created
/// False with `startTime` the first time, prepended), becomes True with `completeTime` once
/// done; the first step not done stops the run. Reasons are `<Step> done` and
/// `<Step> not done`; messages `<Step> is completed` and `<Step> still in progress` (a
/// message set for a step in progress, such as a delay, is kept).
pub fn run_steps(
    conditions: &[UpgradeCondition],
    steps: &[(&str, bool)],
    now: Timestamp,
) -> Vec<UpgradeCondition> {
    let mut conditions = conditions.to_vec();
    for (step, done) in steps {
        let index = match conditions.iter().position(|c| c.type_ == *step) {
            Some(index) => index,
            None => {
                conditions.insert(
                    0,
                    UpgradeCondition {
                        type_: (*step).to_string(),
                        status: ConditionStatus::False,
                        last_probe_time: Some(time(now)),
                        last_transition_time: Some(time(now)),
                        start_time: Some(time(now)),
                        complete_time: None,
                        reason: format!("{step} not done"),
                        message: format!("{step} still in progress"),
                    },
                );
                0
            }
        };
        let condition = &mut conditions[index];
        if !*done {
            break;
        }
        if condition.status != ConditionStatus::True {
            condition.status = ConditionStatus::True;
            condition.last_probe_time = Some(time(now));
            condition.last_transition_time = Some(time(now));
            condition.complete_time = Some(time(now));
            condition.reason = format!("{step} done");
            condition.message = format!("{step} is completed");
        }
    }
    conditions
}

/// Where the nodes labelled with `version` stand, from their labels and the upgrade
/// annotations the version-label controller keeps.
pub fn tally<'a>(nodes: impl IntoIterator<Item = &'a Node>, version: &str) -> NodeTally {
    let mut tally = NodeTally::default();
    let mut leaving: BTreeMap<String, usize> = BTreeMap::new();
    for node in nodes {
        let labels = node.labels();
        // A node is done once its drain ended too: uncordoned, unmarked.
        let draining = node.annotations().contains_key(DRAIN_ANNOTATION);
        for (label, value) in labels {
            if value != version {
                continue;
            }
            for (kind, key) in ModuleLabel::parse(label) {
                if kind != ModuleLabel::VersionModule {
                    continue;
                }
                tally.labelled += 1;
                let progress = node
                    .annotations()
                    .get(&key.upgrade_annotation())
                    .and_then(|text| Progress::from_annotation(text));
                let worker = labels.get(&key.version_worker_pod_label());
                let plugin = labels.get(&key.version_device_plugin_label());
                let from = worker
                    .filter(|w| *w != version)
                    .cloned()
                    .or_else(|| progress.as_ref().and_then(|p| p.from.clone()));
                if let Some(from) = from {
                    *leaving.entry(from).or_default() += 1;
                }
                match progress.filter(|p| p.upgrading()) {
                    Some(progress) => {
                        tally.started += 1;
                        tally.first_start = match (tally.first_start, progress.started_at) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                    }
                    None if worker.map(String::as_str) == Some(version)
                        && plugin.map(String::as_str) == Some(version)
                        && !draining =>
                    {
                        tally.finished += 1;
                    }
                    None => {}
                }
            }
        }
    }
    tally.preceding = leaving
        .into_iter()
        .max_by(|(a, x), (b, y)| x.cmp(y).then(b.cmp(a)))
        .map(|(version, _)| version);
    tally
}

#[cfg(test)]
mod tests;
