//! Patches of the four types, server-side apply among them: the patch applied to the
//! object as its version shows it, through the object or its status, and status
//! writes merged into what was read without a second parse.

use serde_json::{Map, Value, json};

use super::write::{check_metadata, check_precondition, manager_of, prepare_create};
use super::{Answer, Api, PatchType, Read, WriteOptions};
use crate::defaults;
use crate::errors::ApiError;
use crate::field_validation::{self, FieldValidation};
use crate::patch::error::{PatchError, json_type};
use crate::patch::{apply, json as json_patch, merge, strategic};
use crate::pointer::Pointer;
use crate::resources::{Conversion, Resource};
use crate::store::{Prepared, Write};
use crate::typed;
use crate::validate;
use capstan_api::clock::rfc3339;

/// How [`Api::merge_status_read`] ended.
enum Merged {
    /// Written, or nothing to write.
    Done,
    /// The object changed since it was read (or the write needs the general path).
    Moved,
}

impl Api {
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
            let mut applied = self.checked_body(resource, patch)?;
            // An unknown field is refused whatever the directive: upstream cannot type
            // the configuration.
            let unknown = self.drop_unknown_fields(resource, &mut applied, options.check_types);
            if !unknown.is_empty() {
                return Err(field_validation::refused_apply(
                    resource, namespace, name, &unknown,
                ));
            }
            let applied = self.intake(resource, applied);
            // As upstream builds its typed patch object first: a field of the wrong type
            // is a 400 before any conflict. (The result is checked again when validated.)
            if options.check_types {
                typed::check(resource, &applied)?;
            }
            let key = Self::key(resource, namespace, name);
            let exists = self.store.get(&key).is_some();
            let applied_name = applied
                .at("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_string);
            // Upstream merges the configuration into the live object and then checks the
            // name: a configuration without one takes the live object's. A new object
            // has no name to take.
            if applied_name.as_deref().is_some_and(|n| n != name)
                || (applied_name.is_none() && !exists)
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    applied_name.unwrap_or_default()
                )));
            }
            let mut applied = applied;
            if applied_name.is_none() {
                set_name(&mut applied, name);
            }
            if !exists {
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
        // RFC 7386 makes a merge patch that is not an object replace the whole object;
        // upstream's merge refuses a scalar or null as no patch at all.
        if patch_type == PatchType::Merge && !(patch.is_object() || patch.is_array()) {
            return Err(ApiError::bad_request("Invalid JSON Patch"));
        }
        let mut warnings = Vec::new();
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
                let mut patched = patched_object(patch_type, patched)?;
                // What a strict refusal shows: the patched object, before anything is
                // dropped from it, or the strategic merge patch itself.
                let strict = options.field_validation == FieldValidation::Strict;
                let shown = match (strict, patch_type) {
                    (false, _) => String::new(),
                    (true, PatchType::Strategic) => field_validation::go_map(patch),
                    (true, _) => patched.to_string(),
                };
                let unknown = self.drop_unknown_fields(resource, &mut patched, options.check_types);
                warnings = options.field_validation.settle(unknown, |unknown| {
                    field_validation::refused_patch(&shown, unknown)
                })?;
                let patched = self.intake(resource, patched);
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
        .map(|answer| answer.with_warnings(warnings))
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
        // An apply naming a UID changes that object or nothing: upstream's patcher refuses
        // to create one.
        let uid = applied.at("/metadata/uid").and_then(Value::as_str);
        if let Some(uid) = uid.filter(|uid| !uid.is_empty()) {
            return Err(ApiError::conflict(
                resource,
                name,
                &format!(
                    "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                ),
            ));
        }
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
pub(super) fn patch_error(resource: &Resource, name: &str, err: PatchError) -> ApiError {
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
pub(super) fn patched_object(patch_type: PatchType, patched: Value) -> Result<Value, ApiError> {
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

pub(super) fn apply_error(
    resource: &Resource,
    name: &str,
    err: apply::ServerSideApplyError,
) -> ApiError {
    match &err {
        apply::ServerSideApplyError::Conflicts(conflicts) => {
            let causes = conflicts
                .iter()
                .map(|c| json!({"reason": "FieldManagerConflict", "message": c.to_string(), "field": c.field}))
                .collect();
            ApiError::apply_conflict(resource, name, err.to_string(), causes)
        }
        apply::ServerSideApplyError::Invalid(reason) => {
            ApiError::invalid(&resource.kind, name, &[("patch".into(), reason.clone())])
        }
    }
}

/// Names a configuration that came without `metadata.name`.
fn set_name(applied: &mut Value, name: &str) {
    if let Some(object) = applied.as_object_mut() {
        let metadata = object
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.insert("name".into(), Value::String(name.into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tests::started_api;

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
}
