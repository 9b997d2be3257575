//! The GitHub Action's script, `action/plan.sh`, run as a pull-request workflow runs it:
//! GitHub's variables set by the test, the capstan under test, and a stand-in for GitHub's
//! REST API on loopback that records the comments the script posts.

use crate::common;
use crate::fleet;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use common::git::{FleetRepo, with_changes};
use common::manifests::node_label;
use fleet::{fleet_v1, fleet_v2};
use serde_json::{Value, json};

/// One request the stand-in API received.
#[derive(Clone, Debug)]
struct Request {
    method: String,
    path: String,
    authorization: String,
    body: Value,
}

/// GitHub's REST API as far as the script uses it: listing a pull request's comments
/// (answering with `existing`), and posting, editing and deleting comments.
struct GitHubApi {
    address: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl GitHubApi {
    async fn start(existing: Value) -> GitHubApi {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let (recorded, existing) = (recorded.clone(), existing.clone());
                async move {
                    let authorization = headers
                        .get(header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    recorded.lock().unwrap().push(Request {
                        method: method.to_string(),
                        path: uri.path().to_string(),
                        authorization,
                        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    });
                    let (status, answer) = match method {
                        Method::GET if uri.query().unwrap_or("").contains("page=1") => {
                            (StatusCode::OK, existing)
                        }
                        Method::GET => (StatusCode::OK, json!([])),
                        Method::POST => (StatusCode::CREATED, json!({"id": 100})),
                        Method::DELETE => (StatusCode::NO_CONTENT, Value::Null),
                        _ => (StatusCode::OK, json!({})),
                    };
                    (
                        status,
                        [(header::CONTENT_TYPE, "application/json")],
                        answer.to_string(),
                    )
                }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        GitHubApi { address, requests }
    }

    /// The requests that changed comments (not the listing).
    fn writes(&self) -> Vec<Request> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|r| r.method != "GET")
            .cloned()
            .collect()
    }
}

/// What a run of the script left: its output, the step summary and the step outputs.
struct Run {
    output: Output,
    summary: String,
    outputs: String,
}

/// Runs `action/plan.sh` on `repo` for pull request #42 of acme/fleet, commenting.
async fn run_action(repo: &Path, api: &GitHubApi) -> Run {
    let github = tempfile::tempdir().expect("tempdir");
    let event = github.path().join("event.json");
    std::fs::write(
        &event,
        json!({"action": "synchronize", "number": 42, "pull_request": {"number": 42}}).to_string(),
    )
    .expect("event");
    let (summary, outputs) = (
        github.path().join("summary.md"),
        github.path().join("output"),
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("action/plan.sh");
    let mut command = Command::new("bash");
    command
        .arg(script)
        .current_dir(repo)
        .env("CAPSTAN_BIN", env!("CARGO_BIN_EXE_capstan"))
        .env("CAPSTAN_REPO_PATH", repo)
        .env("CAPSTAN_PATH", "fleet")
        .env("CAPSTAN_BRANCH", "")
        .env("CAPSTAN_COMMENT", "true")
        .env("GITHUB_TOKEN", "test-token")
        .env("GITHUB_API_URL", format!("http://{}", api.address))
        .env("GITHUB_REPOSITORY", "acme/fleet")
        .env("GITHUB_BASE_REF", "main")
        .env("GITHUB_EVENT_PATH", &event)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .env("GITHUB_OUTPUT", &outputs);
    let output = tokio::task::spawn_blocking(move || command.output().expect("run bash"))
        .await
        .expect("script");
    let read = |file: &Path| std::fs::read_to_string(file).unwrap_or_default();
    Run {
        summary: read(&summary),
        outputs: read(&outputs),
        output,
    }
}

/// A pull request's checkout: HEAD on the proposal, the base branch only as origin/main.
fn checkout(base: &[(&str, String)], head: &[(&str, String)]) -> FleetRepo {
    let fleet = FleetRepo::proposal(base, head);
    let main = fleet.git.refname_to_id("refs/heads/main").expect("main");
    fleet
        .git
        .reference("refs/remotes/origin/main", main, true, "fetched")
        .expect("origin/main");
    fleet
        .git
        .find_reference("refs/heads/main")
        .expect("main")
        .delete()
        .expect("no local main");
    fleet
}

#[tokio::test]
async fn a_pull_request_with_changes_gets_the_plan_as_a_comment() {
    let api = GitHubApi::start(json!([{"id": 1, "body": "Looks good to me"}])).await;
    let fleet = checkout(&fleet_v1(), &fleet_v2());
    let run = run_action(fleet.path(), &api).await;
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    assert_eq!(run.output.status.code(), Some(0), "{stderr}");
    assert_eq!(run.outputs, "has-changes=true\nexit-code=2\n");
    assert!(
        run.summary.starts_with(
            "**capstan plan**: 0 to create, 2 to configure, 0 to prune; 1 node upgrade \
             (worker-1: kmm-demo/my-kmod v1 → v2)"
        ),
        "{}",
        run.summary
    );
    assert!(
        run.summary.contains("pull request \\#42"),
        "{}",
        run.summary
    );

    let writes = api.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    let posted = &writes[0];
    assert_eq!(
        (posted.method.as_str(), posted.path.as_str()),
        ("POST", "/repos/acme/fleet/issues/42/comments")
    );
    assert_eq!(posted.authorization, "Bearer test-token");
    let body = posted.body["body"].as_str().expect("comment body");
    assert!(
        body.starts_with("<!-- capstan-plan -->\n**capstan plan**: "),
        "{body}"
    );
    assert!(body.contains("<details><summary>"), "{body}");
}

#[tokio::test]
async fn a_pull_request_without_changes_updates_the_earlier_comment() {
    let api = GitHubApi::start(json!([
        {"id": 1, "body": "Looks good to me"},
        {"id": 7, "body": "<!-- capstan-plan -->\n**capstan plan**: 1 to create"},
    ]))
    .await;
    let head = with_changes(&fleet_v1(), &[("README.md", Some("# the fleet".into()))]);
    let fleet = checkout(&fleet_v1(), &head);
    let run = run_action(fleet.path(), &api).await;
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    assert_eq!(run.output.status.code(), Some(0), "{stderr}");
    assert_eq!(run.outputs, "has-changes=false\nexit-code=0\n");
    assert!(
        run.summary.starts_with("**capstan plan**: No changes."),
        "{}",
        run.summary
    );
    let writes = api.writes();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].method.as_str(), writes[0].path.as_str()),
        ("PATCH", "/repos/acme/fleet/issues/comments/7")
    );
    let body = writes[0].body["body"].as_str().expect("comment body");
    assert!(
        body.starts_with("<!-- capstan-plan -->\n**capstan plan**: No changes.\n"),
        "{body}"
    );
}

#[tokio::test]
async fn an_invalid_pull_request_fails_the_step_with_its_errors_in_the_summary() {
    let api = GitHubApi::start(json!([])).await;
    let head = with_changes(
        &fleet_v2(),
        &[(
            "fleet/nodes/worker-2.yaml",
            Some(node_label("worker-2", "my-kmod", "v3")),
        )],
    );
    let fleet = checkout(&fleet_v1(), &head);
    let run = run_action(fleet.path(), &api).await;
    assert_eq!(run.output.status.code(), Some(1));
    assert_eq!(run.outputs, "has-changes=false\nexit-code=1\n");
    assert!(
        run.summary
            .contains("fleet/nodes/worker-2.yaml:1: metadata.labels"),
        "{}",
        run.summary
    );
    // The comment still tells the author what to fix.
    assert_eq!(api.writes().len(), 1);
}
