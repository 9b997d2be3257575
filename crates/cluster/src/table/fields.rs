//! How the printers read an object's fields: a missing or mistyped field is its
//! zero value, as in upstream's typed objects, so a row never fails.

use crate::pointer::Pointer;

use jiff::Timestamp;
use serde_json::{Map, Value};

pub(super) fn text<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object.at(pointer).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn integer(object: &Value, pointer: &str) -> i64 {
    object.at(pointer).and_then(Value::as_i64).unwrap_or(0)
}

pub(super) fn flag(object: &Value, pointer: &str) -> bool {
    object.at(pointer).and_then(Value::as_bool) == Some(true)
}

pub(super) fn list<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .at(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Number of keys of a map field, 0 when absent.
pub(super) fn entries(object: &Value, pointer: &str) -> usize {
    object
        .at(pointer)
        .and_then(Value::as_object)
        .map_or(0, Map::len)
}

pub(super) fn timestamp(object: &Value, pointer: &str) -> Option<Timestamp> {
    object
        .at(pointer)
        .and_then(Value::as_str)
        .and_then(|t| t.parse().ok())
}

pub(super) fn or_placeholder<'a>(value: &'a str, placeholder: &'a str) -> &'a str {
    if value.is_empty() { placeholder } else { value }
}
