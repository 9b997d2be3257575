//! `requirePullRequest` that means it: with `spec.pullRequests.proof: github`, a commit
//! counts as merged through a pull request only when GitHub's API (here a loopback stand-in
//! that records every request) names the pull request it merged, never by its subject; the
//! admin's `require` holds whatever the repository says; and GitHub being down holds the
//! sync rather than guessing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::common;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use capstan::sync::run::{Outcome, SyncError, SyncOptions, Syncer};
use capstan_api::GitSync;
use capstan_api::capstan::SYSTEM_NAMESPACE;
use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// GitHub's `GET /repos/{owner}/{name}/commits/{sha}/pulls`, as a test sets it.
#[derive(Default)]
struct FakeGitHub {
    /// The pull requests GitHub associates with each commit.
    pulls: HashMap<String, Vec<Value>>,
    /// Answer 502, as GitHub does when it is down.
    down: bool,
    /// Every request: its path and its `Authorization` header.
    requests: Vec<(String, String)>,
}

type Shared = Arc<Mutex<FakeGitHub>>;

async fn pulls(
    State(github): State<Shared>,
    Path((owner, name, sha)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> (StatusCode, String) {
    let mut github = github.lock().expect("lock");
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    github
        .requests
        .push((format!("/repos/{owner}/{name}/commits/{sha}/pulls"), auth));
    if github.down {
        return (
            StatusCode::BAD_GATEWAY,
            "{\"message\":\"Server Error\"}".into(),
        );
    }
    if (owner.as_str(), name.as_str()) != ("acme", "fleet") {
        return (StatusCode::NOT_FOUND, "{\"message\":\"Not Found\"}".into());
    }
    let found = github.pulls.get(&sha).cloned().unwrap_or_default();
    (StatusCode::OK, Value::Array(found).to_string())
}

/// Serves the fake on a free loopback port; its base URL.
async fn serve(github: Shared) -> String {
    let app = axum::Router::new()
        .route("/repos/{owner}/{name}/commits/{sha}/pulls", get(pulls))
        .with_state(github);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

fn merged(number: u64, sha: &str) -> Value {
    json!({"number": number, "merged_at": "2026-12-02T07:00:00Z", "merge_commit_sha": sha,
           "base": {"ref": "main"}, "state": "closed"})
}

fn pull_request_annotation(map: &ConfigMap) -> Option<String> {
    map.metadata
        .annotations
        .as_ref()?
        .get(capstan_api::labels::PULL_REQUEST_ANNOTATION)
        .cloned()
}

async fn status(client: &kube::Client) -> capstan_api::GitSyncStatus {
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    syncs
        .get("capstan")
        .await
        .expect("GitSync")
        .status
        .expect("status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_pull_request_github_says_merged_the_commit_counts_and_github_down_holds_the_sync() {
    let (_cluster, client) = common::start().await;
    let github: Shared = Arc::default();
    let api = serve(github.clone()).await;

    let mut repo = FleetRepo::new();
    let first = repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "Initial fleet",
    );
    let state = tempfile::tempdir().expect("state");
    let source = capstan::sync::source::Source::open(
        repo.path().to_str().expect("utf-8"),
        "main",
        None,
        state.path(),
        capstan::sync::source::Auth::None,
    )
    .expect("source");
    let options = SyncOptions {
        github_token: Some("t0ken".into()),
        ..SyncOptions::default()
    };
    let metrics = Arc::new(capstan::sync::metrics::Metrics::new());
    let mut syncer = Syncer::start(client.clone(), source, options, metrics)
        .await
        .expect("syncer");
    // The cluster's admin: GitHub decides, and pull requests are required whatever the
    // repository's capstan.yaml says.
    let syncs: Api<GitSync> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    syncs
        .patch(
            "capstan",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"pullRequests": {
                "proof": "github", "repository": "acme/fleet", "apiURL": api, "require": true,
            }}})),
        )
        .await
        .expect("the admin sets the proof");

    let outcome = syncer.sync().await.expect("sync");
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    let applied = status(&client).await;
    assert_eq!(applied.last_applied_commit.expect("applied").sha, first);
    assert!(applied.policy.expect("policy").require_pull_request);

    // Pushed straight to the branch with a squash-like subject: GitHub knows no pull
    // request that merged it.
    let direct = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "b")))],
        "Bump settings (#7)",
    );
    let outcome = syncer.sync().await.expect("sync");
    assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    let applied = status(&client).await.last_applied_commit.expect("applied");
    assert_eq!(
        (applied.sha.as_str(), applied.pull_request),
        (direct.as_str(), None)
    );
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    assert_eq!(
        pull_request_annotation(&maps.get("settings").await.expect("map")),
        None
    );

    // Merged through pull request 9: GitHub says so.
    let merge = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "c")))],
        "Merge pull request #9 from acme/bump",
    );
    github
        .lock()
        .expect("lock")
        .pulls
        .insert(merge.clone(), vec![merged(9, &merge)]);
    syncer.sync().await.expect("sync");
    let applied = status(&client).await.last_applied_commit.expect("applied");
    assert_eq!(
        (applied.sha.as_str(), applied.pull_request),
        (merge.as_str(), Some(9))
    );
    assert_eq!(
        pull_request_annotation(&maps.get("settings").await.expect("map")).as_deref(),
        Some("9")
    );

    // GitHub down: nothing applies on a guess; once it answers, the commit applies.
    github.lock().expect("lock").down = true;
    let next = repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "d")))],
        "Merge pull request #10 from acme/more",
    );
    let error = syncer.sync().await.expect_err("GitHub is down");
    assert!(
        matches!(&error, SyncError::Proof(_)) && error.to_string().contains("502"),
        "{error}"
    );
    assert!(!error.to_string().contains("t0ken"), "{error}");
    let failed = status(&client).await;
    assert_eq!(failed.phase, "Failed");
    assert!(
        failed
            .error
            .contains("asking GitHub which pull request merged"),
        "{}",
        failed.error
    );
    let settings = maps.get("settings").await.expect("map");
    assert_eq!(
        settings.data.expect("data")["value"],
        "c",
        "nothing applied"
    );
    {
        let mut github = github.lock().expect("lock");
        github.down = false;
        github.pulls.insert(next.clone(), vec![merged(10, &next)]);
    }
    syncer.sync().await.expect("sync");
    let applied = status(&client).await.last_applied_commit.expect("applied");
    assert_eq!(
        (applied.sha.as_str(), applied.pull_request),
        (next.as_str(), Some(10))
    );

    let requests = github.lock().expect("lock").requests.clone();
    assert!(
        requests.iter().all(
            |(path, auth)| path.starts_with("/repos/acme/fleet/commits/") && auth == "Bearer t0ken"
        ),
        "{requests:?}"
    );
    // One question per commit applied, one more for the one asked while GitHub was down.
    assert_eq!(requests.len(), 5, "{requests:?}");
}
