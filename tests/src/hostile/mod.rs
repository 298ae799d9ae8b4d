//! Hostile-input helpers: a DCI with its log kept, OpenAPI routes, raw HTTP/1.1, odd BSON.

pub mod corpus;
pub mod flood;
pub mod requests;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{bin_path, write_config, Den, TestDb};

/// What a process's log must never contain: Rust's panic and stack-overflow reports.
pub const CRASH_MARKERS: [&str; 2] = ["panicked", "overflowed its stack"];

/// The crash reports in a log, if any.
pub fn crashes(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| CRASH_MARKERS.iter().any(|m| l.contains(m)))
        .map(str::to_string)
        .collect()
}

/// A running `disbatch-web` whose stderr goes to a file, so a test can read its log.
pub struct LoggedDci {
    child: Child,
    pub addr: SocketAddr,
    pub url: String,
    pub log: PathBuf,
    // Held open: the server's stdout must not become a broken pipe.
    _stdout: BufReader<ChildStdout>,
}

impl LoggedDci {
    /// Starts the server on an OS-chosen port, logging at `info` to `log`. Blocks the
    /// caller's thread until it listens, as `Dci::start` does.
    pub fn start(config: &Path, log: &Path) -> LoggedDci {
        let err = std::fs::File::create(log).expect("dci log");
        let mut child = Command::new(bin_path("disbatch-web"))
            .arg("--config")
            .arg(config)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("spawn disbatch-web");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read listen line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                panic!("unexpected first line from disbatch-web: {line:?}; log:\n{log}")
            })
            .to_string();
        let addr = url
            .trim_start_matches("http://")
            .trim_start_matches("https://")
            .parse()
            .expect("listen address");
        LoggedDci {
            child,
            addr,
            url,
            log: log.to_path_buf(),
            _stdout: stdout,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for LoggedDci {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every (method, path template) that `GET /openapi.json` lists, sorted.
pub async fn openapi_routes(addr: SocketAddr) -> Vec<(String, String)> {
    let r = raw_http(addr, &get_request("/openapi.json"), Duration::from_secs(30))
        .await
        .expect("GET /openapi.json");
    assert_eq!(r.status, 200, "GET /openapi.json: {}", r.text());
    let doc: serde_json::Value = serde_json::from_slice(&r.body).expect("openapi JSON");
    let mut routes = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            routes.push((method.to_ascii_uppercase(), path.clone()));
        }
    }
    routes.sort();
    assert!(!routes.is_empty(), "openapi.json lists no routes");
    routes
}

/// The status codes `/openapi.json` documents for each operation, by (METHOD, path template).
pub async fn openapi_responses(
    addr: SocketAddr,
) -> std::collections::BTreeMap<(String, String), std::collections::BTreeSet<u16>> {
    let r = raw_http(addr, &get_request("/openapi.json"), Duration::from_secs(30))
        .await
        .expect("GET /openapi.json");
    let doc: serde_json::Value = serde_json::from_slice(&r.body).expect("openapi JSON");
    let mut out = std::collections::BTreeMap::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("operations") {
            let codes = op["responses"]
                .as_object()
                .map(|rs| rs.keys().filter_map(|k| k.parse().ok()).collect())
                .unwrap_or_default();
            out.insert((method.to_ascii_uppercase(), path.clone()), codes);
        }
    }
    out
}

/// The path parameter names of a template: `/tasks/{id}` → `["id"]`.
pub fn path_params(template: &str) -> Vec<&str> {
    template
        .split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .collect()
}

/// Fills a template's parameters with `values` (already URL-encoded), by name.
pub fn fill(template: &str, mut value: impl FnMut(&str) -> String) -> String {
    template
        .split('/')
        .map(
            |s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => value(name),
                None => s.to_string(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

/// A plain `GET` with `Connection: close`.
pub fn get_request(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").into_bytes()
}

/// A parsed HTTP/1.1 response.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends raw bytes on a fresh connection and reads one response to the end. The request
/// should say `Connection: close`. Writing and reading run together, so a server that
/// answers before reading a whole (large) body is still heard. Err: no parsable response.
pub async fn raw_http(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<RawResponse, String> {
    exchange(addr, request, timeout, false).await
}

/// Like `raw_http`, then closes the sending side: for requests whose framing promises more
/// bytes than are sent, so the server sees the end instead of waiting for them.
pub async fn raw_http_then_eof(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<RawResponse, String> {
    exchange(addr, request, timeout, true).await
}

async fn exchange(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
    eof: bool,
) -> Result<RawResponse, String> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut rd, mut wr) = stream.into_split();
        let write = async {
            // The server may answer and close before it has read everything: not an error.
            let _ = wr.write_all(request).await;
            let _ = wr.flush().await;
            if eof {
                let _ = wr.shutdown().await;
            }
        };
        let read = async {
            let mut buf = Vec::new();
            let result = rd.read_to_end(&mut buf).await;
            (buf, result)
        };
        let ((), (buf, result)) = tokio::join!(write, read);
        match parse_response(&buf) {
            Some(r) => Ok(r),
            None => Err(format!(
                "no HTTP response ({} bytes read{})",
                buf.len(),
                result.err().map(|e| format!(", {e}")).unwrap_or_default()
            )),
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("no response within {timeout:?}"))?
}

fn parse_response(buf: &[u8]) -> Option<RawResponse> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    if (100..200).contains(&status) {
        // An interim answer (`100 Continue`): the real one follows.
        return parse_response(&buf[end + 4..]);
    }
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let rest = &buf[end + 4..];
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}

/// A document nested `depth` levels below the top one: `{n: {n: … {leaf: 1}}}`.
pub fn nested(depth: usize) -> Document {
    let mut d = doc! {"leaf": 1};
    for _ in 0..depth {
        d = doc! {"n": d};
    }
    d
}

/// A JSON text nested `depth` levels, of objects (`{"n":…}`) or arrays (`[…]`).
pub fn nested_json(depth: usize, objects: bool) -> String {
    let (open, close) = if objects {
        ("{\"n\":", "}")
    } else {
        ("[", "]")
    };
    format!("{}1{}", open.repeat(depth), close.repeat(depth))
}

/// Serializes `d` and overwrites the bytes of `marker` (inside one of its strings) with
/// invalid UTF-8 of the same length, which no `String` can hold.
pub fn with_invalid_utf8(d: &Document, marker: &str) -> bson::RawDocumentBuf {
    let mut bytes = bson::to_vec(d).expect("serialize");
    let m = marker.as_bytes();
    let at = bytes
        .windows(m.len())
        .position(|w| w == m)
        .expect("marker in document");
    for (i, b) in bytes[at..at + m.len()].iter_mut().enumerate() {
        *b = if i % 2 == 0 { 0xff } else { 0xc3 };
    }
    bson::RawDocumentBuf::from_bytes(bytes).expect("raw document")
}

/// Waits for tasks to complete while the DEN runs; on failure shows its warnings and errors.
/// `timeout` is when to give up, scaled by `DISBATCH_TEST_SLOWDOWN`.
pub async fn wait_done(db: &TestDb, den: &mut Den, ids: &[ObjectId], timeout: Duration) {
    let filter = doc! {"_id": {"$in": ids.to_vec()}, "complete": true};
    let timeout = crate::harness::scaled(timeout);
    let deadline = std::time::Instant::now() + timeout;
    let mut backoff = crate::harness::Backoff::new();
    loop {
        if db.count(filter.clone()).await as usize == ids.len() {
            return;
        }
        let running = den.is_running();
        if !running || std::time::Instant::now() > deadline {
            let log = den.log_text();
            let notable: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains(" INFO ") && !l.trim().is_empty())
                .collect();
            let notable = &notable[notable.len().saturating_sub(20)..];
            panic!(
                "tasks not complete after {timeout:?} (DEN running: {running}); statuses {:?}; last DEN warnings:\n{}",
                db.status_histogram().await,
                notable.join("\n")
            );
        }
        backoff.wait().await;
    }
}

/// A GET answer must be below 500 and, when it says JSON (errors always do), valid JSON.
pub async fn check_get(
    dci: &LoggedDci,
    target: &str,
    accept_html: bool,
    failures: &mut Vec<String>,
) {
    let mut request = get_request(target);
    if accept_html {
        let text = String::from_utf8_lossy(&request).replace(
            "Connection: close\r\n",
            "Connection: close\r\nAccept: text/html\r\n",
        );
        request = text.into_bytes();
    }
    match raw_http(dci.addr, &request, Duration::from_secs(30)).await {
        Err(e) => failures.push(format!("GET {target}: {e}")),
        Ok(r) => {
            let ct = r.header("content-type").unwrap_or_default().to_string();
            if r.status >= 500 {
                failures.push(format!("GET {target}: {} {}", r.status, r.text()));
            } else if ct.starts_with("application/json") && !is_json(&r.body) {
                failures.push(format!("GET {target}: {} body is not JSON", r.status));
            } else if r.status >= 400 && !ct.starts_with("application/json") && !accept_html {
                failures.push(format!(
                    "GET {target}: {} error is not JSON ({ct})",
                    r.status
                ));
            }
        }
    }
}

/// Percent-encodes every byte but the unreserved ones, for a path segment or a query value.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Starts a DEN on `db` (which holds hostile documents) and checks it still runs good work
/// after meeting them, with no panic: `meets` are tasks that complete only once the pass or
/// recovery that meets the hostile documents is done (none when a first pass is enough).
/// After those, the node reads its queues three more times, so every hostile document it
/// left alone was passed over again, before a late good task must still run.
pub async fn den_survives(db: &TestDb, meets: &[ObjectId]) -> Den {
    let good = db.insert_queue("good", "echo", 2).await;
    let config = write_config(db, "den.json", json!({}));
    let mut den = Den::start(&config, "extreme-node");
    let first = db.insert_tasks(good, vec![Bson::from(doc! {"n": 1})]).await;
    wait_done(db, &mut den, &first, Duration::from_secs(60)).await;
    wait_done(db, &mut den, meets, Duration::from_secs(60)).await;
    den.wait_queue_reads(3).await;
    let late = db.insert_tasks(good, vec![Bson::from(doc! {"n": 2})]).await;
    wait_done(db, &mut den, &late, Duration::from_secs(60)).await;
    let log = den.log_text();
    assert!(den.is_running(), "the DEN exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DEN log:\n{log}");
    den
}

/// Valid JSON of any depth: documents may nest as deep as the server stores them (~180),
/// beyond serde_json's default limit of 128.
pub fn is_json(body: &[u8]) -> bool {
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_slice(body);
    de.disable_recursion_limit();
    Value::deserialize(&mut de).is_ok() && de.end().is_ok()
}

/// A collection's documents in `_id` order.
pub async fn documents(c: mongodb::Collection<Document>) -> Vec<Document> {
    let mut cursor = c.find(doc! {}).sort(doc! {"_id": 1}).await.expect("find");
    let mut out = Vec::new();
    while cursor.advance().await.expect("cursor") {
        out.push(Document::try_from(cursor.current()).expect("document"));
    }
    out
}

/// The queues', tasks' and nodes' documents in `_id` order: the work a bad request must leave
/// as it was.
pub async fn snapshot_of_work(db: &TestDb) -> Vec<(String, Vec<Document>)> {
    let mut out = Vec::new();
    for name in ["queues", "tasks", "nodes"] {
        let docs = documents(db.db.collection::<Document>(name)).await;
        out.push((name.to_string(), docs));
    }
    out
}

/// Every collection's documents: what "nothing changed" compares.
pub async fn snapshot(db: &TestDb) -> Vec<(String, Vec<Document>)> {
    let mut names = db.db.list_collection_names().await.expect("collections");
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let docs = documents(db.db.collection::<Document>(&name)).await;
        out.push((name, docs));
    }
    out
}
