//! Managed fields through the `/scale` subresource, as upstream's `ScaleHandler` maps
//! them: a write to a `Scale` is tracked on the `Scale` (whose one owned field is
//! `spec.replicas`), then the owners of the replicas are carried back to the object.
//!
//! An entry is identified as structured-merge-diff identifies managers: by manager,
//! operation and subresource, and for an update also by apiVersion. So an update
//! entry of the object (in its own apiVersion) never matches an entry of the `Scale`
//! (in `autoscaling/v1`): a scale write takes the replicas from every update entry and
//! gives them back as an entry of their own, while an apply entry keeps them in place.

use serde_json::Value;

use super::managed_fields::{ManagedEntry, Operation, stored_entries, text_at};
use crate::patch::fieldset::{FieldSet, PathElement};
use crate::scale;

/// `path` as a set of one field path.
fn field_set(path: &[&str]) -> FieldSet {
    let mut set = FieldSet::default();
    let elements: Vec<PathElement> = path.iter().map(|name| PathElement::field(name)).collect();
    set.insert(&elements);
    set
}

/// `spec.replicas`, the one field a `Scale` tracks.
fn scale_replicas() -> FieldSet {
    field_set(&["spec", "replicas"])
}

/// Whether two entries are the same manager's, as structured-merge-diff keys them.
fn same_manager(a: &ManagedEntry, b: &ManagedEntry) -> bool {
    a.manager == b.manager
        && a.operation == b.operation
        && a.subresource == b.subresource
        && (a.operation == Operation::Apply || a.api_version == b.api_version)
}

/// The managed fields of `object` as its `Scale` shows them (upstream's
/// `ToSubresource`): each entry in the object's apiVersion that owns the replicas at
/// `replicas` becomes an entry owning the `Scale`'s `spec.replicas`, in
/// `autoscaling/v1`; the others are not shown. Unreadable entries are left out.
pub fn scale_managed_fields(object: &Value, replicas: &[&str]) -> Vec<Value> {
    let api_version = text_at(object, "/apiVersion");
    let owned = field_set(replicas);
    stored_entries(object)
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.api_version == api_version && entry.fields.contains(&owned))
        .map(|entry| {
            ManagedEntry {
                api_version: scale::API_VERSION.to_string(),
                fields: scale_replicas(),
                stored_fields: None,
                ..entry
            }
            .encode()
        })
        .collect()
}

/// The managed fields of `object` after a write to its `Scale` left `scale` (upstream's
/// `ToParent`): an entry of the object that owns the replicas keeps them when the same
/// manager owns the `Scale`'s replicas, and loses them otherwise (dropped when nothing
/// is left); each other owner of the `Scale`'s replicas owns the object's replicas in
/// an entry of its own, in the object's apiVersion, without the time the `Scale` gave
/// it (upstream keeps only the object's times). Entries that do not own the replicas,
/// and those of another apiVersion, stay as they are.
pub fn object_managed_fields(object: &Value, scale: &Value, replicas: &[&str]) -> Vec<Value> {
    let api_version = text_at(object, "/apiVersion");
    let owned = field_set(replicas);
    let parents = stored_entries(object).unwrap_or_default();
    let mut owners: Vec<ManagedEntry> = stored_entries(scale)
        .unwrap_or_default()
        .into_iter()
        .filter(|entry| entry.fields.contains(&scale_replicas()))
        .collect();
    let mut kept = Vec::new();
    for entry in &parents {
        if entry.api_version != api_version || !entry.fields.contains(&owned) {
            kept.push(entry.clone());
            continue;
        }
        match owners.iter().position(|owner| same_manager(owner, entry)) {
            Some(index) => {
                owners.remove(index);
                kept.push(entry.clone());
            }
            None => {
                let mut rest = entry.clone();
                rest.set_fields(entry.fields.difference(&owned));
                if !rest.fields.is_empty() {
                    kept.push(rest);
                }
            }
        }
    }
    for owner in owners {
        let time = parents
            .iter()
            .find(|parent| same_manager(parent, &owner))
            .and_then(|parent| parent.time.clone());
        kept.push(ManagedEntry {
            api_version: api_version.clone(),
            time,
            fields: owned.clone(),
            stored_fields: None,
            ..owner
        });
    }
    let kept: Vec<Value> = kept.into_iter().map(ManagedEntry::encode).collect();
    // The same entries in another order: the stored order stays, and the write with it
    // changes nothing.
    let stored: Vec<Value> = parents.into_iter().map(ManagedEntry::encode).collect();
    if kept.len() == stored.len() && kept.iter().all(|entry| stored.contains(entry)) {
        return stored;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(manager: &str, operation: &str, api_version: &str, fields: Value) -> Value {
        json!({"manager": manager, "operation": operation, "apiVersion": api_version,
               "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields})
    }

    fn through_scale(mut entry: Value) -> Value {
        entry["subresource"] = json!("scale");
        entry
    }

    fn deployment(entries: Vec<Value>) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"managedFields": entries}})
    }

    fn without_time(mut entry: Value) -> Value {
        entry.as_object_mut().expect("entry").remove("time");
        entry
    }

    const REPLICAS: &[&str] = &["spec", "replicas"];

    #[test]
    fn the_scale_shows_the_owners_of_the_replicas() {
        let replicas = json!({"f:spec": {"f:replicas": {}}});
        let object = deployment(vec![
            entry(
                "kubectl",
                "Apply",
                "apps/v1",
                json!({"f:spec": {"f:replicas": {}, "f:selector": {}}}),
            ),
            entry(
                "labeller",
                "Update",
                "apps/v1",
                json!({"f:metadata": {"f:labels": {}}}),
            ),
            through_scale(entry("hpa", "Update", "apps/v1", replicas.clone())),
            entry("old", "Update", "apps/v1beta1", replicas.clone()),
        ]);
        assert_eq!(
            scale_managed_fields(&object, REPLICAS),
            vec![
                entry("kubectl", "Apply", "autoscaling/v1", replicas.clone()),
                through_scale(entry("hpa", "Update", "autoscaling/v1", replicas)),
            ]
        );
    }

    /// What upstream's `ToParent` leaves, case by case (checked against kube-apiserver
    /// 1.36 where a case shows in its answers).
    #[test]
    fn the_owners_of_the_scale_replicas_own_the_object_replicas() {
        let replicas = json!({"f:spec": {"f:replicas": {}}});
        let template = json!({"f:spec": {"f:replicas": {}, "f:template": {}}});
        let scale = |entries: Vec<Value>| json!({"metadata": {"managedFields": entries}});
        #[rustfmt::skip]
        // (what, the object's entries, the written Scale's, the object's after)
        type Case = (&'static str, Vec<Value>, Vec<Value>, Vec<Value>);
        let cases: Vec<Case> = vec![
            (
                "a scale writer takes the replicas from an applier, who keeps the rest",
                vec![entry("kubectl", "Apply", "apps/v1", template.clone())],
                vec![through_scale(entry(
                    "kubectl",
                    "Update",
                    "autoscaling/v1",
                    replicas.clone(),
                ))],
                vec![
                    entry(
                        "kubectl",
                        "Apply",
                        "apps/v1",
                        json!({"f:spec": {"f:template": {}}}),
                    ),
                    without_time(through_scale(entry(
                        "kubectl",
                        "Update",
                        "apps/v1",
                        replicas.clone(),
                    ))),
                ],
            ),
            (
                "an applier that still owns the replicas keeps its entry as it is",
                vec![entry("kubectl", "Apply", "apps/v1", template.clone())],
                vec![
                    entry("kubectl", "Apply", "autoscaling/v1", replicas.clone()),
                    through_scale(entry("hpa", "Apply", "autoscaling/v1", replicas.clone())),
                ],
                vec![
                    entry("kubectl", "Apply", "apps/v1", template.clone()),
                    without_time(through_scale(entry(
                        "hpa",
                        "Apply",
                        "apps/v1",
                        replicas.clone(),
                    ))),
                ],
            ),
            (
                "an update entry is never the scale's: its replicas move to an entry of their own",
                vec![entry("creator", "Update", "apps/v1", template.clone())],
                vec![entry(
                    "creator",
                    "Update",
                    "autoscaling/v1",
                    replicas.clone(),
                )],
                vec![
                    entry(
                        "creator",
                        "Update",
                        "apps/v1",
                        json!({"f:spec": {"f:template": {}}}),
                    ),
                    without_time(entry("creator", "Update", "apps/v1", replicas.clone())),
                ],
            ),
            (
                "an entry left with nothing goes",
                vec![through_scale(entry(
                    "hpa",
                    "Update",
                    "apps/v1",
                    replicas.clone(),
                ))],
                vec![through_scale(entry(
                    "other",
                    "Update",
                    "autoscaling/v1",
                    replicas.clone(),
                ))],
                vec![without_time(through_scale(entry(
                    "other",
                    "Update",
                    "apps/v1",
                    replicas.clone(),
                )))],
            ),
            (
                "entries without the replicas stay",
                vec![entry(
                    "labeller",
                    "Update",
                    "apps/v1",
                    json!({"f:metadata": {"f:labels": {}}}),
                )],
                vec![],
                vec![entry(
                    "labeller",
                    "Update",
                    "apps/v1",
                    json!({"f:metadata": {"f:labels": {}}}),
                )],
            ),
        ];
        for (name, before, after, want) in cases {
            assert_eq!(
                object_managed_fields(&deployment(before), &scale(after), REPLICAS),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn custom_replica_paths_are_mapped() {
        let object = json!({"apiVersion": "example.dev/v1", "metadata": {"managedFields": [
            entry("kubectl", "Apply", "example.dev/v1", json!({"f:spec": {"f:size": {"f:count": {}}}}))]}});
        let path: &[&str] = &["spec", "size", "count"];
        let shown = scale_managed_fields(&object, path);
        assert_eq!(
            shown,
            vec![entry(
                "kubectl",
                "Apply",
                "autoscaling/v1",
                json!({"f:spec": {"f:replicas": {}}})
            )]
        );
        let scale = json!({"metadata": {"managedFields": [
            through_scale(entry("hpa", "Update", "autoscaling/v1", json!({"f:spec": {"f:replicas": {}}})))]}});
        assert_eq!(
            object_managed_fields(&object, &scale, path),
            vec![without_time(through_scale(entry(
                "hpa",
                "Update",
                "example.dev/v1",
                json!({"f:spec": {"f:size": {"f:count": {}}}})
            )))]
        );
    }
}
