//! What the tests of every crate share: condition waits with generous deadlines, real Git
//! repositories built commit by commit ([`git`]), the manifests of a test fleet
//! ([`manifests`]), a real Prometheus scraping a test's exporter ([`prometheus`]) and a
//! loopback stand-in of GitHub's REST API recording what capstan tells GitHub ([`github`]).
//!
//! Starting and reaching an embedded cluster is the cluster's own test API,
//! `capstan_cluster::testing`. This crate does not depend on the cluster, so the unit tests
//! of capstan's sync and controllers use it without linking the stand-in.

pub mod git;
pub mod github;
pub mod manifests;
pub mod prometheus;

use std::fmt::Debug;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

/// How long a condition may take on a loaded machine before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The first pause of a wait before it checks its condition again: a condition about to
/// hold is seen at once.
const POLL_FIRST: Duration = Duration::from_millis(25);
/// The longest pause between two checks. Each check is a request to the API server, which
/// on a real one costs a TLS round trip and a list encoded and decoded: polling a
/// condition that takes seconds every 25 ms would spend the machine's CPU on the test
/// instead of the controllers under test.
const POLL_MAX: Duration = Duration::from_millis(200);

/// Polls `check` until it returns true; fails the test after [`DEADLINE`], naming `what`.
pub async fn wait_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let held = poll(async || if check().await { Ok(()) } else { Err(()) }).await;
    assert!(held.is_ok(), "timed out waiting for {what}");
}

/// Polls `check` until it returns `Ok`, then returns its value; fails the test after
/// [`DEADLINE`], naming `what` and showing the last `Err` (what was still missing).
pub async fn wait_for<T, E: Debug>(what: &str, check: impl AsyncFnMut() -> Result<T, E>) -> T {
    poll(check)
        .await
        .unwrap_or_else(|missing| panic!("timed out waiting for {what}: {missing:?}"))
}

/// Polls `check` until it returns `Ok`; its last `Err` once [`DEADLINE`] has passed. For a
/// test that reports a timeout in its own words instead of failing at once.
pub async fn poll<T, E>(mut check: impl AsyncFnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut pause = POLL_FIRST;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(missing) if tokio::time::Instant::now() >= deadline => return Err(missing),
            Err(_) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 3 / 2).min(POLL_MAX);
            }
        }
    }
}

/// Waits until pod `namespace/name` exists and satisfies `check` (named by `what` in a
/// failure), returning it.
pub async fn wait_for_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    wait_for(&format!("{name}: {what}"), async || {
        match pods.get_opt(name).await {
            Ok(Some(pod)) if check(&pod) => Ok(pod),
            Ok(Some(pod)) => Err(format!(
                "phase {:?}",
                pod.status.and_then(|status| status.phase)
            )),
            Ok(None) => Err("no such pod".to_string()),
            Err(err) => Err(err.to_string()),
        }
    })
    .await
}
