//! A stored minute bucket read back for the API, tolerant of hand edits: a count that is not
//! an integer reads as 0 (a negative one too), a timing that is not a finite double as none.

use bson::oid::ObjectId;
use bson::{Bson, Document};
use disbatch_model::schema::stats;

/// One stored bucket as read.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredBucket {
    /// Its minute's start, in milliseconds; None when not a date.
    pub minute_ms: Option<i64>,
    /// Its queue; None for the fleet's totals (or an unreadable id).
    pub queue: Option<ObjectId>,
    pub succeeded: i64,
    pub failed: i64,
    pub lost: i64,
    pub cancelled: i64,
    pub other: i64,
    /// None for buckets written late, when only the present is known.
    pub queued: Option<i64>,
    pub running: Option<i64>,
    pub mean_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    /// Nodes with a string name, in stored order.
    pub nodes: Vec<StoredNode>,
}

/// One node's share of a stored bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredNode {
    pub node: String,
    pub succeeded: i64,
    pub failed: i64,
    pub lost: i64,
}

fn count(d: &Document, k: &str) -> i64 {
    match d.get(k) {
        Some(Bson::Int64(n)) => (*n).max(0),
        Some(Bson::Int32(n)) => i64::from(*n).max(0),
        _ => 0,
    }
}

fn maybe_count(d: &Document, k: &str) -> Option<i64> {
    matches!(d.get(k), Some(Bson::Int64(_) | Bson::Int32(_))).then(|| count(d, k))
}

fn ms(d: &Document, k: &str) -> Option<f64> {
    match d.get(k) {
        Some(Bson::Double(x)) if x.is_finite() => Some(*x),
        _ => None,
    }
}

impl StoredBucket {
    pub fn read(d: &Document) -> StoredBucket {
        let nodes = d
            .get_array(stats::NODES)
            .map(|a| a.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|n| {
                let n = n.as_document()?;
                Some(StoredNode {
                    node: n.get_str(stats::NODE).ok()?.to_string(),
                    succeeded: count(n, stats::SUCCEEDED),
                    failed: count(n, stats::FAILED),
                    lost: count(n, stats::LOST),
                })
            })
            .collect();
        StoredBucket {
            minute_ms: d
                .get_datetime(stats::MINUTE)
                .ok()
                .map(|t| t.timestamp_millis()),
            queue: d.get_object_id(stats::QUEUE).ok(),
            succeeded: count(d, stats::SUCCEEDED),
            failed: count(d, stats::FAILED),
            lost: count(d, stats::LOST),
            cancelled: count(d, stats::CANCELLED),
            other: count(d, stats::OTHER),
            queued: maybe_count(d, stats::QUEUED),
            running: maybe_count(d, stats::RUNNING),
            mean_ms: ms(d, stats::MEAN_MS),
            p95_ms: ms(d, stats::P95_MS),
            nodes,
        }
    }
}
