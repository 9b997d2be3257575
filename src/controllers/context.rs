//! What every reconciler shares: the client, the clock, an event recorder, and the signal
//! to stop.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::controllers::nmc::worker_pod::DEFAULT_WORKER_IMAGE;

/// The component name on the Events the controllers write.
pub const EVENT_REPORTER: &str = "capstan-controllers";

/// Field managers of the controllers' writes: one per controller, so that Git (manager
/// `capstan`) and the controllers never own the same field.
pub mod managers {
    /// The Module -> NMC controller (NMC spec, Module status and finalizer).
    pub const MODULE_NMC: &str = "capstan-module-nmc";
    /// The NMC controller (NMC status, worker pods, ready labels).
    pub const NMC: &str = "capstan-nmc";
    /// The device-plugin controller (DaemonSets).
    pub const DEVICE_PLUGIN: &str = "capstan-device-plugin";
    /// The ordered-upgrade version-label controller (internal node labels).
    pub const VERSION_LABELS: &str = "capstan-version-labels";
}

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
    recorder: Recorder,
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

    /// A context with every setting given.
    pub fn configured(
        client: Client,
        clock: Arc<dyn Clock>,
        shutdown: CancellationToken,
        worker_image: String,
    ) -> Arc<Context> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: EVENT_REPORTER.into(),
                instance: None,
            },
        );
        Arc::new(Context {
            client,
            clock,
            shutdown,
            worker_image,
            recorder,
        })
    }

    /// Publishes an Event about `object`; a failure is logged, never fatal, as upstream
    /// controllers treat events.
    pub async fn event(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, object).await {
            tracing::debug!(%err, reason, "could not publish an event");
        }
    }
}
