//! The plan as a pull-request comment: a summary line, tables and lists, each diff folded
//! in `<details>`; split into parts that each fit one comment and render on their own.

use std::fmt::Write as _;

use super::escape::{cell_code, code, fenced, html, text as escape};
use super::{
    context_line, forced_summary, gates_summary, guardrails_summary, leader_worker_set_text,
    phase_suffix, plural, pod_list, summary_line, versions,
};
use crate::sync::plan::model::{CheckStatus, Plan};

/// GitHub's limit on a comment's length, in characters (Atlantis splits its plans there).
pub const COMMENT_LIMIT: usize = 65_536;

/// Room left in each part for the continuation line capstan adds and the marker line a
/// CI script may add.
const PART_BUDGET: usize = COMMENT_LIMIT - 1_024;

/// The plan as markdown, in parts each under [`COMMENT_LIMIT`] bytes (so characters).
/// The first part starts with the summary line; a code block or `<details>` cut by a
/// split is closed at the end of its part and opened again in the next, and later parts
/// start with `**capstan plan** (part N of M)`.
pub fn render_markdown(plan: &Plan) -> Vec<String> {
    split(&document(plan), PART_BUDGET)
}

/// The whole plan as one markdown document.
fn document(plan: &Plan) -> String {
    let mut out = format!(
        "**capstan plan**: {}\n\n{}\n",
        escape(&summary_line(plan)),
        escape(&context_line(plan))
    );
    errors(plan, &mut out);
    warnings(plan, &mut out);
    objects(plan, &mut out);
    nodes(plan, &mut out);
    leader_worker_sets(plan, &mut out);
    policy(plan, &mut out);
    diffs(plan, &mut out);
    out
}

/// The errors a comment lists: a commit can hold tens of thousands, and a comment that
/// lists them all comes in dozens of parts (the text and JSON plans list every one).
pub const COMMENT_ERRORS: usize = 100;

fn errors(plan: &Plan, out: &mut String) {
    error_list(&plan.errors, out);
}

fn error_list(errors: &[impl std::fmt::Display], out: &mut String) {
    if errors.is_empty() {
        return;
    }
    out.push_str("\n#### Errors\n\nThe sync would reject head until these are fixed:\n\n");
    for error in errors.iter().take(COMMENT_ERRORS) {
        let _ = writeln!(out, "- {}", escape(&error.to_string()));
    }
    if let Some(more) = errors.len().checked_sub(COMMENT_ERRORS).filter(|n| *n > 0) {
        let _ = writeln!(
            out,
            "- and {more} more: `capstan plan` in text or JSON lists every one"
        );
    }
}

fn warnings(plan: &Plan, out: &mut String) {
    if plan.warnings.is_empty() {
        return;
    }
    out.push_str("\n#### Warnings\n\n");
    for warning in &plan.warnings {
        let _ = writeln!(out, "- ⚠️ {}", escape(warning));
    }
}

fn objects(plan: &Plan, out: &mut String) {
    if plan.objects.is_empty() {
        return;
    }
    out.push_str("\n#### Objects\n\n| | Object | Action | Declared in |\n|:-:|---|---|---|\n");
    for object in &plan.objects {
        let place = object
            .declared_at()
            .map(|place| cell_code(&place))
            .unwrap_or_default();
        let note = object
            .note()
            .map(|note| format!(" ({})", escape(note)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {}{note} | {place} |",
            object.action.sign(),
            cell_code(&object.id.to_string()),
            object.action.as_str()
        );
    }
}

fn nodes(plan: &Plan, out: &mut String) {
    if plan.nodes.is_empty() {
        return;
    }
    let canary = plan
        .policy
        .guardrails
        .as_ref()
        .is_some_and(|g| !g.canary.is_empty());
    let _ = writeln!(
        out,
        "\n#### Ordered upgrades\n\nNodes move {}in name order, at most {} at a time \
         (`maxNodesInFlight`).",
        if canary {
            "the canary first, then "
        } else {
            ""
        },
        plan.policy.max_nodes_in_flight
    );
    for node in &plan.nodes {
        let _ = writeln!(
            out,
            "\n**{}. {}**: {} {}, wave {}\n",
            node.order,
            escape(&node.node),
            code(&node.module.to_string()),
            escape(&versions(node.from.as_deref(), node.to.as_deref())),
            node.wave
        );
        if let (Some(campaign), Some(at)) = (&node.campaign, &node.held_until) {
            let _ = writeln!(
                out,
                "Held until {} (campaign {}); cordoned and drained first, uncordoned \
                 after step 4.\n",
                escape(at),
                code(campaign)
            );
        }
        if !node.gates.is_empty() {
            let _ = writeln!(out, "Gates: {}.\n", escape(&gates_summary(node)));
        }
        if let Some(at) = &node.starts_at {
            let _ = writeln!(out, "Starts at the earliest {}.\n", escape(at));
        }
        if let Some(drain) = &node.drain {
            let list = |pods: &[String]| pod_list(pods, code);
            let recreated = if drain.recreated_groups.is_empty() {
                String::new()
            } else {
                format!(
                    " LeaderWorkerSet groups recreated: {}.",
                    list(&drain.recreated_groups)
                )
            };
            let _ = writeln!(
                out,
                "Drain evicts {}; a PodDisruptionBudget protects {}; forced: {}.{recreated}\n",
                list(&drain.evicted),
                list(&drain.protected),
                forced_summary(drain)
            );
        }
        for step in &node.steps {
            let _ = writeln!(out, "{}. {}", step.number, escape(&step.description));
        }
    }
    campaigns(plan, out);
}

fn campaigns(plan: &Plan, out: &mut String) {
    if plan.campaigns.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n#### Campaigns\n");
    for campaign in &plan.campaigns {
        let phase = phase_suffix(campaign);
        let _ = writeln!(
            out,
            "- {} rolls out {}: held until {}{}",
            code(&campaign.name),
            code(&campaign.version),
            escape(&campaign.upgrade_at),
            escape(&phase)
        );
    }
}

fn leader_worker_sets(plan: &Plan, out: &mut String) {
    if plan.leader_worker_sets.is_empty() {
        return;
    }
    out.push_str("\n#### LeaderWorkerSets\n\n");
    for set in &plan.leader_worker_sets {
        let _ = writeln!(
            out,
            "- {}: {}",
            code(&format!("{}/{}", set.namespace, set.name)),
            escape(&leader_worker_set_text(set))
        );
    }
}

fn policy(plan: &Plan, out: &mut String) {
    let policy = &plan.policy;
    out.push_str("\n#### Policy\n\n");
    let waves: Vec<String> = policy
        .waves
        .iter()
        .enumerate()
        .map(|(index, nodes)| format!("{}: {}", index + 1, nodes.join(", ")))
        .collect();
    let waves = match waves.len() {
        0 => "no node moves".to_string(),
        count => format!("{} ({})", plural(count, "wave"), waves.join("; ")),
    };
    let _ = writeln!(
        out,
        "- `maxNodesInFlight` {}: {}",
        policy.max_nodes_in_flight,
        escape(&waves)
    );
    let check = &policy.require_pull_request;
    let status = match check.status {
        CheckStatus::Ok => "ok",
        CheckStatus::Warning => "⚠️ warning",
    };
    let _ = writeln!(
        out,
        "- `requirePullRequest` {}: {status}, {}",
        check.required,
        escape(&check.message)
    );
    let _ = writeln!(out, "- `prune` {}", policy.prune);
    if let Some(guardrails) = &policy.guardrails {
        let _ = writeln!(
            out,
            "- `rollout`: {}",
            escape(&guardrails_summary(guardrails))
        );
    }
}

fn diffs(plan: &Plan, out: &mut String) {
    if plan.objects.is_empty() {
        return;
    }
    out.push_str("\n#### Diffs\n");
    for object in &plan.objects {
        let _ = write!(
            out,
            "\n<details><summary>{} {} ({})</summary>\n\n{}\n</details>\n",
            object.action.sign(),
            html(&object.id.to_string()),
            object.action.as_str(),
            fenced("diff", &object.diff)
        );
    }
}

/// Splits a markdown document into parts of at most `budget` bytes plus a continuation
/// line, each valid alone: a code block, `<details>` or table cut by the split is closed
/// (or ended) in its part and opened again in the next. A line too long for a part is cut.
pub(crate) fn split(document: &str, budget: usize) -> Vec<String> {
    let mut splitter = Splitter::new(budget);
    for line in document.lines() {
        splitter.push(line);
    }
    let parts = splitter.finish();
    let count = parts.len();
    parts
        .into_iter()
        .enumerate()
        .map(|(index, part)| match index {
            0 => part,
            _ => format!("**capstan plan** (part {} of {count})\n\n{part}", index + 1),
        })
        .collect()
}

/// Builds parts line by line, knowing which blocks are open.
struct Splitter {
    budget: usize,
    parts: Vec<String>,
    current: String,
    /// Whether `current` holds nothing but reopened blocks.
    fresh: bool,
    /// The line that opened the code block being written.
    fence: Option<String>,
    /// The line that opened the `<details>` being written.
    details: Option<String>,
    /// The header and delimiter rows of the table being written.
    table: Vec<String>,
}

impl Splitter {
    fn new(budget: usize) -> Self {
        Splitter {
            budget,
            parts: Vec::new(),
            current: String::new(),
            fresh: true,
            fence: None,
            details: None,
            table: Vec::new(),
        }
    }

    fn push(&mut self, line: &str) {
        // A tenth of the budget leaves room for the blocks a part reopens.
        let longest = (self.budget / 10).max(1);
        if line.len() > longest && self.fence.is_some() {
            for piece in pieces(line, longest) {
                self.push(piece);
            }
            return;
        }
        if self.fence.is_none() && !line.starts_with('|') {
            self.table.clear();
        }
        let line = &self.cut_outside_fence(line, longest);
        let needed = self.current.len() + line.len() + 1 + self.closing_len();
        if !self.fresh && needed > self.budget {
            self.start_part();
        }
        self.current.push_str(line);
        self.current.push('\n');
        self.fresh = false;
        self.follow(line);
    }

    /// Notes the blocks `line` opens or closes.
    fn follow(&mut self, line: &str) {
        if let Some(fence) = &self.fence {
            // Only a line of at least as many backticks as the opening fence closes it.
            let opened = fence_length(fence);
            let trimmed = line.trim();
            if trimmed.len() >= opened && trimmed.chars().all(|c| c == '`') {
                self.fence = None;
            }
        } else if line.trim_start().starts_with("```") {
            self.fence = Some(line.to_string());
        } else {
            if line.starts_with("<details>") {
                self.details = Some(line.to_string());
            } else if line.starts_with("</details>") {
                self.details = None;
            } else if line.starts_with('|') && self.table.len() < 2 {
                self.table.push(line.to_string());
            }
        }
    }

    fn closing_len(&self) -> usize {
        self.closing().len()
    }

    fn closing(&self) -> String {
        let mut closing = String::new();
        if let Some(fence) = &self.fence {
            closing.push_str(&"`".repeat(fence_length(fence)));
            closing.push('\n');
        }
        if self.details.is_some() {
            closing.push_str("\n</details>\n");
        }
        closing
    }

    /// Closes the open blocks, ends the part, and opens them again in a new one.
    fn start_part(&mut self) {
        let closing = self.closing();
        let mut part = std::mem::take(&mut self.current);
        part.push_str(&closing);
        self.parts.push(part);
        if let Some(details) = &self.details {
            self.current.push_str(details);
            self.current.push_str("\n\n");
        }
        if let Some(fence) = &self.fence {
            self.current.push_str(fence);
            self.current.push('\n');
        } else {
            for row in &self.table {
                self.current.push_str(row);
                self.current.push('\n');
            }
        }
        self.fresh = true;
    }

    fn finish(mut self) -> Vec<String> {
        if !self.current.is_empty() {
            let closing = self.closing();
            self.current.push_str(&closing);
            self.parts.push(self.current);
        }
        self.parts
    }
}

/// How many backticks open the fenced code block `line` opens.
fn fence_length(line: &str) -> usize {
    line.trim_start().chars().take_while(|c| *c == '`').count()
}

impl Splitter {
    /// `line` as written outside a code block: a line longer than `longest` bytes is cut
    /// short, not split, since its second half would start a line of its own and could
    /// open a heading, a list or a quote.
    fn cut_outside_fence<'a>(&self, line: &'a str, longest: usize) -> std::borrow::Cow<'a, str> {
        if self.fence.is_some() || line.len() <= longest {
            return std::borrow::Cow::Borrowed(line);
        }
        const MARK: &str = " …(cut)";
        let mut end = longest.saturating_sub(MARK.len());
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        std::borrow::Cow::Owned(format!("{}{MARK}", &line[..end]))
    }
}

/// `line` cut into pieces of at most `size` bytes, at character boundaries.
fn pieces(line: &str, size: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        let mut end = size.min(rest.len());
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        // A character wider than `size` still goes whole.
        if end == 0 {
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asserts that a part renders alone: code blocks and `<details>` balanced.
    fn assert_balanced(part: &str) {
        let fences = part
            .lines()
            .filter(|l| l.trim_start().starts_with("```"))
            .count();
        assert_eq!(fences % 2, 0, "unclosed code block in:\n{part}");
        assert_eq!(
            part.matches("<details>").count(),
            part.matches("</details>").count(),
            "unbalanced <details> in:\n{part}"
        );
    }

    fn long_diff_document(lines: usize) -> String {
        let mut doc = String::from("**capstan plan**: 1 to create\n\n#### Diffs\n\n");
        doc.push_str("<details><summary>+ ConfigMap default/big (create)</summary>\n\n```diff\n");
        for i in 0..lines {
            doc.push_str(&format!("+  key-{i}: value-{i}\n"));
        }
        doc.push_str("```\n\n</details>\n");
        doc
    }

    #[test]
    fn a_comment_lists_the_first_errors_and_counts_the_rest() {
        for (count, listed, more) in [(3, 3, None), (100, 100, None), (250, 100, Some(150))] {
            let errors: Vec<String> = (0..count).map(|i| format!("f.yaml:{i}: bad")).collect();
            let mut out = String::new();
            error_list(&errors, &mut out);
            let lines = out.lines().filter(|l| l.starts_with("- f.yaml")).count();
            assert_eq!(lines, listed, "{count}");
            let tail = more.map(|n| format!("- and {n} more: "));
            assert_eq!(
                tail.as_deref().is_some_and(|t| out.contains(t)),
                more.is_some(),
                "{out}"
            );
        }
    }

    #[test]
    fn a_short_document_is_one_part() {
        let doc = long_diff_document(3);
        assert_eq!(split(&doc, 10_000), vec![doc]);
    }

    #[test]
    fn a_diff_cut_by_a_split_is_closed_and_reopened() {
        let doc = long_diff_document(200);
        let parts = split(&doc, 1_000);
        assert!(parts.len() > 3, "{} parts", parts.len());
        assert!(parts[0].starts_with("**capstan plan**: 1 to create"));
        for (index, part) in parts.iter().enumerate() {
            assert!(
                part.len() <= 1_000 + 64,
                "part {index}: {} bytes",
                part.len()
            );
            assert_balanced(part);
            if index > 0 {
                assert!(
                    part.starts_with(&format!(
                        "**capstan plan** (part {} of {})\n\n<details><summary>",
                        index + 1,
                        parts.len()
                    )),
                    "{part}"
                );
                assert!(part.contains("```diff\n+  key-"), "{part}");
            }
        }
        // Nothing is lost: every line of the diff is in some part.
        let all = parts.concat();
        for i in 0..200 {
            assert!(
                all.contains(&format!("+  key-{i}: value-{i}\n")),
                "line {i}"
            );
        }
    }

    #[test]
    fn a_table_cut_by_a_split_repeats_its_header() {
        let mut doc = String::from("| | Object |\n|:-:|---|\n");
        for i in 0..100 {
            doc.push_str(&format!("| + | `ConfigMap default/c{i}` |\n"));
        }
        doc.push_str("\nafter the table\n");
        let parts = split(&doc, 500);
        assert!(parts.len() > 2);
        for part in &parts[1..] {
            let body = part
                .split_once("\n\n")
                .map(|(_, body)| body)
                .unwrap_or(part);
            if body.starts_with('|') {
                assert!(body.starts_with("| | Object |\n|:-:|---|\n"), "{part}");
            }
        }
        assert!(parts.last().unwrap().contains("after the table"));
    }

    #[test]
    fn a_line_longer_than_a_part_is_cut() {
        let doc = format!("```diff\n+{}\n```\n", "é".repeat(3_000));
        let parts = split(&doc, 1_000);
        assert!(parts.len() > 5);
        for part in &parts {
            assert!(part.len() <= 1_000 + 64, "{} bytes", part.len());
            assert_balanced(part);
        }
    }
}
