//! Sync and plan benchmark on the embedded cluster, measured side by side in one run:
//!
//! - `capstan plan` offline of 2,000 and 10,000 manifests (the release binary, whole command);
//! - the first sync of 2,000 objects, then a no-op sync (time and API writes);
//! - `capstan plan --kubeconfig` (live) and `kubectl diff --server-side` of the same
//!   directory against the same cluster, when kubectl is installed, with their ratio;
//! - commit-to-applied latency when following a local repository.
//!
//! `cargo bench --bench sync`; `BENCH_SCALE=0.1` for a tenth of the manifests.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use capstan::sync::metrics::Metrics;
use capstan::sync::run::{self, Outcome, SyncOptions, Syncer, Wakers};
use capstan::sync::source::{Auth, Source, watch_refs};
use capstan_cluster::sim::config::{ClusterConfig, NodeConfig};
use capstan_cluster::testing::{cluster_revision, start_simulated};
use capstan_testing::git::FleetRepo;
use capstan_testing::manifests::{NAMESPACE, config_map, module, node_label};
use tokio::sync::{Notify, mpsc};

const NODES: usize = 100;
const LATENCY_COMMITS: usize = 20;

fn scaled(n: usize) -> usize {
    ((n as f64 * common::factor()).round() as usize).max(10)
}

/// The manifests of a fleet of `count` objects: the namespace, Node version labels,
/// Modules, ConfigMaps; `variant` changes the data of every tenth ConfigMap.
fn fleet(count: usize, variant: &str) -> Vec<(String, String)> {
    let mut files = vec![("namespaces.yaml".to_string(), NAMESPACE.to_string())];
    let modules = (count / 10).max(1);
    for m in 0..modules {
        let name = format!("kmod-{m:05}");
        files.push((format!("modules/{name}.yaml"), module(&name, "v1")));
    }
    for n in 0..NODES.min(count / 10) {
        let node = format!("node-{n:05}");
        files.push((
            format!("nodes/{node}.yaml"),
            node_label(&node, "kmod-00000", "v1"),
        ));
    }
    let maps = count.saturating_sub(files.len());
    for c in 0..maps {
        let value = if c % 10 == 0 { variant } else { "base" };
        files.push((
            format!("config/settings-{c:05}.yaml"),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{c:05}\n  namespace: kmm-demo\n  labels:\n    app: fleet\ndata:\n  value: \"{value}\"\n  replicas: \"3\"\n"
            ),
        ));
    }
    files
}

/// The cluster's resourceVersion as a number: every write moves it by one.
async fn revision(client: &kube::Client) -> u64 {
    cluster_revision(client)
        .await
        .parse()
        .expect("a numeric resourceVersion")
}

/// Runs a command `runs` times; the median wall time and the last exit code.
fn time_command(mut make: impl FnMut() -> Command, runs: usize) -> (Duration, Option<i32>) {
    let mut times = Vec::new();
    let mut code = None;
    for _ in 0..runs {
        let started = Instant::now();
        let output = make().output().expect("command runs");
        times.push(started.elapsed());
        code = output.status.code();
        if code == Some(1) && !output.stderr.is_empty() && make().get_program() != "kubectl" {
            panic!("{}", String::from_utf8_lossy(&output.stderr));
        }
    }
    times.sort();
    (times[times.len() / 2], code)
}

fn plan_offline(repo: &Path, base: &str, head: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    command
        .args([
            "plan", "--format", "json", "--base", base, "--head", head, "--repo",
        ])
        .arg(repo);
    command
}

fn kubectl_available() -> bool {
    Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn row(table: &mut Vec<[String; 3]>, what: &str, value: String, target: &str) {
    table.push([what.to_string(), value, target.to_string()]);
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    capstan_api::install_crypto_provider();
    let mut table: Vec<[String; 3]> = Vec::new();
    let big = scaled(10_000);
    let small = scaled(2_000);

    // Offline plans: a commit of N manifests, then one that changes a tenth of them.
    let mut repo_big = FleetRepo::new();
    let base = repo_big.commit_set(&fleet(big, "base"), "Fleet");
    let head = repo_big.commit_set(&fleet(big, "changed"), "Change a tenth");
    let (plan_big, code) = time_command(|| plan_offline(repo_big.path(), &base, &head), 3);
    assert_eq!(code, Some(0), "plan of {big} manifests");
    row(
        &mut table,
        &format!("capstan plan offline, {big} manifests (a tenth changed)"),
        secs(plan_big),
        "< 2 s",
    );

    let mut repo = FleetRepo::new();
    let base = repo.commit_set(&fleet(small, "base"), "Fleet");
    let head = repo.commit_set(&fleet(small, "changed"), "Change a tenth");
    let (plan_small, _) = time_command(|| plan_offline(repo.path(), &base, &head), 3);
    row(
        &mut table,
        &format!("capstan plan offline, {small} manifests"),
        secs(plan_small),
        "",
    );

    // The cluster: NODES simulated workers.
    let template = ClusterConfig::default_cluster().nodes[1].clone();
    let config = ClusterConfig {
        nodes: (0..NODES)
            .map(|i| NodeConfig {
                name: format!("node-{i:05}"),
                ..template.clone()
            })
            .collect(),
        ..ClusterConfig::default()
    };
    let (cluster, client) = start_simulated(config).await;
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig");
    std::fs::write(kubeconfig.path(), cluster.kubeconfig()).expect("kubeconfig");

    let state = tempfile::tempdir().expect("state");
    let source = Source::open(
        repo.path().to_str().expect("utf-8"),
        "main",
        None,
        state.path(),
        Auth::None,
    )
    .expect("source");
    let mut syncer = Syncer::start(
        client.clone(),
        source,
        SyncOptions::default(),
        Arc::new(Metrics::new()),
    )
    .await
    .expect("syncer");
    let before = revision(&client).await;
    let started = Instant::now();
    let outcome = syncer.sync().await.expect("first sync");
    let first = started.elapsed();
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    let first_writes = revision(&client).await - before;
    row(
        &mut table,
        &format!("first sync, {small} objects"),
        format!("{} ({first_writes} API writes)", secs(first)),
        "",
    );

    let mut noop_times = Vec::new();
    let before = revision(&client).await;
    for _ in 0..5 {
        let started = Instant::now();
        let outcome = syncer.sync().await.expect("no-op sync");
        noop_times.push(started.elapsed());
        assert_eq!(outcome, Outcome::Unchanged);
    }
    let noop_writes = revision(&client).await - before;
    noop_times.sort();
    let noop = noop_times[noop_times.len() / 2];
    row(
        &mut table,
        &format!("no-op sync, {small} objects (median of 5)"),
        format!("{} ({noop_writes} API writes)", secs(noop)),
        "< 1 s, 0 writes",
    );

    let (live_plan, code) = time_command(
        || {
            let mut command = plan_offline(repo.path(), &head, &head);
            command.arg("--kubeconfig").arg(kubeconfig.path());
            command
        },
        3,
    );
    assert_eq!(
        code,
        Some(0),
        "a live plan of the applied commit has no changes"
    );
    row(
        &mut table,
        &format!("capstan plan --kubeconfig (live), {small} objects"),
        secs(live_plan),
        "",
    );

    if kubectl_available() {
        let (kubectl, _) = time_command(
            || {
                let mut command = Command::new("kubectl");
                command
                    .args([
                        "diff",
                        "--server-side",
                        "--force-conflicts",
                        "--field-manager",
                        "capstan",
                        "-R",
                        "-f",
                    ])
                    .arg(repo.path().join("config"))
                    .arg("-f")
                    .arg(repo.path().join("modules"))
                    .arg("--kubeconfig")
                    .arg(kubeconfig.path());
                command
            },
            1,
        );
        row(
            &mut table,
            &format!("kubectl diff --server-side, same {small} objects"),
            secs(kubectl),
            "",
        );
        row(
            &mut table,
            "  ratio kubectl diff / capstan no-op sync",
            format!("{:.1}x", kubectl.as_secs_f64() / noop.as_secs_f64()),
            "",
        );
        row(
            &mut table,
            "  ratio kubectl diff / capstan live plan",
            format!("{:.1}x", kubectl.as_secs_f64() / live_plan.as_secs_f64()),
            "",
        );
    } else {
        row(
            &mut table,
            "kubectl diff (kubectl not installed)",
            "n/a".into(),
            "",
        );
    }

    // Commit-to-applied: the sync loop follows the repository's refs.
    let (_watcher, refs) = watch_refs(&syncer.source().git_dir()).expect("watch");
    let (tx, mut applied) = mpsc::unbounded_channel::<(String, Instant)>();
    let shutdown = Arc::new(Notify::new());
    let looping = tokio::spawn(run::follow(
        syncer,
        Duration::from_secs(3600),
        Wakers {
            refs: Some(refs),
            webhook: Arc::new(Notify::new()),
        },
        shutdown.clone(),
        Arc::new(AtomicBool::new(false)),
        move |result| {
            if let Ok(Outcome::Applied(report)) = result
                && let Some(commit) = &report.commit
            {
                let _ = tx.send((commit.sha.clone(), Instant::now()));
            }
        },
    ));
    let mut latencies = Vec::new();
    for i in 0..LATENCY_COMMITS {
        let started = Instant::now();
        let sha = repo.commit(
            &[(
                "config/settings-00001.yaml",
                Some(&config_map("settings-00001", &format!("commit-{i}"))),
            )],
            &format!("Commit {i}"),
        );
        loop {
            let (applied_sha, at) = tokio::time::timeout(Duration::from_secs(60), applied.recv())
                .await
                .expect("applied in time")
                .expect("loop running");
            if applied_sha == sha {
                latencies.push(at - started);
                break;
            }
        }
    }
    shutdown.notify_one();
    let _ = looping.await;
    latencies.sort();
    row(
        &mut table,
        &format!("commit-to-applied, local repository ({LATENCY_COMMITS} commits)"),
        format!(
            "median {} ms, max {} ms",
            latencies[latencies.len() / 2].as_millis(),
            latencies[latencies.len() - 1].as_millis()
        ),
        "< 1 s",
    );

    let width = table.iter().map(|r| r[0].len()).max().unwrap_or(0);
    let value_width = table.iter().map(|r| r[1].len()).max().unwrap_or(0);
    println!(
        "\n| {:width$} | {:value_width$} | Target |",
        "Measure", "Result"
    );
    println!(
        "|{}|{}|--------|",
        "-".repeat(width + 2),
        "-".repeat(value_width + 2)
    );
    for [what, value, target] in &table {
        println!("| {what:width$} | {value:value_width$} | {target} |");
    }
    cluster.shutdown().await;
}
