//! What the NMC controller still has to do, as `capstan sync --once` waits for it: on every
//! Ready node, each spec entry for the running kernel loaded in this boot (status equals
//! spec), nothing loaded that the spec no longer wants, and no worker pod left.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use crate::controllers::node::NodeFacts;
use capstan_api::nmc::NodeModulesConfig;

/// One line per module still to load or unload, and per worker pod still there.
pub fn pending(
    nodes: &[NodeFacts],
    nmcs: &BTreeMap<String, NodeModulesConfig>,
    workers: &[Pod],
) -> Vec<String> {
    let mut pending = Vec::new();
    for node in nodes.iter().filter(|n| n.ready) {
        let Some(nmc) = nmcs.get(&node.name) else {
            continue;
        };
        for entry in &nmc.spec.modules {
            if entry.config.kernel_version != node.kernel_version {
                continue;
            }
            let loaded = nmc.status.as_ref().and_then(|s| {
                s.modules
                    .iter()
                    .find(|st| st.namespace == entry.namespace && st.name == entry.name)
            });
            let done =
                loaded.is_some_and(|st| st.config == entry.config && st.boot_id == node.boot_id);
            if !done {
                pending.push(format!(
                    "{}/{} is not loaded on {} yet",
                    entry.namespace, entry.name, node.name
                ));
            }
        }
        for status in nmc.status.iter().flat_map(|s| &s.modules) {
            let wanted = nmc
                .spec
                .modules
                .iter()
                .any(|e| e.namespace == status.namespace && e.name == status.name);
            if !wanted
                && status.config.kernel_version == node.kernel_version
                && status.boot_id == node.boot_id
            {
                pending.push(format!(
                    "{}/{} is not unloaded from {} yet",
                    status.namespace, status.name, node.name
                ));
            }
        }
    }
    pending.extend(workers.iter().map(|pod| {
        format!(
            "worker pod {}/{} is still there",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        )
    }));
    pending
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A node running kernel 6.1.0 in boot `b1`.
    fn node(ready: bool) -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            kernel_version: "6.1.0".into(),
            boot_id: "b1".into(),
            ready,
            ..NodeFacts::default()
        }
    }

    /// `m`'s entry for `kernel` in `kmm-demo`.
    fn entry(kernel: &str, image: &str) -> Value {
        json!({
            "name": "m", "namespace": "kmm-demo", "serviceAccountName": "sa",
            "config": {"kernelVersion": kernel, "containerImage": image,
                       "insecurePull": false, "modprobe": {"moduleName": "m"}},
        })
    }

    /// n1's NMC with the spec `spec` and `status` entries (with their boot IDs).
    fn nmc(spec: Vec<Value>, status: Vec<(Value, &str)>) -> BTreeMap<String, NodeModulesConfig> {
        let status: Vec<Value> = status
            .into_iter()
            .map(|(mut entry, boot)| {
                entry["bootId"] = json!(boot);
                entry
            })
            .collect();
        let nmc = serde_json::from_value(json!({
            "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
            "metadata": {"name": "n1"},
            "spec": {"modules": spec},
            "status": {"modules": status},
        }))
        .expect("an NMC");
        BTreeMap::from([("n1".to_string(), nmc)])
    }

    #[test]
    fn a_module_is_pending_until_loaded_in_this_boot_and_unloaded_when_no_longer_wanted() {
        let v1 = || entry("6.1.0", "r/m:v1");
        let v2 = || entry("6.1.0", "r/m:v2");
        let loading = Some("kmm-demo/m is not loaded on n1 yet");
        let unloading = Some("kmm-demo/m is not unloaded from n1 yet");
        // (case, node Ready, spec, status, pending)
        let rows = [
            (
                "loaded in this boot",
                true,
                vec![v1()],
                vec![(v1(), "b1")],
                None,
            ),
            ("not loaded yet", true, vec![v1()], vec![], loading),
            (
                "loaded before a reboot",
                true,
                vec![v1()],
                vec![(v1(), "b0")],
                loading,
            ),
            (
                "another image loaded",
                true,
                vec![v1()],
                vec![(v2(), "b1")],
                loading,
            ),
            (
                "an entry for another kernel",
                true,
                vec![entry("6.2.0", "r/m:v1")],
                vec![],
                None,
            ),
            (
                "no longer wanted",
                true,
                vec![],
                vec![(v1(), "b1")],
                unloading,
            ),
            ("gone with a reboot", true, vec![], vec![(v1(), "b0")], None),
            (
                "a node not Ready is not waited for",
                false,
                vec![v1()],
                vec![],
                None,
            ),
        ];
        for (case, ready, spec, status, want) in rows {
            let got = pending(&[node(ready)], &nmc(spec, status), &[]);
            assert_eq!(
                got,
                want.into_iter().map(String::from).collect::<Vec<_>>(),
                "{case}"
            );
        }
    }

    #[test]
    fn a_worker_pod_left_is_pending() {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": "kmm-worker-n1-m", "namespace": "kmm-demo"}}),
        )
        .expect("a pod");
        assert_eq!(
            pending(&[], &BTreeMap::new(), &[pod]),
            ["worker pod kmm-demo/kmm-worker-n1-m is still there"]
        );
    }
}
