//! The options each verb takes, as the HTTP layer parses them from the query and body.

use serde_json::{Map, Value};

use crate::field_validation::FieldValidation;
use crate::pointer::Pointer;
use crate::selector::{FieldSelector, LabelSelector};

/// The body of a PATCH, by content type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

/// Options every write verb takes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: run every step but the write.
    pub dry_run: bool,
    /// `fieldManager`, or the manager derived from the client's user agent.
    pub field_manager: Option<String>,
    /// `force` for server-side apply.
    pub force: bool,
    /// The manager recorded when the client names none (upstream: the user agent's program name).
    pub default_manager: Option<String>,
    /// `fieldValidation`: what to do with fields the kind does not know (see
    /// [`field_validation`](crate::field_validation)).
    pub field_validation: FieldValidation,
    /// Check that a built-in kind's object decodes as its type, as kube-apiserver decodes
    /// every body (400 naming the field otherwise, see [`typed`](crate::typed)). The HTTP layer sets it
    /// for every client's write; the simulation's own writes, made from its types, skip
    /// the cost.
    pub check_types: bool,
}

/// `propagationPolicy` of a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

/// Options of a delete.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub dry_run: bool,
    pub grace_period_seconds: Option<i64>,
    pub propagation: Option<Propagation>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

/// Selection and paging of a list or watch.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub label_selector: Option<LabelSelector>,
    pub field_selector: Option<FieldSelector>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

impl ListOptions {
    /// Whether a selector filters the list.
    pub fn filters(&self) -> bool {
        self.label_selector.is_some() || self.field_selector.is_some()
    }

    /// Whether an object (by its projection) is selected.
    pub fn selects(&self, projection: &Value) -> bool {
        let labels = projection.at("/metadata/labels").and_then(Value::as_object);
        let empty = Map::new();
        self.label_selector
            .as_ref()
            .is_none_or(|s| s.matches(labels.unwrap_or(&empty)))
            && self
                .field_selector
                .as_ref()
                .is_none_or(|s| s.matches(projection))
    }
}
