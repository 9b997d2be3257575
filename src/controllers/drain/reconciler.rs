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

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;
use serde_json::json;

use super::refusals::{PodKey, Refusals};
use super::{Decision, DrainState, DrainStep, PodFacts, decide, record, resumed, resumed_message};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::nodekeeper::evictable;
use crate::controllers::runner::Runner;
use crate::controllers::upgrade::Policies;
use crate::controllers::upgrade::drain::write_record;
use capstan_api::GitSync;
use capstan_api::labels::DRAIN_ANNOTATION;
use capstan_api::managers;

/// Next look while pods are being evicted or terminate.
const EVICTION_RECHECK: Duration = Duration::from_secs(2);
/// Next look after a PodDisruptionBudget refused an eviction.
const PDB_RETRY: Duration = super::refusals::RETRY_EVERY;

struct Shared {
    ctx: Arc<Context>,
    syncs: Store<GitSync>,
    /// When this controller started: a drain begun earlier resumes after a restart.
    started_at: jiff::Timestamp,
    /// The drains said resumed (node, cordon time), so that each is said once.
    resumed: Mutex<BTreeSet<(String, jiff::Timestamp)>>,
    /// What was said about refused evictions.
    refusals: Mutex<Refusals>,
}

impl Shared {
    /// Starts now, by `ctx`'s clock.
    fn new(ctx: Arc<Context>, syncs: Store<GitSync>) -> Shared {
        Shared {
            started_at: ctx.clock.now(),
            ctx,
            syncs,
            resumed: Mutex::default(),
            refusals: Mutex::default(),
        }
    }
}

/// Runs the drain controller until `ctx.shutdown`. Subscribes to `caches`; the caller
/// starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (syncs, syncs_ready) = caches.syncs.reader();
    let node_changes = caches.nodes.subscribe();
    let shared = Arc::new(Shared::new(ctx.clone(), syncs));
    Runner::new("drain", &ctx)
        .reads(nodes_ready)
        .reads(syncs_ready)
        .run(
            Controller::for_shared_stream(node_changes, nodes),
            reconcile,
            shared,
        )
}

async fn reconcile(cached: Arc<Node>, shared: Arc<Shared>) -> Result<Action, kube::Error> {
    let Some(cached_state) = DrainState::of(cached.annotations()) else {
        return Ok(Action::await_change());
    };
    say_if_resumed(&shared, &cached.name_any(), &cached_state);
    if cached_state.drained() {
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
    // Refusals of pods that left the drain, or of a drain that ended, are not said again.
    let left: Vec<PodKey> = match &decision {
        Decision::Evict(_) | Decision::WaitForTermination => facts
            .iter()
            .filter(|pod| pod.evictable)
            .map(|pod| PodKey {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            })
            .collect(),
        Decision::Nothing | Decision::Drained => Vec::new(),
    };
    lock(&shared.refusals).keep_only(&name, &left);
    match decision {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::WaitForTermination => Ok(Action::requeue(EVICTION_RECHECK)),
        Decision::Evict(pods) => {
            let commit = state
                .as_ref()
                .map(|state| Policies::of(shared.syncs.state()).commit_of(&name, &state.stamp()))
                .unwrap_or_default();
            let mut next = EVICTION_RECHECK;
            for (namespace, pod) in pods {
                let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
                let key = PodKey {
                    namespace: namespace.clone(),
                    name: pod.clone(),
                };
                let line = match api.evict(&pod, &EvictParams::default()).await {
                    Ok(_) => lock(&shared.refusals).evicted(&name, &key, shared.ctx.clock.now()),
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        next = PDB_RETRY;
                        let now = shared.ctx.clock.now();
                        lock(&shared.refusals).refused(&name, &key, &status.message, now)
                    }
                    Err(kube::Error::Api(status)) if status.code == 404 => None,
                    Err(err) => return Err(err),
                };
                if let Some(line) = line {
                    tracing::info!(
                        node = %name,
                        commit = %commit.short_sha,
                        pull_request = %crate::history::pull_request(&commit),
                        "{line}"
                    );
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
            write_record(&shared.ctx, &node, &drained).await?;
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

/// Says once, in the log, that the drain (or the upgrade it is for) on `node` resumes after
/// a restart, when `state` was begun before this controller started.
fn say_if_resumed(shared: &Shared, node: &str, state: &DrainState) {
    let Some(resumed) = resumed(state, shared.started_at) else {
        return;
    };
    if !lock(&shared.resumed).insert((node.to_string(), state.cordoned_at)) {
        return;
    }
    let policies = Policies::of(shared.syncs.state());
    let commit = policies.commit_of(node, &state.stamp());
    let message = resumed_message(&policies, node, state, resumed, shared.ctx.clock.now());
    tracing::info!(
        node = %node,
        commit = %commit.short_sha,
        pull_request = %crate::history::pull_request(&commit),
        "{message}"
    );
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
