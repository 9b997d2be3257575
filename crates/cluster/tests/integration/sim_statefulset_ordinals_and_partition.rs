//! The simulated StatefulSet controller as a LeaderWorkerSet uses it: worker sets whose
//! ordinals start at 1, a Parallel leader set rolled out by a partition that moves down
//! `maxUnavailable` groups at a time, scaling in the middle of a rollout, a set of zero
//! replicas, and the status fields as kube-controller-manager writes them (upstream LWS
//! reads a worker set as ready when `spec.replicas == status.availableReplicas` and
//! `currentRevision == updateRevision`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const POD_INDEX: &str = "apps.kubernetes.io/pod-index";
const POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
const REVISION: &str = "controller-revision-hash";

/// StatefulSet `name` of `replicas` pods labelled `set=<name>`, with `spec` merged over.
fn stateful_set(name: &str, replicas: i32, spec: Value) -> StatefulSet {
    let mut object = json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": "demo",
            "selector": {"matchLabels": {"set": name}},
            "template": {"metadata": {"labels": {"set": name}},
                         "spec": {"containers": [{"name": "app", "image": "app:v1"}]}},
        },
    });
    if let (Some(base), Value::Object(extra)) = (object["spec"].as_object_mut(), spec) {
        base.extend(extra);
    }
    serde_json::from_value(object).expect("statefulset")
}

async fn create(sets: &Api<StatefulSet>, set: &StatefulSet) {
    sets.create(&PostParams::default(), set)
        .await
        .expect("create statefulset");
}

async fn patch(sets: &Api<StatefulSet>, name: &str, patch: Value) {
    sets.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .expect("patch statefulset");
}

/// The set's status as the server returns it: the fields present, as JSON.
async fn status(sets: &Api<StatefulSet>, name: &str) -> Value {
    let set = sets.get(name).await.expect("statefulset");
    serde_json::to_value(set.status).expect("status")
}

/// Waits until the set's status satisfies `check`, returning it.
async fn wait_for_status(
    sets: &Api<StatefulSet>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    common::wait_for(what, async || {
        let status = status(sets, name).await;
        if check(&status) {
            Ok(status)
        } else {
            Err(status)
        }
    })
    .await
}

/// Upstream LWS's test of a worker StatefulSet (`statefulsetutils.StatefulsetReady`).
fn lws_ready(set: &StatefulSet) -> bool {
    let (Some(spec), Some(status)) = (&set.spec, &set.status) else {
        return false;
    };
    spec.replicas.unwrap_or(1) == status.available_replicas.unwrap_or(0)
        && status.current_revision == status.update_revision
}

/// The live (not terminating) pods of set `name`, by pod name.
async fn pods_of(client: &kube::Client, name: &str) -> BTreeMap<String, Pod> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default().labels(&format!("set={name}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect()
}

fn label<'a>(pod: &'a Pod, key: &str) -> &'a str {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map_or("", String::as_str)
}

/// Each live pod's revision hash, by pod name.
async fn revisions(client: &kube::Client, name: &str) -> BTreeMap<String, String> {
    pods_of(client, name)
        .await
        .into_iter()
        .map(|(pod, p)| (pod, label(&p, REVISION).to_string()))
        .collect()
}

fn text(status: &Value, field: &str) -> String {
    status[field].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn a_worker_set_numbers_its_pods_from_one_with_a_stable_identity() {
    let (_cluster, client) = common::start_default_simulated().await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let worker = stateful_set(
        "demo-0",
        3,
        json!({"podManagementPolicy": "Parallel", "ordinals": {"start": 1}}),
    );
    create(&sets, &worker).await;
    let status = wait_for_status(&sets, "demo-0", "three available", |s| {
        s["availableReplicas"] == 3
    })
    .await;
    let revision = text(&status, "updateRevision");
    assert!(revision.starts_with("demo-0-"), "{status}");
    assert_eq!(
        status,
        json!({"observedGeneration": 1, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
               "currentReplicas": 3, "updatedReplicas": 3, "currentRevision": revision,
               "updateRevision": revision, "collisionCount": 0})
    );
    assert!(lws_ready(&sets.get("demo-0").await.expect("set")));

    let pods = pods_of(&client, "demo-0").await;
    let names: Vec<&str> = pods.keys().map(String::as_str).collect();
    assert_eq!(names, ["demo-0-1", "demo-0-2", "demo-0-3"]);
    for (ordinal, (name, pod)) in (1..).zip(&pods) {
        assert_eq!(label(pod, POD_INDEX), ordinal.to_string(), "{name}");
        assert_eq!(label(pod, POD_NAME), name);
        assert_eq!(label(pod, REVISION), revision, "{name}");
        assert_eq!(label(pod, "set"), "demo-0", "template labels kept");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.hostname.as_deref(), Some(name.as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("demo"), "the serviceName");
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("StatefulSet", "demo-0")
        );
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
    }
}

/// The leader set of a LeaderWorkerSet: Parallel, `maxUnavailable` up to the group
/// count, the new template written with the partition at the top, then the partition
/// lowered as groups become ready.
#[tokio::test]
async fn a_parallel_set_rolls_out_as_its_partition_moves_down() {
    let (_cluster, client) = common::start_default_simulated().await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let leader = stateful_set(
        "lead",
        4,
        json!({"podManagementPolicy": "Parallel",
               "updateStrategy": {"type": "RollingUpdate",
                                  "rollingUpdate": {"partition": 0, "maxUnavailable": 2}}}),
    );
    create(&sets, &leader).await;
    let first = wait_for_status(&sets, "lead", "four available", |s| {
        s["availableReplicas"] == 4
    })
    .await;
    let old = text(&first, "currentRevision");

    patch(
        &sets,
        "lead",
        json!({"spec": {
            "updateStrategy": {"rollingUpdate": {"partition": 4}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}}),
    )
    .await;
    let held = wait_for_status(&sets, "lead", "the new revision observed", |s| {
        s["observedGeneration"] == 2
    })
    .await;
    let new = text(&held, "updateRevision");
    assert_ne!(new, old, "a new revision for the new template");
    assert_eq!(text(&held, "currentRevision"), old);
    assert_eq!(
        (&held["currentReplicas"], &held.get("updatedReplicas")),
        (&json!(4), &None),
        "nothing updated at partition 4: {held}"
    );
    assert!(!lws_ready(&sets.get("lead").await.expect("set")));

    patch(
        &sets,
        "lead",
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}),
    )
    .await;
    let half = wait_for_status(&sets, "lead", "groups 2 and 3 updated", |s| {
        s["updatedReplicas"] == 2 && s["availableReplicas"] == 4
    })
    .await;
    assert_eq!(
        (text(&half, "currentRevision"), &half["currentReplicas"]),
        (old.clone(), &json!(2))
    );
    let hashes = revisions(&client, "lead").await;
    assert_eq!(
        hashes.values().collect::<Vec<_>>(),
        [&old, &old, &new, &new],
        "{hashes:?}"
    );

    // Watch how many of the four are out of service while the rest rolls out.
    let worst = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (client, worst) = (client.clone(), worst.clone());
        tokio::spawn(async move {
            loop {
                let pods = pods_of(&client, "lead").await;
                let serving = pods.values().filter(|p| common::is_ready(p)).count();
                worst.fetch_max(4 - serving.min(4), Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
    };
    patch(
        &sets,
        "lead",
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}),
    )
    .await;
    let done = wait_for_status(&sets, "lead", "the rollout complete", |s| {
        s["currentRevision"] == s["updateRevision"] && s["availableReplicas"] == 4
    })
    .await;
    watcher.abort();
    assert_eq!(
        done,
        json!({"observedGeneration": 4, "replicas": 4, "readyReplicas": 4, "availableReplicas": 4,
               "currentReplicas": 4, "updatedReplicas": 4, "currentRevision": new,
               "updateRevision": new, "collisionCount": 0})
    );
    assert!(
        worst.load(Ordering::Relaxed) <= 2,
        "at most maxUnavailable (2) out of service, saw {}",
        worst.load(Ordering::Relaxed)
    );
    assert!(lws_ready(&sets.get("lead").await.expect("set")));
}

#[tokio::test]
async fn scaling_in_the_middle_of_a_rollout_keeps_the_partition() {
    let (_cluster, client) = common::start_default_simulated().await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let set = stateful_set(
        "grp",
        3,
        json!({"podManagementPolicy": "Parallel",
               "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}}}),
    );
    create(&sets, &set).await;
    let first = wait_for_status(&sets, "grp", "three available", |s| {
        s["availableReplicas"] == 3
    })
    .await;
    let old = text(&first, "currentRevision");
    patch(
        &sets,
        "grp",
        json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:v2"}]}}}}),
    )
    .await;
    let rolling = wait_for_status(&sets, "grp", "grp-1 and grp-2 updated", |s| {
        s["updatedReplicas"] == 2 && s["availableReplicas"] == 3
    })
    .await;
    let new = text(&rolling, "updateRevision");

    patch(&sets, "grp", json!({"spec": {"replicas": 5}})).await;
    let up = wait_for_status(&sets, "grp", "five available", |s| {
        s["availableReplicas"] == 5
    })
    .await;
    assert_eq!(
        (
            &up["replicas"],
            &up["updatedReplicas"],
            &up["currentReplicas"]
        ),
        (&json!(5), &json!(4), &json!(1)),
        "new ordinals above the partition start at the update revision: {up}"
    );
    let hashes = revisions(&client, "grp").await;
    let expected: BTreeMap<String, String> = [
        ("grp-0", &old),
        ("grp-1", &new),
        ("grp-2", &new),
        ("grp-3", &new),
        ("grp-4", &new),
    ]
    .into_iter()
    .map(|(pod, hash)| (pod.to_string(), hash.clone()))
    .collect();
    assert_eq!(hashes, expected);

    patch(&sets, "grp", json!({"spec": {"replicas": 2}})).await;
    let down = wait_for_status(&sets, "grp", "two replicas", |s| s["replicas"] == 2).await;
    assert_eq!(
        (&down["updatedReplicas"], &down["currentReplicas"]),
        (&json!(1), &json!(1)),
        "{down}"
    );
    let names: Vec<String> = pods_of(&client, "grp").await.into_keys().collect();
    assert_eq!(names, ["grp-0", "grp-1"], "the highest ordinals went");
    assert_ne!(down["currentRevision"], down["updateRevision"]);

    patch(
        &sets,
        "grp",
        json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 0}}}}),
    )
    .await;
    let done = wait_for_status(&sets, "grp", "the rollout complete", |s| {
        s["currentRevision"] == s["updateRevision"] && s["availableReplicas"] == 2
    })
    .await;
    assert_eq!(text(&done, "currentRevision"), new);
    assert_eq!(done["currentReplicas"], 2);
}

/// A LeaderWorkerSet of size 1 has no workers, but a group's worker set may be scaled to
/// none: zero replicas is a ready, complete set.
#[tokio::test]
async fn a_set_of_zero_replicas_is_complete_and_ready() {
    let (_cluster, client) = common::start_default_simulated().await;
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    create(
        &sets,
        &stateful_set("none", 0, json!({"ordinals": {"start": 1}})),
    )
    .await;
    let status = wait_for_status(&sets, "none", "observed", |s| s["observedGeneration"] == 1).await;
    let revision = text(&status, "updateRevision");
    assert!(!revision.is_empty(), "{status}");
    assert_eq!(
        status,
        json!({"observedGeneration": 1, "replicas": 0, "availableReplicas": 0,
               "currentRevision": revision, "updateRevision": revision, "collisionCount": 0})
    );
    assert!(lws_ready(&sets.get("none").await.expect("set")));

    patch(&sets, "none", json!({"spec": {"replicas": 2}})).await;
    wait_for_status(&sets, "none", "two available", |s| {
        s["availableReplicas"] == 2
    })
    .await;
    patch(&sets, "none", json!({"spec": {"replicas": 0}})).await;
    let empty = wait_for_status(&sets, "none", "scaled to zero", |s| {
        s["replicas"] == 0 && s["observedGeneration"] == 3
    })
    .await;
    assert_eq!(
        empty,
        json!({"observedGeneration": 3, "replicas": 0, "availableReplicas": 0,
               "currentRevision": revision, "updateRevision": revision, "collisionCount": 0})
    );
    assert!(pods_of(&client, "none").await.is_empty());
}
