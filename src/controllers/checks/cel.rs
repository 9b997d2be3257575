//! A CEL gate: an expression over the node and the pods on it that must be true, as
//! Flux's health checks and Kubernetes' validation rules write conditions over objects.
//!
//! The expression sees two variables, each as the API server serves it:
//!
//! - `node`: the Node (`node.status.conditions`, `node.metadata.labels`, ...);
//! - `pods`: the pods bound to the node, in any namespace (`pods.exists(p, ...)`).
//!
//! A missing map key reads as null (`labels["rack"] == "1"` is false); a field of a
//! missing field is an error: guard optional fields with `has(...)`. An expression that
//! errs or is not a boolean is not passed, and says why.

use cel_interpreter::{Context, Program, Value};
use k8s_openapi::api::core::v1::{Node, Pod};

/// The expression parsed; why it does not parse otherwise (for `capstan.yaml`'s errors).
pub fn compile(expression: &str) -> Result<Program, String> {
    if expression.trim().is_empty() {
        return Err("no expression".to_string());
    }
    Program::compile(expression).map_err(|err| {
        let text = err.to_string();
        format!(
            "{expression:?} is not a CEL expression: {}",
            text.lines().next().unwrap_or_default().trim()
        )
    })
}

/// The expression's value for `node` and `pods`: `Ok(true)` passes; `Ok(false)` and
/// `Err` (with why) fail.
pub fn evaluate(expression: &str, node: &Node, pods: &[Pod]) -> Result<bool, String> {
    let program = compile(expression)?;
    let mut context = Context::default();
    let node = cel_interpreter::to_value(node).map_err(|err| format!("reading the node: {err}"))?;
    let pods = cel_interpreter::to_value(pods).map_err(|err| format!("reading its pods: {err}"))?;
    context.add_variable_from_value("node", node);
    context.add_variable_from_value("pods", pods);
    match program.execute(&context) {
        Ok(Value::Bool(value)) => Ok(value),
        Ok(other) => Err(format!("the expression is {other:?}, not true or false")),
        Err(err) => Err(format!("the expression failed: {err}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "node-1", "labels": {"zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap()
    }

    fn pod(app: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": app, "namespace": "kmm", "labels": {"app": app}},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// (expression, node Ready, pods, value or the error's words)
    type Row<'a> = (&'a str, &'a str, &'a [Pod], Result<bool, &'a str>);

    #[test]
    fn an_expression_is_true_false_or_an_error_that_says_why() {
        let ready = r#"node.status.conditions.exists(c, c.type == "Ready" && c.status == "True")"#;
        let plugin = r#"pods.exists(p, p.metadata.labels["app"] == "gpu-plugin" && p.status.phase == "Running")"#;
        let pods = [pod("gpu-plugin", "Running"), pod("other", "Pending")];
        // (expression, node Ready, pods, value)
        let rows: [Row; 8] = [
            (ready, "True", &[], Ok(true)),
            (ready, "False", &[], Ok(false)),
            (plugin, "True", &pods, Ok(true)),
            (plugin, "True", &pods[1..], Ok(false)),
            (
                r#"node.metadata.labels["zone"] == "a""#,
                "True",
                &[],
                Ok(true),
            ),
            // A missing key reads as null: the comparison is false.
            (
                r#"node.metadata.labels["rack"] == "1""#,
                "True",
                &[],
                Ok(false),
            ),
            (
                r#"node.metadata.nope.deeper == "1""#,
                "True",
                &[],
                Err("the expression failed"),
            ),
            ("size(pods)", "True", &pods, Err("not true or false")),
        ];
        for (expression, ready, pods, expected) in rows {
            let got = evaluate(expression, &node(ready), pods);
            match expected {
                Ok(value) => assert_eq!(got, Ok(value), "{expression}"),
                Err(why) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(why)),
                    "{expression}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn an_expression_that_does_not_parse_is_refused_with_its_text() {
        let err = compile("node.status.(").unwrap_err();
        assert!(err.contains("is not a CEL expression"), "{err}");
        assert_eq!(compile(" ").unwrap_err(), "no expression");
        assert!(compile("true").is_ok());
    }
}
