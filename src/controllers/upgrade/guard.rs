//! The rollout's guardrails on one node: the checks a move passes before its node starts
//! and after it finishes, and what a failed one leaves behind (docs/guardrails.md).
//!
//! A node's checks run in order, each an attempt at a time, kept in its [`Progress`]
//! ([`CheckRun`]) so that a restart resumes the attempt it was in. [`next`] is the one
//! decision: given the check running and what it was seen to do, it says which check runs
//! next, or that they all passed, or that one failed ([`GateFailure`]).
//!
//! | seen | within its timeout | past its timeout |
//! | --- | --- | --- |
//! | nothing yet (a check pod just created) | keep waiting | the attempt fails: no answer |
//! | passed | the next check, or all passed | the same |
//! | not yet (an alert firing, an image missing, an expression false) | look again | the attempt fails with what was seen |
//! | failed (a check pod that failed) | the attempt fails | the same |
//!
//! A failed attempt is retried (a new attempt, a new check pod) while `retries` last; then
//! the gate fails. The preflight (the kmod image of the node's kernel exists) is the first
//! check before a node starts when `preflight` is set.
//!
//! [`Progress`]: super::Progress

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use capstan_api::{GateSpec, GateWhen, PodCheck, PrometheusCheck, RolloutPolicy};

/// The name of the preflight check in records and Events.
pub const PREFLIGHT: &str = "preflight";
/// The preflight's timeout: how long a node waits for its kmod image before the preflight
/// fails.
pub const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(600);

/// One check of a node's move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// The gate's name (`preflight` for the preflight).
    pub name: String,
    /// What it checks.
    pub kind: CheckKind,
    /// How long an attempt may take.
    pub timeout: Duration,
    /// Attempts after the first failed one.
    pub retries: u32,
}

/// What a check looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// The kmod image of the node's kernel exists in its registry.
    Preflight,
    /// A pod on the node that must succeed.
    Pod(PodCheck),
    /// A Prometheus query that must return no series.
    Prometheus(PrometheusCheck),
    /// A CEL expression over the node and its pods that must be true.
    Cel(String),
}

impl CheckKind {
    /// The kind's name, as plans show it.
    pub fn as_str(&self) -> &'static str {
        match self {
            CheckKind::Preflight => "image",
            CheckKind::Pod(_) => "pod",
            CheckKind::Prometheus(_) => "prometheus",
            CheckKind::Cel(_) => "cel",
        }
    }
}

impl Check {
    fn of(gate: &GateSpec) -> Option<Check> {
        let kind = if let Some(pod) = &gate.pod {
            CheckKind::Pod(pod.clone())
        } else if let Some(prometheus) = &gate.prometheus {
            CheckKind::Prometheus(prometheus.clone())
        } else {
            CheckKind::Cel(gate.cel.clone()?)
        };
        Some(Check {
            name: gate.name.clone(),
            kind,
            timeout: Duration::from_secs(gate.timeout_seconds.max(1)),
            retries: gate.retries,
        })
    }
}

/// The checks of a move of `module` (`namespace/name`) made `when`, in order: the
/// preflight first before a node starts, then the policy's gates that apply to the Module.
pub fn checks(policy: &RolloutPolicy, module: &str, when: GateWhen) -> Vec<Check> {
    let preflight = (when == GateWhen::Before && policy.preflight).then(|| Check {
        name: PREFLIGHT.to_string(),
        kind: CheckKind::Preflight,
        timeout: PREFLIGHT_TIMEOUT,
        retries: 0,
    });
    preflight
        .into_iter()
        .chain(
            policy
                .gates
                .iter()
                .filter(|gate| {
                    gate.when == when
                        && (gate.modules.is_empty() || gate.modules.iter().any(|m| m == module))
                })
                .filter_map(Check::of),
        )
        .collect()
}

/// The attempt of a check under way, kept in the node's upgrade annotation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckRun {
    /// Before the node starts, or after it finished.
    pub when: GateWhen,
    /// The check's name.
    pub name: String,
    /// The attempt, from 1.
    pub attempt: u32,
    /// When the attempt began.
    pub since: Timestamp,
}

/// A gate that failed: the node's move stops there, and no node of its `GitSync` starts
/// until the repository moves the node again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GateFailure {
    /// Before the node started, or after it finished.
    pub when: GateWhen,
    /// The gate's name.
    pub gate: String,
    /// What its last attempt saw.
    pub reason: String,
    /// When it failed.
    pub at: Timestamp,
}

/// What an attempt was seen to do, read by the reconciler for the [`CheckRun`] the node
/// keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Nothing to read yet: a check pod still to be created.
    Absent,
    /// It passed, with what was seen.
    Passed(String),
    /// Not yet: what is still wrong (looked at again until the timeout).
    NotYet(String),
    /// It failed for good (a check pod that failed).
    Failed(String),
}

/// What [`next`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// This attempt runs (a new one, or the same one still waiting).
    Run(CheckRun),
    /// Every check passed.
    Passed,
    /// A gate failed.
    Failed(GateFailure),
}

/// What [`next`] says happened, for the node's records: a gate passed, an attempt failed
/// and is retried, a gate failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The gate.
    pub gate: String,
    /// Before or after.
    pub when: GateWhen,
    /// The attempt.
    pub attempt: u32,
    /// Passed, retried or failed.
    pub result: CheckResult,
    /// What it saw.
    pub detail: String,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckResult {
    /// The gate passed.
    Passed,
    /// The attempt failed and another follows.
    Retried,
    /// The gate failed.
    Failed,
}

impl CheckResult {
    /// The word records use.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckResult::Passed => "passed",
            CheckResult::Retried => "retried",
            CheckResult::Failed => "failed",
        }
    }
}

/// The next state of `when`'s `checks` given the attempt under way (`None`: none started)
/// and what it was seen to do, at `now`; with what ended, to record.
pub fn next(
    checks: &[Check],
    when: GateWhen,
    run: Option<&CheckRun>,
    seen: Option<&Seen>,
    now: Timestamp,
) -> (Verdict, Option<Outcome>) {
    let start = |index: usize| match checks.get(index) {
        Some(check) => Verdict::Run(CheckRun {
            when,
            name: check.name.clone(),
            attempt: 1,
            since: now,
        }),
        None => Verdict::Passed,
    };
    // A run of the other phase, or of a check the policy no longer has, starts over.
    let Some((index, run, check)) = run.filter(|run| run.when == when).and_then(|run| {
        let index = checks.iter().position(|check| check.name == run.name)?;
        Some((index, run, &checks[index]))
    }) else {
        return (start(0), None);
    };
    let elapsed = Duration::try_from(now.duration_since(run.since)).unwrap_or_default();
    let timed_out = elapsed >= check.timeout;
    let failed_with = match seen {
        Some(Seen::Passed(detail)) => {
            let outcome = Outcome {
                gate: run.name.clone(),
                when,
                attempt: run.attempt,
                result: CheckResult::Passed,
                detail: detail.clone(),
            };
            return (start(index + 1), Some(outcome));
        }
        Some(Seen::Failed(detail)) => detail.clone(),
        Some(Seen::NotYet(detail)) if timed_out => {
            format!("still after {}: {detail}", humantime(check.timeout))
        }
        None | Some(Seen::Absent) if timed_out => {
            format!("no answer within {}", humantime(check.timeout))
        }
        _ => return (Verdict::Run(run.clone()), None),
    };
    if run.attempt <= check.retries {
        let outcome = Outcome {
            gate: run.name.clone(),
            when,
            attempt: run.attempt,
            result: CheckResult::Retried,
            detail: failed_with,
        };
        let retry = CheckRun {
            attempt: run.attempt + 1,
            since: now,
            ..run.clone()
        };
        return (Verdict::Run(retry), Some(outcome));
    }
    let outcome = Outcome {
        gate: run.name.clone(),
        when,
        attempt: run.attempt,
        result: CheckResult::Failed,
        detail: failed_with.clone(),
    };
    let failure = GateFailure {
        when,
        gate: run.name.clone(),
        reason: failed_with,
        at: now,
    };
    (Verdict::Failed(failure), Some(outcome))
}

/// A duration as plans and messages write it: `5m`, `90s`, `1h30m`.
pub fn humantime(duration: Duration) -> String {
    jiff::SignedDuration::try_from(duration)
        .map(|d| format!("{d:#}"))
        .unwrap_or_else(|_| format!("{}s", duration.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn check(name: &str, timeout: u64, retries: u32) -> Check {
        Check {
            name: name.into(),
            kind: CheckKind::Cel("true".into()),
            timeout: Duration::from_secs(timeout),
            retries,
        }
    }

    fn run(name: &str, attempt: u32, since: i64) -> CheckRun {
        CheckRun {
            when: GateWhen::After,
            name: name.into(),
            attempt,
            since: at(since),
        }
    }

    /// (run, seen, now, verdict, recorded)
    type Row<'a> = (
        Option<CheckRun>,
        Option<&'a Seen>,
        i64,
        Verdict,
        Option<CheckResult>,
    );

    #[test]
    fn checks_run_in_order_each_within_its_timeout_and_retries() {
        let checks = [check("diag", 60, 1), check("alerts", 30, 0)];
        let passed = Seen::Passed("ok".into());
        let not_yet = Seen::NotYet("1 series".into());
        let failed = Seen::Failed("exit 1".into());
        let fail = |gate: &str, reason: &str, now: i64| {
            Verdict::Failed(GateFailure {
                when: GateWhen::After,
                gate: gate.into(),
                reason: reason.into(),
                at: at(now),
            })
        };
        // (run, seen, now, verdict, recorded)
        let rows: Vec<Row> = vec![
            // Nothing started: the first check's first attempt.
            (None, None, 5, Verdict::Run(run("diag", 1, 5)), None),
            // A check pod not created yet, or no answer, within the timeout: wait.
            (
                Some(run("diag", 1, 0)),
                Some(&Seen::Absent),
                59,
                Verdict::Run(run("diag", 1, 0)),
                None,
            ),
            (
                Some(run("diag", 1, 0)),
                None,
                30,
                Verdict::Run(run("diag", 1, 0)),
                None,
            ),
            // Passed: the next check.
            (
                Some(run("diag", 1, 0)),
                Some(&passed),
                10,
                Verdict::Run(run("alerts", 1, 10)),
                Some(CheckResult::Passed),
            ),
            // The last check passed: all passed.
            (
                Some(run("alerts", 1, 10)),
                Some(&passed),
                20,
                Verdict::Passed,
                Some(CheckResult::Passed),
            ),
            // Not yet, within the timeout: looked at again.
            (
                Some(run("alerts", 1, 10)),
                Some(&not_yet),
                39,
                Verdict::Run(run("alerts", 1, 10)),
                None,
            ),
            // Not yet at the timeout, no retries: the gate fails with what it saw.
            (
                Some(run("alerts", 1, 10)),
                Some(&not_yet),
                40,
                fail("alerts", "still after 30s: 1 series", 40),
                Some(CheckResult::Failed),
            ),
            // A failed pod with a retry left: a new attempt.
            (
                Some(run("diag", 1, 0)),
                Some(&failed),
                10,
                Verdict::Run(run("diag", 2, 10)),
                Some(CheckResult::Retried),
            ),
            // The retry fails too: the gate fails.
            (
                Some(run("diag", 2, 10)),
                Some(&failed),
                20,
                fail("diag", "exit 1", 20),
                Some(CheckResult::Failed),
            ),
            // No answer past the timeout counts as a failed attempt.
            (
                Some(run("diag", 2, 10)),
                None,
                70,
                fail("diag", "no answer within 1m", 70),
                Some(CheckResult::Failed),
            ),
            // A check the policy dropped: start over.
            (
                Some(run("gone", 1, 0)),
                Some(&passed),
                10,
                Verdict::Run(run("diag", 1, 10)),
                None,
            ),
        ];
        for (i, (current, seen, now, verdict, recorded)) in rows.into_iter().enumerate() {
            let (got, outcome) = next(&checks, GateWhen::After, current.as_ref(), seen, at(now));
            assert_eq!(got, verdict, "row {i}");
            assert_eq!(outcome.map(|o| o.result), recorded, "row {i}");
        }
    }

    #[test]
    fn no_checks_pass_at_once_and_the_preflight_comes_first_before_a_start() {
        assert_eq!(
            next(&[], GateWhen::Before, None, None, at(0)),
            (Verdict::Passed, None)
        );
        let policy = RolloutPolicy {
            preflight: true,
            gates: vec![
                GateSpec {
                    name: "a".into(),
                    when: GateWhen::Before,
                    modules: vec!["kmm/other".into()],
                    cel: Some("true".into()),
                    timeout_seconds: 5,
                    ..GateSpec::default()
                },
                GateSpec {
                    name: "b".into(),
                    when: GateWhen::Before,
                    cel: Some("true".into()),
                    timeout_seconds: 5,
                    ..GateSpec::default()
                },
                GateSpec {
                    name: "c".into(),
                    when: GateWhen::After,
                    cel: Some("true".into()),
                    timeout_seconds: 5,
                    ..GateSpec::default()
                },
            ],
            ..RolloutPolicy::default()
        };
        let names = |when| -> Vec<String> {
            checks(&policy, "kmm/my-kmod", when)
                .into_iter()
                .map(|c| c.name)
                .collect()
        };
        assert_eq!(names(GateWhen::Before), ["preflight", "b"]);
        assert_eq!(names(GateWhen::After), ["c"]);
    }
}
