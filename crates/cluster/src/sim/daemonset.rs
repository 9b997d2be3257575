//! The DaemonSet controller of the simulated kube-controller-manager, after upstream
//! `pkg/controller/daemon`: one pod per node the DaemonSet's template fits (its
//! tolerations widened as upstream widens them), pods taken off nodes that no longer fit
//! or no longer exist, failed pods replaced with backoff, rolling updates within
//! `maxUnavailable`, a ControllerRevision per template, and the status `kubectl rollout
//! status` reads.
//!
//! Daemon pods are created bound: `spec.nodeName` is set, and also the node affinity term
//! (`matchFields metadata.name In [node]`) upstream sets for the scheduler to bind them,
//! so the pod reads as upstream's does once scheduled.
//!
//! Deviations from upstream: `maxSurge` is treated as 0; orphan pods matching the
//! selector are not adopted nor are owned pods that stop matching released; pods bound
//! to a node that no longer exists are deleted at once (upstream's pod garbage collector
//! does that); pods being deleted count as not ready.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::placement;
use crate::api::{Api, DeleteOptions, PatchType};
use crate::errors::ApiError;
use crate::pointer::Pointer;
use crate::resources::Resource;
use crate::store::{Change, EventType};

// Shared with the StatefulSet controller; the file sits beside both controllers.
use super::workload_controller;

use workload_controller::{
    Applied, Cache, Controller, Dependents, Key, OwnedPod, Owner, Revision, Settled, StatusWrite,
    StatusWriter, WorkQueue,
};

const MANAGER: &str = "daemonset-controller";
const KIND: &str = "DaemonSet";
/// Pod and ControllerRevision label holding the template hash (upstream
/// `DefaultDaemonSetUniqueLabelKey`).
const HASH_LABEL: &str = "controller-revision-hash";
/// Pod label holding the template generation (upstream `DaemonSetTemplateGenerationKey`).
const GENERATION_LABEL: &str = "pod-template-generation";
/// Where upstream's API server records a DaemonSet's template generation.
const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";
/// Creations (and deletions) per reconcile, as upstream's `BurstReplicas`.
const BURST: usize = 250;
/// The least time between two status writes of one DaemonSet.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// Upstream's backoff for replacing failed daemon pods: 1 s doubling to 15 min.
const FAILED_BACKOFF_START: Duration = Duration::from_secs(1);
const FAILED_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// Runs the DaemonSet controller until the store's change stream closes, telling
/// `settled` how far it has settled.
pub async fn run(api: Arc<Api>, settled: Settled) {
    let changes = api.store.follow();
    let Some(mut controller) = DaemonSetController::new(api) else {
        tracing::warn!(
            "the DaemonSet controller needs pods, nodes, daemonsets and controllerrevisions"
        );
        return;
    };
    workload_controller::drive(changes, &mut controller, &settled).await;
}

/// How a DaemonSet replaces pods whose template is out of date.
#[derive(Clone, Debug, PartialEq)]
enum UpdateStrategy {
    /// Only when the pod is deleted.
    OnDelete,
    /// Old pods deleted, at most `max_unavailable` (an IntOrString) unavailable at once.
    RollingUpdate { max_unavailable: Value },
}

/// The parts of a DaemonSet the controller acts on.
#[derive(Clone, Debug)]
struct DaemonSet {
    owner: Owner,
    template: Value,
    /// The `pod-template-generation` label of pods of the current template.
    template_generation: String,
    min_ready_seconds: i64,
    strategy: UpdateStrategy,
    revision_history_limit: usize,
    status: DaemonSetStatus,
}

impl DaemonSet {
    fn from_object(object: &Value) -> Self {
        let owner = Owner::from_object(KIND, object);
        let spec = &object["spec"];
        let strategy = match spec.at("/updateStrategy/type").and_then(Value::as_str) {
            Some("OnDelete") => UpdateStrategy::OnDelete,
            _ => UpdateStrategy::RollingUpdate {
                max_unavailable: spec
                    .at("/updateStrategy/rollingUpdate/maxUnavailable")
                    .cloned()
                    .unwrap_or(json!(1)),
            },
        };
        DaemonSet {
            // Upstream's API server keeps the template generation in an annotation; without
            // it, the object's generation stands in.
            template_generation: object["metadata"]["annotations"][TEMPLATE_GENERATION_ANNOTATION]
                .as_str()
                .map_or_else(|| owner.generation.to_string(), str::to_string),
            owner,
            template: spec.get("template").cloned().unwrap_or(json!({})),
            min_ready_seconds: spec["minReadySeconds"].as_i64().unwrap_or(0),
            strategy,
            revision_history_limit: spec["revisionHistoryLimit"]
                .as_u64()
                .and_then(|l| usize::try_from(l).ok())
                .unwrap_or(10),
            status: DaemonSetStatus::from_object(object),
        }
    }

    /// The spec of this DaemonSet's pods before they are pinned to a node.
    fn daemon_pod_spec(&self) -> Value {
        let mut spec = self.template.get("spec").cloned().unwrap_or(json!({}));
        let host_network = spec["hostNetwork"].as_bool().unwrap_or(false);
        placement::add_tolerations(&mut spec, &placement::daemon_set_tolerations(host_network));
        spec
    }

    /// Whether a pod runs the current template (upstream `IsPodUpdated`).
    fn is_updated(&self, pod: &OwnedPod, hash: &str) -> bool {
        (!hash.is_empty() && pod.label(HASH_LABEL) == hash)
            || pod.label(GENERATION_LABEL) == self.template_generation
    }
}

/// `status` of a DaemonSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct DaemonSetStatus {
    desired_number_scheduled: i64,
    current_number_scheduled: i64,
    number_misscheduled: i64,
    number_ready: i64,
    updated_number_scheduled: i64,
    number_available: i64,
    number_unavailable: i64,
    observed_generation: i64,
    collision_count: Option<i64>,
}

impl DaemonSetStatus {
    fn from_object(object: &Value) -> Self {
        let status = &object["status"];
        let number = |field: &str| status[field].as_i64().unwrap_or(0);
        DaemonSetStatus {
            desired_number_scheduled: number("desiredNumberScheduled"),
            current_number_scheduled: number("currentNumberScheduled"),
            number_misscheduled: number("numberMisscheduled"),
            number_ready: number("numberReady"),
            updated_number_scheduled: number("updatedNumberScheduled"),
            number_available: number("numberAvailable"),
            number_unavailable: number("numberUnavailable"),
            observed_generation: number("observedGeneration"),
            collision_count: status["collisionCount"].as_i64(),
        }
    }

    /// A merge patch of the status subresource; fields upstream omits when zero are
    /// removed (null) rather than written as 0.
    fn patch(&self) -> Value {
        let omit_zero = |n: i64| if n == 0 { Value::Null } else { json!(n) };
        json!({"status": {
            "desiredNumberScheduled": self.desired_number_scheduled,
            "currentNumberScheduled": self.current_number_scheduled,
            "numberMisscheduled": self.number_misscheduled,
            "numberReady": self.number_ready,
            "updatedNumberScheduled": omit_zero(self.updated_number_scheduled),
            "numberAvailable": omit_zero(self.number_available),
            "numberUnavailable": omit_zero(self.number_unavailable),
            "observedGeneration": omit_zero(self.observed_generation),
            "collisionCount": self.collision_count,
        }})
    }
}

/// Whether a DaemonSet wants a pod on a node, and whether one already there may stay
/// (upstream `NodeShouldRunDaemonPod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Eligibility {
    should_run: bool,
    should_continue_running: bool,
}

/// Upstream `NodeShouldRunDaemonPod` for a daemon pod spec (the template's spec with the
/// DaemonSet tolerations added): the node must match its node name, selector and
/// affinity and tolerate its taints; a pod already running stays unless a `NoExecute`
/// taint is not tolerated.
fn eligibility(daemon_pod_spec: &Value, node: &Value) -> Eligibility {
    match placement::fits(daemon_pod_spec, node) {
        Ok(()) => Eligibility {
            should_run: true,
            should_continue_running: true,
        },
        Err(unfit)
            if unfit.reason == placement::TAINT_TOLERATION
                || unfit.reason == placement::NODE_UNSCHEDULABLE =>
        {
            let evicting = placement::untolerated_taint(
                placement::taints_of(node),
                placement::tolerations_of(daemon_pod_spec),
                &["NoExecute"],
            );
            Eligibility {
                should_run: false,
                should_continue_running: evicting.is_none(),
            }
        }
        Err(_) => Eligibility {
            should_run: false,
            should_continue_running: false,
        },
    }
}

/// The parts of a node placement looks at; other changes (status, heartbeats) do not
/// concern the controller.
fn placement_view(node: &Value) -> Value {
    json!({
        "metadata": {"name": node["metadata"]["name"], "labels": node["metadata"]["labels"]},
        "spec": {"taints": node["spec"]["taints"], "unschedulable": node["spec"]["unschedulable"]},
    })
}

/// Why the controller deletes a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// The pod failed; a new one replaces it.
    Failed,
    /// The pod completed; daemons are meant to run, a new one replaces it.
    Succeeded,
    /// More than one pod on the node; the oldest stays.
    Duplicate,
    /// The node no longer fits the DaemonSet.
    Ineligible,
    /// The node is gone; the pod goes at once.
    NodeGone,
    /// The pod runs an old template (rolling update).
    Update,
}

/// One step towards the DaemonSet's desired state.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Create { node: String },
    Delete { pod: String, node: String, why: Why },
}

/// Pods by the node they are on.
type PodsByNode<'a> = BTreeMap<&'a str, Vec<&'a OwnedPod>>;

fn by_node<'a>(pods: &[&'a OwnedPod]) -> PodsByNode<'a> {
    let mut grouped: PodsByNode<'a> = BTreeMap::new();
    for pod in pods {
        grouped.entry(pod.node.as_str()).or_default().push(pod);
    }
    grouped
}

/// Pods that still occupy their node: all but those finished and being deleted.
fn occupying<'a>(pods: &[&'a OwnedPod]) -> Vec<&'a OwnedPod> {
    pods.iter()
        .filter(|p| !(p.is_terminal() && p.deleting))
        .copied()
        .collect()
}

/// Oldest first, ties by name (upstream `podByCreationTimestampAndPhase` for bound pods).
fn oldest_first(pods: &mut [&OwnedPod]) {
    pods.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.name.cmp(&b.name)));
}

/// The pods to create and delete for one DaemonSet: upstream `manage`, then, when that
/// has nothing left to do, `rollingUpdate`. Failed pods on `backing_off` nodes wait.
fn decide(
    ds: &DaemonSet,
    hash: &str,
    nodes: &BTreeMap<String, Eligibility>,
    pods: &PodsByNode,
    backing_off: &HashSet<String>,
    now: Timestamp,
) -> Vec<Action> {
    let actions = manage(nodes, pods, backing_off);
    match &ds.strategy {
        UpdateStrategy::RollingUpdate { max_unavailable } if actions.is_empty() => {
            rolling_update(ds, hash, max_unavailable, nodes, pods, now)
        }
        _ => actions,
    }
}

/// One pod on every node that should run one; none elsewhere.
fn manage(
    nodes: &BTreeMap<String, Eligibility>,
    pods: &PodsByNode,
    backing_off: &HashSet<String>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let delete = |pod: &OwnedPod, why| Action::Delete {
        pod: pod.name.clone(),
        node: pod.node.clone(),
        why,
    };
    for (node, eligibility) in nodes {
        let present = occupying(
            pods.get(node.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default(),
        );
        if eligibility.should_run && present.is_empty() {
            actions.push(Action::Create { node: node.clone() });
        } else if eligibility.should_continue_running {
            let mut running = Vec::new();
            for pod in present.into_iter().filter(|p| !p.deleting) {
                match pod.phase.as_str() {
                    "Failed" if backing_off.contains(node) => {}
                    "Failed" => actions.push(delete(pod, Why::Failed)),
                    "Succeeded" => actions.push(delete(pod, Why::Succeeded)),
                    _ => running.push(pod),
                }
            }
            oldest_first(&mut running);
            actions.extend(running.iter().skip(1).map(|p| delete(p, Why::Duplicate)));
        } else {
            actions.extend(
                present
                    .into_iter()
                    .filter(|p| !p.deleting)
                    .map(|p| delete(p, Why::Ineligible)),
            );
        }
    }
    for (node, on_node) in pods {
        if nodes.contains_key(*node) {
            continue;
        }
        for pod in on_node {
            match (node.is_empty(), pod.deleting) {
                (true, true) => {}
                (true, false) => actions.push(delete(pod, Why::Ineligible)),
                (false, _) => actions.push(delete(pod, Why::NodeGone)),
            }
        }
    }
    actions
}

/// Old pods to delete so that at most `maxUnavailable` nodes lack an available pod of
/// the current template; `manage` creates their replacements (upstream `rollingUpdate`
/// without surge).
fn rolling_update(
    ds: &DaemonSet,
    hash: &str,
    max_unavailable: &Value,
    nodes: &BTreeMap<String, Eligibility>,
    pods: &PodsByNode,
    now: Timestamp,
) -> Vec<Action> {
    let desired = nodes.values().filter(|e| e.should_run).count();
    let desired = i64::try_from(desired).unwrap_or(i64::MAX);
    let mut max_unavailable =
        workload_controller::scaled(max_unavailable, desired, true).unwrap_or(1);
    // An impossible configuration (0 and no surge) gets upstream's default of 1.
    if desired > 0 && max_unavailable <= 0 {
        max_unavailable = 1;
    }
    let considered: BTreeSet<&str> = pods
        .keys()
        .copied()
        .chain(
            nodes
                .iter()
                .filter(|(_, e)| e.should_run)
                .map(|(n, _)| n.as_str()),
        )
        .collect();
    let available = |pod: &OwnedPod| pod.is_available(ds.min_ready_seconds, now);
    let mut unavailable = 0;
    let mut replacements = Vec::new();
    let mut candidates = Vec::new();
    for node in considered {
        let live: Vec<&OwnedPod> = occupying(pods.get(node).map(Vec::as_slice).unwrap_or_default())
            .into_iter()
            .filter(|p| !p.deleting)
            .collect();
        let (new, old): (Vec<&OwnedPod>, Vec<&OwnedPod>) =
            live.into_iter().partition(|p| ds.is_updated(p, hash));
        match (new.as_slice(), old.as_slice()) {
            // Excess pods or none: `manage` handles the node; it counts as unavailable.
            ([_, _, ..], _) | (_, [_, _, ..]) | ([], []) | ([_], [_]) => unavailable += 1,
            ([new], []) => {
                if !available(new) {
                    unavailable += 1;
                }
            }
            ([], [old]) => {
                if !available(old) {
                    replacements.push(*old);
                    unavailable += 1;
                } else if unavailable < max_unavailable {
                    candidates.push(*old);
                }
            }
        }
    }
    let room = usize::try_from((max_unavailable - unavailable).max(0)).unwrap_or(0);
    replacements
        .into_iter()
        .chain(candidates.into_iter().take(room))
        .map(|pod| Action::Delete {
            pod: pod.name.clone(),
            node: pod.node.clone(),
            why: Why::Update,
        })
        .collect()
}

/// The DaemonSet's status for its nodes and pods (upstream `updateDaemonSetStatus`).
fn status(
    ds: &DaemonSet,
    hash: &str,
    nodes: &BTreeMap<String, Eligibility>,
    pods: &PodsByNode,
    now: Timestamp,
) -> DaemonSetStatus {
    let mut status = DaemonSetStatus {
        observed_generation: ds.owner.generation,
        collision_count: ds.status.collision_count,
        ..DaemonSetStatus::default()
    };
    for (node, eligibility) in nodes {
        let mut present = occupying(
            pods.get(node.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default(),
        );
        if !eligibility.should_run {
            if !present.is_empty() {
                status.number_misscheduled += 1;
            }
            continue;
        }
        status.desired_number_scheduled += 1;
        oldest_first(&mut present);
        let Some(pod) = present.first() else {
            continue;
        };
        status.current_number_scheduled += 1;
        if pod.is_ready() {
            status.number_ready += 1;
            if pod.is_available(ds.min_ready_seconds, now) {
                status.number_available += 1;
            }
        }
        if ds.is_updated(pod, hash) {
            status.updated_number_scheduled += 1;
        }
    }
    status.number_unavailable = status.desired_number_scheduled - status.number_available;
    status
}

/// The hash of a template as upstream `controller.ComputeHash`: FNV-1a of the template
/// (here its canonical JSON) and the collision count, safe-encoded.
fn template_hash(template: &Value, collision_count: Option<i64>) -> String {
    let json = workload_controller::canonical_json(template);
    // Upstream hashes the count as a little-endian uint32.
    let count = collision_count.map(|c| (c as u32).to_le_bytes());
    let parts: Vec<&[u8]> = std::iter::once(json.as_slice())
        .chain(count.as_ref().map(|c| c.as_slice()))
        .collect();
    workload_controller::safe_encode(workload_controller::fnv1a_32(&parts))
}

/// What to do about a DaemonSet's ControllerRevisions (upstream `constructHistory`).
#[derive(Debug, PartialEq)]
struct HistoryPlan {
    /// The hash pods of the current template carry.
    hash: String,
    /// A revision to create for the current template.
    create: Option<Value>,
    /// The current template's revision, to renumber as the newest (a rollback).
    renumber: Option<(String, i64)>,
    /// Other revisions of the current template.
    duplicates: Vec<String>,
    /// Revisions of other templates.
    old: Vec<Revision>,
}

fn plan_history(ds: &DaemonSet, revisions: &[Revision]) -> HistoryPlan {
    let data = workload_controller::template_patch(&ds.template);
    let (mut current, old): (Vec<Revision>, Vec<Revision>) =
        revisions.iter().cloned().partition(|r| r.data == data);
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    current.sort_by(|a, b| {
        b.revision
            .cmp(&a.revision)
            .then_with(|| a.name.cmp(&b.name))
    });
    let Some(kept) = current.first() else {
        let hash = template_hash(&ds.template, ds.status.collision_count);
        return HistoryPlan {
            create: Some(controller_revision(ds, &hash, data, next)),
            hash,
            renumber: None,
            duplicates: Vec::new(),
            old,
        };
    };
    HistoryPlan {
        hash: kept.label(HASH_LABEL).unwrap_or(&kept.name).to_string(),
        create: None,
        renumber: (kept.revision < next).then(|| (kept.name.clone(), next)),
        duplicates: current.iter().skip(1).map(|r| r.name.clone()).collect(),
        old,
    }
}

fn controller_revision(ds: &DaemonSet, hash: &str, data: Value, revision: i64) -> Value {
    let labels = workload_controller::template_labels(&ds.template, &[(HASH_LABEL, hash)]);
    let name = format!("{}-{hash}", ds.owner.name);
    ds.owner.controller_revision(&name, labels, data, revision)
}

/// Old revisions beyond `revisionHistoryLimit` that no pod runs, oldest first (upstream
/// `cleanupHistory`).
fn expired_revisions(old: &[Revision], live_hashes: &HashSet<&str>, limit: usize) -> Vec<String> {
    let excess = old.len().saturating_sub(limit);
    let mut old: Vec<&Revision> = old.iter().collect();
    old.sort_by_key(|r| r.revision);
    old.into_iter()
        .filter(|r| !r.label(HASH_LABEL).is_some_and(|h| live_hashes.contains(h)))
        .take(excess)
        .map(|r| r.name.clone())
        .collect()
}

/// The pod this DaemonSet creates, before it is pinned to a node (upstream
/// `CreatePodTemplate` and `GetPodFromTemplate`).
fn daemon_pod(ds: &DaemonSet, hash: &str) -> Value {
    let labels = workload_controller::template_labels(
        &ds.template,
        &[
            (GENERATION_LABEL, &ds.template_generation),
            (HASH_LABEL, hash),
        ],
    );
    let mut pod = ds.owner.pod_from_template(&ds.template, labels);
    pod["metadata"]["generateName"] = json!(format!("{}-", ds.owner.name));
    pod["spec"] = ds.daemon_pod_spec();
    pod
}

/// Binds a daemon pod to `node`: `spec.nodeName`, and the required node affinity
/// replaced by the one term upstream uses (`ReplaceDaemonSetPodNodeNameNodeAffinity`).
fn pin_to_node(pod: &mut Value, node: &str) {
    let spec = object_field(pod, "spec");
    spec["nodeName"] = json!(node);
    let node_affinity = object_field(object_field(spec, "affinity"), "nodeAffinity");
    let required = object_field(
        node_affinity,
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
    required["nodeSelectorTerms"] = json!([{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]);
}

/// `value[field]`, made an object if it was anything else.
fn object_field<'a>(value: &'a mut Value, field: &str) -> &'a mut Value {
    if !value.is_object() {
        *value = json!({});
    }
    let slot = &mut value[field];
    if !slot.is_object() {
        *slot = json!({});
    }
    slot
}

/// Upstream's per-node backoff before a failed daemon pod is replaced again.
#[derive(Default)]
struct FailureBackoff {
    entries: HashMap<(String, String), (Instant, Duration)>,
}

impl FailureBackoff {
    /// Nodes of the DaemonSet `uid` still backing off, and how long until the first clears.
    fn backing_off(&self, uid: &str, now: Instant) -> (HashSet<String>, Option<Duration>) {
        let mut nodes = HashSet::new();
        let mut soonest: Option<Duration> = None;
        for ((owner, node), (since, delay)) in &self.entries {
            let until = *since + *delay;
            if owner == uid && until > now {
                nodes.insert(node.clone());
                let left = until - now;
                soonest = Some(soonest.map_or(left, |s| s.min(left)));
            }
        }
        (nodes, soonest)
    }

    fn failed(&mut self, uid: &str, node: &str, now: Instant) {
        let entry = self
            .entries
            .entry((uid.to_string(), node.to_string()))
            .or_insert((now, Duration::ZERO));
        // A node that stayed quiet for twice the longest delay starts over.
        let expired = now.duration_since(entry.0) > 2 * FAILED_BACKOFF_MAX;
        entry.1 = if entry.1.is_zero() || expired {
            FAILED_BACKOFF_START
        } else {
            (entry.1 * 2).min(FAILED_BACKOFF_MAX)
        };
        entry.0 = now;
    }

    fn forget(&mut self, uid: &str) {
        self.entries.retain(|(owner, _), _| owner != uid);
    }
}

/// The eligibility of every node for one DaemonSet, kept until its spec or a node changes.
struct Eligibilities {
    generation: i64,
    by_node: BTreeMap<String, Eligibility>,
}

struct DaemonSetController {
    api: Arc<Api>,
    pod_resource: Arc<Resource>,
    daemon_set_resource: Arc<Resource>,
    revision_resource: Arc<Resource>,
    daemon_sets: Cache<Value>,
    /// Placement views of the nodes, keyed ("", name).
    nodes: Cache<Value>,
    dependents: Dependents,
    eligibility: HashMap<Key, Eligibilities>,
    failures: FailureBackoff,
    queue: WorkQueue,
    status_writer: StatusWriter,
}

impl DaemonSetController {
    fn new(api: Arc<Api>) -> Option<Self> {
        let daemon_set_resource = api.registry.get("apps", "v1", "daemonsets")?;
        Some(DaemonSetController {
            pod_resource: api.registry.get("", "v1", "pods")?,
            revision_resource: api.registry.get("apps", "v1", "controllerrevisions")?,
            status_writer: StatusWriter::new(daemon_set_resource.clone(), MANAGER, STATUS_INTERVAL),
            daemon_set_resource,
            api,
            daemon_sets: Cache::default(),
            nodes: Cache::default(),
            dependents: Dependents::new(KIND),
            eligibility: HashMap::new(),
            failures: FailureBackoff::default(),
            queue: WorkQueue::default(),
        })
    }

    fn observe_node(&mut self, change: &Change) {
        let before = self
            .nodes
            .get(&(String::new(), change.key.name.clone()))
            .map(|c| c.item.clone());
        let applied = self
            .nodes
            .observe(change, |_| placement_view(change.value()));
        let Applied::Replaced(_) = applied else {
            return;
        };
        let after = self
            .nodes
            .get(&(String::new(), change.key.name.clone()))
            .map(|c| &c.item);
        if before.as_ref() == after {
            return;
        }
        for eligibilities in self.eligibility.values_mut() {
            eligibilities.by_node.remove(&change.key.name);
        }
        let keys: Vec<Key> = self.daemon_sets.iter().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.queue.add(key);
        }
    }

    /// Brings the cached eligibility of every node up to date for `ds`.
    fn refresh_eligibility(&mut self, ds: &DaemonSet) {
        let entry = self
            .eligibility
            .entry(ds.owner.key())
            .or_insert_with(|| Eligibilities {
                generation: ds.owner.generation,
                by_node: BTreeMap::new(),
            });
        if entry.generation != ds.owner.generation {
            entry.generation = ds.owner.generation;
            entry.by_node.clear();
        }
        // Entries of changed or deleted nodes were dropped as the changes came in.
        let spec = ds.daemon_pod_spec();
        for ((_, name), node) in self.nodes.iter() {
            if !entry.by_node.contains_key(name) {
                entry
                    .by_node
                    .insert(name.clone(), eligibility(&spec, &node.item));
            }
        }
    }

    /// Makes sure the current template has its ControllerRevision; returns the hash pods
    /// of that template carry and the revisions of other templates, or `None` to retry.
    fn sync_history(&mut self, ds: &DaemonSet) -> Option<HistoryPlan> {
        let revisions: Vec<Revision> = self
            .dependents
            .revisions
            .owned_by(&ds.owner.uid)
            .into_iter()
            .cloned()
            .collect();
        let plan = plan_history(ds, &revisions);
        let options = workload_controller::write_options(MANAGER);
        if let Some(body) = &plan.create {
            match self.api.create(
                &self.revision_resource,
                &ds.owner.namespace,
                body.clone(),
                &options,
            ) {
                Ok(created) => self.dependents.revisions.record(&created),
                Err(err) if err.code == 409 => return self.resolve_collision(ds, body),
                Err(err) => {
                    self.failed(ds, "creating a ControllerRevision", &err);
                    return None;
                }
            }
        }
        if let Some((name, revision)) = &plan.renumber {
            let result = self.api.patch(
                &self.revision_resource,
                &ds.owner.namespace,
                name,
                None,
                PatchType::Merge,
                json!({"revision": revision}),
                &options,
            );
            match result {
                Ok(updated) => self.dependents.revisions.record(&updated),
                Err(err) => {
                    self.failed(ds, "renumbering a ControllerRevision", &err);
                    return None;
                }
            }
        }
        for name in &plan.duplicates {
            self.delete_revision(ds, name);
        }
        Some(plan)
    }

    /// A revision by the wanted name exists: ours for this template (an event not yet
    /// seen), or a hash collision, which upstream resolves by counting it into the hash.
    fn resolve_collision(&mut self, ds: &DaemonSet, body: &Value) -> Option<HistoryPlan> {
        let name = body["metadata"]["name"].as_str().unwrap_or("");
        let existing = self
            .api
            .get_value(&self.revision_resource, &ds.owner.namespace, name)
            .ok();
        let ours = existing.as_ref().is_some_and(|e| {
            workload_controller::controller_of(&e["metadata"], KIND)
                .is_some_and(|o| o.uid == ds.owner.uid)
                && e["data"] == body["data"]
        });
        if let (true, Some(existing)) = (ours, existing) {
            self.dependents.revisions.record(&existing);
            let revisions: Vec<Revision> = self
                .dependents
                .revisions
                .owned_by(&ds.owner.uid)
                .into_iter()
                .cloned()
                .collect();
            return Some(plan_history(ds, &revisions));
        }
        let count = ds.status.collision_count.unwrap_or(0) + 1;
        let result = self.api.patch(
            &self.daemon_set_resource,
            &ds.owner.namespace,
            &ds.owner.name,
            Some("status"),
            PatchType::Merge,
            json!({"status": {"collisionCount": count}}),
            &workload_controller::write_options(MANAGER),
        );
        match result {
            Ok(updated) => self.record_daemon_set(&updated),
            Err(err) => {
                self.failed(ds, "counting a revision name collision", &err);
            }
        }
        self.queue.add(ds.owner.key());
        None
    }

    fn delete_revision(&mut self, ds: &DaemonSet, name: &str) {
        let result = self.api.delete(
            &self.revision_resource,
            &ds.owner.namespace,
            name,
            &DeleteOptions::default(),
        );
        match result {
            Ok(_) => self
                .dependents
                .revisions
                .record_removed(&(ds.owner.namespace.clone(), name.to_string())),
            Err(err) => {
                self.failed(ds, "deleting a ControllerRevision", &err);
            }
        }
    }

    /// Logs an unexpected failure and retries the DaemonSet in a moment.
    fn failed(&mut self, ds: &DaemonSet, what: &str, err: &ApiError) {
        if !workload_controller::is_race(err) {
            tracing::warn!(%err, namespace = %ds.owner.namespace, daemonset = %ds.owner.name, "{what}");
        }
        self.queue
            .add_after(ds.owner.key(), workload_controller::retry_after(err));
    }

    fn record_daemon_set(&mut self, object: &Value) {
        self.daemon_sets.record(object, object.clone());
    }

    /// Carries out up to [`BURST`] creations and deletions; true when some are left.
    fn apply(&mut self, ds: &DaemonSet, hash: &str, actions: Vec<Action>) -> bool {
        let (creates, deletes): (Vec<Action>, Vec<Action>) = actions
            .into_iter()
            .partition(|a| matches!(a, Action::Create { .. }));
        let more = creates.len() > BURST || deletes.len() > BURST;
        let template = (!creates.is_empty()).then(|| daemon_pod(ds, hash));
        let options = workload_controller::write_options(MANAGER);
        for action in creates.into_iter().take(BURST) {
            let (Action::Create { node }, Some(template)) = (action, &template) else {
                continue;
            };
            let mut pod = template.clone();
            pin_to_node(&mut pod, &node);
            match self
                .api
                .create(&self.pod_resource, &ds.owner.namespace, pod, &options)
            {
                Ok(created) => self.dependents.pods.record(&created),
                Err(err) => {
                    self.failed(ds, "creating a daemon pod", &err);
                }
            }
        }
        let now = Instant::now();
        for action in deletes.into_iter().take(BURST) {
            let Action::Delete { pod, node, why } = action else {
                continue;
            };
            if why == Why::Failed {
                self.failures.failed(&ds.owner.uid, &node, now);
            }
            let options = DeleteOptions {
                // Nothing is left to run a graceful shutdown on a node that is gone.
                grace_period_seconds: (why == Why::NodeGone).then_some(0),
                ..DeleteOptions::default()
            };
            let key = (ds.owner.namespace.clone(), pod);
            let deleted = workload_controller::delete_pod(
                &self.api,
                &self.pod_resource,
                &mut self.dependents.pods,
                &key,
                &options,
            );
            if let Err(err) = deleted {
                self.failed(ds, "deleting a daemon pod", &err);
            }
        }
        more
    }

    /// Writes the status when it differs from the stored one, at most every
    /// [`STATUS_INTERVAL`].
    fn write_status(&mut self, ds: &DaemonSet, hash: &str, now: Timestamp) {
        let key = ds.owner.key();
        let computed = {
            let owned = self.dependents.pods.owned_by(&ds.owner.uid);
            let nodes = self.eligibility.get(&key).map(|e| &e.by_node);
            let empty = BTreeMap::new();
            status(ds, hash, nodes.unwrap_or(&empty), &by_node(&owned), now)
        };
        if ds.min_ready_seconds > 0 && computed.number_ready != computed.number_available {
            let seconds = u64::try_from(ds.min_ready_seconds).unwrap_or(0);
            self.queue
                .add_after(key.clone(), Duration::from_secs(seconds));
        }
        if computed == ds.status {
            return;
        }
        match self
            .status_writer
            .write(&self.api, &ds.owner, computed.patch())
        {
            StatusWrite::Written(updated) => self.record_daemon_set(&updated),
            StatusWrite::Wait(wait) => self.queue.add_after(key, wait),
            StatusWrite::Failed(err) => self.failed(ds, "writing DaemonSet status", &err),
        }
    }

    fn clean_history(&mut self, ds: &DaemonSet, old: &[Revision]) {
        if old.len() <= ds.revision_history_limit {
            return;
        }
        let expired = {
            let owned = self.dependents.pods.owned_by(&ds.owner.uid);
            let live: HashSet<&str> = owned.iter().map(|p| p.label(HASH_LABEL)).collect();
            expired_revisions(old, &live, ds.revision_history_limit)
        };
        for name in expired {
            self.delete_revision(ds, &name);
        }
    }
}

impl Controller for DaemonSetController {
    fn resync(&mut self) {
        self.daemon_sets.clear();
        self.nodes.clear();
        self.eligibility.clear();
        let store = self.api.store.clone();
        for object in store.list("daemonsets", None, None, None, None).items {
            let value = object.value();
            self.record_daemon_set(&value);
        }
        for object in store.list("nodes", None, None, None, None).items {
            let value = object.value();
            let name = value["metadata"]["name"].as_str().unwrap_or("").to_string();
            self.nodes.put(
                (String::new(), name),
                object.uid(),
                object.resource_version,
                placement_view(&value),
            );
        }
        self.dependents.resync(&self.api);
        let keys: Vec<Key> = self.daemon_sets.iter().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.queue.add(key);
        }
    }

    fn observe(&mut self, change: &Change) {
        match change.key.storage.as_str() {
            "nodes" => self.observe_node(change),
            "daemonsets" => {
                let key = (change.key.namespace.clone(), change.key.name.clone());
                let applied = self.daemon_sets.observe(change, |object| object.value());
                if let Applied::Replaced(before) = applied {
                    if change.event == EventType::Deleted {
                        self.eligibility.remove(&key);
                        self.status_writer.forget(&key);
                        if let Some(before) = before {
                            self.failures.forget(&before.uid);
                        }
                    }
                    self.queue.add(key);
                }
            }
            _ => {
                for owner in self.dependents.observe(change) {
                    self.queue.add(owner);
                }
            }
        }
    }

    fn reconcile(&mut self, key: &Key) {
        let Some(cached) = self.daemon_sets.get(key) else {
            return;
        };
        let ds = DaemonSet::from_object(&cached.item);
        if ds.owner.deleting {
            return;
        }
        let Some(history) = self.sync_history(&ds) else {
            return;
        };
        self.refresh_eligibility(&ds);
        let now = self.api.clock.now();
        let (backing_off, backoff_left) = self.failures.backing_off(&ds.owner.uid, Instant::now());
        if let Some(left) = backoff_left {
            self.queue.add_after(key.clone(), left);
        }
        let actions = {
            let owned = self.dependents.pods.owned_by(&ds.owner.uid);
            let empty = BTreeMap::new();
            let nodes = self.eligibility.get(key).map_or(&empty, |e| &e.by_node);
            decide(
                &ds,
                &history.hash,
                nodes,
                &by_node(&owned),
                &backing_off,
                now,
            )
        };
        if self.apply(&ds, &history.hash, actions) {
            self.queue.add(key.clone());
        }
        self.write_status(&ds, &history.hash, now);
        self.clean_history(&ds, &history.old);
    }

    fn queue(&mut self) -> &mut WorkQueue {
        &mut self.queue
    }
}

#[cfg(test)]
mod tests {
    use super::workload_controller::testing::{self, eventually};
    use super::*;
    use crate::EmbeddedCluster;
    use serde_json::Map;

    const HASH: &str = "new";

    fn daemon_set(spec: Value) -> DaemonSet {
        let mut spec = spec;
        if spec.get("template").is_none() {
            spec["template"] = json!({"metadata": {"labels": {"app": "agent"}},
                                      "spec": {"containers": [{"name": "a", "image": "agent:1"}]}});
        }
        DaemonSet::from_object(&json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid", "generation": 2},
            "spec": spec,
        }))
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    /// A running, ready pod of `hash` on `node`, created at `created` seconds.
    fn pod(name: &str, node: &str, hash: &str, created: i64) -> OwnedPod {
        let mut labels = Map::new();
        labels.insert(HASH_LABEL.into(), json!(hash));
        OwnedPod {
            name: name.into(),
            node: node.into(),
            labels,
            phase: "Running".into(),
            ready: true,
            ready_since: Some(at(created)),
            deleting: false,
            created: Some(at(created)),
        }
    }

    fn not_ready(pod: OwnedPod) -> OwnedPod {
        OwnedPod {
            ready: false,
            ready_since: None,
            phase: "Pending".into(),
            ..pod
        }
    }

    fn deleting(pod: OwnedPod) -> OwnedPod {
        OwnedPod {
            deleting: true,
            ..pod
        }
    }

    fn phase(pod: OwnedPod, phase: &str) -> OwnedPod {
        OwnedPod {
            phase: phase.into(),
            ready: false,
            ..pod
        }
    }

    const RUN: Eligibility = Eligibility {
        should_run: true,
        should_continue_running: true,
    };
    const STAY: Eligibility = Eligibility {
        should_run: false,
        should_continue_running: true,
    };
    const NO: Eligibility = Eligibility {
        should_run: false,
        should_continue_running: false,
    };

    fn nodes(list: &[(&str, Eligibility)]) -> BTreeMap<String, Eligibility> {
        list.iter().map(|(n, e)| ((*n).to_string(), *e)).collect()
    }

    fn run_decide(
        ds: &DaemonSet,
        nodes: &BTreeMap<String, Eligibility>,
        pods: &[OwnedPod],
    ) -> Vec<Action> {
        let refs: Vec<&OwnedPod> = pods.iter().collect();
        decide(ds, HASH, nodes, &by_node(&refs), &HashSet::new(), at(1000))
    }

    fn create(node: &str) -> Action {
        Action::Create { node: node.into() }
    }

    fn delete(pod: &str, node: &str, why: Why) -> Action {
        Action::Delete {
            pod: pod.into(),
            node: node.into(),
            why,
        }
    }

    #[test]
    fn manage_keeps_one_pod_on_every_eligible_node() {
        let ds = daemon_set(json!({}));
        let three = nodes(&[("n1", RUN), ("n2", RUN), ("n3", NO)]);
        let cases: Vec<(&str, Vec<OwnedPod>, Vec<Action>)> = vec![
            (
                "empty nodes get a pod",
                vec![],
                vec![create("n1"), create("n2")],
            ),
            (
                "a node with its pod needs nothing",
                vec![pod("a", "n1", HASH, 0), pod("b", "n2", HASH, 0)],
                vec![],
            ),
            (
                "the newest of two pods goes",
                vec![
                    pod("a", "n1", HASH, 5),
                    pod("b", "n1", HASH, 1),
                    pod("c", "n2", HASH, 0),
                ],
                vec![delete("a", "n1", Why::Duplicate)],
            ),
            (
                "an ineligible node loses its pod",
                vec![
                    pod("a", "n1", HASH, 0),
                    pod("b", "n2", HASH, 0),
                    pod("c", "n3", HASH, 0),
                ],
                vec![delete("c", "n3", Why::Ineligible)],
            ),
            (
                "no new pod while the old one terminates",
                vec![deleting(pod("a", "n1", HASH, 0)), pod("b", "n2", HASH, 0)],
                vec![],
            ),
            (
                "failed and completed pods go, to be replaced",
                vec![
                    phase(pod("a", "n1", HASH, 0), "Failed"),
                    phase(pod("b", "n2", HASH, 0), "Succeeded"),
                ],
                vec![
                    delete("a", "n1", Why::Failed),
                    delete("b", "n2", Why::Succeeded),
                ],
            ),
            (
                "a failed pod being deleted no longer occupies its node",
                vec![
                    deleting(phase(pod("a", "n1", HASH, 0), "Failed")),
                    pod("b", "n2", HASH, 0),
                ],
                vec![create("n1")],
            ),
            (
                "pods on nodes that are gone go at once",
                vec![
                    pod("a", "n1", HASH, 0),
                    pod("b", "n2", HASH, 0),
                    pod("c", "gone", HASH, 0),
                ],
                vec![delete("c", "gone", Why::NodeGone)],
            ),
        ];
        for (story, pods, expected) in cases {
            assert_eq!(run_decide(&ds, &three, &pods), expected, "{story}");
        }
    }

    #[test]
    fn pods_tolerating_new_taints_stay_but_none_is_added() {
        let ds = daemon_set(json!({}));
        let tainted = nodes(&[("n1", STAY), ("n2", STAY)]);
        let pods = vec![pod("a", "n1", HASH, 0)];
        assert_eq!(run_decide(&ds, &tainted, &pods), vec![]);
    }

    #[test]
    fn failed_pods_wait_out_their_node_backoff() {
        let ds = daemon_set(json!({}));
        let one = nodes(&[("n1", RUN)]);
        let pods = [phase(pod("a", "n1", HASH, 0), "Failed")];
        let refs: Vec<&OwnedPod> = pods.iter().collect();
        let backing_off: HashSet<String> = ["n1".to_string()].into();
        assert_eq!(
            decide(&ds, HASH, &one, &by_node(&refs), &backing_off, at(10)),
            vec![]
        );
    }

    #[test]
    fn rolling_update_replaces_old_pods_within_max_unavailable() {
        let four = nodes(&[("n1", RUN), ("n2", RUN), ("n3", RUN), ("n4", RUN)]);
        let old = |name: &str, node: &str| pod(name, node, "old", 0);
        let cases: Vec<(&str, Value, Vec<OwnedPod>, Vec<&str>)> = vec![
            (
                "one at a time by default",
                json!({}),
                vec![
                    old("a", "n1"),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec!["a"],
            ),
            (
                "two at a time",
                json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}),
                vec![
                    old("a", "n1"),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec!["a", "b"],
            ),
            (
                "a percentage rounds up",
                json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "30%"}}}),
                vec![
                    old("a", "n1"),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec!["a", "b"],
            ),
            (
                "an unavailable new pod uses up the budget",
                json!({}),
                vec![
                    not_ready(pod("a", "n1", HASH, 0)),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec![],
            ),
            (
                "a terminating pod uses up the budget",
                json!({}),
                vec![
                    deleting(old("a", "n1")),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec![],
            ),
            (
                "an unavailable old pod is replaced regardless",
                json!({}),
                vec![
                    pod("a", "n1", HASH, 0),
                    old("b", "n2"),
                    not_ready(old("c", "n3")),
                    old("d", "n4"),
                ],
                vec!["c"],
            ),
            (
                "available new pods free the budget",
                json!({}),
                vec![
                    pod("a", "n1", HASH, 0),
                    pod("b", "n2", HASH, 0),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec!["c"],
            ),
            (
                "OnDelete replaces nothing",
                json!({"updateStrategy": {"type": "OnDelete"}}),
                vec![
                    old("a", "n1"),
                    old("b", "n2"),
                    old("c", "n3"),
                    old("d", "n4"),
                ],
                vec![],
            ),
        ];
        for (story, spec, pods, expected) in cases {
            let ds = daemon_set(spec);
            let expected: Vec<Action> = expected
                .iter()
                .map(|name| {
                    let node = pods
                        .iter()
                        .find(|p| p.name == *name)
                        .map_or("", |p| p.node.as_str());
                    delete(name, node, Why::Update)
                })
                .collect();
            assert_eq!(run_decide(&ds, &four, &pods), expected, "{story}");
        }
    }

    #[test]
    fn rolling_update_waits_for_missing_pods_to_be_created() {
        let ds = daemon_set(json!({}));
        let two = nodes(&[("n1", RUN), ("n2", RUN)]);
        let pods = vec![pod("a", "n1", "old", 0)];
        assert_eq!(run_decide(&ds, &two, &pods), vec![create("n2")]);
    }

    #[test]
    fn min_ready_seconds_delay_availability() {
        let ds = daemon_set(json!({"minReadySeconds": 30}));
        let two = nodes(&[("n1", RUN), ("n2", RUN)]);
        let pods = [pod("a", "n1", "old", 990), pod("b", "n2", "old", 900)];
        let refs: Vec<&OwnedPod> = pods.iter().collect();
        // a is ready but not yet available, so it is replaced as unavailable and b waits.
        let actions = decide(&ds, HASH, &two, &by_node(&refs), &HashSet::new(), at(1000));
        assert_eq!(actions, vec![delete("a", "n1", Why::Update)]);
    }

    #[test]
    fn status_counts_nodes_pods_and_updates() {
        let ds = daemon_set(json!({"minReadySeconds": 10}));
        let cluster = nodes(&[
            ("n1", RUN),
            ("n2", RUN),
            ("n3", RUN),
            ("n4", RUN),
            ("n5", NO),
        ]);
        let pods = [
            pod("a", "n1", HASH, 0),
            pod("b", "n2", "old", 995),
            not_ready(pod("c", "n3", HASH, 0)),
            pod("e", "n5", HASH, 0),
        ];
        let refs: Vec<&OwnedPod> = pods.iter().collect();
        let computed = status(&ds, HASH, &cluster, &by_node(&refs), at(1000));
        assert_eq!(
            computed,
            DaemonSetStatus {
                desired_number_scheduled: 4,
                current_number_scheduled: 3,
                number_misscheduled: 1,
                number_ready: 2,
                updated_number_scheduled: 2,
                number_available: 1,
                number_unavailable: 3,
                observed_generation: 2,
                collision_count: None,
            }
        );
        assert_eq!(
            computed.patch()["status"],
            json!({"desiredNumberScheduled": 4, "currentNumberScheduled": 3, "numberMisscheduled": 1,
                   "numberReady": 2, "updatedNumberScheduled": 2, "numberAvailable": 1,
                   "numberUnavailable": 3, "observedGeneration": 2, "collisionCount": null})
        );
    }

    #[test]
    fn pods_of_the_template_generation_count_as_updated() {
        let ds = daemon_set(json!({}));
        let mut by_generation = pod("a", "n1", "other", 0);
        by_generation
            .labels
            .insert(GENERATION_LABEL.into(), json!("2"));
        assert!(ds.is_updated(&by_generation, HASH));
        assert!(!ds.is_updated(&pod("b", "n1", "other", 0), HASH));
    }

    #[test]
    fn eligibility_by_selector_taints_and_node_name() {
        let ds = daemon_set(json!({"template": {"metadata": {}, "spec": {
            "nodeSelector": {"role": "worker"}, "containers": [{"name": "a", "image": "a"}]}}}));
        let spec = ds.daemon_pod_spec();
        let node = |labels: Value, spec: Value| json!({"metadata": {"name": "n1", "labels": labels}, "spec": spec});
        let worker = json!({"role": "worker"});
        let cases = [
            ("matching node", node(worker.clone(), json!({})), RUN),
            ("other role", node(json!({"role": "infra"}), json!({})), NO),
            (
                "cordoned",
                node(worker.clone(), json!({"unschedulable": true})),
                RUN,
            ),
            (
                "not ready (tolerated)",
                node(
                    worker.clone(),
                    json!({"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}),
                ),
                RUN,
            ),
            (
                "NoSchedule taint: running pods stay",
                node(
                    worker.clone(),
                    json!({"taints": [{"key": "dedicated", "effect": "NoSchedule"}]}),
                ),
                STAY,
            ),
            (
                "NoExecute taint: pods go",
                node(
                    worker.clone(),
                    json!({"taints": [{"key": "dedicated", "effect": "NoExecute"}]}),
                ),
                NO,
            ),
        ];
        for (story, node, expected) in cases {
            assert_eq!(eligibility(&spec, &node), expected, "{story}");
        }
        let pinned =
            daemon_set(json!({"template": {"spec": {"nodeName": "n2", "containers": []}}}));
        assert_eq!(
            eligibility(&pinned.daemon_pod_spec(), &node(json!({}), json!({}))),
            NO
        );
    }

    #[test]
    fn daemon_pods_are_bound_labelled_and_owned() {
        let ds = daemon_set(json!({"template": {
            "metadata": {"labels": {"app": "agent"}, "annotations": {"note": "x"}},
            "spec": {"containers": [{"name": "a", "image": "a"}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [{"key": "role", "operator": "Exists"}]}]}}}}}}));
        let mut pod = daemon_pod(&ds, "abc");
        pin_to_node(&mut pod, "n7");
        assert_eq!(pod["metadata"]["generateName"], "agent-");
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"app": "agent", "pod-template-generation": "2", "controller-revision-hash": "abc"})
        );
        assert_eq!(pod["metadata"]["annotations"], json!({"note": "x"}));
        assert_eq!(
            pod["metadata"]["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid",
                    "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(pod["spec"]["nodeName"], "n7");
        assert_eq!(
            pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n7"]}]}]})
        );
        assert_eq!(placement::tolerations_of(&pod["spec"]).len(), 6);
    }

    fn revision(name: &str, number: i64, template: &Value, hash: &str) -> Revision {
        let mut labels = Map::new();
        labels.insert(HASH_LABEL.into(), json!(hash));
        Revision {
            name: name.into(),
            revision: number,
            labels,
            data: workload_controller::template_patch(template),
        }
    }

    #[test]
    fn history_keeps_a_revision_per_template() {
        let ds = daemon_set(json!({}));
        let other = json!({"spec": {"containers": [{"name": "a", "image": "agent:0"}]}});

        let first = plan_history(&ds, &[]);
        let hash = template_hash(&ds.template, None);
        assert_eq!(first.hash, hash);
        let created = first.create.expect("a revision to create");
        assert_eq!(created["metadata"]["name"], format!("agent-{hash}"));
        assert_eq!(
            created["metadata"]["labels"],
            json!({"app": "agent", "controller-revision-hash": hash})
        );
        assert_eq!(created["revision"], 1);
        assert_eq!(
            created["data"],
            workload_controller::template_patch(&ds.template)
        );

        let current = revision("agent-cur", 3, &ds.template, "cur");
        let older = revision("agent-old", 2, &other, "old");
        let steady = plan_history(&ds, &[current.clone(), older.clone()]);
        assert_eq!(
            (steady.hash.as_str(), steady.create, steady.renumber),
            ("cur", None, None)
        );
        assert_eq!(steady.old, vec![older.clone()]);

        // Back to a template an older revision holds: that revision becomes the newest.
        let newer = revision("agent-new", 4, &other, "new");
        let rollback = plan_history(&ds, &[current, older, newer]);
        assert_eq!(rollback.renumber, Some(("agent-cur".into(), 5)));
    }

    #[test]
    fn collisions_change_the_hash() {
        let ds = daemon_set(json!({}));
        assert_ne!(
            template_hash(&ds.template, None),
            template_hash(&ds.template, Some(1))
        );
        assert_eq!(
            template_hash(&ds.template, Some(1)),
            template_hash(&ds.template, Some(1))
        );
    }

    #[test]
    fn history_beyond_the_limit_goes_unless_pods_run_it() {
        let template = |image: &str| json!({"spec": {"containers": [{"image": image}]}});
        let old: Vec<Revision> = (1..=4)
            .map(|n| {
                revision(
                    &format!("r{n}"),
                    n,
                    &template(&n.to_string()),
                    &format!("h{n}"),
                )
            })
            .collect();
        let live: HashSet<&str> = ["h1"].into();
        assert_eq!(expired_revisions(&old, &live, 2), vec!["r2", "r3"]);
        assert_eq!(expired_revisions(&old, &live, 4), Vec::<String>::new());
    }

    // In-process tests against the embedded API server.

    fn agent(node_selector: Value) -> Value {
        json!({
            "metadata": {"name": "agent", "namespace": "default"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                             "spec": {"nodeSelector": node_selector, "containers": [{"name": "agent", "image": "agent:1"}]}},
            },
        })
    }

    /// An embedded cluster with these nodes (name, labels), the controller running (and
    /// telling how far it has settled), and `daemon_set` created.
    async fn started(
        nodes: &[(&str, Value)],
        daemon_set: Value,
    ) -> (EmbeddedCluster, Arc<Api>, Settled) {
        let cluster = testing::cluster().await;
        let api = cluster.api().clone();
        for (name, labels) in nodes {
            testing::node(&api, name, labels.clone());
        }
        let settled = Settled::default();
        tokio::spawn(run(api.clone(), settled.clone()));
        testing::create(&api, "apps", "daemonsets", "default", daemon_set);
        (cluster, api, settled)
    }

    fn set_image(api: &Api, image: &str) {
        let template = json!({"spec": {"containers": [{"name": "agent", "image": image}]}});
        let patch = json!({"spec": {"template": template}});
        testing::patch(api, "apps", "daemonsets", "default", "agent", patch);
    }

    fn daemon_pods(api: &Api) -> Vec<Value> {
        testing::list(api, "", "pods", "default")
    }

    fn ds_status(api: &Api) -> Value {
        testing::get(api, "apps", "daemonsets", "default", "agent")["status"].clone()
    }

    #[tokio::test]
    async fn daemon_set_runs_one_pod_per_matching_node_and_reports_it() {
        let nodes = [
            ("worker-1", json!({"role": "worker"})),
            ("worker-2", json!({"role": "worker"})),
            ("infra-1", json!({"role": "infra"})),
        ];
        let (_cluster, api, settled) = started(&nodes, agent(json!({"role": "worker"}))).await;

        let pods = eventually("two daemon pods", || {
            Some(daemon_pods(&api)).filter(|p| p.len() == 2)
        })
        .await;
        let mut bound: Vec<&str> = pods
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str())
            .collect();
        bound.sort();
        assert_eq!(bound, ["worker-1", "worker-2"]);
        let pod = &pods[0];
        assert!(
            pod["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("agent-") && n.len() == 11)
        );
        let hash = pod["metadata"]["labels"][HASH_LABEL]
            .as_str()
            .expect("hash label");
        assert_eq!(pod["metadata"]["labels"][GENERATION_LABEL], "1");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
            true
        );
        let revision = testing::get(
            &api,
            "apps",
            "controllerrevisions",
            "default",
            &format!("agent-{hash}"),
        );
        assert_eq!(revision["revision"], 1);
        assert_eq!(
            revision["metadata"]["ownerReferences"][0]["kind"],
            "DaemonSet"
        );

        for pod in &pods {
            testing::mark_ready(
                &api,
                "default",
                pod["metadata"]["name"].as_str().unwrap_or(""),
            );
        }
        let status = eventually("all ready", || {
            Some(ds_status(&api)).filter(|s| s["numberAvailable"] == 2)
        })
        .await;
        assert_eq!(
            status,
            json!({"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0,
                   "numberReady": 2, "updatedNumberScheduled": 2, "numberAvailable": 2, "observedGeneration": 1})
        );

        // Steady state: the controller settles without writing the DaemonSet again.
        let version = testing::get(&api, "apps", "daemonsets", "default", "agent")["metadata"]["resourceVersion"].clone();
        testing::settled(&api, &settled).await;
        let after = testing::get(&api, "apps", "daemonsets", "default", "agent");
        assert_eq!(after["metadata"]["resourceVersion"], version);
    }

    #[tokio::test]
    async fn nodes_that_stop_matching_or_go_lose_their_daemon_pod() {
        let nodes = ["worker-1", "worker-2", "worker-3"].map(|n| (n, json!({"role": "worker"})));
        let (_cluster, api, _) = started(&nodes, agent(json!({"role": "worker"}))).await;
        eventually("three daemon pods", || {
            Some(daemon_pods(&api)).filter(|p| p.len() == 3)
        })
        .await;

        testing::patch(
            &api,
            "",
            "nodes",
            "",
            "worker-1",
            json!({"metadata": {"labels": {"role": "infra"}}}),
        );
        let on = |pods: &[Value], node: &str| {
            pods.iter().find(|p| p["spec"]["nodeName"] == node).cloned()
        };
        let leaving = eventually("the pod on worker-1 terminating", || {
            on(&daemon_pods(&api), "worker-1").filter(testing::is_terminating)
        })
        .await;
        testing::finish_termination(
            &api,
            "default",
            leaving["metadata"]["name"].as_str().unwrap_or(""),
        );

        let nodes = api.registry.get("", "v1", "nodes").expect("nodes");
        api.delete(&nodes, "", "worker-2", &DeleteOptions::default())
            .expect("node deleted");
        eventually("only worker-3 keeps a pod", || {
            let pods = daemon_pods(&api);
            (pods.len() == 1 && on(&pods, "worker-3").is_some()).then_some(())
        })
        .await;
        let status = eventually("status caught up", || {
            Some(ds_status(&api))
                .filter(|s| s["desiredNumberScheduled"] == 1 && s["currentNumberScheduled"] == 1)
        })
        .await;
        assert_eq!(status["numberMisscheduled"], 0);
    }

    #[tokio::test]
    async fn rolling_update_replaces_one_pod_at_a_time() {
        let nodes = ["worker-1", "worker-2", "worker-3"].map(|n| (n, json!({})));
        let (_cluster, api, settled) = started(&nodes, agent(json!({}))).await;
        let pods = eventually("three daemon pods", || {
            Some(daemon_pods(&api)).filter(|p| p.len() == 3)
        })
        .await;
        for pod in &pods {
            testing::mark_ready(
                &api,
                "default",
                pod["metadata"]["name"].as_str().unwrap_or(""),
            );
        }
        eventually("all available", || {
            Some(ds_status(&api)).filter(|s| s["numberAvailable"] == 3)
        })
        .await;

        set_image(&api, "agent:2");
        let first = eventually("one old pod terminating", || {
            let terminating: Vec<Value> = daemon_pods(&api)
                .into_iter()
                .filter(testing::is_terminating)
                .collect();
            (!terminating.is_empty()).then_some(terminating)
        })
        .await;
        // Settled, with nothing finishing the termination: no second pod goes.
        testing::settled(&api, &settled).await;
        let terminating = daemon_pods(&api)
            .into_iter()
            .filter(testing::is_terminating)
            .count();
        assert_eq!((first.len(), terminating), (1, 1), "maxUnavailable 1");

        // From here on a kubelet stand-in finishes terminations and starts new pods.
        testing::spawn_kubelet(api.clone());
        testing::finish_termination(
            &api,
            "default",
            first[0]["metadata"]["name"].as_str().unwrap_or(""),
        );
        let status = eventually("all pods updated and available", || {
            Some(ds_status(&api))
                .filter(|s| s["updatedNumberScheduled"] == 3 && s["numberAvailable"] == 3)
        })
        .await;
        assert_eq!(status["observedGeneration"], 2);
        let pods = daemon_pods(&api);
        assert_eq!(pods.len(), 3);
        assert!(
            pods.iter()
                .all(|p| p["spec"]["containers"][0]["image"] == "agent:2")
        );
        let revisions = testing::list(&api, "apps", "controllerrevisions", "default");
        assert_eq!(revisions.len(), 2);
    }

    #[tokio::test]
    async fn on_delete_replaces_only_deleted_pods_and_failed_pods_are_replaced() {
        let mut daemon_set = agent(json!({}));
        daemon_set["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        let nodes = ["worker-1", "worker-2"].map(|n| (n, json!({})));
        let (_cluster, api, settled) = started(&nodes, daemon_set).await;
        testing::spawn_kubelet(api.clone());
        eventually("two available", || {
            Some(ds_status(&api)).filter(|s| s["numberAvailable"] == 2)
        })
        .await;

        set_image(&api, "agent:2");
        eventually("observed", || {
            Some(ds_status(&api)).filter(|s| s["observedGeneration"] == 2)
        })
        .await;
        // Settled on the new template: OnDelete leaves the running pods alone.
        testing::settled(&api, &settled).await;
        let pods = daemon_pods(&api);
        assert_eq!(pods.len(), 2);
        assert!(pods.iter().all(
            |p| p["spec"]["containers"][0]["image"] == "agent:1" && !testing::is_terminating(p)
        ));

        let victim = pods
            .iter()
            .find(|p| p["spec"]["nodeName"] == "worker-1")
            .expect("pod on worker-1");
        testing::mark_failed(
            &api,
            "default",
            victim["metadata"]["name"].as_str().unwrap_or(""),
        );
        let replaced = eventually("a new pod on worker-1", || {
            daemon_pods(&api).into_iter().find(|p| {
                p["spec"]["nodeName"] == "worker-1"
                    && p["metadata"]["name"] != victim["metadata"]["name"]
            })
        })
        .await;
        assert_eq!(replaced["spec"]["containers"][0]["image"], "agent:2");
        let status = eventually("one updated", || {
            Some(ds_status(&api))
                .filter(|s| s["updatedNumberScheduled"] == 1 && s["numberAvailable"] == 2)
        })
        .await;
        assert_eq!(status["desiredNumberScheduled"], 2);
    }
}
