//! The controllers' one way to watch and cache: one watch per kind, however many
//! controllers read it. Every controller takes its triggers and its reads from here; none
//! opens a watch of its own.
//!
//! Each cache is a kube runtime reflector store fed by one watcher; every controller that
//! needs the kind subscribes to the cache's stream of changed objects (its trigger) and
//! reads the store for everything else. [`Caches::start`] begins the watches once every
//! subscriber is in place, so no subscriber misses the initial list.
//!
//! The streams are fed here rather than by kube's shared reflector (`reflect_shared`),
//! whose subscriber streams leave out deletions (kube-rs issue 1590) and stop for good
//! when an object is deleted before the subscriber reads it: the subscriber looks the
//! object up in the store and, finding none, returns `Pending` without a wake-up. Here
//! each subscriber receives the object itself, deleted ones included (those a relist no
//! longer finds too).
//!
//! A cache holds what the controllers read of an object, not all of it: managedFields are
//! never decoded (see [`Lean`]), nor most of a worker pod and a Node's image list (see
//! [`WorkerPodParts`], [`NodeParts`]). A controller that needs another field adds it there.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::controllers::lws;
use crate::controllers::skipped_fields::{Lean, LeftOut, ManagedFields, NodeParts, WorkerPodParts};
use capstan_api::capstan::SYSTEM_NAMESPACE;
use capstan_api::labels;
use capstan_api::module::Module;
use capstan_api::nmc::NodeModulesConfig;
use capstan_api::{GitSync, LeaderWorkerSet, UpgradeConfig};

/// Changes a subscriber may fall behind by before the watch waits for it.
const BUFFER: usize = 4096;

/// One kind's store, its writer and subscribers until the watch starts, and its API.
pub struct Cache<K, L = ManagedFields>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    /// What the watch has seen.
    pub store: Store<K>,
    ready: tokio::sync::watch::Receiver<bool>,
    ready_tx: Option<tokio::sync::watch::Sender<bool>>,
    writer: Option<reflector::store::Writer<K>>,
    subscribers: Mutex<Option<Vec<mpsc::Sender<Arc<K>>>>>,
    /// Whether a controller subscribed or reads the store: a kind nobody uses is not
    /// watched.
    wanted: AtomicBool,
    /// Watched as [`Lean`]: what `L` leaves out, which nothing reads, is never decoded.
    api: Api<Lean<K, L>>,
    config: watcher::Config,
    /// For a kind not every cluster serves: its `group/version` and plural, looked up in
    /// discovery before the watch starts.
    optional: Option<(&'static str, &'static str)>,
    /// Whether the cluster serves the kind; known once the cache is ready.
    served: Arc<AtomicBool>,
}

impl<K, L> Cache<K, L>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    L: LeftOut + Clone + Debug + Send + Sync + 'static,
{
    fn new(api: Api<Lean<K, L>>, config: watcher::Config) -> Cache<K, L> {
        let (store, writer) = reflector::store();
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        Cache {
            store,
            ready,
            ready_tx: Some(ready_tx),
            writer: Some(writer),
            subscribers: Mutex::new(Some(Vec::new())),
            wanted: AtomicBool::new(false),
            api,
            config,
            optional: None,
            served: Arc::new(AtomicBool::new(true)),
        }
    }

    /// A cache of a kind the cluster may not serve (`group/version` and plural): when
    /// discovery does not list it, nothing is watched, the cache is ready and empty, and
    /// [`Cache::served`] says so.
    fn optional(
        api: Api<Lean<K, L>>,
        config: watcher::Config,
        api_version: &'static str,
        plural: &'static str,
    ) -> Cache<K, L> {
        let mut cache = Cache::new(api, config);
        cache.optional = Some((api_version, plural));
        cache
    }

    /// Whether the cluster serves the kind; meaningful once the cache is ready.
    pub fn served(&self) -> Arc<AtomicBool> {
        self.served.clone()
    }

    /// A stream of every object the watch applies or deletes from now on (after the start,
    /// the initial list too); a deleted object comes as last seen.
    ///
    /// # Panics
    /// After [`Caches::start`]: subscribers must be in place before the watch starts.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.wanted.store(true, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel(BUFFER);
        self.subscribers
            .lock()
            .expect("subscribers lock")
            .as_mut()
            .expect("subscribe to a cache before it starts")
            .push(sender);
        receiver
    }

    /// The store, and whether its initial list is in, for a controller that reads it.
    pub fn reader(&self) -> (Store<K>, tokio::sync::watch::Receiver<bool>) {
        self.wanted.store(true, Ordering::Relaxed);
        (self.store.clone(), self.ready.clone())
    }

    fn start(&mut self, tasks: &mut tokio::task::JoinSet<()>) {
        if !self.wanted.load(Ordering::Relaxed) {
            return;
        }
        let subscribers = self.subscribers.lock().expect("subscribers lock").take();
        let (Some(writer), Some(ready), Some(mut subscribers)) =
            (self.writer.take(), self.ready_tx.take(), subscribers)
        else {
            return;
        };
        let store = self.store.clone();
        let optional = self.optional;
        let served = self.served.clone();
        let client: Client = self.api.clone().into();
        let mut events = watcher(self.api.clone(), self.config.clone())
            .default_backoff()
            .map_ok(whole)
            .reflect(writer)
            .boxed();
        tasks.spawn(async move {
            if let Some((api_version, plural)) = optional
                && !serves(&client, api_version, plural).await
            {
                tracing::info!(
                    api_version,
                    plural,
                    "not served by the cluster; not watched"
                );
                served.store(false, Ordering::Relaxed);
                ready.send_replace(true);
                return;
            }
            // What the store held when a relist began: what the relist does not bring back
            // was deleted meanwhile, and subscribers are told so.
            let mut before_relist: Vec<Arc<K>> = Vec::new();
            while let Some(event) = events.next().await {
                let changed: Vec<Arc<K>> = match event {
                    Err(err) => {
                        tracing::warn!(%err, "watch failed; retrying");
                        continue;
                    }
                    // The store holds the object now; subscribers share its copy.
                    Ok(watcher::Event::Apply(object)) => vec![
                        store
                            .get(&ObjectRef::from_obj(&object))
                            .unwrap_or_else(|| Arc::new(object)),
                    ],
                    Ok(watcher::Event::Delete(object)) => vec![Arc::new(object)],
                    // The store swaps in the relisted objects at InitDone.
                    Ok(watcher::Event::Init) => {
                        before_relist = store.state();
                        continue;
                    }
                    Ok(watcher::Event::InitApply(_)) => continue,
                    // The store's own readiness wakes only one waiter; this one wakes them all.
                    Ok(watcher::Event::InitDone) => {
                        ready.send_replace(true);
                        let mut changed = store.state();
                        changed.extend(std::mem::take(&mut before_relist).into_iter().filter(
                            |object| store.get(&ObjectRef::from_obj(object.as_ref())).is_none(),
                        ));
                        changed
                    }
                };
                for object in changed {
                    for subscriber in &mut subscribers {
                        // A subscriber that is gone (its controller stopped) is skipped.
                        let _ = subscriber.send(object.clone()).await;
                    }
                }
            }
        });
    }
}

/// Whether discovery lists `plural` in `api_version`; a failed lookup (the group is not
/// served: 404) counts as not served.
async fn serves(client: &Client, api_version: &str, plural: &str) -> bool {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => list
            .resources
            .iter()
            .any(|resource| resource.name == plural),
        Err(err) => {
            tracing::debug!(%err, api_version, "discovery");
            false
        }
    }
}

/// A watch event of `Lean` objects as one of the objects themselves.
fn whole<K, L>(event: watcher::Event<Lean<K, L>>) -> watcher::Event<K> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(object.into_inner()),
        watcher::Event::Delete(object) => watcher::Event::Delete(object.into_inner()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(object.into_inner()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The kinds the controllers watch, each watched once.
pub struct Caches {
    /// Every Node.
    pub nodes: Cache<Node, NodeParts>,
    /// Every Module.
    pub modules: Cache<Module>,
    /// Every NodeModulesConfig.
    pub nmcs: Cache<NodeModulesConfig>,
    /// The KMM worker pods, in every namespace.
    pub worker_pods: Cache<Pod, WorkerPodParts>,
    /// The device-plugin DaemonSets, in every namespace.
    pub daemon_sets: Cache<DaemonSet>,
    /// The device-plugin pods, in every namespace.
    pub device_plugin_pods: Cache<Pod>,
    /// The DRA driver DaemonSets, in every namespace.
    pub dra_daemon_sets: Cache<DaemonSet>,
    /// The DRA driver pods, in every namespace.
    pub dra_pods: Cache<Pod>,
    /// The DeviceClasses labelled for a Module, where the cluster serves
    /// `resource.k8s.io/v1` (Kubernetes 1.34 and later).
    pub device_classes: Cache<DeviceClass>,
    /// The `GitSync`s in `capstan-system`: the ordered-upgrade policies.
    pub syncs: Cache<GitSync>,
    /// Every `UpgradeConfig`: the upgrade campaigns.
    pub upgrade_configs: Cache<UpgradeConfig>,
    /// Every `LeaderWorkerSet`.
    pub leader_worker_sets: Cache<LeaderWorkerSet>,
    /// The StatefulSets of LeaderWorkerSets (leader and worker sets), in every namespace.
    pub lws_stateful_sets: Cache<StatefulSet>,
    /// The pods of LeaderWorkerSets, in every namespace.
    pub lws_pods: Cache<Pod>,
    tasks: tokio::task::JoinSet<()>,
}

impl Caches {
    /// Caches on `client`; nothing is watched until [`Caches::start`].
    pub fn new(client: &Client) -> Caches {
        let worker_pods = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::COMPONENT_LABEL,
            labels::WORKER_COMPONENT
        ));
        let device_plugins = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::ROLE_LABEL,
            labels::DEVICE_PLUGIN_ROLE
        ));
        let dra_drivers = watcher::Config::default().labels(&format!(
            "{}={}",
            labels::ROLE_LABEL,
            labels::DRA_ROLE
        ));
        let lws_members = watcher::Config::default().labels(lws::labels::NAME_LABEL);
        Caches {
            nodes: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            modules: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            nmcs: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            worker_pods: Cache::new(Api::all(client.clone()), worker_pods),
            daemon_sets: Cache::new(Api::all(client.clone()), device_plugins.clone()),
            device_plugin_pods: Cache::new(Api::all(client.clone()), device_plugins),
            dra_daemon_sets: Cache::new(Api::all(client.clone()), dra_drivers.clone()),
            dra_pods: Cache::new(Api::all(client.clone()), dra_drivers),
            device_classes: Cache::optional(
                Api::all(client.clone()),
                watcher::Config::default().labels(labels::MODULE_NAME_LABEL),
                "resource.k8s.io/v1",
                "deviceclasses",
            ),
            syncs: Cache::new(
                Api::namespaced(client.clone(), SYSTEM_NAMESPACE),
                watcher::Config::default(),
            ),
            upgrade_configs: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            leader_worker_sets: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            lws_stateful_sets: Cache::new(Api::all(client.clone()), lws_members.clone()),
            lws_pods: Cache::new(Api::all(client.clone()), lws_members),
            tasks: tokio::task::JoinSet::new(),
        }
    }

    /// Starts the watches of the kinds a controller subscribed to or reads; they run until
    /// the caches are dropped.
    pub fn start(&mut self) {
        self.nodes.start(&mut self.tasks);
        self.modules.start(&mut self.tasks);
        self.nmcs.start(&mut self.tasks);
        self.worker_pods.start(&mut self.tasks);
        self.daemon_sets.start(&mut self.tasks);
        self.device_plugin_pods.start(&mut self.tasks);
        self.dra_daemon_sets.start(&mut self.tasks);
        self.dra_pods.start(&mut self.tasks);
        self.device_classes.start(&mut self.tasks);
        self.syncs.start(&mut self.tasks);
        self.upgrade_configs.start(&mut self.tasks);
        self.leader_worker_sets.start(&mut self.tasks);
        self.lws_stateful_sets.start(&mut self.tasks);
        self.lws_pods.start(&mut self.tasks);
    }
}

/// The stores a reconciler reads, cheap to clone.
#[derive(Clone)]
pub struct Stores {
    /// Every Node.
    pub nodes: Store<Node>,
    /// Every Module.
    pub modules: Store<Module>,
    /// Every NodeModulesConfig.
    pub nmcs: Store<NodeModulesConfig>,
    /// The KMM worker pods.
    pub worker_pods: Store<Pod>,
    ready: [tokio::sync::watch::Receiver<bool>; 4],
}

impl Stores {
    /// The stores of `caches`.
    pub fn of(caches: &Caches) -> Arc<Stores> {
        let (nodes, nodes_ready) = caches.nodes.reader();
        let (modules, modules_ready) = caches.modules.reader();
        let (nmcs, nmcs_ready) = caches.nmcs.reader();
        let (worker_pods, worker_pods_ready) = caches.worker_pods.reader();
        Arc::new(Stores {
            nodes,
            modules,
            nmcs,
            worker_pods,
            ready: [nodes_ready, modules_ready, nmcs_ready, worker_pods_ready],
        })
    }

    /// The readiness of every store, for [`Runner::reads`](super::runner::Runner::reads):
    /// a reconciler must not decide on a store that has not been filled yet (an empty
    /// Module store would look like every Module was deleted).
    pub fn readiness(&self) -> impl Iterator<Item = tokio::sync::watch::Receiver<bool>> + '_ {
        self.ready.iter().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::nmc::WorkerPod;
    use serde_json::json;

    fn worker_pod() -> serde_json::Value {
        json!({
            "metadata": {
                "name": "kmm-worker-n1-kmod", "namespace": "ns", "uid": "u1",
                "labels": {
                    labels::COMPONENT_LABEL: labels::WORKER_COMPONENT,
                    labels::MODULE_NAME_LABEL: "kmod",
                    labels::WORKER_ACTION_LABEL: "Load",
                },
                "annotations": {
                    labels::WORKER_CONFIG_ANNOTATION: "kernelVersion: 6.1.0\ncontainerImage: r/kmod:6.1.0\nmodprobe:\n  moduleName: kmod\n",
                    labels::WORKER_MODULE_VERSION_ANNOTATION: "v1",
                },
                "ownerReferences": [{"apiVersion": "kmm.sigs.x-k8s.io/v1beta1", "kind": "NodeModulesConfig", "name": "n1", "uid": "n"}],
                "managedFields": [{"manager": "capstan", "operation": "Update"}],
            },
            "spec": {
                "nodeName": "n1",
                "serviceAccountName": "kmm",
                "imagePullSecrets": [{"name": "pull"}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "restartPolicy": "Never",
                "containers": [{"name": "worker", "image": "capstan", "args": ["worker", "kmod", "load"]}],
                "volumes": [{"name": "config", "emptyDir": {}}],
            },
            "status": {
                "phase": "Failed",
                "message": "pod message",
                "conditions": [{"type": "Ready", "status": "False"}],
                "podIP": "10.0.0.1",
                "containerStatuses": [{
                    "name": "worker", "image": "capstan", "imageID": "sha", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "message": "modprobe failed", "finishedAt": "2026-01-01T00:00:00Z"}},
                    "lastState": {"terminated": {"exitCode": 2}},
                }],
            },
        })
    }

    #[test]
    fn a_worker_pod_read_in_part_reads_as_the_whole_one() {
        let text = worker_pod().to_string();
        let whole: Pod = serde_json::from_str(&text).expect("pod");
        let slim = serde_json::from_str::<Lean<Pod, WorkerPodParts>>(&text)
            .expect("pod")
            .into_inner();
        assert_eq!(
            WorkerPod::from_pod(&slim).expect("worker"),
            WorkerPod::from_pod(&whole).expect("worker")
        );
        assert_eq!(slim.metadata.labels, whole.metadata.labels);
        assert_eq!(slim.metadata.annotations, whole.metadata.annotations);
        assert_eq!(
            slim.metadata.owner_references,
            whole.metadata.owner_references
        );
        let spec = slim.spec.as_ref().expect("spec");
        let whole_spec = whole.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name, whole_spec.node_name);
        assert_eq!(spec.service_account_name, whole_spec.service_account_name);
        assert_eq!(spec.image_pull_secrets, whole_spec.image_pull_secrets);
        assert_eq!(spec.tolerations, whole_spec.tolerations);
        let status = slim.status.as_ref().expect("status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.message.as_deref(), Some("pod message"));
        let container = &status.container_statuses.as_ref().expect("containers")[0];
        assert_eq!(container.name, "worker");
        let terminated = container
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .expect("terminated");
        assert_eq!(terminated.message.as_deref(), Some("modprobe failed"));
        // What nothing reads is never decoded.
        assert!(slim.metadata.managed_fields.is_none());
        assert!(spec.containers.is_empty() && spec.volumes.is_none());
        assert!(spec.restart_policy.is_none());
        assert!(status.conditions.is_none() && status.pod_ip.is_none());
        assert!(container.last_state.is_none() && container.image.is_empty());
        let size = |pod: &Pod| serde_json::to_vec(pod).expect("json").len();
        assert!(size(&slim) < size(&whole));
    }

    #[test]
    fn a_node_is_read_without_its_images() {
        let text = json!({
            "metadata": {"name": "n1", "labels": {"a": "b"},
                         "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "status": {"images": [{"names": ["r/kmod:6.1.0"], "sizeBytes": 1}],
                       "nodeInfo": {"kernelVersion": "6.1.0", "bootID": "b", "machineID": "",
                                    "systemUUID": "", "osImage": "", "containerRuntimeVersion": "",
                                    "kubeletVersion": "", "kubeProxyVersion": "",
                                    "operatingSystem": "", "architecture": ""}},
        })
        .to_string();
        let mut whole: Node = serde_json::from_str(&text).expect("node");
        let lean = serde_json::from_str::<Lean<Node, NodeParts>>(&text)
            .expect("node")
            .into_inner();
        whole.metadata.managed_fields = None;
        whole.status.as_mut().expect("status").images = None;
        assert_eq!(lean, whole);
    }
}
