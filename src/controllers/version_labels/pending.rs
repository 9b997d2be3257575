//! What the version-label controller still has to do, as `capstan sync --once` waits for
//! it: every node's internal version labels caught up with its version-module labels, and
//! no node's ordered upgrade still waiting for its last step (the labels catch up before
//! step 4 is seen: the device plugin pod may not run yet, and a DaemonSet's status can lag
//! the node label that schedules it). A move a campaign holds (not started yet, or failed)
//! is not waited for: it happens at the campaign's time, not the commit's; one due already
//! is waited for. Nor is a move the rollout's guardrails hold (a failed gate, a halt, a
//! pause, a closed window): it waits for the repository or the clock, not for capstan.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

use crate::controllers::node::NodeFacts;
use crate::controllers::upgrade::{Campaigns, Hold, PolicyWait, Progress};
use capstan_api::labels::{DRAIN_ANNOTATION, ModuleKey, ModuleLabel};

/// One thing still to happen on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Waited for: what it is.
    Waiting(String),
    /// A (node, Module) move `campaign` holds, and why.
    Held { campaign: String, hold: Hold },
}

/// What is still to happen on `nodes` (and their `facts`, in the same order) for the
/// Modules that exist (`modules`), under `campaigns` at `now`.
pub fn pending(
    nodes: &[Node],
    facts: &[NodeFacts],
    modules: &[ModuleKey],
    campaigns: &Campaigns,
    now: jiff::Timestamp,
) -> Vec<Pending> {
    let mut pending = Vec::new();
    let mut guarded = std::collections::BTreeSet::new();
    let mut waiting = |line: String| pending.push(Pending::Waiting(line));
    for node in nodes {
        // A node a failed gate keeps cordoned waits for the repository, not for capstan.
        let failed = node.annotations().iter().any(|(annotation, value)| {
            ModuleKey::from_upgrade_annotation(annotation).is_some()
                && Progress::from_annotation(value).is_some_and(|p| p.failed.is_some())
        });
        if node.annotations().contains_key(DRAIN_ANNOTATION) && !failed {
            waiting(format!(
                "node {} is cordoned for its upgrade until its last step",
                node.name_any()
            ));
        }
        for (annotation, value) in node.annotations() {
            let Some(key) = ModuleKey::from_upgrade_annotation(annotation) else {
                continue;
            };
            if Progress::from_annotation(value).is_some_and(|p| guard_held(&p)) {
                guarded.insert((node.name_any(), key));
                continue;
            }
            match Progress::from_annotation(value).filter(Progress::upgrading) {
                Some(progress) if progress.released_at.is_some() => waiting(format!(
                    "node {} gave up its slot while NotReady; its upgrade of {} goes on once \
                     it is Ready",
                    node.name_any(),
                    key
                )),
                Some(_) => waiting(format!(
                    "node {} has not finished its upgrade of {}",
                    node.name_any(),
                    key
                )),
                None => {}
            }
        }
    }
    for node in facts {
        for (label, value) in &node.labels {
            for (kind, key) in ModuleLabel::parse(label) {
                // An empty version counts as no label (version_labels::VersionLabels::of).
                if kind != ModuleLabel::VersionModule
                    || value.is_empty()
                    || !modules.contains(&key)
                    || guarded.contains(&(node.name.clone(), key.clone()))
                {
                    continue;
                }
                let worker = node.labels.get(&key.version_worker_pod_label());
                let plugin = node.labels.get(&key.version_device_plugin_label());
                if worker == Some(value) && plugin == Some(value) {
                    continue;
                }
                let campaign = campaigns.get(Some(value));
                match campaign.and_then(|campaign| Some((campaign, campaign.hold(now)?))) {
                    Some((campaign, hold)) => pending.push(Pending::Held {
                        campaign: campaign.name.clone(),
                        hold,
                    }),
                    None => pending.push(Pending::Waiting(format!(
                        "node {} is moving {} to version {value}",
                        node.name, key
                    ))),
                }
            }
        }
        for label in node.labels.keys() {
            for (kind, key) in ModuleLabel::parse(label) {
                let internal = matches!(
                    kind,
                    ModuleLabel::VersionWorkerPod | ModuleLabel::VersionDevicePlugin
                );
                if internal && !node.labels.contains_key(&key.version_module_label()) {
                    pending.push(Pending::Waiting(format!(
                        "node {} is leaving the versions of {}",
                        node.name, key
                    )));
                }
            }
        }
    }
    pending
}

/// Whether the rollout's guardrails hold a move: a gate failed on the node, or it waits for a pause, a halt or a window to end.
fn guard_held(progress: &Progress) -> bool {
    let failed = progress.failed.is_some();
    let waits = !progress.upgrading()
        && matches!(
            progress.waiting,
            Some(PolicyWait::Paused | PolicyWait::Halted | PolicyWait::Window | PolicyWait::Failed)
        );
    failed || waits
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::UpgradeConfig;
    use capstan_api::upgrade_config::UpgradePhase;
    use serde_json::json;

    const NOW: &str = "2026-12-01T12:00:00Z";

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "m").expect("a key")
    }

    /// n1 with `module` (version-module), `worker` and `plugin` (internal) versions of m.
    fn node(module: Option<&str>, worker: Option<&str>, plugin: Option<&str>) -> NodeFacts {
        let key = key();
        let labels = [
            (key.version_module_label(), module),
            (key.version_worker_pod_label(), worker),
            (key.version_device_plugin_label(), plugin),
        ];
        NodeFacts {
            name: "n1".into(),
            labels: labels
                .into_iter()
                .filter_map(|(label, value)| Some((label, value?.to_string())))
                .collect(),
            ..NodeFacts::default()
        }
    }

    /// The campaign rolling out v2, due at `upgrade_at`, in `phase`.
    fn campaign(upgrade_at: &str, phase: Option<UpgradePhase>) -> Campaigns {
        let history: Vec<_> = phase
            .map(|phase| json!({"version": "v2", "phase": phase}))
            .into_iter()
            .collect();
        let config: UpgradeConfig = serde_json::from_value(json!({
            "apiVersion": "upgrade.managed.openshift.io/v1alpha1", "kind": "UpgradeConfig",
            "metadata": {"name": "v2", "namespace": "fleet"},
            "spec": {"type": "OSD", "upgradeAt": upgrade_at, "PDBForceDrainTimeout": 60,
                     "desired": {"version": "v2"}},
            "status": {"history": history},
        }))
        .expect("an UpgradeConfig");
        Campaigns::of([&config])
    }

    #[test]
    fn a_node_is_pending_until_its_versions_catch_up_unless_a_campaign_holds_the_move() {
        let moving = || Pending::Waiting("node n1 is moving kmm-demo/m to version v2".into());
        let leaving = || Pending::Waiting("node n1 is leaving the versions of kmm-demo/m".into());
        let held = |hold| Pending::Held {
            campaign: "fleet/v2".into(),
            hold,
        };
        let ahead = "2026-12-02T02:00:00Z";
        let due = "2026-12-01T11:00:00Z";
        let none = Campaigns::default();
        // (case, node, campaigns, pending)
        let rows = [
            (
                "caught up",
                node(Some("v2"), Some("v2"), Some("v2")),
                none.clone(),
                vec![],
            ),
            (
                "moving",
                node(Some("v2"), Some("v1"), Some("v1")),
                none.clone(),
                vec![moving()],
            ),
            (
                "half way",
                node(Some("v2"), Some("v2"), Some("v1")),
                none.clone(),
                vec![moving()],
            ),
            (
                "an empty version is no label",
                node(Some(""), None, None),
                none.clone(),
                vec![],
            ),
            (
                "leaving",
                node(None, Some("v1"), Some("v1")),
                none.clone(),
                vec![leaving(), leaving()],
            ),
            (
                "a campaign not due yet holds it",
                node(Some("v2"), Some("v1"), Some("v1")),
                campaign(ahead, Some(UpgradePhase::Pending)),
                vec![held(Hold::Until(ahead.parse().expect("a time")))],
            ),
            (
                "a campaign due is waited for",
                node(Some("v2"), Some("v1"), Some("v1")),
                campaign(due, Some(UpgradePhase::Pending)),
                vec![moving()],
            ),
            (
                "a failed campaign holds it for good",
                node(Some("v2"), Some("v1"), Some("v1")),
                campaign(due, Some(UpgradePhase::Failed)),
                vec![held(Hold::Failed)],
            ),
        ];
        for (case, facts, campaigns, want) in rows {
            let got = pending(
                &[],
                &[facts],
                &[key()],
                &campaigns,
                NOW.parse().expect("a time"),
            );
            assert_eq!(got, want, "{case}");
        }
        let unknown = pending(
            &[],
            &[node(Some("v2"), None, None)],
            &[],
            &Campaigns::default(),
            NOW.parse().expect("a time"),
        );
        assert_eq!(unknown, [], "the version of a Module that does not exist");
    }

    #[test]
    fn a_move_the_guardrails_hold_is_not_waited_for_and_a_running_one_is() {
        let key = key();
        let facts = node(Some("v2"), Some("v1"), Some("v1"));
        // The Node of `facts`, with an upgrade annotation of `progress` and a drain.
        let node_with = |progress: serde_json::Value, drained: bool| -> Node {
            let mut annotations = serde_json::Map::new();
            annotations.insert(key.upgrade_annotation(), json!(progress.to_string()));
            if drained {
                annotations.insert(DRAIN_ANNOTATION.to_string(), json!("{}"));
            }
            serde_json::from_value(json!({"metadata": {"name": "n1", "annotations": annotations}}))
                .expect("a node")
        };
        let failure = json!({"when": "after", "gate": "diag", "reason": "exit 1", "at": NOW});
        let check = json!({"when": "after", "name": "diag", "attempt": 1, "since": NOW});
        // (case, node, pending lines)
        let rows = [
            (
                "a failed gate, the node kept cordoned",
                node_with(
                    json!({"from": "v1", "to": "v2", "startedAt": NOW, "drain": true, "failed": failure}),
                    true,
                ),
                0,
            ),
            (
                "halted, not started",
                node_with(
                    json!({"from": "v1", "to": "v2", "waiting": "halted"}),
                    false,
                ),
                0,
            ),
            (
                "outside every window",
                node_with(
                    json!({"from": "v1", "to": "v2", "waiting": "window"}),
                    false,
                ),
                0,
            ),
            (
                "a gate under way is waited for",
                node_with(
                    json!({"from": "v1", "to": "v2", "startedAt": NOW, "check": check}),
                    false,
                ),
                2,
            ),
        ];
        for (case, node, lines) in rows {
            let got = pending(
                &[node],
                std::slice::from_ref(&facts),
                std::slice::from_ref(&key),
                &Campaigns::default(),
                NOW.parse().expect("a time"),
            );
            assert_eq!(got.len(), lines, "{case}: {got:?}");
        }
    }
}
