//! The in-process KMM controllers.
//!
//! Each controller is a pure `decide` function of its inputs (plain facts read from the
//! objects, and "now" where time matters) that returns a decision as plain data, plus a thin
//! reconciler that reads the objects, calls `decide` and applies the decision. The decision
//! tables beside each `decide` mirror the seed flowcharts branch by branch.
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
