//! LeaderWorkerSets run: capstan's LWS controller, alone, makes and rolls their groups as
//! upstream LWS does (upstream's integration stories, `test/integration/controllers/
//! leaderworkerset_test.go`), on a cluster whose StatefulSet controller, scheduler and
//! kubelets are real (or simulated) rather than faked.
//!
//! A rolling update is held at a known point by a node label: the new template asks for
//! `lws-test/rollout: open` in its `nodeSelector`, so the first group recreated stays
//! Pending (neither ready nor updated) until a test labels a node. Everything a test
//! asserts about the partition is read from a watch of the leader StatefulSet, which sees
//! every value the controller applies.

use crate::common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use capstan::controllers::{self, Context};
use capstan_api::LeaderWorkerSet;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Service};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const NS: &str = "inference";
const NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
const KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";
const GROUP_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-index";
/// The node label a held template's pods wait for.
const GATE: &str = "lws-test/rollout";

/// The LWS controller, alone, until stopped.
struct LwsController {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl LwsController {
    fn start(client: &kube::Client) -> LwsController {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let task = tokio::spawn(async move {
            controllers::run(ctx, &"lws".parse().expect("selection")).await;
        });
        LwsController { stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(common::DEADLINE, self.task)
            .await
            .expect("the LWS controller stops on shutdown")
            .expect("the LWS controller ends cleanly");
    }
}

/// The default cluster with namespace `inference`.
async fn world() -> (common::TestCluster, kube::Client) {
    let (cluster, client) = common::start_default_simulated().await;
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).expect("a namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    (cluster, client)
}

/// A pod template running `image`, with `node_selector` when given.
fn template(container: &str, image: &str, node_selector: Option<(&str, &str)>) -> Value {
    let mut spec = json!({"containers": [{"name": container, "image": image}]});
    if let Some((key, value)) = node_selector {
        spec["nodeSelector"] = json!({key: value});
    }
    json!({"metadata": {"labels": {"app": "vllm"}}, "spec": spec})
}

/// An LWS `name` of `replicas` groups of `size` pods on `image`, `extra` merged into its
/// spec.
fn lws(name: &str, replicas: i32, size: i32, image: &str, extra: Value) -> Value {
    let mut value = json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": size, "workerTemplate": template("vllm", image, None)},
        },
    });
    merge(&mut value["spec"], extra);
    value
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from,
    }
}

/// Applies `value` as Git's changes are applied (server-side apply, forced).
async fn apply(client: &kube::Client, value: &Value) {
    let name = value["metadata"]["name"].as_str().expect("a name");
    Api::<LeaderWorkerSet>::namespaced(client.clone(), NS)
        .patch(
            name,
            &PatchParams::apply("capstan").force(),
            &Patch::Apply(value),
        )
        .await
        .unwrap_or_else(|err| panic!("apply LWS {name}: {err}"));
}

async fn get_lws(client: &kube::Client, name: &str) -> LeaderWorkerSet {
    Api::<LeaderWorkerSet>::namespaced(client.clone(), NS)
        .get(name)
        .await
        .expect("LWS")
}

/// Waits until `name` reports `ready` and `updated` groups, is Available with its current
/// generation, and runs exactly `spec.replicas` groups.
async fn wait_available(client: &kube::Client, name: &str, ready: i32, updated: i32) {
    common::wait_for(
        &format!("LWS {name} Available with {ready} ready and {updated} updated"),
        async || {
            let lws = get_lws(client, name).await;
            let status = lws.status.clone().unwrap_or_default();
            let available = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            let settled = available
                && status.observed_generation == lws.metadata.generation.unwrap_or(0)
                && status.ready_replicas == ready
                && status.updated_replicas == updated
                && status.replicas == lws.spec.replicas;
            if settled { Ok(()) } else { Err(status) }
        },
    )
    .await;
}

/// The revisions of LWS `name`: those it controls (its StatefulSets' own revisions carry
/// its name label too).
async fn revisions(client: &kube::Client, name: &str) -> Vec<ControllerRevision> {
    Api::<ControllerRevision>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!("{NAME_LABEL}={name}")))
        .await
        .expect("revisions")
        .items
        .into_iter()
        .filter(|r| {
            r.owner_references()
                .iter()
                .any(|o| o.kind == "LeaderWorkerSet")
        })
        .collect()
}

async fn wait_revisions(
    client: &kube::Client,
    name: &str,
    count: usize,
) -> Vec<ControllerRevision> {
    common::wait_for(&format!("{count} revisions of {name}"), async || {
        let found = revisions(client, name).await;
        if found.len() == count {
            Ok(found)
        } else {
            Err(found.len())
        }
    })
    .await
}

async fn stateful_set(client: &kube::Client, name: &str) -> Option<StatefulSet> {
    Api::<StatefulSet>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .expect("StatefulSet")
}

async fn pod(client: &kube::Client, name: &str) -> Option<Pod> {
    Api::<Pod>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .expect("pod")
}

/// The image of the first container of pod `name`.
fn image(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .and_then(|container| container.image.clone())
        .unwrap_or_default()
}

/// The partitions and replica counts the leader StatefulSet `name` is given, in order,
/// as a watch sees them.
struct LeaderHistory {
    seen: Arc<Mutex<Vec<(i32, i32)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderHistory {
    fn follow(client: &kube::Client, name: &str) -> LeaderHistory {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, config).applied_objects().boxed();
            while let Some(Ok(set)) = stream.next().await {
                let spec = set.spec.unwrap_or_default();
                let partition = spec
                    .update_strategy
                    .and_then(|s| s.rolling_update)
                    .and_then(|r| r.partition)
                    .unwrap_or(0);
                let entry = (partition, spec.replicas.unwrap_or(1));
                let mut seen = into.lock().expect("history");
                if seen.last() != Some(&entry) {
                    seen.push(entry);
                }
            }
        });
        LeaderHistory { seen, task }
    }

    fn partitions(&self) -> Vec<i32> {
        let mut partitions: Vec<i32> = Vec::new();
        for (partition, _) in self.seen.lock().expect("history").iter() {
            if partitions.last() != Some(partition) {
                partitions.push(*partition);
            }
        }
        partitions
    }

    fn replicas(&self) -> Vec<i32> {
        self.seen
            .lock()
            .expect("history")
            .iter()
            .map(|(_, replicas)| *replicas)
            .collect()
    }

    async fn wait_for_partition(&self, partition: i32) {
        common::wait_until(&format!("leader partition {partition}"), async || {
            self.seen
                .lock()
                .expect("history")
                .last()
                .is_some_and(|(p, _)| *p == partition)
        })
        .await;
    }
}

impl Drop for LeaderHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens the gate of held templates on every worker node.
async fn open_gate(client: &kube::Client) {
    for node in ["worker-1", "worker-2", "worker-3"] {
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {GATE: "open"}}})),
            )
            .await
            .expect("label node");
    }
}

/// The notes of the Events about LWS `name`, in the order written.
async fn event_notes(client: &kube::Client, name: &str) -> Vec<String> {
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect();
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone());
    events
        .iter()
        .filter_map(|e| {
            Some(format!(
                "{}: {}",
                e.reason.as_deref()?,
                e.message.as_deref()?
            ))
        })
        .collect()
}

async fn wait_event(client: &kube::Client, name: &str, note: &str) {
    common::wait_for(&format!("event {note:?}"), async || {
        let notes = event_notes(client, name).await;
        if notes.iter().any(|n| n == note) {
            Ok(())
        } else {
            Err(notes)
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_lws_gets_one_revision_its_statefulsets_a_service_and_runs() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 2, 3, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;

    let revisions = wait_revisions(&client, "vllm", 1).await;
    let revision = &revisions[0];
    let key = revision.labels()[KEY_LABEL].clone();
    assert!(
        !key.is_empty() && key.len() <= 10 && key.bytes().all(|b| b"456789bcdf".contains(&b)),
        "a key of upstream's alphabet: {key}"
    );
    assert_eq!(revision.revision, 1);
    assert!(revision.name_any().starts_with("vllm-") && revision.name_any().ends_with("-1"));
    let owner = &revision.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("LeaderWorkerSet", "vllm", Some(true))
    );
    let data = revision.data.as_ref().expect("data").0.clone();
    let spec = data["spec"].as_object().expect("a spec patch");
    assert_eq!(
        spec.keys().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "leaderWorkerTemplate".to_string(),
            "networkConfig".to_string()
        ]),
        "a revision stores only the template and the network config"
    );
    assert_eq!(spec["networkConfig"]["subdomainPolicy"], "Shared");

    let leader = stateful_set(&client, "vllm")
        .await
        .expect("leader StatefulSet");
    let leader_spec = leader.spec.clone().expect("spec");
    assert_eq!(leader.labels()[KEY_LABEL], key);
    assert_eq!(
        leader.annotations()["leaderworkerset.sigs.k8s.io/replicas"],
        "2"
    );
    assert_eq!(
        leader_spec.pod_management_policy.as_deref(),
        Some("Parallel")
    );
    assert_eq!(leader_spec.service_name.as_deref(), Some("vllm"));
    assert_eq!(
        leader_spec.selector.match_labels.expect("selector"),
        [
            (NAME_LABEL.to_string(), "vllm".to_string()),
            (
                "leaderworkerset.sigs.k8s.io/worker-index".to_string(),
                "0".to_string()
            )
        ]
        .into()
    );
    assert_eq!(leader.owner_references()[0].kind, "LeaderWorkerSet");

    for group in 0..2 {
        let leader_pod = pod(&client, &format!("vllm-{group}"))
            .await
            .expect("leader pod");
        assert_eq!(leader_pod.labels()[GROUP_LABEL], group.to_string());
        assert!(
            leader_pod
                .labels()
                .contains_key("leaderworkerset.sigs.k8s.io/group-key")
        );
        let workers = stateful_set(&client, &format!("vllm-{group}"))
            .await
            .expect("worker set");
        let spec = workers.spec.clone().expect("spec");
        assert_eq!(spec.replicas, Some(2), "size - 1 workers");
        assert_eq!(spec.ordinals.and_then(|o| o.start), Some(1));
        assert_eq!(workers.labels()[KEY_LABEL], key);
        let owner = &workers.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Pod", leader_pod.uid().unwrap_or_default().as_str())
        );
        for worker in 1..3 {
            let worker_pod = pod(&client, &format!("vllm-{group}-{worker}"))
                .await
                .expect("worker pod");
            assert_eq!(
                worker_pod.labels()["leaderworkerset.sigs.k8s.io/worker-index"],
                worker.to_string()
            );
            assert_eq!(
                worker_pod.annotations()["leaderworkerset.sigs.k8s.io/leader-name"],
                format!("vllm-{group}")
            );
        }
    }
    let service = Api::<Service>::namespaced(client.clone(), NS)
        .get("vllm")
        .await
        .expect("the shared headless Service");
    assert_eq!(
        service.spec.and_then(|s| s.cluster_ip).as_deref(),
        Some("None")
    );
    let status = get_lws(&client, "vllm").await.status.expect("status");
    assert_eq!(
        status.hpa_pod_selector,
        "leaderworkerset.sigs.k8s.io/name=vllm,leaderworkerset.sigs.k8s.io/worker-index=0"
    );
    let notes = event_notes(&client, "vllm").await;
    assert!(
        notes.contains(&format!(
            "CreatingRevision: Creating revision with key {key} for a newly created LeaderWorkerSet"
        )),
        "{notes:?}"
    );
    assert!(
        notes.contains(&"GroupsProgressing: Created leader statefulset vllm".to_string()),
        "{notes:?}"
    );
    assert!(
        notes.contains(
            &"AllGroupsReady: All replicas are ready, with 2 groups ready of total 2 groups"
                .to_string()
        ),
        "{notes:?}"
    );

    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_template_change_rolls_one_group_at_a_time_from_the_highest_and_keeps_one_revision() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    let history = LeaderHistory::follow(&client, "vllm");
    let before = revisions(&client, "vllm").await;

    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v2", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    let after = wait_revisions(&client, "vllm", 1).await;
    assert_ne!(after[0].labels()[KEY_LABEL], before[0].labels()[KEY_LABEL]);
    assert_eq!(
        after[0].revision, 2,
        "the new revision numbers one more than the old"
    );
    assert_eq!(
        history.partitions(),
        vec![0, 4, 3, 2, 1, 0],
        "the update holds every group, then maxUnavailable 1 updates group 3, 2, 1 and 0"
    );
    for group in 0..4 {
        let leader = pod(&client, &format!("vllm-{group}"))
            .await
            .expect("leader");
        assert_eq!(image(&leader), "registry.example/vllm:v2");
        let worker = pod(&client, &format!("vllm-{group}-1"))
            .await
            .expect("worker");
        assert_eq!(image(&worker), "registry.example/vllm:v2");
    }
    let notes = event_notes(&client, "vllm").await;
    for note in [
        "Updating replica 3",
        "Updating replica 2",
        "Updating replica 1",
        "Updating replica 0",
    ] {
        assert!(
            notes.contains(&format!("GroupsUpdating: {note}")),
            "{note}: {notes:?}"
        );
    }

    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_unavailable_two_updates_two_groups_at_once() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    let rolling = json!({"rolloutStrategy": {"type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 2}}});
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v1", rolling.clone()),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    let history = LeaderHistory::follow(&client, "vllm");
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v2", rolling),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    let partitions = history.partitions();
    assert_eq!(
        &partitions[..3],
        [0, 4, 2],
        "the first step updates groups 3 and 2: {partitions:?}"
    );
    assert_eq!(partitions.last(), Some(&0));
    for step in partitions[1..].windows(2) {
        assert!(
            step[1] < step[0] && step[0] - step[1] <= 2,
            "steps of at most 2, down only: {partitions:?}"
        );
    }
    wait_revisions(&client, "vllm", 1).await;
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn max_surge_adds_a_group_during_the_update_and_reclaims_it() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    let rolling = json!({"rolloutStrategy": {"type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 0, "maxSurge": 1}}});
    apply(
        &client,
        &lws("vllm", 3, 2, "registry.example/vllm:v1", rolling.clone()),
    )
    .await;
    wait_available(&client, "vllm", 3, 3).await;
    let history = LeaderHistory::follow(&client, "vllm");
    apply(
        &client,
        &lws("vllm", 3, 2, "registry.example/vllm:v2", rolling),
    )
    .await;
    wait_available(&client, "vllm", 3, 3).await;
    let replicas = history.replicas();
    assert_eq!(
        replicas.iter().max(),
        Some(&4),
        "one surge group: {replicas:?}"
    );
    assert_eq!(
        replicas.last(),
        Some(&3),
        "the surge group is reclaimed: {replicas:?}"
    );
    common::wait_until("the surge group gone", async || {
        pod(&client, "vllm-3").await.is_none() && stateful_set(&client, "vllm-3").await.is_none()
    })
    .await;
    let notes = event_notes(&client, "vllm").await;
    assert!(
        notes.contains(&"GroupsProgressing: deleting surge replica vllm-3".to_string()),
        "{notes:?}"
    );
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_holds_the_lower_groups_and_their_revision_until_lowered() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    let partition = |p: i32| {
        json!({"rolloutStrategy": {"type": "RollingUpdate",
        "rollingUpdateConfiguration": {"partition": p}}})
    };
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v1", partition(2)),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v2", partition(2)),
    )
    .await;
    wait_available(&client, "vllm", 4, 2).await;
    let images: Vec<String> = futures::future::join_all((0..4).map(|g| {
        let client = client.clone();
        async move { image(&pod(&client, &format!("vllm-{g}")).await.expect("leader")) }
    }))
    .await;
    assert_eq!(
        images,
        [
            "registry.example/vllm:v1",
            "registry.example/vllm:v1",
            "registry.example/vllm:v2",
            "registry.example/vllm:v2"
        ]
    );
    assert_eq!(
        revisions(&client, "vllm").await.len(),
        2,
        "a partition keeps the old revision"
    );
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v2", partition(0)),
    )
    .await;
    wait_available(&client, "vllm", 4, 4).await;
    wait_revisions(&client, "vllm", 1).await;
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn replicas_rollout_strategy_and_startup_policy_never_roll_a_pod() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 2, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    let uid = pod(&client, "vllm-0").await.expect("leader").uid();
    let changed = json!({"startupPolicy": "LeaderReady", "rolloutStrategy": {"type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxUnavailable": 2, "maxSurge": 1}}});
    apply(
        &client,
        &lws("vllm", 3, 2, "registry.example/vllm:v1", changed),
    )
    .await;
    wait_available(&client, "vllm", 3, 3).await;
    assert_eq!(revisions(&client, "vllm").await.len(), 1, "no new revision");
    assert_eq!(
        pod(&client, "vllm-0").await.expect("leader").uid(),
        uid,
        "group 0 not rolled"
    );
    controller.stop().await;
    cluster.shutdown().await;
}

/// Upstream's KEP-238 story: a group restarted while the update is held comes back from the
/// revision of its leader pod, old template and old size, not from the live LWS.
#[tokio::test(flavor = "multi_thread")]
async fn a_group_restarted_during_an_update_comes_back_with_its_old_template_and_size() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 3, 3, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 3, 3).await;
    let old_key = revisions(&client, "vllm").await[0].labels()[KEY_LABEL].clone();
    let history = LeaderHistory::follow(&client, "vllm");

    let held = json!({"leaderWorkerTemplate": {"size": 2,
        "workerTemplate": template("vllm-next", "registry.example/vllm:v2", Some((GATE, "open")))}});
    apply(
        &client,
        &lws("vllm", 3, 2, "registry.example/vllm:v2", held.clone()),
    )
    .await;
    history.wait_for_partition(2).await;
    wait_revisions(&client, "vllm", 2).await;

    // Group 0, below the partition, is restarted: its leader deleted.
    let old_leader = pod(&client, "vllm-0").await.expect("leader").uid();
    Api::<Pod>::namespaced(client.clone(), NS)
        .delete("vllm-0", &DeleteParams::foreground())
        .await
        .expect("delete leader 0");
    let workers = common::wait_for("group 0 rebuilt", async || {
        let leader = pod(&client, "vllm-0").await;
        let set = stateful_set(&client, "vllm-0").await;
        match (leader, set) {
            (Some(leader), Some(set))
                if leader.uid() != old_leader
                    && set.owner_references().first().map(|o| o.uid.clone()) == leader.uid() =>
            {
                Ok(set)
            }
            other => Err(other.0.map(|p| p.uid())),
        }
    })
    .await;
    assert_eq!(
        workers.labels()[KEY_LABEL],
        old_key,
        "built from the leader's old revision"
    );
    let spec = workers.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2), "old size 3: two workers");
    let template = spec.template;
    assert_eq!(
        template
            .metadata
            .expect("metadata")
            .annotations
            .expect("annotations")["leaderworkerset.sigs.k8s.io/size"],
        "3"
    );
    assert_eq!(
        template.spec.expect("spec").containers[0].name,
        "vllm",
        "the old container"
    );

    open_gate(&client).await;
    wait_available(&client, "vllm", 3, 3).await;
    wait_revisions(&client, "vllm", 1).await;
    let rebuilt = stateful_set(&client, "vllm-0").await.expect("worker set");
    assert_eq!(
        rebuilt.spec.expect("spec").replicas,
        Some(1),
        "new size 2 after the update"
    );
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_template_change_mid_rollout_keeps_three_revisions_then_one() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 3, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 3, 3).await;
    let history = LeaderHistory::follow(&client, "vllm");
    let held = |image: &str| {
        json!({"leaderWorkerTemplate": {
        "workerTemplate": template("vllm", image, Some((GATE, "open")))}})
    };
    apply(
        &client,
        &lws(
            "vllm",
            3,
            2,
            "registry.example/vllm:v2",
            held("registry.example/vllm:v2"),
        ),
    )
    .await;
    history.wait_for_partition(2).await;
    apply(
        &client,
        &lws(
            "vllm",
            3,
            2,
            "registry.example/vllm:v3",
            held("registry.example/vllm:v3"),
        ),
    )
    .await;
    wait_revisions(&client, "vllm", 3).await;
    open_gate(&client).await;
    wait_available(&client, "vllm", 3, 3).await;
    wait_revisions(&client, "vllm", 1).await;
    for group in 0..3 {
        let leader = pod(&client, &format!("vllm-{group}"))
            .await
            .expect("leader");
        assert_eq!(image(&leader), "registry.example/vllm:v3");
    }
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn scaling_up_during_an_update_builds_the_new_groups_new() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 2, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    let history = LeaderHistory::follow(&client, "vllm");
    let held = json!({"leaderWorkerTemplate": {
        "workerTemplate": template("vllm", "registry.example/vllm:v2", Some((GATE, "open")))}});
    apply(
        &client,
        &lws("vllm", 2, 2, "registry.example/vllm:v2", held.clone()),
    )
    .await;
    history.wait_for_partition(1).await;
    apply(
        &client,
        &lws("vllm", 4, 2, "registry.example/vllm:v2", held),
    )
    .await;
    let new_leader = common::wait_for("group 3 created", async || {
        pod(&client, "vllm-3").await.ok_or(())
    })
    .await;
    assert_eq!(
        new_leader.labels()[KEY_LABEL],
        revisions(&client, "vllm")
            .await
            .iter()
            .max_by_key(|r| r.revision)
            .expect("revision")
            .labels()[KEY_LABEL]
    );
    open_gate(&client).await;
    wait_available(&client, "vllm", 4, 4).await;
    assert!(
        history
            .partitions()
            .windows(2)
            .all(|w| w[1] <= w[0] || w[0] == 0),
        "the partition never moves up during an update: {:?}",
        history.partitions()
    );
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_worker_recreates_its_group_unless_the_restart_policy_is_none() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    let none = json!({"leaderWorkerTemplate": {"restartPolicy": "None"}});
    apply(
        &client,
        &lws("keep", 1, 3, "registry.example/vllm:v1", none),
    )
    .await;
    apply(
        &client,
        &lws("recreate", 1, 3, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "keep", 1, 1).await;
    wait_available(&client, "recreate", 1, 1).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    let leader = pod(&client, "recreate-0").await.expect("leader").uid();
    pods.delete("recreate-0-1", &DeleteParams::default())
        .await
        .expect("delete worker");
    wait_event(&client, "recreate", "RecreateGroup: Worker pod recreate-0-1 failed, deleted leader pod recreate-0 to recreate group 0").await;
    common::wait_until("a new leader", async || {
        pod(&client, "recreate-0")
            .await
            .is_some_and(|p| p.uid() != leader)
    })
    .await;
    wait_available(&client, "recreate", 1, 1).await;

    let leader = pod(&client, "keep-0").await.expect("leader").uid();
    let worker = pod(&client, "keep-0-1").await.expect("worker").uid();
    pods.delete("keep-0-1", &DeleteParams::default())
        .await
        .expect("delete worker");
    common::wait_until("the worker replaced", async || {
        pod(&client, "keep-0-1")
            .await
            .is_some_and(|p| p.uid() != worker)
    })
    .await;
    wait_available(&client, "keep", 1, 1).await;
    assert_eq!(
        pod(&client, "keep-0").await.expect("leader").uid(),
        leader,
        "None keeps the leader"
    );
    assert!(
        !event_notes(&client, "keep")
            .await
            .iter()
            .any(|n| n.starts_with("RecreateGroup"))
    );
    controller.stop().await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_ready_startup_waits_for_the_leader_and_leader_created_does_not() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    let gated_leader = |startup: &str| {
        json!({"startupPolicy": startup, "leaderWorkerTemplate": {
        "leaderTemplate": template("leader", "registry.example/vllm:v1", Some((GATE, "open")))}})
    };
    apply(
        &client,
        &lws(
            "created",
            1,
            2,
            "registry.example/vllm:v1",
            gated_leader("LeaderCreated"),
        ),
    )
    .await;
    apply(
        &client,
        &lws(
            "ready",
            1,
            2,
            "registry.example/vllm:v1",
            gated_leader("LeaderReady"),
        ),
    )
    .await;
    common::wait_until("a worker set while the leader is pending", async || {
        stateful_set(&client, "created-0").await.is_some()
    })
    .await;
    common::wait_until("the LeaderReady leader labelled", async || {
        pod(&client, "ready-0")
            .await
            .is_some_and(|p| p.labels().contains_key(GROUP_LABEL))
    })
    .await;
    assert!(
        stateful_set(&client, "ready-0").await.is_none(),
        "no workers before the leader is ready"
    );
    open_gate(&client).await;
    wait_available(&client, "ready", 1, 1).await;
    wait_available(&client, "created", 1, 1).await;
    controller.stop().await;
    cluster.shutdown().await;
}

/// A leader StatefulSet made before revisions existed (a controller upgraded from a
/// version without them) keeps its key: the revision created for it carries that key.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_statefulset_with_a_key_but_no_revision_gets_one_with_that_key() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 2, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    controller.stop().await;
    Api::<StatefulSet>::namespaced(client.clone(), NS)
        .patch(
            "vllm",
            &PatchParams::apply("upgrade-test").force(),
            &Patch::Apply(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "vllm", "labels": {KEY_LABEL: "template-hash"}}})),
        )
        .await
        .expect("relabel");
    let api: Api<ControllerRevision> = Api::namespaced(client.clone(), NS);
    for revision in revisions(&client, "vllm").await {
        api.delete(&revision.name_any(), &DeleteParams::default())
            .await
            .expect("delete revision");
    }

    let controller = LwsController::start(&client);
    wait_event(
        &client,
        "vllm",
        "CreatingRevision: Creating missing revision with key template-hash for existing LeaderWorkerSet",
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    let left = wait_revisions(&client, "vllm", 1).await;
    assert_eq!(left[0].labels()[KEY_LABEL], "template-hash");
    controller.stop().await;
    cluster.shutdown().await;
}

/// A drain (`kubectl drain`, or capstan's around a kmod upgrade) evicts the pods of a
/// node; every group that had a pod there comes back, from its own revision, elsewhere.
#[tokio::test(flavor = "multi_thread")]
async fn draining_a_node_recreates_its_groups_on_the_other_nodes() {
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 2, 2, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let on = |node: &str| {
        ListParams::default()
            .fields(&format!("spec.nodeName={node}"))
            .labels(NAME_LABEL)
    };
    let node = "worker-1";
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
    let drained: Vec<String> = pods
        .list(&on(node))
        .await
        .expect("pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    for name in &drained {
        pods.evict(name, &EvictParams::default())
            .await
            .expect("evict");
    }
    common::wait_until("nothing of the LWS left on the drained node", async || {
        pods.list(&on(node)).await.expect("pods").items.is_empty()
    })
    .await;
    common::wait_for("both groups running again, elsewhere", async || {
        let running: Vec<(String, Option<String>)> = pods
            .list(&ListParams::default().labels(NAME_LABEL))
            .await
            .expect("pods")
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && facts_running(p))
            .map(|p| (p.name_any(), p.spec.and_then(|s| s.node_name)))
            .collect();
        let elsewhere = running.iter().all(|(_, on)| on.as_deref() != Some(node));
        if running.len() == 4 && elsewhere {
            Ok(())
        } else {
            Err(running)
        }
    })
    .await;
    wait_available(&client, "vllm", 2, 2).await;
    controller.stop().await;
    cluster.shutdown().await;
}

fn facts_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Runs `capstan sync --once` of `repo` against `cluster` with `more` arguments; returns
/// the exit code and stderr.
async fn sync_once(
    cluster: &common::TestCluster,
    repo: &capstan_testing::git::FleetRepo,
    more: &'static [&'static str],
) -> (i32, String) {
    let state = tempfile::tempdir().expect("state dir");
    let kubeconfig = state.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig()).expect("kubeconfig");
    let repo = repo.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args(["sync", "--once", "--repo"])
            .arg(&repo)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--state-dir")
            .arg(state.path())
            .args(more)
            .output()
            .expect("capstan runs");
        (
            output.status.code().expect("exit code"),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    })
    .await
    .expect("sync")
}

/// The example repository's `vllm` LeaderWorkerSet runs: `capstan sync --once` returns only
/// once it is Available, and names an LWS whose rollout cannot finish.
#[tokio::test(flavor = "multi_thread")]
async fn sync_once_waits_for_the_example_vllm_to_run_and_names_a_stuck_rollout() {
    let (cluster, client) = common::start_default_simulated().await;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/repo/workloads/vllm.yaml"
    ))
    .expect("the example");
    let namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: inference\n";
    let mut repo = capstan_testing::git::FleetRepo::new();
    repo.commit(
        &[
            ("namespace.yaml", Some(namespace)),
            ("vllm.yaml", Some(&example)),
        ],
        "Run vllm",
    );
    let (code, stderr) = sync_once(&cluster, &repo, &["--controllers", "lws"]).await;
    assert_eq!(code, 0, "{stderr}");
    let lws = get_lws(&client, "vllm").await;
    let status = lws.status.expect("a status before sync returns");
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Available" && c.status == "True"),
        "{status:?}"
    );
    assert!(pod(&client, "vllm-0-1").await.is_some(), "the worker runs");

    let stuck = example.replace(
        "          - name: vllm\n            image: registry.example/vllm:v1",
        "          - name: vllm\n            image: registry.example/vllm:v2\n        nodeSelector:\n          lws-test/rollout: open",
    );
    assert_ne!(stuck, example);
    repo.commit(
        &[("vllm.yaml", Some(&stuck))],
        "Roll vllm somewhere it cannot run",
    );
    let (code, stderr) = sync_once(
        &cluster,
        &repo,
        &["--controllers", "lws", "--timeout", "5s"],
    )
    .await;
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("LeaderWorkerSet inference/vllm is rolling out"),
        "{stderr}"
    );
    cluster.shutdown().await;
}

/// A container that restarts (its `restartCount` goes up, the pod stays Running) recreates
/// its group under `RecreateGroupOnPodRestart`. The simulated kubelet's crash label makes
/// one container of one pod exit once, as `kubectl exec ... kill 1` does on a real node.
#[tokio::test(flavor = "multi_thread")]
async fn a_container_restart_recreates_the_group() {
    common::requires_stand_in("kubelet's crash label");
    let (cluster, client) = world().await;
    let controller = LwsController::start(&client);
    apply(
        &client,
        &lws("vllm", 1, 3, "registry.example/vllm:v1", json!({})),
    )
    .await;
    wait_available(&client, "vllm", 1, 1).await;
    let leader = pod(&client, "vllm-0").await.expect("leader").uid();
    Api::<Pod>::namespaced(client.clone(), NS)
        .patch(
            "vllm-0-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"sim.capstan.dev/crash-vllm": "1"}}})),
        )
        .await
        .expect("crash a container");
    wait_event(
        &client,
        "vllm",
        "RecreateGroup: Worker pod vllm-0-2 failed, deleted leader pod vllm-0 to recreate group 0",
    )
    .await;
    common::wait_until("a new leader", async || {
        pod(&client, "vllm-0")
            .await
            .is_some_and(|p| p.uid() != leader)
    })
    .await;
    wait_available(&client, "vllm", 1, 1).await;
    controller.stop().await;
    cluster.shutdown().await;
}
