//! managed-upgrade-operator `UpgradeConfig` (`upgrade.managed.openshift.io/v1alpha1`,
//! namespaced, short name `upgrade`): the desired cluster version and when to upgrade; its
//! status history tells nodekeeper whether an upgrade is in progress.
//!
//! Names follow upstream `api/v1alpha1/upgradeconfig_types.go`, including the capitalised
//! `PDBForceDrainTimeout` key. The later upstream `architecture` fields are not modelled.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of an `UpgradeConfig`.
// Repeated `printcolumn(type_ = ...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "upgrade.managed.openshift.io",
    version = "v1alpha1",
    derive = "PartialEq",
    kind = "UpgradeConfig",
    namespaced,
    shortname = "upgrade",
    status = "UpgradeConfigStatus",
    doc = "UpgradeConfig is the Schema for the upgradeconfigs API.",
    printcolumn(
        name = "desired_version",
        type_ = "string",
        json_path = ".spec.desired.version"
    ),
    printcolumn(
        name = "phase",
        type_ = "string",
        json_path = ".status.history[0].phase"
    ),
    printcolumn(
        name = "stage",
        type_ = "string",
        json_path = ".status.history[0].conditions[0].type"
    ),
    printcolumn(
        name = "status",
        type_ = "string",
        json_path = ".status.history[0].conditions[0].status"
    ),
    printcolumn(
        name = "reason",
        type_ = "string",
        json_path = ".status.history[0].conditions[0].reason"
    ),
    printcolumn(
        name = "message",
        type_ = "string",
        json_path = ".status.history[0].conditions[0].message"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeConfigSpec {
    /// The release to upgrade to.
    pub desired: Update,

    /// When to start the upgrade (RFC 3339).
    pub upgrade_at: String,

    /// Minutes a drain blocked by a PodDisruptionBudget is given before it is forced
    /// (after the expected node drain time). At least 0.
    #[serde(rename = "PDBForceDrainTimeout")]
    #[schemars(range(min = 0))]
    pub pdb_force_drain_timeout: i32,

    /// Which upgrader runs the upgrade.
    #[serde(rename = "type")]
    pub type_: UpgradeType,

    /// Scale up an extra node for capacity before the upgrade.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub capacity_reservation: bool,
}

impl UpgradeConfigSpec {
    /// [`Self::pdb_force_drain_timeout`] as a duration (negative values count as zero).
    pub fn pdb_force_drain_timeout(&self) -> std::time::Duration {
        let minutes = u64::try_from(self.pdb_force_drain_timeout).unwrap_or(0);
        std::time::Duration::from_secs(minutes * 60)
    }
}

/// A release to upgrade to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Update {
    /// OpenShift version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,

    /// Update channel.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub channel: String,

    /// Release image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
}

/// Which upgrader runs the upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum UpgradeType {
    /// OpenShift Dedicated.
    #[serde(rename = "OSD")]
    Osd,
    /// Azure Red Hat OpenShift.
    #[serde(rename = "ARO")]
    Aro,
}

/// Observed state of an `UpgradeConfig`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpgradeConfigStatus {
    /// One entry per upgrade, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<UpgradeHistory>,
}

impl UpgradeConfigStatus {
    /// The history entry of `version` (the first one, as upstream's linear search).
    pub fn history_for(&self, version: &str) -> Option<&UpgradeHistory> {
        self.history.iter().find(|entry| entry.version == version)
    }

    /// Replaces the entry with the same version, or puts `entry` first when there is none.
    pub fn set_history(&mut self, entry: UpgradeHistory) {
        match self
            .history
            .iter_mut()
            .find(|old| old.version == entry.version)
        {
            Some(old) => *old = entry,
            None => self.history.insert(0, entry),
        }
    }
}

/// The record of one upgrade.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeHistory {
    /// Version upgraded to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,

    /// Version before the upgrade.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub preceding_version: String,

    /// Where the upgrade is.
    pub phase: UpgradePhase,

    /// Steps of the upgrade, most recent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<UpgradeCondition>,

    /// When the upgrade started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the upgrade completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_time: Option<Time>,

    /// When the worker nodes started upgrading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_start_time: Option<Time>,

    /// When the worker nodes finished upgrading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_complete_time: Option<Time>,
}

/// Phase of an upgrade.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum UpgradePhase {
    /// Not yet scheduled.
    New,
    /// Scheduled.
    Pending,
    /// In progress; nodekeeper acts only in this phase.
    Upgrading,
    /// Done.
    Upgraded,
    /// Failed.
    Failed,
}

/// One step of an upgrade.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeCondition {
    /// The step, one of the [`condition_types`].
    #[serde(rename = "type")]
    pub type_: String,

    /// Whether the step is done.
    pub status: ConditionStatus,

    /// Last time the condition was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,

    /// Last time the status changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,

    /// When the step started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the step completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_time: Option<Time>,

    /// Short reason, e.g. `ControlPlaneUpgraded done`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,

    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Status of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The step is done.
    True,
    /// The step is not done.
    False,
    /// Not known yet.
    Unknown,
}

/// The condition types managed-upgrade-operator writes.
pub mod condition_types {
    /// Health check before the upgrade passed.
    pub const CLUSTER_HEALTHY_BEFORE_UPGRADE: &str = "ClusterHealthyBeforeUpgrade";
    /// The upgrade was started.
    pub const UPGRADE_COMMENCED: &str = "UpgradeCommenced";
    /// The control plane runs the new version.
    pub const CONTROL_PLANE_UPGRADED: &str = "ControlPlaneUpgraded";
    /// Every worker node runs the new version.
    pub const WORKER_NODES_UPGRADED: &str = "WorkerNodesUpgraded";
    /// Health check after the upgrade passed.
    pub const CLUSTER_HEALTHY_AFTER_UPGRADE: &str = "ClusterHealthyAfterUpgrade";
    /// Post-upgrade tasks ran.
    pub const POST_UPGRADE_TASKS_COMPLETED: &str = "PostUpgradeTasksCompleted";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use kube::CustomResourceExt;

    const EXAMPLE: &str = r#"
apiVersion: upgrade.managed.openshift.io/v1alpha1
kind: UpgradeConfig
metadata: {name: managed-upgrade-config, namespace: openshift-managed-upgrade-operator}
spec:
  type: OSD
  upgradeAt: "2024-06-01T02:00:00Z"
  PDBForceDrainTimeout: 60
  desired: {version: "4.15.12", channel: stable-4.15}
status:
  history:
    - version: "4.15.12"
      precedingVersion: "4.15.11"
      phase: Upgrading
      startTime: "2024-06-01T02:00:05Z"
      conditions:
        - type: ControlPlaneUpgraded
          status: "True"
          reason: ControlPlaneUpgraded done
"#;

    #[test]
    fn example_decodes_strictly_with_capitalised_drain_timeout() {
        let value: serde_json::Value = serde_saphyr::from_str(EXAMPLE).unwrap();
        assert_eq!(
            schema::unknown_fields(&UpgradeConfig::crd(), &value),
            Vec::<String>::new()
        );
        let config: UpgradeConfig = serde_json::from_value(value).unwrap();
        assert_eq!(config.spec.type_, UpgradeType::Osd);
        assert_eq!(config.spec.pdb_force_drain_timeout, 60);
        assert_eq!(
            config.spec.pdb_force_drain_timeout(),
            std::time::Duration::from_secs(3600)
        );
        assert_eq!(config.spec.desired.channel, "stable-4.15");
        let status = config.status.as_ref().unwrap();
        let entry = status.history_for("4.15.12").unwrap();
        assert_eq!(entry.phase, UpgradePhase::Upgrading);
        assert_eq!(entry.conditions[0].status, ConditionStatus::True);
        assert!(entry.start_time.is_some());

        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["spec"]["PDBForceDrainTimeout"], 60);
        assert_eq!(json["spec"]["type"], "OSD");
    }

    #[test]
    fn set_history_replaces_same_version_else_prepends() {
        let entry = |version: &str, phase| UpgradeHistory {
            version: version.to_string(),
            preceding_version: String::new(),
            phase,
            conditions: Vec::new(),
            start_time: None,
            complete_time: None,
            worker_start_time: None,
            worker_complete_time: None,
        };
        let mut status = UpgradeConfigStatus::default();
        status.set_history(entry("4.15.11", UpgradePhase::Upgraded));
        status.set_history(entry("4.15.12", UpgradePhase::Pending));
        status.set_history(entry("4.15.12", UpgradePhase::Upgrading));
        let versions: Vec<_> = status
            .history
            .iter()
            .map(|h| (h.version.as_str(), h.phase))
            .collect();
        assert_eq!(
            versions,
            [
                ("4.15.12", UpgradePhase::Upgrading),
                ("4.15.11", UpgradePhase::Upgraded)
            ]
        );
        assert!(status.history_for("4.16.0").is_none());
    }
}
