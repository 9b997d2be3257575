//! One reconcile of a node, call by call: for each place seed 002's flow puts a node in,
//! the exact requests the version-label controller sends the API server, in order, with
//! their bodies, and when it looks again. The caches are filled as the watches would fill
//! them; the API server is the scenario ([`fixtures`]).
//!
//! Event bodies are not compared: history's Events carry a random name and the wall-clock
//! time. Their reasons and messages are in the tables of `version_labels::records`.

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::fixtures::{self, Call, REVISION_12, SHA_12, commit_12, store};
use crate::controllers::version_labels::{GUARD_RECHECK, POLICY_RECHECK, UPGRADE_RECHECK};
use capstan_api::clock::ManualClock;
use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};
use serde_json::json;

const NOW: &str = "2026-11-21T10:14:13Z";

const M: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";
const W: &str = "beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod";
const D: &str = "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod";
const READY: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready";
const VERSION_READY: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.version.ready";
const UPGRADE: &str = "capstan.dev/upgrade.kmm-demo.my-kmod";

/// The commit of pull request #13, which moved worker-2 to v2.
const REVISION_13: &str = "main@sha1:d37f9d0a1b2c3d4e5f60718293a4b5c6d7e8f901";

const RECORDS: &str = "/apis/capstan.dev/v1alpha1/namespaces/capstan-system/historyrecords";

fn parse<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// A worker node at resourceVersion 7.
fn node(name: &str, labels: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("uid-{name}"),
            "resourceVersion": "7",
            "labels": labels,
            "annotations": annotations,
        },
    })
}

/// worker-2, running v1 and not relabelled.
fn settled_worker_2() -> Value {
    node(
        "worker-2",
        json!({M: "v1", W: "v1", D: "v1", READY: "", VERSION_READY: "v1"}),
        json!({}),
    )
}

/// The Module, with a device plugin.
fn module() -> Module {
    parse(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": "uid-my-kmod"},
        "spec": {
            "selector": {},
            "devicePlugin": {
                "container": {"image": "registry.example/org/my-kmod-device-plugin:v2"},
            },
        },
    }))
}

/// The Module's device-plugin pod on `node`, running.
fn device_plugin_pod(node: &str) -> Pod {
    parse(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("my-kmod-device-plugin-v2-{node}"),
            "namespace": "kmm-demo",
            "labels": {ROLE_LABEL: DEVICE_PLUGIN_ROLE, MODULE_NAME_LABEL: "my-kmod"},
        },
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running"},
    }))
}

/// The Module's DRA driver pod on `node`, in `phase`.
fn dra_driver_pod(node: &str, phase: &str) -> Pod {
    parse(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("my-kmod-dra-v1-{node}"),
            "namespace": "kmm-demo",
            "labels": {ROLE_LABEL: DRA_ROLE, MODULE_NAME_LABEL: "my-kmod"},
        },
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": phase},
    }))
}

/// The `GitSync` that applies both workers, under `maxNodesInFlight: 1`, and lists the
/// commit of #12.
fn git_sync() -> GitSync {
    let inventory = |name: &str| {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "digest": "0123456789abcdef",
        })
    };
    parse(json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "GitSync",
        "metadata": {"name": "capstan", "namespace": "capstan-system"},
        "spec": {"repo": "fleet", "branch": "main"},
        "status": {
            "phase": "Applied",
            "lastAppliedCommit": commit_12(),
            "inventory": [inventory("worker-1"), inventory("worker-2")],
            "policy": {"maxNodesInFlight": 1, "requirePullRequest": false},
        },
    }))
}

/// The cluster as the controller's caches have it.
struct Caches {
    nodes: Vec<Value>,
    device_plugins: Vec<Pod>,
    dra_drivers: Vec<Pod>,
}

/// Runs one reconcile of `name` (as the node cache has it) at [`NOW`] against an API server
/// that expects exactly `calls`; returns when to look again.
async fn reconcile_once(caches: Caches, name: &str, calls: Vec<Call>) -> Action {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let ctx = Context::with_clock(client, Arc::new(clock), CancellationToken::new());
    let nodes: Vec<Node> = caches.nodes.into_iter().map(parse).collect();
    let cached = nodes
        .iter()
        .find(|node| node.name_any() == name)
        .cloned()
        .expect("the node is cached");
    let shared = Arc::new(Shared {
        ctx,
        nodes: store(nodes),
        modules: store(vec![module()]),
        device_plugins: store(caches.device_plugins),
        dra_drivers: store(caches.dra_drivers),
        syncs: store(vec![git_sync()]),
        upgrade_configs: store(Vec::new()),
        started: NOW.parse().expect("a time"),
        resumed: std::sync::Mutex::new(std::collections::HashSet::new()),
        http: Err("no Prometheus gate in these tests".to_string()),
    });
    let result = reconcile(Arc::new(cached), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result.expect("the reconcile succeeds")
}

/// The list of the Module's device-plugin and DRA driver pods on `node` (metadata only),
/// answered with `pods`.
fn list_pods_on(node: &str, pods: Vec<Pod>) -> Call {
    let items: Vec<Value> = pods
        .iter()
        .map(|pod| json!({"metadata": pod.metadata}))
        .collect();
    Call::get(
        format!(
            "/api/v1/namespaces/kmm-demo/pods?&fieldSelector=spec.nodeName%3D{node}\
             &labelSelector=kmm.node.kubernetes.io%2Frole+in+%28device-plugin%2Cdra%29%2C\
             kmm.node.kubernetes.io%2Fmodule.name%3Dmy-kmod"
        ),
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {}, "items": items}),
    )
}

fn get_node(node: &Value) -> Call {
    let name = node["metadata"]["name"].as_str().expect("a name");
    Call::get(format!("/api/v1/nodes/{name}"), node.clone())
}

fn patch_node(name: &str, body: Value) -> Call {
    Call::new(
        "PATCH",
        format!("/api/v1/nodes/{name}?&fieldManager=capstan-version-labels"),
        Some(body),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
}

/// The history record of a step of worker-1's move from v1 to v2, asked by #12.
fn step_record(name: &str, step: &str, message: &str, duration: f64) -> Value {
    json!({
        "apiVersion": "capstan.dev/v1alpha1",
        "kind": "HistoryRecord",
        "metadata": {
            "name": name,
            "labels": {
                "capstan.dev/record-type": "UpgradeStep",
                "capstan.dev/commit": SHA_12,
                "capstan.dev/sync": "capstan",
                "capstan.dev/node": "worker-1",
                "capstan.dev/module": "kmm-demo.my-kmod",
            },
            "annotations": {"capstan.dev/revision": REVISION_12, "capstan.dev/pull-request": "12"},
        },
        "spec": {
            "time": "2026-11-21T10:14:13.000000Z",
            "type": "UpgradeStep",
            "sync": "capstan",
            "commit": commit_12(),
            "message": message,
            "node": "worker-1",
            "module": "kmm-demo/my-kmod",
            "step": step,
            "fromVersion": "v1",
            "toVersion": "v2",
            "durationSeconds": duration,
        },
    })
}

fn post_record(record: &Value) -> Call {
    Call::new(
        "POST",
        format!("{RECORDS}?"),
        Some(record.clone()),
        record.clone(),
    )
}

#[tokio::test]
async fn a_settled_node_is_not_read() {
    let action = reconcile_once(
        Caches {
            nodes: vec![settled_worker_2()],
            device_plugins: vec![device_plugin_pod("worker-2")],
            dra_drivers: vec![],
        },
        "worker-2",
        vec![],
    )
    .await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_relabelled_node_with_a_free_slot_counts_the_slots_live_then_stops_its_device_plugin() {
    let worker_1 = node(
        "worker-1",
        json!({M: "v2", W: "v1", D: "v1", READY: "", VERSION_READY: "v1"}),
        json!({REVISION_ANNOTATION: REVISION_12, PULL_REQUEST_ANNOTATION: "12"}),
    );
    let listed = json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadataList",
        "metadata": {},
        "items": [
            {"metadata": worker_1["metadata"].clone()},
            {"metadata": settled_worker_2()["metadata"].clone()},
        ],
    });
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1.clone(), settled_worker_2()],
            device_plugins: vec![device_plugin_pod("worker-1")],
            dra_drivers: vec![],
        },
        "worker-1",
        vec![
            get_node(&worker_1),
            Call::get("/api/v1/nodes?", listed),
            patch_node(
                "worker-1",
                json!({"metadata": {
                    "resourceVersion": "7",
                    "labels": {D: null},
                    "annotations": {UPGRADE: format!(
                        r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:13Z"}}"#
                    )},
                }}),
            ),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(UPGRADE_RECHECK));
}

#[tokio::test]
async fn a_node_whose_device_plugin_stopped_confirms_it_records_step_1_and_unloads() {
    let worker_1 = node(
        "worker-1",
        json!({M: "v2", W: "v1", READY: "", VERSION_READY: "v1"}),
        json!({
            REVISION_ANNOTATION: REVISION_12,
            PULL_REQUEST_ANNOTATION: "12",
            UPGRADE: format!(
                r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:11Z"}}"#
            ),
        }),
    );
    let record = step_record(
        "step-3cf3bea-29ed821e678d",
        "device-plugin-stopped",
        "kmm-demo/my-kmod v1 -> v2 on worker-1: step 1 device-plugin-stopped after 2.0s, \
         asked by 3cf3bea (#12)",
        2.0,
    );
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1.clone(), settled_worker_2()],
            device_plugins: vec![],
            dra_drivers: vec![],
        },
        "worker-1",
        vec![
            get_node(&worker_1),
            list_pods_on("worker-1", vec![]),
            post_record(&record),
            fixtures::event("default"),
            fixtures::event("kmm-demo"),
            patch_node(
                "worker-1",
                json!({"metadata": {
                    "resourceVersion": "7",
                    "labels": {W: null},
                    "annotations": {UPGRADE: format!(
                        r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:11Z","step":"device-plugin-stopped","stepAt":"2026-11-21T10:14:13Z"}}"#
                    )},
                }}),
            ),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(UPGRADE_RECHECK));
}

/// worker-1 upgrading from v1 to v2 since 10:14:11, its device plugin stopped (D gone).
fn worker_1_stopping_its_device_plugin() -> Value {
    node(
        "worker-1",
        json!({M: "v2", W: "v1", READY: "", VERSION_READY: "v1"}),
        json!({
            REVISION_ANNOTATION: REVISION_12,
            PULL_REQUEST_ANNOTATION: "12",
            UPGRADE: format!(
                r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:11Z"}}"#
            ),
        }),
    )
}

#[tokio::test]
async fn a_dra_driver_left_on_the_node_keeps_its_module_loaded() {
    // (name, DRA driver pods in the cache, pods the API server lists)
    let rows = [
        (
            "a running driver in the cache",
            vec![dra_driver_pod("worker-1", "Running")],
            None,
        ),
        (
            "a pending driver in the cache",
            vec![dra_driver_pod("worker-1", "Pending")],
            None,
        ),
        (
            "a driver the cache has not seen yet",
            vec![],
            Some(vec![dra_driver_pod("worker-1", "Running")]),
        ),
    ];
    for (name, cached, listed) in rows {
        let worker_1 = worker_1_stopping_its_device_plugin();
        let mut calls = vec![get_node(&worker_1)];
        calls.extend(listed.map(|pods| list_pods_on("worker-1", pods)));
        let action = reconcile_once(
            Caches {
                nodes: vec![worker_1.clone(), settled_worker_2()],
                device_plugins: vec![],
                dra_drivers: cached,
            },
            "worker-1",
            calls,
        )
        .await;
        assert_eq!(action, Action::requeue(GUARD_RECHECK), "{name}");
    }
}

/// worker-1 upgrading (it holds the only slot), worker-2 relabelled by #13.
fn worker_1_upgrading() -> Value {
    node(
        "worker-1",
        json!({M: "v2", W: "v1", READY: "", VERSION_READY: "v1"}),
        json!({UPGRADE: format!(
            r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:11Z"}}"#
        )}),
    )
}

fn worker_2_relabelled(annotations: Value) -> Value {
    let mut worker_2 = node(
        "worker-2",
        json!({M: "v2", W: "v1", D: "v1", READY: "", VERSION_READY: "v1"}),
        json!({REVISION_ANNOTATION: REVISION_13, PULL_REQUEST_ANNOTATION: "13"}),
    );
    if let (Some(all), Value::Object(more)) = (
        worker_2["metadata"]["annotations"].as_object_mut(),
        annotations,
    ) {
        all.extend(more);
    }
    worker_2
}

fn waiting_its_turn() -> String {
    format!(
        r#"{{"from":"v1","to":"v2","revision":"{REVISION_13}","pullRequest":13,"waiting":"slot"}}"#
    )
}

#[tokio::test]
async fn a_node_waiting_for_a_slot_keeps_its_labels_and_says_so_once() {
    let worker_2 = worker_2_relabelled(json!({}));
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1_upgrading(), worker_2.clone()],
            device_plugins: vec![device_plugin_pod("worker-2")],
            dra_drivers: vec![],
        },
        "worker-2",
        vec![
            get_node(&worker_2),
            patch_node(
                "worker-2",
                json!({"metadata": {
                    "resourceVersion": "7",
                    "annotations": {UPGRADE: waiting_its_turn()},
                }}),
            ),
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(POLICY_RECHECK));

    let worker_2 = worker_2_relabelled(json!({UPGRADE: waiting_its_turn()}));
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1_upgrading(), worker_2.clone()],
            device_plugins: vec![device_plugin_pod("worker-2")],
            dra_drivers: vec![],
        },
        "worker-2",
        vec![get_node(&worker_2)],
    )
    .await;
    assert_eq!(action, Action::requeue(POLICY_RECHECK), "announced already");
}

#[tokio::test]
async fn a_node_changed_under_its_write_announces_nothing_and_looks_again_soon() {
    let worker_2 = worker_2_relabelled(json!({}));
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1_upgrading(), worker_2.clone()],
            device_plugins: vec![device_plugin_pod("worker-2")],
            dra_drivers: vec![],
        },
        "worker-2",
        vec![
            get_node(&worker_2),
            patch_node(
                "worker-2",
                json!({"metadata": {
                    "resourceVersion": "7",
                    "annotations": {UPGRADE: waiting_its_turn()},
                }}),
            )
            .failing(409, "Conflict"),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(CONFLICT_RETRY));
}

#[tokio::test]
async fn a_node_whose_new_device_plugin_runs_records_step_4_and_drops_its_upgrade() {
    let worker_1 = node(
        "worker-1",
        json!({M: "v2", W: "v2", D: "v2", READY: "", VERSION_READY: "v2"}),
        json!({
            REVISION_ANNOTATION: REVISION_12,
            PULL_REQUEST_ANNOTATION: "12",
            UPGRADE: format!(
                r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:00Z","step":"new-module-loaded","stepAt":"2026-11-21T10:14:12.5Z"}}"#
            ),
        }),
    );
    let record = step_record(
        "step-3cf3bea-8d3e02d6f4fa",
        "device-plugin-started",
        "kmm-demo/my-kmod v1 -> v2 on worker-1: step 4 device-plugin-started after 0.5s, \
         asked by 3cf3bea (#12)",
        0.5,
    );
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1.clone(), settled_worker_2()],
            device_plugins: vec![device_plugin_pod("worker-1")],
            dra_drivers: vec![],
        },
        "worker-1",
        vec![
            get_node(&worker_1),
            post_record(&record),
            fixtures::event("default"),
            fixtures::event("kmm-demo"),
            patch_node(
                "worker-1",
                json!({"metadata": {"resourceVersion": "7", "annotations": {UPGRADE: null}}}),
            ),
        ],
    )
    .await;
    assert_eq!(action, Action::await_change(), "the upgrade is over");
}

#[tokio::test]
async fn a_step_recorded_before_a_restart_keeps_its_time_and_is_not_announced_again() {
    let worker_1 = node(
        "worker-1",
        json!({M: "v2", W: "v2", D: "v2", READY: "", VERSION_READY: "v2"}),
        json!({
            REVISION_ANNOTATION: REVISION_12,
            PULL_REQUEST_ANNOTATION: "12",
            UPGRADE: format!(
                r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:00Z","step":"old-module-unloaded","stepAt":"2026-11-21T10:14:05Z"}}"#
            ),
        }),
    );
    let record = step_record(
        "step-3cf3bea-2480e9a02889",
        "new-module-loaded",
        "kmm-demo/my-kmod v1 -> v2 on worker-1: step 3 new-module-loaded after 8.0s, \
         asked by 3cf3bea (#12)",
        8.0,
    );
    let mut written_before = record.clone();
    written_before["spec"]["time"] = json!("2026-11-21T10:14:09.250000Z");
    let name = record["metadata"]["name"].as_str().expect("a name");
    let action = reconcile_once(
        Caches {
            nodes: vec![worker_1.clone(), settled_worker_2()],
            device_plugins: vec![],
            dra_drivers: vec![],
        },
        "worker-1",
        vec![
            get_node(&worker_1),
            post_record(&record).failing(409, "AlreadyExists"),
            Call::get(format!("{RECORDS}/{name}"), written_before),
            patch_node(
                "worker-1",
                json!({"metadata": {
                    "resourceVersion": "7",
                    "annotations": {UPGRADE: format!(
                        r#"{{"from":"v1","to":"v2","revision":"{REVISION_12}","pullRequest":12,"startedAt":"2026-11-21T10:14:00Z","step":"new-module-loaded","stepAt":"2026-11-21T10:14:09.25Z"}}"#
                    )},
                }}),
            ),
        ],
    )
    .await;
    assert_eq!(action, Action::requeue(UPGRADE_RECHECK));
}
