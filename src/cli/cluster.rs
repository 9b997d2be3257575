//! `capstan cluster serve`: the embedded Kubernetes API server as a process.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cluster::faults::FaultSettings;
use crate::cluster::{ClusterOptions, EmbeddedCluster, kubeconfig};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Serve the embedded cluster until interrupted.
    Serve(ServeArgs),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port. Non-loopback addresses expose
    /// the API (token-protected, plain HTTP) to the network.
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
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<i32> {
    match args.command {
        ClusterCommand::Serve(serve) => run_serve(serve).await,
    }
}

async fn run_serve(args: ServeArgs) -> anyhow::Result<i32> {
    if !args.listen.ip().is_loopback() {
        tracing::warn!(listen = %args.listen, "serving the embedded cluster beyond loopback, over plain HTTP");
    }
    let options = ClusterOptions {
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
    wait_for_shutdown_signal().await;
    println!("shutting down");
    cluster.shutdown().await;
    Ok(0)
}

/// SIGINT or SIGTERM.
pub async fn wait_for_shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
