//! The simulated controller-manager: a DaemonSet follows node labels, a StatefulSet
//! rolls out by partition.

use crate::common;

use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

async fn pods_with(client: &kube::Client, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(selector))
        .await
        .expect("list")
        .items
}

fn nodes_of(pods: &[Pod]) -> Vec<String> {
    let mut nodes: Vec<String> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    nodes.sort();
    nodes
}

async fn label_node(client: &kube::Client, node: &str, value: Option<&str>) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"gpu": value}}})),
        )
        .await
        .expect("label node");
}

#[tokio::test]
async fn a_daemon_set_follows_node_labels() {
    let (_cluster, client) = common::start_default_simulated().await;
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "plugin"},
        "spec": {
            "selector": {"matchLabels": {"app": "plugin"}},
            "template": {"metadata": {"labels": {"app": "plugin"}},
                         "spec": {"nodeSelector": {"gpu": "true"}, "containers": [{"name": "p", "image": "plugin:v1"}]}}
        }
    }))
    .expect("ds");
    let daemon_sets = Api::<DaemonSet>::namespaced(client.clone(), "default");
    daemon_sets
        .create(&PostParams::default(), &ds)
        .await
        .expect("create");
    label_node(&client, "worker-1", Some("true")).await;
    label_node(&client, "worker-2", Some("true")).await;
    common::wait_until("a pod on each labelled node", || async {
        nodes_of(&pods_with(&client, "app=plugin").await) == ["worker-1", "worker-2"]
    })
    .await;
    common::wait_until("status counts two ready", || async {
        daemon_sets
            .get("plugin")
            .await
            .ok()
            .and_then(|d| d.status)
            .is_some_and(|s| {
                s.desired_number_scheduled == 2
                    && s.number_ready == 2
                    && s.current_number_scheduled == 2
            })
    })
    .await;
    label_node(&client, "worker-1", None).await;
    common::wait_until("the pod leaves the unlabelled node", || async {
        nodes_of(&pods_with(&client, "app=plugin").await) == ["worker-2"]
    })
    .await;
}

#[tokio::test]
async fn a_stateful_set_rolls_out_by_partition() {
    let (_cluster, client) = common::start_default_simulated().await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "db", "image": "db:v1"}]}}
        }
    }))
    .expect("sts");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    sets.create(&PostParams::default(), &sts)
        .await
        .expect("create");
    common::wait_until("three ready replicas", || async {
        sets.get("db")
            .await
            .ok()
            .and_then(|s| s.status)
            .is_some_and(|s| s.ready_replicas == Some(3))
    })
    .await;
    let names: Vec<String> = pods_with(&client, "app=db")
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(names, ["db-0", "db-1", "db-2"]);
    let image_of = |pods: &[Pod], name: &str| {
        pods.iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.containers[0].image.clone())
    };
    let update = json!({"spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}},
                                 "template": {"spec": {"containers": [{"name": "db", "image": "db:v2"}]}}}});
    sets.patch("db", &PatchParams::default(), &Patch::Strategic(update))
        .await
        .expect("update");
    common::wait_until("only the ordinal at the partition updated", || async {
        let pods = pods_with(&client, "app=db").await;
        let ready = pods
            .iter()
            .filter(|p| common::is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .count()
            == 3;
        ready && image_of(&pods, "db-2").as_deref() == Some("db:v2")
    })
    .await;
    let pods = pods_with(&client, "app=db").await;
    assert_eq!(image_of(&pods, "db-0").as_deref(), Some("db:v1"));
    assert_eq!(image_of(&pods, "db-1").as_deref(), Some("db:v1"));
    let status = sets.get("db").await.expect("sts").status.expect("status");
    assert_ne!(status.current_revision, status.update_revision);
    let hash = |name: &str| {
        pods.iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .and_then(|p| p.metadata.labels.as_ref())
            .and_then(|l| l.get("controller-revision-hash").cloned())
    };
    assert_eq!(hash("db-2"), status.update_revision);
    assert_eq!(hash("db-0"), status.current_revision);
    let finish = json!({"spec": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}}});
    sets.patch("db", &PatchParams::default(), &Patch::Merge(finish))
        .await
        .expect("partition 0");
    common::wait_until("all updated and the revision current", || async {
        sets.get("db")
            .await
            .ok()
            .and_then(|s| s.status)
            .is_some_and(|s| {
                s.updated_replicas == Some(3)
                    && s.ready_replicas == Some(3)
                    && s.current_revision == s.update_revision
            })
    })
    .await;
}
