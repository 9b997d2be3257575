//! The ordered upgrade of Module kmm-demo/my-kmod (with a device plugin) as the upgrade
//! tests play it: its manifests, its step records, and the timeline of each node
//! ([`timeline`]). Used beside `mod common;`.
#![allow(dead_code)]

pub mod driver;
pub mod timeline;

use capstan::controllers::{self, Selection};
use capstan_api::labels::{TO_VERSION_ANNOTATION, UPGRADE_ANNOTATION_PREFIX};
use capstan_api::upgrade_config::UpgradePhase;
use capstan_api::{HistoryRecord, RecordType, UpgradeConfig};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::ResourceExt as _;
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

/// A node's records under an UpgradeConfig campaign: its drain around the four steps.
pub const DRAINED_STEPS: [&str; 7] = [
    "cordoned",
    "drained",
    "device-plugin-stopped",
    "old-module-unloaded",
    "new-module-loaded",
    "device-plugin-started",
    "uncordoned",
];

/// Module kmm-demo/my-kmod at `version` (kernel module `my_kmod`), images and device
/// plugin at the same version.
pub fn module(version: &str) -> String {
    crate::common::manifests::module_with_device_plugin("my-kmod", version)
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
            crate::common::manifests::NAMESPACE.into(),
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
    repo.commit_set(&files, "Merge pull request #1 from fleet/initial")
}

/// The Node manifest that labels `node` for `version` of my-kmod.
pub fn label(node: &str, version: &str) -> String {
    crate::common::manifests::node_label(node, "my-kmod", version)
}

/// Every history record, in the order the cluster lists them.
pub async fn records(client: &kube::Client) -> Vec<HistoryRecord> {
    let api: Api<HistoryRecord> = Api::namespaced(client.clone(), "capstan-system");
    api.list(&ListParams::default())
        .await
        .expect("records")
        .items
}

/// Every upgrade-step record.
pub async fn step_records_all(client: &kube::Client) -> Vec<HistoryRecord> {
    records(client)
        .await
        .into_iter()
        .filter(|r| r.spec.type_ == RecordType::UpgradeStep)
        .collect()
}

/// The campaign `my-kmod-v2` (in [`NS`]) rolling out v2, due at `upgrade_at` (RFC 3339).
pub fn campaign(upgrade_at: &str) -> String {
    format!(
        "apiVersion: upgrade.managed.openshift.io/v1alpha1\nkind: UpgradeConfig\n\
         metadata: {{name: my-kmod-v2, namespace: {NS}}}\nspec:\n  type: OSD\n  \
         upgradeAt: \"{upgrade_at}\"\n  PDBForceDrainTimeout: 0\n  desired: {{version: v2}}\n"
    )
}

/// The phase of [`campaign`]'s history entry for v2.
pub async fn campaign_phase(client: &kube::Client) -> Option<UpgradePhase> {
    let configs: Api<UpgradeConfig> = Api::namespaced(client.clone(), NS);
    let config = configs.get_opt("my-kmod-v2").await.expect("campaign")?;
    config
        .status
        .as_ref()
        .and_then(|status| status.history_for("v2"))
        .map(|entry| entry.phase)
}

/// The drain and step records of `node` towards v2, oldest first.
pub async fn node_history(client: &kube::Client, node: &str) -> Vec<HistoryRecord> {
    let mut of_node: Vec<HistoryRecord> = records(client)
        .await
        .into_iter()
        .filter(|r| matches!(r.spec.type_, RecordType::Drain | RecordType::UpgradeStep))
        .filter(|r| r.spec.node.as_deref() == Some(node))
        .filter(|r| r.spec.to_version.as_deref() == Some("v2"))
        .collect();
    of_node.sort_by(|a, b| a.spec.time.cmp(&b.spec.time));
    of_node
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

/// How many of `events` are about `node`'s move to `version` for `reason`
/// (`OldModuleUnloaded`, ...).
pub fn step_events(events: &[Event], node: &str, reason: &str, version: &str) -> usize {
    events
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(node)
                && e.reason.as_deref() == Some(reason)
                && e.annotations()
                    .get(TO_VERSION_ANNOTATION)
                    .map(String::as_str)
                    == Some(version)
        })
        .count()
}

/// The steps of `records`, in their order.
pub fn steps(records: &[HistoryRecord]) -> Vec<String> {
    records.iter().filter_map(|r| r.spec.step.clone()).collect()
}

/// `Ok` when every Module has converged and no node is in an upgrade; else what is still
/// pending.
pub async fn at_rest(client: &kube::Client) -> Result<(), String> {
    let pending =
        controllers::converge::check(client, &Selection::all(), &capstan_api::clock::SystemClock)
            .await
            .map_err(|err| err.to_string())?;
    if !pending.is_empty() {
        return Err(format!("not converged: {pending:?}"));
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|err| err.to_string())?;
    let upgrading: Vec<String> = nodes
        .items
        .iter()
        .filter(|node| {
            node.annotations()
                .keys()
                .any(|key| key.starts_with(UPGRADE_ANNOTATION_PREFIX))
        })
        .map(|node| node.name_any())
        .collect();
    if upgrading.is_empty() {
        Ok(())
    } else {
        Err(format!("nodes in an upgrade: {upgrading:?}"))
    }
}

/// Waits until every Module is where the cluster's objects want it.
pub async fn converged(client: &kube::Client) {
    let selection = Selection::all();
    crate::common::wait_for("every Module to converge", async || {
        let pending =
            controllers::converge::check(client, &selection, &capstan_api::clock::SystemClock)
                .await
                .expect("check");
        if pending.is_empty() {
            Ok(())
        } else {
            Err(pending)
        }
    })
    .await
}

/// The version of kmm-demo/my-kmod loaded on `node`: the simulated kernel's on the
/// embedded cluster; on a real server, where worker pods run no code, the version its
/// NodeModulesConfig status says is loaded.
pub async fn loaded_version(
    cluster: &crate::common::TestCluster,
    client: &kube::Client,
    node: &str,
) -> Option<String> {
    if let Some(sim) = cluster.simulation() {
        return sim
            .node(node)
            .ok()
            .and_then(|state| state.modules.get("my_kmod").cloned())
            .and_then(|module| module.version);
    }
    let nmcs: Api<capstan_api::nmc::NodeModulesConfig> = Api::all(client.clone());
    let nmc = nmcs
        .get_opt(node)
        .await
        .expect("read the NodeModulesConfig")?;
    let key = capstan_api::labels::ModuleKey::new(NS, "my-kmod").expect("module key");
    nmc.status_module(&key)
        .map(|status| status.version.clone())
        .filter(|version| !version.is_empty())
}
