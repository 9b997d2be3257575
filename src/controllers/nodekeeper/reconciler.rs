//! The nodekeeper's reconciler: one reconcile per Node.
//!
//! It follows, through the shared caches, the Nodes (the trigger; a node that goes has its
//! metric reset), the `UpgradeConfig`s (a change reconciles every node: a campaign that
//! starts or stops Upgrading starts or stops the nodekeeper) and the `GitSync`s (read for
//! the `nodeDrain` settings). As MUO's, it does not watch pods or PodDisruptionBudgets: a
//! cordoned node is looked at every minute. A reconcile
//!
//! 1. decides on the cached node, the campaigns and the settings ([`decide`]);
//! 2. when the decision asks for them, reads the node afresh, its pods (field selector
//!    `spec.nodeName`, every namespace) and every PodDisruptionBudget from the API server,
//!    as MUO does, and decides again;
//! 3. for each strategy that acts, in order: writes its history record (before acting,
//!    so a restart in between finds it and acts without a second record), then, when the
//!    record is new, a Warning Event on the Node, both linked to the commit the node's
//!    `capstan.dev/revision` and `capstan.dev/pull-request` name; then acts on each pod:
//!    a delete with grace period 0, or the finalizers removed (field manager
//!    `capstan-nodekeeper`), each on that pod's UID only, a pod already gone skipped;
//! 4. sets, resets or keeps `upgradeoperator_node_drain_timeout{node_name}`, or, when no
//!    campaign is Upgrading any more, drops every node's series;
//! 5. looks again in a minute on the cordoned path, else waits for a change.
//!
//! A failed record stops the pass. A failed action on a pod does not stop its strategy:
//! every pod of the strategy is tried, as MUO does, and then the pass stops with all their
//! errors. What is left runs at the retry, which decides afresh; the reconcile is retried
//! with a growing delay and the metric is left as it is.

use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use jiff::Timestamp;
use json_patch::jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::{Value, json};

use super::pods::{IgnoredNamespaces, PatternError, PodFacts, PodRef};
use super::records::{self, StrategyRecord};
use super::strategies::PodAction;
use super::{
    Decision, DrainPass, Inputs, MetricChange, NodeFacts, RECHECK, UpgradingCampaigns, decide,
};
use crate::controllers::caches::Caches;
use crate::controllers::context::Context;
use crate::controllers::runner::Runner;
use crate::controllers::upgrade::{Policies, stamp_of};
use crate::history::{self, EventTarget};
use capstan_api::managers;
use capstan_api::{GitSync, NodeDrain, UpgradeConfig};

/// Why a reconcile failed; it is retried with a growing delay.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The cluster refused or failed a read or write.
    #[error("node {node}: {what}: {source}")]
    Api {
        /// The node reconciled.
        node: String,
        /// What was being done.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A strategy could not force some of its pods off the node; every one of them was
    /// tried first.
    #[error("node {node}: {strategy}: forcing pods off the node: {}", pod_errors(.failures))]
    Forcing {
        /// The node reconciled.
        node: String,
        /// The strategy's name.
        strategy: &'static str,
        /// Each pod that could not be forced, with the API error.
        failures: Vec<(PodRef, kube::Error)>,
    },
    /// The node is cordoned, but its cordon taint has no `timeAdded` (MUO's error).
    #[error("cannot determine drain commencement time for node {0}")]
    UnknownStart(String),
    /// The governing `ignoredNamespacePatterns` do not compile.
    #[error("node {node}: {source}")]
    Pattern {
        /// The node reconciled.
        node: String,
        /// The pattern that does not compile.
        #[source]
        source: PatternError,
    },
}

/// What every reconcile reads.
struct Shared {
    ctx: Arc<Context>,
    configs: Store<UpgradeConfig>,
    syncs: Store<GitSync>,
}

/// Runs the nodekeeper until `ctx.shutdown`. Subscribes to `caches`; the caller starts
/// them.
pub fn run(
    ctx: Arc<Context>,
    caches: &Caches,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (nodes, nodes_ready) = caches.nodes.reader();
    let (configs, configs_ready) = caches.upgrade_configs.reader();
    let (syncs, syncs_ready) = caches.syncs.reader();
    let node_changes = caches.nodes.subscribe();
    let node_ends = caches.nodes.subscribe();
    let config_changes = caches.upgrade_configs.subscribe();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        configs,
        syncs,
    });
    let every_node = {
        let nodes = nodes.clone();
        move |_config: Arc<UpgradeConfig>| {
            nodes
                .state()
                .iter()
                .map(|node| ObjectRef::from_obj(node.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let controller = Runner::new("nodekeeper", &ctx)
        .reads(nodes_ready)
        .reads(configs_ready)
        .reads(syncs_ready)
        .run(
            Controller::for_shared_stream(node_changes, nodes.clone())
                .watches_shared_stream(config_changes, every_node),
            reconcile,
            shared.clone(),
        );
    // A deleted node is no longer in the store, so the controller never reconciles it: the
    // change stream, which brings it as last seen, resets its metric.
    let removals = node_ends.for_each(move |node: Arc<Node>| {
        let gone = nodes.get(&ObjectRef::from_obj(node.as_ref())).is_none();
        let shared = shared.clone();
        async move {
            if gone {
                node_removed(&shared, &node).await;
            }
        }
    });
    async move {
        let removals = async {
            tokio::select! {
                () = removals => {}
                () = ctx.shutdown.cancelled() => {}
            }
        };
        tokio::join!(controller, removals);
    }
}

async fn reconcile(node: Arc<Node>, shared: Arc<Shared>) -> Result<Action, ReconcileError> {
    reconcile_node(&node, &shared).await
}

/// `ns/name: error` for each pod, `; `-separated.
fn pod_errors(failures: &[(PodRef, kube::Error)]) -> String {
    failures
        .iter()
        .map(|(pod, err)| format!("{pod}: {err}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The error of `what` failing on `node`.
fn failed(node: &str, what: &'static str) -> impl FnOnce(kube::Error) -> ReconcileError {
    let node = node.to_string();
    move |source| ReconcileError::Api { node, what, source }
}

async fn reconcile_node(cached: &Node, shared: &Shared) -> Result<Action, ReconcileError> {
    let name = cached.name_any();
    let campaigns = read_campaigns(shared)
        .await
        .map_err(failed(&name, "reading the UpgradeConfigs"))?;
    let policies = read_policies(shared)
        .await
        .map_err(failed(&name, "reading the GitSyncs"))?;
    let drain = policies.policy_for(&name).node_drain;
    let mut facts = NodeFacts::of(cached);
    let mut now = shared.ctx.clock.now();
    let mut decision = decide(&inputs(&facts, &campaigns, &drain, None), now);
    let mut node = cached.clone();
    if decision == Decision::ReadPods {
        let client = &shared.ctx.client;
        let pods = match Api::<Node>::all(client.clone())
            .get_opt(&name)
            .await
            .map_err(failed(&name, "reading the node"))?
        {
            Some(fresh) => {
                facts = NodeFacts::of(&fresh);
                node = fresh;
                read_pods(client, &name, &drain).await?
            }
            None => {
                facts = NodeFacts::gone(cached);
                Vec::new()
            }
        };
        now = shared.ctx.clock.now();
        decision = decide(&inputs(&facts, &campaigns, &drain, Some(&pods)), now);
    }
    tracing::debug!(node = %name, ?facts, ?campaigns, ?decision, "decided");
    match decision {
        Decision::Nothing => Ok(Action::await_change()),
        Decision::ClearMetrics => {
            shared.ctx.metrics.clear_node_drain_timeouts();
            Ok(Action::await_change())
        }
        Decision::Reset => {
            shared.ctx.metrics.reset_node_drain_timeout(&name);
            Ok(Action::await_change())
        }
        // The pods were read: `decide` does not ask twice.
        Decision::ReadPods => Ok(Action::requeue(RECHECK)),
        Decision::UnknownStart => Err(ReconcileError::UnknownStart(name)),
        Decision::Drain(pass) => {
            drain_pass(shared, &node, &policies, &pass, now).await?;
            match pass.metric {
                MetricChange::Set => shared.ctx.metrics.set_node_drain_timeout(&name),
                MetricChange::Reset => shared.ctx.metrics.reset_node_drain_timeout(&name),
                MetricChange::Keep => {}
            }
            Ok(Action::requeue(RECHECK))
        }
    }
}

fn inputs<'a>(
    node: &'a NodeFacts,
    campaigns: &'a UpgradingCampaigns,
    drain: &'a NodeDrain,
    pods: Option<&'a [PodFacts]>,
) -> Inputs<'a> {
    Inputs {
        node,
        campaigns,
        drain,
        pods,
    }
}

/// Resets the metric of a node that went, or drops every node's, when [`decide`] says so.
async fn node_removed(shared: &Shared, node: &Node) {
    let facts = NodeFacts::gone(node);
    let campaigns = match read_campaigns(shared).await {
        Ok(campaigns) => campaigns,
        Err(err) => {
            tracing::warn!(%err, node = %facts.name, "reading the UpgradeConfigs");
            return;
        }
    };
    let drain = NodeDrain::default();
    let now = shared.ctx.clock.now();
    match decide(&inputs(&facts, &campaigns, &drain, None), now) {
        Decision::Reset => shared.ctx.metrics.reset_node_drain_timeout(&facts.name),
        Decision::ClearMetrics => shared.ctx.metrics.clear_node_drain_timeouts(),
        Decision::Nothing | Decision::ReadPods | Decision::UnknownStart | Decision::Drain(_) => {}
    }
}

// ---- reads ----

/// The campaigns: from the cache once it has listed them, else from the API server; a
/// cluster without the kind has none.
async fn read_campaigns(shared: &Shared) -> Result<UpgradingCampaigns, kube::Error> {
    if let Some(Ok(())) = shared.configs.wait_until_ready().now_or_never() {
        let configs = shared.configs.state();
        return Ok(UpgradingCampaigns::of(configs.iter().map(Arc::as_ref)));
    }
    let api: Api<UpgradeConfig> = Api::all(shared.ctx.client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(UpgradingCampaigns::of(&list.items)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(UpgradingCampaigns::default()),
        Err(err) => Err(err),
    }
}

async fn read_policies(shared: &Shared) -> Result<Policies, kube::Error> {
    Policies::read(&shared.syncs, &shared.ctx.client).await
}

/// The facts of the pods on `node`, against every PodDisruptionBudget.
async fn read_pods(
    client: &kube::Client,
    node: &str,
    drain: &NodeDrain,
) -> Result<Vec<PodFacts>, ReconcileError> {
    let ignored =
        IgnoredNamespaces::compile(&drain.ignored_namespace_patterns).map_err(|source| {
            ReconcileError::Pattern {
                node: node.to_string(),
                source,
            }
        })?;
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = Api::<Pod>::all(client.clone())
        .list(&on_node)
        .await
        .map_err(failed(node, "listing the node's pods"))?
        .items;
    let pdbs = Api::<PodDisruptionBudget>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(failed(node, "listing the PodDisruptionBudgets"))?
        .items;
    Ok(pods
        .iter()
        .map(|pod| PodFacts::of(pod, node, &pdbs, &ignored))
        .collect())
}

// ---- writes ----

/// Runs `pass` on `node`: each strategy's record (and Event), then its actions.
async fn drain_pass(
    shared: &Shared,
    node: &Node,
    policies: &Policies,
    pass: &DrainPass,
    now: Timestamp,
) -> Result<(), ReconcileError> {
    let name = node.name_any();
    let Some(start) = pass.start else {
        return Ok(());
    };
    let stamp = stamp_of(node.annotations());
    for run in &pass.runs {
        let record = records::record(policies, &name, &stamp, start, run, now);
        // The log says it once, when its record is created (crate::history::write_record).
        tracing::debug!(node = %name, strategy = run.strategy.name(), message = %record.spec.message, "drain strategy");
        record_strategy(shared, node, &record)
            .await
            .map_err(failed(&name, "recording a drain strategy"))?;
        // One pod the API server refuses does not shield the others of the strategy until
        // the retry; the strategies after it wait for the retry, as MUO's do.
        let mut failures = Vec::new();
        for pod in &run.pods {
            if let Err(err) = act(&shared.ctx.client, run.strategy.action(), pod).await {
                failures.push((pod.clone(), err));
            }
        }
        if !failures.is_empty() {
            return Err(ReconcileError::Forcing {
                node: name,
                strategy: run.strategy.name(),
                failures,
            });
        }
    }
    Ok(())
}

/// Writes a strategy's record and, when it is new, its Event on the Node.
async fn record_strategy(
    shared: &Shared,
    node: &Node,
    record: &StrategyRecord,
) -> Result<(), kube::Error> {
    let client = &shared.ctx.client;
    let created =
        history::write_record_making_namespace(client, record.spec.clone(), managers::NODEKEEPER)
            .await?;
    if !created {
        return Ok(());
    }
    let target = EventTarget::node(node);
    if let Err(err) = history::record_event(
        &shared.ctx.recorder,
        &target,
        true,
        record.reason,
        &record.spec.message,
        &record.spec.commit,
        Default::default(),
    )
    .await
    {
        tracing::warn!(%err, node = %node.name_any(), "could not record a drain-strategy event");
    }
    Ok(())
}

/// Does `action` to `pod`, that pod only (by UID). A pod already gone, or replaced by
/// another of the same name, is left alone.
async fn act(client: &kube::Client, action: PodAction, pod: &PodRef) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
    let result = match action {
        PodAction::Delete => {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: (!pod.uid.is_empty()).then(|| Preconditions {
                    uid: Some(pod.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            pods.delete(&pod.name, &params).await.map(|_| ())
        }
        PodAction::StripFinalizers => {
            let params = PatchParams {
                field_manager: Some(managers::NODEKEEPER.to_string()),
                ..PatchParams::default()
            };
            pods.patch(
                &pod.name,
                &params,
                &Patch::Json::<()>(strip_patch(&pod.uid)),
            )
            .await
            .map(|_| ())
        }
    };
    match result {
        // Gone already.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        // Another pod of that name: the delete's precondition (409) or the patch's test
        // of the UID (422) failed, and nothing was done.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => Ok(()),
        other => other,
    }
}

/// A JSON patch that empties the finalizers of the pod with `uid`.
fn strip_patch(uid: &str) -> json_patch::Patch {
    let mut operations = Vec::new();
    if !uid.is_empty() {
        operations.push(json_patch::PatchOperation::Test(
            json_patch::TestOperation {
                path: PointerBuf::from_tokens(["metadata", "uid"]),
                value: Value::String(uid.to_string()),
            },
        ));
    }
    operations.push(json_patch::PatchOperation::Add(json_patch::AddOperation {
        path: PointerBuf::from_tokens(["metadata", "finalizers"]),
        value: json!([]),
    }));
    json_patch::Patch(operations)
}

#[cfg(test)]
mod tests;
