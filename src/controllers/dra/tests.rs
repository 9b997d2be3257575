use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSetStatus as AppsStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::*;
use capstan_api::labels::{APPLIED_DIGEST_ANNOTATION, ROLE_LABEL};
use capstan_api::module::Module;

const UID: &str = "4f1c2a9e-0000-4000-8000-000000000001";

fn key() -> ModuleKey {
    ModuleKey::new("kmm-demo", "my-kmod").unwrap()
}

/// KMM's docs Module "with DRA", version `version` ("" for none); `dra` replaces its
/// `spec.dra` (`null` removes it).
fn module_with(version: &str, dra: Value) -> ModuleFacts {
    let mut spec = json!({
        "selector": {"node-role.kubernetes.io/worker": ""},
        "imageRepoSecret": {"name": "secret-name"},
        "moduleLoader": {"container": {
            "version": version,
            "modprobe": {"moduleName": "my-kmod"},
            "kernelMappings": [{"regexp": "^.+$", "containerImage": "some.registry/org/my-kmod:${KERNEL_FULL_VERSION}"}],
        }},
    });
    if !dra.is_null() {
        spec["dra"] = dra;
    }
    let object: Module = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": UID},
        "spec": spec,
    }))
    .unwrap();
    ModuleFacts::from_module(&object).unwrap()
}

fn docs_dra() -> Value {
    json!({
        "driverName": "dra.example.com",
        "container": {
            "image": "some.registry/org/my-dra-driver:latest",
            "env": [{"name": "MY_DRA_ENV_VAR", "value": "SOME_VALUE"}],
            "volumeMounts": [{"mountPath": "/some/mountPath", "name": "dra-extra-volume"}],
        },
        "initContainer": {"image": "some.registry/org/my-dra-init:latest"},
        "volumes": [{"name": "dra-extra-volume", "configMap": {"name": "some-configmap"}}],
        "serviceAccountName": "sa-dra-driver",
        "deviceClasses": [{
            "name": "my-device-class",
            "selectors": [{"cel": {"expression": "device.driver == 'dra.example.com'"}}],
            "config": [{"opaque": {
                "driver": "dra.example.com",
                "parameters": {"apiVersion": "dra.example.com/v1", "kind": "MyDeviceConfig", "spec": {"mode": "default"}},
            }}],
        }],
    })
}

fn module(version: &str) -> ModuleFacts {
    module_with(version, docs_dra())
}

/// The DaemonSet `module` wants for `version`, as the API server returns it: with a uid,
/// a resourceVersion, a generation, defaults and a status (`counts` as desired, current,
/// misscheduled, available; observed at its generation).
fn live(module: &ModuleFacts, version: Option<&str>, counts: (i32, i32, i32, i32)) -> DaemonSet {
    let wanted = daemon_set(module, version).unwrap();
    let mut value = serde_json::to_value(&wanted).unwrap();
    value["metadata"]["uid"] = json!(format!("uid-{}", wanted.metadata.name.unwrap()));
    value["metadata"]["resourceVersion"] = json!("42");
    value["metadata"]["generation"] = json!(1);
    value["spec"]["revisionHistoryLimit"] = json!(10);
    let pod = &mut value["spec"]["template"]["spec"];
    pod["dnsPolicy"] = json!("ClusterFirst");
    pod["containers"][0]["terminationMessagePath"] = json!("/dev/termination-log");
    let mut ds: DaemonSet = serde_json::from_value(value).unwrap();
    let (desired, current, misscheduled, available) = counts;
    ds.status = Some(AppsStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_available: Some(available),
        observed_generation: Some(1),
        ..AppsStatus::default()
    });
    ds
}

/// A DeviceClass as the API server returns `wanted`, or labelled for `owner` instead.
fn live_class(name: &str, owner: Option<(&str, &str)>, spec: Value) -> DeviceClass {
    let mut labels = json!({});
    if let Some((namespace, module)) = owner {
        labels = json!({MODULE_NAMESPACE_LABEL: namespace, MODULE_NAME_LABEL: module});
    }
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "7", "labels": labels},
        "spec": spec,
    }))
    .unwrap()
}

fn deleting<K: Resource>(mut object: K) -> K {
    object.meta_mut().deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    object
}

/// `(object, step kind, why)` of each step: `apply`, `delete` or `-`.
fn summary(decision: &Decision) -> Vec<(String, &'static str, Why)> {
    fn kind<K>(action: &Action<K>) -> &'static str {
        match action {
            Action::Apply(_) => "apply",
            Action::Delete { .. } => "delete",
            Action::Unchanged => "-",
        }
    }
    decision
        .daemon_sets
        .iter()
        .map(|step| (step.daemon_set.clone(), kind(&step.action), step.why))
        .chain(
            decision
                .device_classes
                .iter()
                .map(|step| (step.device_class.clone(), kind(&step.action), step.why)),
        )
        .collect()
}

#[test]
fn decisions_follow_the_table() {
    let v1 = module("v1");
    let v2 = module("v2");
    let unversioned = module("");
    let without = module_with("v1", Value::Null);
    let mut being_deleted = module("v1");
    Arc::make_mut(&mut being_deleted.object)
        .metadata
        .deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    let ours = live_class("my-device-class", Some(("kmm-demo", "my-kmod")), json!({}));
    let wanted_class = {
        let wanted = device_class(
            &key(),
            &v1.object.spec.dra.as_ref().unwrap().device_classes[0],
        );
        let mut value = serde_json::to_value(&wanted).unwrap();
        value["metadata"]["uid"] = json!("uid-my-device-class");
        value["metadata"]["resourceVersion"] = json!("7");
        serde_json::from_value::<DeviceClass>(value).unwrap()
    };
    let stale = live_class("old-class", Some(("kmm-demo", "my-kmod")), json!({}));
    let foreign = live_class("my-device-class", Some(("other", "their-kmod")), json!({}));
    let unlabelled = live_class("my-device-class", None, json!({}));
    let ds_v1 = live(&v1, Some("v1"), (2, 2, 0, 2));
    let ds_v1_idle = live(&v1, Some("v1"), (0, 0, 0, 0));
    let ds_v2 = live(&v2, Some("v2"), (1, 1, 0, 1));
    let none: [&DeviceClass; 0] = [];

    type Row<'a> = (
        &'a str,
        &'a ModuleFacts,
        Vec<&'a DaemonSet>,
        Option<Vec<&'a DeviceClass>>,
        Vec<(&'a str, &'static str, Why)>,
    );
    let rows: Vec<Row> = vec![
        (
            "a new Module gets its DaemonSet and DeviceClass",
            &v1,
            vec![],
            Some(vec![]),
            vec![
                ("my-kmod-dra-v1", "apply", Why::Missing),
                ("my-device-class", "apply", Why::Missing),
            ],
        ),
        (
            "without a version, the DaemonSet has none in its name",
            &unversioned,
            vec![],
            None,
            vec![("my-kmod-dra", "apply", Why::Missing)],
        ),
        (
            "everything as wanted",
            &v1,
            vec![&ds_v1],
            Some(vec![&wanted_class]),
            vec![
                ("my-kmod-dra-v1", "-", Why::UpToDate),
                ("my-device-class", "-", Why::UpToDate),
            ],
        ),
        (
            "a DeviceClass that drifted is applied again",
            &v1,
            vec![&ds_v1],
            Some(vec![&ours]),
            vec![
                ("my-kmod-dra-v1", "-", Why::UpToDate),
                ("my-device-class", "apply", Why::OutOfDate),
            ],
        ),
        (
            "a DeviceClass no longer listed goes",
            &v1,
            vec![&ds_v1],
            Some(vec![&wanted_class, &stale]),
            vec![
                ("my-kmod-dra-v1", "-", Why::UpToDate),
                ("my-device-class", "-", Why::UpToDate),
                ("old-class", "delete", Why::NotListed),
            ],
        ),
        (
            "another Module's DeviceClass is left alone",
            &v1,
            vec![&ds_v1],
            Some(vec![&foreign]),
            vec![
                ("my-kmod-dra-v1", "-", Why::UpToDate),
                ("my-device-class", "-", Why::OtherModule),
            ],
        ),
        (
            "an unlabelled DeviceClass is adopted, as upstream",
            &v1,
            vec![&ds_v1],
            Some(vec![&unlabelled]),
            vec![
                ("my-kmod-dra-v1", "-", Why::UpToDate),
                ("my-device-class", "apply", Why::OutOfDate),
            ],
        ),
        (
            "a cluster without DeviceClasses: DaemonSets only",
            &v1,
            vec![&ds_v1],
            None,
            vec![("my-kmod-dra-v1", "-", Why::UpToDate)],
        ),
        (
            "v1 -> v2: the new version's DaemonSet, the old one kept while in use",
            &v2,
            vec![&ds_v1],
            Some(vec![]),
            vec![
                ("my-kmod-dra-v2", "apply", Why::Missing),
                ("my-kmod-dra-v1", "-", Why::OldVersionInUse),
                ("my-device-class", "apply", Why::Missing),
            ],
        ),
        (
            "v1 -> v2: the old version's DaemonSet goes once it schedules nothing",
            &v2,
            vec![&ds_v1_idle, &ds_v2],
            Some(vec![&wanted_class]),
            vec![
                ("my-kmod-dra-v2", "-", Why::UpToDate),
                ("my-kmod-dra-v1", "delete", Why::OldVersionIdle),
                ("my-device-class", "-", Why::UpToDate),
            ],
        ),
        (
            "spec.dra removed: DaemonSets and DeviceClasses go",
            &without,
            vec![&ds_v1],
            Some(vec![&wanted_class, &foreign]),
            vec![
                ("my-kmod-dra-v1", "delete", Why::NoDra),
                ("my-device-class", "delete", Why::NoDra),
            ],
        ),
        (
            "the Module being deleted",
            &being_deleted,
            vec![&ds_v1],
            Some(vec![&wanted_class]),
            vec![
                ("my-kmod-dra-v1", "delete", Why::ModuleDeleted),
                ("my-device-class", "delete", Why::ModuleDeleted),
            ],
        ),
        (
            "spec.dra removed: a DeviceClass of an earlier list goes too",
            &without,
            vec![],
            Some(vec![&stale]),
            vec![("old-class", "delete", Why::NoDra)],
        ),
    ];
    for (what, module, existing, classes, expected) in rows {
        let decision = decide(module, &existing, classes.as_deref()).expect(what);
        let expected: Vec<(String, &str, Why)> = expected
            .into_iter()
            .map(|(name, kind, why)| (name.to_string(), kind, why))
            .collect();
        assert_eq!(summary(&decision), expected, "{what}");
    }
    let going = deleting(ds_v1.clone());
    let decision = decide(&without, &[&going], Some(&none)).unwrap();
    assert_eq!(
        summary(&decision),
        [("my-kmod-dra-v1".to_string(), "-", Why::AlreadyDeleting)]
    );
}

#[test]
fn the_daemon_set_is_upstreams_with_the_selector_kept() {
    let ds = daemon_set(&module("v1"), Some("v1")).unwrap();
    let mut value = serde_json::to_value(&ds).unwrap();
    let annotations = value["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations")
        .unwrap();
    assert!(annotations[APPLIED_DIGEST_ANNOTATION].is_string());
    let labels = json!({
        "kmm.node.kubernetes.io/module.name": "my-kmod",
        "kmm.node.kubernetes.io/role": "dra",
        "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
    });
    assert_eq!(
        value,
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {
                "name": "my-kmod-dra-v1", "namespace": "kmm-demo", "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module", "name": "my-kmod",
                    "uid": UID, "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "initContainers": [{
                            "name": "dra-init", "image": "some.registry/org/my-dra-init:latest",
                            "securityContext": {"privileged": true},
                        }],
                        "containers": [{
                            "name": "dra", "image": "some.registry/org/my-dra-driver:latest",
                            "securityContext": {"privileged": true},
                            "env": [
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                                {"name": "CDI_ROOT", "value": "/var/run/cdi"},
                                {"name": "KUBELET_REGISTRAR_DIRECTORY_PATH", "value": "/var/lib/kubelet/plugins_registry/"},
                                {"name": "KUBELET_PLUGINS_DIRECTORY_PATH", "value": "/var/lib/kubelet/plugins/"},
                                {"name": "HEALTHCHECK_PORT", "value": "51515"},
                                {"name": "MY_DRA_ENV_VAR", "value": "SOME_VALUE"},
                            ],
                            "volumeMounts": [
                                {"name": "kubelet-plugins", "mountPath": "/var/lib/kubelet/plugins/"},
                                {"name": "kubelet-plugins-registry", "mountPath": "/var/lib/kubelet/plugins_registry/"},
                                {"name": "cdi", "mountPath": "/var/run/cdi"},
                                {"name": "dra-extra-volume", "mountPath": "/some/mountPath"},
                            ],
                            "livenessProbe": {
                                "grpc": {"port": 51515, "service": "liveness"},
                                "initialDelaySeconds": 30, "periodSeconds": 10,
                                "timeoutSeconds": 5, "failureThreshold": 3,
                            },
                        }],
                        "priorityClassName": "system-node-critical",
                        "hostNetwork": true,
                        "imagePullSecrets": [{"name": "secret-name"}],
                        "nodeSelector": {
                            "node-role.kubernetes.io/worker": "",
                            "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": "",
                            "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod": "v1",
                        },
                        "serviceAccountName": "sa-dra-driver",
                        "volumes": [
                            {"name": "kubelet-plugins", "hostPath": {"path": "/var/lib/kubelet/plugins/", "type": "DirectoryOrCreate"}},
                            {"name": "kubelet-plugins-registry", "hostPath": {"path": "/var/lib/kubelet/plugins_registry/", "type": "Directory"}},
                            {"name": "cdi", "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}},
                            {"name": "dra-extra-volume", "configMap": {"name": "some-configmap"}},
                        ],
                    },
                },
            },
        })
    );
}

#[test]
fn a_module_without_loader_runs_its_driver_on_its_selector() {
    let object: Module = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": UID},
        "spec": {
            "selector": {"node-role.kubernetes.io/worker": ""},
            "dra": {"driverName": "dra.example.com", "container": {"image": "some.registry/org/my-dra-driver:latest"}},
        },
    }))
    .unwrap();
    let facts = ModuleFacts::from_module(&object).unwrap();
    let ds = daemon_set(&facts, None).unwrap();
    assert_eq!(ds.metadata.name.as_deref(), Some("my-kmod-dra"));
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.node_selector,
        Some(BTreeMap::from([(
            "node-role.kubernetes.io/worker".to_string(),
            String::new()
        )]))
    );
    // driverName is only checked: the driver is not told it.
    assert!(
        !serde_json::to_string(&pod)
            .unwrap()
            .contains("dra.example.com")
    );
}

#[test]
fn a_preset_env_the_user_sets_is_left_to_the_user() {
    let mut dra = docs_dra();
    dra["container"]["env"] = json!([{"name": "HEALTHCHECK_PORT", "value": "6000"}]);
    let ds = daemon_set(&module_with("v1", dra), Some("v1")).unwrap();
    let env = ds.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let named: Vec<(&str, Option<&str>)> = env
        .iter()
        .filter(|var| var.name == "HEALTHCHECK_PORT")
        .map(|var| (var.name.as_str(), var.value.as_deref()))
        .collect();
    assert_eq!(named, [("HEALTHCHECK_PORT", Some("6000"))]);
    assert_eq!(env.len(), 6);
}

#[test]
fn a_volume_taking_a_preset_name_is_refused() {
    let mut dra = docs_dra();
    dra["volumes"] = json!([{"name": "cdi", "emptyDir": {}}]);
    let err = daemon_set(&module_with("v1", dra), Some("v1")).unwrap_err();
    assert!(
        matches!(&err, DraError::PresetConflict { problems, .. } if problems[0].starts_with("spec.dra.volumes[0].name")),
        "{err}"
    );
}

#[test]
fn the_device_class_keeps_its_driver_parameters() {
    let v1 = module("v1");
    let class = device_class(
        &key(),
        &v1.object.spec.dra.as_ref().unwrap().device_classes[0],
    );
    let value = serde_json::to_value(&class).unwrap();
    assert_eq!(
        value["metadata"]["labels"],
        json!({
            "kmm.node.kubernetes.io/module.name": "my-kmod",
            "kmm.node.kubernetes.io/module.namespace": "kmm-demo",
        })
    );
    assert_eq!(
        value["spec"]["config"][0]["opaque"]["parameters"],
        json!({"apiVersion": "dra.example.com/v1", "kind": "MyDeviceConfig", "spec": {"mode": "default"}})
    );
    assert_eq!(
        value["spec"]["selectors"],
        json!([{"cel": {"expression": "device.driver == 'dra.example.com'"}}])
    );
}

#[test]
fn names_follow_the_device_plugins_with_the_dra_suffix() {
    let key = key();
    assert_eq!(daemon_set_name(&key, None), "my-kmod-dra");
    assert_eq!(daemon_set_name(&key, Some("v1.2")), {
        let plugin = device_plugin::daemon_set_name(&key, Some("v1.2"));
        plugin.replace("-device-plugin", "-dra")
    });
    let long = "v".repeat(63);
    let name = daemon_set_name(&key, Some(&long));
    assert!(
        name.starts_with("my-kmod-dra-") && name.len() <= 63,
        "{name}"
    );
}

#[test]
fn status_counts_targeted_nodes_and_the_daemon_sets() {
    let v2 = module("v2");
    let nodes: Vec<NodeFacts> = ["a", "b", "c"]
        .iter()
        .map(|name| NodeFacts {
            name: name.to_string(),
            labels: if *name == "c" {
                BTreeMap::new()
            } else {
                BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), String::new())])
            },
            ..NodeFacts::default()
        })
        .collect();
    let old = live(&module("v1"), Some("v1"), (1, 1, 0, 1));
    let new = live(&v2, Some("v2"), (1, 1, 0, 0));
    assert_eq!(
        dra_status(&v2, &nodes, &[&old, &new]),
        DaemonSetStatus {
            nodes_matching_selector_number: 2,
            desired_number: 2,
            available_number: 1,
        }
    );
    assert_eq!(
        dra_status(&module_with("v2", Value::Null), &nodes, &[&old]),
        DaemonSetStatus::default()
    );
}

#[test]
fn dra_ready_follows_ready_driver_pods() {
    let key = key();
    let label = key.dra_ready_label();
    assert_eq!(label, "kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready");
    let node = |name: &str, labelled: bool| NodeFacts {
        name: name.to_string(),
        labels: if labelled {
            BTreeMap::from([(label.clone(), String::new())])
        } else {
            BTreeMap::new()
        },
        ..NodeFacts::default()
    };
    let pod = |node: &str, ready: bool| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("my-kmod-dra-{node}"), "namespace": "kmm-demo",
                         "labels": {ROLE_LABEL: DRA_ROLE, MODULE_NAME_LABEL: "my-kmod"}},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .unwrap()
    };
    let nodes = [
        node("a", false),
        node("b", true),
        node("c", true),
        node("d", false),
    ];
    let pods = [pod("a", true), pod("b", true), pod("c", false)];
    let pods: Vec<&Pod> = pods.iter().collect();
    let v1 = module("v1");
    assert_eq!(
        ready_labels(&key, Some(&v1), &nodes, &pods),
        [("a".to_string(), true), ("c".to_string(), false)]
    );
    // A Module gone or going takes its labels with it.
    assert_eq!(
        ready_labels(&key, None, &nodes, &pods),
        [("b".to_string(), false), ("c".to_string(), false)]
    );
}

#[test]
fn the_module_hears_of_created_and_deleted_drivers_and_of_device_classes_left() {
    let step = |action: Action<DaemonSet>, why: Why| Step {
        daemon_set: "my-kmod-dra-v1".to_string(),
        action,
        why,
    };
    let apply = || Action::Apply(Box::new(DaemonSet::default()));
    let delete = || Action::Delete {
        uid: None,
        resource_version: None,
    };
    let deleted = |why: &str| {
        Some(Event {
            warning: false,
            reason: "DraDeleted",
            note: format!("deleted DRA driver DaemonSet my-kmod-dra-v1: {why}"),
        })
    };
    let rows = [
        (
            step(apply(), Why::Missing),
            Some(Event {
                warning: false,
                reason: "DraCreated",
                note: "created DRA driver DaemonSet my-kmod-dra-v1".to_string(),
            }),
        ),
        (step(apply(), Why::OutOfDate), None),
        (
            step(delete(), Why::OldVersionIdle),
            deleted("its version runs on no node"),
        ),
        (
            step(delete(), Why::ModuleDeleted),
            deleted("the Module is being deleted"),
        ),
        (step(delete(), Why::NoDra), deleted("the Module has no dra")),
        (
            step(delete(), Why::Duplicate),
            deleted("another runs the same version"),
        ),
        (step(Action::Unchanged, Why::UpToDate), None),
        (step(Action::Unchanged, Why::OldVersionInUse), None),
        (step(Action::Unchanged, Why::AlreadyDeleting), None),
    ];
    for (step, want) in rows {
        assert_eq!(step.event(), want, "{step:?}");
    }

    let class_step = |why: Why| ClassStep {
        device_class: "my-device-class".to_string(),
        action: Action::Unchanged,
        why,
    };
    assert_eq!(
        class_step(Why::OtherModule).event(),
        Some(Event {
            warning: true,
            reason: "DeviceClassConflict",
            note: "DeviceClass my-device-class is managed by another Module; it is left as it is"
                .to_string(),
        })
    );
    for why in [Why::UpToDate, Why::NotListed, Why::AlreadyDeleting] {
        assert_eq!(class_step(why).event(), None, "{why:?}");
    }
}

#[test]
fn device_classes_the_cluster_cannot_hold_are_warned_of_unless_the_module_goes() {
    let warning = Some(Event {
        warning: true,
        reason: "DeviceClassesUnsupported",
        note: "the cluster serves no resource.k8s.io/v1 DeviceClasses (Kubernetes 1.34 and \
               later do); spec.dra.deviceClasses are not created"
            .to_string(),
    });
    let mut no_classes = docs_dra();
    no_classes["deviceClasses"] = json!([]);
    let v1 = module("v1");
    let rows = [
        ("listed, not served -> warned", &v1, None, warning),
        ("listed, served -> nothing", &v1, Some(&[][..]), None),
        (
            "none listed, not served -> nothing",
            &module_with("v1", no_classes),
            None,
            None,
        ),
        (
            "Module being deleted -> nothing",
            &deleting_module(module("v1")),
            None,
            None,
        ),
        (
            "no dra -> nothing",
            &module_with("v1", Value::Null),
            None,
            None,
        ),
    ];
    for (name, module, classes, want) in rows {
        let decision = decide(module, &[], classes).unwrap();
        assert_eq!(decision.unsupported_classes, want, "{name}");
    }
}

#[test]
fn the_status_is_written_when_its_counts_change_and_left_while_the_module_goes() {
    let nodes = [NodeFacts {
        labels: BTreeMap::from([("node-role.kubernetes.io/worker".to_string(), String::new())]),
        ..NodeFacts::default()
    }];
    let v1 = module("v1");
    let ds = live(&v1, Some("v1"), (1, 1, 0, 1));
    let counts = DaemonSetStatus {
        nodes_matching_selector_number: 1,
        desired_number: 1,
        available_number: 1,
    };
    let behind = DaemonSetStatus::default();
    let rows = [
        (
            "counts changed -> written",
            &v1,
            &behind,
            StatusStep::Write(counts.clone()),
        ),
        (
            "counts as the status says -> no write",
            &v1,
            &counts,
            StatusStep::Unchanged,
        ),
        (
            "Module being deleted -> left",
            &deleting_module(module("v1")),
            &behind,
            StatusStep::ModuleDeleted,
        ),
    ];
    for (name, module, current, want) in rows {
        assert_eq!(status_step(module, current, &nodes, &[&ds]), want, "{name}");
    }
}

fn deleting_module(mut module: ModuleFacts) -> ModuleFacts {
    Arc::make_mut(&mut module.object)
        .metadata
        .deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    module
}

#[test]
fn dra_ready_changes_come_in_node_name_order_whatever_the_cache_order() {
    let key = key();
    let labelled = |name: &str| NodeFacts {
        name: name.to_string(),
        labels: BTreeMap::from([(key.dra_ready_label(), String::new())]),
        ..NodeFacts::default()
    };
    let nodes = [
        labelled("worker-3"),
        labelled("worker-1"),
        labelled("worker-2"),
    ];
    assert_eq!(
        ready_labels(&key, None, &nodes, &[]),
        [
            ("worker-1".to_string(), false),
            ("worker-2".to_string(), false),
            ("worker-3".to_string(), false),
        ]
    );
}
