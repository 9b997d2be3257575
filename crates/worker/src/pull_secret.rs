//! The kmod image's pull secret: a Docker config JSON (the `.dockerconfigjson` key of a
//! `kubernetes.io/dockerconfigjson` Secret), mounted in the worker pod at
//! [`super::PULL_SECRET_DIR`].
//!
//! ```json
//! {"auths": {"registry.example:5000": {"auth": "<base64 of user:password>"},
//!            "other.example": {"username": "user", "password": "password"}}}
//! ```
//!
//! The legacy format of a `kubernetes.io/dockercfg` Secret (its `.dockercfg` key) is the
//! same map without the `auths` wrapper, and is read too, as the kubelet reads both:
//!
//! ```json
//! {"registry.example:5000": {"auth": "<base64 of user:password>"}}
//! ```
//!
//! Keys are matched as the kubelet matches them: `host[:port]`, optionally with a scheme
//! (`https://host/v1/`, as `docker login` wrote them for Docker Hub), a repository path
//! prefix (`host/org` applies to `host/org/...` only) and `*` wildcards in host labels
//! (`*.example.com`). The most specific matching key wins; no match means an anonymous
//! pull. Docker Hub's names (`docker.io`, `index.docker.io`, `registry-1.docker.io`) are
//! one registry.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use thiserror::Error;

/// Why the pull secret was refused. Each message is one line naming the file.
#[derive(Debug, Error)]
pub enum PullSecretError {
    /// The file could not be read.
    #[error("cannot read the pull secret {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// The text is not a Docker config JSON.
    #[error("{origin}: not a Docker config JSON ({{\"auths\": {{...}}}}): {message}")]
    Json {
        /// The file the text came from.
        origin: String,
        /// What the JSON reader reported.
        message: String,
    },
    /// An entry's `auth` is not the base64 of `user:password`.
    #[error("{origin}: {field}: {reason}")]
    Auth {
        /// The file the text came from.
        origin: String,
        /// Where the `auth` is: `auths."<key>".auth`, or `"<key>".auth` in the legacy
        /// format.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A user name and password for one registry. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: String,
    /// The password (or token used as one).
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// A parsed Docker config JSON: credentials by registry key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullSecret {
    /// `(key, credentials)` in the file's order.
    entries: Vec<(String, Credentials)>,
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: Option<BTreeMap<String, AuthEntry>>,
    /// The other top-level entries: settings of a Docker config JSON, or, in the legacy
    /// format, which has no `auths`, the registries themselves.
    #[serde(flatten)]
    rest: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Reads the Docker config JSON at `path`. Fails when it cannot be read or [`parse`]
/// fails.
pub fn read(path: &Path) -> Result<PullSecret, PullSecretError> {
    let text = std::fs::read_to_string(path).map_err(|source| PullSecretError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Parses a Docker config JSON, or the legacy `.dockercfg` format (a JSON object without
/// `auths`, whose object-valued entries are the registries); `origin` names where `text`
/// came from in errors. Entries without credentials (an empty object, or only an
/// `identitytoken`) are left out.
///
/// Fails when `text` is not JSON of either shape, or an `auth` is not the base64 of
/// `user:password`.
pub fn parse(text: &str, origin: &str) -> Result<PullSecret, PullSecretError> {
    let not_a_config = |message: String| PullSecretError::Json {
        origin: origin.to_string(),
        message,
    };
    let config: DockerConfig =
        serde_json::from_str(text).map_err(|err| not_a_config(err.to_string()))?;
    let (registries, field_prefix) = match config.auths {
        Some(auths) => (auths, "auths."),
        None => {
            let mut registries = BTreeMap::new();
            for (key, value) in config.rest.into_iter().filter(|(_, v)| v.is_object()) {
                let entry = serde_json::from_value(value)
                    .map_err(|err| not_a_config(format!("{key:?}: {err}")))?;
                registries.insert(key, entry);
            }
            (registries, "")
        }
    };
    let mut entries = Vec::new();
    for (key, entry) in registries {
        let credentials = match entry.auth.filter(|auth| !auth.is_empty()) {
            // `auth` wins over `username`/`password`, as for Docker and the kubelet.
            Some(auth) => decode_auth(&auth).map_err(|reason| PullSecretError::Auth {
                origin: origin.to_string(),
                field: format!("{field_prefix}{key:?}.auth"),
                reason,
            })?,
            None => match (entry.username, entry.password) {
                (Some(username), Some(password)) => Credentials { username, password },
                _ => continue,
            },
        };
        entries.push((key, credentials));
    }
    Ok(PullSecret { entries })
}

fn decode_auth(auth: &str) -> Result<Credentials, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|err| format!("not base64 ({err})"))?;
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 once decoded".to_string())?;
    let (username, password) = text
        .split_once(':')
        .ok_or_else(|| "decodes to no `user:password` (no colon)".to_string())?;
    Ok(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

impl PullSecret {
    /// A pull secret with `credentials` for registry key `key` (tests, and callers that
    /// hold credentials some other way).
    pub fn with(mut self, key: &str, credentials: Credentials) -> Self {
        self.entries.push((key.to_string(), credentials));
        self
    }

    /// The credentials for `repository` (`host[:port]/path`, as in an image reference
    /// without tag), or `None` for an anonymous pull.
    pub fn credentials_for(&self, repository: &str) -> Option<&Credentials> {
        self.entries
            .iter()
            .filter_map(|(key, credentials)| {
                key_matches(key, repository).map(|specificity| (specificity, credentials))
            })
            // The first of the most specific keys.
            .fold(
                None,
                |best: Option<(usize, &Credentials)>, (rank, found)| match best {
                    Some((best_rank, _)) if best_rank >= rank => best,
                    _ => Some((rank, found)),
                },
            )
            .map(|(_, credentials)| credentials)
    }
}

/// How specifically `key` matches `repository` (longer is more specific), or `None`.
fn key_matches(key: &str, repository: &str) -> Option<usize> {
    let key = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    // `docker login` keys Docker Hub as `https://index.docker.io/v1/`: an API path.
    let key = key.strip_suffix("/v1").unwrap_or(key);
    let (key_host, key_path) = key.split_once('/').unwrap_or((key, ""));
    let (host, path) = repository.split_once('/').unwrap_or((repository, ""));
    if !host_matches(&canonical_host(key_host), &canonical_host(host)) {
        return None;
    }
    if !key_path.is_empty() {
        let below = path
            .strip_prefix(key_path)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        if !below {
            return None;
        }
    }
    Some(key.len())
}

fn canonical_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => host,
    }
}

/// `host[:port]` against a key host with optional `*` labels; ports must be equal.
fn host_matches(pattern: &str, host: &str) -> bool {
    let (pattern_name, pattern_port) = pattern.split_once(':').unwrap_or((pattern, ""));
    let (name, port) = host.split_once(':').unwrap_or((host, ""));
    if pattern_port != port {
        return false;
    }
    let pattern_labels: Vec<&str> = pattern_name.split('.').collect();
    let labels: Vec<&str> = name.split('.').collect();
    pattern_labels.len() == labels.len()
        && pattern_labels
            .iter()
            .zip(&labels)
            .all(|(pattern, label)| label_matches(pattern, label))
}

/// One host label against a pattern label where `*` stands for any run of characters.
fn label_matches(pattern: &str, label: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == label,
        Some((prefix, rest)) => {
            let Some(after) = label.strip_prefix(prefix) else {
                return false;
            };
            (0..=after.len())
                .filter(|&at| after.is_char_boundary(at))
                .any(|at| label_matches(rest, &after[at..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Credentials {
        Credentials {
            username: name.to_string(),
            password: format!("{name}-password"),
        }
    }

    fn auth(name: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(format!("{name}:{name}-password"))
    }

    #[test]
    fn keys_match_repositories_as_the_kubelet_matches_them() {
        // (key, repository, matches)
        let cases = [
            ("registry.example", "registry.example/org/kmod", true),
            ("registry.example", "registry.example:5000/org/kmod", false),
            (
                "registry.example:5000",
                "registry.example:5000/org/kmod",
                true,
            ),
            ("127.0.0.1:5000", "127.0.0.1:5000/kmod", true),
            ("https://registry.example/", "registry.example/kmod", true),
            ("http://registry.example", "registry.example/kmod", true),
            ("REGISTRY.example", "registry.example/kmod", true),
            ("registry.example/org", "registry.example/org/kmod", true),
            (
                "registry.example/org",
                "registry.example/organisation/kmod",
                false,
            ),
            (
                "registry.example/org/kmod",
                "registry.example/org/kmod",
                true,
            ),
            ("*.example", "registry.example/kmod", true),
            ("*.example", "a.registry.example/kmod", false),
            ("reg*.example", "registry.example/kmod", true),
            ("other.example", "registry.example/kmod", false),
            (
                "https://index.docker.io/v1/",
                "docker.io/library/busybox",
                true,
            ),
            ("docker.io", "index.docker.io/library/busybox", true),
            ("registry-1.docker.io", "docker.io/org/kmod", true),
        ];
        for (key, repository, want) in cases {
            assert_eq!(
                key_matches(key, repository).is_some(),
                want,
                "{key} vs {repository}"
            );
        }
    }

    #[test]
    fn the_most_specific_key_wins_and_no_match_is_anonymous() {
        let secret = PullSecret::default()
            .with("*.example", user("wildcard"))
            .with("registry.example", user("host"))
            .with("registry.example/org", user("org"));
        let cases = [
            ("registry.example/org/kmod", Some("org")),
            ("registry.example/other/kmod", Some("host")),
            ("mirror.example/org/kmod", Some("wildcard")),
            ("registry.test/org/kmod", None),
        ];
        for (repository, want) in cases {
            let got = secret
                .credentials_for(repository)
                .map(|c| c.username.as_str());
            assert_eq!(got, want, "{repository}");
        }
    }

    #[test]
    fn auth_and_username_password_entries_parse() {
        let text = format!(
            r#"{{"auths": {{
                "a.example": {{"auth": "{}"}},
                "b.example": {{"username": "b", "password": "b-password", "email": "x@y"}},
                "c.example": {{"auth": "{}", "username": "ignored", "password": "ignored"}},
                "d.example": {{"identitytoken": "t"}}
            }}}}"#,
            auth("a"),
            auth("c"),
        );
        let secret = parse(&text, "secret.json").unwrap();
        assert_eq!(
            secret,
            PullSecret::default()
                .with("a.example", user("a"))
                .with("b.example", user("b"))
                .with("c.example", user("c"))
        );
    }

    #[test]
    fn a_legacy_dockercfg_secret_parses_like_its_auths() {
        let legacy = format!(
            r#"{{"a.example": {{"auth": "{}", "email": "x@y"}},
                 "b.example": {{"username": "b", "password": "b-password"}}}}"#,
            auth("a"),
        );
        let wrapped = format!(r#"{{"auths": {legacy}}}"#);
        let want = PullSecret::default()
            .with("a.example", user("a"))
            .with("b.example", user("b"));
        assert_eq!(parse(&legacy, "s").unwrap(), want);
        assert_eq!(parse(&wrapped, "s").unwrap(), want);
        // Settings of a Docker config JSON without `auths` are no registries.
        assert_eq!(
            parse(r#"{"credsStore": "desktop"}"#, "s").unwrap(),
            PullSecret::default()
        );
        assert_eq!(
            parse(r#"{"r.example": {"auth": "%%%"}}"#, "s.json")
                .unwrap_err()
                .to_string(),
            "s.json: \"r.example\".auth: not base64 (Invalid symbol 37, offset 0.)"
        );
    }

    #[test]
    fn a_password_may_hold_colons() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("u:p:a:ss");
        let text = format!(r#"{{"auths": {{"r.example": {{"auth": "{encoded}"}}}}}}"#);
        let secret = parse(&text, "s").unwrap();
        let got = secret.credentials_for("r.example/x").unwrap();
        assert_eq!(
            (got.username.as_str(), got.password.as_str()),
            ("u", "p:a:ss")
        );
    }

    #[test]
    fn broken_secrets_say_where() {
        let no_colon = base64::engine::general_purpose::STANDARD.encode("nocolon");
        let cases = [
            (
                "{".to_string(),
                "s.json: not a Docker config JSON ({\"auths\": {...}}): EOF while parsing an object at line 1 column 1",
            ),
            (
                r#"{"auths": {"r.example": {"auth": "%%%"}}}"#.to_string(),
                "s.json: auths.\"r.example\".auth: not base64 (Invalid symbol 37, offset 0.)",
            ),
            (
                format!(r#"{{"auths": {{"r.example": {{"auth": "{no_colon}"}}}}}}"#),
                "s.json: auths.\"r.example\".auth: decodes to no `user:password` (no colon)",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(&text, "s.json").unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let shown = format!("{:?}", user("a"));
        assert!(!shown.contains("a-password"), "{shown}");
    }
}
