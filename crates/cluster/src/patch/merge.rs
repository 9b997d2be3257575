//! JSON merge patch (RFC 7386, `application/merge-patch+json`).

use serde_json::{Map, Value};

/// Applies an RFC 7386 JSON merge patch to `target` in place: objects merge key by key,
/// `null` removes a key, and any other patch value replaces what it lands on. Keys keep
/// their order. Every JSON value is a valid merge patch, so this never fails.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(fields) = target {
        for (name, value) in patch_fields {
            if value.is_null() {
                fields.remove(name);
            } else {
                merge_patch(fields.entry(name.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Case {
        name: &'static str,
        target: Value,
        patch: Value,
        expected: Value,
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let cases = [
            // RFC 7386 section 3.
            Case {
                name: "section 3 example",
                target: json!({
                    "title": "Goodbye!",
                    "author": {"givenName": "John", "familyName": "Doe"},
                    "tags": ["example", "sample"],
                    "content": "This will be unchanged"
                }),
                patch: json!({
                    "title": "Hello!",
                    "phoneNumber": "+01-123-456-7890",
                    "author": {"familyName": null},
                    "tags": ["example"]
                }),
                expected: json!({
                    "title": "Hello!",
                    "author": {"givenName": "John"},
                    "tags": ["example"],
                    "content": "This will be unchanged",
                    "phoneNumber": "+01-123-456-7890"
                }),
            },
            // RFC 7386 appendix A, in order.
            Case {
                name: "A.1 replaces a value",
                target: json!({"a": "b"}),
                patch: json!({"a": "c"}),
                expected: json!({"a": "c"}),
            },
            Case {
                name: "A.2 adds a key",
                target: json!({"a": "b"}),
                patch: json!({"b": "c"}),
                expected: json!({"a": "b", "b": "c"}),
            },
            Case {
                name: "A.3 null removes the only key",
                target: json!({"a": "b"}),
                patch: json!({"a": null}),
                expected: json!({}),
            },
            Case {
                name: "A.4 null removes one key",
                target: json!({"a": "b", "b": "c"}),
                patch: json!({"a": null}),
                expected: json!({"b": "c"}),
            },
            Case {
                name: "A.5 a scalar replaces a list",
                target: json!({"a": ["b"]}),
                patch: json!({"a": "c"}),
                expected: json!({"a": "c"}),
            },
            Case {
                name: "A.6 a list replaces a scalar",
                target: json!({"a": "c"}),
                patch: json!({"a": ["b"]}),
                expected: json!({"a": ["b"]}),
            },
            Case {
                name: "A.7 nested objects merge",
                target: json!({"a": {"b": "c"}}),
                patch: json!({"a": {"b": "d", "c": null}}),
                expected: json!({"a": {"b": "d"}}),
            },
            Case {
                name: "A.8 lists are replaced whole",
                target: json!({"a": [{"b": "c"}]}),
                patch: json!({"a": [1]}),
                expected: json!({"a": [1]}),
            },
            Case {
                name: "A.9 a list patch replaces a list",
                target: json!(["a", "b"]),
                patch: json!(["c", "d"]),
                expected: json!(["c", "d"]),
            },
            Case {
                name: "A.10 a list patch replaces an object",
                target: json!({"a": "b"}),
                patch: json!(["c"]),
                expected: json!(["c"]),
            },
            Case {
                name: "A.11 a null patch replaces everything",
                target: json!({"a": "foo"}),
                patch: json!(null),
                expected: json!(null),
            },
            Case {
                name: "A.12 a scalar patch replaces everything",
                target: json!({"a": "foo"}),
                patch: json!("bar"),
                expected: json!("bar"),
            },
            Case {
                name: "A.13 nulls already in the target stay",
                target: json!({"e": null}),
                patch: json!({"a": 1}),
                expected: json!({"e": null, "a": 1}),
            },
            Case {
                name: "A.14 an object patch replaces a list and drops its nulls",
                target: json!([1, 2]),
                patch: json!({"a": "b", "c": null}),
                expected: json!({"a": "b"}),
            },
            Case {
                name: "A.15 nulls inside new objects are dropped",
                target: json!({}),
                patch: json!({"a": {"bb": {"ccc": null}}}),
                expected: json!({"a": {"bb": {}}}),
            },
        ];
        for case in cases {
            let mut target = case.target;
            merge_patch(&mut target, &case.patch);
            assert_eq!(target, case.expected, "{}", case.name);
        }
    }

    #[test]
    fn merge_patch_keeps_key_order() {
        let mut target = json!({"a": 1, "b": 2, "c": 3});
        merge_patch(&mut target, &json!({"a": null, "d": 4}));
        let keys: Vec<&String> = target.as_object().into_iter().flat_map(Map::keys).collect();
        assert_eq!(keys, ["b", "c", "d"]);
    }
}
