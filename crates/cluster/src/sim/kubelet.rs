//! The simulated kubelet of every simulated node: pods bound to a node go Pending ->
//! Running (-> Succeeded/Failed for pods that finish), with container statuses, restart
//! counts, conditions and IPs; deleted pods stop after their grace period; one container
//! of a running pod crashes and restarts when a label asks; kmod worker pods run the real
//! worker code against the node's module table.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::Simulation;
use super::nodes::{self, KUBELET};
use super::placement;
use crate::api::{DeleteOptions, Read, WriteOptions};
use crate::errors::ApiError;
use crate::object_key::ObjectKey;
use crate::pointer::{self, Pointer, annotation};
use crate::store::{Change, Closed, EventType, Followed, Follower};
use capstan_api::clock::rfc3339;
use capstan_api::labels;

/// Pods with this label ignore termination until deleted with grace period 0.
pub const STUCK_LABEL: &str = "sim.capstan.dev/stuck";
/// A pod whose containers exit after this many seconds (otherwise they run forever).
pub const EXIT_AFTER_ANNOTATION: &str = "sim.capstan.dev/exit-after-seconds";
/// The exit code of such a pod (default 0).
pub const EXIT_CODE_ANNOTATION: &str = "sim.capstan.dev/exit-code";
/// `sim.capstan.dev/fail-on-nodes: "node-2,node-5"` on a pod that runs to completion
/// (`restartPolicy` Never or OnFailure): on a node it names (its `spec.nodeName` one of
/// the comma-separated names), its containers exit with code 1 instead of
/// [`EXIT_CODE_ANNOTATION`]'s, reason `Error`, message `failed on <node>
/// (sim.capstan.dev/fail-on-nodes)`; with `Never` the pod is Failed. On other nodes, and
/// on pods that restart `Always`, it changes nothing. The pod still exits only after
/// [`EXIT_AFTER_ANNOTATION`]'s seconds: without it, it runs forever. kwok's stages of the
/// real cluster honour it too (failing such a pod at once, as they complete every pod).
pub const FAIL_ON_NODES_ANNOTATION: &str = "sim.capstan.dev/fail-on-nodes";
/// `sim.capstan.dev/crash-<container>: "<n>"` on a running pod: container `<container>`
/// is to have crashed `n` times in all. Each time the count is above the crashes so far,
/// the container exits with code 1 (the pod stays Running, not Ready while it is down) and
/// is restarted, its `restartCount` one higher, as a real kubelet restarts a container
/// whose process died (`kubectl exec POD -c CONTAINER -- kill 1`).
pub const CRASH_LABEL_PREFIX: &str = "sim.capstan.dev/crash-";

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    Start,
    Exit,
    Stop,
    /// One container's process dies.
    Crash(String),
    /// The container that crashed starts again.
    Restart(String),
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: Instant,
    seq: u64,
    key: ObjectKey,
    uid: String,
    action: Action,
}

#[derive(Default)]
struct Tracked {
    node: String,
    uid: String,
    started: bool,
    stopping: bool,
    restarts: Restarts,
    /// A container crashed (or is about to) and has not restarted yet.
    crashing: bool,
    ip: Option<String>,
    start_time: Option<String>,
    /// The start of containers due to exit before the next relist: the kubelet never
    /// reports it, and their exit is reported on top of it.
    unreported: Option<Unreported>,
    /// The pod as the last action read it, at its resourceVersion: the next action reads
    /// it again only if it changed since.
    read: Option<(u64, Value)>,
}

/// How often each container of a pod has restarted: all of them at each restart of the
/// pod's containers, one of them at each of its crashes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Restarts {
    pod: u32,
    crashed: BTreeMap<String, u32>,
}

impl Restarts {
    /// The `restartCount` of `container`.
    fn of(&self, container: &str) -> u32 {
        self.pod + self.crashed.get(container).copied().unwrap_or(0)
    }
}

/// A start the kubelet never reports, as the exit needs it.
enum Unreported {
    /// The running status, from the pod as the start read it.
    Status(Value),
    /// A worker's start, taken without reading the pod (its labels and node are in the
    /// store's projection): the exit reads the pod once for both, admits it if this was
    /// its first start, and reports the running status of `now` under its exit. Until the
    /// exit nothing of the pod is held, however many starts are due at once.
    Worker {
        now: String,
        host_ip: String,
        first_start: bool,
    },
}

/// Runs the kubelets of all simulated nodes until the store closes.
pub async fn run(sim: Arc<Simulation>) {
    // A pod's creator hands the store its parse, which the kubelet reads at the pod's
    // start or exit instead of parsing the stored bytes again.
    sim.api.store.keep_parsed("pods");
    let mut changes = sim.api.store.follow();
    let mut kubelet = Kubelet::new(sim);
    kubelet.resync();
    loop {
        let next = kubelet.queue.peek().map(|Reverse(d)| d.at);
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            followed = changes.next() => match followed {
                Some(followed) => {
                    kubelet.take_in(followed);
                    if !kubelet.catch_up(&mut changes) {
                        return;
                    }
                }
                None => return,
            },
            () = sleep => kubelet.run_due().await,
        }
    }
}

/// Most due actions the kubelet takes before it reads the store's changes again. Each
/// action writes, and what the kubelet reads late it acts on late (and once a whole
/// broadcast behind, it catches up from the history).
const ACTIONS_PER_TURN: usize = 64;

struct Kubelet {
    sim: Arc<Simulation>,
    pods: HashMap<ObjectKey, Tracked>,
    by_node: HashMap<String, HashSet<ObjectKey>>,
    ready_nodes: HashMap<String, bool>,
    /// Nodes as last read, at their resourceVersion: a node is parsed again only when it
    /// has changed, not for every pod it starts.
    node_reads: HashMap<String, (u64, Arc<Value>)>,
    queue: BinaryHeap<Reverse<Due>>,
    seq: u64,
    next_ip: HashMap<String, u32>,
}

impl Kubelet {
    fn new(sim: Arc<Simulation>) -> Self {
        Kubelet {
            sim,
            pods: HashMap::new(),
            by_node: HashMap::new(),
            ready_nodes: HashMap::new(),
            node_reads: HashMap::new(),
            queue: BinaryHeap::new(),
            seq: 0,
            next_ip: HashMap::new(),
        }
    }

    fn schedule(&mut self, after: Duration, key: &ObjectKey, uid: &str, action: Action) {
        self.seq += 1;
        self.queue.push(Reverse(Due {
            at: Instant::now() + after,
            seq: self.seq,
            key: key.clone(),
            uid: uid.to_string(),
            action,
        }));
    }

    fn resync(&mut self) {
        for node in self
            .sim
            .api
            .store
            .list("nodes", None, None, None, None)
            .items
        {
            let name = node.projection["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            self.ready_nodes
                .insert(name, nodes::is_ready(&node.value()));
        }
        let pods = self
            .sim
            .api
            .store
            .list("pods", None, None, None, None)
            .items;
        // Pods deleted while the kubelet was behind are forgotten.
        let present: HashSet<ObjectKey> = pods.iter().map(|pod| pod.key("pods")).collect();
        let gone: Vec<ObjectKey> = self
            .pods
            .keys()
            .filter(|key| !present.contains(key))
            .cloned()
            .collect();
        for key in gone {
            self.forget(&key);
        }
        for pod in pods {
            let key = pod.key("pods");
            self.observe_pod(&key, &pod.projection);
        }
    }

    /// Observes every change already broadcast; false when the store has closed.
    fn catch_up(&mut self, changes: &mut Follower) -> bool {
        loop {
            match changes.try_next() {
                Ok(Some(followed)) => self.take_in(followed),
                Ok(None) => return true,
                Err(Closed) => return false,
            }
        }
    }

    fn take_in(&mut self, followed: Followed) {
        match followed {
            Followed::Change(change) => self.observe(&change),
            // Missed changes beyond the history: rebuild from the full state.
            Followed::Restart => self.resync(),
        }
    }

    fn observe(&mut self, change: &Change) {
        match change.key.storage.as_str() {
            "pods" if change.event == EventType::Deleted => self.forget(&change.key),
            // A change the store has moved past is skipped: its newer state comes as a
            // change of its own. Acting on it could undo the kubelet's own later write
            // (start again a pod it has just seen finish) when it reads the broadcast late.
            "pods" if !self.is_current(change) => {}
            "pods" => self.observe_pod(&change.key, &change.object.projection),
            "nodes" => self.observe_node(change),
            _ => {}
        }
    }

    /// Whether `change` shows the object as the store holds it now.
    fn is_current(&self, change: &Change) -> bool {
        self.sim
            .api
            .store
            .get(&change.key)
            .is_some_and(|stored| stored.resource_version == change.object.resource_version)
    }

    fn forget(&mut self, key: &ObjectKey) {
        if let Some(tracked) = self.pods.remove(key)
            && let Some(set) = self.by_node.get_mut(&tracked.node)
        {
            set.remove(key);
        }
    }

    fn observe_pod(&mut self, key: &ObjectKey, pod: &Value) {
        let node = pod
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if node.is_empty() || !self.sim.manages(node) {
            return;
        }
        let uid = pod
            .at("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if self.pods.get(key).is_some_and(|t| t.uid != uid) {
            self.forget(key);
        }
        let phase = pod
            .at("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        let deleting = pod.at("/metadata/deletionTimestamp").is_some();
        let stuck = pointer::label(pod, STUCK_LABEL).is_some();
        if !self.pods.contains_key(key) {
            if !deleting && matches!(phase, "Succeeded" | "Failed") {
                return;
            }
            self.pods.insert(
                key.clone(),
                Tracked {
                    node: node.to_string(),
                    uid: uid.clone(),
                    ..Tracked::default()
                },
            );
            self.by_node
                .entry(node.to_string())
                .or_default()
                .insert(key.clone());
            if !deleting {
                let start = self.sim.config.timing.pod_start();
                self.schedule(start, key, &uid, Action::Start);
            }
        }
        if deleting && !stuck {
            let grace = pod
                .at("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let tracked = self.pods.get_mut(key);
            if let Some(tracked) = tracked
                && !tracked.stopping
                && grace > 0
            {
                tracked.stopping = true;
                let stop = self
                    .sim
                    .config
                    .timing
                    .pod_stop()
                    .min(Duration::from_secs(grace));
                self.schedule(stop, key, &uid, Action::Stop);
            }
        }
        if !deleting {
            self.crash_if_asked(key, pod);
        }
    }

    /// Schedules the next crash a [`CRASH_LABEL_PREFIX`] label asks for, once the pod's
    /// containers run, one crash at a time.
    fn crash_if_asked(&mut self, key: &ObjectKey, pod: &Value) {
        let Some(tracked) = self.pods.get_mut(key) else {
            return;
        };
        if !tracked.started || tracked.stopping || tracked.crashing {
            return;
        }
        let labels = pod.at("/metadata/labels").and_then(Value::as_object);
        let Some(container) = labels.and_then(|l| next_crash(l, &tracked.restarts.crashed)) else {
            return;
        };
        tracked.crashing = true;
        let uid = tracked.uid.clone();
        self.schedule(Duration::ZERO, key, &uid, Action::Crash(container));
    }

    fn observe_node(&mut self, change: &Change) {
        let name = change.key.name.clone();
        if change.event == EventType::Deleted {
            self.ready_nodes.remove(&name);
            return;
        }
        let ready = nodes::is_ready(change.value());
        let was = self.ready_nodes.insert(name.clone(), ready);
        if was == Some(ready) || !self.sim.manages(&name) {
            return;
        }
        let keys: Vec<ObjectKey> = self
            .by_node
            .get(&name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for key in keys {
            let Some(tracked) = self.pods.get(&key) else {
                continue;
            };
            let uid = tracked.uid.clone();
            if ready {
                // Back from NotReady or a reboot: containers start again.
                self.schedule(
                    self.sim.config.timing.pod_start(),
                    &key,
                    &uid,
                    Action::Start,
                );
            } else if tracked.started {
                let key = key.clone();
                self.mark_unready(&key);
            }
        }
    }

    /// Takes the actions that are due, at most [`ACTIONS_PER_TURN`] of them. The
    /// containers due to exit exit together at the end of the turn, so that a node's
    /// workers run against its module table at once.
    async fn run_due(&mut self) {
        let now = Instant::now();
        let mut exiting = Vec::new();
        for _ in 0..ACTIONS_PER_TURN {
            let Some(Reverse(due)) = self.queue.peek().cloned() else {
                break;
            };
            if due.at > now {
                break;
            }
            self.queue.pop();
            if self.pods.get(&due.key).is_none_or(|t| t.uid != due.uid) {
                continue;
            }
            let result = match due.action {
                Action::Start => self.start(&due.key).await,
                Action::Exit => {
                    // A pod's containers exit once, however many exits fell due.
                    if !exiting.contains(&due.key) {
                        exiting.push(due.key);
                    }
                    continue;
                }
                Action::Stop => self.stop(&due.key),
                Action::Crash(container) => self.crash(&due.key, &container),
                Action::Restart(container) => self.restart_container(&due.key, &container),
            };
            warn_unless_gone(result, &due.key);
        }
        for (result, key) in self.exit_all(&exiting).into_iter().zip(&exiting) {
            warn_unless_gone(result, key);
        }
    }

    fn pod(&self, key: &ObjectKey) -> Option<Value> {
        self.sim.api.store.get(key).map(|o| o.value())
    }

    /// The pod as stored now, with its resourceVersion; the parse an earlier action kept
    /// when the pod has not changed since, or the one its writer left with the store.
    fn read_pod(&mut self, key: &ObjectKey) -> Option<(u64, Value)> {
        let store = &self.sim.api.store;
        let stored = store.get(key)?;
        let version = stored.resource_version;
        let kept = self.pods.get_mut(key).and_then(|t| t.read.take());
        let pod = match kept {
            Some((read, pod)) if read == version => pod,
            _ => store
                .take_parsed(key, version)
                .unwrap_or_else(|| stored.value()),
        };
        Some((version, pod))
    }

    /// The node as stored now, parsed only when it changed since the last read.
    fn read_node(&mut self, name: &str) -> Option<Arc<Value>> {
        let stored = self.sim.api.store.get(&ObjectKey::new("nodes", "", name))?;
        if let Some((version, node)) = self.node_reads.get(name)
            && *version == stored.resource_version
        {
            return Some(node.clone());
        }
        let node = Arc::new(stored.value());
        self.node_reads
            .insert(name.to_string(), (stored.resource_version, node.clone()));
        Some(node)
    }

    async fn start(&mut self, key: &ObjectKey) -> Result<(), ApiError> {
        let timing = &self.sim.config.timing;
        if exits_unseen(timing.worker(), timing.relist())
            && let Some(stored) = self.sim.api.store.get(key)
            && is_worker(&stored.projection)
        {
            return self.start_unseen_worker(key, &stored.projection);
        }
        let Some((version, pod)) = self.read_pod(key) else {
            return Ok(());
        };
        let Some((node_name, node)) = self.startable_on(&pod) else {
            return Ok(());
        };
        let first_start = self.pods.get(key).is_some_and(|t| !t.started);
        if first_start && let Err(unfit) = placement::admits(&pod["spec"], &node) {
            self.forget(key);
            return self.write_status(key, rejected_status(&unfit));
        }
        let image = pod
            .at("/spec/containers/0/image")
            .and_then(Value::as_str)
            .unwrap_or("");
        let worker = is_worker(&pod);
        if !worker && self.sim.config.broken_images.iter().any(|b| b == image) {
            return self.write_status(
                key,
                self.waiting_status(
                    &pod,
                    "ErrImagePull",
                    &format!("failed to pull image \"{image}\": manifest unknown"),
                ),
            );
        }
        let ip = self.pod_ip(key, &node_name);
        let now = rfc3339(self.sim.api.clock.now());
        let Some((restarts, start_time)) = self.mark_started(key, &ip, &now) else {
            return Ok(());
        };
        let host_ip = self.sim.node_ip(&node);
        // A worker is Running (not Ready) while it works; other pods are Ready at once.
        let status = running_status(&pod, &ip, &host_ip, &start_time, &now, &restarts, !worker);
        let exit_after = if worker {
            Some(self.sim.config.timing.worker())
        } else {
            annotation(&pod, EXIT_AFTER_ANNOTATION)
                .and_then(|s| s.parse::<f64>().ok())
                .map(|after| Duration::from_secs_f64(after.max(0.0)))
        };
        if exit_after.is_some_and(|after| exits_unseen(after, self.sim.config.timing.relist())) {
            // Nothing written: the exit reads the pod as this start did.
            if let Some(tracked) = self.pods.get_mut(key) {
                tracked.unreported = Some(Unreported::Status(status));
                tracked.read = Some((version, pod));
            }
        } else {
            self.write_status(key, status)?;
        }
        let uid = self
            .pods
            .get(key)
            .map(|t| t.uid.clone())
            .unwrap_or_default();
        if let Some(after) = exit_after {
            self.schedule(after, key, &uid, Action::Exit);
        }
        Ok(())
    }

    /// Starts a worker whose run ends before the next relist, from the store's projection
    /// of the pod (its labels, node and deletion): nothing is written, and the exit reads
    /// the pod.
    fn start_unseen_worker(&mut self, key: &ObjectKey, projection: &Value) -> Result<(), ApiError> {
        let Some((node_name, node)) = self.startable_on(projection) else {
            return Ok(());
        };
        let first_start = self.pods.get(key).is_some_and(|t| !t.started);
        let ip = self.pod_ip(key, &node_name);
        let now = rfc3339(self.sim.api.clock.now());
        if self.mark_started(key, &ip, &now).is_none() {
            return Ok(());
        }
        let host_ip = self.sim.node_ip(&node);
        let Some(tracked) = self.pods.get_mut(key) else {
            return Ok(());
        };
        tracked.unreported = Some(Unreported::Worker {
            now,
            host_ip,
            first_start,
        });
        let uid = tracked.uid.clone();
        self.schedule(self.sim.config.timing.worker(), key, &uid, Action::Exit);
        Ok(())
    }

    /// The node whose containers `pod` (the pod or its projection) starts on now: none
    /// while the pod is being deleted, and none while its node is not Ready (the pod is
    /// started again when the node is, in `observe_node`).
    fn startable_on(&mut self, pod: &Value) -> Option<(String, Arc<Value>)> {
        if pod.at("/metadata/deletionTimestamp").is_some() {
            return None;
        }
        let node_name = pod
            .at("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let node = self.read_node(&node_name)?;
        nodes::is_ready(&node).then_some((node_name, node))
    }

    /// The pod's IP: the one it had, or the node's next.
    fn pod_ip(&mut self, key: &ObjectKey, node_name: &str) -> String {
        if let Some(ip) = self.pods.get(key).and_then(|t| t.ip.clone()) {
            return ip;
        }
        let index = self.sim.node_index(node_name);
        let n = self.next_ip.entry(node_name.to_string()).or_insert(0);
        *n += 1;
        nodes::pod_ip(index, *n)
    }

    /// Records a start of the pod's containers at `now`: its restarts and start time.
    fn mark_started(&mut self, key: &ObjectKey, ip: &str, now: &str) -> Option<(Restarts, String)> {
        let tracked = self.pods.get_mut(key)?;
        if tracked.started {
            tracked.restarts.pod += 1;
        }
        tracked.started = true;
        // All containers start anew: a crashed one waits for no restart of its own.
        tracked.crashing = false;
        tracked.ip = Some(ip.to_string());
        let start_time = tracked
            .start_time
            .get_or_insert_with(|| now.to_string())
            .clone();
        Some((tracked.restarts.clone(), start_time))
    }

    /// The running status of a start never reported, resolved against the pod the exit
    /// read; Err with the rejection when the deferred first start does not admit it.
    fn unreported_status(
        &mut self,
        key: &ObjectKey,
        pod: &Value,
        unreported: Option<Unreported>,
    ) -> Result<Option<Value>, Value> {
        let (now, host_ip, first_start) = match unreported {
            None => return Ok(None),
            Some(Unreported::Status(status)) => return Ok(Some(status)),
            Some(Unreported::Worker {
                now,
                host_ip,
                first_start,
            }) => (now, host_ip, first_start),
        };
        if first_start {
            let node_name = pod
                .at("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            if let Some(node) = self.read_node(node_name)
                && let Err(unfit) = placement::admits(&pod["spec"], &node)
            {
                return Err(rejected_status(&unfit));
            }
        }
        let Some(tracked) = self.pods.get(key) else {
            return Ok(None);
        };
        let ip = tracked.ip.clone().unwrap_or_default();
        let start_time = tracked.start_time.clone().unwrap_or_else(|| now.clone());
        Ok(Some(running_status(
            pod,
            &ip,
            &host_ip,
            &start_time,
            &now,
            &tracked.restarts,
            false,
        )))
    }

    /// Containers exited: each pod's configured exit, or its worker's result. The workers
    /// of one node run in turn against its module table, read and written once for all.
    /// One result per key, in order.
    fn exit_all(&mut self, keys: &[ObjectKey]) -> Vec<Result<(), ApiError>> {
        let mut results = Vec::with_capacity(keys.len());
        let mut exits = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            results.push(self.exited(key).map(|exit| {
                if let Some(exit) = exit {
                    exits.push((i, exit));
                }
            }));
        }
        let mut workers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, (_, exit)) in exits.iter().enumerate() {
            if let Some(node) = exit.worker_node() {
                workers.entry(node).or_default().push(i);
            }
        }
        let mut outcomes: Vec<Option<Result<(), String>>> = vec![None; exits.len()];
        for (node, runs) in workers {
            let pods: Vec<&Value> = runs.iter().map(|&i| &exits[i].1.pod).collect();
            for (i, outcome) in runs.iter().zip(self.sim.run_workers(node, &pods)) {
                outcomes[*i] = Some(outcome);
            }
        }
        for ((i, exit), outcome) in exits.into_iter().zip(outcomes) {
            let (code, message) = match outcome {
                Some(Ok(())) => (0, String::new()),
                Some(Err(reason)) => (1, reason),
                None => match fails_on_node(&exit.pod) {
                    Some(node) => (1, format!("failed on {node} ({FAIL_ON_NODES_ANNOTATION})")),
                    None => (
                        annotation(&exit.pod, EXIT_CODE_ANNOTATION)
                            .and_then(|c| c.parse().ok())
                            .unwrap_or(0),
                        String::new(),
                    ),
                },
            };
            results[i] = self.finish_exit(exit, code, &message);
        }
        results
    }

    /// The pod whose containers exit now, as read at the exit; `None` when there is
    /// nothing left to exit (the pod is gone or being deleted, or its node rejected it,
    /// which is written here).
    fn exited(&mut self, key: &ObjectKey) -> Result<Option<Exit>, ApiError> {
        let Some((version, pod)) = self.read_pod(key) else {
            return Ok(None);
        };
        if pod.at("/metadata/deletionTimestamp").is_some() {
            return Ok(None);
        }
        let unreported = self.pods.get_mut(key).and_then(|t| t.unreported.take());
        match self.unreported_status(key, &pod, unreported) {
            Ok(unreported) => Ok(Some(Exit {
                key: key.clone(),
                version,
                pod,
                unreported,
            })),
            Err(rejected) => {
                self.forget(key);
                self.write_status_read(key, rejected, Some((version, pod)))
                    .map(|()| None)
            }
        }
    }

    /// Reports the exit with `code`, and restarts the containers if the pod's restart
    /// policy says so.
    fn finish_exit(&mut self, exit: Exit, code: i64, message: &str) -> Result<(), ApiError> {
        let Exit {
            key,
            version,
            pod,
            unreported,
        } = exit;
        let policy = pod
            .at("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("Always");
        let restart = policy == "Always" || (policy == "OnFailure" && code != 0);
        let uid = self
            .pods
            .get(&key)
            .map(|t| t.uid.clone())
            .unwrap_or_default();
        let restarts = self
            .pods
            .get(&key)
            .map(|t| t.restarts.clone())
            .unwrap_or_default();
        let now = rfc3339(self.sim.api.clock.now());
        let status = terminated_status(&pod, unreported, code, message, &now, &restarts, restart);
        self.write_status_read(&key, status, Some((version, pod)))?;
        if restart {
            // CrashLoopBackOff, scaled to the simulation's pace: doubles per restart, capped.
            let backoff =
                self.sim.config.timing.pod_start() * 2u32.saturating_pow(restarts.pod.min(6));
            self.schedule(
                backoff.min(Duration::from_secs(5)),
                &key,
                &uid,
                Action::Start,
            );
        } else {
            self.forget(&key);
        }
        Ok(())
    }

    /// A container's process dies: it is reported exited (code 1), the pod not ready, and
    /// restarted after the time a start takes. Nothing happens to a pod being deleted, or
    /// whose containers started again in the meantime.
    fn crash(&mut self, key: &ObjectKey, container: &str) -> Result<(), ApiError> {
        let Some((version, pod)) = self.read_pod(key) else {
            return Ok(());
        };
        let Some(tracked) = self.pods.get_mut(key) else {
            return Ok(());
        };
        let deleting = pod.at("/metadata/deletionTimestamp").is_some();
        if deleting || !tracked.crashing {
            tracked.crashing = false;
            return Ok(());
        }
        let restarts = tracked.restarts.of(container);
        let uid = tracked.uid.clone();
        let now = rfc3339(self.sim.api.clock.now());
        let Some(status) = crashed_status(&pod, container, restarts, &now) else {
            // Not running now (waiting to restart): the pod's next change asks again. A
            // container the pod does not have is not asked for again.
            let unknown = !containers(&pod).any(|(name, _)| name == container);
            let asked = crashes_asked(&pod, container);
            if let Some(tracked) = self.pods.get_mut(key) {
                tracked.crashing = false;
                if unknown {
                    tracked
                        .restarts
                        .crashed
                        .insert(container.to_string(), asked);
                }
            }
            if unknown {
                tracing::warn!(pod = %key.name, container, "a crash asked of no such container");
            }
            return Ok(());
        };
        if let Err(err) = self.write_status_read(key, status, Some((version, pod))) {
            // Not crashed after all: the pod's next change asks again.
            if let Some(tracked) = self.pods.get_mut(key) {
                tracked.crashing = false;
            }
            return Err(err);
        }
        let restart = self.sim.config.timing.pod_start();
        self.schedule(restart, key, &uid, Action::Restart(container.to_string()));
        Ok(())
    }

    /// The container that crashed runs again, its restart counted; the pod is Ready again
    /// once every container is.
    fn restart_container(&mut self, key: &ObjectKey, container: &str) -> Result<(), ApiError> {
        let Some((version, pod)) = self.read_pod(key) else {
            return Ok(());
        };
        let Some(tracked) = self.pods.get_mut(key) else {
            return Ok(());
        };
        let deleting = pod.at("/metadata/deletionTimestamp").is_some();
        if deleting || !tracked.crashing {
            tracked.crashing = false;
            return Ok(());
        }
        tracked.crashing = false;
        *tracked
            .restarts
            .crashed
            .entry(container.to_string())
            .or_default() += 1;
        let restarts = tracked.restarts.of(container);
        let now = rfc3339(self.sim.api.clock.now());
        match restarted_status(&pod, container, restarts, &now) {
            Some(status) => self.write_status_read(key, status, Some((version, pod))),
            None => Ok(()),
        }
    }

    /// The containers stopped: the kubelet finishes the deletion (grace period 0).
    fn stop(&mut self, key: &ObjectKey) -> Result<(), ApiError> {
        let Some(pods) = self.sim.api.registry.get("", "v1", "pods") else {
            return Ok(());
        };
        let options = DeleteOptions {
            grace_period_seconds: Some(0),
            ..DeleteOptions::default()
        };
        self.sim
            .api
            .delete(&pods, &key.namespace, &key.name, &options)
            .map(|_| ())
    }

    fn mark_unready(&mut self, key: &ObjectKey) {
        let Some(pod) = self.pod(key) else { return };
        let mut status = pod.get("status").cloned().unwrap_or_else(|| json!({}));
        let now = rfc3339(self.sim.api.clock.now());
        set_condition(&mut status, "Ready", false, &now);
        set_condition(&mut status, "ContainersReady", false, &now);
        if let Some(Value::Array(containers)) = status.get_mut("containerStatuses") {
            for c in containers {
                c["ready"] = json!(false);
            }
        }
        if let Err(err) = self.write_status(key, status)
            && !matches!(err.code, 404 | 409)
        {
            tracing::warn!(%err, pod = %key.name, "marking a pod unready");
        }
    }

    fn waiting_status(&self, pod: &Value, reason: &str, message: &str) -> Value {
        let containers: Vec<Value> = containers(pod)
            .map(|(name, image)| json!({"name": name, "image": image, "imageID": "", "ready": false, "started": false,
                                        "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}))
            .collect();
        json!({"phase": "Pending", "containerStatuses": containers})
    }

    fn write_status(&self, key: &ObjectKey, status: Value) -> Result<(), ApiError> {
        self.write_status_read(key, status, None)
    }

    /// Writes the pod's `status`, from the pod as the kubelet `read` it when it has one.
    fn write_status_read(
        &self,
        key: &ObjectKey,
        status: Value,
        read: Option<(u64, Value)>,
    ) -> Result<(), ApiError> {
        let Some(pods) = self.sim.api.registry.get("", "v1", "pods") else {
            return Ok(());
        };
        let options = WriteOptions {
            field_manager: Some(KUBELET.into()),
            ..WriteOptions::default()
        };
        let read = read.map(|(resource_version, object)| Read {
            resource_version,
            object,
        });
        self.sim.api.merge_patch_read(
            &pods,
            &key.namespace,
            &key.name,
            Some("status"),
            &json!({"status": status}),
            &options,
            read,
        )
    }
}

/// A pod whose containers exited, as the kubelet read it at the exit.
struct Exit {
    key: ObjectKey,
    version: u64,
    pod: Value,
    /// The running status of a start never reported, reported under the exit.
    unreported: Option<Value>,
}

impl Exit {
    /// The node a worker pod's run changes; `None` for other pods.
    fn worker_node(&self) -> Option<&str> {
        is_worker(&self.pod).then(|| {
            self.pod
                .at("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("")
        })
    }
}

/// Logs a failed action, unless the pod went away or changed under it (404, 409): the
/// store's change stream brings what happened instead.
fn warn_unless_gone(result: Result<(), ApiError>, key: &ObjectKey) {
    if let Err(err) = result
        && !matches!(err.code, 404 | 409)
    {
        tracing::warn!(%err, pod = %key.name, "simulated kubelet");
    }
}

/// The status of a pod the node does not admit.
fn rejected_status(unfit: &placement::Unfit) -> Value {
    json!({"phase": "Failed", "reason": unfit.reason, "message": format!("Pod was rejected: {}", unfit.message)})
}

/// Whether a container that exits `after` it started is only ever seen exited: the
/// kubelet learns of container changes when it relists them (its PLEG, every `relist`),
/// and reports the pod's status as that relist finds it.
fn exits_unseen(after: Duration, relist: Duration) -> bool {
    after < relist
}

/// Whether a pod is one of capstan's kmod workers (recognised as KMM does, by labels).
pub fn is_worker(pod: &Value) -> bool {
    pointer::label(pod, labels::COMPONENT_LABEL) == Some(labels::WORKER_COMPONENT)
        && pointer::label(pod, labels::WORKER_ACTION_LABEL).is_some()
}

fn containers(pod: &Value) -> impl Iterator<Item = (String, String)> + '_ {
    pod.at("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["image"].as_str().unwrap_or("").to_string(),
            )
        })
}

fn container_id(pod: &Value, name: &str, restarts: u32) -> String {
    let uid = pod
        .at("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("cri-o://{:x}", fnv(&format!("{uid}/{name}/{restarts}")))
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn set_condition(status: &mut Value, kind: &str, value: bool, now: &str) {
    let text = if value { "True" } else { "False" };
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    if let Some(Value::Array(conditions)) = status.get_mut("conditions") {
        match conditions.iter_mut().find(|c| c["type"] == kind) {
            Some(c) if c["status"] == text => {}
            Some(c) => {
                c["status"] = json!(text);
                c["lastTransitionTime"] = json!(now);
            }
            None => conditions.push(json!({"type": kind, "status": text, "lastProbeTime": null, "lastTransitionTime": now})),
        }
    }
}

fn running_status(
    pod: &Value,
    ip: &str,
    host_ip: &str,
    start_time: &str,
    now: &str,
    restarts: &Restarts,
    ready: bool,
) -> Value {
    let containers: Vec<Value> = containers(pod)
        .map(|(name, image)| {
            let restarts = restarts.of(&name);
            let mut status = json!({"name": name, "image": image, "imageID": format!("{image}@sha256:{:064x}", fnv(&image)),
                   "containerID": container_id(pod, &name, restarts), "ready": ready, "started": true,
                   "restartCount": restarts, "state": {"running": {"startedAt": now}}});
            // The previous run's end stays on show, as the kubelet keeps it.
            if let Some(last) = container_status(pod, &name).and_then(|c| c.get("lastState")) {
                status["lastState"] = last.clone();
            }
            status
        })
        .collect();
    let mut status = pod.get("status").cloned().unwrap_or_else(|| json!({}));
    status["phase"] = json!("Running");
    status["hostIP"] = json!(host_ip);
    status["hostIPs"] = json!([{"ip": host_ip}]);
    status["podIP"] = json!(ip);
    status["podIPs"] = json!([{"ip": ip}]);
    status["startTime"] = json!(start_time);
    status["qosClass"] = json!(
        status
            .get("qosClass")
            .cloned()
            .unwrap_or_else(|| json!("BestEffort"))
    );
    status["containerStatuses"] = json!(containers);
    for (kind, value) in [
        ("PodScheduled", true),
        ("Initialized", true),
        ("ContainersReady", ready),
        ("Ready", ready),
    ] {
        set_condition(&mut status, kind, value, now);
    }
    status
}

/// The status of `pod` once its containers exited with `code`, on top of its `running`
/// status when that was never reported (its own status otherwise).
fn terminated_status(
    pod: &Value,
    running: Option<Value>,
    code: i64,
    message: &str,
    now: &str,
    restarts: &Restarts,
    restarting: bool,
) -> Value {
    let reason = if code == 0 { "Completed" } else { "Error" };
    let containers: Vec<Value> = containers(pod)
        .map(|(name, image)| {
            let restarts = restarts.of(&name);
            let mut terminated = json!({"exitCode": code, "reason": reason, "finishedAt": now,
                                        "containerID": container_id(pod, &name, restarts)});
            if !message.is_empty() {
                terminated["message"] = json!(message);
            }
            let state = if restarting {
                json!({"waiting": {"reason": "CrashLoopBackOff", "message": format!("back-off restarting failed container {name}")}})
            } else {
                json!({"terminated": terminated.clone()})
            };
            let mut status = json!({"name": name, "image": image, "imageID": format!("{image}@sha256:{:064x}", fnv(&image)),
                   "containerID": container_id(pod, &name, restarts), "ready": false, "started": false,
                   "restartCount": restarts, "state": state});
            if restarting {
                status["lastState"] = json!({"terminated": terminated});
            }
            status
        })
        .collect();
    let mut status = running
        .or_else(|| pod.get("status").cloned())
        .unwrap_or_else(|| json!({}));
    if !restarting {
        status["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
    }
    status["containerStatuses"] = json!(containers);
    set_condition(&mut status, "ContainersReady", false, now);
    set_condition(&mut status, "Ready", false, now);
    if !restarting && !message.is_empty() {
        status["message"] = json!(message);
    }
    status
}

/// The node of a pod that runs to completion (`restartPolicy` Never or OnFailure) when its
/// [`FAIL_ON_NODES_ANNOTATION`] names it: the pod is to fail there.
fn fails_on_node(pod: &Value) -> Option<&str> {
    let policy = pod.at("/spec/restartPolicy").and_then(Value::as_str);
    if !matches!(policy, Some("Never" | "OnFailure")) {
        return None;
    }
    let node = pod.at("/spec/nodeName").and_then(Value::as_str)?;
    annotation(pod, FAIL_ON_NODES_ANNOTATION)?
        .split(',')
        .any(|name| name.trim() == node)
        .then_some(node)
}

/// The status of `container` in the pod's status.
fn container_status<'a>(pod: &'a Value, container: &str) -> Option<&'a Value> {
    pod.at("/status/containerStatuses")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["name"] == container)
}

/// The crashes a [`CRASH_LABEL_PREFIX`] label asks of `container` (0 when none).
fn crashes_asked(pod: &Value, container: &str) -> u32 {
    pointer::label(pod, &format!("{CRASH_LABEL_PREFIX}{container}"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The first container (by name) whose [`CRASH_LABEL_PREFIX`] label asks for more crashes
/// than it has had.
fn next_crash(
    labels: &serde_json::Map<String, Value>,
    crashed: &BTreeMap<String, u32>,
) -> Option<String> {
    labels.iter().find_map(|(key, value)| {
        let container = key.strip_prefix(CRASH_LABEL_PREFIX)?;
        let asked: u32 = value.as_str()?.parse().ok()?;
        (asked > crashed.get(container).copied().unwrap_or(0)).then(|| container.to_string())
    })
}

/// The pod's status once `container`, running, has exited with code 1 and waits to be
/// restarted; `None` when the pod has no such container running.
fn crashed_status(pod: &Value, container: &str, restarts: u32, now: &str) -> Option<Value> {
    let mut status = pod.get("status").cloned()?;
    let entry = status
        .get_mut("containerStatuses")
        .and_then(Value::as_array_mut)?
        .iter_mut()
        .find(|c| c["name"] == container)?;
    let started_at = entry.at("/state/running/startedAt").cloned()?;
    let id = container_id(pod, container, restarts);
    entry["state"] = json!({"terminated": {"exitCode": 1, "reason": "Error", "startedAt": started_at,
                                           "finishedAt": now, "containerID": id}});
    entry["ready"] = json!(false);
    entry["started"] = json!(false);
    set_condition(&mut status, "ContainersReady", false, now);
    set_condition(&mut status, "Ready", false, now);
    Some(status)
}

/// The pod's status once `container`, which crashed, runs again as its `restarts`-th
/// restart, with the crash as its last state; the pod is Ready when all its containers are.
fn restarted_status(pod: &Value, container: &str, restarts: u32, now: &str) -> Option<Value> {
    let mut status = pod.get("status").cloned()?;
    let containers = status
        .get_mut("containerStatuses")
        .and_then(Value::as_array_mut)?;
    let entry = containers.iter_mut().find(|c| c["name"] == container)?;
    let crashed = entry.at("/state/terminated").cloned()?;
    entry["lastState"] = json!({"terminated": crashed});
    entry["state"] = json!({"running": {"startedAt": now}});
    entry["containerID"] = json!(container_id(pod, container, restarts));
    entry["restartCount"] = json!(restarts);
    entry["ready"] = json!(true);
    entry["started"] = json!(true);
    let ready = containers.iter().all(|c| c["ready"] == true);
    set_condition(&mut status, "ContainersReady", ready, now);
    set_condition(&mut status, "Ready", ready, now);
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::PatchType;
    use crate::object_key::ObjectKey;
    use crate::sim::config::ClusterConfig;

    fn pod() -> Value {
        json!({"metadata": {"uid": "u1", "labels": {}}, "spec": {"containers": [{"name": "app", "image": "app:v1"}]}})
    }

    /// The exit of one pod's containers, as a turn with only that exit takes it.
    fn exit_one(kubelet: &mut Kubelet, key: &ObjectKey) {
        let result = kubelet.exit_all(std::slice::from_ref(key)).pop();
        result.expect("one result").expect("exited");
    }

    #[test]
    fn statuses_follow_the_pod_lifecycle() {
        let none = Restarts::default();
        let once = Restarts {
            pod: 1,
            ..Restarts::default()
        };
        let running = running_status(&pod(), "10.64.1.2", "10.0.0.11", "t0", "t1", &none, true);
        assert_eq!(running["phase"], "Running");
        assert_eq!(running["containerStatuses"][0]["ready"], true);
        assert!(
            running["conditions"]
                .as_array()
                .expect("conditions")
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
        let cases = [
            (
                "exit 0, no restart",
                0,
                false,
                Some("Succeeded"),
                "terminated",
            ),
            ("exit 1, no restart", 1, false, Some("Failed"), "terminated"),
            ("exit 1, restarting", 1, true, None, "waiting"),
        ];
        for (name, code, restarting, phase, state) in cases {
            let status = terminated_status(&pod(), None, code, "", "t2", &once, restarting);
            assert_eq!(status.get("phase").and_then(Value::as_str), phase, "{name}");
            assert!(
                status["containerStatuses"][0]["state"].get(state).is_some(),
                "{name}"
            );
        }
        // An exit never reported running is reported on top of the running status.
        let exited = terminated_status(&pod(), Some(running.clone()), 0, "", "t2", &once, false);
        assert_eq!(exited["podIP"], "10.64.1.2");
        assert_eq!(exited["startTime"], running["startTime"]);
        assert_eq!(exited["phase"], "Succeeded");
    }

    #[test]
    fn a_crash_label_asks_for_crashes_beyond_those_had() {
        let crashed: BTreeMap<String, u32> = [("worker".to_string(), 1)].into();
        let cases = [
            ("no label", json!({"app": "1"}), None),
            (
                "as many as had",
                json!({"sim.capstan.dev/crash-worker": "1"}),
                None,
            ),
            (
                "one more",
                json!({"sim.capstan.dev/crash-worker": "2"}),
                Some("worker"),
            ),
            (
                "another container",
                json!({"sim.capstan.dev/crash-leader": "1"}),
                Some("leader"),
            ),
            (
                "not a count",
                json!({"sim.capstan.dev/crash-leader": "yes"}),
                None,
            ),
        ];
        for (story, labels, expected) in cases {
            let labels = labels.as_object().cloned().unwrap_or_default();
            assert_eq!(
                next_crash(&labels, &crashed).as_deref(),
                expected,
                "{story}"
            );
        }
    }

    #[test]
    fn a_crashed_container_restarts_alone_with_its_count_and_last_state() {
        let mut pod = json!({"metadata": {"uid": "u1"}, "spec": {"containers": [
            {"name": "a", "image": "a:v1"}, {"name": "b", "image": "b:v1"}]}});
        pod["status"] = running_status(
            &pod,
            "10.64.1.2",
            "10.0.0.11",
            "t0",
            "t0",
            &Restarts::default(),
            true,
        );
        let ready = |status: &Value| {
            status["conditions"]
                .as_array()
                .expect("conditions")
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        };
        assert!(
            crashed_status(&pod, "c", 0, "t1").is_none(),
            "no such container"
        );

        let crashed = crashed_status(&pod, "b", 0, "t1").expect("b crashed");
        assert_eq!(crashed["phase"], "Running");
        assert!(!ready(&crashed));
        let b = &crashed["containerStatuses"][1];
        assert_eq!(
            (&b["ready"], &b["restartCount"]),
            (&json!(false), &json!(0))
        );
        assert_eq!(
            b["state"]["terminated"],
            json!({"exitCode": 1, "reason": "Error", "startedAt": "t0", "finishedAt": "t1",
                   "containerID": container_id(&pod, "b", 0)})
        );
        assert_eq!(
            crashed["containerStatuses"][0],
            pod["status"]["containerStatuses"][0]
        );

        pod["status"] = crashed;
        let restarted = restarted_status(&pod, "b", 1, "t2").expect("b restarted");
        assert!(ready(&restarted));
        let b = &restarted["containerStatuses"][1];
        assert_eq!(
            (&b["ready"], &b["restartCount"], &b["state"]),
            (
                &json!(true),
                &json!(1),
                &json!({"running": {"startedAt": "t2"}})
            )
        );
        assert_eq!(b["lastState"]["terminated"]["exitCode"], 1);
        assert_ne!(
            b["containerID"],
            pod["status"]["containerStatuses"][1]["containerID"]
        );
        assert_eq!(restarted["containerStatuses"][0]["restartCount"], 0);
        assert_eq!(
            Restarts {
                pod: 2,
                crashed: [("b".to_string(), 1)].into()
            }
            .of("b"),
            3
        );
    }

    #[test]
    fn workers_are_recognised_by_their_labels() {
        let mut worker = pod();
        worker["metadata"]["labels"] =
            json!({labels::COMPONENT_LABEL: "worker", labels::WORKER_ACTION_LABEL: "Load"});
        assert!(is_worker(&worker));
        assert!(!is_worker(&pod()));
    }

    #[test]
    fn conditions_change_their_transition_time_only_on_change() {
        let mut status = json!({});
        set_condition(&mut status, "Ready", true, "t1");
        set_condition(&mut status, "Ready", true, "t2");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t1");
        set_condition(&mut status, "Ready", false, "t3");
        assert_eq!(status["conditions"][0]["lastTransitionTime"], "t3");
    }

    /// The simulation of `config` (YAML) over `api`, its one node `n1` registered.
    fn simulation(api: &Arc<crate::api::Api>, config: &str) -> Arc<Simulation> {
        let config = ClusterConfig::parse(config, "test").expect("config");
        let sim = Arc::new(Simulation {
            api: api.clone(),
            node_order: std::sync::Mutex::new(crate::sim::NodeOrder::new(vec!["n1".into()])),
            config,
            history: std::sync::Mutex::new(std::collections::VecDeque::new()),
        });
        sim.register_nodes().expect("node registered");
        sim
    }

    /// A container that exits before the kubelet relists is reported once, exited, with
    /// everything its start set; with relists every 0 s its start is reported too.
    #[tokio::test]
    async fn a_container_exiting_between_relists_is_reported_only_exited() {
        for (relist, writes) in [
            ("1", vec!["Succeeded"]),
            ("0", vec!["Running", "Succeeded"]),
        ] {
            let cluster = super::super::workload_controller::testing::cluster().await;
            let api = cluster.api().clone();
            let yaml = format!("nodes:\n  - name: n1\ntiming: {{relistSeconds: {relist}}}\n");
            let sim = simulation(&api, &yaml);
            let mut changes = api.store.subscribe();
            let pods = api.registry.get("", "v1", "pods").expect("pods");
            let body = json!({
                "metadata": {"name": "job", "namespace": "default",
                             "annotations": {EXIT_AFTER_ANNOTATION: "0.01"}},
                "spec": {"nodeName": "n1", "restartPolicy": "Never",
                         "containers": [{"name": "app", "image": "app:v1"}]},
            });
            api.create(&pods, "default", body, &Default::default())
                .expect("pod created");
            let key = ObjectKey::new("pods", "default", "job");
            let mut kubelet = Kubelet::new(sim);
            let mut seen = Vec::new();
            while let Ok(change) = changes.try_recv() {
                kubelet.observe(&change);
            }
            kubelet.start(&key).await.expect("started");
            exit_one(&mut kubelet, &key);
            let mut last = Value::Null;
            while let Ok(change) = changes.try_recv() {
                if change.key == key {
                    last = change.value().clone();
                    seen.push(last["status"]["phase"].as_str().unwrap_or("").to_string());
                }
            }
            assert_eq!(seen, writes, "relist {relist}");
            let status = &last["status"];
            assert!(status["podIP"].is_string(), "relist {relist}: {status}");
            assert!(status["startTime"].is_string(), "relist {relist}: {status}");
            assert_eq!(
                status["containerStatuses"][0]["state"]["terminated"]["reason"], "Completed",
                "relist {relist}"
            );
        }
    }

    /// A pod that runs to completion fails with code 1 on a node its fail-on-nodes
    /// annotation names, and exits as its exit-code annotation says on any other; a pod
    /// whose containers restart `Always` ignores it; a pod without exit-after never exits.
    #[tokio::test]
    async fn a_pod_fails_on_the_nodes_its_annotation_names() {
        let failed = "failed on n1 (sim.capstan.dev/fail-on-nodes)";
        // (fail-on-nodes, restartPolicy, exit-code, phase, state, exit code, reason, message)
        for (nodes, policy, code, phase, state, exit, reason, message) in [
            ("n2,n1", "Never", "0", "Failed", "state", 1, "Error", failed),
            (
                " n0 , n1 ",
                "Never",
                "0",
                "Failed",
                "state",
                1,
                "Error",
                failed,
            ),
            ("n2", "Never", "0", "Succeeded", "state", 0, "Completed", ""),
            ("n2,n11,", "Never", "3", "Failed", "state", 3, "Error", ""),
            ("", "Never", "0", "Succeeded", "state", 0, "Completed", ""),
            (
                "n1",
                "OnFailure",
                "0",
                "Running",
                "lastState",
                1,
                "Error",
                failed,
            ),
            (
                "n1",
                "Always",
                "0",
                "Running",
                "lastState",
                0,
                "Completed",
                "",
            ),
        ] {
            let case = format!("{nodes:?} {policy}");
            let cluster = super::super::workload_controller::testing::cluster().await;
            let api = cluster.api().clone();
            let sim = simulation(&api, "nodes:\n  - name: n1\ntiming: {relistSeconds: 1}\n");
            let mut changes = api.store.subscribe();
            let pods = api.registry.get("", "v1", "pods").expect("pods");
            let body = json!({
                "metadata": {"name": "check", "namespace": "default",
                             "annotations": {EXIT_AFTER_ANNOTATION: "0.01",
                                             EXIT_CODE_ANNOTATION: code,
                                             FAIL_ON_NODES_ANNOTATION: nodes}},
                "spec": {"nodeName": "n1", "restartPolicy": policy,
                         "containers": [{"name": "app", "image": "app:v1"}]},
            });
            api.create(&pods, "default", body, &Default::default())
                .expect("pod created");
            let key = ObjectKey::new("pods", "default", "check");
            let mut kubelet = Kubelet::new(sim);
            while let Ok(change) = changes.try_recv() {
                kubelet.observe(&change);
            }
            kubelet.start(&key).await.expect("started");
            exit_one(&mut kubelet, &key);
            let mut last = Value::Null;
            while let Ok(change) = changes.try_recv() {
                if change.key == key {
                    last = change.value().clone();
                }
            }
            let status = &last["status"];
            assert_eq!(status["phase"], phase, "{case}: {status}");
            let terminated = &status["containerStatuses"][0][state]["terminated"];
            assert_eq!(terminated["exitCode"], exit, "{case}: {status}");
            assert_eq!(terminated["reason"], reason, "{case}: {status}");
            let said = terminated["message"].as_str().unwrap_or("");
            assert_eq!(said, message, "{case}: {status}");
        }

        // Without exit-after, a pod to fail runs on: no exit is due.
        let cluster = super::super::workload_controller::testing::cluster().await;
        let api = cluster.api().clone();
        let sim = simulation(&api, "nodes:\n  - name: n1\n");
        let mut changes = api.store.subscribe();
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let body = json!({
            "metadata": {"name": "check", "namespace": "default",
                         "annotations": {FAIL_ON_NODES_ANNOTATION: "n1"}},
            "spec": {"nodeName": "n1", "restartPolicy": "Never",
                     "containers": [{"name": "app", "image": "app:v1"}]},
        });
        api.create(&pods, "default", body, &Default::default())
            .expect("pod created");
        let key = ObjectKey::new("pods", "default", "check");
        let mut kubelet = Kubelet::new(sim);
        while let Ok(change) = changes.try_recv() {
            kubelet.observe(&change);
        }
        kubelet.start(&key).await.expect("started");
        assert!(
            kubelet.queue.iter().all(|due| due.0.action != Action::Exit),
            "an exit is due"
        );
        let mut last = Value::Null;
        while let Ok(change) = changes.try_recv() {
            if change.key == key {
                last = change.value().clone();
            }
        }
        assert_eq!(last["status"]["phase"], "Running", "{last}");
    }

    /// A worker whose run ends between two relists starts from the store's projection
    /// alone: nothing is written and nothing of the pod is held until its exit, which
    /// admits it (a worker that does not fit is rejected then, with the admission's
    /// reason) and reports the run once, with everything its start set.
    #[tokio::test]
    async fn a_worker_run_between_relists_reads_the_pod_only_at_its_exit() {
        for (selector, phase, reason) in [
            (json!({}), "Failed", None),
            (
                json!({"no": "such-label"}),
                "Failed",
                Some(placement::NODE_AFFINITY),
            ),
        ] {
            let cluster = super::super::workload_controller::testing::cluster().await;
            let api = cluster.api().clone();
            let sim = simulation(&api, "nodes:\n  - name: n1\ntiming: {relistSeconds: 1}\n");
            let mut changes = api.store.subscribe();
            let pods = api.registry.get("", "v1", "pods").expect("pods");
            let body = json!({
                "metadata": {"name": "w", "namespace": "default",
                             "labels": {labels::COMPONENT_LABEL: labels::WORKER_COMPONENT,
                                        labels::WORKER_ACTION_LABEL: "Load"}},
                "spec": {"nodeName": "n1", "restartPolicy": "Never", "nodeSelector": selector,
                         "containers": [{"name": "worker", "image": "worker:v1"}]},
            });
            api.create(&pods, "default", body, &Default::default())
                .expect("pod created");
            let key = ObjectKey::new("pods", "default", "w");
            let mut kubelet = Kubelet::new(sim);
            while let Ok(change) = changes.try_recv() {
                kubelet.observe(&change);
            }
            kubelet.start(&key).await.expect("started");
            let tracked = kubelet.pods.get(&key).expect("tracked");
            assert!(tracked.started && tracked.read.is_none(), "{reason:?}");
            assert!(
                matches!(tracked.unreported, Some(Unreported::Worker { .. })),
                "{reason:?}"
            );
            assert!(changes.try_recv().is_err(), "{reason:?}: the start wrote");
            exit_one(&mut kubelet, &key);
            let mut seen = Vec::new();
            while let Ok(change) = changes.try_recv() {
                if change.key == key {
                    seen.push(change.value().clone());
                }
            }
            assert_eq!(seen.len(), 1, "{reason:?}: one status write");
            let status = &seen[0]["status"];
            assert_eq!(status["phase"], phase, "{reason:?}: {status}");
            match reason {
                // Without a worker config the worker itself fails, after running.
                None => {
                    assert!(status["startTime"].is_string(), "{status}");
                    assert!(status["podIP"].is_string(), "{status}");
                    assert_eq!(
                        status["containerStatuses"][0]["state"]["terminated"]["exitCode"], 1,
                        "{status}"
                    );
                }
                Some(reason) => {
                    assert_eq!(status["reason"], reason, "{status}");
                    assert!(status.get("containerStatuses").is_none(), "{status}");
                }
            }
            assert!(!kubelet.pods.contains_key(&key), "{reason:?}: forgotten");
        }
    }

    /// Workers of one node that exit in the same turn run one after the other against its
    /// module table, written once for all of them; each pod gets its own result, and the
    /// node's history a step per worker that changed the table.
    #[tokio::test]
    async fn workers_exiting_together_share_one_module_table_write() {
        let cluster = super::super::workload_controller::testing::cluster().await;
        let api = cluster.api().clone();
        let sim = simulation(&api, "nodes:\n  - name: n1\ntiming: {relistSeconds: 1}\n");
        let mut changes = api.store.subscribe();
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let worker = |name: &str, module: Option<&str>| {
            let mut annotations = json!({});
            if let Some(module) = module {
                annotations[labels::WORKER_CONFIG_ANNOTATION] = json!(format!(
                    "kernelVersion: 6.0.15-300.fc37.x86_64\ncontainerImage: kmod:v1\n\
                     insecurePull: false\nimagePullPolicy: IfNotPresent\n\
                     modprobe:\n  moduleName: {module}\n  dirName: /opt\n"
                ));
            }
            json!({
                "metadata": {"name": name, "namespace": "default", "annotations": annotations,
                             "labels": {labels::COMPONENT_LABEL: labels::WORKER_COMPONENT,
                                        labels::WORKER_ACTION_LABEL: "Load"}},
                "spec": {"nodeName": "n1", "restartPolicy": "Never",
                         "containers": [{"name": "worker", "image": "worker:v1"}]},
            })
        };
        // Two loads, and a worker without its config between them, which fails alone.
        let workers = [("a", Some("mod_a")), ("broken", None), ("b", Some("mod_b"))];
        for (name, module) in workers {
            api.create(&pods, "default", worker(name, module), &Default::default())
                .expect("pod created");
        }
        let keys: Vec<ObjectKey> = workers
            .iter()
            .map(|(name, _)| ObjectKey::new("pods", "default", name))
            .collect();
        let mut kubelet = Kubelet::new(sim.clone());
        while let Ok(change) = changes.try_recv() {
            kubelet.observe(&change);
        }
        for key in &keys {
            kubelet.start(key).await.expect("started");
        }
        for result in kubelet.exit_all(&keys) {
            result.expect("exited");
        }
        let mut table_writes = 0;
        let mut phases = HashMap::new();
        while let Ok(change) = changes.try_recv() {
            match change.key.storage.as_str() {
                nodes::KERNELS => table_writes += 1,
                "pods" => {
                    let status = &change.value()["status"];
                    let code = &status["containerStatuses"][0]["state"]["terminated"]["exitCode"];
                    phases.insert(
                        change.key.name.clone(),
                        (status["phase"].clone(), code.clone()),
                    );
                }
                _ => {}
            }
        }
        assert_eq!(table_writes, 1, "one write of the node's module table");
        assert_eq!(phases["a"], (json!("Succeeded"), json!(0)));
        assert_eq!(phases["b"], (json!("Succeeded"), json!(0)));
        assert_eq!(phases["broken"], (json!("Failed"), json!(1)));
        let modules = sim.node("n1").expect("node").modules;
        assert!(
            modules.contains("mod_a") && modules.contains("mod_b"),
            "{modules:?}"
        );
        let history: Vec<Vec<String>> = sim
            .module_history()
            .iter()
            .map(|event| event.modules.iter().map(|m| m.name.clone()).collect())
            .collect();
        assert_eq!(history, [vec!["mod_a"], vec!["mod_a", "mod_b"]]);
    }

    /// The kubelet's status write starts from its own read of the pod while the store
    /// still holds the pod at that resourceVersion, and from the stored pod once another
    /// write moved it on: nothing that write changed is lost.
    #[tokio::test]
    async fn a_status_write_from_a_stale_read_keeps_the_later_write() {
        let cluster = super::super::workload_controller::testing::cluster().await;
        let api = cluster.api().clone();
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let body = json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "app:v1"}]},
        });
        api.create(&pods, "default", body, &Default::default())
            .expect("pod created");
        let key = ObjectKey::new("pods", "default", "p");
        let read = || {
            let stored = api.store.get(&key).expect("stored");
            Read {
                resource_version: stored.resource_version,
                object: stored.value(),
            }
        };
        let stale = read();
        let label = json!({"metadata": {"labels": {"a": "b"}}});
        api.patch(
            &pods,
            "default",
            "p",
            None,
            PatchType::Merge,
            label,
            &Default::default(),
        )
        .expect("labelled");
        let options = WriteOptions {
            field_manager: Some(KUBELET.into()),
            ..WriteOptions::default()
        };
        for (read, phase) in [(stale, "Running"), (read(), "Succeeded")] {
            let status = json!({"status": {"phase": phase}});
            api.merge_patch_read(
                &pods,
                "default",
                "p",
                Some("status"),
                &status,
                &options,
                Some(read),
            )
            .expect("status written");
            let pod = api.store.get(&key).expect("stored").value();
            assert_eq!(pod["metadata"]["labels"]["a"], "b", "{phase}");
            assert_eq!(pod["status"]["phase"], phase);
        }
    }

    /// A kubelet that reads the store's broadcast late sees its own "Running" write after
    /// the pod has already finished; it must not start the finished pod again.
    #[tokio::test]
    async fn a_late_change_does_not_start_a_finished_pod_again() {
        let cluster = super::super::workload_controller::testing::cluster().await;
        let api = cluster.api().clone();
        let sim = simulation(&api, "nodes:\n  - name: n1\n");
        let mut changes = api.store.subscribe();
        let pods = api.registry.get("", "v1", "pods").expect("pods");
        let body = json!({
            "metadata": {"name": "job", "namespace": "default"},
            "spec": {"nodeName": "n1", "restartPolicy": "Never",
                     "containers": [{"name": "app", "image": "app:v1"}]},
        });
        api.create(&pods, "default", body, &Default::default())
            .expect("pod created");
        let mut kubelet = Kubelet::new(sim);
        let key = ObjectKey {
            storage: "pods".into(),
            namespace: "default".into(),
            name: "job".into(),
        };
        let mut next = || loop {
            let change = changes.try_recv().expect("a change");
            if change.key == key {
                return change;
            }
        };
        let added = next();
        kubelet.observe(&added);
        kubelet.queue.clear();
        kubelet.start(&key).await.expect("started");
        let running = next();
        exit_one(&mut kubelet, &key);
        let succeeded = next();
        assert_eq!(succeeded.object.projection["status"]["phase"], "Succeeded");

        kubelet.queue.clear();
        kubelet.observe(&running);
        kubelet.observe(&succeeded);
        assert!(
            kubelet.pods.is_empty(),
            "the finished pod is not tracked again"
        );
        assert!(kubelet.queue.is_empty(), "nothing is scheduled for it");
    }
}
