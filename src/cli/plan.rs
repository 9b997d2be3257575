//! `capstan plan`: what merging a change will do, before the merge (docs/plan.md).

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use crate::sync::inventory::DEFAULT_SYNC_NAME;
use crate::sync::plan::{self, Plan, PlanInput};
use crate::sync::source::{Auth, Source, WORK_TREE};

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The repository: a local repository, a folder inside one (which becomes --path), or a
    /// URL (cloned into a temporary directory; only the branch is fetched).
    #[arg(long, default_value = ".")]
    pub repo: String,
    /// The tracked branch; without a local branch of that name, the one of origin stands in.
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The synced folder inside the repository.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// The revision compared with [default: where --head left the branch (their merge base);
    /// HEAD for --head WORKTREE].
    #[arg(long)]
    pub base: Option<String>,
    /// The revision planned (HEAD: the checked-out commit), or WORKTREE: the work tree's
    /// files as they are, uncommitted changes included, as `git add -A` would take them.
    #[arg(long, default_value = "HEAD")]
    pub head: String,
    /// Compare head with this live cluster (server-side apply dry runs) instead of base.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: dry-run every object head declares, as `kubectl diff
    /// --server-side` does, rather than only those the GitSync's inventory and the live
    /// objects do not show unchanged.
    #[arg(long, requires = "kubeconfig")]
    pub full: bool,
    /// The GitSync whose inventory says what a live plan prunes.
    #[arg(long, default_value = DEFAULT_SYNC_NAME)]
    pub name: String,
    /// How the plan is printed.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Exit 2 when there are changes (0: none, 1: errors), as Terraform's option.
    #[arg(long)]
    pub detailed_exitcode: bool,
    /// Also write the plan to this file; markdown parts after the first go to FILE.2, FILE.3...
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// The pull request the plan is for (a CI checkout's merge commit does not name it).
    #[arg(long)]
    pub pull_request: Option<u64>,
}

/// How the plan is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For terminals; coloured when stdout is one and NO_COLOR is unset.
    Text,
    /// For pull-request comments, in parts under 65,536 characters.
    Markdown,
    /// The schema of docs/plan.md.
    Json,
}

pub async fn run(args: PlanArgs) -> anyhow::Result<i32> {
    let state_dir = StateDir::new();
    let input = read_commits(&args, &state_dir.0)?;
    let plan = match &args.kubeconfig {
        None => plan::offline(&input),
        Some(path) => {
            let options = plan::LiveOptions { full: args.full };
            let client = crate::runtime::client_for(path).await?;
            plan::live(&input, &client, &args.name, options).await?
        }
    };
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    print!("{}", stdout_text(&render(&plan, args.format, color)));
    if let Some(output) = &args.output {
        write_parts(output, &render(&plan, args.format, false))?;
    }
    Ok(plan.exit_code(args.detailed_exitcode))
}

/// Resolves base and head and reads their files.
fn read_commits(args: &PlanArgs, state_dir: &Path) -> anyhow::Result<PlanInput> {
    let source = Source::open_allowing_new_path(
        &args.repo,
        &args.branch,
        args.path.as_deref(),
        state_dir,
        Auth::None,
    )?;
    // The work tree is planned as a commit on top of HEAD: against HEAD by default, so
    // the plan shows the uncommitted change alone.
    let (head, base) = if args.head == WORK_TREE {
        let head = source.work_tree_commit()?;
        let base = source.resolve(args.base.as_deref().unwrap_or("HEAD"))?;
        (head, base)
    } else {
        let head = source.resolve(&args.head)?;
        let base = match &args.base {
            Some(rev) => source.resolve(rev)?,
            None => source.merge_base(&args.head, &args.branch)?,
        };
        (head, base)
    };
    Ok(PlanInput::read(&source, base, head, args.pull_request)?)
}

/// The plan's parts: several only for long markdown.
fn render(plan: &Plan, format: Format, color: bool) -> Vec<String> {
    match format {
        Format::Text => vec![plan::render_text(plan, color)],
        Format::Markdown => plan::render_markdown(plan),
        Format::Json => vec![plan::render_json(plan)],
    }
}

/// All parts, a line `<!-- capstan plan: part N -->` before each part after the first.
fn stdout_text(parts: &[String]) -> String {
    let mut text = String::new();
    for (index, part) in parts.iter().enumerate() {
        if index > 0 {
            text.push_str(&format!("<!-- capstan plan: part {} -->\n", index + 1));
        }
        text.push_str(part);
        if !part.ends_with('\n') {
            text.push('\n');
        }
    }
    text
}

/// Part 1 to `output`, part N to `output.N`; parts left from a longer earlier plan are
/// removed, so the files are exactly this plan's.
fn write_parts(output: &Path, parts: &[String]) -> anyhow::Result<()> {
    let file_of = |index: usize| match index {
        0 => output.to_path_buf(),
        _ => PathBuf::from(format!("{}.{}", output.display(), index + 1)),
    };
    for (index, part) in parts.iter().enumerate() {
        let file = file_of(index);
        std::fs::write(&file, part).with_context(|| format!("writing {}", file.display()))?;
    }
    let mut stale = parts.len().max(1);
    while std::fs::remove_file(file_of(stale)).is_ok() {
        stale += 1;
    }
    Ok(())
}

/// Where a remote repository is cloned for one plan; removed when the plan is done.
struct StateDir(PathBuf);

impl StateDir {
    fn new() -> Self {
        StateDir(std::env::temp_dir().join(format!("capstan-plan-{}", uuid::Uuid::new_v4())))
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        // Nothing is there for a local repository.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
