//! The worker pod of one (node, module) pair, built from a [`WorkerPodPlan`].
//!
//! Upstream's shape: name `kmm-worker-<node>-<module>` in the Module's namespace, labels
//! `app.kubernetes.io/name=kmm`, `app.kubernetes.io/component=worker`,
//! `app.kubernetes.io/part-of=kmm`, `kmm.node.kubernetes.io/module.name` and
//! `kmm.node.kubernetes.io/worker-action`, annotations `worker-config` (the ModuleConfig
//! as YAML), `worker-tolerations` (when there are any), `worker-module-version` and
//! `worker-hash`, owned by the node's NMC, bound to the node (`nodeName`, no scheduler),
//! upstream's resources (requests 500m CPU and 64Mi, limits 1 CPU and 128Mi), and the
//! node's `/lib/modules` mounted read-only. Unlike upstream's: `restartPolicy: Never`,
//! no finalizer and no init container.
//!
//! The config reaches the worker through the downward API: a volume projects the
//! `worker-config` annotation to `/etc/kmm-worker/config.yaml`. The worker pulls the kmod
//! image itself (seed 001) into an emptyDir at [`worker::IMAGE_DIR`], with the Module's
//! `imageRepoSecret` mounted at [`worker::PULL_SECRET_DIR`]. As upstream's, the worker
//! has `CAP_SYS_MODULE` as root in SELinux type `spc_t`, and is privileged only to load a
//! module with a `firmwarePath`, which writes the kernel's firmware search path in sysfs;
//! the firmware directory, [`DEFAULT_FIRMWARE_DIR`], is mounted only then. It has no API
//! privileges at all: `automountServiceAccountToken: false`, so no token is mounted.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::{
    Capabilities, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    HostPathVolumeSource, KeyToPath, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements,
    SELinuxOptions, SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::WorkerPodPlan;
use capstan_api::canonical::sha256_hex;
use capstan_api::labels::{
    APP_NAME_LABEL, COMPONENT_LABEL, KMM_APP, MODULE_NAME_LABEL, PART_OF_LABEL,
    WORKER_ACTION_LABEL, WORKER_COMPONENT, WORKER_CONFIG_ANNOTATION, WORKER_CONFIG_PATH,
    WORKER_HASH_ANNOTATION, WORKER_MODULE_VERSION_ANNOTATION, WORKER_TOLERATIONS_ANNOTATION,
    WorkerAction,
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

/// The SELinux type of an unprivileged worker: upstream's default (`worker.seLinuxType`),
/// which lets it load modules and read the node's module tree.
const SELINUX_TYPE: &str = "spc_t";

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
        (APP_NAME_LABEL.to_string(), KMM_APP.to_string()),
        (COMPONENT_LABEL.to_string(), WORKER_COMPONENT.to_string()),
        (PART_OF_LABEL.to_string(), KMM_APP.to_string()),
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
        // The worker only reads the node's module tree (to find in-tree modules, and
        // `modprobe` without `-d`); the kmod image's modules are in its own emptyDir.
        host_path("lib-modules", "/lib/modules", "Directory"),
        // Where usr-merged worker images look; created (empty) on a node without it.
        host_path("usr-lib-modules", "/usr/lib/modules", "DirectoryOrCreate"),
        Volume {
            name: "image".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    let mut mounts = vec![
        mount("config", config_dir, true),
        mount("lib-modules", "/lib/modules", true),
        mount("usr-lib-modules", "/usr/lib/modules", true),
        mount("image", worker::IMAGE_DIR, false),
    ];
    let mut args = vec![
        "worker".into(),
        "kmod".into(),
        subcommand,
        WORKER_CONFIG_PATH.into(),
    ];
    let firmware = !plan.config.modprobe.firmware_path.is_empty();
    if firmware {
        volumes.push(host_path(
            "var-lib-firmware",
            DEFAULT_FIRMWARE_DIR,
            "DirectoryOrCreate",
        ));
        mounts.push(mount("var-lib-firmware", DEFAULT_FIRMWARE_DIR, false));
        args.extend(["--firmware-path".into(), DEFAULT_FIRMWARE_DIR.into()]);
    }
    if let Some(secret) = &plan.image_repo_secret {
        // Whichever key the Secret's type has, in the one file the worker reads; a
        // Secret holding both gives the Docker config JSON, listed last.
        let item = |key: &str| KeyToPath {
            key: key.into(),
            path: worker::PULL_SECRET_FILE.into(),
            mode: None,
        };
        volumes.push(Volume {
            name: "image-repo-secret".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.name.clone()),
                items: Some(vec![
                    item(worker::LEGACY_PULL_SECRET_KEY),
                    item(worker::PULL_SECRET_FILE),
                ]),
                optional: Some(true),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(mount("image-repo-secret", worker::PULL_SECRET_DIR, true));
    }
    // Upstream's rule: writing the firmware search path in sysfs takes a privileged
    // container; loading and unloading modules takes CAP_SYS_MODULE only.
    let security_context = if firmware && plan.action == WorkerAction::Load {
        SecurityContext {
            privileged: Some(true),
            ..SecurityContext::default()
        }
    } else {
        SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["SYS_MODULE".into()]),
                drop: None,
            }),
            run_as_user: Some(0),
            se_linux_options: Some(SELinuxOptions {
                type_: Some(SELINUX_TYPE.into()),
                ..SELinuxOptions::default()
            }),
            ..SecurityContext::default()
        }
    };
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
            args: Some(args),
            security_context: Some(security_context),
            resources: Some(resources()),
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
    // The version a loader brings goes into the status it leaves; an unloader, as
    // upstream's, carries none.
    if plan.action == WorkerAction::Load && !plan.version.is_empty() {
        annotations.insert(
            WORKER_MODULE_VERSION_ANNOTATION.to_string(),
            plan.version.clone(),
        );
    }
    // Upstream KMM reads a finished loader's tolerations from here (a rollback, or both
    // running during a migration), and would record none without it.
    if !plan.tolerations.is_empty() {
        annotations.insert(
            WORKER_TOLERATIONS_ANNOTATION.to_string(),
            serde_saphyr::to_string(&plan.tolerations).unwrap_or_default(),
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

/// Upstream's: requests of 500m CPU and 64Mi, limits of 1 CPU and 128Mi, so the pod is
/// Burstable rather than evicted first, and admitted where a ResourceQuota requires them.
fn resources() -> ResourceRequirements {
    let quantities = |cpu: &str, memory: &str| {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])
    };
    ResourceRequirements {
        requests: Some(quantities("500m", "64Mi")),
        limits: Some(quantities("1", "128Mi")),
        ..ResourceRequirements::default()
    }
}

fn host_path(name: &str, path: &str, type_: &str) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: Some(type_.into()),
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
            let args = container.args.clone().expect("args");
            assert_eq!(
                args,
                [
                    "worker",
                    "kmod",
                    &action.as_str().to_ascii_lowercase(),
                    "/etc/kmm-worker/config.yaml"
                ]
            );
            let labels = pod.metadata.labels.clone().expect("labels");
            let want: BTreeMap<String, String> = [
                ("app.kubernetes.io/name", "kmm"),
                ("app.kubernetes.io/component", "worker"),
                ("app.kubernetes.io/part-of", "kmm"),
                ("kmm.node.kubernetes.io/module.name", "my-kmod"),
                ("kmm.node.kubernetes.io/worker-action", action.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            assert_eq!(labels, want);
            assert_eq!(pod.metadata.finalizers, None);
            let resources = container.resources.clone().expect("resources");
            let quantity = |list: &Option<BTreeMap<String, Quantity>>, name: &str| {
                list.as_ref().and_then(|l| l.get(name)).map(|q| q.0.clone())
            };
            assert_eq!(
                [
                    quantity(&resources.requests, "cpu"),
                    quantity(&resources.requests, "memory"),
                    quantity(&resources.limits, "cpu"),
                    quantity(&resources.limits, "memory"),
                ],
                [
                    Some("500m".to_string()),
                    Some("64Mi".to_string()),
                    Some("1".to_string()),
                    Some("128Mi".to_string()),
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
            // Only a loader brings a version (into the status it leaves).
            let version = if action == WorkerAction::Load {
                "v1"
            } else {
                ""
            };
            assert_eq!(read.version, version);
            assert_eq!(read.service_account_name, "kmod-sa");
            assert_eq!(read.image_repo_secret, plan.image_repo_secret);
            assert_eq!(read.tolerations, plan.tolerations);
        }
    }

    /// `plan` with a `firmwarePath`.
    fn with_firmware(mut plan: WorkerPodPlan) -> WorkerPodPlan {
        plan.config.modprobe.firmware_path = "/firmware".into();
        plan
    }

    #[test]
    fn only_a_loader_with_firmware_is_privileged_as_upstream() {
        // (case, plan, privileged)
        let cases = [
            ("loader", plan(WorkerAction::Load), false),
            (
                "loader with firmware",
                with_firmware(plan(WorkerAction::Load)),
                true,
            ),
            ("unloader", plan(WorkerAction::Unload), false),
            (
                "unloader with firmware",
                with_firmware(plan(WorkerAction::Unload)),
                false,
            ),
        ];
        for (case, plan, privileged) in cases {
            let pod = build(&plan, &nmc(), "capstan:test");
            let context = pod.spec.expect("spec").containers[0]
                .security_context
                .clone()
                .expect("security context");
            let want = if privileged {
                SecurityContext {
                    privileged: Some(true),
                    ..SecurityContext::default()
                }
            } else {
                SecurityContext {
                    capabilities: Some(Capabilities {
                        add: Some(vec!["SYS_MODULE".to_string()]),
                        drop: None,
                    }),
                    run_as_user: Some(0),
                    se_linux_options: Some(SELinuxOptions {
                        type_: Some("spc_t".to_string()),
                        ..SELinuxOptions::default()
                    }),
                    ..SecurityContext::default()
                }
            };
            assert_eq!(context, want, "{case}");
        }
    }

    #[test]
    fn the_node_is_mounted_as_little_as_the_module_needs() {
        // (case, plan, firmware directory mounted and passed)
        let cases = [
            ("loader", plan(WorkerAction::Load), false),
            (
                "loader with firmware",
                with_firmware(plan(WorkerAction::Load)),
                true,
            ),
            ("unloader", plan(WorkerAction::Unload), false),
            (
                "unloader with firmware",
                with_firmware(plan(WorkerAction::Unload)),
                true,
            ),
        ];
        for (case, plan, firmware) in cases {
            let spec = build(&plan, &nmc(), "capstan:test").spec.expect("spec");
            let volumes = spec.volumes.expect("volumes");
            let host_paths: Vec<(String, String, bool)> = volumes
                .iter()
                .filter_map(|v| {
                    let host = v.host_path.as_ref()?;
                    let mount = spec.containers[0]
                        .volume_mounts
                        .iter()
                        .flatten()
                        .find(|m| m.name == v.name)?;
                    Some((
                        host.path.clone(),
                        host.type_.clone().unwrap_or_default(),
                        mount.read_only == Some(true),
                    ))
                })
                .collect();
            let mut want = vec![
                ("/lib/modules".to_string(), "Directory".to_string(), true),
                (
                    "/usr/lib/modules".to_string(),
                    "DirectoryOrCreate".to_string(),
                    true,
                ),
            ];
            if firmware {
                want.push((
                    "/var/lib/firmware".to_string(),
                    "DirectoryOrCreate".to_string(),
                    false,
                ));
            }
            assert_eq!(host_paths, want, "{case}");
            let args = spec.containers[0].args.clone().expect("args");
            let flag = args
                .iter()
                .position(|a| a == "--firmware-path")
                .map(|at| args[at + 1].as_str());
            assert_eq!(flag, firmware.then_some("/var/lib/firmware"), "{case}");
        }
    }

    #[test]
    fn tolerations_are_annotated_for_upstream_kmm_when_there_are_any() {
        let pod = build(&plan(WorkerAction::Load), &nmc(), "capstan:test");
        let annotations = pod.metadata.annotations.expect("annotations");
        let yaml = annotations
            .get("kmm.node.kubernetes.io/worker-tolerations")
            .expect("tolerations annotation");
        let read: Vec<Toleration> = serde_saphyr::from_str(yaml).expect("a YAML list");
        assert_eq!(read, plan(WorkerAction::Load).tolerations);

        let mut untolerant = plan(WorkerAction::Load);
        untolerant.tolerations.clear();
        let pod = build(&untolerant, &nmc(), "capstan:test");
        let annotations = pod.metadata.annotations.expect("annotations");
        assert!(!annotations.contains_key("kmm.node.kubernetes.io/worker-tolerations"));
    }

    #[test]
    fn either_kind_of_docker_secret_reaches_the_worker() {
        let pod = build(&plan(WorkerAction::Load), &nmc(), "capstan:test");
        let volumes = pod.spec.expect("spec").volumes.expect("volumes");
        let secret = volumes
            .iter()
            .find_map(|v| v.secret.clone())
            .expect("secret volume");
        let items: Vec<(String, String)> = secret
            .items
            .expect("items")
            .into_iter()
            .map(|item| (item.key, item.path))
            .collect();
        // kubernetes.io/dockercfg, then kubernetes.io/dockerconfigjson, in the one file.
        assert_eq!(
            items,
            [
                (".dockercfg".to_string(), ".dockerconfigjson".to_string()),
                (
                    ".dockerconfigjson".to_string(),
                    ".dockerconfigjson".to_string()
                ),
            ]
        );
        // A Secret of the other type lacks the key: optional, not an error.
        assert_eq!(secret.optional, Some(true));
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
