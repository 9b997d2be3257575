//! Crash points: a testing aid that kills the process with SIGKILL at a named point, so a
//! test can stop capstan exactly between two writes and check that a restart changes no
//! decision (docs/ordered-upgrade.md, "Restarts").
//!
//! `CAPSTAN_CRASH_AT=<point>:<nth>` arms one point: the `nth` time (from 1) this process
//! reaches [`point`] with that name, it kills itself with SIGKILL, as `kill -9` would:
//! no destructor, no flush, no graceful shutdown. The variable is read once; unset (the
//! normal case), a point costs one read of an initialized `OnceLock`.
//!
//! The points, each just before or just after one write to the cluster:
//!
//! | point | where |
//! | --- | --- |
//! | `sync.status.before`, `sync.status.after` | each write of the `GitSync` status (a sync writes it before the commit's objects, "Applying", and after them) |
//! | `sync.record.before`, `sync.record.after` | a sync's `HistoryRecord` (`Sync` or `Rejected`) |
//! | `upgrade.record.before`, `upgrade.record.after` | an upgrade step's `HistoryRecord` (`after`: only when the record is new, before its Events) |
//! | `gate.record.before`, `gate.record.after` | a rollout gate's `HistoryRecord` (an attempt that passed, is retried or failed) |
//! | `gate.pod.before`, `gate.pod.after` | the creation of a gate's check pod |
//! | `upgrade.labels.before`, `upgrade.labels.after` | the version-label controller's write of a node's labels and upgrade annotation |
//! | `nmc.worker-pod.before`, `nmc.worker-pod.after` | the NMC controller's creation of a worker pod |
//! | `nmc.ready-labels.before`, `nmc.ready-labels.after` | the NMC controller's write of a node's ready labels |
//! | `notify.status.before`, `notify.status.after` | the notifications controller's post of a commit status to GitHub (not a write to the cluster: `after` is before capstan wrote down that it posted) |

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms a crash point.
pub const CRASH_AT_VAR: &str = "CAPSTAN_CRASH_AT";

/// Every crash point, for tests that pick one and for the docs.
pub const POINTS: &[&str] = &[
    "sync.status.before",
    "sync.status.after",
    "sync.record.before",
    "sync.record.after",
    "upgrade.record.before",
    "upgrade.record.after",
    "drain.record.before",
    "drain.record.after",
    "gate.record.before",
    "gate.record.after",
    "gate.pod.before",
    "gate.pod.after",
    "upgrade.labels.before",
    "upgrade.labels.after",
    "nmc.worker-pod.before",
    "nmc.worker-pod.after",
    "nmc.ready-labels.before",
    "nmc.ready-labels.after",
    "notify.status.before",
    "notify.status.after",
];

/// The armed point: its name, the hit that kills, and the hits so far.
struct Armed {
    point: String,
    nth: u64,
    hits: AtomicU64,
}

static ARMED: OnceLock<Option<Armed>> = OnceLock::new();

/// Reads `<point>:<nth>`; `None` for anything else (`nth` counts from 1).
fn parse(spec: &str) -> Option<(String, u64)> {
    let (point, nth) = spec.trim().rsplit_once(':')?;
    let nth: u64 = nth.parse().ok().filter(|n| *n >= 1)?;
    (!point.is_empty()).then(|| (point.to_string(), nth))
}

fn armed() -> Option<&'static Armed> {
    ARMED
        .get_or_init(|| {
            let spec = std::env::var(CRASH_AT_VAR).ok()?;
            let Some((point, nth)) = parse(&spec) else {
                tracing::warn!(%spec, "{CRASH_AT_VAR} is not <point>:<nth>; no crash point armed");
                return None;
            };
            if !POINTS.contains(&point.as_str()) {
                tracing::warn!(%point, "{CRASH_AT_VAR} names no known crash point");
            }
            Some(Armed {
                point,
                nth,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Marks the crash point `name`: kills the process with SIGKILL when it is the armed point
/// and this is its `nth` hit; otherwise does nothing.
pub fn point(name: &str) {
    let Some(armed) = armed() else {
        return;
    };
    if armed.point != name {
        return;
    }
    if armed.hits.fetch_add(1, Ordering::SeqCst) + 1 == armed.nth {
        eprintln!("crash point {name}:{}: SIGKILL", armed.nth);
        kill_self();
    }
}

#[cfg(unix)]
fn kill_self() -> ! {
    const SIGKILL: i32 = 9;
    unsafe extern "C" {
        fn getpid() -> i32;
        fn kill(pid: i32, signal: i32) -> i32;
    }
    // SAFETY: kill(2) on our own pid with a constant signal has no memory effects.
    unsafe {
        kill(getpid(), SIGKILL);
    }
    // kill(2) of the caller's own process delivers an unblockable signal before it
    // returns: this only gives the function its type.
    loop {
        std::thread::park();
    }
}

#[cfg(not(unix))]
fn kill_self() -> ! {
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_point_and_a_hit_from_one() {
        let cases = [
            ("upgrade.record.after:3", Some(("upgrade.record.after", 3))),
            (
                " nmc.worker-pod.before:1 ",
                Some(("nmc.worker-pod.before", 1)),
            ),
            ("upgrade.record.after:0", None),
            ("upgrade.record.after", None),
            (":2", None),
            ("sync.status.before:x", None),
        ];
        for (spec, expected) in cases {
            assert_eq!(
                parse(spec),
                expected.map(|(p, n)| (p.to_string(), n)),
                "{spec}"
            );
        }
    }

    #[test]
    fn an_unarmed_point_does_nothing() {
        // The test binary runs without CAPSTAN_CRASH_AT.
        if std::env::var_os(CRASH_AT_VAR).is_none() {
            for name in POINTS {
                point(name);
            }
        }
    }
}
