//! The notifications controller's reconciler, per `GitSync` with `spec.notifications`:
//! reads the commits to report on (the one last attempted, those whose moves the nodes
//! hold, those a target was last told are pending), their moves and step records, makes
//! each commit's [`Report`](super::Report), delivers those [`due`] to each target, and
//! writes what each target got to `GitSync.status.notifications`.
//!
//! It runs beside the rollout and never in its way: it writes nothing the other
//! controllers read, and a target that fails is retried with backoff while the others go
//! on. It looks at a `GitSync` at most once a second, however fast its nodes change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};

use super::github::{Auth, GitHub, comment_body};
use super::webhook;
use super::{
    MAX_DESCRIPTION, NodeView, Outcome, Pace, Report, Sent, State, StepSeen, due, moves, outcome,
    pace, report, retry_delay,
};
use crate::controllers::Context;
use crate::controllers::caches::Caches;
use crate::controllers::failures::WorkerFailures;
use crate::controllers::runner::Runner;
use crate::controllers::upgrade::drain::DrainState;
use crate::controllers::upgrade::{Campaigns, Policies, Progress, stamp_of};
use crate::history::commit_ref_of_stamp;
use crate::sync::pull_requests::{GITHUB_API, github_repository};
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::{ModuleKey, ModuleLabel, RECORD_COMMIT_LABEL, RECORD_SYNC_LABEL};
use capstan_api::nmc::NodeModulesConfig;
use capstan_api::{
    CommitRef, Delivered, GitSync, HistoryRecord, NotificationTarget, Notifications, RecordType,
    SecretKeyRef, UpgradeConfig, UpgradeStep, WebhookFormat,
};

/// The shortest time between two looks at one `GitSync`.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// How often a rollout still pending is looked at when nothing changes (a window opening,
/// a soak ending move no object).
const PENDING_RECHECK: Duration = Duration::from_secs(30);
/// Commits each target's status keeps.
const KEPT: usize = 20;

/// What the reconciles share.
struct Shared {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    syncs: Store<GitSync>,
    nmcs: Store<NodeModulesConfig>,
    upgrade_configs: Store<UpgradeConfig>,
    http: Result<reqwest::Client, String>,
    /// Per `GitSync`, what this process knows of its targets.
    memory: tokio::sync::Mutex<HashMap<String, SyncMemory>>,
}

/// What this process knows of one `GitSync`'s targets.
struct SyncMemory {
    /// The configuration the targets were built from.
    spec: Notifications,
    targets: Vec<Target>,
    last_look: Option<Instant>,
}

/// One target, its client and what it got.
struct Target {
    /// `github`, `github/comment` or `webhook/<name>`.
    name: String,
    kind: TargetKind,
    /// The last report it got, per commit SHA.
    sent: HashMap<String, Sent>,
    /// Commits delivered, newest first (what the status keeps).
    order: Vec<String>,
    /// Commits whose status this process asked GitHub for (statuses only).
    confirmed: std::collections::HashSet<String>,
    /// Reports sent per commit (the pace spaces pending ones as they add up).
    posts: HashMap<String, u32>,
    /// When the last report about each commit was sent, by this process.
    last_post: HashMap<String, Instant>,
    failures: u32,
    error: String,
    not_before: Option<Instant>,
}

enum TargetKind {
    Statuses(Arc<GitHub>),
    Comment(Arc<GitHub>),
    Webhook {
        format: WebhookFormat,
        url: String,
        key: Option<Vec<u8>>,
    },
    /// A target that could not be built (a Secret missing): its error is retried.
    Broken,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// Reading the cluster.
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

/// Runs the notifications controller until `ctx`'s shutdown.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (syncs, syncs_ready) = caches.syncs.reader();
    let (nmcs, nmcs_ready) = caches.nmcs.reader();
    let (upgrade_configs, configs_ready) = caches.upgrade_configs.reader();
    let sync_changes = caches.syncs.subscribe();
    let node_changes = caches.nodes.subscribe().map(|_| ());
    let nmc_changes = caches.nmcs.subscribe().map(|_| ());
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        nodes,
        syncs: syncs.clone(),
        nmcs,
        upgrade_configs,
        http: crate::controllers::checks::prometheus::client().map_err(|e| e.to_string()),
        memory: tokio::sync::Mutex::new(HashMap::new()),
    });
    // Any node or NMC change may move a rollout: every GitSync that notifies looks again.
    let notifying = {
        let syncs = syncs.clone();
        move |()| {
            syncs
                .state()
                .iter()
                .filter(|s| !s.spec.notifications.is_empty())
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let changes = futures::stream::select(node_changes, nmc_changes)
        .flat_map(move |()| futures::stream::iter(notifying(())));
    let controller = Controller::for_shared_stream(sync_changes, syncs).reconcile_on(changes);
    async move {
        Runner::new("notifications", &ctx)
            .reads_all([nodes_ready, syncs_ready, nmcs_ready, configs_ready])
            .run(controller, reconcile, shared)
            .await;
    }
}

async fn reconcile(sync: Arc<GitSync>, shared: Arc<Shared>) -> Result<Action, NotifyError> {
    let name = sync.name_any();
    let mut memory = shared.memory.lock().await;
    if sync.spec.notifications.is_empty() {
        // Notifications switched off: what they delivered goes from the status too.
        memory.remove(&name);
        write_status(&shared, &sync, &[]).await?;
        return Ok(Action::await_change());
    }
    // Built again when the configuration changed, and after a failure: a Secret created
    // or rotated since is read again.
    let rebuild = memory.get(&name).is_none_or(|m| {
        let retrying =
            |t: &Target| t.failures > 0 && t.not_before.is_none_or(|at| Instant::now() >= at);
        m.spec != sync.spec.notifications || m.targets.iter().any(retrying)
    });
    if rebuild {
        let mut targets = targets(&shared, &sync).await;
        if let Some(old) = memory.remove(&name) {
            for target in &mut targets {
                if let Some(before) = old.targets.iter().find(|t| t.name == target.name) {
                    target.sent.clone_from(&before.sent);
                    target.order.clone_from(&before.order);
                    target.confirmed.clone_from(&before.confirmed);
                    target.posts.clone_from(&before.posts);
                    target.last_post.clone_from(&before.last_post);
                    target.failures = before.failures;
                    target.not_before = before.not_before;
                    if target.error.is_empty() {
                        target.error.clone_from(&before.error);
                    }
                }
            }
            memory.insert(
                name.clone(),
                SyncMemory {
                    spec: sync.spec.notifications.clone(),
                    targets,
                    last_look: old.last_look,
                },
            );
        } else {
            memory.insert(
                name.clone(),
                SyncMemory {
                    spec: sync.spec.notifications.clone(),
                    targets,
                    last_look: None,
                },
            );
        }
    }
    let state = memory.get_mut(&name).expect("inserted above");
    if let Some(wait) = state
        .last_look
        .and_then(|at| MIN_INTERVAL.checked_sub(at.elapsed()))
    {
        tokio::time::sleep(wait).await;
    }
    state.last_look = Some(Instant::now());
    // The freshest GitSync: a sleep may have outlived the one handed in.
    let sync = shared
        .syncs
        .get(&ObjectRef::from_obj(sync.as_ref()))
        .unwrap_or(sync);
    let context = match context_of(&sync) {
        Ok(context) => context,
        Err(error) => {
            for target in &mut state.targets {
                target.error.clone_from(&error);
            }
            write_status(&shared, &sync, &state.targets).await?;
            return Ok(Action::await_change());
        }
    };
    let reports = reports(&shared, &sync, state).await?;
    let mut retry: Option<Duration> = None;
    for target in &mut state.targets {
        if let Some(wait) = deliver(&shared, &sync, &context, target, &reports).await {
            retry = Some(retry.map_or(wait, |r| r.min(wait)));
        }
    }
    write_status(&shared, &sync, &state.targets).await?;
    let pending = reports.iter().any(|r| r.state == State::Pending);
    Ok(match retry {
        Some(wait) => Action::requeue(wait),
        None if pending => Action::requeue(PENDING_RECHECK),
        None => Action::await_change(),
    })
}

/// The reports' context, or why there is none.
fn context_of(sync: &GitSync) -> Result<String, String> {
    let context = sync.spec.notifications.context.trim();
    if context.is_empty() {
        return Err(
            "spec.notifications.context: required: name this cluster's reports \
                    (capstan/prod-eu), so that two clusters' statuses never replace each other"
                .into(),
        );
    }
    Ok(context.to_string())
}

/// The targets of `sync`'s configuration, what each got seeded from the status (GitHub's
/// statuses are asked of GitHub instead, before the first post).
async fn targets(shared: &Shared, sync: &GitSync) -> Vec<Target> {
    let spec = &sync.spec.notifications;
    let seeded = sync
        .status
        .as_ref()
        .map(|s| s.notifications.clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut add = |name: String, kind: Result<TargetKind, String>| {
        let mut target = Target {
            name: name.clone(),
            kind: TargetKind::Broken,
            sent: HashMap::new(),
            order: Vec::new(),
            confirmed: Default::default(),
            posts: HashMap::new(),
            last_post: HashMap::new(),
            failures: 0,
            error: String::new(),
            not_before: None,
        };
        if let Some(status) = seeded.iter().find(|t| t.target == name) {
            for delivered in &status.delivered {
                if let Some(state) = State::parse(&delivered.state) {
                    target.sent.insert(
                        delivered.sha.clone(),
                        Sent {
                            state,
                            description: delivered.description.clone(),
                        },
                    );
                    target.order.push(delivered.sha.clone());
                    target.posts.insert(delivered.sha.clone(), delivered.posts);
                }
            }
            target.failures = status.failures;
        }
        match kind {
            Ok(kind) => target.kind = kind,
            Err(error) => target.error = error,
        }
        out.push(target);
    };
    if let Some(github) = &spec.github {
        let client = github_client(shared, sync).await.map(Arc::new);
        add("github".into(), client.clone().map(TargetKind::Statuses));
        if github.comment {
            add("github/comment".into(), client.map(TargetKind::Comment));
        }
    }
    for hook in &spec.webhooks {
        let kind = webhook_target(shared, hook).await;
        add(format!("webhook/{}", hook.name), kind);
    }
    out
}

async fn github_client(shared: &Shared, sync: &GitSync) -> Result<GitHub, String> {
    let spec = sync.spec.notifications.github.as_ref().expect("configured");
    let http = shared.http.clone()?;
    let repository = spec
        .repository
        .clone()
        .or_else(|| sync.spec.pull_requests.repository.clone())
        .or_else(|| github_repository(&sync.spec.repo))
        .ok_or_else(|| {
            "spec.notifications.github.repository is not set and the repository is not on github.com"
                .to_string()
        })?;
    let api = spec
        .api_url
        .clone()
        .or_else(|| sync.spec.pull_requests.api_url.clone())
        .unwrap_or_else(|| GITHUB_API.to_string());
    let auth = match (&spec.app, &spec.token_secret) {
        (Some(app), _) => {
            let pem = secret(shared, &app.private_key_secret).await?;
            Auth::app(app.app_id, app.installation_id, &pem).map_err(|e| e.to_string())?
        }
        (None, Some(token)) => {
            let token = secret(shared, token).await?;
            Auth::Token(String::from_utf8_lossy(&token).trim().to_string())
        }
        (None, None) => {
            return Err(
                "spec.notifications.github needs tokenSecret or app to authenticate".into(),
            );
        }
    };
    Ok(GitHub::new(&api, &repository, auth, http))
}

async fn webhook_target(
    shared: &Shared,
    hook: &capstan_api::Webhook,
) -> Result<TargetKind, String> {
    let url = match (&hook.url, &hook.url_secret) {
        (Some(url), None) => url.clone(),
        (None, Some(secret_ref)) => String::from_utf8_lossy(&secret(shared, secret_ref).await?)
            .trim()
            .to_string(),
        _ => {
            return Err(format!(
                "webhook {}: set exactly one of url and urlSecret",
                hook.name
            ));
        }
    };
    let key = match &hook.signing_secret {
        Some(secret_ref) => Some(secret(shared, secret_ref).await?),
        None => None,
    };
    Ok(TargetKind::Webhook {
        format: hook.format,
        url,
        key,
    })
}

/// A key of a Secret in capstan's namespace; the error names the Secret, never its data.
async fn secret(shared: &Shared, key: &SecretKeyRef) -> Result<Vec<u8>, String> {
    let api: Api<Secret> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
    let secret = api
        .get_opt(&key.name)
        .await
        .map_err(|e| format!("reading Secret {SYSTEM_NAMESPACE}/{}: {e}", key.name))?
        .ok_or_else(|| format!("Secret {SYSTEM_NAMESPACE}/{} not found", key.name))?;
    secret
        .data
        .and_then(|mut data| data.remove(&key.key))
        .map(|bytes| bytes.0)
        .ok_or_else(|| {
            format!(
                "Secret {SYSTEM_NAMESPACE}/{} has no key {:?}",
                key.name, key.key
            )
        })
}

/// The reports of every commit to report on, oldest commit first.
async fn reports(
    shared: &Shared,
    sync: &GitSync,
    memory: &SyncMemory,
) -> Result<Vec<Report>, kube::Error> {
    let name = sync.name_any();
    let status = sync.status.clone().unwrap_or_default();
    let policies = Policies::of(shared.syncs.state());
    let views: Vec<NodeView> = shared
        .nodes
        .state()
        .iter()
        .filter(|node| policies.sync_name(&node.name_any()) == name)
        .map(|node| node_view(shared, node))
        .collect();
    // The commits: the last attempted, those the nodes name, those a target holds pending.
    let mut commits: Vec<CommitRef> = Vec::new();
    let mut add = |commit: CommitRef| {
        if !commit.sha.is_empty() && !commits.iter().any(|c| c.sha == commit.sha) {
            commits.push(commit);
        }
    };
    if let Some(attempted) = &status.last_attempted_commit {
        add(attempted.clone());
    }
    for view in &views {
        for progress in view.progress.values() {
            if let Some(revision) = &progress.revision {
                add(commit_ref_of_stamp(revision, progress.pull_request));
            }
        }
        if let (Some(stamp), false) = (&view.stamp, view.unsettled.is_empty()) {
            add(commit_ref_of_stamp(stamp, None));
        }
    }
    for target in &memory.targets {
        for (sha, sent) in &target.sent {
            if sent.state == State::Pending {
                add(CommitRef {
                    sha: sha.clone(),
                    short_sha: sha.get(..7).unwrap_or(sha).to_string(),
                    ..CommitRef::default()
                });
            }
        }
    }
    // A commit no node names any more and every target holds a final report of is
    // settled: it is not looked at again (an idle fleet costs no request).
    let named: BTreeSet<String> = views
        .iter()
        .flat_map(|view| {
            let stamp = view.stamp.iter().filter(|_| !view.unsettled.is_empty());
            view.progress
                .values()
                .filter_map(|p| p.revision.as_ref())
                .chain(stamp)
                .map(|revision| commit_ref_of_stamp(revision, None).sha)
        })
        .collect();
    let settled = |sha: &str| {
        !named.contains(sha)
            && memory
                .targets
                .iter()
                .filter(|t| !matches!(t.kind, TargetKind::Broken))
                .all(|t| t.sent.get(sha).is_some_and(|s| s.state != State::Pending))
    };
    let applying = status.phase == "Applying"
        && status.last_applied_commit.as_ref().map(|c| &c.sha)
            != status.last_attempted_commit.as_ref().map(|c| &c.sha);
    commits.retain(|commit| {
        let last = status
            .last_attempted_commit
            .as_ref()
            .is_some_and(|c| c.sha == commit.sha);
        (last && applying) || !settled(&commit.sha)
    });
    // The runs know a commit best (its subject, its pull request).
    let commits: Vec<CommitRef> = commits
        .into_iter()
        .map(|commit| {
            status
                .runs
                .iter()
                .map(|run| &run.commit)
                .chain(status.last_attempted_commit.iter())
                .chain(status.last_applied_commit.iter())
                .find(|known| known.sha == commit.sha)
                .cloned()
                .unwrap_or(commit)
        })
        .collect();
    let configs = shared.upgrade_configs.state();
    let campaigns = Campaigns::of(configs.iter().map(|c| c.as_ref()));
    let failed_campaigns: BTreeMap<String, String> = configs
        .iter()
        .filter_map(|config| {
            let version = &config.spec.desired.version;
            let gate = campaigns.get(Some(version)).filter(|gate| gate.failed())?;
            Some((version.clone(), gate.name.clone()))
        })
        .collect();
    let records: Api<HistoryRecord> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
    let mut out = Vec::new();
    for commit in commits.iter().rev() {
        let listed = records
            .list(&ListParams::default().labels(&format!(
                "{RECORD_COMMIT_LABEL}={},{RECORD_SYNC_LABEL}={name}",
                commit.sha
            )))
            .await?
            .items;
        let rejected = listed.iter().any(|r| r.spec.type_ == RecordType::Rejected);
        let mut outcome = outcome(&status, &commit.sha, rejected);
        let steps: Vec<StepSeen> = listed
            .iter()
            .filter(|r| r.spec.type_ == RecordType::UpgradeStep)
            .filter_map(|r| {
                Some(StepSeen {
                    node: r.spec.node.clone()?,
                    module: r.spec.module.clone()?,
                    from: r.spec.from_version.clone(),
                    to: r.spec.to_version.clone(),
                    step: serde_json::from_value::<UpgradeStep>(serde_json::Value::String(
                        r.spec.step.clone()?,
                    ))
                    .ok()?,
                })
            })
            .collect();
        let revision = if commit.revision.is_empty() {
            format!("{}@sha1:{}", sync.spec.branch, commit.sha)
        } else {
            commit.revision.clone()
        };
        let moves = moves(&revision, &views, &steps, &failed_campaigns);
        // The newest commit relabelled a node the cache does not show relabelled yet: its
        // moves are not known yet (a success now would turn pending again).
        let newest = status
            .last_attempted_commit
            .as_ref()
            .is_some_and(|c| c.sha == commit.sha);
        let lagging = newest
            && listed
                .iter()
                .filter(|r| r.spec.type_ == RecordType::Sync)
                .flat_map(|r| &r.spec.changes)
                .filter(|change| change.kind == "Node" && change.action == "configured")
                .any(|change| {
                    views
                        .iter()
                        .find(|v| v.name == change.name)
                        .is_some_and(|v| v.stamp.as_deref() != Some(revision.as_str()))
                });
        if lagging && outcome == Outcome::Applied {
            outcome = Outcome::Applying;
        }
        out.push(report(commit, &outcome, &moves));
    }
    Ok(out)
}

/// What [`moves`] reads of `node`.
fn node_view(shared: &Shared, node: &Node) -> NodeView {
    let annotations = node.annotations();
    let labels = node.labels();
    let mut progress = BTreeMap::new();
    for (annotation, value) in annotations {
        if let (Some(key), Some(p)) = (
            ModuleKey::from_upgrade_annotation(annotation),
            Progress::from_annotation(value),
        ) {
            progress.insert(key.to_string(), p);
        }
    }
    let mut unsettled = BTreeMap::new();
    let mut keys: BTreeSet<ModuleKey> = BTreeSet::new();
    for label in labels.keys() {
        for (_, key) in ModuleLabel::parse(label) {
            keys.insert(key);
        }
    }
    for key in keys {
        let version = |label: String| labels.get(&label).filter(|v| !v.is_empty()).cloned();
        let m = version(key.version_module_label());
        let w = version(key.version_worker_pod_label());
        let d = version(key.version_device_plugin_label());
        let settled = match &m {
            Some(_) => w == m && d == m,
            None => w.is_none() && d.is_none(),
        };
        if !settled {
            unsettled.insert(key.to_string(), (m, w));
        }
    }
    let worker_failures = shared
        .nmcs
        .get(&ObjectRef::new(&node.name_any()))
        .map(|nmc| WorkerFailures::of(&nmc))
        .unwrap_or_default();
    NodeView {
        name: node.name_any(),
        stamp: stamp_of(annotations).revision,
        progress,
        unsettled,
        drained: DrainState::of(annotations).is_some_and(|d| d.drained()),
        worker_failures: worker_failures
            .modules()
            .into_iter()
            .filter_map(|key| Some((key.to_string(), worker_failures.get(&key)?.clone())))
            .collect(),
    }
}

/// Delivers to `target` the reports due, oldest commit first; the wait before it should be
/// looked at again: after a failure, its backoff; a pending report held by the pace, its
/// wait.
async fn deliver(
    shared: &Shared,
    sync: &GitSync,
    context: &str,
    target: &mut Target,
    reports: &[Report],
) -> Option<Duration> {
    let now = Instant::now();
    if let Some(at) = target.not_before.filter(|at| now < *at) {
        return Some(at - now);
    }
    let name = sync.name_any();
    let mut later: Option<Duration> = None;
    for report in reports {
        let sha = report.commit.sha.clone();
        let result = match confirm(target, report, context).await {
            Ok(()) => {
                let pace_of = match target.kind {
                    TargetKind::Webhook {
                        format: WebhookFormat::Slack,
                        ..
                    } => Pace::StateChanges,
                    _ => Pace::Every,
                };
                let since = target.last_post.get(&sha).map(|at| at.elapsed());
                let posts = target.posts.get(&sha).copied().unwrap_or(0);
                match pace(report, target.sent.get(&sha), posts, since, pace_of) {
                    None => continue,
                    Some(wait) if !wait.is_zero() => {
                        later = Some(later.map_or(wait, |l| l.min(wait)));
                        continue;
                    }
                    Some(_) => send(shared, sync, context, target, report).await,
                }
            }
            Err(error) => Err(error),
        };
        match result {
            Ok(()) => {
                shared.ctx.metrics.notified(&name, &target.name, true);
                target.failures = 0;
                target.error.clear();
                target.not_before = None;
                target.sent.insert(
                    sha.clone(),
                    Sent {
                        state: report.state,
                        description: report.description.clone(),
                    },
                );
                *target.posts.entry(sha.clone()).or_default() += 1;
                target.last_post.insert(sha.clone(), Instant::now());
                target.order.retain(|s| *s != sha);
                target.order.insert(0, sha);
                target.order.truncate(KEPT);
                let order = target.order.clone();
                target.sent.retain(|sha, _| order.contains(sha));
                target.posts.retain(|sha, _| order.contains(sha));
            }
            Err(error) => {
                shared.ctx.metrics.notified(&name, &target.name, false);
                target.failures += 1;
                target.error = error;
                let wait = retry_delay(target.failures);
                target.not_before = Some(Instant::now() + wait);
                tracing::warn!(
                    sync = %name,
                    target = %target.name,
                    error = %target.error,
                    retry_in = ?wait,
                    "notification failed"
                );
                return Some(wait);
            }
        }
    }
    later
}

/// Learns what GitHub holds for the report's commit before this process's first post
/// about it: a status another process posted before it stopped (and could not write
/// down) is not posted again. Other targets know only what the status says.
async fn confirm(target: &mut Target, report: &Report, context: &str) -> Result<(), String> {
    let TargetKind::Statuses(github) = &target.kind else {
        return Ok(());
    };
    let sha = &report.commit.sha;
    if target.confirmed.contains(sha) || !due(report, target.sent.get(sha)) {
        return Ok(());
    }
    match github
        .latest_status(sha, context)
        .await
        .map_err(|e| e.to_string())?
    {
        Some(held) => target.sent.insert(sha.clone(), held),
        None => target.sent.remove(sha),
    };
    target.confirmed.insert(sha.clone());
    Ok(())
}

/// Sends `report` to `target`.
async fn send(
    shared: &Shared,
    sync: &GitSync,
    context: &str,
    target: &Target,
    report: &Report,
) -> Result<(), String> {
    let github_spec = sync.spec.notifications.github.as_ref();
    match &target.kind {
        TargetKind::Broken => Err(target.error.clone()),
        TargetKind::Statuses(github) => {
            crate::crash::point("notify.status.before");
            github
                .post_status(
                    report,
                    context,
                    github_spec.and_then(|g| g.target_url.as_deref()),
                )
                .await
                .map_err(|e| e.to_string())?;
            crate::crash::point("notify.status.after");
            Ok(())
        }
        TargetKind::Comment(github) => {
            let Some(number) = report.commit.pull_request else {
                return Ok(());
            };
            // Found by its marker and author, and left as it is when it says the same.
            github
                .upsert_comment(number, context, &comment_body(context, report))
                .await
                .map_err(|e| e.to_string())
        }
        TargetKind::Webhook { format, url, key } => {
            let http = shared.http.clone()?;
            let delivery =
                webhook::delivery(*format, &sync.name_any(), context, report, key.as_deref());
            let mut request = http
                .post(url)
                .timeout(super::github::TIMEOUT)
                .header("Content-Type", "application/json")
                .body(delivery.body);
            for (header, value) in delivery.headers {
                request = request.header(header, value);
            }
            // The URL may hold a credential (Slack's): errors name the webhook, not it.
            let hook = &target.name;
            let response = request
                .send()
                .await
                .map_err(|e| format!("{hook}: {}", without_url(&e)))?;
            if !response.status().is_success() {
                return Err(format!("{hook}: answered {}", response.status()));
            }
            Ok(())
        }
    }
}

/// A reqwest error's message without the URL it carries.
fn without_url(error: &reqwest::Error) -> String {
    let mut chain = Vec::new();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(error);
    while let Some(err) = source {
        chain.push(err.to_string());
        source = err.source();
    }
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "request failed"
    };
    match chain.last() {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_string(),
    }
}

/// Writes what each target got, and what fails, to the `GitSync`'s status when it changed.
async fn write_status(
    shared: &Shared,
    sync: &GitSync,
    targets: &[Target],
) -> Result<(), kube::Error> {
    let status: Vec<NotificationTarget> = targets
        .iter()
        .map(|target| NotificationTarget {
            target: target.name.clone(),
            delivered: target
                .order
                .iter()
                .filter_map(|sha| {
                    let sent = target.sent.get(sha)?;
                    Some(Delivered {
                        sha: sha.clone(),
                        state: sent.state.as_str().to_string(),
                        description: super::shorten(&sent.description, MAX_DESCRIPTION),
                        posts: target.posts.get(sha).copied().unwrap_or(0),
                    })
                })
                .collect(),
            failures: target.failures,
            error: target.error.clone(),
        })
        .collect();
    let live = sync
        .status
        .as_ref()
        .map(|s| s.notifications.clone())
        .unwrap_or_default();
    if live == status {
        return Ok(());
    }
    let api: Api<GitSync> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
    let patch = serde_json::json!({ "status": { "notifications": status } });
    api.patch_status(
        &sync.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}
