//! How objects are shown to a client, as its `Accept` header asks: as stored, as
//! kubectl's `Table`, or as metadata only. Responses and watch events both render
//! through here.

use serde_json::{Value, json};

use super::api::Api;
use super::resources::Resource;
use super::table::{IncludeObject, TableKind, to_table};

/// How objects are shown in responses and events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    Object,
    Table,
    Metadata,
}

impl Rendering {
    /// The rendering an `Accept` header asks for; the object itself when it names
    /// nothing else.
    pub fn from_accept(accept: &str) -> Rendering {
        // Clients list their preferences in order; the first one we can produce wins.
        for choice in accept.split(',') {
            if choice.contains("as=Table") {
                return Rendering::Table;
            }
            if choice.contains("as=PartialObjectMetadata") {
                return Rendering::Metadata;
            }
            let media = choice.split(';').next().unwrap_or("").trim();
            if matches!(media, "application/json" | "*/*" | "application/yaml") {
                return Rendering::Object;
            }
        }
        Rendering::Object
    }
}

/// A Table of `objects` for kubectl, with the CRD's printer columns for custom resources.
pub fn table_of(api: &Api, resource: &Resource, objects: &[&Value], list_meta: Value) -> Value {
    let kind = match &resource.custom {
        Some(custom) => TableKind::Custom {
            printer_columns: &custom.printer_columns,
        },
        None => TableKind::Builtin(&resource.plural),
    };
    to_table(
        &kind,
        objects,
        IncludeObject::Metadata,
        list_meta,
        api.clock.now(),
    )
}

/// The metadata-only form of an object (`as=PartialObjectMetadata`).
pub fn partial_metadata(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_rendering_the_client_accepts_wins() {
        let cases = [
            (
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
                Rendering::Table,
            ),
            (
                "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
                Rendering::Metadata,
            ),
            ("application/json", Rendering::Object),
            (
                "application/yaml,application/json;as=Table;v=v1;g=meta.k8s.io",
                Rendering::Object,
            ),
            ("", Rendering::Object),
        ];
        for (accept, rendering) in cases {
            assert_eq!(Rendering::from_accept(accept), rendering, "{accept}");
        }
    }
}
