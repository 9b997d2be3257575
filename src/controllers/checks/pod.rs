//! A pod gate's check pod: any image, run once on the node under check, which must succeed.
//!
//! It is created in `capstan-system`, bound to the node by name (no scheduler: a cordoned
//! node runs it too), tolerating every taint, owned by the Node (it goes with it). Its
//! name is the attempt's, so an attempt has one pod whatever restarts come between.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, SecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt as _;

use crate::controllers::upgrade::guard::{CheckRun, Seen};
use capstan_api::PodCheck;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels::{ModuleKey, RECORD_NODE_LABEL};

/// The label naming the gate a check pod runs.
pub const GATE_LABEL: &str = "capstan.dev/gate";

/// The name of the check pod of `run` over `key`'s move on `node`.
pub fn name(node: &str, key: &ModuleKey, run: &CheckRun) -> String {
    let digest = capstan_api::canonical::sha256_hex(
        format!(
            "{node}\n{key}\n{:?}\n{}\n{}\n{}",
            run.when, run.name, run.attempt, run.since
        )
        .as_bytes(),
        8,
    );
    let gate: String = run.name.chars().take(40).collect();
    format!("check-{gate}-{digest}")
}

/// The check pod of `run` on `node`.
pub fn build(node: &Node, key: &ModuleKey, run: &CheckRun, spec: &PodCheck) -> Pod {
    let node_name = node.name_any();
    let labels = BTreeMap::from([
        (RECORD_NODE_LABEL.to_string(), node_name.clone()),
        (GATE_LABEL.to_string(), run.name.clone()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "capstan".to_string(),
        ),
    ]);
    let mut annotations = spec.annotations.clone();
    annotations.insert("capstan.dev/module".to_string(), key.to_string());
    annotations.insert("capstan.dev/attempt".to_string(), run.attempt.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(name(&node_name, key, run)),
            namespace: Some(SYSTEM_NAMESPACE.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: node.uid().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".to_string(),
                    kind: "Node".to_string(),
                    name: node_name.clone(),
                    uid,
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node_name),
            restart_policy: Some("Never".to_string()),
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_string()),
                ..Toleration::default()
            }]),
            host_pid: spec.privileged.then_some(true),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "check".to_string(),
                image: Some(spec.image.clone()),
                command: (!spec.command.is_empty()).then(|| spec.command.clone()),
                args: (!spec.args.is_empty()).then(|| spec.args.clone()),
                security_context: spec.privileged.then(|| SecurityContext {
                    privileged: Some(true),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// What a check pod (`None`: not there) says of its attempt.
pub fn seen(name: &str, pod: Option<&Pod>) -> Seen {
    let Some(pod) = pod else {
        return Seen::Absent;
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.first())
        .and_then(|s| s.state.as_ref())
        .and_then(|state| state.terminated.as_ref());
    let exit = terminated.map(|t| {
        let mut text = format!("exit code {}", t.exit_code);
        if let Some(reason) = t.reason.as_deref().filter(|r| !r.is_empty()) {
            text.push_str(&format!(" ({reason})"));
        }
        if let Some(message) = t.message.as_deref().filter(|m| !m.is_empty()) {
            text.push_str(&format!(": {}", message.trim()));
        }
        text
    });
    match phase {
        "Succeeded" => Seen::Passed(format!("check pod {name} succeeded")),
        "Failed" => Seen::Failed(format!(
            "check pod {name} failed{}",
            exit.map(|e| format!(", {e}")).unwrap_or_default()
        )),
        _ => {
            let waiting = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|statuses| statuses.first())
                .and_then(|s| s.state.as_ref())
                .and_then(|state| state.waiting.as_ref())
                .and_then(|w| w.reason.clone());
            Seen::NotYet(format!(
                "check pod {name} is {phase}{}",
                waiting.map(|w| format!(" ({w})")).unwrap_or_default()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_check_pod_passes_when_it_succeeds_and_fails_with_its_exit() {
        let pod = |status: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status})).unwrap()
        };
        let failed = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "check", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "GPU 0 lost"}}}]}));
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "check", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull"}}}]}));
        // (pod, seen)
        let rows = [
            (None, Seen::Absent),
            (
                Some(pod(json!({"phase": "Succeeded"}))),
                Seen::Passed("check pod p succeeded".into()),
            ),
            (
                Some(failed),
                Seen::Failed("check pod p failed, exit code 3 (Error): GPU 0 lost".into()),
            ),
            (
                Some(pulling),
                Seen::NotYet("check pod p is Pending (ErrImagePull)".into()),
            ),
            (
                Some(pod(json!({"phase": "Running"}))),
                Seen::NotYet("check pod p is Running".into()),
            ),
        ];
        for (pod, expected) in rows {
            assert_eq!(seen("p", pod.as_ref()), expected);
        }
    }
}
