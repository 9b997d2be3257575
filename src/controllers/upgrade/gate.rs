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

    /// Whether the campaign holds the moves to its version at `now`: one due already is
    /// about to start, so its moves are waited for.
    pub fn hold(&self, now: Timestamp) -> Option<Hold> {
        if self.failed() {
            return Some(Hold::Failed);
        }
        match self.upgrade_at {
            Some(at) if !self.started() && at > now => Some(Hold::Until(at)),
            _ => None,
        }
    }
}

/// Why a campaign holds its moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Its `upgradeAt` is still ahead.
    Until(Timestamp),
    /// It failed: its moves stay held until its `UpgradeConfig` leaves the repository.
    Failed,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn gate(phase: Option<UpgradePhase>, upgrade_at: Option<&str>) -> CampaignGate {
        CampaignGate {
            name: "kmm-demo/my-kmod-v2".into(),
            phase,
            upgrade_at: upgrade_at.map(at),
            pdb_force_drain_timeout: Duration::ZERO,
        }
    }

    #[test]
    fn a_campaign_holds_its_moves_until_it_is_due_and_for_good_once_failed() {
        use UpgradePhase::*;
        let now = at("2027-05-31T12:00:00Z");
        let ahead = Some("2027-06-01T02:00:00Z");
        let due = Some("2027-05-31T11:00:00Z");
        // (phase, upgradeAt, hold)
        let rows = [
            (None, ahead, Some(Hold::Until(at("2027-06-01T02:00:00Z")))),
            (
                Some(New),
                ahead,
                Some(Hold::Until(at("2027-06-01T02:00:00Z"))),
            ),
            (
                Some(Pending),
                ahead,
                Some(Hold::Until(at("2027-06-01T02:00:00Z"))),
            ),
            // Due already: about to start, waited for.
            (Some(Pending), due, None),
            (None, due, None),
            (Some(Pending), Some("2027-05-31T12:00:00Z"), None),
            // Started (a clock ahead of upgradeAt's writer): not held.
            (Some(Upgrading), ahead, None),
            (Some(Upgraded), ahead, None),
            (Some(Failed), due, Some(Hold::Failed)),
            (Some(Failed), ahead, Some(Hold::Failed)),
            // An upgradeAt that does not parse keeps the campaign Pending: waited for, as
            // before (validation refuses such a commit).
            (Some(Pending), None, None),
        ];
        for (phase, upgrade_at, expected) in rows {
            assert_eq!(
                gate(phase, upgrade_at).hold(now),
                expected,
                "{phase:?} {upgrade_at:?}"
            );
        }
    }
}
