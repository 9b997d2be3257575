//! kill -9 campaigns over an ordered upgrade: `capstan sync` (a child process) is killed
//! with SIGKILL at crash points (`CAPSTAN_CRASH_AT`, src/crash.rs) before and after its
//! history records, label writes, worker-pod creations and status writes, new commits land
//! while it is down, and after every restart the upgrade goes on. At the end each node has
//! each of its four steps recorded exactly once, against the commit and pull request that
//! relabelled it; no node ever went from one version to another without an unload between,
//! and no device plugin ran while its module was not loaded. The second campaign also kills
//! the embedded cluster's process (`capstan cluster serve`) and restarts it on its state
//! dir in the middle.
//!
//! Each campaign is seeded: the seed picks when each commit lands and which crash point,
//! and which hit of it, ends each run. `CAPSTAN_KILL_SEED=N` replays seed N alone (a
//! failure prints its seed), `CAPSTAN_KILL_SEEDS=N` runs seeds 1 to N, and
//! `CAPSTAN_KILL_KEEP=1` keeps each seed's folder (`sync.log`, `cluster.log`). Which write
//! a hit falls on can vary with timing; what is asserted holds for any.

use crate::common;
use crate::upgrade;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capstan::crash::{CRASH_AT_VAR, POINTS};
use capstan_api::GitSync;
use capstan_cluster::sim::config::ClusterConfig;
use common::git::FleetRepo;
use common::manifests::config_map;
use k8s_openapi::api::core::v1::{Event, Namespace, Node};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use upgrade::{NS, STEPS, label, module};

const NODES: [&str; 3] = ["worker-1", "worker-2", "worker-3"];
/// Runs of capstan that end at a crash point (or, when it is not reached, once the
/// cluster is at rest); a last run finishes the upgrade.
const ARMED_RUNS: usize = 6;
/// Each armed point kills at one of its first hits.
const MOST_HITS: u64 = 3;
const SEED_VAR: &str = "CAPSTAN_KILL_SEED";
const SEEDS_VAR: &str = "CAPSTAN_KILL_SEEDS";
/// Set: each seed's folder (repository, logs, cluster state) is kept.
const KEEP_VAR: &str = "CAPSTAN_KILL_KEEP";
/// Seeds CI runs: the first campaign, the one that also kills the cluster.
const CI_SEEDS: u64 = 3;
const CI_SEEDS_CLUSTER: u64 = 2;
/// Seeds of the first campaign on a real server: the crash points are capstan's own, the
/// same on both servers, and each seed there costs most of a minute of CI.
const CI_SEEDS_REAL: u64 = 1;

/// The hits a run reaches surely enough: a sync writes its status twice and its record
/// once per commit; an upgrade step has a record and a label write, a node two worker pods
/// and two ready-label writes.
fn most_hits(point: &str) -> u64 {
    match point {
        "sync.status.before" | "sync.status.after" => 2,
        "sync.record.before" | "sync.record.after" => 1,
        _ => MOST_HITS,
    }
}

/// The seeds to run.
fn seeds(default: u64) -> Vec<u64> {
    let number = |var: &str| {
        std::env::var(var).ok().map(|v| {
            v.parse::<u64>()
                .unwrap_or_else(|_| panic!("{var}={v}: not a number"))
        })
    };
    if let Some(seed) = number(SEED_VAR) {
        return vec![seed];
    }
    (1..=number(SEEDS_VAR).unwrap_or(default)).collect()
}

// ---- the plan of a seed ----

/// A commit of the campaign and the run before which it lands (capstan is down then).
struct Landing {
    message: &'static str,
    files: Vec<(&'static str, String)>,
    before_run: usize,
    /// The node it relabels.
    node: Option<&'static str>,
    pull_request: u64,
}

/// What a seed does.
struct Plan {
    landings: Vec<Landing>,
    /// The crash point and hit ending each armed run.
    kills: Vec<(&'static str, u64)>,
    /// The runs during which the cluster is killed too, after how many more step records.
    cluster_kills: BTreeMap<usize, usize>,
}

impl Plan {
    fn of(seed: u64, kill_cluster: bool) -> Plan {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(2).wrapping_add(kill_cluster as u64));
        let first = rng.random_range(0..=1);
        let second = rng.random_range(first + 1..=3);
        let third = rng.random_range(second..=4);
        let landings = vec![
            Landing {
                message: "Merge pull request #2 from fleet/my-kmod-v2",
                files: vec![("module.yaml", module("v2"))],
                before_run: 0,
                node: None,
                pull_request: 2,
            },
            Landing {
                message: "Merge pull request #3 from fleet/worker-1-v2",
                files: vec![("nodes/worker-1.yaml", label("worker-1", "v2"))],
                before_run: first,
                node: Some("worker-1"),
                pull_request: 3,
            },
            Landing {
                message: "Merge pull request #4 from fleet/worker-2-v2",
                files: vec![("nodes/worker-2.yaml", label("worker-2", "v2"))],
                before_run: second,
                node: Some("worker-2"),
                pull_request: 4,
            },
            Landing {
                message: "Merge pull request #5 from fleet/worker-3-v2",
                files: vec![
                    ("nodes/worker-3.yaml", label("worker-3", "v2")),
                    ("settings.yaml", config_map("settings", "b")),
                ],
                before_run: third,
                node: Some("worker-3"),
                pull_request: 5,
            },
        ];
        // A run after a landing may die in the sync; the others in the controllers.
        let kills = (0..ARMED_RUNS)
            .map(|run| {
                let landed = landings.iter().any(|l| l.before_run == run);
                let sync = landed && rng.random_bool(0.5);
                let points: Vec<&'static str> = POINTS
                    .iter()
                    .copied()
                    .filter(|p| p.starts_with("sync.") == sync)
                    // The campaign's fleet notifies nothing (tests/integration/notifications.rs
                    // kills at those).
                    .filter(|p| !p.starts_with("notify."))
                    .collect();
                let point = points[rng.random_range(0..points.len())];
                (point, rng.random_range(1..=most_hits(point)))
            })
            .collect();
        let mut cluster_kills = BTreeMap::new();
        if kill_cluster {
            while cluster_kills.len() < 2 {
                cluster_kills.insert(rng.random_range(0..ARMED_RUNS), rng.random_range(1..=2));
            }
        }
        Plan {
            landings,
            kills,
            cluster_kills,
        }
    }

    fn describe(&self) -> String {
        let landed: Vec<String> = self
            .landings
            .iter()
            .map(|l| format!("#{} before run {}", l.pull_request, l.before_run))
            .collect();
        let kills: Vec<String> = self.kills.iter().map(|(p, n)| format!("{p}:{n}")).collect();
        let mut text = format!("lands {}; kills {}", landed.join(", "), kills.join(", "));
        if !self.cluster_kills.is_empty() {
            let runs: Vec<String> = self
                .cluster_kills
                .iter()
                .map(|(run, after)| format!("run {run} after {after} step(s)"))
                .collect();
            text.push_str(&format!("; cluster killed in {}", runs.join(", ")));
        }
        text
    }
}

// ---- figures ----

#[derive(Debug, Default)]
struct Figures {
    seeds: usize,
    /// The crash points that killed capstan.
    points_hit: BTreeSet<&'static str>,
    kills_at_points: usize,
    kills_at_rest: usize,
    restarts: usize,
    cluster_restarts: usize,
    steps: usize,
    duplicates: usize,
    missing: usize,
    wrong_commits: usize,
    unexpected: usize,
    event_duplicates: usize,
    events_missing: usize,
    violations: usize,
    relists: usize,
}

impl Figures {
    fn add(&mut self, other: &Figures) {
        self.seeds += other.seeds;
        self.points_hit.extend(&other.points_hit);
        self.kills_at_points += other.kills_at_points;
        self.kills_at_rest += other.kills_at_rest;
        self.restarts += other.restarts;
        self.cluster_restarts += other.cluster_restarts;
        self.steps += other.steps;
        self.duplicates += other.duplicates;
        self.missing += other.missing;
        self.wrong_commits += other.wrong_commits;
        self.unexpected += other.unexpected;
        self.event_duplicates += other.event_duplicates;
        self.events_missing += other.events_missing;
        self.violations += other.violations;
        self.relists += other.relists;
    }

    fn line(&self) -> String {
        format!(
            "{} seed(s): {} kills ({} at crash points, {} at rest), {} restarts, {} cluster \
             restarts, {} steps recorded, {} duplicates, {} missing, {} wrong commits, {} \
             unexpected records, {} duplicate Events, {} Events missing, {} timeline \
             violations, {} watch relists; {} of {} crash points hit ({})",
            self.seeds,
            self.kills_at_points + self.kills_at_rest,
            self.kills_at_points,
            self.kills_at_rest,
            self.restarts,
            self.cluster_restarts,
            self.steps,
            self.duplicates,
            self.missing,
            self.wrong_commits,
            self.unexpected,
            self.event_duplicates,
            self.events_missing,
            self.violations,
            self.relists,
            self.points_hit.len(),
            POINTS.iter().filter(|p| !p.starts_with("notify.")).count(),
            self.points_hit
                .iter()
                .copied()
                .collect::<Vec<_>>()
                .join(", "),
        )
    }
}

// ---- processes ----

/// A child process killed when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn append_to(log: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

fn note(log: &Path, line: &str) {
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(file, "==== {line}");
    }
}

/// The last lines of a log, for a failure message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The cluster of a campaign: in the test's process, or `capstan cluster serve`.
enum Cluster {
    InProcess(common::TestCluster),
    Served(Served),
}

struct Served {
    dir: PathBuf,
    config: PathBuf,
    listen: String,
    process: Process,
    starts: usize,
}

/// A cluster config whose workers load and unload quickly.
fn quick_cluster() -> ClusterConfig {
    let mut config = ClusterConfig::default_cluster();
    config.timing.relist_seconds = 0.2;
    config
}

impl Served {
    fn spawn(dir: &Path, config: &Path, listen: &str, starts: usize) -> (Process, PathBuf) {
        let kubeconfig = dir.join(format!("served-{starts}.kubeconfig"));
        let child = Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args(["cluster", "serve", "--listen", listen, "--state-dir"])
            .arg(dir.join("cluster"))
            .arg("--config")
            .arg(config)
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .env_remove(CRASH_AT_VAR)
            .stdout(Stdio::null())
            .stderr(append_to(&dir.join("cluster.log")))
            .spawn()
            .expect("capstan cluster serve starts");
        (Process(child), kubeconfig)
    }

    /// Starts `capstan cluster serve` on a free port; returns it and its kubeconfig.
    async fn start(dir: &Path) -> (Served, PathBuf) {
        let config = dir.join("cluster.yaml");
        std::fs::write(
            &config,
            serde_json::to_string(&quick_cluster()).expect("config"),
        )
        .expect("cluster.yaml");
        let (process, kubeconfig) = Served::spawn(dir, &config, "127.0.0.1:0", 0);
        common::wait_until("the cluster's kubeconfig", || async { kubeconfig.exists() }).await;
        let text = std::fs::read_to_string(&kubeconfig).expect("kubeconfig");
        let listen = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("server: https://"))
            .expect("a server address")
            .to_string();
        let served = Served {
            dir: dir.to_path_buf(),
            config,
            listen,
            process,
            starts: 1,
        };
        (served, kubeconfig)
    }

    /// kill -9, then the same state dir on the same address.
    async fn restart(&mut self, client: &kube::Client) {
        let _ = self.process.0.kill();
        let _ = self.process.0.wait();
        note(&self.dir.join("cluster.log"), "killed with SIGKILL");
        let (process, kubeconfig) =
            Served::spawn(&self.dir, &self.config, &self.listen, self.starts);
        self.process = process;
        self.starts += 1;
        common::wait_until("the restarted cluster's kubeconfig", || async {
            kubeconfig.exists()
        })
        .await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        common::wait_until("the restarted cluster answers", || async {
            namespaces
                .list_metadata(&ListParams::default().limit(1))
                .await
                .is_ok()
        })
        .await;
    }
}

async fn client_of(kubeconfig: &Path) -> kube::Client {
    let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
    let config: kube::config::Kubeconfig = serde_saphyr::from_str(&text).expect("parse kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .expect("config");
    kube::Client::try_from(config).expect("client")
}

/// A `capstan sync` run and where its lines start in the log.
struct Sync {
    process: Process,
    log: PathBuf,
    from: u64,
}

impl Sync {
    /// Whether it has started: connected, its sync prepared, its controllers started.
    fn up(&self) -> bool {
        use std::io::{Read as _, Seek as _};
        let Ok(mut file) = std::fs::File::open(&self.log) else {
            return false;
        };
        let mut text = String::new();
        file.seek(std::io::SeekFrom::Start(self.from))
            .and_then(|_| file.read_to_string(&mut text))
            .is_ok()
            && text.contains("metrics and health on")
    }
}

/// A `capstan sync` run, armed with `crash` when given.
fn capstan_sync(dir: &Path, repo: &Path, crash: Option<(&str, u64)>) -> Sync {
    let log = dir.join("sync.log");
    let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    command
        .args(["sync", "--repo"])
        .arg(repo)
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .arg("--state-dir")
        .arg(dir.join("sync"))
        .args(["--listen", "127.0.0.1:0", "--interval", "1s"])
        .env_remove(CRASH_AT_VAR)
        .stdout(Stdio::null())
        .stderr(append_to(&log));
    if let Some((point, nth)) = crash {
        command.env(CRASH_AT_VAR, format!("{point}:{nth}"));
    }
    Sync {
        process: Process(command.spawn().expect("capstan sync starts")),
        log,
        from,
    }
}

// ---- conditions ----

/// Whether capstan has applied `head` and everything it asks is done: converged, and no
/// node in an upgrade. A rejected commit is an error (capstan would never get there).
async fn at_rest(client: &kube::Client, head: &str) -> Result<bool, String> {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let Ok(Some(sync)) = syncs.get_opt("capstan").await else {
        return Ok(false);
    };
    let status = sync.status.unwrap_or_default();
    if status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == "CommitRejected")
    {
        let attempted = status
            .last_attempted_commit
            .map(|c| c.short_sha)
            .unwrap_or_default();
        return Err(format!("capstan rejected {attempted}: {}", status.error));
    }
    if status.last_applied_commit.map(|c| c.sha).as_deref() != Some(head) {
        return Ok(false);
    }
    Ok(upgrade::at_rest(client).await.is_ok())
}

async fn step_count(client: &kube::Client) -> Option<usize> {
    let api: Api<capstan_api::HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    let records = api.list(&ListParams::default()).await.ok()?;
    Some(
        records
            .items
            .iter()
            .filter(|r| r.spec.to_version.as_deref() == Some("v2"))
            .count(),
    )
}

/// How a run of capstan ended.
enum Ended {
    /// At its crash point.
    Crashed,
    /// Killed by the test, everything it had to do done.
    AtRest,
}

// ---- a seed ----

/// The fleet at v1: three labelled workers, `maxNodesInFlight: 1`, a ConfigMap; its SHA.
/// The fleet's policy: each upgrade passes a check pod after its last step, so that a kill
/// can land at the gate's crash points (its pod, its record).
const GATED: &str = "maxNodesInFlight: 1\nrollout:\n  gates:\n  - name: smoke\n    when: after\n    \
    timeout: 2m\n    pod:\n      image: registry.example/smoke:1\n      annotations:\n        \
    sim.capstan.dev/exit-after-seconds: \"0.1\"\n";

fn initial_fleet() -> (FleetRepo, String) {
    let mut repo = FleetRepo::new();
    let head = upgrade::commit_initial_fleet(
        &mut repo,
        &[
            ("settings.yaml", config_map("settings", "a")),
            ("capstan.yaml", GATED.to_string()),
        ],
    );
    (repo, head)
}

struct Campaign<'a> {
    seed: u64,
    dir: &'a Path,
    client: kube::Client,
    cluster: Cluster,
    figures: Figures,
}

impl Campaign<'_> {
    fn sync_log(&self) -> PathBuf {
        self.dir.join("sync.log")
    }

    /// Waits until the run ends at its crash point or at rest; kills the cluster on the
    /// way when `cluster_kill` says after how many more step records.
    async fn run(
        &mut self,
        capstan: &mut Sync,
        head: &str,
        mut cluster_kill: Option<usize>,
    ) -> Result<Ended, String> {
        let threshold = match cluster_kill {
            Some(more) => step_count(&self.client).await.unwrap_or(0) + more,
            None => 0,
        };
        let deadline = Instant::now() + common::DEADLINE;
        loop {
            let exited = capstan.process.0.try_wait().map_err(|e| e.to_string())?;
            if let Some(status) = exited
                && status.signal() != Some(9)
            {
                return Err(format!("capstan exited by itself: {status}"));
            }
            // At rest counts once capstan is up: it may have something to say.
            let up = exited.is_none() && capstan.up();
            let rest = up && at_rest(&self.client, head).await?;
            let steps = step_count(&self.client).await.unwrap_or(0);
            // The cluster goes down under a running capstan, or a dead one.
            let cluster_due = (up && (steps >= threshold || rest)) || exited.is_some();
            if cluster_kill.is_some() && cluster_due {
                cluster_kill = None;
                if let Cluster::Served(served) = &mut self.cluster {
                    served.restart(&self.client).await;
                    self.figures.cluster_restarts += 1;
                }
                continue;
            }
            if exited.is_some() {
                return Ok(Ended::Crashed);
            }
            if rest {
                return Ok(Ended::AtRest);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no crash and not at rest within {:?}",
                    common::DEADLINE
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs capstan unarmed until `head` is applied and at rest, then kills it.
    async fn run_to_rest(&mut self, repo: &FleetRepo, head: &str) -> Result<(), String> {
        let mut capstan = capstan_sync(self.dir, repo.path(), None);
        match self.run(&mut capstan, head, None).await? {
            Ended::AtRest => Ok(()),
            Ended::Crashed => Err("an unarmed run was killed".into()),
        }
    }

    async fn play(&mut self, plan: &Plan) -> Result<(), String> {
        let (mut repo, mut head) = initial_fleet();

        // A clean start to v1 on every node, then the watch on what the nodes do.
        note(
            &self.sync_log(),
            &format!("seed {}: the first run", self.seed),
        );
        self.run_to_rest(&repo, &head).await?;
        let timelines = upgrade::timeline::watch(&self.client, NS, "my_kmod");
        common::wait_until("the timeline of every node", || async {
            NODES.iter().all(|node| timelines.has_loaded(node, "v1"))
        })
        .await;

        let mut expected: BTreeMap<&str, (String, u64)> = BTreeMap::new();
        for run in 0..=ARMED_RUNS {
            for landing in plan.landings.iter().filter(|l| l.before_run == run) {
                head = repo.commit_set(&landing.files, landing.message);
                if let Some(node) = landing.node {
                    expected.insert(node, (head.clone(), landing.pull_request));
                }
            }
            let crash = plan.kills.get(run).copied();
            note(
                &self.sync_log(),
                &format!(
                    "seed {} run {run}: {}",
                    self.seed,
                    crash.map_or("unarmed".to_string(), |(p, n)| format!(
                        "{CRASH_AT_VAR}={p}:{n}"
                    ))
                ),
            );
            let mut capstan = capstan_sync(self.dir, repo.path(), crash);
            self.figures.restarts += 1;
            let ended = self
                .run(&mut capstan, &head, plan.cluster_kills.get(&run).copied())
                .await
                .map_err(|e| format!("run {run}: {e}"))?;
            match (ended, crash) {
                (Ended::Crashed, Some((point, _))) => {
                    self.figures.kills_at_points += 1;
                    self.figures.points_hit.insert(point);
                }
                (Ended::Crashed, None) => return Err(format!("run {run} was killed unarmed")),
                (Ended::AtRest, Some(_)) => self.figures.kills_at_rest += 1,
                (Ended::AtRest, None) => {}
            }
        }
        self.figures.relists = timelines.relists();
        self.check(&expected, &timelines).await
    }

    /// The history, the Events and the timelines, once the upgrade is done.
    async fn check(
        &mut self,
        expected: &BTreeMap<&str, (String, u64)>,
        timelines: &upgrade::timeline::Timelines,
    ) -> Result<(), String> {
        let mut problems = Vec::new();
        // The watches may be behind the cluster a moment (the replay then says so).
        let v2 = Some(Some("v2".to_string()));
        let _ = common::poll(async || {
            let behind = NODES.iter().any(|n| timelines.loaded(n) != v2);
            if behind { Err(()) } else { Ok(()) }
        })
        .await;
        let records = upgrade::step_records_all(&self.client).await;
        for record in &records {
            let spec = &record.spec;
            let initial = spec.from_version.is_none() && spec.to_version.as_deref() == Some("v1");
            let upgrade = spec.from_version.as_deref() == Some("v1")
                && spec.to_version.as_deref() == Some("v2");
            if !initial && !upgrade {
                self.figures.unexpected += 1;
                problems.push(format!("unexpected record: {}", spec.message));
            }
        }
        for node in NODES {
            let (sha, pull_request) = &expected[node];
            for step in STEPS {
                let of_step: Vec<_> = records
                    .iter()
                    .filter(|r| {
                        r.spec.node.as_deref() == Some(node)
                            && r.spec.to_version.as_deref() == Some("v2")
                            && r.spec.step.as_deref() == Some(step)
                    })
                    .collect();
                self.figures.steps += of_step.len();
                match of_step.len() {
                    0 => {
                        self.figures.missing += 1;
                        problems.push(format!("{node}: {step} not recorded"));
                    }
                    1 => {}
                    n => {
                        self.figures.duplicates += n - 1;
                        problems.push(format!("{node}: {step} recorded {n} times"));
                    }
                }
                for record in of_step {
                    let commit = &record.spec.commit;
                    if commit.sha != *sha || commit.pull_request != Some(*pull_request) {
                        self.figures.wrong_commits += 1;
                        problems.push(format!(
                            "{node}: {step} recorded against {} (#{:?}), not {} (#{pull_request})",
                            commit.short_sha,
                            commit.pull_request,
                            &sha[..7]
                        ));
                    }
                }
            }
            let replay = timelines.replay(node);
            if replay.versions.last() != Some(&Some("v2".to_string())) {
                problems.push(format!(
                    "{node}: the timeline ends at {:?}",
                    replay.versions
                ));
            }
            self.figures.violations += replay.violations.len();
            if !replay.violations.is_empty() {
                for violation in replay.violations {
                    problems.push(format!("{node}: {violation}"));
                }
                problems.push(format!("{node}'s timeline:\n{}", timelines.describe(node)));
            }
        }
        // An Event may be missing (killed between a record and its Events), never doubled.
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let events = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        for node in NODES {
            for reason in [
                "DevicePluginStopped",
                "OldModuleUnloaded",
                "NewModuleLoaded",
                "DevicePluginStarted",
            ] {
                let count = upgrade::step_events(&events.items, node, reason, "v2");
                match count {
                    0 => self.figures.events_missing += 1,
                    1 => {}
                    n => {
                        self.figures.event_duplicates += n - 1;
                        problems.push(format!("{node}: {n} {reason} Events"));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("\n"))
        }
    }
}

/// Plays the campaign of every seed; fails naming each failed seed and how to replay it.
async fn campaign(kill_cluster: bool) {
    capstan_api::install_crypto_provider();
    let name = if kill_cluster {
        "kill campaign with cluster restarts"
    } else {
        "kill campaign"
    };
    let started = Instant::now();
    let mut total = Figures::default();
    let mut failures = Vec::new();
    let default = if kill_cluster {
        CI_SEEDS_CLUSTER
    } else if common::on_real_server() {
        CI_SEEDS_REAL
    } else {
        CI_SEEDS
    };
    for seed in seeds(default) {
        let plan = Plan::of(seed, kill_cluster);
        println!("{name}, seed {seed}: {}", plan.describe());
        let dir = tempfile::tempdir().expect("tempdir");
        let (cluster, client) = if kill_cluster {
            let (served, kubeconfig) = Served::start(dir.path()).await;
            std::fs::copy(&kubeconfig, dir.path().join("kubeconfig")).expect("kubeconfig");
            (Cluster::Served(served), client_of(&kubeconfig).await)
        } else {
            let (cluster, client) = common::start_simulated(quick_cluster()).await;
            capstan_cluster::kubeconfig::write(
                &dir.path().join("kubeconfig"),
                &cluster.kubeconfig(),
            )
            .expect("kubeconfig");
            (Cluster::InProcess(cluster), client)
        };
        let mut campaign = Campaign {
            seed,
            dir: dir.path(),
            client,
            cluster,
            figures: Figures {
                seeds: 1,
                ..Figures::default()
            },
        };
        let seed_started = Instant::now();
        let result = campaign.play(&plan).await;
        println!(
            "{name}, seed {seed}: {} in {:.1}s",
            campaign.figures.line(),
            seed_started.elapsed().as_secs_f64()
        );
        total.add(&campaign.figures);
        if let Err(problems) = result {
            failures.push(format!(
                "seed {seed} ({}; replay with {SEED_VAR}={seed}):\n{problems}\n---- capstan's log, last lines:\n{}",
                plan.describe(),
                tail(&campaign.sync_log())
            ));
        }
        if let Cluster::InProcess(cluster) = campaign.cluster {
            cluster.shutdown().await;
        }
        if std::env::var_os(KEEP_VAR).is_some() {
            println!("{name}, seed {seed}: kept {}", dir.keep().display());
        }
    }
    println!(
        "{name}: {} in {:.1}s",
        total.line(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n\n"));
    assert_eq!((total.duplicates, total.missing), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_killed_at_every_write_records_each_step_once_against_its_commit() {
    campaign(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_survives_its_cluster_killed_and_restarted_on_its_state_dir() {
    common::requires_stand_in("`capstan cluster serve` process, killed and restarted");
    campaign(true).await;
}

/// The campaign's first seed, reduced: a kill right after the sync wrote its "Applying"
/// status (its inventory already naming the new content) and before it wrote the relabel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_killed_after_its_applying_status_records_the_upgrade_against_the_relabel() {
    capstan_api::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cluster, client) = common::start_simulated(quick_cluster()).await;
    capstan_cluster::kubeconfig::write(&dir.path().join("kubeconfig"), &cluster.kubeconfig())
        .expect("kubeconfig");
    let mut campaign = Campaign {
        seed: 0,
        dir: dir.path(),
        client: client.clone(),
        cluster: Cluster::InProcess(cluster),
        figures: Figures::default(),
    };
    let log = dir.path().join("sync.log");
    let fail = |e: String| -> ! { panic!("{e}\n---- capstan's log:\n{}", tail(&log)) };
    let (mut repo, head) = initial_fleet();
    if let Err(e) = campaign.run_to_rest(&repo, &head).await {
        fail(e);
    }
    let bump = repo.commit(
        &[("module.yaml", Some(&module("v2")))],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    if let Err(e) = campaign.run_to_rest(&repo, &bump).await {
        fail(e);
    }

    let relabel = repo.commit(
        &[("nodes/worker-1.yaml", Some(&label("worker-1", "v2")))],
        "Merge pull request #3 from fleet/worker-1-v2",
    );
    let mut capstan = capstan_sync(dir.path(), repo.path(), Some(("sync.status.after", 1)));
    match campaign.run(&mut capstan, &relabel, None).await {
        Ok(Ended::Crashed) => {}
        Ok(Ended::AtRest) => panic!("the sync never wrote its status"),
        Err(e) => fail(e),
    }
    if let Err(e) = campaign.run_to_rest(&repo, &relabel).await {
        fail(e);
    }

    let node: Node = Api::all(client.clone())
        .get("worker-1")
        .await
        .expect("node");
    let records = upgrade::step_records(&client, "worker-1", "v2").await;
    assert_eq!(upgrade::steps(&records), STEPS, "{records:#?}");
    for record in &records {
        assert_eq!(
            (
                record.spec.commit.sha.as_str(),
                record.spec.commit.pull_request
            ),
            (relabel.as_str(), Some(3)),
            "{}: worker-1 is stamped {:?}",
            record.spec.message,
            node.annotations().get("capstan.dev/revision"),
        );
    }
    if let Cluster::InProcess(cluster) = campaign.cluster {
        cluster.shutdown().await;
    }
}
