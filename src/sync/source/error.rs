//! What can go wrong while reading desired state from Git; each message says where and what to do.

use std::path::PathBuf;

/// A failure to reach, read or watch the repository.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// `--repo` is neither an existing path nor something that looks like a URL.
    #[error(
        "repository '{repo}' not found: give a Git URL (https://, ssh://, git@host:path, file://), a local repository, or a folder inside one"
    )]
    RepoNotFound { repo: String },
    /// The folder is not inside any Git repository.
    #[error(
        "{} is not inside a Git repository (no .git in it or any parent); run `git init` there or give the repository's path or URL",
        folder.display()
    )]
    NotARepository { folder: PathBuf },
    /// libgit2 refuses a repository owned by another user.
    #[error(
        "the repository holding {} is owned by another user; if you trust it, add its root with `git config --global --add safe.directory <root>`",
        folder.display()
    )]
    NotOwned { folder: PathBuf },
    /// The folder given is inside the `.git` directory rather than the work tree.
    #[error(
        "{} is inside the repository's git directory; give the work tree or a folder in it",
        folder.display()
    )]
    InsideGitDir { folder: PathBuf },
    /// The path to sync cannot name a folder of the repository.
    #[error("path '{path}' {reason}; give a folder relative to the repository root")]
    InvalidPath { path: String, reason: &'static str },
    /// The branch name is not a valid Git ref name.
    #[error("'{branch}' is not a valid branch name")]
    InvalidBranch { branch: String },
    /// The tracked branch does not exist (locally, or on the remote).
    #[error(
        "branch '{branch}' not found in {repo} (branches there: {available}); pass --branch with one of them"
    )]
    BranchNotFound {
        repo: String,
        branch: String,
        available: String,
    },
    /// The state directory holding the clone cannot be created or is not a Git repository.
    #[error("state directory {}: {message}", dir.display())]
    StateDir { dir: PathBuf, message: String },
    /// An SSH key or known_hosts file cannot be read.
    #[error("cannot read {}: {message}", file.display())]
    CredentialFile { file: PathBuf, message: String },
    /// The remote refused the credentials, or asked for some that were not given.
    #[error(
        "cannot authenticate to {repo}: {message}; check the token (https) or the SSH key (ssh)"
    )]
    Authentication { repo: String, message: String },
    /// The server's TLS certificate or SSH host key was not accepted.
    #[error("cannot verify the server of {repo}: {message}")]
    Certificate { repo: String, message: String },
    /// Any other failure talking to the remote.
    #[error(
        "fetching branch '{branch}' from {repo} failed: {message}; check the URL and the network"
    )]
    Fetch {
        repo: String,
        branch: String,
        message: String,
    },
    /// A revision names nothing in the repository.
    #[error("revision '{rev}' not found in {repo}; give a commit SHA, a branch or a tag")]
    RevisionNotFound { repo: String, rev: String },
    /// The work tree was asked for (`--head WORKTREE`) of a repository that has none: a
    /// URL (cloned bare) or a bare repository.
    #[error(
        "{repo} has no work tree to plan (a URL or a bare repository); plan a local checkout, or commit the change and give its revision"
    )]
    NoWorkTree { repo: String },
    /// A revision names an object that is not (and does not lead to) a commit.
    #[error("revision '{rev}' in {repo} is not a commit")]
    NotACommit { repo: String, rev: String },
    /// Two revisions share no history.
    #[error("revisions '{a}' and '{b}' in {repo} have no common ancestor; give --base explicitly")]
    NoMergeBase { repo: String, a: String, b: String },
    /// The synced path does not exist at a commit.
    #[error("path '{path}' does not exist at commit {commit} of {repo}; commit it, or fix --path")]
    PathNotFound {
        repo: String,
        path: String,
        commit: String,
    },
    /// The synced path is a file at a commit.
    #[error("path '{path}' is a file at commit {commit} of {repo}; --path must name a folder")]
    NotAFolder {
        repo: String,
        path: String,
        commit: String,
    },
    /// A symlink leads out of the repository, where capstan does not follow it.
    #[error(
        "symlink '{link}' points to '{target}', outside the repository; only links inside it are followed"
    )]
    SymlinkEscapes { link: String, target: String },
    /// A symlink points to nothing in the commit.
    #[error("symlink '{link}' points to '{target}', which does not exist in the commit")]
    SymlinkDangling { link: String, target: String },
    /// Following a symlink comes back to where it started.
    #[error("symlink '{link}' leads into a loop of links")]
    SymlinkLoop { link: String },
    /// A file is over the size limit.
    #[error("file '{path}' is {size} bytes, over the limit of {limit} bytes")]
    FileTooLarge { path: String, size: u64, limit: u64 },
    /// The commit's synced folder holds more paths than one commit may.
    #[error("{path}: {}", too_many_paths(*.limit))]
    TooManyPaths { path: String, limit: usize },
    /// The commit holds more manifest files than one commit may.
    #[error("{path}: {}", too_many_files(*.limit))]
    TooManyFiles { path: String, limit: usize },
    /// The commit's manifest files hold more bytes than one commit may.
    #[error("{path}: {}", too_many_bytes(*.limit))]
    CommitTooLarge { path: String, limit: u64 },
    /// Any other failure reading the repository (a corrupt object, an unreadable file).
    #[error("reading {repo}: {message}")]
    Git { repo: String, message: String },
    /// The git directory cannot be watched for ref changes.
    #[error("cannot watch {} for new commits: {source}", dir.display())]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
}

impl SourceError {
    /// For a problem of the commit's content rather than of reaching the repository (a
    /// symlink, a file or the whole commit over its budget), the path at fault and what is
    /// wrong there: such a commit is rejected like one with an invalid manifest.
    pub fn in_commit(&self) -> Option<(&str, String)> {
        let problem = match self {
            SourceError::SymlinkEscapes { link, target } => (
                link,
                format!(
                    "symlink to '{target}' leads out of the repository; only links inside it \
                     are followed"
                ),
            ),
            SourceError::SymlinkDangling { link, target } => (
                link,
                format!("symlink to '{target}', which does not exist in the commit"),
            ),
            SourceError::SymlinkLoop { link } => {
                (link, "symlink leads into a loop of links".to_string())
            }
            SourceError::FileTooLarge { path, size, limit } => (
                path,
                format!("the file has {size} bytes, over the limit of {limit} bytes"),
            ),
            SourceError::TooManyPaths { path, limit } => (path, too_many_paths(*limit)),
            SourceError::TooManyFiles { path, limit } => (path, too_many_files(*limit)),
            SourceError::CommitTooLarge { path, limit } => (path, too_many_bytes(*limit)),
            _ => return None,
        };
        Some((problem.0.as_str(), problem.1))
    }
}

fn too_many_paths(limit: usize) -> String {
    format!(
        "the synced folder has more than {limit} paths (files, folders and links, each path a \
         symlink reaches counted), the limit for one commit; sync a smaller folder or move \
         files out"
    )
}

fn too_many_files(limit: usize) -> String {
    format!(
        "the synced folder has more than {limit} manifest files, the limit for one commit; \
         join small manifests into fewer files"
    )
}

fn too_many_bytes(limit: u64) -> String {
    format!(
        "the manifest files reach more than {limit} bytes with this file (a file reached by \
         several paths counts at each), the limit for one commit"
    )
}
