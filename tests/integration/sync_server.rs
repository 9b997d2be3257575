//! The sync process's HTTP server over real HTTP on loopback: a signed GitHub push makes the
//! sync loop fetch, a forged one does not, metrics are scraped, and shutdown stops serving.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use capstan::sync::metrics::Metrics;
use capstan::sync::server::{ServerState, serve};
use futures::FutureExt as _;
use http_body_util::BodyExt as _;
use ring::hmac;
use tokio::sync::{Notify, oneshot};

/// How long anything may take on a loaded machine before a test fails.
const DEADLINE: Duration = Duration::from_secs(30);

const SECRET: &[u8] = b"fleet webhook secret";
const PUSH_TO_MAIN: &str = r#"{"ref":"refs/heads/main","after":"2222222"}"#;

struct Running {
    address: SocketAddr,
    trigger: Arc<Notify>,
    metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<()>,
    stop: oneshot::Sender<()>,
}

async fn start() -> Running {
    let metrics = Arc::new(Metrics::new());
    let trigger = Arc::new(Notify::new());
    let state = ServerState {
        metrics: metrics.clone(),
        ready: Arc::new(AtomicBool::new(true)),
        webhook_secret: Some(SECRET.to_vec()),
        trigger: trigger.clone(),
        branch: Some("main".into()),
        standby: None,
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let (address, task) = serve("127.0.0.1:0".parse().expect("address"), state, async {
        let _ = stopped.await;
    })
    .await
    .expect("bind");
    Running {
        address,
        trigger,
        metrics,
        task,
        stop,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// An HTTP/1.1 connection to `address`, kept alive until the sender is dropped.
async fn connect(address: SocketAddr) -> Sender {
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    sender
}

/// Sends one request and returns the status, the content type and the body.
async fn send(
    sender: &mut Sender,
    request: http::request::Builder,
    body: &str,
) -> (u16, String, String) {
    let request = request
        .header("host", "capstan")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .expect("request");
    let response = tokio::time::timeout(DEADLINE, sender.send_request(request))
        .await
        .expect("an answer in time")
        .expect("response");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn sign(secret: &[u8], body: &str) -> String {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), body.as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn push_webhook(signature: &str) -> http::request::Builder {
    http::Request::post("/hooks/github")
        .header("content-type", "application/json")
        .header("x-github-event", "push")
        .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
        .header("x-hub-signature-256", signature)
}

#[tokio::test]
async fn a_signed_push_webhook_triggers_a_sync() {
    let server = start().await;
    let mut http = connect(server.address).await;
    let (status, _, body) = send(
        &mut http,
        push_webhook(&sign(SECRET, PUSH_TO_MAIN)),
        PUSH_TO_MAIN,
    )
    .await;
    assert_eq!((status, body.as_str()), (202, "sync triggered"));
    tokio::time::timeout(DEADLINE, server.trigger.notified())
        .await
        .expect("the sync loop is woken");
}

#[tokio::test]
async fn a_webhook_with_a_bad_signature_is_refused_and_triggers_nothing() {
    let server = start().await;
    let mut http = connect(server.address).await;
    let forged = sign(b"a guessed secret", PUSH_TO_MAIN);
    let (status, _, body) = send(&mut http, push_webhook(&forged), PUSH_TO_MAIN).await;
    assert_eq!(status, 401);
    assert!(body.contains("does not match the body"), "{body}");
    // The answer came after the handler finished, so a trigger would already be pending.
    assert!(server.trigger.notified().now_or_never().is_none());
}

#[tokio::test]
async fn metrics_are_scraped_over_http() {
    let server = start().await;
    server
        .metrics
        .observe_sync("applied", Duration::from_millis(800));
    server
        .metrics
        .set_applied_commit("2222222", Some(12), "Move gpu nodes to v2");
    let mut http = connect(server.address).await;
    let (status, content_type, body) = send(&mut http, http::Request::get("/metrics"), "").await;
    assert_eq!(status, 200);
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    for line in [
        "capstan_sync_runs_total{result=\"applied\"} 1",
        "capstan_sync_duration_seconds_count{result=\"applied\"} 1",
        "capstan_sync_last_applied_info{revision=\"2222222\",pull_request=\"12\",subject=\"Move gpu nodes to v2\"} 1",
        "# EOF",
    ] {
        assert!(
            body.lines().any(|l| l == line),
            "missing {line:?} in\n{body}"
        );
    }
    let (status, _, body) = send(&mut http, http::Request::get("/readyz"), "").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
}

#[tokio::test]
async fn the_server_stops_when_shutdown_resolves() {
    let server = start().await;
    // An idle keep-alive connection must not hold the server open.
    let mut http = connect(server.address).await;
    let (status, _, _) = send(&mut http, http::Request::get("/healthz"), "").await;
    assert_eq!(status, 200);
    server.stop.send(()).expect("server still running");
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("the server stops in time")
        .expect("the server task ends cleanly");
}
