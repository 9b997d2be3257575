//! The preflight check: before capstan starts, one `SelfSubjectAccessReview` per verb and
//! resource the process needs ([`super::needs`]), and an error naming every one the
//! cluster denies, who needs it and why, instead of a 403 from deep inside a controller
//! minutes later.
//!
//! Who asks is found with a `SelfSubjectReview` where the server answers one. A server
//! that does not serve `SelfSubjectAccessReview` (404) is not checked: capstan says so and
//! starts.

use std::collections::BTreeMap;
use std::fmt;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use super::{Need, Part, Scope, Usage, needs};
use crate::deploy;

/// Reviews in flight at once: enough to check capstan's 75 or so permissions in a few
/// round trips, few enough not to look like a flood to the API server's priority and
/// fairness.
const CONCURRENCY: usize = 8;

/// One verb on one resource, cluster-wide or in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    pub group: &'static str,
    /// With its subresource after a slash: `pods/eviction`.
    pub resource: &'static str,
    pub verb: &'static str,
    /// `None`: cluster-wide.
    pub namespace: Option<String>,
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} (group {:?}, ",
            self.verb, self.resource, self.group
        )?;
        match &self.namespace {
            Some(namespace) => write!(f, "namespace {namespace})"),
            None => f.write_str("cluster-wide)"),
        }
    }
}

impl Permission {
    /// The review that asks for it.
    pub fn review(&self) -> SelfSubjectAccessReview {
        let (resource, subresource) = match self.resource.split_once('/') {
            Some((resource, subresource)) => (resource, Some(subresource.to_string())),
            None => (self.resource, None),
        };
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(self.group.to_string()),
                    resource: Some(resource.to_string()),
                    subresource,
                    verb: Some(self.verb.to_string()),
                    namespace: self.namespace.clone(),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        }
    }
}

/// Every permission `needs` asks for, each with the rows that need it, in permission
/// order. A [`Scope::LeaseNamespace`] row is asked in `lease_namespace`.
pub fn permissions<'a>(
    needs: impl IntoIterator<Item = &'a Need>,
    lease_namespace: Option<&str>,
) -> Vec<(Permission, Vec<&'a Need>)> {
    let mut asked: BTreeMap<Permission, Vec<&'a Need>> = BTreeMap::new();
    for need in needs {
        let namespace = match need.scope {
            Scope::Cluster => None,
            Scope::LeaseNamespace => lease_namespace.map(str::to_string),
        };
        for verb in need.verbs {
            let permission = Permission {
                verb,
                group: need.group,
                resource: need.resource,
                namespace: namespace.clone(),
            };
            asked.entry(permission).or_default().push(need);
        }
    }
    asked.into_iter().collect()
}

/// A permission denied, and what needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub permission: Permission,
    /// Each part that needs it, with why.
    pub needed_by: Vec<(Part, &'static str)>,
}

/// The permissions the cluster denies capstan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingPermissions {
    /// Who capstan is to the cluster, when it says.
    pub user: Option<String>,
    pub denied: Vec<Denied>,
}

impl fmt::Display for MissingPermissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the cluster denies capstan")?;
        if let Some(user) = &self.user {
            write!(f, " ({user})")?;
        }
        writeln!(f, " {} permission(s) it needs:", self.denied.len())?;
        for denied in &self.denied {
            let why: Vec<String> = denied
                .needed_by
                .iter()
                .map(|(part, why)| format!("{part} {why}"))
                .collect();
            writeln!(f, "  {}: {}", denied.permission, why.join("; "))?;
        }
        let lease = |d: &Denied| d.permission.namespace.is_some();
        let shipped = match (
            self.denied.iter().any(|d| !lease(d)),
            self.denied.iter().any(lease),
        ) {
            (true, true) => format!(
                "the ClusterRole and Role capstan ships ({} and {}, or the Helm chart {}) grant them",
                deploy::CLUSTER_ROLE_FILE,
                deploy::ELECTION_ROLE_FILE,
                deploy::CHART_DIR
            ),
            (false, true) => format!(
                "the Role capstan ships ({}, or the Helm chart {}) grants them",
                deploy::ELECTION_ROLE_FILE,
                deploy::CHART_DIR
            ),
            _ => format!(
                "the ClusterRole capstan ships ({}, or the Helm chart {}) grants them",
                deploy::CLUSTER_ROLE_FILE,
                deploy::CHART_DIR
            ),
        };
        f.write_str(&shipped)
    }
}

impl std::error::Error for MissingPermissions {}

/// Why the check did not pass.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The cluster denies some permissions.
    #[error("{0}")]
    Denied(MissingPermissions),
    /// A review could not be made (the API server unreachable, say).
    #[error("asking the API server whether capstan may {permission}: {source}")]
    Review {
        permission: Permission,
        #[source]
        source: kube::Error,
    },
}

/// The permissions of `asked` that `allowed` (one answer each, in the same order) does
/// not grant, with the parts that need them.
pub fn denied(asked: &[(Permission, Vec<&Need>)], allowed: &[bool]) -> Vec<Denied> {
    asked
        .iter()
        .zip(allowed)
        .filter(|(_, allowed)| !**allowed)
        .map(|((permission, needs), _)| Denied {
            permission: permission.clone(),
            needed_by: needs.iter().map(|need| (need.part, need.why)).collect(),
        })
        .collect()
}

/// What the API server said of one permission.
enum Answer {
    Allowed(bool),
    /// It serves no `SelfSubjectAccessReview`.
    NotServed,
}

/// Asks the API server whether capstan has every permission `usage` needs.
///
/// Fails with [`CheckError::Denied`] naming each permission denied, or
/// [`CheckError::Review`] when a review cannot be made. A server that does not serve
/// `SelfSubjectAccessReview` passes, with a warning.
pub async fn check(client: &kube::Client, usage: &Usage<'_>) -> Result<(), CheckError> {
    let asked = permissions(needs(usage), usage.lease_namespace);
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answers: Vec<Answer> = futures::stream::iter(asked.iter().map(|(permission, _)| {
        let reviews = reviews.clone();
        async move {
            match reviews
                .create(&PostParams::default(), &permission.review())
                .await
            {
                Ok(review) => Ok(Answer::Allowed(review.status.is_some_and(|s| s.allowed))),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(Answer::NotServed),
                Err(source) => Err(CheckError::Review {
                    permission: permission.clone(),
                    source,
                }),
            }
        }
    }))
    .buffered(CONCURRENCY)
    .try_collect()
    .await?;
    let mut allowed = Vec::with_capacity(answers.len());
    for answer in answers {
        match answer {
            Answer::Allowed(yes) => allowed.push(yes),
            Answer::NotServed => {
                tracing::warn!(
                    "the API server does not serve SelfSubjectAccessReview: capstan's permissions are not checked"
                );
                return Ok(());
            }
        }
    }
    let denied = denied(&asked, &allowed);
    if denied.is_empty() {
        tracing::debug!(
            permissions = asked.len(),
            "every permission capstan needs is granted"
        );
        return Ok(());
    }
    Err(CheckError::Denied(MissingPermissions {
        user: user(client).await,
        denied,
    }))
}

/// Who the cluster takes capstan for (`system:serviceaccount:capstan-system:capstan`);
/// `None` when it does not say.
async fn user(client: &kube::Client) -> Option<String> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}
