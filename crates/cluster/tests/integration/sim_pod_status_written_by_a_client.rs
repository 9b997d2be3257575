//! A client writing a pod's status through the `status` subresource, as tests on a
//! kubelet-less cluster (envtest, kwok) fake readiness and restarts: the simulated
//! kubelet writes a pod's status only when it acts on the pod (a start, an exit, a
//! crash, its node going NotReady), so what a client wrote to a running pod stays until
//! then. (A real kubelet puts its own view back within its status sync, about ten
//! seconds.)

use std::time::Duration;

use crate::common;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_status_written_by_a_client_stays_on_a_running_pod() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "worker-0-1"},
        "spec": {"nodeName": "worker-2", "containers": [{"name": "worker", "image": "app:v1"}]},
    }))
    .expect("pod");
    common::create_pod(&client, "default", &pod).await;
    let mut running =
        common::wait_for_pod(&client, "default", "worker-0-1", "ready", common::is_ready).await;

    // As upstream LWS's tests do it: read, change, write the status back whole.
    let status = running.status.as_mut().expect("status");
    status.container_statuses.as_mut().expect("containers")[0].restart_count = 1;
    for condition in status.conditions.as_mut().expect("conditions") {
        if condition.type_ == "Ready" {
            condition.status = "False".into();
        }
    }
    pods.replace_status("worker-0-1", &PostParams::default(), &running)
        .await
        .expect("status written");

    // Past several of the kubelet's relists, the client's status is still the pod's.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = pods.get("worker-0-1").await.expect("pod");
    let containers = after
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .expect("containers");
    assert_eq!(containers[0].restart_count, 1);
    assert!(!common::is_ready(&after));
    assert_eq!(common::phase(&after), "Running");
}
