//! GitOps sync: follow a Git branch of manifests and make the cluster match it.

pub mod diff;
pub mod discovery;
pub mod inventory;
pub mod manifests;
pub mod plan;
pub mod source;
