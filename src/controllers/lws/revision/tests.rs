//! Upstream's `revision_utils_test.go` and `TestGetUpdatedRevision`, and the key's format.

use serde_json::{Value, json};

use super::*;

/// Upstream's `wrappers.BuildLeaderWorkerSet("default")`: two groups of two, a leader
/// template, the webhook's defaults written out.
pub(in crate::controllers::lws) fn sample_json() -> Value {
    json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "test-sample", "namespace": "default", "uid": "uid-1", "generation": 1},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"spec": {"containers": [
                    {"name": "leader", "image": "docker.io/nginxinc/nginx-unprivileged:1.27"}
                ]}},
                "workerTemplate": {"spec": {"containers": [
                    {"name": "worker", "image": "docker.io/nginxinc/nginx-unprivileged:1.27",
                     "ports": [{"containerPort": 8080, "protocol": "TCP"}]}
                ]}}
            },
            "rolloutStrategy": {"type": "RollingUpdate", "rollingUpdateConfiguration":
                {"partition": 0, "maxUnavailable": 1, "maxSurge": 0}},
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": "Shared"}
        }
    })
}

/// [`sample_json`] decoded.
pub(in crate::controllers::lws) fn sample() -> LeaderWorkerSet {
    lws(sample_json())
}

/// An LWS decoded from JSON.
pub(in crate::controllers::lws) fn lws(value: Value) -> LeaderWorkerSet {
    serde_json::from_value(value).expect("a LeaderWorkerSet")
}

/// [`sample_json`] with `change` made to it.
fn sample_with(change: impl FnOnce(&mut Value)) -> LeaderWorkerSet {
    let mut value = sample_json();
    change(&mut value);
    lws(value)
}

fn worker_spec(value: &mut Value, spec: Value) {
    value["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"] = spec;
}

/// `MakeWorkerPodSpecWithVolume`; `image_field` adds the volume's `image: null`
/// (`MakeWorkerPodSpecWithVolumeAndNilImage`).
fn spec_with_volume(image_field: bool) -> Value {
    let mut volume = json!({"name": "dshm"});
    if image_field {
        volume["image"] = Value::Null;
    }
    json!({
        "containers": [{"name": "leader", "image": "docker.io/nginxinc/nginx-unprivileged:1.27",
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}]}],
        "volumes": [volume]
    })
}

#[test]
fn fnv1_is_not_fnv1a() {
    let cases: &[(&[u8], u32)] = &[
        (b"", 0x811c_9dc5),
        (b"a", 0x050c_5d7e),
        (b"foobar", 0x31f0_b262),
    ];
    for (bytes, hash) in cases {
        assert_eq!(fnv1_32(bytes), *hash, "{bytes:?}");
    }
    // FNV-1a of "a" is 0xe40c292c.
    assert_ne!(fnv1_32(b"a"), 0xe40c_292c);
}

#[test]
fn keys_are_the_decimal_hash_in_the_safe_alphabet() {
    let cases: &[(&[u8], &str)] = &[
        // 2166136261
        (b"", "65bb57b6b5"),
        // 84696446
        (b"a", "d8bfb88b"),
        // 837857890
        (b"foobar", "d7cd9cdf4"),
    ];
    for (bytes, key) in cases {
        assert_eq!(key_of(bytes), *key, "{bytes:?}");
    }
    assert_eq!(safe_encode("0123456789"), "456789bcdf");
}

#[test]
fn a_content_key_is_short_safe_and_stable() {
    let format = regex::Regex::new("^[4-9bcdf]{1,10}$").unwrap();
    let key = content_key(&sample());
    assert!(format.is_match(&key), "{key}");
    assert_eq!(content_key(&sample()), key, "stable across calls");

    // The same spec written with its keys in another order.
    let reordered = lws(json!({
        "kind": "LeaderWorkerSet",
        "spec": {
            "networkConfig": {"subdomainPolicy": "Shared"},
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {"rollingUpdateConfiguration":
                {"maxSurge": 0, "maxUnavailable": 1, "partition": 0}, "type": "RollingUpdate"},
            "leaderWorkerTemplate": {
                "workerTemplate": {"spec": {"containers": [
                    {"ports": [{"protocol": "TCP", "containerPort": 8080}],
                     "image": "docker.io/nginxinc/nginx-unprivileged:1.27", "name": "worker"}
                ]}},
                "leaderTemplate": {"spec": {"containers": [
                    {"image": "docker.io/nginxinc/nginx-unprivileged:1.27", "name": "leader"}
                ]}},
                "restartPolicy": "RecreateGroupOnPodRestart",
                "size": 2
            },
            "replicas": 2
        },
        "metadata": {"generation": 1, "uid": "uid-1", "namespace": "default", "name": "test-sample"},
        "apiVersion": "leaderworkerset.x-k8s.io/v1"
    }));
    assert_eq!(content_key(&reordered), key, "stable across key order");
}

#[test]
fn the_patch_holds_only_the_template_and_network_config() {
    let data = patch(&sample());
    let spec = data["spec"].as_object().unwrap();
    assert_eq!(
        spec.keys().collect::<Vec<_>>(),
        ["leaderWorkerTemplate", "networkConfig"]
    );
    assert_eq!(
        spec["networkConfig"],
        json!({"$patch": "replace", "subdomainPolicy": "Shared"})
    );
    assert_eq!(spec["leaderWorkerTemplate"]["$patch"], "replace");
    assert_eq!(spec["leaderWorkerTemplate"]["size"], 2);
    let without_network = sample_with(|v| {
        v["spec"].as_object_mut().unwrap().remove("networkConfig");
    });
    assert_eq!(
        patch(&without_network),
        data,
        "absent networkConfig is Shared"
    );
}

#[test]
fn a_new_revision_is_named_labelled_and_owned_as_upstream() {
    let lws = sample();
    let key = content_key(&lws);
    let revision = new_revision(&lws, None, 3);
    assert_eq!(
        revision.metadata.name.as_deref(),
        Some(format!("test-sample-{key}-3").as_str())
    );
    assert_eq!(revision.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(revision.revision, 3);
    assert_eq!(revision_key(&revision), key);
    assert_eq!(
        revision.metadata.labels.as_ref().unwrap()[NAME_LABEL],
        "test-sample"
    );
    assert_eq!(revision.data.as_ref().unwrap().0, patch(&lws));
    let owner = serde_json::to_value(revision.metadata.owner_references.unwrap()).unwrap();
    assert_eq!(
        owner,
        json!([{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                "name": "test-sample", "uid": "uid-1", "controller": true,
                "blockOwnerDeletion": true}])
    );

    // A key read off an existing leader StatefulSet is kept; the name keeps the content key.
    let adopted = new_revision(&lws, Some("templateHash"), 1);
    assert_eq!(revision_key(&adopted), "templateHash");
    assert_eq!(
        adopted.metadata.name.as_deref(),
        Some(format!("test-sample-{key}-1").as_str())
    );
    assert_eq!(revision_key(&new_revision(&lws, Some(""), 1)), key);

    let long = sample_with(|v| v["metadata"]["name"] = json!("x".repeat(250)));
    let name = new_revision(&long, None, 1).metadata.name.unwrap();
    assert!(name.starts_with(&format!("{}-", "x".repeat(220))), "{name}");
    assert!(!name.starts_with(&"x".repeat(221)), "{name}");
}

/// One side of an equality row: an LWS and the key its revision is made with, or none.
type Side = Option<(LeaderWorkerSet, &'static str)>;

#[test]
fn equal_revision_table() {
    let unique =
        |v: &mut Value| v["spec"]["networkConfig"]["subdomainPolicy"] = json!("UniquePerReplica");
    let no_network = |v: &mut Value| {
        v["spec"].as_object_mut().unwrap().remove("networkConfig");
    };
    let leader_spec_as_worker = |v: &mut Value| {
        let leader = v["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"].clone();
        worker_spec(v, leader);
    };
    let cases: Vec<(&str, Side, Side, bool)> = vec![
        (
            "same LeaderWorkerTemplate, networkConfig",
            Some((sample(), "")),
            Some((sample(), "")),
            true,
        ),
        (
            "same LeaderWorkerTemplate, networkConfig, different revisionKey",
            Some((sample(), "")),
            Some((sample(), "templateHash")),
            true,
        ),
        (
            "same LeaderWorkerTemplate, shared subdomainpolicy & nil",
            Some((sample(), "")),
            Some((sample_with(no_network), "")),
            true,
        ),
        ("left nil, right nil", None, None, true),
        (
            "semantically same LeaderWorkerTemplate, different fields set",
            Some((sample_with(|v| worker_spec(v, spec_with_volume(true))), "")),
            Some((sample_with(|v| worker_spec(v, spec_with_volume(false))), "")),
            true,
        ),
        ("left nil, right non-nil", None, Some((sample(), "")), false),
        (
            "same LeaderWorkerTemplate, different networkConfig",
            Some((sample_with(unique), "")),
            Some((sample(), "")),
            false,
        ),
        (
            "different LeaderWorkerTemplate, same networkConfig",
            Some((sample(), "")),
            Some((sample_with(leader_spec_as_worker), "")),
            false,
        ),
    ];
    for (name, left, right, expected) in cases {
        let revision = |side: Side| side.map(|(lws, key)| new_revision(&lws, Some(key), 1));
        let equal = match (revision(left), revision(right)) {
            (Some(a), Some(b)) => equal(&a, &b),
            (a, b) => a.is_none() && b.is_none(),
        };
        assert_eq!(equal, expected, "{name}");
    }
}

#[test]
fn applying_a_revision_restores_its_template_and_network_config_only() {
    let original = sample();
    let revision = new_revision(&original, None, 1);
    let live = sample_with(|v| {
        v["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["name"] =
            json!("update-name");
        v["spec"]["networkConfig"]["subdomainPolicy"] = json!("UniquePerReplica");
        v["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] =
            json!({"maxUnavailable": 2, "maxSurge": 1});
        v["spec"]["replicas"] = json!(5);
    });
    let restored = apply(&live, &revision).unwrap();
    assert!(equal(&new_revision(&restored, None, 1), &revision));
    assert_eq!(
        restored.spec.leader_worker_template,
        original.spec.leader_worker_template
    );
    assert_eq!(restored.spec.network_config, original.spec.network_config);
    assert_eq!(
        restored.spec.rollout_strategy, live.spec.rollout_strategy,
        "rolloutStrategy stays live"
    );
    assert_eq!(restored.spec.replicas, 5, "replicas stay live");
    assert_eq!(restored.metadata, live.metadata);
}

#[test]
fn applying_a_revision_without_data_fails() {
    let mut revision = new_revision(&sample(), None, 1);
    revision.data = None;
    let error = apply(&sample(), &revision).unwrap_err();
    assert!(error.contains("has no data"), "{error}");
}

#[test]
fn highest_revision_table() {
    let numbered = |number: i64| ControllerRevision {
        revision: number,
        ..new_revision(&sample(), None, number)
    };
    let cases: Vec<(&str, Vec<ControllerRevision>, Option<i64>)> = vec![
        ("empty revision list", vec![], None),
        ("only one revision in list", vec![numbered(1)], Some(1)),
        (
            "the highest revision number",
            vec![numbered(2), numbered(3), numbered(2)],
            Some(3),
        ),
    ];
    for (name, revisions, expected) in cases {
        assert_eq!(highest(&revisions).map(|r| r.revision), expected, "{name}");
        assert_eq!(next_number(&revisions), expected.unwrap_or(0) + 1, "{name}");
    }
}

/// A revision the StatefulSet controller made for one of `lws`'s StatefulSets: its pod
/// template's labels (the LWS's name and `key` among them), numbered `number`, controlled
/// by the StatefulSet.
fn stateful_set_revision(
    lws: &LeaderWorkerSet,
    set: &str,
    key: &str,
    number: i64,
) -> ControllerRevision {
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{set}-6b5bc896b9")),
            namespace: lws.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (NAME_LABEL.to_string(), lws_name(lws).to_string()),
                (REVISION_KEY_LABEL.to_string(), key.to_string()),
                (
                    "controller.kubernetes.io/hash".to_string(),
                    "6b5bc896b9".to_string(),
                ),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "StatefulSet".into(),
                name: set.into(),
                uid: format!("uid-statefulset-{set}"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(
            json!({"spec": {"template": {"$patch": "replace"}}}),
        )),
        revision: number,
    }
}

/// Which revision groups made with a key run, and which revisions go once an update is
/// done: only the LWS's own, whatever the order the API server lists them in.
#[test]
fn find_and_truncate_take_only_the_lws_own_revisions() {
    let lws = sample();
    let other = sample_with(|v| v["metadata"]["name"] = json!("other"));
    let mut k1_again = new_revision(&lws, Some("k1"), 3);
    k1_again.metadata.name = Some("test-sample-k1-3".into());
    let mine = [
        new_revision(&lws, Some("k1"), 1),
        new_revision(&lws, Some("k2"), 2),
        k1_again,
    ];
    let others = [
        new_revision(&other, Some("k1"), 4),
        // The leader and a worker StatefulSet's own, labelled with the LWS's name and key,
        // numbered as high as the LWS's: listed after its own, they win a tie by number.
        stateful_set_revision(&lws, "test-sample", "k1", 3),
        stateful_set_revision(&lws, "test-sample-0", "k2", 2),
    ];
    let listed = |order: &[usize]| -> Vec<ControllerRevision> {
        let all: Vec<&ControllerRevision> = mine.iter().chain(&others).collect();
        order.iter().map(|i| all[*i].clone()).collect()
    };
    // (key, the revision number found); each for the LWS's revisions listed first and last.
    let cases: [(&str, Option<i64>); 4] =
        [("", None), ("k3", None), ("k2", Some(2)), ("k1", Some(3))];
    for order in [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]] {
        let revisions = listed(&order);
        for (key, expected) in cases {
            let found = find(&revisions, &lws, key);
            assert_eq!(
                found.map(|r| r.revision),
                expected,
                "key {key:?}, order {order:?}"
            );
            assert!(
                found.is_none_or(|r| belongs_to(r, &lws)),
                "key {key:?}, order {order:?}"
            );
        }
        let mut truncated: Vec<i64> = to_truncate(&revisions, &lws, "k1")
            .iter()
            .map(|r| r.revision)
            .collect();
        truncated.sort();
        assert_eq!(truncated, [2], "order {order:?}");
    }
}

#[test]
fn a_revision_belongs_to_its_lws_or_to_no_controller() {
    let lws = sample();
    let mine = new_revision(&lws, None, 1);
    let mut orphan = mine.clone();
    orphan.metadata.owner_references = None;
    let mut adopted_by_another = mine.clone();
    adopted_by_another
        .metadata
        .owner_references
        .as_mut()
        .unwrap()[0]
        .uid = "uid-2".into();
    let mut elsewhere = mine.clone();
    elsewhere.metadata.namespace = Some("other".into());
    let mut unlabelled = mine.clone();
    unlabelled.metadata.labels = None;
    assert!(belongs_to(&mine, &lws));
    assert!(belongs_to(&orphan, &lws));
    assert!(!belongs_to(&adopted_by_another, &lws));
    assert!(!belongs_to(&elsewhere, &lws));
    assert!(!belongs_to(&unlabelled, &lws));
}

/// An edit of a stored patch.
type Modify = Box<dyn Fn(&mut Value)>;

/// `TestGetUpdatedRevision`, on an LWS whose templates carry `metadata: {}` as every Go
/// object does: `modify` edits the stored patch, as an older serialisation or a real
/// change would have written it.
#[test]
fn updated_revision_table() {
    let worker_template = "/spec/leaderWorkerTemplate/workerTemplate";
    let cases: Vec<(&str, Modify, bool)> = vec![
        ("revision matches current spec", Box::new(|_| {}), false),
        (
            "old serialisation with creationTimestamp null",
            Box::new(move |data| {
                data.pointer_mut(worker_template).unwrap()["metadata"] =
                    json!({"creationTimestamp": null});
            }),
            false,
        ),
        (
            "an explicit null",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["command"] = Value::Null;
            }),
            false,
        ),
        (
            "an empty metadata on one side only",
            Box::new(move |data| {
                data.pointer_mut(worker_template)
                    .unwrap()
                    .as_object_mut()
                    .unwrap()
                    .remove("metadata");
            }),
            false,
        ),
        (
            "empty resources stored, none live",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["resources"] = json!({});
            }),
            false,
        ),
        (
            "resources emptied to nothing but an empty limits",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["resources"] = json!({"limits": {}});
            }),
            false,
        ),
        (
            "a field present on one side only",
            Box::new(move |data| {
                data.pointer_mut(worker_template).unwrap()["metadata"] =
                    json!({"labels": {"team": "ml"}});
            }),
            true,
        ),
        (
            "requests stored, none live",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
            }),
            true,
        ),
        (
            "an empty list stored, none live",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["args"] = json!([]);
            }),
            false,
        ),
        (
            "an argument stored, none live",
            Box::new(move |data| {
                let template = data.pointer_mut(worker_template).unwrap();
                template["spec"]["containers"][0]["args"] = json!(["--verbose"]);
            }),
            true,
        ),
        (
            "a renamed container",
            Box::new(|data| {
                data.pointer_mut("/spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0")
                    .unwrap()["name"] = json!("changed");
            }),
            true,
        ),
        (
            "another network config",
            Box::new(|data| {
                data["spec"]["networkConfig"]["subdomainPolicy"] = json!("UniquePerReplica");
            }),
            true,
        ),
    ];
    let lws = sample_with(|v| {
        v["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"] = json!({});
        v["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"] = json!({});
    });
    for (name, modify, expect_update) in cases {
        let mut current = new_revision(&lws, None, 1);
        modify(&mut current.data.as_mut().unwrap().0);
        let updated = updated_revision(&lws, &current, 2);
        assert_eq!(updated.is_some(), expect_update, "{name}");
        if let Some(updated) = updated {
            assert_eq!(updated.revision, 2, "{name}");
            assert_eq!(revision_key(&updated), content_key(&lws), "{name}");
        }
    }
}

#[test]
fn spec_changes_outside_the_revision_make_none() {
    let current = new_revision(&sample(), None, 1);
    let scaled = sample_with(|v| {
        v["spec"]["replicas"] = json!(7);
        v["spec"]["startupPolicy"] = json!("LeaderReady");
        v["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] = json!(1);
    });
    assert!(updated_revision(&scaled, &current, 2).is_none());
    let resized = sample_with(|v| v["spec"]["leaderWorkerTemplate"]["size"] = json!(3));
    assert!(updated_revision(&resized, &current, 2).is_some());
}

/// Upstream's webhook stores the deprecated `Default` as `None`: following the deprecation
/// notice, or upgrading capstan past revisions that stored `Default`, rolls nothing.
#[test]
fn the_deprecated_default_restart_policy_is_none_in_revisions() {
    let with_policy = |policy: &str| {
        let policy = policy.to_string();
        sample_with(move |v| v["spec"]["leaderWorkerTemplate"]["restartPolicy"] = json!(policy))
    };
    let default = with_policy("Default");
    let none = with_policy("None");
    assert_eq!(content_key(&default), content_key(&none));
    assert_eq!(
        patch(&default)["spec"]["leaderWorkerTemplate"]["restartPolicy"],
        "None"
    );
    assert!(updated_revision(&none, &new_revision(&default, None, 1), 2).is_none());

    // A revision an older capstan stored with `Default` still matches either spelling.
    let mut stored = new_revision(&default, None, 1);
    stored.data.as_mut().unwrap().0["spec"]["leaderWorkerTemplate"]["restartPolicy"] =
        json!("Default");
    assert!(updated_revision(&none, &stored, 2).is_none());
    assert!(updated_revision(&default, &stored, 2).is_none());

    let recreate = with_policy("RecreateGroupAfterStart");
    assert!(updated_revision(&recreate, &stored, 2).is_some());
}

#[test]
fn empty_objects_and_lists_are_dropped_innermost_first_and_list_items_kept() {
    let value = json!({
        "a": {}, "b": {"c": {"d": {}}}, "e": [{}, {"f": {}}], "g": 0, "h": {"i": "x", "j": []},
        "k": [[]], "l": ""
    });
    assert_eq!(
        without_empty(value),
        json!({"e": [{}, {}], "g": 0, "h": {"i": "x"}, "k": [[]], "l": ""})
    );
}
