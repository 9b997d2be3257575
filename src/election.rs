//! Leader election on a `coordination.k8s.io/v1` Lease, so that of the replicas of
//! `capstan sync` exactly one syncs and runs the controllers (`--leader-elect`).
//!
//! The Lease is kept by kube-lease-manager (server-side apply on the Lease, expiry
//! judged on each replica's own clock with the holder renewing `grace` before it). A
//! replica waits in [`acquire`] until it holds the Lease; from then on [`Leadership`]
//! renews it in the background. Losing it (a renewal that failed until the Lease expired,
//! another holder seen) is final: the process must stop acting at once, which
//! [`Leadership::lost`] tells it. A replica that stops cleanly releases the Lease; a
//! standby takes it over once it expires either way.

use std::time::Duration;

use anyhow::Context as _;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Exit code of a process that lost its Lease while leading.
pub const EXIT_LEASE_LOST: i32 = 4;

/// Which Lease, and how long a holder keeps it without renewing.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// This replica's name in `spec.holderIdentity`: unique per process.
    pub identity: String,
    /// `spec.leaseDurationSeconds`: how long after its last renewal a holder keeps the
    /// Lease, so how long a standby waits after the leader died.
    pub duration: Duration,
    /// How long before expiry the holder renews.
    pub grace: Duration,
}

impl LeaseOptions {
    /// Whole seconds, as the Lease stores them; the grace is shorter than the duration.
    fn seconds(&self) -> anyhow::Result<(u64, u64)> {
        let duration = self.duration.as_secs();
        let grace = self.grace.as_secs();
        anyhow::ensure!(
            duration >= 1 && Duration::from_secs(duration) == self.duration,
            "--lease-duration {:?}: a Lease lasts whole seconds, at least 1",
            self.duration
        );
        anyhow::ensure!(
            grace >= 1 && grace < duration && Duration::from_secs(grace) == self.grace,
            "--lease-grace {:?}: whole seconds, at least 1 and shorter than --lease-duration",
            self.grace
        );
        Ok((duration, grace))
    }
}

/// The identity of this process: the pod's name (the downward API's `POD_NAME`, else the
/// host name, which is the pod's name in a pod) and a random suffix, as client-go's
/// `<hostname>_<uuid>`, so that a restarted pod never mistakes its predecessor's Lease
/// for its own.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_string())
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "capstan".to_string());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}_{}", &suffix[..8])
}

/// The namespace of the Lease when none is given: the pod's (`POD_NAMESPACE`, else the
/// service account's namespace file), else capstan's own.
pub fn default_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace").ok()
        })
        .map(|ns| ns.trim().to_string())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| capstan_api::capstan::SYSTEM_NAMESPACE.to_string())
}

/// This process holds the Lease; dropping it stops renewing without releasing.
pub struct Leadership {
    state: watch::Receiver<bool>,
    keeper: JoinHandle<kube_lease_manager::Result<LeaseManager>>,
}

/// Waits until this process holds the Lease, creating it when missing. Errors only when
/// the Lease cannot be read or created at all (a missing permission, say); a Lease held
/// by another replica is waited for, however long.
pub async fn acquire(client: kube::Client, options: &LeaseOptions) -> anyhow::Result<Leadership> {
    let (duration, grace) = options.seconds()?;
    crate::runtime::ensure_namespace(&client, &options.namespace, "capstan-lease")
        .await
        .with_context(|| format!("creating the Lease's namespace {}", options.namespace))?;
    let manager = LeaseManagerBuilder::new(client, &options.name)
        .with_namespace(&options.namespace)
        .with_create_mode(LeaseCreateMode::AutoCreate)
        .with_identity(&options.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(format!("capstan-lease/{}", options.identity))
        .build()
        .await
        .with_context(|| {
            format!(
                "reading or creating the Lease {}/{}",
                options.namespace, options.name
            )
        })?;
    let (mut state, keeper) = manager.watch().await;
    loop {
        if *state.borrow_and_update() {
            return Ok(Leadership { state, keeper });
        }
        if state.changed().await.is_err() {
            // The keeper ended on its own: it only does so after an error it reports.
            let error = match keeper.await {
                Ok(Err(err)) => anyhow::Error::new(err),
                Ok(Ok(_)) => anyhow::anyhow!("the Lease keeper stopped"),
                Err(err) => anyhow::Error::new(err),
            };
            return Err(error.context(format!(
                "waiting for the Lease {}/{}",
                options.namespace, options.name
            )));
        }
    }
}

impl Leadership {
    /// Completes when this process no longer holds the Lease.
    pub async fn lost(&mut self) {
        loop {
            if !*self.state.borrow_and_update() {
                return;
            }
            if self.state.changed().await.is_err() {
                return;
            }
        }
    }

    /// Gives the Lease up, so a standby may take it as soon as it next looks; waits until
    /// the release is written (or failed: the Lease then expires on its own).
    pub async fn release(self) {
        let Leadership { state, keeper } = self;
        // Closing the channel is the keeper's signal to release and end.
        drop(state);
        match keeper.await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::warn!(%err, "releasing the Lease; it expires on its own"),
            Err(err) => {
                tracing::warn!(%err, "the Lease keeper failed; the Lease expires on its own")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(duration: Duration, grace: Duration) -> LeaseOptions {
        LeaseOptions {
            namespace: "capstan-system".into(),
            name: "capstan".into(),
            identity: "me".into(),
            duration,
            grace,
        }
    }

    #[test]
    fn a_lease_lasts_whole_seconds_and_is_renewed_before_it_expires() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        let cases = [
            (s(15), s(5), Some((15, 5))),
            (s(2), s(1), Some((2, 1))),
            (s(1), s(1), None),
            (s(5), s(5), None),
            (ms(1500), s(1), None),
            (s(0), s(0), None),
            (s(10), ms(500), None),
        ];
        for (duration, grace, expected) in cases {
            assert_eq!(
                options(duration, grace).seconds().ok(),
                expected,
                "{duration:?} {grace:?}"
            );
        }
    }

    #[test]
    fn identities_differ_per_process_start() {
        assert_ne!(identity(), identity());
    }
}
