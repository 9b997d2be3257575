//! The leader StatefulSet's partition and replicas during a rolling update (upstream
//! `rollingUpdateParameters`, `rollingUpdatePartition`, `calculateRollingUpdateReplicas`
//! and the `maxUnavailable` of `constructLeaderStatefulSetApplyConfiguration`, in
//! `pkg/controllers/leaderworkerset_controller.go`).
//!
//! The leader StatefulSet rolls leader pods from the highest index down to its
//! `partition`; a rolled leader pod brings its group along (its worker StatefulSet is
//! rebuilt from the leader's revision). The LWS controller moves the partition down by at
//! most `maxUnavailable` (plus the surge in use) groups at a time, waiting for the rolled
//! groups to be ready, and during the update runs up to `maxSurge` extra groups above
//! `replicas`, reclaimed as soon as the groups below `replicas` are ready enough.
//!
//! Numbers, as [`decide`] names them: R = `spec.replicas`, S = the leader StatefulSet's
//! `spec.replicas`, P = its partition, ms = `maxSurge` (of R, rounded up, at most R),
//! mu = `maxUnavailable` (of R, rounded down), burst = R + ms.

use capstan_api::LeaderWorkerSetSpec;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Event reason while groups are being rolled (upstream `GroupsUpdating`).
pub const GROUPS_UPDATING: &str = "GroupsUpdating";
/// Event reason while groups are being created or deleted (upstream `GroupsProgressing`).
pub const GROUPS_PROGRESSING: &str = "GroupsProgressing";

/// An Event the LWS controller records on the LeaderWorkerSet (type Normal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The reason.
    pub reason: &'static str,
    /// The note, upstream's text.
    pub note: String,
}

/// `value` of `total` (apimachinery `intstr.GetScaledValueFromIntOrPercent`): an integer
/// as is, `"N%"` as N percent of `total` rounded up or down.
///
/// Fails on a string that is not an integer followed by `%`.
pub fn scaled(value: &IntOrString, total: i32, round_up: bool) -> Result<i32, String> {
    let text = match value {
        IntOrString::Int(value) => return Ok(*value),
        IntOrString::String(text) => text,
    };
    let Some(number) = text.strip_suffix('%') else {
        return Err(format!(
            "invalid value for IntOrString: invalid type: string is not a percentage: {text:?}"
        ));
    };
    let percent: i64 = number.parse().map_err(|error| {
        format!("invalid value for IntOrString: invalid value {text:?}: {error}")
    })?;
    let exact = percent as f64 * f64::from(total) / 100.0;
    let rounded = if round_up {
        exact.ceil()
    } else {
        exact.floor()
    };
    Ok(rounded as i32)
}

/// The rolling-update budget of a spec, in groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Groups above `replicas` during the update: `maxSurge` of R rounded up, at most R.
    pub max_surge: i32,
    /// Groups that may be down: `maxUnavailable` of R rounded down.
    pub max_unavailable: i32,
}

/// The budget of `spec` (upstream `rollingUpdateParameters`' first lines).
///
/// Fails when `maxSurge` or `maxUnavailable` is a string but not a percentage.
pub fn budget(spec: &LeaderWorkerSetSpec) -> Result<Budget, String> {
    let rolling = &spec.rollout_strategy.rolling_update_configuration;
    let surge = scaled(&rolling.max_surge, spec.replicas, true)
        .map_err(|error| format!("maxSurge: {error}"))?;
    let max_unavailable = scaled(&rolling.max_unavailable, spec.replicas, false)
        .map_err(|error| format!("maxUnavailable: {error}"))?;
    Ok(Budget {
        max_surge: surge.min(spec.replicas),
        max_unavailable,
    })
}

/// The leader StatefulSet's own `maxUnavailable` (upstream
/// `constructLeaderStatefulSetApplyConfiguration`): mu + ms, at least 1 (even with
/// `replicas` 0 or both zero, which the webhook refuses).
pub fn leader_max_unavailable(spec: &LeaderWorkerSetSpec) -> Result<i32, String> {
    let budget = budget(spec)?;
    Ok((budget.max_unavailable + budget.max_surge).max(1))
}

/// The leader StatefulSet's replicas while `unready` groups below R are not ready and
/// updated (upstream `calculateRollingUpdateReplicas`): the whole burst while more than
/// ms are, else R plus the surge still needed to keep the unready groups beyond mu covered.
pub fn rolling_update_replicas(
    replicas: i32,
    max_surge: i32,
    max_unavailable: i32,
    unready: i32,
) -> i32 {
    if unready <= max_surge {
        replicas + (unready - max_unavailable).max(0)
    } else {
        replicas + max_surge
    }
}

/// Where one group stands against the current revision (upstream `replicaState`). A group
/// whose leader pod or worker StatefulSet is missing is neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GroupState {
    /// The leader pod is Running and Ready, and its worker StatefulSet (if the group has
    /// workers) has every replica available on one revision.
    pub ready: bool,
    /// The leader pod and its worker StatefulSet carry the current revision key.
    pub updated: bool,
}

/// The live leader StatefulSet, as [`decide`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderSet {
    /// Its `spec.replicas` (S).
    pub replicas: i32,
    /// Its `updateStrategy.rollingUpdate.partition` (P).
    pub partition: i32,
    /// Its `leaderworkerset.sigs.k8s.io/replicas` annotation: the R it was last applied
    /// for; `None` when absent or not an integer.
    pub replicas_annotation: Option<i32>,
}

/// What to apply to the leader StatefulSet, and the Events to record once applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parameters {
    /// `updateStrategy.rollingUpdate.partition`.
    pub partition: i32,
    /// `spec.replicas`.
    pub replicas: i32,
    /// Surge groups reclaimed (`GroupsProgressing`), then groups rolled
    /// (`GroupsUpdating`), in upstream's order.
    pub events: Vec<Event>,
}

/// The leader StatefulSet's partition and replicas (upstream `rollingUpdateParameters`
/// and the progress Event of `Reconcile`).
///
/// `states` has one entry per index of the leader StatefulSet (S entries; a missing entry
/// counts as neither ready nor updated). `lws_updated` says a revision was created for the
/// live spec in this reconcile. With unready = the groups below R not ready and updated,
/// want(u) = [`rolling_update_replicas`]`(R, ms, mu, u)`, first match wins:
///
/// | # | leader StatefulSet | partition | replicas |
/// | --- | --- | --- | --- |
/// | 1 | absent | 0 | R |
/// | 2 | LWS updated in this reconcile, S < R (scale up first) | S | R |
/// | 2' | LWS updated in this reconcile, S ≥ R | R | want(R) |
/// | 3 | P = 0 and S = R (at rest) | 0 | R |
/// | 4 | S < R (still scaling up) | P | R |
/// | - | replicas annotation missing or not an integer | error | |
/// | 5 | annotation ≠ R (R changed mid-update) | min(P, burst) | want(unready) |
/// | 6 | rolling: step = mu + ms − (burst − S); tail = ready and updated groups counted down from S − 1; base = max(0, S − tail − step); partition = base + groups below base not ready, then lowered towards base over groups not ready or updated; never above P | that | want(unready) |
///
/// The partition is finally raised to `spec.rolloutStrategy...partition`. Events: when
/// want(..) < S, `GroupsProgressing` "deleting surge replica `<lws>-N`" (one) or
/// "deleting surge replicas from `<lws>-N` to `<lws>-M`"; when the StatefulSet exists, the
/// LWS was not updated in this reconcile and the partition moves, `GroupsUpdating` "Updating replica N"
/// (one step down) or "Updating replicas N to M (inclusive)".
///
/// Fails on a bad `maxSurge`/`maxUnavailable` or a bad replicas annotation (cases 5, 6).
pub fn decide(
    lws_name: &str,
    spec: &LeaderWorkerSetSpec,
    leader: Option<&LeaderSet>,
    states: &[GroupState],
    lws_updated: bool,
) -> Result<Parameters, String> {
    let mut events = Vec::new();
    let (partition, replicas) =
        partition_and_replicas(lws_name, spec, leader, states, lws_updated, &mut events)?;
    let partition = partition.max(spec.rollout_strategy.rolling_update_configuration.partition);
    if let Some(leader) = leader
        && !lws_updated
        && partition != leader.partition
    {
        let last = leader.partition - 1;
        let note = if last == partition {
            format!("Updating replica {partition}")
        } else {
            format!("Updating replicas {partition} to {last} (inclusive)")
        };
        events.push(Event {
            reason: GROUPS_UPDATING,
            note,
        });
    }
    Ok(Parameters {
        partition,
        replicas,
        events,
    })
}

/// Cases 1 to 6 of [`decide`], before the spec's partition.
fn partition_and_replicas(
    lws_name: &str,
    spec: &LeaderWorkerSetSpec,
    leader: Option<&LeaderSet>,
    states: &[GroupState],
    lws_updated: bool,
    events: &mut Vec<Event>,
) -> Result<(i32, i32), String> {
    let r = spec.replicas;
    let Some(leader) = leader else {
        return Ok((0, r));
    };
    let s = leader.replicas;
    let Budget {
        max_surge,
        max_unavailable,
    } = budget(spec)?;
    let burst = r + max_surge;
    let mut want = |unready: i32| {
        let replicas = rolling_update_replicas(r, max_surge, max_unavailable, unready);
        if replicas == s - 1 {
            events.push(Event {
                reason: GROUPS_PROGRESSING,
                note: format!("deleting surge replica {lws_name}-{replicas}"),
            });
        } else if replicas < s {
            events.push(Event {
                reason: GROUPS_PROGRESSING,
                note: format!(
                    "deleting surge replicas from {lws_name}-{replicas} to {lws_name}-{}",
                    s - 1
                ),
            });
        }
        replicas
    };

    if lws_updated {
        return Ok(if s < r { (s, r) } else { (r, want(r)) });
    }
    let p = leader.partition;
    if p == 0 && s == r {
        return Ok((0, r));
    }
    if s < r {
        return Ok((p, r));
    }

    let states: Vec<GroupState> = (0..s.max(0) as usize)
        .map(|index| states.get(index).copied().unwrap_or_default())
        .collect();
    let unready = unready_groups(&states, r);
    let Some(applied_for) = leader.replicas_annotation else {
        return Err(format!(
            "leader StatefulSet {lws_name} has no integer {} annotation",
            super::labels::REPLICAS_ANNOTATION
        ));
    };
    if applied_for != r {
        return Ok((p.min(burst), want(unready)));
    }
    let step = max_unavailable + max_surge - (burst - s);
    Ok((rolling_partition(&states, step, p), want(unready)))
}

/// Groups below `replicas` that are not ready and updated, a missing one included
/// (upstream `calculateLWSUnreadyReplicas`).
fn unready_groups(states: &[GroupState], replicas: i32) -> i32 {
    (0..replicas.max(0) as usize)
        .filter(|&index| {
            states
                .get(index)
                .is_none_or(|state| !state.ready || !state.updated)
        })
        .count() as i32
}

/// Case 6 of [`decide`] (upstream `rollingUpdatePartition`), over exactly S `states`.
fn rolling_partition(states: &[GroupState], step: i32, current: i32) -> i32 {
    let s = states.len() as i32;
    let tail = states
        .iter()
        .rev()
        .take_while(|state| state.ready && state.updated)
        .count() as i32;
    // Clamped to S as well: a negative maxUnavailable (refused by validation) must not
    // reach past the last group.
    let base = (s - tail - step).clamp(0, s);
    // Groups below the base that are down already count against maxUnavailable.
    let down_below = states[..base as usize]
        .iter()
        .filter(|state| !state.ready)
        .count() as i32;
    let mut partition = base + down_below;
    // Rolling a group that is down or already rolled costs no availability: go on past it,
    // or an update that started with maxUnavailable already used up would never move.
    let mut index = partition.min(s - 1);
    while index >= base {
        let state = states[index as usize];
        if !state.ready || state.updated {
            partition = index;
            index -= 1;
        } else {
            break;
        }
    }
    // The partition only ever moves down.
    partition.min(current)
}

#[cfg(test)]
mod tests;
