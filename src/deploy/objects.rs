//! The objects of an install, built once with k8s-openapi's types and filled through a
//! [`Fill`]: the kustomize base and the Helm chart are both written from them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapKeySelector, Container, ContainerPort,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, Namespace, ObjectFieldSelector,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort,
    ServiceSpec, Volume, VolumeMount, WeightedPodAffinityTerm,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;
use serde_json::{Value, json};

use super::values::{Condition, Fill};
use crate::controllers::Selection;
use crate::rbac;

/// The label every object carries and the Service and Deployment select on.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The port of /metrics, /healthz, /readyz and /hooks/github.
pub const PORT: i32 = 9477;
/// The port's name, as a ServiceMonitor selects it.
pub const PORT_NAME: &str = "http-metrics";
/// Where capstan keeps its clone of the repository.
pub const STATE_DIR: &str = "/var/lib/capstan";
/// Where the Git credentials Secret is mounted.
pub const GIT_DIR: &str = "/etc/capstan/git";
/// Where the webhook Secret is mounted.
pub const WEBHOOK_DIR: &str = "/etc/capstan/webhook";
/// The non-root user the controller runs as (distroless's `nonroot`).
const USER: i64 = 65532;

/// An object of the install.
pub struct Object {
    /// Its file, in deploy/base/ and charts/capstan/templates/.
    pub file: &'static str,
    pub value: Value,
    /// Only when this holds: a template's `if` in the chart, a component in kustomize.
    pub only_if: Option<Condition>,
    /// Whether the chart has it (the chart leaves the namespace to `helm install
    /// --create-namespace`).
    pub in_chart: bool,
}

/// What the user edits, one ConfigMap key each, handed to `capstan sync` through an
/// environment variable: (key, variable, flag, setting).
pub const CONFIG: &[(&str, &str, &str, &str)] = &[
    (
        "repository",
        "CAPSTAN_REPOSITORY",
        "--repo",
        "repository.url",
    ),
    ("branch", "CAPSTAN_BRANCH", "--branch", "repository.branch"),
    ("path", "CAPSTAN_PATH", "--path", "repository.path"),
    ("interval", "CAPSTAN_INTERVAL", "--interval", "interval"),
    (
        "controllers",
        "CAPSTAN_CONTROLLERS",
        "--controllers",
        "controllers",
    ),
    (
        "worker-image",
        "CAPSTAN_WORKER_IMAGE",
        "--worker-image",
        "workerImage",
    ),
];

/// The arguments only some settings add, each with its condition.
pub fn optional_args() -> Vec<(Condition, String)> {
    let leader = Condition::Enabled("leaderElection.enabled");
    vec![
        (leader, "--leader-elect".to_string()),
        (
            leader,
            "--lease-duration=@@leaderElection.leaseDuration@@".to_string(),
        ),
        (
            leader,
            "--lease-grace=@@leaderElection.leaseGrace@@".to_string(),
        ),
        (
            Condition::Is("credentials.type", "token"),
            format!("--token-file={GIT_DIR}/token"),
        ),
        (
            Condition::Is("credentials.type", "ssh"),
            format!("--ssh-key={GIT_DIR}/identity"),
        ),
        (
            Condition::Is("credentials.type", "ssh"),
            format!("--known-hosts={GIT_DIR}/known_hosts"),
        ),
        (
            Condition::Enabled("webhook.enabled"),
            format!("--webhook-secret-file={WEBHOOK_DIR}/secret"),
        ),
    ]
}

/// Every object, filled by `fill`, in the order kustomization.yaml lists them.
pub fn objects(fill: &Fill) -> Vec<Object> {
    let namespace = fill.namespace();
    let object = |file, value, in_chart| Object {
        file,
        value,
        only_if: None,
        in_chart,
    };
    let mut repository_role = to_value(&ClusterRole {
        metadata: meta(rbac::REPOSITORY_ROLE, None),
        ..ClusterRole::default()
    });
    repository_role["rules"] = fill.block("rbac.repositoryRules");
    let mut cluster_role = rbac::cluster_role(&Selection::all());
    cluster_role.metadata.labels = Some(labels());
    vec![
        object("namespace.yaml", namespace_object(), false),
        object("serviceaccount.yaml", service_account(&namespace), true),
        object("clusterrole.yaml", to_value(&cluster_role), true),
        object(
            "clusterrolebinding.yaml",
            cluster_binding(rbac::NAME, &namespace),
            true,
        ),
        object("clusterrole-repository.yaml", repository_role, true),
        object(
            "clusterrolebinding-repository.yaml",
            cluster_binding(rbac::REPOSITORY_ROLE, &namespace),
            true,
        ),
        object("role-leader-election.yaml", election_role(&namespace), true),
        object(
            "rolebinding-leader-election.yaml",
            election_binding(&namespace),
            true,
        ),
        object("config.yaml", config(fill, &namespace), true),
        object("deployment.yaml", deployment(fill, &namespace), true),
        object("service.yaml", service(&namespace), true),
        Object {
            file: "servicemonitor.yaml",
            value: service_monitor(fill, &namespace),
            only_if: Some(Condition::Enabled("serviceMonitor.enabled")),
            in_chart: true,
        },
    ]
}

fn to_value(object: &impl Serialize) -> Value {
    serde_json::to_value(object).expect("k8s-openapi objects serialize")
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([(NAME_LABEL.to_string(), rbac::NAME.to_string())])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

fn namespace_object() -> Value {
    to_value(&Namespace {
        metadata: meta(super::values::NAMESPACE, None),
        ..Namespace::default()
    })
}

fn service_account(namespace: &str) -> Value {
    to_value(&ServiceAccount {
        metadata: meta(rbac::NAME, Some(namespace)),
        ..ServiceAccount::default()
    })
}

fn subject(namespace: &str) -> Vec<Subject> {
    vec![Subject {
        kind: "ServiceAccount".into(),
        name: rbac::NAME.into(),
        namespace: Some(namespace.to_string()),
        ..Subject::default()
    }]
}

fn cluster_binding(role: &str, namespace: &str) -> Value {
    to_value(&ClusterRoleBinding {
        metadata: meta(role, None),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(subject(namespace)),
    })
}

fn election_role(namespace: &str) -> Value {
    let mut role = rbac::election_role(namespace);
    role.metadata.labels = Some(labels());
    to_value(&role)
}

fn election_binding(namespace: &str) -> Value {
    to_value(&RoleBinding {
        metadata: meta(rbac::ELECTION_ROLE, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: rbac::ELECTION_ROLE.into(),
        },
        subjects: Some(subject(namespace)),
    })
}

fn config(fill: &Fill, namespace: &str) -> Value {
    to_value(&ConfigMap {
        metadata: meta(rbac::NAME, Some(namespace)),
        data: Some(
            CONFIG
                .iter()
                .map(|(key, _, _, setting)| (key.to_string(), fill.text(setting)))
                .collect(),
        ),
        ..ConfigMap::default()
    })
}

fn env_from_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// The arguments of `capstan sync`: the ConfigMap's settings through their variables,
/// then the fixed ones, then those some settings add.
fn args(fill: &Fill) -> Vec<String> {
    let mut args = vec!["sync".to_string()];
    args.extend(
        CONFIG
            .iter()
            .map(|(_, variable, flag, _)| format!("{flag}=$({variable})")),
    );
    args.push(format!("--listen=0.0.0.0:{PORT}"));
    args.push(format!("--state-dir={STATE_DIR}"));
    for (condition, arg) in optional_args() {
        let arg = fill_markers(fill, &arg);
        args.extend(fill.item_if(condition, arg));
    }
    args
}

/// `text` with each `@@key@@` replaced by its value; with markers, left as it is.
fn fill_markers(fill: &Fill, text: &str) -> String {
    match fill {
        Fill::Markers => text.to_string(),
        Fill::Values(_) => {
            let mut out = text.to_string();
            while let Some(start) = out.find("@@") {
                let Some(len) = out[start + 2..].find("@@") else {
                    break;
                };
                let key = out[start + 2..start + 2 + len].to_string();
                out.replace_range(start..start + 4 + len, &fill.text(&key));
            }
            out
        }
    }
}

fn secret_volume(name: &str, secret: String) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret),
            // Absent until the user creates it: the pod starts without it.
            optional: Some(true),
            // Read through the pod's fsGroup, by the non-root user.
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn probe(path: &str, period: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(PORT_NAME.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        ..Probe::default()
    }
}

fn deployment(fill: &Fill, namespace: &str) -> Value {
    let mut env = vec![
        env_from_field("POD_NAME", "metadata.name"),
        env_from_field("POD_NAMESPACE", "metadata.namespace"),
    ];
    env.extend(CONFIG.iter().map(|(key, variable, _, _)| EnvVar {
        name: variable.to_string(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: rbac::NAME.into(),
                key: key.to_string(),
                ..ConfigMapKeySelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }));
    let container = Container {
        name: "capstan".into(),
        image: Some(format!(
            "{}:{}",
            fill.text("image.repository"),
            fill.text("image.tag")
        )),
        image_pull_policy: Some(fill.text("image.pullPolicy")),
        args: Some(args(fill)),
        env: Some(env),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
            container_port: PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(probe("/healthz", 10)),
        readiness_probe: Some(probe("/readyz", 5)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("state", STATE_DIR, false),
            mount("tmp", "/tmp", false),
            mount("git-credentials", GIT_DIR, true),
            mount("webhook-secret", WEBHOOK_DIR, true),
        ]),
        ..Container::default()
    };
    let spreading = PodAntiAffinity {
        preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(selector()),
                topology_key: "kubernetes.io/hostname".into(),
                ..PodAffinityTerm::default()
            },
        }]),
        ..PodAntiAffinity::default()
    };
    let deployment = Deployment {
        metadata: meta(rbac::NAME, Some(namespace)),
        spec: Some(DeploymentSpec {
            replicas: Some(0),
            selector: selector(),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(rbac::NAME.into()),
                    containers: vec![container],
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(USER),
                        run_as_group: Some(USER),
                        fs_group: Some(USER),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    // Two replicas on two nodes: a drain of one node leaves a standby.
                    affinity: Some(Affinity {
                        pod_anti_affinity: Some(spreading),
                        ..Affinity::default()
                    }),
                    volumes: Some(vec![
                        empty_dir("state"),
                        empty_dir("tmp"),
                        secret_volume("git-credentials", fill.text("credentials.secretName")),
                        secret_volume("webhook-secret", fill.text("webhook.secretName")),
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    let mut value = to_value(&deployment);
    value["spec"]["replicas"] = fill.value("replicas");
    value["spec"]["template"]["spec"]["containers"][0]["resources"] = fill.block("resources");
    value
}

fn selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels()),
        ..LabelSelector::default()
    }
}

fn service(namespace: &str) -> Value {
    to_value(&Service {
        metadata: meta(rbac::NAME, Some(namespace)),
        spec: Some(ServiceSpec {
            selector: Some(labels()),
            ports: Some(vec![ServicePort {
                name: Some(PORT_NAME.into()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    })
}

/// The Prometheus Operator's ServiceMonitor (not a k8s-openapi type).
fn service_monitor(fill: &Fill, namespace: &str) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": rbac::NAME, "namespace": namespace, "labels": labels()},
        "spec": {
            "selector": {"matchLabels": labels()},
            "endpoints": [{
                "port": PORT_NAME,
                "path": "/metrics",
                "interval": fill.value("serviceMonitor.interval"),
            }],
        },
    })
}
