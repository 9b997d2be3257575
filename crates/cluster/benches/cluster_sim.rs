//! Simulation benchmark: a 5,000-node embedded cluster comes up all Ready, then a
//! DaemonSet reaches 5,000 running, ready pods. Prints seconds and peak memory.
//!
//! `cargo bench --bench cluster_sim`; `BENCH_SCALE=0.1` for a tenth of the nodes.

#[path = "../../../benches/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use capstan_cluster::sim::config::{ClusterConfig, NodeConfig};
use capstan_cluster::testing::start_simulated;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

#[tokio::main]
async fn main() {
    let count = common::scale(5_000);
    let template = ClusterConfig::default_cluster().nodes[1].clone();
    let config = ClusterConfig {
        nodes: (0..count)
            .map(|i| NodeConfig {
                name: format!("node-{i:05}"),
                ..template.clone()
            })
            .collect(),
        ..ClusterConfig::default()
    };
    let started = Instant::now();
    let (cluster, client) = start_simulated(config).await;
    let nodes = Api::<Node>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready == count {
            break;
        }
        assert!(Instant::now() < deadline, "nodes never all Ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let nodes_ready = started.elapsed();

    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "everywhere"},
        "spec": {
            "selector": {"matchLabels": {"app": "everywhere"}},
            "template": {"metadata": {"labels": {"app": "everywhere"}},
                         "spec": {"tolerations": [{"operator": "Exists"}], "containers": [{"name": "c", "image": "agent:v1"}]}}
        }
    }))
    .expect("ds");
    let daemon_sets = Api::<DaemonSet>::namespaced(client.clone(), "default");
    let ds_started = Instant::now();
    daemon_sets
        .create(&PostParams::default(), &ds)
        .await
        .expect("create ds");
    loop {
        let status = daemon_sets.get("everywhere").await.expect("ds").status;
        if status.is_some_and(|s| {
            s.number_ready as usize == count && s.desired_number_scheduled as usize == count
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "daemon set never ready everywhere"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ds_ready = ds_started.elapsed();
    let total = started.elapsed();

    println!(
        "\ncapstan embedded cluster simulation: {count} nodes (in process, kube client over HTTPS)\n"
    );
    println!(
        "| {:<58} | {:>10} | {:<12} |",
        "measure", "result", "target"
    );
    println!("|{}|{}|{}|", "-".repeat(60), "-".repeat(12), "-".repeat(14));
    println!(
        "| {:<58} | {:>10.2} | {:<12} |",
        "start to all nodes Ready (s)",
        nodes_ready.as_secs_f64(),
        ""
    );
    println!(
        "| {:<58} | {:>10.2} | {:<12} |",
        "DaemonSet created to all pods Running and Ready (s)",
        ds_ready.as_secs_f64(),
        ""
    );
    println!(
        "| {:<58} | {:>10.2} | {:<12} |",
        "total (s)",
        total.as_secs_f64(),
        "< 10 s"
    );
    println!(
        "| {:<58} | {:>10.0} | {:<12} |",
        "peak resident memory of the whole process (MiB)",
        common::peak_rss_mib("/proc/self/status"),
        "< 1024 MiB"
    );
    cluster.shutdown().await;
}
