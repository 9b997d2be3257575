//! Real Git repositories for tests, built with git2 in temporary directories.

use git2::{Index, IndexEntry, IndexTime, Oid, Repository, RepositoryInitOptions, Signature};
use tempfile::TempDir;

/// What a path in a test commit holds.
pub enum Entry<'a> {
    File(&'a str),
    Link(&'a str),
}

/// A repository with a work tree whose HEAD is `main`.
pub fn init_repo() -> (TempDir, Repository) {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repository::init_opts(
        dir.path(),
        RepositoryInitOptions::new().initial_head("main"),
    )
    .expect("init");
    (dir, repo)
}

/// A bare repository with HEAD `main`, standing for a remote.
pub fn init_bare() -> (TempDir, Repository) {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = Repository::init_opts(
        dir.path(),
        RepositoryInitOptions::new().bare(true).initial_head("main"),
    )
    .expect("init bare");
    (dir, repo)
}

/// Commits exactly `entries` as the whole tree on `branch` (created if missing) on top of it.
pub fn commit_files(
    repo: &Repository,
    branch: &str,
    entries: &[(&str, Entry)],
    message: &str,
) -> Oid {
    let refname = format!("refs/heads/{branch}");
    let parents: Vec<Oid> = repo.refname_to_id(&refname).into_iter().collect();
    commit_tree(repo, &refname, entries, message, &parents)
}

/// A merge commit on `into` of `from`, whose tree is `entries`.
pub fn merge(
    repo: &Repository,
    into: &str,
    from: &str,
    entries: &[(&str, Entry)],
    message: &str,
) -> Oid {
    let refname = format!("refs/heads/{into}");
    let parents = [
        repo.refname_to_id(&refname).expect("into"),
        repo.refname_to_id(&format!("refs/heads/{from}"))
            .expect("from"),
    ];
    commit_tree(repo, &refname, entries, message, &parents)
}

/// Creates `branch` at the commit `at`.
pub fn branch_at(repo: &Repository, branch: &str, at: Oid) {
    repo.reference(&format!("refs/heads/{branch}"), at, true, "branch")
        .expect("branch");
}

fn commit_tree(
    repo: &Repository,
    refname: &str,
    entries: &[(&str, Entry)],
    message: &str,
    parents: &[Oid],
) -> Oid {
    let mut index = Index::new().expect("index");
    for (path, entry) in entries {
        let (mode, data) = match entry {
            Entry::File(text) => (0o100644, text.as_bytes()),
            Entry::Link(target) => (0o120000, target.as_bytes()),
        };
        let blob = repo.blob(data).expect("blob");
        index.add(&index_entry(path, mode, blob)).expect("add");
    }
    let tree = repo
        .find_tree(index.write_tree_to(repo).expect("tree"))
        .expect("find tree");
    let signature = Signature::now("Ada Lovelace", "ada@example.com").expect("signature");
    let parents: Vec<_> = parents
        .iter()
        .map(|id| repo.find_commit(*id).expect("parent"))
        .collect();
    let parents: Vec<_> = parents.iter().collect();
    repo.commit(
        Some(refname),
        &signature,
        &signature,
        message,
        &tree,
        &parents,
    )
    .expect("commit")
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

/// Moves `refs` into packed-refs as `git pack-refs --all` does: write packed-refs, then
/// remove the loose files.
pub fn pack_refs(repo: &Repository, refs: &[(&str, Oid)]) {
    let mut text = String::from("# pack-refs with: peeled fully-peeled sorted \n");
    let mut refs = refs.to_vec();
    refs.sort();
    for (name, id) in &refs {
        text.push_str(&format!("{id} {name}\n"));
    }
    let lock = repo.path().join("packed-refs.lock");
    std::fs::write(&lock, text).expect("write packed-refs.lock");
    std::fs::rename(&lock, repo.path().join("packed-refs")).expect("rename packed-refs");
    for (name, _) in &refs {
        let _ = std::fs::remove_file(repo.path().join(name));
    }
}
