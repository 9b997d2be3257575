//! What capstan does with the schemas of its kinds: the schemars transform the kinds'
//! derives use on fields of Kubernetes' own types, and the strict field check that
//! manifests from Git go through against a CRD's structural schema.
//!
//! Nothing here knows a kind: the kinds use it, and the CRD list gathers the kinds.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use schemars::transform::{RecursiveTransform, transform_subschemas};
use serde_json::Value;

/// Schema transform for fields of Kubernetes' own types (pod templates, volumes, env...):
/// drops the descriptions below the field, keeping the field's own.
///
/// Upstream's descriptions of those types would make the LeaderWorkerSet CRD about 690 kB,
/// too big for the `last-applied-configuration` annotation of a client-side
/// `kubectl apply` (256 kB); `kubectl explain` on the built-in kinds still has them.
pub(crate) fn drop_nested_descriptions(schema: &mut schemars::Schema) {
    let mut drop_description = RecursiveTransform(|schema: &mut schemars::Schema| {
        schema.remove("description");
    });
    transform_subschemas(&mut drop_description, schema);
}

/// The fields of `object` that `crd`'s schema does not declare, as dotted paths
/// (`spec.moduleLoader.container.kernelMapping`, `spec.modules[0].confg`).
///
/// An API server would silently drop these (pruning); capstan reports them instead so a
/// misspelt field in Git is an error, not a no-op. The schema of the version named by the
/// object's `apiVersion` is used, else the storage version. `apiVersion`, `kind` and
/// `metadata` at the root are not checked here, nor anything below a field whose schema
/// preserves unknown fields. An empty result means the object is clean.
pub fn unknown_fields(crd: &CustomResourceDefinition, object: &Value) -> Vec<String> {
    let api_version = object.get("apiVersion").and_then(Value::as_str);
    let versions = &crd.spec.versions;
    let version = versions
        .iter()
        .find(|v| api_version == Some(format!("{}/{}", crd.spec.group, v.name).as_str()))
        .or_else(|| versions.iter().find(|v| v.storage))
        .or_else(|| versions.first());
    let Some(schema) = version
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
    else {
        return Vec::new();
    };
    let mut unknown = Vec::new();
    collect_unknown(schema, object, "", true, &mut unknown);
    unknown
}

/// Walks `value` along `schema`, pushing the paths of undeclared object fields.
pub(crate) fn collect_unknown(
    schema: &JSONSchemaProps,
    value: &Value,
    path: &str,
    resource_root: bool,
    unknown: &mut Vec<String>,
) {
    if schema.x_kubernetes_int_or_string == Some(true) {
        return;
    }
    let preserves = schema.x_kubernetes_preserve_unknown_fields == Some(true);
    // Resource roots carry apiVersion/kind/metadata, which the API server checks itself.
    let implicit = resource_root || schema.x_kubernetes_embedded_resource == Some(true);
    match value {
        Value::Object(fields) => {
            let additional = match &schema.additional_properties {
                Some(JSONSchemaPropsOrBool::Schema(additional)) => Some(additional.as_ref()),
                _ => None,
            };
            for (name, field) in fields {
                let field_path = if path.is_empty() {
                    name.clone()
                } else {
                    format!("{path}.{name}")
                };
                if implicit && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (
                    schema.properties.as_ref().and_then(|p| p.get(name)),
                    additional,
                ) {
                    (Some(property), _) | (None, Some(property)) => {
                        collect_unknown(property, field, &field_path, false, unknown)
                    }
                    // An object schema without properties is free-form, as for `metadata`.
                    (None, None) if preserves || schema.properties.is_none() => {}
                    (None, None) => unknown.push(field_path),
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(item_schema)) = &schema.items {
                for (index, item) in items.iter().enumerate() {
                    collect_unknown(
                        item_schema,
                        item,
                        &format!("{path}[{index}]"),
                        false,
                        unknown,
                    );
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
    fn nested_descriptions_go_and_the_fields_own_stays() {
        let mut schema = schemars::Schema::try_from(json!({
            "description": "the field",
            "type": "object",
            "properties": {
                "image": {"description": "nested", "type": "string"},
                "env": {"type": "array", "items": {"description": "nested too", "type": "object"}}
            }
        }))
        .expect("a schema object");
        drop_nested_descriptions(&mut schema);
        assert_eq!(
            schema.as_value(),
            &json!({
                "description": "the field",
                "type": "object",
                "properties": {
                    "image": {"type": "string"},
                    "env": {"type": "array", "items": {"type": "object"}}
                }
            })
        );
    }
}
