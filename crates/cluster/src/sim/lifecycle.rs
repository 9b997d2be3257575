//! The node lifecycle, pod garbage collection and disruption controllers of the
//! simulated controller-manager: a cordoned node gets the `node.kubernetes.io/unschedulable`
//! NoSchedule taint (with the time it was added, which drain strategies measure from),
//! pods of a removed node are deleted, and every PodDisruptionBudget's status follows
//! its pods.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Simulation;
use crate::api::{Api, DeleteOptions, ListOptions, PatchType, WriteOptions};
use crate::errors::ApiError;
use crate::eviction;
use crate::pointer::Pointer;
use crate::selector::LabelSelector;
use crate::store::{Change, EventType, Followed};
use capstan_api::clock::rfc3339;
use capstan_api::labels::UNSCHEDULABLE_TAINT;

/// How often changed namespaces' budgets are recomputed, at most.
const BUDGET_INTERVAL: Duration = Duration::from_millis(50);

/// Runs until the store closes.
pub async fn run(sim: Arc<Simulation>) {
    let api = sim.api.clone();
    let mut changes = api.store.follow();
    let mut dirty: BTreeSet<String> = all_namespaces(&api);
    for node in api.store.list("nodes", None, None, None, None).items {
        taint_if_cordoned(&api, &node.value());
    }
    let mut tick = tokio::time::interval(BUDGET_INTERVAL);
    loop {
        tokio::select! {
            followed = changes.next() => match followed {
                Some(Followed::Change(change)) => observe(&api, &change, &mut dirty),
                Some(Followed::Restart) => dirty = all_namespaces(&api),
                None => return,
            },
            _ = tick.tick(), if !dirty.is_empty() => {
                for namespace in std::mem::take(&mut dirty) {
                    report(update_budgets(&api, &namespace), "updating disruption budgets");
                }
            }
        }
    }
}

fn all_namespaces(api: &Api) -> BTreeSet<String> {
    api.store
        .list("namespaces", None, None, None, None)
        .items
        .iter()
        .filter_map(|n| {
            n.projection["metadata"]["name"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn observe(api: &Api, change: &Change, dirty: &mut BTreeSet<String>) {
    match (change.key.storage.as_str(), change.event) {
        ("nodes", EventType::Deleted) => delete_pods_of(api, &change.key.name),
        ("nodes", _) => taint_if_cordoned(api, change.value()),
        ("pods" | "poddisruptionbudgets", _) => {
            dirty.insert(change.key.namespace.clone());
        }
        _ => {}
    }
}

fn report(result: Result<(), ApiError>, what: &str) {
    if let Err(err) = result
        && !matches!(err.code, 404 | 409)
    {
        tracing::warn!(%err, "{what}");
    }
}

fn options(manager: &str) -> WriteOptions {
    WriteOptions {
        field_manager: Some(manager.into()),
        ..WriteOptions::default()
    }
}

/// Adds or removes the unschedulable taint to match `spec.unschedulable`.
fn taint_if_cordoned(api: &Api, node: &Value) {
    let cordoned = node.at("/spec/unschedulable").and_then(Value::as_bool) == Some(true);
    let taints: Vec<Value> = node
        .at("/spec/taints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let tainted = taints
        .iter()
        .any(|t| t["key"] == UNSCHEDULABLE_TAINT && t["effect"] == "NoSchedule");
    if cordoned == tainted {
        return;
    }
    let mut next: Vec<Value> = taints
        .into_iter()
        .filter(|t| t["key"] != UNSCHEDULABLE_TAINT)
        .collect();
    if cordoned {
        next.push(json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": rfc3339(api.clock.now())}));
    }
    let Some(nodes) = api.registry.get("", "v1", "nodes") else {
        return;
    };
    let name = node["metadata"]["name"].as_str().unwrap_or("");
    let patch = json!({"metadata": {"resourceVersion": node["metadata"]["resourceVersion"]}, "spec": {"taints": next}});
    let result = api.patch(
        &nodes,
        "",
        name,
        None,
        PatchType::Merge,
        patch,
        &options("node-lifecycle-controller"),
    );
    report(result.map(|_| ()), "tainting a cordoned node");
}

/// Pod garbage collection: pods bound to a node that no longer exists are deleted.
fn delete_pods_of(api: &Api, node: &str) {
    let Some(pods) = api.registry.get("", "v1", "pods") else {
        return;
    };
    let Ok(selector) = crate::selector::FieldSelector::parse(&format!("spec.nodeName={node}"))
    else {
        return;
    };
    let list = ListOptions {
        field_selector: Some(selector),
        ..ListOptions::default()
    };
    let Ok(bound) = api.list_values(&pods, None, &list) else {
        return;
    };
    let now = DeleteOptions {
        grace_period_seconds: Some(0),
        ..DeleteOptions::default()
    };
    for pod in bound {
        let meta = &pod["metadata"];
        let result = api.delete(
            &pods,
            meta["namespace"].as_str().unwrap_or(""),
            meta["name"].as_str().unwrap_or(""),
            &now,
        );
        report(result.map(|_| ()), "deleting a pod of a removed node");
    }
}

/// The disruption controller for one namespace.
fn update_budgets(api: &Api, namespace: &str) -> Result<(), ApiError> {
    let (Some(pdbs), Some(pods)) = (
        api.registry.get("policy", "v1", "poddisruptionbudgets"),
        api.registry.get("", "v1", "pods"),
    ) else {
        return Ok(());
    };
    let budgets = api.list_values(&pdbs, Some(namespace), &ListOptions::default())?;
    if budgets.is_empty() {
        return Ok(());
    }
    let all_pods = api.list_values(&pods, Some(namespace), &ListOptions::default())?;
    for pdb in budgets {
        let Ok(Some(selector)) = LabelSelector::from_object(pdb.at("/spec/selector")) else {
            continue;
        };
        let selected = eviction::covered_pods(&selector, &all_pods);
        let budget = eviction::budget(&pdb["spec"], &selected);
        let allowed = budget.disruptions_allowed > 0;
        let mut status = json!({
            "observedGeneration": pdb.at("/metadata/generation").cloned().unwrap_or(json!(1)),
            "disruptionsAllowed": budget.disruptions_allowed,
            "currentHealthy": budget.current_healthy,
            "desiredHealthy": budget.desired_healthy,
            "expectedPods": budget.expected,
        });
        let condition = json!({"type": "DisruptionAllowed", "status": if allowed {"True"} else {"False"},
                               "reason": if allowed {"SufficientPods"} else {"InsufficientPods"}, "message": "",
                               "observedGeneration": status["observedGeneration"]});
        let current = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
        let unchanged = [
            "observedGeneration",
            "disruptionsAllowed",
            "currentHealthy",
            "desiredHealthy",
            "expectedPods",
        ]
        .iter()
        .all(|f| current.get(*f) == status.get(*f));
        if unchanged {
            continue;
        }
        let transition = current
            .at("/conditions/0")
            .filter(|c| c["status"] == condition["status"])
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(rfc3339(api.clock.now())));
        let mut condition = condition;
        condition["lastTransitionTime"] = transition;
        status["conditions"] = json!([condition]);
        let name = pdb["metadata"]["name"].as_str().unwrap_or("");
        api.patch(
            &pdbs,
            namespace,
            name,
            Some("status"),
            PatchType::Merge,
            json!({"status": status}),
            &options("disruption-controller"),
        )?;
    }
    Ok(())
}
