//! Requests to the cluster's API byte for byte, for the tests that check exactly what a
//! client sends and what it gets back: the status code, the `Status` body, the
//! `Warning` headers. And the objects those tests start from.

use crate::common;

use capstan_cluster::EmbeddedCluster;
use serde_json::{Value, json};

pub const MAPS: &str = "/api/v1/namespaces/default/configmaps";
pub const PODS: &str = "/api/v1/namespaces/default/pods";
pub const SECRETS: &str = "/api/v1/namespaces/default/secrets";
pub const STATEFUL_SETS: &str = "/apis/apps/v1/namespaces/default/statefulsets";
pub const MODULES: &str = "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/default/modules";

pub const JSON: &str = "application/json";
pub const MERGE: &str = "application/merge-patch+json";
pub const STRATEGIC: &str = "application/strategic-merge-patch+json";
pub const JSON_PATCH: &str = "application/json-patch+json";
pub const APPLY: &str = "application/apply-patch+yaml";

/// Sends `body` with the cluster's token: the status code and the body as JSON.
pub async fn send(
    cluster: &EmbeddedCluster,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    let (code, value, _) = send_warned(cluster, method, path, content_type, body).await;
    (code, value)
}

/// [`send`], with the response's `Warning` headers in order.
pub async fn send_warned(
    cluster: &EmbeddedCluster,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value, Vec<String>) {
    use http_body_util::BodyExt as _;
    let io = hyper_util::rt::TokioIo::new(common::connect_tls(cluster).await);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", cluster.address().to_string())
        .header("content-type", content_type)
        .header("authorization", format!("Bearer {}", cluster.token()))
        .body(http_body_util::Full::new(bytes::Bytes::from(body.to_vec())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().expect("ASCII warning").to_string())
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let value =
        serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
    (code, value, warnings)
}

/// Creates `body` in `collection`, which must answer 201.
pub async fn create(cluster: &EmbeddedCluster, collection: &str, body: Value) -> Value {
    let body = serde_json::to_vec(&body).expect("json");
    let (code, created) = send(cluster, "POST", collection, JSON, &body).await;
    assert_eq!(code, 201, "create in {collection}: {created}");
    created
}

/// The object at `path`, which must exist.
pub async fn get(cluster: &EmbeddedCluster, path: &str) -> Value {
    let (code, object) = send(cluster, "GET", path, JSON, b"").await;
    assert_eq!(code, 200, "get {path}: {object}");
    object
}

/// The objects at `paths`, as read now.
pub async fn read_all(cluster: &EmbeddedCluster, paths: &[&String]) -> Vec<Value> {
    let mut objects = Vec::new();
    for path in paths {
        objects.push(get(cluster, path).await);
    }
    objects
}

/// A ConfigMap `c`, an unbound Pod `p` (its status Pending, the server's) and a Module
/// `m` with a status, in `default`.
pub async fn seed(cluster: &EmbeddedCluster) {
    create(
        cluster,
        MAPS,
        json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
    )
    .await;
    create(
        cluster,
        PODS,
        json!({"metadata": {"name": "p"},
               "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]}}),
    )
    .await;
    create(cluster, MODULES, module("m")).await;
    let status = br#"{"status": {"moduleLoader": {"desiredNumber": 1}}}"#;
    let (code, module) = send(
        cluster,
        "PATCH",
        &format!("{MODULES}/m/status"),
        MERGE,
        status,
    )
    .await;
    assert_eq!(code, 200, "module status: {module}");
    assert!(module["status"].is_object(), "{module}");
}

/// A valid Module `name`.
pub fn module(name: &str) -> Value {
    json!({"apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
           "metadata": {"name": name},
           "spec": {"selector": {"node-role.kubernetes.io/worker": ""},
                    "moduleLoader": {"container": {
                        "modprobe": {"moduleName": "my_kmod"},
                        "kernelMappings": [{"regexp": "^.+$",
                                            "containerImage": "registry.example/kmod:v1"}]}}}})
}
