//! The plan for a terminal: sections, then every diff, then the summary line last, where
//! a reader's eye lands. Colours only when asked (a terminal without `NO_COLOR`).

use std::fmt::Write as _;

use super::escape::{terminal as clean, terminal_line as line_of};
use super::{
    context_line, forced_summary, gates_summary, guardrails_summary, leader_worker_set_text,
    phase_suffix, plural, pod_list, summary_line, versions,
};
use crate::sync::plan::model::{CheckStatus, ObjectAction, Plan};

/// ANSI colours, or none.
#[derive(Clone, Copy)]
struct Paint {
    on: bool,
}

impl Paint {
    fn code(self, code: &str, text: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn bold(self, text: &str) -> String {
        self.code("1", text)
    }

    fn red(self, text: &str) -> String {
        self.code("31", text)
    }

    fn green(self, text: &str) -> String {
        self.code("32", text)
    }

    fn yellow(self, text: &str) -> String {
        self.code("33", text)
    }

    fn cyan(self, text: &str) -> String {
        self.code("36", text)
    }

    /// `+` green, `~` yellow, `-` red, `!` cyan.
    fn action(self, action: ObjectAction, text: &str) -> String {
        match action {
            ObjectAction::Create => self.green(text),
            ObjectAction::Configure | ObjectAction::Release => self.yellow(text),
            ObjectAction::Prune => self.red(text),
            ObjectAction::Absent => self.cyan(text),
        }
    }

    fn diff_line(self, line: &str) -> String {
        if line.starts_with("+++") || line.starts_with("---") {
            self.bold(line)
        } else if line.starts_with('+') {
            self.green(line)
        } else if line.starts_with('-') {
            self.red(line)
        } else if line.starts_with("@@") {
            self.cyan(line)
        } else {
            line.to_string()
        }
    }
}

/// The plan as text; `color` adds ANSI colours (callers decide: a terminal, and
/// `NO_COLOR` unset).
pub fn render_text(plan: &Plan, color: bool) -> String {
    let paint = Paint { on: color };
    let mut out = format!(
        "{} {}\n",
        paint.bold("capstan plan:"),
        line_of(&context_line(plan))
    );
    for (name, commit) in [("base", &plan.base), ("head", &plan.head)] {
        let _ = writeln!(
            out,
            "  {name} {} {}",
            line_of(&commit.short_sha),
            line_of(&commit.subject)
        );
    }
    errors(plan, paint, &mut out);
    warnings(plan, paint, &mut out);
    objects(plan, paint, &mut out);
    nodes(plan, &mut out);
    leader_worker_sets(plan, &mut out);
    policy(plan, paint, &mut out);
    diffs(plan, paint, &mut out);
    let _ = writeln!(
        out,
        "\n{} {}",
        paint.bold("Plan:"),
        line_of(&summary_line(plan))
    );
    out
}

fn errors(plan: &Plan, paint: Paint, out: &mut String) {
    if plan.errors.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n{} (the sync would reject head):",
        paint.red(&plural(plan.errors.len(), "error"))
    );
    for error in &plan.errors {
        let _ = writeln!(out, "  {}", clean(&error.to_string()));
    }
}

fn warnings(plan: &Plan, paint: Paint, out: &mut String) {
    if plan.warnings.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n{}", paint.yellow("Warnings:"));
    for warning in &plan.warnings {
        let _ = writeln!(out, "  {}", clean(warning));
    }
}

fn objects(plan: &Plan, paint: Paint, out: &mut String) {
    if plan.objects.is_empty() {
        return;
    }
    out.push_str("\nObjects:\n");
    let width = plan
        .objects
        .iter()
        .map(|o| line_of(&o.id.to_string()).chars().count())
        .max()
        .unwrap_or(0);
    for object in &plan.objects {
        let place = object
            .declared_at()
            .map(|place| format!("  {}", line_of(&place)))
            .unwrap_or_default();
        let note = object
            .note()
            .map(|note| format!("  ({note})"))
            .unwrap_or_default();
        let line = format!(
            "{} {:width$}  {:9}",
            object.action.sign(),
            line_of(&object.id.to_string()),
            object.action.as_str()
        );
        let _ = writeln!(out, "  {}{place}{note}", paint.action(object.action, &line));
    }
}

/// `the canary first, then ` when the rollout has canary nodes.
fn canary_first(plan: &Plan) -> &'static str {
    let canary = plan
        .policy
        .guardrails
        .as_ref()
        .is_some_and(|g| !g.canary.is_empty());
    if canary {
        "the canary first, then "
    } else {
        ""
    }
}

fn nodes(plan: &Plan, out: &mut String) {
    if plan.nodes.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nOrdered upgrades ({}nodes in name order, at most {} at a time):",
        canary_first(plan),
        plan.policy.max_nodes_in_flight
    );
    for node in &plan.nodes {
        let _ = writeln!(
            out,
            "  {}. {}  {} {}  (wave {})",
            node.order,
            line_of(&node.node),
            line_of(&node.module),
            line_of(&versions(node.from.as_deref(), node.to.as_deref())),
            node.wave
        );
        if let (Some(campaign), Some(at)) = (&node.campaign, &node.held_until) {
            let _ = writeln!(
                out,
                "       held until {} (campaign {}); cordoned and drained first, \
                 uncordoned after step 4",
                line_of(at),
                line_of(campaign)
            );
        }
        if !node.gates.is_empty() {
            let _ = writeln!(out, "       gates: {}", line_of(&gates_summary(node)));
        }
        if let Some(at) = &node.starts_at {
            let _ = writeln!(out, "       starts at the earliest: {}", line_of(at));
        }
        if let Some(drain) = &node.drain {
            let list = |pods: &[String]| pod_list(pods, line_of);
            let _ = writeln!(out, "       drain evicts: {}", list(&drain.evicted));
            let _ = writeln!(
                out,
                "       protected by a PodDisruptionBudget: {}",
                list(&drain.protected)
            );
            let _ = writeln!(out, "       forced: {}", line_of(&forced_summary(drain)));
            if !drain.recreated_groups.is_empty() {
                let _ = writeln!(
                    out,
                    "       LeaderWorkerSet groups recreated: {}",
                    line_of(&drain.recreated_groups.join(", "))
                );
            }
        }
        for step in &node.steps {
            let _ = writeln!(out, "       {}. {}", step.number, clean(&step.description));
        }
    }
    campaigns(plan, out);
}

fn campaigns(plan: &Plan, out: &mut String) {
    if plan.campaigns.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nCampaigns:");
    for campaign in &plan.campaigns {
        let phase = line_of(&phase_suffix(campaign));
        let _ = writeln!(
            out,
            "  {} rolls out {}: held until {}{phase}; PodDisruptionBudgets forced after \
             PDBForceDrainTimeout {} min + nodeDrain.expectedNodeDrainTime",
            line_of(&campaign.name),
            line_of(&campaign.version),
            line_of(&campaign.upgrade_at),
            campaign.pdb_force_drain_timeout
        );
    }
}

fn leader_worker_sets(plan: &Plan, out: &mut String) {
    if plan.leader_worker_sets.is_empty() {
        return;
    }
    out.push_str("\nLeaderWorkerSets:\n");
    let names: Vec<String> = plan
        .leader_worker_sets
        .iter()
        .map(|set| line_of(&format!("{}/{}", set.namespace, set.name)))
        .collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    for (name, set) in names.iter().zip(&plan.leader_worker_sets) {
        let _ = writeln!(
            out,
            "  {name:width$}  {}",
            line_of(&leader_worker_set_text(set))
        );
    }
}

fn policy(plan: &Plan, paint: Paint, out: &mut String) {
    let policy = &plan.policy;
    out.push_str("\nPolicy:\n");
    let waves: Vec<String> = policy
        .waves
        .iter()
        .map(|wave| line_of(&wave.join(", ")))
        .collect();
    let waves = if waves.is_empty() {
        "no node moves".to_string()
    } else {
        format!("waves: {}", waves.join(" | "))
    };
    let _ = writeln!(
        out,
        "  maxNodesInFlight: {} ({waves})",
        policy.max_nodes_in_flight
    );
    if let Some(guardrails) = &policy.guardrails {
        let _ = writeln!(
            out,
            "  rollout: {}",
            line_of(&guardrails_summary(guardrails))
        );
    }
    let check = &policy.require_pull_request;
    let status = match check.status {
        CheckStatus::Ok => paint.green("ok"),
        CheckStatus::Warning => paint.yellow("warning"),
    };
    let _ = writeln!(
        out,
        "  requirePullRequest: {} ({status}: {})",
        check.required,
        clean(&check.message)
    );
    let _ = writeln!(out, "  prune: {}", policy.prune);
}

fn diffs(plan: &Plan, paint: Paint, out: &mut String) {
    for object in &plan.objects {
        let heading = format!(
            "{} {} ({})",
            object.action.sign(),
            line_of(&object.id.to_string()),
            object.action.as_str()
        );
        let _ = writeln!(out, "\n{}", paint.action(object.action, &heading));
        for line in object.diff.lines() {
            let _ = writeln!(out, "  {}", paint.diff_line(&clean(line)));
        }
    }
}
