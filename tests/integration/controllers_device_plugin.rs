//! The device-plugin controller on the embedded cluster: a Module's device plugin runs on
//! the nodes where the module is ready, one DaemonSet per version during an ordered upgrade,
//! and goes with the Module. Only this controller runs; the ready and version labels the
//! other controllers would set are set here by hand.

use crate::common;
use crate::module_controller::{
    MODULE, NAMESPACE, Running, daemon_sets, field_managers, key, label_node, labelled_nodes,
    module_ready, module_status, modules, ready_pod_nodes, setup,
};

use std::collections::BTreeMap;

use capstan::controllers::device_plugin::{self, StepAction};
use capstan::controllers::module_nmc::ModuleFacts;
use capstan::controllers::node::NodeFacts;
use capstan_api::managers;
use capstan_api::module::{DaemonSetStatus, Module};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const WORKERS: [&str; 3] = ["worker-1", "worker-2", "worker-3"];

/// The Module of the KMM reference with a device plugin; `version` "" for none.
fn module(version: &str, image: &str) -> Module {
    let mut container = json!({
        "modprobe": {"moduleName": "my_kmod"},
        "kernelMappings": [{"regexp": "^.+$", "containerImage": "registry.example/my-kmod:${KERNEL_FULL_VERSION}"}],
    });
    if !version.is_empty() {
        container["version"] = json!(version);
    }
    serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": MODULE, "namespace": NAMESPACE},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "moduleLoader": {"container": container},
            "devicePlugin": {
                "container": {"image": image, "args": ["--socket-dir", "/var/lib/kubelet/device-plugins"]},
            },
        },
    }))
    .expect("module")
}

async fn create_module(client: &kube::Client, module: &Module) {
    modules(client)
        .create(&PostParams::default(), module)
        .await
        .expect("create module");
}

/// Merge-patches the Module; `what` names the change in a failure.
async fn patch_module(client: &kube::Client, patch: Value, what: &str) {
    modules(client)
        .patch(MODULE, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap_or_else(|err| panic!("{what}: {err}"));
}

/// Sets (`Some`) or removes (`None`) the version-device-plugin label of a node, as the
/// version-label controller would during an ordered upgrade.
async fn set_plugin_version(client: &kube::Client, node: &str, version: Option<&str>) {
    label_node(
        client,
        node,
        &[(key().version_device_plugin_label(), version)],
    )
    .await;
}

/// The nodes running a device-plugin pod of the Module (of `version` when given), sorted;
/// pods being deleted do not count.
async fn plugin_nodes(client: &kube::Client, version: Option<&str>) -> Vec<String> {
    let mut selector = format!(
        "kmm.node.kubernetes.io/role=device-plugin,kmm.node.kubernetes.io/module.name={MODULE}"
    );
    if let Some(version) = version {
        selector.push_str(&format!(
            ",{}={version}",
            key().version_device_plugin_label()
        ));
    }
    ready_pod_nodes(client, &selector).await
}

async fn wait_for_plugins(client: &kube::Client, version: Option<&str>, nodes: &[&str]) {
    common::wait_until(
        &format!("device-plugin pods of {version:?} running on exactly {nodes:?}"),
        || async { plugin_nodes(client, version).await == nodes },
    )
    .await;
}

async fn plugin_status(client: &kube::Client) -> Option<DaemonSetStatus> {
    module_status(client)
        .await
        .map(|status| status.device_plugin)
}

async fn wait_for_status(client: &kube::Client, targeted: i32, desired: i32, available: i32) {
    let want = DaemonSetStatus {
        nodes_matching_selector_number: targeted,
        desired_number: desired,
        available_number: available,
    };
    common::wait_until(&format!("status.devicePlugin {want:?}"), || async {
        plugin_status(client).await.as_ref() == Some(&want)
    })
    .await;
}

async fn daemon_set_exists(client: &kube::Client, name: &str) -> bool {
    daemon_sets(client)
        .get_opt(name)
        .await
        .expect("get DaemonSet")
        .is_some()
}

async fn wait_for_daemon_set(client: &kube::Client, name: &str, present: bool) {
    common::wait_until(
        &format!(
            "DaemonSet {name} {}",
            if present { "created" } else { "gone" }
        ),
        || async { daemon_set_exists(client, name).await == present },
    )
    .await;
}

/// What the controller would do now with the live objects: nothing, and the same status.
async fn assert_steady(client: &kube::Client) {
    let module = modules(client).get(MODULE).await.expect("module");
    let facts = ModuleFacts::from_module(&module).expect("facts");
    let live = daemon_sets(client)
        .list(&ListParams::default())
        .await
        .expect("list DaemonSets")
        .items;
    let live: Vec<&DaemonSet> = live.iter().collect();
    let steps = device_plugin::decide(&facts, &live).expect("decision");
    for step in &steps {
        assert_eq!(step.action, StepAction::Unchanged, "{step:?}");
    }
    let nodes: Vec<NodeFacts> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
        .iter()
        .map(NodeFacts::from_node)
        .collect();
    let status = module.status.map(|s| s.device_plugin).unwrap_or_default();
    assert_eq!(device_plugin::plugin_status(&facts, &nodes, &live), status);
}

fn labels(object: &kube::api::ObjectMeta) -> BTreeMap<String, String> {
    object.labels.clone().unwrap_or_default()
}

#[tokio::test]
async fn the_device_plugin_runs_on_nodes_where_the_module_is_ready() {
    let (_cluster, client) = setup().await;
    let controller = Running::start(&client, "device-plugin");
    create_module(&client, &module("", "registry.example/device-plugin:v1")).await;
    module_ready(&client, "worker-1", None).await;
    module_ready(&client, "worker-2", None).await;

    wait_for_daemon_set(&client, "my-kmod-device-plugin", true).await;
    let ds = daemon_sets(&client)
        .get("my-kmod-device-plugin")
        .await
        .expect("DaemonSet");
    let module_uid = modules(&client)
        .get(MODULE)
        .await
        .expect("module")
        .metadata
        .uid;
    assert_eq!(
        labels(&ds.metadata),
        BTreeMap::from([
            (
                "kmm.node.kubernetes.io/role".to_string(),
                "device-plugin".to_string()
            ),
            (
                "kmm.node.kubernetes.io/module.name".to_string(),
                MODULE.to_string()
            ),
        ])
    );
    let owner = &ds.metadata.owner_references.as_deref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid), owner.controller),
        ("Module", module_uid.as_ref(), Some(true))
    );
    let managers = field_managers(&ds);
    assert!(
        managers.contains(&managers::DEVICE_PLUGIN.to_string()),
        "{managers:?}"
    );

    wait_for_plugins(&client, None, &["worker-1", "worker-2"]).await;
    wait_for_status(&client, 3, 2, 2).await;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("kmm.node.kubernetes.io/role=device-plugin"))
        .await
        .expect("pods");
    let pod = pods.items[0].spec.as_ref().expect("pod spec");
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("registry.example/device-plugin:v1")
    );
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.privileged),
        Some(true)
    );
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/var/lib/kubelet/device-plugins")
    );
    assert_steady(&client).await;

    // The module leaves a node: so does its device plugin.
    label_node(&client, "worker-2", &[(key().ready_label(), None)]).await;
    wait_for_plugins(&client, None, &["worker-1"]).await;
    wait_for_status(&client, 3, 1, 1).await;

    // No device plugin in the Module any more: its DaemonSet goes.
    patch_module(
        &client,
        json!({"spec": {"devicePlugin": null}}),
        "drop devicePlugin",
    )
    .await;
    wait_for_daemon_set(&client, "my-kmod-device-plugin", false).await;
    wait_for_status(&client, 0, 0, 0).await;
    controller.stop().await;
}

#[tokio::test]
async fn an_ordered_upgrade_keeps_the_old_device_plugin_until_no_node_runs_it() {
    const V1: &str = "my-kmod-device-plugin-v1";
    const V2: &str = "my-kmod-device-plugin-v2";
    let (_cluster, client) = setup().await;
    let controller = Running::start(&client, "device-plugin");
    create_module(&client, &module("v1", "registry.example/device-plugin:v1")).await;
    for node in WORKERS {
        module_ready(&client, node, Some("v1")).await;
    }
    wait_for_plugins(&client, Some("v1"), &WORKERS).await;
    wait_for_status(&client, 3, 3, 3).await;

    // Seed 002, step 1: the new version gets its own DaemonSet; the old one keeps running.
    patch_module(
        &client,
        json!({"spec": {
            "moduleLoader": {"container": {"version": "v2"}},
            "devicePlugin": {"container": {"image": "registry.example/device-plugin:v2"}},
        }}),
        "upgrade the Module",
    )
    .await;
    wait_for_daemon_set(&client, V2, true).await;
    let v2 = daemon_sets(&client).get(V2).await.expect("v2 DaemonSet");
    let pod = v2.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get(&key().version_device_plugin_label())),
        Some(&"v2".to_string())
    );
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("registry.example/device-plugin:v2")
    );
    assert!(daemon_set_exists(&client, V1).await);
    assert_eq!(plugin_nodes(&client, Some("v1")).await, WORKERS);

    // One node at a time moves to v2; v1 stays where its label still says v1.
    set_plugin_version(&client, "worker-1", Some("v2")).await;
    wait_for_plugins(&client, Some("v2"), &["worker-1"]).await;
    wait_for_plugins(&client, Some("v1"), &["worker-2", "worker-3"]).await;
    wait_for_status(&client, 3, 3, 3).await;
    assert!(daemon_set_exists(&client, V1).await);

    // Mid-upgrade a node has no device plugin at all (label removed): v1 must stay for
    // the node that still runs it.
    set_plugin_version(&client, "worker-2", None).await;
    wait_for_plugins(&client, Some("v1"), &["worker-3"]).await;
    assert!(daemon_set_exists(&client, V1).await);

    for node in ["worker-2", "worker-3"] {
        set_plugin_version(&client, node, Some("v2")).await;
    }
    wait_for_daemon_set(&client, V1, false).await;
    wait_for_plugins(&client, Some("v2"), &WORKERS).await;
    wait_for_plugins(&client, Some("v1"), &[]).await;
    wait_for_status(&client, 3, 3, 3).await;
    assert_steady(&client).await;
    controller.stop().await;
}

#[tokio::test]
async fn deleting_the_module_removes_its_device_plugins() {
    let (_cluster, client) = setup().await;
    let controller = Running::start(&client, "device-plugin");
    let mut held = module("v1", "registry.example/device-plugin:v1");
    // Stands for the Module -> NMC controller's finalizer, which holds the Module until the
    // module is unloaded everywhere; the device plugins must stop before that.
    held.metadata.finalizers = Some(vec!["kmm.node.kubernetes.io/module-finalizer".into()]);
    create_module(&client, &held).await;
    module_ready(&client, "worker-1", Some("v1")).await;
    wait_for_plugins(&client, Some("v1"), &["worker-1"]).await;

    modules(&client)
        .delete(MODULE, &DeleteParams::default())
        .await
        .expect("delete module");
    wait_for_daemon_set(&client, "my-kmod-device-plugin-v1", false).await;
    wait_for_plugins(&client, None, &[]).await;
    let module = modules(&client).get(MODULE).await.expect("still held");
    assert!(module.metadata.deletion_timestamp.is_some());

    patch_module(
        &client,
        json!({"metadata": {"finalizers": null}}),
        "release the Module",
    )
    .await;
    common::wait_until("the Module gone", || async {
        modules(&client)
            .get_opt(MODULE)
            .await
            .ok()
            .flatten()
            .is_none()
    })
    .await;
    controller.stop().await;
}

/// The nodes carrying the Module's device-plugin-ready label, sorted.
async fn ready_labelled_nodes(client: &kube::Client) -> Vec<String> {
    labelled_nodes(client, &key().device_plugin_ready_label()).await
}

async fn wait_for_ready_labels(client: &kube::Client, nodes: &[&str]) {
    common::wait_until(
        &format!("device-plugin-ready label on exactly {nodes:?}"),
        || async { ready_labelled_nodes(client).await == nodes },
    )
    .await;
}

/// The device-plugin pods of the Module, deleting ones included.
async fn plugin_pods(client: &kube::Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("kmm.node.kubernetes.io/role=device-plugin"))
        .await
        .expect("pods")
        .items
}

#[tokio::test]
async fn a_ready_device_plugin_labels_its_node_until_its_pod_goes() {
    let (_cluster, client) = setup().await;
    let controller = Running::start(&client, "device-plugin");
    create_module(&client, &module("", "registry.example/device-plugin:v1")).await;
    module_ready(&client, "worker-1", None).await;
    module_ready(&client, "worker-2", None).await;
    wait_for_plugins(&client, None, &["worker-1", "worker-2"]).await;
    wait_for_ready_labels(&client, &["worker-1", "worker-2"]).await;
    for pod in plugin_pods(&client).await {
        assert_eq!(
            pod.metadata.finalizers.as_deref(),
            Some(&["kmm.node.kubernetes.io/node-labeler".to_string()][..]),
            "{:?}",
            pod.metadata.name
        );
    }

    // The label removed by hand comes back while the pod is ready.
    label_node(
        &client,
        "worker-1",
        &[(key().device_plugin_ready_label(), None)],
    )
    .await;
    wait_for_ready_labels(&client, &["worker-1", "worker-2"]).await;

    // The module leaves worker-2: its device-plugin pod is deleted, the label goes, and the
    // finalizer is released so that the pod goes too.
    label_node(&client, "worker-2", &[(key().ready_label(), None)]).await;
    wait_for_ready_labels(&client, &["worker-1"]).await;
    common::wait_until("no device-plugin pod left on worker-2", || async {
        plugin_pods(&client)
            .await
            .iter()
            .all(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some("worker-2"))
    })
    .await;

    // No device plugin in the Module any more: every label and pod goes.
    patch_module(
        &client,
        json!({"spec": {"devicePlugin": null}}),
        "drop devicePlugin",
    )
    .await;
    wait_for_ready_labels(&client, &[]).await;
    common::wait_until("every device-plugin pod gone", || async {
        plugin_pods(&client).await.is_empty()
    })
    .await;
    controller.stop().await;
}
