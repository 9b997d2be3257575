//! API errors as the Kubernetes API server reports them: a `Status` object whose code,
//! reason and message match upstream, so clients (kube, kubectl) react as they would.

use serde_json::{Value, json};

use super::resources::Resource;
use super::store::StoreError;

/// A failed request, rendered as a `meta/v1 Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    fn about(resource: &Resource, name: &str) -> Value {
        json!({"name": name, "group": resource.group, "kind": resource.plural})
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn not_found(resource: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", resource.group_resource()),
        )
        .with_details(Self::about(resource, name))
    }

    /// A path that names no served resource.
    pub fn no_such_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// A namespaced create in a namespace that does not exist.
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("namespaces \"{namespace}\" not found"),
        )
        .with_details(json!({"name": namespace, "kind": "namespaces"}))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn already_exists(resource: &Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", resource.group_resource()),
        )
        .with_details(Self::about(resource, name))
    }

    /// Optimistic concurrency: the client wrote from a stale resourceVersion.
    pub fn stale(resource: &Resource, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict(resource: &Resource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                resource.group_resource()
            ),
        )
        .with_details(Self::about(resource, name))
    }

    /// A conflict on `resource` of `group` named as upstream names a subresource's
    /// (`deployments/scale.apps`), which no served [`Resource`] is.
    pub fn conflict_on(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let group_resource = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {group_resource} \"{name}\": {why}"),
        )
        .with_details(json!({"name": name, "group": group, "kind": resource}))
    }

    /// Server-side apply conflicts, with one cause per conflicting field.
    pub fn apply_conflict(
        resource: &Resource,
        name: &str,
        message: String,
        causes: Vec<Value>,
    ) -> Self {
        let mut details = Self::about(resource, name);
        details["causes"] = json!(causes);
        Self::new(409, "Conflict", message).with_details(details)
    }

    /// A conflict injected by the fault settings, shaped like a stale write.
    pub fn stale_injected() -> Self {
        Self::new(
            409,
            "Conflict",
            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (injected fault)",
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    pub fn request_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than the {limit} bytes the server accepts"),
        )
    }

    /// A field failed validation: `Kind "name" is invalid: <field>: <reason>`.
    pub fn invalid(kind: &str, name: &str, causes: &[(String, String)]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|(f, why)| format!("{f}: {why}"))
            .collect();
        let message = match summary.as_slice() {
            [one] => format!("{kind} \"{name}\" is invalid: {one}"),
            many => format!("{kind} \"{name}\" is invalid: [{}]", many.join(", ")),
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|(field, why)| json!({"reason": "FieldValueInvalid", "message": why, "field": field}))
            .collect();
        Self::new(422, "Invalid", message)
            .with_details(json!({"name": name, "kind": kind, "causes": causes}))
    }

    pub fn too_many_requests(message: impl Into<String>, causes: Vec<Value>) -> Self {
        Self::new(429, "TooManyRequests", message).with_details(json!({"causes": causes}))
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A 500 in the words of upstream's `NewInternalError`: `Internal error occurred:
    /// <why>`, with `why` as the one cause.
    pub fn internal_error_occurred(why: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {why}"),
        )
        .with_details(json!({"causes": [{"message": why}]}))
    }

    /// The `Status` object for the response body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Gone {
                requested,
                compacted,
            } => ApiError::gone(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            StoreError::Persist(err) => ApiError::internal(err.to_string()),
        }
    }
}
