//! Custom resources are validated against their CRD's structural schema on create,
//! update, every patch type and server-side apply, as kube-apiserver validates them: 422
//! Invalid with a cause per field in upstream's words
//! (`Module.kmm.sigs.x-k8s.io "x" is invalid: spec.selector: Required value`), and
//! nothing stored. Updates are ratcheted (what they leave as it was is not checked
//! again); status writes validate the status alone.

use crate::common;
use crate::requests::{APPLY, JSON, JSON_PATCH, MERGE, MODULES, create, get, module, send};

use capstan_cluster::EmbeddedCluster;
use serde_json::{Value, json};

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
const WIDGETS: &str = "/apis/example.dev/v1/namespaces/default/widgets";

/// The CRD of `Widget`, whose spec has one field per keyword; `size_max` bounds
/// `spec.size`.
fn widget_crd(size_max: i64) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.example.dev"},
    "spec": {"group": "example.dev", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
        "versions": [{"name": "v1", "served": true, "storage": true,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer", "minimum": 1, "maximum": size_max},
                    "mode": {"type": "string", "enum": ["fast", "safe"]},
                    "name": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
                    "items": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}},
                    "labels": {"type": "object", "minProperties": 1,
                               "additionalProperties": {"type": "string"}},
                    "port": {"x-kubernetes-int-or-string": true},
                    "note": {"type": "string", "nullable": true},
                    "since": {"type": "string", "format": "date-time"},
                    "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1},
                    "tier": {"type": "string", "default": "gold"}
                }},
                "status": {"type": "object", "properties": {
                    "count": {"type": "integer", "minimum": 0}
                }}
            }}}}]}})
}

async fn serve_widgets(cluster: &EmbeddedCluster) {
    create(cluster, CRDS, widget_crd(10)).await;
}

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.dev/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

/// Each keyword refuses a create as upstream does; the message and its causes are
/// upstream's, and nothing is stored.
#[tokio::test]
async fn custom_resources_that_break_their_schema_are_refused() {
    let (cluster, _client) = common::start().await;
    let mut no_selector = module("x");
    no_selector["spec"]
        .as_object_mut()
        .expect("spec")
        .remove("selector");
    let (code, status) = send(&cluster, "POST", MODULES, JSON, &bytes(&no_selector)).await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "{status}"
    );
    assert_eq!(
        status["message"],
        "Module.kmm.sigs.x-k8s.io \"x\" is invalid: spec.selector: Required value"
    );
    assert_eq!(
        status["details"],
        json!({"name": "x", "group": "kmm.sigs.x-k8s.io", "kind": "Module",
               "causes": [{"reason": "FieldValueRequired", "message": "Required value",
                           "field": "spec.selector"}]})
    );

    serve_widgets(&cluster).await;
    #[rustfmt::skip]
    let cases: Vec<(Value, &str)> = vec![
        (json!({}), "spec.size: Required value"),
        (json!({"size": 0}), "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"),
        (json!({"size": 11}), "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"),
        (json!({"size": "3"}), "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\""),
        (json!({"size": 1.5}), "[spec.size: Invalid value: \"number\": spec.size in body must be of type integer: \"number\", : Invalid value: \"\": Checked value must be of type integer (default format) in spec.size]"),
        (json!({"size": 1, "mode": "slow"}), "spec.mode: Unsupported value: \"slow\": supported values: \"fast\", \"safe\""),
        (json!({"size": 1, "name": "verylongname"}), "spec.name: Too long: may not be more than 8 bytes"),
        (json!({"size": 1, "name": "Caps"}), "spec.name: Invalid value: \"Caps\": spec.name in body should match '^[a-z]+$'"),
        (json!({"size": 1, "items": []}), "spec.items: Invalid value: 0: spec.items in body should have at least 1 items"),
        (json!({"size": 1, "items": ["a", "b", "c"]}), "spec.items: Too many: 3: must have at most 2 items"),
        (json!({"size": 1, "labels": {}}), "spec.labels: Invalid value: 0: spec.labels in body should have at least 1 properties"),
        (json!({"size": 1, "port": true}), "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\""),
        (json!({"size": 1, "since": "yesterday"}), "spec.since: Invalid value: \"yesterday\": spec.since in body must be of type date-time: \"yesterday\""),
        (json!({"size": 1, "ratio": 1}), "spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1"),
        (json!({"size": 0, "mode": "slow"}), "[spec.mode: Unsupported value: \"slow\": supported values: \"fast\", \"safe\", spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1]"),
    ];
    for (spec, want) in cases {
        let (code, status) = send(
            &cluster,
            "POST",
            WIDGETS,
            JSON,
            &bytes(&widget("w", spec.clone())),
        )
        .await;
        assert_eq!(code, 422, "{spec}: {status}");
        assert_eq!(
            status["message"],
            format!("Widget.example.dev \"w\" is invalid: {want}"),
            "{spec}"
        );
        let (code, _) = send(&cluster, "GET", &format!("{WIDGETS}/w"), JSON, b"").await;
        assert_eq!(code, 404, "{spec}: nothing stored");
    }
    for spec in [
        json!({"size": 1, "port": 80, "note": null, "mode": "fast"}),
        json!({"size": 10, "port": "http", "since": "2026-01-02T03:04:05Z", "ratio": 0.5,
               "items": ["a"], "labels": {"a": "b"}, "name": "abc"}),
    ] {
        let created = create(&cluster, WIDGETS, widget("ok", spec.clone())).await;
        assert_eq!(created["spec"]["tier"], "gold", "{spec}: defaulted");
        let (code, _) = send(&cluster, "DELETE", &format!("{WIDGETS}/ok"), JSON, b"").await;
        assert_eq!(code, 200);
    }
}

/// A `null` the schema does not allow is a field not sent: dropped, or given its default.
#[tokio::test]
async fn nulls_are_dropped_or_defaulted() {
    let (cluster, _client) = common::start().await;
    serve_widgets(&cluster).await;
    let created = create(
        &cluster,
        WIDGETS,
        widget(
            "w",
            json!({"size": 2, "mode": null, "tier": null, "note": null}),
        ),
    )
    .await;
    assert_eq!(
        created["spec"],
        json!({"size": 2, "tier": "gold", "note": null})
    );
    let (code, status) = send(
        &cluster,
        "POST",
        WIDGETS,
        JSON,
        &bytes(&widget("v", json!({"size": null}))),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "Widget.example.dev \"v\" is invalid: spec.size: Required value"
    );
}

/// Update, merge patch, JSON patch and server-side apply are all validated, and a
/// refused write changes nothing.
#[tokio::test]
async fn every_write_verb_is_validated() {
    let (cluster, _client) = common::start().await;
    serve_widgets(&cluster).await;
    let stored = create(&cluster, WIDGETS, widget("w", json!({"size": 2}))).await;
    let path = format!("{WIDGETS}/w");
    let mut replaced = stored.clone();
    replaced["spec"]["size"] = json!(0);
    let want = "Widget.example.dev \"w\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1";
    let cases: Vec<(&str, String, &str, Vec<u8>)> = vec![
        ("PUT", path.clone(), JSON, bytes(&replaced)),
        (
            "PATCH",
            path.clone(),
            MERGE,
            br#"{"spec": {"size": 0}}"#.to_vec(),
        ),
        (
            "PATCH",
            path.clone(),
            JSON_PATCH,
            br#"[{"op": "replace", "path": "/spec/size", "value": 0}]"#.to_vec(),
        ),
        (
            "PATCH",
            format!("{path}?fieldManager=tester&force=true"),
            APPLY,
            b"apiVersion: example.dev/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 0\n"
                .to_vec(),
        ),
        (
            "PATCH",
            format!("{WIDGETS}/new?fieldManager=tester"),
            APPLY,
            b"apiVersion: example.dev/v1\nkind: Widget\nmetadata:\n  name: new\nspec:\n  size: 0\n"
                .to_vec(),
        ),
    ];
    for (method, path, content_type, body) in cases {
        let (code, status) = send(&cluster, method, &path, content_type, &body).await;
        assert_eq!(code, 422, "{method} {content_type} {path}: {status}");
        let want = if path.contains("/new") {
            want.replace("\"w\"", "\"new\"")
        } else {
            want.to_string()
        };
        assert_eq!(status["message"], want, "{method} {content_type}");
    }
    assert_eq!(
        get(&cluster, &format!("{WIDGETS}/w")).await,
        stored,
        "nothing changed"
    );
    let (code, _) = send(&cluster, "GET", &format!("{WIDGETS}/new"), JSON, b"").await;
    assert_eq!(code, 404, "nothing created by apply");
}

/// Once the CRD grows stricter, an object stored before can still be changed where it
/// is valid: an update checks what it changes (ratcheting), and a status write checks
/// the status alone.
#[tokio::test]
async fn updates_check_only_what_they_change_and_status_writes_only_the_status() {
    let (cluster, _client) = common::start().await;
    serve_widgets(&cluster).await;
    create(&cluster, WIDGETS, widget("w", json!({"size": 8}))).await;
    let mut stricter = get(&cluster, &format!("{CRDS}/widgets.example.dev")).await;
    stricter["spec"] = widget_crd(5)["spec"].clone();
    let (code, crd) = send(
        &cluster,
        "PUT",
        &format!("{CRDS}/widgets.example.dev"),
        JSON,
        &bytes(&stricter),
    )
    .await;
    assert_eq!(code, 200, "{crd}");
    let path = format!("{WIDGETS}/w");

    let (code, status) = send(
        &cluster,
        "PATCH",
        &path,
        MERGE,
        br#"{"spec": {"mode": "fast"}}"#,
    )
    .await;
    assert_eq!(code, 200, "size is left as it was: {status}");
    let (code, status) = send(&cluster, "PATCH", &path, MERGE, br#"{"spec": {"size": 7}}"#).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "Widget.example.dev \"w\" is invalid: spec.size: Invalid value: 7: spec.size in body should be less than or equal to 5"
    );

    let status_path = format!("{path}/status");
    let (code, status) = send(
        &cluster,
        "PATCH",
        &status_path,
        MERGE,
        br#"{"status": {"count": 3}}"#,
    )
    .await;
    assert_eq!(code, 200, "the spec is not the status write's: {status}");
    let (code, status) = send(
        &cluster,
        "PATCH",
        &status_path,
        MERGE,
        br#"{"status": {"count": -1}}"#,
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "Widget.example.dev \"w\" is invalid: status.count: Invalid value: -1: count in body should be greater than or equal to 0"
    );
    assert_eq!(get(&cluster, &path).await["status"], json!({"count": 3}));
}
