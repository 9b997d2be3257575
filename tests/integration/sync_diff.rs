//! Diffing desired objects against the embedded cluster through server-side apply dry
//! runs: no noise from server-owned or defaulted fields, real changes shown, Secret
//! values masked.

use crate::common;

use capstan::sync::diff::{Action, diff_object};
use capstan_api::managers;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::json;

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn apply(client: &kube::Client, resource: &ApiResource, object: &serde_json::Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", resource);
    let name = object["metadata"]["name"].as_str().expect("name");
    api.patch(
        name,
        &PatchParams::apply(managers::SYNC).force(),
        &Patch::Apply(object),
    )
    .await
    .expect("apply");
}

#[tokio::test]
async fn applied_objects_diff_as_unchanged_despite_defaults() {
    let (_cluster, client) = common::start().await;
    let daemon_sets = resource("apps", "v1", "DaemonSet", "daemonsets");
    let desired = json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "plugin", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "p"}},
                 "template": {"metadata": {"labels": {"app": "p"}}, "spec": {"containers": [{"name": "p", "image": "p:v1"}]}}}
    });
    let created = diff_object(&client, &daemon_sets, &desired)
        .await
        .expect("diff");
    assert_eq!(created.action, Action::Create);
    assert!(
        created.diff.contains("+kind: DaemonSet"),
        "{}",
        created.diff
    );
    apply(&client, &daemon_sets, &desired).await;
    let again = diff_object(&client, &daemon_sets, &desired)
        .await
        .expect("diff");
    assert_eq!(again.action, Action::Unchanged, "{}", again.diff);
    let mut changed = desired.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("p:v2");
    let configured = diff_object(&client, &daemon_sets, &changed)
        .await
        .expect("diff");
    assert_eq!(configured.action, Action::Configure);
    assert!(
        configured.diff.contains("-") && configured.diff.contains("image: p:v2"),
        "{}",
        configured.diff
    );
}

#[tokio::test]
async fn secret_values_never_show_in_a_diff() {
    let (_cluster, client) = common::start().await;
    let secrets = resource("", "v1", "Secret", "secrets");
    let secret = |value: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "namespace": "default"},
                                      "data": {"token": value, "user": "YWRtaW4="}})
    };
    apply(&client, &secrets, &secret("c2VjcmV0LTE=")).await;
    let diff = diff_object(&client, &secrets, &secret("c2VjcmV0LTI="))
        .await
        .expect("diff");
    assert_eq!(diff.action, Action::Configure);
    assert!(
        !diff.diff.contains("c2VjcmV0") && !diff.diff.contains("YWRtaW4="),
        "{}",
        diff.diff
    );
    assert!(diff.diff.contains("(after)"), "{}", diff.diff);
}
