//! How often the drain says that a PodDisruptionBudget refuses an eviction. The drain
//! retries a refused eviction every 5 s, as `kubectl drain` does, for as long as the budget
//! holds (the nodekeeper forces the pod only after `PDBForceDrainTimeout`): a line per
//! retry would bury the log. [`Refusals`] decides what is said:
//!
//! | event | known refusals of the pod | last line about the node | line |
//! | --- | --- | --- | --- |
//! | refused | none, or another reason | - | [`RefusalLine::Refused`] |
//! | refused | the same reason | under a minute ago | nothing |
//! | refused | the same reason | a minute ago or more | [`RefusalLine::StillRefused`] (every refused pod of the node) |
//! | evicted | some | - | [`RefusalLine::Evicted`] |
//! | evicted | none | - | nothing |
//!
//! Pods that leave the drain without an eviction (forced by the nodekeeper, deleted) and
//! the nodes whose drain ended are forgotten ([`Refusals::keep_only`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;

/// At most one summary per node this often while its pods stay refused.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// How often a refused eviction is tried again (kubectl drain waits 5 s).
pub const RETRY_EVERY: Duration = Duration::from_secs(5);

/// A pod, by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for PodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A line to log about refused evictions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusalLine {
    /// A pod refused for a reason not said yet.
    Refused {
        /// The draining node.
        node: String,
        /// The pod.
        pod: PodKey,
        /// The API server's reason.
        reason: String,
    },
    /// Refusals go on: how many pods of the node are refused, since the first refusal of
    /// any of them.
    StillRefused {
        /// The draining node.
        node: String,
        /// How many of its pods are refused.
        pods: usize,
        /// How long ago the first of them was refused.
        since: Duration,
    },
    /// A pod refused before was evicted at last.
    Evicted {
        /// The draining node.
        node: String,
        /// The pod.
        pod: PodKey,
        /// How long after its first refusal.
        after: Duration,
    },
}

impl fmt::Display for RefusalLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalLine::Refused { node, pod, reason } => write!(
                f,
                "refused eviction of {pod} from {node}: {reason}; retrying every {} s",
                RETRY_EVERY.as_secs()
            ),
            RefusalLine::StillRefused { node, pods, since } => {
                let noun = if *pods == 1 { "pod" } else { "pods" };
                write!(
                    f,
                    "still refused: {pods} {noun} of {node}, first refused {} ago",
                    rounded(*since)
                )
            }
            RefusalLine::Evicted { node, pod, after } => write!(
                f,
                "evicted {pod} from {node}, {} after its first refusal",
                rounded(*after)
            ),
        }
    }
}

/// `2m 5s`: whole seconds, in jiff's friendly format.
fn rounded(duration: Duration) -> String {
    let seconds = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
    format!("{:#}", jiff::SignedDuration::from_secs(seconds))
}

/// The refusals of one node's pods.
#[derive(Clone, Debug)]
struct NodeRefusals {
    /// Each refused pod: the reason last said, and when it was first refused.
    pods: BTreeMap<PodKey, (String, Timestamp)>,
    /// When a line about the node was last said.
    last_line: Timestamp,
}

/// What has been said about refused evictions, per node: decides whether a refusal or an
/// eviction is worth a line.
#[derive(Clone, Debug, Default)]
pub struct Refusals {
    nodes: BTreeMap<String, NodeRefusals>,
}

impl Refusals {
    /// A budget refused the eviction of `pod` from `node` at `now`, for `reason`: the line
    /// to log, if any.
    pub fn refused(
        &mut self,
        node: &str,
        pod: &PodKey,
        reason: &str,
        now: Timestamp,
    ) -> Option<RefusalLine> {
        let refusals = self
            .nodes
            .entry(node.to_string())
            .or_insert_with(|| NodeRefusals {
                pods: BTreeMap::new(),
                last_line: now,
            });
        let same = match refusals.pods.get_mut(pod) {
            Some((said, _)) if said == reason => true,
            Some((said, _)) => {
                *said = reason.to_string();
                false
            }
            None => {
                refusals.pods.insert(pod.clone(), (reason.to_string(), now));
                false
            }
        };
        if !same {
            refusals.last_line = now;
            return Some(RefusalLine::Refused {
                node: node.to_string(),
                pod: pod.clone(),
                reason: reason.to_string(),
            });
        }
        if elapsed(refusals.last_line, now) < SUMMARY_EVERY {
            return None;
        }
        refusals.last_line = now;
        let first = refusals
            .pods
            .values()
            .map(|(_, at)| *at)
            .min()
            .unwrap_or(now);
        Some(RefusalLine::StillRefused {
            node: node.to_string(),
            pods: refusals.pods.len(),
            since: elapsed(first, now),
        })
    }

    /// `pod` was evicted from `node` at `now`: a line when it had been refused.
    pub fn evicted(&mut self, node: &str, pod: &PodKey, now: Timestamp) -> Option<RefusalLine> {
        let refusals = self.nodes.get_mut(node)?;
        let (_, first) = refusals.pods.remove(pod)?;
        if refusals.pods.is_empty() {
            self.nodes.remove(node);
        }
        Some(RefusalLine::Evicted {
            node: node.to_string(),
            pod: pod.clone(),
            after: elapsed(first, now),
        })
    }

    /// Forgets the refusals of `node`'s pods that are not in `left`: they left the drain
    /// another way (forced, deleted), or the drain is over (`left` empty).
    pub fn keep_only(&mut self, node: &str, left: &[PodKey]) {
        if let Some(refusals) = self.nodes.get_mut(node) {
            refusals.pods.retain(|pod, _| left.contains(pod));
            if refusals.pods.is_empty() {
                self.nodes.remove(node);
            }
        }
    }
}

/// The time from `from` to `to`; zero when `to` is earlier.
fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodKey {
        PodKey {
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + second).unwrap()
    }

    const PDB: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

    /// What is said, and when, for a sequence of evictions on worker-2.
    enum Step {
        Refused(&'static str, &'static str, i64),
        Evicted(&'static str, i64),
        KeepOnly(&'static [&'static str]),
    }

    /// A case's name, its steps, and the line each step says.
    type Case = (&'static str, Vec<Step>, Vec<Option<&'static str>>);

    #[test]
    fn decision_table() {
        use Step::*;
        // (name, steps, the line each step says)
        let cases: Vec<Case> = vec![
            (
                "the first refusal is said, the retries every 5 s are not",
                vec![
                    Refused("web", PDB, 0),
                    Refused("web", PDB, 5),
                    Refused("web", PDB, 55),
                ],
                vec![
                    Some(
                        "refused eviction of apps/web from worker-2: Cannot evict pod as it \
                         would violate the pod's disruption budget.; retrying every 5 s",
                    ),
                    None,
                    None,
                ],
            ),
            (
                "a summary a minute after the last line, then a minute after that",
                vec![
                    Refused("web", PDB, 0),
                    Refused("web", PDB, 60),
                    Refused("web", PDB, 65),
                    Refused("web", PDB, 119),
                    Refused("web", PDB, 120),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some("still refused: 1 pod of worker-2, first refused 1m ago"),
                    None,
                    None,
                    Some("still refused: 1 pod of worker-2, first refused 2m ago"),
                ],
            ),
            (
                "one summary for every refused pod of the node, from the first refusal",
                vec![
                    Refused("web", PDB, 0),
                    Refused("db", PDB, 30),
                    Refused("cache", PDB, 40),
                    Refused("web", PDB, 95),
                    Refused("db", PDB, 95),
                    Refused("cache", PDB, 100),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some("refused eviction of apps/db from worker-2: {PDB}; retrying every 5 s"),
                    Some("refused eviction of apps/cache from worker-2: {PDB}; retrying every 5 s"),
                    None,
                    None,
                    Some("still refused: 3 pods of worker-2, first refused 1m 40s ago"),
                ],
            ),
            (
                "another reason for the same pod is said at once",
                vec![
                    Refused("web", PDB, 0),
                    Refused(
                        "web",
                        "The disruption budget web is still being processed",
                        10,
                    ),
                    Refused(
                        "web",
                        "The disruption budget web is still being processed",
                        15,
                    ),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some(
                        "refused eviction of apps/web from worker-2: The disruption budget web \
                         is still being processed; retrying every 5 s",
                    ),
                    None,
                ],
            ),
            (
                "the eviction that goes through at last is said; one never refused is not",
                vec![
                    Refused("web", PDB, 0),
                    Evicted("web", 125),
                    Evicted("db", 126),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some("evicted apps/web from worker-2, 2m 5s after its first refusal"),
                    None,
                ],
            ),
            (
                "a pod refused again after its eviction was said is new again",
                vec![
                    Refused("web", PDB, 0),
                    Evicted("web", 10),
                    Refused("web", PDB, 20),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some("evicted apps/web from worker-2, 10s after its first refusal"),
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                ],
            ),
            (
                "a pod forced by the nodekeeper is forgotten, not said evicted",
                vec![
                    Refused("web", PDB, 0),
                    Refused("db", PDB, 0),
                    KeepOnly(&["db"]),
                    Evicted("web", 70),
                    Refused("db", PDB, 70),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    Some("refused eviction of apps/db from worker-2: {PDB}; retrying every 5 s"),
                    None,
                    None,
                    Some("still refused: 1 pod of worker-2, first refused 1m 10s ago"),
                ],
            ),
            (
                "a drain that ended forgets its node",
                vec![
                    Refused("web", PDB, 0),
                    KeepOnly(&[]),
                    Refused("web", PDB, 5),
                ],
                vec![
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                    None,
                    Some("refused eviction of apps/web from worker-2: {PDB}; retrying every 5 s"),
                ],
            ),
        ];
        for (name, steps, expected) in cases {
            let mut refusals = Refusals::default();
            let said: Vec<Option<String>> = steps
                .iter()
                .map(|step| match step {
                    Refused(p, reason, second) => {
                        refusals.refused("worker-2", &pod(p), reason, at(*second))
                    }
                    Evicted(p, second) => refusals.evicted("worker-2", &pod(p), at(*second)),
                    KeepOnly(left) => {
                        let left: Vec<PodKey> = left.iter().map(|p| pod(p)).collect();
                        refusals.keep_only("worker-2", &left);
                        None
                    }
                })
                .map(|line| line.map(|line| line.to_string()))
                .collect();
            let expected: Vec<Option<String>> = expected
                .iter()
                .map(|line| line.map(|line| line.replace("{PDB}", PDB)))
                .collect();
            assert_eq!(said, expected, "{name}");
        }
    }

    #[test]
    fn nodes_are_summarised_apart() {
        let mut refusals = Refusals::default();
        assert!(
            refusals
                .refused("worker-1", &pod("a"), PDB, at(0))
                .is_some()
        );
        assert!(
            refusals
                .refused("worker-2", &pod("b"), PDB, at(50))
                .is_some()
        );
        let one = refusals.refused("worker-1", &pod("a"), PDB, at(60));
        let two = refusals.refused("worker-2", &pod("b"), PDB, at(60));
        assert_eq!(
            one.map(|l| l.to_string()).as_deref(),
            Some("still refused: 1 pod of worker-1, first refused 1m ago")
        );
        assert_eq!(two, None);
    }
}
