//! A plan as people and programs read it: text for terminals, markdown for pull-request
//! comments (split to fit them), JSON for scripts.

mod markdown;
mod text;

pub use markdown::{COMMENT_LIMIT, render_markdown};
pub use text::render_text;

use super::model::{DrainPreview, NodeMove, Plan, PlannedCampaign};

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
/// upgrade (worker-1: kmm-demo/my-kmod v1 → v2)`, `No changes.`, or the error count first
/// when head would be rejected.
pub fn summary_line(plan: &Plan) -> String {
    let summary = &plan.summary;
    if summary.errors == 0 && !summary.has_changes {
        return "No changes.".to_string();
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
    parts.join("; ")
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
            "live: head against the cluster (GitSync {}, last applied {})",
            cluster.sync,
            cluster
                .last_applied_revision
                .as_deref()
                .unwrap_or("nothing yet")
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
