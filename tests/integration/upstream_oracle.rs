//! Upstream's own controllers as the oracle. Every scenario runs under upstream KMM v2.6.0's
//! operator manager on one fresh real control plane and under capstan's KMM controllers on
//! another, both of the same build with the same kwok nodes. After each step both clusters
//! are left to settle, and what each controller wrote is compared after normalising names,
//! uids, times and boot IDs: NodeModulesConfig entries and labels, the nodes' KMM labels,
//! the Modules' finalizers and status counts, the namespace's label, and the shape of every
//! worker pod (labels, annotations, tolerations, restart policy...).
//!
//! A difference fails the test unless it is named in [`NAMED`], whose every entry
//! docs/upstream-differences.md explains and which must each still be seen, so that the list
//! says exactly where capstan decides otherwise. The report (`--nocapture`) lists each
//! scenario with its result.
//!
//! Upstream's manager is built by `hack/real-cluster/kmm/build` from the source archive
//! beside the checkout; on the embedded cluster there is no upstream to run, and the test
//! says so and passes (hack/test runs it with the real server only).

use crate::common;
use crate::oracle::{Named, Running, Shown, Verdict};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capstan_api::labels::ModuleKey;
use capstan_cluster::sim::config::NodeConfig;
use capstan_real_cluster::ControlPlane;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

const FEDORA: &str = "6.0.15-300.fc37.x86_64";
const RHEL: &str = "5.14.0-284.el9.x86_64";
/// The label that ties a node to its scenario, and that the scenario's Modules select.
const SCENARIO_LABEL: &str = "oracle";
/// How long a scenario's objects must stay as they are before they count as settled.
const QUIET: Duration = Duration::from_secs(4);
/// How long a step may take to settle.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Where capstan decides otherwise on purpose: (id in docs/upstream-differences.md,
/// scenario or `*` for every one, a part of the differing path, whether every run shows
/// it). A difference every run shows must be seen, or leave the list; one that shows only
/// when upstream's controllers race each other may not.
const NAMED: &[Named] = &[
    // A cordoned node keeps its modules: no unloader, the entry, status and counts stay.
    ("KMM-cordon", "cordon", "/nmc/cordon-1/", Shown::Always),
    (
        "KMM-cordon",
        "cordon",
        "/workerPods/kmm-worker-cordon-1-drv Unload/",
        Shown::Always,
    ),
    ("KMM-cordon", "cordon", "/nodes/cordon-1/", Shown::Always),
    (
        "KMM-cordon",
        "cordon",
        "/modules/drv/moduleLoader/",
        Shown::Always,
    ),
    // Worker pods: capstan retries a failed worker itself, pulls the image in the worker
    // (seed 001), needs no finalizer on its own pods, and runs them node-critical.
    ("KMM-worker-restart", "*", "/restartPolicy", Shown::Always),
    ("KMM-worker-pull", "*", "/initContainers", Shown::Always),
    (
        "KMM-worker-finalizer",
        "*",
        " Load/finalizers",
        Shown::Always,
    ),
    (
        "KMM-worker-finalizer",
        "*",
        " Unload/finalizers",
        Shown::Always,
    ),
    (
        "KMM-worker-priority",
        "*",
        "/priorityClassName",
        Shown::Always,
    ),
    // Upstream's NMC controller may reload the old kernel's image on the new kernel before
    // its Module controller has written the new kernel's entry, and then unload it.
    (
        "KMM-kernel-race",
        "kernel",
        "/workerPods/kmm-worker-kernel-1-drv Unload/",
        Shown::WhenUpstreamRaces,
    ),
    // A version-module label of a Module not yet in the cluster is acted on when the
    // Module comes.
    (
        "KMM-version-before-module",
        "version",
        "/nodes/version-1/beta.kmm.node.kubernetes.io/version-",
        Shown::Always,
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Upstream,
    Capstan,
}

/// One thing a scenario does to its cluster.
#[derive(Clone, Debug)]
enum Step {
    /// Creates the Module.
    Create(Value),
    /// Replaces the Module's spec.
    ReplaceSpec(&'static str, Value),
    /// Deletes the Module.
    Delete(&'static str),
    /// The node's kubelet reports memory pressure (the node lifecycle controller taints it).
    MemoryPressure(&'static str),
    /// `kubectl cordon`.
    Cordon(&'static str),
    /// A `NoSchedule` taint of this key.
    Taint(&'static str, &'static str),
    /// The node reboots: a new boot ID.
    Reboot(&'static str),
    /// The node comes back on another kernel.
    UpgradeKernel(&'static str, &'static str),
    /// Sets (or, with `None`, removes) a node label.
    Label(&'static str, String, Option<&'static str>),
}

struct Scenario {
    /// Also the namespace of its Modules and the value of [`SCENARIO_LABEL`] on its nodes.
    name: &'static str,
    nodes: Vec<(&'static str, &'static str)>,
    steps: Vec<Step>,
}

/// A Module of the scenario `ns`: kernel module `drv`, every node of the scenario, the
/// given kernel mappings and extra container fields.
fn module(ns: &str, name: &str, mappings: Value, container: Value) -> Value {
    let mut loader = json!({
        "modprobe": {"moduleName": name.replace('-', "_")},
        "kernelMappings": mappings,
    });
    if let (Some(loader), Value::Object(extra)) = (loader.as_object_mut(), container) {
        loader.extend(extra);
    }
    json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {SCENARIO_LABEL: ns}, "moduleLoader": {"container": loader}},
    })
}

fn any_kernel(image: &str) -> Value {
    json!([{"regexp": "^.+$", "containerImage": image}])
}

fn scenarios() -> Vec<Scenario> {
    let plain = |ns: &'static str| {
        module(
            ns,
            "drv",
            any_kernel("registry.example/drv:${KERNEL_FULL_VERSION}"),
            json!({}),
        )
    };
    let version_label = ModuleKey::new("version", "drv")
        .expect("key")
        .version_module_label();
    let versioned = |version: &str| {
        module(
            "version",
            "drv",
            any_kernel(&format!("registry.example/drv:{version}")),
            json!({"version": version}),
        )
    };
    vec![
        Scenario {
            name: "order",
            nodes: vec![("order-1", FEDORA)],
            steps: vec![Step::Create(module(
                "order",
                "drv",
                json!([
                    {"regexp": "^.+$", "containerImage": "registry.example/drv:any"},
                    {"literal": FEDORA, "containerImage": "registry.example/drv:fedora"},
                ]),
                json!({}),
            ))],
        },
        Scenario {
            name: "pressure",
            nodes: vec![("pressure-1", FEDORA)],
            steps: vec![
                Step::Create(plain("pressure")),
                Step::MemoryPressure("pressure-1"),
            ],
        },
        Scenario {
            name: "noloader",
            nodes: vec![("noloader-1", FEDORA)],
            steps: vec![
                Step::Create(plain("noloader")),
                Step::ReplaceSpec("drv", json!({"selector": {SCENARIO_LABEL: "noloader"}})),
            ],
        },
        Scenario {
            name: "taints",
            nodes: vec![("taints-1", FEDORA), ("taints-2", FEDORA)],
            steps: vec![
                Step::Taint("taints-1", "dedicated"),
                Step::Create(plain("taints")),
                Step::ReplaceSpec(
                    "drv",
                    json!({
                        "selector": {SCENARIO_LABEL: "taints"},
                        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                        "moduleLoader": plain("taints")["spec"]["moduleLoader"],
                    }),
                ),
            ],
        },
        Scenario {
            name: "cordon",
            nodes: vec![("cordon-1", FEDORA)],
            steps: vec![Step::Create(plain("cordon")), Step::Cordon("cordon-1")],
        },
        Scenario {
            name: "reboot",
            nodes: vec![("reboot-1", FEDORA)],
            steps: vec![Step::Create(plain("reboot")), Step::Reboot("reboot-1")],
        },
        Scenario {
            name: "kernel",
            nodes: vec![("kernel-1", RHEL)],
            steps: vec![
                Step::Create(module(
                    "kernel",
                    "drv",
                    json!([
                        {"literal": RHEL, "containerImage": "registry.example/drv:rhel-${KERNEL_XYZ}"},
                        {"regexp": "^.+\\.fc\\d+\\..+$", "containerImage": "registry.example/drv:fc-${KERNEL_FULL_VERSION}"},
                    ]),
                    json!({}),
                )),
                Step::UpgradeKernel("kernel-1", FEDORA),
                Step::UpgradeKernel("kernel-1", "4.18.0-unmapped"),
            ],
        },
        Scenario {
            name: "selector",
            nodes: vec![("selector-1", FEDORA), ("selector-2", FEDORA)],
            steps: vec![
                Step::Create(plain("selector")),
                Step::Label("selector-2", SCENARIO_LABEL.to_string(), Some("elsewhere")),
            ],
        },
        Scenario {
            name: "version",
            nodes: vec![("version-1", FEDORA), ("version-2", FEDORA)],
            steps: vec![
                Step::Label("version-1", version_label.clone(), Some("v1")),
                Step::Create(versioned("v1")),
                Step::ReplaceSpec("drv", versioned("v2")["spec"].clone()),
                Step::Label("version-1", version_label.clone(), Some("v2")),
                Step::Label("version-2", version_label.clone(), Some("v2")),
                Step::Label("version-1", version_label, None),
            ],
        },
        Scenario {
            name: "deleted",
            nodes: vec![("deleted-1", FEDORA)],
            steps: vec![Step::Create(plain("deleted")), Step::Delete("drv")],
        },
    ]
}

/// Every worker pod as first seen, by namespace, then by `<name> <action>`.
type SeenPods = Arc<Mutex<BTreeMap<String, BTreeMap<String, Value>>>>;

/// One system's cluster, with what it saw of worker pods.
struct Side {
    system: System,
    plane: ControlPlane,
    client: kube::Client,
    running: Running,
    pods: SeenPods,
}

impl Side {
    async fn start(system: System, scenarios: &[Scenario]) -> Side {
        let nodes = scenarios
            .iter()
            .flat_map(|scenario| {
                scenario.nodes.iter().map(|(name, kernel)| {
                    serde_json::from_value::<NodeConfig>(json!({
                        "name": name,
                        "kernel": kernel,
                        "labels": {SCENARIO_LABEL: scenario.name},
                    }))
                    .expect("node config")
                })
            })
            .collect();
        let (plane, client) = crate::oracle::start_plane(
            &format!("{system:?}"),
            nodes,
            scenarios.iter().map(|scenario| scenario.name),
        )
        .await;
        let pods = Arc::new(Mutex::new(BTreeMap::new()));
        let running = match system {
            System::Capstan => {
                Running::capstan(&client, "module-nmc,nmc,device-plugin,version-labels")
            }
            System::Upstream => {
                let log = std::env::temp_dir().join("capstan-upstream-oracle-kmm.log");
                let kubeconfig = plane.dir().join("admin.kubeconfig");
                Running::upstream(
                    capstan_real_cluster::kmm::start(&client, &kubeconfig, &log)
                        .await
                        .unwrap_or_else(|err| panic!("upstream KMM starts: {err:#}")),
                )
            }
        };
        // Started before any step, so they see every pod the steps make.
        tokio::spawn(watch_worker_pods(
            client.clone(),
            pods.clone(),
            running.stop.clone(),
        ));
        Side {
            system,
            plane,
            client,
            running,
            pods,
        }
    }

    async fn stop(self) {
        self.running.stop().await;
        self.plane.shutdown().await;
    }

    /// Runs `scenario`, and returns its snapshot after each step.
    async fn run(&self, scenario: &Scenario) -> Vec<Value> {
        let mut snapshots = Vec::new();
        for (index, step) in scenario.steps.iter().enumerate() {
            self.take(scenario.name, step).await;
            snapshots.push(self.settled(scenario, index).await);
        }
        snapshots
    }

    async fn take(&self, ns: &str, step: &Step) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let modules =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &module_resource());
        let merge = |value: Value| Patch::Merge(value);
        let params = PatchParams::default();
        match step {
            Step::Create(module) => {
                let module: DynamicObject = serde_json::from_value(module.clone()).expect("module");
                modules
                    .create(&PostParams::default(), &module)
                    .await
                    .expect("create module");
            }
            Step::ReplaceSpec(name, spec) => {
                let mut module = modules.get(name).await.expect("module");
                module.data["spec"] = spec.clone();
                modules
                    .replace(name, &PostParams::default(), &module)
                    .await
                    .expect("replace module");
            }
            Step::Delete(name) => {
                modules
                    .delete(name, &DeleteParams::default())
                    .await
                    .expect("delete module");
            }
            Step::MemoryPressure(node) => {
                common::report_memory_pressure(&self.client, node).await;
                wait_for_taint(&nodes, node, common::MEMORY_PRESSURE_TAINT).await;
            }
            Step::Cordon(node) => {
                nodes
                    .patch(
                        node,
                        &params,
                        &merge(json!({"spec": {"unschedulable": true}})),
                    )
                    .await
                    .expect("cordon");
                wait_for_taint(&nodes, node, "node.kubernetes.io/unschedulable").await;
            }
            Step::Taint(node, key) => {
                nodes
                    .patch(
                        node,
                        &params,
                        &merge(json!({"spec": {"taints": [{"key": key, "effect": "NoSchedule"}]}})),
                    )
                    .await
                    .expect("taint");
            }
            Step::Reboot(node) => {
                let boot = uuid::Uuid::new_v4().to_string();
                nodes
                    .patch_status(
                        node,
                        &params,
                        &merge(json!({"status": {"nodeInfo": {"bootID": boot}}})),
                    )
                    .await
                    .expect("reboot");
            }
            Step::UpgradeKernel(node, kernel) => {
                let boot = uuid::Uuid::new_v4().to_string();
                nodes
                    .patch_status(
                        node,
                        &params,
                        &merge(json!({"status": {"nodeInfo": {"bootID": boot, "kernelVersion": kernel}}})),
                    )
                    .await
                    .expect("kernel upgrade");
            }
            Step::Label(node, key, value) => {
                nodes
                    .patch(
                        node,
                        &params,
                        &merge(json!({"metadata": {"labels": {key.as_str(): value}}})),
                    )
                    .await
                    .expect("label");
            }
        }
    }

    /// The scenario's snapshot once it has stayed the same for [`QUIET`] with no worker or
    /// image pod left in its namespace.
    async fn settled(&self, scenario: &Scenario, step: usize) -> Value {
        let started = Instant::now();
        let mut last = self.snapshot(scenario).await;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.snapshot(scenario).await;
            let idle = self.pods_in(scenario.name).await == 0;
            if now != last || !idle {
                last = now;
                since = Instant::now();
            } else if since.elapsed() >= QUIET {
                return last;
            }
            assert!(
                started.elapsed() < STEP_DEADLINE,
                "{:?}: scenario {} step {step} did not settle: {last:#}",
                self.system,
                scenario.name
            );
        }
    }

    async fn pods_in(&self, ns: &str) -> usize {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        pods.list_metadata(&ListParams::default())
            .await
            .expect("pods")
            .items
            .len()
    }

    /// What the controllers wrote for `scenario`, normalised.
    async fn snapshot(&self, scenario: &Scenario) -> Value {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let nmcs = Api::<DynamicObject>::all_with(self.client.clone(), &nmc_resource());
        let mut node_labels = Map::new();
        let mut nmc_view = Map::new();
        for (name, _) in &scenario.nodes {
            let node = nodes.get(name).await.expect("node");
            let boot = node
                .status
                .as_ref()
                .and_then(|status| status.node_info.as_ref())
                .map(|info| info.boot_id.clone())
                .unwrap_or_default();
            node_labels.insert(name.to_string(), kmm_labels(node.metadata.labels.as_ref()));
            if let Some(nmc) = nmcs.get_opt(name).await.expect("nmc") {
                nmc_view.insert(name.to_string(), normalise_nmc(&nmc, &boot));
            }
        }
        let modules = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            scenario.name,
            &module_resource(),
        );
        let mut module_view = Map::new();
        for module in modules
            .list(&ListParams::default())
            .await
            .expect("modules")
            .items
        {
            let status = module.data.get("status").cloned().unwrap_or(Value::Null);
            module_view.insert(
                module.metadata.name.clone().unwrap_or_default(),
                json!({
                    "finalizers": module.metadata.finalizers.clone().unwrap_or_default(),
                    "moduleLoader": status.get("moduleLoader").cloned().unwrap_or(Value::Null),
                    "devicePlugin": status.get("devicePlugin").cloned().unwrap_or(Value::Null),
                }),
            );
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace = namespaces.get(scenario.name).await.expect("namespace");
        let pods = self
            .pods
            .lock()
            .expect("pods")
            .get(scenario.name)
            .cloned()
            .unwrap_or_default();
        json!({
            "nodes": node_labels,
            "nmc": nmc_view,
            "modules": module_view,
            "namespace": kmm_labels(namespace.metadata.labels.as_ref()),
            "workerPods": pods.into_iter().collect::<Map<_, _>>(),
        })
    }
}

async fn wait_for_taint(nodes: &Api<Node>, node: &str, key: &str) {
    common::wait_until(&format!("{node} tainted {key}"), || async {
        nodes
            .get(node)
            .await
            .expect("node")
            .spec
            .and_then(|spec| spec.taints)
            .unwrap_or_default()
            .iter()
            .any(|taint| taint.key == key)
    })
    .await;
}

fn module_resource() -> ApiResource {
    ApiResource::erase::<capstan_api::module::Module>(&())
}

fn nmc_resource() -> ApiResource {
    ApiResource::erase::<capstan_api::nmc::NodeModulesConfig>(&())
}

/// The labels of KMM's own prefixes.
fn kmm_labels(labels: Option<&BTreeMap<String, String>>) -> Value {
    labels
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            key.contains("kmm.node.kubernetes.io") || key.contains("kmm.node.k8s.io")
        })
        .map(|(key, value)| (key.clone(), Value::String(value.clone())))
        .collect::<Map<_, _>>()
        .into()
}

/// An NMC's KMM labels, spec and status entries by `<namespace>/<name>`, each entry's
/// tolerations sorted and its boot ID said as the node's or another.
fn normalise_nmc(nmc: &DynamicObject, node_boot: &str) -> Value {
    let entries = |part: &str| -> Map<String, Value> {
        nmc.data[part]["modules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|entry| {
                let mut entry = entry.clone();
                let key = format!(
                    "{}/{}",
                    entry["namespace"].as_str().unwrap_or_default(),
                    entry["name"].as_str().unwrap_or_default()
                );
                if let Some(boot) = entry.get_mut("bootId") {
                    *boot = Value::String(
                        if boot.as_str() == Some(node_boot) {
                            "<the node's boot>"
                        } else {
                            "<another boot>"
                        }
                        .into(),
                    );
                }
                if let Some(time) = entry.get_mut("lastTransitionTime") {
                    *time = Value::String("<time>".into());
                }
                sort_tolerations(&mut entry["tolerations"]);
                (key, entry)
            })
            .collect()
    };
    json!({
        "labels": kmm_labels(nmc.metadata.labels.as_ref()),
        "spec": entries("spec"),
        "status": entries("status"),
    })
}

fn sort_tolerations(tolerations: &mut Value) {
    if let Value::Array(list) = tolerations {
        list.sort_by_key(|t| t.to_string());
    }
}

/// A worker pod's shape: what the controller chose, not what the server or kwok added.
fn normalise_pod(pod: &Pod) -> Value {
    let annotations: Map<String, Value> = pod
        .metadata
        .annotations
        .iter()
        .flatten()
        .map(|(key, value)| {
            let value = if key.ends_with("worker-config") || key.ends_with("tolerations") {
                serde_saphyr::from_str::<Value>(value)
                    .unwrap_or_else(|_| Value::String(value.clone()))
            } else if key.ends_with("hash") {
                Value::String("<hash>".into())
            } else {
                Value::String(value.clone())
            };
            (key.clone(), value)
        })
        .collect();
    let spec = pod.spec.clone().unwrap_or_default();
    let mut tolerations =
        serde_json::to_value(spec.tolerations.unwrap_or_default()).expect("tolerations");
    sort_tolerations(&mut tolerations);
    json!({
        "labels": pod.metadata.labels.clone().unwrap_or_default(),
        "annotations": annotations,
        "finalizers": pod.metadata.finalizers.clone().unwrap_or_default(),
        "owners": pod.metadata.owner_references.iter().flatten().map(|o| format!("{}/{}", o.kind, o.name)).collect::<Vec<_>>(),
        "nodeName": spec.node_name,
        "restartPolicy": spec.restart_policy,
        "serviceAccountName": spec.service_account_name,
        "tolerations": tolerations,
        "priorityClassName": spec.priority_class_name,
        "imagePullSecrets": spec.image_pull_secrets,
        "initContainers": spec.init_containers.iter().flatten().map(|c| c.name.clone()).collect::<Vec<_>>(),
        "containers": spec.containers.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
    })
}

/// Keeps the first sight of every worker pod (the label `kmm.node.kubernetes.io/worker-action`
/// says which) under its name and action. How many were made is left out: upstream's two
/// controllers race each other, and the count would differ from run to run.
async fn watch_worker_pods(client: kube::Client, pods: SeenPods, stop: CancellationToken) {
    let api: Api<Pod> = Api::all(client);
    let mut seen_uids = std::collections::BTreeSet::new();
    let mut events = watcher(
        api,
        watcher::Config::default().labels("kmm.node.kubernetes.io/worker-action"),
    )
    .boxed();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => return,
            event = events.next() => event,
        };
        let Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) = event else {
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !seen_uids.insert(uid) {
            continue;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let action = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get("kmm.node.kubernetes.io/worker-action"))
            .cloned()
            .unwrap_or_default();
        let key = format!("{} {action}", pod.metadata.name.clone().unwrap_or_default());
        let mut pods = pods.lock().expect("pods");
        pods.entry(ns)
            .or_default()
            .entry(key)
            .or_insert_with(|| normalise_pod(&pod));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capstan_decides_as_upstream_kmm_does() {
    if !common::on_real_server() {
        eprintln!("upstream's KMM runs on the real control plane only: nothing to compare here");
        return;
    }
    let scenarios = scenarios();
    // Upstream's manager is started (and built when the cache lacks it) before the clock of
    // any step runs.
    let (upstream, capstan) = tokio::join!(
        Side::start(System::Upstream, &scenarios),
        Side::start(System::Capstan, &scenarios)
    );
    let (upstream_side, capstan_side) = (&upstream, &capstan);
    let runs = futures::future::join_all(scenarios.iter().map(|scenario| async move {
        let (a, b) = tokio::join!(upstream_side.run(scenario), capstan_side.run(scenario));
        (scenario, a, b)
    }))
    .await;
    upstream.stop().await;
    capstan.stop().await;

    let mut verdict = Verdict::new(NAMED);
    for (scenario, upstream, capstan) in runs {
        let steps: Vec<String> = scenario
            .steps
            .iter()
            .map(|step| format!("{step:?}"))
            .collect();
        verdict.scenario(scenario.name, &steps, &upstream, &capstan);
    }
    verdict.finish("upstream KMM v2.6.0");
}
