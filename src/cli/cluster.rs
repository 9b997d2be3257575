//! `capstan cluster`: serve the embedded cluster, and operate its simulated nodes.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use capstan_cluster::cli::ServeArgs;

use crate::runtime;

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

pub async fn run(args: ClusterArgs) -> anyhow::Result<i32> {
    match args.command {
        ClusterCommand::Serve(serve) => {
            capstan_cluster::cli::serve(serve, runtime::shutdown_signal()).await
        }
        ClusterCommand::Node(node) => run_node(node).await,
    }
}

async fn run_node(args: NodeArgs) -> anyhow::Result<i32> {
    let path = args
        .kubeconfig
        .context("no kubeconfig: pass --kubeconfig (the file `capstan cluster serve` wrote) or set KUBECONFIG")?;
    let client = runtime::client_for(&path).await?;
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
