//! Simulated nodes. A node's physical state lives in the API: kernel and boot ID in its
//! Node's `status.nodeInfo`, readiness in the Ready condition, and the loaded kernel modules
//! in a `NodeKernel` object of its own (`sim.capstan.dev/v1`, named after the node). So it
//! persists with the store, survives a restart of the cluster, and `kubectl get
//! nodekernels -o yaml` shows it.
//!
//! The module table is not kept on the Node: a real kubelet does not write its Node when a
//! module loads, and a Node write wakes every controller that watches Nodes.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Deserialize as _;
use serde_json::{Value, json};

use super::config::NodeConfig;
use crate::pointer::{self, Pointer};
use capstan_api::clock::rfc3339;
use capstan_worker::simulated::ModuleTable;

/// The API group and version of [`KERNEL_KIND`] objects.
pub const KERNEL_GROUP: &str = "sim.capstan.dev";
pub const KERNEL_VERSION: &str = "v1";
/// The kind holding a simulated node's loaded kernel modules, one object per node.
pub const KERNEL_KIND: &str = "NodeKernel";
/// Its resource (and storage bucket).
pub const KERNELS: &str = "nodekernels";
/// Where state from before `NodeKernel` objects kept a node's modules: a Node annotation,
/// read once when such a state dir is brought back.
pub const LEGACY_MODULES_ANNOTATION: &str = "sim.capstan.dev/kernel-modules";
/// The label marking nodes the simulated kubelet runs pods on.
pub const SIMULATED_LABEL: &str = "sim.capstan.dev/simulated";
/// The field manager of the simulated kubelet's writes.
pub const KUBELET: &str = "kubelet";
/// The version every simulated kubelet reports.
pub const KUBELET_VERSION: &str = "v1.36.3";

/// What the simulation knows about a node, read from its Node and NodeKernel objects.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeState {
    pub name: String,
    pub kernel: String,
    pub boot_id: String,
    pub ready: bool,
    pub modules: ModuleTable,
}

impl NodeState {
    /// Reads the simulated state of a Node object and its NodeKernel (none: no modules);
    /// None for nodes the simulation does not run.
    pub fn of(node: &Value, kernel: Option<&Value>) -> Option<NodeState> {
        let meta = node.get("metadata")?;
        pointer::label(node, SIMULATED_LABEL)?;
        let info = node.at("/status/nodeInfo");
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        Some(NodeState {
            name: text(meta.get("name")),
            kernel: text(info.and_then(|i| i.get("kernelVersion"))),
            boot_id: text(info.and_then(|i| i.get("bootID"))),
            ready: is_ready(node),
            modules: kernel.map(loaded_modules).unwrap_or_default(),
        })
    }
}

/// The module table a NodeKernel object holds (its `modules`).
pub fn loaded_modules(kernel: &Value) -> ModuleTable {
    kernel
        .get("modules")
        .and_then(|m| ModuleTable::deserialize(m).ok())
        .unwrap_or_default()
}

/// The NodeKernel object of node `name` holding `modules`.
pub fn kernel_object(name: &str, modules: &ModuleTable) -> Value {
    json!({
        "apiVersion": format!("{KERNEL_GROUP}/{KERNEL_VERSION}"), "kind": KERNEL_KIND,
        "metadata": {"name": name},
        "modules": modules,
    })
}

/// The modules a node registers with: those a state dir from before NodeKernel objects
/// recorded on its Node, else those its configuration boots with.
pub fn boot_modules(config: &NodeConfig, node: Option<&Value>) -> ModuleTable {
    node.and_then(|n| pointer::annotation(n, LEGACY_MODULES_ANNOTATION))
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_else(|| config.modules.clone())
}

/// Whether a Node's Ready condition is True.
pub fn is_ready(node: &Value) -> bool {
    node.at("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// A fresh boot ID.
pub fn new_boot_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The Node object a simulated node registers with, as a kubelet would.
pub fn registration(config: &NodeConfig, index: usize, now: Timestamp) -> Value {
    let role = if config.role == "control-plane" {
        "master"
    } else {
        config.role.as_str()
    };
    let mut labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", config.name.as_str()),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
        (SIMULATED_LABEL, "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    labels.insert(format!("node-role.kubernetes.io/{role}"), String::new());
    if role == "master" {
        labels.insert(
            "node-role.kubernetes.io/control-plane".into(),
            String::new(),
        );
    }
    labels.extend(config.labels.clone());
    let mut node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": config.name, "labels": labels},
        "spec": {"podCIDR": pod_cidr(index), "podCIDRs": [pod_cidr(index)]},
        "status": status(config, index, &new_boot_id(), !config.not_ready, now),
    });
    if !config.taints.is_empty() {
        node["spec"]["taints"] = json!(config.taints);
    }
    node
}

fn pod_cidr(index: usize) -> String {
    format!("10.{}.{}.0/24", 64 + index / 256, index % 256)
}

/// The address pods on node `index` get their IPs from.
pub fn pod_ip(index: usize, n: u32) -> String {
    format!("10.{}.{}.{}", 64 + index / 256, index % 256, 2 + n % 250)
}

fn status(config: &NodeConfig, index: usize, boot_id: &str, ready: bool, now: Timestamp) -> Value {
    json!({
        "conditions": conditions(ready, "", now, now),
        "nodeInfo": node_info(&config.kernel, boot_id, &config.name),
        "addresses": [
            {"type": "InternalIP", "address": format!("10.0.{}.{}", index / 250, 10 + index % 250)},
            {"type": "Hostname", "address": config.name},
        ],
        "capacity": config.allocatable,
        "allocatable": config.allocatable,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    })
}

/// `status.nodeInfo` for a kernel and boot.
pub fn node_info(kernel: &str, boot_id: &str, name: &str) -> Value {
    json!({
        "machineID": format!("{:032x}", fxhash(name)),
        "systemUUID": format!("{:032x}", fxhash(name) ^ 0x5eed),
        "bootID": boot_id,
        "kernelVersion": kernel,
        "osImage": "Fedora CoreOS 37",
        "containerRuntimeVersion": "cri-o://1.36.0",
        "kubeletVersion": KUBELET_VERSION,
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": "amd64",
    })
}

fn fxhash(s: &str) -> u128 {
    s.bytes().fold(0xcbf29ce484222325u128, |h, b| {
        (h ^ u128::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// The node conditions a kubelet reports; `why` explains a NotReady.
pub fn conditions(ready: bool, why: &str, transition: Timestamp, now: Timestamp) -> Value {
    let pressure = |kind: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": "False", "reason": reason, "message": message,
               "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(transition)})
    };
    let (status, reason, message) = if ready {
        (
            "True",
            "KubeletReady",
            "kubelet is posting ready status".to_string(),
        )
    } else {
        (
            "False",
            "KubeletNotReady",
            if why.is_empty() {
                "node is not ready".to_string()
            } else {
                why.to_string()
            },
        )
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        {"type": "Ready", "status": status, "reason": reason, "message": message,
         "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(transition)},
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::config::ClusterConfig;

    #[test]
    fn a_registered_node_reads_back_as_its_state() {
        let config = &ClusterConfig::default_cluster().nodes[1];
        let now: Timestamp = "2026-11-20T00:00:00Z".parse().expect("time");
        let node = registration(config, 1, now);
        let kernel = kernel_object(&config.name, &boot_modules(config, Some(&node)));
        let state = NodeState::of(&node, Some(&kernel)).expect("simulated");
        assert_eq!(state.name, "worker-1");
        assert_eq!(state.kernel, crate::sim::config::DEFAULT_KERNEL);
        assert!(state.ready && !state.boot_id.is_empty());
        assert_eq!(state.modules, config.modules);
        assert_eq!(
            node["metadata"]["labels"]["node-role.kubernetes.io/worker"],
            ""
        );
        let unmanaged = json!({"metadata": {"name": "x"}});
        assert!(NodeState::of(&unmanaged, None).is_none());
    }

    #[test]
    fn modules_a_node_annotation_recorded_are_brought_back() {
        let config = &ClusterConfig::default_cluster().nodes[1];
        let now: Timestamp = "2026-11-20T00:00:00Z".parse().expect("time");
        let mut node = registration(config, 1, now);
        assert_eq!(boot_modules(config, Some(&node)), config.modules);
        let table: ModuleTable =
            serde_json::from_value(json!({"my_kmod": {"name": "my_kmod", "version": "v2"}}))
                .expect("table");
        node["metadata"]["annotations"] = json!({
            LEGACY_MODULES_ANNOTATION: serde_json::to_string(&table).expect("text"),
        });
        assert_eq!(boot_modules(config, Some(&node)), table);
        let kernel = kernel_object("worker-1", &table);
        assert_eq!(loaded_modules(&kernel), table);
    }
}
