//! `authorization.k8s.io/v1` `selfsubjectaccessreviews` (create): "may I do this?", as
//! `kubectl auth can-i` and capstan's permission check ask it. The embedded cluster has no
//! authorization (whoever holds its token may do everything), so every review is answered
//! allowed, with a reason saying so. Nothing is stored, as upstream stores no review.

use serde_json::{Value, json};

use super::errors::ApiError;

/// Why every review is allowed.
pub const REASON: &str =
    "the embedded cluster has no authorization: every authenticated request is allowed";

/// The answer to a review `body` (JSON): the review with its `status`.
pub fn answer(body: &[u8]) -> Result<Value, ApiError> {
    let mut review: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("a SelfSubjectAccessReview: {err}")))?;
    let spec = review.get("spec").and_then(Value::as_object);
    let asks = spec.is_some_and(|spec| {
        spec.contains_key("resourceAttributes") || spec.contains_key("nonResourceAttributes")
    });
    if !asks {
        return Err(ApiError::invalid(
            "SelfSubjectAccessReview",
            "",
            &[(
                "spec.resourceAttributes".to_string(),
                "Required value: exactly one of nonResourceAttributes or resourceAttributes must be specified".to_string(),
            )],
        ));
    }
    review["apiVersion"] = json!("authorization.k8s.io/v1");
    review["kind"] = json!("SelfSubjectAccessReview");
    if !review["metadata"].is_object() {
        review["metadata"] = json!({});
    }
    review["status"] = json!({"allowed": true, "reason": REASON});
    Ok(review)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_review_is_allowed_with_the_reason() {
        let cases: &[(&str, Result<Value, u16>)] = &[
            (
                r#"{"apiVersion":"authorization.k8s.io/v1","kind":"SelfSubjectAccessReview","metadata":{},
                    "spec":{"resourceAttributes":{"group":"","resource":"pods","subresource":"eviction","verb":"create"}}}"#,
                Ok(json!({
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "metadata": {},
                    "spec": {"resourceAttributes": {"group": "", "resource": "pods",
                                                    "subresource": "eviction", "verb": "create"}},
                    "status": {"allowed": true, "reason": REASON},
                })),
            ),
            (
                r#"{"spec":{"nonResourceAttributes":{"path":"/metrics","verb":"get"}}}"#,
                Ok(json!({
                    "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                    "metadata": {},
                    "spec": {"nonResourceAttributes": {"path": "/metrics", "verb": "get"}},
                    "status": {"allowed": true, "reason": REASON},
                })),
            ),
            (r#"{"spec":{}}"#, Err(422)),
            ("not json", Err(400)),
        ];
        for (body, expected) in cases {
            let got = answer(body.as_bytes()).map_err(|err| err.code);
            assert_eq!(&got, expected, "{body}");
        }
    }
}
