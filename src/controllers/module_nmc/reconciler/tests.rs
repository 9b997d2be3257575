//! One reconcile of a node and of a Module, call by call: the exact requests the Module ->
//! NMC reconcilers send the API server, in order, with their bodies, and when they look
//! again. The caches are filled as the watches would fill them; the API server is the
//! scenario ([`fixtures`]).
//!
//! The node scenarios show worker-1's NMC created when a Module first targets the node,
//! emptied (and kept) when none does any more, and left alone when it already lists what
//! the Modules want. The Module scenarios show a new Module's namespace labelled before its
//! finalizer goes on, a deleting Module kept until it is unloaded everywhere and then
//! released, and a write made on a Module changed since it was read looked at again.

use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::controllers::fixtures::{self, Call, store};
use capstan_api::clock::ManualClock;
use capstan_api::labels::MODULE_FINALIZER;
use capstan_api::module::ModprobeSpec;
use capstan_api::nmc::{ModuleConfig, NodeModuleSpec, NodeModuleStatus, NodeModulesConfigSpec};

const NOW: &str = "2026-03-01T09:00:00Z";
const KERNEL: &str = "6.0.15-300.fc37.x86_64";

const NMCS: &str =
    "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs?&fieldManager=capstan-module-nmc";
const NMC: &str =
    "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/worker-1?&fieldManager=capstan-module-nmc";
const NAMESPACE: &str = "/api/v1/namespaces/kmm-demo?&fieldManager=capstan-module-nmc";
const MODULE: &str = "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/kmm-demo/modules/my-kmod?&fieldManager=capstan-module-nmc";
const MODULE_STATUS: &str = "/apis/kmm.sigs.x-k8s.io/v1beta1/namespaces/kmm-demo/modules/my-kmod/status?&fieldManager=capstan-module-nmc";

fn key() -> ModuleKey {
    ModuleKey::new("kmm-demo", "my-kmod").expect("a module key")
}

/// `kmm-demo/my-kmod` as the cache holds it: loading `my_kmod` on the `role=gpu` nodes, with
/// `metadata` merged in.
fn my_kmod(metadata: Value) -> Value {
    let mut module = json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": "my-kmod", "namespace": "kmm-demo", "uid": "uid-my-kmod",
                     "resourceVersion": "5"},
        "spec": {
            "selector": {"role": "gpu"},
            "moduleLoader": {
                "serviceAccountName": "kmm-worker",
                "container": {
                    "modprobe": {"moduleName": "my_kmod"},
                    "kernelMappings": [{"literal": KERNEL,
                                        "containerImage": "registry.example/my-kmod:v1"}],
                },
            },
        },
    });
    if let (Some(into), Value::Object(extra)) = (module["metadata"].as_object_mut(), metadata) {
        into.extend(extra);
    }
    module
}

/// [`my_kmod`] with our finalizer on.
fn finalized() -> Value {
    my_kmod(json!({"finalizers": [MODULE_FINALIZER]}))
}

/// [`my_kmod`] with our finalizer on, being deleted.
fn deleting() -> Value {
    my_kmod(json!({"finalizers": [MODULE_FINALIZER],
                   "deletionTimestamp": "2026-03-01T08:59:00Z"}))
}

fn parse<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

/// worker-1, running [`KERNEL`], labelled `role=<role>`.
fn worker_1(role: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("worker-1".into()),
            uid: Some("uid-worker-1".into()),
            labels: Some(BTreeMap::from([("role".to_string(), role.to_string())])),
            ..ObjectMeta::default()
        },
        status: Some(NodeStatus {
            node_info: Some(NodeSystemInfo {
                kernel_version: KERNEL.into(),
                boot_id: "boot-1".into(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// worker-1's entry for `kmm-demo/my-kmod`.
fn entry() -> NodeModuleSpec {
    let module: Module = parse(my_kmod(json!({})));
    NodeModuleSpec {
        name: "my-kmod".into(),
        namespace: "kmm-demo".into(),
        service_account_name: "kmm-worker".into(),
        image_repo_secret: None,
        // The Module's own and the kubelet's pressure taints, which every loader tolerates.
        tolerations: module.loader_tolerations(),
        version: String::new(),
        config: ModuleConfig {
            kernel_version: KERNEL.into(),
            container_image: "registry.example/my-kmod:v1".into(),
            modprobe: ModprobeSpec {
                module_name: "my_kmod".into(),
                ..ModprobeSpec::default()
            },
            // The Module names none: upstream reads none as `IfNotPresent`.
            image_pull_policy: String::new(),
            ..ModuleConfig::default()
        },
    }
}

/// worker-1's NMC as the cache holds it: owned by worker-1, listing `spec` with the labels
/// the Module -> NMC controller gave it, `status` loaded.
fn nmc(spec: Vec<NodeModuleSpec>, status: Vec<NodeModuleStatus>) -> NodeModulesConfig {
    let mut nmc = NodeModulesConfig::new("worker-1", NodeModulesConfigSpec { modules: spec });
    let labels = if nmc.spec.modules.is_empty() {
        BTreeMap::new()
    } else {
        BTreeMap::from([
            (key().module_configured_label(), String::new()),
            (key().module_in_use_label(), String::new()),
        ])
    };
    nmc.metadata.labels = Some(labels);
    nmc.metadata.owner_references = Some(vec![node_owner(&worker_1("gpu"))]);
    nmc.status = Some(capstan_api::nmc::NodeModulesConfigStatus { modules: status });
    nmc
}

/// `kmm-demo/my-kmod` loaded on worker-1.
fn loaded() -> NodeModuleStatus {
    let entry = entry();
    NodeModuleStatus {
        name: entry.name,
        namespace: entry.namespace,
        service_account_name: entry.service_account_name,
        config: entry.config,
        boot_id: "boot-1".into(),
        ..NodeModuleStatus::default()
    }
}

/// Runs one reconcile of `node`, the Module cache holding `modules` and the NMC cache
/// `nmcs`, against an API server that expects exactly `calls`.
async fn reconcile_node_once(
    node: Node,
    modules: Vec<Value>,
    nmcs: Vec<NodeModulesConfig>,
    calls: Vec<Call>,
) -> Result<Action, Error> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let data = Arc::new(NodeCtx {
        ctx: context(client),
        modules: store(modules.into_iter().map(parse).collect()),
        nmcs: store(nmcs),
    });
    let result = reconcile_node(Arc::new(node), data).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

/// The reconcilers' context at [`NOW`].
fn context(client: kube::Client) -> Arc<Context> {
    let clock = ManualClock::new(NOW.parse().expect("a time"));
    Context::with_clock(client, Arc::new(clock), CancellationToken::new())
}

/// A Module reconciler's state on `client`: the Module cache holding `modules`, the NMC
/// cache `nmcs`, the Node cache worker-1 (a GPU node); nothing counted or paced yet.
fn module_ctx(
    client: kube::Client,
    modules: Vec<Value>,
    nmcs: Vec<NodeModulesConfig>,
) -> Arc<ModuleCtx> {
    Arc::new(ModuleCtx {
        ctx: context(client),
        modules: store(modules.into_iter().map(parse).collect()),
        nmcs: store(nmcs),
        nodes: store(vec![worker_1("gpu")]),
        pacer: Arc::default(),
        tally: Arc::default(),
    })
}

/// Runs one reconcile of `module` (the Module cache holding it and `others`, the NMC cache
/// `nmcs`) against an API server that expects exactly `calls`.
async fn reconcile_module_once(
    module: Value,
    others: Vec<Value>,
    nmcs: Vec<NodeModulesConfig>,
    calls: Vec<Call>,
) -> Result<Action, Error> {
    let (client, server) = fixtures::client();
    let server = server.run(calls);
    let mut modules = vec![module.clone()];
    modules.extend(others);
    let data = module_ctx(client, modules, nmcs);
    let result = reconcile_module(Arc::new(parse(module)), data).await;
    server
        .await
        .expect("the reconcile made the scenario's calls, in order");
    result
}

/// The namespace's `contains-modules` label set (`""`) or removed (`null`).
fn label_namespace_call(value: Value) -> Call {
    Call::new(
        "PATCH",
        NAMESPACE,
        Some(json!({"metadata": {"labels": {NAMESPACE_LABEL: value}}})),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kmm-demo"}}),
    )
}

/// The Module's finalizers written as `finalizers`, on the resourceVersion read.
fn finalizers_call(finalizers: Value, answer: Value) -> Call {
    Call::new(
        "PATCH",
        MODULE,
        Some(json!({"metadata": {"finalizers": finalizers, "resourceVersion": "5"}})),
        answer,
    )
}

/// The status of a Module whose entry worker-1 lists but has not loaded yet, as written at
/// `at`.
fn loading_status(at: &str) -> Value {
    json!({
        "moduleLoader": {"nodesMatchingSelectorNumber": 1, "desiredNumber": 1,
                         "availableNumber": 0},
        "conditions": [
            {"type": "Available", "status": "False", "reason": "Loading",
             "message": "loaded on 0 of 1 nodes", "lastTransitionTime": at},
            {"type": "Degraded", "status": "False", "reason": "WorkersSucceed",
             "message": "", "lastTransitionTime": at},
        ],
    })
}

#[tokio::test]
async fn a_node_newly_targeted_by_a_module_gets_its_nmc_created_with_the_entry() {
    let created = json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "NodeModulesConfig",
        "metadata": {
            "name": "worker-1",
            "labels": {key().module_configured_label(): "", key().module_in_use_label(): ""},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1",
                                 "uid": "uid-worker-1"}],
        },
        "spec": {"modules": [entry()]},
    });
    let action = reconcile_node_once(
        worker_1("gpu"),
        vec![finalized()],
        vec![],
        vec![Call::new("POST", NMCS, Some(created.clone()), created)],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

/// One reconcile of worker-1, newly targeted, whose NMC creation is answered 409 with
/// `reason`.
async fn creation_refused(reason: &str) -> Result<Action, Error> {
    let refused = Call::new("POST", NMCS, None, json!({}))
        .any_body()
        .failing(409, reason);
    reconcile_node_once(worker_1("gpu"), vec![finalized()], vec![], vec![refused]).await
}

#[tokio::test]
async fn an_nmc_created_before_the_cache_showed_it_is_no_error() {
    let action = creation_refused("AlreadyExists")
        .await
        .expect("its watch event brings the node back");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_conflict_that_created_no_nmc_is_an_error_retried_by_the_runner() {
    let result = creation_refused("Conflict").await;
    assert!(result.is_err(), "{result:?}");
}

#[tokio::test]
async fn a_node_no_longer_targeted_has_the_entry_removed_and_its_nmc_kept_empty() {
    // The module-in-use label stays for the NMC controller to drop once it is unloaded.
    let patch = json!({
        "spec": {"modules": []},
        "metadata": {"labels": {key().module_configured_label(): null}},
    });
    let action = reconcile_node_once(
        worker_1("cpu"),
        vec![finalized()],
        vec![nmc(vec![entry()], vec![loaded()])],
        vec![Call::new("PATCH", NMC, Some(patch), json!({}))],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_node_whose_nmc_lists_what_the_modules_want_makes_no_call() {
    let action = reconcile_node_once(
        worker_1("gpu"),
        vec![finalized()],
        vec![nmc(vec![entry()], vec![loaded()])],
        vec![],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_node_no_module_targets_gets_no_nmc() {
    let action = reconcile_node_once(worker_1("cpu"), vec![finalized()], vec![], vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_failed_nmc_write_is_an_error_retried_by_the_runner() {
    let result = reconcile_node_once(
        worker_1("cpu"),
        vec![finalized()],
        vec![nmc(vec![entry()], vec![loaded()])],
        vec![
            Call::new("PATCH", NMC, None, json!({}))
                .any_body()
                .failing(500, "InternalError"),
        ],
    )
    .await;
    assert!(result.is_err(), "{result:?}");
}

#[tokio::test]
async fn a_new_module_gets_its_namespace_labelled_then_its_finalizer_then_its_status() {
    let module = my_kmod(json!({}));
    let action = reconcile_module_once(
        module.clone(),
        vec![],
        vec![nmc(vec![entry()], vec![])],
        vec![
            label_namespace_call(json!("")),
            finalizers_call(json!([MODULE_FINALIZER]), finalized()),
            Call::new(
                "PATCH",
                MODULE_STATUS,
                Some(json!({"status": loading_status(NOW)})),
                module,
            ),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_module_whose_status_says_its_counts_makes_no_call() {
    let mut module = finalized();
    module["status"] = loading_status("2026-03-01T08:00:00Z");
    let action = reconcile_module_once(module, vec![], vec![nmc(vec![entry()], vec![])], vec![])
        .await
        .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_module_changed_under_its_finalizer_write_is_looked_at_again_before_its_status() {
    let action = reconcile_module_once(
        my_kmod(json!({})),
        vec![],
        vec![nmc(vec![entry()], vec![])],
        vec![
            label_namespace_call(json!("")),
            finalizers_call(json!([MODULE_FINALIZER]), json!({})).failing(409, "Conflict"),
        ],
    )
    .await
    .expect("a conflict is no error");
    assert_eq!(action, Action::requeue(CONFLICT_RETRY));
}

#[tokio::test]
async fn a_deleting_module_still_loaded_on_a_node_keeps_its_finalizer() {
    // The spec no longer lists it; the status still does until the worker pod unloads it.
    let action = reconcile_module_once(
        deleting(),
        vec![],
        vec![nmc(vec![], vec![loaded()])],
        vec![],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_deleting_module_unloaded_everywhere_loses_its_finalizer_then_its_namespace_label() {
    let action = reconcile_module_once(
        deleting(),
        vec![],
        vec![nmc(vec![], vec![])],
        vec![
            finalizers_call(json!([]), my_kmod(json!({}))),
            label_namespace_call(Value::Null),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn the_namespace_keeps_its_label_while_another_module_is_in_it() {
    let mut other = finalized();
    other["metadata"]["name"] = json!("other-kmod");
    other["metadata"]["uid"] = json!("uid-other-kmod");
    let action = reconcile_module_once(
        deleting(),
        vec![other],
        vec![],
        vec![finalizers_call(json!([]), my_kmod(json!({})))],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_deleting_module_changed_under_its_finalizer_write_is_looked_at_again() {
    for (status, reason) in [(409, "Conflict"), (404, "NotFound")] {
        let action = reconcile_module_once(
            deleting(),
            vec![],
            vec![],
            vec![finalizers_call(json!([]), json!({})).failing(status, reason)],
        )
        .await
        .expect("no error: the next look finds the Module as it is");
        assert_eq!(action, Action::requeue(CONFLICT_RETRY), "{reason}");
    }
}

#[tokio::test]
async fn a_namespace_already_gone_is_no_error() {
    let action = reconcile_module_once(
        deleting(),
        vec![],
        vec![],
        vec![
            finalizers_call(json!([]), my_kmod(json!({}))),
            label_namespace_call(Value::Null).failing(404, "NotFound"),
        ],
    )
    .await
    .expect("reconciled");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_failed_namespace_label_is_an_error_and_no_finalizer_goes_on() {
    let result = reconcile_module_once(
        my_kmod(json!({})),
        vec![],
        vec![],
        vec![label_namespace_call(json!("")).failing(500, "InternalError")],
    )
    .await;
    assert!(result.is_err(), "{result:?}");
}

#[tokio::test]
async fn counts_that_change_again_within_the_interval_wait_for_it_without_a_call() {
    let (client, server) = fixtures::client();
    let mut module = finalized();
    let server = server.run(vec![Call::new(
        "PATCH",
        MODULE_STATUS,
        Some(json!({"status": loading_status(NOW)})),
        module.clone(),
    )]);
    let data = module_ctx(
        client,
        vec![module.clone()],
        vec![nmc(vec![entry()], vec![])],
    );
    let first = reconcile_module(Arc::new(parse(module.clone())), data.clone())
        .await
        .expect("reconciled");
    assert_eq!(first, Action::await_change());
    // The status as another count left it: the conditions stay, so the counts wait.
    module["status"] = loading_status(NOW);
    module["status"]["moduleLoader"]["desiredNumber"] = json!(2);
    let second = reconcile_module(Arc::new(parse(module)), data)
        .await
        .expect("reconciled");
    assert_ne!(second, Action::await_change(), "the status write is paced");
    server
        .await
        .expect("the reconciles made the scenario's calls, in order");
}
