//! The device-plugin-ready node label, as upstream's pod labeller
//! (`internal/controllers/device_plugin_pod_reconciler.go`): a node carries
//! `kmm.node.kubernetes.io/<ns>.<name>.device-plugin-ready: ""` while a device plugin pod
//! of that Module is ready there, so that workloads needing the device can select it.
//!
//! [`decide`] takes one device-plugin pod (owned by a DaemonSet, with the
//! `kmm.node.kubernetes.io/module.name` label), its node's labels and the other
//! device-plugin pods, and returns the writes:
//!
//! | pod | another pod of the Module on the node ready, not deleting | node label | finalizer |
//! | --- | --- | --- | --- |
//! | ready, not deleting | any | set | kept |
//! | not ready | no | removed | kept |
//! | not ready | yes | kept | kept |
//! | deleting | no | removed | removed |
//! | deleting | yes | kept | removed |
//! | deleting, not scheduled | — | — | removed |
//!
//! A deleting pod counts as gone although it may still be Ready: its preStop hooks run as
//! the deletion starts. Its finalizer, `kmm.node.kubernetes.io/node-labeler` (set by the
//! DaemonSet's template), is removed only after the label write, so the label never outlives
//! the last ready pod. Writes are made only where they change something. Pods without a
//! DaemonSet owner or the module-name label are not the labeller's, as upstream's predicate
//! skips them.
//!
//! "Another pod" means a device-plugin pod of the same Module (namespace and
//! `module.name`) on the same node; upstream v2.6.0 lists by `module.name` alone, across
//! namespaces, which lets a same-named Module elsewhere keep the label.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use capstan_api::labels::{MODULE_NAME_LABEL, ModuleKey, NODE_LABELER_FINALIZER};

pub mod reconciler;

/// What the labeller reads of a device-plugin pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PluginPod {
    /// The pod's namespace (its Module's).
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// `kmm.node.kubernetes.io/module.name`: the Module's name.
    pub module: Option<String>,
    /// `spec.nodeName`, once scheduled.
    pub node: Option<String>,
    /// The `Ready` condition is `True`.
    pub ready: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// It carries [`NODE_LABELER_FINALIZER`].
    pub has_finalizer: bool,
    /// A DaemonSet is among its owners.
    pub daemon_set_owned: bool,
}

impl PluginPod {
    /// The facts of `pod`.
    pub fn from_pod(pod: &Pod) -> PluginPod {
        let ready = pod
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
        PluginPod {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            module: pod.labels().get(MODULE_NAME_LABEL).cloned(),
            node: pod
                .spec
                .as_ref()
                .and_then(|spec| spec.node_name.clone())
                .filter(|node| !node.is_empty()),
            ready,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            has_finalizer: pod.finalizers().iter().any(|f| f == NODE_LABELER_FINALIZER),
            daemon_set_owned: pod
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "DaemonSet"),
        }
    }

    /// Ready and not being deleted: it keeps its node's label.
    fn serves(&self) -> bool {
        self.ready && !self.deleting
    }

    /// The Module whose label this pod sets; `None` for a pod that is not the labeller's.
    fn module_key(&self) -> Option<ModuleKey> {
        if !self.daemon_set_owned {
            return None;
        }
        ModuleKey::new(self.namespace.as_str(), self.module.as_deref()?).ok()
    }
}

/// A write of one node label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelWrite {
    /// Set `label` to `""` on `node`.
    Set { node: String, label: String },
    /// Remove `label` from `node`.
    Remove { node: String, label: String },
}

/// What the labeller does for one pod: the label write first, then the finalizer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labelling {
    /// The node label write, if one changes anything.
    pub label: Option<LabelWrite>,
    /// Remove [`NODE_LABELER_FINALIZER`] from the pod.
    pub release: bool,
}

/// The writes for `pod`, given the labels of its node (`None` when the node is not known)
/// and the device-plugin pods (`pod` may be among them).
pub fn decide(
    pod: &PluginPod,
    node_labels: Option<&BTreeMap<String, String>>,
    pods: &[PluginPod],
) -> Labelling {
    let Some(key) = pod.module_key() else {
        return Labelling::default();
    };
    let release = pod.deleting && pod.has_finalizer;
    let (Some(node), Some(node_labels)) = (pod.node.as_deref(), node_labels) else {
        // Never scheduled (or the node is gone): no node to label.
        return Labelling {
            label: None,
            release,
        };
    };
    let label = key.device_plugin_ready_label();
    let labelled = node_labels.contains_key(&label);
    let write = if pod.serves() {
        (!labelled).then(|| LabelWrite::Set {
            node: node.to_string(),
            label,
        })
    } else {
        let another_serves = pods.iter().any(|other| {
            other.serves()
                && other.node.as_deref() == Some(node)
                && other.module_key().as_ref() == Some(&key)
        });
        (labelled && !another_serves).then(|| LabelWrite::Remove {
            node: node.to_string(),
            label,
        })
    };
    Labelling {
        label: write,
        release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LABEL: &str = "kmm.node.kubernetes.io/kmm-demo.my-kmod.device-plugin-ready";

    /// A device-plugin pod of `kmm-demo/my-kmod` on `n1`, owned by its DaemonSet, with the
    /// finalizer.
    fn pod(name: &str, ready: bool, deleting: bool) -> PluginPod {
        PluginPod {
            namespace: "kmm-demo".to_string(),
            name: name.to_string(),
            module: Some("my-kmod".to_string()),
            node: Some("n1".to_string()),
            ready,
            deleting,
            has_finalizer: true,
            daemon_set_owned: true,
        }
    }

    fn labelled(yes: bool) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([("role".to_string(), "gpu".to_string())]);
        if yes {
            labels.insert(LABEL.to_string(), String::new());
        }
        labels
    }

    fn set() -> Option<LabelWrite> {
        Some(LabelWrite::Set {
            node: "n1".to_string(),
            label: LABEL.to_string(),
        })
    }

    fn remove() -> Option<LabelWrite> {
        Some(LabelWrite::Remove {
            node: "n1".to_string(),
            label: LABEL.to_string(),
        })
    }

    /// (scenario, pod, node labelled, other pods, label write, finalizer removed)
    type Row<'a> = (
        &'a str,
        &'a PluginPod,
        bool,
        Vec<&'a PluginPod>,
        Option<LabelWrite>,
        bool,
    );

    #[test]
    fn device_plugin_ready_label_table() {
        let ready = pod("a", true, false);
        let not_ready = pod("a", false, false);
        let deleting = pod("a", true, true);
        let other_ready = pod("b", true, false);
        let other_not_ready = pod("b", false, false);
        let other_deleting = pod("b", true, true);
        let other_elsewhere = PluginPod {
            node: Some("n2".to_string()),
            ..other_ready.clone()
        };
        let other_namespace = PluginPod {
            namespace: "other".to_string(),
            ..other_ready.clone()
        };
        let other_module = PluginPod {
            module: Some("other-kmod".to_string()),
            ..other_ready.clone()
        };
        let unscheduled_deleting = PluginPod {
            node: None,
            ..pod("a", false, true)
        };
        let rows: Vec<Row<'_>> = vec![
            ("ready: label set", &ready, false, vec![], set(), false),
            (
                "ready, already labelled: nothing",
                &ready,
                true,
                vec![],
                None,
                false,
            ),
            (
                "not ready, alone: label removed",
                &not_ready,
                true,
                vec![],
                remove(),
                false,
            ),
            (
                "not ready, unlabelled: nothing",
                &not_ready,
                false,
                vec![],
                None,
                false,
            ),
            (
                "not ready, another ready pod of the Module: label kept",
                &not_ready,
                true,
                vec![&other_ready],
                None,
                false,
            ),
            (
                "not ready, the other pod is not ready either: label removed",
                &not_ready,
                true,
                vec![&other_not_ready],
                remove(),
                false,
            ),
            (
                "deleting though still Ready, alone: label removed, then finalizer",
                &deleting,
                true,
                vec![&deleting],
                remove(),
                true,
            ),
            (
                "deleting, another ready pod of the Module (new version): label kept, finalizer removed",
                &deleting,
                true,
                vec![&deleting, &other_ready],
                None,
                true,
            ),
            (
                "deleting, the other pod is deleting too: label removed",
                &deleting,
                true,
                vec![&other_deleting],
                remove(),
                true,
            ),
            (
                "deleting, unlabelled: finalizer removed only",
                &deleting,
                false,
                vec![],
                None,
                true,
            ),
            (
                "the other ready pod is on another node: label removed",
                &not_ready,
                true,
                vec![&other_elsewhere],
                remove(),
                false,
            ),
            (
                "the other ready pod is of a same-named Module in another namespace: label removed",
                &not_ready,
                true,
                vec![&other_namespace],
                remove(),
                false,
            ),
            (
                "the other ready pod is of another Module: label removed",
                &not_ready,
                true,
                vec![&other_module],
                remove(),
                false,
            ),
            (
                "deleting before it was scheduled: finalizer removed only",
                &unscheduled_deleting,
                true,
                vec![],
                None,
                true,
            ),
        ];
        for (scenario, subject, has_label, others, want_label, want_release) in rows {
            let others: Vec<PluginPod> = others.into_iter().cloned().collect();
            let got = decide(subject, Some(&labelled(has_label)), &others);
            assert_eq!(
                got,
                Labelling {
                    label: want_label,
                    release: want_release,
                },
                "{scenario}"
            );
        }
    }

    #[test]
    fn pods_that_are_not_the_labellers_are_left_alone() {
        let no_owner = PluginPod {
            daemon_set_owned: false,
            ..pod("a", true, true)
        };
        let no_module = PluginPod {
            module: None,
            ..pod("a", true, true)
        };
        for subject in [&no_owner, &no_module] {
            assert_eq!(
                decide(subject, Some(&labelled(false)), &[]),
                Labelling::default(),
                "{subject:?}"
            );
        }
        // A deleting pod without the finalizer has nothing to release.
        let released = PluginPod {
            has_finalizer: false,
            ..pod("a", true, true)
        };
        assert_eq!(
            decide(&released, Some(&labelled(true)), &[]),
            Labelling {
                label: remove(),
                release: false,
            }
        );
        // A node the cache does not know is not written.
        assert_eq!(
            decide(&pod("a", true, false), None, &[]),
            Labelling::default()
        );
    }

    #[test]
    fn a_pod_reads_as_the_labeller_sees_it() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": "my-kmod-device-plugin-v1-abcde", "namespace": "kmm-demo",
                "labels": {"kmm.node.kubernetes.io/module.name": "my-kmod"},
                "finalizers": ["example.com/other", "kmm.node.kubernetes.io/node-labeler"],
                "deletionTimestamp": "2026-03-01T10:00:00Z",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                     "name": "my-kmod-device-plugin-v1", "uid": "d"}],
            },
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True"},
                                      {"type": "Ready", "status": "True"}]},
        }))
        .expect("pod");
        assert_eq!(
            PluginPod::from_pod(&pod),
            PluginPod {
                namespace: "kmm-demo".to_string(),
                name: "my-kmod-device-plugin-v1-abcde".to_string(),
                module: Some("my-kmod".to_string()),
                node: Some("n1".to_string()),
                ready: true,
                deleting: true,
                has_finalizer: true,
                daemon_set_owned: true,
            }
        );
        let bare: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "kmm-demo"}}))
                .expect("pod");
        assert_eq!(
            PluginPod::from_pod(&bare),
            PluginPod {
                namespace: "kmm-demo".to_string(),
                name: "p".to_string(),
                ..PluginPod::default()
            }
        );
    }
}
