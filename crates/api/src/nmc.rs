//! KMM `NodeModulesConfig` (`kmm.sigs.x-k8s.io/v1beta1`, cluster-scoped, short name `nmc`):
//! one per node, named after the node. `spec.modules` is what should be loaded there (written
//! by the Module controller), `status.modules` what the worker pods report as loaded.
//!
//! Fields follow upstream `api/v1beta1/nodemodulesconfig_types.go` of KMM v2.6.0 (see
//! `crates/api/tests/upstream_fields.rs`). Both lists are keyed by `[namespace, name]`
//! (`x-kubernetes-list-type: map`), so server-side apply merges entries per module instead of
//! replacing the whole list. Upstream declares them atomic; the keys are added here because
//! capstan's controllers each own their entries.

use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::labels::{LabelError, ModuleKey};
use super::module::ModprobeSpec;

/// Desired modules of one node.
// Repeated `printcolumn(type_ = ...)` arguments look like duplicated attributes to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kmm.sigs.x-k8s.io",
    version = "v1beta1",
    derive = "PartialEq",
    kind = "NodeModulesConfig",
    shortname = "nmc",
    status = "NodeModulesConfigStatus",
    doc = "NodeModulesConfig keeps spec and state of the KMM modules on a node.",
    printcolumn(
        name = "Modules",
        type_ = "string",
        json_path = ".spec.modules[*].name"
    ),
    printcolumn(
        name = "Loaded",
        type_ = "string",
        json_path = ".status.modules[*].name"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeModulesConfigSpec {
    /// The modules that should be loaded on the node, one entry per Module. Written even
    /// when empty, so a merge patch that drops the last entry clears the list.
    #[serde(default)]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["namespace", "name"]
    ))]
    pub modules: Vec<NodeModuleSpec>,
}

/// Observed modules of one node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeModulesConfigStatus {
    /// The modules loaded on the node, as the last successful worker pods left them.
    /// Written even when empty, as `spec.modules`.
    #[serde(default)]
    #[schemars(extend(
        "x-kubernetes-list-type" = "map",
        "x-kubernetes-list-map-keys" = ["namespace", "name"]
    ))]
    pub modules: Vec<NodeModuleStatus>,
}

/// One module that should be loaded on the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeModuleSpec {
    /// Name of the Module.
    pub name: String,

    /// Namespace of the Module (and of its worker pods).
    pub namespace: String,

    /// Service account of the worker pods.
    pub service_account_name: String,

    /// Secret used to pull the kmod image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub image_repo_secret: Option<LocalObjectReference>,

    /// Tolerations added to every worker pod of the module on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub tolerations: Vec<Toleration>,

    /// Version of the kernel module to load.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,

    /// What the worker pod loads.
    pub config: ModuleConfig,
}

/// One module loaded on the node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeModuleStatus {
    /// Name of the Module.
    pub name: String,

    /// Namespace of the Module.
    pub namespace: String,

    /// Service account the loading worker pod ran with (used again for unloading).
    pub service_account_name: String,

    /// Secret the loading worker pod pulled with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub image_repo_secret: Option<LocalObjectReference>,

    /// Tolerations the loading worker pod ran with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(transform = super::schema::drop_nested_descriptions)]
    pub tolerations: Vec<Toleration>,

    /// Version of the loaded kernel module.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,

    /// What was loaded.
    pub config: ModuleConfig,

    /// `status.nodeInfo.bootID` of the node when the module was loaded; a different boot ID
    /// on a Ready node means it rebooted and the module is gone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
}

/// Everything a worker pod needs to load or unload one module on one kernel. Also the
/// worker's config file (the `kmm.node.kubernetes.io/worker-config` annotation). Spec and
/// status entries are "equal" when their configs are equal; an unset `imagePullPolicy`
/// (what upstream writes for a Module without one) equals the `IfNotPresent` it stands
/// for, so that NMCs written by upstream KMM and by capstan compare equal.
#[derive(Clone, Debug, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleConfig {
    /// Kernel version the image was chosen for.
    pub kernel_version: String,

    /// Kmod image, templates already expanded.
    pub container_image: String,

    /// Pull the image over plain HTTP or without verifying TLS.
    pub insecure_pull: bool,

    /// Which module `modprobe` loads, and how.
    pub modprobe: ModprobeSpec,

    /// Pull policy of the kmod image.
    #[serde(default = "default_image_pull_policy")]
    pub image_pull_policy: String,

    /// In-tree modules removed before loading.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_tree_modules_to_remove: Vec<String>,

    /// One in-tree module removed before loading, when `inTreeModulesToRemove` is empty.
    /// Deprecated upstream, still served; capstan's Module controller writes the list only
    /// (see [`crate::module::KernelMapping::in_tree_modules_for`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub in_tree_module_to_remove: String,
}

impl PartialEq for ModuleConfig {
    fn eq(&self, other: &Self) -> bool {
        let ModuleConfig {
            kernel_version,
            container_image,
            insecure_pull,
            modprobe,
            image_pull_policy,
            in_tree_modules_to_remove,
            in_tree_module_to_remove,
        } = self;
        fn pull_policy(policy: &str) -> &str {
            if policy.is_empty() {
                DEFAULT_IMAGE_PULL_POLICY
            } else {
                policy
            }
        }
        *kernel_version == other.kernel_version
            && *container_image == other.container_image
            && *insecure_pull == other.insecure_pull
            && *modprobe == other.modprobe
            && pull_policy(image_pull_policy) == pull_policy(&other.image_pull_policy)
            && *in_tree_modules_to_remove == other.in_tree_modules_to_remove
            && *in_tree_module_to_remove == other.in_tree_module_to_remove
    }
}

impl Default for ModuleConfig {
    fn default() -> Self {
        ModuleConfig {
            kernel_version: String::new(),
            container_image: String::new(),
            insecure_pull: false,
            modprobe: ModprobeSpec::default(),
            image_pull_policy: default_image_pull_policy(),
            in_tree_modules_to_remove: Vec::new(),
            in_tree_module_to_remove: String::new(),
        }
    }
}

impl ModuleConfig {
    /// The in-tree modules a loading worker removes first, as upstream's worker reads
    /// them: `inTreeModulesToRemove`, else the deprecated single `inTreeModuleToRemove`.
    pub fn in_tree_modules(&self) -> Vec<String> {
        match (
            self.in_tree_modules_to_remove.is_empty(),
            self.in_tree_module_to_remove.is_empty(),
        ) {
            (true, false) => vec![self.in_tree_module_to_remove.clone()],
            _ => self.in_tree_modules_to_remove.clone(),
        }
    }
}

/// Upstream's default pull policy of kmod images in an NMC.
pub const DEFAULT_IMAGE_PULL_POLICY: &str = "IfNotPresent";

fn default_image_pull_policy() -> String {
    DEFAULT_IMAGE_PULL_POLICY.to_string()
}

impl NodeModuleSpec {
    /// The checked key of the Module this entry belongs to. Fails as [`ModuleKey::new`].
    pub fn key(&self) -> Result<ModuleKey, LabelError> {
        ModuleKey::new(self.namespace.as_str(), self.name.as_str())
    }

    /// True when this entry belongs to the Module `key`.
    pub fn is_for(&self, key: &ModuleKey) -> bool {
        self.namespace == key.namespace() && self.name == key.name()
    }
}

impl NodeModuleStatus {
    /// The checked key of the Module this entry belongs to. Fails as [`ModuleKey::new`].
    pub fn key(&self) -> Result<ModuleKey, LabelError> {
        ModuleKey::new(self.namespace.as_str(), self.name.as_str())
    }

    /// True when this entry belongs to the Module `key`.
    pub fn is_for(&self, key: &ModuleKey) -> bool {
        self.namespace == key.namespace() && self.name == key.name()
    }
}

impl NodeModulesConfig {
    /// The spec entry of Module `key`, if any.
    pub fn spec_module(&self, key: &ModuleKey) -> Option<&NodeModuleSpec> {
        self.spec.modules.iter().find(|entry| entry.is_for(key))
    }

    /// The status entry of Module `key`, if any.
    pub fn status_module(&self, key: &ModuleKey) -> Option<&NodeModuleStatus> {
        self.status
            .as_ref()
            .and_then(|status| status.modules.iter().find(|entry| entry.is_for(key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema;
    use kube::CustomResourceExt;

    const EXAMPLE: &str = r#"
apiVersion: kmm.sigs.x-k8s.io/v1beta1
kind: NodeModulesConfig
metadata: {name: node-1}
spec:
  modules:
    - name: my-kmod
      namespace: kmm-demo
      serviceAccountName: default
      version: v1
      config:
        kernelVersion: 6.0.15-300.fc37.x86_64
        containerImage: registry.example/org/my-kmod:v1-6.0.15
        insecurePull: false
        modprobe: {moduleName: my_kmod, dirName: /opt}
status:
  modules:
    - name: my-kmod
      namespace: kmm-demo
      serviceAccountName: default
      version: v1
      bootId: 5e3b4c1a-0000-4000-8000-000000000001
      config:
        kernelVersion: 6.0.15-300.fc37.x86_64
        containerImage: registry.example/org/my-kmod:v1-6.0.15
        insecurePull: false
        imagePullPolicy: IfNotPresent
        modprobe: {moduleName: my_kmod}
"#;

    #[test]
    fn example_decodes_strictly_and_configs_compare_equal() {
        let value: serde_json::Value = serde_saphyr::from_str(EXAMPLE).unwrap();
        assert_eq!(
            schema::unknown_fields(&NodeModulesConfig::crd(), &value),
            Vec::<String>::new()
        );
        let nmc: NodeModulesConfig = serde_json::from_value(value).unwrap();
        let key = ModuleKey::new("kmm-demo", "my-kmod").unwrap();
        let spec = nmc.spec_module(&key).unwrap();
        let status = nmc.status_module(&key).unwrap();
        assert_eq!(status.boot_id, "5e3b4c1a-0000-4000-8000-000000000001");
        // Defaults make an explicit and an omitted default compare equal.
        assert_eq!(spec.config, status.config);
        assert_eq!(spec.config.image_pull_policy, "IfNotPresent");
        assert_eq!(spec.key().unwrap(), key);
        let other = ModuleKey::new("kmm-demo", "other").unwrap();
        assert!(nmc.spec_module(&other).is_none());
    }

    #[test]
    fn empty_module_lists_are_written_out() {
        let mut nmc = NodeModulesConfig::new("node-1", NodeModulesConfigSpec::default());
        nmc.status = Some(NodeModulesConfigStatus::default());
        let json = serde_json::to_value(&nmc).unwrap();
        assert_eq!(json["spec"], serde_json::json!({"modules": []}));
        assert_eq!(json["status"], serde_json::json!({"modules": []}));
    }

    #[test]
    fn worker_config_round_trips_through_yaml() {
        let config = ModuleConfig {
            kernel_version: "6.0.15".to_string(),
            container_image: "registry.example/org/my-kmod:v1".to_string(),
            insecure_pull: true,
            modprobe: ModprobeSpec {
                module_name: "my_kmod".to_string(),
                firmware_path: "/firmware".to_string(),
                ..ModprobeSpec::default()
            },
            image_pull_policy: "Always".to_string(),
            in_tree_modules_to_remove: vec!["old_kmod".to_string()],
            in_tree_module_to_remove: "older_kmod".to_string(),
        };
        let yaml = serde_saphyr::to_string(&config).unwrap();
        let back: ModuleConfig = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(back, config);
        let json = serde_json::to_value(&config).unwrap();
        for key in [
            "kernelVersion",
            "containerImage",
            "insecurePull",
            "modprobe",
            "imagePullPolicy",
            "inTreeModulesToRemove",
            "inTreeModuleToRemove",
        ] {
            assert!(json.get(key).is_some(), "{key} missing in {json}");
        }
    }

    #[test]
    fn in_tree_modules_are_the_list_else_the_deprecated_single_one() {
        let strings = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // (inTreeModulesToRemove, inTreeModuleToRemove, removed)
        let cases: [(&[&str], &str, &[&str]); 4] = [
            (&[], "", &[]),
            (&["a", "b"], "", &["a", "b"]),
            (&[], "old", &["old"]),
            (&["a"], "old", &["a"]),
        ];
        for (list, single, want) in cases {
            let config = ModuleConfig {
                in_tree_modules_to_remove: strings(list),
                in_tree_module_to_remove: single.to_string(),
                ..ModuleConfig::default()
            };
            assert_eq!(
                config.in_tree_modules(),
                strings(want),
                "{list:?} {single:?}"
            );
        }
    }
}
