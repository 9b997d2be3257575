//! The ordered upgrade of Module kmm-demo/my-kmod (with a device plugin) as the upgrade
//! tests play it: its manifests, its step records, and the timeline of each node
//! ([`timeline`]). Used beside `mod common;`.
#![allow(dead_code)]

pub mod driver;
pub mod timeline;

use capstan_api::{HistoryRecord, RecordType};
use capstan::controllers::{self, Selection};
use kube::api::{Api, ListParams};

/// The Module's namespace.
pub const NS: &str = "kmm-demo";

/// The four steps of an upgrade, in order.
pub const STEPS: [&str; 4] = [
    "device-plugin-stopped",
    "old-module-unloaded",
    "new-module-loaded",
    "device-plugin-started",
];

/// Module kmm-demo/my-kmod at `version` (kernel module `my_kmod`), images and device
/// plugin at the same version.
pub fn module(version: &str) -> String {
    format!(
        r#"apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata:
  name: my-kmod
  namespace: kmm-demo
spec:
  selector:
    node-role.kubernetes.io/worker: ""
  moduleLoader:
    container:
      version: "{version}"
      modprobe:
        moduleName: my_kmod
      kernelMappings:
        - regexp: '^.+$'
          containerImage: "registry.example/org/my-kmod:{version}-${{KERNEL_FULL_VERSION}}"
  devicePlugin:
    container:
      image: "registry.example/org/my-kmod-device-plugin:{version}"
"#
    )
}

/// The offline plan of `head` (a revision of the repository at `repo`) against the commit
/// before it.
pub fn plan_of(repo: &std::path::Path, head: &str) -> capstan::sync::plan::Plan {
    use capstan::sync::plan::{self, PlanInput};
    use capstan::sync::source::{Auth, Source};
    let state = tempfile::tempdir().expect("tempdir");
    let source = Source::open(
        repo.to_str().expect("utf-8 path"),
        "main",
        None,
        state.path(),
        Auth::None,
    )
    .expect("source");
    let base = source.resolve(&format!("{head}~1")).expect("base");
    let head = source.resolve(head).expect("head");
    plan::offline(&PlanInput::read(&source, base, head, None).expect("plan input"))
}

/// The three workers at v1 under `maxNodesInFlight: 1`, with `extra` files beside them,
/// committed to `repo` as pull request #1; returns the commit's SHA.
pub fn commit_initial_fleet(
    repo: &mut crate::common::git::FleetRepo,
    extra: &[(&str, String)],
) -> String {
    let mut files: Vec<(String, String)> = vec![
        ("capstan.yaml".into(), "maxNodesInFlight: 1\n".into()),
        (
            "namespace.yaml".into(),
            crate::common::git::NAMESPACE.into(),
        ),
        ("module.yaml".into(), module("v1")),
    ];
    for node in ["worker-1", "worker-2", "worker-3"] {
        files.push((format!("nodes/{node}.yaml"), label(node, "v1")));
    }
    files.extend(
        extra
            .iter()
            .map(|(path, text)| (path.to_string(), text.clone())),
    );
    let changes: Vec<(&str, Option<&str>)> = files
        .iter()
        .map(|(path, text)| (path.as_str(), Some(text.as_str())))
        .collect();
    repo.commit(&changes, "Merge pull request #1 from fleet/initial")
}

/// The Node manifest that labels `node` for `version` of my-kmod.
pub fn label(node: &str, version: &str) -> String {
    crate::common::git::node_label(node, "my-kmod", version)
}

/// Every upgrade-step record.
pub async fn step_records_all(client: &kube::Client) -> Vec<HistoryRecord> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    api.list(&ListParams::default())
        .await
        .expect("records")
        .items
        .into_iter()
        .filter(|r| r.spec.type_ == RecordType::UpgradeStep)
        .collect()
}

/// The upgrade-step records of `node` towards `version`, oldest first.
pub async fn step_records(client: &kube::Client, node: &str, version: &str) -> Vec<HistoryRecord> {
    let mut records: Vec<HistoryRecord> = step_records_all(client)
        .await
        .into_iter()
        .filter(|r| {
            r.spec.node.as_deref() == Some(node) && r.spec.to_version.as_deref() == Some(version)
        })
        .collect();
    records.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    records
}

/// The steps of `records`, in their order.
pub fn steps(records: &[HistoryRecord]) -> Vec<String> {
    records.iter().filter_map(|r| r.spec.step.clone()).collect()
}

/// Waits until every Module is where the cluster's objects want it.
pub async fn converged(client: &kube::Client) {
    let selection = Selection::all();
    let deadline = tokio::time::Instant::now() + crate::common::DEADLINE;
    loop {
        let pending = controllers::converge::check(client, &selection)
            .await
            .expect("check");
        if pending.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged: {pending:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
