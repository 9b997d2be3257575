//! One document's run: a scratch home holding a copy of the capstan checkout, the tools a
//! reader has (cargo, standing in for a build of capstan, and kubectl), and one bash
//! session that runs the document's commands in order, each one's output kept apart.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use super::markdown::Walkthrough;

/// What a session runs with.
pub struct Tools {
    /// The capstan binary this test run built: what `cargo build` or `cargo install`
    /// would have made.
    pub capstan: PathBuf,
    /// kubectl, on the session's PATH from the start, as a reader has it.
    pub kubectl: Option<PathBuf>,
    /// The capstan checkout whose documents these are; the session gets a copy of its
    /// `examples/` and `Cargo.toml`, committed on `main`.
    pub checkout: PathBuf,
}

/// How a session ended, besides running every command.
#[derive(Debug)]
pub enum Failure {
    /// Command `command` failed with `status`, bash being at document line `line`.
    Failed {
        command: usize,
        line: Option<usize>,
        status: i32,
    },
    /// The deadline passed during command `command`.
    TimedOut { command: Option<usize> },
    /// bash stopped without a failure it could report (an unset variable, `exit`).
    Stopped {
        command: Option<usize>,
        status: Option<i32>,
    },
}

/// What a session did.
pub struct Run {
    /// How many commands started.
    pub started: usize,
    /// What each started command printed, stdout and stderr as they interleaved.
    pub printed: Vec<String>,
    pub failure: Option<Failure>,
    /// The session's home, for comparing outputs.
    pub home: String,
    /// What bash printed outside the commands.
    pub session_log: String,
    pub elapsed: Duration,
    /// The scratch folder, when [`KEEP_ENV`] asked to keep it.
    pub kept: Option<PathBuf>,
}

/// Set (to anything) to keep each document's scratch folder: its home, the session's
/// script and each command's output.
pub const KEEP_ENV: &str = "CAPSTAN_WALKTHROUGHS_KEEP";

/// Runs `walkthrough` in a fresh scratch home, the commands stopped after `deadline`, and
/// stops every process the session left (its process group) before returning.
pub fn run(walkthrough: &Walkthrough, tools: &Tools, deadline: Duration) -> Run {
    let scratch = tempfile::Builder::new()
        .prefix("capstan-walkthrough-")
        .tempdir()
        .expect("a scratch folder");
    let root = scratch.path();
    let home = root.join("home");
    let bin = root.join("bin");
    let session = root.join("session");
    for dir in [&home, &bin, &session.join("out"), &root.join("tmp")] {
        std::fs::create_dir_all(dir).expect("scratch folders");
    }
    let env = environment(root, &home, &bin);
    prepare_home(&home, tools, &env);
    write_tools(&bin, &home, tools);
    let (script, origins) = script(walkthrough, &session);
    let script_path = session.join("walkthrough.sh");
    std::fs::write(&script_path, script).expect("write the session's script");
    let log_path = session.join("session.log");
    let log = std::fs::File::create(&log_path).expect("the session log");

    let started_at = Instant::now();
    let mut bash = Process::new("bash")
        .args(["--noprofile", "--norc"])
        .arg(&script_path)
        .current_dir(home.join("capstan"))
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("the session log"))
        .stderr(log)
        // Its own process group, so that what the walkthrough leaves running (`... &`)
        // is stopped with it.
        .process_group(0)
        .spawn()
        .expect("start bash");
    let group = bash.id() as i32;
    let status = loop {
        if let Some(status) = bash.try_wait().expect("wait for bash") {
            break Some(status);
        }
        if started_at.elapsed() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    stop_group(group);
    let _ = bash.wait();
    let elapsed = started_at.elapsed();

    let started: Vec<usize> = std::fs::read_to_string(session.join("started"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.parse().ok())
        .collect();
    let current = started.last().copied();
    let printed = (0..started.len())
        .map(|i| {
            let bytes = std::fs::read(session.join("out").join(i.to_string())).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect();
    let finished = session.join("finished").exists();
    let failure = match status {
        None => Some(Failure::TimedOut { command: current }),
        Some(_) if finished => None,
        Some(status) => match std::fs::read_to_string(session.join("failed")) {
            Ok(failed) => {
                let mut fields = failed.split_whitespace();
                let status = fields.next().and_then(|s| s.parse().ok()).unwrap_or(-1);
                let line = fields
                    .next()
                    .and_then(|s| s.parse::<usize>().ok())
                    .and_then(|n| origins.get(n.wrapping_sub(1)).copied().flatten());
                Some(Failure::Failed {
                    command: current.unwrap_or(0),
                    line,
                    status,
                })
            }
            Err(_) => Some(Failure::Stopped {
                command: current,
                status: status.code(),
            }),
        },
    };
    let session_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let kept = std::env::var_os(KEEP_ENV).map(|_| scratch.keep());
    Run {
        started: started.len(),
        printed,
        failure,
        home: home.to_string_lossy().into_owned(),
        session_log,
        elapsed,
        kept,
    }
}

/// The session's environment: nothing of the test's but a PATH for the system's tools,
/// so that no KUBECONFIG, HOME or CAPSTAN_* of the developer's leaks in.
fn environment(root: &Path, home: &Path, bin: &Path) -> Vec<(String, String)> {
    let cargo_bin = home.join(".cargo/bin");
    // A capstan already installed (a developer's ~/.cargo/bin) must not stand in for the
    // one a walkthrough builds: such folders stay off the PATH.
    let system: Vec<String> = std::env::var("PATH")
        .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into())
        .split(':')
        .filter(|dir| !dir.is_empty() && !Path::new(dir).join("capstan").exists())
        .map(str::to_string)
        .collect();
    let path = [bin.display().to_string(), cargo_bin.display().to_string()]
        .into_iter()
        .chain(system)
        .collect::<Vec<_>>()
        .join(":");
    let home = home.display().to_string();
    vec![
        ("PATH".into(), path),
        ("XDG_STATE_HOME".into(), format!("{home}/.local/state")),
        ("HOME".into(), home),
        ("TMPDIR".into(), root.join("tmp").display().to_string()),
        ("USER".into(), "ada".into()),
        ("LOGNAME".into(), "ada".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TERM".into(), "dumb".into()),
        ("TZ".into(), "UTC".into()),
        // Logs without colours, so that a failure's output reads as text.
        ("NO_COLOR".into(), "1".into()),
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
    ]
}

/// A reader's home: Git knows who they are, and `~/capstan` is a capstan checkout (its
/// examples and Cargo.toml, committed on `main`). Git's default branch is left as Git
/// has it, as on a new machine.
fn prepare_home(home: &Path, tools: &Tools, env: &[(String, String)]) {
    std::fs::write(
        home.join(".gitconfig"),
        "[user]\n\tname = Ada Lovelace\n\temail = ada@example.com\n",
    )
    .expect("write .gitconfig");
    std::fs::create_dir_all(home.join(".cargo/bin")).expect("~/.cargo/bin");
    let checkout = home.join("capstan");
    copy_tree(&tools.checkout.join("examples"), &checkout.join("examples"));
    std::fs::copy(
        tools.checkout.join("Cargo.toml"),
        checkout.join("Cargo.toml"),
    )
    .expect("copy Cargo.toml");
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "-A"],
        &[
            "commit",
            "-q",
            "-m",
            "capstan (a copy for the walkthroughs)",
        ],
    ] {
        let status = Process::new("git")
            .args(args)
            .current_dir(&checkout)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .status()
            .expect("run git");
        assert!(status.success(), "git {args:?} in the scratch checkout");
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a folder");
    for entry in std::fs::read_dir(from).expect("read a folder") {
        let entry = entry.expect("a folder entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            // fs::copy keeps the mode: examples/ordered-upgrade.sh stays executable.
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// kubectl, and cargo as the walkthroughs have it (see [`CARGO`]).
fn write_tools(bin: &Path, home: &Path, tools: &Tools) {
    if let Some(kubectl) = &tools.kubectl {
        std::os::unix::fs::symlink(kubectl, bin.join("kubectl")).expect("link kubectl");
    }
    let cargo = CARGO
        .replace(
            "@CAPSTAN@",
            &shell_quote(&tools.capstan.display().to_string()),
        )
        .replace(
            "@INSTALL_DIR@",
            &shell_quote(&home.join(".cargo/bin").display().to_string()),
        );
    let path = bin.join("cargo");
    std::fs::write(&path, cargo).expect("write the cargo stand-in");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .expect("make cargo executable");
}

/// cargo for the walkthroughs: capstan is built already (the test's binary), so
/// `cargo build` links it where cargo would put it, `cargo install --path` links it into
/// ~/.cargo/bin, and `cargo run -- ARGS` runs it; each only where cargo would find the
/// checkout (a Cargo.toml here or above, or `--manifest-path`). Anything else fails,
/// naming the marker that skips a block.
const CARGO: &str = r#"#!/usr/bin/env bash
# cargo as the walkthroughs have it (tests/integration/walkthroughs.rs): capstan is built.
set -euo pipefail
capstan=@CAPSTAN@
install_dir=@INSTALL_DIR@
refuse() {
    echo "cargo (the walkthrough test's stand-in): $*; a block that needs more is marked <!-- walkthrough: skip (why) -->" >&2
    exit 101
}
manifest=
release=
path=
package_ok() { [[ $1 == capstan ]] || refuse "builds package capstan only, not $1"; }
# The checkout cargo would act on: --manifest-path's folder, else the nearest folder up
# from here holding a Cargo.toml.
checkout() {
    local dir
    if [[ -n $manifest ]]; then
        [[ -f $manifest ]] || { echo "error: manifest path \`$manifest\` does not exist" >&2; exit 101; }
        dir=$(dirname "$manifest")
    else
        dir=$PWD
        until [[ -f $dir/Cargo.toml ]]; do
            if [[ $dir == / ]]; then
                echo "error: could not find \`Cargo.toml\` in \`$PWD\` or any parent directory" >&2
                exit 101
            fi
            dir=$(dirname "$dir")
        done
    fi
    (cd "$dir" && pwd)
}
(($#)) || refuse "no command"
command=$1
shift
while (($#)); do
    case $1 in
        --) shift; break ;;
        --release) release=1 ;;
        --locked | --frozen | --offline | -q | --quiet | --force | -f) ;;
        --manifest-path) manifest=${2-}; shift ;;
        --manifest-path=*) manifest=${1#*=} ;;
        -p | --package | --bin) package_ok "${2-}"; shift ;;
        --package=* | --bin=*) package_ok "${1#*=}" ;;
        --path) path=${2-}; shift ;;
        --path=*) path=${1#*=} ;;
        *) refuse "does not know \`cargo $command $1\`" ;;
    esac
    shift
done
case $command in
    run)
        checkout >/dev/null
        exec "$capstan" "$@"
        ;;
    build)
        root=$(checkout)
        profile=debug
        [[ -n $release ]] && profile=release
        mkdir -p "$root/target/$profile"
        ln -sf "$capstan" "$root/target/$profile/capstan"
        echo "    Finished \`$profile\` profile (capstan was built by the test: target/$profile/capstan links it)" >&2
        ;;
    install)
        [[ -n $path ]] || refuse "installs with --path only"
        [[ -f $path/Cargo.toml ]] || { echo "error: \`$path\` is not a crate root; none of \`Cargo.toml\` found" >&2; exit 101; }
        mkdir -p "$install_dir"
        ln -sf "$capstan" "$install_dir/capstan"
        echo "  Installed package \`capstan\` (executable \`capstan\`, the test's build) in $install_dir" >&2
        ;;
    *) refuse "runs \`cargo run\`, \`cargo build\` and \`cargo install --path\` only, not \`cargo $command\`" ;;
esac
"#;

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The session's script: each command in a `{ }` group of the shell itself (so `cd`,
/// `export` and background jobs carry on to the next), its output to a file of its own,
/// its index recorded as it starts; an ERR trap records the status and bash's line of a
/// failure under `set -euo pipefail`, and a command that ends with a non-zero status
/// anyway stops the run too. Returns the script and, per script line, the document line
/// it comes from.
fn script(walkthrough: &Walkthrough, session: &Path) -> (String, Vec<Option<usize>>) {
    let mut text = String::new();
    let mut origins = Vec::new();
    let mut emit = |line: &str, origin: Option<usize>| {
        text.push_str(line);
        text.push('\n');
        origins.push(origin);
    };
    emit("set -euo pipefail", None);
    emit(
        &format!(
            "__walkthrough={}",
            shell_quote(&session.display().to_string())
        ),
        None,
    );
    emit(
        r#"trap 'printf "%s %s\n" "$?" "$LINENO" >"$__walkthrough/failed"' ERR"#,
        None,
    );
    for (index, command) in walkthrough.commands.iter().enumerate() {
        emit(
            &format!(r#"printf '%s\n' {index} >>"$__walkthrough/started""#),
            None,
        );
        emit("{", Some(command.line()));
        for line in &command.lines {
            emit(&line.text, Some(line.number));
        }
        emit(
            &format!(r#"}} >"$__walkthrough/out/{index}" 2>&1"#),
            Some(command.line()),
        );
        // set -e lets a command end in failure when the failure is not its last part
        // (`false && echo`): a reader would still see it fail, so the run stops too.
        emit(
            r#"__walkthrough_status=$?; if [ "$__walkthrough_status" -ne 0 ]; then printf '%s %s\n' "$__walkthrough_status" "$LINENO" >"$__walkthrough/failed"; exit "$__walkthrough_status"; fi"#,
            Some(command.line()),
        );
    }
    emit(r#": >"$__walkthrough/finished""#, None);
    (text, origins)
}

/// Stops every process of the group: SIGTERM first (capstan finishes the write in flight
/// and exits), SIGKILL for what is left after a while.
fn stop_group(group: i32) {
    for (signal, grace) in [
        (libc::SIGTERM, Duration::from_secs(15)),
        (libc::SIGKILL, Duration::from_secs(5)),
    ] {
        if !group_alive(group) {
            return;
        }
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is
        // involved.
        unsafe {
            libc::kill(-group, signal);
        }
        let until = Instant::now() + grace;
        while group_alive(group) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether a process of the group still runs. Read from /proc rather than with
/// `kill(-group, 0)`, which a zombie no one reaps would answer forever.
fn group_alive(group: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so read after its `)`.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        matches!(fields.as_slice(), [state, _ppid, pgrp, ..]
            if *state != "Z" && *state != "X" && pgrp.parse::<i32>() == Ok(group))
    })
}
