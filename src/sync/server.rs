//! The HTTP endpoints of the long-running `capstan sync` process (see `docs/metrics.md`):
//!
//! - `GET /metrics`: the [`Metrics`] in OpenMetrics text;
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /readyz`: 200 once the first sync attempt finished, 503 before; on a standby
//!   replica (`--leader-elect`) 200 while it waits for the Lease, ready to take over;
//! - `POST /hooks/github`: a signed GitHub webhook; a push makes the sync loop fetch at once
//!   (a standby relays it to the leader through the GitSync object, see
//!   [`super::request`]).

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use http::{HeaderMap, StatusCode, Uri, header};
use serde::Deserialize;
use tokio::sync::{Notify, Semaphore};

use super::metrics::{self, Metrics};
use super::source::{WebhookError, verify_github_signature};

/// The largest webhook body accepted, 1 MiB. GitHub caps payloads at 25 MiB, but a push to a
/// branch is a few KiB (its commit list is capped at 20 commits); a body beyond this is refused
/// with 413 as soon as it is announced or read, never buffered whole.
pub const MAX_WEBHOOK_BYTES: usize = 1024 * 1024;

/// How the endpoints protect themselves from slow or many clients (`docs/sync.md`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A connection that has not sent a request's headers within this is closed.
    pub header_read_timeout: Duration,
    /// A webhook whose body has not arrived within this is refused (408).
    pub body_read_timeout: Duration,
    /// Open connections at most; further ones wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// The largest webhook body accepted (413 beyond).
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_body_bytes: MAX_WEBHOOK_BYTES,
        }
    }
}

/// How many recent `X-GitHub-Delivery` ids are remembered to ignore a replayed delivery.
pub const RECENT_DELIVERIES: usize = 1024;

/// Longer delivery ids (GitHub's are UUIDs) are not remembered.
const MAX_DELIVERY_ID: usize = 128;

/// What the endpoints share with the sync loop.
pub struct ServerState {
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
    /// Set once the first sync attempt finished (success or rejected commit) — readiness.
    pub ready: Arc<AtomicBool>,
    /// Shared secret for GitHub webhooks; None: the webhook endpoint answers 404 with a hint to
    /// set --webhook-secret-file. An empty (or blank) secret verifies nothing: every webhook
    /// is refused.
    pub webhook_secret: Option<Vec<u8>>,
    /// Notified when a valid webhook arrives: the sync loop fetches at once.
    pub trigger: Arc<Notify>,
    /// The branch the sync follows; a push to any other branch is ignored. None: every push
    /// triggers a fetch.
    pub branch: Option<String>,
    /// Present with leader election: whether this replica waits for the Lease, and how it
    /// reaches the leader meanwhile.
    pub standby: Option<Standby>,
}

/// A replica that may be a standby: a Service sends it probes and webhooks like the leader.
pub struct Standby {
    /// Set while the replica waits for the Lease; cleared for good once it leads.
    pub waiting: Arc<AtomicBool>,
    /// The cluster, to relay webhooks through the GitSync object.
    pub client: kube::Client,
    /// The GitSync the leader keeps (`--name`).
    pub sync_name: String,
}

impl ServerState {
    fn waiting_standby(&self) -> Option<&Standby> {
        self.standby
            .as_ref()
            .filter(|standby| standby.waiting.load(Ordering::Acquire))
    }
}

/// What the handlers share: the state, the limits and the recent deliveries.
struct Shared {
    state: ServerState,
    limits: Limits,
    recent: Mutex<RecentDeliveries>,
}

/// The last [`RECENT_DELIVERIES`] delivery ids, oldest first.
#[derive(Default)]
struct RecentDeliveries {
    order: VecDeque<String>,
    seen: HashSet<String>,
}

impl RecentDeliveries {
    /// Remembers `id`; false when it was seen already.
    fn insert(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() >= RECENT_DELIVERIES
            && let Some(oldest) = self.order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        self.order.push_back(id.to_string());
        self.seen.insert(id.to_string());
        true
    }

    /// Forgets `id`, so that GitHub's redelivery of a failed delivery is handled.
    fn forget(&mut self, id: &str) {
        if self.seen.remove(id) {
            self.order.retain(|seen| seen != id);
        }
    }
}

/// Which endpoints a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// `/metrics`, `/healthz`, `/readyz` and `/hooks/github`.
    All,
    /// `/hooks/github` only (with `--metrics-listen` on another address).
    Webhook,
    /// `/metrics`, `/healthz` and `/readyz` only.
    Metrics,
}

/// The routes above; any other path answers 404.
pub fn router(state: ServerState) -> Router {
    router_for(shared(state, Limits::default()), Routes::All)
}

fn shared(state: ServerState, limits: Limits) -> Arc<Shared> {
    Arc::new(Shared {
        state,
        limits,
        recent: Mutex::new(RecentDeliveries::default()),
    })
}

fn router_for(shared: Arc<Shared>, routes: Routes) -> Router {
    let mut router = Router::new();
    if routes != Routes::Webhook {
        router = router
            .route("/metrics", get(serve_metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz));
    }
    if routes != Routes::Metrics {
        router = router.route("/hooks/github", post(github_webhook));
    }
    router.fallback(not_found).with_state(shared)
}

/// Binds `listen` and serves [`router`] on it until `shutdown` resolves.
///
/// Returns the bound address (useful with port 0) and the serving task, which ends once
/// `shutdown` resolved and open requests finished. Fails when the address cannot be bound.
pub async fn serve(
    listen: SocketAddr,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    serve_on(listener, state, shutdown)
}

/// [`serve`] on a listener bound already (so that a port in use is found before anything
/// else starts).
pub fn serve_on(
    listener: tokio::net::TcpListener,
    state: ServerState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with(listener, None, state, Limits::default(), shutdown)
        .map(|(address, _, task)| (address, task))
}

/// [`serve_on`] with explicit [`Limits`], and optionally `/metrics` and the probes on a
/// listener of their own (`--metrics-listen`; the first listener then serves the webhook
/// only). Returns both addresses (the second is the first without a metrics listener) and
/// the task serving both, which ends once `shutdown` resolved and open requests finished.
pub fn serve_with(
    listener: tokio::net::TcpListener,
    metrics_listener: Option<tokio::net::TcpListener>,
    state: ServerState,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, SocketAddr, tokio::task::JoinHandle<()>)> {
    let address = listener.local_addr()?;
    let metrics_address = match &metrics_listener {
        Some(metrics_listener) => metrics_listener.local_addr()?,
        None => address,
    };
    let shared = shared(state, limits);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let main = match metrics_listener {
            Some(_) => Routes::Webhook,
            None => Routes::All,
        };
        let webhook = accept_loop(
            listener,
            router_for(shared.clone(), main),
            limits,
            stopped.clone(),
        );
        let metrics = async {
            if let Some(metrics_listener) = metrics_listener {
                accept_loop(
                    metrics_listener,
                    router_for(shared.clone(), Routes::Metrics),
                    limits,
                    stopped.clone(),
                )
                .await;
            }
        };
        let signal = async move {
            shutdown.await;
            let _ = stop.send(true);
        };
        tokio::join!(webhook, metrics, signal);
    });
    if metrics_address == address {
        tracing::info!(%address, "serving /metrics, /healthz, /readyz and /hooks/github");
    } else {
        tracing::info!(%address, %metrics_address, "serving /hooks/github, and /metrics, /healthz, /readyz on the metrics address");
    }
    Ok((address, metrics_address, task))
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Accepts connections on `listener` until `stop` turns true, at most
/// `limits.max_connections` at a time, each with a header read timeout; then closes idle
/// connections and waits for open requests to finish.
async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        // A connection slot first: beyond the cap, clients wait in the kernel's backlog
        // rather than holding memory here.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = stopped(&mut stop) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors, typically: wait rather than spin.
                    tracing::warn!(%err, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stopped(&mut stop) => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut stop = stop.clone();
        connections.spawn(async move {
            let _permit = permit;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                result = connection.as_mut() => result,
                _ = stopped(&mut stop) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(err) = result {
                tracing::debug!(%peer, %err, "connection closed");
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

async fn serve_metrics(State(shared): State<Arc<Shared>>) -> Response {
    let state = &shared.state;
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        state.metrics.encode(),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(shared): State<Arc<Shared>>) -> (StatusCode, &'static str) {
    let state = &shared.state;
    // A standby is ready: it serves webhooks and takes over when the Lease frees. Were it
    // not, a Deployment's rolling update would wait forever for its new standbys.
    if state.waiting_standby().is_some() {
        return (StatusCode::OK, "ok: standby, waiting for the Lease");
    }
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the first sync has not finished",
        )
    }
}

async fn not_found(uri: Uri) -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        format!(
            "not found: {}; capstan sync serves /metrics, /healthz, /readyz and POST /hooks/github",
            uri.path()
        ),
    )
}

async fn github_webhook(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let state = &shared.state;
    let delivery = header_text(headers, "x-github-delivery").unwrap_or("-");
    let Some(secret) = &state.webhook_secret else {
        tracing::warn!(
            delivery,
            "a GitHub webhook arrived but no secret is configured"
        );
        return (
            StatusCode::NOT_FOUND,
            "webhooks are off: start capstan sync with --webhook-secret-file to accept GitHub webhooks",
        )
            .into_response();
    };
    if secret.trim_ascii().is_empty() {
        tracing::warn!(
            delivery,
            "refused a GitHub webhook: the webhook secret is empty"
        );
        return (
            StatusCode::UNAUTHORIZED,
            "capstan's webhook secret is empty: every webhook is refused",
        )
            .into_response();
    }
    // Everything that can be refused without the body is refused before reading any of it.
    let signature = header_text(headers, "x-hub-signature-256");
    if let Err(err @ (WebhookError::MissingSignature | WebhookError::MalformedSignature(_))) =
        verify_github_signature(secret, b"", signature)
    {
        tracing::warn!(delivery, %err, "refused a GitHub webhook");
        return (StatusCode::UNAUTHORIZED, err.to_string()).into_response();
    }
    let Some(event) = header_text(headers, "x-github-event") else {
        tracing::warn!(delivery, "a GitHub webhook without X-GitHub-Event");
        return (StatusCode::BAD_REQUEST, "missing X-GitHub-Event header").into_response();
    };
    let limits = shared.limits;
    let too_large = || {
        tracing::warn!(
            delivery,
            limit = limits.max_body_bytes,
            "refused a GitHub webhook: body too large"
        );
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the webhook body is over {} bytes; subscribe the hook to push events only",
                limits.max_body_bytes
            ),
        )
            .into_response()
    };
    let announced =
        header_text(headers, "content-length").and_then(|length| length.parse::<u64>().ok());
    if announced.is_some_and(|length| length > limits.max_body_bytes as u64) {
        return too_large();
    }
    let body = match tokio::time::timeout(
        limits.body_read_timeout,
        read_limited(body, limits.max_body_bytes),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => return too_large(),
        Ok(Err(BodyError::Failed(err))) => {
            tracing::warn!(delivery, err, "reading a GitHub webhook's body");
            return (StatusCode::BAD_REQUEST, format!("reading the body: {err}")).into_response();
        }
        Err(_) => {
            tracing::warn!(delivery, "a GitHub webhook's body did not arrive in time");
            return (
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the body did not arrive within {:?}",
                    limits.body_read_timeout
                ),
            )
                .into_response();
        }
    };
    if let Err(err) = verify_github_signature(secret, &body, signature) {
        tracing::warn!(delivery, %err, "refused a GitHub webhook");
        return (StatusCode::UNAUTHORIZED, err.to_string()).into_response();
    }
    // A replayed delivery (GitHub's id is unique per delivery) triggers nothing.
    let remembered = (delivery != "-" && delivery.len() <= MAX_DELIVERY_ID).then_some(delivery);
    if let Some(id) = remembered
        && !shared.recent.lock().expect("not poisoned").insert(id)
    {
        tracing::info!(delivery, "duplicate GitHub delivery ignored");
        return (
            StatusCode::OK,
            format!("duplicate: delivery {id} was handled already"),
        )
            .into_response();
    }
    let response = handle_delivery(state, delivery, event, headers, &body).await;
    if let Some(id) = remembered
        && response.status().is_server_error()
    {
        // GitHub redelivers with the same id: let the redelivery through.
        shared.recent.lock().expect("not poisoned").forget(id);
    }
    response
}

enum BodyError {
    TooLarge,
    Failed(String),
}

/// Reads `body` chunk by chunk, giving up as soon as it grows beyond `limit`.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, BodyError> {
    let mut stream = body.into_data_stream();
    let mut buffer = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|err| BodyError::Failed(err.to_string()))?;
        if buffer.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(buffer.freeze())
}

/// What a verified delivery of `event` does.
async fn handle_delivery(
    state: &ServerState,
    delivery: &str,
    event: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let content_type = header_text(headers, "content-type").unwrap_or("application/json");
    match read_delivery(event, content_type, body, state.branch.as_deref()) {
        Ok(Delivery::Ping) => {
            tracing::info!(delivery, "GitHub webhook ping");
            (StatusCode::OK, "pong").into_response()
        }
        Ok(Delivery::Push { git_ref }) => {
            let git_ref = git_ref.as_deref().unwrap_or("-");
            if let Some(standby) = state.waiting_standby() {
                return relay(standby, delivery, git_ref).await;
            }
            tracing::info!(delivery, git_ref, "GitHub push: fetching now");
            state.trigger.notify_one();
            (StatusCode::ACCEPTED, "sync triggered").into_response()
        }
        Ok(Delivery::OtherBranch { git_ref, followed }) => {
            tracing::info!(
                delivery,
                git_ref,
                followed,
                "GitHub push to another branch ignored"
            );
            (
                StatusCode::ACCEPTED,
                format!("ignored: push to {git_ref}, capstan follows {followed}"),
            )
                .into_response()
        }
        Ok(Delivery::OtherEvent) => {
            tracing::info!(delivery, event, "GitHub webhook event ignored");
            (StatusCode::ACCEPTED, format!("ignored: {event}")).into_response()
        }
        Err(problem) => {
            tracing::warn!(delivery, event, problem, "unreadable GitHub webhook");
            (StatusCode::BAD_REQUEST, problem).into_response()
        }
    }
}

/// A standby hands a push to the leader through the cluster; when the cluster cannot be
/// written GitHub is told to deliver again (503), the interval fetch catches up otherwise.
async fn relay(standby: &Standby, delivery: &str, git_ref: &str) -> Response {
    let value = match delivery {
        "-" => jiff::Timestamp::now().to_string(),
        delivery => delivery.to_string(),
    };
    match super::request::request(&standby.client, &standby.sync_name, &value).await {
        Ok(super::request::Relayed::Written) => {
            tracing::info!(delivery, git_ref, "GitHub push relayed to the leader");
            (StatusCode::ACCEPTED, "sync requested from the leader").into_response()
        }
        Ok(super::request::Relayed::NoSyncYet) => (
            StatusCode::ACCEPTED,
            "no sync has run yet: the leader's first sync fetches the branch",
        )
            .into_response(),
        Err(err) => {
            tracing::warn!(delivery, %err, "relaying a GitHub push to the leader");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("this replica is a standby and could not reach the leader: {err}"),
            )
                .into_response()
        }
    }
}

/// A header's value; a value that is not visible ASCII reads as empty, so a garbled signature
/// is reported as malformed rather than missing.
fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|value| value.to_str().unwrap_or(""))
}

/// What a correctly signed webhook asks for.
#[derive(Debug, PartialEq, Eq)]
enum Delivery {
    /// GitHub checking the hook after it was set up.
    Ping,
    /// A push that concerns the followed branch (any push when no branch is set); the ref is
    /// unknown only when no branch is set and the body holds none.
    Push { git_ref: Option<String> },
    /// A push to a branch or tag the sync does not follow.
    OtherBranch { git_ref: String, followed: String },
    /// Any other event; the hook should subscribe to pushes only, but may send more.
    OtherEvent,
}

#[derive(Deserialize)]
struct PushEvent {
    #[serde(rename = "ref")]
    git_ref: String,
}

/// Decides what a signed delivery of `event` asks for. Only a push with a followed `branch`
/// needs the body; it fails when that body holds no `ref`.
fn read_delivery(
    event: &str,
    content_type: &str,
    body: &[u8],
    branch: Option<&str>,
) -> Result<Delivery, String> {
    match event {
        "ping" => return Ok(Delivery::Ping),
        "push" => {}
        _ => return Ok(Delivery::OtherEvent),
    }
    let Some(branch) = branch else {
        return Ok(Delivery::Push {
            git_ref: push_ref(content_type, body).ok(),
        });
    };
    let git_ref = push_ref(content_type, body)?;
    let followed = format!("refs/heads/{branch}");
    if git_ref == followed {
        Ok(Delivery::Push {
            git_ref: Some(git_ref),
        })
    } else {
        Ok(Delivery::OtherBranch { git_ref, followed })
    }
}

/// The `ref` of a push payload, sent as JSON or, with GitHub's form content type, as JSON in
/// the `payload` field.
fn push_ref(content_type: &str, body: &[u8]) -> Result<String, String> {
    let form = content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim() == "application/x-www-form-urlencoded");
    let parsed = if form {
        let payload = form_urlencoded::parse(body)
            .find(|(key, _)| key == "payload")
            .map(|(_, value)| value.into_owned())
            .ok_or("push payload: the form has no payload field")?;
        serde_json::from_str::<PushEvent>(&payload)
    } else {
        serde_json::from_slice::<PushEvent>(body)
    };
    parsed
        .map(|push| push.git_ref)
        .map_err(|err| format!("push payload: {err}; expected JSON with a \"ref\" field"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::source::WebhookError;
    use axum::body::Body;
    use futures::FutureExt as _;
    use http::Request;
    use http_body_util::BodyExt as _;
    use ring::hmac;
    use tower::ServiceExt as _;

    const SECRET: &[u8] = b"fleet webhook secret";
    const JSON: &str = "application/json";
    const PUSH_TO_MAIN: &str = r#"{"ref":"refs/heads/main","after":"2222222"}"#;

    struct Fixture {
        app: Router,
        ready: Arc<AtomicBool>,
        trigger: Arc<Notify>,
        metrics: Arc<Metrics>,
    }

    fn fixture(secret: Option<&[u8]>, branch: Option<&str>) -> Fixture {
        let metrics = Arc::new(Metrics::new());
        let ready = Arc::new(AtomicBool::new(false));
        let trigger = Arc::new(Notify::new());
        let app = router(ServerState {
            metrics: metrics.clone(),
            ready: ready.clone(),
            webhook_secret: secret.map(<[u8]>::to_vec),
            trigger: trigger.clone(),
            branch: branch.map(str::to_string),
            standby: None,
        });
        Fixture {
            app,
            ready,
            trigger,
            metrics,
        }
    }

    impl Fixture {
        async fn call(&self, request: Request<Body>) -> (StatusCode, HeaderMap, String) {
            let response = self.app.clone().oneshot(request).await.expect("infallible");
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (status, headers, String::from_utf8_lossy(&body).into_owned())
        }

        async fn get(&self, path: &str) -> (StatusCode, String) {
            let request = Request::get(path).body(Body::empty()).expect("request");
            let (status, _, body) = self.call(request).await;
            (status, body)
        }

        /// Delivers a webhook and tells what came back and whether a sync was triggered.
        async fn deliver(&self, request: Request<Body>) -> Delivered {
            let (status, _, body) = self.call(request).await;
            // Notify keeps the permit of a notify_one without waiters, so polling once tells.
            let triggered = self.trigger.notified().now_or_never().is_some();
            Delivered {
                status,
                body,
                triggered,
            }
        }
    }

    #[derive(Debug, PartialEq, Eq)]
    struct Delivered {
        status: StatusCode,
        body: String,
        triggered: bool,
    }

    fn answer(status: StatusCode, body: &str, triggered: bool) -> Delivered {
        Delivered {
            status,
            body: body.to_string(),
            triggered,
        }
    }

    fn refused(err: WebhookError) -> Delivered {
        answer(StatusCode::UNAUTHORIZED, &err.to_string(), false)
    }

    fn sign(secret: &[u8], body: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = hmac::sign(&key, body);
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256={hex}")
    }

    fn webhook(
        event: Option<&str>,
        content_type: &str,
        body: &str,
        signature: Option<&str>,
    ) -> Request<Body> {
        let mut request = Request::post("/hooks/github")
            .header("content-type", content_type)
            .header("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        if let Some(event) = event {
            request = request.header("x-github-event", event);
        }
        if let Some(signature) = signature {
            request = request.header("x-hub-signature-256", signature);
        }
        request.body(Body::from(body.to_string())).expect("request")
    }

    fn signed(event: &str, body: &str) -> Request<Body> {
        webhook(
            Some(event),
            JSON,
            body,
            Some(&sign(SECRET, body.as_bytes())),
        )
    }

    #[tokio::test]
    async fn healthz_answers_ok() {
        let server = fixture(None, None);
        assert_eq!(
            server.get("/healthz").await,
            (StatusCode::OK, "ok".to_string())
        );
    }

    #[tokio::test]
    async fn readyz_waits_for_the_first_sync() {
        let server = fixture(None, None);
        assert_eq!(
            server.get("/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the first sync has not finished".to_string()
            )
        );
        server.ready.store(true, Ordering::Release);
        assert_eq!(
            server.get("/readyz").await,
            (StatusCode::OK, "ok".to_string())
        );
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let server = fixture(None, None);
        server
            .metrics
            .set_applied_commit("2222222", Some(12), "Move gpu nodes to v2");
        let request = Request::get("/metrics")
            .body(Body::empty())
            .expect("request");
        let (status, headers, body) = server.call(request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            headers[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        assert_eq!(body, server.metrics.encode());
        assert!(
            body.lines().any(|line| line
                == "capstan_sync_last_applied_info{revision=\"2222222\",pull_request=\"12\",subject=\"Move gpu nodes to v2\"} 1"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn unknown_paths_are_not_found() {
        let server = fixture(Some(SECRET), None);
        let (status, body) = server.get("/hooks/gitlab").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.starts_with("not found: /hooks/gitlab;"), "{body}");
    }

    #[tokio::test]
    async fn a_signed_push_triggers_a_sync() {
        let server = fixture(Some(SECRET), None);
        assert_eq!(
            server.deliver(signed("push", PUSH_TO_MAIN)).await,
            answer(StatusCode::ACCEPTED, "sync triggered", true)
        );
    }

    #[tokio::test]
    async fn a_bad_signature_is_refused() {
        let server = fixture(Some(SECRET), None);
        let forged = sign(b"another secret", PUSH_TO_MAIN.as_bytes());
        let request = webhook(Some("push"), JSON, PUSH_TO_MAIN, Some(&forged));
        assert_eq!(
            server.deliver(request).await,
            refused(WebhookError::SignatureMismatch)
        );
    }

    #[tokio::test]
    async fn a_malformed_signature_is_refused() {
        let server = fixture(Some(SECRET), None);
        let request = webhook(Some("push"), JSON, PUSH_TO_MAIN, Some("sha1=0123"));
        assert_eq!(
            server.deliver(request).await,
            refused(WebhookError::MalformedSignature("expected sha256=<hex>"))
        );
    }

    #[tokio::test]
    async fn a_missing_signature_is_refused() {
        let server = fixture(Some(SECRET), None);
        let request = webhook(Some("push"), JSON, PUSH_TO_MAIN, None);
        assert_eq!(
            server.deliver(request).await,
            refused(WebhookError::MissingSignature)
        );
    }

    #[tokio::test]
    async fn a_ping_is_answered_with_pong() {
        let server = fixture(Some(SECRET), Some("main"));
        let ping = signed("ping", r#"{"zen":"Keep it logically awesome."}"#);
        assert_eq!(
            server.deliver(ping).await,
            answer(StatusCode::OK, "pong", false)
        );
    }

    #[tokio::test]
    async fn other_events_are_ignored() {
        let server = fixture(Some(SECRET), Some("main"));
        let opened = signed("pull_request", r#"{"action":"opened"}"#);
        assert_eq!(
            server.deliver(opened).await,
            answer(StatusCode::ACCEPTED, "ignored: pull_request", false)
        );
    }

    #[tokio::test]
    async fn without_a_secret_the_webhook_endpoint_is_not_found() {
        let server = fixture(None, None);
        assert_eq!(
            server.deliver(signed("push", PUSH_TO_MAIN)).await,
            answer(
                StatusCode::NOT_FOUND,
                "webhooks are off: start capstan sync with --webhook-secret-file to accept GitHub webhooks",
                false
            )
        );
    }

    #[tokio::test]
    async fn a_push_to_the_followed_branch_triggers_a_sync() {
        let server = fixture(Some(SECRET), Some("main"));
        assert_eq!(
            server.deliver(signed("push", PUSH_TO_MAIN)).await,
            answer(StatusCode::ACCEPTED, "sync triggered", true)
        );
    }

    #[tokio::test]
    async fn a_push_to_another_branch_is_ignored() {
        let server = fixture(Some(SECRET), Some("main"));
        let push = signed("push", r#"{"ref":"refs/heads/feature","after":"3333333"}"#);
        assert_eq!(
            server.deliver(push).await,
            answer(
                StatusCode::ACCEPTED,
                "ignored: push to refs/heads/feature, capstan follows refs/heads/main",
                false
            )
        );
    }

    #[tokio::test]
    async fn a_form_encoded_push_is_understood() {
        let server = fixture(Some(SECRET), Some("main"));
        let body: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", PUSH_TO_MAIN)
            .finish();
        let signature = sign(SECRET, body.as_bytes());
        let request = webhook(
            Some("push"),
            "application/x-www-form-urlencoded",
            &body,
            Some(&signature),
        );
        assert_eq!(
            server.deliver(request).await,
            answer(StatusCode::ACCEPTED, "sync triggered", true)
        );
    }

    #[tokio::test]
    async fn a_push_without_a_ref_is_a_bad_request() {
        let server = fixture(Some(SECRET), Some("main"));
        let delivered = server.deliver(signed("push", r#"{"after":"1"}"#)).await;
        assert_eq!(delivered.status, StatusCode::BAD_REQUEST);
        assert!(
            delivered.body.contains("missing field `ref`"),
            "{delivered:?}"
        );
        assert!(!delivered.triggered);
    }

    #[tokio::test]
    async fn a_signed_webhook_without_an_event_is_a_bad_request() {
        let server = fixture(Some(SECRET), None);
        let signature = sign(SECRET, PUSH_TO_MAIN.as_bytes());
        let request = webhook(None, JSON, PUSH_TO_MAIN, Some(&signature));
        assert_eq!(
            server.deliver(request).await,
            answer(
                StatusCode::BAD_REQUEST,
                "missing X-GitHub-Event header",
                false
            )
        );
    }

    #[tokio::test]
    async fn a_body_over_githubs_limit_is_refused() {
        let server = fixture(Some(SECRET), None);
        let body = vec![b' '; MAX_WEBHOOK_BYTES + 1];
        let request = Request::post("/hooks/github")
            .header("x-github-event", "push")
            .header("x-hub-signature-256", sign(SECRET, &body))
            .body(Body::from(body))
            .expect("request");
        let delivered = server.deliver(request).await;
        assert_eq!(delivered.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!delivered.triggered);
    }

    #[tokio::test]
    async fn an_empty_secret_refuses_even_a_push_signed_with_it() {
        for secret in [&b""[..], b"  \n"] {
            let server = fixture(Some(secret), None);
            let request = webhook(
                Some("push"),
                JSON,
                PUSH_TO_MAIN,
                Some(&sign(secret, PUSH_TO_MAIN.as_bytes())),
            );
            assert_eq!(
                server.deliver(request).await,
                answer(
                    StatusCode::UNAUTHORIZED,
                    "capstan's webhook secret is empty: every webhook is refused",
                    false
                )
            );
        }
    }

    #[tokio::test]
    async fn an_unsigned_webhook_is_refused_before_its_body_is_read() {
        let server = fixture(Some(SECRET), None);
        // A body that fails when read: the refusal must come without reading it.
        let body = Body::from_stream(futures::stream::once(async {
            Err::<Bytes, _>(std::io::Error::other("the body was read"))
        }));
        let request = Request::post("/hooks/github")
            .header("x-github-event", "push")
            .body(body)
            .expect("request");
        assert_eq!(
            server.deliver(request).await,
            refused(WebhookError::MissingSignature)
        );
    }

    #[tokio::test]
    async fn a_replayed_delivery_is_answered_but_ignored() {
        let server = fixture(Some(SECRET), None);
        assert_eq!(
            server.deliver(signed("push", PUSH_TO_MAIN)).await,
            answer(StatusCode::ACCEPTED, "sync triggered", true)
        );
        assert_eq!(
            server.deliver(signed("push", PUSH_TO_MAIN)).await,
            answer(
                StatusCode::OK,
                "duplicate: delivery 72d3162e-cc78-11e3-81ab-4c9367dc0958 was handled already",
                false
            )
        );
    }

    #[test]
    fn recent_deliveries_forget_the_oldest() {
        let mut recent = RecentDeliveries::default();
        for id in 0..RECENT_DELIVERIES {
            assert!(recent.insert(&id.to_string()));
        }
        assert!(!recent.insert("0"));
        assert!(recent.insert("new"));
        assert!(recent.insert("0"), "the oldest id was forgotten");
        assert_eq!(recent.order.len(), RECENT_DELIVERIES);
        assert_eq!(recent.seen.len(), RECENT_DELIVERIES);
        recent.forget("new");
        assert!(recent.insert("new"));
    }

    #[test]
    fn deliveries_are_read_by_event_and_branch() {
        let push = PUSH_TO_MAIN.as_bytes();
        let cases: [(&str, Option<&str>, Delivery); 5] = [
            ("ping", Some("main"), Delivery::Ping),
            (
                "push",
                None,
                Delivery::Push {
                    git_ref: Some("refs/heads/main".into()),
                },
            ),
            (
                "push",
                Some("main"),
                Delivery::Push {
                    git_ref: Some("refs/heads/main".into()),
                },
            ),
            (
                "push",
                Some("release"),
                Delivery::OtherBranch {
                    git_ref: "refs/heads/main".into(),
                    followed: "refs/heads/release".into(),
                },
            ),
            ("check_run", Some("main"), Delivery::OtherEvent),
        ];
        for (event, branch, expected) in cases {
            assert_eq!(
                read_delivery(event, "application/json", push, branch),
                Ok(expected),
                "{event} with branch {branch:?}"
            );
        }
        assert_eq!(
            read_delivery("push", "application/json", b"not json", None),
            Ok(Delivery::Push { git_ref: None }),
            "without a followed branch any push triggers"
        );
    }
}
