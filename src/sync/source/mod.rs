//! Where desired state comes from: a Git branch, local or remote.
//!
//! A [`Source`] follows one branch of one repository. A local repository is read in place and
//! watched for new commits ([`watch_refs`]); a remote one is cloned bare into the state directory
//! and fetched on an interval or when a signed webhook arrives ([`verify_github_signature`]).
//! Either way only committed content counts: [`Source::files_at`] reads a commit's tree, never a
//! work tree, and every sync knows its commit as a [`CommitInfo`], pull request included. Only
//! `capstan plan --head WORKTREE` reads a work tree, as an in-memory commit of it
//! ([`Source::work_tree_commit`]).

mod auth;
mod commit;
mod error;
mod git;
mod redact;
mod watch;
mod webhook;

pub use auth::Auth;
pub use commit::{CommitInfo, pull_request_of};
pub use error::SourceError;
pub use git::{ReadBudget, RepoFile, Source, WORK_TREE, WORK_TREE_SUBJECT};
pub use redact::{redact_message, redact_url, redact_urls_in};
pub use watch::{RefWatcher, watch_refs};
pub use webhook::{WebhookError, verify_github_signature};
