//! The node's periods and its default retention, each checked with its key named:
//! `loop_interval_ms`, `dead_node_after_s`, `stats_interval_s` and `retain`.

use std::time::Duration;

use serde_json::Value;

use super::{
    DEFAULT_DEAD_NODE_AFTER, DEFAULT_LOOP_INTERVAL, MAX_LOOP_INTERVAL, MIN_DEAD_NODE_AFTER,
    MIN_LOOP_INTERVAL,
};

pub(super) fn loop_interval(ms: Option<u64>) -> Result<Duration, String> {
    match ms {
        None => Ok(DEFAULT_LOOP_INTERVAL),
        Some(ms) if ms < MIN_LOOP_INTERVAL.as_millis() as u64 => Err(format!(
            "key `loop_interval_ms`: {ms} is below the minimum of {} ms",
            MIN_LOOP_INTERVAL.as_millis()
        )),
        Some(ms) if ms > MAX_LOOP_INTERVAL.as_millis() as u64 => Err(format!(
            "key `loop_interval_ms`: {ms} is above the maximum of {} ms",
            MAX_LOOP_INTERVAL.as_millis()
        )),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

pub(super) fn dead_node_after(seconds: Option<u64>) -> Result<Duration, String> {
    match seconds {
        None => Ok(DEFAULT_DEAD_NODE_AFTER),
        Some(s) if s < MIN_DEAD_NODE_AFTER.as_secs() => Err(format!(
            "key `dead_node_after_s`: {s} is below the minimum of {} s (a live node heartbeats every second; a busy one may be late)",
            MIN_DEAD_NODE_AFTER.as_secs()
        )),
        Some(s) => Ok(Duration::from_secs(s.min(365 * 24 * 3600))),
    }
}

/// The width of a statistics bucket: a minute, or (for tests, which cannot wait minutes) a
/// divisor of it, so buckets still tile each minute.
pub(super) fn stats_interval(seconds: Option<u64>) -> Result<Duration, String> {
    match seconds {
        None => Ok(super::DEFAULT_STATS_INTERVAL),
        Some(s) if s == 0 || s > 60 || 60 % s != 0 => Err(format!(
            "key `stats_interval_s`: {s} must divide 60 (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60)"
        )),
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

/// `retain`: the retention of queues that set none of their own (only the maintenance
/// leader's applies).
pub(super) fn retain(
    value: Option<&Value>,
) -> Result<disbatch_model::retention::Retention, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Default::default());
    };
    let bson = bson::Bson::try_from(value.clone()).map_err(|e| format!("key `retain`: {e}"))?;
    disbatch_model::retention::Retention::parse(&bson, "retain")
        .map_err(|e| format!("key `retain`: {e}"))
}
