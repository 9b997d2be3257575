//! The in-process KMM controllers.
//!
//! Each controller's logic is a pure `decide` function of its inputs (plain facts read from
//! the objects) that returns a decision as plain data; its reconciler only reads the objects
//! (from the caches of kube runtime watchers), calls `decide` and applies the decision in the
//! documented order. The decision tables beside each `decide` mirror the seed flowcharts
//! branch by branch.
//!
//! - [`module_nmc`]: Module -> NodeModulesConfig, which Modules each node's NMC lists, and
//!   the Module's `status.moduleLoader` counts and finalizer.
//! - [`nmc`]: per node, from the NMC's spec and status, the node and its worker pods, which
//!   statuses to record, which worker pods to delete and create, and the ready labels.
//! - [`device_plugin`]: per Module, its device-plugin DaemonSets (one per version during an
//!   ordered upgrade) and the Module's `status.devicePlugin` counts.
//! - [`dra`]: per Module, its DRA driver DaemonSets (one per version, as the device
//!   plugin's), its DeviceClasses, the nodes' dra-ready labels and `status.dra`.
//! - [`module_daemon_sets`]: what those two share about the DaemonSets they run for a Module.
//! - [`kernel_mapping`]: which kmod image and settings a Module uses on a kernel.
//! - [`node`]: the facts about a node both controllers decide on.
//! - [`version_labels`]: the ordered upgrade of seed 002: per node and versioned Module, the
//!   internal version labels, one step at a time, under the `maxNodesInFlight` and
//!   `requirePullRequest` policy, every step recorded against its commit.
//! - [`nodekeeper`]: managed-upgrade-operator's nodekeeper: under an Upgrading campaign,
//!   forces the drain of a cordoned node past its timeouts, and raises
//!   `upgradeoperator_node_drain_timeout` (gauges in [`metrics`]).
//! - [`lws`]: LeaderWorkerSets, as upstream's LWS controller: StatefulSets, controller
//!   revisions, rolling updates and the groups' restart policies.
//! - [`notifications`]: each commit's rollout, per cluster, as a GitHub commit status, a
//!   pull-request comment and webhooks.
//!
//! [`run`] starts the controllers a [`Selection`] names (`capstan sync --controllers`) and
//! returns when the [`Context`]'s shutdown token is cancelled.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

pub mod caches;
pub mod campaign;
pub mod checks;
pub mod context;
pub mod converge;
pub mod device_plugin;
pub mod dra;
pub mod drain;
pub mod failures;
#[cfg(test)]
pub mod fixtures;
pub mod kernel_mapping;
pub mod lws;
pub mod metrics;
pub mod module_daemon_sets;
pub mod module_nmc;
pub mod nmc;
pub mod node;
pub mod nodekeeper;
pub mod notifications;
pub mod retries;
pub mod runner;
pub mod skipped_fields;
pub mod upgrade;
pub mod version_labels;

pub use context::Context;

/// One of the controllers capstan runs in process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ControllerName {
    /// Module -> NodeModulesConfig.
    ModuleNmc,
    /// NodeModulesConfig -> worker pods and ready labels.
    Nmc,
    /// Device-plugin DaemonSets.
    DevicePlugin,
    /// DRA driver DaemonSets and DeviceClasses.
    Dra,
    /// The ordered-upgrade version-label state machine.
    VersionLabels,
    /// `UpgradeConfig` campaigns: their status history and phases.
    Campaigns,
    /// Drains (evictions) of the nodes capstan cordoned under a campaign.
    Drain,
    /// MUO's nodekeeper: forces drains that outlast their timeouts.
    Nodekeeper,
    /// LeaderWorkerSets: their StatefulSets, revisions, rolling updates and groups.
    Lws,
    /// Each commit's rollout reported to GitHub and webhooks.
    Notifications,
}

impl ControllerName {
    /// Every controller, in the order they start.
    pub const ALL: [ControllerName; 10] = [
        ControllerName::ModuleNmc,
        ControllerName::Nmc,
        ControllerName::DevicePlugin,
        ControllerName::Dra,
        ControllerName::VersionLabels,
        ControllerName::Campaigns,
        ControllerName::Drain,
        ControllerName::Nodekeeper,
        ControllerName::Lws,
        ControllerName::Notifications,
    ];

    /// The name `--controllers` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ControllerName::ModuleNmc => "module-nmc",
            ControllerName::Nmc => "nmc",
            ControllerName::DevicePlugin => "device-plugin",
            ControllerName::Dra => "dra",
            ControllerName::VersionLabels => "version-labels",
            ControllerName::Campaigns => "campaigns",
            ControllerName::Drain => "drain",
            ControllerName::Nodekeeper => "nodekeeper",
            ControllerName::Lws => "lws",
            ControllerName::Notifications => "notifications",
        }
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which controllers to run: `all`, `none`, or a comma-separated list of names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection(BTreeSet<ControllerName>);

impl Selection {
    /// Every controller.
    pub fn all() -> Selection {
        Selection(ControllerName::ALL.into_iter().collect())
    }

    /// No controller: capstan only syncs.
    pub fn none() -> Selection {
        Selection(BTreeSet::new())
    }

    /// Whether `name` is selected.
    pub fn contains(&self, name: ControllerName) -> bool {
        self.0.contains(&name)
    }

    /// Whether no controller is selected.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The selected controllers, in start order.
    pub fn names(&self) -> impl Iterator<Item = ControllerName> + '_ {
        self.0.iter().copied()
    }
}

impl FromStr for Selection {
    type Err = String;

    fn from_str(text: &str) -> Result<Selection, String> {
        match text.trim() {
            "all" => return Ok(Selection::all()),
            "none" | "" => return Ok(Selection::none()),
            _ => {}
        }
        let mut selected = BTreeSet::new();
        for part in text.split(',').map(str::trim) {
            let name = ControllerName::ALL
                .into_iter()
                .find(|n| n.as_str() == part)
                .ok_or_else(|| {
                    let known: Vec<&str> = ControllerName::ALL.iter().map(|n| n.as_str()).collect();
                    format!(
                        "unknown controller {part:?}; known: all, none, {}",
                        known.join(", ")
                    )
                })?;
            selected.insert(name);
        }
        Ok(Selection(selected))
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.names().map(ControllerName::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// Runs the selected controllers until `ctx.shutdown` is cancelled.
pub async fn run(ctx: Arc<Context>, selection: &Selection) {
    let mut tasks: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
    // The KMM controllers share one watch per kind; it starts once they all subscribed.
    let mut caches = caches::Caches::new(&ctx.client);
    for name in selection.names() {
        let ctx = ctx.clone();
        match name {
            ControllerName::ModuleNmc => {
                tasks.spawn(module_nmc::reconciler::run(ctx, &caches));
            }
            ControllerName::Nmc => {
                tasks.spawn(nmc::reconciler::run(ctx, &caches));
            }
            ControllerName::DevicePlugin => {
                tasks.spawn(device_plugin::reconciler::run(ctx, &caches));
            }
            ControllerName::Dra => {
                tasks.spawn(dra::reconciler::run(ctx, &caches));
            }
            ControllerName::VersionLabels => {
                tasks.spawn(version_labels::reconciler::run(ctx, &caches));
            }
            ControllerName::Campaigns => {
                tasks.spawn(campaign::reconciler::run(ctx, &caches));
            }
            ControllerName::Drain => {
                tasks.spawn(drain::reconciler::run(ctx, &caches));
            }
            ControllerName::Nodekeeper => {
                tasks.spawn(nodekeeper::reconciler::run(ctx, &caches));
            }
            ControllerName::Lws => {
                tasks.spawn(lws::reconciler::run(ctx.clone(), &caches));
                tasks.spawn(lws::pods::run(ctx, &caches));
            }
            ControllerName::Notifications => {
                tasks.spawn(notifications::reconciler::run(ctx, &caches));
            }
        }
    }
    caches.start();
    while tasks.join_next().await.is_some() {}
    drop(caches);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse() {
        let cases: &[(&str, Result<&[ControllerName], &str>)] = &[
            ("all", Ok(&ControllerName::ALL)),
            ("none", Ok(&[])),
            ("nmc", Ok(&[ControllerName::Nmc])),
            (
                "nmc, module-nmc",
                Ok(&[ControllerName::ModuleNmc, ControllerName::Nmc]),
            ),
            ("nmc,kmm", Err("unknown controller \"kmm\"")),
        ];
        for (text, expected) in cases {
            let parsed = text.parse::<Selection>();
            match expected {
                Ok(names) => {
                    let got: Vec<ControllerName> = parsed.expect(text).names().collect();
                    assert_eq!(&got, names, "{text}");
                }
                Err(message) => {
                    let err = parsed.expect_err(text);
                    assert!(err.contains(message), "{text}: {err}");
                }
            }
        }
        assert_eq!(
            Selection::all().to_string(),
            "module-nmc,nmc,device-plugin,dra,version-labels,campaigns,drain,nodekeeper,lws,notifications"
        );
    }
}
