//! Sync requests carried by the cluster: the [`SYNC_REQUESTED_AT_ANNOTATION`] of the
//! GitSync object.
//!
//! Of the replicas of `capstan sync` only the leader syncs, but a Service sends a GitHub
//! webhook to any of them. A standby that receives one writes the annotation
//! ([`request`]); the leader watches its GitSync ([`watch`]) and fetches at once when the
//! value changes. People do the same by hand, as with Flux's `requestedAt`:
//! `kubectl -n capstan-system annotate gitsync capstan capstan.dev/requested-at="$(date +%s)" --overwrite`.

use std::sync::Arc;

use capstan_api::GitSync;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::SYNC_REQUESTED_AT_ANNOTATION;
use futures::StreamExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use tokio::sync::Notify;

/// What became of a relayed request.
#[derive(Debug, PartialEq, Eq)]
pub enum Relayed {
    /// The annotation is written; the leader fetches once its watch sees it.
    Written,
    /// No GitSync exists yet: no leader has synced, and its first sync fetches anyway.
    NoSyncYet,
}

/// Asks the leader of the GitSync `name` to sync now, with `value` (any new text: a time,
/// a delivery id) as the annotation's value.
pub async fn request(client: &kube::Client, name: &str, value: &str) -> kube::Result<Relayed> {
    let api: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let patch = serde_json::json!({
        "metadata": {"annotations": {SYNC_REQUESTED_AT_ANNOTATION: value}}
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Relayed::Written),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Relayed::NoSyncYet),
        Err(err) => Err(err),
    }
}

/// Whether a GitSync seen by the leader asks for a sync: its annotation differs from the
/// value last seen. The first sight only records the value: a request written before this
/// leader started is served by its first sync.
fn is_new_request(last_seen: &mut Option<Option<String>>, sync: &GitSync) -> bool {
    let value = sync
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SYNC_REQUESTED_AT_ANNOTATION))
        .cloned();
    let previous = last_seen.replace(value.clone());
    matches!(previous, Some(previous) if previous != value && value.is_some())
}

/// Watches the GitSync `name` and notifies `trigger` for every new request, until the
/// task is aborted. A broken watch is restarted by the watcher with its backoff.
pub fn watch(
    client: kube::Client,
    name: &str,
    trigger: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<GitSync> = Api::namespaced(client, SYSTEM_NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        use kube::runtime::WatchStreamExt as _;
        let mut last_seen = None;
        let stream = watcher(api, config).default_backoff().applied_objects();
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(sync) => {
                    if is_new_request(&mut last_seen, &sync) {
                        tracing::info!(
                            "sync requested through the GitSync annotation: fetching now"
                        );
                        trigger.notify_one();
                    }
                }
                Err(err) => tracing::debug!(%err, "watching the GitSync for sync requests"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sync_with(value: Option<&str>) -> GitSync {
        let mut sync: GitSync = serde_json::from_value(serde_json::json!({
            "apiVersion": "capstan.dev/v1alpha1", "kind": "GitSync",
            "metadata": {"name": "capstan", "namespace": "capstan-system"},
            "spec": {"repo": "r", "branch": "main", "path": ""}
        }))
        .expect("a GitSync");
        if let Some(value) = value {
            sync.metadata.annotations =
                Some([(SYNC_REQUESTED_AT_ANNOTATION.to_string(), value.to_string())].into());
        }
        sync
    }

    /// The annotation values the leader sees in turn, and whether each asks for a sync.
    type Sights = &'static [(Option<&'static str>, bool)];

    #[test]
    fn a_request_is_a_changed_annotation_seen_after_the_first_sight() {
        let cases: [(&str, Sights); 5] = [
            ("first sight with a value", &[(Some("1"), false)]),
            (
                "status writes repeat the value",
                &[(Some("1"), false), (Some("1"), false)],
            ),
            (
                "a new value",
                &[(Some("1"), false), (Some("2"), true), (Some("2"), false)],
            ),
            ("added after the start", &[(None, false), (Some("1"), true)]),
            (
                "removed",
                &[(Some("1"), false), (None, false), (Some("1"), true)],
            ),
        ];
        for (name, seen) in cases {
            let mut last = None;
            for (step, (value, expected)) in seen.iter().enumerate() {
                assert_eq!(
                    is_new_request(&mut last, &sync_with(*value)),
                    *expected,
                    "{name}, sight {step}"
                );
            }
        }
    }
}
