//! The ordered upgrade on an unreliable API server: the embedded cluster fails a share of
//! writes with 500 and 409 and cuts watch streams (`--faults`, src/cluster/faults.rs). The
//! sync and every controller retry until the upgrade is done, and the history they leave
//! is the one they leave without faults: the same steps of the same nodes, against the
//! same commits and pull requests, one record each. `CAPSTAN_FAULT_SEED=N` replays seed N
//! alone.

use crate::common;
use crate::upgrade;

use std::collections::BTreeMap;

use capstan::controllers::{self, Context, Selection};
use capstan::sync::run::{Outcome, Syncer};
use capstan_cluster::ClusterOptions;
use capstan_cluster::faults::FaultSettings;
use capstan_cluster::sim::config::ClusterConfig;
use common::git::FleetRepo;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use upgrade::{NS, label, module};

const NODES: [&str; 3] = ["worker-1", "worker-2", "worker-3"];
const SEED_VAR: &str = "CAPSTAN_FAULT_SEED";
/// The fault seeds CI plays.
const CI_SEEDS: [u64; 2] = [1, 2];

/// One step record: node, step, from, to, the commit's place in the scenario (0 for the
/// first commit), its pull request.
type Step = (
    String,
    String,
    Option<String>,
    Option<String>,
    usize,
    Option<u64>,
);

/// The files a commit sets.
type Changes<'a> = Vec<(&'a str, Option<&'a str>)>;

fn faults(seed: u64) -> FaultSettings {
    FaultSettings::parse(&format!(
        "seed={seed},errors=0.1,conflicts=0.1,watch-drops=0.1"
    ))
    .expect("fault settings")
}

/// A syncer of `repo`, started again while the cluster fails its first writes.
async fn start_syncer(client: &kube::Client, repo: &std::path::Path) -> Syncer {
    let state = tempfile::tempdir().expect("tempdir");
    common::wait_for("the syncer to start", async || {
        let source = capstan::sync::source::Source::open(
            repo.to_str().expect("utf-8 path"),
            "main",
            None,
            state.path(),
            capstan::sync::source::Auth::None,
        )
        .expect("source opens");
        Syncer::start(
            client.clone(),
            source,
            capstan::sync::run::SyncOptions::default(),
            std::sync::Arc::new(capstan::sync::metrics::Metrics::new()),
        )
        .await
        .map_err(|err| err.to_string())
    })
    .await
}

/// Syncs until `sha` is the applied commit, as `capstan sync` does on its interval.
async fn sync_until_applied(syncer: &mut Syncer, client: &kube::Client, sha: &str) {
    let syncs: Api<capstan_api::GitSync> = Api::namespaced(client.clone(), "capstan-system");
    let mut failures = Vec::new();
    common::wait_for(&format!("{sha} to be applied"), async || {
        match syncer.sync().await {
            // A failed write is no reason to reject a commit: capstan would not try it again.
            Ok(Outcome::Rejected { errors, .. }) => panic!("{sha} rejected: {errors:#?}"),
            Ok(_) => {}
            Err(err) => failures.push(err.to_string()),
        }
        let applied = syncs
            .get_opt("capstan")
            .await
            .ok()
            .flatten()
            .and_then(|s| s.status)
            .and_then(|s| s.last_applied_commit)
            .is_some_and(|c| c.sha == sha);
        if applied {
            Ok(())
        } else {
            Err(format!("sync failures: {failures:#?}"))
        }
    })
    .await
}

/// The scenario of tests/ordered_upgrade.rs, with `faults`: the step records it leaves.
async fn ordered_upgrade(faults: FaultSettings) -> Vec<Step> {
    let mut simulation = ClusterConfig::default_cluster();
    simulation.timing.relist_seconds = 0.2;
    let (cluster, client) = common::start_with(ClusterOptions {
        simulation: Some(simulation),
        faults,
        ..ClusterOptions::default()
    })
    .await;
    let mut repo = FleetRepo::new();
    let mut commits = vec![upgrade::commit_initial_fleet(&mut repo, &[])];
    let mut syncer = start_syncer(&client, repo.path()).await;
    let stop = CancellationToken::new();
    let ctx = Context::new(client.clone(), stop.clone());
    let running = tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
    sync_until_applied(&mut syncer, &client, &commits[0]).await;
    common::wait_for("the cluster at rest", async || {
        upgrade::at_rest(&client).await
    })
    .await;
    let timelines = upgrade::timeline::watch(&client, NS, "my_kmod");
    common::wait_until("the timeline of every node", || async {
        NODES.iter().all(|node| timelines.has_loaded(node, "v1"))
    })
    .await;

    let (bump, worker_1) = (module("v2"), label("worker-1", "v2"));
    let (worker_2, worker_3) = (label("worker-2", "v2"), label("worker-3", "v2"));
    let later: [(&str, Changes<'_>); 3] = [
        (
            "Merge pull request #2 from fleet/my-kmod-v2",
            vec![("module.yaml", Some(&bump))],
        ),
        (
            "Merge pull request #3 from fleet/worker-1-v2",
            vec![("nodes/worker-1.yaml", Some(&worker_1))],
        ),
        (
            "Merge pull request #4 from fleet/rest-v2",
            vec![
                ("nodes/worker-2.yaml", Some(&worker_2)),
                ("nodes/worker-3.yaml", Some(&worker_3)),
            ],
        ),
    ];
    for (message, changes) in later {
        let sha = repo.commit(&changes, message);
        sync_until_applied(&mut syncer, &client, &sha).await;
        common::wait_for("the cluster at rest", async || {
            upgrade::at_rest(&client).await
        })
        .await;
        commits.push(sha);
    }
    for node in NODES {
        common::wait_until("the timeline has seen v2 loaded", || async {
            timelines.has_loaded(node, "v2")
        })
        .await;
        let replay = timelines.replay(node);
        assert_eq!(
            replay.versions,
            [Some("v1".to_string()), None, Some("v2".to_string())],
            "{node}"
        );
        assert!(
            replay.violations.is_empty(),
            "{node}: {:?}",
            replay.violations
        );
    }
    // maxNodesInFlight: 1 held: one node's steps all before the other's. Which goes first
    // is not asserted: a refused label write can put worker-2 in line after worker-3.
    let second = upgrade::step_records(&client, "worker-2", "v2").await;
    let third = upgrade::step_records(&client, "worker-3", "v2").await;
    if let (Some(a), Some(b)) = (second.first(), third.first()) {
        let (before, after) = if a.spec.time <= b.spec.time {
            (&second, &third)
        } else {
            (&third, &second)
        };
        let (last, first) = (before.last().expect("steps"), after.first().expect("steps"));
        assert!(
            last.spec.time <= first.spec.time,
            "{:?} started ({}) before {:?} finished ({})",
            first.spec.node,
            first.spec.time,
            last.spec.node,
            last.spec.time
        );
    }

    let place: BTreeMap<&str, usize> = commits
        .iter()
        .enumerate()
        .map(|(i, sha)| (sha.as_str(), i))
        .collect();
    let mut steps: Vec<Step> = upgrade::step_records_all(&client)
        .await
        .into_iter()
        .map(|record| {
            let spec = record.spec;
            (
                spec.node.unwrap_or_default(),
                spec.step.unwrap_or_default(),
                spec.from_version,
                spec.to_version,
                place
                    .get(spec.commit.sha.as_str())
                    .copied()
                    .unwrap_or(usize::MAX),
                spec.commit.pull_request,
            )
        })
        .collect();
    steps.sort();
    stop.cancel();
    running.await.expect("controllers stop");
    cluster.shutdown().await;
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_on_a_failing_api_server_leaves_the_history_of_a_reliable_one() {
    common::requires_stand_in("injected API faults");
    let seeds: Vec<u64> = match std::env::var(SEED_VAR) {
        Ok(seed) => vec![seed.parse().expect("a seed number")],
        Err(_) => CI_SEEDS.to_vec(),
    };
    let reliable = ordered_upgrade(FaultSettings::default()).await;
    // 3 nodes: none -> v1 (2 steps) and v1 -> v2 (4 steps).
    assert_eq!(reliable.len(), 18, "{reliable:#?}");
    for seed in seeds {
        let started = std::time::Instant::now();
        let faulty = ordered_upgrade(faults(seed)).await;
        println!(
            "fault seed {seed}: {} step records in {:.1}s",
            faulty.len(),
            started.elapsed().as_secs_f64()
        );
        assert_eq!(
            faulty, reliable,
            "fault seed {seed} (replay with {SEED_VAR}={seed})"
        );
    }
}

/// A step's record is written once: a second write finds it. A write refused with 409
/// Conflict (a busy API server, not the record) is an error to retry, never taken as the
/// record being there, or the step would go unrecorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_record_refused_with_a_conflict_is_retried_not_taken_as_written() {
    use capstan::history;
    use capstan_api::{CommitRef, HistoryRecordSpec, RecordType};

    let spec = HistoryRecordSpec {
        time: "2026-11-21T10:14:13.000000Z".into(),
        type_: RecordType::UpgradeStep,
        sync: "capstan".into(),
        commit: CommitRef {
            sha: "3cf3bea0000000000000000000000000000000000".into(),
            short_sha: "3cf3bea".into(),
            ..CommitRef::default()
        },
        message: "step".into(),
        node: Some("worker-1".into()),
        module: Some("kmm-demo/my-kmod".into()),
        step: Some("device-plugin-stopped".into()),
        from_version: Some("v1".into()),
        to_version: Some("v2".into()),
        ..HistoryRecordSpec::default()
    };
    let (reliable, client) = common::start().await;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "capstan-system"}}))
                .expect("namespace"),
        )
        .await
        .expect("capstan-system");
    assert!(
        history::write_record(&client, spec.clone())
            .await
            .expect("first write")
    );
    assert!(
        !history::write_record(&client, spec.clone())
            .await
            .expect("second write")
    );
    reliable.shutdown().await;

    let (busy, client) = common::start_with(ClusterOptions {
        faults: FaultSettings::parse("seed=1,conflicts=1").expect("faults"),
        ..ClusterOptions::default()
    })
    .await;
    let written = history::write_record(&client, spec).await;
    assert!(
        matches!(&written, Err(kube::Error::Api(status)) if status.code == 409),
        "{written:?}"
    );
    busy.shutdown().await;
}
