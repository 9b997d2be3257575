//! `capstan cluster serve`: the embedded Kubernetes API server as a process.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cluster::faults::FaultSettings;
use crate::cluster::sim::config::ClusterConfig;
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
    /// Operate a simulated node of a running embedded cluster.
    Node(NodeArgs),
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub operation: NodeOperation,
    /// The kubeconfig `capstan cluster serve` wrote (default: $KUBECONFIG).
    #[arg(long, env = "KUBECONFIG", global = true)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum NodeOperation {
    /// Show a node's kernel, boot ID, readiness and loaded kernel modules.
    Show { node: String },
    /// Reboot: new boot ID, modules unloaded, NotReady until it is back.
    Reboot { node: String },
    /// Install another kernel and reboot into it.
    UpgradeKernel { node: String, kernel: String },
    /// Make the node NotReady (its kubelet stops posting status).
    NotReady { node: String },
    /// Make the node Ready again.
    Ready { node: String },
    /// Remove the node from the cluster.
    Remove { node: String },
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
    /// Simulated nodes, workloads and timings (docs/cluster-config.md); default: one
    /// control-plane node and three workers.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub async fn run(args: ClusterArgs) -> anyhow::Result<i32> {
    match args.command {
        ClusterCommand::Serve(serve) => run_serve(serve).await,
        ClusterCommand::Node(node) => run_node(node).await,
    }
}

async fn run_serve(args: ServeArgs) -> anyhow::Result<i32> {
    // A server process lives to allocate and free request after request.
    crate::keep_freed_memory();
    if !args.listen.ip().is_loopback() {
        tracing::warn!(listen = %args.listen, "serving the embedded cluster beyond loopback, over plain HTTP");
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
    wait_for_shutdown_signal().await;
    println!("shutting down");
    cluster.shutdown().await;
    Ok(0)
}

/// A client for the cluster of the kubeconfig at `path` (its current context).
pub async fn client_for(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kubeconfig: kube::config::Kubeconfig = serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a kubeconfig", path.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("using the kubeconfig {}", path.display()))?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
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

async fn run_node(args: NodeArgs) -> anyhow::Result<i32> {
    let path = args
        .kubeconfig
        .context("no kubeconfig: pass --kubeconfig (the file `capstan cluster serve` wrote) or set KUBECONFIG")?;
    let client = client_for(&path).await?;
    let (method, node, operation) = match &args.operation {
        NodeOperation::Show { node } => ("GET", node, String::new()),
        NodeOperation::Reboot { node } => ("POST", node, "/reboot".into()),
        NodeOperation::UpgradeKernel { node, kernel } => {
            ("POST", node, format!("/kernel?version={kernel}"))
        }
        NodeOperation::NotReady { node } => ("POST", node, "/not-ready".into()),
        NodeOperation::Ready { node } => ("POST", node, "/ready".into()),
        NodeOperation::Remove { node } => ("DELETE", node, String::new()),
    };
    let request = http::Request::builder()
        .method(method)
        .uri(format!("/sim/v1/nodes/{node}{operation}"))
        .body(Vec::new())?;
    let answer = client.request_text(request).await.with_context(|| {
        format!("{method} node {node} (is the kubeconfig one of `capstan cluster serve`?)")
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&answer).unwrap_or(serde_json::Value::String(answer));
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(0)
}
