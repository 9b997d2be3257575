//! Upstream's `TestLeaderStatefulSetApplyConfig` rows (whole bodies), and worker
//! StatefulSets built from a revision older than the live spec.

use serde_json::{Value, json};

use super::*;
use crate::controllers::lws::revision::new_revision;
use crate::controllers::lws::revision::tests::{lws, sample_json};

const IMAGE: &str = "docker.io/nginxinc/nginx-unprivileged:1.27";
const KEY: &str = "revision-key";

fn worker_container() -> Value {
    json!({"name": "worker", "image": IMAGE, "ports": [{"containerPort": 8080, "protocol": "TCP"}]})
}

/// Upstream's `BuildBasicLeaderWorkerSet("test-sample", "default")` with the worker
/// template `MakeWorkerPodSpec`, `replicas`, `size`, then `change`.
fn basic(replicas: i32, size: i32, change: impl FnOnce(&mut Value)) -> LeaderWorkerSet {
    let mut value = json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "test-sample", "namespace": "default", "uid": "uid-1"},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "workerTemplate": {"spec": {"containers": [worker_container()]}}
            }
        }
    });
    change(&mut value);
    lws(value)
}

fn owner() -> Value {
    json!([{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "name": "test-sample", "uid": "uid-1", "controller": true, "blockOwnerDeletion": true}])
}

/// The body upstream's rows share: R replicas, pod `annotations` and `containers`.
fn leader_body(
    replicas: i32,
    set_annotations: Value,
    pod_annotations: Value,
    containers: Value,
    max_unavailable: i32,
) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "test-sample",
            "namespace": "default",
            "labels": {"leaderworkerset.sigs.k8s.io/name": "test-sample",
                       "leaderworkerset.sigs.k8s.io/template-revision-hash": KEY},
            "annotations": set_annotations,
            "ownerReferences": owner()
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"leaderworkerset.sigs.k8s.io/name": "test-sample",
                                         "leaderworkerset.sigs.k8s.io/worker-index": "0"}},
            "template": {
                "metadata": {
                    "labels": {"leaderworkerset.sigs.k8s.io/name": "test-sample",
                               "leaderworkerset.sigs.k8s.io/worker-index": "0",
                               "leaderworkerset.sigs.k8s.io/template-revision-hash": KEY},
                    "annotations": pod_annotations
                },
                "spec": {"containers": containers}
            },
            "serviceName": "test-sample",
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"partition": 0, "maxUnavailable": max_unavailable}}
        }
    })
}

#[test]
fn leader_one_replica_size_one_no_leader_template() {
    let lws = basic(1, 1, |_| {});
    assert_eq!(
        leader(&lws, 0, 1, KEY, false).unwrap(),
        leader_body(
            1,
            json!({"leaderworkerset.sigs.k8s.io/replicas": "1"}),
            json!({"leaderworkerset.sigs.k8s.io/size": "1"}),
            json!([worker_container()]),
            1,
        )
    );
}

#[test]
fn leader_two_replicas_leader_template_exclusive_placement() {
    let lws = basic(2, 2, |v| {
        v["metadata"]["annotations"] =
            json!({"leaderworkerset.sigs.k8s.io/exclusive-topology": "topologyKey"});
        v["spec"]["leaderWorkerTemplate"]["leaderTemplate"] =
            json!({"spec": {"containers": [{"name": "leader", "image": IMAGE}]}});
    });
    assert_eq!(
        leader(&lws, 0, 2, KEY, false).unwrap(),
        leader_body(
            2,
            json!({"leaderworkerset.sigs.k8s.io/exclusive-topology": "topologyKey",
                   "leaderworkerset.sigs.k8s.io/replicas": "2"}),
            json!({"leaderworkerset.sigs.k8s.io/size": "2",
                   "leaderworkerset.sigs.k8s.io/exclusive-topology": "topologyKey"}),
            json!([{"name": "leader", "image": IMAGE}]),
            1,
        )
    );
}

#[test]
fn leader_with_claim_templates_and_retention_policy() {
    let lws = basic(1, 1, |v| {
        let template = &mut v["spec"]["leaderWorkerTemplate"];
        template["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Retain", "whenScaled": "Delete"});
        template["volumeClaimTemplates"] = json!([{
            "metadata": {"name": "pvc1", "labels": {"dropped": "as upstream"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "standard",
                "volumeMode": "Filesystem",
                "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
                "volumeName": "dropped-too"
            }
        }]);
    });
    let mut expected = leader_body(
        1,
        json!({"leaderworkerset.sigs.k8s.io/replicas": "1"}),
        json!({"leaderworkerset.sigs.k8s.io/size": "1"}),
        json!([worker_container()]),
        1,
    );
    expected["spec"]["persistentVolumeClaimRetentionPolicy"] =
        json!({"whenDeleted": "Retain", "whenScaled": "Delete"});
    expected["spec"]["volumeClaimTemplates"] = json!([{
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "pvc1", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "standard",
            "volumeMode": "Filesystem",
            "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}}
        }
    }]);
    assert_eq!(leader(&lws, 0, 1, KEY, false).unwrap(), expected);
}

#[test]
fn leader_max_unavailable_and_replicas_rows() {
    let rolling = |mu: Value, ms: Value| {
        move |v: &mut Value| {
            v["spec"]["rolloutStrategy"] = json!({"type": "RollingUpdate",
                       "rollingUpdateConfiguration": {"maxUnavailable": mu, "maxSurge": ms}});
        }
    };
    let cases = [
        (
            "R1 mu2 ms1",
            basic(1, 1, rolling(json!(2), json!(1))),
            1,
            3,
            "1",
        ),
        (
            "R1 mu0 ms2",
            basic(1, 1, rolling(json!(0), json!(2))),
            1,
            1,
            "1",
        ),
        (
            "R0 mu0 ms0",
            basic(0, 1, rolling(json!(0), json!(0))),
            0,
            1,
            "0",
        ),
        (
            "R2 mu1 ms50%, 3 StatefulSet replicas",
            basic(2, 1, rolling(json!(1), json!("50%"))),
            3,
            2,
            "2",
        ),
    ];
    for (name, lws, replicas, max_unavailable, annotation) in cases {
        let body = leader(&lws, 0, replicas, KEY, false).unwrap();
        assert_eq!(body["spec"]["replicas"], replicas, "{name}");
        assert_eq!(
            body["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], max_unavailable,
            "{name}"
        );
        assert_eq!(
            body["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/replicas"], annotation,
            "{name}"
        );
    }
    let bad = basic(1, 1, rolling(json!("lots"), json!(0)));
    assert!(leader(&bad, 0, 1, KEY, false).is_err());
}

#[test]
fn leader_sub_group_and_unique_subdomain_annotations() {
    let lws = basic(1, 2, |v| {
        v["metadata"]["annotations"] =
            json!({"leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": "topologyKey"});
        v["spec"]["leaderWorkerTemplate"]["subGroupPolicy"] = json!({"subGroupSize": 2});
        v["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
    });
    let body = leader(&lws, 0, 1, KEY, false).unwrap();
    assert_eq!(
        body["spec"]["template"]["metadata"]["annotations"],
        json!({
            "leaderworkerset.sigs.k8s.io/size": "2",
            "leaderworkerset.sigs.k8s.io/subgroup-size": "2",
            "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": "topologyKey",
            "leaderworkerset.sigs.k8s.io/subgroup-policy-type": "LeaderWorker",
            "leaderworkerset.sigs.k8s.io/subdomainPolicy": "UniquePerReplica"
        })
    );
    assert_eq!(
        body["metadata"]["annotations"],
        json!({"leaderworkerset.sigs.k8s.io/replicas": "1",
               "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": "topologyKey"})
    );
}

/// `TestLeaderStatefulSetApplyConfigPropagatesObjectMeta`: the user's labels and
/// annotations are kept, the controller's win.
#[test]
fn leader_propagates_the_lws_metadata_under_its_own() {
    let lws = basic(2, 1, |v| {
        v["metadata"]["labels"] =
            json!({"app": "inference", "leaderworkerset.sigs.k8s.io/name": "user-value"});
        v["metadata"]["annotations"] =
            json!({"owner": "platform", "leaderworkerset.sigs.k8s.io/replicas": "user-value"});
        v["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"] =
            json!({"labels": {"app": "inference"}, "annotations": {"team": "ml"}});
    });
    let body = leader(&lws, 0, 2, "revision-1", false).unwrap();
    assert_eq!(
        body["metadata"]["labels"],
        json!({"app": "inference", "leaderworkerset.sigs.k8s.io/name": "test-sample",
               "leaderworkerset.sigs.k8s.io/template-revision-hash": "revision-1"})
    );
    assert_eq!(
        body["metadata"]["annotations"],
        json!({"owner": "platform", "leaderworkerset.sigs.k8s.io/replicas": "2"})
    );
    assert_eq!(
        body["spec"]["template"]["metadata"]["labels"]["app"], "inference",
        "the template's own labels stay"
    );
    assert_eq!(
        body["spec"]["template"]["metadata"]["annotations"]["team"],
        "ml"
    );
}

#[test]
fn group_key_is_the_sha1_of_namespace_and_leader() {
    assert_eq!(
        group_key("default", "test-sample-0"),
        "40bb642a1417b0c5aea271dac9e8065b7e86f411"
    );
}

fn leader_pod(key: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": "test-sample-0",
            "namespace": "default",
            "uid": "pod-uid",
            "labels": {
                "leaderworkerset.sigs.k8s.io/name": "test-sample",
                "leaderworkerset.sigs.k8s.io/worker-index": "0",
                "leaderworkerset.sigs.k8s.io/group-index": "0",
                "leaderworkerset.sigs.k8s.io/group-key": group_key("default", "test-sample-0"),
                "leaderworkerset.sigs.k8s.io/template-revision-hash": key
            }
        }
    }))
    .unwrap()
}

/// The sample LWS of size `size` whose worker container is named `container`, then
/// `change`.
fn sized(size: i32, container: &str, change: impl FnOnce(&mut Value)) -> LeaderWorkerSet {
    let mut value = sample_json();
    value["spec"]["leaderWorkerTemplate"]["size"] = json!(size);
    value["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["name"] =
        json!(container);
    change(&mut value);
    lws(value)
}

/// :1878 and :1964: a group rebuilt mid-update from the old revision gets the old worker
/// template and the old size, with the live LWS's labels and placement annotations.
#[test]
fn worker_built_from_an_old_revision() {
    let old = sized(4, "worker", |_| {});
    let old_revision = new_revision(&old, None, 1);
    let old_key = revision_key(&old_revision).to_string();
    let live = sized(2, "new-worker", |v| {
        v["metadata"]["labels"] = json!({"app": "inference"});
        v["metadata"]["annotations"] =
            json!({"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"});
    });
    let set = worker(&leader_pod(&old_key), &live, &old_revision).unwrap();
    let group = group_key("default", "test-sample-0");
    assert_eq!(
        serde_json::to_value(&set).unwrap(),
        json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {
                "name": "test-sample-0",
                "namespace": "default",
                "labels": {
                    "app": "inference",
                    "leaderworkerset.sigs.k8s.io/group-index": "0",
                    "leaderworkerset.sigs.k8s.io/name": "test-sample",
                    "leaderworkerset.sigs.k8s.io/group-key": group,
                    "leaderworkerset.sigs.k8s.io/template-revision-hash": old_key
                },
                "annotations": {"leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "test-sample-0",
                                     "uid": "pod-uid", "controller": true,
                                     "blockOwnerDeletion": true}]
            },
            "spec": {
                "replicas": 3,
                "serviceName": "test-sample",
                "podManagementPolicy": "Parallel",
                "ordinals": {"start": 1},
                "selector": {"matchLabels": {
                    "leaderworkerset.sigs.k8s.io/group-index": "0",
                    "leaderworkerset.sigs.k8s.io/name": "test-sample",
                    "leaderworkerset.sigs.k8s.io/group-key": group
                }},
                "template": {
                    "metadata": {
                        "labels": {
                            "leaderworkerset.sigs.k8s.io/group-index": "0",
                            "leaderworkerset.sigs.k8s.io/name": "test-sample",
                            "leaderworkerset.sigs.k8s.io/group-key": group,
                            "leaderworkerset.sigs.k8s.io/template-revision-hash": old_key
                        },
                        "annotations": {
                            "leaderworkerset.sigs.k8s.io/size": "4",
                            "leaderworkerset.sigs.k8s.io/leader-name": "test-sample-0",
                            "leaderworkerset.sigs.k8s.io/exclusive-topology": "rack"
                        }
                    },
                    "spec": {"containers": [container_with_env(
                        worker_container(),
                        expected_worker_env("test-sample-0.test-sample.default", "4"),
                    )]}
                }
            }
        })
    );
}

#[test]
fn worker_network_sub_groups_and_claims_come_from_the_revision() {
    let unique = sized(3, "worker", |v| {
        v["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
        v["spec"]["leaderWorkerTemplate"]["subGroupPolicy"] =
            json!({"subGroupPolicyType": "LeaderExcluded", "subGroupSize": 2});
        v["spec"]["leaderWorkerTemplate"]["volumeClaimTemplates"] =
            json!([{"metadata": {"name": "cache"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]);
    });
    let shared = sized(3, "worker", |_| {});
    let unique_revision = new_revision(&unique, None, 1);
    let shared_revision = new_revision(&shared, None, 2);

    let set = worker(&leader_pod("k"), &shared, &unique_revision).unwrap();
    let spec = set.spec.unwrap();
    assert_eq!(
        spec.service_name.as_deref(),
        Some("test-sample-0"),
        "UniquePerReplica"
    );
    let annotations = spec.template.metadata.unwrap().annotations.unwrap();
    assert_eq!(
        annotations[SUBGROUP_POLICY_TYPE_ANNOTATION],
        "LeaderExcluded"
    );
    assert_eq!(annotations[SUBGROUP_SIZE_ANNOTATION], "2");
    assert!(
        !annotations.contains_key(SUBDOMAIN_POLICY_ANNOTATION),
        "leaders only"
    );
    let claims = serde_json::to_value(spec.volume_claim_templates.unwrap()).unwrap();
    assert_eq!(
        claims,
        json!([{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "cache", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"]}}])
    );

    let set = worker(&leader_pod("k"), &unique, &shared_revision).unwrap();
    let spec = set.spec.unwrap();
    assert_eq!(spec.service_name.as_deref(), Some("test-sample"), "Shared");
    assert!(spec.volume_claim_templates.is_none());
    let annotations = spec.template.metadata.unwrap().annotations.unwrap();
    assert!(!annotations.contains_key(SUBGROUP_SIZE_ANNOTATION));
}

#[test]
fn a_worker_set_needs_a_revision_that_applies() {
    let mut revision = new_revision(&sized(2, "worker", |_| {}), None, 1);
    revision.data = None;
    let error = worker(&leader_pod("k"), &sized(2, "worker", |_| {}), &revision).unwrap_err();
    assert!(error.contains("has no data"), "{error}");
}

#[test]
fn exclusive_placement_pins_workers_to_the_leaders_domain() {
    let lws = sized(2, "worker", |_| {});
    let mut set = worker(&leader_pod("k"), &lws, &new_revision(&lws, None, 1)).unwrap();
    pin_to_topology(&mut set, "topology.kubernetes.io/zone", "zone-a");
    let node_selector = set
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .node_selector
        .unwrap();
    assert_eq!(node_selector["topology.kubernetes.io/zone"], "zone-a");
}

/// `AddTPUAnnotations`: the workers learn that their leader asks for TPUs.
#[test]
fn workers_are_told_when_their_leader_requests_tpus() {
    let lws = sized(2, "worker", |_| {});
    let revision = new_revision(&lws, None, 1);
    let with_spec = |spec: Value| {
        let mut pod = leader_pod("k");
        pod.spec = Some(serde_json::from_value(spec).unwrap());
        pod
    };
    let container = |resources: Value| json!({"name": "leader", "resources": resources});
    let cases = [
        (
            "limits",
            json!({"containers": [container(json!({"limits": {"google.com/tpu": "4"}}))]}),
            true,
        ),
        (
            "requests only",
            json!({"containers": [container(json!({"requests": {"google.com/tpu": "4"}}))]}),
            true,
        ),
        (
            "zero limits, requests",
            json!({"containers": [container(json!({"limits": {"google.com/tpu": "0"},
                                                   "requests": {"google.com/tpu": "1"}}))]}),
            true,
        ),
        (
            "an init container",
            json!({"containers": [container(json!({}))],
                   "initContainers": [container(json!({"limits": {"google.com/tpu": "1"}}))]}),
            true,
        ),
        (
            "zero",
            json!({"containers": [container(json!({"limits": {"google.com/tpu": "0.0"}}))]}),
            false,
        ),
        (
            "GPUs only",
            json!({"containers": [container(json!({"limits": {"nvidia.com/gpu": "8"}}))]}),
            false,
        ),
        (
            "no resources",
            json!({"containers": [{"name": "leader"}]}),
            false,
        ),
    ];
    for (name, spec, expected) in cases {
        let set = worker(&with_spec(spec), &lws, &revision).unwrap();
        let annotations = set
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap();
        assert_eq!(
            annotations
                .get(LEADER_REQUESTS_TPUS_ANNOTATION)
                .map(String::as_str),
            expected.then_some("true"),
            "{name}"
        );
    }
}

#[test]
fn a_quantity_is_zero_whatever_its_suffix() {
    for zero in ["0", "0.0", "0Ki", "0e3", "-0", ""] {
        assert!(is_zero(&Quantity(zero.to_string())), "{zero}");
    }
    for some in ["1", "0.5", "1Ki", "1e3", "100m"] {
        assert!(!is_zero(&Quantity(some.to_string())), "{some}");
    }
}

/// `container` with `env` first.
fn container_with_env(container: Value, env: Value) -> Value {
    let mut container = container;
    container["env"] = env;
    container
}

/// The variables of a worker container: the leader's address, the group size, the worker
/// index from the StatefulSet's ordinal label.
fn expected_worker_env(address: &str, size: &str) -> Value {
    json!([
        {"name": "LWS_LEADER_ADDRESS", "value": address},
        {"name": "LWS_GROUP_SIZE", "value": size},
        {"name": "LWS_WORKER_INDEX", "valueFrom": {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}
    ])
}

/// The variables of a leader container: its own name, then its address written from it.
fn expected_leader_env(subdomain: &str, size: &str) -> Value {
    json!([
        {"name": "LWS_LEADER_POD_NAME", "valueFrom": {"fieldRef": {
            "apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "LWS_LEADER_ADDRESS",
         "value": format!("$(LWS_LEADER_POD_NAME).{subdomain}.default")},
        {"name": "LWS_GROUP_SIZE", "value": size},
        {"name": "LWS_WORKER_INDEX", "value": "0"}
    ])
}

/// `AddLWSVariables` on worker pods: first in every container and init container, the
/// container's own of the same name dropped, its others kept after them.
#[test]
fn workers_get_the_lws_variables_first() {
    let lws = sized(4, "worker", |v| {
        let spec = &mut v["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"];
        spec["containers"][0]["env"] = json!([
            {"name": "LWS_GROUP_SIZE", "value": "9"},
            {"name": "RAY_PORT", "value": "6379"},
            {"name": "RAY_PORT", "value": "6380"},
            {"name": "ADDRESS", "value": "$(LWS_LEADER_ADDRESS):$(RAY_PORT)"}
        ]);
        spec["initContainers"] = json!([{"name": "wait", "image": IMAGE}]);
    });
    let mut leader = leader_pod("k");
    leader.metadata.name = Some("test-sample-1".into());
    leader
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(GROUP_INDEX_LABEL.to_string(), "1".to_string());
    let set = worker(&leader, &lws, &new_revision(&lws, None, 1)).unwrap();
    let spec = serde_json::to_value(set.spec.unwrap().template.spec.unwrap()).unwrap();
    let mut expected = expected_worker_env("test-sample-1.test-sample.default", "4");
    let expected_init = expected.clone();
    expected.as_array_mut().unwrap().extend([
        json!({"name": "RAY_PORT", "value": "6379"}),
        json!({"name": "ADDRESS", "value": "$(LWS_LEADER_ADDRESS):$(RAY_PORT)"}),
    ]);
    assert_eq!(spec["containers"][0]["env"], expected);
    assert_eq!(spec["initContainers"][0]["env"], expected_init);
}

#[test]
fn a_worker_finds_its_leader_through_its_groups_service_under_unique_per_replica() {
    let lws = sized(3, "worker", |v| {
        v["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
    });
    let set = worker(&leader_pod("k"), &lws, &new_revision(&lws, None, 1)).unwrap();
    let spec = serde_json::to_value(set.spec.unwrap().template.spec.unwrap()).unwrap();
    assert_eq!(
        spec["containers"][0]["env"],
        expected_worker_env("test-sample-0.test-sample-0.default", "3")
    );
}

#[test]
fn leaders_get_the_lws_variables_only_when_asked() {
    let shared = basic(2, 3, |v| {
        v["spec"]["leaderWorkerTemplate"]["leaderTemplate"] = json!({"spec": {
            "containers": [{"name": "leader", "image": IMAGE,
                            "env": [{"name": "LWS_WORKER_INDEX", "value": "7"},
                                    {"name": "MODEL", "value": "llama"}]}],
            "initContainers": [{"name": "wait", "image": IMAGE}]
        }});
    });
    let body = leader(&shared, 0, 2, KEY, true).unwrap();
    let mut expected = expected_leader_env("test-sample", "3");
    let expected_init = expected.clone();
    expected
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "MODEL", "value": "llama"}));
    assert_eq!(
        body["spec"]["template"]["spec"]["containers"][0]["env"],
        expected
    );
    assert_eq!(
        body["spec"]["template"]["spec"]["initContainers"][0]["env"],
        expected_init
    );

    let without = leader(&shared, 0, 2, KEY, false).unwrap();
    assert_eq!(
        without["spec"]["template"]["spec"]["containers"][0]["env"],
        json!([{"name": "LWS_WORKER_INDEX", "value": "7"}, {"name": "MODEL", "value": "llama"}]),
        "the template's own"
    );

    let unique = basic(1, 2, |v| {
        v["spec"]["networkConfig"] = json!({"subdomainPolicy": "UniquePerReplica"});
    });
    let body = leader(&unique, 0, 1, KEY, true).unwrap();
    assert_eq!(
        body["spec"]["template"]["spec"]["containers"][0]["env"],
        container_with_env(
            worker_container(),
            expected_leader_env("$(LWS_LEADER_POD_NAME)", "2")
        )["env"],
        "the leader's own name is its subdomain"
    );
}

/// Adding the variables to the leader template restarts every leader pod, so only a
/// template that changes anyway gets them, and one that has them keeps them.
#[test]
fn leader_variables_wait_for_a_template_change() {
    let live = |key: &str, env: Value| -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "test-sample",
                         "labels": {"leaderworkerset.sigs.k8s.io/template-revision-hash": key}},
            "spec": {
                "selector": {},
                "template": {"spec": {"containers": [{"name": "leader", "env": env}]}}
            }
        }))
        .unwrap()
    };
    let with_size = json!([{"name": "LWS_GROUP_SIZE", "value": "2"}]);
    let own = json!([{"name": "MODEL", "value": "llama"}]);
    let cases = [
        ("a new LWS", None, true),
        (
            "a running LWS upgraded to this capstan",
            Some(live("k1", own.clone())),
            false,
        ),
        ("a rolling update", Some(live("k0", own)), true),
        ("already there", Some(live("k1", with_size)), true),
    ];
    for (name, live, expected) in cases {
        assert_eq!(leader_env_wanted(live.as_ref(), "k1"), expected, "{name}");
    }
}
