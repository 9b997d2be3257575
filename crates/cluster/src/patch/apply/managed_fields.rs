//! `metadata.managedFields`: the entries that record which manager set which fields,
//! read and written in upstream's form, and the fields no manager owns.

use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use crate::patch::fieldset::{FieldSet, PathElement};
use crate::pointer::Pointer;

/// Metadata fields no manager owns: the object's identity and the server's bookkeeping.
pub(super) const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// How a manager wrote its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write: create, update, or a merge, JSON or strategic patch.
    Update,
}

impl Operation {
    /// The name `managedFields` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Removes from `set` the fields no manager owns: apiVersion, kind, the untracked
/// metadata fields, and `.metadata` itself (the fields below it stay).
pub(super) fn untrack(set: &mut FieldSet) {
    for name in ["apiVersion", "kind"] {
        set.remove_child(&PathElement::field(name));
    }
    let metadata = PathElement::field("metadata");
    if let Some(fields) = set.child_mut(&metadata) {
        for name in UNTRACKED_METADATA {
            fields.remove_child(&PathElement::field(name));
        }
        fields.set_member(false);
        if fields.is_empty() {
            set.remove_child(&metadata);
        }
    }
}

/// `.metadata` itself: every object has it and nobody owns or removes it.
pub(super) static METADATA_ITSELF: LazyLock<FieldSet> = LazyLock::new(|| {
    let mut set = FieldSet::default();
    set.insert(&[PathElement::field("metadata")]);
    set
});

/// One `metadata.managedFields` entry.
#[derive(Clone, Debug)]
pub(super) struct ManagedEntry {
    pub(super) manager: String,
    pub(super) operation: Operation,
    pub(super) api_version: String,
    pub(super) time: Option<String>,
    pub(super) subresource: Option<String>,
    pub(super) fields: FieldSet,
    /// `fields` as stored (`fieldsV1`), while they are unchanged: most writes leave most
    /// entries alone, which then go back as stored rather than encoded again.
    pub(super) stored_fields: Option<Value>,
}

impl ManagedEntry {
    /// Whether this is the entry of `manager` writing by `operation` through `subresource`.
    pub(super) fn is(
        &self,
        manager: &str,
        operation: Operation,
        subresource: Option<&str>,
    ) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    /// Drops the fields another write `taken` over and those the object no longer has.
    pub(super) fn give_up(&mut self, taken: &FieldSet, removed: &FieldSet) {
        if self.fields.intersects(taken) || self.fields.intersects(removed) {
            self.set_fields(self.fields.difference(taken).difference(removed));
        }
    }

    /// Adds `written` to the entry's fields.
    pub(super) fn take(&mut self, written: &FieldSet) {
        if !self.fields.contains(written) {
            self.set_fields(self.fields.union(written));
        }
    }

    pub(super) fn set_fields(&mut self, fields: FieldSet) {
        self.fields = fields;
        self.stored_fields = None;
    }

    /// Reads an entry; fails on an unknown operation or fields type, or bad `fieldsV1`.
    pub(super) fn decode(entry: &Value) -> Result<ManagedEntry, String> {
        let text = |name: &str| entry.get(name).and_then(Value::as_str);
        let operation = match text("operation") {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            other => {
                return Err(format!(
                    "invalid operation {other:?} in a managed fields entry"
                ));
            }
        };
        match text("fieldsType") {
            Some("FieldsV1") => {}
            None | Some("") => return Err("missing fieldsType in a managed fields entry".into()),
            Some(other) => {
                return Err(format!(
                    "invalid fieldsType {other:?} in a managed fields entry"
                ));
            }
        }
        let (fields, stored_fields) = match entry.get("fieldsV1") {
            None | Some(Value::Null) => (FieldSet::default(), None),
            Some(fields) => (FieldSet::from_fields_v1(fields)?, Some(fields.clone())),
        };
        Ok(ManagedEntry {
            manager: text("manager").unwrap_or_default().to_string(),
            operation,
            api_version: text("apiVersion").unwrap_or_default().to_string(),
            time: text("time").map(str::to_string),
            subresource: text("subresource")
                .filter(|subresource| !subresource.is_empty())
                .map(str::to_string),
            fields,
            stored_fields,
        })
    }

    /// The entry in upstream's field order.
    pub(super) fn encode(self) -> Value {
        let mut entry = Map::new();
        entry.insert("manager".into(), json!(self.manager));
        entry.insert("operation".into(), json!(self.operation.as_str()));
        entry.insert("apiVersion".into(), json!(self.api_version));
        if let Some(time) = &self.time {
            entry.insert("time".into(), json!(time));
        }
        entry.insert("fieldsType".into(), json!("FieldsV1"));
        let fields = self
            .stored_fields
            .unwrap_or_else(|| self.fields.into_fields_v1());
        entry.insert("fieldsV1".into(), fields);
        if let Some(subresource) = &self.subresource {
            entry.insert("subresource".into(), json!(subresource));
        }
        Value::Object(entry)
    }
}

/// The entries stored in `object`; fails when they cannot be read.
pub(super) fn stored_entries(object: &Value) -> Result<Vec<ManagedEntry>, String> {
    match object.at("/metadata/managedFields") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => entries.iter().map(ManagedEntry::decode).collect(),
        Some(other) => Err(format!("expected a list, got {other}")),
    }
}

/// The entries an update starts from: those the client wrote into `new` when it wrote
/// any (a single empty entry clears them), else the stored ones. Writes through a
/// subresource cannot edit managed fields.
pub(super) fn starting_entries(
    old: &Value,
    new: &Value,
    through_subresource: bool,
) -> Vec<ManagedEntry> {
    let stored = || stored_entries(old).unwrap_or_default();
    if through_subresource {
        return stored();
    }
    if new.at("/metadata/managedFields") == Some(&json!([{}])) {
        return Vec::new();
    }
    match stored_entries(new) {
        Ok(entries) if !entries.is_empty() => entries,
        _ => stored(),
    }
}

/// The fields every entry but the one at `index` owns.
pub(super) fn owned_besides(entries: &[ManagedEntry], index: usize) -> FieldSet {
    entries
        .iter()
        .enumerate()
        .filter(|(other, _)| *other != index)
        .fold(FieldSet::default(), |owned, (_, entry)| {
            owned.union(&entry.fields)
        })
}

/// `object` with `metadata.managedFields` set to `entries`, or without it when none.
pub(super) fn with_managed_fields(object: Value, entries: Vec<ManagedEntry>) -> Value {
    with_encoded_managed_fields(
        object,
        entries.into_iter().map(ManagedEntry::encode).collect(),
    )
}

/// `object` with `metadata.managedFields` set to `entries` (encoded), or without it
/// when none.
pub(super) fn with_encoded_managed_fields(mut object: Value, entries: Vec<Value>) -> Value {
    let Some(fields) = object.as_object_mut() else {
        return object;
    };
    if entries.is_empty() {
        if let Some(metadata) = fields.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.remove("managedFields");
        }
        return object;
    }
    let metadata = fields
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(metadata) = metadata.as_object_mut() {
        metadata.insert("managedFields".into(), Value::Array(entries));
    }
    object
}

/// The string at `pointer`, or empty.
pub(super) fn text_at(object: &Value, pointer: &str) -> String {
    object
        .at(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
