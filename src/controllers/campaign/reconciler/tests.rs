//! One reconcile of a campaign, call by call: the exact requests the campaign controller
//! sends the API server, in order, with their bodies, and when it looks again. The caches
//! are filled as the watches would fill them; the API server is the scenario
//! ([`fixtures`]).
//!
//! Event bodies are not compared: they carry a random name and the wall-clock time.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::campaign::UPGRADING_RECHECK;
use crate::controllers::fixtures::{self, Call, store};
use crate::history::log_lines::LogLines;
use capstan_api::clock::ManualClock;

const NOW: &str = "2026-11-26T12:00:00Z";
const STATUS: &str = "/apis/upgrade.managed.openshift.io/v1alpha1/namespaces/fleet/upgradeconfigs/my-kmod-v2/status?&fieldManager=capstan-campaigns";

/// The campaign for v2, due at `upgrade_at`, its history entry `entry`.
fn campaign(upgrade_at: &str, entry: Value) -> Value {
    json!({
        "apiVersion": "upgrade.managed.openshift.io/v1alpha1",
        "kind": "UpgradeConfig",
        "metadata": {"name": "my-kmod-v2", "namespace": "fleet", "uid": "uid-campaign",
                     "resourceVersion": "5"},
        "spec": {"type": "OSD", "upgradeAt": upgrade_at, "PDBForceDrainTimeout": 60,
                 "desired": {"version": "v2"}},
        "status": {"history": [entry]},
    })
}

/// What one reconcile returned, and the gauges it leaves.
struct Outcome {
    action: Result<Action, kube::Error>,
    window_breached: Option<i64>,
    drain_timeout: Option<i64>,
}

/// Runs one reconcile of `config` at [`NOW`], no node labelled with its version, under the
/// default upgrade window (120 minutes, delay said after 30), against an API server that
/// expects exactly `calls`. worker-1's drain-timeout gauge is 1 before it.
async fn reconcile_once(config: Value, calls: Vec<Call>) -> Outcome {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    let ctx = Context::with_clock(client, Arc::new(clock), CancellationToken::new());
    ctx.metrics.set_node_drain_timeout("worker-1");
    let metrics = ctx.metrics.clone();
    let shared = Arc::new(Shared::new(ctx, store(vec![]), store(vec![])));
    let config: UpgradeConfig = serde_json::from_value(config).expect("an UpgradeConfig");
    let action = reconcile(Arc::new(config), shared).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    Outcome {
        action,
        window_breached: metrics.upgrade_window_breached("my-kmod-v2"),
        drain_timeout: metrics.node_drain_timeout("worker-1"),
    }
}

/// v2's history entry, Pending.
fn pending() -> Value {
    json!({"version": "v2", "phase": "Pending"})
}

#[tokio::test]
async fn a_pending_campaign_past_upgrade_at_starts_with_muo_first_step_and_an_event() {
    let started = json!({
        "metadata": {"resourceVersion": "5"},
        "status": {"history": [{
            "version": "v2",
            "phase": "Upgrading",
            "startTime": NOW,
            "conditions": [{
                "type": "UpgradeCommenced",
                "status": "False",
                "lastProbeTime": NOW,
                "lastTransitionTime": NOW,
                "startTime": NOW,
                "reason": "UpgradeCommenced not done",
                "message": "UpgradeCommenced still in progress",
            }],
        }]},
    });
    let due = campaign("2026-11-26T11:00:00Z", pending());
    let (log, _capture) = LogLines::capture();
    let outcome = reconcile_once(
        due.clone(),
        vec![
            Call::new("PATCH", STATUS, Some(started), due),
            fixtures::event("fleet"),
        ],
    )
    .await;
    assert_eq!(
        outcome.action.expect("reconciled"),
        Action::requeue(UPGRADING_RECHECK)
    );
    assert_eq!(outcome.window_breached, Some(0));
    assert_eq!(outcome.drain_timeout, Some(1));
    // The phase change, once, with the campaign's name (no commit stamped it here).
    let lines = log.lines();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains(
            "INFO capstan::controllers::campaign::reconciler: campaign fleet/my-kmod-v2 \
             Pending -> Upgrading: the upgrade to v2 started: its nodes move in turn \
             campaign=fleet/my-kmod-v2"
        ),
        "{}",
        lines[0]
    );
}

#[tokio::test]
async fn a_pending_campaign_before_upgrade_at_writes_nothing_and_looks_again_then() {
    let outcome = reconcile_once(campaign("2026-11-26T12:30:00Z", pending()), vec![]).await;
    assert_eq!(
        outcome.action.expect("reconciled"),
        Action::requeue(Duration::from_secs(30 * 60))
    );
    assert_eq!(outcome.window_breached, None);
}

#[tokio::test]
async fn a_campaign_changed_under_its_write_is_looked_at_again_without_an_event() {
    let (log, _capture) = LogLines::capture();
    let outcome = reconcile_once(
        campaign("2026-11-26T11:00:00Z", pending()),
        vec![
            Call::new("PATCH", STATUS, None, json!({}))
                .any_body()
                .failing(409, "Conflict"),
        ],
    )
    .await;
    assert_eq!(
        outcome.action.expect("a conflict is no error"),
        Action::requeue(CONFLICT_RETRY)
    );
    assert_eq!(outcome.window_breached, None);
    // Nothing changed: nothing is said (the next look says it).
    assert_eq!(log.lines(), Vec::<String>::new());
}

#[tokio::test]
async fn no_node_started_within_the_window_fails_the_campaign_and_drops_the_drain_timeouts() {
    let upgrading = json!({
        "version": "v2",
        "phase": "Upgrading",
        "startTime": "2026-11-26T09:00:00Z",
    });
    let message = "no node started its upgrade to v2 within the upgrade window of 120 \
                   minutes: the campaign failed and its moves stay held";
    let failed = json!({
        "metadata": {"resourceVersion": "5"},
        "status": {"history": [{
            "version": "v2",
            "phase": "Failed",
            "startTime": "2026-11-26T09:00:00Z",
            "conditions": [{
                "type": "FailedUpgrade",
                "status": "True",
                "lastProbeTime": NOW,
                "lastTransitionTime": NOW,
                "startTime": NOW,
                "completeTime": NOW,
                "reason": "Upgrade failed",
                "message": message,
            }],
        }]},
    });
    let late = campaign("2026-11-26T09:00:00Z", upgrading);
    let (log, _capture) = LogLines::capture();
    let outcome = reconcile_once(
        late.clone(),
        vec![
            Call::new("PATCH", STATUS, Some(failed), late),
            fixtures::event("fleet"),
        ],
    )
    .await;
    assert_eq!(outcome.action.expect("reconciled"), Action::await_change());
    assert_eq!(outcome.window_breached, Some(1));
    // MUO resets the whole vector when an upgrade fails: the series is gone.
    assert_eq!(outcome.drain_timeout, None);
    // Upgrading since before this controller started: resumed; then the failure, a warning.
    let lines = log.lines();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(
        lines[0].contains(
            " INFO capstan::controllers::campaign::reconciler: resumed campaign \
             fleet/my-kmod-v2 after a restart: Upgrading to v2 since 2026-11-26T09:00:00Z, 0 \
             of 0 labelled nodes done"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(&format!(
            " WARN capstan::controllers::campaign::reconciler: campaign fleet/my-kmod-v2 \
             Upgrading -> Failed: {message}"
        )),
        "{}",
        lines[1]
    );
}

#[tokio::test]
async fn a_finished_campaign_makes_no_call() {
    let upgraded = json!({"version": "v2", "phase": "Upgraded",
                          "startTime": "2026-11-26T09:00:00Z",
                          "completeTime": "2026-11-26T10:00:00Z"});
    let outcome = reconcile_once(campaign("2026-11-26T09:00:00Z", upgraded), vec![]).await;
    assert_eq!(outcome.action.expect("reconciled"), Action::await_change());
    assert_eq!(outcome.window_breached, None);
}
