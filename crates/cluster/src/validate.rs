//! Validation the API server applies before storing: names, the required fields of the
//! kinds whose controllers rely on them, CRD definitions, and custom resources against
//! their CRD's structural schema (see [`structural`](crate::structural)). Failures are
//! 422 Invalid with the field path, as upstream reports them.

use serde_json::Value;

use capstan_api::names::{
    dns1123_label_errors, dns1123_subdomain_errors, label_value_errors, qualified_name_errors,
};

use crate::field::{self, BadValue, FieldError};
use crate::pointer::Pointer;
use crate::scale::{FieldPath, PodSelector, ScaleSubresource};
use crate::structural;

use super::errors::ApiError;
use super::resources::Resource;

type Causes = Vec<FieldError>;

/// Validates an object about to be created.
pub fn object(resource: &Resource, object: &Value) -> Result<(), ApiError> {
    let name = object
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut causes = Causes::new();
    name_format(resource, name, &mut causes);
    labels(object, &mut causes);
    match (resource.group.as_str(), resource.plural.as_str()) {
        ("", "pods") => pod(object, &mut causes),
        ("apiextensions.k8s.io", "customresourcedefinitions") => crd(object, name, &mut causes),
        _ => {}
    }
    if let Some(custom) = &resource.custom {
        causes.extend(structural::validate_create(&custom.open_api_schema, object));
        if let Some(scale) = &resource.scale {
            scale_spec(scale, object, &mut causes);
            scale_status(scale, object, &mut causes);
        }
    }
    finish(resource, name, causes)
}

/// Validates the next state of an existing object, written through `subresource`: a
/// custom resource's status write validates its status alone, as upstream's status
/// strategy does.
pub fn update(
    resource: &Resource,
    current: &Value,
    next: &Value,
    subresource: Option<&str>,
) -> Result<(), ApiError> {
    let name = next
        .at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut causes = Causes::new();
    labels(next, &mut causes);
    if resource.plural == "pods" && resource.group.is_empty() {
        let bound = current
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let next_node = next.at("/spec/nodeName").and_then(Value::as_str);
        if bound.is_some() && bound != next_node {
            causes.push(FieldError::forbidden(
                "spec.nodeName",
                "pod updates may not change nodeName",
            ));
        }
        pod(next, &mut causes);
    }
    if let Some(custom) = &resource.custom {
        let schema = &custom.open_api_schema;
        causes.extend(match subresource {
            Some("status") => structural::validate_status(schema, next, current),
            _ => structural::validate_update(schema, next, current),
        });
        if let Some(scale) = &resource.scale {
            if subresource != Some("status") {
                scale_spec(scale, next, &mut causes);
            }
            scale_status(scale, next, &mut causes);
        }
    }
    finish(resource, name, causes)
}

/// A custom resource's desired replicas at its CRD's `specReplicasPath`, checked as
/// apiextensions-apiserver checks them on every write but a status write: an integer,
/// not negative, within int32 (`.spec.replicas: Invalid value: -1: should be a
/// non-negative integer`).
fn scale_spec(scale: &ScaleSubresource, object: &Value, causes: &mut Causes) {
    replicas(&scale.spec_replicas, object, causes);
}

/// The observed replicas at `statusReplicasPath` (as [`scale_spec`]) and the selector at
/// `labelSelectorPath`, which must be a string, checked on every write.
fn scale_status(scale: &ScaleSubresource, object: &Value, causes: &mut Causes) {
    replicas(&scale.status_replicas, object, causes);
    if let PodSelector::Text(Some(path)) = &scale.selector
        && let Err(err) = path.text(object)
    {
        causes.push(invalid_text(&path.text, "", err.to_string()));
    }
}

fn replicas(path: &FieldPath, object: &Value, causes: &mut Causes) {
    let invalid =
        |value: i64, detail: String| FieldError::invalid(&path.text, BadValue::Int(value), detail);
    match path.integer(object) {
        Err(err) => causes.push(invalid(0, err.to_string())),
        Ok(Some(n)) if n < 0 => causes.push(invalid(n, "should be a non-negative integer".into())),
        Ok(Some(n)) if n > i64::from(i32::MAX) => causes.push(invalid(
            n,
            format!("should be less than or equal to {}", i32::MAX),
        )),
        Ok(_) => {}
    }
}

fn finish(resource: &Resource, name: &str, causes: Causes) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(field::invalid(
            &resource.group,
            &resource.kind,
            name,
            &causes,
        ))
    }
}

/// DNS-1123 subdomain for most kinds; DNS-1123 label for namespaces. A cause per
/// upstream message.
fn name_format(resource: &Resource, name: &str, causes: &mut Causes) {
    let errors = if resource.plural == "namespaces" && resource.group.is_empty() {
        dns1123_label_errors(name)
    } else {
        dns1123_subdomain_errors(name)
    };
    for error in errors {
        causes.push(invalid_text("metadata.name", name, error));
    }
}

/// Label keys and values as Kubernetes restricts them, reported under
/// `metadata.labels` as upstream's `ValidateLabels` does.
fn labels(object: &Value, causes: &mut Causes) {
    let Some(labels) = object.at("/metadata/labels").and_then(Value::as_object) else {
        return;
    };
    for (key, value) in labels {
        for error in qualified_name_errors(key) {
            causes.push(invalid_text("metadata.labels", key, error));
        }
        let value = value.as_str().unwrap_or("");
        for error in label_value_errors(value) {
            causes.push(invalid_text("metadata.labels", value, error));
        }
    }
}

/// Upstream's `field.Invalid` of a string value.
fn invalid_text(field: &str, value: &str, error: String) -> FieldError {
    FieldError::invalid(field, BadValue::Text(value.to_string()), error)
}

fn pod(object: &Value, causes: &mut Causes) {
    let containers = object.at("/spec/containers").and_then(Value::as_array);
    match containers {
        None => causes.push(FieldError::required("spec.containers", "")),
        Some(list) if list.is_empty() => causes.push(FieldError::required("spec.containers", "")),
        Some(list) => {
            for (i, c) in list.iter().enumerate() {
                for field in ["name", "image"] {
                    if c.get(field)
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        causes.push(FieldError::required(
                            &format!("spec.containers[{i}].{field}"),
                            "",
                        ));
                    }
                }
            }
        }
    }
}

fn crd(object: &Value, name: &str, causes: &mut Causes) {
    let spec = &object["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec
        .at("/names/plural")
        .and_then(Value::as_str)
        .unwrap_or("");
    if group.is_empty() {
        causes.push(FieldError::required("spec.group", ""));
    }
    if plural.is_empty() {
        causes.push(FieldError::required("spec.names.plural", ""));
    }
    if spec
        .at("/names/kind")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        causes.push(FieldError::required("spec.names.kind", ""));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push(invalid_text(
            "metadata.name",
            name,
            "must be spec.names.plural+\".\"+spec.group".to_string(),
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced" | "Cluster") => {}
        other => causes.push(FieldError::not_supported(
            "spec.scope",
            BadValue::Text(other.unwrap_or("").to_string()),
            &["Cluster".to_string(), "Namespaced".to_string()],
        )),
    }
    let versions = spec["versions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let storage = versions
        .iter()
        .filter(|v| v["storage"].as_bool() == Some(true))
        .count();
    let one_storage = "must have exactly one version marked as storage version";
    if versions.is_empty() {
        causes.push(FieldError::invalid_omitting_value(
            "spec.versions",
            one_storage,
        ));
    } else if storage != 1 {
        causes.push(FieldError::invalid_omitting_value(
            "spec.versions",
            &format!("{one_storage}, status.storedVersions has {storage}"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;
    use serde_json::json;

    fn causes_of(plural: &str, object: Value) -> Vec<(String, String)> {
        let registry = Registry::with_builtins();
        let resource = registry.get("", "v1", plural).expect("a built-in resource");
        let name = object
            .at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut causes = Causes::new();
        name_format(&resource, name, &mut causes);
        labels(&object, &mut causes);
        causes
            .iter()
            .map(|cause| (cause.field.clone(), cause.body()))
            .collect()
    }

    /// Names and labels are refused with upstream's messages, one cause each, under the
    /// paths kube-apiserver reports.
    #[test]
    fn names_and_labels_are_refused_as_upstream_refuses_them() {
        let subdomain = dns1123_subdomain_errors("Not_Valid").remove(0);
        let label = dns1123_label_errors("Not_Valid").remove(0);
        let key = qualified_name_errors("bad key").remove(0);
        let value = label_value_errors("-v1").remove(0);
        let cases = [
            (
                "configmaps",
                json!({"metadata": {"name": "fine", "labels": {"app": "web", "a.io/b": ""}}}),
                vec![],
            ),
            (
                "configmaps",
                json!({"metadata": {"name": "Not_Valid"}}),
                vec![(
                    "metadata.name",
                    format!("Invalid value: \"Not_Valid\": {subdomain}"),
                )],
            ),
            (
                "configmaps",
                json!({"metadata": {"name": "kmm.demo"}}),
                vec![],
            ),
            (
                "namespaces",
                json!({"metadata": {"name": "Not_Valid"}}),
                vec![(
                    "metadata.name",
                    format!("Invalid value: \"Not_Valid\": {label}"),
                )],
            ),
            (
                "namespaces",
                json!({"metadata": {"name": "kmm.demo"}}),
                vec![(
                    "metadata.name",
                    "Invalid value: \"kmm.demo\": must not contain dots".to_string(),
                )],
            ),
            (
                "configmaps",
                json!({"metadata": {"name": "fine", "labels": {"bad key": "-v1"}}}),
                vec![
                    (
                        "metadata.labels",
                        format!("Invalid value: \"bad key\": {key}"),
                    ),
                    (
                        "metadata.labels",
                        format!("Invalid value: \"-v1\": {value}"),
                    ),
                ],
            ),
        ];
        for (plural, object, expected) in cases {
            let expected: Vec<(String, String)> = expected
                .into_iter()
                .map(|(field, message)| (field.to_string(), message))
                .collect();
            assert_eq!(causes_of(plural, object.clone()), expected, "{object}");
        }
    }

    /// A custom resource's scale paths are checked with apiextensions-apiserver's
    /// messages; a status write checks the status paths alone.
    #[test]
    fn scale_paths_of_custom_resources_are_checked() {
        let scale = ScaleSubresource::of_crd_version(&json!({"subresources": {"scale": {
            "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector"}}}))
        .expect("declared");
        #[rustfmt::skip]
        // (object, whether a status write, the causes as (field, message))
        type Case = (Value, bool, Vec<(&'static str, &'static str)>);
        let cases: Vec<Case> = vec![
            (
                json!({"spec": {"replicas": 2}, "status": {"replicas": 1, "selector": "a=b"}}),
                false,
                vec![],
            ),
            (json!({}), false, vec![]),
            (
                json!({"spec": {"replicas": -1}}),
                false,
                vec![(
                    ".spec.replicas",
                    "Invalid value: -1: should be a non-negative integer",
                )],
            ),
            (json!({"spec": {"replicas": -1}}), true, vec![]),
            (
                json!({"spec": {"replicas": 2147483648_i64}}),
                false,
                vec![(
                    ".spec.replicas",
                    "Invalid value: 2147483648: should be less than or equal to 2147483647",
                )],
            ),
            (
                json!({"status": {"replicas": -2}}),
                true,
                vec![(
                    ".status.replicas",
                    "Invalid value: -2: should be a non-negative integer",
                )],
            ),
            (
                json!({"status": {"replicas": 1.5}}),
                true,
                vec![(
                    ".status.replicas",
                    "Invalid value: 0: .status.replicas accessor error: 1.5 is of the type float64, expected int64",
                )],
            ),
            (
                json!({"status": {"selector": 3}}),
                true,
                vec![(
                    ".status.selector",
                    "Invalid value: \"\": .status.selector accessor error: 3 is of the type int64, expected string",
                )],
            ),
        ];
        for (object, status_only, want) in cases {
            let mut causes = Causes::new();
            if !status_only {
                scale_spec(&scale, &object, &mut causes);
            }
            scale_status(&scale, &object, &mut causes);
            let got: Vec<(String, String)> = causes
                .iter()
                .map(|cause| (cause.field.clone(), cause.body()))
                .collect();
            let want: Vec<(String, String)> = want
                .iter()
                .map(|(field, body)| (field.to_string(), body.to_string()))
                .collect();
            assert_eq!(got, want, "{object}");
        }
    }
}
