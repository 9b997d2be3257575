//! Reconcile scenarios of the NMC reconciler, as kube-rs's controller-rs `fixtures.rs` writes
//! them: each fills the caches' stores with a node, its NMC, its worker pods and Modules,
//! runs one reconcile against a [`fixtures::ApiServer`], and states every call the
//! reconcile must make (method, path with query, body) and the answer it gets. The worker
//! pod bodies are the worker-pod builder's, which `worker_pod`'s tests cover; the Event
//! bodies carry a wall-clock name and are the recorder's to check.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, NodeCondition, NodeStatus,
    NodeSystemInfo, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::fixtures::{self, Call, store};
use crate::controllers::nmc::WorkerPodPlan;
use capstan_api::clock::ManualClock;
use capstan_api::labels::WorkerAction;
use capstan_api::module::{ModprobeSpec, ModuleSpec};
use capstan_api::nmc::{ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfigSpec};

const NODE: &str = "node-1";
const KERNEL: &str = "6.0.15-300.fc37.x86_64";
const BOOT: &str = "boot-1";
const WORKER_IMAGE: &str = "registry.example/capstan:test";
const POD: &str = "kmm-worker-node-1-my-kmod";
const POD_PATH: &str = "/api/v1/namespaces/kmm-demo/pods/kmm-worker-node-1-my-kmod?";
const NMC_PATH: &str =
    "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/node-1?&fieldManager=capstan-nmc";
const NMC_STATUS_PATH: &str =
    "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/node-1/status?&fieldManager=capstan-nmc";

fn at(time: &str) -> Timestamp {
    time.parse().expect("a timestamp")
}

/// When the reconcile runs.
fn now() -> Timestamp {
    at("2026-03-01T09:01:00Z")
}

fn module() -> ModuleKey {
    ModuleKey::new("kmm-demo", "my-kmod").expect("a module key")
}

fn config() -> ModuleConfig {
    ModuleConfig {
        kernel_version: KERNEL.to_string(),
        container_image: "registry.example/my-kmod:v1".to_string(),
        modprobe: ModprobeSpec {
            module_name: "my_kmod".to_string(),
            ..ModprobeSpec::default()
        },
        image_pull_policy: "IfNotPresent".to_string(),
        ..ModuleConfig::default()
    }
}

/// The NMC entry asking for `kmm-demo/my-kmod` v1 on the node's kernel.
fn wanted() -> NodeModuleSpec {
    NodeModuleSpec {
        name: "my-kmod".to_string(),
        namespace: "kmm-demo".to_string(),
        service_account_name: "kmm-worker".to_string(),
        version: "v1".to_string(),
        config: config(),
        ..NodeModuleSpec::default()
    }
}

/// The status entry of `kmm-demo/my-kmod` v1 loaded in this boot.
fn loaded() -> NodeModuleStatus {
    NodeModuleStatus {
        name: "my-kmod".to_string(),
        namespace: "kmm-demo".to_string(),
        service_account_name: "kmm-worker".to_string(),
        version: "v1".to_string(),
        config: config(),
        boot_id: BOOT.to_string(),
        ..NodeModuleStatus::default()
    }
}

/// A Ready node running [`KERNEL`] in boot [`BOOT`], with `labels`.
fn node(labels: &[(String, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(key, value)| (key.clone(), value.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: "True".to_string(),
                last_transition_time: Some(Time(at("2026-03-01T08:00:00Z"))),
                ..NodeCondition::default()
            }]),
            node_info: Some(NodeSystemInfo {
                kernel_version: KERNEL.to_string(),
                boot_id: BOOT.to_string(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// The node with `kmm-demo/my-kmod` v1 ready on it.
fn labelled_node() -> Node {
    node(&[
        (module().ready_label(), ""),
        (module().version_ready_label(), "v1"),
    ])
}

/// The node's NMC, as the cache holds it.
fn nmc(
    spec: Vec<NodeModuleSpec>,
    status: Vec<NodeModuleStatus>,
    failures: Option<&str>,
) -> NodeModulesConfig {
    let mut nmc = NodeModulesConfig::new(NODE, NodeModulesConfigSpec { modules: spec });
    nmc.metadata.uid = Some("nmc-uid".to_string());
    nmc.metadata.resource_version = Some("10".to_string());
    nmc.metadata.annotations =
        failures.map(|text| BTreeMap::from([(FAILURES_ANNOTATION.to_string(), text.to_string())]));
    nmc.status = Some(capstan_api::nmc::NodeModulesConfigStatus { modules: status });
    nmc
}

/// The loader of [`wanted`].
fn loader_plan() -> WorkerPodPlan {
    WorkerPodPlan {
        name: POD.to_string(),
        module: module(),
        action: WorkerAction::Load,
        service_account_name: "kmm-worker".to_string(),
        image_repo_secret: None,
        tolerations: Vec::new(),
        version: "v1".to_string(),
        config: config(),
    }
}

/// The loader of [`wanted`] on the node as the cache shows it: UID `uid`, in `phase`, and
/// for a finished one, ended with `message`.
fn loader(uid: &str, phase: &str, message: Option<&str>) -> Pod {
    let owner = nmc(Vec::new(), Vec::new(), None);
    let mut pod = worker_pod::build(&loader_plan(), &owner, WORKER_IMAGE);
    pod.metadata.uid = Some(uid.to_string());
    let terminated = ContainerStateTerminated {
        exit_code: i32::from(phase == "Failed"),
        message: message.map(str::to_string),
        finished_at: Some(Time(at("2026-03-01T09:00:00Z"))),
        ..ContainerStateTerminated::default()
    };
    let finished = matches!(phase, "Succeeded" | "Failed");
    pod.status = Some(PodStatus {
        phase: Some(phase.to_string()),
        container_statuses: finished.then(|| {
            vec![ContainerStatus {
                name: worker_pod::CONTAINER_NAME.to_string(),
                state: Some(ContainerState {
                    terminated: Some(terminated),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]
        }),
        ..PodStatus::default()
    });
    pod
}

fn being_deleted(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(at("2026-03-01T09:00:30Z")));
    pod
}

/// `pod` as upstream KMM created it: with its finalizer.
fn from_upstream(mut pod: Pod) -> Pod {
    pod.metadata.finalizers = Some(vec![WORKER_POD_FINALIZER.to_string()]);
    pod
}

/// The removal of upstream KMM's finalizer from the worker pod.
fn release_worker() -> Call {
    let body = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [WORKER_POD_FINALIZER]}});
    Call::new(
        "PATCH",
        "/api/v1/namespaces/kmm-demo/pods/kmm-worker-node-1-my-kmod?&fieldManager=capstan-nmc",
        Some(body),
        json!({}),
    )
}

/// The Module `kmm-demo/my-kmod`.
fn module_object() -> Module {
    let mut object = Module::new("my-kmod", ModuleSpec::default());
    object.metadata.namespace = Some("kmm-demo".to_string());
    object.metadata.uid = Some("module-uid".to_string());
    object
}

/// What the caches hold when the reconcile runs.
struct Cluster {
    node: Node,
    nmc: NodeModulesConfig,
    nmc_deleted: bool,
    pods: Vec<Pod>,
    modules: Vec<Module>,
}

impl Cluster {
    fn new(node: Node, nmc: NodeModulesConfig) -> Cluster {
        Cluster {
            node,
            nmc,
            nmc_deleted: false,
            pods: Vec::new(),
            modules: Vec::new(),
        }
    }

    /// The NMC is deleted: gone from the cache, its pods not yet.
    fn nmc_deleted(mut self) -> Cluster {
        self.nmc_deleted = true;
        self
    }

    fn pod(mut self, pod: Pod) -> Cluster {
        self.pods.push(pod);
        self
    }

    fn module(mut self, module: Module) -> Cluster {
        self.modules.push(module);
        self
    }

    /// Reconciles the node's NMC once against an API server that expects exactly
    /// `calls`; returns what the reconcile asked of the controller and what it expects the
    /// worker-pod cache to show.
    async fn reconcile(self, calls: Vec<Call>) -> (Action, Arc<Expectations>) {
        let (client, server) = fixtures::client();
        let server = server.run(calls);
        let clock = Arc::new(ManualClock::new(now()));
        let ctx = Context::configured(
            client,
            clock,
            CancellationToken::new(),
            WORKER_IMAGE.to_string(),
        );
        let nmc = Arc::new(self.nmc.clone());
        let data = Arc::new(Data {
            ctx,
            nodes: store(vec![self.node]),
            modules: store(self.modules),
            nmcs: store(if self.nmc_deleted {
                Vec::new()
            } else {
                vec![self.nmc]
            }),
            worker_pods: store(self.pods),
            expectations: Arc::default(),
            own_writes: Arc::default(),
        });
        let expectations = data.expectations.clone();
        let result = reconcile(nmc, data).await;
        server
            .await
            .expect("the reconcile makes exactly the scenario's calls");
        (result.expect("the reconcile succeeds"), expectations)
    }
}

/// The deletion of the worker pod with UID `uid`, that one only.
fn delete_worker(uid: &str) -> Call {
    let body = json!({"preconditions": {"uid": uid}});
    Call::new("DELETE", POD_PATH, Some(body), json!({}))
}

/// An NMC as the API server answers a write to it.
fn nmc_answer(resource_version: &str) -> Value {
    json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig",
        "metadata": {"name": NODE, "uid": "nmc-uid", "resourceVersion": resource_version},
    })
}

/// Whether the node waits for the worker-pod cache to show what the reconcile wrote, while
/// the cache holds `cached` (or nothing) under the worker pod's name.
fn waits_for_the_cache(expectations: &Expectations, cached: Option<Pod>) -> bool {
    let cached = cached.map(Arc::new);
    expectations
        .wait(NODE, Instant::now(), |_| cached.clone())
        .is_some()
}

#[tokio::test]
async fn a_module_the_nmc_asks_for_gets_its_loader() {
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), None));
    let owner = nmc(vec![wanted()], Vec::new(), None);
    let loader = worker_pod::build(&loader_plan(), &owner, WORKER_IMAGE);
    let created = json!({"metadata": {"name": POD, "namespace": "kmm-demo", "uid": "pod-1"}});
    let (action, expectations) = cluster
        .reconcile(vec![Call::new(
            "POST",
            "/api/v1/namespaces/kmm-demo/pods?&fieldManager=capstan-nmc",
            Some(serde_json::to_value(&loader).expect("a pod")),
            created,
        )])
        .await;
    assert_eq!(action, Action::await_change());
    assert!(
        waits_for_the_cache(&expectations, None),
        "the node waits until the cache shows the new pod"
    );
}

#[tokio::test]
async fn a_succeeded_loader_is_recorded_then_deleted_and_the_node_labelled() {
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), None))
        .pod(loader("pod-1", "Succeeded", None))
        .module(module_object());
    let status = json!({"status": {"modules": [loaded()]}});
    let labels = json!({"metadata": {"labels": {
        module().ready_label(): "",
        module().version_ready_label(): "v1",
    }}});
    let (action, expectations) = cluster
        .reconcile(vec![
            Call::new("PATCH", NMC_STATUS_PATH, Some(status), nmc_answer("11")),
            delete_worker("pod-1"),
            Call::new(
                "PATCH",
                "/api/v1/nodes/node-1?&fieldManager=capstan-nmc",
                Some(labels),
                json!({}),
            ),
            // ModuleLoaded on the Node.
            fixtures::event("default"),
        ])
        .await;
    assert_eq!(action, Action::await_change());
    assert!(
        waits_for_the_cache(&expectations, Some(loader("pod-1", "Succeeded", None))),
        "the node waits while the cache shows the deleted pod as it was"
    );
}

#[tokio::test]
async fn a_failed_loader_is_counted_deleted_and_reported_on_the_node_and_module() {
    let message = "modprobe: FATAL: Module my_kmod not found";
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), None))
        .pod(loader("pod-1", "Failed", Some(message)))
        .module(module_object());
    let failures = format!(
        r#"{{"kmm-demo/my-kmod":{{"action":"Load","message":"{message}","attempts":1,"lastFailure":"2026-03-01T09:01:00Z","podUid":"pod-1"}}}}"#
    );
    let annotation = json!({"metadata": {"annotations": {FAILURES_ANNOTATION: failures}}});
    let (action, _) = cluster
        .reconcile(vec![
            Call::new("PATCH", NMC_PATH, Some(annotation), nmc_answer("11")),
            delete_worker("pod-1"),
            // WorkerFailed on the Node, then on the Module.
            fixtures::event("default"),
            fixtures::event("kmm-demo"),
        ])
        .await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_failed_pod_already_recorded_is_deleted_without_counting_it_again() {
    let failures = r#"{"kmm-demo/my-kmod":{"action":"Load","message":"boom","attempts":1,"lastFailure":"2026-03-01T09:00:58Z","podUid":"pod-1"}}"#;
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), Some(failures)))
        .pod(loader("pod-1", "Failed", Some("boom")))
        .module(module_object());
    let (action, _) = cluster.reconcile(vec![delete_worker("pod-1")]).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_module_whose_loader_failed_lately_waits_out_its_backoff_without_writing() {
    // One failure 4 s ago: 10 s of backoff, 6 s left.
    let failures = r#"{"kmm-demo/my-kmod":{"action":"Load","message":"boom","attempts":1,"lastFailure":"2026-03-01T09:00:56Z","podUid":"pod-1"}}"#;
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), Some(failures)));
    let (action, expectations) = cluster.reconcile(Vec::new()).await;
    assert_eq!(
        action,
        Action::requeue(Duration::from_secs(6) + Duration::from_millis(10))
    );
    assert!(!waits_for_the_cache(&expectations, None));
}

#[tokio::test]
async fn a_worker_pod_being_deleted_is_not_deleted_again() {
    let cluster = Cluster::new(labelled_node(), nmc(vec![wanted()], vec![loaded()], None))
        .pod(being_deleted(loader("pod-1", "Succeeded", None)));
    let (action, expectations) = cluster.reconcile(Vec::new()).await;
    assert_eq!(action, Action::await_change());
    assert!(!waits_for_the_cache(&expectations, None));
}

#[tokio::test]
async fn failures_of_a_module_that_left_the_node_are_forgotten() {
    let failures = r#"{"other-ns/gone":{"action":"Load","message":"boom","attempts":3,"lastFailure":"2026-03-01T08:00:00Z","podUid":"pod-7"}}"#;
    let cluster = Cluster::new(
        labelled_node(),
        nmc(vec![wanted()], vec![loaded()], Some(failures)),
    );
    let annotation = json!({"metadata": {"annotations": {FAILURES_ANNOTATION: null}}});
    let (action, _) = cluster
        .reconcile(vec![Call::new(
            "PATCH",
            NMC_PATH,
            Some(annotation),
            nmc_answer("11"),
        )])
        .await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_pod_upstream_kmm_created_is_freed_of_its_finalizer_then_deleted() {
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), None))
        .pod(from_upstream(loader("pod-1", "Succeeded", None)))
        .module(module_object());
    let status = json!({"status": {"modules": [loaded()]}});
    let labels = json!({"metadata": {"labels": {
        module().ready_label(): "",
        module().version_ready_label(): "v1",
    }}});
    let (action, _) = cluster
        .reconcile(vec![
            Call::new("PATCH", NMC_STATUS_PATH, Some(status), nmc_answer("11")),
            release_worker(),
            delete_worker("pod-1"),
            Call::new(
                "PATCH",
                "/api/v1/nodes/node-1?&fieldManager=capstan-nmc",
                Some(labels),
                json!({}),
            ),
            fixtures::event("default"),
        ])
        .await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_pod_upstream_kmm_created_already_being_deleted_is_freed_of_its_finalizer() {
    let cluster = Cluster::new(labelled_node(), nmc(vec![wanted()], vec![loaded()], None)).pod(
        being_deleted(from_upstream(loader("pod-1", "Succeeded", None))),
    );
    let (action, _) = cluster.reconcile(vec![release_worker()]).await;
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn pods_upstream_kmm_created_lose_their_finalizer_once_the_nmc_is_gone() {
    let mut elsewhere = from_upstream(loader("pod-2", "Running", None));
    elsewhere.metadata.name = Some("kmm-worker-node-2-my-kmod".to_string());
    if let Some(spec) = elsewhere.spec.as_mut() {
        spec.node_name = Some("node-2".to_string());
    }
    let mut capstans = loader("pod-3", "Running", None);
    capstans.metadata.name = Some("kmm-worker-node-1-other".to_string());
    let cluster = Cluster::new(node(&[]), nmc(vec![wanted()], Vec::new(), None))
        .nmc_deleted()
        .pod(being_deleted(from_upstream(loader(
            "pod-1", "Running", None,
        ))))
        .pod(elsewhere)
        .pod(capstans);
    // Only the pod on this node that carries the finalizer.
    let (action, _) = cluster.reconcile(vec![release_worker()]).await;
    assert_eq!(action, Action::await_change());
}

#[test]
fn label_patches_set_and_remove() {
    let changes = LabelChanges {
        set: [("a".to_string(), "1".to_string())].into(),
        remove: ["b".to_string()].into(),
    };
    assert_eq!(label_patch(&changes), json!({"a": "1", "b": null}));
}
