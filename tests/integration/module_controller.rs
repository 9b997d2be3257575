//! One KMM controller on the embedded cluster, around the Module `kmm-demo/my-kmod`: what
//! the device-plugin and DRA driver tests share. Only the controller under test runs; the
//! ready and version labels the other controllers would set are set by hand.

use crate::common;

use capstan::controllers::Context;
use capstan_api::labels::ModuleKey;
use capstan_api::module::{Module, ModuleStatus};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The Module's namespace.
pub const NAMESPACE: &str = "kmm-demo";
/// The Module's name.
pub const MODULE: &str = "my-kmod";

/// The controllers of a selection (`--controllers`), running until the test stops them.
pub struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Starts the controllers `selection` names.
    pub fn start(client: &kube::Client, selection: &str) -> Running {
        let shutdown = CancellationToken::new();
        let ctx = Context::new(client.clone(), shutdown.clone());
        let selection = selection.parse().expect("selection");
        let task = tokio::spawn(async move {
            capstan::controllers::run(ctx, &selection).await;
        });
        Running { shutdown, task }
    }

    /// Stops them; they must end cleanly within the deadline.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(common::DEADLINE, self.task)
            .await
            .expect("the controller stops on shutdown")
            .expect("the controller task ends cleanly");
    }
}

pub fn key() -> ModuleKey {
    ModuleKey::new(NAMESPACE, MODULE).expect("key")
}

/// The embedded cluster with the Module's namespace.
pub async fn setup() -> (common::TestCluster, kube::Client) {
    let (cluster, client) = common::start_default_simulated().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create namespace");
    (cluster, client)
}

pub fn modules(client: &kube::Client) -> Api<Module> {
    Api::namespaced(client.clone(), NAMESPACE)
}

pub fn daemon_sets(client: &kube::Client) -> Api<DaemonSet> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// The field managers of `ds`.
pub fn field_managers(ds: &DaemonSet) -> Vec<String> {
    ds.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

/// The Module's status, while it exists.
pub async fn module_status(client: &kube::Client) -> Option<ModuleStatus> {
    modules(client)
        .get_opt(MODULE)
        .await
        .ok()
        .flatten()
        .and_then(|module| module.status)
}

/// Sets (`Some`) or removes (`None`) labels on a node.
pub async fn label_node(client: &kube::Client, node: &str, labels: &[(String, Option<&str>)]) {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(key, value)| (key.clone(), json!(value)))
        .collect();
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("label node");
}

/// Marks the module loaded on `node` (as the NMC controller would), with the version whose
/// device plugin and DRA driver may run there (as the version-label controller would).
pub async fn module_ready(client: &kube::Client, node: &str, version: Option<&str>) {
    let mut labels = vec![(key().ready_label(), Some(""))];
    if let Some(version) = version {
        labels.push((key().version_device_plugin_label(), Some(version)));
    }
    label_node(client, node, &labels).await;
}

/// The nodes running a ready pod of the Module's namespace that `selector` selects, sorted;
/// pods being deleted do not count.
pub async fn ready_pod_nodes(client: &kube::Client, selector: &str) -> Vec<String> {
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list pods");
    let mut nodes: Vec<String> = pods
        .items
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && common::is_ready(pod))
        .filter_map(|pod| pod.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    nodes
}

/// The nodes carrying `label`, sorted.
pub async fn labelled_nodes(client: &kube::Client, label: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(label))
        .await
        .expect("nodes")
        .items
        .into_iter()
        .filter_map(|node| node.metadata.name)
        .collect();
    nodes.sort();
    nodes
}
