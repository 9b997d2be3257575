//! A client that acts as a ServiceAccount (`Impersonate-User`), so that the RBAC of the
//! ServiceAccount the cluster's admin names in `GitSync.spec.reach.serviceAccount` bounds
//! what the sync writes, as Flux's `serviceAccountName` does. The API server adds the
//! ServiceAccount's groups itself (`system:serviceaccounts`, `system:serviceaccounts:<ns>`).

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use kube::client::Body;

use capstan_api::capstan::ServiceAccountRef;

/// The user name the API server gives `account`.
pub fn user_of(account: &ServiceAccountRef) -> String {
    format!(
        "system:serviceaccount:{}:{}",
        account.namespace, account.name
    )
}

/// `client`, sending every request as `account`; `None` when the names cannot be a header
/// (a ServiceAccount's namespace and name are DNS labels and subdomains, so never).
pub fn as_service_account(
    client: &kube::Client,
    account: &ServiceAccountRef,
) -> Option<kube::Client> {
    let user = HeaderValue::from_str(&user_of(account)).ok()?;
    let service = Impersonating {
        inner: client.clone(),
        user,
    };
    Some(kube::Client::new(service, client.default_namespace()))
}

#[derive(Clone)]
struct Impersonating {
    inner: kube::Client,
    user: HeaderValue,
}

impl tower::Service<Request<Body>> for Impersonating {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, kube::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        // `kube::Client` buffers its requests and is always ready to take one.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        request
            .headers_mut()
            .insert("Impersonate-User", self.user.clone());
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(request).await })
    }
}
