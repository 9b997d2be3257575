//! The command line: one file per subcommand. `main.rs` only wires arguments here.

#[cfg(feature = "embedded-cluster")]
pub mod cluster;
pub mod crds;
pub mod history;
pub mod plan;
pub mod sync;
pub mod worker;

use clap::{Parser, Subcommand};

/// capstan: GitOps for ordered, node-level kernel-module upgrades on Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "capstan", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run or manage the embedded Kubernetes cluster.
    #[cfg(feature = "embedded-cluster")]
    Cluster(cluster::ClusterArgs),
    /// Print the CustomResourceDefinitions of every kind capstan handles, as YAML for
    /// `kubectl apply -f -`.
    ///
    /// Module and NodeModulesConfig (kmm.sigs.x-k8s.io), UpgradeConfig
    /// (upgrade.managed.openshift.io), LeaderWorkerSet (leaderworkerset.x-k8s.io), and
    /// capstan's own GitSync and HistoryRecord (capstan.dev).
    Crds,
    /// Follow a Git branch and make the cluster match it.
    Sync(Box<sync::SyncArgs>),
    /// Show the commit-linked history: syncs, rejected commits, upgrade steps, drains.
    History(history::HistoryArgs),
    /// Show what merging a change will do: objects, node upgrades and policy, before the merge.
    Plan(plan::PlanArgs),
    /// What a KMM worker pod runs: pull a kmod image, load or unload its module.
    Worker(worker::WorkerArgs),
}

/// Runs a parsed command line; the exit code is the process's.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        #[cfg(feature = "embedded-cluster")]
        Command::Cluster(args) => cluster::run(args).await,
        Command::Crds => crds::run(),
        Command::Sync(args) => sync::run(*args).await,
        Command::History(args) => history::run(args).await,
        Command::Plan(args) => plan::run(args).await,
        Command::Worker(args) => worker::run(args).await,
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: info for capstan and for the output
/// of the `modprobe` the worker runs); the worker logs
/// to stdout, so that its stderr holds nothing but the reason of a failure.
pub fn init_logging(cli: &Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("capstan=info,modprobe=info,warn"));
    // A second initialisation (tests) keeps the first subscriber.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match cli.command {
        Command::Worker(_) => builder.with_writer(std::io::stdout).try_init(),
        _ => builder.with_writer(std::io::stderr).try_init(),
    };
}
