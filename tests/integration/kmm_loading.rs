//! The Module -> NMC and NMC controllers over HTTPS: kmod images per kernel, reload after
//! a reboot, a kernel upgrade, Module deletion with its finalizer, and a broken image
//! backing off. On the embedded cluster the simulated kernel shows each load and unload;
//! on a real server the NodeModulesConfig status is what shows a module loaded.

use crate::common;

use std::collections::BTreeMap;

use capstan::controllers::{self, Context};
use capstan_api::labels::{self, ModuleKey};
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_cluster::sim::config::{ClusterConfig, NodeConfig};
use common::TestCluster;
use common::wait_until;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const FEDORA: &str = "6.0.15-300.fc37.x86_64";
const RHEL: &str = "5.14.0-284.el9.x86_64";
const NS: &str = "kmm";

/// A cluster whose worker nodes run the given kernels, with the KMM controllers running.
struct Fleet {
    cluster: TestCluster,
    client: kube::Client,
    stop: CancellationToken,
    controllers: tokio::task::JoinHandle<()>,
}

impl Fleet {
    async fn start(kernels: &[(&str, &str)], broken_images: &[&str]) -> Fleet {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let mut config = ClusterConfig {
            nodes: kernels
                .iter()
                .map(|(name, kernel)| {
                    let mut node: NodeConfig =
                        serde_json::from_value(json!({"name": name, "kernel": kernel}))
                            .expect("node config");
                    node.labels.insert("gpu".into(), "true".into());
                    node
                })
                .collect(),
            broken_images: broken_images.iter().map(|s| s.to_string()).collect(),
            ..ClusterConfig::default()
        };
        config.timing.worker_seconds = 0.05;
        let (cluster, client) = common::start_simulated(config).await;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}})).expect("namespace"),
            )
            .await
            .expect("namespace");
        let stop = CancellationToken::new();
        let ctx = Context::new(client.clone(), stop.clone());
        let selection: controllers::Selection = "module-nmc,nmc".parse().expect("selection");
        let controllers = tokio::spawn(async move { controllers::run(ctx, &selection).await });
        Fleet {
            cluster,
            client,
            stop,
            controllers,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.controllers.await.expect("controllers stop");
    }

    /// Whether kernel module `module` is loaded on `node`: in the simulated kernel on the
    /// embedded cluster; on a real server, where worker pods run no code, as the node's
    /// NodeModulesConfig status says.
    async fn loaded(&self, node: &str, module: &str) -> bool {
        if let Some(sim) = self.cluster.simulation() {
            return sim
                .node(node)
                .map(|state| state.modules.contains(module))
                .unwrap_or(false);
        }
        self.nmc(node).await.is_some_and(|nmc| {
            nmc.status
                .unwrap_or_default()
                .modules
                .iter()
                .any(|entry| entry.config.modprobe.module_name == module)
        })
    }

    /// The node reboots: on the embedded cluster its kernel loses every module; on a real
    /// server its kubelet reports a new boot ID.
    async fn reboot(&self, node: &str) {
        if let Some(sim) = self.cluster.simulation() {
            return sim.reboot(node).await.expect("reboot");
        }
        self.report_node_info(node, json!({"bootID": uuid::Uuid::new_v4().to_string()}))
            .await;
    }

    /// The node comes back on kernel `kernel`.
    async fn upgrade_kernel(&self, node: &str, kernel: &str) {
        if let Some(sim) = self.cluster.simulation() {
            return sim
                .upgrade_kernel(node, kernel)
                .await
                .expect("kernel upgrade");
        }
        self.report_node_info(
            node,
            json!({"bootID": uuid::Uuid::new_v4().to_string(), "kernelVersion": kernel}),
        )
        .await;
    }

    /// Writes `node_info` into the node's status, as its kubelet does when it starts.
    async fn report_node_info(&self, node: &str, node_info: Value) {
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": node_info}})),
        )
        .await
        .expect("node status");
    }

    /// The boot ID the node's NodeModulesConfig status has `module` loaded under, and the
    /// node's own.
    async fn boot_ids(&self, node: &str, module: &str) -> (Option<String>, String) {
        let key = ModuleKey::new(NS, module).expect("key");
        let recorded = self
            .nmc(node)
            .await
            .and_then(|nmc| nmc.status_module(&key).map(|s| s.boot_id.clone()));
        let api: Api<Node> = Api::all(self.client.clone());
        let current = api
            .get(node)
            .await
            .expect("node")
            .status
            .and_then(|s| s.node_info)
            .map(|info| info.boot_id)
            .unwrap_or_default();
        (recorded, current)
    }

    async fn nmc(&self, node: &str) -> Option<NodeModulesConfig> {
        let api: Api<NodeModulesConfig> = Api::all(self.client.clone());
        api.get_opt(node).await.expect("get nmc")
    }

    async fn loaded_image(&self, node: &str, module: &str) -> Option<String> {
        let nmc = self.nmc(node).await?;
        let key = ModuleKey::new(NS, module).expect("key");
        Some(nmc.status_module(&key)?.config.container_image.clone())
    }

    async fn node_labels(&self, node: &str) -> BTreeMap<String, String> {
        let api: Api<Node> = Api::all(self.client.clone());
        api.get(node)
            .await
            .expect("node")
            .metadata
            .labels
            .unwrap_or_default()
    }

    async fn module(&self, name: &str) -> Option<Module> {
        let api: Api<Module> = Api::namespaced(self.client.clone(), NS);
        api.get_opt(name).await.expect("get module")
    }

    async fn worker_pods(&self) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        api.list(&ListParams::default().labels("app.kubernetes.io/component=worker"))
            .await
            .expect("pods")
            .items
    }
}

/// A Module loading `module_name` with a literal mapping for RHEL and a regexp for the rest.
fn module(name: &str, module_name: &str, fedora_image: &str) -> Module {
    serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"gpu": "true"},
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": module_name},
                "kernelMappings": [
                    {"literal": RHEL, "containerImage": format!("registry.example/{name}:rhel-${{KERNEL_XYZ}}")},
                    {"regexp": "^.+\\.fc\\d+\\..+$", "containerImage": fedora_image},
                ],
            }},
        },
    }))
    .expect("module")
}

async fn create_module(fleet: &Fleet, module: &Module) {
    let api: Api<Module> = Api::namespaced(fleet.client.clone(), NS);
    api.create(&PostParams::default(), module)
        .await
        .expect("create module");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kernel_gets_its_image_and_a_reboot_reloads() {
    let fleet = Fleet::start(&[("fedora-1", FEDORA), ("rhel-1", RHEL)], &[]).await;
    create_module(
        &fleet,
        &module(
            "gpu-drv",
            "gpu_drv",
            "registry.example/gpu-drv:fc-${KERNEL_FULL_VERSION}",
        ),
    )
    .await;
    wait_until(
        "the module is loaded and recorded on both nodes",
        || async {
            fleet.loaded("fedora-1", "gpu_drv").await
                && fleet.loaded("rhel-1", "gpu_drv").await
                && fleet.loaded_image("fedora-1", "gpu-drv").await.is_some()
                && fleet.loaded_image("rhel-1", "gpu-drv").await.is_some()
        },
    )
    .await;
    assert_eq!(
        fleet.loaded_image("fedora-1", "gpu-drv").await.as_deref(),
        Some(format!("registry.example/gpu-drv:fc-{FEDORA}").as_str())
    );
    assert_eq!(
        fleet.loaded_image("rhel-1", "gpu-drv").await.as_deref(),
        Some("registry.example/gpu-drv:rhel-5.14.0")
    );
    let key = ModuleKey::new(NS, "gpu-drv").expect("key");
    wait_until("ready labels and Module status", || async {
        let labels = fleet.node_labels("rhel-1").await;
        let status = fleet.module("gpu-drv").await.and_then(|m| m.status);
        labels.contains_key(&key.ready_label())
            && status.is_some_and(|s| {
                s.module_loader.nodes_matching_selector_number == 2
                    && s.module_loader.desired_number == 2
                    && s.module_loader.available_number == 2
            })
    })
    .await;
    wait_until("the worker pods are deleted once recorded", || async {
        fleet.worker_pods().await.is_empty()
    })
    .await;
    // The worker pods had zero API privileges.
    let module = fleet.module("gpu-drv").await.expect("module");
    assert!(
        module
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&labels::MODULE_FINALIZER.to_string())
    );

    // A reboot empties the node's module table; the module is loaded again, under the
    // node's new boot.
    let loads_before = loads(&fleet, "fedora-1");
    fleet.reboot("fedora-1").await;
    wait_until("the module is reloaded after the reboot", || async {
        let (recorded, current) = fleet.boot_ids("fedora-1", "gpu-drv").await;
        fleet.loaded("fedora-1", "gpu_drv").await
            && recorded == Some(current)
            && loads(&fleet, "fedora-1")
                .zip(loads_before)
                .is_none_or(|(now, before)| now > before)
    })
    .await;
    wait_until("the ready label is back", || async {
        fleet
            .node_labels("fedora-1")
            .await
            .contains_key(&key.ready_label())
    })
    .await;
    fleet.stop().await;
}

/// How many times the simulated kernel of `node` loaded a module (`Some` on the embedded
/// cluster only: a real server's nodes have no kernel to count in).
fn loads(fleet: &Fleet, node: &str) -> Option<usize> {
    kernel_actions(fleet, node, "load")
}

/// How many times it unloaded one.
fn unloads(fleet: &Fleet, node: &str) -> Option<usize> {
    kernel_actions(fleet, node, "unload")
}

fn kernel_actions(fleet: &Fleet, node: &str, action: &str) -> Option<usize> {
    let sim = fleet.cluster.simulation()?;
    Some(
        sim.module_history()
            .iter()
            .filter(|event| event.node == node && event.action == action)
            .count(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_upgrade_switches_the_image_without_unloading_on_the_old_kernel() {
    let fleet = Fleet::start(&[("upgrade-1", RHEL)], &[]).await;
    create_module(
        &fleet,
        &module(
            "gpu-drv",
            "gpu_drv",
            "registry.example/gpu-drv:fc-${KERNEL_FULL_VERSION}",
        ),
    )
    .await;
    wait_until("loaded on the RHEL kernel", || async {
        fleet.loaded_image("upgrade-1", "gpu-drv").await.as_deref()
            == Some("registry.example/gpu-drv:rhel-5.14.0")
    })
    .await;
    fleet.upgrade_kernel("upgrade-1", FEDORA).await;
    wait_until("loaded with the Fedora image on the new kernel", || async {
        fleet.loaded("upgrade-1", "gpu_drv").await
            && fleet.loaded_image("upgrade-1", "gpu-drv").await
                == Some(format!("registry.example/gpu-drv:fc-{FEDORA}"))
    })
    .await;
    if let (Some(unloads), Some(loads)) = (unloads(&fleet, "upgrade-1"), loads(&fleet, "upgrade-1"))
    {
        assert_eq!(
            unloads, 0,
            "nothing is unloaded on a kernel the node no longer runs"
        );
        assert_eq!(loads, 2);
    }
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_module_unloads_it_everywhere_then_releases_the_finalizer() {
    let fleet = Fleet::start(&[("del-1", FEDORA), ("del-2", FEDORA)], &[]).await;
    create_module(
        &fleet,
        &module(
            "gpu-drv",
            "gpu_drv",
            "registry.example/gpu-drv:${KERNEL_FULL_VERSION}",
        ),
    )
    .await;
    wait_until("loaded on both nodes", || async {
        fleet.loaded("del-1", "gpu_drv").await && fleet.loaded("del-2", "gpu_drv").await
    })
    .await;
    wait_until("the finalizer is on the Module", || async {
        fleet.module("gpu-drv").await.is_some_and(|m| {
            m.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&labels::MODULE_FINALIZER.to_string())
        })
    })
    .await;
    let api: Api<Module> = Api::namespaced(fleet.client.clone(), NS);
    api.delete("gpu-drv", &DeleteParams::default())
        .await
        .expect("delete");
    // The Module stays (finalizer) at least until the module is unloaded from both nodes.
    wait_until("the Module is gone", || async {
        fleet.module("gpu-drv").await.is_none()
    })
    .await;
    assert!(!fleet.loaded("del-1", "gpu_drv").await && !fleet.loaded("del-2", "gpu_drv").await);
    for node in ["del-1", "del-2"] {
        assert!(
            unloads(&fleet, node).is_none_or(|unloads| unloads == 1),
            "{node}"
        );
    }
    for node in ["del-1", "del-2"] {
        let nmc = fleet.nmc(node).await.expect("nmc");
        assert!(nmc.spec.modules.is_empty(), "{node}: {:?}", nmc.spec);
        assert!(nmc.status.unwrap_or_default().modules.is_empty());
    }
    wait_until("no worker pod is left behind", || async {
        fleet.worker_pods().await.is_empty()
    })
    .await;
    fleet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_image_shows_in_the_module_status_and_backs_off() {
    let broken = format!("registry.example/broken:{FEDORA}");
    let fleet = Fleet::start(&[("broken-1", FEDORA)], &[&broken]).await;
    create_module(
        &fleet,
        &module(
            "broken",
            "broken_drv",
            "registry.example/broken:${KERNEL_FULL_VERSION}",
        ),
    )
    .await;
    wait_until(
        "the Module is Degraded with the worker's reason",
        || async {
            fleet
                .module("broken")
                .await
                .and_then(|m| m.status)
                .is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "Degraded"
                            && c.status == "True"
                            && c.message.contains("broken-1")
                            && c.message.contains("manifest unknown")
                    })
                })
        },
    )
    .await;
    fleet
        .wait_for_event(NS, "a WorkerFailed event on the Module", |e| {
            e.reason.as_deref() == Some("WorkerFailed")
                && e.involved_object.kind.as_deref() == Some("Module")
                && e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("manifest unknown"))
        })
        .await;
    // The second attempt comes only after the backoff (10 s after the first failure).
    let first = std::time::Instant::now();
    let attempts = |nmc: Option<NodeModulesConfig>| {
        nmc.map(|nmc| capstan::controllers::failures::WorkerFailures::of(&nmc))
            .and_then(|f| {
                f.get(&ModuleKey::new(NS, "broken").expect("key"))
                    .map(|f| f.attempts)
            })
            .unwrap_or(0)
    };
    assert_eq!(attempts(fleet.nmc("broken-1").await), 1);
    wait_until("a second attempt", || async {
        attempts(fleet.nmc("broken-1").await) >= 2
    })
    .await;
    assert!(
        first.elapsed() >= std::time::Duration::from_secs(5),
        "retried after {:?}, before the backoff",
        first.elapsed()
    );
    assert!(!fleet.loaded("broken-1", "broken_drv").await);
    fleet.stop().await;
}

impl Fleet {
    /// The node runs short of memory, as its kubelet reports it: the `MemoryPressure`
    /// condition, and the `node.kubernetes.io/memory-pressure:NoSchedule` taint that the real
    /// server's node lifecycle controller adds from it (the embedded cluster has no such
    /// controller, so the test adds the taint there).
    async fn run_short_of_memory(&self, node: &str) {
        let api: Api<Node> = Api::all(self.client.clone());
        if self.cluster.simulation().is_some() {
            api.patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": MEMORY_PRESSURE, "effect": "NoSchedule"},
                ]}})),
            )
            .await
            .expect("taint");
        } else {
            common::report_memory_pressure(&self.client, node).await;
        }
        wait_until("the node is tainted for memory pressure", || async {
            self.under_memory_pressure(node).await
        })
        .await;
    }

    async fn under_memory_pressure(&self, node: &str) -> bool {
        let api: Api<Node> = Api::all(self.client.clone());
        api.get(node)
            .await
            .expect("node")
            .spec
            .and_then(|spec| spec.taints)
            .unwrap_or_default()
            .iter()
            .any(|taint| taint.key == MEMORY_PRESSURE && taint.effect == "NoSchedule")
    }

    async fn replace_module_spec(&self, name: &str, spec: Value) {
        let api: Api<Module> = Api::namespaced(self.client.clone(), NS);
        let mut module = api.get(name).await.expect("module");
        module.spec = serde_json::from_value(spec).expect("module spec");
        api.replace(name, &PostParams::default(), &module)
            .await
            .expect("replace module");
    }

    /// Waits for an Event in `namespace` that `wanted` accepts.
    async fn wait_for_event(&self, namespace: &str, what: &str, wanted: impl Fn(&Event) -> bool) {
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        wait_until(what, || async {
            events
                .list(&ListParams::default())
                .await
                .expect("events")
                .items
                .iter()
                .any(&wanted)
        })
        .await;
    }

    async fn wait_loaded(&self, node: &str, modules: &[&str]) {
        wait_until(&format!("{modules:?} loaded on {node}"), || async {
            for &module in modules {
                let ready = ModuleKey::new(NS, module).expect("key").ready_label();
                if self.loaded_image(node, module).await.is_none()
                    || !self.node_labels(node).await.contains_key(&ready)
                {
                    return false;
                }
            }
            true
        })
        .await;
    }
}

const MEMORY_PRESSURE: &str = common::MEMORY_PRESSURE_TAINT;

/// A Module of kernel module `name` (with `-` as `_`) on every `gpu` node, one image for
/// every kernel.
fn any_kernel_module(name: &str) -> Module {
    serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"gpu": "true"},
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": name.replace('-', "_")},
                "kernelMappings": [
                    {"regexp": "^.+$", "containerImage": format!("registry.example/{name}:${{KERNEL_FULL_VERSION}}")},
                ],
            }},
        },
    }))
    .expect("module")
}

/// The kubelet taints a node short of memory; upstream KMM tolerates the pressure taints
/// for every Module, so the node keeps each module loaded and takes new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_under_memory_pressure_keeps_its_modules() {
    let fleet = Fleet::start(&[("pressed-1", FEDORA)], &[]).await;
    let modules = ["nic-drv", "gpu-drv", "fs-drv"];
    for name in modules {
        create_module(&fleet, &any_kernel_module(name)).await;
    }
    fleet.wait_loaded("pressed-1", &modules).await;
    let unloads_before = unloads(&fleet, "pressed-1");

    fleet.run_short_of_memory("pressed-1").await;
    // A Module created under pressure still reaches the node: by then the controllers have
    // seen the taint.
    create_module(&fleet, &any_kernel_module("late-drv")).await;
    fleet.wait_loaded("pressed-1", &["late-drv"]).await;

    assert!(fleet.under_memory_pressure("pressed-1").await);
    let nmc = fleet.nmc("pressed-1").await.expect("nmc");
    for name in modules {
        let key = ModuleKey::new(NS, name).expect("key");
        let entry = nmc.spec_module(&key).expect("entry kept");
        assert!(
            entry
                .tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some(MEMORY_PRESSURE)
                    && t.operator.as_deref() == Some("Exists")
                    && t.effect.as_deref() == Some("NoSchedule")),
            "{name}: {:?}",
            entry.tolerations
        );
        assert!(fleet.loaded("pressed-1", &name.replace('-', "_")).await);
        assert!(
            fleet
                .node_labels("pressed-1")
                .await
                .contains_key(&key.ready_label())
        );
    }
    assert_eq!(unloads(&fleet, "pressed-1"), unloads_before);
    fleet.stop().await;
}

/// Kernel mappings are tried in list order, literals and regexps alike: a regexp listed
/// before an equal literal wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_mappings_are_tried_in_list_order() {
    let fleet = Fleet::start(&[("ordered-1", FEDORA)], &[]).await;
    let module: Module = serde_json::from_value(json!({
        "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
        "kind": "Module",
        "metadata": {"name": "gpu-drv", "namespace": NS},
        "spec": {
            "selector": {"gpu": "true"},
            "moduleLoader": {"container": {
                "modprobe": {"moduleName": "gpu_drv"},
                "kernelMappings": [
                    {"regexp": "^.+$", "containerImage": "registry.example/gpu-drv:any"},
                    {"literal": FEDORA, "containerImage": "registry.example/gpu-drv:fedora"},
                ],
            }},
        },
    }))
    .expect("module");
    create_module(&fleet, &module).await;
    fleet.wait_loaded("ordered-1", &["gpu-drv"]).await;
    assert_eq!(
        fleet.loaded_image("ordered-1", "gpu-drv").await.as_deref(),
        Some("registry.example/gpu-drv:any")
    );
    fleet.stop().await;
}

/// A Module whose `moduleLoader` is removed stops being managed, as upstream's reconciler
/// returns before choosing nodes: what is loaded stays loaded, even on a node its selector
/// has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_without_module_loader_unloads_nothing() {
    let fleet = Fleet::start(&[("kept-1", FEDORA)], &[]).await;
    create_module(&fleet, &any_kernel_module("kept-drv")).await;
    create_module(&fleet, &any_kernel_module("marker-drv")).await;
    fleet
        .wait_loaded("kept-1", &["kept-drv", "marker-drv"])
        .await;
    let unloads_before = unloads(&fleet, "kept-1");

    fleet
        .replace_module_spec("kept-drv", json!({"selector": {"gpu": "none"}}))
        .await;
    // The marker's selector leaves the node after kept-drv lost its loader: once the marker
    // is unloaded, kept-drv's change has long been handled.
    fleet
        .replace_module_spec(
            "marker-drv",
            json!({"selector": {"gpu": "none"}, "moduleLoader": any_kernel_module("marker-drv").spec.module_loader}),
        )
        .await;
    wait_until("the marker is unloaded", || async {
        let key = ModuleKey::new(NS, "marker-drv").expect("key");
        !fleet.loaded("kept-1", "marker_drv").await
            && fleet
                .nmc("kept-1")
                .await
                .is_some_and(|nmc| nmc.spec_module(&key).is_none())
    })
    .await;

    let key = ModuleKey::new(NS, "kept-drv").expect("key");
    let nmc = fleet.nmc("kept-1").await.expect("nmc");
    assert!(nmc.spec_module(&key).is_some(), "{:?}", nmc.spec);
    assert!(fleet.loaded("kept-1", "kept_drv").await);
    assert!(
        fleet
            .node_labels("kept-1")
            .await
            .contains_key(&key.ready_label())
    );
    assert_eq!(
        unloads(&fleet, "kept-1"),
        unloads_before.map(|before| before + 1),
        "only the marker is unloaded"
    );
    fleet.stop().await;
}

/// The worker Events carry upstream's `module` annotation, by which tools filter KMM's
/// Events: `ModuleLoaded` on the Node, annotated `<namespace>/<name>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_events_name_their_module_as_upstream_does() {
    let fleet = Fleet::start(&[("events-1", FEDORA)], &[]).await;
    create_module(&fleet, &any_kernel_module("event-drv")).await;
    fleet.wait_loaded("events-1", &["event-drv"]).await;
    fleet
        .wait_for_event(
            "default",
            "a ModuleLoaded Event annotated with its Module",
            |e| {
                e.reason.as_deref() == Some("ModuleLoaded")
                    && e.involved_object.name.as_deref() == Some("events-1")
                    && e.message.as_deref() == Some("Module kmm/event-drv loaded into the kernel")
                    && e.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get("module"))
                        .map(String::as_str)
                        == Some("kmm/event-drv")
            },
        )
        .await;
    fleet.stop().await;
}

/// A worker pod an upstream KMM install left behind carries its finalizer, which only
/// upstream's controller removed: capstan removes it when it deletes the pod, so the pod
/// goes instead of hanging in Terminating and holding the name of the next worker pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_pod_upstream_kmm_left_is_freed_of_its_finalizer_and_deleted() {
    common::requires_stand_in("simulated kubelet, which runs a pod made by hand to its end");
    let fleet = Fleet::start(&[("migrated-1", FEDORA)], &[]).await;
    create_module(&fleet, &any_kernel_module("legacy-drv")).await;
    fleet.wait_loaded("migrated-1", &["legacy-drv"]).await;
    wait_until("capstan's own worker pods are gone", || async {
        fleet.worker_pods().await.is_empty()
    })
    .await;

    // The loader upstream KMM would have made for the same config, with its finalizer.
    let nmc = fleet.nmc("migrated-1").await.expect("nmc");
    let key = ModuleKey::new(NS, "legacy-drv").expect("key");
    let config =
        serde_saphyr::to_string(&nmc.spec_module(&key).expect("spec").config).expect("config YAML");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": key.worker_pod_name("migrated-1"),
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/name": "kmm",
                "app.kubernetes.io/component": "worker",
                "app.kubernetes.io/part-of": "kmm",
                labels::MODULE_NAME_LABEL: "legacy-drv",
                labels::WORKER_ACTION_LABEL: "Load",
            },
            "annotations": {labels::WORKER_CONFIG_ANNOTATION: config},
            "finalizers": [labels::WORKER_POD_FINALIZER],
            "ownerReferences": [{
                "apiVersion": "kmm.sigs.x-k8s.io/v1beta1",
                "kind": "NodeModulesConfig",
                "name": "migrated-1",
                "uid": nmc.metadata.uid.clone().expect("nmc uid"),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": "migrated-1",
            "restartPolicy": "OnFailure",
            "containers": [{"name": "worker", "image": "registry.example/kmm-worker:v2.6.0"}],
        },
    }))
    .expect("pod");
    let pods: Api<Pod> = Api::namespaced(fleet.client.clone(), NS);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the upstream pod");
    wait_until("the upstream pod is read, freed and gone", || async {
        pods.get_opt(&key.worker_pod_name("migrated-1"))
            .await
            .expect("get pod")
            .is_none()
    })
    .await;
    assert!(fleet.loaded("migrated-1", "legacy_drv").await);
    assert!(
        fleet
            .node_labels("migrated-1")
            .await
            .contains_key(&key.ready_label())
    );
    fleet.stop().await;
}
