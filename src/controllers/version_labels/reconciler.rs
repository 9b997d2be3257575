//! The version-label controller's reconciler: one reconcile per Node, for every Module whose
//! version labels or upgrade annotation the node carries.
//!
//! It follows, through the shared caches, Nodes (the trigger and the fleet the slots are
//! counted over), Modules (a change reconciles every node labelled for the Module),
//! device-plugin and DRA driver pods (a change or a deletion reconciles the pod's node) and the
//! `GitSync`s in `capstan-system` (a change of policy reconciles every node). It decides nothing itself: a reconcile
//!
//! 1. returns at once when the cached node has nothing to move ([`has_work`]);
//! 2. reads the node afresh, the facts of each Module on it, the `GitSync`s and the fleet
//!    from the caches, and calls [`decide_node`];
//! 3. reads what the decision asks to confirm with the API server rather than a cache (the
//!    nodes, when the node is about to start; the node's device-plugin and DRA driver pods,
//!    before a W removal or the "device plugin stopped" step), and decides again;
//! 4. writes the plan: each step's history record, then, when the record is new, an Event
//!    on the Node and one on the Module; the labels and upgrade annotations in one JSON
//!    merge patch ([`node_patch`], field manager `capstan-version-labels`, conditional on
//!    the node's resourceVersion); the Events announcing new policy waits;
//! 5. looks again when the plan says ([`super::next_look`]).
//!
//! When a node's last upgrade ends, the nodes first in line for the freed slots
//! ([`next_in_line`]) are reconciled at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource as _, ResourceExt as _};

use super::facts::{
    carries, facts_of, holds_slot, is_device_plugin_of, module_keys, not_ready_since,
};
use super::records::{GateRecord, StepRecord, WaitEvent};
use super::{
    Confirm, FleetNode, NodeDecision, NodeInputs, NodeModuleFacts, NodePlan, Policies, decide_node,
    has_work, next_in_line, node_patch, standings,
};
use crate::controllers::caches::Caches;
use crate::controllers::checks;
use crate::controllers::context::Context;
use crate::controllers::runner::{self, Runner};
use crate::controllers::upgrade::Campaigns;
use crate::controllers::upgrade::drain::{
    Cordon, DrainState, DrainStep, end_patch, start_patch, write_record,
};
use crate::controllers::upgrade::guard::{CheckKind, CheckResult, Seen};
use crate::controllers::upgrade::policy::{SyncState, wakes_every_node};
use crate::history::{self, EventTarget};
use capstan_api::GateWhen;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::{
    DEVICE_PLUGIN_ROLE, DRA_ROLE, DRAIN_ANNOTATION, MODULE_NAME_LABEL, ModuleKey, ROLE_LABEL,
};
use capstan_api::managers;
use capstan_api::module::Module;
use capstan_api::{GitSync, HistoryRecord, HistoryRecordSpec, UpgradeConfig};

/// Next look after the node changed under a write (the watch brings the change).
const CONFLICT_RETRY: Duration = Duration::from_millis(200);

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
    dra_drivers: Store<Pod>,
    syncs: Store<GitSync>,
    upgrade_configs: Store<UpgradeConfig>,
    /// When this controller started: an upgrade that started before was resumed.
    started: Timestamp,
    /// The upgrades said resumed (node, Module, start), each once.
    resumed: Mutex<HashSet<(String, ModuleKey, Timestamp)>>,
    /// The HTTP client of Prometheus gates, or why there is none (a Prometheus gate then
    /// never passes, saying so).
    http: Result<reqwest::Client, String>,
}

/// Runs the version-label controller until `ctx.shutdown`. Subscribes to `caches`; the
/// caller starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (modules, modules_ready) = caches.modules.reader();
    let (device_plugins, device_plugins_ready) = caches.device_plugin_pods.reader();
    let (dra_drivers, dra_drivers_ready) = caches.dra_pods.reader();
    let (syncs, syncs_ready) = caches.syncs.reader();
    let (upgrade_configs, upgrade_configs_ready) = caches.upgrade_configs.reader();
    let campaign_changes = caches.upgrade_configs.subscribe();
    let node_changes = caches.nodes.subscribe();
    let node_ends = caches.nodes.subscribe();
    let departures = caches.nodes.subscribe();
    let module_changes = caches.modules.subscribe();
    // A device-plugin or DRA driver pod that goes (deleted ones come as last seen) is what a
    // node waits for: its node is reconciled.
    let pod_changes = futures::stream::select(
        caches.device_plugin_pods.subscribe(),
        caches.dra_pods.subscribe(),
    )
    .filter_map(|pod: Arc<Pod>| async move { node_of_pod(&pod) });
    let sync_changes = caches.syncs.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        nodes: nodes.clone(),
        modules,
        device_plugins,
        dra_drivers,
        syncs,
        upgrade_configs,
        started: ctx.clock.now(),
        resumed: Mutex::new(HashSet::new()),
        http: checks::prometheus::client().map_err(|err| err.to_string()),
    });
    let departed = {
        let shared = shared.clone();
        let ready = [
            nodes_ready.clone(),
            syncs_ready.clone(),
            modules_ready.clone(),
        ];
        async move {
            if runner::listed(&shared.ctx, ready).await {
                tokio::select! {
                    () = record_departures(shared.clone(), departures) => {}
                    () = shared.ctx.shutdown.cancelled() => {}
                }
            }
        }
    };
    let controller = Controller::for_shared_stream(node_changes, nodes)
        .watches_shared_stream(module_changes, {
            let shared = shared.clone();
            move |module: Arc<Module>| nodes_of_module(&shared, &module)
        })
        .reconcile_on(pod_changes)
        .watches_shared_stream(sync_changes, {
            let shared = shared.clone();
            let seen: Mutex<HashMap<String, SyncState>> = Mutex::new(HashMap::new());
            move |sync: Arc<GitSync>| policy_changed(&shared, &seen, &sync)
        })
        // A campaign that starts releases its moves; any change looks at every node.
        .watches_shared_stream(campaign_changes, {
            let shared = shared.clone();
            move |_: Arc<UpgradeConfig>| {
                shared
                    .nodes
                    .state()
                    .iter()
                    .map(|node| ObjectRef::from_obj(node.as_ref()))
                    .collect::<Vec<_>>()
            }
        })
        .watches_shared_stream(node_ends, {
            let shared = shared.clone();
            let upgrading: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
            move |node: Arc<Node>| line_moves(&shared, &upgrading, &node)
        });
    // An empty Module store would hide every new move, an empty pod store every
    // device-plugin or DRA driver pod.
    let controller = Runner::new("version-labels", &ctx)
        .reads(nodes_ready)
        .reads(modules_ready)
        .reads(device_plugins_ready)
        .reads(dra_drivers_ready)
        .reads(upgrade_configs_ready)
        .reads(syncs_ready)
        .run(controller, reconcile, shared);
    async move {
        tokio::join!(controller, departed);
    }
}

async fn reconcile(node: Arc<Node>, shared: Arc<Shared>) -> Result<Action, ReconcileError> {
    reconcile_node(&node, &shared).await
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The error of `what` failing on `node`.
fn failed(node: &str, what: &'static str) -> impl FnOnce(kube::Error) -> ReconcileError {
    let node = node.to_string();
    move |source| ReconcileError::Api { node, what, source }
}

async fn reconcile_node(cached: &Node, shared: &Shared) -> Result<Action, ReconcileError> {
    let name = cached.name_any();
    let cached_modules = modules_of(shared, cached, false);
    let draining = cached.annotations().contains_key(DRAIN_ANNOTATION);
    if !draining && !has_work(cached_modules.iter().map(|(_, facts)| facts)) {
        tracing::trace!(node = %name, "nothing to move");
        return Ok(Action::await_change());
    }
    let nodes: Api<Node> = Api::all(shared.ctx.client.clone());
    let Some(node) = nodes
        .get_opt(&name)
        .await
        .map_err(failed(&name, "reading"))?
    else {
        return Ok(Action::await_change());
    };
    let mut inputs = NodeInputs {
        node: name.clone(),
        modules: modules_of(shared, &node, true),
        policies: read_policies(shared)
            .await
            .map_err(failed(&name, "reading the GitSyncs"))?,
        fleet: fleet_of(shared, shared.nodes.state().iter().map(Arc::as_ref)),
        fleet_listed: false,
        device_plugin_pods_listed: BTreeMap::new(),
        campaigns: campaigns_of(shared),
        drain: DrainState::of(node.annotations()),
        cordon: cordon_of(&node),
        not_ready_since: not_ready_since(&node),
        seen: BTreeMap::new(),
    };
    inputs.seen = observe_checks(shared, &node, &inputs).await;
    say_resumed(shared, &node, &inputs.modules);
    // The clock is read for each decision, after the reads it confirms: a step then takes
    // a time later than every write the confirming list saw (the last step of the node
    // whose slot it takes, above all).
    let (plan, now) = loop {
        let now = shared.ctx.clock.now();
        match decide_node(&inputs, now) {
            NodeDecision::Act(plan) => break (plan, now),
            NodeDecision::Confirm(what) => confirm(shared, &mut inputs, what).await?,
        }
    };
    shared.ctx.metrics.set_rollout_halted(
        &inputs.policies.sync_name(&name),
        super::rollout_halted(&inputs),
    );
    for m in &plan.modules {
        let (facts, gate, decision) = (&m.facts, &plan.gate, &m.decision);
        tracing::debug!(node = %name, module = %m.key, ?facts, ?gate, ?decision, "decided");
    }
    write(shared, &node, &plan, now).await
}

/// Logs, once per upgrade, each upgrade of `node` that started before this controller did:
/// the process restarted (or took over the Lease) in the middle of it. A drained node's is
/// the drain controller's to say.
fn say_resumed(shared: &Shared, node: &Node, modules: &[(ModuleKey, NodeModuleFacts)]) {
    if node.annotations().contains_key(DRAIN_ANNOTATION) {
        return;
    }
    let name = node.name_any();
    for (key, facts) in modules {
        let Some(progress) = facts.progress.as_ref().filter(|p| p.upgrading()) else {
            continue;
        };
        let Some(started) = progress.started_at.filter(|at| *at < shared.started) else {
            continue;
        };
        if !lock(&shared.resumed).insert((name.clone(), key.clone(), started)) {
            continue;
        }
        let step = progress
            .step
            .map_or("before its first step".to_string(), |s| {
                format!("after step {} {}", s.number(), s.as_str())
            });
        tracing::info!(
            node = %name,
            module = %key,
            revision = progress.revision.as_deref().unwrap_or(""),
            pull_request = progress.pull_request.map(|pr| format!("#{pr}")).unwrap_or_default(),
            "resumed the upgrade of {key} {} -> {} on {name} after a restart, {step}",
            progress.from.as_deref().unwrap_or("none"),
            progress.to.as_deref().unwrap_or("none"),
        );
    }
}

/// Reads what `what` asks from the API server into `inputs`.
async fn confirm(
    shared: &Shared,
    inputs: &mut NodeInputs,
    what: Confirm,
) -> Result<(), ReconcileError> {
    let client = &shared.ctx.client;
    let name = inputs.node.clone();
    match what {
        Confirm::Slots => {
            // Standings read labels and annotations only: metadata is enough.
            let listed: Vec<Node> = Api::<Node>::all(client.clone())
                .list_metadata(&ListParams::default())
                .await
                .map_err(failed(&name, "listing nodes"))?
                .items
                .into_iter()
                .map(|partial| Node {
                    metadata: partial.metadata,
                    ..Node::default()
                })
                .collect();
            inputs.fleet = fleet_of(shared, listed.iter());
            // The list has metadata only: readiness, which changes slowly, is the cache's.
            for node in &mut inputs.fleet {
                node.not_ready_since = shared
                    .nodes
                    .get(&ObjectRef::new(&node.name))
                    .and_then(|cached| not_ready_since(&cached));
            }
            inputs.fleet_listed = true;
        }
        Confirm::DevicePluginPods(keys) => {
            for key in keys {
                let remain = device_plugin_pods_remain(client, &key, &name)
                    .await
                    .map_err(failed(&name, "listing device-plugin pods"))?;
                inputs.device_plugin_pods_listed.insert(key, remain);
            }
        }
    }
    Ok(())
}

/// Writes `plan` for `node`, in its order: the step records (with their Events), the
/// node's labels and annotations, the wait announcements. Returns when to look again.
async fn write(
    shared: &Shared,
    node: &Node,
    plan: &NodePlan,
    now: Timestamp,
) -> Result<Action, ReconcileError> {
    let name = node.name_any();
    if let Some(change) = &plan.drain {
        write_record(&shared.ctx, node, &change.record)
            .await
            .map_err(failed(&name, "recording a drain"))?;
    }
    for record in &plan.released {
        record_release(shared, record)
            .await
            .map_err(failed(&name, "recording a released slot"))?;
    }
    for record in &plan.checks {
        record_gate(shared, node, record)
            .await
            .map_err(failed(&name, "recording a gate"))?;
    }
    for check in &plan.check_pods {
        let pod = checks::pod::build(node, &check.key, &check.run, &check.spec);
        let pods: Api<Pod> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
        crate::crash::point("gate.pod.before");
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => crate::crash::point("gate.pod.after"),
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => return Err(failed(&name, "creating a check pod")(err)),
        }
    }
    let mut recorded = BTreeMap::new();
    for record in &plan.records {
        let at = record_step(shared, node, record, now)
            .await
            .map_err(failed(&name, "recording an upgrade step"))?;
        recorded.insert(record.key.clone(), at);
    }

    let cordon = cordon_of(node);
    let drain = plan.drain.as_ref().map(|change| match change.step {
        DrainStep::Cordoned => start_patch(&cordon, &change.state),
        _ => end_patch(&cordon, &change.state),
    });
    let patch = node_patch(
        node.resource_version().as_deref().unwrap_or_default(),
        node.annotations(),
        &plan.modules,
        &recorded,
        drain,
    );
    if let Some(patch) = patch {
        let params = PatchParams {
            field_manager: Some(managers::VERSION_LABELS.to_string()),
            ..PatchParams::default()
        };
        let nodes: Api<Node> = Api::all(shared.ctx.client.clone());
        crate::crash::point("upgrade.labels.before");
        match nodes.patch(&name, &params, &Patch::Merge(&patch)).await {
            Ok(_) => crate::crash::point("upgrade.labels.after"),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            Err(err) => return Err(failed(&name, "writing labels")(err)),
        }
    }

    for wait in &plan.waits {
        announce_wait(shared, node, wait).await;
    }
    delete_ended_check_pods(shared, node, plan).await;
    Ok(plan
        .next_look
        .map_or_else(Action::await_change, Action::requeue))
}

// ---- reads ----

/// What each gate attempt the node keeps was seen to do: its check pod, its query, its
/// expression, or the preflight's image. An attempt that cannot be read is seen as not
/// answering yet (its timeout decides).
async fn observe_checks(
    shared: &Shared,
    node: &Node,
    inputs: &NodeInputs,
) -> BTreeMap<ModuleKey, Seen> {
    let name = node.name_any();
    let policy = inputs.policies.policy_for(&name);
    let mut seen = BTreeMap::new();
    let mut pods_on_node: Option<Vec<Pod>> = None;
    for (key, facts) in &inputs.modules {
        let Some(run) = facts.progress.as_ref().and_then(|p| p.check.as_ref()) else {
            continue;
        };
        let guardrails = super::guardrails_of(&policy, &name, key, None);
        let checks = match run.when {
            GateWhen::Before => &guardrails.before,
            GateWhen::After => &guardrails.after,
        };
        let Some(check) = checks.iter().find(|check| check.name == run.name) else {
            continue;
        };
        let client = &shared.ctx.client;
        let looked = match &check.kind {
            CheckKind::Preflight => match module_of(shared, key) {
                Some(module) => checks::image::seen(client, key, &module, node).await,
                None => Seen::NotYet(format!("Module {key} is not there")),
            },
            CheckKind::Pod(_) => {
                let pod_name = checks::pod::name(&name, key, run);
                let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
                match pods.get_opt(&pod_name).await {
                    Ok(pod) => checks::pod::seen(&pod_name, pod.as_ref()),
                    Err(err) => Seen::NotYet(format!("reading check pod {pod_name}: {err}")),
                }
            }
            CheckKind::Prometheus(prometheus) => {
                let query = checks::prometheus::expand(&prometheus.query, &name);
                let http = match &shared.http {
                    Ok(http) => http,
                    Err(why) => {
                        seen.insert(key.clone(), Seen::NotYet(why.clone()));
                        continue;
                    }
                };
                match checks::prometheus::query(http, &prometheus.url, &query).await {
                    Ok(result) if result.series.is_empty() => {
                        Seen::Passed(format!("{query} returned no series"))
                    }
                    Ok(result) => Seen::NotYet(format!(
                        "{query} returned {}",
                        checks::prometheus::describe(&result, 3)
                    )),
                    Err(err) => Seen::NotYet(format!("querying {}: {err}", prometheus.url)),
                }
            }
            CheckKind::Cel(expression) => {
                if pods_on_node.is_none() {
                    let pods: Api<Pod> = Api::all(client.clone());
                    let params = ListParams::default().fields(&format!("spec.nodeName={name}"));
                    pods_on_node = Some(match pods.list(&params).await {
                        Ok(list) => list.items,
                        Err(err) => {
                            seen.insert(
                                key.clone(),
                                Seen::NotYet(format!("listing the node's pods: {err}")),
                            );
                            continue;
                        }
                    });
                }
                let pods = pods_on_node.as_deref().unwrap_or_default();
                match checks::cel::evaluate(expression, node, pods) {
                    Ok(true) => Seen::Passed(format!("{expression} is true")),
                    Ok(false) => Seen::NotYet(format!("{expression} is false")),
                    Err(why) => Seen::NotYet(why),
                }
            }
        };
        seen.insert(key.clone(), looked);
    }
    seen
}

fn module_of(shared: &Shared, key: &ModuleKey) -> Option<Arc<Module>> {
    shared
        .modules
        .get(&ObjectRef::new(key.name()).within(key.namespace()))
}

/// The facts of each Module on `node`; its device-plugin and DRA driver pods from the caches
/// only with `pods` (the slots do not look at them).
fn modules_of(shared: &Shared, node: &Node, pods: bool) -> Vec<(ModuleKey, NodeModuleFacts)> {
    let name = node.name_any();
    module_keys(node, |key| module_of(shared, key).is_some())
        .into_iter()
        .map(|key| {
            let on_node = if pods {
                [&shared.device_plugins, &shared.dra_drivers]
                    .into_iter()
                    .flat_map(|store| {
                        store.state_filter(|pod| is_device_plugin_of(pod, &key, &name))
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let on_node: Vec<&Pod> = on_node.iter().map(Arc::as_ref).collect();
            let module = module_of(shared, &key);
            let facts = facts_of(node, &key, module.as_deref(), &on_node);
            (key, facts)
        })
        .collect()
}

/// The facts the slots are counted on, of each of `nodes`.
fn fleet_of<'a>(shared: &Shared, nodes: impl Iterator<Item = &'a Node>) -> Vec<FleetNode> {
    nodes
        .map(|node| FleetNode {
            name: node.name_any(),
            modules: modules_of(shared, node, false)
                .into_iter()
                .map(|(_, facts)| facts)
                .collect(),
            draining: node.annotations().contains_key(DRAIN_ANNOTATION),
            not_ready_since: not_ready_since(node),
        })
        .collect()
}

/// Whether a device-plugin or DRA driver pod of `key` is on `node`, in any phase, as the API
/// server sees it now.
async fn device_plugin_pods_remain(
    client: &kube::Client,
    key: &ModuleKey,
    node: &str,
) -> Result<bool, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), key.namespace());
    let params = ListParams::default()
        .labels(&device_plugin_pods_selector(key))
        .fields(&format!("spec.nodeName={node}"));
    Ok(!pods.list_metadata(&params).await?.items.is_empty())
}

/// The label selector of the pods that hold back the unload of `key`'s module: its
/// device-plugin and DRA driver pods, which both run the version of the version-device-plugin
/// label.
fn device_plugin_pods_selector(key: &ModuleKey) -> String {
    format!(
        "{ROLE_LABEL} in ({DEVICE_PLUGIN_ROLE},{DRA_ROLE}),{MODULE_NAME_LABEL}={}",
        key.name()
    )
}

async fn read_policies(shared: &Shared) -> Result<Policies, kube::Error> {
    Policies::read(&shared.syncs, &shared.ctx.client).await
}

/// The campaigns, from the cache.
fn campaigns_of(shared: &Shared) -> Campaigns {
    let configs = shared.upgrade_configs.state();
    Campaigns::of(configs.iter().map(Arc::as_ref))
}

/// The node's cordon.
fn cordon_of(node: &Node) -> Cordon {
    let spec = node.spec.as_ref();
    Cordon {
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints: spec.and_then(|s| s.taints.clone()).unwrap_or_default(),
    }
}

// ---- watch mappers ----

/// The nodes labelled for `module`.
fn nodes_of_module(shared: &Shared, module: &Module) -> Vec<ObjectRef<Node>> {
    let Ok(key) = module.key() else {
        return Vec::new();
    };
    shared
        .nodes
        .state()
        .iter()
        .filter(|node| carries(node, &key))
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

/// Every node, when a `GitSync` changed in a way moves wait on ([`wakes_every_node`]).
fn policy_changed(
    shared: &Shared,
    seen: &Mutex<HashMap<String, SyncState>>,
    sync: &GitSync,
) -> Vec<ObjectRef<Node>> {
    let now = SyncState::of(sync);
    let previous = lock(seen).insert(sync.name_any(), now.clone());
    if !wakes_every_node(previous.as_ref(), &now) {
        return Vec::new();
    }
    shared
        .nodes
        .state()
        .iter()
        .map(|node| ObjectRef::from_obj(node.as_ref()))
        .collect()
}

/// When a node's last upgrade ended, the queued nodes that may take the freed slots
/// ([`next_in_line`]). `upgrading` holds the nodes seen holding a slot.
fn line_moves(
    shared: &Shared,
    upgrading: &Mutex<HashSet<String>>,
    node: &Node,
) -> Vec<ObjectRef<Node>> {
    let name = node.name_any();
    // A deleted Node comes as last seen: it holds nothing any more.
    let exists = shared.nodes.get(&ObjectRef::from_obj(node)).is_some();
    {
        let mut upgrading = lock(upgrading);
        if exists && holds_slot(node) {
            upgrading.insert(name);
            return Vec::new();
        }
        if !upgrading.remove(&name) {
            return Vec::new();
        }
    }
    let policies = Policies::of(shared.syncs.state());
    let nodes = shared.nodes.state();
    let fleet = standings(
        &fleet_of(shared, nodes.iter().map(Arc::as_ref)),
        &policies,
        &campaigns_of(shared),
        shared.ctx.clock.now(),
    );
    next_in_line(&fleet, &policies)
        .iter()
        .map(|node| ObjectRef::new(node))
        .collect()
}

// ---- writes ----

/// Deletes the check pods of attempts that ended without failing (a failed one is kept
/// for its logs until the node's move is over).
async fn delete_ended_check_pods(shared: &Shared, node: &Node, plan: &NodePlan) {
    let name = node.name_any();
    let pods: Api<Pod> = Api::namespaced(shared.ctx.client.clone(), SYSTEM_NAMESPACE);
    for m in &plan.modules {
        let Some(kept) = m.facts.progress.as_ref().and_then(|p| p.check.as_ref()) else {
            continue;
        };
        let still = m.decision.progress.as_ref().and_then(|p| p.check.as_ref());
        let failed = m
            .decision
            .check
            .as_ref()
            .is_some_and(|c| c.result != CheckResult::Passed);
        if still == Some(kept) || failed {
            continue;
        }
        let pod_name = checks::pod::name(&name, &m.key, kept);
        match pods.delete(&pod_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                tracing::warn!(%err, node = %name, pod = %pod_name, "could not delete a check pod")
            }
        }
    }
}

/// Writes the record of a gate's attempt that ended and, when the record is new, its
/// Events on the Node and the Module.
async fn record_gate(shared: &Shared, node: &Node, record: &GateRecord) -> Result<(), kube::Error> {
    let client = &shared.ctx.client;
    let created = history::write_record_making_namespace(
        client,
        record.spec.clone(),
        managers::VERSION_LABELS,
    )
    .await?;
    if !created {
        return Ok(());
    }
    if record.failed {
        shared.ctx.metrics.gate_failed(&record.spec.sync);
    }
    let event = RecordEvent {
        key: &record.key,
        warning: record.failed,
        reason: record.reason,
        spec: &record.spec,
        annotations: &record.annotations,
    };
    announce_on_node_and_module(shared, node, event).await;
    Ok(())
}

/// The Event a new record of the node's upgrade of a Module is told with.
struct RecordEvent<'a> {
    key: &'a ModuleKey,
    warning: bool,
    reason: &'static str,
    spec: &'a HistoryRecordSpec,
    annotations: &'a BTreeMap<String, String>,
}

/// The same Event, with the record's message and commit, on the Node and on the Module; a
/// failed write is logged (the record stays the source of truth).
async fn announce_on_node_and_module(shared: &Shared, node: &Node, event: RecordEvent<'_>) {
    for target in [EventTarget::node(node), module_target(shared, event.key)] {
        if let Err(err) = history::record_event(
            &shared.ctx.recorder,
            &target,
            event.warning,
            event.reason,
            &event.spec.message,
            &event.spec.commit,
            event.annotations.clone(),
        )
        .await
        {
            tracing::warn!(%err, node = %node.name_any(), reason = event.reason, "could not record an event");
        }
    }
}

fn module_target(shared: &Shared, key: &ModuleKey) -> EventTarget {
    EventTarget {
        api_version: Module::api_version(&()).to_string(),
        kind: Module::kind(&()).to_string(),
        namespace: Some(key.namespace().to_string()),
        name: key.name().to_string(),
        uid: module_of(shared, key).and_then(|module| module.uid()),
    }
}

/// Writes the history record of a step and, when the record is new, its Events. Returns
/// the step's time: now, or the time of the record written before a restart.
async fn record_step(
    shared: &Shared,
    node: &Node,
    record: &StepRecord,
    now: Timestamp,
) -> Result<Timestamp, kube::Error> {
    let client = &shared.ctx.client;
    let created = history::write_record_making_namespace(
        client,
        record.spec.clone(),
        managers::VERSION_LABELS,
    )
    .await?;
    if !created {
        let records: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
        let recorded = records.get_opt(&history::record_name(&record.spec)).await?;
        return Ok(recorded
            .and_then(|recorded| recorded.spec.time.parse().ok())
            .unwrap_or(now));
    }
    let event = RecordEvent {
        key: &record.key,
        warning: false,
        reason: record.reason,
        spec: &record.spec,
        annotations: &record.annotations,
    };
    announce_on_node_and_module(shared, node, event).await;
    Ok(now)
}

/// Writes the record of an upgrade that gave up its slot (which logs it) and, when the
/// record is new, its Event on the Module.
async fn record_release(shared: &Shared, record: &HistoryRecordSpec) -> Result<(), kube::Error> {
    let client = &shared.ctx.client;
    let created =
        history::write_record_making_namespace(client, record.clone(), managers::VERSION_LABELS)
            .await?;
    if !created {
        return Ok(());
    }
    let key = record
        .module
        .as_deref()
        .and_then(|m| m.split_once('/'))
        .and_then(|(namespace, name)| ModuleKey::new(namespace, name).ok());
    if let Some(key) = key
        && let Err(err) = history::record_event(
            &shared.ctx.recorder,
            &module_target(shared, &key),
            true,
            "SlotReleased",
            &record.message,
            &record.commit,
            BTreeMap::new(),
        )
        .await
    {
        tracing::warn!(%err, "could not record a released-slot event");
    }
    Ok(())
}

/// Records, for each Node deleted in the middle of an upgrade (it comes from `departures`
/// as last seen, gone from the cache), that the upgrade gave up its slot. The slot itself
/// is free as soon as the Node is gone: the fleet is counted over the Nodes there are.
async fn record_departures(
    shared: Arc<Shared>,
    departures: impl futures::Stream<Item = Arc<Node>> + Send + 'static,
) {
    let mut departures = std::pin::pin!(departures);
    while let Some(node) = departures.next().await {
        if shared
            .nodes
            .get(&ObjectRef::from_obj(node.as_ref()))
            .is_some()
        {
            continue;
        }
        let name = node.name_any();
        let policies = Policies::of(shared.syncs.state());
        let now = shared.ctx.clock.now();
        for (key, facts) in modules_of(&shared, &node, false) {
            let Some(progress) = facts.progress.filter(super::Progress::holds_slot) else {
                continue;
            };
            let record = super::records::release_record(
                &policies,
                &name,
                &key,
                &progress,
                super::records::Release::Left,
                now,
            );
            if let Err(err) = record_release(&shared, &record).await {
                tracing::warn!(%err, node = %name, "could not record a node that left");
            }
        }
    }
}

/// The Event that says, once per wait, why a node does not move.
async fn announce_wait(shared: &Shared, node: &Node, wait: &WaitEvent) {
    if let Err(err) = history::record_event(
        &shared.ctx.recorder,
        &EventTarget::node(node),
        wait.warning,
        wait.reason,
        &wait.message,
        &wait.commit,
        wait.annotations.clone(),
    )
    .await
    {
        tracing::warn!(%err, node = %node.name_any(), "could not record a wait event");
    }
}

#[cfg(test)]
mod tests;
