//! A Prometheus rollout gate's read side: the query with the node's name in it
//! ([`expand`]), what Prometheus answered ([`query`]), and that answer in words for records
//! and Events ([`describe`]). Whether it passes is not decided here: the gate's convention
//! is Prometheus's alerting one, the expression returns what is wrong, so the upgrade layer
//! lets a node through when the answer has no series, and never on a [`QueryError`].
//!
//! The query is an instant query over Prometheus's HTTP API,
//! `GET <url>/api/v1/query?query=...&timeout=...`
//! (<https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries>); any
//! server of that API answers it (Thanos, Mimir, VictoriaMetrics). A user and password in
//! the URL are sent as basic authentication and never shown: every message names the URL
//! through [`redact_url`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::sync::source::redact_url;

/// How long one query may take, connecting included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// How long Prometheus is asked to spend evaluating it (its `timeout` parameter): less than
/// [`TIMEOUT`], so that a slow query is answered with Prometheus's own "query timed out"
/// rather than cut off without a word.
const EVALUATION_TIMEOUT: &str = "9s";

/// The largest answer read: a query that returns more is an error, not a pass.
const MAX_BODY: usize = 16 << 20;

/// How much of an answer that is not Prometheus's JSON an error quotes.
const EXCERPT: usize = 200;

/// What an instant query returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueryResult {
    /// Its series, in Prometheus's order. A `scalar` answer is one series without labels,
    /// or none when it is zero (see [`query`]).
    pub series: Vec<Series>,
    /// Prometheus's warnings (its `warnings`), which may mean the answer is incomplete: a
    /// Thanos or federated Prometheus that could not reach one of its stores answers with
    /// the series of the others and a warning. Its `infos` (hints about the query's form,
    /// such as a counter's name) are not kept.
    pub warnings: Vec<String>,
}

/// One series of a [`QueryResult`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// Its labels, the metric's name as `__name__` when it has one.
    pub labels: BTreeMap<String, String>,
    /// Its value as Prometheus wrote it (`"1"`, `"0.25"`, `"NaN"`); of a range vector, the
    /// latest sample's; of a native histogram, `histogram(count=..., sum=...)`.
    pub value: String,
}

/// Why a query has no answer. None of them is a pass.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The URL is not one to send a query to.
    #[error("Prometheus URL {url:?} is not an http:// or https:// URL")]
    BadUrl { url: String },
    /// The HTTP client could not be built.
    #[error("building the HTTP client for Prometheus: {message}")]
    Client { message: String },
    /// No answer within [`TIMEOUT`].
    #[error("Prometheus at {url} did not answer within {}s", TIMEOUT.as_secs())]
    Timeout { url: String },
    /// Not connected, or the connection failed (DNS, refused, TLS, reset).
    #[error("Prometheus at {url} is unreachable: {message}")]
    Unreachable { url: String, message: String },
    /// Prometheus refused the query (`"status": "error"`: a syntax error is `bad_data`
    /// with HTTP 400, an evaluation that failed `execution` with 422, one that took too
    /// long `timeout` with 503), or something in front of it answered with an HTTP error.
    #[error("Prometheus at {url} answered HTTP {status}: {}{error}", error_type.as_deref().map(|t| format!("{t}: ")).unwrap_or_default())]
    Status {
        url: String,
        /// The HTTP status.
        status: u16,
        /// Prometheus's `errorType`, when it answered with its error JSON.
        error_type: Option<String>,
        /// Prometheus's `error`, or the beginning of the answer when it is not its JSON.
        error: String,
    },
    /// The answer is not the API's JSON.
    #[error("Prometheus at {url} answered what is not its API's JSON: {message}")]
    BadJson { url: String, message: String },
    /// The answer is a kind a gate cannot read (`string`).
    #[error(
        "Prometheus at {url} answered a {result_type} result; a gate's query must return an instant vector (or a range vector or a scalar)"
    )]
    UnexpectedResult { url: String, result_type: String },
    /// The answer is larger than is read.
    #[error("Prometheus at {url} answered more than {} MiB", MAX_BODY >> 20)]
    TooLarge { url: String },
}

/// The HTTP client queries go through, built as capstan builds its others (its user agent,
/// rustls with the process's crypto provider, which it installs if no one has yet). One
/// client serves every query: it keeps connections to each Prometheus open.
pub fn client() -> Result<reqwest::Client, QueryError> {
    capstan_api::install_crypto_provider();
    reqwest::Client::builder()
        .user_agent(concat!("capstan/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| QueryError::Client {
            message: error_chain(&e),
        })
}

/// `query` with every `$node` replaced by `node`.
///
/// `$node` belongs in a PromQL string (`node="$node"`, `instance=~"$node:.*"`, double or
/// single quotes). A Kubernetes node name is a DNS subdomain (lowercase letters, digits,
/// `-` and `.`), which stands in a string as it is. Anything else (the API server accepts
/// no such name; this is defence against one that slipped through) is written as escapes,
/// `\xNN` for each of its UTF-8 bytes: in a quoted string they read back as the very same
/// name, so the query still asks about that node, and nowhere can they close the string or
/// add to the query (outside a string they are a syntax error, which fails the gate). A
/// `.` stays a `.`: in a regular-expression matcher it matches any character, as any
/// `.` written there does.
pub fn expand(query: &str, node: &str) -> String {
    let mut quoted = String::with_capacity(node.len());
    for byte in node.bytes() {
        if byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-' || byte == b'.' {
            quoted.push(char::from(byte));
        } else {
            let _ = write!(quoted, "\\x{byte:02x}");
        }
    }
    query.replace("$node", &quoted)
}

/// Asks the Prometheus at `base_url` (`http://prometheus.monitoring:9090`, a path prefix
/// kept) for the instant `query` at this moment, within [`TIMEOUT`].
///
/// A `vector` or `matrix` answer is its series. A `scalar` answer is one series without
/// labels unless its value is zero, when it is none: a scalar is always there, so an
/// expression in it can only say what is wrong by being other than zero
/// (`scalar(count(ALERTS{node="$node"}))`); `NaN` or anything unreadable counts as a
/// series, never as the absence of one. A `string` answer is an error.
pub async fn query(
    http: &reqwest::Client,
    base_url: &str,
    query: &str,
) -> Result<QueryResult, QueryError> {
    query_within(http, base_url, query, TIMEOUT).await
}

async fn query_within(
    http: &reqwest::Client,
    base_url: &str,
    query: &str,
    timeout: Duration,
) -> Result<QueryResult, QueryError> {
    let shown = redact_url(base_url);
    let scheme = base_url.split_once("://").map(|(scheme, _)| scheme);
    if !matches!(scheme, Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"))
    {
        return Err(QueryError::BadUrl { url: shown });
    }
    let params = form_urlencoded::Serializer::new(String::new())
        .append_pair("query", query)
        .append_pair("timeout", EVALUATION_TIMEOUT)
        .finish();
    let url = format!("{}/api/v1/query?{params}", base_url.trim_end_matches('/'));
    let failed = |e: reqwest::Error| {
        // reqwest would name the URL, query and all; `shown` names it.
        let e = e.without_url();
        if e.is_timeout() {
            QueryError::Timeout { url: shown.clone() }
        } else {
            QueryError::Unreachable {
                url: shown.clone(),
                message: error_chain(&e),
            }
        }
    };
    let mut response = http
        .get(&url)
        .header("Accept", "application/json")
        .timeout(timeout)
        .send()
        .await
        .map_err(failed)?;
    let status = response.status();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(QueryError::TooLarge { url: shown });
        }
        body.extend_from_slice(&chunk);
    }
    read_answer(&shown, status.as_u16(), &body)
}

/// The API's envelope: `{"status": "success", "data": ...}` or
/// `{"status": "error", "errorType": ..., "error": ...}`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    result_type: String,
    result: Value,
}

/// A series of a `vector` (`value` or `histogram`) or a `matrix` (`values`, `histograms`).
#[derive(Deserialize)]
struct RawSeries {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    #[serde(default)]
    value: Option<(Value, String)>,
    #[serde(default)]
    histogram: Option<(Value, Histogram)>,
    #[serde(default)]
    values: Vec<(Value, String)>,
    #[serde(default)]
    histograms: Vec<(Value, Histogram)>,
}

/// The part of a native histogram sample shown.
#[derive(Deserialize)]
struct Histogram {
    #[serde(default)]
    count: String,
    #[serde(default)]
    sum: String,
}

impl Histogram {
    fn shown(&self) -> String {
        format!("histogram(count={}, sum={})", self.count, self.sum)
    }
}

impl RawSeries {
    fn into_series(self) -> Series {
        let time = |t: &Value| t.as_f64().unwrap_or(f64::NEG_INFINITY);
        let value = match (self.value, self.histogram) {
            (Some((_, value)), _) => value,
            (None, Some((_, histogram))) => histogram.shown(),
            (None, None) => {
                // A range vector's latest sample, float or histogram.
                let float = self.values.last();
                let histogram = self.histograms.last();
                match (float, histogram) {
                    (Some((tf, _)), Some((th, h))) if time(th) > time(tf) => h.shown(),
                    (Some((_, value)), _) => value.clone(),
                    (None, Some((_, h))) => h.shown(),
                    (None, None) => String::new(),
                }
            }
        };
        Series {
            labels: self.metric,
            value,
        }
    }
}

/// Reads an answer of HTTP `status` from the Prometheus shown as `url`.
fn read_answer(url: &str, status: u16, body: &[u8]) -> Result<QueryResult, QueryError> {
    let answer: Answer = match serde_json::from_slice(body) {
        Ok(answer) => answer,
        Err(e) if (200..300).contains(&status) => {
            return Err(QueryError::BadJson {
                url: url.to_string(),
                message: format!("{e}: {}", excerpt(body)),
            });
        }
        Err(_) => {
            return Err(QueryError::Status {
                url: url.to_string(),
                status,
                error_type: None,
                error: excerpt(body),
            });
        }
    };
    if answer.status != "success" || !(200..300).contains(&status) {
        return Err(QueryError::Status {
            url: url.to_string(),
            status,
            error_type: answer.error_type,
            error: answer
                .error
                .unwrap_or_else(|| format!("status {:?}", answer.status)),
        });
    }
    let bad_json = |message: String| QueryError::BadJson {
        url: url.to_string(),
        message,
    };
    let data = answer
        .data
        .ok_or_else(|| bad_json("a successful answer without data".to_string()))?;
    let series = match data.result_type.as_str() {
        "vector" | "matrix" => serde_json::from_value::<Vec<RawSeries>>(data.result)
            .map_err(|e| bad_json(format!("its {} result: {e}", data.result_type)))?
            .into_iter()
            .map(RawSeries::into_series)
            .collect(),
        "scalar" => {
            let (_, value) = serde_json::from_value::<(Value, String)>(data.result)
                .map_err(|e| bad_json(format!("its scalar result: {e}")))?;
            if value.trim().parse::<f64>().is_ok_and(|v| v == 0.0) {
                Vec::new()
            } else {
                vec![Series {
                    labels: BTreeMap::new(),
                    value,
                }]
            }
        }
        other => {
            return Err(QueryError::UnexpectedResult {
                url: url.to_string(),
                result_type: other.to_string(),
            });
        }
    };
    Ok(QueryResult {
        series,
        warnings: answer.warnings,
    })
}

/// The beginning of an answer, for an error.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut shown: String = text.chars().take(EXCERPT).collect();
    if shown.len() < text.len() {
        shown.push_str("...");
    }
    shown
}

/// A reqwest error and its causes (`error sending request: client error (Connect):
/// tcp connect error: Connection refused`).
fn error_chain(e: &reqwest::Error) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !message.contains(&cause_text) {
            message.push_str(": ");
            message.push_str(&cause_text);
        }
        source = cause.source();
    }
    message
}

/// `result` in a line for records and Events: `no series`, or
/// `2 series: ALERTS{alertname="GPUDown",node="node-2"} 1, {node="node-3"} 0.5`, at most
/// `max` of them shown (`, and 3 more`); Prometheus's warnings follow
/// (`; Prometheus warned: ...`).
pub fn describe(result: &QueryResult, max: usize) -> String {
    let mut line = if result.series.is_empty() {
        "no series".to_string()
    } else {
        let count = result.series.len();
        let mut line = format!("{count} series");
        for (i, series) in result.series.iter().take(max).enumerate() {
            line.push_str(if i == 0 { ": " } else { ", " });
            write_series(&mut line, series);
        }
        if count > max && max > 0 {
            let _ = write!(line, ", and {} more", count - max);
        }
        line
    };
    if !result.warnings.is_empty() {
        let _ = write!(line, "; Prometheus warned: {}", result.warnings.join("; "));
    }
    line
}

/// `name{label="value",...} value`, as Prometheus shows a sample.
fn write_series(line: &mut String, series: &Series) {
    if let Some(name) = series.labels.get("__name__") {
        line.push_str(name);
    }
    line.push('{');
    let mut first = true;
    for (label, value) in &series.labels {
        if label == "__name__" {
            continue;
        }
        if !first {
            line.push(',');
        }
        first = false;
        let _ = write!(line, "{label}=\"");
        for c in value.chars() {
            match c {
                '\\' => line.push_str("\\\\"),
                '"' => line.push_str("\\\""),
                '\n' => line.push_str("\\n"),
                c => line.push(c),
            }
        }
        line.push('"');
    }
    line.push_str("} ");
    line.push_str(&series.value);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A loopback HTTP server answering every request with `status` and `body`; keeps each
    /// request's head.
    struct Canned {
        base: String,
        requests: Arc<Mutex<Vec<String>>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for Canned {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    impl Canned {
        /// The first request's target decoded: its path and query parameters.
        fn asked(&self) -> (String, Vec<(String, String)>) {
            let requests = self.requests.lock().unwrap();
            let head = requests.first().expect("a request");
            let target = head.split(' ').nth(1).expect("a request line");
            let (path, params) = target.split_once('?').unwrap_or((target, ""));
            let params = form_urlencoded::parse(params.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            (path.to_string(), params)
        }
    }

    /// `answer` is None: read the request and never answer.
    async fn serve(answer: Option<(u16, &str)>) -> Canned {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let kept = requests.clone();
        let answer = answer.map(|(status, body)| {
            format!(
                "HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let kept = kept.clone();
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    kept.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    match answer {
                        Some(answer) => {
                            let _ = stream.write_all(answer.as_bytes()).await;
                            let _ = stream.shutdown().await;
                        }
                        None => std::future::pending::<()>().await,
                    }
                });
            }
        });
        Canned {
            base,
            requests,
            task,
        }
    }

    fn series(labels: &[(&str, &str)], value: &str) -> Series {
        Series {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value: value.to_string(),
        }
    }

    #[test]
    fn expand_replaces_every_node() {
        assert_eq!(
            expand(
                r#"ALERTS{alertstate="firing",node="$node"} or up{instance=~"$node:.*"} == 0"#,
                "node-2.example.com"
            ),
            r#"ALERTS{alertstate="firing",node="node-2.example.com"} or up{instance=~"node-2.example.com:.*"} == 0"#
        );
        assert_eq!(expand("up", "node-2"), "up");
    }

    #[test]
    fn expand_escapes_what_is_no_dns_subdomain() {
        // A quote cannot close the string: every byte outside the DNS subdomain alphabet
        // is an escape, which PromQL reads back as the same byte inside quotes.
        let expanded = expand(r#"up{node="$node"}"#, r#"x"} or vector(1) or {a="Ü"#);
        assert_eq!(
            expanded,
            r#"up{node="x\x22\x7d\x20or\x20vector\x281\x29\x20or\x20\x7ba\x3d\x22\xc3\x9c"}"#
        );
        assert!(!expanded[9..expanded.len() - 2].contains(['"', '\'', '`', '}', ' ']));
        assert_eq!(expand("$node", "Node_1"), r"\x4eode\x5f1");
    }

    #[tokio::test]
    async fn vector_answer_is_its_series() {
        let server = serve(Some((
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[
                {"metric":{"__name__":"ALERTS","alertname":"GPUDown","node":"node-2"},"value":[1700000000.5,"1"]},
                {"metric":{"node":"node-3"},"value":[1700000000.5,"0.25"]}]}}"#,
        )))
        .await;
        let q = r#"ALERTS{alertstate="firing",node="node-2"} > 0.5 & up"#;
        let result = query(&client().unwrap(), &format!("{}/", server.base), q)
            .await
            .unwrap();
        assert_eq!(
            result,
            QueryResult {
                series: vec![
                    series(
                        &[
                            ("__name__", "ALERTS"),
                            ("alertname", "GPUDown"),
                            ("node", "node-2")
                        ],
                        "1"
                    ),
                    series(&[("node", "node-3")], "0.25"),
                ],
                warnings: vec![],
            }
        );
        // The query arrives whole, however it is spelled; the trailing slash is not doubled.
        let (path, params) = server.asked();
        assert_eq!(path, "/api/v1/query");
        assert_eq!(
            params,
            vec![
                ("query".to_string(), q.to_string()),
                ("timeout".to_string(), EVALUATION_TIMEOUT.to_string())
            ]
        );
    }

    #[tokio::test]
    async fn credentials_in_the_url_are_basic_auth() {
        let server = serve(Some((
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        )))
        .await;
        let base = server.base.replace("http://", "http://admin:hunter2@");
        query(&client().unwrap(), &base, "up").await.unwrap();
        let head = server.requests.lock().unwrap()[0].to_ascii_lowercase();
        // base64("admin:hunter2")
        assert!(
            head.contains("\r\nauthorization: basic ywrtaw46ahvudgvymg==\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn empty_vector_is_no_series() {
        let server = serve(Some((
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#,
        )))
        .await;
        let result = query(&client().unwrap(), &server.base, "up == 0")
            .await
            .unwrap();
        assert_eq!(result, QueryResult::default());
        assert_eq!(describe(&result, 3), "no series");
    }

    #[tokio::test]
    async fn scalar_is_one_series_unless_zero() {
        for (value, expected) in [
            ("0", vec![]),
            ("-0", vec![]),
            ("2", vec![series(&[], "2")]),
            ("NaN", vec![series(&[], "NaN")]),
        ] {
            let server = serve(Some((
                200,
                &format!(
                    r#"{{"status":"success","data":{{"resultType":"scalar","result":[1700000000,"{value}"]}}}}"#
                ),
            )))
            .await;
            let result = query(&client().unwrap(), &server.base, "scalar(up)")
                .await
                .unwrap();
            assert_eq!(result.series, expected, "scalar {value}");
        }
    }

    #[tokio::test]
    async fn matrix_series_are_their_latest_samples() {
        let server = serve(Some((
            200,
            r#"{"status":"success","warnings":["partial response"],"data":{"resultType":"matrix","result":[
                {"metric":{"node":"node-2"},"values":[[1,"3"],[2,"4"]]},
                {"metric":{"node":"node-3"},"histograms":[[2,{"count":"5","sum":"1.5","buckets":[]}]]}]}}"#,
        )))
        .await;
        let result = query(&client().unwrap(), &server.base, "errors[1m]")
            .await
            .unwrap();
        assert_eq!(
            result.series,
            vec![
                series(&[("node", "node-2")], "4"),
                series(&[("node", "node-3")], "histogram(count=5, sum=1.5)")
            ]
        );
        assert_eq!(result.warnings, vec!["partial response".to_string()]);
    }

    #[tokio::test]
    async fn string_result_is_an_error() {
        let server = serve(Some((
            200,
            r#"{"status":"success","data":{"resultType":"string","result":[1,"x"]}}"#,
        )))
        .await;
        let err = query(&client().unwrap(), &server.base, r#""x""#)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, QueryError::UnexpectedResult { result_type, .. } if result_type == "string"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn prometheus_error_is_an_error() {
        let server = serve(Some((
            400,
            r#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:8: parse error: unexpected \"}\""}"#,
        )))
        .await;
        let err = query(&client().unwrap(), &server.base, "up{node=}")
            .await
            .unwrap_err();
        match &err {
            QueryError::Status {
                status,
                error_type,
                error,
                ..
            } => {
                assert_eq!(*status, 400);
                assert_eq!(error_type.as_deref(), Some("bad_data"));
                assert!(error.contains("parse error"), "{error}");
            }
            other => panic!("not a status error: {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!(
                r#"Prometheus at {} answered HTTP 400: bad_data: invalid parameter "query": 1:8: parse error: unexpected "}}""#,
                server.base
            )
        );
    }

    #[tokio::test]
    async fn error_status_in_a_success_is_an_error() {
        let server = serve(Some((
            200,
            r#"{"status":"error","errorType":"execution","error":"expanding series: boom"}"#,
        )))
        .await;
        let err = query(&client().unwrap(), &server.base, "up")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, QueryError::Status { status: 200, error_type: Some(t), .. } if t == "execution"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn http_error_without_json_is_an_error() {
        let server = serve(Some((502, "<html>Bad Gateway</html>"))).await;
        let err = query(&client().unwrap(), &server.base, "up")
            .await
            .unwrap_err();
        assert!(
            matches!(&err, QueryError::Status { status: 502, error_type: None, error, .. } if error == "<html>Bad Gateway</html>"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn bad_json_is_an_error() {
        for body in [
            "not json",
            r#"{"status":"success"}"#,
            r#"{"status":"success","data":{"resultType":"vector","result":{"x":1}}}"#,
        ] {
            let server = serve(Some((200, body))).await;
            let err = query(&client().unwrap(), &server.base, "up")
                .await
                .unwrap_err();
            assert!(matches!(&err, QueryError::BadJson { .. }), "{body}: {err}");
        }
    }

    #[tokio::test]
    async fn unreachable_is_an_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = query(
            &client().unwrap(),
            &format!("http://admin:hunter2@{addr}"),
            "up",
        )
        .await
        .unwrap_err();
        assert!(matches!(&err, QueryError::Unreachable { .. }), "{err}");
        let message = err.to_string();
        assert!(!message.contains("hunter2"), "{message}");
        assert!(message.contains(&addr.to_string()), "{message}");
    }

    #[tokio::test]
    async fn no_answer_in_time_is_an_error() {
        let server = serve(None).await;
        let err = query_within(
            &client().unwrap(),
            &server.base,
            "up",
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(matches!(&err, QueryError::Timeout { .. }), "{err}");
    }

    #[tokio::test]
    async fn bad_url_is_an_error() {
        for url in ["prometheus:9090", "ftp://prometheus", ""] {
            let err = query(&client().unwrap(), url, "up").await.unwrap_err();
            assert!(matches!(&err, QueryError::BadUrl { .. }), "{url}: {err}");
        }
    }

    #[test]
    fn describe_shows_at_most_max_series() {
        let result = QueryResult {
            series: vec![
                series(
                    &[
                        ("__name__", "ALERTS"),
                        ("alertname", "GPUDown"),
                        ("node", "node-2"),
                    ],
                    "1",
                ),
                series(&[("node", "node-3"), ("why", "a \"quoted\"\nline")], "0.5"),
                series(&[], "7"),
            ],
            warnings: vec![],
        };
        assert_eq!(
            describe(&result, 5),
            r#"3 series: ALERTS{alertname="GPUDown",node="node-2"} 1, {node="node-3",why="a \"quoted\"\nline"} 0.5, {} 7"#
        );
        assert_eq!(
            describe(&result, 1),
            r#"3 series: ALERTS{alertname="GPUDown",node="node-2"} 1, and 2 more"#
        );
        assert_eq!(describe(&result, 0), "3 series");
        let warned = QueryResult {
            series: vec![],
            warnings: vec!["store down".to_string()],
        };
        assert_eq!(
            describe(&warned, 3),
            "no series; Prometheus warned: store down"
        );
    }
}
