//! The `format`s kube-apiserver enforces in custom resources: those apiextensions-apiserver
//! keeps in a CRD's schema (it drops every other format, so it checks nothing), each
//! checked as kube-openapi's `strfmt` registry checks it. `int32`, `int64`, `float` and
//! `double` are kept for numbers and bound their range (see `structural`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

/// The string formats a CRD schema may carry, by normalized name (dashes dropped, as the
/// registry looks names up): `date-time` is `datetime`.
const STRING_FORMATS: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
    "k8sshortname",
    "k8slongname",
];

/// The format of `schema` that validation sees: its `format` if apiextensions keeps it
/// for the schema's type, else none.
pub fn effective(schema: &Value) -> Option<&str> {
    let format = schema.get("format").and_then(Value::as_str)?;
    if format.is_empty() {
        return None;
    }
    let int_or_string = schema
        .get("x-kubernetes-int-or-string")
        .and_then(Value::as_bool)
        == Some(true);
    let single_type = if int_or_string {
        ""
    } else {
        schema.get("type").and_then(Value::as_str).unwrap_or("")
    };
    let kept = match single_type {
        "" | "string" => STRING_FORMATS.contains(&normalized(format).as_str()),
        "integer" => matches!(format, "int32" | "int64"),
        "number" => matches!(format, "float" | "double"),
        _ => false,
    };
    kept.then_some(format)
}

fn normalized(format: &str) -> String {
    format.replace('-', "")
}

/// Whether `format` is a string format the registry checks.
pub fn is_string_format(format: &str) -> bool {
    STRING_FORMATS.contains(&normalized(format).as_str())
}

/// Whether `text` is valid in `format` (a string format: see [`is_string_format`]).
pub fn valid(format: &str, text: &str) -> bool {
    match normalized(format).as_str() {
        "bsonobjectid" => text.len() == 24 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => is_request_uri(text),
        "email" => EMAIL.is_match(text),
        "hostname" => is_hostname(text),
        "ipv4" => is_ipv4(text),
        "ipv6" => text.contains(':') && is_ip(text),
        "cidr" => is_cidr(text),
        "mac" => MAC.iter().any(|re| re.is_match(text)),
        "uuid" => UUID.is_match(text),
        "uuid3" => UUID3.is_match(text),
        "uuid4" => UUID4.is_match(text),
        "uuid5" => UUID5.is_match(text),
        "isbn" => is_isbn10(text) || is_isbn13(text),
        "isbn10" => is_isbn10(text),
        "isbn13" => is_isbn13(text),
        "creditcard" => is_credit_card(text),
        "ssn" => SSN.is_match(text),
        "hexcolor" => HEX_COLOR.is_match(text),
        "rgbcolor" => RGB_COLOR.is_match(text),
        "byte" => BASE64.is_match(text),
        "date" => is_date(text),
        "duration" => is_duration(text),
        "datetime" => is_date_time(text),
        "k8sshortname" => text.len() <= 63 && SHORT_NAME.is_match(text),
        "k8slongname" => text.len() <= 253 && LONG_NAME.is_match(text),
        // "password", and anything the registry does not know, takes any string.
        _ => true,
    }
}

fn regex(pattern: &str) -> Regex {
    // The patterns are constants of this file, checked by its tests.
    Regex::new(pattern).unwrap_or_else(|err| panic!("format pattern {pattern}: {err}"))
}

static EMAIL: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^(?:[^<>@\s]+\s*<)?[^<>@\s]+@[^<>@\s]+>?$"));
static HOSTNAME: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$",
    )
});
static MAC: LazyLock<[Regex; 3]> = LazyLock::new(|| {
    [
        regex(
            r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}((:[0-9A-Fa-f]{2}){2})?((:[0-9A-Fa-f]{2}){12})?$",
        ),
        regex(
            r"^[0-9A-Fa-f]{2}(-[0-9A-Fa-f]{2}){5}((-[0-9A-Fa-f]{2}){2})?((-[0-9A-Fa-f]{2}){12})?$",
        ),
        regex(
            r"^[0-9A-Fa-f]{4}(\.[0-9A-Fa-f]{4}){2}((\.[0-9A-Fa-f]{4}){1})?((\.[0-9A-Fa-f]{4}){6})?$",
        ),
    ]
});
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID3: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$")
});
static UUID4: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static UUID5: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$")
});
static SSN: LazyLock<Regex> = LazyLock::new(|| regex(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"));
static HEX_COLOR: LazyLock<Regex> = LazyLock::new(|| regex(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"));
static RGB_COLOR: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$",
    )
});
static BASE64: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$")
});
static DATE_TIME_TAIL: LazyLock<Regex> = LazyLock::new(|| {
    regex(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$")
});
static SHORT_NAME: LazyLock<Regex> = LazyLock::new(|| regex(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"));
static LONG_NAME: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"));
static DURATION_PART: LazyLock<Regex> = LazyLock::new(|| regex(r"(\d+)\s*([A-Za-zµ]+)"));
static GO_DURATION: LazyLock<Regex> =
    LazyLock::new(|| regex(r"^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$"));

/// Go's `url.ParseRequestURI`: an absolute URI or an absolute path, without spaces.
fn is_request_uri(text: &str) -> bool {
    static SCHEME: LazyLock<Regex> = LazyLock::new(|| regex(r"^[a-zA-Z][a-zA-Z0-9+.-]*:"));
    !text.is_empty()
        && !text.chars().any(|c| c.is_whitespace() || c.is_control())
        && (text.starts_with('/') || SCHEME.is_match(text))
}

fn is_hostname(text: &str) -> bool {
    HOSTNAME.is_match(text) && text.len() <= 255 && text.split('.').all(|p| p.len() <= 63)
}

/// An IPv4 address as Go parses it leniently (leading zeros allowed), or an IPv6 one
/// written with a dotted tail.
fn is_ipv4(text: &str) -> bool {
    text.contains('.') && is_ip(text)
}

fn is_ip(text: &str) -> bool {
    sloppy_ipv4(text).is_some() || text.parse::<Ipv6Addr>().is_ok()
}

fn sloppy_ipv4(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (octet, part) in octets.iter_mut().zip(parts) {
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    Some(Ipv4Addr::from(octets))
}

fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let bits = if sloppy_ipv4(address).is_some() {
        32
    } else if address.parse::<Ipv6Addr>().is_ok() {
        128
    } else {
        return false;
    };
    !prefix.is_empty()
        && prefix.len() <= 3
        && prefix.bytes().all(|b| b.is_ascii_digit())
        && prefix.parse::<u32>().is_ok_and(|p| p <= bits)
}

fn digits_only(text: &str) -> String {
    text.chars().filter(|c| *c != '-' && *c != ' ').collect()
}

fn is_isbn10(text: &str) -> bool {
    let isbn = digits_only(text);
    let bytes = isbn.as_bytes();
    if bytes.len() != 10 || !bytes[..9].iter().all(u8::is_ascii_digit) {
        return false;
    }
    let last = match bytes[9] {
        b'X' => 10,
        b if b.is_ascii_digit() => u32::from(b - b'0'),
        _ => return false,
    };
    let sum: u32 = bytes[..9]
        .iter()
        .enumerate()
        .map(|(i, b)| (i as u32 + 1) * u32::from(b - b'0'))
        .sum::<u32>()
        + 10 * last;
    sum.is_multiple_of(11)
}

fn is_isbn13(text: &str) -> bool {
    let isbn = digits_only(text);
    if isbn.len() != 13 || !isbn.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let sum: u32 = isbn
        .bytes()
        .enumerate()
        .map(|(i, b)| u32::from(b - b'0') * if i % 2 == 0 { 1 } else { 3 })
        .sum();
    sum.is_multiple_of(10)
}

/// A card number of a known issuer that passes the Luhn check.
fn is_credit_card(text: &str) -> bool {
    static ISSUERS: LazyLock<Regex> = LazyLock::new(|| {
        regex(
            r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|(222[1-9]|22[3-9][0-9]|2[3-6][0-9]{2}|27[01][0-9]|2720)[0-9]{12}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11}|6[27][0-9]{14})$",
        )
    });
    let number = digits_only(text);
    if !ISSUERS.is_match(&number) {
        return false;
    }
    let sum: u32 = number
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            match (i % 2 == 1, d * 2) {
                (true, doubled) if doubled > 9 => doubled - 9,
                (true, doubled) => doubled,
                (false, _) => d,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// A full date, `2006-01-02`, of a day that exists.
fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
        return false;
    }
    let number = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = &text[range];
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (Some(year), Some(month), Some(day)) = (number(0..4), number(5..7), number(8..10)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// kube-openapi's `IsDateTime`: a date, `T`, and a time with a zone.
fn is_date_time(text: &str) -> bool {
    if text.len() < 4 {
        return false;
    }
    let lower = text.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    let Some(captures) = DATE_TIME_TAIL.captures(parts[1]) else {
        return false;
    };
    let field = |i: usize| captures.get(i).map_or("", |m| m.as_str());
    field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

/// Go's `time.ParseDuration`, or kube-openapi's looser `12 hours`-style durations.
fn is_duration(text: &str) -> bool {
    if text == "0" || GO_DURATION.is_match(text) {
        return true;
    }
    const UNITS: &[&[&str]] = &[
        &["ns", "nano"],
        &["us", "µs", "micro"],
        &["ms", "milli"],
        &["s", "sec"],
        &["m", "min"],
        &["h", "hr", "hour"],
        &["d", "day"],
        &["w", "wk", "week"],
    ];
    DURATION_PART.captures_iter(text).any(|captures| {
        let unit = captures.get(2).map_or("", |m| m.as_str()).to_lowercase();
        UNITS.iter().any(|variants| {
            let last = variants.len() - 1;
            variants.iter().enumerate().any(|(i, variant)| {
                (i == last && unit.starts_with(variant)) || unit.eq_ignore_ascii_case(variant)
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_formats_apiextensions_keeps_are_checked() {
        let cases = [
            (
                json!({"type": "string", "format": "date-time"}),
                Some("date-time"),
            ),
            (json!({"type": "string", "format": "int-or-string"}), None),
            (
                json!({"type": "string", "format": "k8s-short-name"}),
                Some("k8s-short-name"),
            ),
            (json!({"type": "integer", "format": "int32"}), Some("int32")),
            (json!({"type": "integer", "format": "date-time"}), None),
            (
                json!({"type": "number", "format": "double"}),
                Some("double"),
            ),
            (json!({"type": "object", "format": "uri"}), None),
            (
                json!({"x-kubernetes-int-or-string": true, "format": "uri"}),
                Some("uri"),
            ),
            (json!({"type": "string"}), None),
        ];
        for (schema, want) in cases {
            assert_eq!(effective(&schema), want, "{schema}");
        }
    }

    #[test]
    fn formats_accept_and_refuse_as_kube_openapi_does() {
        #[rustfmt::skip]
        let cases: &[(&str, &str, bool)] = &[
            ("date-time", "2026-01-02T03:04:05Z", true),
            ("date-time", "2026-01-02T03:04:05.123+02:00", true),
            ("date-time", "2026-01-02 03:04:05Z", false),
            ("date-time", "2026-13-02T03:04:05Z", false),
            ("date-time", "yesterday", false),
            ("date", "2024-02-29", true),
            ("date", "2023-02-29", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "010.000.000.001", true),
            ("ipv4", "10.0.0.256", false),
            ("ipv4", "::1", false),
            ("ipv6", "fe80::1", true),
            ("ipv6", "10.0.0.1", false),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "fd00::/129", false),
            ("mac", "00:1a:2b:3c:4d:5e", true),
            ("mac", "00:1a:2b", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid4", "123e4567-e89b-12d3-a456-426614174000", false),
            ("hostname", "node-1.example.com", true),
            ("hostname", "-bad", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "not base64!", false),
            ("duration", "1h30m", true),
            ("duration", "3 days", true),
            ("duration", "soon", false),
            ("k8s-short-name", "kmm-demo", true),
            ("k8s-short-name", "kmm.demo", false),
            ("k8s-long-name", "kmm.demo", true),
            ("uri", "https://example.com/x", true),
            ("uri", "relative/path", false),
            ("email", "ops@example.com", true),
            ("email", "ops", false),
            ("bsonobjectid", "507f1f77bcf86cd799439011", true),
            ("isbn10", "0321751043", true),
            ("isbn13", "978-0321751041", true),
            ("creditcard", "4111111111111111", true),
            ("hexcolor", "#FFF", true),
            ("rgbcolor", "rgb(255,255,0)", true),
            ("ssn", "123-45-6789", true),
            ("password", "anything", true),
        ];
        for (format, text, want) in cases {
            assert!(is_string_format(format), "{format}");
            assert_eq!(valid(format, text), *want, "{format} {text:?}");
        }
    }
}
