//! Server-side apply and `metadata.managedFields` tracking, following
//! structured-merge-diff: every write records which manager set which fields; an apply
//! merges the manager's configuration into the object, removes what that manager
//! applied before and no longer does, and refuses to change fields other managers own
//! unless forced.

use std::collections::{BTreeSet, VecDeque};
use std::fmt;
use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use super::fieldset::{FieldSet, PathElement, path_text, same_value};
use crate::pointer::Pointer;
use crate::schema::{FieldSchema, ListType};

/// Metadata fields no manager owns: the object's identity and the server's bookkeeping.
const UNTRACKED_METADATA: &[&str] = &[
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

/// A field an apply would change that another manager owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The manager that owns the field.
    pub manager: String,
    /// The field, in upstream notation: `.spec.replicas`, `.spec.containers[name="app"].image`.
    pub field: String,
    /// How the owner wrote the field.
    pub operation: Operation,
    /// The apiVersion the owner wrote the field with.
    pub api_version: String,
    /// The subresource the owner wrote through, if any.
    pub subresource: Option<String>,
}

impl Conflict {
    /// The owner as upstream names it in messages: `"kubectl-client-side-apply" using
    /// apps/v1` for an update, `"kubectl"` for an apply, with `with subresource
    /// "status"` after the name when written through one.
    pub fn owner(&self) -> String {
        let mut owner = format!("{:?}", self.manager);
        if let Some(subresource) = &self.subresource {
            owner.push_str(&format!(" with subresource {subresource:?}"));
        }
        if self.operation == Operation::Update {
            owner.push_str(&format!(" using {}", self.api_version));
        }
        owner
    }

    // Upstream groups and sorts conflicts by the JSON that identifies the owner.
    fn owner_identity(&self) -> String {
        let mut identity = Map::new();
        identity.insert("manager".into(), json!(self.manager));
        identity.insert("operation".into(), json!(self.operation.as_str()));
        if self.operation == Operation::Update {
            identity.insert("apiVersion".into(), json!(self.api_version));
        }
        if let Some(subresource) = &self.subresource {
            identity.insert("subresource".into(), json!(subresource));
        }
        Value::Object(identity).to_string()
    }
}

/// The message of the conflict's status cause (whose `field` is [`Conflict::field`]).
impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conflict with {}", self.owner())
    }
}

/// Why an apply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The apply would change fields other managers own; retry with force to take them.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The apply configuration or the stored managed fields cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// Upstream's message: one conflict inline, several grouped by owner.
fn conflicts_message(conflicts: &[Conflict]) -> String {
    if let [only] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            only.owner(),
            only.field
        );
    }
    let mut groups: Vec<(String, String, Vec<&str>)> = Vec::new();
    for conflict in conflicts {
        let identity = conflict.owner_identity();
        match groups.iter_mut().find(|group| group.0 == identity) {
            Some(group) => group.2.push(&conflict.field),
            None => groups.push((identity, conflict.owner(), vec![&conflict.field])),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let lines: Vec<String> = groups
        .iter()
        .flat_map(|(_, owner, fields)| {
            std::iter::once(format!("conflicts with {owner}:"))
                .chain(fields.iter().map(|field| format!("- {field}")))
        })
        .collect();
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Server-side apply of `applied` (the configuration the client sent) by `manager`
/// onto `live` (`None` when the object does not exist yet), recorded at `now` (RFC 3339)
/// and through `subresource` if any. Returns the new object with its
/// `metadata.managedFields` updated.
///
/// Fails with [`ApplyError::Conflicts`] when, without `force`, the apply changes fields
/// other managers own, and with [`ApplyError::Invalid`] when `applied` is not an object,
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
) -> Result<Value, ApplyError> {
    let config = apply_configuration(applied)?;
    let mut walker = Walker::new(schema);
    let mut applied_fields = walker.applied_fields(&config)?;
    untrack(&mut applied_fields);
    let nothing = Value::Object(Map::new());
    let base = live.unwrap_or(&nothing);
    let mut entries = stored_entries(base)
        .map_err(|err| ApplyError::Invalid(format!("failed to decode managed fields: {err}")))?;
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
        return Err(ApplyError::Conflicts(conflicts));
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
    fn entry(&mut self) -> Option<&mut ManagedEntry> {
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

/// The fields every entry but the one at `index` owns.
fn owned_besides(entries: &[ManagedEntry], index: usize) -> FieldSet {
    entries
        .iter()
        .enumerate()
        .filter(|(other, _)| *other != index)
        .fold(FieldSet::default(), |owned, (_, entry)| {
            owned.union(&entry.fields)
        })
}

/// The configuration to apply, without its nulls (a null means no opinion); fails
/// when it is not an object or sets managed fields, as upstream.
fn apply_configuration(applied: &Value) -> Result<Value, ApplyError> {
    if !applied.is_object() {
        return Err(ApplyError::Invalid(
            "the apply configuration must be a JSON object".to_string(),
        ));
    }
    if applied
        .at("/metadata/managedFields")
        .is_some_and(|fields| !fields.is_null())
    {
        return Err(ApplyError::Invalid(
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

/// The string at `pointer`, or empty.
fn text_at(object: &Value, pointer: &str) -> String {
    object
        .at(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Removes from `set` the fields no manager owns: apiVersion, kind, the untracked
/// metadata fields, and `.metadata` itself (the fields below it stay).
fn untrack(set: &mut FieldSet) {
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
static METADATA_ITSELF: LazyLock<FieldSet> = LazyLock::new(|| {
    let mut set = FieldSet::default();
    set.insert(&[PathElement::field("metadata")]);
    set
});

/// One `metadata.managedFields` entry.
#[derive(Clone, Debug)]
struct ManagedEntry {
    manager: String,
    operation: Operation,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    fields: FieldSet,
    /// `fields` as stored (`fieldsV1`), while they are unchanged: most writes leave most
    /// entries alone, and re-encoding them was a tenth of every write.
    stored_fields: Option<Value>,
}

impl ManagedEntry {
    /// Whether this is the entry of `manager` writing by `operation` through `subresource`.
    fn is(&self, manager: &str, operation: Operation, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }

    /// Drops the fields another write `taken` over and those the object no longer has.
    fn give_up(&mut self, taken: &FieldSet, removed: &FieldSet) {
        if self.fields.intersects(taken) || self.fields.intersects(removed) {
            self.set_fields(self.fields.difference(taken).difference(removed));
        }
    }

    /// Adds `written` to the entry's fields.
    fn take(&mut self, written: &FieldSet) {
        if !self.fields.contains(written) {
            self.set_fields(self.fields.union(written));
        }
    }

    fn set_fields(&mut self, fields: FieldSet) {
        self.fields = fields;
        self.stored_fields = None;
    }

    /// The fields of `written` this entry owns, as conflicts.
    fn conflicts(&self, written: &FieldSet) -> Vec<Conflict> {
        self.fields
            .intersection(written)
            .paths()
            .iter()
            .map(|path| Conflict {
                manager: self.manager.clone(),
                field: path_text(path),
                operation: self.operation,
                api_version: self.api_version.clone(),
                subresource: self.subresource.clone(),
            })
            .collect()
    }

    /// Reads an entry; fails on an unknown operation or fields type, or bad `fieldsV1`.
    fn decode(entry: &Value) -> Result<ManagedEntry, String> {
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
    fn encode(self) -> Value {
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
fn stored_entries(object: &Value) -> Result<Vec<ManagedEntry>, String> {
    match object.at("/metadata/managedFields") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => entries.iter().map(ManagedEntry::decode).collect(),
        Some(other) => Err(format!("expected a list, got {other}")),
    }
}

/// The entries an update starts from: those the client wrote into `new` when it wrote
/// any (a single empty entry clears them), else the stored ones. Writes through a
/// subresource cannot edit managed fields.
fn starting_entries(old: &Value, new: &Value, through_subresource: bool) -> Vec<ManagedEntry> {
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

/// `object` with `metadata.managedFields` set to `entries`, or without it when none.
fn with_managed_fields(object: Value, entries: Vec<ManagedEntry>) -> Value {
    with_encoded_managed_fields(
        object,
        entries.into_iter().map(ManagedEntry::encode).collect(),
    )
}

/// `object` with `metadata.managedFields` set to `entries` (encoded), or without it
/// when none.
fn with_encoded_managed_fields(mut object: Value, entries: Vec<Value>) -> Value {
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

/// Fields added, changed and dropped between two versions of an object.
#[derive(Debug, Default)]
struct Changes {
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

    fn tracked(mut self) -> Changes {
        for set in [&mut self.added, &mut self.modified, &mut self.removed] {
            untrack(set);
        }
        self
    }

    /// The fields the write set, and those it dropped.
    fn written_and_removed(self) -> (FieldSet, FieldSet) {
        let written = if self.modified.is_empty() {
            self.added
        } else {
            self.added.union(&self.modified)
        };
        (written, self.removed)
    }
}

/// The identity of each item of a granular list, in order; fails on an item that is
/// not an object or lacks a key field of a keyed list.
fn item_elements(list_type: &ListType, items: &[Value]) -> Result<Vec<PathElement>, String> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item_element(list_type, item).map_err(|err| format!("element {index}: {err}"))
        })
        .collect()
}

fn item_element(list_type: &ListType, item: &Value) -> Result<PathElement, String> {
    let ListType::Map(keys) = list_type else {
        return Ok(PathElement::Value(item.clone()));
    };
    let Value::Object(fields) = item else {
        return Err(format!(
            "expected an object in an associative list, got {item}"
        ));
    };
    keys.iter()
        .map(|key| {
            fields
                .get(key)
                .filter(|value| !value.is_null())
                .cloned()
                .or_else(|| key_default(key))
                .map(|value| (key.clone(), value))
                .ok_or_else(|| {
                    format!(
                        "associative list with keys has an element that omits key field {key:?} \
                         (and doesn't have default value)"
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(PathElement::key)
}

/// The default of a key field, which upstream takes from the schema: every built-in
/// list keyed by `protocol` (container and service ports) defaults it to TCP.
fn key_default(key: &str) -> Option<Value> {
    (key == "protocol").then(|| json!("TCP"))
}

/// The first item element repeated in `elements`, if any.
fn first_duplicate(elements: &[PathElement]) -> Option<&PathElement> {
    let mut seen = BTreeSet::new();
    elements.iter().find(|element| !seen.insert(*element))
}

/// Walks objects along with the schema, knowing where it is: field names for the
/// schema and the path for field sets.
struct Walker<'s> {
    schema: &'s dyn FieldSchema,
    names: Names,
    path: Vec<PathElement>,
}

/// The field names from the root to where a walk is, for the schema: a stack whose
/// strings are kept when the walk goes up and written over when it goes down again, so
/// a step allocates nothing once the walk has been as deep before.
#[derive(Default)]
struct Names {
    parts: Vec<String>,
    depth: usize,
}

impl Names {
    fn push(&mut self, name: &str) {
        match self.parts.get_mut(self.depth) {
            Some(part) => {
                part.clear();
                part.push_str(name);
            }
            None => self.parts.push(name.to_string()),
        }
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn as_strs(&self) -> Vec<&str> {
        self.parts[..self.depth]
            .iter()
            .map(String::as_str)
            .collect()
    }
}

/// How deep [`Walker::compare`] looks for equal subtrees to skip.
const SKIP_EQUAL_DEPTH: usize = 2;

impl<'s> Walker<'s> {
    fn new(schema: &'s dyn FieldSchema) -> Self {
        Walker {
            schema,
            names: Names::default(),
            path: Vec::new(),
        }
    }

    fn in_field<R>(&mut self, name: &str, visit: impl FnOnce(&mut Self) -> R) -> R {
        self.names.push(name);
        self.path.push(PathElement::field(name));
        let result = visit(self);
        self.names.pop();
        self.path.pop();
        result
    }

    fn in_item<R>(&mut self, element: PathElement, visit: impl FnOnce(&mut Self) -> R) -> R {
        self.path.push(element);
        let result = visit(self);
        self.path.pop();
        result
    }

    fn list_type(&self) -> ListType {
        self.schema.list_type(&self.names.as_strs())
    }

    /// The fields an apply configuration sets: every leaf, every item of a granular
    /// list, and empty objects. Fails on keyed list items without their key or repeated.
    fn applied_fields(&mut self, config: &Value) -> Result<FieldSet, ApplyError> {
        let mut set = FieldSet::default();
        if let Value::Object(fields) = config {
            self.applied_object(fields, &mut set)?;
        }
        Ok(set)
    }

    fn applied_object(
        &mut self,
        fields: &Map<String, Value>,
        set: &mut FieldSet,
    ) -> Result<(), ApplyError> {
        for (name, value) in fields {
            self.in_field(name, |walker| walker.applied_value(value, set))?;
        }
        Ok(())
    }

    fn applied_value(&mut self, value: &Value, set: &mut FieldSet) -> Result<(), ApplyError> {
        match value {
            Value::Object(fields) if !fields.is_empty() => self.applied_object(fields, set),
            Value::Array(items) => self.applied_list(items, set),
            _ => {
                set.insert(&self.path);
                Ok(())
            }
        }
    }

    fn applied_list(&mut self, items: &[Value], set: &mut FieldSet) -> Result<(), ApplyError> {
        let list_type = self.list_type();
        if list_type == ListType::Atomic {
            set.insert(&self.path);
            return Ok(());
        }
        let invalid = |path: &[PathElement], reason: String| {
            ApplyError::Invalid(format!("{}: {reason}", path_text(path)))
        };
        let elements = item_elements(&list_type, items).map_err(|err| invalid(&self.path, err))?;
        if let Some(duplicate) = first_duplicate(&elements) {
            return Err(invalid(
                &self.path,
                format!("duplicate entries for key {duplicate}"),
            ));
        }
        for (element, item) in elements.into_iter().zip(items) {
            self.in_item(element, |walker| {
                set.insert(&walker.path);
                match item {
                    Value::Object(fields) if matches!(list_type, ListType::Map(_)) => {
                        walker.applied_object(fields, set)
                    }
                    _ => Ok(()),
                }
            })?;
        }
        Ok(())
    }

    /// `config` written over `live`: objects merge field by field, granular lists item
    /// by item, anything else is replaced.
    fn merge(&mut self, live: Option<&Value>, config: &Value) -> Value {
        match (live, config) {
            (Some(Value::Object(live)), Value::Object(config)) => {
                let mut merged = live.clone();
                for (name, value) in config {
                    let value = self.in_field(name, |walker| walker.merge(live.get(name), value));
                    merged.insert(name.clone(), value);
                }
                Value::Object(merged)
            }
            (Some(Value::Array(live)), Value::Array(config)) => self.merge_lists(live, config),
            _ => config.clone(),
        }
    }

    fn merge_lists(&mut self, live: &[Value], config: &[Value]) -> Value {
        let list_type = self.list_type();
        let unique = |items: &[Value]| {
            item_elements(&list_type, items)
                .ok()
                .filter(|elements| first_duplicate(elements).is_none())
        };
        match (&list_type, unique(live), unique(config)) {
            (ListType::Atomic, _, _) => Value::Array(config.to_vec()),
            (_, Some(live_keys), Some(config_keys)) => {
                Value::Array(self.merge_items(live, &live_keys, config, &config_keys))
            }
            // A live list whose items cannot be told apart is replaced whole.
            _ => Value::Array(config.to_vec()),
        }
    }

    /// Upstream's item order: items in both lists follow the configuration's order,
    /// live-only items keep their place, configuration-only items come where the
    /// configuration puts them.
    fn merge_items(
        &mut self,
        live: &[Value],
        live_keys: &[PathElement],
        config: &[Value],
        config_keys: &[PathElement],
    ) -> Vec<Value> {
        let mut shared = config_keys
            .iter()
            .filter(|key| live_keys.contains(key))
            .collect::<VecDeque<_>>();
        let mut next_shared = shared.pop_front();
        let mut merged_config = BTreeSet::new();
        let mut out = Vec::with_capacity(live.len().max(config.len()));
        let (mut live_at, mut config_at) = (0, 0);
        while live_at < live.len() || config_at < config.len() {
            if live_at < live.len() && config_at < config.len() {
                let key = &live_keys[live_at];
                if *key == config_keys[config_at] {
                    merged_config.insert(key);
                    out.push(self.merge(Some(&live[live_at]), &config[config_at]));
                    live_at += 1;
                    config_at += 1;
                    next_shared = shared.pop_front();
                    continue;
                }
                // A shared item the configuration places later goes there instead.
                if config_keys.contains(key) && next_shared.is_some_and(|next| next != key) {
                    live_at += 1;
                    continue;
                }
            }
            if live_at < live.len() {
                let key = &live_keys[live_at];
                if !config_keys.contains(key) {
                    out.push(live[live_at].clone());
                    live_at += 1;
                    continue;
                }
                if merged_config.contains(key) {
                    live_at += 1;
                    continue;
                }
            }
            if config_at < config.len() {
                let key = &config_keys[config_at];
                merged_config.insert(key);
                let live_item = live_keys
                    .iter()
                    .position(|live_key| live_key == key)
                    .map(|index| &live[index]);
                out.push(self.merge(live_item, &config[config_at]));
                config_at += 1;
                if next_shared == Some(key) {
                    next_shared = shared.pop_front();
                }
            }
        }
        out
    }

    /// Drops from `merged` what `last_applied` held and `still_owned` does not, as
    /// upstream's prune: a field kept by nobody goes with everything under it.
    fn prune(&mut self, merged: &Value, last_applied: &FieldSet, still_owned: &FieldSet) -> Value {
        let kept = still_owned.with_field_ancestors().union(&METADATA_ITSELF);
        let doomed = last_applied.with_field_ancestors().difference(&kept);
        self.remove(merged, &doomed)
    }

    /// `value` without the paths `doomed` holds (and everything under them).
    fn remove(&mut self, value: &Value, doomed: &FieldSet) -> Value {
        match value {
            Value::Object(fields) => {
                let mut kept = Map::new();
                for (name, value) in fields {
                    match doomed.child(&PathElement::field(name)) {
                        Some(child) if child.is_member() => {}
                        Some(child) => {
                            let rest = self.in_field(name, |walker| walker.remove(value, child));
                            kept.insert(name.clone(), rest);
                        }
                        None => {
                            kept.insert(name.clone(), value.clone());
                        }
                    }
                }
                Value::Object(kept)
            }
            Value::Array(items) => self.remove_items(items, doomed),
            other => other.clone(),
        }
    }

    fn remove_items(&mut self, items: &[Value], doomed: &FieldSet) -> Value {
        let list_type = self.list_type();
        let elements = match list_type {
            ListType::Atomic => None,
            _ => item_elements(&list_type, items).ok(),
        };
        let Some(elements) = elements else {
            return Value::Array(items.to_vec());
        };
        items
            .iter()
            .zip(elements)
            .filter_map(|(item, element)| match doomed.child(&element) {
                Some(child) if child.is_member() => None,
                Some(child) => Some(self.remove(item, child)),
                None => Some(item.clone()),
            })
            .collect()
    }

    /// What changed from `old` to `new`, in tracked fields only.
    fn changes(&mut self, old: &Value, new: &Value) -> Changes {
        let mut changes = Changes::default();
        self.compare(Some(old), Some(new), &mut changes);
        changes.tracked()
    }

    fn compare(&mut self, old: Option<&Value>, new: Option<&Value>, changes: &mut Changes) {
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
        // almost always changes something, so comparing the whole objects only to go on
        // to their fields compared everything twice; each field's own check finds the
        // same for the same cost.
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
    fn whole<W: Whole>(&mut self, value: &Value) -> W {
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
trait Whole: Sized {
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

    const EARLIER: &str = "2024-05-01T10:00:00Z";
    const NOW: &str = "2024-05-01T10:05:00Z";

    fn deployment(spec: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": spec
        })
    }

    fn container(name: &str, image: &str) -> Value {
        json!({"name": name, "image": image})
    }

    fn with_containers(containers: Value) -> Value {
        deployment(json!({"template": {"spec": {"containers": containers}}}))
    }

    fn apply_as(live: Option<&Value>, config: &Value, manager: &str) -> Result<Value, ApplyError> {
        apply(live, config, manager, false, &BuiltinSchema, NOW, None)
    }

    /// The object after each manager applied its configuration in turn.
    fn applied_in_turn(steps: &[(&str, Value)]) -> Value {
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

    fn entries(object: &Value) -> Vec<ManagedEntry> {
        stored_entries(object).unwrap()
    }

    /// The paths `manager` owns, in upstream notation, over all its entries.
    fn owned(object: &Value, manager: &str) -> Vec<String> {
        entries(object)
            .iter()
            .filter(|entry| entry.manager == manager)
            .flat_map(|entry| entry.fields.paths())
            .map(|path| path_text(&path))
            .collect()
    }

    fn owners_of(object: &Value, field: &str) -> Vec<String> {
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

    fn without_managed_fields(object: &Value) -> Value {
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
    fn applying_a_field_another_manager_owns() {
        struct Case {
            scenario: &'static str,
            theirs: i64,
            mine: i64,
            force: bool,
            replicas: Option<i64>,
            owners: &'static [&'static str],
        }
        let cases = [
            Case {
                scenario: "the same value is shared",
                theirs: 3,
                mine: 3,
                force: false,
                replicas: Some(3),
                owners: &["alice", "bob"],
            },
            Case {
                scenario: "a different value conflicts",
                theirs: 3,
                mine: 5,
                force: false,
                replicas: None,
                owners: &[],
            },
            Case {
                scenario: "force takes the field",
                theirs: 3,
                mine: 5,
                force: true,
                replicas: Some(5),
                owners: &["bob"],
            },
        ];
        for case in cases {
            let live = applied_in_turn(&[("alice", deployment(json!({"replicas": case.theirs})))]);
            let config = deployment(json!({"replicas": case.mine}));

            let result = apply(
                Some(&live),
                &config,
                "bob",
                case.force,
                &BuiltinSchema,
                NOW,
                None,
            );

            match (result, case.replicas) {
                (Ok(object), Some(replicas)) => {
                    assert_eq!(
                        object["spec"]["replicas"],
                        json!(replicas),
                        "{}",
                        case.scenario
                    );
                    assert_eq!(
                        owners_of(&object, ".spec.replicas"),
                        case.owners,
                        "{}",
                        case.scenario
                    );
                }
                (Err(ApplyError::Conflicts(conflicts)), None) => {
                    let message = ApplyError::Conflicts(conflicts.clone()).to_string();
                    assert_eq!(
                        message,
                        r#"Apply failed with 1 conflict: conflict with "alice": .spec.replicas"#,
                        "{}",
                        case.scenario
                    );
                    assert_eq!(conflicts[0].manager, "alice");
                    assert_eq!(conflicts[0].to_string(), r#"conflict with "alice""#);
                }
                (other, _) => panic!("{}: unexpected {other:?}", case.scenario),
            }
        }
    }

    #[test]
    fn a_forced_apply_leaves_the_other_manager_its_other_fields() {
        let live =
            applied_in_turn(&[("alice", deployment(json!({"replicas": 3, "paused": false})))]);
        let config = deployment(json!({"replicas": 5}));

        let object = apply(Some(&live), &config, "bob", true, &BuiltinSchema, NOW, None).unwrap();

        assert_eq!(owned(&object, "alice"), [".spec.paused"]);
        assert_eq!(owned(&object, "bob"), [".spec.replicas"]);
    }

    #[test]
    fn kubectl_create_then_a_differing_server_side_apply_conflicts() {
        let created = track_update(
            None,
            deployment(json!({"replicas": 3, "minReadySeconds": 10})),
            "kubectl-client-side-apply",
            &BuiltinSchema,
            EARLIER,
            None,
        );

        let err = apply_as(
            Some(&created),
            &deployment(json!({"replicas": 5})),
            "kubectl",
        )
        .unwrap_err();

        assert_eq!(
            err.to_string(),
            r#"Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.replicas"#
        );
        let ApplyError::Conflicts(conflicts) = err else {
            panic!("expected conflicts");
        };
        assert_eq!(
            conflicts,
            [Conflict {
                manager: "kubectl-client-side-apply".into(),
                field: ".spec.replicas".into(),
                operation: Operation::Update,
                api_version: "apps/v1".into(),
                subresource: None,
            }]
        );
        assert_eq!(
            conflicts[0].to_string(),
            r#"conflict with "kubectl-client-side-apply" using apps/v1"#
        );
    }

    #[test]
    fn several_conflicts_are_grouped_by_owner_as_upstream_prints_them() {
        let created = track_update(
            None,
            deployment(json!({"replicas": 3, "minReadySeconds": 10})),
            "kubectl-client-side-apply",
            &BuiltinSchema,
            EARLIER,
            None,
        );
        let live = apply_as(
            Some(&created),
            &deployment(json!({"paused": true})),
            "other",
        )
        .unwrap();
        let config = deployment(json!({"replicas": 5, "minReadySeconds": 0, "paused": false}));

        let err = apply_as(Some(&live), &config, "kubectl").unwrap_err();

        assert_eq!(
            err.to_string(),
            "Apply failed with 3 conflicts: \
             conflicts with \"kubectl-client-side-apply\" using apps/v1:\n\
             - .spec.minReadySeconds\n\
             - .spec.replicas\n\
             conflicts with \"other\":\n\
             - .spec.paused"
        );
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
                Err(ApplyError::Invalid(reason)) => assert_eq!(reason, message),
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
