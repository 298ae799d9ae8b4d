//! Counts per queue in Coordinate's unit states (available, delayed, pending, finished, failed).

use crate::TaskStore;
use std::collections::HashMap;

use bson::doc;
use bson::oid::ObjectId;

use crate::error::Result;
use crate::{GroupCounts, StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::task;

/// One queue's units by state. `other` holds Disbatch's orphaned, cancelled, blocked and
/// terminated tasks, which Coordinate has no name for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub available: u64,
    pub delayed: u64,
    pub pending: u64,
    pub finished: u64,
    pub failed: u64,
    pub other: u64,
}

impl StateCounts {
    /// Coordinate's states from Disbatch's groups, with `delayed` of the queued tasks.
    pub fn from_groups(c: GroupCounts, delayed: u64) -> StateCounts {
        use StatusGroup as G;
        let queued = c.get(G::Queued);
        let delayed = delayed.min(queued);
        let known = [G::Queued, G::Claimed, G::Running, G::Succeeded, G::Failed];
        StateCounts {
            available: queued - delayed,
            delayed,
            pending: c.get(G::Claimed) + c.get(G::Running),
            finished: c.get(G::Succeeded),
            failed: c.get(G::Failed),
            other: c.total() - known.iter().map(|g| c.get(*g)).sum::<u64>(),
        }
    }
}

impl TaskStore<'_> {
    /// Of the delayed tasks, those waiting out a retry's backoff: they ran before (they
    /// carry an `attempt`), as Oban's "retryable" and Sidekiq's retry set. Read as
    /// `delayed_counts` is, through the `{queue, not_before}` index.
    pub async fn retrying_counts(self, queues: &[ObjectId]) -> Result<HashMap<ObjectId, u64>> {
        let now = fleet_time::now();
        let waiting = self
            .per_queue(queues, |q| {
                doc! {task::QUEUE: q, task::NOT_BEFORE: {"$gt": now}, task::ATTEMPT: {"$exists": true}}
            })
            .await?;
        Ok(waiting
            .into_iter()
            .map(|(q, c)| (q, c.get(StatusGroup::Queued)))
            .collect())
    }
}

impl Store {
    /// Queued tasks whose `not_before` is still ahead, per queue, read through the
    /// `{queue, not_before}` index, which holds only tasks that have one.
    pub(crate) async fn delayed_counts(
        &self,
        queues: &[ObjectId],
    ) -> Result<HashMap<ObjectId, u64>> {
        let now = fleet_time::now();
        // Not filtered on status: the server would then read the queue's backlog through the
        // {queue, status} index; the tasks with a `not_before` ahead are few, whatever it is.
        let ahead = self
            .per_queue(
                queues,
                |q| doc! {task::QUEUE: q, task::NOT_BEFORE: {"$gt": now}},
            )
            .await?;
        Ok(ahead
            .into_iter()
            .map(|(q, c)| (q, c.get(StatusGroup::Queued)))
            .collect())
    }
}
