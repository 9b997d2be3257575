//! The simulated kubelet: pods bound to a node start, run, finish or restart as their
//! restart policy says, terminate after their grace period, and are rejected when they
//! do not fit the node; the scheduler binds pods that name no node.

use crate::common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

fn pod_on(node: &str, name: &str, extra: serde_json::Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/app:v1"}]},
    });
    if let (Some(target), Some(extra)) = (pod.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            match (target.get_mut(k), v) {
                (Some(serde_json::Value::Object(t)), serde_json::Value::Object(e)) => {
                    t.extend(e.clone())
                }
                _ => {
                    target.insert(k.clone(), v.clone());
                }
            }
        }
    }
    serde_json::from_value(pod).expect("pod")
}

#[tokio::test]
async fn a_bound_pod_becomes_running_and_ready_with_an_ip() {
    let (_cluster, client) = common::start_default_simulated().await;
    common::create_pod(&client, "default", &pod_on("worker-1", "web", json!({}))).await;
    let pod = common::wait_for_pod(
        &client,
        "default",
        "web",
        "web running and ready",
        common::is_ready,
    )
    .await;
    assert_eq!(common::phase(&pod), "Running");
    let status = pod.status.expect("status");
    assert!(status.pod_ip.is_some_and(|ip| ip.starts_with("10.")));
    let containers = status.container_statuses.expect("container statuses");
    assert!(containers[0].ready && containers[0].restart_count == 0);
    assert!(
        containers[0]
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .is_some()
    );
}

#[tokio::test]
async fn run_to_completion_pods_finish_and_failing_ones_restart() {
    let (_cluster, client) = common::start_default_simulated().await;
    let exits = |code: &str| json!({"metadata": {"annotations": {"sim.capstan.dev/exit-after-seconds": "0.05", "sim.capstan.dev/exit-code": code}}});
    let mut done = pod_on("worker-1", "done", exits("0"));
    done.spec.as_mut().expect("spec").restart_policy = Some("Never".into());
    common::create_pod(&client, "default", &done).await;
    let mut crashing = pod_on("worker-2", "crashing", exits("1"));
    crashing.spec.as_mut().expect("spec").restart_policy = Some("OnFailure".into());
    common::create_pod(&client, "default", &crashing).await;
    common::wait_for_pod(&client, "default", "done", "done Succeeded", |p| {
        common::phase(p) == "Succeeded"
    })
    .await;
    let restarted = common::wait_for_pod(
        &client,
        "default",
        "crashing",
        "crashing restarted twice",
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| c[0].restart_count >= 2)
        },
    )
    .await;
    assert_ne!(common::phase(&restarted), "Succeeded");
    // A pod without an exit keeps running.
    common::create_pod(
        &client,
        "default",
        &pod_on("worker-3", "forever", json!({})),
    )
    .await;
    common::wait_for_pod(
        &client,
        "default",
        "forever",
        "forever running",
        common::is_ready,
    )
    .await;
}

#[tokio::test]
async fn deleted_pods_terminate_after_their_grace_period_unless_stuck() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    common::create_pod(&client, "default", &pod_on("worker-1", "normal", json!({}))).await;
    let stuck = pod_on(
        "worker-1",
        "stuck",
        json!({"metadata": {"labels": {"sim.capstan.dev/stuck": "true"}}}),
    );
    common::create_pod(&client, "default", &stuck).await;
    let held = pod_on(
        "worker-1",
        "held",
        json!({"metadata": {"finalizers": ["example.dev/hold"]}}),
    );
    common::create_pod(&client, "default", &held).await;
    for name in ["normal", "stuck", "held"] {
        common::wait_for_pod(&client, "default", name, "running", common::is_ready).await;
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    common::wait_until("normal pod gone", || async {
        pods.get_opt("normal").await.expect("get").is_none()
    })
    .await;
    common::wait_until("held pod stopped but kept", || async {
        pods.get("held")
            .await
            .is_ok_and(|p| p.metadata.deletion_grace_period_seconds == Some(0))
    })
    .await;
    let stuck_now = pods.get("stuck").await.expect("stuck pod still there");
    assert_eq!(
        stuck_now.metadata.deletion_grace_period_seconds,
        Some(30),
        "stuck ignores termination"
    );
    pods.delete(
        "stuck",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("force");
    assert!(
        pods.get_opt("stuck").await.expect("get").is_none(),
        "grace 0 removes a stuck pod"
    );
}

#[tokio::test]
async fn pods_that_do_not_fit_their_node_are_rejected() {
    let (_cluster, client) = common::start_default_simulated().await;
    let wrong = pod_on(
        "worker-1",
        "wrong-node",
        json!({"spec": {"nodeSelector": {"disk": "ssd"}}}),
    );
    common::create_pod(&client, "default", &wrong).await;
    let rejected = common::wait_for_pod(&client, "default", "wrong-node", "rejected", |p| {
        common::phase(p) == "Failed"
    })
    .await;
    assert_eq!(
        rejected.status.and_then(|s| s.reason).as_deref(),
        Some("NodeAffinity")
    );
}

#[tokio::test]
async fn the_scheduler_binds_pods_to_schedulable_workers() {
    let (_cluster, client) = common::start_default_simulated().await;
    for i in 0..6 {
        common::create_pod(
            &client,
            "default",
            &common::pod(&format!("free-{i}"), json!({})),
        )
        .await;
    }
    let mut nodes = Vec::new();
    for i in 0..6 {
        let pod = common::wait_for_pod(
            &client,
            "default",
            &format!("free-{i}"),
            "scheduled and ready",
            common::is_ready,
        )
        .await;
        nodes.push(pod.spec.and_then(|s| s.node_name).expect("bound"));
    }
    assert!(
        !nodes.iter().any(|n| n == "control-plane"),
        "the tainted control plane takes no pods: {nodes:?}"
    );
    for worker in ["worker-1", "worker-2", "worker-3"] {
        assert_eq!(
            nodes.iter().filter(|n| *n == worker).count(),
            2,
            "spread evenly: {nodes:?}"
        );
    }
    let picky = serde_json::from_value::<Pod>(json!({
        "metadata": {"name": "picky"},
        "spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "app", "image": "app:v1"}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &picky)
        .await
        .expect("create");
    let waiting = common::wait_for_pod(&client, "default", "picky", "unschedulable", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.reason.as_deref() == Some("Unschedulable"))
            })
    })
    .await;
    assert!(waiting.spec.and_then(|s| s.node_name).is_none());
}
