//! `capstan history`: the commit-linked records kept in the cluster.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use crate::history::{self, Filter, RecordView};
use crate::runtime::client_for;
use capstan_api::HistoryRecord;

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only records about this node: its upgrades step by step (time, commit, pull request and
    /// duration of each step), then the syncs that changed its labels.
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
    let client = match args.kubeconfig {
        Some(path) => client_for(&path).await?,
        // `kubectl exec` into capstan's pod reads the history of the cluster it runs in.
        None if crate::runtime::in_pod() => crate::runtime::in_cluster_client().await?,
        None => {
            let path = PathBuf::from(EMBEDDED_KUBECONFIG);
            anyhow::ensure!(
                path.exists(),
                "no --kubeconfig, and no {EMBEDDED_KUBECONFIG} of an embedded cluster here: pass --kubeconfig"
            );
            client_for(&path).await?
        }
    };
    let by_node = args.node.is_some();
    let filter = Filter {
        node: args.node,
        module: args.module,
        commit: args.commit,
    };
    let records = history::list(&client, &filter)
        .await
        .context("reading the history records")?;
    match args.format {
        Format::Text if by_node => print!("{}", render_node(&records)),
        Format::Text => print!("{}", history::render_text(&records)),
        Format::Json => {
            let views: Vec<RecordView<'_>> = records.iter().map(RecordView::of).collect();
            println!("{}", serde_json::to_string_pretty(&views)?);
        }
    }
    Ok(0)
}

/// A node's history: its upgrades, step by step, then the other records about it (the
/// syncs that changed its labels).
fn render_node(records: &[HistoryRecord]) -> String {
    let upgrades = history::upgrades(records);
    if upgrades.is_empty() {
        return history::render_text(records);
    }
    let others: Vec<HistoryRecord> = records
        .iter()
        .filter(|record| history::upgrade_id(&record.spec).is_none())
        .cloned()
        .collect();
    let mut out = history::render_upgrades_text(&upgrades);
    if !others.is_empty() {
        out.push_str(&history::render_text(&others));
    }
    out
}
