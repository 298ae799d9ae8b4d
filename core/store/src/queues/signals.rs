//! Work signals: one write to a queue document when tasks were queued there, which the nodes
//! watching queues take as "claim now". A change stream on `tasks` made the server deliver
//! every insert to every node (a bulk create of 100 000 tasks into a paused queue kept it
//! busy for over a minute with 10 idle nodes); a signal costs one write per batch however
//! many nodes there are, and a burst of batches coalesces into a few signals.
//!
//! Writers that send no signal (ops by hand, Perl tools, Disbatch 4's DCI) are found by the
//! maintenance leader's probe (`newest_queued`), which signals for them.

use crate::QueueStore;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};

use crate::error::{Error, Result};
use crate::{StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::{queue, task, QUEUES, TASKS};
use disbatch_model::status;

/// Least time between two signals of one queue from one process: a steady stream of single
/// creates signals at most this often (the first at once, the last within this).
pub const SIGNAL_SPACING: Duration = Duration::from_millis(20);

/// Which kind of queueing a signal reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// New tasks.
    New,
    /// Tasks queued again: claim windows may have passed them by.
    Again,
}

/// Signals wanted per queue, and whether one is being written: shared by clones of a store.
#[derive(Debug, Clone, Default)]
pub(crate) struct SignalLedger {
    pending: Arc<Mutex<HashMap<ObjectId, Pending>>>,
}

#[derive(Debug, Default)]
struct Pending {
    new: bool,
    again: bool,
    /// A writer of this queue's signals is at work; it sends what is noted meanwhile.
    sending: bool,
}

impl Pending {
    fn note(&mut self, kind: Queued) {
        match kind {
            Queued::New => self.new = true,
            Queued::Again => self.again = true,
        }
    }

    fn take(&mut self) -> Vec<Queued> {
        let mut kinds = Vec::new();
        if std::mem::take(&mut self.new) {
            kinds.push(Queued::New);
        }
        if std::mem::take(&mut self.again) {
            kinds.push(Queued::Again);
        }
        kinds
    }
}

impl SignalLedger {
    /// Notes a signal; true if the caller is to write it (none is being written).
    fn note(&self, queue: ObjectId, kind: Queued) -> bool {
        let Ok(mut map) = self.pending.lock() else {
            return true;
        };
        let p = map.entry(queue).or_default();
        p.note(kind);
        !std::mem::replace(&mut p.sending, true)
    }

    /// What to write next for `queue`; empty ends the writer's turn (under the same lock, so
    /// a signal noted meanwhile is never left without a writer).
    fn next(&self, queue: ObjectId) -> Vec<Queued> {
        let Ok(mut map) = self.pending.lock() else {
            return Vec::new();
        };
        let Some(p) = map.get_mut(&queue) else {
            return Vec::new();
        };
        let kinds = p.take();
        if kinds.is_empty() {
            map.remove(&queue);
        }
        kinds
    }
}

/// The signal a write of tasks' statuses calls for: moves into the queued group.
pub(crate) fn signals_of(moves: &[crate::Moved]) -> Vec<(ObjectId, Queued)> {
    let mut out: Vec<(ObjectId, Queued)> = Vec::new();
    for m in moves {
        if m.n == 0 || m.to != Some(StatusGroup::Queued) || m.from == Some(StatusGroup::Queued) {
            continue;
        }
        let kind = if m.from.is_none() {
            Queued::New
        } else {
            Queued::Again
        };
        if !out.contains(&(m.queue, kind)) {
            out.push((m.queue, kind));
        }
    }
    out
}

/// The newest work signal on a queue document as read (`tasks_queued_at` or
/// `tasks_requeued_at`): tasks were queued there then, by whoever wrote it.
pub fn last_signal(queue: &Document) -> Option<DateTime> {
    [queue::TASKS_QUEUED_AT, queue::TASKS_REQUEUED_AT]
        .iter()
        .filter_map(|field| queue.get_datetime(field).ok().copied())
        .max()
}

impl QueueStore<'_> {
    /// Tells the nodes watching queues that tasks were queued in `queue`. The first signal is
    /// written before this returns; those that come while it is being written are written
    /// after it, at most every `SIGNAL_SPACING`, by a task of their own, so no caller waits
    /// for another's. A failed signal is logged: the tasks are stored, and the leader's probe
    /// or the nodes' own readings find them later.
    pub async fn signal_queued(self, queue: ObjectId, kind: Queued) {
        if self.state.signals.note(queue, kind) {
            self.write_signals(queue).await;
        }
    }

    /// Per queue, the tasks whose `_id` is an ObjectId greater than `after`: the greatest such
    /// `_id` and how many of them are queued. One range read of the `_id` index whose work
    /// grows with the tasks created since `after` (SecantusDB reads every one of them even
    /// for a `limit`), so the leader that calls it each pass reads each new task once, however
    /// large the backlog behind it and however many nodes there are.
    pub async fn created_since(self, after: ObjectId) -> Result<Vec<CreatedSince>> {
        let pipeline = vec![
            doc! {"$match": {task::ID: {"$gt": after}}},
            doc! {"$group": {
                "_id": format!("${}", task::QUEUE),
                "newest": {"$max": format!("${}", task::ID)},
                "queued": {"$sum": {"$cond": [{"$eq": [format!("${}", task::STATUS), status::QUEUED]}, 1, 0]}},
            }},
        ];
        let context = "reading the tasks created since the last probe";
        Ok(self
            .aggregate_all(TASKS, pipeline, context)
            .await?
            .into_iter()
            .filter_map(|g| {
                Some(CreatedSince {
                    // Tasks whose queue is no ObjectId belong to no queue a node serves.
                    queue: g.get_object_id("_id").ok()?,
                    newest: g.get_object_id("newest").ok()?,
                    queued: crate::count_value(g.get("queued")),
                })
            })
            .collect())
    }
}

impl Store {
    /// Writes `queue`'s noted signal, then hands those noted meanwhile to a task of its own.
    async fn write_signals(&self, queue: ObjectId) {
        if !self.write_noted(queue).await {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SIGNAL_SPACING).await;
                if !store.write_noted(queue).await {
                    break;
                }
            }
        });
    }

    /// Writes what is noted for `queue`; false (and the turn ended) when nothing was.
    async fn write_noted(&self, queue: ObjectId) -> bool {
        let kinds = self.state.signals.next(queue);
        if kinds.is_empty() {
            return false;
        }
        let now = fleet_time::now();
        let mut set = Document::new();
        for kind in kinds {
            let field = match kind {
                Queued::New => queue::TASKS_QUEUED_AT,
                Queued::Again => queue::TASKS_REQUEUED_AT,
            };
            set.insert(field, now);
        }
        if let Err(e) = self
            .collection(QUEUES)
            .update_one(doc! {queue::ID: queue}, doc! {"$set": set})
            .await
        {
            tracing::warn!(%queue, error = %e, "could not signal queued tasks to the nodes; they find them at their next reading");
        }
        true
    }
}

/// Most delayed tasks one probe reads: past it, every queue probed is taken as having some.
const MOST_CAME_DUE: i64 = 10_000;

impl QueueStore<'_> {
    /// Per queue of `queues`, how many queued tasks came due in `(after, until]` (their
    /// `not_before` passed then): one range of the `{queue, not_before}` index per queue, in
    /// one request. Nothing is written when a delay ends, so the leader signals these too.
    ///
    /// A `find` of `queue` and `not_before` alone, the status checked here: SecantusDB plans
    /// that range on the index only so (0.9–4.7 ms at 100 000 queued tasks), while with the
    /// status in the filter, or in an aggregate, it scans the collection (250–350 ms, on each
    /// of the leader's passes: measured as the server's cost per task doubling at depth
    /// 100 000). Past `MOST_CAME_DUE` tasks every probed queue counts as having some.
    pub async fn came_due(
        self,
        queues: &[ObjectId],
        after: DateTime,
        until: DateTime,
    ) -> Result<Vec<(ObjectId, u64)>> {
        if queues.is_empty() || until <= after {
            return Ok(Vec::new());
        }
        let branches: Vec<Document> = queues
            .iter()
            .map(|q| doc! {task::QUEUE: q, task::NOT_BEFORE: {"$gt": after, "$lte": until}})
            .collect();
        let context = "reading the tasks that came due since the last probe";
        let cursor = self
            .raw(TASKS)
            .find(doc! {"$or": branches})
            .projection(doc! {task::QUEUE: 1, task::STATUS: 1})
            .limit(MOST_CAME_DUE)
            .await
            .map_err(|e| Error::mongo(context, e))?;
        let docs = self.read_all(TASKS, cursor, context).await?;
        if docs.len() as i64 >= MOST_CAME_DUE {
            return Ok(queues.iter().map(|q| (*q, 1)).collect());
        }
        let mut counts: HashMap<ObjectId, u64> = HashMap::new();
        for d in &docs {
            let queued = StatusGroup::of(d.get(task::STATUS)) == StatusGroup::Queued;
            if let (true, Ok(queue)) = (queued, d.get_object_id(task::QUEUE)) {
                *counts.entry(queue).or_default() += 1;
            }
        }
        Ok(counts.into_iter().collect())
    }
}

impl QueueStore<'_> {
    /// Whether any task of `queues` has a `not_before` after `after` (due since, or still
    /// delayed): one range of the `{queue, not_before}` index per queue, stopping at the
    /// first. While none has, the leader need not look for tasks coming due.
    pub async fn any_delayed_after(self, queues: &[ObjectId], after: DateTime) -> Result<bool> {
        if queues.is_empty() {
            return Ok(false);
        }
        let branches: Vec<Document> = queues
            .iter()
            .map(|q| doc! {task::QUEUE: q, task::NOT_BEFORE: {"$gt": after}})
            .collect();
        let found = self
            .raw(TASKS)
            .find_one(doc! {"$or": branches})
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo("looking for delayed tasks", e))?;
        Ok(found.is_some())
    }
}

/// Tasks of one queue created since a probe's bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedSince {
    pub queue: ObjectId,
    pub newest: ObjectId,
    pub queued: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Moved;

    #[test]
    fn only_moves_into_queued_signal() {
        let (a, b) = (ObjectId::new(), ObjectId::new());
        let moves = [
            Moved::new(a, None, Some(StatusGroup::Queued)),
            Moved::new(a, None, Some(StatusGroup::Queued)),
            Moved::new(b, Some(StatusGroup::Running), Some(StatusGroup::Queued)),
            Moved::new(b, Some(StatusGroup::Queued), Some(StatusGroup::Claimed)),
            Moved::new(b, Some(StatusGroup::Running), Some(StatusGroup::Succeeded)),
            Moved {
                n: 0,
                ..Moved::new(a, Some(StatusGroup::Running), Some(StatusGroup::Queued))
            },
        ];
        assert_eq!(
            signals_of(&moves),
            vec![(a, Queued::New), (b, Queued::Again)]
        );
    }

    #[test]
    fn a_signal_noted_while_one_is_written_is_left_to_the_writer() {
        let ledger = SignalLedger::default();
        let q = ObjectId::new();
        assert!(ledger.note(q, Queued::New), "the first caller writes");
        assert!(!ledger.note(q, Queued::Again), "the second leaves it");
        assert_eq!(ledger.next(q), vec![Queued::New, Queued::Again]);
        assert!(!ledger.note(q, Queued::New), "still being written");
        assert_eq!(ledger.next(q), vec![Queued::New]);
        assert_eq!(ledger.next(q), vec![], "nothing left: the turn ends");
        assert!(ledger.note(q, Queued::New), "the next caller writes again");
    }
}
