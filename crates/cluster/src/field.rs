//! Field errors as kube-apiserver words them (apimachinery's `field.Error`), and the 422
//! Invalid `Status` a list of them makes (`errors.NewInvalid`): each cause with its
//! reason, the bad value printed as Go prints it, and one message joining them,
//! `Module.kmm.sigs.x-k8s.io "m" is invalid: [spec.selector: Required value, ...]`.

use std::fmt;

use serde_json::{Map, Value, json};

use crate::errors::ApiError;

/// What is wrong with a field: upstream's `field.ErrorType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Required,
    NotSupported,
    Invalid,
    TypeInvalid,
    TooLong,
    TooMany,
    Duplicate,
    Forbidden,
}

impl Reason {
    /// The cause's `reason` in the Status.
    pub fn cause_type(self) -> &'static str {
        match self {
            Reason::Required => "FieldValueRequired",
            Reason::NotSupported => "FieldValueNotSupported",
            Reason::Invalid => "FieldValueInvalid",
            Reason::TypeInvalid => "FieldValueTypeInvalid",
            Reason::TooLong => "FieldValueTooLong",
            Reason::TooMany => "FieldValueTooMany",
            Reason::Duplicate => "FieldValueDuplicate",
            Reason::Forbidden => "FieldValueForbidden",
        }
    }

    fn text(self) -> &'static str {
        match self {
            Reason::Required => "Required value",
            Reason::NotSupported => "Unsupported value",
            Reason::Invalid | Reason::TypeInvalid => "Invalid value",
            Reason::TooLong => "Too long",
            Reason::TooMany => "Too many",
            Reason::Duplicate => "Duplicate value",
            Reason::Forbidden => "Forbidden",
        }
    }
}

/// A bad value as the unstructured decoder types it (integers `int64`, other numbers
/// `float64`) and Go prints it in a field error: numbers and booleans as `%v`,
/// strings quoted, anything else as JSON.
#[derive(Clone, Debug, PartialEq)]
pub enum BadValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Text(String),
    /// Already rendered as JSON (objects, lists, null).
    Json(String),
}

impl BadValue {
    /// `value` as upstream holds it once decoded.
    pub fn of(value: &Value) -> BadValue {
        match value {
            Value::Number(n) => match n.as_i64() {
                Some(i) => BadValue::Int(i),
                None => BadValue::Float(n.as_f64().unwrap_or(0.0)),
            },
            Value::Bool(b) => BadValue::Bool(*b),
            Value::String(s) => BadValue::Text(s.clone()),
            other => BadValue::Json(other.to_string()),
        }
    }

    fn render(&self) -> String {
        match self {
            BadValue::Int(i) => i.to_string(),
            BadValue::Float(f) => go_float(*f),
            BadValue::Bool(b) => b.to_string(),
            BadValue::Text(s) => go_quote(s),
            BadValue::Json(json) => json.clone(),
        }
    }
}

/// One field error: `spec.n: Invalid value: 0: spec.n in body should be greater than or
/// equal to 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    pub reason: Reason,
    pub field: String,
    /// `None` where upstream leaves the value out of the message.
    pub value: Option<BadValue>,
    pub detail: String,
}

impl FieldError {
    fn new(reason: Reason, field: &str, value: Option<BadValue>, detail: String) -> Self {
        FieldError {
            reason,
            field: field.to_string(),
            value,
            detail,
        }
    }

    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(Reason::Required, field, None, detail.to_string())
    }

    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(Reason::Forbidden, field, None, detail.to_string())
    }

    pub fn invalid(field: &str, value: BadValue, detail: impl Into<String>) -> Self {
        Self::new(Reason::Invalid, field, Some(value), detail.into())
    }

    /// `Invalid value` without the value, where printing it would repeat a whole list.
    pub fn invalid_omitting_value(field: &str, detail: &str) -> Self {
        Self::new(Reason::Invalid, field, None, detail.to_string())
    }

    /// The value is not of the type the schema declares.
    pub fn type_invalid(field: &str, value: BadValue, detail: impl Into<String>) -> Self {
        Self::new(Reason::TypeInvalid, field, Some(value), detail.into())
    }

    /// `supported` are shown quoted, in the order given.
    pub fn not_supported(field: &str, value: BadValue, supported: &[String]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(Reason::NotSupported, field, Some(value), detail)
    }

    /// Longer than `max` (bytes, as upstream words it for schema lengths too).
    pub fn too_long(field: &str, max: i64) -> Self {
        let unit = if max == 1 { "byte" } else { "bytes" };
        Self::new(
            Reason::TooLong,
            field,
            None,
            format!("may not be more than {max} {unit}"),
        )
    }

    /// `actual` items (or properties) where at most `max` are allowed.
    pub fn too_many(field: &str, actual: i64, max: i64) -> Self {
        let unit = if max == 1 { "item" } else { "items" };
        Self::new(
            Reason::TooMany,
            field,
            Some(BadValue::Int(actual)),
            format!("must have at most {max} {unit}"),
        )
    }

    pub fn duplicate(field: &str, value: BadValue) -> Self {
        Self::new(Reason::Duplicate, field, Some(value), String::new())
    }

    /// The message without the field: `Invalid value: 0: ...` (a cause's `message`).
    pub fn body(&self) -> String {
        let mut body = self.reason.text().to_string();
        let shows_value = !matches!(
            self.reason,
            Reason::Required | Reason::Forbidden | Reason::TooLong
        );
        if let (true, Some(value)) = (shows_value, &self.value) {
            body.push_str(": ");
            body.push_str(&value.render());
        }
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// The 422 Invalid of `errors` for the object `name` of `kind` in `group`, as
/// `errors.NewInvalid` builds it: one cause per error, and a message that names the
/// kind qualified by its group and lists each distinct error once.
pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> ApiError {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let mut distinct: Vec<String> = Vec::new();
    for error in errors {
        let text = error.to_string();
        if !distinct.contains(&text) {
            distinct.push(text);
        }
    }
    let message = match distinct.as_slice() {
        [] => format!("{qualified} {} is invalid", go_quote(name)),
        [one] => format!("{qualified} {} is invalid: {one}", go_quote(name)),
        many => format!(
            "{qualified} {} is invalid: [{}]",
            go_quote(name),
            many.join(", ")
        ),
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|error| {
            let mut cause = json!({"reason": error.reason.cause_type(), "message": error.body()});
            if !error.field.is_empty() {
                cause["field"] = json!(error.field);
            }
            cause
        })
        .collect();
    let mut details = Map::new();
    for (key, value) in [("name", name), ("group", group), ("kind", kind)] {
        if !value.is_empty() {
            details.insert(key.to_string(), json!(value));
        }
    }
    details.insert("causes".to_string(), json!(causes));
    ApiError {
        code: 422,
        reason: "Invalid",
        message,
        details: Some(Value::Object(details)),
    }
}

/// `s` quoted as Go's `strconv.Quote` quotes it (`%q`).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `f` as Go's `%v` prints a `float64`: the shortest digits, with an exponent when it is
/// below -4 or at least 6 (`1e+06`, `1.5`, `1e-05`).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    let scientific = format!("{f:e}");
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return f.to_string();
    };
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if f != 0.0 && !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of error reads as apimachinery's `field.Error` prints it.
    #[test]
    fn field_errors_read_as_upstream_prints_them() {
        #[rustfmt::skip]
        let cases: Vec<(FieldError, &str)> = vec![
            (FieldError::required("spec.selector", ""), "spec.selector: Required value"),
            (FieldError::not_supported("spec.foo", BadValue::Text("bar".into()), &["a".into(), "b".into()]),
             "spec.foo: Unsupported value: \"bar\": supported values: \"a\", \"b\""),
            (FieldError::invalid("spec.n", BadValue::Int(0), "spec.n in body should be greater than or equal to 1"),
             "spec.n: Invalid value: 0: spec.n in body should be greater than or equal to 1"),
            (FieldError::type_invalid("spec.x", BadValue::Text("string".into()), "spec.x in body must be of type integer: \"string\""),
             "spec.x: Invalid value: \"string\": spec.x in body must be of type integer: \"string\""),
            (FieldError::too_long("spec.s", 3), "spec.s: Too long: may not be more than 3 bytes"),
            (FieldError::too_long("spec.s", 1), "spec.s: Too long: may not be more than 1 byte"),
            (FieldError::too_many("spec.l", 4, 3), "spec.l: Too many: 4: must have at most 3 items"),
            (FieldError::duplicate("spec.l[1]", BadValue::Json("{\"name\":\"a\"}".into())),
             "spec.l[1]: Duplicate value: {\"name\":\"a\"}"),
            (FieldError::invalid("spec.f", BadValue::Float(0.5), "x"), "spec.f: Invalid value: 0.5: x"),
            (FieldError::not_supported("spec.e", BadValue::of(&Value::Null), &["A".into()]),
             "spec.e: Unsupported value: null: supported values: \"A\""),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_string(), want);
        }
    }

    #[test]
    fn values_print_as_go_prints_them() {
        let cases = [
            (1.0, "1"),
            (1.5, "1.5"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (0.0, "0"),
        ];
        for (value, want) in cases {
            assert_eq!(go_float(value), want, "{value}");
        }
        assert_eq!(go_quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\x01\"");
    }

    /// One error is the message's tail; several are listed once each in brackets, every
    /// one a cause with its reason.
    #[test]
    fn the_status_names_the_qualified_kind_and_lists_each_error_once() {
        let one = invalid(
            "kmm.sigs.x-k8s.io",
            "Module",
            "x",
            &[FieldError::required("spec.selector", "")],
        );
        assert_eq!(one.code, 422);
        assert_eq!(
            one.message,
            "Module.kmm.sigs.x-k8s.io \"x\" is invalid: spec.selector: Required value"
        );
        let details = one.details.expect("details");
        assert_eq!(details["group"], "kmm.sigs.x-k8s.io");
        assert_eq!(
            details["causes"],
            json!([{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.selector"}])
        );
        let errors = [
            FieldError::required("spec.a", ""),
            FieldError::required("spec.a", ""),
            FieldError::too_long("spec.b", 2),
        ];
        let many = invalid("", "Pod", "p", &errors);
        assert_eq!(
            many.message,
            "Pod \"p\" is invalid: [spec.a: Required value, spec.b: Too long: may not be more than 2 bytes]"
        );
        let details = many.details.expect("details");
        assert!(details.get("group").is_none());
        assert_eq!(details["causes"].as_array().map(Vec::len), Some(3));
    }
}
