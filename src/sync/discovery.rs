//! The kinds a live cluster serves, from API discovery: the [`Catalog`] manifests are
//! checked against, and the [`ApiResource`] each manifest is applied through.

use std::collections::HashMap;

use kube::api::{Api, DynamicObject};
use kube::discovery::{ApiResource, Discovery, Scope as KubeScope};

use super::manifests::{Catalog, Scope};

/// Every kind the cluster serves, by `(apiVersion, kind)`.
#[derive(Clone, Debug, Default)]
pub struct ClusterKinds {
    kinds: HashMap<(String, String), (ApiResource, Scope)>,
    /// The namespaced kinds that can be listed, each once, at its group's preferred version.
    namespaced_lists: Vec<ApiResource>,
}

impl ClusterKinds {
    /// Runs API discovery (every group, every served version).
    pub async fn discover(client: &kube::Client) -> Result<Self, kube::Error> {
        let discovery = Discovery::new(client.clone()).run().await?;
        let mut kinds = HashMap::new();
        let mut namespaced_lists = Vec::new();
        for group in discovery.groups() {
            for (resource, capabilities) in group.recommended_resources() {
                if capabilities.scope == KubeScope::Namespaced
                    && capabilities.supports_operation(kube::discovery::verbs::LIST)
                    && !resource.plural.contains('/')
                {
                    namespaced_lists.push(resource);
                }
            }
            for version in group.versions() {
                for (resource, capabilities) in group.versioned_resources(version) {
                    // Subresources (pods/status) share the kind of their parent.
                    if resource.plural.contains('/') {
                        continue;
                    }
                    let scope = match capabilities.scope {
                        KubeScope::Namespaced => Scope::Namespaced,
                        KubeScope::Cluster => Scope::Cluster,
                    };
                    kinds
                        .entry((resource.api_version.clone(), resource.kind.clone()))
                        .or_insert((resource, scope));
                }
            }
        }
        Ok(ClusterKinds {
            kinds,
            namespaced_lists,
        })
    }

    /// Every namespaced kind the cluster can list, once each.
    pub fn namespaced_lists(&self) -> &[ApiResource] {
        &self.namespaced_lists
    }

    /// The resource serving `kind` in `api_version`.
    pub fn resource(&self, api_version: &str, kind: &str) -> Option<&ApiResource> {
        self.kinds
            .get(&(api_version.to_string(), kind.to_string()))
            .map(|(resource, _)| resource)
    }

    /// An API for objects of `kind` in `api_version`: in `namespace`, or cluster-wide
    /// (`None`: cluster-scoped objects, or every namespace for a list).
    pub fn api(
        &self,
        client: &kube::Client,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
    ) -> Option<Api<DynamicObject>> {
        let resource = self.resource(api_version, kind)?;
        Some(match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        })
    }
}

impl Catalog for ClusterKinds {
    fn scope(&self, api_version: &str, kind: &str) -> Option<Scope> {
        self.kinds
            .get(&(api_version.to_string(), kind.to_string()))
            .map(|(_, scope)| *scope)
    }
}
