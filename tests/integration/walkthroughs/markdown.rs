//! A document read as a walkthrough: its commands in order, the outputs it shows for them,
//! and what it marks as not run or not checked (the conventions are in `walkthroughs.rs`).

use std::ops::Range;
use std::process::{Command as Process, Stdio};

/// A line of the document, numbered from 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub number: usize,
    pub text: String,
}

/// One command as bash reads it: a line, or several for a continued line, a here-document
/// or a compound command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    pub lines: Vec<Line>,
}

impl Command {
    /// The document line it starts on.
    pub fn line(&self) -> usize {
        self.lines[0].number
    }

    /// Its text as written.
    pub fn text(&self) -> String {
        let lines: Vec<&str> = self.lines.iter().map(|line| line.text.as_str()).collect();
        lines.join("\n")
    }

    /// Whether it leaves a process running in the background (`... &`).
    pub fn is_background(&self) -> bool {
        let last = self.lines.last().map_or("", |line| line.text.as_str());
        let code = last.split(" #").next().unwrap_or(last).trim_end();
        code.ends_with('&') && !code.ends_with("&&")
    }
}

/// An output the document shows, to be found in what some of its commands printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShownOutput {
    /// The lines shown (a console block's, or a text block's).
    pub lines: Vec<Line>,
    /// The commands whose output (together, in order) must contain it.
    pub commands: Range<usize>,
}

/// A block the document marks as not run, or an output as not checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exemption {
    /// The line of the block's opening fence.
    pub line: usize,
    pub what: &'static str,
    pub reason: String,
}

/// A document as a walkthrough.
#[derive(Debug, Default)]
pub struct Walkthrough {
    pub commands: Vec<Command>,
    pub outputs: Vec<ShownOutput>,
    pub skipped: Vec<Exemption>,
    pub unchecked: Vec<Exemption>,
}

/// What a `<!-- walkthrough: ... -->` marker asks of the block after it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Marker {
    Skip(String),
    Output,
    Unchecked(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// ```sh: commands.
    Shell,
    /// ```console: `$ ` commands, each followed by its output.
    Console,
    /// Untagged or ```text: an output, a synopsis, or an illustration.
    Text,
    /// Anything else (yaml, json, ...): never run.
    Other,
}

struct Block {
    /// The line of the opening fence.
    line: usize,
    kind: Kind,
    lines: Vec<Line>,
}

/// Reads `text`, the document `name`. Errors name the document and line: a marker that
/// is not understood or not where it can apply, a command block tagged other than `sh` or
/// `console`, a command that bash cannot read, commands in an untagged block.
pub fn read(name: &str, text: &str) -> Result<Walkthrough, String> {
    let mut walkthrough = Walkthrough::default();
    // The command block the next text block is the output of, with the range of its
    // commands; cleared by a heading or any other block.
    let mut last_commands: Option<Range<usize>> = None;
    // The last command block run at all, for an `output` marker across headings.
    let mut last_run: Option<Range<usize>> = None;
    for Marked { marker, item } in items(name, text)? {
        let block = match item {
            Item::Heading => {
                if let Some(marker) = marker {
                    return Err(format!(
                        "{name}:{}: a walkthrough marker must be right before a fenced block",
                        marker.1
                    ));
                }
                last_commands = None;
                continue;
            }
            Item::Block(block) => block,
        };
        let at = |what: &str| format!("{name}:{}: {what}", block.line);
        let marker = marker.map(|(marker, _)| marker);
        match (block.kind, marker) {
            (Kind::Shell | Kind::Console, Some(Marker::Skip(reason))) => {
                walkthrough.skipped.push(Exemption {
                    line: block.line,
                    what: if block.kind == Kind::Shell {
                        "sh block"
                    } else {
                        "console block"
                    },
                    reason,
                });
                last_commands = None;
            }
            (Kind::Shell, None) => {
                let start = walkthrough.commands.len();
                walkthrough
                    .commands
                    .extend(split_commands(&block.lines).map_err(|e| at(&e))?);
                last_commands = Some(start..walkthrough.commands.len());
                last_run = last_commands.clone();
            }
            (Kind::Console, None) => {
                let start = walkthrough.commands.len();
                for (command, shown) in console(&block.lines).map_err(|e| at(&e))? {
                    let index = walkthrough.commands.len();
                    walkthrough.commands.push(command);
                    if !shown.is_empty() {
                        walkthrough.outputs.push(ShownOutput {
                            lines: shown,
                            commands: index..index + 1,
                        });
                    }
                }
                last_commands = None;
                last_run = Some(start..walkthrough.commands.len());
            }
            (Kind::Text, None) => {
                if let Some(commands) = last_commands.take() {
                    walkthrough.outputs.push(ShownOutput {
                        lines: block.lines,
                        commands,
                    });
                } else if looks_like_commands(&block.lines) {
                    return Err(at(
                        "commands (`$ ...`) in an untagged block: tag it ```console to run \
                         them, or mark it <!-- walkthrough: skip (why) -->",
                    ));
                }
            }
            (Kind::Text, Some(Marker::Output)) => {
                let commands = last_run.clone().ok_or_else(|| {
                    at("`walkthrough: output` with no command block run before it")
                })?;
                walkthrough.outputs.push(ShownOutput {
                    lines: block.lines,
                    commands,
                });
                last_commands = None;
            }
            (Kind::Text, Some(Marker::Unchecked(reason))) => {
                if last_commands.take().is_none() {
                    return Err(at(
                        "`walkthrough: unchecked` on a block that follows no command block: \
                         it is not checked anyway",
                    ));
                }
                walkthrough.unchecked.push(Exemption {
                    line: block.line,
                    what: "output",
                    reason,
                });
            }
            (Kind::Text, Some(Marker::Skip(reason))) if looks_like_commands(&block.lines) => {
                walkthrough.skipped.push(Exemption {
                    line: block.line,
                    what: "untagged block of commands",
                    reason,
                });
                last_commands = None;
            }
            (Kind::Other, None) => last_commands = None,
            (kind, Some(marker)) => {
                return Err(at(&format!(
                    "`walkthrough: {}` does not apply to {}",
                    match marker {
                        Marker::Skip(_) => "skip",
                        Marker::Output => "output",
                        Marker::Unchecked(_) => "unchecked",
                    },
                    match kind {
                        Kind::Shell => "a ```sh block",
                        Kind::Console => "a ```console block",
                        Kind::Text => "this block",
                        Kind::Other => "a block that is never run",
                    }
                )));
            }
        }
    }
    Ok(walkthrough)
}

enum Item {
    Heading,
    Block(Block),
}

/// A heading or a block, with the marker right before it and the marker's line.
struct Marked {
    marker: Option<(Marker, usize)>,
    item: Item,
}

/// The headings and fenced blocks of the document, each with its marker.
fn items(name: &str, text: &str) -> Result<Vec<Marked>, String> {
    let mut items = Vec::new();
    let mut marker: Option<(Marker, usize)> = None;
    let mut lines = text.lines().enumerate().map(|(i, text)| (i + 1, text));
    while let Some((number, line)) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(fence) = fence(trimmed) {
            let indent = line.len() - trimmed.len();
            let info = trimmed[fence.len()..].trim();
            let kind = match info.split_whitespace().next().unwrap_or("") {
                "sh" => Kind::Shell,
                "console" => Kind::Console,
                "" | "text" => Kind::Text,
                tag @ ("bash" | "shell" | "zsh" | "shell-session" | "sh-session") => {
                    return Err(format!(
                        "{name}:{number}: a ```{tag} block: tag commands ```sh (or ```console \
                         with `$ ` prompts) so that the walkthrough test runs them, or ```text \
                         if they are not to be run"
                    ));
                }
                _ => Kind::Other,
            };
            let mut content = Vec::new();
            let mut closed = false;
            for (inner, text) in lines.by_ref() {
                let inner_trimmed = text.trim_start();
                if inner_trimmed.starts_with(fence) && inner_trimmed.trim_end() == fence {
                    closed = true;
                    break;
                }
                // Content indented with its fence (a block in a list) loses that indent.
                let cut = text.len() - text.trim_start().len();
                content.push(Line {
                    number: inner,
                    text: text[cut.min(indent)..].to_string(),
                });
            }
            if !closed {
                return Err(format!("{name}:{number}: a fenced block that never closes"));
            }
            items.push(Marked {
                marker: marker.take(),
                item: Item::Block(Block {
                    line: number,
                    kind,
                    lines: content,
                }),
            });
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix("<!--")
            && comment.contains("walkthrough")
        {
            if marker.is_some() {
                return Err(format!(
                    "{name}:{number}: two walkthrough markers before one block"
                ));
            }
            marker = Some((parse_marker(name, number, comment)?, number));
            continue;
        }
        if trimmed.starts_with('#') {
            items.push(Marked {
                marker: marker.take(),
                item: Item::Heading,
            });
            continue;
        }
        if !trimmed.is_empty()
            && let Some((_, at)) = marker
        {
            return Err(format!(
                "{name}:{at}: a walkthrough marker must be right before a fenced block \
                 (line {number} comes between)"
            ));
        }
    }
    if let Some((_, at)) = marker {
        return Err(format!(
            "{name}:{at}: a walkthrough marker with no block after it"
        ));
    }
    Ok(items)
}

/// The opening fence of a line (its backticks), if it is one.
fn fence(trimmed: &str) -> Option<&str> {
    let ticks = trimmed.len() - trimmed.trim_start_matches('`').len();
    (ticks >= 3).then(|| &trimmed[..ticks])
}

/// `<!-- walkthrough: skip (why) -->`, `... output -->`, `... unchecked (why) -->`, from
/// the text after `<!--`.
fn parse_marker(name: &str, number: usize, comment: &str) -> Result<Marker, String> {
    let wrong = |what: &str| {
        format!(
            "{name}:{number}: {what}; a marker is <!-- walkthrough: skip (why) -->, \
             <!-- walkthrough: output --> or <!-- walkthrough: unchecked (why) -->"
        )
    };
    let body = comment
        .trim_end()
        .strip_suffix("-->")
        .ok_or_else(|| wrong("a marker on one line, ending with -->"))?
        .trim();
    let body = body
        .strip_prefix("walkthrough:")
        .ok_or_else(|| wrong("a comment naming `walkthrough` that is no marker"))?
        .trim();
    let (word, rest) = body.split_once(char::is_whitespace).unwrap_or((body, ""));
    let reason = || -> Result<String, String> {
        let reason = rest
            .trim()
            .strip_prefix('(')
            .and_then(|rest| rest.strip_suffix(')'))
            .map(str::trim)
            .unwrap_or("");
        if reason.is_empty() {
            Err(wrong(&format!("`{word}` needs its reason in parentheses")))
        } else {
            Ok(reason.to_string())
        }
    };
    match word {
        "skip" => Ok(Marker::Skip(reason()?)),
        "unchecked" => Ok(Marker::Unchecked(reason()?)),
        "output" if rest.trim().is_empty() => Ok(Marker::Output),
        _ => Err(wrong(&format!("`{body}` is not understood"))),
    }
}

/// Whether a text block holds commands at a prompt.
fn looks_like_commands(lines: &[Line]) -> bool {
    lines
        .iter()
        .find(|line| !line.text.trim().is_empty())
        .is_some_and(|line| line.text.starts_with("$ "))
}

/// The commands of a ```sh block: comment and blank lines between commands dropped, a
/// command's lines gathered until bash reads them as complete.
fn split_commands(lines: &[Line]) -> Result<Vec<Command>, String> {
    let mut commands = Vec::new();
    let mut pending: Vec<Line> = Vec::new();
    for line in lines {
        let trimmed = line.text.trim();
        if pending.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        pending.push(line.clone());
        let command = Command {
            lines: pending.clone(),
        };
        if complete(&command.text())? {
            commands.push(command);
            pending.clear();
        }
    }
    match pending.first() {
        None => Ok(commands),
        Some(first) => Err(format!(
            "bash cannot read the command starting on line {}: {}",
            first.number,
            syntax_error(
                &Command {
                    lines: pending.clone()
                }
                .text()
            )
        )),
    }
}

/// Whether bash reads `text` as whole commands (no open quote, here-document, compound
/// command or continued line).
fn complete(text: &str) -> Result<bool, String> {
    // bash -n ignores a backslash at the very end; a reader's shell waits for more.
    if text.ends_with('\\') {
        return Ok(false);
    }
    let output = Process::new("bash")
        .args(["-n", "-c", text])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running bash -n: {e}"))?;
    Ok(output.status.success()
        && !String::from_utf8_lossy(&output.stderr).contains("here-document"))
}

fn syntax_error(text: &str) -> String {
    Process::new("bash")
        .args(["-n", "-c", text])
        .stdin(Stdio::null())
        .output()
        .map(|output| String::from_utf8_lossy(&output.stderr).trim().to_string())
        .unwrap_or_default()
}

/// The commands of a ```console block, each with the output lines shown after it (blank
/// lines at the ends dropped). A line ending with `\` continues on the next one, which
/// may start with `> `.
fn console(lines: &[Line]) -> Result<Vec<(Command, Vec<Line>)>, String> {
    let mut commands: Vec<(Command, Vec<Line>)> = Vec::new();
    let mut continued = false;
    for line in lines {
        if continued {
            let text = line.text.strip_prefix("> ").unwrap_or(&line.text);
            continued = text.ends_with('\\');
            let (command, _) = commands.last_mut().expect("a continued command");
            command.lines.push(Line {
                number: line.number,
                text: text.to_string(),
            });
            continue;
        }
        if let Some(text) = line.text.strip_prefix("$ ") {
            continued = text.ends_with('\\');
            commands.push((
                Command {
                    lines: vec![Line {
                        number: line.number,
                        text: text.to_string(),
                    }],
                },
                Vec::new(),
            ));
            continue;
        }
        match commands.last_mut() {
            Some((_, shown)) => shown.push(line.clone()),
            None if line.text.trim().is_empty() => {}
            None => {
                return Err(format!(
                    "line {}: a ```console block starts with a `$ ` command",
                    line.number
                ));
            }
        }
    }
    for (command, shown) in &mut commands {
        while shown.last().is_some_and(|line| line.text.trim().is_empty()) {
            shown.pop();
        }
        if !complete(&command.text())? {
            return Err(format!(
                "bash cannot read the command on line {}: {}",
                command.line(),
                syntax_error(&command.text())
            ));
        }
    }
    Ok(commands)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(command: &Command) -> Vec<&str> {
        command
            .lines
            .iter()
            .map(|line| line.text.as_str())
            .collect()
    }

    #[test]
    fn a_sh_block_is_split_into_the_commands_bash_reads() {
        let doc = "# Title\n\n```sh\n# a comment\necho one   # and one\ncat > f <<EOF\nx\nEOF\nuntil true; do\n  sleep 1\ndone\nls \\\n  -l\n```\n";
        let walkthrough = read("doc.md", doc).expect("reads");
        let commands: Vec<Vec<&str>> = walkthrough.commands.iter().map(texts).collect();
        assert_eq!(
            commands,
            vec![
                vec!["echo one   # and one"],
                vec!["cat > f <<EOF", "x", "EOF"],
                vec!["until true; do", "  sleep 1", "done"],
                vec!["ls \\", "  -l"],
            ]
        );
        assert_eq!(walkthrough.commands[0].line(), 5);
    }

    #[test]
    fn a_text_block_after_a_sh_block_is_its_output_until_a_heading() {
        let doc = "```sh\necho a\necho b\n```\nIt prints:\n```\na\n```\n## Next\n```text\nnot an output\n```\n";
        let walkthrough = read("doc.md", doc).expect("reads");
        assert_eq!(walkthrough.outputs.len(), 1);
        assert_eq!(walkthrough.outputs[0].commands, 0..2);
        assert_eq!(walkthrough.outputs[0].lines[0].number, 7);
    }

    #[test]
    fn a_console_block_pairs_each_command_with_its_output() {
        let doc = "```console\n$ echo a \\\n> b\na b\n\n$ true\n$ printf 'x\\n'\nx\n```\n";
        let walkthrough = read("doc.md", doc).expect("reads");
        assert_eq!(walkthrough.commands.len(), 3);
        assert_eq!(texts(&walkthrough.commands[0]), vec!["echo a \\", "b"]);
        let outputs: Vec<(Range<usize>, Vec<&str>)> = walkthrough
            .outputs
            .iter()
            .map(|o| {
                (
                    o.commands.clone(),
                    o.lines.iter().map(|l| l.text.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(outputs, vec![(0..1, vec!["a b"]), (2..3, vec!["x"])]);
    }

    #[test]
    fn markers_skip_blocks_and_leave_outputs_unchecked_with_their_reasons() {
        let doc = "<!-- walkthrough: skip (needs a real cluster) -->\n```sh\nkubectl apply -k .\n```\n```sh\necho a\n```\n<!-- walkthrough: unchecked (a sample) -->\n```\nb\n```\n";
        let walkthrough = read("doc.md", doc).expect("reads");
        assert_eq!(walkthrough.commands.len(), 1);
        assert_eq!(
            walkthrough.skipped,
            vec![Exemption {
                line: 2,
                what: "sh block",
                reason: "needs a real cluster".into()
            }]
        );
        assert_eq!(walkthrough.unchecked[0].reason, "a sample");
        assert!(walkthrough.outputs.is_empty());
    }

    #[test]
    fn an_output_marker_attaches_a_block_across_headings() {
        let doc = "```sh\necho a\n```\n## Part\n<!-- walkthrough: output -->\n```\na\n```\n";
        let walkthrough = read("doc.md", doc).expect("reads");
        assert_eq!(walkthrough.outputs[0].commands, 0..1);
    }

    #[test]
    fn what_the_runner_cannot_honour_is_an_error_naming_the_line() {
        for (doc, error) in [
            ("```bash\nls\n```\n", "doc.md:1: a ```bash block"),
            (
                "```\n$ ls\n```\n",
                "doc.md:1: commands (`$ ...`) in an untagged block",
            ),
            (
                "<!-- walkthrough: skip -->\n```sh\nls\n```\n",
                "doc.md:1: `skip` needs its reason",
            ),
            (
                "<!-- walkthrough: skip (x) -->\ntext\n```sh\nls\n```\n",
                "doc.md:1: a walkthrough marker must be right before",
            ),
            (
                "<!-- walkthrough: skip (x) -->\n```yaml\na: 1\n```\n",
                "doc.md:2: `walkthrough: skip` does not apply",
            ),
            (
                "<!-- walkthrough: unchecked (x) -->\n```\na\n```\n",
                "doc.md:2: `walkthrough: unchecked` on a block that follows no command",
            ),
            (
                "```sh\necho 'open\n```\n",
                "doc.md:1: bash cannot read the command starting on line 2",
            ),
            (
                "<!-- walkthrough: run -->\n```sh\nls\n```\n",
                "doc.md:1: `run` is not understood",
            ),
        ] {
            let got = read("doc.md", doc).expect_err(doc);
            assert!(got.starts_with(error), "{doc:?}: {got}");
        }
    }

    #[test]
    fn a_background_command_is_known_by_its_ampersand() {
        let command = |text: &str| Command {
            lines: vec![Line {
                number: 1,
                text: text.into(),
            }],
        };
        assert!(command("capstan sync --repo . &").is_background());
        assert!(command("capstan sync --repo . &   # in a terminal of its own").is_background());
        assert!(!command("true && false").is_background());
        assert!(!command("echo a").is_background());
    }
}
