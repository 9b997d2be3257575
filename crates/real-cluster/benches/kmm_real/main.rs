//! KMM controllers on the real kube-apiserver: capstan's Module -> NMC and NMC controllers,
//! the floor (only the writes a rollout cannot avoid, see [`floor`]) and upstream KMM's
//! operator manager each load 10 Modules onto a fleet of kwok worker nodes from empty. Each
//! system gets a fresh control plane of the same build and the same fleet, one after the
//! other in the same run, so none inherits another's objects.
//!
//! Measured per system: the time from the Modules' creation until every NodeModulesConfig
//! status lists all 10 modules; the API writes its client made until then (from the API
//! server's audit log, by user agent), per (node, module) pair; its process's CPU seconds
//! and peak memory (VmHWM); and its writes in the 30 s after convergence (should be 0).
//! kwok plays the kubelets: worker pods and KMM's image-pull pods succeed at once.
//!
//! ```sh
//! hack/real-cluster/build && hack/real-cluster/kmm/build
//! KMM_REAL_NODES=1000 cargo bench -p capstan-real-cluster --bench kmm_real
//! ```
//!
//! `KMM_REAL_NODES` lists the fleet sizes (default `1000,5000`); `KMM_REAL_SYSTEMS` the
//! systems (default `capstan,floor,kmm`). Upstream's manager is
//! `$CAPSTAN_KMM_MANAGER`, else the one `hack/real-cluster/kmm/build` builds into the
//! cache (see [`capstan_real_cluster::kmm`]); when it cannot be had, the table says so and
//! capstan is measured alone.
//!
//! A system that has not converged by the deadline (`KMM_REAL_DEADLINE`, seconds, default
//! 1800) is measured where it stands: the pairs it loaded, its writes, CPU and memory so
//! far. The table's rows per 1,000 pairs loaded (minutes, CPU seconds, and writes per pair)
//! then still compare the two.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capstan::controllers::{self, Context, Selection};
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_cluster::sim::config::ClusterConfig;
use capstan_real_cluster::{ControlPlane, Options, install_crds};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod floor;

const MODULES: usize = 10;
const NAMESPACE: &str = "kmm-bench";
const STEADY: Duration = Duration::from_secs(30);
const DEADLINE_ENV: &str = "KMM_REAL_DEADLINE";
const DEFAULT_DEADLINE: Duration = Duration::from_secs(1800);
const POLL: Duration = Duration::from_secs(1);
/// The user agent capstan's controllers send, so the audit log tells their writes apart.
const CAPSTAN_AGENT: &str = "capstan-kmm-real";
/// The user agent of the floor's client.
const FLOOR_AGENT: &str = "capstan-kmm-floor";
/// Set to a kubeconfig's path, it makes this binary capstan's controllers' process.
const CONTROLLERS_ENV: &str = "CAPSTAN_KMM_REAL_CONTROLLERS";
/// Set to a kubeconfig's path, it makes this binary the floor's process.
const FLOOR_ENV: &str = "CAPSTAN_KMM_REAL_FLOOR";
const NODES_ENV: &str = "KMM_REAL_NODES";
const SYSTEMS_ENV: &str = "KMM_REAL_SYSTEMS";

#[derive(Clone, Copy, PartialEq)]
enum System {
    Capstan,
    Floor,
    Kmm,
}

impl System {
    const ALL: [System; 3] = [System::Capstan, System::Floor, System::Kmm];

    fn name(self) -> &'static str {
        match self {
            System::Capstan => "capstan",
            System::Floor => "floor",
            System::Kmm => "kmm",
        }
    }

    /// The table's column.
    fn title(self) -> &'static str {
        match self {
            System::Capstan => "capstan",
            System::Floor => "floor",
            System::Kmm => "upstream KMM v2.6.0",
        }
    }

    fn is_client(self, agent: &str) -> bool {
        match self {
            System::Capstan => agent == CAPSTAN_AGENT,
            System::Floor => agent == FLOOR_AGENT,
            System::Kmm => agent.starts_with(capstan_real_cluster::kmm::USER_AGENT_PREFIX),
        }
    }
}

/// What one system did on one fleet, until it converged or the deadline passed.
struct Run {
    /// From the Modules' creation to convergence, or to the deadline.
    elapsed: Duration,
    converged: bool,
    /// (node, module) pairs listed in NMC statuses at the end.
    loaded: usize,
    writes: Writes,
    cpu_seconds: f64,
    peak_mib: f64,
    steady: Writes,
}

/// Writes by (verb, resource[/subresource]), from the audit log.
#[derive(Default)]
struct Writes(BTreeMap<String, u64>);

impl Writes {
    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn since(&self, before: &Writes) -> Writes {
        Writes(
            self.0
                .iter()
                .map(|(k, n)| (k.clone(), n - before.0.get(k).copied().unwrap_or(0)))
                .filter(|(_, n)| *n > 0)
                .collect(),
        )
    }

    fn summary(&self) -> String {
        if self.0.is_empty() {
            return "none".into();
        }
        self.0
            .iter()
            .map(|(k, n)| format!("{k}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The writes of `system`'s client in the audit log at `path`.
fn audited_writes(path: &Path, system: System) -> Writes {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut writes = Writes::default();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if !system.is_client(event["userAgent"].as_str().unwrap_or_default()) {
            continue;
        }
        let object = &event["objectRef"];
        let mut what = format!(
            "{} {}",
            event["verb"].as_str().unwrap_or_default(),
            object["resource"].as_str().unwrap_or_default()
        );
        if let Some(sub) = object["subresource"].as_str() {
            what.push('/');
            what.push_str(sub);
        }
        let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
        if code >= 400 {
            what.push_str(&format!(" ({code})"));
        }
        *writes.0.entry(what).or_default() += 1;
    }
    writes
}

/// CPU seconds (user and system) of the process `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
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

/// VmHWM (peak resident memory) of the process `pid`, in MiB.
fn peak_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The default cluster's control-plane node and `workers` copies of its first worker.
fn fleet(workers: usize) -> ClusterConfig {
    let mut config = ClusterConfig::default_cluster();
    let worker = config
        .nodes
        .iter()
        .find(|n| n.role == "worker")
        .cloned()
        .expect("the default cluster has workers");
    config.nodes.retain(|n| n.role != "worker");
    config.nodes.extend((0..workers).map(|i| {
        let mut node = worker.clone();
        node.name = format!("worker-{i:05}");
        node
    }));
    config
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

/// How many NMCs list all [`MODULES`] modules in their status, and how many (node, module)
/// pairs their statuses list in all.
async fn loaded_modules(client: &kube::Client) -> (usize, usize) {
    let resource = ApiResource::erase::<NodeModulesConfig>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return (0, 0);
    };
    list.items
        .iter()
        .map(|nmc| nmc.data["status"]["modules"].as_array().map_or(0, Vec::len))
        .fold((0, 0), |(complete, pairs), n| {
            (complete + usize::from(n == MODULES), pairs + n)
        })
}

fn deadline() -> Duration {
    std::env::var(DEADLINE_ENV).map_or(DEFAULT_DEADLINE, |s| {
        Duration::from_secs(s.trim().parse().expect("KMM_REAL_DEADLINE: seconds"))
    })
}

/// Where the controllers' logs are kept after the control plane's directory is gone.
fn log_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("capstan-kmm-real");
    std::fs::create_dir_all(&dir).expect("log directory");
    dir
}

/// The controllers of `system`, started against `plane`.
async fn start_controllers(
    system: System,
    plane: &ControlPlane,
    client: &kube::Client,
    workers: usize,
) -> anyhow::Result<Child> {
    let kubeconfig = plane.dir().join("admin.kubeconfig");
    let log = log_dir().join(format!("{}-{workers}.log", system.name()));
    if system == System::Kmm {
        return capstan_real_cluster::kmm::start(client, &kubeconfig, &log).await;
    }
    let log = std::fs::File::create(log)?;
    let role = match system {
        System::Floor => FLOOR_ENV,
        _ => CONTROLLERS_ENV,
    };
    Ok(Command::new(std::env::current_exe()?)
        .env(role, &kubeconfig)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}

/// Loads [`MODULES`] Modules onto `workers` nodes with `system`'s controllers.
async fn run(system: System, workers: usize) -> anyhow::Result<Run> {
    let started = Instant::now();
    let plane = ControlPlane::start_with(
        &fleet(workers),
        &Options {
            audit_writes: true,
            // Thousands of kwok nodes' leases, renewed beside a saturated API server, would
            // lapse and take nodes out of the fleet mid-rollout.
            node_monitor_grace_period: Some(Duration::from_secs(600)),
            ..Options::default()
        },
    )
    .await?;
    eprintln!(
        "{} x{workers}: control plane up in {:.0?}",
        system.name(),
        started.elapsed()
    );
    let client = plane.client().await?;
    install_crds(&client, capstan_api::crds::all()).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;
    let mut child = start_controllers(system, &plane, &client, workers).await?;
    let pid = child.id();
    let result = measure(system, &plane, &client, workers, pid).await;
    let _ = child.kill();
    let _ = child.wait();
    plane.shutdown().await;
    result
}

async fn measure(
    system: System,
    plane: &ControlPlane,
    client: &kube::Client,
    workers: usize,
    pid: u32,
) -> anyhow::Result<Run> {
    let modules: Api<Module> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = deadline();
    let started = Instant::now();
    for i in 0..MODULES {
        modules.create(&PostParams::default(), &module(i)).await?;
    }
    let (converged, loaded) = loop {
        let (complete, loaded) = loaded_modules(client).await;
        if complete == workers {
            break (true, loaded);
        }
        if started.elapsed() >= deadline {
            break (false, loaded);
        }
        anyhow::ensure!(
            std::fs::metadata(format!("/proc/{pid}")).is_ok(),
            "{}'s controllers exited (log in {})",
            system.name(),
            log_dir().display()
        );
        tokio::time::sleep(POLL).await;
    };
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(pid);
    let writes = audited_writes(&plane.audit_log(), system);
    eprintln!(
        "{} x{workers}: {} in {elapsed:.1?}, {loaded} of {} pairs loaded, {} writes",
        system.name(),
        if converged {
            "converged"
        } else {
            "stopped at the deadline"
        },
        workers * MODULES,
        writes.total()
    );
    // Writes after the deadline are the unfinished rollout's, not a steady state's.
    let steady = if converged {
        tokio::time::sleep(STEADY).await;
        audited_writes(&plane.audit_log(), system).since(&writes)
    } else {
        Writes::default()
    };
    Ok(Run {
        elapsed,
        converged,
        loaded,
        writes,
        cpu_seconds: cpu,
        peak_mib: peak_mib(pid),
        steady,
    })
}

/// A client of the administrator's `kubeconfig` that sends `agent`, so the audit log
/// tells its writes apart.
async fn client(kubeconfig: &Path, agent: &'static str) -> kube::Client {
    capstan_api::install_crypto_provider();
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).expect("kubeconfig parses");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(agent),
    ));
    kube::Client::try_from(config).expect("client")
}

/// The controllers' process: capstan's Module -> NMC and NMC controllers until killed.
async fn controllers_process(kubeconfig: &Path) {
    let client = client(kubeconfig, CAPSTAN_AGENT).await;
    let selection: Selection = "module-nmc,nmc".parse().expect("selection");
    controllers::run(Context::new(client, CancellationToken::new()), &selection).await;
}

/// `over` / `under`, with two decimals below 10 (a ratio to the floor is read near 1); the
/// values themselves when `under` is 0.
fn ratio(under: f64, over: f64) -> String {
    if under > 0.0 {
        let share = over / under;
        if share < 10.0 {
            format!("{share:.2}x")
        } else {
            format!("{share:.1}x")
        }
    } else if over > 0.0 {
        format!("0 against {over:.0}")
    } else {
        "-".into()
    }
}

/// A row of the table: its label, its value from a run (`None` where the run has none),
/// and its decimals. Every row is a cost, so KMM / capstan above 1 is capstan's lead.
type Row = (&'static str, fn(&Run) -> Option<f64>, usize);

/// Per 1,000 (node, module) pairs loaded, so a run stopped at the deadline compares too.
fn per_thousand_pairs(run: &Run, value: f64) -> Option<f64> {
    (run.loaded > 0).then(|| value * 1000.0 / run.loaded as f64)
}

const ROWS: [Row; 7] = [
    (
        "time to converge (s)",
        |r| r.converged.then_some(r.elapsed.as_secs_f64()),
        1,
    ),
    (
        "minutes per 1,000 pairs loaded",
        |r| per_thousand_pairs(r, r.elapsed.as_secs_f64() / 60.0),
        2,
    ),
    (
        "API writes per pair loaded",
        |r| per_thousand_pairs(r, r.writes.total() as f64 / 1000.0),
        2,
    ),
    ("CPU seconds", |r| Some(r.cpu_seconds), 1),
    (
        "CPU seconds per 1,000 pairs loaded",
        |r| per_thousand_pairs(r, r.cpu_seconds),
        1,
    ),
    ("peak memory (MiB)", |r| Some(r.peak_mib), 0),
    (
        "writes in 30 s after convergence",
        |r| r.converged.then_some(r.steady.total() as f64),
        0,
    ),
];

/// One fleet size's runs, by system; a system not asked for is missing.
struct Results {
    workers: usize,
    runs: Vec<(System, anyhow::Result<Run>)>,
}

impl Results {
    fn run(&self, system: System) -> Option<&anyhow::Result<Run>> {
        self.runs.iter().find(|(s, _)| *s == system).map(|(_, r)| r)
    }
}

/// A cell of `system`'s column for `row`.
fn cell(results: &Results, system: System, (_, value, digits): Row) -> String {
    let pairs = results.workers * MODULES;
    match results.run(system) {
        Some(Ok(run)) => match value(run) {
            Some(v) => format!("{v:.digits$}"),
            None => format!(
                "not reached: {} of {pairs} pairs in {:.0} s",
                run.loaded,
                run.elapsed.as_secs_f64()
            ),
        },
        Some(Err(_)) | None => "not run".into(),
    }
}

/// `over` / `under` for `row`, where both have a value; a time `over` did not reach is
/// longer than its deadline.
fn share(results: &Results, under: System, over: System, row: Row) -> String {
    let (label, value, _) = row;
    match (results.run(under), results.run(over)) {
        (Some(Ok(u)), Some(Ok(o))) => match (value(u), value(o)) {
            (Some(u), Some(o)) => ratio(u, o),
            (Some(u), None) if label.starts_with("time") => {
                format!("> {:.1}x", o.elapsed.as_secs_f64() / u)
            }
            _ => "-".into(),
        },
        _ => "-".into(),
    }
}

fn print_table(results: &[Results]) {
    println!("\nKMM controllers on the real kube-apiserver (kwok nodes x {MODULES} Modules)\n");
    println!(
        "| nodes | measure | {} | {} | capstan / floor | {} | KMM / capstan |",
        System::Capstan.title(),
        System::Floor.title(),
        System::Kmm.title()
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for fleet in results {
        for row in ROWS {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                fleet.workers,
                row.0,
                cell(fleet, System::Capstan, row),
                cell(fleet, System::Floor, row),
                share(fleet, System::Floor, System::Capstan, row),
                cell(fleet, System::Kmm, row),
                share(fleet, System::Capstan, System::Kmm, row),
            );
        }
    }
    for fleet in results {
        let workers = fleet.workers;
        for (system, run) in &fleet.runs {
            let name = system.title();
            match run {
                Ok(run) if run.converged => println!(
                    "\n{name} x{workers}: {} writes to converge: {}\n{name} x{workers}: steady state: {}",
                    run.writes.total(),
                    run.writes.summary(),
                    run.steady.summary()
                ),
                Ok(run) => println!(
                    "\n{name} x{workers}: {} writes until the deadline: {}",
                    run.writes.total(),
                    run.writes.summary()
                ),
                Err(error) => println!("\n{name} x{workers}: not run: {error:#}"),
            }
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    if let Some(kubeconfig) = std::env::var_os(CONTROLLERS_ENV) {
        runtime.block_on(controllers_process(Path::new(&kubeconfig)));
        return;
    }
    if let Some(kubeconfig) = std::env::var_os(FLOOR_ENV) {
        runtime.block_on(floor::process(
            Path::new(&kubeconfig),
            FLOOR_AGENT,
            NAMESPACE,
            MODULES,
        ));
        return;
    }
    let sizes: Vec<usize> = std::env::var(NODES_ENV)
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("KMM_REAL_NODES: node counts like 1000,5000")
        })
        .collect();
    let systems: Vec<System> = std::env::var(SYSTEMS_ENV).map_or(System::ALL.to_vec(), |s| {
        s.split(',')
            .map(|name| {
                System::ALL
                    .into_iter()
                    .find(|system| system.name() == name.trim())
                    .expect("KMM_REAL_SYSTEMS: names like capstan,floor,kmm")
            })
            .collect()
    });
    let mut results = Vec::new();
    for workers in sizes {
        let mut runs = Vec::new();
        for &system in &systems {
            let run = runtime.block_on(run(system, workers));
            if let Err(error) = &run {
                eprintln!("{} x{workers}: {error:#}", system.name());
            }
            runs.push((system, run));
        }
        results.push(Results { workers, runs });
    }
    print_table(&results);
}
