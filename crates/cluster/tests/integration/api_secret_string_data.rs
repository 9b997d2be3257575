//! A Secret's `stringData` is merged into its `data`, as kube-apiserver converts a v1
//! Secret, and is never stored or returned.

use crate::common;
use crate::requests::{JSON, MERGE, SECRETS, get, send};

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use serde_json::json;

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
        JSON,
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
        JSON,
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
