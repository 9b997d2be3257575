//! A loopback stand-in of GitHub's REST API for the tests of capstan's commit-status
//! notifications: [`FakeGitHub`] keeps the commit statuses and pull request comments it is
//! sent, records every request, and authenticates like GitHub: a personal access token
//! ([`TOKEN`]), and a GitHub App ([`APP_ID`]) whose JWTs, signed with the test key
//! ([`app_private_key_pem`], [`sign_app_jwt`]), it exchanges for installation tokens. A
//! test takes it down ([`FakeGitHub::set_down`]) to see capstan ride out an outage, and
//! points webhooks at it (`POST /hooks/{name}`).
//!
//! Only what capstan asks of GitHub is served, with GitHub's answers: its status codes, its
//! `{"message": ...}` errors, its orders and its pagination (`per_page`, `page`, `Link`).
//! Owners and repositories are not checked: statuses are kept by commit and comments by
//! issue number, whatever the repository of the path.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request, State as Shared};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, LINK};
use axum::http::{HeaderValue, StatusCode, request};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{
    RSA_PKCS1_2048_8192_SHA256, RSA_PKCS1_SHA256, RsaKeyPair, UnparsedPublicKey,
};
use rustls::pki_types::PrivatePkcs1KeyDer;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The personal access token the fake accepts, as user [`TOKEN_LOGIN`].
pub const TOKEN: &str = "ghp_capstantesttoken000000000000000000";
/// The login of [`TOKEN`]'s user.
pub const TOKEN_LOGIN: &str = "capstan-bot";
/// The id of the fake's GitHub App: the `iss` of its JWTs.
pub const APP_ID: u64 = 4242;
/// The App's one installation, the only one given access tokens.
pub const INSTALLATION_ID: u64 = 777;
/// The App's slug; its installation tokens act as [`APP_LOGIN`].
pub const APP_SLUG: &str = "capstan-test";
/// The login the App's installation tokens act as: its bot user, `<slug>[bot]`.
pub const APP_LOGIN: &str = "capstan-test[bot]";

/// The longest description GitHub takes on a commit status, in characters.
const MAX_DESCRIPTION_CHARS: usize = 140;
/// The states a commit status may have.
const STATUS_STATES: [&str; 4] = ["pending", "success", "failure", "error"];
/// A page's length when a request does not say (`per_page`), and the most it may ask for.
const PER_PAGE_DEFAULT: usize = 30;
const PER_PAGE_MAX: usize = 100;
/// How far ahead of the fake's clock a JWT may say it was issued (GitHub allows for drift).
const JWT_MAX_DRIFT_SECS: u64 = 60;
/// The longest a JWT may live, from `iat` to `exp`.
const JWT_MAX_LIFETIME_SECS: u64 = 600;
/// How long an installation token lives.
const INSTALLATION_TOKEN_SECS: u64 = 3600;
/// Request bodies are read up to this length; a longer one is recorded as unreadable.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// GitHub's answer to an `Authorization` header that holds no JWT where one is needed.
const NOT_A_JWT: &str = "A JSON web token could not be decoded";
/// The first id given to a status or comment: far from any issue number, so a test catches
/// capstan using one for the other.
const FIRST_ID: u64 = 1_000_001;

/// The private key of the fake's App: a 2048-bit RSA key in PKCS#1 PEM (`BEGIN RSA PRIVATE
/// KEY`), the form GitHub hands App keys out in. It was made for these tests and is public
/// in this repository; nothing but the fake trusts it.
pub fn app_private_key_pem() -> &'static str {
    include_str!("github-app-test-key.pem")
}

/// A JWT of App `iss`, issued at `iat` and expiring at `exp` (seconds since the epoch),
/// signed RS256 with [`app_private_key_pem`]: what capstan's own signer should make, for
/// tests that check it against the fake.
pub fn sign_app_jwt(iss: u64, iat: u64, exp: u64) -> String {
    let header = URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "typ": "JWT"}).to_string());
    let claims = URL_SAFE_NO_PAD.encode(json!({"iat": iat, "exp": exp, "iss": iss}).to_string());
    let message = format!("{header}.{claims}");
    let key = app_key();
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        message.as_bytes(),
        &mut signature,
    )
    .expect("signing with the test key");
    format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// The App's key pair, parsed once from [`app_private_key_pem`].
fn app_key() -> &'static RsaKeyPair {
    static KEY: OnceLock<RsaKeyPair> = OnceLock::new();
    KEY.get_or_init(|| {
        let der = PrivatePkcs1KeyDer::from_pem_slice(app_private_key_pem().as_bytes())
            .expect("the test key is PKCS#1 PEM");
        RsaKeyPair::from_der(der.secret_pkcs1_der()).expect("the test key is an RSA key")
    })
}

/// One request the fake received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// `GET`, `POST`, `PATCH`...
    pub method: String,
    /// The path with its query string, if it had one: `/repos/o/r/commits/abc/statuses?page=2`.
    pub path: String,
    /// The `Authorization` header, empty when there was none.
    pub authorization: String,
    /// Every header, names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Recorded {
    /// The first value of header `name` (any case), if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The record of a request of `parts` and `body`.
    fn of(parts: &request::Parts, body: &[u8]) -> Recorded {
        let text = |value: &HeaderValue| String::from_utf8_lossy(value.as_bytes()).into_owned();
        Recorded {
            method: parts.method.to_string(),
            path: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.path().to_string(), ToString::to_string),
            authorization: parts
                .headers
                .get(AUTHORIZATION)
                .map(text)
                .unwrap_or_default(),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().to_string(), text(value)))
                .collect(),
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }

    /// The path without its query string.
    fn path_only(&self) -> &str {
        self.path
            .split_once('?')
            .map_or(&self.path, |(path, _)| path)
    }

    /// The query string, empty when there is none.
    fn query(&self) -> &str {
        self.path.split_once('?').map_or("", |(_, query)| query)
    }
}

/// A comment on an issue or pull request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comment {
    /// Its id, unique across the fake's issues (comments are edited by id alone).
    pub id: u64,
    /// Its author's login.
    pub login: String,
    /// Its text.
    pub body: String,
}

impl Comment {
    /// As GitHub's API shows it.
    fn to_json(&self) -> Value {
        json!({"id": self.id, "body": self.body, "user": {"login": self.login}})
    }
}

/// GitHub's REST API on a free port of 127.0.0.1, served by a task of the runtime that
/// started it; it stops accepting connections when dropped.
pub struct FakeGitHub {
    fake: Arc<Fake>,
    task: JoinHandle<()>,
}

impl FakeGitHub {
    /// Starts one. Panics when no loopback port can be had.
    pub async fn start() -> FakeGitHub {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let addr = listener.local_addr().expect("the bound port's address");
        let fake = Arc::new(Fake {
            base: format!("http://{addr}"),
            state: Mutex::default(),
        });
        let router = axum::Router::new().fallback(serve).with_state(fake.clone());
        let task = tokio::spawn(async move {
            // It only ends with an error accepting, which leaves nothing to do.
            let _ = axum::serve(listener, router).await;
        });
        FakeGitHub { fake, task }
    }

    /// The API's base URL, `http://127.0.0.1:<port>` (GitHub's is `https://api.github.com`).
    pub fn url(&self) -> String {
        self.fake.base.clone()
    }

    /// Every request received so far, in order, those answered while down too.
    pub fn requests(&self) -> Vec<Recorded> {
        self.fake.lock().requests.clone()
    }

    /// While `down`, every request is recorded and answered `502 {"message": "Server
    /// Error"}`, as GitHub answers in an outage.
    pub fn set_down(&self, down: bool) {
        self.fake.lock().down = down;
    }

    /// The statuses created on commit `sha` (in any repository), oldest first, each as the
    /// API shows it: `id`, `state`, `description` (null when not given), `context`,
    /// `target_url` (when given) and `creator.login`.
    pub fn statuses(&self, sha: &str) -> Vec<Value> {
        self.fake
            .lock()
            .statuses
            .get(sha)
            .cloned()
            .unwrap_or_default()
    }

    /// The comments of issue or pull request `issue` (in any repository), oldest first.
    pub fn comments(&self, issue: u64) -> Vec<Comment> {
        self.fake
            .lock()
            .comments
            .get(&issue)
            .cloned()
            .unwrap_or_default()
    }

    /// Adds a comment by `login` to `issue`, as someone other than capstan would; returns
    /// its id.
    pub fn add_comment(&self, issue: u64, login: &str, body: &str) -> u64 {
        self.fake.lock().add_comment(issue, login, body).id
    }

    /// The requests received at `POST /hooks/{name}`, in order.
    pub fn hooks(&self, name: &str) -> Vec<Recorded> {
        let path = format!("/hooks/{name}");
        self.fake
            .lock()
            .requests
            .iter()
            .filter(|request| request.method == "POST" && request.path_only() == path)
            .cloned()
            .collect()
    }

    /// Answers `POST /hooks/{name}` with `status` from now on (200 until set). Panics on a
    /// number that is not an HTTP status.
    pub fn set_hook_status(&self, name: &str, status: u16) {
        let status = StatusCode::from_u16(status).expect("an HTTP status");
        self.fake
            .lock()
            .hook_statuses
            .insert(name.to_string(), status);
    }
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the fake's handler and its test's handle share.
struct Fake {
    /// The base URL, for the absolute URLs of `Link` headers.
    base: String,
    state: Mutex<State>,
}

impl Fake {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the fake was sent and keeps.
#[derive(Default)]
struct State {
    requests: Vec<Recorded>,
    down: bool,
    /// By commit, oldest first.
    statuses: HashMap<String, Vec<Value>>,
    /// By issue number, oldest first.
    comments: BTreeMap<u64, Vec<Comment>>,
    installation_tokens: HashSet<String>,
    hook_statuses: HashMap<String, StatusCode>,
    /// How many ids were given out.
    ids: u64,
}

impl State {
    fn next_id(&mut self) -> u64 {
        self.ids += 1;
        FIRST_ID + self.ids - 1
    }

    fn add_comment(&mut self, issue: u64, login: &str, body: &str) -> Comment {
        let comment = Comment {
            id: self.next_id(),
            login: login.to_string(),
            body: body.to_string(),
        };
        self.comments
            .entry(issue)
            .or_default()
            .push(comment.clone());
        comment
    }

    /// The login an `Authorization` header's token acts as, if the fake knows the token.
    fn login(&self, authorization: &str) -> Option<&'static str> {
        match token(authorization)? {
            TOKEN => Some(TOKEN_LOGIN),
            token if self.installation_tokens.contains(token) => Some(APP_LOGIN),
            _ => None,
        }
    }

    /// The login `request` acts as; a 401 when its token is missing or unknown.
    fn caller(&self, request: &Recorded) -> Result<&'static str, Failure> {
        self.login(&request.authorization)
            .ok_or_else(|| failure(StatusCode::UNAUTHORIZED, "Bad credentials"))
    }
}

/// Records a request, then answers it: 502 while down, else its route's answer.
async fn serve(Shared(fake): Shared<Arc<Fake>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .unwrap_or_else(|_| Bytes::from_static(b"<unreadable body>"));
    let request = Recorded::of(&parts, &body);
    let mut state = fake.lock();
    state.requests.push(request.clone());
    if state.down {
        return failure(StatusCode::BAD_GATEWAY, "Server Error").into_response();
    }
    route(&mut state, &fake.base, &request).unwrap_or_else(IntoResponse::into_response)
}

/// An answer, or the error GitHub would give instead.
type Answer = Result<Response, Failure>;

/// The route of `request`'s method and path.
fn route(state: &mut State, base: &str, request: &Recorded) -> Answer {
    let path = request.path_only().trim_start_matches('/');
    let segments: Vec<&str> = path.split('/').collect();
    match (request.method.as_str(), &segments[..]) {
        ("POST", ["hooks", name]) => Ok(hook(state, name)),
        ("GET", ["app"]) => app(request),
        ("POST", ["app", "installations", id, "access_tokens"]) => {
            installation_token(state, request, id)
        }
        ("GET", ["user"]) => user(state, request),
        ("POST", ["repos", _, _, "statuses", sha]) => create_status(state, request, sha),
        ("GET", ["repos", _, _, "commits", sha, "statuses"]) => {
            list_statuses(state, base, request, sha)
        }
        ("GET", ["repos", _, _, "issues", number, "comments"]) => {
            list_comments(state, base, request, number)
        }
        ("POST", ["repos", _, _, "issues", number, "comments"]) => {
            create_comment(state, request, number)
        }
        ("PATCH", ["repos", _, _, "issues", "comments", id]) => edit_comment(state, request, id),
        _ => Err(not_found()),
    }
}

/// `POST /hooks/{name}`: "ok", with the status the test set.
fn hook(state: &State, name: &str) -> Response {
    let status = state.hook_statuses.get(name).copied();
    (status.unwrap_or(StatusCode::OK), "ok").into_response()
}

/// `GET /app`: the App whose JWT authenticates the request.
fn app(request: &Recorded) -> Answer {
    authenticate_app(request)?;
    Ok(json(
        StatusCode::OK,
        json!({"id": APP_ID, "slug": APP_SLUG}),
    ))
}

/// `POST /app/installations/{id}/access_tokens`: a new installation token, for an hour.
fn installation_token(state: &mut State, request: &Recorded, id: &str) -> Answer {
    authenticate_app(request)?;
    if number_in_path(id)? != INSTALLATION_ID {
        return Err(not_found());
    }
    // 36 characters after `ghs_`, as GitHub's.
    let token = format!("ghs_capstantest{:025}", state.installation_tokens.len() + 1);
    state.installation_tokens.insert(token.clone());
    let expires = now_secs() + INSTALLATION_TOKEN_SECS;
    let expires_at = jiff::Timestamp::from_second(expires as i64).expect("an hour from now");
    Ok(json(
        StatusCode::CREATED,
        json!({"token": token, "expires_at": expires_at.to_string()}),
    ))
}

/// `GET /user`: the token's user. An installation token has none: GitHub refuses it.
fn user(state: &State, request: &Recorded) -> Answer {
    match state.caller(request)? {
        APP_LOGIN => Err(failure(
            StatusCode::FORBIDDEN,
            "Resource not accessible by integration",
        )),
        login => Ok(json(StatusCode::OK, json!({"login": login}))),
    }
}

/// `POST /repos/{owner}/{repo}/statuses/{sha}`: a new status of the commit.
fn create_status(state: &mut State, request: &Recorded, sha: &str) -> Answer {
    let login = state.caller(request)?;
    let mut status = new_status(&json_body(request)?)?;
    status["id"] = state.next_id().into();
    status["creator"] = json!({"login": login});
    state
        .statuses
        .entry(sha.to_string())
        .or_default()
        .push(status.clone());
    Ok(json(StatusCode::CREATED, status))
}

/// `GET /repos/{owner}/{repo}/commits/{sha}/statuses`: the commit's statuses, newest
/// first.
fn list_statuses(state: &State, base: &str, request: &Recorded, sha: &str) -> Answer {
    state.caller(request)?;
    let statuses = state.statuses.get(sha).into_iter().flatten();
    let newest_first: Vec<Value> = statuses.rev().cloned().collect();
    Ok(paginated(&newest_first, base, request))
}

/// The status a request body asks for, validated as GitHub does; `context` defaults to
/// `default`.
fn new_status(body: &Value) -> Result<Value, Failure> {
    let state = body["state"]
        .as_str()
        .filter(|state| STATUS_STATES.contains(state))
        .ok_or_else(|| {
            validation_failed(
                "state",
                "state must be one of pending, success, failure, error",
            )
        })?;
    let description = optional_string(body, "description")?;
    if description.is_some_and(|text| text.chars().count() > MAX_DESCRIPTION_CHARS) {
        return Err(validation_failed(
            "description",
            "description is too long (maximum is 140 characters)",
        ));
    }
    let context = optional_string(body, "context")?.unwrap_or("default");
    let mut status = json!({"state": state, "description": description, "context": context});
    if let Some(url) = optional_string(body, "target_url")? {
        status["target_url"] = url.into();
    }
    Ok(status)
}

/// `POST /repos/{owner}/{repo}/issues/{number}/comments`: a new comment by the caller.
fn create_comment(state: &mut State, request: &Recorded, number: &str) -> Answer {
    let login = state.caller(request)?;
    let issue = number_in_path(number)?;
    let body = comment_body(&json_body(request)?)?;
    let comment = state.add_comment(issue, login, &body);
    Ok(json(StatusCode::CREATED, comment.to_json()))
}

/// `GET /repos/{owner}/{repo}/issues/{number}/comments`: the issue's comments, oldest
/// first.
fn list_comments(state: &State, base: &str, request: &Recorded, number: &str) -> Answer {
    state.caller(request)?;
    let comments = state.comments.get(&number_in_path(number)?);
    let oldest_first: Vec<Value> = comments
        .into_iter()
        .flatten()
        .map(Comment::to_json)
        .collect();
    Ok(paginated(&oldest_first, base, request))
}

/// `PATCH /repos/{owner}/{repo}/issues/comments/{id}`: a new text for a comment of the
/// caller's. Another's is refused (403), a simplification of GitHub's permissions that
/// lets a test see capstan leave others' comments alone.
fn edit_comment(state: &mut State, request: &Recorded, id: &str) -> Answer {
    let login = state.caller(request)?;
    let id = number_in_path(id)?;
    let comment = state
        .comments
        .values_mut()
        .flatten()
        .find(|comment| comment.id == id)
        .ok_or_else(not_found)?;
    if comment.login != login {
        return Err(failure(
            StatusCode::FORBIDDEN,
            "Only the author of a comment may edit it",
        ));
    }
    comment.body = comment_body(&json_body(request)?)?;
    Ok(json(StatusCode::OK, comment.to_json()))
}

/// The `body` field of a comment request.
fn comment_body(body: &Value) -> Result<String, Failure> {
    optional_string(body, "body")?
        .map(str::to_string)
        .ok_or_else(|| validation_failed("body", "body is missing"))
}

/// Page `page` of `items`, `per_page` of them (30 unless asked, at most 100), with GitHub's
/// `Link` header to the next and last pages when there are more.
fn paginated(items: &[Value], base: &str, request: &Recorded) -> Response {
    let (path, query) = (request.path_only(), request.query());
    let per_page = query_number(query, "per_page")
        .unwrap_or(PER_PAGE_DEFAULT)
        .clamp(1, PER_PAGE_MAX);
    let page = query_number(query, "page").unwrap_or(1).max(1);
    let start = (page - 1).saturating_mul(per_page);
    let shown: Vec<Value> = items.iter().skip(start).take(per_page).cloned().collect();
    let mut response = json(StatusCode::OK, Value::Array(shown));
    let last = items.len().div_ceil(per_page).max(1);
    if page < last {
        let url = |page: usize| format!("<{base}{path}?per_page={per_page}&page={page}>");
        let link = format!(
            "{}; rel=\"next\", {}; rel=\"last\"",
            url(page + 1),
            url(last)
        );
        let link = HeaderValue::from_str(&link).expect("a URL is a header value");
        response.headers_mut().insert(LINK, link);
    }
    response
}

/// Query parameter `name` as a number; none when absent or not a number (GitHub then
/// takes the default).
fn query_number(query: &str, name: &str) -> Option<usize> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == name)
        .and_then(|(_, value)| value.parse().ok())
}

/// A number of the path (an issue, a comment, an installation); a 404 when it is not one,
/// as no such thing exists.
fn number_in_path(segment: &str) -> Result<u64, Failure> {
    segment.parse().map_err(|_| not_found())
}

/// The request's body as JSON; GitHub's 400 when it is not.
fn json_body(request: &Recorded) -> Result<Value, Failure> {
    serde_json::from_str(&request.body)
        .map_err(|_| failure(StatusCode::BAD_REQUEST, "Problems parsing JSON"))
}

/// String field `name` of `body`, if given; a 422 when it is something else.
fn optional_string<'a>(body: &'a Value, name: &str) -> Result<Option<&'a str>, Failure> {
    match &body[name] {
        Value::Null => Ok(None),
        Value::String(text) => Ok(Some(text)),
        _ => Err(validation_failed(name, &format!("{name} must be a string"))),
    }
}

/// The token of an `Authorization` header: `Bearer <token>` or `token <token>`.
fn token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    let known = scheme.eq_ignore_ascii_case("bearer") || scheme.eq_ignore_ascii_case("token");
    known.then_some(token.trim())
}

/// Checks that `request` carries a JWT of the App; a 401 saying why when it does not.
/// GitHub takes a JWT only as `Bearer`.
fn authenticate_app(request: &Recorded) -> Result<(), Failure> {
    let jwt = request
        .authorization
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, jwt)| jwt.trim())
        .ok_or_else(|| failure(StatusCode::UNAUTHORIZED, NOT_A_JWT))?;
    check_app_jwt(jwt, now_secs()).map_err(|why| failure(StatusCode::UNAUTHORIZED, &why))
}

/// Why `jwt` is not one of the App's at time `now` (seconds since the epoch), if it is
/// not: its header must say RS256, its signature be the App key's, and its claims hold.
fn check_app_jwt(jwt: &str, now: u64) -> Result<(), String> {
    let undecodable = || NOT_A_JWT.to_string();
    let [header, claims, signature] = jwt.split('.').collect::<Vec<_>>()[..] else {
        return Err(undecodable());
    };
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| undecodable())?;
    if decode_part(header).ok_or_else(undecodable)?["alg"] != "RS256" {
        return Err("The JWT's algorithm must be RS256".to_string());
    }
    let public_key = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, app_key().public());
    public_key
        .verify(format!("{header}.{claims}").as_bytes(), &signature)
        .map_err(|_| "The JWT's signature is not the App key's".to_string())?;
    check_claims(&decode_part(claims).ok_or_else(undecodable)?, now)
}

/// Why a JWT's `claims` are not the App's at `now`, if they are not: `iss` the App's id (a
/// number or a string, GitHub takes both), not expired, issued no later than a minute
/// ahead, living at most ten minutes.
fn check_claims(claims: &Value, now: u64) -> Result<(), String> {
    let iss = &claims["iss"];
    if iss.as_u64() != Some(APP_ID) && iss.as_str() != Some(APP_ID.to_string().as_str()) {
        return Err(format!(
            "The JWT's issuer ('iss') {iss} is not App {APP_ID}"
        ));
    }
    let (Some(iat), Some(exp)) = (claims["iat"].as_u64(), claims["exp"].as_u64()) else {
        return Err("The JWT's 'iat' and 'exp' claims must be integers".to_string());
    };
    if exp <= now {
        return Err(format!("The JWT expired ('exp' {exp}, now {now})"));
    }
    if iat > now + JWT_MAX_DRIFT_SECS {
        return Err(format!(
            "The JWT's 'iat' {iat} is in the future (now {now})"
        ));
    }
    if exp.saturating_sub(iat) > JWT_MAX_LIFETIME_SECS {
        return Err("'Expiration time' claim ('exp') is too far in the future".to_string());
    }
    Ok(())
}

/// A JWT's header or claims: base64url without padding, of a JSON object.
fn decode_part(part: &str) -> Option<Value> {
    let bytes = URL_SAFE_NO_PAD.decode(part).ok()?;
    serde_json::from_slice(&bytes).ok().filter(Value::is_object)
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs()
}

/// An error answer of GitHub's: a status and a JSON body with its `message`.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    body: Value,
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        json(self.status, self.body)
    }
}

/// GitHub's error `status` saying `message`.
fn failure(status: StatusCode, message: &str) -> Failure {
    Failure {
        status,
        body: json!({"message": message}),
    }
}

/// GitHub's 404, for unknown paths and things alike.
fn not_found() -> Failure {
    failure(StatusCode::NOT_FOUND, "Not Found")
}

/// GitHub's 422 for a field it refuses, naming the field and why.
fn validation_failed(field: &str, why: &str) -> Failure {
    Failure {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        body: json!({
            "message": "Validation Failed",
            "errors": [{"field": field, "code": "invalid", "message": why}],
        }),
    }
}

/// An answer of `status` with JSON `body`, typed as GitHub types it.
fn json(status: StatusCode, body: Value) -> Response {
    let content_type = [(CONTENT_TYPE, "application/json; charset=utf-8")];
    (status, content_type, body.to_string()).into_response()
}

#[cfg(test)]
mod tests {
    use std::io;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    /// An answer of the fake, as a client sees it.
    struct Reply {
        status: u16,
        /// Names in lower case.
        headers: Vec<(String, String)>,
        body: String,
    }

    impl Reply {
        fn json(&self) -> Value {
            serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
        }

        fn header(&self, name: &str) -> Option<&str> {
            let found = self.headers.iter().find(|(header, _)| header == name);
            found.map(|(_, value)| value.as_str())
        }
    }

    /// `method target` with `authorization` (none when empty) and `body`, over HTTP/1.1
    /// with `Connection: close`: the answer is all the connection carries.
    async fn send(
        fake: &FakeGitHub,
        method: &str,
        target: &str,
        authorization: &str,
        body: &str,
    ) -> io::Result<Reply> {
        let host = fake.url().trim_start_matches("http://").to_string();
        let mut stream = TcpStream::connect(&host).await?;
        let authorization = match authorization {
            "" => String::new(),
            value => format!("Authorization: {value}\r\n"),
        };
        let request = format!(
            "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\
             Accept: application/vnd.github+json\r\n{authorization}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        parse_reply(&String::from_utf8_lossy(&response))
    }

    fn parse_reply(response: &str) -> io::Result<Reply> {
        let not_http = || io::Error::other(format!("not an HTTP response: {response}"));
        let (head, body) = response.split_once("\r\n\r\n").ok_or_else(not_http)?;
        let mut lines = head.lines();
        let status = lines.next().and_then(|line| line.split_whitespace().nth(1));
        let status = status.and_then(|s| s.parse().ok()).ok_or_else(not_http)?;
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_string()))
            .collect();
        Ok(Reply {
            status,
            headers,
            body: body.to_string(),
        })
    }

    async fn call(
        fake: &FakeGitHub,
        method: &str,
        target: &str,
        token: &str,
        body: Value,
    ) -> Reply {
        let authorization = format!("Bearer {token}");
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        send(fake, method, target, &authorization, &body)
            .await
            .unwrap_or_else(|e| panic!("{method} {target}: {e}"))
    }

    /// A JWT of the App valid now.
    fn app_jwt() -> String {
        let now = now_secs();
        sign_app_jwt(APP_ID, now - 30, now + 540)
    }

    #[tokio::test]
    async fn statuses_are_listed_newest_first_and_recorded() {
        let fake = FakeGitHub::start().await;
        let path = format!("/repos/o/r/statuses/{SHA}");
        let pending =
            json!({"state": "pending", "description": "rolling out", "context": "capstan/a"});
        let created = call(&fake, "POST", &path, TOKEN, pending.clone()).await;
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(
            created.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        let created = created.json();
        assert_eq!(created["creator"]["login"], TOKEN_LOGIN);
        assert_eq!(created["context"], "capstan/a");
        assert!(created["id"].is_u64());
        assert!(created.get("target_url").is_none());
        let success = json!({"state": "success", "target_url": "https://example.com/x"});
        assert_eq!(call(&fake, "POST", &path, TOKEN, success).await.status, 201);

        let listed = call(
            &fake,
            "GET",
            &format!("/repos/o/r/commits/{SHA}/statuses"),
            TOKEN,
            Value::Null,
        )
        .await;
        assert_eq!(listed.status, 200, "{}", listed.body);
        let listed = listed.json();
        let states: Vec<&Value> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["state"])
            .collect();
        assert_eq!(states, ["success", "pending"]);
        assert_eq!(listed[0]["context"], "default");
        assert_eq!(listed[0]["target_url"], "https://example.com/x");
        assert_eq!(listed[0]["description"], Value::Null);

        let kept = fake.statuses(SHA);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0]["state"], "pending");
        assert_eq!(kept[0]["description"], "rolling out");
        assert!(fake.statuses("other").is_empty());

        let first = &fake.requests()[0];
        assert_eq!(
            (first.method.as_str(), first.path.as_str()),
            ("POST", path.as_str())
        );
        assert_eq!(first.authorization, format!("Bearer {TOKEN}"));
        assert_eq!(first.header("Accept"), Some("application/vnd.github+json"));
        assert_eq!(serde_json::from_str::<Value>(&first.body).unwrap(), pending);
    }

    #[tokio::test]
    async fn statuses_paginate() {
        let fake = FakeGitHub::start().await;
        for n in 0..3 {
            let status = json!({"state": "pending", "description": n.to_string()});
            call(
                &fake,
                "POST",
                &format!("/repos/o/r/statuses/{SHA}"),
                TOKEN,
                status,
            )
            .await;
        }
        let target = format!("/repos/o/r/commits/{SHA}/statuses?per_page=2&page=2");
        let page = call(&fake, "GET", &target, TOKEN, Value::Null).await.json();
        assert_eq!(page, json!([fake.statuses(SHA)[0]]));
    }

    #[tokio::test]
    async fn statuses_are_validated_as_github_does() {
        let fake = FakeGitHub::start().await;
        let path = format!("/repos/o/r/statuses/{SHA}");
        let post = async |body: Value| call(&fake, "POST", &path, TOKEN, body).await;
        let refused = post(json!({"state": "done"})).await;
        assert_eq!(refused.status, 422);
        assert_eq!(refused.json()["message"], "Validation Failed");
        assert_eq!(post(json!({"description": "no state"})).await.status, 422);
        let long = "é".repeat(MAX_DESCRIPTION_CHARS + 1);
        let refused = post(json!({"state": "error", "description": long})).await;
        assert_eq!(refused.status, 422);
        assert_eq!(refused.json()["errors"][0]["field"], "description");
        let longest = "é".repeat(MAX_DESCRIPTION_CHARS);
        assert_eq!(
            post(json!({"state": "error", "description": longest}))
                .await
                .status,
            201
        );
        let not_json = send(&fake, "POST", &path, &format!("token {TOKEN}"), "{")
            .await
            .unwrap();
        assert_eq!(not_json.status, 400);
        assert_eq!(fake.statuses(SHA).len(), 1);
    }

    #[tokio::test]
    async fn unknown_tokens_are_refused() {
        let fake = FakeGitHub::start().await;
        let user = call(&fake, "GET", "/user", TOKEN, Value::Null).await;
        assert_eq!(
            (user.status, user.json()),
            (200, json!({"login": TOKEN_LOGIN}))
        );
        let scheme_token = send(&fake, "GET", "/user", &format!("token {TOKEN}"), "")
            .await
            .unwrap();
        assert_eq!(scheme_token.status, 200);

        let wrong = call(&fake, "GET", "/user", "ghp_wrong", Value::Null).await;
        assert_eq!(
            (wrong.status, wrong.json()),
            (401, json!({"message": "Bad credentials"}))
        );
        let status = json!({"state": "success"});
        let path = format!("/repos/o/r/statuses/{SHA}");
        assert_eq!(
            call(&fake, "POST", &path, "ghp_wrong", status).await.status,
            401
        );
        let none = send(&fake, "POST", &path, "", r#"{"state":"success"}"#)
            .await
            .unwrap();
        assert_eq!(none.status, 401);
        assert!(fake.statuses(SHA).is_empty());
        assert_eq!(fake.requests().len(), 5);
    }

    #[tokio::test]
    async fn an_app_jwt_gets_an_installation_token() {
        let fake = FakeGitHub::start().await;
        let app = call(&fake, "GET", "/app", &app_jwt(), Value::Null).await;
        assert_eq!(app.status, 200, "{}", app.body);
        assert_eq!(app.json(), json!({"id": APP_ID, "slug": APP_SLUG}));

        let target = format!("/app/installations/{INSTALLATION_ID}/access_tokens");
        let issued = call(&fake, "POST", &target, &app_jwt(), Value::Null).await;
        assert_eq!(issued.status, 201, "{}", issued.body);
        let issued = issued.json();
        let token = issued["token"].as_str().unwrap();
        assert!(token.starts_with("ghs_") && token.len() == 40, "{token}");
        let expires: jiff::Timestamp = issued["expires_at"].as_str().unwrap().parse().unwrap();
        let ahead = expires.as_second() - now_secs() as i64;
        assert!((3590..=3600).contains(&ahead), "{issued}");

        let status = json!({"state": "success"});
        let path = format!("/repos/o/r/statuses/{SHA}");
        let created = call(&fake, "POST", &path, token, status).await;
        assert_eq!(created.status, 201, "{}", created.body);
        assert_eq!(created.json()["creator"]["login"], APP_LOGIN);
        assert_eq!(APP_LOGIN, format!("{APP_SLUG}[bot]"));
        assert_eq!(
            call(&fake, "GET", "/user", token, Value::Null).await.status,
            403
        );

        let elsewhere = call(
            &fake,
            "POST",
            "/app/installations/1/access_tokens",
            &app_jwt(),
            Value::Null,
        )
        .await;
        assert_eq!(elsewhere.status, 404);
        // An installation token is no JWT, and a JWT no token.
        assert_eq!(
            call(&fake, "GET", "/app", token, Value::Null).await.status,
            401
        );
        assert_eq!(
            call(&fake, "GET", "/user", &app_jwt(), Value::Null)
                .await
                .status,
            401
        );
    }

    #[tokio::test]
    async fn only_valid_app_jwts_are_taken() {
        let fake = FakeGitHub::start().await;
        let app = async |jwt: &str| call(&fake, "GET", "/app", jwt, Value::Null).await.status;
        let now = now_secs();

        let jwt = app_jwt();
        let (message, signature) = jwt.rsplit_once('.').unwrap();
        let (header, _) = message.split_once('.').unwrap();
        let claims = json!({"iat": now - 30, "exp": now + 540, "iss": APP_ID + 1});
        let tampered = format!(
            "{header}.{}.{signature}",
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        assert_eq!(app(&tampered).await, 401);
        assert_eq!(app(&jwt).await, 200, "untouched");
        assert_eq!(app("not.a.jwt").await, 401);
        let token_scheme = send(&fake, "GET", "/app", &format!("token {jwt}"), "")
            .await
            .unwrap();
        assert_eq!(token_scheme.status, 401);

        assert_eq!(
            app(&sign_app_jwt(APP_ID + 1, now - 30, now + 540)).await,
            401
        );
        assert_eq!(
            app(&sign_app_jwt(APP_ID, now - 600, now - 1)).await,
            401,
            "expired"
        );
        assert_eq!(
            app(&sign_app_jwt(APP_ID, now + 120, now + 600)).await,
            401,
            "issued ahead"
        );
        assert_eq!(
            app(&sign_app_jwt(APP_ID, now - 60, now + 541)).await,
            401,
            "too long"
        );
        assert_eq!(
            app(&sign_app_jwt(APP_ID, now + 50, now + 600)).await,
            200,
            "drift"
        );
        assert_eq!(
            app(&sign_app_jwt(APP_ID, now - 60, now + 540)).await,
            200,
            "ten minutes"
        );
    }

    #[test]
    fn claims_take_iss_as_a_string_too() {
        let now = now_secs();
        let claims = json!({"iat": now, "exp": now + 60, "iss": APP_ID.to_string()});
        assert_eq!(check_claims(&claims, now), Ok(()));
        let claims = json!({"iat": now, "exp": now + 60, "iss": "4243"});
        assert!(check_claims(&claims, now).is_err());
    }

    #[test]
    fn the_key_is_pkcs1_rsa_2048() {
        let pem = app_private_key_pem();
        assert!(
            pem.starts_with("-----BEGIN RSA PRIVATE KEY-----\n"),
            "{pem}"
        );
        assert_eq!(app_key().public().modulus_len(), 256);
    }

    #[tokio::test]
    async fn comments_paginate_with_a_link_header() {
        let fake = FakeGitHub::start().await;
        fake.add_comment(7, "someone", "first");
        let path = "/repos/o/r/issues/7/comments";
        for body in ["second", "third"] {
            let created = call(&fake, "POST", path, TOKEN, json!({"body": body})).await;
            assert_eq!(created.status, 201, "{}", created.body);
            assert_eq!(created.json()["user"]["login"], TOKEN_LOGIN);
        }
        let bodies = |page: &Value| -> Vec<String> {
            let comments = page.as_array().unwrap().iter();
            comments
                .map(|c| c["body"].as_str().unwrap().to_string())
                .collect()
        };

        let first = call(
            &fake,
            "GET",
            &format!("{path}?per_page=2"),
            TOKEN,
            Value::Null,
        )
        .await;
        assert_eq!(first.status, 200, "{}", first.body);
        assert_eq!(bodies(&first.json()), ["first", "second"]);
        let base = fake.url();
        let link = format!(
            "<{base}{path}?per_page=2&page=2>; rel=\"next\", <{base}{path}?per_page=2&page=2>; rel=\"last\""
        );
        assert_eq!(first.header("link"), Some(link.as_str()));
        let second = call(
            &fake,
            "GET",
            &format!("{path}?per_page=2&page=2"),
            TOKEN,
            Value::Null,
        )
        .await;
        assert_eq!(bodies(&second.json()), ["third"]);
        assert_eq!(second.header("link"), None);
        let all = call(&fake, "GET", path, TOKEN, Value::Null).await;
        assert_eq!((bodies(&all.json()).len(), all.header("link")), (3, None));

        let kept = fake.comments(7);
        assert_eq!(kept[0].login, "someone");
        assert_eq!(kept[2].body, "third");
        assert!(fake.comments(8).is_empty());
        let listed = call(
            &fake,
            "GET",
            "/repos/o/r/issues/8/comments",
            TOKEN,
            Value::Null,
        )
        .await;
        assert_eq!(listed.json(), json!([]));
    }

    #[tokio::test]
    async fn only_its_author_edits_a_comment() {
        let fake = FakeGitHub::start().await;
        let theirs = fake.add_comment(7, "someone", "mine");
        let edit = |id: u64| format!("/repos/o/r/issues/comments/{id}");
        let refused = call(&fake, "PATCH", &edit(theirs), TOKEN, json!({"body": "x"})).await;
        assert_eq!(refused.status, 403);
        assert_eq!(fake.comments(7)[0].body, "mine");

        let ours = call(
            &fake,
            "POST",
            "/repos/o/r/issues/7/comments",
            TOKEN,
            json!({"body": "a"}),
        )
        .await;
        let ours = ours.json()["id"].as_u64().unwrap();
        assert_ne!(ours, theirs);
        let edited = call(&fake, "PATCH", &edit(ours), TOKEN, json!({"body": "b"})).await;
        assert_eq!(edited.status, 200, "{}", edited.body);
        assert_eq!(
            edited.json(),
            json!({"id": ours, "body": "b", "user": {"login": TOKEN_LOGIN}})
        );
        assert_eq!(fake.comments(7)[1].body, "b");
        assert_eq!(
            call(&fake, "PATCH", &edit(1), TOKEN, json!({"body": "b"}))
                .await
                .status,
            404
        );
    }

    #[tokio::test]
    async fn down_answers_502_and_still_records() {
        let fake = FakeGitHub::start().await;
        fake.set_down(true);
        let down = call(&fake, "GET", "/user", TOKEN, Value::Null).await;
        assert_eq!(
            (down.status, down.json()),
            (502, json!({"message": "Server Error"}))
        );
        let status = json!({"state": "success"});
        let path = format!("/repos/o/r/statuses/{SHA}");
        assert_eq!(
            call(&fake, "POST", &path, TOKEN, status.clone())
                .await
                .status,
            502
        );
        assert!(fake.statuses(SHA).is_empty());
        let recorded: Vec<String> = fake.requests().iter().map(|r| r.path.clone()).collect();
        assert_eq!(recorded, ["/user", path.as_str()]);

        fake.set_down(false);
        assert_eq!(call(&fake, "POST", &path, TOKEN, status).await.status, 201);
    }

    #[tokio::test]
    async fn hooks_answer_what_was_set() {
        let fake = FakeGitHub::start().await;
        let hook = send(&fake, "POST", "/hooks/slack", "", r#"{"text":"hi"}"#)
            .await
            .unwrap();
        assert_eq!((hook.status, hook.body.as_str()), (200, "ok"));
        fake.set_hook_status("slack", 500);
        let hook = send(&fake, "POST", "/hooks/slack?x=1", "", "second")
            .await
            .unwrap();
        assert_eq!(hook.status, 500);
        send(&fake, "POST", "/hooks/other", "", "").await.unwrap();
        let bodies: Vec<String> = fake.hooks("slack").into_iter().map(|r| r.body).collect();
        assert_eq!(bodies, [r#"{"text":"hi"}"#, "second"]);
    }

    #[tokio::test]
    async fn anything_else_is_not_found() {
        let fake = FakeGitHub::start().await;
        for (method, target) in [
            ("GET", "/"),
            ("GET", "/repos/o/r/pulls"),
            ("DELETE", "/user"),
            ("GET", "/hooks/slack"),
            ("GET", "/repos/o/r/issues/x/comments"),
        ] {
            let reply = call(&fake, method, target, TOKEN, Value::Null).await;
            assert_eq!(
                (reply.status, reply.json()),
                (404, json!({"message": "Not Found"})),
                "{method} {target}"
            );
        }
    }
}
