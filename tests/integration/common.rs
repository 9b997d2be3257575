//! The shared test support under one name (waits, Git repositories and fleet manifests
//! from `capstan_testing`, the embedded cluster's test helpers from
//! `capstan_cluster::testing`), the cluster the tests run against, and what only capstan's
//! own tests need.
//!
//! Every test runs against the embedded cluster, or, with `CAPSTAN_TEST_SERVER=real`, a
//! real control plane of its own (`capstan_real_cluster`: kube-apiserver, its controllers
//! and kwok nodes). A test that needs what only the embedded cluster has (the simulated
//! kernel-module table, injected faults, the `capstan cluster` command) says so with
//! [`requires_stand_in`]; `.ci/run` leaves those out of the real server's run
//! (`tests/integration/stand-in-only.txt`).

use std::sync::Arc;

pub use capstan_cluster::testing::is_ready;
pub use capstan_testing::*;

use capstan_cluster::sim::Simulation;
use capstan_cluster::sim::config::ClusterConfig;
use capstan_cluster::{ClusterOptions, EmbeddedCluster};
use capstan_real_cluster::ControlPlane;

/// The environment variable that picks the server: `real`, or unset (or `embedded`) for
/// the embedded cluster.
pub const SERVER_ENV: &str = "CAPSTAN_TEST_SERVER";

/// Whether this run is against a real kube-apiserver.
pub fn on_real_server() -> bool {
    match std::env::var(SERVER_ENV).as_deref() {
        Ok("real") => true,
        Ok("" | "embedded") | Err(_) => false,
        Ok(other) => panic!("{SERVER_ENV}={other}: expected `real` or `embedded`"),
    }
}

/// Fails a test that needs the embedded cluster's `what` when it runs on a real server:
/// such a test belongs in `stand-in-only.txt`.
pub fn requires_stand_in(what: &str) {
    assert!(
        !on_real_server(),
        "this test needs the embedded cluster's {what}: list it in \
         tests/integration/stand-in-only.txt"
    );
}

/// The cluster a test runs against.
pub enum TestCluster {
    Embedded(EmbeddedCluster),
    Real(ControlPlane),
}

impl TestCluster {
    /// A kubeconfig for it.
    pub fn kubeconfig(&self) -> String {
        match self {
            TestCluster::Embedded(cluster) => cluster.kubeconfig(),
            TestCluster::Real(plane) => plane.kubeconfig(),
        }
    }

    /// The simulated nodes, on the embedded cluster only.
    pub fn simulation(&self) -> Option<&Arc<Simulation>> {
        match self {
            TestCluster::Embedded(cluster) => cluster.simulation(),
            TestCluster::Real(_) => None,
        }
    }

    /// Stops it.
    pub async fn shutdown(self) {
        match self {
            TestCluster::Embedded(cluster) => cluster.shutdown().await,
            TestCluster::Real(plane) => plane.shutdown().await,
        }
    }
}

/// A cluster without nodes, and its client.
pub async fn start() -> (TestCluster, kube::Client) {
    start_simulated(ClusterConfig {
        nodes: Vec::new(),
        ..ClusterConfig::default()
    })
    .await
}

/// A cluster with the nodes of `config` (simulated on the embedded cluster, kwok's on a
/// real one).
pub async fn start_simulated(config: ClusterConfig) -> (TestCluster, kube::Client) {
    if on_real_server() {
        let mut plane = boot_plane(&config.broken_images)
            .await
            .unwrap_or_else(|err| panic!("the real control plane starts: {err:#}"));
        plane
            .add_nodes(&config)
            .await
            .unwrap_or_else(|err| panic!("the real control plane's nodes register: {err:#}"));
        let client = plane.client().await.expect("client");
        return (TestCluster::Real(plane), client);
    }
    let (cluster, client) = if config.nodes.is_empty() && config.workloads.is_empty() {
        capstan_cluster::testing::start().await
    } else {
        capstan_cluster::testing::start_simulated(config).await
    };
    (TestCluster::Embedded(cluster), client)
}

/// A control plane without nodes, with capstan's CRDs: the embedded cluster serves
/// capstan's kinds from the start, and a user of a real one applies `capstan crds` first.
async fn boot_plane(broken_images: &[String]) -> anyhow::Result<ControlPlane> {
    ControlPlane::boot(&plane_options(), broken_images).await
}

/// How the tests' control planes start: with capstan's CRDs, and the components' garbage
/// collectors held off until kube-apiserver's heap reaches 1 GiB and each other's 256 MiB
/// (a plane lives for one test, and eight at a time fit the machine's memory).
pub fn plane_options() -> capstan_real_cluster::Options {
    capstan_real_cluster::Options {
        crds: capstan_api::crds::all(),
        heap_limits: Some(capstan_real_cluster::HeapLimits {
            apiserver: "1GiB".into(),
            others: "256MiB".into(),
        }),
        ..Default::default()
    }
}

/// The default cluster: a control-plane node and three workers.
pub async fn start_default_simulated() -> (TestCluster, kube::Client) {
    start_simulated(ClusterConfig::default_cluster()).await
}

/// The embedded cluster started with `options`; on a real server, options other than
/// the default ones (faults, persistence) are the embedded cluster's own.
pub async fn start_with(options: ClusterOptions) -> (TestCluster, kube::Client) {
    if on_real_server() {
        let ClusterOptions {
            faults,
            state_dir,
            simulation,
            capstan_crds: true,
            ..
        } = &options
        else {
            panic!("a real server always has capstan's CRDs here");
        };
        if *faults == capstan_cluster::faults::FaultSettings::default() && state_dir.is_none() {
            return start_simulated(simulation.clone().unwrap_or_default()).await;
        }
        requires_stand_in("options (faults, persistence)");
    }
    let (cluster, client) = capstan_cluster::testing::start_with(options).await;
    (TestCluster::Embedded(cluster), client)
}

/// What moves with every write to the cluster, background writers' aside. On the
/// embedded cluster, its resourceVersion. On a real server the global revision also moves
/// with what the cluster's own components write on their own (the Leases kwok's kubelets
/// and kube-apiserver renew, the node status kwok reports, the `default` ServiceAccount
/// and `kube-root-ca.crt` the controller-manager adds to a new namespace, its Events), so
/// it is a digest of every other object's resourceVersion (deletions and creations
/// included), and of each Node's labels, annotations and spec.
pub async fn cluster_revision(client: &kube::Client) -> String {
    use kube::discovery::{Discovery, verbs};
    if !on_real_server() {
        return capstan_cluster::testing::cluster_revision(client).await;
    }
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    let mut seen = Vec::new();
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if !capabilities.supports_operation(verbs::LIST)
                || resource.kind == "Lease"
                || resource.kind == "Node"
            {
                continue;
            }
            let api: kube::Api<kube::api::DynamicObject> =
                kube::Api::all_with(client.clone(), &resource);
            let list = api
                .list_metadata(&kube::api::ListParams::default())
                .await
                .unwrap_or_else(|err| panic!("list {}: {err}", resource.plural));
            for item in list.items {
                if written_by_the_cluster_alone(&item.metadata) {
                    continue;
                }
                seen.push(format!(
                    "{}/{}/{}/{}/{}",
                    resource.group,
                    resource.plural,
                    item.metadata.namespace.unwrap_or_default(),
                    item.metadata.name.unwrap_or_default(),
                    item.metadata.resource_version.unwrap_or_default()
                ));
            }
        }
    }
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    for node in nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
    {
        seen.push(format!(
            "node/{}/{:?}/{:?}/{}",
            node.metadata.name.as_deref().unwrap_or_default(),
            node.metadata.labels,
            annotations_not_of_components(&node.metadata),
            serde_json::to_string(&node.spec).expect("node spec")
        ));
    }
    seen.sort();
    capstan_api::canonical::sha256_hex(seen.join("\n").as_bytes(), 32)
}

/// An object's annotations without those of Kubernetes' own domains (`*.kubernetes.io`,
/// `*.k8s.io`, `kwok.x-k8s.io`): the controller-manager's TTL controller annotates each
/// Node with `node.alpha.kubernetes.io/ttl` when it gets to it, which no sync caused.
pub fn annotations_not_of_components(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> std::collections::BTreeMap<String, String> {
    let of_components = |key: &str| {
        key.split_once('/').is_some_and(|(domain, _)| {
            domain == "kubernetes.io"
                || domain.ends_with(".kubernetes.io")
                || domain == "k8s.io"
                || domain.ends_with(".k8s.io")
                || domain.ends_with(".x-k8s.io")
        })
    };
    meta.annotations
        .iter()
        .flatten()
        .filter(|(key, _)| !of_components(key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// Whether only the cluster's own components ever wrote the object (as the
/// controller-manager's `kube-root-ca.crt` in each namespace, made whenever it gets to it).
pub fn written_by_the_cluster_alone(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> bool {
    const COMPONENTS: [&str; 4] = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ];
    meta.managed_fields.as_ref().is_some_and(|entries| {
        !entries.is_empty()
            && entries.iter().all(|entry| {
                entry
                    .manager
                    .as_deref()
                    .is_some_and(|manager| COMPONENTS.contains(&manager))
            })
    })
}

/// A syncer of the repository at `repo` into the cluster of `client`.
pub async fn syncer(client: &kube::Client, repo: &std::path::Path) -> capstan::sync::run::Syncer {
    let state = tempfile::tempdir().expect("tempdir");
    let source = capstan::sync::source::Source::open(
        repo.to_str().expect("utf-8 path"),
        "main",
        None,
        state.path(),
        capstan::sync::source::Auth::None,
    )
    .expect("source opens");
    capstan::sync::run::Syncer::start(
        client.clone(),
        source,
        capstan::sync::run::SyncOptions::default(),
        std::sync::Arc::new(capstan::sync::metrics::Metrics::new()),
    )
    .await
    .expect("syncer starts")
}

/// The taint the node lifecycle controller puts on a node whose kubelet reports memory
/// pressure.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// Node `node`'s kubelet reports memory pressure (the `MemoryPressure` condition), as a
/// kubelet short of memory does; on a real server the node lifecycle controller then taints
/// the node with [`MEMORY_PRESSURE_TAINT`].
pub async fn report_memory_pressure(client: &kube::Client, node: &str) {
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Strategic(serde_json::json!({"status": {"conditions": [{
            "type": "MemoryPressure",
            "status": "True",
            "reason": "KubeletHasInsufficientMemory",
            "message": "kubelet has insufficient memory available",
        }]}})),
    )
    .await
    .expect("memory pressure");
}
