//! `capstan worker kmod load|unload <config>`: what a KMM worker pod runs on its node.
//!
//! Reads the worker config strictly, pulls the config's kmod image into the image
//! directory, and loads or unloads the module with the node's `modprobe`. Logs go to
//! stdout; on failure the process exits 1 with the reason as the one line on stderr.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use capstan_worker::image::{self, PullOptions};
use capstan_worker::kernel::HostKernel;
use capstan_worker::pull_secret::{self, PullSecret};
use capstan_worker::run::{self, Paths};
use capstan_worker::{self as worker, config, one_line};

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(subcommand)]
    pub command: WorkerCommand,
}

#[derive(Debug, Subcommand)]
pub enum WorkerCommand {
    /// Load or unload the kernel module of a worker config.
    #[command(subcommand)]
    Kmod(KmodCommand),
}

#[derive(Debug, Subcommand)]
pub enum KmodCommand {
    /// Pull the config's kmod image, then load its module (and firmware).
    Load(KmodArgs),
    /// Pull the config's kmod image, then unload its module (and remove its firmware).
    Unload(KmodArgs),
}

#[derive(Debug, Args)]
pub struct KmodArgs {
    /// The worker config: a NodeModulesConfig module `config` as YAML (in a worker pod,
    /// /etc/kmm-worker/config.yaml). Unknown fields are errors.
    pub config: PathBuf,
    /// The node's firmware directory: the module's firmware files are copied there, and
    /// it becomes the kernel's firmware search path.
    #[arg(long, value_name = "DIR", default_value = run::DEFAULT_FIRMWARE_DIR)]
    pub firmware_path: PathBuf,
    /// Where to unpack the kmod image (an emptyDir in a worker pod).
    #[arg(long, value_name = "DIR", default_value = worker::IMAGE_DIR)]
    pub image_dir: PathBuf,
    /// The image's pull secret, a Docker config JSON [default:
    /// /var/run/kmm/pull-secret/.dockerconfigjson, when it exists; else anonymous].
    #[arg(long, value_name = "FILE")]
    pub pull_secret: Option<PathBuf>,
    /// A registry to reach over plain HTTP or HTTPS without certificate verification, as
    /// the config's `insecurePull` allows for its image. Repeatable.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    pub insecure_registries: Vec<String>,
    /// Testing: take every absolute path the worker uses (image dir, pull secret,
    /// firmware dir, sysfs, /etc/modprobe.d, /lib/modules) under DIR instead of `/`.
    #[arg(long, value_name = "DIR", hide = true)]
    pub host_root: Option<PathBuf>,
    /// Testing: run PROGRAM instead of `modprobe` (it still sees `modprobe` as argv[0]).
    #[arg(long, value_name = "PROGRAM", hide = true)]
    pub modprobe: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Load,
    Unload,
}

/// Runs a worker command: exit 0 when the module is loaded (unloaded); an error whose
/// message is the one-line reason otherwise.
pub async fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    let WorkerCommand::Kmod(command) = args.command;
    let (action, args) = command.split();
    kmod(action, args).await.map_err(anyhow::Error::msg)?;
    Ok(0)
}

impl KmodCommand {
    fn split(self) -> (Action, KmodArgs) {
        match self {
            KmodCommand::Load(args) => (Action::Load, args),
            KmodCommand::Unload(args) => (Action::Unload, args),
        }
    }
}

async fn kmod(action: Action, args: KmodArgs) -> Result<(), String> {
    let config = config::read(&args.config).map_err(|err| one_line(&err))?;
    let mut kernel = HostKernel::new();
    if let Some(root) = &args.host_root {
        kernel = kernel.with_root(root);
    }
    if let Some(program) = &args.modprobe {
        kernel = kernel.with_program(program);
    }
    let options = PullOptions {
        insecure: config.insecure_pull,
        insecure_registries: args.insecure_registries.clone(),
        pull_secret: read_pull_secret(&kernel, args.pull_secret.as_deref())?,
    };
    let pulled = image::pull(
        &config.container_image,
        &kernel.host_path(&args.image_dir),
        &options,
    )
    .await
    .map_err(|err| one_line(&err))?;
    // The kernel takes paths as the worker sees them, under its root.
    let image_root = match pulled.root.file_name() {
        Some(name) => args.image_dir.join(name),
        None => args.image_dir.clone(),
    };
    let paths = Paths {
        image_root,
        firmware_dir: args.firmware_path.clone(),
    };
    tokio::task::spawn_blocking(move || match action {
        Action::Load => run::load(&config, &mut kernel, &paths),
        Action::Unload => run::unload(&config, &mut kernel, &paths),
    })
    .await
    .map_err(|err| format!("the worker stopped: {err}"))?
    .map_err(|err| one_line(&err))?;
    Ok(())
}

/// The pull secret given, or the pod's when it is mounted, or none.
fn read_pull_secret(kernel: &HostKernel, given: Option<&Path>) -> Result<PullSecret, String> {
    let path = match given {
        Some(path) => kernel.host_path(path),
        None => {
            let default =
                kernel.host_path(Path::new(worker::PULL_SECRET_DIR).join(worker::PULL_SECRET_FILE));
            if !default.exists() {
                tracing::info!(path = %default.display(), "no pull secret; pulling anonymously");
                return Ok(PullSecret::default());
            }
            default
        }
    };
    pull_secret::read(&path).map_err(|err| one_line(&err))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> (Action, KmodArgs) {
        let cli = Cli::try_parse_from(args).unwrap();
        let Command::Worker(WorkerArgs {
            command: WorkerCommand::Kmod(command),
        }) = cli.command
        else {
            panic!("not a worker command: {args:?}");
        };
        command.split()
    }

    #[test]
    fn defaults_are_the_worker_pod_paths() {
        let (action, args) = parse(&[
            "capstan",
            "worker",
            "kmod",
            "load",
            "/etc/kmm-worker/config.yaml",
        ]);
        assert_eq!(action, Action::Load);
        assert_eq!(args.config, Path::new("/etc/kmm-worker/config.yaml"));
        assert_eq!(args.firmware_path, Path::new("/var/lib/firmware"));
        assert_eq!(args.image_dir, Path::new(worker::IMAGE_DIR));
        assert_eq!(args.pull_secret, None);
        assert!(args.insecure_registries.is_empty());
        assert_eq!((args.host_root, args.modprobe), (None, None));
    }

    #[test]
    fn every_flag_is_read() {
        let (action, args) = parse(&[
            "capstan",
            "worker",
            "kmod",
            "unload",
            "c.yaml",
            "--firmware-path",
            "/fw",
            "--image-dir",
            "/img",
            "--pull-secret",
            "/s.json",
            "--insecure-registry",
            "a.example:5000",
            "--insecure-registry",
            "b.example",
            "--host-root",
            "/host",
            "--modprobe",
            "/bin/true",
        ]);
        assert_eq!(action, Action::Unload);
        assert_eq!(args.firmware_path, Path::new("/fw"));
        assert_eq!(args.image_dir, Path::new("/img"));
        assert_eq!(args.pull_secret.as_deref(), Some(Path::new("/s.json")));
        assert_eq!(args.insecure_registries, ["a.example:5000", "b.example"]);
        assert_eq!(args.host_root.as_deref(), Some(Path::new("/host")));
        assert_eq!(args.modprobe.as_deref(), Some(Path::new("/bin/true")));
    }
}
