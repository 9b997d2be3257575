//! capstan as an ordered-upgrade scenario runs it, in either of the two ways a user does:
//! one long-running sync with its controllers, or a fresh `capstan sync --once` process per
//! commit (as a CI job or a cron runs it). A scenario played both ways must end in the same
//! cluster state and the same history.

use std::path::{Path, PathBuf};

use capstan::controllers::{self, Context, Selection};
use capstan::sync::run::{Outcome, Syncer};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How capstan runs in a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One sync and the controllers in this process for the whole scenario.
    LongRunning,
    /// `capstan sync --once` in a new process for each commit: nothing carries over but
    /// what the cluster records.
    OncePerCommit,
}

/// capstan following a repository into a cluster.
pub struct Capstan {
    mode: Mode,
    client: kube::Client,
    repo: PathBuf,
    dir: tempfile::TempDir,
    running: Option<(Syncer, CancellationToken, JoinHandle<()>)>,
    runs: usize,
}

impl Capstan {
    /// Ready to follow `repo` into the cluster behind `client`, whose kubeconfig (YAML) the
    /// `--once` processes read.
    pub async fn new(mode: Mode, client: &kube::Client, kubeconfig: &str, repo: &Path) -> Capstan {
        let dir = tempfile::tempdir().expect("tempdir");
        capstan_cluster::kubeconfig::write(&dir.path().join("kubeconfig"), kubeconfig)
            .expect("kubeconfig");
        let running = match mode {
            Mode::OncePerCommit => None,
            Mode::LongRunning => {
                let stop = CancellationToken::new();
                let ctx = Context::new(client.clone(), stop.clone());
                let controllers =
                    tokio::spawn(async move { controllers::run(ctx, &Selection::all()).await });
                Some((crate::common::syncer(client, repo).await, stop, controllers))
            }
        };
        Capstan {
            mode,
            client: client.clone(),
            repo: repo.to_path_buf(),
            dir,
            running,
            runs: 0,
        }
    }

    /// Takes the branch's head and waits until the cluster has converged on it. Panics when
    /// the head is not applied (a rejection, an error, a timeout).
    pub async fn take_head(&mut self) {
        self.runs += 1;
        match &mut self.running {
            Some((syncer, _, _)) => {
                let outcome = syncer.sync().await.expect("sync");
                assert!(
                    matches!(outcome, Outcome::Applied(_) | Outcome::Unchanged),
                    "{outcome:?}"
                );
                super::converged(&self.client).await;
            }
            None => {
                let log = self.dir.path().join(format!("once-{}.log", self.runs));
                let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_capstan"))
                    .args(["sync", "--once", "--timeout", "120s", "--repo"])
                    .arg(&self.repo)
                    .arg("--kubeconfig")
                    .arg(self.dir.path().join("kubeconfig"))
                    .arg("--state-dir")
                    .arg(self.dir.path().join("state"))
                    .args(["--listen", "127.0.0.1:0"])
                    .output()
                    .await
                    .expect("capstan sync --once runs");
                let stderr = String::from_utf8_lossy(&output.stderr);
                let _ = std::fs::write(&log, stderr.as_bytes());
                assert!(
                    output.status.success(),
                    "capstan sync --once (run {}) exited with {}:\n{stderr}",
                    self.runs,
                    output.status
                );
            }
        }
    }

    /// Applies the branch's head without waiting for the cluster to converge on it (a
    /// rollout the guardrails hold does not): the long-running mode only.
    pub async fn apply_head(&mut self) {
        self.runs += 1;
        let Some((syncer, _, _)) = &mut self.running else {
            panic!("apply_head needs the long-running mode");
        };
        let outcome = syncer.sync().await.expect("sync");
        assert!(
            matches!(outcome, Outcome::Applied(_) | Outcome::Unchanged),
            "{outcome:?}"
        );
    }

    /// Syncs the branch's head once and returns what the sync did (a rejection included),
    /// without waiting for the rollout: the long-running mode only.
    pub async fn sync_head(&mut self) -> Outcome {
        self.runs += 1;
        let Some((syncer, _, _)) = &mut self.running else {
            panic!("sync_head needs the long-running mode");
        };
        syncer.sync().await.expect("sync")
    }

    /// The way capstan runs.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops the long-running controllers, if any.
    pub async fn stop(mut self) {
        if let Some((_, stop, controllers)) = self.running.take() {
            stop.cancel();
            controllers.await.expect("controllers stop");
        }
    }
}
