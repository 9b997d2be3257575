//! The nodekeeper (managed-upgrade-operator's), alone, under an Upgrading campaign: which
//! pods a cordoned node is forced to give up and when, what it records, and
//! `upgradeoperator_node_drain_timeout`.
//!
//! Nodes are cordoned by hand, as capstan's drain (or `kubectl cordon`) leaves them, with a
//! cordon taint `timeAdded` set minutes in the past: that is how long the drain has run. A
//! cordoned node is reconciled again at each change, so moving its `timeAdded` further back
//! moves the drain on without waiting. The campaign is made Upgrading by writing its status;
//! the `nodeDrain` settings are a `GitSync`'s status policy, as the sync writes it.

use crate::common;

use std::sync::Arc;

use capstan::controllers::nodekeeper::records;
use capstan::controllers::nodekeeper::{PodRef, Strategy, StrategyRun};
use capstan::controllers::upgrade::{Policies, Stamp};
use capstan::controllers::{self, Context};
use capstan_api::labels::{
    PULL_REQUEST_ANNOTATION, RECORD_NODE_LABEL, RECORD_TYPE_LABEL, REVISION_ANNOTATION,
    UNSCHEDULABLE_TAINT, UPGRADE_STATE_ANNOTATION,
};
use capstan_api::upgrade_config::UpgradeConfig;
use capstan_api::{GitSync, HistoryRecord};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const APPS: &str = "apps";
const SYSTEM: &str = "capstan-system";
const REVISION: &str = "main@sha1:7e57ab1e00000000000000000000000000000007";

/// `timeOut` 45, `expectedNodeDrainTime` 8, and `extra` (MUO's example settings).
fn node_drain(extra: Value) -> Value {
    let mut drain = json!({"timeOut": 45, "expectedNodeDrainTime": 8});
    if let (Some(drain), Value::Object(extra)) = (drain.as_object_mut(), extra) {
        drain.extend(extra);
    }
    drain
}

/// The default cluster (a control-plane node labelled master, three workers), namespaces
/// `apps` and `capstan-system`, a `GitSync` whose policy carries `drain`, and a campaign
/// Upgrading with `PDBForceDrainTimeout` 60.
async fn world(drain: Value) -> (common::TestCluster, kube::Client) {
    let (cluster, client) = common::start_default_simulated().await;
    for name in [APPS, SYSTEM] {
        create_namespace(&client, name).await;
    }
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM);
    let sync: GitSync = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "GitSync",
        "metadata": {"name": "fleet", "namespace": SYSTEM},
        "spec": {"repo": "https://git.example/fleet.git", "branch": "main"},
    }))
    .expect("a GitSync");
    syncs
        .create(&PostParams::default(), &sync)
        .await
        .expect("GitSync");
    let inventory: Vec<Value> = ["control-plane", "worker-1", "worker-2", "worker-3"]
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Node", "name": n, "digest": "0"}))
        .collect();
    syncs
        .patch_status(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Applied",
                "policy": {"maxNodesInFlight": 1, "nodeDrain": drain},
                "inventory": inventory, "inventoryCount": 4}})),
        )
        .await
        .expect("GitSync status");
    let campaigns: Api<UpgradeConfig> = Api::namespaced(client.clone(), SYSTEM);
    let campaign: UpgradeConfig = serde_json::from_value(json!({
        "apiVersion": "upgrade.managed.openshift.io/v1alpha1", "kind": "UpgradeConfig",
        "metadata": {"name": "my-kmod-v2", "namespace": SYSTEM},
        "spec": {"type": "OSD", "upgradeAt": "2026-01-01T00:00:00Z",
                 "PDBForceDrainTimeout": 60, "desired": {"version": "v2"}},
    }))
    .expect("an UpgradeConfig");
    campaigns
        .create(&PostParams::default(), &campaign)
        .await
        .expect("UpgradeConfig");
    campaigns
        .patch_status(
            "my-kmod-v2",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"history": [
                {"version": "v2", "precedingVersion": "v1", "phase": "Upgrading",
                 "startTime": "2026-01-01T00:00:00Z"}]}})),
        )
        .await
        .expect("UpgradeConfig status");
    (cluster, client)
}

async fn create_namespace(client: &kube::Client, name: &str) {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
}

/// The nodekeeper, alone, until stopped.
struct Nodekeeper {
    ctx: Arc<Context>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Nodekeeper {
    fn start(client: &kube::Client) -> Nodekeeper {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let running = ctx.clone();
        let task = tokio::spawn(async move {
            controllers::run(running, &"nodekeeper".parse().expect("selection")).await;
        });
        Nodekeeper { ctx, stop, task }
    }

    /// `upgradeoperator_node_drain_timeout{node_name=node}`.
    fn drain_timeout(&self, node: &str) -> Option<i64> {
        self.ctx.metrics.node_drain_timeout(node)
    }

    /// Waits until the metric of `node` reads `value`.
    async fn wait_for_drain_timeout(&self, node: &str, value: i64) {
        common::wait_until(&format!("{node}'s drain timeout at {value}"), async || {
            self.drain_timeout(node) == Some(value)
        })
        .await;
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(common::DEADLINE, self.task)
            .await
            .expect("the nodekeeper stops on shutdown")
            .expect("the nodekeeper ends cleanly");
    }
}

/// `minutes` before now, to the second (as the API server keeps times).
fn minutes_ago(minutes: i64) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() - minutes * 60).expect("a time")
}

/// Cordons `node` as of `since` and marks it upgrading (`capstan.dev/upgrade-state:
/// Working`), keeping its other taints; cordoning it again moves the drain's start.
async fn cordon(client: &kube::Client, node: &str, since: Timestamp) {
    let mut taints = other_taints(client, node).await;
    taints.push(json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule",
                       "timeAdded": since.to_string()}));
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {UPGRADE_STATE_ANNOTATION: "Working"}},
                "spec": {"unschedulable": true, "taints": taints},
            })),
        )
        .await
        .expect("cordon");
}

async fn uncordon(client: &kube::Client, node: &str) {
    let taints = other_taints(client, node).await;
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {UPGRADE_STATE_ANNOTATION: null}},
                "spec": {"unschedulable": null, "taints": taints},
            })),
        )
        .await
        .expect("uncordon");
}

/// The taints of `node` but the cordon's.
async fn other_taints(client: &kube::Client, node: &str) -> Vec<Value> {
    let node = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .expect("node");
    node.spec
        .and_then(|spec| spec.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|taint| taint.key != UNSCHEDULABLE_TAINT)
        .map(|taint| serde_json::to_value(taint).expect("a taint"))
        .collect()
}

/// Creates pod `namespace/name` on `node` with `metadata` merged in.
async fn pod(client: &kube::Client, namespace: &str, name: &str, node: &str, metadata: Value) {
    let mut value = json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/app:1"}]},
    });
    if let (Some(into), Value::Object(extra)) = (value["metadata"].as_object_mut(), metadata) {
        into.extend(extra);
    }
    let pod: Pod = serde_json::from_value(value).expect("a pod");
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|err| panic!("pod {name}: {err}"));
}

async fn pod_exists(client: &kube::Client, namespace: &str, name: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .expect("read pod")
        .is_some()
}

async fn wait_gone(client: &kube::Client, namespace: &str, name: &str) {
    common::wait_until(&format!("{namespace}/{name} gone"), async || {
        !pod_exists(client, namespace, name).await
    })
    .await;
}

/// A PodDisruptionBudget `name` in `namespace` that lets no pod of `selector` go.
async fn budget(client: &kube::Client, namespace: &str, name: &str, selector: Value) {
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minAvailable": 1, "selector": selector},
    }))
    .expect("a PDB");
    Api::<PodDisruptionBudget>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("PDB");
}

/// The DrainStrategy records of `node`: (strategy, message), sorted.
async fn strategy_records(client: &kube::Client, node: &str) -> Vec<(String, String)> {
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM);
    let params = ListParams::default().labels(&format!(
        "{RECORD_TYPE_LABEL}=DrainStrategy,{RECORD_NODE_LABEL}={node}"
    ));
    let mut found: Vec<(String, String)> = records
        .list(&params)
        .await
        .expect("records")
        .items
        .into_iter()
        .map(|record| (record.spec.step.unwrap_or_default(), record.spec.message))
        .collect();
    found.sort();
    found
}

/// The strategies of `node`'s records, each with the pods its message lists.
async fn strategies_recorded(client: &kube::Client, node: &str) -> Vec<(String, String)> {
    strategy_records(client, node)
        .await
        .into_iter()
        .map(|(step, message)| {
            let pods = message
                .split_once(": ")
                .map_or(String::new(), |(_, pods)| pods.to_string());
            (step, pods)
        })
        .collect()
}

fn recorded(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(step, pods)| (step.to_string(), pods.to_string()))
        .collect();
    pairs.sort();
    pairs
}

/// The Events on Node `node` with `reason`.
async fn node_events(client: &kube::Client, node: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|event| {
            event.involved_object.kind.as_deref() == Some("Node")
                && event.involved_object.name.as_deref() == Some(node)
                && event.reason.as_deref() == Some(reason)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_plain_pod_leaves_a_node_cordoned_past_the_drain_timeout() {
    let (_cluster, client) = world(node_drain(json!({}))).await;
    // A DaemonSet's pod on every node, the cordoned ones too (it tolerates the cordon).
    let agent: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": APPS},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"containers": [{"name": "agent", "image": "registry.example/agent:1"}]}},
        },
    }))
    .expect("a DaemonSet");
    Api::<DaemonSet>::namespaced(client.clone(), APPS)
        .create(&PostParams::default(), &agent)
        .await
        .expect("DaemonSet");
    let agent_on_worker_1 = common::wait_for("the agent's pod on worker-1", async || {
        let pods = Api::<Pod>::namespaced(client.clone(), APPS)
            .list(&ListParams::default().fields("spec.nodeName=worker-1"))
            .await
            .map_err(|err| err.to_string())?;
        pods.items
            .into_iter()
            .find(|pod| pod.labels().get("app").map(String::as_str) == Some("agent"))
            .map(|pod| pod.name_any())
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    pod(&client, APPS, "web", "worker-1", json!({})).await;
    pod(&client, APPS, "elsewhere", "worker-2", json!({})).await;
    pod(&client, APPS, "early", "worker-3", json!({})).await;
    let keeper = Nodekeeper::start(&client);

    // worker-3 has drained for 30 minutes, worker-1 for 50: only worker-1 is past timeOut 45.
    cordon(&client, "worker-3", minutes_ago(30)).await;
    cordon(&client, "worker-1", minutes_ago(50)).await;
    wait_gone(&client, APPS, "web").await;
    assert!(
        pod_exists(&client, APPS, &agent_on_worker_1).await,
        "a DaemonSet's pod stays"
    );
    assert!(
        pod_exists(&client, APPS, "elsewhere").await,
        "a pod of a node not cordoned stays"
    );
    assert!(
        pod_exists(&client, APPS, "early").await,
        "before timeOut a pod stays"
    );
    assert_eq!(
        strategies_recorded(&client, "worker-1").await,
        recorded(&[("DELETE", "apps/web deleted")])
    );
    let events = node_events(&client, "worker-1", "DrainPodsDeleted").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    // 50 minutes in, the drain has not failed (45 + 8).
    keeper.wait_for_drain_timeout("worker-1", 0).await;

    // worker-3's drain reaches 50 minutes too.
    cordon(&client, "worker-3", minutes_ago(50)).await;
    wait_gone(&client, APPS, "early").await;
    assert!(strategy_records(&client, "worker-2").await.is_empty());
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_held_by_a_finalizer_is_deleted_then_stripped() {
    let (_cluster, client) = world(node_drain(json!({}))).await;
    pod(
        &client,
        APPS,
        "cache",
        "worker-1",
        json!({"finalizers": ["example.com/hold"]}),
    )
    .await;
    let keeper = Nodekeeper::start(&client);
    cordon(&client, "worker-1", minutes_ago(50)).await;
    wait_gone(&client, APPS, "cache").await;
    assert_eq!(
        strategies_recorded(&client, "worker-1").await,
        recorded(&[
            ("DEFAULT-FINALIZER", "apps/cache finalizers stripped"),
            ("DELETE", "apps/cache deleted"),
        ])
    );
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_a_budget_protects_stays_until_the_pdb_timeout_then_goes() {
    let (_cluster, client) = world(node_drain(json!({}))).await;
    create_namespace(&client, "other").await;
    budget(&client, APPS, "db", json!({"matchLabels": {"app": "db"}})).await;
    // A budget of another namespace protects no pod here (MUO would hold `cache`).
    budget(
        &client,
        "other",
        "cache",
        json!({"matchLabels": {"app": "cache"}}),
    )
    .await;
    pod(
        &client,
        APPS,
        "db-0",
        "worker-1",
        json!({"labels": {"app": "db"}}),
    )
    .await;
    pod(
        &client,
        APPS,
        "cache",
        "worker-1",
        json!({"labels": {"app": "cache"}}),
    )
    .await;
    let keeper = Nodekeeper::start(&client);

    // Past timeOut (45), before PDBForceDrainTimeout + expectedNodeDrainTime (68).
    cordon(&client, "worker-1", minutes_ago(50)).await;
    wait_gone(&client, APPS, "cache").await;
    assert!(
        pod_exists(&client, APPS, "db-0").await,
        "the budget holds db-0"
    );
    // Not failed: PDB-DELETE, still to come, has a pod to act on.
    keeper.wait_for_drain_timeout("worker-1", 0).await;

    cordon(&client, "worker-1", minutes_ago(70)).await;
    wait_gone(&client, APPS, "db-0").await;
    assert_eq!(
        strategies_recorded(&client, "worker-1").await,
        recorded(&[
            ("DELETE", "apps/cache deleted"),
            ("PDB-DELETE", "apps/db-0 deleted"),
        ])
    );

    // Past the last strategy's wait + expectedNodeDrainTime (76), still cordoned: failed.
    cordon(&client, "worker-1", minutes_ago(80)).await;
    keeper.wait_for_drain_timeout("worker-1", 1).await;
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_an_ignored_namespace_are_never_forced() {
    // Unanchored, as MUO matches: "keep" matches `keep-me`.
    let (_cluster, client) = world(node_drain(json!({"ignoredNamespacePatterns": ["keep"]}))).await;
    create_namespace(&client, "keep-me").await;
    pod(&client, "keep-me", "kept", "worker-1", json!({})).await;
    pod(&client, APPS, "web", "worker-1", json!({})).await;
    let keeper = Nodekeeper::start(&client);
    cordon(&client, "worker-1", minutes_ago(80)).await;
    wait_gone(&client, APPS, "web").await;
    assert!(pod_exists(&client, "keep-me", "kept").await);
    assert_eq!(
        strategies_recorded(&client, "worker-1").await,
        recorded(&[("DELETE", "apps/web deleted")])
    );
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_node_is_left_alone() {
    let (_cluster, client) = world(node_drain(json!({}))).await;
    pod(&client, APPS, "on-master", "control-plane", json!({})).await;
    pod(&client, APPS, "web", "worker-1", json!({})).await;
    let keeper = Nodekeeper::start(&client);
    cordon(&client, "control-plane", minutes_ago(80)).await;
    cordon(&client, "worker-1", minutes_ago(80)).await;
    wait_gone(&client, APPS, "web").await;
    keeper.wait_for_drain_timeout("worker-1", 1).await;
    assert!(pod_exists(&client, APPS, "on-master").await);
    assert!(strategy_records(&client, "control-plane").await.is_empty());
    assert_eq!(
        keeper.drain_timeout("control-plane"),
        None,
        "never reconciled"
    );
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_strategies_disabled_a_late_drain_raises_the_metric_until_uncordon_or_deletion() {
    let (_cluster, client) = world(node_drain(json!({"disableDrainStrategies": true}))).await;
    pod(&client, APPS, "web", "worker-1", json!({})).await;
    let keeper = Nodekeeper::start(&client);

    cordon(&client, "worker-1", minutes_ago(40)).await;
    keeper.wait_for_drain_timeout("worker-1", 0).await;
    cordon(&client, "worker-1", minutes_ago(50)).await;
    keeper.wait_for_drain_timeout("worker-1", 1).await;
    assert!(pod_exists(&client, APPS, "web").await, "no strategy runs");
    assert!(strategy_records(&client, "worker-1").await.is_empty());

    uncordon(&client, "worker-1").await;
    keeper.wait_for_drain_timeout("worker-1", 0).await;

    cordon(&client, "worker-2", minutes_ago(50)).await;
    keeper.wait_for_drain_timeout("worker-2", 1).await;
    Api::<Node>::all(client.clone())
        .delete("worker-2", &DeleteParams::default())
        .await
        .expect("delete worker-2");
    keeper.wait_for_drain_timeout("worker-2", 0).await;
    keeper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_drain_executes_no_strategy_twice_and_loses_no_record() {
    let (_cluster, client) = world(node_drain(json!({}))).await;
    pod(
        &client,
        APPS,
        "cache",
        "worker-1",
        json!({"finalizers": ["example.com/hold"]}),
    )
    .await;
    Api::<Node>::all(client.clone())
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                REVISION_ANNOTATION: REVISION, PULL_REQUEST_ANNOTATION: "7"}}})),
        )
        .await
        .expect("stamp worker-1");
    let since = minutes_ago(50);
    cordon(&client, "worker-1", since).await;

    // A nodekeeper wrote DELETE's record and stopped before deleting: the record is there,
    // the pod untouched.
    let uid = Api::<Pod>::namespaced(client.clone(), APPS)
        .get("cache")
        .await
        .expect("cache")
        .uid()
        .expect("a uid");
    let syncs = Api::<GitSync>::namespaced(client.clone(), SYSTEM)
        .list(&ListParams::default())
        .await
        .expect("GitSyncs")
        .items;
    let policies = Policies::of(syncs.into_iter().map(Arc::new).collect());
    let stamp = Stamp {
        revision: Some(REVISION.into()),
        pull_request: Some(7),
    };
    let delete = StrategyRun {
        strategy: Strategy::Delete,
        pods: vec![PodRef {
            namespace: APPS.into(),
            name: "cache".into(),
            uid,
        }],
    };
    let written = records::record(
        &policies,
        "worker-1",
        &stamp,
        since,
        &delete,
        Timestamp::now(),
    );
    assert!(
        capstan::history::write_record(&client, written.spec)
            .await
            .expect("the record before the stop")
    );

    // The restart deletes the pod under that record and strips it under a new one.
    let first = Nodekeeper::start(&client);
    wait_gone(&client, APPS, "cache").await;
    let expected = recorded(&[
        ("DEFAULT-FINALIZER", "apps/cache finalizers stripped"),
        ("DELETE", "apps/cache deleted"),
    ]);
    assert_eq!(strategies_recorded(&client, "worker-1").await, expected);
    first.stop().await;

    // Another restart, the node still cordoned: nothing is left to force, nothing recorded.
    let second = Nodekeeper::start(&client);
    common::wait_until("worker-1 reconciled after the restart", async || {
        second.drain_timeout("worker-1").is_some()
    })
    .await;
    assert_eq!(strategies_recorded(&client, "worker-1").await, expected);
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), SYSTEM);
    let listed = records
        .list(&ListParams::default().labels(&format!("{RECORD_TYPE_LABEL}=DrainStrategy")))
        .await
        .expect("records")
        .items;
    assert_eq!(listed.len(), 2);
    for record in &listed {
        assert_eq!(record.spec.commit.pull_request, Some(7));
        assert_eq!(record.spec.commit.short_sha, "7e57ab1");
        assert_eq!(record.spec.sync, "fleet");
    }
    second.stop().await;
}
