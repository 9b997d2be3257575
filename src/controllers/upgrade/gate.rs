//! The campaigns (`UpgradeConfig`s) a node's move may wait for, as the version-label
//! controller gates on them and the campaign controller moves their phases.

use std::collections::BTreeMap;
use std::time::Duration;

use capstan_api::upgrade_config::{UpgradeConfig, UpgradePhase};
use jiff::Timestamp;
use kube::ResourceExt as _;

/// A campaign as the version-label controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CampaignGate {
    /// `<namespace>/<name>` of the `UpgradeConfig`.
    pub name: String,
    /// The phase of its entry for the version; `None` before the first reconcile.
    pub phase: Option<UpgradePhase>,
    /// `spec.upgradeAt`.
    pub upgrade_at: Option<Timestamp>,
    /// `spec.PDBForceDrainTimeout`.
    pub pdb_force_drain_timeout: Duration,
}

impl CampaignGate {
    /// Moves to the version may start: the campaign is Upgrading, or Upgraded (a node
    /// labelled later still moves under its drain rules).
    pub fn started(&self) -> bool {
        matches!(
            self.phase,
            Some(UpgradePhase::Upgrading | UpgradePhase::Upgraded)
        )
    }

    /// The campaign failed: its moves stay held.
    pub fn failed(&self) -> bool {
        self.phase == Some(UpgradePhase::Failed)
    }
}

/// Every campaign, by the version it rolls out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Campaigns(BTreeMap<String, CampaignGate>);

impl Campaigns {
    /// The campaigns of `configs`; of two rolling out one version (which validation
    /// refuses within a commit), the first by namespace and name.
    pub fn of<'a>(configs: impl IntoIterator<Item = &'a UpgradeConfig>) -> Campaigns {
        let mut configs: Vec<&UpgradeConfig> = configs.into_iter().collect();
        configs.sort_by_key(|c| (c.namespace(), c.name_any()));
        let mut campaigns = BTreeMap::new();
        for config in configs {
            let version = &config.spec.desired.version;
            if version.is_empty() || campaigns.contains_key(version) {
                continue;
            }
            let phase = config
                .status
                .as_ref()
                .and_then(|status| status.history_for(version))
                .map(|entry| entry.phase);
            campaigns.insert(
                version.clone(),
                CampaignGate {
                    name: format!(
                        "{}/{}",
                        config.namespace().unwrap_or_default(),
                        config.name_any()
                    ),
                    phase,
                    upgrade_at: config.spec.upgrade_at.parse().ok(),
                    pdb_force_drain_timeout: config.spec.pdb_force_drain_timeout(),
                },
            );
        }
        Campaigns(campaigns)
    }

    /// The campaign rolling out `version`.
    pub fn get(&self, version: Option<&str>) -> Option<&CampaignGate> {
        self.0.get(version?)
    }

    /// Some campaign is Upgrading.
    pub fn any_upgrading(&self) -> bool {
        self.0
            .values()
            .any(|c| c.phase == Some(UpgradePhase::Upgrading))
    }
}
