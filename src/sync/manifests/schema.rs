//! Checks an object against the OpenAPI schema of its CRD as the API server would: types,
//! nulls, required fields, enums, bounds, list sizes and list keys. Each violation names
//! the field path, so the caller can point at the line. Unknown fields are found by
//! [`capstan_api::schema::unknown_fields`]; this module only suggests what was meant.

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

use super::yaml::FieldPath;

/// A value the schema does not allow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Where the value is (or, for a missing field, would be).
    pub path: FieldPath,
    /// What is wrong with it.
    pub message: String,
}

/// The schema of the CRD version `api_version` names; `None` when the CRD does not
/// define that version or has no schema for it.
pub fn version_schema<'a>(
    crd: &'a CustomResourceDefinition,
    api_version: &str,
) -> Option<&'a JSONSchemaProps> {
    crd.spec
        .versions
        .iter()
        .find(|version| api_version == format!("{}/{}", crd.spec.group, version.name))
        .and_then(|version| version.schema.as_ref())
        .and_then(|schema| schema.open_api_v3_schema.as_ref())
}

/// Every value of `object` that `schema` (a resource root) does not allow. `apiVersion`,
/// `kind` and `metadata` are left to the metadata rules.
pub fn violations(schema: &JSONSchemaProps, object: &Value) -> Vec<Violation> {
    let mut found = Vec::new();
    check(schema, object, &FieldPath::root(), true, &mut found);
    found
}

/// The field names the schema declares for the object at `path`, for "did you mean"
/// hints; empty when the path leads nowhere the schema describes.
pub fn declared_fields<'a>(root: &'a JSONSchemaProps, path: &FieldPath) -> Vec<&'a str> {
    let mut schema = root;
    for name in path.names() {
        let next = match name {
            Some(name) => schema
                .properties
                .as_ref()
                .and_then(|properties| properties.get(name))
                .or(match &schema.additional_properties {
                    Some(JSONSchemaPropsOrBool::Schema(additional)) => Some(additional.as_ref()),
                    _ => None,
                }),
            None => match &schema.items {
                Some(JSONSchemaPropsOrArray::Schema(items)) => Some(items.as_ref()),
                _ => None,
            },
        };
        let Some(next) = next else {
            return Vec::new();
        };
        schema = next;
    }
    schema
        .properties
        .iter()
        .flatten()
        .map(|(name, _)| name.as_str())
        .collect()
}

fn check(
    schema: &JSONSchemaProps,
    value: &Value,
    path: &FieldPath,
    resource_root: bool,
    found: &mut Vec<Violation>,
) {
    let mut violation = |path: &FieldPath, message: String| {
        found.push(Violation {
            path: path.clone(),
            message,
        })
    };
    if value.is_null() {
        if schema.nullable != Some(true) {
            violation(
                path,
                "must not be null; leave the field out instead".to_string(),
            );
        }
        return;
    }
    if schema.x_kubernetes_int_or_string == Some(true) {
        if !(is_integer(value) || value.is_string()) {
            violation(
                path,
                format!("expected an integer or a string, got {}", describe(value)),
            );
        }
        return;
    }
    if let Some(expected) = schema.type_.as_deref()
        && !has_type(value, expected)
    {
        violation(
            path,
            format!("expected {}, got {}", article(expected), describe(value)),
        );
        return;
    }
    if let Some(allowed) = &schema.enum_
        && !allowed.iter().any(|json| json.0 == *value)
    {
        let names: Vec<String> = allowed.iter().map(|json| json.0.to_string()).collect();
        violation(
            path,
            format!(
                "{} is not allowed: must be one of {}",
                value,
                names.join(", ")
            ),
        );
    }
    match value {
        Value::Number(_) => check_number(schema, value, path, &mut violation),
        Value::String(text) => check_length(schema, text.chars().count(), path, &mut violation),
        Value::Array(items) => {
            check_items(schema, items, path, &mut violation);
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for (index, item) in items.iter().enumerate() {
                    check(item_schema, item, &path.index(index), false, found);
                }
            }
        }
        Value::Object(fields) => {
            for required in schema.required.iter().flatten() {
                // The API server fills a default before it checks required fields.
                let defaulted = schema
                    .properties
                    .as_ref()
                    .and_then(|properties| properties.get(required))
                    .is_some_and(|property| property.default.is_some());
                if !defaulted && fields.get(required).is_none_or(Value::is_null) {
                    violation(
                        &path.field(required),
                        "required field is missing".to_string(),
                    );
                }
            }
            let additional = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(additional)) => Some(additional.as_ref()),
                _ => None,
            };
            let implicit = resource_root || schema.x_kubernetes_embedded_resource == Some(true);
            for (name, field) in fields {
                if implicit && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let property = schema
                    .properties
                    .as_ref()
                    .and_then(|properties| properties.get(name))
                    .or(additional);
                // Undeclared fields are reported as unknown fields, not here.
                if let Some(property) = property {
                    check(property, field, &path.field(name), false, found);
                }
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
}

fn check_number(
    schema: &JSONSchemaProps,
    value: &Value,
    path: &FieldPath,
    violation: &mut impl FnMut(&FieldPath, String),
) {
    let range = match schema.format.as_deref() {
        Some("int32") => Some((f64::from(i32::MIN), f64::from(i32::MAX))),
        _ => None,
    };
    let Some(number) = value.as_f64() else {
        return;
    };
    if let Some((low, high)) = range
        && !(low..=high).contains(&number)
    {
        violation(path, format!("{value} does not fit a 32-bit integer"));
    }
    if let Some(minimum) = schema.minimum {
        let exclusive = schema.exclusive_minimum == Some(true);
        if number < minimum || (exclusive && number == minimum) {
            let relation = if exclusive {
                "greater than"
            } else {
                "at least"
            };
            violation(
                path,
                format!("{value} is too small: must be {relation} {minimum}"),
            );
        }
    }
    if let Some(maximum) = schema.maximum {
        let exclusive = schema.exclusive_maximum == Some(true);
        if number > maximum || (exclusive && number == maximum) {
            let relation = if exclusive { "less than" } else { "at most" };
            violation(
                path,
                format!("{value} is too large: must be {relation} {maximum}"),
            );
        }
    }
}

fn check_length(
    schema: &JSONSchemaProps,
    length: usize,
    path: &FieldPath,
    violation: &mut impl FnMut(&FieldPath, String),
) {
    let length = i64::try_from(length).unwrap_or(i64::MAX);
    if let Some(min) = schema.min_length
        && length < min
    {
        violation(
            path,
            format!("must have at least {min} characters (has {length})"),
        );
    }
    if let Some(max) = schema.max_length
        && length > max
    {
        violation(
            path,
            format!("must have at most {max} characters (has {length})"),
        );
    }
}

fn check_items(
    schema: &JSONSchemaProps,
    items: &[Value],
    path: &FieldPath,
    violation: &mut impl FnMut(&FieldPath, String),
) {
    let count = i64::try_from(items.len()).unwrap_or(i64::MAX);
    if let Some(min) = schema.min_items
        && count < min
    {
        violation(
            path,
            format!("must have at least {min} item{} (has {count})", plural(min)),
        );
    }
    if let Some(max) = schema.max_items
        && count > max
    {
        violation(
            path,
            format!("must have at most {max} item{} (has {count})", plural(max)),
        );
    }
    // Server-side apply merges these lists by key, so a repeated key is ambiguous.
    let key_of = |item: &Value| -> Option<String> {
        match schema.x_kubernetes_list_type.as_deref() {
            Some("set") => Some(item.to_string()),
            Some("map") => {
                let keys = schema
                    .x_kubernetes_list_map_keys
                    .as_deref()
                    .unwrap_or_default();
                let parts: Vec<String> = keys
                    .iter()
                    .map(|key| item.get(key).map(Value::to_string).unwrap_or_default())
                    .collect();
                Some(parts.join(", "))
            }
            _ => None,
        }
    };
    let mut seen = BTreeSet::new();
    for (index, item) in items.iter().enumerate() {
        if let Some(key) = key_of(item)
            && !seen.insert(key.clone())
        {
            violation(&path.index(index), format!("duplicate entry {key}"));
        }
    }
}

fn plural(count: i64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

fn is_integer(value: &Value) -> bool {
    value.is_i64() || value.is_u64()
}

fn has_type(value: &Value, expected: &str) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => is_integer(value),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        // Types Kubernetes does not know are the schema's problem, not the object's.
        _ => true,
    }
}

fn article(expected: &str) -> String {
    match expected {
        "object" => "a mapping".to_string(),
        "array" => "a list".to_string(),
        "integer" => "an integer".to_string(),
        other => format!("a {other}"),
    }
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "a list".to_string(),
        Value::Object(_) => "a mapping".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(value: Value) -> JSONSchemaProps {
        serde_json::from_value(value).unwrap()
    }

    fn messages(schema: &JSONSchemaProps, object: Value) -> Vec<String> {
        violations(schema, &object)
            .into_iter()
            .map(|v| format!("{}: {}", v.path, v.message))
            .collect()
    }

    #[test]
    fn decision_table() {
        let root = schema(json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 2},
                        "count": {"type": "integer", "format": "int32", "minimum": 1},
                        "ratio": {"type": "number", "maximum": 1.0},
                        "enabled": {"type": "boolean"},
                        "policy": {"type": "string", "enum": ["A", "B"]},
                        "port": {"x-kubernetes-int-or-string": true},
                        "optional": {"type": "object", "nullable": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                        "keyed": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string"}}}
                        }
                    }
                }
            }
        }));
        let ok = json!({"name": "ab"});
        let with = |field: &str, value: Value| {
            let mut spec = ok.clone();
            spec[field] = value;
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": 1}, "spec": spec})
        };
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (with("count", json!(3)), vec![]),
            (
                with("count", json!("3")),
                vec!["spec.count: expected an integer, got string \"3\""],
            ),
            (
                with("count", json!(1.5)),
                vec!["spec.count: expected an integer, got number 1.5"],
            ),
            (
                with("count", json!(0)),
                vec!["spec.count: 0 is too small: must be at least 1"],
            ),
            (
                with("count", json!(3_000_000_000_u64)),
                vec!["spec.count: 3000000000 does not fit a 32-bit integer"],
            ),
            (
                with("ratio", json!(2)),
                vec!["spec.ratio: 2 is too large: must be at most 1"],
            ),
            (
                with("enabled", json!("yes")),
                vec!["spec.enabled: expected a boolean, got string \"yes\""],
            ),
            (
                with("policy", json!("C")),
                vec!["spec.policy: \"C\" is not allowed: must be one of \"A\", \"B\""],
            ),
            (with("port", json!(80)), vec![]),
            (with("port", json!("http")), vec![]),
            (
                with("port", json!(true)),
                vec!["spec.port: expected an integer or a string, got boolean true"],
            ),
            (with("optional", json!(null)), vec![]),
            (
                with("enabled", json!(null)),
                vec!["spec.enabled: must not be null; leave the field out instead"],
            ),
            (
                with("labels", json!({"a": "b", "c": 1})),
                vec!["spec.labels.c: expected a string, got number 1"],
            ),
            (
                with("items", json!([])),
                vec!["spec.items: must have at least 1 item (has 0)"],
            ),
            (
                with("items", json!(["a", 2])),
                vec!["spec.items[1]: expected a string, got number 2"],
            ),
            (
                with("keyed", json!([{"name": "a"}, {"name": "a"}])),
                vec!["spec.keyed[1]: duplicate entry \"a\""],
            ),
            (
                with("name", json!("a")),
                vec!["spec.name: must have at least 2 characters (has 1)"],
            ),
            (
                json!({"spec": {}}),
                vec!["spec.name: required field is missing"],
            ),
            (
                json!({"spec": []}),
                vec!["spec: expected a mapping, got a list"],
            ),
            (json!({}), vec!["spec: required field is missing"]),
        ];
        for (object, expected) in cases {
            assert_eq!(messages(&root, object.clone()), expected, "{object}");
        }
    }

    #[test]
    fn declared_fields_follow_the_path() {
        let root = schema(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}}
                }}
            }
        }));
        let path = FieldPath::of(&["spec", "list"]).index(0);
        assert_eq!(declared_fields(&root, &path), ["a", "b"]);
        assert_eq!(
            declared_fields(&root, &FieldPath::of(&["nowhere"])),
            Vec::<&str>::new()
        );
    }
}
