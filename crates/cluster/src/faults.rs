//! Injected faults for reliability tests: a share of writes fail with 500 or 409, watch
//! streams are dropped, requests are slowed. Deterministic for a given seed.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use super::errors::ApiError;

/// What to inject; all rates are probabilities in [0, 1].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultSettings {
    pub seed: u64,
    pub write_error_rate: f64,
    pub write_conflict_rate: f64,
    pub watch_drop_rate: f64,
    pub latency: Duration,
}

impl FaultSettings {
    /// Parses `seed=7,errors=0.05,conflicts=0.05,watch-drops=0.1,latency=20ms`.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut settings = FaultSettings::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("fault setting {part:?} is not key=value"))?;
            let rate = || -> Result<f64, String> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| format!("fault {key}: {value:?} is not a rate between 0 and 1"))
            };
            match key {
                "seed" => {
                    settings.seed = value
                        .parse()
                        .map_err(|_| format!("fault seed: {value:?} is not a number"))?
                }
                "errors" => settings.write_error_rate = rate()?,
                "conflicts" => settings.write_conflict_rate = rate()?,
                "watch-drops" => settings.watch_drop_rate = rate()?,
                "latency" => {
                    let ms = value
                        .strip_suffix("ms")
                        .and_then(|v| v.parse::<u64>().ok())
                        .ok_or_else(|| format!("fault latency: {value:?} is not like 20ms"))?;
                    settings.latency = Duration::from_millis(ms);
                }
                other => {
                    return Err(format!(
                        "unknown fault {other:?} (known: seed, errors, conflicts, watch-drops, latency)"
                    ));
                }
            }
        }
        Ok(settings)
    }
}

/// The fault injector a server consults on each request.
#[derive(Clone, Default)]
pub struct Faults {
    settings: FaultSettings,
    rng: Option<Arc<Mutex<StdRng>>>,
}

impl Faults {
    pub fn new(settings: FaultSettings) -> Self {
        let active = settings
            != FaultSettings {
                seed: settings.seed,
                ..FaultSettings::default()
            };
        Faults {
            rng: active.then(|| Arc::new(Mutex::new(StdRng::seed_from_u64(settings.seed)))),
            settings,
        }
    }

    fn roll(&self, rate: f64) -> bool {
        match &self.rng {
            Some(rng) if rate > 0.0 => rng
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .random_bool(rate),
            _ => false,
        }
    }

    /// Sleeps the configured latency.
    pub async fn delay(&self) {
        if !self.settings.latency.is_zero() {
            tokio::time::sleep(self.settings.latency).await;
        }
    }

    /// Fails a write with a 500 or a 409, at the configured rates.
    pub fn on_write(&self) -> Result<(), ApiError> {
        if self.roll(self.settings.write_error_rate) {
            return Err(ApiError::internal(
                "injected fault: etcdserver: request timed out",
            ));
        }
        if self.roll(self.settings.write_conflict_rate) {
            return Err(ApiError::stale_injected());
        }
        Ok(())
    }

    /// Whether to cut a watch stream after this event.
    pub fn drop_watch(&self) -> bool {
        self.roll(self.settings.watch_drop_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_reject_nonsense() {
        let s = FaultSettings::parse("seed=7,errors=0.5,latency=20ms").expect("parse");
        assert_eq!(
            (s.seed, s.write_error_rate, s.latency),
            (7, 0.5, Duration::from_millis(20))
        );
        assert!(FaultSettings::parse("errors=2").is_err());
        assert!(FaultSettings::parse("bogus=1").is_err());
    }

    #[test]
    fn the_same_seed_fails_the_same_writes() {
        let run = || {
            let faults = Faults::new(FaultSettings {
                seed: 42,
                write_error_rate: 0.3,
                ..Default::default()
            });
            (0..50)
                .map(|_| faults.on_write().is_err())
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        assert!(first.iter().any(|f| *f) && first.iter().any(|f| !*f));
    }
}
