//! Credentials for a remote, and SSH host keys checked against a known_hosts file.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use git2::{CertificateCheckStatus, Cred, CredentialType, ErrorClass, ErrorCode, RemoteCallbacks};
use ring::hmac;

use super::SourceError;

/// How to reach a remote.
#[derive(Clone, Default)]
pub enum Auth {
    /// Anonymous https, or ssh through a running ssh-agent.
    #[default]
    None,
    /// https with a token as the password; the user is the one in the URL, else `x-access-token`
    /// (GitHub accepts it for app and personal tokens alike).
    Token {
        /// The token; surrounding whitespace (a trailing newline from a file) is ignored.
        token: String,
    },
    /// ssh with a private key file (without passphrase); the user is the one in the URL, else `git`.
    SshKey {
        /// Path of the private key.
        private_key: PathBuf,
        /// Host keys to trust; without it, libgit2 checks `~/.ssh/known_hosts`.
        known_hosts: Option<PathBuf>,
    },
}

impl fmt::Debug for Auth {
    // The token never reaches logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token { .. } => f.write_str("Token { token: \"***\" }"),
            Auth::SshKey {
                private_key,
                known_hosts,
            } => f
                .debug_struct("SshKey")
                .field("private_key", private_key)
                .field("known_hosts", known_hosts)
                .finish(),
        }
    }
}

/// Auth checked and loaded once, handing out fresh callbacks for every connection.
pub(super) struct Credentials {
    auth: Auth,
    known_hosts: Option<KnownHosts>,
    /// The name the server has in known_hosts: `host`, or `[host]:port` off port 22.
    host: Option<String>,
}

impl Credentials {
    /// Checks that the key and known_hosts files can be read, so mistakes show at start-up.
    pub(super) fn new(auth: Auth, url: &str) -> Result<Credentials, SourceError> {
        let mut known_hosts = None;
        if let Auth::SshKey {
            private_key,
            known_hosts: hosts_file,
        } = &auth
        {
            std::fs::metadata(private_key).map_err(|e| SourceError::CredentialFile {
                file: private_key.clone(),
                message: e.to_string(),
            })?;
            if let Some(file) = hosts_file {
                let text =
                    std::fs::read_to_string(file).map_err(|e| SourceError::CredentialFile {
                        file: file.clone(),
                        message: e.to_string(),
                    })?;
                known_hosts = Some(KnownHosts::parse(file, &text));
            }
        }
        Ok(Credentials {
            auth,
            known_hosts,
            host: known_hosts_name(url),
        })
    }

    /// Callbacks answering the server's requests for credentials and checking its host key.
    pub(super) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut callbacks = RemoteCallbacks::new();
        // libgit2 asks again after a rejection; offering the same secret twice would loop forever.
        let mut offered = false;
        callbacks.credentials(move |_url, user_from_url, allowed| {
            if allowed.contains(CredentialType::USERNAME) {
                return Cred::username(user_from_url.unwrap_or("git"));
            }
            if offered {
                return Err(auth_error("the remote rejected the credentials"));
            }
            offered = true;
            match &self.auth {
                Auth::Token { token } if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) => {
                    Cred::userpass_plaintext(user_from_url.unwrap_or("x-access-token"), token.trim())
                }
                Auth::SshKey { private_key, .. } if allowed.contains(CredentialType::SSH_KEY) => {
                    Cred::ssh_key(user_from_url.unwrap_or("git"), None, private_key, None)
                }
                Auth::None if allowed.contains(CredentialType::SSH_KEY) => {
                    Cred::ssh_key_from_agent(user_from_url.unwrap_or("git"))
                }
                _ => Err(auth_error(
                    "the remote asks for credentials capstan was not given: a token for https, an SSH key for ssh",
                )),
            }
        });
        callbacks.certificate_check(move |cert, hostname| {
            let (Some(known_hosts), Some(hostkey)) = (&self.known_hosts, cert.as_hostkey()) else {
                return Ok(CertificateCheckStatus::CertificatePassthrough);
            };
            let (Some(key), Some(key_type)) = (hostkey.hostkey(), hostkey.hostkey_type()) else {
                return Ok(CertificateCheckStatus::CertificatePassthrough);
            };
            let host = self.host.as_deref().unwrap_or(hostname);
            known_hosts
                .check(host, key_type.name(), key)
                .map(|()| CertificateCheckStatus::CertificateOk)
                .map_err(|message| {
                    git2::Error::new(ErrorCode::Certificate, ErrorClass::Ssh, message)
                })
        });
        callbacks
    }
}

fn auth_error(message: &str) -> git2::Error {
    git2::Error::new(ErrorCode::Auth, ErrorClass::Net, message)
}

/// The host as known_hosts names it, from an ssh URL (`ssh://user@host:port/path` or `user@host:path`).
fn known_hosts_name(url: &str) -> Option<String> {
    let authority = match url.split_once("://") {
        Some((scheme, rest)) if scheme.starts_with("ssh") || scheme.ends_with("ssh") => {
            rest.split('/').next()?
        }
        Some(_) => return None,
        None => url.split_once(':')?.0,
    };
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(bracketed) => {
            let (host, rest) = bracketed.split_once(']')?;
            (host, rest.strip_prefix(':'))
        }
        None => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    Some(match port {
        Some(port) if !port.is_empty() && port != "22" => format!("[{host}]:{port}"),
        _ => host.to_string(),
    })
}

/// The entries of an OpenSSH known_hosts file.
struct KnownHosts {
    file: PathBuf,
    entries: Vec<KnownHost>,
}

struct KnownHost {
    revoked: bool,
    patterns: String,
    key_type: String,
    key: Vec<u8>,
}

impl KnownHosts {
    /// Lines ssh itself would skip (comments, unknown markers, bad base64) are skipped here too.
    fn parse(file: &Path, text: &str) -> KnownHosts {
        let entries = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace().peekable();
                let revoked = match fields.peek()? {
                    first if first.starts_with('#') => return None,
                    &"@revoked" => true,
                    // capstan cannot check host certificates, so CA lines vouch for nothing here.
                    first if first.starts_with('@') => return None,
                    _ => false,
                };
                if revoked {
                    fields.next();
                }
                let patterns = fields.next()?.to_string();
                let key_type = fields.next()?.to_string();
                let key = BASE64.decode(fields.next()?).ok()?;
                Some(KnownHost {
                    revoked,
                    patterns,
                    key_type,
                    key,
                })
            })
            .collect();
        KnownHosts {
            file: file.to_path_buf(),
            entries,
        }
    }

    /// Accepts the key if a line for `host` lists it and no `@revoked` line does.
    fn check(&self, host: &str, key_type: &str, key: &[u8]) -> Result<(), String> {
        let file = self.file.display();
        let for_host: Vec<&KnownHost> = self
            .entries
            .iter()
            .filter(|entry| host_matches(&entry.patterns, host))
            .collect();
        let same_key = |entry: &KnownHost| entry.key_type == key_type && entry.key == key;
        if for_host
            .iter()
            .any(|entry| entry.revoked && same_key(entry))
        {
            return Err(format!(
                "the {key_type} host key of {host} is revoked in {file}"
            ));
        }
        if for_host
            .iter()
            .any(|entry| !entry.revoked && same_key(entry))
        {
            return Ok(());
        }
        if for_host.iter().any(|entry| !entry.revoked) {
            return Err(format!(
                "the {key_type} host key of {host} does not match {file}; if the server's key really changed, replace its line"
            ));
        }
        Err(format!(
            "{host} is not in {file}; add its host key (ssh-keyscan prints it)"
        ))
    }
}

/// Whether a comma-separated known_hosts pattern list names `host` (hashed, wildcard and `!` forms).
fn host_matches(patterns: &str, host: &str) -> bool {
    let mut matched = false;
    for pattern in patterns.split(',') {
        if let Some(hashed) = pattern.strip_prefix("|1|") {
            matched |= hashed_host_matches(hashed, host);
        } else if let Some(negated) = pattern.strip_prefix('!') {
            if wildcard_matches(negated, host) {
                return false;
            }
        } else {
            matched |= wildcard_matches(pattern, host);
        }
    }
    matched
}

/// `salt|hash` in base64, where hash is HMAC-SHA1 of the host name keyed with the salt.
fn hashed_host_matches(hashed: &str, host: &str) -> bool {
    let Some((salt, hash)) = hashed.split_once('|') else {
        return false;
    };
    let (Ok(salt), Ok(hash)) = (BASE64.decode(salt), BASE64.decode(hash)) else {
        return false;
    };
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
    hmac::verify(&key, host.as_bytes(), &hash).is_ok()
}

/// Glob match with `*` and `?`, ignoring ASCII case as ssh does for host names.
fn wildcard_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.to_ascii_lowercase().into_bytes();
    let host = host.to_ascii_lowercase().into_bytes();
    let (mut p, mut h) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while h < host.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == host[h]) {
            p += 1;
            h += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            backtrack = Some((p, h));
            p += 1;
        } else if let Some((star, from)) = backtrack {
            p = star + 1;
            h = from + 1;
            backtrack = Some((star, from + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"\0\0\0\x0bssh-ed25519\0\0\0\x20server-key-bytes-0123456789abcde";
    const OTHER_KEY: &[u8] = b"\0\0\0\x0bssh-ed25519\0\0\0\x20another-key-bytes-0123456789abcd";

    fn hashed(host: &str, salt: &[u8]) -> String {
        let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, salt);
        let hash = hmac::sign(&key, host.as_bytes());
        format!(
            "|1|{}|{}",
            BASE64.encode(salt),
            BASE64.encode(hash.as_ref())
        )
    }

    fn known_hosts(text: &str) -> KnownHosts {
        KnownHosts::parse(Path::new("/etc/capstan/known_hosts"), text)
    }

    #[test]
    fn host_keys_are_checked_against_known_hosts() {
        let key = BASE64.encode(KEY);
        let text = format!(
            "# comment\n\
             github.com,140.82.121.4 ssh-ed25519 {key} github\n\
             {hashed} ssh-ed25519 {key}\n\
             [git.example.com]:2222 ssh-ed25519 {key}\n\
             *.corp.example,!bad.corp.example ssh-ed25519 {key}\n\
             @cert-authority * ssh-ed25519 {key}\n\
             not a valid line\n",
            hashed = hashed("secret.example", b"0123456789abcdef0123"),
        );
        let hosts = known_hosts(&text);
        let cases: &[(&str, &str, &[u8], bool)] = &[
            ("github.com", "ssh-ed25519", KEY, true),
            ("GitHub.com", "ssh-ed25519", KEY, true),
            ("140.82.121.4", "ssh-ed25519", KEY, true),
            ("github.com", "ssh-ed25519", OTHER_KEY, false),
            ("github.com", "ssh-rsa", KEY, false),
            ("secret.example", "ssh-ed25519", KEY, true),
            ("[git.example.com]:2222", "ssh-ed25519", KEY, true),
            ("git.example.com", "ssh-ed25519", KEY, false),
            ("git.corp.example", "ssh-ed25519", KEY, true),
            ("bad.corp.example", "ssh-ed25519", KEY, false),
            ("gitlab.com", "ssh-ed25519", KEY, false),
        ];
        for (host, key_type, key, trusted) in cases {
            assert_eq!(
                hosts.check(host, key_type, key).is_ok(),
                *trusted,
                "{host} {key_type}"
            );
        }
    }

    #[test]
    fn host_key_errors_say_what_to_do() {
        let key = BASE64.encode(KEY);
        let hosts = known_hosts(&format!(
            "github.com ssh-ed25519 {key}\n@revoked * ssh-ed25519 {}\n",
            BASE64.encode(OTHER_KEY)
        ));
        let unknown = hosts.check("gitlab.com", "ssh-ed25519", KEY).unwrap_err();
        assert!(
            unknown.contains("gitlab.com is not in /etc/capstan/known_hosts"),
            "{unknown}"
        );
        let changed = hosts.check("github.com", "ssh-rsa", KEY).unwrap_err();
        assert!(changed.contains("does not match"), "{changed}");
        let revoked = hosts
            .check("github.com", "ssh-ed25519", OTHER_KEY)
            .unwrap_err();
        assert!(revoked.contains("revoked"), "{revoked}");
    }

    #[test]
    fn the_known_hosts_name_comes_from_the_url() {
        let cases: &[(&str, Option<&str>)] = &[
            ("git@github.com:acme/fleet.git", Some("github.com")),
            ("ssh://git@github.com/acme/fleet.git", Some("github.com")),
            ("ssh://git@github.com:22/acme/fleet.git", Some("github.com")),
            (
                "ssh://git@git.example.com:2222/fleet.git",
                Some("[git.example.com]:2222"),
            ),
            ("ssh://[::1]:2222/fleet.git", Some("[::1]:2222")),
            (
                "git+ssh://git@github.com/acme/fleet.git",
                Some("github.com"),
            ),
            ("https://github.com/acme/fleet.git", None),
            ("file:///srv/fleet.git", None),
        ];
        for (url, expected) in cases {
            assert_eq!(known_hosts_name(url).as_deref(), *expected, "{url}");
        }
    }

    #[test]
    fn wildcards_match_like_ssh() {
        let cases = [
            ("*", "anything", true),
            ("git*.com", "github.com", true),
            ("git?ub.com", "github.com", true),
            ("git?ub.com", "gitlab.com", false),
            ("*.example.com", "example.com", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
        ];
        for (pattern, host, expected) in cases {
            assert_eq!(
                wildcard_matches(pattern, host),
                expected,
                "{pattern} {host}"
            );
        }
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let auth = Auth::Token {
            token: "ghp_secret".into(),
        };
        assert!(!format!("{auth:?}").contains("ghp_secret"));
    }
}
