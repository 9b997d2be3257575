//! KMM `Module` (`kmm.sigs.x-k8s.io/v1beta1`, namespaced): which kernel module to load on
//! which nodes, from which image per kernel, and the device plugin that goes with it.
//!
//! Field names, optionality and defaults follow upstream `api/v1beta1/module_types.go` of
//! KMM v2.6.0, field for field, and the `dra` fields KMM main (de3f8c9) adds;
//! `crates/api/tests/upstream_fields.rs` holds the CRD to main's. Go `string` fields marked
//! `omitempty` are Rust `String`s that are left out when empty, so "unset" and "empty" mean
//! the same thing, as upstream. Fields for in-cluster
//! builds and signing (`build`, `sign`, `imageRebuildTriggerGeneration`) are typed so
//! upstream Modules decode and round-trip; capstan loads prebuilt images and does not act on
//! them. The types do not reject unknown fields, so objects written by a newer KMM still
//! decode; manifests from Git are checked strictly against the CRD schema instead (see
//! [`crate::schema::unknown_fields`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, LocalObjectReference, ResourceRequirements, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::resource::v1::{DeviceClassConfiguration, DeviceSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::labels::{LabelError, ModuleKey};

/// Desired state of a `Module`: how KMM deploys a kernel module on the nodes that need it.
// Repeated `printcolumn(type_ = ...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kmm.sigs.x-k8s.io",
    version = "v1beta1",
    derive = "PartialEq",
    kind = "Module",
    namespaced,
    status = "ModuleStatus",
    doc = "Module describes how to load a kernel module on different kernel versions.",
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.moduleLoader.container.version"
    ),
    printcolumn(
        name = "Targeted",
        type_ = "integer",
        json_path = ".status.moduleLoader.nodesMatchingSelectorNumber"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.moduleLoader.desiredNumber"
    ),
    printcolumn(
        name = "Available",
        type_ = "integer",
        json_path = ".status.moduleLoader.availableNumber"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!(has(self.dra) && has(self.devicePlugin))",
    "message": "spec.dra and spec.devicePlugin are mutually exclusive",
}]))]
pub struct ModuleSpec {
    /// Node labels a node must carry for the module to be loaded on it.
    pub selector: BTreeMap<String, String>,

    /// Tolerations of the worker and device plugin pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub tolerations: Vec<Toleration>,

    /// Secret used to pull the kmod and device plugin images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub image_repo_secret: Option<LocalObjectReference>,

    /// How the kernel module is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_loader: Option<ModuleLoaderSpec>,

    /// The device plugin DaemonSet run on nodes where the module is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_plugin: Option<DevicePluginSpec>,

    /// The DRA kubelet plugin DaemonSet and the DeviceClasses it serves; mutually exclusive
    /// with `devicePlugin` (KMM main).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraSpec>,

    /// A counter to increment to make KMM verify the module's images again and rebuild the
    /// missing ones. Kept so upstream Modules decode; capstan does not build images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_rebuild_trigger_generation: Option<i64>,
}

/// How the kernel module is loaded on a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleLoaderSpec {
    /// The kmod image, modprobe settings and kernel mappings.
    pub container: ModuleLoaderContainerSpec,

    /// Service account of the worker pods.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,
}

/// The kmod image and how `modprobe` loads it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleLoaderContainerSpec {
    /// Version of the kernel module; set for ordered upgrades. It may change from one value
    /// to another, never from empty to set or back.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,

    /// Default kmod image for mappings that do not name one; may use the
    /// `${KERNEL_FULL_VERSION}`-style template variables.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_image: String,

    /// Pull policy of the kmod image (`Always`, `Never`, `IfNotPresent`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,

    /// How to reach the registry of the kmod image.
    #[serde(
        rename = "registryTLS",
        default,
        skip_serializing_if = "TlsOptions::is_default"
    )]
    pub registry_tls: TlsOptions,

    /// In-tree modules removed (if present) before the module is loaded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_tree_modules_to_remove: Vec<String>,

    /// One in-tree module removed (if present) before the module is loaded. Deprecated
    /// upstream in favour of `inTreeModulesToRemove`, still served; see
    /// [`KernelMapping::in_tree_modules_for`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub in_tree_module_to_remove: String,

    /// Kernel versions this module supports and the image for each, tried in order: the
    /// first mapping whose `literal` equals the node's kernel or whose `regexp` matches it
    /// wins.
    #[schemars(length(min = 1))]
    pub kernel_mappings: Vec<KernelMapping>,

    /// Which module `modprobe` loads, and how.
    pub modprobe: ModprobeSpec,

    /// Default in-cluster build settings. Kept so upstream Modules decode; capstan does not
    /// build images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<Build>,

    /// Default module signing settings. Kept so upstream Modules decode; capstan does not
    /// sign modules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sign: Option<Sign>,
}

/// One kernel version (or pattern) and the kmod image for it. Fields set here override the
/// container's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelMapping {
    /// Kernel version matched exactly.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub literal: String,

    /// Regular expression matched (unanchored) against the kernel version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub regexp: String,

    /// Kmod image for matching kernels; may use template variables.
    pub container_image: String,

    /// Overrides the container's registry settings when set.
    #[serde(
        rename = "registryTLS",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub registry_tls: Option<TlsOptions>,

    /// Overrides the container's in-tree modules to remove when present, even empty: an
    /// explicit `[]` removes none on these kernels, as upstream's `!= nil`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_tree_modules_to_remove: Option<Vec<String>>,

    /// Overrides the container's single in-tree module to remove when set. Deprecated
    /// upstream in favour of `inTreeModulesToRemove`, still served.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub in_tree_module_to_remove: String,

    /// Build settings for this mapping (not acted on by capstan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<Build>,

    /// Signing settings for this mapping (not acted on by capstan).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sign: Option<Sign>,
}

impl KernelMapping {
    /// The in-tree modules removed before loading on a kernel this mapping covers, as
    /// upstream resolves them: the mapping's `inTreeModulesToRemove` when present (an empty
    /// list included), else the container's;
    /// then a deprecated `inTreeModuleToRemove` (the mapping's, else the container's), when
    /// set, replaces that list. (Upstream's webhook rejects Modules that mix the two forms,
    /// so the replacement only matters for Modules written with the deprecated one.)
    pub fn in_tree_modules_for(&self, container: &ModuleLoaderContainerSpec) -> Vec<String> {
        let single = if self.in_tree_module_to_remove.is_empty() {
            &container.in_tree_module_to_remove
        } else {
            &self.in_tree_module_to_remove
        };
        if !single.is_empty() {
            return vec![single.clone()];
        }
        self.in_tree_modules_to_remove
            .as_ref()
            .unwrap_or(&container.in_tree_modules_to_remove)
            .clone()
    }
}

/// How to reach an image registry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsOptions {
    /// Use plain HTTP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,

    /// Accept any certificate.
    #[serde(
        rename = "insecureSkipTLSVerify",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub insecure_skip_tls_verify: bool,
}

impl TlsOptions {
    /// True when nothing is set, as for an absent `registryTLS`.
    pub fn is_default(&self) -> bool {
        *self == TlsOptions::default()
    }
}

/// Which module `modprobe` loads and with which arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModprobeSpec {
    /// Name of the module to load; may be empty only when `rawArgs` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub module_name: String,

    /// Module parameters (`key=value`) appended to the load command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<String>,

    /// Root directory of the modules in the image (`modprobe -d`).
    #[serde(default = "default_dir_name")]
    pub dir_name: String,

    /// Extra arguments passed before the module name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<ModprobeArgs>,

    /// Arguments passed to `modprobe` verbatim; everything else is then ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_args: Option<ModprobeArgs>,

    /// Directory of the image whose firmware files are copied to the host.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub firmware_path: String,

    /// Modules loaded in dependency order, top module first (must equal `moduleName`),
    /// at least two and without duplicates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modules_loading_order: Vec<String>,
}

impl Default for ModprobeSpec {
    fn default() -> Self {
        ModprobeSpec {
            module_name: String::new(),
            parameters: Vec::new(),
            dir_name: default_dir_name(),
            args: None,
            raw_args: None,
            firmware_path: String::new(),
            modules_loading_order: Vec::new(),
        }
    }
}

/// The taints the kubelet puts on a node that runs short of disk, memory or process IDs.
/// Upstream KMM tolerates them for every Module (`InternalTolerations`,
/// internal/module/helper.go), so that a node under pressure keeps its kernel modules.
pub const PRESSURE_TOLERATIONS: [&str; 3] = [
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
];

/// [`PRESSURE_TOLERATIONS`] as upstream writes them: `Exists`, `NoSchedule`.
pub fn pressure_tolerations() -> impl Iterator<Item = Toleration> {
    PRESSURE_TOLERATIONS.iter().map(|key| Toleration {
        key: Some((*key).to_string()),
        operator: Some("Exists".to_string()),
        effect: Some("NoSchedule".to_string()),
        ..Toleration::default()
    })
}

/// Upstream's default module root inside kmod images.
pub const DEFAULT_DIR_NAME: &str = "/opt";

fn default_dir_name() -> String {
    DEFAULT_DIR_NAME.to_string()
}

/// Arguments for loading and unloading.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModprobeArgs {
    /// Arguments used when loading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub load: Vec<String>,

    /// Arguments used when unloading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(min = 1))]
    pub unload: Vec<String>,
}

/// In-cluster build settings (upstream `Build`). capstan does not build images; the type is
/// kept complete so Modules written for upstream KMM decode and round-trip.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Build {
    /// Build arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub build_args: Vec<BuildArg>,

    /// ConfigMap holding the Dockerfile.
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub dockerfile_config_map: LocalObjectReference,

    /// How to reach the registries of the base images.
    #[serde(
        rename = "baseImageRegistryTLS",
        default,
        skip_serializing_if = "TlsOptions::is_default"
    )]
    pub base_image_registry_tls: TlsOptions,

    /// Secrets made available to the build.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub secrets: Vec<LocalObjectReference>,

    /// Kaniko settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kaniko_params: Option<KanikoParams>,

    /// Nodes the build may run on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: BTreeMap<String, String>,
}

/// One build argument.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BuildArg {
    /// Argument name.
    pub name: String,
    /// Argument value.
    pub value: String,
}

/// Kaniko settings of a build.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KanikoParams {
    /// Kaniko image tag.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tag: String,
}

/// Module signing settings (upstream `Sign`). capstan does not sign modules; the type is
/// kept complete so Modules written for upstream KMM decode and round-trip.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sign {
    /// Image to sign when there is no build.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub unsigned_image: String,

    /// How to reach the registry of the unsigned image.
    #[serde(
        rename = "unsignedImageRegistryTLS",
        default,
        skip_serializing_if = "TlsOptions::is_default"
    )]
    pub unsigned_image_registry_tls: TlsOptions,

    /// Secret holding the signing private key.
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub key_secret: LocalObjectReference,

    /// Secret holding the signing certificate.
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub cert_secret: LocalObjectReference,

    /// Files in the image to sign.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_to_sign: Vec<String>,
}

/// The device plugin DaemonSet of a module.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginSpec {
    /// The device plugin container.
    pub container: DevicePluginContainerSpec,

    /// An init container run before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container: Option<DevicePluginContainerSpec>,

    /// Service account of the device plugin pods.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,

    /// Volumes of the device plugin pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub volumes: Vec<Volume>,

    /// `false` keeps the service account token and CAs out of the device plugin pods, so
    /// other files can be mounted at their path; unset means Kubernetes' default (mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,
}

/// The DRA kubelet plugin of a module (upstream `DRASpec`): a DaemonSet per module
/// version, and the cluster-scoped DeviceClasses that select its devices.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DraSpec {
    /// The DRA driver container.
    pub container: CommonContainerSpec,

    /// An init container run before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_container: Option<CommonContainerSpec>,

    /// Service account of the DRA driver pods.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service_account_name: String,

    /// Volumes of the DRA driver pods, after the kubelet plugin and CDI directories.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub volumes: Vec<Volume>,

    /// `false` keeps the service account token and CAs out of the DRA driver pods; unset
    /// means Kubernetes' default (mounted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automount_service_account_token: Option<bool>,

    /// The driver name the plugin registers with the kubelet (a DNS subdomain). Only
    /// checked: the driver is not told it, as upstream.
    pub driver_name: String,

    /// DeviceClasses managed for the Module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_classes: Vec<DeviceClassSpec>,
}

/// A cluster-scoped `resource.k8s.io/v1` DeviceClass managed for a Module (upstream
/// `DeviceClassSpec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassSpec {
    /// The DeviceClass's `metadata.name`.
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub name: String,

    /// The DeviceClass's `spec.selectors`: CEL expressions a device must satisfy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), transform = super::schema::drop_nested_descriptions)]
    pub selectors: Vec<DeviceSelector>,

    /// The DeviceClass's `spec.config`: configuration passed to the driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 32),
        transform = super::schema::drop_nested_descriptions,
        transform = super::schema::device_class_markers
    )]
    pub config: Vec<DeviceClassConfiguration>,
}

/// The container fields the device plugin and the DRA driver share (upstream renamed
/// `DevicePluginContainerSpec` to `CommonContainerSpec`; the JSON is the same).
pub type CommonContainerSpec = DevicePluginContainerSpec;

/// A device plugin (or init) container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePluginContainerSpec {
    /// Image of the container.
    pub image: String,

    /// Entrypoint; the image's ENTRYPOINT when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,

    /// Arguments; the image's CMD when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,

    /// Environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub env: Vec<EnvVar>,

    /// Pull policy (`Always`, `Never`, `IfNotPresent`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_pull_policy: String,

    /// Compute resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub resources: Option<ResourceRequirements>,

    /// Volume mounts added to the default ones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub volume_mounts: Vec<VolumeMount>,
}

/// Observed state of a `Module`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// Loading of the module across the targeted nodes.
    #[serde(default)]
    pub module_loader: DaemonSetStatus,

    /// The device plugin across the targeted nodes.
    #[serde(default)]
    pub device_plugin: DaemonSetStatus,

    /// The DRA driver across the targeted nodes; all zero without `spec.dra`.
    #[serde(default)]
    pub dra: DaemonSetStatus,

    /// `Available` (loaded on every node that should have it) and `Degraded` (worker pods
    /// fail on some nodes, with the reasons). capstan's addition to upstream's status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<ModuleCondition>,

    /// The `spec.imageRebuildTriggerGeneration` upstream KMM last rebuilt images for.
    /// capstan never writes it (it builds no images) and keeps what another writer set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_rebuild_trigger_generation: Option<i64>,
}

/// One condition of a Module, in the usual Kubernetes shape.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleCondition {
    /// `Available` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// One word, CamelCase.
    #[serde(default)]
    pub reason: String,
    /// For people.
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default)]
    pub last_transition_time: String,
}

/// Counts of nodes for one part of a module. Zeros are written out, not omitted, so a
/// merge patch of the status resets a count that dropped to zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DaemonSetStatus {
    /// Nodes matching the Module's selector.
    #[serde(default)]
    pub nodes_matching_selector_number: i32,
    /// Nodes that should run it (module loader: nodes with an NMC entry; device plugin: the
    /// `desiredNumberScheduled` of its DaemonSets).
    #[serde(default)]
    pub desired_number: i32,
    /// Nodes where it is in place (module loader: NMC status config equals spec config;
    /// device plugin: the `numberAvailable` of its DaemonSets).
    #[serde(default)]
    pub available_number: i32,
}

impl Module {
    /// The checked namespace and name, from which every per-module label is built.
    ///
    /// Fails when metadata lacks the namespace or name, or they break the rules of
    /// [`ModuleKey::new`] (including the 63-character label name limit).
    pub fn key(&self) -> Result<ModuleKey, LabelError> {
        let namespace = self
            .metadata
            .namespace
            .as_deref()
            .ok_or(LabelError::MissingMetadata {
                kind: "Module",
                field: "namespace",
            })?;
        let name = self
            .metadata
            .name
            .as_deref()
            .ok_or(LabelError::MissingMetadata {
                kind: "Module",
                field: "name",
            })?;
        ModuleKey::new(namespace, name)
    }

    /// The tolerations that choose the Module's nodes and go into its NMC entries and worker
    /// pods: `spec.tolerations` followed by [`PRESSURE_TOLERATIONS`], as upstream's
    /// `append(mod.Spec.Tolerations, module.InternalTolerations...)`.
    pub fn loader_tolerations(&self) -> Vec<Toleration> {
        let mut tolerations = self.spec.tolerations.clone();
        tolerations.extend(pressure_tolerations());
        tolerations
    }

    /// The version of the module loader, `None` when unset (no ordered upgrade).
    pub fn version(&self) -> Option<&str> {
        self.spec
            .module_loader
            .as_ref()
            .map(|loader| loader.container.version.as_str())
            .filter(|version| !version.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use kube::CustomResourceExt;

    /// The example Module of the KMM reference, verbatim.
    pub(crate) const EXAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata: {name: my-kmod, namespace: kmm-demo}
spec:
  selector: {node-role.kubernetes.io/worker: ""}
  moduleLoader:
    container:
      version: "v1"
      modprobe: {moduleName: my_kmod, dirName: /opt, firmwarePath: /firmware, parameters: [param=1]}
      kernelMappings:
        - literal: 6.0.15-300.fc37.x86_64
          containerImage: registry.example/org/my-kmod:v1-6.0.15
        - regexp: '^.+$'
          containerImage: "registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}"
  devicePlugin:
    container: {image: registry.example/org/device-plugin:v1}
"#;

    #[test]
    fn reference_example_decodes_strictly() {
        let value: serde_json::Value = serde_saphyr::from_str(EXAMPLE).unwrap();
        assert_eq!(
            schema::unknown_fields(&Module::crd(), &value),
            Vec::<String>::new()
        );

        let module: Module = serde_json::from_value(value).unwrap();
        assert_eq!(module.key().unwrap().to_string(), "kmm-demo/my-kmod");
        assert_eq!(module.version(), Some("v1"));
        assert_eq!(
            module
                .spec
                .selector
                .get("node-role.kubernetes.io/worker")
                .map(String::as_str),
            Some("")
        );
        let loader = module.spec.module_loader.as_ref().unwrap();
        let container = &loader.container;
        assert_eq!(container.modprobe.module_name, "my_kmod");
        assert_eq!(container.modprobe.dir_name, "/opt");
        assert_eq!(container.modprobe.firmware_path, "/firmware");
        assert_eq!(container.modprobe.parameters, ["param=1"]);
        assert_eq!(container.kernel_mappings.len(), 2);
        assert_eq!(
            container.kernel_mappings[0].literal,
            "6.0.15-300.fc37.x86_64"
        );
        assert_eq!(container.kernel_mappings[1].regexp, "^.+$");
        assert_eq!(
            container.kernel_mappings[1].container_image,
            "registry.example/org/my-kmod:v1-${KERNEL_FULL_VERSION}"
        );
        assert!(!container.registry_tls.insecure);
        let plugin = module.spec.device_plugin.as_ref().unwrap();
        assert_eq!(
            plugin.container.image,
            "registry.example/org/device-plugin:v1"
        );
        assert_eq!(module.status, None);
    }

    #[test]
    fn misspelt_field_is_reported_with_its_path() {
        let yaml = EXAMPLE.replace("firmwarePath:", "firmwarepath:");
        let value: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(
            schema::unknown_fields(&Module::crd(), &value),
            ["spec.moduleLoader.container.modprobe.firmwarepath"]
        );
    }

    #[test]
    fn upstream_json_names_are_kept() {
        let mut module: Module = serde_saphyr::from_str(EXAMPLE).unwrap();
        let container = &mut module.spec.module_loader.as_mut().unwrap().container;
        container.registry_tls = TlsOptions {
            insecure: true,
            insecure_skip_tls_verify: true,
        };
        container.kernel_mappings[0].registry_tls = Some(TlsOptions::default());
        module.status = Some(ModuleStatus::default());
        let json = serde_json::to_value(&module).unwrap();
        let container = &json["spec"]["moduleLoader"]["container"];
        assert_eq!(container["registryTLS"]["insecureSkipTLSVerify"], true);
        assert_eq!(
            container["kernelMappings"][0]["registryTLS"],
            serde_json::json!({})
        );
        assert_eq!(json["apiVersion"], "kmm.sigs.x-k8s.io/v1beta1");
        assert_eq!(json["kind"], "Module");
        // Zero counts are written so a status merge patch resets them.
        assert_eq!(json["status"]["moduleLoader"]["availableNumber"], 0);
    }

    #[test]
    fn fields_of_kmm_v2_6_round_trip() {
        let yaml = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata: {name: my-kmod, namespace: kmm-demo}
spec:
  selector: {node-role.kubernetes.io/worker: ""}
  imageRebuildTriggerGeneration: 3
  moduleLoader:
    container:
      inTreeModuleToRemove: old_kmod
      modprobe: {moduleName: my_kmod, dirName: /opt}
      kernelMappings:
        - regexp: '^.+$'
          containerImage: registry.example/org/my-kmod:v1
          inTreeModuleToRemove: mapped_kmod
  devicePlugin:
    automountServiceAccountToken: false
    container: {image: registry.example/org/device-plugin:v1}
status:
  moduleLoader: {nodesMatchingSelectorNumber: 1, desiredNumber: 1, availableNumber: 1}
  devicePlugin: {nodesMatchingSelectorNumber: 1, desiredNumber: 1, availableNumber: 1}
  dra: {nodesMatchingSelectorNumber: 0, desiredNumber: 0, availableNumber: 0}
  imageRebuildTriggerGeneration: 2
"#;
        let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(
            schema::unknown_fields(&Module::crd(), &value),
            Vec::<String>::new()
        );
        let module: Module = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(module.spec.image_rebuild_trigger_generation, Some(3));
        let plugin = module.spec.device_plugin.as_ref().unwrap();
        assert_eq!(plugin.automount_service_account_token, Some(false));
        let container = &module.spec.module_loader.as_ref().unwrap().container;
        assert_eq!(container.in_tree_module_to_remove, "old_kmod");
        assert_eq!(
            container.kernel_mappings[0].in_tree_modules_for(container),
            ["mapped_kmod"]
        );
        let status = module.status.as_ref().unwrap();
        assert_eq!(status.image_rebuild_trigger_generation, Some(2));
        assert_eq!(serde_json::to_value(&module).unwrap(), value);
    }

    /// KMM main's docs Module "with DRA", its DRA part.
    const DRA_EXAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: Module
metadata: {name: my-kmod, namespace: kmm-demo}
spec:
  selector: {node-role.kubernetes.io/worker: ""}
  dra:
    driverName: dra.example.com
    container: {image: some.registry/org/my-dra-driver:latest}
    automountServiceAccountToken: false
    deviceClasses:
      - name: my-device-class
        selectors: [{cel: {expression: "device.driver == 'dra.example.com'"}}]
        config:
          - opaque:
              driver: dra.example.com
              parameters: {apiVersion: dra.example.com/v1, kind: MyDeviceConfig, spec: {mode: default}}
"#;

    #[test]
    fn dra_of_kmm_main_decodes_and_round_trips() {
        let value: serde_json::Value = serde_saphyr::from_str(DRA_EXAMPLE).unwrap();
        assert_eq!(
            schema::unknown_fields(&Module::crd(), &value),
            Vec::<String>::new()
        );
        let module: Module = serde_json::from_value(value.clone()).unwrap();
        let dra = module.spec.dra.as_ref().unwrap();
        assert_eq!(dra.driver_name, "dra.example.com");
        assert_eq!(dra.automount_service_account_token, Some(false));
        assert_eq!(dra.device_classes[0].name, "my-device-class");
        assert_eq!(serde_json::to_value(&module).unwrap(), value);
    }

    /// The schema of the Module CRD at `path` (property names; `[]` for a list's items).
    fn crd_schema(path: &[&str]) -> serde_json::Value {
        let crd = serde_json::to_value(Module::crd()).unwrap();
        let mut node = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for step in path {
            node = if *step == "[]" {
                &node["items"]
            } else {
                &node["properties"][step]
            };
        }
        node.clone()
    }

    #[test]
    fn the_crd_declares_mains_dra_rules() {
        assert_eq!(
            crd_schema(&["spec"])["x-kubernetes-validations"],
            serde_json::json!([{
                "rule": "!(has(self.dra) && has(self.devicePlugin))",
                "message": "spec.dra and spec.devicePlugin are mutually exclusive",
            }])
        );
        assert_eq!(
            crd_schema(&["spec", "dra"])["required"],
            serde_json::json!(["container", "driverName"])
        );
        let class = ["spec", "dra", "deviceClasses", "[]"];
        assert_eq!(
            crd_schema(&[&class[..], &["name"]].concat())["pattern"],
            r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
        );
        assert_eq!(
            crd_schema(&[&class[..], &["selectors"]].concat())["maxItems"],
            32
        );
        assert_eq!(
            crd_schema(&[&class[..], &["config"]].concat())["maxItems"],
            32
        );
        // Without it the API server prunes the driver's parameters to `{}`.
        let parameters =
            crd_schema(&[&class[..], &["config", "[]", "opaque", "parameters"]].concat());
        assert_eq!(parameters["type"], "object");
        assert_eq!(parameters["x-kubernetes-preserve-unknown-fields"], true);
    }

    #[test]
    fn in_tree_modules_follow_upstream_precedence() {
        let strings = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        type Names = &'static [&'static str];
        // (container list, container single, mapping list, mapping single, removed)
        let cases: [(Names, &str, Option<Names>, &str, Names); 9] = [
            (&[], "", None, "", &[]),
            (&["a", "b"], "", None, "", &["a", "b"]),
            (&["a"], "", Some(&["m"]), "", &["m"]),
            // Present but empty on the mapping: nothing removed on its kernels.
            (&["a"], "", Some(&[]), "", &[]),
            (&[], "", Some(&[]), "", &[]),
            (&[], "old", None, "", &["old"]),
            (&[], "old", None, "mapped", &["mapped"]),
            (&[], "", None, "mapped", &["mapped"]),
            // Mixed forms, which upstream's webhook refuses: the single one wins.
            (&["a"], "", Some(&["m"]), "mapped", &["mapped"]),
        ];
        for (container_list, container_single, mapping_list, mapping_single, want) in cases {
            let container = ModuleLoaderContainerSpec {
                in_tree_modules_to_remove: strings(container_list),
                in_tree_module_to_remove: container_single.to_string(),
                ..ModuleLoaderContainerSpec::default()
            };
            let mapping = KernelMapping {
                in_tree_modules_to_remove: mapping_list.map(strings),
                in_tree_module_to_remove: mapping_single.to_string(),
                ..KernelMapping::default()
            };
            assert_eq!(
                mapping.in_tree_modules_for(&container),
                strings(want),
                "{container_list:?} {container_single:?} {mapping_list:?} {mapping_single:?}"
            );
        }
    }

    #[test]
    fn a_mapping_tells_an_empty_in_tree_list_from_an_absent_one() {
        let cases = [
            (r#"{"containerImage": "i:1"}"#, None),
            (
                r#"{"containerImage": "i:1", "inTreeModulesToRemove": []}"#,
                Some(vec![]),
            ),
            (
                r#"{"containerImage": "i:1", "inTreeModulesToRemove": ["a"]}"#,
                Some(vec!["a".to_string()]),
            ),
        ];
        for (json, want) in cases {
            let mapping: KernelMapping = serde_json::from_str(json).unwrap();
            assert_eq!(mapping.in_tree_modules_to_remove, want, "{json}");
            // Written back as it was read, so an applied `[]` keeps overriding.
            assert_eq!(
                serde_json::to_value(&mapping).unwrap(),
                serde_json::from_str::<serde_json::Value>(json).unwrap()
            );
        }
    }

    #[test]
    fn dir_name_defaults_to_opt() {
        let spec: ModprobeSpec = serde_json::from_str(r#"{"moduleName": "kmod"}"#).unwrap();
        assert_eq!(spec.dir_name, "/opt");
        assert_eq!(ModprobeSpec::default().dir_name, "/opt");
    }

    #[test]
    fn key_needs_namespace_and_name() {
        let mut module: Module = serde_saphyr::from_str(EXAMPLE).unwrap();
        module.metadata.namespace = None;
        assert_eq!(
            module.key(),
            Err(LabelError::MissingMetadata {
                kind: "Module",
                field: "namespace"
            })
        );
    }

    #[test]
    fn empty_version_is_no_version() {
        let mut module: Module = serde_saphyr::from_str(EXAMPLE).unwrap();
        module
            .spec
            .module_loader
            .as_mut()
            .unwrap()
            .container
            .version = String::new();
        assert_eq!(module.version(), None);
    }
}
