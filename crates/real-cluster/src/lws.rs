//! Upstream LWS's manager (`kubernetes-sigs/lws` at 060ab4d, whose API and CRDs are
//! v0.10.0's) beside a control plane: the oracle the differential tests compare capstan's
//! LeaderWorkerSet decisions with. `hack/real-cluster/lws/build` builds it into the cache.
//!
//! The manager runs out of cluster, as the administrator, with no leader election, metrics
//! or health servers. Its admission webhooks are part of what it decides (defaulting of the
//! LWS, the pod webhook that labels pods and sets their environment), so its webhook server
//! listens on loopback with a certificate made here, and kube-apiserver is pointed at it by
//! URL with upstream's rules; its own certificate management, which writes a Secret and
//! patches the webhook configurations of an in-cluster Service, is off.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};

use super::install_crds;

/// Set to a manager binary, it is used instead of the cache's.
pub const MANAGER_ENV: &str = "CAPSTAN_LWS_MANAGER";
/// How long the manager has to serve its webhooks.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Upstream's manager binary and the folder of its CRDs: `$CAPSTAN_LWS_MANAGER`, else
/// what `hack/real-cluster/lws/build` put in the cache (run first, which builds nothing
/// when the cache is up to date).
pub fn locate() -> anyhow::Result<(PathBuf, PathBuf)> {
    super::upstream_manager("lws", MANAGER_ENV)
}

/// What [`start`] did with upstream's LeaderWorkerSet CRD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LwsCrd {
    /// capstan's, already installed, has upstream's schema: it stays.
    Capstan,
    /// capstan's differs from upstream's (or is not installed): upstream's replaced it.
    Upstream,
}

/// The running manager.
pub struct Manager {
    pub child: Child,
    /// Which LeaderWorkerSet CRD the cluster serves.
    pub crd: LwsCrd,
}

/// Starts upstream's manager against the cluster of `client` (whose admin kubeconfig is
/// `kubeconfig`), its files in `dir` (its configuration and webhook certificate) and its
/// output into `log`. capstan's CRDs must be installed already: upstream's LeaderWorkerSet
/// CRD replaces capstan's only when their schemas differ, and its other CRDs
/// (DisaggregatedSet...) are added. Returns once the webhooks answer.
pub async fn start(
    client: &kube::Client,
    kubeconfig: &Path,
    dir: &Path,
    log: &Path,
) -> anyhow::Result<Manager> {
    let (manager, crd_dir) = locate()?;
    let crd = install_upstream_crds(client, &crd_dir).await?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cert_dir = dir.join("lws-webhook-certs");
    std::fs::create_dir_all(&cert_dir)?;
    let ca_pem = webhook_certificate(&cert_dir)?;
    let config = dir.join("lws-manager-config.yaml");
    std::fs::write(&config, configuration(port, &cert_dir))?;

    let log = std::fs::File::create(log)?;
    let mut command = Command::new(&manager);
    command
        .arg(format!("--config={}", config.display()))
        .arg("--leader-elect=false")
        .env("KUBECONFIG", kubeconfig)
        .env("ENABLE_WEBHOOKS", "true")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            // The manager dies with the test process, even when that is killed.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {}", manager.display()))?;

    let webhooks = async {
        register_webhooks(client, port, &ca_pem).await?;
        wait_for_webhooks(client, &mut child).await
    };
    if let Err(err) = webhooks.await {
        let _ = child.kill();
        let _ = child.wait();
        return Err(err);
    }
    Ok(Manager { child, crd })
}

/// The manager's configuration: the webhook server on loopback with the certificate in
/// `cert_dir`, no certificate management, no leader election, no metrics or health servers.
fn configuration(port: u16, cert_dir: &Path) -> String {
    format!(
        "apiVersion: config.lws.x-k8s.io/v1alpha1
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: {port}
  certDir: {cert_dir}
metrics:
  bindAddress: \"0\"
health:
  healthProbeBindAddress: \"0\"
",
        cert_dir = cert_dir.display()
    )
}

/// Installs upstream's CRDs capstan does not serve, and upstream's LeaderWorkerSet CRD in
/// place of capstan's when their schemas differ.
async fn install_upstream_crds(client: &kube::Client, dir: &Path) -> anyhow::Result<LwsCrd> {
    let ours = capstan_api::crds::all();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = Vec::new();
    let mut crd = LwsCrd::Upstream;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let upstream: CustomResourceDefinition =
            serde_saphyr::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let name = upstream
            .metadata
            .name
            .clone()
            .context("CRD without a name")?;
        let Some(capstan) = ours
            .iter()
            .find(|crd| crd.metadata.name.as_ref() == Some(&name))
        else {
            missing.push(upstream);
            continue;
        };
        if same_schema(capstan, &upstream)? {
            crd = LwsCrd::Capstan;
            continue;
        }
        tracing::info!(crd = %name, "capstan's schema differs from upstream's: upstream's replaces it");
        let mut live = api
            .get(&name)
            .await
            .with_context(|| format!("reading CRD {name}"))?;
        live.spec = upstream.spec;
        api.replace(&name, &PostParams::default(), &live)
            .await
            .with_context(|| format!("replacing CRD {name} with upstream's"))?;
    }
    install_crds(client, missing).await?;
    Ok(crd)
}

/// Whether two CRDs serve the same kinds with the same schemas, descriptions aside.
fn same_schema(a: &CustomResourceDefinition, b: &CustomResourceDefinition) -> anyhow::Result<bool> {
    let shape = |crd: &CustomResourceDefinition| -> anyhow::Result<Value> {
        let mut spec = serde_json::to_value(&crd.spec)?;
        strip_descriptions(&mut spec);
        Ok(spec)
    };
    Ok(shape(a)? == shape(b)?)
}

fn strip_descriptions(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("description");
            map.values_mut().for_each(strip_descriptions);
        }
        Value::Array(list) => list.iter_mut().for_each(strip_descriptions),
        _ => {}
    }
}

/// Writes a CA and the webhook server's certificate for 127.0.0.1 (`tls.crt`, `tls.key`,
/// the names controller-runtime reads) into `dir`; returns the CA's PEM.
fn webhook_certificate(dir: &Path) -> anyhow::Result<String> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "capstan upstream LWS webhook CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(DnType::CommonName, "lws-webhook");
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.subject_alt_names = vec![SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())];
    let cert = params.signed_by(&key, &issuer)?;
    std::fs::write(dir.join("tls.crt"), cert.pem())?;
    std::fs::write(dir.join("tls.key"), key.serialize_pem())?;
    Ok(ca_pem)
}

/// Upstream's webhook configurations (`config/webhook/manifests.yaml` with its kustomize
/// patches: the pod webhooks select pods with the LWS name label), pointed at the loopback
/// server.
async fn register_webhooks(client: &kube::Client, port: u16, ca_pem: &str) -> anyhow::Result<()> {
    use base64::Engine as _;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let hook = |name: &str, path: &str, group: &str, resource: &str, operations: &[&str]| {
        let mut hook = json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca_bundle},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [{
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": operations,
                "resources": [resource],
            }],
        });
        if resource == "pods" {
            hook["objectSelector"] = json!({"matchExpressions": [
                {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"},
            ]});
        }
        hook
    };
    let lws = "leaderworkerset.x-k8s.io";
    let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "lws-mutating-webhook-configuration"},
        "webhooks": [
            hook("mleaderworkerset.kb.io", "/mutate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                lws, "leaderworkersets", &["CREATE", "UPDATE"]),
            hook("mpod.kb.io", "/mutate--v1-pod", "", "pods", &["CREATE"]),
        ],
    }))?;
    let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "lws-validating-webhook-configuration"},
        "webhooks": [
            hook("vleaderworkerset.kb.io", "/validate-leaderworkerset-x-k8s-io-v1-leaderworkerset",
                lws, "leaderworkersets", &["CREATE", "UPDATE"]),
            hook("vpod.kb.io", "/validate--v1-pod", "", "pods", &["CREATE", "UPDATE"]),
            hook("vdisaggregatedset.kb.io", "/validate-disaggregatedset-x-k8s-io-v1-disaggregatedset",
                "disaggregatedset.x-k8s.io", "disaggregatedsets", &["CREATE", "UPDATE"]),
        ],
    }))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .context("creating the MutatingWebhookConfiguration")?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .context("creating the ValidatingWebhookConfiguration")?;
    Ok(())
}

/// Waits until a LeaderWorkerSet passes admission (a dry run, which calls the webhooks as a
/// create does): the manager registers its webhooks only once its controllers are set up.
async fn wait_for_webhooks(client: &kube::Client, child: &mut Child) -> anyhow::Result<()> {
    let resource = ApiResource {
        group: "leaderworkerset.x-k8s.io".into(),
        version: "v1".into(),
        api_version: "leaderworkerset.x-k8s.io/v1".into(),
        kind: "LeaderWorkerSet".into(),
        plural: "leaderworkersets".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "webhook-probe"},
        "spec": {"leaderWorkerTemplate": {"workerTemplate": {"spec": {
            "containers": [{"name": "probe", "image": "registry.example/probe:1"}],
        }}}},
    }))?;
    let params = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let started = Instant::now();
    loop {
        let err = match api.create(&params, &probe).await {
            Ok(_) => return Ok(()),
            Err(err) => err,
        };
        if let Some(status) = child.try_wait()? {
            bail!("upstream's LWS manager exited ({status}) before its webhooks answered");
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!("upstream's LWS webhooks did not answer within {READY_TIMEOUT:?}: {err}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
