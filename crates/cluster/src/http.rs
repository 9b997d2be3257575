//! The HTTP face of the embedded API server: Kubernetes REST paths, bearer-token
//! authentication, content negotiation (JSON, YAML bodies; Table and metadata-only
//! responses for kubectl), and `Status` errors.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use crate::pointer::Pointer;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::FutureExt as _;
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::{Value, json};

use super::access_review;
use super::api::{
    Answer, Api, DeleteOptions, Deleted, ListOptions, PatchType, Propagation, WriteOptions,
};
use super::errors::ApiError;
use super::eviction;
use super::faults::Faults;
use super::field_validation::{FieldValidation, warning_header};
use super::openapi;
use super::protobuf;
use super::rendering::{Rendering, partial_metadata, table_of};
use super::resources::Resource;
use super::selector::{FieldSelector, LabelSelector};
use super::sim::{SimError, Simulation};
use super::watch::{self, WatchRequest};

/// Kubernetes' protobuf encoding, which kubectl's typed clients send.
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Request bodies larger than this are refused (upstream's limit is 3 MiB too).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// What every request handler shares.
pub struct Server {
    pub api: Arc<Api>,
    pub token: String,
    pub address: String,
    pub faults: Faults,
    /// The simulated nodes, for the `/sim/v1` operations.
    pub simulation: Option<Arc<Simulation>>,
    /// The OpenAPI documents built so far.
    pub openapi: openapi::Documents,
}

/// The router: every path goes through [`serve`].
pub fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new().fallback(serve).with_state(server)
}

/// Accepts TLS connections on `listener` and serves HTTP/1.1 on each until `stop` is set.
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    server: Arc<Server>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let app = router(server);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%err, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::debug!(%err, %peer, "TLS handshake failed");
                    return;
                }
            };
            let io = hyper_util::rt::TokioIo::new(stream);
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await
            {
                tracing::debug!(%err, %peer, "connection ended with an error");
            }
        });
    }
}

async fn serve(State(server): State<Arc<Server>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = answer(handle(&server, request)).await;
    tracing::debug!(%method, %path, status = response.status().as_u16(), "request");
    response
}

/// The response to a request `handling` handles: its answer, its error as a `Status`,
/// or a 500 `Status` should it panic (a bug), instead of a dropped connection, as
/// kube-apiserver recovers from a handler's panic.
async fn answer(handling: impl Future<Output = Result<Response, ApiError>>) -> Response {
    // Unwind safe in effect: the store and the registry ignore lock poisoning, and a
    // write commits whole or not at all, so a panic leaves nothing half-written.
    match AssertUnwindSafe(handling).catch_unwind().await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => error_response(&err),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(%why, "a request handler panicked");
            error_response(&ApiError::internal(
                "This request caused the embedded API server to panic (a bug). Look in its log for details.",
            ))
        }
    }
}

async fn handle(server: &Arc<Server>, request: Request) -> Result<Response, ApiError> {
    authenticate(server, request.headers())?;
    let (parts, body) = request.into_parts();
    let query = Query::parse(parts.uri.query().unwrap_or(""));
    let route = Route::parse(parts.uri.path())?;
    let is_write = !matches!(parts.method, Method::GET | Method::HEAD);
    server.faults.delay().await;
    if is_write {
        server.faults.on_write()?;
    }
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let rendering = Rendering::from_accept(accept);
    match route {
        Route::Version => Ok(json_response(StatusCode::OK, &version())),
        Route::Health => Ok(text_response(StatusCode::OK, "ok")),
        Route::CoreVersions => Ok(json_response(
            StatusCode::OK,
            &server.api.registry.core_versions(&server.address),
        )),
        Route::Groups => Ok(json_response(
            StatusCode::OK,
            &server.api.registry.group_list(),
        )),
        Route::Group(group) => {
            let group = server
                .api
                .registry
                .group(&group)
                .ok_or_else(ApiError::no_such_path)?;
            Ok(json_response(StatusCode::OK, &group))
        }
        Route::Resources { group, version } => {
            let list = server
                .api
                .registry
                .resource_list(&group, &version)
                .ok_or_else(ApiError::no_such_path)?;
            Ok(json_response(StatusCode::OK, &list))
        }
        Route::OpenApiV3Root => Ok(json_response(
            StatusCode::OK,
            &openapi::root(&server.api.registry),
        )),
        Route::OpenApiV3 { group, version } => {
            let document = server
                .openapi
                .group_version(&server.api.registry, &group, &version)
                .ok_or_else(ApiError::no_such_path)?;
            Ok(bytes_response(StatusCode::OK, document))
        }
        Route::SimNode { name, operation } => {
            let simulation = server
                .simulation
                .as_ref()
                .ok_or_else(ApiError::no_such_path)?;
            simulated_node(
                simulation,
                &parts.method,
                &name,
                operation.as_deref(),
                &query,
            )
            .await
        }
        Route::AccessReview => {
            if parts.method != Method::POST {
                return Err(ApiError::method_not_allowed(
                    "selfsubjectaccessreviews are only created",
                ));
            }
            let is_protobuf = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|t| t.starts_with(PROTOBUF));
            let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
                .await
                .map_err(|_| ApiError::request_too_large(MAX_BODY_BYTES))?;
            // kubectl's typed client (`kubectl auth can-i`) sends the review as protobuf.
            let body = if is_protobuf {
                let review = protobuf::decode(&body)
                    .map_err(|e| ApiError::unsupported_media_type(e.to_string()))?;
                serde_json::to_vec(&review).map_err(|e| ApiError::internal(e.to_string()))?
            } else {
                body.to_vec()
            };
            Ok(json_response(
                StatusCode::CREATED,
                &access_review::answer(&body)?,
            ))
        }
        Route::SimModuleHistory => {
            let simulation = server
                .simulation
                .as_ref()
                .ok_or_else(ApiError::no_such_path)?;
            let history = serde_json::to_value(simulation.module_history())
                .map_err(|e| ApiError::internal(e.to_string()))?;
            Ok(json_response(StatusCode::OK, &history))
        }
        Route::Object(target) => {
            let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
                .await
                .map_err(|_| ApiError::request_too_large(MAX_BODY_BYTES))?;
            let resource = server
                .api
                .registry
                .get(&target.group, &target.version, &target.plural)
                .ok_or_else(ApiError::no_such_path)?;
            if target.namespace.is_some() && !resource.namespaced {
                return Err(ApiError::no_such_path());
            }
            let call = Call {
                server,
                resource,
                target,
                query,
                headers: parts.headers,
                body,
                rendering,
            };
            call.dispatch(&parts.method).await
        }
    }
}

fn authenticate(server: &Server, headers: &HeaderMap) -> Result<(), ApiError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    // Compare in constant time so the token cannot be guessed byte by byte.
    match presented {
        Some(token) if constant_time_eq(token.as_bytes(), server.token.as_bytes()) => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "36", "gitVersion": "v1.36.3+capstan",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "", "compiler": "capstan", "platform": "linux/amd64",
    })
}

/// The parsed path.
enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    Resources {
        group: String,
        version: String,
    },
    OpenApiV3Root,
    OpenApiV3 {
        group: String,
        version: String,
    },
    Object(Target),
    /// `/apis/authorization.k8s.io/v1/selfsubjectaccessreviews` (see `access_review`).
    AccessReview,
    /// `/sim/v1/nodes/<name>[/<operation>]`: simulated node operations.
    SimNode {
        name: String,
        operation: Option<String>,
    },
    /// `/sim/v1/module-history`
    SimModuleHistory,
}

/// A resource path: `/api/v1/namespaces/ns/pods/name/status` and its variants.
#[derive(Debug, Default)]
struct Target {
    group: String,
    version: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Option<String>,
    /// The legacy `/watch/` path prefix.
    watch_path: bool,
}

impl Route {
    fn parse(path: &str) -> Result<Route, ApiError> {
        let segments: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        match segments.as_slice() {
            ["version"] => Ok(Route::Version),
            ["healthz" | "readyz" | "livez", ..] => Ok(Route::Health),
            ["api"] => Ok(Route::CoreVersions),
            ["apis"] => Ok(Route::Groups),
            ["apis", group] => Ok(Route::Group((*group).into())),
            ["api", version] => Ok(Route::Resources {
                group: String::new(),
                version: (*version).into(),
            }),
            ["apis", group, version] => Ok(Route::Resources {
                group: (*group).into(),
                version: (*version).into(),
            }),
            ["openapi", "v3"] => Ok(Route::OpenApiV3Root),
            ["openapi", "v3", "api", version] => Ok(Route::OpenApiV3 {
                group: String::new(),
                version: (*version).into(),
            }),
            ["openapi", "v3", "apis", group, version] => Ok(Route::OpenApiV3 {
                group: (*group).into(),
                version: (*version).into(),
            }),
            ["sim", "v1", "nodes", name] => Ok(Route::SimNode {
                name: (*name).into(),
                operation: None,
            }),
            ["sim", "v1", "nodes", name, operation] => Ok(Route::SimNode {
                name: (*name).into(),
                operation: Some((*operation).into()),
            }),
            ["sim", "v1", "module-history"] => Ok(Route::SimModuleHistory),
            [
                "apis",
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
            ] => Ok(Route::AccessReview),
            ["api", version, rest @ ..] => Target::parse("", version, rest).map(Route::Object),
            ["apis", group, version, rest @ ..] => {
                Target::parse(group, version, rest).map(Route::Object)
            }
            _ => Err(ApiError::no_such_path()),
        }
    }
}

impl Target {
    fn parse(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
        let (watch_path, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            _ => (false, rest),
        };
        let mut target = Target {
            group: group.into(),
            version: version.into(),
            watch_path,
            ..Target::default()
        };
        let owned = |s: &&str| (*s).to_string();
        match rest {
            // The namespace object itself and its subresources.
            ["namespaces"] => target.plural = "namespaces".into(),
            ["namespaces", name] => {
                target.plural = "namespaces".into();
                target.name = Some((*name).into());
            }
            ["namespaces", name, sub @ ("status" | "finalize")] if group.is_empty() => {
                target.plural = "namespaces".into();
                target.name = Some((*name).into());
                target.subresource = Some((*sub).into());
            }
            ["namespaces", namespace, plural, tail @ ..] if tail.len() <= 2 => {
                target.namespace = Some((*namespace).into());
                target.plural = (*plural).into();
                target.name = tail.first().map(owned);
                target.subresource = tail.get(1).map(owned);
            }
            [plural, tail @ ..] if tail.len() <= 2 => {
                target.plural = (*plural).into();
                target.name = tail.first().map(owned);
                target.subresource = tail.get(1).map(owned);
            }
            _ => return Err(ApiError::no_such_path()),
        }
        Ok(target)
    }
}

/// Query parameters, last value wins.
struct Query(HashMap<String, String>);

impl Query {
    fn parse(raw: &str) -> Query {
        Query(
            form_urlencoded::parse(raw.as_bytes())
                .into_owned()
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn number<T: std::str::FromStr>(&self, key: &str) -> Result<Option<T>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid value for {key}: {v:?}")))
            })
            .transpose()
    }

    fn dry_run(&self) -> Result<bool, ApiError> {
        match self.get("dryRun") {
            None => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: \"{other}\": supported values: \"All\""
            ))),
        }
    }

    fn list_options(&self, target: &Target) -> Result<ListOptions, ApiError> {
        let label_selector = self
            .get("labelSelector")
            .map(LabelSelector::parse)
            .transpose()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let mut fields = self.get("fieldSelector").unwrap_or("").to_string();
        if target.watch_path
            && let Some(name) = &target.name
        {
            // `/watch/.../pods/<name>` is a watch of that one object.
            if !fields.is_empty() {
                fields.push(',');
            }
            fields.push_str(&format!("metadata.name={name}"));
        }
        let field_selector = (!fields.is_empty())
            .then(|| FieldSelector::parse(&fields))
            .transpose()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(ListOptions {
            label_selector,
            field_selector,
            limit: self.number("limit")?,
            continue_token: self.get("continue").map(str::to_string),
        })
    }
}

/// One request to a resource path.
struct Call<'a> {
    server: &'a Arc<Server>,
    resource: Arc<Resource>,
    target: Target,
    query: Query,
    headers: HeaderMap,
    body: Bytes,
    rendering: Rendering,
}

impl Call<'_> {
    fn api(&self) -> &Api {
        &self.server.api
    }

    fn namespace(&self) -> &str {
        self.target.namespace.as_deref().unwrap_or("")
    }

    async fn dispatch(self, method: &Method) -> Result<Response, ApiError> {
        let name = self.target.name.clone();
        let sub = self.target.subresource.clone();
        match (method, name.as_deref(), sub.as_deref()) {
            (&Method::GET, _, _) if self.target.watch_path || self.query.flag("watch") => {
                self.watch()
            }
            (&Method::GET, None, None) => self.list(),
            (&Method::GET, Some(name), None | Some("status")) => self.get(name),
            (&Method::GET, Some(name), Some("scale")) => self.get_scale(name),
            (&Method::PUT, Some(name), Some("scale")) => self.update_scale(name),
            (&Method::PATCH, Some(name), Some("scale")) => self.patch_scale(name),
            (&Method::POST, None, None) => self.create(),
            (&Method::POST, Some(name), Some("eviction")) if self.resource.plural == "pods" => {
                self.evict(name)
            }
            (&Method::PUT, Some(name), sub) => self.update(name, self.writable_subresource(sub)?),
            (&Method::PATCH, Some(name), sub) => self.patch(name, self.writable_subresource(sub)?),
            (&Method::DELETE, Some(name), None) => self.delete(name),
            (&Method::DELETE, None, None) => self.delete_collection(),
            _ => Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method} {})",
                self.resource.group_resource()
            ))),
        }
    }

    fn writable_subresource<'s>(&self, sub: Option<&'s str>) -> Result<Option<&'s str>, ApiError> {
        match sub {
            None => Ok(None),
            Some("status") if self.resource.has_status => Ok(Some("status")),
            // The namespace controller's finalize call edits spec.finalizers, nothing else.
            Some("finalize") if self.resource.plural == "namespaces" => Ok(None),
            Some(_) => Err(ApiError::no_such_path()),
        }
    }

    /// The options of a write; `options` names them in errors (`CreateOptions`).
    fn write_options(&self, options: &str) -> Result<WriteOptions, ApiError> {
        Ok(WriteOptions {
            dry_run: self.query.dry_run()?,
            field_manager: self.query.get("fieldManager").map(str::to_string),
            force: self.query.flag("force"),
            field_validation: FieldValidation::parse(self.query.get("fieldValidation"), options)?,
            check_types: true,
            default_manager: self
                .headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .filter(|m| !m.is_empty())
                .map(str::to_string),
        })
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
    }

    fn body_value(&self) -> Result<Value, ApiError> {
        let content_type = self.content_type();
        if content_type.starts_with(PROTOBUF) {
            return protobuf::decode(&self.body)
                .map_err(|e| ApiError::unsupported_media_type(e.to_string()));
        }
        parse_body(&self.body, content_type.contains("yaml"))
    }

    fn get(&self, name: &str) -> Result<Response, ApiError> {
        let bytes = self.api().get(&self.resource, self.namespace(), name)?;
        match self.rendering {
            Rendering::Object => Ok(bytes_response(StatusCode::OK, bytes)),
            Rendering::Table => {
                let object = parse_json(&bytes)?;
                let meta = json!({"resourceVersion": object.at("/metadata/resourceVersion")});
                Ok(json_response(
                    StatusCode::OK,
                    &table_of(self.api(), &self.resource, &[&object], meta),
                ))
            }
            Rendering::Metadata => Ok(json_response(
                StatusCode::OK,
                &partial_metadata(&parse_json(&bytes)?),
            )),
        }
    }

    fn list(&self) -> Result<Response, ApiError> {
        let options = self.query.list_options(&self.target)?;
        let page = self
            .api()
            .list(&self.resource, self.target.namespace.as_deref(), &options)?;
        let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
        if let Some(token) = &page.continue_token {
            metadata["continue"] = json!(token);
            if let Some(remaining) = page.remaining {
                metadata["remainingItemCount"] = json!(remaining);
            }
        }
        match self.rendering {
            Rendering::Object => {
                let head = json!({"kind": format!("{}List", self.resource.kind), "apiVersion": self.resource.api_version(), "metadata": metadata});
                Ok(bytes_response(
                    StatusCode::OK,
                    list_body(&head, &page.items),
                ))
            }
            Rendering::Table => {
                let objects = page
                    .items
                    .iter()
                    .map(|b| parse_json(b))
                    .collect::<Result<Vec<_>, _>>()?;
                let refs: Vec<&Value> = objects.iter().collect();
                Ok(json_response(
                    StatusCode::OK,
                    &table_of(self.api(), &self.resource, &refs, metadata),
                ))
            }
            Rendering::Metadata => {
                let items = page
                    .items
                    .iter()
                    .map(|b| parse_json(b).map(|v| partial_metadata(&v)))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(json_response(
                    StatusCode::OK,
                    &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "items": items}),
                ))
            }
        }
    }

    fn watch(&self) -> Result<Response, ApiError> {
        let resource_version = self
            .query
            .get("resourceVersion")
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v}")))
            })
            .transpose()?;
        let request = WatchRequest {
            resource: self.resource.clone(),
            namespace: self.target.namespace.clone(),
            options: self.query.list_options(&self.target)?,
            resource_version,
            send_initial_events: self.query.flag("sendInitialEvents"),
            bookmarks: self.query.flag("allowWatchBookmarks"),
            timeout: self
                .query
                .number::<u64>("timeoutSeconds")?
                .map(Duration::from_secs),
            rendering: self.rendering,
            faults: self.server.faults.clone(),
        };
        let events = watch::start(self.server.api.clone(), request)?;
        let stream = futures::stream::unfold(events, |mut events| async move {
            events
                .recv()
                .await
                .map(|line| (Ok::<_, std::io::Error>(line), events))
        });
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-cache, private")
            .body(Body::from_stream(stream))
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    fn create(&self) -> Result<Response, ApiError> {
        let created = self.api().create_answer(
            &self.resource,
            self.namespace(),
            self.body_value()?,
            &self.write_options("CreateOptions")?,
        )?;
        Ok(answer_response(StatusCode::CREATED, created))
    }

    fn update(&self, name: &str, sub: Option<&str>) -> Result<Response, ApiError> {
        let updated = self.api().update_answer(
            &self.resource,
            self.namespace(),
            name,
            sub,
            self.body_value()?,
            &self.write_options("UpdateOptions")?,
            None,
        )?;
        Ok(answer_response(StatusCode::OK, updated))
    }

    /// The patch type the content type names; 415 for any other.
    fn patch_type(&self) -> Result<PatchType, ApiError> {
        let content_type = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        match content_type.as_str() {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({other:?}) - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                 application/strategic-merge-patch+json"
            ))),
        }
    }

    fn get_scale(&self, name: &str) -> Result<Response, ApiError> {
        let scale = self
            .api()
            .get_scale(&self.resource, self.namespace(), name)?;
        Ok(json_response(StatusCode::OK, &scale))
    }

    fn update_scale(&self, name: &str) -> Result<Response, ApiError> {
        let scale = self.api().update_scale(
            &self.resource,
            self.namespace(),
            name,
            self.body_value()?,
            &self.write_options("UpdateOptions")?,
        )?;
        Ok(answer_response(StatusCode::OK, scale))
    }

    fn patch_scale(&self, name: &str) -> Result<Response, ApiError> {
        let patch_type = self.patch_type()?;
        let patch = parse_body(&self.body, patch_type == PatchType::Apply)?;
        let scale = self.api().patch_scale(
            &self.resource,
            self.namespace(),
            name,
            patch_type,
            patch,
            &self.write_options("PatchOptions")?,
        )?;
        Ok(answer_response(StatusCode::OK, scale))
    }

    fn patch(&self, name: &str, sub: Option<&str>) -> Result<Response, ApiError> {
        let patch_type = self.patch_type()?;
        let patch = parse_body(&self.body, patch_type == PatchType::Apply)?;
        let existed = patch_type != PatchType::Apply
            || self
                .api()
                .get(&self.resource, self.namespace(), name)
                .is_ok();
        let patched = self.api().patch_answer(
            &self.resource,
            self.namespace(),
            name,
            sub,
            patch_type,
            patch,
            &self.write_options("PatchOptions")?,
        )?;
        let code = if existed {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        Ok(answer_response(code, patched))
    }

    fn delete_options(&self) -> Result<DeleteOptions, ApiError> {
        let body = if self.body.iter().all(u8::is_ascii_whitespace) {
            json!({})
        } else {
            self.body_value()?
        };
        let dry_run = self.query.dry_run()?
            || body
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|d| d.iter().any(|v| v == "All"));
        let propagation = self
            .query
            .get("propagationPolicy")
            .or_else(|| body.get("propagationPolicy").and_then(Value::as_str))
            .map(|p| match p {
                "Background" => Ok(Propagation::Background),
                "Foreground" => Ok(Propagation::Foreground),
                "Orphan" => Ok(Propagation::Orphan),
                other => Err(ApiError::bad_request(format!(
                    "propagationPolicy: Unsupported value: \"{other}\""
                ))),
            })
            .transpose()?;
        let orphan = body
            .get("orphanDependents")
            .and_then(Value::as_bool)
            .or_else(|| self.query.get("orphanDependents").map(|v| v == "true"));
        let propagation = propagation.or(match orphan {
            Some(true) => Some(Propagation::Orphan),
            Some(false) => Some(Propagation::Background),
            None => None,
        });
        Ok(DeleteOptions {
            dry_run,
            grace_period_seconds: match self.query.number::<i64>("gracePeriodSeconds")? {
                Some(g) => Some(g),
                None => body.get("gracePeriodSeconds").and_then(Value::as_i64),
            },
            propagation,
            precondition_uid: body
                .at("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            precondition_resource_version: body
                .at("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    fn delete(&self, name: &str) -> Result<Response, ApiError> {
        let options = self.delete_options()?;
        match self
            .api()
            .delete(&self.resource, self.namespace(), name, &options)?
        {
            Deleted::Pending(object) => Ok(bytes_response(StatusCode::OK, object.into_bytes())),
            Deleted::Now(object)
                if self.resource.plural == "pods" || self.resource.custom.is_some() =>
            {
                Ok(bytes_response(StatusCode::OK, object.into_bytes()))
            }
            Deleted::Now(object) => {
                let object = object.into_value();
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": self.resource.group, "kind": self.resource.plural,
                                "uid": object.at("/metadata/uid").cloned().unwrap_or(Value::Null)},
                });
                Ok(json_response(StatusCode::OK, &status))
            }
        }
    }

    fn delete_collection(&self) -> Result<Response, ApiError> {
        let options = self.delete_options()?;
        let list = self.query.list_options(&self.target)?;
        let deleted = self.api().delete_collection(
            &self.resource,
            self.target.namespace.as_deref(),
            &list,
            &options,
        )?;
        let body = json!({
            "kind": format!("{}List", self.resource.kind), "apiVersion": self.resource.api_version(),
            "metadata": {"resourceVersion": self.api().store.resource_version().to_string()}, "items": deleted,
        });
        Ok(json_response(StatusCode::OK, &body))
    }

    fn evict(&self, name: &str) -> Result<Response, ApiError> {
        let body = self.body_value()?;
        let options = DeleteOptions {
            dry_run: self.query.dry_run()?,
            grace_period_seconds: body
                .at("/deleteOptions/gracePeriodSeconds")
                .and_then(Value::as_i64),
            ..DeleteOptions::default()
        };
        eviction::evict(self.api(), &self.resource, self.namespace(), name, &options)?;
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201});
        Ok(json_response(StatusCode::CREATED, &status))
    }
}

/// `/sim/v1/nodes/<name>/<operation>`: GET shows a node's simulated state; POST
/// `reboot`, `kernel?version=V`, `ready`, `not-ready`; DELETE removes the node.
async fn simulated_node(
    simulation: &Simulation,
    method: &Method,
    name: &str,
    operation: Option<&str>,
    query: &Query,
) -> Result<Response, ApiError> {
    let result = match (method, operation) {
        (&Method::GET, None) => Ok(()),
        (&Method::POST, Some("reboot")) => simulation.reboot(name).await,
        (&Method::POST, Some("kernel")) => {
            let version = query
                .get("version")
                .ok_or_else(|| ApiError::bad_request("kernel: missing ?version="))?;
            simulation.upgrade_kernel(name, version).await
        }
        (&Method::POST, Some("ready")) => simulation.set_ready(name, true),
        (&Method::POST, Some("not-ready")) => simulation.set_ready(name, false),
        (&Method::DELETE, None) => simulation.remove(name),
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not a simulated node operation"
            )));
        }
    };
    match result {
        Err(SimError::NoSuchNode(node)) => {
            Err(ApiError::bad_request(format!("no simulated node {node:?}")))
        }
        Err(SimError::Api(err)) => Err(err),
        Ok(()) if method == Method::DELETE => {
            Ok(json_response(StatusCode::OK, &json!({"removed": name})))
        }
        Ok(()) => {
            let state = simulation
                .node(name)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(json_response(
                StatusCode::OK,
                &json!({"name": state.name, "kernel": state.kernel, "bootID": state.boot_id, "ready": state.ready, "modules": state.modules}),
            ))
        }
    }
}

/// Parses a request body as JSON, or YAML when the content type says so; a clear 400 otherwise.
fn parse_body(body: &Bytes, yaml: bool) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if !yaml {
        return parse_json(body);
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not UTF-8"))?;
    serde_saphyr::from_str::<Value>(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e} (line {}, column {})",
            e.line(),
            e.column()
        ))
    })
}

/// A list body assembled from stored bytes: `{...head, "items": [item, item]}`.
fn list_body(head: &Value, items: &[Bytes]) -> Bytes {
    let head = head.to_string();
    let total: usize = items.iter().map(Bytes::len).sum::<usize>() + items.len() + head.len() + 16;
    let mut out = BytesMut::with_capacity(total);
    out.put_slice(&head.as_bytes()[..head.len() - 1]);
    out.put_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(item);
    }
    out.put_slice(b"]}");
    out.freeze()
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    bytes_response(code, Bytes::from(body.to_string()))
}

fn bytes_response(code: StatusCode, body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A write's answer: the object, with a `Warning` header per warning.
fn answer_response(code: StatusCode, answer: Answer) -> Response {
    let warnings: Vec<http::HeaderValue> = answer
        .warnings()
        .iter()
        .filter_map(|text| http::HeaderValue::from_str(&warning_header(text)).ok())
        .collect();
    let mut response = bytes_response(code, answer.into_bytes());
    for warning in warnings {
        response.headers_mut().append(header::WARNING, warning);
    }
    response
}

fn text_response(code: StatusCode, body: &'static str) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain"),
    );
    response
}

fn error_response(err: &ApiError) -> Response {
    let code = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    // Like upstream's eviction 429, no Retry-After: the caller decides when to try again.
    json_response(code, &err.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_like_the_kubernetes_api() {
        type Case<'a> = (
            &'a str,
            &'a str,
            Option<&'a str>,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            ("/api/v1/pods", "", None, "pods", None, None),
            ("/api/v1/namespaces", "", None, "namespaces", None, None),
            (
                "/api/v1/namespaces/kmm",
                "",
                None,
                "namespaces",
                Some("kmm"),
                None,
            ),
            (
                "/api/v1/namespaces/kmm/status",
                "",
                None,
                "namespaces",
                Some("kmm"),
                Some("status"),
            ),
            (
                "/api/v1/namespaces/kmm/pods",
                "",
                Some("kmm"),
                "pods",
                None,
                None,
            ),
            (
                "/api/v1/namespaces/kmm/pods/w/eviction",
                "",
                Some("kmm"),
                "pods",
                Some("w"),
                Some("eviction"),
            ),
            (
                "/api/v1/nodes/worker-1/status",
                "",
                None,
                "nodes",
                Some("worker-1"),
                Some("status"),
            ),
            (
                "/apis/kmm.sigs.x-k8s.io/v1beta1/nodemodulesconfigs/n1",
                "kmm.sigs.x-k8s.io",
                None,
                "nodemodulesconfigs",
                Some("n1"),
                None,
            ),
            (
                "/apis/apps/v1/namespaces/x/deployments/web/scale",
                "apps",
                Some("x"),
                "deployments",
                Some("web"),
                Some("scale"),
            ),
            (
                "/apis/apps/v1/watch/namespaces/x/daemonsets",
                "apps",
                Some("x"),
                "daemonsets",
                None,
                None,
            ),
        ];
        for (path, group, namespace, plural, name, sub) in cases {
            let Ok(Route::Object(t)) = Route::parse(path) else {
                panic!("{path} did not parse to an object route");
            };
            assert_eq!(
                (
                    t.group.as_str(),
                    t.namespace.as_deref(),
                    t.plural.as_str(),
                    t.name.as_deref(),
                    t.subresource.as_deref()
                ),
                (*group, *namespace, *plural, *name, *sub),
                "{path}"
            );
        }
        assert!(matches!(Route::parse("/api/v1/a/b/c/d"), Err(e) if e.code == 404));
    }

    #[test]
    fn list_bodies_embed_items_verbatim() {
        let head =
            json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}});
        let body = list_body(
            &head,
            &[
                Bytes::from_static(b"{\"a\":1}"),
                Bytes::from_static(b"{\"b\":2}"),
            ],
        );
        let parsed: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(parsed["items"], json!([{"a": 1}, {"b": 2}]));
        assert_eq!(parsed["metadata"]["resourceVersion"], "7");
    }

    /// A handler's panic is a 500 Status, not a dropped connection; answers and errors
    /// go through as they are.
    #[tokio::test]
    async fn a_handler_that_panics_is_answered_with_a_500_status() {
        async fn panics() -> Result<Response, ApiError> {
            panic!("a handler's bug")
        }
        async fn fails() -> Result<Response, ApiError> {
            Err(ApiError::bad_request("bad"))
        }
        async fn answers() -> Result<Response, ApiError> {
            Ok(text_response(StatusCode::OK, "ok"))
        }
        let cases: [(Response, u16, Option<&str>); 3] = [
            (answer(panics()).await, 500, Some("InternalError")),
            (answer(fails()).await, 400, Some("BadRequest")),
            (answer(answers()).await, 200, None),
        ];
        for (response, code, reason) in cases {
            assert_eq!(response.status().as_u16(), code);
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("body");
            if let Some(reason) = reason {
                let status: Value = serde_json::from_slice(&body).expect("a Status");
                assert_eq!(
                    (status["kind"].as_str(), status["reason"].as_str()),
                    (Some("Status"), Some(reason)),
                    "{status}"
                );
            }
        }
    }
}
