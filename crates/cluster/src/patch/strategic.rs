//! Strategic merge patch (`application/strategic-merge-patch+json`), applied the way
//! `k8s.io/apimachinery/pkg/util/strategicpatch` applies it on the API server.
//!
//! Maps merge recursively and `null` deletes a key. Lists merge as the kind's schema
//! declares: atomic lists are replaced, sets of scalars are united, keyed lists merge item
//! by item on their merge key. The directives `$patch`, `$retainKeys`,
//! `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` steer the merge and
//! never reach the result.
//!
//! Without `$setElementOrder`, a merged list is ordered as upstream orders it: the patch's
//! items in the patch's order, and each live item the patch does not name placed before
//! the next patch item only if the live list had it before that item. So a set `[a]`
//! patched with `[b]` becomes `[b, a]`.

use serde_json::{Map, Value};

use super::error::{PatchError, json_type};
use crate::schema::{FieldSchema, ListType};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList";
const SET_ELEMENT_ORDER: &str = "$setElementOrder";

type Object = Map<String, Value>;

/// Applies a strategic merge patch to a copy of `target`, merging lists as `schema`
/// declares, and returns the patched copy.
///
/// Fails with [`PatchError::Malformed`] when the patch is not a JSON object or a directive
/// has the wrong shape (`$retainKeys`, `$setElementOrder/..` or `$deleteFromPrimitiveList/..`
/// that is not a list, a field missing from `$retainKeys`), and with [`PatchError::Invalid`]
/// when the patch does not fit the object: a keyed list item without its merge key, an
/// unknown `$patch` value, a `$setElementOrder` list that contradicts the patch list, a list
/// of lists or of mixed element types where lists merge.
pub fn strategic_merge_patch(
    target: &Value,
    patch: &Value,
    schema: &dyn FieldSchema,
) -> Result<Value, PatchError> {
    let root = Location::default();
    let Value::Object(patch) = patch else {
        return Err(malformed(
            &root,
            format!(
                "invalid JSON document: a strategic merge patch is a JSON object, not {}",
                json_type(patch)
            ),
        ));
    };
    let Value::Object(object) = target else {
        return Err(invalid(&root, "the object to patch is not a JSON object"));
    };
    let merged = Merger { schema }.merge_object(Some(object.clone()), patch, &root)?;
    Ok(Value::Object(merged.unwrap_or_default()))
}

/// Where a value sits in the object: its field names for the schema, a JSON pointer for
/// messages.
#[derive(Clone, Debug, Default)]
struct Location {
    fields: Vec<String>,
    pointer: String,
}

impl Location {
    fn field(&self, name: &str) -> Self {
        let mut fields = self.fields.clone();
        fields.push(name.to_owned());
        let escaped = name.replace('~', "~0").replace('/', "~1");
        Location {
            fields,
            pointer: format!("{}/{escaped}", self.pointer),
        }
    }

    fn item(&self, index: usize) -> Self {
        Location {
            fields: self.fields.clone(),
            pointer: format!("{}/{index}", self.pointer),
        }
    }

    fn names(&self) -> Vec<&str> {
        self.fields.iter().map(String::as_str).collect()
    }
}

fn malformed(at: &Location, reason: impl Into<String>) -> PatchError {
    PatchError::Malformed {
        path: at.pointer.clone(),
        reason: reason.into(),
    }
}

fn invalid(at: &Location, reason: impl Into<String>) -> PatchError {
    PatchError::Invalid {
        path: at.pointer.clone(),
        reason: reason.into(),
    }
}

/// What a key of a patch map asks for.
enum PatchKey<'k> {
    /// A field of the object, merged with the patch value.
    Field(&'k str),
    /// `$deleteFromPrimitiveList/<field>`: values to remove from that list.
    DeleteFromList(&'k str),
    /// `$setElementOrder/<field>`: the order of that list after the merge.
    ElementOrder(&'k str),
    /// `$patch` or `$retainKeys`, which act on the map holding them.
    MapDirective,
}

fn classify<'k>(key: &'k str, at: &Location) -> Result<PatchKey<'k>, PatchError> {
    if key == PATCH || key == RETAIN_KEYS {
        return Ok(PatchKey::MapDirective);
    }
    if let Some(rest) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
        return rest
            .strip_prefix('/')
            .map(PatchKey::DeleteFromList)
            .ok_or_else(|| {
                malformed(at, format!("invalid patch format of primitive list: {key}"))
            });
    }
    if let Some(rest) = key.strip_prefix(SET_ELEMENT_ORDER) {
        return rest
            .strip_prefix('/')
            .map(PatchKey::ElementOrder)
            .ok_or_else(|| {
                malformed(
                    at,
                    format!("invalid patch format of setElementOrder list: {key}"),
                )
            });
    }
    Ok(PatchKey::Field(key))
}

/// A `$patch` directive on a map.
enum MapDirective {
    Replace,
    Delete,
}

fn map_directive(patch: &Object, at: &Location) -> Result<Option<MapDirective>, PatchError> {
    match patch.get(PATCH) {
        None => Ok(None),
        Some(Value::String(word)) if word == "replace" => Ok(Some(MapDirective::Replace)),
        Some(Value::String(word)) if word == "delete" => Ok(Some(MapDirective::Delete)),
        Some(other) => Err(unknown_patch_type(other, patch, at)),
    }
}

/// A `$patch` directive on an item of a keyed list.
enum ListDirective {
    /// Remove the live items with this item's merge key value.
    Delete,
    /// The patch's other items are the whole list.
    Replace,
}

fn list_directive(item: &Value, at: &Location) -> Result<Option<ListDirective>, PatchError> {
    let Value::Object(fields) = item else {
        return Ok(None);
    };
    match fields.get(PATCH) {
        None => Ok(None),
        Some(Value::String(word)) if word == "delete" => Ok(Some(ListDirective::Delete)),
        Some(Value::String(word)) if word == "replace" => Ok(Some(ListDirective::Replace)),
        Some(Value::String(word)) if word == "merge" => Err(invalid(
            at,
            "merging lists cannot yet be specified in the patch",
        )),
        Some(other) => Err(unknown_patch_type(other, fields, at)),
    }
}

fn unknown_patch_type(directive: &Value, patch: &Object, at: &Location) -> PatchError {
    invalid(
        at,
        format!(
            "unknown patch type: {directive} in map: {}",
            Value::Object(patch.clone())
        ),
    )
}

/// What identifies a list item: the value of its merge key in a keyed list, the item
/// itself in any other list.
fn identity(item: &Value, key: Option<&str>, at: &Location) -> Result<Value, PatchError> {
    let Some(key) = key else {
        return Ok(item.clone());
    };
    keyed_item(item, key, at).map(|(_, id)| id.clone())
}

fn identities(items: &[Value], key: Option<&str>, at: &Location) -> Result<Vec<Value>, PatchError> {
    items.iter().map(|item| identity(item, key, at)).collect()
}

fn keyed_item<'v>(
    item: &'v Value,
    key: &str,
    at: &Location,
) -> Result<(&'v Object, &'v Value), PatchError> {
    let Value::Object(fields) = item else {
        return Err(invalid(at, format!("expected a map, but received {item}")));
    };
    let id = fields.get(key).ok_or_else(|| {
        invalid(
            at,
            format!("map: {item} does not contain declared merge key: {key}"),
        )
    })?;
    Ok((fields, id))
}

/// How a list field merges with a patch list.
enum Strategy {
    /// Atomic: the patch list replaces the live one.
    Replace,
    /// A set of scalars: the union of both.
    Union,
    /// Items are maps merged on this key.
    Keyed(String),
}

impl Strategy {
    fn key(&self) -> Option<&str> {
        match self {
            Strategy::Keyed(key) => Some(key),
            Strategy::Replace | Strategy::Union => None,
        }
    }
}

/// Checks that the elements share one JSON type other than list, as merging lists requires.
fn check_element_types<'v>(
    items: impl IntoIterator<Item = &'v Value>,
    at: &Location,
) -> Result<(), PatchError> {
    let mut common = None;
    for item in items {
        if item.is_array() {
            return Err(invalid(at, "lists of lists are not supported"));
        }
        let kind = json_type(item);
        match common {
            None => common = Some(kind),
            Some(seen) if seen != kind => {
                return Err(invalid(
                    at,
                    format!("list element types are not identical: {seen} and {kind}"),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// A merged list before its order is settled.
struct Merged {
    /// The live items that remain, merged in place, then the items new to the list.
    items: Vec<Value>,
    /// Identities of the patch items that order the result, in the patch's order.
    wanted: Vec<Value>,
    /// Identities of the live items that remain, in live order.
    survivors: Vec<Value>,
    /// Identities of the live order `$setElementOrder` interleaves unnamed items by.
    live: Vec<Value>,
}

impl Merged {
    fn unchanged(items: Vec<Value>, key: Option<&str>, at: &Location) -> Result<Self, PatchError> {
        let live = identities(&items, key, at)?;
        Ok(Merged {
            items,
            wanted: Vec::new(),
            survivors: live.clone(),
            live,
        })
    }

    fn added(items: Vec<Value>) -> Self {
        Merged {
            items,
            wanted: Vec::new(),
            survivors: Vec::new(),
            live: Vec::new(),
        }
    }
}

/// A merged item with its place in the live order, while the merged order is settled.
struct Placed {
    live: Option<usize>,
    item: Value,
}

/// Orders a merged list as upstream does: the items named in `wanted` in that order,
/// interleaved with the others, which keep their order in `live`.
fn settle_order(
    items: Vec<Value>,
    wanted: &[Value],
    live: &[Value],
    key: Option<&str>,
    at: &Location,
) -> Result<Vec<Value>, PatchError> {
    let mut named = Vec::new();
    let mut others = Vec::new();
    for item in items {
        let id = identity(&item, key, at)?;
        let placed = Placed {
            live: live.iter().position(|candidate| *candidate == id),
            item,
        };
        match wanted.iter().position(|candidate| *candidate == id) {
            Some(rank) => named.push((rank, placed)),
            None => others.push((placed.live.unwrap_or(usize::MAX), placed)),
        }
    }
    named.sort_by_key(|(rank, _)| *rank);
    others.sort_by_key(|(rank, _)| *rank);
    Ok(interleave(
        others.into_iter().map(|(_, placed)| placed),
        named.into_iter().map(|(_, placed)| placed),
    ))
}

/// Merges two ordered runs: an unnamed item goes before the next named one only when the
/// live list has both and has it first.
fn interleave(
    others: impl Iterator<Item = Placed>,
    named: impl Iterator<Item = Placed>,
) -> Vec<Value> {
    let mut others = others.peekable();
    let mut named = named.peekable();
    let mut ordered = Vec::new();
    loop {
        let other_first = match (others.peek(), named.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(other), Some(next)) => {
                matches!((other.live, next.live), (Some(a), Some(b)) if a < b)
            }
        };
        let next = if other_first {
            others.next()
        } else {
            named.next()
        };
        ordered.extend(next.map(|placed| placed.item));
    }
    ordered
}

/// Checks that the patch list names its items in the `$setElementOrder` list's order.
fn check_order_covers_patch(
    patch: &[Value],
    order: &[Value],
    key: Option<&str>,
    at: &Location,
) -> Result<(), PatchError> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let mut remaining = order.iter();
    for item in patch.iter().filter(|item| item.get(PATCH).is_none()) {
        let id = identity(item, key, at)?;
        let mut found = false;
        for named in remaining.by_ref() {
            if identity(named, key, at)? == id {
                found = true;
                break;
            }
        }
        if !found {
            return Err(invalid(
                at,
                format!(
                    "the order in patch list {} doesn't match {SET_ELEMENT_ORDER} list {}",
                    Value::Array(patch.to_vec()),
                    Value::Array(order.to_vec())
                ),
            ));
        }
    }
    Ok(())
}

/// Removes the `$retainKeys` directive's unlisted fields from `object`.
fn retain_keys(object: &mut Object, patch: &Object, at: &Location) -> Result<(), PatchError> {
    let Some(retained) = patch.get(RETAIN_KEYS) else {
        return Ok(());
    };
    let Value::Array(retained) = retained else {
        return Err(malformed(
            at,
            "invalid patch format of retainKeys: not a list",
        ));
    };
    let is_retained = |name: &str| retained.iter().any(|key| key.as_str() == Some(name));
    for (key, value) in patch {
        if let PatchKey::Field(name) = classify(key, at)?
            && !value.is_null()
            && !is_retained(name)
        {
            return Err(malformed(
                at,
                format!("invalid patch format of retainKeys: {name} is not in {RETAIN_KEYS}"),
            ));
        }
    }
    object.retain(|name, _| is_retained(name));
    Ok(())
}

/// Applies `$deleteFromPrimitiveList/<name>`: removes the listed values from that list.
fn delete_from_list(
    object: &mut Object,
    name: &str,
    doomed: &Value,
    at: &Location,
) -> Result<(), PatchError> {
    let Value::Array(doomed) = doomed else {
        return Err(malformed(
            at,
            "invalid patch format of primitive list: not a list",
        ));
    };
    // A missing list stays missing: there is nothing to delete from.
    if let Some(Value::Array(items)) = object.get_mut(name) {
        items.retain(|item| !doomed.contains(item));
    }
    Ok(())
}

struct Merger<'s> {
    schema: &'s dyn FieldSchema,
}

impl Merger<'_> {
    /// Merges a patch map into a live map, or into nothing; `None` when the patch deletes a
    /// map that was not there.
    fn merge_object(
        &self,
        original: Option<Object>,
        patch: &Object,
        at: &Location,
    ) -> Result<Option<Object>, PatchError> {
        match map_directive(patch, at)? {
            // Upstream empties a live map rather than removing its field.
            Some(MapDirective::Delete) => Ok(original.map(|_| Object::new())),
            Some(MapDirective::Replace) => self.merge_fields(Object::new(), patch, at).map(Some),
            None => self
                .merge_fields(original.unwrap_or_default(), patch, at)
                .map(Some),
        }
    }

    fn merge_fields(
        &self,
        mut object: Object,
        patch: &Object,
        at: &Location,
    ) -> Result<Object, PatchError> {
        retain_keys(&mut object, patch, at)?;
        let ordered = self.apply_element_orders(&mut object, patch, at)?;
        for (key, value) in patch {
            match classify(key, at)? {
                PatchKey::Field(name) if !ordered.contains(&name) => {
                    self.merge_field(&mut object, name, value, at)?;
                }
                PatchKey::DeleteFromList(name) => {
                    delete_from_list(&mut object, name, value, &at.field(name))?;
                }
                PatchKey::Field(_) | PatchKey::ElementOrder(_) | PatchKey::MapDirective => {}
            }
        }
        Ok(object)
    }

    fn merge_field(
        &self,
        object: &mut Object,
        name: &str,
        patch: &Value,
        at: &Location,
    ) -> Result<(), PatchError> {
        if patch.is_null() {
            object.remove(name);
            return Ok(());
        }
        let here = at.field(name);
        let merged = match (object.get_mut(name).map(Value::take), patch) {
            (Some(Value::Object(live)), Value::Object(fields)) => self
                .merge_object(Some(live), fields, &here)?
                .map(Value::Object),
            (Some(Value::Array(live)), Value::Array(items)) => {
                Some(Value::Array(self.merge_list(live, items, &here)?))
            }
            _ => self.fresh(patch, &here)?,
        };
        match merged {
            // insert keeps the position of a field that was already there.
            Some(value) => object.insert(name.to_owned(), value),
            None => object.remove(name),
        };
        Ok(())
    }

    /// The value a patch value makes where the object has none (or one of another type):
    /// directives resolved and nulls dropped. `None` when nothing is left.
    fn fresh(&self, patch: &Value, at: &Location) -> Result<Option<Value>, PatchError> {
        match patch {
            Value::Object(fields) => Ok(self.merge_object(None, fields, at)?.map(Value::Object)),
            Value::Array(items) => Ok(Some(Value::Array(self.fresh_items(items, at)?))),
            scalar => Ok(Some(scalar.clone())),
        }
    }

    fn fresh_items<'v>(
        &self,
        patch: impl IntoIterator<Item = &'v Value>,
        at: &Location,
    ) -> Result<Vec<Value>, PatchError> {
        let mut items = Vec::new();
        for item in patch {
            // A `$patch` item only steers a merge, and a new list has nothing to merge with.
            if item.get(PATCH).is_some() {
                continue;
            }
            items.extend(self.fresh(item, &at.item(items.len()))?);
        }
        Ok(items)
    }

    fn strategy(
        &self,
        live: &[Value],
        patch: &[Value],
        at: &Location,
    ) -> Result<Strategy, PatchError> {
        let names = at.names();
        let list_type = self.schema.list_type(&names);
        if list_type == ListType::Atomic {
            return Ok(Strategy::Replace);
        }
        check_element_types(live.iter().chain(patch), at)?;
        if !live.iter().chain(patch).any(Value::is_object) {
            return Ok(Strategy::Union);
        }
        match (list_type, self.schema.merge_key(&names)) {
            (ListType::Map(_), Some(key)) => Ok(Strategy::Keyed(key)),
            _ => Err(invalid(
                at,
                "cannot merge lists of maps without a merge key",
            )),
        }
    }

    fn merge_list(
        &self,
        live: Vec<Value>,
        patch: &[Value],
        at: &Location,
    ) -> Result<Vec<Value>, PatchError> {
        let strategy = self.strategy(&live, patch, at)?;
        let merged = self.merge_items(live, patch, &strategy, at)?;
        match strategy {
            Strategy::Replace => Ok(merged.items),
            Strategy::Union | Strategy::Keyed(_) => settle_order(
                merged.items,
                &merged.wanted,
                &merged.survivors,
                strategy.key(),
                at,
            ),
        }
    }

    fn merge_items(
        &self,
        live: Vec<Value>,
        patch: &[Value],
        strategy: &Strategy,
        at: &Location,
    ) -> Result<Merged, PatchError> {
        match strategy {
            Strategy::Replace => Ok(Merged {
                items: self.fresh_items(patch, at)?,
                wanted: Vec::new(),
                survivors: Vec::new(),
                live,
            }),
            Strategy::Union => Ok(unite(live, patch)),
            Strategy::Keyed(key) => self.merge_keyed(live, patch, key, at),
        }
    }

    fn merge_keyed(
        &self,
        mut items: Vec<Value>,
        patch: &[Value],
        key: &str,
        at: &Location,
    ) -> Result<Merged, PatchError> {
        let live_len = items.len();
        let mut additions = Vec::new();
        let mut replace = false;
        for item in patch {
            match list_directive(item, at)? {
                None => additions.push(item),
                Some(ListDirective::Delete) => {
                    let (_, doomed) = keyed_item(item, key, at)?;
                    items.retain(|live| live.get(key) != Some(doomed));
                }
                Some(ListDirective::Replace) => replace = true,
            }
        }
        if replace {
            let items = self.fresh_items(additions, at)?;
            let ids = identities(&items, Some(key), at)?;
            return Ok(Merged {
                items,
                wanted: Vec::new(),
                survivors: ids.clone(),
                live: ids,
            });
        }
        let survivors = identities(&items, Some(key), at)?;
        let mut wanted = Vec::new();
        for addition in additions {
            let (fields, id) = keyed_item(addition, key, at)?;
            match items.iter().position(|live| live.get(key) == Some(id)) {
                Some(index) => {
                    let live = match items[index].take() {
                        Value::Object(live) => live,
                        _ => Object::new(),
                    };
                    let merged = self.merge_fields(live, fields, &at.item(index))?;
                    items[index] = Value::Object(merged);
                }
                None => {
                    let added = self.merge_fields(Object::new(), fields, &at.item(items.len()))?;
                    items.push(Value::Object(added));
                }
            }
            wanted.push(id.clone());
        }
        // Upstream orders by its live list after the merge wrote into it in place: the
        // survivors, then as many new items as deletions freed slots.
        let live = identities(&items[..live_len.min(items.len())], Some(key), at)?;
        Ok(Merged {
            items,
            wanted,
            survivors,
            live,
        })
    }

    /// Applies every `$setElementOrder/<field>` of `patch` to `object`. Returns the fields
    /// whose patch list it merged on the way.
    fn apply_element_orders<'p>(
        &self,
        object: &mut Object,
        patch: &'p Object,
        at: &Location,
    ) -> Result<Vec<&'p str>, PatchError> {
        let mut merged_fields = Vec::new();
        for (key, order) in patch {
            let PatchKey::ElementOrder(name) = classify(key, at)? else {
                continue;
            };
            let patch_list = patch.get(name);
            self.apply_element_order(object, name, order, patch_list, &at.field(name))?;
            merged_fields.extend(patch_list.map(|_| name));
        }
        Ok(merged_fields)
    }

    /// Applies `$setElementOrder/<name>`: merges the field's patch list, if any, into the
    /// live list, then orders the result as `order` says.
    fn apply_element_order(
        &self,
        object: &mut Object,
        name: &str,
        order: &Value,
        patch_list: Option<&Value>,
        at: &Location,
    ) -> Result<(), PatchError> {
        let Value::Array(order) = order else {
            return Err(malformed(
                at,
                "invalid patch format of setElementOrder list: not a list",
            ));
        };
        let patch_list = match patch_list {
            None => None,
            Some(Value::Array(items)) => Some(items.as_slice()),
            Some(other) => {
                return Err(invalid(
                    at,
                    format!(
                        "{SET_ELEMENT_ORDER}/{name} orders a list, but the patch sets {name} to {}",
                        json_type(other)
                    ),
                ));
            }
        };
        let live = match object.get_mut(name) {
            Some(Value::Array(items)) => Some(std::mem::take(items)),
            _ => None,
        };
        let strategy = self.strategy(
            live.as_deref().unwrap_or_default(),
            patch_list.unwrap_or_default(),
            at,
        )?;
        let key = strategy.key();
        check_order_covers_patch(patch_list.unwrap_or_default(), order, key, at)?;
        let merged = match (live, patch_list) {
            (None, None) => return Ok(()),
            (Some(items), None) => Merged::unchanged(items, key, at)?,
            (None, Some(items)) => Merged::added(self.fresh_items(items, at)?),
            (Some(items), Some(additions)) => self.merge_items(items, additions, &strategy, at)?,
        };
        let wanted = identities(order, key, at)?;
        let settled = settle_order(merged.items, &wanted, &merged.live, key, at)?;
        object.insert(name.to_owned(), Value::Array(settled));
        Ok(())
    }
}

/// Unites two lists of scalars: the live values, then the patch's new ones, each once.
fn unite(live: Vec<Value>, patch: &[Value]) -> Merged {
    let mut items: Vec<Value> = Vec::with_capacity(live.len() + patch.len());
    for value in live {
        if !items.contains(&value) {
            items.push(value);
        }
    }
    let survivors = items.clone();
    for value in patch {
        if !items.contains(value) {
            items.push(value.clone());
        }
    }
    Merged {
        items,
        wanted: patch.to_vec(),
        live: survivors.clone(),
        survivors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::BuiltinSchema;
    use serde_json::json;

    struct Case {
        name: &'static str,
        target: Value,
        patch: Value,
        expected: Value,
    }

    fn containers(names: &[&str]) -> Value {
        names.iter().map(|name| json!({"name": name})).collect()
    }

    fn pod_with(spec: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": spec})
    }

    fn assert_no_directives(value: &Value, case: &str) {
        match value {
            Value::Object(fields) => {
                for (key, child) in fields {
                    assert!(
                        !(key == PATCH
                            || key == RETAIN_KEYS
                            || key.starts_with(DELETE_FROM_PRIMITIVE_LIST)
                            || key.starts_with(SET_ELEMENT_ORDER)),
                        "{case}: directive {key} left in the result"
                    );
                    assert_no_directives(child, case);
                }
            }
            Value::Array(items) => items
                .iter()
                .for_each(|item| assert_no_directives(item, case)),
            _ => {}
        }
    }

    fn check(cases: Vec<Case>) {
        for case in cases {
            let patched = strategic_merge_patch(&case.target, &case.patch, &BuiltinSchema)
                .unwrap_or_else(|error| panic!("{}: {error}", case.name));
            assert_eq!(patched, case.expected, "{}", case.name);
            assert_no_directives(&patched, case.name);
        }
    }

    #[test]
    fn maps_merge_and_nulls_delete() {
        check(vec![
            Case {
                name: "a scalar is replaced",
                target: pod_with(json!({"nodeName": "a", "restartPolicy": "Always"})),
                patch: json!({"spec": {"nodeName": "b"}}),
                expected: pod_with(json!({"nodeName": "b", "restartPolicy": "Always"})),
            },
            Case {
                name: "null deletes a key",
                target: json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
                patch: json!({"metadata": {"labels": {"a": null}}}),
                expected: json!({"metadata": {"labels": {"b": "2"}}}),
            },
            Case {
                name: "null for a missing key changes nothing",
                target: json!({"metadata": {"labels": {"a": "1"}}}),
                patch: json!({"metadata": {"labels": {"z": null}, "annotations": null}}),
                expected: json!({"metadata": {"labels": {"a": "1"}}}),
            },
            Case {
                name: "nulls inside a new map are dropped",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"metadata": {"annotations": {"x": "1", "y": null}}}),
                expected: json!({"metadata": {"name": "web", "annotations": {"x": "1"}}}),
            },
            Case {
                name: "a map replaces a value of another type",
                target: json!({"spec": {"selector": "app=web"}}),
                patch: json!({"spec": {"selector": {"app": "web", "tier": null}}}),
                expected: json!({"spec": {"selector": {"app": "web"}}}),
            },
            Case {
                name: "an empty patch changes nothing",
                target: pod_with(json!({"containers": containers(&["a"])})),
                patch: json!({}),
                expected: pod_with(json!({"containers": containers(&["a"])})),
            },
        ]);
    }

    #[test]
    fn map_directives() {
        check(vec![
            Case {
                name: "$patch replace swaps a map",
                target: json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
                patch: json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
                expected: json!({"metadata": {"labels": {"c": "3"}}}),
            },
            Case {
                name: "$patch delete empties a live map",
                target: json!({"metadata": {"name": "web", "labels": {"a": "1"}}}),
                patch: json!({"metadata": {"labels": {"$patch": "delete"}}}),
                expected: json!({"metadata": {"name": "web", "labels": {}}}),
            },
            Case {
                name: "$patch delete of a missing map adds nothing",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"metadata": {"labels": {"$patch": "delete"}}}),
                expected: json!({"metadata": {"name": "web"}}),
            },
            Case {
                name: "$patch replace on a new map keeps its content",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"metadata": {"labels": {"$patch": "replace", "a": "1"}}}),
                expected: json!({"metadata": {"name": "web", "labels": {"a": "1"}}}),
            },
            Case {
                name: "$patch delete at the top empties the object",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"$patch": "delete"}),
                expected: json!({}),
            },
            Case {
                name: "$retainKeys keeps only the listed keys",
                target: json!({"spec": {"strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}
                }}}),
                patch: json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
                expected: json!({"spec": {"strategy": {"type": "Recreate"}}}),
            },
            Case {
                name: "$retainKeys ignores nulls and merges listed keys",
                target: json!({"spec": {"strategy": {
                    "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}, "extra": true
                }}}),
                patch: json!({"spec": {"strategy": {
                    "$retainKeys": ["type", "rollingUpdate"],
                    "rollingUpdate": {"maxUnavailable": 0},
                    "gone": null
                }}}),
                expected: json!({"spec": {"strategy": {
                    "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}
                }}}),
            },
        ]);
    }

    #[test]
    fn keyed_lists_merge_on_their_merge_key() {
        check(vec![
            Case {
                name: "containers merge by name in place",
                target: pod_with(json!({"containers": [
                    {"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}
                ]})),
                patch: json!({"spec": {"containers": [{"name": "b", "image": "b:2"}]}}),
                expected: pod_with(json!({"containers": [
                    {"name": "a", "image": "a:1"}, {"name": "b", "image": "b:2"}
                ]})),
            },
            Case {
                name: "a new container goes first without $setElementOrder",
                target: pod_with(json!({"containers": containers(&["a"])})),
                patch: json!({"spec": {"containers": [{"name": "b", "image": "b:1", "tty": null}]}}),
                expected: pod_with(json!({"containers": [
                    {"name": "b", "image": "b:1"}, {"name": "a"}
                ]})),
            },
            Case {
                name: "the patch order wins over the live order",
                target: json!({"status": {"conditions": [
                    {"type": "A"}, {"type": "B", "status": "b"}, {"type": "C"}
                ]}}),
                patch: json!({"status": {"conditions": [
                    {"type": "C", "status": "c"}, {"type": "A", "status": "a"}
                ]}}),
                expected: json!({"status": {"conditions": [
                    {"type": "B", "status": "b"},
                    {"type": "C", "status": "c"},
                    {"type": "A", "status": "a"}
                ]}}),
            },
            Case {
                name: "env merges by name inside a container",
                target: pod_with(json!({"containers": [{"name": "a", "env": [
                    {"name": "X", "value": "1"}, {"name": "Y", "value": "2"}
                ]}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "env": [
                    {"name": "Y", "value": "3"}
                ]}]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "env": [
                    {"name": "X", "value": "1"}, {"name": "Y", "value": "3"}
                ]}]})),
            },
            Case {
                name: "null deletes a field of a list item",
                target: pod_with(json!({"containers": [
                    {"name": "a", "image": "a:1", "command": ["sh"]}
                ]})),
                patch: json!({"spec": {"containers": [{"name": "a", "command": null}]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "image": "a:1"}]})),
            },
            Case {
                name: "$patch delete removes an env var",
                target: pod_with(json!({"containers": [{"name": "a", "env": [
                    {"name": "X"}, {"name": "Y"}, {"name": "X"}
                ]}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "env": [
                    {"name": "X", "$patch": "delete"}
                ]}]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "env": [{"name": "Y"}]}]})),
            },
            Case {
                name: "$patch delete of a missing item changes nothing",
                target: pod_with(json!({"containers": containers(&["a"])})),
                patch: json!({"spec": {"containers": [{"name": "z", "$patch": "delete"}]}}),
                expected: pod_with(json!({"containers": containers(&["a"])})),
            },
            Case {
                name: "$patch replace replaces a keyed list",
                target: pod_with(json!({"containers": containers(&["a", "b"])})),
                patch: json!({"spec": {"containers": [
                    {"$patch": "replace"}, {"name": "c", "image": "c:1"}, {"name": "d"}
                ]}}),
                expected: pod_with(json!({"containers": [
                    {"name": "c", "image": "c:1"}, {"name": "d"}
                ]})),
            },
            Case {
                name: "a lone $patch replace empties a keyed list",
                target: pod_with(json!({"volumes": containers(&["a", "b"])})),
                patch: json!({"spec": {"volumes": [{"$patch": "replace"}]}}),
                expected: pod_with(json!({"volumes": []})),
            },
            Case {
                name: "an empty patch list leaves a keyed list alone",
                target: pod_with(json!({"containers": containers(&["a", "b"])})),
                patch: json!({"spec": {"containers": []}}),
                expected: pod_with(json!({"containers": containers(&["a", "b"])})),
            },
            Case {
                name: "conditions merge by type",
                target: json!({"status": {"conditions": [
                    {"type": "Ready", "status": "False", "reason": "Starting"},
                    {"type": "Scheduled", "status": "True"}
                ]}}),
                patch: json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": null}
                ]}}),
                expected: json!({"status": {"conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Scheduled", "status": "True"}
                ]}}),
            },
            Case {
                name: "ports merge on containerPort alone, as upstream",
                target: pod_with(json!({"containers": [{"name": "a", "ports": [
                    {"containerPort": 80, "protocol": "TCP"}
                ]}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "ports": [
                    {"containerPort": 80, "name": "http"}
                ]}]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "ports": [
                    {"containerPort": 80, "protocol": "TCP", "name": "http"}
                ]}]})),
            },
            Case {
                name: "templates of workloads merge like pods",
                target: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "app", "image": "app:1"}, {"name": "side", "image": "side:1"}
                ]}}}}),
                patch: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "app", "image": "app:2"}
                ]}}}}),
                expected: json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "app", "image": "app:2"}, {"name": "side", "image": "side:1"}
                ]}}}}),
            },
            Case {
                name: "directives inside a new list item are resolved",
                target: pod_with(json!({"containers": containers(&["a"])})),
                patch: json!({"spec": {"containers": [{
                    "name": "b",
                    "resources": {"$patch": "replace", "limits": {"cpu": "1"}},
                    "env": [{"name": "X", "value": "1"}, {"name": "Y", "$patch": "delete"}]
                }]}}),
                expected: pod_with(json!({"containers": [
                    {"name": "b", "resources": {"limits": {"cpu": "1"}},
                     "env": [{"name": "X", "value": "1"}]},
                    {"name": "a"}
                ]})),
            },
            Case {
                name: "a new keyed list drops its directive items",
                target: pod_with(json!({})),
                patch: json!({"spec": {"containers": [
                    {"name": "a"}, {"name": "b", "$patch": "delete"}, {"$patch": "replace"}
                ]}}),
                expected: pod_with(json!({"containers": containers(&["a"])})),
            },
        ]);
    }

    #[test]
    fn atomic_lists_are_replaced_and_sets_united() {
        check(vec![
            Case {
                name: "tolerations are replaced whole",
                target: pod_with(json!({"tolerations": [{"key": "a"}, {"key": "b"}]})),
                patch: json!({"spec": {"tolerations": [{"key": "c", "effect": null}]}}),
                expected: pod_with(json!({"tolerations": [{"key": "c"}]})),
            },
            Case {
                name: "args are replaced whole",
                target: pod_with(json!({"containers": [{"name": "a", "args": ["x", "y"]}]})),
                patch: json!({"spec": {"containers": [{"name": "a", "args": ["z"]}]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "args": ["z"]}]})),
            },
            Case {
                name: "an empty list empties an atomic list",
                target: pod_with(json!({"tolerations": [{"key": "a"}]})),
                patch: json!({"spec": {"tolerations": []}}),
                expected: pod_with(json!({"tolerations": []})),
            },
            Case {
                name: "finalizers merge as a set",
                target: json!({"metadata": {"finalizers": ["a", "b"]}}),
                patch: json!({"metadata": {"finalizers": ["b", "c", "c"]}}),
                expected: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            },
            Case {
                name: "a new finalizer goes first without $setElementOrder",
                target: json!({"metadata": {"finalizers": ["a"]}}),
                patch: json!({"metadata": {"finalizers": ["b"]}}),
                expected: json!({"metadata": {"finalizers": ["b", "a"]}}),
            },
            Case {
                name: "finalizers are added to a missing list",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"metadata": {"finalizers": ["a"]}}),
                expected: json!({"metadata": {"name": "web", "finalizers": ["a"]}}),
            },
            Case {
                name: "$deleteFromPrimitiveList removes finalizers",
                target: json!({"metadata": {"finalizers": ["a", "b", "c", "b"]}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
                expected: json!({"metadata": {"finalizers": ["a", "c"]}}),
            },
            Case {
                name: "$deleteFromPrimitiveList works on atomic lists too",
                target: pod_with(json!({"containers": [{"name": "a", "args": ["x", "y"]}]})),
                patch: json!({"spec": {"containers": [
                    {"name": "a", "$deleteFromPrimitiveList/args": ["x"]}
                ]}}),
                expected: pod_with(json!({"containers": [{"name": "a", "args": ["y"]}]})),
            },
            Case {
                name: "$deleteFromPrimitiveList on a missing list adds nothing",
                target: json!({"metadata": {"name": "web"}}),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
                expected: json!({"metadata": {"name": "web"}}),
            },
        ]);
    }

    #[test]
    fn set_element_order_orders_merged_lists() {
        check(vec![
            Case {
                name: "$setElementOrder reorders live containers",
                target: pod_with(json!({"containers": containers(&["a", "b", "c"])})),
                patch: json!({"spec": {"$setElementOrder/containers": [
                    {"name": "c"}, {"name": "a"}, {"name": "b"}
                ]}}),
                expected: pod_with(json!({"containers": containers(&["c", "a", "b"])})),
            },
            Case {
                name: "$setElementOrder places a new container last",
                target: pod_with(json!({"containers": [{"name": "a", "image": "a:1"}]})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                    "containers": [{"name": "b", "image": "b:1"}]
                }}),
                expected: pod_with(json!({"containers": [
                    {"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1"}
                ]})),
            },
            Case {
                name: "$setElementOrder keeps server-only items where they were",
                target: pod_with(json!({"containers": [
                    {"name": "one"}, {"name": "two", "image": "b"}, {"name": "four", "image": "c"}
                ]})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "two"}, {"name": "three"}],
                    "containers": [{"name": "three"}, {"name": "one", "$patch": "delete"}]
                }}),
                expected: pod_with(json!({"containers": [
                    {"name": "two", "image": "b"}, {"name": "four", "image": "c"}, {"name": "three"}
                ]})),
            },
            Case {
                name: "$setElementOrder after a deletion, as upstream orders it",
                target: pod_with(json!({"containers": [
                    {"name": "one", "image": "a"}, {"name": "four", "image": "c"}
                ]})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "two"}, {"name": "three"}],
                    "containers": [
                        {"name": "two"}, {"name": "three"}, {"name": "one", "$patch": "delete"}
                    ]
                }}),
                expected: pod_with(json!({"containers": [
                    {"name": "four", "image": "c"}, {"name": "two"}, {"name": "three"}
                ]})),
            },
            Case {
                name: "$setElementOrder puts a new item ahead of later server-only items",
                target: pod_with(json!({"containers": [{"name": "one", "image": "a"}]})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "two"}],
                    "containers": [{"name": "two"}, {"name": "gone", "$patch": "delete"}]
                }}),
                expected: pod_with(json!({"containers": [
                    {"name": "two"}, {"name": "one", "image": "a"}
                ]})),
            },
            Case {
                name: "$setElementOrder names items the list does not have",
                target: pod_with(json!({"containers": containers(&["a", "c"])})),
                patch: json!({"spec": {"$setElementOrder/containers": [
                    {"name": "c"}, {"name": "b"}, {"name": "a"}
                ]}}),
                expected: pod_with(json!({"containers": containers(&["c", "a"])})),
            },
            Case {
                name: "$setElementOrder for a list the object lacks",
                target: pod_with(json!({})),
                patch: json!({"spec": {
                    "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                    "containers": [{"name": "b"}, {"name": "a", "tty": null}]
                }}),
                expected: pod_with(json!({"containers": containers(&["b", "a"])})),
            },
            Case {
                name: "$setElementOrder orders finalizers",
                target: json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                patch: json!({"metadata": {
                    "$setElementOrder/finalizers": ["a", "b", "d"],
                    "$deleteFromPrimitiveList/finalizers": ["c"],
                    "finalizers": ["d"]
                }}),
                expected: json!({"metadata": {"finalizers": ["a", "b", "d"]}}),
            },
            Case {
                name: "a kubectl apply patch of a deployment",
                target: json!({
                    "metadata": {"name": "web", "annotations": {
                        "kubectl.kubernetes.io/last-applied-configuration": "{}"
                    }},
                    "spec": {"replicas": 1, "template": {"spec": {"containers": [
                        {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
                        {"name": "injected", "image": "proxy"}
                    ]}}}
                }),
                patch: json!({
                    "metadata": {"annotations": {
                        "kubectl.kubernetes.io/last-applied-configuration": "{\"v\":2}"
                    }},
                    "spec": {"replicas": 2, "template": {"spec": {
                        "$setElementOrder/containers": [{"name": "app"}, {"name": "worker"}],
                        "containers": [
                            {"name": "app", "image": "app:2",
                             "$setElementOrder/env": [{"name": "B"}, {"name": "A"}],
                             "env": [{"name": "B", "value": "2"}]},
                            {"name": "worker", "image": "worker:1"}
                        ]
                    }}}
                }),
                expected: json!({
                    "metadata": {"name": "web", "annotations": {
                        "kubectl.kubernetes.io/last-applied-configuration": "{\"v\":2}"
                    }},
                    "spec": {"replicas": 2, "template": {"spec": {"containers": [
                        {"name": "app", "image": "app:2",
                         "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]},
                        {"name": "worker", "image": "worker:1"},
                        {"name": "injected", "image": "proxy"}
                    ]}}}
                }),
            },
        ]);
    }

    /// The error variant a case expects, with its path and a part of its message.
    enum Expect {
        Malformed(&'static str, &'static str),
        Invalid(&'static str, &'static str),
    }

    #[test]
    fn bad_patches_are_refused_with_their_location() {
        let pod = pod_with(json!({"containers": [{"name": "a", "env": [{"name": "X"}]}]}));
        let cases: Vec<(&str, Value, Value, Expect)> = vec![
            (
                "a patch must be an object",
                pod.clone(),
                json!([{"op": "add"}]),
                Expect::Malformed("", "not a list"),
            ),
            (
                "a container needs its name",
                pod.clone(),
                json!({"spec": {"containers": [{"image": "x"}]}}),
                Expect::Invalid(
                    "/spec/containers",
                    "does not contain declared merge key: name",
                ),
            ),
            (
                "a delete directive needs the merge key",
                pod.clone(),
                json!({"spec": {"containers": [{"name": "a", "env": [{"$patch": "delete"}]}]}}),
                Expect::Invalid("/spec/containers/0/env", "declared merge key: name"),
            ),
            (
                "an unknown $patch on a map",
                pod.clone(),
                json!({"metadata": {"labels": {"$patch": "bogus"}}}),
                Expect::Invalid("/metadata/labels", "unknown patch type: \"bogus\""),
            ),
            (
                "an unknown $patch on a list item",
                pod.clone(),
                json!({"spec": {"containers": [{"name": "a", "$patch": 1}]}}),
                Expect::Invalid("/spec/containers", "unknown patch type: 1"),
            ),
            (
                "$patch merge on a list is not supported",
                pod.clone(),
                json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
                Expect::Invalid("/spec/containers", "merging lists cannot yet be specified"),
            ),
            (
                "$retainKeys must be a list",
                pod.clone(),
                json!({"spec": {"$retainKeys": "containers"}}),
                Expect::Malformed("/spec", "invalid patch format of retainKeys"),
            ),
            (
                "patch fields must be listed in $retainKeys",
                pod.clone(),
                json!({"spec": {"$retainKeys": ["containers"], "nodeName": "n"}}),
                Expect::Malformed("/spec", "nodeName is not in $retainKeys"),
            ),
            (
                "$setElementOrder must be a list",
                pod.clone(),
                json!({"spec": {"$setElementOrder/containers": {"name": "a"}}}),
                Expect::Malformed("/spec/containers", "setElementOrder list"),
            ),
            (
                "$setElementOrder needs a field name",
                pod.clone(),
                json!({"spec": {"$setElementOrder": []}}),
                Expect::Malformed("/spec", "setElementOrder list: $setElementOrder"),
            ),
            (
                "$setElementOrder must agree with the patch order",
                pod_with(json!({"containers": containers(&["a", "b"])})),
                json!({"spec": {
                    "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                    "containers": [{"name": "b"}, {"name": "a"}]
                }}),
                Expect::Invalid("/spec/containers", "doesn't match $setElementOrder list"),
            ),
            (
                "$setElementOrder items need the merge key",
                pod.clone(),
                json!({"spec": {"$setElementOrder/containers": [{"image": "x"}]}}),
                Expect::Invalid("/spec/containers", "declared merge key: name"),
            ),
            (
                "$deleteFromPrimitiveList must be a list",
                pod.clone(),
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
                Expect::Malformed(
                    "/metadata/finalizers",
                    "invalid patch format of primitive list",
                ),
            ),
            (
                "$deleteFromPrimitiveList needs a field name",
                pod.clone(),
                json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}),
                Expect::Malformed("/metadata", "invalid patch format of primitive list"),
            ),
            (
                "finalizers cannot hold lists",
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": [["b"]]}}),
                Expect::Invalid("/metadata/finalizers", "lists of lists are not supported"),
            ),
            (
                "finalizers cannot hold maps",
                json!({"metadata": {"finalizers": []}}),
                json!({"metadata": {"finalizers": [{"name": "a"}]}}),
                Expect::Invalid("/metadata/finalizers", "without a merge key"),
            ),
            (
                "set items share one type",
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": [1]}}),
                Expect::Invalid(
                    "/metadata/finalizers",
                    "list element types are not identical",
                ),
            ),
            (
                "a live container without a name cannot merge",
                pod_with(json!({"containers": [{"image": "x"}]})),
                json!({"spec": {"containers": [{"name": "a"}]}}),
                Expect::Invalid("/spec/containers", "does not contain declared merge key"),
            ),
        ];
        for (name, target, patch, expect) in cases {
            let error = strategic_merge_patch(&target, &patch, &BuiltinSchema)
                .err()
                .unwrap_or_else(|| panic!("{name}: patch applied"));
            let message = error.to_string();
            let (want_path, part, path) = match (&expect, &error) {
                (Expect::Malformed(at, part), PatchError::Malformed { path, .. })
                | (Expect::Invalid(at, part), PatchError::Invalid { path, .. }) => (at, part, path),
                _ => panic!("{name}: unexpected {error:?}"),
            };
            assert_eq!(path, want_path, "{name}");
            assert!(message.contains(part), "{name}: {message}");
        }
    }

    #[test]
    fn messages_name_the_location() {
        let error = strategic_merge_patch(
            &json!({"spec": {"containers": []}}),
            &json!({"spec": {"containers": [{"image": "x"}]}}),
            &BuiltinSchema,
        )
        .err();
        assert_eq!(
            error.map(|error| error.to_string()).as_deref(),
            Some(
                r#"map: {"image":"x"} does not contain declared merge key: name at /spec/containers"#
            )
        );
    }
}
