//! `cluster.yaml`: the simulated nodes, workloads and behaviour of an embedded cluster.
//! See docs/cluster-config.md for the format with an example.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use capstan_worker::simulated::ModuleTable;

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub nodes: Vec<NodeConfig>,
    /// Background workloads, so drains have something to evict.
    #[serde(default)]
    pub workloads: Vec<WorkloadConfig>,
    /// Images that cannot be pulled: pods using them never start, worker pods fail.
    #[serde(default)]
    pub broken_images: Vec<String>,
    /// How long simulated things take.
    #[serde(default)]
    pub timing: Timing,
}

/// One node.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    pub name: String,
    /// `worker` or `master` (`control-plane` is accepted for master); sets the
    /// `node-role.kubernetes.io/<role>` label.
    #[serde(default = "default_role")]
    pub role: String,
    /// `status.nodeInfo.kernelVersion`.
    #[serde(default = "default_kernel")]
    pub kernel: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Taints as the Node spec writes them: `{key, value, effect}`.
    #[serde(default)]
    pub taints: Vec<Value>,
    /// `status.allocatable`.
    #[serde(default = "default_allocatable")]
    pub allocatable: BTreeMap<String, String>,
    /// Modules loaded at boot (in-tree ones a Module may have to remove).
    #[serde(default)]
    pub modules: ModuleTable,
    /// Start NotReady.
    #[serde(default)]
    pub not_ready: bool,
}

/// A background workload: a StatefulSet-managed set of pods (with an optional budget),
/// or explicit pods on given nodes (stuck, or held by finalizers).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadConfig {
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "default_image")]
    pub image: String,
    /// Pods kept by a StatefulSet (Parallel), scheduled onto schedulable nodes.
    #[serde(default)]
    pub replicas: Option<u32>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// A PodDisruptionBudget over the workload's pods: `{minAvailable: 2}` or `{maxUnavailable: 1}`.
    #[serde(default)]
    pub pdb: Option<Value>,
    /// Explicit pods, each bound to a node.
    #[serde(default)]
    pub pods: Vec<PodConfig>,
}

/// One explicit pod of a workload.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodConfig {
    pub node: String,
    /// Ignores termination until deleted with grace period 0.
    #[serde(default)]
    pub stuck: bool,
    #[serde(default)]
    pub finalizers: Vec<String>,
}

/// Durations of simulated work, in seconds.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timing {
    /// From a pod bound to a node to Running and Ready.
    #[serde(default = "default_pod_start")]
    pub pod_start_seconds: f64,
    /// From a pod's deletion to its containers having stopped (capped by its grace period).
    #[serde(default = "default_pod_stop")]
    pub pod_stop_seconds: f64,
    /// How long a kmod worker takes to load or unload.
    #[serde(default = "default_worker")]
    pub worker_seconds: f64,
    /// How long a node stays NotReady while it reboots.
    #[serde(default = "default_reboot")]
    pub reboot_seconds: f64,
    /// How often the kubelet relists containers (a real kubelet's PLEG: 1 s). A container
    /// that starts and exits within one relist is only ever reported exited, as a real
    /// kubelet reports it; 0 reports every start.
    #[serde(default = "default_relist")]
    pub relist_seconds: f64,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            pod_start_seconds: default_pod_start(),
            pod_stop_seconds: default_pod_stop(),
            worker_seconds: default_worker(),
            reboot_seconds: default_reboot(),
            relist_seconds: default_relist(),
        }
    }
}

impl Timing {
    pub fn pod_start(&self) -> Duration {
        seconds(self.pod_start_seconds)
    }
    pub fn pod_stop(&self) -> Duration {
        seconds(self.pod_stop_seconds)
    }
    pub fn worker(&self) -> Duration {
        seconds(self.worker_seconds)
    }
    pub fn reboot(&self) -> Duration {
        seconds(self.reboot_seconds)
    }
    pub fn relist(&self) -> Duration {
        seconds(self.relist_seconds)
    }
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn default_role() -> String {
    "worker".into()
}
/// The kernel every default node runs.
pub const DEFAULT_KERNEL: &str = "6.0.15-300.fc37.x86_64";
fn default_kernel() -> String {
    DEFAULT_KERNEL.into()
}
fn default_allocatable() -> BTreeMap<String, String> {
    [
        ("cpu", "8"),
        ("memory", "32Gi"),
        ("pods", "110"),
        ("ephemeral-storage", "100Gi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}
fn default_namespace() -> String {
    "default".into()
}
fn default_image() -> String {
    "registry.example/app:v1".into()
}
fn default_pod_start() -> f64 {
    0.05
}
fn default_pod_stop() -> f64 {
    0.05
}
fn default_worker() -> f64 {
    0.05
}
fn default_reboot() -> f64 {
    0.5
}
fn default_relist() -> f64 {
    1.0
}

/// Why a cluster.yaml was refused.
#[derive(Debug, thiserror::Error)]
pub enum ClusterConfigError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl ClusterConfig {
    /// The cluster without a config: one control-plane node and three workers on one kernel.
    pub fn default_cluster() -> Self {
        let node = |name: &str, role: &str| NodeConfig {
            name: name.into(),
            role: role.into(),
            kernel: default_kernel(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            allocatable: default_allocatable(),
            modules: ModuleTable::default(),
            not_ready: false,
        };
        let mut control_plane = node("control-plane", "master");
        control_plane.taints = vec![
            serde_json::json!({"key": "node-role.kubernetes.io/master", "effect": "NoSchedule"}),
        ];
        ClusterConfig {
            nodes: vec![
                control_plane,
                node("worker-1", "worker"),
                node("worker-2", "worker"),
                node("worker-3", "worker"),
            ],
            ..ClusterConfig::default()
        }
    }

    /// Reads and checks a cluster.yaml; errors name the file, line and field.
    pub fn read(path: &Path) -> Result<Self, ClusterConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ClusterConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::parse(&text, &shown)
    }

    /// Parses and checks cluster.yaml text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ClusterConfigError> {
        let invalid = |message: String| ClusterConfigError::Invalid {
            path: origin.to_string(),
            message,
        };
        let config: ClusterConfig =
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut seen = std::collections::HashSet::new();
        for (i, node) in config.nodes.iter().enumerate() {
            if !seen.insert(node.name.as_str()) {
                return Err(invalid(format!(
                    "nodes[{i}].name: duplicate node {:?}",
                    node.name
                )));
            }
            if !matches!(node.role.as_str(), "worker" | "master" | "control-plane") {
                return Err(invalid(format!(
                    "nodes[{i}].role: {:?} is not worker, master or control-plane",
                    node.role
                )));
            }
        }
        for (i, workload) in config.workloads.iter().enumerate() {
            for (j, pod) in workload.pods.iter().enumerate() {
                if !seen.contains(pod.node.as_str()) {
                    return Err(invalid(format!(
                        "workloads[{i}].pods[{j}].node: no node {:?}",
                        pod.node
                    )));
                }
            }
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_with_mixed_kernels_parses() {
        let text = r#"
nodes:
  - {name: cp, role: master}
  - {name: w1, kernel: 6.0.15-300.fc37.x86_64}
  - {name: w2, kernel: 6.1.4-200.fc37.x86_64, labels: {zone: b}}
workloads:
  - {name: web, namespace: apps, replicas: 3, pdb: {minAvailable: 2}}
  - name: leftovers
    pods: [{node: w1, stuck: true}, {node: w2, finalizers: [example.dev/hold]}]
brokenImages: [registry.example/broken:v1]
timing: {podStartSeconds: 0.1}
"#;
        let config = ClusterConfig::parse(text, "cluster.yaml").expect("valid");
        assert_eq!(config.nodes.len(), 3);
        assert_eq!(config.nodes[2].kernel, "6.1.4-200.fc37.x86_64");
        assert_eq!(config.nodes[0].kernel, DEFAULT_KERNEL);
        assert_eq!(config.timing.pod_start(), Duration::from_millis(100));
        assert_eq!(config.timing.reboot(), Duration::from_millis(500));
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            ("nodes: [{name: a, kernal: x}]", "kernal"),
            ("nodes: [{name: a}, {name: a}]", "duplicate node"),
            ("nodes: [{name: a, role: boss}]", "nodes[0].role"),
            (
                "nodes: [{name: a}]\nworkloads: [{name: w, pods: [{node: b}]}]",
                "workloads[0].pods[0].node",
            ),
        ];
        for (text, want) in cases {
            let err = ClusterConfig::parse(text, "cluster.yaml")
                .expect_err(text)
                .to_string();
            assert!(
                err.contains("cluster.yaml") && err.contains(want),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn the_default_cluster_has_a_control_plane_and_three_workers() {
        let config = ClusterConfig::default_cluster();
        let roles: Vec<&str> = config.nodes.iter().map(|n| n.role.as_str()).collect();
        assert_eq!(roles, ["master", "worker", "worker", "worker"]);
    }
}
