//! Bad requests get a clear 4xx Status, nothing is half-written, and the server keeps
//! serving; requests without the token get 401. Patches whose result is not an object,
//! and built-in objects with a field of the wrong type, are refused as kube-apiserver
//! refuses them; a Secret's `stringData` is merged into its `data`.

use crate::common;

use base64::Engine as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

const MAPS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";
const SECRETS: &str = "/api/v1/namespaces/default/secrets";
const STATEFUL_SETS: &str = "/apis/apps/v1/namespaces/default/statefulsets";
const MODULES: &str = "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/default/modules";

const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

#[tokio::test]
async fn bad_bodies_are_refused_with_a_status() {
    let (cluster, client) = common::start().await;
    let token = Some(cluster.token());
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            MAPS,
            "application/json",
            b"{\"metadata\": {".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "not an object",
            MAPS,
            "application/json",
            b"[1, 2]".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "malformed YAML",
            MAPS,
            "application/yaml",
            b"metadata: [unclosed".to_vec(),
            400,
            "BadRequest",
        ),
        (
            "no name",
            MAPS,
            "application/json",
            br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "wrong kind",
            MAPS,
            "application/json",
            br#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"}}"#.to_vec(),
            400,
            "BadRequest",
        ),
        (
            "bad name",
            MAPS,
            "application/json",
            br#"{"metadata":{"name":"Not_Valid"}}"#.to_vec(),
            422,
            "Invalid",
        ),
        (
            "unknown kind",
            "/apis/example.dev/v1/namespaces/default/widgets",
            "application/json",
            br#"{"metadata":{"name":"x"}}"#.to_vec(),
            404,
            "NotFound",
        ),
        (
            "oversized",
            MAPS,
            "application/json",
            oversized(),
            413,
            "RequestEntityTooLarge",
        ),
    ];
    for (name, path, content_type, body, want_code, want_reason) in cases {
        let (code, status) = common::raw(&cluster, "POST", path, content_type, body, token).await;
        assert_eq!(code, want_code, "{name}: {status}");
        assert_eq!(status["kind"], "Status", "{name}");
        assert_eq!(status["reason"], want_reason, "{name}: {status}");
        assert!(
            status["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{name}"
        );
    }
    let left = Api::<ConfigMap>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("server still serves");
    assert!(left.items.is_empty(), "nothing half-written");
}

fn oversized() -> Vec<u8> {
    let big = "x".repeat(4 * 1024 * 1024);
    serde_json::to_vec(&json!({"metadata": {"name": "big"}, "data": {"big": big}})).expect("json")
}

#[tokio::test]
async fn a_patch_with_an_unknown_content_type_is_415() {
    let (cluster, client) = common::start().await;
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&Default::default(), &common::config_map("p", json!({})))
        .await
        .expect("create");
    let (code, status) = common::raw(
        &cluster,
        "PATCH",
        &format!("{MAPS}/p"),
        "text/plain",
        b"{}".to_vec(),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
}

#[tokio::test]
async fn requests_without_the_token_are_unauthorized() {
    let (cluster, _client) = common::start().await;
    for token in [None, Some("wrong-token")] {
        for path in ["/api/v1/namespaces", "/version", "/apis"] {
            let (code, status) =
                common::raw(&cluster, "GET", path, "application/json", Vec::new(), token).await;
            assert_eq!(code, 401, "{path} with {token:?}");
            assert_eq!(status["reason"], "Unauthorized");
        }
    }
    let (code, _) = common::raw(
        &cluster,
        "GET",
        "/api/v1/namespaces",
        "application/json",
        Vec::new(),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(code, 200);
}

/// Sends `body` with the cluster's token.
async fn send(
    cluster: &capstan_cluster::EmbeddedCluster,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, Value) {
    common::raw(
        cluster,
        method,
        path,
        content_type,
        body.to_vec(),
        Some(cluster.token()),
    )
    .await
}

async fn create(cluster: &capstan_cluster::EmbeddedCluster, collection: &str, body: Value) {
    let body = serde_json::to_vec(&body).expect("json");
    let (code, created) = send(cluster, "POST", collection, "application/json", &body).await;
    assert_eq!(code, 201, "create in {collection}: {created}");
}

async fn get(cluster: &capstan_cluster::EmbeddedCluster, path: &str) -> Value {
    let (code, object) = send(cluster, "GET", path, "application/json", b"").await;
    assert_eq!(code, 200, "get {path}: {object}");
    object
}

/// The objects at `paths`, as read now.
async fn read_all(cluster: &capstan_cluster::EmbeddedCluster, paths: &[&String]) -> Vec<Value> {
    let mut objects = Vec::new();
    for path in paths {
        objects.push(get(cluster, path).await);
    }
    objects
}

/// A ConfigMap `c`, an unbound Pod `p` (its status Pending, the server's) and a Module
/// `m` with a status, in `default`.
async fn seed(cluster: &capstan_cluster::EmbeddedCluster) {
    create(
        cluster,
        MAPS,
        json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
    )
    .await;
    create(
        cluster,
        PODS,
        json!({"metadata": {"name": "p"},
               "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]}}),
    )
    .await;
    create(
        cluster,
        MODULES,
        json!({"apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
               "metadata": {"name": "m"},
               "spec": {"selector": {"node-role.kubernetes.io/worker": ""},
                        "moduleLoader": {"container": {
                            "modprobe": {"moduleName": "my_kmod"},
                            "kernelMappings": [{"regexp": "^.+$",
                                                "containerImage": "registry.example/kmod:v1"}]}}}}),
    )
    .await;
    let status = br#"{"status": {"moduleLoader": {"desiredNumber": 1}}}"#;
    let (code, module) = send(
        cluster,
        "PATCH",
        &format!("{MODULES}/m/status"),
        MERGE,
        status,
    )
    .await;
    assert_eq!(code, 200, "module status: {module}");
    assert!(module["status"].is_object(), "{module}");
}

/// A merge patch of `null` would replace the whole object with nothing (RFC 7386): as
/// kube-apiserver, the server refuses a patch whose result is not an object, through
/// the main resource and the status subresource, of built-in and custom kinds alike.
#[tokio::test]
async fn a_null_merge_patch_is_refused_and_changes_nothing() {
    let (cluster, _client) = common::start().await;
    seed(&cluster).await;
    let targets = [
        (format!("{MAPS}/c"), ""),
        (format!("{PODS}/p"), ""),
        (format!("{PODS}/p"), "/status"),
        (format!("{MODULES}/m"), ""),
        (format!("{MODULES}/m"), "/status"),
    ];
    for (object, sub) in targets {
        let before = get(&cluster, &object).await;
        let path = format!("{object}{sub}");
        let (code, status) = send(&cluster, "PATCH", &path, MERGE, b"null").await;
        assert_eq!(code, 400, "{path}: {status}");
        assert_eq!(status["kind"], "Status", "{path}");
        assert_eq!(status["reason"], "BadRequest", "{path}: {status}");
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("JSON object")),
            "{path}: {status}"
        );
        assert_eq!(
            get(&cluster, &object).await,
            before,
            "{path} changed nothing"
        );
    }
}

/// Patch bodies of the wrong shape get a 4xx Status, never a dropped connection, and
/// change nothing: merge, strategic and apply patches that are not objects, JSON patches
/// that are not lists of operations, and patches that leave no object or no metadata.
#[tokio::test]
async fn patches_of_the_wrong_shape_are_refused_with_a_status() {
    let (cluster, client) = common::start().await;
    seed(&cluster).await;
    let map = format!("{MAPS}/c");
    let pod = format!("{PODS}/p");
    let module = format!("{MODULES}/m");
    let apply = |object: &str| format!("{object}?fieldManager=tester");
    let mut cases: Vec<(String, &str, &[u8], u16)> = Vec::new();
    for body in [&b"[1]"[..], b"\"x\"", b"3"] {
        for object in [&map, &pod, &module] {
            cases.push((object.clone(), MERGE, body, 400));
            cases.push((apply(object), APPLY, body, 400));
        }
        for object in [&pod, &module] {
            cases.push((format!("{object}/status"), MERGE, body, 400));
        }
        for object in [&map, &pod] {
            cases.push((object.clone(), STRATEGIC, body, 400));
        }
    }
    cases.push((map.clone(), STRATEGIC, b"null", 400));
    cases.push((format!("{pod}/status"), STRATEGIC, b"[1]", 400));
    // Upstream serves no strategic merge patch for custom resources.
    cases.push((module.clone(), STRATEGIC, b"[1]", 415));
    for object in [&map, &pod, &module] {
        for body in [
            &br#"{"op": "add", "path": "/data/b", "value": "2"}"#[..],
            b"\"x\"",
            b"3",
            b"null",
            br#"[{"op": "replace", "path": "", "value": 3}]"#,
            br#"[{"op": "replace", "path": "/metadata", "value": "x"}]"#,
        ] {
            cases.push((object.clone(), JSON_PATCH, body, 400));
        }
        for body in [&br#"{"metadata": 5}"#[..], br#"{"metadata": [1]}"#] {
            cases.push((object.clone(), MERGE, body, 400));
            cases.push((apply(object), APPLY, body, 400));
        }
    }
    for object in [&map, &pod] {
        cases.push((object.clone(), STRATEGIC, br#"{"metadata": "x"}"#, 400));
    }
    let before = read_all(&cluster, &[&map, &pod, &module]).await;
    for (path, content_type, body, want) in cases {
        let shown = String::from_utf8_lossy(body);
        let what = format!("{content_type} {shown} to {path}");
        let (code, status) = send(&cluster, "PATCH", &path, content_type, body).await;
        let (code, reason) = (code, status["reason"].as_str().unwrap_or(""));
        assert_eq!(code, want, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}: {status}");
        assert!(!reason.is_empty(), "{what}: {status}");
        assert!(
            status["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {status}"
        );
    }
    assert_eq!(read_all(&cluster, &[&map, &pod, &module]).await, before);
    Api::<ConfigMap>::namespaced(client, "default")
        .list(&ListParams::default())
        .await
        .expect("server still serves");
}

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
        let (code, status) = send(&cluster, "POST", collection, "application/json", &body).await;
        assert_eq!(code, 400, "{what}: {status}");
        assert_eq!(status["kind"], "Status", "{what}");
        assert_eq!(status["reason"], "BadRequest", "{what}: {status}");
        let message = status["message"].as_str().unwrap_or("");
        assert!(
            message.contains("cannot be handled as a") && message.contains(field),
            "{what}: {message}"
        );
        let (code, _) = send(
            &cluster,
            "GET",
            &format!("{collection}/wrong"),
            "application/json",
            b"",
        )
        .await;
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
        ("PUT", map.clone(), "application/json", &replaced, "data.a"),
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

/// As kube-apiserver, each `stringData` key is written base64-encoded into `data`
/// (over a `data` key of the same name) on create, update and patch, and `stringData`
/// itself is never stored or returned.
#[tokio::test]
async fn secret_string_data_is_merged_into_data() {
    let (cluster, client) = common::start().await;
    let encoded = |text: &str| json!(base64::engine::general_purpose::STANDARD.encode(text));
    let secret = format!("{SECRETS}/s");
    let body = json!({"metadata": {"name": "s"},
                      "data": {"b": encoded("old"), "kept": encoded("k")},
                      "stringData": {"a": "hello", "b": "new"}});
    let (code, created) = send(
        &cluster,
        "POST",
        SECRETS,
        "application/json",
        &serde_json::to_vec(&body).expect("json"),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let want = json!({"a": encoded("hello"), "b": encoded("new"), "kept": encoded("k")});
    assert_eq!(created["data"], want, "create answers merged: {created}");
    assert!(created.get("stringData").is_none(), "{created}");
    assert_eq!(
        get(&cluster, &secret).await,
        created,
        "create stores merged"
    );

    let mut replaced = created.clone();
    replaced["stringData"] = json!({"c": "see"});
    let (code, updated) = send(
        &cluster,
        "PUT",
        &secret,
        "application/json",
        &serde_json::to_vec(&replaced).expect("json"),
    )
    .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["data"]["c"], encoded("see"), "{updated}");
    assert_eq!(updated["data"]["a"], encoded("hello"), "{updated}");
    assert!(updated.get("stringData").is_none(), "{updated}");

    let (code, patched) = send(
        &cluster,
        "PATCH",
        &secret,
        MERGE,
        br#"{"stringData": {"a": "changed"}}"#,
    )
    .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["data"]["a"], encoded("changed"), "{patched}");
    assert_eq!(patched["data"]["c"], encoded("see"), "{patched}");
    assert!(patched.get("stringData").is_none(), "{patched}");
    assert_eq!(get(&cluster, &secret).await, patched, "patch stores merged");

    let typed = Api::<Secret>::namespaced(client, "default")
        .get("s")
        .await
        .expect("typed get");
    assert!(typed.string_data.is_none());
    let data = typed.data.expect("data");
    assert_eq!(data["a"].0, b"changed");
    assert_eq!(data["kept"].0, b"k");
}
