//! Connection floods on loopback (idle, slowloris, kept-alive) and the figures that show what
//! they cost a server process: its resident memory and open descriptors.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Floods hold thousands of sockets in this process too: lift its soft limit to the hard one.
pub fn raise_open_file_limit() -> u64 {
    disbatch_config::process::open_files::raise_open_file_limit().expect("raise RLIMIT_NOFILE")
}

/// Resident memory of a process, in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .expect("VmRSS")
}

/// Descriptors a process holds open.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("proc fd")
        .count()
}

/// When the server accepted a connection, as a client can bound it: not before `connected`
/// (taken before its connect was started: an instant taken after the connect returned could
/// be later than the accept when the client's task runs late), not after `accepted` (a
/// request on a later connection had been answered: the server accepts in order). A server
/// timeout running from the accept closes the connection between `connected + t` and
/// `accepted + t`.
#[derive(Debug, Clone, Copy)]
pub struct Accepted {
    pub connected: Instant,
    pub accepted: Instant,
}

/// How long a connection lived on the server, as far as a client can tell.
#[derive(Debug, Clone, Copy)]
pub struct Lifetime {
    /// From `accepted` to the close: the server held it at least this long. The estimate
    /// for upper bounds: longer than a bound, the server provably held it too long.
    pub at_least: Duration,
    /// From `connected` to the close: the server held it at most this long. The estimate for
    /// lower bounds: shorter than a bound, the server provably closed it too early.
    pub at_most: Duration,
}

impl Lifetime {
    fn of(opened: Accepted, closed: Instant) -> Lifetime {
        Lifetime {
            at_least: closed.saturating_duration_since(opened.accepted),
            at_most: closed.saturating_duration_since(opened.connected),
        }
    }
}

/// Opens `n` connections that send nothing, 100 at a time; after each batch a `GET probe`
/// on a new connection is answered, so the batch has been accepted (a faster flood would
/// only wait in the kernel's listen queue, which holds none of the server's descriptors).
pub async fn open_idle(addr: SocketAddr, n: usize, probe: &str) -> Vec<(TcpStream, Accepted)> {
    let mut out = Vec::with_capacity(n);
    open_each(addr, n, probe, |s, at| out.push((s, at))).await;
    out
}

/// `open_idle`, handing each connection to `each` as soon as its batch is accepted (so a
/// watcher sees the server close it from then on).
pub async fn open_each(
    addr: SocketAddr,
    n: usize,
    probe: &str,
    mut each: impl FnMut(TcpStream, Accepted),
) {
    let mut left = n;
    while left > 0 {
        let batch = left.min(100);
        let mut set = JoinSet::new();
        for _ in 0..batch {
            set.spawn(async move {
                let connecting = Instant::now();
                (TcpStream::connect(addr).await, connecting)
            });
        }
        let mut opened = Vec::with_capacity(batch);
        while let Some(joined) = set.join_next().await {
            if let Ok((Ok(s), at)) = joined {
                opened.push((s, at));
            }
        }
        let (status, _) = timed_get(addr, probe).await;
        assert_eq!(
            status, 200,
            "the probe GET {probe} during the flood was not answered"
        );
        let accepted = Instant::now();
        for (s, connected) in opened {
            each(
                s,
                Accepted {
                    connected,
                    accepted,
                },
            );
        }
        left -= batch;
    }
}

/// One `/proc/net/tcp` row (IPv4: the tests listen on 127.0.0.1).
struct TcpRow {
    local: u16,
    remote: u16,
    /// Hex, as the kernel writes it (`0A` listening, `01` established).
    state: String,
    inode: String,
}

fn tcp_rows() -> Vec<TcpRow> {
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some(TcpRow {
                local: port(f.get(1)?)?,
                remote: port(f.get(2)?)?,
                state: f.get(3)?.to_string(),
                inode: f.get(9)?.to_string(),
            })
        })
        .collect()
}

/// The inodes of the sockets process `pid` holds descriptors for.
fn socket_inodes(pid: u32) -> std::collections::HashSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Connections to `port` that process `pid` holds open (accepted, not yet closed), as the
/// kernel's tables show them: a cross-check of the server's own count. The smaller of two
/// reads: neither the descriptor directory nor `/proc/net/tcp` is read atomically, and while
/// connections are closed and accepted a read can list a closed socket beside its successor;
/// a socket really held is in both reads.
pub fn held_connections(pid: u32, port: u16) -> usize {
    held_once(pid, port).min(held_once(pid, port))
}

fn held_once(pid: u32, port: u16) -> usize {
    let inodes = socket_inodes(pid);
    // Counted by inode: `/proc/net/tcp` is read in chunks, and a table that changes between
    // them (a flood being accepted and evicted) can list a socket twice.
    tcp_rows()
        .into_iter()
        .filter(|r| r.local == port && r.state != "0A" && inodes.contains(&r.inode))
        .map(|r| r.inode)
        .collect::<std::collections::HashSet<_>>()
        .len()
}

/// When the server closed `s` (EOF or reset); None if it was still open after `limit`.
/// Whatever the server sends first (a response) is read and skipped.
pub async fn closed_at(mut s: TcpStream, limit: Duration) -> Option<Instant> {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => continue,
            Err(_) => return None,
        }
    }
}

/// Watches every stream for its close; None: still open after `limit`.
pub fn watch_closes(
    streams: Vec<(TcpStream, Accepted)>,
    limit: Duration,
) -> JoinSet<Option<Lifetime>> {
    let mut set = JoinSet::new();
    for (s, opened) in streams {
        set.spawn(async move { closed_at(s, limit).await.map(|at| Lifetime::of(opened, at)) });
    }
    set
}

/// `n` idle connections, each watched for its close from its batch's accept on.
pub async fn flood_idle(
    addr: SocketAddr,
    n: usize,
    probe: &str,
    limit: Duration,
) -> JoinSet<Option<Lifetime>> {
    let mut set = JoinSet::new();
    open_each(addr, n, probe, |s, opened| {
        set.spawn(async move { closed_at(s, limit).await.map(|at| Lifetime::of(opened, at)) });
    })
    .await;
    set
}

/// `m` slowloris clients: each sends a request head one byte every `every`, never finishing
/// it. None: still open after `limit`.
pub async fn flood_slowloris(
    addr: SocketAddr,
    m: usize,
    probe: &str,
    every: Duration,
    limit: Duration,
) -> JoinSet<Option<Lifetime>> {
    let mut set = JoinSet::new();
    open_each(addr, m, probe, |s, opened| {
        set.spawn(async move {
            slowloris(s, every, limit)
                .await
                .map(|at| Lifetime::of(opened, at))
        });
    })
    .await;
    set
}

async fn slowloris(s: TcpStream, every: Duration, limit: Duration) -> Option<Instant> {
    let (mut rd, mut wr) = s.into_split();
    let head = b"GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let dribble = async {
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(every).await;
        }
        // Keep the half open so the read below sees the server's close.
        std::future::pending::<()>().await;
    };
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => continue,
            }
        }
    };
    tokio::select! {
        at = closed => Some(at),
        () = dribble => None,
        () = tokio::time::sleep(limit) => None,
    }
}

/// All results of a set, in no order.
pub async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(set.len());
    while let Some(r) = set.join_next().await {
        out.push(r.expect("flood task"));
    }
    out
}

/// A plain `GET` with `Connection: close` on a new connection: its status and how long the
/// answer took (status 0: no answer, the connection was closed).
pub async fn timed_get(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let request = super::get_request(path);
    let status = super::raw_http(addr, &request, Duration::from_secs(30))
        .await
        .map_or(0, |r| r.status);
    (status, started.elapsed())
}

/// Opens `k` connections that each make one request and keep the connection alive. The
/// server's idle timer starts between the request's sending and the answer's arrival, which
/// the `Accepted` bounds give.
pub async fn kept_alive(addr: SocketAddr, path: &str, k: usize) -> Vec<(TcpStream, Accepted)> {
    let mut out = Vec::with_capacity(k);
    for _ in 0..k {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        let sent = Instant::now();
        s.write_all(req.as_bytes()).await.expect("send");
        read_one_response(&mut s).await;
        let answered = Instant::now();
        out.push((
            s,
            Accepted {
                connected: sent,
                accepted: answered,
            },
        ));
    }
    out
}

/// Reads one response with a Content-Length (or an empty body) off a kept-alive connection.
async fn read_one_response(s: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .expect("read");
        assert!(n > 0, "closed before answering");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return;
        }
    }
}

/// A listener's own count of its connections (`disbatch_listener_connections_open` and
/// `_open_max`), from its `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct ListenerCount {
    /// Open while the scrape was answered, the scrape's own connection included.
    pub open: u64,
    /// The most open at once since the listener started.
    pub most: u64,
}

/// Scrapes `addr`'s `/metrics` (on a new connection, which takes a slot like any other) for
/// the connection gauges of its listener `listener` (`web`, `metrics`).
pub async fn listener_count(addr: SocketAddr, listener: &str) -> ListenerCount {
    let request = super::get_request("/metrics");
    let response = super::raw_http(addr, &request, Duration::from_secs(30))
        .await
        .expect("GET /metrics");
    assert_eq!(response.status, 200, "GET /metrics");
    let text = String::from_utf8_lossy(&response.body);
    let gauge = |name: &str| {
        let sample = format!("{name}{{listener=\"{listener}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&sample))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {sample} in /metrics:\n{text}"))
    };
    ListenerCount {
        open: gauge("disbatch_listener_connections_open"),
        most: gauge("disbatch_listener_connections_open_max"),
    }
}

/// Milliseconds, for the printed figures.
pub fn ms(d: Duration) -> u128 {
    d.as_millis()
}

/// The TCP sockets process `pid` holds, one line each (`local → remote state`), for a failed
/// assertion on `held_connections` to show what was held.
pub fn describe_sockets(pid: u32) -> String {
    let inodes = socket_inodes(pid);
    tcp_rows()
        .into_iter()
        .filter(|r| inodes.contains(&r.inode))
        .map(|r| {
            format!(
                "{} → {} state {} inode {}",
                r.local, r.remote, r.state, r.inode
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
