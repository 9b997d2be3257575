//! Upstream's `TestSetCondition` and `TestExclusiveConditionTypes`, and the condition
//! sequences of its integration stories (`test/integration/controllers/
//! leaderworkerset_test.go`, cited by line), each reconcile one [`decide`] call.

use capstan_api::lws::condition_types::{AVAILABLE, PROGRESSING, UPDATE_IN_PROGRESS};
use jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::controllers::lws::revision::tests::{lws, sample_json};

fn at(second: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + second).unwrap())
}

fn bare(type_: &str, status: &str, generation: i64) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        observed_generation: Some(generation),
        last_transition_time: at(0),
        reason: String::new(),
        message: String::new(),
    }
}

/// `TestSetCondition`.
#[test]
fn set_condition_rows() {
    let cases = [
        (
            "same type, different status",
            bare(PROGRESSING, "True", 1),
            vec![bare(PROGRESSING, "False", 1)],
            true,
        ),
        (
            "different type, new condition True",
            bare(PROGRESSING, "True", 1),
            vec![bare(AVAILABLE, "False", 1)],
            true,
        ),
        (
            "no initial condition",
            bare(PROGRESSING, "True", 1),
            vec![],
            true,
        ),
        (
            "same type, same status",
            bare(PROGRESSING, "False", 0),
            vec![bare(PROGRESSING, "False", 0)],
            false,
        ),
        (
            "same type, same status, generation advanced",
            bare(AVAILABLE, "True", 2),
            vec![bare(AVAILABLE, "True", 1)],
            true,
        ),
    ];
    for (name, new, mut conditions, expected) in cases {
        assert_eq!(
            set_condition(&mut conditions, new, at(1)),
            expected,
            "{name}"
        );
    }
}

#[test]
fn a_true_condition_turns_its_exclusive_ones_false() {
    let mut conditions = vec![
        bare(PROGRESSING, "True", 1),
        bare(UPDATE_IN_PROGRESS, "True", 1),
    ];
    assert!(set_condition(
        &mut conditions,
        bare(AVAILABLE, "True", 2),
        at(5)
    ));
    let summary: Vec<(&str, &str, Option<i64>, &Time)> = conditions
        .iter()
        .map(|c| {
            (
                c.type_.as_str(),
                c.status.as_str(),
                c.observed_generation,
                &c.last_transition_time,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (PROGRESSING, "False", Some(2), &at(5)),
            (UPDATE_IN_PROGRESS, "False", Some(2), &at(5)),
            (AVAILABLE, "True", Some(2), &at(5)),
        ]
    );
    // Progressing does not clear UpdateInProgress.
    let mut conditions = vec![bare(UPDATE_IN_PROGRESS, "True", 1)];
    assert!(set_condition(
        &mut conditions,
        bare(PROGRESSING, "True", 1),
        at(6)
    ));
    assert_eq!(conditions[0].status, "True");
}

/// `TestExclusiveConditionTypes`.
#[test]
fn exclusive_condition_types() {
    let cases = [
        (AVAILABLE, PROGRESSING, true),
        (PROGRESSING, AVAILABLE, true),
        (PROGRESSING, PROGRESSING, false),
        (UPDATE_IN_PROGRESS, AVAILABLE, true),
        (AVAILABLE, UPDATE_IN_PROGRESS, true),
        (PROGRESSING, UPDATE_IN_PROGRESS, false),
        (UPDATE_IN_PROGRESS, PROGRESSING, false),
    ];
    for (a, b, expected) in cases {
        assert_eq!(exclusive(a, b), expected, "{a} {b}");
    }
}

/// Groups from one character each, indexed from 0: `U` ready and updated, `R` ready on
/// the old revision, `u` updated but not ready, `r` neither.
fn groups(text: &str) -> Vec<Group> {
    text.chars()
        .enumerate()
        .map(|(index, c)| Group {
            index: index as i32,
            ready: c.is_ascii_uppercase(),
            updated: c.eq_ignore_ascii_case(&'u'),
        })
        .collect()
}

/// The sample LWS with `replicas`, spec `partition` and `generation`.
fn sample_lws(replicas: i32, partition: i32, generation: i64) -> LeaderWorkerSet {
    let mut value = sample_json();
    value["spec"]["replicas"] = json!(replicas);
    value["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]["partition"] = json!(partition);
    value["metadata"]["generation"] = json!(generation);
    lws(value)
}

/// `(type, status)` of every condition, in order.
fn summary(status: &LeaderWorkerSetStatus) -> Vec<(String, String)> {
    status
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect()
}

fn conditions(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(t, s)| (t.to_string(), s.to_string()))
        .collect()
}

/// One reconcile of a story.
struct Step {
    what: &'static str,
    replicas: i32,
    partition: i32,
    generation: i64,
    groups: &'static str,
    conditions: &'static [(&'static str, &'static str)],
    /// (ready, updated).
    counts: (i32, i32),
    event: Option<(&'static str, &'static str)>,
    update_done: bool,
}

/// Runs `steps`, each on the status the previous one wrote, the leader StatefulSet
/// reporting as many replicas as groups.
fn story(name: &str, steps: &[Step]) {
    let mut live: Option<LeaderWorkerSetStatus> = None;
    for (second, step) in steps.iter().enumerate() {
        let mut lws = sample_lws(step.replicas, step.partition, step.generation);
        lws.status = live.clone();
        let groups = groups(step.groups);
        let got = decide(&lws, groups.len() as i32, &groups, at(second as i64));
        let context = format!("{name}, {}", step.what);
        assert_eq!(
            summary(&got.status),
            conditions(step.conditions),
            "{context}"
        );
        assert_eq!(
            (got.status.ready_replicas, got.status.updated_replicas),
            step.counts,
            "{context}: (ready, updated)"
        );
        let event = got.event.as_ref().map(|e| (e.reason, e.note.as_str()));
        assert_eq!(event, step.event, "{context}: event");
        assert_eq!(got.update_done, step.update_done, "{context}: update done");
        assert!(
            got.changed || (got.status == lws.status.clone().unwrap_or_default()),
            "{context}: unchanged status must equal the live one"
        );
        live = Some(got.status);
    }
}

fn step(what: &'static str, replicas: i32, groups: &'static str) -> Step {
    Step {
        what,
        replicas,
        partition: 0,
        generation: 1,
        groups,
        conditions: &[],
        counts: (0, 0),
        event: None,
        update_done: false,
    }
}

#[test]
fn story_359_progressing_then_available_then_progressing() {
    story(
        ":359 R2",
        &[
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (0, 2),
                event: Some((
                    GROUPS_PROGRESSING,
                    "Replicas are progressing, with 0 groups ready of total 2 groups",
                )),
                ..step("created", 2, "uu")
            },
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (0, 2),
                ..step("nothing new", 2, "uu")
            },
            Step {
                conditions: &[(PROGRESSING, "False"), (AVAILABLE, "True")],
                counts: (2, 2),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 2 groups ready of total 2 groups",
                )),
                update_done: true,
                ..step("groups ready", 2, "UU")
            },
            Step {
                generation: 2,
                conditions: &[(PROGRESSING, "True"), (AVAILABLE, "False")],
                counts: (2, 2),
                event: Some((
                    GROUPS_PROGRESSING,
                    "Replicas are progressing, with 2 groups ready of total 3 groups",
                )),
                ..step("scaled to 3", 3, "UU")
            },
        ],
    );
}

#[test]
fn story_578_no_update_in_progress_while_creating() {
    story(
        ":578 R4 ms2",
        &[
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (0, 0),
                event: Some((
                    GROUPS_PROGRESSING,
                    "Replicas are progressing, with 0 groups ready of total 4 groups",
                )),
                ..step("no group yet", 4, "")
            },
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (0, 2),
                ..step("two leaders", 4, "uu")
            },
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (1, 4),
                ..step("all leaders, one ready", 4, "Uuuu")
            },
            Step {
                conditions: &[(PROGRESSING, "False"), (AVAILABLE, "True")],
                counts: (4, 4),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 4 groups ready of total 4 groups",
                )),
                update_done: true,
                ..step("all ready", 4, "UUUU")
            },
        ],
    );
}

#[test]
fn story_631_update_in_progress_until_available() {
    let available = &[(PROGRESSING, "False"), (AVAILABLE, "True")];
    let rolling = &[
        (PROGRESSING, "True"),
        (AVAILABLE, "False"),
        (UPDATE_IN_PROGRESS, "True"),
    ];
    let note = "Rolling Upgrade is in progress, with 4 groups ready of total 4 groups";
    story(
        ":631 R4",
        &[
            Step {
                conditions: &[(PROGRESSING, "True")],
                counts: (0, 4),
                event: Some((
                    GROUPS_PROGRESSING,
                    "Replicas are progressing, with 0 groups ready of total 4 groups",
                )),
                ..step("created", 4, "uuuu")
            },
            Step {
                conditions: available,
                counts: (4, 4),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 4 groups ready of total 4 groups",
                )),
                update_done: true,
                ..step("ready", 4, "UUUU")
            },
            Step {
                generation: 2,
                conditions: &[
                    (PROGRESSING, "False"),
                    (AVAILABLE, "False"),
                    (UPDATE_IN_PROGRESS, "True"),
                ],
                counts: (4, 0),
                event: Some((GROUPS_UPDATING, note)),
                ..step("template changed: UpdateInProgress first", 4, "RRRR")
            },
            Step {
                generation: 2,
                conditions: rolling,
                counts: (4, 0),
                event: Some((GROUPS_UPDATING, note)),
                ..step("then Progressing", 4, "RRRR")
            },
            Step {
                generation: 2,
                conditions: rolling,
                counts: (4, 1),
                ..step("group 3 rolled", 4, "RRRU")
            },
            Step {
                generation: 2,
                conditions: rolling,
                counts: (3, 2),
                ..step("group 3 unready", 4, "RURu")
            },
            Step {
                generation: 2,
                conditions: &[
                    (PROGRESSING, "False"),
                    (AVAILABLE, "True"),
                    (UPDATE_IN_PROGRESS, "False"),
                ],
                counts: (4, 4),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 4 groups ready of total 4 groups",
                )),
                update_done: true,
                ..step("all rolled", 4, "UUUU")
            },
        ],
    );
}

#[test]
fn story_2394_available_within_the_partition() {
    let partition = |partition: i32, s: Step| Step { partition, ..s };
    story(
        ":2394 R6 partition 4",
        &[
            Step {
                conditions: &[(AVAILABLE, "True")],
                counts: (6, 6),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 6 groups ready of total 6 groups",
                )),
                ..partition(4, step("ready", 6, "UUUUUU"))
            },
            Step {
                generation: 2,
                conditions: &[(AVAILABLE, "False"), (UPDATE_IN_PROGRESS, "True")],
                counts: (6, 0),
                event: Some((
                    GROUPS_UPDATING,
                    "Rolling Upgrade is in progress, with 6 groups ready of total 6 groups",
                )),
                ..partition(4, step("template changed", 6, "RRRRRR"))
            },
            Step {
                generation: 2,
                conditions: &[
                    (AVAILABLE, "False"),
                    (UPDATE_IN_PROGRESS, "True"),
                    (PROGRESSING, "True"),
                ],
                counts: (6, 1),
                event: Some((
                    GROUPS_UPDATING,
                    "Rolling Upgrade is in progress, with 6 groups ready of total 6 groups",
                )),
                ..partition(4, step("group 5 rolled", 6, "RRRRRU"))
            },
            Step {
                generation: 2,
                conditions: &[
                    (AVAILABLE, "True"),
                    (UPDATE_IN_PROGRESS, "False"),
                    (PROGRESSING, "False"),
                ],
                counts: (6, 2),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 6 groups ready of total 6 groups",
                )),
                ..partition(
                    4,
                    step("groups 5 and 4 rolled: Available, not done", 6, "RRRRUU"),
                )
            },
            Step {
                generation: 3,
                conditions: &[
                    (AVAILABLE, "False"),
                    (UPDATE_IN_PROGRESS, "True"),
                    (PROGRESSING, "False"),
                ],
                counts: (6, 2),
                event: Some((
                    GROUPS_UPDATING,
                    "Rolling Upgrade is in progress, with 6 groups ready of total 6 groups",
                )),
                ..partition(2, step("partition lowered to 2", 6, "RRRRUU"))
            },
            Step {
                generation: 3,
                conditions: &[
                    (AVAILABLE, "False"),
                    (UPDATE_IN_PROGRESS, "True"),
                    (PROGRESSING, "True"),
                ],
                counts: (6, 3),
                event: Some((
                    GROUPS_UPDATING,
                    "Rolling Upgrade is in progress, with 6 groups ready of total 6 groups",
                )),
                ..partition(2, step("group 3 rolled", 6, "RRRUUU"))
            },
            Step {
                generation: 3,
                conditions: &[
                    (AVAILABLE, "True"),
                    (UPDATE_IN_PROGRESS, "False"),
                    (PROGRESSING, "False"),
                ],
                counts: (6, 4),
                event: Some((
                    ALL_GROUPS_READY,
                    "All replicas are ready, with 6 groups ready of total 6 groups",
                )),
                ..partition(2, step("group 2 rolled: Available, not done", 6, "RRUUUU"))
            },
        ],
    );
}

#[test]
fn counts_selector_and_generation() {
    let mut lws = sample_lws(2, 0, 3);
    lws.status = Some(LeaderWorkerSetStatus {
        hpa_pod_selector: "kept=as-is".into(),
        ..LeaderWorkerSetStatus::default()
    });
    // Two groups and a surge group: the counts include it, the conditions do not.
    let got = decide(&lws, 3, &groups("UUu"), at(0));
    assert_eq!(got.status.replicas, 3);
    assert_eq!(got.status.ready_replicas, 2);
    assert_eq!(got.status.updated_replicas, 3);
    assert_eq!(got.status.observed_generation, 3);
    assert_eq!(got.status.hpa_pod_selector, "kept=as-is", "set once");
    assert_eq!(summary(&got.status), conditions(&[(AVAILABLE, "True")]));
    assert!(got.changed && got.update_done);

    lws.status = None;
    let got = decide(&lws, 2, &groups("UU"), at(0));
    assert_eq!(
        got.status.hpa_pod_selector,
        "leaderworkerset.sigs.k8s.io/name=test-sample,leaderworkerset.sigs.k8s.io/worker-index=0"
    );

    // The same decision again changes nothing.
    lws.status = Some(got.status.clone());
    let again = decide(&lws, 2, &groups("UU"), at(9));
    assert!(!again.changed);
    assert_eq!(again.event, None);
    assert_eq!(again.status, got.status, "no new transition time");

    // A new generation restamps the conditions, with a new transition time as upstream.
    lws.metadata.generation = Some(4);
    let restamped = decide(&lws, 2, &groups("UU"), at(10));
    assert!(restamped.changed);
    assert_eq!(restamped.status.conditions[0].observed_generation, Some(4));
    assert_eq!(restamped.status.conditions[0].last_transition_time, at(10));
    assert_eq!(restamped.event.map(|e| e.reason), Some(ALL_GROUPS_READY));
}

#[test]
fn update_done_needs_partition_zero_and_every_group_below_replicas() {
    let cases = [
        ("all updated and ready", 0, "UUU", true),
        ("one not ready", 0, "UUu", false),
        ("surge group left does not matter", 0, "UUUr", true),
        ("a partition", 1, "UUU", false),
        ("a missing group", 0, "UU", false),
    ];
    for (name, partition, text, expected) in cases {
        let lws = sample_lws(3, partition, 1);
        let groups = groups(text);
        assert_eq!(
            decide(&lws, groups.len() as i32, &groups, at(0)).update_done,
            expected,
            "{name}"
        );
    }
}
