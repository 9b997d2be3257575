//! What every reconciler shares: the client, the clock, an event recorder, the gauges, and
//! the signal to stop.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::controllers::metrics::UpgradeMetrics;
use crate::controllers::nmc::worker_pod::DEFAULT_WORKER_IMAGE;
use crate::history::recorder::{EventKey, Recorder};
use capstan_api::clock::{Clock, SystemClock};

/// The component name on the Events the controllers write.
pub const EVENT_REPORTER: &str = "capstan-controllers";

/// How many objects one controller reconciles at once. Unbounded, a fleet-wide change
/// would open one API connection per node at the same moment. A few more than the API
/// server has cores keep it busy; more only queue there, and cost here: kube's runner
/// polls every reconcile in flight whenever one of them wakes, and a node that waits for
/// its turn gathers its changes into one reconcile (docs/benchmarks.md).
pub const CONCURRENCY: u16 = 16;

/// Shared by every reconciler of one capstan process.
pub struct Context {
    /// The cluster.
    pub client: Client,
    /// "Now", for the decisions that depend on time.
    pub clock: Arc<dyn Clock>,
    /// Stops every controller; reconcilers in flight finish first.
    pub shutdown: CancellationToken,
    /// The image worker pods run (`capstan sync --worker-image`).
    pub worker_image: String,
    /// capstan's Event recorder, on [`Context::clock`].
    pub recorder: Recorder,
    /// The gauges the controllers set: `upgradeoperator_*` and upstream KMM's `kmm_*`.
    pub metrics: Arc<UpgradeMetrics>,
}

impl Context {
    /// A context on the system clock.
    pub fn new(client: Client, shutdown: CancellationToken) -> Arc<Context> {
        Context::with_clock(client, Arc::new(SystemClock), shutdown)
    }

    /// A context on the given clock.
    pub fn with_clock(
        client: Client,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
    ) -> Arc<Context> {
        Context::configured(client, clock, shutdown, DEFAULT_WORKER_IMAGE.to_string())
    }

    /// A context with every setting given; its gauges are its own.
    pub fn configured(
        client: Client,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
        worker_image: String,
    ) -> Arc<Context> {
        Context::reporting_to(client, clock, shutdown, worker_image, Arc::default())
    }

    /// A context with every setting given, whose controllers set the gauges of `metrics`
    /// (those `capstan sync` serves: `crate::sync::metrics::Metrics::controllers`).
    pub fn reporting_to(
        client: Client,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
        worker_image: String,
        metrics: Arc<UpgradeMetrics>,
    ) -> Arc<Context> {
        let recorder = Recorder::new(client.clone(), EVENT_REPORTER, clock.clone());
        Arc::new(Context {
            client,
            clock,
            shutdown,
            worker_image,
            recorder,
            metrics,
        })
    }

    /// Publishes an Event about `object` (and `related`, the other object it concerns); a
    /// failure is logged, never fatal, as upstream controllers treat events. The same
    /// Event again within minutes is counted in its series.
    pub async fn event(
        &self,
        object: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let key = EventKey {
            warning,
            reason: reason.into(),
            action: action.into(),
            note,
            regarding: object.into(),
            related: related.as_ref().map(Into::into),
            annotations: Default::default(),
        };
        if let Err(err) = self.recorder.publish(key, object, related).await {
            tracing::debug!(%err, reason, "could not publish an event");
        }
    }
}
