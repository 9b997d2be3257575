//! The commit a sync applies, and the pull request it came from.

use capstan_api::CommitRef;
use serde::{Deserialize, Serialize};

/// One commit as capstan reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitInfo {
    /// Full hexadecimal object id.
    pub sha: String,
    /// The branch the commit was reached through (the tracked branch unless a revision named another).
    pub branch: String,
    /// Author name.
    pub author: String,
    /// Author email.
    pub email: String,
    /// When the commit landed on its branch (committer time: the merge or squash time for a pull request).
    pub time: jiff::Timestamp,
    /// First line of the commit message.
    pub subject: String,
    /// The pull request this commit merged or squashed, read from the subject.
    pub pull_request: Option<u64>,
}

impl CommitInfo {
    /// The commit as records and statuses name it.
    pub fn reference(&self) -> CommitRef {
        CommitRef {
            sha: self.sha.clone(),
            short_sha: self.short_sha().to_string(),
            revision: self.revision(),
            author: self.author.clone(),
            time: self.time.to_string(),
            subject: self.subject.clone(),
            pull_request: self.pull_request,
        }
    }

    /// The revision in the form Flux writes it: `main@sha1:<sha>`.
    pub fn revision(&self) -> String {
        format!("{}@sha1:{}", self.branch, self.sha)
    }

    /// The first seven characters of the SHA, as `git log --oneline` shows them.
    pub fn short_sha(&self) -> &str {
        self.sha.get(..7).unwrap_or(&self.sha)
    }
}

/// The pull request number a commit subject records, if any.
///
/// Recognises GitHub's merge commit (`Merge pull request #42 from owner/branch`) and its squash
/// commit (`Subject (#42)`). Only the first line counts, so pull requests mentioned in the body
/// (a squash lists every squashed commit) are not mistaken for this one. When a subject has both
/// forms, the merge form wins: it is what the commit itself is.
pub fn pull_request_of(message: &str) -> Option<u64> {
    let subject = message.trim_start().lines().next()?.trim_end();
    merged_pull_request(subject).or_else(|| squashed_pull_request(subject))
}

/// `Merge pull request #42 from owner/branch` -> 42.
fn merged_pull_request(subject: &str) -> Option<u64> {
    let rest = subject.strip_prefix("Merge pull request #")?;
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (digits, after) = rest.split_at(digits_end);
    // "#42abc" is not a pull request reference; GitHub always writes " from ..." after the number.
    if !(after.is_empty() || after.starts_with(' ')) {
        return None;
    }
    number(digits)
}

/// `Subject (#42)` -> 42.
fn squashed_pull_request(subject: &str) -> Option<u64> {
    let (title, reference) = subject.strip_suffix(')')?.rsplit_once("(#")?;
    if !title.ends_with(' ') || title.trim().is_empty() {
        return None;
    }
    number(reference)
}

fn number(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_request_numbers_are_read_from_merge_and_squash_subjects() {
        let cases: &[(&str, Option<u64>)] = &[
            // GitHub merge commits
            ("Merge pull request #42 from acme/bump-driver", Some(42)),
            (
                "Merge pull request #42 from acme/x\n\nBump driver to 2.1",
                Some(42),
            ),
            ("Merge pull request #7", Some(7)),
            ("Merge pull request #42abc from acme/x", None),
            ("Merge pull request # from acme/x", None),
            ("Merge pull request #-1 from acme/x", None),
            ("Merge branch 'main' into feature", None),
            ("merge pull request #42 from acme/x", None),
            // GitHub squash commits
            ("Bump driver to 2.1 (#42)", Some(42)),
            (
                "Bump driver to 2.1 (#42)\n\n* first (#40)\n* second",
                Some(42),
            ),
            ("Revert \"Bump driver (#41)\" (#43)", Some(43)),
            ("Bump driver (#abc)", None),
            ("Bump driver (#)", None),
            ("Bump driver (#42) and more", None),
            ("Bump driver(#42)", None),
            ("(#42)", None),
            ("Bump driver (#99999999999999999999999)", None),
            // both forms: the merge form wins
            ("Merge pull request #42 from acme/fix (#43)", Some(42)),
            // whitespace around the subject
            ("Bump driver (#42)   \n", Some(42)),
            ("Merge pull request #42 from acme/x  \t", Some(42)),
            ("\n  Bump driver (#42)", Some(42)),
            // none
            ("Bump driver to 2.1", None),
            ("Bump driver\n\nSee #42", None),
            ("", None),
            ("   \n", None),
        ];
        for (message, expected) in cases {
            assert_eq!(pull_request_of(message), *expected, "message {message:?}");
        }
    }

    #[test]
    fn revision_is_written_as_flux_writes_it() {
        let commit = CommitInfo {
            sha: "0123456789abcdef0123456789abcdef01234567".into(),
            branch: "main".into(),
            author: "Ada".into(),
            email: "ada@example.com".into(),
            time: jiff::Timestamp::UNIX_EPOCH,
            subject: "Bump driver (#42)".into(),
            pull_request: Some(42),
        };
        assert_eq!(
            commit.revision(),
            "main@sha1:0123456789abcdef0123456789abcdef01234567"
        );
        assert_eq!(commit.short_sha(), "0123456");
    }
}
