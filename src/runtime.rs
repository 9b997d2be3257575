//! What a capstan process needs from its environment: a client for the cluster a
//! kubeconfig names (or, in a pod, the pod's own cluster), and the shutdown signals.
//!
//! Shutdown is two-stage, as kubert's: the first SIGINT or SIGTERM asks capstan to
//! drain (the sync in flight finishes its write and records its status, the controllers
//! stop taking work), a second one ends the process at once.

use std::path::Path;

use anyhow::Context as _;

/// Exit code of a process ended by a second signal while it drained.
pub const EXIT_ABORTED: i32 = 130;

/// A client for the cluster of the kubeconfig at `path` (its current context). Requests
/// are not retried by the client: capstan's loops retry, each at its own pace.
pub async fn client_for(path: &Path) -> anyhow::Result<kube::Client> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kubeconfig: kube::config::Kubeconfig = serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a kubeconfig", path.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("using the kubeconfig {}", path.display()))?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Where a pod's service account token is mounted.
const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Whether this process runs in a Kubernetes pod: the kubelet sets
/// `KUBERNETES_SERVICE_HOST` in every container and mounts the service account's token.
/// Both are asked for, so that a shell that only exported the variable is not a pod.
pub fn in_pod() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
        && std::path::Path::new(SERVICE_ACCOUNT_TOKEN).exists()
}

/// A client for the cluster this pod runs in, authenticated as its service account (the
/// token file is re-read as the kubelet rotates it).
pub async fn in_cluster_client() -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::incluster().context(
        "in a pod without --kubeconfig: reading the in-cluster configuration (the service \
         account token and KUBERNETES_SERVICE_HOST/PORT)",
    )?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Completes at the first SIGINT or SIGTERM: the time to drain. From then on, the next
/// one ends the process with [`EXIT_ABORTED`] without waiting for the drain.
pub async fn shutdown_signal() {
    let Ok(mut signals) = Signals::new() else {
        // No signal handler can be installed: only Ctrl-C is left to wait for.
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    signals.next().await;
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("second signal: exiting without finishing the drain");
        std::process::exit(EXIT_ABORTED);
    });
}

/// SIGINT and SIGTERM, as one stream.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// Makes the namespace `name` when it is missing (server-side apply as `manager`), as a
/// first `capstan sync` outside a pod finds neither capstan's nor the Lease's. Several
/// replicas or controllers may race to make it; the apply is the same from each.
pub async fn ensure_namespace(
    client: &kube::Client,
    name: &str,
    manager: &str,
) -> kube::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::{Api, Patch, PatchParams};
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(name).await?.is_some() {
        return Ok(());
    }
    let namespace = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name}});
    namespaces
        .patch(
            name,
            &PatchParams::apply(manager),
            &Patch::Apply(&namespace),
        )
        .await?;
    Ok(())
}
