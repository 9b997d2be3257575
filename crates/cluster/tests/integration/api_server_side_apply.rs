//! Server-side apply: field ownership per manager, conflicts and force, removal of
//! fields a manager stops applying, dry-run, and creation by apply.

use crate::common;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager)
}

fn cm(data: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned"}, "data": data})
}

fn managers(object: &ConfigMap) -> Vec<String> {
    object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.clone())
        .collect()
}

#[tokio::test]
async fn apply_creates_then_owns_its_fields() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let created = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect("create by apply");
    assert_eq!(managers(&created), ["capstan"]);
    let entry = &created.metadata.managed_fields.as_ref().expect("managed")[0];
    assert_eq!(entry.operation.as_deref(), Some("Apply"));
    let fields = serde_json::to_value(entry.fields_v1.as_ref().expect("fields")).expect("json");
    assert_eq!(fields["f:data"]["f:a"], json!({}));
    // Re-applying the same configuration writes nothing.
    let again = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect("no-op");
    assert_eq!(
        again.metadata.resource_version,
        created.metadata.resource_version
    );
}

#[tokio::test]
async fn conflicting_managers_conflict_unless_forced() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.patch(
        "owned",
        &apply("capstan"),
        &Patch::Apply(cm(json!({"a": "1"}))),
    )
    .await
    .expect("first");
    // Another manager applying a different field shares the object without conflict.
    let shared = maps
        .patch(
            "owned",
            &apply("other"),
            &Patch::Apply(cm(json!({"b": "2"}))),
        )
        .await
        .expect("second");
    let mut owners = managers(&shared);
    owners.sort();
    assert_eq!(owners, ["capstan", "other"]);
    // Applying a different value for a field someone else owns is a conflict.
    let err = maps
        .patch(
            "owned",
            &apply("other"),
            &Patch::Apply(cm(json!({"a": "changed", "b": "2"}))),
        )
        .await
        .expect_err("conflict");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 409);
            assert!(
                status.message.contains("capstan") && status.message.contains(".data.a"),
                "{}",
                status.message
            );
        }
        other => panic!("{other}"),
    }
    // Forcing takes the field over; the first manager no longer owns it.
    let forced = maps
        .patch(
            "owned",
            &apply("other").force(),
            &Patch::Apply(cm(json!({"a": "changed", "b": "2"}))),
        )
        .await
        .expect("forced");
    assert_eq!(forced.data.as_ref().expect("data")["a"], "changed");
    assert_eq!(managers(&forced), ["other"], "capstan lost its only field");
}

#[tokio::test]
async fn a_field_no_longer_applied_is_removed() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.patch(
        "owned",
        &apply("capstan"),
        &Patch::Apply(cm(json!({"a": "1", "b": "2"}))),
    )
    .await
    .expect("both");
    let after = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect("only a");
    let data = after.data.expect("data");
    assert!(data.contains_key("a") && !data.contains_key("b"));
}

#[tokio::test]
async fn a_field_another_manager_also_set_survives_removal() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.patch(
        "owned",
        &apply("capstan"),
        &Patch::Apply(cm(json!({"a": "1", "b": "2"}))),
    )
    .await
    .expect("capstan");
    maps.patch(
        "owned",
        &apply("other"),
        &Patch::Apply(cm(json!({"b": "2"}))),
    )
    .await
    .expect("other shares b");
    let after = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect("capstan drops b");
    assert_eq!(
        after.data.expect("data").get("b").map(String::as_str),
        Some("2")
    );
}

#[tokio::test]
async fn an_update_by_hand_then_apply_conflicts() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    maps.patch(
        "owned",
        &apply("capstan"),
        &Patch::Apply(cm(json!({"a": "1"}))),
    )
    .await
    .expect("apply");
    let by_hand = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..PatchParams::default()
    };
    maps.patch(
        "owned",
        &by_hand,
        &Patch::Merge(json!({"data": {"a": "edited"}})),
    )
    .await
    .expect("edit");
    let err = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect_err("drift conflicts");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409 && s.message.contains("kubectl-edit")),
        "{err}"
    );
}

#[tokio::test]
async fn dry_run_apply_changes_nothing() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let shown = maps
        .patch(
            "owned",
            &apply("capstan").dry_run(),
            &Patch::Apply(cm(json!({"a": "1"}))),
        )
        .await
        .expect("dry run");
    assert_eq!(shown.data.expect("data")["a"], "1");
    assert!(maps.get_opt("owned").await.expect("get").is_none());
}

#[tokio::test]
async fn apply_without_a_field_manager_is_refused() {
    let (cluster, _client) = common::start().await;
    let (code, status) = common::raw(
        &cluster,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/owned",
        "application/apply-patch+yaml",
        serde_json::to_vec(&cm(json!({"a": "1"}))).expect("json"),
        Some(cluster.token()),
    )
    .await;
    assert_eq!(code, 400, "{status}");
}

/// A create owns no status of a kind with a status subresource (upstream's reset fields):
/// a pod's Pending is the server's, so the first status write takes nothing from the
/// creator, and the status writer's own entry owns what it wrote.
#[tokio::test]
async fn a_create_owns_no_status_and_a_status_write_takes_nothing_from_it() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;

    let (_cluster, client) = common::start().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "owned", "labels": {"app": "a"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.9"},
    }))
    .expect("pod");
    let params = PostParams {
        field_manager: Some("creator".into()),
        ..PostParams::default()
    };
    let created = pods.create(&params, &pod).await.expect("create");
    let status = created.status.as_ref().expect("status");
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.pod_ip, None, "a create sets no status of its own");
    let fields = |pod: &Pod, manager: &str| {
        let entry = pod
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .find(|entry| entry.manager.as_deref() == Some(manager))
            .unwrap_or_else(|| panic!("no entry of {manager}: {:?}", pod.metadata));
        serde_json::to_value(entry.fields_v1.as_ref().expect("fields")).expect("json")
    };
    let creator = fields(&created, "creator");
    assert!(creator.get("f:status").is_none(), "{creator}");
    assert_eq!(creator["f:metadata"]["f:labels"]["f:app"], json!({}));
    assert!(creator["f:spec"]["f:containers"].is_object(), "{creator}");

    let written = pods
        .patch_status(
            "owned",
            &PatchParams {
                field_manager: Some("node-agent".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.0.0.9"}})),
        )
        .await
        .expect("status write");
    assert_eq!(fields(&written, "creator"), creator);
    let agent = fields(&written, "node-agent");
    assert_eq!(agent["f:status"]["f:phase"], json!({}), "{agent}");
    assert_eq!(agent["f:status"]["f:podIP"], json!({}), "{agent}");
}

/// As kube-apiserver merges a configuration into the live object before it checks the
/// name: one without `metadata.name` updates the object of the URL (kube-lease-manager
/// renews Leases so), and cannot create one.
#[tokio::test]
async fn a_configuration_without_a_name_applies_to_the_object_of_the_url() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let nameless = |data| json!({"apiVersion": "v1", "kind": "ConfigMap", "data": data});
    let refused = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(nameless(json!({"a": "1"}))),
        )
        .await
        .expect_err("nothing to take a name from");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 400),
        "{refused:?}"
    );
    maps.patch(
        "owned",
        &apply("capstan"),
        &Patch::Apply(cm(json!({"a": "1"}))),
    )
    .await
    .expect("create by apply");
    let updated = maps
        .patch(
            "owned",
            &apply("capstan"),
            &Patch::Apply(nameless(json!({"a": "2"}))),
        )
        .await
        .expect("apply without a name");
    assert_eq!(updated.metadata.name.as_deref(), Some("owned"));
    assert_eq!(updated.data.expect("data")["a"], "2");
}

#[tokio::test]
async fn an_apply_naming_a_uid_changes_that_object_or_nothing() {
    let (_cluster, client) = common::start().await;
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let pinned = |uid: &str| {
        let mut object = cm(json!({"a": "1"}));
        object["metadata"]["uid"] = json!(uid);
        object
    };
    // No object of that name: upstream's patcher refuses rather than create one.
    let err = maps
        .patch("owned", &apply("capstan"), &Patch::Apply(pinned("gone")))
        .await
        .expect_err("nothing to pin to");
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 409, "{}", status.message);
    assert!(
        status.message.contains("uid mismatch"),
        "{}",
        status.message
    );
    assert!(maps.get_opt("owned").await.expect("get").is_none());

    let created = maps
        .patch("owned", &apply("capstan"), &Patch::Apply(cm(json!({}))))
        .await
        .expect("create");
    let uid = created.metadata.uid.clone().expect("uid");
    // Another object of the same name: the UID is immutable.
    let err = maps
        .patch("owned", &apply("capstan"), &Patch::Apply(pinned("other")))
        .await
        .expect_err("another object");
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422, "{}", status.message);
    assert!(
        status.message.contains("metadata.uid"),
        "{}",
        status.message
    );
    let applied = maps
        .patch("owned", &apply("capstan"), &Patch::Apply(pinned(&uid)))
        .await
        .expect("the object read");
    assert_eq!(applied.data.unwrap_or_default()["a"], "1");
}
