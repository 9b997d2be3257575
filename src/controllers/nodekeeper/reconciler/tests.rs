//! One reconcile of a node, call by call: the exact requests the nodekeeper sends the API
//! server, in order, with their bodies, and when it looks again. The caches are filled as
//! the watches would fill them; the API server is the scenario ([`fixtures`]).
//!
//! Event bodies are not compared: they carry a random name and the wall-clock time.

use std::time::Duration;

use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::fixtures::{self, Call, REVISION_12, SHA_12, commit_12, store};
use crate::controllers::metrics::UpgradeMetrics;
use capstan_api::clock::ManualClock;
use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION, UNSCHEDULABLE_TAINT};

const NOW: &str = "2026-11-26T12:00:00Z";
/// 50 minutes before [`NOW`]: past `timeOut` 45, before the PDB wait 68.
const CORDONED_AT: &str = "2026-11-26T11:10:00Z";

const RECORDS: &str = "/apis/capstan.dev/v1alpha1/namespaces/capstan-system/historyrecords?";
const PODS_ON_WORKER_1: &str = "/api/v1/pods?&fieldSelector=spec.nodeName%3Dworker-1";
const PDBS: &str = "/apis/policy/v1/poddisruptionbudgets?";

fn parse<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// worker-1, cordoned at `cordoned_at` (a taint without `timeAdded` when `None`), stamped
/// with the commit of #12.
fn worker_1(cordoned_at: Option<&str>) -> Value {
    let mut taint = json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"});
    if let Some(at) = cordoned_at {
        taint["timeAdded"] = json!(at);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "worker-1",
            "uid": "uid-worker-1",
            "resourceVersion": "7",
            "annotations": {REVISION_ANNOTATION: REVISION_12, PULL_REQUEST_ANNOTATION: "12"},
        },
        "spec": {"unschedulable": true, "taints": [taint]},
    })
}

/// The campaign: Upgrading, `PDBForceDrainTimeout` 60.
fn campaign() -> UpgradeConfig {
    campaign_in("Upgrading")
}

/// The campaign, its entry for v2 in `phase`.
fn campaign_in(phase: &str) -> UpgradeConfig {
    parse(json!({
        "apiVersion": "upgrade.managed.openshift.io/v1alpha1",
        "kind": "UpgradeConfig",
        "metadata": {"name": "my-kmod-v2", "namespace": "fleet"},
        "spec": {"type": "OSD", "upgradeAt": "2026-11-26T09:00:00Z",
                 "PDBForceDrainTimeout": 60, "desired": {"version": "v2"}},
        "status": {"history": [{"version": "v2", "phase": phase}]},
    }))
}

/// The `GitSync` that applies worker-1 under the default `nodeDrain` (45 and 8 minutes),
/// listing the commit of #12.
fn git_sync() -> GitSync {
    parse(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "GitSync",
        "metadata": {"name": "capstan", "namespace": "capstan-system"},
        "spec": {"repo": "fleet", "branch": "main"},
        "status": {
            "phase": "Applied",
            "lastAppliedCommit": commit_12(),
            "inventory": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1",
                           "digest": "0123456789abcdef"}],
            "policy": {"maxNodesInFlight": 1, "nodeDrain": {"timeOut": 45, "expectedNodeDrainTime": 8}},
        },
    }))
}

/// A pod on worker-1 in `apps`.
fn pod(name: &str, metadata: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "worker-1", "containers": []},
    });
    if let (Some(into), Value::Object(extra)) = (pod["metadata"].as_object_mut(), metadata) {
        into.extend(extra);
    }
    pod
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {}, "items": items})
}

/// Runs one reconcile of `node` (as cached) at [`NOW`] under `campaigns` against an API
/// server that expects exactly `calls`; returns its result and the node's metric after it.
async fn reconcile_once(
    node: Value,
    campaigns: Vec<UpgradeConfig>,
    calls: Vec<Call>,
) -> (Result<Action, ReconcileError>, Option<i64>) {
    let (result, metrics) = reconcile_after_failures(&[], node, campaigns, calls).await;
    (result, metrics.node_drain_timeout("worker-1"))
}

/// As [`reconcile_once`], the drains of `failed` nodes having raised their metric before
/// it; returns the metrics after it.
async fn reconcile_after_failures(
    failed: &[&str],
    node: Value,
    campaigns: Vec<UpgradeConfig>,
    calls: Vec<Call>,
) -> (Result<Action, ReconcileError>, Arc<UpgradeMetrics>) {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let ctx = Context::with_clock(client, Arc::new(clock), CancellationToken::new());
    let metrics = ctx.metrics.clone();
    for node in failed {
        metrics.set_node_drain_timeout(node);
    }
    let shared = Arc::new(Shared {
        ctx,
        configs: store(campaigns),
        syncs: store(vec![git_sync()]),
    });
    let result = reconcile(Arc::new(parse(node)), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    (result, metrics)
}

/// The history record of `strategy` on worker-1, asked by #12.
fn strategy_record(name: &str, strategy: &str, message: &str) -> Value {
    json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "HistoryRecord",
        "metadata": {
            "name": name,
            "labels": {
                "capstan.dev/record-type": "DrainStrategy",
                "capstan.dev/commit": SHA_12,
                "capstan.dev/sync": "capstan",
                "capstan.dev/node": "worker-1",
            },
            "annotations": {"capstan.dev/revision": REVISION_12, "capstan.dev/pull-request": "12"},
        },
        "spec": {
            "time": "2026-11-26T12:00:00.000000Z",
            "type": "DrainStrategy",
            "sync": "capstan",
            "commit": commit_12(),
            "message": message,
            "node": "worker-1",
            "step": strategy,
        },
    })
}

fn post_record(record: &Value) -> Call {
    Call::new("POST", RECORDS, Some(record.clone()), record.clone())
}

fn delete_pod(name: &str) -> Call {
    Call::new(
        "DELETE",
        format!("/api/v1/namespaces/apps/pods/{name}?"),
        Some(json!({"gracePeriodSeconds": 0, "preconditions": {"uid": format!("uid-{name}")}})),
        pod(name, json!({})),
    )
}

fn strip_pod(name: &str) -> Call {
    Call::new(
        "PATCH",
        format!("/api/v1/namespaces/apps/pods/{name}?&fieldManager=capstan-nodekeeper"),
        Some(json!([
            {"op": "test", "path": "/metadata/uid", "value": format!("uid-{name}")},
            {"op": "add", "path": "/metadata/finalizers", "value": []},
        ])),
        pod(name, json!({})),
    )
}

fn delete_record() -> Value {
    strategy_record(
        "strategy-74c2a0f01247",
        "DELETE",
        "DELETE (Default pod deletion) on worker-1, draining since 2026-11-26T11:10:00Z: \
         apps/cache deleted",
    )
}

#[tokio::test]
async fn past_the_drain_timeout_a_held_pod_is_recorded_deleted_and_stripped() {
    let cache = pod("cache", json!({"finalizers": ["example.com/hold"]}));
    let agent = pod(
        "agent",
        json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                     "name": "agent", "uid": "uid-ds"}]}),
    );
    let stripped = strategy_record(
        "strategy-3ce597177148",
        "DEFAULT-FINALIZER",
        "DEFAULT-FINALIZER (Default pod finalizer removal) on worker-1, draining since \
         2026-11-26T11:10:00Z: apps/cache finalizers stripped",
    );
    let (log, _capture) = crate::history::log_lines::LogLines::capture();
    let (result, metric) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(PODS_ON_WORKER_1, list("PodList", vec![cache, agent])),
            Call::get(PDBS, list("PodDisruptionBudgetList", vec![])),
            post_record(&delete_record()),
            fixtures::event("default"),
            delete_pod("cache"),
            post_record(&stripped),
            fixtures::event("default"),
            strip_pod("cache"),
        ],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::requeue(RECHECK));
    // 50 minutes in, not failed (the last due wait, 45, + 8 has not passed).
    assert_eq!(metric, Some(0));
    // Each strategy that forced the drain is said once, as its record is created, with the
    // node's commit and pull request.
    let lines = log.lines();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    for (line, forced) in lines.iter().zip([
        "DELETE (Default pod deletion) on worker-1, draining since 2026-11-26T11:10:00Z: \
         apps/cache deleted",
        "DEFAULT-FINALIZER (Default pod finalizer removal) on worker-1, draining since \
         2026-11-26T11:10:00Z: apps/cache finalizers stripped",
    ]) {
        assert!(
            line.contains(&format!(
                "INFO capstan::history: the nodekeeper forced a drain: {forced}, asked by \
                 3cf3bea (#12)"
            )),
            "{line}"
        );
        assert!(
            line.contains("node=worker-1 commit=3cf3bea pull_request=#12"),
            "{line}"
        );
    }
}

#[tokio::test]
async fn a_record_written_before_a_restart_is_not_written_again_and_the_pod_still_goes() {
    let cache = pod("cache", json!({}));
    let (log, _capture) = crate::history::log_lines::LogLines::capture();
    let (result, _) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(PODS_ON_WORKER_1, list("PodList", vec![cache])),
            Call::get(PDBS, list("PodDisruptionBudgetList", vec![])),
            post_record(&delete_record()).failing(409, "AlreadyExists"),
            delete_pod("cache"),
        ],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::requeue(RECHECK));
    // Said when the record was created, before the restart: not again.
    assert_eq!(log.lines(), Vec::<String>::new());
}

#[tokio::test]
async fn a_pod_gone_before_its_deletion_is_no_error() {
    let (result, _) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(
                PODS_ON_WORKER_1,
                list("PodList", vec![pod("cache", json!({}))]),
            ),
            Call::get(PDBS, list("PodDisruptionBudgetList", vec![])),
            post_record(&delete_record()),
            fixtures::event("default"),
            delete_pod("cache").failing(404, "NotFound"),
        ],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::requeue(RECHECK));
}

#[tokio::test]
async fn a_cordoned_node_without_a_start_is_an_error_and_keeps_its_metric() {
    let (result, metric) = reconcile_once(worker_1(None), vec![campaign()], vec![]).await;
    let err = result.expect_err("no start");
    assert_eq!(
        err.to_string(),
        "cannot determine drain commencement time for node worker-1"
    );
    assert_eq!(metric, None);
}

#[tokio::test]
async fn without_an_upgrading_campaign_nothing_is_read() {
    let (result, metric) = reconcile_once(worker_1(Some(CORDONED_AT)), vec![], vec![]).await;
    assert_eq!(result.expect("reconciled"), Action::await_change());
    assert_eq!(metric, None);
}

#[tokio::test]
async fn before_the_drain_timeout_the_pods_are_not_read() {
    let (result, metric) = reconcile_once(
        worker_1(Some("2026-11-26T11:30:00Z")),
        vec![campaign()],
        vec![],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::requeue(RECHECK));
    assert_eq!(metric, Some(0));
    assert_eq!(RECHECK, Duration::from_secs(60));
}

#[tokio::test]
async fn a_failed_deletion_still_tries_every_pod_of_its_strategy_then_stops_the_pass() {
    // DELETE acts on both pods, then DEFAULT-FINALIZER would strip cache's finalizers.
    let two = vec![
        pod("cache", json!({"finalizers": ["example.com/hold"]})),
        pod("web", json!({})),
    ];
    let record = strategy_record(
        "strategy-0",
        "DELETE",
        "DELETE (Default pod deletion) on worker-1, draining since 2026-11-26T11:10:00Z: \
         apps/cache deleted, apps/web deleted",
    );
    let (result, metric) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(PODS_ON_WORKER_1, list("PodList", two)),
            Call::get(PDBS, list("PodDisruptionBudgetList", vec![])),
            post_record(&record).any_body(),
            fixtures::event("default"),
            delete_pod("cache").failing(500, "InternalError"),
            // web is still deleted; DEFAULT-FINALIZER waits for the retry.
            delete_pod("web"),
        ],
    )
    .await;
    let err = result.expect_err("the deletion failed");
    assert!(
        err.to_string()
            .starts_with("node worker-1: DELETE: forcing pods off the node: apps/cache: "),
        "{err}"
    );
    assert!(!err.to_string().contains("apps/web"), "{err}");
    assert_eq!(metric, None);
}

#[tokio::test]
async fn every_pod_a_strategy_could_not_force_is_in_its_error() {
    let two = vec![pod("cache", json!({})), pod("web", json!({}))];
    let record = strategy_record("strategy-0", "DELETE", "any");
    let (result, _) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(PODS_ON_WORKER_1, list("PodList", two)),
            Call::get(PDBS, list("PodDisruptionBudgetList", vec![])),
            post_record(&record).any_body(),
            fixtures::event("default"),
            delete_pod("cache").failing(500, "InternalError"),
            delete_pod("web").failing(403, "Forbidden"),
        ],
    )
    .await;
    let Err(ReconcileError::Forcing {
        node,
        strategy,
        failures,
    }) = result
    else {
        panic!("a forcing error: {result:?}");
    };
    let pods: Vec<String> = failures.iter().map(|(pod, _)| pod.to_string()).collect();
    assert_eq!(
        (node.as_str(), strategy, pods),
        (
            "worker-1",
            "DELETE",
            vec!["apps/cache".into(), "apps/web".into()]
        )
    );
}

/// The campaign's end, by each way it can end, with worker-1 still cordoned past its
/// drain's time and worker-2's drain failed earlier.
#[tokio::test]
async fn once_no_campaign_is_upgrading_every_drain_alert_is_dropped() {
    let ends = [
        ("Upgraded", vec![campaign_in("Upgraded")]),
        ("Failed", vec![campaign_in("Failed")]),
        ("the UpgradeConfig deleted", vec![]),
    ];
    for (end, campaigns) in ends {
        let (result, metrics) = reconcile_after_failures(
            &["worker-1", "worker-2"],
            worker_1(Some(CORDONED_AT)),
            campaigns,
            vec![],
        )
        .await;
        assert_eq!(result.expect("reconciled"), Action::await_change(), "{end}");
        assert_eq!(metrics.node_drain_timeout("worker-1"), None, "{end}");
        assert_eq!(metrics.node_drain_timeout("worker-2"), None, "{end}");
    }
}

#[tokio::test]
async fn while_a_campaign_upgrades_other_nodes_keep_their_drain_alerts() {
    // worker-1, cordoned 30 minutes ago, is not failed; worker-2's alert stands.
    let (result, metrics) = reconcile_after_failures(
        &["worker-1", "worker-2"],
        worker_1(Some("2026-11-26T11:30:00Z")),
        vec![campaign()],
        vec![],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::requeue(RECHECK));
    assert_eq!(metrics.node_drain_timeout("worker-1"), Some(0));
    assert_eq!(metrics.node_drain_timeout("worker-2"), Some(1));
}

#[tokio::test]
async fn a_failed_pod_list_is_an_error() {
    let (result, metric) = reconcile_once(
        worker_1(Some(CORDONED_AT)),
        vec![campaign()],
        vec![
            Call::get("/api/v1/nodes/worker-1", worker_1(Some(CORDONED_AT))),
            Call::get(PODS_ON_WORKER_1, json!({})).failing(500, "InternalError"),
        ],
    )
    .await;
    let err = result.expect_err("the list failed");
    assert!(
        err.to_string()
            .starts_with("node worker-1: listing the node's pods:"),
        "{err}"
    );
    assert_eq!(metric, None);
}
