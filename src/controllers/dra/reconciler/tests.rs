//! One reconcile of a Module with a DRA driver, call by call: the exact requests the DRA
//! controller sends the API server, in order, with their bodies, and when it looks again.
//! The caches hold the nodes, the DRA DaemonSets and pods and the DeviceClasses as the
//! watches would fill them; the API server is the scenario ([`fixtures`],
//! [`module_fixtures`]). The applied DaemonSet and DeviceClass are those [`daemon_set`] and
//! [`device_class`] build, which `dra`'s tests check field by field; the scenarios check
//! the fields that place them.
//!
//! Event bodies are not compared: they carry a random name and the wall-clock time.

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::device_plugin::module_fixtures::{
    self, DAEMON_SETS, UID, counts, delete, delete_daemon_set, deleting, stored,
};
use crate::controllers::dra::{daemon_set, device_class};
use crate::controllers::fixtures::{self, Call, store};

const CLASS: &str = "/apis/resource.k8s.io/v1/deviceclasses/my-device-class";
const READY_LABEL: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready";

/// KMM's reference Module at `version` with the docs' DRA driver, listing the DeviceClass
/// `my-device-class`; its `status.dra` is `status` (`null` for none).
fn module(version: &str, status: Value) -> Module {
    module_fixtures::module(
        version,
        "dra",
        json!({
            "driverName": "dra.example.com",
            "container": {"image": "some.registry/org/my-dra-driver:latest"},
            "deviceClasses": [{
                "name": "my-device-class",
                "selectors": [{"cel": {"expression": "device.driver == 'dra.example.com'"}}],
            }],
        }),
        status,
    )
}

fn facts(module: &Module) -> ModuleFacts {
    ModuleFacts::from_module(module).expect("a valid Module")
}

/// The DRA DaemonSet of `module` for its version, as the controller applies it.
fn wanted(module: &Module) -> DaemonSet {
    let facts = facts(module);
    daemon_set(&facts, facts.object.version()).expect("a DaemonSet")
}

/// The DeviceClass `module` lists, as the controller applies it.
fn wanted_class(module: &Module) -> DeviceClass {
    let facts = facts(module);
    let dra = facts.object.spec.dra.as_ref().expect("spec.dra");
    device_class(&facts.key, &dra.device_classes[0])
}

/// The DaemonSet `module` wants, live: `desired` nodes to run its pod, `available` running
/// it.
fn live(module: &Module, desired: i32, available: i32) -> DaemonSet {
    module_fixtures::live(&wanted(module), desired, available)
}

/// A gpu node, which the Module targets, carrying the dra-ready label when `labelled`.
fn node(name: &str, labelled: bool) -> Node {
    let mut labels = json!({"role": "gpu"});
    if labelled {
        labels[READY_LABEL] = json!("");
    }
    module_fixtures::node(name, labels)
}

/// A running, ready DRA driver pod of the Module on `node`.
fn driver_pod(node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("my-kmod-dra-v1-{node}"), "namespace": "kmm-demo",
                     "labels": {"kmm.node.kubernetes.io/role": "dra",
                                "kmm.node.kubernetes.io/module.name": "my-kmod"}},
        "spec": {"nodeName": node, "containers": []},
        "status": {"phase": "Running",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .expect("a Pod")
}

/// What the caches hold beside the Module.
struct Cluster {
    nodes: Vec<Node>,
    daemon_sets: Vec<DaemonSet>,
    pods: Vec<Pod>,
    classes: Vec<DeviceClass>,
    /// The cluster serves `resource.k8s.io/v1` DeviceClasses.
    classes_served: bool,
}

impl Cluster {
    /// Two gpu nodes without the dra-ready label, nothing of the Module's yet, DeviceClasses
    /// served.
    fn new() -> Cluster {
        Cluster {
            nodes: vec![node("worker-1", false), node("worker-2", false)],
            daemon_sets: vec![],
            pods: vec![],
            classes: vec![],
            classes_served: true,
        }
    }

    /// The Module's driver ready on both nodes, which carry the dra-ready label, and its
    /// DeviceClass as wanted.
    fn at_rest(module: &Module) -> Cluster {
        Cluster {
            nodes: vec![node("worker-1", true), node("worker-2", true)],
            daemon_sets: vec![live(module, 2, 2)],
            pods: vec![driver_pod("worker-1"), driver_pod("worker-2")],
            classes: vec![stored(&wanted_class(module))],
            classes_served: true,
        }
    }
}

fn apply_daemon_set(ds: &DaemonSet) -> Call {
    let name = ds.metadata.name.as_deref().expect("a name");
    module_fixtures::apply(&format!("{DAEMON_SETS}/{name}"), ds, "capstan-dra")
}

fn apply_class(class: &DeviceClass) -> Call {
    module_fixtures::apply(CLASS, class, "capstan-dra")
}

/// The merge patch of `node`'s dra-ready label to `value` (`null` removes it).
fn label_node(node: &str, value: Value) -> Call {
    Call::new(
        "PATCH",
        format!("/api/v1/nodes/{node}?&fieldManager=capstan-dra"),
        Some(json!({"metadata": {"labels": {READY_LABEL: value}}})),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
}

/// The merge patch of `status.dra` to `counts`, answered with the Module.
fn write_status(module: &Module, counts: Value) -> Call {
    module_fixtures::write_status(module, "dra", "capstan-dra", counts)
}

/// Runs one reconcile of `module`, the caches holding `cluster`, against an API server
/// that expects exactly `calls`.
async fn reconcile_once(
    module: &Module,
    cluster: Cluster,
    calls: Vec<Call>,
) -> Result<Requeue, ReconcileError> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let state = Arc::new(State {
        ctx: Context::new(client, CancellationToken::new()),
        nodes: store(cluster.nodes),
        daemon_sets: store(cluster.daemon_sets),
        pods: store(cluster.pods),
        classes: store(cluster.classes),
        classes_served: Arc::new(AtomicBool::new(cluster.classes_served)),
    });
    let result = reconcile(Arc::new(module.clone()), state).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

#[tokio::test]
async fn a_module_with_a_dra_driver_gets_its_daemon_set_device_class_and_status() {
    let module = module("v1", Value::Null);
    let ds = wanted(&module);
    // Placed on the gpu nodes where v1 is loaded, owned by the Module.
    let body = serde_json::to_value(&ds).expect("JSON");
    assert_eq!(body["metadata"]["name"], "my-kmod-dra-v1");
    assert_eq!(
        body["spec"]["template"]["spec"]["nodeSelector"],
        json!({
            "role": "gpu",
            "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": "",
            "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
        })
    );
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
    let class = wanted_class(&module);
    assert_eq!(
        serde_json::to_value(&class).expect("JSON")["metadata"]["labels"],
        json!({"kmm.node.kubernetes.io/module.name": "my-kmod",
               "kmm.node.kubernetes.io/module.namespace": "kmm-demo"})
    );
    let action = reconcile_once(
        &module,
        Cluster::new(),
        vec![
            apply_daemon_set(&ds),
            fixtures::event("kmm-demo"),
            apply_class(&class),
            write_status(&module, counts(2, 0, 0)),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn a_module_at_rest_makes_no_call() {
    let module = module("v1", counts(2, 2, 2));
    let action = reconcile_once(&module, Cluster::at_rest(&module), vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn a_ready_driver_pod_labels_its_node_and_a_node_without_one_loses_the_label() {
    let module = module("v1", counts(2, 2, 2));
    let cluster = Cluster {
        nodes: vec![node("worker-1", false), node("worker-2", true)],
        pods: vec![driver_pod("worker-1")],
        ..Cluster::at_rest(&module)
    };
    let action = reconcile_once(
        &module,
        cluster,
        vec![
            label_node("worker-1", json!("")),
            label_node("worker-2", Value::Null),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn an_ordered_upgrade_runs_the_new_driver_beside_the_old_one_a_node_still_runs() {
    let old = module("v1", Value::Null);
    let module = module("v2", counts(2, 2, 2));
    let new = wanted(&module);
    assert_eq!(new.metadata.name.as_deref(), Some("my-kmod-dra-v2"));
    let cluster = Cluster {
        daemon_sets: vec![live(&old, 1, 1)],
        pods: vec![driver_pod("worker-1")],
        nodes: vec![node("worker-1", true), node("worker-2", false)],
        ..Cluster::at_rest(&module)
    };
    // v1 stays: no delete; the status counts every version, v1's pod alone so far.
    let action = reconcile_once(
        &module,
        cluster,
        vec![
            apply_daemon_set(&new),
            fixtures::event("kmm-demo"),
            write_status(&module, counts(2, 1, 1)),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn the_old_driver_is_deleted_once_no_node_runs_it() {
    let old = live(&module("v1", Value::Null), 0, 0);
    let module = module("v2", counts(2, 2, 2));
    let mut cluster = Cluster::at_rest(&module);
    cluster.daemon_sets.push(old.clone());
    let action = reconcile_once(
        &module,
        cluster,
        vec![delete_daemon_set(&old), fixtures::event("kmm-demo")],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn an_old_driver_changed_since_the_decision_is_decided_on_again() {
    let old = live(&module("v1", Value::Null), 0, 0);
    let module = module("v2", counts(2, 2, 2));
    let mut cluster = Cluster::at_rest(&module);
    cluster.daemon_sets.push(old.clone());
    // The precondition failed: no Event, no label, no status, another look soon.
    let action = reconcile_once(
        &module,
        cluster,
        vec![delete_daemon_set(&old).failing(409, "Conflict")],
    )
    .await
    .expect("a failed precondition is no error");
    assert_eq!(action, Requeue::requeue(AFTER_CONFLICT));
}

#[tokio::test]
async fn device_classes_the_cluster_cannot_hold_are_said_in_a_warning_and_the_driver_still_runs() {
    let module = module("v1", Value::Null);
    let cluster = Cluster {
        classes_served: false,
        ..Cluster::new()
    };
    let action = reconcile_once(
        &module,
        cluster,
        vec![
            fixtures::event("kmm-demo"),
            apply_daemon_set(&wanted(&module)),
            fixtures::event("kmm-demo"),
            write_status(&module, counts(2, 0, 0)),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn a_device_class_another_module_holds_is_left_to_it_with_a_warning() {
    let module = module("v1", counts(2, 2, 2));
    let mut theirs = stored(&wanted_class(&module));
    theirs.metadata.labels = Some(
        [
            ("kmm.node.kubernetes.io/module.name", "their-kmod"),
            ("kmm.node.kubernetes.io/module.namespace", "other"),
        ]
        .into_iter()
        .map(|(label, value)| (label.to_string(), value.to_string()))
        .collect(),
    );
    let cluster = Cluster {
        classes: vec![theirs],
        ..Cluster::at_rest(&module)
    };
    let action = reconcile_once(&module, cluster, vec![fixtures::event("kmm-demo")])
        .await
        .expect("reconciled");
    assert_eq!(action, Requeue::requeue(RESYNC));
}

#[tokio::test]
async fn a_deleted_module_has_its_driver_class_and_labels_removed_and_its_status_left() {
    let module = deleting(module("v1", counts(2, 2, 2)));
    let cluster = Cluster::at_rest(&module);
    let ds = cluster.daemon_sets[0].clone();
    let action = reconcile_once(
        &module,
        cluster,
        vec![
            delete_daemon_set(&ds),
            fixtures::event("kmm-demo"),
            delete(CLASS, "uid-my-device-class"),
            label_node("worker-1", Value::Null),
            label_node("worker-2", Value::Null),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Requeue::await_change());
}

#[tokio::test]
async fn a_refused_apply_is_an_error_and_nothing_follows_it() {
    let module = module("v1", Value::Null);
    let result = reconcile_once(
        &module,
        Cluster::new(),
        vec![apply_daemon_set(&wanted(&module)).failing(500, "InternalError")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Apply { kind: "DaemonSet", name, .. })
            if name == "kmm-demo/my-kmod-dra-v1"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_refused_status_write_is_an_error() {
    let module = module("v1", counts(2, 2, 1));
    let result = reconcile_once(
        &module,
        Cluster::at_rest(&module),
        vec![write_status(&module, counts(2, 2, 2)).failing(409, "Conflict")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Status { module, .. }) if module == "kmm-demo/my-kmod"),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_refused_label_write_is_an_error_and_the_status_waits() {
    let module = module("v1", counts(2, 2, 1));
    let cluster = Cluster {
        nodes: vec![node("worker-1", false), node("worker-2", true)],
        ..Cluster::at_rest(&module)
    };
    let result = reconcile_once(
        &module,
        cluster,
        vec![label_node("worker-1", json!("")).failing(500, "InternalError")],
    )
    .await;
    assert!(
        matches!(&result, Err(ReconcileError::Label { node, .. }) if node == "worker-1"),
        "{result:?}"
    );
}
