//! What the LWS pod controller does about one pod of a LeaderWorkerSet (upstream
//! `pkg/controllers/pod_controller.go` and the pod labelling of `pkg/webhooks/pod_webhook.go`).
//!
//! capstan runs no admission webhook, so the labels upstream's pod webhook sets when a pod
//! is created are added right after: `group-index` and `group-key` on a leader pod (its
//! StatefulSet's template is shared by every group, so cannot carry them), `worker-index`
//! on a worker pod, and under a subgroup policy `subgroup-index` and `subgroup-key` (see
//! [`sub_group_index`]). Everything the controller reads of a pod allows for a pod not
//! labelled yet: the group and worker index come from the pod's name as upstream's webhook
//! derives them.
//!
//! [`decide`], first match wins:
//!
//! | # | pod                                                   | decision |
//! |---|-------------------------------------------------------|----------|
//! | 1 | lacks a label the webhook would have set              | [`Decision::Label`] |
//! | 2 | policy `RecreateGroupOnPodRestart` or `RecreateGroupAfterStart`, a container restarted or the pod is being deleted, the group has a pending pod and the policy (or the LWS's annotation) says after start | go on at 5 |
//! | 3 | as 2 but not pending; a worker whose leader is gone, has another revision key, or whose controller is not the leader's current worker StatefulSet (nor the leader pod) | go on at 5 |
//! | 4 | as 2 but not pending; the leader (the pod itself or the worker's) not being deleted | [`Decision::RecreateGroup`] (Foreground) |
//! | 4' | as 4 but the leader is already being deleted       | [`Decision::Nothing`] |
//! | 5 | a worker                                              | [`Decision::Nothing`] |
//! | 6 | a leader carrying the `leader-name` annotation        | [`Decision::MisplacedLeader`] |
//! | 7 | a leader: `UniquePerReplica` wants its Service unless the leader is being deleted; then: being deleted, size 1, `LeaderReady` and not ready → no worker StatefulSet; its worker StatefulSet exists → nothing more; no revision with its key → wait; else create it | [`Decision::Leader`] |

use std::collections::BTreeMap;

use capstan_api::lws::{RestartPolicy, StartupPolicy};

/// A leader pod's own facts, also read when deciding about one of its workers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderFacts {
    /// The pod's name, `<lws>-<group>`.
    pub name: String,
    /// Its `template-revision-hash`.
    pub key: String,
    /// It has a deletion timestamp.
    pub deleting: bool,
}

/// Who a worker pod's controller is, checked against its leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerOwnership {
    /// The leader pod's current worker StatefulSet, or the leader pod itself.
    CurrentGroup,
    /// Anything else: a worker StatefulSet of a replaced leader, or no controller.
    Stale,
}

/// What the pod is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A leader pod (`worker-index` 0).
    Leader(LeaderSide),
    /// A worker pod of a group.
    Worker(WorkerSide),
}

/// A leader pod's facts beyond [`LeaderFacts`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderSide {
    /// Name, key and deletion of the pod itself.
    pub pod: LeaderFacts,
    /// It carries the `leader-name` annotation of worker pods: the StatefulSet start
    /// ordinal is not honoured and the "leader" is a worker of the leader StatefulSet.
    pub misplaced: bool,
    /// Its `Ready` condition is True.
    pub ready: bool,
    /// A revision with its key exists (looked up only when its worker StatefulSet does
    /// not).
    pub revision_found: bool,
    /// Its worker StatefulSet (named as the pod) exists.
    pub worker_set_exists: bool,
}

/// A worker pod's facts beyond its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSide {
    /// Its `template-revision-hash`.
    pub key: String,
    /// Its leader pod, if it exists.
    pub leader: Option<LeaderFacts>,
    /// Who controls the pod.
    pub ownership: WorkerOwnership,
}

/// Everything [`decide`] reads about one pod of an LWS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// Labels upstream's webhook would have set that the pod lacks.
    pub missing_labels: BTreeMap<String, String>,
    /// The LWS's restart policy.
    pub policy: RestartPolicy,
    /// The LWS carries `experimental-recreate-group-after-start`.
    pub recreate_after_start: bool,
    /// A container or init container restarted while the pod is Running or Pending
    /// (upstream `ContainerRestarted`), or the pod is being deleted (`PodDeleted`).
    pub restarted_or_deleted: bool,
    /// The group has fewer pods than its size, or one of them is Pending.
    pub group_pending: bool,
    /// The live LWS's group size.
    pub size: i32,
    /// The live LWS's startup policy.
    pub startup: StartupPolicy,
    /// Each group has its own headless Service.
    pub unique_per_replica: bool,
    /// Leader or worker.
    pub role: Role,
}

/// What a leader pod needs beyond labels and restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderActions {
    /// Create the group's headless Service (named as the leader pod) if it is absent.
    pub service: bool,
    /// The group's worker StatefulSet.
    pub worker_set: WorkerSet,
}

/// The worker StatefulSet of a leader pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkerSet {
    /// None needed now (being deleted, size 1, not ready under `LeaderReady`, or it
    /// exists): never patched once created.
    #[default]
    Leave,
    /// No revision with the leader pod's key yet: look again shortly.
    WaitForRevision,
    /// Create it from the revision with the leader pod's key.
    Create,
}

/// The pod controller's decision about one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Add these labels; the change brings the pod back.
    Label(BTreeMap<String, String>),
    /// Delete the leader pod with Foreground propagation: its worker StatefulSet goes
    /// first, then the leader StatefulSet recreates the whole group.
    RecreateGroup {
        /// The leader pod to delete.
        leader: String,
        /// The pod whose restart or deletion asked for it.
        cause: String,
    },
    /// A leader pod that carries the `leader-name` annotation: warn, create nothing.
    MisplacedLeader,
    /// What a leader pod needs.
    Leader(LeaderActions),
    /// Nothing to do.
    Nothing,
}

/// Decides about one pod `name`; see the table in the module documentation.
pub fn decide(name: &str, facts: &PodFacts) -> Decision {
    if !facts.missing_labels.is_empty() {
        return Decision::Label(facts.missing_labels.clone());
    }
    if let Some(decision) = restart(name, facts) {
        return decision;
    }
    let Role::Leader(leader) = &facts.role else {
        return Decision::Nothing;
    };
    if leader.misplaced {
        return Decision::MisplacedLeader;
    }
    let worker_set = if leader.pod.deleting
        || facts.size == 1
        || (facts.startup == StartupPolicy::LeaderReady && !leader.ready)
        || leader.worker_set_exists
    {
        WorkerSet::Leave
    } else if !leader.revision_found {
        WorkerSet::WaitForRevision
    } else {
        WorkerSet::Create
    };
    // A Service made for a leader being deleted would be owned by the old pod's uid: the
    // garbage collector removes it after its replacement, of the same name, found it there.
    Decision::Leader(LeaderActions {
        service: facts.unique_per_replica && !leader.pod.deleting,
        worker_set,
    })
}

/// Upstream `handleRestartPolicy`: `Some` when the restart policy settles the pod's fate.
fn restart(name: &str, facts: &PodFacts) -> Option<Decision> {
    let recreates = matches!(
        facts.policy,
        RestartPolicy::RecreateGroupOnPodRestart | RestartPolicy::RecreateGroupAfterStart
    );
    if !recreates || !facts.restarted_or_deleted {
        return None;
    }
    let after_start =
        facts.policy == RestartPolicy::RecreateGroupAfterStart || facts.recreate_after_start;
    if facts.group_pending && after_start {
        return None;
    }
    let leader = match &facts.role {
        Role::Leader(leader) => &leader.pod,
        Role::Worker(worker) => {
            let leader = worker.leader.as_ref()?;
            if leader.key != worker.key || worker.ownership != WorkerOwnership::CurrentGroup {
                return None;
            }
            leader
        }
    };
    if leader.deleting {
        return Some(Decision::Nothing);
    }
    Some(Decision::RecreateGroup {
        leader: leader.name.clone(),
        cause: name.to_string(),
    })
}

/// The group index and worker index upstream's webhook reads off a pod's name
/// (`GetParentNameAndOrdinal`): `<parent>-<ordinal>`.
pub fn parent_and_ordinal(pod: &str) -> Option<(&str, i32)> {
    let (parent, ordinal) = pod.rsplit_once('-')?;
    if ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((parent, ordinal.parse().ok()?))
}

/// The subgroup of worker `worker` in a group of `size` pods split into subgroups of
/// `sub_group_size` (upstream `getSubGroupIndex`): when the workers alone fill whole
/// subgroups but the group does not, the leader is the extra pod of subgroup 0 and the
/// workers count from 1; otherwise from the leader's 0. `sub_group_size` is positive.
pub fn sub_group_index(size: i32, sub_group_size: i32, worker: i32) -> i32 {
    if (size - 1) % sub_group_size == 0 && size % sub_group_size != 0 {
        (worker - 1) / sub_group_size
    } else {
        worker / sub_group_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(name: &str) -> LeaderFacts {
        LeaderFacts {
            name: name.to_string(),
            key: "k1".to_string(),
            deleting: false,
        }
    }

    fn leader_pod() -> PodFacts {
        PodFacts {
            missing_labels: BTreeMap::new(),
            policy: RestartPolicy::RecreateGroupOnPodRestart,
            recreate_after_start: false,
            restarted_or_deleted: false,
            group_pending: false,
            size: 3,
            startup: StartupPolicy::LeaderCreated,
            unique_per_replica: false,
            role: Role::Leader(LeaderSide {
                pod: leader("lws-0"),
                misplaced: false,
                ready: false,
                revision_found: true,
                worker_set_exists: false,
            }),
        }
    }

    fn worker_pod() -> PodFacts {
        PodFacts {
            role: Role::Worker(WorkerSide {
                key: "k1".to_string(),
                leader: Some(leader("lws-0")),
                ownership: WorkerOwnership::CurrentGroup,
            }),
            ..leader_pod()
        }
    }

    fn with_leader(facts: PodFacts, change: impl FnOnce(&mut LeaderSide)) -> PodFacts {
        let mut facts = facts;
        if let Role::Leader(side) = &mut facts.role {
            change(side);
        }
        facts
    }

    fn with_worker(facts: PodFacts, change: impl FnOnce(&mut WorkerSide)) -> PodFacts {
        let mut facts = facts;
        if let Role::Worker(side) = &mut facts.role {
            change(side);
        }
        facts
    }

    fn recreate(cause: &str) -> Decision {
        Decision::RecreateGroup {
            leader: "lws-0".to_string(),
            cause: cause.to_string(),
        }
    }

    fn leader_actions(service: bool, worker_set: WorkerSet) -> Decision {
        Decision::Leader(LeaderActions {
            service,
            worker_set,
        })
    }

    #[test]
    fn decisions_follow_the_table() {
        let restarted = |f: PodFacts| PodFacts {
            restarted_or_deleted: true,
            ..f
        };
        let cases: Vec<(&str, &str, PodFacts, Decision)> = vec![
            (
                "1 unlabelled leader",
                "lws-0",
                PodFacts {
                    missing_labels: BTreeMap::from([(
                        "leaderworkerset.sigs.k8s.io/group-index".to_string(),
                        "0".to_string(),
                    )]),
                    ..restarted(leader_pod())
                },
                Decision::Label(BTreeMap::from([(
                    "leaderworkerset.sigs.k8s.io/group-index".to_string(),
                    "0".to_string(),
                )])),
            ),
            (
                "4 restarted leader deletes itself",
                "lws-0",
                restarted(leader_pod()),
                recreate("lws-0"),
            ),
            (
                "4 failed worker deletes its leader",
                "lws-0-1",
                restarted(worker_pod()),
                recreate("lws-0-1"),
            ),
            (
                "4 under RecreateGroupAfterStart once every pod started",
                "lws-0-1",
                PodFacts {
                    policy: RestartPolicy::RecreateGroupAfterStart,
                    ..restarted(worker_pod())
                },
                recreate("lws-0-1"),
            ),
            (
                "2 RecreateGroupAfterStart with a pending pod keeps the leader",
                "lws-0-1",
                PodFacts {
                    policy: RestartPolicy::RecreateGroupAfterStart,
                    group_pending: true,
                    ..restarted(worker_pod())
                },
                Decision::Nothing,
            ),
            (
                "2 the LWS annotation with a pending pod keeps the leader",
                "lws-0-1",
                PodFacts {
                    recreate_after_start: true,
                    group_pending: true,
                    ..restarted(worker_pod())
                },
                Decision::Nothing,
            ),
            (
                "2 RecreateGroupOnPodRestart ignores pending pods",
                "lws-0-1",
                PodFacts {
                    group_pending: true,
                    ..restarted(worker_pod())
                },
                recreate("lws-0-1"),
            ),
            (
                "policy None keeps the leader",
                "lws-0-1",
                PodFacts {
                    policy: RestartPolicy::None,
                    ..restarted(worker_pod())
                },
                Decision::Nothing,
            ),
            (
                "the deprecated Default policy is None",
                "lws-0-1",
                PodFacts {
                    policy: RestartPolicy::Default,
                    ..restarted(worker_pod())
                },
                Decision::Nothing,
            ),
            (
                "3 worker whose leader is gone",
                "lws-0-1",
                with_worker(restarted(worker_pod()), |w| w.leader = None),
                Decision::Nothing,
            ),
            (
                "3 worker of another revision than its leader",
                "lws-0-1",
                with_worker(restarted(worker_pod()), |w| w.key = "k0".to_string()),
                Decision::Nothing,
            ),
            (
                "3 worker of a replaced leader's StatefulSet",
                "lws-0-1",
                with_worker(restarted(worker_pod()), |w| {
                    w.ownership = WorkerOwnership::Stale
                }),
                Decision::Nothing,
            ),
            (
                "4' the leader is already being deleted",
                "lws-0-1",
                with_worker(restarted(worker_pod()), |w| {
                    if let Some(leader) = &mut w.leader {
                        leader.deleting = true;
                    }
                }),
                Decision::Nothing,
            ),
            (
                "5 a healthy worker",
                "lws-0-1",
                worker_pod(),
                Decision::Nothing,
            ),
            (
                "6 a leader with the leader-name annotation",
                "lws-0",
                with_leader(leader_pod(), |l| l.misplaced = true),
                Decision::MisplacedLeader,
            ),
            (
                "7 a new leader gets its worker StatefulSet",
                "lws-0",
                leader_pod(),
                leader_actions(false, WorkerSet::Create),
            ),
            (
                "7 UniquePerReplica adds its Service",
                "lws-0",
                PodFacts {
                    unique_per_replica: true,
                    ..leader_pod()
                },
                leader_actions(true, WorkerSet::Create),
            ),
            (
                "7 a leader being deleted gets no worker StatefulSet",
                "lws-0",
                with_leader(leader_pod(), |l| l.pod.deleting = true),
                leader_actions(false, WorkerSet::Leave),
            ),
            (
                "7 a leader being deleted gets no Service under UniquePerReplica",
                "lws-0",
                with_leader(
                    PodFacts {
                        policy: RestartPolicy::None,
                        unique_per_replica: true,
                        ..leader_pod()
                    },
                    |l| l.pod.deleting = true,
                ),
                leader_actions(false, WorkerSet::Leave),
            ),
            (
                "7 size 1 needs none",
                "lws-0",
                PodFacts {
                    size: 1,
                    ..leader_pod()
                },
                leader_actions(false, WorkerSet::Leave),
            ),
            (
                "7 LeaderReady waits for the leader",
                "lws-0",
                PodFacts {
                    startup: StartupPolicy::LeaderReady,
                    ..leader_pod()
                },
                leader_actions(false, WorkerSet::Leave),
            ),
            (
                "7 LeaderReady with a ready leader",
                "lws-0",
                with_leader(
                    PodFacts {
                        startup: StartupPolicy::LeaderReady,
                        ..leader_pod()
                    },
                    |l| l.ready = true,
                ),
                leader_actions(false, WorkerSet::Create),
            ),
            (
                "7 no revision with the leader's key yet",
                "lws-0",
                with_leader(leader_pod(), |l| l.revision_found = false),
                leader_actions(false, WorkerSet::WaitForRevision),
            ),
            (
                "7 an existing worker StatefulSet is never touched",
                "lws-0",
                with_leader(leader_pod(), |l| l.worker_set_exists = true),
                leader_actions(false, WorkerSet::Leave),
            ),
            (
                "7 an existing worker StatefulSet needs no revision looked up",
                "lws-0",
                with_leader(leader_pod(), |l| {
                    l.worker_set_exists = true;
                    l.revision_found = false;
                }),
                leader_actions(false, WorkerSet::Leave),
            ),
        ];
        for (row, name, facts, expected) in cases {
            assert_eq!(decide(name, &facts), expected, "{row}");
        }
    }

    /// Upstream's `TestGetSubGroupIndex`, and whole groups of 4 and 5.
    #[test]
    fn sub_group_index_table() {
        let cases = [
            ("even number of pods", 4, 2, 2, 1),
            (
                "odd number of pods, the first subgroup has an extra pod",
                5,
                2,
                2,
                0,
            ),
            ("subgroup size 1, worker 1", 3, 1, 1, 1),
            ("subgroup size 1, worker 2", 3, 1, 2, 2),
        ];
        for (name, size, sub_group_size, worker, expected) in cases {
            assert_eq!(
                sub_group_index(size, sub_group_size, worker),
                expected,
                "{name}"
            );
        }
        let group = |size: i32, sub_group_size: i32| {
            (1..size)
                .map(|worker| sub_group_index(size, sub_group_size, worker))
                .collect::<Vec<_>>()
        };
        assert_eq!(group(4, 2), [0, 1, 1], "the leader completes subgroup 0");
        assert_eq!(
            group(5, 2),
            [0, 0, 1, 1],
            "the leader is subgroup 0's extra pod"
        );
    }

    #[test]
    fn ordinals_come_from_the_name() {
        assert_eq!(parent_and_ordinal("vllm-3"), Some(("vllm", 3)));
        assert_eq!(parent_and_ordinal("vllm-3-12"), Some(("vllm-3", 12)));
        assert_eq!(parent_and_ordinal("vllm"), None);
        assert_eq!(parent_and_ordinal("vllm-x"), None);
        assert_eq!(parent_and_ordinal("vllm-"), None);
    }
}
