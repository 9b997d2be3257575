//! A renderer for the few Go-template forms capstan's chart uses, so that tests check the
//! chart against the kustomize base without the helm binary: `{{ OPERAND }}`,
//! `{{ OPERAND | quote }}`, `{{- toYaml OPERAND | nindent N }}`, `{{- if OPERAND }}`,
//! `{{- if eq|ne OPERAND "text" }}`, `{{- end }}` and `{{- fail "text" }}`, where an
//! OPERAND is `.Values.<path>` or `.Release.Namespace`; `{{-` and `-}}` trim whitespace as
//! Go's templates do. Anything else is an error, so a template using more fails its test.

use serde_json::Value;

/// One piece of a template.
enum Token<'a> {
    Text(&'a str),
    Action {
        trim_left: bool,
        body: &'a str,
        trim_right: bool,
    },
}

fn tokens(template: &str) -> Result<Vec<Token<'_>>, String> {
    let mut tokens = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        tokens.push(Token::Text(&rest[..start]));
        let end = rest[start..]
            .find("}}")
            .ok_or_else(|| format!("unclosed action in {:?}", &rest[start..]))?;
        let inner = &rest[start + 2..start + end];
        let trim_left = inner.starts_with("- ");
        let trim_right = inner.ends_with(" -");
        let body = inner.trim_start_matches("- ").trim_end_matches(" -").trim();
        tokens.push(Token::Action {
            trim_left,
            body,
            trim_right,
        });
        rest = &rest[start + end + 2..];
    }
    tokens.push(Token::Text(rest));
    Ok(tokens)
}

/// Renders `template` with `values` in the release namespace `namespace`.
pub fn render(template: &str, values: &Value, namespace: &str) -> Result<String, String> {
    let tokens = tokens(template)?;
    let mut out = String::new();
    // Whether each enclosing `if` holds.
    let mut active: Vec<bool> = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let on = active.iter().all(|holds| *holds);
        match token {
            Token::Text(text) => {
                let mut text: &str = text;
                if i > 0
                    && matches!(
                        tokens[i - 1],
                        Token::Action {
                            trim_right: true,
                            ..
                        }
                    )
                {
                    text = text.trim_start();
                }
                if matches!(
                    tokens.get(i + 1),
                    Some(Token::Action {
                        trim_left: true,
                        ..
                    })
                ) {
                    text = text.trim_end();
                }
                if on {
                    out.push_str(text);
                }
            }
            Token::Action { body, .. } => {
                if let Some(condition) = body.strip_prefix("if ") {
                    active.push(on && holds(condition, values, namespace)?);
                } else if *body == "end" {
                    active.pop().ok_or("an end without an if")?;
                } else if on {
                    out.push_str(&action(body, values, namespace)?);
                }
            }
        }
    }
    if !active.is_empty() {
        return Err("an if without its end".into());
    }
    Ok(out)
}

fn operand<'a>(text: &str, values: &'a Value, namespace: &'a str) -> Result<Value, String> {
    if text == ".Release.Namespace" {
        return Ok(Value::String(namespace.to_string()));
    }
    let path = text
        .strip_prefix(".Values.")
        .ok_or_else(|| format!("unknown operand {text}"))?;
    super::values::get(values, path)
        .cloned()
        .ok_or_else(|| format!("no value {path}"))
}

fn printed(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Go's truth: false, 0, "", null and empty collections are false.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(yes) => *yes,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(text) => !text.is_empty(),
        Value::Array(items) => !items.is_empty(),
        Value::Object(map) => !map.is_empty(),
    }
}

fn literal(text: &str) -> Result<String, String> {
    serde_json::from_str(text).map_err(|_| format!("not a string literal: {text}"))
}

fn holds(condition: &str, values: &Value, namespace: &str) -> Result<bool, String> {
    let words: Vec<&str> = condition.split_whitespace().collect();
    match words.as_slice() {
        [single] => Ok(truthy(&operand(single, values, namespace)?)),
        [test @ ("eq" | "ne"), left, right] => {
            let equal = printed(&operand(left, values, namespace)?) == literal(right)?;
            Ok(equal == (*test == "eq"))
        }
        _ => Err(format!("unknown condition {condition}")),
    }
}

fn action(body: &str, values: &Value, namespace: &str) -> Result<String, String> {
    if let Some(message) = body.strip_prefix("fail ") {
        return Err(literal(message)?);
    }
    if let Some(rest) = body.strip_prefix("toYaml ") {
        let (from, width) = rest
            .split_once(" | nindent ")
            .ok_or_else(|| format!("toYaml without nindent: {body}"))?;
        let width: usize = width.parse().map_err(|_| format!("nindent {width}"))?;
        let yaml = serde_saphyr::to_string(&operand(from, values, namespace)?)
            .map_err(|err| err.to_string())?;
        let pad = " ".repeat(width);
        return Ok(yaml
            .trim_end()
            .lines()
            .map(|line| format!("\n{pad}{line}"))
            .collect());
    }
    match body.split_once(" | ") {
        Some((from, "quote")) => Ok(serde_json::to_string(&printed(&operand(
            from, values, namespace,
        )?))
        .map_err(|err| err.to_string())?),
        Some(_) => Err(format!("unknown pipeline {body}")),
        None => Ok(printed(&operand(body, values, namespace)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_forms_the_chart_uses_render_as_helm_renders_them() {
        let values = json!({"a": {"b": "x"}, "n": 2, "on": true, "off": false, "kind": "ssh",
                            "block": {"k": "v", "l": [1]}});
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("v: {{ .Values.a.b }}\n", Ok("v: x\n")),
            ("v: {{ .Values.a.b | quote }}\n", Ok("v: \"x\"\n")),
            ("v: {{ .Values.n }}\n", Ok("v: 2\n")),
            ("ns: {{ .Release.Namespace }}\n", Ok("ns: capstan-system\n")),
            (
                "l:\n- a\n{{- if .Values.on }}\n- b\n{{- end }}\n- c\n",
                Ok("l:\n- a\n- b\n- c\n"),
            ),
            (
                "l:\n- a\n{{- if .Values.off }}\n- b\n{{- end }}\n- c\n",
                Ok("l:\n- a\n- c\n"),
            ),
            (
                "{{- if eq .Values.kind \"ssh\" }}\nyes\n{{- end }}\n",
                Ok("\nyes\n"),
            ),
            (
                "{{- if ne .Values.kind \"ssh\" }}\nyes\n{{- end }}\n",
                Ok("\n"),
            ),
            (
                "  r:\n    {{- toYaml .Values.block | nindent 4 }}\n",
                Ok("  r:\n    k: v\n    l:\n    - 1\n"),
            ),
            (
                "{{- if .Values.off }}{{- fail \"never\" }}{{- end }}ok",
                Ok("ok"),
            ),
            ("{{- fail \"stop here\" }}", Err("stop here")),
            ("{{ .Values.missing }}", Err("no value missing")),
            (
                "{{ include \"x\" . }}",
                Err("unknown operand include \"x\" ."),
            ),
            ("{{- if .Values.on }}", Err("an if without its end")),
        ];
        for (template, expected) in cases {
            let got = render(template, &values, "capstan-system");
            assert_eq!(
                got.as_deref(),
                expected.map_err(str::to_string).as_deref(),
                "{template}"
            );
        }
    }
}
