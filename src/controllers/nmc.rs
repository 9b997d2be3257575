//! The NodeModulesConfig controller, per node (seed 000, "NMC controller decision-making
//! flow", and seed 001's reconciliation loop).
//!
//! [`decide`] takes the NMC's spec, status entries and recorded worker failures, the node,
//! the worker pods on it and the time, and returns what to write. The reconciler applies it
//! in this order, and stops at the first failure:
//!
//! 1. the NMC status, recording what finished worker pods did: a loader's config and the
//!    node's boot ID, or an unloader's removal of the entry; then the NMC's worker failures
//!    and `module-in-use` labels;
//! 2. the worker pods to delete: finished ones (their outcome is now in the status) and
//!    in-flight ones doing what is no longer wanted;
//! 3. the worker pods to create, at most one per node and module at a time;
//! 4. the node's ready labels;
//! 5. an Event for each worker outcome read for the first time.
//!
//! Finished pods are read whatever the node's state. Then, on a node that is not Ready, or
//! that the module's tolerations do not allow, nothing else happens for the module and its
//! ready labels go. For a module with no worker pod on the node:
//!
//! | spec | status | condition | step |
//! | --- | --- | --- | --- |
//! | yes | no | spec kernel is the node's | [`ModuleStep::LoadMissing`] |
//! | yes | no | spec kernel is not the node's | [`ModuleStep::SpecForOtherKernel`] |
//! | no | yes | node rebooted since the status | [`ModuleStep::ForgetAfterReboot`] |
//! | no | yes | status kernel is the node's | [`ModuleStep::UnloadUnwanted`] |
//! | no | yes | status kernel is not the node's | [`ModuleStep::StatusForOtherKernel`] |
//! | differs | | status kernel is the node's, same boot | [`ModuleStep::UnloadOldConfig`] |
//! | differs | | else spec kernel is the node's | [`ModuleStep::LoadNewConfig`] |
//! | differs | | else | [`ModuleStep::NeitherKernelRunning`] |
//! | equal | | same boot | [`ModuleStep::InSync`] |
//! | equal | | rebooted, spec kernel is the node's | [`ModuleStep::ReloadAfterReboot`] |
//! | equal | | rebooted, spec kernel is not the node's | [`ModuleStep::SpecForOtherKernel`] |
//!
//! A reboot is a Ready node whose boot ID differs from the one the status entry recorded:
//! the module is not loaded any more. Seed 001 compares a status timestamp with the node's
//! last Ready transition instead; that comparison is made here when the status is written:
//! a loader that finished before the node's last Ready transition is recorded without a
//! boot ID, because the node may have rebooted after it finished, so it is loaded again.
//!
//! Where upstream KMM leaves a worker pod doing the wrong thing, this controller deletes it:
//! an unloader of a module that is wanted again (KMM issue 1333) and a loader that has not
//! started for a module that is gone or whose config changed (KMM issue 1004). A worker pod
//! whose module is gone is still read and deleted when it finishes. A pod already being
//! deleted is read but not deleted again.
//!
//! Failed workers back off (see [`failures`](super::failures)): each failed pod deleted is
//! counted once in the NMC's failure record (a pod the record already holds is one the
//! cache shows again before its deletion), a succeeded one clears its module's failures,
//! and failures of modules in neither the spec nor the status are forgotten. A worker pod
//! to create for a module whose backoff has not run out is held, and the node is looked at
//! again when the first backoff ends ([`NmcDecision::retry_after`]).

pub mod expectations;
pub mod own_writes;
pub mod pending;
pub mod reconciler;
pub mod worker_pod;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{LocalObjectReference, Pod, Toleration};
use thiserror::Error;

use super::failures::WorkerFailures;
use super::node::NodeFacts;
use capstan_api::clock::rfc3339;
use capstan_api::labels::{
    LabelError, MODULE_NAME_LABEL, ModuleKey, ModuleLabel, WORKER_ACTION_LABEL,
    WORKER_CONFIG_ANNOTATION, WORKER_MODULE_VERSION_ANNOTATION, WORKER_POD_FINALIZER,
    WORKER_TOLERATIONS_ANNOTATION, WorkerAction, is_deprecated_ready_label,
};
use capstan_api::nmc::{ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfig};
use capstan_worker::config as worker_config;

/// `status.phase` of a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPhase {
    /// Accepted, not all containers started (also a pod without a status yet).
    Pending,
    /// Bound and at least one container running.
    Running,
    /// All containers ended successfully.
    Succeeded,
    /// All containers ended, at least one in failure.
    Failed,
    /// The kubelet cannot report the pod's state.
    Unknown,
}

impl PodPhase {
    /// Reads `status.phase`; a pod without one is `Pending`.
    pub fn from_status(phase: Option<&str>) -> PodPhase {
        match phase {
            None | Some("Pending") => PodPhase::Pending,
            Some("Running") => PodPhase::Running,
            Some("Succeeded") => PodPhase::Succeeded,
            Some("Failed") => PodPhase::Failed,
            Some(_) => PodPhase::Unknown,
        }
    }

    /// True for `Succeeded` and `Failed`.
    pub fn is_finished(self) -> bool {
        matches!(self, PodPhase::Succeeded | PodPhase::Failed)
    }
}

/// A KMM worker pod on the node, as the controller decides on it.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerPod {
    /// Pod name (`kmm-worker-<node>-<module>`).
    pub name: String,
    /// `metadata.uid`: the precondition of its deletion, and how its failure is counted once.
    pub uid: Option<String>,
    /// The Module it works for; the pod lives in the Module's namespace.
    pub module: ModuleKey,
    /// Load or unload.
    pub action: WorkerAction,
    /// `status.phase`.
    pub phase: PodPhase,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.finalizers` holds upstream KMM's worker-pod finalizer: upstream KMM
    /// created the pod, and nothing but this controller will remove the finalizer now.
    pub upstream_finalizer: bool,
    /// The config in its `worker-config` annotation, or why it cannot be read.
    pub config: Result<ModuleConfig, String>,
    /// Its `worker-module-version` annotation.
    pub version: String,
    /// `spec.serviceAccountName`.
    pub service_account_name: String,
    /// The first of `spec.imagePullSecrets`.
    pub image_repo_secret: Option<LocalObjectReference>,
    /// The tolerations the controller gave it: its `worker-tolerations` annotation, as
    /// upstream reads them back; `spec.tolerations` for a pod without one. The spec also
    /// holds what admission added (the `not-ready` and `unreachable` tolerations of
    /// `DefaultTolerationSeconds`), which are no choice of the Module's.
    pub tolerations: Vec<Toleration>,
    /// When its last container ended.
    pub finished_at: Option<Timestamp>,
    /// For a failed pod, why, in one line (see [`failure_message`]).
    pub failure: Option<String>,
}

/// Why a pod cannot be read as a worker pod.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum WorkerPodError {
    /// A label that marks a worker pod is missing or wrong.
    #[error("pod {pod} is not a KMM worker pod: {missing}")]
    NotAWorker {
        /// `namespace/name` of the pod.
        pod: String,
        /// What it lacks.
        missing: String,
    },
    /// Namespace and module label do not make a valid Module key.
    #[error("worker pod {pod} names an invalid Module: {source}")]
    InvalidModule {
        /// `namespace/name` of the pod.
        pod: String,
        /// Why the key is invalid.
        source: LabelError,
    },
}

impl WorkerPod {
    /// Reads a worker pod: its module label, action label, phase, config annotation (read
    /// strictly, as the worker reads it), the times its containers ended and, when it
    /// failed, why.
    ///
    /// Fails when the module or action label is missing or invalid.
    pub fn from_pod(pod: &Pod) -> Result<WorkerPod, WorkerPodError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let id = format!("{namespace}/{name}");
        let label = |key: &str| pod.metadata.labels.as_ref().and_then(|l| l.get(key));
        let annotation = |key: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(key));
        let not_a_worker = |missing: String| WorkerPodError::NotAWorker {
            pod: id.clone(),
            missing,
        };
        let module_name = label(MODULE_NAME_LABEL)
            .ok_or_else(|| not_a_worker(format!("no {MODULE_NAME_LABEL} label")))?;
        let action = label(WORKER_ACTION_LABEL)
            .and_then(|value| WorkerAction::from_label_value(value))
            .ok_or_else(|| {
                not_a_worker(format!("no {WORKER_ACTION_LABEL} label of Load or Unload"))
            })?;
        let module =
            ModuleKey::new(namespace.as_str(), module_name.as_str()).map_err(|source| {
                WorkerPodError::InvalidModule {
                    pod: id.clone(),
                    source,
                }
            })?;
        let config = match annotation(WORKER_CONFIG_ANNOTATION) {
            Some(text) => worker_config::parse_cached(
                text,
                &format!("pod {id} annotation {WORKER_CONFIG_ANNOTATION}"),
            )
            .map_err(|err| err.to_string()),
            None => Err(format!(
                "pod {id} has no {WORKER_CONFIG_ANNOTATION} annotation"
            )),
        };
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let phase = PodPhase::from_status(status.and_then(|s| s.phase.as_deref()));
        Ok(WorkerPod {
            uid: pod.metadata.uid.clone(),
            module,
            action,
            phase,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            upstream_finalizer: pod
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == WORKER_POD_FINALIZER),
            config,
            version: annotation(WORKER_MODULE_VERSION_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
            service_account_name: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            image_repo_secret: spec
                .and_then(|s| s.image_pull_secrets.as_ref())
                .and_then(|secrets| secrets.first().cloned()),
            tolerations: annotation(WORKER_TOLERATIONS_ANNOTATION)
                .and_then(|text| serde_saphyr::from_str::<Vec<Toleration>>(text).ok())
                .or_else(|| spec.and_then(|s| s.tolerations.clone()))
                .unwrap_or_default(),
            finished_at: status
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
                .map(|time| time.0)
                .max(),
            failure: (phase == PodPhase::Failed).then(|| failure_message(pod)),
            name,
        })
    }
}

/// What a failed worker pod that says nothing about its end is reported with.
const NO_FAILURE_REASON: &str = "the worker failed without a reason";

/// The one-line reason a finished worker pod gives: its container's termination message or
/// reason, else the pod's message or reason.
pub fn failure_message(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .next();
    terminated
        .and_then(|t| t.message.clone().or_else(|| t.reason.clone()))
        .or_else(|| status.and_then(|s| s.message.clone()))
        .or_else(|| status.and_then(|s| s.reason.clone()))
        .map(|m| m.lines().next().unwrap_or_default().trim().to_string())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| NO_FAILURE_REASON.to_string())
}

/// Everything the NMC controller decides on for one node.
#[derive(Clone, Copy, Debug)]
pub struct NmcInput<'a> {
    /// The node (its NMC has the same name).
    pub node: &'a NodeFacts,
    /// `spec.modules`: what should be loaded.
    pub spec: &'a [NodeModuleSpec],
    /// `status.modules`: what worker pods reported loaded.
    pub status: &'a [NodeModuleStatus],
    /// The worker pods on the node, of every module.
    pub pods: &'a [WorkerPod],
    /// The NMC's labels (for its `module-in-use` labels).
    pub nmc_labels: &'a BTreeMap<String, String>,
    /// The worker failures recorded on the NMC.
    pub failures: &'a WorkerFailures,
    /// When the failures read in this pass happened; how much of a backoff is left.
    pub now: Timestamp,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl<'a> NmcInput<'a> {
    /// The input for `nmc` on `node`, with the worker pods on the node and the failures
    /// recorded on the NMC ([`WorkerFailures::of`]), at `now`.
    pub fn new(
        node: &'a NodeFacts,
        nmc: &'a NodeModulesConfig,
        pods: &'a [WorkerPod],
        failures: &'a WorkerFailures,
        now: Timestamp,
    ) -> Self {
        NmcInput {
            node,
            spec: &nmc.spec.modules,
            status: nmc
                .status
                .as_ref()
                .map(|status| status.modules.as_slice())
                .unwrap_or_default(),
            pods,
            nmc_labels: nmc.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            failures,
            now,
        }
    }
}

/// What the NMC controller writes for one node; see the module docs for the order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NmcDecision {
    /// The new `status.modules`, when it changes. Written before any pod is deleted.
    pub status: Option<Vec<NodeModuleStatus>>,
    /// The NMC's worker failures, when they change. Written before any pod is deleted.
    pub failures: Option<WorkerFailures>,
    /// Worker pods to free of upstream KMM's finalizer first: those to delete and those
    /// being deleted already that upstream KMM created. Without it they stay Terminating,
    /// and their names, which new worker pods take, stay taken.
    pub release: Vec<PodRelease>,
    /// Worker pods to delete; none already being deleted.
    pub delete: Vec<PodDeletion>,
    /// Worker pods to create now.
    pub create: Vec<WorkerPodPlan>,
    /// Modules whose worker pod is not created yet because their last worker failed, and
    /// how long their backoff has left.
    pub backoff: BTreeMap<ModuleKey, Duration>,
    /// Ready labels to set on and remove from the node.
    pub node_labels: LabelChanges,
    /// `module-in-use` labels to remove from the NMC.
    pub nmc_labels: LabelChanges,
    /// What finished worker pods did, read for the first time: reported as Events.
    pub outcomes: Vec<WorkerOutcome>,
    /// The branch taken for every module on the node.
    pub steps: BTreeMap<ModuleKey, ModuleStep>,
    /// Entries and pods that could not be acted on.
    pub problems: Vec<NmcProblem>,
}

impl NmcDecision {
    /// When the node is to be looked at again by itself: when the first backoff ends.
    pub fn retry_after(&self) -> Option<Duration> {
        self.backoff.values().min().copied()
    }
}

/// A worker pod to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDeletion {
    /// Its namespace (the Module's).
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID, the deletion's precondition: a pod of the same name created since is not
    /// this one.
    pub uid: Option<String>,
    /// The Module it works for.
    pub module: ModuleKey,
    /// Why it goes.
    pub reason: DeleteReason,
}

/// A worker pod to free of upstream KMM's finalizer ([`WORKER_POD_FINALIZER`]). Removing
/// it from a pod of the same name created since, which has none, changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRelease {
    /// Its namespace (the Module's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Why a worker pod is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// It succeeded and the status records its outcome.
    Succeeded,
    /// It failed; a new worker is created from the current spec and status.
    Failed,
    /// A loader that has not started, for a config the spec no longer holds.
    OutdatedLoader,
    /// A loader that has not started, for a module no longer wanted on the node.
    UnwantedLoader,
    /// An unloader of exactly what the spec wants loaded.
    UnwantedUnloader,
}

/// What a finished worker pod did, as its Events tell it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerOutcome {
    /// The Module it worked for.
    pub module: ModuleKey,
    /// Load or unload.
    pub action: WorkerAction,
    /// Why it failed; `None` when it succeeded.
    pub failure: Option<String>,
}

impl WorkerOutcome {
    /// The Event's reason: `ModuleLoaded` and `ModuleUnloaded` as upstream, or
    /// `WorkerFailed`.
    pub fn reason(&self) -> &'static str {
        match (&self.failure, self.action) {
            (Some(_), _) => "WorkerFailed",
            (None, WorkerAction::Load) => "ModuleLoaded",
            (None, WorkerAction::Unload) => "ModuleUnloaded",
        }
    }

    /// The Event's note, for the worker on `node`.
    pub fn note(&self, node: &str) -> String {
        let module = &self.module;
        match (&self.failure, self.action) {
            (Some(message), action) => format!(
                "{} of Module {module} failed on node {node}: {message}",
                action.as_str()
            ),
            (None, WorkerAction::Load) => format!("Module {module} loaded into the kernel"),
            (None, WorkerAction::Unload) => format!("Module {module} unloaded from the kernel"),
        }
    }
}

/// A worker pod to create.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerPodPlan {
    /// `kmm-worker-<node>-<module>`.
    pub name: String,
    /// The Module; the pod goes in its namespace.
    pub module: ModuleKey,
    /// Load or unload.
    pub action: WorkerAction,
    /// Service account of the pod.
    pub service_account_name: String,
    /// Pull secret of the kmod image.
    pub image_repo_secret: Option<LocalObjectReference>,
    /// Tolerations of the pod.
    pub tolerations: Vec<Toleration>,
    /// The module version (the `worker-module-version` annotation).
    pub version: String,
    /// What to load or unload (the `worker-config` annotation).
    pub config: ModuleConfig,
}

impl WorkerPodPlan {
    /// The loader of `entry`, the NMC spec entry of `module` on `node`.
    pub fn loader(node: &str, module: &ModuleKey, entry: &NodeModuleSpec) -> WorkerPodPlan {
        WorkerPodPlan {
            name: module.worker_pod_name(node),
            module: module.clone(),
            action: WorkerAction::Load,
            service_account_name: entry.service_account_name.clone(),
            image_repo_secret: entry.image_repo_secret.clone(),
            tolerations: entry.tolerations.clone(),
            version: entry.version.clone(),
            config: entry.config.clone(),
        }
    }

    fn unloader(node: &str, module: &ModuleKey, entry: &NodeModuleStatus) -> WorkerPodPlan {
        WorkerPodPlan {
            name: module.worker_pod_name(node),
            module: module.clone(),
            action: WorkerAction::Unload,
            service_account_name: entry.service_account_name.clone(),
            image_repo_secret: entry.image_repo_secret.clone(),
            tolerations: entry.tolerations.clone(),
            version: entry.version.clone(),
            config: entry.config.clone(),
        }
    }
}

/// Labels to set and to remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelChanges {
    /// Labels to add or change, with their values.
    pub set: BTreeMap<String, String>,
    /// Labels to remove.
    pub remove: BTreeSet<String>,
}

impl LabelChanges {
    /// True when nothing changes.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }
}

/// The branch of the NMC flowchart taken for one module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleStep {
    /// The node is not Ready: only finished pods are read.
    NodeNotReady,
    /// The node is cordoned or tainted against the module's tolerations.
    NodeUnschedulable,
    /// A worker pod of the module is on the node (running, just finished, or being
    /// deleted); the next pass decides.
    WaitForWorker,
    /// A loader not started yet was deleted: its config is not the spec's any more.
    CancelOutdatedLoader,
    /// A loader not started yet was deleted: the module is not wanted on the node.
    CancelUnwantedLoader,
    /// An unloader was deleted: the spec wants back what it removes.
    CancelUnloader,
    /// No status: a loader for the spec.
    LoadMissing,
    /// Spec and status differ and the status is loaded on the node's kernel: an unloader of
    /// the status' config, before loading the new one.
    UnloadOldConfig,
    /// Spec and status differ, the status is for another kernel or a previous boot: a loader
    /// for the spec.
    LoadNewConfig,
    /// Spec equals status but the node rebooted since: a loader again.
    ReloadAfterReboot,
    /// No spec, the status is loaded on the node's kernel: an unloader.
    UnloadUnwanted,
    /// No spec and the node rebooted since the status: nothing is loaded, the entry goes.
    ForgetAfterReboot,
    /// The spec is for a kernel the node does not run.
    SpecForOtherKernel,
    /// No spec, and the status is for a kernel the node does not run.
    StatusForOtherKernel,
    /// Spec and status differ and neither is for the node's kernel.
    NeitherKernelRunning,
    /// Spec and status are equal, in this boot.
    InSync,
}

impl DeleteReason {
    fn cancel_step(self) -> ModuleStep {
        match self {
            DeleteReason::OutdatedLoader => ModuleStep::CancelOutdatedLoader,
            DeleteReason::UnwantedLoader => ModuleStep::CancelUnwantedLoader,
            DeleteReason::UnwantedUnloader => ModuleStep::CancelUnloader,
            DeleteReason::Succeeded | DeleteReason::Failed => ModuleStep::WaitForWorker,
        }
    }
}

/// Something the controller could not act on.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum NmcProblem {
    /// An NMC entry whose namespace and name are not a valid Module key; it is left alone.
    #[error("NMC entry {namespace}/{name} is skipped: {source}")]
    InvalidEntry {
        /// The entry's namespace.
        namespace: String,
        /// The entry's name.
        name: String,
        /// Why the key is invalid.
        source: LabelError,
    },
    /// A loader succeeded but its config cannot be read, so the status cannot say what is
    /// loaded; the pod is kept for inspection.
    #[error(
        "worker pod {namespace}/{pod} succeeded but its config cannot be read, so the NMC \
         status cannot record it; delete the pod to load the module again: {reason}"
    )]
    UnreadableLoaderConfig {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Why the config cannot be read.
        reason: String,
    },
}

/// Decides, for one node, what the NMC controller writes (see the module docs).
pub fn decide(input: &NmcInput<'_>) -> NmcDecision {
    let mut pass = Pass {
        node: input.node,
        status: input.status.to_vec(),
        status_changed: false,
        decision: NmcDecision::default(),
        unloading: BTreeSet::new(),
        leaving: BTreeSet::new(),
        deleted: Vec::new(),
    };

    let mut finished: Vec<&WorkerPod> = input
        .pods
        .iter()
        .filter(|pod| pod.phase.is_finished())
        .collect();
    finished.sort_by_key(|pod| pod.finished_at);
    for pod in finished {
        pass.record(pod);
    }

    let mut specs = BTreeMap::new();
    for entry in input.spec {
        match entry.key() {
            Ok(key) => {
                specs.insert(key, entry);
            }
            Err(source) => pass.invalid_entry(&entry.namespace, &entry.name, source),
        }
    }
    let mut modules: BTreeSet<ModuleKey> = specs.keys().cloned().collect();
    for entry in input.status {
        match entry.key() {
            Ok(key) => {
                modules.insert(key);
            }
            Err(source) => pass.invalid_entry(&entry.namespace, &entry.name, source),
        }
    }
    modules.extend(input.pods.iter().map(|pod| pod.module.clone()));

    for key in &modules {
        let pods: Vec<&WorkerPod> = input.pods.iter().filter(|p| &p.module == key).collect();
        let step = pass.module(key, specs.get(key).copied(), &pods);
        pass.decision.steps.insert(key.clone(), step);
    }
    pass.ready_labels(&specs);
    pass.in_use_labels(input);
    let failures = pass.worker_failures(input);
    pass.hold_during_backoff(&failures, input.now);
    if failures != *input.failures {
        pass.decision.failures = Some(failures);
    }
    if pass.status_changed {
        pass.decision.status = Some(pass.status);
    }
    pass.decision
}

/// One run of [`decide`]: the status as it evolves, and the decision so far.
struct Pass<'a> {
    node: &'a NodeFacts,
    status: Vec<NodeModuleStatus>,
    status_changed: bool,
    decision: NmcDecision,
    /// Modules with an unloader left running or created in this pass.
    unloading: BTreeSet<ModuleKey>,
    /// (namespace, name) of the pods deleted in this pass or being deleted already.
    leaving: BTreeSet<(String, String)>,
    /// The pods deleted in this pass, and why.
    deleted: Vec<(&'a WorkerPod, DeleteReason)>,
}

impl<'a> Pass<'a> {
    /// Seed 000 "get all completed Pods and update NMC statuses".
    fn record(&mut self, pod: &'a WorkerPod) {
        let reason = match (pod.phase, pod.action) {
            (PodPhase::Failed, _) => DeleteReason::Failed,
            (_, WorkerAction::Unload) => {
                self.remove_status(&pod.module);
                DeleteReason::Succeeded
            }
            (_, WorkerAction::Load) => match &pod.config {
                Ok(config) => {
                    self.set_status(self.loaded(pod, config));
                    DeleteReason::Succeeded
                }
                Err(reason) => {
                    self.decision
                        .problems
                        .push(NmcProblem::UnreadableLoaderConfig {
                            namespace: pod.module.namespace().to_string(),
                            pod: pod.name.clone(),
                            reason: reason.clone(),
                        });
                    return;
                }
            },
        };
        self.delete(pod, reason);
    }

    /// The status entry a successful loader leaves.
    fn loaded(&self, pod: &WorkerPod, config: &ModuleConfig) -> NodeModuleStatus {
        let finished_before_ready = matches!(
            (pod.finished_at, self.node.ready_since),
            (Some(finished), Some(since)) if finished < since
        );
        NodeModuleStatus {
            name: pod.module.name().to_string(),
            namespace: pod.module.namespace().to_string(),
            service_account_name: pod.service_account_name.clone(),
            image_repo_secret: pod.image_repo_secret.clone(),
            tolerations: pod.tolerations.clone(),
            version: pod.version.clone(),
            config: config.clone(),
            boot_id: if finished_before_ready {
                String::new()
            } else {
                self.node.boot_id.clone()
            },
        }
    }

    fn module(
        &mut self,
        key: &ModuleKey,
        spec: Option<&NodeModuleSpec>,
        pods: &[&'a WorkerPod],
    ) -> ModuleStep {
        let status = self.status_of(key).cloned();
        let tolerations = spec
            .map(|entry| entry.tolerations.as_slice())
            .or(status.as_ref().map(|entry| entry.tolerations.as_slice()))
            .or(pods.first().map(|pod| pod.tolerations.as_slice()))
            .unwrap_or_default();
        if !self.node.ready {
            return ModuleStep::NodeNotReady;
        }
        if !self.node.tolerates(tolerations) {
            return ModuleStep::NodeUnschedulable;
        }

        let mut cancelled = None;
        for &pod in pods.iter().filter(|pod| !pod.phase.is_finished()) {
            let cancel = if pod.deleting {
                None
            } else {
                cancel_reason(pod, spec)
            };
            match cancel {
                Some(reason) => {
                    if reason == DeleteReason::UnwantedUnloader && pod.phase != PodPhase::Pending {
                        // It may have unloaded already: forget the status so a loader runs.
                        self.remove_status(key);
                    }
                    self.delete(pod, reason);
                    cancelled.get_or_insert(reason);
                }
                None if pod.action == WorkerAction::Unload => {
                    self.unloading.insert(key.clone());
                }
                None => {}
            }
        }
        if let Some(reason) = cancelled {
            return reason.cancel_step();
        }
        if !pods.is_empty() {
            return ModuleStep::WaitForWorker;
        }
        self.without_worker(key, spec, status.as_ref())
    }

    /// The seed 000 flowchart from "node is Ready/Schedulable" on, for a module with no
    /// worker pod on the node.
    fn without_worker(
        &mut self,
        key: &ModuleKey,
        spec: Option<&NodeModuleSpec>,
        status: Option<&NodeModuleStatus>,
    ) -> ModuleStep {
        let node = self.node;
        let running = |config: &ModuleConfig| config.kernel_version == node.kernel_version;
        let rebooted = |entry: &NodeModuleStatus| entry.boot_id != node.boot_id;
        match (spec, status) {
            (Some(spec), None) if running(&spec.config) => {
                self.create(WorkerPodPlan::loader(&node.name, key, spec));
                ModuleStep::LoadMissing
            }
            (Some(_), None) => ModuleStep::SpecForOtherKernel,
            (Some(spec), Some(status)) if spec.config != status.config => {
                if !rebooted(status) && running(&status.config) {
                    self.create(WorkerPodPlan::unloader(&node.name, key, status));
                    ModuleStep::UnloadOldConfig
                } else if running(&spec.config) {
                    self.create(WorkerPodPlan::loader(&node.name, key, spec));
                    ModuleStep::LoadNewConfig
                } else {
                    ModuleStep::NeitherKernelRunning
                }
            }
            (Some(_), Some(status)) if !rebooted(status) => ModuleStep::InSync,
            (Some(spec), Some(_)) if running(&spec.config) => {
                self.create(WorkerPodPlan::loader(&node.name, key, spec));
                ModuleStep::ReloadAfterReboot
            }
            (Some(_), Some(_)) => ModuleStep::SpecForOtherKernel,
            (None, Some(status)) if rebooted(status) => {
                self.remove_status(key);
                ModuleStep::ForgetAfterReboot
            }
            (None, Some(status)) if running(&status.config) => {
                self.create(WorkerPodPlan::unloader(&node.name, key, status));
                ModuleStep::UnloadUnwanted
            }
            (None, Some(_)) => ModuleStep::StatusForOtherKernel,
            // Only reached through pods, which are handled above.
            (None, None) => ModuleStep::InSync,
        }
    }

    /// `<ns>.<name>.ready` (and `.version.ready` = the loaded version) on the node when the
    /// spec's config is loaded in this boot and no unloader is at work; removed when the
    /// module is not loaded or the node cannot run it; left alone while it changes. The
    /// deprecated `kmm.node.kubernetes.io/<name>.ready` labels are always removed.
    fn ready_labels(&mut self, specs: &BTreeMap<ModuleKey, &NodeModuleSpec>) {
        let node = self.node;
        let statuses: BTreeMap<ModuleKey, &NodeModuleStatus> = self
            .status
            .iter()
            .filter_map(|entry| Some((entry.key().ok()?, entry)))
            .collect();
        let known: BTreeSet<&ModuleKey> = specs.keys().chain(statuses.keys()).collect();
        // Label -> the value it should have, or `None` for "absent".
        let mut wanted: BTreeMap<String, Option<String>> = BTreeMap::new();
        for &key in &known {
            let spec = specs.get(key).copied();
            let status = statuses.get(key).copied();
            let tolerations = spec
                .map(|entry| entry.tolerations.as_slice())
                .or(status.map(|entry| entry.tolerations.as_slice()))
                .unwrap_or_default();
            let loaded = status.filter(|entry| entry.boot_id == node.boot_id);
            let cannot_run = !node.ready || !node.tolerates(tolerations);
            match (spec, loaded) {
                _ if cannot_run => {
                    wanted.insert(key.ready_label(), None);
                    wanted.insert(key.version_ready_label(), None);
                }
                (Some(spec), Some(loaded))
                    if spec.config == loaded.config && !self.unloading.contains(key) =>
                {
                    let version = Some(loaded.version.clone()).filter(|v| !v.is_empty());
                    wanted.insert(key.ready_label(), Some(String::new()));
                    wanted.insert(key.version_ready_label(), version);
                }
                (_, None) => {
                    wanted.insert(key.ready_label(), None);
                    wanted.insert(key.version_ready_label(), None);
                }
                _ => {}
            }
        }
        for label in node.labels.keys() {
            let readings: Vec<ModuleKey> = ModuleLabel::parse(label)
                .into_iter()
                .filter(|(kind, _)| matches!(kind, ModuleLabel::Ready | ModuleLabel::VersionReady))
                .map(|(_, key)| key)
                .collect();
            if !readings.is_empty() && readings.iter().all(|key| !known.contains(key)) {
                wanted.insert(label.clone(), None);
            }
        }
        // Left by KMM releases before namespaced Modules; upstream removes them too.
        for label in node
            .labels
            .keys()
            .filter(|key| is_deprecated_ready_label(key))
        {
            wanted.insert(label.clone(), None);
        }
        let changes = &mut self.decision.node_labels;
        for (label, value) in wanted {
            match value {
                Some(value) if node.labels.get(&label) != Some(&value) => {
                    changes.set.insert(label, value);
                }
                None if node.labels.contains_key(&label) => {
                    changes.remove.insert(label);
                }
                _ => {}
            }
        }
    }

    /// Drops the NMC's `module-in-use` labels of modules that are in neither the spec nor the
    /// status and have no worker pod left on the node.
    fn in_use_labels(&mut self, input: &NmcInput<'_>) {
        let in_use: BTreeSet<ModuleKey> = input
            .spec
            .iter()
            .filter_map(|entry| entry.key().ok())
            .chain(self.status.iter().filter_map(|entry| entry.key().ok()))
            .chain(
                input
                    .pods
                    .iter()
                    .filter(|pod| {
                        !self
                            .leaving
                            .contains(&(pod.module.namespace().to_string(), pod.name.clone()))
                    })
                    .map(|pod| pod.module.clone()),
            )
            .chain(self.decision.create.iter().map(|plan| plan.module.clone()))
            .collect();
        for label in input.nmc_labels.keys() {
            let readings: Vec<ModuleKey> = ModuleLabel::parse(label)
                .into_iter()
                .filter(|(kind, _)| *kind == ModuleLabel::ModuleInUse)
                .map(|(_, key)| key)
                .collect();
            if !readings.is_empty() && readings.iter().all(|key| !in_use.contains(key)) {
                self.decision.nmc_labels.remove.insert(label.clone());
            }
        }
    }

    fn status_of(&self, key: &ModuleKey) -> Option<&NodeModuleStatus> {
        self.status.iter().find(|entry| entry.is_for(key))
    }

    fn set_status(&mut self, entry: NodeModuleStatus) {
        let key = (entry.namespace.as_str(), entry.name.as_str());
        match self
            .status
            .iter_mut()
            .find(|e| (e.namespace.as_str(), e.name.as_str()) == key)
        {
            Some(existing) if *existing == entry => return,
            Some(existing) => *existing = entry,
            None => self.status.push(entry),
        }
        self.status_changed = true;
    }

    fn remove_status(&mut self, key: &ModuleKey) {
        let before = self.status.len();
        self.status.retain(|entry| !entry.is_for(key));
        self.status_changed |= self.status.len() != before;
    }

    /// The NMC's failure record after this pass: a failed pod deleted counts one more
    /// failure in a row and is reported, unless the record holds that pod already (the
    /// cache showed it again before its deletion); a succeeded one clears its module's
    /// failures and, when it changed the status, is reported. Failures of modules in
    /// neither the spec nor the status are forgotten: they left the node.
    fn worker_failures(&mut self, input: &NmcInput<'_>) -> WorkerFailures {
        let mut failures = input.failures.clone();
        let now = rfc3339(input.now);
        for &(pod, reason) in &self.deleted {
            let outcome = |failure| WorkerOutcome {
                module: pod.module.clone(),
                action: pod.action,
                failure,
            };
            match reason {
                DeleteReason::Succeeded => {
                    failures.clear(&pod.module);
                    // A pod the cache shows again after its deletion changes no status.
                    if self.status_changed {
                        self.decision.outcomes.push(outcome(None));
                    }
                }
                DeleteReason::Failed => {
                    let recorded = failures
                        .get(&pod.module)
                        .is_some_and(|f| Some(f.pod_uid.as_str()) == pod.uid.as_deref());
                    if recorded {
                        continue;
                    }
                    let message = pod
                        .failure
                        .clone()
                        .unwrap_or_else(|| NO_FAILURE_REASON.to_string());
                    failures.record(
                        &pod.module,
                        pod.action.as_str(),
                        &message,
                        &now,
                        pod.uid.as_deref().unwrap_or_default(),
                    );
                    self.decision.outcomes.push(outcome(Some(message)));
                }
                _ => {}
            }
        }
        let present: BTreeSet<ModuleKey> = input
            .spec
            .iter()
            .filter_map(|entry| entry.key().ok())
            .chain(self.status.iter().filter_map(|entry| entry.key().ok()))
            .collect();
        failures.retain(|key| present.contains(key));
        failures
    }

    /// Holds back the worker pods of modules whose last worker failed less than their
    /// backoff ago.
    fn hold_during_backoff(&mut self, failures: &WorkerFailures, now: Timestamp) {
        let backoff = &mut self.decision.backoff;
        self.decision.create.retain(|plan| {
            let left = failures.wait(&plan.module, now);
            if left.is_zero() {
                return true;
            }
            backoff.insert(plan.module.clone(), left);
            false
        });
    }

    fn delete(&mut self, pod: &'a WorkerPod, reason: DeleteReason) {
        self.leaving
            .insert((pod.module.namespace().to_string(), pod.name.clone()));
        if pod.upstream_finalizer {
            self.decision.release.push(PodRelease {
                namespace: pod.module.namespace().to_string(),
                name: pod.name.clone(),
            });
        }
        // A pod being deleted was read by an earlier pass, and goes without another word.
        if pod.deleting {
            return;
        }
        self.deleted.push((pod, reason));
        self.decision.delete.push(PodDeletion {
            namespace: pod.module.namespace().to_string(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            module: pod.module.clone(),
            reason,
        });
    }

    fn create(&mut self, plan: WorkerPodPlan) {
        if plan.action == WorkerAction::Unload {
            self.unloading.insert(plan.module.clone());
        }
        self.decision.create.push(plan);
    }

    fn invalid_entry(&mut self, namespace: &str, name: &str, source: LabelError) {
        self.decision.problems.push(NmcProblem::InvalidEntry {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        });
    }
}

/// Why an in-flight worker pod should be deleted, if it should: it would undo what the spec
/// wants. A loader that is running is left to finish, since what it loaded must be recorded
/// to be unloaded.
fn cancel_reason(pod: &WorkerPod, spec: Option<&NodeModuleSpec>) -> Option<DeleteReason> {
    let pending = pod.phase == PodPhase::Pending;
    let carries_spec = spec.is_some_and(|spec| pod.config.as_ref().ok() == Some(&spec.config));
    match (pod.action, spec) {
        (WorkerAction::Load, Some(_)) if carries_spec => None,
        (WorkerAction::Load, Some(_)) => pending.then_some(DeleteReason::OutdatedLoader),
        (WorkerAction::Load, None) => pending.then_some(DeleteReason::UnwantedLoader),
        (WorkerAction::Unload, _) => carries_spec.then_some(DeleteReason::UnwantedUnloader),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use capstan_api::module::ModprobeSpec;

    const KERNEL: &str = "6.0.15-300.fc37.x86_64";
    const NEW_KERNEL: &str = "6.1.7-200.fc37.x86_64";
    const BOOT: &str = "boot-1";
    const NEW_BOOT: &str = "boot-2";

    use PodPhase::{Failed, Pending, Running, Succeeded};
    use WorkerAction::{Load, Unload};

    fn key() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").unwrap()
    }

    fn at(time: &str) -> Timestamp {
        time.parse().unwrap()
    }

    /// When the node last became Ready.
    fn ready_since() -> Timestamp {
        at("2026-03-01T08:00:00Z")
    }

    /// When worker pods finish, unless a row says otherwise: after the node became Ready.
    fn finished() -> Timestamp {
        at("2026-03-01T09:00:00Z")
    }

    /// When the controller decides: a minute after the pods finished.
    fn now() -> Timestamp {
        at("2026-03-01T09:01:00Z")
    }

    fn config(image: &str, kernel: &str) -> ModuleConfig {
        ModuleConfig {
            kernel_version: kernel.to_string(),
            container_image: format!("registry.example/my-kmod:{image}"),
            modprobe: ModprobeSpec {
                module_name: "my_kmod".to_string(),
                ..ModprobeSpec::default()
            },
            ..ModuleConfig::default()
        }
    }

    fn spec(image: &str, kernel: &str) -> NodeModuleSpec {
        NodeModuleSpec {
            name: "my-kmod".to_string(),
            namespace: "kmm-demo".to_string(),
            service_account_name: "kmm-worker".to_string(),
            version: image.to_string(),
            config: config(image, kernel),
            ..NodeModuleSpec::default()
        }
    }

    fn status(image: &str, kernel: &str, boot: &str) -> NodeModuleStatus {
        NodeModuleStatus {
            name: "my-kmod".to_string(),
            namespace: "kmm-demo".to_string(),
            service_account_name: "kmm-worker".to_string(),
            version: image.to_string(),
            config: config(image, kernel),
            boot_id: boot.to_string(),
            ..NodeModuleStatus::default()
        }
    }

    fn node() -> NodeFacts {
        NodeFacts {
            name: "node-1".to_string(),
            kernel_version: KERNEL.to_string(),
            boot_id: BOOT.to_string(),
            ready: true,
            ready_since: Some(ready_since()),
            ..NodeFacts::default()
        }
    }

    fn rebooted_into(kernel: &str) -> NodeFacts {
        NodeFacts {
            kernel_version: kernel.to_string(),
            boot_id: NEW_BOOT.to_string(),
            ..node()
        }
    }

    fn pod(action: WorkerAction, phase: PodPhase, image: &str) -> WorkerPod {
        WorkerPod {
            name: "kmm-worker-node-1-my-kmod".to_string(),
            uid: None,
            module: key(),
            action,
            phase,
            deleting: false,
            upstream_finalizer: false,
            config: Ok(config(image, KERNEL)),
            version: image.to_string(),
            service_account_name: "kmm-worker".to_string(),
            image_repo_secret: None,
            tolerations: Vec::new(),
            finished_at: phase.is_finished().then(finished),
            failure: (phase == PodPhase::Failed).then(|| "modprobe failed".to_string()),
        }
    }

    /// One row of the NMC decision table, for the module `kmm-demo/my-kmod`.
    struct Row {
        name: &'static str,
        node: NodeFacts,
        spec: Vec<NodeModuleSpec>,
        status: Vec<NodeModuleStatus>,
        pods: Vec<WorkerPod>,
        step: ModuleStep,
        /// (action, image tag) of the pods created.
        create: Vec<(WorkerAction, &'static str)>,
        /// Why each deleted pod goes.
        delete: Vec<DeleteReason>,
        /// (image tag, boot ID) of the new status entries; `None`: status unchanged.
        status_after: Option<Vec<(&'static str, &'static str)>>,
        /// How many problems are reported.
        problems: usize,
    }

    fn row(name: &'static str, step: ModuleStep) -> Row {
        Row {
            name,
            node: node(),
            spec: Vec::new(),
            status: Vec::new(),
            pods: Vec::new(),
            step,
            create: Vec::new(),
            delete: Vec::new(),
            status_after: None,
            problems: 0,
        }
    }

    impl Row {
        fn node(mut self, node: NodeFacts) -> Self {
            self.node = node;
            self
        }
        fn spec(mut self, image: &str, kernel: &str) -> Self {
            self.spec.push(spec(image, kernel));
            self
        }
        fn status(mut self, image: &str, kernel: &str, boot: &str) -> Self {
            self.status.push(status(image, kernel, boot));
            self
        }
        fn pod(mut self, pod: WorkerPod) -> Self {
            self.pods.push(pod);
            self
        }
        fn creates(mut self, action: WorkerAction, image: &'static str) -> Self {
            self.create.push((action, image));
            self
        }
        fn deletes(mut self, reason: DeleteReason) -> Self {
            self.delete.push(reason);
            self
        }
        fn status_becomes(mut self, entries: &[(&'static str, &'static str)]) -> Self {
            self.status_after = Some(entries.to_vec());
            self
        }
        fn problems(mut self, count: usize) -> Self {
            self.problems = count;
            self
        }

        fn decide(&self) -> NmcDecision {
            decide(&NmcInput {
                node: &self.node,
                spec: &self.spec,
                status: &self.status,
                pods: &self.pods,
                nmc_labels: &NO_LABELS,
                failures: &WorkerFailures::default(),
                now: now(),
            })
        }

        fn check(&self) {
            let name = self.name;
            let decision = self.decide();
            assert_eq!(decision.steps.get(&key()), Some(&self.step), "{name}: step");
            let tag = |config: &ModuleConfig| {
                config
                    .container_image
                    .trim_start_matches("registry.example/my-kmod:")
                    .to_string()
            };
            let created: Vec<(WorkerAction, String)> = decision
                .create
                .iter()
                .map(|plan| (plan.action, tag(&plan.config)))
                .collect();
            let want: Vec<(WorkerAction, String)> = self
                .create
                .iter()
                .map(|(action, image)| (*action, image.to_string()))
                .collect();
            assert_eq!(created, want, "{name}: pods created");
            let deleted: Vec<DeleteReason> = decision.delete.iter().map(|d| d.reason).collect();
            assert_eq!(deleted, self.delete, "{name}: pods deleted");
            let status: Option<Vec<(String, String)>> = decision.status.as_ref().map(|entries| {
                entries
                    .iter()
                    .map(|entry| (tag(&entry.config), entry.boot_id.clone()))
                    .collect()
            });
            let want: Option<Vec<(String, String)>> = self.status_after.as_ref().map(|entries| {
                entries
                    .iter()
                    .map(|(image, boot)| (image.to_string(), boot.to_string()))
                    .collect()
            });
            assert_eq!(status, want, "{name}: status");
            assert_eq!(
                decision.problems.len(),
                self.problems,
                "{name}: problems {:?}",
                decision.problems
            );
        }
    }

    #[test]
    fn nmc_flowchart_table() {
        use ModuleStep::*;
        let cordoned = NodeFacts {
            unschedulable: true,
            ..node()
        };
        let rows = [
            row("J2: node not Ready -> done", NodeNotReady)
                .node(NodeFacts {
                    ready: false,
                    ..node()
                })
                .spec("v1", KERNEL),
            row("J2: node cordoned -> done", NodeUnschedulable)
                .node(cordoned.clone())
                .spec("v1", KERNEL),
            row(
                "J2: node cordoned, unwanted module stays loaded",
                NodeUnschedulable,
            )
            .node(cordoned)
            .status("v1", KERNEL, BOOT),
            row(
                "J4: status missing, node runs the spec kernel -> loader",
                LoadMissing,
            )
            .spec("v1", KERNEL)
            .creates(Load, "v1"),
            row(
                "J4: status missing, spec for another kernel -> done",
                SpecForOtherKernel,
            )
            .spec("v1", NEW_KERNEL),
            row(
                "J5: spec missing, status on the node's kernel -> unloader",
                UnloadUnwanted,
            )
            .status("v1", KERNEL, BOOT)
            .creates(Unload, "v1"),
            row(
                "J5: spec missing, status for another kernel -> done",
                StatusForOtherKernel,
            )
            .status("v1", NEW_KERNEL, BOOT),
            row(
                "J6: configs differ, status kernel is the node's -> unloader of the status",
                UnloadOldConfig,
            )
            .spec("v2", KERNEL)
            .status("v1", KERNEL, BOOT)
            .creates(Unload, "v1"),
            row(
                "J7: configs differ, status for the old kernel, spec kernel running -> loader",
                LoadNewConfig,
            )
            .node(rebooted_into(NEW_KERNEL))
            .spec("v1", NEW_KERNEL)
            .status("v1", KERNEL, BOOT)
            .creates(Load, "v1"),
            row(
                "J7: configs differ, neither kernel is the node's -> done",
                NeitherKernelRunning,
            )
            .spec("v2", NEW_KERNEL)
            .status("v1", "5.14.0-284.el9.x86_64", BOOT),
            row("J8: spec equals status, same boot -> done", InSync)
                .spec("v1", KERNEL)
                .status("v1", KERNEL, BOOT),
            row(
                "J9: spec equals status, node rebooted since -> loader",
                ReloadAfterReboot,
            )
            .node(rebooted_into(KERNEL))
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT)
            .creates(Load, "v1"),
            row(
                "J9: spec equals status, rebooted into another kernel -> done",
                SpecForOtherKernel,
            )
            .node(rebooted_into(NEW_KERNEL))
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT),
            row(
                "status without a boot ID counts as another boot -> loader",
                ReloadAfterReboot,
            )
            .spec("v1", KERNEL)
            .status("v1", KERNEL, "")
            .creates(Load, "v1"),
            row(
                "configs differ on the node's kernel but it rebooted -> loader, nothing to unload",
                LoadNewConfig,
            )
            .node(rebooted_into(KERNEL))
            .spec("v2", KERNEL)
            .status("v1", KERNEL, BOOT)
            .creates(Load, "v2"),
            row(
                "spec missing, node rebooted since the status -> status dropped, no unloader",
                ForgetAfterReboot,
            )
            .node(rebooted_into(KERNEL))
            .status("v1", KERNEL, BOOT)
            .status_becomes(&[]),
        ];
        for row in rows {
            row.check();
        }
    }

    #[test]
    fn finished_worker_pods_table() {
        use DeleteReason::{Failed as FailedPod, Succeeded as SucceededPod};
        use ModuleStep::*;
        let before_ready = WorkerPod {
            finished_at: Some(at("2026-03-01T07:00:00Z")),
            ..pod(Load, Succeeded, "v1")
        };
        let unreadable = WorkerPod {
            config: Err("no worker-config annotation".to_string()),
            ..pod(Load, Succeeded, "v1")
        };
        let rows = [
            row(
                "upstream: failed loader deleted, status untouched, retried next pass",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(pod(Load, Failed, "v1"))
            .deletes(FailedPod),
            row(
                "failed unloader deleted, status kept for the next unloader",
                WaitForWorker,
            )
            .status("v1", KERNEL, BOOT)
            .pod(pod(Unload, Failed, "v1"))
            .deletes(FailedPod),
            row(
                "upstream: successful unloader removes the status entry, then is deleted",
                WaitForWorker,
            )
            .status("v1", KERNEL, BOOT)
            .pod(pod(Unload, Succeeded, "v1"))
            .deletes(SucceededPod)
            .status_becomes(&[]),
            row(
                "upstream: successful loader adds its config and the node's boot ID",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(pod(Load, Succeeded, "v1"))
            .deletes(SucceededPod)
            .status_becomes(&[("v1", BOOT)]),
            row("successful loader replaces an older entry", WaitForWorker)
                .spec("v2", KERNEL)
                .status("v1", KERNEL, BOOT)
                .pod(pod(Load, Succeeded, "v2"))
                .deletes(SucceededPod)
                .status_becomes(&[("v2", BOOT)]),
            row(
                "loader already recorded (its deletion failed before) -> deleted, status as is",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT)
            .pod(pod(Load, Succeeded, "v1"))
            .deletes(SucceededPod),
            row(
                "loader finished before the node's last Ready transition -> no boot ID",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(before_ready)
            .deletes(SucceededPod)
            .status_becomes(&[("v1", "")]),
            row(
                "successful loader with an unreadable config -> kept and reported",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(unreadable)
            .problems(1),
            row(
                "seed: completed pods are read before the node is looked at",
                NodeNotReady,
            )
            .node(NodeFacts {
                ready: false,
                ..node()
            })
            .spec("v1", KERNEL)
            .pod(pod(Load, Succeeded, "v1"))
            .deletes(SucceededPod)
            .status_becomes(&[("v1", BOOT)]),
            row(
                "#1004: loader of a deleted Module finished -> recorded, deleted, then unloaded",
                WaitForWorker,
            )
            .pod(pod(Load, Succeeded, "v1"))
            .deletes(SucceededPod)
            .status_becomes(&[("v1", BOOT)]),
            row(
                "#1004: failed loader of a deleted Module -> deleted, nothing recorded",
                WaitForWorker,
            )
            .pod(pod(Load, Failed, "v1"))
            .deletes(FailedPod),
            row(
                "finished pod already being deleted, status recorded -> not deleted again",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT)
            .pod(being_deleted(pod(Load, Succeeded, "v1"))),
            row(
                "successful loader being deleted before its status was written -> recorded only",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(being_deleted(pod(Load, Succeeded, "v1")))
            .status_becomes(&[("v1", BOOT)]),
            row(
                "failed pod being deleted -> neither deleted again nor retried yet",
                WaitForWorker,
            )
            .spec("v1", KERNEL)
            .pod(being_deleted(pod(Load, Failed, "v1"))),
        ];
        for row in rows {
            row.check();
        }
    }

    fn being_deleted(pod: WorkerPod) -> WorkerPod {
        WorkerPod {
            deleting: true,
            ..pod
        }
    }

    /// `pod` as upstream KMM creates it, with its finalizer.
    fn from_upstream(pod: WorkerPod) -> WorkerPod {
        WorkerPod {
            upstream_finalizer: true,
            ..pod
        }
    }

    #[test]
    fn pods_upstream_kmm_created_are_released_before_they_go() {
        let released = vec![PodRelease {
            namespace: "kmm-demo".to_string(),
            name: "kmm-worker-node-1-my-kmod".to_string(),
        }];
        // (case, spec, status, pod, released, deleted)
        let cases = [
            (
                "succeeded loader: recorded, released, deleted",
                vec![spec("v1", KERNEL)],
                vec![],
                from_upstream(pod(Load, Succeeded, "v1")),
                released.clone(),
                vec![DeleteReason::Succeeded],
            ),
            (
                "pending loader of a module gone: released, deleted",
                vec![],
                vec![],
                from_upstream(pod(Load, Pending, "v1")),
                released.clone(),
                vec![DeleteReason::UnwantedLoader],
            ),
            (
                "finished pod being deleted already: released only",
                vec![spec("v1", KERNEL)],
                vec![status("v1", KERNEL, BOOT)],
                being_deleted(from_upstream(pod(Load, Succeeded, "v1"))),
                released.clone(),
                vec![],
            ),
            (
                "running loader: left to finish, finalizer kept",
                vec![spec("v1", KERNEL)],
                vec![],
                from_upstream(pod(Load, Running, "v1")),
                vec![],
                vec![],
            ),
            (
                "capstan's own pod: nothing to release",
                vec![spec("v1", KERNEL)],
                vec![],
                pod(Load, Succeeded, "v1"),
                vec![],
                vec![DeleteReason::Succeeded],
            ),
        ];
        for (case, spec, status, pod, release, delete) in cases {
            let decision = decide(&NmcInput {
                node: &node(),
                spec: &spec,
                status: &status,
                pods: &[pod],
                nmc_labels: &NO_LABELS,
                failures: &WorkerFailures::default(),
                now: now(),
            });
            assert_eq!(decision.release, release, "{case}: released");
            let deleted: Vec<DeleteReason> = decision.delete.iter().map(|d| d.reason).collect();
            assert_eq!(deleted, delete, "{case}: deleted");
        }
    }

    /// A failure record: (module, action, attempts in a row, seconds before [`now`], pod UID).
    fn recorded(entries: &[(ModuleKey, WorkerAction, u32, i64, &str)]) -> WorkerFailures {
        let map: serde_json::Map<String, serde_json::Value> = entries
            .iter()
            .map(|(module, action, attempts, ago, uid)| {
                let at = now() - jiff::SignedDuration::from_secs(*ago);
                let failure = serde_json::json!({
                    "action": action.as_str(), "message": "modprobe failed",
                    "attempts": attempts, "lastFailure": rfc3339(at), "podUid": uid,
                });
                (module.to_string(), failure)
            })
            .collect();
        serde_json::from_value(serde_json::Value::Object(map)).unwrap()
    }

    /// One row of the failure and backoff table, for the module `kmm-demo/my-kmod` unless
    /// the failures say otherwise.
    struct FailureRow {
        name: &'static str,
        spec: Vec<NodeModuleSpec>,
        status: Vec<NodeModuleStatus>,
        pods: Vec<WorkerPod>,
        failures: WorkerFailures,
        /// How many pods are deleted.
        delete: usize,
        /// The record after the pass, as (module, action, attempts, pod UID); `None`:
        /// unchanged.
        failures_after: Option<Vec<(ModuleKey, WorkerAction, u32, &'static str)>>,
        /// (action, failed) of the outcomes reported.
        outcomes: Vec<(WorkerAction, bool)>,
        /// (action) of the pods created.
        create: Vec<WorkerAction>,
        /// Seconds of backoff left for the module, when its worker pod is held.
        backoff: Option<u64>,
    }

    fn failure_row(name: &'static str) -> FailureRow {
        FailureRow {
            name,
            spec: Vec::new(),
            status: Vec::new(),
            pods: Vec::new(),
            failures: WorkerFailures::default(),
            delete: 0,
            failures_after: None,
            outcomes: Vec::new(),
            create: Vec::new(),
            backoff: None,
        }
    }

    fn with_uid(uid: &str, pod: WorkerPod) -> WorkerPod {
        WorkerPod {
            uid: Some(uid.to_string()),
            ..pod
        }
    }

    #[test]
    fn worker_failures_and_backoff_table() {
        let rows = [
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                pods: vec![with_uid("pod-1", pod(Load, Failed, "v1"))],
                delete: 1,
                failures_after: Some(vec![(key(), Load, 1, "pod-1")]),
                outcomes: vec![(Load, true)],
                ..failure_row("failed loader -> counted, reported and deleted")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                pods: vec![with_uid("pod-2", pod(Load, Failed, "v1"))],
                failures: recorded(&[(key(), Load, 1, 30, "pod-1")]),
                delete: 1,
                failures_after: Some(vec![(key(), Load, 2, "pod-2")]),
                outcomes: vec![(Load, true)],
                ..failure_row("another loader failed -> one more failure in a row")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                pods: vec![with_uid("pod-1", pod(Load, Failed, "v1"))],
                failures: recorded(&[(key(), Load, 1, 30, "pod-1")]),
                delete: 1,
                ..failure_row(
                    "failed pod already recorded -> deleted, not counted or reported again",
                )
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                pods: vec![being_deleted(with_uid("pod-1", pod(Load, Failed, "v1")))],
                ..failure_row("failed pod being deleted -> not counted, not deleted again")
            },
            FailureRow {
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![with_uid("pod-3", pod(Unload, Failed, "v1"))],
                failures: recorded(&[(key(), Load, 4, 30, "pod-2")]),
                delete: 1,
                failures_after: Some(vec![(key(), Unload, 1, "pod-3")]),
                outcomes: vec![(Unload, true)],
                ..failure_row("unloader failed after loaders did -> a new count")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                pods: vec![with_uid("pod-3", pod(Load, Succeeded, "v1"))],
                failures: recorded(&[(key(), Load, 2, 30, "pod-2")]),
                delete: 1,
                failures_after: Some(Vec::new()),
                outcomes: vec![(Load, false)],
                ..failure_row("loader succeeded -> failures cleared, load reported")
            },
            FailureRow {
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![with_uid("pod-3", pod(Unload, Succeeded, "v1"))],
                delete: 1,
                outcomes: vec![(Unload, false)],
                ..failure_row("unloader succeeded -> unload reported")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![with_uid("pod-3", pod(Load, Succeeded, "v1"))],
                delete: 1,
                ..failure_row("loader already in the status (shown again) -> not reported again")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                failures: recorded(&[(gone(), Load, 3, 30, "pod-9")]),
                failures_after: Some(Vec::new()),
                ..failure_row("failures of a module that left the node -> forgotten")
            },
            FailureRow {
                status: vec![status("v1", KERNEL, BOOT)],
                failures: recorded(&[(key(), Unload, 1, 5, "pod-1")]),
                backoff: Some(5),
                ..failure_row("module only in the status -> its failures kept, unloader held")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                failures: recorded(&[(key(), Load, 1, 5, "pod-1")]),
                backoff: Some(5),
                ..failure_row("loader failed 5 s ago, 10 s backoff -> held 5 s more")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                failures: recorded(&[(key(), Load, 3, 30, "pod-1")]),
                backoff: Some(10),
                ..failure_row("third failure in a row 30 s ago, 40 s backoff -> held 10 s more")
            },
            FailureRow {
                spec: vec![spec("v1", KERNEL)],
                failures: recorded(&[(key(), Load, 1, 10, "pod-1")]),
                create: vec![Load],
                ..failure_row("backoff over -> loader created, failures kept until it succeeds")
            },
        ];
        for row in rows {
            let name = row.name;
            let decision = decide(&NmcInput {
                node: &node(),
                spec: &row.spec,
                status: &row.status,
                pods: &row.pods,
                nmc_labels: &NO_LABELS,
                failures: &row.failures,
                now: now(),
            });
            assert_eq!(decision.delete.len(), row.delete, "{name}: pods deleted");
            let after = decision.failures.as_ref().map(|failures| {
                failures
                    .modules()
                    .into_iter()
                    .filter_map(|module| {
                        let failure = failures.get(&module)?;
                        let action = WorkerAction::from_label_value(&failure.action)?;
                        Some((module, action, failure.attempts, failure.pod_uid.clone()))
                    })
                    .collect::<Vec<_>>()
            });
            let want = row.failures_after.as_ref().map(|entries| {
                entries
                    .iter()
                    .map(|(module, action, attempts, uid)| {
                        (module.clone(), *action, *attempts, uid.to_string())
                    })
                    .collect::<Vec<_>>()
            });
            assert_eq!(after, want, "{name}: failures");
            let outcomes: Vec<(WorkerAction, bool)> = decision
                .outcomes
                .iter()
                .map(|outcome| (outcome.action, outcome.failure.is_some()))
                .collect();
            assert_eq!(outcomes, row.outcomes, "{name}: outcomes");
            let created: Vec<WorkerAction> = decision.create.iter().map(|p| p.action).collect();
            assert_eq!(created, row.create, "{name}: pods created");
            let backoff = decision.backoff.get(&key()).map(Duration::as_secs);
            assert_eq!(backoff, row.backoff, "{name}: backoff");
            assert_eq!(
                decision.retry_after().map(|d| d.as_secs()),
                row.backoff,
                "{name}: retry after"
            );
        }
    }

    #[test]
    fn a_failure_is_recorded_with_the_worker_reason_at_the_time_it_is_read() {
        let decision = decide(&NmcInput {
            node: &node(),
            spec: &[spec("v1", KERNEL)],
            status: &[],
            pods: &[with_uid("pod-1", pod(Load, Failed, "v1"))],
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        let failures = decision.failures.expect("a failure recorded");
        let failure = failures.get(&key()).expect("the module's failure");
        assert_eq!(failure.message, "modprobe failed");
        assert_eq!(failure.last_failure, "2026-03-01T09:01:00Z");
        assert_eq!(
            decision.outcomes,
            [WorkerOutcome {
                module: key(),
                action: Load,
                failure: Some("modprobe failed".to_string()),
            }]
        );
        assert_eq!(decision.delete[0].uid.as_deref(), Some("pod-1"));
    }

    #[test]
    fn worker_outcomes_are_told_as_events() {
        let outcome = |action, failure: Option<&str>| WorkerOutcome {
            module: key(),
            action,
            failure: failure.map(str::to_string),
        };
        let cases = [
            (
                outcome(Load, None),
                "ModuleLoaded",
                "Module kmm-demo/my-kmod loaded into the kernel",
            ),
            (
                outcome(Unload, None),
                "ModuleUnloaded",
                "Module kmm-demo/my-kmod unloaded from the kernel",
            ),
            (
                outcome(Load, Some("no such image")),
                "WorkerFailed",
                "Load of Module kmm-demo/my-kmod failed on node node-1: no such image",
            ),
            (
                outcome(Unload, Some("module in use")),
                "WorkerFailed",
                "Unload of Module kmm-demo/my-kmod failed on node node-1: module in use",
            ),
        ];
        for (outcome, reason, note) in cases {
            assert_eq!(outcome.reason(), reason, "{note}");
            assert_eq!(outcome.note("node-1"), note);
        }
    }

    #[test]
    fn failure_messages_come_from_the_container_then_the_pod() {
        let terminated = |message: Option<&str>| Pod {
            status: Some(PodStatus {
                message: Some("pod-level".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "worker".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: 1,
                            message: message.map(str::to_string),
                            reason: Some("Error".into()),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        assert_eq!(
            failure_message(&terminated(Some("pulling image x: manifest unknown\nmore"))),
            "pulling image x: manifest unknown"
        );
        assert_eq!(failure_message(&terminated(None)), "Error");
        assert_eq!(
            failure_message(&Pod::default()),
            "the worker failed without a reason"
        );
    }

    #[test]
    fn workers_in_flight_table() {
        use DeleteReason::*;
        use ModuleStep::*;
        let terminating = WorkerPod {
            deleting: true,
            ..pod(Unload, Running, "v1")
        };
        let rows = [
            row("loader with the spec's config running -> wait, one pod at a time", WaitForWorker)
                .spec("v1", KERNEL)
                .pod(pod(Load, Running, "v1")),
            row("unloader under way for an unwanted module -> wait", WaitForWorker)
                .status("v1", KERNEL, BOOT)
                .pod(pod(Unload, Pending, "v1")),
            row("pod being deleted -> wait, nothing created", WaitForWorker)
                .spec("v1", KERNEL)
                .status("v1", KERNEL, BOOT)
                .pod(terminating),
            row(
                "#1333: unloader not started, module wanted again -> cancelled, status kept",
                CancelUnloader,
            )
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT)
            .pod(pod(Unload, Pending, "v1"))
            .deletes(UnwantedUnloader),
            row(
                "#1333: unloader running, module wanted again -> cancelled, status dropped to reload",
                CancelUnloader,
            )
            .spec("v1", KERNEL)
            .status("v1", KERNEL, BOOT)
            .pod(pod(Unload, Running, "v1"))
            .deletes(UnwantedUnloader)
            .status_becomes(&[]),
            row(
                "unloader of an old config while the spec moved on -> wait, it is the first step",
                WaitForWorker,
            )
            .spec("v2", KERNEL)
            .status("v1", KERNEL, BOOT)
            .pod(pod(Unload, Running, "v1")),
            row(
                "#1004: loader not started for a deleted Module -> cancelled",
                CancelUnwantedLoader,
            )
            .pod(pod(Load, Pending, "v1"))
            .deletes(UnwantedLoader),
            row(
                "loader running for a deleted Module -> wait for what it loaded",
                WaitForWorker,
            )
            .pod(pod(Load, Running, "v1")),
            row(
                "loader not started with an outdated config -> cancelled",
                CancelOutdatedLoader,
            )
            .spec("v2", KERNEL)
            .pod(pod(Load, Pending, "v1"))
            .deletes(OutdatedLoader),
            row(
                "loader running with an outdated config -> wait for what it loaded",
                WaitForWorker,
            )
            .spec("v2", KERNEL)
            .pod(pod(Load, Running, "v1")),
            row("node not Ready -> no cancellation either", NodeNotReady)
                .node(NodeFacts {
                    ready: false,
                    ..node()
                })
                .pod(pod(Load, Pending, "v1")),
        ];
        for row in rows {
            row.check();
        }
    }

    #[test]
    fn worker_pods_carry_the_entry_they_come_from() {
        let mut entry = spec("v2", KERNEL);
        entry.image_repo_secret = Some(LocalObjectReference {
            name: "pull".to_string(),
        });
        entry.tolerations = vec![Toleration {
            operator: Some("Exists".to_string()),
            ..Toleration::default()
        }];
        let old = status("v1", KERNEL, BOOT);
        let load = decide(&NmcInput {
            node: &node(),
            spec: std::slice::from_ref(&entry),
            status: &[],
            pods: &[],
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(
            load.create,
            [WorkerPodPlan {
                name: "kmm-worker-node-1-my-kmod".to_string(),
                module: key(),
                action: Load,
                service_account_name: "kmm-worker".to_string(),
                image_repo_secret: entry.image_repo_secret.clone(),
                tolerations: entry.tolerations.clone(),
                version: "v2".to_string(),
                config: entry.config.clone(),
            }]
        );
        let unload = decide(&NmcInput {
            node: &node(),
            spec: std::slice::from_ref(&entry),
            status: std::slice::from_ref(&old),
            pods: &[],
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(unload.create.len(), 1);
        assert_eq!(unload.create[0].action, Unload);
        assert_eq!(unload.create[0].config, old.config);
        assert_eq!(unload.create[0].version, "v1");
    }

    #[test]
    fn a_loaded_status_records_the_pod_it_came_from() {
        let mut loader = pod(Load, Succeeded, "v1");
        loader.image_repo_secret = Some(LocalObjectReference {
            name: "pull".to_string(),
        });
        loader.service_account_name = "sa".to_string();
        let decision = decide(&NmcInput {
            node: &node(),
            spec: &[],
            status: &[],
            pods: std::slice::from_ref(&loader),
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(
            decision.status,
            Some(vec![NodeModuleStatus {
                name: "my-kmod".to_string(),
                namespace: "kmm-demo".to_string(),
                service_account_name: "sa".to_string(),
                image_repo_secret: loader.image_repo_secret.clone(),
                tolerations: Vec::new(),
                version: "v1".to_string(),
                config: config("v1", KERNEL),
                boot_id: BOOT.to_string(),
            }])
        );
        assert_eq!(
            decision.delete,
            [PodDeletion {
                namespace: "kmm-demo".to_string(),
                name: "kmm-worker-node-1-my-kmod".to_string(),
                uid: None,
                module: key(),
                reason: DeleteReason::Succeeded,
            }]
        );
    }

    #[test]
    fn modules_are_decided_independently() {
        let other = ModuleKey::new("kmm-demo", "other").unwrap();
        let other_spec = NodeModuleSpec {
            name: "other".to_string(),
            ..spec("v1", KERNEL)
        };
        let decision = decide(&NmcInput {
            node: &node(),
            spec: &[spec("v1", KERNEL), other_spec],
            status: &[],
            pods: &[pod(Load, Running, "v1")],
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(decision.steps[&key()], ModuleStep::WaitForWorker);
        assert_eq!(decision.steps[&other], ModuleStep::LoadMissing);
        assert_eq!(decision.create.len(), 1);
        assert_eq!(decision.create[0].module, other);
        assert_eq!(decision.create[0].name, "kmm-worker-node-1-other");
    }

    #[test]
    fn a_module_that_tolerates_the_taint_is_loaded() {
        let tainted = NodeFacts {
            taints: vec![k8s_openapi::api::core::v1::Taint {
                key: "gpu".to_string(),
                effect: "NoSchedule".to_string(),
                ..Default::default()
            }],
            ..node()
        };
        let mut tolerant = spec("v1", KERNEL);
        tolerant.tolerations = vec![Toleration {
            key: Some("gpu".to_string()),
            operator: Some("Exists".to_string()),
            ..Toleration::default()
        }];
        let input = |entry: &NodeModuleSpec| {
            decide(&NmcInput {
                node: &tainted,
                spec: std::slice::from_ref(entry),
                status: &[],
                pods: &[],
                nmc_labels: &NO_LABELS,
                failures: &WorkerFailures::default(),
                now: now(),
            })
            .steps[&key()]
        };
        assert_eq!(input(&tolerant), ModuleStep::LoadMissing);
        assert_eq!(input(&spec("v1", KERNEL)), ModuleStep::NodeUnschedulable);
    }

    #[test]
    fn invalid_entries_are_reported_and_left_alone() {
        let mut bad = spec("v1", KERNEL);
        bad.namespace = "Not_A_Namespace".to_string();
        let bad_status = NodeModuleStatus {
            namespace: "Not_A_Namespace".to_string(),
            ..status("v1", KERNEL, BOOT)
        };
        let decision = decide(&NmcInput {
            node: &node(),
            spec: &[bad],
            status: &[bad_status],
            pods: &[],
            nmc_labels: &NO_LABELS,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(decision.problems.len(), 2);
        assert!(decision.create.is_empty() && decision.status.is_none());
        assert!(decision.steps.is_empty());
    }

    /// The ready and version-ready labels of `kmm-demo/my-kmod`, or of another module.
    fn ready() -> String {
        key().ready_label()
    }

    fn version_ready() -> String {
        key().version_ready_label()
    }

    fn gone() -> ModuleKey {
        ModuleKey::new("other-ns", "gone").unwrap()
    }

    /// One row of the ready-label table: the node's labels before, and the labels the
    /// decision sets and removes.
    struct LabelRow {
        name: &'static str,
        node: NodeFacts,
        spec: Vec<NodeModuleSpec>,
        status: Vec<NodeModuleStatus>,
        pods: Vec<WorkerPod>,
        labels: Vec<(String, &'static str)>,
        set: Vec<(String, &'static str)>,
        remove: Vec<String>,
    }

    fn label_row(name: &'static str) -> LabelRow {
        LabelRow {
            name,
            node: node(),
            spec: Vec::new(),
            status: Vec::new(),
            pods: Vec::new(),
            labels: Vec::new(),
            set: Vec::new(),
            remove: Vec::new(),
        }
    }

    #[test]
    fn ready_labels_table() {
        let unversioned = NodeModuleStatus {
            version: String::new(),
            ..status("v1", KERNEL, BOOT)
        };
        let terminating_unloader = WorkerPod {
            deleting: true,
            ..pod(Unload, Running, "v1")
        };
        let rows = [
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                set: vec![(ready(), ""), (version_ready(), "v1")],
                ..label_row("spec equals status -> .ready and .version.ready set")
            },
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                ..label_row("already labelled -> nothing to write")
            },
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![
                    (ready(), ""),
                    (version_ready(), "v1"),
                    ("kmm.node.kubernetes.io/my-kmod.ready".to_string(), ""),
                    ("kmm.node.kubernetes.io/gone.ready".to_string(), ""),
                ],
                remove: vec![
                    "kmm.node.kubernetes.io/my-kmod.ready".to_string(),
                    "kmm.node.kubernetes.io/gone.ready".to_string(),
                ],
                ..label_row("deprecated <name>.ready labels -> removed, namespaced ones kept")
            },
            LabelRow {
                spec: vec![NodeModuleSpec {
                    version: String::new(),
                    ..spec("v1", KERNEL)
                }],
                status: vec![unversioned],
                labels: vec![(version_ready(), "v0")],
                set: vec![(ready(), "")],
                remove: vec![version_ready()],
                ..label_row("unversioned module -> .ready only, stale .version.ready removed")
            },
            LabelRow {
                spec: vec![spec("v2", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                ..label_row("spec and status differ, upgrade under way -> labels kept")
            },
            LabelRow {
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                ..label_row("status only, module still loaded until unloaded -> labels kept")
            },
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                labels: vec![(ready(), "")],
                remove: vec![ready()],
                ..label_row("spec only, not loaded -> .ready removed")
            },
            LabelRow {
                node: rebooted_into(KERNEL),
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                remove: vec![ready(), version_ready()],
                ..label_row("node rebooted since the status -> not loaded, labels removed")
            },
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![terminating_unloader],
                ..label_row("an unloader still at work -> .ready not set")
            },
            LabelRow {
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![pod(Unload, Running, "v1")],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                remove: vec![ready(), version_ready()],
                ..label_row("#1333: running unloader cancelled -> labels go until reloaded")
            },
            LabelRow {
                status: vec![status("v1", KERNEL, BOOT)],
                pods: vec![pod(Unload, Succeeded, "v1")],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                remove: vec![ready(), version_ready()],
                ..label_row("unloader succeeded, module in neither spec nor status -> removed")
            },
            LabelRow {
                labels: vec![
                    (gone().ready_label(), ""),
                    (gone().version_ready_label(), "v3"),
                    (gone().version_module_label(), "v3"),
                    ("role".to_string(), "gpu"),
                ],
                remove: vec![gone().ready_label(), gone().version_ready_label()],
                ..label_row("labels of a module the NMC does not know -> removed, others kept")
            },
            LabelRow {
                node: NodeFacts {
                    ready: false,
                    ..node()
                },
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                remove: vec![ready(), version_ready()],
                ..label_row("node not Ready -> ready labels removed")
            },
            LabelRow {
                node: NodeFacts {
                    unschedulable: true,
                    ..node()
                },
                spec: vec![spec("v1", KERNEL)],
                status: vec![status("v1", KERNEL, BOOT)],
                labels: vec![(ready(), ""), (version_ready(), "v1")],
                remove: vec![ready(), version_ready()],
                ..label_row("node cordoned -> ready labels removed")
            },
        ];
        for row in rows {
            let node = NodeFacts {
                labels: row
                    .labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect(),
                ..row.node.clone()
            };
            let decision = decide(&NmcInput {
                node: &node,
                spec: &row.spec,
                status: &row.status,
                pods: &row.pods,
                nmc_labels: &NO_LABELS,
                failures: &WorkerFailures::default(),
                now: now(),
            });
            let want = LabelChanges {
                set: row
                    .set
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_string()))
                    .collect(),
                remove: row.remove.iter().cloned().collect(),
            };
            assert_eq!(decision.node_labels, want, "{}", row.name);
        }
    }

    #[test]
    fn module_in_use_labels_go_with_the_last_trace_of_the_module() {
        let module = |name: &str| ModuleKey::new("kmm-demo", name).unwrap();
        let in_use = |name: &str| module(name).module_in_use_label();
        let named_spec = |name: &str| NodeModuleSpec {
            name: name.to_string(),
            ..spec("v1", KERNEL)
        };
        let named_status = |name: &str| NodeModuleStatus {
            name: name.to_string(),
            ..status("v1", KERNEL, BOOT)
        };
        let named_pod = |name: &str, action, phase| WorkerPod {
            module: module(name),
            name: format!("kmm-worker-node-1-{name}"),
            ..pod(action, phase, "v1")
        };
        let nmc_labels: BTreeMap<String, String> = [
            "configured",
            "unloading",
            "loading-orphan",
            "just-unloaded",
            "gone",
        ]
        .iter()
        .map(|name| (in_use(name), String::new()))
        .chain([("unrelated".to_string(), "x".to_string())])
        .collect();
        let decision = decide(&NmcInput {
            node: &node(),
            spec: &[named_spec("configured")],
            status: &[named_status("unloading"), named_status("just-unloaded")],
            pods: &[
                named_pod("loading-orphan", Load, Running),
                named_pod("just-unloaded", Unload, Succeeded),
            ],
            nmc_labels: &nmc_labels,
            failures: &WorkerFailures::default(),
            now: now(),
        });
        assert_eq!(
            decision.nmc_labels,
            LabelChanges {
                set: BTreeMap::new(),
                remove: [in_use("just-unloaded"), in_use("gone")]
                    .into_iter()
                    .collect(),
            }
        );
    }

    #[test]
    fn input_from_an_nmc() {
        let mut nmc = NodeModulesConfig::new(
            "node-1",
            capstan_api::nmc::NodeModulesConfigSpec {
                modules: vec![spec("v1", KERNEL)],
            },
        );
        let node = node();
        let none = WorkerFailures::default();
        let input = NmcInput::new(&node, &nmc, &[], &none, now());
        assert_eq!(input.spec.len(), 1);
        assert!(input.status.is_empty() && input.nmc_labels.is_empty());
        nmc.status = Some(capstan_api::nmc::NodeModulesConfigStatus {
            modules: vec![status("v1", KERNEL, BOOT)],
        });
        assert_eq!(
            NmcInput::new(&node, &nmc, &[], &none, now()).status.len(),
            1
        );
    }

    fn worker_pod_object(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let map = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("kmm-worker-node-1-my-kmod".to_string()),
                namespace: Some("kmm-demo".to_string()),
                labels: map(labels),
                annotations: map(annotations),
                ..Default::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some("kmm-worker".to_string()),
                image_pull_secrets: Some(vec![LocalObjectReference {
                    name: "pull".to_string(),
                }]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Succeeded".to_string()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "worker".to_string(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            finished_at: Some(Time(finished())),
                            ..ContainerStateTerminated::default()
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn worker_pods_are_read_from_pod_objects() {
        let yaml = serde_saphyr::to_string(&config("v1", KERNEL)).unwrap();
        let object = worker_pod_object(
            &[
                (MODULE_NAME_LABEL, "my-kmod"),
                (WORKER_ACTION_LABEL, "Load"),
            ],
            &[
                (WORKER_CONFIG_ANNOTATION, yaml.as_str()),
                (WORKER_MODULE_VERSION_ANNOTATION, "v1"),
            ],
        );
        let worker = WorkerPod::from_pod(&object).unwrap();
        assert_eq!(
            worker,
            WorkerPod {
                image_repo_secret: Some(LocalObjectReference {
                    name: "pull".to_string(),
                }),
                ..pod(Load, Succeeded, "v1")
            }
        );

        // Upstream KMM's pods carry its finalizer, among others perhaps.
        let mut upstreams = object.clone();
        upstreams.metadata.finalizers = Some(vec![
            "example.com/other".to_string(),
            WORKER_POD_FINALIZER.to_string(),
        ]);
        assert!(WorkerPod::from_pod(&upstreams).unwrap().upstream_finalizer);

        // The tolerations are those the controller chose, as its annotation says, not those
        // admission added to the spec.
        let chosen =
            "- key: node.kubernetes.io/memory-pressure\n  operator: Exists\n  effect: NoSchedule\n";
        let mut annotated = object.clone();
        annotated
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(
                WORKER_TOLERATIONS_ANNOTATION.to_string(),
                chosen.to_string(),
            );
        annotated.spec.get_or_insert_default().tolerations = Some(vec![Toleration {
            key: Some("node.kubernetes.io/not-ready".to_string()),
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            toleration_seconds: Some(300),
            ..Toleration::default()
        }]);
        let tolerations = WorkerPod::from_pod(&annotated).unwrap().tolerations;
        assert_eq!(
            tolerations
                .iter()
                .map(|t| t.key.as_deref().unwrap_or_default())
                .collect::<Vec<_>>(),
            ["node.kubernetes.io/memory-pressure"]
        );
        annotated.metadata.annotations = object.metadata.annotations.clone();
        let tolerations = WorkerPod::from_pod(&annotated).unwrap().tolerations;
        assert_eq!(
            tolerations[0].key.as_deref(),
            Some("node.kubernetes.io/not-ready")
        );

        let broken = worker_pod_object(
            &[
                (MODULE_NAME_LABEL, "my-kmod"),
                (WORKER_ACTION_LABEL, "Unload"),
            ],
            &[(WORKER_CONFIG_ANNOTATION, "kernelVersion: [")],
        );
        let worker = WorkerPod::from_pod(&broken).unwrap();
        assert_eq!(worker.action, Unload);
        assert!(worker.config.is_err());

        let cases = [
            ("no module label", vec![(WORKER_ACTION_LABEL, "Load")]),
            ("no action label", vec![(MODULE_NAME_LABEL, "my-kmod")]),
            (
                "an unknown action",
                vec![
                    (MODULE_NAME_LABEL, "my-kmod"),
                    (WORKER_ACTION_LABEL, "load"),
                ],
            ),
            (
                "an invalid module name",
                vec![
                    (MODULE_NAME_LABEL, "My_Kmod"),
                    (WORKER_ACTION_LABEL, "Load"),
                ],
            ),
        ];
        for (name, labels) in cases {
            assert!(
                WorkerPod::from_pod(&worker_pod_object(&labels, &[])).is_err(),
                "{name}"
            );
        }
    }

    #[test]
    fn pod_phases() {
        let cases = [
            (None, Pending),
            (Some("Pending"), Pending),
            (Some("Running"), Running),
            (Some("Succeeded"), Succeeded),
            (Some("Failed"), Failed),
            (Some("Evicted"), PodPhase::Unknown),
        ];
        for (phase, want) in cases {
            assert_eq!(PodPhase::from_status(phase), want, "{phase:?}");
        }
    }
}
