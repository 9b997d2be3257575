//! What the reconcile scenarios of the device-plugin and DRA controllers share (see
//! [`crate::controllers::fixtures`]): KMM's reference Module `kmm-demo/my-kmod` with a device plugin or a DRA
//! driver, its DaemonSets as the API server holds them, the nodes, and the calls that
//! apply, delete and write the Module's status.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::controllers::fixtures::Call;
use capstan_api::module::Module;

/// The Module's uid, which its DaemonSets name as their owner.
pub const UID: &str = "4f1c2a9e-0000-4000-8000-000000000001";
/// The DaemonSets of the Module's namespace.
pub const DAEMON_SETS: &str = "/apis/apps/v1/namespaces/kmm-demo/daemonsets";

/// `kmm-demo/my-kmod` at `version`, loading `my_kmod` on the nodes labelled `role: gpu`,
/// with `spec.<field>` set to `spec` and `status.<field>` to `status` (`null` for none).
pub fn module(version: &str, field: &str, spec: Value, status: Value) -> Module {
    let mut module = json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": UID,
                     "resourceVersion": "7"},
        "spec": {
            "selector": {"role": "gpu"},
            "moduleLoader": {"container": {
                "version": version,
                "modprobe": {"moduleName": "my_kmod"},
                "kernelMappings": [{"regexp": "^.+$",
                                    "containerImage": "registry.example/my-kmod:v1"}],
            }},
            field: spec,
        },
    });
    if !status.is_null() {
        module["status"] = json!({field: status});
    }
    serde_json::from_value(module).expect("a Module")
}

/// The same Module, being deleted.
pub fn deleting(mut module: Module) -> Module {
    module.metadata.deletion_timestamp =
        Some(Time("2026-03-01T10:00:00Z".parse().expect("a time")));
    module
}

/// A Module status count as `(targeted nodes, desired, available)`.
pub fn counts(targeted: i32, desired: i32, available: i32) -> Value {
    json!({"nodesMatchingSelectorNumber": targeted, "desiredNumber": desired,
           "availableNumber": available})
}

/// `object` as the API server returns it: with the uid `uid-<name>` and resourceVersion 42.
pub fn stored<K: Serialize + DeserializeOwned>(object: &K) -> K {
    let mut value = serde_json::to_value(object).expect("JSON");
    let name = value["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    value["metadata"]["uid"] = json!(format!("uid-{name}"));
    value["metadata"]["resourceVersion"] = json!("42");
    serde_json::from_value(value).expect("an object")
}

/// `wanted` as the API server returns it, at generation 1, its status observed there:
/// `desired` nodes to run its pod, `available` running it.
pub fn live(wanted: &DaemonSet, desired: i32, available: i32) -> DaemonSet {
    let mut ds = stored(wanted);
    ds.metadata.generation = Some(1);
    ds.status = serde_json::from_value(json!({
        "desiredNumberScheduled": desired, "currentNumberScheduled": desired,
        "numberMisscheduled": 0, "numberReady": available, "numberAvailable": available,
        "observedGeneration": 1,
    }))
    .expect("a status");
    ds
}

/// The node `name` with `labels`.
pub fn node(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    }))
    .expect("a Node")
}

/// The forced server-side apply of `object` at `path` (without query) by `manager`,
/// answered with it.
pub fn apply<K: Serialize>(path: &str, object: &K, manager: &str) -> Call {
    let body = serde_json::to_value(object).expect("JSON");
    Call::new(
        "PATCH",
        format!("{path}?&force=true&fieldManager={manager}"),
        Some(body.clone()),
        body,
    )
}

/// The delete of the object at `path` whose uid is `uid`, provided it is still the one the
/// decision saw (resourceVersion 42).
pub fn delete(path: &str, uid: &str) -> Call {
    Call::new(
        "DELETE",
        format!("{path}?"),
        Some(json!({
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid, "resourceVersion": "42"},
        })),
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
    )
}

/// The delete of the live DaemonSet `ds`, provided it is unchanged.
pub fn delete_daemon_set(ds: &DaemonSet) -> Call {
    let name = ds.metadata.name.as_deref().expect("a name");
    delete(
        &format!("{DAEMON_SETS}/{name}"),
        ds.metadata.uid.as_deref().expect("a uid"),
    )
}

/// The merge patch of `status.<field>` of `module` to `counts` by `manager`, answered with
/// the Module.
pub fn write_status(module: &Module, field: &str, manager: &str, counts: Value) -> Call {
    Call::new(
        "PATCH",
        format!(
            "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/kmm-demo/modules/my-kmod/status?&fieldManager={manager}"
        ),
        Some(json!({"status": {field: counts}})),
        serde_json::to_value(module).expect("JSON"),
    )
}
