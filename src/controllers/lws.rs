//! The LeaderWorkerSet controller (seed 004, KEP-238), as upstream `kubernetes-sigs/lws`
//! runs it: per `LeaderWorkerSet` a leader StatefulSet `<lws>` (one leader pod per group),
//! per leader pod a worker StatefulSet `<lws>-<i>` (its `size - 1` workers, ordinals from
//! 1), and controller revisions that remember which template each group was built from.
//!
//! - [`revision`]: what a revision stores (only `leaderWorkerTemplate` and `networkConfig`),
//!   its key and name, and when two revisions are equal: a spec change outside the two
//!   never rolls a pod, and a controller upgrade that serialises the same spec differently
//!   rolls nothing either.
//! - [`rolling`]: the leader StatefulSet's partition and replicas during a rolling update
//!   under `partition`, `maxUnavailable` and `maxSurge`.
//! - [`status`]: the LWS status counts and its conditions `Available`, `Progressing` and
//!   `UpdateInProgress`.
//! - [`statefulsets`]: the leader StatefulSet capstan applies and the worker StatefulSet it
//!   creates for a leader pod, from the revision the leader pod was made from.
//! - [`group`]: what the pod controller does about one pod: the labels upstream's admission
//!   webhook would have set, the restart policies, and a group's worker StatefulSet.
//! - [`reconciler`] and [`pods`]: the two reconcilers (per LWS, per pod), which only read,
//!   call the decisions above and write.

pub mod facts;
pub mod group;
pub mod pending;
pub mod pods;
pub mod reconciler;
pub mod revision;
pub mod rolling;
pub mod statefulsets;
pub mod status;

/// Upstream's label and annotation names (`api/leaderworkerset/v1/leaderworkerset_types.go`).
pub mod labels {
    /// The LWS a StatefulSet, pod, Service or revision belongs to.
    pub const NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
    /// The revision key a leader StatefulSet, pod or worker StatefulSet was made from.
    pub const REVISION_KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/template-revision-hash";
    /// A pod's index within its group: 0 for the leader.
    pub const WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";
    /// The group a pod or worker StatefulSet belongs to.
    pub const GROUP_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-index";
    /// A hash unique to a group (its namespace and leader pod name).
    pub const GROUP_KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-key";
    /// A pod's subgroup.
    pub const SUBGROUP_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/subgroup-index";
    /// A hash unique to a subgroup.
    pub const SUBGROUP_KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/subgroup-key";
    /// Pods per group, on every pod template.
    pub const SIZE_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/size";
    /// `spec.replicas` the leader StatefulSet was last applied for.
    pub const REPLICAS_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/replicas";
    /// On worker pods: their leader pod's name.
    pub const LEADER_NAME_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/leader-name";
    /// On leader pods: `UniquePerReplica` when each group has its own headless Service.
    pub const SUBDOMAIN_POLICY_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/subdomainPolicy";
    /// On an LWS and its pods: the topology key a group is placed exclusively on.
    pub const EXCLUSIVE_KEY_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/exclusive-topology";
    /// On an LWS and its pods: the topology key a subgroup is placed exclusively on.
    pub const SUBGROUP_EXCLUSIVE_KEY_ANNOTATION: &str =
        "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology";
    /// On pod templates: pods per subgroup.
    pub const SUBGROUP_SIZE_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/subgroup-size";
    /// On pod templates: whether the leader belongs to a subgroup.
    pub const SUBGROUP_POLICY_TYPE_ANNOTATION: &str =
        "leaderworkerset.sigs.k8s.io/subgroup-policy-type";
    /// On worker pod templates: `"true"` when the group's leader pod requests TPUs.
    pub const LEADER_REQUESTS_TPUS_ANNOTATION: &str =
        "leaderworkerset.sigs.k8s.io/leader-requests-tpus";
    /// On an LWS: recreate a group only once all its pods started, whatever the restart policy.
    pub const RECREATE_GROUP_AFTER_START_ANNOTATION: &str =
        "leaderworkerset.sigs.k8s.io/experimental-recreate-group-after-start";
}
