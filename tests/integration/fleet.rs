//! Fleet repositories for command-line tests: real Git repositories made with git2, and
//! the manifests of an ordered upgrade of the Module kmm-demo/my-kmod from v1 to v2.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use git2::{Index, IndexEntry, IndexTime, Oid, Repository, RepositoryInitOptions, Signature};
use tempfile::TempDir;

/// The version label of my-kmod.
pub const VERSION_LABEL: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";

/// A repository with a work tree whose HEAD is `main`.
pub struct Fleet {
    pub dir: TempDir,
    pub repo: Repository,
}

impl Fleet {
    pub fn new() -> Fleet {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init_opts(
            dir.path(),
            RepositoryInitOptions::new().initial_head("main"),
        )
        .expect("init");
        Fleet { dir, repo }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Commits exactly `files` as the tree of `branch`, on top of its tip (or of `main`'s
    /// for a new branch).
    pub fn commit(&self, branch: &str, files: &[(&str, String)], message: &str) -> Oid {
        let refname = format!("refs/heads/{branch}");
        let parent = self
            .repo
            .refname_to_id(&refname)
            .or_else(|_| self.repo.refname_to_id("refs/heads/main"))
            .ok();
        let mut index = Index::new().expect("index");
        for (path, text) in files {
            let blob = self.repo.blob(text.as_bytes()).expect("blob");
            index.add(&entry(path, blob)).expect("add");
        }
        let tree = self
            .repo
            .find_tree(index.write_tree_to(&self.repo).expect("tree"))
            .expect("find tree");
        let signature = Signature::now("Ada Lovelace", "ada@example.com").expect("signature");
        let parents: Vec<_> = parent
            .iter()
            .map(|id| self.repo.find_commit(*id).expect("parent"))
            .collect();
        let parents: Vec<_> = parents.iter().collect();
        self.repo
            .commit(
                Some(&refname),
                &signature,
                &signature,
                message,
                &tree,
                &parents,
            )
            .expect("commit")
    }

    /// Checks `branch` out (HEAD only; plans read commits, not the work tree).
    pub fn checkout(&self, branch: &str) {
        self.repo
            .set_head(&format!("refs/heads/{branch}"))
            .expect("checkout");
    }

    /// `main` with `base`, then `feature` with `head` checked out.
    pub fn proposal(base: &[(&str, String)], head: &[(&str, String)]) -> Fleet {
        let fleet = Fleet::new();
        fleet.commit("main", base, "Initial fleet");
        fleet.commit("feature", head, "Move worker-1 to my-kmod v2");
        fleet.checkout("feature");
        fleet
    }
}

fn entry(path: &str, id: Oid) -> IndexEntry {
    IndexEntry {
        ctime: IndexTime::new(0, 0),
        mtime: IndexTime::new(0, 0),
        dev: 0,
        ino: 0,
        mode: 0o100644,
        uid: 0,
        gid: 0,
        file_size: 0,
        id,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// The Module at `version`, its kmod image tagged with the version.
pub fn module(version: &str) -> String {
    format!(
        "apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-demo
spec:
  selector:
    node-role.kubernetes.io/worker: \"\"
  moduleLoader:
    container:
      version: {version}
      modprobe:
        moduleName: my_kmod
      kernelMappings:
        - regexp: '^.+$'
          containerImage: registry.example/org/my-kmod:{version}-${{KERNEL_FULL_VERSION}}
"
    )
}

/// A Node manifest declaring my-kmod's version label.
pub fn node(name: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels:\n    {VERSION_LABEL}: {version}\n"
    )
}

/// my-kmod v1 on worker-1 and worker-2, in its namespace, with a ConfigMap.
pub fn fleet_v1() -> Vec<(&'static str, String)> {
    vec![
        (
            "fleet/namespace.yaml",
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kmm-demo\n".to_string(),
        ),
        ("fleet/modules/my-kmod.yaml", module("v1")),
        ("fleet/nodes/worker-1.yaml", node("worker-1", "v1")),
        ("fleet/nodes/worker-2.yaml", node("worker-2", "v1")),
        (
            "fleet/settings.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n  namespace: kmm-demo\ndata:\n  level: \"1\"\n"
                .to_string(),
        ),
    ]
}

/// `files` with some replaced (`Some`) or removed (`None`).
pub fn with(
    files: &[(&'static str, String)],
    changes: &[(&'static str, Option<String>)],
) -> Vec<(&'static str, String)> {
    let mut files = files.to_vec();
    for (path, contents) in changes {
        files.retain(|(p, _)| p != path);
        if let Some(contents) = contents {
            files.push((path, contents.clone()));
        }
    }
    files
}

/// my-kmod v2 with worker-1 moved to it; worker-2 stays on v1 for now.
pub fn fleet_v2() -> Vec<(&'static str, String)> {
    with(
        &fleet_v1(),
        &[
            ("fleet/modules/my-kmod.yaml", Some(module("v2"))),
            ("fleet/nodes/worker-1.yaml", Some(node("worker-1", "v2"))),
        ],
    )
}

/// Runs `capstan` with `args` in `dir`.
pub fn capstan(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_capstan"))
        .current_dir(dir)
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("run capstan")
}

/// Stdout of a run, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}
