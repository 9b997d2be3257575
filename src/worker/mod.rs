//! The kmod worker: what a KMM worker pod does on its node.
//!
//! A worker pod reads its [`ModuleConfig`](crate::api::nmc::ModuleConfig) from
//! `/etc/kmm-worker/config.yaml` ([`config`]) and loads or unloads one kernel module
//! ([`run`]). The steps are upstream KMM's: remove in-tree modules, set the firmware search
//! path and install the firmware files, write the module loading order as a modprobe.d
//! softdep file, then run `modprobe` with exactly the argv upstream runs ([`modprobe`]).
//!
//! Everything that touches the node goes through the [`kernel::Kernel`] trait. The worker
//! process uses [`kernel::HostKernel`] (the real `modprobe`, sysfs and files); the embedded
//! cluster's kubelet uses [`simulated::SimulatedKernel`], which interprets the same argv
//! against the node's table of loaded modules. Both run the same [`run`] code.

pub mod config;
pub mod kernel;
pub mod modprobe;
pub mod run;
pub mod simulated;

/// Where a worker pod has its emptyDir for the kmod image's files (`--image-dir`).
pub const IMAGE_DIR: &str = "/var/run/kmm/image";
/// Where a worker pod has the Module's `imageRepoSecret` mounted.
pub const PULL_SECRET_DIR: &str = "/var/run/kmm/pull-secret";
/// The key of a Docker config JSON pull secret, and its file name under [`PULL_SECRET_DIR`].
pub const PULL_SECRET_FILE: &str = ".dockerconfigjson";
