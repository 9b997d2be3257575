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
    /// duration of each step), with the cordon, drain, drains the nodekeeper forced and
    /// uncordon of a campaign in the order they happened, then the syncs that changed its
    /// labels.
    #[arg(long)]
    pub node: Option<String>,
    /// Only records about this Module, as `namespace/name`: its upgrade steps and the syncs
    /// that changed it.
    #[arg(long)]
    pub module: Option<String>,
    /// Only records of commits whose SHA starts with this (any case).
    #[arg(long)]
    pub commit: Option<String>,
    /// `text` (a table) or `json` (an array, oldest first).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// The cluster (default: in a pod, the pod's own; else the embedded cluster `capstan
    /// sync` started, the kubeconfig in its default state directory,
    /// `$XDG_STATE_HOME/capstan/kubeconfig` or `~/.local/state/capstan/kubeconfig`).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

pub async fn run(args: HistoryArgs) -> anyhow::Result<i32> {
    let client = match args.kubeconfig {
        Some(path) => client_for(&path).await?,
        // `kubectl exec` into capstan's pod reads the history of the cluster it runs in.
        None if crate::runtime::in_pod() => crate::runtime::in_cluster_client().await?,
        None => {
            // The kubeconfig `capstan sync` writes for its embedded cluster, by default.
            let path = super::sync::default_state_dir().join("kubeconfig");
            anyhow::ensure!(
                path.exists(),
                "no --kubeconfig (nor $KUBECONFIG), and no embedded cluster's {}: pass --kubeconfig",
                path.display()
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

/// A node's history: its upgrades, step by step with the drain around each (cordoned,
/// drained, the steps, uncordoned, in the order they happened), then the other records
/// about it (the syncs that changed its labels).
fn render_node(records: &[HistoryRecord]) -> String {
    let mut upgrades = history::upgrades(records);
    if upgrades.is_empty() {
        return history::render_text(records);
    }
    let others: Vec<HistoryRecord> = history::attach_drains(&mut upgrades, records)
        .into_iter()
        .cloned()
        .collect();
    let mut out = history::render_upgrades_text(&upgrades);
    if !others.is_empty() {
        out.push_str(&history::render_text(&others));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::{CommitRef, HistoryRecordSpec, RecordType};

    /// A record of `type_` and `step` on worker-1 towards v2, asked by #2, at `second`
    /// past 10:00.
    fn record(type_: RecordType, step: &str, second: u32) -> HistoryRecord {
        let sha = "3cf3bea".repeat(6)[..40].to_string();
        let spec = HistoryRecordSpec {
            time: format!("2026-11-21T10:00:{second:02}.000000Z"),
            type_,
            sync: "capstan".into(),
            commit: CommitRef {
                short_sha: sha[..7].to_string(),
                revision: format!("main@sha1:{sha}"),
                sha,
                pull_request: Some(2),
                ..CommitRef::default()
            },
            message: format!("worker-1 {step}"),
            node: Some("worker-1".into()),
            module: (type_ == RecordType::UpgradeStep).then(|| "kmm-demo/my-kmod".into()),
            step: Some(step.into()),
            from_version: (type_ == RecordType::UpgradeStep).then(|| "v1".into()),
            to_version: Some("v2".into()),
            duration_seconds: (type_ == RecordType::UpgradeStep).then_some(1.0),
            ..HistoryRecordSpec::default()
        };
        HistoryRecord::new(&crate::history::record_name(&spec), spec)
    }

    /// The STEP column of each row of the upgrade tables of `text` (after the step's
    /// number, when it has one).
    fn steps(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|line| line.starts_with("  2026-"))
            .map(|line| {
                let mut words = line[24..].split_whitespace();
                let first = words.next().unwrap_or_default();
                if first.chars().all(|c| c.is_ascii_digit()) {
                    words.next().unwrap_or_default()
                } else {
                    first
                }
            })
            .collect()
    }

    #[test]
    fn a_drained_node_reads_cordoned_drained_the_four_steps_uncordoned() {
        use RecordType::{Drain, DrainStrategy, Sync, UpgradeStep};
        // As the API server lists them: by name. Step 4 and the uncordon are written in one
        // reconcile, at the same time.
        let mut sync = record(Sync, "", 0);
        sync.spec.node = None;
        sync.spec.message = "applied 3cf3bea".into();
        let mut records = vec![
            record(Drain, "uncordoned", 9),
            record(UpgradeStep, "device-plugin-started", 9),
            record(UpgradeStep, "new-module-loaded", 8),
            record(UpgradeStep, "old-module-unloaded", 7),
            record(UpgradeStep, "device-plugin-stopped", 6),
            record(Drain, "drained", 5),
            record(DrainStrategy, "DELETE", 3),
            record(Drain, "cordoned", 1),
            sync,
        ];
        records.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        history::sort_chronologically(&mut records);
        let text = render_node(&records);
        assert_eq!(
            steps(&text),
            [
                "cordoned",
                "DELETE",
                "drained",
                "device-plugin-stopped",
                "old-module-unloaded",
                "new-module-loaded",
                "device-plugin-started",
                "uncordoned",
            ],
            "{text}"
        );
        // One upgrade, its drain inside it; the sync is listed after it.
        assert!(
            text.starts_with(
                "worker-1 kmm-demo/my-kmod v1 -> v2, commit 3cf3bea (#2): 4 of 4 steps"
            ),
            "{text}"
        );
        let uncordoned = text.lines().find(|l| l.contains("uncordoned")).unwrap();
        assert!(uncordoned.ends_with("#2     0.0s"), "{uncordoned}");
        let drained = text.lines().find(|l| l.contains(" drained")).unwrap();
        assert!(drained.ends_with("#2     2.0s"), "{drained}");
        let table = text.split_once("\n\n").map(|(_, rest)| rest).unwrap();
        assert_eq!(table.lines().count(), 2, "{text}");
        assert!(table.contains("applied 3cf3bea"), "{text}");
    }

    #[test]
    fn a_drain_of_another_commit_is_not_taken_for_the_upgrades() {
        let mut other = record(RecordType::Drain, "cordoned", 1);
        other.spec.commit.sha = "f".repeat(40);
        let records = vec![
            other,
            record(RecordType::UpgradeStep, "device-plugin-stopped", 2),
        ];
        let text = render_node(&records);
        assert_eq!(steps(&text), ["device-plugin-stopped"], "{text}");
        assert!(text.contains("Drain"), "{text}");
    }
}
