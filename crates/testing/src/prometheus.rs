//! A real Prometheus for the tests of capstan's Prometheus rollout gates: an [`Exporter`]
//! serving metrics a test sets, and a [`Prometheus`] scraping it every second, with
//! alerting rules of the test's if it likes (their `ALERTS` series are Prometheus's own).
//!
//! The binary is the one `hack/real-cluster/build-prometheus` builds into the cache directory
//! (`$CAPSTAN_CACHE_DIR`, else `$XDG_CACHE_HOME/capstan`, else `~/.cache/capstan`); the
//! first test that needs it runs the script, which builds nothing when it is up to date. Or
//! `$CAPSTAN_PROMETHEUS` names one ([`binary`]). Each [`Prometheus`] has a directory of its own
//! (configuration, storage, log) and a free port on 127.0.0.1; it is killed when dropped,
//! and when the thread that started it dies (`PR_SET_PDEATHSIG`), so a test killed
//! mid-way leaves none behind.
//!
//! Plain std and tokio: an HTTP/1.0 request over a `TcpStream` is all a test asks of
//! Prometheus, and all Prometheus asks of an exporter.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The binary to run, when not the one `hack/real-cluster/build-prometheus` builds.
pub const BIN_ENV: &str = "CAPSTAN_PROMETHEUS";

/// What Prometheus's log says when the port it was given is no longer free.
const PORT_TAKEN: &str = "address already in use";
/// Starts on ports found taken before one is given up on.
const ATTEMPTS: usize = 5;
/// How long one request to Prometheus or an exporter may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The Prometheus binary: `$CAPSTAN_PROMETHEUS`, else the one `hack/real-cluster/build-prometheus`
/// builds (or finds up to date) in the cache.
pub fn binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os(BIN_ENV) {
        return Ok(PathBuf::from(path));
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(build)
        .clone()
        .map_err(|why| io::Error::new(io::ErrorKind::NotFound, why))
}

/// Runs `hack/real-cluster/build-prometheus`, which builds Prometheus with Go into the cache
/// or finds it up to date and builds nothing, and returns the path it prints; once per
/// process, so that a process's tests never build it twice at the same time.
fn build() -> Result<PathBuf, String> {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/real-cluster/build-prometheus");
    let output = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed (it needs Go; or set {BIN_ENV}):\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if path.is_empty() {
        return Err(format!("{} printed no path", script.display()));
    }
    Ok(PathBuf::from(path))
}

/// A loopback HTTP server answering `GET /metrics` with the text exposition a test sets
/// ([`Exporter::set`]); it stops when dropped.
pub struct Exporter {
    addr: SocketAddr,
    text: Arc<Mutex<String>>,
    scrapes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Exporter {
    /// Starts one on a free port of 127.0.0.1, serving `text`. Its connections are served
    /// by tasks of the calling runtime.
    pub async fn start(text: &str) -> io::Result<Exporter> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let text = Arc::new(Mutex::new(text.to_string()));
        let scrapes = Arc::new(AtomicU64::new(0));
        let (served, counted) = (text.clone(), scrapes.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve_metrics(stream, served.clone(), counted.clone()));
            }
        });
        Ok(Exporter {
            addr,
            text,
            scrapes,
            task,
        })
    }

    /// Where it listens: the scrape target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `text` from now on (`name{label="value"} 1` lines, Prometheus's text format).
    pub fn set(&self, text: &str) {
        *self.text.lock().unwrap_or_else(|e| e.into_inner()) = text.to_string();
    }

    /// How many times `/metrics` was served.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers the requests of one connection (Prometheus keeps its scrape connection open).
async fn serve_metrics(mut stream: TcpStream, text: Arc<Mutex<String>>, scrapes: Arc<AtomicU64>) {
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&pending[..end]).into_owned();
        pending.drain(..end + 4);
        let mut words = head.split_whitespace();
        let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        let path = target.split('?').next().unwrap_or("");
        // Prometheus keeps its connection open (HTTP/1.1); an HTTP/1.0 client reads to
        // the end of the answer.
        let lower = head.to_ascii_lowercase();
        let close = words.next() == Some("HTTP/1.0") || lower.contains("\r\nconnection: close");
        let response = if method == "GET" && path == "/metrics" {
            scrapes.fetch_add(1, Ordering::Relaxed);
            let body = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        } else {
            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_string()
        };
        if stream.write_all(response.as_bytes()).await.is_err() || close {
            return;
        }
    }
}

/// One series of an instant query's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Its labels, the metric's name as `__name__`.
    pub labels: BTreeMap<String, String>,
    /// Its value as Prometheus wrote it (`"1"`).
    pub value: String,
}

impl Sample {
    /// Label `name`'s value, if it has one.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// A Prometheus process on 127.0.0.1, scraping its targets every second and evaluating
/// its rules every second; killed when dropped.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    // Dropped after the process is killed: its storage is in it.
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// One scraping `exporter` (job `test`).
    pub async fn start(exporter: &Exporter) -> io::Result<Prometheus> {
        Prometheus::start_scraping(&[exporter.addr()], None).await
    }

    /// One scraping `exporter` (job `test`) and evaluating the rule file `rules` (YAML,
    /// `groups: [{name, rules: [{alert, expr, for, labels}]}]`).
    pub async fn start_with_rules(exporter: &Exporter, rules: &str) -> io::Result<Prometheus> {
        Prometheus::start_scraping(&[exporter.addr()], Some(rules)).await
    }

    /// One scraping `targets` (all in job `test`), with the rule file `rules` if any.
    /// Ready (`/-/ready`) when it returns; an error shows the end of its log.
    pub async fn start_scraping(
        targets: &[SocketAddr],
        rules: Option<&str>,
    ) -> io::Result<Prometheus> {
        let binary = binary()?;
        let mut attempt = 1;
        loop {
            match Prometheus::start_once(&binary, targets, rules).await {
                Err(err) if attempt < ATTEMPTS && err.to_string().contains(PORT_TAKEN) => {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(
        binary: &Path,
        targets: &[SocketAddr],
        rules: Option<&str>,
    ) -> io::Result<Prometheus> {
        let dir = tempfile::Builder::new().prefix("prometheus-").tempdir()?;
        let config = dir.path().join("prometheus.yml");
        let rule_files = match rules {
            Some(rules) => {
                let path = dir.path().join("rules.yml");
                std::fs::write(&path, rules)?;
                format!("rule_files:\n  - {:?}\n", path.display().to_string())
            }
            None => String::new(),
        };
        let targets: Vec<String> = targets
            .iter()
            .map(|t| format!("{:?}", t.to_string()))
            .collect();
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        // Prometheus scrapes itself too (job `prometheus`): a test reads from its
        // `prometheus_http_requests_total` that its clients asked.
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 {rule_files}\
                 scrape_configs:\n  - job_name: test\n    static_configs:\n      - targets: [{}]\n\
                 \x20 - job_name: prometheus\n    static_configs:\n      - targets: [\"{addr}\"]\n",
                targets.join(", ")
            ),
        )?;
        let storage = dir.path().join("data");
        let log = dir.path().join("prometheus.log");
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(binary);
        command
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", storage.display()))
            .arg(format!("--web.listen-address={addr}"))
            // Its targets are scraped from 0.1 s after the start instead of 5 s (a hidden
            // flag: how often the scrape manager takes discovery's updates).
            .arg("--scrape.discovery-reload-interval=100ms")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                // Prometheus dies with the thread that started it, even when this process
                // is killed and runs no destructor.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", binary.display())))?;
        let mut prometheus = Prometheus {
            child,
            addr,
            log,
            dir,
        };
        prometheus.wait_ready().await?;
        Ok(prometheus)
    }

    /// Waits until `/-/ready` answers 200; fails at once when the process exits.
    async fn wait_ready(&mut self) -> io::Result<()> {
        let addr = self.addr;
        let child = &mut self.child;
        let outcome = crate::poll(async || {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok(Err(format!("exited ({status})")));
            }
            match get(addr, "/-/ready").await {
                Ok((200, _)) => Ok(Ok(())),
                Ok((status, body)) => Err(format!("/-/ready answered {status}: {body}")),
                Err(e) => Err(format!("/-/ready: {e}")),
            }
        })
        .await;
        let why = match outcome {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(exited)) => exited,
            Err(last) => format!("not ready within {:?} ({last})", crate::DEADLINE),
        };
        Err(io::Error::other(format!(
            "Prometheus on {addr} {why}; the end of its log:\n{}",
            self.log_tail()
        )))
    }

    /// Its base URL, `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its directory: `prometheus.yml`, `rules.yml`, `data/`, `prometheus.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The instant query `query`'s series now; an error for an answer that is not a
    /// vector (Prometheus's error, a scalar).
    pub async fn query(&self, query: &str) -> Result<Vec<Sample>, String> {
        let target = format!("/api/v1/query?query={}", percent_encode(query));
        let (status, body) = get(self.addr, &target)
            .await
            .map_err(|e| format!("querying {query}: {e}"))?;
        let answer: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| format!("querying {query}: HTTP {status}, {e}: {body}"))?;
        if status != 200 || answer["status"] != "success" {
            return Err(format!("querying {query}: HTTP {status}: {body}"));
        }
        if answer["data"]["resultType"] != "vector" {
            return Err(format!("querying {query}: not a vector: {body}"));
        }
        let series = answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        series
            .into_iter()
            .map(|series| {
                let labels = serde_json::from_value(series["metric"].clone())
                    .map_err(|e| format!("querying {query}: {e}: {body}"))?;
                let value = series["value"][1].as_str().unwrap_or_default().to_string();
                Ok(Sample { labels, value })
            })
            .collect()
    }

    /// Polls the instant query `query` until its series satisfy `check`, and returns them;
    /// fails the test after [`crate::DEADLINE`], showing the last answer.
    pub async fn wait_for_query(
        &self,
        query: &str,
        check: impl Fn(&[Sample]) -> bool,
    ) -> Vec<Sample> {
        crate::wait_for(&format!("query {query}"), async || {
            let series = self.query(query).await?;
            if check(&series) {
                Ok(series)
            } else {
                Err(format!("it returned {series:?}"))
            }
        })
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `text` as a URL's query value: everything but unreserved characters percent-encoded.
fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// `GET target` from `addr` over HTTP/1.0 (one request per connection, no chunking): its
/// status and body.
async fn get(addr: SocketAddr, target: &str) -> io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {target} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| io::Error::other(format!("not an HTTP response: {response}")))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .ok_or_else(|| io::Error::other(format!("not an HTTP response: {head}")))?;
        Ok((status, body.to_string()))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("GET {target} timed out")))?
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[tokio::test]
    async fn exporter_serves_what_was_set() {
        let exporter = Exporter::start("a 1\n").await.unwrap();
        assert_eq!(
            get(exporter.addr(), "/metrics").await.unwrap(),
            (200, "a 1\n".to_string())
        );
        exporter.set("a 2\n");
        assert_eq!(
            get(exporter.addr(), "/metrics").await.unwrap(),
            (200, "a 2\n".to_string())
        );
        assert_eq!(get(exporter.addr(), "/other").await.unwrap().0, 404);
        assert_eq!(exporter.scrapes(), 2);
    }

    #[test]
    fn percent_encode_keeps_only_unreserved() {
        assert_eq!(
            percent_encode(r#"a{node="n-2"} > 0.5"#),
            "a%7Bnode%3D%22n-2%22%7D%20%3E%200.5"
        );
    }

    #[tokio::test]
    async fn series_follow_the_exporter() {
        let started = Instant::now();
        let exporter = Exporter::start("test_alert{node=\"node-2\"} 1\n")
            .await
            .unwrap();
        let prometheus = Prometheus::start(&exporter).await.unwrap();
        let ready = started.elapsed();
        let query = r#"test_alert{node="node-2"} > 0"#;
        let series = prometheus
            .wait_for_query(query, |series| series.len() == 1)
            .await;
        assert_eq!(series[0].label("node"), Some("node-2"));
        assert_eq!(series[0].label("job"), Some("test"));
        assert_eq!(series[0].value, "1");
        let seen = started.elapsed();
        exporter.set("test_alert{node=\"node-2\"} 0\n");
        prometheus.wait_for_query(query, <[Sample]>::is_empty).await;
        eprintln!(
            "series_follow_the_exporter: ready after {ready:?}, series after {seen:?}, gone after {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn alerting_rule_fires_and_resolves() {
        let started = Instant::now();
        let exporter = Exporter::start("test_alert{node=\"node-2\"} 1\n")
            .await
            .unwrap();
        let rules = r#"groups:
  - name: test
    rules:
      - alert: NodeBroken
        expr: test_alert > 0
        for: 0s
        labels:
          severity: page
"#;
        let prometheus = Prometheus::start_with_rules(&exporter, rules)
            .await
            .unwrap();
        let ready = started.elapsed();
        let query = r#"ALERTS{alertstate="firing",node="node-2"}"#;
        let alerts = prometheus
            .wait_for_query(query, |series| series.len() == 1)
            .await;
        assert_eq!(alerts[0].label("alertname"), Some("NodeBroken"));
        assert_eq!(alerts[0].label("severity"), Some("page"));
        let fired = started.elapsed();
        exporter.set("test_alert{node=\"node-2\"} 0\n");
        prometheus.wait_for_query(query, <[Sample]>::is_empty).await;
        eprintln!(
            "alerting_rule_fires_and_resolves: ready after {ready:?}, firing after {fired:?}, resolved after {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_bad_rule_file_is_an_error_with_the_log() {
        let exporter = Exporter::start("").await.unwrap();
        let err = Prometheus::start_with_rules(
            &exporter,
            "groups: [{name: x, rules: [{alert: A, expr: 'up{'}]}]",
        )
        .await
        .err()
        .expect("a rule file that does not parse");
        let message = err.to_string();
        assert!(message.contains("exited"), "{message}");
        assert!(message.contains("rules.yml"), "{message}");
    }
}
