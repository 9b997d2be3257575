//! `fieldValidation`: what a write does with the fields its kind does not know, as
//! kube-apiserver does. `Strict` refuses them, `Warn` (the default) drops them and names
//! each in a `Warning` header, `Ignore` drops them. A custom resource's unknown fields
//! are those its CRD's structural schema does not describe (`structural_prune`); a
//! built-in kind's are those its k8s-openapi type does not keep when the object is
//! decoded and encoded again, as kube-apiserver's strict decoder finds those its Go type
//! lacks. Server-side apply refuses them whatever the directive: upstream cannot build
//! the typed apply configuration.

use serde_json::Value;

use crate::errors::ApiError;
use crate::field::{self, BadValue, FieldError, go_float};
use crate::resources::Resource;

/// The `fieldValidation` directive of a write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    /// The directive of the query parameter `value` (absent or empty: `Warn`). Anything
    /// else is the 422 upstream gives, naming the verb's options (`CreateOptions`).
    pub fn parse(value: Option<&str>, options: &str) -> Result<Self, ApiError> {
        match value.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => {
                let supported: Vec<String> = ["", "Ignore", "Strict", "Warn"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                Err(field::invalid(
                    "meta.k8s.io",
                    options,
                    "",
                    &[FieldError::not_supported(
                        "fieldValidation",
                        BadValue::Text(other.to_string()),
                        &supported,
                    )],
                ))
            }
        }
    }

    /// What the write does with the `unknown` fields it dropped: with `Strict` and any
    /// unknown field, fails with `refusal`; otherwise the warnings to answer with (none
    /// for `Ignore`).
    pub fn settle(
        self,
        unknown: Vec<String>,
        refusal: impl FnOnce(&[String]) -> ApiError,
    ) -> Result<Vec<String>, ApiError> {
        match self {
            _ if unknown.is_empty() => Ok(Vec::new()),
            FieldValidation::Strict => Err(refusal(&unknown)),
            FieldValidation::Warn => Ok(unknown.iter().map(|path| unknown_field(path)).collect()),
            FieldValidation::Ignore => Ok(Vec::new()),
        }
    }
}

/// Removes from `object` every field `known` (the object as its type keeps it) lacks,
/// and returns their paths as upstream names them (`spec.containers[0].foo`). The
/// object's `apiVersion` and `kind` are the server's, and a `null` is left alone: the
/// type cannot tell a null it knows from one it does not.
pub fn drop_unknown(object: &mut Value, known: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    if let (Value::Object(fields), Value::Object(known_fields)) = (object, known) {
        let mut dropped = Vec::new();
        for (name, value) in fields.iter_mut() {
            if matches!(name.as_str(), "apiVersion" | "kind") {
                continue;
            }
            match known_fields.get(name) {
                Some(known_value) => walk(value, known_value, name, &mut unknown),
                None if value.is_null() => {}
                None => {
                    unknown.push(name.clone());
                    dropped.push(name.clone());
                }
            }
        }
        for name in dropped {
            fields.remove(&name);
        }
    }
    unknown
}

fn walk(value: &mut Value, known: &Value, path: &str, unknown: &mut Vec<String>) {
    match (value, known) {
        (Value::Object(fields), Value::Object(known_fields)) => {
            let mut dropped = Vec::new();
            for (name, child) in fields.iter_mut() {
                let child_path = format!("{path}.{name}");
                match known_fields.get(name) {
                    Some(known_child) => walk(child, known_child, &child_path, unknown),
                    None if child.is_null() => {}
                    None => {
                        unknown.push(child_path);
                        dropped.push(name.clone());
                    }
                }
            }
            for name in dropped {
                fields.remove(&name);
            }
        }
        (Value::Array(items), Value::Array(known_items)) => {
            for (i, (item, known_item)) in items.iter_mut().zip(known_items).enumerate() {
                walk(item, known_item, &format!("{path}[{i}]"), unknown);
            }
        }
        _ => {}
    }
}

/// `unknown field "spec.foo"`: one strict decoding error, and the text of its warning.
fn unknown_field(path: &str) -> String {
    format!("unknown field {}", field::go_quote(path))
}

/// `strict decoding error: unknown field "spec.foo", unknown field "spec.bar"`.
fn strict_decoding_error(unknown: &[String]) -> String {
    let fields: Vec<String> = unknown.iter().map(|path| unknown_field(path)).collect();
    format!("strict decoding error: {}", fields.join(", "))
}

/// A create or update body with unknown fields under `Strict`: the 400 upstream's decoder
/// gives, ``Pod in version "v1" cannot be handled as a Pod: strict decoding error: ...``.
pub fn refused_body(resource: &Resource, unknown: &[String]) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version {version} cannot be handled as a {kind}: {}",
        strict_decoding_error(unknown),
        kind = resource.kind,
        version = field::go_quote(&resource.version),
    ))
}

/// A JSON, merge or strategic merge patch whose result has unknown fields under
/// `Strict`: upstream's 422 on the field `patch`, showing `shown` (the patched object for
/// JSON and merge patches, the patch as Go prints a map for strategic ones).
pub fn refused_patch(shown: &str, unknown: &[String]) -> ApiError {
    field::invalid(
        "",
        "",
        "",
        &[FieldError::invalid(
            "patch",
            BadValue::Text(shown.to_string()),
            strict_decoding_error(unknown),
        )],
    )
}

/// An apply configuration with unknown fields: the error upstream's field manager gives
/// when it cannot type the configuration, ``failed to create typed patch object
/// (default/m; kmm.sigs.x-k8s.io/v1beta1, Kind=Module): .spec.foo: field not declared in
/// schema``. kube-apiserver 1.36 answers it with a 500 (kubernetes#139253, a fix in
/// review makes it the 400 it is here).
pub fn refused_apply(
    resource: &Resource,
    namespace: &str,
    name: &str,
    unknown: &[String],
) -> ApiError {
    let errors: Vec<String> = unknown
        .iter()
        .map(|path| format!(".{path}: field not declared in schema"))
        .collect();
    let errors = match errors.as_slice() {
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    let namespace = if resource.namespaced { namespace } else { "" };
    ApiError::bad_request(format!(
        "failed to create typed patch object ({namespace}/{name}; {}/{}, Kind={}): {errors}",
        resource.group, resource.version, resource.kind
    ))
}

/// `value` as Go's `%+v` prints a decoded JSON value: how upstream shows a strategic
/// merge patch in its errors (`map[spec:map[foo:1]]`).
pub fn go_map(value: &Value) -> String {
    match value {
        Value::Object(fields) => {
            let entries: Vec<String> = fields
                .iter()
                .map(|(name, child)| format!("{name}:{}", go_map(child)))
                .collect();
            format!("map[{}]", entries.join(" "))
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(go_map).collect();
            format!("[{}]", items.join(" "))
        }
        Value::String(text) => text.clone(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.to_string(),
            None => go_float(n.as_f64().unwrap_or(0.0)),
        },
        Value::Bool(b) => b.to_string(),
        Value::Null => "<nil>".to_string(),
    }
}

/// The `Warning` header that carries `text`: code 299, no agent, the text quoted.
pub fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn directives_parse_as_upstream_reads_them() {
        assert_eq!(
            FieldValidation::parse(None, "CreateOptions").ok(),
            Some(FieldValidation::Warn)
        );
        assert_eq!(
            FieldValidation::parse(Some(""), "CreateOptions").ok(),
            Some(FieldValidation::Warn)
        );
        assert_eq!(
            FieldValidation::parse(Some("Strict"), "PatchOptions").ok(),
            Some(FieldValidation::Strict)
        );
        assert_eq!(
            FieldValidation::parse(Some("Ignore"), "UpdateOptions").ok(),
            Some(FieldValidation::Ignore)
        );
        let err = FieldValidation::parse(Some("strict"), "CreateOptions").expect_err("unknown");
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"strict\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
        );
    }

    /// Strict refuses, Warn names each field, Ignore says nothing; no unknown field is
    /// never a refusal.
    #[test]
    fn each_directive_settles_unknown_fields_its_way() {
        let unknown = || vec!["spec.foo".to_string()];
        let refuse = |_: &[String]| ApiError::bad_request("refused");
        assert!(FieldValidation::Strict.settle(unknown(), refuse).is_err());
        assert_eq!(
            FieldValidation::Warn.settle(unknown(), refuse).ok(),
            Some(vec!["unknown field \"spec.foo\"".to_string()])
        );
        assert_eq!(
            FieldValidation::Ignore.settle(unknown(), refuse).ok(),
            Some(vec![])
        );
        assert_eq!(
            FieldValidation::Strict.settle(vec![], refuse).ok(),
            Some(vec![])
        );
    }

    #[test]
    fn fields_the_type_does_not_keep_are_dropped_and_named() {
        let mut object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "bogus": 1},
            "spec": {"foo": true, "nodeName": null, "typo": null,
                     "containers": [{"name": "a", "image": "i", "imagePullPolciy": "Always"}]}});
        let known = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "a", "image": "i"}]}});
        let unknown = drop_unknown(&mut object, &known);
        assert_eq!(
            unknown,
            [
                "metadata.bogus",
                "spec.containers[0].imagePullPolciy",
                "spec.foo"
            ]
        );
        assert_eq!(
            object,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"nodeName": null, "typo": null,
                            "containers": [{"name": "a", "image": "i"}]}})
        );
    }

    #[test]
    fn refusals_read_as_upstream_words_them() {
        let unknown = ["spec.foo".to_string(), "spec.bar".to_string()];
        let patch = refused_patch(
            &go_map(&json!({"spec": {"foo": 1, "bar": [true, null]}})),
            &unknown,
        );
        assert_eq!(patch.code, 422);
        assert_eq!(
            patch.message,
            " \"\" is invalid: patch: Invalid value: \"map[spec:map[bar:[true <nil>] foo:1]]\": strict decoding error: unknown field \"spec.foo\", unknown field \"spec.bar\""
        );
        assert_eq!(
            warning_header("unknown field \"spec.foo\""),
            "299 - \"unknown field \\\"spec.foo\\\"\""
        );
    }
}
