//! The walk every part of server-side apply shares: objects read along with the schema,
//! knowing the field names (for list types) and the field path (for field sets), and
//! how list items are identified.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::conflict::ServerSideApplyError;
use crate::patch::fieldset::{FieldSet, PathElement, path_text};
use crate::schema::{FieldSchema, ListType};

/// The identity of each item of a granular list, in order; fails on an item that is
/// not an object or lacks a key field of a keyed list.
pub(super) fn item_elements(
    list_type: &ListType,
    items: &[Value],
) -> Result<Vec<PathElement>, String> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item_element(list_type, item).map_err(|err| format!("element {index}: {err}"))
        })
        .collect()
}

fn item_element(list_type: &ListType, item: &Value) -> Result<PathElement, String> {
    let ListType::Map(keys) = list_type else {
        return Ok(PathElement::Value(item.clone()));
    };
    let Value::Object(fields) = item else {
        return Err(format!(
            "expected an object in an associative list, got {item}"
        ));
    };
    keys.iter()
        .map(|key| {
            fields
                .get(key)
                .filter(|value| !value.is_null())
                .cloned()
                .or_else(|| key_default(key))
                .map(|value| (key.clone(), value))
                .ok_or_else(|| {
                    format!(
                        "associative list with keys has an element that omits key field {key:?} \
                         (and doesn't have default value)"
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(PathElement::key)
}

/// The default of a key field, which upstream takes from the schema: every built-in
/// list keyed by `protocol` (container and service ports) defaults it to TCP.
fn key_default(key: &str) -> Option<Value> {
    (key == "protocol").then(|| json!("TCP"))
}

/// The first item element repeated in `elements`, if any.
pub(super) fn first_duplicate(elements: &[PathElement]) -> Option<&PathElement> {
    let mut seen = BTreeSet::new();
    elements.iter().find(|element| !seen.insert(*element))
}

/// Walks objects along with the schema, knowing where it is: field names for the
/// schema and the path for field sets.
pub(super) struct Walker<'s> {
    schema: &'s dyn FieldSchema,
    pub(super) names: Names,
    pub(super) path: Vec<PathElement>,
}

/// The field names from the root to where a walk is, for the schema: a stack whose
/// strings are kept when the walk goes up and written over when it goes down again, so
/// a step allocates nothing once the walk has been as deep before.
#[derive(Default)]
pub(super) struct Names {
    parts: Vec<String>,
    depth: usize,
}

impl Names {
    pub(super) fn push(&mut self, name: &str) {
        match self.parts.get_mut(self.depth) {
            Some(part) => {
                part.clear();
                part.push_str(name);
            }
            None => self.parts.push(name.to_string()),
        }
        self.depth += 1;
    }

    pub(super) fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn as_strs(&self) -> Vec<&str> {
        self.parts[..self.depth]
            .iter()
            .map(String::as_str)
            .collect()
    }
}

impl<'s> Walker<'s> {
    pub(super) fn new(schema: &'s dyn FieldSchema) -> Self {
        Walker {
            schema,
            names: Names::default(),
            path: Vec::new(),
        }
    }

    pub(super) fn in_field<R>(&mut self, name: &str, visit: impl FnOnce(&mut Self) -> R) -> R {
        self.names.push(name);
        self.path.push(PathElement::field(name));
        let result = visit(self);
        self.names.pop();
        self.path.pop();
        result
    }

    pub(super) fn in_item<R>(
        &mut self,
        element: PathElement,
        visit: impl FnOnce(&mut Self) -> R,
    ) -> R {
        self.path.push(element);
        let result = visit(self);
        self.path.pop();
        result
    }

    pub(super) fn list_type(&self) -> ListType {
        self.schema.list_type(&self.names.as_strs())
    }
}

impl Walker<'_> {
    /// The fields an apply configuration sets: every leaf, every item of a granular
    /// list, and empty objects. Fails on keyed list items without their key or repeated.
    pub(super) fn applied_fields(
        &mut self,
        config: &Value,
    ) -> Result<FieldSet, ServerSideApplyError> {
        let mut set = FieldSet::default();
        if let Value::Object(fields) = config {
            self.applied_object(fields, &mut set)?;
        }
        Ok(set)
    }

    fn applied_object(
        &mut self,
        fields: &Map<String, Value>,
        set: &mut FieldSet,
    ) -> Result<(), ServerSideApplyError> {
        for (name, value) in fields {
            self.in_field(name, |walker| walker.applied_value(value, set))?;
        }
        Ok(())
    }

    fn applied_value(
        &mut self,
        value: &Value,
        set: &mut FieldSet,
    ) -> Result<(), ServerSideApplyError> {
        match value {
            Value::Object(fields) if !fields.is_empty() => self.applied_object(fields, set),
            Value::Array(items) => self.applied_list(items, set),
            _ => {
                set.insert(&self.path);
                Ok(())
            }
        }
    }

    fn applied_list(
        &mut self,
        items: &[Value],
        set: &mut FieldSet,
    ) -> Result<(), ServerSideApplyError> {
        let list_type = self.list_type();
        if list_type == ListType::Atomic {
            set.insert(&self.path);
            return Ok(());
        }
        let invalid = |path: &[PathElement], reason: String| {
            ServerSideApplyError::Invalid(format!("{}: {reason}", path_text(path)))
        };
        let elements = item_elements(&list_type, items).map_err(|err| invalid(&self.path, err))?;
        if let Some(duplicate) = first_duplicate(&elements) {
            return Err(invalid(
                &self.path,
                format!("duplicate entries for key {duplicate}"),
            ));
        }
        for (element, item) in elements.into_iter().zip(items) {
            self.in_item(element, |walker| {
                set.insert(&walker.path);
                match item {
                    Value::Object(fields) if matches!(list_type, ListType::Map(_)) => {
                        walker.applied_object(fields, set)
                    }
                    _ => Ok(()),
                }
            })?;
        }
        Ok(())
    }
}
