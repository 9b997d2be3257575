//! Draining a simulated node: cordoning taints it, evictions honour the workload's
//! PodDisruptionBudget, a stuck pod ignores termination until deleted with grace 0, a
//! pod held by a finalizer stays until the finalizer goes, and a whole drain (the API
//! calls `kubectl drain` makes, and `kubectl drain` itself when asked) waits for the
//! budget.

use crate::common;

use std::time::Duration;

use tokio::time::Instant;

use capstan_cluster::EmbeddedCluster;
use capstan_cluster::sim::config::ClusterConfig;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;

const CONFIG: &str = r#"
nodes:
  - {name: worker-1}
  - {name: worker-2}
  - {name: worker-3}
workloads:
  - {name: web, namespace: apps, replicas: 3, pdb: {minAvailable: 3}}
  - name: leftovers
    namespace: apps
    pods:
      - {node: worker-1, stuck: true}
      - {node: worker-1, finalizers: [example.dev/hold]}
      - {node: worker-1}
"#;

async fn cordon(client: &kube::Client, node: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("cordon");
}

async fn web_pods(client: &kube::Client) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "apps")
        .list(&ListParams::default().labels("app=web"))
        .await
        .expect("list")
        .items
}

/// The node of some web pod (the scheduler spreads them; which one is not fixed).
async fn node_of_a_web_pod(client: &kube::Client) -> String {
    web_pods(client).await[0]
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("bound")
}

fn on(pods: &[Pod], node: &str) -> Option<String> {
    pods.iter()
        .find(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.metadata.deletion_timestamp.is_none()
        })
        .and_then(|p| p.metadata.name.clone())
}

#[tokio::test]
async fn cordoning_taints_the_node_with_the_time() {
    let (_cluster, client) = common::start_default_simulated().await;
    cordon(&client, "worker-2").await;
    let nodes = Api::<Node>::all(client.clone());
    common::wait_until("unschedulable taint", || async {
        nodes
            .get("worker-2")
            .await
            .ok()
            .and_then(|n| n.spec)
            .and_then(|s| s.taints)
            .is_some_and(|t| {
                t.iter().any(|t| {
                    t.key == "node.kubernetes.io/unschedulable"
                        && t.effect == "NoSchedule"
                        && t.time_added.is_some()
                })
            })
    })
    .await;
    nodes
        .patch(
            "worker-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": null}})),
        )
        .await
        .expect("uncordon");
    common::wait_until("taint removed", || async {
        nodes
            .get("worker-2")
            .await
            .ok()
            .and_then(|n| n.spec)
            .is_some_and(|s| s.taints.unwrap_or_default().is_empty())
    })
    .await;
}

#[tokio::test]
async fn evictions_respect_the_budget_and_drain_once_it_allows() {
    let config = ClusterConfig::parse(CONFIG, "test").expect("config");
    let (_cluster, client) = common::start_simulated(config).await;
    common::wait_until("three web pods ready", || async {
        web_pods(&client)
            .await
            .iter()
            .filter(|p| common::is_ready(p))
            .count()
            == 3
    })
    .await;
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), "apps");
    common::wait_until("the budget's status counts three healthy", || async {
        budgets
            .get("web")
            .await
            .ok()
            .and_then(|b| b.status)
            .is_some_and(|s| s.current_healthy == Some(3))
    })
    .await;
    let target = node_of_a_web_pod(&client).await;
    cordon(&client, &target).await;
    let victim = on(&web_pods(&client).await, &target).expect("a web pod on the target");
    let pods = Api::<Pod>::namespaced(client.clone(), "apps");
    match pods.evict(&victim, &EvictParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 429),
        other => panic!("minAvailable 3 of 3 must refuse, got {other:?}"),
    }
    assert!(
        pods.get(&victim)
            .await
            .expect("kept")
            .metadata
            .deletion_timestamp
            .is_none()
    );
    budgets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": 2}})),
        )
        .await
        .expect("relax the budget");
    common::wait_until("the eviction goes through", || async {
        pods.evict(&victim, &EvictParams::default()).await.is_ok()
    })
    .await;
    common::wait_until(
        "the evicted pod is recreated on another node, ready",
        || async {
            pods.get_opt(&victim).await.expect("get").is_some_and(|p| {
                common::is_ready(&p)
                    && p.metadata.deletion_timestamp.is_none()
                    && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(target.as_str())
            })
        },
    )
    .await;
}

#[tokio::test]
async fn stuck_and_finalizer_pods_outlast_a_drain() {
    let config = ClusterConfig::parse(CONFIG, "test").expect("config");
    let (_cluster, client) = common::start_simulated(config).await;
    let pods = Api::<Pod>::namespaced(client.clone(), "apps");
    for name in ["leftovers-0", "leftovers-1", "leftovers-2"] {
        common::wait_for_pod(&client, "apps", name, "leftover running", common::is_ready).await;
    }
    cordon(&client, "worker-1").await;
    for name in ["leftovers-0", "leftovers-1", "leftovers-2"] {
        pods.evict(name, &EvictParams::default())
            .await
            .expect("no budget covers leftovers");
    }
    // The plain pod going proves the kubelet processed the terminations.
    common::wait_until("the plain pod is gone", || async {
        pods.get_opt("leftovers-2").await.expect("get").is_none()
    })
    .await;
    common::wait_until("the finalizer pod stopped, held", || async {
        pods.get("leftovers-1")
            .await
            .is_ok_and(|p| p.metadata.deletion_grace_period_seconds == Some(0))
    })
    .await;
    let stuck = pods
        .get("leftovers-0")
        .await
        .expect("stuck pod still there");
    assert!(stuck.metadata.deletion_timestamp.is_some());
    assert_ne!(
        stuck.metadata.deletion_grace_period_seconds,
        Some(0),
        "the kubelet ignored the stuck pod"
    );
    pods.delete(
        "leftovers-0",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("force");
    pods.patch(
        "leftovers-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("release");
    common::wait_until("both gone", || async {
        pods.get_opt("leftovers-0").await.expect("get").is_none()
            && pods.get_opt("leftovers-1").await.expect("get").is_none()
    })
    .await;
}

/// How long `kubectl drain` waits before evicting a pod its budget protected again.
const EVICTION_RETRY: Duration = Duration::from_secs(5);

/// How often a drain looks whether an evicted pod is gone.
const DELETION_POLL: Duration = Duration::from_millis(100);

/// `kubectl drain <node> --ignore-daemonsets --timeout=<timeout>`, made of the API calls
/// kubectl makes: cordon the node, list its pods by `spec.nodeName`, leave DaemonSet pods,
/// evict each other pod (retrying a budget's 429 every five seconds), then wait until
/// each evicted pod is gone or replaced under its name. Fails, with the last refusal,
/// when the drain cannot finish within `timeout`.
async fn drain(client: &kube::Client, node: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let incomplete = |why: &str| format!("drain did not complete within {timeout:?}: {why}");
    cordon(client, node).await;
    let on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|err| err.to_string())?
        .items;
    let mut evicted = Vec::new();
    for pod in on_node.iter().filter(|pod| !owned_by_a_daemon_set(pod)) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let pods = Api::<Pod>::namespaced(client.clone(), namespace);
        loop {
            match pods.evict(name, &EvictParams::default()).await {
                Ok(_) => break,
                Err(kube::Error::Api(status)) if status.code == 404 => break,
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    if Instant::now() + EVICTION_RETRY > deadline {
                        return Err(incomplete(&status.message));
                    }
                    tokio::time::sleep(EVICTION_RETRY).await;
                }
                Err(err) => return Err(err.to_string()),
            }
        }
        evicted.push((pods, name.to_string(), pod.metadata.uid.clone()));
    }
    for (pods, name, uid) in evicted {
        loop {
            let current = pods.get_opt(&name).await.map_err(|err| err.to_string())?;
            if current.is_none_or(|pod| pod.metadata.uid != uid) {
                break;
            }
            if Instant::now() >= deadline {
                return Err(incomplete(&format!("pod {name} is still terminating")));
            }
            tokio::time::sleep(DELETION_POLL).await;
        }
    }
    Ok(())
}

fn owned_by_a_daemon_set(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.controller == Some(true) && owner.kind == "DaemonSet")
}

/// A cluster whose three web pods are ready behind a budget of three, with the
/// leftovers (which would hold a drain forever) removed, and the node of one web pod
/// to drain.
async fn ready_to_drain() -> (EmbeddedCluster, kube::Client, String) {
    let config = ClusterConfig::parse(CONFIG, "test").expect("config");
    let (cluster, client) = common::start_simulated(config).await;
    common::wait_until("three web pods ready", || async {
        web_pods(&client)
            .await
            .iter()
            .filter(|p| common::is_ready(p))
            .count()
            == 3
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), "apps");
    for name in ["leftovers-0", "leftovers-1", "leftovers-2"] {
        let _ = pods
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = pods
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                },
            )
            .await;
    }
    let target = node_of_a_web_pod(&client).await;
    (cluster, client, target)
}

async fn relax_the_budget(client: &kube::Client) {
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "apps")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": 2}})),
        )
        .await
        .expect("relax the budget");
}

#[tokio::test]
async fn a_drain_waits_for_the_budget_and_then_empties_the_node() {
    let (_cluster, client, target) = ready_to_drain().await;
    let refused = drain(&client, &target, Duration::from_secs(5))
        .await
        .expect_err("minAvailable 3 of 3 must stop the drain");
    assert!(refused.contains("disruption budget"), "{refused}");
    relax_the_budget(&client).await;
    drain(&client, &target, Duration::from_secs(120))
        .await
        .expect("the drain completes once the budget allows it");
    assert!(on(&web_pods(&client).await, &target).is_none());
}

/// `kubectl drain` itself against the embedded cluster: the same story as
/// [`a_drain_waits_for_the_budget_and_then_empties_the_node`], checking that kubectl's
/// own client finds the API it expects. kubectl is the one of the real control plane's
/// release, built with Go by `hack/real-cluster/build-kubectl`: `hack/test` runs it first,
/// so here it finds the build; run alone, this test builds it.
#[tokio::test]
async fn kubectl_drain_respects_the_budget() {
    let kubectl = build_kubectl();
    let (cluster, client, target) = ready_to_drain().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.kubeconfig()).expect("kubeconfig");
    let drain = |timeout: &str| {
        let output = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "drain",
                &target,
                "--ignore-daemonsets",
                &format!("--timeout={timeout}"),
            ])
            .output();
        async move {
            tokio::time::timeout(Duration::from_secs(180), output)
                .await
                .expect("kubectl finished")
                .expect("kubectl ran")
        }
    };
    let refused = drain("5s").await;
    assert!(
        !refused.status.success(),
        "minAvailable 3 of 3 must stop the drain"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("disruption budget"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    relax_the_budget(&client).await;
    let drained = drain("120s").await;
    assert!(
        drained.status.success(),
        "kubectl drain failed: {}",
        String::from_utf8_lossy(&drained.stderr)
    );
    assert!(on(&web_pods(&client).await, &target).is_none());
}

/// kubectl's path, from `hack/real-cluster/build-kubectl` (a no-op when it is built).
pub(crate) fn build_kubectl() -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hack/real-cluster/build-kubectl");
    let output = std::process::Command::new(&script)
        .output()
        .unwrap_or_else(|err| panic!("running {}: {err}", script.display()));
    assert!(
        output.status.success(),
        "{} failed (it needs Go):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}
