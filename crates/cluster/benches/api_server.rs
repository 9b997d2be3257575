//! API server benchmark: create/list/watch throughput and memory of `capstan cluster
//! serve` holding 5,000 Nodes and 50,000 Pods, driven over HTTPS by the `kube` client.
//!
//! `cargo bench --bench api_server` prints a table; `BENCH_SCALE=0.1` runs a tenth of it.
//! The server runs as its own process so its memory is measured alone.

#[path = "../../../benches/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

use common::scale;

const CONCURRENCY: usize = 32;

struct Server {
    child: Child,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let child = Command::new(env!("CARGO_BIN_EXE_capstan-cluster"))
            .args(["--listen", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(dir.join("kubeconfig"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn capstan cluster serve");
        Server { child }
    }

    /// (current, peak) resident memory in MiB.
    fn memory_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
                .map(|kb| kb / 1024.0)
                .unwrap_or(f64::NAN)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn client(dir: &Path) -> kube::Client {
    let path = dir.join("kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(&path).expect("kubeconfig");
    let kubeconfig: kube::config::Kubeconfig =
        serde_saphyr::from_str(&text).expect("kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    config.default_retry = false;
    kube::Client::try_from(config).expect("client")
}

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {"node-role.kubernetes.io/worker": "", "kubernetes.io/hostname": format!("node-{i:05}")}},
        "spec": {"podCIDR": format!("10.{}.{}.0/24", i / 256, i % 256)},
        "status": {
            "nodeInfo": {"kernelVersion": "6.0.15-300.fc37.x86_64", "bootID": format!("boot-{i}"), "kubeletVersion": "v1.33.0",
                         "osImage": "Fedora CoreOS", "containerRuntimeVersion": "cri-o://1.33.0", "machineID": "m", "systemUUID": "s",
                         "operatingSystem": "linux", "architecture": "amd64", "kubeProxyVersion": ""},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-11-20T00:00:00Z", "lastTransitionTime": "2026-11-20T00:00:00Z"}],
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256, i % 256)}]
        }
    }))
    .expect("node")
}

fn pod(i: usize, nodes: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "labels": {"app": format!("app-{}", i % 100), "tier": "bench"}},
        "spec": {
            "nodeName": format!("node-{:05}", i % nodes),
            "containers": [{"name": "app", "image": "registry.example/app:v1",
                            "ports": [{"containerPort": 8080}],
                            "env": [{"name": "MODE", "value": "bench"}],
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]
        }
    }))
    .expect("pod")
}

async fn create_all<K>(api: &Api<K>, objects: Vec<K>) -> Duration
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await.map(|_| ()) }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .expect("creates succeed");
    started.elapsed()
}

/// A LIST read to the last byte without decoding: what the server costs.
async fn raw_list_seconds(client: &kube::Client, path: &str) -> (f64, usize) {
    let request = http::Request::get(path).body(Vec::new()).expect("request");
    let started = Instant::now();
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .expect("list");
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (started.elapsed().as_secs_f64(), bytes.len())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

/// Median and p99 latency from a write to its event at each of `watchers` watchers.
async fn watch_latency(client: &kube::Client, watchers: usize, writes: usize) -> (f64, f64) {
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let rv = maps
        .list(&ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let mut tasks = Vec::new();
    for _ in 0..watchers {
        let mut events = maps
            .watch(&WatchParams::default(), &rv)
            .await
            .expect("watch")
            .boxed();
        let sender = sender.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(Ok(event)) = events.next().await {
                if let WatchEvent::Added(cm) = event {
                    let _ = sender.send((cm.metadata.name.unwrap_or_default(), Instant::now()));
                }
            }
        }));
    }
    let mut latencies = Vec::new();
    for i in 0..writes {
        let name = format!("watched-{i}");
        let sent = Instant::now();
        maps.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}})).expect("cm"),
        )
        .await
        .expect("create");
        let mut received = 0;
        while received < watchers {
            let (got, at) = tokio::time::timeout(Duration::from_secs(60), receiver.recv())
                .await
                .expect("event in time")
                .expect("open");
            if got == name {
                latencies.push(at.duration_since(sent).as_secs_f64() * 1000.0);
                received += 1;
            }
        }
    }
    for task in tasks {
        task.abort();
    }
    (median(latencies.clone()), percentile(latencies, 0.99))
}

fn row(what: &str, value: String, target: &str) {
    println!("| {what:<52} | {value:>16} | {target:<14} |");
}

#[tokio::main]
async fn main() {
    capstan_api::install_crypto_provider();
    let nodes = scale(5_000);
    let pods = scale(50_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path());
    let client = client(dir.path()).await;
    let (idle_rss, _) = server.memory_mib();

    let node_time = create_all(
        &Api::<Node>::all(client.clone()),
        (0..nodes).map(node).collect(),
    )
    .await;
    let pod_time = create_all(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        (0..pods).map(|i| pod(i, nodes)).collect(),
    )
    .await;

    let mut raw_lists = Vec::new();
    let mut body_bytes = 0;
    for _ in 0..5 {
        let (seconds, bytes) = raw_list_seconds(&client, "/api/v1/pods").await;
        raw_lists.push(seconds);
        body_bytes = bytes;
    }
    let typed_started = Instant::now();
    let listed = Api::<Pod>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("typed list");
    let typed_list = typed_started.elapsed().as_secs_f64();
    assert_eq!(listed.items.len(), pods);
    let (selector_list, _) =
        raw_list_seconds(&client, "/api/v1/pods?labelSelector=app%3Dapp-7").await;
    let (node_list, _) = raw_list_seconds(&client, "/api/v1/nodes").await;
    let (field_list, _) = raw_list_seconds(
        &client,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-00007",
    )
    .await;

    let (watch_median, watch_p99) = watch_latency(&client, 100, 50).await;
    let (rss, peak) = server.memory_mib();

    println!(
        "\ncapstan embedded API server: {nodes} Nodes, {pods} Pods (HTTPS, kube client, {CONCURRENCY} requests in flight)\n"
    );
    println!(
        "| {:<52} | {:>16} | {:<14} |",
        "measure", "result", "target"
    );
    println!("|{}|{}|{}|", "-".repeat(54), "-".repeat(18), "-".repeat(16));
    row(
        "create Nodes (objects/s)",
        format!("{:.0}", nodes as f64 / node_time.as_secs_f64()),
        "",
    );
    row(
        "create Pods (objects/s)",
        format!("{:.0}", pods as f64 / pod_time.as_secs_f64()),
        "",
    );
    row(
        &format!(
            "list all Pods, server + transfer (s, median of 5, {:.0} MiB)",
            body_bytes as f64 / 1048576.0
        ),
        format!("{:.3}", median(raw_lists)),
        "< 1 s",
    );
    row(
        "list all Pods, decoded into typed Pods by kube (s)",
        format!("{typed_list:.3}"),
        "",
    );
    row(
        "list Pods by label selector (1% match) (s)",
        format!("{selector_list:.3}"),
        "",
    );
    row(
        "list Pods by field selector spec.nodeName (s)",
        format!("{field_list:.3}"),
        "",
    );
    row("list all Nodes (s)", format!("{node_list:.3}"), "");
    row(
        "watch event to 100 watchers, median (ms)",
        format!("{watch_median:.2}"),
        "< 50 ms",
    );
    row(
        "watch event to 100 watchers, p99 (ms)",
        format!("{watch_p99:.2}"),
        "",
    );
    row(
        "server resident memory, idle (MiB)",
        format!("{idle_rss:.0}"),
        "",
    );
    row(
        "server resident memory, loaded (MiB)",
        format!("{rss:.0}"),
        "< 1024 MiB",
    );
    row(
        "server peak resident memory (MiB)",
        format!("{peak:.0}"),
        "< 1024 MiB",
    );
}
