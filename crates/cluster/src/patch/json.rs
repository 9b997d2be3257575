//! JSON patch (RFC 6902, `application/json-patch+json`).

use json_patch::{Patch, PatchErrorKind, PatchOperation};
use serde_json::Value;

use super::error::PatchError;

/// Applies an RFC 6902 JSON patch to a copy of `target` and returns the patched copy.
///
/// Fails with [`PatchError::Malformed`] when `patch` is not a list of well-formed operations
/// (unknown `op`, a missing field, a `path` that is not a JSON pointer), and with
/// [`PatchError::Rejected`] when an operation does not apply to the document (a path that
/// does not exist, a failed `test`). Operations apply all or nothing.
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let operations: Patch =
        serde_json::from_value(patch.clone()).map_err(|error| PatchError::Malformed {
            path: String::new(),
            reason: format!("error decoding patch: {error}"),
        })?;
    let mut patched = target.clone();
    json_patch::patch(&mut patched, &operations).map_err(|error| rejection(&operations, &error))?;
    Ok(patched)
}

fn rejection(operations: &Patch, error: &json_patch::PatchError) -> PatchError {
    let path = error.path.as_str().to_owned();
    let operation = operations.get(error.operation);
    let name = operation.map_or("unknown", operation_name);
    let from = operation.and_then(from_path).unwrap_or_default();
    let failure = match &error.kind {
        PatchErrorKind::TestFailed => format!("testing value {path} failed: test failed"),
        PatchErrorKind::InvalidPointer => {
            format!("{name} operation does not apply: doc is missing path: {path}")
        }
        PatchErrorKind::InvalidFromPointer => {
            format!("{name} operation does not apply: doc is missing from path: {from}")
        }
        PatchErrorKind::CannotMoveInsideItself => {
            format!("move operation does not apply: cannot move {from} into its own child {path}")
        }
        other => format!("{name} operation does not apply at {path}: {other}"),
    };
    PatchError::Rejected {
        reason: format!("operation {} failed: {failure}", error.operation),
        path,
    }
}

fn operation_name(operation: &PatchOperation) -> &'static str {
    match operation {
        PatchOperation::Add(_) => "add",
        PatchOperation::Remove(_) => "remove",
        PatchOperation::Replace(_) => "replace",
        PatchOperation::Move(_) => "move",
        PatchOperation::Copy(_) => "copy",
        PatchOperation::Test(_) => "test",
    }
}

fn from_path(operation: &PatchOperation) -> Option<&str> {
    match operation {
        PatchOperation::Move(op) => Some(op.from.as_str()),
        PatchOperation::Copy(op) => Some(op.from.as_str()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What a case expects: the patched document, or the error variant and a message part.
    enum Expect {
        Patched(Value),
        Malformed(&'static str),
        Rejected(&'static str, &'static str),
    }

    struct Case {
        name: &'static str,
        target: Value,
        patch: Value,
        expect: Expect,
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
        })
    }

    #[test]
    fn json_patch_applies_rfc_6902_operations() {
        let cases = [
            Case {
                name: "add a label",
                target: pod(),
                patch: json!([{"op": "add", "path": "/metadata/labels/tier", "value": "front"}]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
                })),
            },
            Case {
                name: "add appends to a list with -",
                target: pod(),
                patch: json!([{"op": "add", "path": "/spec/containers/-",
                               "value": {"name": "side", "image": "busybox"}}]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"},
                                            {"name": "side", "image": "busybox"}]}
                })),
            },
            Case {
                name: "remove a label",
                target: pod(),
                patch: json!([{"op": "remove", "path": "/metadata/labels/app"}]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
                })),
            },
            Case {
                name: "replace an image",
                target: pod(),
                patch: json!([{"op": "replace", "path": "/spec/containers/0/image",
                               "value": "nginx:2"}]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:2"}]}
                })),
            },
            Case {
                name: "move a label to an annotation",
                target: pod(),
                patch: json!([
                    {"op": "add", "path": "/metadata/annotations", "value": {}},
                    {"op": "move", "from": "/metadata/labels/app",
                     "path": "/metadata/annotations/app"}
                ]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {}, "annotations": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
                })),
            },
            Case {
                name: "copy a label",
                target: pod(),
                patch: json!([{"op": "copy", "from": "/metadata/labels/app",
                               "path": "/metadata/labels/name"}]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "web", "labels": {"app": "web", "name": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
                })),
            },
            Case {
                name: "a passing test lets the rest apply",
                target: pod(),
                patch: json!([
                    {"op": "test", "path": "/metadata/name", "value": "web"},
                    {"op": "replace", "path": "/metadata/name", "value": "api"}
                ]),
                expect: Expect::Patched(json!({
                    "metadata": {"name": "api", "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "app", "image": "nginx:1"}]}
                })),
            },
            Case {
                name: "a failing test rejects the whole patch",
                target: pod(),
                patch: json!([
                    {"op": "replace", "path": "/metadata/name", "value": "api"},
                    {"op": "test", "path": "/metadata/labels/app", "value": "db"}
                ]),
                expect: Expect::Rejected(
                    "/metadata/labels/app",
                    "operation 1 failed: testing value",
                ),
            },
            Case {
                name: "removing a missing path is rejected",
                target: pod(),
                patch: json!([{"op": "remove", "path": "/metadata/annotations/x"}]),
                expect: Expect::Rejected("/metadata/annotations/x", "doc is missing path"),
            },
            Case {
                name: "replacing past the end of a list is rejected",
                target: pod(),
                patch: json!([{"op": "replace", "path": "/spec/containers/3/image",
                               "value": "x"}]),
                expect: Expect::Rejected("/spec/containers/3/image", "replace operation"),
            },
            Case {
                name: "moving from a missing path is rejected",
                target: pod(),
                patch: json!([{"op": "move", "from": "/metadata/nope", "path": "/metadata/x"}]),
                expect: Expect::Rejected("/metadata/x", "missing from path: /metadata/nope"),
            },
            Case {
                name: "a path that is not a JSON pointer is malformed",
                target: pod(),
                patch: json!([{"op": "remove", "path": "metadata/name"}]),
                expect: Expect::Malformed("error decoding patch"),
            },
            Case {
                name: "an unknown op is malformed",
                target: pod(),
                patch: json!([{"op": "frobnicate", "path": "/metadata/name"}]),
                expect: Expect::Malformed("error decoding patch"),
            },
            Case {
                name: "a patch that is not a list is malformed",
                target: pod(),
                patch: json!({"op": "remove", "path": "/metadata/name"}),
                expect: Expect::Malformed("error decoding patch"),
            },
        ];
        for case in cases {
            let outcome = json_patch(&case.target, &case.patch);
            match (case.expect, outcome) {
                (Expect::Patched(want), Ok(got)) => assert_eq!(got, want, "{}", case.name),
                (Expect::Malformed(part), Err(error)) => {
                    assert!(
                        matches!(error, PatchError::Malformed { .. })
                            && error.to_string().contains(part),
                        "{}: {error:?}",
                        case.name
                    );
                }
                (Expect::Rejected(at, part), Err(error)) => {
                    let PatchError::Rejected { path, .. } = &error else {
                        panic!("{}: unexpected {error:?}", case.name);
                    };
                    assert_eq!(path, at, "{}", case.name);
                    let message = error.to_string();
                    assert!(
                        message.starts_with(
                            "the server rejected our request due to an error in our request: "
                        ) && message.contains(part),
                        "{}: {message}",
                        case.name
                    );
                }
                (_, outcome) => panic!("{}: unexpected {outcome:?}", case.name),
            }
        }
    }
}
