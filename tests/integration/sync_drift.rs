//! Drift: a field capstan owns, changed by hand, is written back at the next sync and
//! reported (event, history, metric); with `drift: warn` it is only reported. Changes to
//! fields capstan does not own are not drift.

use crate::common;

use capstan::sync::run::Outcome;
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map, node_label};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

async fn edit_by_hand(client: &kube::Client, value: &str) {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    maps.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"value": value}})),
    )
    .await
    .unwrap();
}

async fn value(client: &kube::Client) -> String {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    maps.get("settings").await.unwrap().data.unwrap()["value"].clone()
}

async fn repo_with(settings: &str) -> FleetRepo {
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("capstan.yaml", Some(settings)),
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "from-git"))),
            ("w1.yaml", Some(&node_label("worker-1", "my-kmod", "v1"))),
            (
                "module.yaml",
                Some(&common::manifests::module("my-kmod", "v1")),
            ),
        ],
        "Fleet",
    );
    repo
}

#[tokio::test]
async fn a_hand_made_change_is_reverted_and_reported() {
    let (_cluster, client) = common::start_default_simulated().await;
    let repo = repo_with("drift: revert\n").await;
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));

    edit_by_hand(&client, "by-hand").await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v0",
                "team": "ml"}}})),
        )
        .await
        .unwrap();

    let Outcome::Drift(report) = syncer.sync().await.unwrap() else {
        panic!("expected drift");
    };
    assert_eq!(report.count("drift-reverted"), 2, "{report:?}");
    assert_eq!(value(&client).await, "from-git");
    let worker1 = nodes.get("worker-1").await.unwrap();
    let labels = worker1.metadata.labels.unwrap();
    assert_eq!(
        labels["kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod"],
        "v1"
    );
    assert_eq!(labels["team"], "ml", "fields capstan does not own stay");

    let events: Api<Event> = Api::namespaced(client.clone(), "capstan-system");
    let drift_events = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DriftFound"))
        .count();
    assert_eq!(drift_events, 1);

    // Once reverted, nothing more to do.
    assert_eq!(syncer.sync().await.unwrap(), Outcome::Unchanged);
}

#[tokio::test]
async fn with_drift_warn_a_hand_made_change_is_only_reported() {
    let (_cluster, client) = common::start_default_simulated().await;
    let repo = repo_with("drift: warn\n").await;
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));

    edit_by_hand(&client, "by-hand").await;
    let Outcome::Drift(report) = syncer.sync().await.unwrap() else {
        panic!("expected drift");
    };
    assert_eq!(report.count("drift-detected"), 1, "{report:?}");
    assert_eq!(report.count("drift-reverted"), 0);
    assert_eq!(value(&client).await, "by-hand");
    // Reported once, not at every interval; a new hand-made change is reported again.
    assert_eq!(syncer.sync().await.unwrap(), Outcome::Unchanged);
    edit_by_hand(&client, "by-hand-again").await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Drift(_)));
}

#[tokio::test]
async fn a_deleted_object_is_recreated_as_drift() {
    let (_cluster, client) = common::start_default_simulated().await;
    let repo = repo_with("drift: revert\n").await;
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    maps.delete("settings", &Default::default()).await.unwrap();
    let Outcome::Drift(report) = syncer.sync().await.unwrap() else {
        panic!("expected drift");
    };
    assert_eq!(report.count("drift-reverted"), 1);
    assert_eq!(value(&client).await, "from-git");
}
