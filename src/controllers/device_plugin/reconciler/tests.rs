//! One reconcile of a Module with a device plugin, call by call: the exact requests the
//! device-plugin controller sends the API server, in order, with their bodies, and when it
//! looks again. The caches hold the nodes and the DaemonSets as the watches would fill
//! them; the API server is the scenario ([`fixtures`], [`module_fixtures`]). The applied
//! DaemonSet is the one [`daemon_set`] builds, whose template `device_plugin`'s tests check
//! field by field; the scenarios check the fields that place it.
//!
//! Event bodies are not compared: they carry a random name and the wall-clock time.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::device_plugin::daemon_set;
use crate::controllers::device_plugin::module_fixtures::{
    self, DAEMON_SETS, UID, counts, delete_daemon_set as delete, deleting, node,
};
use crate::controllers::fixtures::{self, Call, store};

const V1: &str = "my-kmod-device-plugin-v1";
const V2: &str = "my-kmod-device-plugin-v2";

/// KMM's reference Module at `version` with a device plugin; its `status.devicePlugin` is
/// `status` (`null` for none).
fn module(version: &str, status: Value) -> Module {
    module_fixtures::module(
        version,
        "devicePlugin",
        json!({"container": {"image": "registry.example/device-plugin:v1"}}),
        status,
    )
}

/// The device-plugin DaemonSet of `module` for its version, as the controller applies it.
fn wanted(module: &Module) -> DaemonSet {
    let facts = ModuleFacts::from_module(module).expect("a valid Module");
    daemon_set(&facts, facts.object.version()).expect("a DaemonSet")
}

/// The DaemonSet `module` wants, live: `desired` nodes to run its pod, `available` running
/// it.
fn live(module: &Module, desired: i32, available: i32) -> DaemonSet {
    module_fixtures::live(&wanted(module), desired, available)
}

/// Two gpu nodes, which the Module targets, and a cpu node, which it does not.
fn nodes() -> Vec<Node> {
    vec![
        node("worker-1", json!({"role": "gpu"})),
        node("worker-2", json!({"role": "gpu"})),
        node("worker-3", json!({"role": "cpu"})),
    ]
}

/// The server-side apply of `ds`, answered with it.
fn apply(ds: &DaemonSet) -> Call {
    let name = ds.metadata.name.as_deref().expect("a name");
    module_fixtures::apply(
        &format!("{DAEMON_SETS}/{name}"),
        ds,
        "capstan-device-plugin",
    )
}

/// The merge patch of `status.devicePlugin` to `counts`, answered with the Module.
fn write_status(module: &Module, counts: Value) -> Call {
    module_fixtures::write_status(module, "devicePlugin", "capstan-device-plugin", counts)
}

/// Runs one reconcile of `module`, the caches holding [`nodes`] and `daemon_sets`, against
/// an API server that expects exactly `calls`.
async fn reconcile_once(
    module: &Module,
    daemon_sets: Vec<DaemonSet>,
    calls: Vec<Call>,
) -> Result<Action, ReconcileError> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let state = Arc::new(State {
        ctx: Context::new(client, CancellationToken::new()),
        nodes: store(nodes()),
        daemon_sets: store(daemon_sets),
    });
    let result = reconcile(Arc::new(module.clone()), state).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

#[tokio::test]
async fn a_module_with_a_device_plugin_gets_its_daemon_set_an_event_and_its_status() {
    let module = module("v1", Value::Null);
    let ds = wanted(&module);
    // Placed on the gpu nodes where v1 is loaded, owned by the Module.
    let body = serde_json::to_value(&ds).expect("JSON");
    assert_eq!(body["metadata"]["name"], V1);
    assert_eq!(
        body["spec"]["template"]["spec"]["nodeSelector"],
        json!({
            "role": "gpu",
            "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": "",
            "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
        })
    );
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
    assert_eq!(
        body["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.example/device-plugin:v1"
    );
    let action = reconcile_once(
        &module,
        vec![],
        vec![
            apply(&ds),
            fixtures::event("kmm-demo"),
            write_status(&module, counts(2, 0, 0)),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn a_module_at_rest_makes_no_call() {
    let module = module("v1", counts(2, 2, 2));
    let action = reconcile_once(&module, vec![live(&module, 2, 2)], vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn new_counts_of_the_daemon_set_are_written_to_the_status_alone() {
    let module = module("v1", counts(2, 2, 1));
    let action = reconcile_once(
        &module,
        vec![live(&module, 2, 2)],
        vec![write_status(&module, counts(2, 2, 2))],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn an_ordered_upgrade_runs_the_new_version_beside_the_old_one_a_node_still_runs() {
    let old = module("v1", Value::Null);
    let module = module("v2", counts(2, 2, 2));
    let new = wanted(&module);
    assert_eq!(new.metadata.name.as_deref(), Some(V2));
    let action = reconcile_once(
        &module,
        vec![live(&old, 1, 1)],
        // v1 stays: no delete; the status counts every version, v1's pod alone so far.
        vec![
            apply(&new),
            fixtures::event("kmm-demo"),
            write_status(&module, counts(2, 1, 1)),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn the_old_version_is_deleted_once_no_node_runs_it() {
    let old = live(&module("v1", Value::Null), 0, 0);
    let module = module("v2", counts(2, 2, 2));
    let action = reconcile_once(
        &module,
        vec![live(&module, 2, 2), old.clone()],
        vec![delete(&old), fixtures::event("kmm-demo")],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::requeue(RESYNC));
}

#[tokio::test]
async fn an_old_version_changed_since_the_decision_is_decided_on_again() {
    let old = live(&module("v1", Value::Null), 0, 0);
    let module = module("v2", counts(2, 2, 2));
    let action = reconcile_once(
        &module,
        vec![live(&module, 2, 2), old.clone()],
        // The precondition failed: no Event, no status, another look soon.
        vec![delete(&old).failing(409, "Conflict")],
    )
    .await
    .expect("a failed precondition is no error");
    assert_eq!(action, Action::requeue(AFTER_CONFLICT));
}

#[tokio::test]
async fn a_deleted_module_has_its_device_plugins_deleted_and_its_status_left() {
    let module = deleting(module("v1", counts(2, 2, 2)));
    let ds = live(&module, 2, 2);
    let action = reconcile_once(
        &module,
        vec![ds.clone()],
        vec![delete(&ds), fixtures::event("kmm-demo")],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_device_plugin_that_cannot_be_made_is_said_in_a_warning_and_nothing_is_written() {
    // A version no node label can hold.
    let module = module("v1+build", Value::Null);
    let action = reconcile_once(&module, vec![], vec![fixtures::event("kmm-demo")])
        .await
        .expect("an invalid Module is no error to retry");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_refused_apply_is_an_error_and_nothing_follows_it() {
    let module = module("v1", Value::Null);
    let result = reconcile_once(
        &module,
        vec![],
        vec![apply(&wanted(&module)).failing(500, "InternalError")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Apply { name, .. }) if name == V1),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_refused_status_write_is_an_error() {
    let module = module("v1", counts(2, 2, 1));
    let result = reconcile_once(
        &module,
        vec![live(&module, 2, 2)],
        vec![write_status(&module, counts(2, 2, 2)).failing(409, "Conflict")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Status { module, .. }) if module == "kmm-demo/my-kmod"),
        "{result:?}"
    );
}
