//! One reconcile of a draining node, call by call: the exact requests the drain controller
//! sends the API server, in order, with their bodies, and when it looks again. The API
//! server is the scenario ([`fixtures`]).
//!
//! Event bodies are not compared: they carry a random name and the wall-clock time.

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::fixtures::{self, Call, REVISION_12, SHA_12, commit_12};
use capstan_api::clock::ManualClock;
use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};

const NOW: &str = "2026-11-26T12:00:00Z";

const NODE: &str = "/api/v1/nodes/worker-1";
const PODS_ON_WORKER_1: &str = "/api/v1/pods?&fieldSelector=spec.nodeName%3Dworker-1";
const RECORDS: &str = "/apis/capstan.dev/v1alpha1/namespaces/capstan-system/historyrecords?";
const NODE_PATCH: &str = "/api/v1/nodes/worker-1?&fieldManager=capstan-drain";

fn parse<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// The drain the version-label controller started on worker-1 for #12's move to v2.
fn draining() -> DrainState {
    DrainState {
        to: Some("v2".into()),
        campaign: "fleet/my-kmod-v2".into(),
        revision: Some(REVISION_12.into()),
        pull_request: Some(12),
        cordoned_at: "2026-11-26T11:50:00Z".parse().expect("a time"),
        was_cordoned: false,
        drained_at: None,
    }
}

/// worker-1, cordoned, carrying `state`.
fn worker_1(state: &DrainState) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "worker-1",
            "uid": "uid-worker-1",
            "resourceVersion": "7",
            "annotations": {
                REVISION_ANNOTATION: REVISION_12,
                PULL_REQUEST_ANNOTATION: "12",
                DRAIN_ANNOTATION: state.to_annotation(),
            },
        },
        "spec": {"unschedulable": true},
    })
}

/// The `GitSync` that applies worker-1, listing the commit of #12.
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
        },
    }))
}

/// A running pod on worker-1 in `apps`, with `metadata` merged in.
fn pod(name: &str, metadata: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "apps", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "worker-1", "containers": []},
        "status": {"phase": "Running"},
    });
    if let (Some(into), Value::Object(extra)) = (pod["metadata"].as_object_mut(), metadata) {
        into.extend(extra);
    }
    pod
}

/// A DaemonSet's pod: the drain leaves it, as `kubectl drain --ignore-daemonsets` does.
fn daemon_pod() -> Value {
    pod(
        "agent",
        json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                     "name": "agent", "uid": "uid-ds", "controller": true}]}),
    )
}

fn pods(items: Vec<Value>) -> Call {
    Call::get(
        PODS_ON_WORKER_1,
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
    )
}

/// The eviction of `name` in `apps`, as kube 5 sends it: its delete options under
/// `delete_options`, a name the API server does not read (capstan sets none).
fn evict(name: &str) -> Call {
    Call::new(
        "POST",
        format!("/api/v1/namespaces/apps/pods/{name}/eviction?"),
        Some(json!({"delete_options": null, "metadata": {"name": name}})),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    )
}

/// The creation of the `drained` record of worker-1's drain, asked by #12.
fn post_drained_record() -> Call {
    let record = drained_record();
    Call::new("POST", RECORDS, Some(record.clone()), record)
}

fn drained_record() -> Value {
    json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "HistoryRecord",
        "metadata": {
            "name": "drain-3cf3bea-84e82d74ee16",
            "labels": {
                "capstan.dev/record-type": "Drain",
                "capstan.dev/commit": SHA_12,
                "capstan.dev/sync": "capstan",
                "capstan.dev/node": "worker-1",
            },
            "annotations": {"capstan.dev/revision": REVISION_12, "capstan.dev/pull-request": "12"},
        },
        "spec": {
            "time": "2026-11-26T12:00:00.000000Z",
            "type": "Drain",
            "sync": "capstan",
            "commit": commit_12(),
            "message": "worker-1 drained for its upgrade to v2 (campaign fleet/my-kmod-v2), \
                        asked by 3cf3bea (#12)",
            "node": "worker-1",
            "step": "drained",
            "toVersion": "v2",
        },
    })
}

/// The patch that marks the drain done: its state with `drainedAt`, on the node's
/// resourceVersion.
fn mark_drained() -> Call {
    let drained = DrainState {
        drained_at: Some(NOW.parse().expect("a time")),
        ..draining()
    };
    Call::new(
        "PATCH",
        NODE_PATCH,
        Some(json!({"metadata": {
            "resourceVersion": "7",
            "annotations": {DRAIN_ANNOTATION: drained.to_annotation()},
        }})),
        worker_1(&drained),
    )
}

/// Runs one reconcile of `node` (as cached) at [`NOW`] against an API server that expects
/// exactly `calls`.
async fn reconcile_once(node: Value, calls: Vec<Call>) -> Result<Action, kube::Error> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let shared = Arc::new(Shared::new(
        Context::with_clock(client, Arc::new(clock), CancellationToken::new()),
        fixtures::store(vec![git_sync()]),
    ));
    let result = reconcile(Arc::new(parse(node)), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

/// A pod that ran to completion: nothing to move.
fn finished_pod() -> Value {
    let mut finished = pod("migrate", json!({}));
    finished["status"]["phase"] = json!("Succeeded");
    finished
}

#[tokio::test]
async fn the_pods_the_drain_moves_are_evicted_and_daemon_and_finished_pods_stay() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![
                pod("web", json!({})),
                daemon_pod(),
                finished_pod(),
                pod("cache", json!({})),
            ]),
            evict("web"),
            evict("cache"),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(EVICTION_RECHECK));
}

#[tokio::test]
async fn a_budget_refusing_an_eviction_is_retried_after_kubectl_drains_wait() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![pod("web", json!({})), pod("cache", json!({}))]),
            evict("web").failing(429, "TooManyRequests"),
            evict("cache"),
        ],
    )
    .await
    .expect("a refusal is no error");
    assert_eq!(action, Action::requeue(PDB_RETRY));
}

#[tokio::test]
async fn a_pod_gone_before_its_eviction_is_no_error() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![pod("web", json!({}))]),
            evict("web").failing(404, "NotFound"),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(EVICTION_RECHECK));
}

#[tokio::test]
async fn pods_already_terminating_are_waited_for_not_evicted_again() {
    let node = worker_1(&draining());
    let leaving = pod(
        "web",
        json!({"deletionTimestamp": "2026-11-26T11:59:50Z", "deletionGracePeriodSeconds": 30}),
    );
    let action = reconcile_once(
        node.clone(),
        vec![Call::get(NODE, node), pods(vec![leaving, daemon_pod()])],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(EVICTION_RECHECK));
}

#[tokio::test]
async fn with_no_pod_left_to_move_the_drain_is_recorded_then_marked_done() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![daemon_pod(), finished_pod()]),
            post_drained_record(),
            fixtures::event("default"),
            mark_drained(),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_drained_record_written_before_a_restart_gets_no_second_event() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![]),
            post_drained_record().failing(409, "AlreadyExists"),
            mark_drained(),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_node_changed_since_it_was_read_is_marked_on_the_next_look() {
    let node = worker_1(&draining());
    let action = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![]),
            post_drained_record(),
            fixtures::event("default"),
            mark_drained().failing(409, "Conflict"),
        ],
    )
    .await
    .expect("a conflict is no error");
    assert_eq!(action, Action::requeue(Duration::from_millis(200)));
}

#[tokio::test]
async fn a_drained_node_or_one_without_a_drain_makes_no_call() {
    let drained = DrainState {
        drained_at: Some(NOW.parse().expect("a time")),
        ..draining()
    };
    let action = reconcile_once(worker_1(&drained), vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());

    let mut plain = worker_1(&draining());
    plain["metadata"]["annotations"] = json!({});
    let action = reconcile_once(plain, vec![]).await.expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_failed_pod_list_is_an_error_retried_by_the_error_policy() {
    let node = worker_1(&draining());
    let result = reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            Call::get(PODS_ON_WORKER_1, json!({})).failing(500, "InternalError"),
        ],
    )
    .await;
    assert!(result.is_err(), "{result:?}");
}

#[tokio::test]
async fn a_refused_eviction_is_said_once_then_once_a_minute_then_when_it_goes_through() {
    let (log, _capture) = crate::history::log_lines::LogLines::capture();
    let node = worker_1(&draining());
    let look = |eviction: Call| {
        vec![
            Call::get(NODE, node.clone()),
            pods(vec![pod("web", json!({}))]),
            eviction,
        ]
    };
    let refused = || evict("web").failing(429, "TooManyRequests");
    let calls = [
        look(refused()),
        look(refused()),
        look(refused()),
        look(evict("web")),
    ]
    .concat();
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let ctx = Context::with_clock(client, Arc::new(clock.clone()), CancellationToken::new());
    let shared = Arc::new(Shared::new(ctx, fixtures::store(vec![git_sync()])));
    // Looks at 12:00:00, :05 (the retry), 12:01:00 and 12:01:05.
    for (advance, next) in [
        (0, PDB_RETRY),
        (5, PDB_RETRY),
        (55, PDB_RETRY),
        (5, EVICTION_RECHECK),
    ] {
        clock.advance(Duration::from_secs(advance));
        let action = reconcile(Arc::new(parse(node.clone())), shared.clone())
            .await
            .expect("a refusal is no error");
        assert_eq!(action, Action::requeue(next));
    }
    drop(shared);
    server
        .await
        .expect("the reconciles made the scenario's calls, in order");

    let lines = log.lines();
    let said = |text: &str| lines.iter().filter(|line| line.contains(text)).count();
    // The drain was begun at 11:50, before this controller started: resumed, said once.
    assert_eq!(
        said(
            "resumed the drain of worker-1 after a restart: cordoned 10m ago, its pods still to \
             move, for its upgrade to v2 (campaign fleet/my-kmod-v2), asked by 3cf3bea (#12)"
        ),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        said("refused eviction of apps/web from worker-1: TooManyRequests; retrying every 5 s"),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        said("still refused: 1 pod of worker-1, first refused 1m ago"),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        said("evicted apps/web from worker-1, 1m 5s after its first refusal"),
        1,
        "{lines:#?}"
    );
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for line in &lines {
        assert!(
            line.contains("node=worker-1") && line.contains("commit=3cf3bea"),
            "{line}"
        );
        assert!(line.contains("pull_request=#12"), "{line}");
    }
}

#[tokio::test]
async fn the_drained_record_is_said_once_as_it_is_created() {
    let (log, _capture) = crate::history::log_lines::LogLines::capture();
    let node = worker_1(&draining());
    reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node.clone()),
            pods(vec![]),
            post_drained_record(),
            fixtures::event("default"),
            mark_drained(),
        ],
    )
    .await
    .expect("reconciled");
    // A restart before the mark finds the record: nothing more is said of it.
    reconcile_once(
        node.clone(),
        vec![
            Call::get(NODE, node),
            pods(vec![]),
            post_drained_record().failing(409, "AlreadyExists"),
            mark_drained(),
        ],
    )
    .await
    .expect("reconciled");
    let drained = log.containing(
        "worker-1 drained for its upgrade to v2 (campaign fleet/my-kmod-v2), asked by 3cf3bea \
         (#12)",
    );
    assert_eq!(drained.len(), 1, "{:#?}", log.lines());
    assert!(
        drained[0].contains("commit=3cf3bea") && drained[0].contains("pull_request=#12"),
        "{}",
        drained[0]
    );
}
