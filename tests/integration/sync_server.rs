//! The sync process's HTTP server over real HTTP on loopback: a signed GitHub push makes the
//! sync loop fetch, a forged one does not, metrics are scraped, and shutdown stops serving;
//! and the server is cheap to refuse: unsigned or oversized bodies are refused before they are
//! read, slow clients time out, connections are capped, replayed deliveries are ignored.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use capstan::sync::metrics::Metrics;
use capstan::sync::server::{Limits, ServerState, serve, serve_with};
use futures::FutureExt as _;
use http_body_util::BodyExt as _;
use ring::hmac;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
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

fn state(secret: &[u8]) -> (ServerState, Arc<Notify>, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let trigger = Arc::new(Notify::new());
    let state = ServerState {
        metrics: metrics.clone(),
        ready: Arc::new(AtomicBool::new(true)),
        webhook_secret: Some(secret.to_vec()),
        trigger: trigger.clone(),
        branch: Some("main".into()),
        standby: None,
    };
    (state, trigger, metrics)
}

async fn start() -> Running {
    let (state, trigger, metrics) = state(SECRET);
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

/// A server with the given limits and webhook secret; with `split`, metrics on their own
/// address (returned second).
async fn start_with(limits: Limits, secret: &[u8], split: bool) -> (Running, SocketAddr) {
    let (state, trigger, metrics) = state(secret);
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let listener = bind().await.expect("bind");
    let metrics_listener = if split {
        Some(bind().await.expect("bind"))
    } else {
        None
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let (address, metrics_address, task) =
        serve_with(listener, metrics_listener, state, limits, async {
            let _ = stopped.await;
        })
        .expect("serve");
    let running = Running {
        address,
        trigger,
        metrics,
        task,
        stop,
    };
    (running, metrics_address)
}

/// Writes `request` on a raw connection and reads until the server answers and closes, or
/// `DEADLINE`; returns what was read and how long it took.
async fn raw(address: SocketAddr, request: &[u8]) -> (String, Duration) {
    let mut tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let started = tokio::time::Instant::now();
    tcp.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    let mut buffer = [0; 4096];
    loop {
        match tokio::time::timeout(DEADLINE, tcp.read(&mut buffer)).await {
            Err(_) => panic!(
                "no answer in time; read so far: {:?}",
                String::from_utf8_lossy(&answer)
            ),
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(read)) => answer.extend_from_slice(&buffer[..read]),
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
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

fn quick() -> Limits {
    Limits {
        header_read_timeout: Duration::from_millis(300),
        body_read_timeout: Duration::from_millis(300),
        max_connections: 64,
        max_body_bytes: 1024,
    }
}

#[tokio::test]
async fn an_empty_secret_verifies_nothing() {
    let (server, _) = start_with(quick(), b"", false).await;
    let mut http = connect(server.address).await;
    let (status, _, body) = send(
        &mut http,
        push_webhook(&sign(b"", PUSH_TO_MAIN)),
        PUSH_TO_MAIN,
    )
    .await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("secret is empty"), "{body}");
    assert!(server.trigger.notified().now_or_never().is_none());
}

#[tokio::test]
async fn an_unsigned_huge_body_is_refused_without_reading_it() {
    let (server, _) = start_with(Limits::default(), SECRET, false).await;
    // 100 MB announced, a few bytes sent: the answer must not wait for the rest.
    let (answer, took) = raw(
        server.address,
        b"POST /hooks/github HTTP/1.1\r\nhost: capstan\r\nx-github-event: push\r\n\
          content-length: 104857600\r\n\r\n{\"ref\"",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("missing X-Hub-Signature-256"), "{answer}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn a_signed_huge_body_is_refused_as_announced() {
    let (server, _) = start_with(Limits::default(), SECRET, false).await;
    let request = format!(
        "POST /hooks/github HTTP/1.1\r\nhost: capstan\r\nx-github-event: push\r\n\
         x-hub-signature-256: {}\r\ncontent-length: 104857600\r\n\r\n{{\"ref\"",
        sign(SECRET, PUSH_TO_MAIN)
    );
    let (answer, took) = raw(server.address, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[tokio::test]
async fn a_chunked_body_is_cut_at_the_limit() {
    let (server, _) = start_with(quick(), SECRET, false).await;
    let chunk = "x".repeat(800);
    let request = format!(
        "POST /hooks/github HTTP/1.1\r\nhost: capstan\r\nx-github-event: push\r\n\
         x-hub-signature-256: {}\r\ntransfer-encoding: chunked\r\n\r\n\
         320\r\n{chunk}\r\n320\r\n{chunk}\r\n",
        sign(SECRET, PUSH_TO_MAIN)
    );
    // The terminating chunk never comes: the server stops at the limit, not at the end.
    let (answer, _) = raw(server.address, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(server.trigger.notified().now_or_never().is_none());
}

#[tokio::test]
async fn a_slow_body_times_out() {
    let (server, _) = start_with(quick(), SECRET, false).await;
    let request = format!(
        "POST /hooks/github HTTP/1.1\r\nhost: capstan\r\nx-github-event: push\r\n\
         x-hub-signature-256: {}\r\ncontent-length: 100\r\n\r\n{{\"ref\"",
        sign(SECRET, PUSH_TO_MAIN)
    );
    let (answer, took) = raw(server.address, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took >= Duration::from_millis(250), "{took:?}");
}

#[tokio::test]
async fn slow_headers_close_the_connection() {
    let (server, _) = start_with(quick(), SECRET, false).await;
    let (answer, took) = raw(server.address, b"POST /hooks/github HTTP/1.1\r\nhost: cap").await;
    // hyper closes the connection (answering 408 or nothing) once the header timeout passed.
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn connections_are_capped() {
    let limits = Limits {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 2,
        ..quick()
    };
    let (server, _) = start_with(limits, SECRET, false).await;
    let mut first = connect(server.address).await;
    let (status, _, _) = send(&mut first, http::Request::get("/healthz"), "").await;
    assert_eq!(status, 200);
    let mut second = connect(server.address).await;
    let (status, _, _) = send(&mut second, http::Request::get("/healthz"), "").await;
    assert_eq!(status, 200);
    // The third waits in the backlog while both are open...
    let mut third = connect(server.address).await;
    let request = http::Request::get("/healthz")
        .header("host", "capstan")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let mut answer = Box::pin(third.send_request(request));
    assert!(
        tokio::time::timeout(Duration::from_millis(500), answer.as_mut())
            .await
            .is_err(),
        "a third connection was served"
    );
    // ...and is served once one closes.
    drop(first);
    let response = tokio::time::timeout(DEADLINE, answer)
        .await
        .expect("served once a slot frees")
        .expect("response");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_replayed_delivery_triggers_nothing() {
    let (server, _) = start_with(quick(), SECRET, false).await;
    let mut http = connect(server.address).await;
    let signature = sign(SECRET, PUSH_TO_MAIN);
    let (status, _, body) = send(&mut http, push_webhook(&signature), PUSH_TO_MAIN).await;
    assert_eq!((status, body.as_str()), (202, "sync triggered"));
    tokio::time::timeout(DEADLINE, server.trigger.notified())
        .await
        .expect("the sync loop is woken");
    let (status, _, body) = send(&mut http, push_webhook(&signature), PUSH_TO_MAIN).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("duplicate"), "{body}");
    assert!(server.trigger.notified().now_or_never().is_none());
}

#[tokio::test]
async fn metrics_can_be_served_on_their_own_address() {
    let (server, metrics_address) = start_with(quick(), SECRET, true).await;
    assert_ne!(metrics_address, server.address);
    let mut metrics = connect(metrics_address).await;
    let (status, _, body) = send(&mut metrics, http::Request::get("/metrics"), "").await;
    assert_eq!(status, 200);
    assert!(body.ends_with("# EOF\n"), "{body}");
    let (status, _, _) = send(&mut metrics, http::Request::get("/readyz"), "").await;
    assert_eq!(status, 200);
    let mut webhook = connect(server.address).await;
    let (status, _, _) = send(&mut webhook, http::Request::get("/metrics"), "").await;
    assert_eq!(status, 404);
    let (status, _, body) = send(
        &mut webhook,
        push_webhook(&sign(SECRET, PUSH_TO_MAIN)),
        PUSH_TO_MAIN,
    )
    .await;
    assert_eq!((status, body.as_str()), (202, "sync triggered"));
    server.stop.send(()).expect("server still running");
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("both listeners stop in time")
        .expect("the server task ends cleanly");
}

#[tokio::test]
async fn an_idle_connection_is_closed() {
    let (server, _) = start_with(quick(), SECRET, false).await;
    // Nothing sent at all: the connection must not hold one of the slots forever.
    let (answer, took) = raw(server.address, b"").await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}
