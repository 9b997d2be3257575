//! What the controller reads off the objects: which Modules a node carries, the facts of
//! each (its three labels, `.ready`, its device-plugin and DRA driver pods, the upgrade kept
//! in the node's annotation, the node's stamps), and whether a node holds a slot.
//!
//! A Module's DRA driver runs the version of its version-device-plugin label, as its device
//! plugin does, so its pods count as the device plugin's: the module is not unloaded while
//! one remains on the node (KMM main's guard matches both roles).

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;

use super::{NodeModuleFacts, Progress, VersionLabels};
use crate::controllers::upgrade::stamp_of;
use capstan_api::labels::{
    DRAIN_ANNOTATION, MODULE_NAME_LABEL, ModuleKey, ModuleLabel, UPGRADE_ANNOTATION_PREFIX,
};
use capstan_api::module::Module;

/// The Modules `node` carries version labels or an upgrade annotation of. A
/// `version-module` label alone counts only when its Module exists (`module_exists`): Git
/// may label nodes for a Module it has not created yet.
pub fn module_keys(node: &Node, module_exists: impl Fn(&ModuleKey) -> bool) -> BTreeSet<ModuleKey> {
    let mut keys = BTreeSet::new();
    for label in node.labels().keys() {
        for (kind, key) in ModuleLabel::parse(label) {
            let counts = match kind {
                ModuleLabel::VersionWorkerPod | ModuleLabel::VersionDevicePlugin => true,
                ModuleLabel::VersionModule => module_exists(&key),
                _ => false,
            };
            if counts {
                keys.insert(key);
            }
        }
    }
    keys.extend(
        node.annotations()
            .keys()
            .filter(|key| key.starts_with(UPGRADE_ANNOTATION_PREFIX))
            .filter_map(|key| ModuleKey::from_upgrade_annotation(key)),
    );
    keys
}

/// Whether `node` carries a version label or the upgrade annotation of `key`: a change of
/// the Module concerns it.
pub fn carries(node: &Node, key: &ModuleKey) -> bool {
    let labels = [
        key.version_module_label(),
        key.version_worker_pod_label(),
        key.version_device_plugin_label(),
    ];
    labels.iter().any(|label| node.labels().contains_key(label))
        || node.annotations().contains_key(&key.upgrade_annotation())
}

/// Whether `pod` is a device-plugin or DRA driver pod of `key` on `node` (the caller lists
/// the pods of those roles).
pub fn is_device_plugin_of(pod: &Pod, key: &ModuleKey, node: &str) -> bool {
    pod.namespace().as_deref() == Some(key.namespace())
        && pod.labels().get(MODULE_NAME_LABEL).map(String::as_str) == Some(key.name())
        && pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

/// The facts of `key` on `node`, given its Module (when it exists) and its device-plugin and
/// DRA driver pods on the node (none when the decision at hand does not look at them: the
/// slots).
pub fn facts_of(
    node: &Node,
    key: &ModuleKey,
    module: Option<&Module>,
    device_plugin_pods: &[&Pod],
) -> NodeModuleFacts {
    let labels = node.labels();
    let annotations = node.annotations();
    let running = device_plugin_pods.iter().any(|pod| {
        pod.metadata.deletion_timestamp.is_none()
            && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
    });
    NodeModuleFacts {
        labels: VersionLabels::of(key, labels),
        module_loaded: labels.contains_key(&key.ready_label()),
        loaded_version: labels.get(&key.version_ready_label()).cloned(),
        device_plugin_pod_remains: !device_plugin_pods.is_empty(),
        device_plugin_running: running,
        has_device_plugin: module
            .is_some_and(|module| module.spec.device_plugin.is_some() || module.spec.dra.is_some()),
        progress: annotations
            .get(&key.upgrade_annotation())
            .and_then(|text| Progress::from_annotation(text)),
        stamp: stamp_of(annotations),
        // The policy's, added by the decision.
        guardrails: super::Guardrails::default(),
    }
}

/// Whether an upgrade of some Module runs on `node`, or its campaign drain has not ended
/// (it holds a slot until both end), unless the node gave its slot up.
pub fn holds_slot(node: &Node) -> bool {
    let upgrades: Vec<Progress> = node
        .annotations()
        .iter()
        .filter(|(key, _)| key.starts_with(UPGRADE_ANNOTATION_PREFIX))
        .filter_map(|(_, value)| Progress::from_annotation(value))
        .filter(Progress::upgrading)
        .collect();
    if upgrades.iter().any(|p| p.released_at.is_some()) {
        return false;
    }
    node.annotations().contains_key(DRAIN_ANNOTATION) || !upgrades.is_empty()
}

/// Since when `node`'s Ready condition is not `True`; `None` while it is, or when the node
/// reports no Ready condition (not known to be down).
pub fn not_ready_since(node: &Node) -> Option<Timestamp> {
    let ready = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    ready.last_transition_time.as_ref().map(|time| time.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::upgrade::Stamp;
    use capstan_api::labels::{DRA_ROLE, ROLE_LABEL};
    use capstan_api::labels::{PULL_REQUEST_ANNOTATION, REVISION_ANNOTATION};
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").expect("a key")
    }

    fn node(labels: &[(String, &str)], annotations: &[(String, &str)]) -> Node {
        let map = |pairs: &[(String, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect(),
            )
        };
        Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                labels: map(labels),
                annotations: map(annotations),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    fn pod(phase: &str, deleting: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some("kmm-demo".into()),
                labels: Some([(MODULE_NAME_LABEL.to_string(), "my-kmod".to_string())].into()),
                deletion_timestamp: deleting.then_some(Time(jiff::Timestamp::UNIX_EPOCH)),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some("worker-1".into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn the_modules_a_node_carries() {
        let k = key();
        let started = Progress {
            started_at: Some(jiff::Timestamp::UNIX_EPOCH),
            ..Progress::default()
        }
        .to_annotation();
        // (name, node, Module exists, among its Modules, a Module change concerns it)
        let rows = [
            ("nothing", node(&[], &[]), true, false, false),
            (
                "M of an existing Module",
                node(&[(k.version_module_label(), "v1")], &[]),
                true,
                true,
                true,
            ),
            (
                "M of a Module not created yet",
                node(&[(k.version_module_label(), "v1")], &[]),
                false,
                false,
                true,
            ),
            (
                "W alone",
                node(&[(k.version_worker_pod_label(), "v1")], &[]),
                false,
                true,
                true,
            ),
            (
                "D alone",
                node(&[(k.version_device_plugin_label(), "v1")], &[]),
                false,
                true,
                true,
            ),
            (
                "an upgrade annotation",
                node(&[], &[(k.upgrade_annotation(), &started)]),
                false,
                true,
                true,
            ),
            (
                "only .ready",
                node(&[(k.ready_label(), "")], &[]),
                true,
                false,
                false,
            ),
        ];
        for (name, node, exists, carried, concerned) in rows {
            assert_eq!(
                module_keys(&node, |_| exists).contains(&k),
                carried,
                "{name}"
            );
            assert_eq!(carries(&node, &k), concerned, "{name}");
        }
        assert!(holds_slot(&node(
            &[],
            &[(k.upgrade_annotation(), &started)]
        )));
        let waiting = Progress::default().to_annotation();
        assert!(
            !holds_slot(&node(&[], &[(k.upgrade_annotation(), &waiting)])),
            "waits"
        );
    }

    #[test]
    fn device_plugin_facts_count_every_pod_and_run_on_running_ones() {
        // (name, pods, remains, running)
        let rows = [
            ("no pod", vec![], false, false),
            ("a running pod", vec![pod("Running", false)], true, true),
            ("a pending pod", vec![pod("Pending", false)], true, false),
            ("a terminating pod", vec![pod("Running", true)], true, false),
        ];
        let node = node(&[], &[]);
        for (name, pods, remains, running) in rows {
            let pods: Vec<&Pod> = pods.iter().collect();
            let facts = facts_of(&node, &key(), None, &pods);
            assert_eq!(
                (facts.device_plugin_pod_remains, facts.device_plugin_running),
                (remains, running),
                "{name}"
            );
        }
        let elsewhere = Pod {
            spec: Some(PodSpec {
                node_name: Some("worker-2".into()),
                ..PodSpec::default()
            }),
            ..pod("Running", false)
        };
        assert!(is_device_plugin_of(
            &pod("Running", false),
            &key(),
            "worker-1"
        ));
        assert!(!is_device_plugin_of(&elsewhere, &key(), "worker-1"));
    }

    #[test]
    fn a_dra_driver_counts_as_the_modules_device_plugin() {
        let module = |spec: serde_json::Value| -> Module {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "Module",
                "metadata": {"name": "my-kmod", "namespace": "kmm-demo"},
                "spec": spec,
            }))
            .expect("a Module")
        };
        let container = serde_json::json!({"container": {"image": "registry.example/driver:v1"}});
        let driver = serde_json::json!({
            "driverName": "dra.example.com",
            "container": {"image": "registry.example/driver:v1"},
        });
        // (name, Module, has a device plugin)
        let rows = [
            ("no Module", None, false),
            (
                "neither",
                Some(module(serde_json::json!({"selector": {}}))),
                false,
            ),
            (
                "a device plugin",
                Some(module(
                    serde_json::json!({"selector": {}, "devicePlugin": container}),
                )),
                true,
            ),
            (
                "a DRA driver",
                Some(module(serde_json::json!({"selector": {}, "dra": driver}))),
                true,
            ),
            (
                "both",
                Some(module(
                    serde_json::json!({"selector": {}, "devicePlugin": container, "dra": driver}),
                )),
                true,
            ),
        ];
        for (name, module, has) in rows {
            let facts = facts_of(&node(&[], &[]), &key(), module.as_ref(), &[]);
            assert_eq!(facts.has_device_plugin, has, "{name}");
        }
        // A DRA driver pod on the node holds the unload back as a device-plugin pod does.
        let mut driver = pod("Running", true);
        driver
            .metadata
            .labels
            .get_or_insert_default()
            .insert(ROLE_LABEL.to_string(), DRA_ROLE.to_string());
        assert!(is_device_plugin_of(&driver, &key(), "worker-1"));
        let facts = facts_of(&node(&[], &[]), &key(), None, &[&driver]);
        assert!(facts.device_plugin_pod_remains && !facts.device_plugin_running);
    }

    #[test]
    fn labels_and_stamps_become_facts() {
        let k = key();
        let node = node(
            &[
                (k.version_module_label(), "v2"),
                (k.version_worker_pod_label(), "v1"),
                (k.ready_label(), ""),
                (k.version_ready_label(), "v1"),
            ],
            &[
                (REVISION_ANNOTATION.to_string(), "main@sha1:c2"),
                (PULL_REQUEST_ANNOTATION.to_string(), "42"),
                (k.upgrade_annotation(), "not json"),
            ],
        );
        let facts = facts_of(&node, &k, None, &[]);
        assert_eq!(
            facts,
            NodeModuleFacts {
                labels: VersionLabels {
                    module: Some("v2".into()),
                    worker_pod: Some("v1".into()),
                    device_plugin: None,
                },
                module_loaded: true,
                loaded_version: Some("v1".into()),
                progress: None,
                stamp: Stamp {
                    revision: Some("main@sha1:c2".into()),
                    pull_request: Some(42),
                },
                ..NodeModuleFacts::default()
            }
        );
    }
}
