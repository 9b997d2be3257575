use super::*;
use crate::controllers::upgrade::guard::{CheckRun, GateFailure};
use capstan_api::GateWhen;
use std::time::Duration;

const REV: &str = "main@sha1:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const LATER: &str = "main@sha1:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const M: &str = "kmm-demo/m";

fn commit() -> CommitRef {
    crate::history::commit_ref_of_stamp(REV, Some(7))
}

fn progress(revision: &str) -> Progress {
    Progress {
        from: Some("v1".into()),
        to: Some("v2".into()),
        revision: Some(revision.into()),
        ..Progress::default()
    }
}

fn started(step: Option<UpgradeStep>) -> Progress {
    Progress {
        started_at: Some(jiff::Timestamp::UNIX_EPOCH),
        step,
        ..progress(REV)
    }
}

fn node(name: &str, progress: Option<Progress>) -> NodeView {
    NodeView {
        name: name.into(),
        stamp: Some(REV.into()),
        progress: progress.into_iter().map(|p| (M.to_string(), p)).collect(),
        ..NodeView::default()
    }
}

fn queued(name: &str) -> NodeView {
    NodeView {
        unsettled: BTreeMap::from([(M.to_string(), (Some("v2".into()), Some("v1".into())))]),
        ..node(name, None)
    }
}

fn step(node: &str, step: UpgradeStep) -> StepSeen {
    StepSeen {
        node: node.into(),
        module: M.into(),
        from: Some("v1".into()),
        to: Some("v2".into()),
        step,
    }
}

fn report_of(nodes: &[NodeView], steps: &[StepSeen]) -> Report {
    report(
        &commit(),
        &Outcome::Applied,
        &moves(REV, nodes, steps, &BTreeMap::new()),
    )
}

fn line(report: &Report) -> (State, &str) {
    (report.state, report.description.as_str())
}

/// The nodes, the commit's step records, and the line they read as.
type Case = (Vec<NodeView>, Vec<StepSeen>, (State, &'static str));

#[test]
fn a_three_node_rollout_reads_as_it_goes() {
    use UpgradeStep::*;
    let done = |n: &str| {
        [
            step(n, DevicePluginStopped),
            step(n, OldModuleUnloaded),
            step(n, NewModuleLoaded),
            step(n, DevicePluginStarted),
        ]
    };
    let cases: Vec<Case> = vec![
        (
            vec![queued("w1"), queued("w2"), queued("w3")],
            vec![],
            (State::Pending, "0 of 3 nodes upgraded, w1 queued"),
        ),
        (
            vec![
                node("w1", Some(started(Some(DevicePluginStopped)))),
                node(
                    "w2",
                    Some(Progress {
                        waiting: Some(PolicyWait::Slot),
                        ..progress(REV)
                    }),
                ),
                queued("w3"),
            ],
            vec![step("w1", DevicePluginStopped)],
            (
                State::Pending,
                "0 of 3 nodes upgraded, w1 upgrading (old-module-unloaded)",
            ),
        ),
        (
            vec![
                node("w1", None),
                node(
                    "w2",
                    Some(Progress {
                        drain: true,
                        ..started(None)
                    }),
                ),
                queued("w3"),
            ],
            done("w1").to_vec(),
            (State::Pending, "1 of 3 nodes upgraded, w2 draining"),
        ),
        (
            vec![
                node("w1", None),
                node("w2", None),
                node(
                    "w3",
                    Some(Progress {
                        check: Some(CheckRun {
                            when: GateWhen::After,
                            name: "smoke".into(),
                            attempt: 2,
                            since: jiff::Timestamp::UNIX_EPOCH,
                        }),
                        finished_at: Some(jiff::Timestamp::UNIX_EPOCH),
                        ..started(Some(DevicePluginStarted))
                    }),
                ),
            ],
            [done("w1"), done("w2"), done("w3")].concat(),
            (
                State::Pending,
                "2 of 3 nodes upgraded, w3 checking smoke (attempt 2)",
            ),
        ),
        (
            vec![node("w1", None), node("w2", None), node("w3", None)],
            [done("w1"), done("w2"), done("w3")].concat(),
            (State::Success, "3 of 3 nodes upgraded"),
        ),
    ];
    for (nodes, steps, expected) in cases {
        let report = report_of(&nodes, &steps);
        assert_eq!(line(&report), expected, "{nodes:?}");
        assert!(report.failure.is_none());
    }
}

#[test]
fn a_failed_gate_names_the_node_the_gate_and_the_reason() {
    let failed = Progress {
        failed: Some(GateFailure {
            when: GateWhen::After,
            gate: "smoke".into(),
            reason: "exit code 1".into(),
            at: jiff::Timestamp::UNIX_EPOCH,
        }),
        ..started(Some(UpgradeStep::DevicePluginStarted))
    };
    let report = report_of(
        &[node("w1", None), node("w2", Some(failed)), queued("w3")],
        &[step("w1", UpgradeStep::DevicePluginStarted)],
    );
    assert_eq!(
        line(&report),
        (
            State::Failure,
            "w2: gate smoke failed: exit code 1 (1 of 3 nodes upgraded)"
        )
    );
    let failure = report.failure.expect("a failure");
    assert_eq!(failure.node.as_deref(), Some("w2"));
    assert_eq!(failure.step, "gate smoke");
}

#[test]
fn a_failing_worker_fails_the_report_until_it_recovers() {
    let mut view = node("w1", Some(started(Some(UpgradeStep::OldModuleUnloaded))));
    view.worker_failures.insert(
        M.into(),
        WorkerFailure {
            action: "Load".into(),
            message: "image not found".into(),
            attempts: 3,
            ..WorkerFailure::default()
        },
    );
    assert_eq!(
        line(&report_of(&[view.clone()], &[])),
        (
            State::Failure,
            "w1: new-module-loaded failing: load failed 3 time(s): image not found (0 of 1 nodes upgraded)"
        )
    );
    view.worker_failures.clear();
    assert_eq!(
        line(&report_of(&[view], &[])),
        (
            State::Pending,
            "0 of 1 nodes upgraded, w1 upgrading (new-module-loaded)"
        )
    );
}

#[test]
fn a_failed_campaign_fails_its_waiting_moves() {
    let waiting = Progress {
        waiting: Some(PolicyWait::Campaign),
        ..progress(REV)
    };
    let failed = BTreeMap::from([("v2".to_string(), "ops/roll".to_string())]);
    let report = report(
        &commit(),
        &Outcome::Applied,
        &moves(REV, &[node("w1", Some(waiting))], &[], &failed),
    );
    assert_eq!(report.state, State::Failure);
    assert!(
        report
            .description
            .starts_with("w1: campaign ops/roll failed"),
        "{}",
        report.description
    );
}

#[test]
fn the_sync_outcome_comes_first() {
    let cases = [
        (Outcome::Applying, (State::Pending, "applying the commit")),
        (
            Outcome::Retrying("connection refused\nmore".into()),
            (
                State::Pending,
                "the apply failed and is retried: connection refused",
            ),
        ),
        (
            Outcome::Rejected("fleet.yaml:3: spec.x: unknown field\nb.yaml:1: ...".into()),
            (
                State::Failure,
                "rejected: fleet.yaml:3: spec.x: unknown field",
            ),
        ),
        (
            Outcome::Applied,
            (State::Success, "applied, no node to upgrade"),
        ),
    ];
    for (outcome, expected) in cases {
        let report = report(&commit(), &outcome, &[]);
        assert_eq!(line(&report), expected);
    }
}

#[test]
fn a_node_a_later_commit_took_over_is_moved_on() {
    // w1 stopped its device plugin for this commit; a later commit now moves it.
    let mut later = node("w1", Some(progress(LATER)));
    later.stamp = Some(LATER.into());
    let steps = [step("w1", UpgradeStep::DevicePluginStopped)];
    let report = report_of(&[later], &steps);
    assert_eq!(
        line(&report),
        (
            State::Success,
            "1 of 1 nodes upgraded (1 moved on by a later commit)"
        )
    );
    // A failure it had stays: the revert does not turn the commit green.
    let failed = Sent {
        state: State::Failure,
        description: "w1: gate smoke failed: x".into(),
    };
    assert!(!due(&report, Some(&failed)));
}

#[test]
fn a_report_is_due_when_it_differs_from_what_the_target_got() {
    let report = report_of(&[queued("w1")], &[]);
    let sent = |state, description: &str| Sent {
        state,
        description: description.into(),
    };
    assert!(due(&report, None));
    assert!(!due(
        &report,
        Some(&sent(State::Pending, "0 of 1 nodes upgraded, w1 queued"))
    ));
    assert!(due(
        &report,
        Some(&sent(State::Pending, "applying the commit"))
    ));
}

#[test]
fn descriptions_fit_github_and_retries_back_off() {
    let long = "x".repeat(300);
    let report = report(&commit(), &Outcome::Rejected(long), &[]);
    assert_eq!(report.description.chars().count(), MAX_DESCRIPTION);
    assert!(report.description.ends_with("..."));
    let waits: Vec<u64> = [1, 2, 3, 9, 10, 30]
        .map(|n| retry_delay(n).as_secs())
        .to_vec();
    assert_eq!(waits, [1, 2, 4, 256, 300, 300]);
}

#[test]
fn pending_reports_are_spaced_as_they_add_up_and_finals_go_at_once() {
    let pending = report_of(&[queued("w1")], &[]);
    let done = report(&commit(), &Outcome::Applied, &[]);
    let earlier = Sent {
        state: State::Pending,
        description: "applying the commit".into(),
    };
    let s = Duration::from_secs;
    // (report, posts so far, since the last, pace) -> when
    let cases = [
        (&pending, 0, None, Pace::Every, Some(Duration::ZERO)),
        (&pending, 100, Some(s(3)), Pace::Every, Some(s(7))),
        (
            &pending,
            100,
            Some(s(12)),
            Pace::Every,
            Some(Duration::ZERO),
        ),
        (
            &pending,
            949,
            Some(s(1)),
            Pace::Every,
            Some(Duration::from_millis(93_900)),
        ),
        (
            &pending,
            MAX_PENDING_POSTS,
            Some(s(3600)),
            Pace::Every,
            None,
        ),
        (
            &done,
            MAX_PENDING_POSTS,
            Some(Duration::ZERO),
            Pace::Every,
            Some(Duration::ZERO),
        ),
        // A chat hears of a change of state only.
        (&pending, 1, Some(s(60)), Pace::StateChanges, None),
        (
            &done,
            1,
            Some(Duration::ZERO),
            Pace::StateChanges,
            Some(Duration::ZERO),
        ),
    ];
    for (report, posts, since, pace_of, expected) in cases {
        assert_eq!(
            pace(report, Some(&earlier), posts, since, pace_of),
            expected,
            "{} after {posts} posts",
            report.description
        );
    }
    // A chat hears of the start.
    assert_eq!(
        pace(&pending, None, 0, None, Pace::StateChanges),
        Some(Duration::ZERO)
    );
}

#[test]
fn the_sync_status_says_how_a_commit_was_left() {
    use capstan_api::SyncRun;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    let a = crate::history::commit_ref_of_stamp(REV, None);
    let b = crate::history::commit_ref_of_stamp(LATER, None);
    let status =
        |phase: &str, attempted: &CommitRef, applied: &CommitRef, reason: &str| GitSyncStatus {
            phase: phase.into(),
            last_attempted_commit: Some(attempted.clone()),
            last_applied_commit: Some(applied.clone()),
            error: "e1\ne2".into(),
            runs: vec![SyncRun {
                commit: attempted.clone(),
                error: "run error".into(),
                ..SyncRun::default()
            }],
            conditions: vec![Condition {
                type_: "Ready".into(),
                reason: reason.into(),
                status: "False".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..GitSyncStatus::default()
        };
    let cases = [
        // (status, the commit, a rejection recorded) -> outcome
        (
            status("Applying", &b, &a, "Applying"),
            &b,
            false,
            Outcome::Applying,
        ),
        (
            status("Applying", &b, &a, "Applying"),
            &a,
            false,
            Outcome::Applied,
        ),
        // Drift put back: the commit applied is written again.
        (
            status("Applying", &a, &a, "Applying"),
            &a,
            false,
            Outcome::Applied,
        ),
        (
            status("Applied", &b, &b, "Applied"),
            &b,
            false,
            Outcome::Applied,
        ),
        (
            status("Failed", &b, &a, "CommitRejected"),
            &b,
            false,
            Outcome::Rejected("run error".into()),
        ),
        (
            status("Failed", &b, &a, "ApplyFailed"),
            &b,
            false,
            Outcome::Retrying("run error".into()),
        ),
        // An older commit rejected before the one applied now.
        (
            status("Applied", &a, &a, "Applied"),
            &b,
            true,
            Outcome::Rejected("e1\ne2".into()),
        ),
    ];
    for (status, commit, rejected, expected) in cases {
        assert_eq!(
            outcome(&status, &commit.sha, rejected),
            expected,
            "{} {} of {}",
            status.phase,
            commit.short_sha,
            status
                .last_attempted_commit
                .as_ref()
                .map_or("", |c| c.short_sha.as_str())
        );
    }
}
