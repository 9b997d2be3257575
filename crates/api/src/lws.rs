//! `LeaderWorkerSet` (`leaderworkerset.x-k8s.io/v1`, namespaced, short name `lws`): groups of
//! one leader pod and `size - 1` worker pods, rolled out group by group.
//!
//! Names follow upstream `api/leaderworkerset/v1/leaderworkerset_types.go`. Where upstream
//! defaults a field (CRD `default:` or its webhook), the Rust field is not optional and serde
//! fills the default, which also puts the default into the CRD schema; so code reading a
//! decoded object never has to know the defaults.
//!
//! The CRD is upstream's (release v0.10.0) field for field, see `tests/upstream_fields.rs`:
//! optional fields are declared `schemars(with = T)` because upstream's schema does not
//! accept null for them, and fields of Kubernetes' types carry Kubernetes' list and map
//! markers ([`crate::schema::kubernetes_markers`]), so server-side apply merges the
//! containers, ports, env... of a pod template entry by entry.

use k8s_openapi::api::apps::v1::StatefulSetPersistentVolumeClaimRetentionPolicy;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// Desired state of a `LeaderWorkerSet`.
// Repeated `printcolumn(type_ = ...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "leaderworkerset.x-k8s.io",
    version = "v1",
    derive = "PartialEq",
    kind = "LeaderWorkerSet",
    namespaced,
    shortname = "lws",
    status = "LeaderWorkerSetStatus",
    doc = "LeaderWorkerSet is the Schema for the leaderworkersets API.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.hpaPodSelector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Number of ready replicas"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".spec.replicas",
        description = "Number of desired replicas"
    ),
    printcolumn(
        name = "Up-to-date",
        type_ = "integer",
        json_path = ".status.updatedReplicas",
        description = "Number of up-to-date replicas"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetSpec {
    /// Number of groups. Default 1.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1_000_000))]
    pub replicas: i32,

    /// Templates and size of a group.
    pub leader_worker_template: LeaderWorkerTemplate,

    /// How groups are updated when the template changes.
    #[serde(default)]
    pub rollout_strategy: RolloutStrategy,

    /// When the workers of a group are created. Default `LeaderCreated`.
    #[serde(default)]
    pub startup_policy: StartupPolicy,

    /// Network configuration of the groups; absent means `subdomainPolicy: Shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "NetworkConfig")]
    pub network_config: Option<NetworkConfig>,
}

impl LeaderWorkerSetSpec {
    /// The network configuration with an absent one read as `subdomainPolicy: Shared`,
    /// the form revisions are compared in.
    pub fn network_config_or_default(&self) -> NetworkConfig {
        self.network_config.clone().unwrap_or_default()
    }
}

/// Templates and size of one group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerTemplate {
    /// Template of the leader pod; the worker template when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        with = "PodTemplateSpec",
        transform = schema::drop_nested_descriptions,
        transform = schema::kubernetes_markers
    )]
    pub leader_template: Option<PodTemplateSpec>,

    /// Template of the worker pods.
    #[schemars(
        transform = schema::drop_nested_descriptions,
        transform = schema::kubernetes_markers
    )]
    pub worker_template: PodTemplateSpec,

    /// Pods per group, the leader included. Default 1; below 1 is refused by the manifest
    /// rules, as upstream's webhook refuses it (the schema has no minimum).
    #[serde(default = "one")]
    pub size: i32,

    /// What happens to a group when one of its pods restarts. Default `RecreateGroupOnPodRestart`.
    #[serde(default)]
    pub restart_policy: RestartPolicy,

    /// How a group is split into subgroups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "SubGroupPolicy")]
    pub sub_group_policy: Option<SubGroupPolicy>,

    /// Claims the pods may reference, one set per pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        transform = schema::drop_nested_descriptions,
        transform = schema::kubernetes_markers
    )]
    pub volume_claim_templates: Vec<PersistentVolumeClaim>,

    /// What happens to those claims when pods go away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        with = "StatefulSetPersistentVolumeClaimRetentionPolicy",
        transform = schema::drop_nested_descriptions,
        transform = schema::kubernetes_markers
    )]
    pub persistent_volume_claim_retention_policy:
        Option<StatefulSetPersistentVolumeClaimRetentionPolicy>,
}

impl LeaderWorkerTemplate {
    /// The template leader pods are made from: the leader template, else the worker template.
    pub fn effective_leader_template(&self) -> &PodTemplateSpec {
        self.leader_template
            .as_ref()
            .unwrap_or(&self.worker_template)
    }
}

/// What happens to a group when one of its pods restarts. The variants are in the order
/// of upstream's enum, which the CRD lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RestartPolicy {
    /// Deprecated upstream spelling of `None` (upstream's defaulting webhook rewrites it to
    /// `None`; capstan keeps what was written, reads it as `None`, and writes `None` in
    /// revisions, so changing one for the other rolls nothing).
    Default,
    /// Recreate every pod of the group.
    #[default]
    RecreateGroupOnPodRestart,
    /// Recreate the group, but only once all its pods have started.
    RecreateGroupAfterStart,
    /// Restart only the failed pod.
    None,
}

/// How a group is split into subgroups.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubGroupPolicy {
    /// Whether the leader belongs to the first subgroup. Default `LeaderWorker`.
    #[serde(default)]
    pub sub_group_policy_type: SubGroupPolicyType,

    /// Pods per subgroup. Upstream's webhook needs it whenever `subGroupPolicy` is set; the
    /// manifest rules refuse a policy without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "i32")]
    pub sub_group_size: Option<i32>,
}

/// Whether the leader belongs to a subgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SubGroupPolicyType {
    /// The leader is part of the first subgroup.
    #[default]
    LeaderWorker,
    /// The leader is in no subgroup.
    LeaderExcluded,
}

/// How groups are updated.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
// Upstream declares the type required as well as defaulted; the default fills it anyway.
#[schemars(extend("required" = ["type"]))]
pub struct RolloutStrategy {
    /// Only `RollingUpdate` exists.
    #[serde(rename = "type", default)]
    pub type_: RolloutStrategyType,

    /// Parameters of the rolling update.
    #[serde(default)]
    pub rolling_update_configuration: RollingUpdateConfiguration,
}

/// The rollout strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutStrategyType {
    /// Update groups a few at a time.
    #[default]
    RollingUpdate,
}

/// Parameters of a rolling update.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateConfiguration {
    /// Groups with an index below this are not updated. Default 0.
    #[serde(default)]
    pub partition: i32,

    /// Groups that may be unavailable during the update (number or percentage). Default 1.
    // Upstream's is not nullable; kube's derive would make an optional int-or-string so.
    #[serde(default = "int_or_string_one")]
    #[schemars(extend("nullable" = false))]
    pub max_unavailable: IntOrString,

    /// Groups that may be created above `replicas` during the update. Default 0.
    #[serde(default = "int_or_string_zero")]
    #[schemars(extend("nullable" = false))]
    pub max_surge: IntOrString,
}

impl Default for RollingUpdateConfiguration {
    fn default() -> Self {
        RollingUpdateConfiguration {
            partition: 0,
            max_unavailable: int_or_string_one(),
            max_surge: int_or_string_zero(),
        }
    }
}

/// When the workers of a group are created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StartupPolicy {
    /// As soon as the leader pod exists.
    #[default]
    LeaderCreated,
    /// Once the leader pod is ready.
    LeaderReady,
}

/// Network configuration of the groups.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// How headless services are made. Default `Shared`.
    #[serde(default)]
    pub subdomain_policy: SubdomainPolicy,
}

/// How headless services are made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum SubdomainPolicy {
    /// One headless service for all groups.
    #[default]
    Shared,
    /// One headless service per group.
    UniquePerReplica,
}

/// Observed state of a `LeaderWorkerSet`. Counts are written even when zero, so a status
/// merge patch resets them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetStatus {
    /// `Available`, `Progressing` and `UpdateInProgress` (see [`condition_types`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        extend(
            "x-kubernetes-list-type" = "map",
            "x-kubernetes-list-map-keys" = ["type"]
        ),
        transform = schema::condition_markers
    )]
    pub conditions: Vec<Condition>,

    /// Groups that are ready, updated or not.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Groups that run the current revision, ready or not.
    #[serde(default)]
    pub updated_replicas: i32,

    /// Groups that exist.
    #[serde(default)]
    pub replicas: i32,

    /// Label selector of the leader pods, for the scale subresource (HPA).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hpa_pod_selector: String,

    /// Generation the status describes.
    #[serde(default)]
    pub observed_generation: i64,
}

/// Condition types of a `LeaderWorkerSet`.
pub mod condition_types {
    /// At least the minimum number of groups is up.
    pub const AVAILABLE: &str = "Available";
    /// Groups are being created or are not all ready.
    pub const PROGRESSING: &str = "Progressing";
    /// A rolling update of the template is in progress.
    pub const UPDATE_IN_PROGRESS: &str = "UpdateInProgress";
}

fn one() -> i32 {
    1
}

fn int_or_string_one() -> IntOrString {
    IntOrString::Int(1)
}

fn int_or_string_zero() -> IntOrString {
    IntOrString::Int(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use kube::CustomResourceExt;

    const MINIMAL: &str = r#"
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: vllm, namespace: default}
spec:
  leaderWorkerTemplate:
    workerTemplate:
      metadata: {labels: {app: vllm}}
      spec:
        containers:
          - name: vllm
            image: registry.example/vllm:v1
"#;

    #[test]
    fn minimal_lws_gets_upstream_defaults() {
        let value: serde_json::Value = serde_saphyr::from_str(MINIMAL).unwrap();
        assert_eq!(
            schema::unknown_fields(&LeaderWorkerSet::crd(), &value),
            Vec::<String>::new()
        );
        let lws: LeaderWorkerSet = serde_json::from_value(value).unwrap();
        let spec = &lws.spec;
        assert_eq!(spec.replicas, 1);
        assert_eq!(spec.leader_worker_template.size, 1);
        assert_eq!(
            spec.leader_worker_template.restart_policy,
            RestartPolicy::RecreateGroupOnPodRestart
        );
        assert_eq!(spec.startup_policy, StartupPolicy::LeaderCreated);
        assert_eq!(
            spec.rollout_strategy.type_,
            RolloutStrategyType::RollingUpdate
        );
        let rolling = &spec.rollout_strategy.rolling_update_configuration;
        assert_eq!(rolling.partition, 0);
        assert_eq!(rolling.max_unavailable, IntOrString::Int(1));
        assert_eq!(rolling.max_surge, IntOrString::Int(0));
        assert_eq!(spec.network_config, None);
        assert_eq!(
            spec.network_config_or_default().subdomain_policy,
            SubdomainPolicy::Shared
        );
        let template = &spec.leader_worker_template;
        assert_eq!(
            template.effective_leader_template(),
            &template.worker_template
        );
    }

    #[test]
    fn explicit_values_and_percentages_decode() {
        let yaml = format!(
            "{MINIMAL}  replicas: 3\n  startupPolicy: LeaderReady\n  networkConfig: {{subdomainPolicy: UniquePerReplica}}\n  rolloutStrategy:\n    type: RollingUpdate\n    rollingUpdateConfiguration: {{maxUnavailable: 25%, maxSurge: 1}}\n"
        );
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(
            schema::unknown_fields(&LeaderWorkerSet::crd(), &value),
            Vec::<String>::new()
        );
        let lws: LeaderWorkerSet = serde_json::from_value(value).unwrap();
        assert_eq!(lws.spec.replicas, 3);
        assert_eq!(lws.spec.startup_policy, StartupPolicy::LeaderReady);
        assert_eq!(
            lws.spec.network_config_or_default().subdomain_policy,
            SubdomainPolicy::UniquePerReplica
        );
        let rolling = &lws.spec.rollout_strategy.rolling_update_configuration;
        assert_eq!(
            rolling.max_unavailable,
            IntOrString::String("25%".to_string())
        );
        assert_eq!(rolling.max_surge, IntOrString::Int(1));
        assert_eq!(rolling.partition, 0);
    }

    #[test]
    fn a_sub_group_policy_defaults_its_type_to_leader_worker() {
        let yaml = MINIMAL.replace(
            "    workerTemplate:",
            "    subGroupPolicy: {subGroupSize: 2}\n    workerTemplate:",
        );
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(
            schema::unknown_fields(&LeaderWorkerSet::crd(), &value),
            Vec::<String>::new()
        );
        let lws: LeaderWorkerSet = serde_json::from_value(value).unwrap();
        assert_eq!(
            lws.spec.leader_worker_template.sub_group_policy,
            Some(SubGroupPolicy {
                sub_group_policy_type: SubGroupPolicyType::LeaderWorker,
                sub_group_size: Some(2),
            })
        );
    }

    #[test]
    fn deprecated_default_restart_policy_still_decodes() {
        let policy: RestartPolicy = serde_json::from_str(r#""Default""#).unwrap();
        assert_eq!(policy, RestartPolicy::Default);
        let policy: RestartPolicy = serde_json::from_str(r#""None""#).unwrap();
        assert_eq!(policy, RestartPolicy::None);
    }

    #[test]
    fn status_uses_upstream_names() {
        let status = LeaderWorkerSetStatus {
            hpa_pod_selector: "leaderworkerset.sigs.k8s.io/name=vllm".to_string(),
            ..LeaderWorkerSetStatus::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "readyReplicas": 0,
                "updatedReplicas": 0,
                "replicas": 0,
                "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=vllm",
                "observedGeneration": 0
            })
        );
    }
}
