//! The NMC reconciler: per node, reads the NMC, the Node and the worker pods on it from the
//! shared caches (the NMC fresh from the API server while the cache has not shown the
//! reconciler's own last write to it, see [`own_writes`](super::own_writes)), calls
//! [`decide`] and writes what it decided in the documented order: the NMC status, the
//! NMC's worker failures (see [`failures`](crate::controllers::failures)) and labels, then
//! pod deletions, then pod creations, then the node's ready labels, then the Events. It
//! stops at the first failed write; the next pass starts again from what the API server
//! holds.
//!
//! capstan's worker pods carry no finalizer. Pods upstream KMM created carry its
//! [`WORKER_POD_FINALIZER`], which only its controller removed: the reconciler removes it
//! before it deletes such a pod, from such a pod being deleted already, and from every
//! such pod on a node whose NMC is gone (the garbage collector deletes the NMC's pods with
//! it).
//!
//! A node whose worker pods the cache does not show as this reconciler last wrote them
//! waits for the cache (see [`expectations`](super::expectations)). Worker pods have
//! deterministic names besides, so a pod created twice is refused by the API server and
//! never runs twice.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};

use super::expectations::Expectations;
use super::own_writes::OwnWrites;
use super::worker_pod;
use super::{LabelChanges, NmcInput, PodRelease, WorkerOutcome, WorkerPod, decide};
use crate::controllers::caches::{Caches, Stores};
use crate::controllers::context::{CONCURRENCY, Context};
use crate::controllers::failures::{FAILURES_ANNOTATION, WorkerFailures};
use crate::controllers::node::NodeFacts;
use crate::controllers::runner::Runner;
use crate::controllers::skipped_fields::Lean;
use crate::history::recorder::EventKey;
use capstan_api::labels::{ModuleKey, ModuleLabel, WORKER_POD_FINALIZER};
use capstan_api::managers;
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;

#[cfg(test)]
mod tests;

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write or read the API server refused.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// Next look after a worker pod deletion refused for a conflict.
const RECHECK: Duration = Duration::from_secs(1);

/// The annotation upstream KMM puts on its `ModuleLoaded` and `ModuleUnloaded` Events:
/// the Module as `<namespace>/<name>`, which tools filter KMM's Events by.
const MODULE_EVENT_ANNOTATION: &str = "module";

/// How long a node's NMC waits for more changes before it is reconciled: the worker pods
/// a reconcile starts on a node finish within moments of each other, and each finish is a
/// pod event. Gathered, one pass reads them all into the status (one status write, one
/// label write) instead of one pass, and perhaps one write, per pod. The wait starts over
/// with each change (kube's trailing-edge debounce), so it is kept far below anything
/// that changes a node steadily (a real kubelet's status heartbeat is 10 s).
const DEBOUNCE: Duration = Duration::from_millis(200);

/// What every reconcile of the NMC reconciler shares: the context, the caches' stores it
/// reads, and what it wrote that the caches have not shown yet.
struct Data {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    modules: Store<Module>,
    nmcs: Store<NodeModulesConfig>,
    worker_pods: Store<Pod>,
    expectations: Arc<Expectations>,
    own_writes: Arc<OwnWrites>,
}

/// Runs the NMC reconciler until `ctx.shutdown`. Subscribes to `caches`; the caller starts
/// them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let stores = Stores::of(caches);
    let expectations = Arc::new(Expectations::default());
    // Every worker pod the cache passes on settles what this reconciler expected of it,
    // before the reconcile it triggers runs.
    let pods = {
        let expectations = expectations.clone();
        let store = stores.worker_pods.clone();
        caches
            .worker_pods
            .subscribe()
            .inspect(move |pod: &Arc<Pod>| {
                let in_store = store
                    .get(&ObjectRef::from_obj(pod.as_ref()))
                    .is_some_and(|held| held.metadata.uid == pod.metadata.uid);
                expectations.observe(pod, in_store);
            })
    };
    // Every NMC the cache passes on settles the reconciler's own write it shows.
    let own_writes = Arc::new(OwnWrites::default());
    let nmcs = {
        let own_writes = own_writes.clone();
        caches
            .nmcs
            .subscribe()
            .inspect(move |nmc: &Arc<NodeModulesConfig>| {
                own_writes.observe(&nmc.name_any(), nmc.resource_version().as_deref());
            })
    };
    let controller = Controller::for_shared_stream(nmcs, stores.nmcs.clone())
        .with_config(
            Config::default()
                .concurrency(CONCURRENCY)
                .debounce(DEBOUNCE),
        )
        // Not `owns`: kube keys a namespaced pod's owner in the pod's namespace, which would
        // make a second, concurrent key for the same cluster-scoped NMC.
        .watches_shared_stream(pods, |pod: Arc<Pod>| {
            pod.owner_references()
                .iter()
                .filter(|owner| owner.kind == "NodeModulesConfig")
                .map(|owner| ObjectRef::new(&owner.name))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(caches.nodes.subscribe(), |node: Arc<Node>| {
            Some(ObjectRef::new(&node.name_any()))
        });
    let data = Arc::new(Data {
        ctx: ctx.clone(),
        nodes: stores.nodes.clone(),
        modules: stores.modules.clone(),
        nmcs: stores.nmcs.clone(),
        worker_pods: stores.worker_pods.clone(),
        expectations,
        own_writes,
    });
    // A store not filled yet would look like every Module and pod was deleted.
    Runner::new("nmc", &ctx)
        .reads_all(stores.readiness())
        .run(controller, reconcile, data)
}

impl Data {
    /// The resourceVersion the NMC cache holds for `node`.
    fn cached_version(&self, node: &str) -> Option<String> {
        self.nmcs
            .get(&ObjectRef::new(node))
            .and_then(|nmc| nmc.resource_version())
    }

    /// The reconciler wrote `node`'s NMC; the API server answered with `written`.
    fn wrote(&self, node: &str, written: &Written) {
        self.own_writes.wrote(
            node,
            written.metadata.resource_version.as_deref(),
            self.cached_version(node).as_deref(),
        );
    }
}

/// `node`'s NMC: the cached one, or a fresh read while the cache has not shown the
/// reconciler's last write to it.
async fn read_nmc(
    nmcs: &Api<Lean<NodeModulesConfig>>,
    data: &Data,
    node: &str,
) -> Result<Option<Arc<NodeModulesConfig>>, kube::Error> {
    if !data.own_writes.pending(node) {
        return Ok(data.nmcs.get(&ObjectRef::new(node)));
    }
    // Read past its managed fields, as the cache does.
    let fresh = nmcs.get_opt(node).await?.map(Lean::into_inner);
    data.own_writes.read_fresh(
        node,
        fresh
            .as_ref()
            .and_then(|nmc| nmc.metadata.resource_version.as_deref()),
        data.cached_version(node).as_deref(),
    );
    Ok(fresh.map(Arc::new))
}

/// The worker pods on `node`: those of every Module the NMC or the caches name (pod names
/// are deterministic, so they are looked up rather than searched for).
fn worker_pods(data: &Data, nmc: &NodeModulesConfig, node: &str) -> Vec<WorkerPod> {
    let mut modules: BTreeSet<(String, String)> = data
        .modules
        .state()
        .iter()
        .map(|m| (m.namespace().unwrap_or_default(), m.name_any()))
        .collect();
    modules.extend(
        nmc.spec
            .modules
            .iter()
            .map(|e| (e.namespace.clone(), e.name.clone())),
    );
    if let Some(status) = &nmc.status {
        modules.extend(
            status
                .modules
                .iter()
                .map(|e| (e.namespace.clone(), e.name.clone())),
        );
    }
    for label in nmc.labels().keys() {
        for (_, key) in ModuleLabel::parse(label) {
            modules.insert((key.namespace().to_string(), key.name().to_string()));
        }
    }
    modules
        .into_iter()
        .filter_map(|(namespace, name)| {
            let key = ModuleKey::new(namespace.as_str(), name.as_str()).ok()?;
            let pod = data
                .worker_pods
                .get(&ObjectRef::new(&key.worker_pod_name(node)).within(&namespace))?;
            let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            on_node.then_some(pod)
        })
        .filter_map(|pod| match WorkerPod::from_pod(&pod) {
            Ok(worker) => Some(worker),
            Err(err) => {
                tracing::warn!(%err, "nmc: a pod that is not a worker pod is ignored");
                None
            }
        })
        .collect()
}

/// Reconciles `cached`'s node: reads, decides, writes.
async fn reconcile(cached: Arc<NodeModulesConfig>, data: Arc<Data>) -> Result<Action, Error> {
    let ctx = &data.ctx;
    let name = cached.name_any();
    let cached = |pod: &ObjectRef<Pod>| data.worker_pods.get(pod);
    if let Some(wait) = data.expectations.wait(&name, Instant::now(), cached) {
        // The pods' events bring the node back once the cache shows the last writes.
        return Ok(Action::requeue(wait));
    }
    let nmcs: Api<Lean<NodeModulesConfig>> = Api::all(ctx.client.clone());
    let Some(nmc) = read_nmc(&nmcs, &data, &name).await? else {
        // The garbage collector deletes the NMC's worker pods; those upstream KMM created
        // would stay Terminating.
        for release in upstream_pods_on(&data.worker_pods.state(), &name) {
            release_pod(&ctx.client, &release).await?;
        }
        return Ok(Action::await_change());
    };
    let Some(node) = data.nodes.get(&ObjectRef::new(&name)) else {
        return Ok(Action::await_change());
    };
    let facts = NodeFacts::from_node(&node);
    let workers = worker_pods(&data, &nmc, &name);
    let failures = WorkerFailures::of(&nmc);
    let input = NmcInput::new(&facts, &nmc, &workers, &failures, ctx.clock.now());
    let decision = decide(&input);
    tracing::debug!(node = %name, steps = ?decision.steps, create = decision.create.len(), delete = decision.delete.len(), backoff = ?decision.backoff, pods = workers.len(), "nmc: decided");
    for problem in &decision.problems {
        tracing::warn!(node = %name, %problem, "nmc");
    }

    // 1. The status, the failures and the NMC's labels, before any pod is deleted.
    if let Some(status) = &decision.status {
        let patch = json!({"status": {"modules": status}});
        let written = patch_nmc(&ctx.client, &name, Some("status"), &patch).await?;
        data.wrote(&name, &written);
    }
    let mut nmc_metadata = Map::new();
    if let Some(failures) = &decision.failures {
        nmc_metadata.insert(
            "annotations".into(),
            json!({FAILURES_ANNOTATION: failures.annotation()}),
        );
    }
    if !decision.nmc_labels.is_empty() {
        nmc_metadata.insert("labels".into(), label_patch(&decision.nmc_labels));
    }
    if !nmc_metadata.is_empty() {
        let patch = json!({"metadata": nmc_metadata});
        let written = patch_nmc(&ctx.client, &name, None, &patch).await?;
        data.wrote(&name, &written);
    }

    // 2. Deletions, each pod upstream KMM created freed of its finalizer first.
    for release in &decision.release {
        release_pod(&ctx.client, release).await?;
    }
    let mut recheck = false;
    for deletion in &decision.delete {
        let params = DeleteParams {
            preconditions: deletion.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match delete_pod(&ctx.client, &deletion.namespace, &deletion.name, &params).await {
            Ok(()) => {
                let pod = pod_named(&deletion.namespace, &deletion.name, deletion.uid.clone());
                data.expectations.deleted(&name, &pod, Instant::now());
            }
            // Gone already.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            // Replaced by a pod of the same name, whose events bring the NMC back; or a
            // conflict that deleted nothing, which only a look again finds.
            Err(kube::Error::Api(status)) if status.code == 409 => recheck = true,
            Err(err) => return Err(err.into()),
        }
    }

    // 3. Creations.
    for plan in &decision.create {
        let pod = worker_pod::build(plan, &nmc, &ctx.worker_image);
        let params = PostParams {
            field_manager: Some(managers::NMC.into()),
            ..PostParams::default()
        };
        crate::crash::point("nmc.worker-pod.before");
        match create_pod(&ctx.client, plan.module.namespace(), &pod, &params).await {
            Ok(created) => {
                crate::crash::point("nmc.worker-pod.after");
                data.expectations.created(&name, &created, Instant::now());
            }
            // The previous pod is still terminating, or the cache was behind: the pod's
            // events bring the NMC back. Another 409 created nothing and is retried.
            Err(kube::Error::Api(status))
                if status.code == 409 && status.reason == "AlreadyExists" => {}
            Err(err) => return Err(err.into()),
        }
    }

    // 4. The node's ready labels.
    if !decision.node_labels.is_empty() {
        let patch = json!({"metadata": {"labels": label_patch(&decision.node_labels)}});
        let request = kube::core::Request::new(Node::url_path(&(), None))
            .patch(
                &name,
                &PatchParams::apply(managers::NMC),
                &Patch::Merge(patch),
            )
            .map_err(kube::Error::BuildRequest)?;
        crate::crash::point("nmc.ready-labels.before");
        ctx.client
            .request_text(request)
            .await
            .map_err(Error::from)?;
        crate::crash::point("nmc.ready-labels.after");
    }

    // 5. Events.
    events(ctx, &data.modules, &node, &decision.outcomes).await;

    let mut wait = decision.retry_after();
    if recheck {
        wait = Some(wait.map_or(RECHECK, |w| w.min(RECHECK)));
    }
    Ok(match wait {
        Some(wait) => Action::requeue(wait + Duration::from_millis(10)),
        None => Action::await_change(),
    })
}

/// What the reconciler reads of the API server's answer to a write: the whole body (a
/// worker pod, an NMC listing every module twice) is most of the cost of parsing the
/// answer, and only its identity and resourceVersion are used.
#[derive(serde::Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

/// Merge-patches NMC `name` (its `subresource`, when given) as the NMC reconciler.
async fn patch_nmc(
    client: &kube::Client,
    name: &str,
    subresource: Option<&str>,
    patch: &Value,
) -> Result<Written, kube::Error> {
    let params = PatchParams::apply(managers::NMC);
    let patch = Patch::Merge(patch);
    let request = kube::core::Request::new(NodeModulesConfig::url_path(&(), None));
    let request = match subresource {
        Some(subresource) => request.patch_subresource(subresource, name, &params, &patch),
        None => request.patch(name, &params, &patch),
    }
    .map_err(kube::Error::BuildRequest)?;
    client.request(request).await
}

/// Creates `pod` in `namespace`; the pod answered has only its name, namespace and uid.
async fn create_pod(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    params: &PostParams,
) -> Result<Pod, kube::Error> {
    let body = serde_json::to_vec(pod).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)))
        .create(params, body)
        .map_err(kube::Error::BuildRequest)?;
    let written: Written = client.request(request).await?;
    let meta = written.metadata;
    Ok(pod_named(
        &meta.namespace.unwrap_or_default(),
        &meta.name.unwrap_or_default(),
        meta.uid,
    ))
}

/// A pod known by its identity only, as [`Expectations`] remember it.
fn pod_named(namespace: &str, name: &str, uid: Option<String>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            uid,
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// Deletes pod `name` in `namespace`; the answer is not read.
async fn delete_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    params: &DeleteParams,
) -> Result<(), kube::Error> {
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)))
        .delete(name, params)
        .map_err(kube::Error::BuildRequest)?;
    client.request_text(request).await.map(|_| ())
}

/// The worker pods on `node` that carry upstream KMM's finalizer.
fn upstream_pods_on(pods: &[Arc<Pod>], node: &str) -> Vec<PodRelease> {
    pods.iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|pod| {
            pod.finalizers()
                .iter()
                .any(|finalizer| finalizer == WORKER_POD_FINALIZER)
        })
        .map(|pod| PodRelease {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
        })
        .collect()
}

/// Removes upstream KMM's finalizer from the pod of `release`, and only that finalizer;
/// a pod gone already is fine.
async fn release_pod(client: &kube::Client, release: &PodRelease) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {
        "$deleteFromPrimitiveList/finalizers": [WORKER_POD_FINALIZER],
    }});
    let request = kube::core::Request::new(Pod::url_path(&(), Some(&release.namespace)))
        .patch(
            &release.name,
            &PatchParams::apply(managers::NMC),
            &Patch::Strategic(patch),
        )
        .map_err(kube::Error::BuildRequest)?;
    match client.request_text(request).await {
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        result => result.map(|_| ()),
    }
}

/// A merge patch of labels: set values, `null` for removals.
fn label_patch(changes: &LabelChanges) -> Value {
    let mut labels = Map::new();
    for (key, value) in &changes.set {
        labels.insert(key.clone(), json!(value));
    }
    for key in &changes.remove {
        labels.insert(key.clone(), Value::Null);
    }
    Value::Object(labels)
}

/// Events for what the finished worker pods did: on the Node, with the Module as related
/// object and, for a failure, a Warning on the Module too (one that is gone has none).
async fn events(ctx: &Context, modules: &Store<Module>, node: &Node, outcomes: &[WorkerOutcome]) {
    let node_ref = node.object_ref(&());
    let node_name = node.name_any();
    for outcome in outcomes {
        let module = &outcome.module;
        let action = outcome.action.as_str();
        let module_ref = ObjectRef::<Module>::new(module.name()).within(module.namespace());
        let module_object = modules.get(&module_ref);
        // The Module, or a reference to it by name once it is gone.
        let related = module_object.as_ref().map_or_else(
            || ObjectReference {
                api_version: Some(Module::api_version(&()).into_owned()),
                kind: Some(Module::kind(&()).into_owned()),
                namespace: Some(module.namespace().to_string()),
                name: Some(module.name().to_string()),
                ..ObjectReference::default()
            },
            |m| m.object_ref(&()),
        );
        let Some(message) = &outcome.failure else {
            tracing::info!(node = %node_name, module = %module, "{}", outcome.reason());
            worker_event(ctx, outcome, &node_name, &node_ref, related).await;
            continue;
        };
        tracing::warn!(node = %node_name, module = %module, action, %message, "worker failed; retrying with backoff");
        worker_event(ctx, outcome, &node_name, &node_ref, related).await;
        if let Some(object) = &module_object {
            let module_ref = object.object_ref(&());
            worker_event(ctx, outcome, &node_name, &module_ref, node_ref.clone()).await;
        }
    }
}

/// Publishes the Event of `outcome` about `regarding` (the node or the Module), annotated
/// with the Module as upstream KMM annotates its Events. A failure is logged, never fatal.
async fn worker_event(
    ctx: &Context,
    outcome: &WorkerOutcome,
    node: &str,
    regarding: &ObjectReference,
    related: ObjectReference,
) {
    let reason = outcome.reason();
    let key = EventKey {
        warning: outcome.failure.is_some(),
        reason: reason.into(),
        action: outcome.action.as_str().into(),
        note: outcome.note(node),
        regarding: regarding.into(),
        related: Some((&related).into()),
        annotations: [(
            MODULE_EVENT_ANNOTATION.to_string(),
            outcome.module.to_string(),
        )]
        .into(),
    };
    if let Err(err) = ctx.recorder.publish(key, regarding, Some(related)).await {
        tracing::debug!(%err, reason, "could not publish an event");
    }
}
