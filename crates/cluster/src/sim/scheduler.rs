//! A scheduler for pods without a node: of the Ready, schedulable nodes whose selectors
//! and NoSchedule/NoExecute taints the pod fits, it binds the pod to the one with the
//! fewest pods (ties by name), as a spreading first fit. A pod that fits nowhere gets
//! PodScheduled=False/Unschedulable and is retried when nodes change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::{Value, json};

use super::nodes;
use super::placement;
use crate::api::{Api, PatchType, WriteOptions};
use crate::object_key::ObjectKey;
use crate::pointer::Pointer;
use crate::store::{Change, EventType, Followed};
use capstan_api::clock::rfc3339;

const MANAGER: &str = "default-scheduler";

/// Runs until the store closes.
pub async fn run(api: Arc<Api>) {
    let mut changes = api.store.follow();
    let mut scheduler = Scheduler {
        api,
        nodes: BTreeMap::new(),
        load: HashMap::new(),
        assumed: HashMap::new(),
        pending: BTreeSet::new(),
    };
    scheduler.resync();
    scheduler.schedule_pending();
    while let Some(followed) = changes.next().await {
        match followed {
            Followed::Change(change) => {
                if scheduler.observe(&change) {
                    scheduler.schedule_pending();
                }
            }
            Followed::Restart => {
                scheduler.resync();
                scheduler.schedule_pending();
            }
        }
    }
}

struct Scheduler {
    api: Arc<Api>,
    nodes: BTreeMap<String, Value>,
    /// Pods bound to each node.
    load: HashMap<String, usize>,
    /// Pods this scheduler bound whose binding it has not seen come back yet: counted in
    /// `load` already, so a burst of pods spreads (kube-scheduler's "assumed" pods).
    assumed: HashMap<ObjectKey, String>,
    /// Pods waiting for a node (retried when nodes change).
    pending: BTreeSet<ObjectKey>,
}

fn wants_scheduling(pod: &Value) -> bool {
    let unbound = pod
        .at("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    let ours = pod
        .at("/spec/schedulerName")
        .and_then(Value::as_str)
        .is_none_or(|s| s == MANAGER);
    let live = pod.at("/metadata/deletionTimestamp").is_none()
        && !matches!(
            pod.at("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
    unbound && ours && live
}

impl Scheduler {
    fn resync(&mut self) {
        self.nodes.clear();
        self.load.clear();
        self.assumed.clear();
        self.pending.clear();
        for node in self.api.store.list("nodes", None, None, None, None).items {
            let value = node.value();
            let name = value["metadata"]["name"].as_str().unwrap_or("").to_string();
            self.nodes.insert(name, value);
        }
        for pod in self.api.store.list("pods", None, None, None, None).items {
            let key = pod.key("pods");
            self.observe_pod(&key, None, Some(&pod.projection));
        }
    }

    fn unload(&mut self, node: &str) {
        if let Some(n) = self.load.get_mut(node) {
            *n = n.saturating_sub(1);
        }
    }

    /// Returns whether pending pods should be tried again.
    fn observe(&mut self, change: &Change) -> bool {
        match change.key.storage.as_str() {
            "nodes" => {
                match change.event {
                    EventType::Deleted => {
                        self.nodes.remove(&change.key.name);
                    }
                    _ => {
                        self.nodes
                            .insert(change.key.name.clone(), change.value().clone());
                    }
                }
                !self.pending.is_empty()
            }
            "pods" => {
                let after = (change.event != EventType::Deleted)
                    .then_some(change.object.projection.as_ref());
                self.observe_pod(&change.key, change.previous.as_deref(), after)
            }
            _ => false,
        }
    }

    fn observe_pod(
        &mut self,
        key: &ObjectKey,
        before: Option<&Value>,
        after: Option<&Value>,
    ) -> bool {
        let node_of = |p: Option<&Value>| {
            p.and_then(|p| p.at("/spec/nodeName"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        };
        let (old, new) = (node_of(before), node_of(after));
        let assumed = self.assumed.remove(key);
        if let Some(assumed) = &assumed
            && new.as_ref() != Some(assumed)
        {
            // The binding this scheduler counted did not happen as assumed.
            self.unload(assumed);
        }
        if old != new {
            if let Some(old) = &old {
                self.unload(old);
            }
            if let Some(new) = new
                && assumed.as_ref() != Some(&new)
            {
                *self.load.entry(new).or_default() += 1;
            }
        }
        match after {
            Some(pod) if wants_scheduling(pod) => {
                self.pending.insert(key.clone());
                true
            }
            _ => {
                self.pending.remove(key);
                false
            }
        }
    }

    fn schedule_pending(&mut self) {
        let keys: Vec<ObjectKey> = self.pending.iter().cloned().collect();
        for key in keys {
            let Some(pod) = self.api.store.get(&key).map(|o| o.value()) else {
                self.pending.remove(&key);
                continue;
            };
            if !wants_scheduling(&pod) {
                self.pending.remove(&key);
                continue;
            }
            match self.choose(&pod) {
                Ok(node) => {
                    if self.bind(&key, &node) {
                        self.pending.remove(&key);
                        *self.load.entry(node.clone()).or_default() += 1;
                        self.assumed.insert(key, node);
                    }
                }
                Err(reasons) => self.mark_unschedulable(&key, &pod, &reasons),
            }
        }
    }

    /// The least-loaded fitting node, or why none fits (upstream's "0/N nodes are available" summary).
    fn choose(&self, pod: &Value) -> Result<String, String> {
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut best: Option<(usize, &String)> = None;
        for (name, node) in &self.nodes {
            let why = if !nodes::is_ready(node) {
                Some("node(s) were not ready".to_string())
            } else if node.at("/spec/unschedulable").and_then(Value::as_bool) == Some(true)
                && !placement::tolerates_unschedulable(&pod["spec"])
            {
                Some("node(s) were unschedulable".to_string())
            } else {
                placement::fits(&pod["spec"], node).err().map(|u| u.message)
            };
            match why {
                Some(why) => *reasons.entry(why).or_default() += 1,
                None => {
                    let load = self.load.get(name).copied().unwrap_or(0);
                    if best.is_none_or(|(l, _)| load < l) {
                        best = Some((load, name));
                    }
                }
            }
        }
        match best {
            Some((_, name)) => Ok(name.clone()),
            None => {
                let summary: Vec<String> = reasons
                    .iter()
                    .map(|(why, n)| format!("{n} {why}"))
                    .collect();
                Err(format!(
                    "0/{} nodes are available: {}.",
                    self.nodes.len(),
                    summary.join(", ")
                ))
            }
        }
    }

    fn bind(&mut self, key: &ObjectKey, node: &str) -> bool {
        let Some(pods) = self.api.registry.get("", "v1", "pods") else {
            return false;
        };
        let options = WriteOptions {
            field_manager: Some(MANAGER.into()),
            ..WriteOptions::default()
        };
        match self.api.patch(
            &pods,
            &key.namespace,
            &key.name,
            None,
            PatchType::Merge,
            json!({"spec": {"nodeName": node}}),
            &options,
        ) {
            Ok(_) => true,
            Err(err) => {
                if !matches!(err.code, 404 | 409) {
                    tracing::warn!(%err, pod = %key.name, node, "binding a pod");
                }
                false
            }
        }
    }

    fn mark_unschedulable(&self, key: &ObjectKey, pod: &Value, message: &str) {
        let already = pod
            .at("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "PodScheduled" && c["message"] == message);
        if already {
            return;
        }
        let Some(pods) = self.api.registry.get("", "v1", "pods") else {
            return;
        };
        let options = WriteOptions {
            field_manager: Some(MANAGER.into()),
            ..WriteOptions::default()
        };
        let condition = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                               "lastProbeTime": null, "lastTransitionTime": rfc3339(self.api.clock.now())});
        let patch = json!({"status": {"conditions": [condition]}});
        if let Err(err) = self.api.patch(
            &pods,
            &key.namespace,
            &key.name,
            Some("status"),
            PatchType::Strategic,
            patch,
            &options,
        ) && !matches!(err.code, 404 | 409)
        {
            tracing::warn!(%err, pod = %key.name, "marking a pod unschedulable");
        }
    }
}
