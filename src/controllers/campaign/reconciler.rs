//! The campaign controller's reconciler: one reconcile per `UpgradeConfig`.
//!
//! It follows, through the shared caches, the `UpgradeConfig`s (the trigger), the Nodes (a
//! change of any node reconciles every campaign: a node starting or finishing moves a
//! campaign on) and the `GitSync`s (the `upgradeWindow` settings). A reconcile reads the
//! campaign and the node tally from the caches, calls [`decide`], and writes the new
//! history entry with a JSON merge patch of the status (conditional on the
//! resourceVersion it read, field manager `capstan-campaigns`), then the Event the decision
//! names on the `UpgradeConfig`, then the window-breached gauge.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;

use super::{CampaignEvent, CampaignFacts, decide, phase_line, resumed_line, tally};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::Runner;
use crate::controllers::upgrade::policy::asked_by;
use crate::controllers::upgrade::{Policies, stamp_of};
use crate::history::{self, EventTarget};
use capstan_api::managers;
use capstan_api::{GitSync, UpgradeConfig};
use k8s_openapi::api::core::v1::Node;

/// Next look after the campaign changed under a write.
const CONFLICT_RETRY: Duration = Duration::from_millis(200);

struct Shared {
    ctx: Arc<Context>,
    nodes: Store<Node>,
    syncs: Store<GitSync>,
    /// When this controller started: a campaign Upgrading since earlier resumes.
    started_at: jiff::Timestamp,
    /// The campaigns said resumed (`namespace/name`, version), so that each is said once.
    resumed: Mutex<BTreeSet<(String, String)>>,
}

impl Shared {
    /// Starts now, by `ctx`'s clock.
    fn new(ctx: Arc<Context>, nodes: Store<Node>, syncs: Store<GitSync>) -> Shared {
        Shared {
            started_at: ctx.clock.now(),
            ctx,
            nodes,
            syncs,
            resumed: Mutex::default(),
        }
    }
}

/// Runs the campaign controller until `ctx.shutdown`. Subscribes to `caches`; the caller
/// starts them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (configs, _) = caches.upgrade_configs.reader();
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (syncs, syncs_ready) = caches.syncs.reader();
    let config_changes = caches.upgrade_configs.subscribe();
    let node_changes = caches.nodes.subscribe();
    let shared = Arc::new(Shared::new(ctx.clone(), nodes, syncs));
    let controller = Controller::for_shared_stream(config_changes, configs.clone())
        .watches_shared_stream(node_changes, move |_node: Arc<Node>| {
            configs
                .state()
                .iter()
                .map(|config| ObjectRef::from_obj(config.as_ref()))
                .collect::<Vec<_>>()
        });
    // An empty node store would tally no node.
    Runner::new("campaigns", &ctx)
        .reads(nodes_ready)
        .reads(syncs_ready)
        .run(controller, reconcile, shared)
}

async fn reconcile(config: Arc<UpgradeConfig>, shared: Arc<Shared>) -> Result<Action, kube::Error> {
    let name = config.name_any();
    let namespace = config.namespace().unwrap_or_default();
    let version = config.spec.desired.version.as_str();
    if version.is_empty() {
        return Ok(Action::await_change());
    }
    let status = config.status.clone().unwrap_or_default();
    let nodes = shared.nodes.state();
    let facts = CampaignFacts {
        version,
        upgrade_at: config.spec.upgrade_at.parse().ok(),
        entry: status.history_for(version),
        nodes: tally(nodes.iter().map(Arc::as_ref), version),
    };
    let policies = Policies::of(shared.syncs.state());
    let commit = policies.commit_of(&name, &stamp_of(config.annotations()));
    let campaign = format!("{namespace}/{name}");
    let pull_request = history::pull_request(&commit);
    let say = |warning: bool, line: &str| {
        let sha = &commit.short_sha;
        if warning {
            tracing::warn!(%campaign, commit = %sha, %pull_request, "{line}");
        } else {
            tracing::info!(%campaign, commit = %sha, %pull_request, "{line}");
        }
    };
    if let Some(entry) = facts.entry {
        let asked = asked_by(&commit);
        if let Some(line) = resumed_line(&campaign, entry, &facts.nodes, shared.started_at, &asked)
            && lock(&shared.resumed).insert((campaign.clone(), version.to_string()))
        {
            say(false, &line);
        }
    }
    let window = policies.policy_for(&name).upgrade_window;
    let now = shared.ctx.clock.now();
    let decision = decide(&facts, &window, now);
    tracing::debug!(campaign = %name, ?facts, ?decision, "decided");

    if let Some(entry) = decision.entry {
        let line = phase_line(
            &campaign,
            facts.entry,
            &entry,
            decision.event.as_ref(),
            &asked_by(&commit),
        );
        let mut status = status.clone();
        status.set_history(entry);
        let patch = json!({
            "metadata": {"resourceVersion": config.resource_version()},
            "status": status,
        });
        let api: Api<UpgradeConfig> = Api::namespaced(shared.ctx.client.clone(), &namespace);
        let params = PatchParams {
            field_manager: Some(managers::CAMPAIGNS.to_string()),
            ..PatchParams::default()
        };
        match api
            .patch_status(&name, &params, &Patch::Merge(&patch))
            .await
        {
            // The write is conditional on what was read: the change it makes is made once,
            // and said once.
            Ok(_) => {
                if let Some(line) = line {
                    let warning = matches!(
                        decision.event,
                        Some(CampaignEvent::Delayed(_) | CampaignEvent::Failed(_))
                    );
                    say(warning, &line);
                }
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Ok(Action::requeue(CONFLICT_RETRY));
            }
            Err(err) => return Err(err),
        }
        if let Some(event) = &decision.event {
            let target = EventTarget {
                api_version: UpgradeConfig::api_version(&()).to_string(),
                kind: UpgradeConfig::kind(&()).to_string(),
                namespace: Some(namespace.clone()),
                name: name.clone(),
                uid: config.uid(),
            };
            if let Err(err) = history::record_event(
                &shared.ctx.recorder,
                &target,
                event.warning(),
                event.reason(),
                &event.message(version),
                &commit,
                Default::default(),
            )
            .await
            {
                tracing::warn!(%err, campaign = %name, "could not record a campaign event");
            }
        }
    }
    if let Some(breached) = decision.window_breached {
        let metrics = &shared.ctx.metrics;
        metrics.set_upgrade_window_breached(&name, breached);
        if breached {
            // MUO resets its failure metrics when an upgrade fails: the drains it watched
            // are over.
            metrics.clear_node_drain_timeouts();
        }
    }
    Ok(decision
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
