//! Every bad commit of the corpus in `tests/bad_commits/` is rejected whole, with exactly
//! the `file:line: field: message` lines of its `expected.txt`; nothing of it is applied,
//! the last good commit stays applied, and the next good commit applies.
//!
//! Each folder of the corpus is one case: `good/`, `bad/` and `next/` are the whole trees
//! of three commits in a row (see `tests/bad_commits/README.md` for the layout and the
//! generated files). A case is added by adding a folder.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use capstan::sync::run::{Outcome, Syncer};
use capstan_api::{GitSync, Module};
use common::git::FleetRepo;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bad_commits");

/// The ConfigMap every tree of a case declares, with `data.state` naming the tree.
const MARKER: (&str, &str) = ("default", "marker");

/// The three commits of a case, in the order they land.
const TREES: [&str; 3] = ["good", "bad", "next"];

/// How long one case may take before it counts as failed.
const CASE_DEADLINE: Duration = Duration::from_secs(180);

/// Suffix of a file that stands for a symlink: its text is the link's target.
const SYMLINK_SUFFIX: &str = ".symlink";

/// Suffix of a file that stands for an oversized one: its text, then a comment that takes
/// the file to [`OVERSIZED_BYTES`].
const OVERSIZE_SUFFIX: &str = ".oversize";

/// One byte over capstan's limit for a manifest file (1 MiB).
const OVERSIZED_BYTES: usize = capstan::sync::manifests::MAX_FILE_BYTES + 1;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_commit_of_the_corpus_is_rejected_whole_and_the_next_good_one_applies() {
    let cases = corpus_cases();
    assert!(!cases.is_empty(), "no cases in {CORPUS}");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case_name(case);
        // A task per case: a panic in one (a helper's expect) fails that case only.
        let run = tokio::spawn(tokio::time::timeout(
            CASE_DEADLINE,
            check_case(case.clone()),
        ));
        let failure = match run.await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(why))) => Some(why),
            Ok(Err(_)) => Some(format!("did not finish within {CASE_DEADLINE:?}")),
            Err(join) => Some(format!("panicked: {}", panic_message(join))),
        };
        if let Some(why) = failure {
            failures.push(format!("case {name}: {why}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} corpus cases failed:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// The case folders of the corpus, in name order.
fn corpus_cases() -> Vec<PathBuf> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(CORPUS)
        .expect("corpus folder")
        .map(|entry| entry.expect("corpus entry").path())
        .filter(|path| path.is_dir())
        .collect();
    cases.sort();
    cases
}

fn case_name(case: &Path) -> String {
    case.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn panic_message(join: tokio::task::JoinError) -> String {
    match join.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(no message)".to_string()),
        Err(join) => join.to_string(),
    }
}

/// The three steps of one case; the first thing that differs from the expectation is the
/// failure.
async fn check_case(case: PathBuf) -> Result<(), String> {
    let expected = expected_errors(&case)?;
    for tree in TREES {
        let marker = case.join(tree).join("marker.yaml");
        let text = std::fs::read_to_string(&marker)
            .map_err(|err| format!("{}: {err}", marker.display()))?;
        if !text.contains(&format!("state: {tree}")) {
            return Err(format!(
                "{tree}/marker.yaml must set data.state to {tree:?}, so the test can tell which commit the cluster has"
            ));
        }
    }

    let (_cluster, client) = common::start_default_simulated().await;
    let mut repo = FleetRepo::new();

    // 1. The last good state applies.
    let good = commit_tree(&mut repo, &case.join("good"), "Good state")?;
    let mut syncer = common::syncer(&client, repo.path()).await;
    expect_applied(&mut syncer, "good").await?;
    expect_marker(&client, "good", "after the good commit").await?;
    let before = cluster_objects(&client).await;

    // 2. The bad commit is rejected whole with exactly the expected lines.
    let bad = commit_tree(&mut repo, &case.join("bad"), "Bad change (#7)")?;
    match syncer.sync().await {
        Ok(Outcome::Rejected { commit, errors }) => {
            if commit.sha != bad {
                return Err(format!(
                    "rejected commit {} instead of the bad one {bad}",
                    commit.sha
                ));
            }
            if errors != expected {
                return Err(format!(
                    "the rejection's lines differ from expected.txt\n  expected:\n{}\n  actual:\n{}",
                    indent(&expected),
                    indent(&errors)
                ));
            }
        }
        other => return Err(format!("the bad commit was not rejected: {other:?}")),
    }
    expect_marker(&client, "good", "after the bad commit").await?;
    let after = cluster_objects(&client).await;
    if after != before {
        return Err(format!(
            "the bad commit changed the cluster:\n  before: {before:#?}\n  after: {after:#?}"
        ));
    }
    let status = sync_status(&client).await?;
    let last_applied = status.last_applied_commit.map(|c| c.sha);
    if last_applied.as_deref() != Some(good.as_str()) {
        return Err(format!(
            "after the bad commit the GitSync status names {last_applied:?} as last applied, not the good commit {good}"
        ));
    }
    if status.phase != "Failed" {
        return Err(format!(
            "after the bad commit the GitSync phase is {:?}, not Failed",
            status.phase
        ));
    }
    if let Some(missing) = expected.iter().find(|line| !status.error.contains(*line)) {
        return Err(format!(
            "the GitSync status error does not name {missing:?}: {:?}",
            status.error
        ));
    }

    // 3. The next good commit applies, and its change shows.
    let next = commit_tree(&mut repo, &case.join("next"), "Fix")?;
    expect_applied(&mut syncer, "next").await?;
    expect_marker(&client, "next", "after the next commit").await?;
    let status = sync_status(&client).await?;
    let last_applied = status.last_applied_commit.map(|c| c.sha);
    if last_applied.as_deref() != Some(next.as_str()) {
        return Err(format!(
            "after the next commit the GitSync status names {last_applied:?} as last applied, not {next}"
        ));
    }
    Ok(())
}

/// The lines of the case's `expected.txt`, one error each.
fn expected_errors(case: &Path) -> Result<Vec<String>, String> {
    let path = case.join("expected.txt");
    let text =
        std::fs::read_to_string(&path).map_err(|err| format!("{}: {err}", path.display()))?;
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.is_empty() || lines.iter().any(|line| line.trim().is_empty()) {
        return Err("expected.txt must list one error per line, without blank lines".to_string());
    }
    Ok(lines)
}

fn indent(lines: &[String]) -> String {
    lines
        .iter()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn expect_applied(syncer: &mut Syncer, tree: &str) -> Result<(), String> {
    match syncer.sync().await {
        Ok(Outcome::Applied(_)) => Ok(()),
        other => Err(format!("the {tree} commit was not applied: {other:?}")),
    }
}

async fn expect_marker(client: &kube::Client, state: &str, when: &str) -> Result<(), String> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), MARKER.0);
    let found = maps
        .get_opt(MARKER.1)
        .await
        .map_err(|err| format!("reading the marker: {err}"))?
        .and_then(|map| map.data?.remove("state"));
    if found.as_deref() == Some(state) {
        Ok(())
    } else {
        Err(format!(
            "{when} the marker ConfigMap's state is {found:?}, not {state:?}"
        ))
    }
}

async fn sync_status(client: &kube::Client) -> Result<capstan_api::GitSyncStatus, String> {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), "capstan-system");
    syncs
        .get("capstan")
        .await
        .map_err(|err| format!("reading the GitSync: {err}"))?
        .status
        .ok_or_else(|| "the GitSync has no status".to_string())
}

/// What a commit can have changed in the cluster: every Namespace, ConfigMap and Module
/// with its resourceVersion, and every Node's labels and annotations. capstan's own
/// bookkeeping (`capstan-system`: status, Events, history) is left out, and so is what
/// the cluster's components write on their own.
async fn cluster_objects(client: &kube::Client) -> BTreeMap<String, String> {
    let mut objects = BTreeMap::new();
    let all = ListParams::default();
    for namespace in Api::<Namespace>::all(client.clone())
        .list(&all)
        .await
        .expect("list namespaces")
    {
        objects.insert(key(&namespace), version(&namespace));
    }
    for map in Api::<ConfigMap>::all(client.clone())
        .list(&all)
        .await
        .expect("list configmaps")
    {
        if map.namespace().as_deref() != Some("capstan-system")
            && !common::written_by_the_cluster_alone(map.meta())
        {
            objects.insert(key(&map), version(&map));
        }
    }
    for module in Api::<Module>::all(client.clone())
        .list(&all)
        .await
        .expect("list modules")
    {
        objects.insert(key(&module), version(&module));
    }
    // Nodes change on their own (heartbeats); only what Git sets on them counts.
    for node in Api::<Node>::all(client.clone())
        .list(&all)
        .await
        .expect("list nodes")
    {
        let set = format!(
            "labels {:?} annotations {:?}",
            node.labels(),
            common::annotations_not_of_components(node.meta())
        );
        objects.insert(key(&node), set);
    }
    objects
}

fn key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    match object.meta().namespace.as_deref() {
        Some(namespace) => format!(
            "{} {namespace}/{}",
            K::kind(&()),
            object.meta().name.as_deref().unwrap_or_default()
        ),
        None => format!(
            "{} {}",
            K::kind(&()),
            object.meta().name.as_deref().unwrap_or_default()
        ),
    }
}

fn version<K: Resource>(object: &K) -> String {
    object.meta().resource_version.clone().unwrap_or_default()
}

/// Makes the work tree hold exactly `tree` (expanding the generated files, see the
/// corpus README) and commits it; returns the SHA.
fn commit_tree(repo: &mut FleetRepo, tree: &Path, message: &str) -> Result<String, String> {
    let root = repo.path().to_path_buf();
    for entry in std::fs::read_dir(&root).map_err(|err| err.to_string())? {
        let path = entry.map_err(|err| err.to_string())?.path();
        if path.file_name().is_some_and(|name| name == ".git") {
            continue;
        }
        let removed = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|err| format!("clearing {}: {err}", path.display()))?;
    }
    copy_tree(tree, &root)?;
    // An empty change list commits the work tree as it is.
    Ok(repo.commit(&[], message))
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(from).map_err(|err| format!("{}: {err}", from.display()))?;
    for entry in entries {
        let source = entry.map_err(|err| err.to_string())?.path();
        let name = source
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let fail = |err: std::io::Error| format!("{}: {err}", source.display());
        if source.is_dir() {
            let folder = to.join(&name);
            std::fs::create_dir_all(&folder).map_err(fail)?;
            copy_tree(&source, &folder)?;
        } else if let Some(link) = name.strip_suffix(SYMLINK_SUFFIX) {
            let target = std::fs::read_to_string(&source).map_err(fail)?;
            std::os::unix::fs::symlink(target.trim_end(), to.join(link)).map_err(fail)?;
        } else if let Some(file) = name.strip_suffix(OVERSIZE_SUFFIX) {
            let mut text = std::fs::read(&source).map_err(fail)?;
            let padding = OVERSIZED_BYTES
                .checked_sub(text.len() + 3)
                .ok_or_else(|| format!("{} is already oversized", source.display()))?;
            text.extend_from_slice(b"# ");
            text.extend(std::iter::repeat_n(b'x', padding));
            text.push(b'\n');
            std::fs::write(to.join(file), text).map_err(fail)?;
        } else {
            std::fs::copy(&source, to.join(&name)).map_err(fail)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_with_tens_of_thousands_of_problems_is_recorded_rejected_once() {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(common::manifests::NAMESPACE)),
            (
                "marker.yaml",
                Some(&common::manifests::config_map("marker", "good")),
            ),
        ],
        "Good",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    expect_applied(&mut syncer, "good").await.expect("good");
    // 30 files of 1,000 documents without a kind (a file holds at most 1,024): one problem
    // each, about 2 MB of them, more than a status may hold.
    let problems = 30_000;
    let bad = "a: 1\n---\n".repeat(1_000);
    let names: Vec<String> = (0..30).map(|i| format!("bad/{i}.yaml")).collect();
    let files: Vec<(&str, Option<&str>)> = names
        .iter()
        .map(|name| (name.as_str(), Some(bad.as_str())))
        .collect();
    repo.commit(&files, "Many problems");
    let outcome = syncer.sync().await.expect("the rejection is recorded");
    let Outcome::Rejected { errors, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        errors.len() >= problems,
        "{} {:?}",
        errors.len(),
        errors.first()
    );
    let status = sync_status(&client).await.expect("status");
    assert_eq!(status.phase, "Failed");
    assert!(
        status.error.len() < 64 * 1024 && status.error.contains(" more"),
        "the status holds the first problems and how many more: {} bytes",
        status.error.len()
    );
    // Recorded: not judged again.
    let again = syncer.sync().await.expect("sync");
    assert!(matches!(again, Outcome::Unchanged), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_commit_fanning_one_file_out_past_the_budget_is_refused_and_the_last_good_one_stays()
 {
    let (_cluster, client) = common::start().await;
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(common::manifests::NAMESPACE)),
            (
                "marker.yaml",
                Some(&common::manifests::config_map("marker", "good")),
            ),
        ],
        "Good",
    );
    let mut syncer = common::syncer(&client, repo.path()).await;
    expect_applied(&mut syncer, "good").await.expect("good");
    // A few kilobytes in Git: one 256 KiB ConfigMap at 4,096 paths, 1 GiB to parse.
    let big = common::manifests::config_map("big", &"x".repeat(256 * 1024));
    repo.commit_fan_out(
        "main",
        "fan",
        big.as_bytes(),
        (8, 4),
        &["m.yaml"],
        "Fan out",
    );
    let outcome = syncer.sync().await.expect("the rejection is recorded");
    let Outcome::Rejected { errors, .. } = &outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        // The 256th file passes 64 MiB; the 3,840 after it are not read.
        errors[0].starts_with(
            "fan/d0/d3/d7/d7/m.yaml: the manifest files reach more than 67108864 bytes"
        ),
        "{errors:?}"
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    let marker = maps
        .get("marker")
        .await
        .expect("the last good commit stays");
    assert_eq!(marker.data.expect("data")["value"], "good");
}
