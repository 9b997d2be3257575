//! What a newcomer types at the embedded cluster works, or says plainly why not and what to
//! do instead: `kubectl get all`, `kubectl auth can-i` (a protobuf review), `kubectl create
//! deployment` (a protobuf Deployment the cluster does not read), `kubectl create job` (a
//! kind it does not serve). kubectl is the real control plane's release
//! (`hack/real-cluster/build-kubectl`).

use crate::common;

use std::path::Path;

use capstan_cluster::sim::config::ClusterConfig;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::sim_drain::build_kubectl;

/// `kubectl <args>` against the cluster: success, stdout, stderr.
async fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let output = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .expect("kubectl runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_all_and_auth_can_i_work_and_create_deployment_says_what_to_do_instead() {
    let binary = build_kubectl();
    let config = ClusterConfig::parse("nodes:\n  - {name: worker-1}\n", "test").expect("config");
    let (cluster, client) = common::start_simulated(config).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig()).expect("kubeconfig");
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
    });
    Api::<Deployment>::namespaced(client.clone(), "default")
        .patch(
            "web",
            &PatchParams::apply("test"),
            &Patch::Apply(&deployment),
        )
        .await
        .expect("a Deployment");

    let (ok, all, stderr) = kubectl(&binary, &kubeconfig, &["get", "all"]).await;
    assert!(ok, "{stderr}");
    assert!(all.contains("deployment.apps/web"), "{all}");

    let (ok, answer, stderr) =
        kubectl(&binary, &kubeconfig, &["auth", "can-i", "create", "pods"]).await;
    assert!(ok, "{stderr}");
    assert_eq!(answer.trim(), "yes");

    let (ok, _, stderr) = kubectl(
        &binary,
        &kubeconfig,
        &["create", "deployment", "api", "--image=nginx"],
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("not of apps/v1 Deployment") && stderr.contains("apply a manifest instead"),
        "{stderr}"
    );

    // A kind the embedded cluster does not serve: kubectl's own words, which the docs
    // explain (docs/embedded-cluster.md#scope-what-it-keeps-up-with-and-what-it-no-longer-chases).
    let (ok, _, stderr) = kubectl(
        &binary,
        &kubeconfig,
        &["create", "job", "once", "--image=busybox"],
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("could not find the requested resource"),
        "{stderr}"
    );
}
