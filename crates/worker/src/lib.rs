//! The kmod worker: what a KMM worker pod does on its node.
//!
//! A worker pod reads its [`ModuleConfig`](capstan_api::nmc::ModuleConfig) from
//! `/etc/kmm-worker/config.yaml` ([`config`]), pulls the config's kmod image from its
//! registry into its own filesystem ([`image`], [`extract`], with the image's pull secret
//! read by [`pull_secret`]), and loads or unloads one kernel module ([`run`]). The steps
//! are upstream KMM's: remove in-tree modules, set the firmware search path and install
//! the firmware files, write the module loading order as a modprobe.d softdep file, then
//! run `modprobe` with exactly the argv upstream runs ([`modprobe`]).
//!
//! Everything that touches the node goes through the [`kernel::Kernel`] trait. The worker
//! process uses [`kernel::HostKernel`] (the real `modprobe`, sysfs and files); the embedded
//! cluster's kubelet uses [`simulated::SimulatedKernel`], which interprets the same argv
//! against the node's table of loaded modules. Both run the same [`run`] code.

pub mod config;
pub mod extract;
pub mod image;
pub mod kernel;
pub mod modprobe;
pub mod pull_secret;
pub mod run;
pub mod simulated;

/// Where a worker pod unpacks the kmod image: an `emptyDir` volume of the pod, so the
/// image lives in the pod's filesystem and goes with it (`capstan worker kmod --image-dir`).
pub const IMAGE_DIR: &str = "/var/run/kmm/image";

/// Where a worker pod finds the pull secret of the kmod image (the Module's
/// `imageRepoSecret`), mounted as a Secret volume.
pub const PULL_SECRET_DIR: &str = "/var/run/kmm/pull-secret";

/// The file of [`PULL_SECRET_DIR`] holding the registry credentials: the
/// `.dockerconfigjson` key of a `kubernetes.io/dockerconfigjson` Secret, or the
/// [`LEGACY_PULL_SECRET_KEY`] of a `kubernetes.io/dockercfg` one. The pod projects
/// whichever the Secret holds to this one file, and [`pull_secret::parse`] reads either
/// format.
pub const PULL_SECRET_FILE: &str = ".dockerconfigjson";

/// The key of a `kubernetes.io/dockercfg` Secret: the legacy `~/.dockercfg` format, the
/// `auths` map of a Docker config JSON without the `auths` wrapper.
pub const LEGACY_PULL_SECRET_KEY: &str = ".dockercfg";

/// `err` and its causes on one line, `: `-separated; a cause whose text the line already
/// holds is left out, and line breaks become spaces.
pub fn one_line(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer {0}")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner\nfailure")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn one_line_keeps_every_cause_once() {
        let err = Outer(Inner(std::io::Error::other("disk full")));
        assert_eq!(one_line(&err), "outer inner failure: disk full");
    }
}
