//! Create, read, update and delete over HTTP, with the metadata a real API server keeps:
//! uid, creationTimestamp, a cluster-wide resourceVersion, generation on spec changes.

use crate::common;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

fn rv(object: &impl kube::Resource) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("resourceVersion")
}

#[tokio::test]
async fn objects_round_trip_with_server_metadata() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let created = maps
        .create(
            &PostParams::default(),
            &common::config_map("settings", json!({"a": "1"})),
        )
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let fetched = maps.get("settings").await.expect("get");
    assert_eq!(
        fetched
            .data
            .as_ref()
            .and_then(|d| d.get("a"))
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(rv(&fetched), rv(&created));

    let mut changed = fetched.clone();
    changed.data = Some([("a".to_string(), "2".to_string())].into());
    let updated = maps
        .replace("settings", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert!(rv(&updated) > rv(&created), "resourceVersion grows");

    let err = maps
        .create(
            &PostParams::default(),
            &common::config_map("settings", json!({})),
        )
        .await
        .expect_err("duplicate");
    assert_eq!(code(err), 409);

    maps.delete("settings", &DeleteParams::default())
        .await
        .expect("delete");
    assert_eq!(code(maps.get("settings").await.expect_err("gone")), 404);
}

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let first = maps
        .create(
            &PostParams::default(),
            &common::config_map("race", json!({"v": "0"})),
        )
        .await
        .expect("create");
    let mut winner = first.clone();
    winner.data = Some([("v".to_string(), "winner".to_string())].into());
    maps.replace("race", &PostParams::default(), &winner)
        .await
        .expect("first writer");
    let mut loser = first;
    loser.data = Some([("v".to_string(), "loser".to_string())].into());
    let err = maps
        .replace("race", &PostParams::default(), &loser)
        .await
        .expect_err("stale");
    match err {
        kube::Error::Api(status) => {
            assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
            assert!(
                status.message.contains("the object has been modified"),
                "{}",
                status.message
            );
        }
        other => panic!("{other}"),
    }
}

#[tokio::test]
async fn generation_counts_spec_changes_only() {
    let (_cluster, client) = common::start().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let created =
        common::create_pod(&client, "default", &common::pod("gen", json!({"app": "a"}))).await;
    assert_eq!(created.metadata.generation, Some(1));
    let relabelled = pods
        .patch(
            "gen",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"app": "b"}}})),
        )
        .await
        .expect("label");
    assert_eq!(
        relabelled.metadata.generation,
        Some(1),
        "metadata changes keep the generation"
    );
    let respec = pods
        .patch(
            "gen",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 30}})),
        )
        .await
        .expect("spec");
    assert_eq!(respec.metadata.generation, Some(2));
}

#[tokio::test]
async fn namespaced_objects_need_their_namespace() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "nowhere");
    let err = maps
        .create(&PostParams::default(), &common::config_map("x", json!({})))
        .await
        .expect_err("no namespace");
    assert_eq!(code(err), 404);
    let namespaces = Api::<Namespace>::all(client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "nowhere"}})).expect("ns");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("create ns");
    maps.create(&PostParams::default(), &common::config_map("x", json!({})))
        .await
        .expect("now it works");
}

#[tokio::test]
async fn generate_name_makes_a_unique_name() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let template: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "run-"}})).expect("template");
    let a = maps
        .create(&PostParams::default(), &template)
        .await
        .expect("a");
    let b = maps
        .create(&PostParams::default(), &template)
        .await
        .expect("b");
    let (a, b) = (
        a.metadata.name.expect("name"),
        b.metadata.name.expect("name"),
    );
    assert!(a.starts_with("run-") && a.len() == 9, "{a}");
    assert_ne!(a, b);
    assert_eq!(
        maps.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let shown = maps
        .create(&params, &common::config_map("dry", json!({"a": "1"})))
        .await
        .expect("dry create");
    assert_eq!(shown.metadata.name.as_deref(), Some("dry"));
    assert_eq!(code(maps.get("dry").await.expect_err("not stored")), 404);
    maps.create(
        &PostParams::default(),
        &common::config_map("dry", json!({"a": "1"})),
    )
    .await
    .expect("create");
    let dp = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    maps.delete("dry", &dp).await.expect("dry delete");
    maps.get("dry").await.expect("still there");
}
