//! Which kinds the cluster serves and whether they are namespaced: the question a manifest
//! must answer before it can be applied.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use capstan_api::crds;

/// What the cluster serves. Live syncs answer from API discovery; offline plans use
/// [`StaticCatalog`].
pub trait Catalog {
    /// The scope of `kind` in `api_version` (`apps/v1`, `v1`), or `None` when the cluster
    /// does not serve it.
    fn scope(&self, api_version: &str, kind: &str) -> Option<Scope>;
}

/// Whether objects of a kind live in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Scope {
    /// Every object has a namespace (`Module`, `ConfigMap`).
    Namespaced,
    /// Objects have no namespace (`Node`, `Namespace`).
    Cluster,
}

impl Scope {
    /// Reads a CRD's `spec.scope`; `None` for anything but `Namespaced` or `Cluster`.
    pub fn from_crd_scope(scope: &str) -> Option<Self> {
        match scope {
            "Namespaced" => Some(Scope::Namespaced),
            "Cluster" => Some(Scope::Cluster),
            _ => None,
        }
    }
}

/// The built-in kinds capstan's embedded cluster serves.
const BUILTIN_KINDS: &[(&str, &str, Scope)] = &[
    ("v1", "Namespace", Scope::Cluster),
    ("v1", "Node", Scope::Cluster),
    ("v1", "Pod", Scope::Namespaced),
    ("v1", "ConfigMap", Scope::Namespaced),
    ("v1", "Secret", Scope::Namespaced),
    ("v1", "ServiceAccount", Scope::Namespaced),
    ("v1", "Service", Scope::Namespaced),
    ("apps/v1", "DaemonSet", Scope::Namespaced),
    ("apps/v1", "StatefulSet", Scope::Namespaced),
    ("policy/v1", "PodDisruptionBudget", Scope::Namespaced),
    ("coordination.k8s.io/v1", "Lease", Scope::Namespaced),
    (
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        Scope::Cluster,
    ),
];

/// capstan's own CRDs, generated once: generating them is slow in debug builds.
static CAPSTAN_CRDS: LazyLock<Vec<CustomResourceDefinition>> = LazyLock::new(crds::all);

/// capstan's own CRDs ([`crds::all`]), generated on first use.
pub(super) fn capstan_crds() -> &'static [CustomResourceDefinition] {
    &CAPSTAN_CRDS
}

/// The `(apiVersion, kind, scope)` of every version a CRD serves. A CRD with an invalid
/// scope serves nothing.
pub(super) fn served_by(crd: &CustomResourceDefinition) -> Vec<(String, String, Scope)> {
    let Some(scope) = Scope::from_crd_scope(&crd.spec.scope) else {
        return Vec::new();
    };
    crd.spec
        .versions
        .iter()
        .filter(|version| version.served)
        .map(|version| {
            (
                format!("{}/{}", crd.spec.group, version.name),
                crd.spec.names.kind.clone(),
                scope,
            )
        })
        .collect()
}

/// The kinds capstan's embedded cluster serves: its built-in kinds and capstan's CRDs.
/// Used where no cluster is at hand, as by the offline `capstan plan`.
#[derive(Clone, Debug)]
pub struct StaticCatalog {
    kinds: BTreeMap<(String, String), Scope>,
}

impl StaticCatalog {
    /// The built-in kinds (v1 Namespace, Node, Pod, ConfigMap, Secret, ServiceAccount,
    /// Service; apps/v1 DaemonSet, StatefulSet; policy/v1 PodDisruptionBudget;
    /// coordination.k8s.io/v1 Lease; apiextensions.k8s.io/v1 CustomResourceDefinition)
    /// and the kinds of [`crds::all`].
    pub fn new() -> Self {
        let builtins = BUILTIN_KINDS.iter().map(|(api_version, kind, scope)| {
            ((api_version.to_string(), kind.to_string()), *scope)
        });
        let custom = capstan_crds()
            .iter()
            .flat_map(served_by)
            .map(|(api_version, kind, scope)| ((api_version, kind), scope));
        StaticCatalog {
            kinds: builtins.chain(custom).collect(),
        }
    }
}

impl Default for StaticCatalog {
    fn default() -> Self {
        StaticCatalog::new()
    }
}

impl Catalog for StaticCatalog {
    fn scope(&self, api_version: &str, kind: &str) -> Option<Scope> {
        self.kinds
            .get(&(api_version.to_string(), kind.to_string()))
            .copied()
    }
}

/// The catalog a commit is checked against: the cluster's, plus the kinds of the CRDs the
/// commit itself declares (they are applied before the objects that use them).
pub(super) struct CommitCatalog<'a> {
    cluster: &'a dyn Catalog,
    declared: BTreeMap<(String, String), Scope>,
}

impl<'a> CommitCatalog<'a> {
    /// `cluster` extended with the kinds `crds` serve.
    pub fn new(cluster: &'a dyn Catalog, crds: &[CustomResourceDefinition]) -> Self {
        let declared = crds
            .iter()
            .flat_map(served_by)
            .map(|(api_version, kind, scope)| ((api_version, kind), scope))
            .collect();
        CommitCatalog { cluster, declared }
    }
}

impl Catalog for CommitCatalog<'_> {
    fn scope(&self, api_version: &str, kind: &str) -> Option<Scope> {
        self.declared
            .get(&(api_version.to_string(), kind.to_string()))
            .copied()
            .or_else(|| self.cluster.scope(api_version, kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_catalog_knows_builtins_and_capstan_kinds() {
        let catalog = StaticCatalog::new();
        let cases = [
            ("v1", "Node", Some(Scope::Cluster)),
            ("v1", "Namespace", Some(Scope::Cluster)),
            ("v1", "ConfigMap", Some(Scope::Namespaced)),
            ("apps/v1", "DaemonSet", Some(Scope::Namespaced)),
            ("policy/v1", "PodDisruptionBudget", Some(Scope::Namespaced)),
            ("coordination.k8s.io/v1", "Lease", Some(Scope::Namespaced)),
            (
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                Some(Scope::Cluster),
            ),
            (
                "kmm.sigs.x-k8s.io/v1beta1",
                "Module",
                Some(Scope::Namespaced),
            ),
            (
                "kmm.sigs.x-k8s.io/v1beta1",
                "NodeModulesConfig",
                Some(Scope::Cluster),
            ),
            (
                "upgrade.managed.openshift.io/v1alpha1",
                "UpgradeConfig",
                Some(Scope::Namespaced),
            ),
            (
                "leaderworkerset.x-k8s.io/v1",
                "LeaderWorkerSet",
                Some(Scope::Namespaced),
            ),
            ("apps/v1", "Deployment", None),
            ("kmm.sigs.x-k8s.io/v1", "Module", None),
            ("v1", "node", None),
        ];
        for (api_version, kind, scope) in cases {
            assert_eq!(
                catalog.scope(api_version, kind),
                scope,
                "{api_version} {kind}"
            );
        }
    }

    #[test]
    fn commit_catalog_adds_declared_crds() {
        let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "names": {"kind": "Widget", "plural": "widgets"},
                "scope": "Cluster",
                "versions": [
                    {"name": "v1", "served": true, "storage": true},
                    {"name": "v0", "served": false, "storage": false}
                ]
            }
        }))
        .unwrap();
        let cluster = StaticCatalog::new();
        let catalog = CommitCatalog::new(&cluster, &[crd]);
        assert_eq!(
            catalog.scope("example.com/v1", "Widget"),
            Some(Scope::Cluster)
        );
        assert_eq!(catalog.scope("example.com/v0", "Widget"), None);
        assert_eq!(catalog.scope("v1", "Node"), Some(Scope::Cluster));
    }
}
