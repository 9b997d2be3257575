//! What the LWS reconcilers read off pods and StatefulSets, as upstream's helpers read it
//! (`pkg/utils/pod/pod_utils.go`, `pkg/utils/statefulset/statefulset_utils.go`).

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use super::group::parent_and_ordinal;
use super::labels::{
    GROUP_INDEX_LABEL, LEADER_NAME_ANNOTATION, REVISION_KEY_LABEL, WORKER_INDEX_LABEL,
};

/// Whether `pod` is a leader pod: `worker-index` 0 (upstream `LeaderPod`).
pub fn is_leader(pod: &Pod) -> bool {
    pod.labels().get(WORKER_INDEX_LABEL).map(String::as_str) == Some("0")
}

/// Whether `pod` is a worker pod: made by a worker StatefulSet, which annotates its pods
/// with their leader's name.
pub fn is_worker(pod: &Pod) -> bool {
    pod.annotations().contains_key(LEADER_NAME_ANNOTATION) && !is_leader(pod)
}

/// The group `pod` belongs to: its `group-index` label, or for a leader not labelled yet
/// the ordinal in its name, as upstream's webhook sets the label.
pub fn group_index(pod: &Pod) -> Option<i32> {
    if let Some(index) = pod.labels().get(GROUP_INDEX_LABEL) {
        return index.parse().ok();
    }
    if is_leader(pod) {
        return parent_and_ordinal(&pod.name_any()).map(|(_, ordinal)| ordinal);
    }
    None
}

/// The revision key an object was made from (`template-revision-hash`), empty when none.
pub fn revision_key<K: kube::Resource>(object: &K) -> &str {
    object
        .meta()
        .labels
        .as_ref()
        .and_then(|labels| labels.get(REVISION_KEY_LABEL))
        .map(String::as_str)
        .unwrap_or("")
}

/// Phase Running and condition Ready True (upstream `PodRunningAndReady`).
pub fn running_and_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .is_some_and(|status| status.phase.as_deref() == Some("Running"))
        && ready(pod)
}

/// Condition Ready True (upstream `IsPodReady`).
pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// Whether the pod is Pending.
pub fn pending(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.phase.as_deref())
        .is_none_or(|phase| phase == "Pending")
}

/// A container or init container restarted while the pod is Running or Pending (upstream
/// `ContainerRestarted`), or the pod is being deleted (`PodDeleted`).
pub fn restarted_or_deleted(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return true;
    }
    let Some(status) = &pod.status else {
        return false;
    };
    if !matches!(status.phase.as_deref(), Some("Running" | "Pending")) {
        return false;
    }
    let restarted = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        statuses
            .iter()
            .flatten()
            .any(|container| container.restart_count > 0)
    };
    restarted(&status.init_container_statuses) || restarted(&status.container_statuses)
}

/// Every replica available and no revision rolling (upstream `StatefulsetReady`).
pub fn set_ready(set: &StatefulSet) -> bool {
    let replicas = set
        .spec
        .as_ref()
        .and_then(|spec| spec.replicas)
        .unwrap_or(1);
    let Some(status) = &set.status else {
        return false;
    };
    replicas == status.available_replicas.unwrap_or(0)
        && status.current_revision == status.update_revision
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_pod_is_read_as_upstream_reads_it() {
        let leader = pod(json!({
            "metadata": {"name": "vllm-2", "labels": {WORKER_INDEX_LABEL: "0"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
        }));
        assert!(is_leader(&leader) && !is_worker(&leader));
        assert_eq!(group_index(&leader), Some(2));
        assert!(running_and_ready(&leader));
        assert!(!restarted_or_deleted(&leader));

        let worker = pod(json!({
            "metadata": {"name": "vllm-2-1", "labels": {GROUP_INDEX_LABEL: "2"},
                         "annotations": {LEADER_NAME_ANNOTATION: "vllm-2"}},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 1}]},
        }));
        assert!(is_worker(&worker) && !is_leader(&worker));
        assert_eq!(group_index(&worker), Some(2));
        assert!(!running_and_ready(&worker));
        assert!(restarted_or_deleted(&worker));

        let finished = pod(json!({
            "metadata": {"name": "vllm-2-1"},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 1}]},
        }));
        assert!(
            !restarted_or_deleted(&finished),
            "restarts count only while Running or Pending"
        );
        let deleting = pod(
            json!({"metadata": {"name": "vllm-2-1", "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert!(restarted_or_deleted(&deleting));
        assert!(pending(&deleting), "a pod with no phase yet is pending");
    }

    #[test]
    fn a_worker_set_is_ready_once_every_replica_is_available_on_one_revision() {
        let set = |replicas: i32, available: i32, current: &str, update: &str| -> StatefulSet {
            serde_json::from_value(json!({
                "metadata": {"name": "vllm-0"},
                "spec": {"replicas": replicas, "selector": {}, "serviceName": "vllm",
                         "template": {}},
                "status": {"replicas": replicas, "availableReplicas": available,
                           "currentRevision": current, "updateRevision": update},
            }))
            .unwrap()
        };
        assert!(set_ready(&set(3, 3, "a", "a")));
        assert!(!set_ready(&set(3, 2, "a", "a")));
        assert!(!set_ready(&set(3, 3, "a", "b")));
        assert!(set_ready(&set(0, 0, "a", "a")));
    }
}
