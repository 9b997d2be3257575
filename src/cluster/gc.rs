//! The garbage collector and the namespace controller of the embedded cluster, as
//! kube-controller-manager runs them: dependents whose owners are all gone are deleted
//! (background), foreground deletion waits for blocking dependents, orphaning strips
//! owner references, and a terminating namespace is emptied before it goes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::api::{Api, DeleteOptions, PatchType, Propagation, WriteOptions};
use super::errors::ApiError;
use super::resources::Resource;
use super::store::{Change, EventType, ObjectKey};

const MANAGER: &str = "garbage-collector";

/// Runs until the store's change stream closes.
pub async fn run(api: Arc<Api>) {
    let mut changes = api.store.subscribe();
    let mut collector = Collector::new(api);
    collector.resync();
    loop {
        match changes.recv().await {
            Ok(change) => collector.observe(&change),
            // Missed changes: rebuild from the full state rather than guess.
            Err(RecvError::Lagged(_)) => collector.resync(),
            Err(RecvError::Closed) => return,
        }
    }
}

struct Collector {
    api: Arc<Api>,
    /// owner uid -> dependents referencing it.
    dependents: HashMap<String, HashSet<ObjectKey>>,
}

fn owner_uids(projection: &Value) -> Vec<String> {
    projection
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
        .collect()
}

fn has_finalizer(projection: &Value, finalizer: &str) -> bool {
    projection
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

fn deleting(projection: &Value) -> bool {
    projection.pointer("/metadata/deletionTimestamp").is_some()
}

impl Collector {
    fn new(api: Arc<Api>) -> Self {
        Collector {
            api,
            dependents: HashMap::new(),
        }
    }

    fn resync(&mut self) {
        self.dependents.clear();
        let mut all = Vec::new();
        for storage in self.api.store.buckets() {
            for object in self.api.store.list(&storage, None, None, None, None).items {
                all.push((object.key(&storage), object));
            }
        }
        for (key, object) in &all {
            self.index(key, None, Some(&object.projection));
        }
        for (key, object) in &all {
            self.check_dependent(key, &object.projection);
            self.check_owner(key, &object.projection);
        }
    }

    fn observe(&mut self, change: &Change) {
        let projection = &change.object.projection;
        match change.event {
            EventType::Deleted => {
                self.index(&change.key, change.previous.as_deref(), None);
                let uid = change.object.uid().to_string();
                for dependent in self.dependents.get(&uid).cloned().unwrap_or_default() {
                    if let Some(object) = self.api.store.get(&dependent) {
                        self.check_dependent(&dependent, &object.projection);
                    }
                }
                // A dependent gone may be what a foreground-deleting owner waits for.
                for owner in owner_uids(projection) {
                    if let Some(owner_key) = self.api.store.key_of_uid(&owner)
                        && let Some(object) = self.api.store.get(&owner_key)
                    {
                        self.check_owner(&owner_key, &object.projection);
                    }
                }
                if change.key.storage != "namespaces" && !change.key.namespace.is_empty() {
                    self.check_namespace(&change.key.namespace);
                }
            }
            EventType::Added | EventType::Modified => {
                self.index(&change.key, change.previous.as_deref(), Some(projection));
                self.check_dependent(&change.key, projection);
                self.check_owner(&change.key, projection);
            }
        }
    }

    fn index(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        for uid in before.map(owner_uids).unwrap_or_default() {
            if let Some(set) = self.dependents.get_mut(&uid) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(&uid);
                }
            }
        }
        for uid in after.map(owner_uids).unwrap_or_default() {
            self.dependents.entry(uid).or_default().insert(key.clone());
        }
    }

    /// A dependent with owners, none of which exists any more, is deleted; one whose
    /// owners partly exist loses the references to the missing ones.
    fn check_dependent(&self, key: &ObjectKey, projection: &Value) {
        let owners = owner_uids(projection);
        if owners.is_empty() || deleting(projection) {
            return;
        }
        let missing: Vec<&String> = owners
            .iter()
            .filter(|uid| self.api.store.key_of_uid(uid).is_none())
            .collect();
        if missing.is_empty() {
            return;
        }
        if missing.len() == owners.len() {
            self.delete(key, Propagation::Background);
        } else {
            let missing: Vec<String> = missing.into_iter().cloned().collect();
            self.drop_owner_references(key, &missing);
        }
    }

    /// An owner being deleted in the foreground or with orphaning does its part of the
    /// deletion, then loses the finalizer that held it.
    fn check_owner(&self, key: &ObjectKey, projection: &Value) {
        if key.storage == "namespaces" && deleting(projection) {
            self.check_namespace(&key.name);
        }
        if !deleting(projection) {
            return;
        }
        let uid = projection
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
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
        } else if has_finalizer(projection, "foregroundDeletion") {
            let mut blocking = 0;
            for dependent in &dependents {
                let Some(object) = self.api.store.get(dependent) else {
                    continue;
                };
                if blocks_owner(&object.projection, uid) {
                    blocking += 1;
                }
                if !deleting(&object.projection) {
                    self.delete(dependent, Propagation::Foreground);
                }
            }
            if blocking == 0 {
                self.remove_finalizer(key, "foregroundDeletion");
            }
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
            .pointer("/metadata/ownerReferences")
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
            .pointer("/metadata/finalizers")
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

fn blocks_owner(projection: &Value, owner_uid: &str) -> bool {
    projection
        .pointer("/metadata/ownerReferences")
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
