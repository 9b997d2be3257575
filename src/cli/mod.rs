//! The command line: one file per subcommand. `main.rs` only wires arguments here.

/// A line of a command's own account on stderr (what a sync applied, why it stopped), or,
/// with `--log-format json`, the same line as a log event, so that stderr holds nothing but
/// JSON then.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::say_line(&format!($($arg)*))
    };
}

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
    /// How logs are written: `text`, one line per event (coloured only on a terminal, and
    /// not when NO_COLOR is set), or `json`, one object per line with the same fields, as
    /// log pipelines read them.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// The format of capstan's logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event, for a human.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them) and its spans'.
    Json,
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

/// Whether `--log-format json` was chosen: [`say_line`] then logs instead of printing.
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// See [`say!`].
pub fn say_line(line: &str) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        tracing::info!(target: "capstan", "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default: info for capstan and for the output
/// of the `modprobe` the worker runs); the worker logs
/// to stdout, so that its stderr holds nothing but the reason of a failure.
pub fn init_logging(cli: &Cli) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("capstan=info,modprobe=info,warn"));
    let to_stdout = matches!(cli.command, Command::Worker(_));
    // Colour codes are for a terminal: a pod's log or a CI log shows them as garbage.
    let terminal = if to_stdout {
        std::io::stdout().is_terminal()
    } else {
        std::io::stderr().is_terminal()
    };
    let ansi = terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let writer = move || -> Box<dyn std::io::Write> {
        if to_stdout {
            Box::new(std::io::stdout())
        } else {
            Box::new(std::io::stderr())
        }
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    JSON_LOGS.store(
        cli.log_format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    // A second initialisation (tests) keeps the first subscriber.
    let _ = match cli.log_format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
