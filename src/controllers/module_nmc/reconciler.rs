//! The Module -> NMC reconcilers.
//!
//! - Per node: every Module's [`decide`] for the node gives the node's NMC `spec.modules`
//!   and its `module-configured` / `module-in-use` labels. The NMC is created (owned by the
//!   Node, so it goes with it) when a Module first wants the node, and written only when
//!   something differs: one write per node however many Modules change.
//! - Per Module: the finalizer (added at once, removed when no NMC lists the Module in its
//!   spec or status any more, that is when it is unloaded everywhere), `status.moduleLoader`
//!   ([`loader_status`](super::loader_status), kept up to date by the [`Tally`] from each
//!   NMC and Node change) and the `Available` / `Degraded` conditions, written only when
//!   they change.
//!
//! Both read the shared watch caches ([`Stores`]) and write with field manager
//! [`managers::MODULE_NMC`] through JSON merge patches of the fields they own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::tally::{Tally, Verdict};
use super::{EntryAction, ModuleFacts, decide};
use crate::controllers::caches::{Caches, Stores};
use crate::controllers::context::{CONCURRENCY, Context};
use crate::controllers::node::NodeFacts;
use crate::controllers::runner::Runner;
use capstan_api::clock::rfc3339;
use capstan_api::labels::{ModuleKey, ModuleLabel, NAMESPACE_LABEL};
use capstan_api::managers;
use capstan_api::module::{Module, ModuleCondition, ModuleStatus};
use capstan_api::nmc::{NodeModuleSpec, NodeModulesConfig, NodeModulesConfigSpec};

/// Why a reconcile failed; it is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write or read the API server refused.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// A Module's status counts are written at most once per this long while they keep
/// changing (a condition that changes is written at once): a rollout over thousands of
/// nodes writes its progress every two seconds, not once per NMC write. See [`Pacer`].
const STATUS_INTERVAL: Duration = Duration::from_secs(2);

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

struct NodeCtx {
    ctx: Arc<Context>,
    stores: Arc<Stores>,
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
                stores,
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

/// The NMC spec and labels one node should have.
#[derive(Debug, Default, PartialEq)]
struct NodeWants {
    modules: Vec<NodeModuleSpec>,
    /// NMC labels to set (value) or remove (`None`).
    labels: BTreeMap<String, Option<String>>,
}

/// Decides the NMC of `node` from every Module; `None` when the node needs no NMC and has
/// none.
///
/// Entries of Modules that exist but whose name capstan cannot use (`unusable`, by
/// namespace and name) are kept as they are: upstream accepts names capstan's labels cannot
/// carry, and such a Module's module stays loaded rather than being unloaded by a
/// controller that cannot manage it.
fn node_wants(
    node: &NodeFacts,
    modules: &[ModuleFacts],
    unusable: &BTreeSet<(String, String)>,
    nmc: Option<&NodeModulesConfig>,
) -> Option<NodeWants> {
    let mut wants = NodeWants::default();
    wants.modules.extend(
        nmc.into_iter()
            .flat_map(|nmc| &nmc.spec.modules)
            .filter(|entry| unusable.contains(&(entry.namespace.clone(), entry.name.clone())))
            .cloned(),
    );
    let known: BTreeSet<&ModuleKey> = modules.iter().map(|m| &m.key).collect();
    for module in modules {
        let current = nmc.and_then(|nmc| nmc.spec_module(&module.key));
        let entry = match decide(module, node, current) {
            Ok(decision) => match decision.action {
                EntryAction::Set(entry) => Some(*entry),
                EntryAction::Remove => None,
                EntryAction::Unchanged => current.cloned(),
            },
            Err(err) => {
                tracing::warn!(module = %module.key, node = %node.name, %err, "kernel mappings cannot be evaluated; the node's entry is left as it is");
                current.cloned()
            }
        };
        match entry {
            Some(entry) => {
                wants
                    .labels
                    .insert(module.key.module_configured_label(), Some(String::new()));
                wants
                    .labels
                    .insert(module.key.module_in_use_label(), Some(String::new()));
                wants.modules.push(entry);
            }
            None => {
                wants
                    .labels
                    .insert(module.key.module_configured_label(), None);
            }
        }
    }
    // Entries of Modules that no longer exist (deleted outright, without their finalizer)
    // go, and so does their `module-configured` label.
    if let Some(nmc) = nmc {
        for label in nmc.labels().keys() {
            let orphan = ModuleLabel::parse(label)
                .into_iter()
                .any(|(kind, key)| kind == ModuleLabel::ModuleConfigured && !known.contains(&key));
            if orphan {
                wants.labels.insert(label.clone(), None);
            }
        }
    }
    wants
        .modules
        .sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    if nmc.is_none() && wants.modules.is_empty() {
        return None;
    }
    Some(wants)
}

/// The merge patch that gives `nmc` what `wants` asks for, and its Node as an `owner`
/// (as upstream sets it on every write, so that an NMC made without one still goes with
/// its Node); `None` when nothing differs.
fn nmc_patch(nmc: &NodeModulesConfig, wants: &NodeWants, owner: &OwnerReference) -> Option<Value> {
    let mut current = nmc.spec.modules.clone();
    current.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut patch = json!({});
    if current != wants.modules {
        patch["spec"] = json!({"modules": wants.modules});
    }
    let owners = nmc.metadata.owner_references.as_deref().unwrap_or_default();
    if !wants.modules.is_empty() && !owners.iter().any(|o| o.uid == owner.uid) {
        let mut owners = owners.to_vec();
        owners.push(owner.clone());
        patch["metadata"] = json!({"ownerReferences": owners});
    }
    let labels = nmc.labels();
    let mut label_patch = serde_json::Map::new();
    for (key, value) in &wants.labels {
        match value {
            Some(value) if labels.get(key) != Some(value) => {
                label_patch.insert(key.clone(), json!(value));
            }
            None if labels.contains_key(key) => {
                label_patch.insert(key.clone(), Value::Null);
            }
            _ => {}
        }
    }
    if !label_patch.is_empty() {
        patch["metadata"]["labels"] = Value::Object(label_patch);
    }
    (patch != json!({})).then_some(patch)
}

async fn reconcile_node(node: Arc<Node>, data: Arc<NodeCtx>) -> Result<Action, Error> {
    let stores = &data.stores;
    let facts = NodeFacts::from_node(&node);
    let mut modules = Vec::new();
    let mut unusable = BTreeSet::new();
    for module in stores.modules.state() {
        match ModuleFacts::from_shared(&module) {
            Ok(facts) => modules.push(facts),
            Err(err) => {
                tracing::debug!(%err, "module-nmc: a Module with an unusable name is ignored");
                unusable.insert((module.namespace().unwrap_or_default(), module.name_any()));
            }
        }
    }
    let nmc = stores
        .nmcs
        .get(&ObjectRef::new(&facts.name))
        .filter(|nmc| nmc.metadata.deletion_timestamp.is_none());
    tracing::debug!(node = %facts.name, modules = modules.len(), nmc = nmc.is_some(), "module-nmc: node");
    let Some(wants) = node_wants(&facts, &modules, &unusable, nmc.as_deref()) else {
        return Ok(Action::await_change());
    };
    let params = PatchParams::apply(managers::MODULE_NMC);
    match nmc {
        Some(nmc) => {
            if let Some(patch) = nmc_patch(&nmc, &wants, &owner_reference(&node)) {
                let request = kube::core::Request::new(NodeModulesConfig::url_path(&(), None))
                    .patch(&facts.name, &params, &Patch::Merge(patch))
                    .map_err(kube::Error::BuildRequest)?;
                data.ctx.client.request_text(request).await?;
            }
        }
        None => {
            let labels: BTreeMap<String, String> = wants
                .labels
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                .collect();
            let mut nmc = NodeModulesConfig::new(
                &facts.name,
                NodeModulesConfigSpec {
                    modules: wants.modules,
                },
            );
            nmc.metadata.labels = Some(labels);
            nmc.metadata.owner_references = Some(vec![owner_reference(&node)]);
            let params = PostParams {
                field_manager: Some(managers::MODULE_NMC.into()),
                ..PostParams::default()
            };
            // The answer is not read: the NMC's watch event brings it to the cache.
            let request = kube::core::Request::new(NodeModulesConfig::url_path(&(), None))
                .create(
                    &params,
                    serde_json::to_vec(&nmc).map_err(kube::Error::SerdeError)?,
                )
                .map_err(kube::Error::BuildRequest)?;
            match data.ctx.client.request_text(request).await {
                Ok(_) => {}
                // Created meanwhile (the cache was behind): the NMC event brings us back.
                // Another 409 created nothing and is retried.
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

/// The Node as the owner of its NMC: deleting the Node deletes the NMC.
fn owner_reference(node: &Node) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.name_any(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

struct ModuleCtx {
    ctx: Arc<Context>,
    stores: Arc<Stores>,
    pacer: Arc<Pacer>,
    tally: Arc<Tally>,
}

/// Paces the status writes of each Module: the first change of its counts after a quiet
/// spell is written at once, later ones at most once per [`STATUS_INTERVAL`], and the last
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
    fn wait(&self, module: &ObjectRef<Module>, now: Instant) -> Option<Duration> {
        let mut paced = self.paced();
        let paced = paced.entry(module.clone()).or_default();
        match paced.written {
            Some(at) if now.saturating_duration_since(at) < STATUS_INTERVAL => {
                paced.queued = true;
                paced.waiting = true;
                Some(STATUS_INTERVAL - now.saturating_duration_since(at))
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
        stores: stores.clone(),
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

async fn reconcile_module(module: Arc<Module>, data: Arc<ModuleCtx>) -> Result<Action, Error> {
    let stores = &data.stores;
    let reference = ObjectRef::from_obj(module.as_ref());
    data.pacer.started(&reference);
    let Ok(facts) = ModuleFacts::from_shared(&module) else {
        return Ok(Action::await_change());
    };
    let api: Api<Module> = Api::namespaced(data.ctx.client.clone(), facts.key.namespace());
    let name = facts.key.name();
    let finalizer = capstan_api::labels::MODULE_FINALIZER;
    let finalizers = module.finalizers();
    let has_finalizer = finalizers.iter().any(|f| f == finalizer);
    if facts.deleting() {
        let present = data.tally.present(&facts.key, &stores.nmcs);
        if has_finalizer && present == 0 {
            let rest: Vec<&String> = finalizers.iter().filter(|f| *f != finalizer).collect();
            let patch = json!({"metadata": {
                "finalizers": rest,
                "resourceVersion": module.resource_version(),
            }});
            match api
                .patch(
                    name,
                    &PatchParams {
                        field_manager: Some(managers::MODULE_NMC.into()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(patch),
                )
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {
                    return Ok(Action::requeue(CONFLICT_RETRY));
                }
                Err(err) => return Err(err.into()),
            }
            data.pacer.forget(&reference);
            data.tally.forget(&facts.key);
            tracing::info!(module = %facts.key, "unloaded from every node; finalizer removed");
            let others = stores.modules.state().iter().any(|other| {
                other.namespace() == module.namespace() && other.uid() != module.uid()
            });
            if !others {
                label_namespace(&data.ctx.client, facts.key.namespace(), None).await?;
            }
        } else if present > 0 {
            tracing::debug!(module = %facts.key, nodes = present, "waiting for the module to be unloaded");
        }
        return Ok(Action::await_change());
    }
    if !has_finalizer {
        // A Module is seen here once before its finalizer is on: its namespace is labelled
        // then, as upstream's namespace labeller does.
        label_namespace(&data.ctx.client, facts.key.namespace(), Some("")).await?;
        let mut all: Vec<String> = finalizers.to_vec();
        all.push(finalizer.to_string());
        let patch = json!({"metadata": {
            "finalizers": all,
            "resourceVersion": module.resource_version(),
        }});
        match api
            .patch(
                name,
                &PatchParams {
                    field_manager: Some(managers::MODULE_NMC.into()),
                    ..PatchParams::default()
                },
                &Patch::Merge(patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            Err(err) => return Err(err.into()),
        }
    }
    let counts = data.tally.count(&facts, &stores.nmcs, &stores.nodes);
    let current = module.status.clone().unwrap_or_default();
    let now = rfc3339(data.ctx.clock.now());
    let conditions = conditions(&current, &counts.status, &counts.failures, &now);
    if current.module_loader == counts.status && current.conditions == conditions {
        return Ok(Action::await_change());
    }
    // A condition that changes status is written at once; counts alone are paced.
    let transition = conditions.iter().any(|condition| {
        current
            .conditions
            .iter()
            .find(|c| c.type_ == condition.type_)
            .is_none_or(|c| c.status != condition.status)
    });
    if transition {
        data.pacer.written(&reference, Instant::now());
    } else if let Some(wait) = data.pacer.wait(&reference, Instant::now()) {
        return Ok(Action::requeue(wait));
    }
    let status = ModuleStatus {
        module_loader: counts.status,
        conditions,
        ..current
    };
    let patch = json!({"status": {
        "moduleLoader": status.module_loader,
        "conditions": status.conditions,
    }});
    match api
        .patch_status(
            name,
            &PatchParams::apply(managers::MODULE_NMC),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => return Err(err.into()),
    }
    Ok(Action::await_change())
}

/// Most failing nodes a `Degraded` message names.
const FAILURES_SHOWN: usize = 3;

/// The Module's conditions: `Available` (every node with an entry has it loaded) and
/// `Degraded` (worker pods fail on some nodes). A condition keeps its transition time while
/// its status stays.
fn conditions(
    current: &ModuleStatus,
    counts: &capstan_api::module::DaemonSetStatus,
    failures: &[(String, crate::controllers::failures::WorkerFailure)],
    now: &str,
) -> Vec<ModuleCondition> {
    let available = counts.available_number == counts.desired_number;
    let available = ModuleCondition {
        type_: "Available".into(),
        status: if available { "True" } else { "False" }.into(),
        reason: if available { "Loaded" } else { "Loading" }.into(),
        message: format!(
            "loaded on {} of {} nodes",
            counts.available_number, counts.desired_number
        ),
        last_transition_time: String::new(),
    };
    let degraded = if failures.is_empty() {
        ModuleCondition {
            type_: "Degraded".into(),
            status: "False".into(),
            reason: "WorkersSucceed".into(),
            message: String::new(),
            last_transition_time: String::new(),
        }
    } else {
        let mut shown: Vec<String> = failures
            .iter()
            .take(FAILURES_SHOWN)
            .map(|(node, failure)| {
                format!(
                    "{node}: {} failed {} time(s): {}",
                    failure.action, failure.attempts, failure.message
                )
            })
            .collect();
        if failures.len() > FAILURES_SHOWN {
            shown.push(format!(
                "and {} more nodes",
                failures.len() - FAILURES_SHOWN
            ));
        }
        ModuleCondition {
            type_: "Degraded".into(),
            status: "True".into(),
            reason: "WorkerFailed".into(),
            message: shown.join("; "),
            last_transition_time: String::new(),
        }
    };
    [available, degraded]
        .into_iter()
        .map(|mut condition| {
            let previous = current
                .conditions
                .iter()
                .find(|c| c.type_ == condition.type_);
            condition.last_transition_time = match previous {
                Some(previous) if previous.status == condition.status => {
                    previous.last_transition_time.clone()
                }
                _ => now.to_string(),
            };
            condition
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::module::{DaemonSetStatus, ModuleSpec};
    use capstan_api::nmc::ModuleConfig;

    fn module(name: &str, selector: &[(&str, &str)]) -> ModuleFacts {
        let mut spec: ModuleSpec = serde_json::from_value(json!({
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": name},
                "kernelMappings": [{"regexp": "^.+$", "containerImage": format!("registry.example/{name}:${{KERNEL_FULL_VERSION}}")}],
            }},
            "selector": {},
        }))
        .expect("spec");
        spec.selector = selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut module = Module::new(name, spec);
        module.metadata.namespace = Some("kmm".into());
        ModuleFacts::from_module(&module).expect("facts")
    }

    fn node(labels: &[(&str, &str)]) -> NodeFacts {
        NodeFacts {
            name: "worker-1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            kernel_version: "6.0.15".into(),
            ready: true,
            ..NodeFacts::default()
        }
    }

    fn nmc_with(entries: Vec<NodeModuleSpec>, labels: &[&str]) -> NodeModulesConfig {
        let mut nmc =
            NodeModulesConfig::new("worker-1", NodeModulesConfigSpec { modules: entries });
        nmc.metadata.labels = Some(
            labels
                .iter()
                .map(|k| (k.to_string(), String::new()))
                .collect(),
        );
        nmc
    }

    #[test]
    fn node_wants_table() {
        let a = module("a", &[]);
        let b = module("b", &[("gpu", "true")]);
        let plain = node(&[]);
        let gpu = node(&[("gpu", "true")]);
        let entry_a = match decide(&a, &plain, None).expect("decide").action {
            EntryAction::Set(entry) => *entry,
            other => panic!("{other:?}"),
        };
        let none = BTreeSet::new();
        let owner = OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "worker-1".into(),
            uid: "node-uid".into(),
            ..OwnerReference::default()
        };
        let configured = |m: &ModuleFacts| m.key.module_configured_label();
        let in_use = |m: &ModuleFacts| m.key.module_in_use_label();

        // No NMC and nothing wanted: no NMC is made.
        assert_eq!(
            node_wants(&plain, std::slice::from_ref(&b), &none, None),
            None
        );

        // No NMC, one module wanted: the NMC is made with its entry and labels.
        let wants = node_wants(&plain, &[a.clone(), b.clone()], &none, None).expect("wants");
        assert_eq!(wants.modules, vec![entry_a.clone()]);
        assert_eq!(wants.labels[&configured(&a)], Some(String::new()));
        assert_eq!(wants.labels[&in_use(&a)], Some(String::new()));
        assert_eq!(wants.labels[&configured(&b)], None);

        // Both wanted on a GPU node, sorted by namespace and name.
        let wants = node_wants(&gpu, &[b.clone(), a.clone()], &none, None).expect("wants");
        let names: Vec<&str> = wants.modules.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);

        // An NMC already in the wanted state needs no patch.
        let mut nmc = nmc_with(vec![entry_a.clone()], &[&configured(&a), &in_use(&a)]);
        nmc.metadata.owner_references = Some(vec![owner.clone()]);
        let wants = node_wants(&plain, &[a.clone(), b.clone()], &none, Some(&nmc)).expect("wants");
        assert_eq!(nmc_patch(&nmc, &wants, &owner), None);

        // A lost in-use label is put back without touching the spec.
        let nmc = nmc_with(vec![entry_a.clone()], &[&configured(&a)]);
        let wants = node_wants(&plain, std::slice::from_ref(&a), &none, Some(&nmc)).expect("wants");
        let patch = nmc_patch(&nmc, &wants, &owner).expect("patch");
        assert!(patch.get("spec").is_none());
        assert_eq!(patch["metadata"]["labels"][in_use(&a)], json!(""));

        // A Module that is gone entirely loses its entry and its configured label; the
        // in-use label stays for the NMC controller to drop once the module is unloaded.
        let nmc = nmc_with(vec![entry_a.clone()], &[&configured(&a), &in_use(&a)]);
        let wants = node_wants(&plain, &[], &none, Some(&nmc)).expect("wants");
        let patch = nmc_patch(&nmc, &wants, &owner).expect("patch");
        assert_eq!(patch["spec"]["modules"], json!([]));
        assert_eq!(patch["metadata"]["labels"][configured(&a)], Value::Null);
        assert!(patch["metadata"]["labels"].get(in_use(&a)).is_none());

        // An NMC without its Node as owner gets it with the next write.
        let mut unowned = nmc_with(vec![entry_a.clone()], &[&configured(&a), &in_use(&a)]);
        let wants =
            node_wants(&plain, &[a.clone(), b.clone()], &none, Some(&unowned)).expect("wants");
        let patch = nmc_patch(&unowned, &wants, &owner).expect("patch");
        assert_eq!(
            patch["metadata"]["ownerReferences"][0]["uid"],
            json!("node-uid")
        );
        assert!(patch.get("spec").is_none());
        unowned.metadata.owner_references = Some(vec![owner.clone()]);
        assert_eq!(nmc_patch(&unowned, &wants, &owner), None);

        // The entry of a Module whose name capstan cannot use stays as it is.
        let mut long = entry_a.clone();
        long.name = "a-name-upstream-accepts".into();
        let nmc = nmc_with(vec![entry_a.clone(), long.clone()], &[&configured(&a)]);
        let unusable = BTreeSet::from([(long.namespace.clone(), long.name.clone())]);
        let wants =
            node_wants(&plain, std::slice::from_ref(&a), &unusable, Some(&nmc)).expect("wants");
        assert!(wants.modules.contains(&long), "{:?}", wants.modules);
    }

    #[test]
    fn module_fingerprints_ignore_status() {
        let mut module = Module::clone(&module("a", &[]).object);
        let before = module_fingerprint(&module);
        module.status = Some(ModuleStatus {
            module_loader: DaemonSetStatus {
                desired_number: 3,
                ..DaemonSetStatus::default()
            },
            ..ModuleStatus::default()
        });
        assert_eq!(module_fingerprint(&module), before);
        module.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        assert_ne!(module_fingerprint(&module), before);
    }

    #[test]
    fn conditions_table() {
        let counts = |desired, available| DaemonSetStatus {
            nodes_matching_selector_number: 3,
            desired_number: desired,
            available_number: available,
        };
        let failure = crate::controllers::failures::WorkerFailure {
            action: "Load".into(),
            message: "pulling image x: manifest unknown".into(),
            attempts: 2,
            last_failure: "t0".into(),
            pod_uid: "u".into(),
        };
        let cases = [
            ("all loaded", counts(3, 3), vec![], "True", "False"),
            ("loading", counts(3, 1), vec![], "False", "False"),
            (
                "failing",
                counts(3, 2),
                vec![("worker-3".to_string(), failure.clone())],
                "False",
                "True",
            ),
        ];
        for (name, counts, failures, available, degraded) in cases {
            let got = conditions(&ModuleStatus::default(), &counts, &failures, "t1");
            assert_eq!(got[0].status, available, "{name}");
            assert_eq!(got[1].status, degraded, "{name}");
            assert_eq!(got[0].last_transition_time, "t1", "{name}");
        }
        let failing = conditions(
            &ModuleStatus::default(),
            &counts(3, 2),
            &[("worker-3".to_string(), failure)],
            "t1",
        );
        assert!(
            failing[1]
                .message
                .contains("worker-3: Load failed 2 time(s): pulling image x")
        );
        // A condition keeps its transition time while its status stays.
        let current = ModuleStatus {
            conditions: failing.clone(),
            ..ModuleStatus::default()
        };
        let later = conditions(&current, &counts(3, 1), &[], "t2");
        assert_eq!(later[0].last_transition_time, "t1");
        assert_eq!(later[1].last_transition_time, "t2");
        let _ = ModuleConfig::default();
    }
}

#[cfg(test)]
mod pacing {
    use super::*;

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
        assert_eq!(pacer.wait(&a, start), None);
        assert_eq!(pacer.unqueued(counts(&[&a])), std::slice::from_ref(&a));
        assert_eq!(pacer.unqueued(counts(&[&a])), []);
        // That reconcile, due within the interval, waits for the rest of it, still queued.
        pacer.started(&a);
        let later = start + Duration::from_millis(300);
        assert_eq!(
            pacer.wait(&a, later),
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
        assert_eq!(pacer.wait(&a, start + STATUS_INTERVAL), None);
        assert_eq!(pacer.unqueued(counts(&[&a])), std::slice::from_ref(&a));
        // A write out of pace (a condition changed) restarts the interval.
        let written = start + STATUS_INTERVAL + Duration::from_millis(100);
        pacer.started(&a);
        pacer.written(&a, written);
        assert_eq!(
            pacer.wait(&a, written + Duration::from_millis(500)),
            Some(STATUS_INTERVAL - Duration::from_millis(500))
        );
        // Another Module keeps its own pace.
        pacer.started(&b);
        assert_eq!(pacer.wait(&b, later), None);
        // A Module gone is forgotten: its next change queues a reconcile.
        pacer.forget(&b);
        assert_eq!(pacer.unqueued(counts(&[&b])), [b]);
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
    use capstan_api::nmc::NodeModuleStatus;

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
}
