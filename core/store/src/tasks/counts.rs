//! Per-queue task counts kept in `task_counts` by the writes that move tasks between statuses,
//! read without counting queued or finished tasks, and reconciled with the tasks themselves.
//!
//! Only the resting groups (queued, succeeded, failed, …) are kept: they grow with the
//! backlog. Claimed and running tasks are few (a queue's `threads` at most) and are counted
//! live through the `{queue, status}` index, so those counts are always exact. Writers that
//! do not keep counts (Perl nodes, hand edits, a process killed between its write and its
//! count) are corrected by the maintenance leader's reconcile, which a queue's counts wait
//! for only while they have never been reconciled: until then readers count that queue's
//! tasks themselves.
//!
//! A DEN defers its count writes (`defer_count_writes`): its claims and results note their
//! changes and its count writer writes them every `DEFERRED_COUNTS_MAX_AGE`, one update per
//! queue, so counting costs a busy node a few requests a second rather than two per batch.
//! Meanwhile a claimed task may show both as claimed (counted live) and still as queued.

use crate::TaskStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use crate::error::{Error, Result};
use crate::{StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::{counts, queue, task, QUEUES, TASKS, TASK_COUNTS};
use disbatch_model::status;

/// Tasks of one queue by status group, indexed as `StatusGroup::ALL`, and how many of the
/// failed ones are discarded (given up on: out of attempts, refused a retry, or by hand).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCounts {
    groups: [u64; StatusGroup::ALL.len()],
    discarded: u64,
}

impl GroupCounts {
    pub fn get(&self, group: StatusGroup) -> u64 {
        self.groups[group.index()]
    }

    pub(crate) fn add(&mut self, group: StatusGroup, n: u64) {
        self.groups[group.index()] = self.groups[group.index()].saturating_add(n);
    }

    /// Of `get(Failed)`, the tasks that carry `discarded_at`.
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    pub(crate) fn add_discarded(&mut self, n: u64) {
        self.discarded = self.discarded.saturating_add(n);
    }

    /// Every task once: discarded ones are already among the failed.
    pub fn total(&self) -> u64 {
        self.groups.iter().sum()
    }
}

/// The ledger's slots: one per status group, then the discarded mark.
const SLOTS: usize = StatusGroup::ALL.len() + 1;
const DISCARDED_SLOT: usize = StatusGroup::ALL.len();

/// Whether a group's count is kept in `task_counts` (true) or counted live (claimed, running).
pub fn is_kept(group: StatusGroup) -> bool {
    !matches!(group, StatusGroup::Claimed | StatusGroup::Running)
}

/// Count changes not yet written, per queue and group. Shared by clones of a store.
#[derive(Debug, Clone, Default)]
pub(crate) struct CountLedger {
    pending: Arc<Mutex<HashMap<ObjectId, [i64; SLOTS]>>>,
    /// Set by a process that writes the changes itself on a timer (`Store::defer_count_writes`).
    deferred: Arc<AtomicBool>,
}

impl CountLedger {
    fn note(&self, queue: ObjectId, group: StatusGroup, n: i64) {
        if is_kept(group) {
            self.note_slot(queue, group.index(), n);
        }
    }

    fn note_slot(&self, queue: ObjectId, slot: usize, n: i64) {
        if n == 0 {
            return;
        }
        // A poisoned ledger only loses counts, which the reconcile restores.
        if let Ok(mut map) = self.pending.lock() {
            map.entry(queue).or_default()[slot] += n;
        }
    }

    fn take(&self) -> HashMap<ObjectId, [i64; SLOTS]> {
        self.pending
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }
}

/// A change of status of `n` tasks of `queue`, for the counts. `None` is "no task" (created
/// or deleted). `discarded` is the change in how many carry the discarded mark: +1 for a
/// task given up on, -1 for a discarded one retried or deleted.
#[derive(Debug, Clone, Copy)]
pub struct Moved {
    pub queue: ObjectId,
    pub from: Option<StatusGroup>,
    pub to: Option<StatusGroup>,
    pub n: u64,
    pub discarded: i64,
}

impl Moved {
    pub fn new(queue: ObjectId, from: Option<StatusGroup>, to: Option<StatusGroup>) -> Moved {
        Moved {
            queue,
            from,
            to,
            n: 1,
            discarded: 0,
        }
    }
}

/// How a write changes a task's discarded mark, from the task before it (with
/// `discarded_at` in its projection) and the update: set where it had none, +1; removed
/// where it had one, -1, whether the update is a document or a pipeline.
pub(crate) fn discard_change(
    before: &Document,
    update: &mongodb::options::UpdateModifications,
) -> i64 {
    use mongodb::options::UpdateModifications;
    let names = |op: &str| match update {
        UpdateModifications::Document(u) => u
            .get_document(op)
            .is_ok_and(|d| d.contains_key(task::DISCARDED_AT)),
        // A pipeline's `$set` is a document; its `$unset` a name or a list of names.
        UpdateModifications::Pipeline(stages) => stages.iter().any(|stage| match stage.get(op) {
            Some(Bson::Document(d)) => d.contains_key(task::DISCARDED_AT),
            Some(Bson::String(name)) => name == task::DISCARDED_AT,
            Some(Bson::Array(names)) => {
                names.iter().any(|n| n.as_str() == Some(task::DISCARDED_AT))
            }
            _ => false,
        }),
        _ => false,
    };
    let had = before.contains_key(task::DISCARDED_AT);
    match (had, names("$set"), names("$unset")) {
        (false, true, _) => 1,
        (true, false, true) => -1,
        _ => 0,
    }
}

/// The group of a status code this crate writes.
pub fn group_of(code: i32) -> StatusGroup {
    StatusGroup::of(Some(&Bson::Int32(code)))
}

/// What a reconcile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Queues whose counts were replaced by a fresh count of their tasks.
    pub reconciled: usize,
    /// Queues whose counts changed while their tasks were counted: tried again next time.
    pub busy: usize,
    /// Of `reconciled`, those whose kept counts were wrong, and by how many tasks in all.
    pub corrected: usize,
    pub drift: u64,
}

/// Longest a process that defers its count writes may hold them: well within the reconcile's
/// grace, so a reconcile that counted a task before its count was written sees the write and
/// leaves that queue for next time.
pub const DEFERRED_COUNTS_MAX_AGE: Duration = Duration::from_millis(250);

impl TaskStore<'_> {
    /// From now on this store (and its clones) only notes count changes; the caller writes
    /// them with `flush_counts` at least every `DEFERRED_COUNTS_MAX_AGE`, and `shutdown`
    /// writes what is left. A busy DEN then makes one count write per queue per period, not
    /// one per claim batch and one per result batch.
    pub fn defer_count_writes(self) {
        self.state.counts.deferred.store(true, Ordering::Relaxed);
    }

    /// Writes the noted count changes. A queue without a counts document gets none: its
    /// counts are not kept yet, and its first reconcile counts everything.
    pub async fn flush_counts(self) -> Result<()> {
        let pending = self.state.counts.take();
        let coll = self.collection(TASK_COUNTS);
        let writes = pending.into_iter().filter_map(|(queue, deltas)| {
            let mut inc = Document::new();
            for (g, d) in StatusGroup::ALL.iter().zip(deltas) {
                if d != 0 {
                    inc.insert(g.as_str(), d);
                }
            }
            if deltas[DISCARDED_SLOT] != 0 {
                inc.insert(counts::DISCARDED, deltas[DISCARDED_SLOT]);
            }
            if inc.is_empty() {
                return None;
            }
            inc.insert(counts::SEQ, 1_i64);
            let coll = coll.clone();
            Some(async move {
                coll.update_one(doc! {counts::ID: queue}, doc! {"$inc": inc})
                    .await
                    .map_err(|e| Error::mongo(format!("counting tasks of queue {queue}"), e))
            })
        });
        futures::future::try_join_all(writes).await.map(|_| ())
    }

    /// Every listed queue's tasks by group: kept counts where a reconcile has made them,
    /// claimed and running counted live, and a count of the tasks for queues not yet
    /// reconciled. One read of the kept counts and one per queue, none of them reading a
    /// queue's backlog once it is counted.
    pub async fn task_counts(self, queues: &[ObjectId]) -> Result<HashMap<ObjectId, GroupCounts>> {
        let kept = self.kept_counts(queues).await?;
        let live = [status::CLAIMED, status::RUNNING];
        let rest = self
            .per_queue(queues, |q| match kept.contains_key(&q) {
                true => doc! {task::QUEUE: q, task::STATUS: {"$in": live.to_vec()}},
                false => doc! {task::QUEUE: q},
            })
            .await?;
        let uncounted: Vec<ObjectId> = queues
            .iter()
            .filter(|q| !kept.contains_key(q))
            .copied()
            .collect();
        let mut out = kept;
        for (queue, groups) in rest {
            let entry = out.entry(queue).or_default();
            for g in StatusGroup::ALL {
                entry.add(g, groups.get(g));
            }
        }
        // Until its first reconcile a queue's discarded tasks are counted too, through the
        // partial `{queue, discarded_at}` index.
        for q in uncounted {
            let n = self.queues().discarded_count(q, i64::MAX).await?;
            out.entry(q).or_default().add_discarded(n);
        }
        Ok(out)
    }

    /// Replaces the kept counts of every queue due (never reconciled, or not for `every`)
    /// with a fresh count of its tasks, unless counts were written for it while its tasks
    /// were counted or during `grace` after (a write's count follows the write itself).
    pub async fn reconcile_task_counts(
        self,
        every: Duration,
        grace: Duration,
    ) -> Result<ReconcileReport> {
        let queue_ids = self.queue_ids().await?;
        let what = "reading task counts";
        let cursor = self
            .raw(TASK_COUNTS)
            .find(doc! {})
            .await
            .map_err(|e| Error::mongo(what, e))?;
        let docs: HashMap<ObjectId, Document> = self
            .read_all(TASK_COUNTS, cursor, what)
            .await?
            .into_iter()
            .filter_map(|d| Some((d.get_object_id(counts::ID).ok()?, d)))
            .collect();
        let due_before = DateTime::from_millis(
            fleet_time::now()
                .timestamp_millis()
                .saturating_sub(i64::try_from(every.as_millis()).unwrap_or(i64::MAX)),
        );
        let mut due = Vec::new();
        for q in queue_ids {
            match docs.get(&q) {
                Some(d) => {
                    let recent = d
                        .get_datetime(counts::RECONCILED_AT)
                        .is_ok_and(|t| *t > due_before);
                    if !recent {
                        due.push((
                            q,
                            d.get(counts::SEQ).cloned().unwrap_or(Bson::Null),
                            Some(d.clone()),
                        ));
                    }
                }
                None => {
                    // From now on writes count this queue's moves (on top of nothing yet).
                    let fresh = doc! {counts::ID: q, counts::SEQ: 0_i64};
                    match self.collection(TASK_COUNTS).insert_one(fresh).await {
                        Ok(_) => due.push((q, Bson::Int64(0), None)),
                        Err(e) if crate::driver_error::is_duplicate_key(&e) => {}
                        Err(e) => return Err(Error::mongo("creating task counts", e)),
                    }
                }
            }
        }
        let mut scans = Vec::with_capacity(due.len());
        for (q, seq, old) in due {
            // One queue at a time: a reconcile is background work and must not crowd out claims.
            let mut fresh = self
                .per_queue(&[q], |q| doc! {task::QUEUE: q})
                .await?
                .remove(&q)
                .unwrap_or_default();
            fresh.add_discarded(self.queues().discarded_count(q, i64::MAX).await?);
            scans.push((q, seq, old, fresh));
        }
        if !scans.is_empty() {
            tokio::time::sleep(grace).await;
        }
        let mut report = ReconcileReport::default();
        for (q, seq, old, fresh) in scans {
            let mut set = doc! {counts::RECONCILED_AT: fleet_time::now()};
            let mut drift = 0u64;
            let kept = StatusGroup::ALL
                .into_iter()
                .filter(|g| is_kept(*g))
                .map(|g| (g.as_str(), fresh.get(g)))
                .chain([(counts::DISCARDED, fresh.discarded())]);
            for (field, n) in kept {
                set.insert(field, i64::try_from(n).unwrap_or(i64::MAX));
                if let Some(old) = &old {
                    let was = match old.get(field) {
                        Some(Bson::Int64(v)) => *v,
                        Some(Bson::Int32(v)) => i64::from(*v),
                        _ => 0,
                    };
                    drift += was.abs_diff(i64::try_from(n).unwrap_or(i64::MAX));
                }
            }
            let written = self
                .collection(TASK_COUNTS)
                .update_one(doc! {counts::ID: q, counts::SEQ: seq}, doc! {"$set": set})
                .await
                .map_err(|e| Error::mongo(format!("reconciling task counts of queue {q}"), e))?;
            if written.matched_count == 1 {
                report.reconciled += 1;
                if drift > 0
                    && old
                        .as_ref()
                        .is_some_and(|d| d.contains_key(counts::RECONCILED_AT))
                {
                    report.corrected += 1;
                    report.drift += drift;
                }
            } else {
                report.busy += 1;
            }
        }
        Ok(report)
    }
}

impl Store {
    /// Notes that tasks moved, and writes the changes at once (one update per queue) unless
    /// writes are deferred; tasks that became queued are signalled to the nodes at once. A failed count write is logged, not returned: the task writes it
    /// follows have happened, and the reconcile repairs the counts.
    pub(crate) async fn count_moves(&self, moves: &[Moved]) {
        // Tasks moved into the queued group wake the nodes now, whatever happens to the counts.
        for (queue, kind) in crate::queues::signals::signals_of(moves) {
            self.queues().signal_queued(queue, kind).await;
        }
        for m in moves {
            let n = i64::try_from(m.n).unwrap_or(i64::MAX);
            if let Some(g) = m.from {
                self.state.counts.note(m.queue, g, -n);
            }
            if let Some(g) = m.to {
                self.state.counts.note(m.queue, g, n);
            }
            self.state
                .counts
                .note_slot(m.queue, DISCARDED_SLOT, m.discarded);
        }
        if self.state.counts.deferred.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.tasks().flush_counts().await {
            tracing::warn!(error = %e, "could not write task counts; the maintenance leader's reconcile will repair them");
        }
    }

    /// For each queue, its tasks matching `filter(queue)` by group. One aggregation per queue,
    /// a few at a time: each filter names its queue by equality, which servers answer from
    /// the `{queue, status}` (or `{queue, not_before}`) index, where a `$in` over queues may
    /// make them read the whole collection (SecantusDB does: 5.7 s at 1 000 000 tasks).
    pub(crate) async fn per_queue(
        &self,
        queues: &[ObjectId],
        filter: impl Fn(ObjectId) -> Document,
    ) -> Result<HashMap<ObjectId, GroupCounts>> {
        use futures::stream::{self, StreamExt, TryStreamExt};
        let reads: Vec<_> = queues
            .iter()
            .map(|q| {
                let pipeline = vec![
                    doc! {"$match": filter(*q)},
                    doc! {"$group": {"_id": format!("${}", task::STATUS), "n": {"$sum": 1}}},
                ];
                self.count_by_status(*q, pipeline)
            })
            .collect();
        stream::iter(reads).buffer_unordered(8).try_collect().await
    }

    /// Counts documents of queues a reconcile has made (`reconciled_at` set).
    async fn kept_counts(&self, queues: &[ObjectId]) -> Result<HashMap<ObjectId, GroupCounts>> {
        let what = "reading task counts";
        let cursor = self
            .raw(TASK_COUNTS)
            .find(doc! {counts::ID: {"$in": queues}, counts::RECONCILED_AT: {"$type": "date"}})
            .await
            .map_err(|e| Error::mongo(what, e))?;
        let mut out = HashMap::new();
        for d in self.read_all(TASK_COUNTS, cursor, what).await? {
            let Ok(queue) = d.get_object_id(counts::ID) else {
                continue;
            };
            let mut c = GroupCounts::default();
            for g in StatusGroup::ALL.into_iter().filter(|g| is_kept(*g)) {
                // Drift can take a kept count below zero until the next reconcile: show 0.
                c.add(g, crate::count_value(d.get(g.as_str())));
            }
            c.add_discarded(crate::count_value(d.get(counts::DISCARDED)));
            out.insert(queue, c);
        }
        Ok(out)
    }

    /// Runs a pipeline whose `$group` keys are statuses; their counts by group.
    async fn count_by_status(
        &self,
        queue: ObjectId,
        pipeline: Vec<Document>,
    ) -> Result<(ObjectId, GroupCounts)> {
        let what = "counting tasks by status";
        let mut out = GroupCounts::default();
        for d in self.aggregate_all(TASKS, pipeline, what).await? {
            // Several stored types (1, 1.0, Int64 1) can land in one group: add, never replace.
            out.add(
                StatusGroup::of(d.get("_id")),
                crate::count_value(d.get("n")),
            );
        }
        Ok((queue, out))
    }

    async fn queue_ids(&self) -> Result<Vec<ObjectId>> {
        let what = "listing queue ids";
        let mut cursor = self
            .raw(QUEUES)
            .find(doc! {})
            .projection(doc! {queue::ID: 1})
            .await
            .map_err(|e| Error::mongo(what, e))?;
        let mut out = Vec::new();
        while let Some(d) = cursor.try_next().await.map_err(|e| Error::mongo(what, e))? {
            // A queue with another kind of `_id` has no tasks by reference: nothing to count.
            if let Ok(id) = d.get_object_id(queue::ID) {
                out.push(id);
            }
        }
        Ok(out)
    }
}

impl Store {
    /// Updates one task as `update_one` would, and counts its move to `to` (None: its new
    /// status is read back). The queue and status it had come back from the same request,
    /// and with `to` its discarded mark, so that setting or removing the mark is counted.
    /// The driver's error is returned as it is, for callers that tell refusals apart.
    pub(crate) async fn update_one_counted(
        &self,
        filter: Document,
        update: impl Into<mongodb::options::UpdateModifications>,
        to: Option<StatusGroup>,
    ) -> mongodb::error::Result<bool> {
        let update = update.into();
        let before = self
            .collection(TASKS)
            .find_one_and_update(filter, update.clone())
            .projection(doc! {task::QUEUE: 1, task::STATUS: 1, task::DISCARDED_AT: 1})
            .return_document(if to.is_some() {
                mongodb::options::ReturnDocument::Before
            } else {
                mongodb::options::ReturnDocument::After
            })
            .await?;
        let Some(d) = before else {
            return Ok(false);
        };
        if let Ok(queue) = d.get_object_id(task::QUEUE) {
            let moved = match to {
                Some(to) => Moved {
                    discarded: discard_change(&d, &update),
                    ..Moved::new(queue, Some(StatusGroup::of(d.get(task::STATUS))), Some(to))
                },
                // Read back after: only the new status is known; callers use this for
                // moves out of the live groups, whose counts are not kept and whose tasks
                // carry no discarded mark (a claim never takes a failed task).
                None => Moved::new(queue, None, Some(StatusGroup::of(d.get(task::STATUS)))),
            };
            self.count_moves(&[moved]).await;
        }
        Ok(true)
    }
}

impl Store {
    /// `update_many` for the few tasks of one node (its claims): each matching task is
    /// updated by `_id` under the same filter and counted, since one `update_many` cannot say
    /// which queues its tasks were in. Returns how many were updated.
    pub(crate) async fn update_each_counted(
        &self,
        filter: Document,
        update: Document,
        to: StatusGroup,
    ) -> mongodb::error::Result<u64> {
        let mut cursor = self
            .raw(TASKS)
            .find(filter.clone())
            .projection(doc! {task::ID: 1})
            .await?;
        let mut ids = Vec::new();
        while let Some(d) = cursor.try_next().await? {
            let id = d
                .get(task::ID)
                .ok()
                .flatten()
                .and_then(|v| Bson::try_from(v.to_raw_bson()).ok());
            if let Some(id) = id {
                ids.push(id);
            }
        }
        let mut updated = 0;
        for id in ids {
            let mut one = filter.clone();
            one.insert(task::ID, id);
            if self
                .update_one_counted(one, update.clone(), Some(to))
                .await?
            {
                updated += 1;
            }
        }
        Ok(updated)
    }
}
