//! GitHub webhook signatures: a push notification is trusted only if signed with the shared secret.

use ring::hmac;

/// Why a webhook request was refused (the HTTP layer answers 401 to each).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WebhookError {
    /// The request carried no `X-Hub-Signature-256` header.
    #[error("missing X-Hub-Signature-256 header; set a secret on the GitHub webhook")]
    MissingSignature,
    /// The header is not `sha256=` followed by 64 hexadecimal digits.
    #[error("malformed X-Hub-Signature-256 header: {0}")]
    MalformedSignature(&'static str),
    /// The signature does not match the body under the configured secret.
    #[error(
        "X-Hub-Signature-256 does not match the body; check that the webhook secret matches capstan's"
    )]
    SignatureMismatch,
}

/// Checks GitHub's `X-Hub-Signature-256: sha256=<hex>` header against the raw request body.
///
/// The expected value is HMAC-SHA256 of `body` under `secret`, compared in constant time.
/// Fails when the header is missing, is not `sha256=` with 64 hex digits, or does not match.
pub fn verify_github_signature(
    secret: &[u8],
    body: &[u8],
    header: Option<&str>,
) -> Result<(), WebhookError> {
    let header = header.ok_or(WebhookError::MissingSignature)?;
    let hex = header
        .trim()
        .strip_prefix("sha256=")
        .ok_or(WebhookError::MalformedSignature("expected sha256=<hex>"))?;
    let signature = decode_hex(hex).ok_or(WebhookError::MalformedSignature(
        "expected 64 hexadecimal digits after sha256=",
    ))?;
    if signature.len() != 32 {
        return Err(WebhookError::MalformedSignature(
            "expected 64 hexadecimal digits after sha256=",
        ));
    }
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, body, &signature).map_err(|_| WebhookError::SignatureMismatch)
}

/// Decodes an even-length string of hexadecimal digits (either case).
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some((digit(pair[0])? << 4) | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"It's a Secret to Everybody";
    const BODY: &[u8] = b"Hello, World!";
    // The example from GitHub's "Validating webhook deliveries" documentation.
    const SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn a_correctly_signed_body_is_accepted() {
        assert_eq!(
            verify_github_signature(SECRET, BODY, Some(SIGNATURE)),
            Ok(())
        );
        let upper = format!("sha256={}", SIGNATURE["sha256=".len()..].to_uppercase());
        assert_eq!(verify_github_signature(SECRET, BODY, Some(&upper)), Ok(()));
    }

    #[test]
    fn a_wrong_signature_is_refused() {
        assert_eq!(
            verify_github_signature(b"another secret", BODY, Some(SIGNATURE)),
            Err(WebhookError::SignatureMismatch)
        );
        assert_eq!(
            verify_github_signature(SECRET, b"Hello, World?", Some(SIGNATURE)),
            Err(WebhookError::SignatureMismatch)
        );
    }

    #[test]
    fn a_missing_signature_is_refused() {
        assert_eq!(
            verify_github_signature(SECRET, BODY, None),
            Err(WebhookError::MissingSignature)
        );
    }

    #[test]
    fn a_malformed_signature_is_refused() {
        let hex = &SIGNATURE["sha256=".len()..];
        let malformed = [
            String::new(),
            hex.to_string(),
            format!("sha1={hex}"),
            format!("sha256={}", &hex[..63]),
            format!("sha256={}", &hex[..62]),
            format!("sha256={hex}00"),
            format!("sha256={}zz", &hex[..62]),
            "sha256=".to_string(),
        ];
        for header in &malformed {
            assert!(
                matches!(
                    verify_github_signature(SECRET, BODY, Some(header)),
                    Err(WebhookError::MalformedSignature(_))
                ),
                "header {header:?}"
            );
        }
    }
}
