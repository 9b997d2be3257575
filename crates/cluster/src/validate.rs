//! Validation the API server applies before storing: names, the required fields of the
//! kinds whose controllers rely on them, and CRD definitions. Failures are 422 Invalid
//! with the field path, as upstream reports them.

use serde_json::Value;

use capstan_api::names::{label_key, label_value};

use crate::pointer::Pointer;

use super::errors::ApiError;
use super::resources::Resource;

type Causes = Vec<(String, String)>;

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
    finish(resource, name, causes)
}

/// Validates the next state of an existing object.
pub fn update(resource: &Resource, current: &Value, next: &Value) -> Result<(), ApiError> {
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
            causes.push((
                "spec.nodeName".into(),
                "Forbidden: pod updates may not change nodeName".into(),
            ));
        }
        pod(next, &mut causes);
    }
    finish(resource, name, causes)
}

fn finish(resource: &Resource, name: &str, causes: Causes) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(&resource.kind, name, &causes))
    }
}

/// DNS-1123 subdomain for most kinds; DNS-1123 label for namespaces.
fn name_format(resource: &Resource, name: &str, causes: &mut Causes) {
    let label_only = resource.plural == "namespaces" && resource.group.is_empty();
    let limit = if label_only { 63 } else { 253 };
    let valid_part = |part: &str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    let valid = name.len() <= limit
        && if label_only {
            valid_part(name)
        } else {
            name.split('.').all(valid_part)
        };
    if !valid {
        let what = if label_only { "label" } else { "subdomain" };
        causes.push((
            "metadata.name".into(),
            format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 {what} must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        ));
    }
}

/// Label keys and values as Kubernetes restricts them.
fn labels(object: &Value, causes: &mut Causes) {
    let Some(labels) = object.at("/metadata/labels").and_then(Value::as_object) else {
        return;
    };
    for (key, value) in labels {
        if let Err(why) = label_key(key) {
            causes.push((
                "metadata.labels".into(),
                format!("Invalid value: \"{key}\": {why}"),
            ));
        }
        let value = value.as_str().unwrap_or("");
        if !label_value(value) {
            causes.push((
                format!("metadata.labels.{key}"),
                format!("Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (max 63 characters)"),
            ));
        }
    }
}

fn pod(object: &Value, causes: &mut Causes) {
    let containers = object.at("/spec/containers").and_then(Value::as_array);
    match containers {
        None => causes.push(("spec.containers".into(), "Required value".into())),
        Some(list) if list.is_empty() => {
            causes.push(("spec.containers".into(), "Required value".into()))
        }
        Some(list) => {
            for (i, c) in list.iter().enumerate() {
                if c.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push((
                        format!("spec.containers[{i}].name"),
                        "Required value".into(),
                    ));
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    causes.push((
                        format!("spec.containers[{i}].image"),
                        "Required value".into(),
                    ));
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
        causes.push(("spec.group".into(), "Required value".into()));
    }
    if plural.is_empty() {
        causes.push(("spec.names.plural".into(), "Required value".into()));
    }
    if spec
        .at("/names/kind")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        causes.push(("spec.names.kind".into(), "Required value".into()));
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        causes.push((
            "metadata.name".into(),
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    match spec["scope"].as_str() {
        Some("Namespaced" | "Cluster") => {}
        _ => causes.push((
            "spec.scope".into(),
            "Unsupported value: must be Namespaced or Cluster".into(),
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
    if versions.is_empty() {
        causes.push((
            "spec.versions".into(),
            "Invalid value: must have exactly one version marked as storage version".into(),
        ));
    } else if storage != 1 {
        causes.push(("spec.versions".into(), format!("Invalid value: must have exactly one version marked as storage version, status.storedVersions has {storage}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_follow_the_qualified_name_rules() {
        let cases = [
            ("app", true),
            ("kmm.node.kubernetes.io/kmm-demo.my-kmod.ready", true),
            ("node-role.kubernetes.io/worker", true),
            ("bad key", false),
            ("/noprefix", false),
            (&"x".repeat(64) as &str, false),
            (&format!("a.io/{}", "x".repeat(63)) as &str, true),
        ];
        for (key, ok) in cases {
            assert_eq!(label_key(key).is_ok(), ok, "{key}");
        }
    }

    #[test]
    fn label_values_are_short_and_alphanumeric_at_the_ends() {
        for (value, ok) in [
            ("", true),
            ("v1", true),
            ("-v1", false),
            ("1.2.3", true),
            ("a b", false),
        ] {
            assert_eq!(label_value(value), ok, "{value:?}");
        }
    }
}
