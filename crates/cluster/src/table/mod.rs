//! Server-side `meta.k8s.io/v1` Table output, which `kubectl get` asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`.
//!
//! Built-in resources get kube-apiserver's printer columns (`pkg/printers/internalversion`),
//! always generated wide as the server does: columns with priority 1 are only shown by
//! `kubectl get -o wide`. Custom resources get their CRD's `additionalPrinterColumns`
//! evaluated as apiextensions-apiserver does. Ages use `duration.HumanDuration`.
//!
//! This file holds the Table envelope; [`columns`] and [`builtin`] the built-in printers,
//! [`custom`] the CRD printer columns and the [`jsonpath`] subset they are written in,
//! [`duration`] the ages, and [`fields`] how a printer reads an object's fields.

mod builtin;
mod columns;
mod custom;
mod duration;
mod fields;
mod jsonpath;

use std::str::FromStr;

use jiff::Timestamp;
use serde_json::{Map, Value, json};

use builtin::Printer;
use columns::{Column, NAME};
use custom::{custom_columns, custom_row};

/// Which printer builds the rows.
#[derive(Clone, Copy, Debug)]
pub enum TableKind<'a> {
    /// A built-in resource by its plural name, e.g. `"pods"`. Unknown plurals get
    /// `Name` and `Age` columns.
    Builtin(&'a str),
    /// A custom resource, with the served CRD version's `additionalPrinterColumns`
    /// (`{name, type, format, description, priority, jsonPath}`); an empty list gets
    /// upstream's default `Age` column.
    Custom {
        /// The CRD version's `additionalPrinterColumns`.
        printer_columns: &'a [Value],
    },
}

/// What each row carries in `object`, from the `includeObject` query parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    /// `object` is `null`.
    None,
    /// `object` is a `PartialObjectMetadata` (kubectl's default).
    #[default]
    Metadata,
    /// `object` is the whole object.
    Object,
}

/// An `includeObject` value other than `None`, `Metadata` or `Object`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unrecognized includeObject value: {0:?}")]
pub struct UnknownIncludeObject(pub String);

impl FromStr for IncludeObject {
    type Err = UnknownIncludeObject;

    /// Parses the `includeObject` query parameter; the empty string means `Metadata`.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "" | "Metadata" => Ok(IncludeObject::Metadata),
            "None" => Ok(IncludeObject::None),
            "Object" => Ok(IncludeObject::Object),
            other => Err(UnknownIncludeObject(other.to_string())),
        }
    }
}

/// Builds a `meta.k8s.io/v1` Table for `objects`, all of one resource.
///
/// `list_meta` becomes the table's `metadata` (`{resourceVersion, continue, ...}`; a
/// non-object gives `{}`), and `now` is the instant ages are measured from. Objects
/// missing fields print as upstream prints zero values; nothing fails.
pub fn to_table(
    resource: &TableKind<'_>,
    objects: &[&Value],
    include_object: IncludeObject,
    list_meta: Value,
    now: Timestamp,
) -> Value {
    let (columns, rows): (Vec<Value>, Vec<Row>) = match resource {
        TableKind::Builtin(plural) => {
            let printer = Printer::for_resource(plural);
            (
                printer.columns().iter().map(Column::definition).collect(),
                objects.iter().map(|o| printer.row(o, now)).collect(),
            )
        }
        TableKind::Custom { printer_columns } => {
            let columns = custom_columns(printer_columns);
            (
                std::iter::once(NAME.definition())
                    .chain(columns.iter().map(|c| c.definition.clone()))
                    .collect(),
                objects
                    .iter()
                    .map(|o| custom_row(&columns, o, now))
                    .collect(),
            )
        }
    };
    let rows: Vec<Value> = objects
        .iter()
        .zip(rows)
        .map(|(object, row)| row.into_json(object, include_object))
        .collect();
    let metadata = if list_meta.is_object() {
        list_meta
    } else {
        json!({})
    };
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// One table row before its `object` is attached.
struct Row {
    cells: Vec<Value>,
    /// Upstream marks finished pods with a `Completed` row condition.
    conditions: Option<Value>,
}

impl Row {
    fn new(cells: Vec<Value>) -> Self {
        Row {
            cells,
            conditions: None,
        }
    }

    fn into_json(self, object: &Value, include_object: IncludeObject) -> Value {
        let mut row = Map::new();
        row.insert("cells".to_string(), Value::Array(self.cells));
        if let Some(conditions) = self.conditions {
            row.insert("conditions".to_string(), conditions);
        }
        let object = match include_object {
            IncludeObject::None => Value::Null,
            IncludeObject::Metadata => json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": object.get("metadata").cloned().unwrap_or_else(|| json!({})),
            }),
            IncludeObject::Object => object.clone(),
        };
        row.insert("object".to_string(), object);
        Value::Object(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use columns::NAME_DESCRIPTION;
    use jiff::SignedDuration;

    pub(super) fn now() -> Timestamp {
        "2024-05-10T12:00:00Z".parse().expect("valid timestamp")
    }

    /// `now` minus `seconds`, RFC 3339.
    pub(super) fn ago(seconds: i64) -> String {
        (now() - SignedDuration::from_secs(seconds)).to_string()
    }

    pub(super) fn table(plural: &str, objects: &[Value]) -> Value {
        let refs: Vec<&Value> = objects.iter().collect();
        to_table(
            &TableKind::Builtin(plural),
            &refs,
            IncludeObject::Metadata,
            json!({"resourceVersion": "7"}),
            now(),
        )
    }

    pub(super) fn cells(plural: &str, object: Value) -> Vec<Value> {
        let table = table(plural, &[object]);
        table["rows"][0]["cells"].as_array().expect("cells").clone()
    }

    pub(super) fn column_names(table: &Value) -> Vec<(String, i64)> {
        table["columnDefinitions"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().expect("name").to_string(),
                    c["priority"].as_i64().expect("priority"),
                )
            })
            .collect()
    }

    #[test]
    fn table_envelope_and_include_object() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "creationTimestamp": ago(30)},
            "spec": {"containers": [{"name": "c"}]},
        });
        let table = table("pods", std::slice::from_ref(&pod));
        assert_eq!(table["kind"], "Table");
        assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(table["metadata"], json!({"resourceVersion": "7"}));
        assert_eq!(
            table["rows"][0]["object"],
            json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": pod["metadata"],
            })
        );
        let first = &table["columnDefinitions"][0];
        assert_eq!(
            first,
            &json!({"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0})
        );
        for (include, expected) in [
            (IncludeObject::None, Value::Null),
            (IncludeObject::Object, pod.clone()),
        ] {
            let table = to_table(
                &TableKind::Builtin("pods"),
                &[&pod],
                include,
                Value::Null,
                now(),
            );
            assert_eq!(table["rows"][0]["object"], expected);
            assert_eq!(table["metadata"], json!({}));
        }
        let empty = to_table(
            &TableKind::Builtin("pods"),
            &[],
            IncludeObject::Metadata,
            json!({}),
            now(),
        );
        assert_eq!(empty["rows"], json!([]));
    }

    #[test]
    fn include_object_parses_query_values() {
        let cases = [
            ("", Ok(IncludeObject::Metadata)),
            ("Metadata", Ok(IncludeObject::Metadata)),
            ("None", Ok(IncludeObject::None)),
            ("Object", Ok(IncludeObject::Object)),
            ("object", Err(UnknownIncludeObject("object".to_string()))),
        ];
        for (value, expected) in cases {
            assert_eq!(value.parse::<IncludeObject>(), expected, "{value}");
        }
        assert_eq!(
            UnknownIncludeObject("x".to_string()).to_string(),
            "unrecognized includeObject value: \"x\""
        );
    }
}
