//! Checking [`super::NEEDS`] against what the code does: the RBAC attributes of each
//! request a client sends (as kube-apiserver's RequestInfo reads them from the method and
//! path), whether a set of rules grants them, and a client that records them, so that a
//! test can run capstan against the embedded cluster (which authorizes nothing) and find
//! every request the shipped roles would deny.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use http::{Method, Uri};
use k8s_openapi::api::rbac::v1::PolicyRule;

/// What RBAC decides a request on: a verb on a resource (with its subresource after a
/// slash) of a group, in a namespace or cluster-wide.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Request {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub namespace: Option<String>,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} (group {:?}", self.verb, self.resource, self.group)?;
        match &self.namespace {
            Some(namespace) => write!(f, ", namespace {namespace})"),
            None => f.write_str(")"),
        }
    }
}

/// The attributes of a request to `uri` with `method`; `None` for a path that names no
/// resource (discovery, `/version`, `/openapi`), which every authenticated user may read.
pub fn request_of(method: &Method, uri: &Uri) -> Option<Request> {
    let parts: Vec<&str> = uri.path().split('/').filter(|p| !p.is_empty()).collect();
    let rest = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (group, rest) = rest;
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let (namespace, resource, name, subresource) = match rest {
        [] => return None,
        ["namespaces", namespace, resource, tail @ ..] => (
            Some(namespace.to_string()),
            *resource,
            tail.first(),
            tail.get(1),
        ),
        ["namespaces", name, tail @ ..] => (None, "namespaces", Some(name), tail.first()),
        [resource, tail @ ..] => (None, *resource, tail.first(), tail.get(1)),
    };
    let watching = legacy_watch
        || uri.query().is_some_and(|query| {
            form_urlencoded::parse(query.as_bytes())
                .any(|(key, value)| key == "watch" && (value == "true" || value == "1"))
        });
    let verb = match (method, name) {
        (&Method::GET | &Method::HEAD, _) if watching => "watch",
        (&Method::GET | &Method::HEAD, Some(_)) => "get",
        (&Method::GET | &Method::HEAD, None) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, Some(_)) => "delete",
        (&Method::DELETE, None) => "deletecollection",
        _ => return None,
    };
    let resource = match subresource {
        Some(subresource) => format!("{resource}/{subresource}"),
        None => resource.to_string(),
    };
    Some(Request {
        group: group.to_string(),
        resource,
        verb: verb.to_string(),
        namespace,
    })
}

/// Whether `rules` grant `request` (resource names aside: capstan's rules name none).
pub fn granted(rules: &[PolicyRule], request: &Request) -> bool {
    let has = |list: &Option<Vec<String>>, wanted: &str| {
        list.iter()
            .flatten()
            .any(|item| item == "*" || item == wanted)
    };
    rules.iter().any(|rule| {
        has(&rule.api_groups, &request.group)
            && has(&rule.resources, &request.resource)
            && rule
                .verbs
                .iter()
                .any(|verb| verb == "*" || *verb == request.verb)
    })
}

/// What a [`recording`] client has asked so far.
pub type Recorded = Arc<Mutex<BTreeSet<Request>>>;

/// A client on `config` that records the attributes of every request it sends.
pub fn recording(config: kube::Config) -> Result<(kube::Client, Recorded), kube::Error> {
    let recorded: Recorded = Arc::default();
    let log = recorded.clone();
    let layer =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            if let Some(asked) = request_of(request.method(), request.uri()) {
                log.lock().expect("the record").insert(asked);
            }
            request
        });
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&layer)
        .build();
    Ok((client, recorded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(method: Method, uri: &str) -> Option<String> {
        request_of(&method, &uri.parse().expect("uri")).map(|r| r.to_string())
    }

    #[test]
    fn requests_read_as_kube_apiserver_reads_them() {
        let cases: &[(Method, &str, Option<&str>)] = &[
            (
                Method::GET,
                "/api/v1/nodes",
                Some("list nodes (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/nodes?watch=true&resourceVersion=1",
                Some("watch nodes (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/watch/nodes",
                Some("watch nodes (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/nodes/n1",
                Some("get nodes (group \"\")"),
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n1?fieldManager=capstan",
                Some("patch nodes (group \"\")"),
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n1/status",
                Some("patch nodes/status (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                Some("list namespaces (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/kmm",
                Some("get namespaces (group \"\")"),
            ),
            (
                Method::GET,
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1",
                Some("list pods (group \"\")"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/kmm/pods/w/eviction",
                Some("create pods/eviction (group \"\", namespace kmm)"),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/kmm/daemonsets/ds",
                Some("delete daemonsets (group \"apps\", namespace kmm)"),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/kmm/daemonsets",
                Some("deletecollection daemonsets (group \"apps\", namespace kmm)"),
            ),
            (
                Method::PUT,
                "/apis/kmm.sigs.x-k8s.io/v1beta1/modules/x/status",
                Some("update modules/status (group \"kmm.sigs.x-k8s.io\")"),
            ),
            (
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Some("create selfsubjectaccessreviews (group \"authorization.k8s.io\")"),
            ),
            (Method::GET, "/apis", None),
            (Method::GET, "/apis/apps/v1", None),
            (Method::GET, "/api/v1", None),
            (Method::GET, "/version", None),
            (Method::GET, "/openapi/v3", None),
        ];
        for (method, uri, expected) in cases {
            assert_eq!(
                shown(method.clone(), uri).as_deref(),
                *expected,
                "{method} {uri}"
            );
        }
    }

    #[test]
    fn rules_grant_their_verbs_on_their_resources_only() {
        let rules = [super::super::rule(
            "",
            &["pods", "pods/eviction"],
            &["list", "create"],
        )];
        let cases: &[(&str, &str, &str, bool)] = &[
            ("", "pods", "list", true),
            ("", "pods/eviction", "create", true),
            ("", "pods", "delete", false),
            ("", "pods/status", "list", false),
            ("apps", "pods", "list", false),
        ];
        for (group, resource, verb, expected) in cases {
            let request = Request {
                group: group.to_string(),
                resource: resource.to_string(),
                verb: verb.to_string(),
                namespace: None,
            };
            assert_eq!(granted(&rules, &request), *expected, "{request}");
        }
    }
}
