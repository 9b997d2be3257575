//! Whether the controllers are done: what `capstan sync --once` waits for after applying
//! a commit.
//!
//! The cluster has converged when, for the selected controllers:
//! - Module -> NMC: every NMC's spec is what the Modules ask for on its node, and no
//!   Module is waiting on its finalizer;
//! - NMC: on every Ready node each spec entry for the running kernel is loaded in this boot
//!   (status equals spec), nothing is loaded that the spec does not want, and no worker pod
//!   is left;
//! - device plugins: every device-plugin DaemonSet has rolled out (`numberReady` equals
//!   `desiredNumberScheduled` for its current generation);
//! - DRA drivers: every DRA driver DaemonSet has rolled out, as a device plugin's;
//! - version labels: every node's internal version labels have caught up with its
//!   version-module labels, and no node's ordered upgrade still waits for its last step
//!   (the labels catch up before step 4 is seen: the device plugin pod may not run yet,
//!   and a DaemonSet's status can lag the node label that schedules it). A move an
//!   `UpgradeConfig` campaign holds (not started yet, or failed) is not waited for: it
//!   happens at the campaign's time, not the commit's; one due already is waited for.
//! - LeaderWorkerSets: every LWS's status describes its current generation, it is
//!   `Available` (every group ready, and those the partition does not hold back
//!   updated), and its surge groups are gone (`status.replicas` equals `spec.replicas`).
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

use super::campaign::{CampaignGate, Campaigns};
use super::module_nmc::{self, EntryAction, ModuleFacts};
use super::node::NodeFacts;
use super::upgrade::Progress;
use super::{ControllerName, Selection};
use capstan_api::labels::{self, DRAIN_ANNOTATION, ModuleKey, ModuleLabel};
use capstan_api::lws::condition_types;
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

/// Why a campaign holds its moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Its `upgradeAt` is still ahead.
    Until(jiff::Timestamp),
    /// It failed: its moves stay held until its `UpgradeConfig` leaves the repository.
    Failed,
}

/// Whether `campaign` holds the moves to its version at `now`: a campaign due already is
/// about to start, so its moves are waited for.
pub fn hold(campaign: &CampaignGate, now: jiff::Timestamp) -> Option<Hold> {
    if campaign.failed() {
        return Some(Hold::Failed);
    }
    match campaign.upgrade_at {
        Some(at) if !campaign.started() && at > now => Some(Hold::Until(at)),
        _ => None,
    }
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
        for module in &module_facts {
            if module.deleting() {
                pending.push(format!("Module {} is being deleted", module.key));
                continue;
            }
            for node in &facts {
                let current = nmcs
                    .get(&node.name)
                    .and_then(|nmc| nmc.spec_module(&module.key));
                if let Ok(decision) = module_nmc::decide(module, node, current)
                    && decision.action != EntryAction::Unchanged
                {
                    pending.push(format!(
                        "NMC {} does not list Module {} as it should yet",
                        node.name, module.key
                    ));
                }
            }
        }
    }

    if selection.contains(ControllerName::Nmc) {
        for node in facts.iter().filter(|n| n.ready) {
            let Some(nmc) = nmcs.get(&node.name) else {
                continue;
            };
            for entry in &nmc.spec.modules {
                if entry.config.kernel_version != node.kernel_version {
                    continue;
                }
                let loaded = nmc.status.as_ref().and_then(|s| {
                    s.modules
                        .iter()
                        .find(|st| st.namespace == entry.namespace && st.name == entry.name)
                });
                let done = loaded
                    .is_some_and(|st| st.config == entry.config && st.boot_id == node.boot_id);
                if !done {
                    pending.push(format!(
                        "{}/{} is not loaded on {} yet",
                        entry.namespace, entry.name, node.name
                    ));
                }
            }
            for status in nmc.status.iter().flat_map(|s| &s.modules) {
                let wanted = nmc
                    .spec
                    .modules
                    .iter()
                    .any(|e| e.namespace == status.namespace && e.name == status.name);
                if !wanted
                    && status.config.kernel_version == node.kernel_version
                    && status.boot_id == node.boot_id
                {
                    pending.push(format!(
                        "{}/{} is not unloaded from {} yet",
                        status.namespace, status.name, node.name
                    ));
                }
            }
        }
        let workers = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().labels(&format!(
                "{}={}",
                labels::COMPONENT_LABEL,
                labels::WORKER_COMPONENT
            )))
            .await?
            .items;
        for pod in workers {
            pending.push(format!(
                "worker pod {}/{} is still there",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            ));
        }
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
    }

    if selection.contains(ControllerName::VersionLabels) {
        let now = clock.now();
        for node in &nodes {
            if node.annotations().contains_key(DRAIN_ANNOTATION) {
                pending.push(format!(
                    "node {} is cordoned for its upgrade until its last step",
                    node.name_any()
                ));
            }
            for (annotation, value) in node.annotations() {
                let Some(key) = ModuleKey::from_upgrade_annotation(annotation) else {
                    continue;
                };
                match Progress::from_annotation(value).filter(Progress::upgrading) {
                    Some(progress) if progress.released_at.is_some() => pending.push(format!(
                        "node {} gave up its slot while NotReady; its upgrade of {} goes on \
                         once it is Ready",
                        node.name_any(),
                        key
                    )),
                    Some(_) => pending.push(format!(
                        "node {} has not finished its upgrade of {}",
                        node.name_any(),
                        key
                    )),
                    None => {}
                }
            }
        }
        for node in &facts {
            for (label, value) in &node.labels {
                for (kind, key) in ModuleLabel::parse(label) {
                    // An empty version counts as no label (version_labels::VersionLabels::of).
                    if kind != ModuleLabel::VersionModule
                        || value.is_empty()
                        || !module_facts.iter().any(|m| m.key == key)
                    {
                        continue;
                    }
                    let worker = node.labels.get(&key.version_worker_pod_label());
                    let plugin = node.labels.get(&key.version_device_plugin_label());
                    if worker == Some(value) && plugin == Some(value) {
                        continue;
                    }
                    let campaign = campaigns.get(Some(value));
                    match campaign.and_then(|campaign| Some((campaign, hold(campaign, now)?))) {
                        Some((campaign, hold)) => {
                            held.entry(campaign.name.clone())
                                .or_insert_with(|| HeldMoves {
                                    campaign: campaign.name.clone(),
                                    hold,
                                    moves: 0,
                                })
                                .moves += 1;
                        }
                        None => pending.push(format!(
                            "node {} is moving {} to version {value}",
                            node.name, key
                        )),
                    }
                }
            }
            for label in node.labels.keys() {
                for (kind, key) in ModuleLabel::parse(label) {
                    let internal = matches!(
                        kind,
                        ModuleLabel::VersionWorkerPod | ModuleLabel::VersionDevicePlugin
                    );
                    if internal && !node.labels.contains_key(&key.version_module_label()) {
                        pending.push(format!(
                            "node {} is leaving the versions of {}",
                            node.name, key
                        ));
                    }
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
        pending.extend(lwss.iter().filter_map(lws_pending));
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

/// What the DaemonSet `ds` of a Module (its `what`: device plugin, DRA driver) still waits
/// for, if anything: its controller to see its generation, or a pod ready on every node it
/// schedules.
fn rollout_pending(what: &str, ds: &DaemonSet) -> Option<String> {
    let status = ds.status.clone().unwrap_or_default();
    let current = status.observed_generation.unwrap_or(0) >= ds.metadata.generation.unwrap_or(0);
    (!current || status.number_ready != status.desired_number_scheduled).then(|| {
        format!(
            "{what} {}/{} is ready on {} of {} nodes",
            ds.namespace().unwrap_or_default(),
            ds.name_any(),
            status.number_ready,
            status.desired_number_scheduled
        )
    })
}

/// What an LWS still waits for, if anything: its controller to see its generation, its
/// groups to be ready and updated, or its surge groups to go.
fn lws_pending(lws: &LeaderWorkerSet) -> Option<String> {
    let name = format!("{}/{}", lws.namespace().unwrap_or_default(), lws.name_any());
    let status = lws.status.clone().unwrap_or_default();
    let generation = lws.metadata.generation.unwrap_or(0);
    if status.observed_generation < generation {
        return Some(format!(
            "LeaderWorkerSet {name}: generation {generation} not seen by its controller yet"
        ));
    }
    let available = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition_types::AVAILABLE && c.status == "True");
    if !available || status.replicas != lws.spec.replicas {
        return Some(format!(
            "LeaderWorkerSet {name} is rolling out: {} of {} groups ready, {} updated, {} running",
            status.ready_replicas, lws.spec.replicas, status.updated_replicas, status.replicas
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::upgrade_config::UpgradePhase;

    fn at(text: &str) -> jiff::Timestamp {
        text.parse().unwrap()
    }

    fn gate(phase: Option<UpgradePhase>, upgrade_at: Option<&str>) -> CampaignGate {
        CampaignGate {
            name: "kmm-demo/my-kmod-v2".into(),
            phase,
            upgrade_at: upgrade_at.map(at),
            pdb_force_drain_timeout: std::time::Duration::ZERO,
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
                hold(&gate(phase, upgrade_at), now),
                expected,
                "{phase:?} {upgrade_at:?}"
            );
        }
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
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// A DaemonSet at generation 2 whose status saw `observed`, with `ready` of `desired`
    /// pods ready.
    fn daemon_set(observed: i64, ready: i32, desired: i32) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("my-kmod-dra-v1".into()),
                namespace: Some("kmm-demo".into()),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            status: Some(DaemonSetStatus {
                observed_generation: Some(observed),
                number_ready: ready,
                desired_number_scheduled: desired,
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    #[test]
    fn a_dra_driver_is_waited_for_until_it_is_ready_on_every_node_it_schedules() {
        // (name, DaemonSet, pending)
        let rows = [
            ("rolled out", daemon_set(2, 3, 3), None),
            ("schedules nothing", daemon_set(2, 0, 0), None),
            (
                "a pod not ready",
                daemon_set(2, 2, 3),
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 2 of 3 nodes"),
            ),
            (
                "its generation not seen yet",
                daemon_set(1, 3, 3),
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 3 of 3 nodes"),
            ),
            (
                "no status yet",
                DaemonSet {
                    status: None,
                    ..daemon_set(0, 0, 0)
                },
                Some("DRA driver kmm-demo/my-kmod-dra-v1 is ready on 0 of 0 nodes"),
            ),
        ];
        for (name, ds, pending) in rows {
            assert_eq!(
                rollout_pending("DRA driver", &ds).as_deref(),
                pending,
                "{name}"
            );
        }
        assert_eq!(
            rollout_pending("device plugin", &daemon_set(2, 2, 3)).as_deref(),
            Some("device plugin kmm-demo/my-kmod-dra-v1 is ready on 2 of 3 nodes")
        );
    }
}
