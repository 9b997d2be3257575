//! The Rust types of every custom resource capstan handles, the well-known label,
//! annotation and finalizer names, the CRDs generated from the types, Kubernetes' name
//! and label rules, canonical JSON and digests, and the clock every decision reads.
//!
//! Kinds, groups, versions, field names and short names are upstream's (KMM, MUO, LWS), so
//! capstan reads and writes the same objects the upstream operators do.

pub mod canonical;
pub mod capstan;
pub mod clock;
pub mod crds;
pub mod labels;
pub mod lws;
pub mod managers;
pub mod module;
pub mod names;
pub mod nmc;
pub mod schema;
pub mod text_memo;
pub mod upgrade_config;

pub use capstan::{
    Canary, Change, CommitRef, Delivered, FailedNode, GateSpec, GateWhen, GitHubApp,
    GitHubNotifications, GitSync, GitSyncSpec, GitSyncStatus, HistoryRecord, HistoryRecordSpec,
    InventoryEntry, MaintenanceWindow, NodeDrain, NotificationTarget, Notifications, PodCheck,
    PrometheusCheck, RecordType, RolloutPolicy, SecretKeyRef, SyncRun, UpgradePolicy, UpgradeStep,
    UpgradeWindow, Webhook, WebhookFormat,
};
pub use labels::{LabelError, ModuleKey, ModuleLabel, WorkerAction};
pub use lws::{LeaderWorkerSet, LeaderWorkerSetSpec, LeaderWorkerSetStatus};
pub use module::{Module, ModuleSpec, ModuleStatus};
pub use nmc::{
    ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfig, NodeModulesConfigSpec,
    NodeModulesConfigStatus,
};
pub use upgrade_config::{UpgradeConfig, UpgradeConfigSpec, UpgradeConfigStatus};

/// Installs ring as the process's rustls crypto provider. kube, the kmod worker's
/// registry client and the embedded cluster's server must share one provider, or the
/// first TLS connection panics; call this once at start-up (later calls are harmless).
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
