//! Bad requests get a clear 4xx Status, nothing is half-written, and the server keeps
//! serving; requests without the token get 401.

mod common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::json;

const MAPS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn bad_bodies_are_refused_with_a_status() {
    let (cluster, client) = common::start().await;
    let token = Some(cluster.token());
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            MAPS,
            "application/json",
            b"{\"metadata\": {".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "not an object",
            MAPS,
            "application/json",
            b"[1, 2]".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "malformed YAML",
            MAPS,
            "application/yaml",
            b"metadata: [unclosed".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "no name",
            MAPS,
            "application/json",
            br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "wrong kind",
            MAPS,
            "application/json",
            br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "bad name",
            MAPS,
            "application/json",
            br#"{"metadata":{"name":"Not_Valid"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "unknown kind",
            "/apis/example.dev/v1/namespaces/default/widgets",
            "application/json",
            br#"{"metadata":{"name":"x"}}"#.to_vec(),
            404,
            "NotFound",
        ),
        (
            "oversized",
            MAPS,
            "application/json",
            oversized(),
            413,
            "RequestEntityTooLarge",
        ),
    ];
    for (name, path, content_type, body, want_code, want_reason) in cases {
        let (code, status) = common::raw(&cluster, "POST", path, content_type, body, token).await;
        assert_eq!(code, want_code, "{name}: {status}");
        assert_eq!(status["kind"], "Status", "{name}");
        assert_eq!(status["reason"], want_reason, "{name}: {status}");
        assert!(
            status["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}"
        );
    }
    let left = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("server still serves");
    assert!(left.items.is_empty(), "nothing half-written");
}

fn oversized() -> Vec<u8> {
    let big = "x".repeat(4 * 1024 * 1024);
    serde_json::to_vec(&json!({"metadata": {"name": "big"}, "data": {"big": big}})).expect("json")
}

#[tokio::test]
async fn a_patch_with_an_unknown_content_type_is_415() {
    let (cluster, client) = common::start().await;
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&Default::default(), &common::config_map("p", json!({})))
        .await
        .expect("create");
    let (code, status) = common::raw(
        &cluster,
        "PATCH",
        &format!("{MAPS}/p"),
        "text/plain",
        b"{}".to_vec(),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
}

#[tokio::test]
async fn requests_without_the_token_are_unauthorized() {
    let (cluster, _client) = common::start().await;
    for token in [None, Some("wrong-token")] {
        for path in ["/api/v1/namespaces", "/version", "/apis"] {
            let (code, status) =
                common::raw(&cluster, "GET", path, "application/json", Vec::new(), token).await;
            assert_eq!(code, 401, "{path} with {token:?}");
            assert_eq!(status["reason"], "Unauthorized");
        }
    }
    let (code, _) = common::raw(
        &cluster,
        "GET",
        "/api/v1/namespaces",
        "application/json",
        Vec::new(),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(code, 200);
}
