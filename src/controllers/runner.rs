//! The one way a capstan controller runs, in the style of kubert's runtime: every
//! controller builds its kube runtime [`Controller`] (what triggers it, from
//! [`Caches`](super::caches::Caches)) and hands it to a [`Runner`] with its reconcile
//! function, and the runner does the rest the same way for all of them:
//!
//! - **Cache readiness**: nothing is reconciled before every cache the controller reads
//!   holds its first listing ([`Runner::reads`]): a decision on a half-filled store would
//!   take a listed object for a deleted one.
//! - **Per-object backoff**: a failed reconcile is retried after [`retry_delay`] of the
//!   failures of that object in a row (500 ms, doubled, at most 5 minutes); a success
//!   forgets them. Other objects are not slowed.
//! - **Shutdown**: on the context's shutdown token, no new reconcile starts and those in
//!   flight finish.
//! - **Logging**: `controller started` and `controller stopped` once, and each failure as
//!   one line with the controller, the object (`namespace/name`, or `name` for a
//!   cluster-scoped one), the error and the wait before the retry.

use std::fmt::{Debug, Display};
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::Resource;
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::Context;
use super::retries::Retries;
#[cfg(doc)]
use super::retries::retry_delay;

/// Runs one controller: see the module's documentation.
pub struct Runner {
    name: &'static str,
    ctx: Arc<Context>,
    ready: Vec<watch::Receiver<bool>>,
}

/// What a reconcile is handed beside its object: the controller's own state, and the
/// runner's count of failures.
struct Running<S, F> {
    name: &'static str,
    state: Arc<S>,
    reconcile: F,
    retries: Retries,
}

impl Runner {
    /// A runner of the controller `name` (as `--controllers` and the logs name it; a part
    /// of one controller is `controller/part`), stopped by `ctx`'s shutdown.
    pub fn new(name: &'static str, ctx: &Arc<Context>) -> Runner {
        Runner {
            name,
            ctx: ctx.clone(),
            ready: Vec::new(),
        }
    }

    /// The controller reads a cache whose readiness is `ready` (the second half of
    /// [`Cache::reader`](super::caches::Cache::reader)): nothing is reconciled before it
    /// holds its first listing.
    pub fn reads(mut self, ready: watch::Receiver<bool>) -> Runner {
        self.ready.push(ready);
        self
    }

    /// The controller reads every cache of `ready`: see [`Runner::reads`].
    pub fn reads_all(mut self, ready: impl IntoIterator<Item = watch::Receiver<bool>>) -> Runner {
        self.ready.extend(ready);
        self
    }

    /// Runs `controller`, each object through `reconcile(object, state)`, until shutdown.
    pub async fn run<K, S, E, F, Fut>(
        mut self,
        controller: Controller<K>,
        reconcile: F,
        state: Arc<S>,
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Clone + Debug + Default + Eq + Hash + Unpin + Send + Sync,
        S: Send + Sync + 'static,
        E: std::error::Error + Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        if !listed(&self.ctx, std::mem::take(&mut self.ready)).await {
            return;
        }
        let name = self.name;
        tracing::info!(controller = name, "controller started");
        let running = Arc::new(Running {
            name,
            state,
            reconcile,
            retries: Retries::default(),
        });
        let shutdown = self.ctx.shutdown.clone();
        controller
            .graceful_shutdown_on(shutdown.cancelled_owned())
            .run(reconcile_once, error_policy, running)
            .for_each(|result| async move {
                match result {
                    // Logged once by `error_policy`, with the wait before the retry.
                    Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                    // An object gone before its turn, a full queue: the runtime's own.
                    Err(err) => tracing::debug!(controller = name, %err, "reconcile did not run"),
                }
            })
            .await;
        tracing::info!(controller = name, "controller stopped");
    }
}

/// Waits until every cache of `ready` holds its first listing; `false` when `ctx`'s
/// shutdown came first. For the work a controller does beside its reconciles (a stream of
/// departures, gauges): the reconciles wait through [`Runner::reads`].
pub async fn listed(ctx: &Context, ready: impl IntoIterator<Item = watch::Receiver<bool>>) -> bool {
    for mut ready in ready {
        tokio::select! {
            listed = ready.wait_for(|listed| *listed) => {
                if listed.is_err() {
                    return false;
                }
            }
            () = ctx.shutdown.cancelled() => return false,
        }
    }
    !ctx.shutdown.is_cancelled()
}

/// `object`'s name as the logs and the failure counts key it.
fn object_name<K: Resource>(object: &K) -> String {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

async fn reconcile_once<K, S, E, F, Fut>(
    object: Arc<K>,
    running: Arc<Running<S, F>>,
) -> Result<Action, E>
where
    K: Resource,
    F: Fn(Arc<K>, Arc<S>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
{
    let key = object_name(object.as_ref());
    let result = (running.reconcile)(object, running.state.clone()).await;
    if result.is_ok() {
        running.retries.succeeded(&key);
    }
    result
}

fn error_policy<K, S, E, F>(object: Arc<K>, err: &E, running: Arc<Running<S, F>>) -> Action
where
    K: Resource,
    E: Display,
{
    let object = object_name(object.as_ref());
    let retry_in = running.retries.failed(&object);
    tracing::warn!(
        controller = running.name,
        %object,
        error = %err,
        ?retry_in,
        "reconcile failed"
    );
    Action::requeue(retry_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;

    fn config_map(namespace: Option<&str>, name: &str) -> ConfigMap {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = namespace.map(str::to_string);
        map
    }

    #[test]
    fn objects_are_named_with_their_namespace_when_they_have_one() {
        assert_eq!(object_name(&config_map(Some("ns"), "a")), "ns/a");
        assert_eq!(object_name(&config_map(None, "a")), "a");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;

    #[tokio::test]
    async fn failures_of_one_object_back_off_and_a_success_forgets_them() {
        let calls = AtomicU32::new(0);
        let running = Arc::new(Running {
            name: "test",
            state: Arc::new(()),
            reconcile: move |_: Arc<ConfigMap>, _: Arc<()>| {
                let call = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if call < 3 {
                        Err(Refused)
                    } else {
                        Ok(Action::await_change())
                    }
                }
            },
            retries: Retries::default(),
        });
        let a = Arc::new(config_map(Some("ns"), "a"));
        let b = Arc::new(config_map(Some("ns"), "b"));
        let mut waits = Vec::new();
        for _ in 0..3 {
            let err = reconcile_once(a.clone(), running.clone())
                .await
                .expect_err("fails");
            waits.push(error_policy(a.clone(), &err, running.clone()));
        }
        assert_eq!(
            waits,
            [500, 1000, 2000].map(|ms| Action::requeue(Duration::from_millis(ms)))
        );
        // Another object's first failure is a first one.
        assert_eq!(
            error_policy(b, &Refused, running.clone()),
            Action::requeue(Duration::from_millis(500))
        );
        reconcile_once(a.clone(), running.clone())
            .await
            .expect("succeeds");
        assert_eq!(
            error_policy(a, &Refused, running),
            Action::requeue(Duration::from_millis(500))
        );
    }

    #[tokio::test]
    async fn nothing_runs_before_every_cache_is_listed_and_nothing_after_shutdown() {
        let (client, _server) = crate::controllers::fixtures::client();
        let ctx = Context::new(client, Default::default());
        let (nodes_tx, nodes) = watch::channel(false);
        let (modules_tx, modules) = watch::channel(false);
        let waiting = tokio::spawn({
            let ctx = ctx.clone();
            let ready = [nodes.clone(), modules.clone()];
            async move { listed(&ctx, ready).await }
        });
        nodes_tx.send(true).expect("the nodes are listed");
        // The test's runtime has one thread: each yield lets the wait see the news.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "the Modules are not listed yet");
        modules_tx.send(true).expect("the Modules are listed");
        assert!(
            waiting.await.expect("the wait ends"),
            "every cache is listed"
        );

        let (_never_tx, never) = watch::channel(false);
        let waiting = tokio::spawn({
            let ctx = ctx.clone();
            async move { listed(&ctx, [never]).await }
        });
        ctx.shutdown.cancel();
        assert!(
            !waiting.await.expect("the wait ends"),
            "shutdown came first"
        );
        assert!(
            !listed(&ctx, [nodes]).await,
            "a listed cache after shutdown runs nothing"
        );
    }
}
