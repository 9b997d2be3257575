//! Kubernetes' name and label rules (upstream `k8s.io/apimachinery/pkg/util/validation`),
//! shared by capstan's validation of a commit and by the embedded cluster's admission and
//! selectors.
//!
//! Each `*_errors` function is one of upstream's `Is...` checks: the messages upstream
//! gives, word for word and in its order (its regular expression and examples included),
//! and none when the value is valid. Callers put them after a field path and value, as
//! upstream's `field.Invalid` does.

const QUALIFIED_NAME_FORMAT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MESSAGE: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_EXAMPLES: &[&str] = &["MyName", "my.name", "123-abc"];
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;

const LABEL_VALUE_FORMAT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MESSAGE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_EXAMPLES: &[&str] = &["MyValue", "my_value", "12345"];
const LABEL_VALUE_MAX_LENGTH: usize = 63;

const DNS1123_LABEL_FORMAT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_EXAMPLES: &[&str] = &["my-name", "123-abc"];
const DNS1123_LABEL_MAX_LENGTH: usize = 63;

const DNS1123_SUBDOMAIN_FORMAT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_EXAMPLES: &[&str] = &["example.com"];
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

/// Upstream `validation.IsQualifiedName`, what label keys (and annotation keys) must be:
/// an optional DNS-1123 subdomain prefix and `/`, then a name of at most 63
/// alphanumeric characters, `-`, `_` or `.`, starting and ending alphanumeric.
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let name = match value.split('/').collect::<Vec<_>>().as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_string());
            } else {
                errors.extend(
                    dns1123_subdomain_errors(prefix)
                        .into_iter()
                        .map(|error| format!("prefix part {error}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_MESSAGE,
                    QUALIFIED_NAME_FORMAT,
                    QUALIFIED_NAME_EXAMPLES
                )
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errors.push(format!(
            "name part {}",
            max_length_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !is_qualified_name_part(name) {
        errors.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MESSAGE,
                QUALIFIED_NAME_FORMAT,
                QUALIFIED_NAME_EXAMPLES
            )
        ));
    }
    errors
}

/// Upstream `validation.IsValidLabelValue`: empty, or at most 63 alphanumeric
/// characters, `-`, `_` or `.`, starting and ending alphanumeric.
pub fn label_value_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errors.push(max_length_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errors.push(regex_error(
            LABEL_VALUE_MESSAGE,
            LABEL_VALUE_FORMAT,
            LABEL_VALUE_EXAMPLES,
        ));
    }
    errors
}

/// Upstream `validation.IsDNS1123Subdomain`, what most object names must be: at most 253
/// characters, dot-separated labels of lower-case alphanumerics and `-`, each starting
/// and ending alphanumeric.
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_length_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !is_dns1123_subdomain(value) {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_MESSAGE,
            DNS1123_SUBDOMAIN_FORMAT,
            DNS1123_SUBDOMAIN_EXAMPLES,
        ));
    }
    errors
}

/// Upstream `validation.IsDNS1123Label`, what namespace names must be: at most 63 lower-case
/// alphanumerics and `-`, starting and ending alphanumeric. A valid subdomain is told it
/// must not contain dots.
pub fn dns1123_label_errors(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errors.push(max_length_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !is_dns1123_label(value) {
        if is_dns1123_subdomain(value) {
            errors.push("must not contain dots".to_string());
        } else {
            errors.push(regex_error(
                DNS1123_LABEL_MESSAGE,
                DNS1123_LABEL_FORMAT,
                DNS1123_LABEL_EXAMPLES,
            ));
        }
    }
    errors
}

/// Whether `key` is a valid label key; [`qualified_name_errors`] joined by `; ` when not.
pub fn label_key(key: &str) -> Result<(), String> {
    let errors = qualified_name_errors(key);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Whether `value` is a valid label value ([`label_value_errors`] finds nothing).
pub fn label_value(value: &str) -> bool {
    label_value_errors(value).is_empty()
}

/// Upstream `validation.RegexError`, with the two spaces it leaves after each example.
fn regex_error(message: &str, format: &str, examples: &[&str]) -> String {
    let examples: String = examples
        .iter()
        .enumerate()
        .map(|(index, example)| {
            let separator = if index > 0 { " or " } else { "" };
            format!("{separator}'{example}', ")
        })
        .collect();
    format!("{message} (e.g. {examples}regex used for validation is '{format}')")
}

/// Upstream `validation.MaxLenError`.
fn max_length_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_name_part(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_dns1123_label(label: &str) -> bool {
    let is_edge = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = label.as_bytes();
    bytes.first().is_some_and(is_edge)
        && bytes.last().is_some_and(is_edge)
        && bytes.iter().all(|b| is_edge(b) || *b == b'-')
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`
fn is_dns1123_subdomain(name: &str) -> bool {
    name.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    #[test]
    fn qualified_names_give_upstreams_messages() {
        let longest = "x".repeat(63);
        let long = "x".repeat(64);
        let long_prefix = format!("{}/x", "a".repeat(254));
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("app", vec![]),
            ("kmm.node.kubernetes.io/kmm-demo.my-kmod.ready", vec![]),
            ("node-role.kubernetes.io/worker", vec![]),
            (&longest, vec![]),
            ("bad key", vec![NAME_PART.to_string()]),
            (
                "/noprefix",
                vec!["prefix part must be non-empty".to_string()],
            ),
            (
                "a.io/",
                vec![
                    "name part must be non-empty".to_string(),
                    NAME_PART.to_string(),
                ],
            ),
            (
                &long,
                vec!["name part must be no more than 63 characters".to_string()],
            ),
            ("Example.com/x", vec![format!("prefix part {SUBDOMAIN}")]),
            (
                &long_prefix,
                vec!["prefix part must be no more than 253 characters".to_string()],
            ),
            (
                "a/b/c",
                vec![format!(
                    "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                    NAME_PART.trim_start_matches("name part ")
                )],
            ),
        ];
        for (key, errors) in cases {
            assert_eq!(qualified_name_errors(key), errors, "{key}");
            assert_eq!(label_key(key).is_ok(), errors.is_empty(), "{key}");
        }
    }

    #[test]
    fn label_values_give_upstreams_messages() {
        let long = "v".repeat(64);
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("", vec![]),
            ("v1", vec![]),
            ("1.2.3", vec![]),
            ("my_value", vec![]),
            ("-v1", vec![VALUE.to_string()]),
            ("a b", vec![VALUE.to_string()]),
            (
                &long,
                vec!["must be no more than 63 characters".to_string()],
            ),
        ];
        for (value, errors) in cases {
            assert_eq!(label_value_errors(value), errors, "{value:?}");
            assert_eq!(label_value(value), errors.is_empty(), "{value:?}");
        }
    }

    #[test]
    fn dns1123_names_give_upstreams_messages() {
        let long_label = "a".repeat(64);
        let long_subdomain = format!("{}.{}", "a".repeat(63), "b".repeat(190));
        let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
            ("kmm-demo", vec![], vec![]),
            ("0abc", vec![], vec![]),
            (
                "kmm.demo",
                vec![],
                vec!["must not contain dots".to_string()],
            ),
            (
                "Not_Valid",
                vec![SUBDOMAIN.to_string()],
                vec![LABEL.to_string()],
            ),
            ("-a", vec![SUBDOMAIN.to_string()], vec![LABEL.to_string()]),
            ("", vec![SUBDOMAIN.to_string()], vec![LABEL.to_string()]),
            (
                &long_label,
                vec![],
                vec!["must be no more than 63 characters".to_string()],
            ),
            (
                &long_subdomain,
                vec!["must be no more than 253 characters".to_string()],
                vec![
                    "must be no more than 63 characters".to_string(),
                    "must not contain dots".to_string(),
                ],
            ),
        ];
        for (name, subdomain, label) in cases {
            assert_eq!(dns1123_subdomain_errors(name), subdomain, "{name}");
            assert_eq!(dns1123_label_errors(name), label, "{name}");
        }
    }
}
