//! GitHub's side of the notifications: commit statuses and the pull request's comment,
//! authenticated with a token or as a GitHub App installation.
//!
//! | request | for |
//! |---|---|
//! | `GET /repos/{repo}/commits/{sha}/statuses` | what GitHub holds for the context, before the first post of a process |
//! | `POST /repos/{repo}/statuses/{sha}` | the report |
//! | `GET /user` (token), `GET /app` (App) | who capstan is, to find its own comment |
//! | `GET /repos/{repo}/issues/{n}/comments` | the comment with the context's marker, by capstan |
//! | `POST /repos/{repo}/issues/{n}/comments`, `PATCH /repos/{repo}/issues/comments/{id}` | the comment |
//! | `POST /app/installations/{id}/access_tokens` | an App's installation token (kept until 5 minutes before it expires) |
//!
//! Tokens are never logged nor put in an error: errors name the request's URL (which holds
//! none) and GitHub's answer.

use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Report, Sent, State, shorten};
use crate::sync::plan::render::escape;

/// How long one request to GitHub may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// Comment pages looked through for capstan's own comment (100 comments each).
const MAX_COMMENT_PAGES: usize = 10;

/// Why GitHub could not be told.
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    /// The request failed or GitHub refused it.
    #[error("{method} {url}: {message}")]
    Request {
        method: &'static str,
        url: String,
        message: String,
    },
    /// The App's private key is not an RSA key in PEM.
    #[error("the GitHub App's private key: {0}")]
    Key(String),
}

/// How capstan authenticates.
pub enum Auth {
    /// A personal or fine-grained token.
    Token(String),
    /// A GitHub App installation: JWTs signed with the App's key buy installation tokens.
    App {
        app_id: u64,
        installation_id: u64,
        key: Box<RsaKeyPair>,
    },
}

impl Auth {
    /// An App's authentication from its private key in PEM (PKCS#1, as GitHub hands it out,
    /// or PKCS#8).
    pub fn app(app_id: u64, installation_id: u64, pem: &[u8]) -> Result<Auth, GitHubError> {
        let der =
            PrivateKeyDer::from_pem_slice(pem).map_err(|e| GitHubError::Key(e.to_string()))?;
        let key = match &der {
            PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()),
            PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()),
            _ => return Err(GitHubError::Key("not an RSA key".into())),
        }
        .map_err(|e| GitHubError::Key(e.to_string()))?;
        Ok(Auth::App {
            app_id,
            installation_id,
            key: Box::new(key),
        })
    }
}

/// One repository on one GitHub.
pub struct GitHub {
    /// The API's base URL, without a trailing slash.
    api: String,
    /// `owner/name`.
    repository: String,
    auth: Auth,
    client: reqwest::Client,
    /// An App's installation token and when to buy the next.
    installation: Mutex<Option<(String, SystemTime)>>,
    /// Who capstan is on GitHub, once asked.
    login: Mutex<Option<String>>,
}

#[derive(Deserialize)]
struct Status {
    state: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    context: String,
}

#[derive(Deserialize)]
struct Comment {
    id: u64,
    #[serde(default)]
    body: String,
    user: User,
}

#[derive(Deserialize)]
struct User {
    login: String,
}

impl GitHub {
    /// GitHub at `api` for `repository` (`owner/name`).
    pub fn new(api: &str, repository: &str, auth: Auth, client: reqwest::Client) -> GitHub {
        GitHub {
            api: api.trim_end_matches('/').to_string(),
            repository: repository.to_string(),
            auth,
            client,
            installation: Mutex::new(None),
            login: Mutex::new(None),
        }
    }

    /// The last status of `context` on commit `sha`, as GitHub holds it.
    pub async fn latest_status(
        &self,
        sha: &str,
        context: &str,
    ) -> Result<Option<Sent>, GitHubError> {
        let url = format!(
            "{}/repos/{}/commits/{sha}/statuses?per_page=100",
            self.api, self.repository
        );
        let (body, _) = self.send("GET", &url, None).await?;
        let statuses: Vec<Status> = parse(&url, "GET", &body)?;
        // Newest first, as GitHub lists them.
        Ok(statuses
            .into_iter()
            .find(|s| s.context == context)
            .and_then(|s| {
                Some(Sent {
                    state: State::parse(&s.state)?,
                    description: s.description.unwrap_or_default(),
                })
            }))
    }

    /// Posts `report` as the status of `context` on its commit.
    pub async fn post_status(
        &self,
        report: &Report,
        context: &str,
        target_url: Option<&str>,
    ) -> Result<(), GitHubError> {
        let url = format!(
            "{}/repos/{}/statuses/{}",
            self.api, self.repository, report.commit.sha
        );
        let mut body = json!({
            "state": report.state.as_str(),
            "description": shorten(&report.description, super::MAX_DESCRIPTION),
            "context": context,
        });
        if let Some(target) = target_url {
            body["target_url"] = json!(target);
        }
        self.send("POST", &url, Some(body)).await.map(drop)
    }

    /// Creates or updates capstan's comment for `context` on pull request `number`: the one
    /// that starts with the context's marker and that capstan wrote (another's comment with
    /// the marker is left alone).
    pub async fn upsert_comment(
        &self,
        number: u64,
        context: &str,
        body: &str,
    ) -> Result<(), GitHubError> {
        let login = self.login().await?;
        let marker = marker(context);
        let mut url = Some(format!(
            "{}/repos/{}/issues/{number}/comments?per_page=100",
            self.api, self.repository
        ));
        let mut pages = 0;
        while let Some(page) = url.take() {
            pages += 1;
            let (text, next) = self.send("GET", &page, None).await?;
            let comments: Vec<Comment> = parse(&page, "GET", &text)?;
            if let Some(mine) = comments
                .iter()
                .find(|c| c.user.login == login && c.body.starts_with(&marker))
            {
                if mine.body == body {
                    return Ok(());
                }
                let edit = format!(
                    "{}/repos/{}/issues/comments/{}",
                    self.api, self.repository, mine.id
                );
                return self
                    .send("PATCH", &edit, Some(json!({ "body": body })))
                    .await
                    .map(drop);
            }
            // Only a next page on the same GitHub is followed.
            url = next.filter(|n| n.starts_with(&self.api) && pages < MAX_COMMENT_PAGES);
        }
        let create = format!(
            "{}/repos/{}/issues/{number}/comments",
            self.api, self.repository
        );
        self.send("POST", &create, Some(json!({ "body": body })))
            .await
            .map(drop)
    }

    /// Who capstan is on GitHub: the token's user, or the App's bot (`<slug>[bot]`).
    async fn login(&self) -> Result<String, GitHubError> {
        if let Some(login) = lock(&self.login).clone() {
            return Ok(login);
        }
        let login = match &self.auth {
            Auth::Token(_) => {
                let url = format!("{}/user", self.api);
                let (body, _) = self.send("GET", &url, None).await?;
                let user: User = parse(&url, "GET", &body)?;
                user.login
            }
            Auth::App { .. } => {
                let url = format!("{}/app", self.api);
                let jwt = self.jwt()?;
                let (body, _) = self.request("GET", &url, None, &jwt).await?;
                let app: Value = parse(&url, "GET", &body)?;
                let slug = app["slug"].as_str().unwrap_or_default();
                format!("{slug}[bot]")
            }
        };
        *lock(&self.login) = Some(login.clone());
        Ok(login)
    }

    /// The bearer token of the next request.
    async fn token(&self) -> Result<String, GitHubError> {
        let installation_id = match &self.auth {
            Auth::Token(token) => return Ok(token.clone()),
            Auth::App {
                installation_id, ..
            } => *installation_id,
        };
        if let Some((token, renew)) = lock(&self.installation).clone()
            && SystemTime::now() < renew
        {
            return Ok(token);
        }
        let url = format!(
            "{}/app/installations/{installation_id}/access_tokens",
            self.api
        );
        let jwt = self.jwt()?;
        let (body, _) = self.request("POST", &url, Some(json!({})), &jwt).await?;
        let answer: Value = parse(&url, "POST", &body)?;
        let token = answer["token"].as_str().unwrap_or_default().to_string();
        // An installation token lasts an hour; one is bought again 5 minutes before.
        let expires = answer["expires_at"]
            .as_str()
            .and_then(|at| at.parse::<jiff::Timestamp>().ok())
            .map(|at| UNIX_EPOCH + Duration::from_secs(at.as_second().max(0) as u64))
            .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(3600));
        let renew = expires - Duration::from_secs(300);
        *lock(&self.installation) = Some((token.clone(), renew));
        Ok(token)
    }

    /// A JWT for the App, valid for 9 minutes (GitHub takes at most 10), issued a minute
    /// back for clocks that differ.
    fn jwt(&self) -> Result<String, GitHubError> {
        let Auth::App { app_id, key, .. } = &self.auth else {
            return Err(GitHubError::Key("no App configured".into()));
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        sign_jwt(key, *app_id, now - 60, now + 540)
    }

    async fn send(
        &self,
        method: &'static str,
        url: &str,
        body: Option<Value>,
    ) -> Result<(String, Option<String>), GitHubError> {
        let token = self.token().await?;
        self.request(method, url, body, &token).await
    }

    /// One request; the answer's body and its `Link: rel="next"` URL.
    async fn request(
        &self,
        method: &'static str,
        url: &str,
        body: Option<Value>,
        token: &str,
    ) -> Result<(String, Option<String>), GitHubError> {
        let failed = |message: String| GitHubError::Request {
            method,
            url: url.to_string(),
            message,
        };
        let verb = reqwest::Method::from_bytes(method.as_bytes()).expect("a valid method");
        let mut request = self
            .client
            .request(verb, url)
            .timeout(TIMEOUT)
            .header("Accept", "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28")
            .bearer_auth(token);
        if let Some(body) = body {
            request = request
                .header("Content-Type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(|e| failed(e.to_string()))?;
        let status = response.status();
        let next = response
            .headers()
            .get("link")
            .and_then(|v| v.to_str().ok())
            .and_then(next_link);
        let text = response.text().await.map_err(|e| failed(e.to_string()))?;
        if !status.is_success() {
            let excerpt: String = text.chars().take(200).collect();
            return Err(failed(format!("{status}: {excerpt}")));
        }
        Ok((text, next))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn parse<T: serde::de::DeserializeOwned>(
    url: &str,
    method: &'static str,
    body: &str,
) -> Result<T, GitHubError> {
    serde_json::from_str(body).map_err(|e| GitHubError::Request {
        method,
        url: url.to_string(),
        message: format!("unexpected answer: {e}"),
    })
}

/// The URL of `rel="next"` in a `Link` header.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                url.trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

/// A JWT (RS256) for App `app_id`, issued at `iat`, expiring at `exp` (seconds).
pub fn sign_jwt(key: &RsaKeyPair, app_id: u64, iat: u64, exp: u64) -> Result<String, GitHubError> {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = URL_SAFE_NO_PAD.encode(json!({"iat": iat, "exp": exp, "iss": app_id}).to_string());
    let message = format!("{header}.{claims}");
    let mut signature = vec![0; key.public().modulus_len()];
    key.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        message.as_bytes(),
        &mut signature,
    )
    .map_err(|_| GitHubError::Key("signing failed".into()))?;
    Ok(format!("{message}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// The first line of capstan's comment for `context`: how it is found again.
pub fn marker(context: &str) -> String {
    format!("<!-- capstan-rollout: {} -->", escape::html(context))
}

/// capstan's comment for `context`: the report's state and line, and each node.
pub fn comment_body(context: &str, report: &Report) -> String {
    let icon = match report.state {
        State::Pending => "⏳",
        State::Success => "✅",
        State::Failure => "❌",
    };
    let mut body = format!(
        "{}\n### Rollout on {}\n\n{icon} **{}**: {}\n",
        marker(context),
        escape::code(context),
        report.state.as_str(),
        escape::text(&report.description),
    );
    if let Some(failure) = &report.failure {
        body.push_str(&format!(
            "\n**Failed:** {}{}: {}\n",
            failure
                .node
                .as_deref()
                .map(|n| format!("{} ", escape::code(n)))
                .unwrap_or_default(),
            escape::text(&failure.step),
            escape::text(&failure.reason),
        ));
    }
    if !report.nodes.is_empty() {
        body.push_str("\n| node | modules | status |\n|---|---|---|\n");
        for line in &report.nodes {
            let modules: Vec<String> = line.modules.iter().map(|m| escape::cell_code(m)).collect();
            body.push_str(&format!(
                "| {} | {} | {} |\n",
                escape::cell_code(&line.node),
                modules.join("<br>"),
                escape::text(&line.status),
            ));
        }
    }
    body.push_str(&format!(
        "\n<sub>commit {} · updated by capstan as the rollout goes</sub>\n",
        escape::code(&report.commit.short_sha)
    ));
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let header = r#"<https://api.github.com/x?page=2>; rel="next", <https://api.github.com/x?page=5>; rel="last""#;
        assert_eq!(
            next_link(header).as_deref(),
            Some("https://api.github.com/x?page=2")
        );
        assert_eq!(next_link(r#"<https://a/x?page=1>; rel="prev""#), None);
    }
}
