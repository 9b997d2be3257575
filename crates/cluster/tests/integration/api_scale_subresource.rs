//! The `/scale` subresource, as kube-apiserver 1.36 serves it (its answers were compared
//! with a real control plane's): Deployments, ReplicaSets, StatefulSets,
//! ReplicationControllers and custom resources whose CRD declares `subresources.scale`
//! (capstan's LeaderWorkerSet) read as an autoscaling/v1 `Scale`, and a `Scale` written
//! by PUT or any patch type changes the workload's replicas and nothing else.

use crate::common;
use crate::requests::{APPLY, JSON, JSON_PATCH, MERGE, STRATEGIC, create, get, send};

use capstan_api::lws::LeaderWorkerSet;
use capstan_cluster::EmbeddedCluster;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/default/deployments";
const LWS: &str = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets";

/// A Deployment `web` of `replicas`, its selector as `kubectl scale` users write them.
async fn deployment(cluster: &EmbeddedCluster, replicas: i64) -> Value {
    create(
        cluster,
        DEPLOYMENTS,
        json!({"metadata": {"name": "web"},
               "spec": {"replicas": replicas,
                        "selector": {"matchLabels": {"app": "web"},
                                     "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]},
                        "template": {"metadata": {"labels": {"app": "web", "tier": "a"}},
                                     "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}),
    )
    .await
}

/// A LeaderWorkerSet `vllm` of `replicas` groups, applied by `kubectl`.
async fn leader_worker_set(cluster: &EmbeddedCluster, replicas: i64) -> Value {
    let body = json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "vllm"},
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 2,
            "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "vllm"}]}}}}});
    let (code, created) = send(
        cluster,
        "PATCH",
        &format!("{LWS}/vllm?fieldManager=kubectl"),
        APPLY,
        &serde_json::to_vec(&body).expect("json"),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    created
}

/// `kubectl scale deployment web --replicas=3` (a merge patch of the `Scale`), through
/// kube's client: the replicas change, nothing else of the spec does, `generation`
/// counts the change, and the `Scale` answered is the Deployment's as stored.
#[tokio::test]
async fn kubectl_scale_changes_a_deployments_replicas_alone() {
    let (cluster, client) = common::start().await;
    let created = deployment(&cluster, 2).await;
    let deployments = Api::<Deployment>::namespaced(client, "default");
    let scale = deployments.get_scale("web").await.expect("scale");
    assert_eq!(
        serde_json::to_value(&scale).expect("json"),
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
               "metadata": {"name": "web", "namespace": "default",
                            "uid": created["metadata"]["uid"],
                            "resourceVersion": created["metadata"]["resourceVersion"],
                            "creationTimestamp": created["metadata"]["creationTimestamp"]},
               "spec": {"replicas": 2},
               "status": {"replicas": 0, "selector": "app=web,tier in (a,b)"}})
    );
    let scaled = deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scaled");
    let after = get(&cluster, &format!("{DEPLOYMENTS}/web")).await;
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(3));
    assert_eq!(
        json!(scaled.metadata.resource_version),
        after["metadata"]["resourceVersion"]
    );
    let mut expected_spec = created["spec"].clone();
    expected_spec["replicas"] = json!(3);
    assert_eq!(after["spec"], expected_spec);
    assert_eq!(after["metadata"]["generation"], json!(2));
}

/// A PUT of a `Scale` read before the Deployment moved on is refused, 409, as any
/// stale write; one with the current resourceVersion, or none, goes through.
#[tokio::test]
async fn a_scale_written_from_a_stale_read_conflicts() {
    let (cluster, client) = common::start().await;
    deployment(&cluster, 2).await;
    let deployments = Api::<Deployment>::namespaced(client, "default");
    let read = deployments.get_scale("web").await.expect("scale");
    let (code, _) = send(
        &cluster,
        "PATCH",
        &format!("{DEPLOYMENTS}/web"),
        MERGE,
        br#"{"metadata": {"labels": {"moved": "on"}}}"#,
    )
    .await;
    assert_eq!(code, 200);
    let mut stale = read.clone();
    stale.spec.get_or_insert_default().replicas = Some(5);
    let err = deployments
        .replace_scale("web", &PostParams::default(), &stale)
        .await
        .expect_err("stale");
    let kube::Error::Api(status) = err else {
        panic!("{err}");
    };
    assert_eq!(
        (status.code, status.reason.as_str(), status.message.as_str()),
        (
            409,
            "Conflict",
            "Operation cannot be fulfilled on deployments.apps \"web\": the object has been modified; please apply your changes to the latest version and try again"
        )
    );
    let current = deployments.get_scale("web").await.expect("scale");
    let mut fresh = current.clone();
    fresh.spec.get_or_insert_default().replicas = Some(5);
    let written = deployments
        .replace_scale("web", &PostParams::default(), &fresh)
        .await
        .expect("current resourceVersion");
    assert_eq!(written.spec.as_ref().and_then(|s| s.replicas), Some(5));
    let mut unconditional = written.clone();
    unconditional.metadata.resource_version = None;
    unconditional.spec.get_or_insert_default().replicas = Some(0);
    let written = deployments
        .replace_scale("web", &PostParams::default(), &unconditional)
        .await
        .expect("no resourceVersion");
    // Zero replicas are left out of the spec, as Go omits them.
    assert_eq!(
        serde_json::to_value(&written.spec).expect("json"),
        json!({})
    );
    let after = get(&cluster, &format!("{DEPLOYMENTS}/web")).await;
    assert_eq!(after["spec"]["replicas"], json!(0));
}

/// Every verb of the subresource on a missing Deployment is 404, named as the
/// Deployment's is.
#[tokio::test]
async fn the_scale_of_a_missing_workload_is_not_found() {
    let (cluster, _client) = common::start().await;
    let path = format!("{DEPLOYMENTS}/nope/scale");
    let scale = br#"{"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "nope"}, "spec": {"replicas": 1}}"#;
    let cases: [(&str, String, &str, &[u8]); 4] = [
        ("GET", path.clone(), JSON, b""),
        ("PUT", path.clone(), JSON, scale),
        (
            "PATCH",
            path.clone(),
            MERGE,
            br#"{"spec": {"replicas": 1}}"#,
        ),
        ("PATCH", format!("{path}?fieldManager=hpa"), APPLY, scale),
    ];
    for (method, path, content_type, body) in cases {
        let (code, status) = send(&cluster, method, &path, content_type, body).await;
        assert_eq!(code, 404, "{method} {path}: {status}");
        assert_eq!(
            status["message"],
            json!("deployments.apps \"nope\" not found"),
            "{method}"
        );
        assert_eq!(
            status["details"],
            json!({"name": "nope", "group": "apps", "kind": "deployments"})
        );
    }
    let (code, _) = send(
        &cluster,
        "GET",
        "/apis/apps/v1/namespaces/default/daemonsets/x/scale",
        JSON,
        b"",
    )
    .await;
    assert_eq!(code, 404, "daemon sets have no scale");
}

/// Each kind with a `/scale` subresource serves it with its own selector form, and
/// discovery lists it as autoscaling/v1 `Scale`, so `kubectl scale` finds it.
#[tokio::test]
async fn every_scalable_kind_serves_its_scale_and_lists_it() {
    let (cluster, _client) = common::start().await;
    let template = json!({"metadata": {"labels": {"app": "web"}},
                          "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    let selector = json!({"matchLabels": {"app": "web"}});
    let cases = [
        (
            "/apis/apps/v1/namespaces/default/replicasets",
            json!({"replicas": 2, "selector": selector, "template": template}),
        ),
        (
            "/apis/apps/v1/namespaces/default/statefulsets",
            json!({"replicas": 2, "selector": selector, "template": template}),
        ),
        (
            "/api/v1/namespaces/default/replicationcontrollers",
            json!({"replicas": 2, "template": template}),
        ),
    ];
    for (collection, spec) in cases {
        create(
            &cluster,
            collection,
            json!({"metadata": {"name": "web"}, "spec": spec}),
        )
        .await;
        let scale = get(&cluster, &format!("{collection}/web/scale")).await;
        assert_eq!(
            (&scale["kind"], &scale["spec"], &scale["status"]),
            (
                &json!("Scale"),
                &json!({"replicas": 2}),
                &json!({"replicas": 0, "selector": "app=web"})
            ),
            "{collection}"
        );
        let (code, scaled) = send(
            &cluster,
            "PATCH",
            &format!("{collection}/web/scale"),
            STRATEGIC,
            br#"{"spec": {"replicas": 4}}"#,
        )
        .await;
        assert_eq!(code, 200, "{collection}: {scaled}");
        let object = get(&cluster, &format!("{collection}/web")).await;
        assert_eq!(object["spec"]["replicas"], json!(4), "{collection}");
    }
    let scale_entry = |plural: &str| {
        json!({"name": format!("{plural}/scale"), "singularName": "", "namespaced": true,
               "group": "autoscaling", "version": "v1", "kind": "Scale",
               "verbs": ["get", "patch", "update"]})
    };
    let apps = get(&cluster, "/apis/apps/v1").await;
    let core = get(&cluster, "/api/v1").await;
    let listed = |list: &Value, entry: Value| {
        list["resources"]
            .as_array()
            .expect("resources")
            .contains(&entry)
    };
    for plural in ["deployments", "replicasets", "statefulsets"] {
        assert!(listed(&apps, scale_entry(plural)), "{plural}/scale");
    }
    assert!(listed(&core, scale_entry("replicationcontrollers")));
    assert!(
        !apps["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .any(|r| r["name"] == "daemonsets/scale")
    );
    let lws = get(&cluster, "/apis/leaderworkerset.x-k8s.io/v1").await;
    assert!(listed(&lws, scale_entry("leaderworkersets")));
}

/// A LeaderWorkerSet scales through its CRD's paths: `.spec.replicas`,
/// `.status.replicas`, and `.status.hpaPodSelector` as the selector.
#[tokio::test]
async fn a_leader_worker_set_scales_through_its_crd_paths() {
    let (cluster, client) = common::start().await;
    leader_worker_set(&cluster, 2).await;
    let (code, _) = send(
        &cluster,
        "PATCH",
        &format!("{LWS}/vllm/status"),
        MERGE,
        br#"{"status": {"replicas": 1, "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=vllm"}}"#,
    )
    .await;
    assert_eq!(code, 200);
    let sets = Api::<LeaderWorkerSet>::namespaced(client, "default");
    let scale = sets.get_scale("vllm").await.expect("scale");
    assert_eq!(
        serde_json::to_value((&scale.spec, &scale.status)).expect("json"),
        json!([{"replicas": 2},
               {"replicas": 1, "selector": "leaderworkerset.sigs.k8s.io/name=vllm"}])
    );
    let scaled = sets
        .patch_scale(
            "vllm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .expect("scaled");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(3));
    let set = sets.get("vllm").await.expect("lws");
    assert_eq!(set.spec.replicas, 3);
    assert_eq!(set.metadata.generation, Some(2));
    let path = format!("{LWS}/vllm/scale");
    let (code, status) = send(
        &cluster,
        "PATCH",
        &path,
        STRATEGIC,
        br#"{"spec": {"replicas": 1}}"#,
    )
    .await;
    assert_eq!(
        (code, &status["message"]),
        (
            415,
            &json!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )
        )
    );
    let (code, status) = send(
        &cluster,
        "PATCH",
        &path,
        MERGE,
        br#"{"spec": {"replicas": -1}}"#,
    )
    .await;
    assert_eq!(
        (code, &status["message"]),
        (
            422,
            &json!(
                "LeaderWorkerSet.leaderworkerset.x-k8s.io \"vllm\" is invalid: [spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0, .spec.replicas: Invalid value: -1: should be a non-negative integer]"
            )
        )
    );
    let (code, _) = send(
        &cluster,
        "PATCH",
        &path,
        JSON_PATCH,
        br#"[{"op": "replace", "path": "/spec/replicas", "value": 1}]"#,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(sets.get("vllm").await.expect("lws").spec.replicas, 1);
}

/// A custom resource without replicas at its `specReplicasPath` has no `Scale` to read
/// (500, upstream's words), and a write that sets none is refused (400); one that sets
/// them makes the path, however deep.
#[tokio::test]
async fn a_custom_resource_without_replicas_is_scaled_into_having_them() {
    let (cluster, _client) = common::start().await;
    create(
        &cluster,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        json!({"metadata": {"name": "widgets.example.dev"}, "spec": {
            "group": "example.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.size.count", "statusReplicasPath": ".status.count"}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "size": {"type": "object", "properties": {"count": {"type": "integer"}}}}},
                    "status": {"type": "object", "properties": {"count": {"type": "integer"}}}}}}}]}}),
    )
    .await;
    let widgets = "/apis/example.dev/v1/namespaces/default/widgets";
    create(
        &cluster,
        widgets,
        json!({"metadata": {"name": "w"}, "spec": {}}),
    )
    .await;
    let scale = format!("{widgets}/w/scale");
    let (code, status) = send(&cluster, "GET", &scale, JSON, b"").await;
    assert_eq!(
        (code, &status["message"]),
        (
            500,
            &json!(
                "Internal error occurred: the spec replicas field \".spec.size.count\" does not exist"
            )
        )
    );
    let (code, status) = send(
        &cluster,
        "PATCH",
        &scale,
        MERGE,
        br#"{"metadata": {"labels": {"a": "b"}}}"#,
    )
    .await;
    assert_eq!(
        (code, &status["message"]),
        (
            400,
            &json!("the spec replicas field \".spec.size.count\" cannot be empty")
        )
    );
    let (code, scaled) = send(
        &cluster,
        "PATCH",
        &scale,
        MERGE,
        br#"{"spec": {"replicas": 2}}"#,
    )
    .await;
    assert_eq!((code, &scaled["spec"]), (200, &json!({"replicas": 2})));
    let widget = get(&cluster, &format!("{widgets}/w")).await;
    assert_eq!(
        (&widget["spec"], &widget["metadata"]["generation"]),
        (&json!({"size": {"count": 2}}), &json!(2))
    );
}

/// The managed fields of a scale write are upstream's: the writer owns the replicas
/// through the `scale` subresource (an entry without a time, as kube-apiserver leaves
/// it), the applier that owned them keeps its other fields, and a later apply to the
/// `Scale` by another manager conflicts with the scale writer unless forced.
#[tokio::test]
async fn scale_writers_own_the_replicas_and_applies_conflict_over_them() {
    let (cluster, _client) = common::start().await;
    let body = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
    let (code, _) = send(
        &cluster,
        "PATCH",
        &format!("{DEPLOYMENTS}/web?fieldManager=kubectl"),
        APPLY,
        &serde_json::to_vec(&body).expect("json"),
    )
    .await;
    assert_eq!(code, 201);
    let scale = format!("{DEPLOYMENTS}/web/scale");
    let (code, _) = send(
        &cluster,
        "PATCH",
        &format!("{scale}?fieldManager=kubectl"),
        MERGE,
        br#"{"spec": {"replicas": 3}}"#,
    )
    .await;
    assert_eq!(code, 200);
    let managed = |object: &Value| {
        object["metadata"]["managedFields"]
            .as_array()
            .expect("managed fields")
            .iter()
            .map(|entry| {
                (
                    entry["manager"].as_str().unwrap_or("").to_string(),
                    entry["operation"].as_str().unwrap_or("").to_string(),
                    entry.get("subresource").cloned(),
                    entry.get("time").is_some(),
                    entry["fieldsV1"]["f:spec"]
                        .as_object()
                        .map(|spec| spec.contains_key("f:replicas")),
                )
            })
            .collect::<Vec<_>>()
    };
    let object = get(&cluster, &format!("{DEPLOYMENTS}/web")).await;
    assert_eq!(
        managed(&object),
        vec![
            ("kubectl".into(), "Apply".into(), None, true, Some(false)),
            (
                "kubectl".into(),
                "Update".into(),
                Some(json!("scale")),
                false,
                Some(true)
            ),
        ]
    );
    let apply = br#"{"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "web"}, "spec": {"replicas": 7}}"#;
    let (code, status) = send(
        &cluster,
        "PATCH",
        &format!("{scale}?fieldManager=hpa"),
        APPLY,
        apply,
    )
    .await;
    assert_eq!(code, 409, "{status}");
    assert_eq!(
        status["message"],
        json!(
            "Apply failed with 1 conflict: conflict with \"kubectl\" with subresource \"scale\" using autoscaling/v1: .spec.replicas"
        )
    );
    let (code, applied) = send(
        &cluster,
        "PATCH",
        &format!("{scale}?fieldManager=hpa&force=true"),
        APPLY,
        apply,
    )
    .await;
    assert_eq!((code, &applied["spec"]), (200, &json!({"replicas": 7})));
    let object = get(&cluster, &format!("{DEPLOYMENTS}/web")).await;
    assert_eq!(
        managed(&object),
        vec![
            ("kubectl".into(), "Apply".into(), None, true, Some(false)),
            (
                "hpa".into(),
                "Apply".into(),
                Some(json!("scale")),
                false,
                Some(true)
            ),
        ]
    );
}

/// What kube-apiserver refuses of a `Scale`, it refuses here, in its words: negative
/// replicas (422 on the `Scale`), a uid that is not the workload's (409), another kind
/// in the body or a field of the wrong type (400), an unknown field under `Strict`
/// (400), a name that is not the URL's (400); `dryRun` writes nothing.
#[tokio::test]
async fn a_bad_scale_is_refused_in_upstreams_words() {
    let (cluster, _client) = common::start().await;
    let created = deployment(&cluster, 2).await;
    let path = format!("{DEPLOYMENTS}/web/scale");
    let scale = |spec: Value| {
        serde_json::to_vec(&json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                   "metadata": {"name": "web"}, "spec": spec}))
        .expect("json")
    };
    let uid = created["metadata"]["uid"].as_str().expect("uid");
    // (method, path, content type, body, status code, message)
    type Case = (&'static str, String, &'static str, Vec<u8>, u16, String);
    let cases: Vec<Case> = vec![
        ("PUT", path.clone(), JSON, scale(json!({"replicas": -1})), 422,
         "Scale.autoscaling \"web\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0".into()),
        ("PATCH", path.clone(), MERGE, br#"{"metadata": {"uid": "other"}, "spec": {"replicas": 1}}"#.to_vec(), 409,
         format!("Operation cannot be fulfilled on deployments/scale.apps \"web\": Precondition failed: UID in precondition: other, UID in object meta: {uid}")),
        ("PUT", path.clone(), JSON,
         br#"{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}}"#.to_vec(), 400,
         "Deployment in version \"v1\" cannot be handled as a Scale: converting (v1.Deployment) to (autoscaling.Scale): unknown conversion".into()),
        ("PUT", path.clone(), JSON, scale(json!({"replicas": "4"})), 400,
         "Scale in version \"v1\" cannot be handled as a Scale: spec.replicas: invalid type: string \"4\", expected i32".into()),
        ("PUT", format!("{path}?fieldValidation=Strict"), JSON, scale(json!({"replicas": 4, "foo": 1})), 400,
         "Scale in version \"v1\" cannot be handled as a Scale: strict decoding error: unknown field \"spec.foo\"".into()),
        ("PUT", path.clone(), JSON,
         br#"{"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "other"}, "spec": {"replicas": 4}}"#.to_vec(), 400,
         "the name of the object (other) does not match the name on the URL (web)".into()),
    ];
    for (method, path, content_type, body, code, message) in cases {
        let (got, status) = send(&cluster, method, &path, content_type, &body).await;
        assert_eq!(
            (got, &status["message"]),
            (code, &json!(message)),
            "{method} {path}"
        );
    }
    let (code, answer) = send(
        &cluster,
        "PATCH",
        &format!("{path}?dryRun=All"),
        MERGE,
        br#"{"spec": {"replicas": 9}}"#,
    )
    .await;
    assert_eq!((code, &answer["spec"]), (200, &json!({"replicas": 9})));
    let after = get(&cluster, &format!("{DEPLOYMENTS}/web")).await;
    assert_eq!(after["spec"]["replicas"], json!(2));
    assert_eq!(
        after["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
}
