//! The `capstan sync` process: `--once` exit codes and what a converged `--once` says of the
//! moves a campaign holds, a remote followed through signed GitHub webhooks (a forged one
//! refused), and a clean stop on SIGTERM.

use crate::common;
use crate::upgrade;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use ring::hmac;

const SECRET: &str = "fleet webhook secret";

fn capstan() -> Command {
    Command::new(env!("CARGO_BIN_EXE_capstan"))
}

/// Runs `capstan sync --once` against the cluster; returns the exit code and stderr.
fn sync_once(
    repo: &std::path::Path,
    kubeconfig: &std::path::Path,
    state: &std::path::Path,
) -> (i32, String) {
    sync_once_with(repo, kubeconfig, state, &[])
}

/// `capstan sync --once` with more arguments.
fn sync_once_with(
    repo: &std::path::Path,
    kubeconfig: &std::path::Path,
    state: &std::path::Path,
    more: &[&str],
) -> (i32, String) {
    let output = capstan()
        .args(["sync", "--once", "--repo"])
        .arg(repo)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--state-dir")
        .arg(state)
        .args(more)
        .output()
        .expect("capstan runs");
    (
        output.status.code().expect("exit code"),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn write_kubeconfig(cluster: &common::TestCluster, dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, cluster.kubeconfig()).expect("kubeconfig");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_exits_0_when_applied_and_1_when_the_commit_is_rejected() {
    let (cluster, _client) = common::start().await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(&cluster, state.path());
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "First",
    );
    let (code, stderr) = tokio::task::spawn_blocking({
        let (repo, kubeconfig, state) = (
            repo.path().to_path_buf(),
            kubeconfig.clone(),
            state.path().to_path_buf(),
        );
        move || sync_once(&repo, &kubeconfig, &state)
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("2 created"), "{stderr}");

    let typo = common::manifests::module("my-kmod", "v1").replace("moduleName:", "moduleNmae:");
    repo.commit(&[("module.yaml", Some(&typo))], "Typo");
    let (code, stderr) = tokio::task::spawn_blocking({
        let (repo, kubeconfig, state) = (
            repo.path().to_path_buf(),
            kubeconfig.clone(),
            state.path().to_path_buf(),
        );
        move || sync_once(&repo, &kubeconfig, &state)
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(
            "module.yaml:13: spec.moduleLoader.container.modprobe.moduleNmae: unknown field"
        ),
        "{stderr}"
    );

    // 1,000 problems: the log names the first 100, as the status does, and counts the rest.
    let bad = "a: 1\n---\n".repeat(1_000);
    repo.commit(&[("module.yaml", None), ("bad.yaml", Some(&bad))], "Many");
    let (code, stderr) = tokio::task::spawn_blocking({
        let (repo, kubeconfig, state) = (
            repo.path().to_path_buf(),
            kubeconfig.clone(),
            state.path().to_path_buf(),
        );
        move || sync_once(&repo, &kubeconfig, &state)
    })
    .await
    .unwrap();
    assert_eq!(code, 1, "{stderr}");
    let problems = stderr.lines().filter(|l| l.contains("bad.yaml:")).count();
    assert_eq!(problems, 100, "{stderr}");
    assert!(stderr.contains("and 900 more"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_exits_3_naming_what_did_not_converge_within_the_timeout() {
    // The module's image cannot be pulled: its worker pods fail, it never loads. (No
    // version: an unversioned Module loads on every selected node, no label needed.)
    let mut config = capstan_cluster::sim::config::ClusterConfig::default_cluster();
    config.broken_images = vec!["registry.example/org/my-kmod:broken".into()];
    let (cluster, _client) = common::start_simulated(config).await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(&cluster, state.path());
    let mut repo = FleetRepo::new();
    let module = common::manifests::module("my-kmod", "v1")
        .replace("my-kmod:v1-${KERNEL_FULL_VERSION}", "my-kmod:broken")
        .replace("      version: \"v1\"\n", "");
    assert!(!module.contains("version:"), "{module}");
    repo.commit(
        &[("ns.yaml", Some(NAMESPACE)), ("module.yaml", Some(&module))],
        "Broken image",
    );
    let run = |more: &'static [&'static str]| {
        let (repo, kubeconfig, state) = (
            repo.path().to_path_buf(),
            kubeconfig.clone(),
            state.path().to_path_buf(),
        );
        tokio::task::spawn_blocking(move || sync_once_with(&repo, &kubeconfig, &state, more))
    };
    // Applied without controllers, so the timeout below is all spent waiting for them.
    let (code, stderr) = run(&["--controllers", "none"]).await.unwrap();
    assert_eq!(code, 0, "{stderr}");

    let (code, stderr) = run(&["--timeout", "2s"]).await.unwrap();
    assert_eq!(code, 3, "{stderr}");
    let pending = stderr
        .split_once("not converged within 2s; still pending:")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no pending list: {stderr}"));
    assert!(pending.contains("kmm-demo/my-kmod"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_exits_0_saying_which_moves_a_campaign_holds_and_until_when() {
    let (cluster, _client) = common::start_default_simulated().await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(&cluster, state.path());
    let mut repo = FleetRepo::new();
    upgrade::commit_initial_fleet(&mut repo, &[]);
    let path = repo.path().to_path_buf();
    let run = || {
        let (repo, kubeconfig, state) =
            (path.clone(), kubeconfig.clone(), state.path().to_path_buf());
        tokio::task::spawn_blocking(move || sync_once(&repo, &kubeconfig, &state))
    };
    let (code, stderr) = run().await.unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("converged: every module is where the commit wants it"),
        "{stderr}"
    );

    // The Module at v2, two nodes relabelled, and a campaign that holds them for an hour.
    let upgrade_at =
        jiff::Timestamp::from_second(jiff::Timestamp::now().as_second() + 3600).expect("a time");
    let at = upgrade_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    repo.commit(
        &[
            ("module.yaml", Some(&upgrade::module("v2"))),
            ("campaign.yaml", Some(&upgrade::campaign(&at))),
            (
                "nodes/worker-1.yaml",
                Some(&upgrade::label("worker-1", "v2")),
            ),
            (
                "nodes/worker-2.yaml",
                Some(&upgrade::label("worker-2", "v2")),
            ),
        ],
        "Merge pull request #2 from fleet/my-kmod-v2",
    );
    let (code, stderr) = run().await.unwrap();
    // As docs/upgrade-campaigns.md says: --once does not wait for the campaign's time.
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "applied; 2 node moves held until {at} by campaign kmm-demo/my-kmod-v2; nothing \
             else pending"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("converged: every module"), "{stderr}");
}

/// A running `capstan sync` whose stderr lines arrive on a channel.
pub(crate) struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    pub(crate) fn start(command: &mut Command) -> Running {
        let mut child = command
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("capstan starts");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// A line containing `text` seen already, or else the next one; for lines whose order
    /// among others is not fixed.
    pub(crate) fn seen_or_wait_for(&mut self, text: &str) -> String {
        match self.seen.iter().find(|line| line.contains(text)) {
            Some(line) => line.clone(),
            None => self.wait_for(text),
        }
    }

    /// Waits for a line containing `text`, returning it.
    pub(crate) fn wait_for(&mut self, text: &str) -> String {
        let deadline = Instant::now() + common::DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(text) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {text:?}; saw:\n{}", self.seen.join("\n")),
            }
        }
    }
}

impl Running {
    /// Stops it with SIGTERM, as a user's Ctrl-C or Kubernetes would, and returns every line
    /// it wrote, once it has exited.
    pub(crate) fn stop(mut self) -> Vec<String> {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        // The channel closes when the process has closed its stderr: at its exit.
        while let Ok(line) = self.lines.recv_timeout(common::DEADLINE) {
            self.seen.push(line);
        }
        let status = self.child.wait().expect("wait");
        assert_eq!(status.code(), Some(0), "{}", self.seen.join("\n"));
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs a GitHub push event to the webhook; returns the HTTP status.
fn webhook(address: &str, signature: &str) -> u16 {
    let body = r#"{"ref":"refs/heads/main"}"#;
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream
        .set_read_timeout(Some(common::DEADLINE))
        .expect("timeout");
    write!(
        stream,
        "POST /hooks/github HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nX-GitHub-Event: push\r\nX-Hub-Signature-256: {signature}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("answer");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status line")
}

fn sign(body: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, SECRET.as_bytes());
    let tag = hmac::sign(&key, body.as_bytes());
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_is_synced_at_once_on_a_signed_webhook_and_stops_on_sigterm() {
    let (cluster, client) = common::start().await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(&cluster, state.path());
    let secret_file = state.path().join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "First",
    );
    let url = format!("file://{}", repo.path().display());
    let mut running = Running::start(
        capstan()
            .args([
                "sync",
                "--interval",
                "1h",
                "--listen",
                "127.0.0.1:0",
                "--repo",
                &url,
            ])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--state-dir")
            .arg(state.path().join("sync"))
            .arg("--webhook-secret-file")
            .arg(&secret_file),
    );
    let listening = running.wait_for("metrics and health on http://");
    let address = listening
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("address")
        .to_string();
    running.wait_for("2 created");

    repo.commit(
        &[("cm.yaml", Some(&config_map("settings", "b")))],
        "Second (#5)",
    );
    let body = r#"{"ref":"refs/heads/main"}"#;
    let forged = tokio::task::spawn_blocking({
        let address = address.clone();
        move || {
            webhook(
                &address,
                "sha256=0000000000000000000000000000000000000000000000000000000000000000",
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(forged, 401);
    let accepted = tokio::task::spawn_blocking({
        let address = address.clone();
        let signature = sign(body);
        move || webhook(&address, &signature)
    })
    .await
    .unwrap();
    assert_eq!(accepted, 202);
    let line = running.wait_for("1 configured");
    assert!(line.contains("(#5)"), "{line}");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "kmm-demo");
    assert_eq!(
        maps.get("settings").await.unwrap().data.unwrap()["value"],
        "b"
    );

    let pid = running.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    running.wait_for("stopped");
    let status = common::wait_for("capstan to exit after SIGTERM", async || {
        running.child.try_wait().expect("wait").ok_or("running")
    })
    .await;
    assert_eq!(status.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_plain_lines_off_a_terminal_and_json_objects_with_log_format_json() {
    let (cluster, _client) = common::start().await;
    let state = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(&cluster, state.path());
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "First",
    );
    // `--log-format` is global: it may follow the subcommand.
    let repo_path = repo.path().to_path_buf();
    let run = |format: &'static str| {
        let (repo, kubeconfig, state) = (
            repo_path.clone(),
            kubeconfig.clone(),
            state.path().to_path_buf(),
        );
        move || sync_once_with(&repo, &kubeconfig, &state, &["--log-format", format])
    };
    let (code, text) = tokio::task::spawn_blocking(run("text")).await.unwrap();
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("2 created"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no colour codes off a terminal: {text:?}"
    );

    repo.commit(&[("cm.yaml", Some(&config_map("settings", "b")))], "Second");
    let (code, json) = tokio::task::spawn_blocking(run("json")).await.unwrap();
    assert_eq!(code, 0, "{json}");
    let events: Vec<serde_json::Value> = json
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: not JSON: {line:?}"))
        })
        .collect();
    assert!(
        events.iter().all(|e| e["timestamp"].is_string()
            && e["level"].is_string()
            && e["message"].is_string()),
        "{json}"
    );
    assert!(
        events.iter().any(|e| e["message"]
            .as_str()
            .unwrap_or_default()
            .contains("1 configured")),
        "{json}"
    );
}
