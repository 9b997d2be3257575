//! A real Kubernetes control plane on loopback, the reference capstan's tests and
//! benchmarks run against beside the embedded cluster: etcd, kube-apiserver (RBAC and Node
//! authorizers, the default admission plugins), kube-controller-manager (DaemonSets,
//! StatefulSets, the garbage collector, node lifecycle and the rest of its defaults),
//! kube-scheduler, and kwok playing the kubelets of fake nodes.
//!
//! The binaries come from `hack/real-cluster/build`, which builds them from their Go
//! modules into a cache directory ([`Binaries::locate`]). Each [`ControlPlane`] is a cluster
//! of its own in a directory of its own, started from a copy of a freshly booted one (its
//! certificates, keys and etcd's data: [`template`]); every port is picked free on
//! 127.0.0.1, and every process it started is stopped when it is dropped, when the test
//! that started it panics, and when the process that started it dies (`PR_SET_PDEATHSIG`).
//!
//! Nodes come from the embedded cluster's `cluster.yaml` ([`ClusterConfig`]): the same
//! names, roles, labels, taints, allocatable and kernel versions, registered as kwok nodes.
//! kwok runs no container: a pod becomes Running and Ready at once, and a pod that runs to
//! completion (`restartPolicy` Never or OnFailure) then Succeeds ([`kwok`]).

pub mod kmm;
pub mod kwok;
pub mod lws;
pub mod pki;
mod template;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use capstan_cluster::sim::config::ClusterConfig;
use capstan_cluster::sim::nodes::{SIMULATED_LABEL, registration};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};

/// Where the binaries are, when not in the default cache directory.
pub const BIN_ENV: &str = "CAPSTAN_REAL_CLUSTER_BIN";
/// The cache directory's root, when not `$XDG_CACHE_HOME/capstan` or `~/.cache/capstan`.
pub const CACHE_ENV: &str = "CAPSTAN_CACHE_DIR";
/// The annotation kwok manages nodes by.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// What a component's log says when the port it was given is no longer free.
const PORT_TAKEN: &str = "address already in use";

/// How long a component has to become ready: kube-apiserver's first start on a loaded
/// 2-core machine takes tens of seconds.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// How a control plane is started beyond its nodes.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Record every write request (create, update, patch, delete) in the API server's
    /// audit log, `audit.log` in [`ControlPlane::dir`]: who wrote (user and user agent),
    /// what, and the answer's code. Benchmarks count writes per client from it.
    pub audit_writes: bool,
    /// Record every request of these users (reads too) in the same audit log: what a
    /// ServiceAccount used of the permissions it was granted.
    pub audit_users: Vec<String>,
    /// Custom resource definitions served from the start, as [`install_crds`] would
    /// create them after it: the plane starts from a template that has them ([`template`]).
    pub crds: Vec<CustomResourceDefinition>,
    /// The heaps the components may grow to before their Go garbage collectors first run
    /// (`GOGC=off`, and Go's `GOMEMLIMIT`). A plane that lives for one test spends about a
    /// third less of the API server's CPU on its start so; None keeps Go's defaults, as a
    /// benchmark's plane should.
    pub heap_limits: Option<HeapLimits>,
    /// kube-controller-manager's `--node-monitor-grace-period`: how long a node's lease may
    /// go unrenewed before the node is NotReady (the default is 50 s). kwok renews the
    /// leases of every simulated node from the same two cores as the API server, so a
    /// benchmark that saturates the server with thousands of nodes makes them miss it,
    /// as no real kubelet on its own machine would; a longer grace keeps the fleet Ready.
    pub node_monitor_grace_period: Option<std::time::Duration>,
}

/// [`Options::heap_limits`], as `GOMEMLIMIT` takes them (`1GiB`, `256MiB`).
#[derive(Clone, Debug)]
pub struct HeapLimits {
    pub apiserver: String,
    /// Each of etcd, kube-controller-manager, kube-scheduler and kwok.
    pub others: String,
}

impl Options {
    /// A component's environment beyond the inherited one.
    fn env(&self, component: &str) -> Vec<(&'static str, String)> {
        let Some(limits) = &self.heap_limits else {
            return Vec::new();
        };
        let limit = match component {
            "kube-apiserver" => &limits.apiserver,
            _ => &limits.others,
        };
        vec![("GOGC", "off".into()), ("GOMEMLIMIT", limit.clone())]
    }

    /// The audit policy: the users' requests, then writes, at the Metadata level, once
    /// each (when answered); None when nothing is audited.
    fn audit_policy(&self) -> Option<String> {
        if !self.audit_writes && self.audit_users.is_empty() {
            return None;
        }
        let mut policy =
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n"
                .to_string();
        if !self.audit_users.is_empty() {
            let users: Vec<String> = self.audit_users.iter().map(|u| format!("{u:?}")).collect();
            policy.push_str(&format!(
                "- level: Metadata\n  users: [{}]\n",
                users.join(", ")
            ));
        }
        if self.audit_writes {
            policy.push_str(
                "- level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n",
            );
        }
        policy.push_str("- level: None\n");
        Some(policy)
    }
}

/// The built binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The binaries in `$CAPSTAN_REAL_CLUSTER_BIN`, or in the cache directory
    /// `hack/real-cluster/build` fills; an error says how to build them.
    pub fn locate() -> anyhow::Result<Binaries> {
        let dir = match std::env::var_os(BIN_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => cache_dir().join("real-cluster").join("bin"),
        };
        let binaries = Binaries { dir };
        for name in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        ] {
            let path = binaries.path(name);
            if !path.is_file() {
                bail!(
                    "{} is missing: build the control plane with hack/real-cluster/build \
                     (or set {BIN_ENV} to the directory holding it)",
                    path.display()
                );
            }
        }
        Ok(binaries)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// kwok's stage definitions, copied beside the binaries by the build.
    fn kwok_stages(&self) -> PathBuf {
        self.dir.join("kwok-stages")
    }
}

/// kubectl of the control plane's release: `hack/real-cluster/build-kubectl` builds it into
/// the cache, or finds it up to date and builds nothing.
pub fn kubectl() -> anyhow::Result<PathBuf> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/real-cluster/build-kubectl");
    let output = std::process::Command::new(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{} failed (it needs Go):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    anyhow::ensure!(
        !path.is_empty(),
        "{} printed no kubectl path",
        script.display()
    );
    Ok(PathBuf::from(path))
}

/// An upstream controller's manager binary and the folder of its CRDs: the binary
/// `$<manager_env>` names, else what `hack/real-cluster/<project>/build` put in the cache
/// (run first; it builds nothing when the cache is up to date).
pub fn upstream_manager(project: &str, manager_env: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = cache_dir().join("real-cluster").join(project);
    let crds = dir.join("crds");
    if let Some(manager) = std::env::var_os(manager_env) {
        return Ok((PathBuf::from(manager), crds));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hack/real-cluster")
        .join(project)
        .join("build");
    let output = std::process::Command::new(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{} failed (it needs Go, and upstream's source):\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let manager = dir.join("manager");
    anyhow::ensure!(
        manager.is_file() && crds.is_dir(),
        "{} or {} is missing after {}",
        manager.display(),
        crds.display(),
        script.display()
    );
    Ok((manager, crds))
}

/// `$CAPSTAN_CACHE_DIR`, else `$XDG_CACHE_HOME/capstan`, else `~/.cache/capstan`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(CACHE_ENV) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    base.join("capstan")
}

/// One started component.
struct Process {
    name: &'static str,
    child: tokio::process::Child,
    log: PathBuf,
}

/// A running control plane. Dropping it stops every process and removes its directory.
pub struct ControlPlane {
    processes: Vec<Process>,
    server: String,
    kubeconfig: String,
    // Last, so the processes stop before their files go.
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Starts a control plane with the nodes of `config` and waits until it serves, its
    /// controllers run and every node is Ready.
    pub async fn start(config: &ClusterConfig) -> anyhow::Result<ControlPlane> {
        ControlPlane::start_with(config, &Options::default()).await
    }

    /// [`ControlPlane::start`], with `options`.
    pub async fn start_with(
        config: &ClusterConfig,
        options: &Options,
    ) -> anyhow::Result<ControlPlane> {
        let mut plane = ControlPlane::boot(options, &config.broken_images).await?;
        plane.add_nodes(config).await?;
        Ok(plane)
    }

    /// A control plane without nodes: it serves, and its controllers run. kwok's pods of
    /// an image in `broken_images` never start. [`ControlPlane::add_nodes`] registers the
    /// nodes; a test harness may boot planes ahead of the tests that take them.
    ///
    /// Ports are picked free, then bound by the component that gets them, so another
    /// process may take one in between (control planes boot side by side in the tests): a
    /// component that found its port taken makes the boot start again with new ports.
    pub async fn boot(options: &Options, broken_images: &[String]) -> anyhow::Result<ControlPlane> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            match ControlPlane::boot_once(options, broken_images).await {
                Err(err) if attempt < ATTEMPTS && format!("{err:#}").contains(PORT_TAKEN) => {
                    tracing::info!(attempt, "a control plane's port was taken: booting again");
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn boot_once(
        options: &Options,
        broken_images: &[String],
    ) -> anyhow::Result<ControlPlane> {
        capstan_api::install_crypto_provider();
        let binaries = Binaries::locate()?;
        let template = template::ready(&binaries, &options.crds).await?;
        let mut plane = ControlPlane::in_new_dir()?;
        template::copy(&template, plane.dir.path())?;
        let pki = pki::open(plane.dir.path())?;
        plane.run(&binaries, &pki, options, broken_images).await?;
        let client = plane.client().await?;
        for crd in &options.crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            plane
                .wait(&format!("CRD {name} to be served"), || {
                    let client = client.clone();
                    async move { served(&client, crd).await }
                })
                .await?;
        }
        Ok(plane)
    }

    /// A plane with nothing started yet, in a directory of its own.
    fn in_new_dir() -> anyhow::Result<ControlPlane> {
        let dir = tempfile::Builder::new()
            .prefix("capstan-real-cluster-")
            .tempdir()?;
        Ok(ControlPlane {
            processes: Vec::new(),
            server: String::new(),
            kubeconfig: String::new(),
            dir,
        })
    }

    /// Starts every component on fresh ports, with the PKI in the plane's directory and
    /// etcd's data in its `etcd` folder (empty, or a template's), and waits until the API
    /// server is ready and the controller-manager runs.
    async fn run(
        &mut self,
        binaries: &Binaries,
        pki: &pki::Pki,
        options: &Options,
        broken_images: &[String],
    ) -> anyhow::Result<()> {
        let root = self.dir.path().to_path_buf();
        let etcd_client = free_port()?;
        let etcd_peer = free_port()?;
        let secure_port = free_port()?;
        self.server = format!("https://127.0.0.1:{secure_port}");

        self.spawn(
            "etcd",
            binaries,
            &[
                "--name=default".into(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=default=http://127.0.0.1:{etcd_peer}"),
                // A test cluster is thrown away: durability buys nothing.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
            &options.env("etcd"),
        )?;
        let mut audit = Vec::new();
        if let Some(text) = options.audit_policy() {
            let policy = root.join("audit-policy.yaml");
            std::fs::write(&policy, text)?;
            audit = vec![
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", root.join("audit.log").display()),
                // One file for the whole run: a rotated log would lose counted writes.
                "--audit-log-maxsize=100000".into(),
            ];
        }
        self.spawn(
            "kube-apiserver",
            binaries,
            &[
                format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={secure_port}"),
                format!("--tls-cert-file={}", pki.apiserver.cert.display()),
                format!("--tls-private-key-file={}", pki.apiserver.key.display()),
                format!("--client-ca-file={}", pki.ca.cert.display()),
                "--authorization-mode=Node,RBAC".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!(
                    "--service-account-key-file={}",
                    pki.service_account_pub.display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    pki.service_account_key.display()
                ),
                // KMM's worker pods are privileged.
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
            ]
            .into_iter()
            .chain(audit)
            .collect::<Vec<_>>(),
            &options.env("kube-apiserver"),
        )?;

        let admin = kubeconfig(&self.server, &pki.ca_pem, &pki.admin, "admin")?;
        let controller_manager = kubeconfig(
            &self.server,
            &pki.ca_pem,
            &pki.controller_manager,
            "system:kube-controller-manager",
        )?;
        let scheduler = kubeconfig(
            &self.server,
            &pki.ca_pem,
            &pki.scheduler,
            "system:kube-scheduler",
        )?;
        let admin_path = root.join("admin.kubeconfig");
        std::fs::write(&admin_path, &admin)?;
        std::fs::write(
            root.join("controller-manager.kubeconfig"),
            &controller_manager,
        )?;
        std::fs::write(root.join("scheduler.kubeconfig"), &scheduler)?;
        self.kubeconfig = admin;
        let client = self.client().await?;
        self.wait("kube-apiserver to be ready", || {
            let client = client.clone();
            async move { ready(&client).await }
        })
        .await?;

        self.spawn(
            "kube-controller-manager",
            binaries,
            &[
                format!(
                    "--kubeconfig={}",
                    root.join("controller-manager.kubeconfig").display()
                ),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    pki.service_account_key.display()
                ),
                format!("--root-ca-file={}", pki.ca.cert.display()),
                format!("--cluster-signing-cert-file={}", pki.ca.cert.display()),
                format!("--cluster-signing-key-file={}", pki.ca.key.display()),
                // kwokctl's settings: the client defaults (20 requests a second) would make
                // the controller-manager, not the controllers under test, the bottleneck of
                // a large fleet.
                "--kube-api-qps=5000".into(),
                "--kube-api-burst=10000".into(),
            ]
            .into_iter()
            .chain(
                options
                    .node_monitor_grace_period
                    .map(|grace| format!("--node-monitor-grace-period={}s", grace.as_secs())),
            )
            .collect::<Vec<_>>(),
            &options.env("kube-controller-manager"),
        )?;
        self.spawn(
            "kube-scheduler",
            binaries,
            &[
                format!(
                    "--kubeconfig={}",
                    root.join("scheduler.kubeconfig").display()
                ),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--kube-api-qps=5000".into(),
                "--kube-api-burst=10000".into(),
            ],
            &options.env("kube-scheduler"),
        )?;
        let kwok_config = root.join("kwok.yaml");
        std::fs::write(
            &kwok_config,
            kwok::config(&binaries.kwok_stages(), broken_images)?,
        )?;
        self.spawn(
            "kwok",
            binaries,
            &[
                format!("--kubeconfig={}", admin_path.display()),
                format!("--config={}", kwok_config.display()),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
                "--node-lease-duration-seconds=40".into(),
                "--cidr=10.64.0.0/12".into(),
            ],
            &options.env("kwok"),
        )?;

        // The service-account controller makes `default` in each namespace; pods are
        // refused until it has (the ServiceAccount admission plugin).
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        self.wait("kube-controller-manager to run", || {
            let accounts = accounts.clone();
            async move { matches!(accounts.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;
        Ok(())
    }

    /// Registers the nodes of `config` as kwok's and waits until every one is Ready.
    pub async fn add_nodes(&mut self, config: &ClusterConfig) -> anyhow::Result<()> {
        if config.nodes.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        let nodes: Api<Node> = Api::all(client);
        let now = jiff::Timestamp::now();
        for (index, node) in config.nodes.iter().enumerate() {
            let object: Node = serde_json::from_value(kwok_node(registration(node, index, now)))?;
            nodes
                .create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("registering node {}", node.name))?;
        }
        let names: Vec<String> = config.nodes.iter().map(|n| n.name.clone()).collect();
        self.wait("every node to be Ready under kwok", || {
            let (nodes, names) = (nodes.clone(), names.clone());
            async move { all_ready(&nodes, &names).await }
        })
        .await
    }

    /// The administrator's kubeconfig (YAML, certificates inline).
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig.clone()
    }

    /// The API server's audit log, when started with [`Options::audit_writes`] or
    /// [`Options::audit_users`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.path().join("audit.log")
    }

    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The directory the control plane runs in: its kubeconfigs, certificates, etcd data
    /// and each component's log (`<component>.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client acting as the administrator.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let mut config = config;
        // As the embedded cluster's client: 429 from an eviction is an answer ("the budget
        // says no"), not a reason to retry for minutes.
        config.default_retry = false;
        Ok(kube::Client::try_from(config)?)
    }

    /// Stops every process at once with SIGKILL and reaps them. The control plane is
    /// thrown away with its directory, so a graceful stop would flush nothing anyone
    /// reads; kube-apiserver's alone takes over a second, at the end of every test.
    pub async fn shutdown(mut self) {
        for process in &mut self.processes {
            let _ = process.child.start_kill();
        }
        while let Some(mut process) = self.processes.pop() {
            let _ = process.child.wait().await;
        }
    }

    /// Stops every process with SIGTERM, the last started first, and waits for each: what
    /// etcd holds is complete on disk when it returns.
    async fn stop_gracefully(&mut self) -> anyhow::Result<()> {
        while let Some(mut process) = self.processes.pop() {
            if let Some(pid) = process.child.id() {
                // SAFETY: kill(2) with a child's pid this plane has not reaped yet.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            }
            let stopped = tokio::time::timeout(READY_TIMEOUT, process.child.wait()).await;
            anyhow::ensure!(
                stopped.is_ok(),
                "{} did not stop within {READY_TIMEOUT:?} of SIGTERM",
                process.name
            );
        }
        Ok(())
    }

    fn spawn(
        &mut self,
        name: &'static str,
        binaries: &Binaries,
        args: &[String],
        env: &[(&str, String)],
    ) -> anyhow::Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut command = tokio::process::Command::new(binaries.path(name));
        command
            .args(args)
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                // The component dies with the thread that started it, even when that
                // process is killed and runs no destructor.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {}", binaries.path(name).display()))?;
        self.processes.push(Process { name, child, log });
        Ok(())
    }

    /// Waits until `check` holds; fails, with the end of the log of any component that
    /// exited, when one does or the time is up.
    async fn wait<F, Check>(&mut self, what: &str, mut check: Check) -> anyhow::Result<()>
    where
        Check: FnMut() -> F,
        F: std::future::Future<Output = bool>,
    {
        let started = Instant::now();
        loop {
            if check().await {
                return Ok(());
            }
            for process in &mut self.processes {
                if let Some(status) = process.child.try_wait()? {
                    bail!(
                        "{} exited ({status}) while waiting for {what}:\n{}",
                        process.name,
                        log_tail(&process.log)
                    );
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                let logs: Vec<String> = self
                    .processes
                    .iter()
                    .map(|p| format!("--- {}:\n{}", p.name, log_tail(&p.log)))
                    .collect();
                bail!(
                    "timed out after {READY_TIMEOUT:?} waiting for {what}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Creates `crds` and waits until the API server serves each: established, and its list
/// answered (a new kind's watch cache first answers 429 "storage is (re)initializing").
pub async fn install_crds(
    client: &kube::Client,
    crds: Vec<CustomResourceDefinition>,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), crd)
            .await
            .with_context(|| format!("creating CRD {name}"))?;
    }
    let started = Instant::now();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        loop {
            let established = api.get_opt(&name).await?.is_some_and(|crd| {
                crd.status
                    .and_then(|status| status.conditions)
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    })
            });
            if established && served(client, crd).await {
                break;
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!("CRD {name} not established after {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Whether a list of `crd`'s kind is answered.
async fn served(client: &kube::Client, crd: &CustomResourceDefinition) -> bool {
    let spec = &crd.spec;
    let Some(version) = spec.versions.iter().find(|v| v.served) else {
        return false;
    };
    let resource = ApiResource {
        group: spec.group.clone(),
        version: version.name.clone(),
        api_version: format!("{}/{}", spec.group, version.name),
        kind: spec.names.kind.clone(),
        plural: spec.names.plural.clone(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    api.list_metadata(&ListParams::default().limit(1))
        .await
        .is_ok()
}

/// The Node a kubelet of `config` would register, managed by kwok instead of the embedded
/// cluster's simulation.
fn kwok_node(mut node: serde_json::Value) -> serde_json::Value {
    if let Some(labels) = node["metadata"]["labels"].as_object_mut() {
        labels.remove(SIMULATED_LABEL);
    }
    node["metadata"]["annotations"] = serde_json::json!({KWOK_NODE_ANNOTATION: "fake"});
    // kwok writes the conditions, heartbeats and lease itself.
    if let Some(status) = node["status"].as_object_mut() {
        status.remove("conditions");
    }
    node
}

async fn ready(client: &kube::Client) -> bool {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .expect("a valid request");
    matches!(client.request_text(request).await, Ok(body) if body.trim() == "ok")
}

async fn all_ready(nodes: &Api<Node>, names: &[String]) -> bool {
    for name in names {
        let Ok(Some(node)) = nodes.get_opt(name).await else {
            return false;
        };
        let ready = node
            .status
            .and_then(|status| status.conditions)
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
        if !ready {
            return false;
        }
    }
    true
}

/// A kubeconfig for `user`, authenticating with its client certificate.
fn kubeconfig(server: &str, ca_pem: &str, pair: &pki::Pair, user: &str) -> anyhow::Result<String> {
    use base64::Engine as _;
    let encode = |text: &[u8]| base64::engine::general_purpose::STANDARD.encode(text);
    let cert = std::fs::read(&pair.cert)?;
    let key = std::fs::read(&pair.key)?;
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: {user}\ncurrent-context: real\n",
        ca = encode(ca_pem.as_bytes()),
        cert = encode(&cert),
        key = encode(&key),
    ))
}

/// A port free on 127.0.0.1 now.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The last lines of a component's log.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
