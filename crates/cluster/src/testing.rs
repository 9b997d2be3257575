//! The embedded cluster's test API: start a cluster (simulated nodes or none) with a
//! `kube` client for it, reach its API server byte for byte over TLS, read its
//! resourceVersion, and the API objects tests create in it. Every crate's tests use it
//! beside `capstan_testing`'s waits and Git repositories; nothing here is used in
//! production.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::sim::config::ClusterConfig;
use crate::{ClusterOptions, EmbeddedCluster};

/// A cluster without simulated nodes, and its client.
pub async fn start() -> (EmbeddedCluster, kube::Client) {
    start_with(ClusterOptions::default()).await
}

/// A cluster started with `options`, and its client; panics when it does not start.
pub async fn start_with(options: ClusterOptions) -> (EmbeddedCluster, kube::Client) {
    let cluster = EmbeddedCluster::start(options)
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    (cluster, client)
}

/// A cluster with simulated nodes from `config`.
pub async fn start_simulated(config: ClusterConfig) -> (EmbeddedCluster, kube::Client) {
    start_with(ClusterOptions {
        simulation: Some(config),
        ..ClusterOptions::default()
    })
    .await
}

/// The default simulated cluster: a control-plane node and three workers.
pub async fn start_default_simulated() -> (EmbeddedCluster, kube::Client) {
    start_simulated(ClusterConfig::default_cluster()).await
}

/// A TLS connection to the cluster, trusting its CA.
pub async fn connect_tls(
    cluster: &EmbeddedCluster,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    capstan_api::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            cluster.ca_der().to_vec(),
        ))
        .expect("CA");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(cluster.address())
        .await
        .expect("connect");
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
    connector.connect(name, tcp).await.expect("TLS handshake")
}

/// Sends a raw request and returns (status, body as JSON; a body that is not JSON as a
/// string).
pub async fn raw(
    cluster: &EmbeddedCluster,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt as _;
    let io = hyper_util::rt::TokioIo::new(connect_tls(cluster).await);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", cluster.address().to_string())
        .header("content-type", content_type);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let value =
        serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
    (status, value)
}

/// The cluster's resourceVersion: it moves with every write, anywhere in the cluster.
pub async fn cluster_revision(client: &kube::Client) -> String {
    Api::<Namespace>::all(client.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .expect("list namespaces")
        .metadata
        .resource_version
        .expect("resourceVersion")
}

/// ConfigMap `name` (namespace left to the API) holding `data`.
pub fn config_map(name: &str, data: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": data,
    }))
    .expect("configmap")
}

/// A pod that is not bound to a node: deletes of it are immediate.
pub fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]},
    }))
    .expect("pod")
}

/// Creates `pod` in `namespace`, returning it as stored.
pub async fn create_pod(client: &kube::Client, namespace: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), pod)
        .await
        .expect("create pod")
}

/// The pod's phase; empty before the kubelet reports one.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Whether the pod's Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
