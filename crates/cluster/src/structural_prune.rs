//! Structural-schema pruning of custom resources: fields a CRD's schema does not describe
//! are dropped before storing, as kube-apiserver does, and reported so that
//! `fieldValidation=Strict` can refuse them instead.

use serde_json::Value;

use crate::pointer::Pointer;

/// Removes from `object` every field `schema` does not describe and returns their
/// dotted paths (`spec.moduleLoader.container.modprobe.firmwarepath`).
pub fn prune(schema: &Value, object: &mut Value) -> Vec<String> {
    let mut unknown = Vec::new();
    let Some(map) = object.as_object_mut() else {
        return unknown;
    };
    // apiVersion, kind and metadata are the server's, not the schema's.
    for (name, value) in map.iter_mut() {
        if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match schema.at(&format!(
            "/properties/{}",
            name.replace('~', "~0").replace('/', "~1")
        )) {
            Some(child) => walk(child, value, name, &mut unknown),
            None if preserves_unknown(schema) => {}
            None => unknown.push(name.clone()),
        }
    }
    remove_top_level(map, &unknown);
    unknown
}

fn preserves_unknown(schema: &Value) -> bool {
    schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
}

fn remove_top_level(map: &mut serde_json::Map<String, Value>, unknown: &[String]) {
    for path in unknown {
        if !path.contains('.') && !path.contains('[') {
            map.remove(path);
        }
    }
}

fn walk(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let embedded = schema
                .get("x-kubernetes-embedded-resource")
                .and_then(Value::as_bool)
                == Some(true);
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                let mut dropped = Vec::new();
                for (name, child) in map.iter_mut() {
                    if embedded && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                        continue;
                    }
                    let child_path = format!("{path}.{name}");
                    match properties.get(name) {
                        Some(child_schema) => walk(child_schema, child, &child_path, unknown),
                        None if preserves_unknown(schema) => {}
                        None => {
                            unknown.push(child_path);
                            dropped.push(name.clone());
                        }
                    }
                }
                for name in dropped {
                    map.remove(&name);
                }
            } else if let Some(additional) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (name, child) in map.iter_mut() {
                    walk(additional, child, &format!("{path}.{name}"), unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_dropped_and_named() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "modules": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }},
            "status": {"type": "object"}
        }});
        let mut object = json!({
            "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
            "spec": {"modules": [{"name": "m", "nmae": "typo"}], "labels": {"a": "b"},
                     "free": {"anything": 1}, "extra": true},
            "bogus": 1
        });
        let unknown = prune(&schema, &mut object);
        assert_eq!(unknown, ["bogus", "spec.extra", "spec.modules[0].nmae"]);
        assert_eq!(
            object,
            json!({
                "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "a"},
                "spec": {"modules": [{"name": "m"}], "labels": {"a": "b"}, "free": {"anything": 1}}
            })
        );
    }
}
