//! Following a local repository: a commit on the branch is applied without waiting for the
//! interval (the refs are watched), and a stop request ends the loop cleanly.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use capstan::sync::run::{self, Outcome, Wakers};
use capstan::sync::source::watch_refs;
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};
use tokio::sync::{Notify, mpsc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_a_watched_branch_is_applied_without_waiting_for_the_interval() {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "First",
    );
    let syncer = common::syncer(&client, repo.path()).await;
    let (_watcher, refs) = watch_refs(&syncer.source().git_dir()).expect("watch");
    let (outcomes, mut received) = mpsc::unbounded_channel();
    let shutdown = Arc::new(Notify::new());
    let ready = Arc::new(AtomicBool::new(false));
    let looping = tokio::spawn(run::follow(
        syncer,
        Duration::from_secs(3600),
        Wakers {
            refs: Some(refs),
            webhook: Arc::new(Notify::new()),
        },
        shutdown.clone(),
        ready.clone(),
        move |result| {
            let _ = outcomes.send(result.as_ref().ok().cloned());
        },
    ));

    let next_applied = async |received: &mut mpsc::UnboundedReceiver<Option<Outcome>>| loop {
        let outcome = tokio::time::timeout(common::DEADLINE, received.recv())
            .await
            .expect("an outcome before the deadline")
            .expect("the loop runs");
        if let Some(Outcome::Applied(report)) = outcome {
            return report;
        }
    };
    let first = next_applied(&mut received).await;
    assert!(ready.load(Ordering::SeqCst));
    assert_eq!(first.count("created"), 2);

    let sha = repo.commit(&[("cm.yaml", Some(&config_map("settings", "b")))], "Second");
    let second = next_applied(&mut received).await;
    assert_eq!(
        second.commit.as_ref().map(|c| c.sha.as_str()),
        Some(sha.as_str())
    );
    assert_eq!(second.count("configured"), 1);

    shutdown.notify_one();
    tokio::time::timeout(common::DEADLINE, looping)
        .await
        .expect("the loop stops")
        .expect("the loop does not panic");
}
