//! CustomResourceDefinitions: capstan's own are served from the start, `capstan crds`
//! output registers them on a bare server, custom resources get the status subresource,
//! printer columns, discovery, and deleting a CRD removes its objects.

use crate::common;

use capstan_cluster::ClusterOptions;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::{ApiResource, Discovery};
use serde_json::json;

fn nmc_resource() -> ApiResource {
    ApiResource {
        group: "kmm.sigs.x-k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "kmm.sigs.x-k8s.io/v1beta1".into(),
        kind: "NodeModulesConfig".into(),
        plural: "nodemodulesconfigs".into(),
    }
}

#[tokio::test]
async fn capstan_kinds_are_discoverable_at_start() {
    let (_cluster, client) = common::start().await;
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut kinds = Vec::new();
    for group in discovery.groups() {
        for (resource, _) in group.recommended_resources() {
            kinds.push(format!("{}/{}", resource.api_version, resource.kind));
        }
    }
    for want in [
        "kmm.sigs.x-k8s.io/v1beta1/Module",
        "kmm.sigs.x-k8s.io/v1beta1/NodeModulesConfig",
        "upgrade.managed.openshift.io/v1alpha1/UpgradeConfig",
        "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet",
        "apps/v1/DaemonSet",
        "v1/Node",
        "policy/v1/PodDisruptionBudget",
    ] {
        assert!(
            kinds.iter().any(|k| k == want),
            "{want} missing from {kinds:?}"
        );
    }
}

#[tokio::test]
async fn crds_printed_by_capstan_register_on_a_bare_server() {
    let options = ClusterOptions {
        capstan_crds: false,
        ..ClusterOptions::default()
    };
    let (_cluster, client) = common::start_with(options).await;
    let yaml = capstan_api::crds::to_yaml().expect("yaml");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let mut count = 0;
    for document in yaml
        .split("\n---\n")
        .filter(|d| !d.trim().trim_start_matches("---").trim().is_empty())
    {
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(document).expect("a CRD document");
        let created = crds
            .create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
        let established = created
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "CRD established at once");
        count += 1;
    }
    assert_eq!(count, capstan_api::crds::all().len());
    let nmcs: Api<DynamicObject> = Api::all_with(client.clone(), &nmc_resource());
    let nmc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
        "metadata": {"name": "worker-1"}, "spec": {"modules": []}
    }))
    .expect("nmc");
    nmcs.create(&PostParams::default(), &nmc)
        .await
        .expect("custom resource served");
}

#[tokio::test]
async fn custom_resource_status_is_a_subresource() {
    let (_cluster, client) = common::start().await;
    let nmcs: Api<DynamicObject> = Api::all_with(client.clone(), &nmc_resource());
    let nmc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
        "metadata": {"name": "worker-1"}, "spec": {"modules": []},
        "status": {"modules": [{"name": "ignored", "namespace": "x"}]}
    }))
    .expect("nmc");
    let created = nmcs
        .create(&PostParams::default(), &nmc)
        .await
        .expect("create");
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create"
    );
    let status = json!({"status": {"modules": []}});
    let after = nmcs
        .patch_status("worker-1", &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("status");
    assert_eq!(after.data["status"]["modules"], json!([]));
    // Strategic merge patch is not served for custom resources, as upstream.
    let err = nmcs
        .patch(
            "worker-1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {}})),
        )
        .await
        .expect_err("415");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 415),
        "{err}"
    );
}

#[tokio::test]
async fn deleting_a_crd_removes_its_objects() {
    let (_cluster, client) = common::start().await;
    let nmcs: Api<DynamicObject> = Api::all_with(client.clone(), &nmc_resource());
    let nmc: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig", "metadata": {"name": "n"}, "spec": {"modules": []}
    }))
    .expect("nmc");
    nmcs.create(&PostParams::default(), &nmc)
        .await
        .expect("create");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.delete(
        "nodemodulesconfigs.kmm.sigs.x-k8s.io",
        &DeleteParams::default(),
    )
    .await
    .expect("delete CRD");
    let err = nmcs.get("n").await.expect_err("no longer served");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404),
        "{err}"
    );
}

#[tokio::test]
async fn unknown_fields_are_pruned_or_refused_when_strict() {
    let (cluster, client) = common::start().await;
    let body = json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
        "metadata": {"name": "typo"}, "spec": {"modules": [], "modulez": []}
    });
    let (code, status) = common::raw(
        &cluster,
        "POST",
        "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs?fieldValidation=Strict",
        "application/json",
        serde_json::to_vec(&body).expect("json"),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown field \"spec.modulez\"")),
        "{status}"
    );
    let nmcs: Api<DynamicObject> = Api::all_with(client.clone(), &nmc_resource());
    let created = nmcs
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).expect("nmc"),
        )
        .await
        .expect("without Strict the field is dropped");
    assert!(created.data["spec"].get("modulez").is_none());
}
