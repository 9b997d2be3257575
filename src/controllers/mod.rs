//! The in-process KMM controllers.
//!
//! Each controller's logic is a pure `decide` function of its inputs (plain facts read from
//! the objects) that returns a decision as plain data; a reconciler only reads the objects,
//! calls `decide` and applies the decision in the documented order. The decision tables
//! beside each `decide` mirror the seed flowcharts branch by branch. The reconcilers that
//! run these decisions against a cluster are not part of capstan yet.
//!
//! - [`module_nmc`]: Module -> NodeModulesConfig, which Modules each node's NMC lists, and
//!   the Module's `status.moduleLoader` counts.
//! - [`nmc`]: per node, from the NMC's spec and status, the node and its worker pods, which
//!   statuses to record, which worker pods to delete and create, and the ready labels.
//! - [`kernel_mapping`]: which kmod image and settings a Module uses on a kernel.
//! - [`node`]: the facts about a node both controllers decide on.

pub mod kernel_mapping;
pub mod module_nmc;
pub mod nmc;
pub mod node;
