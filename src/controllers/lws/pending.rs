//! What the LWS controller still has to do, as `capstan sync --once` waits for it: every
//! LeaderWorkerSet's status describes its current generation, it is `Available` (every
//! group ready, and those the partition does not hold back updated), and its surge groups
//! are gone (`status.replicas` equals `spec.replicas`).

use kube::ResourceExt as _;

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::condition_types;

/// What an LWS still waits for, if anything: its controller to see its generation, its
/// groups to be ready and updated, or its surge groups to go.
pub fn pending(lws: &LeaderWorkerSet) -> Option<String> {
    let name = format!("{}/{}", lws.namespace().unwrap_or_default(), lws.name_any());
    let status = lws.status.clone().unwrap_or_default();
    let generation = lws.metadata.generation.unwrap_or(0);
    if status.observed_generation < generation {
        return Some(format!(
            "LeaderWorkerSet {name}: generation {generation} not seen by its controller yet"
        ));
    }
    let available = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition_types::AVAILABLE && c.status == "True");
    if !available || status.replicas != lws.spec.replicas {
        return Some(format!(
            "LeaderWorkerSet {name} is rolling out: {} of {} groups ready, {} updated, {} running",
            status.ready_replicas, lws.spec.replicas, status.updated_replicas, status.replicas
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::controllers::lws::revision::tests::{lws, sample_json};

    /// The sample LWS (two groups) at generation 2, with `status`.
    fn with_status(status: Value) -> LeaderWorkerSet {
        let mut value = sample_json();
        value["metadata"]["namespace"] = json!("ns");
        value["metadata"]["generation"] = json!(2);
        value["status"] = status;
        lws(value)
    }

    #[test]
    fn an_lws_is_pending_until_its_controller_saw_it_and_it_is_available_without_surge() {
        let available = json!([{"type": "Available", "status": "True", "reason": "AllGroupsReady",
                                "message": "", "lastTransitionTime": "2026-12-01T12:00:00Z"}]);
        let rolling = |ready, updated, running| {
            format!(
                "LeaderWorkerSet ns/{} is rolling out: {ready} of 2 groups ready, {updated} \
                 updated, {running} running",
                with_status(json!({})).name_any()
            )
        };
        let name = with_status(json!({})).name_any();
        // (case, status, pending)
        let rows = [
            (
                "at rest",
                json!({"observedGeneration": 2, "conditions": available, "replicas": 2,
                       "readyReplicas": 2, "updatedReplicas": 2}),
                None,
            ),
            (
                "its generation not seen yet",
                json!({"observedGeneration": 1, "conditions": available, "replicas": 2}),
                Some(format!(
                    "LeaderWorkerSet ns/{name}: generation 2 not seen by its controller yet"
                )),
            ),
            (
                "not available",
                json!({"observedGeneration": 2, "replicas": 2, "readyReplicas": 1,
                       "updatedReplicas": 2}),
                Some(rolling(1, 2, 2)),
            ),
            (
                "a surge group still running",
                json!({"observedGeneration": 2, "conditions": available, "replicas": 3,
                       "readyReplicas": 2, "updatedReplicas": 2}),
                Some(rolling(2, 2, 3)),
            ),
        ];
        for (case, status, want) in rows {
            assert_eq!(pending(&with_status(status)), want, "{case}");
        }
    }
}
