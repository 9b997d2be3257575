//! Which pull request merged a commit, as `requirePullRequest` and the history's records
//! rest on it, proven the way the cluster's admin chose in `GitSync.spec.pullRequests`:
//!
//! | proof     | a commit merged pull request N when                                            | proves |
//! |-----------|--------------------------------------------------------------------------------|--------|
//! | `subject` | its subject is GitHub's merge (`Merge pull request #N from ...`) or squash (`... (#N)`) form | nothing: anyone who can push can write it |
//! | `github`  | GitHub's API lists pull request N as merged into the followed branch with this commit as its merge commit | that GitHub merged N as this commit |
//!
//! A commit GitHub's API cannot be asked about (down, rate-limited, token refused) is not
//! taken as unmerged: the sync fails and asks again, so that a node is never held, nor
//! moved, on a guess.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use capstan_api::capstan::{Proof, PullRequests};
use serde::Deserialize;

use super::source::{CommitInfo, redact_url};

/// GitHub's API on github.com.
pub const GITHUB_API: &str = "https://api.github.com";

/// How long one question to GitHub may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a commit's pull request could not be proven or disproven.
#[derive(Debug, thiserror::Error)]
pub enum ProofError {
    /// The repository on GitHub is not known.
    #[error(
        "spec.pullRequests.proof is github, but {repo} is not a github.com repository: set spec.pullRequests.repository (owner/name) and, for GitHub Enterprise, spec.pullRequests.apiURL"
    )]
    NoRepository { repo: String },
    /// GitHub's API did not answer, or refused.
    #[error("asking GitHub which pull request merged {commit} ({url}): {message}")]
    Api {
        commit: String,
        url: String,
        message: String,
    },
}

/// Proves commits' pull requests; answers are kept, a merged commit's never changes.
pub struct Prover {
    mode: Mode,
    proven: Mutex<HashMap<String, Option<u64>>>,
}

enum Mode {
    Subject,
    GitHub(GitHub),
}

struct GitHub {
    /// `<api>/repos/<owner>/<name>`.
    base: String,
    branch: String,
    token: Option<String>,
    client: reqwest::Client,
}

/// The part of GitHub's pull request object the proof reads.
#[derive(Deserialize)]
struct PullRequest {
    number: u64,
    merged_at: Option<String>,
    merge_commit_sha: Option<String>,
    base: Base,
}

#[derive(Deserialize)]
struct Base {
    #[serde(rename = "ref")]
    name: String,
}

impl Prover {
    /// The prover `spec` asks for, for the repository at `repo` (as given to `--repo`) and
    /// its `branch`; `token` is the repository's https token, which GitHub's API takes too.
    pub fn new(
        spec: &PullRequests,
        repo: &str,
        branch: &str,
        token: Option<String>,
    ) -> Result<Prover, ProofError> {
        let mode = match spec.proof {
            Proof::Subject => Mode::Subject,
            Proof::Github => {
                let repository = match &spec.repository {
                    Some(repository) => repository.clone(),
                    None => github_repository(repo).ok_or_else(|| ProofError::NoRepository {
                        repo: redact_url(repo),
                    })?,
                };
                let api = spec.api_url.as_deref().unwrap_or(GITHUB_API);
                let client = reqwest::Client::builder()
                    .timeout(TIMEOUT)
                    .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
                    .build()
                    .map_err(|e| ProofError::Api {
                        commit: String::new(),
                        url: api.to_string(),
                        message: e.to_string(),
                    })?;
                Mode::GitHub(GitHub {
                    base: format!("{}/repos/{repository}", api.trim_end_matches('/')),
                    branch: branch.to_string(),
                    token,
                    client,
                })
            }
        };
        Ok(Prover {
            mode,
            proven: Mutex::new(HashMap::new()),
        })
    }

    /// The pull request `commit` is proven to have merged, if any.
    pub async fn prove(&self, commit: &CommitInfo) -> Result<Option<u64>, ProofError> {
        let github = match &self.mode {
            Mode::Subject => return Ok(commit.pull_request),
            Mode::GitHub(github) => github,
        };
        if let Some(known) = self.lock().get(&commit.sha) {
            return Ok(*known);
        }
        let url = format!("{}/commits/{}/pulls", github.base, commit.sha);
        let failed = |message: String| ProofError::Api {
            commit: commit.short_sha().to_string(),
            url: redact_url(&url),
            message,
        };
        let mut request = github
            .client
            .get(&url)
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28");
        if let Some(token) = &github.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| failed(e.to_string()))?;
        if !status.is_success() {
            let excerpt: String = String::from_utf8_lossy(&body).chars().take(200).collect();
            return Err(failed(format!("{status}: {excerpt}")));
        }
        let pulls: Vec<PullRequest> =
            serde_json::from_slice(&body).map_err(|e| failed(format!("unexpected answer: {e}")))?;
        let merged = merged_by(&pulls, &commit.sha, &github.branch);
        self.lock().insert(commit.sha.clone(), merged);
        Ok(merged)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<u64>>> {
        self.proven.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The pull request among `pulls` that GitHub merged into `branch` as commit `sha`.
fn merged_by(pulls: &[PullRequest], sha: &str, branch: &str) -> Option<u64> {
    pulls
        .iter()
        .find(|pr| {
            pr.merged_at.is_some()
                && pr.merge_commit_sha.as_deref() == Some(sha)
                && pr.base.name == branch
        })
        .map(|pr| pr.number)
}

/// `owner/name` of a github.com repository URL (https, ssh or scp form), `.git` dropped.
pub fn github_repository(repo: &str) -> Option<String> {
    let path = repo
        .strip_prefix("git@github.com:")
        .or_else(|| {
            let rest = repo.split_once("://")?.1;
            let (authority, path) = rest.split_once('/')?;
            let host = authority.rsplit('@').next()?;
            (host == "github.com").then_some(path)
        })?
        .trim_end_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path);
    let (owner, name) = path.split_once('/')?;
    let valid = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    (valid(owner) && valid(name)).then(|| format!("{owner}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_github_repository_is_read_from_its_url() {
        let cases = [
            ("https://github.com/acme/fleet.git", Some("acme/fleet")),
            ("https://github.com/acme/fleet", Some("acme/fleet")),
            (
                "https://x-access-token:t@github.com/acme/fleet.git",
                Some("acme/fleet"),
            ),
            ("ssh://git@github.com/acme/fleet.git", Some("acme/fleet")),
            ("git@github.com:acme/fleet.git", Some("acme/fleet")),
            ("https://github.com/acme/fleet/", Some("acme/fleet")),
            ("https://gitlab.com/acme/fleet.git", None),
            ("https://github.com.evil.example/acme/fleet.git", None),
            ("https://github.com/acme/fleet/extra", None),
            ("https://github.com/acme", None),
            ("/srv/git/fleet", None),
        ];
        for (url, expected) in cases {
            assert_eq!(github_repository(url).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn a_commit_merged_a_pull_request_only_as_its_merge_commit_into_the_branch() {
        let pr = |number, merged: bool, sha: &str, base: &str| PullRequest {
            number,
            merged_at: merged.then(|| "2026-12-01T10:00:00Z".to_string()),
            merge_commit_sha: Some(sha.to_string()),
            base: Base {
                name: base.to_string(),
            },
        };
        let cases = [
            (vec![pr(9, true, "abc", "main")], Some(9)),
            // Open, or closed without merging: GitHub keeps a test merge commit.
            (vec![pr(9, false, "abc", "main")], None),
            // The commit is only in the pull request (a commit of its branch).
            (vec![pr(9, true, "def", "main")], None),
            // Merged into another branch.
            (vec![pr(9, true, "abc", "release")], None),
            (
                vec![pr(8, true, "def", "main"), pr(9, true, "abc", "main")],
                Some(9),
            ),
            (vec![], None),
        ];
        for (pulls, expected) in cases {
            assert_eq!(merged_by(&pulls, "abc", "main"), expected);
        }
    }
}
