//! Counting ended dependencies off the tasks that wait for them, and releasing each waiting
//! task exactly once: when its `waiting_on` is left empty, to queued, or for a batch's
//! callback, to queued with the batch's outcome.
//!
//! Three kinds of waiting task, each with the write that is cheapest for it on the server:
//! - all it still waits on has ended: released by one write per queue, no pull first (most
//!   of a fan-out: 9 998 dependents of one task are 10 reads and 10 writes);
//! - a short list with some still to end: `$pullAll`, then released if another settler
//!   emptied it meanwhile;
//! - a long list (a fan-in's merge): read whole, and written back without the ended ids on
//!   condition that its length is unchanged. The server's `$pullAll` compares every element
//!   with every id pulled, so pulling 1 000 from 10 000 took 200–300 ms of SecantusDB's CPU;
//!   writing the array back took 40 (BENCHMARKS.md "Workflows").
//!
//! `waiting_on` only ever shrinks while a task is blocked, so its length is a version: a
//! write conditioned on it lands only if nobody changed the list since it was read.

use std::collections::{BTreeMap, HashSet};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::{Error, Result};
use crate::{Moved, Settled, StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, workflow, BATCHES, TASKS};
use disbatch_model::status;

/// Lists longer than this are counted down by a whole read and a conditional write, and are
/// read in a round only this far (so a round of dependents has bounded size whatever their
/// fan-in).
pub(crate) const SHORT: usize = 64;

/// What a settler's look at a batch's callback came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Released {
    /// Still waiting, or another settler moved it.
    NotYet,
    /// Queued with the batch's outcome.
    Queued,
    /// Failed: its document could not take the outcome.
    Failed,
}

/// A waiting task as a round reads it: its first `SHORT + 1` waits tell whether it is short.
struct Waiting {
    id: ObjectId,
    queue: ObjectId,
    batch: Option<ObjectId>,
    /// The ids among the waits read; a value of another type (a hand edit) never ends.
    waits: Vec<ObjectId>,
    read: usize,
}

impl Waiting {
    fn read(id: ObjectId, queue: ObjectId, d: &Document) -> Waiting {
        Waiting {
            id,
            queue,
            batch: d.get_object_id(task::BATCH_CALLBACK).ok(),
            waits: object_ids(d.get(task::WAITING_ON)),
            read: list_len(d.get(task::WAITING_ON)),
        }
    }

    fn is_long(&self) -> bool {
        self.read > SHORT
    }

    /// All it still waits on is among `ended`.
    fn is_done(&self, ended: &HashSet<ObjectId>) -> bool {
        self.waits.len() == self.read && self.waits.iter().all(|d| ended.contains(d))
    }
}

/// The ids of a list of waits (other values, written by hand, are not ids anything can end
/// as; a lone id, also by hand, reads as a list of one).
pub(crate) fn object_ids(v: Option<&Bson>) -> Vec<ObjectId> {
    match v {
        Some(Bson::Array(a)) => a.iter().filter_map(Bson::as_object_id).collect(),
        Some(Bson::ObjectId(id)) => vec![*id],
        _ => Vec::new(),
    }
}

/// How many values a list of waits holds (a lone value: one).
pub(crate) fn list_len(v: Option<&Bson>) -> usize {
    match v {
        Some(Bson::Array(a)) => a.len(),
        Some(_) => 1,
        None => 0,
    }
}

/// The projection that reads at most `SHORT + 1` of a task's waits.
pub(crate) fn short_waits() -> Document {
    doc! {task::WAITING_ON: {"$slice": (SHORT + 1) as i64}}
}

impl Store {
    /// Counts `ended` off their dependents' `waiting_on` and releases those left waiting on
    /// nothing, in rounds of `CHUNK` dependents.
    pub(crate) async fn pull_and_release(
        &self,
        ended: &[ObjectId],
        out: &mut Settled,
    ) -> Result<()> {
        let ended_set: HashSet<ObjectId> = ended.iter().copied().collect();
        let filter = doc! {task::WAITING_ON: {"$in": ended}, task::STATUS: status::BLOCKED};
        let mut fields = short_waits();
        fields.insert(task::BATCH_CALLBACK, 1);
        loop {
            let (found, full) = self.dependents(filter.clone(), fields.clone()).await?;
            if found.is_empty() {
                return Ok(());
            }
            let waiting: Vec<Waiting> = found
                .iter()
                .map(|(id, queue, d)| Waiting::read(*id, *queue, d))
                .collect();
            let mut progress = 0;
            let mut done: BTreeMap<ObjectId, Vec<ObjectId>> = BTreeMap::new();
            let mut partly: Vec<&Waiting> = Vec::new();
            for w in &waiting {
                if w.is_long() {
                    progress += self.count_down_long(w, &ended_set, out).await?;
                } else if w.batch.is_none() && w.is_done(&ended_set) {
                    done.entry(w.queue).or_default().push(w.id);
                } else {
                    partly.push(w);
                }
            }
            for (queue, ids) in done {
                // Their lists held only ended tasks, and a blocked task's list only shrinks.
                progress += self
                    .release_where(queue, doc! {task::ID: {"$in": &ids}}, out)
                    .await?;
            }
            progress += self.pull_short(&partly, &ended_set, out).await?;
            // One callback that cannot be written never keeps the others of the round (or of
            // another tenant's batches) waiting: it is logged and counted, and the next settle
            // or the leader's sweep tries it again.
            for (w, batch) in waiting.iter().filter_map(|w| w.batch.map(|b| (w, b))) {
                match self.release_callback(w.id, w.queue, batch).await {
                    Ok(Released::Queued) => {
                        out.callbacks += 1;
                        out.released += 1;
                    }
                    Ok(Released::Failed) => out.callbacks_failed += 1,
                    Ok(Released::NotYet) => {}
                    Err(e) => {
                        out.errors += 1;
                        tracing::warn!(task = %w.id, batch = %batch, error = %e, "could not release a batch's callback; skipped this round");
                    }
                }
            }
            // Not a full round: every task that waits for `ended` was in it, and each was
            // counted down (or found changed by another settler). Otherwise another round, unless
            // another settler changed these first: the next read would find the same tasks.
            if !full || progress == 0 {
                return Ok(());
            }
        }
    }

    /// Pulls the ended ids from short lists, then releases those now empty (a settler of
    /// another dependency may have pulled the rest meanwhile). Callbacks stay blocked for
    /// `release_callback`.
    async fn pull_short(
        &self,
        partly: &[&Waiting],
        ended: &HashSet<ObjectId>,
        out: &mut Settled,
    ) -> Result<u64> {
        if partly.is_empty() {
            return Ok(0);
        }
        let ids: Vec<ObjectId> = partly.iter().map(|w| w.id).collect();
        let pulled: Vec<ObjectId> = {
            let mut seen = HashSet::new();
            partly
                .iter()
                .flat_map(|w| w.waits.iter())
                .filter(|d| ended.contains(d) && seen.insert(**d))
                .copied()
                .collect()
        };
        // Only from arrays: the server refuses `$pullAll` on anything else, and would refuse the
        // whole write for one such task.
        let r = self
            .collection(TASKS)
            .update_many(
                doc! {
                    task::ID: {"$in": &ids}, task::STATUS: status::BLOCKED,
                    task::WAITING_ON: {"$type": "array"},
                },
                doc! {"$pullAll": {task::WAITING_ON: &pulled}},
            )
            .await
            .map_err(|e| Error::mongo("counting ended dependencies", e))?;
        let mut by_queue: BTreeMap<ObjectId, Vec<ObjectId>> = BTreeMap::new();
        for w in partly.iter().filter(|w| w.batch.is_none()) {
            by_queue.entry(w.queue).or_default().push(w.id);
        }
        for (queue, ids) in by_queue {
            let emptied = doc! {task::ID: {"$in": &ids}, task::WAITING_ON: {"$size": 0}};
            self.release_where(queue, emptied, out).await?;
        }
        Ok(r.modified_count)
    }

    /// Counts the ended ids off one long list: read whole, written back shorter on condition
    /// that nobody shortened it meanwhile (else read again: each miss is another settler's
    /// progress, so this ends). Released in the same write when it empties, unless it is a
    /// batch's callback. Returns the writes that landed.
    async fn count_down_long(
        &self,
        w: &Waiting,
        ended: &HashSet<ObjectId>,
        out: &mut Settled,
    ) -> Result<u64> {
        loop {
            let Some(found) = self
                .raw(TASKS)
                .find_one(doc! {task::ID: w.id, task::STATUS: status::BLOCKED})
                .projection(doc! {task::WAITING_ON: 1})
                .await
                .map_err(|e| Error::mongo(format!("reading task {}'s dependencies", w.id), e))?
            else {
                return Ok(0);
            };
            let Some(d) = self.decode_or_skip(TASKS, &found) else {
                return Ok(0);
            };
            let Ok(list) = d.get_array(task::WAITING_ON) else {
                return Ok(0);
            };
            let before = list.len();
            let left: Vec<Bson> = list
                .iter()
                .filter(|v| !v.as_object_id().is_some_and(|id| ended.contains(&id)))
                .cloned()
                .collect();
            if left.len() == before {
                return Ok(0);
            }
            let unchanged = doc! {
                task::ID: w.id, task::STATUS: status::BLOCKED,
                task::WAITING_ON: {"$size": before as i64},
            };
            let update = if left.is_empty() && w.batch.is_none() {
                doc! {
                    "$set": {task::STATUS: status::QUEUED, task::MTIME: fleet_time::now()},
                    "$unset": {task::WAITING_ON: ""},
                }
            } else {
                doc! {"$set": {task::WAITING_ON: &left}}
            };
            let r = self
                .collection(TASKS)
                .update_one(unchanged, update)
                .await
                .map_err(|e| Error::mongo(format!("counting task {}'s dependencies", w.id), e))?;
            if r.modified_count == 0 {
                continue;
            }
            if left.is_empty() && w.batch.is_none() {
                self.count_moves(&[Moved::new(
                    w.queue,
                    Some(StatusGroup::Blocked),
                    Some(StatusGroup::Queued),
                )])
                .await;
                out.released += 1;
            }
            return Ok(1);
        }
    }

    /// Releases the blocked tasks of `queue` that `filter` names, counting the moves.
    pub(crate) async fn release_where(
        &self,
        queue: ObjectId,
        mut filter: Document,
        out: &mut Settled,
    ) -> Result<u64> {
        filter.insert(task::STATUS, status::BLOCKED);
        let r = self
            .collection(TASKS)
            .update_many(
                filter,
                doc! {
                    "$set": {task::STATUS: status::QUEUED, task::MTIME: fleet_time::now()},
                    "$unset": {task::WAITING_ON: ""},
                },
            )
            .await
            .map_err(|e| Error::mongo("releasing tasks whose dependencies ended", e))?;
        let moved = Moved {
            n: r.modified_count,
            ..Moved::new(queue, Some(StatusGroup::Blocked), Some(StatusGroup::Queued))
        };
        self.count_moves(&[moved]).await;
        out.released += r.modified_count;
        Ok(r.modified_count)
    }

    /// Releases a batch's callback once every member has ended, its params then carrying the
    /// batch's outcome; `Queued` or `Failed` for the one settler whose write moved it (exactly
    /// once). A callback whose document cannot take the outcome (its params grown by hand past
    /// what creation allows) is failed instead, by a write that grows nothing.
    async fn release_callback(
        &self,
        id: ObjectId,
        queue: ObjectId,
        batch: ObjectId,
    ) -> Result<Released> {
        let waiting =
            doc! {task::ID: id, task::STATUS: status::BLOCKED, task::WAITING_ON: {"$size": 0}};
        if self
            .raw(TASKS)
            .find_one(waiting.clone())
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading batch {batch}'s callback"), e))?
            .is_none()
        {
            return Ok(Released::NotYet);
        }
        let outcome = self.batch_outcome(batch).await?;
        let released = self
            .collection(TASKS)
            .update_one(
                waiting.clone(),
                doc! {
                    "$set": {task::STATUS: status::QUEUED, task::MTIME: fleet_time::now(), "params.batch": outcome},
                    "$unset": {task::WAITING_ON: ""},
                },
            )
            .await;
        let (moved, to) = match released {
            Ok(r) => (r.modified_count, Released::Queued),
            Err(e) if crate::driver_error::is_document_too_large(&e) => {
                // Status and mtime keep their sizes and the waits go: the document shrinks.
                let r = self
                    .collection(TASKS)
                    .update_one(
                        waiting,
                        doc! {
                            "$set": {task::STATUS: status::FAILED, task::MTIME: fleet_time::now()},
                            "$unset": {task::WAITING_ON: ""},
                        },
                    )
                    .await
                    .map_err(|e| Error::mongo(format!("failing batch {batch}'s callback"), e))?;
                if r.modified_count > 0 {
                    tracing::warn!(task = %id, batch = %batch, "failed a batch's callback: its document is too large to carry the batch's outcome in its params");
                }
                (r.modified_count, Released::Failed)
            }
            Err(e) => {
                return Err(Error::mongo(
                    format!("releasing batch {batch}'s callback"),
                    e,
                ))
            }
        };
        if moved == 0 {
            return Ok(Released::NotYet);
        }
        let group = match to {
            Released::Failed => StatusGroup::Failed,
            _ => StatusGroup::Queued,
        };
        self.count_moves(&[Moved::new(queue, Some(StatusGroup::Blocked), Some(group))])
            .await;
        self.collection(BATCHES)
            .update_one(
                doc! {workflow::ID: batch, workflow::DONE: {"$exists": false}},
                doc! {"$set": {workflow::DONE: fleet_time::now()}},
            )
            .await
            .map_err(|e| Error::mongo(format!("marking batch {batch} done"), e))?;
        Ok(to)
    }
}
