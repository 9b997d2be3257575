//! The device-plugin controller's reconciler: per Module, reads its DaemonSets and the nodes
//! from the shared caches ([`Caches`]), calls [`decide`](super::decide) and
//! [`status_step`](super::status_step), and writes what they return, with the Event each
//! step is worth ([`Step::event`](super::Step::event)):
//!
//! 1. the wanted DaemonSet, by server-side apply (field manager
//!    [`managers::DEVICE_PLUGIN`], forced), only when it differs from the live one;
//! 2. the DaemonSets to delete, each with its uid and resourceVersion as preconditions, so
//!    one that changed since the decision (an old version that scheduled a pod again) stays;
//! 3. `status.devicePlugin`, by a JSON merge patch of the status subresource that touches
//!    nothing else, only when the counts changed.
//!
//! A Module is reconciled when it changes, when one of its DaemonSets changes (they carry a
//! controller owner reference to it), when any node's labels change (the targeted count),
//! and every ten minutes. A steady state makes no write.
//!
//! The device-plugin-ready labeller ([`super::ready_label`]) runs beside it: the DaemonSets'
//! pods carry its finalizer, which only it removes. So does the count of the Modules behind
//! upstream KMM's `kmm_*` gauges ([`KmmGauges`]), which upstream's device-plugin reconciler
//! sets: it is counted again from the Module cache whenever a Module changes or goes.

use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use thiserror::Error;

use super::{StatusStep, Step, StepAction, decide, status_step};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::metrics::KmmGauges;
use crate::controllers::module_daemon_sets::{follow_node_labels, write_status};
use crate::controllers::module_nmc::ModuleFacts;
use crate::controllers::node::NodeFacts;
use crate::controllers::runner::Runner;
use capstan_api::managers;
use capstan_api::module::Module;

/// How often a Module is reconciled without any change.
const RESYNC: Duration = Duration::from_secs(600);
/// Wait before reconciling again after a delete precondition failed: the DaemonSet changed
/// and its watch event is on its way.
const AFTER_CONFLICT: Duration = Duration::from_secs(1);

/// A failed write; the Module is reconciled again with backoff.
#[derive(Debug, Error)]
pub enum ReconcileError {
    /// Server-side apply of a DaemonSet failed.
    #[error("applying DaemonSet {namespace}/{name}: {source}")]
    Apply {
        /// Namespace of the DaemonSet.
        namespace: String,
        /// Name of the DaemonSet.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting a DaemonSet failed.
    #[error("deleting DaemonSet {namespace}/{name}: {source}")]
    Delete {
        /// Namespace of the DaemonSet.
        namespace: String,
        /// Name of the DaemonSet.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Writing `status.devicePlugin` failed.
    #[error("writing status.devicePlugin of Module {module}: {source}")]
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
}

/// Runs the device-plugin controller until `ctx.shutdown` is cancelled; reconciles in
/// flight finish first. Subscribes to `caches`; the caller starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (modules, modules_ready) = caches.modules.reader();
    let (daemon_sets, daemon_sets_ready) = caches.daemon_sets.reader();
    let module_changes = caches.modules.subscribe();
    let counted_changes = caches.modules.subscribe();
    let daemon_set_changes = caches.daemon_sets.subscribe();
    let node_changes = caches.nodes.subscribe();
    let (labels_changed, on_labels_changed) = mpsc::unbounded();
    let labeller = super::ready_label::reconciler::run(ctx.clone(), caches);
    let counted = modules.clone();
    let state = Arc::new(State {
        ctx: ctx.clone(),
        nodes: nodes.clone(),
        daemon_sets,
    });
    let controller = Controller::for_shared_stream(module_changes, modules)
        .owns_shared_stream(daemon_set_changes)
        .reconcile_all_on(on_labels_changed);
    // Decisions on half-filled caches would delete and recount wrongly.
    let controller = Runner::new("device-plugin", &ctx)
        .reads(nodes_ready)
        .reads(modules_ready)
        .reads(daemon_sets_ready)
        .run(controller, reconcile, state);
    async move {
        tokio::join!(
            follow_node_labels(node_changes, nodes, labels_changed, &ctx),
            count_modules(counted_changes, counted, &ctx),
            controller,
            labeller,
        );
    }
}

/// Sets the `kmm_*` gauges from the Modules in `modules` after each change the cache passes
/// on (it has applied the change to the store by then); stops on shutdown.
async fn count_modules(
    changes: impl Stream<Item = Arc<Module>>,
    modules: Store<Module>,
    ctx: &Context,
) {
    let mut changes = std::pin::pin!(changes.take_until(ctx.shutdown.cancelled()));
    while changes.next().await.is_some() {
        let cached = modules.state();
        ctx.metrics
            .kmm
            .set(&KmmGauges::of(cached.iter().map(Arc::as_ref)));
    }
}

async fn reconcile(module: Arc<Module>, state: Arc<State>) -> Result<Action, ReconcileError> {
    reconcile_module(&module, &state).await
}

async fn reconcile_module(module: &Module, state: &State) -> Result<Action, ReconcileError> {
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
                "DevicePlugin",
                err.to_string(),
            )
            .await;
            return Ok(Action::await_change());
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
    let steps = match decide(&facts, &existing) {
        Ok(steps) => steps,
        Err(err) => {
            ctx.event(
                &reference,
                None,
                true,
                "DevicePluginInvalid",
                "DevicePlugin",
                err.to_string(),
            )
            .await;
            return Ok(Action::await_change());
        }
    };
    let nodes: Vec<NodeFacts> = state
        .nodes
        .state()
        .iter()
        .map(|node| NodeFacts::from_node(node))
        .collect();
    let current = module
        .status
        .as_ref()
        .map(|status| status.device_plugin.clone())
        .unwrap_or_default();
    let status = status_step(&facts, &current, &nodes, &existing);

    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &namespace);
    for step in steps {
        if !write_step(&api, &namespace, &step).await? {
            return Ok(Action::requeue(AFTER_CONFLICT));
        }
        if let Some(event) = step.event() {
            ctx.event(
                &reference,
                None,
                false,
                event.reason,
                "DevicePlugin",
                event.note,
            )
            .await;
        }
    }
    let counts = match status {
        StatusStep::ModuleDeleted => return Ok(Action::await_change()),
        StatusStep::Unchanged => return Ok(Action::requeue(RESYNC)),
        StatusStep::Write(counts) => counts,
    };
    write_status(
        &ctx.client,
        &facts.key,
        "devicePlugin",
        managers::DEVICE_PLUGIN,
        &counts,
    )
    .await
    .map_err(|source| ReconcileError::Status {
        module: facts.key.to_string(),
        source,
    })?;
    Ok(Action::requeue(RESYNC))
}

/// Makes one step's write. Returns false when a delete precondition failed: the DaemonSet
/// changed since the decision, which is then to be made again.
async fn write_step(
    api: &Api<DaemonSet>,
    namespace: &str,
    step: &Step,
) -> Result<bool, ReconcileError> {
    let name = step.daemon_set.as_str();
    match &step.action {
        StepAction::Unchanged => {}
        StepAction::Apply(ds) => {
            let params = PatchParams::apply(managers::DEVICE_PLUGIN).force();
            api.patch(name, &params, &Patch::Apply(ds.as_ref()))
                .await
                .map_err(|source| ReconcileError::Apply {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    source,
                })?;
            tracing::info!(%namespace, daemon_set = %name, why = ?step.why, "applied device-plugin DaemonSet");
        }
        StepAction::Delete {
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
                Ok(_) => {
                    tracing::info!(%namespace, daemon_set = %name, why = ?step.why, "deleted device-plugin DaemonSet");
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 409 => return Ok(false),
                Err(source) => {
                    return Err(ReconcileError::Delete {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        source,
                    });
                }
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests;
