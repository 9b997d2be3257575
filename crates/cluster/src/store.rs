//! The object store: every object of the cluster, a cluster-wide resourceVersion, the
//! recent history that watches resume from, and (with a state dir) a write-ahead log.
//!
//! Objects are kept serialized: lists and watches send the stored bytes as they are,
//! and a small projection (metadata and the selectable fields) answers selectors
//! without parsing. Writes run one at a time under a lock, as etcd orders them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use crate::pointer::Pointer;

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::object_key::ObjectKey;
use crate::persist::{Persist, PersistError, Record};

/// The serialising buffer a thread keeps between writes (larger objects shrink it back).
const KEPT_BUFFER: usize = 1 << 20;

thread_local! {
    static SERIALIZED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What storing an object over `current` is: its creation, or a change.
fn put_event(current: Option<&StoredObject>) -> EventType {
    if current.is_some() {
        EventType::Modified
    } else {
        EventType::Added
    }
}

/// One stored object: its JSON bytes and the projection selectors look at.
#[derive(Clone, Debug)]
pub struct StoredObject {
    pub resource_version: u64,
    pub bytes: Bytes,
    pub projection: Arc<Value>,
}

impl StoredObject {
    fn new(object: &Value, resource_version: u64) -> Self {
        // Serialising a Value cannot fail: its map keys are strings. The bytes stay as
        // long as the object and its history do, so they are kept at their exact size
        // (a growing buffer ends up to twice as large) and the buffer is reused.
        let bytes = SERIALIZED.with_borrow_mut(|buffer| {
            buffer.clear();
            let _ = serde_json::to_writer(&mut *buffer, object);
            let bytes = Bytes::copy_from_slice(buffer);
            buffer.truncate(0);
            buffer.shrink_to(KEPT_BUFFER);
            bytes
        });
        StoredObject {
            resource_version,
            bytes,
            projection: Arc::new(project(object)),
        }
    }

    /// The object, parsed.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }

    /// This object at another resourceVersion (what its deletion's event carries). Only
    /// the metadata is rewritten; the rest of the bytes is copied, not parsed.
    fn at_resource_version(&self, resource_version: u64) -> StoredObject {
        self.clone().into_resource_version(resource_version)
    }

    /// [`at_resource_version`](Self::at_resource_version), taking this object's
    /// projection rather than copying it when nothing else shares it.
    fn into_resource_version(mut self, resource_version: u64) -> StoredObject {
        let version = json!(resource_version.to_string());
        let Some(bytes) = with_resource_version(&self.bytes, resource_version) else {
            let mut object = self.value();
            object["metadata"]["resourceVersion"] = version;
            return StoredObject::new(&object, resource_version);
        };
        Arc::make_mut(&mut self.projection)["metadata"]["resourceVersion"] = version;
        StoredObject {
            resource_version,
            bytes: Bytes::from(bytes),
            projection: self.projection,
        }
    }

    /// Where this object of bucket `storage` lives.
    pub fn key(&self, storage: &str) -> ObjectKey {
        let (namespace, name) = object_position(self);
        ObjectKey {
            storage: storage.to_string(),
            namespace,
            name,
        }
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        self.projection
            .at("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// The serialized object `bytes` with `metadata.resourceVersion` set to
/// `resource_version`, byte for byte what serializing the parsed and changed object would
/// give; `None` unless `bytes` is a compact JSON object whose metadata holds a
/// resourceVersion (as every stored object's does). Only the old value's place is found,
/// by a scan of strings and nesting that decodes nothing: a deletion's event copies the
/// rest of the object's bytes as they are.
fn with_resource_version(bytes: &[u8], resource_version: u64) -> Option<Vec<u8>> {
    let (metadata, _) = entry(bytes, 0, b"metadata")?;
    let (start, end) = entry(bytes, metadata, b"resourceVersion")?;
    let version = format!("\"{resource_version}\"");
    let mut out = Vec::with_capacity(bytes.len() + version.len());
    out.extend_from_slice(&bytes[..start]);
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&bytes[end..]);
    Some(out)
}

/// Where the value of entry `key` (a key without escapes) of the compact JSON object that
/// starts at `at` in `bytes` starts and ends; `None` when it has none or the bytes are not
/// such an object.
fn entry(bytes: &[u8], at: usize, key: &[u8]) -> Option<(usize, usize)> {
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    let mut at = at + 1;
    if bytes.get(at) == Some(&b'}') {
        return None;
    }
    loop {
        let key_end = string_end(bytes, at)?;
        if bytes.get(key_end) != Some(&b':') {
            return None;
        }
        let value_end = value_end(bytes, key_end + 1)?;
        if &bytes[at + 1..key_end - 1] == key {
            return Some((key_end + 1, value_end));
        }
        match bytes.get(value_end)? {
            b',' => at = value_end + 1,
            _ => return None,
        }
    }
}

/// One past the end of the compact JSON value that starts at `at` in `bytes`.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = at;
            loop {
                match bytes.get(at)? {
                    b'"' => {
                        at = string_end(bytes, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let rest = &bytes[at..];
            let len = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']'))
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

/// One past the closing quote of the JSON string whose opening quote is at `at`.
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let mut at = at + 1;
    loop {
        match bytes.get(at)? {
            b'"' => return Some(at + 1),
            b'\\' => at += 2,
            _ => at += 1,
        }
    }
}

fn object_position(object: &StoredObject) -> (String, String) {
    let meta = &object.projection["metadata"];
    let field = |f: &str| meta[f].as_str().unwrap_or("").to_string();
    (field("namespace"), field("name"))
}

/// Fields kept beside the bytes: metadata without managedFields, and the fields that
/// field selectors and the built-in controllers filter on.
fn project(object: &Value) -> Value {
    let mut projection = Map::new();
    if let Some(Value::Object(metadata)) = object.get("metadata") {
        let metadata: Map<String, Value> = metadata
            .iter()
            .filter(|(k, _)| k.as_str() != "managedFields" && k.as_str() != "annotations")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        projection.insert("metadata".into(), Value::Object(metadata));
    }
    for (section, fields) in SELECTABLE {
        let Some(Value::Object(source)) = object.get(*section) else {
            continue;
        };
        let picked: Map<String, Value> = fields
            .iter()
            .filter_map(|f| source.get(*f).map(|v| ((*f).to_string(), v.clone())))
            .collect();
        if !picked.is_empty() {
            projection.insert((*section).into(), Value::Object(picked));
        }
    }
    for field in ["reason", "type", "kind", "apiVersion", "reportingComponent"] {
        if let Some(v) = object.get(field).filter(|v| v.is_string()) {
            projection.insert(field.into(), v.clone());
        }
    }
    projection.into()
}

const SELECTABLE: &[(&str, &[&str])] = &[
    (
        "spec",
        &[
            "nodeName",
            "schedulerName",
            "restartPolicy",
            "unschedulable",
            "serviceAccountName",
            "hostNetwork",
        ],
    ),
    ("status", &["phase", "podIP", "podIPs", "nominatedNodeName"]),
    (
        "involvedObject",
        &[
            "kind",
            "name",
            "namespace",
            "uid",
            "apiVersion",
            "resourceVersion",
            "fieldPath",
        ],
    ),
    ("source", &["component"]),
];

/// What a watch sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as every watcher receives it.
#[derive(Clone, Debug)]
pub struct Change {
    pub event: EventType,
    pub key: ObjectKey,
    pub object: StoredObject,
    /// The projection before the change, so selector watches can tell entering from leaving.
    pub previous: Option<Arc<Value>>,
    /// The object parsed, once for all the in-process controllers that read it.
    parsed: OnceLock<Value>,
}

impl Change {
    /// This change without its parse.
    fn unparsed(&self) -> Change {
        Change {
            event: self.event,
            key: self.key.clone(),
            object: self.object.clone(),
            previous: self.previous.clone(),
            parsed: OnceLock::new(),
        }
    }

    /// The object after the change (before it, for a deletion), parsed on first use.
    pub fn value(&self) -> &Value {
        self.parsed.get_or_init(|| self.object.value())
    }
}

/// The changes a watch catches up on, and the receiver for the ones after them.
pub type Resumed = (Vec<Arc<Change>>, broadcast::Receiver<Arc<Change>>);

/// What a transaction decides to do with one object.
pub enum Write {
    /// Store this object (create or replace); the store sets `metadata.resourceVersion`.
    Put(Value),
    /// [`Put`](Write::Put) of an object serialized before the store's lock was taken:
    /// under the lock only its resourceVersion is written into the bytes.
    PutPrepared(Prepared),
    /// Remove the object.
    Delete,
    /// Leave it as it is.
    Keep,
}

/// An object to store, serialized (with its projection) by the writer before it takes
/// the store's lock, at a placeholder resourceVersion. Every write to the store holds
/// that one lock, so the serialization, the largest part of storing an object, is done
/// where writers do not wait for each other.
pub struct Prepared {
    object: Value,
    stored: StoredObject,
}

impl Prepared {
    pub fn new(mut object: Value) -> Prepared {
        object["metadata"]["resourceVersion"] = json!("0");
        let stored = StoredObject::new(&object, 0);
        Prepared { object, stored }
    }

    /// The object, to change it and prepare it again.
    pub fn into_object(self) -> Value {
        self.object
    }
}

/// Store failures that are not the caller's decision.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the requested resourceVersion {requested} is too old (history starts after {compacted})"
    )]
    Gone { requested: u64, compacted: u64 },
    #[error("writing the state dir: {0}")]
    Persist(#[from] PersistError),
}

/// How many changes watches can resume from; older resourceVersions get 410 Gone.
pub const DEFAULT_HISTORY: usize = 100_000;

/// How many bytes of objects the history holds at most, however few changes that is: a
/// change keeps its whole object, and 100,000 changes of pods (6 KiB each with their
/// managed fields) hold over half a GiB, every new page of which costs time to take from
/// the system. At thousands of changes a second this is still seconds of history, more
/// than a watcher that keeps reading falls behind.
pub const HISTORY_BYTES: usize = 256 << 20;
const CHANNEL_CAPACITY: usize = 1 << 16;

struct Inner {
    resource_version: u64,
    buckets: HashMap<String, BTreeMap<(String, String), StoredObject>>,
    uids: HashMap<String, ObjectKey>,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// The bytes of the objects in `history`, and the most it may hold.
    history_bytes: usize,
    history_bytes_limit: usize,
    /// Changes at or below this resourceVersion are no longer in `history`.
    compacted: u64,
    persist: Option<Persist>,
}

/// The cluster's objects. Cheap to share behind an `Arc`.
pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Arc<Change>>,
    parsed: Mutex<Parsed>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("resource_version", &self.resource_version())
            .finish_non_exhaustive()
    }
}

/// Objects of the buckets an in-process reader asked for, as their writer parsed them,
/// kept until that reader takes them: a write already holds the object it stored, and
/// parsing the stored bytes again would be most of the simulated kubelet's work in
/// reading a pod. Bounded: past [`PARSED_CAPACITY`] the oldest go, and the reader parses.
#[derive(Default)]
struct Parsed {
    storages: Vec<String>,
    objects: HashMap<ObjectKey, (u64, Value)>,
    order: VecDeque<(ObjectKey, u64)>,
}

/// How many parsed objects the store keeps for their reader at most.
const PARSED_CAPACITY: usize = 1024;

/// One page of a list.
pub struct Page {
    pub items: Vec<StoredObject>,
    pub resource_version: u64,
    /// Where the next page starts, when `limit` cut this one short.
    pub next: Option<(String, String)>,
    /// How many objects follow the page; unknown (`None`) for a filtered list, which stops
    /// at the first match past the page, as kube-apiserver leaves out `remainingItemCount`
    /// when a selector filters the list.
    pub remaining: Option<usize>,
}

impl Store {
    /// An empty store kept in memory only.
    pub fn in_memory(history_limit: usize) -> Self {
        Self::from_parts(Inner {
            resource_version: 1,
            buckets: HashMap::new(),
            uids: HashMap::new(),
            history: VecDeque::new(),
            history_limit,
            history_bytes: 0,
            history_bytes_limit: HISTORY_BYTES,
            compacted: 1,
            persist: None,
        })
    }

    /// A store whose every write is durable in `dir` before it is acknowledged; objects
    /// and resourceVersions written there by an earlier run (even one killed) come back.
    pub fn open(dir: &Path, history_limit: usize) -> Result<Self, StoreError> {
        let (persist, records, resource_version) = Persist::open(dir)?;
        let mut inner = Inner {
            resource_version: resource_version.max(1),
            buckets: HashMap::new(),
            uids: HashMap::new(),
            history: VecDeque::new(),
            history_limit,
            history_bytes: 0,
            history_bytes_limit: HISTORY_BYTES,
            compacted: resource_version.max(1),
            persist: None,
        };
        for (key, object) in records {
            let rv = object
                .at("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse().ok())
                .unwrap_or(resource_version);
            inner.insert(key, StoredObject::new(&object, rv));
        }
        inner.persist = Some(persist);
        Ok(Self::from_parts(inner))
    }

    fn from_parts(inner: Inner) -> Self {
        let (changes, _) = broadcast::channel(CHANNEL_CAPACITY);
        Store {
            inner: Mutex::new(inner),
            changes,
            parsed: Mutex::new(Parsed::default()),
        }
    }

    fn parsed(&self) -> MutexGuard<'_, Parsed> {
        self.parsed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on, keep the objects written to bucket `storage` parsed for
    /// [`take_parsed`](Self::take_parsed), when their writer offers them.
    pub fn keep_parsed(&self, storage: &str) {
        let mut parsed = self.parsed();
        if !parsed.storages.iter().any(|s| s == storage) {
            parsed.storages.push(storage.to_string());
        }
    }

    /// Whether objects written to bucket `storage` are kept parsed.
    pub fn keeps_parsed(&self, storage: &str) -> bool {
        self.parsed().storages.iter().any(|s| s == storage)
    }

    /// `object`, the object stored at `key` at `resource_version`, parsed by its writer:
    /// kept when its bucket is, dropped otherwise.
    pub fn offer_parsed(&self, key: &ObjectKey, resource_version: u64, object: Value) {
        let mut parsed = self.parsed();
        if !parsed.storages.contains(&key.storage) {
            return;
        }
        while parsed.order.len() >= PARSED_CAPACITY {
            let Some((oldest, version)) = parsed.order.pop_front() else {
                break;
            };
            if parsed
                .objects
                .get(&oldest)
                .is_some_and(|(v, _)| *v == version)
            {
                parsed.objects.remove(&oldest);
            }
        }
        parsed.order.push_back((key.clone(), resource_version));
        parsed
            .objects
            .insert(key.clone(), (resource_version, object));
    }

    /// The object at `key`, parsed, when it was kept at exactly `resource_version`; it is
    /// handed out once.
    pub fn take_parsed(&self, key: &ObjectKey, resource_version: u64) -> Option<Value> {
        let mut parsed = self.parsed();
        let kept = parsed.objects.get(key).map(|(version, _)| *version)?;
        if kept > resource_version {
            return None;
        }
        // An older state is dropped: its object has moved on.
        let (_, object) = parsed.objects.remove(key)?;
        (kept == resource_version).then_some(object)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation completes before the guard drops, so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().resource_version
    }

    /// One object.
    pub fn get(&self, key: &ObjectKey) -> Option<StoredObject> {
        let inner = self.lock();
        inner
            .buckets
            .get(&key.storage)?
            .get(&(key.namespace.clone(), key.name.clone()))
            .cloned()
    }

    /// The key of the object with this uid, if it exists.
    pub fn key_of_uid(&self, uid: &str) -> Option<ObjectKey> {
        self.lock().uids.get(uid).cloned()
    }

    /// Objects of a bucket (one namespace, or all when `namespace` is None) that pass
    /// `filter`, in key order, starting after `after`, at most `limit` of them.
    pub fn list(
        &self,
        storage: &str,
        namespace: Option<&str>,
        after: Option<&(String, String)>,
        limit: Option<usize>,
        filter: Option<&dyn Fn(&StoredObject) -> bool>,
    ) -> Page {
        let inner = self.lock();
        let resource_version = inner.resource_version;
        let Some(bucket) = inner.buckets.get(storage) else {
            return Page {
                items: Vec::new(),
                resource_version,
                next: None,
                remaining: filter.is_none().then_some(0),
            };
        };
        let start = match (after, namespace) {
            (Some(after), _) => Bound::Excluded(after.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut remaining = 0;
        for ((ns, _), object) in bucket.range((start, Bound::Unbounded)) {
            if namespace.is_some_and(|wanted| ns != wanted) {
                break;
            }
            if filter.is_some_and(|selects| !selects(object)) {
                continue;
            }
            if limit.is_some_and(|l| items.len() >= l) {
                remaining += 1;
                if filter.is_some() {
                    // A next page exists; how long it is stays unknown.
                    break;
                }
            } else {
                items.push(object.clone());
            }
        }
        // The continue token resumes after the last object returned.
        let next = (remaining > 0)
            .then(|| items.last().map(object_position))
            .flatten();
        Page {
            items,
            resource_version,
            next,
            remaining: filter.is_none().then_some(remaining),
        }
    }

    /// Reads the current object (if any), lets `decide` choose a write, and applies it
    /// atomically: durable first, then visible to readers and watchers.
    pub fn transact<E: From<StoreError>>(
        &self,
        key: &ObjectKey,
        decide: impl FnOnce(Option<&StoredObject>) -> Result<Write, E>,
    ) -> Result<Option<StoredObject>, E> {
        self.transact_value(key, decide).map(|(stored, _)| stored)
    }

    /// [`transact`](Self::transact), also giving back the object a `Put` stored, parsed
    /// (what `stored.value()` would parse again from its bytes).
    pub fn transact_value<E: From<StoreError>>(
        &self,
        key: &ObjectKey,
        decide: impl FnOnce(Option<&StoredObject>) -> Result<Write, E>,
    ) -> Result<(Option<StoredObject>, Option<Value>), E> {
        let mut inner = self.lock();
        let current = inner
            .buckets
            .get(&key.storage)
            .and_then(|b| b.get(&(key.namespace.clone(), key.name.clone())))
            .cloned();
        let mut put = None;
        let (event, stored) = match decide(current.as_ref())? {
            Write::Keep => return Ok((current, None)),
            Write::Put(mut object) => {
                let rv = inner.resource_version + 1;
                object["metadata"]["resourceVersion"] = json!(rv.to_string());
                let stored = StoredObject::new(&object, rv);
                put = Some(object);
                (put_event(current.as_ref()), stored)
            }
            Write::PutPrepared(Prepared { mut object, stored }) => {
                let rv = inner.resource_version + 1;
                object["metadata"]["resourceVersion"] = json!(rv.to_string());
                put = Some(object);
                (
                    put_event(current.as_ref()),
                    stored.into_resource_version(rv),
                )
            }
            Write::Delete => {
                let Some(current) = &current else {
                    return Ok((None, None));
                };
                let rv = inner.resource_version + 1;
                (EventType::Deleted, current.at_resource_version(rv))
            }
        };
        if let Some(persist) = inner.persist.as_mut() {
            let record = match event {
                EventType::Deleted => Record::delete(key, stored.resource_version),
                _ => Record::put(key, stored.resource_version, &stored.bytes),
            };
            persist.append(&record).map_err(StoreError::from)?;
        }
        inner.resource_version = stored.resource_version;
        match event {
            EventType::Deleted => inner.remove(key),
            _ => inner.insert(key.clone(), stored.clone()),
        }
        let change = Arc::new(Change {
            event,
            key: key.clone(),
            object: stored.clone(),
            previous: current.map(|c| c.projection),
            parsed: OnceLock::new(),
        });
        // History keeps a change of its own, so the parse the in-process controllers
        // share is freed once they have all read the broadcast; a watch resuming from
        // history sends the stored bytes and never needs it.
        inner.remember(Arc::new(change.unparsed()));
        if let Some(persist) = inner.persist.as_mut()
            && persist.wants_compaction()
        {
            let snapshot = inner.snapshot();
            let rv = inner.resource_version;
            if let Some(persist) = inner.persist.as_mut() {
                // A failed compaction leaves the log intact; the write itself is already durable.
                if let Err(err) = persist.compact(rv, snapshot) {
                    tracing::warn!(%err, "state dir compaction failed");
                }
            }
        }
        // No receiver is not an error: nobody is watching.
        let _ = self.changes.send(change);
        Ok((Some(stored).filter(|_| event != EventType::Deleted), put))
    }

    /// Changes after `resource_version` still in history, plus a receiver for the ones to
    /// come, with no gap between them. 410 Gone when the history no longer reaches back.
    pub fn watch_from(&self, resource_version: u64) -> Result<Resumed, StoreError> {
        let inner = self.lock();
        if resource_version < inner.compacted {
            return Err(StoreError::Gone {
                requested: resource_version,
                compacted: inner.compacted,
            });
        }
        let start = inner
            .history
            .partition_point(|c| c.object.resource_version <= resource_version);
        let backlog = inner.history.range(start..).cloned().collect();
        Ok((backlog, self.changes.subscribe()))
    }

    /// A receiver of every change from now on (for in-process controllers).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// A follower of every change from now on, which resumes from history when it falls
    /// behind (for in-process controllers).
    pub fn follow(self: &Arc<Self>) -> Follower {
        let (receiver, seen) = self.subscribe_at();
        self.follow_from(receiver, seen)
    }

    /// A follower that goes on from `receiver`, which has everything after `seen`.
    pub fn follow_from(
        self: &Arc<Self>,
        receiver: broadcast::Receiver<Arc<Change>>,
        seen: u64,
    ) -> Follower {
        Follower {
            store: self.clone(),
            receiver,
            backlog: VecDeque::new(),
            seen,
        }
    }

    /// A receiver of the changes after the returned resourceVersion, exactly: changes are
    /// sent under the lock, so none falls between the two.
    fn subscribe_at(&self) -> (broadcast::Receiver<Arc<Change>>, u64) {
        let inner = self.lock();
        (self.changes.subscribe(), inner.resource_version)
    }

    /// Visits every object of every bucket (with its bucket's name) in one consistent
    /// read; `visit` runs under the store's lock, so it must be quick.
    pub fn scan(&self, mut visit: impl FnMut(&str, &StoredObject)) {
        let inner = self.lock();
        for (storage, bucket) in &inner.buckets {
            for object in bucket.values() {
                visit(storage, object);
            }
        }
    }
}

/// What a [`Follower`] hands out next.
pub enum Followed {
    /// The next change, in resourceVersion order.
    Change(Arc<Change>),
    /// Changes were missed beyond the history: rebuild from the store's objects (the
    /// changes after this point follow as usual).
    Restart,
}

/// An in-process controller's place in the change stream. A controller that falls a
/// whole broadcast behind resumes from the history, as a watch does, and only past the
/// history must it start over from the full state (kube's reflector: re-watch from the
/// last resourceVersion, relist on 410 Gone). A slow turn costs a catch-up, not a relist.
pub struct Follower {
    store: Arc<Store>,
    receiver: broadcast::Receiver<Arc<Change>>,
    /// Changes read back from the history, handed out before the receiver's.
    backlog: VecDeque<Arc<Change>>,
    /// The resourceVersion of the last change handed out (or of the start).
    seen: u64,
}

impl Follower {
    /// The resourceVersion of the last change handed out (or where following started):
    /// every change up to it has been handed out.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The next change; `None` once the store has closed. Cancel-safe.
    pub async fn next(&mut self) -> Option<Followed> {
        loop {
            if let Some(followed) = self.next_missed() {
                return Some(followed);
            }
            match self.receiver.recv().await {
                Ok(change) => {
                    if let Some(followed) = self.hand_out(change) {
                        return Some(followed);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if let Some(restart) = self.resume() {
                        return Some(restart);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next change already sent, without waiting: `Ok(None)` when there is none yet,
    /// `Err(Closed)` once the store has closed.
    pub fn try_next(&mut self) -> Result<Option<Followed>, Closed> {
        loop {
            if let Some(followed) = self.next_missed() {
                return Ok(Some(followed));
            }
            match self.receiver.try_recv() {
                Ok(change) => {
                    if let Some(followed) = self.hand_out(change) {
                        return Ok(Some(followed));
                    }
                }
                Err(broadcast::error::TryRecvError::Empty) => return Ok(None),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    if let Some(restart) = self.resume() {
                        return Ok(Some(restart));
                    }
                }
                Err(broadcast::error::TryRecvError::Closed) => return Err(Closed),
            }
        }
    }

    fn next_missed(&mut self) -> Option<Followed> {
        while let Some(change) = self.backlog.pop_front() {
            if let Some(followed) = self.hand_out(change) {
                return Some(followed);
            }
        }
        None
    }

    /// The change, unless it was handed out already.
    fn hand_out(&mut self, change: Arc<Change>) -> Option<Followed> {
        if change.object.resource_version <= self.seen {
            return None;
        }
        self.seen = change.object.resource_version;
        Some(Followed::Change(change))
    }

    /// After falling behind the broadcast: the missed changes from the history, or
    /// `Restart` when the history no longer reaches back to them.
    fn resume(&mut self) -> Option<Followed> {
        match self.store.watch_from(self.seen) {
            Ok((backlog, receiver)) => {
                tracing::debug!(
                    missed = backlog.len(),
                    "a follower of the change stream resumes from the history"
                );
                self.backlog = backlog.into();
                self.receiver = receiver;
                None
            }
            Err(_) => {
                tracing::debug!("a follower of the change stream fell behind the history");
                let (receiver, seen) = self.store.subscribe_at();
                self.receiver = receiver;
                self.backlog.clear();
                self.seen = seen;
                Some(Followed::Restart)
            }
        }
    }
}

/// The store's change stream has closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

impl Inner {
    fn insert(&mut self, key: ObjectKey, object: StoredObject) {
        let uid = object.uid().to_string();
        if !uid.is_empty() {
            self.uids.insert(uid, key.clone());
        }
        self.buckets
            .entry(key.storage)
            .or_default()
            .insert((key.namespace, key.name), object);
    }

    fn remove(&mut self, key: &ObjectKey) {
        let removed = self
            .buckets
            .get_mut(&key.storage)
            .and_then(|b| b.remove(&(key.namespace.clone(), key.name.clone())));
        if let Some(object) = removed {
            self.uids.remove(object.uid());
        }
    }

    fn remember(&mut self, change: Arc<Change>) {
        self.history_bytes += change.object.bytes.len();
        self.history.push_back(change);
        while self.history.len() > self.history_limit
            || (self.history_bytes > self.history_bytes_limit && self.history.len() > 1)
        {
            if let Some(old) = self.history.pop_front() {
                self.history_bytes -= old.object.bytes.len();
                self.compacted = old.object.resource_version;
            }
        }
    }

    fn snapshot(&self) -> Vec<(ObjectKey, Bytes)> {
        let mut all = Vec::new();
        for (storage, bucket) in &self.buckets {
            for ((namespace, name), object) in bucket {
                all.push((
                    ObjectKey::new(storage, namespace, name),
                    object.bytes.clone(),
                ));
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
               "spec": {"nodeName": "worker-1"}})
    }

    /// An object serialized before the lock is stored exactly as one serialized under it:
    /// the same bytes, projection and answer, at the store's next resourceVersion.
    #[test]
    fn a_prepared_put_stores_what_a_put_stores() {
        let store = Store::in_memory(100);
        let mut object = pod("a");
        object["metadata"]["labels"] = json!({"app": "x"});
        object["metadata"]["resourceVersion"] = json!("17");
        let key = |name: &str| ObjectKey::new("pods", "default", name);
        let (plain, plain_written) = store
            .transact_value::<StoreError>(&key("a"), |_| Ok(Write::Put(object.clone())))
            .expect("put");
        let (prepared, prepared_written) = store
            .transact_value::<StoreError>(&key("a"), |_| {
                Ok(Write::PutPrepared(Prepared::new(object.clone())))
            })
            .expect("prepared put");
        let (plain, prepared) = (plain.expect("stored"), prepared.expect("stored"));
        assert_eq!(prepared.resource_version, plain.resource_version + 1);
        let at_plain = prepared.at_resource_version(plain.resource_version);
        assert_eq!(at_plain.bytes, plain.bytes);
        assert_eq!(at_plain.projection, plain.projection);
        let mut written = prepared_written.expect("written");
        assert_eq!(
            written["metadata"]["resourceVersion"],
            json!(prepared.resource_version.to_string())
        );
        written["metadata"]["resourceVersion"] = json!(plain.resource_version.to_string());
        assert_eq!(Some(written), plain_written);
        assert_eq!(store.get(&key("a")).expect("stored").bytes, prepared.bytes);
    }

    fn put(store: &Store, name: &str) -> StoredObject {
        let key = ObjectKey::new("pods", "default", name);
        store
            .transact::<StoreError>(&key, |_| Ok(Write::Put(pod(name))))
            .expect("write")
            .expect("stored")
    }

    /// Parses are kept only for the buckets asked for, handed out once and only at their
    /// exact resourceVersion, and bounded, the oldest going first.
    #[test]
    fn kept_parses_are_taken_once_at_their_version() {
        let store = Store::in_memory(10);
        let key = ObjectKey::new("pods", "default", "a");
        store.offer_parsed(&key, 5, pod("a"));
        assert_eq!(store.take_parsed(&key, 5), None, "pods are not kept yet");

        store.keep_parsed("pods");
        assert!(store.keeps_parsed("pods") && !store.keeps_parsed("nodes"));
        store.offer_parsed(&key, 5, pod("a"));
        assert_eq!(
            store.take_parsed(&key, 4),
            None,
            "a reader behind the parse"
        );
        assert_eq!(store.take_parsed(&key, 5), Some(pod("a")));
        assert_eq!(store.take_parsed(&key, 5), None, "handed out once");

        store.offer_parsed(&key, 6, pod("a"));
        assert_eq!(store.take_parsed(&key, 7), None, "the object moved on");
        assert_eq!(
            store.take_parsed(&key, 6),
            None,
            "the stale parse was dropped"
        );

        let other = ObjectKey::new("nodes", "", "n1");
        store.offer_parsed(&other, 8, pod("n1"));
        assert_eq!(store.take_parsed(&other, 8), None, "nodes are not kept");

        for i in 0..=PARSED_CAPACITY {
            let key = ObjectKey::new("pods", "default", &format!("p{i}"));
            store.offer_parsed(&key, 10 + i as u64, pod("p"));
        }
        let first = ObjectKey::new("pods", "default", "p0");
        assert_eq!(store.take_parsed(&first, 10), None, "the oldest went");
        let last = ObjectKey::new("pods", "default", &format!("p{PARSED_CAPACITY}"));
        let version = 10 + PARSED_CAPACITY as u64;
        assert_eq!(store.take_parsed(&last, version), Some(pod("p")));
    }

    /// The history holds at most its bytes' worth of objects, however few changes that is.
    #[test]
    fn the_history_is_bounded_by_bytes_too() {
        let store = Store::in_memory(100);
        let first = put(&store, "a");
        store.lock().history_bytes_limit = first.bytes.len() * 3;
        put(&store, "b");
        put(&store, "c");
        let before_first = first.resource_version - 1;
        assert!(store.watch_from(before_first).is_ok(), "three objects fit");
        put(&store, "d");
        assert!(matches!(
            store.watch_from(before_first),
            Err(StoreError::Gone { .. })
        ));
        let (backlog, _) = store
            .watch_from(first.resource_version)
            .expect("the last three are kept");
        assert_eq!(backlog.len(), 3);
    }

    #[test]
    fn resource_versions_grow_across_the_whole_cluster() {
        let store = Store::in_memory(10);
        let a = put(&store, "a");
        let b = put(&store, "b");
        assert!(b.resource_version > a.resource_version);
        assert_eq!(
            b.value()["metadata"]["resourceVersion"],
            json!(b.resource_version.to_string())
        );
        assert_eq!(b.projection["spec"]["nodeName"], "worker-1");
        assert_eq!(store.key_of_uid("uid-a").map(|k| k.name), Some("a".into()));
    }

    #[test]
    fn lists_page_in_key_order() {
        let store = Store::in_memory(10);
        for name in ["c", "a", "b"] {
            put(&store, name);
        }
        let first = store.list("pods", Some("default"), None, Some(2), None);
        let names: Vec<String> = first
            .items
            .iter()
            .map(|o| {
                o.projection["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(first.remaining, Some(1));
        let rest = store.list("pods", Some("default"), first.next.as_ref(), Some(2), None);
        assert_eq!(rest.items.len(), 1);
        assert!(rest.next.is_none());
    }

    #[test]
    fn watch_resumes_from_history_and_is_gone_past_it() {
        let store = Store::in_memory(2);
        let a = put(&store, "a");
        put(&store, "b");
        put(&store, "c");
        assert!(matches!(
            store.watch_from(a.resource_version - 1),
            Err(StoreError::Gone { .. })
        ));
        let (backlog, _) = store.watch_from(a.resource_version).expect("in history");
        assert_eq!(backlog.len(), 2);
    }

    /// Writes `count` pods named after their number.
    fn put_many(store: &Store, count: usize) {
        for i in 0..count {
            put(store, &format!("p{i}"));
        }
    }

    #[tokio::test]
    async fn a_follower_a_broadcast_behind_resumes_from_the_history() {
        let store = Arc::new(Store::in_memory(CHANNEL_CAPACITY * 2));
        let mut follower = store.follow();
        let start = store.resource_version();
        put_many(&store, CHANNEL_CAPACITY + 10);
        let mut expected = start;
        while let Ok(Some(followed)) = follower.try_next() {
            let Followed::Change(change) = followed else {
                panic!("the history reaches back: no restart");
            };
            expected += 1;
            assert_eq!(
                change.object.resource_version, expected,
                "in order, none missed"
            );
        }
        assert_eq!(expected, store.resource_version());
    }

    #[tokio::test]
    async fn a_follower_behind_the_history_restarts() {
        let store = Arc::new(Store::in_memory(10));
        let mut follower = store.follow();
        put_many(&store, CHANNEL_CAPACITY + 10);
        assert!(matches!(follower.try_next(), Ok(Some(Followed::Restart))));
        assert!(
            matches!(follower.try_next(), Ok(None)),
            "caught up after the restart"
        );
        put(&store, "after");
        let Ok(Some(Followed::Change(change))) = follower.try_next() else {
            panic!("the change after the restart");
        };
        assert_eq!(change.object.resource_version, store.resource_version());
    }

    #[test]
    fn a_resource_version_set_in_the_bytes_reads_as_set_in_the_object() {
        let cases = [
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "a", "resourceVersion": "7", "labels": {"resourceVersion": "7"},
                                "annotations": {"note": "\"resourceVersion\":\"7\" \\ {[\"", "empty": ""},
                                "finalizers": [], "generation": 3, "deletionGracePeriodSeconds": null},
                   "spec": {"nodeName": "n1", "note": "a \"quoted\" {brace} ]", "list": [[1, {"a": [true]}], -1.5e3]},
                   "involvedObject": {"resourceVersion": "7"}}),
            json!({"kind": "Event", "involvedObject": {"kind": "Node", "resourceVersion": "3"},
                   "metadata": {"resourceVersion": "9"}, "zzz": {"resourceVersion": "1"}}),
            json!({"metadata": {"name": "ünïcode ✓", "resourceVersion": "1", "uid": "u"}}),
        ];
        for object in cases {
            let bytes = serde_json::to_vec(&object).expect("serialize");
            let mut expected = object.clone();
            expected["metadata"]["resourceVersion"] = json!("12");
            let spliced = with_resource_version(&bytes, 12).expect("metadata with a version");
            assert_eq!(
                String::from_utf8(spliced).expect("utf-8"),
                serde_json::to_string(&expected).expect("serialize")
            );
        }
        for unusual in [
            &br#"{"kind":"ConfigMap","metadata":{"name":"no-version"}}"#[..],
            br#"{"kind":"x"}"#,
            br#"{"metadata":"resourceVersion"}"#,
            br#"{ "metadata": {"resourceVersion": "1"}}"#,
            br#"{"metadata":{"resourceVersion":"1""#,
            b"{}",
            b"[1]",
            b"",
        ] {
            assert_eq!(with_resource_version(unusual, 1), None, "{unusual:?}");
        }
    }

    #[test]
    fn a_deletion_carries_the_object_at_its_new_resource_version() {
        for object in [
            json!({"metadata": {"name": "no-version"}, "data": {"k": "v"}}),
            json!({"metadata": {"name": "a", "resourceVersion": "4"}, "data": {"k": "v"}}),
        ] {
            let deleted = StoredObject::new(&object, 4).at_resource_version(12);
            let mut expected = object.clone();
            expected["metadata"]["resourceVersion"] = json!("12");
            assert_eq!(deleted.resource_version, 12);
            assert_eq!(deleted.value(), expected);
            assert_eq!(
                deleted.bytes,
                serde_json::to_vec(&expected).expect("serialize")
            );
            assert_eq!(
                deleted.projection["metadata"]["resourceVersion"],
                json!("12")
            );
        }
    }

    #[test]
    fn delete_reports_the_last_state_with_a_new_resource_version() {
        let store = Store::in_memory(10);
        let a = put(&store, "a");
        let mut rx = store.subscribe();
        let key = ObjectKey::new("pods", "default", "a");
        let gone = store
            .transact::<StoreError>(&key, |_| Ok(Write::Delete))
            .expect("delete");
        assert!(gone.is_none() && store.get(&key).is_none());
        let change = rx.try_recv().expect("event");
        assert_eq!(change.event, EventType::Deleted);
        assert!(change.object.resource_version > a.resource_version);
    }
}
