//! Whether a pod may run on a node, as the scheduler's filter plugins and the DaemonSet
//! controller decide it upstream: the requested node name, cordoned nodes, `nodeSelector`,
//! required node affinity, and taints against tolerations.
//!
//! Everything here is a pure function of the pod spec and the node object.

use serde_json::{Map, Value, json};

use crate::pointer::Pointer;

/// Upstream's plugin name for a pod that asks for another node (`spec.nodeName`).
pub const NODE_NAME: &str = "NodeName";
/// Upstream's plugin name for a cordoned node the pod does not tolerate.
pub const NODE_UNSCHEDULABLE: &str = "NodeUnschedulable";
/// Upstream's plugin name for `nodeSelector` and required node affinity.
pub const NODE_AFFINITY: &str = "NodeAffinity";
/// Upstream's plugin name for a `NoSchedule`/`NoExecute` taint the pod does not tolerate.
pub const TAINT_TOLERATION: &str = "TaintToleration";

/// The taint a cordoned node has (and that `spec.unschedulable` stands for).
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Why a pod does not fit a node: the upstream filter plugin that rejects it, and the
/// message the scheduler would put in its `FailedScheduling` event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Unfit {
    /// One of [`NODE_NAME`], [`NODE_UNSCHEDULABLE`], [`NODE_AFFINITY`], [`TAINT_TOLERATION`].
    pub reason: &'static str,
    pub message: String,
}

/// Whether a pod with `pod_spec` may be placed on `node`: the checks upstream's scheduler
/// runs as filters (NodeName, NodeUnschedulable, NodeAffinity, TaintToleration), in that
/// order. `NoSchedule` and `NoExecute` taints must be tolerated; `PreferNoSchedule` is a
/// preference and never rejects.
///
/// Fails with the first check that rejects the pod.
pub fn fits(pod_spec: &Value, node: &Value) -> Result<(), Unfit> {
    check_node_name(pod_spec, node)?;
    let cordoned = node
        .at("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if cordoned && !tolerates_unschedulable(pod_spec) {
        return Err(Unfit {
            reason: NODE_UNSCHEDULABLE,
            message: "node(s) were unschedulable".into(),
        });
    }
    check_node_affinity(pod_spec, node)?;
    check_taints(pod_spec, node, &["NoSchedule", "NoExecute"])
}

/// Whether the kubelet of `node` admits a pod bound to it (upstream kubelet admission,
/// `generalFilter`): the node name, `nodeSelector` and required affinity must match, and
/// `NoExecute` taints be tolerated. `NoSchedule` taints and cordons bind only the
/// scheduler, so a pod bound directly is admitted despite them.
///
/// Fails with the first check that rejects the pod.
pub fn admits(pod_spec: &Value, node: &Value) -> Result<(), Unfit> {
    check_node_name(pod_spec, node)?;
    check_node_affinity(pod_spec, node)?;
    check_taints(pod_spec, node, &["NoExecute"])
}

/// Whether the pod tolerates the `NoSchedule` taint of a cordoned node
/// (`node.kubernetes.io/unschedulable`).
pub fn tolerates_unschedulable(pod_spec: &Value) -> bool {
    let cordon_taint = json!({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"});
    tolerates(tolerations_of(pod_spec), &cordon_taint)
}

fn check_node_name(pod_spec: &Value, node: &Value) -> Result<(), Unfit> {
    match str_at(pod_spec, "nodeName") {
        Some(wanted) if !wanted.is_empty() && wanted != name_of(node) => Err(Unfit {
            reason: NODE_NAME,
            message: "node(s) didn't match the requested node name".into(),
        }),
        _ => Ok(()),
    }
}

fn check_node_affinity(pod_spec: &Value, node: &Value) -> Result<(), Unfit> {
    if matches_node_selector(pod_spec, node) {
        Ok(())
    } else {
        Err(Unfit {
            reason: NODE_AFFINITY,
            message: "node(s) didn't match Pod's node affinity/selector".into(),
        })
    }
}

fn check_taints(pod_spec: &Value, node: &Value, effects: &[&str]) -> Result<(), Unfit> {
    match untolerated_taint(taints_of(node), tolerations_of(pod_spec), effects) {
        None => Ok(()),
        Some(taint) => Err(Unfit {
            reason: TAINT_TOLERATION,
            message: format!(
                "node(s) had untolerated taint {{{}: {}}}",
                str_at(taint, "key").unwrap_or(""),
                str_at(taint, "value").unwrap_or("")
            ),
        }),
    }
}

/// Whether the node's labels and name satisfy the pod's `nodeSelector` (every pair, exactly)
/// and its required node affinity (any of the `nodeSelectorTerms`).
pub fn matches_node_selector(pod_spec: &Value, node: &Value) -> bool {
    let empty = Map::new();
    let labels = node
        .at("/metadata/labels")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let selector_matches = pod_spec
        .get("nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|selector| {
            selector
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
        });
    if !selector_matches {
        return false;
    }
    match pod_spec.at("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution") {
        None | Some(Value::Null) => true,
        Some(required) => required
            .get("nodeSelectorTerms")
            .and_then(Value::as_array)
            .is_some_and(|terms| {
                terms
                    .iter()
                    .any(|term| term_matches(term, labels, name_of(node)))
            }),
    }
}

/// One `nodeSelectorTerm`: all its expressions and fields must match; a term with neither
/// matches no node (upstream).
fn term_matches(term: &Value, labels: &Map<String, Value>, node_name: &str) -> bool {
    let expressions = term
        .get("matchExpressions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let fields = term
        .get("matchFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions
        .iter()
        .all(|e| label_requirement_matches(e, labels))
        && fields
            .iter()
            .all(|f| field_requirement_matches(f, node_name))
}

fn label_requirement_matches(requirement: &Value, labels: &Map<String, Value>) -> bool {
    let key = str_at(requirement, "key").unwrap_or("");
    let values = values_of(requirement);
    let label = labels.get(key).and_then(Value::as_str);
    match str_at(requirement, "operator").unwrap_or("") {
        "In" => label.is_some_and(|l| values.contains(&l)),
        "NotIn" => label.is_none_or(|l| !values.contains(&l)),
        "Exists" => label.is_some(),
        "DoesNotExist" => label.is_none(),
        operator @ ("Gt" | "Lt") => {
            // Both sides must be integers and exactly one value given, or nothing matches.
            let (Some(label), [bound]) = (label, values.as_slice()) else {
                return false;
            };
            match (label.parse::<i64>(), bound.parse::<i64>()) {
                (Ok(label), Ok(bound)) if operator == "Gt" => label > bound,
                (Ok(label), Ok(bound)) => label < bound,
                _ => false,
            }
        }
        _ => false,
    }
}

/// `matchFields` supports only `metadata.name` with `In`/`NotIn`.
fn field_requirement_matches(requirement: &Value, node_name: &str) -> bool {
    if str_at(requirement, "key") != Some("metadata.name") {
        return false;
    }
    let values = values_of(requirement);
    match str_at(requirement, "operator").unwrap_or("") {
        "In" => values.contains(&node_name),
        "NotIn" => !values.contains(&node_name),
        _ => false,
    }
}

/// Whether any of `tolerations` tolerates `taint`: same effect (or none given), same key
/// (or none given), and `Exists`, or `Equal` (the default) with the same value.
pub fn tolerates(tolerations: &[Value], taint: &Value) -> bool {
    tolerations.iter().any(|t| toleration_matches(t, taint))
}

fn toleration_matches(toleration: &Value, taint: &Value) -> bool {
    let field = |v: &Value, f: &str| str_at(v, f).unwrap_or("").to_string();
    let effect = field(toleration, "effect");
    if !effect.is_empty() && effect != field(taint, "effect") {
        return false;
    }
    let key = field(toleration, "key");
    if !key.is_empty() && key != field(taint, "key") {
        return false;
    }
    match field(toleration, "operator").as_str() {
        "" | "Equal" => field(toleration, "value") == field(taint, "value"),
        "Exists" => true,
        _ => false,
    }
}

/// The first of `taints` with one of `effects` that no toleration tolerates.
pub fn untolerated_taint<'a>(
    taints: &'a [Value],
    tolerations: &[Value],
    effects: &[&str],
) -> Option<&'a Value> {
    taints.iter().find(|taint| {
        effects.contains(&str_at(taint, "effect").unwrap_or("")) && !tolerates(tolerations, taint)
    })
}

/// The tolerations the DaemonSet controller gives every daemon pod upstream, so daemons
/// keep running on nodes that are not ready, under pressure or cordoned;
/// `network-unavailable` only for pods on the host network.
pub fn daemon_set_tolerations(host_network: bool) -> Vec<Value> {
    let mut tolerations: Vec<Value> = [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        (UNSCHEDULABLE_TAINT, "NoSchedule"),
    ]
    .into_iter()
    .map(|(key, effect)| json!({"key": key, "operator": "Exists", "effect": effect}))
    .collect();
    if host_network {
        tolerations.push(json!({"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"}));
    }
    tolerations
}

/// Adds `tolerations` to a pod spec as upstream's `AddOrUpdateTolerationInPodSpec` does: one
/// with the same key, operator, value and effect is replaced, any other is appended.
pub fn add_tolerations(pod_spec: &mut Value, tolerations: &[Value]) {
    let Some(spec) = pod_spec.as_object_mut() else {
        return;
    };
    let list = spec.entry("tolerations").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    let Some(list) = list.as_array_mut() else {
        return;
    };
    let identity = |t: &Value| {
        ["key", "operator", "value", "effect"].map(|f| str_at(t, f).unwrap_or("").to_string())
    };
    for toleration in tolerations {
        let wanted = identity(toleration);
        match list.iter_mut().find(|t| identity(t) == wanted) {
            Some(existing) => *existing = toleration.clone(),
            None => list.push(toleration.clone()),
        }
    }
}

/// `spec.taints` of a node.
pub fn taints_of(node: &Value) -> &[Value] {
    node.at("/spec/taints")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// `tolerations` of a pod spec.
pub fn tolerations_of(pod_spec: &Value) -> &[Value] {
    pod_spec
        .get("tolerations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn name_of(node: &Value) -> &str {
    node.at("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn str_at<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field).and_then(Value::as_str)
}

fn values_of(requirement: &Value) -> Vec<&str> {
    requirement
        .get("values")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(labels: Value, spec: Value) -> Value {
        json!({"metadata": {"name": "worker-1", "labels": labels}, "spec": spec})
    }

    fn affinity(terms: Value) -> Value {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}})
    }

    fn reason(pod_spec: &Value, node: &Value) -> Option<&'static str> {
        fits(pod_spec, node).err().map(|u| u.reason)
    }

    #[test]
    fn node_selector_needs_every_label_exactly() {
        let worker = node(json!({"role": "worker", "zone": "a"}), json!({}));
        let cases = [
            (json!({}), None),
            (json!({"nodeSelector": {}}), None),
            (json!({"nodeSelector": {"role": "worker"}}), None),
            (
                json!({"nodeSelector": {"role": "worker", "zone": "a"}}),
                None,
            ),
            (
                json!({"nodeSelector": {"role": "worker", "zone": "b"}}),
                Some(NODE_AFFINITY),
            ),
            (
                json!({"nodeSelector": {"gpu": "true"}}),
                Some(NODE_AFFINITY),
            ),
        ];
        for (spec, expected) in cases {
            assert_eq!(reason(&spec, &worker), expected, "{spec}");
        }
    }

    #[test]
    fn affinity_expressions_by_operator() {
        let worker = node(json!({"role": "worker", "cores": "8"}), json!({}));
        let expression = |key: &str, operator: &str, values: Value| {
            affinity(
                json!([{"matchExpressions": [{"key": key, "operator": operator, "values": values}]}]),
            )
        };
        let cases = [
            ("role", "In", json!(["worker", "infra"]), true),
            ("role", "In", json!(["infra"]), false),
            ("gpu", "In", json!(["true"]), false),
            ("role", "NotIn", json!(["infra"]), true),
            ("role", "NotIn", json!(["worker"]), false),
            ("gpu", "NotIn", json!(["true"]), true),
            ("role", "Exists", json!(null), true),
            ("gpu", "Exists", json!(null), false),
            ("gpu", "DoesNotExist", json!(null), true),
            ("role", "DoesNotExist", json!(null), false),
            ("cores", "Gt", json!(["4"]), true),
            ("cores", "Gt", json!(["8"]), false),
            ("cores", "Lt", json!(["16"]), true),
            ("cores", "Lt", json!(["2"]), false),
            ("role", "Gt", json!(["1"]), false),
            ("cores", "Gt", json!(["1", "2"]), false),
            ("gpu", "Lt", json!(["1"]), false),
            ("role", "Near", json!(["worker"]), false),
        ];
        for (key, operator, values, fit) in cases {
            let spec = expression(key, operator, values.clone());
            assert_eq!(
                fits(&spec, &worker).is_ok(),
                fit,
                "{key} {operator} {values}"
            );
        }
    }

    #[test]
    fn affinity_terms_are_ored_and_their_requirements_anded() {
        let worker = node(json!({"role": "worker", "zone": "a"}), json!({}));
        let role = json!({"key": "role", "operator": "In", "values": ["worker"]});
        let zone_b = json!({"key": "zone", "operator": "In", "values": ["b"]});
        let cases = [
            (json!([{"matchExpressions": [role, zone_b]}]), false),
            (
                json!([{"matchExpressions": [zone_b]}, {"matchExpressions": [role]}]),
                true,
            ),
            // An empty term selects nothing; no terms select nothing.
            (json!([{}]), false),
            (json!([]), false),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-1"]}]}]),
                true,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-2"]}]}]),
                false,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["worker-2"]}]}]),
                true,
            ),
            (
                json!([{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["worker-1"]}]}]),
                false,
            ),
            (
                json!([{"matchExpressions": [role], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["worker-2"]}]}]),
                false,
            ),
        ];
        for (terms, fit) in cases {
            assert_eq!(
                fits(&affinity(terms.clone()), &worker).is_ok(),
                fit,
                "{terms}"
            );
        }
    }

    #[test]
    fn node_selector_and_affinity_must_both_match() {
        let worker = node(json!({"role": "worker"}), json!({}));
        let mut spec =
            affinity(json!([{"matchExpressions": [{"key": "role", "operator": "Exists"}]}]));
        spec["nodeSelector"] = json!({"zone": "a"});
        assert_eq!(reason(&spec, &worker), Some(NODE_AFFINITY));
    }

    #[test]
    fn tolerations_against_taints() {
        let taint = json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"});
        let cases = [
            (
                json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
                true,
            ),
            (json!({"key": "dedicated", "value": "gpu"}), true),
            (json!({"key": "dedicated", "value": "cpu"}), false),
            (json!({"key": "dedicated", "operator": "Exists"}), true),
            (
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
                false,
            ),
            (json!({"key": "other", "operator": "Exists"}), false),
            (json!({"operator": "Exists"}), true),
            (json!({"operator": "Exists", "effect": "NoSchedule"}), true),
            (
                json!({"key": "dedicated", "operator": "Lt", "value": "gpu"}),
                false,
            ),
        ];
        for (toleration, tolerated) in cases {
            assert_eq!(
                tolerates(std::slice::from_ref(&toleration), &taint),
                tolerated,
                "{toleration}"
            );
        }
        assert!(!tolerates(&[], &taint));
    }

    #[test]
    fn only_no_schedule_and_no_execute_taints_reject() {
        let cases = [
            ("NoSchedule", Some(TAINT_TOLERATION)),
            ("NoExecute", Some(TAINT_TOLERATION)),
            ("PreferNoSchedule", None),
        ];
        for (effect, expected) in cases {
            let tainted = node(
                json!({}),
                json!({"taints": [{"key": "maintenance", "value": "yes", "effect": effect}]}),
            );
            assert_eq!(reason(&json!({}), &tainted), expected, "{effect}");
        }
        let tainted = node(
            json!({}),
            json!({"taints": [{"key": "maintenance", "value": "yes", "effect": "NoExecute"}]}),
        );
        let unfit = fits(&json!({}), &tainted).expect_err("untolerated");
        assert_eq!(
            unfit.message,
            "node(s) had untolerated taint {maintenance: yes}"
        );
        let tolerant = json!({"tolerations": [{"key": "maintenance", "operator": "Exists"}]});
        assert_eq!(reason(&tolerant, &tainted), None);
    }

    #[test]
    fn requested_node_name_and_cordon() {
        let cordoned = node(json!({}), json!({"unschedulable": true}));
        let cases = [
            (json!({"nodeName": "worker-1"}), Some(NODE_UNSCHEDULABLE)),
            (json!({"nodeName": "worker-2"}), Some(NODE_NAME)),
            (json!({}), Some(NODE_UNSCHEDULABLE)),
            (
                json!({"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}),
                None,
            ),
        ];
        for (spec, expected) in cases {
            assert_eq!(reason(&spec, &cordoned), expected, "{spec}");
        }
    }

    #[test]
    fn the_kubelet_admits_despite_no_schedule_taints_and_cordons() {
        let cases = [
            (json!({"unschedulable": true}), json!({}), None),
            (
                json!({"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}),
                json!({}),
                None,
            ),
            (
                json!({"taints": [{"key": "maintenance", "effect": "NoExecute"}]}),
                json!({}),
                Some(TAINT_TOLERATION),
            ),
            (
                json!({}),
                json!({"nodeSelector": {"gpu": "true"}}),
                Some(NODE_AFFINITY),
            ),
            (json!({}), json!({"nodeName": "worker-2"}), Some(NODE_NAME)),
        ];
        for (node_spec, pod_spec, expected) in cases {
            let worker = node(json!({}), node_spec.clone());
            assert_eq!(
                admits(&pod_spec, &worker).err().map(|u| u.reason),
                expected,
                "{node_spec} {pod_spec}"
            );
        }
        assert!(!tolerates_unschedulable(&json!({})));
        assert!(tolerates_unschedulable(
            &json!({"tolerations": [{"operator": "Exists"}]})
        ));
    }

    #[test]
    fn daemon_pods_tolerate_node_conditions_and_cordons() {
        let keys = |tolerations: &[Value]| -> Vec<String> {
            tolerations
                .iter()
                .map(|t| {
                    format!(
                        "{}:{}",
                        t["key"].as_str().unwrap_or(""),
                        t["effect"].as_str().unwrap_or("")
                    )
                })
                .collect()
        };
        assert_eq!(
            keys(&daemon_set_tolerations(false)),
            [
                "node.kubernetes.io/not-ready:NoExecute",
                "node.kubernetes.io/unreachable:NoExecute",
                "node.kubernetes.io/disk-pressure:NoSchedule",
                "node.kubernetes.io/memory-pressure:NoSchedule",
                "node.kubernetes.io/pid-pressure:NoSchedule",
                "node.kubernetes.io/unschedulable:NoSchedule",
            ]
        );
        assert_eq!(
            keys(&daemon_set_tolerations(true))
                .last()
                .map(String::as_str),
            Some("node.kubernetes.io/network-unavailable:NoSchedule")
        );
        let mut spec = json!({"tolerations": daemon_set_tolerations(false)});
        let not_ready = node(
            json!({}),
            json!({"unschedulable": true, "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]}),
        );
        assert_eq!(fits(&spec, &not_ready), Ok(()));
        spec["tolerations"] = json!([]);
        assert!(fits(&spec, &not_ready).is_err());
    }

    #[test]
    fn adding_tolerations_replaces_the_same_one_and_keeps_others() {
        let mut spec = json!({"tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "dedicated", "operator": "Equal", "value": "gpu"},
        ]});
        add_tolerations(&mut spec, &daemon_set_tolerations(false));
        let tolerations = tolerations_of(&spec);
        assert_eq!(tolerations.len(), 7);
        assert_eq!(
            tolerations[0],
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"})
        );
        assert_eq!(tolerations[1]["key"], "dedicated");
        let mut bare = json!({});
        add_tolerations(&mut bare, &daemon_set_tolerations(true));
        assert_eq!(tolerations_of(&bare).len(), 7);
    }
}
