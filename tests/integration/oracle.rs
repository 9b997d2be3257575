//! What the upstream-oracle tests share: snapshots compared path by path, differences
//! matched against the ones docs/upstream-differences.md names, and the verdict.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// Whether a named difference shows in every run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Every run shows it: a run that does not means it is gone, and leaves the list.
    Always,
    /// Only a run where upstream's controllers race each other shows it.
    WhenUpstreamRaces,
}

/// A difference capstan makes on purpose: its id on docs/upstream-differences.md, the
/// scenario that shows it (`*` for any), a part of the differing path, and whether every
/// run shows it.
pub type Named = (&'static str, &'static str, &'static str, Shown);

/// `value` as `path = value` lines, arrays by index.
fn flatten(path: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, value) in map {
                flatten(&format!("{path}/{key}"), value, out);
            }
        }
        Value::Array(list) if !list.is_empty() => {
            for (index, value) in list.iter().enumerate() {
                flatten(&format!("{path}[{index}]"), value, out);
            }
        }
        Value::Null | Value::Object(_) | Value::Array(_) => {}
        other => {
            out.insert(path.to_string(), other.to_string());
        }
    }
}

/// Every path where the two snapshots differ: `(path, upstream's value, capstan's)`.
pub fn differences(upstream: &Value, capstan: &Value) -> Vec<(String, String, String)> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    flatten("", upstream, &mut a);
    flatten("", capstan, &mut b);
    let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let absent = "(absent)".to_string();
    paths
        .into_iter()
        .filter(|path| a.get(*path) != b.get(*path))
        .map(|path| {
            (
                path.clone(),
                a.get(path).unwrap_or(&absent).clone(),
                b.get(path).unwrap_or(&absent).clone(),
            )
        })
        .collect()
}

/// The differences of one comparison, scenario by scenario, against a table of named ones.
pub struct Verdict {
    named: &'static [Named],
    report: Vec<String>,
    unnamed: Vec<String>,
    seen: BTreeSet<&'static str>,
}

impl Verdict {
    pub fn new(named: &'static [Named]) -> Verdict {
        Verdict {
            named,
            report: Vec::new(),
            unnamed: Vec::new(),
            seen: BTreeSet::new(),
        }
    }

    /// Compares `scenario`'s snapshots after each of its steps (described by `steps`).
    pub fn scenario(
        &mut self,
        scenario: &str,
        steps: &[String],
        upstream: &[Value],
        capstan: &[Value],
    ) {
        let mut ids = BTreeSet::new();
        let mut not_named = 0;
        for (step, (a, b)) in upstream.iter().zip(capstan).enumerate() {
            for (path, was, is) in differences(a, b) {
                let id = self
                    .named
                    .iter()
                    .find(|(_, named_scenario, part, _)| {
                        (*named_scenario == "*" || *named_scenario == scenario)
                            && path.contains(part)
                    })
                    .map(|(id, ..)| *id);
                match id {
                    Some(id) => {
                        self.seen.insert(id);
                        ids.insert(id);
                    }
                    None => {
                        not_named += 1;
                        self.unnamed.push(format!(
                            "{scenario} step {step} ({}): {path}: upstream {was}, capstan {is}",
                            steps.get(step).map_or("", String::as_str)
                        ));
                    }
                }
            }
        }
        let ids: Vec<&str> = ids.into_iter().collect();
        self.report.push(format!(
            "{scenario:<18} {} steps: {}",
            steps.len(),
            match (ids.is_empty(), not_named) {
                (true, 0) => "same".to_string(),
                (false, 0) => format!("differs as named: {}", ids.join(", ")),
                (_, n) => format!("{n} differences not named (named: {})", ids.join(", ")),
            }
        ));
    }

    /// Prints the report under `title`, then fails on any difference not named, on any
    /// named one every run should show but this one did not, and on any id
    /// docs/upstream-differences.md does not explain.
    pub fn finish(self, title: &str) {
        eprintln!(
            "{} scenarios against {title}:\n{}",
            self.report.len(),
            self.report.join("\n")
        );
        assert!(
            self.unnamed.is_empty(),
            "differences not named in docs/upstream-differences.md:\n{}",
            self.unnamed.join("\n")
        );
        let unseen: BTreeSet<&str> = self
            .named
            .iter()
            .filter(|(id, .., shown)| *shown == Shown::Always && !self.seen.contains(id))
            .map(|(id, ..)| *id)
            .collect();
        assert!(
            unseen.is_empty(),
            "named differences no scenario shows any more: {unseen:?}"
        );
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/docs/upstream-differences.md"
        ))
        .expect("docs/upstream-differences.md");
        for (id, ..) in self.named {
            assert!(
                docs.contains(&format!("**{id}**")),
                "{id} is not explained in docs/upstream-differences.md"
            );
        }
    }
}

/// The controllers one side of a comparison runs: capstan's in this process, or upstream's
/// manager as a child process. `stop` also ends whatever watches the side started with it.
pub struct Running {
    pub stop: tokio_util::sync::CancellationToken,
    capstan: Option<tokio::task::JoinHandle<()>>,
    upstream: Option<std::process::Child>,
}

impl Running {
    /// capstan's controllers of `selection` (a `--controllers` list) against `client`.
    pub fn capstan(client: &kube::Client, selection: &str) -> Running {
        let stop = tokio_util::sync::CancellationToken::new();
        let ctx = capstan::controllers::Context::new(client.clone(), stop.clone());
        let selection: capstan::controllers::Selection = selection.parse().expect("selection");
        let capstan = tokio::spawn(async move {
            capstan::controllers::run(ctx, &selection).await;
        });
        Running {
            stop,
            capstan: Some(capstan),
            upstream: None,
        }
    }

    /// Upstream's manager, already started.
    pub fn upstream(manager: std::process::Child) -> Running {
        Running {
            stop: tokio_util::sync::CancellationToken::new(),
            capstan: None,
            upstream: Some(manager),
        }
    }

    /// Stops the controllers and the side's watches.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(capstan) = self.capstan.take() {
            capstan.await.expect("capstan's controllers stop");
        }
        if let Some(mut upstream) = self.upstream.take() {
            let _ = upstream.kill();
            let _ = upstream.wait();
        }
    }
}

/// A fresh real control plane with `nodes` and capstan's CRDs, and a namespace for each of
/// `namespaces` (one per scenario), for the side `side` names.
pub async fn start_plane(
    side: &str,
    nodes: Vec<capstan_cluster::sim::config::NodeConfig>,
    namespaces: impl IntoIterator<Item = &str>,
) -> (capstan_real_cluster::ControlPlane, kube::Client) {
    use kube::api::{Api, PostParams};
    let config = capstan_cluster::sim::config::ClusterConfig {
        nodes,
        ..Default::default()
    };
    let plane =
        capstan_real_cluster::ControlPlane::start_with(&config, &crate::common::plane_options())
            .await
            .unwrap_or_else(|err| panic!("{side}: the control plane starts: {err:#}"));
    let client = plane.client().await.expect("client");
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for name in namespaces {
        let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .expect("namespace");
        api.create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }
    (plane, client)
}
