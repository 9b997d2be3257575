//! The Rust types of every custom resource capstan handles, the well-known label,
//! annotation and finalizer names, and the CRDs generated from the types.
//!
//! Kinds, groups, versions, field names and short names are upstream's (KMM, MUO, LWS), so
//! capstan reads and writes the same objects the upstream operators do.

pub mod capstan;
pub mod crds;
pub mod labels;
pub mod lws;
pub mod module;
pub mod nmc;
pub mod upgrade_config;

pub use capstan::{
    Change, CommitRef, GitSync, GitSyncSpec, GitSyncStatus, HistoryRecord, HistoryRecordSpec,
    InventoryEntry, RecordType, SyncRun, UpgradePolicy, UpgradeStep,
};
pub use labels::{LabelError, ModuleKey, ModuleLabel, WorkerAction};
pub use lws::{LeaderWorkerSet, LeaderWorkerSetSpec, LeaderWorkerSetStatus};
pub use module::{Module, ModuleSpec, ModuleStatus};
pub use nmc::{
    ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfig, NodeModulesConfigSpec,
    NodeModulesConfigStatus,
};
pub use upgrade_config::{UpgradeConfig, UpgradeConfigSpec, UpgradeConfigStatus};
