//! The Module -> NMC reconcilers. Each reads, decides and writes, in that order: it reads
//! the object and the shared watch caches ([`Stores`]), hands what it read to a decision
//! that talks to no API, and makes the writes decided, in the order decided, with field
//! manager [`managers::MODULE_NMC`] through JSON merge patches of the fields it owns.
//!
//! - Per node ([`reconcile_node`]): [`decide_node`] gives the node's NMC `spec.modules` and
//!   its `module-configured` / `module-in-use` labels from every Module's
//!   [`decide`](super::decide), and the one write, if any: the NMC created (owned by the
//!   Node, so it goes with it) when a Module first wants the node, or patched where it
//!   differs. One write per node however many Modules change.
//! - Per Module ([`reconcile_module`]): [`decide_module`] gives the finalizer (added at
//!   once, removed when no NMC lists the Module any more, that is when it is unloaded
//!   everywhere), the namespace's `contains-modules` label, and `status.moduleLoader`
//!   ([`loader_status`](super::loader_status), kept up to date by the [`Tally`] from each
//!   NMC and Node change) with the `Available` / `Degraded` conditions, written only when
//!   they change and at the [`Pacer`]'s pace.
//!
//! What wakes each reconciler, the tally and the pacer are plumbing around those: they
//! decide when to look, not what to write.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use super::ModuleFacts;
use super::lifecycle::{ModuleSeen, ModuleWrite, decide_module};
use super::node_nmc::{NmcWrite, decide_node, node_owner};
use super::tally::{Tally, Verdict};
use crate::controllers::caches::{Caches, Stores};
use crate::controllers::context::{CONCURRENCY, Context};
use crate::controllers::node::NodeFacts;
use crate::controllers::runner::Runner;
use capstan_api::labels::{ModuleKey, NAMESPACE_LABEL};
use capstan_api::managers;
use capstan_api::module::{Module, ModuleStatus};
use capstan_api::nmc::NodeModulesConfig;

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write or read the API server refused.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// A Module's status counts are written at most once per [`status_interval`] while they
/// keep changing (a condition that changes is written at once): a rollout writes its
/// progress every few seconds, not once per NMC write. See [`Pacer`].
const STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// The longest [`status_interval`], reached at 1,000 nodes.
const STATUS_INTERVAL_MAX: Duration = Duration::from_secs(10);

/// How long a Module's status counts wait between writes while they keep changing, for a
/// Module `desired` on that many nodes: [`STATUS_INTERVAL`] up to 200 nodes, then 10 ms
/// per node, up to [`STATUS_INTERVAL_MAX`] from 1,000 nodes. A rollout's length grows with
/// its nodes, and its count writes with it at a fixed interval: at 1,000 nodes x 10
/// Modules, two seconds were 0.28 writes per (node, module) pair, more than the node's own
/// status and labels. Ten seconds is still well within what a reader of `kubectl get
/// modules` waits for; a small fleet, whose rollout takes seconds, keeps two.
fn status_interval(desired: i32) -> Duration {
    let scaled = Duration::from_millis(10).saturating_mul(u32::try_from(desired).unwrap_or(0));
    scaled.clamp(STATUS_INTERVAL, STATUS_INTERVAL_MAX)
}

/// Next look after the Module changed under a finalizer patch.
const CONFLICT_RETRY: Duration = Duration::from_millis(500);

/// Runs both reconcilers until `ctx.shutdown`. Subscribes to `caches`; the caller starts
/// them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let stores = Stores::of(caches);
    let nodes = node_controller(ctx.clone(), stores.clone(), caches);
    let modules = module_controller(ctx, stores, caches);
    async move {
        futures::join!(nodes, modules);
    }
}

/// What every reconcile of a node reads: the context and the caches' stores.
struct NodeCtx {
    ctx: Arc<Context>,
    modules: Store<Module>,
    nmcs: Store<NodeModulesConfig>,
}

fn node_controller(
    ctx: Arc<Context>,
    stores: Arc<Stores>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let all_nodes = stores.nodes.clone();
    let controller = Controller::for_shared_stream(caches.nodes.subscribe(), stores.nodes.clone())
        .with_config(Config::default().concurrency(CONCURRENCY))
        // A Module's spec or deletion concerns every node; its status does not.
        .watches_shared_stream(
            changed_only(
                caches.modules.subscribe(),
                stores.modules.clone(),
                module_fingerprint,
            ),
            move |_module: Arc<Module>| {
                all_nodes
                    .state()
                    .iter()
                    .map(|node| ObjectRef::from_obj(node.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        // The NMC's spec, labels or deletion; its status (the NMC controller's) decides
        // nothing here.
        .watches_shared_stream(
            changed_only(
                caches.nmcs.subscribe(),
                stores.nmcs.clone(),
                nmc_fingerprint,
            ),
            |nmc: Arc<NodeModulesConfig>| Some(ObjectRef::new(&nmc.name_any())),
        );
    Runner::new("module-nmc/nodes", &ctx)
        .reads_all(stores.readiness())
        .run(
            controller,
            reconcile_node,
            Arc::new(NodeCtx {
                ctx: ctx.clone(),
                modules: stores.modules.clone(),
                nmcs: stores.nmcs.clone(),
            }),
        )
}

/// Keeps only the objects whose `fingerprint` changed since the stream last passed them,
/// and those gone from `store` (deleted).
fn changed_only<K>(
    stream: impl Stream<Item = Arc<K>> + Send + 'static,
    store: Store<K>,
    fingerprint: fn(&K) -> u64,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let mut seen: BTreeMap<(String, String), u64> = BTreeMap::new();
    stream.filter(move |object| {
        let key = (
            object.meta().namespace.clone().unwrap_or_default(),
            object.meta().name.clone().unwrap_or_default(),
        );
        let changed = if store.get(&ObjectRef::from_obj(object.as_ref())).is_none() {
            seen.remove(&key);
            true
        } else {
            let print = fingerprint(object);
            seen.insert(key, print) != Some(print)
        };
        futures::future::ready(changed)
    })
}

/// What of a Module the per-node decision depends on: its spec and whether it is being
/// deleted.
fn module_fingerprint(module: &Module) -> u64 {
    let mut hasher = DefaultHasher::new();
    module.metadata.uid.hash(&mut hasher);
    module.metadata.generation.hash(&mut hasher);
    module
        .metadata
        .deletion_timestamp
        .is_some()
        .hash(&mut hasher);
    serde_json::to_string(&module.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// What of an NMC the node's decision reads: its spec (counted by `generation`), labels
/// and deletion.
fn nmc_fingerprint(nmc: &NodeModulesConfig) -> u64 {
    let mut hasher = DefaultHasher::new();
    nmc.metadata.uid.hash(&mut hasher);
    nmc.metadata.generation.hash(&mut hasher);
    nmc.metadata.labels.hash(&mut hasher);
    nmc.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

/// One reconcile of a node: reads the Modules and the node's NMC from the caches, decides
/// with [`decide_node`], and makes the write decided, if any. An NMC created meanwhile (the
/// cache was behind) is no error: its watch event brings the node back. Any other failure
/// is returned, for the runner to retry.
async fn reconcile_node(node: Arc<Node>, data: Arc<NodeCtx>) -> Result<Action, Error> {
    let facts = NodeFacts::from_node(&node);
    let mut modules = Vec::new();
    let mut unusable = BTreeSet::new();
    for module in data.modules.state() {
        match ModuleFacts::from_shared(&module) {
            Ok(facts) => modules.push(facts),
            Err(err) => {
                tracing::debug!(%err, "module-nmc: a Module with an unusable name is ignored");
                unusable.insert((module.namespace().unwrap_or_default(), module.name_any()));
            }
        }
    }
    let nmc = data.nmcs.get(&ObjectRef::new(&facts.name));
    tracing::debug!(node = %facts.name, modules = modules.len(), nmc = nmc.is_some(), "module-nmc: node");

    let decision = decide_node(
        &facts,
        &node_owner(&node),
        &modules,
        &unusable,
        nmc.as_deref(),
    );

    for (module, err) in &decision.unresolved {
        tracing::warn!(%module, node = %facts.name, %err, "kernel mappings cannot be evaluated; the node's entry is left as it is");
    }
    match decision.write {
        None => {}
        Some(NmcWrite::Patch(patch)) => {
            let params = PatchParams::apply(managers::MODULE_NMC);
            let request = Request::new(NodeModulesConfig::url_path(&(), None))
                .patch(&facts.name, &params, &Patch::Merge(patch))
                .map_err(kube::Error::BuildRequest)?;
            data.ctx.client.request_text(request).await?;
        }
        Some(NmcWrite::Create(nmc)) => {
            let params = PostParams {
                field_manager: Some(managers::MODULE_NMC.into()),
                ..PostParams::default()
            };
            // The answer is not read: the NMC's watch event brings it to the cache.
            let request = Request::new(NodeModulesConfig::url_path(&(), None))
                .create(
                    &params,
                    serde_json::to_vec(&nmc).map_err(kube::Error::SerdeError)?,
                )
                .map_err(kube::Error::BuildRequest)?;
            match data.ctx.client.request_text(request).await {
                Ok(_) => {}
                // Created meanwhile: the NMC event brings us back. Another 409 created
                // nothing and is retried.
                Err(kube::Error::Api(status))
                    if status.code == 409 && status.reason == "AlreadyExists" => {}
                Err(err) => return Err(err.into()),
            }
        }
    }
    Ok(Action::await_change())
}

/// Sets (`Some`) or removes (`None`) upstream's label of a namespace that holds Modules,
/// `kmm.node.k8s.io/contains-modules`, which tools and upstream's namespace webhook read.
/// A namespace already gone is no error.
async fn label_namespace(
    client: &kube::Client,
    namespace: &str,
    value: Option<&str>,
) -> Result<(), Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {NAMESPACE_LABEL: value}}});
    let params = PatchParams {
        field_manager: Some(managers::MODULE_NMC.into()),
        ..PatchParams::default()
    };
    match api.patch(namespace, &params, &Patch::Merge(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// What every reconcile of a Module reads and keeps: the context, the caches' stores, the
/// pace of its status writes and the NMCs' tally.
struct ModuleCtx {
    ctx: Arc<Context>,
    modules: Store<Module>,
    nmcs: Store<NodeModulesConfig>,
    nodes: Store<Node>,
    pacer: Arc<Pacer>,
    tally: Arc<Tally>,
}

/// Paces the status writes of each Module: the first change of its counts after a quiet
/// spell is written at once, later ones at most once per [`status_interval`], and the last
/// one always; a change of a condition (the rollout completes, workers start or stop
/// failing) is written at once.
///
/// A change of an NMC or a Node label queues a reconcile of the Modules whose counts it
/// changed only when none is queued already; a reconcile takes changes again as it starts,
/// and one due before its Module's interval is over waits for the rest of it, still queued.
/// A change that turns a condition (the Module's status does not say its [`Verdict`]) cuts
/// that wait short: the rollout's last NMC write shows in the Module's status at once, not
/// at the end of the interval. kube's trailing-edge debounce, used before, waited for a
/// pause in the changes, and a steady rollout has none: the Modules' status, and even
/// their finalizer, waited for its end.
#[derive(Default)]
struct Pacer {
    modules: Mutex<HashMap<ObjectRef<Module>, Paced>>,
}

#[derive(Default)]
struct Paced {
    /// A reconcile is queued: further changes need none.
    queued: bool,
    /// The queued reconcile waits for the interval to end.
    waiting: bool,
    /// When the Module's status was last written.
    written: Option<Instant>,
}

/// A Module whose counts changed, and whether a condition of its status turns with them.
struct Changed {
    module: ObjectRef<Module>,
    turns: bool,
}

impl Pacer {
    fn paced(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<Module>, Paced>> {
        self.modules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Modules of `changed` to reconcile now: those with no reconcile queued, now
    /// queued, and those whose queued reconcile waits while a condition turns.
    fn unqueued(&self, changed: Vec<Changed>) -> Vec<ObjectRef<Module>> {
        let mut paced = self.paced();
        changed
            .into_iter()
            .filter(|Changed { module, turns }| {
                let paced = paced.entry(module.clone()).or_default();
                let now = !paced.queued || (paced.waiting && *turns);
                paced.queued = true;
                if now {
                    paced.waiting = false;
                }
                now
            })
            .map(|changed| changed.module)
            .collect()
    }

    /// A reconcile of `module` starts: changes from now on queue another.
    fn started(&self, module: &ObjectRef<Module>) {
        if let Some(paced) = self.paced().get_mut(module) {
            paced.queued = false;
            paced.waiting = false;
        }
    }

    /// Whether `module`'s status may be written now (and is taken as written); otherwise
    /// how long to wait, with the reconcile that waits queued.
    fn wait(
        &self,
        module: &ObjectRef<Module>,
        interval: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let mut paced = self.paced();
        let paced = paced.entry(module.clone()).or_default();
        match paced.written {
            Some(at) if now.saturating_duration_since(at) < interval => {
                paced.queued = true;
                paced.waiting = true;
                Some(interval - now.saturating_duration_since(at))
            }
            _ => {
                paced.written = Some(now);
                None
            }
        }
    }

    /// `module`'s status is written now, whatever the interval: the next write waits for
    /// the interval from now.
    fn written(&self, module: &ObjectRef<Module>, now: Instant) {
        self.paced().entry(module.clone()).or_default().written = Some(now);
    }

    /// `module` is gone: nothing of it is kept.
    fn forget(&self, module: &ObjectRef<Module>) {
        self.paced().remove(module);
    }
}

fn module_controller(
    ctx: Arc<Context>,
    stores: Arc<Stores>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let pacer = Arc::new(Pacer::default());
    let tally = Arc::new(Tally::default());
    // Each NMC or Node change updates the tally and queues the Modules whose counts it
    // changed.
    let on_nmc = {
        let (pacer, tally, stores) = (pacer.clone(), tally.clone(), stores.clone());
        move |nmc: Arc<NodeModulesConfig>| {
            let name = nmc.name_any();
            let now = stores.nmcs.get(&ObjectRef::new(&name));
            let changed = tally.nmc(&name, now.as_deref());
            pacer.unqueued(existing(changed, &stores.modules, &tally))
        }
    };
    let on_node = {
        let (pacer, tally, stores) = (pacer.clone(), tally.clone(), stores.clone());
        move |node: Arc<Node>| {
            let name = node.name_any();
            let now = stores.nodes.get(&ObjectRef::new(&name));
            let facts = now.as_deref().map(NodeFacts::from_node);
            let changed = tally.node(&name, facts.as_ref());
            pacer.unqueued(existing(changed, &stores.modules, &tally))
        }
    };
    let controller =
        Controller::for_shared_stream(caches.modules.subscribe(), stores.modules.clone())
            .watches_shared_stream(caches.nmcs.subscribe(), on_nmc)
            // Node labels and taints decide which nodes a Module targets.
            .watches_shared_stream(
                changed_only(
                    caches.nodes.subscribe(),
                    stores.nodes.clone(),
                    node_targeting_fingerprint,
                ),
                on_node,
            );
    let data = Arc::new(ModuleCtx {
        ctx: ctx.clone(),
        modules: stores.modules.clone(),
        nmcs: stores.nmcs.clone(),
        nodes: stores.nodes.clone(),
        pacer,
        tally,
    });
    Runner::new("module-nmc/modules", &ctx)
        .reads_all(stores.readiness())
        .run(controller, reconcile_module, data)
}

/// What of a Node decides whether a Module targets it: its labels and its taints.
fn node_targeting_fingerprint(node: &Node) -> u64 {
    let mut hasher = DefaultHasher::new();
    node.metadata.labels.hash(&mut hasher);
    for taint in node
        .spec
        .iter()
        .flat_map(|spec| spec.taints.iter().flatten())
    {
        (&taint.key, &taint.value, &taint.effect).hash(&mut hasher);
    }
    hasher.finish()
}

/// The Modules of `keys` that exist, each with whether a condition of its status turns
/// with the counts `tally` has now.
fn existing(keys: Vec<ModuleKey>, modules: &Store<Module>, tally: &Tally) -> Vec<Changed> {
    keys.into_iter()
        .filter_map(|key| {
            let module = ObjectRef::new(key.name()).within(key.namespace());
            let shown = shown(modules.get(&module)?.status.as_ref());
            Some(Changed {
                turns: shown != Some(tally.verdict(&key)),
                module,
            })
        })
        .collect()
}

/// What the conditions of a Module's `status` say; `None` before it has both.
fn shown(status: Option<&ModuleStatus>) -> Option<Verdict> {
    let says = |type_: &str| {
        status?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.status == "True")
    };
    Some(Verdict {
        available: says("Available")?,
        degraded: says("Degraded")?,
    })
}

/// One reconcile of a Module: reads it, the NMCs' tally and the caches, decides with
/// [`decide_module`], and makes the writes decided, in their order. A finalizer write on a
/// Module changed since it was read (409), or gone while its finalizer is removed (404),
/// stops the writes and looks again after [`CONFLICT_RETRY`]; a status whose counts alone
/// changed waits for the [`Pacer`]; a namespace or a Module gone before its label or status
/// write is no error. Any other failure stops the writes and is returned, for the runner to
/// retry.
async fn reconcile_module(module: Arc<Module>, data: Arc<ModuleCtx>) -> Result<Action, Error> {
    let reference = ObjectRef::from_obj(module.as_ref());
    data.pacer.started(&reference);
    // A Module whose name capstan cannot use gets no finalizer and no status; the node
    // reconciler leaves its entries as they are.
    let Ok(facts) = ModuleFacts::from_shared(&module) else {
        return Ok(Action::await_change());
    };
    let status = module.status.clone().unwrap_or_default();
    let counts;
    let seen = if facts.deleting() {
        let listed_on = data.tally.present(&facts.key, &data.nmcs);
        if listed_on > 0 {
            tracing::debug!(module = %facts.key, nodes = listed_on, "waiting for the module to be unloaded");
        }
        ModuleSeen::Deleting {
            finalizers: module.finalizers(),
            listed_on,
            others_in_namespace: data.modules.state().iter().any(|other| {
                other.namespace() == module.namespace() && other.uid() != module.uid()
            }),
        }
    } else {
        counts = data.tally.count(&facts, &data.nmcs, &data.nodes);
        ModuleSeen::Live {
            finalizers: module.finalizers(),
            status: &status,
            counts: &counts,
            now: data.ctx.clock.now(),
        }
    };

    let writes = decide_module(&seen);

    let client = &data.ctx.client;
    let namespace = facts.key.namespace();
    let api: Api<Module> = Api::namespaced(client.clone(), namespace);
    for write in writes {
        match write {
            ModuleWrite::LabelNamespace => label_namespace(client, namespace, Some("")).await?,
            ModuleWrite::AddFinalizer(finalizers) => {
                if !write_finalizers(&api, &module, finalizers, &[409]).await? {
                    return Ok(Action::requeue(CONFLICT_RETRY));
                }
            }
            ModuleWrite::RemoveFinalizer(finalizers) => {
                if !write_finalizers(&api, &module, finalizers, &[404, 409]).await? {
                    return Ok(Action::requeue(CONFLICT_RETRY));
                }
                data.pacer.forget(&reference);
                data.tally.forget(&facts.key);
                tracing::info!(module = %facts.key, "unloaded from every node; finalizer removed");
            }
            ModuleWrite::UnlabelNamespace => label_namespace(client, namespace, None).await?,
            ModuleWrite::Status {
                module_loader,
                conditions,
                turns,
            } => {
                if turns {
                    data.pacer.written(&reference, Instant::now());
                } else if let Some(wait) = data.pacer.wait(
                    &reference,
                    status_interval(module_loader.desired_number),
                    Instant::now(),
                ) {
                    return Ok(Action::requeue(wait));
                }
                let patch = json!({"status": {
                    "moduleLoader": module_loader,
                    "conditions": conditions,
                }});
                let params = PatchParams::apply(managers::MODULE_NMC);
                match api
                    .patch_status(facts.key.name(), &params, &Patch::Merge(patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(err) => return Err(err.into()),
                }
            }
        }
    }
    Ok(Action::await_change())
}

/// Writes `finalizers` as `module`'s, on the resourceVersion read. `false` when the API
/// server answers with a code of `look_again`: the Module is to be looked at again.
async fn write_finalizers(
    api: &Api<Module>,
    module: &Module,
    finalizers: Vec<String>,
    look_again: &[u16],
) -> Result<bool, Error> {
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": module.resource_version(),
    }});
    let params = PatchParams {
        field_manager: Some(managers::MODULE_NMC.into()),
        ..PatchParams::default()
    };
    match api
        .patch(&module.name_any(), &params, &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if look_again.contains(&status.code) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

#[cfg(test)]
mod pacing {
    use super::*;
    use capstan_api::module::ModuleCondition;

    fn module(name: &str) -> ObjectRef<Module> {
        ObjectRef::new(name).within("kmm")
    }

    /// Counts of `modules` changed; no condition turns.
    fn counts(modules: &[&ObjectRef<Module>]) -> Vec<Changed> {
        modules
            .iter()
            .map(|module| Changed {
                module: (*module).clone(),
                turns: false,
            })
            .collect()
    }

    /// Counts of `module` changed, and a condition of its status turns.
    fn turns(module: &ObjectRef<Module>) -> Vec<Changed> {
        vec![Changed {
            module: module.clone(),
            turns: true,
        }]
    }

    #[test]
    fn the_pacer_queues_one_reconcile_and_writes_at_most_once_per_interval() {
        let pacer = Pacer::default();
        let (a, b) = (module("a"), module("b"));
        let start = Instant::now();
        // A change queues a reconcile of each Module it concerns, and only one.
        assert_eq!(pacer.unqueued(counts(&[&a, &b])), [a.clone(), b.clone()]);
        assert_eq!(pacer.unqueued(counts(&[&a, &b])), []);
        // The first write is at once; changes during it queue another reconcile.
        pacer.started(&a);
        assert_eq!(pacer.wait(&a, STATUS_INTERVAL, start), None);
        assert_eq!(pacer.unqueued(counts(&[&a])), std::slice::from_ref(&a));
        assert_eq!(pacer.unqueued(counts(&[&a])), []);
        // That reconcile, due within the interval, waits for the rest of it, still queued.
        pacer.started(&a);
        let later = start + Duration::from_millis(300);
        assert_eq!(
            pacer.wait(&a, STATUS_INTERVAL, later),
            Some(STATUS_INTERVAL - Duration::from_millis(300))
        );
        assert_eq!(pacer.unqueued(counts(&[&a])), []);
        // A change that turns a condition cuts the wait short, once.
        assert_eq!(pacer.unqueued(turns(&a)), std::slice::from_ref(&a));
        assert_eq!(pacer.unqueued(turns(&a)), []);
        // A turn with a reconcile queued that does not wait needs nothing more.
        pacer.started(&a);
        assert_eq!(pacer.unqueued(counts(&[&a])), std::slice::from_ref(&a));
        assert_eq!(pacer.unqueued(turns(&a)), []);
        // Once the interval is over it writes, and changes queue a reconcile again.
        pacer.started(&a);
        assert_eq!(
            pacer.wait(&a, STATUS_INTERVAL, start + STATUS_INTERVAL),
            None
        );
        assert_eq!(pacer.unqueued(counts(&[&a])), std::slice::from_ref(&a));
        // A write out of pace (a condition changed) restarts the interval.
        let written = start + STATUS_INTERVAL + Duration::from_millis(100);
        pacer.started(&a);
        pacer.written(&a, written);
        assert_eq!(
            pacer.wait(&a, STATUS_INTERVAL, written + Duration::from_millis(500)),
            Some(STATUS_INTERVAL - Duration::from_millis(500))
        );
        // Another Module keeps its own pace.
        pacer.started(&b);
        assert_eq!(pacer.wait(&b, STATUS_INTERVAL, later), None);
        // A Module gone is forgotten: its next change queues a reconcile.
        pacer.forget(&b);
        assert_eq!(pacer.unqueued(counts(&[&b])), [b]);
    }

    #[test]
    fn the_status_interval_grows_with_the_nodes_from_200_to_1000() {
        let table = [
            (0, 2_000),
            (3, 2_000),
            (200, 2_000),
            (300, 3_000),
            (750, 7_500),
            (1_000, 10_000),
            (5_000, 10_000),
            (-1, 2_000),
        ];
        for (desired, millis) in table {
            assert_eq!(
                status_interval(desired),
                Duration::from_millis(millis),
                "{desired} nodes"
            );
        }
    }

    #[test]
    fn a_status_shows_a_verdict_once_it_has_both_conditions() {
        let condition = |type_: &str, status: &str| ModuleCondition {
            type_: type_.into(),
            status: status.into(),
            reason: String::new(),
            message: String::new(),
            last_transition_time: String::new(),
        };
        let status = |conditions: Vec<ModuleCondition>| ModuleStatus {
            conditions,
            ..ModuleStatus::default()
        };
        assert_eq!(shown(None), None);
        assert_eq!(shown(Some(&status(vec![]))), None);
        assert_eq!(
            shown(Some(&status(vec![condition("Available", "True")]))),
            None
        );
        assert_eq!(
            shown(Some(&status(vec![
                condition("Degraded", "True"),
                condition("Available", "False"),
            ]))),
            Some(Verdict {
                available: false,
                degraded: true
            })
        );
    }
}

#[cfg(test)]
mod wakes {
    use futures::FutureExt;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    use super::*;
    use capstan_api::nmc::{NodeModuleStatus, NodeModulesConfigSpec};

    fn nmc(generation: i64, label: Option<&str>, loaded: bool) -> NodeModulesConfig {
        let mut nmc = NodeModulesConfig::new("n1", NodeModulesConfigSpec::default());
        nmc.metadata.uid = Some("uid-1".to_string());
        nmc.metadata.generation = Some(generation);
        nmc.metadata.labels =
            label.map(|label| BTreeMap::from([(label.to_string(), String::new())]));
        if loaded {
            let status = NodeModuleStatus {
                name: "a".to_string(),
                namespace: "kmm".to_string(),
                ..NodeModuleStatus::default()
            };
            nmc.status = Some(capstan_api::nmc::NodeModulesConfigStatus {
                modules: vec![status],
            });
        }
        nmc
    }

    /// Which of `changes` (the object; `false` when it is deleted from the cache before
    /// the stream sees it) the node reconciler is woken by.
    fn woken(changes: Vec<(NodeModulesConfig, bool)>) -> Vec<bool> {
        let (store, mut writer) = reflector::store();
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        let mut passed = Box::pin(changed_only(receiver, store, nmc_fingerprint));
        let mut woken = Vec::new();
        for (nmc, kept) in changes {
            let event = if kept {
                watcher::Event::Apply(nmc.clone())
            } else {
                watcher::Event::Delete(nmc.clone())
            };
            writer.apply_watcher_event(&event);
            sender.unbounded_send(Arc::new(nmc)).unwrap();
            woken.push(passed.next().now_or_never().is_some());
        }
        woken
    }

    #[test]
    fn a_node_is_woken_by_its_nmc_spec_labels_and_deletion_not_its_status() {
        assert_eq!(
            woken(vec![
                (nmc(1, None, false), true),      // created
                (nmc(1, None, true), true),       // status only
                (nmc(2, None, true), true),       // spec (generation)
                (nmc(2, Some("x"), true), true),  // labels
                (nmc(2, Some("x"), true), true),  // nothing
                (nmc(2, Some("x"), true), false), // deleted
            ]),
            [true, false, true, true, false, true]
        );
    }

    #[test]
    fn a_node_is_woken_by_a_module_spec_and_deletion_not_its_status() {
        let mut module: Module = serde_json::from_value(serde_json::json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
            "kind": "Module",
            "metadata": {"name": "a", "namespace": "kmm", "uid": "uid-a", "generation": 1},
            "spec": {"selector": {}},
        }))
        .expect("a Module");
        let before = module_fingerprint(&module);
        module.status = Some(ModuleStatus {
            module_loader: capstan_api::module::DaemonSetStatus {
                desired_number: 3,
                ..Default::default()
            },
            ..ModuleStatus::default()
        });
        assert_eq!(module_fingerprint(&module), before);
        module.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert_ne!(module_fingerprint(&module), before);
    }
}

#[cfg(test)]
mod tests;
