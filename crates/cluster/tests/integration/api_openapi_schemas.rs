//! The OpenAPI v3 documents, as `kubectl explain` reads them: the root lists a document
//! per served group/version; each holds the schema of every kind it serves, named and
//! marked as kube-apiserver names and marks them, with every `$ref` resolvable in the
//! document; a custom resource's schema is its CRD's and follows the CRD's changes.

use crate::common;
use crate::requests::{JSON, create, get, send};

use capstan_cluster::EmbeddedCluster;
use serde_json::{Value, json};

const SCHEMAS: &str = "#/components/schemas/";
const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

/// The document of `path` (`api/v1`, `apis/apps/v1`) as the root points to it.
async fn document(cluster: &EmbeddedCluster, path: &str) -> Value {
    let root = get(cluster, "/openapi/v3").await;
    let url = root["paths"][path]["serverRelativeURL"]
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not in the root: {root}"));
    get(cluster, url).await
}

/// What `kubectl explain` does to find a kind: the group/version/kind of the
/// operations on its path, then the schema marked with it.
fn explain<'d>(document: &'d Value, path: &str, kind: &str) -> &'d Value {
    let operation = &document["paths"][path]["get"];
    assert_eq!(
        operation["x-kubernetes-group-version-kind"]["kind"],
        json!(kind),
        "{path}"
    );
    let wanted = &operation["x-kubernetes-group-version-kind"];
    document["components"]["schemas"]
        .as_object()
        .expect("schemas")
        .values()
        .find(|schema| {
            schema["x-kubernetes-group-version-kind"]
                .as_array()
                .is_some_and(|kinds| kinds.contains(wanted))
        })
        .unwrap_or_else(|| panic!("no schema is marked {wanted}"))
}

/// The schema a property leads to, through `allOf` and `$ref` as kubectl follows them.
fn field<'d>(document: &'d Value, schema: &'d Value, name: &str) -> &'d Value {
    let resolved = resolve(document, schema);
    let property = &resolved["properties"][name];
    assert!(!property.is_null(), "no {name} in {resolved}");
    property
}

fn resolve<'d>(document: &'d Value, schema: &'d Value) -> &'d Value {
    if let Some(target) = schema["$ref"].as_str() {
        let model = target.strip_prefix(SCHEMAS).expect("a schema reference");
        return &document["components"]["schemas"][model];
    }
    match schema["allOf"].as_array().map(Vec::as_slice) {
        Some([only]) if schema.get("properties").is_none() => resolve(document, only),
        _ => schema,
    }
}

/// Every `$ref` of `value`.
fn references<'v>(value: &'v Value, found: &mut Vec<&'v str>) {
    match value {
        Value::Object(fields) => {
            for (name, child) in fields {
                match (name.as_str(), child.as_str()) {
                    ("$ref", Some(target)) => found.push(target),
                    _ => references(child, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

/// `kubectl explain deployment.spec.template` and `kubectl explain
/// deployment.spec.replicas`: the Deployment's schema leads through the references
/// to the pod template and the replicas, with kube-apiserver's descriptions.
#[tokio::test]
async fn kubectl_explain_walks_a_deployment_to_its_pod_template() {
    let (cluster, _client) = common::start().await;
    let apps = document(&cluster, "apis/apps/v1").await;
    let deployment = explain(
        &apps,
        "/apis/apps/v1/namespaces/{namespace}/deployments/{name}",
        "Deployment",
    );
    assert_eq!(
        deployment["description"],
        json!("Deployment enables declarative updates for Pods and ReplicaSets.")
    );
    assert!(deployment.get("required").is_none(), "metadata is optional");
    let spec = field(&apps, deployment, "spec");
    let replicas = field(&apps, spec, "replicas");
    assert_eq!(
        (&replicas["type"], &replicas["format"]),
        (&json!("integer"), &json!("int32"))
    );
    let template = field(&apps, spec, "template");
    assert_eq!(
        template["allOf"],
        json!([{"$ref": "#/components/schemas/io.k8s.api.core.v1.PodTemplateSpec"}])
    );
    let pod_spec = field(&apps, template, "spec");
    let containers = field(&apps, pod_spec, "containers");
    assert_eq!(containers["type"], json!("array"));
    assert_eq!(
        resolve(&apps, &containers["items"])["required"],
        json!(["name"])
    );
    let metadata = field(&apps, deployment, "metadata");
    assert!(field(&apps, metadata, "labels")["additionalProperties"].is_object());
}

/// Every document the root lists: each served kind (and its list) has a schema marked
/// with its group/version/kind, and every reference resolves within the document.
#[tokio::test]
async fn every_document_defines_its_kinds_and_what_they_refer_to() {
    let (cluster, _client) = common::start().await;
    let root = get(&cluster, "/openapi/v3").await;
    let paths: Vec<String> = root["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    assert!(paths.contains(&"api/v1".to_string()), "{paths:?}");
    for path in paths {
        let document = document(&cluster, &path).await;
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        let mut found = Vec::new();
        references(&document, &mut found);
        for target in found {
            let model = target.strip_prefix(SCHEMAS).expect("a schema reference");
            assert!(
                schemas.contains_key(model),
                "{path}: {target} is not defined"
            );
        }
        let discovery = get(&cluster, &format!("/{path}")).await;
        for resource in discovery["resources"].as_array().expect("resources") {
            if resource["name"]
                .as_str()
                .is_some_and(|name| name.contains('/'))
            {
                continue;
            }
            let kind = resource["kind"].as_str().expect("kind");
            for kind in [kind.to_string(), format!("{kind}List")] {
                let marked = schemas.values().any(|schema| {
                    schema["x-kubernetes-group-version-kind"]
                        .as_array()
                        .is_some_and(|kinds| kinds.iter().any(|k| k["kind"] == json!(kind)))
                });
                assert!(marked, "{path}: no schema for {kind}");
            }
        }
    }
    let (code, _) = send(
        &cluster,
        "GET",
        "/openapi/v3/apis/nothing.example/v1",
        JSON,
        b"",
    )
    .await;
    assert_eq!(code, 404);
}

/// `kubectl explain nodemodulesconfigs.spec`: a custom resource's schema is its CRD's
/// `openAPIV3Schema`, with `metadata` a reference to `ObjectMeta` and its model named
/// as apiextensions-apiserver names it.
#[tokio::test]
async fn a_custom_resources_schema_is_its_crds() {
    let (cluster, _client) = common::start().await;
    let kmm = document(&cluster, "apis/kmm.sigs.x-k8s.io/v1beta1").await;
    let schemas = &kmm["components"]["schemas"];
    let nmc = explain(
        &kmm,
        "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/{name}",
        "NodeModulesConfig",
    );
    assert_eq!(nmc, &schemas["io.x-k8s.sigs.kmm.v1beta1.NodeModulesConfig"]);
    let crd = get(
        &cluster,
        &format!("{CRDS}/nodemodulesconfigs.kmm.sigs.x-k8s.io"),
    )
    .await;
    let published = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    assert_eq!(nmc["properties"]["spec"], published["properties"]["spec"]);
    assert_eq!(
        nmc["properties"]["metadata"]["allOf"],
        json!([{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}])
    );
    assert_eq!(
        schemas["io.x-k8s.sigs.kmm.v1beta1.NodeModulesConfigList"]["properties"]["items"]["items"],
        json!({"$ref": "#/components/schemas/io.x-k8s.sigs.kmm.v1beta1.NodeModulesConfig"})
    );
    let lws = document(&cluster, "apis/leaderworkerset.x-k8s.io/v1").await;
    let scale = &lws["paths"]["/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets/{name}/scale"];
    // apiextensions-apiserver marks a custom resource's scale operations with the
    // custom resource's kind; what they answer is a `Scale`.
    assert_eq!(
        scale["get"]["x-kubernetes-group-version-kind"],
        json!({"group": "leaderworkerset.x-k8s.io", "version": "v1", "kind": "LeaderWorkerSet"})
    );
    assert_eq!(
        scale["get"]["responses"]["200"]["content"]["application/json"]["schema"],
        json!({"$ref": "#/components/schemas/io.k8s.api.autoscaling.v1.Scale"})
    );
    assert!(lws["components"]["schemas"]["io.k8s.api.autoscaling.v1.Scale"].is_object());
}

/// A CRD created, changed and deleted: its group/version's document appears, follows
/// the new schema, and goes.
#[tokio::test]
async fn a_crds_document_follows_the_crd() {
    let (cluster, _client) = common::start().await;
    let crd = |description: &str| {
        json!({"metadata": {"name": "widgets.example.dev"}, "spec": {
            "group": "example.dev", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                              "spec": {"type": "object", "description": description,
                                       "properties": {"size": {"type": "integer"}}}}}}}]}})
    };
    create(&cluster, CRDS, crd("First.")).await;
    let path = "/openapi/v3/apis/example.dev/v1";
    let first = get(&cluster, path).await;
    let widget = &first["components"]["schemas"]["dev.example.v1.Widget"];
    assert_eq!(widget["properties"]["spec"]["description"], json!("First."));
    let mut changed = get(&cluster, &format!("{CRDS}/widgets.example.dev")).await;
    changed["spec"]["versions"][0]["schema"] =
        crd("Second.")["spec"]["versions"][0]["schema"].clone();
    let (code, _) = send(
        &cluster,
        "PUT",
        &format!("{CRDS}/widgets.example.dev"),
        JSON,
        &serde_json::to_vec(&changed).expect("json"),
    )
    .await;
    assert_eq!(code, 200);
    let second = get(&cluster, path).await;
    assert_eq!(
        second["components"]["schemas"]["dev.example.v1.Widget"]["properties"]["spec"]["description"],
        json!("Second.")
    );
    let (code, _) = send(
        &cluster,
        "DELETE",
        &format!("{CRDS}/widgets.example.dev"),
        JSON,
        b"",
    )
    .await;
    assert_eq!(code, 200);
    common::wait_until("the CRD's document goes", async || {
        send(&cluster, "GET", path, JSON, b"").await.0 == 404
    })
    .await;
}
