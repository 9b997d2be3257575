//! Every walkthrough in the docs is a test: the commands of README.md and docs/*.md run as
//! they are written, in order, in one bash session per document, and the outputs the
//! documents show are checked against what the commands printed. A document that drifts
//! from the code fails here, naming the document, the line, the command and its output.
//! docs/walkthroughs.md says the same for the writers of documents.
//!
//! How a document is read:
//! - A ```sh block's commands run, under `set -euo pipefail`: the first that fails ends
//!   the document's run. A ```console block's `$ ` lines run the same way, and the lines
//!   after each are its output.
//! - An untagged or ```text block right after a command block (prose between, but no
//!   heading or other block) is that block's output; `<!-- walkthrough: output -->`
//!   before a block makes it the output of the last command block run, across headings.
//!   An output is checked by `walkthroughs/output.rs`'s rule: its lines are found among
//!   the printed lines, consecutive, once times, SHAs, UUIDs, durations, ports and the
//!   home folder are normalised; a line `...` stands for any lines, `...` in a line for
//!   any text.
//! - Only a marker right before a block exempts it, and the run lists it with its reason:
//!   `<!-- walkthrough: skip (why) -->` does not run a command block,
//!   `<!-- walkthrough: unchecked (why) -->` does not check an output. A synopsis is a
//!   ```text block. A marker the runner does not understand, a ```bash block, or `$ `
//!   commands in an untagged block fail the document, so that no command escapes.
//!
//! The reader's machine, one per document, in a scratch folder:
//! - HOME, XDG_STATE_HOME (`~/.local/state`) and TMPDIR are scratch folders; nothing of
//!   the developer's environment comes in but the PATH to the system's tools.
//! - `~/capstan` is a capstan checkout (a copy of examples/ and Cargo.toml, committed on
//!   `main`): the session starts there, as documents start "from the root of a capstan
//!   checkout".
//! - `kubectl` is on the PATH: the control plane release's, built by
//!   `hack/real-cluster/build-kubectl`.
//! - `cargo` stands in for a build of capstan, which this test has built already (the
//!   binary `env!("CARGO_BIN_EXE_capstan")`): `cargo run [--release] -- ARGS` runs
//!   `capstan ARGS`, `cargo build [--release]` links it as target/<profile>/capstan, and
//!   `cargo install --path .` links it into ~/.cargo/bin, which is on the PATH. Each only
//!   where cargo would find the checkout (a Cargo.toml there or above, or
//!   `--manifest-path`), and `capstan` itself is on the PATH only once installed, as for a
//!   reader. Any other cargo command fails, naming the skip marker.
//! - What a document leaves running (`capstan sync ... &`) is stopped with its session:
//!   SIGTERM to the session's process group, SIGKILL after 15 s.
//!
//! Documents run one at a time, across test processes too: their commands use the fixed
//! port a reader's do (`capstan sync`'s 127.0.0.1:9477).

mod markdown;
mod output;
mod session;

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use markdown::{ShownOutput, Walkthrough};
use session::{Failure, Run, Tools};

/// How long one document may run. Each takes well under a minute; the margin is for a
/// loaded machine.
const DEADLINE: Duration = Duration::from_secs(240);

/// `capstan sync`'s default --listen, which walkthroughs use as a reader does.
const SYNC_LISTEN: &str = "127.0.0.1:9477";

/// Set to a part of a document's path (`sync.md`) to run only the documents that match
/// (and `CAPSTAN_WALKTHROUGHS_KEEP` to keep their scratch folders, [`session::KEEP_ENV`]).
const ONLY_ENV: &str = "CAPSTAN_WALKTHROUGHS";

/// Lines of a command's output a failure shows.
const TAIL: usize = 40;

#[test]
fn every_walkthrough_in_the_docs_runs_as_written() {
    crate::common::requires_stand_in(
        "start from `capstan sync` and `capstan cluster serve`, as the walkthroughs' readers do",
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let only = std::env::var(ONLY_ENV).ok();
    let documents: Vec<PathBuf> = documents(root)
        .into_iter()
        .filter(|doc| {
            only.as_deref()
                .is_none_or(|only| doc.to_string_lossy().contains(only))
        })
        .collect();
    assert!(
        !documents.is_empty(),
        "no document matches {ONLY_ENV}={only:?}"
    );
    let tools = Tools {
        capstan: PathBuf::from(env!("CARGO_BIN_EXE_capstan")),
        kubectl: Some(
            capstan_real_cluster::kubectl()
                .unwrap_or_else(|e| panic!("kubectl for the walkthroughs: {e:#}")),
        ),
        checkout: root.to_path_buf(),
    };
    let _one_at_a_time = RunLock::take();
    let started = Instant::now();
    let mut summary = Summary::default();
    let mut problems = Vec::new();
    for path in &documents {
        let name = path.to_string_lossy().into_owned();
        let text =
            std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("read {name}: {e}"));
        if let Err(problem) = sync_port_free() {
            problems.push(format!("{name}: {problem}"));
            continue;
        }
        let outcome = run_document(&name, &text, &tools);
        summary.add(&name, &outcome);
        problems.extend(outcome.problems);
    }
    let report = summary.render(started.elapsed());
    // Straight to stderr, past the test harness's capture: CI's log shows what ran and
    // what was skipped, and why, whether the test passes or not.
    let _ = std::io::stderr().write_all(report.as_bytes());
    assert!(
        problems.is_empty(),
        "{} walkthrough problem(s):\n\n{}",
        problems.len(),
        problems.join("\n\n")
    );
}

#[test]
fn a_failing_command_fails_its_walkthrough_naming_the_line_the_command_and_its_output() {
    let doc = "# Trying it\n\n```sh\necho starting\nsleep 300 &   # left running\necho \"pid $!\"\nprintf 'the output\\n' && false\necho never\n```\n";
    let outcome = run_document("try.md", doc, &self_test_tools());
    assert_eq!(outcome.problems.len(), 1, "{:#?}", outcome.problems);
    let problem = &outcome.problems[0];
    for part in [
        "try.md:7: this command failed (exit status 1):",
        "printf 'the output\\n' && false",
        "the output",
        "`sleep 300 &   # left running` (line 5, in the background)",
    ] {
        assert!(problem.contains(part), "{part:?} in:\n{problem}");
    }
    assert_eq!(
        outcome.commands_run, 4,
        "the failing command is the last run"
    );
    let sleeper = outcome.printed[2]
        .trim()
        .strip_prefix("pid ")
        .expect("the sleep's pid");
    // Gone, or a zombie its new parent has not reaped yet: not running.
    let running = std::fs::read_to_string(format!("/proc/{sleeper}/stat"))
        .is_ok_and(|stat| stat.contains("(sleep) ") && !stat.contains("(sleep) Z"));
    assert!(
        !running,
        "the background sleep was stopped with its session"
    );
}

#[test]
fn a_command_that_ends_in_failure_fails_its_walkthrough_where_set_e_would_go_on() {
    let doc = "```sh\nls no-such-file && echo listed\necho never\n```\n";
    let outcome = run_document("and.md", doc, &self_test_tools());
    assert_eq!(outcome.commands_run, 1);
    let problem = outcome.problems.first().expect("a problem");
    assert!(
        problem.starts_with("and.md:2: this command failed (exit status 2):"),
        "{problem}"
    );
}

#[test]
fn an_output_that_drifted_from_its_document_fails_naming_the_line_shown() {
    let doc = "```sh\necho 'applied 3cf3bea: 5 created in 117 ms'\n```\nIt prints:\n```\napplied 9a1c2e4: 4 created in 3 ms\n```\n";
    let outcome = run_document("drift.md", doc, &self_test_tools());
    assert_eq!(outcome.problems.len(), 1, "{:#?}", outcome.problems);
    let problem = &outcome.problems[0];
    for part in [
        "drift.md:6: the output shown here is not what the command at line 2 printed",
        "line 6 is not found: `applied 9a1c2e4: 4 created in 3 ms`",
        "applied 3cf3bea: 5 created in 117 ms",
    ] {
        assert!(problem.contains(part), "{part:?} in:\n{problem}");
    }
    // The same shown with what changes from run to run only: found.
    let doc = doc.replace("4 created in 3 ms", "5 created in 3 ms");
    let outcome = run_document("drift.md", &doc, &self_test_tools());
    assert!(outcome.problems.is_empty(), "{:#?}", outcome.problems);
    assert_eq!(outcome.outputs_checked, 1);
}

#[test]
fn cargo_in_a_walkthrough_runs_builds_and_installs_the_capstan_this_test_built() {
    let doc = "```sh\n! command -v capstan     # not installed yet\ncargo run --release -- --version\ncargo build --release\ntarget/release/capstan --version\n(cd ~ && ! cargo run -- --version)   # no Cargo.toml there\ncargo install --locked --path .\ncapstan --version\n! cargo test\n```\n";
    let outcome = run_document("cargo.md", doc, &self_test_tools());
    assert!(outcome.problems.is_empty(), "{:#?}", outcome.problems);
    assert_eq!(outcome.commands_run, 8);
}

/// The documents read as walkthroughs: README.md, then docs/*.md by name.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("read docs/")
        .map(|entry| entry.expect("an entry of docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| {
            path.strip_prefix(root)
                .expect("under the checkout")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    docs.insert(0, PathBuf::from("README.md"));
    docs
}

/// Tools for the runner's own tests, which need no cluster and no kubectl.
fn self_test_tools() -> Tools {
    Tools {
        capstan: PathBuf::from(env!("CARGO_BIN_EXE_capstan")),
        kubectl: None,
        checkout: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// What one document's run came to.
#[derive(Default)]
struct Outcome {
    commands: usize,
    commands_run: usize,
    outputs_checked: usize,
    skipped: Vec<markdown::Exemption>,
    unchecked: Vec<markdown::Exemption>,
    elapsed: Option<Duration>,
    problems: Vec<String>,
    /// What each command run printed.
    printed: Vec<String>,
}

/// Reads and runs the document `name`, then checks the outputs it shows.
fn run_document(name: &str, text: &str, tools: &Tools) -> Outcome {
    let walkthrough = match markdown::read(name, text) {
        Ok(walkthrough) => walkthrough,
        Err(problem) => {
            return Outcome {
                problems: vec![problem],
                ..Outcome::default()
            };
        }
    };
    let mut outcome = Outcome {
        commands: walkthrough.commands.len(),
        skipped: walkthrough.skipped.clone(),
        unchecked: walkthrough.unchecked.clone(),
        ..Outcome::default()
    };
    if walkthrough.commands.is_empty() {
        return outcome;
    }
    let run = session::run(&walkthrough, tools, DEADLINE);
    outcome.commands_run = run.started;
    outcome.elapsed = Some(run.elapsed);
    outcome.printed = run.printed.clone();
    if let Some(failure) = &run.failure {
        outcome
            .problems
            .push(describe_failure(name, &walkthrough, &run, failure));
    } else {
        for shown in &walkthrough.outputs {
            outcome.outputs_checked += 1;
            if let Some(problem) = check_output(name, &walkthrough, &run, shown) {
                outcome.problems.push(problem);
            }
        }
    }
    let kept = run.kept.as_ref().map_or(String::new(), |dir| {
        format!("\n  (its scratch folder is kept: {})", dir.display())
    });
    for problem in &mut outcome.problems {
        problem.push_str(&kept);
    }
    outcome
}

/// Waits (a while) until no process listens on `capstan sync`'s default port: a
/// walkthrough's sync must bind it, as a reader's does.
fn sync_port_free() -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match std::net::TcpListener::bind(SYNC_LISTEN) {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > until => {
                return Err(format!(
                    "{SYNC_LISTEN} is in use ({e}): walkthroughs start `capstan sync` on its \
                     default --listen, as a reader does; stop what listens there"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    }
}

fn describe_failure(name: &str, walkthrough: &Walkthrough, run: &Run, failure: &Failure) -> String {
    let (command, line, what) = match failure {
        Failure::Failed {
            command,
            line,
            status,
        } => (
            Some(*command),
            *line,
            format!("this command failed (exit status {status}):"),
        ),
        Failure::TimedOut { command } => (
            *command,
            None,
            format!(
                "still running after {}s, when the document's run is stopped:",
                DEADLINE.as_secs()
            ),
        ),
        Failure::Stopped { command, status } => (
            *command,
            None,
            format!(
                "bash stopped here (exit status {}) with no failure it could report \
                 (an unset variable under `set -u`, or an `exit`):",
                status.map_or("none".into(), |s| s.to_string())
            ),
        ),
    };
    let mut message = String::new();
    let Some(index) = command else {
        let _ = write!(message, "{name}: {what} before its first command");
        append_block(&mut message, "bash printed", &run.session_log);
        return message;
    };
    let command = &walkthrough.commands[index];
    let line = line
        .filter(|line| command.lines.iter().any(|l| l.number == *line))
        .unwrap_or(command.line());
    let _ = writeln!(message, "{name}:{line}: {what}");
    for text in command.text().lines() {
        let _ = writeln!(message, "    {text}");
    }
    append_block(&mut message, "it printed", &run.printed[index]);
    for (earlier, printed) in walkthrough.commands[..index].iter().zip(&run.printed) {
        if earlier.is_background() {
            append_block(
                &mut message,
                &format!(
                    "`{}` (line {}, in the background) printed",
                    earlier.text(),
                    earlier.line()
                ),
                printed,
            );
        }
    }
    if !run.session_log.trim().is_empty() {
        append_block(&mut message, "bash printed", &run.session_log);
    }
    message.trim_end().to_string()
}

fn check_output(
    name: &str,
    walkthrough: &Walkthrough,
    run: &Run,
    shown: &ShownOutput,
) -> Option<String> {
    let printed: String = shown
        .commands
        .clone()
        .map(|i| run.printed[i].as_str())
        .collect();
    let lines: Vec<&str> = shown.lines.iter().map(|line| line.text.as_str()).collect();
    let mismatch = output::find(&lines, &printed, &run.home).err()?;
    let first = &walkthrough.commands[shown.commands.start];
    let last = &walkthrough.commands[shown.commands.end - 1];
    let by = if shown.commands.len() == 1 {
        format!("the command at line {}", first.line())
    } else {
        format!(
            "the commands at lines {}-{}",
            first.line(),
            last.lines.last().map_or(last.line(), |l| l.number)
        )
    };
    let unmatched = &shown.lines[mismatch.first_unmatched];
    let mut message = format!(
        "{name}:{}: the output shown here is not what {by} printed: line {} is not found: `{}`{}\n",
        shown.lines[0].number,
        unmatched.number,
        unmatched.text,
        if mismatch.first_unmatched > 0 {
            " (after the lines shown before it)"
        } else {
            ""
        },
    );
    for command in &walkthrough.commands[shown.commands.clone()] {
        for text in command.text().lines() {
            let _ = writeln!(message, "    $ {text}");
        }
    }
    // What was printed from where the lines found so far end: where they part.
    let lines: Vec<&str> = printed.lines().collect();
    let from = mismatch.printed_from.saturating_sub(3).min(lines.len());
    let to = (from + TAIL).min(lines.len());
    let _ = writeln!(
        message,
        "  they printed (lines {}-{} of {}):",
        from + 1,
        to,
        lines.len()
    );
    for line in &lines[from..to] {
        let _ = writeln!(message, "    {line}");
    }
    Some(message.trim_end().to_string())
}

/// Appends `text`'s last lines, indented, under `title`.
fn append_block(message: &mut String, title: &str, text: &str) {
    let lines: Vec<&str> = text.lines().collect();
    if lines.is_empty() {
        let _ = writeln!(message, "  {title} nothing");
        return;
    }
    let from = lines.len().saturating_sub(TAIL);
    if from > 0 {
        let _ = writeln!(message, "  {title} (its last {TAIL} lines):");
    } else {
        let _ = writeln!(message, "  {title}:");
    }
    for line in &lines[from..] {
        let _ = writeln!(message, "    {line}");
    }
}

/// The run's report: per document, commands run, outputs checked, what was skipped and
/// why; then the totals.
#[derive(Default)]
struct Summary {
    lines: String,
    documents: usize,
    commands: usize,
    commands_run: usize,
    outputs: usize,
    skipped: usize,
    unchecked: usize,
    failed: usize,
}

impl Summary {
    fn add(&mut self, name: &str, outcome: &Outcome) {
        self.documents += 1;
        self.commands += outcome.commands;
        self.commands_run += outcome.commands_run;
        self.outputs += outcome.outputs_checked;
        self.skipped += outcome.skipped.len();
        self.unchecked += outcome.unchecked.len();
        let state = if outcome.problems.is_empty() {
            ""
        } else {
            self.failed += 1;
            "  FAILED"
        };
        let _ = writeln!(
            self.lines,
            "  {name:<32} {:>3} of {:>3} commands run, {:>2} outputs checked{}{state}",
            outcome.commands_run,
            outcome.commands,
            outcome.outputs_checked,
            outcome
                .elapsed
                .map_or(String::new(), |e| format!(", {:.1}s", e.as_secs_f64())),
        );
        for exemption in &outcome.skipped {
            let _ = writeln!(
                self.lines,
                "      skipped   line {:>3} ({}): {}",
                exemption.line, exemption.what, exemption.reason
            );
        }
        for exemption in &outcome.unchecked {
            let _ = writeln!(
                self.lines,
                "      unchecked line {:>3} ({}): {}",
                exemption.line, exemption.what, exemption.reason
            );
        }
    }

    fn render(&self, elapsed: Duration) -> String {
        format!(
            "\nwalkthroughs (tests/integration/walkthroughs.rs):\n{}  total: {} of {} commands run in {} documents, {} outputs checked, {} blocks skipped, {} outputs unchecked, {} document(s) failed, {:.1}s\n\n",
            self.lines,
            self.commands_run,
            self.commands,
            self.documents,
            self.outputs,
            self.skipped,
            self.unchecked,
            self.failed,
            elapsed.as_secs_f64()
        )
    }
}

/// An exclusive lock on a file in the temp folder, held while documents run, so that two
/// test processes on one machine do not run walkthroughs at once (both would want
/// [`SYNC_LISTEN`]). Released when dropped (the file closes).
struct RunLock {
    /// Held open: closing it releases the lock.
    _file: std::fs::File,
}

impl RunLock {
    fn take() -> RunLock {
        let path = std::env::temp_dir().join("capstan-walkthroughs.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        // SAFETY: flock(2) on a descriptor this File owns and keeps open.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(locked, 0, "lock {}", path.display());
        RunLock { _file: file }
    }
}
