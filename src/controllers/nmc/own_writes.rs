//! The NMC writes of the NMC reconciler that its NMC cache has not shown yet.
//!
//! The reconciler reads the NMC from the shared cache, as upstream KMM does. The NMC's
//! status is the reconciler's own memory, though: acting on a status from before its own
//! last write would load a module it has just recorded as loaded. So after each write to
//! an NMC the reconciler remembers the resourceVersion the API server answered with, and
//! until the cache shows that version it reads the NMC fresh from the API server instead.
//!
//! | the reconciler's last write | the NMC it decides on |
//! | --- | --- |
//! | none pending | the cached one |
//! | pending, the cache passes that resourceVersion on | the cached one (settled) |
//! | pending, not shown yet | a fresh read; settled if the cache holds what it read |
//! | pending, the NMC is gone | none (forgotten) |
//!
//! A fresh read settles the write when the cache holds the same resourceVersion as the API
//! server: the cache's watch is ordered, so it has passed the write too. resourceVersions
//! are compared for equality only, as the API requires.

use std::collections::HashMap;
use std::sync::Mutex;

/// The resourceVersion of the reconciler's last write to each NMC not shown by the cache.
#[derive(Debug, Default)]
pub struct OwnWrites {
    nodes: Mutex<HashMap<String, String>>,
}

impl OwnWrites {
    /// The reconciler wrote `node`'s NMC and the API server answered with
    /// `resource_version`; `cached` is the resourceVersion the cache holds now.
    pub fn wrote(&self, node: &str, resource_version: Option<&str>, cached: Option<&str>) {
        let mut nodes = self.lock();
        match resource_version {
            // The cache already shows it (its watch event beat the response).
            Some(version) if cached == Some(version) => nodes.remove(node),
            Some(version) => nodes.insert(node.to_string(), version.to_string()),
            // Nothing to wait for: read fresh until a fresh read settles it.
            None => nodes.insert(node.to_string(), String::new()),
        };
    }

    /// The cache passed on `node`'s NMC at `resource_version`.
    pub fn observe(&self, node: &str, resource_version: Option<&str>) {
        let mut nodes = self.lock();
        if nodes.get(node).map(String::as_str) == resource_version.filter(|v| !v.is_empty()) {
            nodes.remove(node);
        }
    }

    /// Whether `node`'s NMC must be read fresh.
    pub fn pending(&self, node: &str) -> bool {
        self.lock().contains_key(node)
    }

    /// A fresh read of `node`'s NMC found `fresh` (None: it is gone) while the cache holds
    /// `cached`.
    pub fn read_fresh(&self, node: &str, fresh: Option<&str>, cached: Option<&str>) {
        if fresh.is_none() || fresh == cached {
            self.lock().remove(node);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.nodes.lock().expect("own writes lock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_decides_until_the_reconciler_writes() {
        let writes = OwnWrites::default();
        assert!(!writes.pending("n"));
        writes.wrote("n", Some("7"), Some("6"));
        assert!(writes.pending("n"));
        assert!(!writes.pending("other"));
    }

    #[test]
    fn the_cache_passing_the_written_version_on_settles_it() {
        let writes = OwnWrites::default();
        writes.wrote("n", Some("7"), Some("6"));
        // An older version still in flight is not the write.
        writes.observe("n", Some("6"));
        assert!(writes.pending("n"));
        writes.observe("n", Some("7"));
        assert!(!writes.pending("n"));
    }

    #[test]
    fn a_later_write_is_the_one_waited_for() {
        let writes = OwnWrites::default();
        writes.wrote("n", Some("7"), Some("6"));
        writes.wrote("n", Some("8"), Some("6"));
        writes.observe("n", Some("7"));
        assert!(writes.pending("n"));
        writes.observe("n", Some("8"));
        assert!(!writes.pending("n"));
    }

    #[test]
    fn a_cache_already_showing_the_write_waits_for_nothing() {
        let writes = OwnWrites::default();
        writes.wrote("n", Some("7"), Some("7"));
        assert!(!writes.pending("n"));
    }

    #[test]
    fn a_fresh_read_settles_when_the_cache_holds_the_same_version() {
        let writes = OwnWrites::default();
        writes.wrote("n", Some("7"), Some("6"));
        // The cache has not caught up with the API server.
        writes.read_fresh("n", Some("9"), Some("6"));
        assert!(writes.pending("n"));
        // Another writer's later version, shown by the cache: it has passed ours too.
        writes.read_fresh("n", Some("9"), Some("9"));
        assert!(!writes.pending("n"));
    }

    #[test]
    fn an_nmc_gone_is_forgotten() {
        let writes = OwnWrites::default();
        writes.wrote("n", Some("7"), Some("6"));
        writes.read_fresh("n", None, Some("6"));
        assert!(!writes.pending("n"));
    }

    #[test]
    fn a_write_answered_without_a_version_reads_fresh_until_settled() {
        let writes = OwnWrites::default();
        writes.wrote("n", None, Some("6"));
        writes.observe("n", Some("6"));
        assert!(writes.pending("n"));
        writes.read_fresh("n", Some("6"), Some("6"));
        assert!(!writes.pending("n"));
    }
}
