//! Built-in objects with a field of the wrong type (`"replicas": "three"`) are refused
//! as kube-apiserver refuses them, 400 BadRequest naming the field
//! (``StatefulSet in version "v1" cannot be handled as a StatefulSet: ...``), on every
//! write verb, and nothing is stored that a typed client could not read back.

use crate::common;
use crate::requests::{
    APPLY, JSON, JSON_PATCH, MAPS, MERGE, PODS, SECRETS, STATEFUL_SETS, STRATEGIC, create, get,
    read_all, seed, send,
};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// kube-apiserver decodes a built-in kind into its Go type, so a field of the wrong
/// type is a 400 naming it; the embedded server decodes into the k8s-openapi type.
/// One case per built-in kind the server serves.
#[tokio::test]
async fn every_built_in_kind_refuses_a_field_of_the_wrong_type() {
    let (cluster, client) = common::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/api/v1/namespaces",
            json!({"spec": {"finalizers": "kubernetes"}}),
            "spec.finalizers",
        ),
        (
            "/api/v1/nodes",
            json!({"spec": {"unschedulable": "yes"}}),
            "spec.unschedulable",
        ),
        (
            PODS,
            json!({"spec": {"containers": [{"name": "a", "image": 5}]}}),
            "spec.containers[0].image",
        ),
        (MAPS, json!({"data": {"a": 1}}), "data.a"),
        (
            MAPS,
            json!({"metadata": {"labels": {"app": 1}}}),
            "metadata.labels.app",
        ),
        (SECRETS, json!({"data": {"a": "not base64!"}}), "data.a"),
        (SECRETS, json!({"stringData": {"a": 1}}), "stringData.a"),
        (
            "/api/v1/namespaces/default/serviceaccounts",
            json!({"automountServiceAccountToken": "yes"}),
            "automountServiceAccountToken",
        ),
        (
            "/api/v1/namespaces/default/services",
            json!({"spec": {"ports": [{"port": "eighty"}]}}),
            "spec.ports[0].port",
        ),
        (
            "/api/v1/namespaces/default/events",
            json!({"involvedObject": {"kind": "Pod"}, "count": "many"}),
            "count",
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/default/events",
            json!({"deprecatedCount": "many"}),
            "deprecatedCount",
        ),
        (
            "/apis/apps/v1/namespaces/default/daemonsets",
            json!({"spec": {"minReadySeconds": "soon"}}),
            "spec.minReadySeconds",
        ),
        (
            STATEFUL_SETS,
            json!({"spec": {"replicas": "three"}}),
            "spec.replicas",
        ),
        (
            "/apis/apps/v1/namespaces/default/deployments",
            json!({"spec": {"replicas": "3"}}),
            "spec.replicas",
        ),
        (
            "/apis/apps/v1/namespaces/default/replicasets",
            json!({"spec": {"minReadySeconds": "soon"}}),
            "spec.minReadySeconds",
        ),
        (
            "/api/v1/namespaces/default/replicationcontrollers",
            json!({"spec": {"selector": {"app": 1}}}),
            "spec.selector.app",
        ),
        (
            "/apis/apps/v1/namespaces/default/controllerrevisions",
            json!({"revision": "first"}),
            "revision",
        ),
        (
            "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
            json!({"spec": {"minAvailable": true}}),
            "spec.minAvailable",
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            json!({"spec": {"leaseDurationSeconds": "long"}}),
            "spec.leaseDurationSeconds",
        ),
        (
            "/apis/sim.capstan.dev/v1/nodekernels",
            json!({"modules": {"my_kmod": {"parameters": "a=1"}}}),
            "modules",
        ),
        (
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json!({"spec": {"group": 5}}),
            "spec.group",
        ),
    ];
    for (collection, mut body, field) in cases {
        body["metadata"]["name"] = json!("wrong");
        let what = format!("{collection} with {body}");
        let body = serde_json::to_vec(&body).expect("json");
        let (code, status) = send(&cluster, "POST", collection, JSON, &body).await;
        assert_eq!(code, 400, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["reason"], "BadRequest", "{what}: {status}");
        let message = status["message"].as_str().unwrap_or("");
        assert!(
            message.contains("cannot be handled as a") && message.contains(field),
            "{what}: {message}"
        );
        let (code, _) = send(&cluster, "GET", &format!("{collection}/wrong"), JSON, b"").await;
        assert_eq!(code, 404, "{what}: nothing stored");
    }
    Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect("config maps still decode");
}

/// The same check holds for an update, every patch type and the status subresource:
/// the write is refused naming the field, the object is unchanged, and a typed client
/// still lists the namespace.
#[tokio::test]
async fn a_write_that_gives_a_field_the_wrong_type_is_refused_and_changes_nothing() {
    let (cluster, client) = common::start().await;
    seed(&cluster).await;
    create(
        &cluster,
        STATEFUL_SETS,
        json!({"metadata": {"name": "web"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": [{"name": "app", "image": "app:v1"}]}}}}),
    )
    .await;
    let map = format!("{MAPS}/c");
    let stateful_set = format!("{STATEFUL_SETS}/web");
    let pod = format!("{PODS}/p");
    let mut replaced = get(&cluster, &map).await;
    replaced["data"]["a"] = json!(1);
    let replaced = serde_json::to_vec(&replaced).expect("json");
    let cases: Vec<(&str, String, &str, &[u8], &str)> = vec![
        ("PUT", map.clone(), JSON, &replaced, "data.a"),
        (
            "PATCH",
            map.clone(),
            MERGE,
            br#"{"data": {"a": 1}}"#,
            "data.a",
        ),
        (
            "PATCH",
            map.clone(),
            JSON_PATCH,
            br#"[{"op": "add", "path": "/data/b", "value": 2}]"#,
            "data.b",
        ),
        (
            "PATCH",
            format!("{map}?fieldManager=tester"),
            APPLY,
            b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: 1\n",
            "data.a",
        ),
        (
            "PATCH",
            stateful_set.clone(),
            STRATEGIC,
            br#"{"spec": {"replicas": "three"}}"#,
            "spec.replicas",
        ),
        (
            "PATCH",
            stateful_set.clone(),
            MERGE,
            br#"{"spec": {"replicas": "three"}}"#,
            "spec.replicas",
        ),
        (
            "PATCH",
            format!("{stateful_set}/status"),
            MERGE,
            br#"{"status": {"replicas": "three"}}"#,
            "status.replicas",
        ),
        (
            "PATCH",
            format!("{pod}/status"),
            MERGE,
            br#"{"status": {"phase": 3}}"#,
            "status.phase",
        ),
        (
            "PATCH",
            pod.clone(),
            STRATEGIC,
            br#"{"spec": {"containers": [{"name": "app", "image": ["x"]}]}}"#,
            "spec.containers[0].image",
        ),
    ];
    let before = read_all(&cluster, &[&map, &stateful_set, &pod]).await;
    for (method, path, content_type, body, field) in cases {
        let what = format!(
            "{method} {content_type} {} to {path}",
            String::from_utf8_lossy(body)
        );
        let (code, status) = send(&cluster, method, &path, content_type, body).await;
        assert_eq!(code, 400, "{what}: {status}");
        assert_eq!(status["reason"], "BadRequest", "{what}: {status}");
        let message = status["message"].as_str().unwrap_or("");
        assert!(message.contains(field), "{what}: {message}");
    }
    assert_eq!(
        read_all(&cluster, &[&map, &stateful_set, &pod]).await,
        before
    );
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("config maps decode");
    Api::<StatefulSet>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("stateful sets decode");
    Api::<Pod>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect("pods decode");
}
