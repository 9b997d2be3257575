//! Real Git repositories made in tests with git2, in temporary directories: a fleet
//! repository whose branch grows from its work tree as an operator's would, commits of
//! exact trees (symlinks included) on any branch, merges, branches, packed refs, and bare
//! repositories standing for remotes. Every commit is Ada Lovelace's.

use std::path::{Path, PathBuf};

use git2::{
    Index, IndexAddOption, IndexEntry, IndexTime, Oid, Repository, RepositoryInitOptions, Signature,
};
use tempfile::TempDir;

/// What a path in a commit of an exact tree holds.
#[derive(Clone, Copy, Debug)]
pub enum Entry<'a> {
    File(&'a str),
    Link(&'a str),
}

/// `files` (path, text) as the entries of a tree.
pub fn tree<'a>(files: &'a [(&'a str, String)]) -> Vec<(&'a str, Entry<'a>)> {
    files
        .iter()
        .map(|(path, text)| (*path, Entry::File(text)))
        .collect()
}

/// `files` with some replaced (`Some`) or removed (`None`); a replaced file moves to the end.
pub fn with_changes<'a>(
    files: &[(&'a str, String)],
    changes: &[(&'a str, Option<String>)],
) -> Vec<(&'a str, String)> {
    let mut files = files.to_vec();
    for (path, contents) in changes {
        files.retain(|(p, _)| p != path);
        if let Some(contents) = contents {
            files.push((path, contents.clone()));
        }
    }
    files
}

/// A repository in a temporary directory whose default branch is `main`.
pub struct FleetRepo {
    dir: TempDir,
    /// The repository itself, for what a test does with git2 directly (tags, remote-tracking
    /// refs, a detached HEAD).
    pub git: Repository,
}

impl Default for FleetRepo {
    fn default() -> FleetRepo {
        FleetRepo::new()
    }
}

impl FleetRepo {
    /// A repository with a work tree, HEAD on `main`.
    pub fn new() -> FleetRepo {
        FleetRepo::init(RepositoryInitOptions::new().initial_head("main"))
    }

    /// A bare repository, HEAD on `main`, standing for a remote.
    pub fn bare() -> FleetRepo {
        FleetRepo::init(RepositoryInitOptions::new().bare(true).initial_head("main"))
    }

    /// A pull request checked out: `main` holds `base` ("Initial fleet"), branch `feature`
    /// from it holds `head` ("Move workers to my-kmod v2"), and HEAD is on `feature`.
    pub fn proposal(base: &[(&str, String)], head: &[(&str, String)]) -> FleetRepo {
        let repo = FleetRepo::new();
        let fork = repo.commit_files("main", &tree(base), "Initial fleet");
        repo.branch("feature", fork);
        repo.commit_files("feature", &tree(head), "Move workers to my-kmod v2");
        repo.checkout("feature");
        repo
    }

    fn init(options: &RepositoryInitOptions) -> FleetRepo {
        let dir = tempfile::tempdir().expect("tempdir");
        let git = Repository::init_opts(dir.path(), options).expect("init");
        FleetRepo { dir, git }
    }

    /// Keeps the repository on disk after this value is gone, and returns where: for a
    /// process that only prepares repositories for another.
    pub fn keep(self) -> PathBuf {
        self.dir.keep()
    }

    /// The work tree, or the repository itself when bare.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sets (or with `None` removes) files in the work tree, then commits the whole work
    /// tree on the checked-out branch; returns the SHA. With no changes it commits the work
    /// tree as it is. Not for a bare repository.
    pub fn commit(&mut self, changes: &[(&str, Option<&str>)], message: &str) -> String {
        for (path, contents) in changes {
            let full = self.dir.path().join(path);
            match contents {
                Some(text) => {
                    std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
                    std::fs::write(&full, text).expect("write");
                }
                None => {
                    let _ = std::fs::remove_file(&full);
                }
            }
        }
        let mut index = self.git.index().expect("index");
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .expect("add");
        index.update_all(["*"], None).expect("update");
        index.write().expect("write index");
        let tree = index.write_tree().expect("tree");
        let parents: Vec<Oid> = self.git.refname_to_id("HEAD").into_iter().collect();
        self.commit_tree("HEAD", tree, message, &parents)
            .to_string()
    }

    /// Sets every file of `files` (path, text) in the work tree and commits it, as
    /// [`FleetRepo::commit`] does; returns the SHA.
    pub fn commit_set<P: AsRef<str>, T: AsRef<str>>(
        &mut self,
        files: &[(P, T)],
        message: &str,
    ) -> String {
        let changes: Vec<(&str, Option<&str>)> = files
            .iter()
            .map(|(path, text)| (path.as_ref(), Some(text.as_ref())))
            .collect();
        self.commit(&changes, message)
    }

    /// Commits exactly `entries` as the whole tree of `branch`, on top of its tip (a new
    /// branch starts a history of its own); the work tree is left alone.
    pub fn commit_files(&self, branch: &str, entries: &[(&str, Entry)], message: &str) -> Oid {
        let refname = format!("refs/heads/{branch}");
        let parents: Vec<Oid> = self.git.refname_to_id(&refname).into_iter().collect();
        self.commit_tree(&refname, self.write_tree(entries), message, &parents)
    }

    /// Commits on `branch` a tree whose folder `folder` holds one blob, `contents`, fanned
    /// out: `width` folders of `width` folders, `depth` levels deep, each last folder holding
    /// it under every name of `leaves`. A commit of a few kilobytes then names
    /// `width^depth * leaves.len()` files, as a hostile pull request can.
    pub fn commit_fan_out(
        &self,
        branch: &str,
        folder: &str,
        contents: &[u8],
        (width, depth): (usize, usize),
        leaves: &[&str],
        message: &str,
    ) -> Oid {
        let git = &self.git;
        let blob = git.blob(contents).expect("blob");
        let mut leaf = git.treebuilder(None).expect("tree builder");
        for name in leaves {
            leaf.insert(name, blob, 0o100644).expect("insert");
        }
        let mut tree = leaf.write().expect("leaf tree");
        for _ in 0..depth {
            let mut level = git.treebuilder(None).expect("tree builder");
            for i in 0..width {
                level
                    .insert(format!("d{i}"), tree, 0o040000)
                    .expect("insert");
            }
            tree = level.write().expect("tree");
        }
        let mut root = git.treebuilder(None).expect("tree builder");
        root.insert(folder, tree, 0o040000).expect("insert");
        let root = root.write().expect("root tree");
        let refname = format!("refs/heads/{branch}");
        let parents: Vec<Oid> = git.refname_to_id(&refname).into_iter().collect();
        self.commit_tree(&refname, root, message, &parents)
    }

    /// A merge commit of `from` into `into` whose tree is exactly `entries`.
    pub fn merge(&self, into: &str, from: &str, entries: &[(&str, Entry)], message: &str) -> Oid {
        let refname = format!("refs/heads/{into}");
        let parents = [
            self.git.refname_to_id(&refname).expect("into"),
            self.git
                .refname_to_id(&format!("refs/heads/{from}"))
                .expect("from"),
        ];
        self.commit_tree(&refname, self.write_tree(entries), message, &parents)
    }

    /// Creates (or moves) `branch` at the commit `at`.
    pub fn branch(&self, branch: &str, at: Oid) {
        self.git
            .reference(&format!("refs/heads/{branch}"), at, true, "branch")
            .expect("branch");
    }

    /// Checks `branch` out: HEAD only, as plans and syncs read commits, not the work tree.
    pub fn checkout(&self, branch: &str) {
        self.git
            .set_head(&format!("refs/heads/{branch}"))
            .expect("checkout");
    }

    /// Moves `refs` into packed-refs as `git pack-refs --all` does: write packed-refs, then
    /// remove the loose files.
    pub fn pack_refs(&self, refs: &[(&str, Oid)]) {
        let mut text = String::from("# pack-refs with: peeled fully-peeled sorted \n");
        let mut refs = refs.to_vec();
        refs.sort();
        for (name, id) in &refs {
            text.push_str(&format!("{id} {name}\n"));
        }
        let lock = self.git.path().join("packed-refs.lock");
        std::fs::write(&lock, text).expect("write packed-refs.lock");
        std::fs::rename(&lock, self.git.path().join("packed-refs")).expect("rename packed-refs");
        for (name, _) in &refs {
            let _ = std::fs::remove_file(self.git.path().join(name));
        }
    }

    fn write_tree(&self, entries: &[(&str, Entry)]) -> Oid {
        let mut index = Index::new().expect("index");
        for (path, entry) in entries {
            let (mode, data) = match entry {
                Entry::File(text) => (0o100644, text.as_bytes()),
                Entry::Link(target) => (0o120000, target.as_bytes()),
            };
            let blob = self.git.blob(data).expect("blob");
            index.add(&index_entry(path, mode, blob)).expect("add");
        }
        index.write_tree_to(&self.git).expect("tree")
    }

    fn commit_tree(&self, refname: &str, tree: Oid, message: &str, parents: &[Oid]) -> Oid {
        let tree = self.git.find_tree(tree).expect("find tree");
        let signature = Signature::now("Ada Lovelace", "ada@example.com").expect("signature");
        let parents: Vec<_> = parents
            .iter()
            .map(|id| self.git.find_commit(*id).expect("parent"))
            .collect();
        let parents: Vec<_> = parents.iter().collect();
        self.git
            .commit(
                Some(refname),
                &signature,
                &signature,
                message,
                &tree,
                &parents,
            )
            .expect("commit")
    }
}

fn index_entry(path: &str, mode: u32, id: Oid) -> IndexEntry {
    IndexEntry {
        ctime: IndexTime::new(0, 0),
        mtime: IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode,
        uid: 0,
        gid: 0,
        file_size: 0,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}
