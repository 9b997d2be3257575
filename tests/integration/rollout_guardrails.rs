//! Rollout guardrails from `capstan.yaml` (docs/guardrails.md): a check pod that fails on
//! the second node halts the rollout there, with its records and Events, and node 3 never
//! starts; the repository's revert returns that node to its old version through the same
//! four steps and ends the halt; a maintenance window that closes mid-rollout holds new
//! starts, and the next one finishes the rollout after a restart; the preflight holds a
//! node whose kmod image its registry does not have, before any drain.

use crate::common;
use crate::upgrade;

use capstan_api::labels::UPGRADE_ANNOTATION_PREFIX;
use capstan_api::{HistoryRecord, RecordType};
use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use upgrade::driver::{Capstan, Mode};
use upgrade::{STEPS, label, module};

pub const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];

/// `capstan.yaml` with `maxNodesInFlight: 1` and `rollout` as given (indented YAML).
pub fn settings(rollout: &str) -> String {
    format!("maxNodesInFlight: 1\nrollout:\n{rollout}")
}

/// A check pod after the last step that fails on `fail_on` (the stand-ins' annotation).
pub fn check_pod_gate(fail_on: &str) -> String {
    format!(
        "  gates:\n  - name: gpu-diagnostic\n    when: after\n    timeout: 1m\n    pod:\n      \
         image: registry.example/gpu-diag:1\n      args: [--quick]\n      annotations:\n        \
         sim.capstan.dev/exit-after-seconds: \"0.1\"\n        \
         sim.capstan.dev/fail-on-nodes: \"{fail_on}\"\n"
    )
}

/// Every record of `type_` about `node`, oldest first.
async fn records_of(client: &kube::Client, type_: RecordType, node: &str) -> Vec<HistoryRecord> {
    let mut records: Vec<HistoryRecord> = upgrade::records(client)
        .await
        .into_iter()
        .filter(|r| r.spec.type_ == type_ && r.spec.node.as_deref() == Some(node))
        .collect();
    records.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    records
}

/// The Events of `reason` on `node`.
async fn events(client: &kube::Client, node: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(node) && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// The upgrade annotation of `node` (`None` when it has none).
async fn progress(client: &kube::Client, node: &str) -> Option<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(node).await.expect("node");
    node.annotations()
        .iter()
        .find(|(key, _)| key.starts_with(UPGRADE_ANNOTATION_PREFIX))
        .map(|(_, value)| value.clone())
}

/// Commits v2 of the Module and every worker relabelled to it.
pub fn commit_v2_everywhere(repo: &mut FleetRepo, extra: &[(&str, Option<&str>)]) -> String {
    let module = module("v2");
    let labels: Vec<String> = WORKERS.iter().map(|n| label(n, "v2")).collect();
    let paths: Vec<String> = WORKERS.iter().map(|n| format!("nodes/{n}.yaml")).collect();
    let mut files: Vec<(&str, Option<&str>)> = vec![("module.yaml", Some(&module))];
    for (path, text) in paths.iter().zip(&labels) {
        files.push((path, Some(text)));
    }
    files.extend_from_slice(extra);
    repo.commit(&files, "Merge pull request #2 from fleet/my-kmod-v2")
}

/// A cluster with the three workers at v1 under `extra` files (`capstan.yaml` among them
/// when given), and capstan following the repository, its first commit taken.
pub async fn fleet_at_v1(
    extra: &[(&str, String)],
) -> (common::TestCluster, kube::Client, FleetRepo, Capstan) {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, extra);
    let mut capstan = Capstan::new(
        Mode::LongRunning,
        &client,
        &cluster.kubeconfig(),
        repo.path(),
    )
    .await;
    capstan.take_head().await;
    (cluster, client, repo, capstan)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_pod_failing_on_the_second_node_halts_the_rollout_there() {
    let policy = settings(&check_pod_gate("worker-2"));
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[("capstan.yaml", policy)]).await;
    commit_v2_everywhere(&mut repo, &[]);
    capstan.take_head().await;

    wait_until("worker-2's gate failed", async || {
        records_of(&client, RecordType::Gate, "worker-2")
            .await
            .iter()
            .any(|r| r.spec.step.as_deref() == Some("gpu-diagnostic failed attempt 1"))
    })
    .await;
    // worker-1 passed its gate, after its four steps.
    let passed = records_of(&client, RecordType::Gate, "worker-1").await;
    assert_eq!(
        upgrade::steps(&passed),
        ["gpu-diagnostic passed attempt 1"],
        "{passed:?}"
    );
    assert_eq!(
        upgrade::steps(&upgrade::step_records(&client, "worker-1", "v2").await),
        STEPS
    );
    // worker-2 went through its steps, then its check pod failed: the record says why.
    assert_eq!(
        upgrade::steps(&upgrade::step_records(&client, "worker-2", "v2").await),
        STEPS
    );
    let failed = records_of(&client, RecordType::Gate, "worker-2").await;
    let failure = failed.last().expect("a failure record");
    assert!(
        failure.spec.message.contains("exit code 1")
            && failure.spec.message.contains("the rollout halts")
            && failure.spec.commit.pull_request == Some(2),
        "{}",
        failure.spec.message
    );
    wait_until("the GateFailed Event on worker-2", async || {
        !events(&client, "worker-2", "GateFailed").await.is_empty()
    })
    .await;
    // worker-3 never starts: it says why, once, and no step of it is recorded.
    wait_until("worker-3 says the rollout halted", async || {
        !events(&client, "worker-3", "RolloutHalted")
            .await
            .is_empty()
    })
    .await;
    assert!(
        upgrade::step_records(&client, "worker-3", "v2")
            .await
            .is_empty(),
        "worker-3 started"
    );
    let worker_3 = progress(&client, "worker-3").await.expect("worker-3 waits");
    assert!(worker_3.contains("\"waiting\":\"halted\""), "{worker_3}");
    // worker-2 stays on v2, cordoned by default? No campaign: nothing was drained, the
    // node keeps the failure in its annotation.
    let worker_2 = progress(&client, "worker-2")
        .await
        .expect("worker-2 failed");
    assert!(worker_2.contains("\"failed\""), "{worker_2}");
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revert_returns_the_failed_node_to_its_old_version_and_ends_the_halt() {
    let policy = settings(&check_pod_gate("worker-2"));
    let (cluster, client, mut repo, mut capstan) = fleet_at_v1(&[("capstan.yaml", policy)]).await;
    commit_v2_everywhere(&mut repo, &[]);
    capstan.take_head().await;
    wait_until("worker-2's gate failed", async || {
        progress(&client, "worker-2")
            .await
            .is_some_and(|p| p.contains("\"failed\""))
    })
    .await;

    // The revert the failure message asks for (the Module and every label back to v1),
    // with the diagnostic fixed: the failed node returns to v1 through the same four
    // steps, the halt ends, and the fleet comes to rest on v1.
    let v1 = module("v1");
    let labels: Vec<String> = WORKERS.iter().map(|n| label(n, "v1")).collect();
    let paths: Vec<String> = WORKERS.iter().map(|n| format!("nodes/{n}.yaml")).collect();
    let fixed = settings(&check_pod_gate("nowhere"));
    let mut files: Vec<(&str, Option<&str>)> =
        vec![("module.yaml", Some(&v1)), ("capstan.yaml", Some(&fixed))];
    for (path, text) in paths.iter().zip(&labels) {
        files.push((path, Some(text)));
    }
    repo.commit(&files, "Merge pull request #3 from fleet/revert-my-kmod-v2");
    capstan.take_head().await;
    wait_until("the fleet at rest", async || {
        upgrade::at_rest(&client).await.is_ok()
    })
    .await;
    let back = upgrade::step_records(&client, "worker-2", "v1").await;
    let back: Vec<&HistoryRecord> = back
        .iter()
        .filter(|r| r.spec.from_version.as_deref() == Some("v2"))
        .collect();
    assert_eq!(back.len(), STEPS.len(), "{back:?}");
    for node in ["worker-1", "worker-2"] {
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, node)
                .await
                .as_deref(),
            Some("v1"),
            "{node}"
        );
    }
    // worker-3 never ran v2.
    assert!(
        upgrade::step_records(&client, "worker-3", "v2")
            .await
            .is_empty()
    );
    assert_eq!(progress(&client, "worker-2").await, None);
    capstan.stop().await;
}

/// A window of `hours` hours every day that opened an hour ago (open now) or opens in
/// `hours` from now (closed now).
fn window(open: bool) -> String {
    let now = jiff::Timestamp::now();
    let start = if open {
        now - jiff::SignedDuration::from_hours(1)
    } else {
        now + jiff::SignedDuration::from_hours(3)
    };
    format!(
        "  windows:\n  - start: \"{}\"\n    duration: 2h\n    timeZone: UTC\n",
        start.strftime("%H:%M")
    )
}

/// A gate after the last step that holds worker-2 until the test labels it `release`.
const HOLD_WORKER_2: &str = "  gates:\n  - name: released\n    when: after\n    timeout: 10m\n    \
     cel: node.metadata.name != \"worker-2\" || \"release\" in node.metadata.labels\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_that_closes_mid_rollout_holds_new_starts_and_the_next_one_finishes_after_a_restart()
 {
    let open = settings(&format!("{}{HOLD_WORKER_2}", window(true)));
    let (cluster, client, mut repo, mut capstan) =
        fleet_at_v1(&[("capstan.yaml", open.clone())]).await;
    commit_v2_everywhere(&mut repo, &[]);
    capstan.apply_head().await;
    // worker-1 upgrades in the window; worker-2 is in progress (its gate holds it).
    wait_until("worker-2 upgraded, in its gate", async || {
        upgrade::step_records(&client, "worker-2", "v2").await.len() == STEPS.len()
    })
    .await;

    // The window closes (the repository moves it): worker-3, not started, waits for the
    // next one and says so; worker-2, in progress, finishes.
    let closed = settings(&format!("{}{HOLD_WORKER_2}", window(false)));
    repo.commit(
        &[("capstan.yaml", Some(&closed))],
        "Merge pull request #3 from fleet/window",
    );
    capstan.apply_head().await;
    wait_until("worker-3 waits for a window", async || {
        !events(&client, "worker-3", "OutsideWindow")
            .await
            .is_empty()
    })
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut worker_2 = nodes.get("worker-2").await.expect("worker-2");
    worker_2
        .labels_mut()
        .insert("release".to_string(), "yes".to_string());
    nodes
        .replace("worker-2", &Default::default(), &worker_2)
        .await
        .expect("label worker-2");
    wait_until("worker-2 finished", async || {
        progress(&client, "worker-2").await.is_none()
    })
    .await;
    assert!(
        upgrade::step_records(&client, "worker-3", "v2")
            .await
            .is_empty()
    );

    // A restart while the window is closed: nothing starts either.
    capstan.stop().await;
    let mut capstan = Capstan::new(
        Mode::LongRunning,
        &client,
        &cluster.kubeconfig(),
        repo.path(),
    )
    .await;
    capstan.apply_head().await;
    wait_until("worker-3 still waiting for its window", async || {
        progress(&client, "worker-3")
            .await
            .is_some_and(|p| p.contains("\"waiting\":\"window\""))
    })
    .await;
    assert!(
        upgrade::step_records(&client, "worker-3", "v2")
            .await
            .is_empty()
    );

    // The next window opens: the rollout resumes where it stopped and finishes.
    repo.commit(
        &[("capstan.yaml", Some(&open))],
        "Merge pull request #4 from fleet/window",
    );
    capstan.take_head().await;
    wait_until("worker-3 upgraded", async || {
        upgrade::step_records(&client, "worker-3", "v2").await.len() == STEPS.len()
    })
    .await;
    wait_until("the fleet at rest", async || {
        upgrade::at_rest(&client).await.is_ok()
    })
    .await;
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_stops_the_preflight_before_any_drain() {
    let preflight = settings("  preflight: true\n");
    let (_cluster, client, mut repo, mut capstan) =
        fleet_at_v1(&[("capstan.yaml", preflight)]).await;
    // v2's kmod image lives in a registry on loopback that has nothing (the port is
    // closed): the preflight cannot find it.
    let v2 = module("v2").replace("registry.example/", "127.0.0.1:9/");
    let campaign = upgrade::campaign("2020-01-01T00:00:00Z");
    let worker_1 = label("worker-1", "v2");
    repo.commit(
        &[
            ("module.yaml", Some(&v2)),
            ("campaign.yaml", Some(&campaign)),
            ("nodes/worker-1.yaml", Some(&worker_1)),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    capstan.apply_head().await;
    wait_until("worker-1 in its preflight", async || {
        progress(&client, "worker-1")
            .await
            .is_some_and(|p| p.contains("\"name\":\"preflight\""))
    })
    .await;
    // Held before its drain: not cordoned, no drain or step record.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("worker-1").await.expect("worker-1");
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "worker-1 was cordoned before its preflight passed"
    );
    assert!(upgrade::node_history(&client, "worker-1").await.is_empty());

    // The policy leaves the preflight out: the node goes on, drained around its steps.
    let plain = settings("  preflight: false\n");
    repo.commit(
        &[("capstan.yaml", Some(&plain))],
        "Merge pull request #3 from fleet/no-preflight",
    );
    capstan.apply_head().await;
    wait_until("worker-1 cordoned", async || {
        records_of(&client, RecordType::Drain, "worker-1")
            .await
            .iter()
            .any(|r| r.spec.step.as_deref() == Some("cordoned"))
    })
    .await;
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_firing_alert_holds_the_start_until_it_clears() {
    use capstan_testing::prometheus::{Exporter, Prometheus};
    let exporter = Exporter::start("test_alert{node=\"worker-1\"} 1\n")
        .await
        .expect("exporter");
    let prometheus = Prometheus::start(&exporter).await.expect("Prometheus");
    prometheus
        .wait_for_query("test_alert > 0", |samples| samples.len() == 1)
        .await;
    let gate = format!(
        "  gates:\n  - name: no-alerts\n    timeout: 5m\n    prometheus:\n      url: \"{}\"\n      \
         query: 'test_alert{{node=\"$node\"}} > 0'\n",
        prometheus.url()
    );
    let (_cluster, client, mut repo, mut capstan) =
        fleet_at_v1(&[("capstan.yaml", settings(&gate))]).await;
    let v2 = module("v2");
    let worker_1 = label("worker-1", "v2");
    repo.commit(
        &[
            ("module.yaml", Some(&v2)),
            ("nodes/worker-1.yaml", Some(&worker_1)),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    capstan.apply_head().await;
    wait_until("worker-1 in its gate", async || {
        progress(&client, "worker-1")
            .await
            .is_some_and(|p| p.contains("\"name\":\"no-alerts\""))
    })
    .await;
    // capstan asked Prometheus, twice, while the alert fired: nothing moved.
    let asked = "sum(prometheus_http_requests_total{handler=\"/api/v1/query\"})";
    let before: f64 = prometheus.query(asked).await.expect("query")[0]
        .value
        .parse()
        .expect("a number");
    prometheus
        .wait_for_query(asked, |samples| {
            samples
                .first()
                .and_then(|s| s.value.parse::<f64>().ok())
                .is_some_and(|n| n >= before + 3.0)
        })
        .await;
    assert!(
        upgrade::step_records(&client, "worker-1", "v2")
            .await
            .is_empty(),
        "worker-1 started while its alert fired"
    );

    // The alert clears: the gate passes, recorded, and the node upgrades.
    exporter.set("test_alert{node=\"worker-1\"} 0\n");
    wait_until("worker-1 upgraded", async || {
        upgrade::step_records(&client, "worker-1", "v2").await.len() == STEPS.len()
    })
    .await;
    let gates = records_of(&client, RecordType::Gate, "worker-1").await;
    assert_eq!(upgrade::steps(&gates), ["no-alerts passed attempt 1"]);
    capstan.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_plan_estimates_the_rollout_from_the_recorded_upgrades_and_the_windows() {
    use capstan::sync::plan::{self, PlanInput};
    use capstan::sync::source::{Auth, Source};
    let (_cluster, client, mut repo, mut capstan) = fleet_at_v1(&[]).await;
    // worker-1 upgrades: the cluster records its four steps.
    let v2 = module("v2");
    let worker_1 = label("worker-1", "v2");
    repo.commit(
        &[
            ("module.yaml", Some(&v2)),
            ("nodes/worker-1.yaml", Some(&worker_1)),
        ],
        "Merge pull request #2 from fleet/canary",
    );
    capstan.take_head().await;
    let recorded: f64 = upgrade::step_records(&client, "worker-1", "v2")
        .await
        .iter()
        .filter_map(|r| r.spec.duration_seconds)
        .sum();

    // The next change, planned before it merges: the other two, with a gate and a window.
    let policy = settings(&format!("{}{}", window(true), check_pod_gate("nowhere")));
    let (worker_2, worker_3) = (label("worker-2", "v2"), label("worker-3", "v2"));
    let head = repo.commit(
        &[
            ("capstan.yaml", Some(&policy)),
            ("nodes/worker-2.yaml", Some(&worker_2)),
            ("nodes/worker-3.yaml", Some(&worker_3)),
        ],
        "Merge pull request #3 from fleet/the-rest",
    );
    let state = tempfile::tempdir().expect("tempdir");
    let source = Source::open(
        repo.path().to_str().expect("utf-8"),
        "main",
        None,
        state.path(),
        Auth::None,
    )
    .expect("the repository opens");
    let base = source.resolve(&format!("{head}~1")).expect("base");
    let head = source.resolve(&head).expect("head");
    let input = PlanInput::read(&source, base, head, None).expect("both commits read");
    let plan = plan::live(&input, &client, "capstan", Default::default())
        .await
        .expect("a live plan");
    let guardrails = plan.policy.guardrails.clone().expect("the guardrails");
    let estimate = guardrails.estimate.expect("an estimate");
    assert_eq!(estimate.recorded_upgrades, 1, "{estimate:?}");
    assert_eq!(estimate.per_node_seconds, recorded.round() as u64);
    // Two waves of one node each, inside the open window: twice a node's time.
    let starts = |at: &str| at.parse::<jiff::Timestamp>().expect("a time");
    let span = starts(&estimate.ends_at).duration_since(starts(&estimate.starts_at));
    assert_eq!(span.as_secs() as u64, 2 * estimate.per_node_seconds);
    for node in &plan.nodes {
        assert!(node.starts_at.is_some(), "{node:?}");
        let gates: Vec<&str> = node.gates.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(gates, ["gpu-diagnostic"]);
    }
    let text = plan::render_text(&plan, false);
    assert!(text.contains("median of 1 recorded upgrade"), "{text}");
    capstan.stop().await;
}
