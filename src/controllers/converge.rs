//! Whether the controllers are done: what `capstan sync --once` waits for after applying
//! a commit.
//!
//! The cluster has converged when none of the selected controllers has anything pending.
//! Each controller says what it still has to do, from the objects this check lists once:
//! - Module -> NMC ([`module_nmc::pending`]): every NMC's spec is what the Modules ask for
//!   on its node, and no Module is waiting on its finalizer;
//! - NMC ([`nmc::pending`]): modules loaded and unloaded on every Ready node, no worker
//!   pod left;
//! - device plugins and DRA drivers ([`rollout_pending`]): every DaemonSet rolled out, and
//!   each Module's device plugin created for its version;
//! - version labels ([`version_labels::pending`]): every node's versions caught up, no
//!   ordered upgrade short of its last step; the moves a campaign holds are not waited for
//!   but counted ([`HeldMoves`]);
//! - LeaderWorkerSets ([`lws::pending`]): every LWS at its generation, `Available`, its
//!   surge groups gone.
//!
//! The check reads; it never writes. [`check`] returns what is still pending, one line per
//! thing, so a waiting `--once` can say what it waits for; [`survey`] also returns the moves
//! it does not wait for, so that a converged `--once` says what is held and until when
//! ([`Convergence::summary`]).

use capstan_api::clock::Clock;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::module_daemon_sets::rollout_pending;
use super::module_nmc::{self, ModuleFacts};
use super::node::NodeFacts;
use super::upgrade::Campaigns;
pub use super::upgrade::Hold;
use super::version_labels::pending::Pending;
use super::{ControllerName, Selection, device_plugin, lws, nmc, version_labels};
use capstan_api::labels;
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_api::{LeaderWorkerSet, UpgradeConfig};

/// Most pending items [`check`] lists.
const SHOWN: usize = 20;

/// The node moves one campaign holds, which `--once` does not wait for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldMoves {
    /// `namespace/name` of the campaign's `UpgradeConfig`.
    pub campaign: String,
    /// Why they are held.
    pub hold: Hold,
    /// How many (node, Module) moves.
    pub moves: usize,
}

/// Where the cluster stands against the commit: what is still to happen, and the moves
/// campaigns hold for later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Convergence {
    /// What is still to happen, one line per thing; empty when the cluster has converged.
    pub pending: Vec<String>,
    /// The moves held, by campaign.
    pub held: Vec<HeldMoves>,
}

impl Convergence {
    /// What a converged `--once` says: that every module is where the commit wants it, or,
    /// when campaigns hold moves, which and until when.
    pub fn summary(&self) -> String {
        if self.held.is_empty() {
            return "converged: every module is where the commit wants it".to_string();
        }
        let held: Vec<String> = self
            .held
            .iter()
            .map(|held| {
                let moves = match held.moves {
                    1 => "1 node move".to_string(),
                    n => format!("{n} node moves"),
                };
                match held.hold {
                    Hold::Until(at) => {
                        format!("{moves} held until {at} by campaign {}", held.campaign)
                    }
                    Hold::Failed => format!(
                        "{moves} held by campaign {}, which failed (remove its UpgradeConfig to \
                         release them)",
                        held.campaign
                    ),
                }
            })
            .collect();
        let rest = if self.pending.is_empty() {
            "nothing else pending"
        } else {
            "more pending"
        };
        format!("applied; {}; {rest}", held.join("; "))
    }
}

/// The device-plugin DaemonSets the device-plugin controller has still to create: a
/// Module's new version has none until the controller has seen the Module, and a
/// DaemonSet that does not exist has no rollout to wait for.
fn missing_device_plugins(modules: &[ModuleFacts], daemon_sets: &[DaemonSet]) -> Vec<String> {
    let mut missing = Vec::new();
    for module in modules {
        let existing: Vec<&DaemonSet> = daemon_sets
            .iter()
            .filter(|ds| ds.namespace().as_deref() == Some(module.key.namespace()))
            .collect();
        let Ok(steps) = device_plugin::decide(module, &existing) else {
            continue;
        };
        for step in steps {
            if step.why == device_plugin::Why::Missing {
                missing.push(format!(
                    "device plugin {}/{} of Module {} is not created yet",
                    module.key.namespace(),
                    step.daemon_set,
                    module.key
                ));
            }
        }
    }
    missing
}

/// What is still to happen; empty when the cluster has converged. `clock` is the
/// controllers' "now" (when a campaign's `upgradeAt` comes).
pub async fn check(
    client: &Client,
    selection: &Selection,
    clock: &dyn Clock,
) -> Result<Vec<String>, kube::Error> {
    Ok(survey(client, selection, clock).await?.pending)
}

/// What is still to happen, and the moves campaigns hold.
pub async fn survey(
    client: &Client,
    selection: &Selection,
    clock: &dyn Clock,
) -> Result<Convergence, kube::Error> {
    let mut pending = Vec::new();
    let mut held: BTreeMap<String, HeldMoves> = BTreeMap::new();
    let modules = Api::<Module>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let nmcs: BTreeMap<String, NodeModulesConfig> = Api::<NodeModulesConfig>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|nmc| (nmc.name_any(), nmc))
        .collect();
    let facts: Vec<NodeFacts> = nodes.iter().map(NodeFacts::from_node).collect();
    let campaigns = match Api::<UpgradeConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Campaigns::of(&list.items),
        // The kind is not served: no campaign.
        Err(kube::Error::Api(status)) if status.code == 404 => Campaigns::default(),
        Err(err) => return Err(err),
    };
    let module_facts: Vec<ModuleFacts> = modules
        .iter()
        .filter_map(|m| ModuleFacts::from_module(m).ok())
        .collect();

    if selection.contains(ControllerName::ModuleNmc) {
        pending.extend(module_nmc::pending::pending(&module_facts, &facts, &nmcs));
    }

    if selection.contains(ControllerName::Nmc) {
        let workers = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().labels(&format!(
                "{}={}",
                labels::COMPONENT_LABEL,
                labels::WORKER_COMPONENT
            )))
            .await?
            .items;
        pending.extend(nmc::pending::pending(&facts, &nmcs, &workers));
    }

    let rollouts = [
        (
            ControllerName::DevicePlugin,
            labels::DEVICE_PLUGIN_ROLE,
            "device plugin",
        ),
        (ControllerName::Dra, labels::DRA_ROLE, "DRA driver"),
    ];
    for (controller, role, what) in rollouts {
        if !selection.contains(controller) {
            continue;
        }
        let daemon_sets = Api::<DaemonSet>::all(client.clone())
            .list(&ListParams::default().labels(&format!("{}={role}", labels::ROLE_LABEL)))
            .await?
            .items;
        pending.extend(
            daemon_sets
                .iter()
                .filter_map(|ds| rollout_pending(what, ds)),
        );
        if controller == ControllerName::DevicePlugin {
            pending.extend(missing_device_plugins(&module_facts, &daemon_sets));
        }
    }

    if selection.contains(ControllerName::VersionLabels) {
        let module_keys: Vec<_> = module_facts.iter().map(|m| m.key.clone()).collect();
        let moves =
            version_labels::pending::pending(&nodes, &facts, &module_keys, &campaigns, clock.now());
        for step in moves {
            match step {
                Pending::Waiting(line) => pending.push(line),
                Pending::Held { campaign, hold } => {
                    held.entry(campaign.clone())
                        .or_insert(HeldMoves {
                            campaign,
                            hold,
                            moves: 0,
                        })
                        .moves += 1;
                }
            }
        }
    }

    if selection.contains(ControllerName::Lws) {
        let lwss = match Api::<LeaderWorkerSet>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            // The kind is not served: no LeaderWorkerSet.
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(err) => return Err(err),
        };
        pending.extend(lwss.iter().filter_map(lws::pending::pending));
    }

    pending.sort();
    pending.dedup();
    if pending.len() > SHOWN {
        let more = pending.len() - SHOWN;
        pending.truncate(SHOWN);
        pending.push(format!("and {more} more"));
    }
    Ok(Convergence {
        pending,
        held: held.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::device_plugin::module_fixtures;
    use serde_json::json;

    #[test]
    fn a_module_version_without_its_device_plugin_daemon_set_is_pending() {
        let plugin = json!({"container": {"image": "registry.example/device-plugin:v1"}});
        let facts = |version: &str| {
            let module =
                module_fixtures::module(version, "devicePlugin", plugin.clone(), json!(null));
            ModuleFacts::from_module(&module).expect("facts")
        };
        let (v1, v2) = (facts("v1"), facts("v2"));
        let v1_set = module_fixtures::live(
            &device_plugin::daemon_set(&v1, Some("v1")).expect("a DaemonSet"),
            1,
            1,
        );
        assert!(
            missing_device_plugins(std::slice::from_ref(&v1), std::slice::from_ref(&v1_set))
                .is_empty()
        );
        // v2 asked for, v1's DaemonSet only: v2's is still to be created.
        assert_eq!(
            missing_device_plugins(&[v2], &[v1_set]),
            [
                "device plugin kmm-demo/my-kmod-device-plugin-v2 of Module kmm-demo/my-kmod is not created yet"
            ]
        );
        // A Module without a device plugin waits for none.
        let none = ModuleFacts::from_module(&module_fixtures::module(
            "v1",
            "devicePlugin",
            json!(null),
            json!(null),
        ))
        .expect("facts");
        assert!(missing_device_plugins(&[none], &[]).is_empty());
    }

    fn at(text: &str) -> jiff::Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_converged_once_says_what_campaigns_hold_and_until_when() {
        let until = Hold::Until(at("2027-06-01T02:00:00Z"));
        let held = |campaign: &str, hold: Hold, moves: usize| HeldMoves {
            campaign: campaign.into(),
            hold,
            moves,
        };
        // (held, pending, summary)
        let rows = [
            (
                vec![],
                vec![],
                "converged: every module is where the commit wants it",
            ),
            (
                vec![held("kmm-demo/my-kmod-v2", until, 3)],
                vec![],
                "applied; 3 node moves held until 2027-06-01T02:00:00Z by campaign \
                 kmm-demo/my-kmod-v2; nothing else pending",
            ),
            (
                vec![held("kmm-demo/my-kmod-v2", until, 1)],
                vec![],
                "applied; 1 node move held until 2027-06-01T02:00:00Z by campaign \
                 kmm-demo/my-kmod-v2; nothing else pending",
            ),
            (
                vec![
                    held("a/v3", Hold::Failed, 2),
                    held("kmm-demo/my-kmod-v2", until, 1),
                ],
                vec![],
                "applied; 2 node moves held by campaign a/v3, which failed (remove its \
                 UpgradeConfig to release them); 1 node move held until \
                 2027-06-01T02:00:00Z by campaign kmm-demo/my-kmod-v2; nothing else pending",
            ),
            (
                vec![held("kmm-demo/my-kmod-v2", until, 1)],
                vec!["worker pod kmm-demo/x is still there".to_string()],
                "applied; 1 node move held until 2027-06-01T02:00:00Z by campaign \
                 kmm-demo/my-kmod-v2; more pending",
            ),
        ];
        for (held, pending, summary) in rows {
            let convergence = Convergence { pending, held };
            assert_eq!(convergence.summary(), summary);
        }
    }
}
