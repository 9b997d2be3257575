//! One reconcile of a device-plugin pod, call by call: the exact requests the
//! device-plugin-ready labeller sends the API server, in order, with their bodies, and when
//! it looks again. The caches hold the node and the device-plugin pods as the watches would
//! fill them; the API server is the scenario ([`fixtures`]).

use super::*;
use crate::controllers::fixtures::{self, Call, store};

const LABEL: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.device-plugin-ready";
const NODE: &str = "/api/v1/nodes/worker-1?&fieldManager=capstan-device-plugin";
const OLD_POD: &str = "my-kmod-device-plugin-v1-abcde";
const NEW_POD: &str = "my-kmod-device-plugin-v2-fghij";

/// A device-plugin pod of `kmm-demo/my-kmod` on worker-1, owned by its DaemonSet and
/// carrying the labeller's finalizer after another's; `Ready` when `ready`, being deleted
/// when `deleting`.
fn pod(name: &str, ready: bool, deleting: bool) -> Pod {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "kmm-demo", "uid": format!("uid-{name}"),
            "labels": {"kmm.node.kubernetes.io/role": "device-plugin",
                       "kmm.node.kubernetes.io/module.name": "my-kmod"},
            "finalizers": ["example.com/other", NODE_LABELER_FINALIZER],
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                 "name": "my-kmod-device-plugin", "uid": "uid-ds",
                                 "controller": true}],
        },
        "spec": {"nodeName": "worker-1", "containers": []},
        "status": {"conditions": [{"type": "Ready",
                                   "status": if ready { "True" } else { "False" }}]},
    });
    if deleting {
        pod["metadata"]["deletionTimestamp"] = json!("2026-03-01T10:00:00Z");
    }
    serde_json::from_value(pod).expect("a Pod")
}

/// worker-1, carrying the device-plugin-ready label of the Module when `labelled`.
fn worker_1(labelled: bool) -> Node {
    let mut labels = json!({"role": "gpu"});
    if labelled {
        labels[LABEL] = json!("");
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-1", "labels": labels},
    }))
    .expect("a Node")
}

/// The merge patch of worker-1's label to `value` (`null` removes it).
fn label_node(value: Value) -> Call {
    let labelled = worker_1(!value.is_null());
    Call::new(
        "PATCH",
        NODE,
        Some(json!({"metadata": {"labels": {LABEL: value}}})),
        serde_json::to_value(labelled).expect("JSON"),
    )
}

/// The JSON patch that takes the labeller's finalizer off `name`, having tested its uid and
/// finalizers.
fn release_pod(name: &str) -> Call {
    Call::new(
        "PATCH",
        format!("/api/v1/namespaces/kmm-demo/pods/{name}?&fieldManager=capstan-device-plugin"),
        Some(json!([
            {"op": "test", "path": "/metadata/uid", "value": format!("uid-{name}")},
            {"op": "test", "path": "/metadata/finalizers",
             "value": ["example.com/other", NODE_LABELER_FINALIZER]},
            {"op": "replace", "path": "/metadata/finalizers", "value": ["example.com/other"]},
        ])),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}}),
    )
}

/// Runs one reconcile of `subject` (the first of `pods`), the caches holding `node` and
/// `pods`, against an API server that expects exactly `calls`.
async fn reconcile_once(
    node: Node,
    pods: Vec<Pod>,
    calls: Vec<Call>,
) -> Result<Action, ReconcileError> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let subject = pods.first().cloned().expect("a pod to reconcile");
    let shared = Arc::new(Shared {
        client,
        nodes: store(vec![node]),
        pods: store(pods.clone()),
        by_node: Mutex::default(),
    });
    for pod in &pods {
        shared.index(pod);
    }
    let result = reconcile(Arc::new(subject), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

#[tokio::test]
async fn a_ready_plugin_pod_labels_its_node() {
    let action = reconcile_once(
        worker_1(false),
        vec![pod(OLD_POD, true, false)],
        vec![label_node(json!(""))],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_ready_plugin_pod_on_a_labelled_node_makes_no_call() {
    let action = reconcile_once(worker_1(true), vec![pod(OLD_POD, true, false)], vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_plugin_pod_no_longer_ready_takes_the_label_off_and_keeps_its_finalizer() {
    let action = reconcile_once(
        worker_1(true),
        vec![pod(OLD_POD, false, false)],
        vec![label_node(Value::Null)],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_pod_going_takes_the_label_off_then_releases_its_finalizer() {
    // Still Ready while its preStop hooks run: going counts as gone.
    let action = reconcile_once(
        worker_1(true),
        vec![pod(OLD_POD, true, true)],
        vec![label_node(Value::Null), release_pod(OLD_POD)],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_pod_going_beside_the_new_versions_ready_pod_leaves_the_label_and_is_released() {
    let action = reconcile_once(
        worker_1(true),
        vec![pod(OLD_POD, true, true), pod(NEW_POD, true, false)],
        vec![release_pod(OLD_POD)],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_pod_changed_under_its_release_is_decided_on_again() {
    // A test of the JSON patch failed: another finalizer came, or the pod was replaced.
    let action = reconcile_once(
        worker_1(false),
        vec![pod(OLD_POD, true, true)],
        vec![release_pod(OLD_POD).failing(422, "Invalid")],
    )
    .await
    .expect("a failed test is no error");
    assert_eq!(action, Action::requeue(AFTER_CONFLICT));
}

#[tokio::test]
async fn a_node_gone_has_no_label_to_take_off_and_the_pod_is_released() {
    let action = reconcile_once(
        worker_1(true),
        vec![pod(OLD_POD, false, true)],
        vec![
            label_node(Value::Null).failing(404, "NotFound"),
            release_pod(OLD_POD),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_refused_label_write_is_an_error_and_the_finalizer_stays() {
    let result = reconcile_once(
        worker_1(true),
        vec![pod(OLD_POD, true, true)],
        vec![label_node(Value::Null).failing(500, "InternalError")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Label { node, label, .. })
            if node == "worker-1" && label == LABEL),
        "{result:?}"
    );
}

#[test]
fn the_release_removes_only_the_labellers_finalizer_of_the_pod_read() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": "p", "namespace": "kmm-demo", "uid": "u1",
            "finalizers": ["example.com/other", NODE_LABELER_FINALIZER],
        },
    }))
    .expect("pod");
    assert_eq!(
        serde_json::to_value(release_patch(&pod)).expect("patch"),
        json!([
            {"op": "test", "path": "/metadata/uid", "value": "u1"},
            {"op": "test", "path": "/metadata/finalizers",
             "value": ["example.com/other", NODE_LABELER_FINALIZER]},
            {"op": "replace", "path": "/metadata/finalizers", "value": ["example.com/other"]},
        ])
    );
}
