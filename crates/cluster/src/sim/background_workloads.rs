//! The background workloads of cluster.yaml: StatefulSet-managed pods with an optional
//! PodDisruptionBudget, and explicit pods bound to nodes (stuck ones, ones held by
//! finalizers), so that drains have something to evict. Created once; a cluster
//! restarted from its state dir keeps what it has.

use serde_json::{Value, json};

use super::Simulation;
use super::config::WorkloadConfig;
use super::kubelet::STUCK_LABEL;
use crate::api::WriteOptions;
use crate::errors::ApiError;

const MANAGER: &str = "capstan-simulation";

/// Creates every configured workload that does not exist yet.
pub fn create(sim: &Simulation) -> Result<(), ApiError> {
    for workload in &sim.config.workloads {
        ensure_namespace(sim, &workload.namespace)?;
        if let Some(replicas) = workload.replicas {
            ensure(
                sim,
                "apps",
                "statefulsets",
                &workload.namespace,
                stateful_set(workload, replicas),
            )?;
        }
        if let Some(pdb) = &workload.pdb {
            let mut spec = pdb.clone();
            spec["selector"] = json!({"matchLabels": {"app": workload.name}});
            let budget = json!({"metadata": {"name": workload.name, "namespace": workload.namespace}, "spec": spec});
            ensure(
                sim,
                "policy",
                "poddisruptionbudgets",
                &workload.namespace,
                budget,
            )?;
        }
        for (i, pod) in workload.pods.iter().enumerate() {
            let mut labels = json!({"app": workload.name});
            if pod.stuck {
                labels[STUCK_LABEL] = json!("true");
            }
            let object = json!({
                "metadata": {"name": format!("{}-{}", workload.name, i), "namespace": workload.namespace,
                             "labels": labels, "finalizers": pod.finalizers},
                "spec": {"nodeName": pod.node, "containers": [{"name": "app", "image": workload.image}]},
            });
            ensure(sim, "", "pods", &workload.namespace, object)?;
        }
    }
    Ok(())
}

fn stateful_set(workload: &WorkloadConfig, replicas: u32) -> Value {
    let mut pod_spec = json!({"containers": [{"name": "app", "image": workload.image}]});
    if !workload.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(workload.node_selector);
    }
    json!({
        "metadata": {"name": workload.name, "namespace": workload.namespace},
        "spec": {
            "replicas": replicas,
            "serviceName": workload.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": workload.name}},
            "template": {"metadata": {"labels": {"app": workload.name}}, "spec": pod_spec},
        },
    })
}

fn ensure_namespace(sim: &Simulation, namespace: &str) -> Result<(), ApiError> {
    ensure(
        sim,
        "",
        "namespaces",
        "",
        json!({"metadata": {"name": namespace}}),
    )
}

fn ensure(
    sim: &Simulation,
    group: &str,
    plural: &str,
    namespace: &str,
    object: Value,
) -> Result<(), ApiError> {
    let Some(resource) = sim.api.registry.get(group, "v1", plural) else {
        return Ok(());
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if sim.api.get(&resource, namespace, &name).is_ok() {
        return Ok(());
    }
    let options = WriteOptions {
        field_manager: Some(MANAGER.into()),
        ..WriteOptions::default()
    };
    sim.api
        .create(&resource, namespace, object, &options)
        .map(|_| ())
}
