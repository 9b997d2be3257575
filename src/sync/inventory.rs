//! What capstan owns: the inventory of objects applied from Git, kept in the `GitSync`
//! status so that a restarted capstan (or `capstan plan --kubeconfig`) knows what it
//! applied and what to prune, and the stamps every applied object carries.
//!
//! Each entry has a digest of the manifest as applied. At the next sync, a manifest whose
//! digest is unchanged but whose live object differs was changed by hand (drift); a changed
//! digest is a change from Git.

use std::collections::BTreeMap;

use kube::Api;
use serde_json::Value;

use super::manifests::{Manifest, ObjectId};
use super::source::CommitInfo;
use capstan_api::canonical::digest;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};
use capstan_api::{GitSync, InventoryEntry};

/// The `GitSync` name when `--name` is not given.
pub const DEFAULT_SYNC_NAME: &str = "capstan";

/// The inventory, by object.
pub type Inventory = BTreeMap<ObjectId, InventoryEntry>;

/// The inventory entry for an applied manifest.
pub fn entry_of(manifest: &Manifest) -> InventoryEntry {
    InventoryEntry {
        api_version: manifest.api_version.clone(),
        kind: manifest.kind.clone(),
        namespace: manifest.namespace.clone(),
        name: manifest.name.clone(),
        digest: digest(&manifest.object),
    }
}

/// The identity of an inventory entry.
pub fn id_of(entry: &InventoryEntry) -> ObjectId {
    ObjectId {
        group: entry
            .api_version
            .split_once('/')
            .map_or("", |(group, _)| group)
            .to_string(),
        kind: entry.kind.clone(),
        namespace: entry.namespace.clone(),
        name: entry.name.clone(),
    }
}

/// The inventory of a `GitSync` status, by object.
pub fn inventory_of(sync: &GitSync) -> Inventory {
    sync.status
        .iter()
        .flat_map(|status| &status.inventory)
        .map(|entry| (id_of(entry), entry.clone()))
        .collect()
}

/// Reads the `GitSync` named `name` in [`SYSTEM_NAMESPACE`]; `None` when there is none (or
/// the cluster does not serve the kind yet).
pub async fn read_sync(client: &kube::Client, name: &str) -> Result<Option<GitSync>, kube::Error> {
    let api: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    match api.get_opt(name).await {
        Ok(found) => Ok(found),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(err) => Err(err),
    }
}

/// The object as capstan applies it: the manifest's object with the
/// [`REVISION_ANNOTATION`] and [`PULL_REQUEST_ANNOTATION`] of `commit` (the commit that
/// last changed it), so every object, Nodes included, says which commit and pull request
/// its fields from Git came from.
pub fn stamped(object: &Value, revision: &str, pull_request: Option<u64>) -> Value {
    let mut object = object.clone();
    let Some(map) = object.as_object_mut() else {
        return object;
    };
    let metadata = map
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let Some(metadata) = metadata.as_object_mut() else {
        return object;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(annotations) = annotations.as_object_mut() {
        annotations.insert(REVISION_ANNOTATION.into(), revision.into());
        match pull_request {
            Some(number) => {
                annotations.insert(PULL_REQUEST_ANNOTATION.into(), number.to_string().into());
            }
            None => {
                annotations.remove(PULL_REQUEST_ANNOTATION);
            }
        }
    }
    object
}

/// [`stamped`] with a commit's revision and pull request.
pub fn stamped_by(object: &Value, commit: &CommitInfo) -> Value {
    stamped(object, &commit.revision(), commit.pull_request)
}

/// The stamps of a live object: its revision and pull request annotations.
pub fn stamps_of(live: &Value) -> (Option<String>, Option<u64>) {
    let annotations = live.pointer("/metadata/annotations");
    let get = |key: &str| annotations.and_then(|a| a.get(key)).and_then(Value::as_str);
    (
        get(REVISION_ANNOTATION).map(str::to_string),
        get(PULL_REQUEST_ANNOTATION).and_then(|pr| pr.parse().ok()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stamps_are_added_replaced_and_removed() {
        let object = json!({"kind": "Node", "metadata": {"name": "n",
            "annotations": {"keep": "me", "capstan.dev/pull-request": "3"}}});
        let with_pr = stamped(&object, "main@sha1:abc", Some(42));
        assert_eq!(
            with_pr["metadata"]["annotations"],
            json!({"keep": "me", "capstan.dev/pull-request": "42", "capstan.dev/revision": "main@sha1:abc"})
        );
        assert_eq!(
            stamps_of(&with_pr),
            (Some("main@sha1:abc".to_string()), Some(42))
        );
        let without = stamped(&object, "main@sha1:def", None);
        assert_eq!(
            without["metadata"]["annotations"],
            json!({"keep": "me", "capstan.dev/revision": "main@sha1:def"})
        );
        let bare = stamped(
            &json!({"kind": "Namespace", "metadata": {"name": "x"}}),
            "r",
            None,
        );
        assert_eq!(
            bare["metadata"]["annotations"],
            json!({"capstan.dev/revision": "r"})
        );
    }

    #[test]
    fn inventory_entries_round_trip_to_ids() {
        let entry = InventoryEntry {
            api_version: "kmm.sigs.x-k8s.io/v1beta1".into(),
            kind: "Module".into(),
            namespace: Some("kmm".into()),
            name: "a".into(),
            digest: "0".into(),
        };
        assert_eq!(id_of(&entry).to_string(), "Module kmm/a");
        assert_eq!(id_of(&entry).group, "kmm.sigs.x-k8s.io");
    }
}
