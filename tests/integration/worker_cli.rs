//! `capstan worker kmod load|unload` end to end: the binary reads a worker config, pulls
//! the kmod image from a registry that requires the pod's pull secret, and drives the
//! real `modprobe` (as a dry run, on a node whose paths are under a temporary directory):
//! the modules load in dependency and softdep order, the firmware is installed and
//! removed again; a bad config or an unpullable image fails with one line on stderr.

use crate::registry;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use registry::{KERNEL, LAYER_GZIP, Layer, PASSWORD, Registry, RegistryOptions, USER};
use tempfile::TempDir;

/// A node under a temporary directory, and a `modprobe` that dry-runs the real one
/// there and logs what it was asked and answered.
struct Node {
    dir: TempDir,
}

impl Node {
    fn new() -> Node {
        let node = Node {
            dir: TempDir::new().unwrap(),
        };
        let root = node.root();
        for dir in [
            "sys/module/firmware_class/parameters",
            "etc/modprobe.d",
            "var/lib/firmware",
        ] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        std::fs::write(root.join("sys/module/firmware_class/parameters/path"), "\n").unwrap();
        std::fs::write(root.join("var/lib/firmware/other.bin"), "another module's").unwrap();
        // `-vd DIR` and `-rvd DIR` name the image as the worker sees it: under the root here.
        let script = format!(
            r#"#!/bin/sh
root='{root}'
log='{log}'
printf 'ARGS:' >> "$log"; for a in "$@"; do printf ' %s' "$a" >> "$log"; done; echo >> "$log"
n=$#
next=0
for a in "$@"; do
  if [ "$next" = 1 ]; then a="$root$a"; next=0; fi
  case "$a" in -vd|-rvd|-d) next=1 ;; esac
  set -- "$@" "$a"
done
shift "$n"
out=$('{modprobe}' -n -S '{KERNEL}' -C "$root/etc/modprobe.d" "$@" 2>&1); rc=$?
printf '%s\n' "$out" >> "$log"
printf '%s\n' "$out"
exit $rc
"#,
            root = root.display(),
            log = node.log().display(),
            modprobe = registry::tool("modprobe").display(),
        );
        let source = node.dir.path().join("modprobe.src");
        std::fs::write(&source, script).unwrap();
        // Copied by a child process, so no descriptor of it is open in this
        // (multi-threaded) test process when it is executed ("text file busy").
        let status = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"cp "$1" "$2" && chmod +x "$2""#)
            .arg("sh")
            .arg(&source)
            .arg(node.modprobe())
            .status()
            .unwrap();
        assert!(status.success());
        node
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("host")
    }

    fn modprobe(&self) -> PathBuf {
        self.dir.path().join("modprobe")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("modprobe.log")
    }

    fn modprobe_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim_end().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    fn write_pull_secret(&self, registry: &str, user: &str, password: &str) {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let path = self
            .root()
            .join("var/run/kmm/pull-secret/.dockerconfigjson");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text = serde_json::json!({"auths": {registry: {"auth": auth}}});
        std::fs::write(path, text.to_string()).unwrap();
    }

    /// A `kubernetes.io/dockercfg` Secret's `.dockercfg`, where the worker pod projects it:
    /// the registries without the `auths` wrapper.
    fn write_legacy_pull_secret(&self, registry: &str, user: &str, password: &str) {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let path = self
            .root()
            .join("var/run/kmm/pull-secret/.dockerconfigjson");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let text = serde_json::json!({registry: {"auth": auth, "email": "robot@example.com"}});
        std::fs::write(path, text.to_string()).unwrap();
    }

    fn write_config(&self, text: &str) -> PathBuf {
        let path = self.dir.path().join("config.yaml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Runs `capstan worker kmod <action> <config>` on this node.
    fn worker(&self, action: &str, config: &Path) -> Output {
        Command::new(env!("CARGO_BIN_EXE_capstan"))
            .args(["worker", "kmod", action])
            .arg(config)
            .arg("--host-root")
            .arg(self.root())
            .arg("--modprobe")
            .arg(self.modprobe())
            .env("NO_COLOR", "1")
            .output()
            .expect("run capstan")
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.root().join(path)).ok()
    }
}

fn stderr_lines(output: &Output) -> Vec<String> {
    String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

fn config(image: &str) -> String {
    format!(
        "kernelVersion: {KERNEL}
containerImage: {image}
insecurePull: true
modprobe:
  moduleName: kmod_a
  parameters: [debug=1]
  firmwarePath: /firmware
  modulesLoadingOrder: [kmod_a, kmod_c]
"
    )
}

#[tokio::test]
async fn load_then_unload_a_module_from_a_private_registry() {
    let registry = Registry::start(RegistryOptions {
        basic_auth: true,
        ..RegistryOptions::default()
    });
    // The kmod image as a build would make it: modules and their depmod files, firmware.
    let build = TempDir::new().unwrap();
    registry::compile_modules(&build.path().join("opt"));
    registry::depmod(&build.path().join("opt"));
    let modules = Layer::new()
        .tree(&build.path().join("opt"), "opt/")
        .gzip(LAYER_GZIP);
    let firmware = Layer::new()
        .file("firmware/fw-a.bin", b"firmware a")
        .file("firmware/sub/fw-b.bin", b"firmware b")
        .tar();
    let digest = registry
        .push_image("kmods/kmod-a", "v1", &[modules, firmware])
        .await;
    let node = Node::new();
    node.write_pull_secret(&registry.address(), USER, PASSWORD);
    let config = node.write_config(&config(&format!("{}/kmods/kmod-a:v1", registry.address())));

    let loaded = node.worker("load", &config);
    assert!(
        loaded.status.success(),
        "load: {}\n{}",
        String::from_utf8_lossy(&loaded.stderr),
        String::from_utf8_lossy(&loaded.stdout)
    );
    assert!(
        stderr_lines(&loaded).is_empty(),
        "{:?}",
        stderr_lines(&loaded)
    );
    let image = format!("/var/run/kmm/image/{}", digest.replace(':', "-"));
    let modules_dir = format!("{}{image}/opt/lib/modules/{KERNEL}", node.root().display());
    assert_eq!(
        node.modprobe_log(),
        [
            format!("ARGS: -vd {image}/opt kmod_a debug=1"),
            // Dependencies first, then the softdep of the loading order, then the module.
            format!("insmod {modules_dir}/extra/kmod-b.ko"),
            format!("insmod {modules_dir}/extra/kmod_c.ko"),
            format!("insmod {modules_dir}/extra/kmod_a.ko debug=1"),
        ]
    );
    assert_eq!(
        node.read("etc/modprobe.d/softdep.conf").as_deref(),
        Some("softdep kmod_a pre: kmod_c\n")
    );
    assert_eq!(
        node.read("sys/module/firmware_class/parameters/path")
            .as_deref(),
        Some("/var/lib/firmware")
    );
    assert_eq!(
        node.read("var/lib/firmware/fw-a.bin").as_deref(),
        Some("firmware a")
    );
    assert_eq!(
        node.read("var/lib/firmware/sub/fw-b.bin").as_deref(),
        Some("firmware b")
    );

    let unloaded = node.worker("unload", &config);
    assert!(
        unloaded.status.success(),
        "unload: {}",
        String::from_utf8_lossy(&unloaded.stderr)
    );
    assert!(
        stderr_lines(&unloaded).is_empty(),
        "{:?}",
        stderr_lines(&unloaded)
    );
    assert_eq!(
        node.modprobe_log().last().map(String::as_str),
        Some(format!("ARGS: -rvd {image}/opt kmod_a kmod_c").as_str())
    );
    // Only the files the image brought go; the other module's stays.
    assert_eq!(node.read("var/lib/firmware/fw-a.bin"), None);
    assert_eq!(node.read("var/lib/firmware/sub/fw-b.bin"), None);
    assert_eq!(
        node.read("var/lib/firmware/other.bin").as_deref(),
        Some("another module's")
    );
}

#[test]
fn an_unknown_config_field_fails_with_one_line_naming_it() {
    let node = Node::new();
    let config = node.write_config(
        "kernelVersion: 6.1.0
containerImage: registry.invalid/kmod:v1
insecurePull: false
modprobe:
  modulName: kmod_a
",
    );
    let output = node.worker("load", &config);
    assert_eq!(output.status.code(), Some(1));
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "error: {}:5:3: unknown field modprobe.modulName (known fields there: ",
            config.display()
        )),
        "{lines:?}"
    );
    assert!(node.modprobe_log().is_empty());
}

#[tokio::test]
async fn an_unpullable_image_fails_with_one_line() {
    let registry = Registry::start(RegistryOptions::default());
    let node = Node::new();
    let image = format!("{}/kmods/absent:v1", registry.address());
    let config = node.write_config(&config(&image));
    let output = node.worker("load", &config);
    assert_eq!(output.status.code(), Some(1));
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!("error: cannot pull {image}: ")),
        "{lines:?}"
    );
    assert!(lines[0].contains("manifest unknown"), "{lines:?}");
    assert!(node.modprobe_log().is_empty());
}

#[tokio::test]
async fn a_legacy_dockercfg_secret_opens_a_private_registry() {
    let registry = Registry::start(RegistryOptions {
        basic_auth: true,
        ..RegistryOptions::default()
    });
    // An image without modules: the pull is what this checks, and modprobe fails after it.
    let layer = Layer::new().file("opt/hello", b"hello").gzip(LAYER_GZIP);
    let digest = registry.push_image("kmods/legacy", "v1", &[layer]).await;
    let node = Node::new();
    node.write_legacy_pull_secret(&registry.address(), USER, PASSWORD);
    let image = format!("{}/kmods/legacy:v1", registry.address());
    let config = node.write_config(&format!(
        "kernelVersion: {KERNEL}
containerImage: {image}
insecurePull: true
modprobe:
  moduleName: kmod_a
"
    ));
    let output = node.worker("load", &config);
    let lines = stderr_lines(&output);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("error: could not load module kmod_a: "),
        "{lines:?}"
    );
    let unpacked = format!("var/run/kmm/image/{}/opt/hello", digest.replace(':', "-"));
    assert_eq!(node.read(&unpacked).as_deref(), Some("hello"));
}
