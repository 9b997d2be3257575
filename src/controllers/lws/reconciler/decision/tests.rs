//! The rows of the four decisions of an LWS reconcile: which revision is created, the
//! leader StatefulSet's partition and replicas with their Events, the Service and the next
//! look, and the status writes.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::*;
use crate::controllers::lws::labels::{NAME_LABEL, REVISION_KEY_LABEL};
use crate::controllers::lws::revision::tests::{lws, sample_json};

/// The sample LWS (two groups of two, `maxUnavailable` 1, no surge, a shared subdomain)
/// at resourceVersion 7, with `change` made to it.
fn sample_with(change: impl FnOnce(&mut Value)) -> LeaderWorkerSet {
    let mut value = sample_json();
    value["metadata"]["resourceVersion"] = json!("7");
    change(&mut value);
    lws(value)
}

fn sample() -> LeaderWorkerSet {
    sample_with(|_| {})
}

/// The sample with its worker image changed: a template change.
fn changed() -> LeaderWorkerSet {
    sample_with(|value| {
        value["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["image"] =
            json!("docker.io/nginxinc/nginx-unprivileged:1.28");
    })
}

/// A leader StatefulSet of the sample: `replicas` at `partition`, applied for `applied_for`
/// replicas, its pods made from revision `key`, `with_env` when they carry `LWS_*`.
fn leader_set(
    replicas: i32,
    partition: i32,
    applied_for: &str,
    key: &str,
    with_env: bool,
) -> StatefulSet {
    let env = if with_env {
        json!([{"name": "LWS_GROUP_SIZE", "value": "2"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "test-sample", "namespace": "default",
                     "labels": {NAME_LABEL: "test-sample", REVISION_KEY_LABEL: key},
                     "annotations": {REPLICAS_ANNOTATION: applied_for}},
        "spec": {
            "replicas": replicas,
            "selector": {},
            "serviceName": "test-sample",
            "template": {"spec": {"containers": [{"name": "leader", "env": env}]}},
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"partition": partition}},
        },
    }))
    .expect("a StatefulSet")
}

/// The revision of `lws`'s live spec, keyed `key` (its content's when `None`), numbered
/// `number`.
fn revision_of(lws: &LeaderWorkerSet, key: Option<&str>, number: i64) -> ControllerRevision {
    revision::new_revision(lws, key, number)
}

fn facts(
    lws: LeaderWorkerSet,
    leader_set: Option<StatefulSet>,
    revisions: Vec<ControllerRevision>,
    groups: Vec<GroupFacts>,
) -> Facts {
    Facts {
        lws,
        leader_set,
        revisions,
        groups,
    }
}

/// Group `index`: its leader pod ready or not and made from `leader_key`, its worker
/// StatefulSet as ready and made from `workers_key`, or missing.
fn group(index: i32, ready: bool, leader_key: &str, workers_key: Option<&str>) -> GroupFacts {
    GroupFacts {
        index,
        leader_ready: ready,
        leader_key: leader_key.to_string(),
        workers: workers_key.map(|key| WorkerSetFacts {
            ready,
            key: key.to_string(),
        }),
    }
}

/// Group `index`, ready, made from `key` with its worker StatefulSet.
fn ready(index: i32, key: &str) -> GroupFacts {
    group(index, true, key, Some(key))
}

#[test]
fn the_revision_the_groups_run_is_found_or_created() {
    let lws = sample();
    let content = revision::content_key(&lws);
    let old = revision_of(&changed(), Some("old-key"), 3);
    let cases: Vec<(&str, Facts, Current)> = vec![
        (
            "a new LWS gets its spec's revision, numbered 1",
            facts(lws.clone(), None, vec![], vec![]),
            Current::Create(revision_of(&lws, None, 1), RevisionCause::NewLws),
        ),
        (
            "a leader StatefulSet's key with its revision listed finds it",
            facts(
                lws.clone(),
                Some(leader_set(2, 0, "2", "old-key", true)),
                vec![old.clone()],
                vec![],
            ),
            Current::Found(old.clone()),
        ),
        (
            "a leader StatefulSet's key without a revision is kept by the one created",
            facts(
                lws.clone(),
                Some(leader_set(2, 0, "2", "adopted", true)),
                vec![old.clone()],
                vec![],
            ),
            Current::Create(
                revision_of(&lws, Some("adopted"), 4),
                RevisionCause::Missing,
            ),
        ),
        (
            "a leader StatefulSet without a key gets the spec's revision",
            facts(
                lws.clone(),
                Some(leader_set(2, 0, "2", "", true)),
                vec![],
                vec![],
            ),
            Current::Create(revision_of(&lws, None, 1), RevisionCause::NewLws),
        ),
    ];
    for (name, facts, expected) in cases {
        assert_eq!(current_revision(&facts), expected, "{name}");
    }
    assert_eq!(
        RevisionCause::NewLws.note(&content),
        format!("Creating revision with key {content} for a newly created LeaderWorkerSet")
    );
    assert_eq!(
        RevisionCause::Missing.note("adopted"),
        "Creating missing revision with key adopted for existing LeaderWorkerSet"
    );
    assert_eq!(
        RevisionCause::Updated.note("k"),
        "Creating revision with key k for updated LWS"
    );
}

#[test]
fn only_a_template_change_under_a_leader_statefulset_makes_an_update_revision() {
    let running = revision_of(&sample(), None, 1);
    let key = revision::content_key(&sample());
    let cases: Vec<(
        &str,
        LeaderWorkerSet,
        Option<StatefulSet>,
        Option<ControllerRevision>,
    )> = vec![
        ("no leader StatefulSet yet", changed(), None, None),
        (
            "the spec its groups run",
            sample(),
            Some(leader_set(2, 0, "2", &key, true)),
            None,
        ),
        (
            "replicas are no template change",
            sample_with(|value| value["spec"]["replicas"] = json!(5)),
            Some(leader_set(2, 0, "2", &key, true)),
            None,
        ),
        (
            "a changed worker template",
            changed(),
            Some(leader_set(2, 0, "2", &key, true)),
            Some(revision_of(&changed(), None, 2)),
        ),
    ];
    for (name, lws, leader, expected) in cases {
        let facts = facts(lws, leader, vec![running.clone()], vec![]);
        assert_eq!(update_revision(&facts, &running), expected, "{name}");
    }
}

/// What [`decide`] makes of one row's facts, read back off its [`Writes`].
#[derive(Debug, PartialEq)]
struct Outcome {
    partition: i64,
    replicas: i64,
    key: String,
    lws_env: bool,
    creates: bool,
    events: Vec<(&'static str, &'static str, String)>,
    shared_service: bool,
    next_look: Action,
}

fn outcome(writes: &Writes) -> Outcome {
    let spec = &writes.leader_set["spec"];
    let containers = spec["template"]["spec"]["containers"]
        .as_array()
        .expect("containers");
    Outcome {
        partition: spec["updateStrategy"]["rollingUpdate"]["partition"]
            .as_i64()
            .expect("a partition"),
        replicas: spec["replicas"].as_i64().expect("replicas"),
        key: writes.leader_set["metadata"]["labels"][REVISION_KEY_LABEL]
            .as_str()
            .expect("a key")
            .to_string(),
        lws_env: containers.iter().any(|container| {
            container["env"]
                .as_array()
                .is_some_and(|env| env.iter().any(|var| var["name"] == "LWS_GROUP_SIZE"))
        }),
        creates: writes.creates_leader_set,
        events: writes
            .events
            .iter()
            .map(|event| (event.reason, event.action, event.note.clone()))
            .collect(),
        shared_service: writes.shared_service,
        next_look: writes.next_look.clone(),
    }
}

/// A row of [`decide`]'s table: its name, the LWS, its leader StatefulSet, its groups, the
/// key of the revision they run, whether that revision was created for a changed spec,
/// and what is decided.
type Row = (
    &'static str,
    LeaderWorkerSet,
    Option<StatefulSet>,
    Vec<GroupFacts>,
    &'static str,
    bool,
    Outcome,
);

/// An existing leader StatefulSet applied at `partition` with `replicas` and `key`, its
/// `LWS_*` variables kept, no Event, the shared Service looked at every five minutes.
fn applied(partition: i64, replicas: i64, key: &str) -> Outcome {
    Outcome {
        partition,
        replicas,
        key: key.to_string(),
        lws_env: true,
        creates: false,
        events: vec![],
        shared_service: true,
        next_look: Action::requeue(SERVICE_RECHECK),
    }
}

fn event(
    reason: &'static str,
    action: &'static str,
    note: &str,
) -> (&'static str, &'static str, String) {
    (reason, action, note.to_string())
}

#[test]
fn decision_table() {
    let unique = sample_with(|value| {
        value["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
    });
    let surging = sample_with(|value| {
        value["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["maxSurge"] = json!(1);
    });
    let created = || Outcome {
        creates: true,
        events: vec![event(
            "GroupsProgressing",
            "Create",
            "Created leader statefulset test-sample",
        )],
        ..applied(0, 2, "k1")
    };
    let at_rest = vec![ready(0, "k1"), ready(1, "k1")];
    let rows: Vec<Row> = vec![
        (
            "1: a new LWS creates its leader StatefulSet with every group",
            sample(),
            None,
            vec![],
            "k1",
            false,
            created(),
        ),
        (
            "1, UniquePerReplica: no shared Service, looked at again on a change",
            unique,
            None,
            vec![],
            "k1",
            false,
            Outcome {
                shared_service: false,
                next_look: Action::await_change(),
                ..created()
            },
        ),
        (
            "2': a template change puts the partition at replicas, no group rolled yet",
            changed(),
            Some(leader_set(2, 0, "2", "k1", true)),
            at_rest.clone(),
            "k2",
            true,
            applied(2, 2, "k2"),
        ),
        (
            "3: at rest, the same StatefulSet again and no Event",
            sample(),
            Some(leader_set(2, 0, "2", "k1", true)),
            at_rest.clone(),
            "k1",
            false,
            applied(0, 2, "k1"),
        ),
        (
            "3: at rest without LWS_* variables, none added: that would restart every leader",
            sample(),
            Some(leader_set(2, 0, "2", "k1", false)),
            at_rest.clone(),
            "k1",
            false,
            Outcome {
                lws_env: false,
                ..applied(0, 2, "k1")
            },
        ),
        (
            "6: rolling, both groups ready on the old key: the top group rolls",
            changed(),
            Some(leader_set(2, 2, "2", "k2", true)),
            at_rest.clone(),
            "k2",
            false,
            Outcome {
                events: vec![event("GroupsUpdating", "Update", "Updating replica 1")],
                ..applied(1, 2, "k2")
            },
        ),
        (
            "6: rolling, the top group rolled but not ready: the partition waits",
            changed(),
            Some(leader_set(2, 1, "2", "k2", true)),
            vec![ready(0, "k1"), group(1, false, "k2", Some("k2"))],
            "k2",
            false,
            applied(1, 2, "k2"),
        ),
        (
            "6: rolling, a group without its worker StatefulSet is down: maxUnavailable is used up",
            changed(),
            Some(leader_set(2, 2, "2", "k2", true)),
            vec![group(0, true, "k1", None), ready(1, "k1")],
            "k2",
            false,
            applied(2, 2, "k2"),
        ),
        (
            "6: every group ready after a surge: the surge group is deleted",
            surging,
            Some(leader_set(3, 0, "2", "k1", true)),
            vec![ready(0, "k1"), ready(1, "k1"), ready(2, "k1")],
            "k1",
            false,
            Outcome {
                events: vec![event(
                    "GroupsProgressing",
                    "Delete",
                    "deleting surge replica test-sample-2",
                )],
                ..applied(0, 2, "k1")
            },
        ),
    ];
    for (row, lws, leader, groups, key, lws_updated, expected) in rows {
        let facts = facts(lws, leader, vec![], groups);
        let writes = decide(&facts, key, lws_updated).unwrap_or_else(|err| panic!("{row}: {err}"));
        assert_eq!(outcome(&writes), expected, "{row}");
    }
}

#[test]
fn a_rolling_leader_statefulset_without_its_replicas_annotation_is_an_error() {
    let facts = facts(
        changed(),
        Some(leader_set(2, 2, "two", "k2", true)),
        vec![],
        vec![ready(0, "k1"), ready(1, "k1")],
    );
    let err = decide(&facts, "k2", false).expect_err("no integer annotation");
    assert!(err.contains(REPLICAS_ANNOTATION), "{err}");
}

/// Group `index` as the status counts it.
fn counted(index: i32, ready: bool, updated: bool) -> status::Group {
    status::Group {
        index,
        ready,
        updated,
    }
}

#[test]
fn the_status_counts_every_leader_whose_group_has_its_workers() {
    let sample = sample();
    let single = sample_with(|value| value["spec"]["leaderWorkerTemplate"]["size"] = json!(1));
    let groups = vec![
        ready(0, "k1"),
        group(1, true, "k1", None),
        group(2, false, "k0", Some("k1")),
    ];
    let cases = [
        (
            "groups of two: the group without workers is left out",
            sample,
            vec![counted(0, true, true), counted(2, false, false)],
        ),
        (
            "groups of one: only the leader pods count",
            single,
            vec![
                counted(0, true, true),
                counted(1, true, true),
                counted(2, false, false),
            ],
        ),
    ];
    for (name, lws, expected) in cases {
        let facts = facts(lws, None, vec![], groups.clone());
        let writes = decide(&facts, "k1", false).expect("decided");
        assert_eq!(writes.status_groups, expected, "{name}");
    }
}

fn now() -> Time {
    Time("2026-11-26T12:00:00Z".parse().expect("a time"))
}

/// The status of the sample once its `replicas` groups are ready and updated.
fn available(replicas: i32) -> Value {
    json!({
        "conditions": [{
            "type": "Available", "status": "True", "observedGeneration": 1,
            "lastTransitionTime": "2026-11-26T11:00:00Z",
            "reason": "AllGroupsReady", "message": "All replicas are ready",
        }],
        "readyReplicas": replicas,
        "updatedReplicas": replicas,
        "replicas": replicas,
        "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=test-sample,leaderworkerset.sigs.k8s.io/worker-index=0",
        "observedGeneration": 1,
    })
}

#[test]
fn status_writes_table() {
    let both_ready = [counted(0, true, true), counted(1, true, true)];
    let at_rest = sample_with(|value| value["status"] = available(2));
    let old = revision_of(&changed(), Some("k0"), 1);
    let current = revision_of(&at_rest, Some("k1"), 2);
    let revisions = vec![old.clone(), current];
    let fresh = sample();
    let mut grown = available(2);
    grown["replicas"] = json!(3);

    // (row, LWS, leader replicas, groups, expected)
    let rows: Vec<(&str, &LeaderWorkerSet, i32, &[status::Group], StatusWrites)> = vec![
        (
            "a new LWS: its whole status, on the resourceVersion read, and Progressing said",
            &fresh,
            0,
            &[],
            StatusWrites {
                patch: Some(json!({
                    "metadata": {"resourceVersion": "7"},
                    "status": {
                        "conditions": [{
                            "type": "Progressing", "status": "True", "observedGeneration": 1,
                            "lastTransitionTime": "2026-11-26T12:00:00Z",
                            "reason": "GroupsProgressing", "message": "Replicas are progressing",
                        }],
                        "readyReplicas": 0,
                        "updatedReplicas": 0,
                        "replicas": 0,
                        "hpaPodSelector": "leaderworkerset.sigs.k8s.io/name=test-sample,leaderworkerset.sigs.k8s.io/worker-index=0",
                        "observedGeneration": 1,
                    },
                })),
                event: Some(Note {
                    reason: "GroupsProgressing",
                    action: "Update",
                    note: "Replicas are progressing, with 0 groups ready of total 2 groups".into(),
                }),
                stale_revisions: vec![],
            },
        ),
        (
            "at rest, the update done: nothing written, the other keys' revisions deleted",
            &at_rest,
            2,
            &both_ready,
            StatusWrites {
                patch: None,
                event: None,
                stale_revisions: vec![old.name_any()],
            },
        ),
        (
            "a count changed, no condition: the status without an Event",
            &at_rest,
            3,
            &both_ready,
            StatusWrites {
                patch: Some(json!({"metadata": {"resourceVersion": "7"}, "status": grown})),
                event: None,
                stale_revisions: vec![old.name_any()],
            },
        ),
    ];
    for (row, lws, leader_replicas, groups, expected) in rows {
        let facts = facts(lws.clone(), None, revisions.clone(), vec![]);
        assert_eq!(
            decide_status(&facts, "k1", groups, leader_replicas, now()),
            expected,
            "{row}"
        );
    }
}

#[test]
fn a_failed_write_says_what_failed() {
    assert_eq!(
        apply_failure("vllm", false, &"quota exceeded"),
        Note {
            reason: "FailedCreate",
            action: "Create",
            note: "Failed to create leader statefulset vllm: quota exceeded".to_string(),
        }
    );
    assert_eq!(
        apply_failure("vllm", true, &"conflict"),
        Note {
            reason: "FailedUpdate",
            action: "Update",
            note: "Failed to update leader statefulset vllm: conflict".to_string(),
        }
    );
    assert_eq!(
        service_failure(&"forbidden"),
        Note {
            reason: "FailedCreate",
            action: "Create",
            note: "Failed to create headless service for error: forbidden".to_string(),
        }
    );
}

#[test]
fn a_shared_service_deleted_by_hand_is_made_again_without_a_change() {
    assert_eq!(at_rest(true), Action::requeue(SERVICE_RECHECK));
    assert_eq!(at_rest(false), Action::await_change());
}
