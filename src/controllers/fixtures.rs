//! Reconcile fixtures: a `kube::Client` whose API server is the test, as in kube-rs's
//! controller-rs `fixtures.rs`. A scenario states the exact calls one reconcile must
//! make, in order (method, path with its query, and the body), and the answer each one
//! gets; [`ApiServer::run`] fails the test on a call out of order, a call too many, or
//! one that never came. A reader of the scenario sees what the controller does to the
//! cluster.

use std::pin::pin;

use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;

/// One call a reconcile must make, and the API server's answer.
#[derive(Clone, Debug)]
pub struct Call {
    /// `GET`, `POST`, `PATCH`, `PUT`, `DELETE`.
    pub method: &'static str,
    /// Path and query, as sent: `/api/v1/nodes/n1?fieldManager=capstan-nmc`.
    pub path: String,
    /// The JSON body the call must send; `None` when it sends none (or, for a
    /// [`Call::any_body`], when the scenario does not look at it).
    pub body: Option<Value>,
    /// Whether the body is compared.
    pub check_body: bool,
    /// The status and JSON body of the answer.
    pub status: u16,
    pub answer: Value,
}

impl Call {
    /// A call without a body, answered 200 with `answer`.
    pub fn get(path: impl Into<String>, answer: Value) -> Call {
        Call::new("GET", path, None, answer)
    }

    /// A call with `method` and `body`, answered 200 with `answer`.
    pub fn new(
        method: &'static str,
        path: impl Into<String>,
        body: Option<Value>,
        answer: Value,
    ) -> Call {
        Call {
            method,
            path: path.into(),
            body,
            check_body: true,
            status: 200,
            answer,
        }
    }

    /// The same call, its body not compared (a pod spec the worker-pod tests cover).
    pub fn any_body(mut self) -> Call {
        self.check_body = false;
        self
    }

    /// The same call, answered with `status` and a Kubernetes `Status` of `reason`.
    pub fn failing(mut self, status: u16, reason: &str) -> Call {
        self.status = status;
        self.answer = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "code": status, "message": reason,
        });
        self
    }
}

/// The creation of an Event in `namespace` (`default` for a cluster-scoped object's), its
/// body not compared: it carries a random name and the wall-clock time.
pub fn event(namespace: &str) -> Call {
    Call::new(
        "POST",
        format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events?"),
        None,
        serde_json::json!({"apiVersion": "events.k8s.io/v1", "kind": "Event"}),
    )
    .any_body()
}

/// The merge commit of pull request #12, which the scenarios' `GitSync`s list as applied.
pub const SHA_12: &str = "3cf3bea1c2d4e5f60718293a4b5c6d7e8f901234";
/// [`SHA_12`]'s `capstan.dev/revision`.
pub const REVISION_12: &str = "main@sha1:3cf3bea1c2d4e5f60718293a4b5c6d7e8f901234";

/// [`SHA_12`] as a `GitSync` status and the history records name it.
pub fn commit_12() -> Value {
    serde_json::json!({
        "sha": SHA_12,
        "shortSha": "3cf3bea",
        "revision": REVISION_12,
        "author": "Ada",
        "time": "2026-11-26T08:13:58Z",
        "subject": "Move the fleet to v2 (#12)",
        "pullRequest": 12,
    })
}

/// A cache holding `objects`, as a watch's first listing fills it.
pub fn store<K>(objects: Vec<K>) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    use kube::runtime::{reflector, watcher};
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

/// The API server side of a [`client`].
pub struct ApiServer(tower_test::mock::Handle<Request<Body>, Response<Body>>);

/// A client whose every request goes to the returned [`ApiServer`].
pub fn client() -> (kube::Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), ApiServer(handle))
}

impl ApiServer {
    /// Answers `calls` in order, asserting each request matches, then asserts no other
    /// request comes before every client is dropped. Await the handle after the
    /// reconcile returned and the client (with the context holding it) was dropped.
    pub fn run(self, calls: Vec<Call>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut handle = pin!(self.0);
            for (index, call) in calls.into_iter().enumerate() {
                let Some((request, send)) = handle.next_request().await else {
                    panic!("call {index} never came: {} {}", call.method, call.path);
                };
                let (parts, body) = request.into_parts();
                let seen = format!("{} {}", parts.method, parts.uri);
                assert_eq!(
                    seen,
                    format!("{} {}", call.method, call.path),
                    "call {index}"
                );
                let bytes = body.collect_bytes().await.expect("request body");
                if call.check_body {
                    let sent: Option<Value> = (!bytes.is_empty())
                        .then(|| serde_json::from_slice(&bytes).expect("a JSON body"));
                    assert_eq!(sent, call.body, "body of call {index}: {seen}");
                }
                let response = Response::builder()
                    .status(call.status)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&call.answer).expect("JSON")))
                    .expect("response");
                send.send_response(response);
            }
            if let Some((request, _)) = handle.next_request().await {
                panic!(
                    "a call the scenario does not expect: {} {}",
                    request.method(),
                    request.uri()
                );
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    #[tokio::test]
    async fn a_call_is_answered_and_a_missing_one_fails() {
        let (cluster, server) = client();
        let answer = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let server = server.run(vec![Call::get(
            "/api/v1/namespaces/default/configmaps/a",
            answer,
        )]);
        let api: kube::Api<ConfigMap> = kube::Api::default_namespaced(cluster);
        assert_eq!(
            api.get("a").await.expect("get").metadata.name.as_deref(),
            Some("a")
        );
        drop(api);
        server.await.expect("the scenario holds");

        let (client, server) = client();
        let server = server.run(vec![Call::get("/api/v1/nodes/n1", json!({}))]);
        drop(client);
        assert!(
            server.await.is_err(),
            "a call that never came fails the scenario"
        );
    }
}
