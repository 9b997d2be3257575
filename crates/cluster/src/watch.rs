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
use super::rendering::{Rendering, partial_metadata, table_of};
use super::resources::Resource;
use super::store::{Change, Closed, EventType, Followed, Follower, StoreError, StoredObject};

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

/// How many bytes of event lines a watch gathers into one chunk at most.
const BATCH_BYTES: usize = 64 * 1024;

/// How many changes a watch looks at for one chunk at most, whether or not they are its
/// own: between chunks it awaits its change stream again, where the runtime can make it
/// yield, so a stream of changes it filters out never holds its thread.
const BATCH_CHANGES: usize = 1024;

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
    /// Where event lines are written: each chunk sent is split off it, and its space is
    /// written again once every chunk cut from it has gone out, so a busy watch does not
    /// allocate a buffer per chunk.
    lines: BytesMut,
}

impl Watcher {
    fn new(api: Arc<Api>, request: WatchRequest, sender: mpsc::Sender<Bytes>) -> Self {
        Watcher {
            api,
            request,
            sender,
            seen: 0,
            first_table: true,
            lines: BytesMut::with_capacity(BATCH_BYTES),
        }
    }

    /// The line buffer, taken out to be written. Each line reserves its room: past the
    /// buffer's end the space of chunks already written out is reclaimed, or, while one
    /// is still queued, a buffer as large as the first is allocated.
    fn take_lines(&mut self) -> BytesMut {
        std::mem::take(&mut self.lines)
    }

    /// Sends what `lines` holds as one chunk, if anything, and puts the buffer back.
    /// False when the client is gone.
    async fn send_lines(&mut self, mut lines: BytesMut) -> bool {
        let chunk = lines.split().freeze();
        self.lines = lines;
        chunk.is_empty() || self.sender.send(chunk).await.is_ok()
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
                        if !self.forward_batch(change, &mut changes).await {
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

    /// Sends what `change`, and every change already broadcast after it, mean to this
    /// watcher, as one chunk of lines: a burst of changes costs the stream one write (one
    /// TLS record, one system call) instead of one each. Only what is already there is
    /// taken; nothing waits for more. False when the watch ends: the client is gone, the
    /// store closed, the watcher fell behind the history or a fault cut the stream.
    async fn forward_batch(&mut self, first: Arc<Change>, changes: &mut Follower) -> bool {
        let mut batch = self.take_lines();
        let mut next = Some(Followed::Change(first));
        let mut ends = false;
        let mut looked = 0;
        while let Some(followed) = next.take() {
            looked += 1;
            match followed {
                Followed::Change(change) => {
                    if self.line_for(&change, &mut batch) && self.request.faults.drop_watch() {
                        ends = true;
                        break;
                    }
                }
                Followed::Restart => {
                    tracing::debug!(resource = %self.request.resource.plural, "closing a watch that fell behind the history");
                    ends = true;
                    break;
                }
            }
            if batch.len() >= BATCH_BYTES || looked >= BATCH_CHANGES {
                break;
            }
            match changes.try_next() {
                Ok(followed) => next = followed,
                Err(Closed) => {
                    ends = true;
                    break;
                }
            }
        }
        self.send_lines(batch).await && !ends
    }

    /// Sends what `change` means to this watcher, if anything. False when the client is gone.
    async fn forward(&mut self, change: &Change) -> bool {
        let mut lines = self.take_lines();
        self.line_for(change, &mut lines);
        self.send_lines(lines).await
    }

    /// Appends to `out` the event line `change` makes for this watcher, if any; true
    /// when it made one.
    fn line_for(&mut self, change: &Change, out: &mut BytesMut) -> bool {
        if change.object.resource_version <= self.seen {
            return false;
        }
        self.seen = change.object.resource_version;
        let request = &self.request;
        if change.key.storage != request.resource.storage {
            return false;
        }
        if let Some(ns) = request.namespace.as_deref()
            && request.resource.namespaced
            && change.key.namespace != ns
        {
            return false;
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
            _ => return false,
        };
        let object = self.api.present(&request.resource, &change.object);
        self.render(event.as_str(), &object, out)
    }

    async fn send(&mut self, event: &str, object: &Bytes) -> bool {
        let mut lines = self.take_lines();
        self.render(event, object, &mut lines);
        self.send_lines(lines).await
    }

    /// Appends to `out` the event line of `object` in this watch's rendering; false for
    /// an object that cannot be rendered so.
    fn render(&mut self, event: &str, object: &Bytes, out: &mut BytesMut) -> bool {
        match self.request.rendering {
            Rendering::Object => put_event_line(out, event, object),
            Rendering::Table | Rendering::Metadata => {
                let Ok(value) = serde_json::from_slice::<Value>(object) else {
                    return false;
                };
                let rendered = if self.request.rendering == Rendering::Table {
                    let mut table =
                        table_of(&self.api, &self.request.resource, &[&value], json!({}));
                    if !self.first_table {
                        table["columnDefinitions"] = json!([]);
                    }
                    self.first_table = false;
                    table
                } else {
                    partial_metadata(&value)
                };
                put_event_line(out, event, rendered.to_string().as_bytes());
            }
        }
        true
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
fn event_line(event: &str, object: &[u8]) -> Bytes {
    let mut line = BytesMut::new();
    put_event_line(&mut line, event, object);
    line.freeze()
}

/// Appends [`event_line`] to `out`.
fn put_event_line(out: &mut BytesMut, event: &str, object: &[u8]) {
    out.reserve(object.len() + 32);
    out.put_slice(b"{\"type\":\"");
    out.put_slice(event.as_bytes());
    out.put_slice(b"\",\"object\":");
    out.put_slice(object);
    out.put_slice(b"}\n");
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

    /// A cluster, and a watch on its ConfigMaps from the store's current resourceVersion.
    async fn configmap_watch() -> (crate::EmbeddedCluster, Arc<Resource>, mpsc::Receiver<Bytes>) {
        let cluster = crate::EmbeddedCluster::start(Default::default())
            .await
            .expect("cluster starts");
        let api = cluster.api().clone();
        let configmaps = api
            .registry
            .get("", "v1", "configmaps")
            .expect("configmaps");
        let request = WatchRequest {
            resource: configmaps.clone(),
            namespace: Some("default".into()),
            options: ListOptions::default(),
            resource_version: Some(api.store.resource_version()),
            send_initial_events: false,
            bookmarks: false,
            timeout: None,
            rendering: Rendering::Object,
            faults: Faults::default(),
        };
        let events = start(api, request).expect("watch starts");
        (cluster, configmaps, events)
    }

    /// Creates ConfigMaps `cm-0`..`cm-{count - 1}`, each with `size` bytes of data.
    fn create_configmaps(api: &Api, configmaps: &Resource, count: usize, size: usize) {
        for i in 0..count {
            let body = json!({
                "metadata": {"name": format!("cm-{i}"), "namespace": "default"},
                "data": {"blob": "x".repeat(size)},
            });
            api.create(configmaps, "default", body, &Default::default())
                .expect("created");
        }
    }

    /// The chunks of `events` until `count` event lines have arrived, each chunk split
    /// into its lines, parsed.
    async fn chunks_of(events: &mut mpsc::Receiver<Bytes>, count: usize) -> Vec<Vec<Value>> {
        let mut chunks = Vec::new();
        let mut seen = 0;
        while seen < count {
            let chunk = tokio::time::timeout(Duration::from_secs(60), events.recv())
                .await
                .expect("an event within 60 s")
                .expect("the watch is open");
            assert!(chunk.ends_with(b"\n"), "a chunk holds whole lines");
            let lines: Vec<Value> = chunk
                .split(|b| *b == b'\n')
                .filter(|line| !line.is_empty())
                .map(|line| serde_json::from_slice(line).expect("each line is JSON"))
                .collect();
            seen += lines.len();
            chunks.push(lines);
        }
        chunks
    }

    fn names(chunks: &[Vec<Value>]) -> Vec<String> {
        chunks
            .iter()
            .flatten()
            .map(|line| {
                assert_eq!(line["type"], "ADDED");
                line["object"]["metadata"]["name"]
                    .as_str()
                    .expect("a name")
                    .to_string()
            })
            .collect()
    }

    /// Changes already broadcast when the watcher wakes go out as one chunk, in order.
    #[tokio::test]
    async fn a_burst_of_changes_is_one_chunk() {
        let (cluster, configmaps, mut events) = configmap_watch().await;
        // Written before this task yields, so before the watcher first looks.
        create_configmaps(cluster.api(), &configmaps, 5, 10);
        let chunks = chunks_of(&mut events, 5).await;
        assert_eq!(chunks.len(), 1, "one chunk: {chunks:?}");
        assert_eq!(names(&chunks), ["cm-0", "cm-1", "cm-2", "cm-3", "cm-4"]);
    }

    /// A burst larger than a chunk is split at line boundaries, nothing lost.
    #[tokio::test]
    async fn a_large_burst_is_split_between_lines() {
        let (cluster, configmaps, mut events) = configmap_watch().await;
        create_configmaps(cluster.api(), &configmaps, 40, 4096);
        let chunks = chunks_of(&mut events, 40).await;
        let expected: Vec<String> = (0..40).map(|i| format!("cm-{i}")).collect();
        assert_eq!(names(&chunks), expected);
        // 40 objects of over 4 KiB cannot share one 64 KiB chunk, and none is cut.
        assert!(chunks.len() >= 3, "{} chunks", chunks.len());
        for chunk in &chunks[..chunks.len() - 1] {
            assert!(chunk.len() >= BATCH_BYTES / (4096 + 1024), "a full chunk");
        }
    }
}
