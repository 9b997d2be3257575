//! Which kinds the cluster serves and whether they are namespaced: the question a manifest
//! must answer before it can be applied. A live cluster answers from API discovery; without
//! one, [`StaticCatalog`] answers with every built-in kind of the Kubernetes release
//! k8s-openapi is built for (read from its types, so the two cannot disagree) and
//! capstan's CRDs. Some built-in kinds are requests, not objects ([`request_kind`]): no
//! repository can declare them, whatever the cluster.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{
    ClusterResourceScope, ListableResource, Metadata, NamespaceResourceScope, Resource,
    SubResourceScope,
};

use capstan_api::crds;

/// What the cluster serves. Live syncs answer from API discovery; offline plans use
/// [`StaticCatalog`].
pub trait Catalog {
    /// The scope of `kind` in `api_version` (`apps/v1`, `v1`), or `None` when the cluster
    /// does not serve it.
    fn scope(&self, api_version: &str, kind: &str) -> Option<Scope>;

    /// Why a manifest of `kind` in `api_version`, which [`Catalog::scope`] does not know,
    /// cannot be applied: the whole message of its error.
    fn unknown_kind(&self, api_version: &str, kind: &str) -> String {
        format!("kind {kind} in apiVersion {api_version} is not served by the cluster")
    }
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

/// Defines [`RELEASE`] with the one `k8s_if_1_*` macro of k8s-openapi that expands: the
/// one of the release it is built for.
macro_rules! release {
    ($($enabled:ident => $release:literal),+ $(,)?) => {
        $(k8s_openapi::$enabled! {
            /// The Kubernetes release k8s-openapi is built for (the `v1_*` feature of the
            /// workspace's k8s-openapi dependency): the release whose built-in kinds
            /// [`StaticCatalog`] knows.
            pub(super) const RELEASE: &str = $release;
        })+
    };
}

release! {
    k8s_if_1_33 => "1.33",
    k8s_if_1_34 => "1.34",
    k8s_if_1_35 => "1.35",
    k8s_if_1_36 => "1.36",
    k8s_if_1_37 => "1.37",
}

/// A built-in kind whose objects the API server stores: one a repository may declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct BuiltinKind {
    /// `apiVersion` (`autoscaling/v2`, `v1`).
    pub api_version: &'static str,
    /// `kind` (`HorizontalPodAutoscaler`).
    pub kind: &'static str,
    /// The resource in URL paths (`horizontalpodautoscalers`).
    pub plural: &'static str,
    /// Whether its objects live in a namespace.
    pub scope: Scope,
}

/// The scope of the objects of a k8s-openapi kind; subresources have none.
trait ObjectScope {
    const SCOPE: Scope;
}

impl ObjectScope for NamespaceResourceScope {
    const SCOPE: Scope = Scope::Namespaced;
}

impl ObjectScope for ClusterResourceScope {
    const SCOPE: Scope = Scope::Cluster;
}

/// The kind of k8s-openapi type `K`. Only types the API server lists (and so stores), with
/// an object's metadata and a namespace or cluster scope, compile.
const fn object<K>() -> BuiltinKind
where
    K: ListableResource + Metadata<Ty = ObjectMeta>,
    K::Scope: ObjectScope,
{
    BuiltinKind {
        api_version: K::API_VERSION,
        kind: K::KIND,
        plural: K::URL_PATH_SEGMENT,
        scope: <K::Scope as ObjectScope>::SCOPE,
    }
}

/// A slice of the kinds of k8s-openapi types, each named by its path under `k8s_openapi::`.
macro_rules! kinds {
    ($make:ident: $($($module:ident)::+),+ $(,)?) => {
        &[$($make::<k8s_openapi::$($module)::+>()),+]
    };
}

/// Every built-in kind of [`RELEASE`] whose objects a repository may declare, every served
/// version of it (alpha and beta too: offline, nothing tells which a cluster enables; a live
/// plan asks the cluster): every `Resource` type of k8s-openapi that is a `ListableResource`.
/// A type k8s-openapi drops fails to compile here; one it adds fails
/// `built_in_kinds_are_listed_from_the_pinned_release` until it is listed.
pub(super) const BUILTIN_KINDS: &[BuiltinKind] = kinds![object:
    api::admissionregistration::v1::MutatingAdmissionPolicy,
    api::admissionregistration::v1::MutatingAdmissionPolicyBinding,
    api::admissionregistration::v1::MutatingWebhookConfiguration,
    api::admissionregistration::v1::ValidatingAdmissionPolicy,
    api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    api::admissionregistration::v1::ValidatingWebhookConfiguration,
    api::admissionregistration::v1alpha1::MutatingAdmissionPolicy,
    api::admissionregistration::v1alpha1::MutatingAdmissionPolicyBinding,
    api::admissionregistration::v1beta1::MutatingAdmissionPolicy,
    api::admissionregistration::v1beta1::MutatingAdmissionPolicyBinding,
    api::apiserverinternal::v1alpha1::StorageVersion,
    api::apps::v1::ControllerRevision,
    api::apps::v1::DaemonSet,
    api::apps::v1::Deployment,
    api::apps::v1::ReplicaSet,
    api::apps::v1::StatefulSet,
    api::autoscaling::v1::HorizontalPodAutoscaler,
    api::autoscaling::v2::HorizontalPodAutoscaler,
    api::batch::v1::CronJob,
    api::batch::v1::Job,
    api::certificates::v1::CertificateSigningRequest,
    api::certificates::v1alpha1::ClusterTrustBundle,
    api::certificates::v1beta1::ClusterTrustBundle,
    api::certificates::v1beta1::PodCertificateRequest,
    api::coordination::v1::Lease,
    api::coordination::v1alpha2::LeaseCandidate,
    api::coordination::v1beta1::LeaseCandidate,
    api::core::v1::ComponentStatus,
    api::core::v1::ConfigMap,
    api::core::v1::Endpoints,
    api::core::v1::Event,
    api::core::v1::LimitRange,
    api::core::v1::Namespace,
    api::core::v1::Node,
    api::core::v1::PersistentVolume,
    api::core::v1::PersistentVolumeClaim,
    api::core::v1::Pod,
    api::core::v1::PodTemplate,
    api::core::v1::ReplicationController,
    api::core::v1::ResourceQuota,
    api::core::v1::Secret,
    api::core::v1::Service,
    api::core::v1::ServiceAccount,
    api::discovery::v1::EndpointSlice,
    api::events::v1::Event,
    api::flowcontrol::v1::FlowSchema,
    api::flowcontrol::v1::PriorityLevelConfiguration,
    api::networking::v1::IPAddress,
    api::networking::v1::Ingress,
    api::networking::v1::IngressClass,
    api::networking::v1::NetworkPolicy,
    api::networking::v1::ServiceCIDR,
    api::networking::v1beta1::IPAddress,
    api::networking::v1beta1::ServiceCIDR,
    api::node::v1::RuntimeClass,
    api::policy::v1::PodDisruptionBudget,
    api::rbac::v1::ClusterRole,
    api::rbac::v1::ClusterRoleBinding,
    api::rbac::v1::Role,
    api::rbac::v1::RoleBinding,
    api::resource::v1::DeviceClass,
    api::resource::v1::ResourceClaim,
    api::resource::v1::ResourceClaimTemplate,
    api::resource::v1::ResourceSlice,
    api::resource::v1alpha3::DeviceTaintRule,
    api::resource::v1alpha3::ResourcePoolStatusRequest,
    api::resource::v1beta1::DeviceClass,
    api::resource::v1beta1::ResourceClaim,
    api::resource::v1beta1::ResourceClaimTemplate,
    api::resource::v1beta1::ResourceSlice,
    api::resource::v1beta2::DeviceClass,
    api::resource::v1beta2::DeviceTaintRule,
    api::resource::v1beta2::ResourceClaim,
    api::resource::v1beta2::ResourceClaimTemplate,
    api::resource::v1beta2::ResourceSlice,
    api::scheduling::v1::PriorityClass,
    api::scheduling::v1alpha2::PodGroup,
    api::scheduling::v1alpha2::Workload,
    api::storage::v1::CSIDriver,
    api::storage::v1::CSINode,
    api::storage::v1::CSIStorageCapacity,
    api::storage::v1::StorageClass,
    api::storage::v1::VolumeAttachment,
    api::storage::v1::VolumeAttributesClass,
    api::storage::v1beta1::VolumeAttributesClass,
    api::storagemigration::v1beta1::StorageVersionMigration,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
];

/// A built-in kind the API server takes as a request and answers at once, keeping nothing:
/// there is no object to apply, compare or prune, so no repository can declare one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RequestKind {
    /// `apiVersion`.
    pub api_version: &'static str,
    /// `kind`.
    pub kind: &'static str,
    /// The resource it is sent to: its own (`tokenreviews`) or a subresource of another
    /// object (`eviction`, of `pods/<name>/eviction`).
    pub resource: &'static str,
    /// Whether `resource` is a subresource of another object.
    pub subresource: bool,
}

/// A kind created at a resource of its own and answered at once (`TokenReview`), never
/// listed: k8s-openapi does not make it a `ListableResource`.
const fn request<K>() -> RequestKind
where
    K: Metadata<Ty = ObjectMeta>,
    K::Scope: ObjectScope,
{
    RequestKind {
        api_version: K::API_VERSION,
        kind: K::KIND,
        resource: K::URL_PATH_SEGMENT,
        subresource: false,
    }
}

/// A kind sent to a subresource of another object (`Eviction` to `pods/<name>/eviction`).
const fn subresource<K>() -> RequestKind
where
    K: Resource<Scope = SubResourceScope> + Metadata<Ty = ObjectMeta>,
{
    RequestKind {
        api_version: K::API_VERSION,
        kind: K::KIND,
        resource: K::URL_PATH_SEGMENT,
        subresource: true,
    }
}

/// The built-in kinds of [`RELEASE`] that are requests, not objects: the rest of
/// k8s-openapi's `Resource` types but the API server's answers (`Status`, `APIGroup`,
/// `APIVersions`...), which nobody sends and which are therefore simply not served.
///
/// capstan applies every manifest with server-side apply and keeps applying it; a request
/// kind only answers a create (`kubectl create` sends it once), so applying it fails with
/// 405 Method Not Allowed, or for a subresource acts again on every apply (an Eviction
/// evicts). With Flux or Argo CD such a manifest fails the sync of its revision; capstan
/// rejects the commit the same way, before anything is applied and naming the manifest, in
/// a plan as in a sync.
pub(super) const REQUEST_KINDS: &[RequestKind] = &[
    request::<k8s_openapi::api::authentication::v1::SelfSubjectReview>(),
    request::<k8s_openapi::api::authentication::v1::TokenReview>(),
    request::<k8s_openapi::api::authorization::v1::LocalSubjectAccessReview>(),
    request::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>(),
    request::<k8s_openapi::api::authorization::v1::SelfSubjectRulesReview>(),
    request::<k8s_openapi::api::authorization::v1::SubjectAccessReview>(),
    request::<k8s_openapi::api::core::v1::Binding>(),
    subresource::<k8s_openapi::api::authentication::v1::TokenRequest>(),
    subresource::<k8s_openapi::api::autoscaling::v1::Scale>(),
    subresource::<k8s_openapi::api::policy::v1::Eviction>(),
];

/// The request kind `kind` in `api_version` is, if it is one.
pub(super) fn request_kind(api_version: &str, kind: &str) -> Option<&'static RequestKind> {
    REQUEST_KINDS
        .iter()
        .find(|request| request.api_version == api_version && request.kind == kind)
}

impl RequestKind {
    /// Why a manifest of this kind is refused.
    pub(super) fn refusal(&self) -> String {
        let RequestKind {
            api_version,
            kind,
            resource,
            subresource,
        } = self;
        let sent = if *subresource {
            format!("a request to the {resource} subresource of another object")
        } else {
            format!("a request (a create of {resource}) that the API server answers at once")
        };
        format!(
            "kind {kind} in apiVersion {api_version} is {sent}, not an object: nothing of it is \
             kept to apply, compare or prune, so it cannot be declared in Git; send it with \
             kubectl instead"
        )
    }
}

/// The kind and scope of a manifest, or why it cannot be applied: a request kind is refused
/// whatever the catalog (a live cluster's discovery lists `tokenreviews` like any resource),
/// an unknown kind as `catalog` explains.
pub(super) fn scope_of(
    catalog: &dyn Catalog,
    api_version: &str,
    kind: &str,
) -> Result<Scope, String> {
    if let Some(request) = request_kind(api_version, kind) {
        return Err(request.refusal());
    }
    catalog
        .scope(api_version, kind)
        .ok_or_else(|| catalog.unknown_kind(api_version, kind))
}

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

/// The kinds a cluster of [`RELEASE`] with capstan's CRDs serves: [`BUILTIN_KINDS`] and
/// the kinds of [`crds::all`]. Used where no cluster is at hand, as by the offline
/// `capstan plan`; the kinds of CRDs installed in a cluster are not among them.
#[derive(Clone, Debug)]
pub struct StaticCatalog {
    kinds: BTreeMap<(String, String), Scope>,
}

impl StaticCatalog {
    /// [`BUILTIN_KINDS`] and the kinds of [`crds::all`].
    pub fn new() -> Self {
        let builtins = BUILTIN_KINDS.iter().map(|builtin| {
            (
                (builtin.api_version.to_string(), builtin.kind.to_string()),
                builtin.scope,
            )
        });
        let custom = capstan_crds()
            .iter()
            .flat_map(served_by)
            .map(|(api_version, kind, scope)| ((api_version, kind), scope));
        StaticCatalog {
            kinds: builtins.chain(custom).collect(),
        }
    }

    /// What an unknown kind probably meant: the same kind written otherwise in
    /// `api_version` (`Configmap`, or the plural `horizontalpodautoscalers`), else the
    /// apiVersions that serve `kind`.
    fn near_miss(&self, api_version: &str, kind: &str) -> Option<String> {
        let lower = kind.to_ascii_lowercase();
        let plural = |version: &str, known: &str| {
            BUILTIN_KINDS
                .iter()
                .find(|builtin| builtin.api_version == version && builtin.kind == known)
                .map(|builtin| builtin.plural)
        };
        let written_otherwise = self.kinds.keys().find(|(version, known)| {
            version == api_version
                && (known.to_ascii_lowercase() == lower
                    || plural(version, known) == Some(lower.as_str()))
        });
        if let Some((_, meant)) = written_otherwise {
            return Some(format!("did you mean kind {meant}?"));
        }
        let versions: Vec<&str> = self
            .kinds
            .keys()
            .filter(|(_, known)| known == kind)
            .map(|(version, _)| version.as_str())
            .collect();
        (!versions.is_empty())
            .then(|| format!("{kind} is served as apiVersion {}", versions.join(" or ")))
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

    fn unknown_kind(&self, api_version: &str, kind: &str) -> String {
        let unknown = format!(
            "kind {kind} in apiVersion {api_version} is not served by Kubernetes {RELEASE}, \
             capstan's CRDs or a CRD of this commit"
        );
        match self.near_miss(api_version, kind) {
            Some(hint) => format!("{unknown}; {hint}"),
            None => format!(
                "{unknown}; the kinds of CRDs installed in the cluster are only known to a plan \
                 against it (--kubeconfig)"
            ),
        }
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

    fn unknown_kind(&self, api_version: &str, kind: &str) -> String {
        self.cluster.unknown_kind(api_version, kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The release whose k8s-openapi types [`BUILTIN_KINDS`] and [`REQUEST_KINDS`] list.
    const LISTED_FROM: &str = "1.36";

    #[test]
    fn built_in_kinds_are_listed_from_the_pinned_release() {
        assert_eq!(
            RELEASE,
            LISTED_FROM,
            "k8s-openapi is built for Kubernetes {RELEASE}, but BUILTIN_KINDS and REQUEST_KINDS \
             list the Resource types of its v1_{} module: list those of the new release's \
             module, then set LISTED_FROM",
            LISTED_FROM.replace("1.", "")
        );
    }

    #[test]
    fn static_catalog_knows_builtins_and_capstan_kinds() {
        let catalog = StaticCatalog::new();
        let namespaced = Some(Scope::Namespaced);
        let cluster = Some(Scope::Cluster);
        let cases = [
            ("v1", "Node", cluster),
            ("v1", "Namespace", cluster),
            ("v1", "ConfigMap", namespaced),
            ("apps/v1", "DaemonSet", namespaced),
            ("apps/v1", "Deployment", namespaced),
            ("autoscaling/v2", "HorizontalPodAutoscaler", namespaced),
            ("autoscaling/v1", "HorizontalPodAutoscaler", namespaced),
            ("rbac.authorization.k8s.io/v1", "Role", namespaced),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", namespaced),
            ("rbac.authorization.k8s.io/v1", "ClusterRole", cluster),
            ("networking.k8s.io/v1", "NetworkPolicy", namespaced),
            ("policy/v1", "PodDisruptionBudget", namespaced),
            ("batch/v1", "CronJob", namespaced),
            ("coordination.k8s.io/v1", "Lease", namespaced),
            ("resource.k8s.io/v1beta2", "ResourceClaim", namespaced),
            (
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                cluster,
            ),
            ("kmm.sigs.x-k8s.io/v1beta1", "Module", namespaced),
            ("kmm.sigs.x-k8s.io/v1beta1", "NodeModulesConfig", cluster),
            (
                "upgrade.managed.openshift.io/v1alpha1",
                "UpgradeConfig",
                namespaced,
            ),
            ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", namespaced),
            // Versions Kubernetes removed, or never had.
            ("apps/v1beta1", "Deployment", None),
            ("policy/v1beta1", "PodSecurityPolicy", None),
            ("kmm.sigs.x-k8s.io/v1", "Module", None),
            ("v1", "node", None),
            // Requests are not objects.
            ("policy/v1", "Eviction", None),
            ("authentication.k8s.io/v1", "TokenReview", None),
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
    fn every_built_in_kind_of_the_release_has_its_scope_and_plural() {
        // 88 kinds with objects and 10 requests: with the API server's answers (Status and
        // the four discovery documents), the 103 Resource types of k8s-openapi's v1_36.
        assert_eq!((BUILTIN_KINDS.len(), REQUEST_KINDS.len()), (88, 10));
        let mut seen = std::collections::BTreeSet::new();
        for builtin in BUILTIN_KINDS {
            assert!(
                seen.insert((builtin.api_version, builtin.kind)),
                "{builtin:?} is listed twice"
            );
        }
        let namespaced = Scope::Namespaced;
        let cluster = Scope::Cluster;
        let cases = [
            (
                "autoscaling/v2",
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
                namespaced,
            ),
            ("rbac.authorization.k8s.io/v1", "Role", "roles", namespaced),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                "clusterroles",
                cluster,
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "RoleBinding",
                "rolebindings",
                namespaced,
            ),
            (
                "networking.k8s.io/v1",
                "NetworkPolicy",
                "networkpolicies",
                namespaced,
            ),
            (
                "policy/v1",
                "PodDisruptionBudget",
                "poddisruptionbudgets",
                namespaced,
            ),
            ("batch/v1", "CronJob", "cronjobs", namespaced),
            ("networking.k8s.io/v1", "Ingress", "ingresses", namespaced),
            (
                "storage.k8s.io/v1",
                "StorageClass",
                "storageclasses",
                cluster,
            ),
            (
                "scheduling.k8s.io/v1",
                "PriorityClass",
                "priorityclasses",
                cluster,
            ),
            ("coordination.k8s.io/v1", "Lease", "leases", namespaced),
            (
                "admissionregistration.k8s.io/v1",
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
                cluster,
            ),
            (
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
                cluster,
            ),
            ("v1", "Endpoints", "endpoints", namespaced),
        ];
        for (api_version, kind, plural, scope) in cases {
            let builtin = BUILTIN_KINDS
                .iter()
                .find(|b| b.api_version == api_version && b.kind == kind);
            assert_eq!(
                builtin.map(|b| (b.plural, b.scope)),
                Some((plural, scope)),
                "{api_version} {kind}"
            );
        }
    }

    /// A cluster whose discovery lists every resource, as kube-apiserver lists
    /// `tokenreviews` and `bindings` beside stored kinds.
    struct ServesAnything;

    impl Catalog for ServesAnything {
        fn scope(&self, _api_version: &str, _kind: &str) -> Option<Scope> {
            Some(Scope::Namespaced)
        }
    }

    #[test]
    fn requests_are_refused_whatever_the_cluster_serves() {
        let offline = StaticCatalog::new();
        let refused = |api_version: &str, kind: &str| {
            [&offline as &dyn Catalog, &ServesAnything]
                .map(|catalog| scope_of(catalog, api_version, kind).is_err())
        };
        let cases = [
            ("authentication.k8s.io/v1", "TokenReview", true),
            ("authentication.k8s.io/v1", "SelfSubjectReview", true),
            ("authentication.k8s.io/v1", "TokenRequest", true),
            ("authorization.k8s.io/v1", "SubjectAccessReview", true),
            ("authorization.k8s.io/v1", "LocalSubjectAccessReview", true),
            ("v1", "Binding", true),
            ("policy/v1", "Eviction", true),
            ("autoscaling/v1", "Scale", true),
            ("autoscaling/v2", "HorizontalPodAutoscaler", false),
            ("rbac.authorization.k8s.io/v1", "RoleBinding", false),
        ];
        for (api_version, kind, expected) in cases {
            assert_eq!(
                refused(api_version, kind),
                [expected; 2],
                "{api_version} {kind}"
            );
        }
        assert_eq!(
            scope_of(&offline, "policy/v1", "Eviction"),
            Err(
                "kind Eviction in apiVersion policy/v1 is a request to the eviction subresource \
                 of another object, not an object: nothing of it is kept to apply, compare or \
                 prune, so it cannot be declared in Git; send it with kubectl instead"
                    .to_string()
            )
        );
        assert_eq!(
            scope_of(&offline, "authentication.k8s.io/v1", "TokenReview"),
            Err(
                "kind TokenReview in apiVersion authentication.k8s.io/v1 is a request (a create \
                 of tokenreviews) that the API server answers at once, not an object: nothing \
                 of it is kept to apply, compare or prune, so it cannot be declared in Git; send \
                 it with kubectl instead"
                    .to_string()
            )
        );
    }

    #[test]
    fn an_unknown_kind_says_what_was_probably_meant() {
        let catalog = StaticCatalog::new();
        let cases = [
            ("v1", "Configmap", Some("did you mean kind ConfigMap?")),
            (
                "autoscaling/v2",
                "horizontalpodautoscalers",
                Some("did you mean kind HorizontalPodAutoscaler?"),
            ),
            (
                "apps/v1beta1",
                "Deployment",
                Some("Deployment is served as apiVersion apps/v1"),
            ),
            (
                "autoscaling/v2beta2",
                "HorizontalPodAutoscaler",
                Some(
                    "HorizontalPodAutoscaler is served as apiVersion autoscaling/v1 or \
                     autoscaling/v2",
                ),
            ),
            (
                "kmm.sigs.x-k8s.io/v1",
                "Module",
                Some("Module is served as apiVersion kmm.sigs.x-k8s.io/v1beta1"),
            ),
            ("cert-manager.io/v1", "Certificate", None),
        ];
        for (api_version, kind, expected) in cases {
            assert_eq!(
                catalog.near_miss(api_version, kind).as_deref(),
                expected,
                "{api_version} {kind}"
            );
        }
        assert_eq!(
            catalog.unknown_kind("cert-manager.io/v1", "Certificate"),
            format!(
                "kind Certificate in apiVersion cert-manager.io/v1 is not served by Kubernetes \
                 {RELEASE}, capstan's CRDs or a CRD of this commit; the kinds of CRDs installed \
                 in the cluster are only known to a plan against it (--kubeconfig)"
            )
        );
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
