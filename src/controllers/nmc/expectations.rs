//! What the NMC reconciler wrote that the worker-pod cache has not shown yet (client-go's
//! "controller expectations").
//!
//! The reconciler reads the worker pods from the cache, which can be behind its own writes: it would create a pod it has just created
//! (409) or delete one it has just deleted (404), and act on a finished pod whose outcome
//! it has already written to the status. So each pod it creates or deletes is recorded
//! here, by node, and the node is not reconciled until the cache shows the write, in the
//! pods it passes on or in its store:
//!
//! | write | shown when the cache has the pod's uid |
//! | --- | --- |
//! | create | in any state (passed on), or in its store |
//! | delete | with `deletionTimestamp` set, or gone from its store |
//!
//! A write the cache never shows (a watch that relisted past it) is given up after
//! [`TIMEOUT`]; the reconcile then reads the cache as it is, and the API server refuses
//! whatever the cache had wrong.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;

/// How long a node waits for the cache to show the reconciler's writes.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The writes not shown yet, by node.
#[derive(Debug, Default)]
pub struct Expectations {
    nodes: Mutex<HashMap<String, Pending>>,
}

/// One node's writes not shown yet: the pods, by uid.
#[derive(Debug)]
struct Pending {
    created: HashMap<String, ObjectRef<Pod>>,
    deleted: HashMap<String, ObjectRef<Pod>>,
    /// When the first write still pending was made.
    since: Instant,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.created.is_empty() && self.deleted.is_empty()
    }
}

/// Whether `pod` is the one with this uid.
fn is(pod: &Pod, uid: &str) -> bool {
    pod.metadata.uid.as_deref() == Some(uid)
}

impl Expectations {
    /// The reconciler created `pod` on `node`.
    pub fn created(&self, node: &str, pod: &Pod, now: Instant) {
        self.pending(node, pod, now, |p| &mut p.created);
    }

    /// The reconciler deleted `pod` on `node`.
    pub fn deleted(&self, node: &str, pod: &Pod, now: Instant) {
        self.pending(node, pod, now, |p| &mut p.deleted);
    }

    fn pending(
        &self,
        node: &str,
        pod: &Pod,
        now: Instant,
        writes: impl FnOnce(&mut Pending) -> &mut HashMap<String, ObjectRef<Pod>>,
    ) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut nodes = self.nodes.lock().expect("expectations lock");
        let pending = nodes.entry(node.to_string()).or_insert_with(|| Pending {
            created: HashMap::new(),
            deleted: HashMap::new(),
            since: now,
        });
        writes(pending).insert(uid, ObjectRef::from_obj(pod));
    }

    /// The cache passed `pod` on; `in_store` tells whether its store holds that pod (that
    /// uid) now. A created pod seen here counts even if it is gone by the next reconcile.
    pub fn observe(&self, pod: &Pod, in_store: bool) {
        let (Some(node), Some(uid)) = (
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            pod.metadata.uid.as_deref(),
        ) else {
            return;
        };
        let mut nodes = self.nodes.lock().expect("expectations lock");
        let Some(pending) = nodes.get_mut(node) else {
            return;
        };
        pending.created.remove(uid);
        if !in_store || pod.metadata.deletion_timestamp.is_some() {
            pending.deleted.remove(uid);
        }
        if pending.is_empty() {
            nodes.remove(node);
        }
    }

    /// How much longer `node` waits for the cache, or None when the cache shows every
    /// write (`cached` looks a pod up in it), or when the wait is over and what was pending
    /// is forgotten.
    ///
    /// The cache's store is read as well as what [`observe`](Self::observe) saw, because
    /// the cache can pass a pod on before the write that made it is recorded here.
    pub fn wait(
        &self,
        node: &str,
        now: Instant,
        cached: impl Fn(&ObjectRef<Pod>) -> Option<Arc<Pod>>,
    ) -> Option<Duration> {
        let mut nodes = self.nodes.lock().expect("expectations lock");
        let pending = nodes.get_mut(node)?;
        pending
            .created
            .retain(|uid, pod| !cached(pod).is_some_and(|held| is(&held, uid)));
        pending.deleted.retain(|uid, pod| {
            cached(pod)
                .is_some_and(|held| is(&held, uid) && held.metadata.deletion_timestamp.is_none())
        });
        let waited = now.saturating_duration_since(pending.since);
        if pending.is_empty() || waited >= TIMEOUT {
            nodes.remove(node);
            return None;
        }
        Some(TIMEOUT - waited)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: &str, uid: &str, deleting: bool) -> Pod {
        let mut pod = json!({
            "metadata": {"name": format!("w-{node}"), "namespace": "ns", "uid": uid},
            "spec": {"nodeName": node, "containers": []},
        });
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(pod).expect("pod")
    }

    #[derive(Clone, Copy, Debug)]
    enum Write {
        Create,
        Delete,
    }

    /// A pod the cache holds or passes on: (uid, deleting).
    type Seen = Option<(&'static str, bool)>;

    #[test]
    fn a_node_waits_until_the_cache_shows_its_writes() {
        use Write::*;
        // The reconciler wrote pod u1 (which the delete rows found running); then the
        // cache passed one pod on (and whether its store held it) and its store holds one.
        let rows: &[(&str, Write, Seen, bool, Seen, bool)] = &[
            // (case, write, passed on, in store, store holds, still waiting)
            ("created, not seen", Create, None, false, None, true),
            (
                "created, passed on",
                Create,
                Some(("u1", false)),
                true,
                None,
                false,
            ),
            (
                "created, in the store only",
                Create,
                None,
                false,
                Some(("u1", false)),
                false,
            ),
            (
                "created, passed on after it was gone",
                Create,
                Some(("u1", false)),
                false,
                None,
                false,
            ),
            (
                "created, another pod seen",
                Create,
                Some(("u0", false)),
                true,
                Some(("u0", false)),
                true,
            ),
            (
                "deleted, store as it was",
                Delete,
                None,
                false,
                Some(("u1", false)),
                true,
            ),
            (
                "deleted, passed on as it was",
                Delete,
                Some(("u1", false)),
                true,
                Some(("u1", false)),
                true,
            ),
            (
                "deleted, passed on terminating",
                Delete,
                Some(("u1", true)),
                true,
                Some(("u1", false)),
                false,
            ),
            (
                "deleted, passed on gone",
                Delete,
                Some(("u1", false)),
                false,
                Some(("u1", false)),
                false,
            ),
            (
                "deleted, terminating in the store",
                Delete,
                None,
                false,
                Some(("u1", true)),
                false,
            ),
            (
                "deleted, gone from the store",
                Delete,
                None,
                false,
                None,
                false,
            ),
            (
                "deleted, another pod in the store",
                Delete,
                None,
                false,
                Some(("u2", false)),
                false,
            ),
        ];
        for (case, write, passed, in_store, held, waiting) in rows {
            let expectations = Expectations::default();
            let now = Instant::now();
            let written = pod("n1", "u1", false);
            match write {
                Create => expectations.created("n1", &written, now),
                Delete => expectations.deleted("n1", &written, now),
            }
            if let Some((uid, deleting)) = passed {
                expectations.observe(&pod("n1", uid, *deleting), *in_store);
            }
            let store = held.map(|(uid, deleting)| Arc::new(pod("n1", uid, deleting)));
            let cached = |_: &ObjectRef<Pod>| store.clone();
            assert_eq!(
                expectations.wait("n1", now, cached).is_some(),
                *waiting,
                "{case}"
            );
        }
    }

    #[test]
    fn nodes_wait_on_their_own_writes_only() {
        let expectations = Expectations::default();
        let now = Instant::now();
        let empty = |_: &ObjectRef<Pod>| None;
        assert_eq!(expectations.wait("n1", now, empty), None, "nothing written");
        expectations.created("n1", &pod("n1", "u1", false), now);
        expectations.created("n2", &pod("n2", "u2", false), now);
        expectations.observe(&pod("n1", "u1", false), true);
        assert_eq!(expectations.wait("n1", now, empty), None);
        assert_eq!(expectations.wait("n2", now, empty), Some(TIMEOUT));
        // A pod seen on the wrong node does not count.
        expectations.observe(&pod("n1", "u2", false), true);
        assert!(expectations.wait("n2", now, empty).is_some());
    }

    #[test]
    fn a_write_the_cache_never_shows_is_given_up_after_the_timeout() {
        let expectations = Expectations::default();
        let empty = |_: &ObjectRef<Pod>| None;
        let start = Instant::now();
        expectations.created("n1", &pod("n1", "u1", false), start);
        let later = start + Duration::from_secs(20);
        expectations.created("n1", &pod("n1", "u2", false), later);
        assert_eq!(
            expectations.wait("n1", later, empty),
            Some(TIMEOUT - Duration::from_secs(20)),
            "the wait runs from the first write pending"
        );
        assert_eq!(expectations.wait("n1", start + TIMEOUT, empty), None);
        assert_eq!(
            expectations.wait("n1", start + TIMEOUT, empty),
            None,
            "forgotten"
        );
    }
}
