//! The StatefulSets the LWS controllers write: the leader StatefulSet, applied server-side
//! on every reconcile of the LWS (upstream `constructLeaderStatefulSetApplyConfiguration`
//! and `setControllerReferenceWithStatefulSet` in `pkg/controllers/
//! leaderworkerset_controller.go`), and a group's worker StatefulSet, created once for a
//! leader pod from the revision the leader pod was made from (upstream
//! `constructWorkerStatefulSetApplyConfiguration` in `pkg/controllers/pod_controller.go`).
//!
//! Both are built from capstan's and k8s-openapi's types, so the same inputs always give
//! the same body. Their pod templates carry what upstream's pod webhook adds to each pod
//! and a template can say: the `LWS_*` environment variables, written from the pod's name
//! or ordinal label where they differ between pods of one template.

use std::collections::BTreeMap;

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::{RolloutStrategyType, SubGroupPolicyType, SubdomainPolicy};
use k8s_openapi::api::apps::v1::{
    ControllerRevision, RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetOrdinals,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    Pod, PodSpec, PodTemplateSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::facts::revision_key;
use super::labels::{
    EXCLUSIVE_KEY_ANNOTATION, GROUP_INDEX_LABEL, GROUP_KEY_LABEL, LEADER_NAME_ANNOTATION,
    LEADER_REQUESTS_TPUS_ANNOTATION, NAME_LABEL, REPLICAS_ANNOTATION, REVISION_KEY_LABEL,
    SIZE_ANNOTATION, SUBDOMAIN_POLICY_ANNOTATION, SUBGROUP_EXCLUSIVE_KEY_ANNOTATION,
    SUBGROUP_POLICY_TYPE_ANNOTATION, SUBGROUP_SIZE_ANNOTATION, WORKER_INDEX_LABEL,
};
use super::revision::{self, controller_ref};
use super::rolling::leader_max_unavailable;

/// The pods of both StatefulSets start and stop together, not one by one.
const PARALLEL: &str = "Parallel";
/// The extended resource a TPU is requested as.
const TPU_RESOURCE: &str = "google.com/tpu";
/// Upstream's environment variables, given to every container of an LWS pod: the leader
/// pod's DNS name, the group's size, and the pod's index in its group.
const LEADER_ADDRESS_ENV: &str = "LWS_LEADER_ADDRESS";
/// See [`LEADER_ADDRESS_ENV`].
const GROUP_SIZE_ENV: &str = "LWS_GROUP_SIZE";
/// See [`LEADER_ADDRESS_ENV`].
const WORKER_INDEX_ENV: &str = "LWS_WORKER_INDEX";
/// A leader pod's own name, which its [`LEADER_ADDRESS_ENV`] is written from: the leader
/// StatefulSet's template is every group's, so the group shows only in the pod's name.
const LEADER_POD_NAME_ENV: &str = "LWS_LEADER_POD_NAME";
/// The label the StatefulSet controller gives each pod with its ordinal (Kubernetes 1.28
/// and later): a worker's index, its worker StatefulSet counting from 1.
const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The server-side-apply body of `lws`'s leader StatefulSet (upstream
/// `constructLeaderStatefulSetApplyConfiguration` with its controller reference): named
/// and labelled after the LWS, its pods made from the leader template (the worker
/// template when there is none) labelled `worker-index: 0` and with the revision `key`,
/// `replicas` pods rolled down to `partition`, `maxUnavailable` from
/// [`leader_max_unavailable`]. With `lws_env` (see [`leader_env_wanted`]) its containers get
/// upstream's `LWS_*` variables ([`leader_env`]).
///
/// Fails when `maxSurge` or `maxUnavailable` is a string but not a percentage.
pub fn leader(
    lws: &LeaderWorkerSet,
    partition: i32,
    replicas: i32,
    key: &str,
    lws_env: bool,
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
    let mut pod_template = with_metadata(
        template.effective_leader_template().clone(),
        pod_labels,
        pod_annotations,
    );
    if lws_env {
        with_env(&mut pod_template, &leader_env(lws));
    }

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
/// leader pod; its containers get upstream's `LWS_*` variables, and its pods the
/// `leader-requests-tpus` annotation when the leader pod asks for TPUs. The caller makes
/// sure the leader pod carries its `group-index` and `group-key` labels.
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
    if leader_pod.spec.as_ref().is_some_and(requests_tpus) {
        pod_annotations.insert(
            LEADER_REQUESTS_TPUS_ANNOTATION.to_string(),
            "true".to_string(),
        );
    }
    let mut pod_template = with_metadata(
        template.worker_template.clone(),
        labels.clone(),
        pod_annotations,
    );

    let service_name = match current.spec.network_config_or_default().subdomain_policy {
        SubdomainPolicy::Shared => name.to_string(),
        SubdomainPolicy::UniquePerReplica => pod_name.clone(),
    };
    let namespace = leader_pod.metadata.namespace.as_deref().unwrap_or_default();
    let leader_address = format!(
        "{name}-{}.{service_name}.{namespace}",
        pod_label(GROUP_INDEX_LABEL)
    );
    with_env(
        &mut pod_template,
        &[
            value_env(LEADER_ADDRESS_ENV, &leader_address),
            value_env(GROUP_SIZE_ENV, &template.size.to_string()),
            field_env(
                WORKER_INDEX_ENV,
                &format!("metadata.labels['{POD_INDEX_LABEL}']"),
            ),
        ],
    );
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
    sha1_hex(&format!("{namespace}/{leader_pod_name}"))
}

/// The `subgroup-key` label of a subgroup (upstream `genGroupUniqueKey` again, given the
/// leader pod's name where a group gives its namespace): the SHA-1, in hexadecimal, of
/// `<leader pod name>/<subgroup index>`.
pub fn sub_group_key(leader_pod_name: &str, sub_group_index: &str) -> String {
    sha1_hex(&format!("{leader_pod_name}/{sub_group_index}"))
}

fn sha1_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, text.as_bytes());
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

/// Whether the leader StatefulSet capstan applies carries the `LWS_*` variables, given
/// the live one (`None` before it exists) and the revision `key` being applied. A change
/// to its pod template restarts every leader pod outside the rolling update's partition,
/// so they are added only when its template changes anyway (a new LWS, a new key) and
/// kept once there.
pub fn leader_env_wanted(live: Option<&StatefulSet>, key: &str) -> bool {
    let Some(live) = live else {
        return true;
    };
    let template = live
        .spec
        .as_ref()
        .and_then(|spec| spec.template.spec.as_ref());
    let has_env = template.is_some_and(|spec| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|container| container.env.iter().flatten())
            .any(|env| env.name == GROUP_SIZE_ENV)
    });
    revision_key(live) != key || has_env
}

/// A leader pod's `LWS_*` variables (upstream `AddLWSVariables`): its address
/// `<lws>-<group>.<subdomain>.<namespace>` written from [`LEADER_POD_NAME_ENV`], defined
/// before it, the subdomain being the pod's name under `UniquePerReplica` as upstream's
/// webhook sets it; the group size; worker index 0.
fn leader_env(lws: &LeaderWorkerSet) -> [EnvVar; 4] {
    let name = lws_name(lws);
    let namespace = lws.metadata.namespace.as_deref().unwrap_or_default();
    let pod = format!("$({LEADER_POD_NAME_ENV})");
    let subdomain = match lws.spec.network_config_or_default().subdomain_policy {
        SubdomainPolicy::Shared => name,
        SubdomainPolicy::UniquePerReplica => &pod,
    };
    [
        field_env(LEADER_POD_NAME_ENV, "metadata.name"),
        value_env(
            LEADER_ADDRESS_ENV,
            &format!("{pod}.{subdomain}.{namespace}"),
        ),
        value_env(
            GROUP_SIZE_ENV,
            &lws.spec.leader_worker_template.size.to_string(),
        ),
        value_env(WORKER_INDEX_ENV, "0"),
    ]
}

/// `template` with `vars` first in every container and init container, then the
/// container's own variables of other names, the first of each name (upstream
/// `addEnvVarsIfNotExists`): `vars` come first so that the container's own can refer to
/// them, and win over the container's own of the same name.
fn with_env(template: &mut PodTemplateSpec, vars: &[EnvVar]) {
    let Some(spec) = template.spec.as_mut() else {
        return;
    };
    for container in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        let mut env = vars.to_vec();
        for own in container.env.take().into_iter().flatten() {
            if !env.iter().any(|known| known.name == own.name) {
                env.push(own);
            }
        }
        container.env = Some(env);
    }
}

fn value_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".to_string()),
                field_path: field_path.to_string(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// Whether a container or init container of `spec` asks for a TPU, in its limits or its
/// requests (upstream `PodRequestsTPUs`).
fn requests_tpus(spec: &PodSpec) -> bool {
    let asks = |resources: Option<&BTreeMap<String, Quantity>>| {
        resources
            .and_then(|resources| resources.get(TPU_RESOURCE))
            .is_some_and(|quantity| !is_zero(quantity))
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|container| container.resources.as_ref())
        .any(|resources| asks(resources.limits.as_ref()) || asks(resources.requests.as_ref()))
}

/// Whether a quantity's number is zero, whatever its suffix (`0`, `0.0`, `0Ki`, `0e3`).
fn is_zero(quantity: &Quantity) -> bool {
    quantity
        .0
        .trim_start_matches(['+', '-'])
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .all(|c| c == '0' || c == '.')
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
