//! One reconcile of a LeaderWorkerSet, call by call: the exact requests the LWS controller
//! sends the API server, in order, with their bodies, and when it looks again. The caches
//! of leader pods and worker StatefulSets are filled as the watches would fill them; the
//! API server is the scenario ([`fixtures`]).
//!
//! The LWS is upstream's sample: two groups of a leader and a worker, `maxUnavailable` 1,
//! a shared subdomain. The leader StatefulSet's body is stated by its partition, replicas
//! and revision key (its shape is the StatefulSet tests'); Event bodies are not compared:
//! they carry a random name and the wall-clock time.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::decision::SERVICE_RECHECK;
use super::*;
use crate::controllers::fixtures::{self, Call, store};
use crate::controllers::lws::labels::{GROUP_INDEX_LABEL, REVISION_KEY_LABEL};
use crate::controllers::lws::revision::tests::sample_json;
use crate::controllers::lws::statefulsets;
use capstan_api::clock::ManualClock;

const NOW: &str = "2026-11-26T12:00:00Z";

const LWS: &str =
    "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets/test-sample";
const LWS_STATUS: &str = "/apis/leaderworkerset.x-k8s.io/v1/namespaces/default/leaderworkersets/test-sample/status?&fieldManager=capstan-lws";
const LEADER_SET: &str = "/apis/apps/v1/namespaces/default/statefulsets/test-sample";
const APPLY_LEADER_SET: &str = "/apis/apps/v1/namespaces/default/statefulsets/test-sample?&force=true&fieldManager=capstan-lws";
const REVISIONS: &str = "/apis/apps/v1/namespaces/default/controllerrevisions?&labelSelector=leaderworkerset.sigs.k8s.io%2Fname%3Dtest-sample";
const CREATE_REVISION: &str =
    "/apis/apps/v1/namespaces/default/controllerrevisions?&fieldManager=capstan-lws";
const SERVICE: &str = "/api/v1/namespaces/default/services/test-sample";
const CREATE_SERVICE: &str = "/api/v1/namespaces/default/services?&fieldManager=capstan-lws";
const HPA_SELECTOR: &str =
    "leaderworkerset.sigs.k8s.io/name=test-sample,leaderworkerset.sigs.k8s.io/worker-index=0";

/// The sample LWS at resourceVersion 7, with `change` made to it.
fn lws_json(change: impl FnOnce(&mut Value)) -> Value {
    let mut value = sample_json();
    value["metadata"]["resourceVersion"] = json!("7");
    change(&mut value);
    value
}

fn parse<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// The sample's worker image moved to 1.28, generation 2: a template change.
fn changed_template(value: &mut Value) {
    value["metadata"]["generation"] = json!(2);
    value["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["image"] =
        json!("docker.io/nginxinc/nginx-unprivileged:1.28");
}

/// The content key of the revision of `lws`'s spec.
fn key_of(lws: &Value) -> String {
    revision::content_key(&parse(lws.clone()))
}

/// The revision `number` of `lws`'s spec, as the controller creates it.
fn revision_json(lws: &Value, number: i64) -> Value {
    let key = key_of(lws);
    json!({
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": format!("test-sample-{key}-{number}"),
            "namespace": "default",
            "labels": {NAME_LABEL: "test-sample", REVISION_KEY_LABEL: key},
            "ownerReferences": [owner()],
        },
        "data": revision::patch(&parse(lws.clone())),
        "revision": number,
    })
}

/// The controller reference to the sample LWS.
fn owner() -> Value {
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "name": "test-sample", "uid": "uid-1", "controller": true,
           "blockOwnerDeletion": true})
}

fn not_found(path: &str) -> Call {
    Call::get(path, json!({})).failing(404, "NotFound")
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": items})
}

/// The creation of `revision`, answered with it.
fn create_revision(revision: Value) -> Call {
    Call::new("POST", CREATE_REVISION, Some(revision.clone()), revision)
}

/// The read of the shared headless Service, there already.
fn service_there() -> Call {
    Call::get(SERVICE, json!({"apiVersion": "v1", "kind": "Service"}))
}

/// A write of `lws`'s status whose body another scenario states.
fn any_status(lws: &Value) -> Call {
    Call::new("PATCH", LWS_STATUS, None, lws.clone()).any_body()
}

/// The leader StatefulSet of `lws` applied at `partition` with `replicas` and revision
/// `key`, its leader pods given the `LWS_*` variables; answered with `status_replicas`
/// replicas counted.
fn apply_leader_set(
    lws: &Value,
    partition: i32,
    replicas: i32,
    key: &str,
    status_replicas: i32,
) -> Call {
    let body = leader_set_body(lws, partition, replicas, key);
    let mut answer = body.clone();
    answer["status"] = json!({"replicas": status_replicas});
    Call::new("PATCH", APPLY_LEADER_SET, Some(body), answer)
}

fn leader_set_body(lws: &Value, partition: i32, replicas: i32, key: &str) -> Value {
    statefulsets::leader(&parse(lws.clone()), partition, replicas, key, true)
        .expect("a leader StatefulSet")
}

/// The live leader StatefulSet: applied at `partition` with `key`, all of its replicas
/// counted.
fn live_leader_set(lws: &Value, partition: i32, key: &str) -> Value {
    let mut live = leader_set_body(lws, partition, 2, key);
    live["status"] = json!({"replicas": 2});
    live
}

/// A leader pod of group `index`, Running and Ready, made from `key`.
fn leader_pod(index: i32, key: &str) -> Pod {
    parse(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("test-sample-{index}"),
            "namespace": "default",
            "labels": {NAME_LABEL: "test-sample", WORKER_INDEX_LABEL: "0",
                       GROUP_INDEX_LABEL: index.to_string(), REVISION_KEY_LABEL: key},
        },
        "spec": {"containers": []},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }))
}

/// The worker StatefulSet of group `index`, its one worker available, made from `key`.
fn worker_set(index: i32, key: &str) -> StatefulSet {
    parse(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": format!("test-sample-{index}"),
            "namespace": "default",
            "labels": {NAME_LABEL: "test-sample", REVISION_KEY_LABEL: key},
        },
        "spec": {"replicas": 1, "selector": {}, "serviceName": "test-sample", "template": {}},
        "status": {"replicas": 1, "availableReplicas": 1,
                   "currentRevision": "r", "updateRevision": "r"},
    }))
}

/// Both groups' leader pods and worker StatefulSets, ready and made from `key`.
fn groups_on(key: &str) -> (Vec<Pod>, Vec<StatefulSet>) {
    (
        vec![leader_pod(0, key), leader_pod(1, key)],
        vec![worker_set(0, key), worker_set(1, key)],
    )
}

/// The status of the sample at `generation` with both groups ready and updated.
fn available(generation: i64) -> Value {
    json!({
        "conditions": [{
            "type": "Available", "status": "True", "observedGeneration": generation,
            "lastTransitionTime": "2026-11-26T11:00:00Z",
            "reason": "AllGroupsReady", "message": "All replicas are ready",
        }],
        "readyReplicas": 2,
        "updatedReplicas": 2,
        "replicas": 2,
        "hpaPodSelector": HPA_SELECTOR,
        "observedGeneration": generation,
    })
}

/// The merge patch of `status`, on resourceVersion 7.
fn write_status(status: Value, answer: &Value) -> Call {
    Call::new(
        "PATCH",
        LWS_STATUS,
        Some(json!({"metadata": {"resourceVersion": "7"}, "status": status})),
        answer.clone(),
    )
}

/// Runs one reconcile of the cached `lws` at [`NOW`], with `pods` and `sets` in the
/// caches, against an API server that expects exactly `calls`.
async fn reconcile_once(
    lws: &Value,
    (pods, sets): (Vec<Pod>, Vec<StatefulSet>),
    calls: Vec<Call>,
) -> Result<Action, kube::Error> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let shared = Arc::new(Shared {
        ctx: Context::with_clock(client, Arc::new(clock), CancellationToken::new()),
        sets: store(sets),
        pods: store(pods),
    });
    let result = reconcile(Arc::new(parse(lws.clone())), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

#[tokio::test]
async fn a_new_lws_gets_its_first_revision_its_leader_statefulset_its_service_then_its_status() {
    let lws = lws_json(|_| {});
    let key = key_of(&lws);
    let revision = revision_json(&lws, 1);
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "test-sample",
            "namespace": "default",
            "labels": {NAME_LABEL: "test-sample"},
            "ownerReferences": [owner()],
        },
        "spec": {
            "clusterIP": "None",
            "selector": {NAME_LABEL: "test-sample"},
            "publishNotReadyAddresses": true,
        },
    });
    let progressing = json!({
        "conditions": [{
            "type": "Progressing", "status": "True", "observedGeneration": 1,
            "lastTransitionTime": NOW,
            "reason": "GroupsProgressing", "message": "Replicas are progressing",
        }],
        "readyReplicas": 0,
        "updatedReplicas": 0,
        "replicas": 0,
        "hpaPodSelector": HPA_SELECTOR,
        "observedGeneration": 1,
    });
    let action = reconcile_once(
        &lws,
        (vec![], vec![]),
        vec![
            Call::get(LWS, lws.clone()),
            not_found(LEADER_SET),
            Call::get(REVISIONS, list(vec![])),
            create_revision(revision),
            // CreatingRevision: "for a newly created LeaderWorkerSet".
            fixtures::event("default"),
            apply_leader_set(&lws, 0, 2, &key, 0),
            // GroupsProgressing: "Created leader statefulset test-sample".
            fixtures::event("default"),
            not_found(SERVICE),
            Call::new("POST", CREATE_SERVICE, Some(service.clone()), service),
            write_status(progressing, &lws),
            // GroupsProgressing: "Replicas are progressing".
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(SERVICE_RECHECK)
    );
}

#[tokio::test]
async fn a_new_lws_with_a_subdomain_per_group_gets_no_shared_service() {
    let lws = lws_json(|value| {
        value["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
    });
    let key = key_of(&lws);
    let revision = revision_json(&lws, 1);
    let action = reconcile_once(
        &lws,
        (vec![], vec![]),
        vec![
            Call::get(LWS, lws.clone()),
            not_found(LEADER_SET),
            Call::get(REVISIONS, list(vec![])),
            create_revision(revision),
            fixtures::event("default"),
            apply_leader_set(&lws, 0, 2, &key, 0),
            fixtures::event("default"),
            // No Service: the pod reconciler makes one per group.
            any_status(&lws),
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(action.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn a_revision_an_earlier_reconcile_created_is_read_back_and_not_said_again() {
    let lws = lws_json(|value| {
        value["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"})
    });
    let key = key_of(&lws);
    let revision = revision_json(&lws, 1);
    let name = revision["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    let action = reconcile_once(
        &lws,
        (vec![], vec![]),
        vec![
            Call::get(LWS, lws.clone()),
            not_found(LEADER_SET),
            // Its watch event had not reached the listing.
            Call::get(REVISIONS, list(vec![])),
            create_revision(revision.clone()).failing(409, "AlreadyExists"),
            Call::get(
                format!("/apis/apps/v1/namespaces/default/controllerrevisions/{name}"),
                revision,
            ),
            apply_leader_set(&lws, 0, 2, &key, 0),
            // GroupsProgressing: "Created leader statefulset test-sample".
            fixtures::event("default"),
            any_status(&lws),
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(action.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn an_lws_at_rest_is_read_and_reapplied_unchanged_and_nothing_else_is_written() {
    let lws = lws_json(|value| value["status"] = available(1));
    let key = key_of(&lws);
    let action = reconcile_once(
        &lws,
        groups_on(&key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live_leader_set(&lws, 0, &key)),
            Call::get(REVISIONS, list(vec![revision_json(&lws, 1)])),
            // Server-side apply of what is there already: upstream applies on every
            // reconcile too, and the API server changes nothing.
            apply_leader_set(&lws, 0, 2, &key, 2),
            service_there(),
        ],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(SERVICE_RECHECK)
    );
}

#[tokio::test]
async fn a_template_change_creates_a_revision_and_starts_the_rolling_update_at_the_top() {
    let before = lws_json(|_| {});
    let old_key = key_of(&before);
    let lws = lws_json(|value| {
        changed_template(value);
        value["status"] = available(1);
    });
    let new_key = key_of(&lws);
    let revision = revision_json(&lws, 2);
    let rolling = json!({
        "conditions": [
            {"type": "Available", "status": "False", "observedGeneration": 2,
             "lastTransitionTime": NOW,
             "reason": "AllGroupsReady", "message": "All replicas are ready"},
            {"type": "UpdateInProgress", "status": "True", "observedGeneration": 2,
             "lastTransitionTime": NOW,
             "reason": "GroupsUpdating", "message": "Rolling Upgrade is in progress"},
        ],
        "readyReplicas": 2,
        "updatedReplicas": 0,
        "replicas": 2,
        "hpaPodSelector": HPA_SELECTOR,
        "observedGeneration": 2,
    });
    let action = reconcile_once(
        &lws,
        groups_on(&old_key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live_leader_set(&before, 0, &old_key)),
            Call::get(REVISIONS, list(vec![revision_json(&before, 1)])),
            create_revision(revision),
            // CreatingRevision: "for updated LWS".
            fixtures::event("default"),
            // Partition at replicas: the leader pods roll from the top as it moves down.
            apply_leader_set(&lws, 2, 2, &new_key, 2),
            service_there(),
            write_status(rolling, &lws),
            // GroupsUpdating: "Rolling Upgrade is in progress".
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(SERVICE_RECHECK)
    );
}

#[tokio::test]
async fn a_rolled_update_moves_the_partition_down_one_group() {
    let before = lws_json(|_| {});
    let old_key = key_of(&before);
    let lws = lws_json(changed_template);
    let new_key = key_of(&lws);
    let live = live_leader_set(&lws, 2, &new_key);
    let action = reconcile_once(
        &lws,
        groups_on(&old_key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live),
            Call::get(
                REVISIONS,
                list(vec![revision_json(&before, 1), revision_json(&lws, 2)]),
            ),
            apply_leader_set(&lws, 1, 2, &new_key, 2),
            // GroupsUpdating: "Updating replica 1".
            fixtures::event("default"),
            service_there(),
            any_status(&lws),
            fixtures::event("default"),
        ],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(SERVICE_RECHECK)
    );
}

#[tokio::test]
async fn a_finished_update_deletes_the_revisions_no_group_runs() {
    let before = lws_json(|_| {});
    let old = revision_json(&before, 1);
    let lws = lws_json(|value| {
        changed_template(value);
        value["status"] = available(2);
    });
    let key = key_of(&lws);
    let old_name = old["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    let action = reconcile_once(
        &lws,
        groups_on(&key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live_leader_set(&lws, 0, &key)),
            Call::get(REVISIONS, list(vec![old, revision_json(&lws, 2)])),
            apply_leader_set(&lws, 0, 2, &key, 2),
            service_there(),
            Call::new(
                "DELETE",
                format!("/apis/apps/v1/namespaces/default/controllerrevisions/{old_name}?"),
                Some(json!({})),
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            ),
        ],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(SERVICE_RECHECK)
    );
}

#[tokio::test]
async fn an_lws_being_deleted_is_left_alone() {
    let lws = lws_json(|value| {
        value["metadata"]["deletionTimestamp"] = json!("2026-11-26T11:59:00Z");
        value["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
    });
    let action = reconcile_once(&lws, (vec![], vec![]), vec![Call::get(LWS, lws.clone())]).await;
    assert_eq!(action.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn an_lws_gone_since_its_event_is_left_alone() {
    let lws = lws_json(|_| {});
    let action = reconcile_once(&lws, (vec![], vec![]), vec![not_found(LWS)]).await;
    assert_eq!(action.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn a_leader_statefulset_being_deleted_is_waited_for() {
    let lws = lws_json(|_| {});
    let key = key_of(&lws);
    let mut deleting = live_leader_set(&lws, 0, &key);
    deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T11:59:00Z");
    let action = reconcile_once(
        &lws,
        (vec![], vec![]),
        vec![Call::get(LWS, lws.clone()), Call::get(LEADER_SET, deleting)],
    )
    .await;
    assert_eq!(
        action.expect("reconciled"),
        Action::requeue(DELETING_RECHECK)
    );
}

#[tokio::test]
async fn a_failed_listing_of_revisions_is_the_reconciles_error_and_nothing_is_written() {
    let lws = lws_json(|_| {});
    let result = reconcile_once(
        &lws,
        (vec![], vec![]),
        vec![
            Call::get(LWS, lws.clone()),
            not_found(LEADER_SET),
            Call::get(REVISIONS, json!({})).failing(500, "InternalError"),
        ],
    )
    .await;
    let err = result.expect_err("the listing failed");
    assert!(err.to_string().contains("InternalError"), "{err}");
}

#[tokio::test]
async fn a_failed_leader_statefulset_apply_is_said_and_is_the_reconciles_error() {
    let lws = lws_json(|value| value["status"] = available(1));
    let key = key_of(&lws);
    let result = reconcile_once(
        &lws,
        groups_on(&key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live_leader_set(&lws, 0, &key)),
            Call::get(REVISIONS, list(vec![revision_json(&lws, 1)])),
            apply_leader_set(&lws, 0, 2, &key, 2).failing(422, "Invalid"),
            // Warning FailedUpdate: "Failed to update leader statefulset test-sample: ...".
            fixtures::event("default"),
        ],
    )
    .await;
    let err = result.expect_err("the apply failed");
    assert!(err.to_string().contains("Invalid"), "{err}");
}

#[tokio::test]
async fn a_status_changed_under_its_write_is_looked_at_again_at_once_and_nothing_deleted() {
    let before = lws_json(|_| {});
    let old = revision_json(&before, 1);
    let lws = lws_json(|value| {
        changed_template(value);
        value["status"] = available(1);
    });
    let key = key_of(&lws);
    let action = reconcile_once(
        &lws,
        groups_on(&key),
        vec![
            Call::get(LWS, lws.clone()),
            Call::get(LEADER_SET, live_leader_set(&lws, 0, &key)),
            Call::get(REVISIONS, list(vec![old, revision_json(&lws, 2)])),
            apply_leader_set(&lws, 0, 2, &key, 2),
            service_there(),
            Call::new("PATCH", LWS_STATUS, None, json!({}))
                .any_body()
                .failing(409, "Conflict"),
        ],
    )
    .await;
    assert_eq!(
        action.expect("a conflict is no error"),
        Action::requeue(Duration::ZERO)
    );
}
