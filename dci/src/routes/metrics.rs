//! `GET /metrics`: tasks per queue and status, queue threads and node liveness for Prometheus.
//! Queue names are stored unchecked: each label is the name's `metric_label` (control and bidi
//! characters escaped, absurd lengths cut), so no scrape carries NUL or ESC.

use std::time::{Duration, Instant};

use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use disbatch_model::text::printable::metric_label;
use disbatch_store::{FleetMetrics, StatusGroup};
use prometheus::{Encoder, Gauge, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder};

use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;

/// Always 200 once the caller may read: a database failure is reported as `disbatch_up 0`, so
/// an alert can tell "the database is unreachable" from "the DCI is down" (no scrape at all).
pub async fn get(Ns(state): Ns) -> ApiResult<Response> {
    let started = Instant::now();
    let fleet = async {
        let reading = state.counts.get(&state.store).await?;
        state
            .store
            .stats()
            .fleet_metrics(&reading, state.config.web.live_window)
            .await
    };
    let fleet = match fleet.await {
        Ok(fleet) => Some(fleet),
        Err(e) => {
            tracing::warn!(error = %e, "metrics: cannot read the database");
            None
        }
    };
    let rendered = render(fleet.as_ref(), started.elapsed())
        .and_then(|text| Ok(text + &render_skips(&state.store.skipped_documents())?))
        .and_then(|text| Ok(text + &render_readings(state.counts.reads())?))
        .and_then(|text| Ok(text + &state.web_metrics.render()?));
    let text = rendered.map_err(|e| {
        ApiError::with(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering metrics: {e}"),
        )
    })?;
    Ok(([(CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response())
}

/// How many counts readings the shared reading made: with many viewers it grows by at most
/// one a second, however many tabs and scrapers ask.
fn render_readings(reads: u64) -> prometheus::Result<String> {
    let registry = Registry::new();
    let c = prometheus::IntCounter::with_opts(Opts::new(
        "disbatch_counts_readings_total",
        "Counts readings made for /queues, /summary and /metrics, shared by every viewer",
    ))?;
    registry.register(Box::new(c.clone()))?;
    c.inc_by(reads);
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

/// The exposition text; `None` means the database could not be read.
pub fn render(fleet: Option<&FleetMetrics>, took: Duration) -> prometheus::Result<String> {
    let registry = Registry::new();
    let up = gauge(
        &registry,
        "disbatch_up",
        "1 when the DCI could read the database for this scrape, else 0",
    )?;
    let duration = Gauge::with_opts(Opts::new(
        "disbatch_scrape_duration_seconds",
        "Time spent reading the database for this scrape",
    ))?;
    registry.register(Box::new(duration.clone()))?;
    duration.set(took.as_secs_f64());
    if let Some(fleet) = fleet {
        up.set(1);
        register_fleet(&registry, fleet)?;
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

/// The documents this process's reads left out (each also logged once), by collection and
/// reason; nothing when none were.
pub fn render_skips(
    skips: &[(&'static str, disbatch_store::SkipReason, u64)],
) -> prometheus::Result<String> {
    let registry = Registry::new();
    let skipped = prometheus::IntCounterVec::new(
        Opts::new(
            "disbatch_web_documents_skipped_total",
            "Documents this DCI's reads left out because they cannot be decoded, by collection \
             and reason; each is logged the first time",
        ),
        &["collection", "reason"],
    )?;
    registry.register(Box::new(skipped.clone()))?;
    for (collection, reason, n) in skips {
        skipped
            .get_metric_with_label_values(&[collection, reason.label()])?
            .inc_by(*n);
    }
    let mut out = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

fn register_fleet(registry: &Registry, fleet: &FleetMetrics) -> prometheus::Result<()> {
    let tasks = vec_gauge(
        registry,
        "disbatch_queue_tasks",
        "Tasks of a queue by status group: queued (-2), claimed (-1), running (0), succeeded (1), \
         failed (>= 2), terminated (-3), blocked (-4), cancelled (-5), orphaned (-6), other",
        &["queue", "status"],
    )?;
    let threads = vec_gauge(
        registry,
        "disbatch_queue_threads",
        "A queue's threads: how many of its tasks may run at once across the nodes (0: paused)",
        &["queue"],
    )?;
    let discarded = vec_gauge(
        registry,
        "disbatch_queue_tasks_discarded",
        "Of a queue's failed tasks, those given up on (discarded_at): out of attempts under its \
         retry policy, refused a retry, or discarded by hand",
        &["queue"],
    )?;
    let retrying = vec_gauge(
        registry,
        "disbatch_queue_tasks_retrying",
        "Of a queue's queued tasks, those waiting out a retry's backoff (they ran before and \
         their not_before is ahead)",
        &["queue"],
    )?;
    for q in &fleet.queues {
        let name = metric_label(&q.name);
        for group in StatusGroup::ALL {
            tasks
                .get_metric_with_label_values(&[&name, group.as_str()])?
                .set(saturating(q.tasks(group)));
        }
        discarded
            .get_metric_with_label_values(&[&name])?
            .set(saturating(q.discarded()));
        retrying
            .get_metric_with_label_values(&[&name])?
            .set(saturating(q.retrying));
        if let Some(t) = q.threads {
            threads
                .get_metric_with_label_values(&[&name])?
                .set(i64::from(t));
        }
    }
    gauge(registry, "disbatch_queues", "Queues defined")?
        .set(saturating(fleet.queues.len() as u64));
    gauge(
        registry,
        "disbatch_nodes",
        "Nodes that have ever sent a heartbeat",
    )?
    .set(saturating(fleet.nodes));
    gauge(
        registry,
        "disbatch_nodes_live",
        "Nodes whose heartbeat is within web.live_window_ms",
    )?
    .set(saturating(fleet.nodes_live));
    Ok(())
}

fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
    let g = IntGauge::with_opts(Opts::new(name, help))?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn vec_gauge(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<IntGaugeVec> {
    let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_database_only_up_zero_and_the_duration() {
        let text = render(None, Duration::from_millis(1500)).expect("render");
        assert!(text.contains("\ndisbatch_up 0\n"), "{text}");
        assert!(
            text.contains("\ndisbatch_scrape_duration_seconds 1.5\n"),
            "{text}"
        );
        assert!(!text.contains("disbatch_queue"), "{text}");
        assert!(!text.contains("disbatch_nodes"), "{text}");
    }

    #[test]
    fn an_empty_fleet_still_reports_up_and_zero_nodes() {
        let fleet = FleetMetrics {
            queues: Vec::new(),
            nodes: 0,
            nodes_live: 0,
        };
        let text = render(Some(&fleet), Duration::ZERO).expect("render");
        for line in [
            "disbatch_up 1",
            "disbatch_nodes 0",
            "disbatch_nodes_live 0",
            "disbatch_queues 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in {text}");
        }
        // A family with no samples is left out rather than sent as a bare TYPE line.
        assert!(!text.contains("disbatch_queue_tasks"), "{text}");
    }
}
