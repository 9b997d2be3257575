//! The NMC reconciler: per node, reads the NMC, the Node and the worker pods on it from the
//! shared caches (the NMC fresh from the API server while the cache has not shown the
//! reconciler's own last write to it, see [`own_writes`](super::own_writes)), calls
//! [`decide`] and writes in the documented order: the NMC status (and the
//! worker failures, see [`failures`](crate::controllers::failures)), then pod deletions,
//! then pod creations (held back while a failed module's backoff runs), then the node's
//! ready labels and the NMC's labels. It stops at the first failed write; the next pass
//! starts again from what the API server holds.
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
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};

use super::expectations::Expectations;
use super::own_writes::OwnWrites;
use super::worker_pod;
use super::{DeleteReason, LabelChanges, NmcInput, PodDeletion, WorkerPod, decide};
use capstan_api::labels::{ModuleKey, ModuleLabel, WorkerAction};
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_api::clock::rfc3339;
use crate::controllers::caches::{Caches, Stores};
use crate::controllers::context::{CONCURRENCY, Context, managers};
use crate::controllers::failures::{FAILURES_ANNOTATION, WorkerFailures};
use crate::controllers::skipped_fields::Lean;
use crate::controllers::node::NodeFacts;

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write or read the API server refused.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

const RETRY: Duration = Duration::from_secs(1);

/// How long a node's NMC waits for more changes before it is reconciled: the worker pods
/// a reconcile starts on a node finish within moments of each other, and each finish is a
/// pod event. Gathered, one pass reads them all into the status (one status write, one
/// label write) instead of one pass, and perhaps one write, per pod. The wait starts over
/// with each change (kube's trailing-edge debounce), so it is kept far below anything
/// that changes a node steadily (a real kubelet's status heartbeat is 10 s).
const DEBOUNCE: Duration = Duration::from_millis(200);

struct Data {
    ctx: Arc<Context>,
    stores: Arc<Stores>,
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
    let shutdown = ctx.shutdown.clone();
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
        })
        .graceful_shutdown_on(async move { shutdown.cancelled().await });
    let data = Arc::new(Data {
        ctx,
        stores,
        expectations,
        own_writes,
    });
    async move {
        controller
            .run(reconcile, error_policy, data)
            .for_each(|_| async {})
            .await;
    }
}

fn error_policy(nmc: Arc<NodeModulesConfig>, err: &Error, _data: Arc<Data>) -> Action {
    tracing::warn!(nmc = %nmc.name_any(), %err, "nmc: reconcile failed; retrying");
    Action::requeue(RETRY)
}

impl Data {
    /// The resourceVersion the NMC cache holds for `node`.
    fn cached_version(&self, node: &str) -> Option<String> {
        self.stores
            .nmcs
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
        return Ok(data.stores.nmcs.get(&ObjectRef::new(node)));
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
fn worker_pods(stores: &Stores, nmc: &NodeModulesConfig, node: &str) -> Vec<Arc<Pod>> {
    let mut modules: BTreeSet<(String, String)> = stores
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
            let pod = stores
                .worker_pods
                .get(&ObjectRef::new(&key.worker_pod_name(node)).within(&namespace))?;
            let on_node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            on_node.then_some(pod)
        })
        .collect()
}

/// The pod `deletion` is about.
fn pod_of<'a>(pods: &'a [Arc<Pod>], deletion: &PodDeletion) -> Option<&'a Arc<Pod>> {
    pods.iter().find(|p| {
        p.name_any() == deletion.name && p.namespace().as_deref() == Some(&deletion.namespace)
    })
}

/// The one-line reason a finished worker pod gives.
fn failure_message(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .next();
    terminated
        .and_then(|t| t.message.clone().or_else(|| t.reason.clone()))
        .or_else(|| status.and_then(|s| s.message.clone()))
        .or_else(|| status.and_then(|s| s.reason.clone()))
        .map(|m| m.lines().next().unwrap_or_default().trim().to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "the worker failed without a reason".to_string())
}

async fn reconcile(cached: Arc<NodeModulesConfig>, data: Arc<Data>) -> Result<Action, Error> {
    let stores = &data.stores;
    stores.ready().await;
    let ctx = &data.ctx;
    let name = cached.name_any();
    let cached = |pod: &ObjectRef<Pod>| stores.worker_pods.get(pod);
    if let Some(wait) = data.expectations.wait(&name, Instant::now(), cached) {
        // The pods' events bring the node back once the cache shows the last writes.
        return Ok(Action::requeue(wait));
    }
    let nmcs: Api<Lean<NodeModulesConfig>> = Api::all(ctx.client.clone());
    let Some(nmc) = read_nmc(&nmcs, &data, &name).await? else {
        return Ok(Action::await_change());
    };
    let Some(node) = stores.nodes.get(&ObjectRef::new(&name)) else {
        return Ok(Action::await_change());
    };
    let facts = NodeFacts::from_node(&node);
    let pods = worker_pods(stores, &nmc, &name);
    let workers: Vec<WorkerPod> = pods
        .iter()
        .filter_map(|pod| match WorkerPod::from_pod(pod) {
            Ok(worker) => Some(worker),
            Err(err) => {
                tracing::warn!(%err, "nmc: a pod that is not a worker pod is ignored");
                None
            }
        })
        .collect();
    let decision = decide(&NmcInput::new(&facts, &nmc, &workers));
    tracing::debug!(node = %name, steps = ?decision.steps, create = decision.create.len(), delete = decision.delete.len(), pods = workers.len(), "nmc: decided");
    for problem in &decision.problems {
        tracing::warn!(node = %name, %problem, "nmc");
    }

    // What the finished pods say, for the failure record and the events.
    let now = ctx.clock.now();
    let mut failures = WorkerFailures::of(&nmc);
    let before = failures.clone();
    let mut finished = Vec::new();
    for deletion in &decision.delete {
        let Some(pod) = pod_of(&pods, deletion) else {
            continue;
        };
        // A pod already being deleted was read by an earlier pass.
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let action = workers
            .iter()
            .find(|w| w.name == deletion.name && w.module == deletion.module)
            .map(|w| w.action);
        match (deletion.reason, action) {
            (DeleteReason::Succeeded, Some(action)) => {
                failures.clear(&deletion.module);
                // A pod the cache shows again after its deletion changes no status.
                if decision.status.is_some() {
                    finished.push((deletion.module.clone(), action, None));
                }
            }
            (DeleteReason::Failed, Some(action)) => {
                if failures
                    .get(&deletion.module)
                    .is_some_and(|f| Some(f.pod_uid.as_str()) == pod.metadata.uid.as_deref())
                {
                    // Already recorded (the cache has not seen the pod's deletion yet).
                    continue;
                }
                let message = failure_message(pod);
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                failures.record(
                    &deletion.module,
                    action.as_str(),
                    &message,
                    &rfc3339(now),
                    uid,
                );
                finished.push((deletion.module.clone(), action, Some(message)));
            }
            _ => {}
        }
    }
    // Failures of modules that left the node entirely are forgotten.
    let present: BTreeSet<ModuleKey> = nmc
        .spec
        .modules
        .iter()
        .filter_map(|e| e.key().ok())
        .chain(
            decision
                .status
                .as_deref()
                .unwrap_or(
                    nmc.status
                        .as_ref()
                        .map(|s| s.modules.as_slice())
                        .unwrap_or_default(),
                )
                .iter()
                .filter_map(|e| e.key().ok()),
        )
        .collect();
    failures.retain(|key| present.contains(key));

    // 1. The status, and the failures, before any pod is deleted.
    if let Some(status) = &decision.status {
        let patch = json!({"status": {"modules": status}});
        let written = patch_nmc(&ctx.client, &name, Some("status"), &patch).await?;
        data.wrote(&name, &written);
    }
    let mut nmc_metadata = Map::new();
    if failures != before {
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

    // 2. Deletions, but of pods not already going.
    let mut recheck = false;
    for deletion in &decision.delete {
        let Some(pod) = pod_of(&pods, deletion) else {
            continue;
        };
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        // The uid precondition: a pod of the same name created since is not this one.
        let params = DeleteParams {
            preconditions: pod
                .metadata
                .uid
                .clone()
                .map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
            ..DeleteParams::default()
        };
        match delete_pod(&ctx.client, &deletion.namespace, &deletion.name, &params).await {
            Ok(_) => data.expectations.deleted(&name, pod, Instant::now()),
            // Gone already.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            // Replaced by a pod of the same name, whose events bring the NMC back; or a
            // conflict that deleted nothing, which only a look again finds.
            Err(kube::Error::Api(status)) if status.code == 409 => recheck = true,
            Err(err) => return Err(err.into()),
        }
    }

    // 3. Creations, unless a failed module is still backing off.
    let mut wait: Option<Duration> = None;
    for plan in &decision.create {
        let left = failures.wait(&plan.module, now);
        if !left.is_zero() {
            wait = Some(wait.map_or(left, |w| w.min(left)));
            continue;
        }
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

    // 4. Labels.
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

    events(ctx, stores, &node, &finished).await;
    if recheck {
        wait = Some(wait.map_or(RETRY, |w| w.min(RETRY)));
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
    Ok(Pod {
        metadata: ObjectMeta {
            name: written.metadata.name,
            namespace: written.metadata.namespace,
            uid: written.metadata.uid,
            ..ObjectMeta::default()
        },
        ..Pod::default()
    })
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

/// Events for what the finished worker pods did: on the Node (`ModuleLoaded`,
/// `ModuleUnloaded`, as upstream) and, for a failure, a Warning on the Module too.
async fn events(
    ctx: &Context,
    stores: &Stores,
    node: &Node,
    finished: &[(ModuleKey, WorkerAction, Option<String>)],
) {
    let node_ref = node.object_ref(&());
    let node_name = node.name_any();
    for (module, action, failure) in finished {
        let module_ref = ObjectRef::<Module>::new(module.name()).within(module.namespace());
        let module_object = stores.modules.get(&module_ref);
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
        match failure {
            None => {
                let (reason, verb) = match action {
                    WorkerAction::Load => ("ModuleLoaded", "loaded into"),
                    WorkerAction::Unload => ("ModuleUnloaded", "unloaded from"),
                };
                tracing::info!(node = %node_name, module = %module, "{}", reason);
                ctx.event(
                    &node_ref,
                    Some(related),
                    false,
                    reason,
                    action.as_str(),
                    format!("Module {module} {verb} the kernel"),
                )
                .await;
            }
            Some(message) => {
                tracing::warn!(node = %node_name, module = %module, action = action.as_str(), %message, "worker failed; retrying with backoff");
                let note = format!(
                    "{} of Module {module} failed on node {node_name}: {message}",
                    action.as_str()
                );
                ctx.event(
                    &node_ref,
                    Some(related),
                    true,
                    "WorkerFailed",
                    action.as_str(),
                    note.clone(),
                )
                .await;
                if let Some(object) = &module_object {
                    ctx.event(
                        &object.object_ref(&()),
                        Some(node_ref.clone()),
                        true,
                        "WorkerFailed",
                        action.as_str(),
                        note,
                    )
                    .await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };

    #[test]
    fn failure_messages_come_from_the_container_then_the_pod() {
        let terminated = |message: Option<&str>| Pod {
            status: Some(PodStatus {
                message: Some("pod-level".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "worker".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 1,
                            message: message.map(str::to_string),
                            reason: Some("Error".into()),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        assert_eq!(
            failure_message(&terminated(Some("pulling image x: manifest unknown\nmore"))),
            "pulling image x: manifest unknown"
        );
        assert_eq!(failure_message(&terminated(None)), "Error");
        assert_eq!(
            failure_message(&Pod::default()),
            "the worker failed without a reason"
        );
    }

    #[test]
    fn label_patches_set_and_remove() {
        let changes = LabelChanges {
            set: [("a".to_string(), "1".to_string())].into(),
            remove: ["b".to_string()].into(),
        };
        assert_eq!(label_patch(&changes), json!({"a": "1", "b": null}));
    }
}
