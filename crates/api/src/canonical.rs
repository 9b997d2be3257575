//! Canonical JSON: object keys sorted and no whitespace, as Go's encoding/json writes
//! maps. A stable form for hashing (the digests of applied objects and of worker
//! configurations) and for showing values whatever order fields came in.

use serde_json::Value;

/// A copy of `value` with every object's keys sorted.
pub fn sorted_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_keys(&map[k])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// The canonical bytes of `value`.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    // Serialising a Value cannot fail: its keys are strings.
    serde_json::to_vec(&sorted_keys(value)).unwrap_or_default()
}

/// The digest of an object: the first 16 hexadecimal digits of the SHA-256 of
/// its canonical JSON (sorted keys), so key order in the file does not matter.
pub fn digest(object: &Value) -> String {
    sha256_hex(&canonical_json(object), 8)
}

/// The first `bytes` bytes of the SHA-256 of `data`, in hexadecimal.
pub fn sha256_hex(data: &[u8], bytes: usize) -> String {
    let hash = ring::digest::digest(&ring::digest::SHA256, data);
    hash.as_ref()[..bytes]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn digest_ignores_key_order_and_sees_values() {
        let a =
            json!({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1", "y": "2"}});
        let b =
            json!({"data": {"y": "2", "x": "1"}, "metadata": {"name": "a"}, "kind": "ConfigMap"});
        let c =
            json!({"kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"x": "1", "y": "3"}});
        assert_eq!(digest(&a), digest(&b));
        assert_ne!(digest(&a), digest(&c));
        assert_eq!(digest(&a).len(), 16);
    }

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"b": 1, "a": {"d": [{"z": 1, "y": 2}], "c": null}});
        let b = json!({"a": {"c": null, "d": [{"y": 2, "z": 1}]}, "b": 1});
        assert_eq!(canonical_json(&a), canonical_json(&b));
        assert_eq!(
            String::from_utf8(canonical_json(&a)).expect("utf8"),
            r#"{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}"#
        );
    }
}
