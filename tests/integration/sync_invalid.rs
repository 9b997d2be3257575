//! A bad commit is rejected whole: nothing of it is applied, the last good commit stays,
//! and the problems (file, line, field) show in the status, an Event and the history.

use crate::common;

use capstan::sync::run::Outcome;
use capstan_api::{GitSync, HistoryRecord, RecordType};
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map, module};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{Api, ListParams};

async fn setting(client: &kube::Client, name: &str) -> Option<String> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    maps.get_opt(name)
        .await
        .unwrap()
        .map(|cm| cm.data.unwrap()["value"].clone())
}

#[tokio::test]
async fn an_invalid_commit_applies_nothing_and_the_last_good_one_stays() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let good = repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("module.yaml", Some(&module("my-kmod", "v1"))),
            ("cm.yaml", Some(&config_map("settings", "good"))),
        ],
        "Good fleet",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));

    // One valid change, one unknown field in a Module, one YAML syntax error.
    let bad = repo.commit(
        &[
            ("cm.yaml", Some(&config_map("settings", "bad"))),
            (
                "module.yaml",
                Some(&module("my-kmod", "v1").replace("moduleName:", "moduleNmae:")),
            ),
            ("broken.yaml", Some("kind: [unclosed\n")),
        ],
        "Break things (#7)",
    );
    let Outcome::Rejected { commit, errors } = syncer.sync().await.unwrap() else {
        panic!("expected a rejection");
    };
    assert_eq!(commit.sha, bad);
    assert_eq!(commit.pull_request, Some(7));
    assert!(
        errors.iter().any(|e| e.starts_with(
            "module.yaml:13: spec.moduleLoader.container.modprobe.moduleNmae: unknown field"
        )),
        "{errors:#?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("broken.yaml:")),
        "{errors:#?}"
    );
    assert_eq!(setting(&client, "settings").await.as_deref(), Some("good"));

    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, "Failed");
    assert_eq!(status.last_applied_commit.unwrap().sha, good);
    assert_eq!(status.last_attempted_commit.unwrap().sha, bad);
    assert!(status.error.contains("moduleNmae"), "{}", status.error);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "CommitRejected");

    let events: Api<Event> = Api::namespaced(client.clone(), "capstan-system");
    let rejected: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CommitRejected"))
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        rejected[0].metadata.annotations.as_ref().unwrap()["capstan.dev/pull-request"],
        "7"
    );
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    let kinds: Vec<RecordType> = records
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.spec.type_)
        .collect();
    assert!(kinds.contains(&RecordType::Rejected), "{kinds:?}");

    // The same bad head is not reported again at every interval.
    let before = common::cluster_revision(&client).await;
    assert_eq!(syncer.sync().await.unwrap(), Outcome::Unchanged);
    assert_eq!(common::cluster_revision(&client).await, before);

    // A fix applies, including the valid change of the rejected commit.
    repo.commit(
        &[
            ("module.yaml", Some(&module("my-kmod", "v1"))),
            ("broken.yaml", None),
        ],
        "Fix",
    );
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));
    assert_eq!(setting(&client, "settings").await.as_deref(), Some("bad"));
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, "Applied");
    assert!(status.error.is_empty());
}

#[tokio::test]
async fn an_object_the_api_server_refuses_rejects_the_whole_commit() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "good"))),
        ],
        "Good",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    assert!(matches!(syncer.sync().await.unwrap(), Outcome::Applied(_)));

    // Valid YAML the schema check leaves to the server: a Pod with no containers.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: kmm-demo\nspec:\n  containers: []\n";
    repo.commit(
        &[
            ("cm.yaml", Some(&config_map("settings", "changed"))),
            ("pod.yaml", Some(pod)),
        ],
        "Add a pod",
    );
    let Outcome::Rejected { errors, .. } = syncer.sync().await.unwrap() else {
        panic!("expected a rejection");
    };
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("pod.yaml:1: Pod kmm-demo/p:")),
        "{errors:#?}"
    );
    assert_eq!(setting(&client, "settings").await.as_deref(), Some("good"));
}
