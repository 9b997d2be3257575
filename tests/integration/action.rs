//! The GitHub Action's scripts, run as a pull-request workflow runs them: `action/plan.sh`
//! with GitHub's variables set by the test, the capstan under test, and a stand-in for
//! GitHub's REST API on loopback that records the comments and commit statuses the script
//! posts; `action/install.sh` against a stand-in release host on loopback serving capstan's
//! release archives and their SHA256SUMS.

use crate::common;
use crate::fleet;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::IntoResponse;
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
/// (answering with `existing`), posting, editing and deleting comments, and setting commit
/// statuses.
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
    fn comment_writes(&self) -> Vec<Request> {
        self.writes_to("/comments")
    }

    /// The commit statuses set.
    fn statuses(&self) -> Vec<Request> {
        self.writes_to("/statuses/")
    }

    fn writes_to(&self, resource: &str) -> Vec<Request> {
        let requests = self.requests.lock().unwrap();
        requests
            .iter()
            .filter(|r| r.method != "GET" && r.path.contains(resource))
            .cloned()
            .collect()
    }
}

/// The pull request's head commit, as the event payload names it.
const HEAD_SHA: &str = "4f1c0de5ba5eba11c0ffee4f1c0de5ba5eba11c0";

/// The merge commit GitHub checks out for a pull request (GITHUB_SHA), which is not the
/// commit the pull request's page shows statuses of.
const MERGE_SHA: &str = "0000000000000000000000000000000000000042";

/// The status the plan sets on the head commit, checked against `state` and `description`.
fn assert_status(api: &GitHubApi, state: &str, description: &str) {
    let statuses = api.statuses();
    assert_eq!(statuses.len(), 1, "{statuses:#?}");
    let status = &statuses[0];
    assert_eq!(
        (status.method.as_str(), status.path.as_str()),
        (
            "POST",
            format!("/repos/acme/fleet/statuses/{HEAD_SHA}").as_str()
        )
    );
    assert_eq!(status.authorization, "Bearer test-token");
    assert_eq!(
        status.body,
        json!({
            "state": state,
            "context": "capstan/plan",
            "description": description,
            "target_url": "https://github.example/acme/fleet/actions/runs/4711",
        })
    );
}

/// What a run of the script left: its output, the step summary and the step outputs.
struct Run {
    output: Output,
    summary: String,
    outputs: String,
}

/// Runs `action/plan.sh` with the capstan under test on `repo` for pull request #42 of
/// acme/fleet, commenting and setting the commit status.
async fn run_action(repo: &Path, api: &GitHubApi) -> Run {
    run_action_with(Path::new(env!("CARGO_BIN_EXE_capstan")), repo, api).await
}

/// Runs `action/plan.sh` with the `capstan` binary given, as [`run_action`] does.
async fn run_action_with(capstan: &Path, repo: &Path, api: &GitHubApi) -> Run {
    let github = tempfile::tempdir().expect("tempdir");
    let event = github.path().join("event.json");
    std::fs::write(
        &event,
        json!({
            "action": "synchronize",
            "number": 42,
            "pull_request": {"number": 42, "head": {"sha": HEAD_SHA}},
        })
        .to_string(),
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
        .env("CAPSTAN_BIN", capstan)
        .env("CAPSTAN_REPO_PATH", repo)
        .env("CAPSTAN_PATH", "fleet")
        .env("CAPSTAN_BRANCH", "")
        .env("CAPSTAN_COMMENT", "true")
        .env("CAPSTAN_STATUS", "true")
        .env("GITHUB_TOKEN", "test-token")
        .env("GITHUB_API_URL", format!("http://{}", api.address))
        .env("GITHUB_SERVER_URL", "https://github.example")
        .env("GITHUB_RUN_ID", "4711")
        .env("GITHUB_SHA", MERGE_SHA)
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

    let writes = api.comment_writes();
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
    assert_status(
        &api,
        "success",
        "0 to create, 2 to configure, 0 to prune; 1 node upgrade \
         (worker-1: kmm-demo/my-kmod v1 → v2)",
    );
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
    let writes = api.comment_writes();
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
    assert_status(&api, "success", "No changes.");
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
    // The comment still tells the author what to fix, and the status fails the commit.
    assert_eq!(api.comment_writes().len(), 1);
    // The summary line, cut to the 140 characters a status description may hold.
    let description = "1 error: head would be rejected; 0 to create, 3 to configure, 0 to prune; \
                       2 node upgrades (worker-1: kmm-demo/my-kmod v1 → v2, worker-2: km…";
    assert_eq!(description.chars().count(), 140);
    assert_status(&api, "failure", description);
}

/// A release host as GitHub serves release downloads: each file at its path, 404 else.
struct ReleaseHost {
    address: SocketAddr,
}

/// Where the stand-in host serves capstan's releases, as GitHub does for an action's
/// repository (`<server>/<owner>/<name>/releases/download`).
const RELEASES: &str = "/capstan-dev/capstan/releases/download";

impl ReleaseHost {
    /// Serves `files`, each named by its path under [`RELEASES`] (`v0.1.0/SHA256SUMS`).
    async fn start(files: Vec<(String, Vec<u8>)>) -> ReleaseHost {
        let files: Arc<HashMap<String, Bytes>> = Arc::new(
            files
                .into_iter()
                .map(|(name, body)| (format!("{RELEASES}/{name}"), Bytes::from(body)))
                .collect(),
        );
        let app = Router::new().fallback(move |uri: Uri| {
            let files = files.clone();
            async move {
                match files.get(uri.path()) {
                    Some(body) => (StatusCode::OK, body.clone()).into_response(),
                    None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        ReleaseHost { address }
    }

    /// The `release-url` of the action for this host.
    fn url(&self) -> String {
        format!("http://{}{RELEASES}", self.address)
    }
}

/// The version the action downloads: the workspace's, as the action's Cargo.toml has it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The name of this machine's release archive, as the release workflow names it.
fn asset() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("capstan is not released for {other}"),
    };
    format!("capstan-v{VERSION}-linux-{arch}.tar.gz")
}

/// A release archive holding `binary` as `capstan`, as the release workflow packs it.
fn release_archive(binary: &[u8]) -> Vec<u8> {
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut archive = tar::Builder::new(encoder);
    let mut header = tar::Header::new_gnu();
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    archive
        .append_data(&mut header, "capstan", binary)
        .expect("append capstan");
    archive.into_inner().expect("tar").finish().expect("gzip")
}

/// The SHA256SUMS line of `file` named `name`, as `sha256sum` writes it.
fn sha256sum_line(file: &[u8], name: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, file);
    let hex: String = digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{hex}  {name}\n")
}

/// A capstan that leaves `marker` behind when it is run at all.
fn telltale_binary(marker: &Path) -> Vec<u8> {
    format!("#!/bin/sh\ntouch '{}'\n", marker.display()).into_bytes()
}

/// What a run of `action/install.sh` left: its output and the folder it installs into.
struct Install {
    output: Output,
    dir: tempfile::TempDir,
}

impl Install {
    fn code(&self) -> Option<i32> {
        self.output.status.code()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// The binary's path as the script printed it.
    fn printed_path(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout)
            .trim()
            .to_string()
    }

    fn installed(&self) -> bool {
        self.dir.path().join("capstan").exists()
    }
}

/// Runs `action/install.sh` from this checkout (so its Cargo.toml names the version) with
/// the variables `env` sets, and no others of the action's.
async fn run_install(env: &[(&str, String)]) -> Install {
    let dir = tempfile::tempdir().expect("install dir");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("action/install.sh");
    let mut command = Command::new("bash");
    command
        .arg(script)
        .env("CAPSTAN_INSTALL_DIR", dir.path())
        .env_remove("CAPSTAN_RELEASE_URL")
        .env_remove("CAPSTAN_ACTION_REPOSITORY")
        .env_remove("GITHUB_ACTION_REPOSITORY")
        .env_remove("GITHUB_ACTION_PATH")
        .env_remove("GITHUB_SERVER_URL");
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output().expect("run bash"))
        .await
        .expect("script");
    Install { output, dir }
}

#[tokio::test]
async fn the_released_binary_is_verified_installed_and_plans() {
    let binary = std::fs::read(env!("CARGO_BIN_EXE_capstan")).expect("capstan under test");
    let archive = release_archive(&binary);
    let sums = format!(
        "{}{}",
        sha256sum_line(b"another platform", "capstan-v0.0.0-linux-riscv.tar.gz"),
        sha256sum_line(&archive, &asset())
    );
    let host = ReleaseHost::start(vec![
        (format!("v{VERSION}/{}", asset()), archive),
        (format!("v{VERSION}/SHA256SUMS"), sums.into_bytes()),
    ])
    .await;

    // The release URL by default: the releases of the action's repository on its server.
    let install = run_install(&[
        ("GITHUB_SERVER_URL", format!("http://{}", host.address)),
        ("GITHUB_ACTION_REPOSITORY", "capstan-dev/capstan".into()),
    ])
    .await;
    assert_eq!(install.code(), Some(0), "{}", install.stderr());
    let installed = install.dir.path().join("capstan");
    assert_eq!(install.printed_path(), installed.display().to_string());
    assert_eq!(std::fs::read(&installed).expect("installed"), binary);
    assert!(
        install
            .stderr()
            .contains(&format!("installed capstan v{VERSION}")),
        "{}",
        install.stderr()
    );

    let api = GitHubApi::start(json!([])).await;
    let fleet = checkout(&fleet_v1(), &fleet_v2());
    let run = run_action_with(&installed, fleet.path(), &api).await;
    let stderr = String::from_utf8_lossy(&run.output.stderr);
    assert_eq!(run.output.status.code(), Some(0), "{stderr}");
    assert_eq!(run.outputs, "has-changes=true\nexit-code=2\n");
}

#[tokio::test]
async fn a_download_whose_checksum_differs_fails_naming_both_sums_and_is_not_run() {
    let marker_dir = tempfile::tempdir().expect("tempdir");
    let marker = marker_dir.path().join("ran");
    let archive = release_archive(&telltale_binary(&marker));
    let published = sha256sum_line(b"the archive the release workflow built", &asset());
    let host = ReleaseHost::start(vec![
        (format!("v{VERSION}/{}", asset()), archive.clone()),
        (
            format!("v{VERSION}/SHA256SUMS"),
            published.clone().into_bytes(),
        ),
    ])
    .await;

    let install = run_install(&[("CAPSTAN_RELEASE_URL", host.url())]).await;
    assert_eq!(install.code(), Some(4), "{}", install.stderr());
    let expected = published.split_whitespace().next().expect("sum");
    let actual = sha256sum_line(&archive, &asset());
    let actual = actual.split_whitespace().next().expect("sum");
    let stderr = install.stderr();
    assert!(
        stderr.contains(&format!(
            "checksum mismatch for {}: SHA256SUMS says {expected}, the download is {actual}",
            asset()
        )),
        "{stderr}"
    );
    assert_eq!(install.printed_path(), "");
    assert!(!install.installed());
    assert!(!marker.exists(), "the tampered capstan was run");
}

#[tokio::test]
async fn a_download_missing_from_the_checksums_fails_and_is_not_run() {
    let marker_dir = tempfile::tempdir().expect("tempdir");
    let marker = marker_dir.path().join("ran");
    let archive = release_archive(&telltale_binary(&marker));
    let other = sha256sum_line(&archive, "capstan-v0.0.0-linux-riscv.tar.gz");
    let cases = [
        ("listed under another name", Some(other)),
        ("no SHA256SUMS at all", None),
    ];
    for (case, sums) in cases {
        let mut files = vec![(format!("v{VERSION}/{}", asset()), archive.clone())];
        if let Some(sums) = sums {
            files.push((format!("v{VERSION}/SHA256SUMS"), sums.into_bytes()));
        }
        let host = ReleaseHost::start(files).await;
        let install = run_install(&[("CAPSTAN_RELEASE_URL", host.url())]).await;
        assert_eq!(install.code(), Some(4), "{case}: {}", install.stderr());
        assert!(
            install.stderr().contains(&asset()),
            "{case}: {}",
            install.stderr()
        );
        assert!(!install.installed(), "{case}");
        assert!(!marker.exists(), "{case}: the unverified capstan was run");
    }
}

#[tokio::test]
async fn without_a_release_the_action_falls_back_to_building() {
    let empty = ReleaseHost::start(Vec::new()).await;
    // A port nothing listens on: the listener is closed before the script connects.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port");
    let cases = [
        ("no release of this version", empty.url()),
        (
            "the host refuses connections",
            format!("http://{closed}/releases"),
        ),
    ];
    for (case, url) in cases {
        let install = run_install(&[("CAPSTAN_RELEASE_URL", url)]).await;
        assert_eq!(install.code(), Some(3), "{case}: {}", install.stderr());
        assert!(
            install.stderr().contains(&format!(
                "{} of release v{VERSION} is not available",
                asset()
            )),
            "{case}: {}",
            install.stderr()
        );
        assert!(!install.installed(), "{case}");
    }
}
