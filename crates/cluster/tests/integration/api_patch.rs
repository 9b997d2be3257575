//! The three non-apply patch types over HTTP: JSON merge patch, JSON patch and
//! strategic merge patch (keyed lists merge, atomic lists are replaced).

use crate::common;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test]
async fn merge_patch_sets_and_removes_keys() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.create(
        &Default::default(),
        &common::config_map("m", json!({"keep": "1", "drop": "2"})),
    )
    .await
    .expect("create");
    let patched = maps
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"drop": null, "add": "3"}})),
        )
        .await
        .expect("patch");
    let data = patched.data.expect("data");
    assert_eq!(data.get("keep").map(String::as_str), Some("1"));
    assert_eq!(data.get("add").map(String::as_str), Some("3"));
    assert!(!data.contains_key("drop"));
}

#[tokio::test]
async fn json_patch_applies_operations_and_a_failed_test_changes_nothing() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.create(
        &Default::default(),
        &common::config_map("j", json!({"a": "1"})),
    )
    .await
    .expect("create");
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/data/b", "value": "2"},
        {"op": "replace", "path": "/data/a", "value": "10"},
    ]))
    .expect("ops");
    let patched = maps
        .patch("j", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .expect("patch");
    let data = patched.data.expect("data");
    assert_eq!((data["a"].as_str(), data["b"].as_str()), ("10", "2"));
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "replace", "path": "/data/a", "value": "99"},
        {"op": "test", "path": "/data/b", "value": "not-2"},
    ]))
    .expect("ops");
    let err = maps
        .patch("j", &PatchParams::default(), &Patch::Json::<()>(failing))
        .await
        .expect_err("test fails");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err}"
    );
    assert_eq!(
        maps.get("j").await.expect("get").data.expect("data")["a"],
        "10"
    );
}

#[tokio::test]
async fn strategic_merge_patch_merges_containers_and_env_by_name() {
    let (_cluster, client) = common::start().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "s"},
        "spec": {
            "containers": [
                {"name": "app", "image": "app:v1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "sidecar", "image": "side:v1"}
            ],
            "tolerations": [{"key": "a", "operator": "Exists"}]
        }
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod)
        .await
        .expect("create");
    let patch = json!({"spec": {
        "containers": [{"name": "app", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}]}],
        "tolerations": [{"key": "b", "operator": "Exists"}]
    }});
    let patched = pods
        .patch("s", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .expect("patch");
    let spec = patched.spec.expect("spec");
    assert_eq!(spec.containers.len(), 2, "sidecar kept");
    let app = spec
        .containers
        .iter()
        .find(|c| c.name == "app")
        .expect("app");
    assert_eq!(
        app.image.as_deref(),
        Some("app:v1"),
        "unpatched fields kept"
    );
    let mut env: Vec<(String, String)> = app
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    env.sort();
    assert_eq!(
        env,
        [
            ("A".into(), "1".into()),
            ("B".into(), "20".into()),
            ("C".into(), "3".into())
        ]
    );
    let tolerations: Vec<String> = spec
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| t.key.clone())
        .collect();
    assert_eq!(
        tolerations,
        ["b"],
        "tolerations are atomic upstream and replaced whole"
    );
}

#[tokio::test]
async fn status_conditions_merge_by_type_on_the_status_subresource() {
    let (_cluster, client) = common::start().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    common::create_pod(&client, "default", &common::pod("c", json!({}))).await;
    let set = |kind: &str, status: &str| {
        Patch::Strategic(json!({"status": {"conditions": [{"type": kind, "status": status}]}}))
    };
    pods.patch_status("c", &PatchParams::default(), &set("Ready", "False"))
        .await
        .expect("ready");
    pods.patch_status("c", &PatchParams::default(), &set("PodScheduled", "True"))
        .await
        .expect("scheduled");
    let after = pods
        .patch_status("c", &PatchParams::default(), &set("Ready", "True"))
        .await
        .expect("ready again");
    let mut conditions: Vec<(String, String)> = after
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .map(|c| (c.type_, c.status))
        .collect();
    conditions.sort();
    assert_eq!(
        conditions,
        [
            ("PodScheduled".into(), "True".into()),
            ("Ready".into(), "True".into())
        ]
    );
    // The main resource ignores status; the status subresource ignores the rest.
    let spec_write = pods
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Failed"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .expect("main write");
    assert_eq!(
        spec_write.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    assert_eq!(
        spec_write
            .metadata
            .labels
            .and_then(|l| l.get("x").cloned())
            .as_deref(),
        Some("y")
    );
}
