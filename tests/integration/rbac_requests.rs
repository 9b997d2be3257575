//! capstan's shipped roles against what it asks of the API server: a sync and every
//! controller take a fleet through a Module upgrade with a client that records each
//! request's RBAC attributes as kube-apiserver reads them; the `capstan` ClusterRole, the
//! repository role and the Lease's Role must grant them all. On the embedded cluster,
//! which authorizes everything, this is the check RBAC would make (tests/integration/
//! install.rs makes the real one).

use crate::common;

use common::git::FleetRepo;
use common::manifests;
use tokio_util::sync::CancellationToken;

use capstan::controllers::{self, Context, Selection};
use capstan::rbac::audit::{granted, recording};
use capstan::rbac::{election_rules, repository_rules, rules_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_roles_grant_every_request_of_an_upgrade() {
    let (cluster, _) = common::start_default_simulated().await;
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&cluster.kubeconfig()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let (client, recorded) = recording(config).expect("client");
    let mut repo = FleetRepo::new();
    let mut files: Vec<(String, String)> = vec![
        ("capstan.yaml".into(), "maxNodesInFlight: 1\n".into()),
        ("namespace.yaml".into(), manifests::NAMESPACE.into()),
        (
            "module.yaml".into(),
            manifests::module_with_device_plugin("my-kmod", "v1"),
        ),
        ("cm.yaml".into(), manifests::config_map("c", "1")),
    ];
    for node in ["worker-1", "worker-2", "worker-3"] {
        files.push((
            format!("nodes/{node}.yaml"),
            manifests::node_label(node, "my-kmod", "v1"),
        ));
    }
    repo.commit_set(&files, "Merge pull request #1 from fleet/initial");
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let running = tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    let mut syncer = common::syncer(&client, repo.path()).await;
    syncer.sync().await.expect("sync");
    crate::upgrade::converged(&client).await;
    repo.commit(
        &[(
            "module.yaml",
            Some(&manifests::module_with_device_plugin("my-kmod", "v2")),
        )],
        "Merge pull request #2 from fleet/v2",
    );
    syncer.sync().await.expect("sync");
    crate::upgrade::converged(&client).await;
    repo.commit(
        &[
            (
                "nodes/worker-1.yaml",
                Some(&manifests::node_label("worker-1", "my-kmod", "v2")),
            ),
            ("cm.yaml", None),
        ],
        "Merge pull request #3 from fleet/w1",
    );
    syncer.sync().await.expect("sync");
    crate::upgrade::converged(&client).await;
    stop.cancel();
    let _ = running.await;
    let mut rules = rules_for(&Selection::all());
    rules.extend(repository_rules());
    rules.extend(election_rules());
    let asked = recorded.lock().unwrap().clone();
    let mut denied = Vec::new();
    for request in &asked {
        if !granted(&rules, request) {
            denied.push(request.to_string());
        }
    }
    assert!(denied.is_empty(), "denied: {denied:#?}");
    cluster.shutdown().await;
}
