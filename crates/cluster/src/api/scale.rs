//! The `/scale` subresource's verbs: GET shows a workload as an autoscaling/v1 `Scale`;
//! PUT and the four patch types write a `Scale`, whose `spec.replicas` becomes the
//! workload's desired replicas and nothing else, as kube-apiserver's scale storage does.
//!
//! A write runs on the `Scale` the object shows, its managed fields included
//! ([`scale_managed_fields`]), then goes back to the object as an ordinary write of its
//! spec (defaults, types, validation, `generation`, the object's resourceVersion as the
//! precondition), through [`Api::write_existing`] like every other write.

use std::sync::Arc;

use serde_json::{Value, json};

use super::patch::{apply_error, patch_error, patched_object};
use super::write::{check_precondition, manager_of};
use super::{Answer, Api, PatchType, WriteOptions};
use crate::errors::ApiError;
use crate::field::{self, BadValue, FieldError};
use crate::field_validation::{self, FieldValidation};
use crate::patch::apply::{self, object_managed_fields, scale_managed_fields};
use crate::patch::{json as json_patch, merge, strategic};
use crate::pointer::Pointer;
use crate::resources::{Conversion, Resource};
use crate::scale::{self, ScaleError, ScaleSubresource, UNSET_REPLICAS};
use crate::schema::BuiltinSchema;
use crate::typed;
use capstan_api::clock::rfc3339;

impl Api {
    /// GET of `<resource>/<name>/scale`.
    ///
    /// Fails with 404 when the kind has no scale subresource or the object does not
    /// exist, and with 500 when a custom resource has no replicas at its
    /// `specReplicasPath` (upstream's answer).
    pub fn get_scale(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let subresource = scalable(resource)?;
        let object = self.get_value(resource, namespace, name)?;
        let view = subresource
            .view(&object)
            .map_err(|err| unreadable(resource, err))?;
        if resource.custom.is_some() && !view.has_spec_replicas {
            return Err(ApiError::internal_error_occurred(
                &ScaleError::NoSpecReplicas {
                    path: subresource.spec_replicas.text.clone(),
                }
                .to_string(),
            ));
        }
        Ok(view.scale)
    }

    /// PUT of `<resource>/<name>/scale`: `body` is the `Scale` to write; its
    /// `spec.replicas` becomes the object's, its resourceVersion (when set) must be the
    /// object's.
    ///
    /// Fails with 400 when the body is not a `Scale` of this object or does not decode
    /// as one, 404 when the object does not exist, 409 on a stale resourceVersion, 422
    /// on negative replicas.
    pub fn update_scale(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Answer, ApiError> {
        let kind = scale_kind(resource);
        let mut body = checked_scale(body)?;
        let unknown = drop_unknown_fields(&mut body, options.check_types);
        let warnings = options.field_validation.settle(unknown, |unknown| {
            field_validation::refused_body(&kind, unknown)
        })?;
        if options.check_types {
            typed::check_scale(&body)?;
        }
        let body_name = body
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let manager = manager_of(options);
        self.write_scale(resource, namespace, name, options, |shown| {
            let now = rfc3339(self.now());
            Ok(apply::track_update(
                Some(shown),
                body.clone(),
                &manager,
                &BuiltinSchema,
                &now,
                Some("scale"),
            ))
        })
        .map(|answer| answer.with_warnings(warnings))
    }

    /// PATCH of `<resource>/<name>/scale`, of any type: the patch applies to the `Scale`
    /// the object shows. Server-side apply needs a field manager, and never creates the
    /// object.
    ///
    /// Fails as [`update_scale`](Self::update_scale) does, with 415 for a strategic merge
    /// patch of a custom resource's `Scale`, and 409 when an apply conflicts with
    /// another manager of the replicas.
    pub fn patch_scale(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        patch_type: PatchType,
        patch: Value,
        options: &WriteOptions,
    ) -> Result<Answer, ApiError> {
        if patch_type == PatchType::Strategic && resource.custom.is_some() {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if patch_type == PatchType::Merge && !(patch.is_object() || patch.is_array()) {
            return Err(ApiError::bad_request("Invalid JSON Patch"));
        }
        let kind = scale_kind(resource);
        let manager = manager_of(options);
        if patch_type == PatchType::Apply {
            if options.field_manager.is_none() {
                return Err(ApiError::bad_request(
                    "PATCH requests with apply patch type require field manager",
                ));
            }
            let mut applied = checked_scale(patch)?;
            let unknown = drop_unknown_fields(&mut applied, options.check_types);
            if !unknown.is_empty() {
                return Err(field_validation::refused_apply(
                    &kind, namespace, name, &unknown,
                ));
            }
            if options.check_types {
                typed::check_scale(&applied)?;
            }
            let applied_name = applied.at("/metadata/name").and_then(Value::as_str);
            if applied_name != Some(name) {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    applied_name.unwrap_or("")
                )));
            }
            return self.write_scale(resource, namespace, name, options, |shown| {
                let now = rfc3339(self.now());
                apply::apply(
                    Some(shown),
                    &applied,
                    &manager,
                    options.force,
                    &BuiltinSchema,
                    &now,
                    Some("scale"),
                )
                .map_err(|err| apply_error(resource, name, err))
            });
        }
        let mut warnings = Vec::new();
        self.write_scale(resource, namespace, name, options, |shown| {
            let patched = match patch_type {
                PatchType::Merge => {
                    let mut target = shown.clone();
                    merge::merge_patch(&mut target, &patch);
                    target
                }
                PatchType::Json => json_patch::json_patch(shown, &patch)
                    .map_err(|err| patch_error(&kind, name, err))?,
                PatchType::Strategic => {
                    strategic::strategic_merge_patch(shown, &patch, &BuiltinSchema)
                        .map_err(|err| patch_error(&kind, name, err))?
                }
                PatchType::Apply => {
                    return Err(ApiError::internal("apply is handled before this point"));
                }
            };
            let mut patched = patched_object(patch_type, patched)?;
            let shown_text = match (options.field_validation, patch_type) {
                (FieldValidation::Strict, PatchType::Strategic) => field_validation::go_map(&patch),
                (FieldValidation::Strict, _) => patched.to_string(),
                _ => String::new(),
            };
            let unknown = drop_unknown_fields(&mut patched, options.check_types);
            warnings = options.field_validation.settle(unknown, |unknown| {
                field_validation::refused_patch(&shown_text, unknown)
            })?;
            if options.check_types {
                typed::check_scale(&patched)?;
            }
            let now = rfc3339(self.now());
            Ok(apply::track_update(
                Some(shown),
                patched,
                &manager,
                &BuiltinSchema,
                &now,
                Some("scale"),
            ))
        })
        .map(|answer| answer.with_warnings(warnings))
    }

    /// Writes the `Scale` that `change` makes of the one the object shows: the
    /// replicas go to the object's spec path, the managed fields back to the object, and
    /// the object is written as any update of its spec. Answers with the `Scale` of the
    /// object as stored (as written, with `dryRun`).
    fn write_scale(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        options: &WriteOptions,
        mut change: impl FnMut(&Value) -> Result<Value, ApiError>,
    ) -> Result<Answer, ApiError> {
        let subresource = scalable(resource)?;
        let replicas_path = subresource.spec_replicas.names();
        let written = self.write_existing(
            resource,
            namespace,
            name,
            options.dry_run,
            None,
            |current| {
                let shown = shown_scale(resource, subresource, current, &replicas_path)?;
                let scale = change(&shown)?;
                let replicas = written_replicas(resource, subresource, name, current, &scale)?;
                let mut next = subresource
                    .with_replicas(current.clone(), replicas)
                    .map_err(|err| ApiError::internal(err.to_string()))?;
                next["metadata"]["managedFields"] =
                    json!(object_managed_fields(current, &scale, &replicas_path));
                if let Some(version) = scale.at("/metadata/resourceVersion") {
                    next["metadata"]["resourceVersion"] = version.clone();
                }
                check_precondition(resource, name, current, &next)?;
                let mut next =
                    self.normalize_update(resource, current, next, None, options.check_types)?;
                if next.at("/metadata/managedFields") == Some(&json!([]))
                    && let Some(metadata) = next["metadata"].as_object_mut()
                {
                    metadata.remove("managedFields");
                }
                Ok(next)
            },
        )?;
        let object = written.into_value();
        let view = subresource
            .view(&object)
            .map_err(|err| unreadable(resource, err))?;
        Ok(Answer::parsed(view.scale, None))
    }
}

/// The kind's scale subresource; 404 for kinds without one, as for any unknown path.
fn scalable(resource: &Resource) -> Result<&ScaleSubresource, ApiError> {
    match (&resource.scale, resource.conversion) {
        (Some(scale), Conversion::None) => Ok(scale),
        _ => Err(ApiError::no_such_path()),
    }
}

/// The `Scale` a write starts from: the object's, with its owners of the replicas as
/// managed fields, and upstream's marker of a custom resource without replicas.
fn shown_scale(
    resource: &Resource,
    subresource: &ScaleSubresource,
    object: &Value,
    replicas_path: &[&str],
) -> Result<Value, ApiError> {
    let view = subresource
        .view(object)
        .map_err(|err| unreadable(resource, err))?;
    let mut shown = view.scale;
    if resource.custom.is_some() && !view.has_spec_replicas {
        shown["spec"]["replicas"] = json!(UNSET_REPLICAS);
    }
    let managed = scale_managed_fields(object, replicas_path);
    if !managed.is_empty() {
        shown["metadata"]["managedFields"] = json!(managed);
    }
    Ok(shown)
}

/// The replicas a written `Scale` asks of `object`, checked as upstream checks them: a
/// custom resource's must be set (400); a built-in workload's must not be negative
/// (422 on the `Scale`), and a uid the `Scale` carries must be the object's (409).
fn written_replicas(
    resource: &Resource,
    subresource: &ScaleSubresource,
    name: &str,
    object: &Value,
    scale: &Value,
) -> Result<i64, ApiError> {
    let replicas = scale::spec_replicas(scale);
    if resource.custom.is_some() {
        if replicas == UNSET_REPLICAS {
            return Err(ApiError::bad_request(
                ScaleError::EmptySpecReplicas {
                    path: subresource.spec_replicas.text.clone(),
                }
                .to_string(),
            ));
        }
        return Ok(replicas);
    }
    if replicas < 0 {
        return Err(field::invalid(
            "autoscaling",
            "Scale",
            name,
            &[FieldError::invalid(
                "spec.replicas",
                BadValue::Int(replicas),
                "must be greater than or equal to 0",
            )],
        ));
    }
    let uid = scale
        .at("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    let object_uid = object
        .at("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !uid.is_empty() && uid != object_uid {
        return Err(ApiError::conflict_on(
            &resource.group,
            &format!("{}/scale", resource.plural),
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {object_uid}"
            ),
        ));
    }
    Ok(replicas)
}

/// An object whose `Scale` cannot be read: a built-in workload's bad selector is the
/// client's (400), a custom resource's field of the wrong type the server's (500), as
/// upstream answers them.
fn unreadable(resource: &Resource, err: ScaleError) -> ApiError {
    if resource.custom.is_some() {
        ApiError::internal(err.to_string())
    } else {
        ApiError::bad_request(err.to_string())
    }
}

/// A body checked against the `Scale` kind: another kind or apiVersion is refused as
/// upstream cannot convert it (`Deployment in version "v1" cannot be handled as a
/// Scale: ...`); `kind`, `apiVersion` and `metadata` are filled in.
fn checked_scale(body: Value) -> Result<Value, ApiError> {
    let Value::Object(_) = body else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON or YAML object",
        ));
    };
    let mut body = body;
    let text = |field: &str| {
        body.get(field)
            .and_then(Value::as_str)
            .filter(|text| !text.is_empty())
            .map(str::to_string)
    };
    let kind = text("kind").unwrap_or_else(|| "Scale".into());
    let api_version = text("apiVersion").unwrap_or_else(|| scale::API_VERSION.into());
    if kind != "Scale" || api_version != scale::API_VERSION {
        let version = api_version.rsplit('/').next().unwrap_or(&api_version);
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a Scale: converting ({version}.{kind}) to (autoscaling.Scale): unknown conversion"
        )));
    }
    super::write::check_metadata(&body)?;
    body["kind"] = json!("Scale");
    body["apiVersion"] = json!(scale::API_VERSION);
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = json!({});
    }
    Ok(body)
}

/// Drops from a client's `Scale` the fields autoscaling/v1 `Scale` does not know, and
/// returns their paths (when the write's types are checked).
fn drop_unknown_fields(scale: &mut Value, check_types: bool) -> Vec<String> {
    if !check_types {
        return Vec::new();
    }
    match typed::round_trip_scale(scale) {
        Some(known) => field_validation::drop_unknown(scale, &known),
        None => Vec::new(),
    }
}

/// The `Scale` kind, to name it in errors as upstream does (`Scale in version "v1"`,
/// `autoscaling/v1, Kind=Scale`), scoped as `parent` is.
fn scale_kind(parent: &Resource) -> Resource {
    Resource {
        group: "autoscaling".into(),
        version: "v1".into(),
        kind: "Scale".into(),
        plural: "scale".into(),
        singular: String::new(),
        namespaced: parent.namespaced,
        short_names: Vec::new(),
        categories: Vec::new(),
        has_status: false,
        scale: None,
        storage: parent.storage.clone(),
        conversion: Conversion::None,
        schema: Arc::new(BuiltinSchema),
        custom: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::tests::started_api;

    fn deployment(name: &str, replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": name, "labels": {"app": name}},
               "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}})
    }

    fn manager(name: &str) -> WriteOptions {
        WriteOptions {
            field_manager: Some(name.into()),
            check_types: true,
            ..WriteOptions::default()
        }
    }

    /// A scale write changes the replicas and nothing else of the object, bumps its
    /// generation as a spec write does, and answers the new `Scale`.
    #[test]
    fn a_scale_write_changes_the_replicas_alone() {
        let api = started_api(1000);
        let deployments = api
            .registry
            .get("apps", "v1", "deployments")
            .expect("served");
        let created = api
            .create(
                &deployments,
                "default",
                deployment("web", 2),
                &manager("creator"),
            )
            .expect("create");
        let scale = api
            .patch_scale(
                &deployments,
                "default",
                "web",
                PatchType::Merge,
                json!({"spec": {"replicas": 5}}),
                &manager("kubectl"),
            )
            .expect("scale")
            .into_value();
        assert_eq!(scale["spec"], json!({"replicas": 5}));
        assert_eq!(
            scale["status"],
            json!({"replicas": 0, "selector": "app=web"})
        );
        let after = api.get_value(&deployments, "default", "web").expect("get");
        assert_eq!(after["spec"]["replicas"], json!(5));
        assert_eq!(after["metadata"]["generation"], json!(2));
        assert_eq!(
            scale["metadata"]["resourceVersion"],
            after["metadata"]["resourceVersion"]
        );
        let mut before_spec = created["spec"].clone();
        before_spec["replicas"] = json!(5);
        assert_eq!(after["spec"], before_spec);
        assert_eq!(after["metadata"]["labels"], created["metadata"]["labels"]);
        // The same replicas again: nothing written.
        let again = api
            .patch_scale(
                &deployments,
                "default",
                "web",
                PatchType::Merge,
                json!({"spec": {"replicas": 5}}),
                &manager("kubectl"),
            )
            .expect("scale")
            .into_value();
        assert_eq!(
            again["metadata"]["resourceVersion"],
            after["metadata"]["resourceVersion"]
        );
    }

    /// No `Scale` a client can write panics the server or answers a 5xx for a built-in
    /// workload: values of every JSON type wherever a `Scale` has fields, through every
    /// patch type and PUT. Each ends in an answer or a 4xx error.
    #[test]
    fn no_scale_write_panics_the_server() {
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let api = started_api(100_000);
        let deployments = api
            .registry
            .get("apps", "v1", "deployments")
            .expect("served");
        api.create(
            &deployments,
            "default",
            deployment("web", 2),
            &manager("creator"),
        )
        .expect("create");
        let values = [
            json!(null),
            json!(true),
            json!(-1),
            json!(3),
            json!(2147483648_i64),
            json!(1.5),
            json!("x"),
            json!([]),
            json!([{}]),
            json!({}),
            json!({"replicas": 1}),
            json!([{"manager": 5}]),
        ];
        let shapes: Vec<fn(&Value) -> Value> = vec![
            |v| v.clone(),
            |v| json!({"spec": v}),
            |v| json!({"spec": {"replicas": v}}),
            |v| json!({"metadata": v}),
            |v| json!({"metadata": {"name": "web", "resourceVersion": v, "uid": v}}),
            |v| json!({"metadata": {"managedFields": v}}),
            |v| json!({"status": v, "kind": v}),
        ];
        let mut failures = Vec::new();
        for value in &values {
            for shape in &shapes {
                let body = shape(value);
                let mut scale = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                       "metadata": {"name": "web"}});
                crate::patch::merge::merge_patch(&mut scale, &body);
                let json_patch = json!([{"op": "add", "path": "/spec/replicas", "value": body}]);
                let writes = [
                    ("merge", PatchType::Merge, body.clone()),
                    ("strategic", PatchType::Strategic, body.clone()),
                    ("JSON patch", PatchType::Json, json_patch),
                    ("apply", PatchType::Apply, scale.clone()),
                ];
                let mut check =
                    |what: String, result: std::thread::Result<Result<Answer, ApiError>>| {
                        match result {
                            Ok(Ok(_)) => {}
                            Ok(Err(err)) if err.code < 500 => {}
                            Ok(Err(err)) => failures.push(format!("{what}: {err:?}")),
                            Err(_) => failures.push(format!("{what}: panicked")),
                        }
                    };
                for (what, patch_type, patch) in writes {
                    let result = catch_unwind(AssertUnwindSafe(|| {
                        api.patch_scale(
                            &deployments,
                            "default",
                            "web",
                            patch_type,
                            patch.clone(),
                            &manager("m"),
                        )
                    }));
                    check(format!("{what} {patch}"), result);
                }
                let update = catch_unwind(AssertUnwindSafe(|| {
                    api.update_scale(&deployments, "default", "web", scale.clone(), &manager("m"))
                }));
                check(format!("update {scale}"), update);
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
        let after = api
            .get_value(&deployments, "default", "web")
            .expect("still there");
        assert!(after["spec"]["replicas"].is_i64(), "{after}");
    }
}
