//! Serving an axum app on a TCP listener with a cap on connections, header and idle timeouts,
//! optional TLS and a bounded graceful shutdown: the DCI and the DEN's metrics listener.
//!
//! The rules (README "Connection limits"):
//! - at most `max_connections` connections are open. When all are taken, the connections
//!   that have waited longest with no request in flight are closed (a sixteenth of the slots
//!   at once, so a flood is accepted at the kernel's pace) and the newcomer takes a slot;
//!   when every connection has a request in flight, the newcomer is closed at once.
//!   A flood of idle or slow connections therefore neither exhausts descriptors nor locks
//!   out a client that sends its request promptly;
//! - a request head must be complete within `header_timeout`, counted from the accept for
//!   the first request (TLS handshake included) and from the first byte of each later one;
//!   a request body that sends nothing for that long fails its request (on HTTP/2 any frame
//!   between requests counts as the start of one);
//! - a connection with nothing in flight and no byte of a new request for `idle_timeout` is
//!   closed, and so is one whose client does not read its response for that long;
//! - on shutdown the listener closes, connections with nothing in flight close at once, and
//!   requests in flight get `shutdown_grace` to finish.

mod activity;
mod conn;
pub mod ops_metrics;
pub mod readiness;
mod slots;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use activity::Timeouts;
pub use slots::ConnectionGauges;
use slots::Slots;

/// One listener's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// How long requests in flight may run on once shutdown is asked for.
    pub shutdown_grace: Duration,
}

/// Connections the kernel queues for `accept`. std's 128 overflows under a burst of
/// connections, and each client whose SYN is dropped then waits a second or more for its
/// retry; the accept loop drains a longer queue in milliseconds, and queued connections hold
/// none of this process's descriptors.
pub const LISTEN_BACKLOG: u32 = 1024;

/// Binds `address` (`host:port`; a name's addresses are tried in turn, as std does) with
/// `LISTEN_BACKLOG`.
pub async fn bind(address: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        match bind_one(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other(format!("{address} resolves to no address"))))
}

fn bind_one(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    // As std and tokio do: a restarted server can bind while old connections linger.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Warnings about a full listener or failing accepts come at most this often.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Arc<ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) {
    serve_counted(listener, app, limits, tls, None, shutdown).await;
}

/// `serve`, keeping `gauges` at the number of connections open.
pub async fn serve_counted(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<Arc<ServerConfig>>,
    gauges: Option<ConnectionGauges>,
    shutdown: impl Future<Output = ()>,
) {
    let tls = tls.map(TlsAcceptor::from);
    let timeouts = Timeouts {
        header: limits.header_timeout,
        idle: limits.idle_timeout,
    };
    let slots = Slots::counted_by(limits.max_connections, gauges);
    let (stop, stopped) = watch::channel(false);
    let mut refused = Warned::default();
    let mut failed = Warned::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            // The client gave up before the accept: nothing to do.
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                // Out of descriptors or memory: what is queued waits in the kernel's backlog.
                if failed.due() {
                    tracing::warn!(error = %e, "accepting a connection failed");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.admit().await else {
            if refused.due() {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "every connection has a request in flight: closing new connections"
                );
            }
            continue;
        };
        // Answers are written whole; Nagle would only delay their last segment.
        let _ = stream.set_nodelay(true);
        tokio::spawn(conn::run(
            stream,
            tls.clone(),
            app.clone(),
            slot,
            timeouts,
            stopped.clone(),
        ));
    }
    drop(listener);
    let _ = stop.send(true);
    if !slots.drain(limits.shutdown_grace).await {
        tracing::warn!(
            open = slots.open(),
            grace = ?limits.shutdown_grace,
            "connections still open after the shutdown grace are cut"
        );
    }
}

fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// When a repeated warning was last logged.
#[derive(Default)]
struct Warned(Option<Instant>);

impl Warned {
    fn due(&mut self) -> bool {
        let due = self.0.is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}
