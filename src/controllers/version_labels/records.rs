//! What the controller tells people: the history record and Events of each step reached,
//! and the one Event that says why a node waits for the policy. Each is plain data here;
//! the reconciler writes them.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{
    Decision, Gate, NodeModuleFacts, Outcome, PolicyWait, Progress, Slot, Stamp, StepReached, Wait,
};
use crate::controllers::upgrade::Policies;
use crate::controllers::upgrade::guard::{self, CheckResult};
use crate::controllers::upgrade::policy::asked_by;
use crate::controllers::upgrade::window::WindowState;
use capstan_api::clock::rfc3339_micros;
use capstan_api::labels::{
    FROM_VERSION_ANNOTATION, MODULE_ANNOTATION, ModuleKey, TO_VERSION_ANNOTATION,
    UPGRADE_STEP_ANNOTATION,
};
use capstan_api::{CommitRef, GateWhen, HistoryRecordSpec, RecordType, UpgradeStep};

/// How a step reached is recorded: a history record, then, when the record is new, the same
/// Event on the Node and on the Module.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// The Module.
    pub key: ModuleKey,
    /// The record; its message and commit are the Events' too.
    pub spec: HistoryRecordSpec,
    /// The Events' reason: the step.
    pub reason: &'static str,
    /// The Events' annotations besides the commit's: module, versions and step.
    pub annotations: BTreeMap<String, String>,
}

/// The record of `step`, reached by `key` on `node` at `now`.
pub fn step_record(
    policies: &Policies,
    node: &str,
    key: &ModuleKey,
    step: &StepReached,
    now: Timestamp,
) -> StepRecord {
    let commit = policies.commit_of(node, &step.stamp);
    let message = format!(
        "{key} {} -> {} on {node}: step {} {} after {:.1}s{}",
        version(&step.from),
        version(&step.to),
        step.step.number(),
        step.step.as_str(),
        step.duration_seconds,
        asked_by(&commit),
    );
    let mut annotations = move_annotations(key, &step.from, &step.to);
    annotations.insert(
        UPGRADE_STEP_ANNOTATION.to_string(),
        step.step.as_str().to_string(),
    );
    StepRecord {
        key: key.clone(),
        spec: HistoryRecordSpec {
            time: rfc3339_micros(now),
            type_: RecordType::UpgradeStep,
            sync: policies.sync_name(node),
            commit,
            message,
            node: Some(node.to_string()),
            module: Some(key.to_string()),
            step: Some(step.step.as_str().to_string()),
            from_version: step.from.clone(),
            to_version: step.to.clone(),
            duration_seconds: Some(step.duration_seconds),
            ..HistoryRecordSpec::default()
        },
        reason: step_reason(step.step),
        annotations,
    }
}

/// How a gate's attempt that ended is recorded: a history record, then, when the record is
/// new, the same Event on the Node and on the Module (a `Warning` when it failed).
#[derive(Clone, Debug, PartialEq)]
pub struct GateRecord {
    /// The Module.
    pub key: ModuleKey,
    /// The record.
    pub spec: HistoryRecordSpec,
    /// `GatePassed`, `GateRetried` or `GateFailed`.
    pub reason: &'static str,
    /// The gate failed: the rollout halts (a `Warning`).
    pub failed: bool,
    /// Module and versions.
    pub annotations: BTreeMap<String, String>,
}

/// The record of `outcome`, an attempt of a gate over `key`'s move on `node` (`progress`).
pub fn gate_record(
    policies: &Policies,
    node: &str,
    key: &ModuleKey,
    progress: &Progress,
    outcome: &guard::Outcome,
    now: Timestamp,
) -> GateRecord {
    let stamp = Stamp {
        revision: progress.revision.clone(),
        pull_request: progress.pull_request,
    };
    let commit = policies.commit_of(node, &stamp);
    let when = match outcome.when {
        GateWhen::Before => "before the start",
        GateWhen::After => "after the last step",
    };
    let result = outcome.result.as_str();
    let consequence = match outcome.result {
        CheckResult::Failed => "; the rollout halts",
        _ => "",
    };
    let message = format!(
        "{key} {} -> {} on {node}: gate {} {when} {result} on attempt {}: {}{consequence}{}",
        version(&progress.from),
        version(&progress.to),
        outcome.gate,
        outcome.attempt,
        outcome.detail,
        asked_by(&commit),
    );
    let reason = match outcome.result {
        CheckResult::Passed => "GatePassed",
        CheckResult::Retried => "GateRetried",
        CheckResult::Failed => "GateFailed",
    };
    GateRecord {
        key: key.clone(),
        spec: HistoryRecordSpec {
            time: rfc3339_micros(now),
            type_: RecordType::Gate,
            sync: policies.sync_name(node),
            commit,
            message,
            node: Some(node.to_string()),
            module: Some(key.to_string()),
            step: Some(format!(
                "{} {result} attempt {}",
                outcome.gate, outcome.attempt
            )),
            from_version: progress.from.clone(),
            to_version: progress.to.clone(),
            ..HistoryRecordSpec::default()
        },
        reason,
        failed: outcome.result == CheckResult::Failed,
        annotations: move_annotations(key, &progress.from, &progress.to),
    }
}

/// The Event reason of a step.
pub fn step_reason(step: UpgradeStep) -> &'static str {
    match step {
        UpgradeStep::DevicePluginStopped => "DevicePluginStopped",
        UpgradeStep::OldModuleUnloaded => "OldModuleUnloaded",
        UpgradeStep::NewModuleLoaded => "NewModuleLoaded",
        UpgradeStep::DevicePluginStarted => "DevicePluginStarted",
    }
}

/// The Event on the Node that says why a move waits for the policy.
#[derive(Clone, Debug, PartialEq)]
pub struct WaitEvent {
    /// The Module.
    pub key: ModuleKey,
    /// A `Warning` (the move is refused until a pull request approves it) rather than
    /// `Normal` (it waits its turn).
    pub warning: bool,
    /// `PullRequestRequired` or `UpgradeQueued`.
    pub reason: &'static str,
    /// What waits, why, and what would let it go.
    pub message: String,
    /// The commit that asked for the move.
    pub commit: CommitRef,
    /// Module and versions (the commit's are added when the Event is written).
    pub annotations: BTreeMap<String, String>,
}

/// The Event announcing the policy wait `decision` makes `key` on `node` start, once per
/// wait; `None` when it announces nothing (no new policy wait, or a slot wait with a free
/// slot, which cannot be).
pub fn wait_event(
    policies: &Policies,
    node: &str,
    key: &ModuleKey,
    facts: &NodeModuleFacts,
    decision: &Decision,
    gate: &Gate,
) -> Option<WaitEvent> {
    if !decision.announce {
        return None;
    }
    let progress = decision.progress.as_ref()?;
    let Outcome::Wait(Wait::Policy(wait)) = decision.outcome else {
        return None;
    };
    let (stamp, to) = if progress.upgrading() {
        // Held mid-upgrade: the unapproved commit is the node's newest.
        (facts.stamp.clone(), facts.labels.module.clone())
    } else {
        let stamp = Stamp {
            revision: progress.revision.clone(),
            pull_request: progress.pull_request,
        };
        (stamp, progress.to.clone())
    };
    let commit = policies.commit_of(node, &stamp);
    let moving = format!(
        "{key} {} -> {} on {node}",
        version(&progress.from),
        version(&to)
    );
    let (warning, reason, message) = match (wait, &gate.slot) {
        (PolicyWait::PullRequest, _) => (
            true,
            "PullRequestRequired",
            format!(
                "{moving} is not acted on: requirePullRequest is set and {} merged no pull \
                 request; make the change through a pull request",
                if commit.short_sha.is_empty() {
                    "the change".to_string()
                } else {
                    format!("commit {}", commit.short_sha)
                }
            ),
        ),
        (
            PolicyWait::Slot,
            Slot::Taken {
                upgrading,
                ahead,
                limit,
            },
        ) => (
            false,
            "UpgradeQueued",
            format!(
                "{moving} waits its turn: maxNodesInFlight is {limit}, {upgrading} node(s) \
                 upgrading, {ahead} ahead in node-name order{}",
                asked_by(&commit)
            ),
        ),
        (PolicyWait::Slot, Slot::Free) => return None,
        (PolicyWait::Paused, _) => (
            false,
            "RolloutPaused",
            format!(
                "{moving} waits: the rollout is paused (rollout.paused){}",
                asked_by(&commit)
            ),
        ),
        (PolicyWait::Halted, _) => (
            true,
            "RolloutHalted",
            format!(
                "{moving} waits: a gate failed on another node and the rollout halted; \
                 change the failed node's version in the repository to go on{}",
                asked_by(&commit)
            ),
        ),
        (PolicyWait::Window, _) => {
            let opens = match gate.window {
                Some(WindowState::Closed { opens_at }) => format!(", the next opens at {opens_at}"),
                _ => String::new(),
            };
            (
                false,
                "OutsideWindow",
                format!(
                    "{moving} waits for a maintenance window{opens}{}",
                    asked_by(&commit)
                ),
            )
        }
        (PolicyWait::Canary, _) => (
            false,
            "CanaryFirst",
            format!(
                "{moving} waits for the canary nodes to finish and soak{}",
                asked_by(&commit)
            ),
        ),
        (PolicyWait::Failed, _) => {
            let failure = progress.failed.as_ref()?;
            let rolled_back = if progress.upgrading() {
                String::new()
            } else if failure.when == GateWhen::After {
                " and the node is back on the version it left".to_string()
            } else {
                String::new()
            };
            (
                true,
                "GateFailed",
                format!(
                    "{moving} stopped: gate {} failed: {}{rolled_back}; the repository \
                     still asks for {}: revert the change, or move the node on, to go on{}",
                    failure.gate,
                    failure.reason,
                    version(&to),
                    asked_by(&commit)
                ),
            )
        }
        (PolicyWait::Campaign, _) => {
            let campaign = gate.campaigns.get(to.as_deref())?;
            let message = if campaign.failed() {
                format!(
                    "{moving} stays held: campaign {} failed (no node started within its \
                     upgrade window){}",
                    campaign.name,
                    asked_by(&commit)
                )
            } else {
                let until = campaign
                    .upgrade_at
                    .map_or_else(|| "its start".to_string(), |at| at.to_string());
                format!(
                    "{moving} is held until {until} by campaign {}{}",
                    campaign.name,
                    asked_by(&commit)
                )
            };
            (campaign.failed(), "UpgradeHeld", message)
        }
    };
    Some(WaitEvent {
        key: key.clone(),
        warning,
        reason,
        message,
        annotations: move_annotations(key, &progress.from, &to),
        commit,
    })
}

/// Why an upgrade gave up its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// The node stayed NotReady past `notReadyTimeout`, since the time given.
    NotReady(Timestamp),
    /// The Node was deleted.
    Left,
}

impl Release {
    /// The record's `step`.
    pub fn as_str(self) -> &'static str {
        match self {
            Release::NotReady(_) => "not-ready",
            Release::Left => "left",
        }
    }
}

/// The record of `key`'s upgrade on `node` (as `progress` has it) giving up its slot.
pub fn release_record(
    policies: &Policies,
    node: &str,
    key: &ModuleKey,
    progress: &Progress,
    why: Release,
    now: Timestamp,
) -> HistoryRecordSpec {
    let commit = policies.commit_of(
        node,
        &Stamp {
            revision: progress.revision.clone(),
            pull_request: progress.pull_request,
        },
    );
    let step = progress.step.map_or("no step yet".to_string(), |s| {
        format!("after step {} {}", s.number(), s.as_str())
    });
    let what = match why {
        Release::NotReady(since) => format!(
            "{node} NotReady since {since:.0} during its upgrade of {key} {} -> {} ({step}): \
             its slot is released; it takes one again, in line, once Ready",
            version(&progress.from),
            version(&progress.to),
        ),
        Release::Left => format!(
            "{node} left the cluster during its upgrade of {key} {} -> {} ({step}): its slot \
             is released; if it comes back it is upgraded as any node",
            version(&progress.from),
            version(&progress.to),
        ),
    };
    HistoryRecordSpec {
        time: rfc3339_micros(now),
        type_: RecordType::SlotReleased,
        sync: policies.sync_name(node),
        message: format!("{what}{}", asked_by(&commit)),
        commit,
        node: Some(node.to_string()),
        module: Some(key.to_string()),
        step: Some(why.as_str().to_string()),
        from_version: progress.from.clone(),
        to_version: progress.to.clone(),
        ..HistoryRecordSpec::default()
    }
}

/// `v1` or `none`.
fn version(version: &Option<String>) -> &str {
    version.as_deref().unwrap_or("none")
}

/// The Event annotations of a move: module and versions.
fn move_annotations(
    key: &ModuleKey,
    from: &Option<String>,
    to: &Option<String>,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(MODULE_ANNOTATION.to_string(), key.to_string())]);
    if let Some(from) = from {
        annotations.insert(FROM_VERSION_ANNOTATION.to_string(), from.clone());
    }
    if let Some(to) = to {
        annotations.insert(TO_VERSION_ANNOTATION.to_string(), to.clone());
    }
    annotations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::version_labels::{Progress, VersionLabels};

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").expect("a key")
    }

    fn v(version: &str) -> Option<String> {
        Some(version.to_string())
    }

    fn stamp(sha: &str, pull_request: Option<u64>) -> Stamp {
        Stamp {
            revision: Some(format!("main@sha1:{sha}")),
            pull_request,
        }
    }

    #[test]
    fn a_step_is_recorded_against_its_commit() {
        let now: Timestamp = "2026-11-21T10:14:13.5Z".parse().expect("time");
        let step = StepReached {
            step: UpgradeStep::OldModuleUnloaded,
            from: v("v1"),
            to: v("v2"),
            stamp: stamp("3cf3bea0", Some(12)),
            duration_seconds: 21.94,
            last: false,
        };
        let record = step_record(&Policies::default(), "worker-1", &key(), &step, now);
        assert_eq!(
            record.spec.message,
            "kmm-demo/my-kmod v1 -> v2 on worker-1: step 2 old-module-unloaded after 21.9s, \
             asked by 3cf3bea (#12)"
        );
        assert_eq!(record.spec.time, "2026-11-21T10:14:13.500000Z");
        assert_eq!(record.spec.sync, "capstan", "no GitSync: the default name");
        assert_eq!(record.spec.commit.revision, "main@sha1:3cf3bea0");
        assert_eq!(record.reason, "OldModuleUnloaded");
        assert_eq!(
            record.annotations,
            BTreeMap::from([
                (
                    MODULE_ANNOTATION.to_string(),
                    "kmm-demo/my-kmod".to_string()
                ),
                (FROM_VERSION_ANNOTATION.to_string(), "v1".to_string()),
                (TO_VERSION_ANNOTATION.to_string(), "v2".to_string()),
                (
                    UPGRADE_STEP_ANNOTATION.to_string(),
                    "old-module-unloaded".to_string()
                ),
            ])
        );

        let first = StepReached {
            step: UpgradeStep::NewModuleLoaded,
            from: None,
            to: v("v1"),
            stamp: Stamp::default(),
            duration_seconds: 0.2,
            last: false,
        };
        let record = step_record(&Policies::default(), "worker-1", &key(), &first, now);
        assert_eq!(
            record.spec.message,
            "kmm-demo/my-kmod none -> v1 on worker-1: step 3 new-module-loaded after 0.2s",
            "an unstamped node: no commit named"
        );
        assert!(!record.annotations.contains_key(FROM_VERSION_ANNOTATION));
    }

    fn taken(upgrading: usize, ahead: usize) -> Gate {
        Gate {
            slot: Slot::Taken {
                upgrading,
                ahead,
                limit: 1,
            },
            require_pull_request: true,
            sync_applying: false,
            ..Gate::default()
        }
    }

    fn waits(wait: PolicyWait, progress: Progress, announce: bool) -> Decision {
        Decision {
            outcome: Outcome::Wait(Wait::Policy(wait)),
            step: None,
            progress: Some(progress),
            announce,
            check: None,
        }
    }

    #[test]
    fn a_policy_wait_is_announced_once_with_its_reason() {
        let queued = Progress {
            from: v("v1"),
            to: v("v2"),
            revision: Some("main@sha1:d37f9d0aa".into()),
            pull_request: Some(103),
            ..Progress::default()
        };
        let held = Progress {
            started_at: Some(Timestamp::UNIX_EPOCH),
            ..queued.clone()
        };
        let unapproved = Progress {
            pull_request: None,
            ..queued.clone()
        };
        // The node was relabelled v3 by a commit that merged no pull request.
        let facts = NodeModuleFacts {
            labels: VersionLabels {
                module: v("v3"),
                ..VersionLabels::default()
            },
            stamp: stamp("e0e0e0e0", None),
            ..NodeModuleFacts::default()
        };
        let settled = Decision {
            outcome: Outcome::Nothing,
            step: None,
            progress: None,
            announce: false,
            check: None,
        };
        // (name, decision, gate, want: warning, reason, message)
        let rows = [
            (
                "waits its turn",
                waits(PolicyWait::Slot, queued.clone(), true),
                taken(0, 1),
                Some((
                    false,
                    "UpgradeQueued",
                    "kmm-demo/my-kmod v1 -> v2 on worker-3 waits its turn: maxNodesInFlight \
                     is 1, 0 node(s) upgrading, 1 ahead in node-name order, asked by d37f9d0 \
                     (#103)",
                )),
            ),
            (
                "a wait already announced",
                waits(PolicyWait::Slot, queued.clone(), false),
                taken(0, 1),
                None,
            ),
            (
                "no pull request",
                waits(PolicyWait::PullRequest, unapproved, true),
                taken(0, 0),
                Some((
                    true,
                    "PullRequestRequired",
                    "kmm-demo/my-kmod v1 -> v2 on worker-3 is not acted on: requirePullRequest \
                     is set and commit d37f9d0 merged no pull request; make the change through \
                     a pull request",
                )),
            ),
            (
                "held mid-upgrade: the node's newest commit and version",
                waits(PolicyWait::PullRequest, held, true),
                taken(0, 0),
                Some((
                    true,
                    "PullRequestRequired",
                    "kmm-demo/my-kmod v1 -> v3 on worker-3 is not acted on: requirePullRequest \
                     is set and commit e0e0e0e merged no pull request; make the change through \
                     a pull request",
                )),
            ),
            (
                "a slot wait with a free slot",
                waits(PolicyWait::Slot, queued, true),
                Gate {
                    slot: Slot::Free,
                    ..taken(0, 0)
                },
                None,
            ),
            ("no wait", settled, taken(1, 0), None),
        ];
        for (name, decision, gate, want) in rows {
            let event = wait_event(
                &Policies::default(),
                "worker-3",
                &key(),
                &facts,
                &decision,
                &gate,
            );
            let got = event
                .as_ref()
                .map(|e| (e.warning, e.reason, e.message.as_str()));
            assert_eq!(got, want, "{name}");
        }
    }
}
