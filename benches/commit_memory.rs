//! Peak memory of reading a commit: `capstan plan` (offline) and `capstan sync --once` (into
//! the embedded cluster) as whole processes, on a normal repository of 10,000 manifests and
//! on a hostile commit of a few kilobytes that fans one 256 KiB blob out to 4,096 YAML paths
//! (and as many other files): 1 GiB to read, which the commit budget refuses.
//!
//! `cargo bench --bench commit_memory`; `BENCH_CAPSTAN=<binary>` measures another build of
//! capstan with the same repositories (an older one, to compare); `BENCH_SCALE=0.1` takes a
//! tenth of the manifests.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use capstan_testing::git::FleetRepo;
use capstan_testing::manifests::{NAMESPACE, config_map};

/// One run of a command: its wall time, exit code and peak resident memory.
struct Measured {
    time: Duration,
    code: Option<i32>,
    peak_mib: f64,
}

/// Runs `command` to its end; the peak is the kernel's account of the child alone
/// (`wait4`'s `ru_maxrss`). `wait4` reaps the child, which `Child` cannot know.
#[allow(clippy::zombie_processes)]
fn measure(mut command: Command) -> Measured {
    let started = Instant::now();
    let child = command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("capstan starts");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data the kernel fills; the child is ours and waited once.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Measured {
        time: started.elapsed(),
        code,
        peak_mib: usage.ru_maxrss as f64 / 1024.0,
    }
}

fn capstan() -> Command {
    let binary =
        std::env::var("BENCH_CAPSTAN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_capstan").into());
    Command::new(binary)
}

fn plan(repo: &Path, base: &str) -> Command {
    let mut command = capstan();
    command
        .args(["plan", "--format", "json", "--base", base, "--head", "main"])
        .arg("--repo")
        .arg(repo);
    command
}

fn sync_once(repo: &Path, state: &Path) -> Command {
    let mut command = capstan();
    command
        .args([
            "sync",
            "--once",
            "--timeout",
            "2m",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--repo")
        .arg(repo)
        .arg("--state-dir")
        .arg(state);
    command
}

/// A repository whose `main` holds the namespace (its first commit, the plans' base), then
/// `count` ConfigMaps, one file each, whose value is `value`.
fn normal(count: usize, value: &str) -> FleetRepo {
    let mut repo = FleetRepo::new();
    repo.commit_set(&[("namespace.yaml", NAMESPACE)], "namespace");
    let files: Vec<(String, String)> = (0..count)
        .map(|i| {
            let name = format!("settings-{i:05}");
            (format!("config/{name}.yaml"), config_map(&name, value))
        })
        .collect();
    repo.commit_set(&files, "fleet");
    repo
}

/// A repository whose `main` holds the namespace, then a commit fanning one 256 KiB
/// ConfigMap out to 8 x 8 x 8 x 8 folders, as `m.yaml` and `data.bin` in each.
fn fan_out() -> FleetRepo {
    let mut repo = FleetRepo::new();
    repo.commit_set(&[("namespace.yaml", NAMESPACE)], "namespace");
    let big = config_map("big", &"x".repeat(256 * 1024));
    repo.commit_fan_out(
        "main",
        "fan",
        big.as_bytes(),
        (8, 4),
        &["m.yaml", "data.bin"],
        "fan out",
    );
    repo
}

/// The repositories measured, built by this benchmark's binary in a process of its own
/// (`prepare`): a child's peak memory as the kernel counts it starts from the memory of the
/// process that started it, which must stay small. Prints one `name<TAB>path<TAB>base` line
/// per repository.
fn prepare() {
    let count = common::scale(10_000);
    let repos = [
        (format!("{count} manifests"), normal(count, "base")),
        // 250 files of 250 KiB: just under the commit's 64 MiB of manifests.
        (
            "250 manifests x 250 KiB".to_string(),
            normal(250, &"x".repeat(250 * 1024)),
        ),
        ("fan-out commit, 4,096 x 256 KiB".to_string(), fan_out()),
    ];
    for (name, repo) in repos {
        let head = repo
            .git
            .head()
            .expect("head")
            .peel_to_commit()
            .expect("commit");
        let base = head.parent_id(0).expect("parent").to_string();
        drop(head);
        println!("{name}\t{}\t{base}", repo.keep().display());
    }
}

fn main() {
    if std::env::args().any(|arg| arg == "prepare") {
        return prepare();
    }
    let prepared = Command::new(std::env::current_exe().expect("this benchmark"))
        .arg("prepare")
        .output()
        .expect("the repositories are prepared");
    assert!(
        prepared.status.success(),
        "{}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let prepared = String::from_utf8(prepared.stdout).expect("utf-8");

    let mut rows = Vec::new();
    for line in prepared.lines() {
        let [what, repo, base] = line.splitn(3, '\t').collect::<Vec<_>>()[..] else {
            panic!("prepare printed {line:?}");
        };
        let repo = Path::new(repo);
        let measured = measure(plan(repo, base));
        rows.push((format!("capstan plan, {what}"), measured));
        let state = tempfile::tempdir().expect("state dir");
        let measured = measure(sync_once(repo, state.path()));
        rows.push((format!("capstan sync --once, {what}"), measured));
        std::fs::remove_dir_all(repo).expect("remove the repository");
    }

    println!(
        "binary: {}",
        std::env::var("BENCH_CAPSTAN").unwrap_or_else(|_| "this build".into())
    );
    println!(
        "| {:<55} | {:>15} | {:>9} | {:>4} |",
        "command", "peak memory", "time", "exit"
    );
    println!("|{:-<57}|{:->17}|{:->11}|{:->6}|", "", "", "", "");
    for (what, m) in rows {
        println!(
            "| {:<55} | {:>11.0} MiB | {:>7.2} s | {:>4} |",
            what,
            m.peak_mib,
            m.time.as_secs_f64(),
            m.code.map_or("-".to_string(), |c| c.to_string()),
        );
    }
}
