//! The plan as data, serialized as the stable JSON schema of docs/plan.md
//! (`"schemaVersion": 1`): fields are only ever added, never renamed or removed.

use std::fmt;

use serde::Serialize;

use crate::sync::manifests::{ManifestError, ObjectId};
use crate::sync::source::CommitInfo;
use capstan_api::capstan::UpgradeStep;

/// The version of the JSON schema; bumped only by a change that breaks readers.
pub const SCHEMA_VERSION: u32 = 1;

/// What merging head (offline), or applying it to a cluster (live), will change.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The repository: its root folder, or its URL without credentials.
    pub repository: String,
    /// The tracked branch.
    pub branch: String,
    /// The synced path inside the repository ("" for the root).
    pub path: String,
    /// What head is compared with.
    pub mode: Mode,
    /// The commit compared with: by default where head left the tracked branch.
    pub base: Commit,
    /// The commit planned.
    pub head: Commit,
    /// The pull request the plan is for, when known.
    pub pull_request: Option<u64>,
    /// The cluster's sync state (live plans only).
    pub cluster: Option<ClusterState>,
    /// Why head would be rejected; empty when it is valid.
    pub errors: Vec<ManifestError>,
    /// What the reader should know that does not reject head.
    pub warnings: Vec<String>,
    /// The objects that change, in the order of their files.
    pub objects: Vec<ObjectChange>,
    /// Every node whose module version labels change, in rollout order.
    pub nodes: Vec<NodeMove>,
    /// The `UpgradeConfig` campaigns head declares.
    pub campaigns: Vec<PlannedCampaign>,
    /// What head does to the groups of each LeaderWorkerSet it creates, changes or
    /// deletes, in head's file order, deletions last.
    pub leader_worker_sets: Vec<LeaderWorkerSetChange>,
    /// The repository settings that shape the rollout, and how head fares with them.
    pub policy: Policy,
    /// Counts.
    pub summary: Summary,
}

/// What head is compared with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The desired state at the base commit; no cluster needed.
    Offline,
    /// The live cluster, through server-side apply dry runs.
    Live,
}

impl Mode {
    /// `offline` or `live`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Offline => "offline",
            Mode::Live => "live",
        }
    }
}

/// A commit as a plan shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Commit {
    /// Full SHA.
    pub sha: String,
    /// First seven characters of the SHA.
    pub short_sha: String,
    /// First line of the message.
    pub subject: String,
    /// Author name.
    pub author: String,
    /// The pull request the commit merged or squashed.
    pub pull_request: Option<u64>,
}

impl From<&CommitInfo> for Commit {
    fn from(commit: &CommitInfo) -> Self {
        Commit {
            sha: commit.sha.clone(),
            short_sha: commit.short_sha().to_string(),
            subject: commit.subject.clone(),
            author: commit.author.clone(),
            pull_request: commit.pull_request,
        }
    }
}

/// The sync a live plan was made against.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterState {
    /// The `GitSync` whose inventory says what capstan applied (and may prune).
    pub sync: String,
    /// Whether that `GitSync` exists; without it nothing is pruned.
    pub found: bool,
    /// The revision it last applied (`main@sha1:<sha>`).
    pub last_applied_revision: Option<String>,
    /// Objects head declares that are unchanged without a dry run: their manifest is the
    /// one capstan last applied, and every field it sets has that value live.
    pub unchanged: usize,
    /// Whether every object was dry-run (`--full`).
    pub full: bool,
}

/// The identity of an object, as written in its manifest.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `apiVersion`.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// The object's identity without its version.
    pub fn id(&self) -> ObjectId {
        ObjectId {
            group: self
                .api_version
                .split_once('/')
                .map_or("", |(group, _)| group)
                .to_string(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.id().fmt(f)
    }
}

/// What happens to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectAction {
    /// It is new.
    Create,
    /// It exists and changes.
    Configure,
    /// It left the repository and is deleted.
    Prune,
    /// A Node that left the repository: it stays, losing the labels and annotations
    /// capstan set.
    Release,
    /// A Node in head that the cluster does not have (live plans): the sync never creates
    /// a Node, only patches one a kubelet registered, so it is not created; its labels
    /// apply when a kubelet registers it. Not a change.
    Absent,
}

impl ObjectAction {
    /// The name in plans: `create`, `configure`, `prune`, `release`, `absent`.
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectAction::Create => "create",
            ObjectAction::Configure => "configure",
            ObjectAction::Prune => "prune",
            ObjectAction::Release => "release",
            ObjectAction::Absent => "absent",
        }
    }

    /// The sign Terraform readers know: `+` create, `~` change in place, `-` delete; and
    /// `!` for a Node that is not there to change.
    pub fn sign(self) -> char {
        match self {
            ObjectAction::Create => '+',
            ObjectAction::Configure | ObjectAction::Release => '~',
            ObjectAction::Prune => '-',
            ObjectAction::Absent => '!',
        }
    }

    /// Whether the sync changes the cluster for it: everything but [`ObjectAction::Absent`].
    pub fn changes(self) -> bool {
        self != ObjectAction::Absent
    }
}

/// One object that changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectChange {
    /// Which object.
    pub id: ObjectRef,
    /// What happens to it.
    pub action: ObjectAction,
    /// The file declaring it (in head; in base for an object that left), when known.
    pub file: Option<String>,
    /// The line of its document in that file.
    pub line: Option<usize>,
    /// A unified diff of its YAML, Secret values masked.
    pub diff: String,
}

impl ObjectChange {
    /// Whether it is a Node (the sync only ever patches a registered one).
    pub fn is_node(&self) -> bool {
        self.id.api_version == "v1" && self.id.kind == "Node"
    }

    /// What the reader should know beside the action, for a Node: one the cluster does not
    /// have is not created (live), and one new in Git (offline, where the cluster is not
    /// known) is only patched if a kubelet registered it. `None` for anything else.
    pub fn note(&self) -> Option<&'static str> {
        match self.action {
            ObjectAction::Absent => Some(ABSENT_NODE_NOTE),
            ObjectAction::Create if self.is_node() => Some(NEW_NODE_NOTE),
            _ => None,
        }
    }

    /// `file:line` (or the file alone) where the object is declared, when known.
    pub fn declared_at(&self) -> Option<String> {
        let file = self.file.as_ref()?;
        Some(match self.line {
            Some(line) => format!("{file}:{line}"),
            None => file.clone(),
        })
    }
}

/// What an [`ObjectAction::Absent`] Node means.
pub const ABSENT_NODE_NOTE: &str =
    "not in the cluster: not created; its labels apply when a kubelet registers it";

/// What a Node new in Git means in an offline plan, where the cluster is not known.
pub const NEW_NODE_NOTE: &str = "a Node is never created: its labels apply to the Node a \
                                 kubelet registered, or when one registers it";

/// A node whose version label of one Module changes (seed 002).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMove {
    /// The node.
    pub node: String,
    /// The Module, `namespace/name`.
    pub module: String,
    /// The version before; `None` when the node gets its first label.
    pub from: Option<String>,
    /// The version after; `None` when the label goes.
    pub to: Option<String>,
    /// The steps the node goes through, in order.
    pub steps: Vec<PlannedStep>,
    /// The node's place in the rollout order (1-based; nodes by name).
    pub order: usize,
    /// The wave the node moves in (1-based): at most `maxNodesInFlight` nodes per wave.
    pub wave: usize,
    /// The campaign that rolls out `to`, `namespace/name`: the move is held until its
    /// `upgradeAt`, and the node is cordoned and drained before its steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaign: Option<String>,
    /// That campaign's `upgradeAt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_until: Option<String>,
    /// What the drain will do on the node (live plans of a move under a campaign).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainPreview>,
    /// The rollout gates the move passes, in order (upgrades only; docs/guardrails.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<PlannedGate>,
    /// When the node starts at the earliest (RFC 3339): its wave's place in the estimate,
    /// inside a maintenance window. Set when the plan has an estimate or windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts_at: Option<String>,
}

/// A gate a node's move passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedGate {
    /// Its name (`preflight` for the image check).
    pub name: String,
    /// `image`, `pod`, `prometheus` or `cel`.
    pub kind: String,
    /// `before` the node starts, or `after` its last step.
    pub when: String,
    /// How long an attempt may take, in seconds.
    pub timeout_seconds: u64,
    /// Attempts after a failed one.
    pub retries: u32,
}

/// The rollout's guardrails as head sets them, and how long the rollout will take.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedGuardrails {
    /// `rollout.paused`: no node starts.
    pub paused: bool,
    /// Where a node whose gate failed is left: `cordoned` or `uncordoned`.
    pub failed_node: String,
    /// The canary nodes, first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub canary: Vec<String>,
    /// The canary's soak, in seconds.
    pub soak_seconds: u64,
    /// The maintenance windows, described (`sat, sun 02:00 for 4h Europe/Paris`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<String>,
    /// How long the upgrades will take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
}

/// How long a plan's upgrades will take: each wave takes a node's usual upgrade time and
/// starts inside a window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// A node's upgrade, in seconds: the median of the upgrades the cluster recorded
    /// (the four steps' durations added up).
    pub per_node_seconds: u64,
    /// How many recorded upgrades the median is of.
    pub recorded_upgrades: usize,
    /// When the first wave starts (RFC 3339): now, or the next window.
    pub starts_at: String,
    /// When the last wave ends (RFC 3339).
    pub ends_at: String,
    /// From now to `ends_at`, in seconds (windows' waits included).
    pub total_seconds: u64,
}

/// What a node's drain will do, from its pods as the cluster has them now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainPreview {
    /// The pods the drain evicts (`namespace/name`), no PodDisruptionBudget in the way.
    pub evicted: Vec<String>,
    /// The pods a PodDisruptionBudget protects: evicted as far as the budget allows.
    pub protected: Vec<String>,
    /// When the nodekeeper's forcing strategies start, in minutes after the cordon.
    pub forced_after: Vec<ForcedAfter>,
    /// The LeaderWorkerSet groups the drain recreates, `namespace/name group <i>`: those
    /// with an evicted leader pod, or an evicted worker pod under a restart policy that
    /// recreates the group.
    pub recreated_groups: Vec<String>,
}

/// When one forcing strategy starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ForcedAfter {
    /// MUO's name of the strategy.
    pub strategy: String,
    /// Minutes after the cordon.
    pub minutes: u64,
}

/// An `UpgradeConfig` campaign head declares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedCampaign {
    /// `namespace/name`.
    pub name: String,
    /// `spec.desired.version`: the Module version it rolls out.
    pub version: String,
    /// `spec.upgradeAt`: no node moves to the version before it.
    pub upgrade_at: String,
    /// `spec.PDBForceDrainTimeout`, minutes.
    pub pdb_force_drain_timeout: i32,
    /// The phase of its history entry for the version in the cluster (live plans of a
    /// campaign the cluster has).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// What head does to one LeaderWorkerSet's groups, as capstan's LWS controller will
/// (`src/controllers/lws/`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetChange {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Whether its groups roll.
    pub change: LeaderWorkerSetAction,
    /// `spec.replicas` before (`None`: created) and in head (`None`: deleted).
    pub replicas: ReplicasChange,
    /// The fields that differ, among `replicas`, `leaderWorkerTemplate`,
    /// `rolloutStrategy`, `startupPolicy`, `networkConfig` and `metadata` (labels and
    /// annotations); empty for a creation or deletion.
    pub changed_fields: Vec<String>,
    /// How the groups roll (`rolls` only; `None` as well when the rolling-update
    /// parameters cannot be read, which a warning says).
    pub rollout: Option<PlannedRollout>,
}

/// What happens to a LeaderWorkerSet's groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LeaderWorkerSetAction {
    /// It is new: its groups start on head's template.
    Created,
    /// Its `leaderWorkerTemplate` or `networkConfig` changes: a new controller revision,
    /// and a rolling update of its groups.
    Rolls,
    /// Only fields no revision holds change (`replicas`, `rolloutStrategy`,
    /// `startupPolicy`, metadata): no group is recreated.
    NoRollout,
    /// It left the repository and is pruned, with its groups.
    Deleted,
}

impl LeaderWorkerSetAction {
    /// The name in plans: `created`, `rolls`, `noRollout`, `deleted`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaderWorkerSetAction::Created => "created",
            LeaderWorkerSetAction::Rolls => "rolls",
            LeaderWorkerSetAction::NoRollout => "noRollout",
            LeaderWorkerSetAction::Deleted => "deleted",
        }
    }
}

/// A LeaderWorkerSet's `spec.replicas` before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicasChange {
    /// Before: base's (offline) or the cluster's (live); `None` when it is created.
    pub from: Option<i32>,
    /// Head's; `None` when it is deleted.
    pub to: Option<i32>,
}

/// The rolling update of a LeaderWorkerSet's groups, as the LWS controller's arithmetic
/// (`src/controllers/lws/rolling.rs`) moves it when every group it recreates becomes
/// ready together: each step of `order` starts once the previous one is ready.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedRollout {
    /// The groups below `replicas` that end on head's revision: `replicas` minus those
    /// the partition holds.
    pub groups: i32,
    /// The groups recreated (or created) on head's revision, step by step, each step
    /// from the highest index down; surge and new groups included.
    pub order: Vec<Vec<i32>>,
    /// `rollingUpdateConfiguration.partition`: groups below it stay on their revision.
    pub partition: i32,
    /// `maxUnavailable` in groups (a percentage of `replicas`, rounded down).
    pub max_unavailable: i32,
    /// `maxSurge` in groups (a percentage of `replicas`, rounded up, at most `replicas`).
    pub max_surge: i32,
    /// Groups `replicas` adds, created during the rollout.
    pub new_groups: Vec<i32>,
    /// Groups above `replicas` run during the rollout (`maxSurge`), deleted once the groups
    /// below `replicas` are ready, unless `surgeRemains`.
    pub surge_groups: Vec<i32>,
    /// Whether surge groups are still running once the rollout stops: the partition holds
    /// groups on the old revision, which the LWS controller counts as not updated.
    pub surge_remains: bool,
}

/// One ordered-upgrade step a node goes through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedStep {
    /// The step's number among seed 002's four (1 to 4).
    pub number: usize,
    /// The step's name, as history records write it.
    pub step: UpgradeStep,
    /// What happens, with the labels involved.
    pub description: String,
}

/// The settings that shape the rollout, as head declares them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// `maxNodesInFlight`.
    pub max_nodes_in_flight: u32,
    /// The nodes of each wave, in order.
    pub waves: Vec<Vec<String>>,
    /// `requirePullRequest`, and whether the plan satisfies it.
    pub require_pull_request: PullRequestCheck,
    /// `prune`: whether objects that left the repository are deleted.
    pub prune: bool,
    /// The rollout's guardrails (`rollout` in `capstan.yaml`), when head sets any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guardrails: Option<PlannedGuardrails>,
}

/// How a plan fares with `requirePullRequest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PullRequestCheck {
    /// The setting.
    pub required: bool,
    /// `ok`, or `warning` when version-label changes would not be acted on.
    pub status: CheckStatus,
    /// Why.
    pub message: String,
}

/// The outcome of a policy check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Satisfied, or not required.
    Ok,
    /// Not satisfied: part of the change will not be acted on.
    Warning,
}

/// Counts of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Objects to create.
    pub create: usize,
    /// Objects to configure.
    pub configure: usize,
    /// Objects to prune.
    pub prune: usize,
    /// Nodes to release.
    pub release: usize,
    /// Nodes head declares that the cluster does not have (live plans): not created, and
    /// not a change.
    pub absent: usize,
    /// Version-label moves (entries of `nodes`).
    pub nodes: usize,
    /// Errors.
    pub errors: usize,
    /// Whether anything changes.
    pub has_changes: bool,
}

impl Summary {
    /// Counts the objects, moves and errors. An absent Node is no change: applying head
    /// leaves the cluster as it is.
    pub fn of(objects: &[ObjectChange], nodes: &[NodeMove], errors: &[ManifestError]) -> Self {
        let count = |action| objects.iter().filter(|o| o.action == action).count();
        Summary {
            create: count(ObjectAction::Create),
            configure: count(ObjectAction::Configure),
            prune: count(ObjectAction::Prune),
            release: count(ObjectAction::Release),
            absent: count(ObjectAction::Absent),
            nodes: nodes.len(),
            errors: errors.len(),
            has_changes: objects.iter().any(|o| o.action.changes()) || !nodes.is_empty(),
        }
    }
}

impl Plan {
    /// The exit code, as Terraform's: 1 when head has errors, 2 for changes with
    /// `detailed` (`--detailed-exitcode`), else 0.
    pub fn exit_code(&self, detailed: bool) -> i32 {
        if !self.errors.is_empty() {
            1
        } else if detailed && self.summary.has_changes {
            2
        } else {
            0
        }
    }
}
