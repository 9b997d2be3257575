//! Kubernetes' name and label rules (upstream `k8s.io/apimachinery/pkg/util/validation`),
//! shared by capstan's validation of a commit and by the embedded cluster's admission.

/// A qualified name: optional DNS-subdomain prefix (<= 253) and a name part (<= 63).
pub fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || prefix.len() > 253)
    {
        return Err("prefix part must be a DNS-1123 subdomain of at most 253 characters".into());
    }
    if name.is_empty() || name.len() > 63 {
        return Err(format!(
            "name part must be no more than 63 characters (has {})",
            name.len()
        ));
    }
    if !label_value(name) {
        return Err("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character".into());
    }
    Ok(())
}

pub fn label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && value
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric())
            && value
                .bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric()))
}

