//! The replay of commits since the applied one: which commits are accepted, which is
//! rejected, and which commit each object's stamps name.

use super::*;
use crate::sync::manifests::StaticCatalog;
use capstan_testing::manifests::{config_map, module, node_label};

/// A fleet: the Module's version, then each of three nodes' labels, then the ConfigMap.
fn fleet(module_version: &str, labels: [&str; 3], setting: &str) -> Vec<RepoFile> {
    let mut files = vec![
        file("cm.yaml", &config_map("settings", setting)),
        file("module.yaml", &module("my-kmod", module_version)),
    ];
    for (i, version) in labels.iter().enumerate() {
        let name = format!("worker-{}", i + 1);
        files.push(file(
            &format!("nodes/{name}.yaml"),
            &node_label(&name, "my-kmod", version),
        ));
    }
    files
}

fn file(path: &str, text: &str) -> RepoFile {
    RepoFile {
        path: path.to_string(),
        contents: text.as_bytes().into(),
    }
}

fn commit(sha: &str, pull_request: Option<u64>) -> CommitInfo {
    CommitInfo {
        sha: sha.to_string(),
        branch: "main".into(),
        author: "Ada".into(),
        email: "ada@example.com".into(),
        time: jiff::Timestamp::UNIX_EPOCH,
        subject: format!("commit {sha}"),
        pull_request,
    }
}

fn accepted(files: &[RepoFile]) -> DesiredState {
    load_accepted(files, "", &StaticCatalog::new()).expect("valid")
}

fn run(previous: Option<&DesiredState>, commits: Vec<(&str, Vec<RepoFile>)>) -> Replay {
    let landed = commits
        .into_iter()
        .enumerate()
        .map(|(i, (sha, files))| Landed {
            commit: commit(sha, Some(i as u64 + 10)),
            files: Ok(files),
        });
    replay(
        previous,
        landed,
        "",
        &StaticCatalog::new(),
        &Reach::default(),
    )
}

/// `changed_by` as (object name, sha) pairs.
fn attributed(replay: &Replay) -> Vec<(String, String)> {
    replay
        .changed_by
        .iter()
        .map(|(id, c)| (id.name.clone(), c.sha.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn a_restored_predecessor_is_not_judged_again() {
    // Mid-upgrade: the Module is at v2 and two nodes still carry v1. Judged alone this
    // commit fails (each label must name v2), yet it was accepted after the bump.
    let mid = fleet("v2", ["v2", "v1", "v1"], "a");
    assert!(judge(None, &mid, "", &StaticCatalog::new(), &Reach::default()).is_err());
    let restored = accepted(&mid);
    let next = fleet("v2", ["v2", "v2", "v1"], "a");
    let replay = run(Some(&restored), vec![("c3", next)]);
    assert_eq!(replay.rejected, None);
    assert_eq!(replay.accepted.as_ref().expect("accepted").commit.sha, "c3");
    assert_eq!(attributed(&replay), pairs(&[("worker-2", "c3")]));
}

/// One row per story: the commits that landed since the applied one, and what the replay
/// makes of them.
#[test]
fn each_object_is_attributed_to_the_commit_that_last_changed_it() {
    struct Row {
        story: &'static str,
        commits: Vec<(&'static str, Vec<RepoFile>)>,
        accepted: Option<&'static str>,
        rejected: bool,
        attributed: &'static [(&'static str, &'static str)],
    }
    let start = fleet("v2", ["v1", "v1", "v1"], "a");
    let broken = {
        let mut files = fleet("v2", ["v1", "v2", "v1"], "a");
        files.push(file("broken.yaml", "kind: [unclosed\n"));
        files
    };
    let rows = [
        Row {
            story: "one commit, as a sync that saw every commit",
            commits: vec![("c1", fleet("v2", ["v2", "v1", "v1"], "a"))],
            accepted: Some("c1"),
            rejected: false,
            attributed: &[("worker-1", "c1")],
        },
        Row {
            story: "a relabel, then a commit changing only a ConfigMap, while capstan was down",
            commits: vec![
                ("c1", fleet("v2", ["v2", "v1", "v1"], "a")),
                ("c2", fleet("v2", ["v2", "v1", "v1"], "b")),
            ],
            accepted: Some("c2"),
            rejected: false,
            attributed: &[("settings", "c2"), ("worker-1", "c1")],
        },
        Row {
            story: "two relabels in two commits",
            commits: vec![
                ("c1", fleet("v2", ["v2", "v1", "v1"], "a")),
                ("c2", fleet("v2", ["v2", "v2", "v1"], "a")),
            ],
            accepted: Some("c2"),
            rejected: false,
            attributed: &[("worker-1", "c1"), ("worker-2", "c2")],
        },
        Row {
            story: "a move back to the old version is rejected; the node keeps its last valid move",
            commits: vec![
                ("c1", fleet("v2", ["v2", "v1", "v1"], "a")),
                ("c2", fleet("v2", ["v1", "v1", "v1"], "b")),
                ("c3", fleet("v2", ["v2", "v1", "v1"], "b")),
            ],
            accepted: Some("c3"),
            rejected: false,
            attributed: &[("settings", "c3"), ("worker-1", "c1")],
        },
        Row {
            story: "a node released by one commit keeps that commit when the next changes a ConfigMap",
            commits: vec![
                (
                    "c1",
                    fleet("v2", ["v1", "v1", "v1"], "a")
                        .into_iter()
                        .filter(|f| f.path != "nodes/worker-3.yaml")
                        .collect(),
                ),
                (
                    "c2",
                    fleet("v2", ["v1", "v1", "v1"], "b")
                        .into_iter()
                        .filter(|f| f.path != "nodes/worker-3.yaml")
                        .collect(),
                ),
            ],
            accepted: Some("c2"),
            rejected: false,
            attributed: &[("settings", "c2"), ("worker-3", "c1")],
        },
        Row {
            story: "a commit that changes nothing under the path changes no stamp",
            commits: vec![
                ("c1", fleet("v2", ["v2", "v1", "v1"], "a")),
                ("c2", fleet("v2", ["v2", "v1", "v1"], "a")),
            ],
            accepted: Some("c2"),
            rejected: false,
            attributed: &[("worker-1", "c1")],
        },
        Row {
            story: "a rejected commit's change is asked for by the next valid commit",
            commits: vec![
                ("c1", broken.clone()),
                ("c2", fleet("v2", ["v1", "v2", "v1"], "b")),
            ],
            accepted: Some("c2"),
            rejected: false,
            attributed: &[("settings", "c2"), ("worker-2", "c2")],
        },
        Row {
            story: "a valid commit before a rejected head is the one to apply",
            commits: vec![("c1", fleet("v2", ["v2", "v1", "v1"], "a")), ("c2", broken)],
            accepted: Some("c1"),
            rejected: true,
            attributed: &[("worker-1", "c1")],
        },
        Row {
            story: "a label moving to a version the Module does not declare is rejected",
            commits: vec![("c1", fleet("v2", ["v3", "v1", "v1"], "a"))],
            accepted: None,
            rejected: true,
            attributed: &[],
        },
    ];
    let previous = accepted(&start);
    for row in rows {
        let replay = run(Some(&previous), row.commits);
        assert_eq!(
            replay.accepted.as_ref().map(|a| a.commit.sha.as_str()),
            row.accepted,
            "{}: accepted",
            row.story
        );
        assert_eq!(replay.rejected.is_some(), row.rejected, "{}", row.story);
        assert_eq!(attributed(&replay), pairs(row.attributed), "{}", row.story);
    }
}

#[test]
fn the_heads_unreadable_files_reject_it() {
    let previous = accepted(&fleet("v2", ["v1", "v1", "v1"], "a"));
    let landed = vec![
        Landed {
            commit: commit("c1", None),
            files: Ok(fleet("v2", ["v2", "v1", "v1"], "a")),
        },
        Landed {
            commit: commit("c2", None),
            files: Err(SourceError::PathNotFound {
                repo: "fleet".into(),
                path: "clusters/prod".into(),
                commit: "c2".into(),
            }),
        },
    ];
    let replay = replay(
        Some(&previous),
        landed,
        "",
        &StaticCatalog::new(),
        &Reach::default(),
    );
    assert_eq!(replay.accepted.map(|a| a.commit.sha), Some("c1".into()));
    let errors = replay.rejected.expect("rejected");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("clusters/prod"), "{errors:?}");
}

#[test]
fn without_a_predecessor_every_object_is_the_heads() {
    let replay = run(None, vec![("c1", fleet("v1", ["v1", "v1", "v1"], "a"))]);
    assert_eq!(replay.changed_by.len(), 5);
    assert!(replay.changed_by.values().all(|c| c.sha == "c1"));
}
