//! `capstan plan --kubeconfig` and LeaderWorkerSets: whether head rolls the groups the
//! cluster runs (compared with the revision their leader StatefulSet names), in which
//! order, and which groups draining a node for an `UpgradeConfig` campaign recreates.

use crate::common;
use crate::fleet;

use capstan::controllers::{self, Context};
use capstan_api::LeaderWorkerSet;
use capstan_cluster::kubeconfig;
use common::git::{FleetRepo, with_changes};
use fleet::{capstan, fleet_v1, fleet_v2};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "inference";
const NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";

/// LeaderWorkerSet `inference/<name>`: `replicas` groups of two pods on `version`, all on
/// worker-1.
fn leader_worker_set(name: &str, replicas: i32, version: &str) -> String {
    format!(
        "apiVersion: leaderworkerset.x-k8s.io/v1\nkind: LeaderWorkerSet\n\
         metadata: {{name: {name}, namespace: {NS}}}\nspec:\n  replicas: {replicas}\n  \
         leaderWorkerTemplate:\n    size: 2\n    workerTemplate:\n      \
         metadata: {{labels: {{app: {name}}}}}\n      spec:\n        \
         nodeSelector: {{kubernetes.io/hostname: worker-1}}\n        containers:\n          \
         - name: {name}\n            image: registry.example/{name}:{version}\n"
    )
}

/// The campaign rolling my-kmod v2 out: worker-1's move waits for it and is drained first.
const CAMPAIGN: &str = "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
                        metadata: {name: my-kmod-v2, namespace: kmm-demo}\nspec:\n  type: OSD\n  \
                        upgradeAt: \"2027-06-01T02:00:00Z\"\n  PDBForceDrainTimeout: 60\n  \
                        desired: {version: v2}\n";

/// Runs `capstan plan --format json` against the cluster, off the runtime's threads.
async fn live_plan(fleet: &FleetRepo, kubeconfig: &std::path::Path) -> Value {
    let (dir, kubeconfig) = (fleet.path().to_path_buf(), kubeconfig.to_path_buf());
    let output = tokio::task::spawn_blocking(move || {
        let kubeconfig = kubeconfig.to_str().expect("utf-8").to_string();
        capstan(
            &dir,
            &[
                "plan",
                "--path",
                "fleet",
                "--format",
                "json",
                "--kubeconfig",
                &kubeconfig,
            ],
        )
    })
    .await
    .expect("plan");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&output.stderr)))
}

/// What the plan says of each LeaderWorkerSet: `name change`, and the order when it rolls.
fn lws_changes(plan: &Value) -> Vec<String> {
    plan["leaderWorkerSets"]
        .as_array()
        .expect("leaderWorkerSets")
        .iter()
        .map(|set| {
            let order = &set["rollout"]["order"];
            let order = if order.is_null() {
                String::new()
            } else {
                format!(" {order}")
            };
            format!(
                "{} {} {}{order}",
                set["name"].as_str().unwrap(),
                set["change"].as_str().unwrap(),
                set["changedFields"]
            )
        })
        .collect()
}

#[tokio::test]
async fn a_live_plan_rolls_the_running_groups_and_names_those_a_drain_recreates() {
    let (cluster, client) = common::start_default_simulated().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("kubeconfig");
    kubeconfig::write(&config, &cluster.kubeconfig()).expect("kubeconfig");
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");

    // What a sync of base left: LWS vllm, two groups on v1, run by capstan's LWS controller.
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let controller = tokio::spawn(async move {
        controllers::run(ctx, &"lws".parse().expect("selection")).await;
    });
    let running: Value = serde_saphyr::from_str(&leader_worker_set("vllm", 2, "v1")).expect("YAML");
    Api::<LeaderWorkerSet>::namespaced(client.clone(), NS)
        .patch(
            "vllm",
            &PatchParams::apply("capstan").force(),
            &Patch::Apply(&running),
        )
        .await
        .expect("apply vllm");
    common::wait_for("vllm's four pods on worker-1", async || {
        let pods = Api::<Pod>::namespaced(client.clone(), NS)
            .list(&ListParams::default().labels(&format!("{NAME_LABEL}=vllm")))
            .await
            .expect("pods")
            .items;
        let placed = pods
            .iter()
            .filter(|pod| {
                pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref()) == Some("worker-1")
            })
            .count();
        if placed == 4 { Ok(()) } else { Err(placed) }
    })
    .await;
    let leader = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get("vllm")
        .await
        .expect("leader StatefulSet");
    assert!(
        leader
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(KEY_LABEL),
        "the leader StatefulSet names its revision"
    );

    let base = with_changes(
        &fleet_v1(),
        &[("fleet/vllm.yaml", Some(leader_worker_set("vllm", 2, "v1")))],
    );
    // Head: worker-1 to my-kmod v2 under a campaign, vllm on v2, sglang new.
    let head = with_changes(
        &fleet_v2(),
        &[
            (
                "fleet/vllm.yaml",
                Some(
                    leader_worker_set("vllm", 2, "v2")
                        + "---\n"
                        + &leader_worker_set("sglang", 1, "v1"),
                ),
            ),
            ("fleet/campaign.yaml", Some(CAMPAIGN.to_string())),
        ],
    );
    let plan = live_plan(&FleetRepo::proposal(&base, &head), &config).await;
    assert_eq!(plan["errors"], json!([]), "{plan:#}");
    assert_eq!(
        lws_changes(&plan),
        [
            "vllm rolls [\"leaderWorkerTemplate\"] [[1],[0]]",
            "sglang created []",
        ],
        "{plan:#}"
    );
    let worker_1 = plan["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|node| node["node"] == "worker-1")
        .unwrap_or_else(|| panic!("worker-1 moves: {plan:#}"));
    assert_eq!(
        worker_1["drain"]["recreatedGroups"],
        json!(["inference/vllm group 0", "inference/vllm group 1"]),
        "{plan:#}"
    );

    // Head: only more replicas. The cluster runs head's template: nothing rolls.
    let scaled = with_changes(
        &base,
        &[("fleet/vllm.yaml", Some(leader_worker_set("vllm", 3, "v1")))],
    );
    let plan = live_plan(&FleetRepo::proposal(&base, &scaled), &config).await;
    assert_eq!(
        lws_changes(&plan),
        ["vllm noRollout [\"replicas\"]"],
        "{plan:#}"
    );
    assert_eq!(
        plan["leaderWorkerSets"][0]["replicas"],
        json!({"from": 2, "to": 3})
    );

    stop.cancel();
    tokio::time::timeout(common::DEADLINE, controller)
        .await
        .expect("the LWS controller stops on shutdown")
        .expect("the LWS controller ends cleanly");
}
