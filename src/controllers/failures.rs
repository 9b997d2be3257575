//! Worker failures of one node, kept on its NMC so that retries back off across restarts
//! and the Module's status can say what fails where.
//!
//! Upstream KMM deletes a failed worker pod and creates the next one at once, so a broken
//! image makes a pod a second per node forever. capstan records each failure in the NMC
//! annotation [`FAILURES_ANNOTATION`] (a JSON map from `<namespace>/<name>` of the Module to
//! the last failure) and waits [`backoff`] before the next attempt: 10 s, doubled per
//! failure, at most 5 minutes, as the kubelet backs off a crashing container. A success
//! clears the entry. The annotation is schema-free, so the NMC stays upstream's kind.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use capstan_api::labels::ModuleKey;
use capstan_api::nmc::NodeModulesConfig;

/// The NMC annotation holding the failures.
pub const FAILURES_ANNOTATION: &str = "capstan.dev/worker-failures";

/// The wait after the first failure.
pub const FIRST_RETRY: Duration = Duration::from_secs(10);
/// The longest wait between attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// The last failure of one Module's worker pods on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerFailure {
    /// `Load` or `Unload`.
    pub action: String,
    /// The worker's one-line reason.
    pub message: String,
    /// Failures in a row.
    pub attempts: u32,
    /// When the last one was read (RFC 3339).
    pub last_failure: String,
    /// The UID of the pod that failed last: a pod is counted once, however often a cache
    /// that has not seen its deletion shows it again.
    #[serde(default)]
    pub pod_uid: String,
}

/// Every failure on one node, by Module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerFailures(BTreeMap<String, WorkerFailure>);

impl WorkerFailures {
    /// The failures recorded on `nmc`; an unreadable annotation reads as none.
    pub fn of(nmc: &NodeModulesConfig) -> WorkerFailures {
        nmc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FAILURES_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default()
    }

    /// The last failure of `module`, if its last attempt failed.
    pub fn get(&self, module: &ModuleKey) -> Option<&WorkerFailure> {
        self.0.get(&module.to_string())
    }

    /// The Modules with a failure.
    pub fn modules(&self) -> Vec<ModuleKey> {
        self.0
            .keys()
            .filter_map(|key| {
                let (namespace, name) = key.split_once('/')?;
                ModuleKey::new(namespace, name).ok()
            })
            .collect()
    }

    /// Records the failure of `module`'s `action` by pod `pod_uid`, one more in a row (a
    /// pod already recorded changes nothing).
    pub fn record(
        &mut self,
        module: &ModuleKey,
        action: &str,
        message: &str,
        now: &str,
        pod_uid: &str,
    ) {
        let entry = self.0.entry(module.to_string()).or_default();
        if !pod_uid.is_empty() && entry.pod_uid == pod_uid {
            return;
        }
        entry.pod_uid = pod_uid.to_string();
        entry.attempts = if entry.action == action {
            entry.attempts.saturating_add(1)
        } else {
            1
        };
        entry.action = action.to_string();
        entry.message = message.to_string();
        entry.last_failure = now.to_string();
    }

    /// Forgets `module`'s failures (its worker succeeded, or it left the node).
    pub fn clear(&mut self, module: &ModuleKey) {
        self.0.remove(&module.to_string());
    }

    /// Keeps only the failures of `modules`.
    pub fn retain(&mut self, keep: impl Fn(&ModuleKey) -> bool) {
        self.0.retain(|key, _| {
            key.split_once('/')
                .and_then(|(ns, name)| ModuleKey::new(ns, name).ok())
                .is_some_and(|key| keep(&key))
        });
    }

    /// True when nothing failed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The annotation's value: `None` (remove it) when empty.
    pub fn annotation(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(&self.0).unwrap_or_default())
    }

    /// How long after its last failure `module` may be tried again; zero without one.
    pub fn wait(&self, module: &ModuleKey, now: jiff::Timestamp) -> Duration {
        let Some(failure) = self.get(module) else {
            return Duration::ZERO;
        };
        let Ok(at) = failure.last_failure.parse::<jiff::Timestamp>() else {
            return Duration::ZERO;
        };
        let due = at
            .checked_add(backoff(failure.attempts))
            .unwrap_or(jiff::Timestamp::MAX);
        let left = now.duration_until(due);
        left.try_into().unwrap_or(Duration::ZERO)
    }
}

/// The wait before the attempt after `attempts` failures in a row.
pub fn backoff(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(MAX_RETRY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let cases = [
            (0, 10),
            (1, 10),
            (2, 20),
            (3, 40),
            (5, 160),
            (6, 300),
            (40, 300),
        ];
        for (attempts, seconds) in cases {
            assert_eq!(
                backoff(attempts),
                Duration::from_secs(seconds),
                "{attempts}"
            );
        }
    }

    #[test]
    fn failures_count_in_a_row_and_clear() {
        let key = ModuleKey::new("kmm", "a").expect("key");
        let mut failures = WorkerFailures::default();
        failures.record(&key, "Load", "boom", "2026-01-01T00:00:00Z", "pod-1");
        // The same pod seen again (a stale cache) is not another failure.
        failures.record(&key, "Load", "boom", "2026-01-01T00:00:05Z", "pod-1");
        assert_eq!(failures.get(&key).map(|f| f.attempts), Some(1));
        failures.record(&key, "Load", "boom again", "2026-01-01T00:00:10Z", "pod-2");
        assert_eq!(failures.get(&key).map(|f| f.attempts), Some(2));
        // Another action starts a new count.
        failures.record(&key, "Unload", "busy", "2026-01-01T00:00:20Z", "pod-3");
        assert_eq!(failures.get(&key).map(|f| f.attempts), Some(1));
        let now: jiff::Timestamp = "2026-01-01T00:00:25Z".parse().expect("time");
        assert_eq!(failures.wait(&key, now), Duration::from_secs(5));
        let later: jiff::Timestamp = "2026-01-01T00:01:00Z".parse().expect("time");
        assert_eq!(failures.wait(&key, later), Duration::ZERO);
        let text = failures.annotation().expect("annotation");
        let mut nmc = NodeModulesConfig::new("n", Default::default());
        nmc.metadata.annotations = Some([(FAILURES_ANNOTATION.to_string(), text)].into());
        assert_eq!(WorkerFailures::of(&nmc), failures);
        assert_eq!(WorkerFailures::of(&nmc).modules(), vec![key.clone()]);
        failures.clear(&key);
        assert_eq!(failures.annotation(), None);
    }
}
