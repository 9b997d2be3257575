//! The headless Service a LeaderWorkerSet creates for its pods' DNS names (upstream
//! `CreateHeadlessServiceIfNotExists`: `clusterIP: None`, a selector, no ports,
//! `publishNotReadyAddresses`) is accepted and stored as kube-apiserver 1.36 stores it
//! on a single-stack IPv4 cluster; one without a selector too.

use crate::common;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn a_headless_service_with_a_selector_is_stored_with_its_defaults() {
    let (_cluster, client) = common::start_default_simulated().await;
    let services = Api::<Service>::namespaced(client.clone(), "default");
    let headless: Service = serde_json::from_value(json!({
        "metadata": {"name": "demo", "labels": {"leaderworkerset.sigs.k8s.io/name": "demo"}},
        "spec": {
            "clusterIP": "None",
            "selector": {"leaderworkerset.sigs.k8s.io/name": "demo"},
            "publishNotReadyAddresses": true,
        },
    }))
    .expect("service");
    let created = services
        .create(&PostParams::default(), &headless)
        .await
        .expect("a headless service without ports is accepted");
    let stored = services.get("demo").await.expect("stored");
    assert_eq!(stored.spec, created.spec);
    assert_eq!(
        serde_json::to_value(&stored.spec).expect("spec"),
        json!({
            "clusterIP": "None",
            "clusterIPs": ["None"],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "publishNotReadyAddresses": true,
            "selector": {"leaderworkerset.sigs.k8s.io/name": "demo"},
            "sessionAffinity": "None",
            "type": "ClusterIP",
        })
    );
    assert_eq!(
        serde_json::to_value(&stored.status).expect("status"),
        json!({"loadBalancer": {}})
    );
}

/// Without a selector a headless Service is dual-stack by default, even on a single-stack
/// cluster, as kube-apiserver decides (its endpoints are the writer's to give).
#[tokio::test]
async fn a_headless_service_without_a_selector_requires_dual_stack() {
    let (_cluster, client) = common::start().await;
    let services = Api::<Service>::namespaced(client.clone(), "default");
    let headless: Service = serde_json::from_value(
        json!({"metadata": {"name": "bare"}, "spec": {"clusterIP": "None"}}),
    )
    .expect("service");
    let created = services
        .create(&PostParams::default(), &headless)
        .await
        .expect("created");
    let spec = serde_json::to_value(&created.spec).expect("spec");
    assert_eq!(spec["ipFamilyPolicy"], "RequireDualStack");
    assert_eq!(spec["ipFamilies"], json!(["IPv4", "IPv6"]));
    assert_eq!(spec["clusterIPs"], json!(["None"]));
}
