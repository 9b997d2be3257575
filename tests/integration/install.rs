//! capstan installed as its users install it, on the real kube-apiserver with RBAC on:
//! kubectl of the same release applies the kustomize base (`deploy/base`), and capstan runs
//! as processes authenticated with its ServiceAccount's token, bound to nothing but the
//! shipped roles. Two replicas, the leader killed with SIGKILL in the middle of the ordered
//! upgrade, the standby finishes it; the API server's audit log then shows that capstan
//! was never refused and that it used the rules it is granted. A rule taken out of the
//! ClusterRole stops capstan at start, naming the verb and the resource.
//!
//! RBAC is the real server's: on the embedded cluster, which authorizes everything, these
//! tests say so and pass (hack/test leaves them out of that run).

use crate::common;
use crate::high_availability::{Replica, folder, new_leader, steps_of};
use crate::upgrade;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use capstan::controllers::Selection;
use capstan_api::LeaderWorkerSet;
use capstan_api::upgrade_config::UpgradePhase;
use capstan_cluster::sim::config::ClusterConfig;
use capstan_real_cluster::{ControlPlane, Options};
use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use kube::api::{Api, PostParams};
use upgrade::{label, module};

/// The permissions of capstan's own roles that the install scenario cannot show in the
/// audit log, and why. The scenario checks this list both ways: a permission used after all
/// must leave it.
const NOT_SHOWN_HERE: &[(&str, &str, &str, &str)] = &[
    // A server-side apply that creates is authorized as a create but audited as a patch.
    ("create", "apps", "daemonsets", "created by apply"),
    ("create", "capstan.dev", "gitsyncs", "created by apply"),
    ("create", "kmm.sigs.x-k8s.io", "modules", "created by apply"),
    (
        "create",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets",
        "created by apply",
    ),
    (
        "create",
        "upgrade.managed.openshift.io",
        "upgradeconfigs",
        "created by apply",
    ),
    // Authorized by the OwnerReferencesPermissionEnforcement admission plugin (OpenShift,
    // hardened clusters) when an owner reference blocks deletion: no request of its own.
    (
        "update",
        "",
        "pods/finalizers",
        "owner references, checked at admission",
    ),
    (
        "update",
        "kmm.sigs.x-k8s.io",
        "modules/finalizers",
        "owner references, checked at admission",
    ),
    (
        "update",
        "kmm.sigs.x-k8s.io",
        "nodemodulesconfigs/finalizers",
        "owner references, checked at admission",
    ),
    (
        "update",
        "leaderworkerset.x-k8s.io",
        "leaderworkersets/finalizers",
        "owner references, checked at admission",
    ),
    // Paths this scenario does not take; the tests named use them.
    (
        "get",
        "",
        "pods",
        "a pod gate's check pod: rollout_guardrails::",
    ),
    (
        "get",
        "",
        "secrets",
        "the preflight of a Module with an imageRepoSecret (src/controllers/checks/image.rs)",
    ),
    (
        "delete",
        "apps",
        "controllerrevisions",
        "an LWS template change: leaderworkersets::",
    ),
    (
        "get",
        "apps",
        "controllerrevisions",
        "an LWS group restarted mid-update: leaderworkersets::",
    ),
    (
        "delete",
        "apps",
        "daemonsets",
        "a device plugin's old version: controllers_device_plugin::",
    ),
    (
        "delete",
        "capstan.dev",
        "historyrecords",
        "records beyond historyRetention: sync_apply::",
    ),
    (
        "create",
        "resource.k8s.io",
        "deviceclasses",
        "created by apply, for a Module with DRA DeviceClasses: kmm_dra::",
    ),
    (
        "patch",
        "resource.k8s.io",
        "deviceclasses",
        "a Module with DRA DeviceClasses: kmm_dra::",
    ),
    (
        "delete",
        "resource.k8s.io",
        "deviceclasses",
        "a DeviceClass a Module no longer lists: kmm_dra::",
    ),
    (
        "delete",
        "kmm.sigs.x-k8s.io",
        "modules",
        "a Module pruned: sync_apply::",
    ),
    (
        "delete",
        "upgrade.managed.openshift.io",
        "upgradeconfigs",
        "a campaign pruned: sync_apply::",
    ),
    (
        "list",
        "policy",
        "poddisruptionbudgets",
        "a drain past its timeout: nodekeeper::",
    ),
];

/// Permissions the scenario uses or not depending on timing: checked one way only (they
/// may stay unused here).
const SHOWN_BY_TIMING: &[(&str, &str, &str, &str)] = &[
    (
        "get",
        "kmm.sigs.x-k8s.io",
        "nodemodulesconfigs",
        "the NMC cache behind the controller's own write",
    ),
    (
        "patch",
        "events.k8s.io",
        "events",
        "an Event repeated within its series",
    ),
    (
        "get",
        "capstan.dev",
        "historyrecords",
        "a new leader reading the time of a step recorded before it took over",
    ),
];

/// A LeaderWorkerSet of one group of two pods.
const SERVE: &str = "apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: serve, namespace: kmm-demo}
spec:
  replicas: 1
  leaderWorkerTemplate:
    size: 2
    workerTemplate:
      spec:
        containers: [{name: serve, image: registry.example/serve:1}]
";

/// The user capstan's pods authenticate as.
const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:capstan-system:capstan";

/// The real control plane of these tests, None on the embedded cluster.
async fn real_plane(options: Options) -> Option<ControlPlane> {
    if !common::on_real_server() {
        eprintln!("RBAC is the real kube-apiserver's: run with CAPSTAN_TEST_SERVER=real");
        return None;
    }
    let plane = ControlPlane::start_with(&ClusterConfig::default_cluster(), &options)
        .await
        .unwrap_or_else(|err| panic!("the real control plane starts: {err:#}"));
    Some(plane)
}

fn deploy_base() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base")
}

/// `kubectl apply --server-side -k deploy/base` as the administrator, then waits until
/// the API server serves capstan's kinds.
async fn apply_base(plane: &ControlPlane, dir: &Path) {
    let admin = dir.join("admin.kubeconfig");
    std::fs::write(&admin, plane.kubeconfig()).expect("admin kubeconfig");
    let kubectl = capstan_real_cluster::kubectl().expect("kubectl of the release");
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(&admin)
        .args(["apply", "--server-side", "-k"])
        .arg(deploy_base())
        .output()
        .await
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl apply -k deploy/base:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let client = plane.client().await.expect("client");
    wait_until("capstan's kinds served", async || {
        let modules: Api<capstan_api::Module> = Api::all(client.clone());
        let syncs: Api<capstan_api::GitSync> = Api::all(client.clone());
        modules.list(&Default::default()).await.is_ok()
            && syncs.list(&Default::default()).await.is_ok()
    })
    .await;
}

/// A kubeconfig for the cluster of `plane` that authenticates with a fresh token of
/// capstan-system/`account`, written as the `kubeconfig` of `dir` (the replicas' own).
async fn service_account_kubeconfig(plane: &ControlPlane, account: &str, dir: &Path) {
    let client = plane.client().await.expect("client");
    let accounts: Api<ServiceAccount> = Api::namespaced(client, "capstan-system");
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": {"audiences": [], "expirationSeconds": 3600}
    }))
    .expect("token request");
    let answer = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("a token for the ServiceAccount");
    let token = answer.status.expect("a token").token;
    let mut config: serde_json::Value =
        serde_saphyr::from_str(&plane.kubeconfig()).expect("the admin kubeconfig");
    config["users"] = serde_json::json!([{"name": account, "user": {"token": token}}]);
    for context in config["contexts"].as_array_mut().expect("contexts") {
        context["context"]["user"] = serde_json::json!(account);
    }
    std::fs::write(
        dir.join("kubeconfig"),
        serde_json::to_string(&config).expect("kubeconfig"),
    )
    .expect("write the kubeconfig");
}

/// What the audit log says the ServiceAccount asked: (verb, group, resource) and whether
/// it was refused.
fn audited(plane: &ControlPlane) -> Vec<(String, String, String, u16)> {
    let text = std::fs::read_to_string(plane.audit_log()).expect("the audit log");
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|entry| entry["user"]["username"] == SERVICE_ACCOUNT_USER)
        .filter_map(|entry| {
            let object = entry.get("objectRef")?;
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", object["resource"].as_str()?),
                None => object["resource"].as_str()?.to_string(),
            };
            Some((
                entry["verb"].as_str()?.to_string(),
                object["apiGroup"].as_str().unwrap_or("").to_string(),
                resource,
                entry["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            ))
        })
        .collect()
}

/// Every (verb, group, resource) the rules grant.
fn granted(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut granted = BTreeSet::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    granted.insert((verb.clone(), group.clone(), resource.clone()));
                }
            }
        }
    }
    granted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capstan_runs_as_its_service_account_with_the_shipped_roles_and_two_replicas_finish_an_upgrade()
 {
    let options = Options {
        audit_users: vec![SERVICE_ACCOUNT_USER.into()],
        heap_limits: common::plane_options().heap_limits,
        ..Options::default()
    };
    let Some(plane) = real_plane(options).await else {
        return;
    };
    let client = plane.client().await.expect("client");
    let dir = folder(&plane.kubeconfig());
    apply_base(&plane, dir.path()).await;
    service_account_kubeconfig(&plane, "capstan", dir.path()).await;

    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let a = Replica::start(dir.path(), "replica-a", repo.path());
    a.wait_for_line("leading: holding the Lease").await;
    let b = Replica::start(dir.path(), "replica-b", repo.path());
    b.wait_for_line("waiting for the Lease").await;
    a.wait_for_line(" applied ").await;
    upgrade::converged(&client).await;

    // The campaign: my-kmod v2 for two nodes, drained around their steps, beside a
    // LeaderWorkerSet whose groups the drains recreate elsewhere.
    repo.commit(
        &[
            ("module.yaml", Some(&module("v2"))),
            (
                "campaign.yaml",
                Some(&upgrade::campaign("2020-01-01T00:00:00Z")),
            ),
            ("serve.yaml", Some(SERVE)),
            ("nodes/worker-1.yaml", Some(&label("worker-1", "v2"))),
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    wait_until("worker-1 in its steps", async || {
        steps_of(&client, "worker-1").await.len() >= 3
    })
    .await;
    a.kill().await;
    let (_, took) = new_leader(&client, &[&b]).await;
    eprintln!(
        "figure: as its ServiceAccount, the standby led {:.1} s after the leader's SIGKILL",
        took.as_secs_f64()
    );
    wait_until("the campaign upgraded", async || {
        upgrade::campaign_phase(&client).await == Some(UpgradePhase::Upgraded)
            && upgrade::at_rest(&client).await.is_ok()
    })
    .await;
    let expected = upgrade::DRAINED_STEPS;
    for node in ["worker-1", "worker-2"] {
        assert_eq!(steps_of(&client, node).await, expected, "{node}");
    }
    // The LeaderWorkerSet leaves Git: pruned.
    repo.commit(
        &[("serve.yaml", None)],
        "Merge pull request #3 from fleet/no-serve",
    );
    let sets: Api<LeaderWorkerSet> = Api::namespaced(client.clone(), upgrade::NS);
    wait_until("the LeaderWorkerSet pruned", async || {
        sets.get_opt("serve").await.expect("read").is_none()
    })
    .await;
    assert!(!b.log().contains("forbidden"), "{}", b.log());

    // The audit log: nothing refused, nothing asked beyond the shipped roles.
    let requests = audited(&plane);
    assert!(
        !requests.is_empty(),
        "the audit log holds capstan's requests"
    );
    let refused: Vec<_> = requests.iter().filter(|r| r.3 == 403).collect();
    assert!(refused.is_empty(), "refused: {refused:?}");
    let mut rules = capstan::rbac::rules_for(&Selection::all());
    rules.extend(capstan::rbac::repository_rules());
    rules.extend(capstan::rbac::election_rules());
    let used: BTreeSet<_> = requests
        .iter()
        .map(|(verb, group, resource, _)| (verb.clone(), group.clone(), resource.clone()))
        // Granted to every authenticated user by Kubernetes' default roles.
        .filter(|(_, group, _)| group != "authorization.k8s.io" && group != "authentication.k8s.io")
        .collect();
    let all_granted = granted(&rules);
    let beyond: Vec<_> = used.difference(&all_granted).collect();
    assert!(
        beyond.is_empty(),
        "asked beyond the shipped rules: {beyond:?}"
    );

    // And every permission of capstan's own roles was used, but those this scenario
    // cannot show, each named with why.
    let mut own = capstan::rbac::rules_for(&Selection::all());
    own.extend(capstan::rbac::election_rules());
    let unused: BTreeSet<_> = granted(&own).difference(&used).cloned().collect();
    let elsewhere: BTreeSet<_> = NOT_SHOWN_HERE
        .iter()
        .map(|(verb, group, resource, _)| {
            (verb.to_string(), group.to_string(), resource.to_string())
        })
        .collect();
    let by_timing: BTreeSet<_> = SHOWN_BY_TIMING
        .iter()
        .map(|(verb, group, resource, _)| {
            (verb.to_string(), group.to_string(), resource.to_string())
        })
        .collect();
    let unexplained: Vec<_> = unused
        .difference(&elsewhere)
        .filter(|permission| !by_timing.contains(*permission))
        .collect();
    assert!(
        unexplained.is_empty(),
        "granted by src/rbac.rs but never used: {unexplained:?}; take them out, or exercise \
         them here, or say in NOT_SHOWN_HERE why this scenario cannot"
    );
    let shown: Vec<_> = elsewhere.difference(&unused).collect();
    assert!(
        shown.is_empty(),
        "used after all, drop them from NOT_SHOWN_HERE: {shown:?}"
    );
    drop(b);
    plane.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_taken_out_of_the_cluster_role_stops_capstan_naming_the_verb_and_resource() {
    let Some(plane) = real_plane(Options::default()).await else {
        return;
    };
    let client = plane.client().await.expect("client");
    let dir = folder(&plane.kubeconfig());
    apply_base(&plane, dir.path()).await;
    service_account_kubeconfig(&plane, "capstan", dir.path()).await;

    // `list` on nodes taken out of the shipped ClusterRole.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut role = roles.get("capstan").await.expect("the shipped ClusterRole");
    for rule in role.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "nodes") {
            rule.verbs.retain(|verb| verb != "list");
        }
    }
    roles
        .replace("capstan", &PostParams::default(), &role)
        .await
        .expect("replace the ClusterRole");

    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(["sync", "--once", "--timeout", "60s", "--repo"])
        .arg(repo.path())
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .await
        .expect("capstan sync runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(SERVICE_ACCOUNT_USER),
        "names who capstan is: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with("list nodes")),
        "names the verb and resource: {stderr}"
    );
    // Nothing was applied: capstan stopped before its first write.
    let syncs: Api<capstan_api::GitSync> = Api::namespaced(client.clone(), "capstan-system");
    assert!(syncs.get_opt("capstan").await.expect("read").is_none());
    plane.shutdown().await;
}
