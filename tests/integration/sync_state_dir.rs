//! Where `capstan sync` keeps its state (a remote's clone, the embedded cluster's CA key,
//! token and kubeconfig): never where `git add -A` would commit it, and a taken port is
//! reported before anything starts.

use crate::common;

use std::process::Command;

use common::git::FleetRepo;
use common::manifests::{NAMESPACE, config_map};

/// `capstan sync` run in `cwd` with `HOME` at `home` and no `XDG_STATE_HOME`.
fn capstan(cwd: &std::path::Path, home: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    command
        .current_dir(cwd)
        .env("HOME", home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("KUBECONFIG");
    command
}

fn fleet() -> FleetRepo {
    let mut repo = FleetRepo::new();
    repo.commit(
        &[
            ("ns.yaml", Some(NAMESPACE)),
            ("cm.yaml", Some(&config_map("settings", "a"))),
        ],
        "First",
    );
    repo
}

#[test]
fn a_sync_started_in_its_fleet_repository_keeps_its_state_out_of_it() {
    let repo = fleet();
    let home = tempfile::tempdir().expect("home");
    let output = capstan(repo.path(), home.path())
        .args(["sync", "--once", "--listen", "127.0.0.1:0", "--repo", "."])
        .output()
        .expect("capstan runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let state = home.path().join(".local/state/capstan");
    assert!(state.join("kubeconfig").is_file(), "{stderr}");
    assert!(
        stderr.contains(&state.join("kubeconfig").display().to_string()),
        "the banner names the kubeconfig: {stderr}"
    );
    // Nothing for `git add -A` to pick up.
    let status = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=all"])
        .current_dir(repo.path())
        .output()
        .expect("git status");
    assert_eq!(String::from_utf8_lossy(&status.stdout), "");
}

#[test]
fn a_state_dir_inside_the_synced_repository_is_refused_unless_git_ignores_it() {
    let mut repo = fleet();
    let home = tempfile::tempdir().expect("home");
    let run = |repo: &FleetRepo| {
        capstan(repo.path(), home.path())
            .args(["sync", "--once", "--repo", ".", "--state-dir", ".capstan"])
            .output()
            .expect("capstan runs")
    };
    let refused = run(&repo);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is inside the repository") && stderr.contains("--state-dir"),
        "{stderr}"
    );
    assert!(
        !repo.path().join(".capstan").exists(),
        "nothing is written before the refusal"
    );

    repo.commit(
        &[(".gitignore", Some("/.capstan/\n"))],
        "Ignore capstan's state",
    );
    let ignored = run(&repo);
    let stderr = String::from_utf8_lossy(&ignored.stderr);
    assert!(ignored.status.success(), "{stderr}");
    assert!(repo.path().join(".capstan/kubeconfig").is_file());
}

#[test]
fn a_taken_port_is_reported_before_the_embedded_cluster_starts() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = taken.local_addr().expect("address").to_string();
    let repo = fleet();
    let home = tempfile::tempdir().expect("home");
    let output = capstan(repo.path(), home.path())
        .args(["sync", "--repo", ".", "--listen", &address])
        .output()
        .expect("capstan runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("--listen {address}: the address is in use")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("EMBEDDED cluster"),
        "no cluster was started: {stderr}"
    );
}
