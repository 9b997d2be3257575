//! The notifications controller: the pull request sees its rollout. For each commit a
//! `GitSync` applied or rejected, one report per cluster (a GitHub commit status whose
//! context names the cluster, a comment on the pull request, webhooks), kept up to date as
//! the commit's nodes move, and final when every node it moved is done or one failed.
//!
//! What a commit's rollout is comes from what the cluster keeps anyway: the nodes'
//! [`Progress`] annotations name the commit that asked for each move under way, the
//! nodes' stamps the commit whose labels wait to be taken up, and the history's step
//! records the moves that ended. [`moves`] reads them into one [`Move`] per (node, Module)
//! and [`report`] turns a commit's moves into its [`Report`]:
//!
//! | the commit                                   | state     | description                                         |
//! |----------------------------------------------|-----------|-----------------------------------------------------|
//! | being applied, or its apply failed and is retried | pending | `applying the commit` / `the apply failed and is retried: ...` |
//! | rejected                                     | failure   | `rejected: <first error>`                          |
//! | a node's gate failed, or its campaign failed | failure   | `<node>: <gate or campaign> failed: <reason>`       |
//! | a node's kmod worker fails at its step       | failure   | `<node>: <step> failing: <reason>` (pending again once it recovers) |
//! | a node still to move                         | pending   | `<k> of <n> nodes upgraded, <node> <what it does>`  |
//! | every node it moved done (or moved on by a later commit) | success | `<n> of <n> nodes upgraded`              |
//! | applied, no node to move                     | success   | `applied, no node to upgrade`                        |
//!
//! [`outcome`] reads how the sync left the commit from the `GitSync`'s status. [`due`] says
//! which reports a target still has to receive: those that differ from the last one it
//! got for the commit; [`pace`] when (pending ones spaced as they add up, a chat told only
//! of changes of state). What a target got is known from the target itself where
//! it can say (GitHub lists a commit's statuses: a restarted or newly elected capstan asks
//! before it posts, so nothing is posted twice), else from `GitSync.status.notifications`.
//! A delivery that fails is retried with backoff ([`retry_delay`]); the rollout never waits
//! for it.

pub mod github;
pub mod reconciler;
pub mod webhook;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::controllers::failures::WorkerFailure;
use crate::controllers::upgrade::{PolicyWait, Progress};
use capstan_api::{CommitRef, GitSyncStatus, UpgradeStep};

/// A report's state, as GitHub's commit statuses name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The rollout goes on.
    Pending,
    /// Every node the commit moved is done.
    Success,
    /// The commit was rejected, or a node needs a person.
    Failure,
}

impl State {
    /// `pending`, `success` or `failure`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
        }
    }

    /// Parses GitHub's state (`error` reads as a failure).
    pub fn parse(text: &str) -> Option<State> {
        match text {
            "pending" => Some(State::Pending),
            "success" => Some(State::Success),
            "failure" | "error" => Some(State::Failure),
            _ => None,
        }
    }
}

/// Where a (node, Module) move of a commit stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Its labels are in; the version-label controller has not taken it up yet.
    Queued,
    /// The policy holds it (a slot, a campaign, a window, a pause, the canary, a halt).
    Waiting(PolicyWait),
    /// A gate's attempt runs on it.
    Checking { gate: String, attempt: u32 },
    /// Its node drains before its first step.
    Draining,
    /// It works towards this step.
    Step(UpgradeStep),
    /// A canary back in service, under watch.
    Soaking,
    /// Its last step was recorded.
    Done,
    /// A later commit took the node over before the move ended.
    MovedOn,
    /// It stopped and needs a person: `what` failed (a gate, a campaign) for `reason`.
    Failed { what: String, reason: String },
    /// Its kmod worker fails at `step` and is retried.
    Failing { step: UpgradeStep, reason: String },
}

impl Phase {
    /// Whether the move ended, one way or the other that needs nothing more.
    fn ended(&self) -> bool {
        matches!(self, Phase::Done | Phase::MovedOn)
    }

    /// Whether the node is in the middle of it (rather than waiting its turn).
    fn active(&self) -> bool {
        matches!(
            self,
            Phase::Checking { .. } | Phase::Draining | Phase::Step(_) | Phase::Soaking
        )
    }

    /// What the node does, after its name: `draining`, `waiting for a slot`, ...
    pub fn describe(&self) -> String {
        match self {
            Phase::Queued => "queued".into(),
            Phase::Waiting(wait) => match wait {
                PolicyWait::Slot => "waiting for a slot".into(),
                PolicyWait::PullRequest => "waiting for a merged pull request".into(),
                PolicyWait::Campaign => "waiting for its campaign".into(),
                PolicyWait::Paused => "paused".into(),
                PolicyWait::Halted => "halted".into(),
                PolicyWait::Window => "waiting for a maintenance window".into(),
                PolicyWait::Canary => "waiting for the canary".into(),
                PolicyWait::Failed => "failed".into(),
            },
            Phase::Checking { gate, attempt } => format!("checking {gate} (attempt {attempt})"),
            Phase::Draining => "draining".into(),
            Phase::Step(step) => format!("upgrading ({})", step.as_str()),
            Phase::Soaking => "soaking".into(),
            Phase::Done => "upgraded".into(),
            Phase::MovedOn => "moved on by a later commit".into(),
            Phase::Failed { what, reason } => format!("{what} failed: {reason}"),
            Phase::Failing { step, reason } => format!("{} failing: {reason}", step.as_str()),
        }
    }
}

/// One (node, Module) move of a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The node.
    pub node: String,
    /// The Module, `namespace/name`.
    pub module: String,
    /// The version left (none: a first load).
    pub from: Option<String>,
    /// The version reached (none: a removal).
    pub to: Option<String>,
    /// Where it stands.
    pub phase: Phase,
}

/// What the reconciler read of one node for [`moves`].
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// The revision stamp of the commit that last changed its labels from Git.
    pub stamp: Option<String>,
    /// Its upgrade annotations, by Module (`namespace/name`).
    pub progress: BTreeMap<String, Progress>,
    /// Per Module, (M, W): its `version-module` label and its `version-worker-pod` label,
    /// when they differ or D lags (a move not finished).
    pub unsettled: BTreeMap<String, (Option<String>, Option<String>)>,
    /// Whether its campaign drain is done.
    pub drained: bool,
    /// The kmod worker failures on its NMC, by Module.
    pub worker_failures: BTreeMap<String, WorkerFailure>,
}

/// A step record of the commit: node, Module, from, to and step.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StepSeen {
    pub node: String,
    pub module: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub step: UpgradeStep,
}

/// The moves of the commit whose revision is `revision`: those under way on `nodes` (their
/// progress names it), those waiting to be taken up (the node's stamp names it), and those
/// that ended (`steps`, its step records): done when the last step of the move was
/// recorded, else moved on by a later commit. `failed_campaigns` are the versions whose
/// campaign failed, with the campaign's name.
pub fn moves(
    revision: &str,
    nodes: &[NodeView],
    steps: &[StepSeen],
    failed_campaigns: &BTreeMap<String, String>,
) -> Vec<Move> {
    let mut moves: Vec<Move> = Vec::new();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for node in nodes {
        for (module, progress) in &node.progress {
            // Another commit's move on the node is not this one's: if this commit moved it
            // before, its records say how far.
            seen.insert((node.name.clone(), module.clone()));
            if progress.revision.as_deref() != Some(revision) {
                continue;
            }
            moves.push(Move {
                node: node.name.clone(),
                module: module.clone(),
                from: progress.from.clone(),
                to: progress.to.clone(),
                phase: phase_of(node, module, progress, failed_campaigns),
            });
        }
        if node.stamp.as_deref() == Some(revision) {
            for (module, (m, w)) in &node.unsettled {
                if seen.insert((node.name.clone(), module.clone())) {
                    moves.push(Move {
                        node: node.name.clone(),
                        module: module.clone(),
                        from: w.clone(),
                        to: m.clone(),
                        phase: Phase::Queued,
                    });
                }
            }
        }
    }
    let mut ended: BTreeMap<(String, String, Option<String>, Option<String>), bool> =
        BTreeMap::new();
    for step in steps {
        let last = UpgradeStep::for_move(step.from.as_deref(), step.to.as_deref()).last();
        let key = (
            step.node.clone(),
            step.module.clone(),
            step.from.clone(),
            step.to.clone(),
        );
        *ended.entry(key).or_default() |= last == Some(&step.step);
    }
    for ((node, module, from, to), done) in ended {
        if moves.iter().any(|m| m.node == node && m.module == module) {
            continue;
        }
        moves.push(Move {
            node,
            module,
            from,
            to,
            phase: if done { Phase::Done } else { Phase::MovedOn },
        });
    }
    moves.sort_by(|a, b| (&a.node, &a.module).cmp(&(&b.node, &b.module)));
    moves
}

/// Where a move under way stands, from its progress and its node.
fn phase_of(
    node: &NodeView,
    module: &str,
    progress: &Progress,
    failed_campaigns: &BTreeMap<String, String>,
) -> Phase {
    if let Some(failure) = &progress.failed {
        return Phase::Failed {
            what: format!("gate {}", failure.gate),
            reason: failure.reason.clone(),
        };
    }
    if progress.soak_until.is_some() {
        return Phase::Soaking;
    }
    if let Some(check) = &progress.check {
        return Phase::Checking {
            gate: check.name.clone(),
            attempt: check.attempt,
        };
    }
    if !progress.upgrading() {
        if progress.waiting == Some(PolicyWait::Campaign)
            && let Some(campaign) = progress.to.as_ref().and_then(|v| failed_campaigns.get(v))
        {
            return Phase::Failed {
                what: format!("campaign {campaign}"),
                reason: "its UpgradeConfig failed; the move waits until it leaves the repository"
                    .into(),
            };
        }
        return progress.waiting.map_or(Phase::Queued, Phase::Waiting);
    }
    if progress.drain && progress.step.is_none() && !node.drained {
        return Phase::Draining;
    }
    let steps = UpgradeStep::for_move(progress.from.as_deref(), progress.to.as_deref());
    let next = match progress.step {
        None => steps.first().copied(),
        Some(done) => steps.iter().copied().find(|s| *s > done),
    };
    let Some(next) = next else {
        // The last step is recorded: the move ends with this reconcile.
        return Phase::Step(*steps.last().unwrap_or(&UpgradeStep::DevicePluginStarted));
    };
    let worker_step = matches!(
        next,
        UpgradeStep::OldModuleUnloaded | UpgradeStep::NewModuleLoaded
    );
    match node.worker_failures.get(module) {
        Some(failure) if worker_step => Phase::Failing {
            step: next,
            reason: format!(
                "{} failed {} time(s): {}",
                failure.action.to_lowercase(),
                failure.attempts,
                failure.message
            ),
        },
        _ => Phase::Step(next),
    }
}

/// How the sync left the commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Being written.
    Applying,
    /// Its apply failed part-way (the API server) and is retried.
    Retrying(String),
    /// Applied.
    Applied,
    /// Rejected: nothing of it applied; its errors, one per line.
    Rejected(String),
}

/// How the sync left commit `sha`, from the `GitSync`'s status and whether a rejection of
/// it was recorded:
///
/// | the commit | the status | outcome |
/// |---|---|---|
/// | rejected (a record, or the last attempt and `Ready` is `CommitRejected`) | | rejected, with the run's errors |
/// | the last attempted, not the last applied | `Applying` | applying |
/// | the last attempted, not the last applied | `Failed` | retrying, with the error |
/// | any other | | applied (a commit applied again for drift included) |
pub fn outcome(status: &GitSyncStatus, sha: &str, rejected: bool) -> Outcome {
    let last = status
        .last_attempted_commit
        .as_ref()
        .is_some_and(|c| c.sha == sha);
    let rejected_now = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == "CommitRejected");
    let applied = status
        .last_applied_commit
        .as_ref()
        .is_some_and(|c| c.sha == sha);
    let error = || {
        status
            .runs
            .iter()
            .find(|run| run.commit.sha == sha && !run.error.is_empty())
            .map_or_else(|| status.error.clone(), |run| run.error.clone())
    };
    // A commit applied already is being written again only for drift: its rollout is as
    // it was.
    if last && status.phase == "Applying" && !applied {
        return Outcome::Applying;
    }
    if rejected || (last && status.phase == "Failed" && rejected_now) {
        return Outcome::Rejected(error());
    }
    if last && status.phase == "Failed" && !applied {
        return Outcome::Retrying(error());
    }
    Outcome::Applied
}

/// One node of a report (the comment's table, the JSON webhook's `nodes`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    /// The node.
    pub node: String,
    /// Its Modules' moves, `namespace/name from -> to`.
    pub modules: Vec<String>,
    /// What it does (`upgraded`, `draining`, `gate smoke failed: ...`).
    pub status: String,
}

/// The first failure of a report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// The node, when a node failed (none for a rejected commit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The Module.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// What failed: `gate smoke`, `new-module-loaded`, `campaign c`, `validation`.
    pub step: String,
    /// Why.
    pub reason: String,
}

/// What a target is told about one commit's rollout in one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The commit.
    pub commit: CommitRef,
    /// Pending, success or failure.
    pub state: State,
    /// One line, at most [`MAX_DESCRIPTION`] characters.
    pub description: String,
    /// Nodes the commit moves.
    pub total: usize,
    /// Those done.
    pub done: usize,
    /// Those done because a later commit took them over.
    pub moved_on: usize,
    /// Each node, by name.
    pub nodes: Vec<NodeLine>,
    /// The first failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
}

/// The errors of a rejected commit a report's failure names.
const FIRST_ERRORS: usize = 5;

/// GitHub's limit on a status description.
pub const MAX_DESCRIPTION: usize = 140;

/// The report of `commit`, from how the sync left it and its `moves` (see the table in the
/// module's documentation).
pub fn report(commit: &CommitRef, outcome: &Outcome, moves: &[Move]) -> Report {
    let mut nodes: BTreeMap<&str, Vec<&Move>> = BTreeMap::new();
    for m in moves {
        nodes.entry(&m.node).or_default().push(m);
    }
    let lines: Vec<NodeLine> = nodes
        .iter()
        .map(|(node, moves)| NodeLine {
            node: node.to_string(),
            modules: moves
                .iter()
                .map(|m| {
                    format!(
                        "{} {} -> {}",
                        m.module,
                        m.from.as_deref().unwrap_or("none"),
                        m.to.as_deref().unwrap_or("none")
                    )
                })
                .collect(),
            status: node_phase(moves).describe(),
        })
        .collect();
    let total = nodes.len();
    let done = nodes
        .values()
        .filter(|moves| moves.iter().all(|m| m.phase.ended()))
        .count();
    let mut out = Report {
        commit: commit.clone(),
        state: State::Pending,
        description: String::new(),
        total,
        done,
        moved_on: nodes
            .values()
            .filter(|moves| moves.iter().all(|m| m.phase == Phase::MovedOn))
            .count(),
        nodes: lines,
        failure: None,
    };
    let (state, description) = match outcome {
        Outcome::Applying => (State::Pending, "applying the commit".to_string()),
        Outcome::Retrying(error) => (
            State::Pending,
            format!("the apply failed and is retried: {}", first_line(error)),
        ),
        Outcome::Rejected(errors) => {
            // The first errors (the status has room for one line, the comment for more).
            let first: Vec<&str> = errors
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .take(FIRST_ERRORS)
                .collect();
            out.failure = Some(Failure {
                node: None,
                module: None,
                step: "validation".into(),
                reason: first.join("; "),
            });
            (State::Failure, format!("rejected: {}", first_line(errors)))
        }
        Outcome::Applied => applied(&nodes, &mut out),
    };
    out.state = state;
    out.description = shorten(&description, MAX_DESCRIPTION);
    out
}

/// The state and line of an applied commit's rollout; sets `failure` to the first one.
fn applied(nodes: &BTreeMap<&str, Vec<&Move>>, report: &mut Report) -> (State, String) {
    let (total, done) = (report.total, report.done);
    let failed = nodes.iter().find_map(|(node, moves)| {
        moves.iter().find_map(|m| match &m.phase {
            Phase::Failed { what, reason } => Some((node, m, what.clone(), reason)),
            Phase::Failing { step, reason } => Some((node, m, step.as_str().to_string(), reason)),
            _ => None,
        })
    });
    if let Some((node, m, what, reason)) = failed {
        report.failure = Some(Failure {
            node: Some(node.to_string()),
            module: Some(m.module.clone()),
            step: what,
            reason: reason.clone(),
        });
        // The reason gives way to the count when the line is too long for GitHub.
        let suffix = format!(" ({done} of {total} nodes upgraded)");
        let room = MAX_DESCRIPTION.saturating_sub(suffix.chars().count());
        let line = shorten(&format!("{node}: {}", m.phase.describe()), room);
        return (State::Failure, format!("{line}{suffix}"));
    }
    if total == 0 {
        return (State::Success, "applied, no node to upgrade".into());
    }
    if done == total {
        let line = format!("{total} of {total} nodes upgraded");
        return match report.moved_on {
            0 => (State::Success, line),
            n => (
                State::Success,
                format!("{line} ({n} moved on by a later commit)"),
            ),
        };
    }
    // The node to name: the first in the middle of its move, else the first still waiting.
    let current = nodes
        .iter()
        .map(|(node, moves)| (node, node_phase(moves)))
        .filter(|(_, phase)| !phase.ended())
        .min_by_key(|(node, phase)| (!phase.active(), **node));
    let mut line = format!("{done} of {total} nodes upgraded");
    if let Some((node, phase)) = current {
        line.push_str(&format!(", {node} {}", phase.describe()));
    }
    (State::Pending, line)
}

/// What a node does, of its moves: the first that has not ended, in the middle of it
/// first; done when all ended (moved on only when all did).
fn node_phase(moves: &[&Move]) -> Phase {
    if let Some(m) = moves
        .iter()
        .filter(|m| !m.phase.ended())
        .min_by_key(|m| !m.phase.active())
    {
        return m.phase.clone();
    }
    if moves.iter().all(|m| m.phase == Phase::MovedOn) {
        Phase::MovedOn
    } else {
        Phase::Done
    }
}

fn first_line(text: &str) -> &str {
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// `text` cut to `max` characters, with `...` where it was cut.
pub fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(3)).collect();
    out.push_str("...");
    out
}

/// The last report a target got about a commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    pub state: State,
    pub description: String,
}

/// Whether `report` is still to be delivered to a target that last got `sent` about its
/// commit: when it differs. But a failure stays: a commit whose node failed and that a
/// later commit took over (a revert, a fix forward) does not turn green for it.
pub fn due(report: &Report, sent: Option<&Sent>) -> bool {
    let Some(sent) = sent else {
        return true;
    };
    let same = sent.state == report.state && sent.description == report.description;
    let failure_kept =
        sent.state == State::Failure && report.state == State::Success && report.moved_on > 0;
    !same && !failure_kept
}

/// How a target takes a rollout's pending reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Each one, spaced as they add up (GitHub, the comment, the JSON webhook).
    Every,
    /// Only a change of state (a chat channel): started, failed, done.
    StateChanges,
}

/// Pending reports a target gets about one commit before only its state changes are sent:
/// GitHub keeps at most 1,000 statuses per commit and context, and the final one must fit.
pub const MAX_PENDING_POSTS: u32 = 950;

/// When `report` goes to a target that last got `sent` about its commit, `posts` reports
/// in all, the last one `since` ago: `None` when it does not ([`due`], or the target's
/// pace leaves it out), else the wait before it may (zero: now). A final report goes at
/// once; pending ones are spaced by a tenth of a second per report already sent (after
/// 100, 10 seconds; after 900, 90), so that [`MAX_PENDING_POSTS`], after which they stop,
/// last a rollout of 12 hours at least.
pub fn pace(
    report: &Report,
    sent: Option<&Sent>,
    posts: u32,
    since: Option<Duration>,
    pace: Pace,
) -> Option<Duration> {
    if !due(report, sent) {
        return None;
    }
    if pace == Pace::StateChanges && sent.is_some_and(|s| s.state == report.state) {
        return None;
    }
    if report.state != State::Pending {
        return Some(Duration::ZERO);
    }
    if posts >= MAX_PENDING_POSTS {
        return None;
    }
    let spacing = Duration::from_millis(100) * posts;
    Some(spacing.saturating_sub(since.unwrap_or(Duration::MAX)))
}

/// The wait before retrying a target after `failures` failed deliveries in a row: 1 s,
/// doubled, at most 5 minutes.
pub fn retry_delay(failures: u32) -> Duration {
    let seconds = 1u64 << failures.saturating_sub(1).min(9);
    Duration::from_secs(seconds.min(300))
}

#[cfg(test)]
mod tests;
