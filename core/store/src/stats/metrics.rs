//! What `GET /metrics` reports: tasks per queue and status group, queue threads, node liveness.

use crate::StatsStore;
use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};

use crate::error::{Error, Result};
use crate::GroupCounts;
use disbatch_model::fleet_time;
use disbatch_model::schema::{node, queue, NODES};
use disbatch_model::{parse_limit, status};

/// The status groups metrics count tasks in; `Other` is any status Disbatch does not define.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusGroup {
    Queued,
    Claimed,
    Running,
    Succeeded,
    /// Every status ≥ 2, as Disbatch counts failures.
    Failed,
    Terminated,
    Blocked,
    Cancelled,
    Orphaned,
    Other,
}

impl StatusGroup {
    pub const ALL: [StatusGroup; 10] = [
        StatusGroup::Queued,
        StatusGroup::Claimed,
        StatusGroup::Running,
        StatusGroup::Succeeded,
        StatusGroup::Failed,
        StatusGroup::Terminated,
        StatusGroup::Blocked,
        StatusGroup::Cancelled,
        StatusGroup::Orphaned,
        StatusGroup::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StatusGroup::Queued => "queued",
            StatusGroup::Claimed => "claimed",
            StatusGroup::Running => "running",
            StatusGroup::Succeeded => "succeeded",
            StatusGroup::Failed => "failed",
            StatusGroup::Terminated => "terminated",
            StatusGroup::Blocked => "blocked",
            StatusGroup::Cancelled => "cancelled",
            StatusGroup::Orphaned => "orphaned",
            StatusGroup::Other => "other",
        }
    }

    /// The group of a stored `status`; hand-edited documents may hold any type, or none.
    pub fn of(value: Option<&Bson>) -> StatusGroup {
        let code = match value {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Double(d)) if d.fract() == 0.0 && d.abs() < 1e15 => *d as i64,
            _ => return StatusGroup::Other,
        };
        match code {
            c if c >= i64::from(status::FAILED) => StatusGroup::Failed,
            c if c == i64::from(status::SUCCEEDED) => StatusGroup::Succeeded,
            c if c == i64::from(status::RUNNING) => StatusGroup::Running,
            c if c == i64::from(status::CLAIMED) => StatusGroup::Claimed,
            c if c == i64::from(status::QUEUED) => StatusGroup::Queued,
            c if c == i64::from(status::TERMINATED) => StatusGroup::Terminated,
            c if c == i64::from(status::BLOCKED) => StatusGroup::Blocked,
            c if c == i64::from(status::CANCELLED) => StatusGroup::Cancelled,
            c if c == i64::from(status::ORPHANED) => StatusGroup::Orphaned,
            _ => StatusGroup::Other,
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// One queue's figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMetrics {
    pub id: ObjectId,
    /// The queue's name; its id in hex when the name is missing or not a string, so every
    /// queue has a distinct label.
    pub name: String,
    /// `threads` (or Coordinate's `max_running`) as the claimer reads it, unset being 0;
    /// `None` when it cannot be read.
    pub threads: Option<u32>,
    tasks: GroupCounts,
    /// Queued tasks waiting out a retry's backoff.
    pub retrying: u64,
}

impl QueueMetrics {
    pub fn tasks(&self, group: StatusGroup) -> u64 {
        self.tasks.get(group)
    }

    /// Of the failed tasks, those given up on.
    pub fn discarded(&self) -> u64 {
        self.tasks.discarded()
    }
}

/// Every queue's figures and the node counts, read in one round of concurrent queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetMetrics {
    /// In the order of the queue documents.
    pub queues: Vec<QueueMetrics>,
    pub nodes: u64,
    /// Nodes whose heartbeat is at most `live_window` old (as `GET /nodes` computes `live`).
    pub nodes_live: u64,
}

/// Every queue document with its tasks' counts: what `/queues`, `/summary` and `/metrics`
/// show, read once and shared by all three.
#[derive(Debug, Clone, Default)]
pub struct CountsReading {
    /// In natural order.
    pub queues: Vec<bson::Document>,
    pub groups: HashMap<ObjectId, GroupCounts>,
    /// Queued tasks whose `not_before` is ahead, per queue.
    pub delayed: HashMap<ObjectId, u64>,
    /// Of those, the ones waiting out a retry's backoff.
    pub retrying: HashMap<ObjectId, u64>,
}

impl CountsReading {
    pub fn counts(&self, queue: ObjectId) -> GroupCounts {
        self.groups.get(&queue).copied().unwrap_or_default()
    }

    pub fn retrying(&self, queue: ObjectId) -> u64 {
        self.retrying.get(&queue).copied().unwrap_or(0)
    }
}

impl StatsStore<'_> {
    /// Queue documents, then their counts (kept counts, live claimed and running, delayed):
    /// a handful of reads whatever the number of tasks.
    pub async fn counts_reading(self) -> Result<CountsReading> {
        let queues = self.queues().queue_documents().await?;
        let ids: Vec<ObjectId> = queues
            .iter()
            .filter_map(|d| d.get_object_id(queue::ID).ok())
            .collect();
        let (groups, delayed, retrying) = futures::try_join!(
            self.tasks().task_counts(&ids),
            self.delayed_counts(&ids),
            self.tasks().retrying_counts(&ids)
        )?;
        Ok(CountsReading {
            queues,
            groups,
            delayed,
            retrying,
        })
    }

    /// The metrics of a reading, with two node counts read now. Tasks of deleted queues are
    /// not reported: no queue carries them.
    pub async fn fleet_metrics(
        self,
        reading: &CountsReading,
        live_window: Duration,
    ) -> Result<FleetMetrics> {
        let window = i64::try_from(live_window.as_millis()).unwrap_or(i64::MAX);
        let since =
            DateTime::from_millis(fleet_time::now().timestamp_millis().saturating_sub(window));
        let nodes = self.collection(NODES);
        let (total, live) = futures::try_join!(
            async {
                nodes
                    .count_documents(doc! {})
                    .await
                    .map_err(|e| Error::mongo("counting nodes", e))
            },
            async {
                nodes
                    .count_documents(doc! {node::TIMESTAMP: {"$gte": since}})
                    .await
                    .map_err(|e| Error::mongo("counting live nodes", e))
            },
        )?;
        let queues = reading
            .queues
            .iter()
            .filter_map(|d| {
                let id = d.get_object_id(queue::ID).ok()?;
                let name = match d.get(queue::NAME) {
                    Some(Bson::String(s)) => s.clone(),
                    _ => id.to_hex(),
                };
                let cap = d.get(queue::THREADS).or_else(|| d.get(queue::MAX_RUNNING));
                Some(QueueMetrics {
                    id,
                    name,
                    threads: parse_limit(cap).ok().map(|t| t.unwrap_or(0)),
                    tasks: reading.counts(id),
                    retrying: reading.retrying(id),
                })
            })
            .collect();
        Ok(FleetMetrics {
            queues,
            nodes: total,
            nodes_live: live,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_fall_into_their_groups() {
        let group = |b: Bson| StatusGroup::of(Some(&b));
        assert_eq!(group(Bson::Int32(-2)), StatusGroup::Queued);
        assert_eq!(group(Bson::Int64(-1)), StatusGroup::Claimed);
        assert_eq!(group(Bson::Double(0.0)), StatusGroup::Running);
        assert_eq!(group(Bson::Int32(1)), StatusGroup::Succeeded);
        assert_eq!(group(Bson::Int32(2)), StatusGroup::Failed);
        assert_eq!(group(Bson::Int64(255)), StatusGroup::Failed);
        assert_eq!(group(Bson::Int32(-3)), StatusGroup::Terminated);
        assert_eq!(group(Bson::Int32(-4)), StatusGroup::Blocked);
        assert_eq!(group(Bson::Int32(-5)), StatusGroup::Cancelled);
        assert_eq!(group(Bson::Int32(-6)), StatusGroup::Orphaned);
        assert_eq!(group(Bson::Int32(-7)), StatusGroup::Other);
        assert_eq!(group(Bson::Double(1.5)), StatusGroup::Other);
        assert_eq!(group(Bson::Double(f64::NAN)), StatusGroup::Other);
        assert_eq!(group(Bson::String("1".into())), StatusGroup::Other);
        assert_eq!(StatusGroup::of(None), StatusGroup::Other);
    }

    #[test]
    fn every_group_has_its_own_index_and_label() {
        for (i, g) in StatusGroup::ALL.into_iter().enumerate() {
            assert_eq!(g.index(), i, "{g:?}");
        }
        let mut labels: Vec<&str> = StatusGroup::ALL.iter().map(|g| g.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), StatusGroup::ALL.len());
    }
}
