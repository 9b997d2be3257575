//! Server-side apply and `metadata.managedFields` tracking, following
//! structured-merge-diff: every write records which manager set which fields; an apply
//! merges the manager's configuration into the object, removes what that manager
//! applied before and no longer does, and refuses to change fields other managers own
//! unless forced.
//!
//! [`apply`] is the apply itself; [`update`] records every other write. Both walk the
//! object with the schema ([`walker`]), [`merge`] writes a configuration over the live
//! object, [`changes`] finds what a write changed, [`managed_fields`] reads and writes
//! the entries, and [`conflict`] says what an apply would take from whom. [`scale`]
//! carries the entries between an object and its `/scale` subresource.

mod changes;
mod conflict;
mod managed_fields;
mod merge;
mod scale;
mod update;
mod walker;

use serde_json::{Map, Value};

pub use conflict::{Conflict, ServerSideApplyError};
pub use managed_fields::Operation;
pub use scale::{object_managed_fields, scale_managed_fields};
pub use update::{track_status_update, track_update};

use crate::pointer::Pointer;
use crate::schema::FieldSchema;
use managed_fields::{
    ManagedEntry, owned_besides, stored_entries, text_at, untrack, with_managed_fields,
};
use walker::Walker;

/// Server-side apply of `applied` (the configuration the client sent) by `manager`
/// onto `live` (`None` when the object does not exist yet), recorded at `now` (RFC 3339)
/// and through `subresource` if any. Returns the new object with its
/// `metadata.managedFields` updated.
///
/// Fails with [`ServerSideApplyError::Conflicts`] when, without `force`, the apply changes fields
/// other managers own, and with [`ServerSideApplyError::Invalid`] when `applied` is not an object,
/// sets `metadata.managedFields`, or has a keyed list item without its key or
/// duplicated, or when the live object's managed fields cannot be read.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    schema: &dyn FieldSchema,
    now: &str,
    subresource: Option<&str>,
) -> Result<Value, ServerSideApplyError> {
    let config = apply_configuration(applied)?;
    let mut walker = Walker::new(schema);
    let mut applied_fields = walker.applied_fields(&config)?;
    untrack(&mut applied_fields);
    let nothing = Value::Object(Map::new());
    let base = live.unwrap_or(&nothing);
    let mut entries = stored_entries(base).map_err(|err| {
        ServerSideApplyError::Invalid(format!("failed to decode managed fields: {err}"))
    })?;
    let own = entries
        .iter()
        .position(|entry| entry.is(manager, Operation::Apply, subresource));

    let merged = walker.merge(Some(base), &config);
    let object = match own {
        Some(index) => {
            let still_owned = owned_besides(&entries, index).union(&applied_fields);
            walker.prune(&merged, &entries[index].fields, &still_owned)
        }
        None => merged,
    };

    let (written, removed) = walker.changes(base, &object).written_and_removed();
    let conflicts: Vec<Conflict> = entries
        .iter()
        .enumerate()
        .filter(|(index, _)| Some(*index) != own)
        .flat_map(|(_, entry)| entry.conflicts(&written))
        .collect();
    if !force && !conflicts.is_empty() {
        return Err(ServerSideApplyError::Conflicts(conflicts));
    }
    for (index, entry) in entries.iter_mut().enumerate() {
        if Some(index) != own {
            entry.give_up(&written, &removed);
        }
    }

    let api_version = text_at(&object, "/apiVersion");
    let changed = live != Some(&object);
    match own {
        Some(index) => {
            let entry = &mut entries[index];
            if entry.fields != applied_fields {
                entry.set_fields(applied_fields);
            }
            entry.api_version = api_version;
            // Upstream stamps the time only when the apply changed the object.
            if changed {
                entry.time = Some(now.to_string());
            }
        }
        None => entries.push(ManagedEntry {
            manager: manager.to_string(),
            operation: Operation::Apply,
            api_version,
            time: Some(now.to_string()),
            subresource: subresource.map(str::to_string),
            fields: applied_fields,
            stored_fields: None,
        }),
    }
    entries.retain(|entry| !entry.fields.is_empty());
    Ok(with_managed_fields(object, entries))
}

/// The configuration to apply, without its nulls (a null means no opinion); fails
/// when it is not an object or sets managed fields, as upstream.
fn apply_configuration(applied: &Value) -> Result<Value, ServerSideApplyError> {
    if !applied.is_object() {
        return Err(ServerSideApplyError::Invalid(
            "the apply configuration must be a JSON object".to_string(),
        ));
    }
    if applied
        .at("/metadata/managedFields")
        .is_some_and(|fields| !fields.is_null())
    {
        return Err(ServerSideApplyError::Invalid(
            "metadata.managedFields must be nil".to_string(),
        ));
    }
    Ok(without_nulls(applied))
}

fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(_, value)| !value.is_null())
                .map(|(name, value)| (name.clone(), without_nulls(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::fieldset::path_text;
    use crate::schema::BuiltinSchema;
    use serde_json::json;

    pub(super) const EARLIER: &str = "2024-05-01T10:00:00Z";

    pub(super) const NOW: &str = "2024-05-01T10:05:00Z";

    pub(super) fn deployment(spec: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec
        })
    }

    pub(super) fn container(name: &str, image: &str) -> Value {
        json!({"name": name, "image": image})
    }

    pub(super) fn with_containers(containers: Value) -> Value {
        deployment(json!({"template": {"spec": {"containers": containers}}}))
    }

    pub(super) fn apply_as(
        live: Option<&Value>,
        config: &Value,
        manager: &str,
    ) -> Result<Value, ServerSideApplyError> {
        apply(live, config, manager, false, &BuiltinSchema, NOW, None)
    }

    /// The object after each manager applied its configuration in turn.
    pub(super) fn applied_in_turn(steps: &[(&str, Value)]) -> Value {
        let mut live = None;
        for (manager, config) in steps {
            let next = apply(
                live.as_ref(),
                config,
                manager,
                false,
                &BuiltinSchema,
                EARLIER,
                None,
            );
            live = Some(next.unwrap());
        }
        live.unwrap()
    }

    pub(super) fn entries(object: &Value) -> Vec<ManagedEntry> {
        stored_entries(object).unwrap()
    }

    /// The paths `manager` owns, in upstream notation, over all its entries.
    pub(super) fn owned(object: &Value, manager: &str) -> Vec<String> {
        entries(object)
            .iter()
            .filter(|entry| entry.manager == manager)
            .flat_map(|entry| entry.fields.paths())
            .map(|path| path_text(&path))
            .collect()
    }

    pub(super) fn owners_of(object: &Value, field: &str) -> Vec<String> {
        entries(object)
            .iter()
            .filter(|entry| {
                entry
                    .fields
                    .paths()
                    .iter()
                    .any(|path| path_text(path) == field)
            })
            .map(|entry| entry.manager.clone())
            .collect()
    }

    pub(super) fn without_managed_fields(object: &Value) -> Value {
        with_managed_fields(object.clone(), Vec::new())
    }

    #[test]
    fn first_apply_creates_the_object_and_owns_every_field() {
        let config = deployment(json!({
            "replicas": 3,
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container("app", "nginx:1")]}
            }
        }));

        let created = apply_as(None, &config, "kubectl").unwrap();

        assert_eq!(without_managed_fields(&created), config);
        assert_eq!(
            created["metadata"]["managedFields"],
            json!([{
                "manager": "kubectl",
                "operation": "Apply",
                "apiVersion": "apps/v1",
                "time": NOW,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {
                    "f:replicas": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                            ".": {}, "f:image": {}, "f:name": {}
                        }}}
                    }
                }}
            }])
        );
    }

    #[test]
    fn reapplying_the_same_configuration_changes_nothing() {
        let config = with_containers(json!([container("app", "nginx:1")]));
        let live = applied_in_turn(&[("kubectl", config.clone())]);

        let again = apply_as(Some(&live), &config, "kubectl").unwrap();

        assert_eq!(again, live, "not even the entry's time moves");
    }

    #[test]
    fn two_managers_applying_different_fields_each_own_theirs() {
        let live = applied_in_turn(&[
            ("alice", deployment(json!({"replicas": 3}))),
            ("bob", deployment(json!({"minReadySeconds": 5}))),
        ]);

        assert_eq!(live["spec"], json!({"replicas": 3, "minReadySeconds": 5}));
        assert_eq!(owned(&live, "alice"), [".spec.replicas"]);
        assert_eq!(owned(&live, "bob"), [".spec.minReadySeconds"]);
    }

    #[test]
    fn a_field_dropped_from_the_configuration() {
        // (scenario, does another manager also own minReadySeconds, how the field is dropped, kept?)
        let cases = [
            ("left out, owned by nobody else", false, None, false),
            (
                "set to null, owned by nobody else",
                false,
                Some(Value::Null),
                false,
            ),
            ("left out, also owned by bob", true, None, true),
        ];
        for (scenario, shared, dropped_as, kept) in cases {
            let mut steps = vec![(
                "alice",
                deployment(json!({"replicas": 3, "minReadySeconds": 5})),
            )];
            if shared {
                steps.push(("bob", deployment(json!({"minReadySeconds": 5}))));
            }
            let live = applied_in_turn(&steps);
            let mut spec = json!({"replicas": 3});
            if let Some(value) = dropped_as {
                spec["minReadySeconds"] = value;
            }

            let object = apply_as(Some(&live), &deployment(spec), "alice").unwrap();

            assert_eq!(
                object["spec"].get("minReadySeconds").is_some(),
                kept,
                "{scenario}"
            );
            assert_eq!(owned(&object, "alice"), [".spec.replicas"], "{scenario}");
        }
    }

    #[test]
    fn dropping_a_container_removes_only_that_container() {
        let app = json!({"name": "app", "image": "app:1", "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "2"}
        ]});
        let live = applied_in_turn(&[(
            "kubectl",
            with_containers(json!([app, container("sidecar", "proxy:1")])),
        )]);
        // Another writer adds a container of its own.
        let mut edited = live.clone();
        edited["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(container("debug", "busybox"));
        let live = track_update(
            Some(&live),
            edited,
            "kubectl-edit",
            &BuiltinSchema,
            EARLIER,
            None,
        );

        let config = with_containers(json!([
            {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]}
        ]));
        let object = apply_as(Some(&live), &config, "kubectl").unwrap();

        assert_eq!(
            object["spec"]["template"]["spec"]["containers"],
            json!([
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
                container("debug", "busybox")
            ])
        );
        assert_eq!(
            owners_of(&object, r#".spec.template.spec.containers[name="debug"]"#),
            ["kubectl-edit"]
        );
    }

    #[test]
    fn labels_are_owned_one_by_one() {
        let labelled = |labels: Value| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "labels": labels}})
        };
        let live = applied_in_turn(&[
            ("alice", labelled(json!({"app": "web"}))),
            ("bob", labelled(json!({"tier": "front"}))),
        ]);
        assert_eq!(
            live["metadata"]["labels"],
            json!({"app": "web", "tier": "front"})
        );
        assert_eq!(
            entries(&live)[0].fields.to_fields_v1(),
            json!({"f:metadata": {"f:labels": {"f:app": {}}}})
        );

        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}});
        let object = apply_as(Some(&live), &config, "alice").unwrap();

        assert_eq!(object["metadata"]["labels"], json!({"tier": "front"}));
        assert_eq!(
            owned(&object, "alice"),
            Vec::<String>::new(),
            "alice's entry is gone"
        );
        assert_eq!(entries(&object).len(), 1);
    }

    #[test]
    fn finalizers_merge_as_a_set() {
        let with_finalizers = |finalizers: Value| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm", "finalizers": finalizers}})
        };
        let live = applied_in_turn(&[
            ("alice", with_finalizers(json!(["a.example/one"]))),
            (
                "bob",
                with_finalizers(json!(["b.example/two", "a.example/one"])),
            ),
        ]);

        assert_eq!(
            live["metadata"]["finalizers"],
            json!(["b.example/two", "a.example/one"])
        );
        assert_eq!(
            entries(&live)[1].fields.to_fields_v1(),
            json!({"f:metadata": {"f:finalizers": {"v:\"a.example/one\"": {}, "v:\"b.example/two\"": {}}}})
        );
        assert_eq!(
            owners_of(&live, r#".metadata.finalizers[="a.example/one"]"#),
            ["alice", "bob"]
        );

        let object = apply_as(
            Some(&live),
            &with_finalizers(json!(["a.example/one"])),
            "bob",
        )
        .unwrap();
        assert_eq!(object["metadata"]["finalizers"], json!(["a.example/one"]));
    }

    #[test]
    fn atomic_lists_are_replaced_whole() {
        let pod = |tolerations: Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"tolerations": tolerations}})
        };
        let live = applied_in_turn(&[("alice", pod(json!([{"key": "a"}, {"key": "b"}])))]);
        assert_eq!(
            entries(&live)[0].fields.to_fields_v1(),
            json!({"f:spec": {"f:tolerations": {}}})
        );

        let object = apply_as(Some(&live), &pod(json!([{"key": "c"}])), "alice").unwrap();
        assert_eq!(object["spec"]["tolerations"], json!([{"key": "c"}]));

        let err = apply_as(Some(&live), &pod(json!([{"key": "c"}])), "bob").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "alice": .spec.tolerations"#
        );
    }

    #[test]
    fn keyed_list_items_follow_the_configuration_order() {
        let live = applied_in_turn(&[
            (
                "alice",
                with_containers(json!([container("a", "1"), container("b", "1")])),
            ),
            ("bob", with_containers(json!([container("x", "1")]))),
        ]);
        assert_eq!(
            live["spec"]["template"]["spec"]["containers"],
            json!([
                container("a", "1"),
                container("b", "1"),
                container("x", "1")
            ])
        );

        let config = with_containers(json!([
            container("b", "1"),
            container("a", "1"),
            container("c", "1")
        ]));
        let object = apply_as(Some(&live), &config, "alice").unwrap();

        assert_eq!(
            object["spec"]["template"]["spec"]["containers"],
            json!([
                container("b", "1"),
                container("x", "1"),
                container("a", "1"),
                container("c", "1")
            ]),
            "shared items take the configuration's order around bob's, new ones come last"
        );
    }

    #[test]
    fn ports_without_a_protocol_are_keyed_as_tcp() {
        let with_ports = |ports: Value| {
            with_containers(json!([{"name": "app", "image": "app:1", "ports": ports}]))
        };
        let created = track_update(
            None,
            with_ports(json!([{"containerPort": 80, "protocol": "TCP"}])),
            "creator",
            &BuiltinSchema,
            EARLIER,
            None,
        );

        let object = apply_as(
            Some(&created),
            &with_ports(json!([{"containerPort": 80}])),
            "kubectl",
        )
        .unwrap();

        let ports = &object["spec"]["template"]["spec"]["containers"][0]["ports"];
        assert_eq!(ports, &json!([{"containerPort": 80, "protocol": "TCP"}]));
        assert!(owned(&object, "kubectl").contains(
            &r#".spec.template.spec.containers[name="app"].ports[containerPort=80,protocol="TCP"]"#.to_string()
        ));
    }

    #[test]
    fn unusable_configurations_are_invalid() {
        let cases = [
            (json!([1]), "the apply configuration must be a JSON object"),
            (
                json!({"metadata": {"name": "x", "managedFields": []}}),
                "metadata.managedFields must be nil",
            ),
            (
                with_containers(json!([{"image": "nginx"}])),
                ".spec.template.spec.containers: element 0: associative list with keys has an \
                 element that omits key field \"name\" (and doesn't have default value)",
            ),
            (
                with_containers(json!([container("app", "1"), container("app", "2")])),
                ".spec.template.spec.containers: duplicate entries for key [name=\"app\"]",
            ),
        ];
        for (config, message) in cases {
            match apply_as(None, &config, "kubectl") {
                Err(ServerSideApplyError::Invalid(reason)) => assert_eq!(reason, message),
                other => panic!("{config}: unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn unreadable_stored_managed_fields_refuse_an_apply() {
        let mut live = deployment(json!({"replicas": 1}));
        live["metadata"]["managedFields"] =
            json!([{"manager": "x", "operation": "Apply", "fieldsType": "FieldsV9"}]);

        let err =
            apply_as(Some(&live), &deployment(json!({"replicas": 2})), "kubectl").unwrap_err();

        assert_eq!(
            err.to_string(),
            r#"failed to decode managed fields: invalid fieldsType "FieldsV9" in a managed fields entry"#
        );
    }

    #[test]
    fn an_apply_that_changes_the_object_stamps_the_time() {
        let live = applied_in_turn(&[("alice", deployment(json!({"replicas": 3})))]);
        assert_eq!(live["metadata"]["managedFields"][0]["time"], EARLIER);

        let object = apply_as(Some(&live), &deployment(json!({"replicas": 4})), "alice").unwrap();

        assert_eq!(object["metadata"]["managedFields"][0]["time"], NOW);
    }

    #[test]
    fn inputs_are_left_untouched() {
        let live = applied_in_turn(&[("alice", deployment(json!({"replicas": 3})))]);
        let config = deployment(json!({"replicas": 3, "paused": null}));
        let (live_before, config_before) = (live.clone(), config.clone());

        let _ = apply_as(Some(&live), &config, "bob");
        let _ = track_update(
            Some(&live),
            config.clone(),
            "bob",
            &BuiltinSchema,
            NOW,
            None,
        );

        assert_eq!(live, live_before);
        assert_eq!(config, config_before);
    }
}
