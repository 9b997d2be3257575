//! What a write changed: the fields added, modified and dropped between two versions of
//! an object, and every field of a value present on one side only.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::managed_fields::untrack;
use super::walker::{Walker, item_elements};
use crate::patch::fieldset::{FieldSet, PathElement, same_value};
use crate::schema::ListType;

/// Fields added, changed and dropped between two versions of an object.
#[derive(Debug, Default)]
pub(super) struct Changes {
    added: FieldSet,
    modified: FieldSet,
    removed: FieldSet,
}

impl Changes {
    /// A value compared whole.
    fn leaf(&mut self, path: &[PathElement], old: Option<&Value>, new: Option<&Value>) {
        match (old, new) {
            (None, Some(_)) => self.added.insert(path),
            (Some(_), None) => self.removed.insert(path),
            (Some(old), Some(new)) if !same_value(old, new) => self.modified.insert(path),
            _ => {}
        }
    }

    /// An object, list or list item whose contents were compared: it was itself added
    /// or dropped when it was missing on one side.
    fn node(&mut self, path: &[PathElement], old: Option<&Value>, new: Option<&Value>) {
        if old.is_none() {
            self.added.insert(path);
        }
        if new.is_none() {
            self.removed.insert(path);
        }
    }

    pub(super) fn tracked(mut self) -> Changes {
        for set in [&mut self.added, &mut self.modified, &mut self.removed] {
            untrack(set);
        }
        self
    }

    /// The fields the write set, and those it dropped.
    pub(super) fn written_and_removed(self) -> (FieldSet, FieldSet) {
        let written = if self.modified.is_empty() {
            self.added
        } else {
            self.added.union(&self.modified)
        };
        (written, self.removed)
    }
}

/// How deep [`Walker::compare`] looks for equal subtrees to skip.
const SKIP_EQUAL_DEPTH: usize = 2;

impl Walker<'_> {
    /// What changed from `old` to `new`, in tracked fields only.
    pub(super) fn changes(&mut self, old: &Value, new: &Value) -> Changes {
        let mut changes = Changes::default();
        self.compare(Some(old), Some(new), &mut changes);
        changes.tracked()
    }

    pub(super) fn compare(
        &mut self,
        old: Option<&Value>,
        new: Option<&Value>,
        changes: &mut Changes,
    ) {
        // A value on one side only: all of it was added, or all of it dropped. Built as
        // one subtree and grafted at the path, instead of a walk from the root per field.
        match (old, new) {
            (None, Some(new)) => {
                let whole: FieldSet = self.whole(new);
                return changes.added.graft(&self.path, whole);
            }
            (Some(old), None) => {
                let whole: FieldSet = self.whole(old);
                return changes.removed.graft(&self.path, whole);
            }
            (None, None) => return,
            (Some(_), Some(_)) => {}
        }
        // Equal on both sides changes nothing below. Checked near the root only, where it
        // skips the untouched halves of a write (the spec of a status write, say); deeper
        // down the walk itself is as cheap as the check. Not at the root itself: a write
        // almost always changes something, so comparing the whole objects would only lead
        // on to comparing their fields, everything twice; each field's own check finds
        // the same for the same cost.
        if let (Some(old), Some(new)) = (old, new)
            && (1..=SKIP_EQUAL_DEPTH).contains(&self.path.len())
            && old == new
        {
            return;
        }
        if let (Some(old), Some(new)) = (old, new)
            && shape(old) != shape(new)
        {
            // A value that changed kind: the old one went, the new one came.
            self.compare(Some(old), None, changes);
            self.compare(None, Some(new), changes);
            return;
        }
        match old.or(new) {
            Some(Value::Object(_)) => self.compare_objects(old, new, changes),
            Some(Value::Array(_)) => self.compare_lists(old, new, changes),
            _ => changes.leaf(&self.path, old, new),
        }
    }

    fn compare_objects(&mut self, old: Option<&Value>, new: Option<&Value>, changes: &mut Changes) {
        let empty = Map::new();
        let old_fields = old.and_then(Value::as_object).unwrap_or(&empty);
        let new_fields = new.and_then(Value::as_object).unwrap_or(&empty);
        // Empty objects on both sides are values of their own, as upstream.
        if old_fields.is_empty() && new_fields.is_empty() {
            changes.leaf(&self.path, old, new);
            return;
        }
        for (name, old_value) in old_fields {
            self.in_field(name, |walker| {
                walker.compare(Some(old_value), new_fields.get(name), changes)
            });
        }
        for (name, new_value) in new_fields {
            if !old_fields.contains_key(name) {
                self.in_field(name, |walker| {
                    walker.compare(None, Some(new_value), changes)
                });
            }
        }
        changes.node(&self.path, old, new);
    }

    fn compare_lists(&mut self, old: Option<&Value>, new: Option<&Value>, changes: &mut Changes) {
        let list_type = self.list_type();
        let old_items = old.and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        let new_items = new.and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
        // Empty lists on both sides are values of their own, as upstream.
        if list_type == ListType::Atomic || (old_items.is_empty() && new_items.is_empty()) {
            changes.leaf(&self.path, old, new);
            return;
        }
        let identified = |items: &[Value]| item_elements(&list_type, items).ok();
        let (Some(old_keys), Some(new_keys)) = (identified(old_items), identified(new_items))
        else {
            // Items that cannot be told apart: the list is compared whole.
            changes.leaf(&self.path, old, new);
            return;
        };
        // Upstream ignores repeated items after the first.
        let first = |keys: &[PathElement], key: &PathElement| keys.iter().position(|k| k == key);
        for (index, key) in old_keys.iter().enumerate() {
            if first(&old_keys, key) != Some(index) {
                continue;
            }
            let new_item = first(&new_keys, key).map(|at| &new_items[at]);
            self.compare_item(&list_type, key, Some(&old_items[index]), new_item, changes);
        }
        for (index, key) in new_keys.iter().enumerate() {
            if first(&new_keys, key) == Some(index) && first(&old_keys, key).is_none() {
                self.compare_item(&list_type, key, None, Some(&new_items[index]), changes);
            }
        }
        changes.node(&self.path, old, new);
    }

    /// Every field of `value` at the current path, as [`compare`](Self::compare) finds
    /// them when `value` is on one side only: the path itself, each object field, each
    /// item of a granular list (the first of repeated ones), and below keyed items. Built
    /// as a field set, or straight as its `FieldsV1` encoding (see [`Whole`]).
    pub(super) fn whole<W: Whole>(&mut self, value: &Value) -> W {
        let mut whole = W::owned();
        match value {
            Value::Object(fields) => {
                for (name, field) in fields {
                    self.names.push(name);
                    let child = self.whole(field);
                    self.names.pop();
                    whole.put_field(name, child);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                let list_type = self.list_type();
                if list_type != ListType::Atomic
                    && let Ok(keys) = item_elements(&list_type, items)
                {
                    // Upstream ignores repeated items after the first.
                    let mut seen = BTreeSet::new();
                    let firsts: Vec<bool> = keys.iter().map(|key| seen.insert(key)).collect();
                    drop(seen);
                    for ((key, item), first) in keys.into_iter().zip(items).zip(firsts) {
                        if !first {
                            continue;
                        }
                        let child = match list_type {
                            ListType::Map(_) => self.whole(item),
                            _ => W::owned(),
                        };
                        whole.put(key, child);
                    }
                }
            }
            _ => {}
        }
        whole.finished()
    }

    fn compare_item(
        &mut self,
        list_type: &ListType,
        key: &PathElement,
        old: Option<&Value>,
        new: Option<&Value>,
        changes: &mut Changes,
    ) {
        self.in_item(key.clone(), |walker| match list_type {
            ListType::Map(_) => walker.compare(old, new, changes),
            _ => changes.leaf(&walker.path, old, new),
        });
    }
}

/// What [`Walker::whole`] builds: the field set of a value on one side only, or that
/// set's `FieldsV1` encoding written straight away (a create's entry, which is only ever
/// encoded). One walk for both keeps them the same.
pub(super) trait Whole: Sized {
    /// An owned value with nothing below it yet.
    fn owned() -> Self;
    /// Adds `child` under `element`.
    fn put(&mut self, element: PathElement, child: Self);
    /// Adds `child` under the field `name`.
    fn put_field(&mut self, name: &str, child: Self);
    /// The value once everything below it is in.
    fn finished(self) -> Self;
}

impl Whole for FieldSet {
    fn owned() -> Self {
        FieldSet::member()
    }

    fn put(&mut self, element: PathElement, child: Self) {
        self.put_child(element, child);
    }

    fn put_field(&mut self, name: &str, child: Self) {
        self.put_child(PathElement::field(name), child);
    }

    fn finished(self) -> Self {
        self
    }
}

impl Whole for Map<String, Value> {
    fn owned() -> Self {
        Map::new()
    }

    fn put(&mut self, element: PathElement, child: Self) {
        self.insert(element.encode(), Value::Object(child));
    }

    /// The field's encoded name written at once, with no element built only to encode it.
    fn put_field(&mut self, name: &str, child: Self) {
        self.insert(PathElement::encode_field(name), Value::Object(child));
    }

    /// `.` marks the value itself owned beside what it leads to, as
    /// [`FieldSet::into_fields_v1`] writes a member with children.
    fn finished(mut self) -> Self {
        if !self.is_empty() {
            self.insert(".".to_string(), Value::Object(Map::new()));
        }
        self
    }
}

/// The kind of a value for comparison: object, list, or anything compared whole.
fn shape(value: &Value) -> u8 {
    match value {
        Value::Object(_) => 0,
        Value::Array(_) => 1,
        _ => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::BuiltinSchema;
    use serde_json::json;

    /// Every path of `value` at `path`, inserted one by one: what the walker's subtree
    /// of a value on one side only must hold.
    fn insert_every_path(
        walker: &mut Walker,
        path: &mut Vec<PathElement>,
        value: &Value,
        set: &mut FieldSet,
    ) {
        set.insert(path);
        match value {
            Value::Object(fields) => {
                for (name, field) in fields {
                    walker.names.push(name);
                    path.push(PathElement::field(name));
                    insert_every_path(walker, path, field, set);
                    path.pop();
                    walker.names.pop();
                }
            }
            Value::Array(items) => {
                let list_type = walker.list_type();
                if list_type == ListType::Atomic {
                    return;
                }
                let Ok(keys) = item_elements(&list_type, items) else {
                    return;
                };
                let mut seen = Vec::new();
                for (key, item) in keys.into_iter().zip(items) {
                    if seen.contains(&key) {
                        continue;
                    }
                    seen.push(key.clone());
                    path.push(key);
                    match list_type {
                        ListType::Map(_) => insert_every_path(walker, path, item, set),
                        _ => set.insert(path),
                    }
                    path.pop();
                }
            }
            _ => {}
        }
    }

    #[test]
    fn a_value_on_one_side_only_is_recorded_path_by_path() {
        let spec = json!({
            "nodeName": "n1",
            "securityContext": {},
            "containers": [
                {"name": "a", "image": "x", "args": ["1", "1"], "ports": [{"containerPort": 80}],
                 "env": [{"name": "E", "value": "1"}, {"name": "E", "value": "2"}]},
                {"name": "b", "image": "y", "volumeMounts": [], "resources": {}},
                {"name": "a", "image": "repeated"}
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
            "tolerations": [{"key": "k", "operator": "Exists"}]
        });
        let object = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "labels": {"app": "web"},
                         "finalizers": ["a", "b", "a"], "annotations": {}},
            "spec": spec,
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
        });
        let mut walker = Walker::new(&BuiltinSchema);
        let mut expected = FieldSet::default();
        for (name, field) in object.as_object().unwrap() {
            walker.names.push(name);
            insert_every_path(
                &mut walker,
                &mut vec![PathElement::field(name)],
                field,
                &mut expected,
            );
            walker.names.pop();
        }
        untrack(&mut expected);
        assert!(expected.child(&PathElement::field("spec")).is_some());

        let nothing = json!({});
        let created = walker.changes(&nothing, &object);
        assert_eq!(created.added, expected, "created: every path added");
        assert!(created.modified.is_empty() && created.removed.is_empty());
        let dropped = walker.changes(&object, &nothing);
        assert_eq!(dropped.removed, expected, "dropped: every path removed");
        assert!(dropped.added.is_empty() && dropped.modified.is_empty());

        // Below the root too: a spec that appears, and one that goes.
        let mut bare = object.clone();
        bare.as_object_mut().unwrap().remove("spec");
        let mut spec_only = FieldSet::default();
        walker.names.push("spec");
        insert_every_path(
            &mut walker,
            &mut vec![PathElement::field("spec")],
            &object["spec"],
            &mut spec_only,
        );
        walker.names.pop();
        assert_eq!(walker.changes(&bare, &object).added, spec_only);
        assert_eq!(walker.changes(&object, &bare).removed, spec_only);
    }
}
