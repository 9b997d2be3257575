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

/// `--listen`'s help. The server is always HTTPS, with a certificate authority of its own
/// (in the kubeconfig it writes): client-go sends bearer tokens over TLS only.
const LISTEN_HELP: &str = "Address to listen on; port 0 picks a free port. The API is always \
    HTTPS, signed by a certificate authority of the cluster's own (in the kubeconfig), and \
    every request needs the kubeconfig's bearer token. A non-loopback address exposes it to \
    the network; the serving certificate names that address unless it is unspecified \
    (0.0.0.0, ::)";

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Serve the embedded cluster (HTTPS on loopback by default, with simulated nodes) until
    /// interrupted.
    // The arguments are the cluster crate's; their help is corrected here where it is wrong.
    #[command(mut_arg("listen", |arg| arg.help(LISTEN_HELP)))]
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
    Show {
        /// The simulated node's name.
        node: String,
    },
    /// Reboot: new boot ID, modules unloaded, NotReady until it is back (the command returns
    /// then, with the node's state).
    Reboot {
        /// The simulated node's name.
        node: String,
    },
    /// Install another kernel and reboot into it (the command returns once the node is Ready
    /// again, with its state).
    UpgradeKernel {
        /// The simulated node's name.
        node: String,
        /// The kernel release it boots, as `uname -r` prints it and the node's
        /// `status.nodeInfo.kernelVersion` shows it (e.g. 6.2.0-1.fc38.x86_64).
        kernel: String,
    },
    /// Make the node NotReady (its kubelet stops posting status).
    NotReady {
        /// The simulated node's name.
        node: String,
    },
    /// Make the node Ready again.
    Ready {
        /// The simulated node's name.
        node: String,
    },
    /// Remove the node from the cluster, with its pods.
    Remove {
        /// The simulated node's name.
        node: String,
    },
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

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use crate::cli::Cli;

    /// What `capstan <args> --help` prints.
    fn help(args: &[&str]) -> String {
        let argv = ["capstan"].iter().chain(args).chain(&["--help"]);
        match Cli::try_parse_from(argv) {
            Err(err) if err.kind() == clap::error::ErrorKind::DisplayHelp => err.to_string(),
            other => panic!("{args:?} --help: {other:?}"),
        }
    }

    #[test]
    fn serve_help_says_the_api_is_https_as_served() {
        let text = help(&["cluster", "serve"]);
        assert!(!text.contains("plain HTTP"), "{text}");
        assert!(text.contains("always HTTPS"), "{text}");
        assert!(text.contains("bearer token"), "{text}");
        // Every argument of the cluster crate is still there.
        for flag in [
            "--listen",
            "--state-dir",
            "--kubeconfig-out",
            "--faults",
            "--config",
        ] {
            assert!(text.contains(flag), "{flag}: {text}");
        }
    }

    #[test]
    fn node_operations_say_what_their_arguments_are() {
        let text = help(&["cluster", "node", "upgrade-kernel"]);
        assert!(text.contains("The simulated node's name"), "{text}");
        assert!(text.contains("uname -r"), "{text}");
        for operation in ["show", "reboot", "not-ready", "ready", "remove"] {
            let text = help(&["cluster", "node", operation]);
            assert!(
                text.contains("The simulated node's name"),
                "{operation}: {text}"
            );
        }
    }
}
