//! Upstream KMM's operator manager (v2.6.0) beside a control plane: the reference the KMM
//! benchmark measures capstan against and the oracle the differential tests compare
//! capstan's decisions with. `hack/real-cluster/kmm/build` builds it into the cache.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::install_crds;

/// The namespace upstream's manager reads its configuration from.
pub const OPERATOR_NAMESPACE: &str = "kmm-operator-system";
const OPERATOR_CONFIG: &str = "kmm-operator-manager-config";
/// Set to a manager binary, it is used instead of the cache's.
pub const MANAGER_ENV: &str = "CAPSTAN_KMM_MANAGER";
/// client-go's default user agent starts with the binary's name: upstream's is `manager`.
pub const USER_AGENT_PREFIX: &str = "manager/";
/// The worker image upstream's manager writes into its worker pods.
pub const WORKER_IMAGE: &str = "registry.example/kmm-worker:v2.6.0";
/// The configuration upstream's manager reads from its ConfigMap: no leader election (a
/// single replica), no metrics or health servers; its webhooks are a separate binary
/// (`cmd/webhook-server`), not run.
const CONFIG: &str = "healthProbeBindAddress: \"0\"
leaderElection:
  enabled: false
  resourceID: kmm.sigs.x-k8s.io
metrics:
  bindAddress: \"0\"
  enableAuthnAuthz: false
  secureServing: false
";

/// Upstream's manager binary and the folder of its CRDs: `$CAPSTAN_KMM_MANAGER`, else
/// what `hack/real-cluster/kmm/build` put in the cache (run first, which builds nothing
/// when the cache is up to date).
pub fn locate() -> anyhow::Result<(PathBuf, PathBuf)> {
    super::upstream_manager("kmm", MANAGER_ENV)
}

/// Upstream's CRDs that capstan does not serve (ModuleImagesConfig, ModuleBuildSignConfig,
/// PreflightValidation...): upstream's manager watches them.
fn upstream_only_crds(dir: &Path) -> anyhow::Result<Vec<CustomResourceDefinition>> {
    let ours: Vec<String> = capstan_api::crds::all()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect();
    let mut crds = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        if !ours.contains(crd.metadata.name.as_ref().context("CRD without a name")?) {
            crds.push(crd);
        }
    }
    Ok(crds)
}

/// Starts upstream's manager against the cluster of `client` (whose admin kubeconfig is
/// `kubeconfig`), its output into `log`: installs the CRDs it needs beyond capstan's
/// (which must be installed already) and its configuration.
pub async fn start(client: &kube::Client, kubeconfig: &Path, log: &Path) -> anyhow::Result<Child> {
    let (manager, crds) = locate()?;
    install_crds(client, upstream_only_crds(&crds)?).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": OPERATOR_NAMESPACE}}))?,
        )
        .await?;
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": OPERATOR_CONFIG, "namespace": OPERATOR_NAMESPACE},
        "data": {"controller_config.yaml": CONFIG},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .create(&PostParams::default(), &config)
        .await?;
    let log = std::fs::File::create(log)?;
    Ok(Command::new(manager)
        .arg(format!("--config={OPERATOR_CONFIG}"))
        .env("KUBECONFIG", kubeconfig)
        .env("OPERATOR_NAMESPACE", OPERATOR_NAMESPACE)
        .env("RELATED_IMAGE_WORKER", WORKER_IMAGE)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}
