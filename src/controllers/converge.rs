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
//! thing, so a waiting `--once` can say what it waits for.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::campaign::Campaigns;
use super::module_nmc::{self, EntryAction, ModuleFacts};
use super::node::NodeFacts;
use super::version_labels::Progress;
use super::{ControllerName, Selection};
use capstan_api::labels::{self, DRAIN_ANNOTATION, ModuleKey, ModuleLabel};
use capstan_api::lws::condition_types;
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_api::{LeaderWorkerSet, UpgradeConfig};

/// Most pending items [`check`] lists.
const SHOWN: usize = 20;

/// What is still to happen; empty when the cluster has converged.
pub async fn check(client: &Client, selection: &Selection) -> Result<Vec<String>, kube::Error> {
    let mut pending = Vec::new();
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
        let now = jiff::Timestamp::now();
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
                if Progress::from_annotation(value).is_some_and(|p| p.upgrading()) {
                    pending.push(format!(
                        "node {} has not finished its upgrade of {}",
                        node.name_any(),
                        key
                    ));
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
                    // A campaign due already is about to start: its moves are waited for.
                    let held = campaigns.get(Some(value)).is_some_and(|campaign| {
                        campaign.failed()
                            || (!campaign.started()
                                && campaign.upgrade_at.is_some_and(|at| at > now))
                    });
                    if !held && (worker != Some(value) || plugin != Some(value)) {
                        pending.push(format!(
                            "node {} is moving {} to version {value}",
                            node.name, key
                        ));
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
    Ok(pending)
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
