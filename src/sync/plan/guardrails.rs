//! What head's `rollout` guardrails add to a plan (docs/guardrails.md): each upgrade's
//! gates, the canary's nodes first, when each wave may start given the maintenance
//! windows, and how long the upgrades will take, from the upgrades the cluster recorded.
//!
//! The estimate plays the rollout as the version-label controller will: a wave starts
//! when the one before ended, and only inside a window (a wave under way finishes); each
//! takes a node's usual upgrade (the median of the recorded ones), the canary's wave its
//! soak too. Without a recorded upgrade (an offline plan, a new cluster) there is no
//! estimate, and only the first wave's start is said.

use jiff::Timestamp;

use super::model::{Estimate, NodeMove, PlannedGate, PlannedGuardrails, Policy};
use crate::controllers::upgrade::guard;
use crate::controllers::upgrade::window::{self, WindowState};
use capstan_api::{FailedNode, GateWhen, RolloutPolicy};

/// Adds `rollout`'s guardrails to a plan's `nodes` and `policy`, with an estimate from
/// the durations (seconds) of the upgrades the cluster `recorded`, at `now`.
pub fn apply(
    nodes: &mut [NodeMove],
    policy: &mut Policy,
    rollout: &RolloutPolicy,
    recorded: &[f64],
    now: Timestamp,
) {
    if rollout.is_default() {
        return;
    }
    for node in nodes.iter_mut() {
        if node.from.is_some() && node.to.is_some() {
            node.gates = gates(rollout, &node.module);
        }
    }
    let canary: Vec<String> = rollout
        .canary
        .as_ref()
        .map(|c| c.nodes.clone())
        .unwrap_or_default();
    let soak = rollout.canary.as_ref().map_or(0, |c| c.soak_seconds);
    canary_first(nodes, policy, &canary);
    let per_node = median(recorded);
    let windows = &rollout.windows;
    let start_at = |at: Timestamp| match window::state(windows, at) {
        WindowState::Closed { opens_at } => opens_at,
        WindowState::Always | WindowState::Open { .. } => at,
    };
    let first = start_at(now);
    let mut estimate = None;
    match per_node {
        Some(per_node) => {
            let mut at = now;
            for wave in policy.waves.clone() {
                let start = start_at(at);
                set_start(nodes, &wave, start);
                let soaks = wave.iter().any(|n| canary.contains(n));
                let seconds = per_node + if soaks { soak } else { 0 };
                at = start + jiff::SignedDuration::from_secs(seconds as i64);
            }
            estimate = Some(Estimate {
                per_node_seconds: per_node,
                recorded_upgrades: recorded.len(),
                starts_at: first.to_string(),
                ends_at: at.to_string(),
                total_seconds: at.duration_since(now).as_secs().max(0) as u64,
            });
        }
        None if !windows.is_empty() => {
            if let Some(wave) = policy.waves.first().cloned() {
                set_start(nodes, &wave, first);
            }
        }
        None => {}
    }
    policy.guardrails = Some(PlannedGuardrails {
        paused: rollout.paused,
        failed_node: match rollout.failed_node {
            FailedNode::Cordoned => "cordoned",
            FailedNode::Uncordoned => "uncordoned",
        }
        .to_string(),
        canary,
        soak_seconds: soak,
        windows: windows.iter().map(window::describe).collect(),
        estimate,
    });
}

/// The gates a move of `module` passes, in order.
fn gates(rollout: &RolloutPolicy, module: &str) -> Vec<PlannedGate> {
    [GateWhen::Before, GateWhen::After]
        .into_iter()
        .flat_map(|when| {
            guard::checks(rollout, module, when)
                .into_iter()
                .map(move |check| PlannedGate {
                    kind: check.kind.as_str().to_string(),
                    name: check.name,
                    when: match when {
                        GateWhen::Before => "before",
                        GateWhen::After => "after",
                    }
                    .to_string(),
                    timeout_seconds: check.timeout.as_secs(),
                    retries: check.retries,
                })
        })
        .collect()
}

/// The canary's moving nodes go first, in waves of their own; the rest follow in name
/// order, as the controller starts them.
fn canary_first(nodes: &mut [NodeMove], policy: &mut Policy, canary: &[String]) {
    if canary.is_empty() {
        return;
    }
    let max = policy.max_nodes_in_flight.max(1) as usize;
    let mut names: Vec<String> = policy.waves.concat();
    names.dedup();
    let (first, rest): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| canary.contains(n));
    if first.is_empty() {
        return;
    }
    let chunks = |nodes: &[String]| -> Vec<Vec<String>> {
        nodes.chunks(max).map(<[String]>::to_vec).collect()
    };
    let mut waves = chunks(&first);
    waves.extend(chunks(&rest));
    for node in nodes.iter_mut() {
        if let Some(index) = waves.iter().position(|w| w.contains(&node.node)) {
            node.wave = index + 1;
        }
    }
    let order: Vec<&String> = waves.iter().flatten().collect();
    for node in nodes.iter_mut() {
        if let Some(index) = order.iter().position(|n| **n == node.node) {
            node.order = index + 1;
        }
    }
    nodes.sort_by_key(|n| (n.order, n.module.clone()));
    policy.waves = waves;
}

fn set_start(nodes: &mut [NodeMove], wave: &[String], start: Timestamp) {
    for node in nodes.iter_mut().filter(|n| wave.contains(&n.node)) {
        node.starts_at = Some(start.to_string());
    }
}

/// The median of `values`, in whole seconds; `None` for none.
fn median(values: &[f64]) -> Option<u64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    Some(sorted[sorted.len() / 2].round().max(0.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{Canary, GateSpec, MaintenanceWindow};

    fn node(name: &str, order: usize, wave: usize) -> NodeMove {
        NodeMove {
            node: name.into(),
            module: "kmm-demo/my-kmod".into(),
            from: Some("v1".into()),
            to: Some("v2".into()),
            steps: Vec::new(),
            order,
            wave,
            campaign: None,
            held_until: None,
            drain: None,
            gates: Vec::new(),
            starts_at: None,
        }
    }

    /// Three nodes a, b, c moving v1 -> v2 one at a time, and the policy of their plan.
    fn plan() -> (Vec<NodeMove>, Policy) {
        let nodes = vec![node("a", 1, 1), node("b", 2, 2), node("c", 3, 3)];
        let mut policy = super::super::policy::policy(
            &crate::sync::manifests::Settings::default(),
            vec![vec!["a".into()], vec!["b".into()], vec!["c".into()]],
            true,
            None,
        );
        policy.max_nodes_in_flight = 1;
        (nodes, policy)
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn the_estimate_plays_the_waves_in_the_windows_with_the_canary_first() {
        let rollout = RolloutPolicy {
            canary: Some(Canary {
                nodes: vec!["c".into()],
                soak_seconds: 600,
            }),
            // Every day 02:00-04:00 UTC.
            windows: vec![MaintenanceWindow {
                start: "02:00".into(),
                duration_seconds: 7200,
                ..MaintenanceWindow::default()
            }],
            gates: vec![GateSpec {
                name: "diag".into(),
                when: GateWhen::After,
                timeout_seconds: 300,
                pod: Some(Default::default()),
                ..GateSpec::default()
            }],
            preflight: true,
            ..RolloutPolicy::default()
        };
        let (mut nodes, mut policy) = plan();
        // Three upgrades recorded: 20, 30 and 50 minutes; the median is 30.
        let now = at("2027-01-04T01:00:00Z");
        apply(
            &mut nodes,
            &mut policy,
            &rollout,
            &[1200.0, 1800.0, 3000.0],
            now,
        );
        let order: Vec<(&str, usize)> = nodes.iter().map(|n| (n.node.as_str(), n.wave)).collect();
        assert_eq!(order, [("c", 1), ("a", 2), ("b", 3)]);
        let starts: Vec<&str> = nodes
            .iter()
            .map(|n| n.starts_at.as_deref().unwrap())
            .collect();
        // c at 02:00 (the window), 30 min + 10 min soak; a at 02:40; b at 03:10.
        assert_eq!(
            starts,
            [
                "2027-01-04T02:00:00Z",
                "2027-01-04T02:40:00Z",
                "2027-01-04T03:10:00Z"
            ]
        );
        let guardrails = policy.guardrails.unwrap();
        let estimate = guardrails.estimate.unwrap();
        assert_eq!(estimate.per_node_seconds, 1800);
        assert_eq!(estimate.ends_at, "2027-01-04T03:40:00Z");
        assert_eq!(estimate.total_seconds, 2 * 3600 + 40 * 60);
        assert_eq!(guardrails.windows, ["every day 02:00 for 2h UTC"]);
        let gates: Vec<(&str, &str, &str)> = nodes[0]
            .gates
            .iter()
            .map(|g| (g.name.as_str(), g.kind.as_str(), g.when.as_str()))
            .collect();
        assert_eq!(
            gates,
            [("preflight", "image", "before"), ("diag", "pod", "after")]
        );
    }

    #[test]
    fn a_wave_that_would_start_after_its_window_closed_waits_for_the_next_one() {
        let rollout = RolloutPolicy {
            windows: vec![MaintenanceWindow {
                start: "02:00".into(),
                duration_seconds: 3600,
                ..MaintenanceWindow::default()
            }],
            ..RolloutPolicy::default()
        };
        let (mut nodes, mut policy) = plan();
        apply(
            &mut nodes,
            &mut policy,
            &rollout,
            &[2400.0],
            at("2027-01-04T02:00:00Z"),
        );
        let starts: Vec<&str> = nodes
            .iter()
            .map(|n| n.starts_at.as_deref().unwrap())
            .collect();
        // 40 minutes each: a at 02:00, b at 02:40 (still open), c the next day.
        assert_eq!(
            starts,
            [
                "2027-01-04T02:00:00Z",
                "2027-01-04T02:40:00Z",
                "2027-01-05T02:00:00Z"
            ]
        );
        // Without a recorded upgrade, only the first wave's start is said.
        let (mut nodes, mut policy) = plan();
        apply(
            &mut nodes,
            &mut policy,
            &rollout,
            &[],
            at("2027-01-04T05:00:00Z"),
        );
        assert_eq!(nodes[0].starts_at.as_deref(), Some("2027-01-05T02:00:00Z"));
        assert_eq!(nodes[1].starts_at, None);
        assert_eq!(policy.guardrails.unwrap().estimate, None);
    }
}
