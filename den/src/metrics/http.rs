//! The node's optional HTTP listener (`metrics_listen`): `/metrics`, `/healthz` and `/readyz`.

use std::future::Future;
use std::time::Duration;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use disbatch_serve::readiness::{healthz, Readiness};
use disbatch_serve::{serve_counted, ConnectionGauges, Limits};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::metrics::DenMetrics;

/// The metrics listener's limits: a scraper needs one connection, so a few slots and short
/// timeouts are plenty, and however many connections arrive the node keeps its descriptors
/// for its task runners.
pub const METRICS_LIMITS: Limits = Limits {
    max_connections: 32,
    header_timeout: Duration::from_secs(5),
    idle_timeout: Duration::from_secs(15),
    shutdown_grace: Duration::from_secs(2),
};

#[derive(Clone)]
struct Listener {
    metrics: DenMetrics,
    readiness: Readiness,
    /// The listener's own families, which the node's metrics know nothing of.
    connections: Registry,
}

/// Serves `GET /metrics`, `/healthz` and `/readyz` on `listener` until `shutdown` resolves;
/// anything else is 404. `readiness` is ready once the node has attached its store to it.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: DenMetrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let connections = Registry::new();
    let gauges = ConnectionGauges::new("metrics").and_then(|g| {
        g.register(&connections)?;
        Ok(g)
    });
    let gauges = gauges
        .inspect_err(|e| tracing::warn!(error = %e, "the listener's connection gauges"))
        .ok();
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(|| async { healthz() }))
        .route("/readyz", get(ready))
        .fallback(not_found)
        .with_state(Listener {
            metrics,
            readiness,
            connections,
        });
    serve_counted(listener, app, METRICS_LIMITS, None, gauges, shutdown).await;
}

async fn scrape(State(l): State<Listener>) -> Response {
    let mut text = l.metrics.render();
    let mut own = Vec::new();
    match TextEncoder::new().encode(&l.connections.gather(), &mut own) {
        Ok(()) => text.push_str(&String::from_utf8_lossy(&own)),
        Err(e) => tracing::warn!(error = %e, "rendering the listener's connection gauges"),
    }
    ([(CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response()
}

async fn ready(State(l): State<Listener>) -> Response {
    l.readiness.respond().await
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: this listener serves GET /metrics, /healthz and /readyz only\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[tokio::test]
    async fn the_listener_serves_metrics_only_and_stops_on_shutdown() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let metrics = DenMetrics::new();
        metrics.pass(Duration::from_millis(1));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_metrics(listener, metrics, Readiness::new(), async {
            let _ = stopped.await;
        }));
        let fetch = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = fetch("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("text/plain; version=0.0.4"), "{ok}");
        assert!(ok.contains("\r\n\r\n"), "{ok}");
        let body = ok.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        assert!(has(body, "disbatch_den_passes_total 1"), "{body}");
        assert!(
            has(
                body,
                "disbatch_listener_connections_open{listener=\"metrics\"} 1"
            ),
            "{body}"
        );
        let missing = fetch("/other").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let alive = fetch("/healthz").await;
        assert!(alive.starts_with("HTTP/1.1 200"), "{alive}");
        // No store attached yet: the node is still starting.
        let starting = fetch("/readyz").await;
        assert!(starting.starts_with("HTTP/1.1 503"), "{starting}");
        assert!(starting.contains("\"unready\""), "{starting}");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the listener stops on shutdown")
            .expect("join");
    }
}
