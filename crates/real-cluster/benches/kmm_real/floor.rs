//! The floor: only the API work that loading the Modules onto the fleet cannot avoid, done
//! as fast as the control plane takes it, so capstan's time to converge reads as a ratio to
//! the best the same machine allows.
//!
//! Per node, once the Modules exist: its NodeModulesConfig created with every Module's
//! entry; one worker pod per Module, capstan's own pod (`worker_pod::build`, the same
//! bytes through the API server and etcd), created at once; each deleted as soon as kwok
//! completes it; then one NodeModulesConfig status write listing every Module and one
//! node write adding every `.ready` label. No Module status, no Events, and no reads but
//! the Modules' list (until all exist), one list of the nodes and one watch of the worker
//! pods: a controller reads much more, and the floor knows what it is to do beforehand.
//!
//! Every node starts at once, and at most [`IN_FLIGHT`] requests are in flight (the
//! client's HTTP/2 connection multiplexes them), so the API server, etcd and kwok set the
//! pace.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use capstan::controllers::nmc::WorkerPodPlan;
use capstan::controllers::nmc::worker_pod::{self, DEFAULT_WORKER_IMAGE};
use capstan_api::module::{ModprobeSpec, Module};
use capstan_api::nmc::{
    ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfig, NodeModulesConfigSpec,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

/// Requests in flight at once.
const IN_FLIGHT: usize = 64;

/// The worker pods kwok completed, by node.
type Completions = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<String>>>>;

/// Loads the `modules` Modules of `namespace`, once they all exist, onto every worker node
/// with the floor's writes only; returns once every node is done.
pub async fn run(client: kube::Client, namespace: &str, modules: usize) -> anyhow::Result<()> {
    let module_api: Api<Module> = Api::namespaced(client.clone(), namespace);
    let modules = loop {
        let list = module_api.list(&ListParams::default()).await?;
        if list.items.len() >= modules {
            break list.items;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let nodes = nodes
        .list(&ListParams::default().labels("node-role.kubernetes.io/worker"))
        .await?
        .items;

    let completions: Completions = Arc::default();
    let mut receivers = HashMap::new();
    for node in &nodes {
        let (tx, rx) = mpsc::unbounded_channel();
        let name = node.metadata.name.clone().unwrap_or_default();
        completions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.clone(), tx);
        receivers.insert(name, rx);
    }
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    tokio::spawn(watch_completions(
        Api::namespaced(client.clone(), namespace),
        completions,
        listed_tx,
    ));
    listed.await?;

    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let done = receivers.remove(&name).expect("a channel per node");
        tasks.spawn(load_node(
            client.clone(),
            permits.clone(),
            node,
            modules.clone(),
            done,
        ));
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(())
}

/// Passes each worker pod that succeeded to its node's channel; says when the first list
/// is in, so that no completion comes before the watch.
async fn watch_completions(
    pods: Api<Pod>,
    completions: Completions,
    listed: tokio::sync::oneshot::Sender<()>,
) {
    let mut listed = Some(listed);
    let config = watcher::Config::default().labels("app.kubernetes.io/component=worker");
    let mut events = std::pin::pin!(watcher(pods, config));
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    let _ = listed.send(());
                }
                continue;
            }
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            _ => continue,
        };
        let succeeded = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded");
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if let (true, Some(node), Some(name)) = (succeeded, node, pod.metadata.name)
            && let Some(tx) = completions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&node)
        {
            let _ = tx.send(name);
        }
    }
}

/// `node`'s part: its NMC, its worker pods, each deleted once complete, then its NMC
/// status and its labels.
async fn load_node(
    client: kube::Client,
    permits: Arc<Semaphore>,
    node: Node,
    modules: Vec<Module>,
    mut done: mpsc::UnboundedReceiver<String>,
) -> anyhow::Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    let kernel = info.map(|i| i.kernel_version.clone()).unwrap_or_default();
    let boot_id = info.map(|i| i.boot_id.clone()).unwrap_or_default();
    let entries = modules
        .iter()
        .map(|module| entry(module, &kernel))
        .collect::<anyhow::Result<Vec<_>>>()?;

    let nmcs: Api<NodeModulesConfig> = Api::all(client.clone());
    let mut nmc = NodeModulesConfig::new(
        &name,
        NodeModulesConfigSpec {
            modules: entries.clone(),
        },
    );
    nmc = {
        let _permit = permits.acquire().await?;
        nmcs.create(&PostParams::default(), &nmc).await?
    };

    let keys = entries
        .iter()
        .map(NodeModuleSpec::key)
        .collect::<Result<Vec<_>, _>>()?;
    let mut creates = tokio::task::JoinSet::new();
    for (key, entry) in keys.iter().zip(&entries) {
        let plan = WorkerPodPlan::loader(&name, key, entry);
        let pod = worker_pod::build(&plan, &nmc, DEFAULT_WORKER_IMAGE);
        let pods: Api<Pod> = Api::namespaced(client.clone(), key.namespace());
        let permits = permits.clone();
        creates.spawn(async move {
            let _permit = permits.acquire().await?;
            pods.create(&PostParams::default(), &pod).await?;
            anyhow::Ok(())
        });
    }
    while let Some(result) = creates.join_next().await {
        result??;
    }

    // The worker pods not completed yet, by name, with their namespace.
    let mut left: BTreeMap<String, String> = keys
        .iter()
        .map(|key| (key.worker_pod_name(&name), key.namespace().to_string()))
        .collect();
    let mut deletes = tokio::task::JoinSet::new();
    while !left.is_empty() {
        let Some(pod) = done.recv().await else {
            anyhow::bail!("{name}: the pod watch ended");
        };
        let Some(namespace) = left.remove(&pod) else {
            continue;
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        let permits = permits.clone();
        deletes.spawn(async move {
            let _permit = permits.acquire().await?;
            pods.delete(&pod, &DeleteParams::default()).await?;
            anyhow::Ok(())
        });
    }
    while let Some(result) = deletes.join_next().await {
        result??;
    }

    let status: Vec<NodeModuleStatus> = entries
        .iter()
        .map(|e| NodeModuleStatus {
            name: e.name.clone(),
            namespace: e.namespace.clone(),
            service_account_name: e.service_account_name.clone(),
            image_repo_secret: e.image_repo_secret.clone(),
            tolerations: e.tolerations.clone(),
            version: e.version.clone(),
            config: e.config.clone(),
            boot_id: boot_id.clone(),
        })
        .collect();
    let labels: BTreeMap<String, &str> = keys.iter().map(|key| (key.ready_label(), "")).collect();
    let params = PatchParams::default();
    let _permit = permits.acquire().await?;
    nmcs.patch_status(
        &name,
        &params,
        &Patch::Merge(json!({"status": {"modules": status}})),
    )
    .await?;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .patch(
            &name,
            &params,
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await?;
    Ok(())
}

/// `module`'s NMC entry on a node running `kernel`: its first kernel mapping's image with
/// the kernel filled in, as capstan's Module controller writes it for the bench's Modules.
fn entry(module: &Module, kernel: &str) -> anyhow::Result<NodeModuleSpec> {
    let value = serde_json::to_value(module)?;
    let container = &value["spec"]["moduleLoader"]["container"];
    let image = container["kernelMappings"][0]["containerImage"]
        .as_str()
        .unwrap_or_default()
        .replace("${KERNEL_FULL_VERSION}", kernel);
    let modprobe: ModprobeSpec = serde_json::from_value(container["modprobe"].clone())?;
    Ok(NodeModuleSpec {
        name: module.metadata.name.clone().unwrap_or_default(),
        namespace: module.metadata.namespace.clone().unwrap_or_default(),
        service_account_name: String::new(),
        image_repo_secret: None,
        tolerations: Vec::new(),
        version: String::new(),
        config: ModuleConfig {
            kernel_version: kernel.to_string(),
            container_image: image,
            insecure_pull: false,
            modprobe,
            image_pull_policy: "IfNotPresent".into(),
            in_tree_modules_to_remove: Vec::new(),
            in_tree_module_to_remove: String::new(),
        },
    })
}

/// The floor's process: loads the Modules once, then waits to be killed.
pub async fn process(kubeconfig: &Path, agent: &'static str, namespace: &str, modules: usize) {
    let client = super::client(kubeconfig, agent).await;
    if let Err(error) = run(client, namespace, modules).await {
        eprintln!("floor: {error:#}");
        std::process::exit(1);
    }
    eprintln!("floor: every node loaded");
    std::future::pending::<()>().await;
}
