//! Real Git repositories made in tests: a work tree on branch `main` whose commits replace
//! the whole tree, as a fleet repository's history would.

use std::collections::BTreeMap;
use std::path::Path;

use git2::{IndexAddOption, Repository, RepositoryInitOptions, Signature};
use tempfile::TempDir;

/// A repository with a work tree whose HEAD is `main`.
pub struct FleetRepo {
    pub dir: TempDir,
    repo: Repository,
    files: BTreeMap<String, String>,
}

impl FleetRepo {
    pub fn new() -> FleetRepo {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Repository::init_opts(
            dir.path(),
            RepositoryInitOptions::new().initial_head("main"),
        )
        .expect("init");
        FleetRepo {
            dir,
            repo,
            files: BTreeMap::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Sets (or with `None` removes) files, then commits the whole tree; returns the SHA.
    pub fn commit(&mut self, changes: &[(&str, Option<&str>)], message: &str) -> String {
        for (path, contents) in changes {
            let full = self.dir.path().join(path);
            match contents {
                Some(text) => {
                    std::fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
                    std::fs::write(&full, text).expect("write");
                    self.files.insert(path.to_string(), text.to_string());
                }
                None => {
                    let _ = std::fs::remove_file(&full);
                    self.files.remove(*path);
                }
            }
        }
        let mut index = self.repo.index().expect("index");
        index
            .add_all(["*"], IndexAddOption::DEFAULT, None)
            .expect("add");
        index.update_all(["*"], None).expect("update");
        index.write().expect("write index");
        let tree = self
            .repo
            .find_tree(index.write_tree().expect("tree"))
            .expect("find tree");
        let signature = Signature::now("Fleet Operator", "ops@example.com").expect("signature");
        let parent = self
            .repo
            .head()
            .ok()
            .and_then(|head| head.peel_to_commit().ok());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        self.repo
            .commit(
                Some("HEAD"),
                &signature,
                &signature,
                message,
                &tree,
                &parents,
            )
            .expect("commit")
            .to_string()
    }
}

/// A Module of namespace `kmm-demo` named `name` at `version` (images carry the version).
pub fn module(name: &str, version: &str) -> String {
    format!(
        r#"apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: {name}
  namespace: kmm-demo
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  moduleLoader:
    container:
      version: "{version}"
      modprobe:
        moduleName: {module}
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "registry.example/org/{name}:{version}-${{KERNEL_FULL_VERSION}}"
"#,
        module = name.replace('-', "_")
    )
}

/// A version-label manifest: `node` may run `version` of Module `kmm-demo/<module>`.
pub fn node_label(node: &str, module: &str, version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels:\n    kmm.node.kubernetes.io/version-module.kmm-demo.{module}: \"{version}\"\n"
    )
}

/// A ConfigMap in `kmm-demo`.
pub fn config_map(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: kmm-demo\ndata:\n  value: \"{value}\"\n"
    )
}

pub const NAMESPACE: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: kmm-demo\n";
