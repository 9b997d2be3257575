//! capstan: a GitOps reconciler for ordered, node-level upgrades on Kubernetes.
//!
//! This crate is the product: `sync` follows a Git branch into a cluster, `controllers`
//! carry out what it applied (KMM's Module -> NodeModulesConfig -> worker pods, the
//! ordered-upgrade version labels), `history` records every step against the commit that
//! asked for it, and `cli` is the command line. The kinds live in `capstan-api`, the kmod
//! worker in `capstan-worker`, and the embedded cluster in `capstan-cluster`, used only
//! through the default `embedded-cluster` feature (docs/architecture.md).

pub mod cli;
pub mod controllers;
pub mod crash;
pub mod deploy;
pub mod election;
pub mod history;
pub mod rbac;
pub mod runtime;
pub mod sync;
