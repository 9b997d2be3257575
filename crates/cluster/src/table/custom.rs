//! Custom resources' columns: the CRD version's `additionalPrinterColumns`, evaluated
//! as apiextensions-apiserver does (upstream's default `Age` column when there are none).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::Row;
use super::columns::{AGE_DESCRIPTION, column_definition};
use super::duration::since;
use super::fields::{integer, or_placeholder, text};
use super::jsonpath::JsonPath;

/// A CRD printer column ready to evaluate.
pub(super) struct PrinterColumn {
    pub(super) definition: Value,
    kind: String,
    /// `None` when the JSONPath is outside the supported subset; cells are then null.
    path: Option<JsonPath>,
}

/// The columns after `Name`, as apiextensions-apiserver derives them.
pub(super) fn custom_columns(printer_columns: &[Value]) -> Vec<PrinterColumn> {
    if printer_columns.is_empty() {
        return vec![PrinterColumn {
            definition: column_definition("Age", "date", "", AGE_DESCRIPTION, 0),
            kind: "date".to_string(),
            path: JsonPath::parse(".metadata.creationTimestamp"),
        }];
    }
    printer_columns
        .iter()
        .map(|column| {
            let kind = text(column, "/type");
            let json_path = text(column, "/jsonPath");
            let default_description =
                format!("Custom resource definition column (in JSONPath format): {json_path}");
            PrinterColumn {
                definition: column_definition(
                    text(column, "/name"),
                    kind,
                    text(column, "/format"),
                    or_placeholder(text(column, "/description"), &default_description),
                    integer(column, "/priority"),
                ),
                kind: kind.to_string(),
                path: JsonPath::parse(json_path),
            }
        })
        .collect()
}

pub(super) fn custom_row(columns: &[PrinterColumn], object: &Value, now: Timestamp) -> Row {
    let mut cells = vec![json!(text(object, "/metadata/name"))];
    cells.extend(columns.iter().map(|column| {
        column
            .path
            .as_ref()
            .and_then(|path| path.first(object))
            .map_or(Value::Null, |value| custom_cell(&column.kind, value, now))
    }));
    Row::new(cells)
}

/// Upstream `cellForJSONValue`, with `string` columns printed as jsonpath prints.
fn custom_cell(kind: &str, value: &Value, now: Timestamp) -> Value {
    match (kind, value) {
        (_, Value::Null) => Value::Null,
        ("string", Value::String(_)) => value.clone(),
        ("string", Value::Bool(_) | Value::Number(_)) => json!(value.to_string()),
        ("string", _) => json!(capstan_api::canonical::sorted_keys(value).to_string()),
        ("integer", Value::Number(number)) => number
            .as_i64()
            .map(Value::from)
            .or_else(|| number.as_u64().map(Value::from))
            // Truncates toward zero as Go's int64(float64) does.
            .or_else(|| number.as_f64().map(|f| Value::from(f.trunc() as i64)))
            .unwrap_or(Value::Null),
        ("number", Value::Number(number)) => match number.as_f64() {
            // Go encodes whole float64 values without a fraction.
            Some(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => {
                Value::from(f as i64)
            }
            _ => value.clone(),
        },
        ("boolean", Value::Bool(_)) => value.clone(),
        ("date", Value::String(date)) if date.is_empty() => json!("<unknown>"),
        ("date", Value::String(date)) => match date.parse::<Timestamp>() {
            Ok(time) => json!(since(Some(time), now)),
            Err(_) => json!("<invalid>"),
        },
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::columns::NAME_DESCRIPTION;
    use crate::table::tests::{ago, now};
    use crate::table::{IncludeObject, TableKind, to_table};

    fn custom(printer_columns: &[Value], object: Value) -> Value {
        to_table(
            &TableKind::Custom { printer_columns },
            &[&object],
            IncludeObject::Metadata,
            json!({}),
            now(),
        )
    }

    #[test]
    fn custom_resource_default_age_column() {
        let table = custom(
            &[],
            json!({"metadata": {"name": "w", "creationTimestamp": ago(400)}}),
        );
        assert_eq!(
            table["columnDefinitions"],
            json!([
                {"name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0},
                {"name": "Age", "type": "date", "format": "", "description": AGE_DESCRIPTION, "priority": 0},
            ])
        );
        assert_eq!(table["rows"][0]["cells"], json!(["w", "6m40s"]));
    }

    #[test]
    fn custom_resource_printer_columns() {
        let columns = [
            json!({"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Upgrade phase"}),
            json!({"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}),
            json!({"name": "Nodes", "type": "integer", "jsonPath": ".status.nodes", "priority": 1}),
            json!({"name": "Ratio", "type": "number", "jsonPath": ".status.ratio"}),
            json!({"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"}),
            json!({"name": "Module", "type": "string", "jsonPath": ".spec.modules[*].name"}),
            json!({"name": "Last", "type": "string", "jsonPath": ".spec.modules[-1].name"}),
            json!({"name": "Zone", "type": "string", "jsonPath": ".metadata.labels.topology\\.kubernetes\\.io/zone"}),
            json!({"name": "Owner", "type": "string", "jsonPath": ".metadata.annotations['example.com/owner']"}),
            json!({"name": "Started", "type": "date", "jsonPath": ".status.startedAt"}),
            json!({"name": "Spec", "type": "string", "jsonPath": ".spec.target"}),
            json!({"name": "Missing", "type": "string", "jsonPath": ".status.nothing"}),
            json!({"name": "Mismatch", "type": "integer", "jsonPath": ".status.phase"}),
            json!({"name": "Bad", "type": "date", "jsonPath": ".status.phase"}),
            json!({"name": "Count", "type": "string", "jsonPath": ".status.nodes"}),
            json!({"name": "Recursive", "type": "string", "jsonPath": "..name"}),
        ];
        let object = json!({
            "apiVersion": "capstan.io/v1", "kind": "Upgrade",
            "metadata": {
                "name": "u1", "creationTimestamp": ago(60),
                "labels": {"topology.kubernetes.io/zone": "z1"},
                "annotations": {"example.com/owner": "ops"},
            },
            "spec": {"paused": false, "modules": [{"name": "nvidia"}, {"name": "zfs"}], "target": {"version": "2", "kernel": "6.8"}},
            "status": {
                "phase": "Draining", "nodes": 3.7, "ratio": 2.0, "startedAt": ago(3 * 3600 + 600),
                "conditions": [{"type": "Progressing", "status": "True"}, {"type": "Ready", "status": "False"}],
            },
        });
        let table = custom(&columns, object);
        assert_eq!(
            table["rows"][0]["cells"],
            json!([
                "u1",
                "Draining",
                "False",
                3,
                2,
                false,
                "nvidia",
                "zfs",
                "z1",
                "ops",
                "3h10m",
                "{\"kernel\":\"6.8\",\"version\":\"2\"}",
                null,
                null,
                "<invalid>",
                "3.7",
                null,
            ])
        );
        let definitions = &table["columnDefinitions"];
        assert_eq!(
            definitions.as_array().map(Vec::len),
            Some(columns.len() + 1)
        );
        assert_eq!(
            definitions[1],
            json!({"name": "Phase", "type": "string", "format": "", "description": "Upgrade phase", "priority": 0})
        );
        assert_eq!(
            definitions[3],
            json!({"name": "Nodes", "type": "integer", "format": "", "description": "Custom resource definition column (in JSONPath format): .status.nodes", "priority": 1})
        );
    }
}
