//! `capstan plan --kubeconfig` against `kubectl diff --server-side` on the real
//! kube-apiserver (`capstan_real_cluster`), side by side in one run.
//!
//! A fleet repository of 2,000 objects (20 namespaces, each with a Deployment, a Service and
//! ConfigMaps, plus a KMM Module) is applied with `capstan sync --once`; a commit then
//! changes a tenth of them. Both tools compare that commit with the cluster, alternating,
//! five times each: `capstan plan --kubeconfig K --repo R` and `kubectl diff --server-side
//! --force-conflicts --field-manager=capstan -R -f R/fleet`, both server-side apply dry
//! runs of the same manifests. kubectl is built from the same Kubernetes release as the API
//! server (`hack/real-cluster/build-kubectl`, run here; a no-op when up to date).
//!
//! `cargo bench --bench plan_real`; `BENCH_SCALE=0.1` for a tenth of the objects.

mod common;

use std::io::Read;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use capstan_cluster::sim::config::ClusterConfig;
use capstan_real_cluster::ControlPlane;
use capstan_testing::git::FleetRepo;
use capstan_testing::manifests::{NAMESPACE, module};

/// Objects of the full load.
const OBJECTS: usize = 2_000;
/// Namespaces the fleet's objects are spread over.
const NAMESPACES: usize = 20;
/// Timed runs of each tool.
const RUNS: usize = 5;
/// The folder of the repository holding the manifests, which kubectl is given.
const FLEET: &str = "fleet";

/// The manifests of a fleet of `count` objects (path, YAML); with `changed`, every tenth
/// object of the fleet's own namespaces carries revision `changed` instead of `base`.
fn fleet(count: usize, changed: bool) -> Vec<(String, String)> {
    let mut files = vec![
        (
            format!("{FLEET}/kmm-demo/namespace.yaml"),
            NAMESPACE.to_string(),
        ),
        (
            format!("{FLEET}/kmm-demo/module.yaml"),
            module("kmod-fleet", "v1"),
        ),
    ];
    let revision = |index: usize| {
        if changed && index.is_multiple_of(10) {
            "changed"
        } else {
            "base"
        }
    };
    let namespace = |n: usize| format!("fleet-{n:02}");
    for n in 0..NAMESPACES {
        let text = namespace_yaml(&namespace(n), revision(files.len()));
        files.push((format!("{FLEET}/{}/namespace.yaml", namespace(n)), text));
    }
    for n in 0..NAMESPACES {
        let text = deployment_yaml(&namespace(n), revision(files.len()));
        files.push((format!("{FLEET}/{}/deployment.yaml", namespace(n)), text));
        let text = service_yaml(&namespace(n), revision(files.len()));
        files.push((format!("{FLEET}/{}/service.yaml", namespace(n)), text));
    }
    let mut map = 0;
    while files.len() < count {
        let ns = namespace(map % NAMESPACES);
        let text = config_map_yaml(&ns, map, revision(files.len()));
        files.push((format!("{FLEET}/{ns}/settings-{map:04}.yaml"), text));
        map += 1;
    }
    files
}

fn namespace_yaml(name: &str, revision: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels:\n    revision: \"{revision}\"\n"
    )
}

fn deployment_yaml(namespace: &str, revision: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {namespace}
  labels:
    app: web
    revision: "{revision}"
spec:
  replicas: 1
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
        - name: web
          image: registry.example/org/web:1.0
          ports:
            - containerPort: 8080
"#
    )
}

fn service_yaml(namespace: &str, revision: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {namespace}
  labels:
    app: web
    revision: "{revision}"
spec:
  selector:
    app: web
  ports:
    - port: 80
      targetPort: 8080
"#
    )
}

fn config_map_yaml(namespace: &str, index: usize, revision: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{index:04}\n  namespace: {namespace}\n  labels:\n    app: fleet\n    revision: \"{revision}\"\ndata:\n  value: \"{revision}\"\n  replicas: \"3\"\n"
    )
}

/// One finished run of a command.
struct Run {
    wall: Duration,
    /// The process's peak resident memory (wait4's `ru_maxrss`, which covers the children
    /// it waited for too: kubectl's `diff`).
    peak_rss_mib: f64,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `command` to its end, reading its output as it comes, and measures it.
#[allow(
    clippy::zombie_processes,
    reason = "wait4 reaps the child, reporting its usage"
)]
fn measure(mut command: Command) -> Run {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {:?}: {e}", command.get_program()));
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("piped stderr")));
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child, whose pid we
    // hold, and `child` is not waited on again.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    assert!(waited > 0, "wait4: {}", std::io::Error::last_os_error());
    Run {
        wall,
        peak_rss_mib: usage.ru_maxrss as f64 / 1024.0,
        status: ExitStatus::from_raw(status),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

/// The median of `values`, which is not empty.
fn median<T: PartialOrd + Copy>(values: &[T]) -> T {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    sorted[sorted.len() / 2]
}

fn capstan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_capstan"))
}

fn plan(repo: &Path, kubeconfig: &Path, format: &str) -> Command {
    let mut command = capstan();
    command
        .args(["plan", "--detailed-exitcode", "--format", format, "--repo"])
        .arg(repo)
        .arg("--kubeconfig")
        .arg(kubeconfig);
    command
}

fn diff(kubectl: &Path, repo: &Path, kubeconfig: &Path, cache: &Path) -> Command {
    let mut command = Command::new(kubectl);
    command
        .args([
            "diff",
            "--server-side",
            "--force-conflicts",
            "--field-manager=capstan",
            "-R",
            "-f",
        ])
        .arg(repo.join(FLEET))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache);
    command
}

/// What a run says went wrong, for a failed check.
fn explain(what: &str, run: &Run) -> String {
    format!(
        "{what} exited with {}:\n{}",
        run.status,
        run.stderr.lines().take(30).collect::<Vec<_>>().join("\n")
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let count = common::scale(OBJECTS).max(4 * NAMESPACES);
    let kubectl = capstan_real_cluster::kubectl().expect("kubectl of the release");
    let kubectl_version = Command::new(&kubectl)
        .args(["version", "--client", "-o", "yaml"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    let kubectl_version = kubectl_version
        .lines()
        .find_map(|l| l.trim().strip_prefix("gitVersion: "))
        .unwrap_or("unknown")
        .to_string();

    let plane = ControlPlane::start(&ClusterConfig::default_cluster())
        .await
        .expect("the real control plane starts (hack/real-cluster/build)");
    let client = plane.client().await.expect("client");
    capstan_real_cluster::install_crds(&client, capstan_api::crds::all())
        .await
        .expect("CRDs");
    let scratch = tempfile::tempdir().expect("scratch");
    let kubeconfig = scratch.path().join("kubeconfig");
    std::fs::write(&kubeconfig, plane.kubeconfig()).expect("kubeconfig");
    let kubectl_cache = scratch.path().join("kubectl-cache");

    let mut repo = FleetRepo::new();
    let base = fleet(count, false);
    let head = fleet(count, true);
    let changed = base.iter().zip(&head).filter(|(b, h)| b.1 != h.1).count();
    repo.commit_set(&base, "Fleet");

    let mut sync = capstan();
    sync.args([
        "sync",
        "--once",
        "--controllers",
        "none",
        "--listen",
        "127.0.0.1:0",
    ])
    .arg("--repo")
    .arg(repo.path())
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .arg("--state-dir")
    .arg(scratch.path().join("state"));
    let synced = measure(sync);
    assert!(
        synced.status.success(),
        "{}",
        explain("capstan sync --once", &synced)
    );
    repo.commit_set(&head, "Change a tenth");

    // Both tools see the change before either is timed; the first run of each also warms
    // the server's caches and kubectl's discovery cache.
    let checked = measure(plan(repo.path(), &kubeconfig, "json"));
    assert_eq!(
        checked.status.code(),
        Some(2),
        "{}",
        explain("capstan plan", &checked)
    );
    let summary: serde_json::Value = serde_json::from_str(&checked.stdout).expect("plan JSON");
    let planned = summary["summary"]["configure"].as_u64().unwrap_or(0);
    let diffed = measure(diff(&kubectl, repo.path(), &kubeconfig, &kubectl_cache));
    assert_eq!(
        diffed.status.code(),
        Some(1),
        "{}",
        explain("kubectl diff", &diffed)
    );
    let differing = diffed
        .stdout
        .lines()
        .filter(|l| l.starts_with("diff "))
        .count();

    let mut capstan_runs = Vec::new();
    let mut kubectl_runs = Vec::new();
    for _ in 0..RUNS {
        let run = measure(plan(repo.path(), &kubeconfig, "text"));
        assert_eq!(
            run.status.code(),
            Some(2),
            "{}",
            explain("capstan plan", &run)
        );
        capstan_runs.push(run);
        let run = measure(diff(&kubectl, repo.path(), &kubeconfig, &kubectl_cache));
        assert_eq!(
            run.status.code(),
            Some(1),
            "{}",
            explain("kubectl diff", &run)
        );
        kubectl_runs.push(run);
    }
    let wall = |runs: &[Run]| median(&runs.iter().map(|r| r.wall).collect::<Vec<_>>());
    let rss = |runs: &[Run]| runs.iter().map(|r| r.peak_rss_mib).fold(f64::NAN, f64::max);
    let (capstan_wall, kubectl_wall) = (wall(&capstan_runs), wall(&kubectl_runs));
    let (capstan_rss, kubectl_rss) = (rss(&capstan_runs), rss(&kubectl_runs));

    println!(
        "\n{count} objects in {NAMESPACES} namespaces applied by `capstan sync --once` in {:.1} s; \
         head changes {changed}: capstan plans {planned} to configure, kubectl diffs {differing} \
         objects. kubectl {kubectl_version}. Median of {RUNS} alternating runs each.\n",
        synced.wall.as_secs_f64()
    );
    let rows = [
        [
            "capstan plan --kubeconfig".to_string(),
            format!("{:.3}", capstan_wall.as_secs_f64()),
            format!("{capstan_rss:.0}"),
        ],
        [
            "kubectl diff --server-side".to_string(),
            format!("{:.3}", kubectl_wall.as_secs_f64()),
            format!("{kubectl_rss:.0}"),
        ],
        [
            "ratio kubectl / capstan".to_string(),
            format!(
                "{:.1}x",
                kubectl_wall.as_secs_f64() / capstan_wall.as_secs_f64()
            ),
            format!("{:.1}x", kubectl_rss / capstan_rss),
        ],
    ];
    println!("| command                    | wall time (s) | peak RSS (MiB) |");
    println!("|----------------------------|--------------:|---------------:|");
    for [what, time, memory] in &rows {
        println!("| {what:26} | {time:>13} | {memory:>14} |");
    }
    plane.shutdown().await;
}
