//! Replicas of `capstan sync --leader-elect`, as a Deployment runs them: one holds the
//! `coordination.k8s.io/v1` Lease and acts, the others stand by, ready, relaying webhooks
//! to the leader through the GitSync. A leader stopped with SIGTERM releases the Lease; a
//! leader killed with SIGKILL in the middle of a drain or of a node's steps is replaced
//! once the Lease expires, and the new leader finishes the campaign with every drain
//! record and every step recorded exactly once.

use crate::common;
use crate::upgrade;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use capstan_api::labels::SYNC_REQUESTED_AT_ANNOTATION;
use capstan_api::upgrade_config::UpgradePhase;
use capstan_api::{GitSync, RecordType};
use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use ring::hmac;
use upgrade::{NS, label, module};

/// The Lease of these tests: short, so a takeover after SIGKILL takes seconds.
const LEASE_SECONDS: u64 = 3;
const WEBHOOK_SECRET: &str = "replicas-share-this";

/// One replica: a `capstan sync` process with its own state dir and log, reading the
/// kubeconfig and webhook secret of its folder ([`folder`]).
pub struct Replica {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Replica {
    pub fn start(dir: &Path, name: &'static str, repo: &Path) -> Replica {
        Replica::armed(dir, name, repo, None)
    }

    /// A replica that kills itself with SIGKILL at a crash point (`<point>:<nth hit>`,
    /// src/crash.rs).
    pub fn armed(dir: &Path, name: &'static str, repo: &Path, crash: Option<&str>) -> Replica {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
        command
            .args(["sync", "--repo"])
            .arg(repo)
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .arg("--state-dir")
            .arg(dir.join(name))
            .arg("--webhook-secret-file")
            .arg(dir.join("webhook-secret"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--interval",
                "1s",
                "--leader-elect",
            ])
            .args(["--lease-duration", &format!("{LEASE_SECONDS}s")])
            .args(["--lease-grace", "1s"])
            .env("POD_NAME", name)
            .env_remove(capstan::crash::CRASH_AT_VAR)
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(crash) = crash {
            command.env(capstan::crash::CRASH_AT_VAR, crash);
        }
        let child = command.spawn().expect("capstan sync starts");
        Replica { name, child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn wait_for_line(&self, needle: &str) {
        wait_until(&format!("{}: {needle:?}", self.name), async || {
            self.log().contains(needle)
        })
        .await;
    }

    fn leads(&self) -> bool {
        self.log().contains("leading: holding the Lease")
    }

    /// Its identity in the Lease, from its first line about it.
    fn identity(&self) -> Option<String> {
        self.log()
            .lines()
            .find_map(|line| line.strip_prefix("waiting for the Lease "))
            .and_then(|rest| rest.split(" as ").nth(1))
            .map(str::to_string)
    }

    /// Where its endpoints listen.
    fn address(&self) -> Option<String> {
        self.log()
            .lines()
            .find_map(|line| line.strip_prefix("metrics and health on http://"))
            .and_then(|rest| rest.split('/').next())
            .map(str::to_string)
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child this test owns and has not reaped.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(sent, 0, "signal {signal} to {}", self.name);
    }

    /// SIGKILL, as a lost node or the OOM killer ends a pod: nothing is released.
    pub async fn kill(mut self) {
        self.signal(libc::SIGKILL);
        assert_eq!(self.exit_code().await, None, "{}", self.log());
    }

    /// Waits for the process to end; its exit code (None: killed by a signal).
    pub async fn exit_code(&mut self) -> Option<i32> {
        let mut code = None;
        wait_until(&format!("{} exits", self.name), async || {
            match self.child.try_wait().expect("try_wait") {
                Some(status) => {
                    code = Some(status.code());
                    true
                }
                None => false,
            }
        })
        .await;
        code.flatten()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test's folder: the kubeconfig and webhook secret the replicas share.
pub fn folder(kubeconfig: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    capstan_cluster::kubeconfig::write(&dir.path().join("kubeconfig"), kubeconfig)
        .expect("kubeconfig");
    std::fs::write(dir.path().join("webhook-secret"), WEBHOOK_SECRET).expect("secret");
    dir
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "capstan-system");
    leases
        .get_opt("capstan")
        .await
        .expect("read the Lease")
        .and_then(|lease| lease.spec)
        .and_then(|spec| spec.holder_identity)
        .filter(|holder| !holder.is_empty())
}

/// Waits until one of `replicas` leads and the Lease names it; returns its index and how
/// long that took.
pub async fn new_leader(client: &kube::Client, replicas: &[&Replica]) -> (usize, Duration) {
    let started = Instant::now();
    let mut leader = None;
    wait_until("a replica leading", async || {
        for (index, replica) in replicas.iter().enumerate() {
            if replica.leads() && holder(client).await == replica.identity() {
                leader = Some(index);
                return true;
            }
        }
        false
    })
    .await;
    (leader.expect("a leader"), started.elapsed())
}

async fn http(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> (u16, String) {
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
        .arg(format!("http://{address}{path}"));
    for (name, value) in headers {
        command.arg("-H").arg(format!("{name}: {value}"));
    }
    if !body.is_empty() {
        command.arg("--data-binary").arg(body);
    }
    let output = command.output().await.expect("curl runs");
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').expect("a status line");
    (
        code.trim().parse().expect("a status code"),
        body.to_string(),
    )
}

fn signature(body: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, WEBHOOK_SECRET.as_bytes());
    let tag = hmac::sign(&key, body.as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_a_standby_is_ready_relays_webhooks_and_takes_over_on_sigterm() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let dir = folder(&_cluster.kubeconfig());

    let mut first = Replica::start(dir.path(), "replica-a", repo.path());
    first.wait_for_line("leading: holding the Lease").await;
    let second = Replica::start(dir.path(), "replica-b", repo.path());
    second.wait_for_line("waiting for the Lease").await;
    second.wait_for_line("metrics and health on").await;
    assert_eq!(holder(&client).await, first.identity());
    first.wait_for_line(" applied ").await;

    // The standby is ready (a rolling update must not wait on it) and says why.
    let standby = second.address().expect("the standby's address");
    let (code, body) = http(&standby, "GET", "/readyz", &[], "").await;
    assert_eq!(
        (code, body.as_str()),
        (200, "ok: standby, waiting for the Lease")
    );
    assert!(!second.leads(), "{}", second.log());
    let leader = first.address().expect("the leader's address");
    for (address, expected) in [
        (&standby, "capstan_leader 0"),
        (&leader, "capstan_leader 1"),
    ] {
        let (code, metrics) = http(address, "GET", "/metrics", &[], "").await;
        assert_eq!(code, 200);
        assert!(
            metrics.lines().any(|l| l == expected),
            "{expected}:\n{metrics}"
        );
    }

    // A push delivered to the standby reaches the leader through the GitSync.
    let push = r#"{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000000"}"#;
    let headers = [
        ("content-type", "application/json".to_string()),
        ("x-github-event", "push".to_string()),
        ("x-github-delivery", "delivery-1".to_string()),
        ("x-hub-signature-256", signature(push)),
    ];
    let (code, body) = http(&standby, "POST", "/hooks/github", &headers, push).await;
    assert_eq!(
        (code, body.as_str()),
        (202, "sync requested from the leader")
    );
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let sync = syncs.get("capstan").await.expect("the GitSync");
    assert_eq!(
        sync.annotations()
            .get(SYNC_REQUESTED_AT_ANNOTATION)
            .map(String::as_str),
        Some("delivery-1")
    );
    first
        .wait_for_line("sync requested through the GitSync annotation")
        .await;

    // SIGTERM: the leader finishes, releases the Lease and exits 0; the standby leads.
    first.signal(libc::SIGTERM);
    assert_eq!(first.exit_code().await, Some(0), "{}", first.log());
    assert!(
        first.log().contains("released the Lease"),
        "{}",
        first.log()
    );
    let (leader, took) = new_leader(&client, &[&second]).await;
    assert_eq!(leader, 0);
    eprintln!(
        "figure: a standby led {:.1} s after the leader exited on SIGTERM (Lease {LEASE_SECONDS} s)",
        took.as_secs_f64()
    );
    // The new leader syncs: it writes the GitSync's status as its own.
    second.wait_for_line("following main").await;
}

/// The campaign of [`the_leader_killed_mid_drain_and_mid_upgrade_is_replaced_and_no_step_is_recorded_twice_or_lost`]:
/// my-kmod v2 due at once.
async fn user_pod(client: &kube::Client, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("app-{node}"), "labels": {"app": format!("app-{node}")}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.example/app:1"}],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
}

/// A budget allowing no disruption of worker-1's workload: its drain waits on it.
async fn blocking_budget(client: &kube::Client) {
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hold"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "app-worker-1"}}},
    }))
    .expect("budget");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create the budget");
}

/// The steps `node` went through towards v2, drain included, oldest first.
pub async fn steps_of(client: &kube::Client, node: &str) -> Vec<String> {
    upgrade::steps(&upgrade::node_history(client, node).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_mid_drain_and_mid_upgrade_is_replaced_and_no_step_is_recorded_twice_or_lost()
 {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let dir = folder(&cluster.kubeconfig());

    let a = Replica::start(dir.path(), "replica-a", repo.path());
    a.wait_for_line("leading: holding the Lease").await;
    let b = Replica::start(dir.path(), "replica-b", repo.path());
    b.wait_for_line("waiting for the Lease").await;
    a.wait_for_line(" applied ").await;
    upgrade::converged(&client).await;
    for node in ["worker-1", "worker-2"] {
        user_pod(&client, node).await;
    }
    blocking_budget(&client).await;

    // The campaign, due already, for worker-1 and worker-2 (one node at a time).
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            (
                "campaign.yaml",
                Some(&upgrade::campaign("2020-01-01T00:00:00Z")),
            ),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    wait_until(
        "worker-1 cordoned, its drain held by the budget",
        async || steps_of(&client, "worker-1").await == ["cordoned"],
    )
    .await;

    // SIGKILL in the middle of the drain: nothing released, the Lease must expire.
    a.kill().await;
    let (_, mid_drain) = new_leader(&client, &[&b]).await;
    // What a Deployment does next: a new pod, a standby now.
    let c = Replica::start(dir.path(), "replica-c", repo.path());
    c.wait_for_line("waiting for the Lease").await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    budgets
        .delete("hold", &Default::default())
        .await
        .expect("delete the budget");

    // SIGKILL again in the middle of worker-2's steps.
    wait_until("worker-2 in its steps", async || {
        steps_of(&client, "worker-2").await.len() >= 3
    })
    .await;
    b.kill().await;
    let (_, mid_upgrade) = new_leader(&client, &[&c]).await;

    wait_until("the campaign upgraded", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Upgraded)
    })
    .await;
    let expected = upgrade::DRAINED_STEPS;
    let (mut duplicated, mut lost) = (0, 0);
    for node in ["worker-1", "worker-2"] {
        let steps = steps_of(&client, node).await;
        for step in expected {
            match steps.iter().filter(|s| *s == step).count() {
                0 => lost += 1,
                1 => {}
                n => duplicated += n - 1,
            }
        }
        assert_eq!(steps, expected, "{node}");
    }
    // Events too: one per step, never two.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let events = events.list(&ListParams::default()).await.expect("events");
    for node in ["worker-1", "worker-2"] {
        for reason in ["OldModuleUnloaded", "NewModuleLoaded"] {
            let count = upgrade::step_events(&events.items, node, reason, "v2");
            assert!(count <= 1, "{node}: {count} {reason} Events");
        }
    }
    eprintln!(
        "figure: takeover after SIGKILL {:.1} s mid-drain, {:.1} s mid-upgrade (Lease {LEASE_SECONDS} s); \
         steps duplicated {duplicated}, lost {lost}",
        mid_drain.as_secs_f64(),
        mid_upgrade.as_secs_f64()
    );
    assert_eq!((duplicated, lost), (0, 0));
    drop(c);
}

/// The strategy records of `node`'s drains, by strategy.
async fn strategies_of(client: &kube::Client, node: &str) -> Vec<String> {
    let mut steps: Vec<String> = upgrade::records(client)
        .await
        .into_iter()
        .filter(|r| r.spec.type_ == RecordType::DrainStrategy)
        .filter(|r| r.spec.node.as_deref() == Some(node))
        .filter_map(|r| r.spec.step)
        .collect();
    steps.sort();
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_between_a_drain_strategy_record_and_its_action_is_replaced_and_the_strategy_counts_once()
 {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let dir = folder(&cluster.kubeconfig());

    // Its second drain record is the first strategy's (its first, the cordon): it dies
    // after writing it, before forcing the pod.
    let mut a = Replica::armed(
        dir.path(),
        "replica-a",
        repo.path(),
        Some("drain.record.after:2"),
    );
    a.wait_for_line("leading: holding the Lease").await;
    let b = Replica::start(dir.path(), "replica-b", repo.path());
    b.wait_for_line("waiting for the Lease").await;
    a.wait_for_line(" applied ").await;
    upgrade::converged(&client).await;
    // A workload pod an eviction cannot remove: its finalizer holds it, terminating.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
        "spec": {
            "nodeName": "worker-1",
            "containers": [{"name": "app", "image": "registry.example/app:1"}],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");

    // The nodekeeper forces drains at once (timeOut 0).
    repo.commit(
        &[
            (
                "capstan.yaml",
                Some("maxNodesInFlight: 1\nnodeDrain: {timeOut: 0, expectedNodeDrainTime: 0}\n"),
            ),
            ("module.yaml", Some(&module("v2"))),
            (
                "campaign.yaml",
                Some(&upgrade::campaign("2020-01-01T00:00:00Z")),
            ),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    assert_eq!(a.exit_code().await, None, "{}", a.log());
    assert!(
        a.log().contains("crash point drain.record.after:2"),
        "{}",
        a.log()
    );
    let recorded = strategies_of(&client, "worker-1").await;
    assert_eq!(
        recorded.len(),
        1,
        "one strategy recorded before the kill: {recorded:?}"
    );
    let (_, took) = new_leader(&client, &[&b]).await;

    wait_until("the campaign upgraded", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Upgraded)
    })
    .await;
    assert!(pods.get_opt("held").await.expect("read").is_none());
    assert_eq!(steps_of(&client, "worker-1").await, upgrade::DRAINED_STEPS);
    let strategies = strategies_of(&client, "worker-1").await;
    let mut distinct = strategies.clone();
    distinct.dedup();
    eprintln!(
        "figure: takeover after a SIGKILL between a strategy's record and its action {:.1} s \
         (Lease {LEASE_SECONDS} s); strategies recorded {strategies:?}",
        took.as_secs_f64()
    );
    assert_eq!(strategies, distinct, "a strategy recorded twice");
    assert!(strategies.contains(&recorded[0]), "{strategies:?}");
}
