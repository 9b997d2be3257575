//! Which nodes change Module version, the steps each goes through (seed 002), and the
//! order they go in: by node name, at most `maxNodesInFlight` at a time.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::model::{NodeMove, PlannedStep};
use crate::sync::manifests::{KmmLabel, Manifest, classify, is_node, modules_in};
use capstan_api::capstan::UpgradeStep;
use capstan_api::labels::ModuleKey;

/// Version labels of a set of nodes: the version by node and Module.
pub type VersionLabels = BTreeMap<(String, ModuleKey), String>;

/// The version labels in one node's labels, by Module. `modules` settles keys that read
/// as more than one Module.
pub fn version_labels_in<V>(
    labels: &Map<String, Value>,
    modules: &BTreeMap<ModuleKey, V>,
) -> BTreeMap<ModuleKey, String> {
    labels
        .iter()
        .filter_map(|(key, value)| match classify(key, modules) {
            Some(KmmLabel::Version(module)) => Some((module, value.as_str()?.to_string())),
            _ => None,
        })
        .collect()
}

/// The version labels the Node manifests among `manifests` declare.
pub fn declared_version_labels(manifests: &[Manifest]) -> VersionLabels {
    let modules = modules_in(manifests.iter());
    let mut found = VersionLabels::new();
    for node in manifests.iter().filter(|m| is_node(m)) {
        let Some(labels) = labels_of(&node.object) else {
            continue;
        };
        for (module, version) in version_labels_in(labels, &modules) {
            found.insert((node.name.clone(), module), version);
        }
    }
    found
}

/// `metadata.labels` of an object.
pub fn labels_of(object: &Value) -> Option<&Map<String, Value>> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
}

/// A version label that changes, before it is placed in the rollout.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LabelMove {
    /// The node.
    pub node: String,
    /// The Module.
    pub module: ModuleKey,
    /// The version before (`None`: no label).
    pub from: Option<String>,
    /// The version after (`None`: no label).
    pub to: Option<String>,
}

/// Every (node, Module) whose version label differs between `before` and `after`, by
/// node name, then Module.
pub fn label_moves(before: &VersionLabels, after: &VersionLabels) -> Vec<LabelMove> {
    let keys: BTreeSet<&(String, ModuleKey)> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let (from, to) = (before.get(key), after.get(key));
            (from != to).then(|| LabelMove {
                node: key.0.clone(),
                module: key.1.clone(),
                from: from.cloned(),
                to: to.cloned(),
            })
        })
        .collect()
}

/// The nodes in waves of at most `max_in_flight` (at least 1), in name order.
pub fn waves(nodes: &BTreeSet<String>, max_in_flight: u32) -> Vec<Vec<String>> {
    let size = usize::try_from(max_in_flight.max(1)).unwrap_or(usize::MAX);
    let nodes: Vec<String> = nodes.iter().cloned().collect();
    nodes.chunks(size).map(<[String]>::to_vec).collect()
}

/// The moves placed in the rollout: each with its steps, its node's position in name
/// order and its wave; and the waves.
pub fn rollout(moves: &[LabelMove], max_in_flight: u32) -> (Vec<NodeMove>, Vec<Vec<String>>) {
    let nodes: BTreeSet<String> = moves.iter().map(|m| m.node.clone()).collect();
    let waves = waves(&nodes, max_in_flight);
    let place: BTreeMap<&str, (usize, usize)> = waves
        .iter()
        .enumerate()
        .flat_map(|(wave, names)| names.iter().map(move |name| (name.as_str(), wave + 1)))
        .enumerate()
        .map(|(index, (name, wave))| (name, (index + 1, wave)))
        .collect();
    let placed = moves
        .iter()
        .map(|m| {
            let (order, wave) = place.get(m.node.as_str()).copied().unwrap_or_default();
            NodeMove {
                node: m.node.clone(),
                module: m.module.to_string(),
                from: m.from.clone(),
                to: m.to.clone(),
                steps: planned_steps(&m.module, m.from.as_deref(), m.to.as_deref()),
                order,
                wave,
                campaign: None,
                held_until: None,
                gates: Vec::new(),
                starts_at: None,
                drain: None,
            }
        })
        .collect();
    (placed, waves)
}

/// The steps of one move, each described with the labels capstan's version-label
/// controller changes (seed 002's flow).
pub fn planned_steps(module: &ModuleKey, from: Option<&str>, to: Option<&str>) -> Vec<PlannedStep> {
    let (old, new) = (from.unwrap_or_default(), to.unwrap_or_default());
    let device_plugin = module.version_device_plugin_label();
    let worker_pod = module.version_worker_pod_label();
    UpgradeStep::for_move(from, to)
        .iter()
        .map(|&step| {
            let description = match step {
                UpgradeStep::DevicePluginStopped => format!(
                    "stop the device plugin of {module} {old}: {device_plugin} is removed from \
                     the node, ending its pod"
                ),
                UpgradeStep::OldModuleUnloaded => format!(
                    "unload {module} {old}: once the device plugin is gone, {worker_pod} is \
                     removed and a worker pod unloads the module"
                ),
                UpgradeStep::NewModuleLoaded => format!(
                    "load {module} {new}: {worker_pod}={new} is set and a worker pod loads the \
                     module"
                ),
                UpgradeStep::DevicePluginStarted => format!(
                    "start the device plugin of {module} {new}: once the module is loaded, \
                     {device_plugin}={new} is set"
                ),
            };
            PlannedStep {
                number: step.number(),
                step,
                description,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(name: &str) -> ModuleKey {
        ModuleKey::new("kmm-demo", name).expect("module key")
    }

    fn labels(entries: &[(&str, &str, &str)]) -> VersionLabels {
        entries
            .iter()
            .map(|(node, name, version)| ((node.to_string(), module(name)), version.to_string()))
            .collect()
    }

    fn names(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn waves_hold_at_most_max_nodes_in_flight_in_name_order() {
        type Case = (
            &'static [&'static str],
            u32,
            &'static [&'static [&'static str]],
        );
        let cases: &[Case] = &[
            (&[], 1, &[]),
            (
                &["worker-2", "worker-1"],
                1,
                &[&["worker-1"], &["worker-2"]],
            ),
            (&["c", "a", "b"], 2, &[&["a", "b"], &["c"]]),
            (&["a", "b"], 5, &[&["a", "b"]]),
            // 0 cannot be configured; it is read as 1 rather than stalling the rollout.
            (&["a", "b"], 0, &[&["a"], &["b"]]),
        ];
        for (nodes, max, expected) in cases {
            let expected: Vec<Vec<String>> = expected
                .iter()
                .map(|wave| wave.iter().map(|n| n.to_string()).collect())
                .collect();
            assert_eq!(waves(&names(nodes), *max), expected, "{nodes:?} by {max}");
        }
    }

    #[test]
    fn moves_are_the_labels_that_differ() {
        let before = labels(&[
            ("worker-1", "my-kmod", "v1"),
            ("worker-2", "my-kmod", "v1"),
            ("worker-3", "my-kmod", "v1"),
        ]);
        let after = labels(&[
            ("worker-1", "my-kmod", "v2"),
            ("worker-2", "my-kmod", "v1"),
            ("worker-4", "my-kmod", "v2"),
        ]);
        let moves: Vec<(String, Option<String>, Option<String>)> = label_moves(&before, &after)
            .into_iter()
            .map(|m| (m.node, m.from, m.to))
            .collect();
        let some = |v: &str| Some(v.to_string());
        assert_eq!(
            moves,
            [
                ("worker-1".to_string(), some("v1"), some("v2")),
                ("worker-3".to_string(), some("v1"), None),
                ("worker-4".to_string(), None, some("v2")),
            ]
        );
    }

    #[test]
    fn a_node_keeps_one_place_for_all_its_modules() {
        let before = labels(&[
            ("b", "kmod-a", "v1"),
            ("b", "kmod-b", "v1"),
            ("a", "kmod-a", "v1"),
            ("c", "kmod-a", "v1"),
        ]);
        let after = labels(&[
            ("b", "kmod-a", "v2"),
            ("b", "kmod-b", "v2"),
            ("a", "kmod-a", "v2"),
            ("c", "kmod-a", "v2"),
        ]);
        let (placed, waves) = rollout(&label_moves(&before, &after), 2);
        let places: Vec<(&str, &str, usize, usize)> = placed
            .iter()
            .map(|m| (m.node.as_str(), m.module.as_str(), m.order, m.wave))
            .collect();
        assert_eq!(
            places,
            [
                ("a", "kmm-demo/kmod-a", 1, 1),
                ("b", "kmm-demo/kmod-a", 2, 1),
                ("b", "kmm-demo/kmod-b", 2, 1),
                ("c", "kmm-demo/kmod-a", 3, 2),
            ]
        );
        assert_eq!(waves, [vec!["a", "b"], vec!["c"]]);
    }

    #[test]
    fn steps_follow_seed_002_for_each_kind_of_move() {
        let key = module("my-kmod");
        let cases: &[(Option<&str>, Option<&str>, &[usize])] = &[
            (Some("v1"), Some("v2"), &[1, 2, 3, 4]),
            (None, Some("v2"), &[3, 4]),
            (Some("v1"), None, &[1, 2]),
            (Some("v1"), Some("v1"), &[]),
        ];
        for (from, to, numbers) in cases {
            let steps = planned_steps(&key, *from, *to);
            let found: Vec<usize> = steps.iter().map(|s| s.number).collect();
            assert_eq!(found, *numbers, "{from:?} -> {to:?}");
        }
        let upgrade = planned_steps(&key, Some("v1"), Some("v2"));
        assert!(
            upgrade[0].description.contains(
                "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod is removed"
            ),
            "{}",
            upgrade[0].description
        );
        assert!(
            upgrade[2]
                .description
                .contains("version-worker-pod.kmm-demo.my-kmod=v2"),
            "{}",
            upgrade[2].description
        );
    }

    #[test]
    fn version_labels_are_read_from_node_labels_only() {
        let modules: BTreeMap<ModuleKey, ()> = [(module("my-kmod"), ())].into();
        let node_labels = serde_json::json!({
            "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod": "v1",
            "beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod": "v1",
            "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready": "",
            "node-role.kubernetes.io/worker": "",
        });
        let found = version_labels_in(node_labels.as_object().expect("map"), &modules);
        assert_eq!(found, [(module("my-kmod"), "v1".to_string())].into());
    }
}
