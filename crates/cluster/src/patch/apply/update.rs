//! Managed fields of writes other than an apply (create, update, merge, JSON or
//! strategic patch, status writes): the writer takes what it changed, everyone loses
//! what the write dropped.

use serde_json::{Map, Value};

use super::changes::Changes;
use super::managed_fields::{
    ManagedEntry, Operation, UNTRACKED_METADATA, starting_entries, text_at,
    with_encoded_managed_fields,
};
use super::walker::Walker;
use crate::patch::fieldset::{FieldSet, PathElement};
use crate::pointer::Pointer;
use crate::schema::FieldSchema;

/// Records a write other than an apply (create, update, merge/JSON/strategic patch) by
/// `manager` from `old` (`None` on create) to `new`, at `now` (RFC 3339) and through
/// `subresource` if any: fields `new` adds or changes become `manager`'s (an "Update"
/// entry) and are taken from every other manager, and fields `new` drops are taken from
/// every manager. Returns `new` with `metadata.managedFields` set.
///
/// Like upstream, managed fields the client edited in `new` are honoured (a single
/// empty entry resets them), except through a subresource; unreadable ones fall back to
/// those of `old`, and unreadable stored ones are dropped. Never fails.
pub fn track_update(
    old: Option<&Value>,
    new: Value,
    manager: &str,
    schema: &dyn FieldSchema,
    now: &str,
    subresource: Option<&str>,
) -> Value {
    if old.is_none() && subresource.is_none() && new.at("/metadata/managedFields").is_none() {
        return track_create(new, manager, schema, now);
    }
    track_changes(old, new, manager, schema, now, subresource)
}

/// [`track_update`] of a create whose object carries no managed fields: the creator's
/// entry owns every field, encoded as `FieldsV1` straight from the object in one walk.
/// It is the entry [`track_changes`] finds with nothing before (the tests hold the two
/// to the same answers), without building the field set only to encode it.
fn track_create(new: Value, manager: &str, schema: &dyn FieldSchema, now: &str) -> Value {
    let mut walker = Walker::new(schema);
    let mut fields = Map::new();
    if let Value::Object(top) = &new {
        for (name, value) in top {
            // Untracked, as `untrack` leaves them.
            if name == "apiVersion" || name == "kind" {
                continue;
            }
            walker.names.push(name);
            let mut child = Value::Object(walker.whole::<Map<String, Value>>(value));
            walker.names.pop();
            if name == "metadata"
                && let Value::Object(metadata) = &mut child
            {
                for untracked in UNTRACKED_METADATA {
                    metadata.remove(&PathElement::field(untracked).encode());
                }
                metadata.remove(".");
                if metadata.is_empty() {
                    continue;
                }
            }
            fields.insert(PathElement::field(name).encode(), child);
        }
    }
    if fields.is_empty() {
        return with_encoded_managed_fields(new, Vec::new());
    }
    let entry = ManagedEntry {
        manager: manager.to_string(),
        operation: Operation::Update,
        api_version: text_at(&new, "/apiVersion"),
        time: Some(now.to_string()),
        subresource: None,
        fields: FieldSet::default(),
        stored_fields: Some(Value::Object(fields)),
    };
    with_encoded_managed_fields(new, vec![entry.encode()])
}

/// [`track_update`] by comparing `old` (nothing, on a create) with `new`.
fn track_changes(
    old: Option<&Value>,
    new: Value,
    manager: &str,
    schema: &dyn FieldSchema,
    now: &str,
    subresource: Option<&str>,
) -> Value {
    let nothing = Value::Object(Map::new());
    let old = old.unwrap_or(&nothing);
    let (written, removed) = Walker::new(schema).changes(old, &new).written_and_removed();
    let mut new = new;
    let untouched = untouched_by(manager, subresource, &written, &removed);
    let slots = starting_slots(old, &mut new, subresource.is_some(), untouched);
    record_write(new, slots, written, &removed, manager, subresource, now)
}

/// [`track_update`] of a write through the status subresource that changed the status
/// alone, from `old_status` to the status of `new`, which carries the stored managed
/// fields: the two statuses are compared, not the whole objects, whose other fields are
/// the same (the simulated kubelet's status writes).
pub fn track_status_update(
    old_status: Option<&Value>,
    mut new: Value,
    manager: &str,
    schema: &dyn FieldSchema,
    now: &str,
) -> Value {
    let mut changes = Changes::default();
    Walker::new(schema).in_field("status", |walker| {
        walker.compare(old_status, new.get("status"), &mut changes)
    });
    let (written, removed) = changes.tracked().written_and_removed();
    let subresource = Some("status");
    let untouched = untouched_by(manager, subresource, &written, &removed);
    let stored = new.pointer_mut("/metadata/managedFields").map(Value::take);
    let slots = starting_slots_owned(stored, untouched);
    record_write(new, slots, written, &removed, manager, subresource, now)
}

/// The stored entries as slots, taken rather than copied: those `untouched` picks left
/// undecoded.
fn starting_slots_owned(stored: Option<Value>, untouched: impl Fn(&Value) -> bool) -> Vec<Slot> {
    let slots: Result<Vec<Slot>, String> = match stored {
        Some(Value::Array(entries)) => entries
            .into_iter()
            .map(|entry| {
                if untouched(&entry) {
                    Ok(Slot::Untouched(entry))
                } else {
                    ManagedEntry::decode(&entry).map(Slot::Entry)
                }
            })
            .collect(),
        _ => Ok(Vec::new()),
    };
    // Unreadable stored entries are dropped, as `starting_slots` drops them.
    slots.unwrap_or_default()
}

/// Which stored entries a write of `written` and `removed` by `manager` leaves as they
/// are: entries that own none of those fields lose nothing, and stay as stored, neither
/// decoded nor encoded again (the pod's creator, on the kubelet's status write).
fn untouched_by<'a>(
    manager: &'a str,
    subresource: Option<&'a str>,
    written: &'a FieldSet,
    removed: &'a FieldSet,
) -> impl Fn(&Value) -> bool + 'a {
    move |entry: &Value| {
        let text = |name: &str| entry.get(name).and_then(Value::as_str);
        let is_writer = text("manager") == Some(manager)
            && text("operation") == Some(Operation::Update.as_str())
            && text("subresource").filter(|s| !s.is_empty()) == subresource;
        !is_writer
            && entry
                .get("fieldsV1")
                .and_then(Value::as_object)
                .is_some_and(|fields| {
                    fields.keys().any(|name| name != ".")
                        && owns_none(fields, written)
                        && owns_none(fields, removed)
                })
    }
}

/// `new` with the managed fields of a write by `manager` of `written` (and of dropping
/// `removed`), starting from the stored entries' `slots`.
fn record_write(
    new: Value,
    mut slots: Vec<Slot>,
    written: FieldSet,
    removed: &FieldSet,
    manager: &str,
    subresource: Option<&str>,
    now: &str,
) -> Value {
    let nothing_taken = FieldSet::default();
    for entry in slots.iter_mut().filter_map(Slot::entry) {
        // The writer's own entry keeps what it writes again.
        let taken = if entry.is(manager, Operation::Update, subresource) {
            &nothing_taken
        } else {
            &written
        };
        entry.give_up(taken, removed);
    }
    if !written.is_empty() {
        let api_version = text_at(&new, "/apiVersion");
        match slots
            .iter_mut()
            .filter_map(Slot::entry)
            .find(|entry| entry.is(manager, Operation::Update, subresource))
        {
            Some(entry) => {
                entry.take(&written);
                entry.api_version = api_version;
                entry.time = Some(now.to_string());
            }
            None => slots.push(Slot::Entry(ManagedEntry {
                manager: manager.to_string(),
                operation: Operation::Update,
                api_version,
                time: Some(now.to_string()),
                subresource: subresource.map(str::to_string),
                fields: written,
                stored_fields: None,
            })),
        }
    }
    let encoded = slots
        .into_iter()
        .filter_map(|slot| match slot {
            Slot::Entry(entry) => (!entry.fields.is_empty()).then(|| entry.encode()),
            Slot::Untouched(entry) => Some(entry),
        })
        .collect();
    with_encoded_managed_fields(new, encoded)
}

/// A managed-fields entry an update works with: decoded, or left as stored.
enum Slot {
    Entry(ManagedEntry),
    Untouched(Value),
}

impl Slot {
    pub(super) fn entry(&mut self) -> Option<&mut ManagedEntry> {
        match self {
            Slot::Entry(entry) => Some(entry),
            Slot::Untouched(_) => None,
        }
    }
}

/// Whether the stored `fieldsV1` (`raw`) holds no path of `set`, read without decoding
/// it. `false` when that cannot be told for sure: a keyed or set item of `set` that the
/// stored level may spell differently (a client's own spelling of a key is stored as
/// sent).
fn owns_none(raw: &Map<String, Value>, set: &FieldSet) -> bool {
    set.elements().all(|element| {
        let name = element.encode();
        let Some(stored) = raw.get(&name) else {
            return matches!(element, PathElement::Field(_))
                || !raw.keys().any(|key| key.get(..2) == name.get(..2));
        };
        let Some(stored) = stored.as_object() else {
            return false;
        };
        let below = set.child(element).expect("an element of the set");
        let stored_member = stored.is_empty() || stored.contains_key(".");
        !(below.is_member() && stored_member) && owns_none(stored, below)
    })
}

/// [`starting_entries`], with the stored entries `untouched` picks left undecoded (and
/// taken out of `new` when it carries them as stored, so they are not copied). Only
/// entries as stored are left so (the server wrote and read them before); entries a
/// client wrote are all decoded, and fall back as `starting_entries` says.
fn starting_slots(
    old: &Value,
    new: &mut Value,
    through_subresource: bool,
    untouched: impl Fn(&Value) -> bool,
) -> Vec<Slot> {
    let stored = old.at("/metadata/managedFields");
    let carried = new.at("/metadata/managedFields");
    let as_stored = through_subresource || carried == stored;
    let Some(Value::Array(stored)) = stored.filter(|_| as_stored) else {
        return starting_entries(old, new, through_subresource)
            .into_iter()
            .map(Slot::Entry)
            .collect();
    };
    // The copy `new` carries, when it is the stored one, is taken rather than cloned.
    let mut carried = match new.pointer_mut("/metadata/managedFields") {
        Some(carried) if carried.as_array() == Some(stored) => match carried.take() {
            Value::Array(entries) => entries.into_iter().map(Some).collect(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    };
    let slots: Result<Vec<Slot>, String> = stored
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            if untouched(entry) {
                let owned = carried.get_mut(index).and_then(Option::take);
                Ok(Slot::Untouched(owned.unwrap_or_else(|| entry.clone())))
            } else {
                ManagedEntry::decode(entry).map(Slot::Entry)
            }
        })
        .collect();
    // Unreadable stored entries are dropped, as `starting_entries` drops them.
    slots.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::apply::apply;
    use crate::patch::apply::tests::*;
    use crate::schema::BuiltinSchema;
    use serde_json::json;

    #[test]
    fn status_subresource_entries_are_separate() {
        let live = applied_in_turn(&[("ctl", deployment(json!({"replicas": 2})))]);
        let status = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "web"}, "status": {"readyReplicas": 2}});

        let object = apply(
            Some(&live),
            &status,
            "ctl",
            false,
            &BuiltinSchema,
            NOW,
            Some("status"),
        )
        .unwrap();
        let object = apply_as(Some(&object), &deployment(json!({"replicas": 2})), "ctl").unwrap();

        assert_eq!(
            object["status"],
            json!({"readyReplicas": 2}),
            "the main apply leaves status alone"
        );
        let managed = &object["metadata"]["managedFields"];
        assert_eq!(managed.as_array().unwrap().len(), 2);
        assert_eq!(managed[1]["subresource"], "status");
        assert_eq!(
            managed[1]["fieldsV1"],
            json!({"f:status": {"f:readyReplicas": {}}})
        );
        assert!(managed[0].get("subresource").is_none());

        let mut updated = object.clone();
        updated["status"]["readyReplicas"] = json!(1);
        let updated = track_update(
            Some(&object),
            updated,
            "ctl",
            &BuiltinSchema,
            NOW,
            Some("status"),
        );
        let managed = &updated["metadata"]["managedFields"];
        assert_eq!(
            managed.as_array().unwrap().len(),
            2,
            "the status apply lost its only field"
        );
        assert_eq!(managed[1]["operation"], "Update");
        assert_eq!(managed[1]["subresource"], "status");
    }

    #[test]
    fn stored_fields_are_read_undecoded_only_when_that_is_sure() {
        let set = |paths: &[Vec<PathElement>]| {
            let mut set = FieldSet::default();
            for path in paths {
                set.insert(path);
            }
            set
        };
        let f = PathElement::field;
        let phase = set(&[vec![f("status"), f("phase")]]);
        let image = set(&[vec![
            f("spec"),
            f("containers"),
            PathElement::key(vec![("name".into(), json!("a"))]),
            f("image"),
        ]]);
        let cases = [
            (
                "the status object, not its phase",
                json!({"f:status": {}}),
                &phase,
                true,
            ),
            (
                "the phase itself",
                json!({"f:status": {".": {}, "f:phase": {}}}),
                &phase,
                false,
            ),
            (
                "another label",
                json!({"f:metadata": {"f:labels": {"f:b": {}}}}),
                &phase,
                true,
            ),
            (
                "the container's image",
                json!({"f:spec": {"f:containers": {
                "k:{\"name\":\"a\"}": {".": {}, "f:image": {}}}}}),
                &image,
                false,
            ),
            (
                "another container",
                json!({"f:spec": {"f:containers": {
                "k:{\"name\":\"b\"}": {".": {}, "f:image": {}}}}}),
                &image,
                false,
            ),
            (
                "no container at all",
                json!({"f:spec": {"f:containers": {}}}),
                &image,
                true,
            ),
            (
                "a key spelled otherwise",
                json!({"f:spec": {"f:containers": {
                "k:{\"name\": \"a\"}": {"f:image": {}}}}}),
                &image,
                false,
            ),
        ];
        for (name, raw, set, none) in cases {
            let raw = raw.as_object().unwrap();
            assert_eq!(owns_none(raw, set), none, "{name}");
            if none {
                let decoded = FieldSet::from_fields_v1(&Value::Object(raw.clone())).unwrap();
                assert!(!decoded.intersects(set), "{name}: decoded, it agrees");
            }
        }
    }

    /// A create's entry, encoded straight from the object, is the one the comparison
    /// with nothing finds, whatever the object holds: keyed, set and atomic lists,
    /// repeated and keyless items, empty values, untracked metadata alone, no metadata.
    #[test]
    fn a_create_encodes_the_entry_the_comparison_finds() {
        use crate::schema::{CrdSchema, WithMetadata};
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "w", "namespace": "kmm", "generateName": "w-",
                         "labels": {"app": "kmm-worker", "empty": ""},
                         "annotations": {"config": "a: 1\n"},
                         "finalizers": ["a", "b", "a"],
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1",
                                              "uid": "u1", "controller": true}]},
            "spec": {
                "nodeName": "n1", "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "containers": [
                    {"name": "worker", "image": "i:1", "args": ["kmod", "load", "/c"],
                     "securityContext": {"privileged": true, "capabilities": {"add": []}},
                     "ports": [{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 80, "protocol": "UDP"}],
                     "env": [{"name": "A", "value": "1"},
                             {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     "volumeMounts": [{"name": "config", "mountPath": "/c"}],
                     "resources": {}},
                    {"name": "worker", "image": "repeated:1"}
                ],
                "volumes": [{"name": "config", "downwardAPI": {"items": [{"path": "c", "fieldRef": {"fieldPath": "x"}}]}},
                            {"hostPath": {"path": "/keyless"}}],
                "tolerations": [{"operator": "Exists"}],
                "imagePullSecrets": []
            },
            "status": {"phase": "Pending"}
        });
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "n1.1", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": "n1"}, "reason": "ModuleLoaded",
            "count": 1, "type": "Normal", "related": null
        });
        let builtin_cases = [
            pod,
            event,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "uid": "u"}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": "odd", "data": {}}),
            json!({"kind": "ConfigMap", "data": {"a": "b"}}),
            json!({"apiVersion": "v1", "kind": "List"}),
            json!({}),
        ];
        for object in builtin_cases {
            let fast = track_create(object.clone(), "creator", &BuiltinSchema, NOW);
            let compared =
                track_changes(None, object.clone(), "creator", &BuiltinSchema, NOW, None);
            assert_eq!(fast, compared, "{object}");
            assert_eq!(
                track_update(None, object.clone(), "creator", &BuiltinSchema, NOW, None),
                fast
            );
        }

        let crd = WithMetadata(CrdSchema::new(json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "modules": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name", "namespace"],
                            "items": {"type": "object"}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "args": {"type": "array", "items": {"type": "string"}}}}}
        })));
        let nmc = json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
            "metadata": {"name": "n1", "labels": {"a": "b"}},
            "spec": {"modules": [{"name": "m", "namespace": "kmm", "config": {"image": "i", "inTree": []}},
                                 {"name": "m", "namespace": "other"},
                                 {"name": "m", "namespace": "kmm", "config": {}}],
                     "tags": ["x", "y", "x"], "args": ["a", "a"]}
        });
        let fast = track_create(nmc.clone(), "creator", &crd, NOW);
        assert_eq!(fast, track_changes(None, nmc, "creator", &crd, NOW, None));
        assert_eq!(
            fast["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:modules"]
                .as_object()
                .map(Map::len),
            Some(3),
            "`.` and two keyed items, the repeated one once"
        );
    }

    /// A write whose fields lie elsewhere leaves an entry exactly as stored; one that
    /// touches its fields takes them, through the status subresource as elsewhere.
    #[test]
    fn entries_a_write_does_not_touch_stay_as_stored() {
        let created = track_update(
            None,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "b"}},
                   "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}),
            "creator",
            &BuiltinSchema,
            EARLIER,
            None,
        );
        let creator_entry = created["metadata"]["managedFields"][0].clone();
        assert_eq!(
            creator_entry["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {".": {}, "f:nodeName": {}},
                   "f:status": {".": {}, "f:phase": {}}})
        );

        // The kubelet changes the phase the creator set: the creator gives it up.
        let mut running = created.clone();
        running["status"] = json!({"phase": "Running", "podIP": "10.0.0.1"});
        let running = track_update(
            Some(&created),
            running,
            "kubelet",
            &BuiltinSchema,
            NOW,
            Some("status"),
        );
        let managed = running["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(
            managed[0]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}, "f:spec": {".": {}, "f:nodeName": {}},
                   "f:status": {}}),
            "the creator keeps the status object, not the phase"
        );
        assert_eq!(managed[0]["time"], EARLIER);
        assert_eq!(
            managed[1]["fieldsV1"],
            json!({"f:status": {"f:phase": {}, "f:podIP": {}}})
        );

        // A label write does not touch the kubelet's entry: kept as stored, byte for byte.
        let mut labelled = running.clone();
        labelled["metadata"]["labels"]["c"] = json!("d");
        let labelled = track_update(
            Some(&running),
            labelled,
            "labeller",
            &BuiltinSchema,
            NOW,
            None,
        );
        let after = labelled["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(after.len(), 3);
        assert_eq!(after[0], managed[0], "the creator owns no label it changed");
        assert_eq!(after[1], managed[1], "the kubelet's entry as stored");
        assert_eq!(
            after[2]["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:c": {}}}})
        );

        // A status write that drops the pod IP: the kubelet's own entry loses it.
        let mut dropped = labelled.clone();
        dropped["status"].as_object_mut().unwrap().remove("podIP");
        let dropped = track_update(
            Some(&labelled),
            dropped,
            "other",
            &BuiltinSchema,
            NOW,
            Some("status"),
        );
        let last = dropped["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(last[0], after[0], "the creator's entry as stored");
        assert_eq!(last[1]["fieldsV1"], json!({"f:status": {"f:phase": {}}}));
        assert_eq!(last[2], after[2], "the labeller's entry as stored");
        assert_eq!(last.len(), 3, "a removal alone gives nobody a new entry");
    }

    #[test]
    fn creating_gives_the_creator_every_field() {
        let object = deployment(json!({
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [container("app", "nginx")]}
            }
        }));

        let created = track_update(
            None,
            object.clone(),
            "kubectl-create",
            &BuiltinSchema,
            NOW,
            None,
        );

        assert_eq!(without_managed_fields(&created), object);
        assert_eq!(
            created["metadata"]["managedFields"],
            json!([{
                "manager": "kubectl-create",
                "operation": "Update",
                "apiVersion": "apps/v1",
                "time": NOW,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {
                    ".": {},
                    "f:replicas": {},
                    "f:template": {
                        ".": {},
                        "f:metadata": {".": {}, "f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {".": {}, "f:containers": {
                            ".": {},
                            "k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}
                        }}
                    }
                }}
            }])
        );
    }

    #[test]
    fn an_update_moves_ownership_of_what_it_changes() {
        // (scenario, new spec written by "editor", alice's fields after, editor's fields after)
        let cases: [(&str, Value, &[&str], &[&str]); 4] = [
            (
                "a changed field moves to the editor",
                json!({"replicas": 5, "paused": false}),
                &[".spec.paused"],
                &[".spec.replicas"],
            ),
            (
                "a removed field leaves every manager",
                json!({"replicas": 3}),
                &[".spec.replicas"],
                &[],
            ),
            (
                "an added field goes to the editor only",
                json!({"replicas": 3, "paused": false, "minReadySeconds": 4}),
                &[".spec.paused", ".spec.replicas"],
                &[".spec.minReadySeconds"],
            ),
            (
                "an unchanged object records nothing",
                json!({"replicas": 3, "paused": false}),
                &[".spec.paused", ".spec.replicas"],
                &[],
            ),
        ];
        for (scenario, spec, alice, editor) in cases {
            let live =
                applied_in_turn(&[("alice", deployment(json!({"replicas": 3, "paused": false})))]);
            let mut new = live.clone();
            new["spec"] = spec;

            let object = track_update(Some(&live), new, "editor", &BuiltinSchema, NOW, None);

            assert_eq!(owned(&object, "alice"), alice, "{scenario}");
            assert_eq!(owned(&object, "editor"), editor, "{scenario}");
        }
    }

    #[test]
    fn an_update_after_the_editors_earlier_update_extends_its_entry() {
        let live = track_update(
            None,
            deployment(json!({"replicas": 1})),
            "editor",
            &BuiltinSchema,
            EARLIER,
            None,
        );
        let mut new = live.clone();
        new["spec"]["paused"] = json!(true);

        let object = track_update(Some(&live), new, "editor", &BuiltinSchema, NOW, None);

        let managed = object["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(managed.len(), 1);
        assert_eq!(managed[0]["time"], NOW);
        assert_eq!(
            owned(&object, "editor"),
            [".spec", ".spec.paused", ".spec.replicas"]
        );
    }

    #[test]
    fn clients_reset_managed_fields_with_one_empty_entry() {
        let live = applied_in_turn(&[("alice", deployment(json!({"replicas": 3})))]);
        let mut new = live.clone();
        new["metadata"]["managedFields"] = json!([{}]);

        let object = track_update(Some(&live), new, "editor", &BuiltinSchema, NOW, None);

        assert!(object["metadata"].get("managedFields").is_none());
        assert_eq!(
            without_managed_fields(&object),
            without_managed_fields(&live)
        );
    }
}
