//! `pods/eviction` honours PodDisruptionBudgets: allowed evictions delete the pod, the
//! one that would break the budget gets 429.

use crate::common;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, EvictParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn ready_pod(client: &kube::Client, name: &str) {
    common::create_pod(client, "default", &common::pod(name, json!({"app": "web"}))).await;
    let ready = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status(name, &PatchParams::default(), &Patch::Merge(ready))
        .await
        .expect("ready");
}

async fn budget(client: &kube::Client, spec: serde_json::Value) {
    let pdb: PodDisruptionBudget =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).expect("pdb");
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
}

fn evict_code(result: kube::Result<kube::core::response::Status>) -> u16 {
    match result {
        Ok(_) => 201,
        Err(kube::Error::Api(status)) => status.code,
        Err(other) => panic!("{other}"),
    }
}

#[tokio::test]
async fn min_available_allows_evictions_down_to_the_budget() {
    let (_cluster, client) = common::start().await;
    for name in ["web-1", "web-2", "web-3"] {
        ready_pod(&client, name).await;
    }
    budget(
        &client,
        json!({"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}),
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    assert_eq!(
        evict_code(pods.evict("web-1", &EvictParams::default()).await),
        201
    );
    assert!(
        pods.get_opt("web-1").await.expect("get").is_none(),
        "evicted pod deleted"
    );
    match pods.evict("web-2", &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(
                (status.code, status.reason.as_str()),
                (429, "TooManyRequests")
            );
            assert!(
                status.message.contains("disruption budget"),
                "{}",
                status.message
            );
        }
        other => panic!("expected 429, got {other:?}"),
    }
    assert!(
        pods.get_opt("web-2").await.expect("get").is_some(),
        "blocked pod kept"
    );
}

#[tokio::test]
async fn max_unavailable_with_match_expressions() {
    let (_cluster, client) = common::start().await;
    for name in ["web-1", "web-2"] {
        ready_pod(&client, name).await;
    }
    budget(
        &client,
        json!({"maxUnavailable": 0, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}),
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    assert_eq!(
        evict_code(pods.evict("web-1", &EvictParams::default()).await),
        429
    );
}

#[tokio::test]
async fn pods_outside_any_budget_and_unready_pods_are_evicted() {
    let (_cluster, client) = common::start().await;
    ready_pod(&client, "web-1").await;
    common::create_pod(
        &client,
        "default",
        &common::pod("loner", json!({"app": "other"})),
    )
    .await;
    common::create_pod(
        &client,
        "default",
        &common::pod("web-unready", json!({"app": "web"})),
    )
    .await;
    budget(
        &client,
        json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}),
    )
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    assert_eq!(
        evict_code(pods.evict("loner", &EvictParams::default()).await),
        201
    );
    assert_eq!(
        evict_code(pods.evict("web-unready", &EvictParams::default()).await),
        201
    );
    assert_eq!(
        evict_code(pods.evict("web-1", &EvictParams::default()).await),
        429
    );
}
