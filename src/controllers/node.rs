//! What the KMM controllers know about a node, read once from its `Node` object.
//!
//! The Module -> NMC controller looks only at the labels and the kernel; the NMC controller
//! also at readiness, the boot ID and whether worker pods of a module may run there.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint, Toleration};

use capstan_api::labels::{
    MACHINE_CONFIG_STATE_WORKING, UNSCHEDULABLE_TAINT, UPGRADE_STATE_ANNOTATION,
};

/// The facts about one node that the KMM controllers decide on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// `metadata.name`, which is also the name of the node's NodeModulesConfig.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `status.nodeInfo.kernelVersion` without the trailing `+` some kernels report, as
    /// kernel mappings and NMC entries spell it.
    pub kernel_version: String,
    /// `status.nodeInfo.bootID`, new on every boot.
    pub boot_id: String,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// When the `Ready` condition last changed status.
    pub ready_since: Option<Timestamp>,
    /// `spec.unschedulable`: the node is cordoned (but for capstan's own cordon of a node
    /// marked upgrading, see [`NodeFacts::from_node`]).
    pub unschedulable: bool,
    /// `spec.taints` (without capstan's own cordon of a node marked upgrading).
    pub taints: Vec<Taint>,
}

impl NodeFacts {
    /// Reads the facts from a `Node`; missing fields read as empty (not Ready, no labels).
    pub fn from_node(node: &Node) -> NodeFacts {
        let status = node.status.as_ref();
        let info = status.and_then(|status| status.node_info.as_ref());
        let ready = status
            .and_then(|status| status.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"));
        let spec = node.spec.as_ref();
        // The cordon capstan puts on a node it drains for its kmod steps is there for the
        // node's workloads, not for capstan's own worker pods: on a node marked upgrading
        // it counts as no cordon, or the steps it was put for could never run.
        let upgrading = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(UPGRADE_STATE_ANNOTATION))
            .is_some_and(|state| state == MACHINE_CONFIG_STATE_WORKING);
        let taints = spec
            .and_then(|spec| spec.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|taint| !(upgrading && taint.key == UNSCHEDULABLE_TAINT))
            .collect();
        NodeFacts {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            kernel_version: info
                .map(|info| running_kernel(&info.kernel_version).to_string())
                .unwrap_or_default(),
            boot_id: info.map(|info| info.boot_id.clone()).unwrap_or_default(),
            ready: ready.is_some_and(|condition| condition.status == "True"),
            ready_since: ready
                .and_then(|condition| condition.last_transition_time.as_ref())
                .map(|time| time.0),
            unschedulable: !upgrading && spec.and_then(|spec| spec.unschedulable).unwrap_or(false),
            taints,
        }
    }

    /// True when the node carries every label of `selector` with the same value. An empty
    /// selector targets every node.
    pub fn matches(&self, selector: &BTreeMap<String, String>) -> bool {
        labels_match(&self.labels, selector)
    }

    /// True when a Module with `tolerations` targets this node, as upstream KMM's
    /// `GetSchedulableNodesBySelector` has it: every `NoSchedule` or `NoExecute` taint is
    /// tolerated, but for the cordon's (`node.kubernetes.io/unschedulable`), so that
    /// cordoning or draining a node never unloads its modules.
    pub fn targetable(&self, tolerations: &[Toleration]) -> bool {
        self.taints
            .iter()
            .filter(|taint| taint.key != UNSCHEDULABLE_TAINT)
            .filter(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute"))
            .all(|taint| tolerations.iter().any(|t| toleration_matches(t, taint)))
    }

    /// True when pods with `tolerations` may be placed here: every `NoSchedule` or
    /// `NoExecute` taint is tolerated, and a cordon counts as the
    /// `node.kubernetes.io/unschedulable:NoSchedule` taint.
    pub fn tolerates(&self, tolerations: &[Toleration]) -> bool {
        let cordon = self.unschedulable.then(|| Taint {
            key: UNSCHEDULABLE_TAINT.to_string(),
            effect: "NoSchedule".to_string(),
            ..Taint::default()
        });
        self.taints
            .iter()
            .chain(cordon.as_ref())
            .filter(|taint| matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute"))
            .all(|taint| tolerations.iter().any(|t| toleration_matches(t, taint)))
    }
}

/// The kernel version as KMM compares it: the reported one without a trailing `+`.
pub fn running_kernel(reported: &str) -> &str {
    reported.strip_suffix('+').unwrap_or(reported)
}

/// Kubernetes' `Toleration.ToleratesTaint`: same effect (or none given), same key (or none
/// given), and `Exists`, or `Equal` (the default) with the same value.
fn toleration_matches(toleration: &Toleration, taint: &Taint) -> bool {
    if given(&toleration.effect).is_some_and(|effect| effect != taint.effect) {
        return false;
    }
    if given(&toleration.key).is_some_and(|key| key != taint.key) {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// A toleration field that is set and not empty.
fn given(field: &Option<String>) -> Option<&str> {
    field.as_deref().filter(|value| !value.is_empty())
}

/// True when `labels` hold every label of `selector` with the same value. An empty
/// selector matches everything.
pub fn labels_match(
    labels: &BTreeMap<String, String>,
    selector: &BTreeMap<String, String>,
) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint {
            key: key.to_string(),
            value: Some(value.to_string()).filter(|v| !v.is_empty()),
            effect: effect.to_string(),
            ..Taint::default()
        }
    }

    fn toleration(key: &str, operator: &str, value: &str, effect: &str) -> Toleration {
        let given = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
        Toleration {
            key: given(key),
            operator: given(operator),
            value: given(value),
            effect: given(effect),
            ..Toleration::default()
        }
    }

    #[test]
    fn facts_are_read_from_the_node() {
        let since: Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        let node = Node {
            metadata: kube::api::ObjectMeta {
                name: Some("node-1".to_string()),
                labels: Some(BTreeMap::from([("role".to_string(), "gpu".to_string())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                taints: Some(vec![taint("gpu", "", "NoSchedule")]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                node_info: Some(NodeSystemInfo {
                    kernel_version: "6.0.15-300.fc37.x86_64+".to_string(),
                    boot_id: "boot-1".to_string(),
                    ..NodeSystemInfo::default()
                }),
                conditions: Some(vec![
                    NodeCondition {
                        type_: "MemoryPressure".to_string(),
                        status: "False".to_string(),
                        ..NodeCondition::default()
                    },
                    NodeCondition {
                        type_: "Ready".to_string(),
                        status: "True".to_string(),
                        last_transition_time: Some(Time(since)),
                        ..NodeCondition::default()
                    },
                ]),
                ..NodeStatus::default()
            }),
        };
        let facts = NodeFacts::from_node(&node);
        assert_eq!(facts.name, "node-1");
        assert_eq!(facts.kernel_version, "6.0.15-300.fc37.x86_64");
        assert_eq!(facts.boot_id, "boot-1");
        assert!(facts.ready);
        assert_eq!(facts.ready_since, Some(since));
        assert!(facts.unschedulable);
        assert_eq!(facts.taints.len(), 1);
        assert_eq!(facts.labels["role"], "gpu");
    }

    #[test]
    fn an_empty_node_is_not_ready() {
        let facts = NodeFacts::from_node(&Node::default());
        assert!(!facts.ready);
        assert_eq!(facts.ready_since, None);
        assert_eq!(facts.kernel_version, "");
    }

    #[test]
    fn selector_needs_every_label_with_its_value() {
        let node = NodeFacts {
            labels: BTreeMap::from([
                ("role".to_string(), "gpu".to_string()),
                ("zone".to_string(), "a".to_string()),
            ]),
            ..NodeFacts::default()
        };
        let selector = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let cases = [
            ("empty selector targets every node", selector(&[]), true),
            ("one matching label", selector(&[("role", "gpu")]), true),
            (
                "all labels match",
                selector(&[("role", "gpu"), ("zone", "a")]),
                true,
            ),
            ("value differs", selector(&[("role", "cpu")]), false),
            ("label missing", selector(&[("rack", "1")]), false),
        ];
        for (name, selector, want) in cases {
            assert_eq!(node.matches(&selector), want, "{name}");
        }
    }

    #[test]
    fn taints_and_tolerations() {
        let cases = [
            // (name, taints, unschedulable, tolerations, tolerated)
            ("no taints", vec![], false, vec![], true),
            (
                "PreferNoSchedule never blocks",
                vec![taint("gpu", "", "PreferNoSchedule")],
                false,
                vec![],
                true,
            ),
            (
                "NoSchedule blocks without a toleration",
                vec![taint("gpu", "", "NoSchedule")],
                false,
                vec![],
                false,
            ),
            (
                "NoExecute blocks without a toleration",
                vec![taint("gpu", "", "NoExecute")],
                false,
                vec![],
                false,
            ),
            (
                "Exists on the key tolerates any value",
                vec![taint("gpu", "a100", "NoSchedule")],
                false,
                vec![toleration("gpu", "Exists", "", "")],
                true,
            ),
            (
                "Equal needs the same value",
                vec![taint("gpu", "a100", "NoSchedule")],
                false,
                vec![toleration("gpu", "Equal", "h100", "NoSchedule")],
                false,
            ),
            (
                "Equal is the default operator",
                vec![taint("gpu", "a100", "NoSchedule")],
                false,
                vec![toleration("gpu", "", "a100", "")],
                true,
            ),
            (
                "another effect does not tolerate",
                vec![taint("gpu", "", "NoSchedule")],
                false,
                vec![toleration("gpu", "Exists", "", "NoExecute")],
                false,
            ),
            (
                "empty key with Exists tolerates everything",
                vec![taint("gpu", "", "NoSchedule"), taint("x", "", "NoExecute")],
                false,
                vec![toleration("", "Exists", "", "")],
                true,
            ),
            ("a cordon blocks", vec![], true, vec![], false),
            (
                "a cordon is tolerated like its taint",
                vec![],
                true,
                vec![toleration(UNSCHEDULABLE_TAINT, "Exists", "", "NoSchedule")],
                true,
            ),
        ];
        for (name, taints, unschedulable, tolerations, want) in cases {
            let node = NodeFacts {
                taints,
                unschedulable,
                ..NodeFacts::default()
            };
            assert_eq!(node.tolerates(&tolerations), want, "{name}");
        }
    }
}
