//! What the tests of every crate share: an embedded cluster on loopback and a `kube`
//! client for it, condition waits with generous deadlines, and Git repositories built
//! commit by commit.

pub mod git;

use std::future::Future;
use std::time::Duration;

use capstan_cluster::{ClusterOptions, EmbeddedCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

/// How long a condition may take on a loaded machine before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub async fn start() -> (EmbeddedCluster, kube::Client) {
    start_with(ClusterOptions::default()).await
}

pub async fn start_with(options: ClusterOptions) -> (EmbeddedCluster, kube::Client) {
    let cluster = EmbeddedCluster::start(options)
        .await
        .expect("cluster starts");
    let client = cluster.client().expect("client");
    (cluster, client)
}

/// Polls `check` until it returns true, failing the test after [`DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

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

pub async fn create_pod(client: &kube::Client, namespace: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), pod)
        .await
        .expect("create pod")
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

/// Sends a raw request and returns (status, body as JSON).
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

/// An embedded cluster with simulated nodes from `config` (fast timings).
pub async fn start_simulated(
    config: capstan_cluster::sim::config::ClusterConfig,
) -> (EmbeddedCluster, kube::Client) {
    start_with(ClusterOptions {
        simulation: Some(config),
        ..ClusterOptions::default()
    })
    .await
}

/// The default simulated cluster: a control-plane node and three workers.
pub async fn start_default_simulated() -> (EmbeddedCluster, kube::Client) {
    start_simulated(capstan_cluster::sim::config::ClusterConfig::default_cluster()).await
}

/// Waits until a pod satisfies `check`, returning it.
pub async fn wait_for_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(Some(pod)) = pods.get_opt(name).await
            && check(&pod)
        {
            return pod;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The cluster's resourceVersion: it moves with every write, anywhere in the cluster.
pub async fn cluster_revision(client: &kube::Client) -> String {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
        .expect("list namespaces")
        .metadata
        .resource_version
        .expect("resourceVersion")
}
