//! What the workload controllers (DaemonSet, StatefulSet) share: their in-memory view of
//! the objects they watch, kept from the store's change stream; the pods and
//! ControllerRevisions they control, grouped by owner; revision hashing; the queue of
//! owners to reconcile; and the loop that drives a controller.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::{Api, DeleteOptions, Deleted, PatchType, WriteOptions};
use crate::errors::ApiError;
use crate::pointer::Pointer;
use crate::resources::Resource;
use crate::store::{Change, Closed, EventType, Followed, Follower, StoredObject};
use capstan_api::clock::parse_time;

/// An object's namespace and name.
pub(in crate::sim) type Key = (String, String);

/// How many changes one round takes in before reconciling, so a flood of events cannot
/// starve the owners waiting on the queue.
const DRAIN_LIMIT: usize = 20_000;

/// One object as last seen.
#[derive(Clone, Debug)]
pub(in crate::sim) struct Cached<T> {
    pub uid: String,
    pub resource_version: u64,
    pub item: T,
}

/// What applying a change did.
pub(in crate::sim) enum Applied<T> {
    /// Older than what is cached: ignored.
    Stale,
    /// Applied; this is what it replaced or removed.
    Replaced(Option<Cached<T>>),
}

/// Objects of one kind as last seen. A version older than the cached one loses, so the
/// controller's own writes, recorded at once, are not undone by events still in flight.
pub(in crate::sim) struct Cache<T> {
    entries: HashMap<Key, Cached<T>>,
    /// uids this controller removed whose DELETED event has not arrived yet.
    removed: HashSet<String>,
}

impl<T> Default for Cache<T> {
    fn default() -> Self {
        Cache {
            entries: HashMap::new(),
            removed: HashSet::new(),
        }
    }
}

impl<T> Cache<T> {
    pub fn clear(&mut self) {
        self.entries.clear();
        self.removed.clear();
    }

    pub fn get(&self, key: &Key) -> Option<&Cached<T>> {
        self.entries.get(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Cached<T>)> {
        self.entries.iter()
    }

    /// Stores a version of an object unless a newer one is cached or it was removed.
    pub fn put(&mut self, key: Key, uid: &str, resource_version: u64, item: T) -> Applied<T> {
        if self.removed.contains(uid)
            || self
                .entries
                .get(&key)
                .is_some_and(|c| c.resource_version > resource_version)
        {
            return Applied::Stale;
        }
        let entry = Cached {
            uid: uid.to_string(),
            resource_version,
            item,
        };
        Applied::Replaced(self.entries.insert(key, entry))
    }

    /// Removes an object whose deletion (at `resource_version`) was observed.
    pub fn remove(&mut self, key: &Key, uid: &str, resource_version: u64) -> Applied<T> {
        self.removed.remove(uid);
        // A newer incarnation under the same name stays.
        if self
            .entries
            .get(key)
            .is_some_and(|c| c.resource_version > resource_version)
        {
            return Applied::Stale;
        }
        Applied::Replaced(self.entries.remove(key))
    }

    /// Stores an object as the API returned it from this controller's own write.
    pub fn record(&mut self, object: &Value, item: T) {
        let (key, uid, resource_version) = identity(object);
        self.put(key, &uid, resource_version, item);
    }

    /// Removes an object this controller deleted, ignoring its changes still in flight.
    pub fn forget(&mut self, key: &Key) -> Option<Cached<T>> {
        let gone = self.entries.remove(key)?;
        self.removed.insert(gone.uid.clone());
        Some(gone)
    }

    /// Applies a change from the store with `parse` making the cached item.
    pub fn observe(
        &mut self,
        change: &Change,
        parse: impl FnOnce(&StoredObject) -> T,
    ) -> Applied<T> {
        let key = (change.key.namespace.clone(), change.key.name.clone());
        let object = &change.object;
        match change.event {
            EventType::Deleted => self.remove(&key, object.uid(), object.resource_version),
            EventType::Added | EventType::Modified => {
                let item = parse(object);
                self.put(key, object.uid(), object.resource_version, item)
            }
        }
    }
}

/// Identity and version of an object as written by the API.
fn identity(object: &Value) -> (Key, String, u64) {
    let meta = &object["metadata"];
    let field = |f: &str| meta[f].as_str().unwrap_or("").to_string();
    let resource_version = field("resourceVersion").parse().unwrap_or(0);
    (
        (field("namespace"), field("name")),
        field("uid"),
        resource_version,
    )
}

/// The owner an object names as its controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::sim) struct OwnerRef {
    pub name: String,
    pub uid: String,
}

/// The controller reference of `kind` in an object's metadata (`ownerReferences` with
/// `controller: true`).
pub(in crate::sim) fn controller_of(metadata: &Value, kind: &str) -> Option<OwnerRef> {
    metadata
        .get("ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r["controller"] == true)
        .filter(|r| r["kind"] == kind)
        .map(|r| OwnerRef {
            name: r["name"].as_str().unwrap_or("").to_string(),
            uid: r["uid"].as_str().unwrap_or("").to_string(),
        })
}

/// Objects of one kind controlled by owners of another, grouped by owner uid.
pub(in crate::sim) struct OwnedIndex<T> {
    owner_kind: &'static str,
    parse: fn(&Value) -> T,
    objects: Cache<(OwnerRef, T)>,
    by_owner: HashMap<String, HashSet<Key>>,
}

impl<T> OwnedIndex<T> {
    pub fn new(owner_kind: &'static str, parse: fn(&Value) -> T) -> Self {
        OwnedIndex {
            owner_kind,
            parse,
            objects: Cache::default(),
            by_owner: HashMap::new(),
        }
    }

    /// Rebuilds the index from every object of `storage`.
    pub fn resync(&mut self, api: &Api, storage: &str) {
        self.objects.clear();
        self.by_owner.clear();
        for object in api.store.list(storage, None, None, None, None).items {
            let Some(owner) = controller_of(&object.projection["metadata"], self.owner_kind) else {
                continue;
            };
            let (key, uid, _) = identity(&object.projection);
            let item = (self.parse)(&object.value());
            self.link(&key, &owner);
            self.objects
                .put(key, &uid, object.resource_version, (owner, item));
        }
    }

    /// Applies one change; returns the owners (namespace, name) whose objects changed.
    pub fn observe(&mut self, change: &Change) -> Vec<Key> {
        let key = (change.key.namespace.clone(), change.key.name.clone());
        let owner = controller_of(&change.object.projection["metadata"], self.owner_kind);
        let applied = match (&change.event, owner) {
            // Gone, or no longer controlled by an owner of this kind.
            (EventType::Deleted, _) | (_, None) => {
                self.objects
                    .remove(&key, change.object.uid(), change.object.resource_version)
            }
            (_, Some(owner)) => {
                let parse = self.parse;
                let applied = self
                    .objects
                    .observe(change, |object| (owner, parse(&object.value())));
                if let Some(cached) = self.objects.get(&key) {
                    let owner = cached.item.0.clone();
                    self.link(&key, &owner);
                }
                applied
            }
        };
        let Applied::Replaced(before) = applied else {
            return Vec::new();
        };
        let mut owners = Vec::new();
        if let Some(before) = before {
            let owner = before.item.0;
            let still = self
                .objects
                .get(&key)
                .is_some_and(|c| c.item.0.uid == owner.uid);
            if !still {
                self.unlink(&key, &owner.uid);
            }
            owners.push((key.0.clone(), owner.name));
        }
        if let Some(cached) = self.objects.get(&key) {
            let owner = (key.0.clone(), cached.item.0.name.clone());
            if !owners.contains(&owner) {
                owners.push(owner);
            }
        }
        owners
    }

    /// Records an object this controller just created or marked for deletion.
    pub fn record(&mut self, object: &Value) {
        let Some(owner) = controller_of(&object["metadata"], self.owner_kind) else {
            return;
        };
        let (key, uid, resource_version) = identity(object);
        let item = (self.parse)(object);
        self.link(&key, &owner);
        self.objects.put(key, &uid, resource_version, (owner, item));
    }

    /// Records that this controller deleted an object outright.
    pub fn record_removed(&mut self, key: &Key) {
        if let Some(gone) = self.objects.forget(key) {
            self.unlink(key, &gone.item.0.uid);
        }
    }

    /// The objects `owner_uid` controls.
    pub fn owned_by(&self, owner_uid: &str) -> Vec<&T> {
        self.by_owner
            .get(owner_uid)
            .into_iter()
            .flatten()
            .filter_map(|key| self.objects.get(key))
            .map(|cached| &cached.item.1)
            .collect()
    }

    fn link(&mut self, key: &Key, owner: &OwnerRef) {
        self.by_owner
            .entry(owner.uid.clone())
            .or_default()
            .insert(key.clone());
    }

    fn unlink(&mut self, key: &Key, owner_uid: &str) {
        if let Some(keys) = self.by_owner.get_mut(owner_uid) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_owner.remove(owner_uid);
            }
        }
    }
}

/// The pods and ControllerRevisions that owners of one kind control.
pub(in crate::sim) struct Dependents {
    pub pods: OwnedIndex<OwnedPod>,
    pub revisions: OwnedIndex<Revision>,
}

impl Dependents {
    pub fn new(owner_kind: &'static str) -> Self {
        Dependents {
            pods: OwnedIndex::new(owner_kind, OwnedPod::from_object),
            revisions: OwnedIndex::new(owner_kind, Revision::from_object),
        }
    }

    pub fn resync(&mut self, api: &Api) {
        self.pods.resync(api, "pods");
        self.revisions.resync(api, "controllerrevisions");
    }

    /// Applies a change of a pod or ControllerRevision; returns the owners it concerns
    /// (none for other kinds).
    pub fn observe(&mut self, change: &Change) -> Vec<Key> {
        match change.key.storage.as_str() {
            "pods" => self.pods.observe(change),
            "controllerrevisions" => self.revisions.observe(change),
            _ => Vec::new(),
        }
    }
}

/// A workload object (DaemonSet, StatefulSet) as its pods and revisions refer to it.
#[derive(Clone, Debug)]
pub(in crate::sim) struct Owner {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    /// Marked for deletion: the controllers leave it to the garbage collector.
    pub deleting: bool,
    pub annotations: Value,
}

impl Owner {
    pub fn from_object(kind: &'static str, object: &Value) -> Self {
        let meta = &object["metadata"];
        let text = |field: &str| meta[field].as_str().unwrap_or("").to_string();
        Owner {
            kind,
            namespace: text("namespace"),
            name: text("name"),
            uid: text("uid"),
            generation: meta["generation"].as_i64().unwrap_or(0),
            deleting: meta.get("deletionTimestamp").is_some_and(|t| !t.is_null()),
            annotations: meta.get("annotations").cloned().unwrap_or(Value::Null),
        }
    }

    pub fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }

    /// The controller reference its pods and revisions carry.
    pub fn reference(&self) -> Value {
        json!({"apiVersion": "apps/v1", "kind": self.kind, "name": self.name, "uid": self.uid,
               "controller": true, "blockOwnerDeletion": true})
    }

    /// A ControllerRevision of this owner: the owner's annotations, `labels`, and `data`
    /// numbered `revision`.
    pub fn controller_revision(
        &self,
        name: &str,
        labels: Map<String, Value>,
        data: Value,
        revision: i64,
    ) -> Value {
        let mut metadata = json!({
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.reference()],
        });
        if self.annotations.is_object() {
            metadata["annotations"] = self.annotations.clone();
        }
        json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": metadata,
               "data": data, "revision": revision})
    }

    /// A pod of this owner from a pod template (upstream `GetPodFromTemplate`): the
    /// template's annotations, finalizers and spec, `labels`, and the controller
    /// reference; the caller names it.
    pub fn pod_from_template(&self, template: &Value, labels: Map<String, Value>) -> Value {
        let template_meta = &template["metadata"];
        let mut metadata = json!({
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.reference()],
        });
        for field in ["annotations", "finalizers"] {
            if let Some(value) = template_meta.get(field).filter(|v| !v.is_null()) {
                metadata[field] = value.clone();
            }
        }
        let spec = template
            .get("spec")
            .filter(|s| s.is_object())
            .cloned()
            .unwrap_or(json!({}));
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
    }
}

/// A template's labels with `extra` added.
pub(in crate::sim) fn template_labels(
    template: &Value,
    extra: &[(&str, &str)],
) -> Map<String, Value> {
    let mut labels = template["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (key, value) in extra {
        labels.insert((*key).to_string(), json!(value));
    }
    labels
}

/// Deletes one of `pods` and records the outcome: gone, or terminating.
pub(in crate::sim) fn delete_pod(
    api: &Api,
    resource: &Resource,
    pods: &mut OwnedIndex<OwnedPod>,
    key: &Key,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    match api.delete(resource, &key.0, &key.1, options) {
        Ok(Deleted::Now(_)) => pods.record_removed(key),
        Ok(Deleted::Pending(object)) => pods.record(&object.into_value()),
        Err(err) if err.code == 404 => pods.record_removed(key),
        Err(err) => return Err(err),
    }
    Ok(())
}

/// What became of a status write.
pub(in crate::sim) enum StatusWrite {
    /// Written; the object as stored.
    Written(Value),
    /// Written too recently; try again after this long.
    Wait(Duration),
    Failed(ApiError),
}

/// Writes the status of one kind of workload, each object at most once per interval
/// while its status keeps changing.
pub(in crate::sim) struct StatusWriter {
    resource: Arc<Resource>,
    manager: &'static str,
    interval: Duration,
    last: HashMap<Key, Instant>,
}

impl StatusWriter {
    pub fn new(resource: Arc<Resource>, manager: &'static str, interval: Duration) -> Self {
        StatusWriter {
            resource,
            manager,
            interval,
            last: HashMap::new(),
        }
    }

    /// Writes `patch` (a merge patch of the status subresource) unless the owner's last
    /// write is too recent.
    pub fn write(&mut self, api: &Api, owner: &Owner, patch: Value) -> StatusWrite {
        let key = owner.key();
        let now = Instant::now();
        if let Some(last) = self.last.get(&key)
            && *last + self.interval > now
        {
            return StatusWrite::Wait(*last + self.interval - now);
        }
        let result = api.patch(
            &self.resource,
            &owner.namespace,
            &owner.name,
            Some("status"),
            PatchType::Merge,
            patch,
            &write_options(self.manager),
        );
        match result {
            Ok(written) => {
                self.last.insert(key, now);
                StatusWrite::Written(written)
            }
            Err(err) => StatusWrite::Failed(err),
        }
    }

    pub fn forget(&mut self, key: &Key) {
        self.last.remove(key);
    }
}

/// A pod as the workload controllers look at it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::sim) struct OwnedPod {
    pub name: String,
    /// `spec.nodeName`, or the node a DaemonSet pod's affinity pins it to.
    pub node: String,
    pub labels: Map<String, Value>,
    pub phase: String,
    /// The Ready condition is True.
    pub ready: bool,
    /// When the Ready condition last changed.
    pub ready_since: Option<Timestamp>,
    /// Marked for deletion (`deletionTimestamp`), still terminating.
    pub deleting: bool,
    pub created: Option<Timestamp>,
}

impl OwnedPod {
    pub fn from_object(pod: &Value) -> Self {
        let meta = &pod["metadata"];
        let ready_condition = pod
            .at("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready");
        OwnedPod {
            name: meta["name"].as_str().unwrap_or("").to_string(),
            node: target_node(pod),
            labels: meta["labels"].as_object().cloned().unwrap_or_default(),
            phase: pod
                .at("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            ready: ready_condition.is_some_and(|c| c["status"] == "True"),
            ready_since: ready_condition
                .and_then(|c| c["lastTransitionTime"].as_str())
                .and_then(parse_time),
            deleting: meta.get("deletionTimestamp").is_some_and(|t| !t.is_null()),
            created: meta["creationTimestamp"].as_str().and_then(parse_time),
        }
    }

    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).and_then(Value::as_str).unwrap_or("")
    }

    /// Ready and not terminating: a pod being deleted serves no more (its kubelet marks
    /// it not ready as soon as termination starts).
    pub fn is_ready(&self) -> bool {
        self.ready && !self.deleting
    }

    /// Ready for at least `min_ready_seconds` (upstream `IsPodAvailable`).
    pub fn is_available(&self, min_ready_seconds: i64, now: Timestamp) -> bool {
        self.is_ready()
            && (min_ready_seconds <= 0
                || self.ready_since.is_some_and(|since| {
                    since + SignedDuration::from_secs(min_ready_seconds) < now
                }))
    }

    pub fn is_running(&self) -> bool {
        self.phase == "Running"
    }

    /// Failed or Succeeded: its containers will not run again.
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Failed" | "Succeeded")
    }
}

/// `spec.nodeName`, else the single node a `matchFields metadata.name In` term names
/// (upstream `GetTargetNodeName`, for daemon pods not yet bound).
fn target_node(pod: &Value) -> String {
    if let Some(node) = pod
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return node.to_string();
    }
    pod.at(
        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
    )
    .and_then(Value::as_array)
    .into_iter()
    .flatten()
    .filter_map(|term| term["matchFields"].as_array())
    .flatten()
    .find(|f| f["key"] == "metadata.name" && f["operator"] == "In")
    .and_then(|f| f["values"].as_array())
    .filter(|values| values.len() == 1)
    .and_then(|values| values[0].as_str())
    .unwrap_or("")
    .to_string()
}

/// A ControllerRevision as the workload controllers look at it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::sim) struct Revision {
    pub name: String,
    pub revision: i64,
    pub labels: Map<String, Value>,
    pub data: Value,
}

impl Revision {
    pub fn from_object(revision: &Value) -> Self {
        Revision {
            name: revision
                .at("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            revision: revision["revision"].as_i64().unwrap_or(0),
            labels: revision
                .at("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            data: revision.get("data").cloned().unwrap_or(Value::Null),
        }
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).and_then(Value::as_str)
    }
}

/// The data both controllers keep in a ControllerRevision: a strategic merge patch that
/// replaces `spec.template` (upstream `getPatch`).
pub(in crate::sim) fn template_patch(template: &Value) -> Value {
    let mut template = template.clone();
    if let Some(map) = template.as_object_mut() {
        map.insert("$patch".into(), Value::from("replace"));
    }
    serde_json::json!({"spec": {"template": template}})
}

/// The pod template a revision's data holds.
pub(in crate::sim) fn template_of_patch(data: &Value) -> Option<Value> {
    let mut template = data.at("/spec/template")?.clone();
    template.as_object_mut()?.remove("$patch");
    Some(template)
}

pub(in crate::sim) use capstan_api::canonical::canonical_json;

const FNV_OFFSET: u32 = 0x811c_9dc5;
const FNV_PRIME: u32 = 0x0100_0193;

/// 32-bit FNV-1a (Go `fnv.New32a`).
pub(in crate::sim) fn fnv1a_32(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(FNV_OFFSET, |hash, byte| {
            (hash ^ u32::from(*byte)).wrapping_mul(FNV_PRIME)
        })
}

/// 32-bit FNV-1 (Go `fnv.New32`).
pub(in crate::sim) fn fnv1_32(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .flat_map(|p| p.iter())
        .fold(FNV_OFFSET, |hash, byte| {
            hash.wrapping_mul(FNV_PRIME) ^ u32::from(*byte)
        })
}

/// Upstream `rand.SafeEncodeString(fmt.Sprint(hash))`: the decimal digits mapped onto an
/// alphabet without vowels, so a hash never spells a word.
pub(in crate::sim) fn safe_encode(hash: u32) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    hash.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// An `IntOrString` (`5` or `"20%"`) scaled against `total` as upstream
/// `GetScaledValueFromIntOrPercent`; `None` when it is neither.
pub(in crate::sim) fn scaled(value: &Value, total: i64, round_up: bool) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.strip_suffix('%') {
            Some(percent) => {
                let percent: i64 = percent.parse().ok()?;
                let product = percent * total;
                Some(if round_up {
                    (product + 99).div_euclid(100)
                } else {
                    product.div_euclid(100)
                })
            }
            None => s.parse().ok(),
        },
        _ => None,
    }
}

/// Options of every write a controller makes.
pub(in crate::sim) fn write_options(manager: &str) -> WriteOptions {
    WriteOptions {
        field_manager: Some(manager.into()),
        ..WriteOptions::default()
    }
}

/// Not found and conflicts are races with other writers (or a generated name taken):
/// retried soon and not worth a warning.
pub(in crate::sim) fn is_race(err: &ApiError) -> bool {
    matches!(err.code, 404 | 409)
}

/// How long a controller waits before retrying a write that failed with `err`.
pub(in crate::sim) fn retry_after(err: &ApiError) -> Duration {
    if is_race(err) {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    }
}

/// Owners due for a reconcile, each at most once, at the earliest time asked for.
#[derive(Default)]
pub(in crate::sim) struct WorkQueue {
    due: HashMap<Key, Instant>,
}

impl WorkQueue {
    /// Reconcile `key` as soon as possible.
    pub fn add(&mut self, key: Key) {
        self.due.insert(key, Instant::now());
    }

    /// Reconcile `key` after `delay`, unless it is already due sooner.
    pub fn add_after(&mut self, key: Key, delay: Duration) {
        let at = Instant::now() + delay;
        let due = self.due.entry(key).or_insert(at);
        *due = (*due).min(at);
    }

    fn next_due(&self) -> Option<Instant> {
        self.due.values().min().copied()
    }

    fn take_due(&mut self, now: Instant) -> Vec<Key> {
        let mut due: Vec<Key> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(key, _)| key.clone())
            .collect();
        due.sort();
        for key in &due {
            self.due.remove(key);
        }
        due
    }
}

/// How far a workload controller has settled: the store revision up to which it has
/// taken in every change, published each time it has reconciled every owner those
/// changes made due and holds nothing queued for later. Once it reaches the store's
/// revision with no write since, the controller has finished reacting and writes nothing
/// until something else changes; tests wait for that instead of sleeping.
#[derive(Clone, Default)]
pub struct Settled(Arc<watch::Sender<u64>>);

impl Settled {
    /// The revisions as they are published, for a waiter.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }

    fn publish(&self, revision: u64) {
        self.0.send_replace(revision);
    }
}

/// A controller driven by the store's change stream.
pub(in crate::sim) trait Controller {
    /// Rebuilds the in-memory view from the store and queues every owner.
    fn resync(&mut self);
    /// Takes in one change, queueing the owners it concerns.
    fn observe(&mut self, change: &Change);
    /// Brings one owner's pods and status towards its spec.
    fn reconcile(&mut self, key: &Key);
    fn queue(&mut self) -> &mut WorkQueue;
}

/// Runs `controller` until the change stream closes: resync, then take in changes (all
/// that are waiting, in one go) and reconcile the owners that are due. Publishes to
/// `settled` whenever nothing is left queued.
pub(in crate::sim) async fn drive(
    mut changes: Follower,
    controller: &mut impl Controller,
    settled: &Settled,
) {
    controller.resync();
    loop {
        let due = controller.queue().take_due(Instant::now());
        for key in &due {
            controller.reconcile(key);
        }
        if !due.is_empty() {
            // Reconciles run synchronously; let the API's other users in between rounds.
            tokio::task::yield_now().await;
        }
        let first = match controller.queue().next_due() {
            Some(at) => tokio::select! {
                biased;
                followed = changes.next() => Some(followed),
                () = tokio::time::sleep_until(at) => None,
            },
            None => {
                settled.publish(changes.seen());
                Some(changes.next().await)
            }
        };
        let Some(first) = first else {
            continue;
        };
        match first {
            Some(followed) => take_in(controller, followed),
            None => return,
        }
        for _ in 0..DRAIN_LIMIT {
            match changes.try_next() {
                Ok(Some(followed)) => take_in(controller, followed),
                Ok(None) => break,
                Err(Closed) => return,
            }
        }
    }
}

fn take_in(controller: &mut impl Controller, followed: Followed) {
    match followed {
        Followed::Change(change) => controller.observe(&change),
        // Missed changes beyond the history: rebuild from the full state.
        Followed::Restart => controller.resync(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scaled_values_round_as_asked() {
        let cases = [
            (json!(3), 10, true, Some(3)),
            (json!("3"), 10, true, Some(3)),
            (json!("25%"), 10, true, Some(3)),
            (json!("25%"), 10, false, Some(2)),
            (json!("10%"), 5000, true, Some(500)),
            (json!("0%"), 10, true, Some(0)),
            (json!("x%"), 10, true, None),
            (json!(null), 10, true, None),
        ];
        for (value, total, round_up, expected) in cases {
            assert_eq!(scaled(&value, total, round_up), expected, "{value}");
        }
    }

    #[test]
    fn fnv_matches_go() {
        // Go: fnv.New32a().Write([]byte("a")) = 0xe40c292c; fnv.New32() = 0x050c5d7e.
        assert_eq!(fnv1a_32(&[b"a"]), 0xe40c_292c);
        assert_eq!(fnv1_32(&[b"a"]), 0x050c_5d7e);
        assert_eq!(fnv1a_32(&[b"ab"]), fnv1a_32(&[b"a", b"b"]));
    }

    #[test]
    fn safe_encoding_maps_digits_to_consonants() {
        assert_eq!(safe_encode(1_234_567_890), "56789bcdf4");
    }

    #[test]
    fn template_patches_round_trip() {
        let template = json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": []}});
        let patch = template_patch(&template);
        assert_eq!(patch["spec"]["template"]["$patch"], "replace");
        assert_eq!(template_of_patch(&patch), Some(template));
    }

    #[test]
    fn cache_keeps_the_newest_version_and_ignores_what_it_removed() {
        let key: Key = ("default".into(), "web-0".into());
        let mut cache = Cache::default();
        assert!(matches!(
            cache.put(key.clone(), "u1", 5, "five"),
            Applied::Replaced(None)
        ));
        assert!(matches!(
            cache.put(key.clone(), "u1", 4, "four"),
            Applied::Stale
        ));
        assert_eq!(cache.get(&key).map(|c| c.item), Some("five"));
        cache.forget(&key);
        assert!(matches!(
            cache.put(key.clone(), "u1", 6, "six"),
            Applied::Stale
        ));
        // The deletion arrives; a new incarnation under the same name is welcome.
        assert!(matches!(
            cache.remove(&key, "u1", 7),
            Applied::Replaced(None)
        ));
        assert!(matches!(
            cache.put(key.clone(), "u2", 8, "new"),
            Applied::Replaced(None)
        ));
        // A stale deletion does not remove the newer incarnation.
        assert!(matches!(cache.remove(&key, "u1", 7), Applied::Stale));
        assert_eq!(cache.get(&key).map(|c| c.item), Some("new"));
    }

    #[test]
    fn pods_read_readiness_and_target_node() {
        let pod = json!({
            "metadata": {"name": "d-x", "labels": {"a": "b"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-3"]}]}]}}}},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"}]}
        });
        let parsed = OwnedPod::from_object(&pod);
        assert_eq!(parsed.node, "worker-3");
        assert!(parsed.is_ready() && parsed.is_running());
        let at = |s: &str| s.parse::<Timestamp>().expect("time");
        assert!(parsed.is_available(0, at("2026-01-01T00:00:10Z")));
        assert!(!parsed.is_available(5, at("2026-01-01T00:00:15Z")));
        assert!(parsed.is_available(5, at("2026-01-01T00:00:16Z")));
        let deleting = OwnedPod {
            deleting: true,
            ..parsed
        };
        assert!(!deleting.is_ready());
    }
}

/// Helpers for the controllers' in-process tests: an embedded cluster, objects to start
/// from, and a stand-in for the kubelet.
#[cfg(test)]
pub(in crate::sim) mod testing {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::{Value, json};

    use super::Settled;
    use crate::api::{Api, DeleteOptions, ListOptions, PatchType, WriteOptions};
    use crate::pointer::Pointer;
    use crate::store::EventType;
    use crate::{ClusterOptions, EmbeddedCluster};
    use capstan_api::clock::rfc3339;

    pub async fn cluster() -> EmbeddedCluster {
        let options = ClusterOptions {
            capstan_crds: false,
            ..ClusterOptions::default()
        };
        EmbeddedCluster::start(options)
            .await
            .expect("cluster starts")
    }

    fn options() -> WriteOptions {
        WriteOptions {
            field_manager: Some("test".into()),
            ..WriteOptions::default()
        }
    }

    pub fn create(api: &Api, group: &str, plural: &str, namespace: &str, body: Value) -> Value {
        let resource = api.registry.get(group, "v1", plural).expect("resource");
        api.create(&resource, namespace, body, &options())
            .expect("created")
    }

    pub fn patch(api: &Api, group: &str, plural: &str, namespace: &str, name: &str, body: Value) {
        let resource = api.registry.get(group, "v1", plural).expect("resource");
        api.patch(
            &resource,
            namespace,
            name,
            None,
            PatchType::Merge,
            body,
            &options(),
        )
        .expect("patched");
    }

    pub fn get(api: &Api, group: &str, plural: &str, namespace: &str, name: &str) -> Value {
        let resource = api.registry.get(group, "v1", plural).expect("resource");
        api.get_value(&resource, namespace, name).expect("exists")
    }

    pub fn list(api: &Api, group: &str, plural: &str, namespace: &str) -> Vec<Value> {
        let resource = api.registry.get(group, "v1", plural).expect("resource");
        api.list_values(&resource, Some(namespace), &ListOptions::default())
            .expect("listed")
    }

    pub fn node(api: &Api, name: &str, labels: Value) {
        create(
            api,
            "",
            "nodes",
            "",
            json!({"metadata": {"name": name, "labels": labels}, "spec": {}}),
        );
    }

    /// What the kubelet writes once a pod's containers run and pass readiness.
    pub fn mark_ready(api: &Api, namespace: &str, name: &str) {
        set_status(api, namespace, name, running_and_ready(api));
    }

    pub fn mark_failed(api: &Api, namespace: &str, name: &str) {
        set_status(api, namespace, name, json!({"phase": "Failed"}));
    }

    fn running_and_ready(api: &Api) -> Value {
        json!({"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(api.clock.now())}]})
    }

    fn set_status(api: &Api, namespace: &str, name: &str, status: Value) {
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let _ = api.patch(
            &pods,
            namespace,
            name,
            Some("status"),
            PatchType::Merge,
            json!({"status": status}),
            &options(),
        );
    }

    /// What the kubelet does once a terminating pod's containers stopped.
    pub fn finish_termination(api: &Api, namespace: &str, name: &str) {
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let force = DeleteOptions {
            grace_period_seconds: Some(0),
            ..DeleteOptions::default()
        };
        let _ = api.delete(&pods, namespace, name, &force);
    }

    pub fn is_ready(pod: &Value) -> bool {
        pod.at("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    }

    pub fn is_terminating(pod: &Value) -> bool {
        pod.at("/metadata/deletionTimestamp").is_some()
    }

    /// Stands in for the kubelet: bound pods become Running and Ready, terminating pods go.
    pub fn spawn_kubelet(api: Arc<Api>) -> tokio::task::JoinHandle<()> {
        let mut changes = api.store.subscribe();
        tokio::spawn(async move {
            while let Ok(change) = changes.recv().await {
                if change.key.storage != "pods" || change.event == EventType::Deleted {
                    continue;
                }
                let pod = change.value();
                let bound = pod
                    .at("/spec/nodeName")
                    .and_then(Value::as_str)
                    .is_some_and(|n| !n.is_empty());
                let (namespace, name) = (&change.key.namespace, &change.key.name);
                if is_terminating(pod) {
                    finish_termination(&api, namespace, name);
                } else if bound && !is_ready(pod) && pod["status"]["phase"] != "Failed" {
                    mark_ready(&api, namespace, name);
                }
            }
        })
    }

    /// Waits until the controller publishing to `settled` has taken in every change up
    /// to the store's revision and has nothing left to do, with no write since: what it
    /// does in reaction to the state so far is done. Fails the test after ten seconds.
    pub async fn settled(api: &Api, settled: &Settled) {
        let mut progress = settled.subscribe();
        let caught_up = async {
            loop {
                let revision = api.store.resource_version();
                progress
                    .wait_for(|seen| *seen >= revision)
                    .await
                    .expect("the controller runs");
                if api.store.resource_version() == revision {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), caught_up)
            .await
            .expect("the controller settles within ten seconds");
    }

    /// Polls `check` until it answers, for at most ten seconds.
    pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
        for _ in 0..500 {
            if let Some(answer) = check() {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("timed out waiting for {what}");
    }
}
