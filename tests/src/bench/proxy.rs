//! A counting TCP proxy between Disbatch's processes and the MongoDB server: it forwards bytes
//! untouched, counts the client→server requests by process kind and command, and times each
//! request to its reply.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::wire::{is_monitoring_command, Request, WireParser};

/// Requests by who sent them (the driver's `appName`, e.g. `disbatch-rs/disbatchd`) and by
/// label (`command` or `command collection`).
pub type Tally = BTreeMap<String, BTreeMap<String, u64>>;

/// What the proxy has counted since it started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// Requests on connections that did work: commands, and those connections' handshakes.
    pub app: Tally,
    /// Requests on connections that only ever sent hello/isMaster/ping: the driver's server
    /// monitors (and pooled connections not used yet).
    pub monitoring: Tally,
    pub connections: u64,
    /// Connections open now: a fleet's standing load on the server's connection limit.
    pub open: u64,
    /// Connections whose stream stopped parsing (never expected from a real driver).
    pub unparsed_connections: u64,
    /// Milliseconds since the epoch at which each app label was first seen since the last
    /// `mark` (to find a run's first claim).
    #[serde(skip)]
    pub first_seen: BTreeMap<String, i64>,
    /// Milliseconds from each app request to its reply, as the proxy saw them.
    #[serde(skip)]
    pub reply_ms: BTreeMap<String, BTreeMap<String, Vec<f64>>>,
    /// App requests sent and not answered yet, change-stream `getMore`s (which wait for
    /// events by design) aside.
    #[serde(skip)]
    pub in_flight: BTreeMap<String, i64>,
}

impl Counts {
    pub fn app_total(&self) -> u64 {
        total(&self.app)
    }

    pub fn monitoring_total(&self) -> u64 {
        total(&self.monitoring)
    }

    /// `self - earlier`, label by label (counts only grow, except a connection's handshake
    /// moving from monitoring to app, so differences saturate at 0).
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            app: diff(&self.app, &earlier.app),
            monitoring: diff(&self.monitoring, &earlier.monitoring),
            connections: self.connections.saturating_sub(earlier.connections),
            open: self.open,
            unparsed_connections: self
                .unparsed_connections
                .saturating_sub(earlier.unparsed_connections),
            first_seen: self.first_seen.clone(),
            reply_ms: self
                .reply_ms
                .iter()
                .map(|(who, labels)| {
                    let labels = labels.iter().map(|(label, v)| {
                        let skip = earlier
                            .reply_ms
                            .get(who)
                            .and_then(|m| m.get(label))
                            .map_or(0, Vec::len);
                        (label.clone(), v.get(skip..).unwrap_or_default().to_vec())
                    });
                    (who.clone(), labels.collect())
                })
                .collect(),
            in_flight: self.in_flight.clone(),
        }
    }
}

pub fn total(tally: &Tally) -> u64 {
    tally.values().flat_map(|m| m.values()).sum()
}

fn diff(now: &Tally, before: &Tally) -> Tally {
    let mut out = Tally::new();
    for (who, labels) in now {
        for (label, n) in labels {
            let old = before
                .get(who)
                .and_then(|m| m.get(label))
                .copied()
                .unwrap_or(0);
            let d = n.saturating_sub(old);
            if d > 0 {
                *out.entry(who.clone())
                    .or_default()
                    .entry(label.clone())
                    .or_default() += d;
            }
        }
    }
    out
}

fn bump(tally: &mut Tally, who: &str, label: &str, n: i64) {
    let slot = tally
        .entry(who.to_string())
        .or_default()
        .entry(label.to_string())
        .or_default();
    *slot = slot.saturating_add_signed(n);
}

/// A request's label: the command, with its collection when it names one.
pub fn label(r: &Request) -> String {
    match &r.collection {
        Some(c) => format!("{} {c}", r.command),
        None => r.command.clone(),
    }
}

/// Runs until dropped.
pub struct Proxy {
    pub addr: SocketAddr,
    counts: Arc<Mutex<Counts>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards each connection to `upstream`.
    pub async fn start(upstream: String) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Mutex::new(Counts::default()));
        let shared = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counts = shared.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, counts).await;
                    }
                });
            }
        });
        Ok(Proxy {
            addr,
            counts,
            accept,
        })
    }

    pub fn snapshot(&self) -> Counts {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// App requests awaiting their reply (`getMore` aside) by label: a node mid-claim.
    pub fn in_flight(&self) -> BTreeMap<String, i64> {
        self.counts
            .lock()
            .map(|c| {
                c.in_flight
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(l, n)| (l.clone(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Forgets when labels were first seen: the next sighting of each is recorded anew.
    pub fn mark(&self) {
        if let Ok(mut c) = self.counts.lock() {
            c.first_seen.clear();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// What one connection has shown about itself so far.
struct Conn {
    who: String,
    /// Only hello/isMaster/ping so far: counted as monitoring until it sends anything else.
    monitoring_only: bool,
    /// Its monitoring requests so far, moved to app if it turns out to be a work connection.
    provisional: BTreeMap<String, u64>,
}

impl Conn {
    /// Counts a request; returns its label when it is app work (to time its reply).
    fn count(&mut self, request: &Request, counts: &Mutex<Counts>) -> Option<String> {
        if let Some(app) = &request.app_name {
            self.who = app.clone();
        }
        let label = label(request);
        let mut c = counts.lock().ok()?;
        if self.monitoring_only && is_monitoring_command(&request.command) {
            *self.provisional.entry(label.clone()).or_default() += 1;
            bump(&mut c.monitoring, &self.who, &label, 1);
            return None;
        }
        if self.monitoring_only {
            self.monitoring_only = false;
            for (l, n) in std::mem::take(&mut self.provisional) {
                bump(&mut c.monitoring, &self.who, &l, -(n as i64));
                bump(&mut c.app, &self.who, &l, n as i64);
            }
        }
        bump(&mut c.app, &self.who, &label, 1);
        let now = bson::DateTime::now().timestamp_millis();
        c.first_seen.entry(label.clone()).or_insert(now);
        Some(label)
    }
}

/// Whether a request counts as in flight while unanswered: a `getMore` may wait for events.
fn awaited(label: &str) -> bool {
    label != "getMore" && !label.starts_with("getMore ")
}

/// Requests waiting for their reply, by request id: who sent it, its label, when.
type Pending = Mutex<HashMap<i32, (String, String, Instant)>>;

fn replied(reply: &Request, pending: &Pending, counts: &Mutex<Counts>) {
    let Some((who, label, sent)) = pending
        .lock()
        .ok()
        .and_then(|mut p| p.remove(&reply.response_to))
    else {
        return; // an exhaust stream's later replies, or a monitoring reply
    };
    if let Ok(mut c) = counts.lock() {
        if awaited(&label) {
            *c.in_flight.entry(label.clone()).or_default() -= 1;
        }
        c.reply_ms
            .entry(who)
            .or_default()
            .entry(label)
            .or_default()
            .push(sent.elapsed().as_secs_f64() * 1000.0);
    }
}

async fn relay(client: TcpStream, server: TcpStream, counts: Arc<Mutex<Counts>>) {
    // The driver disables Nagle on its own socket; the proxy must too, or it adds delay.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    if let Ok(mut c) = counts.lock() {
        c.connections += 1;
        c.open += 1;
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let pending: Pending = Mutex::new(HashMap::new());
    let upstream = async {
        let mut parser = WireParser::new();
        let mut conn = Conn {
            who: "?".into(),
            monitoring_only: true,
            provisional: BTreeMap::new(),
        };
        let mut buf = vec![0u8; 64 * 1024];
        let mut counted_broken = false;
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            parser.feed(&buf[..n], &mut |r| {
                if let Some(label) = conn.count(&r, &counts) {
                    if awaited(&label) {
                        if let Ok(mut c) = counts.lock() {
                            *c.in_flight.entry(label.clone()).or_default() += 1;
                        }
                    }
                    if let Ok(mut p) = pending.lock() {
                        p.insert(r.request_id, (conn.who.clone(), label, Instant::now()));
                    }
                }
            });
            if parser.broken().is_some() && !counted_broken {
                counted_broken = true;
                if let Ok(mut c) = counts.lock() {
                    c.unparsed_connections += 1;
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let mut parser = WireParser::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            parser.feed(&buf[..n], &mut |r| replied(&r, &pending, &counts));
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    // Either side closing ends the connection: MongoDB has no half-closed conversations.
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
    }
    let unanswered: Vec<String> = pending.lock().map_or(Vec::new(), |p| {
        p.values()
            .filter(|(_, l, _)| awaited(l))
            .map(|(_, l, _)| l.clone())
            .collect()
    });
    if let Ok(mut c) = counts.lock() {
        c.open = c.open.saturating_sub(1);
        for label in unanswered {
            *c.in_flight.entry(label).or_default() -= 1;
        }
    }
}

/// A MongoDB URI split around its single host, so the host can be swapped for the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUri {
    /// `mongodb://` plus any `user:password@`.
    pub head: String,
    /// `host:port` (port 27017 when the URI gave none).
    pub host: String,
    /// The path and options (`/db?x=y`), possibly empty.
    pub tail: String,
}

impl HostUri {
    pub fn parse(uri: &str) -> Result<HostUri, String> {
        let rest = uri.strip_prefix("mongodb://").ok_or_else(|| {
            format!(
                "{uri:?}: only mongodb:// URIs with one host can be proxied (no mongodb+srv://)"
            )
        })?;
        let (userinfo, rest) = match rest.rfind('@') {
            Some(at) if !rest[..at].contains('/') => (&rest[..=at], &rest[at + 1..]),
            _ => ("", rest),
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (host, tail) = rest.split_at(end);
        let lower = tail.to_ascii_lowercase();
        if lower.contains("tls=true") || lower.contains("ssl=true") {
            return Err(format!(
                "{uri:?}: the benchmark's proxy counts requests by reading them, which TLS \
                 prevents; benchmark a server without TLS"
            ));
        }
        if host.is_empty() || host.contains(',') {
            return Err(format!(
                "{uri:?}: the benchmark proxies exactly one host; give a single-host URI"
            ));
        }
        let has_port = match host.rfind(']') {
            Some(bracket) => host[bracket..].contains(':'),
            None => host.contains(':'),
        };
        let host = if has_port {
            host.to_string()
        } else {
            format!("{host}:27017")
        };
        Ok(HostUri {
            head: format!("mongodb://{userinfo}"),
            host,
            tail: tail.to_string(),
        })
    }

    /// The same URI with `addr` as its host and a direct connection, so the driver never
    /// follows the server's advertised replica-set hosts around the proxy.
    pub fn with_host(&self, addr: &str) -> String {
        let (path, query) = match self.tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (self.tail.as_str(), ""),
        };
        let mut options: Vec<&str> = query
            .split('&')
            .filter(|o| !o.is_empty() && !o.to_ascii_lowercase().starts_with("directconnection="))
            .collect();
        options.push("directConnection=true");
        let path = if path.is_empty() { "/" } else { path };
        format!("{}{addr}{path}?{}", self.head, options.join("&"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_are_rewritten_to_the_proxy() {
        let u = HostUri::parse("mongodb://127.0.0.1:5000/?directConnection=true").expect("ok");
        assert_eq!(u.host, "127.0.0.1:5000");
        assert_eq!(
            u.with_host("127.0.0.1:9"),
            "mongodb://127.0.0.1:9/?directConnection=true"
        );
        let u = HostUri::parse("mongodb://u:p@db.example/admin?w=1&directConnection=false")
            .expect("ok");
        assert_eq!(u.host, "db.example:27017");
        assert_eq!(
            u.with_host("127.0.0.1:9"),
            "mongodb://u:p@127.0.0.1:9/admin?w=1&directConnection=true"
        );
        assert!(HostUri::parse("mongodb://h/?tls=true").is_err());
        assert!(HostUri::parse("mongodb://h/?SSL=true").is_err());
        let u = HostUri::parse("mongodb://[::1]").expect("ok");
        assert_eq!(u.host, "[::1]:27017");
        assert_eq!(u.with_host("h:1"), "mongodb://h:1/?directConnection=true");
        assert!(HostUri::parse("mongodb://a:1,b:2/").is_err());
        assert!(HostUri::parse("mongodb+srv://cluster.example").is_err());
        assert!(HostUri::parse("http://x").is_err());
    }

    #[test]
    fn a_connection_is_monitoring_until_it_does_work() {
        let counts = Mutex::new(Counts::default());
        let req = |command: &str, collection: Option<&str>, app: Option<&str>| Request {
            length: 20,
            request_id: 1,
            response_to: 0,
            op_code: super::super::wire::OP_MSG,
            command: command.into(),
            collection: collection.map(str::to_string),
            app_name: app.map(str::to_string),
        };
        let mut monitor = Conn {
            who: "?".into(),
            monitoring_only: true,
            provisional: BTreeMap::new(),
        };
        monitor.count(&req("hello", None, Some("den")), &counts);
        monitor.count(&req("hello", None, None), &counts);
        let mut pooled = Conn {
            who: "?".into(),
            monitoring_only: true,
            provisional: BTreeMap::new(),
        };
        pooled.count(&req("hello", None, Some("den")), &counts);
        let before = counts.lock().expect("lock").clone();
        assert_eq!(before.monitoring_total(), 3);
        pooled.count(&req("findAndModify", Some("tasks"), None), &counts);
        pooled.count(&req("ping", None, None), &counts);
        let c = counts.lock().expect("lock").clone();
        assert_eq!(c.monitoring["den"]["hello"], 2);
        assert_eq!(c.app["den"]["hello"], 1);
        assert_eq!(c.app["den"]["findAndModify tasks"], 1);
        assert_eq!(c.app["den"]["ping"], 1);
        let d = c.since(&before);
        assert_eq!(d.app_total(), 3);
        assert_eq!(d.monitoring_total(), 0);

        let pending: Pending = Mutex::new(HashMap::new());
        counts
            .lock()
            .expect("lock")
            .in_flight
            .insert("find queues".into(), 1);
        if let Some(label) = pooled.count(&req("find", Some("queues"), None), &counts) {
            pending
                .lock()
                .expect("lock")
                .insert(41, ("den".into(), label, Instant::now()));
        }
        let mut reply = req("cursor", None, None);
        reply.response_to = 41;
        replied(&reply, &pending, &counts);
        replied(&reply, &pending, &counts); // an exhaust stream's second reply: not timed
        reply.response_to = 99;
        replied(&reply, &pending, &counts);
        let timed = counts.lock().expect("lock").clone();
        assert_eq!(timed.in_flight["find queues"], 0, "the reply ended it");
        assert_eq!(timed.reply_ms["den"]["find queues"].len(), 1);
        assert_eq!(timed.since(&timed).reply_ms["den"]["find queues"].len(), 0);
    }
}
