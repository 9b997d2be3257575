//! What a rollout gate or the preflight reads from outside the cluster's objects: a
//! Prometheus query's series, a kmod image's manifest, a CEL expression's value over a
//! node and its pods, a check pod's outcome. Each returns what it saw; whether that passes
//! is the upgrade layer's decision ([`crate::controllers::upgrade::guard`]).

pub mod cel;
pub mod image;
pub mod pod;
pub mod prometheus;
