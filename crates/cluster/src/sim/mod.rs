//! The simulated parts of the embedded cluster: nodes (kernel, boot ID, readiness, loaded
//! kernel modules), the kubelet that runs pods on them, and the kube-controller-manager
//! controllers that create pods (DaemonSet, StatefulSet), schedule them and keep node
//! taints and disruption budgets up to date.

pub mod background_workloads;
pub mod config;
pub mod daemonset;
pub mod kubelet;
pub mod lifecycle;
pub mod nodes;
pub mod placement;
pub mod scheduler;
pub mod statefulset;
mod workload_controller;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::api::{Api, DeleteOptions, PatchType, Read, WriteOptions};
use crate::errors::ApiError;
use crate::object_key::ObjectKey;
use crate::pointer::{self, Pointer};
use capstan_api::labels;
use capstan_worker::simulated::ModuleTable;
use config::ClusterConfig;
use nodes::{KERNELS, KUBELET, NodeState};
use workload_controller::Settled;

/// A change to a node's module table, as the simulation saw it happen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleEvent {
    pub at: Timestamp,
    pub node: String,
    /// `load`, `unload` or `reboot` (everything unloaded).
    pub action: String,
    /// The module table after the change.
    pub modules: ModuleTable,
}

/// Why a simulation operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("no simulated node {0:?}")]
    NoSuchNode(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

/// The simulated nodes and control-plane controllers of one embedded cluster.
pub struct Simulation {
    pub(crate) api: Arc<Api>,
    pub(crate) config: ClusterConfig,
    node_order: Mutex<NodeOrder>,
    history: Mutex<VecDeque<ModuleEvent>>,
}

/// How many module-table changes the history keeps, the latest: each holds the node's
/// whole table, and a fleet rollout makes one per worker pod.
const MODULE_HISTORY: usize = 20_000;

/// The simulated nodes in configuration order, with each one's position: the kubelet asks
/// for a node's position or membership on every pod it acts on.
#[derive(Default)]
pub(crate) struct NodeOrder {
    names: Vec<String>,
    positions: HashMap<String, usize>,
}

impl NodeOrder {
    pub(crate) fn new(names: Vec<String>) -> NodeOrder {
        let positions = names
            .iter()
            .enumerate()
            .map(|(i, name)| (name.clone(), i))
            .collect();
        NodeOrder { names, positions }
    }

    fn remove(&mut self, name: &str) {
        let mut names = std::mem::take(&mut self.names);
        names.retain(|n| n != name);
        *self = NodeOrder::new(names);
    }
}

/// How many times a read-modify-write of a node is retried on conflicts.
const NODE_WRITE_ATTEMPTS: usize = 20;

impl Simulation {
    /// Registers the configured nodes (keeping those a state dir brought back), creates
    /// the workloads, and starts the kubelet and the controllers.
    pub fn start(
        api: Arc<Api>,
        config: ClusterConfig,
    ) -> Result<(Arc<Self>, Vec<JoinHandle<()>>), ApiError> {
        let sim = Arc::new(Simulation {
            api,
            node_order: Mutex::new(NodeOrder::new(
                config.nodes.iter().map(|n| n.name.clone()).collect(),
            )),
            config,
            history: Mutex::new(VecDeque::new()),
        });
        sim.register_nodes()?;
        background_workloads::create(&sim)?;
        let tasks = vec![
            tokio::spawn(kubelet::run(sim.clone())),
            tokio::spawn(scheduler::run(sim.api.clone())),
            tokio::spawn(lifecycle::run(sim.clone())),
            tokio::spawn(daemonset::run(sim.api.clone(), Settled::default())),
            tokio::spawn(statefulset::run(sim.api.clone(), Settled::default())),
        ];
        Ok((sim, tasks))
    }

    fn register_nodes(&self) -> Result<(), ApiError> {
        let nodes = self.resource("nodes")?;
        let leases = self.api.registry.get("coordination.k8s.io", "v1", "leases");
        let now = self.api.clock.now();
        let options = kubelet_writes();
        let kernels = self.resource(KERNELS)?;
        for (index, node) in self.config.nodes.iter().enumerate() {
            let existing = self.node_object(&node.name);
            if self.kernel_object(&node.name).is_none() {
                let modules = nodes::boot_modules(node, existing.as_ref());
                self.api.create(
                    &kernels,
                    "",
                    nodes::kernel_object(&node.name, &modules),
                    &options,
                )?;
            }
            if existing.is_none() {
                self.api
                    .create(&nodes, "", nodes::registration(node, index, now), &options)?;
            }
            if let Some(leases) = &leases
                && self.api.get(leases, "kube-node-lease", &node.name).is_err()
            {
                let lease = json!({"metadata": {"name": node.name, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": node.name, "leaseDurationSeconds": 40, "renewTime": capstan_api::clock::rfc3339_micros(now)}});
                self.api
                    .create(leases, "kube-node-lease", lease, &options)?;
            }
        }
        Ok(())
    }

    fn resource(&self, plural: &str) -> Result<Arc<crate::resources::Resource>, ApiError> {
        let (group, version) = match plural {
            "leases" => ("coordination.k8s.io", "v1"),
            "poddisruptionbudgets" => ("policy", "v1"),
            "statefulsets" | "daemonsets" => ("apps", "v1"),
            KERNELS => (nodes::KERNEL_GROUP, nodes::KERNEL_VERSION),
            _ => ("", "v1"),
        };
        self.api
            .registry
            .get(group, version, plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))
    }

    /// Whether the simulated kubelet runs this node.
    pub fn manages(&self, node: &str) -> bool {
        self.node_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .positions
            .contains_key(node)
    }

    /// The simulated nodes, in configuration order.
    pub fn node_names(&self) -> Vec<String> {
        self.node_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .names
            .clone()
    }

    /// The position of a node, which picks its addresses.
    pub(crate) fn node_index(&self, node: &str) -> usize {
        self.node_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .positions
            .get(node)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn node_object(&self, node: &str) -> Option<Value> {
        self.api
            .store
            .get(&ObjectKey::new("nodes", "", node))
            .map(|o| o.value())
    }

    pub(crate) fn node_ip(&self, node: &Value) -> String {
        node.at("/status/addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str())
            .unwrap_or("")
            .to_string()
    }

    fn kernel_object(&self, node: &str) -> Option<Value> {
        self.api
            .store
            .get(&ObjectKey::new(KERNELS, "", node))
            .map(|o| o.value())
    }

    /// The current state of a simulated node.
    pub fn node(&self, name: &str) -> Result<NodeState, SimError> {
        self.node_object(name)
            .and_then(|n| NodeState::of(&n, self.kernel_object(name).as_ref()))
            .ok_or_else(|| SimError::NoSuchNode(name.to_string()))
    }

    /// The changes to any node's module table so far (the last [`MODULE_HISTORY`]), oldest
    /// first.
    pub fn module_history(&self) -> Vec<ModuleEvent> {
        self.history
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Reads, changes and writes a node's status, retrying on conflicts. `change` gets the
    /// Node object and says what status to write (None: nothing).
    fn update_node_status(
        &self,
        name: &str,
        mut change: impl FnMut(&Value) -> Option<Value>,
    ) -> Result<(), SimError> {
        let nodes = self.resource("nodes")?;
        for _ in 0..NODE_WRITE_ATTEMPTS {
            let node = self
                .node_object(name)
                .filter(|node| NodeState::of(node, None).is_some())
                .ok_or_else(|| SimError::NoSuchNode(name.to_string()))?;
            let Some(status) = change(&node) else {
                return Ok(());
            };
            let rv = node
                .at("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null);
            let patch = json!({"metadata": {"resourceVersion": rv}, "status": status});
            let write = self.api.patch(
                &nodes,
                "",
                name,
                Some("status"),
                PatchType::Merge,
                patch,
                &kubelet_writes(),
            );
            match write {
                Ok(_) => return Ok(()),
                Err(err) if err.code == 409 => continue,
                Err(err) => return Err(err.into()),
            }
        }
        Err(gave_up(name))
    }

    /// Reads, changes and writes a node's module table (its NodeKernel), retrying on
    /// conflicts; returns `change`'s result and the table as written.
    fn update_modules<R>(
        &self,
        name: &str,
        mut change: impl FnMut(&mut ModuleTable) -> R,
    ) -> Result<(R, ModuleTable), SimError> {
        let kernels = self.resource(KERNELS)?;
        for _ in 0..NODE_WRITE_ATTEMPTS {
            let stored = self
                .api
                .store
                .get(&ObjectKey::new(KERNELS, "", name))
                .ok_or_else(|| SimError::NoSuchNode(name.to_string()))?;
            let kernel = stored.value();
            let before = nodes::loaded_modules(&kernel);
            let mut modules = before.clone();
            let result = change(&mut modules);
            if modules == before {
                return Ok((result, modules));
            }
            let mut object = nodes::kernel_object(name, &modules);
            object["metadata"]["resourceVersion"] = kernel["metadata"]["resourceVersion"].clone();
            // The update starts from this read, not from another parse of the same bytes.
            let read = Read {
                resource_version: stored.resource_version,
                object: kernel,
            };
            match self.api.update_answer(
                &kernels,
                "",
                name,
                None,
                object,
                &kubelet_writes(),
                Some(read),
            ) {
                Ok(_) => return Ok((result, modules)),
                Err(err) if err.code == 409 => continue,
                Err(err) => return Err(err.into()),
            }
        }
        Err(gave_up(name))
    }

    fn record(&self, node: &str, action: &str, modules: &ModuleTable) {
        let event = ModuleEvent {
            at: self.api.clock.now(),
            node: node.to_string(),
            action: action.to_string(),
            modules: modules.clone(),
        };
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        remember(&mut history, event, MODULE_HISTORY);
    }

    /// Reboots a node: a new boot ID, every module unloaded, Ready False for the reboot's
    /// duration and then True again. Returns when the node is Ready.
    pub async fn reboot(&self, name: &str) -> Result<(), SimError> {
        self.go_down(name, None)?;
        tokio::time::sleep(self.config.timing.reboot()).await;
        self.set_ready(name, true)
    }

    /// Installs another kernel and reboots into it.
    pub async fn upgrade_kernel(&self, name: &str, kernel: &str) -> Result<(), SimError> {
        self.go_down(name, Some(kernel))?;
        tokio::time::sleep(self.config.timing.reboot()).await;
        self.set_ready(name, true)
    }

    /// The node goes down: its kernel forgets every module, and it comes back NotReady with
    /// a new boot ID (on `kernel`, when given).
    fn go_down(&self, name: &str, kernel: Option<&str>) -> Result<(), SimError> {
        let now = self.api.clock.now();
        self.update_modules(name, |modules| *modules = ModuleTable::default())?;
        self.update_node_status(name, |node| {
            let running = node
                .at("/status/nodeInfo/kernelVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let kernel = kernel.unwrap_or(running);
            Some(json!({
                "conditions": nodes::conditions(false, "node is rebooting", now, now),
                "nodeInfo": nodes::node_info(kernel, &nodes::new_boot_id(), name),
            }))
        })?;
        self.record(name, "reboot", &ModuleTable::default());
        Ok(())
    }

    /// Makes a node Ready or NotReady (the kubelet stopped or resumed posting status).
    pub fn set_ready(&self, name: &str, ready: bool) -> Result<(), SimError> {
        let now = self.api.clock.now();
        self.update_node_status(name, |node| {
            if nodes::is_ready(node) == ready {
                return None;
            }
            let why = if ready {
                ""
            } else {
                "kubelet stopped posting node status"
            };
            Some(json!({"conditions": nodes::conditions(ready, why, now, now)}))
        })
    }

    /// Removes a node from the cluster; its pods are deleted with it.
    pub fn remove(&self, name: &str) -> Result<(), SimError> {
        let nodes = self.resource("nodes")?;
        self.api
            .delete(&nodes, "", name, &DeleteOptions::default())?;
        // The machine is gone, and its kernel with it.
        let kernels = self.resource(KERNELS)?;
        match self
            .api
            .delete(&kernels, "", name, &DeleteOptions::default())
        {
            Err(err) if err.code != 404 => return Err(err.into()),
            _ => {}
        }
        self.node_order
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        Ok(())
    }

    /// Runs kmod worker pods that finish together on `node`, each pod's real worker code
    /// in turn against the node's module table, which is read and written once for all of
    /// them (the workers of one NMC reconcile usually exit in the same turn of the
    /// kubelet). One result per pod, in order: Err is the one-line reason its worker would
    /// exit non-zero with.
    pub(crate) fn run_workers(&self, node: &str, pods: &[&Value]) -> Vec<Result<(), String>> {
        let jobs: Vec<Result<WorkerJob, String>> = pods
            .iter()
            .map(|pod| WorkerJob::of(pod, &self.config))
            .collect();
        let outcome = self.update_modules(node, |modules| {
            jobs.iter()
                .map(|job| {
                    let job = job.as_ref().map_err(Clone::clone)?;
                    job.run(modules)?;
                    // The table as this worker left it, for the node's history.
                    Ok(modules.clone())
                })
                .collect::<Vec<Result<ModuleTable, String>>>()
        });
        match outcome {
            Ok((results, _)) => results
                .into_iter()
                .zip(&jobs)
                .map(|(result, job)| {
                    let after = result?;
                    if let Ok(job) = job {
                        self.record(node, job.action(), &after);
                    }
                    Ok(())
                })
                .collect(),
            Err(err) => vec![Err(err.to_string()); pods.len()],
        }
    }
}

/// Adds `event` to `history`, dropping the oldest beyond `limit`.
fn remember(history: &mut VecDeque<ModuleEvent>, event: ModuleEvent, limit: usize) {
    history.push_back(event);
    while history.len() > limit {
        history.pop_front();
    }
}

/// A kmod worker pod's work, as its annotations and labels give it.
struct WorkerJob {
    config: capstan_api::nmc::ModuleConfig,
    version: Option<String>,
    load: bool,
}

impl WorkerJob {
    /// The pod's work; Err is the reason its worker exits before touching the node.
    fn of(pod: &Value, config: &ClusterConfig) -> Result<WorkerJob, String> {
        let annotation = |key: &str| pointer::annotation(pod, key);
        let label = |key: &str| pointer::label(pod, key);
        let config_text = annotation(labels::WORKER_CONFIG_ANNOTATION)
            .ok_or("the worker pod has no worker-config annotation")?;
        let worker = capstan_worker::config::parse_cached(config_text, labels::WORKER_CONFIG_PATH)
            .map_err(|e| e.to_string())?;
        if config.broken_images.contains(&worker.container_image) {
            return Err(format!(
                "pulling image {}: manifest unknown",
                worker.container_image
            ));
        }
        let load = match label(labels::WORKER_ACTION_LABEL).unwrap_or("") {
            "Load" => true,
            "Unload" => false,
            other => return Err(format!("unknown worker action {other:?}")),
        };
        Ok(WorkerJob {
            config: worker,
            version: annotation(labels::WORKER_MODULE_VERSION_ANNOTATION).map(str::to_string),
            load,
        })
    }

    /// Loads or unloads, as the worker binary does, on the node's module table.
    fn run(&self, modules: &mut ModuleTable) -> Result<(), String> {
        let mut kernel =
            capstan_worker::simulated::SimulatedKernel::new(modules, self.version.clone());
        let paths = capstan_worker::run::Paths::default();
        let result = if self.load {
            capstan_worker::run::load(&self.config, &mut kernel, &paths)
        } else {
            capstan_worker::run::unload(&self.config, &mut kernel, &paths)
        };
        result.map_err(|e| e.to_string())
    }

    fn action(&self) -> &'static str {
        if self.load { "load" } else { "unload" }
    }
}

/// The options of the simulated kubelet's writes.
fn kubelet_writes() -> WriteOptions {
    WriteOptions {
        field_manager: Some(KUBELET.into()),
        ..WriteOptions::default()
    }
}

fn gave_up(node: &str) -> SimError {
    ApiError::internal(format!(
        "node {node} kept changing; gave up after {NODE_WRITE_ATTEMPTS} attempts"
    ))
    .into()
}

impl Simulation {
    /// Every simulated node's module table, by node.
    pub fn module_tables(&self) -> BTreeMap<String, ModuleTable> {
        self.node_names()
            .into_iter()
            .filter_map(|n| self.node(&n).ok().map(|s| (n, s.modules)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_history_keeps_the_latest_changes() {
        let event = |node: &str| ModuleEvent {
            at: Timestamp::UNIX_EPOCH,
            node: node.to_string(),
            action: "load".to_string(),
            modules: ModuleTable::default(),
        };
        let mut history = VecDeque::new();
        for node in ["n1", "n2", "n3", "n4"] {
            remember(&mut history, event(node), 3);
        }
        let nodes: Vec<&str> = history.iter().map(|e| e.node.as_str()).collect();
        assert_eq!(nodes, ["n2", "n3", "n4"]);
    }
}
