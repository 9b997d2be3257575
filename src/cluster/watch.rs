//! Watch streams: the initial state when asked, then every change after a
//! resourceVersion, filtered by namespace and selectors, as newline-separated JSON
//! events. Each watcher reads the store's broadcast on its own; one that falls too
//! far behind is closed (as a real API server closes slow watchers) and resumes
//! from its last resourceVersion, never holding up the others.

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{Api, ListOptions};
use super::errors::ApiError;
use super::faults::Faults;
use super::resources::Resource;
use super::store::{Change, EventType, Followed, Follower, StoreError, StoredObject};

/// How objects are shown in events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    Object,
    Table,
    Metadata,
}

/// A watch request, parsed.
pub struct WatchRequest {
    pub resource: Arc<Resource>,
    pub namespace: Option<String>,
    pub options: ListOptions,
    /// `resourceVersion`: unset or "0" starts with the current state as ADDED events.
    pub resource_version: Option<u64>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
    pub rendering: Rendering,
    /// Injected faults: a watch may be cut after any event.
    pub faults: Faults,
}

const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

/// Starts a watch; events arrive on the returned channel until the client goes away,
/// the timeout passes, or the watcher falls behind.
pub fn start(api: Arc<Api>, request: WatchRequest) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    let initial = request.resource_version.is_none_or(|rv| rv == 0) || request.send_initial_events;
    // Subscribe before listing: changes the list already reflects are skipped by resourceVersion.
    // The resourceVersion the watch goes on from: the receiver brings what follows it.
    let mut from = 0;
    let (backlog, receiver, listed) = if initial {
        let receiver = api.store.subscribe();
        let selects = |o: &StoredObject| request.options.selects(&o.projection);
        let page = api.store.list(
            &request.resource.storage,
            request
                .namespace
                .as_deref()
                .filter(|_| request.resource.namespaced),
            None,
            None,
            request
                .options
                .filters()
                .then_some(&selects as &dyn Fn(&StoredObject) -> bool),
        );
        (Vec::new(), receiver, Some(page))
    } else {
        from = request.resource_version.unwrap_or(0);
        match api.store.watch_from(from) {
            Ok((backlog, receiver)) => (backlog, receiver, None),
            // As kube-apiserver does, the watch opens and its one event says 410 Gone:
            // clients relist on that event, while kube's watcher retries an HTTP 410
            // from the same resourceVersion forever.
            Err(err @ StoreError::Gone { .. }) => return Ok(gone(&ApiError::from(err))),
            Err(err) => return Err(err.into()),
        }
    };
    let (sender, events) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut watcher = Watcher::new(api, request, sender);
        watcher.seen = from;
        if let Some(page) = listed {
            watcher.seen = page.resource_version;
            for object in &page.items {
                let object = watcher.api.present(&watcher.request.resource, object);
                if !watcher.send(EventType::Added.as_str(), &object).await {
                    return;
                }
            }
            if watcher.request.send_initial_events && !watcher.send_bookmark(true).await {
                return;
            }
        }
        for change in backlog {
            if !watcher.forward(&change).await {
                return;
            }
        }
        let changes = watcher.api.store.follow_from(receiver, watcher.seen);
        watcher.follow(changes).await;
    });
    Ok(events)
}

/// A watch whose only event is the `ERROR` Status of `err`.
fn gone(err: &ApiError) -> mpsc::Receiver<Bytes> {
    let (sender, events) = mpsc::channel(1);
    let _ = sender.try_send(event_line("ERROR", &Bytes::from(err.status().to_string())));
    events
}

struct Watcher {
    api: Arc<Api>,
    request: WatchRequest,
    sender: mpsc::Sender<Bytes>,
    /// The newest resourceVersion this watcher has accounted for (sent or filtered out).
    seen: u64,
    first_table: bool,
}

impl Watcher {
    fn new(api: Arc<Api>, request: WatchRequest, sender: mpsc::Sender<Bytes>) -> Self {
        Watcher {
            api,
            request,
            sender,
            seen: 0,
            first_table: true,
        }
    }

    /// Sends every change after the backlog. A watcher that falls a whole broadcast behind
    /// (the broadcast counts every change, not only the ones it selects) reads the missed
    /// changes from the history; only past the history is it closed, and its client, whose
    /// resourceVersion is older than the history, lists again.
    async fn follow(&mut self, mut changes: Follower) {
        let deadline = self
            .request
            .timeout
            .map(|t| tokio::time::Instant::now() + t);
        let mut bookmarks =
            tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
        loop {
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                followed = changes.next() => match followed {
                    Some(Followed::Change(change)) => {
                        if !self.forward(&change).await || self.request.faults.drop_watch() {
                            return;
                        }
                    }
                    Some(Followed::Restart) => {
                        tracing::debug!(resource = %self.request.resource.plural, "closing a watch that fell behind the history");
                        return;
                    }
                    None => return,
                },
                _ = bookmarks.tick(), if self.request.bookmarks => {
                    if !self.send_bookmark(false).await {
                        return;
                    }
                }
                () = timeout => return,
                () = self.sender.closed() => return,
            }
        }
    }

    /// Sends what `change` means to this watcher, if anything. False when the client is gone.
    async fn forward(&mut self, change: &Change) -> bool {
        if change.object.resource_version <= self.seen {
            return true;
        }
        self.seen = change.object.resource_version;
        let request = &self.request;
        if change.key.storage != request.resource.storage {
            return true;
        }
        if let Some(ns) = request.namespace.as_deref()
            && request.resource.namespaced
            && change.key.namespace != ns
        {
            return true;
        }
        let now_selected = request.options.selects(&change.object.projection);
        let was_selected = change
            .previous
            .as_ref()
            .is_some_and(|p| request.options.selects(p));
        let event = match (change.event, was_selected, now_selected) {
            (EventType::Deleted, _, true) => EventType::Deleted,
            (EventType::Added, _, true) | (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            // An object leaving the selection is a deletion for this watcher.
            (EventType::Modified, true, false) => EventType::Deleted,
            _ => return true,
        };
        let object = self.api.present(&request.resource, &change.object);
        self.send(event.as_str(), &object).await
    }

    async fn send(&mut self, event: &str, object: &Bytes) -> bool {
        let line = match self.request.rendering {
            Rendering::Object => event_line(event, object),
            Rendering::Table | Rendering::Metadata => {
                let Ok(value) = serde_json::from_slice::<Value>(object) else {
                    return true;
                };
                let rendered = if self.request.rendering == Rendering::Table {
                    let mut table = super::http::table_of(
                        &self.api,
                        &self.request.resource,
                        &[&value],
                        json!({}),
                    );
                    if !self.first_table {
                        table["columnDefinitions"] = json!([]);
                    }
                    self.first_table = false;
                    table
                } else {
                    super::http::partial_metadata(&value)
                };
                event_line(event, &Bytes::from(rendered.to_string()))
            }
        };
        self.sender.send(line).await.is_ok()
    }

    async fn send_bookmark(&mut self, initial_events_end: bool) -> bool {
        let resource = &self.request.resource;
        let mut metadata = json!({"resourceVersion": self.seen.max(1).to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = json!({"kind": resource.kind, "apiVersion": resource.api_version(), "metadata": metadata});
        let line = event_line("BOOKMARK", &Bytes::from(object.to_string()));
        self.sender.send(line).await.is_ok()
    }
}

/// `{"type":"<event>","object":<object>}\n`, without re-serialising the object.
fn event_line(event: &str, object: &Bytes) -> Bytes {
    let mut line = BytesMut::with_capacity(object.len() + 32);
    line.put_slice(b"{\"type\":\"");
    line.put_slice(event.as_bytes());
    line.put_slice(b"\",\"object\":");
    line.put_slice(object);
    line.put_slice(b"}\n");
    line.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_wrap_the_stored_bytes() {
        let line = event_line("ADDED", &Bytes::from_static(br#"{"kind":"Pod"}"#));
        let parsed: Value = serde_json::from_slice(&line).expect("json");
        assert_eq!(parsed, json!({"type": "ADDED", "object": {"kind": "Pod"}}));
        assert!(line.ends_with(b"\n"));
    }
}
