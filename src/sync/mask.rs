//! Secret values never reach a plan, a log, a status or a record: every object body shown
//! goes through [`mask_pair`] before it is diffed, and every text that may echo a value (a
//! diff computed elsewhere, an API server's refusal) through [`Scrub`].
//!
//! A Secret's `data` and `stringData` are masked key by key when they are maps and whole
//! when they are anything else; the `kubectl.kubernetes.io/last-applied-configuration`
//! annotation is masked on every object (it may hold a Secret's values, and it only repeats
//! what the object declares).

use base64::Engine as _;
use serde_json::Value;

use serde_json::json;

/// The annotation `kubectl apply` keeps the whole applied object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What the last-applied annotation shows instead of its value.
pub const LAST_APPLIED_MASK: &str = "(masked: may hold a Secret's values)";

/// What a Secret's `data` or `stringData` that is not a map shows instead.
pub const SECTION_MASK: &str = "***** (masked)";

/// What a value quoted in a text shows instead.
const VALUE_MASK: &str = "*****";

/// Shorter values are not looked for in texts (they would mask unrelated words).
const MIN_QUOTED: usize = 4;

/// The two sides of a change with every Secret value masked: [`mask_secrets`] for maps,
/// then whatever it leaves (non-map sections, the last-applied annotation).
pub fn mask_pair(before: &Value, after: &Value) -> (Value, Value) {
    let (mut before, mut after) = mask_secrets(before, after);
    mask_rest(&mut before);
    mask_rest(&mut after);
    (before, after)
}

/// Secret values replaced by a mask that still shows which keys changed. Either side may
/// be `Null` (an object created or pruned).
fn mask_secrets(before: &Value, after: &Value) -> (Value, Value) {
    let is_secret = |object: &Value| object.get("kind").and_then(Value::as_str) == Some("Secret");
    if !is_secret(before) && !is_secret(after) {
        return (before.clone(), after.clone());
    }
    let (mut before, mut after) = (before.clone(), after.clone());
    for section in ["data", "stringData"] {
        let old = before.get(section).cloned().unwrap_or(Value::Null);
        let new = after.get(section).cloned().unwrap_or(Value::Null);
        let mask = |values: &Value, other: &Value, side: &str| -> Value {
            let Some(map) = values.as_object() else {
                return values.clone();
            };
            map.iter()
                .map(|(k, v)| {
                    let changed = other.get(k) != Some(v);
                    let shown = if changed {
                        format!("***** ({side})")
                    } else {
                        "*****".to_string()
                    };
                    (k.clone(), json!(shown))
                })
                .collect::<serde_json::Map<String, Value>>()
                .into()
        };
        if before.get(section).is_some() {
            before[section] = mask(&old, &new, "before");
        }
        if after.get(section).is_some() {
            after[section] = mask(&new, &old, "after");
        }
    }
    (before, after)
}

fn is_secret(object: &Value) -> bool {
    object.get("kind").and_then(Value::as_str) == Some("Secret")
}

fn mask_rest(object: &mut Value) {
    if is_secret(object) {
        for section in ["data", "stringData"] {
            if let Some(values) = object.get_mut(section)
                && !values.is_object()
                && !values.is_null()
            {
                *values = Value::String(SECTION_MASK.to_string());
            }
        }
    }
    if let Some(annotations) = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
        && let Some(value) = annotations.get_mut(LAST_APPLIED)
    {
        *value = Value::String(LAST_APPLIED_MASK.to_string());
    }
}

/// The values a set of objects must never show in a text: every string under a Secret's
/// `data` or `stringData` (whatever its shape), decoded from base64 too, and every
/// last-applied annotation with the strings inside it.
#[derive(Debug, Default)]
pub struct Scrub {
    values: Vec<String>,
}

impl Scrub {
    /// The values of `objects`.
    pub fn of<'a>(objects: impl IntoIterator<Item = &'a Value>) -> Scrub {
        let mut values = Vec::new();
        for object in objects {
            secret_values(object, &mut values);
        }
        let decoded: Vec<String> = values
            .iter()
            .filter_map(|v| {
                base64::engine::general_purpose::STANDARD
                    .decode(v.trim())
                    .ok()
            })
            .filter_map(|bytes| String::from_utf8(bytes).ok())
            .collect();
        values.extend(decoded);
        values.retain(|v| v.trim().len() >= MIN_QUOTED);
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Scrub { values }
    }

    /// `text` with every value masked, and the last-applied annotation's lines of a YAML
    /// diff masked as [`mask_pair`] masks it.
    pub fn text(&self, text: &str) -> String {
        let mut shown = mask_last_applied_lines(text);
        for value in &self.values {
            shown = shown.replace(value.as_str(), VALUE_MASK);
        }
        shown
    }
}

/// The values of a Secret (`object`, or the objects its last-applied annotation or a
/// List's `items` hold).
fn secret_values(object: &Value, out: &mut Vec<String>) {
    if is_secret(object) {
        for section in ["data", "stringData"] {
            if let Some(section) = object.get(section) {
                strings_in(section, out);
            }
        }
    }
    if let Some(items) = object.get("items").and_then(Value::as_array) {
        items.iter().for_each(|item| secret_values(item, out));
    }
    if let Some(annotation) = object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(LAST_APPLIED))
    {
        match annotation.as_str() {
            Some(text) => {
                out.push(text.to_string());
                if let Ok(inner) = serde_json::from_str::<Value>(text) {
                    secret_values(&inner, out);
                }
            }
            None => {
                out.push(annotation.to_string());
                secret_values(annotation, out);
            }
        }
    }
}

fn strings_in(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Number(n) => out.push(n.to_string()),
        Value::Array(items) => items.iter().for_each(|item| strings_in(item, out)),
        Value::Object(map) => map.values().for_each(|item| strings_in(item, out)),
        Value::Bool(_) | Value::Null => {}
    }
}

/// A unified diff of YAML (or plain YAML) with the last-applied annotation's value, on
/// its line and any continuation lines, replaced by [`LAST_APPLIED_MASK`].
fn mask_last_applied_lines(text: &str) -> String {
    let mut out = Vec::new();
    let mut masked_indent: Option<usize> = None;
    for line in text.split_inclusive('\n') {
        let (prefix, body) = diff_prefix(line);
        let indent = body.len() - body.trim_start().len();
        if let Some(key_indent) = masked_indent {
            let trimmed = body.trim();
            let continues = !line.starts_with("@@")
                && !line.starts_with("---")
                && !line.starts_with("+++")
                && (trimmed.is_empty() || indent > key_indent);
            if continues {
                continue;
            }
            masked_indent = None;
        }
        let key = body.trim_start();
        let key = key.trim_start_matches(['"', '\'']);
        if key.starts_with(LAST_APPLIED) && !line.starts_with("---") && !line.starts_with("+++") {
            let newline = if line.ends_with('\n') { "\n" } else { "" };
            out.push(format!(
                "{prefix}{}{LAST_APPLIED}: {LAST_APPLIED_MASK}{newline}",
                &body[..indent]
            ));
            masked_indent = Some(indent);
        } else {
            out.push(line.to_string());
        }
    }
    out.concat()
}

/// A diff line's marker (` `, `-`, `+`) and the rest; plain YAML has none.
fn diff_prefix(line: &str) -> (&str, &str) {
    match line.chars().next() {
        Some(c @ (' ' | '-' | '+')) if !line.starts_with("---") && !line.starts_with("+++") => {
            line.split_at(c.len_utf8())
        }
        _ => ("", line),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::diff::{unified, unified_between};
    use serde_json::json;

    const VALUE: &str = "hunter2-secret";
    const ENCODED: &str = "aHVudGVyMi1zZWNyZXQ="; // base64 of VALUE

    #[test]
    fn secret_values_are_masked_but_changes_show() {
        let before = json!({"kind": "Secret", "data": {"same": "YQ==", "changed": "Yg=="}});
        let after = json!({"kind": "Secret", "data": {"same": "YQ==", "changed": "Yw=="}});
        let (b, a) = mask_secrets(&before, &after);
        assert_eq!(
            b["data"],
            json!({"same": "*****", "changed": "***** (before)"})
        );
        assert_eq!(
            a["data"],
            json!({"same": "*****", "changed": "***** (after)"})
        );
        let diff = unified(&b, &a);
        assert!(
            diff.contains("-  changed: \"***** (before)\"")
                && diff.contains("+  changed: \"***** (after)\""),
            "{diff}"
        );
        assert!(!diff.contains("Yg==") && !diff.contains("Yw=="));
    }

    #[test]
    fn secrets_created_or_pruned_are_masked_too() {
        let secret = json!({"kind": "Secret", "data": {"token": "c2VjcmV0"}});
        let (_, created) = mask_secrets(&Value::Null, &secret);
        assert_eq!(created["data"], json!({"token": "***** (after)"}));
        let (pruned, _) = mask_secrets(&secret, &Value::Null);
        assert_eq!(pruned["data"], json!({"token": "***** (before)"}));
        let diff = unified_between(&pruned, &Value::Null, "base", "head");
        assert!(diff.starts_with("--- base\n+++ head\n"), "{diff}");
        assert!(!diff.contains("c2VjcmV0"), "{diff}");
    }

    fn secret(section: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "s", "namespace": "default"}, "data": section})
    }

    fn last_applied(kind: &str, holding: &Value) -> Value {
        json!({"apiVersion": "v1", "kind": kind,
               "metadata": {"name": "o", "namespace": "default",
                            "annotations": {LAST_APPLIED: holding.to_string(), "keep": "me"}},
               "data": {"k": "v"}})
    }

    fn hostile_objects() -> Vec<(&'static str, Value)> {
        let held = secret(json!({"token": ENCODED}));
        vec![
            ("data map", secret(json!({"token": ENCODED}))),
            ("data string", secret(json!(ENCODED))),
            ("data list", secret(json!([ENCODED, VALUE]))),
            ("data nested", secret(json!({"token": {"inner": VALUE}}))),
            ("data number", secret(json!(1234567890))),
            (
                "stringData string",
                json!({"apiVersion": "v1", "kind": "Secret",
                       "metadata": {"name": "s"}, "stringData": VALUE}),
            ),
            (
                "last-applied on a ConfigMap",
                last_applied("ConfigMap", &held),
            ),
            ("last-applied on the Secret", {
                let mut s = last_applied("Secret", &held);
                s["data"] = json!({"token": ENCODED});
                s
            }),
            (
                "last-applied not a string",
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "o", "annotations": {LAST_APPLIED: {"v": VALUE}}}}),
            ),
        ]
    }

    #[test]
    fn no_secret_value_survives_masking() {
        for (case, object) in hostile_objects() {
            for (before, after) in [
                (Value::Null, object.clone()),
                (object.clone(), Value::Null),
                (object.clone(), secret(json!({"token": "b3RoZXI="}))),
            ] {
                let (b, a) = mask_pair(&before, &after);
                let shown = format!("{}\n{}\n{}", unified(&b, &a), b, a);
                for leaked in [VALUE, ENCODED, "1234567890"] {
                    assert!(!shown.contains(leaked), "{case}: {shown}");
                }
            }
        }
    }

    #[test]
    fn what_is_not_secret_still_shows() {
        let (_, after) = mask_pair(&Value::Null, &last_applied("ConfigMap", &json!({})));
        assert_eq!(after["metadata"]["annotations"]["keep"], "me");
        assert_eq!(
            after["metadata"]["annotations"][LAST_APPLIED],
            LAST_APPLIED_MASK
        );
        assert_eq!(after["data"]["k"], "v");
    }

    #[test]
    fn texts_quoting_values_are_scrubbed() {
        let objects: Vec<Value> = hostile_objects().into_iter().map(|(_, o)| o).collect();
        let scrub = Scrub::of(&objects);
        let texts = [
            format!("the API server refuses Secret default/s: illegal base64 data {ENCODED}"),
            format!("cannot decode '{VALUE}'"),
            // A diff computed from unmasked objects, as another module may render it.
            unified(&Value::Null, &objects[6]),
            unified(&objects[7], &Value::Null),
        ];
        for text in texts {
            let shown = scrub.text(&text);
            assert!(
                !shown.contains(VALUE) && !shown.contains(ENCODED),
                "{shown}"
            );
        }
        let diff = scrub.text(&unified(&Value::Null, &objects[6]));
        assert!(diff.contains(LAST_APPLIED_MASK), "{diff}");
        assert!(diff.contains("keep: me"), "{diff}");
    }
}
