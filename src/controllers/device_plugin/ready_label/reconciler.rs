//! The labeller's reconciler: per device-plugin pod, reads the pods and its node from the
//! shared caches, calls [`decide`](super::decide) and writes what it returns:
//!
//! 1. the node's device-plugin-ready label, by a JSON merge patch of that label alone
//!    (field manager [`managers::DEVICE_PLUGIN`]);
//! 2. then, for a deleting pod, its finalizer, by a JSON patch that tests the pod's uid and
//!    finalizers first, so that a pod replaced or changed meanwhile is decided on again.
//!
//! A pod is reconciled when it changes, and when its node's labels change in a way that
//! calls for a write (someone removed the label of a ready pod, or the label a concurrent
//! reconcile kept is still there although no pod serves it). It runs beside the
//! device-plugin DaemonSet controller, whose pods carry the finalizer.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use thiserror::Error;

use super::{LabelWrite, Labelling, PluginPod, decide};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::{self, Runner};
use capstan_api::labels::NODE_LABELER_FINALIZER;
use capstan_api::managers;

/// Wait before deciding again on a pod that changed under the finalizer patch: its watch
/// event is on its way.
const AFTER_CONFLICT: Duration = Duration::from_millis(200);

/// A failed write; the pod is reconciled again with backoff.
#[derive(Debug, Error)]
pub enum ReconcileError {
    /// Writing the device-plugin-ready label failed.
    #[error("writing label {label} of node {node}: {source}")]
    Label {
        /// The node.
        node: String,
        /// The label.
        label: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Removing the pod's finalizer failed.
    #[error(
        "removing finalizer kmm.node.kubernetes.io/node-labeler of pod {namespace}/{name}: {source}"
    )]
    Release {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

struct Shared {
    client: Client,
    nodes: Store<Node>,
    pods: Store<Pod>,
    /// The device-plugin pods of each node: a node's change, and each pod's decision, look
    /// at the few pods on one node, not at every device-plugin pod of the fleet.
    by_node: Mutex<HashMap<String, HashSet<ObjectRef<Pod>>>>,
}

impl Shared {
    /// Takes in `pod`'s change, the cache holding it as it is now (gone when deleted). A
    /// pod's node is set once, when it is bound.
    fn index(&self, pod: &Pod) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            return;
        };
        let reference = ObjectRef::from_obj(pod);
        let present = self.pods.get(&reference).is_some();
        let mut by_node = self.by_node.lock().unwrap_or_else(PoisonError::into_inner);
        if present {
            by_node.entry(node).or_default().insert(reference);
        } else if let Some(pods) = by_node.get_mut(&node) {
            pods.remove(&reference);
            if pods.is_empty() {
                by_node.remove(&node);
            }
        }
    }

    /// The device-plugin pods on `node`.
    fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        let by_node = self.by_node.lock().unwrap_or_else(PoisonError::into_inner);
        by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|reference| self.pods.get(reference))
            .collect()
    }

    /// The decision for `pod`, from the caches.
    fn labelling(&self, pod: &Pod) -> Labelling {
        let subject = PluginPod::from_pod(pod);
        let node = subject
            .node
            .as_deref()
            .and_then(|name| self.nodes.get(&ObjectRef::new(name)));
        let others: Vec<PluginPod> = match subject.node.as_deref() {
            Some(name) => self
                .pods_on(name)
                .iter()
                .map(|pod| PluginPod::from_pod(pod))
                .collect(),
            None => Vec::new(),
        };
        decide(&subject, node.as_ref().map(|node| node.labels()), &others)
    }
}

/// Runs the labeller until `ctx.shutdown` is cancelled. Subscribes to `caches`; the caller
/// starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (pods, pods_ready) = caches.device_plugin_pods.reader();
    let pod_changes = caches.device_plugin_pods.subscribe();
    let node_changes = caches.nodes.subscribe();
    let shared = Arc::new(Shared {
        client: ctx.client.clone(),
        nodes,
        pods: pods.clone(),
        by_node: Mutex::default(),
    });
    let pod_changes = {
        let shared = shared.clone();
        pod_changes.inspect(move |pod| shared.index(pod))
    };
    let controller =
        Controller::for_shared_stream(pod_changes, pods).watches_shared_stream(node_changes, {
            let shared = shared.clone();
            move |node: Arc<Node>| {
                shared
                    .pods_on(&node.name_any())
                    .into_iter()
                    .filter(|pod| shared.labelling(pod).label.is_some())
                    .map(|pod| ObjectRef::from_obj(pod.as_ref()))
                    .collect::<Vec<_>>()
            }
        });
    async move {
        // A pod decided on before the node list is in would see no node to label.
        if !runner::listed(&ctx, [nodes_ready.clone(), pods_ready.clone()]).await {
            return;
        }
        // The pods listed before the stream was read are indexed from the cache; a change
        // seen twice leaves the index as the cache is.
        for pod in shared.pods.state() {
            shared.index(&pod);
        }
        Runner::new("device-plugin/ready-label", &ctx)
            .reads(nodes_ready)
            .reads(pods_ready)
            .run(controller, reconcile, shared)
            .await;
    }
}

async fn reconcile(pod: Arc<Pod>, shared: Arc<Shared>) -> Result<Action, ReconcileError> {
    reconcile_pod(&pod, &shared).await
}

async fn reconcile_pod(pod: &Pod, shared: &Shared) -> Result<Action, ReconcileError> {
    let labelling = shared.labelling(pod);
    if let Some(write) = &labelling.label {
        write_label(&shared.client, write).await?;
    }
    if labelling.release && !release(&shared.client, pod).await? {
        return Ok(Action::requeue(AFTER_CONFLICT));
    }
    Ok(Action::await_change())
}

/// Sets or removes one label of a node; a node already gone needs no removal, nor a label.
async fn write_label(client: &Client, write: &LabelWrite) -> Result<(), ReconcileError> {
    let (node, label, value) = match write {
        LabelWrite::Set { node, label } => (node, label, json!("")),
        LabelWrite::Remove { node, label } => (node, label, Value::Null),
    };
    let params = PatchParams {
        field_manager: Some(managers::DEVICE_PLUGIN.to_string()),
        ..PatchParams::default()
    };
    let patch = json!({"metadata": {"labels": {label.as_str(): value}}});
    match Api::<Node>::all(client.clone())
        .patch(node, &params, &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            tracing::info!(%node, %label, ?write, "device-plugin-ready label written");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Label {
            node: node.clone(),
            label: label.clone(),
            source,
        }),
    }
}

/// Removes [`NODE_LABELER_FINALIZER`] from `pod`, provided the pod and its finalizers are
/// still those decided on. False when they are not: the pod is to be decided on again.
async fn release(client: &Client, pod: &Pod) -> Result<bool, ReconcileError> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let params = PatchParams {
        field_manager: Some(managers::DEVICE_PLUGIN.to_string()),
        ..PatchParams::default()
    };
    let patch = release_patch(pod);
    match Api::<Pod>::namespaced(client.clone(), &namespace)
        .patch(&name, &params, &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => {
            tracing::debug!(%namespace, pod = %name, "released device-plugin pod");
            Ok(true)
        }
        // Gone already.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
        // Another pod of that name, or its finalizers changed: a test failed.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => Ok(false),
        Err(source) => Err(ReconcileError::Release {
            namespace,
            name,
            source,
        }),
    }
}

/// A JSON patch that removes [`NODE_LABELER_FINALIZER`] from `pod`'s finalizers, after
/// testing its uid and its finalizers as read.
fn release_patch(pod: &Pod) -> json_patch::Patch {
    let finalizers = pod.finalizers();
    let kept: Vec<&String> = finalizers
        .iter()
        .filter(|f| *f != NODE_LABELER_FINALIZER)
        .collect();
    let mut operations = Vec::new();
    if let Some(uid) = &pod.metadata.uid {
        operations.push(json_patch::PatchOperation::Test(
            json_patch::TestOperation {
                path: PointerBuf::from_tokens(["metadata", "uid"]),
                value: json!(uid),
            },
        ));
    }
    operations.push(json_patch::PatchOperation::Test(
        json_patch::TestOperation {
            path: PointerBuf::from_tokens(["metadata", "finalizers"]),
            value: json!(finalizers),
        },
    ));
    operations.push(json_patch::PatchOperation::Replace(
        json_patch::ReplaceOperation {
            path: PointerBuf::from_tokens(["metadata", "finalizers"]),
            value: json!(kept),
        },
    ));
    json_patch::Patch(operations)
}

#[cfg(test)]
mod tests;
