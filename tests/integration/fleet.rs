//! The fleet of the command-line tests, an ordered upgrade of Module kmm-demo/my-kmod from
//! v1 to v2 as a pull request proposes it, and the `capstan` binary run on it.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::git::with_changes;
use crate::common::manifests::{NAMESPACE, config_map, module, node_label};

/// The version label of my-kmod.
pub const VERSION_LABEL: &str = "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod";

/// my-kmod v1 on worker-1 and worker-2, in its namespace, with a ConfigMap.
pub fn fleet_v1() -> Vec<(&'static str, String)> {
    vec![
        ("fleet/namespace.yaml", NAMESPACE.to_string()),
        ("fleet/modules/my-kmod.yaml", module("my-kmod", "v1")),
        (
            "fleet/nodes/worker-1.yaml",
            node_label("worker-1", "my-kmod", "v1"),
        ),
        (
            "fleet/nodes/worker-2.yaml",
            node_label("worker-2", "my-kmod", "v1"),
        ),
        ("fleet/settings.yaml", config_map("settings", "1")),
    ]
}

/// my-kmod v2 with worker-1 moved to it; worker-2 stays on v1 for now.
pub fn fleet_v2() -> Vec<(&'static str, String)> {
    with_changes(
        &fleet_v1(),
        &[
            ("fleet/modules/my-kmod.yaml", Some(module("my-kmod", "v2"))),
            (
                "fleet/nodes/worker-1.yaml",
                Some(node_label("worker-1", "my-kmod", "v2")),
            ),
        ],
    )
}

/// Runs `capstan` with `args` in `dir`.
pub fn capstan(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_capstan"))
        .current_dir(dir)
        .args(args)
        .env_remove("NO_COLOR")
        .output()
        .expect("run capstan")
}

/// Stdout of a run, as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}
