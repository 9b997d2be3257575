//! Nodes are registered by kubelets, never by capstan. A Node in Git that the cluster does
//! not have (an autoscaler removed it, the machine died) is reported, not created; a node
//! that leaves, or stays NotReady past `notReadyTimeout`, in the middle of its upgrade
//! gives up its `maxNodesInFlight` slot with a record saying so, and the rest of the fleet
//! moves on.

use crate::common;
use crate::upgrade;

use capstan::controllers::{self, Context, Selection};
use capstan::sync::run::Outcome;
use capstan_api::labels::UPGRADE_ANNOTATION_PREFIX;
use capstan_api::{GitSync, HistoryRecord, RecordType};
use common::git::FleetRepo;
use common::{wait_for, wait_until};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use upgrade::{NS, label, module};

/// The finalizer that keeps a device-plugin pod, and so its node's upgrade, at its first
/// step: the version-label controller waits for the old device plugin to be gone.
const HOLD: &str = "capstan.dev/test-hold";

/// The controllers, in this process, until the token is cancelled.
fn run_controllers(client: &kube::Client) -> CancellationToken {
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    stop
}

async fn node_exists(client: &kube::Client, name: &str) -> bool {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .expect("read node")
        .is_some()
}

async fn delete_node(client: &kube::Client, name: &str) {
    Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete node");
    wait_until(&format!("node {name} gone"), async || {
        !node_exists(client, name).await
    })
    .await;
}

async fn records_of(client: &kube::Client, type_: RecordType) -> Vec<HistoryRecord> {
    upgrade::records(client)
        .await
        .into_iter()
        .filter(|r| r.spec.type_ == type_)
        .collect()
}

/// The steps recorded for `node`'s move to `version`.
async fn steps_of(client: &kube::Client, node: &str, version: &str) -> Vec<String> {
    upgrade::steps(&upgrade::step_records(client, node, version).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_is_reported_and_never_created_again() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let stop = run_controllers(&client);
    let mut syncer = common::syncer(&client, repo.path()).await;
    let outcome = syncer.sync().await.expect("first sync");
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    upgrade::converged(&client).await;

    // What a cluster autoscaler does, with nodes/worker-3.yaml still in Git.
    delete_node(&client, "worker-3").await;
    let outcome = syncer.sync().await.expect("sync");
    let Outcome::Drift(report) = &outcome else {
        panic!("the missing Node is reported: {outcome:?}")
    };
    let reported: Vec<_> = report
        .changes
        .iter()
        .map(|c| (c.action.as_str(), c.kind.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(reported, [("absent", "Node", "worker-3")]);
    assert!(
        !node_exists(&client, "worker-3").await,
        "capstan created a Node"
    );
    let sync = Api::<GitSync>::namespaced(client.clone(), "capstan-system")
        .get("capstan")
        .await
        .expect("GitSync");
    assert_eq!(
        sync.status.expect("status").unregistered_nodes,
        ["worker-3"]
    );
    let events = Api::<Event>::namespaced(client.clone(), "capstan-system")
        .list(&ListParams::default())
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("NodeAbsent")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("absent Node worker-3"))),
        "a Warning Event names the missing Node"
    );
    // Reported once, not at every interval.
    let again = syncer.sync().await.expect("sync");
    assert!(matches!(again, Outcome::Unchanged), "{again:?}");

    // The rest of the fleet moves on: a pull request moving worker-1 is carried out.
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
        ],
        "Merge pull request #2 from fleet/worker-1-v2",
    );
    let outcome = syncer.sync().await.expect("sync of #2");
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    wait_for("worker-1's four steps", async || {
        let steps = steps_of(&client, "worker-1", "v2").await;
        if steps == upgrade::STEPS {
            Ok(())
        } else {
            Err(steps)
        }
    })
    .await;
    upgrade::converged(&client).await;
    assert!(!node_exists(&client, "worker-3").await);
    stop.cancel();
}

/// Puts a finalizer on `node`'s v1 device-plugin pod of my-kmod.
async fn hold_device_plugin(client: &kube::Client, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let pod = wait_for(&format!("{node}'s device-plugin pod"), async || {
        let listed = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(|e| e.to_string())?;
        listed
            .items
            .into_iter()
            .find(|p| p.name_any().contains("device-plugin"))
            .ok_or("none yet".to_string())
    })
    .await;
    pods.patch(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [HOLD]}})),
    )
    .await
    .expect("hold the pod");
}

/// Lets every held pod go.
async fn release_device_plugins(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for pod in pods.list(&ListParams::default()).await.expect("pods").items {
        if pod.finalizers().iter().any(|f| f == HOLD) {
            pods.patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .expect("release the pod");
        }
    }
}

/// Whether `node`'s upgrade of my-kmod has started (its progress has a start time).
async fn upgrade_started(client: &kube::Client, node: &str) -> bool {
    let Some(node) = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .expect("read node")
    else {
        return false;
    };
    node.annotations().iter().any(|(key, value)| {
        key.starts_with(UPGRADE_ANNOTATION_PREFIX) && value.contains("startedAt")
    })
}

/// `node`'s kubelet stopped, and the node has been NotReady for an hour. On a real server
/// kwok stops playing the node's kubelet (which would report Ready again).
async fn report_not_ready(client: &kube::Client, node: &str) {
    let nodes = Api::<Node>::all(client.clone());
    if common::on_real_server() {
        kwok_plays(client, node, false).await;
    }
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    nodes
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready",
                "status": "False",
                "reason": "KubeletNotReady",
                "message": "container runtime is down",
                "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }]}})),
        )
        .await
        .expect("not ready");
}

/// Whether kwok plays `node`'s kubelet (on a real server).
async fn kwok_plays(client: &kube::Client, node: &str, plays: bool) {
    let value = plays.then_some("fake");
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                capstan_real_cluster::KWOK_NODE_ANNOTATION: value,
            }}})),
        )
        .await
        .expect("kwok annotation");
}

async fn report_ready(client: &kube::Client, node: &str) {
    if common::on_real_server() {
        kwok_plays(client, node, true).await;
    }
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            }]}})),
        )
        .await
        .expect("ready");
}

/// The released-slot record of `node`, with its step (`left` or `not-ready`).
async fn release_of(client: &kube::Client, node: &str) -> Result<HistoryRecord, String> {
    records_of(client, RecordType::SlotReleased)
        .await
        .into_iter()
        .find(|r| r.spec.node.as_deref() == Some(node))
        .ok_or(format!("no released-slot record of {node}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_leaves_or_stays_not_ready_mid_upgrade_gives_up_its_slot() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let stop = run_controllers(&client);
    let mut syncer = common::syncer(&client, repo.path()).await;
    syncer.sync().await.expect("first sync");
    upgrade::converged(&client).await;
    // worker-1 and worker-2 will hang at their first step; worker-3 will not.
    hold_device_plugin(&client, "worker-1").await;
    hold_device_plugin(&client, "worker-2").await;

    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
            ("nodes/worker-3.yaml", Some(&label("worker-3", "v2"))),
        ],
        "Merge pull request #2 from fleet/v2",
    );
    let outcome = syncer.sync().await.expect("sync of #2");
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    wait_until("worker-1 starts (the one slot)", async || {
        upgrade_started(&client, "worker-1").await
    })
    .await;
    assert!(!upgrade_started(&client, "worker-2").await);

    // worker-1 leaves in the middle of its upgrade: worker-2 gets the slot.
    delete_node(&client, "worker-1").await;
    let left = wait_for("worker-1's release", async || {
        release_of(&client, "worker-1").await
    })
    .await;
    assert_eq!(left.spec.step.as_deref(), Some("left"));
    assert_eq!(left.spec.commit.pull_request, Some(2));
    assert!(
        left.spec.message.contains("left the cluster"),
        "{}",
        left.spec.message
    );
    wait_until("worker-2 starts", async || {
        upgrade_started(&client, "worker-2").await
    })
    .await;

    // worker-2's kubelet stops reporting Ready: past notReadyTimeout, worker-3 gets the slot.
    report_not_ready(&client, "worker-2").await;
    let stalled = wait_for("worker-2's release", async || {
        release_of(&client, "worker-2").await
    })
    .await;
    assert_eq!(stalled.spec.step.as_deref(), Some("not-ready"));
    wait_for("worker-3's four steps", async || {
        let steps = steps_of(&client, "worker-3", "v2").await;
        if steps == upgrade::STEPS {
            Ok(())
        } else {
            Err(steps)
        }
    })
    .await;

    // worker-2 comes back: it takes the slot again and finishes as any node.
    report_ready(&client, "worker-2").await;
    release_device_plugins(&client).await;
    wait_for("worker-2's four steps", async || {
        let steps = steps_of(&client, "worker-2", "v2").await;
        if steps == upgrade::STEPS {
            Ok(())
        } else {
            Err(steps)
        }
    })
    .await;
    assert!(
        !node_exists(&client, "worker-1").await,
        "capstan created a Node"
    );
    // One record per release, whatever the reconciles.
    assert_eq!(records_of(&client, RecordType::SlotReleased).await.len(), 2);
    stop.cancel();
}
