//! A plan as people and programs read it: text for terminals, markdown for pull-request
//! comments (split to fit them), JSON for scripts.

pub(crate) mod escape;
mod markdown;
mod text;

pub use markdown::{COMMENT_LIMIT, render_markdown};
pub use text::render_text;

use super::model::{
    DrainPreview, LeaderWorkerSetAction, LeaderWorkerSetChange, NodeMove, ObjectAction, Plan,
    PlannedCampaign, PlannedGuardrails, PlannedRollout,
};

/// How many node moves the summary line names before "and N more".
const MOVES_NAMED: usize = 3;

/// The plan as pretty JSON (the schema of docs/plan.md), ending with a newline.
pub fn render_json(plan: &Plan) -> String {
    // Every field serializes: strings, numbers, and maps with string keys.
    let mut json = serde_json::to_string_pretty(plan).expect("a plan serializes as JSON");
    json.push('\n');
    json
}

/// One line saying what the plan does: `2 to create, 1 to configure, 0 to prune; 1 node
/// upgrade (worker-1: kmm-demo/my-kmod v1 → v2); 1 LeaderWorkerSet rollout
/// (inference/vllm)`, `No changes.`, or the error count first when head would be rejected.
/// Nodes the cluster does not have follow the counts (`1 Node not in the cluster, not
/// created (worker-9)`), after `No changes.` when nothing else changes.
pub fn summary_line(plan: &Plan) -> String {
    let summary = &plan.summary;
    let absent = absent_nodes(plan);
    if summary.errors == 0 && !summary.has_changes {
        return match absent {
            Some(absent) => format!("No changes. {absent}"),
            None => "No changes.".to_string(),
        };
    }
    let mut parts = Vec::new();
    if summary.errors > 0 {
        parts.push(format!(
            "{}: head would be rejected",
            plural(summary.errors, "error")
        ));
    }
    if summary.has_changes {
        let mut counts = format!(
            "{} to create, {} to configure, {} to prune",
            summary.create, summary.configure, summary.prune
        );
        if summary.release > 0 {
            counts.push_str(&format!(", {} to release", summary.release));
        }
        parts.push(counts);
    }
    parts.extend(absent);
    if !plan.nodes.is_empty() {
        let mut named: Vec<String> = plan.nodes.iter().take(MOVES_NAMED).map(move_text).collect();
        if plan.nodes.len() > MOVES_NAMED {
            named.push(format!("and {} more", plan.nodes.len() - MOVES_NAMED));
        }
        parts.push(format!(
            "{} ({})",
            plural(plan.nodes.len(), "node upgrade"),
            named.join(", ")
        ));
    }
    let rollouts: Vec<String> = plan
        .leader_worker_sets
        .iter()
        .filter(|set| set.change == LeaderWorkerSetAction::Rolls)
        .map(|set| format!("{}/{}", set.namespace, set.name))
        .collect();
    if !rollouts.is_empty() {
        let mut named: Vec<String> = rollouts.iter().take(MOVES_NAMED).cloned().collect();
        if rollouts.len() > MOVES_NAMED {
            named.push(format!("and {} more", rollouts.len() - MOVES_NAMED));
        }
        parts.push(format!(
            "{} ({})",
            plural(rollouts.len(), "LeaderWorkerSet rollout"),
            named.join(", ")
        ));
    }
    parts.join("; ")
}

/// `1 Node not in the cluster, not created (worker-9)`; `None` when every Node head
/// declares is there (or the plan is offline).
fn absent_nodes(plan: &Plan) -> Option<String> {
    let names: Vec<&str> = plan
        .objects
        .iter()
        .filter(|object| object.action == ObjectAction::Absent)
        .map(|object| object.id.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    let mut named: Vec<String> = names
        .iter()
        .take(MOVES_NAMED)
        .map(|n| n.to_string())
        .collect();
    if names.len() > MOVES_NAMED {
        named.push(format!("and {} more", names.len() - MOVES_NAMED));
    }
    Some(format!(
        "{} not in the cluster, not created ({})",
        plural(names.len(), "Node"),
        named.join(", ")
    ))
}

/// A node's gates in one line: `preflight (image), no-alerts (prometheus) before; diag
/// (pod, 1 retry) after`.
pub(super) fn gates_summary(node: &NodeMove) -> String {
    let of = |when: &str| -> Vec<String> {
        node.gates
            .iter()
            .filter(|g| g.when == when)
            .map(|g| {
                let retries = match g.retries {
                    0 => String::new(),
                    n => format!(", {}", plural(n as usize, "retry")),
                };
                format!("{} ({}{retries})", g.name, g.kind)
            })
            .collect()
    };
    let mut parts = Vec::new();
    for when in ["before", "after"] {
        let gates = of(when);
        if !gates.is_empty() {
            parts.push(format!("{} {when}", gates.join(", ")));
        }
    }
    parts.join("; ")
}

/// The rollout's guardrails and estimate in one line: `paused; canary worker-1, soak
/// 10m; windows: sat 02:00 for 4h Europe/Paris; about 1h30m (30m a node, median of 4
/// recorded upgrades), ends 2027-01-04T03:30:00Z; a failed gate halts, the node cordoned`.
pub(super) fn guardrails_summary(guardrails: &PlannedGuardrails) -> String {
    let duration = |seconds: u64| {
        crate::controllers::upgrade::guard::humantime(std::time::Duration::from_secs(seconds))
    };
    let mut parts = Vec::new();
    if guardrails.paused {
        parts.push("paused: no node starts".to_string());
    }
    if !guardrails.canary.is_empty() {
        parts.push(format!(
            "canary {}, soak {}",
            guardrails.canary.join(", "),
            duration(guardrails.soak_seconds)
        ));
    }
    if !guardrails.windows.is_empty() {
        parts.push(format!("windows: {}", guardrails.windows.join(" | ")));
    }
    match &guardrails.estimate {
        Some(estimate) => parts.push(format!(
            "about {} ({} a node, median of {}), ends {}",
            duration(estimate.total_seconds),
            duration(estimate.per_node_seconds),
            plural(estimate.recorded_upgrades, "recorded upgrade"),
            estimate.ends_at
        )),
        None => parts.push("no estimate (no upgrade recorded to time it by)".to_string()),
    }
    parts.push(format!(
        "a failed gate halts the rollout, the node left {}",
        guardrails.failed_node
    ));
    parts.join("; ")
}

/// What happens to a LeaderWorkerSet's groups, in one line: `rolls groups 3..0, 1 at a
/// time (maxUnavailable 1, maxSurge 0)`, `no rollout: only replicas 2 → 4 (groups 2..3
/// created)`, `created with 4 groups`, `deleted with its 4 groups`.
pub(super) fn leader_worker_set_text(set: &LeaderWorkerSetChange) -> String {
    let groups = |count: Option<i32>| match count {
        Some(count) => plural(usize::try_from(count).unwrap_or(0), "group"),
        None => "its groups".to_string(),
    };
    match set.change {
        LeaderWorkerSetAction::Created => format!("created with {}", groups(set.replicas.to)),
        LeaderWorkerSetAction::Deleted => format!(
            "deleted with {}",
            match set.replicas.from {
                Some(count) => format!("its {}", groups(Some(count))),
                None => groups(None),
            }
        ),
        LeaderWorkerSetAction::NoRollout => {
            let fields: Vec<String> = set
                .changed_fields
                .iter()
                .map(
                    |field| match (field.as_str(), set.replicas.from, set.replicas.to) {
                        ("replicas", Some(from), Some(to)) => {
                            format!("replicas {from} → {to}{}", scaled_groups(from, to))
                        }
                        _ => field.clone(),
                    },
                )
                .collect();
            format!("no rollout: only {}", fields.join(", "))
        }
        LeaderWorkerSetAction::Rolls => match &set.rollout {
            Some(rollout) => rollout_text(rollout, set.replicas.from, set.replicas.to),
            None => "rolls (the order cannot be planned: see the warnings)".to_string(),
        },
    }
}

/// ` (groups 2..3 created)` or ` (group 2 deleted)` for a change of replicas.
fn scaled_groups(from: i32, to: i32) -> String {
    if to > from {
        format!(" ({} created)", groups_of(&(from..to).collect::<Vec<_>>()))
    } else if to < from {
        format!(
            " ({} deleted)",
            groups_of(&(to..from).rev().collect::<Vec<_>>())
        )
    } else {
        String::new()
    }
}

/// `rolls groups 3..0, 1 at a time (maxUnavailable 1, maxSurge 0)`, with the steps when
/// they are not one group each, and the new, deleted, surge and held groups.
fn rollout_text(rollout: &PlannedRollout, from: Option<i32>, to: Option<i32>) -> String {
    let replicas = to.unwrap_or(0);
    let extra =
        |group: &i32| rollout.new_groups.contains(group) || rollout.surge_groups.contains(group);
    let rolled: Vec<i32> = rollout
        .order
        .iter()
        .flatten()
        .copied()
        .filter(|group| !extra(group))
        .collect();
    let at_a_time = rollout
        .order
        .iter()
        .map(|step| step.iter().filter(|group| !extra(group)).count())
        .max()
        .unwrap_or(0);
    let budget = format!(
        "(maxUnavailable {}, maxSurge {})",
        rollout.max_unavailable, rollout.max_surge
    );
    let mut text = if rolled.is_empty() {
        format!("new revision, no existing group rolls {budget}")
    } else {
        let pace = if at_a_time == 1 {
            "1 at a time".to_string()
        } else {
            format!("up to {at_a_time} at a time")
        };
        format!("rolls {}, {pace} {budget}", groups_of(&rolled))
    };
    // One rolled group per step says it all; anything else is spelled out.
    let one_by_one = rollout.order.iter().flatten().count() == rolled.len()
        && rollout.order.iter().all(|step| step.len() == 1);
    if !one_by_one {
        let steps: Vec<String> = rollout
            .order
            .iter()
            .map(|step| {
                step.iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join("+")
            })
            .collect();
        text.push_str(&format!(": {}", steps.join(" → ")));
    }
    if !rollout.new_groups.is_empty() {
        text.push_str(&format!(
            "; new {} on head's revision",
            groups_of(&rollout.new_groups)
        ));
    }
    if let Some(from) = from.filter(|from| *from > replicas) {
        let deleted: Vec<i32> = (replicas..from)
            .rev()
            .filter(|group| !rollout.surge_groups.contains(group))
            .collect();
        if !deleted.is_empty() {
            text.push_str(&format!("; {} deleted", groups_of(&deleted)));
        }
    }
    if !rollout.surge_groups.is_empty() {
        let surge = groups_of(&rollout.surge_groups);
        if rollout.surge_remains {
            text.push_str(&format!(
                "; surge {surge} kept while the partition holds groups back"
            ));
        } else {
            text.push_str(&format!("; surge {surge} deleted once done"));
        }
    }
    let held = rollout.partition.min(replicas);
    if held > 0 {
        let held_groups: Vec<i32> = (0..held).rev().collect();
        text.push_str(&format!(
            "; partition {} keeps {} on the old revision",
            rollout.partition,
            groups_of(&held_groups)
        ));
    }
    text
}

/// `group 3` or `groups 3..0`.
fn groups_of(groups: &[i32]) -> String {
    let noun = if groups.len() == 1 { "group" } else { "groups" };
    format!("{noun} {}", range(groups))
}

/// Group indices as a range when they follow each other (`3..0`, `4..5`, `2`), else listed.
fn range(groups: &[i32]) -> String {
    match groups {
        [] => "none".to_string(),
        [one] => one.to_string(),
        [first, .., last] => {
            let step = if last > first { 1 } else { -1 };
            let consecutive = groups.windows(2).all(|pair| pair[1] - pair[0] == step);
            if consecutive {
                format!("{first}..{last}")
            } else {
                groups
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        }
    }
}

/// `worker-1: kmm-demo/my-kmod v1 → v2`.
pub(super) fn move_text(node: &NodeMove) -> String {
    format!(
        "{}: {} {}",
        node.node,
        node.module,
        versions(node.from.as_deref(), node.to.as_deref())
    )
}

/// `v1 → v2`, with `(none)` for a missing label.
pub(super) fn versions(from: Option<&str>, to: Option<&str>) -> String {
    format!("{} → {}", from.unwrap_or("(none)"), to.unwrap_or("(none)"))
}

/// `1 error`, `2 errors`.
pub(in crate::sync::plan) fn plural(count: usize, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// `; 1801 objects unchanged since, not dry-run` for the objects a live plan knew unchanged
/// (their manifest as last applied, their live fields as it set them), else nothing.
fn unchanged_note(unchanged: usize) -> String {
    match unchanged {
        0 => String::new(),
        1 => "; 1 object unchanged since, not dry-run".to_string(),
        n => format!("; {n} objects unchanged since, not dry-run"),
    }
}

/// Where the plan stands, in one line: branch, path, commits, mode.
pub(super) fn context_line(plan: &Plan) -> String {
    let path = if plan.path.is_empty() {
        String::new()
    } else {
        format!(", path {}", plan.path)
    };
    let pull_request = plan
        .pull_request
        .map(|number| format!(", pull request #{number}"))
        .unwrap_or_default();
    let against = match &plan.cluster {
        None => "offline: head against base".to_string(),
        Some(cluster) if !cluster.found => format!(
            "live: head against the cluster (no GitSync {}: nothing is pruned)",
            cluster.sync
        ),
        Some(cluster) => format!(
            "live: head against the cluster (GitSync {}, last applied {}{})",
            cluster.sync,
            cluster
                .last_applied_revision
                .as_deref()
                .unwrap_or("nothing yet"),
            unchanged_note(cluster.unchanged)
        ),
    };
    format!(
        "{}{path}{pull_request}: base {} → head {} ({against})",
        plan.branch, plan.base.short_sha, plan.head.short_sha
    )
}

/// `, now Upgrading` for a campaign whose phase the cluster told, else nothing.
pub(super) fn phase_suffix(campaign: &PlannedCampaign) -> String {
    campaign
        .phase
        .as_deref()
        .map_or_else(String::new, |phase| format!(", now {phase}"))
}

/// When the nodekeeper's strategies start, `DELETE after 45 min, ...`, or `never` when
/// they are disabled.
pub(super) fn forced_summary(drain: &DrainPreview) -> String {
    if drain.forced_after.is_empty() {
        return "never (disableDrainStrategies)".to_string();
    }
    drain
        .forced_after
        .iter()
        .map(|f| format!("{} after {} min", f.strategy, f.minutes))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pods of a drain preview, each shown by `show`, or `none`.
pub(super) fn pod_list(pods: &[String], show: impl Fn(&str) -> String) -> String {
    if pods.is_empty() {
        return "none".to_string();
    }
    pods.iter().map(|p| show(p)).collect::<Vec<_>>().join(", ")
}
