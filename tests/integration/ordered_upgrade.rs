//! An ordered upgrade end to end: Git commits that merge pull requests, the sync, and every
//! controller (Module -> NMC, NMC, device plugins, version labels) in process; on the
//! embedded cluster the simulated kubelet runs the real worker code.
//!
//! Three nodes run v1. Commit 2 bumps the Module to v2 (nothing moves on the nodes; a v2
//! device plugin appears). Commit 3 relabels worker-1, which goes through the four steps
//! while worker-2 and worker-3 stay untouched; commit 4 relabels both, which move one
//! after the other (`maxNodesInFlight: 1`). Every step's record names the commit and pull
//! request that asked for it, and the offline plan of each commit agrees with the sync.
//!
//! The scenario runs twice, side by side: with one long-running sync, and with a fresh
//! `capstan sync --once` process per commit (commit 4 then lands on a fleet in the middle
//! of its upgrade, Module at v2 and nodes on v1, taken by a process that saw none of it).
//! Both must end in the same cluster state and the same history.

use crate::common;
use crate::upgrade;

use std::collections::BTreeMap;

use capstan_api::HistoryRecord;
use common::git::FleetRepo;
use common::wait_until;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use upgrade::driver::{Capstan, Mode};
use upgrade::{NS, label, module, step_records, step_records_all, steps};

/// What a run of the scenario ends with, free of SHAs and times (which differ between
/// two repositories): each step record as (node, step, from, to, pull request, subject),
/// and each node's version labels and loaded version.
#[derive(Debug, PartialEq)]
struct Ending {
    history: Vec<(String, String, String, String, Option<u64>, String)>,
    nodes: BTreeMap<String, (BTreeMap<String, String>, Option<String>)>,
    daemon_sets: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_running_sync_and_a_process_per_commit_end_alike() {
    let (long, once) = tokio::join!(
        nodes_move_one_at_a_time_through_the_four_steps_of_their_commit(Mode::LongRunning),
        nodes_move_one_at_a_time_through_the_four_steps_of_their_commit(Mode::OncePerCommit),
    );
    assert_eq!(long, once);
}

/// The plan of head against the commit before it must accept head, as the sync does.
fn plan_accepts_head(repo: &std::path::Path) {
    let plan = upgrade::plan_of(repo, "main");
    assert!(
        plan.errors.is_empty(),
        "the plan rejects: {:?}",
        plan.errors
    );
}

async fn nodes_move_one_at_a_time_through_the_four_steps_of_their_commit(mode: Mode) -> Ending {
    let (cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();
    let nodes = ["worker-1", "worker-2", "worker-3"];
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let mut capstan = Capstan::new(mode, &client, &cluster.kubeconfig(), repo.path()).await;
    capstan.take_head().await;
    let timelines = upgrade::timeline::watch(&client, NS, "my_kmod");
    for node in nodes {
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, node)
                .await
                .as_deref(),
            Some("v1"),
            "{node}"
        );
    }

    // Commit 2: the Module at v2, version and images together. Nothing moves on the nodes;
    // the v2 device plugin appears beside v1's.
    repo.commit(
        &[("module.yaml", Some(&module("v2")))],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    plan_accepts_head(repo.path());
    capstan.take_head().await;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    wait_until("a v2 device-plugin DaemonSet beside v1's", || async {
        let names: Vec<String> = daemon_sets
            .list(&ListParams::default())
            .await
            .expect("daemon sets")
            .items
            .into_iter()
            .filter_map(|ds| ds.metadata.name)
            .collect();
        names.iter().any(|n| n.ends_with("-v2")) && names.iter().any(|n| n.ends_with("-v1"))
    })
    .await;
    for node in nodes {
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, node)
                .await
                .as_deref(),
            Some("v1"),
            "{node} is untouched"
        );
        assert!(step_records(&client, node, "v2").await.is_empty(), "{node}");
    }

    // Commit 3: worker-1 moves to v2, through the four steps in order.
    let sha3 = repo.commit(
        &[("nodes/worker-1.yaml", Some(&label("worker-1", "v2")))],
        "Merge pull request #3 from fleet/worker-1-v2",
    );
    plan_accepts_head(repo.path());
    capstan.take_head().await;
    assert_eq!(
        upgrade::loaded_version(&cluster, &client, "worker-1")
            .await
            .as_deref(),
        Some("v2")
    );
    for node in ["worker-2", "worker-3"] {
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, node)
                .await
                .as_deref(),
            Some("v1"),
            "{node} waits"
        );
        assert!(step_records(&client, node, "v2").await.is_empty(), "{node}");
    }
    let records = step_records(&client, "worker-1", "v2").await;
    assert_eq!(
        steps(&records),
        [
            "device-plugin-stopped",
            "old-module-unloaded",
            "new-module-loaded",
            "device-plugin-started"
        ]
    );
    for record in &records {
        assert_eq!(record.spec.commit.sha, sha3, "{record:?}");
        assert_eq!(record.spec.commit.pull_request, Some(3));
        assert_eq!(record.spec.from_version.as_deref(), Some("v1"));
        assert_eq!(record.spec.module.as_deref(), Some("kmm-demo/my-kmod"));
    }
    // From the cluster's own order of writes: v1, then nothing, then v2 (never two
    // versions), and no device plugin while the module is not loaded.
    wait_until("the timeline has seen v2 loaded", || async {
        timelines.has_loaded("worker-1", "v2")
    })
    .await;
    let replay = timelines.replay("worker-1");
    assert_eq!(
        replay.versions,
        [Some("v1".to_string()), None, Some("v2".to_string())]
    );
    assert!(replay.violations.is_empty(), "{:?}", replay.violations);

    // Commit 4: worker-2 and worker-3 in one commit move strictly one after the other.
    let sha4 = repo.commit(
        &[
            ("nodes/worker-2.yaml", Some(&label("worker-2", "v2"))),
            ("nodes/worker-3.yaml", Some(&label("worker-3", "v2"))),
        ],
        "Merge pull request #4 from fleet/rest-v2",
    );
    plan_accepts_head(repo.path());
    capstan.take_head().await;
    let second = step_records(&client, "worker-2", "v2").await;
    let third = step_records(&client, "worker-3", "v2").await;
    for records in [&second, &third] {
        assert_eq!(records.len(), 4, "{records:?}");
        for record in records.iter() {
            assert_eq!(record.spec.commit.sha, sha4);
            assert_eq!(record.spec.commit.pull_request, Some(4));
        }
    }
    let last_of_second = &second[3].spec.time;
    let first_of_third = &third[0].spec.time;
    assert!(
        last_of_second <= first_of_third,
        "worker-3 started ({first_of_third}) before worker-2 finished ({last_of_second})"
    );
    for node in nodes {
        assert_eq!(
            upgrade::loaded_version(&cluster, &client, node)
                .await
                .as_deref(),
            Some("v2"),
            "{node}"
        );
    }
    wait_until("the v1 device plugin is gone", || async {
        !daemon_sets
            .list(&ListParams::default())
            .await
            .expect("daemon sets")
            .items
            .iter()
            .any(|ds| {
                ds.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-v1"))
            })
    })
    .await;
    capstan.stop().await;
    ending(&cluster, &client).await
}

async fn ending(cluster: &common::TestCluster, client: &kube::Client) -> Ending {
    let mut records: Vec<HistoryRecord> = step_records_all(client).await;
    records.sort_by(|a, b| (&a.spec.node, &a.spec.time).cmp(&(&b.spec.node, &b.spec.time)));
    let history = records
        .into_iter()
        .map(|r| {
            let spec = r.spec;
            (
                spec.node.unwrap_or_default(),
                spec.step.unwrap_or_default(),
                spec.from_version.unwrap_or_default(),
                spec.to_version.unwrap_or_default(),
                spec.commit.pull_request,
                spec.commit.subject,
            )
        })
        .collect();
    let mut nodes = BTreeMap::new();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("nodes")
        .items
    {
        let name = node.metadata.name.unwrap_or_default();
        let labels = node
            .metadata
            .labels
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| key.contains("kmm.node.kubernetes.io"))
            .collect();
        let loaded = upgrade::loaded_version(cluster, client, &name).await;
        nodes.insert(name, (labels, loaded));
    }
    let mut daemon_sets: Vec<String> = Api::<DaemonSet>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .expect("daemon sets")
        .items
        .into_iter()
        .filter_map(|ds| ds.metadata.name)
        .collect();
    daemon_sets.sort();
    Ending {
        history,
        nodes,
        daemon_sets,
    }
}
