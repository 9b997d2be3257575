//! `capstan sync`: follow a branch into a cluster (the embedded one unless `--kubeconfig`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio::sync::Notify;

use crate::controllers::nmc::worker_pod::DEFAULT_WORKER_IMAGE;
use crate::controllers::{self, Context, Selection};
use crate::election::{self, Leadership, LeaseOptions};
use crate::runtime::{client_for, in_cluster_client, in_pod, shutdown_signal};
use crate::sync::manifests::DriftPolicy;
use crate::sync::metrics::Metrics;
use crate::sync::run::{self, Outcome, SyncError, SyncOptions, Syncer, Wakers, describe_commit};
use crate::sync::server::{self, ServerState, Standby};
use crate::sync::source::{Auth, Source};

/// Exit code of `--once` when the cluster did not converge within `--timeout`.
pub const EXIT_TIMEOUT: i32 = 3;

#[derive(Debug, Args)]
pub struct SyncArgs {
    /// The repository: a local repository, a folder inside one (which becomes --path), or
    /// an https/ssh URL (cloned into the state directory).
    #[arg(long)]
    pub repo: String,
    /// The branch to follow.
    #[arg(long, default_value = "main")]
    pub branch: String,
    /// The folder inside the repository to sync (default: all of it).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// The cluster to sync into. Without it, in a pod, the pod's own cluster; elsewhere
    /// capstan starts its embedded (simulated) cluster: it never guesses a real one.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How often to fetch a remote and check for drift (`30s`, `5m`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Apply the head commit, wait until the controllers have carried it out (the moves a
    /// campaign holds until its upgradeAt are named, not waited for), and exit: 0 done, 1
    /// error (rejected commit included), 3 not done within --timeout.
    #[arg(long)]
    pub once: bool,
    /// With --once: how long to wait.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Where capstan keeps its clone of a remote and the embedded cluster's state (its CA
    /// key, token and kubeconfig) [default: $XDG_STATE_HOME/capstan, else
    /// ~/.local/state/capstan]. Never inside the synced repository's work tree, unless Git
    /// ignores it: `git add` would pick up the credentials.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Address of the /metrics, /healthz, /readyz and /hooks/github endpoints; port 0
    /// picks a free one.
    #[arg(long, default_value = "127.0.0.1:9477")]
    pub listen: SocketAddr,
    /// Serve /metrics, /healthz and /readyz on this address instead, and only
    /// /hooks/github on --listen [default: the same as --listen].
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// File holding the GitHub webhook secret; enables POST /hooks/github.
    #[arg(long)]
    pub webhook_secret_file: Option<PathBuf>,
    /// Environment variable holding an https token for the remote.
    #[arg(long, conflicts_with_all = ["token_file", "ssh_key"])]
    pub token_env: Option<String>,
    /// File holding an https token for the remote.
    #[arg(long, conflicts_with = "ssh_key")]
    pub token_file: Option<PathBuf>,
    /// Private key for an ssh remote.
    #[arg(long)]
    pub ssh_key: Option<PathBuf>,
    /// known_hosts file for an ssh remote (default: ~/.ssh/known_hosts).
    #[arg(long, requires = "ssh_key")]
    pub known_hosts: Option<PathBuf>,
    /// Overrides the repository's `drift` setting: `revert` writes hand-made changes back,
    /// `warn` only reports them.
    #[arg(long, value_parser = parse_drift)]
    pub drift: Option<DriftPolicy>,
    /// Name of the GitSync object keeping this sync's status.
    #[arg(long, default_value = crate::sync::inventory::DEFAULT_SYNC_NAME)]
    pub name: String,
    /// Nodes and workloads of the embedded cluster (docs/cluster-config.md).
    #[arg(long, conflicts_with = "kubeconfig")]
    pub cluster_config: Option<PathBuf>,
    /// The controllers to run in this process: `all`, `none`, or a comma-separated list of
    /// module-nmc, nmc, device-plugin, dra, version-labels, campaigns, drain, nodekeeper,
    /// lws, notifications.
    #[arg(long, default_value = "all")]
    pub controllers: Selection,
    /// The image of the kmod worker pods (capstan's worker image).
    #[arg(long, default_value = DEFAULT_WORKER_IMAGE)]
    pub worker_image: String,
    /// Sync and run the controllers only while holding a coordination.k8s.io/v1 Lease, so
    /// that of several replicas one acts and the others stand by (docs/install.md).
    #[arg(long)]
    pub leader_elect: bool,
    /// The Lease's name (default: the --name of the GitSync, so each shard has its own).
    #[arg(long, requires = "leader_elect")]
    pub lease_name: Option<String>,
    /// The Lease's namespace (default: the pod's, $POD_NAMESPACE, else capstan-system).
    #[arg(long, requires = "leader_elect")]
    pub lease_namespace: Option<String>,
    /// How long the leader keeps the Lease without renewing it: a standby takes over this
    /// long after the leader died. Whole seconds.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,
    /// How long before the Lease expires the leader renews it. Whole seconds.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lease_grace: Duration,
}

impl SyncArgs {
    /// The state directory: --state-dir, else [`default_state_dir`].
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(default_state_dir)
    }

    /// The Lease to hold before acting, with --leader-elect.
    fn lease(&self) -> Option<LeaseOptions> {
        self.leader_elect.then(|| LeaseOptions {
            namespace: self
                .lease_namespace
                .clone()
                .unwrap_or_else(election::default_namespace),
            name: self.lease_name.clone().unwrap_or_else(|| self.name.clone()),
            identity: election::identity(),
            duration: self.lease_duration,
            grace: self.lease_grace,
        })
    }
}

/// Where capstan keeps its state without --state-dir: `$XDG_STATE_HOME/capstan`, else
/// `~/.local/state/capstan` (the XDG base directories' place for state), else `.capstan`
/// when there is no home. Never the current folder by default: started inside a fleet
/// repository, that would put the embedded cluster's credentials where `git add -A`
/// commits them.
pub fn default_state_dir() -> PathBuf {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    from("XDG_STATE_HOME")
        .or_else(|| from("HOME").map(|home| home.join(".local").join("state")))
        .map_or_else(|| PathBuf::from(".capstan"), |dir| dir.join("capstan"))
}

/// Fails when `state_dir` lies in the work tree of the local repository `repo` (the one
/// synced) and Git does not ignore it: the embedded cluster's CA key, token and kubeconfig
/// would be committed by the next `git add -A`, and published by the next push.
fn refuse_state_in_work_tree(repo: &str, state_dir: &std::path::Path) -> anyhow::Result<()> {
    let Ok(repository) = git2::Repository::discover(repo) else {
        // A URL, or not a repository: Source::open says which.
        return Ok(());
    };
    let Some(work_tree) = repository.workdir().and_then(|dir| dir.canonicalize().ok()) else {
        return Ok(());
    };
    let state = canonical_to_be(state_dir);
    let Ok(inside) = state.strip_prefix(&work_tree) else {
        return Ok(());
    };
    // A `dir/` pattern matches the folder's files: ask about one inside it.
    if repository
        .is_path_ignored(inside.join("kubeconfig"))
        .unwrap_or(false)
    {
        return Ok(());
    }
    anyhow::bail!(
        "the state directory {} is inside the repository {} that capstan syncs, and Git does \
         not ignore it: it would hold the embedded cluster's CA key, token and kubeconfig, \
         which `git add -A` would commit. Pass --state-dir outside the repository (without \
         --state-dir it is {}), or list it in the repository's .gitignore",
        state.display(),
        work_tree.display(),
        default_state_dir().display()
    )
}

/// `path` made absolute with the symbolic links of its existing part resolved (the rest
/// may not exist yet).
fn canonical_to_be(path: &std::path::Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            return rest
                .iter()
                .rev()
                .fold(canonical, |dir, part| dir.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return path,
        }
    }
}

/// Binds the endpoints' address, saying what to do when it is taken.
async fn bind(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    bind_option("--listen", listen).await
}

/// The listeners of the endpoints: --listen, and --metrics-listen when it is another address.
struct Listeners {
    main: tokio::net::TcpListener,
    metrics: Option<tokio::net::TcpListener>,
}

async fn bind_all(args: &SyncArgs) -> anyhow::Result<Listeners> {
    let main = bind(args.listen).await?;
    let metrics = match args.metrics_listen {
        Some(metrics_listen) if metrics_listen != args.listen => {
            Some(bind_option("--metrics-listen", metrics_listen).await?)
        }
        _ => None,
    };
    Ok(Listeners { main, metrics })
}

async fn bind_option(option: &str, listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen).await.map_err(|err| {
        if err.kind() == std::io::ErrorKind::AddrInUse {
            anyhow::anyhow!(
                "{option} {listen}: the address is in use (another capstan sync?); stop it, or \
                 pass {option} with another port (127.0.0.1:0 picks a free one)"
            )
        } else {
            anyhow::Error::new(err).context(format!("{option} {listen}"))
        }
    })
}

/// Reads the webhook secret, refusing an empty one: GitHub would sign with the empty key,
/// which anyone can.
fn read_webhook_secret(file: &Path) -> anyhow::Result<Vec<u8>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--webhook-secret-file {}", file.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        anyhow::bail!(
            "--webhook-secret-file {}: the file is empty; put the secret set on the GitHub \
             webhook in it (e.g. `openssl rand -hex 32`), or leave the option out to turn \
             webhooks off",
            file.display()
        );
    }
    Ok(secret.as_bytes().to_vec())
}

/// Reads `30s`, `5m`, `1h30m`, `500ms`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed: jiff::SignedDuration = text
        .trim()
        .parse()
        .map_err(|e| format!("{text:?} is not a duration like 30s, 5m or 1h ({e})"))?;
    Duration::try_from(parsed).map_err(|_| format!("{text:?} is negative"))
}

fn parse_drift(text: &str) -> Result<DriftPolicy, String> {
    match text {
        "revert" => Ok(DriftPolicy::Revert),
        "warn" => Ok(DriftPolicy::Warn),
        other => Err(format!("{other:?}: use revert or warn")),
    }
}

fn auth(args: &SyncArgs) -> anyhow::Result<Auth> {
    if let Some(var) = &args.token_env {
        let token = std::env::var(var)
            .with_context(|| format!("--token-env {var}: the variable is not set"))?;
        return Ok(Auth::Token { token });
    }
    if let Some(file) = &args.token_file {
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("--token-file {}", file.display()))?;
        return Ok(Auth::Token { token });
    }
    if let Some(key) = &args.ssh_key {
        return Ok(Auth::SshKey {
            private_key: key.clone(),
            known_hosts: args.known_hosts.clone(),
        });
    }
    Ok(Auth::None)
}

/// The cluster to sync into: the kubeconfig's; in a pod, the pod's own; else the embedded
/// one, started loudly.
async fn connect(args: &SyncArgs) -> anyhow::Result<(kube::Client, Option<Embedded>)> {
    if let Some(path) = &args.kubeconfig {
        return Ok((client_for(path).await?, None));
    }
    if in_pod() {
        anyhow::ensure!(
            args.cluster_config.is_none(),
            "--cluster-config configures the embedded cluster, which capstan never starts in a pod"
        );
        return Ok((in_cluster_client().await?, None));
    }
    let (client, cluster) = start_embedded(args).await?;
    Ok((client, Some(cluster)))
}

/// The embedded cluster `capstan sync` started; nothing without the feature.
#[cfg(feature = "embedded-cluster")]
type Embedded = capstan_cluster::EmbeddedCluster;

/// Without the `embedded-cluster` feature no embedded cluster is ever started.
#[cfg(not(feature = "embedded-cluster"))]
enum Embedded {}

#[cfg(not(feature = "embedded-cluster"))]
impl Embedded {
    async fn shutdown(self) {
        match self {}
    }
}

#[cfg(not(feature = "embedded-cluster"))]
async fn start_embedded(_: &SyncArgs) -> anyhow::Result<(kube::Client, Embedded)> {
    anyhow::bail!(
        "--kubeconfig is required: this capstan was built without its embedded cluster \
         (the `embedded-cluster` feature)"
    )
}

#[cfg(feature = "embedded-cluster")]
async fn start_embedded(args: &SyncArgs) -> anyhow::Result<(kube::Client, Embedded)> {
    use capstan_cluster::sim::config::ClusterConfig;
    use capstan_cluster::{ClusterOptions, EmbeddedCluster, kubeconfig};
    let config = match &args.cluster_config {
        Some(path) => ClusterConfig::read(path)?,
        None => ClusterConfig::default_cluster(),
    };
    let options = ClusterOptions {
        simulation: Some(config),
        state_dir: Some(args.state_dir().join("cluster")),
        ..ClusterOptions::default()
    };
    let cluster = EmbeddedCluster::start(options)
        .await
        .context("starting the embedded cluster")?;
    let path = absolute(&args.state_dir().join("kubeconfig"));
    kubeconfig::write(&path, &cluster.kubeconfig())
        .with_context(|| format!("writing the kubeconfig to {}", path.display()))?;
    say!("================================================================================");
    say!(" No --kubeconfig: capstan started its EMBEDDED cluster (simulated nodes, not a");
    say!(" real cluster) and syncs into it.");
    say!("   API server: {}", cluster.url());
    say!("   kubeconfig: {}", path.display());
    say!(
        "   try:        kubectl --kubeconfig {} get nodes --show-labels",
        path.display()
    );
    say!("================================================================================");
    let client = cluster
        .client()
        .context("connecting to the embedded cluster")?;
    Ok((client, cluster))
}

#[cfg(feature = "embedded-cluster")]
fn absolute(path: &std::path::Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

pub async fn run(args: SyncArgs) -> anyhow::Result<i32> {
    let lease = args.lease();
    let auth = auth(&args)?;
    let github_token = match &auth {
        Auth::Token { token } => Some(token.trim().to_string()),
        _ => None,
    };
    let state_dir = args.state_dir();
    refuse_state_in_work_tree(&args.repo, &state_dir)?;
    let source = Source::open(
        &args.repo,
        &args.branch,
        args.path.as_deref(),
        &state_dir,
        auth,
    )?;
    // Bound before the embedded cluster starts: a port in use (another capstan sync) is
    // reported before anything else happens.
    let listener = if args.once {
        None
    } else {
        Some(bind_all(&args).await?)
    };
    // Read now too: an empty secret file stops capstan before the cluster starts.
    let webhook_secret = match &args.webhook_secret_file {
        Some(file) if !args.once => Some(read_webhook_secret(file)?),
        _ => None,
    };
    let (client, cluster) = connect(&args).await?;
    // A missing permission stops capstan here, named, rather than as a failure halfway
    // through an upgrade.
    let usage = crate::rbac::Usage {
        controllers: &args.controllers,
        once: args.once,
        lease_namespace: lease.as_ref().map(|lease| lease.namespace.as_str()),
    };
    crate::rbac::check(&client, &usage).await?;
    let metrics = Arc::new(Metrics::new());
    // A standby serves probes and webhooks too: the endpoints start before the election.
    let endpoints = if args.once {
        None
    } else {
        Some(Endpoints::start(
            &args,
            listener.expect("bound unless --once"),
            webhook_secret,
            metrics.clone(),
            &client,
            lease.is_some(),
        )?)
    };
    let leadership = match &lease {
        Some(options) => match lead(&client, options).await? {
            Some(leadership) => Some(leadership),
            None => {
                if let Some(endpoints) = endpoints {
                    endpoints.stop().await;
                }
                say!("stopped before leading");
                return Ok(0);
            }
        },
        None => None,
    };
    if let Some(endpoints) = &endpoints {
        endpoints.lead();
    }
    metrics.set_leader(true);
    let keeper = leadership.map(keep);
    let options = SyncOptions {
        github_token,
        ..options(&args)
    };
    let syncer = Syncer::start(client.clone(), source, options, metrics.clone())
        .await
        .context("preparing the sync")?;
    {
        let source = syncer.source();
        let path = source.path();
        say!(
            "following {} of {}{}",
            args.branch,
            source.location(),
            if path.is_empty() {
                String::new()
            } else {
                format!(" (path {path})")
            }
        );
    }
    let stop_controllers = tokio_util::sync::CancellationToken::new();
    let ctx = Context::reporting_to(
        client.clone(),
        Arc::new(capstan_api::clock::SystemClock),
        stop_controllers.clone(),
        args.worker_image.clone(),
        metrics.controllers(),
    );
    if !args.controllers.is_empty() {
        say!("running controllers: {}", args.controllers);
    }
    let selection = args.controllers.clone();
    let clock = ctx.clock.clone();
    let running = tokio::spawn(async move { controllers::run(ctx, &selection).await });
    let code = match endpoints {
        None => run_once(syncer, &client, &args.controllers, &*clock, args.timeout).await,
        Some(endpoints) => run_forever(&args, syncer, &client, endpoints).await?,
    };
    stop_controllers.cancel();
    let _ = running.await;
    if let Some(keeper) = keeper {
        keeper.release().await;
    }
    if let Some(cluster) = cluster {
        cluster.shutdown().await;
    }
    Ok(code)
}

fn options(args: &SyncArgs) -> SyncOptions {
    SyncOptions {
        name: args.name.clone(),
        drift: args.drift,
        ..SyncOptions::default()
    }
}

/// Waits for the Lease; None when a shutdown signal came first.
async fn lead(client: &kube::Client, options: &LeaseOptions) -> anyhow::Result<Option<Leadership>> {
    say!(
        "waiting for the Lease {}/{} as {}",
        options.namespace,
        options.name,
        options.identity
    );
    tokio::select! {
        leadership = election::acquire(client.clone(), options) => {
            let leadership = leadership?;
            say!("leading: holding the Lease {}/{} as {}", options.namespace, options.name, options.identity);
            Ok(Some(leadership))
        }
        _ = shutdown_signal() => Ok(None),
    }
}

/// The Lease held while this process acts. Losing it ends the process at once: another
/// replica may already act, and two must never write the same step.
struct Keeper {
    release: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

fn keep(mut leadership: Leadership) -> Keeper {
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tokio::select! {
            _ = leadership.lost() => {
                say!("lost the Lease: exiting so that only the new leader acts");
                std::process::exit(election::EXIT_LEASE_LOST);
            }
            _ = released => leadership.release().await,
        }
    });
    Keeper { release, task }
}

impl Keeper {
    /// Gives the Lease up once this process has stopped acting.
    async fn release(self) {
        let _ = self.release.send(());
        let _ = self.task.await;
        say!("released the Lease");
    }
}

/// The HTTP endpoints of a long-running sync, and what they share with it.
struct Endpoints {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    shutdown: Arc<Notify>,
    ready: Arc<AtomicBool>,
    trigger: Arc<Notify>,
    /// Set while a replica with --leader-elect waits for the Lease.
    waiting: Option<Arc<AtomicBool>>,
}

impl Endpoints {
    fn start(
        args: &SyncArgs,
        listeners: Listeners,
        webhook_secret: Option<Vec<u8>>,
        metrics: Arc<Metrics>,
        client: &kube::Client,
        elected: bool,
    ) -> anyhow::Result<Endpoints> {
        let ready = Arc::new(AtomicBool::new(false));
        let trigger = Arc::new(Notify::new());
        let shutdown = Arc::new(Notify::new());
        let waiting = elected.then(|| Arc::new(AtomicBool::new(true)));
        let state = ServerState {
            metrics,
            ready: ready.clone(),
            webhook_secret,
            trigger: trigger.clone(),
            branch: Some(args.branch.clone()),
            standby: waiting.clone().map(|waiting| Standby {
                waiting,
                client: client.clone(),
                sync_name: args.name.clone(),
            }),
        };
        let server_shutdown = shutdown.clone();
        let (address, metrics_address, task) = server::serve_with(
            listeners.main,
            listeners.metrics,
            state,
            server::Limits::default(),
            async move {
                server_shutdown.notified().await;
            },
        )
        .with_context(|| format!("listening on {}", args.listen))?;
        if metrics_address == address {
            say!(
                "metrics and health on http://{address}/metrics, /healthz, /readyz; webhook at /hooks/github"
            );
        } else {
            say!(
                "metrics and health on http://{metrics_address}/metrics, /healthz, /readyz; webhook at http://{address}/hooks/github"
            );
        }
        Ok(Endpoints {
            address,
            task,
            shutdown,
            ready,
            trigger,
            waiting,
        })
    }

    /// This replica leads from now on: readiness and webhooks are the leader's.
    fn lead(&self) {
        if let Some(waiting) = &self.waiting {
            waiting.store(false, Ordering::Release);
        }
    }

    async fn stop(self) {
        self.shutdown.notify_waiters();
        let _ = self.task.await;
        tracing::debug!(address = %self.address, "the endpoints stopped");
    }
}

async fn run_once(
    mut syncer: Syncer,
    client: &kube::Client,
    selection: &Selection,
    clock: &dyn capstan_api::clock::Clock,
    timeout: Duration,
) -> i32 {
    let deadline = tokio::time::Instant::now() + timeout;
    let stop = syncer.stop_flag();
    let outcome = tokio::select! {
        outcome = tokio::time::timeout_at(deadline, syncer.sync()) => outcome,
        _ = shutdown_signal() => {
            stop.store(true, Ordering::SeqCst);
            return 1;
        }
    };
    match outcome {
        Err(_) => {
            say!("not applied within {timeout:?}");
            return EXIT_TIMEOUT;
        }
        Ok(result) => {
            log_outcome(&result);
            match result {
                Ok(Outcome::Applied(_) | Outcome::Drift(_) | Outcome::Unchanged) => {}
                Ok(Outcome::Interrupted(_) | Outcome::Rejected { .. }) | Err(_) => return 1,
            }
        }
    }
    if selection.is_empty() {
        return 0;
    }
    tokio::select! {
        code = wait_for_convergence(client, selection, clock, deadline, timeout) => code,
        _ = shutdown_signal() => 1,
    }
}

/// How often `--once` looks at the cluster while the controllers work.
const CONVERGENCE_POLL: Duration = Duration::from_millis(200);

/// Waits until the controllers have carried out the commit: 0 when they have, 3 at the
/// deadline (saying what is still pending), 1 when the cluster cannot be read.
async fn wait_for_convergence(
    client: &kube::Client,
    selection: &Selection,
    clock: &dyn capstan_api::clock::Clock,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> i32 {
    let mut shown: Vec<String> = Vec::new();
    loop {
        match controllers::converge::survey(client, selection, clock).await {
            // What campaigns hold for later is said, not waited for.
            Ok(survey) if survey.pending.is_empty() => {
                say!("{}", survey.summary());
                return 0;
            }
            Ok(survey) => {
                let pending = survey.pending;
                if tokio::time::Instant::now() >= deadline {
                    say!("not converged within {timeout:?}; still pending:");
                    for line in &pending {
                        say!("  {line}");
                    }
                    return EXIT_TIMEOUT;
                }
                if pending != shown {
                    say!("waiting for the controllers: {}", pending[0]);
                    shown = pending;
                }
            }
            Err(err) => {
                say!("reading the cluster: {err}");
                return 1;
            }
        }
        tokio::time::sleep(CONVERGENCE_POLL).await;
    }
}

async fn run_forever(
    args: &SyncArgs,
    syncer: Syncer,
    client: &kube::Client,
    endpoints: Endpoints,
) -> anyhow::Result<i32> {
    let (shutdown, ready, trigger) = (
        endpoints.shutdown.clone(),
        endpoints.ready.clone(),
        endpoints.trigger.clone(),
    );
    // Webhooks relayed by standbys, and requests made by hand, arrive on the GitSync.
    let requests = crate::sync::request::watch(client.clone(), &args.name, trigger.clone());
    let local_git_dir = {
        let source = syncer.source();
        (!source.is_remote()).then(|| source.git_dir())
    };
    let (_watcher, refs) = match local_git_dir {
        Some(git_dir) => {
            let (watcher, rx) = crate::sync::source::watch_refs(&git_dir)?;
            (Some(watcher), Some(rx))
        }
        None => (None, None),
    };
    let stop_loop = Arc::new(Notify::new());
    {
        let stop_loop = stop_loop.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            say!("stopping: finishing the write in flight");
            stop_loop.notify_one();
            shutdown.notify_waiters();
        });
    }
    let wakers = Wakers {
        refs,
        webhook: trigger,
    };
    run::follow(syncer, args.interval, wakers, stop_loop, ready, log_outcome).await;
    requests.abort();
    endpoints.stop().await;
    say!("stopped");
    Ok(0)
}

/// One line per sync that did something; problems one per line below.
fn log_outcome(result: &Result<Outcome, SyncError>) {
    let time = jiff::Zoned::now().strftime("%H:%M:%S");
    match result {
        Ok(Outcome::Unchanged) => {}
        Ok(Outcome::Applied(report)) => {
            let commit = report
                .commit
                .as_ref()
                .map(describe_commit)
                .unwrap_or_default();
            say!(
                "{time} applied {commit}: {} in {} ms",
                report.summary(),
                report.duration.as_millis()
            );
            for change in &report.changes {
                say!("{time}   {}", crate::history::describe_change(change));
            }
            for (id, reason) in &report.kept {
                say!("{time}   kept {id}: {reason}");
            }
            explain_unregistered(&time, report);
        }
        Ok(Outcome::Drift(report)) => {
            say!("{time} drift: {}", report.summary());
            for change in &report.changes {
                say!("{time}   {}", crate::history::describe_change(change));
            }
            explain_unregistered(&time, report);
        }
        Ok(Outcome::Interrupted(report)) => {
            say!(
                "{time} interrupted: {} before stopping; the next start applies the commit again",
                report.summary()
            );
        }
        Ok(Outcome::Rejected { commit, errors }) => {
            say!(
                "{time} rejected {}: {} problem(s); nothing of it applied",
                describe_commit(commit),
                errors.len()
            );
            // As many as the status keeps: a commit may hold any number of problems.
            let shown = errors.len().min(crate::sync::run::LOGGED_ERRORS);
            for error in &errors[..shown] {
                say!("{time}   {error}");
            }
            if shown < errors.len() {
                say!(
                    "{time}   and {} more (`kubectl -n capstan-system get gitsync` names the \
                     first 100; `capstan plan` all of them)",
                    errors.len() - shown
                );
            }
        }
        Err(err) => say!("{time} sync failed: {err}"),
    }
}

/// What an `absent` Node line means, once per outcome that has one.
fn explain_unregistered(time: &impl std::fmt::Display, report: &crate::sync::run::Report) {
    if report.count(crate::sync::apply::Action::Absent.as_str()) > 0 {
        say!(
            "{time}   (capstan never creates a Node: an absent one gets its labels from \
             Git once a kubelet registers it)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_webhook_secret_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("secret");
        for empty in ["", " \n\t\n"] {
            std::fs::write(&file, empty).expect("write");
            let err = read_webhook_secret(&file).expect_err("an empty secret");
            assert!(err.to_string().contains("the file is empty"), "{err}");
        }
        std::fs::write(&file, "s3cret\n").expect("write");
        assert_eq!(read_webhook_secret(&file).expect("a secret"), b"s3cret");
    }

    #[test]
    fn durations_read_like_flux_intervals() {
        let cases = [
            ("30s", Some(Duration::from_secs(30))),
            ("5m", Some(Duration::from_secs(300))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("500ms", Some(Duration::from_millis(500))),
            ("soon", None),
            ("-5s", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text).ok(), expected, "{text}");
        }
    }
}
