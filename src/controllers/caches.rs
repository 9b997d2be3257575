//! Shared watch caches of the KMM controllers: one watch per kind, however many
//! controllers read it.
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
//! each subscriber receives the object itself, deleted ones included.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::api::labels;
use crate::api::module::Module;
use crate::api::nmc::NodeModulesConfig;

/// Changes a subscriber may fall behind by before the watch waits for it.
const BUFFER: usize = 4096;

/// One kind's store, its writer and subscribers until the watch starts, and its API.
pub struct Cache<K>
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
    api: Api<K>,
    config: watcher::Config,
}

impl<K> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    fn new(api: Api<K>, config: watcher::Config) -> Cache<K> {
        let (store, writer) = reflector::store();
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        Cache {
            store,
            ready,
            ready_tx: Some(ready_tx),
            writer: Some(writer),
            subscribers: Mutex::new(Some(Vec::new())),
            api,
            config,
        }
    }

    /// A stream of every object the watch applies or deletes from now on (after the start,
    /// the initial list too); a deleted object comes as last seen.
    ///
    /// # Panics
    /// After [`Caches::start`]: subscribers must be in place before the watch starts.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        let (sender, receiver) = mpsc::channel(BUFFER);
        self.subscribers
            .lock()
            .expect("subscribers lock")
            .as_mut()
            .expect("subscribe to a cache before it starts")
            .push(sender);
        receiver
    }

    fn start(&mut self, tasks: &mut tokio::task::JoinSet<()>) {
        let subscribers = self.subscribers.lock().expect("subscribers lock").take();
        let (Some(writer), Some(ready), Some(mut subscribers)) =
            (self.writer.take(), self.ready_tx.take(), subscribers)
        else {
            return;
        };
        let store = self.store.clone();
        let mut events = watcher(self.api.clone(), self.config.clone())
            .default_backoff()
            // Nothing reads managedFields, and they are up to half of a cached worker pod.
            .modify(|object: &mut K| object.meta_mut().managed_fields = None)
            .reflect(writer)
            .boxed();
        tasks.spawn(async move {
            while let Some(event) = events.next().await {
                let changed: Vec<Arc<K>> = match event {
                    Err(err) => {
                        tracing::warn!(%err, "watch failed; retrying");
                        continue;
                    }
                    // The store holds the object now; subscribers share its copy.
                    Ok(watcher::Event::Apply(object)) => {
                        vec![
                            store
                                .get(&ObjectRef::from_obj(&object))
                                .unwrap_or_else(|| Arc::new(object)),
                        ]
                    }
                    Ok(watcher::Event::Delete(object)) => vec![Arc::new(object)],
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                    // The store's own readiness wakes only one waiter; this one wakes them all.
                    Ok(watcher::Event::InitDone) => {
                        ready.send_replace(true);
                        store.state()
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

/// The kinds the Module -> NMC and NMC controllers watch.
pub struct Caches {
    /// Every Node.
    pub nodes: Cache<Node>,
    /// Every Module.
    pub modules: Cache<Module>,
    /// Every NodeModulesConfig.
    pub nmcs: Cache<NodeModulesConfig>,
    /// The KMM worker pods, in every namespace.
    pub worker_pods: Cache<Pod>,
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
        Caches {
            nodes: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            modules: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            nmcs: Cache::new(Api::all(client.clone()), watcher::Config::default()),
            worker_pods: Cache::new(Api::all(client.clone()), worker_pods),
            tasks: tokio::task::JoinSet::new(),
        }
    }

    /// Starts the watches of the kinds someone subscribed to; they run until the caches are
    /// dropped.
    pub fn start(&mut self) {
        self.nodes.start(&mut self.tasks);
        self.modules.start(&mut self.tasks);
        self.nmcs.start(&mut self.tasks);
        self.worker_pods.start(&mut self.tasks);
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
        Arc::new(Stores {
            nodes: caches.nodes.store.clone(),
            modules: caches.modules.store.clone(),
            nmcs: caches.nmcs.store.clone(),
            worker_pods: caches.worker_pods.store.clone(),
            ready: [
                caches.nodes.ready.clone(),
                caches.modules.ready.clone(),
                caches.nmcs.ready.clone(),
                caches.worker_pods.ready.clone(),
            ],
        })
    }

    /// Waits until every store has its initial list. A reconciler must not decide on a
    /// store that has not been filled yet: an empty Module store would look like every
    /// Module was deleted.
    pub async fn ready(&self) {
        for ready in &self.ready {
            let mut ready = ready.clone();
            // An error means the watch is gone (shutdown); the reconciler is stopping too.
            let _ = ready.wait_for(|listed| *listed).await;
        }
    }
}
