//! The preflight's read: whether the kmod image a node will pull for a Module exists in
//! its registry, as KMM waits for `ImageExists` before it schedules a worker. The image is
//! the Module's for the node's running kernel (its kernel mappings), asked for with the
//! Module's `imageRepoSecret` when it names one.

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;

use crate::controllers::kernel_mapping;
use crate::controllers::node::running_kernel;
use crate::controllers::upgrade::guard::Seen;
use capstan_api::labels::ModuleKey;
use capstan_api::module::Module;
use capstan_worker::image::{PullOptions, exists};
use capstan_worker::pull_secret::{self, PullSecret};

/// What the preflight sees of `key`'s image for `node`: passed when the registry has it;
/// not yet (looked at again until the preflight's timeout) when it does not, or cannot be
/// asked; failed when no kernel mapping covers the node's kernel.
pub async fn seen(client: &kube::Client, key: &ModuleKey, module: &Module, node: &Node) -> Seen {
    let kernel = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|info| running_kernel(&info.kernel_version).to_string())
        .unwrap_or_default();
    let Some(loader) = module.spec.module_loader.as_ref() else {
        return Seen::Passed(format!("{key} loads no module: no image to check"));
    };
    let config = match kernel_mapping::resolve(key, &loader.container, &kernel) {
        Ok(Some(config)) => config,
        Ok(None) => {
            return Seen::Failed(format!(
                "no kernel mapping of {key} covers the node's kernel {kernel:?}"
            ));
        }
        Err(err) => return Seen::Failed(format!("{key}: {err}")),
    };
    let image = config.container_image;
    let pull_secret = match module.spec.image_repo_secret.as_ref() {
        Some(secret) => match read_pull_secret(client, key.namespace(), &secret.name).await {
            Ok(found) => found,
            Err(why) => return Seen::NotYet(why),
        },
        None => PullSecret::default(),
    };
    let options = PullOptions {
        insecure: config.insecure_pull,
        insecure_registries: Vec::new(),
        pull_secret,
    };
    match exists(&image, &options).await {
        Ok(true) => Seen::Passed(format!("image {image} exists")),
        Ok(false) => Seen::NotYet(format!(
            "image {image} (kernel {kernel}) is not in its registry"
        )),
        Err(err) => Seen::NotYet(err.to_string()),
    }
}

/// The pull secret `name` in `namespace`, as the worker reads one.
async fn read_pull_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<PullSecret, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|err| format!("reading the pull secret {namespace}/{name}: {err}"))?
        .ok_or_else(|| format!("the pull secret {namespace}/{name} does not exist"))?;
    let data = secret.data.unwrap_or_default();
    let text = data
        .get(".dockerconfigjson")
        .or_else(|| data.get(".dockercfg"))
        .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
        .ok_or_else(|| format!("the pull secret {namespace}/{name} has no .dockerconfigjson"))?;
    pull_secret::parse(&text, &format!("secret {namespace}/{name}")).map_err(|err| err.to_string())
}
