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
    let events: Api<Event> = Api::namespaced(fleet.client.clone(), NS);
    wait_until("a WorkerFailed event on the Module", || async {
        events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("WorkerFailed")
                    && e.involved_object.kind.as_deref() == Some("Module")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("manifest unknown"))
            })
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
