//! `capstan-real-cluster up`: starts a real control plane on loopback with the nodes of a
//! `cluster.yaml`, writes its administrator kubeconfig, and runs until interrupted, then
//! stops everything it started. The binaries come from `hack/real-cluster/build`.

use std::path::PathBuf;

use anyhow::Context as _;
use capstan_cluster::sim::config::ClusterConfig;
use capstan_real_cluster::ControlPlane;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "A real Kubernetes control plane on loopback, with kwok nodes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the control plane and run until SIGINT or SIGTERM.
    Up {
        /// The nodes, as the embedded cluster's cluster.yaml has them (default: a
        /// control-plane node and three workers).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the administrator's kubeconfig.
        #[arg(long, default_value = "real-cluster.kubeconfig")]
        kubeconfig: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube logs each refused readiness probe as an error while the server starts.
                .unwrap_or_else(|_| "info,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Up { config, kubeconfig } = Cli::parse().command;
    let config = match config {
        Some(path) => ClusterConfig::read(&path)?,
        None => ClusterConfig::default_cluster(),
    };
    let started = std::time::Instant::now();
    let plane = ControlPlane::start(&config).await?;
    std::fs::write(&kubeconfig, plane.kubeconfig())
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    eprintln!(
        "control plane at {} ready in {:.1}s with {} nodes; logs in {}\nexport KUBECONFIG={}",
        plane.server(),
        started.elapsed().as_secs_f64(),
        config.nodes.len(),
        plane.dir().display(),
        std::path::absolute(&kubeconfig)?.display(),
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    plane.shutdown().await;
    Ok(())
}
