//! Structural-schema validation of custom resources: what kube-apiserver checks of an
//! object against its CRD's `openAPIV3Schema` before it stores it. The checks and their
//! words are kube-openapi's schema validator's (`type` with `nullable` and
//! `x-kubernetes-int-or-string`, `enum`, `minimum`/`maximum` and their exclusive forms,
//! `multipleOf`, `minLength`/`maxLength`, `pattern`, `format`, `minItems`/`maxItems`,
//! `minProperties`/`maxProperties`, `required`, `allOf`/`anyOf`/`oneOf`/`not`), turned
//! into field errors as apiextensions-apiserver turns them, plus the uniqueness that
//! `x-kubernetes-list-type` `set` and `map` promise.
//!
//! An update is ratcheted as upstream ratchets it (CRDValidationRatcheting, on since
//! 1.30): a value equal to the one it replaces reports nothing, so an object stored
//! before its CRD grew stricter can still be changed elsewhere. A write through the
//! status subresource validates the status alone, against the status schema.
//! `x-kubernetes-validations` (CEL rules) are not evaluated.
//!
//! Before any of it, as upstream's decoder does, a `null` the schema does not allow is
//! dropped, or replaced by the field's default when it has one ([`prune_nulls`]).

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use regex::Regex;
use serde_json::{Map, Value};

use crate::field::{BadValue, FieldError, go_float, go_quote};
use crate::formats;

/// The errors of a custom resource about to be created.
pub fn validate_create(schema: &Value, object: &Value) -> Vec<FieldError> {
    let mut errors = Checker::ROOT.node(schema, object, None, "");
    errors.extend(list_invariants(schema, object));
    errors
}

/// The errors of the next state of a custom resource stored as `current`, less those of
/// values the update leaves as they were. Duplicates in keyed lists are reported only
/// when `current` had none.
pub fn validate_update(schema: &Value, next: &Value, current: &Value) -> Vec<FieldError> {
    let mut errors = Checker::ROOT.node(schema, next, Some(current), "");
    if list_invariants(schema, current).is_empty() {
        errors.extend(list_invariants(schema, next));
    }
    errors
}

/// The errors of a write of `next` through the status subresource: its status against
/// the status schema (fields named from `status`, the message naming them from the
/// status down, as upstream's status validator does), ratcheted against `current`.
pub fn validate_status(schema: &Value, next: &Value, current: &Value) -> Vec<FieldError> {
    let status_schema = schema
        .get("properties")
        .and_then(|p| p.get("status"))
        .filter(|s| s.is_object());
    let mut errors = match (status_schema, next.get("status")) {
        (Some(status_schema), Some(status)) => {
            Checker::STATUS.node(status_schema, status, current.get("status"), "")
        }
        _ => Vec::new(),
    };
    let new = list_invariants(schema, next);
    if !new.is_empty() && list_invariants(schema, current).is_empty() {
        errors.extend(new);
    }
    errors
}

/// Drops every `null` whose schema is not `nullable`, or puts the field's `default` in
/// its place, as upstream does when it decodes a custom resource: a field sent as `null`
/// is a field not sent.
pub fn prune_nulls(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            let mut dropped = Vec::new();
            for (name, child) in map.iter_mut() {
                let Some(child_schema) = field_schema(schema, name) else {
                    continue;
                };
                if child.is_null() && !nullable(child_schema) {
                    match child_schema.get("default") {
                        Some(default) => *child = default.clone(),
                        None => dropped.push(name.clone()),
                    }
                } else {
                    prune_nulls(child_schema, child);
                }
            }
            for name in dropped {
                map.remove(&name);
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) else {
                return;
            };
            for item in items {
                match item_schema.get("default") {
                    Some(default) if item.is_null() && !nullable(item_schema) => {
                        *item = default.clone();
                    }
                    _ => prune_nulls(item_schema, item),
                }
            }
        }
        _ => {}
    }
}

/// The schema of field `name` of an object: its property, else `additionalProperties`.
fn field_schema<'a>(schema: &'a Value, name: &str) -> Option<&'a Value> {
    schema
        .get("properties")
        .and_then(|p| p.get(name))
        .or_else(|| schema.get("additionalProperties").filter(|a| a.is_object()))
}

fn nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

/// Where the errors of one validation are reported: from the object's root, or from
/// its `status` for the status subresource.
struct Checker {
    prefix: &'static str,
}

impl Checker {
    const ROOT: Checker = Checker { prefix: "" };
    const STATUS: Checker = Checker { prefix: "status" };

    /// The field path of the value kube-openapi names `name` (`.spec` for a required
    /// field at the root, `spec.items[0]` below it).
    fn field(&self, name: &str) -> String {
        let name = name.strip_prefix('.').unwrap_or(name);
        match (self.prefix, name) {
            (prefix, "") => prefix.to_string(),
            ("", name) => name.to_string(),
            (prefix, name) => format!("{prefix}.{name}"),
        }
    }

    /// A failure kube-openapi reports without a field (a bound of the wrong type, a
    /// combinator): upstream reports it at the validation's root with an empty value.
    fn plain(&self, detail: String) -> FieldError {
        FieldError::invalid(&self.field(""), BadValue::Text(String::new()), detail)
    }

    /// The errors of `value` and of what it holds. When `old` is the value it replaces
    /// and they are equal, nothing is reported (ratcheting).
    fn node(
        &self,
        schema: &Value,
        value: &Value,
        old: Option<&Value>,
        name: &str,
    ) -> Vec<FieldError> {
        let errors = self.checks(schema, value, old, name);
        if !errors.is_empty() && old.is_some_and(|old| unchanged(schema, value, old)) {
            return Vec::new();
        }
        errors
    }

    /// Every check of `schema` on `value`, in kube-openapi's order.
    fn checks(
        &self,
        schema: &Value,
        value: &Value,
        old: Option<&Value>,
        name: &str,
    ) -> Vec<FieldError> {
        let mut out = Vec::new();
        self.check_type(schema, value, name, &mut out);
        if !value.is_null() {
            self.check_combinators(schema, value, old, name, &mut out);
            if let Value::String(text) = value {
                self.check_string(schema, text, name, &mut out);
                self.check_format(schema, text, name, &mut out);
            }
            if let Some(number) = Number::of(value) {
                self.check_number(schema, number, name, &mut out);
            }
            if let Value::Array(items) = value {
                self.check_items(schema, items, old, name, &mut out);
            }
        }
        self.check_enum(schema, value, name, &mut out);
        if let Value::Object(map) = value {
            self.check_object(schema, map, old, name, &mut out);
        }
        out
    }

    fn check_type(&self, schema: &Value, value: &Value, name: &str, out: &mut Vec<FieldError>) {
        let types = declared_types(schema);
        let format = formats::effective(schema).unwrap_or("");
        if types.is_empty() && format.is_empty() {
            return;
        }
        let has = |t: &str| types.contains(&t);
        let failure = |expected: &str, got: &str| {
            FieldError::type_invalid(
                &self.field(name),
                BadValue::Text(got.to_string()),
                format!(
                    "{name} in body must be of type {expected}: {}",
                    go_quote(got)
                ),
            )
        };
        if value.is_null() {
            if !types.is_empty() && !has("null") && !nullable(schema) {
                out.push(failure(&types.join(","), "null"));
            }
            return;
        }
        let (json_type, data_format) = match value {
            Value::Bool(_) => ("boolean", ""),
            Value::String(_) => ("string", ""),
            Value::Number(n) if n.is_i64() => ("integer", "int64"),
            Value::Number(_) => ("number", "float64"),
            Value::Array(_) => ("array", ""),
            _ => ("object", ""),
        };
        let float_int =
            json_type == "number" && value.as_f64().is_some_and(is_json_integer) && has("integer");
        let int_float = json_type == "integer" && has("number");
        let textual = value.is_string() || value.is_array();
        let matches = has(json_type) || data_format == format || float_int || int_float;
        // A format the value cannot have (a number where a date-time is due).
        if !(textual || format.is_empty() || matches) {
            out.push(failure(format, data_format));
            return;
        }
        // A string or a list under a format is left to the format's own check.
        if textual && !(has("number") || has("integer") || format.is_empty()) {
            return;
        }
        if !(has(json_type) || float_int || int_float) {
            out.push(failure(&types.join(","), json_type));
        }
    }

    fn check_combinators(
        &self,
        schema: &Value,
        value: &Value,
        old: Option<&Value>,
        name: &str,
        out: &mut Vec<FieldError>,
    ) {
        let branches = |key: &str| -> Vec<Vec<FieldError>> {
            schema
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|branch| self.checks(branch, value, old, name))
                .collect()
        };
        let quoted = go_quote(name);
        let any_of = branches("anyOf");
        if !any_of.is_empty() && any_of.iter().all(|errors| !errors.is_empty()) {
            out.push(self.plain(format!(
                "{quoted} must validate at least one schema (anyOf)"
            )));
            out.extend(fewest(any_of));
        }
        let one_of = branches("oneOf");
        if !one_of.is_empty() {
            let valid = one_of.iter().filter(|errors| errors.is_empty()).count();
            if valid != 1 {
                let found = if valid == 0 {
                    "Found none valid".to_string()
                } else {
                    format!("Found {valid} valid alternatives")
                };
                out.push(self.plain(format!(
                    "{quoted} must validate one and only one schema (oneOf). {found}"
                )));
                if valid == 0 {
                    out.extend(fewest(one_of));
                }
            }
        }
        let all_of = branches("allOf");
        if !all_of.is_empty() {
            let valid = all_of.iter().filter(|errors| errors.is_empty()).count();
            let total = all_of.len();
            out.extend(all_of.into_iter().flatten());
            if valid != total {
                let none = if valid == 0 { ". None validated" } else { "" };
                out.push(self.plain(format!(
                    "{quoted} must validate all the schemas (allOf){none}"
                )));
            }
        }
        if let Some(not) = schema.get("not").filter(|n| n.is_object())
            && self.checks(not, value, old, name).is_empty()
        {
            out.push(self.plain(format!("{quoted} must not validate the schema (not)")));
        }
    }

    /// `maxLength`, `minLength`, `pattern`: the first that fails.
    fn check_string(&self, schema: &Value, text: &str, name: &str, out: &mut Vec<FieldError>) {
        let length = text.chars().count() as i64;
        if let Some(max) = schema_int(schema, "maxLength")
            && length > max
        {
            out.push(FieldError::too_long(&self.field(name), max));
            return;
        }
        let invalid = |detail: String| {
            FieldError::invalid(&self.field(name), BadValue::Text(text.to_string()), detail)
        };
        if let Some(min) = schema_int(schema, "minLength")
            && length < min
        {
            out.push(invalid(format!(
                "{name} in body should be at least {min} chars long"
            )));
            return;
        }
        let Some(pattern) = schema
            .get("pattern")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
        else {
            return;
        };
        match compiled(pattern) {
            Ok(re) if re.is_match(text) => {}
            Ok(_) => out.push(invalid(format!("{name} in body should match '{pattern}'"))),
            Err(why) => out.push(invalid(format!(
                "{name} in body should match '{pattern}, but pattern is invalid: {why}'"
            ))),
        }
    }

    fn check_format(&self, schema: &Value, text: &str, name: &str, out: &mut Vec<FieldError>) {
        let Some(format) = formats::effective(schema) else {
            return;
        };
        if formats::is_string_format(format) && !formats::valid(format, text) {
            out.push(FieldError::type_invalid(
                &self.field(name),
                BadValue::Text(text.to_string()),
                format!(
                    "{name} in body must be of type {format}: {}",
                    go_quote(text)
                ),
            ));
        }
    }

    /// The range of `int32`/`int64`/`float`, `multipleOf`, `minimum`, `maximum`. Integers
    /// are compared with the bound cut to an integer, as upstream compares them.
    fn check_number(&self, schema: &Value, number: Number, name: &str, out: &mut Vec<FieldError>) {
        let kind = NumericKind::of(schema);
        if !kind.holds(&number.digits()) {
            out.push(self.plain(kind.out_of_range("Checked", name)));
        }
        let field = self.field(name);
        if let Some(factor) = schema_float(schema, "multipleOf") {
            let bound_fits = kind.holds(&Number::Float(factor).digits());
            if !bound_fits {
                out.push(self.plain(kind.out_of_range("MultipleOf", name)));
            }
            match number {
                Number::Int(value) if bound_fits => {
                    let factor = factor as i64;
                    if factor <= 0 {
                        out.push(FieldError::invalid(
                            &field,
                            BadValue::Int(factor),
                            format!(
                                "factor MultipleOf declared for {name} must be positive: {factor}"
                            ),
                        ));
                    } else if value % factor != 0 {
                        out.push(FieldError::invalid(
                            &field,
                            BadValue::Int(value),
                            format!("{name} in body should be a multiple of {factor}"),
                        ));
                    }
                }
                _ => {
                    let value = number.as_f64();
                    if factor <= 0.0 {
                        out.push(FieldError::invalid(
                            &field,
                            BadValue::Float(factor),
                            format!(
                                "factor MultipleOf declared for {name} must be positive: {}",
                                go_float(factor)
                            ),
                        ));
                    } else {
                        let times = if factor < 1.0 {
                            1.0 / factor * value
                        } else {
                            value / factor
                        };
                        if !is_json_integer(times) {
                            out.push(FieldError::invalid(
                                &field,
                                BadValue::Float(value),
                                format!(
                                    "{name} in body should be a multiple of {}",
                                    go_float(factor)
                                ),
                            ));
                        }
                    }
                }
            }
        }
        for bound in [Bound::Minimum, Bound::Maximum] {
            let Some(limit) = schema_float(schema, bound.key()) else {
                continue;
            };
            let exclusive =
                schema.get(bound.exclusive_key()).and_then(Value::as_bool) == Some(true);
            let bound_fits = kind.holds(&Number::Float(limit).digits());
            if !bound_fits {
                out.push(self.plain(kind.out_of_range(bound.prefix(), name)));
            }
            let words = bound.words(exclusive);
            match number {
                Number::Int(value) if bound_fits => {
                    let limit = limit as i64;
                    if bound.exceeded(value.cmp(&limit), exclusive) {
                        out.push(FieldError::invalid(
                            &field,
                            BadValue::Int(value),
                            format!("{name} in body should be {words} {limit}"),
                        ));
                    }
                }
                _ => {
                    let value = number.as_f64();
                    let order = value
                        .partial_cmp(&limit)
                        .unwrap_or(std::cmp::Ordering::Equal);
                    if bound.exceeded(order, exclusive) {
                        out.push(FieldError::invalid(
                            &field,
                            BadValue::Float(value),
                            format!("{name} in body should be {words} {}", go_float(limit)),
                        ));
                    }
                }
            }
        }
    }

    fn check_items(
        &self,
        schema: &Value,
        items: &[Value],
        old: Option<&Value>,
        name: &str,
        out: &mut Vec<FieldError>,
    ) {
        if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
            for (i, item) in items.iter().enumerate() {
                let old_item = old.and_then(|old| correlated_item(schema, item, old));
                out.extend(self.node(item_schema, item, old_item, &format!("{name}[{i}]")));
            }
        }
        let size = items.len() as i64;
        self.check_count(schema, size, ("minItems", "maxItems", "items"), name, out);
        let field = self.field(name);
        let unique = schema.get("uniqueItems").and_then(Value::as_bool) == Some(true);
        if unique
            && items
                .iter()
                .enumerate()
                .any(|(i, a)| items[..i].contains(a))
        {
            out.push(FieldError::invalid(
                &field,
                BadValue::Text(String::new()),
                format!("{name} in body shouldn't contain duplicates"),
            ));
        }
    }

    /// `minItems`/`maxItems` of a list or `minProperties`/`maxProperties` of an object
    /// holding `count` (`what` names them in the message).
    fn check_count(
        &self,
        schema: &Value,
        count: i64,
        (min_key, max_key, what): (&str, &str, &str),
        name: &str,
        out: &mut Vec<FieldError>,
    ) {
        let field = self.field(name);
        if let Some(min) = schema_int(schema, min_key)
            && count < min
        {
            out.push(FieldError::invalid(
                &field,
                BadValue::Int(count),
                format!("{name} in body should have at least {min} {what}"),
            ));
        }
        if let Some(max) = schema_int(schema, max_key)
            && count > max
        {
            out.push(FieldError::too_many(&field, count, max));
        }
    }

    fn check_enum(&self, schema: &Value, value: &Value, name: &str, out: &mut Vec<FieldError>) {
        let Some(allowed) = schema
            .get("enum")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
        else {
            return;
        };
        if allowed.iter().any(|a| same_enum_value(value, a)) {
            return;
        }
        let supported: Vec<String> = allowed
            .iter()
            .map(|a| match a {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        out.push(FieldError::not_supported(
            &self.field(name),
            BadValue::of(value),
            &supported,
        ));
    }

    fn check_object(
        &self,
        schema: &Value,
        map: &Map<String, Value>,
        old: Option<&Value>,
        name: &str,
        out: &mut Vec<FieldError>,
    ) {
        let count = map.len() as i64;
        let bounds = ("minProperties", "maxProperties", "properties");
        self.check_count(schema, count, bounds, name, out);
        let field = self.field(name);
        let empty = Map::new();
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let old_field = |key: &str| old.and_then(Value::as_object).and_then(|o| o.get(key));
        match schema.get("additionalProperties") {
            Some(Value::Bool(false)) => {
                for key in map.keys().filter(|k| !properties.contains_key(*k)) {
                    out.push(FieldError::invalid(
                        &field,
                        BadValue::Text(key.clone()),
                        format!("{name}.{key} in body is a forbidden property"),
                    ));
                }
            }
            Some(additional @ Value::Object(_)) => {
                for (key, child) in map.iter().filter(|(k, _)| !properties.contains_key(*k)) {
                    let child_name = format!("{name}.{key}");
                    out.extend(self.node(additional, child, old_field(key), &child_name));
                }
            }
            _ => {}
        }
        for (key, property) in properties {
            if let Some(child) = map.get(key) {
                let child_name = if name.is_empty() {
                    key.clone()
                } else {
                    format!("{name}.{key}")
                };
                out.extend(self.node(property, child, old_field(key), &child_name));
            }
        }
        for required in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !map.contains_key(required) {
                out.push(FieldError::required(
                    &self.field(&format!("{name}.{required}")),
                    "",
                ));
            }
        }
    }
}

/// The errors of the failed branch with the fewest: the branch upstream's validator
/// finds came closest (it counts the checks that passed; the fewest failures is a
/// close stand-in for that).
fn fewest(branches: Vec<Vec<FieldError>>) -> Vec<FieldError> {
    branches
        .into_iter()
        .filter(|errors| !errors.is_empty())
        .min_by_key(Vec::len)
        .unwrap_or_default()
}

/// The types the schema declares; `integer` and `string` for `x-kubernetes-int-or-string`.
fn declared_types(schema: &Value) -> Vec<&str> {
    if schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return vec!["integer", "string"];
    }
    match schema.get("type").and_then(Value::as_str) {
        Some(t) if !t.is_empty() => vec![t],
        _ => Vec::new(),
    }
}

fn schema_int(schema: &Value, key: &str) -> Option<i64> {
    let value = schema.get(key)?;
    value.as_i64().or_else(|| value.as_f64().map(|f| f as i64))
}

fn schema_float(schema: &Value, key: &str) -> Option<f64> {
    schema.get(key)?.as_f64()
}

/// Whether `f` is a whole number a JSON integer can hold exactly (swag's
/// `IsFloat64AJSONInteger`).
fn is_json_integer(f: f64) -> bool {
    const LIMIT: f64 = 9_007_199_254_740_992.0; // 2^53
    f.is_finite() && f.fract() == 0.0 && (-LIMIT..=LIMIT).contains(&f)
}

/// Whether `value` is the enum member `member`: numbers compare by value, as Go converts
/// a decoded integer to the member's float before comparing.
fn same_enum_value(value: &Value, member: &Value) -> bool {
    match (value, member) {
        (Value::Null, _) | (_, Value::Null) => false,
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

/// A number as the unstructured decoder holds it.
#[derive(Clone, Copy, Debug)]
enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    fn of(value: &Value) -> Option<Number> {
        let Value::Number(n) = value else {
            return None;
        };
        Some(match n.as_i64() {
            Some(i) => Number::Int(i),
            None => Number::Float(n.as_f64().unwrap_or(0.0)),
        })
    }

    fn as_f64(self) -> f64 {
        match self {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }

    /// The number written out in full, as upstream writes it before parsing it back
    /// in the declared type and format.
    fn digits(self) -> String {
        match self {
            Number::Int(i) => i.to_string(),
            Number::Float(f) => f.to_string(),
        }
    }
}

/// What a number must fit in: the single declared numeric type and its format.
struct NumericKind<'a> {
    type_name: &'a str,
    format: &'a str,
}

impl<'a> NumericKind<'a> {
    fn of(schema: &'a Value) -> Self {
        let type_name = match declared_types(schema).as_slice() {
            [single @ ("integer" | "number")] => *single,
            _ => "",
        };
        let format = formats::effective(schema).unwrap_or("");
        let format = match (type_name, format) {
            ("integer", f @ ("int32" | "int64")) | ("number", f @ ("float" | "double")) => f,
            _ => "",
        };
        NumericKind { type_name, format }
    }

    /// Whether `digits` parse in the type and format without loss of range.
    fn holds(&self, digits: &str) -> bool {
        match (self.type_name, self.format) {
            ("integer", "int32") => digits.parse::<i32>().is_ok(),
            ("integer", _) => digits.parse::<i64>().is_ok(),
            (_, "float") => digits.parse::<f32>().is_ok_and(f32::is_finite),
            _ => true,
        }
    }

    fn out_of_range(&self, what: &str, name: &str) -> String {
        let type_name = self.type_name;
        match self.format {
            "" => format!("{what} value must be of type {type_name} (default format) in {name}"),
            format => {
                format!("{what} value must be of type {type_name} with format {format} in {name}")
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Bound {
    Minimum,
    Maximum,
}

impl Bound {
    fn key(self) -> &'static str {
        match self {
            Bound::Minimum => "minimum",
            Bound::Maximum => "maximum",
        }
    }

    fn exclusive_key(self) -> &'static str {
        match self {
            Bound::Minimum => "exclusiveMinimum",
            Bound::Maximum => "exclusiveMaximum",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Bound::Minimum => "Minimum boundary",
            Bound::Maximum => "Maximum boundary",
        }
    }

    fn words(self, exclusive: bool) -> &'static str {
        match (self, exclusive) {
            (Bound::Minimum, false) => "greater than or equal to",
            (Bound::Minimum, true) => "greater than",
            (Bound::Maximum, false) => "less than or equal to",
            (Bound::Maximum, true) => "less than",
        }
    }

    /// Whether a value ordered `order` against the bound breaks it.
    fn exceeded(self, order: std::cmp::Ordering, exclusive: bool) -> bool {
        use std::cmp::Ordering::{Equal, Greater, Less};
        match (self, order) {
            (_, Equal) => exclusive,
            (Bound::Minimum, Less) | (Bound::Maximum, Greater) => true,
            _ => false,
        }
    }
}

/// `pattern` compiled once per distinct pattern (Go's RE2 syntax, which the regex crate
/// shares).
fn compiled(pattern: &str) -> Result<Regex, String> {
    static PATTERNS: LazyLock<Mutex<HashMap<String, Result<Regex, String>>>> =
        LazyLock::new(Mutex::default);
    let mut patterns = PATTERNS.lock().unwrap_or_else(|e| e.into_inner());
    patterns
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).map_err(|e| e.to_string()))
        .clone()
}

/// The item of the old list that `item` continues: only a list of
/// `x-kubernetes-list-type: map` correlates items, by their keys.
fn correlated_item<'a>(schema: &Value, item: &Value, old: &'a Value) -> Option<&'a Value> {
    let keys = map_keys(schema)?;
    let key = |element: &Value| -> Vec<Option<Value>> {
        keys.iter().map(|k| element.get(*k).cloned()).collect()
    };
    let wanted = key(item);
    old.as_array()?
        .iter()
        .find(|element| key(element) == wanted)
}

/// The key fields of a list of `x-kubernetes-list-type: map`.
fn map_keys(schema: &Value) -> Option<Vec<&str>> {
    if schema.get("x-kubernetes-list-type").and_then(Value::as_str) != Some("map") {
        return None;
    }
    Some(
        schema
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)?
            .iter()
            .filter_map(Value::as_str)
            .collect(),
    )
}

/// Whether `new` equals `old` as ratcheting compares them: keyed lists item by key
/// (whatever their order), objects field by field where the schema describes the field.
fn unchanged(schema: &Value, new: &Value, old: &Value) -> bool {
    match (new, old) {
        (Value::Array(new_items), Value::Array(old_items)) => {
            if new_items.len() != old_items.len() {
                return false;
            }
            let item_schema = schema.get("items").filter(|s| s.is_object());
            match (map_keys(schema), item_schema) {
                (Some(_), Some(item_schema)) => new_items.iter().all(|item| {
                    correlated_item(schema, item, old)
                        .is_some_and(|old_item| unchanged(item_schema, item, old_item))
                }),
                _ => new_items == old_items,
            }
        }
        (Value::Object(new_fields), Value::Object(old_fields)) => {
            new_fields.len() == old_fields.len()
                && new_fields.iter().all(|(key, value)| {
                    match (field_schema(schema, key), old_fields.get(key)) {
                        (Some(child), Some(old_value)) => unchanged(child, value, old_value),
                        _ => false,
                    }
                })
        }
        _ => new == old,
    }
}

/// Duplicates in lists of `x-kubernetes-list-type` `set` (equal items) and `map` (equal
/// keys), and items of a keyed list that are not objects.
fn list_invariants(schema: &Value, object: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    if let Value::Object(map) = object {
        lists_in_object(schema, map, "", &mut out);
    }
    out
}

fn lists_in(schema: &Value, value: &Value, path: &str, out: &mut Vec<FieldError>) {
    match value {
        Value::Array(items) => lists_in_array(schema, items, path, out),
        Value::Object(map) => lists_in_object(schema, map, path, out),
        _ => {}
    }
}

fn lists_in_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    out: &mut Vec<FieldError>,
) {
    if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        for (key, value) in map {
            lists_in(additional, value, &format!("{path}[{key}]"), out);
        }
    }
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (key, value) in map {
            if let Some(property) = properties.get(key) {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                lists_in(property, value, &child, out);
            }
        }
    }
}

fn lists_in_array(schema: &Value, items: &[Value], path: &str, out: &mut Vec<FieldError>) {
    match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => {
            for i in repeated(items) {
                out.push(FieldError::duplicate(
                    &format!("{path}[{i}]"),
                    BadValue::of(&items[i]),
                ));
            }
        }
        Some("map") => out.extend(keyed_list(schema, items, path)),
        _ => {}
    }
    if let Some(item_schema) = schema.get("items").filter(|s| s.is_object()) {
        for (i, item) in items.iter().enumerate() {
            lists_in(item_schema, item, &format!("{path}[{i}]"), out);
        }
    }
}

/// The duplicates of a keyed list, each named by its key fields.
fn keyed_list(schema: &Value, items: &[Value], path: &str) -> Vec<FieldError> {
    if let Some((i, item)) = items
        .iter()
        .enumerate()
        .find(|(_, item)| !item.is_null() && !item.is_object())
    {
        return vec![FieldError::invalid(
            &format!("{path}[{i}]"),
            BadValue::of(item),
            "must be an object for an array of list-type map",
        )];
    }
    let key_fields = map_keys(schema).unwrap_or_default();
    let keys: Vec<Value> = items
        .iter()
        .map(|item| {
            let present = key_fields
                .iter()
                .filter_map(|k| Some((k.to_string(), item.get(*k)?.clone())));
            Value::Object(present.collect())
        })
        .collect();
    repeated(&keys)
        .into_iter()
        .map(|i| {
            FieldError::duplicate(&format!("{path}[{i}]"), BadValue::Json(keys[i].to_string()))
        })
        .collect()
}

/// The index of the second appearance of each value that appears more than once.
fn repeated(values: &[Value]) -> Vec<usize> {
    let mut seen: Vec<(&Value, usize)> = Vec::new();
    let mut second = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match seen.iter_mut().find(|(v, _)| *v == value) {
            Some((_, times)) => {
                *times += 1;
                if *times == 2 {
                    second.push(i);
                }
            }
            None => seen.push((value, 1)),
        }
    }
    second
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    fn schema() -> Value {
        json!({"type": "object", "required": ["spec"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "required": ["selector"], "properties": {
                "selector": {"type": "object", "additionalProperties": {"type": "string"}},
                "foo": {"type": "string", "enum": ["a", "b"]},
                "n": {"type": "integer", "format": "int32", "minimum": 1.0, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "exclusiveMaximum": true, "maximum": 1},
                "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
                "x": {"type": "integer"},
                "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                "labels": {"type": "object", "minProperties": 1, "maxProperties": 2,
                           "additionalProperties": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": true},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "maybe": {"type": "string", "nullable": true},
                "when": {"type": "string", "format": "date-time"},
                "step": {"type": "integer", "multipleOf": 5},
                "modules": {"type": "array", "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "required": ["name"], "properties": {
                                "name": {"type": "string"}, "version": {"type": "string", "minLength": 1}}}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
            }},
            "status": {"type": "object", "properties": {
                "count": {"type": "integer", "minimum": 0},
                "phase": {"type": "string", "enum": ["Ready", "Failed"], "nullable": true}
            }}
        }})
    }

    fn object(spec: Value) -> Value {
        json!({"apiVersion": "x.dev/v1", "kind": "X", "metadata": {"name": "x"}, "spec": spec})
    }

    /// Each keyword refuses what upstream refuses, in upstream's words.
    #[test]
    fn every_keyword_refuses_as_upstream_words_it() {
        #[rustfmt::skip]
        let cases: Vec<(Value, Vec<&str>)> = vec![
            (json!({"selector": {}}), vec![]),
            (json!({}), vec!["spec.selector: Required value"]),
            (json!({"selector": {}, "foo": "bar"}),
             vec!["spec.foo: Unsupported value: \"bar\": supported values: \"a\", \"b\""]),
            (json!({"selector": {}, "n": 0}),
             vec!["spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1"]),
            (json!({"selector": {}, "n": 11}),
             vec!["spec.n: Invalid value: 11: spec.n in body should be less than or equal to 10"]),
            (json!({"selector": {}, "n": 3_000_000_000_i64}),
             vec![": Invalid value: \"\": Checked value must be of type integer with format int32 in spec.n",
                  "spec.n: Invalid value: 3000000000: spec.n in body should be less than or equal to 10"]),
            (json!({"selector": {}, "ratio": 1}),
             vec!["spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1"]),
            (json!({"selector": {}, "ratio": 0.0}),
             vec!["spec.ratio: Invalid value: 0: spec.ratio in body should be greater than 0"]),
            (json!({"selector": {}, "items": []}),
             vec!["spec.items: Invalid value: 0: spec.items in body should have at least 1 items"]),
            (json!({"selector": {}, "items": ["a", "b", "c"]}),
             vec!["spec.items: Too many: 3: must have at most 2 items"]),
            (json!({"selector": {}, "items": ["a", 1]}),
             vec!["spec.items[1]: Invalid value: \"integer\": spec.items[1] in body must be of type string: \"integer\""]),
            (json!({"selector": {}, "x": "string"}),
             vec!["spec.x: Invalid value: \"string\": spec.x in body must be of type integer: \"string\""]),
            (json!({"selector": {}, "x": 1.5}),
             vec!["spec.x: Invalid value: \"number\": spec.x in body must be of type integer: \"number\"",
                  ": Invalid value: \"\": Checked value must be of type integer (default format) in spec.x"]),
            (json!({"selector": {}, "x": 2.0}), vec![]),
            (json!({"selector": {}, "name": "a"}),
             vec!["spec.name: Invalid value: \"a\": spec.name in body should be at least 2 chars long"]),
            (json!({"selector": {}, "name": "abcdef"}), vec!["spec.name: Too long: may not be more than 5 bytes"]),
            (json!({"selector": {}, "name": "ab1"}),
             vec!["spec.name: Invalid value: \"ab1\": spec.name in body should match '^[a-z]+$'"]),
            (json!({"selector": {}, "labels": {}}),
             vec!["spec.labels: Invalid value: 0: spec.labels in body should have at least 1 properties"]),
            (json!({"selector": {}, "labels": {"a": "1", "b": "2", "c": "3"}}),
             vec!["spec.labels: Too many: 3: must have at most 2 items"]),
            (json!({"selector": {}, "labels": {"a": 1}}),
             vec!["spec.labels.a: Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\""]),
            (json!({"selector": {}, "port": 80}), vec![]),
            (json!({"selector": {}, "port": "http"}), vec![]),
            (json!({"selector": {}, "port": true}),
             vec!["spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\""]),
            (json!({"selector": {}, "free": {"anything": [1, {"x": null}]}}), vec![]),
            (json!({"selector": {}, "maybe": null}), vec![]),
            (json!({"selector": {}, "foo": null}),
             vec!["spec.foo: Invalid value: \"null\": spec.foo in body must be of type string: \"null\"",
                  "spec.foo: Unsupported value: null: supported values: \"a\", \"b\""]),
            (json!({"selector": {}, "when": "2026-01-02T03:04:05Z"}), vec![]),
            (json!({"selector": {}, "when": "tomorrow"}),
             vec!["spec.when: Invalid value: \"tomorrow\": spec.when in body must be of type date-time: \"tomorrow\""]),
            (json!({"selector": {}, "step": 7}),
             vec!["spec.step: Invalid value: 7: spec.step in body should be a multiple of 5"]),
            (json!({"selector": {}, "modules": [{"name": "a"}, {"version": ""}]}),
             vec!["spec.modules[1].version: Invalid value: \"\": spec.modules[1].version in body should be at least 1 chars long",
                  "spec.modules[1].name: Required value"]),
            (json!({"selector": {}, "modules": [{"name": "a"}, {"name": "a"}]}),
             vec!["spec.modules[1]: Duplicate value: {\"name\":\"a\"}"]),
            (json!({"selector": {}, "tags": ["x", "y", "x", "x"]}),
             vec!["spec.tags[2]: Duplicate value: \"x\""]),
            (json!("spec"),
             vec!["spec: Invalid value: \"string\": spec in body must be of type object: \"string\""]),
        ];
        for (spec, want) in cases {
            let errors = validate_create(&schema(), &object(spec.clone()));
            assert_eq!(messages(&errors), want, "{spec}");
        }
        let mut no_spec = object(json!({}));
        no_spec.as_object_mut().unwrap().remove("spec");
        assert_eq!(
            messages(&validate_create(&schema(), &no_spec)),
            ["spec: Required value"]
        );
    }

    /// An update reports only the errors of what it changes: a field left invalid as it
    /// was stored passes, a changed one does not, and a keyed list's items follow their
    /// keys whatever their order.
    #[test]
    fn updates_ratchet_errors_in_what_they_leave_unchanged() {
        let stored = object(
            json!({"selector": {}, "n": 0, "modules": [{"name": "a", "version": ""}, {"name": "b"}]}),
        );
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("nothing changed", stored.clone(), vec![]),
            (
                "another field changed",
                object(
                    json!({"selector": {"a": "b"}, "n": 0, "modules": [{"name": "a", "version": ""}, {"name": "b"}]}),
                ),
                vec![],
            ),
            (
                "keyed items reordered",
                object(
                    json!({"selector": {}, "n": 0, "modules": [{"name": "b"}, {"name": "a", "version": ""}]}),
                ),
                vec![],
            ),
            (
                "the invalid field changed",
                object(
                    json!({"selector": {}, "n": -1, "modules": [{"name": "a", "version": ""}, {"name": "b"}]}),
                ),
                vec![
                    "spec.n: Invalid value: -1: spec.n in body should be greater than or equal to 1",
                ],
            ),
            (
                "a new invalid item",
                object(
                    json!({"selector": {}, "n": 0, "modules": [{"name": "a", "version": ""}, {"name": "b"}, {"name": "c", "version": ""}]}),
                ),
                vec![
                    "spec.modules[2].version: Invalid value: \"\": spec.modules[2].version in body should be at least 1 chars long",
                ],
            ),
        ];
        for (what, next, want) in cases {
            assert_eq!(
                messages(&validate_update(&schema(), &next, &stored)),
                want,
                "{what}"
            );
        }
    }

    /// The status subresource validates the status alone, its fields named from
    /// `status` and its messages from the status down.
    #[test]
    fn status_writes_validate_the_status_alone() {
        let mut stored = object(json!({}));
        stored["status"] = json!({"count": 1});
        let mut next = stored.clone();
        next["status"] = json!({"count": -1, "phase": "Lost"});
        assert_eq!(
            messages(&validate_status(&schema(), &next, &stored)),
            [
                "status.count: Invalid value: -1: count in body should be greater than or equal to 0",
                "status.phase: Unsupported value: \"Lost\": supported values: \"Ready\", \"Failed\"",
            ]
        );
        next["status"] = json!({"count": 2});
        assert!(
            validate_status(&schema(), &next, &stored).is_empty(),
            "the spec is not checked"
        );
    }

    #[test]
    fn nulls_the_schema_does_not_allow_are_dropped_or_defaulted() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "string"},
            "b": {"type": "string", "nullable": true},
            "c": {"type": "integer", "default": 3},
            "m": {"type": "object", "additionalProperties": {"type": "string"}},
            "l": {"type": "array", "items": {"type": "string", "default": "x"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }});
        let mut value = json!({"a": null, "b": null, "c": null, "m": {"k": null},
                               "l": [null, "y"], "free": {"z": null}});
        prune_nulls(&schema, &mut value);
        assert_eq!(
            value,
            json!({"b": null, "c": 3, "m": {}, "l": ["x", "y"], "free": {"z": null}})
        );
    }
}
