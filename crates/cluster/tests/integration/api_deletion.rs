//! Deletion: finalizers hold an object until removed, graceful pod deletion, and garbage
//! collection of dependents by ownerReferences (background, foreground, orphan), and
//! namespace deletion emptying the namespace first.

use crate::common;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use serde_json::json;

async fn owned_map(maps: &Api<ConfigMap>, name: &str, owner: &ConfigMap, block: bool) -> ConfigMap {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
            "uid": owner.metadata.uid, "blockOwnerDeletion": block,
        }]},
    }))
    .expect("dependent");
    maps.create(&PostParams::default(), &cm)
        .await
        .expect("create dependent")
}

async fn exists(maps: &Api<ConfigMap>, name: &str) -> bool {
    maps.get_opt(name).await.expect("get").is_some()
}

#[tokio::test]
async fn finalizers_hold_the_object_until_removed() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "held", "finalizers": ["example.dev/cleanup"]}}),
    )
    .expect("cm");
    maps.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    maps.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let marked = maps.get("held").await.expect("still there");
    assert!(marked.metadata.deletion_timestamp.is_some());
    // No new finalizers on an object being deleted.
    let err = maps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.dev/cleanup", "late"]}})),
        )
        .await
        .expect_err("no new finalizers");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err}"
    );
    maps.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    assert!(
        !exists(&maps, "held").await,
        "gone once the last finalizer is removed"
    );
}

#[tokio::test]
async fn a_bound_pod_terminates_gracefully() {
    let (_cluster, client) = common::start().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let mut pod = common::pod("graceful", json!({}));
    pod.spec.as_mut().expect("spec").node_name = Some("worker-1".into());
    common::create_pod(&client, "default", &pod).await;
    pods.delete("graceful", &DeleteParams::default())
        .await
        .expect("delete");
    let terminating = pods.get("graceful").await.expect("terminating");
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    // Grace period 0 (what the kubelet sends when the containers stopped) removes it.
    pods.delete(
        "graceful",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("force");
    assert!(pods.get_opt("graceful").await.expect("get").is_none());
}

#[tokio::test]
async fn background_deletion_collects_dependents() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let owner = maps
        .create(
            &PostParams::default(),
            &common::config_map("owner", json!({})),
        )
        .await
        .expect("owner");
    owned_map(&maps, "child-1", &owner, false).await;
    owned_map(&maps, "child-2", &owner, false).await;
    maps.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    common::wait_until("dependents collected", || async {
        !exists(&maps, "child-1").await && !exists(&maps, "child-2").await
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_waits_for_blocking_dependents() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let owner = maps
        .create(
            &PostParams::default(),
            &common::config_map("owner", json!({})),
        )
        .await
        .expect("owner");
    let child: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "child", "finalizers": ["example.dev/slow"], "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid, "blockOwnerDeletion": true}]},
    }))
    .expect("child");
    maps.create(&PostParams::default(), &child)
        .await
        .expect("child");
    maps.delete("owner", &DeleteParams::foreground())
        .await
        .expect("delete owner");
    common::wait_until("child marked for deletion", || async {
        maps.get("child")
            .await
            .is_ok_and(|c| c.metadata.deletion_timestamp.is_some())
    })
    .await;
    let owner_now = maps
        .get("owner")
        .await
        .expect("owner waits for its blocking dependent");
    assert!(
        owner_now
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "foregroundDeletion")
    );
    maps.patch(
        "child",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release child");
    common::wait_until("owner deleted after its dependent", || async {
        !exists(&maps, "owner").await
    })
    .await;
}

#[tokio::test]
async fn orphan_deletion_keeps_dependents_without_the_reference() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let owner = maps
        .create(
            &PostParams::default(),
            &common::config_map("owner", json!({})),
        )
        .await
        .expect("owner");
    owned_map(&maps, "child", &owner, false).await;
    let orphan = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..DeleteParams::default()
    };
    maps.delete("owner", &orphan).await.expect("delete owner");
    common::wait_until("owner gone", || async { !exists(&maps, "owner").await }).await;
    let child = maps.get("child").await.expect("child kept");
    assert!(
        child
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_contents_first() {
    let (_cluster, client) = common::start().await;
    let namespaces = Api::<Namespace>::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "doomed"}})).expect("ns");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("ns");
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "doomed");
    maps.create(
        &PostParams::default(),
        &common::config_map("inside", json!({})),
    )
    .await
    .expect("inside");
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete ns");
    common::wait_until("namespace gone", || async {
        namespaces.get_opt("doomed").await.expect("get").is_none()
    })
    .await;
    assert!(!exists(&maps, "inside").await);
}
