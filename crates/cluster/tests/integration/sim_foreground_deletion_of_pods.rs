//! A StatefulSet owned by a pod, as a LeaderWorkerSet's worker set is owned by its
//! group's leader pod (controller reference with `blockOwnerDeletion`): deleting the
//! leader in the foreground takes the worker set and its pods first, then the leader,
//! which the leader set recreates under the same name; a leader held by a finalizer stays
//! visible with its deletionTimestamp; a leader deleted in the background goes first and
//! its worker set is collected after it.

use std::sync::{Arc, Mutex};

use crate::common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy, WatchEvent,
    WatchParams,
};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const FOREGROUND: &str = "foregroundDeletion";

fn stateful_set(name: &str, replicas: i32, extra: Value) -> StatefulSet {
    let mut object = json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": "lws",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"set": name}},
            "template": {"metadata": {"labels": {"set": name}},
                         "spec": {"containers": [{"name": "app", "image": "app:v1"}]}},
        },
    });
    merge(&mut object, &extra);
    serde_json::from_value(object).expect("statefulset")
}

/// `extra`'s fields over `target`'s, objects merged key by key.
fn merge(target: &mut Value, extra: &Value) {
    match (target, extra) {
        (Value::Object(target), Value::Object(extra)) => {
            for (key, value) in extra {
                merge(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (target, extra) => *target = extra.clone(),
    }
}

/// One change seen on a watch, in the cluster's order (`rv`).
#[derive(Clone, Debug)]
struct Seen {
    kind: &'static str,
    event: &'static str,
    name: String,
    uid: String,
    rv: u64,
    finalizers: Vec<String>,
}

/// Records every change of `api`'s objects from the cluster revision `from` on.
fn record<K>(api: Api<K>, kind: &'static str, from: String, seen: Arc<Mutex<Vec<Seen>>>)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let stream = api
            .watch(&WatchParams::default(), &from)
            .await
            .expect("watch");
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let (event, object) = match event {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                _ => continue,
            };
            let meta = object.meta();
            seen.lock().expect("seen").push(Seen {
                kind,
                event,
                name: meta.name.clone().unwrap_or_default(),
                uid: meta.uid.clone().unwrap_or_default(),
                rv: meta
                    .resource_version
                    .as_deref()
                    .and_then(|rv| rv.parse().ok())
                    .unwrap_or(0),
                finalizers: meta.finalizers.clone().unwrap_or_default(),
            });
        }
    });
}

/// A group as LeaderWorkerSet builds it: leader set `lws` (one pod, `lws-0`) and worker
/// set `lws-0` (pods `lws-0-1`, `lws-0-2`) controlled by the leader pod; returns the
/// leader pod once every pod runs.
async fn group(client: &kube::Client, worker_extra: Value) -> Pod {
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    sets.create(&PostParams::default(), &stateful_set("lws", 1, json!({})))
        .await
        .expect("leader set");
    let leader =
        common::wait_for_pod(client, "default", "lws-0", "running", common::is_ready).await;
    let mut owner = json!({"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Pod", "name": "lws-0", "uid": leader.uid(),
        "controller": true, "blockOwnerDeletion": true}]},
        "spec": {"ordinals": {"start": 1}}});
    merge(&mut owner, &worker_extra);
    sets.create(&PostParams::default(), &stateful_set("lws-0", 2, owner))
        .await
        .expect("worker set");
    for worker in ["lws-0-1", "lws-0-2"] {
        common::wait_for_pod(client, "default", worker, "running", common::is_ready).await;
    }
    leader
}

/// Starts recording pods and StatefulSets from now on.
async fn watch_all(client: &kube::Client) -> Arc<Mutex<Vec<Seen>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let from = common::cluster_revision(client).await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    record(pods, "Pod", from.clone(), seen.clone());
    record(sets, "StatefulSet", from, seen.clone());
    seen
}

/// The resourceVersion at which `kind` `uid` was deleted.
fn deleted_at(seen: &[Seen], kind: &str, uid: &str) -> u64 {
    seen.iter()
        .find(|s| s.kind == kind && s.uid == uid && s.event == "DELETED")
        .map(|s| s.rv)
        .unwrap_or_else(|| panic!("{kind} {uid} deleted: {seen:#?}"))
}

fn uid_of(seen: &[Seen], kind: &str, name: &str) -> String {
    seen.iter()
        .find(|s| s.kind == kind && s.name == name)
        .map(|s| s.uid.clone())
        .unwrap_or_else(|| panic!("{kind} {name} seen: {seen:#?}"))
}

/// Whether `kind` `uid` ever carried `finalizer`.
fn ever_held(seen: &[Seen], kind: &str, uid: &str, finalizer: &str) -> bool {
    seen.iter()
        .any(|s| s.kind == kind && s.uid == uid && s.finalizers.iter().any(|f| f == finalizer))
}

/// Waits until pod `name` exists again with a uid other than `old`.
async fn recreated(client: &kube::Client, name: &str, old: &str) -> Pod {
    common::wait_for_pod(client, "default", name, "recreated and running", |p| {
        p.metadata.uid.as_deref() != Some(old) && common::is_ready(p)
    })
    .await
}

async fn gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    common::wait_until(&format!("{name} gone"), async || {
        api.get_opt(name).await.expect("get").is_none()
    })
    .await;
}

fn foreground() -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Foreground),
        ..DeleteParams::default()
    }
}

#[tokio::test]
async fn deleting_a_leader_in_the_foreground_takes_its_worker_set_first() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let leader = group(&client, json!({})).await;
    let workers: Vec<String> = pods
        .list(&ListParams::default().labels("set=lws-0"))
        .await
        .expect("workers")
        .items
        .iter()
        .map(|p| p.uid().unwrap_or_default())
        .collect();
    assert_eq!(workers.len(), 2);
    let worker_set = sets
        .get("lws-0")
        .await
        .expect("worker set")
        .uid()
        .expect("uid");
    let seen = watch_all(&client).await;

    let marked = pods
        .delete("lws-0", &foreground())
        .await
        .expect("delete")
        .left()
        .expect("marked, not removed");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(
        marked.finalizers().iter().any(|f| f == FOREGROUND),
        "{marked:?}"
    );

    gone(&sets, "lws-0").await;
    let old = leader.uid().expect("uid");
    let new = recreated(&client, "lws-0", &old).await;
    assert!(new.finalizers().is_empty());
    assert!(
        pods.list(&ListParams::default().labels("set=lws-0"))
            .await
            .expect("workers")
            .items
            .is_empty(),
        "the worker set's pods went with it"
    );

    let seen = seen.lock().expect("seen").clone();
    let leader_gone = deleted_at(&seen, "Pod", &old);
    let set_gone = deleted_at(&seen, "StatefulSet", &worker_set);
    assert!(
        set_gone < leader_gone,
        "the worker set goes before its leader"
    );
    for worker in &workers {
        assert!(
            deleted_at(&seen, "Pod", worker) < set_gone,
            "a worker pod goes before its set"
        );
        assert!(
            !ever_held(&seen, "Pod", worker, FOREGROUND),
            "a dependent with no dependents of its own is deleted in the background"
        );
    }
    assert!(
        ever_held(&seen, "StatefulSet", &worker_set, FOREGROUND),
        "the worker set, which has dependents, is deleted in the foreground"
    );
    let new_uid = new.uid().expect("uid");
    let added = seen
        .iter()
        .find(|s| s.uid == new_uid && s.event == "ADDED")
        .expect("the new leader added");
    assert!(leader_gone < added.rv, "recreated once the old one is gone");
}

/// A finalizer on the worker set holds the chain: the leader stays, marked, past its
/// grace period (its containers stopped), and the leader set does not replace it.
#[tokio::test]
async fn a_leader_held_by_its_worker_set_stays_visible_while_deleting() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let hold = json!({"metadata": {"finalizers": ["example.dev/hold"]}});
    let leader = group(&client, hold).await;
    pods.delete("lws-0", &foreground()).await.expect("delete");

    common::wait_until("the worker pods gone", async || {
        pods.list(&ListParams::default().labels("set=lws-0"))
            .await
            .expect("workers")
            .items
            .is_empty()
    })
    .await;
    let held = common::wait_for_pod(&client, "default", "lws-0", "its containers stopped", |p| {
        p.metadata.deletion_grace_period_seconds == Some(0)
    })
    .await;
    // Long after the kubelet finished with it, the leader is still there, as it was.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let still = pods.get("lws-0").await.expect("the leader is still there");
    assert_eq!(still.uid(), leader.uid(), "not replaced");
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(still.finalizers(), held.finalizers());
    assert!(still.finalizers().iter().any(|f| f == FOREGROUND));
    let worker_set = sets.get("lws-0").await.expect("the worker set is held");
    assert!(worker_set.metadata.deletion_timestamp.is_some());
    assert_eq!(worker_set.finalizers(), ["example.dev/hold"]);

    sets.patch(
        "lws-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release the worker set");
    gone(&sets, "lws-0").await;
    recreated(&client, "lws-0", &leader.uid().expect("uid")).await;
}

#[tokio::test]
async fn a_leader_deleted_in_the_background_goes_first_and_its_workers_after() {
    let (_cluster, client) = common::start_default_simulated().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let sets = Api::<StatefulSet>::namespaced(client.clone(), "default");
    let leader = group(&client, json!({})).await;
    let seen = watch_all(&client).await;

    let marked = pods
        .delete("lws-0", &DeleteParams::default())
        .await
        .expect("delete")
        .left()
        .expect("terminating, not removed");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert!(marked.finalizers().is_empty());

    gone(&sets, "lws-0").await;
    let old = leader.uid().expect("uid");
    recreated(&client, "lws-0", &old).await;
    common::wait_until("the worker pods collected", async || {
        pods.list(&ListParams::default().labels("set=lws-0"))
            .await
            .expect("workers")
            .items
            .is_empty()
    })
    .await;

    let seen = seen.lock().expect("seen").clone();
    let worker_set = uid_of(&seen, "StatefulSet", "lws-0");
    let leader_gone = deleted_at(&seen, "Pod", &old);
    let set_gone = deleted_at(&seen, "StatefulSet", &worker_set);
    assert!(leader_gone < set_gone, "the leader goes first");
    assert!(!ever_held(&seen, "StatefulSet", &worker_set, FOREGROUND));
    for worker in ["lws-0-1", "lws-0-2"] {
        let uid = uid_of(&seen, "Pod", worker);
        assert!(
            set_gone < deleted_at(&seen, "Pod", &uid),
            "{worker} after its set"
        );
    }
}
