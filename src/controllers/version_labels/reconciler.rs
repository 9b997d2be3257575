//! The version-label controller's reconciler: one reconcile per Node, for every Module whose
//! version labels or upgrade annotation the node carries.
//!
//! It watches Nodes (the trigger and the fleet the slots are counted over), Modules (a
//! change reconciles every node labelled for the Module), device-plugin pods (a change
//! reconciles the pod's node) and the `GitSync`s in `capstan-system` (a change of policy
//! reconciles every node). A reconcile:
//!
//! 1. returns at once when the cached node has nothing to move;
//! 2. reads the node afresh, gathers the facts of each Module on it and the gate (the
//!    policy of the `GitSync` that applies the node, the slots counted over every node);
//! 3. calls [`decide`] per Module; a W removal and the "device plugin stopped" step are
//!    confirmed with a live list of the node's device-plugin pods, never a cache;
//! 4. records each step reached (history record, then, when the record is new, an Event
//!    on the Node and one on the Module);
//! 5. writes the labels and upgrade annotations in one JSON merge patch (field manager
//!    `capstan-version-labels`, conditional on the node's resourceVersion);
//! 6. announces new policy waits (an Event on the Node), and requeues while a guard or the
//!    policy waits.
//!
//! When a node's last upgrade ends, the nodes first in line for the freed slots are
//! reconciled at once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Map, Value, json};

use super::{
    Decision, Gate, LabelWrite, NodeModuleFacts, Outcome, PolicyWait, Progress, Slot, Standing,
    StepReached, VersionLabels, Wait, decide, label_action, slot, standing,
};
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::{
    DEVICE_PLUGIN_ROLE, FROM_VERSION_ANNOTATION, MODULE_ANNOTATION, MODULE_NAME_LABEL, ModuleKey,
    ModuleLabel, PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION, ROLE_LABEL, TO_VERSION_ANNOTATION,
    UPGRADE_ANNOTATION_PREFIX, UPGRADE_STEP_ANNOTATION,
};
use capstan_api::module::Module;
use capstan_api::{
    CommitRef, GitSync, HistoryRecord, HistoryRecordSpec, RecordType, UpgradePolicy, UpgradeStep,
};
use capstan_api::clock::rfc3339_micros;
use crate::controllers::context::{Context, managers};
use crate::history::{self, EventTarget};
use crate::sync::inventory::DEFAULT_SYNC_NAME;

/// Changes a watch subscriber may fall behind by before the watch waits for it.
const BUFFER: usize = 4096;
/// Next look while a guard waits (the pod and node watches usually come first).
const GUARD_RECHECK: Duration = Duration::from_secs(5);
/// Next look while the policy holds a node (a freed slot or a policy change come first).
const POLICY_RECHECK: Duration = Duration::from_secs(30);
/// Next look at a node whose upgrade waits for a module load or a device plugin.
const UPGRADE_RECHECK: Duration = Duration::from_secs(60);
/// Next look after the node changed under a write (the watch brings the change).
const CONFLICT_RETRY: Duration = Duration::from_millis(200);
/// Wait after a first failed reconcile; it doubles with each failure in a row.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest wait after failed reconciles.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why a reconcile failed; it is retried with a growing delay.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The cluster refused or failed a read or write.
    #[error("node {node}: {what}: {source}")]
    Api {
        /// The node reconciled.
        node: String,
        /// What was being done.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What every reconcile reads: the caches, and the state of the watch mappers.
struct Shared {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    modules: Store<Module>,
    device_plugins: Store<Pod>,
    syncs: Store<GitSync>,
    /// Failed reconciles in a row, by node, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
}

/// Runs the controller until `ctx.shutdown` is cancelled; reconciles in flight finish
/// first.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let mut watches = tokio::task::JoinSet::new();

    let (nodes, node_writer) = reflector::store_shared::<Node>(BUFFER);
    let node_changes = node_writer.subscribe().expect("a shared store");
    let node_ends = node_writer.subscribe().expect("a shared store");
    watches.spawn(drive(
        "Node",
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect_shared(node_writer),
    ));

    let (modules, module_writer) = reflector::store_shared::<Module>(BUFFER);
    let module_changes = module_writer.subscribe().expect("a shared store");
    watches.spawn(drive(
        "Module",
        watcher(
            Api::<Module>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect_shared(module_writer),
    ));

    // Shared stores tell subscribers of changes, not of deletions: a device-plugin pod
    // going is what a node waits for, so its watch sends the pod's node itself. The watch
    // runs in its own task and its channel never blocks it, so its store keeps up whatever
    // the controller does.
    let (device_plugins, pod_writer) = reflector::store::<Pod>();
    let device_plugin_pods =
        watcher::Config::default().labels(&format!("{ROLE_LABEL}={DEVICE_PLUGIN_ROLE}"));
    let (pod_nodes, pod_changes) = futures::channel::mpsc::unbounded();
    watches.spawn(drive(
        "Pod",
        watcher(Api::<Pod>::all(client.clone()), device_plugin_pods)
            .default_backoff()
            .reflect(pod_writer)
            .inspect(move |event| {
                if let Ok(
                    watcher::Event::Apply(pod)
                    | watcher::Event::Delete(pod)
                    | watcher::Event::InitApply(pod),
                ) = event
                    && let Some(node) = node_of_pod(pod)
                {
                    let _ = pod_nodes.unbounded_send(node);
                }
            }),
    ));

    let (syncs, sync_writer) = reflector::store_shared::<GitSync>(BUFFER);
    let sync_changes = sync_writer.subscribe().expect("a shared store");
    watches.spawn(drive(
        "GitSync",
        watcher(
            Api::<GitSync>::namespaced(client.clone(), SYSTEM_NAMESPACE),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect_shared(sync_writer),
    ));

    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        nodes: nodes.clone(),
        modules,
        device_plugins,
        syncs,
        failures: Mutex::new(HashMap::new()),
    });
    // An empty Module store would hide every new move, an empty pod store every
    // device-plugin pod. Waited for here, once: a store wakes only one waiter.
    let ready = futures::future::join(
        shared.modules.wait_until_ready(),
        shared.device_plugins.wait_until_ready(),
    );
    tokio::select! {
        _ = ready => {}
        () = ctx.shutdown.cancelled() => return,
    }
    let shutdown = ctx.shutdown.clone();
    Controller::for_shared_stream(node_changes, nodes)
        .watches_shared_stream(module_changes, {
            let shared = shared.clone();
            move |module: Arc<Module>| nodes_of_module(&shared, &module)
        })
        .reconcile_on(pod_changes)
        .watches_shared_stream(sync_changes, {
            let shared = shared.clone();
            let seen: Mutex<HashMap<String, (Option<UpgradePolicy>, bool)>> =
                Mutex::new(HashMap::new());
            move |sync: Arc<GitSync>| policy_changed(&shared, &seen, &sync)
        })
        .watches_shared_stream(node_ends, {
            let shared = shared.clone();
            let upgrading: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
            move |node: Arc<Node>| next_in_line(&shared, &upgrading, &node)
        })
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, shared)
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::debug!(%err, "version-labels controller");
            }
        })
        .await;
    watches.shutdown().await;
}

/// Polls a watch so its store fills and its subscribers hear of changes.
async fn drive<S, T>(kind: &'static str, stream: S)
where
    S: futures::Stream<Item = Result<T, watcher::Error>>,
{
    stream
        .for_each(|event| async move {
            if let Err(err) = event {
                tracing::warn!(%err, kind, "watch failed; retrying");
            }
        })
        .await;
}

async fn reconcile(node: Arc<Node>, shared: Arc<Shared>) -> Result<Action, ReconcileError> {
    let name = node.name_any();
    let result = reconcile_node(&node, &shared).await;
    if result.is_ok() {
        lock(&shared.failures).remove(&name);
    }
    result
}

fn error_policy(node: Arc<Node>, err: &ReconcileError, shared: Arc<Shared>) -> Action {
    let failures = {
        let mut failures = lock(&shared.failures);
        let count = failures.entry(node.name_any()).or_default();
        *count = count.saturating_add(1);
        *count
    };
    let delay = BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
        .min(BACKOFF_MAX);
    tracing::warn!(%err, retry_in = ?delay, "version-labels reconcile failed");
    Action::requeue(delay)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One Module on the node being reconciled, with its facts and decision.
struct ModuleDecision {
    key: ModuleKey,
    facts: NodeModuleFacts,
    decision: Decision,
}

async fn reconcile_node(cached: &Node, shared: &Shared) -> Result<Action, ReconcileError> {
    let name = cached.name_any();
    let failed = |what: &'static str| {
        let node = name.clone();
        move |source| ReconcileError::Api { node, what, source }
    };
    if !has_work(shared, cached) {
        tracing::trace!(node = %name, "nothing to move");
        return Ok(Action::await_change());
    }
    let client = &shared.ctx.client;
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(&name).await.map_err(failed("reading"))? else {
        return Ok(Action::await_change());
    };
    let policies = Policies::read(shared)
        .await
        .map_err(failed("reading the GitSyncs"))?;
    let policy = policies.policy_for(&name);
    let now = shared.ctx.clock.now();

    let keys = module_keys(shared, &node);
    let facts: Vec<(ModuleKey, NodeModuleFacts)> = keys
        .into_iter()
        .map(|key| {
            let facts = facts_of(shared, &node, &key, true);
            (key, facts)
        })
        .collect();
    let own = standing(
        facts.iter().map(|(_, facts)| facts),
        policy.require_pull_request,
    );
    let mut fleet = fleet_standings(shared, &policies);
    if own == Standing::Queued && slot(&name, own, &fleet, &policy) == Slot::Free {
        // About to start: count the slots on the nodes as the API server has them, since a
        // cache that missed another node's start (a watch that dropped) would let two
        // nodes into one slot. Standings read labels and annotations only: metadata is
        // enough.
        let listed: Vec<Node> = nodes
            .list_metadata(&ListParams::default())
            .await
            .map_err(failed("listing nodes"))?
            .items
            .into_iter()
            .map(|partial| Node {
                metadata: partial.metadata,
                ..Node::default()
            })
            .collect();
        fleet = standings_of(shared, &policies, listed.iter());
    }
    let gate = Gate {
        slot: slot(&name, own, &fleet, &policy),
        require_pull_request: policy.require_pull_request,
        sync_applying: policies.applying(&name),
    };

    let mut decided = Vec::new();
    for (key, mut facts) in facts {
        let mut decision = decide(&facts, &gate, now);
        let unloads = decision.outcome == Outcome::Write(LabelWrite::RemoveWorkerPod);
        let stopped = decision
            .step
            .as_ref()
            .is_some_and(|s| s.step == UpgradeStep::DevicePluginStopped);
        if (unloads || stopped) && !facts.device_plugin_pod_remains {
            // The module goes only once its device plugin is gone: ask the API server,
            // not a cache that may not have seen a new pod yet.
            if device_plugin_pods_remain(client, &key, &name)
                .await
                .map_err(failed("listing device-plugin pods"))?
            {
                facts.device_plugin_pod_remains = true;
                decision = decide(&facts, &gate, now);
            }
        }
        tracing::debug!(node = %name, module = %key, ?facts, ?gate, ?decision, "decided");
        decided.push(ModuleDecision {
            key,
            facts,
            decision,
        });
    }

    for entry in &mut decided {
        let Some(step) = entry.decision.step.clone() else {
            continue;
        };
        let at = record_step(shared, &policies, &node, &entry.key, &step, now)
            .await
            .map_err(failed("recording an upgrade step"))?;
        if let Some(progress) = entry.decision.progress.as_mut() {
            progress.step_at = Some(at);
        }
    }

    if let Some(patch) = node_patch(&node, &decided) {
        let params = PatchParams {
            field_manager: Some(managers::VERSION_LABELS.to_string()),
            ..PatchParams::default()
        };
        crate::crash::point("upgrade.labels.before");
        match nodes.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => crate::crash::point("upgrade.labels.after"),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            Err(err) => return Err(failed("writing labels")(err)),
        }
    }

    for entry in decided.iter().filter(|entry| entry.decision.announce) {
        announce_wait(shared, &policies, &node, entry, &gate).await;
    }
    Ok(next_look(&decided))
}

/// When to look at the node again.
fn next_look(decided: &[ModuleDecision]) -> Action {
    let waits = |kind: fn(&Wait) -> bool| {
        decided.iter().any(|entry| match &entry.decision.outcome {
            Outcome::Wait(wait) => kind(wait),
            _ => false,
        })
    };
    if waits(|wait| matches!(wait, Wait::Guard(_))) {
        Action::requeue(GUARD_RECHECK)
    } else if waits(|wait| matches!(wait, Wait::Policy(_) | Wait::SyncApplying)) {
        Action::requeue(POLICY_RECHECK)
    } else if decided
        .iter()
        .any(|entry| entry.decision.progress.is_some())
    {
        Action::requeue(UPGRADE_RECHECK)
    } else {
        Action::await_change()
    }
}

// ---- facts ----

/// The Modules a node carries version labels or an upgrade annotation of. A
/// `version-module` label alone counts only when its Module exists.
fn module_keys(shared: &Shared, node: &Node) -> BTreeSet<ModuleKey> {
    let mut keys = BTreeSet::new();
    for label in node.labels().keys() {
        for (kind, key) in ModuleLabel::parse(label) {
            let counts = match kind {
                ModuleLabel::VersionWorkerPod | ModuleLabel::VersionDevicePlugin => true,
                ModuleLabel::VersionModule => module_of(shared, &key).is_some(),
                _ => false,
            };
            if counts {
                keys.insert(key);
            }
        }
    }
    keys.extend(
        node.annotations()
            .keys()
            .filter(|key| key.starts_with(UPGRADE_ANNOTATION_PREFIX))
            .filter_map(|key| ModuleKey::from_upgrade_annotation(key)),
    );
    keys
}

fn module_of(shared: &Shared, key: &ModuleKey) -> Option<Arc<Module>> {
    shared
        .modules
        .get(&ObjectRef::new(key.name()).within(key.namespace()))
}

/// The facts of one Module on a node; the device-plugin facts only with `pods` (the slots
/// do not need them).
fn facts_of(shared: &Shared, node: &Node, key: &ModuleKey, pods: bool) -> NodeModuleFacts {
    let labels = node.labels();
    let annotations = node.annotations();
    let name = node.name_any();
    let (remains, running) = if pods {
        let on_node: Vec<Arc<Pod>> = shared.device_plugins.state_filter(|pod| {
            pod.namespace().as_deref() == Some(key.namespace())
                && pod.labels().get(MODULE_NAME_LABEL).map(String::as_str) == Some(key.name())
                && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())
        });
        let running = on_node.iter().any(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        });
        (!on_node.is_empty(), running)
    } else {
        (false, false)
    };
    NodeModuleFacts {
        labels: VersionLabels::of(key, labels),
        module_loaded: labels.contains_key(&key.ready_label()),
        loaded_version: labels.get(&key.version_ready_label()).cloned(),
        device_plugin_pod_remains: remains,
        device_plugin_running: running,
        has_device_plugin: module_of(shared, key)
            .is_some_and(|module| module.spec.device_plugin.is_some()),
        progress: annotations
            .get(&key.upgrade_annotation())
            .and_then(|text| Progress::from_annotation(text)),
        stamp: super::Stamp {
            revision: annotations
                .get(REVISION_ANNOTATION)
                .filter(|r| !r.is_empty())
                .cloned(),
            pull_request: annotations
                .get(PULL_REQUEST_ANNOTATION)
                .and_then(|pr| pr.parse().ok()),
        },
    }
}

/// Whether the cached node has anything to move or an upgrade to follow.
fn has_work(shared: &Shared, node: &Node) -> bool {
    module_keys(shared, node).iter().any(|key| {
        let facts = facts_of(shared, node, key, false);
        facts.progress.is_some()
            || !matches!(
                label_action(&facts.labels, facts.module_loaded, false),
                super::TableAction::Nothing | super::TableAction::OutsideTable
            )
    })
}

/// Every cached node's standing, for the slots.
fn fleet_standings(shared: &Shared, policies: &Policies) -> Vec<(String, Standing)> {
    standings_of(
        shared,
        policies,
        shared.nodes.state().iter().map(Arc::as_ref),
    )
}

/// The standing of each of `nodes`.
fn standings_of<'a>(
    shared: &Shared,
    policies: &Policies,
    nodes: impl Iterator<Item = &'a Node>,
) -> Vec<(String, Standing)> {
    nodes
        .map(|node| {
            let name = node.name_any();
            let facts: Vec<NodeModuleFacts> = module_keys(shared, node)
                .iter()
                .map(|key| facts_of(shared, node, key, false))
                .collect();
            let standing = standing(&facts, policies.policy_for(&name).require_pull_request);
            (name, standing)
        })
        .collect()
}

/// Whether a device-plugin pod of `key` is on `node`, in any phase, as the API server sees
/// it now.
async fn device_plugin_pods_remain(
    client: &kube::Client,
    key: &ModuleKey,
    node: &str,
) -> Result<bool, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), key.namespace());
    let params = ListParams::default()
        .labels(&format!(
            "{ROLE_LABEL}={DEVICE_PLUGIN_ROLE},{MODULE_NAME_LABEL}={}",
            key.name()
        ))
        .fields(&format!("spec.nodeName={node}"));
    Ok(!pods.list_metadata(&params).await?.items.is_empty())
}

// ---- policy ----

/// The `GitSync`s, which say each node's policy: that of the `GitSync` whose inventory
/// holds the Node; for a node no `GitSync` applies, the strictest of them all; with no
/// `GitSync`, the defaults.
struct Policies {
    syncs: Vec<Arc<GitSync>>,
    owners: HashMap<String, usize>,
}

impl Policies {
    fn of(syncs: Vec<Arc<GitSync>>) -> Policies {
        let mut owners = HashMap::new();
        for (index, sync) in syncs.iter().enumerate() {
            for entry in sync.status.iter().flat_map(|status| &status.inventory) {
                if entry.kind == "Node" && entry.api_version == "v1" {
                    owners.entry(entry.name.clone()).or_insert(index);
                }
            }
        }
        Policies { syncs, owners }
    }

    /// From the cache once it has listed the `GitSync`s, else (capstan's kinds may not be
    /// served yet) from the API server; a cluster without the kind has no `GitSync`.
    async fn read(shared: &Shared) -> Result<Policies, kube::Error> {
        if let Some(Ok(())) = shared.syncs.wait_until_ready().now_or_never() {
            return Ok(Policies::of(shared.syncs.state()));
        }
        let api: Api<GitSync> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(Policies::of(list.items.into_iter().map(Arc::new).collect())),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(Policies::of(Vec::new())),
            Err(err) => Err(err),
        }
    }

    /// The `GitSync` that applies `node`: its owner, else the only one.
    fn sync_for(&self, node: &str) -> Option<&GitSync> {
        match self.owners.get(node) {
            Some(index) => self.syncs.get(*index).map(Arc::as_ref),
            None if self.syncs.len() == 1 => self.syncs.first().map(Arc::as_ref),
            None => None,
        }
    }

    fn policy_of(sync: &GitSync) -> UpgradePolicy {
        sync.status
            .as_ref()
            .and_then(|status| status.policy.clone())
            .unwrap_or_default()
    }

    fn policy_for(&self, node: &str) -> UpgradePolicy {
        if let Some(index) = self.owners.get(node) {
            return self
                .syncs
                .get(*index)
                .map(|s| Self::policy_of(s))
                .unwrap_or_default();
        }
        self.syncs
            .iter()
            .map(|sync| Self::policy_of(sync))
            .reduce(|a, b| UpgradePolicy {
                max_nodes_in_flight: a.max_nodes_in_flight.min(b.max_nodes_in_flight),
                require_pull_request: a.require_pull_request || b.require_pull_request,
            })
            .unwrap_or_default()
    }

    /// Whether the sync that applies `node` is writing a commit.
    fn applying(&self, node: &str) -> bool {
        self.sync_for(node).is_some_and(applying)
    }

    /// The name records of `node` are filed under.
    fn sync_name(&self, node: &str) -> String {
        self.sync_for(node)
            .map_or(DEFAULT_SYNC_NAME.to_string(), |sync| sync.name_any())
    }
}

// ---- watch mappers ----

/// The nodes labelled for `module`.
fn nodes_of_module(shared: &Shared, module: &Module) -> Vec<ObjectRef<Node>> {
    let Ok(key) = module.key() else {
        return Vec::new();
    };
    let labels = [
        key.version_module_label(),
        key.version_worker_pod_label(),
        key.version_device_plugin_label(),
    ];
    let annotation = key.upgrade_annotation();
    shared
        .nodes
        .state()
        .iter()
        .filter(|node| {
            labels.iter().any(|label| node.labels().contains_key(label))
                || node.annotations().contains_key(&annotation)
        })
        .map(|node| ObjectRef::from_obj(node.as_ref()))
        .collect()
}

/// The node a pod is on.
fn node_of_pod(pod: &Pod) -> Option<ObjectRef<Node>> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.node_name.as_deref())
        .map(ObjectRef::new)
}

/// Whether a `GitSync` is writing a commit.
fn applying(sync: &GitSync) -> bool {
    sync.status
        .as_ref()
        .is_some_and(|status| status.phase == "Applying")
}

/// Every node, when a `GitSync`'s policy changed or it finished writing a commit (moves
/// wait for that, see [`Gate::sync_applying`]).
fn policy_changed(
    shared: &Shared,
    seen: &Mutex<HashMap<String, (Option<UpgradePolicy>, bool)>>,
    sync: &GitSync,
) -> Vec<ObjectRef<Node>> {
    let policy = sync
        .status
        .as_ref()
        .and_then(|status| status.policy.clone());
    let now = (policy, applying(sync));
    let previous = lock(seen).insert(sync.name_any(), now.clone());
    let wakes = match previous {
        Some((policy, was_applying)) => policy != now.0 || (was_applying && !now.1),
        None => true,
    };
    if !wakes {
        return Vec::new();
    }
    shared
        .nodes
        .state()
        .iter()
        .map(|node| ObjectRef::from_obj(node.as_ref()))
        .collect()
}

/// When a node's last upgrade ended, the queued nodes that may take the freed slots, in
/// name order.
fn next_in_line(
    shared: &Shared,
    upgrading: &Mutex<HashSet<String>>,
    node: &Node,
) -> Vec<ObjectRef<Node>> {
    let name = node.name_any();
    let still = node.annotations().iter().any(|(key, value)| {
        key.starts_with(UPGRADE_ANNOTATION_PREFIX)
            && Progress::from_annotation(value).is_some_and(|p| p.upgrading())
    });
    {
        let mut upgrading = lock(upgrading);
        if still {
            upgrading.insert(name);
            return Vec::new();
        }
        if !upgrading.remove(&name) {
            return Vec::new();
        }
    }
    let policies = Policies::of(shared.syncs.state());
    let mut fleet = fleet_standings(shared, &policies);
    fleet.sort_by(|a, b| a.0.cmp(&b.0));
    let in_flight = fleet
        .iter()
        .filter(|(_, standing)| *standing == Standing::Upgrading)
        .count();
    let mut woken = Vec::new();
    for (queued, _) in fleet.iter().filter(|(_, s)| *s == Standing::Queued) {
        let limit = policies.policy_for(queued).max_nodes_in_flight.max(1) as usize;
        if in_flight + woken.len() < limit {
            woken.push(ObjectRef::new(queued));
        }
    }
    woken
}

// ---- writes ----

/// The merge patch of the node's labels and upgrade annotations, conditional on the
/// resourceVersion the decisions were made on; `None` when nothing changes.
fn node_patch(node: &Node, decided: &[ModuleDecision]) -> Option<Value> {
    let mut labels = Map::new();
    let mut annotations = Map::new();
    for entry in decided {
        let key = &entry.key;
        if let Outcome::Write(write) = &entry.decision.outcome {
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
        let current = node.annotations().get(&annotation);
        let wanted = entry
            .decision
            .progress
            .as_ref()
            .map(Progress::to_annotation);
        if current != wanted.as_ref() {
            annotations.insert(annotation, wanted.map_or(Value::Null, Value::String));
        }
    }
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut metadata = Map::new();
    metadata.insert(
        "resourceVersion".into(),
        json!(node.resource_version().unwrap_or_default()),
    );
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    Some(json!({ "metadata": metadata }))
}

/// The commit of a step or wait, with author, time and subject when the `GitSync` still
/// lists it among its commits.
fn commit_of(policies: &Policies, node: &str, stamp: &super::Stamp) -> CommitRef {
    let mut commit =
        history::commit_ref_of_stamp(stamp.revision.as_deref().unwrap_or(""), stamp.pull_request);
    let known = policies.sync_for(node).and_then(|sync| {
        let status = sync.status.as_ref()?;
        status
            .last_applied_commit
            .iter()
            .chain(&status.last_attempted_commit)
            .chain(status.runs.iter().map(|run| &run.commit))
            .find(|known| !commit.sha.is_empty() && known.sha == commit.sha)
            .cloned()
    });
    if let Some(known) = known {
        commit.author = known.author;
        commit.time = known.time;
        commit.subject = known.subject;
    }
    commit
}

/// `v1` or `none`.
fn version(version: &Option<String>) -> &str {
    version.as_deref().unwrap_or("none")
}

/// ` by 3cf3bea (#42)`, or nothing for an unstamped node.
fn asked_by(commit: &CommitRef) -> String {
    match (commit.short_sha.is_empty(), commit.pull_request) {
        (true, _) => String::new(),
        (false, Some(pr)) => format!(", asked by {} (#{pr})", commit.short_sha),
        (false, None) => format!(", asked by {}", commit.short_sha),
    }
}

/// The Event annotations of a move: module and versions (the commit's are added by
/// [`history::emit_annotated_event`]).
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

fn node_target(node: &Node) -> EventTarget {
    EventTarget {
        api_version: "v1".into(),
        kind: "Node".into(),
        namespace: None,
        name: node.name_any(),
        uid: node.uid(),
    }
}

/// Writes the history record of a step and, when the record is new, its Events. Returns
/// the step's time: now, or the time of the record written before a restart.
async fn record_step(
    shared: &Shared,
    policies: &Policies,
    node: &Node,
    key: &ModuleKey,
    step: &StepReached,
    now: Timestamp,
) -> Result<Timestamp, kube::Error> {
    let client = &shared.ctx.client;
    let node_name = node.name_any();
    let commit = commit_of(policies, &node_name, &step.stamp);
    let message = format!(
        "{key} {} -> {} on {node_name}: step {} {} after {:.1}s{}",
        version(&step.from),
        version(&step.to),
        step.step.number(),
        step.step.as_str(),
        step.duration_seconds,
        asked_by(&commit),
    );
    let spec = HistoryRecordSpec {
        time: rfc3339_micros(now),
        type_: RecordType::UpgradeStep,
        sync: policies.sync_name(&node_name),
        commit: commit.clone(),
        message: message.clone(),
        node: Some(node_name.clone()),
        module: Some(key.to_string()),
        step: Some(step.step.as_str().to_string()),
        from_version: step.from.clone(),
        to_version: step.to.clone(),
        duration_seconds: Some(step.duration_seconds),
        ..HistoryRecordSpec::default()
    };
    let name = history::record_name(&spec);
    let created = match history::write_record(client, spec.clone()).await {
        Err(kube::Error::Api(status)) if status.code == 404 => {
            // No sync has made capstan's namespace yet.
            ensure_system_namespace(client).await?;
            history::write_record(client, spec).await?
        }
        other => other?,
    };
    if !created {
        let records: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
        let recorded = records.get_opt(&name).await?;
        return Ok(recorded
            .and_then(|record| record.spec.time.parse().ok())
            .unwrap_or(now));
    }
    let mut annotations = move_annotations(key, &step.from, &step.to);
    annotations.insert(
        UPGRADE_STEP_ANNOTATION.to_string(),
        step.step.as_str().to_string(),
    );
    let module = module_of(shared, key);
    let module_target = EventTarget {
        api_version: Module::api_version(&()).to_string(),
        kind: Module::kind(&()).to_string(),
        namespace: Some(key.namespace().to_string()),
        name: key.name().to_string(),
        uid: module.and_then(|module| module.uid()),
    };
    let reason = step_reason(step.step);
    for target in [node_target(node), module_target] {
        if let Err(err) = history::emit_annotated_event(
            client,
            &target,
            false,
            reason,
            &message,
            &commit,
            annotations.clone(),
        )
        .await
        {
            tracing::warn!(%err, node = %node_name, "could not record an upgrade-step event");
        }
    }
    Ok(now)
}

/// The Event reason of a step.
fn step_reason(step: UpgradeStep) -> &'static str {
    match step {
        UpgradeStep::DevicePluginStopped => "DevicePluginStopped",
        UpgradeStep::OldModuleUnloaded => "OldModuleUnloaded",
        UpgradeStep::NewModuleLoaded => "NewModuleLoaded",
        UpgradeStep::DevicePluginStarted => "DevicePluginStarted",
    }
}

async fn ensure_system_namespace(client: &kube::Client) -> Result<(), kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": SYSTEM_NAMESPACE}});
    namespaces
        .patch(
            SYSTEM_NAMESPACE,
            &PatchParams::apply(managers::VERSION_LABELS),
            &Patch::Apply(&namespace),
        )
        .await
        .map(|_| ())
}

/// The Event that says, once per wait, why a node does not move.
async fn announce_wait(
    shared: &Shared,
    policies: &Policies,
    node: &Node,
    entry: &ModuleDecision,
    gate: &Gate,
) {
    let Some(progress) = &entry.decision.progress else {
        return;
    };
    let Outcome::Wait(Wait::Policy(wait)) = entry.decision.outcome else {
        return;
    };
    let node_name = node.name_any();
    let stamp = super::Stamp {
        revision: progress.revision.clone(),
        pull_request: progress.pull_request,
    };
    let (stamp, to) = if progress.upgrading() {
        // Held mid-upgrade: the unapproved commit is the node's newest.
        (entry.facts.stamp.clone(), entry.facts.labels.module.clone())
    } else {
        (stamp, progress.to.clone())
    };
    let commit = commit_of(policies, &node_name, &stamp);
    let key = &entry.key;
    let moving = format!(
        "{key} {} -> {} on {node_name}",
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
        (PolicyWait::Slot, Slot::Free) => return,
    };
    if let Err(err) = history::emit_annotated_event(
        &shared.ctx.client,
        &node_target(node),
        warning,
        reason,
        &message,
        &commit,
        move_annotations(key, &progress.from, &to),
    )
    .await
    {
        tracing::warn!(%err, node = %node_name, "could not record a wait event");
    }
}
