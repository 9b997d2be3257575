//! The reach the cluster's admin sets on the `GitSync` bounds what a branch can do: a commit
//! declaring an object in a namespace or of a kind outside it is rejected whole, naming the
//! file, line and field; an object outside it is never pruned; with a ServiceAccount, the
//! sync writes as it and its RBAC bounds the repository; and prune never deletes a
//! Namespace holding objects capstan never applied.

use crate::common;

use capstan::sync::run::{Outcome, Report};
use capstan_api::GitSync;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn applied(outcome: Outcome) -> Report {
    match outcome {
        Outcome::Applied(report) => report,
        other => panic!("expected an applied commit, got {other:?}"),
    }
}

fn rejected(outcome: Outcome) -> Vec<String> {
    match outcome {
        Outcome::Rejected { errors, .. } => errors,
        other => panic!("expected a rejected commit, got {other:?}"),
    }
}

/// What the cluster's admin does: `kubectl patch gitsync capstan --type merge`.
async fn set_reach(client: &kube::Client, reach: Value) {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    syncs
        .patch(
            "capstan",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"reach": reach}})),
        )
        .await
        .expect("the admin sets the reach");
}

fn config_map_in(namespace: &str, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\ndata:\n  value: \"x\"\n"
    )
}

fn namespace(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("read").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_reaching_outside_the_admins_reach_is_rejected_and_what_lies_outside_is_never_pruned()
 {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("settings.yaml", Some(&config_map("settings", "a"))),
            ("legacy.yaml", Some(&config_map_in("default", "legacy"))),
        ],
        "Before the reach",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    applied(syncer.sync().await.expect("sync"));

    set_reach(
        &client,
        json!({
            "namespaces": ["kmm-*"],
            "deniedKinds": [{"group": "", "kind": "Secret"}],
        }),
    )
    .await;
    repo.commit(
        &[
            (
                "secret.yaml",
                Some(
                    "apiVersion: v1\nkind: Secret\nmetadata:\n  name: token\n  namespace: kmm-demo\nstringData:\n  token: hunter2\n",
                ),
            ),
            ("system.yaml", Some(&config_map_in("kube-system", "mine"))),
            ("ns-b.yaml", Some(&namespace("team-b"))),
        ],
        "Reach further",
    );
    let errors = rejected(syncer.sync().await.expect("sync"));
    assert_eq!(
        errors,
        [
            // Still in Git from before the reach: outside it now.
            "legacy.yaml:1: metadata.namespace: namespace default is outside this \
             repository's reach: the cluster's admin does not allow it (the GitSync's \
             spec.reach)",
            "ns-b.yaml:1: metadata.name: namespace team-b is outside this repository's reach: \
             the cluster's admin does not allow it (the GitSync's spec.reach)",
            "secret.yaml:1: kind: Secret is outside this repository's reach: the cluster's \
             admin denies it (the GitSync's spec.reach)",
            "system.yaml:1: metadata.namespace: namespace kube-system is outside this \
             repository's reach: the cluster's admin does not allow it (the GitSync's \
             spec.reach)",
        ]
    );
    let system: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    assert!(
        !exists(&system, "mine").await,
        "nothing of the commit applies"
    );

    // Back within the reach, and the object applied before it leaves Git: it lies outside
    // the reach now, so it is neither pruned nor managed any longer.
    repo.commit(
        &[
            ("secret.yaml", None),
            ("system.yaml", None),
            ("ns-b.yaml", None),
            ("legacy.yaml", None),
            ("settings.yaml", Some(&config_map("settings", "b"))),
        ],
        "Within the reach",
    );
    let report = applied(syncer.sync().await.expect("sync"));
    assert_eq!(report.count("configured"), 1, "{report:?}");
    assert_eq!(report.count("pruned"), 0, "{report:?}");
    assert!(
        report.kept.iter().any(|(id, reason)| id.name == "legacy"
            && reason.contains("outside this repository's reach")),
        "{report:?}"
    );
    let default: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(exists(&default, "legacy").await, "not pruned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_holding_objects_capstan_never_applied_is_not_pruned() {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("a/ns.yaml", Some(&namespace("team-a"))),
            ("a/cm.yaml", Some(&config_map_in("team-a", "from-git"))),
            ("b/ns.yaml", Some(&namespace("team-b"))),
            ("b/cm.yaml", Some(&config_map_in("team-b", "from-git"))),
        ],
        "Two teams",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    applied(syncer.sync().await.expect("sync"));
    // Someone else's object in team-a.
    let team_a: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    let by_hand: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "by-hand", "namespace": "team-a"},
        "data": {"kept": "yes"},
    }))
    .expect("config map");
    team_a
        .create(&PostParams::default(), &by_hand)
        .await
        .expect("created by hand");

    repo.commit(
        &[
            ("a/ns.yaml", None),
            ("a/cm.yaml", None),
            ("b/ns.yaml", None),
            ("b/cm.yaml", None),
            ("keep.yaml", Some(&namespace("kmm-demo"))),
        ],
        "Retire both teams",
    );
    let report = applied(syncer.sync().await.expect("sync"));
    let kept: Vec<&(capstan::sync::manifests::ObjectId, String)> = report
        .kept
        .iter()
        .filter(|(id, _)| id.kind == "Namespace")
        .collect();
    assert_eq!(kept.len(), 1, "{report:?}");
    assert_eq!(kept[0].0.name, "team-a");
    assert!(
        kept[0]
            .1
            .contains("holds objects capstan never applied (ConfigMap by-hand)"),
        "{}",
        kept[0].1
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let team_a_ns = namespaces.get("team-a").await.expect("team-a stays");
    assert!(team_a_ns.metadata.deletion_timestamp.is_none());
    assert!(exists(&team_a, "by-hand").await);
    assert!(
        !exists(&team_a, "from-git").await,
        "capstan's own object is pruned"
    );
    let team_b = namespaces.get_opt("team-b").await.expect("read");
    assert!(
        team_b.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()),
        "a namespace holding only capstan's objects is pruned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sync_writes_as_the_reachs_service_account_so_its_rbac_bounds_the_repository() {
    if !common::on_real_server() {
        eprintln!(
            "impersonation is checked by the real kube-apiserver's RBAC: run with CAPSTAN_TEST_SERVER=real"
        );
        return;
    }
    let (_cluster, client) = common::start().await;
    // The admin's ServiceAccount for the repository: ConfigMaps in `team`, namespaces read.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let params = PatchParams::apply("admin");
    namespaces
        .patch(
            "team",
            &params,
            &Patch::Apply(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
            ),
        )
        .await
        .expect("namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "team");
    accounts
        .patch("fleet", &params, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "fleet", "namespace": "team"}})))
        .await
        .expect("service account");
    let roles: Api<Role> = Api::namespaced(client.clone(), "team");
    roles
        .patch(
            "fleet",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "fleet", "namespace": "team"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                           "verbs": ["get", "list", "create", "patch", "delete"]}],
            })),
        )
        .await
        .expect("role");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "team");
    bindings
        .patch("fleet", &params, &Patch::Apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "fleet", "namespace": "team"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "fleet"},
            "subjects": [{"kind": "ServiceAccount", "name": "fleet", "namespace": "team"}],
        })))
        .await
        .expect("role binding");
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    cluster_roles
        .patch("fleet-namespaces", &params, &Patch::Apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "fleet-namespaces"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}],
        })))
        .await
        .expect("cluster role");
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    cluster_bindings
        .patch("fleet-namespaces", &params, &Patch::Apply(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "fleet-namespaces"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "fleet-namespaces"},
            "subjects": [{"kind": "ServiceAccount", "name": "fleet", "namespace": "team"}],
        })))
        .await
        .expect("cluster role binding");

    let mut repo = FleetRepo::new();
    repo.commit(
        &[("cm.yaml", Some(&config_map_in("team", "first")))],
        "Start",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    set_reach(
        &client,
        json!({"serviceAccount": {"namespace": "team", "name": "fleet"}}),
    )
    .await;
    repo.commit(
        &[(
            "service.yaml",
            Some(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: team\nspec:\n  ports:\n  - port: 80\n",
            ),
        )],
        "A Service the ServiceAccount may not create",
    );
    let errors = rejected(syncer.sync().await.expect("sync"));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("Service team/web")
                && e.contains("system:serviceaccount:team:fleet")),
        "{errors:?}"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    assert!(
        !exists(&config_maps, "first").await,
        "nothing of the commit applies"
    );

    repo.commit(&[("service.yaml", None)], "Only what it may");
    applied(syncer.sync().await.expect("sync"));
    let first = config_maps
        .get("first")
        .await
        .expect("applied as the ServiceAccount");
    let managers: Vec<String> = first
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    assert!(managers.contains(&"capstan".to_string()), "{managers:?}");
}
