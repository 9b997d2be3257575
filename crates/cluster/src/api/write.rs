//! Creates and updates: the body checked, placed and named, defaulted, validated and
//! pruned, managed fields recorded, and the write committed unless the object moved
//! since it was read.

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::delete::{deletion_complete, finalizers};
use super::{Answer, Api, Read, WriteOptions};
use crate::defaults;
use crate::errors::ApiError;
use crate::field_validation;
use crate::object_key::ObjectKey;
use crate::patch::apply;
use crate::patch::error::json_type;
use crate::pointer::Pointer;
use crate::resources::Resource;
use crate::store::{Prepared, StoredObject, Write};
use crate::structural;
use crate::structural_prune;
use crate::typed;
use crate::validate;
use capstan_api::clock::rfc3339;

/// What a committed write stored, and the object as written (see [`Store::transact_value`](crate::store::Store::transact_value)).
type Committed = (Option<StoredObject>, Option<Value>);

/// How many suffixes a create with `generateName` tries before reporting the conflict.
const GENERATE_NAME_ATTEMPTS: u32 = 8;

impl Api {
    /// POST: creates an object in `namespace`.
    pub fn create(
        &self,
        resource: &Resource,
        namespace: &str,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        self.create_answer(resource, namespace, body, options)
            .map(Answer::into_value)
    }

    /// [`create`](Self::create), answering with the stored bytes where it can.
    pub fn create_answer(
        &self,
        resource: &Resource,
        namespace: &str,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Answer, ApiError> {
        let (mut object, warnings) = self.client_object(resource, body, options)?;
        self.place(resource, namespace, &mut object)?;
        let generated = object
            .at("/metadata/name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty);
        let mut name = self.assign_name(resource, &mut object)?;
        if resource.namespaced {
            self.check_namespace_open(namespace)?;
        }
        let now = self.now();
        prepare_create(resource, &mut object, now);
        defaults::apply(resource, &mut object);
        if options.check_types {
            typed::check(resource, &object)?;
        }
        validate::object(resource, &object)?;
        let manager = manager_of(options);
        // The status of a kind with a status subresource is among upstream's reset fields:
        // the creator owns none of it (a pod's Pending is the server's, and the kubelet's
        // first status write then takes nothing from the creator's entry).
        let status = resource
            .has_status
            .then(|| object.as_object_mut()?.remove("status"))
            .flatten();
        let mut object = apply::track_update(
            None,
            object,
            &manager,
            resource.schema.as_ref(),
            &rfc3339(now),
            None,
        );
        if let Some(status) = status {
            object["status"] = status;
        }
        if options.dry_run {
            return Ok(self.answer(resource, object, None).with_warnings(warnings));
        }
        let mut attempts = 1;
        let mut prepared = Some(Prepared::new(object));
        let (stored, written) = loop {
            let key = Self::key(resource, namespace, &name);
            let result = self.store.transact_value(&key, |current| match current {
                Some(_) => Err(ApiError::already_exists(resource, &name)),
                None => prepared
                    .take()
                    .map(Write::PutPrepared)
                    .ok_or_else(|| ApiError::internal("create lost its object")),
            });
            match result {
                // A generated name that is taken gets another suffix, as upstream retries.
                Err(err)
                    if generated
                        && err.reason == "AlreadyExists"
                        && attempts < GENERATE_NAME_ATTEMPTS =>
                {
                    attempts += 1;
                    let mut object = prepared
                        .take()
                        .ok_or_else(|| ApiError::internal("create lost its object"))?
                        .into_object();
                    let prefix = object
                        .at("/metadata/generateName")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    name = format!("{prefix}{}", random_suffix());
                    object["metadata"]["name"] = json!(name);
                    prepared = Some(Prepared::new(object));
                }
                result => match result? {
                    (Some(stored), Some(written)) => break (stored, written),
                    _ => return Err(ApiError::internal("create stored nothing")),
                },
            }
        };
        self.after_write(resource, &stored);
        let mut answer = self.answer(resource, written, Some(&stored));
        if answer.bytes.is_some() && self.store.keeps_parsed(&resource.storage) {
            let key = Self::key(resource, namespace, &name);
            answer.keep = Some((self.store.clone(), key, stored.resource_version));
        }
        Ok(answer.with_warnings(warnings))
    }

    /// PUT: replaces an object (or its status, with `subresource` "status").
    pub fn update(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        self.update_answer(resource, namespace, name, subresource, body, options, None)
            .map(Answer::into_value)
    }

    /// [`update`](Self::update), answering with the stored bytes where it can, from a
    /// caller that may have `read` the object: while the store still holds it at that
    /// resourceVersion, the update starts from the caller's parse instead of parsing the
    /// stored bytes again.
    #[allow(clippy::too_many_arguments)]
    pub fn update_answer(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        body: Value,
        options: &WriteOptions,
        read: Option<Read>,
    ) -> Result<Answer, ApiError> {
        let (mut object, warnings) = self.client_object(resource, body, options)?;
        self.place(resource, namespace, &mut object)?;
        let body_name = object
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let manager = manager_of(options);
        self.write_existing(
            resource,
            namespace,
            name,
            options.dry_run,
            read,
            |current| {
                self.updated(
                    resource,
                    name,
                    current,
                    object.clone(),
                    (subresource, &manager),
                    options.check_types,
                )
            },
        )
        .map(|answer| answer.with_warnings(warnings))
    }

    /// Runs `change` on the current object and stores the result unless it is unchanged,
    /// finishing a deletion whose last finalizer the change removed. `change` runs outside
    /// the store's lock, on the object as read: the write commits only if the object is
    /// still at that resourceVersion, and otherwise `change` runs again on the newer
    /// object, as kube-apiserver's GuaranteedUpdate does. Writers to different objects
    /// thus never wait for each other's patching.
    pub(super) fn write_existing(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        dry_run: bool,
        mut read: Option<Read>,
        mut change: impl FnMut(&Value) -> Result<Value, ApiError>,
    ) -> Result<Answer, ApiError> {
        let key = Self::key(resource, namespace, name);
        loop {
            let current = self
                .store
                .get(&key)
                .ok_or_else(|| ApiError::not_found(resource, name))?;
            let current_value = match read.take() {
                Some(read) if read.resource_version == current.resource_version => read.object,
                _ => current.value(),
            };
            let next = change(&current_value)?;
            // Unchanged, managed fields included: no write, no new resourceVersion.
            if same_object(&next, &current_value) {
                return Ok(self.answer(resource, current_value, Some(&current)));
            }
            if dry_run {
                return Ok(self.answer(resource, next, None));
            }
            if deletion_complete(&next) {
                let committed = self.commit_if_unmoved(
                    resource,
                    &key,
                    name,
                    current.resource_version,
                    Write::Delete,
                )?;
                if committed.is_none() {
                    continue;
                }
                self.after_delete(resource, &next);
                return Ok(self.answer(resource, next, None));
            }
            let write = Write::PutPrepared(Prepared::new(next));
            let Some((stored, written)) =
                self.commit_if_unmoved(resource, &key, name, current.resource_version, write)?
            else {
                continue;
            };
            let stored = stored.ok_or_else(|| ApiError::not_found(resource, name))?;
            self.after_write(resource, &stored);
            let written = written.unwrap_or_else(|| stored.value());
            return Ok(self.answer(resource, written, Some(&stored)));
        }
    }

    /// Commits `write` if the object is still at `resource_version`: the object stored
    /// and written, or `None` when it has moved on (nothing written).
    pub(super) fn commit_if_unmoved(
        &self,
        resource: &Resource,
        key: &ObjectKey,
        name: &str,
        resource_version: u64,
        write: Write,
    ) -> Result<Option<Committed>, ApiError> {
        let mut write = Some(write);
        let mut moved = false;
        let committed = self
            .store
            .transact_value(key, |now| -> Result<Write, ApiError> {
                let now = now.ok_or_else(|| ApiError::not_found(resource, name))?;
                if now.resource_version != resource_version {
                    moved = true;
                    return Ok(Write::Keep);
                }
                Ok(write.take().unwrap_or(Write::Keep))
            })?;
        Ok((!moved).then_some(committed))
    }

    /// The next state of `current` after a non-apply write of `next` by `manager`
    /// (through `subresource`): the precondition checked, server-owned parts kept, the
    /// types checked when asked, managed fields recorded.
    pub(super) fn updated(
        &self,
        resource: &Resource,
        name: &str,
        current: &Value,
        next: Value,
        (subresource, manager): (Option<&str>, &str),
        check_types: bool,
    ) -> Result<Value, ApiError> {
        check_precondition(resource, name, current, &next)?;
        let next = self.normalize_update(resource, current, next, subresource, check_types)?;
        let now = rfc3339(self.now());
        Ok(apply::track_update(
            Some(current),
            next,
            manager,
            resource.schema.as_ref(),
            &now,
            subresource,
        ))
    }

    /// Turns a client's full object into the next stored state of `current`: the parts
    /// the server owns (identity, status or spec depending on the subresource) are kept,
    /// then defaults, the types (with `check_types`) and validation.
    pub(super) fn normalize_update(
        &self,
        resource: &Resource,
        current: &Value,
        mut next: Value,
        subresource: Option<&str>,
        check_types: bool,
    ) -> Result<Value, ApiError> {
        let name = current
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if subresource == Some("status") {
            if !same_besides_status(current, &next) {
                next = with_status_of(current, &next);
            }
        } else if resource.has_status {
            match current.get("status") {
                // Most writes carry the status as read; an equal one stays uncopied.
                Some(status) if next.get("status") == Some(status) => {}
                Some(status) => next["status"] = status.clone(),
                None => {
                    if let Some(map) = next.as_object_mut() {
                        map.remove("status");
                    }
                }
            }
        }
        // A client may name the UID it means (as capstan pins a Node's labels to the Node
        // it read): another object of the same name is refused, as upstream's
        // ValidateObjectMetaUpdate refuses a changed UID.
        let wanted_uid = next.at("/metadata/uid").and_then(Value::as_str);
        let uid = current.at("/metadata/uid").and_then(Value::as_str);
        if let Some(wanted) = wanted_uid.filter(|w| !w.is_empty() && Some(*w) != uid) {
            return Err(ApiError::invalid(
                &resource.kind,
                name,
                &[(
                    "metadata.uid".into(),
                    format!("Invalid value: \"{wanted}\": field is immutable"),
                )],
            ));
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
        ] {
            match current
                .get("metadata")
                .and_then(|metadata| metadata.get(field))
            {
                Some(v) => next["metadata"][field] = v.clone(),
                None => {
                    if let Some(meta) = next.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.remove(field);
                    }
                }
            }
        }
        next["metadata"]["name"] = current["metadata"]["name"].clone();
        if let Some(ns) = current.at("/metadata/namespace") {
            next["metadata"]["namespace"] = ns.clone();
        }
        next["apiVersion"] = current["apiVersion"].clone();
        next["kind"] = current["kind"].clone();
        if current.at("/metadata/deletionTimestamp").is_some() {
            let had: Vec<&Value> = finalizers(current).collect();
            if let Some(added) = finalizers(&next).find(|f| !had.contains(f)) {
                return Err(ApiError::invalid(
                    &resource.kind,
                    name,
                    &[(
                        "metadata.finalizers".into(),
                        format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [{}]",
                            added.as_str().unwrap_or("")
                        ),
                    )],
                ));
            }
        }
        defaults::apply(resource, &mut next);
        if check_types {
            typed::check(resource, &next)?;
        }
        validate::update(resource, current, &next, subresource)?;
        let generation = current.at("/metadata/generation").and_then(Value::as_i64);
        if let Some(generation) = generation {
            let bump = resource.tracks_generation() && !same_spec(current, &next);
            next["metadata"]["generation"] = json!(generation + i64::from(bump));
        }
        Ok(next)
    }

    /// A create or update body as the server goes on with it: checked against the
    /// endpoint, its unknown fields settled by `fieldValidation` (the warnings to answer
    /// with), in its stored form.
    fn client_object(
        &self,
        resource: &Resource,
        body: Value,
        options: &WriteOptions,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let mut object = self.checked_body(resource, body)?;
        let unknown = self.drop_unknown_fields(resource, &mut object, options.check_types);
        let warnings = options.field_validation.settle(unknown, |unknown| {
            field_validation::refused_body(resource, unknown)
        })?;
        Ok((self.intake(resource, object), warnings))
    }

    /// Drops from a client's `object` (in the served version) the fields its kind does
    /// not know, and returns their paths: for a custom resource those its schema does
    /// not describe, and the `null`s it does not allow; for a built-in kind those its
    /// type does not keep, when the write's types are checked (`check_types`).
    pub(super) fn drop_unknown_fields(
        &self,
        resource: &Resource,
        object: &mut Value,
        check_types: bool,
    ) -> Vec<String> {
        if let Some(custom) = &resource.custom {
            let unknown = structural_prune::prune(&custom.open_api_schema, object);
            structural::prune_nulls(&custom.open_api_schema, object);
            return unknown;
        }
        if !check_types {
            return Vec::new();
        }
        match typed::round_trip(resource, object) {
            Some(known) => field_validation::drop_unknown(object, &known),
            None => Vec::new(),
        }
    }

    /// Checks the body's kind and apiVersion against the endpoint.
    pub(super) fn checked_body(&self, resource: &Resource, body: Value) -> Result<Value, ApiError> {
        let Value::Object(_) = body else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON or YAML object",
            ));
        };
        let mut body = body;
        if let Some(kind) = body.get("kind").and_then(Value::as_str)
            && !kind.is_empty()
            && kind != resource.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({})",
                resource.kind
            )));
        }
        if let Some(api_version) = body.get("apiVersion").and_then(Value::as_str)
            && !api_version.is_empty()
            && api_version != resource.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({})",
                resource.api_version()
            )));
        }
        check_metadata(&body)?;
        body["kind"] = json!(resource.kind);
        body["apiVersion"] = json!(resource.api_version());
        if !body.get("metadata").is_some_and(Value::is_object) {
            body["metadata"] = json!({});
        }
        Ok(body)
    }

    /// Puts the object in the request's namespace (or none, for cluster-scoped kinds).
    pub(super) fn place(
        &self,
        resource: &Resource,
        namespace: &str,
        object: &mut Value,
    ) -> Result<(), ApiError> {
        let meta = &mut object["metadata"];
        if !resource.namespaced {
            if let Some(map) = meta.as_object_mut() {
                map.remove("namespace");
            }
            return Ok(());
        }
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != namespace => Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            )),
            _ => {
                meta["namespace"] = json!(namespace);
                Ok(())
            }
        }
    }

    fn assign_name(&self, resource: &Resource, object: &mut Value) -> Result<String, ApiError> {
        let meta = &mut object["metadata"];
        if let Some(name) = meta
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            return Ok(name.to_string());
        }
        match meta.get("generateName").and_then(Value::as_str) {
            Some(prefix) if !prefix.is_empty() => {
                let name = format!("{prefix}{}", random_suffix());
                meta["name"] = json!(name);
                Ok(name)
            }
            _ => Err(ApiError::invalid(
                &resource.kind,
                "",
                &[(
                    "metadata.name".into(),
                    "Required value: name or generateName is required".into(),
                )],
            )),
        }
    }

    pub(super) fn check_namespace_open(&self, namespace: &str) -> Result<(), ApiError> {
        let namespace_key = ObjectKey::new("namespaces", "", namespace);
        let ns = self
            .store
            .get(&namespace_key)
            .ok_or_else(|| ApiError::namespace_not_found(namespace))?;
        if ns.projection.at("/metadata/deletionTimestamp").is_some() {
            return Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {namespace} because it is being terminated"
            )));
        }
        Ok(())
    }
}

/// An object's `metadata`, when present, must be a JSON object (upstream cannot decode
/// anything else); the handlers write the server's fields into it.
pub(super) fn check_metadata(object: &Value) -> Result<(), ApiError> {
    match object.get("metadata") {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "metadata must be a JSON object, not {}",
            json_type(other)
        ))),
    }
}

/// The manager a write is recorded under: `fieldManager`, else upstream's default for
/// clients that name none.
pub(super) fn manager_of(options: &WriteOptions) -> String {
    options
        .field_manager
        .clone()
        .or_else(|| options.default_manager.clone())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Server-owned metadata of a new object.
pub(super) fn prepare_create(resource: &Resource, object: &mut Value, now: Timestamp) {
    let meta = &mut object["metadata"];
    if let Some(map) = meta.as_object_mut() {
        for field in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            map.remove(field);
        }
    }
    meta["uid"] = json!(uuid::Uuid::new_v4().to_string());
    meta["creationTimestamp"] = json!(rfc3339(now));
    if resource.tracks_generation() {
        meta["generation"] = json!(1);
    } else if let Some(map) = meta.as_object_mut() {
        map.remove("generation");
    }
    if resource.has_status {
        match resource.plural.as_str() {
            // The kubelet registers a node with its status; a namespace's status is set by defaulting.
            "nodes" | "namespaces" => {}
            "pods" => object["status"] = json!({"phase": "Pending"}),
            "customresourcedefinitions" => object["status"] = defaults::crd_status(object),
            _ => {
                if let Some(map) = object.as_object_mut() {
                    map.remove("status");
                }
            }
        }
    }
}

pub(super) fn check_precondition(
    resource: &Resource,
    name: &str,
    current: &Value,
    next: &Value,
) -> Result<(), ApiError> {
    let wanted = next.at("/metadata/resourceVersion").and_then(Value::as_str);
    let have = current
        .at("/metadata/resourceVersion")
        .and_then(Value::as_str);
    match wanted {
        Some(wanted) if !wanted.is_empty() && Some(wanted) != have => {
            Err(ApiError::stale(resource, name))
        }
        _ => Ok(()),
    }
}

/// What a write of `next` through the status subresource keeps: `current` with `next`'s
/// status (and managed fields, when it has them).
fn with_status_of(current: &Value, next: &Value) -> Value {
    let mut kept = current.clone();
    match next.get("status") {
        Some(status) => kept["status"] = status.clone(),
        None => {
            if let Some(map) = kept.as_object_mut() {
                map.remove("status");
            }
        }
    }
    if let Some(managed) = next.at("/metadata/managedFields") {
        kept["metadata"]["managedFields"] = managed.clone();
    }
    kept
}

/// Whether `next` is already what a write through the status subresource keeps of it:
/// `current` with `next`'s status. Then it needs no copy of `current`. Every field but
/// the status equal (objects keep their keys sorted, so the status has its place).
fn same_besides_status(current: &Value, next: &Value) -> bool {
    let (Some(current), Some(next)) = (current.as_object(), next.as_object()) else {
        return false;
    };
    // A status removed goes through the copy, which removes it as the copy does.
    if current.contains_key("status") && !next.contains_key("status") {
        return false;
    }
    fields_except(current, &["status"]).eq(fields_except(next, &["status"]))
}

/// Whether two objects are equal, their status compared first: a status write differs
/// there, and the object's other fields (metadata with its managed fields, the spec) are
/// then not compared at all.
fn same_object(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    a.len() == b.len()
        && a.get("status") == b.get("status")
        && a.iter()
            .filter(|(name, _)| *name != "status")
            .all(|(name, value)| b.get(name) == Some(value))
}

/// Whether two objects are equal in everything but metadata and status: what
/// `generation` counts changes of. Compared in place, as objects compare (whatever the
/// order of their fields).
fn same_spec(a: &Value, b: &Value) -> bool {
    const NOT_SPEC: &[&str] = &["metadata", "status"];
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    fields_except(a, NOT_SPEC).count() == fields_except(b, NOT_SPEC).count()
        && fields_except(a, NOT_SPEC).all(|(name, value)| b.get(name) == Some(value))
}

/// The fields of `object` but those named in `except`, in order.
fn fields_except<'a>(
    object: &'a Map<String, Value>,
    except: &'a [&str],
) -> impl Iterator<Item = (&'a String, &'a Value)> {
    object
        .iter()
        .filter(move |(name, _)| !except.contains(&name.as_str()))
}

fn random_suffix() -> String {
    use rand::Rng as _;
    // Upstream's alphabet: no vowels (no words), no confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_counts_changes_outside_metadata_and_status() {
        let object = json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                            "spec": {"x": 1}, "status": {"y": 1}});
        let cases = [
            ("equal", object.clone(), true),
            (
                "metadata and status changed",
                json!({"apiVersion": "v1", "kind": "K",
                "metadata": {"name": "a", "labels": {}}, "spec": {"x": 1}, "status": {"y": 2}}),
                true,
            ),
            (
                "fields in another order",
                json!({"spec": {"x": 1}, "kind": "K", "apiVersion": "v1",
                "metadata": {"name": "a"}}),
                true,
            ),
            (
                "spec changed",
                json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                "spec": {"x": 2}, "status": {"y": 1}}),
                false,
            ),
            (
                "a field added",
                json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                "spec": {"x": 1}, "data": {}, "status": {"y": 1}}),
                false,
            ),
            (
                "a field removed",
                json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                "status": {"y": 1}}),
                false,
            ),
        ];
        for (name, other, same) in cases {
            assert_eq!(same_spec(&object, &other), same, "{name}");
            assert_eq!(same_spec(&other, &object), same, "{name}, the other way");
        }
    }

    /// `same_object` is equality, whichever part differs and whatever the field order.
    #[test]
    fn same_object_is_equality() {
        let object = json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"},
                            "spec": {"x": 1}, "status": {"y": 1}});
        let mut others = vec![
            json!({"status": {"y": 1}, "spec": {"x": 1}, "metadata": {"name": "a"},
                   "kind": "K", "apiVersion": "v1"}),
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"}, "spec": {"x": 1}}),
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"}, "spec": {"x": 1},
                   "status": {"y": 2}}),
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "b"}, "spec": {"x": 1},
                   "status": {"y": 1}}),
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"}, "spec": {"x": 1},
                   "status": {"y": 1}, "data": {}}),
            json!({"apiVersion": "v1", "kind": "K", "metadata": {"name": "a"}, "data": {"x": 1},
                   "status": {"y": 1}}),
            json!("text"),
        ];
        others.push(object.clone());
        for other in others {
            assert_eq!(same_object(&object, &other), object == other, "{other}");
            assert_eq!(
                same_object(&other, &object),
                object == other,
                "{other}, the other way"
            );
        }
    }

    /// When `same_besides_status` holds, `next` is exactly what the copy would give,
    /// field order included; otherwise the copy is what is kept.
    #[test]
    fn a_status_write_needs_no_copy_only_when_nothing_else_differs() {
        let current = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "managedFields": [{"manager": "a"}]},
            "spec": {"x": 1}, "status": {"phase": "Pending"}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut next = current.clone();
            f(&mut next);
            next
        };
        let cases: Vec<(&str, Value, bool)> = vec![
            (
                "the status changed",
                with(&|n| n["status"]["phase"] = json!("Running")),
                true,
            ),
            ("nothing changed", current.clone(), true),
            (
                "the spec changed too",
                with(&|n| n["spec"]["x"] = json!(2)),
                false,
            ),
            (
                "a label added",
                with(&|n| n["metadata"]["labels"] = json!({"a": "b"})),
                false,
            ),
            (
                "managed fields changed",
                with(&|n| n["metadata"]["managedFields"] = json!([])),
                false,
            ),
            (
                "the status removed",
                with(&|n| {
                    n.as_object_mut().unwrap().remove("status");
                }),
                false,
            ),
            (
                "a field removed",
                with(&|n| {
                    n.as_object_mut().unwrap().remove("spec");
                }),
                false,
            ),
        ];
        for (name, next, same) in cases {
            assert_eq!(same_besides_status(&current, &next), same, "{name}");
            if same {
                let copied = with_status_of(&current, &next);
                assert_eq!(
                    copied.to_string(),
                    next.to_string(),
                    "{name}: the copy is next"
                );
            }
        }
        // Without a status, one added needs no copy.
        let mut bare = current.clone();
        bare.as_object_mut().unwrap().remove("status");
        let added = with(&|n| {
            let status = n.as_object_mut().unwrap().remove("status").unwrap();
            n["status"] = status;
        });
        assert!(same_besides_status(&bare, &added));
        assert_eq!(with_status_of(&bare, &added).to_string(), added.to_string());
    }

    #[test]
    fn generated_names_use_the_upstream_alphabet() {
        let suffix = random_suffix();
        assert_eq!(suffix.len(), 5);
        assert!(
            suffix
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
    }
}
