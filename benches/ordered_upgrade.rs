//! Ordered-upgrade benchmark, on an in-process embedded cluster whose simulated pods and
//! workers take no time, so what is measured is capstan's own work (and the API server's):
//!
//! 1. one node relabelled v1 -> v2: the time of each of its four steps, from the records'
//!    `durationSeconds` (the time since the previous step);
//! 2. 500 nodes relabelled in one commit with `maxNodesInFlight: 50`: the time from the
//!    commit to every node upgraded, and the cluster's API writes (every write moves the
//!    cluster's resourceVersion, the simulated kubelet's included).
//!
//! `cargo bench --bench ordered_upgrade`; `BENCH_SCALE=0.1` for 50 nodes.

mod common;

use std::time::{Duration, Instant};

use capstan::controllers::{self, Context, Selection};
use capstan::sync::run::{SyncOptions, Syncer};
use capstan_api::{HistoryRecord, RecordType};
use capstan_cluster::sim::config::{ClusterConfig, NodeConfig};
use capstan_cluster::testing::{cluster_revision, start_simulated};
use capstan_testing::git::FleetRepo;
use capstan_testing::manifests;
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

fn module(version: &str) -> String {
    manifests::module_with_device_plugin("my-kmod", version)
}

/// The cluster's resourceVersion as a number: every write moves it by one.
async fn revision(client: &kube::Client) -> u64 {
    cluster_revision(client)
        .await
        .parse()
        .expect("a numeric resourceVersion")
}

async fn converge(client: &kube::Client) -> Duration {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    loop {
        let pending = controllers::converge::check(
            client,
            &Selection::all(),
            &capstan_api::clock::SystemClock,
        )
        .await
        .expect("check");
        if pending.is_empty() {
            return started.elapsed();
        }
        assert!(Instant::now() < deadline, "not converged: {pending:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn step_records(client: &kube::Client, version: &str) -> Vec<HistoryRecord> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    api.list(&ListParams::default())
        .await
        .expect("records")
        .items
        .into_iter()
        .filter(|r| {
            r.spec.type_ == RecordType::UpgradeStep && r.spec.to_version.as_deref() == Some(version)
        })
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let factor = common::factor();
    let count = ((500.0 * factor).round() as usize).max(2);
    let in_flight = ((50.0 * factor).round() as u32).max(1);
    let template = ClusterConfig::default_cluster().nodes[1].clone();
    let mut config = ClusterConfig {
        nodes: (0..count)
            .map(|i| NodeConfig {
                name: format!("node-{i:04}"),
                ..template.clone()
            })
            .collect(),
        ..ClusterConfig::default()
    };
    config.timing.pod_start_seconds = 0.0;
    config.timing.pod_stop_seconds = 0.0;
    config.timing.worker_seconds = 0.0;
    let (_cluster, client) = start_simulated(config).await;

    let mut repo = FleetRepo::new();
    let settings = format!("maxNodesInFlight: {in_flight}\nhistoryRetention: 100000\n");
    let mut files = vec![
        ("capstan.yaml".to_string(), settings),
        (
            "namespace.yaml".to_string(),
            manifests::NAMESPACE.to_string(),
        ),
        ("module.yaml".to_string(), module("v1")),
    ];
    for i in 0..count {
        let node = format!("node-{i:04}");
        files.push((
            format!("nodes/{node}.yaml"),
            manifests::node_label(&node, "my-kmod", "v1"),
        ));
    }
    repo.commit_set(&files, "Merge pull request #1 from fleet/initial");
    let state = tempfile::tempdir().expect("tempdir");
    let source = capstan::sync::source::Source::open(
        repo.path().to_str().expect("path"),
        "main",
        None,
        state.path(),
        capstan::sync::source::Auth::None,
    )
    .expect("source");
    let mut syncer = Syncer::start(
        client.clone(),
        source,
        SyncOptions::default(),
        std::sync::Arc::new(capstan::sync::metrics::Metrics::new()),
    )
    .await
    .expect("syncer");
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let running = tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    let initial_started = Instant::now();
    syncer.sync().await.expect("initial sync");
    converge(&client).await;
    let initial = initial_started.elapsed();
    repo.commit(
        &[("module.yaml", Some(&module("v2")))],
        "Merge pull request #2 from fleet/v2",
    );
    syncer.sync().await.expect("bump");
    converge(&client).await;

    // One node alone: the time of each step.
    let first = "node-0000".to_string();
    repo.commit(
        &[(
            &format!("nodes/{first}.yaml"),
            Some(&manifests::node_label(&first, "my-kmod", "v2")),
        )],
        "Merge pull request #3 from fleet/one",
    );
    let one_started = Instant::now();
    syncer.sync().await.expect("one node");
    converge(&client).await;
    let one = one_started.elapsed();
    let mut steps: Vec<(String, f64)> = step_records(&client, "v2")
        .await
        .into_iter()
        .map(|r| {
            (
                r.spec.step.unwrap_or_default(),
                r.spec.duration_seconds.unwrap_or(f64::NAN),
            )
        })
        .collect();
    steps.sort_by(|a, b| a.0.cmp(&b.0));

    // The rest in one commit.
    let rest: Vec<(String, String)> = (1..count)
        .map(|i| {
            let node = format!("node-{i:04}");
            (
                format!("nodes/{node}.yaml"),
                manifests::node_label(&node, "my-kmod", "v2"),
            )
        })
        .collect();
    repo.commit_set(&rest, "Merge pull request #4 from fleet/rest");
    let before = revision(&client).await;
    let fleet_started = Instant::now();
    syncer.sync().await.expect("rest");
    converge(&client).await;
    let fleet = fleet_started.elapsed();
    let writes = revision(&client).await - before;
    let records = step_records(&client, "v2").await.len();
    stop.cancel();
    let _ = running.await;

    println!();
    println!("| measure | result | target |");
    println!("|---|---:|---|");
    println!(
        "| {count} nodes at v1 from an empty cluster (first sync to converged) | {:.2} s | |",
        initial.as_secs_f64()
    );
    for (step, seconds) in &steps {
        println!(
            "| one node, step `{step}` (s since the previous step) | {:.3} s | < 0.1 s |",
            seconds
        );
    }
    println!(
        "| one node, commit to upgraded (sync + 4 steps) | {:.3} s | |",
        one.as_secs_f64()
    );
    println!(
        "| {} nodes relabelled in one commit, maxNodesInFlight {in_flight}: commit to all upgraded | {:.2} s | |",
        count - 1,
        fleet.as_secs_f64()
    );
    println!(
        "| API writes for those {} nodes (all writers, the simulated kubelet's included) | {writes} ({:.1} per node) | |",
        count - 1,
        writes as f64 / (count - 1) as f64
    );
    println!(
        "| step records written for v2 | {records} (expected {}) | |",
        4 * count
    );
}
