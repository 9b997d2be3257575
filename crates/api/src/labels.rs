//! Well-known label, annotation and finalizer names.
//!
//! This is the one place that spells them: the per-module node and NMC labels of KMM
//! (including the ordered-upgrade labels of seed 002), the worker pod and device plugin
//! names, the LeaderWorkerSet and nodekeeper names, and capstan's own `capstan.dev/...`
//! annotations. Upstream spellings are kept exactly so capstan interoperates with existing
//! KMM, MUO and LWS objects.
//!
//! Per-module names embed `<namespace>.<name>` in the label *name part* (after the `/`),
//! which Kubernetes limits to 63 characters. [`ModuleKey::new`] is where that limit is
//! enforced, so a module whose labels could not exist is rejected before anything is applied.

use std::fmt;

use thiserror::Error;

/// Prefix of KMM's stable node labels and of its worker pod labels and annotations.
pub const KMM_PREFIX: &str = "kmm.node.kubernetes.io";
/// Prefix of KMM's internal (beta) node and NMC labels.
pub const KMM_BETA_PREFIX: &str = "beta.kmm.node.kubernetes.io";

/// Kubernetes limit on the name part of a label key (after the `/`).
pub const LABEL_NAME_MAX: usize = 63;
/// Kubernetes limit on the prefix of a label key (a DNS subdomain).
pub const LABEL_PREFIX_MAX: usize = 253;
/// Kubernetes limit on a label value.
pub const LABEL_VALUE_MAX: usize = 63;
/// Kubernetes limit on a namespace name (a DNS label).
pub const NAMESPACE_MAX: usize = 63;
/// Kubernetes limit on an object name that is a DNS subdomain.
pub const OBJECT_NAME_MAX: usize = 253;

// ---- worker pods (NMC controller) ----

/// Label on worker pods and device plugin DaemonSets: the Module's name.
pub const MODULE_NAME_LABEL: &str = "kmm.node.kubernetes.io/module.name";
/// Label on worker pods: `Load` or `Unload` (see [`WorkerAction`]).
pub const WORKER_ACTION_LABEL: &str = "kmm.node.kubernetes.io/worker-action";
/// Standard component label; worker pods carry [`WORKER_COMPONENT`].
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Value of [`COMPONENT_LABEL`] on worker pods.
pub const WORKER_COMPONENT: &str = "worker";
/// Standard name label; worker pods carry [`KMM_APP`], as upstream's do.
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
/// Standard part-of label; worker pods carry [`KMM_APP`], as upstream's do.
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of";
/// Value of [`APP_NAME_LABEL`] and [`PART_OF_LABEL`] on worker pods.
pub const KMM_APP: &str = "kmm";
/// Annotation on worker pods: the `ModuleConfig` as YAML, mounted through the downward API.
pub const WORKER_CONFIG_ANNOTATION: &str = "kmm.node.kubernetes.io/worker-config";
/// Annotation on worker pods: hash of the pod spec, to detect a stale pod.
pub const WORKER_HASH_ANNOTATION: &str = "kmm.node.kubernetes.io/worker-hash";
/// Annotation on worker pods: the module version the pod loads or unloads.
pub const WORKER_MODULE_VERSION_ANNOTATION: &str = "kmm.node.kubernetes.io/worker-module-version";
/// Annotation on worker pods with tolerations: their YAML list, where upstream KMM reads
/// a finished loader's tolerations from.
pub const WORKER_TOLERATIONS_ANNOTATION: &str = "kmm.node.kubernetes.io/worker-tolerations";

/// Upstream KMM's label on a namespace that holds Modules.
pub const NAMESPACE_LABEL: &str = "kmm.node.k8s.io/contains-modules";
/// Where the worker container finds [`WORKER_CONFIG_ANNOTATION`] (downward API file).
pub const WORKER_CONFIG_PATH: &str = "/etc/kmm-worker/config.yaml";
/// Prefix of every worker pod name; see [`ModuleKey::worker_pod_name`].
pub const WORKER_POD_NAME_PREFIX: &str = "kmm-worker-";

// ---- device plugin ----

/// Label on device plugin DaemonSets and their pods, with [`DEVICE_PLUGIN_ROLE`].
pub const ROLE_LABEL: &str = "kmm.node.kubernetes.io/role";
/// Value of [`ROLE_LABEL`] for device plugins.
pub const DEVICE_PLUGIN_ROLE: &str = "device-plugin";
/// Value of [`ROLE_LABEL`] on DRA driver DaemonSets and their pods.
pub const DRA_ROLE: &str = "dra";
/// Label on the DeviceClasses of a Module's DRA driver, with [`MODULE_NAME_LABEL`]: the
/// Module's namespace (a DeviceClass is cluster-scoped).
pub const MODULE_NAMESPACE_LABEL: &str = "kmm.node.kubernetes.io/module.namespace";
/// Name of the kubelet's device-plugin directory volume in device plugin pods.
pub const KUBELET_DEVICE_PLUGINS_VOLUME: &str = "kubelet-device-plugins";
/// Host directory where the kubelet expects device plugins' sockets.
pub const KUBELET_DEVICE_PLUGINS_PATH: &str = "/var/lib/kubelet/device-plugins";

// ---- finalizers ----

/// Finalizer on a Module: kept until no node still has the module loaded.
pub const MODULE_FINALIZER: &str = "kmm.node.kubernetes.io/module-finalizer";
/// Finalizer upstream KMM puts on its worker pods, kept until its NMC controller has read
/// the pod's outcome. capstan's worker pods have none; it removes this one from pods
/// upstream KMM created, which nothing else would release.
pub const WORKER_POD_FINALIZER: &str = "kmm.node.kubernetes.io/nodemodulesconfig-reconciler";
/// Finalizer on device plugin pods: kept until the pod's node has lost its
/// device-plugin-ready label (unless another ready pod of the Module runs there).
pub const NODE_LABELER_FINALIZER: &str = "kmm.node.kubernetes.io/node-labeler";

// ---- capstan ----

/// Annotation on everything capstan applies, and on its Events: `<branch>@sha1:<commit>`
/// of the commit that last changed the object (on a Node: its labels from Git).
pub const REVISION_ANNOTATION: &str = "capstan.dev/revision";
/// Annotation beside [`REVISION_ANNOTATION`]: the pull request that commit merged or
/// squashed; absent when it was not a pull request.
pub const PULL_REQUEST_ANNOTATION: &str = "capstan.dev/pull-request";
/// Annotation on a GitSync asking its leader to sync now, as Flux's
/// `reconcile.fluxcd.io/requestedAt`: a standby replica relays a webhook through it, and
/// `kubectl annotate --overwrite` works the same by hand. Its value only has to change.
pub const SYNC_REQUESTED_AT_ANNOTATION: &str = "capstan.dev/requested-at";
/// Label on history records: `Sync`, `Rejected` or `UpgradeStep`.
pub const RECORD_TYPE_LABEL: &str = "capstan.dev/record-type";
/// Label on history records: the full SHA of their commit.
pub const RECORD_COMMIT_LABEL: &str = "capstan.dev/commit";
/// Label on history records of upgrade steps: the node.
pub const RECORD_NODE_LABEL: &str = "capstan.dev/node";
/// Label on history records of upgrade steps: the Module, as `<namespace>.<name>`.
pub const RECORD_MODULE_LABEL: &str = "capstan.dev/module";
/// Label on history records: the `GitSync` they belong to.
pub const RECORD_SYNC_LABEL: &str = "capstan.dev/sync";
/// Annotation on objects a controller applies: the digest of what it last applied. A
/// field the controller stops setting leaves the live object a superset of the new
/// intent; the changed digest is what shows that the object must be applied again.
pub const APPLIED_DIGEST_ANNOTATION: &str = "capstan.dev/applied-digest";
/// Annotation on the Events of ordered-upgrade steps and waits: the Module, as
/// `<namespace>/<name>`.
pub const MODULE_ANNOTATION: &str = "capstan.dev/module";
/// Annotation on the Events of ordered-upgrade steps and waits: the version the node leaves
/// (absent when it had none).
pub const FROM_VERSION_ANNOTATION: &str = "capstan.dev/from-version";
/// Annotation on the Events of ordered-upgrade steps and waits: the version the node moves to
/// (absent when its version label was removed).
pub const TO_VERSION_ANNOTATION: &str = "capstan.dev/to-version";
/// Annotation on the Events of ordered-upgrade steps: the step, as
/// [`crate::UpgradeStep::as_str`] spells it.
pub const UPGRADE_STEP_ANNOTATION: &str = "capstan.dev/upgrade-step";
/// Prefix of the Node annotation `capstan.dev/upgrade.<ns>.<name>` in which the
/// version-label controller keeps the ordered upgrade of a Module on that node (see
/// [`ModuleKey::upgrade_annotation`]).
pub const UPGRADE_ANNOTATION_PREFIX: &str = "capstan.dev/upgrade.";

// ---- LeaderWorkerSet ----

/// Label on LWS StatefulSets, pods and revisions: the LeaderWorkerSet's name.
pub const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// Label on leader StatefulSet, pods and ControllerRevisions: the revision key.
pub const LWS_TEMPLATE_REVISION_HASH_LABEL: &str =
    "leaderworkerset.sigs.k8s.io/template-revision-hash";
/// Label on LWS pods: index in the group, 0 for the leader.
pub const LWS_WORKER_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/worker-index";
/// Label on LWS pods and worker StatefulSets: index of the group.
pub const LWS_GROUP_INDEX_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-index";
/// Label on LWS pods: a hash shared by all pods of one group.
pub const LWS_GROUP_KEY_LABEL: &str = "leaderworkerset.sigs.k8s.io/group-key";
/// Annotation on LWS pods: the group size.
pub const LWS_SIZE_ANNOTATION: &str = "leaderworkerset.sigs.k8s.io/size";

// ---- nodekeeper ----

/// Label key whose presence (any value) marks a control-plane node nodekeeper ignores.
pub const MASTER_ROLE_LABEL: &str = "node-role.kubernetes.io/master";
/// Node annotation set by the machine-config daemon; [`MACHINE_CONFIG_STATE_WORKING`] while upgrading.
pub const MACHINE_CONFIG_STATE_ANNOTATION: &str = "machineconfiguration.openshift.io/state";
/// Value of [`MACHINE_CONFIG_STATE_ANNOTATION`] while a node is being upgraded.
pub const MACHINE_CONFIG_STATE_WORKING: &str = "Working";
/// Taint key of a cordoned node (with effect `NoSchedule`).
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// Node annotation capstan sets to [`MACHINE_CONFIG_STATE_WORKING`] while it drains and
/// upgrades the node under a campaign: capstan's part of MCO's
/// [`MACHINE_CONFIG_STATE_ANNOTATION`], read by the nodekeeper's drain-timeout metric.
pub const UPGRADE_STATE_ANNOTATION: &str = "capstan.dev/upgrade-state";
/// Node annotation holding the drain capstan runs around the node's kmod steps under a
/// campaign (when it cordoned the node, whether the drain is done, the commit that asked).
pub const DRAIN_ANNOTATION: &str = "capstan.dev/drain";

/// What a worker pod does; the value of [`WORKER_ACTION_LABEL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkerAction {
    /// Load the module (`modprobe`).
    Load,
    /// Unload the module (`modprobe -r`).
    Unload,
}

impl WorkerAction {
    /// The label value, exactly as upstream spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerAction::Load => "Load",
            WorkerAction::Unload => "Unload",
        }
    }

    /// Reads a label value; `None` for anything but `Load` or `Unload`.
    pub fn from_label_value(value: &str) -> Option<Self> {
        match value {
            "Load" => Some(WorkerAction::Load),
            "Unload" => Some(WorkerAction::Unload),
            _ => None,
        }
    }
}

impl fmt::Display for WorkerAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A label, name or value that Kubernetes would refuse.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum LabelError {
    /// A per-module label would have a name part over 63 characters.
    #[error(
        "Module {module}: label {label} would have a {length}-character name part, over the \
         Kubernetes limit of {limit}; the namespace and name of a Module may have at most \
         {max_combined} characters together (they have {combined})"
    )]
    ModuleLabelTooLong {
        /// `namespace/name` of the Module.
        module: String,
        /// The full label key that is too long.
        label: String,
        /// Length of its name part.
        length: usize,
        /// [`LABEL_NAME_MAX`].
        limit: usize,
        /// Longest combined `namespace` + `name` length that fits every label.
        max_combined: usize,
        /// The Module's combined `namespace` + `name` length.
        combined: usize,
    },
    /// The Module's namespace is not a DNS label.
    #[error("Module {module}: namespace {namespace:?} is not a valid namespace name: {reason}")]
    InvalidNamespace {
        /// `namespace/name` of the Module.
        module: String,
        /// The offending namespace.
        namespace: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The Module's name is not a DNS subdomain.
    #[error("Module {module}: name {name:?} is not a valid object name: {reason}")]
    InvalidName {
        /// `namespace/name` of the Module.
        module: String,
        /// The offending name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An object that must be namespaced and named lacks one of them.
    #[error("{kind} has no metadata.{field}")]
    MissingMetadata {
        /// Kind of the object.
        kind: &'static str,
        /// `name` or `namespace`.
        field: &'static str,
    },
    /// A label key breaks the Kubernetes syntax.
    #[error("label key {key:?} is invalid: {reason}")]
    InvalidKey {
        /// The offending key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A label value breaks the Kubernetes syntax.
    #[error("label value {value:?} is invalid: {reason}")]
    InvalidValue {
        /// The offending value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The per-module labels KMM puts on nodes and NMCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ModuleLabel {
    /// Node: `kmm.node.kubernetes.io/<ns>.<name>.ready` = `""` once the module is loaded.
    Ready,
    /// Node: `kmm.node.kubernetes.io/<ns>.<name>.version.ready` = the loaded version.
    VersionReady,
    /// Node, set by the administrator: `kmm.node.kubernetes.io/version-module.<ns>.<name>` = wanted version.
    VersionModule,
    /// Node, internal: `beta.kmm.node.kubernetes.io/version-worker-pod.<ns>.<name>` = version to load.
    VersionWorkerPod,
    /// Node, internal: `beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name>` = version whose device plugin runs.
    VersionDevicePlugin,
    /// Node: `kmm.node.kubernetes.io/<ns>.<name>.device-plugin-ready` = `""` while a device
    /// plugin pod of the module is ready there.
    DevicePluginReady,
    /// Node: `kmm.node.kubernetes.io/<ns>.<name>.dra-ready` = `""` while a DRA driver pod of
    /// the module is ready there.
    DraReady,
    /// NMC: `beta.kmm.node.kubernetes.io/<ns>.<name>.module-configured`.
    ModuleConfigured,
    /// NMC: `beta.kmm.node.kubernetes.io/<ns>.<name>.module-in-use`.
    ModuleInUse,
}

impl ModuleLabel {
    /// Every per-module label.
    pub const ALL: [ModuleLabel; 9] = [
        ModuleLabel::Ready,
        ModuleLabel::VersionReady,
        ModuleLabel::VersionModule,
        ModuleLabel::VersionWorkerPod,
        ModuleLabel::VersionDevicePlugin,
        ModuleLabel::DevicePluginReady,
        ModuleLabel::DraReady,
        ModuleLabel::ModuleConfigured,
        ModuleLabel::ModuleInUse,
    ];

    /// The prefix (before the `/`).
    pub fn prefix(self) -> &'static str {
        match self {
            ModuleLabel::Ready
            | ModuleLabel::VersionReady
            | ModuleLabel::VersionModule
            | ModuleLabel::DevicePluginReady
            | ModuleLabel::DraReady => KMM_PREFIX,
            ModuleLabel::VersionWorkerPod
            | ModuleLabel::VersionDevicePlugin
            | ModuleLabel::ModuleConfigured
            | ModuleLabel::ModuleInUse => KMM_BETA_PREFIX,
        }
    }

    /// What comes before and after `<ns>.<name>` in the name part.
    fn affixes(self) -> (&'static str, &'static str) {
        match self {
            ModuleLabel::Ready => ("", ".ready"),
            ModuleLabel::VersionReady => ("", ".version.ready"),
            ModuleLabel::VersionModule => ("version-module.", ""),
            ModuleLabel::VersionWorkerPod => ("version-worker-pod.", ""),
            ModuleLabel::VersionDevicePlugin => ("version-device-plugin.", ""),
            ModuleLabel::DevicePluginReady => ("", ".device-plugin-ready"),
            ModuleLabel::DraReady => ("", ".dra-ready"),
            ModuleLabel::ModuleConfigured => ("", ".module-configured"),
            ModuleLabel::ModuleInUse => ("", ".module-in-use"),
        }
    }

    /// Length of the name part for a module whose namespace and name have `combined` characters.
    fn name_part_len(self, combined: usize) -> usize {
        let (before, after) = self.affixes();
        before.len() + combined + 1 + after.len()
    }

    /// The largest combined namespace + name length every per-module label allows (40).
    pub fn max_combined_len() -> usize {
        let longest_affixes = Self::ALL
            .iter()
            .map(|label| label.name_part_len(0))
            .max()
            .unwrap_or(0);
        LABEL_NAME_MAX.saturating_sub(longest_affixes)
    }

    /// Every reading of `key` as a per-module label.
    ///
    /// Upstream's naming is ambiguous for some names (a namespace called `version-module`,
    /// a Module whose name ends in `.version`), so this returns all readings whose
    /// namespace and name are valid; callers match them against the modules they know.
    pub fn parse(key: &str) -> Vec<(ModuleLabel, ModuleKey)> {
        let Some((prefix, name_part)) = key.split_once('/') else {
            return Vec::new();
        };
        Self::ALL
            .iter()
            .filter(|label| label.prefix() == prefix)
            .filter_map(|&label| {
                let (before, after) = label.affixes();
                let qualified = name_part.strip_prefix(before)?.strip_suffix(after)?;
                // A namespace is a DNS label, so it ends at the first dot.
                let (namespace, name) = qualified.split_once('.')?;
                ModuleKey::new(namespace, name).ok().map(|key| (label, key))
            })
            .collect()
    }
}

/// Whether `key` is the ready label of KMM releases before namespaced Modules,
/// `kmm.node.kubernetes.io/<name>.ready` (letters, digits and `-`, no namespace), which
/// upstream KMM removes from every node it reconciles.
pub fn is_deprecated_ready_label(key: &str) -> bool {
    key.strip_prefix(KMM_PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .and_then(|name_part| name_part.strip_suffix(".ready"))
        .is_some_and(|name| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// The namespace and name of a `Module`, checked so that every label KMM derives from it
/// is a valid Kubernetes label key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleKey {
    namespace: String,
    name: String,
}

impl ModuleKey {
    /// Checks a Module's namespace and name.
    ///
    /// Fails when the namespace is not a DNS label, the name is not a DNS subdomain, or
    /// the longest per-module label name part (`version-device-plugin.<ns>.<name>`) would
    /// be longer than 63 characters, i.e. namespace and name have more than 40 characters
    /// together. The error names the module, the label, its length and the limit.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Result<Self, LabelError> {
        let key = ModuleKey {
            namespace: namespace.into(),
            name: name.into(),
        };
        if let Err(reason) = check_dns_label(&key.namespace, NAMESPACE_MAX) {
            return Err(LabelError::InvalidNamespace {
                module: key.to_string(),
                namespace: key.namespace.clone(),
                reason,
            });
        }
        if let Err(reason) = check_dns_subdomain(&key.name, OBJECT_NAME_MAX) {
            return Err(LabelError::InvalidName {
                module: key.to_string(),
                name: key.name.clone(),
                reason,
            });
        }
        let combined = key.namespace.len() + key.name.len();
        // Report the longest label: it is the one that decides the limit.
        let longest = ModuleLabel::ALL
            .iter()
            .copied()
            .max_by_key(|label| label.name_part_len(combined))
            .unwrap_or(ModuleLabel::VersionDevicePlugin);
        let length = longest.name_part_len(combined);
        if length > LABEL_NAME_MAX {
            return Err(LabelError::ModuleLabelTooLong {
                module: key.to_string(),
                label: key.label(longest),
                length,
                limit: LABEL_NAME_MAX,
                max_combined: ModuleLabel::max_combined_len(),
                combined,
            });
        }
        // Every per-module label key is then valid: a fixed valid prefix, and a name part
        // of valid affixes around a DNS label and subdomain, within the length checked
        // above (`every_label_of_a_valid_key_is_a_valid_label_key` holds it to that).
        Ok(key)
    }

    /// The Module's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Module's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The full key of one of the per-module labels.
    pub fn label(&self, label: ModuleLabel) -> String {
        let (before, after) = label.affixes();
        format!(
            "{}/{before}{}.{}{after}",
            label.prefix(),
            self.namespace,
            self.name
        )
    }

    /// `kmm.node.kubernetes.io/<ns>.<name>.ready`: on a node once the module is loaded.
    pub fn ready_label(&self) -> String {
        self.label(ModuleLabel::Ready)
    }

    /// `kmm.node.kubernetes.io/<ns>.<name>.version.ready`: the version loaded on a node.
    pub fn version_ready_label(&self) -> String {
        self.label(ModuleLabel::VersionReady)
    }

    /// `kmm.node.kubernetes.io/version-module.<ns>.<name>`: the version the administrator wants on a node.
    pub fn version_module_label(&self) -> String {
        self.label(ModuleLabel::VersionModule)
    }

    /// `beta.kmm.node.kubernetes.io/version-worker-pod.<ns>.<name>`: the version worker pods may load.
    pub fn version_worker_pod_label(&self) -> String {
        self.label(ModuleLabel::VersionWorkerPod)
    }

    /// `beta.kmm.node.kubernetes.io/version-device-plugin.<ns>.<name>`: the version whose device plugin may run.
    pub fn version_device_plugin_label(&self) -> String {
        self.label(ModuleLabel::VersionDevicePlugin)
    }

    /// `kmm.node.kubernetes.io/<ns>.<name>.device-plugin-ready`: on a node while a device
    /// plugin pod of the module is ready there (upstream's `GetDevicePluginNodeLabel`).
    pub fn device_plugin_ready_label(&self) -> String {
        self.label(ModuleLabel::DevicePluginReady)
    }

    /// `kmm.node.kubernetes.io/<ns>.<name>.dra-ready`: on a node while a DRA driver pod of
    /// the module is ready there (KMM main's `GetDRANodeLabel`).
    pub fn dra_ready_label(&self) -> String {
        self.label(ModuleLabel::DraReady)
    }

    /// `beta.kmm.node.kubernetes.io/<ns>.<name>.module-configured`: on an NMC that has the module in its spec.
    pub fn module_configured_label(&self) -> String {
        self.label(ModuleLabel::ModuleConfigured)
    }

    /// `beta.kmm.node.kubernetes.io/<ns>.<name>.module-in-use`: on an NMC whose node has the module loaded.
    pub fn module_in_use_label(&self) -> String {
        self.label(ModuleLabel::ModuleInUse)
    }

    /// `capstan.dev/upgrade.<ns>.<name>`: the Node annotation holding this Module's ordered
    /// upgrade on the node while it waits or runs. Its name part fits the 63-character
    /// limit for every valid key.
    pub fn upgrade_annotation(&self) -> String {
        format!(
            "{UPGRADE_ANNOTATION_PREFIX}{}.{}",
            self.namespace, self.name
        )
    }

    /// The Module whose [`ModuleKey::upgrade_annotation`] `key` is; `None` for any other key.
    pub fn from_upgrade_annotation(key: &str) -> Option<ModuleKey> {
        let qualified = key.strip_prefix(UPGRADE_ANNOTATION_PREFIX)?;
        // A namespace is a DNS label, so it ends at the first dot.
        let (namespace, name) = qualified.split_once('.')?;
        ModuleKey::new(namespace, name).ok()
    }

    /// `kmm-worker-<node>-<module name>`, the worker pod of this module on `node`
    /// (in the Module's namespace). Not checked against the 253-character name limit.
    pub fn worker_pod_name(&self, node: &str) -> String {
        format!("{WORKER_POD_NAME_PREFIX}{node}-{}", self.name)
    }
}

impl fmt::Display for ModuleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Checks a label key (`[prefix/]name`) against the Kubernetes syntax: the name part at most
/// 63 characters, alphanumeric at both ends with `-`, `_`, `.` inside; the optional prefix a
/// DNS subdomain of at most 253 characters.
pub fn validate_label_key(key: &str) -> Result<(), LabelError> {
    let invalid = |reason: String| LabelError::InvalidKey {
        key: key.to_string(),
        reason,
    };
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_dns_subdomain(prefix, LABEL_PREFIX_MAX)
            .map_err(|r| invalid(format!("prefix: {r}")))?;
    }
    if name.is_empty() {
        return Err(invalid("the name part is empty".to_string()));
    }
    if name.len() > LABEL_NAME_MAX {
        return Err(invalid(format!(
            "the name part has {} characters, over the limit of {LABEL_NAME_MAX}",
            name.len()
        )));
    }
    check_label_chars(name).map_err(|r| invalid(format!("name part: {r}")))
}

/// Checks a label value: empty, or at most 63 characters, alphanumeric at both ends with
/// `-`, `_`, `.` inside. Module versions are label values (`version-module` and friends).
pub fn validate_label_value(value: &str) -> Result<(), LabelError> {
    if value.is_empty() {
        return Ok(());
    }
    let invalid = |reason: String| LabelError::InvalidValue {
        value: value.to_string(),
        reason,
    };
    if value.len() > LABEL_VALUE_MAX {
        return Err(invalid(format!(
            "it has {} characters, over the limit of {LABEL_VALUE_MAX}",
            value.len()
        )));
    }
    check_label_chars(value).map_err(invalid)
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the shape of label names and values.
fn check_label_chars(s: &str) -> Result<(), String> {
    if let Some(bad) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "character {bad:?} is not allowed (only letters, digits, '-', '_' and '.')"
        ));
    }
    let alnum_ends = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum_ends {
        return Err("it must start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// RFC 1123 label: lowercase alphanumerics and `-`, alphanumeric at both ends.
fn check_dns_label(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > max {
        return Err(format!(
            "it has {} characters, over the limit of {max}",
            s.len()
        ));
    }
    if let Some(bad) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "character {bad:?} is not allowed (only lowercase letters, digits and '-')"
        ));
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err("it must start and end with a lowercase letter or digit".to_string());
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated RFC 1123 labels.
fn check_dns_subdomain(s: &str, max: usize) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".to_string());
    }
    if s.len() > max {
        return Err(format!(
            "it has {} characters, over the limit of {max}",
            s.len()
        ));
    }
    for part in s.split('.') {
        check_dns_label(part, usize::MAX).map_err(|reason| {
            if part.is_empty() {
                "it has an empty part between dots".to_string()
            } else {
                reason
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_of_a_valid_key_is_a_valid_label_key() {
        let longest_name = "n".repeat(ModuleLabel::max_combined_len() - 1);
        let keys = [
            ("a", "b"),
            ("kmm-operator", "my-kmod"),
            ("ns", "dotted.module-name.v2"),
            ("0", "9.9"),
            ("x", longest_name.as_str()),
        ];
        for (namespace, name) in keys {
            let key = ModuleKey::new(namespace, name).expect("a valid key");
            for label in ModuleLabel::ALL {
                let text = key.label(label);
                assert!(validate_label_key(&text).is_ok(), "{text}");
            }
        }
    }

    fn demo() -> ModuleKey {
        ModuleKey::new("kmm-demo", "my-kmod").unwrap()
    }

    #[test]
    fn module_labels_are_spelled_as_upstream() {
        let key = demo();
        let cases = [
            (
                key.ready_label(),
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.ready",
            ),
            (
                key.version_ready_label(),
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.version.ready",
            ),
            (
                key.version_module_label(),
                "kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod",
            ),
            (
                key.version_worker_pod_label(),
                "beta.kmm.node.kubernetes.io/version-worker-pod.kmm-demo.my-kmod",
            ),
            (
                key.version_device_plugin_label(),
                "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-demo.my-kmod",
            ),
            (
                key.device_plugin_ready_label(),
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.device-plugin-ready",
            ),
            (
                key.dra_ready_label(),
                "kmm.node.kubernetes.io/kmm-demo.my-kmod.dra-ready",
            ),
            (
                key.module_configured_label(),
                "beta.kmm.node.kubernetes.io/kmm-demo.my-kmod.module-configured",
            ),
            (
                key.module_in_use_label(),
                "beta.kmm.node.kubernetes.io/kmm-demo.my-kmod.module-in-use",
            ),
            (key.worker_pod_name("node-1"), "kmm-worker-node-1-my-kmod"),
            (
                key.upgrade_annotation(),
                "capstan.dev/upgrade.kmm-demo.my-kmod",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
        assert_eq!(key.to_string(), "kmm-demo/my-kmod");
    }

    #[test]
    fn every_label_parses_back_to_its_module() {
        let key = demo();
        for label in ModuleLabel::ALL {
            let parsed = ModuleLabel::parse(&key.label(label));
            assert!(
                parsed.contains(&(label, key.clone())),
                "{label:?}: {parsed:?}"
            );
            // `<ns>.<name>.version.ready` is also the ready label of a module `<name>.version`.
            let readings = if label == ModuleLabel::VersionReady {
                2
            } else {
                1
            };
            assert_eq!(parsed.len(), readings, "{label:?}: {parsed:?}");
        }
    }

    #[test]
    fn parse_reports_every_reading_of_an_ambiguous_label() {
        // (label key, readings as (label, (namespace, name)))
        type Readings = Vec<(ModuleLabel, (&'static str, &'static str))>;
        let cases: [(&str, Readings); 5] = [
            ("app.kubernetes.io/component", vec![]),
            ("kmm.node.kubernetes.io/module.name", vec![]),
            ("no-prefix.ready", vec![]),
            (
                "kmm.node.kubernetes.io/ns.kmod.version.ready",
                vec![
                    (ModuleLabel::Ready, ("ns", "kmod.version")),
                    (ModuleLabel::VersionReady, ("ns", "kmod")),
                ],
            ),
            (
                "kmm.node.kubernetes.io/version-module.x.ready",
                vec![
                    (ModuleLabel::Ready, ("version-module", "x")),
                    (ModuleLabel::VersionModule, ("x", "ready")),
                ],
            ),
        ];
        for (key, want) in cases {
            let want: Vec<_> = want
                .into_iter()
                .map(|(label, (ns, name))| (label, ModuleKey::new(ns, name).unwrap()))
                .collect();
            assert_eq!(ModuleLabel::parse(key), want, "{key}");
        }
    }

    #[test]
    fn upgrade_annotations_parse_back_and_fit_the_limit() {
        let key = demo();
        assert_eq!(
            ModuleKey::from_upgrade_annotation(&key.upgrade_annotation()),
            Some(key)
        );
        assert_eq!(
            ModuleKey::from_upgrade_annotation("capstan.dev/revision"),
            None
        );
        assert_eq!(
            ModuleKey::from_upgrade_annotation("capstan.dev/upgrade.nodot"),
            None
        );
        let longest = ModuleKey::new("a".repeat(20), "b".repeat(20)).unwrap();
        assert!(validate_label_key(&longest.upgrade_annotation()).is_ok());
    }

    #[test]
    fn combined_length_limit_is_forty() {
        assert_eq!(ModuleLabel::max_combined_len(), 40);
    }

    #[test]
    fn module_key_length_rule() {
        let cases = [
            // (namespace, name, accepted)
            ("a".repeat(20), "b".repeat(20), true),
            ("a".repeat(19), "b".repeat(21), true),
            ("a".repeat(20), "b".repeat(21), false),
            ("a".to_string(), "b".repeat(39), true),
            ("a".to_string(), "b".repeat(40), false),
            ("a".repeat(63), "b".to_string(), false),
        ];
        for (namespace, name, accepted) in cases {
            let result = ModuleKey::new(namespace.as_str(), name.as_str());
            assert_eq!(result.is_ok(), accepted, "{namespace}/{name}: {result:?}");
        }
    }

    #[test]
    fn too_long_error_names_module_label_length_and_limit() {
        let err = ModuleKey::new("kmm-operator-system", "nvidia-gpu-driver-module").unwrap_err();
        assert_eq!(
            err,
            LabelError::ModuleLabelTooLong {
                module: "kmm-operator-system/nvidia-gpu-driver-module".to_string(),
                label: "beta.kmm.node.kubernetes.io/version-device-plugin.kmm-operator-system.nvidia-gpu-driver-module"
                    .to_string(),
                length: 66,
                limit: 63,
                max_combined: 40,
                combined: 43,
            }
        );
        let message = err.to_string();
        for part in [
            "kmm-operator-system/nvidia-gpu-driver-module",
            "version-device-plugin.kmm-operator-system.nvidia-gpu-driver-module",
            "66",
            "63",
            "40",
        ] {
            assert!(message.contains(part), "{message} lacks {part}");
        }
    }

    #[test]
    fn module_key_rejects_invalid_names() {
        let cases = [
            ("", "kmod", "namespace"),
            ("Kmm", "kmod", "namespace"),
            ("kmm.demo", "kmod", "namespace"),
            ("-kmm", "kmod", "namespace"),
            ("kmm", "", "name"),
            ("kmm", "My_Kmod", "name"),
            ("kmm", "kmod-", "name"),
            ("kmm", "a..b", "name"),
            ("kmm", ".kmod", "name"),
        ];
        for (namespace, name, field) in cases {
            let err = ModuleKey::new(namespace, name).unwrap_err();
            let matches = match field {
                "namespace" => matches!(err, LabelError::InvalidNamespace { .. }),
                _ => matches!(err, LabelError::InvalidName { .. }),
            };
            assert!(matches, "{namespace}/{name}: {err}");
        }
        // Dots are fine in a Module name (a DNS subdomain) and in label names.
        assert!(ModuleKey::new("kmm", "intel.qat").is_ok());
    }

    #[test]
    fn label_key_syntax() {
        let cases = [
            ("app", true),
            ("app.kubernetes.io/component", true),
            ("kmm.node.kubernetes.io/a.b.ready", true),
            ("example.com/Under_score.9", true),
            ("/name", false),
            ("example.com/", false),
            ("Example.com/name", false),
            ("example.com/-name", false),
            ("example.com/name.", false),
            ("example.com/na me", false),
            ("a/b/c", false),
        ];
        for (key, valid) in cases {
            assert_eq!(validate_label_key(key).is_ok(), valid, "{key}");
        }
        assert!(validate_label_key(&format!("x/{}", "a".repeat(63))).is_ok());
        assert!(validate_label_key(&format!("x/{}", "a".repeat(64))).is_err());
        assert!(validate_label_key(&format!("{}/x", "a".repeat(254))).is_err());
    }

    #[test]
    fn label_value_syntax() {
        let long = "v".repeat(64);
        let cases = [
            ("", true),
            ("v1", true),
            ("1.2.3-rc_1", true),
            ("v1+build", false),
            ("-v1", false),
            ("v1.", false),
            (long.as_str(), false),
        ];
        for (value, valid) in cases {
            assert_eq!(validate_label_value(value).is_ok(), valid, "{value}");
        }
    }

    #[test]
    fn worker_action_round_trips() {
        for action in [WorkerAction::Load, WorkerAction::Unload] {
            assert_eq!(
                WorkerAction::from_label_value(action.as_str()),
                Some(action)
            );
        }
        assert_eq!(WorkerAction::from_label_value("load"), None);
    }

    #[test]
    fn deprecated_ready_labels_have_no_namespace() {
        // Upstream's own cases, and the labels of namespaced Modules.
        let cases = [
            ("kmm.node.kubernetes.io/a.ready", true),
            ("kmm.node.kubernetes.io/1.ready", true),
            ("kmm.node.kubernetes.io/with-hyphen.ready", true),
            ("test.ready", false),
            ("kmm.node.kubernetes.io/ns.name.ready", false),
            ("kmm.node.kubernetes.io/..ready", false),
            ("kmm.node.kubernetes.io/.ready", false),
            ("kmm.node.kubernetes.io/ns.name.version.ready", false),
            ("beta.kmm.node.kubernetes.io/a.ready", false),
            ("kmm.node.kubernetes.io/a.device-plugin-ready", false),
            ("kmm.node.kubernetes.io/a.dra-ready", false),
        ];
        for (key, deprecated) in cases {
            assert_eq!(is_deprecated_ready_label(key), deprecated, "{key}");
        }
    }
}
