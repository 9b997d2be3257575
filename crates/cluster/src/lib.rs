//! The embedded cluster: a Kubernetes API server on loopback that the `kube` client and
//! `kubectl` use like a real one, for capstan's default run and its tests.

pub mod access_review;
pub mod api;
pub mod cli;
pub mod defaults;
pub mod errors;
pub mod events_v1;
pub mod eviction;
pub mod faults;
pub mod field;
pub mod field_validation;
pub mod formats;
pub mod gc;
pub mod http;
pub mod kubeconfig;
pub mod memory;
pub mod object_key;
pub mod openapi;
pub mod patch;
pub mod persist;
pub mod pointer;
pub mod protobuf;
pub mod rendering;
pub mod resources;
pub mod scale;
pub mod schema;
pub mod selector;
pub mod sim;
pub mod store;
pub mod structural;
pub mod structural_prune;
pub mod table;
pub mod testing;
pub mod tls;
pub mod typed;
pub mod validate;
pub mod watch;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

use crate::pointer::Pointer;
use api::{Api, WriteOptions};
use capstan_api::clock::{Clock, SystemClock};
use errors::ApiError;
use faults::{FaultSettings, Faults};
use resources::Registry;
use store::{Store, StoreError};

/// How to start an embedded cluster.
#[derive(Clone)]
pub struct ClusterOptions {
    /// Where to listen; port 0 picks a free one. Loopback unless told otherwise.
    pub listen: SocketAddr,
    /// Durable state; in memory when `None`.
    pub state_dir: Option<PathBuf>,
    /// The bearer token clients must present; random when `None` (kept in the state dir).
    pub token: Option<String>,
    pub faults: FaultSettings,
    /// How many changes watches can resume from.
    pub history: usize,
    pub clock: Arc<dyn Clock>,
    /// Register capstan's CRDs at start.
    pub capstan_crds: bool,
    /// Simulated nodes, kubelet and controller-manager; `None` serves the API alone.
    pub simulation: Option<sim::config::ClusterConfig>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            state_dir: None,
            token: None,
            faults: FaultSettings::default(),
            history: store::DEFAULT_HISTORY,
            clock: Arc::new(SystemClock),
            capstan_crds: true,
            simulation: None,
        }
    }
}

/// Why a cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("state dir: {0}")]
    Store(#[from] StoreError),
    #[error("listening on {address}: {source}")]
    Listen {
        address: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("token file {path}: {source}")]
    Token {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering built-in objects: {0}")]
    Bootstrap(#[from] ApiError),
    #[error("TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error("building a client: {0}")]
    Client(#[from] kube::Error),
}

/// A running embedded cluster. Dropping it stops the server.
pub struct EmbeddedCluster {
    api: Arc<Api>,
    address: SocketAddr,
    token: String,
    ca_pem: String,
    ca_der: Vec<u8>,
    simulation: Option<Arc<sim::Simulation>>,
    stop: signal::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl EmbeddedCluster {
    /// Starts the API server and the controllers that belong to the control plane
    /// (garbage collector, namespace controller).
    pub async fn start(options: ClusterOptions) -> Result<Self, ClusterError> {
        capstan_api::install_crypto_provider();
        let store = match &options.state_dir {
            Some(dir) => Store::open(dir, options.history)?,
            None => Store::in_memory(options.history),
        };
        let registry = Arc::new(Registry::with_builtins());
        let api = Arc::new(Api::new(Arc::new(store), registry, options.clock.clone()));
        api.ensure_default_namespaces()?;
        if options.capstan_crds {
            register_capstan_crds(&api)?;
        }
        let token = match (&options.token, &options.state_dir) {
            (Some(token), _) => token.clone(),
            (None, Some(dir)) => persistent_token(dir)?,
            (None, None) => random_token(),
        };
        let mut tasks = vec![tokio::spawn(gc::run(api.clone()))];
        let simulation = match options.simulation.clone() {
            Some(config) => {
                let (simulation, sim_tasks) = sim::Simulation::start(api.clone(), config)?;
                tasks.extend(sim_tasks);
                Some(simulation)
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| ClusterError::Listen {
                address: options.listen,
                source,
            })?;
        let address = listener
            .local_addr()
            .map_err(|source| ClusterError::Listen {
                address: options.listen,
                source,
            })?;
        let server = Arc::new(http::Server {
            api: api.clone(),
            token: token.clone(),
            address: address.to_string(),
            faults: Faults::new(options.faults.clone()),
            simulation: simulation.clone(),
            openapi: openapi::Documents::default(),
        });
        let certificates = tls::serving_certificates(options.state_dir.as_deref(), address.ip())?;
        let (stop, stopped) = signal::channel(false);
        tasks.push(tokio::spawn(http::serve_tls(
            listener,
            certificates.server_config.clone(),
            server,
            stopped,
        )));
        Ok(EmbeddedCluster {
            api,
            address,
            token,
            ca_pem: certificates.ca_pem,
            ca_der: certificates.ca_der,
            simulation,
            stop,
            tasks,
        })
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// The CA certificate (DER) that signed the server's certificate.
    pub fn ca_der(&self) -> &[u8] {
        &self.ca_der
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The API semantics, for in-process callers (simulation, tests).
    pub fn api(&self) -> &Arc<Api> {
        &self.api
    }

    /// The simulated nodes and controllers, when the cluster has them.
    pub fn simulation(&self) -> Option<&Arc<sim::Simulation>> {
        self.simulation.as_ref()
    }

    /// A kubeconfig for this cluster.
    pub fn kubeconfig(&self) -> String {
        kubeconfig::render(&self.url(), &self.ca_pem, &self.token)
    }

    /// A `kube` client that talks to this cluster over HTTP.
    pub fn client(&self) -> Result<kube::Client, ClusterError> {
        let url: ::http::Uri = self.url().parse().map_err(|_| {
            ClusterError::Bootstrap(ApiError::internal("cluster URL does not parse"))
        })?;
        let mut config = kube::Config::new(url);
        config.default_namespace = "default".into();
        config.root_cert = Some(vec![self.ca_der.clone()]);
        config.auth_info.token = Some(self.token.clone().into());
        // 429 from an eviction is an answer ("the budget says no"), not a reason to retry for minutes.
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    /// Stops the server and its controllers and waits for them.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in self.tasks.drain(..) {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for EmbeddedCluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn register_capstan_crds(api: &Api) -> Result<(), ApiError> {
    let Some(crds) = api
        .registry
        .get("apiextensions.k8s.io", "v1", "customresourcedefinitions")
    else {
        return Ok(());
    };
    for crd in capstan_api::crds::all() {
        let crd = serde_json::to_value(&crd).map_err(|e| ApiError::internal(e.to_string()))?;
        let name = crd
            .at("/metadata/name")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        if api.get(&crds, "", name).is_err() {
            let options = WriteOptions {
                field_manager: Some("capstan".into()),
                ..WriteOptions::default()
            };
            api.create(&crds, "", crd, &options)?;
        }
    }
    Ok(())
}

fn random_token() -> String {
    use rand::Rng as _;
    let bytes: [u8; 32] = rand::rng().random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The token kept in the state dir, so kubeconfigs survive a restart.
fn persistent_token(dir: &std::path::Path) -> Result<String, ClusterError> {
    let path = dir.join("token");
    let err = |source| ClusterError::Token {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => Ok(token.trim().to_string()),
        Ok(_) => write_token(&path).map_err(err),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_token(&path).map_err(err),
        Err(e) => Err(err(e)),
    }
}

fn write_token(path: &std::path::Path) -> std::io::Result<String> {
    let token = random_token();
    std::fs::write(path, &token)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(token)
}
