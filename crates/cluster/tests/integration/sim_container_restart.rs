//! One container of a running pod restarts, as when its process dies on a real node: a
//! test labels the pod `sim.capstan.dev/crash-<container>=<n>` (the crashes it is to
//! have had in all) and the kubelet makes that container exit once more (code 1), then
//! restarts it: its `restartCount` goes up by one, the pod stays Running and is not
//! Ready until the container runs again. The readiness conditions of a running pod.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{Api, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

fn two_containers(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": "worker-1", "containers": [
            {"name": "leader", "image": "app:v1"}, {"name": "sidecar", "image": "proxy:v1"}]},
    }))
    .expect("pod")
}

fn container<'a>(pod: &'a Pod, name: &str) -> &'a ContainerStatus {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("{name} has a status: {pod:?}"))
}

fn restarts(pod: &Pod, name: &str) -> i32 {
    container(pod, name).restart_count
}

fn condition(pod: &Pod, kind: &str) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == kind))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

async fn ask_crashes(pods: &Api<Pod>, pod: &str, container: &str, crashes: u32) {
    let label = format!("sim.capstan.dev/crash-{container}");
    pods.patch(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {label: crashes.to_string()}}})),
    )
    .await
    .expect("label the pod");
}

/// Every version of pod `name` from the cluster revision `from` on.
fn record(pods: Api<Pod>, name: &str, from: String) -> Arc<Mutex<Vec<Pod>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (sink, field) = (seen.clone(), format!("metadata.name={name}"));
    tokio::spawn(async move {
        let params = WatchParams::default().fields(&field);
        let mut stream = pods.watch(&params, &from).await.expect("watch").boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            if let WatchEvent::Added(pod) | WatchEvent::Modified(pod) = event {
                sink.lock().expect("seen").push(pod);
            }
        }
    });
    seen
}

#[tokio::test]
async fn a_running_pod_is_ready_with_every_condition_true() {
    let (_cluster, client) = common::start_default_simulated().await;
    common::create_pod(&client, "default", &two_containers("web")).await;
    let pod = common::wait_for_pod(&client, "default", "web", "ready", common::is_ready).await;
    assert_eq!(common::phase(&pod), "Running");
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert_eq!(condition(&pod, kind), "True", "{kind}");
    }
    for name in ["leader", "sidecar"] {
        let status = container(&pod, name);
        assert!(status.ready && status.started == Some(true), "{name}");
        assert_eq!(status.restart_count, 0, "{name}");
        assert!(
            status
                .state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some()
        );
    }
}

#[tokio::test]
async fn a_labelled_container_crashes_and_restarts_once() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let created = common::create_pod(&client, "default", &two_containers("group-0")).await;
    common::wait_for_pod(&client, "default", "group-0", "ready", common::is_ready).await;
    let seen = record(
        pods.clone(),
        "group-0",
        common::cluster_revision(&client).await,
    );

    ask_crashes(&pods, "group-0", "sidecar", 1).await;
    let restarted = common::wait_for_pod(&client, "default", "group-0", "sidecar restarted", |p| {
        restarts(p, "sidecar") == 1 && common::is_ready(p)
    })
    .await;
    assert_eq!(restarted.metadata.uid, created.metadata.uid, "the same pod");
    assert_eq!(common::phase(&restarted), "Running");
    assert_eq!(
        restarts(&restarted, "leader"),
        0,
        "the other container runs on"
    );
    let sidecar = container(&restarted, "sidecar");
    let last = sidecar
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the crash as its last state");
    assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
    assert!(
        sidecar
            .state
            .as_ref()
            .and_then(|s| s.running.as_ref())
            .is_some()
    );

    // Between the crash and the restart: still Running, not Ready, the sidecar exited.
    let down = seen
        .lock()
        .expect("seen")
        .iter()
        .find(|p| condition(p, "Ready") == "False")
        .cloned()
        .expect("the pod was seen not ready");
    assert_eq!(common::phase(&down), "Running");
    assert_eq!(condition(&down, "ContainersReady"), "False");
    let exited = container(&down, "sidecar");
    assert!(!exited.ready && exited.restart_count == 0);
    assert!(
        exited
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some()
    );
    assert!(container(&down, "leader").ready);
    assert!(
        seen.lock()
            .expect("seen")
            .iter()
            .all(|p| common::phase(p) == "Running"),
        "never anything but Running"
    );

    // Once asked, once done.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = pods.get("group-0").await.expect("pod");
    assert_eq!(restarts(&later, "sidecar"), 1);
    assert!(common::is_ready(&later));

    ask_crashes(&pods, "group-0", "sidecar", 2).await;
    ask_crashes(&pods, "group-0", "leader", 1).await;
    common::wait_for_pod(&client, "default", "group-0", "both restarted", |p| {
        restarts(p, "sidecar") == 2 && restarts(p, "leader") == 1 && common::is_ready(p)
    })
    .await;
}
