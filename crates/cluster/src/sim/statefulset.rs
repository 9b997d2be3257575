//! The StatefulSet controller of the simulated kube-controller-manager, after upstream
//! `pkg/controller/statefulset`: pods `<set>-<ordinal>` with a stable identity (hostname,
//! subdomain, `pod-name` and `pod-index` labels), created in ordinal order and removed
//! from the highest ordinal (`OrderedReady`) or all at once (`Parallel`); rolling updates
//! from the highest ordinal down to `partition`, `maxUnavailable` at a time (upstream
//! feature MaxUnavailableStatefulSet, beta and on by default); `OnDelete`; a
//! ControllerRevision per template, whose name pods carry in `controller-revision-hash`.
//!
//! Deviations from upstream: `volumeClaimTemplates` are ignored (the embedded cluster
//! has no PersistentVolumeClaims); orphan pods are not adopted; pods being deleted count
//! as not ready; a set being deleted is left to the garbage collector without a last
//! status update.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::{Value, json};

use super::workload_controller::{
    self, Applied, Cache, Controller, Dependents, Key, OwnedPod, Owner, Revision, Settled,
    StatusWrite, StatusWriter, WorkQueue,
};
use crate::api::{Api, DeleteOptions, PatchType};
use crate::errors::ApiError;
use crate::pointer::Pointer;
use crate::resources::Resource;
use crate::store::{Change, EventType};

const MANAGER: &str = "statefulset-controller";
const KIND: &str = "StatefulSet";
/// Pod label naming the ControllerRevision the pod runs (upstream `StatefulSetRevisionLabel`).
const REVISION_LABEL: &str = "controller-revision-hash";
/// ControllerRevision label holding its hash (upstream `ControllerRevisionHashLabel`).
const HASH_LABEL: &str = "controller.kubernetes.io/hash";
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// The least time between two status writes of one StatefulSet.
const STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// How many hash collisions a new revision's name may run into before giving up for now.
const COLLISION_ATTEMPTS: i64 = 10;

/// Runs the StatefulSet controller until the store's change stream closes, telling
/// `settled` how far it has settled.
pub async fn run(api: Arc<Api>, settled: Settled) {
    let changes = api.store.follow();
    let Some(mut controller) = StatefulSetController::new(api) else {
        tracing::warn!(
            "the StatefulSet controller needs pods, statefulsets and controllerrevisions"
        );
        return;
    };
    workload_controller::drive(changes, &mut controller, &settled).await;
}

/// How a StatefulSet replaces pods whose revision is out of date.
#[derive(Clone, Debug, PartialEq)]
enum UpdateStrategy {
    /// Only when the pod is deleted.
    OnDelete,
    /// From the highest ordinal down to the `partition`-th replica, at most
    /// `max_unavailable` (an IntOrString, 1 when absent) unavailable at once.
    RollingUpdate {
        partition: i64,
        max_unavailable: Value,
    },
}

/// The parts of a StatefulSet the controller acts on.
#[derive(Clone, Debug)]
struct StatefulSet {
    owner: Owner,
    replicas: i64,
    /// `spec.ordinals.start`: the first ordinal.
    start: i64,
    /// `podManagementPolicy: Parallel`; otherwise OrderedReady.
    parallel: bool,
    service_name: String,
    template: Value,
    min_ready_seconds: i64,
    strategy: UpdateStrategy,
    revision_history_limit: usize,
    status: StatefulSetStatus,
}

impl StatefulSet {
    fn from_object(object: &Value) -> Self {
        let spec = &object["spec"];
        let strategy = match spec.at("/updateStrategy/type").and_then(Value::as_str) {
            Some("OnDelete") => UpdateStrategy::OnDelete,
            _ => UpdateStrategy::RollingUpdate {
                partition: spec
                    .at("/updateStrategy/rollingUpdate/partition")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                max_unavailable: spec
                    .at("/updateStrategy/rollingUpdate/maxUnavailable")
                    .cloned()
                    .unwrap_or(json!(1)),
            },
        };
        StatefulSet {
            owner: Owner::from_object(KIND, object),
            replicas: spec["replicas"].as_i64().unwrap_or(1).max(0),
            start: spec
                .at("/ordinals/start")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                .max(0),
            parallel: spec["podManagementPolicy"] == "Parallel",
            service_name: spec["serviceName"].as_str().unwrap_or("").to_string(),
            template: spec.get("template").cloned().unwrap_or(json!({})),
            min_ready_seconds: spec["minReadySeconds"].as_i64().unwrap_or(0),
            strategy,
            revision_history_limit: spec["revisionHistoryLimit"]
                .as_u64()
                .and_then(|l| usize::try_from(l).ok())
                .unwrap_or(10),
            status: StatefulSetStatus::from_object(object),
        }
    }

    /// The ordinal of one of this set's pods, from its name `<set>-<ordinal>`.
    fn ordinal_of(&self, pod_name: &str) -> Option<i64> {
        let digits = pod_name
            .strip_prefix(self.owner.name.as_str())?
            .strip_prefix('-')?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    fn pod_name(&self, ordinal: i64) -> String {
        format!("{}-{ordinal}", self.owner.name)
    }

    /// Replicas below this index keep the current revision (upstream compares the
    /// partition with the replica's index, its ordinal less `ordinals.start`).
    fn partition(&self) -> i64 {
        match &self.strategy {
            UpdateStrategy::RollingUpdate { partition, .. } => *partition,
            UpdateStrategy::OnDelete => 0,
        }
    }
}

/// `status` of a StatefulSet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct StatefulSetStatus {
    observed_generation: i64,
    replicas: i64,
    ready_replicas: i64,
    current_replicas: i64,
    updated_replicas: i64,
    available_replicas: i64,
    current_revision: String,
    update_revision: String,
    collision_count: i64,
}

impl StatefulSetStatus {
    fn from_object(object: &Value) -> Self {
        let status = &object["status"];
        let number = |field: &str| status[field].as_i64().unwrap_or(0);
        let text = |field: &str| status[field].as_str().unwrap_or("").to_string();
        StatefulSetStatus {
            observed_generation: number("observedGeneration"),
            replicas: number("replicas"),
            ready_replicas: number("readyReplicas"),
            current_replicas: number("currentReplicas"),
            updated_replicas: number("updatedReplicas"),
            available_replicas: number("availableReplicas"),
            current_revision: text("currentRevision"),
            update_revision: text("updateRevision"),
            collision_count: number("collisionCount"),
        }
    }

    /// A merge patch of the status subresource; fields upstream omits when empty are
    /// removed (null) rather than written empty.
    fn patch(&self) -> Value {
        let omit_zero = |n: i64| if n == 0 { Value::Null } else { json!(n) };
        let omit_empty = |s: &str| if s.is_empty() { Value::Null } else { json!(s) };
        json!({"status": {
            "observedGeneration": omit_zero(self.observed_generation),
            "replicas": self.replicas,
            "readyReplicas": omit_zero(self.ready_replicas),
            "currentReplicas": omit_zero(self.current_replicas),
            "updatedReplicas": omit_zero(self.updated_replicas),
            "availableReplicas": self.available_replicas,
            "currentRevision": omit_empty(&self.current_revision),
            "updateRevision": omit_empty(&self.update_revision),
            "collisionCount": self.collision_count,
        }})
    }
}

/// Which revision a new pod is created at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Current,
    Update,
}

/// One step towards the StatefulSet's desired state.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Create {
        ordinal: i64,
        at: At,
    },
    Delete {
        pod: String,
    },
    /// Restore the identity labels of a pod (upstream `UpdateStatefulPod`).
    Relabel {
        pod: String,
        ordinal: i64,
    },
}

/// A replica slot: its pod, or the revision a pod would be created at.
enum Slot<'a> {
    Pod(&'a OwnedPod),
    Missing(At),
}

fn running_and_ready(pod: &OwnedPod) -> bool {
    pod.is_running() && pod.is_ready()
}

fn running_and_available(pod: &OwnedPod, min_ready_seconds: i64, now: Timestamp) -> bool {
    pod.is_running() && pod.is_available(min_ready_seconds, now)
}

/// The pods to create, delete and relabel for one StatefulSet (upstream
/// `updateStatefulSet`): replicas first, in ordinal order, then the condemned (ordinals
/// outside the range) from the highest down, then the rolling update. `OrderedReady`
/// stops at the first step it must wait for; `Parallel` does everything it can.
fn decide(
    set: &StatefulSet,
    update_revision: &str,
    pods: &[&OwnedPod],
    now: Timestamp,
) -> Vec<Action> {
    let end = set.start + set.replicas;
    let mut replicas: Vec<Slot> = (0..set.replicas)
        .map(|index| {
            let rolling = matches!(set.strategy, UpdateStrategy::RollingUpdate { .. });
            Slot::Missing(if rolling && index < set.partition() {
                At::Current
            } else {
                At::Update
            })
        })
        .collect();
    let mut condemned: Vec<(i64, &OwnedPod)> = Vec::new();
    for pod in pods {
        match set.ordinal_of(&pod.name) {
            Some(ordinal) if (set.start..end).contains(&ordinal) => {
                if let Some(slot) = usize::try_from(ordinal - set.start)
                    .ok()
                    .and_then(|i| replicas.get_mut(i))
                {
                    *slot = Slot::Pod(pod);
                }
            }
            Some(ordinal) => condemned.push((ordinal, pod)),
            None => {}
        }
    }
    condemned.sort_by_key(|(ordinal, _)| std::cmp::Reverse(*ordinal));
    let monotonic = !set.parallel;
    let available = |pod: &OwnedPod| running_and_available(pod, set.min_ready_seconds, now);
    let mut actions = Vec::new();
    for (index, slot) in replicas.iter().enumerate() {
        let ordinal = set.start + i64::try_from(index).unwrap_or(0);
        match slot {
            Slot::Missing(at) => {
                actions.push(Action::Create { ordinal, at: *at });
                if monotonic {
                    return actions;
                }
            }
            Slot::Pod(pod) if pod.is_terminal() => {
                // Replaced once the failed (or completed) pod is gone.
                if !pod.deleting {
                    actions.push(Action::Delete {
                        pod: pod.name.clone(),
                    });
                }
                if monotonic {
                    return actions;
                }
            }
            Slot::Pod(pod) => {
                if monotonic && (pod.deleting || !available(pod)) {
                    return actions;
                }
                if pod.label(POD_NAME_LABEL) != pod.name {
                    actions.push(Action::Relabel {
                        pod: pod.name.clone(),
                        ordinal,
                    });
                }
            }
        }
    }
    // OrderedReady gets here only with every replica healthy; then the lowest unhealthy
    // condemned pod may go out of turn.
    let first_unhealthy = condemned
        .iter()
        .rev()
        .find(|(_, p)| !running_and_ready(p))
        .map(|(_, p)| p.name.as_str());
    for (_, pod) in &condemned {
        if pod.deleting {
            if monotonic {
                return actions;
            }
            continue;
        }
        if monotonic && !available(pod) && first_unhealthy != Some(pod.name.as_str()) {
            return actions;
        }
        actions.push(Action::Delete {
            pod: pod.name.clone(),
        });
        if monotonic {
            return actions;
        }
    }
    if let UpdateStrategy::RollingUpdate {
        partition,
        max_unavailable,
    } = &set.strategy
    {
        let update = rolling_update(
            set,
            update_revision,
            &replicas,
            *partition,
            max_unavailable,
            now,
        );
        for action in update {
            if !actions.contains(&action) {
                actions.push(action);
            }
        }
    }
    actions
}

/// Replicas of an old revision to delete, from the highest index down to `partition`,
/// keeping at most `maxUnavailable` unavailable (upstream
/// `updateStatefulSetAfterInvariantEstablished`). `Parallel` first replaces old replicas
/// that are unavailable anyway, then spends what is left of the budget.
fn rolling_update(
    set: &StatefulSet,
    update_revision: &str,
    replicas: &[Slot],
    partition: i64,
    max_unavailable: &Value,
    now: Timestamp,
) -> Vec<Action> {
    let max_unavailable = workload_controller::scaled(max_unavailable, set.replicas, false)
        .unwrap_or(1)
        .max(1);
    let available = |pod: &OwnedPod| running_and_available(pod, set.min_ready_seconds, now);
    let unavailable = |slot: &Slot| match slot {
        Slot::Pod(pod) => pod.deleting || !available(pod),
        Slot::Missing(_) => true,
    };
    let old = |pod: &OwnedPod| pod.label(REVISION_LABEL) != update_revision && !pod.deleting;
    let unavailable_pods = replicas.iter().filter(|s| unavailable(s)).count();
    let unavailable_pods = i64::try_from(unavailable_pods).unwrap_or(i64::MAX);
    let unavailable_needing_update = replicas
        .iter()
        .filter(|s| set.parallel && unavailable(s))
        .filter(|s| matches!(s, Slot::Pod(pod) if old(pod)))
        .count();
    if unavailable_pods >= max_unavailable && unavailable_needing_update == 0 {
        return Vec::new();
    }
    let first = usize::try_from(partition.max(0)).unwrap_or(usize::MAX);
    let targets = || {
        replicas
            .iter()
            .enumerate()
            .rev()
            .take_while(move |(index, _)| *index >= first)
            .filter_map(|(_, slot)| match slot {
                Slot::Pod(pod) if old(pod) => Some(*pod),
                _ => None,
            })
    };
    let delete = |pod: &OwnedPod| Action::Delete {
        pod: pod.name.clone(),
    };
    let budget = usize::try_from((max_unavailable - unavailable_pods).max(0)).unwrap_or(0);
    if set.parallel {
        let broken = targets().filter(|p| !available(p)).map(delete);
        let healthy = targets().filter(|p| available(p)).take(budget).map(delete);
        broken.chain(healthy).collect()
    } else {
        targets().take(budget).map(delete).collect()
    }
}

/// The StatefulSet's status from its pods (upstream `updateStatus`, then
/// `completeRollingUpdate`: once every replica runs the update revision and is ready, it
/// becomes the current one).
fn status(
    set: &StatefulSet,
    current_revision: &str,
    update_revision: &str,
    collision_count: i64,
    pods: &[&OwnedPod],
    now: Timestamp,
) -> StatefulSetStatus {
    let mut status = StatefulSetStatus {
        observed_generation: set.owner.generation,
        current_revision: current_revision.to_string(),
        update_revision: update_revision.to_string(),
        collision_count,
        ..StatefulSetStatus::default()
    };
    for pod in pods.iter().filter(|p| set.ordinal_of(&p.name).is_some()) {
        if pod.phase.is_empty() {
            continue;
        }
        status.replicas += 1;
        if running_and_ready(pod) {
            status.ready_replicas += 1;
            if running_and_available(pod, set.min_ready_seconds, now) {
                status.available_replicas += 1;
            }
        }
        if !pod.deleting {
            let revision = pod.label(REVISION_LABEL);
            status.current_replicas += i64::from(revision == current_revision);
            status.updated_replicas += i64::from(revision == update_revision);
        }
    }
    let rolling = matches!(set.strategy, UpdateStrategy::RollingUpdate { .. });
    if rolling
        && status.updated_replicas == status.replicas
        && status.ready_replicas == status.replicas
    {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
    status
}

/// The hash of a revision as upstream `HashControllerRevision`: FNV-1 of its data and
/// the collision count in decimal, safe-encoded.
fn revision_hash(data: &Value, collision_count: i64) -> String {
    let data = workload_controller::canonical_json(data);
    let count = collision_count.to_string();
    workload_controller::safe_encode(workload_controller::fnv1_32(&[&data, count.as_bytes()]))
}

fn controller_revision(
    set: &StatefulSet,
    data: Value,
    revision: i64,
    collision_count: i64,
) -> Value {
    let hash = revision_hash(&data, collision_count);
    let labels = workload_controller::template_labels(&set.template, &[(HASH_LABEL, &hash)]);
    let name = format!("{}-{hash}", set.owner.name);
    set.owner.controller_revision(&name, labels, data, revision)
}

/// What to do about a StatefulSet's ControllerRevisions (upstream
/// `getStatefulSetRevisions`).
#[derive(Debug, PartialEq)]
enum RevisionStep {
    /// The update revision exists and is the newest.
    Ready(Revision),
    /// The update revision exists but is older than others: renumber it as the newest
    /// (a rollback).
    Renumber(Revision, i64),
    /// No revision holds the current template: create this one.
    Create(Value),
}

fn plan_revision(set: &StatefulSet, revisions: &[Revision], collision_count: i64) -> RevisionStep {
    let mut sorted: Vec<&Revision> = revisions.iter().collect();
    sorted.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| a.name.cmp(&b.name))
    });
    let data = workload_controller::template_patch(&set.template);
    let next = sorted.last().map_or(0, |r| r.revision) + 1;
    let newest_equal = sorted.iter().rev().find(|r| r.data == data);
    match (newest_equal, sorted.last()) {
        (Some(equal), Some(newest)) if equal.name == newest.name => {
            RevisionStep::Ready((*equal).clone())
        }
        (Some(equal), _) => RevisionStep::Renumber((*equal).clone(), next),
        (None, _) => RevisionStep::Create(controller_revision(set, data, next, collision_count)),
    }
}

/// Revisions beyond `revisionHistoryLimit` that neither the current nor the update
/// revision is and no pod runs, oldest first (upstream `truncateHistory`).
fn expired_revisions(revisions: &[Revision], live: &HashSet<&str>, limit: usize) -> Vec<String> {
    let mut history: Vec<&Revision> = revisions
        .iter()
        .filter(|r| !live.contains(r.name.as_str()))
        .collect();
    history.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| a.name.cmp(&b.name))
    });
    let excess = history.len().saturating_sub(limit);
    history
        .into_iter()
        .take(excess)
        .map(|r| r.name.clone())
        .collect()
}

/// The pod of one ordinal at one revision (upstream `newStatefulSetPod`).
fn stateful_pod(set: &StatefulSet, template: &Value, revision: &str, ordinal: i64) -> Value {
    let name = set.pod_name(ordinal);
    let index = ordinal.to_string();
    let labels = workload_controller::template_labels(
        template,
        &[
            (REVISION_LABEL, revision),
            (POD_NAME_LABEL, &name),
            (POD_INDEX_LABEL, &index),
        ],
    );
    let mut pod = set.owner.pod_from_template(template, labels);
    pod["metadata"]["name"] = json!(name);
    pod["spec"]["hostname"] = json!(name);
    if !set.service_name.is_empty() {
        pod["spec"]["subdomain"] = json!(set.service_name);
    }
    pod
}

/// The current and update revisions of a set, as synced with the API.
struct Revisions {
    current: Revision,
    update: Revision,
    collision_count: i64,
    all: Vec<Revision>,
}

struct StatefulSetController {
    api: Arc<Api>,
    pod_resource: Arc<Resource>,
    revision_resource: Arc<Resource>,
    sets: Cache<Value>,
    dependents: Dependents,
    queue: WorkQueue,
    status_writer: StatusWriter,
}

impl StatefulSetController {
    fn new(api: Arc<Api>) -> Option<Self> {
        Some(StatefulSetController {
            pod_resource: api.registry.get("", "v1", "pods")?,
            revision_resource: api.registry.get("apps", "v1", "controllerrevisions")?,
            status_writer: StatusWriter::new(
                api.registry.get("apps", "v1", "statefulsets")?,
                MANAGER,
                STATUS_INTERVAL,
            ),
            api,
            sets: Cache::default(),
            dependents: Dependents::new(KIND),
            queue: WorkQueue::default(),
        })
    }

    /// Logs an unexpected failure and retries the set in a moment.
    fn failed(&mut self, set: &StatefulSet, what: &str, err: &ApiError) {
        if !workload_controller::is_race(err) {
            tracing::warn!(%err, namespace = %set.owner.namespace, statefulset = %set.owner.name, "{what}");
        }
        self.queue
            .add_after(set.owner.key(), workload_controller::retry_after(err));
    }

    fn owned_revisions(&self, set: &StatefulSet) -> Vec<Revision> {
        self.dependents
            .revisions
            .owned_by(&set.owner.uid)
            .into_iter()
            .cloned()
            .collect()
    }

    /// Makes sure the set's template has the newest ControllerRevision; `None` to retry.
    fn sync_revisions(&mut self, set: &StatefulSet) -> Option<Revisions> {
        let options = workload_controller::write_options(MANAGER);
        let mut collision_count = set.status.collision_count;
        let update = loop {
            let revisions = self.owned_revisions(set);
            match plan_revision(set, &revisions, collision_count) {
                RevisionStep::Ready(revision) => break revision,
                RevisionStep::Renumber(revision, number) => {
                    let result = self.api.patch(
                        &self.revision_resource,
                        &set.owner.namespace,
                        &revision.name,
                        None,
                        PatchType::Merge,
                        json!({"revision": number}),
                        &options,
                    );
                    match result {
                        Ok(updated) => {
                            self.dependents.revisions.record(&updated);
                            break Revision::from_object(&updated);
                        }
                        Err(err) => {
                            self.failed(set, "renumbering a ControllerRevision", &err);
                            return None;
                        }
                    }
                }
                RevisionStep::Create(body) => {
                    match self.api.create(
                        &self.revision_resource,
                        &set.owner.namespace,
                        body.clone(),
                        &options,
                    ) {
                        Ok(created) => {
                            self.dependents.revisions.record(&created);
                            break Revision::from_object(&created);
                        }
                        Err(err) if err.code == 409 => {
                            if let Some(existing) = self.existing_equal(set, &body) {
                                break existing;
                            }
                            // A different revision holds the name: count the collision into the hash.
                            collision_count += 1;
                            if collision_count - set.status.collision_count > COLLISION_ATTEMPTS {
                                self.failed(set, "naming a ControllerRevision", &err);
                                return None;
                            }
                        }
                        Err(err) => {
                            self.failed(set, "creating a ControllerRevision", &err);
                            return None;
                        }
                    }
                }
            }
        };
        let all = self.owned_revisions(set);
        let current = all
            .iter()
            .find(|r| r.name == set.status.current_revision)
            .cloned()
            .unwrap_or_else(|| update.clone());
        Some(Revisions {
            current,
            update,
            collision_count,
            all,
        })
    }

    /// The revision named as `body` when it is this set's and holds the same template.
    fn existing_equal(&mut self, set: &StatefulSet, body: &Value) -> Option<Revision> {
        let name = body["metadata"]["name"].as_str().unwrap_or("");
        let existing = self
            .api
            .get_value(&self.revision_resource, &set.owner.namespace, name)
            .ok()?;
        let ours = workload_controller::controller_of(&existing["metadata"], KIND)
            .is_some_and(|o| o.uid == set.owner.uid);
        if !ours || existing["data"] != body["data"] {
            return None;
        }
        self.dependents.revisions.record(&existing);
        Some(Revision::from_object(&existing))
    }

    fn apply(&mut self, set: &StatefulSet, revisions: &Revisions, actions: Vec<Action>) {
        let options = workload_controller::write_options(MANAGER);
        let template_of = |revision: &Revision| {
            workload_controller::template_of_patch(&revision.data)
                .unwrap_or_else(|| set.template.clone())
        };
        for action in actions {
            match action {
                Action::Create { ordinal, at } => {
                    let revision = match at {
                        At::Current => &revisions.current,
                        At::Update => &revisions.update,
                    };
                    let pod = stateful_pod(set, &template_of(revision), &revision.name, ordinal);
                    match self
                        .api
                        .create(&self.pod_resource, &set.owner.namespace, pod, &options)
                    {
                        Ok(created) => self.dependents.pods.record(&created),
                        Err(err) => self.failed(set, "creating a pod", &err),
                    }
                }
                Action::Delete { pod } => {
                    let key = (set.owner.namespace.clone(), pod);
                    let deleted = workload_controller::delete_pod(
                        &self.api,
                        &self.pod_resource,
                        &mut self.dependents.pods,
                        &key,
                        &DeleteOptions::default(),
                    );
                    if let Err(err) = deleted {
                        self.failed(set, "deleting a pod", &err);
                    }
                }
                Action::Relabel { pod, ordinal } => {
                    let labels = json!({"metadata": {"labels": {
                        POD_NAME_LABEL: pod, POD_INDEX_LABEL: ordinal.to_string()}}});
                    let result = self.api.patch(
                        &self.pod_resource,
                        &set.owner.namespace,
                        &pod,
                        None,
                        PatchType::Merge,
                        labels,
                        &options,
                    );
                    match result {
                        Ok(updated) => self.dependents.pods.record(&updated),
                        Err(err) => self.failed(set, "restoring a pod's identity", &err),
                    }
                }
            }
        }
    }

    /// Writes the status when it differs from the stored one, at most every
    /// [`STATUS_INTERVAL`].
    fn write_status(&mut self, set: &StatefulSet, revisions: &Revisions, now: Timestamp) {
        let key = set.owner.key();
        let computed = status(
            set,
            &revisions.current.name,
            &revisions.update.name,
            revisions.collision_count,
            &self.dependents.pods.owned_by(&set.owner.uid),
            now,
        );
        if set.min_ready_seconds > 0 && computed.ready_replicas != computed.available_replicas {
            let seconds = u64::try_from(set.min_ready_seconds).unwrap_or(0);
            self.queue
                .add_after(key.clone(), Duration::from_secs(seconds));
        }
        if computed == set.status {
            return;
        }
        match self
            .status_writer
            .write(&self.api, &set.owner, computed.patch())
        {
            StatusWrite::Written(updated) => self.sets.record(&updated, updated.clone()),
            StatusWrite::Wait(wait) => self.queue.add_after(key, wait),
            StatusWrite::Failed(err) => self.failed(set, "writing StatefulSet status", &err),
        }
    }

    fn truncate_history(&mut self, set: &StatefulSet, revisions: &Revisions) {
        let expired = {
            let pods = self.dependents.pods.owned_by(&set.owner.uid);
            let live: HashSet<&str> = pods
                .iter()
                .map(|p| p.label(REVISION_LABEL))
                .chain([
                    revisions.current.name.as_str(),
                    revisions.update.name.as_str(),
                ])
                .collect();
            expired_revisions(&revisions.all, &live, set.revision_history_limit)
        };
        for name in expired {
            let result = self.api.delete(
                &self.revision_resource,
                &set.owner.namespace,
                &name,
                &DeleteOptions::default(),
            );
            match result {
                Ok(_) => self
                    .dependents
                    .revisions
                    .record_removed(&(set.owner.namespace.clone(), name)),
                Err(err) => self.failed(set, "deleting a ControllerRevision", &err),
            }
        }
    }
}

impl Controller for StatefulSetController {
    fn resync(&mut self) {
        self.sets.clear();
        let store = self.api.store.clone();
        for object in store.list("statefulsets", None, None, None, None).items {
            let value = object.value();
            self.sets.record(&value, value.clone());
        }
        self.dependents.resync(&self.api);
        let keys: Vec<Key> = self.sets.iter().map(|(k, _)| k.clone()).collect();
        for key in keys {
            self.queue.add(key);
        }
    }

    fn observe(&mut self, change: &Change) {
        match change.key.storage.as_str() {
            "statefulsets" => {
                let key = (change.key.namespace.clone(), change.key.name.clone());
                if let Applied::Replaced(_) = self.sets.observe(change, |object| object.value()) {
                    if change.event == EventType::Deleted {
                        self.status_writer.forget(&key);
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
        let Some(cached) = self.sets.get(key) else {
            return;
        };
        let set = StatefulSet::from_object(&cached.item);
        // A set being deleted is left to the garbage collector.
        if set.owner.deleting {
            return;
        }
        let Some(revisions) = self.sync_revisions(&set) else {
            return;
        };
        let now = self.api.clock.now();
        let actions = decide(
            &set,
            &revisions.update.name,
            &self.dependents.pods.owned_by(&set.owner.uid),
            now,
        );
        self.apply(&set, &revisions, actions);
        self.write_status(&set, &revisions, now);
        self.truncate_history(&set, &revisions);
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

    fn stateful_set(spec: Value) -> StatefulSet {
        let mut spec = spec;
        if spec.get("template").is_none() {
            spec["template"] = json!({"metadata": {"labels": {"app": "web"}},
                                      "spec": {"containers": [{"name": "web", "image": "web:1"}]}});
        }
        if spec.get("replicas").is_none() {
            spec["replicas"] = json!(3);
        }
        StatefulSet::from_object(&json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "sts-uid", "generation": 4},
            "spec": spec,
        }))
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    /// Pod `web-<ordinal>` of `revision`, running and ready since the epoch of the tests.
    fn pod(ordinal: i64, revision: &str) -> OwnedPod {
        let name = format!("web-{ordinal}");
        let mut labels = Map::new();
        labels.insert(REVISION_LABEL.into(), json!(revision));
        labels.insert(POD_NAME_LABEL.into(), json!(name));
        OwnedPod {
            name,
            node: "worker-1".into(),
            labels,
            phase: "Running".into(),
            ready: true,
            ready_since: Some(at(0)),
            deleting: false,
            created: Some(at(0)),
        }
    }

    fn starting(pod: OwnedPod) -> OwnedPod {
        OwnedPod {
            phase: "Pending".into(),
            ready: false,
            ready_since: None,
            ..pod
        }
    }

    fn deleting(pod: OwnedPod) -> OwnedPod {
        OwnedPod {
            deleting: true,
            ..pod
        }
    }

    fn failed(pod: OwnedPod) -> OwnedPod {
        OwnedPod {
            phase: "Failed".into(),
            ready: false,
            ..pod
        }
    }

    fn create(ordinal: i64) -> Action {
        Action::Create {
            ordinal,
            at: At::Update,
        }
    }

    fn delete(ordinal: i64) -> Action {
        Action::Delete {
            pod: format!("web-{ordinal}"),
        }
    }

    fn run_decide(set: &StatefulSet, pods: &[OwnedPod]) -> Vec<Action> {
        let refs: Vec<&OwnedPod> = pods.iter().collect();
        decide(set, "new", &refs, at(100))
    }

    #[test]
    fn ordered_ready_creates_and_removes_one_pod_at_a_time() {
        let set = stateful_set(json!({}));
        let cases: Vec<(&str, Vec<OwnedPod>, Vec<Action>)> = vec![
            ("the first pod first", vec![], vec![create(0)]),
            (
                "the next once the previous is ready",
                vec![pod(0, "new")],
                vec![create(1)],
            ),
            (
                "nothing while a pod starts",
                vec![pod(0, "new"), starting(pod(1, "new"))],
                vec![],
            ),
            (
                "a gap is filled first",
                vec![pod(0, "new"), pod(2, "new")],
                vec![create(1)],
            ),
            (
                "all there",
                vec![pod(0, "new"), pod(1, "new"), pod(2, "new")],
                vec![],
            ),
            (
                "scale down from the highest ordinal",
                vec![
                    pod(0, "new"),
                    pod(1, "new"),
                    pod(2, "new"),
                    pod(3, "new"),
                    pod(4, "new"),
                ],
                vec![delete(4)],
            ),
            (
                "one at a time",
                vec![
                    pod(0, "new"),
                    pod(1, "new"),
                    pod(2, "new"),
                    pod(3, "new"),
                    deleting(pod(4, "new")),
                ],
                vec![],
            ),
            (
                "a healthy pod goes before a lower unhealthy one",
                vec![
                    pod(0, "new"),
                    pod(1, "new"),
                    pod(2, "new"),
                    starting(pod(3, "new")),
                    pod(4, "new"),
                ],
                vec![delete(4)],
            ),
            (
                "an unhealthy pod waits for the lowest unhealthy one",
                vec![
                    pod(0, "new"),
                    pod(1, "new"),
                    pod(2, "new"),
                    starting(pod(3, "new")),
                    starting(pod(4, "new")),
                ],
                vec![],
            ),
            (
                "a failed pod is deleted to be recreated",
                vec![pod(0, "new"), failed(pod(1, "new")), pod(2, "new")],
                vec![delete(1)],
            ),
            (
                "no new pod while its predecessor terminates",
                vec![pod(0, "new"), deleting(pod(1, "new"))],
                vec![],
            ),
        ];
        for (story, pods, expected) in cases {
            assert_eq!(run_decide(&set, &pods), expected, "{story}");
        }
        let lowest = vec![
            pod(0, "new"),
            pod(1, "new"),
            pod(2, "new"),
            starting(pod(3, "new")),
        ];
        assert_eq!(
            run_decide(&set, &lowest),
            vec![delete(3)],
            "the first unhealthy pod may go"
        );
    }

    #[test]
    fn parallel_creates_and_removes_all_at_once() {
        let set = stateful_set(json!({"podManagementPolicy": "Parallel"}));
        let cases: Vec<(&str, Vec<OwnedPod>, Vec<Action>)> = vec![
            ("all at once", vec![], vec![create(0), create(1), create(2)]),
            (
                "regardless of readiness",
                vec![starting(pod(0, "new"))],
                vec![create(1), create(2)],
            ),
            (
                "scale down all at once",
                vec![
                    pod(0, "new"),
                    pod(1, "new"),
                    pod(2, "new"),
                    starting(pod(3, "new")),
                    pod(4, "new"),
                ],
                vec![delete(4), delete(3)],
            ),
        ];
        for (story, pods, expected) in cases {
            assert_eq!(run_decide(&set, &pods), expected, "{story}");
        }
    }

    #[test]
    fn ordinals_start_where_asked() {
        let set = stateful_set(
            json!({"replicas": 2, "ordinals": {"start": 5}, "podManagementPolicy": "Parallel"}),
        );
        assert_eq!(
            run_decide(&set, &[pod(0, "new")]),
            vec![create(5), create(6), delete(0)]
        );
        assert_eq!(set.ordinal_of("web-12"), Some(12));
        for name in ["web-", "web-x", "web-1a", "webs-1", "other-1"] {
            assert_eq!(set.ordinal_of(name), None, "{name}");
        }
    }

    #[test]
    fn rolling_update_goes_from_the_highest_ordinal_down() {
        let four = |spec: Value| {
            let mut spec = spec;
            spec["replicas"] = json!(4);
            stateful_set(spec)
        };
        let old = |ordinal| pod(ordinal, "old");
        let cases: Vec<(&str, StatefulSet, Vec<OwnedPod>, Vec<Action>)> = vec![
            (
                "highest first",
                four(json!({})),
                vec![old(0), old(1), old(2), old(3)],
                vec![delete(3)],
            ),
            (
                "then the next once the updated pod is ready",
                four(json!({})),
                vec![old(0), old(1), old(2), pod(3, "new")],
                vec![delete(2)],
            ),
            (
                "waiting for the updated pod",
                four(json!({})),
                vec![old(0), old(1), old(2), starting(pod(3, "new"))],
                vec![],
            ),
            (
                "the partition holds lower ordinals back",
                four(
                    json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}}),
                ),
                vec![old(0), old(1), pod(2, "new"), pod(3, "new")],
                vec![],
            ),
            (
                "maxUnavailable pods at once",
                four(
                    json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}}),
                ),
                vec![old(0), old(1), old(2), old(3)],
                vec![delete(3), delete(2)],
            ),
            (
                "a percentage rounds down, at least one",
                four(
                    json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "20%"}}}),
                ),
                vec![old(0), old(1), old(2), old(3)],
                vec![delete(3)],
            ),
            (
                "OnDelete leaves old pods",
                four(json!({"updateStrategy": {"type": "OnDelete"}})),
                vec![old(0), old(1), old(2), old(3)],
                vec![],
            ),
            (
                "parallel replaces broken old pods first, then within the budget",
                four(json!({"podManagementPolicy": "Parallel",
                            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}})),
                vec![old(0), starting(old(1)), old(2), old(3)],
                vec![delete(1), delete(3)],
            ),
            (
                "parallel within the budget",
                four(json!({"podManagementPolicy": "Parallel",
                            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}})),
                vec![old(0), old(1), starting(pod(2, "new")), deleting(old(3))],
                vec![],
            ),
        ];
        for (story, set, pods, expected) in cases {
            assert_eq!(run_decide(&set, &pods), expected, "{story}");
        }
    }

    #[test]
    fn pods_below_the_partition_are_recreated_at_the_current_revision() {
        let set = stateful_set(
            json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}}),
        );
        assert_eq!(
            run_decide(&set, &[pod(1, "old"), pod(2, "new")]),
            vec![Action::Create {
                ordinal: 0,
                at: At::Current
            }]
        );
    }

    #[test]
    fn pods_missing_their_identity_are_relabelled() {
        let set = stateful_set(json!({"replicas": 1}));
        let mut bare = pod(0, "new");
        bare.labels.remove(POD_NAME_LABEL);
        assert_eq!(
            run_decide(&set, &[bare]),
            vec![Action::Relabel {
                pod: "web-0".into(),
                ordinal: 0
            }]
        );
    }

    #[test]
    fn status_counts_replicas_by_revision_and_completes_rollouts() {
        let set = stateful_set(json!({"minReadySeconds": 50}));
        let rolling = [
            pod(0, "old"),
            pod(1, "new"),
            starting(pod(2, "new")),
            deleting(pod(3, "old")),
        ];
        let refs: Vec<&OwnedPod> = rolling.iter().collect();
        assert_eq!(
            status(&set, "old", "new", 0, &refs, at(100)),
            StatefulSetStatus {
                observed_generation: 4,
                replicas: 4,
                ready_replicas: 2,
                current_replicas: 1,
                updated_replicas: 2,
                available_replicas: 2,
                current_revision: "old".into(),
                update_revision: "new".into(),
                collision_count: 0,
            }
        );
        let done = [pod(0, "new"), pod(1, "new"), pod(2, "new")];
        let refs: Vec<&OwnedPod> = done.iter().collect();
        let completed = status(&set, "old", "new", 0, &refs, at(10));
        assert_eq!(
            (
                completed.current_revision.as_str(),
                completed.current_replicas,
                completed.available_replicas
            ),
            ("new", 3, 0)
        );
        assert_eq!(
            completed.patch()["status"],
            json!({"observedGeneration": 4, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
                   "updatedReplicas": 3, "availableReplicas": 0, "currentRevision": "new",
                   "updateRevision": "new", "collisionCount": 0})
        );
    }

    fn revision(name: &str, number: i64, template: &Value) -> Revision {
        Revision {
            name: name.into(),
            revision: number,
            labels: Map::new(),
            data: workload_controller::template_patch(template),
        }
    }

    #[test]
    fn revisions_follow_the_template() {
        let set = stateful_set(json!({}));
        let other = json!({"spec": {"containers": [{"name": "web", "image": "web:0"}]}});
        let RevisionStep::Create(body) = plan_revision(&set, &[], 0) else {
            panic!("a first revision to create");
        };
        let hash = revision_hash(&workload_controller::template_patch(&set.template), 0);
        assert_eq!(body["metadata"]["name"], format!("web-{hash}"));
        assert_eq!(
            body["metadata"]["labels"],
            json!({"app": "web", HASH_LABEL: hash})
        );
        assert_eq!(body["revision"], 1);
        assert_ne!(
            revision_hash(&body["data"], 1),
            hash,
            "collisions change the name"
        );

        let current = revision("web-a", 1, &set.template);
        assert_eq!(
            plan_revision(&set, std::slice::from_ref(&current), 0),
            RevisionStep::Ready(current.clone())
        );
        let newer = revision("web-b", 2, &other);
        assert_eq!(
            plan_revision(&set, &[current.clone(), newer.clone()], 0),
            RevisionStep::Renumber(current, 3),
            "rolling back renumbers the old revision"
        );
        let RevisionStep::Create(body) = plan_revision(&set, &[newer], 0) else {
            panic!("a revision for the new template");
        };
        assert_eq!(body["revision"], 3);
    }

    #[test]
    fn history_beyond_the_limit_goes_unless_live() {
        let revisions: Vec<Revision> = (1..=5)
            .map(|n| revision(&format!("web-{n}"), n, &json!({"n": n})))
            .collect();
        let live: HashSet<&str> = ["web-1", "web-5"].into();
        assert_eq!(
            expired_revisions(&revisions, &live, 1),
            vec!["web-2", "web-3"]
        );
        assert_eq!(
            expired_revisions(&revisions, &live, 3),
            Vec::<String>::new()
        );
    }

    #[test]
    fn pods_get_a_stable_identity() {
        let set = stateful_set(json!({"serviceName": "web-headless"}));
        let pod = stateful_pod(&set, &set.template, "web-abc", 2);
        assert_eq!(pod["metadata"]["name"], "web-2");
        assert_eq!(
            pod["metadata"]["labels"],
            json!({"app": "web", REVISION_LABEL: "web-abc", POD_NAME_LABEL: "web-2", POD_INDEX_LABEL: "2"})
        );
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "StatefulSet");
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
            true
        );
        assert_eq!(
            (&pod["spec"]["hostname"], &pod["spec"]["subdomain"]),
            (&json!("web-2"), &json!("web-headless"))
        );
    }

    // In-process tests against the embedded API server.

    fn web(spec: Value) -> Value {
        let mut object = json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {
                "replicas": 3,
                "serviceName": "web",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                             "spec": {"containers": [{"name": "web", "image": "web:1"}]}},
            },
        });
        if let (Some(base), Value::Object(extra)) = (object["spec"].as_object_mut(), spec) {
            base.extend(extra);
        }
        object
    }

    /// An embedded cluster with the controller running (and telling how far it has
    /// settled) and the `web` set (with `spec` merged into its spec) created.
    async fn started(spec: Value) -> (EmbeddedCluster, Arc<Api>, Settled) {
        let cluster = testing::cluster().await;
        let api = cluster.api().clone();
        let settled = Settled::default();
        tokio::spawn(run(api.clone(), settled.clone()));
        testing::create(&api, "apps", "statefulsets", "default", web(spec));
        (cluster, api, settled)
    }

    fn names(api: &Api) -> Vec<String> {
        let mut names: Vec<String> = testing::list(api, "", "pods", "default")
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    }

    fn set_status(api: &Api) -> Value {
        testing::get(api, "apps", "statefulsets", "default", "web")["status"].clone()
    }

    fn image_of(api: &Api, pod: &str) -> Value {
        testing::get(api, "", "pods", "default", pod)["spec"]["containers"][0]["image"].clone()
    }

    /// Binds unbound pods to a node, as the scheduler would.
    fn bind_all(api: &Api) {
        for pod in testing::list(api, "", "pods", "default") {
            if pod["spec"]["nodeName"].is_null() {
                let name = pod["metadata"]["name"].as_str().unwrap_or("");
                testing::patch(
                    api,
                    "",
                    "pods",
                    "default",
                    name,
                    json!({"spec": {"nodeName": "worker-1"}}),
                );
            }
        }
    }

    #[tokio::test]
    async fn ordered_ready_waits_for_each_pod_before_the_next() {
        let (_cluster, api, settled) = started(json!({})).await;

        for ordinal in 0..3 {
            let name = format!("web-{ordinal}");
            eventually("the next pod", || names(&api).contains(&name).then_some(())).await;
            // Settled with the pod not ready: the next one waits for it.
            testing::settled(&api, &settled).await;
            assert_eq!(names(&api).len(), ordinal + 1, "only {name} so far");
            testing::mark_ready(&api, "default", &name);
        }
        let status = eventually("three ready", || {
            Some(set_status(&api)).filter(|s| s["availableReplicas"] == 3)
        })
        .await;
        let revision = status["updateRevision"]
            .as_str()
            .expect("update revision")
            .to_string();
        assert_eq!(
            status,
            json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
                   "updatedReplicas": 3, "availableReplicas": 3, "currentRevision": revision,
                   "updateRevision": revision, "collisionCount": 0})
        );
        let cr = testing::get(&api, "apps", "controllerrevisions", "default", &revision);
        assert_eq!(cr["metadata"]["ownerReferences"][0]["name"], "web");
        let pod = testing::get(&api, "", "pods", "default", "web-1");
        assert_eq!(pod["metadata"]["labels"][REVISION_LABEL], json!(revision));
        assert_eq!(pod["metadata"]["labels"][POD_INDEX_LABEL], "1");
        assert_eq!(pod["metadata"]["labels"][POD_NAME_LABEL], "web-1");
        assert_eq!(
            (&pod["spec"]["hostname"], &pod["spec"]["subdomain"]),
            (&json!("web-1"), &json!("web"))
        );

        // Steady state: the controller settles without writing the set again.
        let version = testing::get(&api, "apps", "statefulsets", "default", "web")["metadata"]["resourceVersion"].clone();
        testing::settled(&api, &settled).await;
        let after = testing::get(&api, "apps", "statefulsets", "default", "web");
        assert_eq!(after["metadata"]["resourceVersion"], version);
    }

    #[tokio::test]
    async fn parallel_scales_all_at_once_from_the_start_ordinal() {
        let (_cluster, api, _) =
            started(json!({"podManagementPolicy": "Parallel", "ordinals": {"start": 3}})).await;
        eventually("three pods at once", || {
            (names(&api) == ["web-3", "web-4", "web-5"]).then_some(())
        })
        .await;

        bind_all(&api);
        testing::patch(
            &api,
            "apps",
            "statefulsets",
            "default",
            "web",
            json!({"spec": {"replicas": 1}}),
        );
        eventually("web-4 and web-5 terminating together", || {
            let terminating: Vec<String> = testing::list(&api, "", "pods", "default")
                .iter()
                .filter(|p| testing::is_terminating(p))
                .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
                .collect();
            (terminating.len() == 2).then_some(())
        })
        .await;
    }

    #[tokio::test]
    async fn rolling_update_respects_the_partition_then_completes() {
        let partition = json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 1}});
        let (_cluster, api, _) = started(json!({"updateStrategy": partition})).await;
        let bind = {
            let api = api.clone();
            // Stands in for the scheduler: every pod goes to worker-1.
            tokio::spawn(async move {
                loop {
                    bind_all(&api);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        testing::spawn_kubelet(api.clone());
        let first = eventually("three available", || {
            Some(set_status(&api)).filter(|s| s["availableReplicas"] == 3)
        })
        .await;

        testing::patch(
            &api,
            "apps",
            "statefulsets",
            "default",
            "web",
            json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "web:2"}]}}}}),
        );
        let status = eventually("web-1 and web-2 updated", || {
            Some(set_status(&api))
                .filter(|s| s["updatedReplicas"] == 2 && s["availableReplicas"] == 3)
        })
        .await;
        assert_eq!(status["currentRevision"], first["currentRevision"]);
        assert_ne!(status["updateRevision"], first["updateRevision"]);
        assert_eq!(status["currentReplicas"], 1);
        assert_eq!(image_of(&api, "web-0"), "web:1");
        assert_eq!(image_of(&api, "web-2"), "web:2");

        testing::patch(
            &api,
            "apps",
            "statefulsets",
            "default",
            "web",
            json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}),
        );
        let done = eventually("rollout complete", || {
            Some(set_status(&api)).filter(|s| {
                s["currentRevision"] == s["updateRevision"] && s["updatedReplicas"] == 3
            })
        })
        .await;
        assert_eq!(done["currentReplicas"], 3);
        assert_eq!(image_of(&api, "web-0"), "web:2");
        assert_eq!(
            testing::list(&api, "apps", "controllerrevisions", "default").len(),
            2
        );
        bind.abort();
    }
}
