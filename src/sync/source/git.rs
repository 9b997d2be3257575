//! The Git repository desired state is read from: opening, fetching, resolving, reading files.

use std::collections::HashMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use git2::{BranchType, Direction, ErrorCode, FetchOptions, ObjectType, Oid, Repository};

use super::auth::{Auth, Credentials};
use super::commit::{CommitInfo, pull_request_of};
use super::error::SourceError;
use super::redact::{redact_message, redact_url, redact_urls_in};

mod work_tree;

pub use work_tree::{WORK_TREE, WORK_TREE_SUBJECT};

/// Links followed while resolving one path before it counts as a loop (Linux's limit).
const MAX_LINK_HOPS: u32 = 40;

/// What a tree entry holds, from the type bits of its mode.
enum EntryKind {
    Folder,
    File,
    Link,
    Submodule,
}

impl EntryKind {
    fn of(entry: &git2::TreeEntry<'_>) -> EntryKind {
        // Old repositories also hold modes like 100664, so only the type bits are compared.
        match entry.filemode() & 0o170000 {
            0o040000 => EntryKind::Folder,
            0o120000 => EntryKind::Link,
            0o160000 => EntryKind::Submodule,
            _ => EntryKind::File,
        }
    }
}

/// A committed manifest file under the tracked path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    /// Path relative to the repository root, `/`-separated; for a file reached through a
    /// symlink, the link's path.
    pub path: String,
    /// The committed contents, shared by every path that reaches the same blob.
    pub contents: Arc<[u8]>,
}

/// How much of one commit capstan reads: counted while its tree is walked, before any file
/// is read, so that a commit over budget costs no more than the budget to refuse. `plan`
/// and `sync` read with the same one ([`ReadBudget::COMMIT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadBudget {
    /// Paths walked under the synced folder: files, folders and links of any name, each
    /// path a symlink reaches counted again.
    pub max_paths: usize,
    /// Manifest files (`*.yaml`, `*.yml`; not hidden) read.
    pub max_files: usize,
    /// Bytes of one manifest file.
    pub max_file_bytes: u64,
    /// Bytes of all manifest files, a blob counted at every path that reaches it (each path
    /// is parsed on its own).
    pub max_bytes: u64,
}

impl ReadBudget {
    /// The budget of every commit `plan` and `sync` read.
    pub const COMMIT: ReadBudget = ReadBudget {
        max_paths: 100_000,
        max_files: 20_000,
        max_file_bytes: crate::sync::manifests::MAX_FILE_BYTES as u64,
        max_bytes: crate::sync::manifests::MAX_COMMIT_BYTES as u64,
    };
}

/// Whether a file named `name` is read as manifests (hidden names are skipped before).
fn is_manifest_name(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}

/// A Git branch to follow: a local repository, or a bare clone of a remote in the state directory.
pub struct Source {
    repo: Repository,
    /// The repository as messages name it: its path, or its URL without credentials ([`redact_url`]).
    location: String,
    /// Present when the repository is a clone of a remote.
    origin: Option<Credentials>,
    branch: String,
    /// The ref the tracked branch is read from (see [`Source::head`]).
    tracking_ref: String,
    path: String,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("repo", &self.location)
            .field("branch", &self.branch)
            .field("path", &self.path)
            .field("remote", &self.origin.is_some())
            .finish()
    }
}

impl Source {
    /// Opens the repository to follow.
    ///
    /// `repo` is an https, ssh (`ssh://` or `git@host:path`) or `file://` URL, cloned bare into
    /// `<state_dir>/repo` (reused on restart) and fetched once; or a local repository; or a folder
    /// inside one, which becomes the synced path (joined with `path` when both are given).
    ///
    /// In a local repository without the branch itself, its remote-tracking branch
    /// `origin/<branch>` stands in for it (a CI checkout has only that).
    ///
    /// Fails when the repository cannot be found or reached, the branch does not exist, the path
    /// is not a relative folder present on the branch, or credential files cannot be read.
    pub fn open(
        repo: &str,
        branch: &str,
        path: Option<&Path>,
        state_dir: &Path,
        auth: Auth,
    ) -> Result<Source, SourceError> {
        let source = Source::open_allowing_new_path(repo, branch, path, state_dir, auth)?;
        source.check_path_on_branch()?;
        Ok(source)
    }

    /// Opens the repository as [`Source::open`] does, except that the path need not exist on
    /// the tracked branch yet: a plan reviews commits that may add it. Reading a commit
    /// without the path still fails ([`Source::files_at`]).
    pub fn open_allowing_new_path(
        repo: &str,
        branch: &str,
        path: Option<&Path>,
        state_dir: &Path,
        auth: Auth,
    ) -> Result<Source, SourceError> {
        if !git2::Reference::is_valid_name(&format!("refs/heads/{branch}")) {
            return Err(SourceError::InvalidBranch {
                branch: branch.to_string(),
            });
        }
        if repo.contains("://") {
            Source::open_remote(repo, branch, path, state_dir, auth)
        } else if Path::new(repo).exists() {
            Source::open_local(Path::new(repo), branch, path)
        } else if looks_like_scp_url(repo) {
            Source::open_remote(repo, branch, path, state_dir, auth)
        } else {
            Err(SourceError::RepoNotFound {
                repo: redact_url(repo),
            })
        }
    }

    fn open_local(folder: &Path, branch: &str, path: Option<&Path>) -> Result<Source, SourceError> {
        let folder = folder
            .canonicalize()
            .map_err(|_| SourceError::RepoNotFound {
                repo: folder.display().to_string(),
            })?;
        let repo = Repository::discover(&folder).map_err(|e| match e.code() {
            ErrorCode::Owner => SourceError::NotOwned {
                folder: folder.clone(),
            },
            _ => SourceError::NotARepository {
                folder: folder.clone(),
            },
        })?;
        let git_dir = canonical(repo.path());
        let root = repo.workdir().map_or_else(|| git_dir.clone(), canonical);
        let inside = if repo.is_bare() {
            if folder != git_dir {
                return Err(SourceError::InsideGitDir { folder });
            }
            PathBuf::new()
        } else {
            if folder.starts_with(&git_dir) {
                return Err(SourceError::InsideGitDir { folder });
            }
            folder
                .strip_prefix(&root)
                .map(Path::to_path_buf)
                .unwrap_or_default()
        };
        let path = tracked_path(&inside.join(path.unwrap_or(Path::new(""))))?;
        let location = root.display().to_string();
        let mut source = Source {
            repo,
            location,
            origin: None,
            branch: branch.to_string(),
            tracking_ref: format!("refs/heads/{branch}"),
            path,
        };
        if source.repo.find_branch(branch, BranchType::Local).is_err() {
            let remote_tracking = format!("refs/remotes/origin/{branch}");
            if source.repo.find_reference(&remote_tracking).is_err() {
                return Err(source.branch_not_found(source.local_branches()));
            }
            source.tracking_ref = remote_tracking;
        }
        Ok(source)
    }

    fn open_remote(
        url: &str,
        branch: &str,
        path: Option<&Path>,
        state_dir: &Path,
        auth: Auth,
    ) -> Result<Source, SourceError> {
        let credentials = Credentials::new(auth, url)?;
        let dir = state_dir.join("repo");
        let state_error = |message: String| SourceError::StateDir {
            dir: dir.clone(),
            message,
        };
        let repo = if dir.exists() {
            Repository::open_bare(&dir).map_err(|e| {
                state_error(format!(
                    "not a usable clone ({}); remove it to clone again",
                    e.message()
                ))
            })?
        } else {
            std::fs::create_dir_all(state_dir).map_err(|e| state_error(e.to_string()))?;
            Repository::init_bare(&dir).map_err(|e| state_error(e.message().to_string()))?
        };
        let location = redact_url(url);
        let git_error = |e: git2::Error| SourceError::Git {
            repo: location.clone(),
            message: redact_message(e.message(), url),
        };
        match repo.find_remote("origin") {
            Ok(remote) if remote.url_bytes() == url.as_bytes() => {}
            // The same state directory pointed at another URL: follow the new one.
            Ok(_) => repo.remote_set_url("origin", url).map_err(git_error)?,
            Err(_) => {
                repo.remote("origin", url).map_err(git_error)?;
            }
        }
        let mut source = Source {
            repo,
            location,
            origin: Some(credentials),
            branch: branch.to_string(),
            tracking_ref: format!("refs/remotes/origin/{branch}"),
            path: tracked_path(path.unwrap_or(Path::new("")))?,
        };
        source.fetch()?;
        Ok(source)
    }

    /// Whether the repository is a clone of a remote (fetched) rather than a local one (watched).
    pub fn is_remote(&self) -> bool {
        self.origin.is_some()
    }

    /// The repository as messages name it: its root folder, or its URL without credentials ([`redact_url`]).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The tracked branch.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// The path inside the repository that is synced, `/`-separated ("" for the root).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Fetches the tracked branch from the remote; `Ok(true)` when its head moved.
    ///
    /// The remote's refs are listed first and nothing is downloaded when the head has not moved.
    /// A local repository has nothing to fetch: `Ok(false)`. Fails when the remote cannot be
    /// reached or authenticated to, or no longer has the branch.
    pub fn fetch(&mut self) -> Result<bool, SourceError> {
        let Some(credentials) = &self.origin else {
            return Ok(false);
        };
        let branch_ref = format!("refs/heads/{}", self.branch);
        let tracking_ref = self.tracking_ref.clone();
        let network_error = |e: git2::Error| self.network_error(e);
        let mut remote = self.repo.find_remote("origin").map_err(network_error)?;
        let (remote_head, branches) = {
            let connection = remote
                .connect_auth(Direction::Fetch, Some(credentials.callbacks()), None)
                .map_err(network_error)?;
            let heads = connection.list().map_err(network_error)?;
            let remote_head = heads
                .iter()
                .find(|head| head.name() == branch_ref)
                .map(|head| head.oid());
            let branches: Vec<String> = heads
                .iter()
                .filter_map(|head| head.name().strip_prefix("refs/heads/"))
                .map(str::to_string)
                .collect();
            (remote_head, branches)
        };
        let Some(remote_head) = remote_head else {
            return Err(self.branch_not_found(branches));
        };
        let before = self.repo.refname_to_id(&tracking_ref).ok();
        if before == Some(remote_head) {
            tracing::debug!(repo = %self.location, branch = %self.branch, "remote head unchanged");
            return Ok(false);
        }
        let mut options = FetchOptions::new();
        options.remote_callbacks(credentials.callbacks());
        let refspec = format!("+{branch_ref}:{tracking_ref}");
        remote
            .fetch(&[refspec.as_str()], Some(&mut options), None)
            .map_err(network_error)?;
        let after = self.repo.refname_to_id(&tracking_ref).ok();
        tracing::debug!(repo = %self.location, branch = %self.branch, head = ?after, "fetched");
        Ok(after != before)
    }

    /// The tip of the tracked branch: the local branch of a local repository (else its
    /// `origin/<branch>`), the fetched remote-tracking ref of a remote. Only committed
    /// content counts, never the work tree.
    ///
    /// Fails when the branch no longer exists.
    pub fn head(&self) -> Result<CommitInfo, SourceError> {
        let oid = self
            .repo
            .refname_to_id(&self.tracking_ref)
            .map_err(|_| self.branch_not_found(self.local_branches()))?;
        let commit = self.repo.find_commit(oid).map_err(|e| self.git_error(e))?;
        Ok(self.commit_info(&commit, &self.branch))
    }

    /// A revision (SHA, branch, tag, `HEAD`, `origin/main`, `main~2`...) resolved to a commit.
    ///
    /// The commit's `branch` is the branch the revision named, else the tracked branch. In a
    /// clone of a remote, a branch name also finds the fetched remote branch. Fails when the
    /// revision names nothing, or something that is not a commit.
    pub fn resolve(&self, rev: &str) -> Result<CommitInfo, SourceError> {
        let (object, reference) = self.revparse(rev)?;
        let commit = self.peel(object, rev)?;
        let branch = reference
            .and_then(|reference| branch_name(&reference))
            .unwrap_or_else(|| self.branch.clone());
        Ok(self.commit_info(&commit, &branch))
    }

    /// The best common ancestor of two revisions (the default `--base` of `capstan plan`).
    ///
    /// Fails when either revision cannot be resolved or they share no history.
    pub fn merge_base(&self, a: &str, b: &str) -> Result<CommitInfo, SourceError> {
        let (one, two) = (self.find_commit(a)?, self.find_commit(b)?);
        let base = self
            .repo
            .merge_base(one.id(), two.id())
            .map_err(|e| match e.code() {
                ErrorCode::NotFound => SourceError::NoMergeBase {
                    repo: self.location.clone(),
                    a: a.to_string(),
                    b: b.to_string(),
                },
                _ => self.git_error(e),
            })?;
        let commit = self.repo.find_commit(base).map_err(|e| self.git_error(e))?;
        Ok(self.commit_info(&commit, &self.branch))
    }

    /// The commits that took the branch from `since` to `head`, oldest first and `head` last,
    /// following first parents (a merged pull request is its merge commit, not the commits
    /// of its branch).
    ///
    /// `None` when `since` is not among the `limit` first-parent ancestors of `head`: the
    /// branch was rewritten, or moved further than `limit` commits. Fails when either
    /// commit cannot be read.
    pub fn commits_since(
        &self,
        since: &str,
        head: &str,
        limit: usize,
    ) -> Result<Option<Vec<CommitInfo>>, SourceError> {
        let since = self.find_commit(since)?.id();
        let mut commit = self.find_commit(head)?;
        let mut walked = Vec::new();
        while walked.len() < limit {
            if commit.id() == since {
                walked.reverse();
                return Ok(Some(walked));
            }
            walked.push(self.commit_info(&commit, &self.branch));
            match commit.parent(0) {
                Ok(parent) => commit = parent,
                Err(_) => break,
            }
        }
        Ok(None)
    }

    /// Every manifest file (`*.yaml`, `*.yml`) under the tracked path at a commit, sorted by
    /// path. Hidden files and folders (a name starting with `.`) are neither walked nor read,
    /// and other files are counted but not read.
    ///
    /// Symlinks inside the repository resolve to their target's contents (a link to a folder
    /// brings its files under the link's path); a blob reached by several paths is read once.
    /// Fails on a symlink leading out of the repository (absolute, or `..` past the root),
    /// dangling or looping; past `budget`, at the path where it was exceeded; and when the
    /// path is missing or not a folder at that commit.
    pub fn files_at(&self, sha: &str, budget: &ReadBudget) -> Result<Vec<RepoFile>, SourceError> {
        let commit = self.find_commit(sha)?;
        let root = commit.tree().map_err(|e| self.git_error(e))?;
        let snapshot = Snapshot {
            source: self,
            root: &root,
            budget,
        };
        let (start, real) = snapshot.folder(&self.path, &commit)?;
        let mut walk = Walk::default();
        snapshot.collect(&start, &self.path, &real, &mut vec![start.id()], &mut walk)?;
        let mut files = walk.files;
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    /// The git directory holding the refs to watch (`refs/heads`, `packed-refs`, `HEAD`); for a
    /// linked worktree, the main repository's.
    pub fn git_dir(&self) -> PathBuf {
        self.repo.commondir().to_path_buf()
    }

    /// Fails early when the synced path is missing from the branch, a likely typo in `--path`.
    fn check_path_on_branch(&self) -> Result<(), SourceError> {
        let head = self.head()?;
        let commit = self.find_commit(&head.sha)?;
        let root = commit.tree().map_err(|e| self.git_error(e))?;
        let snapshot = Snapshot {
            source: self,
            root: &root,
            budget: &ReadBudget::COMMIT,
        };
        snapshot.folder(&self.path, &commit).map(drop)
    }

    fn revparse(
        &self,
        rev: &str,
    ) -> Result<(git2::Object<'_>, Option<git2::Reference<'_>>), SourceError> {
        self.repo
            .revparse_ext(rev)
            .or_else(|e| match (&self.origin, rev.strip_prefix("HEAD")) {
                // A bare clone's own HEAD names no branch; the tracked branch stands in for it.
                (Some(_), Some(rest)) => self
                    .repo
                    .revparse_ext(&format!("{}{rest}", self.tracking_ref)),
                // A clone of a remote, or a checkout following origin/<branch>, has its
                // branches under refs/remotes/origin.
                (_, None) if self.tracking_ref.starts_with("refs/remotes/") => {
                    self.repo.revparse_ext(&format!("origin/{rev}"))
                }
                _ => Err(e),
            })
            .map_err(|_| SourceError::RevisionNotFound {
                repo: self.location.clone(),
                rev: rev.to_string(),
            })
    }

    fn find_commit(&self, rev: &str) -> Result<git2::Commit<'_>, SourceError> {
        let (object, _) = self.revparse(rev)?;
        self.peel(object, rev)
    }

    fn peel<'r>(
        &self,
        object: git2::Object<'r>,
        rev: &str,
    ) -> Result<git2::Commit<'r>, SourceError> {
        object
            .peel_to_commit()
            .map_err(|_| SourceError::NotACommit {
                repo: self.location.clone(),
                rev: rev.to_string(),
            })
    }

    fn commit_info(&self, commit: &git2::Commit<'_>, branch: &str) -> CommitInfo {
        let author = commit.author();
        let message = String::from_utf8_lossy(commit.message_bytes());
        let subject = message.trim_start().lines().next().unwrap_or("").trim_end();
        CommitInfo {
            sha: commit.id().to_string(),
            branch: branch.to_string(),
            author: String::from_utf8_lossy(author.name_bytes()).into_owned(),
            email: String::from_utf8_lossy(author.email_bytes()).into_owned(),
            // Git accepts times jiff cannot represent; only a forged commit has one.
            time: jiff::Timestamp::from_second(commit.committer().when().seconds())
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            subject: subject.to_string(),
            pull_request: pull_request_of(&message),
        }
    }

    fn local_branches(&self) -> Vec<String> {
        let kind = match self.origin {
            Some(_) => BranchType::Remote,
            None => BranchType::Local,
        };
        let Ok(branches) = self.repo.branches(Some(kind)) else {
            return Vec::new();
        };
        branches
            .filter_map(|branch| {
                let (branch, _) = branch.ok()?;
                branch_name(branch.get())
            })
            .collect()
    }

    fn branch_not_found(&self, mut available: Vec<String>) -> SourceError {
        available.sort();
        let available = match available.len() {
            0 => "none yet; commit something first".to_string(),
            1..=10 => available.join(", "),
            n => format!("{}, and {} more", available[..10].join(", "), n - 10),
        };
        SourceError::BranchNotFound {
            repo: self.location.clone(),
            branch: self.branch.clone(),
            available,
        }
    }

    fn network_error(&self, e: git2::Error) -> SourceError {
        let message = match self
            .repo
            .find_remote("origin")
            .ok()
            .map(|r| String::from_utf8_lossy(r.url_bytes()).into_owned())
        {
            Some(url) => redact_message(e.message(), &url),
            None => redact_urls_in(e.message()),
        };
        let repo = self.location.clone();
        match e.code() {
            ErrorCode::Auth => SourceError::Authentication { repo, message },
            ErrorCode::Certificate => SourceError::Certificate { repo, message },
            _ => SourceError::Fetch {
                repo,
                branch: self.branch.clone(),
                message,
            },
        }
    }

    fn git_error(&self, e: git2::Error) -> SourceError {
        SourceError::Git {
            repo: self.location.clone(),
            message: redact_urls_in(e.message()),
        }
    }
}

/// One commit's tree, read with symlinks resolved inside it.
struct Snapshot<'a> {
    source: &'a Source,
    root: &'a git2::Tree<'a>,
    budget: &'a ReadBudget,
}

/// What a walk of one commit has found and spent so far.
#[derive(Default)]
struct Walk {
    files: Vec<RepoFile>,
    paths: usize,
    bytes: u64,
    /// Blobs already read, by id: a blob fanned out to many paths is held once.
    blobs: HashMap<Oid, Arc<[u8]>>,
}

/// What a path leads to once its symlinks are followed, with the real path it ends at.
enum Target<'a> {
    Folder(git2::Tree<'a>, Vec<String>),
    File(Oid),
    Missing,
}

impl<'a> Snapshot<'a> {
    /// The synced folder at this commit, with the real path it is stored at.
    fn folder(
        &self,
        path: &str,
        commit: &git2::Commit<'_>,
    ) -> Result<(git2::Tree<'a>, Vec<String>), SourceError> {
        let sha = commit.id().to_string();
        let short = sha.get(..7).unwrap_or(&sha).to_string();
        match self.lookup(split_path(path), path)? {
            Target::Folder(tree, real) => Ok((tree, real)),
            Target::File(_) => Err(SourceError::NotAFolder {
                repo: self.source.location.clone(),
                path: path.to_string(),
                commit: short,
            }),
            Target::Missing => Err(SourceError::PathNotFound {
                repo: self.source.location.clone(),
                path: path.to_string(),
                commit: short,
            }),
        }
    }

    /// Adds every file under `tree` to `files`; `path` is where the tree appears, `real` where
    /// it is stored (they differ below a symlinked folder), `ancestors` the trees being walked.
    fn collect(
        &self,
        tree: &git2::Tree<'a>,
        path: &str,
        real: &[String],
        ancestors: &mut Vec<Oid>,
        walk: &mut Walk,
    ) -> Result<(), SourceError> {
        for entry in tree.iter() {
            let name = String::from_utf8_lossy(entry.name_bytes()).into_owned();
            if name.starts_with('.') {
                continue;
            }
            let entry_path = join(path, &name);
            walk.paths += 1;
            if walk.paths > self.budget.max_paths {
                return Err(SourceError::TooManyPaths {
                    path: entry_path,
                    limit: self.budget.max_paths,
                });
            }
            let manifest = is_manifest_name(&name);
            let mut entry_real = real.to_vec();
            entry_real.push(name);
            match EntryKind::of(&entry) {
                EntryKind::Folder => {
                    let subtree = self.tree(entry.id())?;
                    ancestors.push(subtree.id());
                    self.collect(&subtree, &entry_path, &entry_real, ancestors, walk)?;
                    ancestors.pop();
                }
                EntryKind::File if manifest => self.read(entry.id(), entry_path, walk)?,
                EntryKind::File => {}
                EntryKind::Link => {
                    let target = self.link_target(entry.id())?;
                    let mut link_dir = entry_real;
                    link_dir.pop();
                    let resolved = resolve_link(&link_dir, &target).ok_or_else(|| {
                        SourceError::SymlinkEscapes {
                            link: entry_path.clone(),
                            target: target.clone(),
                        }
                    })?;
                    match self.lookup(resolved, &entry_path)? {
                        Target::File(blob) if manifest => self.read(blob, entry_path, walk)?,
                        Target::File(_) => {}
                        Target::Folder(subtree, subtree_real) => {
                            // A link to a folder above itself would list its files forever.
                            if ancestors.contains(&subtree.id()) {
                                return Err(SourceError::SymlinkLoop { link: entry_path });
                            }
                            ancestors.push(subtree.id());
                            self.collect(&subtree, &entry_path, &subtree_real, ancestors, walk)?;
                            ancestors.pop();
                        }
                        Target::Missing => {
                            return Err(SourceError::SymlinkDangling {
                                link: entry_path,
                                target,
                            });
                        }
                    }
                }
                // Submodules are other repositories, whose content this commit does not hold.
                EntryKind::Submodule => tracing::warn!(path = %entry_path, "skipping submodule"),
            }
        }
        Ok(())
    }

    /// Finds a path (components from the root) in the commit, following symlinks on the way.
    /// `link` names the path being resolved, for errors.
    fn lookup(&self, components: Vec<String>, link: &str) -> Result<Target<'a>, SourceError> {
        let mut pending = components;
        pending.reverse();
        let mut tree = self.root.clone();
        let mut real: Vec<String> = Vec::new();
        let mut hops = 0;
        while let Some(name) = pending.pop() {
            let Some((id, kind)) = tree
                .get_name(&name)
                .map(|entry| (entry.id(), EntryKind::of(&entry)))
            else {
                return Ok(Target::Missing);
            };
            match kind {
                EntryKind::Folder => {
                    tree = self.tree(id)?;
                    real.push(name);
                }
                EntryKind::File if pending.is_empty() => return Ok(Target::File(id)),
                EntryKind::Link => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(SourceError::SymlinkLoop {
                            link: link.to_string(),
                        });
                    }
                    let target = self.link_target(id)?;
                    let Some(resolved) = resolve_link(&real, &target) else {
                        real.push(name);
                        return Err(SourceError::SymlinkEscapes {
                            link: real.join("/"),
                            target,
                        });
                    };
                    // Continue from the root with the link's target in place of the link.
                    pending.extend(resolved.into_iter().rev());
                    tree = self.root.clone();
                    real.clear();
                }
                _ => return Ok(Target::Missing),
            }
        }
        Ok(Target::Folder(tree, real))
    }

    fn tree(&self, id: Oid) -> Result<git2::Tree<'a>, SourceError> {
        self.source
            .repo
            .find_tree(id)
            .map_err(|e| self.source.git_error(e))
    }

    fn link_target(&self, id: Oid) -> Result<String, SourceError> {
        let blob = self
            .source
            .repo
            .find_blob(id)
            .map_err(|e| self.source.git_error(e))?;
        Ok(String::from_utf8_lossy(blob.content()).into_owned())
    }

    /// Adds the manifest file `path` (blob `id`) to the walk, checking its size and the
    /// commit's budget before reading it; a blob read before is not read again.
    fn read(&self, id: Oid, path: String, walk: &mut Walk) -> Result<(), SourceError> {
        let budget = self.budget;
        if walk.files.len() >= budget.max_files {
            return Err(SourceError::TooManyFiles {
                path,
                limit: budget.max_files,
            });
        }
        let known = walk.blobs.get(&id).cloned();
        let odb = self
            .source
            .repo
            .odb()
            .map_err(|e| self.source.git_error(e))?;
        let size = match &known {
            Some(contents) => contents.len() as u64,
            None => odb.read_header(id).map_err(|e| self.source.git_error(e))?.0 as u64,
        };
        self.spend(size, &path, walk)?;
        let contents = match known {
            Some(contents) => contents,
            None => {
                let object = odb.read(id).map_err(|e| self.source.git_error(e))?;
                if object.kind() != ObjectType::Blob {
                    return Err(SourceError::Git {
                        repo: self.source.location.clone(),
                        message: format!("'{path}' is not a file object"),
                    });
                }
                let contents: Arc<[u8]> = Arc::from(object.data());
                walk.blobs.insert(id, Arc::clone(&contents));
                contents
            }
        };
        walk.files.push(RepoFile { path, contents });
        Ok(())
    }

    /// Counts `size` bytes at `path` against the budget.
    fn spend(&self, size: u64, path: &str, walk: &mut Walk) -> Result<(), SourceError> {
        let budget = self.budget;
        if size > budget.max_file_bytes {
            return Err(SourceError::FileTooLarge {
                path: path.to_string(),
                size,
                limit: budget.max_file_bytes,
            });
        }
        walk.bytes = walk.bytes.saturating_add(size);
        if walk.bytes > budget.max_bytes {
            return Err(SourceError::CommitTooLarge {
                path: path.to_string(),
                limit: budget.max_bytes,
            });
        }
        Ok(())
    }
}

/// The components of a `/`-separated path inside the repository.
fn split_path(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Where a symlink in `link_dir` points, as components from the repository root;
/// `None` when the target is absolute or climbs above the root.
fn resolve_link(link_dir: &[String], target: &str) -> Option<Vec<String>> {
    if target.starts_with('/') {
        return None;
    }
    let mut resolved = link_dir.to_vec();
    for component in target.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                resolved.pop()?;
            }
            name => resolved.push(name.to_string()),
        }
    }
    Some(resolved)
}

/// The synced path, checked and written `/`-separated without `.` or trailing slashes.
fn tracked_path(path: &Path) -> Result<String, SourceError> {
    let invalid = |reason| SourceError::InvalidPath {
        path: path.display().to_string(),
        reason,
    };
    let mut components = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => components.push(
                name.to_str()
                    .ok_or_else(|| invalid("is not valid UTF-8"))?
                    .to_string(),
            ),
            Component::CurDir => {}
            Component::ParentDir => {
                components
                    .pop()
                    .ok_or_else(|| invalid("climbs out of the repository"))?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(invalid("is absolute")),
        }
    }
    Ok(components.join("/"))
}

/// The branch a reference names: `refs/heads/x` or `refs/remotes/<remote>/x` -> `x`.
fn branch_name(reference: &git2::Reference<'_>) -> Option<String> {
    let resolved = reference.resolve().ok()?;
    let name = resolved.name().ok()?;
    if let Some(branch) = name.strip_prefix("refs/heads/") {
        return Some(branch.to_string());
    }
    let (_, branch) = name.strip_prefix("refs/remotes/")?.split_once('/')?;
    (branch != "HEAD").then(|| branch.to_string())
}

/// `user@host:path`, git's short form of an ssh URL: a colon before any slash.
fn looks_like_scp_url(repo: &str) -> bool {
    match (repo.find(':'), repo.find('/')) {
        (Some(colon), Some(slash)) => colon < slash,
        (Some(_), None) => true,
        _ => false,
    }
}

fn canonical(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_testing::git::{Entry, FleetRepo};

    const LIMIT: ReadBudget = ReadBudget::COMMIT;

    fn open(repo: &Path, path: Option<&str>) -> Result<Source, SourceError> {
        let state = tempfile::tempdir().expect("state dir");
        Source::open(
            repo.to_str().expect("utf-8 path"),
            "main",
            path.map(Path::new),
            state.path(),
            Auth::None,
        )
    }

    fn paths(files: &[RepoFile]) -> Vec<&str> {
        files.iter().map(|f| f.path.as_str()).collect()
    }

    fn contents<'f>(files: &'f [RepoFile], path: &str) -> &'f str {
        let file = files.iter().find(|f| f.path == path).expect(path);
        std::str::from_utf8(&file.contents).expect("utf-8")
    }

    fn fleet() -> [(&'static str, Entry<'static>); 5] {
        [
            ("README.md", Entry::File("# fleet")),
            ("deploy/modules/driver.yaml", Entry::File("kind: Module")),
            ("deploy/nodes.yaml", Entry::File("kind: Node")),
            ("deploy/apps/lws.yaml", Entry::File("kind: LeaderWorkerSet")),
            ("other/ignored.yaml", Entry::File("kind: Other")),
        ]
    }

    #[test]
    fn source_can_move_to_a_blocking_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<Source>();
    }

    #[test]
    fn a_folder_inside_a_repository_becomes_the_synced_path() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &fleet(), "fleet");
        std::fs::create_dir_all(repo.path().join("deploy/apps")).expect("mkdir");

        let source = open(&repo.path().join("deploy"), None).expect("open folder");
        assert_eq!(source.path(), "deploy");
        assert!(!source.is_remote());

        let source = open(&repo.path().join("deploy"), Some("apps")).expect("open folder + path");
        assert_eq!(source.path(), "deploy/apps");
        let files = source.files_at("main", &LIMIT).expect("files");
        assert_eq!(paths(&files), ["deploy/apps/lws.yaml"]);

        let source = open(repo.path(), Some("./deploy/")).expect("open root + path");
        assert_eq!(source.path(), "deploy");
        let source = open(repo.path(), None).expect("open root");
        assert_eq!(source.path(), "");
    }

    #[test]
    fn only_committed_content_is_synced() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &fleet(), "fleet");
        let deploy = repo.path().join("deploy");
        std::fs::create_dir_all(&deploy).expect("mkdir");
        std::fs::write(deploy.join("nodes.yaml"), "kind: Edited").expect("edit");
        std::fs::write(deploy.join("untracked.yaml"), "kind: New").expect("untracked");
        std::fs::write(deploy.join("staged.yaml"), "kind: Staged").expect("staged");
        let mut index = repo.git.index().expect("index");
        index
            .add_path(Path::new("deploy/staged.yaml"))
            .expect("stage");
        index.write().expect("write index");

        let source = open(repo.path(), Some("deploy")).expect("open");
        let head = source.head().expect("head");
        let files = source.files_at(&head.sha, &LIMIT).expect("files");
        assert_eq!(
            paths(&files),
            [
                "deploy/apps/lws.yaml",
                "deploy/modules/driver.yaml",
                "deploy/nodes.yaml"
            ]
        );
        assert_eq!(contents(&files, "deploy/nodes.yaml"), "kind: Node");
    }

    #[test]
    fn files_are_sorted_and_limited_to_the_path() {
        let repo = FleetRepo::new();
        repo.commit_files(
            "main",
            &[
                ("deploy/z.yaml", Entry::File("z")),
                ("deploy/a/b.yaml", Entry::File("ab")),
                ("deploy/a.yaml", Entry::File("a")),
                ("deploy-other/x.yaml", Entry::File("x")),
                ("top.yaml", Entry::File("top")),
            ],
            "files",
        );
        let source = open(repo.path(), Some("deploy")).expect("open");
        let files = source.files_at("main", &LIMIT).expect("files");
        assert_eq!(
            paths(&files),
            ["deploy/a.yaml", "deploy/a/b.yaml", "deploy/z.yaml"]
        );
        let everything = open(repo.path(), None).expect("open root");
        assert_eq!(everything.files_at("main", &LIMIT).expect("files").len(), 5);
    }

    #[test]
    fn the_branch_is_read_not_the_checked_out_head() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("a.yaml", Entry::File("main"))], "on main");
        repo.commit_files(
            "feature",
            &[("a.yaml", Entry::File("feature"))],
            "on feature",
        );
        repo.git
            .set_head("refs/heads/feature")
            .expect("checkout feature");

        let source = open(repo.path(), None).expect("open");
        let head = source.head().expect("head");
        assert_eq!(head.subject, "on main");
        let files = source.files_at(&head.sha, &LIMIT).expect("files");
        assert_eq!(contents(&files, "a.yaml"), "main");
    }

    #[test]
    fn a_file_over_the_size_limit_is_rejected_naming_it() {
        let repo = FleetRepo::new();
        let big = "x".repeat(2048);
        repo.commit_files(
            "main",
            &[
                ("deploy/small.yaml", Entry::File("ok")),
                ("deploy/big.yaml", Entry::File(&big)),
                ("deploy/link.yaml", Entry::Link("big.yaml")),
            ],
            "big",
        );
        let source = open(repo.path(), Some("deploy")).expect("open");
        let budget = |max_file_bytes| ReadBudget {
            max_file_bytes,
            ..ReadBudget::COMMIT
        };
        let error = source
            .files_at("main", &budget(1024))
            .expect_err("too large");
        assert!(
            matches!(&error, SourceError::FileTooLarge { path, size: 2048, limit: 1024 } if path == "deploy/big.yaml"),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "file 'deploy/big.yaml' is 2048 bytes, over the limit of 1024 bytes"
        );
        assert_eq!(
            source
                .files_at("main", &budget(2048))
                .expect("at the limit")
                .len(),
            3
        );
    }

    #[test]
    fn a_commit_over_its_budget_is_refused_where_it_goes_over_before_reading_on() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("deploy/a.yaml", Entry::File("a"))], "start");
        // 8 folders of 8 of 8 of 8, each holding the same 1,000-byte file twice.
        let file = "x".repeat(1000);
        repo.commit_fan_out(
            "main",
            "deploy",
            file.as_bytes(),
            (8, 4),
            &["m.yaml", "notes.txt"],
            "fan out",
        );
        let source = open(repo.path(), Some("deploy")).expect("open");

        // Under the default budget: 4,096 manifests, one blob held once.
        let files = source.files_at("main", &LIMIT).expect("within budget");
        assert_eq!(files.len(), 4096, "only the YAML files are read");
        assert!(
            files
                .iter()
                .all(|f| Arc::ptr_eq(&f.contents, &files[0].contents))
        );

        let cases = [
            (
                ReadBudget {
                    max_bytes: 10_000,
                    ..LIMIT
                },
                "deploy/d0/d0/d1/d2/m.yaml: the manifest files reach more than 10000 bytes",
            ),
            (
                ReadBudget {
                    max_files: 100,
                    ..LIMIT
                },
                "deploy/d0/d1/d4/d4/m.yaml: the synced folder has more than 100 manifest files",
            ),
            (
                ReadBudget {
                    max_paths: 1000,
                    ..LIMIT
                },
                "deploy/d0/d4/d7/d6: the synced folder has more than 1000 paths",
            ),
        ];
        for (budget, message) in cases {
            let error = source.files_at("main", &budget).expect_err(message);
            assert!(error.to_string().starts_with(message), "{error}");
            let (path, _) = error.in_commit().expect("a problem of the commit");
            assert!(message.starts_with(path), "{path}");
        }
    }

    #[test]
    fn symlinks_inside_the_repository_resolve_to_their_target() {
        let repo = FleetRepo::new();
        repo.commit_files(
            "main",
            &[
                ("base/common.yaml", Entry::File("kind: Common")),
                ("base/shared/driver.yaml", Entry::File("kind: Module")),
                (
                    "envs/prod/common.yaml",
                    Entry::Link("../../base/common.yaml"),
                ),
                ("envs/prod/shared", Entry::Link("../../base/shared")),
                ("envs/prod/again.yaml", Entry::Link("./common.yaml")),
                ("deploy", Entry::Link("envs/prod")),
            ],
            "links",
        );
        let source = open(repo.path(), Some("deploy")).expect("open through a link");
        let files = source.files_at("main", &LIMIT).expect("files");
        assert_eq!(
            paths(&files),
            [
                "deploy/again.yaml",
                "deploy/common.yaml",
                "deploy/shared/driver.yaml"
            ]
        );
        assert_eq!(contents(&files, "deploy/again.yaml"), "kind: Common");
        assert_eq!(contents(&files, "deploy/common.yaml"), "kind: Common");
        assert_eq!(
            contents(&files, "deploy/shared/driver.yaml"),
            "kind: Module"
        );
    }

    #[test]
    fn a_symlink_out_of_the_repository_is_rejected_naming_link_and_target() {
        let cases = [
            (
                "/etc/passwd",
                "points to '/etc/passwd', outside the repository",
            ),
            (
                "../../../etc/passwd",
                "points to '../../../etc/passwd', outside the repository",
            ),
            (
                "missing.yaml",
                "points to 'missing.yaml', which does not exist",
            ),
            ("loop.yaml", "leads into a loop"),
        ];
        for (target, message) in cases {
            let repo = FleetRepo::new();
            repo.commit_files(
                "main",
                &[
                    ("deploy/ok.yaml", Entry::File("ok")),
                    ("deploy/loop.yaml", Entry::Link("link.yaml")),
                    ("deploy/link.yaml", Entry::Link(target)),
                ],
                "link",
            );
            let source = open(repo.path(), Some("deploy")).expect("open");
            let error = source
                .files_at("main", &LIMIT)
                .expect_err(target)
                .to_string();
            assert!(error.contains("symlink 'deploy/"), "{error}");
            assert!(error.contains(message), "{target}: {error}");
        }
    }

    #[test]
    fn a_symlinked_folder_leading_back_up_is_a_loop() {
        let repo = FleetRepo::new();
        repo.commit_files(
            "main",
            &[
                ("deploy/a.yaml", Entry::File("a")),
                ("deploy/sub/up", Entry::Link("..")),
            ],
            "loop",
        );
        let source = open(repo.path(), Some("deploy")).expect("open");
        let error = source.files_at("main", &LIMIT).expect_err("loop");
        assert!(
            matches!(&error, SourceError::SymlinkLoop { link } if link == "deploy/sub/up"),
            "{error}"
        );
    }

    #[test]
    fn each_commit_knows_its_author_time_subject_and_pull_request() {
        let repo = FleetRepo::new();
        let first = repo.commit_files("main", &[("a.yaml", Entry::File("1"))], "Initial fleet");
        repo.branch("feature", first);
        repo.commit_files("feature", &[("a.yaml", Entry::File("2"))], "Bump driver");
        repo.commit_files("main", &[("b.yaml", Entry::File("b"))], "Add b (#41)");
        let merged = repo.merge(
            "main",
            "feature",
            &[("a.yaml", Entry::File("2")), ("b.yaml", Entry::File("b"))],
            "Merge pull request #42 from acme/feature\n\nBump driver",
        );

        let source = open(repo.path(), None).expect("open");
        let head = source.head().expect("head");
        assert_eq!(head.sha, merged.to_string());
        assert_eq!(head.branch, "main");
        assert_eq!(head.author, "Ada Lovelace");
        assert_eq!(head.email, "ada@example.com");
        assert_eq!(head.subject, "Merge pull request #42 from acme/feature");
        assert_eq!(head.pull_request, Some(42));
        assert_eq!(head.revision(), format!("main@sha1:{merged}"));
        let age = jiff::Timestamp::now().duration_since(head.time);
        assert!(age.as_secs() < 600, "commit time {}", head.time);

        let squash = source.resolve("main^1").expect("first parent");
        assert_eq!(squash.pull_request, Some(41));
        assert_eq!(squash.branch, "main");
    }

    #[test]
    fn revisions_resolve_to_commits() {
        let repo = FleetRepo::new();
        let first = repo.commit_files("main", &[("a.yaml", Entry::File("1"))], "first");
        let second = repo.commit_files("main", &[("a.yaml", Entry::File("2"))], "second");
        let feature = repo.commit_files("feature", &[("a.yaml", Entry::File("3"))], "feature");
        let commit = repo.git.find_commit(first).expect("commit");
        repo.git
            .tag_lightweight("v1", commit.as_object(), false)
            .expect("tag");
        repo.git.set_head("refs/heads/feature").expect("head");

        let source = open(repo.path(), None).expect("open");
        let cases = [
            ("main", second, "main"),
            ("main~1", first, "main"),
            ("v1", first, "main"),
            ("feature", feature, "feature"),
            ("HEAD", feature, "feature"),
        ];
        for (rev, sha, branch) in cases {
            let commit = source.resolve(rev).expect(rev);
            assert_eq!(
                (commit.sha.as_str(), commit.branch.as_str()),
                (sha.to_string().as_str(), branch),
                "{rev}"
            );
        }
        let short = &second.to_string()[..10];
        assert_eq!(
            source.resolve(short).expect("short sha").sha,
            second.to_string()
        );

        let missing = source.resolve("nope").expect_err("missing");
        assert!(
            matches!(missing, SourceError::RevisionNotFound { .. }),
            "{missing}"
        );
        assert!(
            missing.to_string().contains("revision 'nope' not found"),
            "{missing}"
        );
        let tree = source.resolve("main^{tree}").expect_err("tree");
        assert!(matches!(tree, SourceError::NotACommit { .. }), "{tree}");
    }

    #[test]
    fn merge_base_is_where_a_branch_left_main() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("a.yaml", Entry::File("1"))], "first");
        let fork = repo.commit_files("main", &[("a.yaml", Entry::File("2"))], "fork point");
        repo.branch("feature", fork);
        repo.commit_files("feature", &[("a.yaml", Entry::File("3"))], "on feature");
        repo.commit_files("main", &[("a.yaml", Entry::File("4"))], "on main");

        let source = open(repo.path(), None).expect("open");
        let base = source.merge_base("main", "feature").expect("merge base");
        assert_eq!(base.sha, fork.to_string());
        assert_eq!(base.subject, "fork point");

        repo.commit_files("orphan", &[("o.yaml", Entry::File("o"))], "unrelated");
        let error = source.merge_base("main", "orphan").expect_err("unrelated");
        assert!(matches!(error, SourceError::NoMergeBase { .. }), "{error}");
    }

    #[test]
    fn a_ci_checkout_without_the_local_branch_follows_origin() {
        let repo = FleetRepo::new();
        let tip = repo.commit_files("main", &fleet(), "fleet");
        repo.branch("feature", tip);
        let proposed = repo.commit_files(
            "feature",
            &[("deploy/nodes.yaml", Entry::File("kind: Node"))],
            "proposed",
        );
        repo.git
            .reference("refs/remotes/origin/main", tip, true, "fetched")
            .expect("remote-tracking branch");
        repo.git
            .set_head_detached(proposed)
            .expect("detached checkout");
        repo.git
            .find_reference("refs/heads/main")
            .expect("main")
            .delete()
            .expect("delete main");

        let source = open(repo.path(), Some("deploy")).expect("open");
        assert_eq!(source.head().expect("head").sha, tip.to_string());
        assert_eq!(source.resolve("main").expect("main").sha, tip.to_string());
        assert_eq!(
            source.resolve("HEAD").expect("HEAD").sha,
            proposed.to_string()
        );
        assert_eq!(
            source
                .merge_base("HEAD", &tip.to_string())
                .expect("base")
                .sha,
            tip.to_string()
        );

        let error = Source::open(
            repo.path().to_str().expect("utf-8"),
            "prod",
            None,
            tempfile::tempdir().expect("state").path(),
            Auth::None,
        )
        .expect_err("no prod branch anywhere");
        assert!(
            matches!(error, SourceError::BranchNotFound { .. }),
            "{error}"
        );
    }

    #[test]
    fn a_plan_may_open_a_path_the_branch_does_not_have_yet() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &[("README.md", Entry::File("# fleet"))], "empty");
        let proposed = repo.commit_files("feature", &fleet(), "add the fleet");
        let root = repo.path().to_str().expect("utf-8");
        let state = tempfile::tempdir().expect("state");
        let path = Some(Path::new("deploy"));

        let error = Source::open(root, "main", path, state.path(), Auth::None)
            .expect_err("sync needs the path on the branch");
        assert!(matches!(error, SourceError::PathNotFound { .. }), "{error}");

        let source = Source::open_allowing_new_path(root, "main", path, state.path(), Auth::None)
            .expect("open for a plan");
        assert_eq!(
            source
                .files_at(&proposed.to_string(), &LIMIT)
                .expect("files")
                .len(),
            3
        );
        let error = source.files_at("main", &LIMIT).expect_err("not on main");
        assert!(matches!(error, SourceError::PathNotFound { .. }), "{error}");
    }

    #[test]
    fn a_packed_ref_is_read_like_a_loose_one() {
        let repo = FleetRepo::new();
        let tip = repo.commit_files("main", &[("a.yaml", Entry::File("1"))], "packed");
        repo.pack_refs(&[("refs/heads/main", tip)]);
        assert!(!repo.git.path().join("refs/heads/main").exists());

        let source = open(repo.path(), None).expect("open");
        assert_eq!(source.head().expect("head").sha, tip.to_string());
        assert_eq!(canonical(&source.git_dir()), canonical(repo.git.path()));
    }

    #[test]
    fn opening_explains_what_is_wrong() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &fleet(), "fleet");
        repo.commit_files("dev", &fleet(), "fleet");
        let root = repo.path().to_str().expect("utf-8");
        let state = tempfile::tempdir().expect("state");
        let open_with = |repo: &str, branch: &str, path: Option<&str>| {
            Source::open(repo, branch, path.map(Path::new), state.path(), Auth::None)
                .expect_err(repo)
                .to_string()
        };

        let error = open_with(root, "mian", None);
        assert!(error.contains("branch 'mian' not found"), "{error}");
        assert!(error.contains("branches there: dev, main"), "{error}");

        let error = open_with(root, "main", Some("deplyo"));
        assert!(
            error.contains("path 'deplyo' does not exist at commit"),
            "{error}"
        );
        let error = open_with(root, "main", Some("README.md"));
        assert!(error.contains("path 'README.md' is a file"), "{error}");
        let error = open_with(root, "main", Some("/etc"));
        assert!(error.contains("path '/etc' is absolute"), "{error}");
        let error = open_with(root, "main", Some("../x"));
        assert!(error.contains("climbs out of the repository"), "{error}");
        let error = open_with(root, "bad..name", None);
        assert!(error.contains("not a valid branch name"), "{error}");

        let not_a_repo = tempfile::tempdir().expect("dir");
        let error = open_with(not_a_repo.path().to_str().expect("utf-8"), "main", None);
        assert!(error.contains("is not inside a Git repository"), "{error}");
        let error = open_with("/no/such/dir", "main", None);
        assert!(
            error.contains("repository '/no/such/dir' not found"),
            "{error}"
        );
        let git_dir = repo.git.path().join("refs");
        let error = open_with(git_dir.to_str().expect("utf-8"), "main", None);
        assert!(
            error.contains("inside the repository's git directory"),
            "{error}"
        );
    }

    #[test]
    fn a_remote_is_cloned_and_fetched_only_when_its_head_moved() {
        let remote = FleetRepo::bare();
        let first = remote.commit_files("main", &fleet(), "first");
        let url = format!("file://{}", remote.path().display());
        let state = tempfile::tempdir().expect("state");

        let mut source = Source::open(
            &url,
            "main",
            Some(Path::new("deploy")),
            state.path(),
            Auth::None,
        )
        .expect("clone");
        assert!(source.is_remote());
        assert_eq!(source.path(), "deploy");
        assert_eq!(source.head().expect("head").sha, first.to_string());
        assert!(state.path().join("repo").join("HEAD").exists());
        assert_eq!(source.files_at("main", &LIMIT).expect("files").len(), 3);

        // Unchanged head: nothing is downloaded, not even FETCH_HEAD rewritten.
        let fetch_head = source.git_dir().join("FETCH_HEAD");
        let _ = std::fs::remove_file(&fetch_head);
        assert!(!source.fetch().expect("fetch"));
        assert!(!fetch_head.exists(), "an unchanged head still fetched");

        let second = remote.commit_files(
            "main",
            &[("deploy/new.yaml", Entry::File("kind: New"))],
            "Add new (#7)",
        );
        assert!(source.fetch().expect("fetch"));
        let head = source.head().expect("head");
        assert_eq!(head.sha, second.to_string());
        assert_eq!(head.pull_request, Some(7));
        assert_eq!(head.revision(), format!("main@sha1:{second}"));
        assert_eq!(
            source.resolve("main").expect("branch name").sha,
            second.to_string()
        );
        assert_eq!(
            source.resolve("origin/main").expect("tracking").sha,
            second.to_string()
        );
        assert_eq!(
            source.resolve("HEAD").expect("HEAD").sha,
            second.to_string()
        );
        assert_eq!(
            source.resolve("HEAD~1").expect("HEAD~1").sha,
            first.to_string()
        );
        assert_eq!(
            source
                .merge_base("main", &first.to_string())
                .expect("base")
                .sha,
            first.to_string()
        );
        assert!(!source.fetch().expect("fetch again"));

        // A restart reuses the clone and is current at once.
        drop(source);
        let mut reopened = Source::open(
            &url,
            "main",
            Some(Path::new("deploy")),
            state.path(),
            Auth::None,
        )
        .expect("reopen");
        assert_eq!(reopened.head().expect("head").sha, second.to_string());
        assert!(!reopened.fetch().expect("fetch"));
    }

    #[test]
    fn a_missing_remote_branch_names_the_branches_there() {
        let remote = FleetRepo::bare();
        remote.commit_files("main", &fleet(), "first");
        let url = format!("file://{}", remote.path().display());
        let state = tempfile::tempdir().expect("state");
        let error = Source::open(&url, "prod", None, state.path(), Auth::None)
            .expect_err("no such branch")
            .to_string();
        assert!(
            error.contains("branch 'prod' not found in file://"),
            "{error}"
        );
        assert!(error.contains("branches there: main"), "{error}");
    }

    #[test]
    fn an_unreachable_remote_is_a_fetch_error() {
        let state = tempfile::tempdir().expect("state");
        let error = Source::open(
            "file:///no/such/repo.git",
            "main",
            None,
            state.path(),
            Auth::None,
        )
        .expect_err("unreachable")
        .to_string();
        assert!(
            error.starts_with("fetching branch 'main' from file:///no/such/repo.git failed"),
            "{error}"
        );
    }

    #[test]
    fn a_local_repository_has_nothing_to_fetch() {
        let repo = FleetRepo::new();
        repo.commit_files("main", &fleet(), "fleet");
        let mut source = open(repo.path(), None).expect("open");
        assert!(!source.fetch().expect("fetch"));
    }

    #[test]
    fn repository_arguments_are_told_apart() {
        let cases = [
            ("git@github.com:acme/fleet.git", true),
            ("github.com:acme/fleet.git", true),
            ("./fleet", false),
            ("fleet", false),
            ("/srv/git/fleet:v2", false),
        ];
        for (repo, scp) in cases {
            assert_eq!(looks_like_scp_url(repo), scp, "{repo}");
        }
        let urls = [
            (
                "https://github.com/acme/fleet",
                "https://github.com/acme/fleet",
            ),
            (
                "https://x-access-token:ghp_secret@github.com/acme/fleet",
                "https://x-access-token:***@github.com/acme/fleet",
            ),
            (
                "https://bot@github.com/acme/fleet",
                "https://***@github.com/acme/fleet",
            ),
            (
                "git@github.com:acme/fleet.git",
                "git@github.com:acme/fleet.git",
            ),
        ];
        for (url, shown) in urls {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn the_synced_path_is_normalised() {
        let cases = [
            ("", Some("")),
            (".", Some("")),
            ("deploy/", Some("deploy")),
            ("./deploy/./apps", Some("deploy/apps")),
            ("deploy/../other", Some("other")),
            ("..", None),
            ("/deploy", None),
        ];
        for (path, expected) in cases {
            assert_eq!(
                tracked_path(Path::new(path)).ok().as_deref(),
                expected,
                "{path}"
            );
        }
    }
}
