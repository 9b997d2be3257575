//! `rollout` in `capstan.yaml`: the guardrails around each node's ordered upgrade, as the
//! repository writes them (durations as text), and what the `GitSync` status hands the
//! version-label controller ([`RolloutPolicy`]). docs/guardrails.md describes each field.
//!
//! ```yaml
//! rollout:
//!   paused: false            # no node starts; nodes in progress finish
//!   failedNode: cordoned     # or uncordoned: where a halted node is left
//!   preflight: true          # the kmod image of each node's kernel must exist first
//!   canary: {nodes: [worker-1], soak: 10m}
//!   windows:
//!     - {days: [sat, sun], start: "02:00", duration: 4h, timeZone: Europe/Paris}
//!   gates:
//!     - name: gpu-diagnostic
//!       when: after
//!       timeout: 5m
//!       retries: 1
//!       pod: {image: registry.example/gpu-diag:1.4, args: [--quick]}
//!     - name: no-alerts
//!       prometheus: {url: "http://prometheus.monitoring:9090", query: 'ALERTS{node="$node"}'}
//!     - name: device-plugin-ready
//!       when: after
//!       cel: pods.exists(p, p.metadata.labels["app"] == "gpu-plugin" && p.status.phase == "Running")
//! ```

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::yaml::FieldPath;
use crate::controllers::upgrade::window;
use capstan_api::{
    Canary, FailedNode, GateSpec, GateWhen, MaintenanceWindow, PodCheck, PrometheusCheck,
    RolloutPolicy,
};

/// An attempt's default timeout.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(300);

/// `rollout`, as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RolloutSettings {
    /// `paused` (default false).
    pub paused: bool,
    /// `failedNode`: `cordoned` (default) or `uncordoned`.
    pub failed_node: FailedNode,
    /// `preflight` (default false).
    pub preflight: bool,
    /// `canary`.
    pub canary: Option<CanarySettings>,
    /// `windows`.
    pub windows: Vec<WindowSettings>,
    /// `gates`.
    pub gates: Vec<GateSettings>,
}

/// `rollout.canary`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CanarySettings {
    /// `nodes`: the canary nodes by name.
    pub nodes: Vec<String>,
    /// `soak` (default 0s).
    #[serde(with = "super::settings::duration_text")]
    pub soak: Duration,
}

/// One of `rollout.windows`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WindowSettings {
    /// `days` (default every day).
    pub days: Vec<String>,
    /// `start`, `HH:MM`.
    pub start: String,
    /// `duration`.
    #[serde(with = "super::settings::duration_text")]
    pub duration: Duration,
    /// `timeZone` (default UTC).
    pub time_zone: String,
}

/// One of `rollout.gates`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GateSettings {
    /// `name`.
    pub name: String,
    /// `when`: `before` (default) or `after`.
    pub when: GateWhen,
    /// `modules`: `namespace/name` of the Modules it applies to (default every one).
    pub modules: Vec<String>,
    /// `timeout` (default 5m).
    #[serde(with = "super::settings::duration_text")]
    pub timeout: Duration,
    /// `retries` (default 0).
    pub retries: u32,
    /// `pod`.
    pub pod: Option<PodCheck>,
    /// `prometheus`.
    pub prometheus: Option<PrometheusCheck>,
    /// `cel`.
    pub cel: Option<String>,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            name: String::new(),
            when: GateWhen::Before,
            modules: Vec::new(),
            timeout: DEFAULT_GATE_TIMEOUT,
            retries: 0,
            pod: None,
            prometheus: None,
            cel: None,
        }
    }
}

impl RolloutSettings {
    /// The policy the `GitSync` status carries.
    pub fn policy(&self) -> RolloutPolicy {
        RolloutPolicy {
            paused: self.paused,
            failed_node: self.failed_node,
            preflight: self.preflight,
            canary: self.canary.as_ref().map(|canary| Canary {
                nodes: canary.nodes.clone(),
                soak_seconds: canary.soak.as_secs(),
            }),
            windows: self.windows.iter().map(WindowSettings::window).collect(),
            gates: self
                .gates
                .iter()
                .map(|gate| GateSpec {
                    name: gate.name.clone(),
                    when: gate.when,
                    modules: gate.modules.clone(),
                    timeout_seconds: gate.timeout.as_secs().max(1),
                    retries: gate.retries,
                    pod: gate.pod.clone(),
                    prometheus: gate.prometheus.clone(),
                    cel: gate.cel.clone(),
                })
                .collect(),
        }
    }
}

impl WindowSettings {
    fn window(&self) -> MaintenanceWindow {
        MaintenanceWindow {
            days: self.days.clone(),
            start: self.start.clone(),
            duration_seconds: self.duration.as_secs(),
            time_zone: self.time_zone.clone(),
        }
    }
}

/// What `rollout` allows by type but not by meaning, each with its path.
pub fn problems(rollout: &RolloutSettings) -> Vec<(FieldPath, String)> {
    let mut problems = Vec::new();
    let at = |names: &[&str]| {
        names
            .iter()
            .fold(FieldPath::of(&["rollout"]), |path, name| path.field(name))
    };
    if let Some(canary) = &rollout.canary
        && canary.nodes.is_empty()
    {
        problems.push((
            at(&["canary", "nodes"]),
            "no canary node: name the nodes that go first".to_string(),
        ));
    }
    for (index, written) in rollout.windows.iter().enumerate() {
        if let Err(why) = window::check(&written.window()) {
            let (field, message) = match why.split_once(": ") {
                Some((field, message)) => (field.to_string(), message.to_string()),
                None => (String::new(), why),
            };
            let mut path = at(&["windows"]).index(index);
            if !field.is_empty() {
                path = path.field(&field);
            }
            problems.push((path, message));
        }
    }
    let mut names = BTreeSet::new();
    for (index, gate) in rollout.gates.iter().enumerate() {
        let path = at(&["gates"]).index(index);
        if let Err(why) = super::rules::dns_label(&gate.name) {
            problems.push((
                path.field("name"),
                format!(
                    "{:?} is not a gate name: {why} (records and check pods carry it)",
                    gate.name
                ),
            ));
        } else if gate.name == crate::controllers::upgrade::guard::PREFLIGHT {
            problems.push((
                path.field("name"),
                "\"preflight\" names the image check `preflight: true` runs; name the gate otherwise"
                    .to_string(),
            ));
        } else if !names.insert(gate.name.clone()) {
            problems.push((
                path.field("name"),
                format!(
                    "{:?} names two gates; each gate needs its own name",
                    gate.name
                ),
            ));
        }
        let kinds = [
            gate.pod.is_some(),
            gate.prometheus.is_some(),
            gate.cel.is_some(),
        ];
        if kinds.iter().filter(|set| **set).count() != 1 {
            problems.push((
                path.clone(),
                "a gate is exactly one of pod, prometheus or cel".to_string(),
            ));
        }
        if gate.timeout.is_zero() {
            problems.push((path.field("timeout"), "must be at least 1s".to_string()));
        }
        for (i, module) in gate.modules.iter().enumerate() {
            let valid = module.split_once('/').is_some_and(|(ns, name)| {
                !ns.is_empty() && !name.is_empty() && !name.contains('/')
            });
            if !valid {
                problems.push((
                    path.field("modules").index(i),
                    format!("{module:?} is not a Module: write namespace/name"),
                ));
            }
        }
        if let Some(pod) = &gate.pod
            && pod.image.trim().is_empty()
        {
            problems.push((path.field("pod").field("image"), "no image".to_string()));
        }
        if let Some(prometheus) = &gate.prometheus {
            let url = prometheus.url.trim();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push((
                    path.field("prometheus").field("url"),
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
            if prometheus.query.trim().is_empty() {
                problems.push((
                    path.field("prometheus").field("query"),
                    "no query".to_string(),
                ));
            }
        }
        if let Some(expression) = &gate.cel
            && let Err(why) = crate::controllers::checks::cel::compile(expression)
        {
            problems.push((path.field("cel"), why));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::super::settings::parse;

    fn errors(text: &str) -> Vec<String> {
        parse("fleet/capstan.yaml", text)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_rollout_is_read_into_the_policy_the_sync_hands_on() {
        let text = "rollout:\n  paused: true\n  failedNode: uncordoned\n  preflight: true\n  \
                    canary: {nodes: [worker-1], soak: 10m}\n  windows:\n  - {days: [sat], start: \
                    \"02:00\", duration: 4h, timeZone: Europe/Paris}\n  gates:\n  - name: diag\n    \
                    when: after\n    timeout: 90s\n    retries: 2\n    pod: {image: diag:1}\n  \
                    - name: alerts\n    prometheus: {url: \"http://p:9090\", query: up == 0}\n";
        let policy = parse("capstan.yaml", text)
            .unwrap()
            .upgrade_policy()
            .rollout;
        assert!(policy.paused && policy.preflight);
        assert_eq!(policy.failed_node, capstan_api::FailedNode::Uncordoned);
        let canary = policy.canary.unwrap();
        assert_eq!(
            (canary.nodes, canary.soak_seconds),
            (vec!["worker-1".to_string()], 600)
        );
        assert_eq!(policy.windows[0].duration_seconds, 4 * 3600);
        assert_eq!(policy.windows[0].time_zone, "Europe/Paris");
        let (diag, alerts) = (&policy.gates[0], &policy.gates[1]);
        assert_eq!((diag.timeout_seconds, diag.retries), (90, 2));
        assert_eq!(diag.when, capstan_api::GateWhen::After);
        assert_eq!(alerts.when, capstan_api::GateWhen::Before);
        assert_eq!(alerts.timeout_seconds, 300);
    }

    #[test]
    fn a_bad_rollout_is_refused_field_by_field() {
        // (capstan.yaml, the errors)
        let rows: [(&str, &[&str]); 5] = [
            (
                "rollout:\n  gates:\n  - name: a\n    pod: {image: x}\n    cel: \"true\"\n",
                &[
                    "fleet/capstan.yaml:3: rollout.gates[0]: a gate is exactly one of pod, prometheus or cel",
                ],
            ),
            (
                "rollout:\n  gates:\n  - name: a\n    cel: \"true\"\n  - name: a\n    cel: \"true\"\n",
                &[
                    "fleet/capstan.yaml:5: rollout.gates[1].name: \"a\" names two gates; each gate needs its own name",
                ],
            ),
            (
                "rollout:\n  gates:\n  - name: a\n    cel: \"node.(\"\n",
                &["is not a CEL expression"],
            ),
            (
                "rollout:\n  windows:\n  - {start: \"25:00\", duration: 1h}\n",
                &["rollout.windows[0].start"],
            ),
            (
                "rollout:\n  gates:\n  - name: a\n    prometheus: {url: \"prometheus:9090\", query: up}\n",
                &[
                    "rollout.gates[0].prometheus.url: \"prometheus:9090\" is not an http:// or https:// URL",
                ],
            ),
        ];
        for (text, expected) in rows {
            let got = errors(text);
            assert_eq!(got.len(), expected.len(), "{text}: {got:?}");
            for (got, expected) in got.iter().zip(expected) {
                assert!(got.contains(expected), "{text}: {got}");
            }
        }
    }
}
