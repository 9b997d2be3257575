//! Whether a printed output shows what a document says it shows.
//!
//! Both sides are normalised line by line, so that what changes from run to run does not
//! count: colours are dropped, the session's home and `/home/<user>` read `~`, then
//! timestamps and times of day, loopback ports, UUIDs (uids, boot IDs), Git SHAs (7 to
//! 64 hex digits), and durations and ages (`117 ms`, `0.2s`, `2m3s`) each read as one placeholder, and runs of
//! spaces as one space (columns realign with the widths of their values). The lines
//! shown must then be found in the output as consecutive lines, anywhere in it; a line
//! `...` stands for any number of lines, and `...` within a line for any text.

use std::sync::LazyLock;

use regex::Regex;

/// A shown line, normalised: a line of the output it must equal, or any lines.
#[derive(Debug)]
enum Pattern {
    Line(Regex),
    AnyLines,
}

/// Where the shown lines were not found: the index of the first shown line that no
/// output line matched after the lines before it, and the index of the printed line
/// where the lines before it, found, end (the first such place).
#[derive(Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub first_unmatched: usize,
    pub printed_from: usize,
}

static ANSI: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap());
static HOME_DIR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"/home/[^/\s]+").unwrap());
static TIMESTAMP: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?)?\b|\b\d{2}:\d{2}:\d{2}(?:\.\d+)?\b",
    )
    .unwrap()
});
static DURATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:\d+[dhms])+\b|\b\d+(?:\.\d+)?(?: ?(?:ns|µs|us|ms)|s|m|h|d)\b").unwrap()
});
static UUID: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b").unwrap()
});
static SHA: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b[0-9a-f]{7,64}\b").unwrap());
static PORT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(127\.0\.0\.1|localhost|\[::1\]|0\.0\.0\.0):\d+").unwrap());
static SPACES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\s+").unwrap());

/// `line` as it is compared; `home` is the session's home directory.
pub fn normalise(line: &str, home: &str) -> String {
    let line = ANSI.replace_all(line, "");
    let line = if home.is_empty() {
        line.into_owned()
    } else {
        line.replace(home, "~")
    };
    let line = HOME_DIR.replace_all(&line, "~");
    let line = TIMESTAMP.replace_all(&line, "<time>");
    let line = PORT.replace_all(&line, "$1:<port>");
    let line = UUID.replace_all(&line, "<uuid>");
    // SHAs before durations: `123456d` is a SHA, not 123456 days.
    let line = SHA.replace_all(&line, "<sha>");
    let line = DURATION.replace_all(&line, "<duration>");
    SPACES.replace_all(line.trim(), " ").into_owned()
}

fn patterns(shown: &[&str], home: &str) -> Vec<Pattern> {
    shown
        .iter()
        .map(|line| {
            if line.trim() == "..." {
                return Pattern::AnyLines;
            }
            let parts: Vec<String> = normalise(line, home)
                .split("...")
                .map(regex::escape)
                .collect();
            Pattern::Line(Regex::new(&format!("^{}$", parts.join(".*"))).expect("an escaped line"))
        })
        .collect()
}

/// Whether `shown` is found in `printed` (both as lines), per the rules above.
pub fn find(shown: &[&str], printed: &str, home: &str) -> Result<(), Mismatch> {
    let patterns = patterns(shown, home);
    let printed: Vec<String> = printed.lines().map(|line| normalise(line, home)).collect();
    if found(&patterns, &printed) {
        return Ok(());
    }
    // The longest head of the shown lines that is found says where they part.
    let first_unmatched = (1..=patterns.len())
        .find(|&n| !found(&patterns[..n], &printed))
        .map_or(0, |n| n - 1);
    let printed_from = if first_unmatched == 0 {
        0
    } else {
        ends(&patterns[..first_unmatched], &printed)
            .iter()
            .position(|&end| end)
            .unwrap_or(0)
    };
    Err(Mismatch {
        first_unmatched,
        printed_from,
    })
}

/// Whether the patterns match consecutive printed lines, anywhere.
fn found(patterns: &[Pattern], printed: &[String]) -> bool {
    ends(patterns, printed).iter().any(|&end| end)
}

/// Where the patterns can end when they match consecutive printed lines, anywhere: a
/// dynamic programme over (pattern, line), `at[j]` being whether the patterns so far can
/// end before line j.
fn ends(patterns: &[Pattern], printed: &[String]) -> Vec<bool> {
    // Anywhere: the shown lines may start at any printed line.
    let mut at = vec![true; printed.len() + 1];
    for pattern in patterns {
        let mut next = vec![false; printed.len() + 1];
        match pattern {
            Pattern::AnyLines => {
                let mut reachable = false;
                for j in 0..=printed.len() {
                    reachable |= at[j];
                    next[j] = reachable;
                }
            }
            Pattern::Line(regex) => {
                for j in 0..printed.len() {
                    if at[j] && regex.is_match(&printed[j]) {
                        next[j + 1] = true;
                    }
                }
            }
        }
        at = next;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_changes_from_run_to_run_does_not_count() {
        let home = "/tmp/.tmpAbC/home";
        assert_eq!(
            normalise(
                "10:14:13 applied 3cf3bea \"Fleet\": 5 created in 117 ms",
                home
            ),
            normalise(
                "03:41:31 applied 9f3682f \"Fleet\": 5 created in 525 ms",
                home
            ),
        );
        assert_eq!(
            normalise(
                "   kubeconfig: /home/me/.local/state/capstan/kubeconfig",
                home
            ),
            normalise(
                "   kubeconfig: /tmp/.tmpAbC/home/.local/state/capstan/kubeconfig",
                home
            ),
        );
        assert_eq!(
            normalise(
                "my-kmod   v1        3          3         3           2s",
                home
            ),
            normalise("my-kmod   v1   3   3   3   12m30s", home),
        );
        assert_eq!(
            normalise(
                "2026-11-21 10:14:13   Sync  on http://127.0.0.1:9477/metrics (0.2s)",
                home
            ),
            normalise(
                "2026-12-02 03:44:22   Sync  on http://127.0.0.1:40123/metrics (41.2s)",
                home
            ),
        );
        assert_eq!(
            normalise(
                "\"bootID\": \"22c87790-3007-40d3-b3a9-59068c9301c5\",",
                home
            ),
            normalise(
                "\"bootID\": \"aebae015-bbfe-4583-97b4-c7e770ac45fc\",",
                home
            ),
        );
        assert_eq!(normalise("\x1b[32m INFO\x1b[0m done", home), "INFO done");
        // What is the point of an output stays: names, versions, counts.
        assert_ne!(
            normalise("worker-1 v1 -> v2: 4 of 4 steps", home),
            normalise("worker-2 v1 -> v2: 4 of 4 steps", home)
        );
        assert_ne!(
            normalise("5 created, 3 configured", home),
            normalise("5 created, 2 configured", home)
        );
    }

    #[test]
    fn shown_lines_are_found_anywhere_in_order_with_ellipses() {
        let printed = "noise\nTIME TYPE\n10:00:00 Sync a\n10:00:01 Step b\n10:00:02 Sync c\ntail\n";
        assert_eq!(find(&["TIME TYPE", "10:14:13 Sync a"], printed, ""), Ok(()));
        assert_eq!(
            find(&["TIME TYPE", "...", "10:14:15 Sync c"], printed, ""),
            Ok(())
        );
        assert_eq!(
            find(&["10:00:00 Sync ...", "... Step b"], printed, ""),
            Ok(())
        );
        // Consecutive unless `...` says otherwise.
        assert_eq!(
            find(&["TIME TYPE", "10:14:15 Sync c"], printed, ""),
            Err(Mismatch {
                first_unmatched: 1,
                printed_from: 2
            })
        );
        // In order.
        assert_eq!(
            find(&["10:00:02 Sync c", "...", "10:00:00 Sync a"], printed, ""),
            Err(Mismatch {
                first_unmatched: 2,
                printed_from: 5
            })
        );
        assert_eq!(
            find(&["absent"], printed, ""),
            Err(Mismatch {
                first_unmatched: 0,
                printed_from: 0
            })
        );
    }
}
