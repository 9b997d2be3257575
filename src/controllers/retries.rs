//! Failed reconciles in a row, per object, for the controllers whose retries back off:
//! [`Retries::failed`] counts one more and says how long to wait ([`retry_delay`]);
//! [`Retries::succeeded`] forgets the object.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Wait after a first failed reconcile; it doubles with each failure in a row.
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest wait after failed reconciles.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The wait before the next attempt after `failures` failed reconciles in a row:
/// [`BACKOFF_MIN`], doubled per failure, at most [`BACKOFF_MAX`].
pub fn retry_delay(failures: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
        .min(BACKOFF_MAX)
}

/// Failed reconciles in a row, by object name.
#[derive(Debug, Default)]
pub struct Retries(Mutex<HashMap<String, u32>>);

impl Retries {
    /// One more failure of `name`: the wait before its next attempt.
    pub fn failed(&self, name: &str) -> Duration {
        let mut failures = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = failures.entry(name.to_string()).or_default();
        *count = count.saturating_add(1);
        retry_delay(*count)
    }

    /// `name` reconciled: its next failure is a first one again.
    pub fn succeeded(&self, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_reconciles_back_off_to_five_minutes() {
        let rows = [
            (1, Duration::from_millis(500)),
            (2, Duration::from_secs(1)),
            (4, Duration::from_secs(4)),
            (10, Duration::from_secs(256)),
            (11, BACKOFF_MAX),
            (u32::MAX, BACKOFF_MAX),
        ];
        for (failures, want) in rows {
            assert_eq!(retry_delay(failures), want, "{failures} failures");
        }
    }

    #[test]
    fn a_success_makes_the_next_failure_a_first_one() {
        let retries = Retries::default();
        let waits: Vec<Duration> = (0..3).map(|_| retries.failed("a")).collect();
        assert_eq!(waits, [500, 1000, 2000].map(Duration::from_millis));
        assert_eq!(retries.failed("b"), BACKOFF_MIN);
        retries.succeeded("a");
        assert_eq!(retries.failed("a"), BACKOFF_MIN);
    }
}
