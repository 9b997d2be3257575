//! `fieldValidation` on built-in kinds as on custom resources, as kube-apiserver does
//! it: `Strict` refuses a field the kind does not know (400 on a create or update, 422
//! on a patch), `Warn` (the default) drops it and names it in a `Warning` header,
//! `Ignore` drops it silently; server-side apply refuses it whatever the directive.

use crate::common;
use crate::requests::{
    APPLY, JSON, MAPS, MERGE, MODULES, PODS, STRATEGIC, create, get, module, send, send_warned,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

fn pod_with_foo() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"foo": true, "containers": [{"name": "app", "image": "registry.example/app:v1"}]}})
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).expect("json")
}

/// A create or update naming a field the kind does not know is refused with upstream's
/// strict decoding error, and nothing is written.
#[tokio::test]
async fn strict_refuses_unknown_fields_of_built_in_kinds() {
    let (cluster, client) = common::start().await;
    let (code, status) = send(
        &cluster,
        "POST",
        &format!("{PODS}?fieldValidation=Strict"),
        JSON,
        &bytes(&pod_with_foo()),
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (400, Some("BadRequest")),
        "{status}"
    );
    assert_eq!(
        status["message"],
        "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.foo\""
    );
    let (code, _) = send(&cluster, "GET", &format!("{PODS}/p"), JSON, b"").await;
    assert_eq!(code, 404, "nothing stored");

    let map = create(
        &cluster,
        MAPS,
        json!({"metadata": {"name": "c"}, "data": {"a": "1"}}),
    )
    .await;
    let mut typo = map.clone();
    typo["metadata"]["lables"] = json!({"app": "web"});
    let (code, status) = send(
        &cluster,
        "PUT",
        &format!("{MAPS}/c?fieldValidation=Strict"),
        JSON,
        &bytes(&typo),
    )
    .await;
    assert_eq!(code, 400, "{status}");
    assert_eq!(
        status["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"metadata.lables\""
    );
    assert_eq!(
        get(&cluster, &format!("{MAPS}/c")).await,
        map,
        "nothing changed"
    );

    // A patch of fields the kind knows passes under Strict, as kube's clients send it.
    Api::<ConfigMap>::namespaced(client, "default")
        .patch(
            "c",
            &PatchParams::default().validation_strict(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
        )
        .await
        .expect("a patch its type knows all of");
}

/// A patch that leaves an unknown field is refused as upstream's patcher refuses it:
/// 422 Invalid on the field `patch`, showing what the patch made (the patched object,
/// or a strategic merge patch as Go prints it).
#[tokio::test]
async fn strict_refuses_patches_that_leave_unknown_fields() {
    let (cluster, _client) = common::start().await;
    create(
        &cluster,
        PODS,
        json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:v1"}]}}),
    )
    .await;
    let pod = format!("{PODS}/p");
    let before = get(&cluster, &pod).await;
    let strict = format!("{pod}?fieldValidation=Strict");
    let (code, status) = send(
        &cluster,
        "PATCH",
        &strict,
        STRATEGIC,
        br#"{"spec": {"foo": 1}}"#,
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "{status}"
    );
    assert_eq!(
        status["message"],
        " \"\" is invalid: patch: Invalid value: \"map[spec:map[foo:1]]\": strict decoding error: unknown field \"spec.foo\""
    );
    assert_eq!(status["details"]["causes"][0]["field"], "patch");
    let (code, status) = send(
        &cluster,
        "PATCH",
        &strict,
        MERGE,
        br#"{"spec": {"foo": 1}}"#,
    )
    .await;
    assert_eq!(code, 422, "{status}");
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(" \"\" is invalid: patch: Invalid value: \"{")
            && message.ends_with("\": strict decoding error: unknown field \"spec.foo\""),
        "{message}"
    );
    assert_eq!(get(&cluster, &pod).await, before, "nothing changed");
}

/// Without a directive, or with `Warn`, the field is dropped and each is named in a
/// `Warning` header; with `Ignore` it is dropped without a word. Custom resources alike.
#[tokio::test]
async fn warn_and_ignore_drop_unknown_fields() {
    let (cluster, _client) = common::start().await;
    let cases = [
        ("", vec!["299 - \"unknown field \\\"spec.foo\\\"\""]),
        (
            "?fieldValidation=Warn",
            vec!["299 - \"unknown field \\\"spec.foo\\\"\""],
        ),
        ("?fieldValidation=Ignore", vec![]),
    ];
    for (query, want) in cases {
        let (code, created, warnings) = send_warned(
            &cluster,
            "POST",
            &format!("{PODS}{query}"),
            JSON,
            &bytes(&pod_with_foo()),
        )
        .await;
        assert_eq!(code, 201, "{query}: {created}");
        assert_eq!(warnings, want, "{query}");
        assert!(created["spec"].get("foo").is_none(), "{query}: {created}");
        let stored = get(&cluster, &format!("{PODS}/p")).await;
        assert!(stored["spec"].get("foo").is_none(), "{query}: {stored}");
        let (code, _) = send(
            &cluster,
            "DELETE",
            &format!("{PODS}/p?gracePeriodSeconds=0"),
            JSON,
            b"",
        )
        .await;
        assert_eq!(code, 200);
    }
    let mut typo = module("m");
    typo["spec"]["selectr"] = json!({});
    let (code, created, warnings) =
        send_warned(&cluster, "POST", MODULES, JSON, &bytes(&typo)).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(warnings, ["299 - \"unknown field \\\"spec.selectr\\\"\""]);
    assert!(created["spec"].get("selectr").is_none(), "{created}");
}

/// A directive upstream does not know is a 422 naming the options of the verb.
#[tokio::test]
async fn an_unknown_directive_is_invalid() {
    let (cluster, _client) = common::start().await;
    let (code, status) = send(
        &cluster,
        "POST",
        &format!("{PODS}?fieldValidation=strict"),
        JSON,
        &bytes(&pod_with_foo()),
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "{status}"
    );
    assert_eq!(
        status["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: \"strict\": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
    );
}

/// Server-side apply cannot type a configuration with a field the kind does not know:
/// refused whatever the directive, in the words of upstream's field manager.
#[tokio::test]
async fn server_side_apply_refuses_unknown_fields() {
    let (cluster, _client) = common::start().await;
    let cases = [
        (
            format!("{MAPS}/c?fieldManager=tester&fieldValidation=Ignore"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: \"1\"\nfoo: bar\n",
            "failed to create typed patch object (default/c; /v1, Kind=ConfigMap): .foo: field not declared in schema",
        ),
        (
            format!("{MODULES}/m?fieldManager=tester&fieldValidation=Strict"),
            "apiVersion: kmm.sigs.x-k8s.io/v1beta1\nkind: Module\nmetadata:\n  name: m\nspec:\n  selector: {}\n  foo: 1\n",
            "failed to create typed patch object (default/m; kmm.sigs.x-k8s.io/v1beta1, Kind=Module): .spec.foo: field not declared in schema",
        ),
    ];
    for (path, body, want) in cases {
        let (code, status) = send(&cluster, "PATCH", &path, APPLY, body.as_bytes()).await;
        assert_eq!(
            (code, status["reason"].as_str()),
            (400, Some("BadRequest")),
            "{path}: {status}"
        );
        assert_eq!(status["message"], want, "{path}");
        let object = path.split('?').next().unwrap_or_default();
        let (code, _) = send(&cluster, "GET", object, JSON, b"").await;
        assert_eq!(code, 404, "{path}: nothing created");
    }
}
