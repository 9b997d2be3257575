//! A LeaderWorkerSet's status and conditions (upstream `updateStatus`, `updateConditions`,
//! `makeCondition`, `setConditions`, `setCondition` and `exclusiveConditionTypes` in
//! `pkg/controllers/leaderworkerset_controller.go`).
//!
//! The counts cover every leader pod, surge groups included; the conditions look only at
//! the groups the rolling update is about: index at least the spec's `partition` and below
//! `replicas` ("in partition"). [`decide`]'s condition choice, first match wins:
//!
//! | in-partition groups | conditions set True |
//! | --- | --- |
//! | fewer updated than exist | `UpdateInProgress` (`GroupsUpdating`, "Rolling Upgrade is in progress"), then `Progressing` |
//! | all R groups below `replicas` ready, every in-partition one updated and ready | `Available` (`AllGroupsReady`, "All replicas are ready") |
//! | otherwise | `Progressing` (`GroupsProgressing`, "Replicas are progressing") |
//!
//! Conditions are only ever set True; setting `Available` True turns a True `Progressing`
//! or `UpdateInProgress` False and the other way round, while `Progressing` leaves
//! `UpdateInProgress` alone, so `UpdateInProgress` stays True until `Available`. As
//! upstream, the second condition of a pair is only looked at once the first changed
//! nothing. An update is done when the spec's partition is 0 and every group below
//! `replicas` is updated and ready; its revisions other than the current one can then go.

use capstan_api::LeaderWorkerSet;
use capstan_api::lws::{LeaderWorkerSetStatus, condition_types};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::labels::{NAME_LABEL, WORKER_INDEX_LABEL};
use super::rolling::{Event, GROUPS_PROGRESSING, GROUPS_UPDATING};

/// Reason of the `Available` condition and its Event.
pub const ALL_GROUPS_READY: &str = "AllGroupsReady";

/// One leader pod whose group has its worker StatefulSet (or needs none), as the status
/// counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// Its `group-index`.
    pub index: i32,
    /// The leader pod is Running and Ready, and its worker StatefulSet (if any) is ready.
    pub ready: bool,
    /// The leader pod and its worker StatefulSet (if any) carry the current revision key.
    pub updated: bool,
}

/// The status to write and what follows from it.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusDecision {
    /// The whole status.
    pub status: LeaderWorkerSetStatus,
    /// It differs from the live status: write it.
    pub changed: bool,
    /// The Event of a condition change, to record with the write.
    pub event: Option<Event>,
    /// The rolling update is done: revisions with another key can be deleted.
    pub update_done: bool,
}

/// The status of `lws` (upstream `updateStatus` and `updateConditions`), from the leader
/// StatefulSet's `status.replicas` and the leader pods' groups (a leader whose worker
/// StatefulSet is missing is left out by the caller, as upstream skips it). `now` stamps
/// the conditions that change.
pub fn decide(
    lws: &LeaderWorkerSet,
    leader_status_replicas: i32,
    groups: &[Group],
    now: Time,
) -> StatusDecision {
    let generation = lws.metadata.generation.unwrap_or(0);
    let replicas = lws.spec.replicas;
    let partition = lws
        .spec
        .rollout_strategy
        .rolling_update_configuration
        .partition;
    let mut status = lws.status.clone().unwrap_or_default();
    let mut changed = false;

    if status.replicas != leader_status_replicas {
        status.replicas = leader_status_replicas;
        changed = true;
    }
    if status.observed_generation != generation {
        status.observed_generation = generation;
        changed = true;
    }
    if status.hpa_pod_selector.is_empty() {
        status.hpa_pod_selector = hpa_pod_selector(lws);
        changed = true;
    }

    let in_partition = |index: i32| index >= partition && index < replicas;
    let ready = groups.iter().filter(|g| g.ready).count() as i32;
    let updated = groups.iter().filter(|g| g.updated).count() as i32;
    let ready_below_replicas = groups
        .iter()
        .filter(|g| g.index < replicas && g.ready)
        .count();
    let current = groups.iter().filter(|g| in_partition(g.index)).count();
    let current_updated = groups
        .iter()
        .filter(|g| in_partition(g.index) && g.updated)
        .count();
    let current_updated_and_ready = groups
        .iter()
        .filter(|g| in_partition(g.index) && g.updated && g.ready)
        .count();

    if status.ready_replicas != ready {
        status.ready_replicas = ready;
        changed = true;
    }
    if status.updated_replicas != updated {
        status.updated_replicas = updated;
        changed = true;
    }

    let wanted: Vec<Condition> = if current_updated < current {
        vec![
            condition(condition_types::UPDATE_IN_PROGRESS, generation, &now),
            condition(condition_types::PROGRESSING, generation, &now),
        ]
    } else if ready_below_replicas as i32 == replicas && current_updated_and_ready == current {
        vec![condition(condition_types::AVAILABLE, generation, &now)]
    } else {
        vec![condition(condition_types::PROGRESSING, generation, &now)]
    };
    let update_done = partition == 0 && current_updated_and_ready as i32 == replicas;

    let conditions_changed = set_conditions(&mut status.conditions, &wanted, generation, &now);
    let event = conditions_changed.then(|| Event {
        reason: reason_of(&wanted[0].type_),
        note: format!(
            "{}, with {ready} groups ready of total {replicas} groups",
            wanted[0].message
        ),
    });
    StatusDecision {
        status,
        changed: changed || conditions_changed,
        event,
        update_done,
    }
}

/// The selector of the leader pods, for the scale subresource (set once).
fn hpa_pod_selector(lws: &LeaderWorkerSet) -> String {
    let name = lws.metadata.name.as_deref().unwrap_or_default();
    format!("{NAME_LABEL}={name},{WORKER_INDEX_LABEL}=0")
}

/// A True condition of `type_` (upstream `makeCondition`).
fn condition(type_: &str, generation: i64, now: &Time) -> Condition {
    let message = match type_ {
        condition_types::AVAILABLE => "All replicas are ready",
        condition_types::UPDATE_IN_PROGRESS => "Rolling Upgrade is in progress",
        _ => "Replicas are progressing",
    };
    Condition {
        type_: type_.to_string(),
        status: "True".to_string(),
        last_transition_time: now.clone(),
        observed_generation: Some(generation),
        reason: reason_of(type_).to_string(),
        message: message.to_string(),
    }
}

fn reason_of(type_: &str) -> &'static str {
    match type_ {
        condition_types::AVAILABLE => ALL_GROUPS_READY,
        condition_types::UPDATE_IN_PROGRESS => GROUPS_UPDATING,
        _ => GROUPS_PROGRESSING,
    }
}

/// Sets `wanted` in order, stopping at the first that changes something (upstream's `||`
/// short-circuit), then stamps every condition with `generation` (upstream
/// `setConditions`). Returns whether anything changed.
fn set_conditions(
    conditions: &mut Vec<Condition>,
    wanted: &[Condition],
    generation: i64,
    now: &Time,
) -> bool {
    let mut changed = false;
    for condition in wanted {
        changed = changed || set_condition(conditions, condition.clone(), now.clone());
    }
    for condition in conditions.iter_mut() {
        if condition.observed_generation.unwrap_or(0) != generation {
            condition.observed_generation = Some(generation);
            changed = true;
        }
    }
    changed
}

/// Sets `new` into `conditions` (upstream `setCondition`), stamped `now`: a condition of
/// its type with another status or generation is replaced; a True condition exclusive
/// with a True `new` turns False; a True `new` of a new type is appended. Returns whether
/// anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, new: Condition, now: Time) -> bool {
    let new = Condition {
        last_transition_time: now.clone(),
        ..new
    };
    let mut found = false;
    let mut changed = false;
    for current in conditions.iter_mut() {
        if current.type_ == new.type_ {
            if current.status != new.status
                || current.observed_generation.unwrap_or(0) != new.observed_generation.unwrap_or(0)
            {
                *current = new.clone();
                changed = true;
            }
            found = true;
        } else if exclusive(&current.type_, &new.type_)
            && new.status == "True"
            && current.status == "True"
        {
            current.status = "False".to_string();
            current.last_transition_time = now.clone();
            current.observed_generation = new.observed_generation;
            changed = true;
        }
    }
    if new.status == "True" && !found {
        conditions.push(new);
        changed = true;
    }
    changed
}

/// Whether two condition types cannot both be True (upstream `exclusiveConditionTypes`):
/// `Available` with `Progressing`, and `Available` with `UpdateInProgress`.
pub fn exclusive(a: &str, b: &str) -> bool {
    use condition_types::{AVAILABLE, PROGRESSING, UPDATE_IN_PROGRESS};
    matches!(
        (a, b),
        (AVAILABLE, PROGRESSING)
            | (PROGRESSING, AVAILABLE)
            | (AVAILABLE, UPDATE_IN_PROGRESS)
            | (UPDATE_IN_PROGRESS, AVAILABLE)
    )
}

#[cfg(test)]
mod tests;
