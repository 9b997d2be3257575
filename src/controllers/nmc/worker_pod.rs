//! The worker pod of one (node, module) pair, built from a [`WorkerPodPlan`].
//!
//! Upstream's shape: name `kmm-worker-<node>-<module>` in the Module's namespace, labels
//! `app.kubernetes.io/component=worker`, `kmm.node.kubernetes.io/module.name` and
//! `kmm.node.kubernetes.io/worker-action`, annotations `worker-config` (the ModuleConfig
//! as YAML), `worker-module-version` and `worker-hash`, owned by the node's NMC, bound to
//! the node (`nodeName`, no scheduler), `restartPolicy: Never`.
//!
//! The config reaches the worker through the downward API: a volume projects the
//! `worker-config` annotation to `/etc/kmm-worker/config.yaml`. The worker pulls the kmod
//! image itself (seed 001) into an emptyDir at [`worker::IMAGE_DIR`], with the Module's
//! `imageRepoSecret` mounted at [`worker::PULL_SECRET_DIR`]. It is privileged (it loads
//! kernel modules and writes the firmware search path) and has no API privileges at all:
//! `automountServiceAccountToken: false`, so no token is mounted.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    HostPathVolumeSource, KeyToPath, ObjectFieldSelector, Pod, PodSpec, SecretVolumeSource,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::WorkerPodPlan;
use capstan_api::canonical::sha256_hex;
use capstan_api::labels::{
    COMPONENT_LABEL, MODULE_NAME_LABEL, WORKER_ACTION_LABEL, WORKER_COMPONENT,
    WORKER_CONFIG_ANNOTATION, WORKER_CONFIG_PATH, WORKER_HASH_ANNOTATION,
    WORKER_MODULE_VERSION_ANNOTATION,
};
use capstan_api::nmc::{ModuleConfig, NodeModulesConfig};
use capstan_worker as worker;
use capstan_worker::run::DEFAULT_FIRMWARE_DIR;

/// The image worker pods run when none is configured: the `capstan-worker` target of the
/// Dockerfile, the `capstan` binary beside kmod's `modprobe`, running as root.
pub const DEFAULT_WORKER_IMAGE: &str = concat!(
    "ghcr.io/capstan-dev/capstan-worker:v",
    env!("CARGO_PKG_VERSION")
);

/// The worker's container name, as upstream names it.
pub const CONTAINER_NAME: &str = "worker";

/// How many distinct worker configs [`config_yaml`] remembers: a fleet's nodes share a
/// handful (one per module and kernel).
const REMEMBERED_CONFIGS: usize = 64;

/// The worker config as the pod's annotation carries it. Every node on a kernel gets the
/// same config for a module, so its YAML is written once, not once per pod.
fn config_yaml(config: &ModuleConfig) -> String {
    static WRITTEN: Mutex<VecDeque<(ModuleConfig, String)>> = Mutex::new(VecDeque::new());
    let lock = || WRITTEN.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, yaml)) = lock().iter().find(|(known, _)| known == config) {
        return yaml.clone();
    }
    let yaml = serde_saphyr::to_string(config).unwrap_or_default();
    let mut written = lock();
    if written.len() >= REMEMBERED_CONFIGS {
        written.pop_front();
    }
    written.push_back((config.clone(), yaml.clone()));
    yaml
}

/// The worker pod for `plan` on the NMC's node.
pub fn build(plan: &WorkerPodPlan, nmc: &NodeModulesConfig, image: &str) -> Pod {
    let node = nmc.metadata.name.clone().unwrap_or_default();
    let config = config_yaml(&plan.config);
    let action = plan.action.as_str();
    let subcommand = action.to_ascii_lowercase();
    let (config_dir, config_file) = WORKER_CONFIG_PATH
        .rsplit_once('/')
        .unwrap_or(("/etc/kmm-worker", "config.yaml"));
    let labels = BTreeMap::from([
        (COMPONENT_LABEL.to_string(), WORKER_COMPONENT.to_string()),
        (
            MODULE_NAME_LABEL.to_string(),
            plan.module.name().to_string(),
        ),
        (WORKER_ACTION_LABEL.to_string(), action.to_string()),
    ]);
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: config_file.into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.annotations['{WORKER_CONFIG_ANNOTATION}']"),
                        ..ObjectFieldSelector::default()
                    }),
                    ..DownwardAPIVolumeFile::default()
                }]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..Volume::default()
        },
        host_path("lib-modules", "/lib/modules"),
        host_path("usr-lib-modules", "/usr/lib/modules"),
        host_path("var-lib-firmware", DEFAULT_FIRMWARE_DIR),
        Volume {
            name: "image".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    let mut mounts = vec![
        mount("config", config_dir, true),
        mount("lib-modules", "/lib/modules", false),
        mount("usr-lib-modules", "/usr/lib/modules", false),
        mount("var-lib-firmware", DEFAULT_FIRMWARE_DIR, false),
        mount("image", worker::IMAGE_DIR, false),
    ];
    if let Some(secret) = &plan.image_repo_secret {
        volumes.push(Volume {
            name: "image-repo-secret".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                items: Some(vec![KeyToPath {
                    key: worker::PULL_SECRET_FILE.into(),
                    path: worker::PULL_SECRET_FILE.into(),
                    mode: None,
                }]),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(mount("image-repo-secret", worker::PULL_SECRET_DIR, true));
    }
    let spec = PodSpec {
        node_name: Some(node.clone()),
        restart_policy: Some("Never".into()),
        service_account_name: Some(plan.service_account_name.clone()).filter(|s| !s.is_empty()),
        automount_service_account_token: Some(false),
        priority_class_name: Some("system-node-critical".into()),
        tolerations: Some(plan.tolerations.clone()).filter(|t| !t.is_empty()),
        image_pull_secrets: plan.image_repo_secret.clone().map(|secret| vec![secret]),
        containers: vec![Container {
            name: CONTAINER_NAME.into(),
            image: Some(image.to_string()),
            args: Some(vec![
                "worker".into(),
                "kmod".into(),
                subcommand,
                WORKER_CONFIG_PATH.into(),
                "--firmware-path".into(),
                DEFAULT_FIRMWARE_DIR.into(),
            ]),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(mounts),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            ..Container::default()
        }],
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    let hash = sha256_hex(
        format!(
            "{config}\n{}",
            serde_json::to_string(&spec).unwrap_or_default()
        )
        .as_bytes(),
        8,
    );
    let mut annotations = BTreeMap::from([
        (WORKER_CONFIG_ANNOTATION.to_string(), config),
        (WORKER_HASH_ANNOTATION.to_string(), hash),
    ]);
    if !plan.version.is_empty() {
        annotations.insert(
            WORKER_MODULE_VERSION_ANNOTATION.to_string(),
            plan.version.clone(),
        );
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(plan.name.clone()),
            namespace: Some(plan.module.namespace().to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "kmm.sigs.x-k8s.io/v1beta1".into(),
                kind: "NodeModulesConfig".into(),
                name: node,
                uid: nmc.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

fn host_path(name: &str, path: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some("DirectoryOrCreate".into()),
        }),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only).filter(|r| *r),
        ..VolumeMount::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::nmc::WorkerPod;
    use capstan_api::labels::{ModuleKey, WorkerAction};
    use capstan_api::nmc::{ModuleConfig, NodeModulesConfigSpec};
    use k8s_openapi::api::core::v1::{LocalObjectReference, Toleration};

    fn plan(action: WorkerAction) -> WorkerPodPlan {
        let module = ModuleKey::new("kmm-demo", "my-kmod").expect("key");
        let mut config = ModuleConfig {
            kernel_version: "6.0.15".into(),
            container_image: "registry.example/my-kmod:v1".into(),
            ..ModuleConfig::default()
        };
        config.modprobe.module_name = "my_kmod".into();
        WorkerPodPlan {
            name: module.worker_pod_name("worker-1"),
            module,
            action,
            service_account_name: "kmod-sa".into(),
            image_repo_secret: Some(LocalObjectReference {
                name: "pull".into(),
            }),
            tolerations: vec![Toleration {
                key: Some("gpu".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }],
            version: "v1".into(),
            config,
        }
    }

    fn nmc() -> NodeModulesConfig {
        let mut nmc = NodeModulesConfig::new("worker-1", NodeModulesConfigSpec::default());
        nmc.metadata.uid = Some("nmc-uid".into());
        nmc
    }

    #[test]
    fn worker_pods_have_upstreams_shape_and_no_api_access() {
        for action in [WorkerAction::Load, WorkerAction::Unload] {
            let plan = plan(action);
            let pod = build(&plan, &nmc(), "capstan:test");
            assert_eq!(
                pod.metadata.name.as_deref(),
                Some("kmm-worker-worker-1-my-kmod")
            );
            assert_eq!(pod.metadata.namespace.as_deref(), Some("kmm-demo"));
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(spec.node_name.as_deref(), Some("worker-1"));
            assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
            assert_eq!(spec.automount_service_account_token, Some(false));
            let container = &spec.containers[0];
            assert_eq!(
                container
                    .security_context
                    .as_ref()
                    .and_then(|s| s.privileged),
                Some(true)
            );
            let args = container.args.clone().expect("args");
            assert_eq!(
                args[..4],
                [
                    "worker",
                    "kmod",
                    &action.as_str().to_ascii_lowercase(),
                    "/etc/kmm-worker/config.yaml"
                ]
            );
            let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
            assert_eq!(
                (owner.kind.as_str(), owner.uid.as_str()),
                ("NodeModulesConfig", "nmc-uid")
            );
            // The controller reads back exactly what it planned.
            let read = WorkerPod::from_pod(&pod).expect("worker pod");
            assert_eq!(read.action, action);
            assert_eq!(read.module, plan.module);
            assert_eq!(read.config, Ok(plan.config.clone()));
            assert_eq!(read.version, "v1");
            assert_eq!(read.service_account_name, "kmod-sa");
            assert_eq!(read.image_repo_secret, plan.image_repo_secret);
            assert_eq!(read.tolerations, plan.tolerations);
        }
    }

    #[test]
    fn the_config_reaches_the_worker_through_the_downward_api() {
        let pod = build(&plan(WorkerAction::Load), &nmc(), "capstan:test");
        let spec = pod.spec.expect("spec");
        let volumes = spec.volumes.expect("volumes");
        let config = volumes
            .iter()
            .find(|v| v.name == "config")
            .expect("config volume");
        let file = &config
            .downward_api
            .as_ref()
            .expect("downward api")
            .items
            .as_ref()
            .expect("items")[0];
        assert_eq!(file.path, "config.yaml");
        assert_eq!(
            file.field_ref.as_ref().map(|f| f.field_path.as_str()),
            Some("metadata.annotations['kmm.node.kubernetes.io/worker-config']")
        );
        let mounts = spec.containers[0].volume_mounts.clone().expect("mounts");
        let at = |name: &str| {
            mounts
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.mount_path.clone())
        };
        assert_eq!(at("config").as_deref(), Some("/etc/kmm-worker"));
        assert_eq!(at("image").as_deref(), Some(worker::IMAGE_DIR));
        assert_eq!(
            at("image-repo-secret").as_deref(),
            Some(worker::PULL_SECRET_DIR)
        );
        // Without a pull secret there is no secret volume.
        let mut plain = plan(WorkerAction::Load);
        plain.image_repo_secret = None;
        let pod = build(&plain, &nmc(), "capstan:test");
        let volumes = pod.spec.expect("spec").volumes.expect("volumes");
        assert!(volumes.iter().all(|v| v.secret.is_none()));
    }
}
