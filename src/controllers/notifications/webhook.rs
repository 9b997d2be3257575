//! Webhooks: the same reports as GitHub gets, as capstan's JSON (signed with HMAC-SHA256
//! when the admin gave a key) or as a Slack-compatible `{"text": ...}`.
//!
//! A webhook has no list to ask what it got, so a restart may deliver a report again that
//! was delivered just before capstan stopped: each carries `X-Capstan-Delivery`, the same
//! for the same report, for the receiver to drop a repeat.

use ring::hmac;
use serde_json::{Value, json};

use super::{Report, State};
use capstan_api::WebhookFormat;
use capstan_api::canonical::sha256_hex;

/// What is posted to one webhook.
pub struct Delivery {
    /// The body.
    pub body: String,
    /// The headers beside `Content-Type: application/json`.
    pub headers: Vec<(&'static str, String)>,
}

/// The delivery id of `report` in `sync`: the same report gets the same one.
pub fn delivery_id(sync: &str, report: &Report) -> String {
    sha256_hex(
        format!(
            "{sync}\n{}\n{}\n{}",
            report.commit.sha,
            report.state.as_str(),
            report.description
        )
        .as_bytes(),
        16,
    )
}

/// The delivery of `report` (of `sync`, under `context`) to a webhook of `format`, signed
/// with `key` when one is given (JSON only).
pub fn delivery(
    format: WebhookFormat,
    sync: &str,
    context: &str,
    report: &Report,
    key: Option<&[u8]>,
) -> Delivery {
    let id = delivery_id(sync, report);
    let body = match format {
        WebhookFormat::Json => json_body(&id, sync, context, report),
        WebhookFormat::Slack => json!({ "text": slack_text(context, report) }),
    }
    .to_string();
    let mut headers = vec![
        ("X-Capstan-Event", "rollout".to_string()),
        ("X-Capstan-Delivery", id),
    ];
    if let (WebhookFormat::Json, Some(key)) = (format, key) {
        headers.push(("X-Capstan-Signature-256", signature(key, body.as_bytes())));
    }
    Delivery { body, headers }
}

/// `sha256=<hex HMAC-SHA256 of body>`, as GitHub signs its own webhooks.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), body);
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

fn json_body(id: &str, sync: &str, context: &str, report: &Report) -> Value {
    json!({
        "id": id,
        "sync": sync,
        "context": context,
        "commit": {
            "sha": report.commit.sha,
            "shortSha": report.commit.short_sha,
            "subject": report.commit.subject,
            "pullRequest": report.commit.pull_request,
        },
        "state": report.state,
        "description": report.description,
        "total": report.total,
        "done": report.done,
        "nodes": report.nodes,
        "failure": report.failure,
    })
}

/// Slack's mrkdwn: `&`, `<` and `>` are its only markup to escape, which also keeps a
/// reason from mentioning `<!channel>` or linking anywhere.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn slack_text(context: &str, report: &Report) -> String {
    let icon = match report.state {
        State::Pending => ":hourglass_flowing_sand:",
        State::Success => ":white_check_mark:",
        State::Failure => ":x:",
    };
    let pull_request = report
        .commit
        .pull_request
        .map(|n| format!(" (#{n})"))
        .unwrap_or_default();
    format!(
        "{icon} {} `{}`{pull_request}: {}",
        slack_escape(context),
        slack_escape(&report.commit.short_sha),
        slack_escape(&report.description)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_api::CommitRef;

    fn report(description: &str) -> Report {
        Report {
            commit: CommitRef {
                sha: "a".repeat(40),
                short_sha: "aaaaaaa".into(),
                pull_request: Some(7),
                ..CommitRef::default()
            },
            state: State::Failure,
            description: description.into(),
            total: 1,
            done: 0,
            moved_on: 0,
            nodes: Vec::new(),
            failure: None,
        }
    }

    #[test]
    fn a_slack_text_cannot_mention_or_link() {
        let delivery = delivery(
            WebhookFormat::Slack,
            "fleet",
            "capstan/fleet",
            &report("w1: gate smoke failed: <!channel> <https://evil|click> & more"),
            Some(b"key"),
        );
        let body: Value = serde_json::from_str(&delivery.body).expect("json");
        assert_eq!(
            body["text"],
            ":x: capstan/fleet `aaaaaaa` (#7): w1: gate smoke failed: &lt;!channel&gt; \
             &lt;https://evil|click&gt; &amp; more"
        );
        // Slack bodies are not signed: the URL is the credential.
        assert!(
            delivery
                .headers
                .iter()
                .all(|(h, _)| *h != "X-Capstan-Signature-256")
        );
    }

    #[test]
    fn a_json_body_is_signed_and_its_id_names_the_report() {
        let a = delivery(
            WebhookFormat::Json,
            "fleet",
            "c",
            &report("x"),
            Some(b"key"),
        );
        let again = delivery(
            WebhookFormat::Json,
            "fleet",
            "c",
            &report("x"),
            Some(b"key"),
        );
        let other = delivery(
            WebhookFormat::Json,
            "fleet",
            "c",
            &report("y"),
            Some(b"key"),
        );
        let header = |d: &Delivery, name: &str| {
            d.headers
                .iter()
                .find(|(h, _)| *h == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            header(&a, "X-Capstan-Delivery"),
            header(&again, "X-Capstan-Delivery")
        );
        assert_ne!(
            header(&a, "X-Capstan-Delivery"),
            header(&other, "X-Capstan-Delivery")
        );
        assert_eq!(
            header(&a, "X-Capstan-Signature-256"),
            Some(signature(b"key", a.body.as_bytes()))
        );
        // The HMAC of RFC 4231's second case: the signature is HMAC-SHA256.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
