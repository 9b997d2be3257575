//! What capstan needs from the Kubernetes API, and nothing more: [`NEEDS`], one row per
//! (part of capstan, group, resource, verbs), each naming the code that makes the calls.
//!
//! The rows are read off the code: every `Api<...>` call, every watch of
//! `src/controllers/caches.rs` (a watch is `list` and `watch`), every write. How a call
//! maps to a verb:
//!
//! - a merge or JSON patch is `patch`; a server-side apply is `patch`, and also `create`
//!   where it may create the object (the API server authorizes a create-on-patch as a
//!   create);
//! - a status or eviction write is its subresource (`modules/status`, `pods/eviction`);
//! - an owner reference with `blockOwnerDeletion` needs `update` on the owner's
//!   `finalizers` subresource where the `OwnerReferencesPermissionEnforcement` admission
//!   plugin runs (OpenShift, hardened clusters);
//! - discovery (`/api`, `/apis`), `SelfSubjectAccessReview` and `SelfSubjectReview` are
//!   granted to every authenticated user by Kubernetes' default roles.
//!
//! Where the rows go:
//!
//! - [`rules_for`]: the cluster-wide rules of the sync, its history, leader election and
//!   the selected controllers, merged per group and resource: the `capstan` ClusterRole
//!   (deploy/base/clusterrole.yaml, written by [`crate::deploy`]).
//! - [`election_rules`]: the Lease, in the namespace of the Lease only: the
//!   `capstan-leader-election` Role, as kubebuilder's leader-election Role. Granting
//!   Leases cluster-wide would let capstan take any component's Lease, kube-system's
//!   included.
//! - [`repository_rules`]: the kinds a repository may hold beyond capstan's own (Modules,
//!   UpgradeConfigs, LeaderWorkerSets, Nodes' labels): the `capstan-repository`
//!   ClusterRole, a setting users extend.
//! - [`Part::Bootstrap`] rows are granted by no shipped role: capstan installs its CRDs and
//!   creates `capstan-system` only on a cluster without them (a developer's, with an admin
//!   kubeconfig); the install creates both, and a role able to rewrite any CRD or
//!   Namespace (its Pod Security labels) is more than capstan needs.
//!
//! [`check`] asks the API server, before capstan starts, whether it grants every row the
//! process needs, and names the ones it denies. [`audit`] reads the RBAC attributes of a
//! request, so that a test can hold the table against every request the code sends.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::controllers::{ControllerName, Selection};

pub mod audit;
mod check;

pub use check::{CheckError, Denied, MissingPermissions, Permission, check, denied, permissions};

/// The name of capstan's ClusterRole, ServiceAccount and bindings.
pub const NAME: &str = "capstan";
/// The ClusterRole of the kinds a repository may hold beyond capstan's own.
pub const REPOSITORY_ROLE: &str = "capstan-repository";
/// The Role of the Lease, in the Lease's namespace.
pub const ELECTION_ROLE: &str = "capstan-leader-election";

/// The verbs, in the order rules list them.
pub const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Which part of capstan needs a permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// Following Git and applying it: the `GitSync`, apply, drift, prune.
    Sync,
    /// The sync's history: its records and Events.
    History,
    /// `--once`: waiting until the controllers have converged.
    Once,
    /// `--leader-elect`: the Lease.
    LeaderElection,
    /// Installing capstan's CRDs and namespace where they are missing; no shipped role
    /// grants it.
    Bootstrap,
    /// One of the in-process controllers.
    Controller(ControllerName),
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Sync => f.write_str("the sync"),
            Part::History => f.write_str("the sync's history"),
            Part::Once => f.write_str("--once"),
            Part::LeaderElection => f.write_str("leader election"),
            Part::Bootstrap => f.write_str("the bootstrap"),
            Part::Controller(name) => write!(f, "the {name} controller"),
        }
    }
}

impl Part {
    /// The short name rule comments use: `sync`, `module-nmc`.
    pub fn short(self) -> &'static str {
        match self {
            Part::Sync => "sync",
            Part::History => "history",
            Part::Once => "once",
            Part::LeaderElection => "leader-election",
            Part::Bootstrap => "bootstrap",
            Part::Controller(name) => name.as_str(),
        }
    }
}

/// Where a permission must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// In every namespace (or for a cluster-scoped kind).
    Cluster,
    /// In the namespace of the Lease (`--lease-namespace`).
    LeaseNamespace,
}

/// One row of [`NEEDS`]: a part of capstan needs `verbs` on `resource` of `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub part: Part,
    /// The API group; `""` is the core group.
    pub group: &'static str,
    /// The resource, a subresource after a slash: `nodes`, `pods/eviction`.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    pub scope: Scope,
    /// What the part does with them, completing "<part> ...".
    pub why: &'static str,
    /// Where the calls are.
    pub code: &'static str,
}

const CORE: &str = "";
const APPS: &str = "apps";
const KMM: &str = "kmm.sigs.x-k8s.io";
const CAPSTAN: &str = "capstan.dev";
const UPGRADE: &str = "upgrade.managed.openshift.io";
const LWS: &str = "leaderworkerset.x-k8s.io";
const EVENTS: &str = "events.k8s.io";
const RESOURCE: &str = "resource.k8s.io";

const SYNC: Part = Part::Sync;
const HISTORY: Part = Part::History;
const MODULE_NMC: Part = Part::Controller(ControllerName::ModuleNmc);
const NMC: Part = Part::Controller(ControllerName::Nmc);
const DEVICE_PLUGIN: Part = Part::Controller(ControllerName::DevicePlugin);
const DRA: Part = Part::Controller(ControllerName::Dra);
const VERSION_LABELS: Part = Part::Controller(ControllerName::VersionLabels);
const CAMPAIGNS: Part = Part::Controller(ControllerName::Campaigns);
const DRAIN: Part = Part::Controller(ControllerName::Drain);
const NODEKEEPER: Part = Part::Controller(ControllerName::Nodekeeper);
const LWS_CONTROLLER: Part = Part::Controller(ControllerName::Lws);
const NOTIFICATIONS: Part = Part::Controller(ControllerName::Notifications);

/// A watch through the controllers' caches: its initial list and its watch.
const WATCH: &[&str] = &["list", "watch"];
/// What the sync does with a kind a repository holds: reads it (one get per object, or
/// one list for many), applies it server-side (creating it when missing), prunes it.
const APPLIED: &[&str] = &["get", "list", "create", "patch", "delete"];
/// Events: created, and patched to count a repeat in the Event's series.
const EVENT_WRITES: &[&str] = &["create", "patch"];

const fn need(
    part: Part,
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: &'static str,
    code: &'static str,
) -> Need {
    Need {
        part,
        group,
        resource,
        verbs,
        scope: Scope::Cluster,
        why,
        code,
    }
}

/// Every permission capstan's code uses, by part.
pub const NEEDS: &[Need] = &[
    // ---- the sync ----
    need(
        SYNC,
        CAPSTAN,
        "gitsyncs",
        &["get", "create", "patch"],
        "reads and applies (server-side) the GitSync that keeps the sync's status and inventory",
        "src/sync/status.rs, src/sync/inventory.rs",
    ),
    need(
        SYNC,
        CAPSTAN,
        "gitsyncs",
        &["list", "watch", "patch"],
        "watches its GitSync for the sync requests a standby writes on it when a GitHub push reaches the standby",
        "src/sync/request.rs",
    ),
    need(
        SYNC,
        CAPSTAN,
        "gitsyncs/status",
        &["patch"],
        "writes the sync's status: commits, errors, inventory",
        "src/sync/status.rs",
    ),
    need(
        SYNC,
        CORE,
        "namespaces",
        &["get"],
        "checks that capstan-system exists",
        "src/sync/status.rs",
    ),
    need(
        SYNC,
        CORE,
        "namespaces",
        &["list"],
        "tells which namespaces exist before applying objects into them",
        "src/sync/apply.rs",
    ),
    need(
        SYNC,
        KMM,
        "modules",
        APPLIED,
        "applies the repository's Modules, checks them for drift and prunes the ones removed",
        "src/sync/apply.rs, src/sync/prune.rs",
    ),
    need(
        SYNC,
        UPGRADE,
        "upgradeconfigs",
        APPLIED,
        "applies the repository's UpgradeConfig campaigns, checks them for drift and prunes the ones removed",
        "src/sync/apply.rs, src/sync/prune.rs",
    ),
    need(
        SYNC,
        LWS,
        "leaderworkersets",
        APPLIED,
        "applies the repository's LeaderWorkerSets, checks them for drift and prunes the ones removed",
        "src/sync/apply.rs, src/sync/prune.rs",
    ),
    need(
        SYNC,
        CORE,
        "nodes",
        &["get", "list", "patch"],
        "applies the repository's version labels to existing Nodes and releases them on prune (it never creates or deletes a Node)",
        "src/sync/apply.rs, src/sync/prune.rs",
    ),
    // ---- the sync's history ----
    need(
        HISTORY,
        CAPSTAN,
        "historyrecords",
        &["create"],
        "records every sync that changes something or rejects a commit",
        "src/history.rs",
    ),
    need(
        HISTORY,
        CAPSTAN,
        "historyrecords",
        &["list", "delete"],
        "deletes the oldest records beyond historyRetention",
        "src/history.rs",
    ),
    need(
        HISTORY,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each sync and rejected commit",
        "src/history/recorder.rs",
    ),
    // ---- --once ----
    need(
        Part::Once,
        KMM,
        "modules",
        &["list"],
        "checks that the Modules' NodeModulesConfigs are written",
        "src/controllers/converge.rs",
    ),
    need(
        Part::Once,
        CORE,
        "nodes",
        &["list"],
        "checks every node's modules and version labels",
        "src/controllers/converge.rs",
    ),
    need(
        Part::Once,
        KMM,
        "nodemodulesconfigs",
        &["list"],
        "checks every node's loaded modules",
        "src/controllers/converge.rs",
    ),
    need(
        Part::Once,
        UPGRADE,
        "upgradeconfigs",
        &["list"],
        "leaves out the moves a campaign holds",
        "src/controllers/converge.rs",
    ),
    // ---- leader election ----
    need(
        Part::LeaderElection,
        CORE,
        "namespaces",
        &["get"],
        "checks that the Lease's namespace exists",
        "src/election.rs",
    ),
    Need {
        part: Part::LeaderElection,
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "patch"],
        scope: Scope::LeaseNamespace,
        why: "creates, renews and releases its Lease (kube-lease-manager, server-side apply)",
        code: "src/election.rs",
    },
    // ---- the bootstrap: granted by no shipped role ----
    need(
        Part::Bootstrap,
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["create", "patch"],
        "installs the GitSync and HistoryRecord CRDs on a cluster that lacks them",
        "src/sync/status.rs",
    ),
    need(
        Part::Bootstrap,
        CORE,
        "namespaces",
        &["get", "create", "patch"],
        "creates capstan-system (or the Lease's namespace) on a cluster that lacks it",
        "src/runtime.rs, src/sync/status.rs, src/election.rs, src/history.rs",
    ),
    // ---- module-nmc ----
    need(
        MODULE_NMC,
        CORE,
        "nodes",
        WATCH,
        "watches every Node, whose labels and kernel decide the Modules it gets",
        "src/controllers/caches.rs",
    ),
    need(
        MODULE_NMC,
        KMM,
        "modules",
        WATCH,
        "watches the Modules",
        "src/controllers/caches.rs",
    ),
    need(
        MODULE_NMC,
        KMM,
        "modules",
        &["patch"],
        "adds and removes the Module's finalizer",
        "src/controllers/module_nmc/reconciler.rs",
    ),
    need(
        MODULE_NMC,
        KMM,
        "modules/status",
        &["patch"],
        "writes the Module's status.moduleLoader and conditions",
        "src/controllers/module_nmc/reconciler.rs",
    ),
    need(
        MODULE_NMC,
        CORE,
        "namespaces",
        &["patch"],
        "labels a namespace that holds Modules kmm.node.k8s.io/contains-modules, as upstream KMM",
        "src/controllers/module_nmc/reconciler.rs",
    ),
    need(
        MODULE_NMC,
        KMM,
        "nodemodulesconfigs",
        &["list", "watch", "create", "patch"],
        "writes each node's NodeModulesConfig: the Modules it lists",
        "src/controllers/caches.rs, src/controllers/module_nmc/reconciler.rs",
    ),
    need(
        MODULE_NMC,
        CORE,
        "pods",
        WATCH,
        "shares the nmc controller's watch of the worker pods",
        "src/controllers/caches.rs (Stores)",
    ),
    // ---- nmc ----
    need(
        NMC,
        CORE,
        "nodes",
        WATCH,
        "watches every Node: its kernel, boot and readiness decide the worker pods",
        "src/controllers/caches.rs",
    ),
    need(
        NMC,
        CORE,
        "nodes",
        &["patch"],
        "writes the node's module-ready labels",
        "src/controllers/nmc/reconciler.rs",
    ),
    need(
        NMC,
        KMM,
        "modules",
        WATCH,
        "reads the Modules its worker pods and Events name",
        "src/controllers/caches.rs",
    ),
    need(
        NMC,
        KMM,
        "nodemodulesconfigs",
        &["list", "watch", "get", "patch"],
        "watches the NodeModulesConfigs (reading one afresh while the watch lags its own write) and writes their labels and failure annotation",
        "src/controllers/caches.rs, src/controllers/nmc/reconciler.rs",
    ),
    need(
        NMC,
        KMM,
        "nodemodulesconfigs/status",
        &["patch"],
        "records which modules each node has loaded",
        "src/controllers/nmc/reconciler.rs",
    ),
    need(
        NMC,
        KMM,
        "nodemodulesconfigs/finalizers",
        &["update"],
        "makes worker pods its NodeModulesConfig owns with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
        "src/controllers/nmc/worker_pod.rs",
    ),
    need(
        NMC,
        CORE,
        "pods",
        &["list", "watch", "create", "patch", "delete"],
        "runs the worker pods that load and unload the modules, and removes upstream KMM's finalizer from those it created",
        "src/controllers/caches.rs, src/controllers/nmc/reconciler.rs",
    ),
    need(
        NMC,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each module loaded, unloaded or failed",
        "src/controllers/nmc/reconciler.rs",
    ),
    // ---- device-plugin ----
    need(
        DEVICE_PLUGIN,
        CORE,
        "nodes",
        WATCH,
        "counts the nodes each device plugin runs on",
        "src/controllers/caches.rs",
    ),
    need(
        DEVICE_PLUGIN,
        KMM,
        "modules",
        WATCH,
        "watches the Modules",
        "src/controllers/caches.rs",
    ),
    need(
        DEVICE_PLUGIN,
        KMM,
        "modules/status",
        &["patch"],
        "writes the Module's status.devicePlugin",
        "src/controllers/device_plugin/reconciler.rs",
    ),
    need(
        DEVICE_PLUGIN,
        KMM,
        "modules/finalizers",
        &["update"],
        "makes DaemonSets their Module owns with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
        "src/controllers/device_plugin.rs",
    ),
    need(
        DEVICE_PLUGIN,
        APPS,
        "daemonsets",
        &["list", "watch", "create", "patch", "delete"],
        "applies (server-side, creating) and deletes the device-plugin DaemonSets",
        "src/controllers/caches.rs, src/controllers/device_plugin/reconciler.rs",
    ),
    need(
        DEVICE_PLUGIN,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each device-plugin DaemonSet created or deleted",
        "src/controllers/device_plugin/reconciler.rs",
    ),
    need(
        DEVICE_PLUGIN,
        CORE,
        "pods",
        &["list", "watch", "patch"],
        "watches the device-plugin pods and removes the node-labeler finalizer of a deleted one once its node's label is settled",
        "src/controllers/caches.rs, src/controllers/device_plugin/ready_label/reconciler.rs",
    ),
    need(
        DEVICE_PLUGIN,
        CORE,
        "nodes",
        &["patch"],
        "writes the device-plugin-ready labels of the nodes where a device-plugin pod is ready",
        "src/controllers/device_plugin/ready_label/reconciler.rs",
    ),
    // ---- dra ----
    need(
        DRA,
        CORE,
        "nodes",
        WATCH,
        "counts the nodes each DRA driver runs on",
        "src/controllers/caches.rs",
    ),
    need(
        DRA,
        CORE,
        "nodes",
        &["patch"],
        "sets and removes the dra-ready label of a node while a DRA driver pod is ready there",
        "src/controllers/dra/reconciler.rs",
    ),
    need(
        DRA,
        CORE,
        "pods",
        WATCH,
        "watches the DRA driver pods",
        "src/controllers/caches.rs",
    ),
    need(
        DRA,
        KMM,
        "modules",
        WATCH,
        "watches the Modules",
        "src/controllers/caches.rs",
    ),
    need(
        DRA,
        KMM,
        "modules/status",
        &["patch"],
        "writes the Module's status.dra",
        "src/controllers/dra/reconciler.rs",
    ),
    need(
        DRA,
        KMM,
        "modules/finalizers",
        &["update"],
        "makes DaemonSets their Module owns with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
        "src/controllers/dra.rs",
    ),
    need(
        DRA,
        APPS,
        "daemonsets",
        &["list", "watch", "create", "patch", "delete"],
        "applies (server-side, creating) and deletes the DRA driver DaemonSets",
        "src/controllers/caches.rs, src/controllers/dra/reconciler.rs",
    ),
    need(
        DRA,
        RESOURCE,
        "deviceclasses",
        &["list", "watch", "create", "patch", "delete"],
        "applies (server-side, creating) and deletes the DeviceClasses of spec.dra.deviceClasses",
        "src/controllers/caches.rs, src/controllers/dra/reconciler.rs",
    ),
    need(
        DRA,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each DRA driver DaemonSet created or deleted, and for DeviceClasses it cannot manage",
        "src/controllers/dra/reconciler.rs",
    ),
    // ---- version-labels ----
    need(
        VERSION_LABELS,
        CORE,
        "nodes",
        WATCH,
        "watches every Node's version labels",
        "src/controllers/caches.rs",
    ),
    need(
        VERSION_LABELS,
        CORE,
        "nodes",
        &["get", "list", "patch"],
        "reads a node afresh before moving it, lists every node to count the upgrade slots, and writes the internal version labels, upgrade annotations and cordon",
        "src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        KMM,
        "modules",
        WATCH,
        "watches the Modules' versions",
        "src/controllers/caches.rs",
    ),
    need(
        VERSION_LABELS,
        CORE,
        "pods",
        WATCH,
        "watches the device-plugin and DRA driver pods, whose end on a node an upgrade step waits for",
        "src/controllers/caches.rs, src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        CAPSTAN,
        "gitsyncs",
        WATCH,
        "reads maxNodesInFlight and requirePullRequest from the GitSyncs",
        "src/controllers/caches.rs, src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        UPGRADE,
        "upgradeconfigs",
        WATCH,
        "holds a move until its campaign starts",
        "src/controllers/caches.rs",
    ),
    need(
        VERSION_LABELS,
        CAPSTAN,
        "historyrecords",
        &["create", "get"],
        "records each upgrade step and drain against its commit, and reads the time of a step recorded before a restart",
        "src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each upgrade step and wait",
        "src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        CORE,
        "pods",
        &["get", "list", "create", "delete"],
        "runs, reads and deletes the check pods of pod gates in capstan-system, and lists the pods on a node a CEL gate reads",
        "src/controllers/version_labels/reconciler.rs",
    ),
    need(
        VERSION_LABELS,
        CORE,
        "secrets",
        &["get"],
        "reads a Module's imageRepoSecret to ask its registry for the kmod image (the preflight)",
        "src/controllers/checks/image.rs",
    ),
    // ---- campaigns ----
    need(
        CAMPAIGNS,
        UPGRADE,
        "upgradeconfigs",
        WATCH,
        "watches the UpgradeConfig campaigns",
        "src/controllers/caches.rs",
    ),
    need(
        CAMPAIGNS,
        UPGRADE,
        "upgradeconfigs/status",
        &["patch"],
        "writes each campaign's history and phase",
        "src/controllers/campaign/reconciler.rs",
    ),
    need(
        CAMPAIGNS,
        CORE,
        "nodes",
        WATCH,
        "tallies the nodes at each campaign's version",
        "src/controllers/caches.rs",
    ),
    need(
        CAMPAIGNS,
        CAPSTAN,
        "gitsyncs",
        WATCH,
        "reads the upgradeWindow policy from the GitSyncs",
        "src/controllers/caches.rs",
    ),
    need(
        CAMPAIGNS,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event when a campaign starts, is delayed, fails or ends",
        "src/controllers/campaign/reconciler.rs",
    ),
    // ---- drain ----
    need(
        DRAIN,
        CORE,
        "nodes",
        WATCH,
        "watches the nodes cordoned for an upgrade",
        "src/controllers/caches.rs",
    ),
    need(
        DRAIN,
        CORE,
        "nodes",
        &["get", "patch"],
        "reads a node afresh and marks its drain done",
        "src/controllers/drain/reconciler.rs",
    ),
    need(
        DRAIN,
        CORE,
        "pods",
        &["list"],
        "lists the pods on the node it drains",
        "src/controllers/drain/reconciler.rs",
    ),
    need(
        DRAIN,
        CORE,
        "pods/eviction",
        &["create"],
        "evicts them, as kubectl drain does (PodDisruptionBudgets honoured)",
        "src/controllers/drain/reconciler.rs",
    ),
    need(
        DRAIN,
        CAPSTAN,
        "gitsyncs",
        WATCH,
        "reads which commit asked for a drain from the GitSyncs",
        "src/controllers/caches.rs",
    ),
    need(
        DRAIN,
        CAPSTAN,
        "historyrecords",
        &["create"],
        "records the end of each drain",
        "src/controllers/version_labels/reconciler.rs (write_drain_record)",
    ),
    need(
        DRAIN,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event at the end of each drain",
        "src/controllers/version_labels/reconciler.rs (write_drain_record)",
    ),
    // ---- nodekeeper ----
    need(
        NODEKEEPER,
        CORE,
        "nodes",
        WATCH,
        "watches the nodes being drained",
        "src/controllers/caches.rs",
    ),
    need(
        NODEKEEPER,
        CORE,
        "nodes",
        &["get"],
        "reads a node afresh before forcing its drain",
        "src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        UPGRADE,
        "upgradeconfigs",
        WATCH,
        "watches the campaigns under which it forces drains",
        "src/controllers/caches.rs, src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        CAPSTAN,
        "gitsyncs",
        WATCH,
        "reads the nodeDrain policy from the GitSyncs",
        "src/controllers/caches.rs, src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        CORE,
        "pods",
        &["list", "delete", "patch"],
        "lists the pods of a node whose drain outlasts its timeout, deletes them or strips their finalizers",
        "src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        "policy",
        "poddisruptionbudgets",
        &["list"],
        "tells which pods a PodDisruptionBudget protects",
        "src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        CAPSTAN,
        "historyrecords",
        &["create"],
        "records each drain strategy it runs",
        "src/controllers/nodekeeper/reconciler.rs",
    ),
    need(
        NODEKEEPER,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes an Event for each drain strategy it runs",
        "src/controllers/nodekeeper/reconciler.rs",
    ),
    // ---- lws ----
    need(
        LWS_CONTROLLER,
        LWS,
        "leaderworkersets",
        &["list", "watch", "get"],
        "watches the LeaderWorkerSets and reads one afresh before reconciling it",
        "src/controllers/caches.rs, src/controllers/lws/reconciler.rs",
    ),
    need(
        LWS_CONTROLLER,
        LWS,
        "leaderworkersets/status",
        &["patch"],
        "writes the LeaderWorkerSet's status",
        "src/controllers/lws/reconciler.rs",
    ),
    need(
        LWS_CONTROLLER,
        LWS,
        "leaderworkersets/finalizers",
        &["update"],
        "makes StatefulSets, revisions and Services the LeaderWorkerSet owns with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
        "src/controllers/lws/revision.rs, src/controllers/lws/statefulsets.rs",
    ),
    need(
        LWS_CONTROLLER,
        APPS,
        "statefulsets",
        &["list", "watch", "get", "create", "patch"],
        "applies each leader StatefulSet (server-side, creating) and creates each group's worker StatefulSet",
        "src/controllers/caches.rs, src/controllers/lws/reconciler.rs, src/controllers/lws/pods.rs",
    ),
    need(
        LWS_CONTROLLER,
        APPS,
        "controllerrevisions",
        &["list", "get", "create", "delete"],
        "keeps the LeaderWorkerSet's revisions",
        "src/controllers/lws/reconciler.rs, src/controllers/lws/pods.rs",
    ),
    need(
        LWS_CONTROLLER,
        CORE,
        "pods",
        &["list", "watch", "patch", "delete"],
        "watches the groups' pods, labels them, and deletes a leader to restart its group",
        "src/controllers/caches.rs, src/controllers/lws/pods.rs",
    ),
    need(
        LWS_CONTROLLER,
        CORE,
        "pods/finalizers",
        &["update"],
        "makes worker StatefulSets and Services a leader pod owns with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
        "src/controllers/lws/statefulsets.rs, src/controllers/lws/pods.rs",
    ),
    need(
        LWS_CONTROLLER,
        CORE,
        "services",
        &["get", "create"],
        "creates the groups' headless Services",
        "src/controllers/lws/reconciler.rs",
    ),
    need(
        LWS_CONTROLLER,
        CORE,
        "nodes",
        &["get"],
        "reads a leader's node for exclusive topology placement",
        "src/controllers/lws/pods.rs",
    ),
    need(
        LWS_CONTROLLER,
        EVENTS,
        "events",
        EVENT_WRITES,
        "publishes the LeaderWorkerSet's Events",
        "src/controllers/lws/reconciler.rs",
    ),
    // ---- notifications ----
    need(
        NOTIFICATIONS,
        CAPSTAN,
        "gitsyncs",
        WATCH,
        "reads each GitSync's notifications and the commits it applied or rejected",
        "src/controllers/caches.rs, src/controllers/notifications/reconciler.rs",
    ),
    need(
        NOTIFICATIONS,
        CAPSTAN,
        "gitsyncs/status",
        &["patch"],
        "writes what each notification target got, and what fails, to GitSync.status.notifications",
        "src/controllers/notifications/reconciler.rs",
    ),
    need(
        NOTIFICATIONS,
        CAPSTAN,
        "historyrecords",
        &["list"],
        "reads the step records of each commit it reports on",
        "src/controllers/notifications/reconciler.rs",
    ),
    need(
        NOTIFICATIONS,
        CORE,
        "nodes",
        WATCH,
        "reads the moves under way from the nodes' upgrade annotations and labels",
        "src/controllers/caches.rs",
    ),
    need(
        NOTIFICATIONS,
        KMM,
        "nodemodulesconfigs",
        WATCH,
        "reads the kmod workers' failures a node's step waits on",
        "src/controllers/caches.rs",
    ),
    need(
        NOTIFICATIONS,
        UPGRADE,
        "upgradeconfigs",
        WATCH,
        "reads which campaigns failed",
        "src/controllers/caches.rs",
    ),
    need(
        NOTIFICATIONS,
        CORE,
        "secrets",
        &["get"],
        "reads the GitHub token or App key, and the webhooks' URLs and signing keys, from the Secrets the GitSync names in capstan's namespace",
        "src/controllers/notifications/reconciler.rs",
    ),
];

/// What one `capstan sync` process does, which decides what it needs.
#[derive(Clone, Copy, Debug)]
pub struct Usage<'a> {
    /// `--controllers`.
    pub controllers: &'a Selection,
    /// `--once`.
    pub once: bool,
    /// With `--leader-elect`: the namespace of the Lease.
    pub lease_namespace: Option<&'a str>,
}

/// Whether `part` runs in a process doing `usage`.
fn runs(part: Part, usage: &Usage<'_>) -> bool {
    match part {
        Part::Sync | Part::History => true,
        Part::Once => usage.once && !usage.controllers.is_empty(),
        Part::LeaderElection => usage.lease_namespace.is_some(),
        Part::Bootstrap => false,
        Part::Controller(name) => usage.controllers.contains(name),
    }
}

/// The rows of [`NEEDS`] a process doing `usage` needs; [`Part::Bootstrap`] never.
pub fn needs(usage: &Usage<'_>) -> Vec<&'static Need> {
    NEEDS.iter().filter(|need| runs(need.part, usage)).collect()
}

/// Every part of `capstan sync --controllers <selection>`, with or without `--once` and
/// leader election.
fn shipped(selection: &Selection) -> Usage<'_> {
    Usage {
        controllers: selection,
        once: true,
        lease_namespace: Some(capstan_api::capstan::SYSTEM_NAMESPACE),
    }
}

/// The cluster-wide rules of `capstan sync --controllers <selection>`, one per group and
/// resource with every verb any part needs: the `capstan` ClusterRole's rules.
pub fn rules_for(selection: &Selection) -> Vec<PolicyRule> {
    let usage = shipped(selection);
    merged(
        needs(&usage)
            .into_iter()
            .filter(|n| n.scope == Scope::Cluster),
    )
}

/// The rules of the Lease, for a Role in the Lease's namespace.
pub fn election_rules() -> Vec<PolicyRule> {
    merged(NEEDS.iter().filter(|n| n.scope == Scope::LeaseNamespace))
}

/// The rules of `needs` merged: one per (group, resource), core group first then by
/// group, its verbs in [`VERBS`] order.
pub fn merged<'a>(needs: impl IntoIterator<Item = &'a Need>) -> Vec<PolicyRule> {
    let mut by_resource: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for need in needs {
        let verbs = by_resource.entry((need.group, need.resource)).or_default();
        verbs.extend(need.verbs.iter().copied());
    }
    by_resource
        .into_iter()
        .map(|((group, resource), verbs)| rule(group, &[resource], &verbs))
        .collect()
}

/// A rule on `resources` of `group`, its verbs deduplicated in [`VERBS`] order.
pub fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: VERBS
            .iter()
            .filter(|verb| verbs.contains(verb))
            .map(|verb| verb.to_string())
            .collect(),
        ..PolicyRule::default()
    }
}

/// The parts that need each verb of `group`/`resource`, for the rule comments of the
/// shipped ClusterRole: `("module-nmc", ["list", "watch"])`, in [`NEEDS`] order.
pub fn parts_needing(
    selection: &Selection,
    group: &str,
    resource: &str,
) -> Vec<(&'static str, Vec<&'static str>)> {
    let usage = shipped(selection);
    let mut parts: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for need in needs(&usage) {
        if need.group != group || need.resource != resource {
            continue;
        }
        let position = match parts
            .iter()
            .position(|(part, _)| *part == need.part.short())
        {
            Some(position) => position,
            None => {
                parts.push((need.part.short(), Vec::new()));
                parts.len() - 1
            }
        };
        parts[position].1.extend(need.verbs.iter().copied());
    }
    for (_, verbs) in &mut parts {
        let given = std::mem::take(verbs);
        *verbs = VERBS.into_iter().filter(|v| given.contains(v)).collect();
    }
    parts
}

/// The kinds a repository may hold beyond capstan's own, by default: Namespaces,
/// ConfigMaps, Services, ServiceAccounts and Deployments, with what the sync does to a
/// kind it applies. Secrets are left out: reading every Secret of the cluster is the
/// largest grant there is, and a repository holds them rarely (sealed, or from an
/// external store). A kind the role does not grant rejects the commit that holds it,
/// naming the object and the verb the API server refused.
pub fn repository_rules() -> Vec<PolicyRule> {
    vec![
        rule(
            CORE,
            &["namespaces", "configmaps", "services", "serviceaccounts"],
            APPLIED,
        ),
        rule(APPS, &["deployments"], APPLIED),
    ]
}

/// The `capstan` ClusterRole: [`rules_for`] `selection`.
pub fn cluster_role(selection: &Selection) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(NAME.to_string()),
            ..ObjectMeta::default()
        },
        rules: Some(rules_for(selection)),
        ..ClusterRole::default()
    }
}

/// The `capstan-leader-election` Role in `namespace`: [`election_rules`].
pub fn election_role(namespace: &str) -> Role {
    Role {
        metadata: ObjectMeta {
            name: Some(ELECTION_ROLE.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        rules: Some(election_rules()),
    }
}

#[cfg(test)]
mod tests;
