//! The StatefulSets the LWS controllers write: the leader StatefulSet, applied server-side
//! on every reconcile of the LWS (upstream `constructLeaderStatefulSetApplyConfiguration`
//! and `setControllerReferenceWithStatefulSet` in `pkg/controllers/
//! leaderworkerset_controller.go`), and a group's worker StatefulSet, created once for a
//! leader pod from the revision the leader pod was made from (upstream
//! `constructWorkerStatefulSetApplyConfiguration` in `pkg/controllers/pod_controller.go`).
//!
//! Both are built from capstan's and k8s-openapi's types, so the same inputs always give
//! the same body.

use std::collections::BTreeMap;

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::{RolloutStrategyType, SubGroupPolicyType, SubdomainPolicy};
use k8s_openapi::api::apps::v1::{
    ControllerRevision, RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetOrdinals,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, PodTemplateSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::facts::revision_key;
use super::labels::{
    EXCLUSIVE_KEY_ANNOTATION, GROUP_INDEX_LABEL, GROUP_KEY_LABEL, LEADER_NAME_ANNOTATION,
    NAME_LABEL, REPLICAS_ANNOTATION, REVISION_KEY_LABEL, SIZE_ANNOTATION,
    SUBDOMAIN_POLICY_ANNOTATION, SUBGROUP_EXCLUSIVE_KEY_ANNOTATION,
    SUBGROUP_POLICY_TYPE_ANNOTATION, SUBGROUP_SIZE_ANNOTATION, WORKER_INDEX_LABEL,
};
use super::revision::{self, controller_ref};
use super::rolling::leader_max_unavailable;

/// The pods of both StatefulSets start and stop together, not one by one.
const PARALLEL: &str = "Parallel";

/// The server-side-apply body of `lws`'s leader StatefulSet (upstream
/// `constructLeaderStatefulSetApplyConfiguration` with its controller reference): named
/// and labelled after the LWS, its pods made from the leader template (the worker
/// template when there is none) labelled `worker-index: 0` and with the revision `key`,
/// `replicas` pods rolled down to `partition`, `maxUnavailable` from
/// [`leader_max_unavailable`].
///
/// Fails when `maxSurge` or `maxUnavailable` is a string but not a percentage.
pub fn leader(
    lws: &LeaderWorkerSet,
    partition: i32,
    replicas: i32,
    key: &str,
) -> Result<Value, String> {
    let name = lws_name(lws);
    let spec = &lws.spec;
    let template = &spec.leader_worker_template;

    let mut pod_annotations =
        BTreeMap::from([(SIZE_ANNOTATION.to_string(), template.size.to_string())]);
    if let Some(topology) = annotation(lws, EXCLUSIVE_KEY_ANNOTATION) {
        pod_annotations.insert(EXCLUSIVE_KEY_ANNOTATION.to_string(), topology.to_string());
    }
    pod_annotations.extend(sub_group_annotations(lws, lws));
    if spec.network_config_or_default().subdomain_policy == SubdomainPolicy::UniquePerReplica {
        pod_annotations.insert(
            SUBDOMAIN_POLICY_ANNOTATION.to_string(),
            "UniquePerReplica".to_string(),
        );
    }
    let pod_labels = BTreeMap::from([
        (WORKER_INDEX_LABEL.to_string(), "0".to_string()),
        (NAME_LABEL.to_string(), name.to_string()),
        (REVISION_KEY_LABEL.to_string(), key.to_string()),
    ]);
    let pod_template = with_metadata(
        template.effective_leader_template().clone(),
        pod_labels,
        pod_annotations,
    );

    let strategy = match spec.rollout_strategy.type_ {
        RolloutStrategyType::RollingUpdate => "RollingUpdate",
    };
    let set = StatefulSet {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: lws.metadata.namespace.clone(),
            labels: Some(merged(
                lws.metadata.labels.as_ref(),
                [
                    (NAME_LABEL.to_string(), name.to_string()),
                    (REVISION_KEY_LABEL.to_string(), key.to_string()),
                ],
            )),
            annotations: Some(merged(
                lws.metadata.annotations.as_ref(),
                [(REPLICAS_ANNOTATION.to_string(), spec.replicas.to_string())],
            )),
            owner_references: Some(vec![controller_ref(lws)]),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            service_name: Some(name.to_string()),
            replicas: Some(replicas),
            pod_management_policy: Some(PARALLEL.to_string()),
            template: pod_template,
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some(strategy.to_string()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    max_unavailable: Some(IntOrString::Int(leader_max_unavailable(spec)?)),
                    partition: Some(partition),
                }),
            }),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (NAME_LABEL.to_string(), name.to_string()),
                    (WORKER_INDEX_LABEL.to_string(), "0".to_string()),
                ])),
                match_expressions: None,
            },
            volume_claim_templates: claim_templates(lws),
            persistent_volume_claim_retention_policy: retention_policy(lws),
            ..StatefulSetSpec::default()
        }),
        status: None,
    };
    serde_json::to_value(&set).map_err(|error| format!("leader StatefulSet {name}: {error}"))
}

/// The worker StatefulSet of `leader_pod`'s group (upstream
/// `constructWorkerStatefulSetApplyConfiguration` with its controller reference), made
/// from `revision` applied to `lws` ([`revision::apply`]): so a group rebuilt in the middle
/// of a rolling update gets its own revision's worker template, size, subgroups, network
/// config and claims, while labels, annotations and placement keys come from the live LWS.
/// Named after the leader pod, `size - 1` pods with ordinals from 1, controlled by the
/// leader pod. The caller makes sure the leader pod carries its `group-index` and
/// `group-key` labels.
///
/// Fails when the revision does not apply to `lws`.
pub fn worker(
    leader_pod: &Pod,
    lws: &LeaderWorkerSet,
    revision: &ControllerRevision,
) -> Result<StatefulSet, String> {
    let current = revision::apply(lws, revision)?;
    let name = lws_name(lws);
    let pod_name = leader_pod.metadata.name.clone().unwrap_or_default();
    let template = &current.spec.leader_worker_template;
    let pod_label = |label: &str| {
        leader_pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(label))
            .cloned()
            .unwrap_or_default()
    };

    let selector = BTreeMap::from([
        (GROUP_INDEX_LABEL.to_string(), pod_label(GROUP_INDEX_LABEL)),
        (NAME_LABEL.to_string(), name.to_string()),
        (GROUP_KEY_LABEL.to_string(), pod_label(GROUP_KEY_LABEL)),
    ]);
    let mut labels = selector.clone();
    labels.insert(
        REVISION_KEY_LABEL.to_string(),
        revision_key(leader_pod).to_string(),
    );

    let mut pod_annotations = BTreeMap::from([
        (SIZE_ANNOTATION.to_string(), template.size.to_string()),
        (LEADER_NAME_ANNOTATION.to_string(), pod_name.clone()),
    ]);
    if let Some(topology) = annotation(lws, EXCLUSIVE_KEY_ANNOTATION) {
        pod_annotations.insert(EXCLUSIVE_KEY_ANNOTATION.to_string(), topology.to_string());
    }
    pod_annotations.extend(sub_group_annotations(&current, lws));
    let pod_template = with_metadata(
        template.worker_template.clone(),
        labels.clone(),
        pod_annotations,
    );

    let service_name = match current.spec.network_config_or_default().subdomain_policy {
        SubdomainPolicy::Shared => name.to_string(),
        SubdomainPolicy::UniquePerReplica => pod_name.clone(),
    };
    Ok(StatefulSet {
        metadata: ObjectMeta {
            name: Some(pod_name.clone()),
            namespace: leader_pod.metadata.namespace.clone(),
            labels: Some(merged(lws.metadata.labels.as_ref(), labels)),
            annotations: lws
                .metadata
                .annotations
                .clone()
                .filter(|annotations| !annotations.is_empty()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_string(),
                kind: "Pod".to_string(),
                name: pod_name,
                uid: leader_pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            service_name: Some(service_name),
            replicas: Some(template.size - 1),
            pod_management_policy: Some(PARALLEL.to_string()),
            template: pod_template,
            ordinals: Some(StatefulSetOrdinals { start: Some(1) }),
            selector: LabelSelector {
                match_labels: Some(selector),
                match_expressions: None,
            },
            volume_claim_templates: claim_templates(&current),
            persistent_volume_claim_retention_policy: retention_policy(&current),
            ..StatefulSetSpec::default()
        }),
        status: None,
    })
}

/// Pins a group's workers to its leader's topology domain under exclusive placement
/// (upstream `setNodeSelectorForWorkerPods`): `key: value` added to the worker pods'
/// `nodeSelector`, `value` being the leader's node's label `key`.
pub fn pin_to_topology(set: &mut StatefulSet, key: &str, value: &str) {
    if let Some(spec) = set.spec.as_mut() {
        spec.template
            .spec
            .get_or_insert_with(Default::default)
            .node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_string(), value.to_string());
    }
}

/// The `group-key` label of a group (upstream `genGroupUniqueKey`): the SHA-1, in
/// hexadecimal, of `<namespace>/<leader pod name>`.
pub fn group_key(namespace: &str, leader_pod_name: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{namespace}/{leader_pod_name}").as_bytes(),
    );
    digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The subgroup annotations of pod templates: type and size from `spec_source`'s
/// `subGroupPolicy`, the exclusive topology from `live`'s annotations.
fn sub_group_annotations(
    spec_source: &LeaderWorkerSet,
    live: &LeaderWorkerSet,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::new();
    let Some(policy) = &spec_source.spec.leader_worker_template.sub_group_policy else {
        return annotations;
    };
    let type_ = match policy.sub_group_policy_type {
        SubGroupPolicyType::LeaderWorker => "LeaderWorker",
        SubGroupPolicyType::LeaderExcluded => "LeaderExcluded",
    };
    annotations.insert(
        SUBGROUP_POLICY_TYPE_ANNOTATION.to_string(),
        type_.to_string(),
    );
    if let Some(size) = policy.sub_group_size {
        annotations.insert(SUBGROUP_SIZE_ANNOTATION.to_string(), size.to_string());
    }
    if let Some(topology) = annotation(live, SUBGROUP_EXCLUSIVE_KEY_ANNOTATION) {
        annotations.insert(
            SUBGROUP_EXCLUSIVE_KEY_ANNOTATION.to_string(),
            topology.to_string(),
        );
    }
    annotations
}

/// The claim templates of `lws` as upstream applies them (`GetPVCApplyConfiguration`):
/// name, the LWS's namespace, access modes, storage class, volume mode and resources,
/// nothing else; `None` without any.
fn claim_templates(lws: &LeaderWorkerSet) -> Option<Vec<PersistentVolumeClaim>> {
    let claims = &lws.spec.leader_worker_template.volume_claim_templates;
    if claims.is_empty() {
        return None;
    }
    let claims = claims
        .iter()
        .map(|claim| {
            let spec = claim.spec.clone().unwrap_or_default();
            let resources = spec
                .resources
                .filter(|r| r.requests.is_some() || r.limits.is_some());
            PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: claim.metadata.name.clone(),
                    namespace: lws.metadata.namespace.clone(),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: spec.access_modes.filter(|modes| !modes.is_empty()),
                    storage_class_name: spec.storage_class_name,
                    volume_mode: spec.volume_mode,
                    resources: resources.map(|r| VolumeResourceRequirements {
                        requests: r.requests,
                        limits: r.limits,
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                status: None,
            }
        })
        .collect();
    Some(claims)
}

fn retention_policy(
    lws: &LeaderWorkerSet,
) -> Option<StatefulSetPersistentVolumeClaimRetentionPolicy> {
    lws.spec
        .leader_worker_template
        .persistent_volume_claim_retention_policy
        .clone()
}

/// `template` with `labels` and `annotations` added to its own, ours winning.
fn with_metadata(
    mut template: PodTemplateSpec,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
) -> PodTemplateSpec {
    let metadata = template.metadata.get_or_insert_with(ObjectMeta::default);
    metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(labels);
    metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .extend(annotations);
    template
}

/// The user's metadata with the controller's on top (upstream `mergeMetadata`).
fn merged(
    user: Option<&BTreeMap<String, String>>,
    controller: impl IntoIterator<Item = (String, String)>,
) -> BTreeMap<String, String> {
    let mut merged = user.cloned().unwrap_or_default();
    merged.extend(controller);
    merged
}

/// A non-empty annotation of `lws`.
fn annotation<'a>(lws: &'a LeaderWorkerSet, key: &str) -> Option<&'a str> {
    lws.metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(key))
        .map(String::as_str)
        .filter(|value| !value.is_empty())
}

fn lws_name(lws: &LeaderWorkerSet) -> &str {
    lws.metadata.name.as_deref().unwrap_or_default()
}

#[cfg(test)]
mod tests;
