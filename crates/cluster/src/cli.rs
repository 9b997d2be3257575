//! `serve`: the embedded cluster as a process, until a shutdown signal (`capstan cluster
//! serve` and the `capstan-cluster` binary).

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;

use crate::faults::FaultSettings;
use crate::sim::config::ClusterConfig;
use crate::{ClusterOptions, EmbeddedCluster, kubeconfig};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port. Non-loopback addresses expose
    /// the API (HTTPS, every request needing the kubeconfig's bearer token) to the network.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Keep the cluster's objects here, durable across restarts (even kill -9).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Write a kubeconfig for kubectl here (default: <state-dir>/kubeconfig, or a file in
    /// the temp dir).
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Inject faults, e.g. `seed=7,errors=0.05,conflicts=0.05,watch-drops=0.1,latency=20ms`.
    #[arg(long, value_parser = FaultSettings::parse)]
    pub faults: Option<FaultSettings>,
    /// Simulated nodes, workloads and timings (docs/cluster-config.md); default: one
    /// control-plane node and three workers.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Serves the embedded cluster until `shutdown` completes.
pub async fn serve(
    args: ServeArgs,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<i32> {
    // A server process lives to allocate and free request after request.
    crate::memory::keep_freed_memory();
    if !args.listen.ip().is_loopback() {
        tracing::warn!(listen = %args.listen, "serving the embedded cluster beyond loopback, over HTTPS with its bearer token: anyone who can reach it and holds the kubeconfig is its admin");
    }
    let config = match &args.config {
        Some(path) => ClusterConfig::read(path)?,
        None => ClusterConfig::default_cluster(),
    };
    let options = ClusterOptions {
        simulation: Some(config),
        listen: args.listen,
        state_dir: args.state_dir.clone(),
        faults: args.faults.unwrap_or_default(),
        ..ClusterOptions::default()
    };
    let cluster = EmbeddedCluster::start(options)
        .await
        .context("starting the embedded cluster")?;
    let kubeconfig_path = args
        .kubeconfig_out
        .unwrap_or_else(|| match &args.state_dir {
            Some(dir) => dir.join("kubeconfig"),
            None => std::env::temp_dir()
                .join(format!("capstan-{}.kubeconfig", cluster.address().port())),
        });
    kubeconfig::write(&kubeconfig_path, &cluster.kubeconfig())
        .with_context(|| format!("writing the kubeconfig to {}", kubeconfig_path.display()))?;
    println!("embedded cluster serving at {}", cluster.url());
    println!("kubeconfig: {}", kubeconfig_path.display());
    println!(
        "try: kubectl --kubeconfig {} get nodes,pods -A -o wide",
        kubeconfig_path.display()
    );
    shutdown.await;
    println!("shutting down");
    cluster.shutdown().await;
    Ok(0)
}
