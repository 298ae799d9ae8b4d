//! `GET /stats`: the per-minute statistics the maintenance leader keeps, for the charts.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::RawQuery;
use axum::http::HeaderValue;
use axum::response::Response;
use bson::oid::ObjectId;
use disbatch_model::fleet_time;
use disbatch_store::StoredBucket;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::json_stream;
use crate::namespace::Ns;
use crate::render::json_response;

/// A week: as far back as statistics are kept.
pub const MAX_MINUTES: u64 = 7 * 24 * 60;
const DEFAULT_MINUTES: u64 = 60;
/// The most buckets one answer holds; beyond it the oldest minutes are left out and
/// `X-Disbatch-Truncated` says so. A day of one queue and the fleet fits.
pub const MAX_BUCKETS: usize = 20_000;
/// The most bytes of JSON one answer holds (a bucket grows with the nodes that ran its
/// queue): beyond it the oldest minutes are left out and `X-Disbatch-Truncated` says so.
/// A week of the fleet's buckets with 20 nodes each fits.
pub const MAX_BYTES: usize = 16 * 1024 * 1024;

/// `?minutes=N&queue=Q`.
#[derive(Debug, PartialEq, Eq)]
struct StatsQuery {
    minutes: u64,
    queue: Option<String>,
}

fn parse_query(query: Option<&str>) -> ApiResult<StatsQuery> {
    let mut q = StatsQuery {
        minutes: DEFAULT_MINUTES,
        queue: None,
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "minutes" => {
                q.minutes = v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (1..=MAX_MINUTES).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "minutes must be a whole number from 1 to {MAX_MINUTES}"
                        ))
                    })?;
            }
            "queue" if v.is_empty() => {
                return Err(ApiError::bad_request("queue must not be empty"));
            }
            "queue" => q.queue = Some(v.into_owned()),
            _ => {}
        }
    }
    Ok(q)
}

/// Two reads, both streamed: the first, newest minute first, measures each bucket's JSON to
/// find the oldest minute that fits the answer's bounds (so the truncation header is known
/// before the first byte); the second sends those minutes, oldest first.
pub async fn get(Ns(state): Ns, RawQuery(query): RawQuery) -> ApiResult<Response> {
    let q = parse_query(query.as_deref())?;
    let queue = match &q.queue {
        Some(ident) => Some(super::queues::find_id(&state, ident).await?),
        None => None,
    };
    let window_ms = i64::try_from(q.minutes * 60_000).unwrap_or(i64::MAX);
    let from = fleet_time::now()
        .timestamp_millis()
        .saturating_sub(window_ms);
    let names: Arc<HashMap<ObjectId, String>> =
        Arc::new(state.store.queues().queue_names_by_id().await?);
    let mut measured = state
        .store
        .stats()
        .stream_stats((from, None), queue, true, 0)
        .await?;
    let mut fit = Fit::default();
    while let Some(d) = measured.next().await.transpose()? {
        let b = StoredBucket::read(&d);
        let size = json_len(&bucket_json(&b, &names));
        if !fit.add(minute_ms(&b), size) {
            break;
        }
    }
    drop(measured);
    let (kept, cut) = fit.finish();
    let mut response = match kept {
        None => json_response(&Value::Array(Vec::new()), false),
        Some(kept) => {
            let rows = state
                .store
                .stats()
                .stream_stats((kept.oldest, Some(kept.newest)), queue, false, kept.buckets)
                .await?
                .map(move |d| {
                    d.map(|d| bucket_json(&StoredBucket::read(&d), &names))
                        .map_err(ApiError::from)
                });
            json_stream::array_response(rows, false)
        }
    };
    if cut {
        response
            .headers_mut()
            .insert("x-disbatch-truncated", HeaderValue::from_static("true"));
    }
    Ok(response)
}

fn minute_ms(b: &StoredBucket) -> i64 {
    b.minute_ms.unwrap_or(i64::MIN)
}

/// The length of a value's compact JSON, as the answer sends it.
fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

/// The minutes an answer keeps, whole ones only, newest first: `oldest..=newest` and how many
/// buckets they hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kept {
    oldest: i64,
    newest: i64,
    buckets: i64,
}

/// Buckets measured newest minute first, grouped by minute: a minute is kept whole while the
/// answer stays within `MAX_BYTES` and `MAX_BUCKETS`.
#[derive(Debug, Default)]
struct Fit {
    kept: Option<Kept>,
    /// `[` and `]`, the separators and the kept buckets' JSON.
    bytes: usize,
    /// The minute being measured: its start, buckets and bytes (each with its separator).
    minute: Option<(i64, i64, usize)>,
    cut: bool,
}

impl Fit {
    /// Adds one bucket; false once the answer is full (the rest are left out).
    fn add(&mut self, minute: i64, size: usize) -> bool {
        match self.minute {
            Some((m, n, b)) if m == minute => self.minute = Some((m, n + 1, b + size + 1)),
            _ => {
                if !self.close_minute() {
                    return false;
                }
                self.minute = Some((minute, 1, size + 1));
            }
        }
        true
    }

    /// Keeps the minute being measured if it fits; false (and cut) when it does not.
    fn close_minute(&mut self) -> bool {
        let Some((m, n, b)) = self.minute.take() else {
            return true;
        };
        let buckets = self.kept.map_or(0, |k| k.buckets) + n;
        let bytes = self.bytes.max(1) + b;
        if bytes > MAX_BYTES || usize::try_from(buckets).unwrap_or(usize::MAX) > MAX_BUCKETS {
            self.cut = true;
            return false;
        }
        self.bytes = bytes;
        self.kept = Some(Kept {
            oldest: m,
            newest: self.kept.map_or(m, |k| k.newest),
            buckets,
        });
        true
    }

    fn finish(mut self) -> (Option<Kept>, bool) {
        if !self.cut {
            self.close_minute();
        }
        (self.kept, self.cut)
    }
}

/// One stored bucket as the API shows it; fields a hand edit broke read as 0 or null
/// (`StoredBucket::read`).
fn bucket_json(b: &StoredBucket, names: &HashMap<ObjectId, String>) -> Value {
    let nodes: Vec<Value> = b
        .nodes
        .iter()
        .map(|n| json!({"node": n.node, "succeeded": n.succeeded, "failed": n.failed, "lost": n.lost}))
        .collect();
    json!({
        "minute": b.minute_ms.map(|t| t.div_euclid(1000)).unwrap_or(0),
        // A deleted queue's buckets keep its id as their name.
        "queue": b.queue.map(|id| names.get(&id).cloned().unwrap_or_else(|| id.to_hex())),
        "queue_id": b.queue.map(|id| id.to_hex()),
        "succeeded": b.succeeded,
        "failed": b.failed,
        "lost": b.lost,
        "cancelled": b.cancelled,
        "other": b.other,
        "queued": b.queued,
        "running": b.running,
        "mean_ms": b.mean_ms,
        "p95_ms": b.p95_ms,
        "nodes": nodes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_default_to_an_hour_and_are_bounded() {
        assert_eq!(
            parse_query(None).expect("ok"),
            StatsQuery {
                minutes: 60,
                queue: None
            }
        );
        let q = parse_query(Some("minutes=10080&queue=a%20b")).expect("ok");
        assert_eq!(
            q,
            StatsQuery {
                minutes: 10080,
                queue: Some("a b".into())
            }
        );
        for bad in [
            "minutes=0",
            "minutes=10081",
            "minutes=-1",
            "minutes=x",
            "minutes=",
            "minutes=1.5",
            "queue=",
        ] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn whole_newest_minutes_are_kept_within_the_bytes() {
        let mut fit = Fit::default();
        // Newest first: minute 3 (two buckets), minute 2 (two), minute 1 (one).
        for (minute, size) in [(3, 1000), (3, 1000), (2, 1000), (2, MAX_BYTES)] {
            assert!(fit.add(minute, size));
        }
        assert!(!fit.add(1, 10), "minute 2 does not fit: the rest is cut");
        assert_eq!(
            fit.finish(),
            (
                Some(Kept {
                    oldest: 3,
                    newest: 3,
                    buckets: 2
                }),
                true
            )
        );
        let mut fit = Fit::default();
        for (minute, size) in [(2, 10), (1, 20)] {
            assert!(fit.add(minute, size));
        }
        assert_eq!(
            fit.finish(),
            (
                Some(Kept {
                    oldest: 1,
                    newest: 2,
                    buckets: 2
                }),
                false
            )
        );
        assert_eq!(Fit::default().finish(), (None, false));
    }

    #[test]
    fn a_broken_bucket_reads_as_zeros_and_nulls() {
        let d = bson::doc! {"minute": "soon", "succeeded": "many", "queued": -3_i64, "mean_ms": f64::NAN, "nodes": [{"node": 1}, {"node": "n", "failed": 2}]};
        let v = bucket_json(&StoredBucket::read(&d), &HashMap::new());
        assert_eq!(v["minute"], 0);
        assert_eq!(v["succeeded"], 0);
        assert_eq!(v["queued"], 0);
        assert_eq!(v["mean_ms"], Value::Null);
        assert_eq!(v["queue"], Value::Null);
        assert_eq!(
            v["nodes"],
            json!([{"node": "n", "succeeded": 0, "failed": 2, "lost": 0}])
        );
    }
}
