//! An ordered upgrade end to end on the embedded cluster: Git commits that merge pull
//! requests, the sync, and every controller (Module -> NMC, NMC, device plugins, version
//! labels) in process, with the simulated kubelet running the real worker code.
//!
//! Three nodes run v1. Commit 2 bumps the Module to v2 (nothing moves on the nodes; a v2
//! device plugin appears). Commit 3 relabels worker-1, which goes through the four steps
//! while worker-2 and worker-3 stay untouched; commit 4 relabels both, which move one
//! after the other (`maxNodesInFlight: 1`). Every step's record names the commit and pull
//! request that asked for it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use capstan::api::{HistoryRecord, RecordType};
use capstan::cluster::sim::nodes::{self, KERNEL_GROUP, KERNEL_KIND, KERNEL_VERSION, KERNELS};
use capstan::controllers::{self, Context, Selection};
use common::git::FleetRepo;
use common::{DEADLINE, wait_until};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

const NS: &str = "kmm-demo";

fn module(version: &str) -> String {
    format!(
        r#"apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-demo
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  moduleLoader:
    container:
      version: "{version}"
      modprobe:
        moduleName: my_kmod
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "registry.example/org/my-kmod:{version}-${{KERNEL_FULL_VERSION}}"
  devicePlugin:
    container:
      image: "registry.example/org/my-kmod-device-plugin:{version}"
"#
    )
}

fn label(node: &str, version: &str) -> String {
    common::git::node_label(node, "my-kmod", version)
}

/// What happened on one node, in the cluster's resourceVersion order: its module table
/// (from its NodeKernel) and whether a device-plugin pod of the module runs there.
#[derive(Default)]
struct Timeline {
    /// resourceVersion -> (the my_kmod version loaded, if any) from the NodeKernel.
    modules: BTreeMap<u64, Option<String>>,
    /// resourceVersion -> (pod name, running) from the device-plugin pods.
    plugins: BTreeMap<u64, (String, bool)>,
}

fn rv(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Watches `node` and the device-plugin pods on it into a timeline.
fn record_timeline(client: &kube::Client, node: &str) -> Arc<Mutex<Timeline>> {
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let kind = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(KERNEL_GROUP, KERNEL_VERSION, KERNEL_KIND),
        KERNELS,
    );
    let kernels: Api<DynamicObject> = Api::all_with(client.clone(), &kind);
    let kernel_events = watcher(
        kernels,
        watcher::Config::default().fields(&format!("metadata.name={node}")),
    );
    let recorded = timeline.clone();
    tokio::spawn(kernel_events.for_each(move |event| {
        if let Ok(watcher::Event::Apply(kernel) | watcher::Event::InitApply(kernel)) = event {
            let value = serde_json::to_value(&kernel).expect("kernel json");
            let loaded = nodes::loaded_modules(&value)
                .get("my_kmod")
                .map(|m| m.version.clone().unwrap_or_default());
            recorded
                .lock()
                .expect("timeline")
                .modules
                .insert(rv(&kernel.metadata), loaded);
        }
        futures::future::ready(())
    }));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod_events = watcher(
        pods,
        watcher::Config::default()
            .labels("kmm.node.kubernetes.io/role=device-plugin")
            .fields(&format!("spec.nodeName={node}")),
    );
    let recorded = timeline.clone();
    tokio::spawn(pod_events.for_each(move |event| {
        let mut timeline = recorded.lock().expect("timeline");
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                let running = pod.metadata.deletion_timestamp.is_none()
                    && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                timeline.plugins.insert(
                    rv(&pod.metadata),
                    (pod.metadata.name.clone().unwrap_or_default(), running),
                );
            }
            Ok(watcher::Event::Delete(pod)) => {
                // A deletion's own resourceVersion comes after the pod's last state.
                timeline.plugins.insert(
                    rv(&pod.metadata) + 1,
                    (pod.metadata.name.clone().unwrap_or_default(), false),
                );
            }
            _ => {}
        }
        futures::future::ready(())
    }));
    timeline
}

/// Replays a timeline: the sequence of loaded versions, and whether a device plugin ever
/// ran while the module was not loaded.
fn replay(timeline: &Timeline) -> (Vec<Option<String>>, Vec<String>) {
    let mut events: Vec<(u64, bool, String)> = Vec::new();
    for (rv, loaded) in &timeline.modules {
        events.push((*rv, true, loaded.clone().unwrap_or_default()));
    }
    for (rv, (pod, running)) in &timeline.plugins {
        events.push((*rv, false, format!("{pod}={running}")));
    }
    events.sort();
    let mut versions: Vec<Option<String>> = Vec::new();
    let mut loaded: Option<String> = None;
    let mut running: BTreeMap<String, bool> = BTreeMap::new();
    let mut violations = Vec::new();
    // Before the first NodeKernel state (the initial list gives each object its last
    // resourceVersion) nothing is known about the module.
    let mut known = false;
    for (rv, is_node, what) in events {
        if is_node {
            known = true;
            loaded = Some(what).filter(|v| !v.is_empty());
            if versions.last() != Some(&loaded) {
                versions.push(loaded.clone());
            }
        } else {
            let (pod, state) = what.split_once('=').expect("pod=state");
            running.insert(pod.to_string(), state == "true");
        }
        if known && loaded.is_none() && running.values().any(|r| *r) {
            violations.push(format!(
                "at resourceVersion {rv} a device plugin runs without the module"
            ));
        }
    }
    (versions, violations)
}

/// The upgrade-step records of `node` towards `version`, oldest first.
async fn step_records(client: &kube::Client, node: &str, version: &str) -> Vec<HistoryRecord> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    let mut records: Vec<HistoryRecord> = api
        .list(&ListParams::default())
        .await
        .expect("records")
        .items
        .into_iter()
        .filter(|r| {
            r.spec.type_ == RecordType::UpgradeStep
                && r.spec.node.as_deref() == Some(node)
                && r.spec.to_version.as_deref() == Some(version)
        })
        .collect();
    records.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    records
}

fn steps(records: &[HistoryRecord]) -> Vec<String> {
    records.iter().filter_map(|r| r.spec.step.clone()).collect()
}

async fn converged(client: &kube::Client) {
    let selection = Selection::all();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let pending = controllers::converge::check(client, &selection)
            .await
            .expect("check");
        if pending.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged: {pending:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_move_one_at_a_time_through_the_four_steps_of_their_commit() {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let settings = "maxNodesInFlight: 1\n";
    let nodes = ["worker-1", "worker-2", "worker-3"];
    let mut files: Vec<(String, String)> = vec![
        ("capstan.yaml".into(), settings.into()),
        ("namespace.yaml".into(), common::git::NAMESPACE.into()),
        ("module.yaml".into(), module("v1")),
    ];
    for node in nodes {
        files.push((format!("nodes/{node}.yaml"), label(node, "v1")));
    }
    let changes: Vec<(&str, Option<&str>)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), Some(c.as_str())))
        .collect();
    repo.commit(&changes, "Merge pull request #1 from fleet/initial");
    let mut syncer = common::syncer(&client, repo.path()).await;
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let running = tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    syncer.sync().await.expect("first sync");
    converged(&client).await;
    let timeline = record_timeline(&client, "worker-1");
    let sim = cluster.simulation().expect("simulation").clone();
    let loaded_version = |node: &str| {
        sim.node(node)
            .ok()
            .and_then(|s| s.modules.get("my_kmod").cloned())
            .and_then(|m| m.version)
    };
    for node in nodes {
        assert_eq!(loaded_version(node).as_deref(), Some("v1"), "{node}");
    }

    // Commit 2: the Module at v2, version and images together. Nothing moves on the nodes;
    // the v2 device plugin appears beside v1's.
    repo.commit(
        &[("module.yaml", Some(&module("v2")))],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    syncer.sync().await.expect("sync of the bump");
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    wait_until("a v2 device-plugin DaemonSet beside v1's", || async {
        let names: Vec<String> = daemon_sets
            .list(&ListParams::default())
            .await
            .expect("daemon sets")
            .items
            .into_iter()
            .filter_map(|ds| ds.metadata.name)
            .collect();
        names.iter().any(|n| n.ends_with("-v2")) && names.iter().any(|n| n.ends_with("-v1"))
    })
    .await;
    converged(&client).await;
    for node in nodes {
        assert_eq!(
            loaded_version(node).as_deref(),
            Some("v1"),
            "{node} is untouched"
        );
        assert!(step_records(&client, node, "v2").await.is_empty(), "{node}");
    }

    // Commit 3: worker-1 moves to v2, through the four steps in order.
    let sha3 = repo.commit(
        &[("nodes/worker-1.yaml", Some(&label("worker-1", "v2")))],
        "Merge pull request #3 from fleet/worker-1-v2",
    );
    syncer.sync().await.expect("sync of worker-1");
    converged(&client).await;
    assert_eq!(loaded_version("worker-1").as_deref(), Some("v2"));
    for node in ["worker-2", "worker-3"] {
        assert_eq!(loaded_version(node).as_deref(), Some("v1"), "{node} waits");
        assert!(step_records(&client, node, "v2").await.is_empty(), "{node}");
    }
    let records = step_records(&client, "worker-1", "v2").await;
    assert_eq!(
        steps(&records),
        [
            "device-plugin-stopped",
            "old-module-unloaded",
            "new-module-loaded",
            "device-plugin-started"
        ]
    );
    for record in &records {
        assert_eq!(record.spec.commit.sha, sha3, "{record:?}");
        assert_eq!(record.spec.commit.pull_request, Some(3));
        assert_eq!(record.spec.from_version.as_deref(), Some("v1"));
        assert_eq!(record.spec.module.as_deref(), Some("kmm-demo/my-kmod"));
    }
    // From the cluster's own order of writes: v1, then nothing, then v2 (never two
    // versions), and no device plugin while the module is not loaded.
    wait_until("the timeline has seen v2 loaded", || async {
        timeline
            .lock()
            .expect("timeline")
            .modules
            .values()
            .any(|v| v.as_deref() == Some("v2"))
    })
    .await;
    let (versions, violations) = replay(&timeline.lock().expect("timeline"));
    assert_eq!(
        versions,
        [Some("v1".to_string()), None, Some("v2".to_string())]
    );
    assert!(violations.is_empty(), "{violations:?}");

    // Commit 4: worker-2 and worker-3 in one commit move strictly one after the other.
    let sha4 = repo.commit(
        &[
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
            ("nodes/worker-3.yaml", Some(&label("worker-3", "v2"))),
        ],
        "Merge pull request #4 from fleet/rest-v2",
    );
    syncer.sync().await.expect("sync of the rest");
    converged(&client).await;
    let second = step_records(&client, "worker-2", "v2").await;
    let third = step_records(&client, "worker-3", "v2").await;
    for records in [&second, &third] {
        assert_eq!(records.len(), 4, "{records:?}");
        for record in records.iter() {
            assert_eq!(record.spec.commit.sha, sha4);
            assert_eq!(record.spec.commit.pull_request, Some(4));
        }
    }
    let last_of_second = &second[3].spec.time;
    let first_of_third = &third[0].spec.time;
    assert!(
        last_of_second <= first_of_third,
        "worker-3 started ({first_of_third}) before worker-2 finished ({last_of_second})"
    );
    for node in nodes {
        assert_eq!(loaded_version(node).as_deref(), Some("v2"), "{node}");
    }
    wait_until("the v1 device plugin is gone", || async {
        !daemon_sets
            .list(&ListParams::default())
            .await
            .expect("daemon sets")
            .items
            .iter()
            .any(|ds| {
                ds.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-v1"))
            })
    })
    .await;
    stop.cancel();
    running.await.expect("controllers stop");
}
