//! GitOps sync: follow a Git branch of manifests and make the cluster match it.

pub mod apply;
pub mod diff;
pub mod discovery;
pub mod follow;
pub mod impersonate;
pub mod inventory;
pub mod manifests;
pub mod mask;
pub mod metrics;
pub mod plan;
pub mod prune;
pub mod pull_requests;
pub mod reach;
pub mod request;
pub mod run;
pub mod server;
pub mod source;
pub mod status;
