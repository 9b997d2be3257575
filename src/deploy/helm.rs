//! The Helm chart's text: templates made from the objects' YAML by turning each marker
//! (see [`super::values::Fill::Markers`]) into its template expression, values.yaml from
//! the settings table, and Chart.yaml.
//!
//! The markers a YAML line may hold, and what they become:
//!
//! | the line's value | template |
//! | --- | --- |
//! | `"@@image.pullPolicy@@"` | `{{ .Values.image.pullPolicy \| quote }}` (a string setting) |
//! | `"@@replicas@@"` | `{{ .Values.replicas }}` (any other setting) |
//! | `"@@Release.Namespace@@"` | `{{ .Release.Namespace \| quote }}` |
//! | `"@@image.repository@@:@@image.tag@@"` | `"{{ .Values.image.repository }}:{{ .Values.image.tag }}"` |
//! | `"@@block:resources@@"` | `{{- toYaml .Values.resources \| nindent N }}` on the next line |
//! | list item `"@@if:webhook.enabled@@--webhook..."` | the item between `{{- if .Values.webhook.enabled }}` and `{{- end }}` |
//! | list item `"@@if:credentials.type=ssh@@..."` | the item between `{{- if eq .Values.credentials.type "ssh" }}` and `{{- end }}` |

use regex::Regex;

use super::DeployError;
use super::values::{NAMESPACE, RELEASE_NAMESPACE, SETTINGS, setting};

/// `key` as a template operand: `.Values.key` or `.Release.Namespace`.
fn operand(key: &str) -> String {
    if key == RELEASE_NAMESPACE {
        format!(".{key}")
    } else {
        format!(".Values.{key}")
    }
}

/// Whether `key` is a string setting, which a template quotes.
fn is_text(key: &str) -> bool {
    key == RELEASE_NAMESPACE || (setting(key).default)().is_string()
}

/// A marked condition (`key` or `key=value`) as a template's `if`.
fn condition(marked: &str) -> String {
    match marked.split_once('=') {
        Some((key, value)) => format!("if eq {} {value:?}", operand(key)),
        None => format!("if {}", operand(marked)),
    }
}

/// `text` as a YAML scalar.
fn scalar(text: &str) -> Result<String, DeployError> {
    let yaml = serde_saphyr::to_string(&text.to_string()).map_err(|source| DeployError::Yaml {
        what: format!("the scalar {text:?}"),
        source,
    })?;
    Ok(yaml.trim_end().to_string())
}

/// The chart template of the YAML `yaml` written with markers. Adjacent list items under
/// the same condition share one `if`.
pub fn template(yaml: &str) -> Result<String, DeployError> {
    let line_shape = Regex::new(r#"^(\s*)(- )?([A-Za-z0-9_./-]+: )?(.*)$"#).expect("a valid regex");
    let mut out = String::new();
    // The `if` line of the block `out` ends with.
    let mut open: Option<String> = None;
    for line in yaml.lines() {
        if !line.contains("@@") {
            open = None;
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let parts = line_shape.captures(line).expect("every line matches");
        let part = |i| parts.get(i).map_or("", |m| m.as_str());
        let (indent, dash, key, value) = (part(1), part(2), part(3), part(4));
        let text: String =
            serde_saphyr::from_str(value).map_err(|_| DeployError::Marker(line.to_string()))?;
        let Some(rest) = text.strip_prefix("@@if:") else {
            open = None;
            out.push_str(&templated(indent, dash, key, &text)?);
            continue;
        };
        let (marked, item) = rest
            .split_once("@@")
            .ok_or_else(|| DeployError::Marker(line.to_string()))?;
        let if_line = format!("{indent}{{{{- {} }}}}\n", condition(marked));
        let end_line = format!("{indent}{{{{- end }}}}\n");
        if open.as_ref() == Some(&if_line) && out.ends_with(&end_line) {
            out.truncate(out.len() - end_line.len());
        } else {
            out.push_str(&if_line);
        }
        out.push_str(&templated(indent, dash, key, item)?);
        out.push_str(&end_line);
        open = Some(if_line);
    }
    Ok(out)
}

/// The template line (or lines) of one YAML line `<indent><dash><key><text>` whose value
/// `text` may hold markers.
fn templated(indent: &str, dash: &str, key: &str, text: &str) -> Result<String, DeployError> {
    if let Some(block) = text
        .strip_prefix("@@block:")
        .and_then(|rest| rest.strip_suffix("@@"))
    {
        let width = indent.len() + dash.len() + 2;
        return Ok(format!(
            "{indent}{dash}{}\n{}{{{{- toYaml {} | nindent {width} }}}}\n",
            key.trim_end(),
            " ".repeat(width),
            operand(block)
        ));
    }
    if let Some(whole) = text
        .strip_prefix("@@")
        .and_then(|rest| rest.strip_suffix("@@"))
        .filter(|whole| !whole.contains("@@"))
    {
        let filter = if is_text(whole) { " | quote" } else { "" };
        return Ok(format!(
            "{indent}{dash}{key}{{{{ {}{filter} }}}}\n",
            operand(whole)
        ));
    }
    let mut filled = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("@@") {
        let after = &rest[start + 2..];
        let end = after
            .find("@@")
            .ok_or_else(|| DeployError::Marker(text.to_string()))?;
        filled.push_str(&rest[..start]);
        filled.push_str(&format!("{{{{ {} }}}}", operand(&after[..end])));
        rest = &after[end + 2..];
    }
    filled.push_str(rest);
    Ok(format!("{indent}{dash}{key}{}\n", scalar(&filled)?))
}

/// A template that renders only when `marked` (`key` or `key=value`) holds.
pub fn only_if(marked: &str, template: &str) -> String {
    format!(
        "{{{{- {} }}}}\n{template}{{{{- end }}}}\n",
        condition(marked)
    )
}

/// The template that stops an install outside capstan's namespace, where capstan keeps
/// its `GitSync` and `HistoryRecord`s whatever the release's namespace.
pub fn namespace_check() -> String {
    format!(
        "{{{{- if ne {} {NAMESPACE:?} }}}}\n\
         {{{{- fail \"capstan keeps its GitSync and HistoryRecords in {NAMESPACE}: install the chart there (helm install capstan charts/capstan --namespace {NAMESPACE} --create-namespace)\" }}}}\n\
         {{{{- end }}}}\n",
        operand(RELEASE_NAMESPACE)
    )
}

/// values.yaml: every setting with its comment and default, grouped by its first key.
pub fn values_yaml(header: &str) -> Result<String, DeployError> {
    let mut out = String::from(header);
    let mut group = "";
    for setting in SETTINGS {
        let (parent, leaf) = setting.key.split_once('.').unwrap_or(("", setting.key));
        let top = if parent.is_empty() { leaf } else { parent };
        if top != group {
            group = top;
            out.push('\n');
            if !parent.is_empty() {
                out.push_str(&format!("{parent}:\n"));
            }
        }
        let indent = if parent.is_empty() { "" } else { "  " };
        out.push_str(&comment(indent, setting.comment));
        let default = (setting.default)();
        let yaml = serde_saphyr::to_string(&default).map_err(|source| DeployError::Yaml {
            what: format!("the default of {}", setting.key),
            source,
        })?;
        if default.is_object() || default.is_array() {
            out.push_str(&format!("{indent}{leaf}:\n"));
            for line in yaml.lines() {
                out.push_str(&format!("{indent}  {line}\n"));
            }
        } else {
            out.push_str(&format!("{indent}{leaf}: {}\n", yaml.trim_end()));
        }
    }
    Ok(out)
}

/// `text` as YAML comment lines at `indent`; nothing for no text.
fn comment(indent: &str, text: &str) -> String {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| format!("{indent}# {}\n", line.trim()))
        .collect()
}

/// Chart.yaml: the chart's version is capstan's.
pub fn chart_yaml(header: &str) -> String {
    let version = env!("CARGO_PKG_VERSION");
    format!(
        "{header}apiVersion: v2\n\
         name: capstan\n\
         description: GitOps for ordered, node-level kernel-module upgrades on Kubernetes\n\
         type: application\n\
         version: {version}\n\
         appVersion: \"v{version}\"\n"
    )
}
