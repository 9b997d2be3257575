//! What the API server does with each verb, independent of HTTP: create, update, patch
//! (four types), delete with finalizers, grace and propagation, and list with selectors
//! and paging. The HTTP layer parses requests into these calls; in-process code may call
//! them directly.

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::defaults;
use super::errors::ApiError;
use super::events_v1;
use super::patch::error::{PatchError, json_type};
use super::patch::{apply, json as json_patch, merge, strategic};
use super::prune;
use super::resources::{CRD_STORAGE, Conversion, Registry, Resource};
use super::selector::{FieldSelector, LabelSelector};
use super::store::{ObjectKey, Prepared, Store, StoredObject, Write};
use super::typed;
use super::validate;
use capstan_api::clock::{Clock, rfc3339};
use crate::pointer::Pointer;

/// The body of a PATCH, by content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

/// Options every write verb takes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: run every step but the write.
    pub dry_run: bool,
    /// `fieldManager`, or the manager derived from the client's user agent.
    pub field_manager: Option<String>,
    /// `force` for server-side apply.
    pub force: bool,
    /// The manager recorded when the client names none (upstream: the user agent's program name).
    pub default_manager: Option<String>,
    /// `fieldValidation=Strict`: refuse fields the schema does not know instead of dropping them.
    pub strict_fields: bool,
    /// Check that a built-in kind's object decodes as its type, as kube-apiserver decodes
    /// every body (400 naming the field otherwise, see [`typed`]). The HTTP layer sets it
    /// for every client's write; the simulation's own writes, made from its types, skip
    /// the cost.
    pub check_types: bool,
}

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

/// What a delete did.
pub enum Deleted {
    /// The object is gone; this was its last state.
    Now(Answer),
    /// The object is marked for deletion (finalizers or grace period) and still exists.
    Pending(Answer),
}

/// An object as a caller read it from the store: its resourceVersion and its parse.
#[derive(Debug)]
pub struct Read {
    pub resource_version: u64,
    pub object: Value,
}

/// What a committed write stored, and the object as written (see [`Store::transact_value`]).
type Committed = (Option<StoredObject>, Option<Value>);

/// How [`Api::merge_status_read`] ended.
enum Merged {
    /// Written, or nothing to write.
    Done,
    /// The object changed since it was read (or the write needs the general path).
    Moved,
}

/// An object as a write answers it, in the resource's version.
#[derive(Clone, Debug)]
pub struct Answer {
    value: Option<Value>,
    /// The object serialized, when the store holds exactly these bytes: an HTTP answer
    /// sends them as they are instead of serializing the object again.
    bytes: Option<Bytes>,
    /// Where the parsed object goes when only its bytes are wanted: a store that keeps
    /// the bucket's objects parsed, and the object's place and resourceVersion there.
    keep: Option<(Arc<Store>, ObjectKey, u64)>,
}

impl Answer {
    fn parsed(value: Value, bytes: Option<Bytes>) -> Answer {
        Answer {
            value: Some(value),
            bytes,
            keep: None,
        }
    }

    fn stored(bytes: Bytes) -> Answer {
        Answer {
            value: None,
            bytes: Some(bytes),
            keep: None,
        }
    }

    /// The object, parsed (from its bytes, if it was not parsed yet).
    pub fn into_value(self) -> Value {
        match (self.value, self.bytes) {
            (Some(value), _) => value,
            (None, Some(bytes)) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            (None, None) => Value::Null,
        }
    }

    /// The object as JSON.
    pub fn into_bytes(self) -> Bytes {
        match (self.bytes, self.value) {
            (Some(bytes), Some(value)) => {
                // The bytes are the stored object, so the parse is the stored object's.
                if let Some((store, key, resource_version)) = self.keep {
                    store.offer_parsed(&key, resource_version, value);
                }
                bytes
            }
            (Some(bytes), None) => bytes,
            (None, Some(value)) => Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
            (None, None) => Bytes::from_static(b"null"),
        }
    }
}

/// Selection and paging of a list or watch.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub label_selector: Option<LabelSelector>,
    pub field_selector: Option<FieldSelector>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

impl ListOptions {
    /// Whether a selector filters the list.
    pub fn filters(&self) -> bool {
        self.label_selector.is_some() || self.field_selector.is_some()
    }

    /// Whether an object (by its projection) is selected.
    pub fn selects(&self, projection: &Value) -> bool {
        let labels = projection.at("/metadata/labels").and_then(Value::as_object);
        let empty = Map::new();
        self.label_selector
            .as_ref()
            .is_none_or(|s| s.matches(labels.unwrap_or(&empty)))
            && self
                .field_selector
                .as_ref()
                .is_none_or(|s| s.matches(projection))
    }
}

/// One page of a list, objects already in the served version.
pub struct ListPage {
    pub items: Vec<Bytes>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    /// How many objects follow the page; `None` when a selector filtered the list.
    pub remaining: Option<usize>,
}

/// The API server's semantics over the store.
pub struct Api {
    pub store: Arc<Store>,
    pub registry: Arc<Registry>,
    pub clock: Arc<dyn Clock>,
}

/// How many suffixes a create with `generateName` tries before reporting the conflict.
const GENERATE_NAME_ATTEMPTS: u32 = 8;

const DEFAULT_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

impl Api {
    pub fn new(store: Arc<Store>, registry: Arc<Registry>, clock: Arc<dyn Clock>) -> Self {
        let api = Api {
            store,
            registry,
            clock,
        };
        api.restore_crds();
        api
    }

    /// Creates the namespaces every cluster has, if missing.
    pub fn ensure_default_namespaces(&self) -> Result<(), ApiError> {
        let Some(namespaces) = self.registry.get("", "v1", "namespaces") else {
            return Ok(());
        };
        for name in DEFAULT_NAMESPACES {
            let key = ObjectKey::new("namespaces", "", name);
            if self.store.get(&key).is_none() {
                let namespace =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
                self.create(&namespaces, "", namespace, &WriteOptions::default())?;
            }
        }
        Ok(())
    }

    /// Serves again the CRDs found in a restored store.
    fn restore_crds(&self) {
        let page = self.store.list(CRD_STORAGE, None, None, None, None);
        for crd in page.items {
            self.registry.register_crd(&crd.value());
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn key(resource: &Resource, namespace: &str, name: &str) -> ObjectKey {
        let namespace = if resource.namespaced { namespace } else { "" };
        ObjectKey::new(&resource.storage, namespace, name)
    }

    /// The stored object as `resource`'s version shows it.
    pub fn present(&self, resource: &Resource, stored: &StoredObject) -> Bytes {
        let same_version = stored.projection.get("apiVersion").and_then(Value::as_str)
            == Some(resource.api_version().as_str());
        if resource.conversion == Conversion::None && same_version {
            return stored.bytes.clone();
        }
        let object = self.present_value(resource, stored.value());
        Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
    }

    fn present_value(&self, resource: &Resource, object: Value) -> Value {
        match resource.conversion {
            Conversion::EventsV1 => events_v1::from_core(object),
            Conversion::None => {
                let mut object = object;
                object["apiVersion"] = json!(resource.api_version());
                object
            }
        }
    }

    /// `object` as `resource`'s version shows it, with the bytes `stored` holds when they
    /// are exactly that (no conversion, the same apiVersion).
    fn answer(&self, resource: &Resource, object: Value, stored: Option<&StoredObject>) -> Answer {
        let bytes = stored
            .filter(|stored| {
                resource.conversion == Conversion::None
                    && stored.projection.get("apiVersion").and_then(Value::as_str)
                        == Some(resource.api_version().as_str())
            })
            .map(|stored| stored.bytes.clone());
        Answer::parsed(self.present_value(resource, object), bytes)
    }

    /// Converts an object in `resource`'s served version to its stored form.
    fn intake(&self, resource: &Resource, object: Value) -> Value {
        match resource.conversion {
            Conversion::EventsV1 => events_v1::to_core(object),
            Conversion::None => object,
        }
    }

    /// GET of one object.
    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Result<Bytes, ApiError> {
        let stored = self
            .store
            .get(&Self::key(resource, namespace, name))
            .ok_or_else(|| ApiError::not_found(resource, name))?;
        Ok(self.present(resource, &stored))
    }

    /// GET of one object, parsed.
    pub fn get_value(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let bytes = self.get(resource, namespace, name)?;
        serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(e.to_string()))
    }

    /// LIST of one namespace (or all, with `None`).
    pub fn list(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let after = options
            .continue_token
            .as_deref()
            .map(decode_continue)
            .transpose()?;
        let namespace = namespace.filter(|_| resource.namespaced);
        let selects = |o: &StoredObject| options.selects(&o.projection);
        let page = self.store.list(
            &resource.storage,
            namespace,
            after.as_ref(),
            options.limit.filter(|l| *l > 0),
            options
                .filters()
                .then_some(&selects as &dyn Fn(&StoredObject) -> bool),
        );
        Ok(ListPage {
            items: page
                .items
                .iter()
                .map(|o| self.present(resource, o))
                .collect(),
            resource_version: page.resource_version,
            continue_token: page
                .next
                .map(|position| encode_continue(page.resource_version, &position)),
            remaining: page.remaining,
        })
    }

    /// LIST, parsed (for in-process callers).
    pub fn list_values(
        &self,
        resource: &Resource,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<Vec<Value>, ApiError> {
        self.list(resource, namespace, options)?
            .items
            .iter()
            .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(e.to_string())))
            .collect()
    }

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
        let mut object = self.intake(resource, self.checked_body(resource, body)?);
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
        self.prune_unknown(resource, &name, &mut object, options.strict_fields)?;
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
            return Ok(self.answer(resource, object, None));
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
        Ok(answer)
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
        let mut object = self.intake(resource, self.checked_body(resource, body)?);
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
        self.prune_unknown(resource, name, &mut object, options.strict_fields)?;
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
    }

    /// PATCH of any type. Server-side apply creates the object when it does not exist.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        patch_type: PatchType,
        patch: Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        self.patch_answer(
            resource,
            namespace,
            name,
            subresource,
            patch_type,
            patch,
            options,
        )
        .map(Answer::into_value)
    }

    /// A merge patch of `subresource` (or the object), from a caller that may have `read`
    /// the object: while the store still holds it at that resourceVersion, the patch starts
    /// from the caller's parse instead of parsing the stored bytes again. The answer is not
    /// built.
    #[allow(clippy::too_many_arguments)]
    pub fn merge_patch_read(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        patch: &Value,
        options: &WriteOptions,
        read: Option<Read>,
    ) -> Result<(), ApiError> {
        let manager = manager_of(options);
        let status_alone = subresource == Some("status")
            && !options.dry_run
            && patch
                .as_object()
                .is_some_and(|p| p.len() == 1 && p.contains_key("status"));
        let read = match read {
            Some(read) if status_alone => {
                match self.merge_status_read(resource, namespace, name, patch, &manager, read)? {
                    Merged::Done => return Ok(()),
                    Merged::Moved => None,
                }
            }
            read => read,
        };
        self.patch_existing(
            resource,
            (namespace, name, subresource),
            PatchType::Merge,
            patch,
            options,
            &manager,
            read,
        )
        .map(|_| ())
    }

    /// [`merge_patch_read`](Self::merge_patch_read) of a `{"status": ...}` patch through
    /// the status subresource, from the object as read: the simulated kubelet's writes.
    /// The subresource keeps everything of the object but its status, so only the
    /// status is merged and compared, and the object is neither copied nor checked again
    /// (its spec and metadata passed validation when they were stored, and defaults touch
    /// the spec alone). Only for a built-in kind served as stored, and an object not being
    /// deleted; `Moved` hands anything else to the general path, as when the object
    /// changed since it was read.
    fn merge_status_read(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        patch: &Value,
        manager: &str,
        read: Read,
    ) -> Result<Merged, ApiError> {
        let key = Self::key(resource, namespace, name);
        let Read {
            resource_version,
            mut object,
        } = read;
        let plain = resource.custom.is_none()
            && resource.has_status
            && resource.conversion == Conversion::None
            && object.get("apiVersion").and_then(Value::as_str)
                == Some(resource.api_version().as_str())
            && object.at("/metadata/deletionTimestamp").is_none();
        if !plain {
            return Ok(Merged::Moved);
        }
        let Some(fields) = object.as_object_mut() else {
            return Ok(Merged::Moved);
        };
        let old_status = fields.remove("status");
        let mut merged = Value::Object(Map::new());
        if let Some(status) = &old_status {
            merged["status"] = status.clone();
        }
        merge::merge_patch(&mut merged, patch);
        let new_status = merged.as_object_mut().and_then(|m| m.remove("status"));
        // Unchanged: no write, no new resourceVersion.
        if new_status == old_status {
            return Ok(Merged::Done);
        }
        if let Some(status) = new_status {
            fields.insert("status".into(), status);
        }
        let now = rfc3339(self.now());
        let next = apply::track_status_update(
            old_status.as_ref(),
            object,
            manager,
            resource.schema.as_ref(),
            &now,
        );
        let write = Write::PutPrepared(Prepared::new(next));
        let Some((stored, _)) =
            self.commit_if_unmoved(resource, &key, name, resource_version, write)?
        else {
            return Ok(Merged::Moved);
        };
        if let Some(stored) = stored {
            self.after_write(resource, &stored);
        }
        Ok(Merged::Done)
    }

    /// [`patch`](Self::patch), answering with the stored bytes where it can.
    #[allow(clippy::too_many_arguments)]
    pub fn patch_answer(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        patch_type: PatchType,
        patch: Value,
        options: &WriteOptions,
    ) -> Result<Answer, ApiError> {
        if patch_type == PatchType::Strategic && resource.custom.is_some() {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml \
                 (strategic merge patch is not supported for {})",
                resource.group_resource()
            )));
        }
        let manager = manager_of(options);
        if patch_type == PatchType::Apply {
            if options.field_manager.is_none() {
                return Err(ApiError::bad_request(
                    "PATCH requests with apply patch type require field manager",
                ));
            }
            let mut applied = self.intake(resource, self.checked_body(resource, patch)?);
            self.prune_unknown(resource, name, &mut applied, options.strict_fields)?;
            // As upstream builds its typed patch object first: a field of the wrong type
            // is a 400 before any conflict. (The result is checked again when validated.)
            if options.check_types {
                typed::check(resource, &applied)?;
            }
            let applied_name = applied.at("/metadata/name").and_then(Value::as_str);
            if applied_name != Some(name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    applied_name.unwrap_or("")
                )));
            }
            let key = Self::key(resource, namespace, name);
            if self.store.get(&key).is_none() {
                return self.apply_create(resource, namespace, name, applied, options, &manager);
            }
            let applied = reset_fields(resource, applied, subresource);
            return self.write_existing(
                resource,
                namespace,
                name,
                options.dry_run,
                None,
                |current| {
                    check_precondition(resource, name, current, &applied)?;
                    let now = rfc3339(self.now());
                    let merged = apply::apply(
                        Some(current),
                        &applied,
                        &manager,
                        options.force,
                        resource.schema.as_ref(),
                        &now,
                        subresource,
                    )
                    .map_err(|e| apply_error(resource, name, e))?;
                    self.normalize_update(
                        resource,
                        current,
                        merged,
                        subresource,
                        options.check_types,
                    )
                },
            );
        }
        self.patch_existing(
            resource,
            (namespace, name, subresource),
            patch_type,
            &patch,
            options,
            &manager,
            None,
        )
    }

    /// A JSON, merge or strategic merge patch of an existing object.
    #[allow(clippy::too_many_arguments)]
    fn patch_existing(
        &self,
        resource: &Resource,
        (namespace, name, subresource): (&str, &str, Option<&str>),
        patch_type: PatchType,
        patch: &Value,
        options: &WriteOptions,
        manager: &str,
        read: Option<Read>,
    ) -> Result<Answer, ApiError> {
        self.write_existing(
            resource,
            namespace,
            name,
            options.dry_run,
            read,
            |current| {
                let served = self.present_value(resource, current.clone());
                let patched = match patch_type {
                    PatchType::Merge => {
                        let mut target = served;
                        merge::merge_patch(&mut target, patch);
                        target
                    }
                    PatchType::Json => json_patch::json_patch(&served, patch)
                        .map_err(|e| patch_error(resource, name, e))?,
                    PatchType::Strategic => {
                        strategic::strategic_merge_patch(&served, patch, resource.schema.as_ref())
                            .map_err(|e| patch_error(resource, name, e))?
                    }
                    PatchType::Apply => unreachable_patch()?,
                };
                let patched = patched_object(patch_type, patched)?;
                let mut patched = self.intake(resource, patched);
                self.prune_unknown(resource, name, &mut patched, options.strict_fields)?;
                self.updated(
                    resource,
                    name,
                    current,
                    patched,
                    (subresource, manager),
                    options.check_types,
                )
            },
        )
    }

    fn apply_create(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        applied: Value,
        options: &WriteOptions,
        manager: &str,
    ) -> Result<Answer, ApiError> {
        let mut object = applied;
        self.place(resource, namespace, &mut object)?;
        if resource.namespaced {
            self.check_namespace_open(namespace)?;
        }
        let now = self.now();
        let mut object = apply::apply(
            None,
            &object,
            manager,
            options.force,
            resource.schema.as_ref(),
            &rfc3339(now),
            None,
        )
        .map_err(|e| apply_error(resource, name, e))?;
        prepare_create(resource, &mut object, now);
        defaults::apply(resource, &mut object);
        if options.check_types {
            typed::check(resource, &object)?;
        }
        validate::object(resource, &object)?;
        if options.dry_run {
            return Ok(self.answer(resource, object, None));
        }
        let key = Self::key(resource, namespace, name);
        let (stored, written) = self.store.transact_value(&key, |current| match current {
            // Lost a race with another creator: let the client retry as an update.
            Some(_) => Err(ApiError::conflict(
                resource,
                name,
                "the object was created concurrently; retry",
            )),
            None => Ok(Write::Put(object)),
        })?;
        let stored = stored.ok_or_else(|| ApiError::internal("apply stored nothing"))?;
        self.after_write(resource, &stored);
        let written = written.unwrap_or_else(|| stored.value());
        Ok(self.answer(resource, written, Some(&stored)))
    }

    /// Runs `change` on the current object and stores the result unless it is unchanged,
    /// finishing a deletion whose last finalizer the change removed. `change` runs outside
    /// the store's lock, on the object as read: the write commits only if the object is
    /// still at that resourceVersion, and otherwise `change` runs again on the newer
    /// object, as kube-apiserver's GuaranteedUpdate does. Writers to different objects
    /// thus never wait for each other's patching.
    fn write_existing(
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
    fn commit_if_unmoved(
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
    fn updated(
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
    fn normalize_update(
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
        validate::update(resource, current, &next)?;
        let generation = current.at("/metadata/generation").and_then(Value::as_i64);
        if let Some(generation) = generation {
            let bump = resource.tracks_generation() && !same_spec(current, &next);
            next["metadata"]["generation"] = json!(generation + i64::from(bump));
        }
        Ok(next)
    }

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

    /// Serves a CRD's kinds once it is stored.
    fn after_write(&self, resource: &Resource, stored: &StoredObject) {
        if resource.storage == CRD_STORAGE {
            self.registry.register_crd(&stored.value());
        }
    }

    fn after_delete(&self, resource: &Resource, object: &Value) {
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

    /// Drops the fields a custom resource's schema does not describe; with strict field
    /// validation, refuses them instead (400, as upstream's strict decoding error).
    fn prune_unknown(
        &self,
        resource: &Resource,
        name: &str,
        object: &mut Value,
        strict: bool,
    ) -> Result<(), ApiError> {
        let Some(custom) = &resource.custom else {
            return Ok(());
        };
        let unknown = prune::prune(&custom.open_api_schema, object);
        if strict && !unknown.is_empty() {
            let fields: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
            return Err(ApiError::bad_request(format!(
                "{} in {} {name}: strict decoding error: {}",
                resource.kind,
                resource.api_version(),
                fields.join(", ")
            )));
        }
        Ok(())
    }

    /// Checks the body's kind and apiVersion against the endpoint.
    fn checked_body(&self, resource: &Resource, body: Value) -> Result<Value, ApiError> {
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
    fn place(
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

    fn check_namespace_open(&self, namespace: &str) -> Result<(), ApiError> {
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

/// The part of an apply configuration a subresource accepts: status only through
/// `/status`, everything but status through the main resource (when the kind has one).
fn reset_fields(resource: &Resource, mut applied: Value, subresource: Option<&str>) -> Value {
    let Some(map) = applied.as_object_mut() else {
        return applied;
    };
    match subresource {
        Some("status") => {
            map.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status"))
        }
        _ if resource.has_status => {
            map.remove("status");
        }
        _ => {}
    }
    applied
}

fn unreachable_patch() -> Result<Value, ApiError> {
    Err(ApiError::internal(
        "apply patches are handled before this point",
    ))
}

/// A patch that could not be applied, answered as upstream answers it: a body that is
/// not a patch of its type is 400, a patch that does not fit the object 422.
fn patch_error(resource: &Resource, name: &str, err: PatchError) -> ApiError {
    match err {
        PatchError::Malformed { .. } => ApiError::bad_request(err.to_string()),
        PatchError::Invalid { .. } | PatchError::Rejected { .. } => {
            ApiError::invalid(&resource.kind, name, &[("patch".into(), err.to_string())])
        }
    }
}

/// What a patch left, if it is still an object whose metadata is an object: a merge
/// patch that is not an object (`null`, a list, a scalar) replaces the whole object
/// (RFC 7386), and a JSON patch may replace the root or the metadata. kube-apiserver
/// cannot decode such a result as the kind, and answers 400; so does this server,
/// before anything of the result is read or stored.
fn patched_object(patch_type: PatchType, patched: Value) -> Result<Value, ApiError> {
    if !patched.is_object() {
        let why = match patch_type {
            PatchType::Merge => {
                "a JSON merge patch that is not a JSON object replaces the whole object (RFC 7386)"
            }
            _ => "the patch replaced the whole object",
        };
        return Err(ApiError::bad_request(format!(
            "the patched object must be a JSON object, not {}: {why}",
            json_type(&patched)
        )));
    }
    check_metadata(&patched)?;
    Ok(patched)
}

/// An object's `metadata`, when present, must be a JSON object (upstream cannot decode
/// anything else); the handlers write the server's fields into it.
fn check_metadata(object: &Value) -> Result<(), ApiError> {
    match object.get("metadata") {
        None | Some(Value::Null | Value::Object(_)) => Ok(()),
        Some(other) => Err(ApiError::bad_request(format!(
            "metadata must be a JSON object, not {}",
            json_type(other)
        ))),
    }
}

fn apply_error(resource: &Resource, name: &str, err: apply::ApplyError) -> ApiError {
    match &err {
        apply::ApplyError::Conflicts(conflicts) => {
            let causes = conflicts
                .iter()
                .map(|c| json!({"reason": "FieldManagerConflict", "message": c.to_string(), "field": c.field}))
                .collect();
            ApiError::apply_conflict(resource, name, err.to_string(), causes)
        }
        apply::ApplyError::Invalid(reason) => {
            ApiError::invalid(&resource.kind, name, &[("patch".into(), reason.clone())])
        }
    }
}

/// The manager a write is recorded under: `fieldManager`, else upstream's default for
/// clients that name none.
fn manager_of(options: &WriteOptions) -> String {
    options
        .field_manager
        .clone()
        .or_else(|| options.default_manager.clone())
        .unwrap_or_else(|| "unknown".to_string())
}

/// Server-owned metadata of a new object.
fn prepare_create(resource: &Resource, object: &mut Value, now: Timestamp) {
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

fn check_precondition(
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

fn finalizers(object: &Value) -> impl Iterator<Item = &Value> {
    object
        .at("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// An object marked for deletion whose finalizers are all gone, and whose grace period
/// (pods) is not pending, is removed by the write that removed the last finalizer.
fn deletion_complete(object: &Value) -> bool {
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

fn encode_continue(resource_version: u64, position: &(String, String)) -> String {
    let token = json!({"rv": resource_version, "ns": position.0, "name": position.1});
    base64::engine::general_purpose::STANDARD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(String, String), ApiError> {
    let invalid = || {
        ApiError::bad_request("continue key is not valid: the token was not issued by this server")
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| invalid())?;
    let token: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let field = |f: &str| token.get(f).and_then(Value::as_str).map(str::to_string);
    Ok((
        field("ns").ok_or_else(invalid)?,
        field("name").ok_or_else(invalid)?,
    ))
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

    /// An API over an in-memory store keeping `history` changes, with the built-in kinds
    /// and the default namespaces, at a fixed time.
    fn started_api(history: usize) -> Api {
        use capstan_api::clock::ManualClock;
        let clock = ManualClock::new("2026-01-01T00:00:00Z".parse().expect("time"));
        let api = Api::new(
            Arc::new(Store::in_memory(history)),
            Arc::new(Registry::with_builtins()),
            Arc::new(clock),
        );
        api.ensure_default_namespaces().expect("namespaces");
        api
    }

    /// A status write from the object as read (the status alone merged and compared)
    /// stores exactly what the general path stores from the same write, managed fields
    /// included: a first status, a change, a field dropped with a null, an unchanged
    /// write (no new resourceVersion), and a write from a stale read (the general path,
    /// which keeps the newer object's other changes).
    #[test]
    fn a_status_write_from_a_read_stores_what_the_general_path_stores() {
        let api = started_api(100);
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let creator = WriteOptions {
            field_manager: Some("creator".into()),
            ..WriteOptions::default()
        };
        let kubelet = WriteOptions {
            field_manager: Some("kubelet".into()),
            ..WriteOptions::default()
        };
        for name in ["fast", "general"] {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"a": "b"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}});
            api.create(&pods, "default", pod, &creator).expect("create");
        }
        let stored = |name: &str| {
            let object = api.get_value(&pods, "default", name).expect("get");
            let version = api
                .store
                .get(&Api::key(&pods, "default", name))
                .expect("stored")
                .resource_version;
            (version, object)
        };
        // The two pods' objects, their own identity aside.
        let comparable = |mut object: Value| {
            for field in ["name", "uid", "resourceVersion"] {
                object["metadata"].as_object_mut().unwrap().remove(field);
            }
            object
        };
        let write = |name: &str, status: Value, fast: bool| {
            let read = fast.then(|| {
                let (resource_version, object) = stored(name);
                Read {
                    resource_version,
                    object,
                }
            });
            api.merge_patch_read(
                &pods,
                "default",
                name,
                Some("status"),
                &json!({"status": status}),
                &kubelet,
                read,
            )
            .expect("status write");
        };
        let statuses = [
            json!({"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]}),
            json!({"phase": "Succeeded",
                   "conditions": [{"type": "Ready", "status": "False"}]}),
            json!({"podIP": null, "message": "done"}),
            json!({"message": "done"}),
        ];
        for status in statuses {
            let before = stored("fast").0;
            write("fast", status.clone(), true);
            write("general", status.clone(), false);
            let (after, fast) = stored("fast");
            let (_, general) = stored("general");
            assert_eq!(
                comparable(fast.clone()).to_string(),
                comparable(general).to_string(),
                "{status}"
            );
            let unchanged = status == json!({"message": "done"});
            assert_eq!(after == before, unchanged, "{status}: {fast}");
        }
        // A read the object moved on from: the write lands on the newer object.
        let (resource_version, object) = stored("fast");
        api.patch(
            &pods,
            "default",
            "fast",
            None,
            PatchType::Merge,
            json!({"metadata": {"labels": {"c": "d"}}}),
            &creator,
        )
        .expect("label");
        api.merge_patch_read(
            &pods,
            "default",
            "fast",
            Some("status"),
            &json!({"status": {"message": "later"}}),
            &kubelet,
            Some(Read {
                resource_version,
                object,
            }),
        )
        .expect("status write from a stale read");
        let (_, fast) = stored("fast");
        assert_eq!(fast["metadata"]["labels"], json!({"a": "b", "c": "d"}));
        assert_eq!(fast["status"]["message"], json!("later"));
    }

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

    /// No write a client can send panics the server: every patch type and updates, with
    /// values of every JSON type wherever the engines look (the body itself, metadata,
    /// lists with merge keys, directives), on a built-in kind and a custom resource that
    /// keeps whatever it is sent, through the object and its status. Each ends in an
    /// answer or a 4xx error.
    #[test]
    fn no_write_body_panics_the_server() {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let api = started_api(100_000);
        let crds = api
            .registry
            .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .expect("crds");
        let crd = json!({"metadata": {"name": "widgets.example.dev"}, "spec": {
            "group": "example.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {
                              "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
        api.create(&crds, "", crd, &WriteOptions::default())
            .expect("crd");
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let maps = api.registry.get("", "v1", "configmaps").expect("maps");
        let widgets = api
            .registry
            .get("example.dev", "v1", "widgets")
            .expect("widgets");
        let objects = [
            (
                &pods,
                json!({"metadata": {"name": "p"},
                           "spec": {"containers": [{"name": "app", "image": "i",
                                                    "env": [{"name": "A", "value": "1"}]}]}}),
            ),
            (
                &maps,
                json!({"metadata": {"name": "p", "labels": {"a": "b"}}, "data": {"a": "1"}}),
            ),
            (
                &widgets,
                json!({"metadata": {"name": "p", "finalizers": ["f"]},
                              "spec": {"containers": [{"name": "app"}]}}),
            ),
        ];
        let values = [
            json!(null),
            json!(true),
            json!(3),
            json!(-1.5),
            json!("x"),
            json!([]),
            json!([1]),
            json!(["x", "x"]),
            json!([null]),
            json!([{}]),
            json!([[]]),
            json!({}),
            json!({"a": null}),
            json!({"name": 5}),
            json!({"$patch": "delete"}),
            json!({"$patch": 5}),
            json!([{"$patch": "replace"}]),
            json!({"f:spec": {}}),
            json!([{"manager": 5, "fieldsV1": []}]),
            json!([{"manager": "m", "operation": "Apply", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"k:{\"name\":5}": {}}}}]),
        ];
        // A patch of each shape, `value` in place of the body or of one field.
        let shapes: Vec<fn(&Value) -> Value> = vec![
            |v| v.clone(),
            |v| json!({"metadata": v}),
            |v| json!({"metadata": {"labels": v}}),
            |v| json!({"metadata": {"annotations": {"a": v}}}),
            |v| json!({"metadata": {"managedFields": v}}),
            |v| json!({"metadata": {"finalizers": v}}),
            |v| json!({"metadata": {"ownerReferences": v}}),
            |v| json!({"metadata": {"name": v, "resourceVersion": v, "generation": v}}),
            |v| json!({"metadata": {"$deleteFromPrimitiveList/finalizers": v}}),
            |v| json!({"metadata": {"$setElementOrder/finalizers": v}}),
            |v| json!({"apiVersion": v, "kind": v}),
            |v| json!({"spec": v}),
            |v| json!({"spec": {"containers": v}}),
            |v| json!({"spec": {"containers": [v]}}),
            |v| json!({"spec": {"containers": [{"name": v}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "env": v}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "env": [v]}]}}),
            |v| json!({"spec": {"$setElementOrder/containers": v, "containers": [{"name": "app"}]}}),
            |v| json!({"spec": {"containers": [{"name": "app", "$patch": v}]}}),
            |v| json!({"spec": {"$retainKeys": v, "containers": []}}),
            |v| json!({"spec": {"tolerations": v, "volumes": v}}),
            |v| json!({"status": v}),
            |v| json!({"status": {"conditions": v}}),
            |v| json!({"status": {"conditions": [v]}}),
            |v| json!({"data": v}),
            |v| json!({"$patch": v}),
        ];
        let json_patches: Vec<fn(&Value) -> Value> = vec![
            |v| v.clone(),
            |v| json!([v]),
            |v| json!([{"op": "replace", "path": "", "value": v}]),
            |v| json!([{"op": "add", "path": "/metadata/labels", "value": v}]),
            |v| json!([{"op": "replace", "path": "/metadata", "value": v}]),
            |v| json!([{"op": "add", "path": "/spec/containers/0", "value": v}]),
            |v| json!([{"op": "add", "path": "/status", "value": v}]),
            |v| json!([{"op": v, "path": "/spec"}]),
        ];
        let manager = WriteOptions {
            field_manager: Some("fuzz".into()),
            check_types: true,
            ..WriteOptions::default()
        };
        let mut panics = Vec::new();
        let mut run = |what: String, write: &dyn Fn() -> Result<Value, ApiError>| match catch_unwind(
            AssertUnwindSafe(write),
        ) {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => assert!(err.code < 500, "{what}: {err:?}"),
            Err(_) => panics.push(what),
        };
        for (resource, object) in &objects {
            let kind = &resource.kind;
            let fresh = || {
                let _ = api.delete(
                    resource,
                    "default",
                    "p",
                    &DeleteOptions {
                        grace_period_seconds: Some(0),
                        ..DeleteOptions::default()
                    },
                );
                let _ = api.patch(
                    resource,
                    "default",
                    "p",
                    None,
                    PatchType::Merge,
                    json!({"metadata": {"finalizers": null}}),
                    &manager,
                );
                let _ = api.delete(resource, "default", "p", &DeleteOptions::default());
                api.create(resource, "default", object.clone(), &manager)
                    .expect("create");
            };
            fresh();
            for sub in [None, Some("status").filter(|_| resource.has_status)] {
                for value in &values {
                    for shape in &shapes {
                        let body = shape(value);
                        for patch_type in [PatchType::Merge, PatchType::Strategic] {
                            run(format!("{patch_type:?} {body} to {kind} {sub:?}"), &|| {
                                api.patch(
                                    resource,
                                    "default",
                                    "p",
                                    sub,
                                    patch_type,
                                    body.clone(),
                                    &manager,
                                )
                            });
                        }
                        let mut applied = json!({"apiVersion": resource.api_version(), "kind": kind,
                                                 "metadata": {"name": "p"}});
                        merge::merge_patch(&mut applied, &body);
                        run(format!("apply {applied} to {kind} {sub:?}"), &|| {
                            api.patch(
                                resource,
                                "default",
                                "p",
                                sub,
                                PatchType::Apply,
                                applied.clone(),
                                &manager,
                            )
                        });
                        run(format!("update {applied} to {kind} {sub:?}"), &|| {
                            api.update(resource, "default", "p", sub, applied.clone(), &manager)
                        });
                        if api.get(resource, "default", "p").is_err() {
                            fresh();
                        }
                    }
                    for shape in &json_patches {
                        let body = shape(value);
                        run(format!("JSON patch {body} to {kind} {sub:?}"), &|| {
                            api.patch(
                                resource,
                                "default",
                                "p",
                                sub,
                                PatchType::Json,
                                body.clone(),
                                &manager,
                            )
                        });
                    }
                }
            }
        }
        assert!(
            panics.is_empty(),
            "{} writes panicked: {panics:#?}",
            panics.len()
        );
    }

    #[test]
    fn continue_tokens_round_trip_and_reject_garbage() {
        let position = ("default".to_string(), "pod-7".to_string());
        let token = encode_continue(42, &position);
        assert_eq!(decode_continue(&token).expect("decode"), position);
        assert_eq!(decode_continue("%%%").map_err(|e| e.code), Err(400));
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
