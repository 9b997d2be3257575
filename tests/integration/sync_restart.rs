//! A restarted sync makes the decisions a sync that never stopped would have made: it
//! restores the state the next commit follows from the cluster, judges the commits that
//! landed meanwhile in turn, stamps each object with the commit that last changed it, and
//! does not report a rejected head again.

use crate::common;

use capstan::sync::run::Outcome;
use capstan_api::{GitSync, HistoryRecord, RecordType};
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map, module, node_label};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use kube::api::{Api, ListParams};

fn stamps(meta: &kube::api::ObjectMeta) -> (String, Option<String>) {
    let annotations = meta.annotations.clone().unwrap_or_default();
    (
        annotations
            .get("capstan.dev/revision")
            .cloned()
            .unwrap_or_default(),
        annotations.get("capstan.dev/pull-request").cloned(),
    )
}

fn revision(sha: &str) -> String {
    format!("main@sha1:{sha}")
}

/// The fleet with `my-kmod` at `version` and each worker's label.
fn fleet(version: &str, labels: [&str; 3]) -> Vec<(String, String)> {
    let mut files = vec![
        ("ns.yaml".to_string(), NAMESPACE.to_string()),
        ("module.yaml".to_string(), module("my-kmod", version)),
    ];
    for (i, label) in labels.iter().enumerate() {
        let node = format!("worker-{}", i + 1);
        files.push((
            format!("nodes/{node}.yaml"),
            node_label(&node, "my-kmod", label),
        ));
    }
    files
}

#[tokio::test]
async fn a_fleet_in_the_middle_of_an_upgrade_takes_new_commits_after_a_restart() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    repo.commit_set(&fleet("v1", ["v1", "v1", "v1"]), "Fleet (#1)");
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    repo.commit_set(&fleet("v2", ["v1", "v1", "v1"]), "Bump (#2)");
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    let relabel = repo.commit_set(&fleet("v2", ["v2", "v1", "v1"]), "Move worker-1 to v2 (#3)");
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));

    // A new process: the applied commit (Module v2, two nodes on v1) is the predecessor,
    // not a commit to judge again.
    drop(syncer);
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert_eq!(syncer.sync().await.unwrap(), Outcome::Unchanged);
    let next = repo.commit_set(&fleet("v2", ["v2", "v2", "v1"]), "Move worker-2 to v2 (#4)");
    let outcome = syncer.sync().await.unwrap();
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    let nodes: Api<Node> = Api::all(client.clone());
    let worker = |name: &'static str| {
        let nodes = nodes.clone();
        async move { stamps(&nodes.get(name).await.unwrap().metadata) }
    };
    assert_eq!(
        worker("worker-1").await,
        (revision(&relabel), Some("3".into()))
    );
    assert_eq!(
        worker("worker-2").await,
        (revision(&next), Some("4".into()))
    );
}

#[tokio::test]
async fn commits_that_land_while_capstan_is_down_are_each_credited_with_their_own_changes() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let mut files = fleet("v1", ["v1", "v1", "v1"]);
    files.push(("cm.yaml".into(), config_map("settings", "a")));
    let first = repo.commit_set(&files, "Fleet (#1)");
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    repo.commit(
        &[("module.yaml", Some(&module("my-kmod", "v2")))],
        "Bump (#9)",
    );
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    drop(syncer);

    // While capstan is down: worker-1 relabelled, then a commit touching only a ConfigMap,
    // then worker-3 released from the repository.
    let relabel = repo.commit(
        &[(
            "nodes/worker-1.yaml",
            Some(&node_label("worker-1", "my-kmod", "v2")),
        )],
        "Move worker-1 to v2 (#2)",
    );
    let settings = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "b")))],
        "Tune settings (#3)",
    );
    let release = repo.commit(&[("nodes/worker-3.yaml", None)], "Release worker-3 (#4)");

    let mut syncer = common::syncer(&client, repo.path()).await;
    let Outcome::Applied(report) = syncer.sync().await.unwrap() else {
        panic!("expected the head to be applied");
    };
    assert_eq!(report.commit.unwrap().sha, release);
    let nodes: Api<Node> = Api::all(client.clone());
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    let node = |name: &'static str| {
        let nodes = nodes.clone();
        async move { nodes.get(name).await.unwrap() }
    };
    assert_eq!(
        stamps(&node("worker-1").await.metadata),
        (revision(&relabel), Some("2".into()))
    );
    assert_eq!(
        stamps(&node("worker-2").await.metadata),
        (revision(&first), Some("1".into()))
    );
    assert_eq!(
        stamps(&maps.get("settings").await.unwrap().metadata),
        (revision(&settings), Some("3".into()))
    );
    // The released node lost its label and names the commit that released it.
    let released = node("worker-3").await;
    assert!(
        !released
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .contains_key("kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod")
    );
    assert_eq!(
        stamps(&released.metadata),
        (revision(&release), Some("4".into()))
    );
    // Each Node's Event names the commit that changed it.
    let events: Api<Event> = Api::all(client.clone());
    let labels_from_git: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LabelsFromGit"))
        .map(|e| {
            (
                e.involved_object.name.unwrap_or_default(),
                e.metadata.annotations.unwrap_or_default()["capstan.dev/pull-request"].clone(),
            )
        })
        .filter(|(_, pr)| pr != "1" && pr != "9")
        .collect();
    assert_eq!(
        labels_from_git,
        [
            ("worker-1".to_string(), "2".to_string()),
            ("worker-3".to_string(), "4".to_string())
        ]
    );
}

#[tokio::test]
async fn a_valid_commit_before_a_rejected_head_is_applied_and_the_head_reported_once() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "Fleet (#1)",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    drop(syncer);

    let good = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "b")))],
        "Tune settings (#2)",
    );
    let bad = repo.commit(&[("broken.yaml", Some("kind: [unclosed\n"))], "Oops (#3)");
    let mut syncer = common::syncer(&client, repo.path()).await;
    let Outcome::Rejected { commit, .. } = syncer.sync().await.unwrap() else {
        panic!("expected the head to be rejected");
    };
    assert_eq!(commit.sha, bad);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    let value = maps.get("settings").await.unwrap().data.unwrap()["value"].clone();
    assert_eq!(value, "b", "the valid commit before the head is applied");
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(status.last_applied_commit.unwrap().sha, good);
    assert_eq!(status.last_attempted_commit.unwrap().sha, bad);

    // Restarted on the same rejected head: nothing is judged, written or reported again.
    drop(syncer);
    let before = common::cluster_revision(&client).await;
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert_eq!(syncer.sync().await.unwrap(), Outcome::Unchanged);
    assert_eq!(common::cluster_revision(&client).await, before);
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    let rejected = records
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|r| r.spec.type_ == RecordType::Rejected)
        .count();
    assert_eq!(rejected, 1);
}
