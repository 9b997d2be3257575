//! Credentials never leave a repository URL: every place a URL is shown or stored (the
//! source's location, `GitSync.spec.repo`, logs, errors, plans) goes through [`redact_url`],
//! and messages that may quote it (libgit2's errors) through [`redact_message`]. The clone
//! itself keeps the raw URL.

/// What stands in for a credential.
pub const MASK: &str = "***";

/// Query parameters whose values are credentials (a key containing one of these, any case).
const SECRET_KEYS: [&str; 7] = [
    "token",
    "password",
    "passwd",
    "secret",
    "key",
    "auth",
    "signature",
];

/// `url` without credentials: a password (`user:TOKEN@`) becomes `***`; over http(s) and
/// other non-ssh schemes a lone user part (`TOKEN@`, how GitHub tokens are often given) is
/// masked whole; ssh's user (`ssh://git@`, `git@host:path`) stays, it is no secret; values of
/// query parameters such as `access_token`, `token`, `private_token`, `password` or `sig`
/// become `***`. Anything that is not a URL is returned as is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    if !scheme
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return url.to_string();
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let ssh = scheme.to_ascii_lowercase().contains("ssh");
            match userinfo.split_once(':') {
                Some((user, _password)) => format!("{}:{MASK}@{host}", shown_user(user, ssh)),
                None if ssh && !userinfo.is_empty() => format!("{userinfo}@{host}"),
                None if userinfo.is_empty() => format!("@{host}"),
                None => format!("{MASK}@{host}"),
            }
        }
        None => authority.to_string(),
    };
    format!("{scheme}://{authority}{}", redact_query(tail))
}

/// The user part before a password: kept unless it looks like a token itself.
fn shown_user(user: &str, ssh: bool) -> String {
    if ssh || user.len() < 20 {
        user.to_string()
    } else {
        MASK.to_string()
    }
}

/// The path, query and fragment with credential parameters masked.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, value)) if is_secret_key(key) && !value.is_empty() => {
                format!("{key}={MASK}")
            }
            _ => param.to_string(),
        })
        .collect();
    let mut shown = format!("{path}?{}", params.join("&"));
    if let Some(fragment) = fragment {
        shown.push('#');
        shown.push_str(fragment);
    }
    shown
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "sig" || SECRET_KEYS.iter().any(|secret| key.contains(secret))
}

/// The credentials in `url` (password, lone http user part, secret query values), as
/// they may appear elsewhere in a message, raw or percent-decoded.
fn credentials_in(url: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Some((scheme, rest)) = url.split_once("://") else {
        return found;
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        let ssh = scheme.to_ascii_lowercase().contains("ssh");
        match userinfo.split_once(':') {
            Some((user, password)) => {
                found.push(password.to_string());
                if !ssh && user.len() >= 20 {
                    found.push(user.to_string());
                }
            }
            None if !ssh => found.push(userinfo.to_string()),
            None => {}
        }
    }
    if let Some((_, query)) = tail.split_once('?') {
        let query = query.split('#').next().unwrap_or_default();
        for param in query.split('&') {
            if let Some((key, value)) = param.split_once('=')
                && is_secret_key(key)
            {
                found.push(value.to_string());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decoded(s)).collect();
    found.extend(decoded);
    found.retain(|s| s.len() >= 3);
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found.dedup();
    found
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && bytes[i + 1].is_ascii_hexdigit()
            && bytes[i + 2].is_ascii_hexdigit()
        {
            let hex = [bytes[i + 1], bytes[i + 2]];
            let byte = std::str::from_utf8(&hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .unwrap_or(b'%');
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `message` (a libgit2 error, say) without the credentials of `url`: the URL wherever it
/// appears is redacted, any other URL in it too, and the credentials themselves wherever
/// they are quoted alone.
pub fn redact_message(message: &str, url: &str) -> String {
    let mut shown = message.replace(url, &redact_url(url));
    for credential in credentials_in(url) {
        shown = shown.replace(&credential, MASK);
    }
    redact_urls_in(&shown)
}

/// Every `scheme://…` in `text` redacted as [`redact_url`] does.
pub fn redact_urls_in(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "+-.".contains(c)))
            .map_or(0, |i| {
                i + rest[i..].chars().next().map_or(1, char::len_utf8)
            });
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || "'\"<>`()[]{},;".contains(c))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_show_in_a_url() {
        let cases = [
            (
                "https://github.com/acme/fleet",
                "https://github.com/acme/fleet",
            ),
            (
                "https://ghp_xxx@host/org/fleet.git",
                "https://***@host/org/fleet.git",
            ),
            (
                "https://x-access-token:ghp_secret@github.com/acme/fleet",
                "https://x-access-token:***@github.com/acme/fleet",
            ),
            ("https://user:pa:ss@host/x", "https://user:***@host/x"),
            ("https://a@b:pw@host/x", "https://a@b:***@host/x"),
            ("http://tok@host:8080/x.git", "http://***@host:8080/x.git"),
            (
                "https://host/x.git?access_token=abc&ref=main",
                "https://host/x.git?access_token=***&ref=main",
            ),
            (
                "https://host/x.git?token=abc#frag",
                "https://host/x.git?token=***#frag",
            ),
            (
                "https://host?private_token=abc",
                "https://host?private_token=***",
            ),
            ("https://host/x?Sig=abc&sv=1", "https://host/x?Sig=***&sv=1"),
            (
                "https://ghp_tok@host/x?access_token=abc",
                "https://***@host/x?access_token=***",
            ),
            ("ssh://git@host/x.git", "ssh://git@host/x.git"),
            ("ssh://git:pw@host/x.git", "ssh://git:***@host/x.git"),
            (
                "git@github.com:acme/fleet.git",
                "git@github.com:acme/fleet.git",
            ),
            ("file:///srv/fleet.git", "file:///srv/fleet.git"),
            ("/srv/fleet", "/srv/fleet"),
            ("", ""),
            ("https://", "https://"),
            ("https://@host/x", "https://@host/x"),
            (
                "https://ghp_0123456789abcdefghij:x-oauth-basic@host/x",
                "https://***:***@host/x",
            ),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
            assert_eq!(
                redact_url(shown),
                shown,
                "redacting twice changes nothing: {url}"
            );
        }
    }

    #[test]
    fn credentials_never_show_in_a_message() {
        let url = "https://user:s%65cret@host/x.git?token=qtok";
        let messages = [
            format!("failed to resolve address for {url}: Name or service not known"),
            "unexpected http status code: 401 for https://user:secret@host/x.git".to_string(),
            "authentication for 'secret' failed; token qtok".to_string(),
            "remote 'https://other:pw@elsewhere/y' rejected".to_string(),
        ];
        for message in messages {
            let shown = redact_message(&message, url);
            for leaked in ["s%65cret", "secret", "qtok", ":pw@"] {
                assert!(!shown.contains(leaked), "{shown}");
            }
        }
        for hostile in [
            "é://tok@h/x",
            "://",
            "a://",
            "x://@",
            "日本://tok@ホスト/x ok",
            "https://tok@h",
        ] {
            let shown = redact_urls_in(hostile);
            assert!(!shown.contains("tok@"), "{hostile}: {shown}");
        }
        let lone = redact_message(
            "failed for https://ghp_tok@host/x",
            "https://ghp_tok@host/x",
        );
        assert_eq!(lone, "failed for https://***@host/x");
    }
}
