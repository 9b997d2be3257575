//! An `UpgradeConfig` campaign from Git: the moves to its version are held until its
//! `upgradeAt`, then each node is cordoned, drained through the Eviction API, taken through
//! its four steps and uncordoned, one after the other, every drain step recorded against
//! the commit beside the kmod steps and read back in that order by `capstan history`; the
//! campaign's status follows MUO's lifecycle; each of these changes is one log line.

use crate::common;
use crate::upgrade;

use capstan::controllers::{self, Context, Selection};
use capstan_api::UpgradeConfig;
use capstan_api::labels::{DRAIN_ANNOTATION, UNSCHEDULABLE_TAINT, UPGRADE_STATE_ANNOTATION};
use capstan_api::upgrade_config::{ConditionStatus, UpgradePhase, condition_types};
use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;
use upgrade::driver::{Capstan, Mode};
use upgrade::{NS, label, module};

/// The campaign rolling out my-kmod v2 at `upgrade_at`.
fn campaign(upgrade_at: jiff::Timestamp) -> String {
    upgrade::campaign(&upgrade_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// Whole seconds from now (manifests write `upgradeAt` to the second).
fn seconds_from_now(seconds: i64) -> jiff::Timestamp {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + seconds).expect("a time")
}

/// A user's pod `name` on `node`, labelled `app`.
async fn user_pod(client: &kube::Client, name: &str, node: &str, app: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": app, "image": format!("registry.example/{app}:1")}],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
}

/// A workload pod on `node`, as a user's would be.
async fn workload(client: &kube::Client, node: &str) {
    user_pod(client, &format!("app-{node}"), node, "demo").await;
}

/// A PodDisruptionBudget that allows no disruption of the pods labelled `app`.
async fn budget(client: &kube::Client, app: &str) {
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    let budget: PodDisruptionBudget = serde_json::from_value(serde_json::json!({
        "metadata": {"name": app},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }))
    .expect("budget");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create the budget");
}

async fn workload_left(client: &kube::Client, node: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.get_opt(&format!("app-{node}"))
        .await
        .expect("read the workload pod")
        .is_some()
}

fn cordoned(node: &Node) -> bool {
    let spec = node.spec.clone().unwrap_or_default();
    spec.unschedulable == Some(true)
        || spec
            .taints
            .iter()
            .flatten()
            .any(|taint| taint.key == UNSCHEDULABLE_TAINT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_holds_its_moves_until_upgrade_at_then_drains_each_node_around_its_steps() {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let mut capstan = Capstan::new(
        Mode::LongRunning,
        &client,
        &cluster.kubeconfig(),
        repo.path(),
    )
    .await;
    capstan.take_head().await;
    for node in ["worker-1", "worker-2", "worker-3"] {
        workload(&client, node).await;
    }

    // Commit 2: the Module at v2, a campaign for v2 a little later, two nodes relabelled.
    let upgrade_at = seconds_from_now(8);
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("campaign.yaml", Some(&campaign(upgrade_at))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    capstan.take_head().await;

    // Held: the campaign waits for upgradeAt, nothing moves, nothing is drained.
    wait_until("the campaign pending", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Pending)
    })
    .await;
    if jiff::Timestamp::now() < upgrade_at {
        let nodes: Api<Node> = Api::all(client.clone());
        for name in ["worker-1", "worker-2"] {
            let node = nodes.get(name).await.expect("node");
            assert!(!cordoned(&node), "{name} is cordoned before upgradeAt");
            assert!(
                upgrade::node_history(&client, name).await.is_empty(),
                "{name}"
            );
        }
    }

    wait_until("the campaign upgrading", async || {
        matches!(
            upgrade::campaign_phase(&client).await,
            Some(UpgradePhase::Upgrading | UpgradePhase::Upgraded)
        )
    })
    .await;
    wait_until("the campaign upgraded", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Upgraded)
    })
    .await;

    let expected = upgrade::DRAINED_STEPS;
    let mut spans = Vec::new();
    for name in ["worker-1", "worker-2"] {
        let records = upgrade::node_history(&client, name).await;
        assert_eq!(upgrade::steps(&records), expected, "{name}");
        for record in &records {
            assert_eq!(
                record.spec.commit.pull_request,
                Some(2),
                "{name}: {record:?}"
            );
            assert_eq!(record.spec.to_version.as_deref(), Some("v2"));
        }
        let first: jiff::Timestamp = records[0].spec.time.parse().expect("time");
        let last: jiff::Timestamp = records[6].spec.time.parse().expect("time");
        assert!(first >= upgrade_at, "{name} started before upgradeAt");
        spans.push((first, last));
        assert!(
            !workload_left(&client, name).await,
            "{name} kept its workload"
        );
        let node: Node = Api::all(client.clone()).get(name).await.expect("node");
        assert!(!cordoned(&node), "{name} stays cordoned");
        for annotation in [DRAIN_ANNOTATION, UPGRADE_STATE_ANNOTATION] {
            assert!(!node.annotations().contains_key(annotation), "{name}");
        }
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, name)
                .await
                .as_deref(),
            Some("v2"),
            "{name}"
        );
    }
    // maxNodesInFlight 1: worker-2 is cordoned only once worker-1 is uncordoned.
    assert!(spans[0].1 <= spans[1].0, "{spans:?}");
    // `capstan history --node` reads as docs/upgrade-campaigns.md says, oldest first.
    let history = history_of_node(&cluster, "worker-1").await;
    let campaign_upgrade = history
        .split("\n\n")
        .find(|block| block.starts_with("worker-1 kmm-demo/my-kmod v1 -> v2, commit "))
        .unwrap_or_else(|| panic!("no upgrade to v2 in:\n{history}"));
    assert_eq!(history_steps(campaign_upgrade), expected, "{history}");
    // worker-3 was not part of the campaign.
    assert!(workload_left(&client, "worker-3").await);
    assert!(upgrade::node_history(&client, "worker-3").await.is_empty());

    let configs: Api<UpgradeConfig> = Api::namespaced(client.clone(), NS);
    let config = configs.get("my-kmod-v2").await.expect("campaign");
    let entry = config
        .status
        .as_ref()
        .and_then(|s| s.history_for("v2"))
        .cloned()
        .expect("history entry");
    assert_eq!(entry.preceding_version, "v1");
    let conditions: Vec<(&str, ConditionStatus)> = entry
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status))
        .collect();
    assert_eq!(
        conditions,
        [
            (
                condition_types::WORKER_NODES_UPGRADED,
                ConditionStatus::True
            ),
            (condition_types::UPGRADE_COMMENCED, ConditionStatus::True),
        ]
    );
    assert_eq!(entry.conditions[0].reason, "WorkerNodesUpgraded done");
    let started = entry.start_time.expect("startTime").0;
    assert!(started >= upgrade_at);
    assert!(entry.worker_start_time.is_some() && entry.worker_complete_time.is_some());
    assert!(entry.complete_time.is_some());
    capstan.stop().await;
}

/// What `capstan history --node <node>` prints for the cluster.
async fn history_of_node(cluster: &common::TestCluster, node: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    capstan_cluster::kubeconfig::write(&kubeconfig, &cluster.kubeconfig()).expect("kubeconfig");
    let node = node.to_string();
    let output = tokio::task::spawn_blocking(move || {
        let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
        crate::fleet::capstan(
            dir.path(),
            &["history", "--node", &node, "--kubeconfig", &kubeconfig],
        )
    })
    .await
    .expect("history");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    crate::fleet::stdout(&output)
}

/// The STEP column of the rows of an upgrade table `capstan history --node` prints: a
/// step's name after its number, a drain's record's alone.
fn history_steps(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| line.starts_with("  ") && !line.trim_start().starts_with("TIME"))
        .filter_map(|line| {
            // `  2026-11-21 10:14:13   1 device-plugin-stopped    3cf3bea  #2     2.1s`
            let mut words = line.split_whitespace().skip(2);
            let first = words.next()?;
            let step = if first.chars().all(|c| c.is_ascii_digit()) {
                words.next()?
            } else {
                first
            };
            Some(step.to_string())
        })
        .collect()
}

/// The controllers in process until the token is cancelled.
fn controllers(client: &kube::Client) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let task = tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_drain_resumes_it_and_records_each_step_once() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let mut syncer = common::syncer(&client, repo.path()).await;
    let (stop, task) = controllers(&client);
    syncer.sync().await.expect("sync");
    upgrade::converged(&client).await;
    workload(&client, "worker-1").await;
    // A budget that allows no disruption: the drain waits on it.
    budget(&client, "demo").await;

    // A campaign due already, worker-1 relabelled.
    let due = seconds_from_now(-60);
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("campaign.yaml", Some(&campaign(due))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    syncer.sync().await.expect("sync");
    wait_until(
        "worker-1 cordoned, its drain held by the budget",
        async || upgrade::node_history(&client, "worker-1").await.len() == 1,
    )
    .await;
    assert!(workload_left(&client, "worker-1").await);

    // capstan stops in the middle of the drain; a new one takes over.
    stop.cancel();
    task.await.expect("controllers stop");
    let (stop, task) = controllers(&client);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    budgets
        .delete("demo", &Default::default())
        .await
        .expect("delete the budget");
    wait_until("the campaign upgraded", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Upgraded)
    })
    .await;
    assert_eq!(
        upgrade::steps(&upgrade::node_history(&client, "worker-1").await),
        upgrade::DRAINED_STEPS
    );
    assert!(!workload_left(&client, "worker-1").await);
    stop.cancel();
    task.await.expect("controllers stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_plan_says_what_each_drain_evicts_and_what_a_budget_protects() {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let mut syncer = common::syncer(&client, repo.path()).await;
    syncer.sync().await.expect("sync");
    workload(&client, "worker-1").await;
    user_pod(&client, "db", "worker-1", "db").await;
    budget(&client, "db").await;

    let later = seconds_from_now(3600);
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("campaign.yaml", Some(&campaign(later))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    let kubeconfig = repo.path().join("kubeconfig");
    capstan_cluster::kubeconfig::write(&kubeconfig, &cluster.kubeconfig()).expect("kubeconfig");
    let dir = repo.path().to_path_buf();
    let output = tokio::task::spawn_blocking(move || {
        let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
        crate::fleet::capstan(
            &dir,
            &["plan", "--format", "json", "--kubeconfig", &kubeconfig],
        )
    })
    .await
    .expect("plan");
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stderr)));
    let node = &plan["nodes"][0];
    assert_eq!(node["node"], "worker-1", "{plan:#}");
    assert_eq!(node["campaign"], format!("{NS}/my-kmod-v2"));
    assert_eq!(
        node["drain"]["evicted"],
        serde_json::json!([format!("{NS}/app-worker-1")])
    );
    assert_eq!(
        node["drain"]["protected"],
        serde_json::json!([format!("{NS}/db")])
    );
    let forced: Vec<(String, u64)> = node["drain"]["forcedAfter"]
        .as_array()
        .expect("forcedAfter")
        .iter()
        .map(|f| {
            (
                f["strategy"].as_str().unwrap().to_string(),
                f["minutes"].as_u64().unwrap(),
            )
        })
        .collect();
    // nodeDrain defaults (timeOut 45, expectedNodeDrainTime 8), PDBForceDrainTimeout 0.
    assert_eq!(
        forced,
        [
            ("DELETE".to_string(), 45),
            ("DEFAULT-FINALIZER".to_string(), 45),
            ("POD-STUCK-TERMINATING".to_string(), 45),
            ("PDB-DELETE".to_string(), 8),
            ("PDB-FINALIZER".to_string(), 8),
        ]
    );
    assert_eq!(plan["campaigns"][0]["phase"], serde_json::Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_due_later_is_not_waited_for_and_its_held_moves_are_named() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let mut syncer = common::syncer(&client, repo.path()).await;
    let (stop, task) = controllers(&client);
    syncer.sync().await.expect("sync");
    upgrade::converged(&client).await;

    let later = seconds_from_now(3600);
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("campaign.yaml", Some(&campaign(later))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
            ("nodes/worker-3.yaml", Some(&label("worker-3", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    syncer.sync().await.expect("sync");
    wait_until("the campaign pending", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Pending)
    })
    .await;
    // What --once waits for (nothing) and what it says instead of "converged".
    let survey = common::wait_for("nothing pending but the held moves", async || {
        let survey = controllers::converge::survey(
            &client,
            &Selection::all(),
            &capstan_api::clock::SystemClock,
        )
        .await
        .map_err(|err| err.to_string())?;
        if survey.pending.is_empty() {
            Ok(survey)
        } else {
            Err(format!("{:?}", survey.pending))
        }
    })
    .await;
    assert_eq!(
        survey.summary(),
        format!(
            "applied; 2 node moves held until {later} by campaign kmm-demo/my-kmod-v2; nothing \
             else pending"
        )
    );
    stop.cancel();
    task.await.expect("controllers stop");
}

/// `capstan sync` following `repo` into `cluster` as a process of its own, its log on a
/// channel; `state` is its state directory (the same for a restart).
fn sync_process(
    repo: &std::path::Path,
    kubeconfig: &std::path::Path,
    state: &std::path::Path,
) -> crate::sync_cli::Running {
    crate::sync_cli::Running::start(
        std::process::Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args([
                "sync",
                "--interval",
                "1h",
                "--listen",
                "127.0.0.1:0",
                "--repo",
            ])
            .arg(repo)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--state-dir")
            .arg(state)
            // The default log: capstan's own lines at info, without colours.
            .env("RUST_LOG", "capstan=info,warn")
            .env("NO_COLOR", "1"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_state_change_is_one_log_line_and_a_restart_says_what_it_resumes() {
    let (cluster, client) = common::start_default_simulated().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    capstan_cluster::kubeconfig::write(&kubeconfig, &cluster.kubeconfig()).expect("kubeconfig");
    let state = dir.path().join("state");
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);

    let mut first = sync_process(repo.path(), &kubeconfig, &state);
    first.wait_for("applied");
    upgrade::converged(&client).await;
    workload(&client, "worker-1").await;
    // A budget that allows no disruption: the drain waits on it across the restart.
    budget(&client, "demo").await;
    // A campaign due already, worker-1 relabelled.
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("campaign.yaml", Some(&campaign(seconds_from_now(-60)))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    first.wait_for(&format!(
        "refused eviction of {NS}/app-worker-1 from worker-1"
    ));
    let mut lines = first.stop();

    // A new capstan finds the campaign upgrading and worker-1 cordoned, its drain held.
    let mut second = sync_process(repo.path(), &kubeconfig, &state);
    // The controllers start together: these come in any order.
    second.seen_or_wait_for("resumed campaign kmm-demo/my-kmod-v2 after a restart: Upgrading");
    second.seen_or_wait_for("resumed the drain of worker-1 after a restart");
    second.seen_or_wait_for(&format!(
        "refused eviction of {NS}/app-worker-1 from worker-1"
    ));
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), NS);
    budgets
        .delete("demo", &Default::default())
        .await
        .expect("delete the budget");
    second.wait_for(&format!("evicted {NS}/app-worker-1 from worker-1"));
    second.wait_for("campaign kmm-demo/my-kmod-v2 Upgrading -> Upgraded");
    lines.extend(second.stop());

    let said =
        |text: &str| -> Vec<&String> { lines.iter().filter(|line| line.contains(text)).collect() };
    // Each state change, once over both runs, with the campaign's pull request.
    for change in [
        "campaign kmm-demo/my-kmod-v2 New: a campaign for v2",
        "campaign kmm-demo/my-kmod-v2 New -> Pending",
        "campaign kmm-demo/my-kmod-v2 Pending -> Upgrading",
        "worker-1 cordoned and marked upgrading for its upgrade to v2",
        "resumed campaign kmm-demo/my-kmod-v2 after a restart",
        "resumed the drain of worker-1 after a restart",
        "worker-1 drained for its upgrade to v2",
        "v1 -> v2 on worker-1: step 1 device-plugin-stopped",
        "v1 -> v2 on worker-1: step 2 old-module-unloaded",
        "v1 -> v2 on worker-1: step 3 new-module-loaded",
        "v1 -> v2 on worker-1: step 4 device-plugin-started",
        "worker-1 uncordoned and unmarked for its upgrade to v2",
        "campaign kmm-demo/my-kmod-v2 Upgrading -> Upgraded",
        "evicted kmm-demo/app-worker-1 from worker-1",
    ] {
        let found = said(change);
        assert_eq!(found.len(), 1, "{change}: {found:#?}\n{}", lines.join("\n"));
        assert!(found[0].contains("pull_request=#2"), "{}", found[0]);
    }
    // The budget's refusal: once by each capstan, not at each retry.
    let refused = said(&format!(
        "refused eviction of {NS}/app-worker-1 from worker-1"
    ));
    assert_eq!(refused.len(), 2, "{refused:#?}");
}
