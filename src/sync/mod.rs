//! GitOps sync: follow a Git branch of manifests and make the cluster match it.

pub mod diff;
pub mod apply;
pub mod discovery;
pub mod history;
pub mod inventory;
pub mod manifests;
pub mod prune;
pub mod source;
pub mod status;
