//! The garbage collector and the namespace controller of the embedded cluster, as
//! kube-controller-manager runs them: dependents whose owners are all gone are deleted
//! (background), foreground deletion deletes the dependents (in the foreground those that
//! have dependents of their own) and waits for the blocking ones, orphaning strips owner
//! references, and a terminating namespace is emptied before it goes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::pointer::Pointer;

use serde_json::{Value, json};

use super::api::{Api, DeleteOptions, PatchType, Propagation, WriteOptions};
use super::errors::ApiError;
use super::object_key::ObjectKey;
use super::resources::Resource;
use super::store::{Change, EventType, Followed};

const MANAGER: &str = "garbage-collector";
/// The finalizer of an owner deleted in the foreground, waiting for its dependents.
const FOREGROUND: &str = "foregroundDeletion";

/// Runs until the store's change stream closes.
pub async fn run(api: Arc<Api>) {
    let mut changes = api.store.follow();
    let mut collector = Collector::new(api);
    collector.resync();
    while let Some(followed) = changes.next().await {
        match followed {
            Followed::Change(change) => collector.observe(&change),
            // Missed changes beyond the history: rebuild from the full state.
            Followed::Restart => collector.resync(),
        }
    }
}

/// The collector's view of the cluster, built from the change stream as
/// kube-controller-manager's is built from informers: it asks the store only when an
/// object may have to go, so following the stream costs no lock per change.
struct Collector {
    api: Arc<Api>,
    /// The uids of every object seen to exist.
    present: HashSet<String>,
    /// owner uid -> dependents referencing it.
    dependents: HashMap<String, HashSet<ObjectKey>>,
    /// Objects being deleted (by uid), which may wait for their dependents.
    deleting: HashMap<String, ObjectKey>,
    /// Namespaces being deleted.
    terminating: HashSet<String>,
}

fn metadata(projection: &Value) -> Option<&serde_json::Map<String, Value>> {
    projection.get("metadata").and_then(Value::as_object)
}

fn owner_uids(projection: &Value) -> impl Iterator<Item = &str> {
    metadata(projection)
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

fn uid_of(projection: &Value) -> &str {
    metadata(projection)
        .and_then(|m| m.get("uid"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn has_finalizer(projection: &Value, finalizer: &str) -> bool {
    metadata(projection)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

fn deleting(projection: &Value) -> bool {
    metadata(projection).is_some_and(|m| m.contains_key("deletionTimestamp"))
}

impl Collector {
    fn new(api: Arc<Api>) -> Self {
        Collector {
            api,
            present: HashSet::new(),
            dependents: HashMap::new(),
            deleting: HashMap::new(),
            terminating: HashSet::new(),
        }
    }

    /// Rebuilds the view from one consistent read of every object, then checks every
    /// dependent and every object being deleted.
    fn resync(&mut self) {
        self.present.clear();
        self.dependents.clear();
        self.deleting.clear();
        self.terminating.clear();
        // Only objects with owners, or being deleted, need more than their uid.
        let mut interesting = Vec::new();
        self.api.store.scan(|storage, object| {
            let projection = &object.projection;
            self.present.insert(uid_of(projection).to_string());
            if deleting(projection) || owner_uids(projection).next().is_some() {
                interesting.push((object.key(storage), projection.clone()));
            }
        });
        for (key, projection) in &interesting {
            self.index(key, None, Some(projection));
        }
        for (key, projection) in &interesting {
            self.check_dependent(key, projection);
            self.check_owner(key, projection);
        }
    }

    fn observe(&mut self, change: &Change) {
        let projection = &change.object.projection;
        match change.event {
            EventType::Deleted => {
                let before = change.previous.as_deref().unwrap_or(projection);
                self.index(&change.key, Some(before), None);
                let uid = uid_of(projection);
                for dependent in self.dependents.get(uid).cloned().unwrap_or_default() {
                    if let Some(object) = self.api.store.get(&dependent) {
                        self.check_dependent(&dependent, &object.projection);
                    }
                }
                // A dependent gone may be what a foreground-deleting owner waits for.
                for owner in owner_uids(projection) {
                    if let Some(owner_key) = self.deleting.get(owner)
                        && let Some(object) = self.api.store.get(owner_key)
                    {
                        self.check_owner(owner_key, &object.projection);
                    }
                }
                if change.key.storage != "namespaces"
                    && self.terminating.contains(&change.key.namespace)
                {
                    self.check_namespace(&change.key.namespace);
                }
            }
            EventType::Added | EventType::Modified => {
                self.index(&change.key, change.previous.as_deref(), Some(projection));
                self.check_dependent(&change.key, projection);
                self.check_owner(&change.key, projection);
                // A reference dropped may be what a foreground-deleting owner waits for.
                let dropped = change
                    .previous
                    .as_deref()
                    .into_iter()
                    .flat_map(owner_uids)
                    .filter(|uid| !owner_uids(projection).any(|u| u == *uid));
                for owner in dropped {
                    if let Some(owner_key) = self.deleting.get(owner)
                        && let Some(object) = self.api.store.get(owner_key)
                    {
                        self.check_owner(owner_key, &object.projection);
                    }
                }
            }
        }
    }

    /// Takes in an object's change from `before` to `after` (`None`: absent).
    fn index(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        // Most changes keep the owners: the index stays as it is.
        let same_owners = before
            .zip(after)
            .is_some_and(|(before, after)| owner_uids(before).eq(owner_uids(after)));
        if let Some(before) = before.filter(|_| !same_owners) {
            for uid in owner_uids(before) {
                if let Some(set) = self.dependents.get_mut(uid) {
                    set.remove(key);
                    if set.is_empty() {
                        self.dependents.remove(uid);
                    }
                }
            }
        }
        let uid = after.or(before).map(uid_of).unwrap_or("");
        match after {
            Some(after) => {
                for owner in owner_uids(after).filter(|_| !same_owners) {
                    self.dependents
                        .entry(owner.to_string())
                        .or_default()
                        .insert(key.clone());
                }
                if !self.present.contains(uid) {
                    self.present.insert(uid.to_string());
                }
                if deleting(after) {
                    if !self.deleting.contains_key(uid) {
                        self.deleting.insert(uid.to_string(), key.clone());
                    }
                } else {
                    self.deleting.remove(uid);
                }
                if key.storage == "namespaces" {
                    if deleting(after) {
                        self.terminating.insert(key.name.clone());
                    } else {
                        self.terminating.remove(&key.name);
                    }
                }
            }
            None => {
                self.present.remove(uid);
                self.deleting.remove(uid);
                if key.storage == "namespaces" {
                    self.terminating.remove(&key.name);
                }
            }
        }
    }

    /// Whether the owner with this uid exists: seen in the stream, or (for an owner the
    /// stream has not shown yet) in the store.
    fn owner_exists(&self, uid: &str) -> bool {
        self.present.contains(uid) || self.api.store.key_of_uid(uid).is_some()
    }

    /// A dependent with owners, none of which exists any more, is deleted; one whose
    /// owners partly exist loses the references to the missing ones.
    fn check_dependent(&self, key: &ObjectKey, projection: &Value) {
        if deleting(projection) {
            return;
        }
        let mut owners = 0;
        let mut missing = Vec::new();
        for uid in owner_uids(projection) {
            owners += 1;
            if !self.owner_exists(uid) {
                missing.push(uid.to_string());
            }
        }
        if missing.is_empty() {
            return;
        }
        if missing.len() == owners {
            self.delete(key, Propagation::Background);
        } else {
            self.drop_owner_references(key, &missing);
        }
    }

    /// An owner being deleted in the foreground or with orphaning does its part of the
    /// deletion, then loses the finalizer that held it.
    fn check_owner(&self, key: &ObjectKey, projection: &Value) {
        if !deleting(projection) {
            return;
        }
        if key.storage == "namespaces" {
            self.check_namespace(&key.name);
        }
        let uid = uid_of(projection);
        let dependents: Vec<ObjectKey> = self
            .dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if has_finalizer(projection, "orphan") {
            for dependent in &dependents {
                self.drop_owner_references(dependent, &[uid.to_string()]);
            }
            self.remove_finalizer(key, "orphan");
        } else if has_finalizer(projection, FOREGROUND) {
            let mut blocking = 0;
            for dependent in &dependents {
                let Some(object) = self.api.store.get(dependent) else {
                    continue;
                };
                if blocks_owner(&object.projection, uid) {
                    blocking += 1;
                }
                if !deleting(&object.projection) {
                    self.collect_for_waiting_owner(dependent, &object.projection);
                }
            }
            if blocking == 0 {
                self.remove_finalizer(key, FOREGROUND);
            }
        }
    }

    /// A dependent of an owner deleted in the foreground (upstream `attemptToDeleteItem`):
    /// kept, losing its references to gone and waiting owners, while another owner still
    /// stands; otherwise deleted, in the foreground itself when it has dependents of its
    /// own (so the chain waits all the way down), in the background when it has none.
    fn collect_for_waiting_owner(&self, key: &ObjectKey, projection: &Value) {
        let owners: Vec<(String, OwnerState)> = owner_uids(projection)
            .map(|uid| (uid.to_string(), self.owner_state(uid)))
            .collect();
        let leaving: Vec<String> = owners
            .iter()
            .filter(|(_, state)| *state != OwnerState::Solid)
            .map(|(uid, _)| uid.clone())
            .collect();
        match collection(
            owners.iter().map(|(_, state)| *state),
            self.dependents.contains_key(uid_of(projection)),
        ) {
            Collection::Keep => self.drop_owner_references(key, &leaving),
            Collection::Delete(propagation) => self.delete(key, propagation),
        }
    }

    /// What a dependent sees of one of its owners.
    fn owner_state(&self, uid: &str) -> OwnerState {
        if !self.owner_exists(uid) {
            return OwnerState::Gone;
        }
        let waiting = self
            .deleting
            .get(uid)
            .and_then(|key| self.api.store.get(key))
            .is_some_and(|owner| has_finalizer(&owner.projection, FOREGROUND));
        if waiting {
            OwnerState::WaitingForDependents
        } else {
            OwnerState::Solid
        }
    }

    /// A terminating namespace: delete what is in it; once empty, release it.
    fn check_namespace(&self, namespace: &str) {
        let ns_key = ObjectKey::new("namespaces", "", namespace);
        let Some(ns) = self.api.store.get(&ns_key) else {
            return;
        };
        if !deleting(&ns.projection) {
            return;
        }
        let mut empty = true;
        for resource in self.api.registry.all() {
            if !resource.namespaced || resource.conversion != super::resources::Conversion::None {
                continue;
            }
            let page = self
                .api
                .store
                .list(&resource.storage, Some(namespace), None, None, None);
            for object in page.items {
                empty = false;
                if !deleting(&object.projection) {
                    self.delete(&object.key(&resource.storage), Propagation::Background);
                }
            }
        }
        if empty {
            self.finalize_namespace(namespace);
        }
    }

    fn resource(&self, storage: &str) -> Option<Arc<Resource>> {
        self.api.registry.by_storage(storage)
    }

    fn delete(&self, key: &ObjectKey, propagation: Propagation) {
        let Some(resource) = self.resource(&key.storage) else {
            return;
        };
        let options = DeleteOptions {
            propagation: Some(propagation),
            ..DeleteOptions::default()
        };
        report(
            self.api
                .delete(&resource, &key.namespace, &key.name, &options)
                .map(|_| ()),
            key,
            "deleting a dependent",
        );
    }

    fn drop_owner_references(&self, key: &ObjectKey, uids: &[String]) {
        let Some(resource) = self.resource(&key.storage) else {
            return;
        };
        let Some(object) = self.api.store.get(key) else {
            return;
        };
        let kept: Vec<Value> = object
            .value()
            .at("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|r| {
                !r.get("uid")
                    .and_then(Value::as_str)
                    .is_some_and(|u| uids.iter().any(|x| x == u))
            })
            .cloned()
            .collect();
        let patch = json!({"metadata": {"ownerReferences": kept, "resourceVersion": object.resource_version.to_string()}});
        self.patch(&resource, key, patch, "removing owner references");
    }

    fn remove_finalizer(&self, key: &ObjectKey, finalizer: &str) {
        let Some(resource) = self.resource(&key.storage) else {
            return;
        };
        let Some(object) = self.api.store.get(key) else {
            return;
        };
        let kept: Vec<Value> = object
            .value()
            .at("/metadata/finalizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|f| *f != finalizer)
            .cloned()
            .collect();
        let patch = json!({"metadata": {"finalizers": kept, "resourceVersion": object.resource_version.to_string()}});
        self.patch(&resource, key, patch, "removing a finalizer");
    }

    fn finalize_namespace(&self, namespace: &str) {
        let key = ObjectKey::new("namespaces", "", namespace);
        let Some(resource) = self.resource("namespaces") else {
            return;
        };
        self.patch(
            &resource,
            &key,
            json!({"spec": {"finalizers": []}}),
            "finalizing a namespace",
        );
    }

    fn patch(&self, resource: &Resource, key: &ObjectKey, patch: Value, what: &str) {
        let options = WriteOptions {
            field_manager: Some(MANAGER.into()),
            ..WriteOptions::default()
        };
        let result = self
            .api
            .patch(
                resource,
                &key.namespace,
                &key.name,
                None,
                PatchType::Merge,
                patch,
                &options,
            )
            .map(|_| ());
        report(result, key, what);
    }
}

/// An owner as one of its dependents sees it (upstream `classifyReferences`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OwnerState {
    /// Exists and is not waiting for its dependents to go.
    Solid,
    /// Absent.
    Gone,
    /// Being deleted in the foreground.
    WaitingForDependents,
}

/// What becomes of a dependent whose owner waits for it.
#[derive(Debug, PartialEq, Eq)]
enum Collection {
    /// Another owner still stands: only the references to the others go.
    Keep,
    Delete(Propagation),
}

/// What becomes of a dependent of an owner deleted in the foreground, given all its
/// owners and whether it has dependents of its own.
fn collection(owners: impl IntoIterator<Item = OwnerState>, has_dependents: bool) -> Collection {
    if owners.into_iter().any(|state| state == OwnerState::Solid) {
        Collection::Keep
    } else if has_dependents {
        Collection::Delete(Propagation::Foreground)
    } else {
        Collection::Delete(Propagation::Background)
    }
}

fn blocks_owner(projection: &Value, owner_uid: &str) -> bool {
    projection
        .at("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|r| r["uid"] == owner_uid && r["blockOwnerDeletion"] == true)
}

/// Conflicts and not-found are expected races: the next change event retries.
fn report(result: Result<(), ApiError>, key: &ObjectKey, what: &str) {
    if let Err(err) = result
        && !matches!(err.code, 404 | 409)
    {
        tracing::warn!(%err, storage = %key.storage, namespace = %key.namespace, name = %key.name, "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependents_of_a_foreground_deletion_go_as_upstream_decides() {
        use OwnerState::{Gone, Solid, WaitingForDependents as Waiting};
        let cases = [
            (
                "a leaf goes in the background",
                vec![Waiting],
                false,
                Collection::Delete(Propagation::Background),
            ),
            (
                "a dependent with dependents waits for them",
                vec![Waiting],
                true,
                Collection::Delete(Propagation::Foreground),
            ),
            (
                "a gone co-owner changes nothing",
                vec![Waiting, Gone],
                false,
                Collection::Delete(Propagation::Background),
            ),
            (
                "a standing co-owner keeps it",
                vec![Waiting, Solid],
                true,
                Collection::Keep,
            ),
        ];
        for (story, owners, has_dependents, expected) in cases {
            assert_eq!(collection(owners, has_dependents), expected, "{story}");
        }
    }
}
