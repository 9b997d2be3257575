//! The drain controller's reconciler: one reconcile per Node that carries a drain state not
//! yet drained.
//!
//! A reconcile reads the node afresh and its pods from the API server (all namespaces,
//! `spec.nodeName`), calls [`decide`], and either evicts the pods the drain moves through
//! the Eviction API (a PodDisruptionBudget's refusal, 429, is retried as `kubectl drain`
//! retries it, and the nodekeeper forces what outlasts its timeouts), or records the node
//! drained (history record, then an Event when new) and marks the state drained with a
//! JSON merge patch conditional on the node's resourceVersion (field manager
//! `capstan-drain`). The version-label controller, woken by that node change, then runs the
//! kmod steps.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use serde_json::json;

use super::{Decision, DrainState, DrainStep, PodFacts, decide, record};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::nodekeeper::evictable;
use crate::controllers::version_labels::Policies;
use capstan_api::GitSync;
use capstan_api::labels::DRAIN_ANNOTATION;
use capstan_api::managers;

/// Next look while pods are being evicted or terminate.
const EVICTION_RECHECK: Duration = Duration::from_secs(2);
/// Next look after a PodDisruptionBudget refused an eviction (kubectl drain waits 5 s).
const PDB_RETRY: Duration = Duration::from_secs(5);
/// Next look after a failed reconcile.
const ERROR_RETRY: Duration = Duration::from_secs(5);

struct Shared {
    ctx: Arc<Context>,
    syncs: Store<GitSync>,
}

/// Runs the drain controller until `ctx.shutdown`. Subscribes to `caches`; the caller
/// starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, _) = caches.nodes.reader();
    let (syncs, _) = caches.syncs.reader();
    let node_changes = caches.nodes.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        syncs,
    });
    async move {
        let shutdown = ctx.shutdown.clone();
        Controller::for_shared_stream(node_changes, nodes)
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(reconcile, error_policy, shared)
            .for_each(|result| async move {
                if let Err(err) = result {
                    tracing::debug!(%err, "drain controller");
                }
            })
            .await;
    }
}

fn error_policy(_node: Arc<Node>, err: &kube::Error, _shared: Arc<Shared>) -> Action {
    tracing::warn!(%err, "drain reconcile failed");
    Action::requeue(ERROR_RETRY)
}

async fn reconcile(cached: Arc<Node>, shared: Arc<Shared>) -> Result<Action, kube::Error> {
    if DrainState::of(cached.annotations()).is_none_or(|state| state.drained()) {
        return Ok(Action::await_change());
    }
    let name = cached.name_any();
    let client = &shared.ctx.client;
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    let state = DrainState::of(node.annotations());
    let pods: Vec<Pod> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await?
        .items;
    let facts: Vec<PodFacts> = pods
        .iter()
        .map(|pod| PodFacts {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            evictable: evictable(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    let decision = decide(state.as_ref(), &facts);
    tracing::debug!(node = %name, ?decision, "drain decided");
    match decision {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::WaitForTermination => Ok(Action::requeue(EVICTION_RECHECK)),
        Decision::Evict(pods) => {
            let mut next = EVICTION_RECHECK;
            for (namespace, pod) in pods {
                let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                match api.evict(&pod, &EvictParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        tracing::info!(node = %name, %namespace, %pod,
                            "a PodDisruptionBudget holds the pod; retrying");
                        next = PDB_RETRY;
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(err) => return Err(err),
                }
            }
            Ok(Action::requeue(next))
        }
        Decision::Drained => {
            let Some(state) = state else {
                return Ok(Action::await_change());
            };
            let now = shared.ctx.clock.now();
            let policies = Policies::of(shared.syncs.state());
            let drained = record(&policies, &name, &state, DrainStep::Drained, now);
            crate::controllers::version_labels::reconciler::write_drain_record(
                &shared.ctx,
                &node,
                &drained,
            )
            .await?;
            let marked = DrainState {
                drained_at: Some(now),
                ..state
            };
            let patch = json!({"metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": {DRAIN_ANNOTATION: marked.to_annotation()},
            }});
            let params = PatchParams {
                field_manager: Some(managers::DRAIN.to_string()),
                ..PatchParams::default()
            };
            match nodes.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => Ok(Action::await_change()),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    Ok(Action::requeue(Duration::from_millis(200)))
                }
                Err(err) => Err(err),
            }
        }
    }
}

#[cfg(test)]
mod tests;
