//! Time, injected: controllers and the embedded cluster ask a [`Clock`] for "now" so
//! tests can control it.

use std::sync::{Arc, Mutex, PoisonError};

use jiff::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    pub fn new(start: Timestamp) -> Self {
        ManualClock(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let span = jiff::SignedDuration::try_from(by).unwrap_or(jiff::SignedDuration::MAX);
        *now = now.checked_add(span).unwrap_or(*now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Kubernetes `metav1.Time`: RFC 3339 in UTC with whole seconds.
pub fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Kubernetes `metav1.MicroTime`: RFC 3339 in UTC with microseconds.
pub fn rfc3339_micros(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Parses a `metav1.Time` or `MicroTime`.
pub fn parse_time(s: &str) -> Option<Timestamp> {
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_time_formats() {
        let t: Timestamp = "2026-11-20T22:35:42.123456789Z".parse().expect("time");
        assert_eq!(rfc3339(t), "2026-11-20T22:35:42Z");
        assert_eq!(rfc3339_micros(t), "2026-11-20T22:35:42.123456Z");
        assert_eq!(
            parse_time("2026-11-20T22:35:42Z").map(rfc3339).as_deref(),
            Some("2026-11-20T22:35:42Z")
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new("2026-01-01T00:00:00Z".parse().expect("time"));
        clock.advance(std::time::Duration::from_secs(90));
        assert_eq!(rfc3339(clock.now()), "2026-01-01T00:01:30Z");
    }
}
