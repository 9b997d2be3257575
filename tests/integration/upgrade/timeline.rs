//! What happened on each node during an ordered upgrade, in the cluster's own order of
//! writes (resourceVersions): the kernel module's loaded version, from the simulated
//! `NodeKernel` objects, and the device-plugin pods of the module, from their watch.
//! Replayed, it says whether a node ever went from one version to another without the
//! module being unloaded between, and whether a device plugin ran while its module was
//! not loaded.
//!
//! The watches survive an API server that goes away and comes back (restarted on its
//! state dir): a watch that has to list again has missed what happened meanwhile, so the
//! replay never reports what it cannot have seen. A pod gone by then is taken as stopped
//! right after the last change the watch saw (earlier than it was: this can hide, never
//! invent, a device plugin without its module), and versions either side of such a gap are
//! not taken to follow each other.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use capstan_api::nmc::NodeModulesConfig;
use capstan_cluster::sim::nodes::{self, KERNEL_GROUP, KERNEL_KIND, KERNEL_VERSION, KERNELS};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::utils::Backoff;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::Value;
use tokio::task::JoinHandle;

/// One node's timeline.
#[derive(Debug, Default)]
pub struct Timeline {
    /// (resourceVersion, the version loaded or none, whether a watch gap comes before it).
    modules: Vec<(u64, Option<String>, bool)>,
    /// (resourceVersion, device-plugin pod, running).
    plugins: Vec<(u64, String, bool)>,
}

/// A timeline replayed.
#[derive(Debug, Default, PartialEq)]
pub struct Replay {
    /// The versions loaded one after the other (`None`: not loaded).
    pub versions: Vec<Option<String>>,
    /// Each time two versions followed each other without an unload between, or a device
    /// plugin ran while the module was not loaded.
    pub violations: Vec<String>,
}

/// The timelines of every node, filled by watches that run until this is dropped.
pub struct Timelines {
    nodes: Arc<Mutex<BTreeMap<String, Timeline>>>,
    /// How many times a watch had to list again (an API server restart, a dropped watch
    /// too old to resume).
    relists: Arc<Mutex<usize>>,
    watches: Vec<JoinHandle<()>>,
}

impl Drop for Timelines {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// A lost watch is tried again every 100 ms, however often it was lost: after an API
/// server restart the timeline catches up at once (kube's default waits up to 30 s).
struct Retry;

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(100))
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {}
}

fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Watches the kernel module `kernel_module` (e.g. `my_kmod`) on every node and the
/// device-plugin pods of `namespace`. On the embedded cluster the loaded version is the
/// simulated kernel's; on a real server, where worker pods run no code, it is what each
/// node's NodeModulesConfig status says is loaded, as upstream KMM reads it.
pub fn watch(client: &kube::Client, namespace: &str, kernel_module: &str) -> Timelines {
    let nodes: Arc<Mutex<BTreeMap<String, Timeline>>> = Arc::default();
    let relists: Arc<Mutex<usize>> = Arc::default();
    let module_watch = if crate::common::on_real_server() {
        let kind = ApiResource::erase::<NodeModulesConfig>(&());
        let (namespace, kernel_module) = (namespace.to_string(), kernel_module.to_string());
        watch_loaded(client, &kind, &nodes, &relists, move |nmc| {
            nmc.pointer("/status/modules")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|entry| {
                    entry["namespace"] == namespace.as_str()
                        && entry.pointer("/config/modprobe/moduleName")
                            == Some(&Value::from(kernel_module.as_str()))
                })
                .map(|entry| entry["version"].as_str().unwrap_or_default().to_string())
        })
    } else {
        let kind = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(KERNEL_GROUP, KERNEL_VERSION, KERNEL_KIND),
            KERNELS,
        );
        let kernel_module = kernel_module.to_string();
        watch_loaded(client, &kind, &nodes, &relists, move |kernel| {
            nodes::loaded_modules(kernel)
                .get(&kernel_module)
                .map(|m| m.version.clone().unwrap_or_default())
        })
    };

    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod_events = watcher(
        pods,
        watcher::Config::default().labels("kmm.node.kubernetes.io/role=device-plugin"),
    )
    .backoff(Retry);
    let pod_watch = {
        let nodes = nodes.clone();
        let relists = relists.clone();
        let mut watch = PodWatch::default();
        tokio::spawn(pod_events.for_each(move |event| {
            if let Ok(event) = event
                && watch.on(&nodes, event)
            {
                *lock(&relists) += 1;
            }
            futures::future::ready(())
        }))
    };
    Timelines {
        nodes,
        relists,
        watches: vec![module_watch, pod_watch],
    }
}

/// Watches the objects of `kind`, one per node and named after it, recording on each
/// node's timeline the version `loaded` reads from the object (none: not loaded).
fn watch_loaded(
    client: &kube::Client,
    kind: &ApiResource,
    nodes: &Arc<Mutex<BTreeMap<String, Timeline>>>,
    relists: &Arc<Mutex<usize>>,
    loaded: impl Fn(&Value) -> Option<String> + Send + 'static,
) -> JoinHandle<()> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), kind);
    let events = watcher(api, watcher::Config::default()).backoff(Retry);
    let nodes = nodes.clone();
    let relists = relists.clone();
    let mut listed_before = false;
    let mut after_gap = false;
    tokio::spawn(events.for_each(move |event| {
        match event {
            Ok(watcher::Event::Init) => {
                after_gap = listed_before;
                if listed_before {
                    *lock(&relists) += 1;
                }
                listed_before = true;
            }
            Ok(watcher::Event::InitDone) => after_gap = false,
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                let value = serde_json::to_value(&object).expect("object json");
                let node = object.metadata.name.clone().unwrap_or_default();
                lock(&nodes).entry(node).or_default().modules.push((
                    rv(&object.metadata),
                    loaded(&value),
                    after_gap,
                ));
            }
            _ => {}
        }
        futures::future::ready(())
    }))
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// What the device-plugin pod watch knows.
#[derive(Default)]
struct PodWatch {
    /// Each pod's node and whether it runs, as last seen.
    known: BTreeMap<String, (String, bool)>,
    /// The last change seen.
    last_seen: u64,
    listed_before: bool,
    /// While the watch lists again: the pods listed so far, and the last change seen
    /// before the list.
    relisted: Option<(BTreeSet<String>, u64)>,
}

impl PodWatch {
    /// Takes in one event of the watch; true when the watch starts listing again.
    fn on(
        &mut self,
        nodes: &Mutex<BTreeMap<String, Timeline>>,
        event: watcher::Event<Pod>,
    ) -> bool {
        match event {
            watcher::Event::Init => {
                let again = self.listed_before;
                if again {
                    self.relisted = Some((BTreeSet::new(), self.last_seen));
                }
                self.listed_before = true;
                return again;
            }
            watcher::Event::InitApply(pod) => {
                if let Some((listed, _)) = self.relisted.as_mut() {
                    listed.insert(pod.metadata.name.clone().unwrap_or_default());
                }
                self.note(nodes, rv(&pod.metadata), &pod, running(&pod));
            }
            watcher::Event::InitDone => self.listed(nodes),
            watcher::Event::Apply(pod) => {
                self.note(nodes, rv(&pod.metadata), &pod, running(&pod));
            }
            watcher::Event::Delete(pod) => {
                // A deletion's own resourceVersion comes after the pod's last state.
                self.note(nodes, rv(&pod.metadata) + 1, &pod, false);
            }
        }
        false
    }

    fn note(
        &mut self,
        nodes: &Mutex<BTreeMap<String, Timeline>>,
        at: u64,
        pod: &Pod,
        running: bool,
    ) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        lock(nodes)
            .entry(node.clone())
            .or_default()
            .plugins
            .push((at, name.clone(), running));
        self.known.insert(name, (node, running));
        self.last_seen = self.last_seen.max(at);
    }

    /// A list is complete: a pod it lacks went while the watch was away, and is taken as
    /// stopped as early as it may have.
    fn listed(&mut self, nodes: &Mutex<BTreeMap<String, Timeline>>) {
        let Some((listed, seen_before)) = self.relisted.take() else {
            return;
        };
        let gap = seen_before + 1;
        let mut nodes = lock(nodes);
        for (pod, (node, running)) in self.known.iter_mut() {
            if *running && !listed.contains(pod) {
                *running = false;
                nodes
                    .entry(node.clone())
                    .or_default()
                    .plugins
                    .push((gap, pod.clone(), false));
            }
        }
    }
}

impl Timelines {
    /// Whether `node`'s timeline has seen `version` loaded.
    pub fn has_loaded(&self, node: &str, version: &str) -> bool {
        lock(&self.nodes).get(node).is_some_and(|timeline| {
            timeline
                .modules
                .iter()
                .any(|(_, loaded, _)| loaded.as_deref() == Some(version))
        })
    }

    /// The version loaded on `node` as the timeline last saw it (`Some(None)`: none).
    pub fn loaded(&self, node: &str) -> Option<Option<String>> {
        lock(&self.nodes).get(node).and_then(|timeline| {
            timeline
                .modules
                .iter()
                .max_by_key(|(at, _, _)| *at)
                .map(|(_, loaded, _)| loaded.clone())
        })
    }

    /// How many times a watch listed again.
    pub fn relists(&self) -> usize {
        *lock(&self.relists)
    }

    /// `node`'s timeline, one change a line, for a failure message.
    pub fn describe(&self, node: &str) -> String {
        let nodes = lock(&self.nodes);
        let Some(timeline) = nodes.get(node) else {
            return String::new();
        };
        let mut lines: Vec<(u64, String)> = timeline
            .modules
            .iter()
            .map(|(at, loaded, after_gap)| {
                let gap = if *after_gap { " (listed again)" } else { "" };
                (*at, format!("{at} module {loaded:?}{gap}"))
            })
            .chain(
                timeline
                    .plugins
                    .iter()
                    .map(|(at, pod, running)| (*at, format!("{at} {pod} running={running}"))),
            )
            .collect();
        lines.sort();
        lines
            .into_iter()
            .map(|(_, line)| line)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `node`'s timeline replayed.
    pub fn replay(&self, node: &str) -> Replay {
        lock(&self.nodes).get(node).map(replay).unwrap_or_default()
    }
}

/// Replays a timeline in resourceVersion order.
pub fn replay(timeline: &Timeline) -> Replay {
    enum Change<'a> {
        Plugin(&'a str, bool),
        Module(&'a Option<String>, bool),
    }
    let mut changes: Vec<(u64, u8, Change<'_>)> = Vec::new();
    for (at, loaded, after_gap) in &timeline.modules {
        changes.push((*at, 1, Change::Module(loaded, *after_gap)));
    }
    for (at, pod, running) in &timeline.plugins {
        changes.push((*at, 0, Change::Plugin(pod, *running)));
    }
    // At one resourceVersion, a pod's change before the module's (they cannot share one;
    // a deletion is placed just after the pod's last state).
    changes.sort_by_key(|(at, order, _)| (*at, *order));
    let mut replay = Replay::default();
    let mut running: BTreeMap<&str, bool> = BTreeMap::new();
    // Before the first NodeKernel state nothing is known about the module.
    let mut loaded: Option<&Option<String>> = None;
    for (at, _, change) in changes {
        match change {
            Change::Plugin(pod, state) => {
                running.insert(pod, state);
            }
            Change::Module(version, after_gap) => {
                let previous = loaded.replace(version);
                if replay.versions.last() != Some(version) {
                    if let Some(Some(before)) = previous
                        && version.is_some()
                        && !after_gap
                    {
                        replay.violations.push(format!(
                            "at resourceVersion {at} version {} replaced {before} without an unload",
                            version.as_deref().unwrap_or_default()
                        ));
                    }
                    replay.versions.push(version.clone());
                }
            }
        }
        if loaded == Some(&None) && running.values().any(|r| *r) {
            let pods: Vec<&str> = running
                .iter()
                .filter(|(_, r)| **r)
                .map(|(p, _)| *p)
                .collect();
            replay.violations.push(format!(
                "at resourceVersion {at} device plugin {pods:?} runs without the module"
            ));
        }
    }
    replay
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(name: &str, at: u64, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": at.to_string()},
            "spec": {"nodeName": "worker-1", "containers": []},
            "status": {"phase": phase},
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_gone_while_the_watch_was_away_stopped_right_after_what_it_saw() {
        let nodes = Mutex::new(BTreeMap::new());
        let mut watch = PodWatch::default();
        let events = [
            watcher::Event::Init,
            watcher::Event::InitApply(plugin("dp-v1", 130, "Running")),
            watcher::Event::InitDone,
            // The API server restarts; the list shows a new pod, not the old one.
            watcher::Event::Init,
            watcher::Event::InitApply(plugin("dp-v2", 290, "Pending")),
            watcher::Event::InitDone,
        ];
        let relists: Vec<bool> = events.into_iter().map(|e| watch.on(&nodes, e)).collect();
        assert_eq!(relists, [false, false, false, true, false, false]);
        let plugins = &lock(&nodes)["worker-1"].plugins;
        assert!(
            plugins.contains(&(131, "dp-v1".to_string(), false)),
            "{plugins:?}"
        );
    }

    #[test]
    fn a_plugin_running_over_an_unload_and_a_version_swap_are_violations() {
        let timeline = Timeline {
            modules: vec![
                (10, Some("v1".into()), false),
                (20, None, false),
                (30, Some("v2".into()), false),
                (40, Some("v3".into()), false),
                (50, Some("v4".into()), true),
            ],
            plugins: vec![(5, "dp-v1".into(), true), (21, "dp-v1".into(), false)],
        };
        let replay = replay(&timeline);
        assert_eq!(replay.versions.len(), 5);
        assert_eq!(replay.violations.len(), 2, "{:?}", replay.violations);
        assert!(replay.violations[0].contains("at resourceVersion 20"));
        assert!(replay.violations[1].contains("v3 replaced v2"));
    }
}
