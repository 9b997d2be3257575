//! `capstan sync` applying commits of a real Git repository to the embedded cluster over
//! HTTP: the first sync, a change, pruning (Nodes only lose capstan's labels), and a
//! restart that resumes from the status in the cluster without writing.

use crate::common;

use capstan::sync::run::Outcome;
use capstan_api::{GitSync, HistoryRecord};
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map, module, node_label};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Node};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

fn label(node: &Node, key: &str) -> Option<String> {
    node.metadata.labels.as_ref()?.get(key).cloned()
}

fn annotation(node: &Node, key: &str) -> Option<String> {
    node.metadata.annotations.as_ref()?.get(key).cloned()
}

const VERSION_LABEL: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";

fn report(outcome: Outcome) -> capstan::sync::run::Report {
    match outcome {
        Outcome::Applied(report) => report,
        other => panic!("expected an applied commit, got {other:?}"),
    }
}

#[tokio::test]
async fn commits_are_applied_changed_and_pruned() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let first = repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("module.yaml", Some(&module("my-kmod", "v1"))),
            ("cm.yaml", Some(&config_map("settings", "a"))),
            (
                "nodes/w1.yaml",
                Some(&node_label("worker-1", "my-kmod", "v1")),
            ),
            (
                "nodes/w2.yaml",
                Some(&node_label("worker-2", "my-kmod", "v1")),
            ),
        ],
        "Fleet on my-kmod v1 (#1)",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;

    // First sync: everything created, Nodes labelled and stamped with the commit and PR.
    let applied = report(syncer.sync().await.expect("sync"));
    assert_eq!(applied.count("created"), 3, "{applied:?}");
    assert_eq!(applied.count("configured"), 2, "{applied:?}");
    let nodes: Api<Node> = Api::all(client.clone());
    let worker1 = nodes.get("worker-1").await.unwrap();
    assert_eq!(label(&worker1, VERSION_LABEL).as_deref(), Some("v1"));
    assert_eq!(
        annotation(&worker1, "capstan.dev/revision"),
        Some(format!("main@sha1:{first}"))
    );
    assert_eq!(
        annotation(&worker1, "capstan.dev/pull-request").as_deref(),
        Some("1")
    );
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(status.phase, "Applied");
    assert_eq!(status.last_applied_commit.unwrap().sha, first);
    assert_eq!(status.inventory.len(), 5);
    assert_eq!(status.runs.len(), 1);

    // A change to one object writes that object only.
    let before = common::cluster_revision(&client).await;
    let second = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "b")))],
        "Tune settings",
    );
    let changed = report(syncer.sync().await.expect("sync"));
    assert_eq!(
        changed
            .changes
            .iter()
            .map(|c| (c.action.as_str(), c.name.as_str()))
            .collect::<Vec<_>>(),
        [("configured", "settings")]
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    let settings = maps.get("settings").await.unwrap();
    assert_eq!(settings.data.unwrap()["value"], "b");
    assert_ne!(common::cluster_revision(&client).await, before);
    assert_eq!(
        settings.metadata.annotations.unwrap()["capstan.dev/revision"],
        format!("main@sha1:{second}")
    );
    // Objects the commit did not change keep the commit that last changed them.
    let worker1 = nodes.get("worker-1").await.unwrap();
    assert_eq!(
        annotation(&worker1, "capstan.dev/revision"),
        Some(format!("main@sha1:{first}"))
    );

    // Someone else's label on a Node survives capstan releasing its own.
    nodes
        .patch(
            "worker-2",
            &PatchParams::apply("ops-team"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "worker-2", "labels": {"team": "ml"}}})),
        )
        .await
        .unwrap();
    let retire = repo.commit(
        &[("cm.yaml", None), ("nodes/w2.yaml", None)],
        "Retire settings and worker-2's label",
    );
    let pruned = report(syncer.sync().await.expect("sync"));
    assert_eq!(pruned.count("pruned"), 1, "{pruned:?}");
    assert_eq!(pruned.count("released"), 1, "{pruned:?}");
    assert!(maps.get_opt("settings").await.unwrap().is_none());
    let worker2 = nodes.get("worker-2").await.unwrap();
    assert_eq!(label(&worker2, VERSION_LABEL), None);
    // It keeps only the stamps of the commit that released it, which asked for what the
    // loss of its labels sets off.
    assert_eq!(
        annotation(&worker2, "capstan.dev/revision"),
        Some(format!("main@sha1:{retire}"))
    );
    assert_eq!(label(&worker2, "team").as_deref(), Some("ml"));
    assert_eq!(
        label(&worker2, "node-role.kubernetes.io/worker").as_deref(),
        Some("")
    );
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert_eq!(status.inventory.len(), 3);
    assert_eq!(status.runs.len(), 3);
    assert_eq!(status.runs[0].pruned, 2);

    // Every commit has a history record and an Event annotated with its revision.
    let records: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    assert_eq!(
        records
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "capstan-system");
    let synced: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Synced"))
        .collect();
    assert_eq!(synced.len(), 3);
    assert!(synced.iter().any(|e| {
        e.metadata.annotations.as_ref().unwrap()["capstan.dev/revision"]
            == format!("main@sha1:{first}")
            && e.metadata.annotations.as_ref().unwrap()["capstan.dev/pull-request"] == "1"
    }));
}

#[tokio::test]
async fn a_restart_resumes_from_the_cluster_without_writing() {
    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("module.yaml", Some(&module("my-kmod", "v1"))),
            ("cm.yaml", Some(&config_map("settings", "a"))),
            (
                "nodes/w1.yaml",
                Some(&node_label("worker-1", "my-kmod", "v1")),
            ),
        ],
        "Fleet",
    );
    let mut first = common::syncer(&client, repo.path()).await;
    report(first.sync().await.expect("sync"));
    assert_eq!(first.sync().await.expect("sync"), Outcome::Unchanged);
    drop(first);

    let before = common::cluster_revision(&client).await;
    let mut restarted = common::syncer(&client, repo.path()).await;
    assert!(restarted.applied_commit().is_some());
    assert_eq!(restarted.sync().await.expect("sync"), Outcome::Unchanged);
    assert_eq!(
        common::cluster_revision(&client).await,
        before,
        "a restart with nothing new must not write"
    );

    // The restarted syncer still knows what it owns: removing a file prunes it.
    repo.commit(&[("cm.yaml", None)], "Drop settings");
    let pruned = report(restarted.sync().await.expect("sync"));
    assert_eq!(pruned.count("pruned"), 1);
}

#[tokio::test]
async fn crds_in_a_commit_are_served_before_their_objects_are_applied() {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    let crd = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer}
"#;
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n  namespace: kmm-demo\nspec:\n  size: 3\n";
    repo.commit(
        &[
            ("a-widget.yaml", Some(widget)),
            ("crd.yaml", Some(crd)),
            ("ns.yaml", Some(NAMESPACE)),
        ],
        "Widgets",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    let applied = report(syncer.sync().await.expect("sync"));
    assert_eq!(applied.count("created"), 3, "{applied:?}");
}

/// A commit that removes a namespace with its Modules: the Modules go first and the
/// namespace waits, still owned, until their modules are unloaded (a namespace being
/// deleted refuses the unloader pods); the next sync deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_leaving_git_waits_until_its_modules_are_unloaded() {
    use capstan::controllers::{self, Context};
    use capstan_api::module::Module;
    use capstan_api::nmc::NodeModulesConfig;
    use k8s_openapi::api::core::v1::Namespace;

    let (_cluster, client) = common::start_default_simulated().await;
    let stop = tokio_util::sync::CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let selection: controllers::Selection = "module-nmc,nmc".parse().expect("selection");
    let running = tokio::spawn(async move { controllers::run(ctx, &selection).await });

    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("module.yaml", Some(&module("my-kmod", ""))),
        ],
        "Load my-kmod",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    report(syncer.sync().await.expect("sync"));
    let nmcs: Api<NodeModulesConfig> = Api::all(client.clone());
    let loaded = async || {
        nmcs.get_opt("worker-1")
            .await
            .expect("nmc")
            .and_then(|nmc| nmc.status)
            .is_some_and(|status| !status.modules.is_empty())
    };
    common::wait_until("my-kmod is loaded on worker-1", loaded).await;

    repo.commit(
        &[("ns.yaml", None), ("module.yaml", None)],
        "Retire kmm-demo",
    );
    let retired = report(syncer.sync().await.expect("sync"));
    assert_eq!(retired.count("pruned"), 1, "{retired:?}");
    assert!(
        retired
            .kept
            .iter()
            .any(|(id, reason)| id.name == "kmm-demo" && reason.contains("kmm-demo/my-kmod")),
        "{retired:?}"
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = namespaces.get("kmm-demo").await.expect("namespace");
    assert!(namespace.metadata.deletion_timestamp.is_none());

    let modules: Api<Module> = Api::namespaced(client.clone(), "kmm-demo");
    common::wait_until("the Module is unloaded and gone", || async {
        modules.get_opt("my-kmod").await.expect("module").is_none() && !loaded().await
    })
    .await;
    syncer.sync().await.expect("sync");
    let namespace = namespaces.get_opt("kmm-demo").await.expect("namespace");
    assert!(
        namespace.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()),
        "the namespace is deleted once its Modules are gone"
    );
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let status = syncs.get("capstan").await.unwrap().status.unwrap();
    assert!(status.inventory.is_empty(), "{:?}", status.inventory);
    stop.cancel();
    running.await.expect("controllers stop");
}
