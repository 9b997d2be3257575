//! Field managers: who owns which field of an object capstan writes. Git's changes (the
//! sync, manager `capstan`) and each controller write under their own name, so that Git and
//! the controllers never own the same field.

/// The sync: what comes from Git, the `GitSync` status, pruning.
pub const SYNC: &str = "capstan";
/// The Module -> NMC controller (NMC spec, Module status and finalizer).
pub const MODULE_NMC: &str = "capstan-module-nmc";
/// The NMC controller (NMC status, worker pods, ready labels).
pub const NMC: &str = "capstan-nmc";
/// The device-plugin controller (DaemonSets).
pub const DEVICE_PLUGIN: &str = "capstan-device-plugin";
/// The DRA controller (DRA DaemonSets, DeviceClasses, dra-ready node labels, `status.dra`).
pub const DRA: &str = "capstan-dra";
/// The ordered-upgrade version-label controller (internal node labels).
pub const VERSION_LABELS: &str = "capstan-version-labels";
/// The campaign controller (`UpgradeConfig` status).
pub const CAMPAIGNS: &str = "capstan-campaigns";
/// The drain controller (evictions, the drain annotation's done mark).
pub const DRAIN: &str = "capstan-drain";
/// The nodekeeper (pods it deletes, finalizers it strips).
pub const NODEKEEPER: &str = "capstan-nodekeeper";
/// The LeaderWorkerSet controller (StatefulSets, revisions, Services, LWS status, pod labels).
pub const LWS: &str = "capstan-lws";
