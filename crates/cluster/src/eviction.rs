//! `pods/eviction`: a delete that honours PodDisruptionBudgets, as kubectl drain uses it.
//! The budget is computed from the live pods at the moment of the request (what the
//! disruption controller would have written to the PDB's status), so a drain cannot
//! race past a budget by evicting faster than a controller updates it.

use serde_json::{Value, json};

use crate::pointer::Pointer;

use super::api::{Api, DeleteOptions, ListOptions};
use super::errors::ApiError;
use super::resources::Resource;
use super::selector::LabelSelector;

/// What a budget allows right now.
#[derive(Debug, PartialEq, Eq)]
pub struct Budget {
    pub expected: i64,
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub disruptions_allowed: i64,
}

/// Evicts a pod: deletes it unless a PDB covering it allows no disruption (429).
pub fn evict(
    api: &Api,
    pods: &Resource,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let pod = api.get_value(pods, namespace, name)?;
    let phase = pod
        .at("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let deleting = pod.at("/metadata/deletionTimestamp").is_some();
    if !terminal && !deleting {
        check_budgets(api, namespace, &pod)?;
    }
    api.delete(pods, namespace, name, options)?;
    Ok(())
}

fn check_budgets(api: &Api, namespace: &str, pod: &Value) -> Result<(), ApiError> {
    let Some(pdbs) = api.registry.get("policy", "v1", "poddisruptionbudgets") else {
        return Ok(());
    };
    let Some(pods) = api.registry.get("", "v1", "pods") else {
        return Ok(());
    };
    let labels = pod
        .at("/metadata/labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let covering: Vec<(Value, LabelSelector)> = api
        .list_values(&pdbs, Some(namespace), &ListOptions::default())?
        .into_iter()
        .filter_map(|pdb| {
            // A PDB without a selector selects nothing (policy/v1).
            let selector = LabelSelector::from_object(pdb.at("/spec/selector")).ok()??;
            selector.matches(&labels).then_some((pdb, selector))
        })
        .collect();
    let pdb_name = |pdb: &Value| {
        pdb.at("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    match covering.as_slice() {
        [] => Ok(()),
        [(pdb, selector)] => {
            let namespace_pods =
                api.list_values(&pods, Some(namespace), &ListOptions::default())?;
            let selected = covered_pods(selector, &namespace_pods);
            // An unhealthy pod may always go when the policy says so, or when the budget is met anyway.
            let policy = pdb
                .at("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str);
            let budget = budget(&pdb["spec"], &selected);
            if !is_healthy(pod)
                && (policy == Some("AlwaysAllow")
                    || budget.current_healthy >= budget.desired_healthy)
            {
                return Ok(());
            }
            if budget.disruptions_allowed > 0 {
                return Ok(());
            }
            Err(ApiError::too_many_requests(
                "Cannot evict pod as it would violate the pod's disruption budget.",
                vec![json!({
                    "reason": "DisruptionBudget",
                    "message": format!(
                        "The disruption budget {} needs {} healthy pods and has {} currently",
                        pdb_name(pdb), budget.desired_healthy, budget.current_healthy
                    ),
                })],
            ))
        }
        _ => Err(ApiError::internal(
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        )),
    }
}

/// The pods a budget's selector covers; finished pods count for nothing.
pub fn covered_pods(selector: &LabelSelector, pods: &[Value]) -> Vec<Value> {
    pods.iter()
        .filter(|p| {
            let labels = p
                .at("/metadata/labels")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let finished = matches!(
                p.at("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            selector.matches(&labels) && !finished
        })
        .cloned()
        .collect()
}

/// A pod counts as healthy when Ready and not on its way out.
pub fn is_healthy(pod: &Value) -> bool {
    pod.at("/metadata/deletionTimestamp").is_none()
        && pod
            .at("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// The disruption controller's arithmetic for one PDB spec over the pods it selects.
/// Percentages are of the selected pods (capstan's workloads have no scale subresource
/// to ask instead).
pub fn budget(spec: &Value, pods: &[Value]) -> Budget {
    let expected = pods
        .iter()
        .filter(|p| p.at("/metadata/deletionTimestamp").is_none())
        .count() as i64;
    let current_healthy = pods.iter().filter(|p| is_healthy(p)).count() as i64;
    let desired_healthy = if let Some(min) = spec.get("minAvailable") {
        resolve(min, expected, true)
    } else if let Some(max) = spec.get("maxUnavailable") {
        (expected - resolve(max, expected, false)).max(0)
    } else {
        expected
    };
    Budget {
        expected,
        current_healthy,
        desired_healthy,
        disruptions_allowed: (current_healthy - desired_healthy).max(0),
    }
}

/// An IntOrString: a count, or a percentage of `of` rounded up (minAvailable) or down.
fn resolve(value: &Value, of: i64, round_up: bool) -> i64 {
    match value {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()) {
            Some(percent) if round_up => (percent * of + 99) / 100,
            Some(percent) => percent * of / 100,
            None => s.parse().unwrap_or(0),
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ready: bool) -> Value {
        json!({"metadata": {"name": "p"}, "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    #[test]
    fn budgets_follow_the_disruption_controller() {
        let three_ready = vec![pod(true), pod(true), pod(true)];
        let cases = [
            (
                "minAvailable 2 of 3 ready",
                json!({"minAvailable": 2}),
                three_ready.clone(),
                1,
            ),
            (
                "minAvailable 3 of 3 ready",
                json!({"minAvailable": 3}),
                three_ready.clone(),
                0,
            ),
            (
                "maxUnavailable 1",
                json!({"maxUnavailable": 1}),
                three_ready.clone(),
                1,
            ),
            (
                "maxUnavailable 0",
                json!({"maxUnavailable": 0}),
                three_ready.clone(),
                0,
            ),
            (
                "minAvailable 50% rounds up",
                json!({"minAvailable": "50%"}),
                three_ready.clone(),
                1,
            ),
            (
                "maxUnavailable 50% rounds down",
                json!({"maxUnavailable": "50%"}),
                three_ready.clone(),
                1,
            ),
            (
                "one not ready eats the budget",
                json!({"minAvailable": 2}),
                vec![pod(true), pod(true), pod(false)],
                0,
            ),
        ];
        for (name, spec, pods, allowed) in cases {
            assert_eq!(budget(&spec, &pods).disruptions_allowed, allowed, "{name}");
        }
    }
}
