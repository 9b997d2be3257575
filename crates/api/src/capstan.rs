//! capstan's own kinds (`capstan.dev/v1alpha1`, namespaced, kept in [`SYSTEM_NAMESPACE`]):
//!
//! - `GitSync`: one per followed branch. Its status is the sync's memory in the cluster:
//!   the last applied and last attempted commits, the error that stopped the last attempt,
//!   the last runs, and the inventory of every object applied from Git (so a restarted
//!   capstan knows what it owns, and what to prune).
//! - `HistoryRecord`: the durable, commit-linked history. Every sync that changes something
//!   or rejects a commit, and (with the ordered-upgrade controller) every step an upgrade
//!   takes on a node, is one record naming the commit and pull request that asked for it.
//!   Kubernetes Events carry the same facts but expire; records stay until the retention
//!   limit (`historyRetention` in `capstan.yaml`) removes the oldest.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The namespace capstan keeps its own objects in.
pub const SYSTEM_NAMESPACE: &str = "capstan-system";

/// How many runs `GitSync` status keeps.
pub const MAX_RUNS: usize = 10;

/// Which branch of which repository a `GitSync` follows.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "GitSync",
    namespaced,
    shortname = "gs",
    status = "GitSyncStatus",
    derive = "PartialEq",
    doc = "GitSync is a Git branch capstan follows and the state of its sync.",
    printcolumn(name = "Branch", type_ = "string", json_path = ".spec.branch"),
    printcolumn(
        name = "Applied",
        type_ = "string",
        json_path = ".status.lastAppliedCommit.shortSha"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Objects",
        type_ = "integer",
        json_path = ".status.inventoryCount"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GitSyncSpec {
    /// The repository, as given to `capstan sync --repo` (passwords hidden).
    pub repo: String,
    /// The followed branch.
    pub branch: String,
    /// The synced folder inside the repository (`""` for all of it).
    #[serde(default)]
    pub path: String,
    /// What the repository may reach, set by the cluster's admin: a commit declaring an
    /// object outside it is rejected. capstan writes `repo`, `branch` and `path` and never
    /// this field, and a repository may not declare a `GitSync`.
    #[serde(default, skip_serializing_if = "Reach::is_unbounded")]
    pub reach: Reach,
    /// How capstan tells that a commit merged a pull request, set by the cluster's admin.
    #[serde(default, skip_serializing_if = "PullRequests::is_default")]
    pub pull_requests: PullRequests,
    /// Where capstan reports each commit's rollout (GitHub commit statuses, a pull-request
    /// comment, webhooks), set by the cluster's admin, never by the repository.
    #[serde(default, skip_serializing_if = "Notifications::is_empty")]
    pub notifications: Notifications,
}

/// Where the rollout of each commit capstan applies or rejects is reported
/// (docs/notifications.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notifications {
    /// The name of this cluster's reports (`capstan/prod-eu`): the commit statuses'
    /// context, the comment's heading, the webhooks' `context`. Required, and unique per
    /// cluster: a status replaces only the one of the same context, so two clusters
    /// under one name would overwrite each other.
    #[serde(default)]
    pub context: String,
    /// A commit status per commit on GitHub, and optionally a comment on its pull request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<GitHubNotifications>,
    /// Webhooks that receive the same reports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<Webhook>,
}

impl Notifications {
    /// Whether nothing is to be notified.
    pub fn is_empty(&self) -> bool {
        self.github.is_none() && self.webhooks.is_empty()
    }
}

/// Commit statuses on GitHub (or GitHub Enterprise).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubNotifications {
    /// The repository, `owner/name`; default: `spec.pullRequests.repository`, else read
    /// from the repository URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// GitHub's API; default `https://api.github.com` (GitHub Enterprise:
    /// `https://<host>/api/v3`).
    #[serde(default, rename = "apiURL", skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// A token (fine-grained: "Commit statuses: write", with `comment` "Pull requests:
    /// write") in a Secret of capstan's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<SecretKeyRef>,
    /// A GitHub App installation, instead of a token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<GitHubApp>,
    /// Keep a comment on the commit's pull request with the rollout's nodes, one per
    /// context, updated as it goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub comment: bool,
    /// The statuses' link ("Details"); default: none.
    #[serde(default, rename = "targetURL", skip_serializing_if = "Option::is_none")]
    pub target_url: Option<String>,
}

/// A GitHub App installation capstan authenticates as.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubApp {
    /// The App's ID.
    #[serde(rename = "appID")]
    #[schemars(with = "i64", range(min = 1))]
    pub app_id: u64,
    /// The installation's ID on the repository's owner.
    #[serde(rename = "installationID")]
    #[schemars(with = "i64", range(min = 1))]
    pub installation_id: u64,
    /// The App's private key (PEM) in a Secret of capstan's namespace.
    pub private_key_secret: SecretKeyRef,
}

/// A key of a Secret in capstan's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in its data.
    pub key: String,
}

/// A webhook that receives each report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Webhook {
    /// Its name (in the status, the logs and the metrics).
    pub name: String,
    /// `json` (capstan's report, signed when `signingSecret` is set) or `slack` (an
    /// incoming webhook's `text`).
    #[serde(default)]
    pub format: WebhookFormat,
    /// Its URL, when it is no secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its URL in a Secret (a Slack incoming webhook's URL is its credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret: Option<SecretKeyRef>,
    /// A key the `json` body is signed with: `X-Capstan-Signature-256: sha256=<HMAC>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret: Option<SecretKeyRef>,
}

/// What a webhook's body looks like.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WebhookFormat {
    /// capstan's report as JSON.
    #[default]
    Json,
    /// `{"text": ...}`, as Slack's (and Mattermost's, Rocket.Chat's) incoming webhooks take.
    Slack,
}

/// How capstan proves that a commit merged a pull request (what `requirePullRequest` and
/// the records' pull request numbers rest on), and whether the cluster's admin requires it
/// whatever the repository's `capstan.yaml` says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullRequests {
    /// `subject` (the default): the number in GitHub's merge or squash subject, which anyone
    /// who can push to the branch can write. `github`: GitHub's API names a merged pull
    /// request into the followed branch whose merge commit is this commit.
    #[serde(default, skip_serializing_if = "Proof::is_subject")]
    pub proof: Proof,
    /// The repository on GitHub, `owner/name`; default: read from the repository URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// GitHub's API; default `https://api.github.com` (GitHub Enterprise:
    /// `https://<host>/api/v3`).
    #[serde(default, rename = "apiURL", skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// Act on version labels only when the commit is proven to have merged a pull request,
    /// whatever `requirePullRequest` in the repository says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require: bool,
}

impl PullRequests {
    /// Whether nothing is set: subject proof, nothing required.
    pub fn is_default(&self) -> bool {
        *self == PullRequests::default()
    }
}

/// How a commit is proven to have merged a pull request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Proof {
    /// GitHub's merge or squash subject (`Merge pull request #N`, `Subject (#N)`).
    #[default]
    Subject,
    /// GitHub's API: `GET /repos/{owner}/{name}/commits/{sha}/pulls`.
    Github,
}

impl Proof {
    /// Whether this is the default, the subject.
    pub fn is_subject(&self) -> bool {
        *self == Proof::Subject
    }
}

/// The namespaces and kinds a repository may declare objects in and of, and the identity
/// the sync writes them as (Argo CD's AppProject destinations and resource lists, Flux's
/// `serviceAccountName`). Patterns are globs: `*` stands for any run of characters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reach {
    /// Namespaces the repository may put objects in and declare as `Namespace` objects;
    /// empty: every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces the repository may never reach, whatever `namespaces` allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_namespaces: Vec<String>,
    /// Kinds the repository may declare; empty: every kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<KindPattern>,
    /// Kinds the repository may never declare, whatever `kinds` allows.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_kinds: Vec<KindPattern>,
    /// The ServiceAccount the sync impersonates to apply and prune the repository's objects,
    /// so that its RBAC bounds them (capstan needs `impersonate` on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<ServiceAccountRef>,
}

impl Reach {
    /// Whether the reach bounds nothing: every namespace and kind, as capstan itself.
    pub fn is_unbounded(&self) -> bool {
        *self == Reach::default()
    }
}

/// A kind by API group and name, each a glob (`group: ""` is the core group).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KindPattern {
    /// The API group (`apps`, `""` for the core group, `*` for any).
    #[serde(default)]
    pub group: String,
    /// The kind (`Deployment`, `*` for any).
    pub kind: String,
}

/// A ServiceAccount by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What a `GitSync` has done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitSyncStatus {
    /// `Applying` while a commit is being applied, then `Applied`, `Failed` (the last
    /// attempt was rejected or could not finish; the last applied commit stays in force) or
    /// `Interrupted` (capstan stopped during an apply; the next start applies it again).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// The commit whose desired state the cluster has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_commit: Option<CommitRef>,
    /// The newest commit capstan tried to apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempted_commit: Option<CommitRef>,
    /// Why the last attempt failed, one problem per line (file:line: field: message).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// The last runs that changed something or met a new commit, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<SyncRun>,
    /// How many objects the inventory holds (shown by `kubectl get gitsyncs`).
    #[serde(default)]
    #[schemars(with = "i64", range(min = 0))]
    pub inventory_count: u32,
    /// Every object applied from Git, sorted; see [`InventoryEntry`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<InventoryEntry>,
    /// `Ready`: whether the last applied commit is the newest one, applied in full.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The ordered-upgrade policy of the commit being applied (its `capstan.yaml`), which
    /// the version-label controller follows; absent before the first apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<UpgradePolicy>,
    /// Nodes the applied commit declares that no kubelet has registered, sorted: capstan
    /// never creates a Node, and applies their labels once one registers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unregistered_nodes: Vec<String>,
    /// What the notifications controller delivered to each target, and what fails; the
    /// sync carries it over as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifications: Vec<NotificationTarget>,
}

/// The deliveries to one notification target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationTarget {
    /// `github` or `webhook/<name>`.
    pub target: String,
    /// The last report delivered per commit, newest commit first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered: Vec<Delivered>,
    /// Deliveries that failed in a row (retried with backoff; the rollout goes on).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(with = "i64", range(min = 0))]
    pub failures: u32,
    /// Why the last delivery failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A report delivered about one commit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivered {
    /// The commit's full SHA.
    pub sha: String,
    /// `pending`, `success` or `failure`.
    pub state: String,
    /// The report's one line.
    pub description: String,
    /// Reports delivered about the commit (pending ones are spaced as they add up).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(with = "i64", range(min = 0))]
    pub posts: u32,
}

/// How the version-label controller may move nodes: the `maxNodesInFlight` and
/// `requirePullRequest` settings of `capstan.yaml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePolicy {
    /// How many nodes may be in an ordered upgrade at the same time (at least 1); the
    /// others wait their turn in node-name order.
    #[serde(default = "one")]
    #[schemars(with = "i64", range(min = 1))]
    pub max_nodes_in_flight: u32,
    /// Act on a node's version label only when the commit that last changed the node
    /// merged or squashed a pull request.
    #[serde(default)]
    pub require_pull_request: bool,
    /// How nodes are drained around their kmod steps under an upgrade campaign, and when
    /// the nodekeeper forces a drain that does not finish (MUO's `nodeDrain`).
    #[serde(default)]
    pub node_drain: NodeDrain,
    /// How long an upgrade campaign may take to start its first node (MUO's
    /// `upgradeWindow`).
    #[serde(default)]
    pub upgrade_window: UpgradeWindow,
    /// Seconds a node may stay NotReady in the middle of an upgrade before it gives up its
    /// slot (`notReadyTimeout`).
    #[serde(default = "not_ready_timeout")]
    #[schemars(with = "i64", range(min = 1))]
    pub not_ready_timeout_seconds: u64,
    /// The rollout's guardrails (`rollout` in `capstan.yaml`): gates and halt,
    /// maintenance windows, pause, canary and preflight (docs/guardrails.md).
    #[serde(default, skip_serializing_if = "RolloutPolicy::is_default")]
    pub rollout: RolloutPolicy,
}

/// The guardrails around each node's ordered upgrade: what must hold before a node starts
/// and after it finishes, what happens when it does not, and when nodes may start at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct RolloutPolicy {
    /// No node starts an upgrade; nodes in progress finish.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Where a node whose gate failed is left when it is not rolled back.
    pub failed_node: FailedNode,
    /// Before a node starts, the kmod image of its kernel must exist in its registry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub preflight: bool,
    /// Nodes that go first, each to the end of its after-gates and soak, before the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
    /// Nodes start only inside one of these; none: at any time.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<MaintenanceWindow>,
    /// The checks, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateSpec>,
}

impl RolloutPolicy {
    /// True for a policy with no guardrail set (it is then left out of the status).
    pub fn is_default(&self) -> bool {
        self == &RolloutPolicy::default()
    }
}

/// Where a halted node is left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FailedNode {
    /// Cordoned, out of service until the repository moves it again.
    #[default]
    Cordoned,
    /// Back in service (uncordoned) as it is.
    Uncordoned,
}

/// The canary: its nodes first, then a soak, then the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct Canary {
    /// The canary nodes by name.
    pub nodes: Vec<String>,
    /// Seconds a canary node stays under watch, back in service, after its after-gates
    /// passed, before the rest may start.
    #[schemars(with = "i64", range(min = 0))]
    pub soak_seconds: u64,
}

/// A recurring maintenance window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct MaintenanceWindow {
    /// The days it opens on (`mon` .. `sun`); empty: every day.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<String>,
    /// When it opens, `HH:MM` in `timeZone`.
    pub start: String,
    /// How long it stays open, in seconds.
    #[schemars(with = "i64", range(min = 0))]
    pub duration_seconds: u64,
    /// An IANA time zone (`Europe/Paris`); default `UTC`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub time_zone: String,
}

/// When a gate is checked.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum GateWhen {
    /// Before the node starts (before its drain, if any).
    #[default]
    Before,
    /// After its last step, before it is back in service.
    After,
}

/// A check a node's upgrade must pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct GateSpec {
    /// Its name, unique in the policy (records and Events name it).
    pub name: String,
    /// Before the node starts, or after it finishes.
    pub when: GateWhen,
    /// The Modules (`namespace/name`) it applies to; empty: every Module.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub modules: Vec<String>,
    /// Seconds an attempt may take before it counts as failed (default 300).
    #[schemars(with = "i64", range(min = 0))]
    pub timeout_seconds: u64,
    /// Attempts after the first failed one before the gate fails (default 0).
    #[schemars(with = "i64", range(min = 0))]
    pub retries: u32,
    /// A pod pinned to the node that must succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodCheck>,
    /// A Prometheus query that must return no series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusCheck>,
    /// A CEL expression over the node and its pods that must be true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cel: Option<String>,
}

/// A check pod: any image, run once on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PodCheck {
    /// The image.
    pub image: String,
    /// Its entrypoint, when not the image's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Its arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Annotations of the pod.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Run privileged with the host's PID namespace (diagnostics that read the hardware).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
}

/// A Prometheus query that must return no series, `$node` replaced by the node's name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default)]
pub struct PrometheusCheck {
    /// Prometheus's base URL (`http://prometheus.monitoring:9090`).
    pub url: String,
    /// The PromQL instant query: what it returns is what is wrong.
    pub query: String,
}

/// The default `notReadyTimeout`: ten minutes, twice the node lifecycle controller's
/// default eviction timeout, so a node that reboots during its upgrade keeps its slot.
pub const DEFAULT_NOT_READY_TIMEOUT_SECONDS: u64 = 600;

fn not_ready_timeout() -> u64 {
    DEFAULT_NOT_READY_TIMEOUT_SECONDS
}

/// MUO's `nodeDrain` settings, in minutes. Absent values take MUO's documented defaults
/// (its own code reads them as 0, which would force a drain the moment it begins).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct NodeDrain {
    /// Minutes a cordoned node is given to drain before the nodekeeper deletes its pods
    /// (DELETE, DEFAULT-FINALIZER, POD-STUCK-TERMINATING). Default 45.
    #[schemars(with = "i64", range(min = 0))]
    pub time_out: u32,
    /// Minutes a drain is expected to take at best; added to `PDBForceDrainTimeout` before
    /// pods a PodDisruptionBudget protects are forced. Default 8.
    #[schemars(with = "i64", range(min = 0))]
    pub expected_node_drain_time: u32,
    /// Never force a drain; a drain that outlasts `timeOut` only raises
    /// `upgradeoperator_node_drain_timeout`.
    pub disable_drain_strategies: bool,
    /// Regular expressions (unanchored, as MUO matches them): pods in a namespace that
    /// matches one are never forced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored_namespace_patterns: Vec<String>,
}

impl Default for NodeDrain {
    fn default() -> Self {
        NodeDrain {
            time_out: 45,
            expected_node_drain_time: 8,
            disable_drain_strategies: false,
            ignored_namespace_patterns: Vec::new(),
        }
    }
}

/// MUO's `upgradeWindow` settings, in minutes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct UpgradeWindow {
    /// Minutes after a campaign starts upgrading within which its first node must start;
    /// past them with no node started, the campaign fails. 0: no limit. Default 120.
    #[schemars(with = "i64", range(min = 0))]
    pub time_out: u32,
    /// Minutes after a campaign starts upgrading with no node started before capstan says
    /// it is delayed (an Event). 0: never. Default 30.
    #[schemars(with = "i64", range(min = 0))]
    pub delay_trigger: u32,
}

impl Default for UpgradeWindow {
    fn default() -> Self {
        UpgradeWindow {
            time_out: 120,
            delay_trigger: 30,
        }
    }
}

fn one() -> u32 {
    1
}

impl Default for UpgradePolicy {
    fn default() -> Self {
        UpgradePolicy {
            max_nodes_in_flight: 1,
            require_pull_request: false,
            node_drain: NodeDrain::default(),
            upgrade_window: UpgradeWindow::default(),
            not_ready_timeout_seconds: DEFAULT_NOT_READY_TIMEOUT_SECONDS,
            rollout: RolloutPolicy::default(),
        }
    }
}

/// A commit as status and history name it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommitRef {
    /// Full SHA.
    pub sha: String,
    /// First seven characters of the SHA.
    pub short_sha: String,
    /// `branch@sha1:<sha>`, as Flux writes revisions.
    pub revision: String,
    /// Author name.
    #[serde(default)]
    pub author: String,
    /// Commit time, RFC 3339.
    #[serde(default)]
    pub time: String,
    /// First line of the message.
    #[serde(default)]
    pub subject: String,
    /// The pull request the commit merged or squashed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>", range(min = 1))]
    pub pull_request: Option<u64>,
}

/// One sync run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncRun {
    /// The commit applied (or rejected).
    pub commit: CommitRef,
    /// When the run started, RFC 3339.
    pub started_at: String,
    /// How long it took, in seconds.
    pub duration_seconds: f64,
    /// `Applied`, `Failed` or `Interrupted`.
    pub result: String,
    /// Objects created.
    #[serde(default)]
    #[schemars(with = "i64", range(min = 0))]
    pub created: u32,
    /// Objects changed.
    #[serde(default)]
    #[schemars(with = "i64", range(min = 0))]
    pub configured: u32,
    /// Objects deleted, or Nodes whose capstan labels were released.
    #[serde(default)]
    #[schemars(with = "i64", range(min = 0))]
    pub pruned: u32,
    /// Objects found changed by hand (reverted, or only reported with `drift: warn`).
    #[serde(default)]
    #[schemars(with = "i64", range(min = 0))]
    pub drifted: u32,
    /// Why the run failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One object applied from Git.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    /// `apiVersion` it was applied with.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, for namespaced kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// Digest of the manifest as last applied (the first 16 hex digits of its canonical
    /// JSON's SHA-256): an unchanged digest with a changed live object is drift.
    pub digest: String,
}

/// One entry of the durable history.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "capstan.dev",
    version = "v1alpha1",
    kind = "HistoryRecord",
    namespaced,
    shortname = "hist",
    derive = "PartialEq",
    doc = "HistoryRecord is one commit-linked entry of capstan's history.",
    printcolumn(name = "Time", type_ = "string", json_path = ".spec.time"),
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Commit", type_ = "string", json_path = ".spec.commit.shortSha"),
    printcolumn(name = "PR", type_ = "integer", json_path = ".spec.commit.pullRequest"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "Message", type_ = "string", json_path = ".spec.message")
)]
#[serde(rename_all = "camelCase")]
pub struct HistoryRecordSpec {
    /// When it happened (for a step: when the step finished), RFC 3339 with microseconds.
    pub time: String,
    /// What kind of record it is.
    #[serde(rename = "type")]
    pub type_: RecordType,
    /// The `GitSync` it belongs to.
    pub sync: String,
    /// The commit that asked for it.
    pub commit: CommitRef,
    /// One line saying what happened.
    pub message: String,
    /// The objects a sync changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// The node an upgrade step ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The Module (`namespace/name`) an upgrade step is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The upgrade step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The version the node leaves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_version: Option<String>,
    /// The version the node moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_version: Option<String>,
    /// How long it took, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,
}

/// What a [`HistoryRecord`] records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RecordType {
    /// A commit was applied, or drift was found and handled.
    #[default]
    Sync,
    /// A commit was rejected: nothing of it was applied.
    Rejected,
    /// A step of an ordered upgrade on one node.
    UpgradeStep,
    /// A node cordoned, drained or uncordoned around its kmod steps under a campaign
    /// (`step` is `cordoned`, `drained` or `uncordoned`).
    Drain,
    /// A nodekeeper drain strategy that deleted pods or stripped their finalizers (`step`
    /// is the strategy's name, `message` lists the pods).
    DrainStrategy,
    /// A node gave up its `maxNodesInFlight` slot in the middle of an upgrade (`step` is
    /// `left`: the Node was deleted; `not-ready`: it stayed NotReady past
    /// `notReadyTimeout`), so that the rest of the fleet moves on.
    SlotReleased,
    /// A rollout gate's attempt on a node ended (`step` is `<gate> passed`, `<gate>
    /// retried` or `<gate> failed`); a failed gate halts the rollout.
    Gate,
}

impl RecordType {
    /// The name written in records and labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordType::Sync => "Sync",
            RecordType::Rejected => "Rejected",
            RecordType::UpgradeStep => "UpgradeStep",
            RecordType::Drain => "Drain",
            RecordType::DrainStrategy => "DrainStrategy",
            RecordType::SlotReleased => "SlotReleased",
            RecordType::Gate => "Gate",
        }
    }
}

/// One object a sync changed.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `created`, `configured`, `pruned`, `released` (a Node's capstan labels),
    /// `drift-reverted` or `drift-detected`.
    pub action: String,
    /// Kind.
    pub kind: String,
    /// Namespace, for namespaced kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// The steps a node goes through when its version label moves (seed 002), in order. A node
/// that gets a version label for the first time only loads and starts; one that loses it
/// only stops and unloads.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeStep {
    /// (1) The old version's device-plugin pod is gone from the node.
    DevicePluginStopped,
    /// (2) The old module version is unloaded (its ready label gone).
    OldModuleUnloaded,
    /// (3) The new module version is loaded.
    NewModuleLoaded,
    /// (4) The new version's device-plugin pod runs on the node.
    DevicePluginStarted,
}

impl UpgradeStep {
    /// Every step, in order.
    pub const ALL: [UpgradeStep; 4] = [
        UpgradeStep::DevicePluginStopped,
        UpgradeStep::OldModuleUnloaded,
        UpgradeStep::NewModuleLoaded,
        UpgradeStep::DevicePluginStarted,
    ];

    /// The steps of a move from `from` to `to` (either may be absent: a first label, or a
    /// label removed), in order.
    pub fn for_move(from: Option<&str>, to: Option<&str>) -> &'static [UpgradeStep] {
        match (from, to) {
            (Some(from), Some(to)) if from == to => &[],
            (Some(_), Some(_)) => &Self::ALL,
            (None, Some(_)) => &Self::ALL[2..],
            (Some(_), None) => &Self::ALL[..2],
            (None, None) => &[],
        }
    }

    /// The name written in records and events: `device-plugin-stopped`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            UpgradeStep::DevicePluginStopped => "device-plugin-stopped",
            UpgradeStep::OldModuleUnloaded => "old-module-unloaded",
            UpgradeStep::NewModuleLoaded => "new-module-loaded",
            UpgradeStep::DevicePluginStarted => "device-plugin-started",
        }
    }

    /// The step's number in seed 002's four (1 to 4).
    pub fn number(self) -> usize {
        self as usize + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_of_each_kind_of_move() {
        use UpgradeStep::*;
        let cases: [(Option<&str>, Option<&str>, &[UpgradeStep]); 5] = [
            (
                Some("v1"),
                Some("v2"),
                &[
                    DevicePluginStopped,
                    OldModuleUnloaded,
                    NewModuleLoaded,
                    DevicePluginStarted,
                ],
            ),
            (None, Some("v2"), &[NewModuleLoaded, DevicePluginStarted]),
            (Some("v1"), None, &[DevicePluginStopped, OldModuleUnloaded]),
            (Some("v1"), Some("v1"), &[]),
            (None, None, &[]),
        ];
        for (from, to, steps) in cases {
            assert_eq!(UpgradeStep::for_move(from, to), steps, "{from:?} -> {to:?}");
        }
        assert_eq!(DevicePluginStarted.number(), 4);
        assert_eq!(
            serde_json::to_value(OldModuleUnloaded).unwrap(),
            "old-module-unloaded"
        );
    }
}
