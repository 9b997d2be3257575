//! Deletes: preconditions, finalizers and grace periods (a delete that only marks the
//! object), propagation to dependents, whole collections, and a namespace's contents.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::{Answer, Api, DeleteOptions, Deleted, ListOptions, Propagation};
use crate::errors::ApiError;
use crate::pointer::Pointer;
use crate::resources::{CRD_STORAGE, Resource};
use crate::store::{StoredObject, Write};
use capstan_api::clock::rfc3339;

impl Api {
    /// DELETE of one object.
    pub fn delete(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let key = Self::key(resource, namespace, name);
        let now = self.now();
        // The step decided; a marked object handed to the store comes back as written.
        let mut step: Option<DeleteStep> = None;
        // The stored object a deletion decided from its projection removed, unparsed.
        let mut removed: Option<StoredObject> = None;
        let (_, written) =
            self.store
                .transact_value(&key, |current| -> Result<Write, ApiError> {
                    let current = current.ok_or_else(|| ApiError::not_found(resource, name))?;
                    if removes_at_once(resource, &current.projection, options) {
                        check_delete_preconditions(resource, name, &current.projection, options)?;
                        removed = Some(current.clone());
                        return Ok(Write::Delete);
                    }
                    let object = current.value();
                    check_delete_preconditions(resource, name, &object, options)?;
                    let decided = deletion(resource, object, options, now);
                    let write = match decided {
                        DeleteStep::Remove(_) if !options.dry_run => {
                            step = Some(decided);
                            Write::Delete
                        }
                        DeleteStep::Mark(object) if !options.dry_run => {
                            step = Some(DeleteStep::Mark(Value::Null));
                            Write::Put(object)
                        }
                        decided => {
                            step = Some(decided);
                            Write::Keep
                        }
                    };
                    Ok(write)
                })?;
        // As kube-apiserver, a removal answers with the object as it was last stored.
        if let Some(removed) = removed {
            return Ok(Deleted::Now(Answer::stored(
                self.present(resource, &removed),
            )));
        }
        match step {
            Some(DeleteStep::Remove(object)) => {
                if !options.dry_run {
                    self.after_delete(resource, &object);
                }
                Ok(Deleted::Now(self.answer(resource, object, None)))
            }
            Some(DeleteStep::Mark(object)) => {
                // The stored object carries its new resourceVersion.
                let object = written.unwrap_or(object);
                Ok(Deleted::Pending(self.answer(resource, object, None)))
            }
            Some(DeleteStep::Unchanged(object)) => {
                Ok(Deleted::Pending(self.answer(resource, object, None)))
            }
            None => Err(ApiError::not_found(resource, name)),
        }
    }

    /// DELETE of every selected object of a namespace (deletecollection).
    pub fn delete_collection(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        list: &ListOptions,
        options: &DeleteOptions,
    ) -> Result<Vec<Value>, ApiError> {
        let mut deleted = Vec::new();
        for object in self.list_values(resource, namespace, list)? {
            let meta = &object["metadata"];
            let ns = meta["namespace"].as_str().unwrap_or("");
            let name = meta["name"].as_str().unwrap_or("");
            match self.delete(resource, ns, name, options) {
                Ok(Deleted::Now(o) | Deleted::Pending(o)) => deleted.push(o.into_value()),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(deleted)
    }

    pub(super) fn after_delete(&self, resource: &Resource, object: &Value) {
        if resource.storage == CRD_STORAGE {
            let group = object
                .at("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("");
            let plural = object
                .at("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or("");
            let storage = format!("{plural}.{group}");
            self.registry.unregister_crd(&storage);
            self.purge(&storage);
        }
    }

    /// Removes every object of a bucket (the custom resources of a deleted CRD).
    fn purge(&self, storage: &str) {
        let page = self.store.list(storage, None, None, None, None);
        for object in page.items {
            let key = object.key(storage);
            if let Err(err) = self.store.transact::<ApiError>(&key, |_| Ok(Write::Delete)) {
                tracing::warn!(%err, storage, "removing a custom resource of a deleted CRD");
            }
        }
    }
}

fn check_delete_preconditions(
    resource: &Resource,
    name: &str,
    object: &Value,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let meta = &object["metadata"];
    if let Some(uid) = &options.precondition_uid
        && meta["uid"].as_str() != Some(uid)
    {
        return Err(ApiError::conflict(
            resource,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta["uid"].as_str().unwrap_or("")
            ),
        ));
    }
    if let Some(rv) = &options.precondition_resource_version
        && meta["resourceVersion"].as_str() != Some(rv)
    {
        return Err(ApiError::conflict(
            resource,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta["resourceVersion"].as_str().unwrap_or("")
            ),
        ));
    }
    Ok(())
}

enum DeleteStep {
    Remove(Value),
    Mark(Value),
    Unchanged(Value),
}

/// What deleting `object` does now: remove it, or mark it and wait for finalizers, the
/// namespace controller, or the kubelet's grace period.
fn deletion(
    resource: &Resource,
    mut object: Value,
    options: &DeleteOptions,
    now: Timestamp,
) -> DeleteStep {
    let propagation = options.propagation.unwrap_or_default();
    let policy_finalizer = match propagation {
        Propagation::Foreground => Some("foregroundDeletion"),
        Propagation::Orphan => Some("orphan"),
        Propagation::Background => None,
    };
    let already_deleting = object.at("/metadata/deletionTimestamp").is_some();
    let grace = pod_grace_period(resource, &object, options);
    if already_deleting {
        // A shorter grace period speeds up a pending pod deletion (`--grace-period=0 --force`).
        let pending_grace = object
            .at("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        if let (Some(grace), Some(pending)) = (grace, pending_grace)
            && grace < pending
        {
            return shorten_grace(object, grace, now);
        }
        return DeleteStep::Unchanged(object);
    }
    if let Some(f) = policy_finalizer {
        let list = object["metadata"]
            .as_object_mut()
            .map(|m| m.entry("finalizers").or_insert_with(|| json!([])));
        if let Some(Value::Array(list)) = list
            && !list.iter().any(|x| x == f)
        {
            list.push(json!(f));
        }
    }
    let namespace_finalizers = resource.plural == "namespaces"
        && object
            .at("/spec/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
    let has_finalizers = finalizers(&object).next().is_some();
    let grace = grace.unwrap_or(0);
    if !has_finalizers && !namespace_finalizers && grace == 0 {
        return DeleteStep::Remove(object);
    }
    let meta = &mut object["metadata"];
    meta["deletionTimestamp"] = json!(rfc3339(now + jiff::SignedDuration::from_secs(grace)));
    meta["deletionGracePeriodSeconds"] = json!(grace);
    if namespace_finalizers {
        object["status"]["phase"] = json!("Terminating");
    }
    DeleteStep::Mark(object)
}

fn shorten_grace(mut object: Value, grace: i64, now: Timestamp) -> DeleteStep {
    if grace == 0 && finalizers(&object).next().is_none() {
        return DeleteStep::Remove(object);
    }
    object["metadata"]["deletionTimestamp"] =
        json!(rfc3339(now + jiff::SignedDuration::from_secs(grace)));
    object["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    DeleteStep::Mark(object)
}

/// Whether deleting the object whose projection this is removes it at once, as
/// [`deletion`] would decide, told from the projection alone (its metadata, a pod's node
/// and phase): no finalizer to wait for or to add, no grace period, nothing to do after.
fn removes_at_once(resource: &Resource, projection: &Value, options: &DeleteOptions) -> bool {
    let Some(meta) = projection.get("metadata").and_then(Value::as_object) else {
        return false;
    };
    let quiet = !options.dry_run
        && options.propagation.unwrap_or_default() == Propagation::Background
        && resource.storage != CRD_STORAGE
        && resource.plural != "namespaces"
        && !meta.contains_key("deletionTimestamp")
        && meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
    if !quiet {
        return false;
    }
    if resource.plural != "pods" || !resource.group.is_empty() {
        return true;
    }
    let scheduled = projection
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let finished = matches!(
        projection.at("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    );
    !scheduled || finished || options.grace_period_seconds.is_some_and(|g| g <= 0)
}

/// A pod bound to a node and not finished terminates gracefully; everything else goes at once.
fn pod_grace_period(resource: &Resource, object: &Value, options: &DeleteOptions) -> Option<i64> {
    if resource.plural != "pods" || !resource.group.is_empty() {
        return options.grace_period_seconds.map(|_| 0);
    }
    let scheduled = object
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = object.at("/status/phase").and_then(Value::as_str);
    if !scheduled || matches!(phase, Some("Succeeded" | "Failed")) {
        return Some(0);
    }
    let default = object
        .at("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    Some(options.grace_period_seconds.unwrap_or(default).max(0))
}

pub(super) fn finalizers(object: &Value) -> impl Iterator<Item = &Value> {
    object
        .at("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// An object marked for deletion whose finalizers are all gone, and whose grace period
/// (pods) is not pending, is removed by the write that removed the last finalizer.
pub(super) fn deletion_complete(object: &Value) -> bool {
    let meta = &object["metadata"];
    meta.get("deletionTimestamp").is_some()
        && finalizers(object).next().is_none()
        && meta
            .get("deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0
        && object
            .at("/spec/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::merge;
    use crate::resources::Registry;

    /// The projection-only decision agrees with [`deletion`]: where it says "at once",
    /// `deletion` removes; the rest (grace periods, finalizers, dry runs, propagation
    /// finalizers, namespaces) it leaves to the full path.
    #[test]
    fn deletion_at_once_is_told_from_the_projection() {
        let registry = Registry::with_builtins();
        let pods = registry.get("", "v1", "pods").expect("pods");
        let config_maps = registry.get("", "v1", "configmaps").expect("configmaps");
        let namespaces = registry.get("", "v1", "namespaces").expect("namespaces");
        let pod = |node: &str, phase: &str, extra: &Value| {
            let mut object = json!({"metadata": {"name": "p", "uid": "u", "resourceVersion": "3"},
                                    "spec": {"nodeName": node}, "status": {"phase": phase}});
            merge::merge_patch(&mut object, extra);
            object
        };
        let options = DeleteOptions::default;
        let grace_zero = DeleteOptions {
            grace_period_seconds: Some(0),
            ..DeleteOptions::default()
        };
        let dry_run = DeleteOptions {
            dry_run: true,
            ..DeleteOptions::default()
        };
        let foreground = DeleteOptions {
            propagation: Some(Propagation::Foreground),
            ..DeleteOptions::default()
        };
        let finalizer = json!({"metadata": {"finalizers": ["f"]}});
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
        let plain = json!({});
        #[rustfmt::skip]
        let cases: Vec<(&str, &Resource, Value, DeleteOptions, bool)> = vec![
            ("a finished worker pod", &pods, pod("n1", "Succeeded", &plain), options(), true),
            ("a failed pod", &pods, pod("n1", "Failed", &plain), options(), true),
            ("a pod never bound", &pods, pod("", "Pending", &plain), options(), true),
            ("a running pod: grace period", &pods, pod("n1", "Running", &plain), options(), false),
            ("a running pod, grace 0", &pods, pod("n1", "Running", &plain), grace_zero, true),
            ("a pod held by a finalizer", &pods, pod("n1", "Succeeded", &finalizer), options(), false),
            ("a pod already deleting", &pods, pod("n1", "Running", &deleting), options(), false),
            ("a dry run", &pods, pod("n1", "Succeeded", &plain), dry_run, false),
            ("foreground adds a finalizer", &pods, pod("n1", "Succeeded", &plain), foreground, false),
            ("a config map", &config_maps, json!({"metadata": {"name": "c"}}), options(), true),
            ("a namespace", &namespaces, json!({"metadata": {"name": "ns"}}), options(), false),
        ];
        for (what, resource, object, options, at_once) in cases {
            assert_eq!(
                removes_at_once(resource, &object, &options),
                at_once,
                "{what}"
            );
            if at_once {
                let decided = deletion(resource, object, &options, Timestamp::now());
                assert!(matches!(decided, DeleteStep::Remove(_)), "{what}");
            }
        }
    }
}
