//! Prometheus metrics of the sync process, served at `/metrics` (see `docs/metrics.md`).
//!
//! The family names and labels are a contract with dashboards and alerts:
//!
//! | family | type | labels |
//! |---|---|---|
//! | `capstan_sync_duration_seconds` | histogram | `result` |
//! | `capstan_sync_runs_total` | counter | `result` |
//! | `capstan_sync_failures_total` | counter | |
//! | `capstan_sync_last_applied_info` | gauge, always 1 | `revision`, `pull_request`, `subject` |
//! | `capstan_sync_last_applied_timestamp_seconds` | gauge | |
//! | `capstan_drift_objects_total` | counter | `kind`, `action` |
//! | `capstan_sync_objects_total` | counter | `action` |
//!
//! The controllers' `upgradeoperator_*` and `kmm_*` gauges ([`UpgradeMetrics`]) are
//! registered here too, so one `/metrics` serves them all.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets_range};
use prometheus_client::registry::{Registry, Unit};

use crate::controllers::metrics::UpgradeMetrics;
use capstan_api::clock::{Clock, SystemClock};

/// The media type of [`Metrics::encode`]'s output: OpenMetrics text 1.0.0, which Prometheus
/// scrapes natively.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The results a sync run ends with, pre-declared so their counters read 0 before the first run.
const RESULTS: [&str; 4] = ["applied", "failed", "interrupted", "unchanged"];

/// The ways a sync writes objects, pre-declared like [`RESULTS`].
const OBJECT_ACTIONS: [&str; 3] = ["created", "configured", "pruned"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppliedLabels {
    revision: String,
    pull_request: String,
    subject: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriftLabels {
    kind: String,
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

type DurationFamily = Family<ResultLabels, Histogram, fn() -> Histogram>;

/// The sync process's metrics: a registry and handles to its families.
///
/// Updates are atomic operations on shared counters, so one `Metrics` behind an `Arc` serves
/// the sync loop and the HTTP server at once.
pub struct Metrics {
    registry: Registry,
    clock: Arc<dyn Clock>,
    durations: DurationFamily,
    runs: Family<ResultLabels, Counter>,
    failures: Counter,
    applied: Family<AppliedLabels, Gauge>,
    /// Held while the info family is swapped to the new commit, so two updates cannot leave
    /// two commits marked as applied.
    applied_swap: Mutex<()>,
    applied_at: Gauge<f64, std::sync::atomic::AtomicU64>,
    drift: Family<DriftLabels, Counter>,
    objects: Family<ActionLabels, Counter>,
    leader: Gauge,
    controllers: Arc<UpgradeMetrics>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Sync durations from 5 ms to a minute in 15 exponential steps (factor about 1.96), rounded
/// to three significant digits so the `le` labels read well.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets_range(0.005, 60.0, 15).map(three_significant_digits))
}

fn three_significant_digits(bound: f64) -> f64 {
    // Through decimal text, so 0.00978 stays 0.00978 rather than 0.009779999999999999.
    format!("{bound:.2e}").parse().unwrap_or(bound)
}

impl Metrics {
    /// Metrics with every family registered, timestamps from the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// Metrics whose `capstan_sync_last_applied_timestamp_seconds` reads `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let mut registry = Registry::default();
        let durations = DurationFamily::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "capstan_sync_duration",
            "How long sync runs took, by result",
            Unit::Seconds,
            durations.clone(),
        );
        let runs = Family::<ResultLabels, Counter>::default();
        registry.register(
            "capstan_sync_runs",
            "Finished sync runs, by result: applied, failed, interrupted or unchanged",
            runs.clone(),
        );
        let failures = Counter::default();
        registry.register(
            "capstan_sync_failures",
            "Sync runs that failed",
            failures.clone(),
        );
        let applied = Family::<AppliedLabels, Gauge>::default();
        registry.register(
            "capstan_sync_last_applied_info",
            "The commit last applied to the cluster; always 1, only the current commit is shown",
            applied.clone(),
        );
        let applied_at = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register_with_unit(
            "capstan_sync_last_applied_timestamp",
            "When the last commit was applied, in seconds since the Unix epoch",
            Unit::Seconds,
            applied_at.clone(),
        );
        let drift = Family::<DriftLabels, Counter>::default();
        registry.register(
            "capstan_drift_objects",
            "Objects found changed by hand, by kind and action: reverted or reported",
            drift.clone(),
        );
        let objects = Family::<ActionLabels, Counter>::default();
        registry.register(
            "capstan_sync_objects",
            "Objects written by sync runs, by action: created, configured or pruned",
            objects.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "capstan_leader",
            "1 while this process syncs and runs the controllers, 0 while it stands by for the Lease",
            leader.clone(),
        );
        let controllers = Arc::new(UpgradeMetrics::default());
        controllers.register(&mut registry);
        // Creating a series is what declares it; the returned guard is not needed.
        for result in RESULTS {
            let _ = runs.get_or_create(&ResultLabels {
                result: result.to_string(),
            });
        }
        for action in OBJECT_ACTIONS {
            let _ = objects.get_or_create(&ActionLabels {
                action: action.to_string(),
            });
        }
        Metrics {
            registry,
            clock,
            durations,
            runs,
            failures,
            applied,
            applied_swap: Mutex::new(()),
            applied_at,
            drift,
            objects,
            leader,
            controllers,
        }
    }

    /// Whether this process acts (holds the Lease, or runs without `--leader-elect`): across
    /// the replicas of one sync the sum is 1 but for the seconds of a takeover.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The controllers' gauges, served with these: give them to the controllers' `Context`
    /// (`Context::reporting_to`).
    pub fn controllers(&self) -> Arc<UpgradeMetrics> {
        self.controllers.clone()
    }

    /// Records one finished sync run: `result` is "applied", "failed", "interrupted" or
    /// "unchanged"; a "failed" run also counts in `capstan_sync_failures_total`.
    pub fn observe_sync(&self, result: &str, duration: Duration) {
        let labels = ResultLabels {
            result: result.to_string(),
        };
        self.durations
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
        self.runs.get_or_create(&labels).inc();
        if result == "failed" {
            self.failures.inc();
        }
    }

    /// Marks the commit now applied, replacing the previous one in
    /// `capstan_sync_last_applied_info`, and stamps the time. A commit without a pull request
    /// has an empty `pull_request` label.
    pub fn set_applied_commit(&self, revision: &str, pull_request: Option<u64>, subject: &str) {
        let labels = AppliedLabels {
            revision: revision.to_string(),
            pull_request: pull_request.map(|n| n.to_string()).unwrap_or_default(),
            subject: subject.to_string(),
        };
        {
            let _swap = self
                .applied_swap
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.applied.clear();
            self.applied.get_or_create(&labels).set(1);
        }
        self.applied_at
            .set(self.clock.now().as_duration().as_secs_f64());
    }

    /// Counts `count` objects of `kind` found changed by hand; `action` is "reverted" or
    /// "reported".
    pub fn add_drift(&self, kind: &str, action: &str, count: u64) {
        self.drift
            .get_or_create(&DriftLabels {
                kind: kind.to_string(),
                action: action.to_string(),
            })
            .inc_by(count);
    }

    /// Counts `count` objects written by a sync; `action` is "created", "configured" or
    /// "pruned".
    pub fn add_objects(&self, action: &str, count: u64) {
        self.objects
            .get_or_create(&ActionLabels {
                action: action.to_string(),
            })
            .inc_by(count);
    }

    /// Every family in the OpenMetrics text format ([`CONTENT_TYPE`]), ending with `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail, and the label sets are plain strings.
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("encoding metrics into a String");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::clock::ManualClock;

    fn lines(metrics: &Metrics) -> Vec<String> {
        metrics.encode().lines().map(str::to_string).collect()
    }

    /// Fails unless every one of `expected` is a whole line of the encoded text.
    #[track_caller]
    fn assert_lines(metrics: &Metrics, expected: &[&str]) {
        let text = metrics.encode();
        for line in expected {
            assert!(
                text.lines().any(|l| l == *line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    fn lines_starting(metrics: &Metrics, prefix: &str) -> Vec<String> {
        lines(metrics)
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    #[test]
    fn a_fresh_process_reports_zero_runs_and_no_applied_commit() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        assert_lines(
            &metrics,
            &[
                "# TYPE capstan_sync_runs counter",
                "capstan_sync_runs_total{result=\"applied\"} 0",
                "capstan_sync_runs_total{result=\"failed\"} 0",
                "capstan_sync_runs_total{result=\"interrupted\"} 0",
                "capstan_sync_runs_total{result=\"unchanged\"} 0",
                "capstan_sync_failures_total 0",
                "# TYPE capstan_sync_last_applied_timestamp_seconds gauge",
                "# UNIT capstan_sync_last_applied_timestamp_seconds seconds",
                "capstan_sync_last_applied_timestamp_seconds 0.0",
                "capstan_sync_objects_total{action=\"created\"} 0",
                "capstan_sync_objects_total{action=\"configured\"} 0",
                "capstan_sync_objects_total{action=\"pruned\"} 0",
                "capstan_leader 0",
            ],
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        // A family without series is left out altogether.
        assert!(!text.contains("capstan_sync_last_applied_info"), "{text}");
        assert!(!text.contains("capstan_drift_objects"), "{text}");
        assert!(!text.contains("capstan_sync_duration_seconds"), "{text}");
    }

    #[test]
    fn a_sync_run_counts_by_result_and_lands_in_a_duration_bucket() {
        let metrics = Metrics::new();
        metrics.observe_sync("applied", Duration::from_millis(1500));
        metrics.observe_sync("applied", Duration::from_millis(2));
        metrics.observe_sync("unchanged", Duration::from_millis(20));
        assert_lines(
            &metrics,
            &[
                "capstan_sync_runs_total{result=\"applied\"} 2",
                "capstan_sync_runs_total{result=\"unchanged\"} 1",
                "capstan_sync_runs_total{result=\"failed\"} 0",
                "capstan_sync_failures_total 0",
                "capstan_sync_duration_seconds_count{result=\"applied\"} 2",
                "capstan_sync_duration_seconds_sum{result=\"applied\"} 1.502",
                "# TYPE capstan_sync_duration_seconds histogram",
                "# UNIT capstan_sync_duration_seconds seconds",
                "capstan_sync_duration_seconds_bucket{le=\"0.005\",result=\"applied\"} 1",
                "capstan_sync_duration_seconds_bucket{le=\"1.07\",result=\"applied\"} 1",
                "capstan_sync_duration_seconds_bucket{le=\"2.1\",result=\"applied\"} 2",
                "capstan_sync_duration_seconds_bucket{le=\"60.0\",result=\"applied\"} 2",
                "capstan_sync_duration_seconds_bucket{le=\"+Inf\",result=\"applied\"} 2",
                "capstan_sync_duration_seconds_count{result=\"unchanged\"} 1",
            ],
        );
    }

    #[test]
    fn duration_buckets_grow_exponentially_from_5ms_to_60s() {
        let metrics = Metrics::new();
        metrics.observe_sync("applied", Duration::from_secs(1));
        let bounds: Vec<f64> = lines_starting(&metrics, "capstan_sync_duration_seconds_bucket{")
            .iter()
            .filter_map(|line| {
                let le = line.split("le=\"").nth(1)?.split('"').next()?;
                le.parse().ok().filter(|b: &f64| b.is_finite())
            })
            .collect();
        assert_eq!(
            bounds,
            [
                0.005, 0.00978, 0.0191, 0.0374, 0.0732, 0.143, 0.28, 0.548, 1.07, 2.1, 4.1, 8.02,
                15.7, 30.7, 60.0
            ]
        );
        for pair in bounds.windows(2) {
            let factor = pair[1] / pair[0];
            assert!((1.94..1.98).contains(&factor), "{pair:?}");
        }
    }

    #[test]
    fn a_failed_run_also_counts_as_a_failure() {
        let metrics = Metrics::new();
        metrics.observe_sync("failed", Duration::from_secs(3));
        metrics.observe_sync("interrupted", Duration::from_secs(1));
        assert_lines(&metrics, &["capstan_sync_runs_total{result=\"failed\"} 1"]);
        assert_lines(
            &metrics,
            &["capstan_sync_runs_total{result=\"interrupted\"} 1"],
        );
        assert_lines(&metrics, &["capstan_sync_failures_total 1"]);
    }

    #[test]
    fn only_the_newest_applied_commit_is_shown() {
        let clock = ManualClock::new("2025-06-01T12:00:00Z".parse().expect("time"));
        let metrics = Metrics::with_clock(Arc::new(clock.clone()));
        metrics.set_applied_commit("1111111", Some(41), "Load fec v1");
        clock.advance(Duration::from_millis(90_500));
        metrics.set_applied_commit("2222222", None, "Move \"gpu\" nodes to v2");
        let info = lines_starting(&metrics, "capstan_sync_last_applied_info{");
        assert_eq!(
            info,
            [
                "capstan_sync_last_applied_info{revision=\"2222222\",pull_request=\"\",subject=\"Move \\\"gpu\\\" nodes to v2\"} 1"
            ],
            "{}",
            metrics.encode()
        );
        assert_lines(
            &metrics,
            &["capstan_sync_last_applied_timestamp_seconds 1748779290.5"],
        );
    }

    #[test]
    fn reapplying_the_same_commit_keeps_one_series() {
        let metrics = Metrics::new();
        metrics.set_applied_commit("3333333", Some(7), "Pin kernel 6.8");
        metrics.set_applied_commit("3333333", Some(7), "Pin kernel 6.8");
        assert_eq!(
            lines_starting(&metrics, "capstan_sync_last_applied_info{"),
            [
                "capstan_sync_last_applied_info{revision=\"3333333\",pull_request=\"7\",subject=\"Pin kernel 6.8\"} 1"
            ]
        );
    }

    #[test]
    fn drift_counts_by_kind_and_action() {
        let metrics = Metrics::new();
        metrics.add_drift("ConfigMap", "reverted", 2);
        metrics.add_drift("ConfigMap", "reverted", 1);
        metrics.add_drift("Module", "reported", 1);
        assert_lines(
            &metrics,
            &["capstan_drift_objects_total{kind=\"ConfigMap\",action=\"reverted\"} 3"],
        );
        assert_lines(
            &metrics,
            &["capstan_drift_objects_total{kind=\"Module\",action=\"reported\"} 1"],
        );
    }

    #[test]
    fn written_objects_count_by_action() {
        let metrics = Metrics::new();
        metrics.add_objects("created", 4);
        metrics.add_objects("pruned", 1);
        metrics.add_objects("created", 1);
        assert_lines(
            &metrics,
            &["capstan_sync_objects_total{action=\"created\"} 5"],
        );
        assert_lines(
            &metrics,
            &["capstan_sync_objects_total{action=\"pruned\"} 1"],
        );
        assert_lines(
            &metrics,
            &["capstan_sync_objects_total{action=\"configured\"} 0"],
        );
    }

    #[test]
    fn metrics_are_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Metrics>();
    }
}
