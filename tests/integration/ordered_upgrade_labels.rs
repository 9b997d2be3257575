//! The ordered-upgrade version-label controller on the embedded cluster over HTTPS, running
//! alone: the test plays Git (the version label and the commit stamps on each Node) and the
//! other KMM controllers (the module's ready labels, the device-plugin pods), and checks that
//! the controller moves the internal labels in KMM's order, waits on both guards, records
//! every step against the node's commit and pull request, moves relabelled nodes one at a
//! time, holds changes that merged no pull request, and survives restarts.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use capstan::controllers::{self, Context};
use capstan_api::{GitSync, HistoryRecord, Module};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "kmm-demo";
const M: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";
const W: &str = "beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod";
const D: &str = "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod";
const READY: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready";
const VERSION_READY: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.version.ready";
const UPGRADE: &str = "capstan.dev/upgrade.kmm-demo.my-kmod";
const FIRST: &str = "1111111111111111111111111111111111111111";

// ---- the world ----

/// A cluster with Module `kmm-demo/my-kmod` at v2 (with a device plugin) and `nodes`
/// running v1: labels from Git (commit FIRST, pull request 1), the internal labels, the
/// ready labels and a running device-plugin pod each.
async fn world(nodes: &[&str]) -> (common::TestCluster, kube::Client) {
    let (cluster, client) = common::start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in [NS, "capstan-system"] {
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }
    let module: Module = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": NS},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "moduleLoader": {"container": {
                "version": "v2",
                "modprobe": {"moduleName": "my_kmod"},
                "kernelMappings": [{"regexp": "^.+$", "containerImage": "registry.example/my-kmod:v2"}],
            }},
            "devicePlugin": {"container": {"image": "registry.example/my-kmod-plugin:v2"}},
        },
    }))
    .unwrap();
    Api::<Module>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &module)
        .await
        .expect("module");
    let api: Api<Node> = Api::all(client.clone());
    for name in nodes {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {
                "node-role.kubernetes.io/worker": "",
                W: "v1", D: "v1", READY: "", VERSION_READY: "v1",
            }},
        }))
        .unwrap();
        api.create(&PostParams::default(), &node)
            .await
            .expect("node");
        git_labels(&client, name, Some("v1"), FIRST, Some(1)).await;
        start_device_plugin(&client, name, "v1").await;
    }
    (cluster, client)
}

/// What capstan's sync does when a commit changes the node's manifest: applies its labels
/// (field manager `capstan`) and stamps it with the commit and pull request.
async fn git_labels(
    client: &kube::Client,
    node: &str,
    version: Option<&str>,
    sha: &str,
    pull_request: Option<u64>,
) {
    let mut labels = serde_json::Map::new();
    if let Some(version) = version {
        labels.insert(M.into(), json!(version));
    }
    let mut annotations = serde_json::Map::new();
    annotations.insert("capstan.dev/revision".into(), json!(revision(sha)));
    if let Some(pr) = pull_request {
        annotations.insert("capstan.dev/pull-request".into(), json!(pr.to_string()));
    }
    let manifest = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "labels": labels, "annotations": annotations}});
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply("capstan").force(),
            &Patch::Apply(&manifest),
        )
        .await
        .expect("apply node labels");
}

fn revision(sha: &str) -> String {
    format!("main@sha1:{sha}")
}

/// What the NMC controller does: sets (or with `None` removes) the ready labels.
async fn module_loaded(client: &kube::Client, node: &str, version: Option<&str>) {
    let labels = match version {
        Some(version) => json!({READY: "", VERSION_READY: version}),
        None => json!({READY: null, VERSION_READY: null}),
    };
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("ready labels");
}

fn device_plugin_pod_name(node: &str) -> String {
    format!("my-kmod-device-plugin-{node}")
}

/// What the device-plugin DaemonSet does: a running pod on the node.
async fn start_device_plugin(client: &kube::Client, node: &str, version: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": device_plugin_pod_name(node), "labels": {
            "kmm.node.kubernetes.io/role": "device-plugin",
            "kmm.node.kubernetes.io/module.name": "my-kmod",
        }},
        "spec": {"nodeName": node, "containers": [
            {"name": "plugin", "image": format!("registry.example/my-kmod-plugin:{version}")}
        ]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("device-plugin pod");
    pods.patch_status(
        &device_plugin_pod_name(node),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .expect("pod running");
}

/// What the kubelet does once the pod's containers stopped: the pod goes.
async fn stop_device_plugin(client: &kube::Client, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let _ = pods.delete(&device_plugin_pod_name(node), &now).await;
}

async fn node(client: &kube::Client, name: &str) -> Node {
    Api::<Node>::all(client.clone())
        .get(name)
        .await
        .expect("node")
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(key).cloned()
}

fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(key).cloned()
}

async fn wait_for_label(client: &kube::Client, name: &str, key: &str, want: Option<&str>) {
    common::wait_until(&format!("{name} {key} = {want:?}"), || async {
        label(&node(client, name).await, key).as_deref() == want
    })
    .await;
}

/// The version-labels controller, alone, as `capstan sync --controllers version-labels`
/// runs it.
struct Controller {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    fn start(client: &kube::Client) -> Controller {
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let task = tokio::spawn(async move {
            controllers::run(ctx, &"version-labels".parse().unwrap()).await;
        });
        Controller { stop, task }
    }

    /// Stops it the way SIGTERM does: reconciles in flight finish.
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.expect("controller stops");
    }

    /// Stops it the way kill -9 does: wherever it is.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// The other KMM controllers, played in a loop: the device plugin goes when D goes and
/// comes back once D is set and the module loaded; the module is unloaded when W goes and
/// loaded (W's version) when W is set.
fn play_kmm(client: &kube::Client, nodes: &[&str]) -> tokio::task::JoinHandle<()> {
    let client = client.clone();
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
        loop {
            for name in &nodes {
                let node = node(&client, name).await;
                let pod = pods.get_opt(&device_plugin_pod_name(name)).await.unwrap();
                let (w, d) = (label(&node, W), label(&node, D));
                let loaded = label(&node, READY).is_some();
                if d.is_none() && pod.is_some() {
                    stop_device_plugin(&client, name).await;
                } else if w.is_none() && loaded {
                    module_loaded(&client, name, None).await;
                } else if let Some(w) = w.as_deref().filter(|_| !loaded) {
                    module_loaded(&client, name, Some(w)).await;
                } else if let Some(d) = d
                    .as_deref()
                    .filter(|d| loaded && pod.is_none() && Some(*d) == w.as_deref())
                {
                    start_device_plugin(&client, name, d).await;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
}

/// Every state the watched Nodes went through, with the cluster resourceVersion it had, and
/// the resourceVersion at which each device-plugin pod was deleted.
#[derive(Clone, Default)]
struct Log {
    nodes: Arc<Mutex<Vec<(u64, String, NodeState)>>>,
    pods_gone: Arc<Mutex<Vec<(u64, String)>>>,
    /// Watches that have listed once.
    listed: Arc<Mutex<u32>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct NodeState {
    w: Option<String>,
    d: Option<String>,
    ready: bool,
    upgrading: bool,
}

fn resource_version(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

impl Log {
    /// Starts watching; returns once both watches have listed what is there.
    async fn start(client: &kube::Client) -> Log {
        let log = Log::default();
        let nodes = log.nodes.clone();
        let listed = log.listed.clone();
        let node_watch = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .for_each(move |event| {
                match event {
                    Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                        let state = NodeState {
                            w: label(&node, W),
                            d: label(&node, D),
                            ready: label(&node, READY).is_some(),
                            upgrading: annotation(&node, UPGRADE)
                                .is_some_and(|a| a.contains("startedAt")),
                        };
                        let mut nodes = nodes.lock().unwrap();
                        let name = node.metadata.name.clone().unwrap_or_default();
                        let last = nodes.iter().rev().find(|(_, n, _)| *n == name);
                        if last.map(|(_, _, s)| s) != Some(&state) {
                            nodes.push((resource_version(&node.metadata), name, state));
                        }
                    }
                    Ok(watcher::Event::InitDone) => *listed.lock().unwrap() += 1,
                    _ => {}
                }
                futures::future::ready(())
            });
        tokio::spawn(node_watch);
        let pods_gone = log.pods_gone.clone();
        let listed = log.listed.clone();
        let pod_watch = watcher(
            Api::<Pod>::namespaced(client.clone(), NS),
            watcher::Config::default(),
        )
        .for_each(move |event| {
            match event {
                Ok(watcher::Event::Delete(pod)) => pods_gone.lock().unwrap().push((
                    resource_version(&pod.metadata),
                    pod.metadata.name.clone().unwrap_or_default(),
                )),
                Ok(watcher::Event::InitDone) => *listed.lock().unwrap() += 1,
                _ => {}
            }
            futures::future::ready(())
        });
        tokio::spawn(pod_watch);
        common::wait_until("the log's watches listing", || async {
            *log.listed.lock().unwrap() >= 2
        })
        .await;
        log
    }

    /// The resourceVersion of the first state of `node` that satisfies `check`.
    fn first(&self, node: &str, check: impl Fn(&NodeState) -> bool) -> u64 {
        self.nodes
            .lock()
            .unwrap()
            .iter()
            .find(|(_, name, state)| name == node && check(state))
            .map(|(rv, ..)| *rv)
            .unwrap_or_else(|| panic!("{node} never reached that state: {:?}", self.states(node)))
    }

    /// The states `node` went through, in order.
    fn states(&self, node: &str) -> Vec<NodeState> {
        let mut states: Vec<(u64, NodeState)> = self
            .nodes
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, name, _)| name == node)
            .map(|(rv, _, state)| (*rv, state.clone()))
            .collect();
        states.sort_by_key(|(rv, _)| *rv);
        states.into_iter().map(|(_, state)| state).collect()
    }

    /// The resourceVersion at which the device-plugin pod of `node` was last deleted.
    fn pod_gone(&self, node: &str) -> u64 {
        let pod = device_plugin_pod_name(node);
        self.pods_gone
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, name)| *name == pod)
            .map(|(rv, _)| *rv)
            .max()
            .unwrap_or_else(|| panic!("{pod} was never deleted"))
    }
}

async fn step_records(client: &kube::Client, node: &str) -> Vec<HistoryRecord> {
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    let mut records: Vec<HistoryRecord> = records
        .list(&ListParams::default().labels(&format!(
            "capstan.dev/record-type=UpgradeStep,capstan.dev/node={node}"
        )))
        .await
        .expect("records")
        .items;
    records.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    records
}

fn steps(records: &[HistoryRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| r.spec.step.clone().unwrap_or_default())
        .collect()
}

const ALL_STEPS: [&str; 4] = [
    "device-plugin-stopped",
    "old-module-unloaded",
    "new-module-loaded",
    "device-plugin-started",
];

/// The Events about `kind` `name` whose reason is one of `reasons`.
async fn events(client: &kube::Client, kind: &str, name: &str, reasons: &[&str]) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind)
                && e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref().is_some_and(|r| reasons.contains(&r))
        })
        .collect()
}

const STEP_REASONS: [&str; 4] = [
    "DevicePluginStopped",
    "OldModuleUnloaded",
    "NewModuleLoaded",
    "DevicePluginStarted",
];

async fn upgrade_over(client: &kube::Client, name: &str, version: &str) -> bool {
    let node = node(client, name).await;
    annotation(&node, UPGRADE).is_none()
        && label(&node, W).as_deref() == Some(version)
        && label(&node, D).as_deref() == Some(version)
        && step_records(client, name).await.len() == 4
}

// ---- the stories ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relabelled_node_goes_through_the_four_steps_in_order() {
    let (_cluster, client) = world(&["worker-1", "worker-2"]).await;
    let log = Log::start(&client).await;
    let controller = Controller::start(&client);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let second = "2222222222222222222222222222222222222222";

    // A merged pull request moves worker-1 to v2: its device plugin is stopped first.
    git_labels(&client, "worker-1", Some("v2"), second, Some(42)).await;
    wait_for_label(&client, "worker-1", D, None).await;
    let worker1 = node(&client, "worker-1").await;
    assert_eq!(
        label(&worker1, W).as_deref(),
        Some("v1"),
        "W waits for the pod"
    );

    // The pod terminates slowly (a finalizer holds it); W stays until it is gone.
    pods.patch(
        &device_plugin_pod_name("worker-1"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/slow-stop"]}})),
    )
    .await
    .unwrap();
    pods.delete(
        &device_plugin_pod_name("worker-1"),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    common::wait_until("the device-plugin pod terminating", || async {
        pods.get_opt(&device_plugin_pod_name("worker-1"))
            .await
            .unwrap()
            .is_some_and(|pod| pod.metadata.deletion_timestamp.is_some())
    })
    .await;
    pods.patch(
        &device_plugin_pod_name("worker-1"),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    stop_device_plugin(&client, "worker-1").await;
    wait_for_label(&client, "worker-1", W, None).await;

    // v1 is unloaded (ready labels gone); only then is W set to v2.
    assert!(label(&node(&client, "worker-1").await, READY).is_some());
    module_loaded(&client, "worker-1", None).await;
    wait_for_label(&client, "worker-1", W, Some("v2")).await;
    wait_for_label(&client, "worker-1", D, Some("v2")).await;

    // v2 is loaded, and its device plugin starts: the upgrade is over.
    module_loaded(&client, "worker-1", Some("v2")).await;
    start_device_plugin(&client, "worker-1", "v2").await;
    common::wait_until("worker-1 upgraded", || {
        upgrade_over(&client, "worker-1", "v2")
    })
    .await;

    // The labels moved in KMM's order, each guarded write after what it waits for.
    let removed_d = log.first("worker-1", |s| s.d.is_none());
    let removed_w = log.first("worker-1", |s| s.w.is_none());
    let unloaded = log.first("worker-1", |s| s.w.is_none() && !s.ready);
    let set_w = log.first("worker-1", |s| s.w.as_deref() == Some("v2"));
    let set_d = log.first("worker-1", |s| s.d.as_deref() == Some("v2"));
    assert!(removed_d < log.pod_gone("worker-1"));
    assert!(
        log.pod_gone("worker-1") < removed_w,
        "W removed only once the pod was gone"
    );
    assert!(unloaded < set_w, "W set only once the module was unloaded");
    assert!(set_w < set_d);

    // Four records, in order, each with worker-1's commit and pull request.
    let records = step_records(&client, "worker-1").await;
    assert_eq!(steps(&records), ALL_STEPS);
    for record in &records {
        let spec = &record.spec;
        assert_eq!(spec.module.as_deref(), Some("kmm-demo/my-kmod"));
        assert_eq!(spec.from_version.as_deref(), Some("v1"));
        assert_eq!(spec.to_version.as_deref(), Some("v2"));
        assert_eq!(spec.commit.sha, second);
        assert_eq!(spec.commit.revision, revision(second));
        assert_eq!(spec.commit.pull_request, Some(42));
        assert!(spec.duration_seconds.is_some_and(|d| d >= 0.0), "{spec:?}");
    }

    // An Event per step on the Node and on the Module, annotated with commit and step.
    for (kind, name) in [("Node", "worker-1"), ("Module", "my-kmod")] {
        let events = events(&client, kind, name, &STEP_REASONS).await;
        assert_eq!(events.len(), 4, "{kind}: {events:?}");
        for event in &events {
            let annotations = event.metadata.annotations.clone().unwrap_or_default();
            let want = BTreeMap::from([
                ("capstan.dev/revision", revision(second)),
                ("capstan.dev/pull-request", "42".to_string()),
                ("capstan.dev/module", "kmm-demo/my-kmod".to_string()),
                ("capstan.dev/from-version", "v1".to_string()),
                ("capstan.dev/to-version", "v2".to_string()),
            ]);
            for (key, value) in want {
                assert_eq!(annotations.get(key), Some(&value), "{key}: {event:?}");
            }
            assert!(annotations.contains_key("capstan.dev/upgrade-step"));
        }
    }

    // worker-2 was not relabelled: untouched.
    let worker2 = node(&client, "worker-2").await;
    for key in [W, D, VERSION_READY] {
        assert_eq!(label(&worker2, key).as_deref(), Some("v1"), "{key}");
    }
    assert_eq!(annotation(&worker2, UPGRADE), None);
    assert!(step_records(&client, "worker-2").await.is_empty());
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relabelled_nodes_move_one_after_the_other() {
    let (_cluster, client) = world(&["worker-1", "worker-2"]).await;
    let log = Log::start(&client).await;
    let kmm = play_kmm(&client, &["worker-1", "worker-2"]);

    // One commit relabels both nodes (found on start); maxNodesInFlight is 1 by default.
    let third = "3333333333333333333333333333333333333333";
    git_labels(&client, "worker-2", Some("v2"), third, Some(43)).await;
    git_labels(&client, "worker-1", Some("v2"), third, Some(43)).await;
    let controller = Controller::start(&client);
    common::wait_until("both nodes upgraded", || async {
        upgrade_over(&client, "worker-1", "v2").await
            && upgrade_over(&client, "worker-2", "v2").await
    })
    .await;
    kmm.abort();

    // worker-1 (first in name order) finished before worker-2 started.
    let worker1_done = log.first("worker-1", |s| {
        !s.upgrading && s.d.as_deref() == Some("v2") && s.w.as_deref() == Some("v2")
    });
    let worker2_started = log.first("worker-2", |s| s.upgrading || s.d.is_none());
    assert!(
        worker1_done < worker2_started,
        "worker-1: {:?}\nworker-2: {:?}",
        log.states("worker-1"),
        log.states("worker-2")
    );
    for name in ["worker-1", "worker-2"] {
        let records = step_records(&client, name).await;
        assert_eq!(steps(&records), ALL_STEPS, "{name}");
        assert!(
            records
                .iter()
                .all(|r| r.spec.commit.pull_request == Some(43))
        );
    }
    // worker-2 was told it waits, once.
    let queued = events(&client, "Node", "worker-2", &["UpgradeQueued"]).await;
    assert_eq!(queued.len(), 1, "{queued:?}");
    assert!(
        events(&client, "Node", "worker-1", &["UpgradeQueued"])
            .await
            .is_empty()
    );
    controller.stop().await;
}

/// A `GitSync` that applied `nodes`, with `policy` in its status.
async fn git_sync(client: &kube::Client, nodes: &[&str], policy: Value) {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let sync: GitSync = serde_json::from_value(json!({
        "apiVersion": "capstan.dev/v1alpha1", "kind": "GitSync",
        "metadata": {"name": "fleet", "namespace": "capstan-system"},
        "spec": {"repo": "https://git.example/fleet.git", "branch": "main"},
    }))
    .unwrap();
    syncs
        .create(&PostParams::default(), &sync)
        .await
        .expect("gitsync");
    let inventory: Vec<Value> = nodes
        .iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Node", "name": n, "digest": "0"}))
        .collect();
    syncs
        .patch_status(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Applied", "policy": policy,
                "inventory": inventory, "inventoryCount": nodes.len()}})),
        )
        .await
        .expect("gitsync status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_change_without_a_pull_request_is_not_acted_on() {
    let (_cluster, client) = world(&["worker-1"]).await;
    git_sync(
        &client,
        &["worker-1"],
        json!({"maxNodesInFlight": 1, "requirePullRequest": true}),
    )
    .await;
    let controller = Controller::start(&client);

    // A commit pushed straight to the branch relabels worker-1.
    let direct = "4444444444444444444444444444444444444444";
    git_labels(&client, "worker-1", Some("v2"), direct, None).await;
    common::wait_until("a warning about the missing pull request", || async {
        !events(&client, "Node", "worker-1", &["PullRequestRequired"])
            .await
            .is_empty()
    })
    .await;
    let warning = events(&client, "Node", "worker-1", &["PullRequestRequired"]).await;
    assert_eq!(warning[0].type_.as_deref(), Some("Warning"));
    assert!(
        warning[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("requirePullRequest") && m.contains("4444444")),
        "{warning:?}"
    );

    // Reconciled again (an unrelated label), it still holds, and says so only once.
    Api::<Node>::all(client.clone())
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/touched": "yes"}}})),
        )
        .await
        .unwrap();
    common::wait_until("the wait kept on the node", || async {
        annotation(&node(&client, "worker-1").await, UPGRADE)
            .is_some_and(|a| a.contains("pull-request"))
    })
    .await;
    let worker1 = node(&client, "worker-1").await;
    assert_eq!(label(&worker1, D).as_deref(), Some("v1"), "not moved");
    assert_eq!(label(&worker1, W).as_deref(), Some("v1"), "not moved");
    assert_eq!(
        events(&client, "Node", "worker-1", &["PullRequestRequired"])
            .await
            .len(),
        1
    );

    // The same label merged through a pull request: the node moves.
    let merged = "5555555555555555555555555555555555555555";
    git_labels(&client, "worker-1", Some("v2"), merged, Some(45)).await;
    wait_for_label(&client, "worker-1", D, None).await;
    controller.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_during_an_upgrade_record_each_step_once() {
    let (_cluster, client) = world(&["worker-1"]).await;
    let mut controller = Controller::start(&client);
    let kmm = play_kmm(&client, &["worker-1"]);
    let sixth = "6666666666666666666666666666666666666666";
    git_labels(&client, "worker-1", Some("v2"), sixth, Some(46)).await;

    // Stopped and started again after each step: once gracefully, then as kill -9 would.
    for done in 1..=3 {
        common::wait_until(&format!("{done} step(s) recorded"), || async {
            step_records(&client, "worker-1").await.len() >= done
        })
        .await;
        if done == 1 {
            controller.stop().await;
        } else {
            controller.kill().await;
        }
        controller = Controller::start(&client);
    }
    common::wait_until("worker-1 upgraded", || {
        upgrade_over(&client, "worker-1", "v2")
    })
    .await;
    kmm.abort();

    let records = step_records(&client, "worker-1").await;
    assert_eq!(steps(&records), ALL_STEPS, "one record per step");
    assert!(
        records
            .iter()
            .all(|r| r.spec.commit.revision == revision(sixth))
    );
    for kind_name in [("Node", "worker-1"), ("Module", "my-kmod")] {
        let events = events(&client, kind_name.0, kind_name.1, &STEP_REASONS).await;
        for reason in STEP_REASONS {
            let count = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .count();
            assert!(count <= 1, "{kind_name:?} {reason}: {count} events");
        }
    }
    controller.stop().await;
}

#[tokio::test]
async fn the_sync_hands_the_repository_policy_to_the_controller() {
    let (_cluster, client) = common::start().await;
    let mut repo = common::git::FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(common::manifests::NAMESPACE)),
            (
                "cm.yaml",
                Some(&common::manifests::config_map("settings", "a")),
            ),
            (
                "capstan.yaml",
                Some("maxNodesInFlight: 3\nrequirePullRequest: true\n"),
            ),
        ],
        "Fleet policy (#7)",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    syncer.sync().await.expect("sync");
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(
        status.policy,
        Some(capstan_api::UpgradePolicy {
            max_nodes_in_flight: 3,
            require_pull_request: true,
            ..capstan_api::UpgradePolicy::default()
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_resumes_at_the_right_step_after_each_restart() {
    let (_cluster, client) = world(&["worker-1"]).await;
    let seventh = "7777777777777777777777777777777777777777";
    let mut controller = Controller::start(&client);
    git_labels(&client, "worker-1", Some("v2"), seventh, Some(47)).await;
    wait_for_label(&client, "worker-1", D, None).await;

    // While capstan is down, the world moves on; each start picks up from there.
    controller.kill().await;
    stop_device_plugin(&client, "worker-1").await;
    controller = Controller::start(&client);
    wait_for_label(&client, "worker-1", W, None).await;
    assert_eq!(
        steps(&step_records(&client, "worker-1").await),
        ALL_STEPS[..1]
    );

    controller.stop().await;
    module_loaded(&client, "worker-1", None).await;
    controller = Controller::start(&client);
    wait_for_label(&client, "worker-1", W, Some("v2")).await;
    wait_for_label(&client, "worker-1", D, Some("v2")).await;
    assert_eq!(
        steps(&step_records(&client, "worker-1").await),
        ALL_STEPS[..2]
    );

    controller.kill().await;
    module_loaded(&client, "worker-1", Some("v2")).await;
    start_device_plugin(&client, "worker-1", "v2").await;
    controller = Controller::start(&client);
    common::wait_until("worker-1 upgraded", || {
        upgrade_over(&client, "worker-1", "v2")
    })
    .await;

    let records = step_records(&client, "worker-1").await;
    assert_eq!(steps(&records), ALL_STEPS);
    assert!(
        records
            .iter()
            .all(|r| r.spec.commit.pull_request == Some(47))
    );
    for reason in STEP_REASONS {
        assert_eq!(
            events(&client, "Node", "worker-1", &[reason]).await.len(),
            1,
            "{reason}"
        );
    }
    controller.stop().await;
}
