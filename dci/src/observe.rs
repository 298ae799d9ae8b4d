//! Request metrics and the access log: every answer is counted by route template and logged.
//!
//! Labels are the matched route's template (`/tasks/{id}`), never the path a client sent, and
//! methods outside HTTP's standard set are `other`: no client can grow the label sets.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use disbatch_model::text::printable::shown;
use disbatch_serve::ConnectionGauges;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::access::Caller;

/// The access log's tracing target: `RUST_LOG=info,disbatch_web::access=off` silences it.
pub const ACCESS_TARGET: &str = "disbatch_web::access";
/// The `route` of requests no route matched (404s of unknown paths).
pub const UNMATCHED: &str = "unmatched";
/// Status labels are classes: bounded, and every route's can start at 0.
const STATUS_CLASSES: &[&str] = &["2xx", "3xx", "4xx", "5xx"];
/// Most answers take milliseconds; task searches and GridFS output can take seconds.
const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The DCI's own counters, kept for the life of the process; clones share them.
#[derive(Clone)]
pub struct WebMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    connections: ConnectionGauges,
}

impl WebMetrics {
    /// Metrics whose request counters start at 0 for each of `routes` (method, template).
    pub fn new(routes: &[(Method, &'static str)]) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "disbatch_web_http_requests_total",
                "HTTP requests answered, by method, route template (unmatched: no route) and \
                 status class (2xx, 3xx, 4xx, 5xx)",
            ),
            &["method", "route", "status"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "disbatch_web_http_request_duration_seconds",
                "Time from a request's arrival to its answer's headers, by method and route \
                 template (a streamed body may take longer)",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["method", "route"],
        )?;
        registry.register(Box::new(duration.clone()))?;
        disbatch_serve::ops_metrics::register(&registry)?;
        let connections = ConnectionGauges::new("web")?;
        connections.register(&registry)?;
        for (method, route) in routes {
            for status in STATUS_CLASSES {
                requests.get_metric_with_label_values(&[method.as_str(), route, status])?;
            }
        }
        Ok(WebMetrics {
            inner: Arc::new(Inner {
                registry,
                requests,
                duration,
                connections,
            }),
        })
    }

    /// The listener's connection gauges, for the accept loop to keep.
    pub fn connections(&self) -> ConnectionGauges {
        self.inner.connections.clone()
    }

    pub fn observe(&self, method: &str, route: &str, status: u16, took: Duration) {
        let class = match status {
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        if let Ok(c) = self
            .inner
            .requests
            .get_metric_with_label_values(&[method, route, class])
        {
            c.inc();
        }
        if let Ok(h) = self
            .inner
            .duration
            .get_metric_with_label_values(&[method, route])
        {
            h.observe(took.as_secs_f64());
        }
    }

    /// The exposition text of these metrics, build and process ones included.
    pub fn render(&self) -> prometheus::Result<String> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.inner.registry.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// A method as a label: HTTP's standard ones by name, any other `other`.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: &[Method] = &[
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    KNOWN
        .iter()
        .find(|m| *m == method)
        .map_or("other", |m| m.as_str())
}

/// Router middleware, outermost: counts and logs every answer, refusals included. The
/// token's name comes from the answer (the gate puts the caller there); the token itself is
/// never seen here.
pub async fn observe(State(metrics): State<WebMetrics>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = method_label(req.method());
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let path = shown(req.uri().path()).into_owned();
    let response = next.run(req).await;
    let took = started.elapsed();
    let status = response.status().as_u16();
    let route = route.as_deref().unwrap_or(UNMATCHED);
    metrics.observe(method, route, status, took);
    let token = match response.extensions().get::<Caller>() {
        Some(Caller::Token { name, .. }) => shown(name).into_owned(),
        Some(Caller::Open) => "open".to_string(),
        None => "-".to_string(),
    };
    tracing::info!(
        target: ACCESS_TARGET,
        method,
        path = %path,
        route,
        status,
        duration_ms = took.as_secs_f64() * 1000.0,
        token = %token,
        "request"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_start_at_zero_and_labels_stay_bounded() {
        let m = WebMetrics::new(&[(Method::GET, "/tasks/{id}")]).expect("metrics");
        let ext = Method::from_bytes(b"FROBNICATE").expect("method");
        m.observe(method_label(&ext), UNMATCHED, 404, Duration::from_millis(2));
        m.observe("GET", "/tasks/{id}", 200, Duration::from_millis(2));
        let text = m.render().expect("render");
        for line in [
            "disbatch_web_http_requests_total{method=\"GET\",route=\"/tasks/{id}\",status=\"2xx\"} 1",
            "disbatch_web_http_requests_total{method=\"GET\",route=\"/tasks/{id}\",status=\"5xx\"} 0",
            "disbatch_web_http_requests_total{method=\"other\",route=\"unmatched\",status=\"4xx\"} 1",
            "disbatch_web_http_request_duration_seconds_count{method=\"GET\",route=\"/tasks/{id}\"} 1",
            "disbatch_listener_connections_open{listener=\"web\"} 0",
            "disbatch_listener_connections_open_max{listener=\"web\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(text.contains("disbatch_build_info{"), "{text}");
    }
}
