//! Per-minute statistics: attempts that ended in a minute counted into buckets per queue and
//! node, written once per minute and queue, and read back for charts; `metrics`, the fleet's
//! counts read for the metrics endpoints.

domain_handle!(
    /// Statistics: per-minute buckets written and read, and the fleet's metrics.
    StatsStore,
    stats
);

pub(crate) mod metrics;
pub(crate) mod stored;

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use super::conn::decode::DocumentStream;
use crate::error::{Error, Result};
use disbatch_model::schema::{attempt, stats, ATTEMPTS, STATS_MINUTELY};
use disbatch_model::task::Outcome;

/// Buckets per batch of a read: a bucket holds a line per node, and a week of them must not
/// sit in memory at once (the server's own batches reach 16 MiB).
const STATS_BATCH: u32 = 256;

/// What the statistics need of one ended attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct EndedAttempt {
    pub queue: Option<ObjectId>,
    pub node: Option<String>,
    pub outcome: String,
    pub end_ms: i64,
    /// From start to end; None when the record has no usable start.
    pub duration_ms: Option<i64>,
}

/// Attempts by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcomes {
    pub succeeded: u64,
    pub failed: u64,
    pub lost: u64,
    pub cancelled: u64,
    pub other: u64,
}

impl Outcomes {
    fn add(&mut self, outcome: &str) {
        match Outcome::parse(outcome) {
            Some(Outcome::Succeeded) => self.succeeded += 1,
            // A retry is a failed attempt whose task will run again.
            Some(Outcome::Failed | Outcome::Retry | Outcome::TimedOut) => self.failed += 1,
            Some(Outcome::Lost) => self.lost += 1,
            Some(Outcome::Cancelled) => self.cancelled += 1,
            Some(Outcome::Discarded) | None => self.other += 1,
        }
    }
}

/// One node's share of a bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounts {
    pub node: String,
    pub succeeded: u64,
    pub failed: u64,
    pub lost: u64,
}

/// One minute of one queue (or of the fleet, `queue: None`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bucket {
    /// The bucket's start, in milliseconds since the epoch.
    pub minute_ms: i64,
    pub queue: Option<ObjectId>,
    pub outcomes: Outcomes,
    pub queued: Option<u64>,
    pub running: Option<u64>,
    pub mean_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    /// Sorted by node name.
    pub nodes: Vec<NodeCounts>,
}

/// The 95th percentile by nearest rank (the smallest value at or above 95 % of them), so it
/// is always a duration some attempt took; None for no values.
pub fn p95(values: &mut [i64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank = (values.len() * 95).div_ceil(100).max(1);
    Some(values[rank - 1] as f64)
}

/// Counts, durations and nodes of the attempts that ended in one bucket
/// `[minute_ms, minute_ms + width)`: one bucket per queue seen, then the fleet's (always, as
/// it marks the minute done). Attempts outside the bucket are ignored.
pub fn bucket_attempts(attempts: &[EndedAttempt], minute_ms: i64, width_ms: i64) -> Vec<Bucket> {
    #[derive(Default)]
    struct Acc {
        outcomes: Outcomes,
        durations: Vec<i64>,
        nodes: BTreeMap<String, NodeCounts>,
    }
    let mut by_queue: BTreeMap<Option<ObjectId>, Acc> = BTreeMap::new();
    let end = minute_ms.saturating_add(width_ms);
    for a in attempts
        .iter()
        .filter(|a| a.end_ms >= minute_ms && a.end_ms < end)
    {
        let mut keys = vec![None];
        if a.queue.is_some() {
            keys.push(a.queue);
        }
        for key in keys {
            let acc = by_queue.entry(key).or_default();
            acc.outcomes.add(&a.outcome);
            // A lost attempt's end is when recovery noticed, not when it stopped running.
            if let Some(d) = a
                .duration_ms
                .filter(|d| *d >= 0 && a.outcome != Outcome::Lost.as_str())
            {
                acc.durations.push(d);
            }
            if let Some(node) = &a.node {
                let n = acc.nodes.entry(node.clone()).or_insert_with(|| NodeCounts {
                    node: node.clone(),
                    ..NodeCounts::default()
                });
                let mut one = Outcomes::default();
                one.add(&a.outcome);
                n.succeeded += one.succeeded;
                n.failed += one.failed;
                n.lost += one.lost;
            }
        }
    }
    by_queue.entry(None).or_default();
    let mut out: Vec<Bucket> = by_queue
        .into_iter()
        .map(|(queue, mut acc)| Bucket {
            minute_ms,
            queue,
            outcomes: acc.outcomes,
            queued: None,
            running: None,
            mean_ms: mean(&acc.durations),
            p95_ms: p95(&mut acc.durations),
            nodes: acc.nodes.into_values().collect(),
        })
        .collect();
    // The fleet's bucket (the `None` key, first in order) goes last: it is written last.
    out.rotate_left(1);
    out
}

fn mean(values: &[i64]) -> Option<f64> {
    (!values.is_empty())
        .then(|| values.iter().map(|v| *v as f64).sum::<f64>() / values.len() as f64)
}

/// Adds the present depth of each queue (`(queued, running)` by queue) to a minute's buckets,
/// making buckets for queues with tasks but no ended attempts, and the fleet's sums.
pub fn add_depths(buckets: &mut Vec<Bucket>, depths: &BTreeMap<ObjectId, (u64, u64)>) {
    let Some(minute_ms) = buckets.first().map(|b| b.minute_ms) else {
        return;
    };
    let fleet = buckets.pop().filter(|b| b.queue.is_none());
    for (queue, (queued, running)) in depths {
        match buckets.iter_mut().find(|b| b.queue == Some(*queue)) {
            Some(b) => (b.queued, b.running) = (Some(*queued), Some(*running)),
            None if queued + running > 0 => buckets.push(Bucket {
                minute_ms,
                queue: Some(*queue),
                queued: Some(*queued),
                running: Some(*running),
                ..Bucket::default()
            }),
            None => {}
        }
    }
    let mut fleet = fleet.unwrap_or(Bucket {
        minute_ms,
        ..Bucket::default()
    });
    fleet.queued = Some(depths.values().map(|d| d.0).sum());
    fleet.running = Some(depths.values().map(|d| d.1).sum());
    buckets.push(fleet);
}

impl Bucket {
    fn document(&self, writer: &str) -> Document {
        let opt_u = |v: Option<u64>| v.map_or(Bson::Null, |n| Bson::Int64(n as i64));
        let opt_f = |v: Option<f64>| v.map_or(Bson::Null, Bson::Double);
        let nodes: Vec<Bson> = self
            .nodes
            .iter()
            .map(|n| {
                Bson::Document(doc! {
                    stats::NODE: &n.node, stats::SUCCEEDED: n.succeeded as i64,
                    stats::FAILED: n.failed as i64, stats::LOST: n.lost as i64,
                })
            })
            .collect();
        let o = &self.outcomes;
        doc! {
            stats::MINUTE: DateTime::from_millis(self.minute_ms),
            stats::QUEUE: self.queue.map_or(Bson::Null, Bson::ObjectId),
            stats::SUCCEEDED: o.succeeded as i64, stats::FAILED: o.failed as i64,
            stats::LOST: o.lost as i64, stats::CANCELLED: o.cancelled as i64,
            stats::OTHER: o.other as i64,
            stats::QUEUED: opt_u(self.queued), stats::RUNNING: opt_u(self.running),
            stats::MEAN_MS: opt_f(self.mean_ms), stats::P95_MS: opt_f(self.p95_ms),
            stats::NODES: nodes, stats::WRITER: writer,
        }
    }
}

impl StatsStore<'_> {
    /// The start of the last minute the keeper finished (its fleet bucket), in milliseconds.
    pub async fn stats_written_until(self) -> Result<Option<i64>> {
        let last = self
            .collection(STATS_MINUTELY)
            .find_one(doc! {stats::QUEUE: Bson::Null})
            .sort(doc! {stats::MINUTE: -1})
            .projection(doc! {stats::MINUTE: 1})
            .await
            .map_err(|e| Error::mongo("reading the last statistics minute", e))?;
        Ok(last.and_then(|d| {
            d.get_datetime(stats::MINUTE)
                .ok()
                .map(|t| t.timestamp_millis())
        }))
    }

    /// The attempts whose record ended in `[from_ms, to_ms)`; undecodable records are left out.
    pub async fn ended_attempts(self, from_ms: i64, to_ms: i64) -> Result<Vec<EndedAttempt>> {
        let context = "reading ended attempts for statistics";
        let cursor = self
            .raw(ATTEMPTS)
            .find(doc! {attempt::END: {
                "$gte": DateTime::from_millis(from_ms), "$lt": DateTime::from_millis(to_ms),
            }})
            .projection(doc! {
                attempt::QUEUE: 1, attempt::NODE: 1, attempt::OUTCOME: 1,
                attempt::START: 1, attempt::END: 1,
            })
            .await
            .map_err(|e| Error::mongo(context, e))?;
        let docs = self.read_all(ATTEMPTS, cursor, context).await?;
        Ok(docs.iter().filter_map(ended_attempt).collect())
    }

    /// Writes a minute's buckets, each only if its minute and queue have none yet: whichever
    /// leader writes a bucket first, it is never written again.
    pub async fn write_stats(self, buckets: &[Bucket], writer: &str) -> Result<()> {
        let coll = self.collection(STATS_MINUTELY);
        for b in buckets {
            let filter = doc! {
                stats::MINUTE: DateTime::from_millis(b.minute_ms),
                stats::QUEUE: b.queue.map_or(Bson::Null, Bson::ObjectId),
            };
            let result = coll
                .update_one(filter, doc! {"$setOnInsert": b.document(writer)})
                .upsert(true)
                .await;
            match result {
                Ok(_) => {}
                // Another writer inserted it between our look and our insert.
                Err(e) if crate::driver_error::is_duplicate_key(&e) => {}
                Err(e) => return Err(Error::mongo("writing statistics", e)),
            }
        }
        Ok(())
    }

    /// Buckets of minutes `[from_ms, to_ms]` (`to_ms` None: to now), of one queue or of all
    /// (`None`: every queue's and the fleet's), newest minute first or oldest first, at most
    /// `limit` (0: no limit), one at a time as the caller takes them, with the fields the API
    /// shows only.
    pub async fn stream_stats(
        self,
        minutes: (i64, Option<i64>),
        queue: Option<ObjectId>,
        newest_first: bool,
        limit: i64,
    ) -> Result<DocumentStream> {
        let (from_ms, to_ms) = minutes;
        let mut range = doc! {"$gte": DateTime::from_millis(from_ms)};
        if let Some(to) = to_ms {
            range.insert("$lte", DateTime::from_millis(to));
        }
        let mut filter = doc! {stats::MINUTE: range};
        if let Some(q) = queue {
            filter.insert(stats::QUEUE, q);
        }
        // The answer's order, oldest minute first, is the reverse of the newest-first one.
        let order = if newest_first { (-1, 1) } else { (1, -1) };
        let node = |f: &str| format!("{}.{f}", stats::NODES);
        let mut projection: Document = [
            stats::MINUTE,
            stats::QUEUE,
            stats::SUCCEEDED,
            stats::FAILED,
            stats::LOST,
            stats::CANCELLED,
            stats::OTHER,
            stats::QUEUED,
            stats::RUNNING,
            stats::MEAN_MS,
            stats::P95_MS,
        ]
        .iter()
        .map(|f| (f.to_string(), Bson::Int32(1)))
        .collect();
        for f in [stats::NODE, stats::SUCCEEDED, stats::FAILED, stats::LOST] {
            projection.insert(node(f), 1);
        }
        let context = "reading statistics";
        let cursor = self
            .raw(STATS_MINUTELY)
            .find(filter)
            .sort(doc! {stats::MINUTE: order.0, stats::QUEUE: order.1})
            .projection(projection)
            .limit(limit)
            .batch_size(STATS_BATCH)
            .await
            .map_err(|e| Error::mongo(context, e))?;
        Ok(self.decoded_stream(STATS_MINUTELY, cursor, context.to_string()))
    }
}

/// An attempt record as the statistics read it; None without an end or an outcome.
fn ended_attempt(d: &Document) -> Option<EndedAttempt> {
    let end = d.get_datetime(attempt::END).ok()?.timestamp_millis();
    let start = d
        .get_datetime(attempt::START)
        .ok()
        .map(|t| t.timestamp_millis());
    Some(EndedAttempt {
        queue: d.get_object_id(attempt::QUEUE).ok(),
        node: d.get_str(attempt::NODE).ok().map(str::to_string),
        outcome: d.get_str(attempt::OUTCOME).ok()?.to_string(),
        end_ms: end,
        duration_ms: start.map(|s| end.saturating_sub(s)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(
        queue: Option<ObjectId>,
        node: &str,
        outcome: &str,
        end_ms: i64,
        d: i64,
    ) -> EndedAttempt {
        EndedAttempt {
            queue,
            node: Some(node.to_string()),
            outcome: outcome.to_string(),
            end_ms,
            duration_ms: Some(d),
        }
    }

    #[test]
    fn p95_is_the_nearest_rank() {
        assert_eq!(p95(&mut []), None);
        assert_eq!(p95(&mut [7]), Some(7.0));
        let mut hundred: Vec<i64> = (1..=100).rev().collect();
        assert_eq!(p95(&mut hundred), Some(95.0));
        let mut twenty: Vec<i64> = (1..=20).collect();
        assert_eq!(p95(&mut twenty), Some(19.0));
        assert_eq!(p95(&mut [10, 1000]), Some(1000.0));
    }

    #[test]
    fn attempts_fall_into_their_queue_and_the_fleet() {
        let (a, b) = (ObjectId::new(), ObjectId::new());
        let (lo, hi) = if a < b { (a, b) } else { (b, a) };
        let attempts = vec![
            ended(Some(lo), "n1", "succeeded", 60_000, 100),
            ended(Some(lo), "n2", "succeeded", 60_500, 300),
            ended(Some(lo), "n1", "retry", 61_000, 200),
            ended(Some(hi), "n1", "lost", 119_999, 50_000),
            ended(Some(hi), "n1", "timed_out", 100_000, 400),
            ended(None, "n3", "cancelled", 70_000, 10),
            // Outside the bucket.
            ended(Some(lo), "n1", "succeeded", 120_000, 1),
            ended(Some(lo), "n1", "succeeded", 59_999, 1),
        ];
        let out = bucket_attempts(&attempts, 60_000, 60_000);
        assert_eq!(out.len(), 3);
        let (q1, q2, fleet) = (&out[0], &out[1], &out[2]);
        assert_eq!(q1.queue, Some(lo));
        assert_eq!((q1.outcomes.succeeded, q1.outcomes.failed), (2, 1));
        assert_eq!(q1.mean_ms, Some(200.0));
        assert_eq!(q1.p95_ms, Some(300.0));
        assert_eq!(q1.nodes.len(), 2);
        assert_eq!(q1.nodes[0].node, "n1");
        assert_eq!((q1.nodes[0].succeeded, q1.nodes[0].failed), (1, 1));
        assert_eq!(q2.queue, Some(hi));
        assert_eq!((q2.outcomes.lost, q2.outcomes.failed), (1, 1));
        // The lost attempt's "duration" is not one.
        assert_eq!(q2.mean_ms, Some(400.0));
        assert_eq!(fleet.queue, None);
        assert_eq!(fleet.minute_ms, 60_000);
        let o = fleet.outcomes;
        assert_eq!((o.succeeded, o.failed, o.lost, o.cancelled), (2, 2, 1, 1));
        assert_eq!(
            fleet
                .nodes
                .iter()
                .map(|n| n.node.as_str())
                .collect::<Vec<_>>(),
            ["n1", "n2", "n3"]
        );
    }

    #[test]
    fn an_empty_minute_still_has_its_fleet_bucket() {
        let out = bucket_attempts(&[], 0, 60_000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].queue, None);
        assert_eq!(out[0].mean_ms, None);
    }

    #[test]
    fn depths_add_idle_queues_with_tasks_and_sum_in_the_fleet() {
        let (busy, idle, empty) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let mut buckets = bucket_attempts(&[ended(Some(busy), "n", "succeeded", 5, 1)], 0, 60_000);
        let depths = BTreeMap::from([(busy, (3, 1)), (idle, (10, 0)), (empty, (0, 0))]);
        add_depths(&mut buckets, &depths);
        assert_eq!(buckets.len(), 3, "{buckets:?}");
        let of = |q: Option<ObjectId>| buckets.iter().find(|b| b.queue == q).expect("bucket");
        assert_eq!(
            (of(Some(busy)).queued, of(Some(busy)).running),
            (Some(3), Some(1))
        );
        assert_eq!(of(Some(idle)).queued, Some(10));
        let fleet = buckets.last().expect("fleet");
        assert_eq!(fleet.queue, None);
        assert_eq!((fleet.queued, fleet.running), (Some(13), Some(1)));
    }
}
