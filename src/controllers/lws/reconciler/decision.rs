//! What one reconcile of a LeaderWorkerSet writes, decided on plain data ([`Facts`]) by
//! four decisions in upstream's order: [`current_revision`], [`update_revision`],
//! [`decide`] and [`decide_status`]. Each reads what the reconcile read and the API
//! server's answers to the writes before it; none talks to the API.

use std::time::Duration;

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::SubdomainPolicy;
use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::controllers::lws::facts::revision_key;
use crate::controllers::lws::labels::REPLICAS_ANNOTATION;
use crate::controllers::lws::rolling::{self, GroupState, LeaderSet};
use crate::controllers::lws::{revision, statefulsets, status};

/// Next look at an LWS at rest whose groups share one headless Service, which is made
/// again if it was deleted.
pub const SERVICE_RECHECK: Duration = Duration::from_secs(5 * 60);

/// What a reconcile of one LWS decides on, read at its start.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The LWS, read afresh: the cached copy may miss the latest spec.
    pub lws: LeaderWorkerSet,
    /// Its leader StatefulSet `<lws>`, read afresh; `None` before it is made.
    pub leader_set: Option<StatefulSet>,
    /// Its own revisions ([`revision::belongs_to`]), listed afresh, then the first one this
    /// reconcile created, as the API server answered.
    pub revisions: Vec<ControllerRevision>,
    /// Its groups, one per leader pod in the cache, by index.
    pub groups: Vec<GroupFacts>,
}

/// One group as the caches show it: its leader pod, and its worker StatefulSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupFacts {
    /// The leader pod's group index.
    pub index: i32,
    /// The leader pod is Running and Ready.
    pub leader_ready: bool,
    /// The revision key the leader pod was made from.
    pub leader_key: String,
    /// The worker StatefulSet `<lws>-<index>`; `None` when missing.
    pub workers: Option<WorkerSetFacts>,
}

/// A group's worker StatefulSet as the cache shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSetFacts {
    /// Every replica available on one revision.
    pub ready: bool,
    /// The revision key it was made from.
    pub key: String,
}

/// Why a revision is created, as its `CreatingRevision` Event says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevisionCause {
    /// The LWS has no leader StatefulSet yet (or one without a key).
    NewLws,
    /// The leader StatefulSet has a key no revision carries (made before revisions
    /// existed, or its revision deleted).
    Missing,
    /// The live spec differs from the revision the groups run.
    Updated,
}

impl RevisionCause {
    /// The Event's note about the revision of `key` (upstream's text).
    pub fn note(self, key: &str) -> String {
        match self {
            RevisionCause::NewLws => {
                format!("Creating revision with key {key} for a newly created LeaderWorkerSet")
            }
            RevisionCause::Missing => {
                format!("Creating missing revision with key {key} for existing LeaderWorkerSet")
            }
            RevisionCause::Updated => format!("Creating revision with key {key} for updated LWS"),
        }
    }
}

/// The revision the groups run, among the listed ones.
#[derive(Clone, Debug, PartialEq)]
pub enum Current {
    /// The revision with the leader StatefulSet's key.
    Found(ControllerRevision),
    /// None carries it: create this one.
    Create(ControllerRevision, RevisionCause),
}

/// The revision the groups run (upstream `getOrCreateRevisionIfNonExist`), first match
/// wins:
///
/// | revision with the leader StatefulSet's key | leader StatefulSet | decision |
/// | --- | --- | --- |
/// | listed | - | [`Current::Found`] |
/// | none | absent, or without a key | create the live spec's revision, keyed by its content, numbered next ([`RevisionCause::NewLws`]) |
/// | none | with key K | create the live spec's revision keyed K, numbered next ([`RevisionCause::Missing`]): adopting the StatefulSet rolls nothing |
pub fn current_revision(facts: &Facts) -> Current {
    let leader_key = facts.leader_set.as_ref().map(revision_key).unwrap_or("");
    if let Some(found) = revision::find(&facts.revisions, &facts.lws, leader_key) {
        return Current::Found(found.clone());
    }
    let number = revision::next_number(&facts.revisions);
    let key = (!leader_key.is_empty()).then_some(leader_key);
    let cause = if key.is_some() {
        RevisionCause::Missing
    } else {
        RevisionCause::NewLws
    };
    Current::Create(revision::new_revision(&facts.lws, key, number), cause)
}

/// The revision to create when the live spec moved away from `current`, the revision the
/// groups run (upstream `getUpdatedRevision`); its creation starts the rolling update:
///
/// | leader StatefulSet | live spec against `current` | decision |
/// | --- | --- | --- |
/// | absent | - | none: a new LWS's first revision is its live spec's |
/// | present | [`revision::equal`], or matched once re-serialised | none |
/// | present | differs | the live spec's revision, keyed by its content, numbered next ([`RevisionCause::Updated`]) |
pub fn update_revision(facts: &Facts, current: &ControllerRevision) -> Option<ControllerRevision> {
    facts.leader_set.as_ref()?;
    revision::updated_revision(&facts.lws, current, revision::next_number(&facts.revisions))
}

/// An Event about the LWS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The reason.
    pub reason: &'static str,
    /// The action.
    pub action: &'static str,
    /// The note, upstream's text.
    pub note: String,
}

/// What a reconcile writes once its revision is settled, in this order.
#[derive(Clone, Debug, PartialEq)]
pub struct Writes {
    /// The leader StatefulSet to apply (server-side apply, forced).
    pub leader_set: Value,
    /// Whether no leader StatefulSet exists: a failed apply is then a failed create.
    pub creates_leader_set: bool,
    /// The Events once it is applied, related to the revision the groups run.
    pub events: Vec<Note>,
    /// Make the groups' shared headless Service `<lws>` when it is missing.
    pub shared_service: bool,
    /// The groups as the status counts them.
    pub status_groups: Vec<status::Group>,
    /// When to look again once every write is made.
    pub next_look: Action,
}

/// The leader StatefulSet, the Events, the Service and the status's groups of an LWS whose
/// groups run the revision of `key`, `lws_updated` when that revision was created in this
/// reconcile for a changed spec (upstream `Reconcile` from `rollingUpdateParameters` to
/// `reconcileHeadlessServices`), first match wins:
///
/// | # | facts | leader StatefulSet applied | Events |
/// | --- | --- | --- | --- |
/// | 1 | no leader StatefulSet | partition 0, R replicas, `key`, `LWS_*` variables | `GroupsProgressing` "Created leader statefulset `<lws>`" |
/// | 2 | `lws_updated` | [`rolling::decide`] rows 2 and 2', the new `key`, `LWS_*` variables | surge groups deleted |
/// | 3 | otherwise | [`rolling::decide`] rows 3 to 6, `key`, `LWS_*` variables only if there already | surge groups deleted, then the partition moving |
/// | - | a bad `maxSurge`, `maxUnavailable` or replicas annotation | error | - |
///
/// | `subdomainPolicy` | Service | next look |
/// | --- | --- | --- |
/// | `Shared` (the default) | `<lws>`, selecting every pod of the LWS | after [`SERVICE_RECHECK`]: Services are not watched |
/// | `UniquePerReplica` | none (the pod reconciler makes one per group) | on a change |
///
/// A group is ready when its leader pod is Running and Ready and its worker StatefulSet
/// (none for `size` 1) has every replica available, updated when both carry `key`. The
/// rolling update reads one state per leader StatefulSet replica, a group missing its
/// leader pod or worker StatefulSet being neither; the status counts every leader pod
/// whose group has its worker StatefulSet.
///
/// Fails as [`rolling::decide`] and [`statefulsets::leader`] fail.
pub fn decide(facts: &Facts, key: &str, lws_updated: bool) -> Result<Writes, String> {
    let lws = &facts.lws;
    let name = lws.name_any();
    let leader = facts.leader_set.as_ref().map(leader_facts);
    let size_one = lws.spec.leader_worker_template.size == 1;
    let states = match &leader {
        Some(leader) => group_states(&facts.groups, size_one, leader.replicas, key),
        None => Vec::new(),
    };
    let parameters = rolling::decide(&name, &lws.spec, leader.as_ref(), &states, lws_updated)?;
    tracing::debug!(lws = %name, %key, lws_updated, ?states, ?parameters, "lws decided");
    let lws_env = statefulsets::leader_env_wanted(facts.leader_set.as_ref(), key);
    let leader_set =
        statefulsets::leader(lws, parameters.partition, parameters.replicas, key, lws_env)?;

    let mut events = Vec::new();
    if leader.is_none() {
        events.push(Note {
            reason: rolling::GROUPS_PROGRESSING,
            action: "Create",
            note: format!("Created leader statefulset {name}"),
        });
    }
    events.extend(parameters.events.into_iter().map(|event| Note {
        reason: event.reason,
        // Partition moves update groups; the other rolling events delete surge groups.
        action: if event.reason == rolling::GROUPS_UPDATING {
            "Update"
        } else {
            "Delete"
        },
        note: event.note,
    }));

    let shared_service =
        lws.spec.network_config_or_default().subdomain_policy == SubdomainPolicy::Shared;
    Ok(Writes {
        leader_set,
        creates_leader_set: leader.is_none(),
        events,
        shared_service,
        status_groups: status_groups(&facts.groups, size_one, key),
        next_look: at_rest(shared_service),
    })
}

/// The status writes of an LWS whose groups run the revision of `key`.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusWrites {
    /// The JSON merge patch of the status, conditional on the LWS's resourceVersion as
    /// read; `None` when the status holds already.
    pub patch: Option<Value>,
    /// The Event of a condition change, once the status is written.
    pub event: Option<Note>,
    /// The revisions to delete once the status is written: the update is done, and no
    /// group runs them.
    pub stale_revisions: Vec<String>,
}

/// The status of an LWS from `leader_replicas`, its leader StatefulSet's `status.replicas`
/// as the apply answered, and the groups [`decide`] counted (upstream `updateStatus` and
/// `TruncateRevisions`), stamped `now`:
///
/// | [`status::decide`] | writes |
/// | --- | --- |
/// | unchanged | none |
/// | changed | the status, on the resourceVersion read |
/// | changed with a condition | the status, then an `Update` Event of the condition's reason |
/// | update done | then the deletion of the revisions of other keys |
pub fn decide_status(
    facts: &Facts,
    key: &str,
    groups: &[status::Group],
    leader_replicas: i32,
    now: Time,
) -> StatusWrites {
    let lws = &facts.lws;
    let decision = status::decide(lws, leader_replicas, groups, now);
    tracing::debug!(
        lws = %lws.name_any(),
        changed = decision.changed,
        done = decision.update_done,
        "lws status"
    );
    let patch = decision.changed.then(|| {
        json!({
            "metadata": {"resourceVersion": lws.resource_version()},
            "status": decision.status,
        })
    });
    let event = decision
        .event
        .filter(|_| decision.changed)
        .map(|event| Note {
            reason: event.reason,
            action: "Update",
            note: event.note,
        });
    let stale_revisions = if decision.update_done {
        revision::to_truncate(&facts.revisions, lws, key)
            .into_iter()
            .map(|stale| stale.name_any())
            .collect()
    } else {
        Vec::new()
    };
    StatusWrites {
        patch,
        event,
        stale_revisions,
    }
}

/// When an LWS that reconciled to the end is looked at again: on a change to it or its
/// StatefulSets and pods, and with a `shared_service` also after [`SERVICE_RECHECK`], since
/// nothing watches the Service and one deleted by hand must be made again.
pub fn at_rest(shared_service: bool) -> Action {
    if shared_service {
        Action::requeue(SERVICE_RECHECK)
    } else {
        Action::await_change()
    }
}

/// The Warning Event of a failed apply of leader StatefulSet `name` (upstream's reasons
/// and actions): a failed update when such a StatefulSet `existed`, else a failed create.
pub fn apply_failure(name: &str, existed: bool, err: &impl std::fmt::Display) -> Note {
    if existed {
        Note {
            reason: "FailedUpdate",
            action: "Update",
            note: format!("Failed to update leader statefulset {name}: {err}"),
        }
    } else {
        Note {
            reason: "FailedCreate",
            action: "Create",
            note: format!("Failed to create leader statefulset {name}: {err}"),
        }
    }
}

/// The Warning Event of a failure to make the shared headless Service.
pub fn service_failure(err: &impl std::fmt::Display) -> Note {
    Note {
        reason: "FailedCreate",
        action: "Create",
        note: format!("Failed to create headless service for error: {err}"),
    }
}

/// The leader StatefulSet as the rolling update reads it.
fn leader_facts(set: &StatefulSet) -> LeaderSet {
    let spec = set.spec.as_ref();
    LeaderSet {
        replicas: spec.and_then(|spec| spec.replicas).unwrap_or(1),
        partition: spec
            .and_then(|spec| spec.update_strategy.as_ref())
            .and_then(|strategy| strategy.rolling_update.as_ref())
            .and_then(|rolling| rolling.partition)
            .unwrap_or(0),
        replicas_annotation: set
            .annotations()
            .get(REPLICAS_ANNOTATION)
            .and_then(|value| value.parse().ok()),
    }
}

/// Each leader-StatefulSet replica's state (upstream `getReplicaStates`): a group whose
/// leader pod or worker StatefulSet is missing is neither ready nor updated.
fn group_states(
    groups: &[GroupFacts],
    size_one: bool,
    replicas: i32,
    key: &str,
) -> Vec<GroupState> {
    (0..replicas.max(0))
        .map(|index| {
            let Some(group) = groups.iter().find(|group| group.index == index) else {
                return GroupState::default();
            };
            let leader_updated = group.leader_key == key;
            if size_one {
                return GroupState {
                    ready: group.leader_ready,
                    updated: leader_updated,
                };
            }
            match &group.workers {
                Some(workers) => GroupState {
                    ready: group.leader_ready && workers.ready,
                    updated: leader_updated && workers.key == key,
                },
                None => GroupState::default(),
            }
        })
        .collect()
}

/// Every leader pod's group as the status counts it (upstream `updateConditions`): groups
/// whose worker StatefulSet is missing are left out.
fn status_groups(groups: &[GroupFacts], size_one: bool, key: &str) -> Vec<status::Group> {
    groups
        .iter()
        .filter_map(|group| {
            let workers = if size_one {
                None
            } else {
                Some(group.workers.as_ref()?)
            };
            Some(status::Group {
                index: group.index,
                ready: workers.is_none_or(|workers| workers.ready) && group.leader_ready,
                updated: workers.is_none_or(|workers| workers.key == key)
                    && group.leader_key == key,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
