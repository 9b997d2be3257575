//! The campaign table of [`super::decide`], row by row, and MUO's step runner.

use super::*;
use capstan_api::upgrade_config::UpgradeConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn at(minutes: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + minutes * 60).unwrap()
}

fn entry(phase: UpgradePhase) -> UpgradeHistory {
    UpgradeHistory {
        version: "v2".into(),
        preceding_version: "v1".into(),
        phase,
        conditions: Vec::new(),
        start_time: None,
        complete_time: None,
        worker_start_time: None,
        worker_complete_time: None,
    }
}

fn upgrading_since(minutes: i64) -> UpgradeHistory {
    UpgradeHistory {
        start_time: Some(Time(at(minutes))),
        ..entry(UpgradePhase::Upgrading)
    }
}

fn nodes(labelled: usize, started: usize, finished: usize) -> NodeTally {
    NodeTally {
        labelled,
        started,
        finished,
        first_start: (started > 0).then(|| at(3)),
        preceding: Some("v1".into()),
    }
}

fn window() -> UpgradeWindow {
    UpgradeWindow {
        time_out: 120,
        delay_trigger: 30,
    }
}

fn decide_at(entry: Option<&UpgradeHistory>, nodes: NodeTally, now: i64) -> Decision {
    let facts = CampaignFacts {
        version: "v2",
        upgrade_at: Some(at(0)),
        entry,
        nodes,
    };
    decide(&facts, &window(), at(now))
}

fn types(entry: &UpgradeHistory) -> Vec<(&str, ConditionStatus)> {
    entry
        .conditions
        .iter()
        .map(|c| (c.type_.as_str(), c.status))
        .collect()
}

#[test]
fn a_new_campaign_gets_a_new_entry_then_waits_pending_for_upgrade_at() {
    let first = decide_at(None, nodes(2, 0, 0), -60);
    let new = first.entry.clone().unwrap();
    assert_eq!(
        (
            new.phase,
            new.version.as_str(),
            new.preceding_version.as_str()
        ),
        (UpgradePhase::New, "v2", "v1")
    );
    assert_eq!(first.requeue, Some(Duration::ZERO));

    let second = decide_at(Some(&new), nodes(2, 0, 0), -60);
    assert_eq!(second.entry.as_ref().unwrap().phase, UpgradePhase::Pending);
    assert_eq!(second.event, Some(CampaignEvent::Scheduled(at(0))));

    let pending = second.entry.unwrap();
    let early = decide_at(Some(&pending), nodes(2, 0, 0), -60);
    assert_eq!(early.entry, None);
    assert_eq!(early.requeue, Some(Duration::from_secs(3600)));
}

#[test]
fn a_pending_campaign_starts_at_upgrade_at_however_late() {
    for now in [0, 1, 600] {
        let decision = decide_at(Some(&entry(UpgradePhase::Pending)), nodes(2, 0, 0), now);
        let started = decision.entry.unwrap();
        assert_eq!(started.phase, UpgradePhase::Upgrading, "at {now}");
        assert_eq!(started.start_time, Some(Time(at(now))));
        assert_eq!(
            types(&started),
            [(condition_types::UPGRADE_COMMENCED, ConditionStatus::False)]
        );
        assert_eq!(started.conditions[0].reason, "UpgradeCommenced not done");
        assert_eq!(decision.event, Some(CampaignEvent::Started));
        assert_eq!(decision.window_breached, Some(false));
    }
}

#[test]
fn an_unparsable_upgrade_at_keeps_the_campaign_pending() {
    let pending = entry(UpgradePhase::Pending);
    let facts = CampaignFacts {
        version: "v2",
        upgrade_at: None,
        entry: Some(&pending),
        nodes: nodes(1, 0, 0),
    };
    assert_eq!(decide(&facts, &window(), at(10)), Decision::unchanged(None));
}

#[test]
fn no_node_started_within_the_window_fails_the_campaign() {
    // The window is measured from startTime, not from upgradeAt, and strictly after it.
    let on_time = decide_at(Some(&upgrading_since(10)), nodes(1, 0, 0), 130);
    assert_ne!(on_time.entry.map(|e| e.phase), Some(UpgradePhase::Failed));
    let late = decide_at(Some(&upgrading_since(10)), nodes(1, 0, 0), 131);
    let failed = late.entry.unwrap();
    assert_eq!(failed.phase, UpgradePhase::Failed);
    assert_eq!(failed.conditions[0].type_, FAILED_UPGRADE);
    assert_eq!(failed.conditions[0].reason, "Upgrade failed");
    assert_eq!(late.window_breached, Some(true));
    assert_eq!(late.event, Some(CampaignEvent::Failed(120)));

    // A node that started keeps the campaign alive whatever the time.
    let going = decide_at(Some(&upgrading_since(10)), nodes(1, 1, 0), 500);
    assert_eq!(going.entry.unwrap().phase, UpgradePhase::Upgrading);
    // timeOut 0: no window.
    let facts = CampaignFacts {
        version: "v2",
        upgrade_at: Some(at(0)),
        entry: Some(&upgrading_since(10)),
        nodes: nodes(1, 0, 0),
    };
    let endless = UpgradeWindow {
        time_out: 0,
        delay_trigger: 0,
    };
    let decision = decide(&facts, &endless, at(10_000));
    assert_ne!(decision.entry.map(|e| e.phase), Some(UpgradePhase::Failed));
}

#[test]
fn a_delay_is_said_once() {
    let first = decide_at(Some(&upgrading_since(0)), nodes(1, 0, 0), 31);
    assert_eq!(first.event, Some(CampaignEvent::Delayed(30)));
    let delayed = first.entry.unwrap();
    assert!(
        delayed.conditions[0].message.contains("30 minutes after"),
        "{:?}",
        delayed.conditions[0]
    );
    let again = decide_at(Some(&delayed), nodes(1, 0, 0), 40);
    assert_eq!((again.entry, again.event), (None, None));
    assert_eq!(again.requeue, Some(UPGRADING_RECHECK));
}

#[test]
fn the_steps_run_in_order_and_the_campaign_ends_upgraded() {
    // A node started: UpgradeCommenced done, WorkerNodesUpgraded prepended, in progress.
    let commenced = decide_at(Some(&upgrading_since(0)), nodes(2, 1, 0), 5)
        .entry
        .unwrap();
    assert_eq!(
        types(&commenced),
        [
            (
                condition_types::WORKER_NODES_UPGRADED,
                ConditionStatus::False
            ),
            (condition_types::UPGRADE_COMMENCED, ConditionStatus::True),
        ]
    );
    assert_eq!(commenced.conditions[1].reason, "UpgradeCommenced done");
    assert_eq!(
        commenced.conditions[1].message,
        "UpgradeCommenced is completed"
    );
    assert_eq!(commenced.worker_start_time, Some(Time(at(3))));
    assert_eq!(commenced.phase, UpgradePhase::Upgrading);

    // Nothing new: nothing to write.
    let same = decide_at(Some(&commenced), nodes(2, 1, 1), 6);
    assert_eq!(same.entry, None);

    // Every labelled node finished: Upgraded.
    let done = decide_at(Some(&commenced), nodes(2, 0, 2), 9);
    let upgraded = done.entry.unwrap();
    assert_eq!(upgraded.phase, UpgradePhase::Upgraded);
    assert_eq!(upgraded.complete_time, Some(Time(at(9))));
    assert_eq!(upgraded.worker_complete_time, Some(Time(at(9))));
    assert_eq!(
        types(&upgraded),
        [
            (
                condition_types::WORKER_NODES_UPGRADED,
                ConditionStatus::True
            ),
            (condition_types::UPGRADE_COMMENCED, ConditionStatus::True),
        ]
    );
    assert_eq!(done.event, Some(CampaignEvent::Upgraded));
    assert_eq!(done.requeue, None);

    // Upgraded and Failed are final.
    for phase in [UpgradePhase::Upgraded, UpgradePhase::Failed] {
        assert_eq!(
            decide_at(Some(&entry(phase)), nodes(3, 1, 0), 100),
            Decision::unchanged(None)
        );
    }
}

#[test]
fn the_preceding_version_is_learnt_once_nodes_are_relabelled() {
    let unknown = UpgradeHistory {
        preceding_version: String::new(),
        ..entry(UpgradePhase::Pending)
    };
    let decision = decide_at(Some(&unknown), nodes(1, 0, 0), -5);
    assert_eq!(decision.entry.unwrap().preceding_version, "v1");
}

#[test]
fn a_campaign_without_labelled_nodes_waits_for_them() {
    let decision = decide_at(Some(&upgrading_since(0)), nodes(0, 0, 0), 5);
    let entry = decision.entry.unwrap();
    assert_eq!(entry.phase, UpgradePhase::Upgrading);
    assert_eq!(
        types(&entry),
        [(condition_types::UPGRADE_COMMENCED, ConditionStatus::False)]
    );
}

#[test]
fn run_steps_follows_muo_runner() {
    let steps = |done: [bool; 2]| [("First", done[0]), ("Second", done[1])];
    // Nothing done: only the first step has a condition.
    let none = run_steps(&[], &steps([false, false]), at(0));
    assert_eq!(
        none.iter()
            .map(|c| (c.type_.as_str(), c.status))
            .collect::<Vec<_>>(),
        [("First", ConditionStatus::False)]
    );
    assert_eq!(none[0].start_time, Some(Time(at(0))));
    // The first done: True with its complete time, the second started and prepended.
    let first = run_steps(&none, &steps([true, false]), at(5));
    assert_eq!(first[1].complete_time, Some(Time(at(5))));
    assert_eq!(first[1].start_time, Some(Time(at(0))));
    assert_eq!(first[0].type_, "Second");
    assert_eq!(first[0].reason, "Second not done");
    // Done steps keep their times.
    let both = run_steps(&first, &steps([true, true]), at(9));
    assert_eq!(both[1].complete_time, Some(Time(at(5))));
    assert_eq!(both[0].complete_time, Some(Time(at(9))));
    assert_eq!(run_steps(&both, &steps([true, true]), at(20)), both);
}

fn node(name: &str, labels: &[(String, &str)], annotations: &[(String, String)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), (*v).to_string()))
                    .collect(),
            ),
            annotations: Some(annotations.iter().cloned().collect()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

#[test]
fn the_tally_counts_labelled_started_and_finished_nodes() {
    let key = capstan_api::ModuleKey::new("kmm-demo", "my-kmod").unwrap();
    let m = key.version_module_label();
    let w = key.version_worker_pod_label();
    let d = key.version_device_plugin_label();
    let running = Progress {
        from: Some("v1".into()),
        to: Some("v2".into()),
        started_at: Some(at(7)),
        ..Progress::default()
    };
    let fleet = [
        // Finished.
        node(
            "a",
            &[(m.clone(), "v2"), (w.clone(), "v2"), (d.clone(), "v2")],
            &[],
        ),
        // Running, W gone.
        node(
            "b",
            &[(m.clone(), "v2")],
            &[(key.upgrade_annotation(), running.to_annotation())],
        ),
        // Waiting.
        node(
            "c",
            &[(m.clone(), "v2"), (w.clone(), "v1"), (d.clone(), "v1")],
            &[],
        ),
        // Another version.
        node("d", &[(m.clone(), "v1"), (w.clone(), "v1")], &[]),
    ];
    assert_eq!(
        tally(&fleet, "v2"),
        NodeTally {
            labelled: 3,
            started: 1,
            finished: 1,
            first_start: Some(at(7)),
            preceding: Some("v1".into()),
        }
    );
    assert_eq!(tally(&fleet, "v3"), NodeTally::default());
}

#[test]
fn campaigns_gate_moves_by_version() {
    let config = |name: &str, version: &str, phase: Option<UpgradePhase>| {
        let mut config = UpgradeConfig::new(
            name,
            capstan_api::UpgradeConfigSpec {
                desired: capstan_api::upgrade_config::Update {
                    version: version.into(),
                    ..Default::default()
                },
                upgrade_at: "2027-01-01T00:00:00Z".into(),
                pdb_force_drain_timeout: 60,
                type_: capstan_api::upgrade_config::UpgradeType::Osd,
                capacity_reservation: false,
            },
        );
        config.metadata.namespace = Some("fleet".into());
        config.status = phase.map(|phase| capstan_api::UpgradeConfigStatus {
            history: vec![UpgradeHistory {
                version: version.into(),
                ..entry(phase)
            }],
        });
        config
    };
    let configs = [
        config("b", "v2", Some(UpgradePhase::Upgrading)),
        config("a", "v3", Some(UpgradePhase::Pending)),
        config("c", "v4", None),
        config("d", "v5", Some(UpgradePhase::Failed)),
    ];
    let campaigns = Campaigns::of(&configs);
    let gate = |v: &str| campaigns.get(Some(v)).cloned();
    assert!(gate("v2").unwrap().started());
    assert_eq!(gate("v2").unwrap().name, "fleet/b");
    assert_eq!(
        gate("v2").unwrap().pdb_force_drain_timeout,
        Duration::from_secs(3600)
    );
    assert!(!gate("v3").unwrap().started());
    assert!(!gate("v4").unwrap().started());
    assert!(gate("v5").unwrap().failed());
    assert_eq!(gate("v1"), None);
    assert!(campaigns.any_upgrading());
}

/// The entry before a write, the entry written, the decision's event, and the line said.
type PhaseRow<'a> = (
    Option<UpgradeHistory>,
    UpgradeHistory,
    Option<&'a CampaignEvent>,
    Option<String>,
);

#[test]
fn each_phase_change_is_one_log_line_naming_the_campaign_and_its_commit() {
    use UpgradePhase::*;
    let asked = ", asked by 3cf3bea (#2)";
    let scheduled = CampaignEvent::Scheduled(at(0));
    let upgraded = CampaignEvent::Upgraded;
    let failed = CampaignEvent::Failed(120);
    let delayed = CampaignEvent::Delayed(30);
    let mut no_preceding = entry(New);
    no_preceding.preceding_version.clear();
    // (before, after, event, line)
    let rows: Vec<PhaseRow> = vec![
        (
            None,
            entry(New),
            None,
            Some(
                "campaign kmm-demo/my-kmod-v2 New: a campaign for v2, its nodes leaving v1".into(),
            ),
        ),
        (
            None,
            no_preceding,
            None,
            Some("campaign kmm-demo/my-kmod-v2 New: a campaign for v2".into()),
        ),
        (
            Some(entry(New)),
            entry(Pending),
            Some(&scheduled),
            Some(format!(
                "campaign kmm-demo/my-kmod-v2 New -> Pending: the upgrade to v2 is held until {}",
                at(0)
            )),
        ),
        (
            Some(entry(Pending)),
            upgrading_since(0),
            Some(&CampaignEvent::Started),
            Some(
                "campaign kmm-demo/my-kmod-v2 Pending -> Upgrading: the upgrade to v2 started: \
                 its nodes move in turn"
                    .into(),
            ),
        ),
        (
            Some(upgrading_since(0)),
            entry(Upgraded),
            Some(&upgraded),
            Some(
                "campaign kmm-demo/my-kmod-v2 Upgrading -> Upgraded: every node labelled v2 \
                 runs it"
                    .into(),
            ),
        ),
        (
            Some(upgrading_since(0)),
            entry(Failed),
            Some(&failed),
            Some(
                "campaign kmm-demo/my-kmod-v2 Upgrading -> Failed: no node started its upgrade \
                 to v2 within the upgrade window of 120 minutes: the campaign failed and its \
                 moves stay held"
                    .into(),
            ),
        ),
        // The steps' conditions move on within Upgrading: no line.
        (Some(upgrading_since(0)), upgrading_since(0), None, None),
        // A delay is said, once (the decision says it once).
        (
            Some(upgrading_since(0)),
            upgrading_since(0),
            Some(&delayed),
            Some(
                "campaign kmm-demo/my-kmod-v2 still Upgrading: no node started its upgrade to \
                 v2 30 minutes after the campaign began"
                    .into(),
            ),
        ),
    ];
    for (before, after, event, line) in rows {
        let found = phase_line("kmm-demo/my-kmod-v2", before.as_ref(), &after, event, asked);
        assert_eq!(
            found,
            line.map(|line| format!("{line}{asked}")),
            "{before:?} -> {after:?}"
        );
    }
}

#[test]
fn a_campaign_upgrading_since_before_the_start_is_said_resumed() {
    let started = at(10);
    let nodes = nodes(3, 1, 1);
    // (entry, resumed)
    let rows = [
        (upgrading_since(5), true),
        (upgrading_since(10), false),
        (upgrading_since(15), false),
        (entry(UpgradePhase::Pending), false),
        (
            UpgradeHistory {
                start_time: Some(Time(at(5))),
                ..entry(UpgradePhase::Upgraded)
            },
            false,
        ),
    ];
    for (entry, resumed) in rows {
        let line = resumed_line(
            "kmm-demo/my-kmod-v2",
            &entry,
            &nodes,
            started,
            ", asked by 3cf3bea (#2)",
        );
        assert_eq!(line.is_some(), resumed, "{entry:?}");
    }
    let line = resumed_line(
        "kmm-demo/my-kmod-v2",
        &upgrading_since(5),
        &nodes,
        started,
        ", asked by 3cf3bea (#2)",
    );
    assert_eq!(
        line.as_deref(),
        Some(
            format!(
                "resumed campaign kmm-demo/my-kmod-v2 after a restart: Upgrading to v2 since {}, \
                 1 of 3 labelled nodes done, asked by 3cf3bea (#2)",
                at(5)
            )
            .as_str()
        )
    );
}
