//! What head does to each LeaderWorkerSet's groups, decided as capstan's LWS controller
//! (`src/controllers/lws/`) will decide it once head is applied.
//!
//! Both plans take the same decision ([`planned`]); they differ only in what runs before
//! head ([`Current`]): offline, base's LWS on its own revision ([`Current::declared`]);
//! live, the cluster's LWS on the revision its leader StatefulSet names, found as the
//! controller finds it ([`Current::in_cluster`]).
//!
//! Groups roll only when the LWS gets a new controller revision, and whether it does is the
//! controller's own test ([`revision::makes_new_revision`]): when `leaderWorkerTemplate` or
//! `networkConfig` changes. `replicas`, `rolloutStrategy`, `startupPolicy` and metadata
//! are outside every revision (KEP-238): changing only them recreates no group. Keys and
//! names of revisions are never compared, since a revision adopted from an older leader
//! StatefulSet keeps that StatefulSet's key.
//!
//! The order of a rolling update is not re-derived here: [`rollout`] runs the controller's
//! own decision ([`rolling::decide`]) step by step, every recreated group becoming ready
//! at once, and records which groups each step recreates.

use std::collections::{BTreeMap, BTreeSet};

use capstan_api::LeaderWorkerSet;
use capstan_api::LeaderWorkerSetSpec;
use capstan_api::lws::RestartPolicy;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::{Resource as _, ResourceExt as _};

use super::model::{
    LeaderWorkerSetAction, LeaderWorkerSetChange, ObjectAction, ObjectChange, PlannedRollout,
    ReplicasChange,
};
use crate::controllers::lws::facts::{group_index, is_leader, revision_key};
use crate::controllers::lws::labels::{
    EXCLUSIVE_KEY_ANNOTATION, NAME_LABEL, SUBGROUP_EXCLUSIVE_KEY_ANNOTATION,
};
use crate::controllers::lws::revision;
use crate::controllers::lws::rolling::{self, GroupState, LeaderSet};
use crate::sync::manifests::Manifest;

/// Whether a manifest or object of `api_version` and `kind` is a LeaderWorkerSet.
pub fn is_lws(api_version: &str, kind: &str) -> bool {
    api_version == LeaderWorkerSet::api_version(&()) && kind == LeaderWorkerSet::kind(&())
}

/// The LeaderWorkerSet a manifest declares; `None` for another kind (a loaded manifest of
/// this kind always decodes: the manifest rules decode it).
pub fn declared(manifest: &Manifest) -> Option<LeaderWorkerSet> {
    if !is_lws(&manifest.api_version, &manifest.kind) {
        return None;
    }
    serde_json::from_value(manifest.object.clone()).ok()
}

/// A LeaderWorkerSet as it runs before head: base's (offline), or the cluster's (live).
pub struct Current<'a> {
    /// The LWS. Live, its labels and annotations are only those head declares: others
    /// belong to other field managers and head does not change them.
    pub lws: &'a LeaderWorkerSet,
    /// The revision its groups run: the one its leader StatefulSet's
    /// `template-revision-hash` names. `None`: the revision of `lws`'s own spec.
    pub revision: Option<&'a ControllerRevision>,
    /// Its groups: the leader StatefulSet's `spec.replicas`, else `lws`'s `replicas`.
    pub groups: i32,
}

impl<'a> Current<'a> {
    /// Base's LWS as a sync of base leaves it once rolled out: every group on the revision
    /// of its spec.
    pub fn declared(lws: &'a LeaderWorkerSet) -> Current<'a> {
        Current {
            lws,
            revision: None,
            groups: lws.spec.replicas,
        }
    }

    /// The cluster's LWS `lws` with its `leader` StatefulSet and the revisions listed with
    /// its name label: its groups run the revision of `lws` the leader StatefulSet's key
    /// names, as the LWS controller finds it ([`revision::find`]: `lws`'s own revisions
    /// only, never its StatefulSets', which carry the same labels). Without a leader
    /// StatefulSet or that revision, the controller makes one of the live spec, so the
    /// groups count as running `lws`'s own.
    pub fn in_cluster(
        lws: &'a LeaderWorkerSet,
        leader: Option<&StatefulSet>,
        revisions: &'a [ControllerRevision],
    ) -> Current<'a> {
        let key = leader.map(revision_key).unwrap_or_default();
        let groups = leader
            .and_then(|set| set.spec.as_ref()?.replicas)
            .unwrap_or(lws.spec.replicas);
        Current {
            lws,
            revision: revision::find(revisions, lws, key),
            groups,
        }
    }
}

/// A LeaderWorkerSet change, and what the reader should know about it.
#[derive(Debug, PartialEq, Eq)]
pub struct Planned {
    /// The change.
    pub change: LeaderWorkerSetChange,
    /// Why its rollout cannot be planned, or pods it recreates outside any rollout.
    pub warnings: Vec<String>,
}

/// What head's `head` does to the LWS as it runs (`current`; `None` when it does not
/// exist): created, rolled (with the order), changed without rollout, or `None` when
/// nothing the plan shows changes.
///
/// | current | head's revision vs current's | changed fields | result |
/// | --- | --- | --- | --- |
/// | none | - | - | `created` |
/// | some | neither equal nor set-matching | any | `rolls`, with [`rollout`] |
/// | some | equal or set-matching | some | `noRollout` |
/// | some | equal or set-matching | none | nothing |
pub fn planned(head: &LeaderWorkerSet, current: Option<&Current<'_>>) -> Option<Planned> {
    let (namespace, name) = identity(head);
    let Some(current) = current else {
        return Some(Planned {
            change: LeaderWorkerSetChange {
                namespace,
                name,
                change: LeaderWorkerSetAction::Created,
                replicas: ReplicasChange {
                    from: None,
                    to: Some(head.spec.replicas),
                },
                changed_fields: Vec::new(),
                rollout: None,
            },
            warnings: Vec::new(),
        });
    };
    let changed_fields = changed_fields(current.lws, head);
    let new_revision = rolls(head, current);
    if !new_revision && changed_fields.is_empty() {
        return None;
    }
    let mut warnings = Vec::new();
    let (change, rollout) = if new_revision {
        let rollout = match rollout(&name, &head.spec, current.groups) {
            Ok(rollout) => Some(rollout),
            Err(error) => {
                warnings.push(format!(
                    "LeaderWorkerSet {namespace}/{name}: its rolling update cannot be planned \
                     ({error}); the LWS controller cannot roll it either"
                ));
                None
            }
        };
        (LeaderWorkerSetAction::Rolls, rollout)
    } else {
        warnings.extend(placement_warning(current.lws, head));
        (LeaderWorkerSetAction::NoRollout, None)
    };
    Some(Planned {
        change: LeaderWorkerSetChange {
            namespace,
            name,
            change,
            replicas: ReplicasChange {
                from: Some(current.lws.spec.replicas),
                to: Some(head.spec.replicas),
            },
            changed_fields,
            rollout,
        },
        warnings,
    })
}

/// Whether applying `head` makes a new revision over the one the groups run: the LWS
/// controller's own test ([`revision::makes_new_revision`]).
fn rolls(head: &LeaderWorkerSet, current: &Current<'_>) -> bool {
    match current.revision {
        Some(running) => revision::makes_new_revision(head, running),
        None => revision::makes_new_revision(head, &revision::new_revision(current.lws, None, 1)),
    }
}

/// A LeaderWorkerSet that left the repository and is pruned.
pub fn deleted(namespace: &str, name: &str, replicas: Option<i32>) -> LeaderWorkerSetChange {
    LeaderWorkerSetChange {
        namespace: namespace.to_string(),
        name: name.to_string(),
        change: LeaderWorkerSetAction::Deleted,
        replicas: ReplicasChange {
            from: replicas,
            to: None,
        },
        changed_fields: Vec::new(),
        rollout: None,
    }
}

/// The LeaderWorkerSets among `objects` that are pruned.
pub fn pruned(objects: &[ObjectChange]) -> impl Iterator<Item = &ObjectChange> {
    objects.iter().filter(|object| {
        object.action == ObjectAction::Prune && is_lws(&object.id.api_version, &object.id.kind)
    })
}

/// Head against base: every LWS head creates or changes, in head's order, then those
/// pruned (among `objects`, the plan's object changes); and the warnings.
pub fn offline(
    base: &[Manifest],
    head: &[Manifest],
    objects: &[ObjectChange],
) -> (Vec<LeaderWorkerSetChange>, Vec<String>) {
    let before: BTreeMap<_, LeaderWorkerSet> = base
        .iter()
        .filter_map(|manifest| Some((manifest.id(), declared(manifest)?)))
        .collect();
    let (mut changes, mut warnings) = (Vec::new(), Vec::new());
    for manifest in head {
        let Some(lws) = declared(manifest) else {
            continue;
        };
        let current = before.get(&manifest.id()).map(Current::declared);
        if let Some(planned) = planned(&lws, current.as_ref()) {
            changes.push(planned.change);
            warnings.extend(planned.warnings);
        }
    }
    for object in pruned(objects) {
        let replicas = before.get(&object.id.id()).map(|lws| lws.spec.replicas);
        let namespace = object.id.namespace.as_deref().unwrap_or_default();
        changes.push(deleted(namespace, &object.id.name, replicas));
    }
    (changes, warnings)
}

/// `live` with only the labels and annotations `head` declares: what applying head can
/// change of its metadata.
pub fn as_declared(live: &LeaderWorkerSet, head: &LeaderWorkerSet) -> LeaderWorkerSet {
    let mut declared = live.clone();
    let keep = |live: &mut Option<BTreeMap<String, String>>,
                head: &Option<BTreeMap<String, String>>| {
        let head = head.as_ref();
        if let Some(entries) = live {
            entries.retain(|key, _| head.is_some_and(|head| head.contains_key(key)));
        }
        if live.as_ref().is_some_and(BTreeMap::is_empty) {
            *live = None;
        }
    };
    keep(&mut declared.metadata.labels, &head.metadata.labels);
    keep(
        &mut declared.metadata.annotations,
        &head.metadata.annotations,
    );
    declared
}

/// The fields of `head` that differ from `before`, in the order the spec declares them.
fn changed_fields(before: &LeaderWorkerSet, head: &LeaderWorkerSet) -> Vec<String> {
    let (old, new) = (&before.spec, &head.spec);
    let entries = |map: &Option<BTreeMap<String, String>>| map.clone().unwrap_or_default();
    let metadata = entries(&before.metadata.labels) != entries(&head.metadata.labels)
        || entries(&before.metadata.annotations) != entries(&head.metadata.annotations);
    [
        ("replicas", old.replicas != new.replicas),
        (
            "leaderWorkerTemplate",
            old.leader_worker_template != new.leader_worker_template,
        ),
        (
            "rolloutStrategy",
            old.rollout_strategy != new.rollout_strategy,
        ),
        ("startupPolicy", old.startup_policy != new.startup_policy),
        (
            "networkConfig",
            old.network_config_or_default() != new.network_config_or_default(),
        ),
        ("metadata", metadata),
    ]
    .into_iter()
    .filter(|(_, changed)| *changed)
    .map(|(field, _)| field.to_string())
    .collect()
}

/// The annotations the leader StatefulSet copies from the LWS into its pod template
/// (`src/controllers/lws/statefulsets.rs`): changing one changes the leader pods without a
/// revision, so the StatefulSet itself replaces them, whatever the LWS's rollout strategy.
const PLACEMENT_ANNOTATIONS: [&str; 2] =
    [EXCLUSIVE_KEY_ANNOTATION, SUBGROUP_EXCLUSIVE_KEY_ANNOTATION];

/// The warning for a change that makes no revision but changes the leader pods' template.
fn placement_warning(before: &LeaderWorkerSet, head: &LeaderWorkerSet) -> Option<String> {
    let annotation = |lws: &LeaderWorkerSet, key: &str| lws.annotations().get(key).cloned();
    let changed: Vec<&str> = PLACEMENT_ANNOTATIONS
        .into_iter()
        .filter(|key| annotation(before, key) != annotation(head, key))
        .collect();
    if changed.is_empty() {
        return None;
    }
    let (namespace, name) = identity(head);
    Some(format!(
        "LeaderWorkerSet {namespace}/{name}: annotation {} changes the leader pods' template \
         without a new revision: the leader StatefulSet replaces every leader pod, and with it \
         its group, outside the LWS rolling update",
        changed.join(", ")
    ))
}

fn identity(lws: &LeaderWorkerSet) -> (String, String) {
    (lws.namespace().unwrap_or_default(), lws.name_any())
}

/// One group of the leader StatefulSet while the simulated rollout runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    /// On the old revision, ready.
    Old,
    /// Being recreated (or created) on head's revision: not ready yet.
    Rolling,
    /// On head's revision and ready.
    Rolled,
}

impl Group {
    fn state(self) -> GroupState {
        match self {
            Group::Old => GroupState {
                ready: true,
                updated: false,
            },
            Group::Rolling => GroupState {
                ready: false,
                updated: true,
            },
            Group::Rolled => GroupState {
                ready: true,
                updated: true,
            },
        }
    }
}

/// The leader StatefulSet as the simulated LWS controller leaves it.
struct LeaderStatefulSet {
    /// `spec.replicas` of head (R).
    replicas: i32,
    /// One entry per pod of the StatefulSet.
    groups: Vec<Group>,
    partition: i32,
    /// Groups `replicas` adds.
    new_groups: BTreeSet<i32>,
    /// Groups at or above `replicas` recreated or created on head's revision.
    surge_groups: BTreeSet<i32>,
}

impl LeaderStatefulSet {
    /// The StatefulSet of `existing` groups on the old revision, at rest.
    fn at_rest(replicas: i32, existing: i32) -> LeaderStatefulSet {
        LeaderStatefulSet {
            replicas,
            groups: vec![Group::Old; usize::try_from(existing).unwrap_or(0)],
            partition: 0,
            new_groups: BTreeSet::new(),
            surge_groups: BTreeSet::new(),
        }
    }

    fn leader_set(&self) -> LeaderSet {
        LeaderSet {
            replicas: self.len(),
            partition: self.partition,
            replicas_annotation: Some(self.replicas),
        }
    }

    fn len(&self) -> i32 {
        i32::try_from(self.groups.len()).unwrap_or(i32::MAX)
    }

    fn states(&self) -> Vec<GroupState> {
        self.groups.iter().map(|group| group.state()).collect()
    }

    /// What the StatefulSet controller does with a new partition and size: pods below the
    /// partition keep their revision (a new one there is made from the old revision), pods
    /// at or above it are recreated on the new one, pods beyond the size are deleted.
    fn apply(&mut self, partition: i32, size: i32, existing: i32) {
        let size = usize::try_from(size).unwrap_or(0);
        while self.groups.len() < size {
            let index = self.len();
            if index >= existing && index < self.replicas {
                self.new_groups.insert(index);
            }
            self.groups.push(if index >= partition {
                Group::Rolling
            } else {
                Group::Old
            });
        }
        self.groups.truncate(size);
        let from = usize::try_from(partition).unwrap_or(0);
        for group in self.groups.iter_mut().skip(from) {
            if *group == Group::Old {
                *group = Group::Rolling;
            }
        }
        self.partition = partition;
        for (index, group) in (0..).zip(&self.groups) {
            if index >= self.replicas && *group != Group::Old {
                self.surge_groups.insert(index);
            }
        }
    }

    /// The groups being recreated, from the highest index down.
    fn rolling(&self) -> Vec<i32> {
        let mut rolling: Vec<i32> = (0..)
            .zip(&self.groups)
            .filter(|(_, group)| **group == Group::Rolling)
            .map(|(index, _)| index)
            .collect();
        rolling.reverse();
        rolling
    }
}

/// The rolling update of `spec` (head's) over `existing` groups on the old revision, as
/// the LWS controller of `src/controllers/lws/rolling.rs` runs it: its decision applied
/// until the partition and size stop moving, the groups it recreated then made ready
/// together (one step of the order), again until no group is left to recreate.
///
/// Fails when `maxSurge` or `maxUnavailable` is not a number or percentage, or (a bug)
/// when the decision never settles.
pub fn rollout(
    name: &str,
    spec: &LeaderWorkerSetSpec,
    existing: i32,
) -> Result<PlannedRollout, String> {
    let budget = rolling::budget(spec)?;
    let existing = existing.max(0);
    let mut set = LeaderStatefulSet::at_rest(spec.replicas, existing);
    let first = rolling::decide(name, spec, Some(&set.leader_set()), &set.states(), true)?;
    set.apply(first.partition, first.replicas, existing);
    let mut order = Vec::new();
    // Each decision moves the partition or size, or completes a step; both are bounded.
    let limit = 4 * (existing + spec.replicas.max(0) + budget.max_surge.max(0)) + 8;
    for _ in 0..limit {
        let next = rolling::decide(name, spec, Some(&set.leader_set()), &set.states(), false)?;
        if (next.partition, next.replicas) != (set.partition, set.len()) {
            set.apply(next.partition, next.replicas, existing);
            continue;
        }
        let step = set.rolling();
        if step.is_empty() {
            let groups = (0..)
                .zip(&set.groups)
                .filter(|(index, group)| *index < spec.replicas && **group == Group::Rolled)
                .count();
            let surge_remains = set.len() > spec.replicas;
            return Ok(PlannedRollout {
                groups: i32::try_from(groups).unwrap_or(i32::MAX),
                order,
                partition: spec.rollout_strategy.rolling_update_configuration.partition,
                max_unavailable: budget.max_unavailable,
                max_surge: budget.max_surge,
                new_groups: set.new_groups.into_iter().collect(),
                surge_groups: set.surge_groups.into_iter().collect(),
                surge_remains,
            });
        }
        for group in &mut set.groups {
            if *group == Group::Rolling {
                *group = Group::Rolled;
            }
        }
        order.push(step);
    }
    Err(format!(
        "the rolling update of {name} does not settle after {limit} decisions"
    ))
}

/// Whether evicting a pod recreates its whole group: a leader's worker StatefulSet is
/// owned by the leader pod, so it goes with it; a worker takes its group along under
/// `RecreateGroupOnPodRestart` and `RecreateGroupAfterStart` (the pod controller deletes
/// the leader of a group whose pod is being deleted), but under `None` only itself.
///
/// | pod | restart policy | group recreated |
/// | --- | --- | --- |
/// | leader | any | yes |
/// | worker | `RecreateGroupOnPodRestart`, `RecreateGroupAfterStart` | yes |
/// | worker | `None` (or its old spelling `Default`) | no |
pub fn recreates_group(leader: bool, policy: RestartPolicy) -> bool {
    leader
        || matches!(
            policy,
            RestartPolicy::RecreateGroupOnPodRestart | RestartPolicy::RecreateGroupAfterStart
        )
}

/// The groups evicting `pods` recreates, `namespace/name group <i>`, by LWS then index.
/// `policies` holds the restart policy of each LWS (`(namespace, name)`); one missing is
/// read as the default, `RecreateGroupOnPodRestart`.
pub fn recreated_groups(
    pods: &[&Pod],
    policies: &BTreeMap<(String, String), RestartPolicy>,
) -> Vec<String> {
    let groups: BTreeSet<(String, String, i32)> = pods
        .iter()
        .filter_map(|pod| {
            let name = pod.labels().get(NAME_LABEL)?.clone();
            let namespace = pod.namespace().unwrap_or_default();
            let index = group_index(pod)?;
            let policy = policies
                .get(&(namespace.clone(), name.clone()))
                .copied()
                .unwrap_or_default();
            recreates_group(is_leader(pod), policy).then_some((namespace, name, index))
        })
        .collect();
    groups
        .into_iter()
        .map(|(namespace, name, index)| format!("{namespace}/{name} group {index}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::lws::labels::REVISION_KEY_LABEL;
    use serde_json::{Value, json};

    fn lws(spec: Value) -> LeaderWorkerSet {
        let mut value = json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "vllm", "namespace": "inference"},
            "spec": {"replicas": 4, "leaderWorkerTemplate": {"size": 2, "workerTemplate": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm:v1"}]}}}},
        });
        if let (Some(into), Value::Object(from)) = (value["spec"].as_object_mut(), spec) {
            into.extend(from);
        }
        serde_json::from_value(value).expect("a LeaderWorkerSet")
    }

    fn strategy(max_unavailable: Value, max_surge: Value, partition: i32) -> Value {
        json!({"rollingUpdateConfiguration": {
            "maxUnavailable": max_unavailable, "maxSurge": max_surge, "partition": partition}})
    }

    /// The rollout order of `replicas` groups of head over `existing`, under a strategy.
    fn order(existing: i32, replicas: i32, rollout_strategy: Value) -> PlannedRollout {
        let head = lws(json!({"replicas": replicas, "rolloutStrategy": rollout_strategy}));
        rollout("vllm", &head.spec, existing).expect("a rollout")
    }

    #[test]
    fn the_rollout_order_is_the_controllers() {
        // (existing, replicas, maxUnavailable, maxSurge, partition) -> steps, surge groups,
        // whether they remain. The cases are upstream's integration stories
        // (test/integration/controllers/leaderworkerset_test.go), as the facts file lists
        // them.
        type Case = (
            i32,
            i32,
            Value,
            Value,
            i32,
            &'static [&'static [i32]],
            &'static [i32],
            bool,
        );
        let cases: Vec<Case> = vec![
            // :631, one group at a time from the top.
            (
                4,
                4,
                json!(1),
                json!(0),
                0,
                &[&[3], &[2], &[1], &[0]],
                &[],
                false,
            ),
            // :729, two at a time.
            (4, 4, json!(2), json!(0), 0, &[&[3, 2], &[1, 0]], &[], false),
            // :807, maxUnavailable beyond replicas: everything at once.
            (4, 4, json!(10), json!(0), 0, &[&[3, 2, 1, 0]], &[], false),
            // Percentages: 50% of 4 down is 2; 30% of 4 is 1.2, down to 1.
            (
                4,
                4,
                json!("50%"),
                json!(0),
                0,
                &[&[3, 2], &[1, 0]],
                &[],
                false,
            ),
            (
                4,
                4,
                json!("30%"),
                json!(0),
                0,
                &[&[3], &[2], &[1], &[0]],
                &[],
                false,
            ),
            // :1088, a surge group first, then one at a time.
            (
                4,
                4,
                json!(0),
                json!(1),
                0,
                &[&[4], &[3], &[2], &[1], &[0]],
                &[4],
                false,
            ),
            // :1207, the surge group rolls with the first group.
            (
                4,
                4,
                json!(1),
                json!(1),
                0,
                &[&[4, 3], &[2, 1], &[0]],
                &[4],
                false,
            ),
            // :1326, two surge groups and two groups, then the last two.
            (
                4,
                4,
                json!(2),
                json!(2),
                0,
                &[&[5, 4, 3, 2], &[1, 0]],
                &[4, 5],
                false,
            ),
            // :1539, maxSurge capped at replicas: one surge group of 2.
            (2, 2, json!(1), json!(4), 0, &[&[2, 1], &[0]], &[2], false),
            // :856, replicas 4 to 6 with the template: the new groups first.
            (
                4,
                6,
                json!(1),
                json!(0),
                0,
                &[&[5, 4], &[3], &[2], &[1], &[0]],
                &[],
                false,
            ),
            // :1008, replicas 6 to 3 with the template: the extra groups go first.
            (6, 3, json!(1), json!(0), 0, &[&[2], &[1], &[0]], &[], false),
            // :1473, replicas 6 to 3 with maxSurge 2: groups 3 and 4 roll as surge.
            (
                6,
                3,
                json!(1),
                json!(2),
                0,
                &[&[4, 3, 2], &[1, 0]],
                &[3, 4],
                false,
            ),
            // :2394, a partition holds groups 0 to 3.
            (6, 6, json!(1), json!(0), 4, &[&[5], &[4]], &[], false),
            // :2490, a partition with a surge: the surge group stays while groups are held.
            (3, 3, json!(1), json!(1), 2, &[&[3, 2]], &[3], true),
            // A partition at replicas rolls nothing.
            (4, 4, json!(1), json!(0), 4, &[], &[], false),
        ];
        for (existing, replicas, unavailable, surge, partition, steps, surge_groups, remains) in
            cases
        {
            let case = format!(
                "{existing} -> {replicas}, maxUnavailable {unavailable}, maxSurge {surge}, \
                 partition {partition}"
            );
            let planned = order(existing, replicas, strategy(unavailable, surge, partition));
            let steps: Vec<Vec<i32>> = steps.iter().map(|step| step.to_vec()).collect();
            assert_eq!(planned.order, steps, "{case}");
            assert_eq!(planned.surge_groups, surge_groups, "{case}");
            assert_eq!(planned.surge_remains, remains, "{case}");
            assert_eq!(planned.partition, partition, "{case}");
            assert_eq!(
                planned.groups,
                replicas - partition.min(replicas),
                "{case}: groups on head's revision"
            );
        }
    }

    #[test]
    fn new_groups_are_those_replicas_adds() {
        let planned = order(4, 6, strategy(json!(1), json!(0), 0));
        assert_eq!(planned.new_groups, [4, 5]);
        assert_eq!((planned.max_unavailable, planned.max_surge), (1, 0));
        // Below the partition a new group starts on the old revision, as the StatefulSet
        // creates it.
        let held = order(2, 4, strategy(json!(1), json!(0), 3));
        assert_eq!((held.new_groups, held.order), (vec![2, 3], vec![vec![3]]));
    }

    #[test]
    fn a_bad_percentage_cannot_be_planned() {
        let head = lws(json!({"rolloutStrategy": strategy(json!("half"), json!(0), 0)}));
        let error = rollout("vllm", &head.spec, 4).expect_err("no rollout");
        assert!(error.starts_with("maxUnavailable: "), "{error}");
        let current = lws(json!({}));
        let current = Current {
            lws: &current,
            revision: None,
            groups: 4,
        };
        let head = lws(json!({
            "rolloutStrategy": strategy(json!("half"), json!(0), 0),
            "leaderWorkerTemplate": {"size": 3, "workerTemplate": {}},
        }));
        let planned = planned(&head, Some(&current)).expect("a change");
        assert_eq!(planned.change.change, LeaderWorkerSetAction::Rolls);
        assert_eq!(planned.change.rollout, None);
        assert!(
            planned.warnings[0].contains("its rolling update cannot be planned"),
            "{:?}",
            planned.warnings
        );
    }

    #[test]
    fn what_each_change_does() {
        let base = lws(json!({}));
        let current = Current {
            lws: &base,
            revision: None,
            groups: 4,
        };
        let template = json!({"size": 2, "workerTemplate": {
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm:v2"}]}}});
        // (head's spec, change, changed fields); `None`: nothing to show.
        let cases: Vec<(Value, Option<LeaderWorkerSetAction>, &[&str])> = vec![
            (json!({}), None, &[]),
            (
                json!({"leaderWorkerTemplate": template}),
                Some(LeaderWorkerSetAction::Rolls),
                &["leaderWorkerTemplate"],
            ),
            (
                json!({"networkConfig": {"subdomainPolicy": "UniquePerReplica"}}),
                Some(LeaderWorkerSetAction::Rolls),
                &["networkConfig"],
            ),
            // An absent networkConfig is Shared: writing it out changes nothing.
            (
                json!({"networkConfig": {"subdomainPolicy": "Shared"}}),
                None,
                &[],
            ),
            (
                json!({"replicas": 6}),
                Some(LeaderWorkerSetAction::NoRollout),
                &["replicas"],
            ),
            (
                json!({"replicas": 2, "startupPolicy": "LeaderReady",
                       "rolloutStrategy": strategy(json!(2), json!(1), 1)}),
                Some(LeaderWorkerSetAction::NoRollout),
                &["replicas", "rolloutStrategy", "startupPolicy"],
            ),
            (
                json!({"replicas": 6, "leaderWorkerTemplate": template}),
                Some(LeaderWorkerSetAction::Rolls),
                &["replicas", "leaderWorkerTemplate"],
            ),
        ];
        for (spec, action, fields) in cases {
            let head = lws(spec.clone());
            let planned = planned(&head, Some(&current));
            assert_eq!(planned.as_ref().map(|p| p.change.change), action, "{spec}");
            let found = planned.map(|p| p.change.changed_fields).unwrap_or_default();
            assert_eq!(found, fields, "{spec}");
        }
        let created = super::planned(&base, None).expect("created");
        assert_eq!(created.change.change, LeaderWorkerSetAction::Created);
        assert_eq!(
            created.change.replicas,
            ReplicasChange {
                from: None,
                to: Some(4)
            }
        );
    }

    #[test]
    fn the_running_revision_decides_not_the_keys() {
        let base = lws(json!({}));
        // The leader StatefulSet's revision carries a key adopted from an older controller:
        // same content, another key and name.
        let mut adopted = revision::new_revision(&base, Some("template-hash"), 3);
        adopted.metadata.name = Some("vllm-template-hash-3".into());
        let current = Current {
            lws: &base,
            revision: Some(&adopted),
            groups: 4,
        };
        assert_eq!(planned(&base, Some(&current)), None);
        // Its stored patch written by another serialisation still matches.
        let mut reserialised = adopted.clone();
        if let Some(data) = &mut reserialised.data {
            data.0["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["creationTimestamp"] =
                Value::Null;
        }
        let current = Current {
            revision: Some(&reserialised),
            ..current
        };
        assert_eq!(planned(&base, Some(&current)), None);
        // Groups still on an older template roll even when head equals the live spec.
        let older = lws(json!({"leaderWorkerTemplate": {"size": 3, "workerTemplate": {}}}));
        let running = revision::new_revision(&older, None, 1);
        let current = Current {
            revision: Some(&running),
            ..current
        };
        let planned = planned(&base, Some(&current)).expect("a rollout");
        assert_eq!(planned.change.change, LeaderWorkerSetAction::Rolls);
        assert!(planned.change.changed_fields.is_empty());
    }

    /// A revision the StatefulSet controller made for StatefulSet `set` of vllm: its pod
    /// template's labels, vllm's name and `key` among them, numbered `number` as the
    /// LWS's own are.
    fn stateful_set_revision(set: &str, key: &str, number: i64) -> ControllerRevision {
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("{set}-6b5bc896b9"), "namespace": "inference",
                "labels": {NAME_LABEL: "vllm", REVISION_KEY_LABEL: key,
                           "controller.kubernetes.io/hash": "6b5bc896b9"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": set, "uid": format!("uid-statefulset-{set}"), "controller": true}],
            },
            "data": {"spec": {"template": {"$patch": "replace"}}},
            "revision": number,
        }))
        .expect("a ControllerRevision")
    }

    /// The leader StatefulSet vllm: `replicas` groups made from revision key `key`.
    fn leader(key: &str, replicas: i32) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "vllm", "namespace": "inference",
                         "labels": {NAME_LABEL: "vllm", REVISION_KEY_LABEL: key}},
            "spec": {"replicas": replicas, "selector": {}, "serviceName": "vllm",
                     "template": {}},
        }))
        .expect("a StatefulSet")
    }

    /// Offline and live take one decision: for a cluster running base (its groups on the
    /// revision the LWS made of base, listed among its StatefulSets' revisions in any
    /// order), the live plan of every head is the offline plan of base -> head.
    #[test]
    fn a_cluster_running_base_plans_as_base_does() {
        let mut live = lws(json!({}));
        live.metadata.uid = Some("uid-vllm".into());
        let own = revision::new_revision(&live, None, 1);
        let key = revision_key(&own).to_string();
        let listed = [
            own.clone(),
            stateful_set_revision("vllm", &key, 1),
            stateful_set_revision("vllm-0", &key, 1),
        ];
        let template = json!({"size": 2, "workerTemplate": {
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm:v2"}]}}});
        // (head's spec, what both plans say).
        let heads: Vec<(Value, Option<LeaderWorkerSetAction>)> = vec![
            (json!({}), None),
            (
                json!({"leaderWorkerTemplate": template}),
                Some(LeaderWorkerSetAction::Rolls),
            ),
            (
                json!({"leaderWorkerTemplate": {"size": 3, "workerTemplate": {}}}),
                Some(LeaderWorkerSetAction::Rolls),
            ),
            (
                json!({"networkConfig": {"subdomainPolicy": "UniquePerReplica"}}),
                Some(LeaderWorkerSetAction::Rolls),
            ),
            (
                json!({"replicas": 6}),
                Some(LeaderWorkerSetAction::NoRollout),
            ),
            (
                json!({"rolloutStrategy": strategy(json!(2), json!(1), 0)}),
                Some(LeaderWorkerSetAction::NoRollout),
            ),
        ];
        let leader = leader(&key, 4);
        for order in [[0, 1, 2], [2, 1, 0], [1, 0, 2]] {
            let revisions: Vec<ControllerRevision> =
                order.iter().map(|i| listed[*i].clone()).collect();
            let current = Current::in_cluster(&live, Some(&leader), &revisions);
            assert_eq!(current.revision, Some(&own), "order {order:?}");
            for (spec, action) in &heads {
                let head = lws(spec.clone());
                let offline = planned(&head, Some(&Current::declared(&live)));
                let in_cluster = planned(&head, Some(&current));
                assert_eq!(in_cluster, offline, "{spec}, order {order:?}");
                assert_eq!(
                    offline.map(|p| p.change.change),
                    *action,
                    "{spec}, order {order:?}"
                );
            }
        }
    }

    /// Which revision the groups of a cluster's LWS run, and how many groups it has.
    #[test]
    fn the_groups_run_the_revision_their_leader_statefulset_names() {
        let mut live = lws(json!({"replicas": 3}));
        live.metadata.uid = Some("uid-vllm".into());
        let first = revision::new_revision(&live, None, 1);
        let older = lws(json!({"leaderWorkerTemplate": {"size": 3, "workerTemplate": {}}}));
        let mut second = revision::new_revision(&older, Some("older"), 2);
        second.metadata.owner_references = first.metadata.owner_references.clone();
        let key = revision_key(&first).to_string();
        let revisions = [
            stateful_set_revision("vllm", &key, 2),
            first.clone(),
            second.clone(),
            stateful_set_revision("vllm", "older", 3),
        ];
        // (leader StatefulSet, the revision its groups run, groups).
        let cases: Vec<(Option<StatefulSet>, Option<&ControllerRevision>, i32)> = vec![
            // Before the controller made the leader StatefulSet: the live spec's.
            (None, None, 3),
            (Some(leader(&key, 2)), Some(&first), 2),
            (Some(leader("older", 4)), Some(&second), 4),
            // A key no revision of the LWS has (only a StatefulSet's): the controller makes
            // the missing revision of the live spec.
            (Some(leader("unknown", 3)), None, 3),
            (Some(leader("", 3)), None, 3),
        ];
        for (set, running, groups) in cases {
            let current = Current::in_cluster(&live, set.as_ref(), &revisions);
            let key = set.as_ref().map(revision_key);
            assert_eq!(current.revision, running, "leader key {key:?}");
            assert_eq!(current.groups, groups, "leader key {key:?}");
        }
    }

    #[test]
    fn a_placement_annotation_warns_that_leaders_are_replaced() {
        let base = lws(json!({}));
        let mut head = base.clone();
        head.metadata.annotations = Some(BTreeMap::from([(
            EXCLUSIVE_KEY_ANNOTATION.to_string(),
            "topology.kubernetes.io/zone".to_string(),
        )]));
        let current = Current {
            lws: &base,
            revision: None,
            groups: 4,
        };
        let planned = planned(&head, Some(&current)).expect("a change");
        assert_eq!(planned.change.change, LeaderWorkerSetAction::NoRollout);
        assert_eq!(planned.change.changed_fields, ["metadata"]);
        assert!(
            planned.warnings[0].contains("the leader StatefulSet replaces every leader pod"),
            "{:?}",
            planned.warnings
        );
    }

    #[test]
    fn only_declared_metadata_is_compared_live() {
        let mut live = lws(json!({}));
        live.metadata.annotations = Some(BTreeMap::from([
            (
                "kubectl.kubernetes.io/last-applied-configuration".into(),
                "{}".into(),
            ),
            ("team".into(), "a".into()),
        ]));
        let mut head = lws(json!({}));
        head.metadata.annotations = Some(BTreeMap::from([("team".into(), "b".into())]));
        let declared = as_declared(&live, &head);
        assert_eq!(
            declared.metadata.annotations,
            Some(BTreeMap::from([("team".into(), "a".into())]))
        );
        assert_eq!(changed_fields(&declared, &head), ["metadata"]);
        assert_eq!(
            as_declared(&live, &lws(json!({}))).metadata.annotations,
            None
        );
    }

    fn pod(name: &str, labels: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "inference", "labels": labels}}))
        .expect("a pod")
    }

    #[test]
    fn a_drain_recreates_the_groups_of_its_leaders_and_of_workers_that_take_theirs_along() {
        let leader = pod(
            "vllm-1",
            json!({NAME_LABEL: "vllm", "leaderworkerset.sigs.k8s.io/worker-index": "0"}),
        );
        let worker = |lws: &str, name: &str, group: &str| {
            pod(
                name,
                json!({NAME_LABEL: lws, "leaderworkerset.sigs.k8s.io/worker-index": "1",
                       "leaderworkerset.sigs.k8s.io/group-index": group}),
            )
        };
        let vllm_worker = worker("vllm", "vllm-3-1", "3");
        let same_group = worker("vllm", "vllm-1-1", "1");
        let kept = worker("sglang", "sglang-0-1", "0");
        let plain = pod("web-0", json!({"app": "web"}));
        let policies = BTreeMap::from([(
            ("inference".to_string(), "sglang".to_string()),
            RestartPolicy::None,
        )]);
        let pods = [&leader, &vllm_worker, &same_group, &kept, &plain];
        assert_eq!(
            recreated_groups(&pods, &policies),
            ["inference/vllm group 1", "inference/vllm group 3"]
        );
        let cases = [
            (true, RestartPolicy::None, true),
            (true, RestartPolicy::RecreateGroupOnPodRestart, true),
            (false, RestartPolicy::RecreateGroupOnPodRestart, true),
            (false, RestartPolicy::RecreateGroupAfterStart, true),
            (false, RestartPolicy::None, false),
            (false, RestartPolicy::Default, false),
        ];
        for (leader, policy, recreated) in cases {
            assert_eq!(
                recreates_group(leader, policy),
                recreated,
                "{leader} {policy:?}"
            );
        }
    }
}
