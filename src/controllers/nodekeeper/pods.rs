//! What the nodekeeper, the drain and `capstan plan` see of a pod: MUO's pod predicates
//! (pkg/drain/pod_predicates.go, pkg/pod), `kubectl drain`'s filter ([`evictable`]), and
//! which PodDisruptionBudget protects a pod ([`protected_by_pdb`]).
//!
//! | predicate | true when |
//! | --- | --- |
//! | on the node | `spec.nodeName` is the node |
//! | DaemonSet pod | any owner reference has kind `DaemonSet` (controller or not, as MUO) |
//! | has finalizers | `metadata.finalizers` is not empty |
//! | terminating | `metadata.deletionTimestamp` is set |
//! | ignored namespace | some `ignoredNamespacePatterns` regex matches the namespace anywhere (unanchored, as MUO's `MatchString`) |
//! | PDB pod | a PodDisruptionBudget of the pod's namespace selects it ([`protected_by_pdb`]) |
//!
//! PDB matching is the API server's, not MUO's. MUO lists PDBs cluster-wide and calls a pod
//! a PDB pod when any one `matchLabels` pair of any PDB is among the pod's labels; it
//! ignores the namespace, `matchExpressions` and the other pairs. So a PDB in another
//! namespace makes MUO hold a pod until `PDBForceDrainTimeout` that no budget protects,
//! and a PDB whose `matchExpressions` exclude a pod still holds it. capstan matches as
//! eviction does: a PDB of the pod's namespace whose whole selector (`matchLabels` and
//! `matchExpressions`) matches; a PDB without a selector protects nothing, one with an
//! empty selector (`{}`) every pod of its namespace (policy/v1), one whose selector does
//! not parse nothing. Pods eviction refuses to move are then exactly the pods the
//! PDB strategies wait for.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::core::{Selector, SelectorExt as _};
use regex::Regex;

use capstan_api::labels::{COMPONENT_LABEL, DEVICE_PLUGIN_ROLE, ROLE_LABEL, WORKER_COMPONENT};

/// The annotation the kubelet puts on the API object of a static pod (a mirror pod).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The compiled `nodeDrain.ignoredNamespacePatterns`.
#[derive(Clone, Debug, Default)]
pub struct IgnoredNamespaces(Vec<Regex>);

/// An `ignoredNamespacePatterns` entry that is not a regular expression. The sync refuses
/// such a commit, so this is seen only for a policy written by hand.
#[derive(Debug, thiserror::Error)]
#[error(
    "nodeDrain.ignoredNamespacePatterns[{index}] {pattern:?} is not a regular expression: {source}"
)]
pub struct PatternError {
    /// Where the pattern is in the list.
    pub index: usize,
    /// The pattern.
    pub pattern: String,
    /// Why it does not compile.
    #[source]
    pub source: regex::Error,
}

impl IgnoredNamespaces {
    /// Compiles `patterns`.
    ///
    /// # Errors
    /// The first pattern that does not compile: no strategy runs on a guess of what the
    /// pattern meant to protect.
    pub fn compile(patterns: &[String]) -> Result<IgnoredNamespaces, PatternError> {
        patterns
            .iter()
            .enumerate()
            .map(|(index, pattern)| {
                Regex::new(pattern).map_err(|source| PatternError {
                    index,
                    pattern: pattern.clone(),
                    source,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(IgnoredNamespaces)
    }

    /// Whether some pattern matches `namespace` (anywhere in it).
    pub fn ignores(&self, namespace: &str) -> bool {
        self.0.iter().any(|pattern| pattern.is_match(namespace))
    }
}

/// Whether `pod` is bound to `node`.
pub fn is_on_node(pod: &Pod, node: &str) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.node_name.as_deref())
        .is_some_and(|name| name == node)
}

/// Whether some owner reference of `pod` is a DaemonSet.
pub fn is_daemon_set_pod(pod: &Pod) -> bool {
    pod.owner_references()
        .iter()
        .any(|owner| owner.kind == "DaemonSet")
}

/// Whether `pod` has finalizers.
pub fn has_finalizers(pod: &Pod) -> bool {
    !pod.finalizers().is_empty()
}

/// Whether `pod` is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether `pod` is the API object of a static pod, which only its node's kubelet removes.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.annotations().contains_key(MIRROR_POD_ANNOTATION)
}

/// Whether `pod` is one of capstan's own: a kmod worker or a device plugin.
pub fn is_capstan_pod(pod: &Pod) -> bool {
    let labels = pod.labels();
    labels.get(COMPONENT_LABEL).map(String::as_str) == Some(WORKER_COMPONENT)
        || labels.get(ROLE_LABEL).map(String::as_str) == Some(DEVICE_PLUGIN_ROLE)
}

/// Whether `pod`'s containers have all ended for good (`Succeeded` or `Failed`).
pub fn has_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status
            .as_ref()
            .and_then(|status| status.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether a drain moves `pod` off its node, as `kubectl drain --ignore-daemonsets` picks
/// pods: every pod but a DaemonSet's (its controller would put it back; the cordon's taint
/// is tolerated by every DaemonSet pod), a mirror pod (the API server refuses to evict it),
/// capstan's own kmod workers and device plugins (the upgrade being drained for runs them),
/// and a pod whose containers have all ended (`Succeeded` or `Failed`).
///
/// kubectl deletes ended pods; capstan leaves them: they run nothing that holds the kernel
/// module, and deleting them would lose a Job's record of its run. A pod already being
/// deleted is still moved: the drain waits for it.
pub fn evictable(pod: &Pod) -> bool {
    !is_daemon_set_pod(pod) && !is_mirror_pod(pod) && !is_capstan_pod(pod) && !has_terminated(pod)
}

/// Whether some PodDisruptionBudget of `pod`'s namespace selects it: the budgets eviction
/// checks before it moves the pod. See the module doc for how this differs from MUO.
pub fn protected_by_pdb(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> bool {
    let namespace = pod.namespace();
    pdbs.iter()
        .filter(|pdb| pdb.namespace() == namespace)
        .any(|pdb| selects(pdb, pod))
}

/// Whether `pdb`'s selector matches `pod`'s labels (namespace aside).
fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    let Some(selector) = pdb.spec.as_ref().and_then(|spec| spec.selector.clone()) else {
        return false;
    };
    // A requirement with an unknown operator or without its values: eviction skips the
    // budget, so it protects nothing here either.
    Selector::try_from(selector).is_ok_and(|selector| selector.matches(pod.labels()))
}

/// A pod as a strategy names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID: the pod a strategy acts on, not a later one of the same name.
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What the strategies decide a pod on: the predicates, evaluated once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// The pod.
    pub pod: PodRef,
    /// Bound to the node drained.
    pub on_node: bool,
    /// Owned by a DaemonSet.
    pub daemon_set: bool,
    /// Has finalizers.
    pub finalizers: bool,
    /// Being deleted.
    pub terminating: bool,
    /// In a namespace `ignoredNamespacePatterns` leaves alone.
    pub ignored_namespace: bool,
    /// A PodDisruptionBudget protects it.
    pub pdb: bool,
}

impl PodFacts {
    /// The facts of `pod` for a drain of `node`.
    pub fn of(
        pod: &Pod,
        node: &str,
        pdbs: &[PodDisruptionBudget],
        ignored: &IgnoredNamespaces,
    ) -> PodFacts {
        let namespace = pod.namespace().unwrap_or_default();
        PodFacts {
            on_node: is_on_node(pod, node),
            daemon_set: is_daemon_set_pod(pod),
            finalizers: has_finalizers(pod),
            terminating: is_terminating(pod),
            ignored_namespace: ignored.ignores(&namespace),
            pdb: protected_by_pdb(pod, pdbs),
            pod: PodRef {
                namespace,
                name: pod.name_any(),
                uid: pod.uid().unwrap_or_default(),
            },
        }
    }

    /// What every strategy asks of a pod: on the node, not a DaemonSet's, in a namespace
    /// not ignored (MUO's `isOnNode`, `isNotDaemonSet`, allowed namespace).
    pub fn forceable(&self) -> bool {
        self.on_node && !self.daemon_set && !self.ignored_namespace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    fn pdb(namespace: &str, selector: Value) -> PodDisruptionBudget {
        let mut spec = json!({"minAvailable": 1});
        if !selector.is_null() {
            spec["selector"] = selector;
        }
        serde_json::from_value(json!({
            "metadata": {"name": "budget", "namespace": namespace},
            "spec": spec,
        }))
        .expect("a pdb")
    }

    fn labelled(namespace: &str, labels: Value) -> Pod {
        pod(json!({"metadata": {"name": "p", "namespace": namespace, "labels": labels}}))
    }

    /// MUO's rule: any `matchLabels` pair of any PDB (any namespace) among the pod's labels.
    fn upstream_pdb_pod(pod: &Pod, pdbs: &[PodDisruptionBudget]) -> bool {
        pdbs.iter().any(|pdb| {
            let pairs = pdb
                .spec
                .as_ref()
                .and_then(|spec| spec.selector.as_ref())
                .and_then(|selector| selector.match_labels.clone())
                .unwrap_or_default();
            pairs
                .iter()
                .any(|(key, value)| pod.labels().get(key) == Some(value))
        })
    }

    /// MUO's pod_predicates_test.go PDB cases, and where capstan's matching parts from
    /// MUO's (the `upstream` column).
    #[test]
    fn pdb_matching_table() {
        let app_test = json!({"matchLabels": {"app": "test"}});
        // (case, pod namespace, pod labels, PDBs, protected, upstream)
        type Row<'a> = (
            &'a str,
            &'a str,
            Value,
            Vec<PodDisruptionBudget>,
            bool,
            bool,
        );
        let rows: Vec<Row> = vec![
            (
                "a PDB without a selector protects nothing (and does not panic)",
                "apps",
                json!({"app": "test"}),
                vec![pdb("apps", Value::Null)],
                false,
                false,
            ),
            (
                "matchLabels app=test, pod app=test",
                "apps",
                json!({"app": "test"}),
                vec![pdb("apps", app_test.clone())],
                true,
                true,
            ),
            (
                "matchLabels app=test, pod app=other",
                "apps",
                json!({"app": "other"}),
                vec![pdb("apps", app_test.clone())],
                false,
                false,
            ),
            (
                "a PDB of another namespace protects nothing here (MUO: it does)",
                "apps",
                json!({"app": "test"}),
                vec![pdb("other", app_test.clone())],
                false,
                true,
            ),
            (
                "one pair of two is not a match (MUO: it is)",
                "apps",
                json!({"app": "test"}),
                vec![pdb(
                    "apps",
                    json!({"matchLabels": {"app": "test", "tier": "db"}}),
                )],
                false,
                true,
            ),
            (
                "matchExpressions count: NotIn excludes the pod (MUO: ignored)",
                "apps",
                json!({"app": "test", "tier": "cache"}),
                vec![pdb(
                    "apps",
                    json!({"matchLabels": {"app": "test"},
                           "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cache"]}]}),
                )],
                false,
                true,
            ),
            (
                "matchExpressions alone select (MUO: no pair, no match)",
                "apps",
                json!({"tier": "db"}),
                vec![pdb(
                    "apps",
                    json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["db"]}]}),
                )],
                true,
                false,
            ),
            (
                "an empty selector protects every pod of its namespace (policy/v1)",
                "apps",
                json!({"app": "anything"}),
                vec![pdb("apps", json!({}))],
                true,
                false,
            ),
            (
                "a selector that does not parse protects nothing",
                "apps",
                json!({"tier": "db"}),
                vec![pdb(
                    "apps",
                    json!({"matchExpressions": [{"key": "tier", "operator": "Near", "values": ["db"]}]}),
                )],
                false,
                false,
            ),
            (
                "no PDB at all",
                "apps",
                json!({"app": "test"}),
                vec![],
                false,
                false,
            ),
        ];
        for (case, namespace, labels, pdbs, protected, upstream) in rows {
            let pod = labelled(namespace, labels);
            assert_eq!(protected_by_pdb(&pod, &pdbs), protected, "{case}");
            assert_eq!(
                upstream_pdb_pod(&pod, &pdbs),
                upstream,
                "{case}: MUO's rule"
            );
        }
    }

    /// MUO's osd_drain_strategy_test.go predicate cases: PDBs {app: app1} and
    /// {non-existent-pod-selector: ""}, pods app1, app2, app3.
    #[test]
    fn one_of_three_pods_is_a_pdb_pod() {
        let pdbs = [
            pdb("ns", json!({"matchLabels": {"app": "app1"}})),
            pdb(
                "ns",
                json!({"matchLabels": {"non-existent-pod-selector": ""}}),
            ),
        ];
        let pods: Vec<Pod> = ["app1", "app2", "app3"]
            .iter()
            .map(|app| labelled("ns", json!({"app": app})))
            .collect();
        let pdb_pods = pods.iter().filter(|p| protected_by_pdb(p, &pdbs)).count();
        assert_eq!((pdb_pods, pods.len() - pdb_pods), (1, 2));
    }

    /// MUO's predicate cases for the node, DaemonSets, finalizers and termination.
    #[test]
    fn predicate_table() {
        let on = |node: &str| {
            pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": node, "containers": []}}))
        };
        assert!(is_on_node(&on("n1"), "n1"));
        assert!(!is_on_node(&on("n2"), "n1"));
        assert!(!is_on_node(&pod(json!({"metadata": {"name": "p"}})), "n1"));

        let owned = |kind: &str, controller: bool| {
            pod(json!({"metadata": {"name": "p", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": controller}]}}))
        };
        // (case, pod, DaemonSet pod)
        let owners = [
            (
                "a DaemonSet's controller reference",
                owned("DaemonSet", true),
                true,
            ),
            (
                "a DaemonSet reference that is not the controller",
                owned("DaemonSet", false),
                true,
            ),
            ("a ReplicaSet's", owned("ReplicaSet", true), false),
            ("no owner", pod(json!({"metadata": {"name": "p"}})), false),
        ];
        for (case, pod, expected) in owners {
            assert_eq!(is_daemon_set_pod(&pod), expected, "{case}");
        }

        let held = pod(json!({"metadata": {"name": "p", "finalizers": ["example.com/hold"]}}));
        assert!(has_finalizers(&held));
        assert!(!has_finalizers(&pod(json!({"metadata": {"name": "p"}}))));
        assert!(!has_finalizers(&pod(
            json!({"metadata": {"name": "p", "finalizers": []}})
        )));

        let deleting =
            pod(json!({"metadata": {"name": "p", "deletionTimestamp": "2026-11-26T09:00:00Z"}}));
        assert!(is_terminating(&deleting));
        assert!(!is_terminating(&held));
    }

    /// MUO's pod_predicates_test.go namespace cases (pod in `test-namespace`).
    #[test]
    fn ignored_namespace_table() {
        // (patterns, ignored)
        let rows: &[(&[&str], bool)] = &[
            (&["not-same-as-pod", "also-not-the-same"], false),
            (&[], false),
            (&["not-same-as-pod", "test-namespace"], true),
            (&["test-n.+"], true),
            // Unanchored, as MUO's MatchString: a pattern matches anywhere in the name.
            (&["namespace"], true),
            (&["^namespace"], false),
        ];
        for (patterns, ignored) in rows {
            let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
            let compiled = IgnoredNamespaces::compile(&patterns).expect("patterns compile");
            assert_eq!(compiled.ignores("test-namespace"), *ignored, "{patterns:?}");
        }
        let err = IgnoredNamespaces::compile(&["ok".into(), "(".into()]).expect_err("bad");
        assert_eq!(err.index, 1);
        assert!(
            err.to_string()
                .starts_with("nodeDrain.ignoredNamespacePatterns[1] \"(\"")
        );
    }

    #[test]
    fn evictable_table() {
        let base = |extra: Value| {
            let mut value = json!({"metadata": {"name": "p", "namespace": "apps"},
                                   "spec": {"nodeName": "n1", "containers": []},
                                   "status": {"phase": "Running"}});
            merge(&mut value, extra);
            pod(value)
        };
        // (case, extra fields, evictable)
        let rows = [
            ("a plain pod", json!({}), true),
            (
                "a pod being deleted (the drain waits for it)",
                json!({"metadata": {"deletionTimestamp": "2026-11-26T09:00:00Z"}}),
                true,
            ),
            (
                "a Pending pod",
                json!({"status": {"phase": "Pending"}}),
                true,
            ),
            (
                "a DaemonSet's pod",
                json!({"metadata": {"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}]}}),
                false,
            ),
            (
                "a mirror pod",
                json!({"metadata": {"annotations": {MIRROR_POD_ANNOTATION: "abc"}}}),
                false,
            ),
            (
                "a kmod worker",
                json!({"metadata": {"labels": {COMPONENT_LABEL: WORKER_COMPONENT}}}),
                false,
            ),
            (
                "a device plugin",
                json!({"metadata": {"labels": {ROLE_LABEL: DEVICE_PLUGIN_ROLE}}}),
                false,
            ),
            (
                "a Succeeded pod",
                json!({"status": {"phase": "Succeeded"}}),
                false,
            ),
            (
                "a Failed pod",
                json!({"status": {"phase": "Failed"}}),
                false,
            ),
        ];
        for (case, extra, expected) in rows {
            assert_eq!(evictable(&base(extra)), expected, "{case}");
        }
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

    #[test]
    fn facts_of_a_pod() {
        let pdbs = [pdb("apps", json!({"matchLabels": {"app": "db"}}))];
        let ignored = IgnoredNamespaces::compile(&["^kube-".into()]).unwrap();
        let db = pod(json!({
            "metadata": {"name": "db-0", "namespace": "apps", "uid": "u1",
                         "labels": {"app": "db"}, "finalizers": ["example.com/hold"],
                         "deletionTimestamp": "2026-11-26T09:00:00Z"},
            "spec": {"nodeName": "worker-1", "containers": []},
        }));
        let facts = PodFacts::of(&db, "worker-1", &pdbs, &ignored);
        assert_eq!(
            facts,
            PodFacts {
                pod: PodRef {
                    namespace: "apps".into(),
                    name: "db-0".into(),
                    uid: "u1".into()
                },
                on_node: true,
                daemon_set: false,
                finalizers: true,
                terminating: true,
                ignored_namespace: false,
                pdb: true,
            }
        );
        assert!(facts.forceable());
        assert_eq!(facts.pod.to_string(), "apps/db-0");
        let proxy = pod(
            json!({"metadata": {"name": "proxy", "namespace": "kube-system"},
                               "spec": {"nodeName": "worker-1", "containers": []}}),
        );
        let facts = PodFacts::of(&proxy, "worker-1", &pdbs, &ignored);
        assert!(facts.ignored_namespace && !facts.forceable());
    }
}
