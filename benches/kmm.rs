//! KMM controllers benchmark: the Module -> NMC and NMC controllers load 10 Modules onto
//! 5,000 simulated worker nodes from empty, against `capstan cluster serve` in its own
//! process. The controllers run in a process of their own too (this binary again), so its
//! peak memory is theirs alone; the harness polls the cluster for convergence from here.
//! Measures the time to convergence, every API write the controllers make (by kind, per
//! (node, module) pair), the peak memory of both processes, and the writes of a converged
//! cluster: a quiet window and a restart of the controllers.
//!
//! `cargo bench --bench kmm` prints a table; `BENCH_SCALE=0.1` runs a tenth of the nodes.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use capstan::controllers::{self, Context, Selection};
use capstan_api::labels::{COMPONENT_LABEL, WORKER_COMPONENT};
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use futures::FutureExt as _;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::client::{Body, ClientBuilder};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

use common::{peak_rss_mib, scale};

const MODULES: usize = 10;
const NAMESPACE: &str = "kmm-bench";
const POLL: Duration = Duration::from_millis(250);
const QUIET: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(600);
/// Simulated durations (seconds): bound pod to Running, deleted pod to gone, a kmod load.
const POD_START: f64 = 0.01;
const POD_STOP: f64 = 0.01;
const WORKER: f64 = 0.02;
/// The cluster server's scheduling priority against the controllers' (see `Server::start`).
const SERVER_NICE: &str = "5";

/// `capstan cluster serve` with `nodes` worker nodes on the default kernel.
struct Server {
    child: Child,
    kubeconfig: PathBuf,
}

impl Server {
    fn start(dir: &Path, nodes: usize) -> Server {
        let mut yaml = String::from("nodes:\n");
        for i in 0..nodes {
            yaml.push_str(&format!("  - name: node-{i:05}\n"));
        }
        yaml.push_str(&format!(
            "timing:\n  podStartSeconds: {POD_START}\n  podStopSeconds: {POD_STOP}\n  workerSeconds: {WORKER}\n"
        ));
        let config = dir.join("cluster.yaml");
        std::fs::write(&config, yaml).expect("write cluster.yaml");
        let kubeconfig = dir.join("kubeconfig");
        // At a lower priority (`SERVER_NICE`) than the controllers. A real cluster's API
        // server and kubelets run on other machines, and the controllers' one runtime
        // thread has its CPU to itself; here, whenever all three threads are runnable, the
        // stand-in's two would take two thirds of the two cores, and the controllers,
        // whose work paces the rollout, would wait for theirs (docs/benchmarks.md).
        // `nice` execs the server, so the child's pid (read for memory and CPU) is the
        // server's.
        let child = Command::new("nice")
            .args(["-n", SERVER_NICE])
            .arg(env!("CARGO_BIN_EXE_capstan"))
            .args(["cluster", "serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn capstan cluster serve");
        Server { child, kubeconfig }
    }

    fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(&format!("/proc/{}/status", self.child.id()))
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&format!("/proc/{}/stat", self.child.id()))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds (user and system) the process whose `/proc/.../stat` is at `path` used.
fn cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|t| t.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name; 100 ticks/s.
    (ticks(11) + ticks(12)) / 100.0
}

async fn kube_config(path: &Path) -> kube::Config {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !path.exists() {
        assert!(Instant::now() < deadline, "server did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = std::fs::read_to_string(path).expect("kubeconfig");
    let kubeconfig: kube::config::Kubeconfig =
        serde_saphyr::from_str(&text).expect("kubeconfig parses");
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config")
}

/// One kind of request: verb (`GET`, `LIST`, `WATCH`, `POST`, `PATCH`, ...), resource,
/// subresource, for a patch of an NMC itself whether it touches the spec, and the status
/// code when the server refused it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct RequestKind {
    verb: String,
    resource: String,
    subresource: String,
    part: String,
    refused: Option<u16>,
}

impl RequestKind {
    fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE")
    }

    fn of(request: &http::Request<Body>) -> RequestKind {
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or_default();
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        // /api/v1/... or /apis/<group>/<version>/...
        let rest = match segments.first() {
            Some(&"api") => segments.get(2..).unwrap_or_default(),
            Some(&"apis") => segments.get(3..).unwrap_or_default(),
            _ => &segments[..],
        };
        let rest = match rest {
            ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
            _ => rest,
        };
        let resource = rest.first().copied().unwrap_or_default().to_string();
        let named = rest.len() > 1;
        let subresource = rest.get(2).copied().unwrap_or_default().to_string();
        let method = request.method().as_str();
        let verb = match method {
            "GET"
                if query
                    .split('&')
                    .any(|p| p == "watch=true" || p == "watch=1") =>
            {
                "WATCH"
            }
            "GET" if !named => "LIST",
            other => other,
        }
        .to_string();
        let mut part = String::new();
        if method == "PATCH" && resource == "nodemodulesconfigs" && subresource.is_empty() {
            let body = request
                .body()
                .try_clone()
                .and_then(|body| body.collect_bytes().now_or_never())
                .and_then(Result::ok)
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            part = match body {
                Some(body) if body.get("spec").is_some() => "spec".into(),
                _ => "metadata".into(),
            };
        }
        RequestKind {
            verb,
            resource,
            subresource,
            part,
            refused: None,
        }
    }

    /// The row a write is reported under.
    fn label(&self) -> String {
        let what = match (
            self.verb.as_str(),
            self.resource.as_str(),
            self.subresource.as_str(),
            self.part.as_str(),
        ) {
            ("POST", "nodemodulesconfigs", "", _) => "NMC create",
            ("PATCH", "nodemodulesconfigs", "", "spec") => "NMC spec patch (and its labels)",
            ("PATCH", "nodemodulesconfigs", "", _) => "NMC metadata patch (labels, failures)",
            ("PATCH", "nodemodulesconfigs", "status", _) => "NMC status patch",
            ("POST", "pods", "", _) => "worker pod create",
            ("DELETE", "pods", "", _) => "worker pod delete",
            ("PATCH", "nodes", "", _) => "node label patch",
            ("PATCH", "modules", "status", _) => "Module status patch",
            ("PATCH", "modules", "", _) => "Module finalizer patch",
            ("POST", "events", "", _) => "Event create",
            ("PATCH", "events", "", _) => "Event patch (series)",
            _ => "",
        };
        if what.is_empty() {
            let sub = if self.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", self.subresource)
            };
            format!("other: {} {}{sub}", self.verb, self.resource)
        } else {
            what.to_string()
        }
    }

    fn is_event(&self) -> bool {
        self.resource == "events"
    }
}

/// Every request a client sent, by kind.
#[derive(Clone, Default)]
struct Requests(Arc<Mutex<BTreeMap<RequestKind, u64>>>);

impl Requests {
    fn record(&self, kind: RequestKind) {
        *self
            .0
            .lock()
            .expect("counter lock")
            .entry(kind)
            .or_default() += 1;
    }

    fn snapshot(&self) -> BTreeMap<RequestKind, u64> {
        self.0.lock().expect("counter lock").clone()
    }
}

/// Counts since `before`.
fn since(now: &BTreeMap<RequestKind, u64>, before: &BTreeMap<RequestKind, u64>) -> Counts {
    Counts(
        now.iter()
            .map(|(kind, n)| (kind.clone(), n - before.get(kind).copied().unwrap_or(0)))
            .filter(|(_, n)| *n > 0)
            .collect(),
    )
}

struct Counts(BTreeMap<RequestKind, u64>);

impl Counts {
    fn writes(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.is_write())
            .map(|(_, n)| n)
            .sum()
    }

    fn writes_without_events(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.is_write() && !k.is_event())
            .map(|(_, n)| n)
            .sum()
    }

    fn refused_writes_without_events(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.is_write() && !k.is_event() && k.refused.is_some())
            .map(|(_, n)| n)
            .sum()
    }

    fn reads(&self) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| !k.is_write())
            .map(|(_, n)| n)
            .sum()
    }

    fn count(&self, verb: &str, resource: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.verb == verb && k.resource == resource)
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes by row label: how many, and how many the server refused, by status code.
    fn write_rows(&self) -> BTreeMap<String, (u64, BTreeMap<u16, u64>)> {
        let mut rows: BTreeMap<String, (u64, BTreeMap<u16, u64>)> = BTreeMap::new();
        for (kind, n) in self.0.iter().filter(|(k, _)| k.is_write()) {
            let row = rows.entry(kind.label()).or_default();
            row.0 += n;
            if let Some(code) = kind.refused {
                *row.1.entry(code).or_default() += n;
            }
        }
        rows
    }

    /// A one-line summary of the writes, for the steady-state rows.
    fn write_summary(&self) -> String {
        let rows = self.write_rows();
        if rows.is_empty() {
            return "none".into();
        }
        rows.iter()
            .map(|(label, (n, refused))| format!("{label}: {n}{}", refusals(refused)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `" (409: 12)"` for writes the server refused; empty when none were.
fn refusals(refused: &BTreeMap<u16, u64>) -> String {
    if refused.is_empty() {
        return String::new();
    }
    let codes: Vec<String> = refused
        .iter()
        .map(|(code, n)| format!("{code}: {n}"))
        .collect();
    format!(" (refused {})", codes.join(", "))
}

/// A client that records every request it sends in `requests`, with its answer.
fn counting_client(config: kube::Config, requests: Requests) -> kube::Client {
    let layer = tower::layer::layer_fn(move |inner| Counting {
        inner,
        requests: requests.clone(),
    });
    ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&layer)
        .build()
}

/// The counting middleware: the kind of each request, and whether the server refused it.
struct Counting<S> {
    inner: S,
    requests: Requests,
}

impl<S, B> tower::Service<http::Request<Body>> for Counting<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let mut kind = RequestKind::of(&request);
        let requests = self.requests.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            if let Ok(response) = &response
                && !response.status().is_success()
            {
                kind.refused = Some(response.status().as_u16());
            }
            requests.record(kind);
            response
        })
    }
}

fn module(i: usize) -> Module {
    serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": format!("kmod-{i}"), "namespace": NAMESPACE},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": format!("kmod_{i}")},
                "kernelMappings": [{
                    "regexp": "^.+$",
                    "containerImage": format!("registry.example/kmod-{i}:${{KERNEL_FULL_VERSION}}"),
                }],
            }},
        },
    }))
    .expect("module")
}

async fn wait_nodes_ready(client: &kube::Client, count: usize) -> Duration {
    let started = Instant::now();
    let nodes = Api::<Node>::all(client.clone());
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await
            .map(|list| {
                list.items
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            })
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready == count {
            return started.elapsed();
        }
        assert!(started.elapsed() < DEADLINE, "nodes never all Ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many NMCs record all [`MODULES`] modules in their status, and how many (node,
/// module) pairs the statuses record in all.
async fn loaded(client: &kube::Client) -> (usize, usize) {
    let counts: Vec<usize> = Api::<NodeModulesConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|list| {
            list.items
                .iter()
                .map(|nmc| nmc.status.as_ref().map_or(0, |s| s.modules.len()))
                .collect()
        })
        .unwrap_or_default();
    let complete = counts.iter().filter(|n| **n == MODULES).count();
    (complete, counts.iter().sum())
}

/// Whether every Module's status counts the module available on all `nodes`: the last
/// write of a rollout, after the NMC statuses.
async fn counted(client: &kube::Client, nodes: usize) -> bool {
    Api::<Module>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .is_ok_and(|list| {
            list.items.len() == MODULES
                && list.items.iter().all(|m| {
                    m.status
                        .as_ref()
                        .is_some_and(|s| s.module_loader.available_number as usize == nodes)
                })
        })
}

/// How long the store's revision must stay put to count as settled, how often the
/// harness looks, and how long it waits for that at most.
const SETTLE: Duration = Duration::from_millis(250);
const SETTLE_POLL: Duration = Duration::from_millis(20);
const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// Polls the store's revision (`revision`, first seen at `seen` after `started`) until it
/// has not moved for [`SETTLE`]; returns it and when it was first seen. After
/// [`SETTLE_LIMIT`], returns the last one seen.
async fn settle(
    workers: &Api<Pod>,
    any_worker: &ListParams,
    mut revision: Option<String>,
    mut seen: Duration,
    started: Instant,
) -> (Option<String>, Duration) {
    let limit = started.elapsed() + SETTLE_LIMIT;
    loop {
        tokio::time::sleep(SETTLE_POLL).await;
        let now = workers
            .list(any_worker)
            .await
            .ok()
            .and_then(|list| list.metadata.resource_version);
        let at = started.elapsed();
        if now != revision {
            (revision, seen) = (now, at);
        } else if at - seen >= SETTLE || at >= limit {
            return (revision, seen);
        }
    }
}

/// Polls until `converge::check` is empty, every node's NMC status lists every module and
/// every Module's status counts them;
/// `None` when [`DEADLINE`] passes first.
async fn wait_converged(
    client: &kube::Client,
    selection: &Selection,
    nodes: usize,
    started: Instant,
    controllers: &mut ControllersProcess,
) -> Option<Duration> {
    let mut last_report = Instant::now();
    let workers = Api::<Pod>::all(client.clone());
    let any_worker = ListParams::default()
        .labels(&format!("{COMPONENT_LABEL}={WORKER_COMPONENT}"))
        .limit(1);
    loop {
        // While a worker pod is left the fleet has not converged. The other checks run
        // cheapest first (ten Modules, then every NMC, then every Node, NMC and Module),
        // so the full check runs once the Modules' status counts every node. The last
        // nodes' own writes (their labels, their Events) may follow that status by a few
        // milliseconds, so the harness then waits for the store's revision (a worker
        // list's resourceVersion) to settle, noting when it first saw the revision it
        // settles at. When the revision is still that one after the checks, nothing was
        // written while they read: the state they passed was there from that moment, and
        // the fleet converged then, not when the checks ended (they take seconds of the
        // harness's own work at 5,000 nodes).
        let first = workers.list(&any_worker).await;
        let mut answered = started.elapsed();
        let mut revision = first
            .as_ref()
            .ok()
            .and_then(|list| list.metadata.resource_version.clone());
        let pending = match first {
            Ok(list) if list.items.is_empty() => {
                if counted(client, nodes).await {
                    (revision, answered) =
                        settle(&workers, &any_worker, revision, answered, started).await;
                    if loaded(client).await.0 != nodes {
                        vec!["NMC statuses do not list every module yet".to_string()]
                    } else {
                        controllers::converge::check(
                            client,
                            selection,
                            &capstan_api::clock::SystemClock,
                        )
                        .await
                        .unwrap_or_else(|err| vec![format!("check failed: {err}")])
                    }
                } else {
                    vec!["Module statuses do not count every node yet".to_string()]
                }
            }
            _ => vec!["worker pods are running".to_string()],
        };
        if pending.is_empty() {
            let unchanged = revision.is_some()
                && workers
                    .list(&any_worker)
                    .await
                    .is_ok_and(|list| list.metadata.resource_version == revision);
            let checked = started.elapsed();
            eprintln!(
                "converged: the checks passed at {:.2} s (store revision {}); the state they read {}",
                checked.as_secs_f64(),
                revision.as_deref().unwrap_or("unknown"),
                if unchanged {
                    format!("was already there at {:.2} s", answered.as_secs_f64())
                } else {
                    "changed while they read, so the later time counts".to_string()
                }
            );
            return Some(if unchanged { answered } else { checked });
        }
        if started.elapsed() > DEADLINE {
            eprintln!("not converged after {DEADLINE:?}: {pending:?}");
            return None;
        }
        if last_report.elapsed() > Duration::from_secs(10) {
            last_report = Instant::now();
            let counts = since(&controllers.requests().await, &BTreeMap::new());
            eprintln!(
                "{:>5.0} s: pending {:?} ... {:?}; writes so far: {}",
                started.elapsed().as_secs_f64(),
                pending
                    .first()
                    .map(String::as_str)
                    .unwrap_or("NMC statuses"),
                pending.last().map(String::as_str).unwrap_or_default(),
                counts.write_summary()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What a converged fleet costs: the writes of a quiet window, then of a restart of the
/// controllers (how long until every NMC was reconciled again, and the writes until a
/// quiet window after that).
struct SteadyState {
    quiet: Counts,
    resynced: Option<Duration>,
    restart: Counts,
}

async fn steady_state(
    plain: &kube::Client,
    selection: &Selection,
    controllers: &mut ControllersProcess,
    nodes: usize,
) -> SteadyState {
    let before = controllers.requests().await;
    tokio::time::sleep(QUIET).await;
    let quiet = since(&controllers.requests().await, &before);

    // Every watch lists again and every object is reconciled again.
    let before = controllers.requests().await;
    let restarted = Instant::now();
    controllers.restart().await;
    // Every NMC reconciled since the restart means the whole fleet was reconciled again.
    let mut resynced = None;
    while restarted.elapsed() < DEADLINE {
        let pending =
            controllers::converge::check(plain, selection, &capstan_api::clock::SystemClock)
                .await
                .unwrap_or_else(|err| vec![format!("check failed: {err}")]);
        if pending.is_empty() && controllers.reconciled().await >= nodes {
            resynced = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    tokio::time::sleep(QUIET).await;
    let restart = since(&controllers.requests().await, &before);
    SteadyState {
        quiet,
        resynced,
        restart,
    }
}

/// The controllers of one run, in this process (the child's side).
struct Controllers {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Controllers {
    fn start(client: &kube::Client, selection: &Selection) -> Controllers {
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let selection = selection.clone();
        let task = tokio::spawn(async move { controllers::run(ctx, &selection).await });
        Controllers { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("controllers stop");
    }
}

/// Set to the kubeconfig's path, it makes this binary the controllers' process.
const CONTROLLERS_ENV: &str = "CAPSTAN_KMM_BENCH_CONTROLLERS";

/// The NMC reconciles of the controllers' process, counted from kube's "reconciling
/// object" span (one per reconcile): how many there were in all, and, once armed by a
/// restart, which NMCs were reconciled since (the rollout only counts, so the harness's
/// own bookkeeping stays out of the controllers' CPU).
#[derive(Clone, Default)]
struct Reconciled(Arc<ReconciledInner>);

#[derive(Default)]
struct ReconciledInner {
    total: AtomicU64,
    armed: AtomicBool,
    since_restart: Mutex<HashSet<String>>,
}

impl Reconciled {
    const SPAN: &str = "reconciling object";

    fn count(&self) -> usize {
        self.0.since_restart.lock().expect("reconciled lock").len()
    }

    fn total(&self) -> u64 {
        self.0.total.load(Ordering::Relaxed)
    }

    /// From now on, remember which NMCs are reconciled.
    fn arm(&self) {
        self.0
            .since_restart
            .lock()
            .expect("reconciled lock")
            .clear();
        self.0.armed.store(true, Ordering::Relaxed);
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Reconciled {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        /// The object's reference, whole once armed, else its first bytes only (enough
        /// to tell an NMC's, without an allocation per reconcile).
        struct ObjectRef {
            whole: bool,
            text: String,
        }
        impl std::fmt::Write for ObjectRef {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                let room = if self.whole {
                    s.len()
                } else {
                    NMC_REF.len().saturating_sub(self.text.len())
                };
                self.text.extend(s.chars().take(room));
                Ok(())
            }
        }
        impl tracing::field::Visit for ObjectRef {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "object.ref" {
                    use std::fmt::Write as _;
                    let _ = write!(self, "{value:?}");
                }
            }
        }
        const NMC_REF: &str = "NodeModulesConfig";
        let whole = self.0.armed.load(Ordering::Relaxed);
        let mut object = ObjectRef {
            whole,
            text: String::with_capacity(if whole { 64 } else { NMC_REF.len() }),
        };
        attrs.record(&mut object);
        if !object.text.starts_with(NMC_REF) {
            return;
        }
        self.0.total.fetch_add(1, Ordering::Relaxed);
        if whole {
            self.0
                .since_restart
                .lock()
                .expect("reconciled lock")
                .insert(object.text);
        }
    }
}

/// Logs to stderr, at the level `RUST_LOG` sets.
fn log_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::EnvFilter::from_default_env())
}

/// The controllers' process: runs them on a counting client, and answers the lines of
/// its stdin: `requests` (the counts so far, as JSON), `reconciled` (how many NMCs were
/// reconciled since the controllers started), `restart` (stop them, start them again),
/// `stop`.
async fn controllers_process(kubeconfig: &Path, selection: &Selection) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::{Layer as _, util::SubscriberInitExt as _};
    let reconciled = Reconciled::default();
    tracing_subscriber::registry()
        .with(log_layer())
        .with(
            reconciled
                .clone()
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    meta.is_span() && meta.name() == Reconciled::SPAN
                })),
        )
        .init();
    let requests = Requests::default();
    let client = counting_client(kube_config(kubeconfig).await, requests.clone());
    let mut running = Controllers::start(&client, selection);
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    while let Ok(Some(command)) = commands.next_line().await {
        let answer = match command.as_str() {
            "requests" => {
                let counts: Vec<(RequestKind, u64)> = requests.snapshot().into_iter().collect();
                serde_json::to_string(&counts).expect("counts serialize")
            }
            "reconciled" => reconciled.count().to_string(),
            "reconciles" => reconciled.total().to_string(),
            "restart" => {
                running.stop().await;
                reconciled.arm();
                running = Controllers::start(&client, selection);
                "ok".to_string()
            }
            _ => break,
        };
        out.write_all(format!("{answer}\n").as_bytes())
            .await
            .expect("answer");
        out.flush().await.expect("answer");
    }
    running.stop().await;
}

/// The harness's side of the controllers' process.
struct ControllersProcess {
    child: tokio::process::Child,
    stdin: ChildStdin,
    answers: Lines<BufReader<ChildStdout>>,
}

impl ControllersProcess {
    fn spawn(kubeconfig: &Path) -> ControllersProcess {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("this binary"))
            .env(CONTROLLERS_ENV, kubeconfig)
            // One runtime worker, as in a pod limited to one CPU (tokio sizes its runtime
            // from the CPUs the process may use): the cluster's process, at a lower
            // priority, has what the controllers leave of the two cores.
            .env("TOKIO_WORKER_THREADS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the controllers' process");
        let stdin = child.stdin.take().expect("stdin");
        let answers = BufReader::new(child.stdout.take().expect("stdout")).lines();
        ControllersProcess {
            child,
            stdin,
            answers,
        }
    }

    async fn ask(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("the controllers' process reads");
        self.stdin.flush().await.expect("flush");
        self.answers
            .next_line()
            .await
            .expect("the controllers' process answers")
            .expect("an answer")
    }

    /// Every request the controllers sent so far, by kind.
    async fn requests(&mut self) -> BTreeMap<RequestKind, u64> {
        let counts: Vec<(RequestKind, u64)> =
            serde_json::from_str(&self.ask("requests").await).expect("counts parse");
        counts.into_iter().collect()
    }

    async fn reconciled(&mut self) -> usize {
        self.ask("reconciled").await.parse().expect("a count")
    }

    /// Every NMC reconcile since the controllers' process started.
    async fn reconciles(&mut self) -> u64 {
        self.ask("reconciles").await.parse().expect("a count")
    }

    async fn restart(&mut self) {
        assert_eq!(self.ask("restart").await, "ok");
    }

    fn status_path(&self, file: &str) -> String {
        format!("/proc/{}/{file}", self.child.id().expect("running"))
    }

    fn peak_rss_mib(&self) -> f64 {
        peak_rss_mib(&self.status_path("status"))
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(&self.status_path("stat"))
    }

    async fn stop(mut self) {
        let _ = self.stdin.write_all(b"stop\n").await;
        let _ = self.stdin.flush().await;
        let _ = self.child.wait().await;
    }
}

/// Seconds a fixed walk through memory takes: 10 million dependent reads at random
/// places of a 64 MiB table, far larger than the caches. The same work every time, so it
/// measures only how fast the machine's memory answers at the moment, which is what
/// varies on a shared host (a loop in registers alone runs at the same speed throughout).
fn machine_speed_check() -> f64 {
    const SLOTS: usize = 16 << 20;
    let mut random: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next_random = move || {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random
    };
    // Sattolo's shuffle: one cycle through every slot, so the walk never settles.
    let mut table: Vec<u32> = (0..SLOTS as u32).collect();
    for i in (1..SLOTS).rev() {
        let j = (next_random() % i as u64) as usize;
        table.swap(i, j);
    }
    let started = Instant::now();
    let mut at = 0usize;
    for _ in 0..10_000_000 {
        at = table[at] as usize;
    }
    std::hint::black_box(at);
    started.elapsed().as_secs_f64()
}

fn row(what: &str, value: String, target: &str) {
    println!("| {what:<66} | {value:>36} | {target:<10} |");
}

fn header() {
    println!(
        "| {:<66} | {:>36} | {:<10} |",
        "measure", "result", "target"
    );
    println!("|{}|{}|{}|", "-".repeat(68), "-".repeat(38), "-".repeat(12));
}

#[tokio::main]
async fn main() {
    capstan_api::install_crypto_provider();
    let selection: Selection = "module-nmc,nmc".parse().expect("selection");
    if let Some(kubeconfig) = std::env::var_os(CONTROLLERS_ENV) {
        controllers_process(Path::new(&kubeconfig), &selection).await;
        return;
    }
    {
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;
        let _ = tracing_subscriber::registry().with(log_layer()).try_init();
    }
    let nodes = scale(5_000);
    let pairs = nodes * MODULES;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), nodes);
    let config = kube_config(&server.kubeconfig).await;
    let plain = kube::Client::try_from(config.clone()).expect("client");
    let nodes_ready = wait_nodes_ready(&plain, nodes).await;
    eprintln!("{nodes} nodes Ready in {:.1} s", nodes_ready.as_secs_f64());

    Api::<Namespace>::all(plain.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("ns"),
        )
        .await
        .expect("namespace");
    let mut controllers = ControllersProcess::spawn(&server.kubeconfig);

    // The machine's own speed varies from minute to minute on shared hosts: a fixed
    // loop timed before and after the rollout tells a slow run from a slow machine.
    let speed_before = machine_speed_check();

    // From empty to every module loaded everywhere.
    let modules = Api::<Module>::namespaced(plain.clone(), NAMESPACE);
    let cpu_before = (controllers.cpu_seconds(), server.cpu_seconds());
    let started = Instant::now();
    for i in 0..MODULES {
        modules
            .create(&PostParams::default(), &module(i))
            .await
            .expect("create module");
    }
    let converged = wait_converged(&plain, &selection, nodes, started, &mut controllers).await;
    let rollout = since(&controllers.requests().await, &BTreeMap::new());
    let reconciles = controllers.reconciles().await;
    let (_, loaded_pairs) = loaded(&plain).await;
    let controllers_peak_rollout = controllers.peak_rss_mib();
    let speed_after = machine_speed_check();
    let cpu_rollout = (
        controllers.cpu_seconds() - cpu_before.0,
        server.cpu_seconds() - cpu_before.1,
    );
    eprintln!(
        "converged in {:?}; {} writes",
        converged.map(|d| d.as_secs_f64()),
        rollout.writes()
    );

    // A fleet that never converged has no steady state to measure.
    let steady = match converged {
        Some(_) => Some(steady_state(&plain, &selection, &mut controllers, nodes).await),
        None => None,
    };
    let controllers_peak = controllers.peak_rss_mib();
    controllers.stop().await;
    let server_peak = server.peak_rss_mib();

    println!(
        "\ncapstan KMM controllers (module-nmc, nmc): {MODULES} Modules onto {nodes} simulated worker nodes = {pairs} (node, module) pairs"
    );
    println!(
        "cluster: `capstan cluster serve` in its own process under `nice -n {SERVER_NICE}` (below the controllers' priority); timings podStartSeconds {POD_START}, podStopSeconds {POD_STOP}, workerSeconds {WORKER}"
    );
    println!(
        "writes per pair count every controller write except Events (NMC create/spec/status/metadata, worker pods, node labels, Module status and finalizer); \
         sent counts every request, applied leaves out those the server refused (409: the pod exists, 404: it is gone)\n"
    );
    header();
    row(
        "nodes Ready, server start to all Ready (s)",
        format!("{:.2}", nodes_ready.as_secs_f64()),
        "",
    );
    row(
        "machine speed check: a fixed walk through memory before / after (s)",
        format!("{speed_before:.2} / {speed_after:.2}"),
        "",
    );
    row(
        "first Module create to converged (s)",
        converged.map_or("never".into(), |d| format!("{:.2}", d.as_secs_f64())),
        "< 60 s",
    );
    row(
        "(node, module) pairs loaded when the measure ended",
        format!("{loaded_pairs} of {pairs}"),
        "",
    );
    row(
        "API writes, total (with Events)",
        format!("{}", rollout.writes()),
        "",
    );
    row(
        "API writes per (node, module) pair, without Events: sent",
        format!(
            "{:.2}",
            rollout.writes_without_events() as f64 / pairs as f64
        ),
        "<= 4",
    );
    row(
        "API writes per (node, module) pair, without Events: applied",
        format!(
            "{:.2}",
            (rollout.writes_without_events() - rollout.refused_writes_without_events()) as f64
                / pairs as f64
        ),
        "<= 4",
    );
    for (label, (n, refused)) in rollout.write_rows() {
        row(
            &format!("  {label}"),
            format!(
                "{n} ({:.2}/pair){}",
                n as f64 / pairs as f64,
                refusals(&refused)
            ),
            "",
        );
    }
    row(
        "API reads during the rollout (GET, LIST, WATCH)",
        format!("{}", rollout.reads()),
        "",
    );
    row(
        "  of which NMC GETs (cache behind the reconciler's own write)",
        format!("{}", rollout.count("GET", "nodemodulesconfigs")),
        "",
    );
    row(
        "NMC reconciles during the rollout (per node)",
        format!("{reconciles} ({:.1})", reconciles as f64 / nodes as f64),
        "",
    );
    row(
        "CPU seconds during the rollout: controllers' process",
        format!("{:.1}", cpu_rollout.0),
        "",
    );
    row(
        "CPU seconds during the rollout: cluster server process",
        format!("{:.1}", cpu_rollout.1),
        "",
    );
    row(
        "controllers' process peak resident memory after rollout (MiB)",
        format!("{controllers_peak_rollout:.0}"),
        "< 500 MiB",
    );
    row(
        "controllers' process peak resident memory at the end (MiB)",
        format!("{controllers_peak:.0}"),
        "< 500 MiB",
    );
    row(
        "cluster server process peak resident memory (MiB)",
        format!("{server_peak:.0}"),
        "",
    );
    let skipped = || "skipped: never converged".to_string();
    row(
        &format!(
            "steady state: writes in a quiet {} s window",
            QUIET.as_secs()
        ),
        steady
            .as_ref()
            .map_or_else(skipped, |s| s.quiet.writes().to_string()),
        "0",
    );
    row(
        "steady state: controllers restarted, fleet reconciled again (s)",
        steady.as_ref().map_or_else(skipped, |s| {
            s.resynced
                .map_or("never".into(), |d| format!("{:.2}", d.as_secs_f64()))
        }),
        "",
    );
    row(
        &format!(
            "steady state: writes of that restart, to {} s after",
            QUIET.as_secs()
        ),
        steady
            .as_ref()
            .map_or_else(skipped, |s| s.restart.writes().to_string()),
        "0",
    );
    if let Some(steady) = &steady {
        if steady.quiet.writes() > 0 {
            println!("\nquiet window writes: {}", steady.quiet.write_summary());
        }
        if steady.restart.writes() > 0 {
            println!("restart writes: {}", steady.restart.write_summary());
        }
    }
    let others: Vec<String> = rollout
        .write_rows()
        .keys()
        .filter(|l| l.starts_with("other"))
        .cloned()
        .collect();
    if !others.is_empty() {
        println!("unclassified writes: {others:?}");
    }
}
