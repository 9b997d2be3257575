//! The LWS pod reconciler: one reconcile per pod of a LeaderWorkerSet (upstream
//! `PodReconciler`). It reads the pod, its LWS, its group and, for a worker, its leader from
//! the caches, calls [`group::decide`], and writes what that says: the labels upstream's
//! webhook would have set (a merge patch), the Foreground deletion of a group's leader
//! pod, the group's headless Service under `UniquePerReplica`, and the group's worker
//! StatefulSet, created (never patched) from the revision the leader pod was made from.
//!
//! It follows the LWS pods (the trigger) and the worker StatefulSets (mapped to the leader
//! pod that owns them), so a worker StatefulSet deleted by hand is created again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;

use super::group::{
    self, Decision, LeaderFacts, LeaderSide, PodFacts, Role, WorkerOwnership, WorkerSet, WorkerSide,
};
use super::labels::{
    EXCLUSIVE_KEY_ANNOTATION, GROUP_INDEX_LABEL, GROUP_KEY_LABEL, LEADER_NAME_ANNOTATION,
    NAME_LABEL, RECREATE_GROUP_AFTER_START_ANNOTATION, REVISION_KEY_LABEL, SIZE_ANNOTATION,
    SUBGROUP_INDEX_LABEL, SUBGROUP_KEY_LABEL, SUBGROUP_POLICY_TYPE_ANNOTATION,
    SUBGROUP_SIZE_ANNOTATION, WORKER_INDEX_LABEL,
};
use super::reconciler::{ensure_headless_service, event};
use super::{facts, revision, statefulsets};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::Runner;
use capstan_api::LeaderWorkerSet;
use capstan_api::lws::SubdomainPolicy;
use capstan_api::managers;

/// Next look for the revision a leader pod names (upstream's 1 s).
const REVISION_RECHECK: Duration = Duration::from_secs(1);

struct Shared {
    ctx: Arc<Context>,
    lwss: Store<LeaderWorkerSet>,
    sets: Store<StatefulSet>,
    pods: Store<Pod>,
}

/// Runs the LWS pod reconciler until `ctx.shutdown`. Subscribes to `caches`; the caller
/// starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (lwss, lwss_ready) = caches.leader_worker_sets.reader();
    let (sets, sets_ready) = caches.lws_stateful_sets.reader();
    let (pods, pods_ready) = caches.lws_pods.reader();
    let pod_changes = caches.lws_pods.subscribe();
    let set_changes = caches.lws_stateful_sets.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        lwss,
        sets,
        pods: pods.clone(),
    });
    let controller = Controller::for_shared_stream(pod_changes, pods).watches_shared_stream(
        set_changes,
        |set: Arc<StatefulSet>| {
            let owner = set
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true) && o.kind == "Pod" && o.api_version == "v1")?;
            Some(ObjectRef::new(&owner.name).within(set.namespace().as_deref()?))
        },
    );
    Runner::new("lws/pods", &ctx)
        .reads(lwss_ready)
        .reads(sets_ready)
        .reads(pods_ready)
        .run(controller, reconcile, shared)
}

async fn reconcile(pod: Arc<Pod>, shared: Arc<Shared>) -> Result<Action, kube::Error> {
    let ctx = &shared.ctx;
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let Some(lws_name) = pod.labels().get(NAME_LABEL).cloned() else {
        return Ok(Action::await_change());
    };
    let Some(lws) = shared
        .lwss
        .get(&ObjectRef::new(&lws_name).within(&namespace))
    else {
        // Its LWS is gone: the garbage collector removes the pod.
        return Ok(Action::await_change());
    };
    let leader_key = facts::revision_key(pod.as_ref()).to_string();
    // The revision matters only to create a worker StatefulSet: a leader whose set exists
    // (nearly every change to a running leader) lists none.
    let needs_revision = facts::is_leader(&pod)
        && !leader_key.is_empty()
        && shared
            .sets
            .get(&ObjectRef::new(&name).within(&namespace))
            .is_none();
    let revision = if needs_revision {
        let revisions: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &namespace);
        let listed = revisions
            .list(&ListParams::default().labels(&format!(
                "{NAME_LABEL}={lws_name},{REVISION_KEY_LABEL}={leader_key}"
            )))
            .await?
            .items
            .into_iter()
            .filter(|found| revision::belongs_to(found, &lws))
            .collect::<Vec<_>>();
        revision::find(&listed, &lws, &leader_key).cloned()
    } else {
        None
    };
    let facts = pod_facts(&shared, &lws, &pod, revision.is_some());
    let decision = group::decide(&name, &facts);
    tracing::debug!(pod = %name, ?decision, "lws pod decided");
    let lws_ref = lws.object_ref(&());
    match decision {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::Label(labels) => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
            let patch = json!({"metadata": {"labels": labels}});
            let params = PatchParams {
                field_manager: Some(managers::LWS.to_string()),
                ..PatchParams::default()
            };
            match pods.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => Ok(Action::await_change()),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
                Err(err) => Err(err),
            }
        }
        Decision::RecreateGroup { leader, cause } => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Foreground),
                ..DeleteParams::default()
            };
            match pods.delete(&leader, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Ok(Action::await_change());
                }
                Err(err) => return Err(err),
            }
            let group = group::parent_and_ordinal(&leader)
                .map(|(_, index)| index.to_string())
                .unwrap_or_default();
            let note = format!(
                "Worker pod {cause} failed, deleted leader pod {leader} to recreate group {group}"
            );
            let related = shared.pods.get(&ObjectRef::new(&leader).within(&namespace));
            event(
                ctx,
                &lws_ref,
                related.as_deref(),
                false,
                "RecreateGroup",
                "Delete",
                note,
            )
            .await;
            Ok(Action::await_change())
        }
        Decision::MisplacedLeader => {
            let note = format!(
                "leader pod {namespace}/{name} contains mistake annotation '{LEADER_NAME_ANNOTATION}': requires Kubernetes ≥v1.27 or v1.26 with StatefulSetStartOrdinal feature"
            );
            event(
                ctx,
                &lws_ref,
                Some(pod.as_ref()),
                true,
                "FailedCreate",
                "Create",
                note,
            )
            .await;
            Ok(Action::await_change())
        }
        Decision::Leader(actions) => {
            if actions.service {
                let selector = BTreeMap::from([
                    (NAME_LABEL.to_string(), lws_name.clone()),
                    (
                        GROUP_INDEX_LABEL.to_string(),
                        pod.labels()
                            .get(GROUP_INDEX_LABEL)
                            .cloned()
                            .unwrap_or_default(),
                    ),
                ]);
                ensure_headless_service(ctx, &lws, &name, selector, pod_owner(&pod)).await?;
            }
            match actions.worker_set {
                WorkerSet::Leave => Ok(Action::await_change()),
                WorkerSet::WaitForRevision => Ok(Action::requeue(REVISION_RECHECK)),
                WorkerSet::Create => {
                    let Some(revision) = revision else {
                        return Ok(Action::requeue(REVISION_RECHECK));
                    };
                    let mut set = statefulsets::worker(&pod, &lws, &revision)
                        .map_err(|message| kube::Error::Service(message.into()))?;
                    if let Some(key) = lws.annotations().get(EXCLUSIVE_KEY_ANNOTATION) {
                        // Exclusive placement: the workers follow the leader's topology
                        // domain, known once the leader is scheduled (its binding
                        // brings the pod back).
                        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                            return Ok(Action::await_change());
                        };
                        let nodes: Api<Node> = Api::all(ctx.client.clone());
                        let Some(node) = nodes.get_opt(&node).await? else {
                            return Ok(Action::await_change());
                        };
                        let Some(value) = node.labels().get(key) else {
                            return Err(kube::Error::Service(
                                format!(
                                    "node {} does not have topology label: {key}",
                                    node.name_any()
                                )
                                .into(),
                            ));
                        };
                        statefulsets::pin_to_topology(&mut set, key, value);
                    }
                    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
                    let params = PostParams {
                        field_manager: Some(managers::LWS.to_string()),
                        ..PostParams::default()
                    };
                    match sets.create(&params, &set).await {
                        Ok(_) => {
                            let note = format!("Created worker statefulset for leader pod {name}");
                            event(
                                ctx,
                                &lws_ref,
                                Some(pod.as_ref()),
                                false,
                                "GroupsProgressing",
                                "Create",
                                note,
                            )
                            .await;
                        }
                        Err(kube::Error::Api(status)) if status.code == 409 => {}
                        Err(err) => {
                            let note = format!(
                                "Failed to create worker statefulset for leader pod {name}: {err}"
                            );
                            event(
                                ctx,
                                &lws_ref,
                                Some(pod.as_ref()),
                                true,
                                "FailedCreate",
                                "Create",
                                note,
                            )
                            .await;
                            return Err(err);
                        }
                    }
                    Ok(Action::await_change())
                }
            }
        }
    }
}

/// A controller reference to the leader pod, for its group's Service.
fn pod_owner(pod: &Pod) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod.name_any(),
        "uid": pod.uid().unwrap_or_default(),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

/// Everything [`group::decide`] reads about `pod`, from the caches.
fn pod_facts(shared: &Shared, lws: &LeaderWorkerSet, pod: &Pod, revision_found: bool) -> PodFacts {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let spec = &lws.spec;
    let group = facts::group_index(pod);
    let group_pods: Vec<Arc<Pod>> = shared
        .pods
        .state()
        .into_iter()
        .filter(|other| {
            other.namespace().as_deref() == Some(namespace.as_str())
                && other.labels().get(NAME_LABEL) == Some(&lws.name_any())
                && group.is_some()
                && facts::group_index(other) == group
        })
        .collect();
    let group_pending = group_pods.len() != spec.leader_worker_template.size.max(0) as usize
        || group_pods.iter().any(|other| facts::pending(other));
    let role = if facts::is_leader(pod) {
        Role::Leader(LeaderSide {
            pod: leader_facts(pod),
            misplaced: pod.annotations().contains_key(LEADER_NAME_ANNOTATION),
            ready: facts::ready(pod),
            revision_found,
            worker_set_exists: shared
                .sets
                .get(&ObjectRef::new(&name).within(&namespace))
                .is_some(),
        })
    } else {
        let leader = group::parent_and_ordinal(&name)
            .and_then(|(parent, _)| shared.pods.get(&ObjectRef::new(parent).within(&namespace)));
        Role::Worker(WorkerSide {
            key: facts::revision_key(pod).to_string(),
            ownership: match &leader {
                Some(leader) => ownership(shared, pod, leader),
                None => WorkerOwnership::Stale,
            },
            leader: leader.as_deref().map(leader_facts),
        })
    };
    PodFacts {
        missing_labels: missing_labels(pod),
        policy: spec.leader_worker_template.restart_policy,
        recreate_after_start: lws
            .annotations()
            .contains_key(RECREATE_GROUP_AFTER_START_ANNOTATION),
        restarted_or_deleted: facts::restarted_or_deleted(pod),
        group_pending,
        size: spec.leader_worker_template.size,
        startup: spec.startup_policy,
        unique_per_replica: spec.network_config_or_default().subdomain_policy
            == SubdomainPolicy::UniquePerReplica,
        role,
    }
}

fn leader_facts(pod: &Pod) -> LeaderFacts {
    LeaderFacts {
        name: pod.name_any(),
        key: facts::revision_key(pod).to_string(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// Whether a worker pod belongs to its leader's current group (upstream
/// `workerPodBelongsToLeader`): its controller is the leader pod itself, or the worker
/// StatefulSet of that name and uid whose controller is that leader pod (name and uid).
fn ownership(shared: &Shared, pod: &Pod, leader: &Pod) -> WorkerOwnership {
    let is_leader =
        |name: &str, uid: &str| name == leader.name_any() && Some(uid) == leader.uid().as_deref();
    let Some(owner) = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    else {
        return WorkerOwnership::Stale;
    };
    let current = match owner.kind.as_str() {
        "Pod" => is_leader(&owner.name, &owner.uid),
        "StatefulSet" => {
            let namespace = pod.namespace().unwrap_or_default();
            shared
                .sets
                .get(&ObjectRef::new(&owner.name).within(&namespace))
                .filter(|set| set.uid().as_deref() == Some(owner.uid.as_str()))
                .and_then(|set| {
                    set.owner_references()
                        .iter()
                        .find(|o| o.controller == Some(true))
                        .map(|o| o.kind == "Pod" && is_leader(&o.name, &o.uid))
                })
                .unwrap_or(false)
        }
        _ => false,
    };
    if current {
        WorkerOwnership::CurrentGroup
    } else {
        WorkerOwnership::Stale
    }
}

/// The labels upstream's pod webhook sets at admission that `pod` lacks: `group-index` and
/// `group-key` on a leader, `worker-index` on a worker, and under a `subgroup-size`
/// annotation `subgroup-index` and `subgroup-key` on a worker and on a leader unless its
/// subgroup policy is `LeaderExcluded`. A worker's subgroup needs its `size` and
/// `leader-name` annotations, which its StatefulSet always sets.
fn missing_labels(pod: &Pod) -> BTreeMap<String, String> {
    let labels = pod.labels();
    let annotations = pod.annotations();
    let name = pod.name_any();
    let mut missing = BTreeMap::new();
    let Some((_, ordinal)) = group::parent_and_ordinal(&name) else {
        return missing;
    };
    let sub_group_size = annotations.get(SUBGROUP_SIZE_ANNOTATION).filter(|_| {
        labels
            .get(SUBGROUP_INDEX_LABEL)
            .is_none_or(String::is_empty)
    });
    if facts::is_leader(pod) {
        if !labels.contains_key(GROUP_INDEX_LABEL) {
            missing.insert(GROUP_INDEX_LABEL.to_string(), ordinal.to_string());
        }
        if !labels.contains_key(GROUP_KEY_LABEL) {
            let namespace = pod.namespace().unwrap_or_default();
            missing.insert(
                GROUP_KEY_LABEL.to_string(),
                statefulsets::group_key(&namespace, &name),
            );
        }
        let leader_excluded = annotations
            .get(SUBGROUP_POLICY_TYPE_ANNOTATION)
            .is_some_and(|policy| policy == "LeaderExcluded");
        if sub_group_size.is_some() && !leader_excluded {
            // The leader is always in subgroup 0.
            missing.insert(SUBGROUP_INDEX_LABEL.to_string(), "0".to_string());
            missing.insert(
                SUBGROUP_KEY_LABEL.to_string(),
                statefulsets::sub_group_key(&name, "0"),
            );
        }
        return missing;
    }
    if !labels.contains_key(WORKER_INDEX_LABEL) {
        missing.insert(WORKER_INDEX_LABEL.to_string(), ordinal.to_string());
    }
    let sub_group_size = sub_group_size
        .and_then(|size| size.parse::<i32>().ok())
        .filter(|size| *size > 0);
    let size = annotations
        .get(SIZE_ANNOTATION)
        .and_then(|size| size.parse::<i32>().ok());
    let leader = annotations.get(LEADER_NAME_ANNOTATION);
    if let (Some(sub_group_size), Some(size), Some(leader)) = (sub_group_size, size, leader) {
        let index = group::sub_group_index(size, sub_group_size, ordinal).to_string();
        missing.insert(
            SUBGROUP_KEY_LABEL.to_string(),
            statefulsets::sub_group_key(leader, &index),
        );
        missing.insert(SUBGROUP_INDEX_LABEL.to_string(), index);
    }
    missing
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A pod of LWS `vllm` in `ns` named `name`, with `labels` and `annotations`.
    fn pod(name: &str, labels: Value, annotations: Value) -> Pod {
        let mut labels = labels;
        labels[NAME_LABEL] = json!("vllm");
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": labels,
                         "annotations": annotations}
        }))
        .expect("a pod")
    }

    fn leader(annotations: Value) -> Pod {
        pod(
            "vllm-0",
            json!({WORKER_INDEX_LABEL: "0", GROUP_INDEX_LABEL: "0",
                   GROUP_KEY_LABEL: statefulsets::group_key("ns", "vllm-0")}),
            annotations,
        )
    }

    fn worker(name: &str, size: i32, sub_group_size: i32) -> Pod {
        pod(
            name,
            json!({}),
            json!({SIZE_ANNOTATION: size.to_string(), LEADER_NAME_ANNOTATION: "vllm-0",
                   SUBGROUP_SIZE_ANNOTATION: sub_group_size.to_string(),
                   SUBGROUP_POLICY_TYPE_ANNOTATION: "LeaderWorker"}),
        )
    }

    fn labels(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.clone()))
            .collect()
    }

    fn sub_group(index: &str) -> [(&'static str, String); 2] {
        [
            (SUBGROUP_INDEX_LABEL, index.to_string()),
            (
                SUBGROUP_KEY_LABEL,
                statefulsets::sub_group_key("vllm-0", index),
            ),
        ]
    }

    #[test]
    fn a_new_leader_gets_its_group_labels() {
        let unlabelled = pod("vllm-3", json!({WORKER_INDEX_LABEL: "0"}), json!({}));
        assert_eq!(
            missing_labels(&unlabelled),
            labels(&[
                (GROUP_INDEX_LABEL, "3".to_string()),
                (GROUP_KEY_LABEL, statefulsets::group_key("ns", "vllm-3")),
            ])
        );
        assert!(missing_labels(&leader(json!({}))).is_empty());
    }

    #[test]
    fn a_leader_is_in_subgroup_zero_unless_excluded() {
        let sub_grouped = leader(json!({SIZE_ANNOTATION: "4", SUBGROUP_SIZE_ANNOTATION: "2",
                                        SUBGROUP_POLICY_TYPE_ANNOTATION: "LeaderWorker"}));
        assert_eq!(missing_labels(&sub_grouped), labels(&sub_group("0")));
        assert_eq!(
            statefulsets::sub_group_key("vllm-0", "0"),
            "a23c711838ab00e7644bc03268335cc986e67808",
            "sha1 of vllm-0/0"
        );
        let excluded = leader(json!({SIZE_ANNOTATION: "4", SUBGROUP_SIZE_ANNOTATION: "2",
                                     SUBGROUP_POLICY_TYPE_ANNOTATION: "LeaderExcluded"}));
        assert!(missing_labels(&excluded).is_empty());
        let mut labelled = sub_grouped.clone();
        labelled
            .labels_mut()
            .insert(SUBGROUP_INDEX_LABEL.to_string(), "0".to_string());
        assert!(missing_labels(&labelled).is_empty(), "already labelled");
    }

    #[test]
    fn workers_get_their_worker_index_and_subgroup() {
        let cases = [
            ("vllm-0-1", 4, 2, "1", "0"),
            ("vllm-0-2", 4, 2, "2", "1"),
            ("vllm-0-3", 4, 2, "3", "1"),
            ("vllm-0-1", 5, 2, "1", "0"),
            ("vllm-0-2", 5, 2, "2", "0"),
            ("vllm-0-3", 5, 2, "3", "1"),
            ("vllm-0-4", 5, 2, "4", "1"),
        ];
        for (name, size, sub_group_size, worker_index, index) in cases {
            let mut expected = labels(&sub_group(index));
            expected.insert(WORKER_INDEX_LABEL.to_string(), worker_index.to_string());
            assert_eq!(
                missing_labels(&worker(name, size, sub_group_size)),
                expected,
                "{name} of {size} by {sub_group_size}"
            );
        }
    }

    #[test]
    fn a_worker_without_subgroups_gets_its_worker_index_only() {
        let plain = pod(
            "vllm-0-2",
            json!({}),
            json!({SIZE_ANNOTATION: "4", LEADER_NAME_ANNOTATION: "vllm-0"}),
        );
        assert_eq!(
            missing_labels(&plain),
            labels(&[(WORKER_INDEX_LABEL, "2".to_string())])
        );
        let mut labelled = worker("vllm-0-2", 4, 2);
        labelled
            .labels_mut()
            .insert(WORKER_INDEX_LABEL.to_string(), "2".to_string());
        labelled
            .labels_mut()
            .insert(SUBGROUP_INDEX_LABEL.to_string(), "1".to_string());
        assert!(missing_labels(&labelled).is_empty(), "already labelled");
    }
}
