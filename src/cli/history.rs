//! `capstan history`: the commit-linked records kept in the cluster.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::cluster::client_for;
use crate::sync::history::{self, Filter, RecordView};

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only records about this node (its upgrade steps, and syncs that changed its labels).
    #[arg(long)]
    pub node: Option<String>,
    /// Only records about this Module, as `namespace/name`.
    #[arg(long)]
    pub module: Option<String>,
    /// Only records of commits whose SHA starts with this.
    #[arg(long)]
    pub commit: Option<String>,
    /// `text` (a table) or `json` (an array, oldest first).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// The cluster (default: the embedded cluster of a `capstan sync` run in this folder,
    /// `.capstan/kubeconfig`).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// The kubeconfig `capstan sync` writes for its embedded cluster, by default.
const EMBEDDED_KUBECONFIG: &str = ".capstan/kubeconfig";

pub async fn run(args: HistoryArgs) -> anyhow::Result<i32> {
    let path = match args.kubeconfig {
        Some(path) => path,
        None => {
            let path = PathBuf::from(EMBEDDED_KUBECONFIG);
            anyhow::ensure!(
                path.exists(),
                "no --kubeconfig, and no {EMBEDDED_KUBECONFIG} of an embedded cluster here: pass --kubeconfig"
            );
            path
        }
    };
    let client = client_for(&path).await?;
    let filter = Filter {
        node: args.node,
        module: args.module,
        commit: args.commit,
    };
    let records = history::list(&client, &filter)
        .await
        .context("reading the history records")?;
    match args.format {
        Format::Text => print!("{}", history::render_text(&records)),
        Format::Json => {
            let views: Vec<RecordView<'_>> = records
                .iter()
                .map(|r| RecordView {
                    name: r.metadata.name.as_deref().unwrap_or_default(),
                    spec: &r.spec,
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&views)?);
        }
    }
    Ok(0)
}
