//! `capstan sync` killed with SIGKILL in the middle of an ordered upgrade, and started
//! again: the upgrade completes with exactly one record and one Event per step.

use crate::common;
use crate::upgrade;

use std::process::{Child, Command, Stdio};

use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use upgrade::{converged, module, step_records};

/// `capstan sync` following `repo` into the cluster of `kubeconfig`.
fn capstan_sync(
    repo: &std::path::Path,
    kubeconfig: &std::path::Path,
    state: &std::path::Path,
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(["sync", "--repo"])
        .arg(repo)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--state-dir")
        .arg(state)
        .args(["--listen", "127.0.0.1:0", "--interval", "1s"])
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(state.with_extension("log"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .spawn()
        .expect("capstan sync starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_capstan_resumes_the_upgrade_at_the_right_step() {
    // Workers take a second, so the kill lands while worker-1's old module is unloading.
    let mut config = capstan_cluster::sim::config::ClusterConfig::default_cluster();
    config.timing.worker_seconds = 1.0;
    let (cluster, client) = common::start_simulated(config).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    capstan_cluster::kubeconfig::write(&kubeconfig, &cluster.kubeconfig()).expect("kubeconfig");
    let mut repo = FleetRepo::new();
    let first = upgrade::commit_initial_fleet(&mut repo, &[]);
    let state = dir.path().join("state");
    let mut capstan = capstan_sync(repo.path(), &kubeconfig, &state);
    let syncs: Api<capstan_api::GitSync> = Api::namespaced(client.clone(), "capstan-system");
    wait_until("the first commit is applied", || async {
        syncs.get("capstan").await.is_ok_and(|s| {
            s.status
                .and_then(|s| s.last_applied_commit)
                .is_some_and(|c| c.sha == first)
        })
    })
    .await;
    converged(&client).await;

    repo.commit(
        &[("module.yaml", Some(&module("v2")))],
        "Merge pull request #6 from fleet/my-kmod-v2",
    );
    wait_until("the bump is applied", || async {
        let modules: Api<capstan_api::Module> = Api::namespaced(client.clone(), "kmm-demo");
        modules
            .get("my-kmod")
            .await
            .is_ok_and(|m| m.version() == Some("v2"))
    })
    .await;
    let sha = repo.commit(
        &[(
            "nodes/worker-1.yaml",
            Some(&common::manifests::node_label("worker-1", "my-kmod", "v2")),
        )],
        "Merge pull request #7 from fleet/worker-1-v2",
    );
    // Kill it hard once the upgrade is under way and before it is done.
    wait_until("worker-1's upgrade is under way", || async {
        !step_records(&client, "worker-1", "v2").await.is_empty()
    })
    .await;
    capstan.kill().expect("SIGKILL");
    capstan.wait().expect("reaped");
    let steps_before_kill = step_records(&client, "worker-1", "v2").await.len();

    let mut capstan = capstan_sync(repo.path(), &kubeconfig, &state);
    wait_until("worker-1's upgrade completes", || async {
        step_records(&client, "worker-1", "v2").await.len() >= 4
    })
    .await;
    converged(&client).await;
    let _ = capstan.kill();
    let _ = capstan.wait();

    let records = step_records(&client, "worker-1", "v2").await;
    let mut steps: Vec<(String, String)> = records
        .iter()
        .map(|r| (r.spec.time.clone(), r.spec.step.clone().unwrap_or_default()))
        .collect();
    steps.sort();
    let steps: Vec<&str> = steps.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        steps,
        [
            "device-plugin-stopped",
            "old-module-unloaded",
            "new-module-loaded",
            "device-plugin-started",
        ],
        "every step once, in order"
    );
    assert!(
        steps_before_kill < 4,
        "the kill came after the upgrade ({steps_before_kill} steps already recorded)"
    );
    for record in &records {
        assert_eq!(record.spec.commit.sha, sha);
        assert_eq!(record.spec.commit.pull_request, Some(7));
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let events = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items;
    // The kill may fall between the last record before it and that record's Event: that
    // Event may be missing (the new process finds the record written and moves on), never
    // doubled; every other step has its one Event.
    for (index, step) in steps.iter().enumerate() {
        let reason = match *step {
            "device-plugin-stopped" => "DevicePluginStopped",
            "old-module-unloaded" => "OldModuleUnloaded",
            "new-module-loaded" => "NewModuleLoaded",
            _ => "DevicePluginStarted",
        };
        let count = upgrade::step_events(&events, "worker-1", reason, "v2");
        if index + 1 == steps_before_kill {
            assert!(count <= 1, "{count} {reason} Events on worker-1");
        } else {
            assert_eq!(count, 1, "{reason} Events on worker-1");
        }
    }
}
