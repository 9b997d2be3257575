//! JSON Pointer lookups (RFC 6901) that allocate nothing.
//!
//! serde_json's `Value::pointer` unescapes every token of the pointer into two new
//! `String`s before it looks the token up. The embedded cluster looks up a few fields of
//! every object it writes, watches and simulates, so those allocations sit on its busiest
//! paths. [`Pointer::at`] answers exactly what `pointer` does, and only unescapes a token
//! that has a `~` in it.

use serde_json::Value;

/// [`Value::pointer`], without allocating.
pub trait Pointer {
    /// The value `pointer` (`""`, or `/`-separated tokens with `~1` for `/` and `~0` for
    /// `~`) refers to, as [`Value::pointer`] finds it.
    fn at(&self, pointer: &str) -> Option<&Value>;
}

impl Pointer for Value {
    fn at(&self, pointer: &str) -> Option<&Value> {
        if pointer.is_empty() {
            return Some(self);
        }
        let tokens = pointer.strip_prefix('/')?;
        let mut target = self;
        for token in tokens.split('/') {
            let unescaped;
            let token = if token.contains('~') {
                unescaped = token.replace("~1", "/").replace("~0", "~");
                unescaped.as_str()
            } else {
                token
            };
            target = match target {
                Value::Object(map) => map.get(token)?,
                Value::Array(list) => list.get(index(token)?)?,
                _ => return None,
            };
        }
        Some(target)
    }
}

/// The value of label `key` of `object`, when it is a string.
pub fn label<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object.get("metadata")?.get("labels")?.get(key)?.as_str()
}

/// The value of annotation `key` of `object`, when it is a string.
pub fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(key)?
        .as_str()
}

/// An array index as a pointer token spells it: digits, with no sign and no leading zero.
fn index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lookups_find_what_serde_jsons_pointer_finds() {
        let value = json!({
            "metadata": {
                "name": "n1",
                "labels": {"kmm.node.kubernetes.io/a.ready": "", "x~y": "tilde", "~1": "both"},
                "": {"empty": true},
            },
            "spec": {"containers": [{"name": "c0"}, {"name": "c1"}]},
            "status": null,
        });
        for pointer in [
            "",
            "/",
            "/metadata",
            "/metadata/name",
            "/metadata/name/deeper",
            "/metadata/labels/kmm.node.kubernetes.io~1a.ready",
            "/metadata/labels/kmm.node.kubernetes.io/a.ready",
            "/metadata/labels/x~0y",
            "/metadata/labels/~01",
            "/metadata/labels/~1",
            "/metadata//empty",
            "/metadata/",
            "/spec/containers/0/name",
            "/spec/containers/1/name",
            "/spec/containers/2/name",
            "/spec/containers/01/name",
            "/spec/containers/+1/name",
            "/spec/containers/-1/name",
            "/spec/containers/name",
            "/status",
            "/status/phase",
            "metadata",
            "/missing",
        ] {
            assert_eq!(value.at(pointer), value.pointer(pointer), "{pointer:?}");
        }
        assert_eq!(label(&value, "kmm.node.kubernetes.io/a.ready"), Some(""));
        assert_eq!(label(&value, "x~y"), Some("tilde"));
        assert_eq!(label(&value, "missing"), None);
        assert_eq!(annotation(&value, "x~y"), None);
        let annotated = json!({"metadata": {"annotations": {"a/b": "c", "n": 1}}});
        assert_eq!(annotation(&annotated, "a/b"), Some("c"));
        assert_eq!(annotation(&annotated, "n"), None);
    }
}
