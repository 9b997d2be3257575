//! Why a PATCH body could not be applied to an object.

use serde_json::Value;

/// A patch that could not be applied. `path` is a JSON pointer (RFC 6901) into the object
/// being patched; it is empty when the problem concerns the whole document.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The body is not a patch of its content type: a strategic merge patch that is not a
    /// JSON object, a JSON patch that is not a list of operations, or a directive of the
    /// wrong shape. Upstream answers these with 400 Bad Request.
    #[error("{reason}{}", located(.path))]
    Malformed {
        /// Where in the object the malformed part applies.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A well-formed strategic merge patch that does not fit the object, such as a list
    /// item without its merge key. Upstream answers these with 422 (a few with 500).
    #[error("{reason}{}", located(.path))]
    Invalid {
        /// Where in the object the patch does not fit.
        path: String,
        /// Why it does not fit.
        reason: String,
    },
    /// A JSON patch operation that does not apply to the object: its path is missing or
    /// its `test` failed. Upstream answers 422 with the message this one starts with.
    #[error("the server rejected our request due to an error in our request: {reason}")]
    Rejected {
        /// The path of the failing operation.
        path: String,
        /// Which operation failed and how.
        reason: String,
    },
}

fn located(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" at {path}")
    }
}

/// A JSON value's type, as messages name it: "null", "a list", "a map"...
pub fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}
