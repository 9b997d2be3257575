//! Simulated nodes: a reboot clears the loaded modules, changes the boot ID and takes
//! the node through NotReady; a kernel upgrade reboots into the new kernel; kmod worker
//! pods run the real worker code against the node's module table; a broken image fails
//! the worker.

use crate::common;

use capstan_api::labels;
use capstan_cluster::sim::config::ClusterConfig;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde_json::json;

fn worker_pod(name: &str, node: &str, action: &str, image: &str, version: &str) -> Pod {
    let config = format!(
        "kernelVersion: 6.0.15-300.fc37.x86_64\ncontainerImage: {image}\ninsecurePull: false\nimagePullPolicy: IfNotPresent\n\
         modprobe:\n  moduleName: my_kmod\n  dirName: /opt\n  parameters: [param=1]\n"
    );
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {labels::COMPONENT_LABEL: labels::WORKER_COMPONENT, labels::WORKER_ACTION_LABEL: action,
                       labels::MODULE_NAME_LABEL: "my-kmod"},
            "annotations": {labels::WORKER_CONFIG_ANNOTATION: config, labels::WORKER_MODULE_VERSION_ANNOTATION: version},
        },
        "spec": {"nodeName": node, "restartPolicy": "Never",
                 "containers": [{"name": "worker", "image": "capstan:latest", "args": ["worker", "kmod", action.to_lowercase(), labels::WORKER_CONFIG_PATH]}]},
    }))
    .expect("worker pod")
}

/// Creates a worker pod and waits until it has finished, either way.
async fn run_worker(
    client: &kube::Client,
    name: &str,
    node: &str,
    action: &str,
    image: &str,
) -> Pod {
    common::create_pod(
        client,
        "default",
        &worker_pod(name, node, action, image, "v1"),
    )
    .await;
    common::wait_for_pod(client, "default", name, "the worker finished", |p| {
        matches!(common::phase(p), "Succeeded" | "Failed")
    })
    .await
}

#[tokio::test]
async fn worker_pods_load_and_unload_the_node_module_table() {
    let (cluster, client) = common::start_default_simulated().await;
    let sim = cluster.simulation().expect("simulated").clone();
    let finished = run_worker(
        &client,
        "load",
        "worker-1",
        "Load",
        "registry.example/my-kmod:v1",
    )
    .await;
    assert_eq!(common::phase(&finished), "Succeeded");
    let loaded = sim.node("worker-1").expect("node").modules;
    let module = loaded.get("my_kmod").expect("my_kmod loaded");
    assert_eq!(module.version.as_deref(), Some("v1"));
    assert_eq!(module.parameters, ["param=1"]);
    assert!(
        sim.node("worker-2").expect("node").modules.is_empty(),
        "only the pod's node changes"
    );
    let finished = run_worker(
        &client,
        "unload",
        "worker-1",
        "Unload",
        "registry.example/my-kmod:v1",
    )
    .await;
    assert_eq!(common::phase(&finished), "Succeeded");
    assert!(
        !sim.node("worker-1")
            .expect("node")
            .modules
            .contains("my_kmod")
    );
    let actions: Vec<String> = sim
        .module_history()
        .into_iter()
        .filter(|e| e.node == "worker-1")
        .map(|e| e.action)
        .collect();
    assert_eq!(actions, ["load", "unload"]);
}

#[tokio::test]
async fn a_broken_image_fails_the_worker_pod() {
    let config = ClusterConfig::parse(
        "nodes: [{name: worker-1}]\nbrokenImages: [registry.example/my-kmod:broken]",
        "test",
    )
    .expect("config");
    let (cluster, client) = common::start_simulated(config).await;
    let failed = run_worker(
        &client,
        "load",
        "worker-1",
        "Load",
        "registry.example/my-kmod:broken",
    )
    .await;
    assert_eq!(common::phase(&failed), "Failed");
    let terminated = failed
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c[0].state.clone())
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(terminated.exit_code, 1);
    assert!(
        terminated
            .message
            .unwrap_or_default()
            .contains("my-kmod:broken")
    );
    assert!(
        cluster
            .simulation()
            .expect("sim")
            .node("worker-1")
            .expect("node")
            .modules
            .is_empty()
    );
}

#[tokio::test]
async fn a_reboot_clears_modules_and_changes_the_boot_id() {
    let (cluster, client) = common::start_default_simulated().await;
    let sim = cluster.simulation().expect("simulated").clone();
    let finished = run_worker(
        &client,
        "load",
        "worker-2",
        "Load",
        "registry.example/my-kmod:v1",
    )
    .await;
    assert_eq!(common::phase(&finished), "Succeeded");
    let before = sim.node("worker-2").expect("node");
    assert!(before.modules.contains("my_kmod"));
    let nodes = Api::<Node>::all(client.clone());
    let ready_since = |node: &Node| {
        node.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready").cloned())
    };
    let before_ready =
        ready_since(&nodes.get("worker-2").await.expect("node")).expect("ready condition");
    let rebooting = {
        let sim = sim.clone();
        tokio::spawn(async move { sim.reboot("worker-2").await })
    };
    common::wait_until("NotReady during the reboot", || async {
        let node = nodes.get("worker-2").await.expect("node");
        ready_since(&node).is_some_and(|c| c.status == "False")
    })
    .await;
    rebooting.await.expect("joined").expect("rebooted");
    let after = sim.node("worker-2").expect("node");
    assert!(after.ready && after.modules.is_empty());
    assert_ne!(after.boot_id, before.boot_id);
    let after_ready =
        ready_since(&nodes.get("worker-2").await.expect("node")).expect("ready condition");
    assert_eq!(after_ready.status, "True");
    // metav1.Time has whole seconds: the transition is no earlier than the last one.
    assert!(after_ready.last_transition_time >= before_ready.last_transition_time);
}

#[tokio::test]
async fn kernel_upgrade_readiness_and_removal() {
    let (cluster, client) = common::start_default_simulated().await;
    let sim = cluster.simulation().expect("simulated").clone();
    sim.upgrade_kernel("worker-3", "6.1.4-200.fc37.x86_64")
        .await
        .expect("upgrade");
    let node = Api::<Node>::all(client.clone())
        .get("worker-3")
        .await
        .expect("node");
    assert_eq!(
        node.status
            .and_then(|s| s.node_info)
            .map(|i| i.kernel_version)
            .as_deref(),
        Some("6.1.4-200.fc37.x86_64")
    );
    sim.set_ready("worker-1", false).expect("not ready");
    assert!(!sim.node("worker-1").expect("node").ready);
    sim.set_ready("worker-1", true).expect("ready");
    common::create_pod(&client, "default", &{
        let mut pod = common::pod("doomed", json!({}));
        pod.spec.as_mut().expect("spec").node_name = Some("worker-1".into());
        pod
    })
    .await;
    common::wait_for_pod(&client, "default", "doomed", "running", common::is_ready).await;
    sim.remove("worker-1").expect("remove");
    let nodes = Api::<Node>::all(client.clone());
    assert!(nodes.get_opt("worker-1").await.expect("get").is_none());
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    common::wait_until("pods of a removed node are deleted", || async {
        pods.get_opt("doomed").await.expect("get").is_none()
    })
    .await;
}
