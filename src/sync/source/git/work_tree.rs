//! The work tree of a local repository as a commit, for `capstan plan --head WORKTREE`: what
//! a change would be if it were committed now, before it is.
//!
//! The files are taken as `git add -A` would take them (tracked files as they are, deleted
//! ones gone, untracked ones unless ignored) into a commit on top of HEAD, so that
//! [`Source::files_at`] reads it as any commit: symlinks, size limits and submodules as for
//! a real one. Its objects live in memory only: the repository's objects, refs and index on
//! disk are left as they were.

use git2::{IndexAddOption, Signature, Time};

use super::{Source, SourceError};
use crate::sync::source::CommitInfo;

/// The revision that names the work tree (`capstan plan --head WORKTREE`).
pub const WORK_TREE: &str = "WORKTREE";

/// The subject of a work tree's commit.
pub const WORK_TREE_SUBJECT: &str = "Uncommitted changes in the work tree";

/// Above loose objects (1) and packs (2): objects written from now on go to memory.
const IN_MEMORY: i32 = 1_000;

impl Source {
    /// The work tree as a commit on top of HEAD (none when HEAD has no commit yet), held
    /// in memory; [`Source::files_at`] reads it like any other. Its author is the
    /// repository's configured user (else `capstan`), its time HEAD's, so the same work
    /// tree on the same HEAD is always the same commit.
    ///
    /// Fails for a remote or bare repository, which has no work tree, and when the work
    /// tree or index cannot be read.
    pub fn work_tree_commit(&self) -> Result<CommitInfo, SourceError> {
        if self.origin.is_some() || self.repo.is_bare() || self.repo.workdir().is_none() {
            return Err(SourceError::NoWorkTree {
                repo: self.location.clone(),
            });
        }
        let git_error = |e: git2::Error| self.git_error(e);
        // Every object written after this (the blobs of changed files, the trees, the
        // commit) stays in this process.
        let odb = self.repo.odb().map_err(git_error)?;
        odb.add_new_mempack_backend(IN_MEMORY).map_err(git_error)?;
        // The index as it is on disk, changed in memory only: never written back.
        let mut index = self.repo.index().map_err(git_error)?;
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .map_err(git_error)?;
        index.update_all(["*"], None).map_err(git_error)?;
        let tree = index.write_tree().map_err(git_error)?;
        let tree = self.repo.find_tree(tree).map_err(git_error)?;
        let parent = match self.repo.head() {
            Ok(head) => Some(head.peel_to_commit().map_err(git_error)?),
            Err(e) if e.code() == git2::ErrorCode::UnbornBranch => None,
            Err(e) => return Err(git_error(e)),
        };
        let time = parent
            .as_ref()
            .map_or(Time::new(0, 0), |commit| commit.committer().when());
        let author = match self.repo.signature() {
            Ok(configured) => Signature::new(
                &String::from_utf8_lossy(configured.name_bytes()),
                &String::from_utf8_lossy(configured.email_bytes()),
                &time,
            ),
            Err(_) => Signature::new("capstan", "capstan@localhost", &time),
        }
        .map_err(git_error)?;
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        let commit = self
            .repo
            .commit(None, &author, &author, WORK_TREE_SUBJECT, &tree, &parents)
            .map_err(git_error)?;
        let commit = self.repo.find_commit(commit).map_err(git_error)?;
        Ok(self.commit_info(&commit, &self.branch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::source::Auth;
    use capstan_testing::git::FleetRepo;
    use std::path::Path;

    fn open(repo: &FleetRepo) -> Source {
        let state = tempfile::tempdir().expect("state");
        Source::open(
            repo.path().to_str().expect("utf-8"),
            "main",
            Some(Path::new("fleet")),
            state.path(),
            Auth::None,
        )
        .expect("open")
    }

    fn files(source: &Source, sha: &str) -> Vec<(String, String)> {
        source
            .files_at(sha, &crate::sync::source::ReadBudget::COMMIT)
            .expect("files")
            .into_iter()
            .map(|file| {
                (
                    file.path,
                    String::from_utf8_lossy(&file.contents).into_owned(),
                )
            })
            .collect()
    }

    /// Everything on disk that says what the repository holds: every file under `.git`
    /// but the index's lock, with its contents.
    fn git_dir_state(repo: &FleetRepo) -> Vec<(String, Vec<u8>)> {
        fn walk(dir: &Path, root: &Path, found: &mut Vec<(String, Vec<u8>)>) {
            for entry in std::fs::read_dir(dir).expect("read_dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    walk(&path, root, found);
                } else {
                    let name = path
                        .strip_prefix(root)
                        .expect("inside")
                        .display()
                        .to_string();
                    found.push((name, std::fs::read(&path).expect("read")));
                }
            }
        }
        let root = repo.path().join(".git");
        let mut found = Vec::new();
        walk(&root, &root, &mut found);
        found.sort();
        found
    }

    #[test]
    fn the_work_tree_is_read_as_git_add_all_would_take_it() {
        let mut repo = FleetRepo::new();
        repo.commit(
            &[
                (".gitignore", Some("*.tmp\nfleet/ignored/\n")),
                ("fleet/kept.yaml", Some("kept: 1\n")),
                ("fleet/changed.yaml", Some("changed: 1\n")),
                ("fleet/deleted.yaml", Some("deleted: 1\n")),
                ("fleet/staged.yaml", Some("staged: 1\n")),
            ],
            "Initial fleet",
        );
        let write = |path: &str, text: &str| {
            let full = repo.path().join(path);
            std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
            std::fs::write(full, text).expect("write");
        };
        write("fleet/changed.yaml", "changed: 2\n");
        write("fleet/new/untracked.yaml", "untracked: 1\n");
        write("fleet/scratch.tmp", "ignored: 1\n");
        write("fleet/ignored/file.yaml", "ignored: 1\n");
        write("fleet/staged.yaml", "staged: 2\n");
        std::fs::remove_file(repo.path().join("fleet/deleted.yaml")).expect("rm");
        // Staged, then changed again: the work tree's version counts, as for `git add -A`.
        let mut index = repo.git.index().expect("index");
        index
            .add_path(Path::new("fleet/staged.yaml"))
            .expect("stage");
        index.write().expect("write index");
        write("fleet/staged.yaml", "staged: 3\n");
        let before = git_dir_state(&repo);

        let source = open(&repo);
        let head = source.resolve("HEAD").expect("HEAD");
        let work_tree = source.work_tree_commit().expect("the work tree");
        assert_eq!(work_tree.subject, WORK_TREE_SUBJECT);
        assert_ne!(work_tree.sha, head.sha);
        assert_eq!(
            files(&source, &work_tree.sha),
            [
                ("fleet/changed.yaml".to_string(), "changed: 2\n".to_string()),
                ("fleet/kept.yaml".to_string(), "kept: 1\n".to_string()),
                (
                    "fleet/new/untracked.yaml".to_string(),
                    "untracked: 1\n".to_string()
                ),
                ("fleet/staged.yaml".to_string(), "staged: 3\n".to_string()),
            ]
        );
        // Its parent is HEAD: the merge base with the branch is HEAD.
        let base = source.merge_base(&work_tree.sha, "main").expect("base");
        assert_eq!(base.sha, head.sha);
        // The same work tree is the same commit.
        let again = open(&repo).work_tree_commit().expect("again");
        assert_eq!(again.sha, work_tree.sha);
        // Nothing on disk changed: no object, ref or index entry was written.
        drop(source);
        assert!(
            git_dir_state(&repo) == before,
            "the git directory is untouched"
        );
        assert!(
            repo.git
                .find_commit(work_tree.sha.parse().expect("oid"))
                .is_err()
        );
    }

    #[test]
    fn a_repository_without_a_work_tree_has_none_to_plan() {
        let bare = FleetRepo::bare();
        bare.commit_files(
            "main",
            &[("fleet/a.yaml", capstan_testing::git::Entry::File("a: 1\n"))],
            "Initial fleet",
        );
        let state = tempfile::tempdir().expect("state");
        let source = Source::open(
            bare.path().to_str().expect("utf-8"),
            "main",
            Some(Path::new("fleet")),
            state.path(),
            Auth::None,
        )
        .expect("open");
        let error = source.work_tree_commit().expect_err("no work tree");
        assert!(matches!(error, SourceError::NoWorkTree { .. }), "{error}");
    }
}
