//! The DRA controller's reconciler: per Module, reads its DaemonSets, DeviceClasses, DRA
//! pods and the nodes from the shared caches ([`Caches`]), calls [`decide`],
//! [`ready_labels`] and [`status_step`], and writes what they return, with the Events the
//! decision names:
//!
//! 1. the wanted DaemonSet, by server-side apply (field manager [`managers::DRA`],
//!    forced), only when it differs from the live one; the DaemonSets to delete, each with
//!    its uid and resourceVersion as preconditions;
//! 2. the wanted DeviceClasses, by server-side apply, and those to delete, the same way;
//!    nothing when the cluster does not serve `resource.k8s.io/v1` DeviceClasses (an Event
//!    says so on a Module that lists some);
//! 3. the dra-ready label of each node whose DRA pod became ready or went, by a merge patch;
//! 4. `status.dra`, by a JSON merge patch of the status subresource, only when the counts
//!    changed.
//!
//! A Module is reconciled when it changes, when one of its DaemonSets, DRA pods or
//! DeviceClasses changes, when any node's labels change (the targeted count), and every ten
//! minutes. A steady state makes no write.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use thiserror::Error;

use super::{
    Action, ClassStep, Event, StatusStep, Step, class_owner, decide, ready_labels, status_step,
};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::module_daemon_sets::{follow_node_labels, write_status};
use crate::controllers::module_nmc::ModuleFacts;
use crate::controllers::node::NodeFacts;
use crate::controllers::runner::{self, Runner};
use capstan_api::labels::MODULE_NAME_LABEL;
use capstan_api::managers;
use capstan_api::module::Module;

/// How often a Module is reconciled without any change.
const RESYNC: Duration = Duration::from_secs(600);
/// Wait before reconciling again after a delete precondition failed: the object changed
/// and its watch event is on its way.
const AFTER_CONFLICT: Duration = Duration::from_secs(1);
/// The `action` of the controller's Events.
const EVENT_ACTION: &str = "DRA";

/// A failed write; the Module is reconciled again with backoff.
#[derive(Debug, Error)]
pub enum ReconcileError {
    /// A server-side apply failed.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        /// `DaemonSet` or `DeviceClass`.
        kind: &'static str,
        /// `namespace/name` of a DaemonSet, the name of a DeviceClass.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A delete failed.
    #[error("deleting {kind} {name}: {source}")]
    Delete {
        /// `DaemonSet` or `DeviceClass`.
        kind: &'static str,
        /// `namespace/name` of a DaemonSet, the name of a DeviceClass.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Setting or removing a node's dra-ready label failed.
    #[error("labelling node {node}: {source}")]
    Label {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing `status.dra` failed.
    #[error("writing status.dra of Module {module}: {source}")]
    Status {
        /// `namespace/name` of the Module.
        module: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What the reconciles share: the controllers' context and the caches.
struct State {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    daemon_sets: Store<DaemonSet>,
    pods: Store<Pod>,
    classes: Store<DeviceClass>,
    classes_served: Arc<AtomicBool>,
}

/// Runs the DRA controller until `ctx.shutdown` is cancelled; reconciles in flight finish
/// first. Subscribes to `caches`; the caller starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (modules, modules_ready) = caches.modules.reader();
    let (daemon_sets, daemon_sets_ready) = caches.dra_daemon_sets.reader();
    let (pods, pods_ready) = caches.dra_pods.reader();
    let (classes, classes_ready) = caches.device_classes.reader();
    let module_changes = caches.modules.subscribe();
    let daemon_set_changes = caches.dra_daemon_sets.subscribe();
    let pod_changes = caches.dra_pods.subscribe();
    let class_changes = caches.device_classes.subscribe();
    let node_changes = caches.nodes.subscribe();
    let (labels_changed, on_labels_changed) = mpsc::unbounded();
    let state = Arc::new(State {
        ctx: ctx.clone(),
        nodes: nodes.clone(),
        daemon_sets,
        pods,
        classes,
        classes_served: caches.device_classes.served(),
    });
    let served = state.classes_served.clone();
    let unserved_said = {
        let ctx = ctx.clone();
        let ready = [classes_ready.clone()];
        async move {
            if runner::listed(&ctx, ready).await && !served.load(Ordering::Relaxed) {
                tracing::info!(
                    "the cluster serves no resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 \
                     and later do): DRA drivers run, their DeviceClasses are not managed"
                );
            }
        }
    };
    let controller = Controller::for_shared_stream(module_changes, modules)
        .owns_shared_stream(daemon_set_changes)
        .watches_shared_stream(pod_changes, |pod: Arc<Pod>| module_of(pod.as_ref()))
        .watches_shared_stream(class_changes, |class: Arc<DeviceClass>| {
            class_owner(&class).map(|(namespace, name)| ObjectRef::new(name).within(namespace))
        })
        .reconcile_all_on(on_labels_changed);
    // Decisions on half-filled caches would delete and recount wrongly.
    let controller = Runner::new("dra", &ctx)
        .reads(nodes_ready)
        .reads(modules_ready)
        .reads(daemon_sets_ready)
        .reads(pods_ready)
        .reads(classes_ready)
        .run(controller, reconcile, state);
    async move {
        tokio::join!(
            follow_node_labels(node_changes, nodes, labels_changed, &ctx),
            controller,
            unserved_said,
        );
    }
}

/// The Module a DRA pod belongs to: its namespace and `module.name` label.
fn module_of(pod: &Pod) -> Option<ObjectRef<Module>> {
    let name = pod.labels().get(MODULE_NAME_LABEL)?;
    Some(ObjectRef::new(name).within(&pod.namespace()?))
}

async fn reconcile(module: Arc<Module>, state: Arc<State>) -> Result<Requeue, ReconcileError> {
    reconcile_module(&module, &state).await
}

async fn reconcile_module(module: &Module, state: &State) -> Result<Requeue, ReconcileError> {
    let ctx = &state.ctx;
    let reference = module.object_ref(&());
    let facts = match ModuleFacts::from_module(module) {
        Ok(facts) => facts,
        Err(err) => {
            ctx.event(
                &reference,
                None,
                true,
                "InvalidModule",
                EVENT_ACTION,
                err.to_string(),
            )
            .await;
            return Ok(Requeue::await_change());
        }
    };
    let namespace = facts.key.namespace().to_string();
    let cached: Vec<Arc<DaemonSet>> = state
        .daemon_sets
        .state()
        .into_iter()
        .filter(|ds| ds.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .collect();
    let existing: Vec<&DaemonSet> = cached.iter().map(Arc::as_ref).collect();
    let served = state.classes_served.load(Ordering::Relaxed);
    let cached_classes = state.classes.state();
    let classes: Vec<&DeviceClass> = cached_classes.iter().map(Arc::as_ref).collect();
    let decision = match decide(&facts, &existing, served.then_some(classes.as_slice())) {
        Ok(decision) => decision,
        Err(err) => {
            ctx.event(
                &reference,
                None,
                true,
                "DraInvalid",
                EVENT_ACTION,
                err.to_string(),
            )
            .await;
            return Ok(Requeue::await_change());
        }
    };
    let nodes: Vec<NodeFacts> = state
        .nodes
        .state()
        .iter()
        .map(|node| NodeFacts::from_node(node))
        .collect();
    let pods = state.pods.state();
    let pods: Vec<&Pod> = pods.iter().map(Arc::as_ref).collect();
    let labels = ready_labels(&facts.key, Some(&facts), &nodes, &pods);
    let current = module
        .status
        .as_ref()
        .map(|status| status.dra.clone())
        .unwrap_or_default();
    let status = status_step(&facts, &current, &nodes, &existing);

    if let Some(event) = &decision.unsupported_classes {
        say(ctx, &reference, event).await;
    }
    let daemon_sets: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &namespace);
    for step in &decision.daemon_sets {
        if !write_daemon_set(&daemon_sets, &namespace, step).await? {
            return Ok(Requeue::requeue(AFTER_CONFLICT));
        }
        if let Some(event) = step.event() {
            say(ctx, &reference, &event).await;
        }
    }
    let device_classes: Api<DeviceClass> = Api::all(ctx.client.clone());
    for step in &decision.device_classes {
        if !write_device_class(&device_classes, step).await? {
            return Ok(Requeue::requeue(AFTER_CONFLICT));
        }
        if let Some(event) = step.event() {
            say(ctx, &reference, &event).await;
        }
    }
    write_ready_labels(ctx, &facts.key.dra_ready_label(), labels).await?;
    let counts = match status {
        StatusStep::ModuleDeleted => return Ok(Requeue::await_change()),
        StatusStep::Unchanged => return Ok(Requeue::requeue(RESYNC)),
        StatusStep::Write(counts) => counts,
    };
    write_status(&ctx.client, &facts.key, "dra", managers::DRA, &counts)
        .await
        .map_err(|source| ReconcileError::Status {
            module: facts.key.to_string(),
            source,
        })?;
    Ok(Requeue::requeue(RESYNC))
}

/// Records `event` on the Module.
async fn say(ctx: &Context, module: &ObjectReference, event: &Event) {
    ctx.event(
        module,
        None,
        event.warning,
        event.reason,
        EVENT_ACTION,
        event.note.clone(),
    )
    .await;
}

/// Makes one DaemonSet step's write. Returns false when a delete precondition failed.
async fn write_daemon_set(
    api: &Api<DaemonSet>,
    namespace: &str,
    step: &Step,
) -> Result<bool, ReconcileError> {
    let written = write(api, "DaemonSet", &step.daemon_set, &step.action).await;
    let written = written.map_err(|err| err.named(format!("{namespace}/{}", step.daemon_set)))?;
    if written && !matches!(step.action, Action::Unchanged) {
        tracing::info!(%namespace, daemon_set = %step.daemon_set, why = ?step.why, "wrote DRA DaemonSet");
    }
    Ok(written)
}

/// Makes one DeviceClass step's write. Returns false when a delete precondition failed.
async fn write_device_class(
    api: &Api<DeviceClass>,
    step: &ClassStep,
) -> Result<bool, ReconcileError> {
    let written = write(api, "DeviceClass", &step.device_class, &step.action).await;
    let written = written.map_err(|err| err.named(step.device_class.clone()))?;
    if written && !matches!(step.action, Action::Unchanged) {
        tracing::info!(device_class = %step.device_class, why = ?step.why, "wrote DeviceClass");
    }
    Ok(written)
}

/// Applies or deletes one object; a delete of an object already gone succeeds, one whose
/// precondition failed returns false.
async fn write<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    action: &Action<K>,
) -> Result<bool, ReconcileError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    match action {
        Action::Unchanged => {}
        Action::Apply(object) => {
            let params = PatchParams::apply(managers::DRA).force();
            api.patch(name, &params, &Patch::Apply(object.as_ref()))
                .await
                .map_err(|source| ReconcileError::Apply {
                    kind,
                    name: name.to_string(),
                    source,
                })?;
        }
        Action::Delete {
            uid,
            resource_version,
        } => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: uid.clone(),
                    resource_version: resource_version.clone(),
                }),
                ..DeleteParams::background()
            };
            match api.delete(name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(false),
                Err(source) => {
                    return Err(ReconcileError::Delete {
                        kind,
                        name: name.to_string(),
                        source,
                    });
                }
            }
        }
    }
    Ok(true)
}

impl ReconcileError {
    /// The same error naming the object as `name`.
    fn named(self, name: String) -> ReconcileError {
        match self {
            ReconcileError::Apply { kind, source, .. } => {
                ReconcileError::Apply { kind, name, source }
            }
            ReconcileError::Delete { kind, source, .. } => {
                ReconcileError::Delete { kind, name, source }
            }
            other => other,
        }
    }
}

/// Sets (`true`) or removes (`false`) `label` on each node.
async fn write_ready_labels(
    ctx: &Context,
    label: &str,
    changes: Vec<(String, bool)>,
) -> Result<(), ReconcileError> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let params = PatchParams {
        field_manager: Some(managers::DRA.to_string()),
        ..PatchParams::default()
    };
    for (node, ready) in changes {
        let value = if ready { json!("") } else { json!(null) };
        let patch = json!({"metadata": {"labels": {label: value}}});
        match api.patch(&node, &params, &Patch::Merge(patch)).await {
            Ok(_) => tracing::info!(%node, %label, ready, "labelled node"),
            // A node that went has no label to keep.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => return Err(ReconcileError::Label { node, source }),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
