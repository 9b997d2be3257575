//! Upstream's rolling-update unit rows (`leaderworkerset_controller_test.go`) and the
//! partition sequences of its integration stories (`test/integration/controllers/
//! leaderworkerset_test.go`, cited by line), each reconcile one [`decide`] call.

use super::*;
use crate::controllers::lws::revision::tests::sample;

fn int(value: i32) -> IntOrString {
    IntOrString::Int(value)
}

fn percent(text: &str) -> IntOrString {
    IntOrString::String(text.to_string())
}

/// The sample LWS's spec with `replicas` groups and these rolling-update parameters.
fn spec(
    replicas: i32,
    max_unavailable: IntOrString,
    max_surge: IntOrString,
    partition: i32,
) -> LeaderWorkerSetSpec {
    let mut spec = sample().spec;
    spec.replicas = replicas;
    let rolling = &mut spec.rollout_strategy.rolling_update_configuration;
    rolling.max_unavailable = max_unavailable;
    rolling.max_surge = max_surge;
    rolling.partition = partition;
    spec
}

/// One state per character: `U` ready and updated, `R` ready on the old revision, `u`
/// updated but not ready, `r` neither (or missing).
fn groups(text: &str) -> Vec<GroupState> {
    text.chars()
        .map(|c| GroupState {
            ready: c.is_ascii_uppercase(),
            updated: c.eq_ignore_ascii_case(&'u'),
        })
        .collect()
}

fn leader(replicas: i32, partition: i32, annotation: i32) -> LeaderSet {
    LeaderSet {
        replicas,
        partition,
        replicas_annotation: Some(annotation),
    }
}

fn notes(events: &[Event]) -> Vec<&str> {
    events.iter().map(|event| event.note.as_str()).collect()
}

#[test]
fn scaled_values_follow_intstr() {
    let cases: &[(IntOrString, i32, bool, Result<i32, &str>)] = &[
        (int(3), 10, true, Ok(3)),
        (int(30), 4, false, Ok(30)),
        (percent("25%"), 10, true, Ok(3)),
        (percent("25%"), 10, false, Ok(2)),
        (percent("50%"), 2, true, Ok(1)),
        (percent("0%"), 7, true, Ok(0)),
        (percent("100%"), 7, false, Ok(7)),
        (percent("25"), 10, true, Err("not a percentage")),
        (percent("x%"), 10, true, Err("invalid value \"x%\"")),
    ];
    for (value, total, up, expected) in cases {
        let got = scaled(value, *total, *up);
        match expected {
            Ok(n) => assert_eq!(got, Ok(*n), "{value:?} of {total}"),
            Err(text) => {
                let error = got.expect_err("an error");
                assert!(error.contains(text), "{value:?}: {error}");
            }
        }
    }
}

#[test]
fn surge_is_capped_at_replicas() {
    let cases = [
        (spec(4, int(1), int(0), 0), 0, 1),
        (spec(4, percent("25%"), percent("30%"), 0), 2, 1),
        (spec(2, int(1), int(4), 0), 2, 1),
        (spec(10, percent("15%"), percent("15%"), 0), 2, 1),
    ];
    for (spec, surge, unavailable) in cases {
        let got = budget(&spec).unwrap();
        assert_eq!(
            got,
            Budget {
                max_surge: surge,
                max_unavailable: unavailable
            },
            "{:?}",
            spec.rollout_strategy
        );
    }
    let bad = spec(4, percent("one"), int(0), 0);
    assert!(budget(&bad).unwrap_err().starts_with("maxUnavailable:"));
}

/// `TestLeaderStatefulSetApplyConfig`'s maxUnavailable rows.
#[test]
fn leader_max_unavailable_rows() {
    let cases = [
        ("R1 mu2 ms1", spec(1, int(2), int(1), 0), 3),
        (
            "R1 mu0 ms2: surge capped at 1",
            spec(1, int(0), int(2), 0),
            1,
        ),
        ("R0 mu0 ms0: at least 1", spec(0, int(0), int(0), 0), 1),
        ("R2 mu1 ms50%", spec(2, int(1), percent("50%"), 0), 2),
        ("R1 mu1 ms0", spec(1, int(1), int(0), 0), 1),
    ];
    for (name, spec, expected) in cases {
        assert_eq!(leader_max_unavailable(&spec), Ok(expected), "{name}");
    }
}

/// `TestCalculateRollingUpdateReplicas`.
#[test]
fn rolling_update_replicas_rows() {
    let cases = [
        (
            "keeps surge until maxUnavailable covers unready desired replicas",
            (1, 1, 0, 1),
            2,
        ),
        (
            "reclaims surge gradually once enough are ready",
            (4, 2, 1, 2),
            5,
        ),
        (
            "reclaims surge before partition reaches zero when maxUnavailable permits",
            (2, 2, 1, 2),
            3,
        ),
        (
            "falls back to desired replicas when all are ready",
            (1, 1, 0, 0),
            1,
        ),
        (
            "reclaims surge when maxUnavailable permits an unready one",
            (1, 1, 1, 1),
            1,
        ),
        ("does not surge when maxSurge is zero", (3, 0, 0, 1), 3),
    ];
    for (name, (replicas, surge, unavailable, unready), expected) in cases {
        assert_eq!(
            rolling_update_replicas(replicas, surge, unavailable, unready),
            expected,
            "{name}"
        );
    }
}

/// The three `TestRollingUpdateParameters*` tests: size 1, R3 or R2, a leader StatefulSet of
/// two replicas at partition 0.
#[test]
fn rolling_update_parameters_rows() {
    let cases = [
        (
            "scale up does not create extra surge",
            spec(3, int(0), int(1), 0),
            false,
            (0, 3),
        ),
        (
            "scale up with a template update does not create extra surge",
            spec(3, int(0), int(1), 0),
            true,
            (2, 3),
        ),
        (
            "a template update reclaims surge when allowed",
            spec(2, int(1), int(2), 0),
            true,
            (2, 3),
        ),
    ];
    for (name, spec, updated, expected) in cases {
        let got = decide(
            "test-sample",
            &spec,
            Some(&leader(2, 0, 2)),
            &groups("UU"),
            updated,
        )
        .unwrap();
        assert_eq!((got.partition, got.replicas), expected, "{name}");
        assert_eq!(notes(&got.events), Vec::<&str>::new(), "{name}");
    }
}

/// One row of [`decide`]'s table: `expected` is (partition, replicas).
fn row(
    name: &str,
    spec: &LeaderWorkerSetSpec,
    leader: Option<LeaderSet>,
    states: &str,
    updated: bool,
    expected: (i32, i32),
) {
    let got = decide(
        "test-sample",
        spec,
        leader.as_ref(),
        &groups(states),
        updated,
    )
    .unwrap();
    assert_eq!((got.partition, got.replicas), expected, "{name}");
}

#[test]
fn decision_table() {
    let r4 = spec(4, int(1), int(0), 0);
    let r6 = spec(6, int(1), int(0), 0);
    row("1 no leader StatefulSet", &r4, None, "", false, (0, 4));
    row(
        "1 no leader StatefulSet, even updated",
        &r4,
        None,
        "",
        true,
        (0, 4),
    );
    row(
        "2 updated while scaling up: scale first",
        &r6,
        Some(leader(4, 0, 4)),
        "RRRR",
        true,
        (4, 6),
    );
    row(
        "2' updated: partition R, the whole burst",
        &spec(4, int(1), int(1), 0),
        Some(leader(4, 0, 4)),
        "RRRR",
        true,
        (4, 5),
    );
    row(
        "3 at rest",
        &r4,
        Some(leader(4, 0, 4)),
        "rrrr",
        false,
        (0, 4),
    );
    row(
        "4 still scaling up",
        &r6,
        Some(leader(4, 2, 4)),
        "RRUU",
        false,
        (2, 6),
    );
    row(
        "5 replicas changed mid-update",
        &spec(3, int(1), int(0), 0),
        Some(leader(6, 5, 6)),
        "RRRRRR",
        false,
        (3, 3),
    );
    row(
        "6 one step",
        &r4,
        Some(leader(4, 4, 4)),
        "RRRR",
        false,
        (3, 4),
    );
    row(
        "6 never moves up",
        &r4,
        Some(leader(4, 2, 4)),
        "RRRu",
        false,
        (2, 4),
    );
    row(
        "6 raised to the spec's partition",
        &spec(4, int(1), int(0), 3),
        Some(leader(4, 4, 4)),
        "RRRU",
        false,
        (3, 4),
    );
}

#[test]
fn a_bad_replicas_annotation_is_an_error_once_rolling() {
    let spec = spec(4, int(1), int(0), 0);
    let set = LeaderSet {
        replicas: 4,
        partition: 3,
        replicas_annotation: None,
    };
    let error = decide("test-sample", &spec, Some(&set), &groups("RRRU"), false).unwrap_err();
    assert!(
        error.contains("leaderworkerset.sigs.k8s.io/replicas"),
        "{error}"
    );
    // At rest the annotation is not read.
    let at_rest = LeaderSet {
        partition: 0,
        ..set
    };
    assert!(decide("test-sample", &spec, Some(&at_rest), &groups("UUUU"), false).is_ok());
}

#[test]
fn missing_states_count_as_neither_ready_nor_updated() {
    let spec = spec(4, int(1), int(0), 0);
    let short = decide(
        "test-sample",
        &spec,
        Some(&leader(4, 4, 4)),
        &groups("RR"),
        false,
    )
    .unwrap();
    let padded = decide(
        "test-sample",
        &spec,
        Some(&leader(4, 4, 4)),
        &groups("RRrr"),
        false,
    )
    .unwrap();
    assert_eq!(short, padded);
}

#[test]
fn events_carry_upstream_reasons() {
    let spec = spec(3, int(1), int(0), 0);
    let got = decide(
        "test-sample",
        &spec,
        Some(&leader(6, 5, 6)),
        &groups("RRRRRR"),
        false,
    )
    .unwrap();
    assert_eq!(
        got.events,
        vec![
            Event {
                reason: GROUPS_PROGRESSING,
                note: "deleting surge replicas from test-sample-3 to test-sample-5".into()
            },
            Event {
                reason: GROUPS_UPDATING,
                note: "Updating replicas 3 to 4 (inclusive)".into()
            },
        ]
    );
}

/// One reconcile of a story.
struct Step {
    what: &'static str,
    replicas: Option<i32>,
    partition: Option<i32>,
    updated: bool,
    groups: &'static str,
    expect: (i32, i32),
    events: &'static [&'static str],
}

impl Step {
    fn replicas(self, replicas: i32) -> Step {
        Step {
            replicas: Some(replicas),
            ..self
        }
    }

    fn partition(self, partition: i32) -> Step {
        Step {
            partition: Some(partition),
            ..self
        }
    }
}

/// A reconcile in which the LWS spec did not get a new revision.
fn reconcile(
    what: &'static str,
    groups: &'static str,
    expect: (i32, i32),
    events: &'static [&'static str],
) -> Step {
    Step {
        what,
        replicas: None,
        partition: None,
        updated: false,
        groups,
        expect,
        events,
    }
}

/// The reconcile that creates the revision of a changed template.
fn update(what: &'static str, groups: &'static str, expect: (i32, i32)) -> Step {
    Step {
        updated: true,
        ..reconcile(what, groups, expect, &[])
    }
}

/// Runs `steps` from a leader StatefulSet at rest, applying each decision to it as the
/// reconciler's server-side apply does.
fn story(name: &str, mut spec: LeaderWorkerSetSpec, steps: &[Step]) {
    let rolling_partition = spec.rollout_strategy.rolling_update_configuration.partition;
    let mut set = leader(spec.replicas, rolling_partition, spec.replicas);
    for step in steps {
        if let Some(replicas) = step.replicas {
            spec.replicas = replicas;
        }
        if let Some(partition) = step.partition {
            spec.rollout_strategy.rolling_update_configuration.partition = partition;
        }
        let got = decide(
            "test-sample",
            &spec,
            Some(&set),
            &groups(step.groups),
            step.updated,
        )
        .unwrap_or_else(|error| panic!("{name}, {}: {error}", step.what));
        assert_eq!(
            (got.partition, got.replicas),
            step.expect,
            "{name}, {}: (partition, replicas)",
            step.what
        );
        assert_eq!(
            notes(&got.events),
            step.events,
            "{name}, {}: events",
            step.what
        );
        set = leader(got.replicas, got.partition, spec.replicas);
    }
}

#[test]
fn story_631_leader_template_changed_with_default_strategy() {
    story(
        ":631 R4 mu1 ms0",
        spec(4, int(1), int(0), 0),
        &[
            update("template changed", "RRRR", (4, 4)),
            reconcile("first step", "RRRR", (3, 4), &["Updating replica 3"]),
            reconcile("group 3 rolled", "RRRU", (2, 4), &["Updating replica 2"]),
            reconcile("group 1 rolled out of order", "RURU", (2, 4), &[]),
            reconcile("group 3 unready: never back up", "RURu", (2, 4), &[]),
            reconcile(
                "all rolled",
                "UUUU",
                (0, 4),
                &["Updating replicas 0 to 1 (inclusive)"],
            ),
            reconcile("at rest", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_729_worker_template_changed_with_max_unavailable_2() {
    story(
        ":729 R4 mu2",
        spec(4, int(2), int(0), 0),
        &[
            update("template changed", "RRRR", (4, 4)),
            reconcile(
                "two at once",
                "RRRR",
                (2, 4),
                &["Updating replicas 2 to 3 (inclusive)"],
            ),
            reconcile("group 3 rolled", "RRRU", (1, 4), &["Updating replica 1"]),
            reconcile("group 2 rolled", "RRUU", (0, 4), &["Updating replica 0"]),
            reconcile("all rolled", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_807_max_unavailable_above_replicas() {
    story(
        ":807 R4 mu10",
        spec(4, int(10), int(0), 0),
        &[
            update("template changed", "RRRR", (4, 4)),
            reconcile(
                "all at once",
                "RRRR",
                (0, 4),
                &["Updating replicas 0 to 3 (inclusive)"],
            ),
            reconcile("all rolled", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_856_template_and_replicas_changed_together() {
    story(
        ":856 R4 then R6",
        spec(4, int(1), int(0), 0),
        &[
            update("template and replicas changed: scale first", "RRRR", (4, 6)).replicas(6),
            reconcile("new groups not ready yet", "RRRRrr", (4, 6), &[]),
            reconcile(
                "all ready",
                "UUUUUU",
                (0, 6),
                &["Updating replicas 0 to 3 (inclusive)"],
            ),
        ],
    );
}

#[test]
fn story_916_replicas_increase_during_rolling_update() {
    story(
        ":916 R4 then R6",
        spec(4, int(1), int(0), 0),
        &[
            update("template changed", "RRRR", (4, 4)),
            reconcile("first step", "RRRR", (3, 4), &["Updating replica 3"]),
            reconcile("group 3 rolled", "RRRU", (2, 4), &["Updating replica 2"]),
            reconcile("scaled up: partition kept", "RRRU", (2, 6), &[]).replicas(6),
            reconcile("new groups ready", "RRRUUU", (2, 6), &[]),
            reconcile(
                "all ready",
                "UUUUUU",
                (0, 6),
                &["Updating replicas 0 to 1 (inclusive)"],
            ),
        ],
    );
}

#[test]
fn story_1008_replicas_decrease_during_rolling_update() {
    story(
        ":1008 R6 then R3",
        spec(6, int(1), int(0), 0),
        &[
            update("template changed", "RRRRRR", (6, 6)),
            reconcile("first step", "RRRRRR", (5, 6), &["Updating replica 5"]),
            reconcile(
                "scaled down mid-update",
                "RRRRRR",
                (3, 3),
                &[
                    "deleting surge replicas from test-sample-3 to test-sample-5",
                    "Updating replicas 3 to 4 (inclusive)",
                ],
            )
            .replicas(3),
            reconcile("rolling again", "RRR", (2, 3), &["Updating replica 2"]),
            reconcile(
                "all rolled",
                "UUU",
                (0, 3),
                &["Updating replicas 0 to 1 (inclusive)"],
            ),
        ],
    );
}

#[test]
fn story_1088_max_unavailable_zero_and_max_surge_one() {
    story(
        ":1088 R4 mu0 ms1",
        spec(4, int(0), int(1), 0),
        &[
            update("template changed: one surge group", "RRRR", (4, 5)),
            reconcile("surge group not ready", "RRRRu", (4, 5), &[]),
            reconcile("group 4 ready", "RRRRU", (3, 5), &["Updating replica 3"]),
            reconcile("group 3 rolled", "RRRUU", (2, 5), &["Updating replica 2"]),
            reconcile("group 2 rolled", "RRUUU", (1, 5), &["Updating replica 1"]),
            reconcile("group 1 rolled", "RUUUU", (0, 5), &["Updating replica 0"]),
            reconcile(
                "group 0 rolled: surge reclaimed",
                "UUUUU",
                (0, 4),
                &["deleting surge replica test-sample-4"],
            ),
            reconcile("at rest", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_1207_max_unavailable_and_max_surge_one() {
    story(
        ":1207 R4 mu1 ms1",
        spec(4, int(1), int(1), 0),
        &[
            update("template changed: one surge group", "RRRR", (4, 5)),
            reconcile("first step", "RRRRu", (3, 5), &["Updating replica 3"]),
            reconcile("group 4 ready", "RRRRU", (2, 5), &["Updating replica 2"]),
            reconcile("group 3 rolled", "RRRUU", (1, 5), &["Updating replica 1"]),
            reconcile("group 2 rolled", "RRUUU", (0, 5), &["Updating replica 0"]),
            reconcile(
                "group 1 rolled: surge reclaimed",
                "RUUUU",
                (0, 4),
                &["deleting surge replica test-sample-4"],
            ),
            reconcile("surge gone", "RUUU", (0, 4), &[]),
            reconcile("all rolled", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_1326_max_unavailable_and_max_surge_two() {
    story(
        ":1326 R4 mu2 ms2",
        spec(4, int(2), int(2), 0),
        &[
            update("template changed: two surge groups", "RRRR", (4, 6)),
            reconcile(
                "first step",
                "RRRRuu",
                (2, 6),
                &["Updating replicas 2 to 3 (inclusive)"],
            ),
            reconcile(
                "groups 3 and 2 rolled: surge reclaimed",
                "RRUUUU",
                (0, 4),
                &[
                    "deleting surge replicas from test-sample-4 to test-sample-5",
                    "Updating replicas 0 to 1 (inclusive)",
                ],
            ),
            reconcile("surge gone", "RRUU", (0, 4), &[]),
            reconcile("all rolled", "UUUU", (0, 4), &[]),
        ],
    );
}

#[test]
fn story_2214_unready_group_below_partition_counts_against_max_unavailable() {
    story(
        ":2214 R4 mu2, group 1 unready",
        spec(4, int(2), int(0), 0),
        &[
            update("template changed", "RrRR", (4, 4)),
            reconcile(
                "group 1 uses one of two",
                "RrRR",
                (3, 4),
                &["Updating replica 3"],
            ),
            reconcile(
                "group 3 rolled",
                "RrRU",
                (1, 4),
                &["Updating replicas 1 to 2 (inclusive)"],
            ),
            reconcile("all rolled", "UUUU", (0, 4), &["Updating replica 0"]),
        ],
    );
}

#[test]
fn story_2281_update_starting_with_every_group_unready() {
    story(
        ":2281 R2 mu1, both unready",
        spec(2, int(1), int(0), 0),
        &[
            update("template changed", "rr", (2, 2)),
            reconcile(
                "an unready group rolls",
                "rr",
                (1, 2),
                &["Updating replica 1"],
            ),
            reconcile("group 1 rolled", "rU", (0, 2), &["Updating replica 0"]),
            reconcile("all rolled", "UU", (0, 2), &[]),
        ],
    );
}

#[test]
fn story_2394_rolling_update_with_a_partition() {
    story(
        ":2394 R6 partition 4",
        spec(6, int(1), int(0), 4),
        &[
            reconcile("at rest", "UUUUUU", (4, 6), &[]),
            update("template changed", "RRRRRR", (6, 6)),
            reconcile("first step", "RRRRRR", (5, 6), &["Updating replica 5"]),
            reconcile("group 5 rolled", "RRRRRU", (4, 6), &["Updating replica 4"]),
            reconcile("group 4 rolled: held at 4", "RRRRUU", (4, 6), &[]),
            reconcile(
                "partition lowered to 2",
                "RRRRUU",
                (3, 6),
                &["Updating replica 3"],
            )
            .partition(2),
            reconcile("group 3 rolled", "RRRUUU", (2, 6), &["Updating replica 2"]),
            reconcile("group 2 rolled: held at 2", "RRUUUU", (2, 6), &[]),
        ],
    );
}

#[test]
fn story_2490_partition_and_max_surge() {
    story(
        ":2490 R3 ms1 partition 2",
        spec(3, int(1), int(1), 2),
        &[
            update("template changed: one surge group", "RRR", (3, 4)),
            reconcile("first step", "RRRu", (2, 4), &["Updating replica 2"]),
            reconcile("groups 3 and 2 rolled: held at 2", "RRUU", (2, 4), &[]),
            reconcile(
                "partition lowered to 0",
                "RRUU",
                (0, 4),
                &["Updating replicas 0 to 1 (inclusive)"],
            )
            .partition(0),
            reconcile(
                "groups 1 and 0 rolled: surge reclaimed",
                "UUUU",
                (0, 3),
                &["deleting surge replica test-sample-3"],
            ),
            reconcile("at rest", "UUU", (0, 3), &[]),
        ],
    );
}
