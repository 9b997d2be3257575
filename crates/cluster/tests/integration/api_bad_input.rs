//! Bad requests get a clear 4xx Status, nothing is half-written, and the server keeps
//! serving; requests without the token get 401. Patches whose result is not an object
//! are refused as kube-apiserver refuses them.

use crate::common;
use crate::requests::{
    APPLY, JSON_PATCH, MAPS, MERGE, MODULES, PODS, STRATEGIC, read_all, seed, send,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams};
use serde_json::json;

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

/// Patch bodies of the wrong shape get a 4xx Status, never a dropped connection, and
/// change nothing: merge, strategic and apply patches that are not objects, JSON patches
/// that are not lists of operations, and patches that leave no object or no metadata.
#[tokio::test]
async fn patches_of_the_wrong_shape_are_refused_with_a_status() {
    let (cluster, client) = common::start().await;
    seed(&cluster).await;
    let map = format!("{MAPS}/c");
    let pod = format!("{PODS}/p");
    let module = format!("{MODULES}/m");
    let apply = |object: &str| format!("{object}?fieldManager=tester");
    let mut cases: Vec<(String, &str, &[u8], u16)> = Vec::new();
    for body in [&b"[1]"[..], b"\"x\"", b"3"] {
        for object in [&map, &pod, &module] {
            cases.push((object.clone(), MERGE, body, 400));
            cases.push((apply(object), APPLY, body, 400));
        }
        for object in [&pod, &module] {
            cases.push((format!("{object}/status"), MERGE, body, 400));
        }
        for object in [&map, &pod] {
            cases.push((object.clone(), STRATEGIC, body, 400));
        }
    }
    cases.push((map.clone(), STRATEGIC, b"null", 400));
    cases.push((format!("{pod}/status"), STRATEGIC, b"[1]", 400));
    // Upstream serves no strategic merge patch for custom resources.
    cases.push((module.clone(), STRATEGIC, b"[1]", 415));
    for object in [&map, &pod, &module] {
        for body in [
            &br#"{"op": "add", "path": "/data/b", "value": "2"}"#[..],
            b"\"x\"",
            b"3",
            b"null",
            br#"[{"op": "replace", "path": "", "value": 3}]"#,
            br#"[{"op": "replace", "path": "/metadata", "value": "x"}]"#,
        ] {
            cases.push((object.clone(), JSON_PATCH, body, 400));
        }
        for body in [&br#"{"metadata": 5}"#[..], br#"{"metadata": [1]}"#] {
            cases.push((object.clone(), MERGE, body, 400));
            cases.push((apply(object), APPLY, body, 400));
        }
    }
    for object in [&map, &pod] {
        cases.push((object.clone(), STRATEGIC, br#"{"metadata": "x"}"#, 400));
    }
    let before = read_all(&cluster, &[&map, &pod, &module]).await;
    for (path, content_type, body, want) in cases {
        let shown = String::from_utf8_lossy(body);
        let what = format!("{content_type} {shown} to {path}");
        let (code, status) = send(&cluster, "PATCH", &path, content_type, body).await;
        let (code, reason) = (code, status["reason"].as_str().unwrap_or(""));
        assert_eq!(code, want, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}: {status}");
        assert!(!reason.is_empty(), "{what}: {status}");
        assert!(
            status["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {status}"
        );
    }
    assert_eq!(read_all(&cluster, &[&map, &pod, &module]).await, before);
    Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect("server still serves");
}
