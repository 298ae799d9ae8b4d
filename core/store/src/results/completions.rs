//! Results a node records for its runners: many ended attempts in two round trips, the
//! attempt records in one `insert`, then the fenced task results in one `update`.

use crate::ResultStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::results::attempts::attempt_document;
use crate::results::finish::{end_group, finish_statement};
use crate::{OutputValue, Store, TaskEnd, BULK_WRITE_MISSING, BULK_WRITE_WORKS};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, ATTEMPTS, TASKS};
use disbatch_model::wire::relay::{Ack, Completion};

/// Keeps each `update` command under the 16 MiB a command document may hold.
const MAX_COMMAND_BYTES: usize = 12 * 1024 * 1024;

/// What storing a batch has established so far, per completion.
struct Progress {
    acks: Vec<Ack>,
    /// Whether this call inserted the attempt record.
    inserted: Vec<bool>,
    /// Completions whose task write went out but whose match is not known.
    unknown: Vec<usize>,
}

impl ResultStore<'_> {
    /// Records ended attempts as their runners would, one answer per completion, in order.
    /// The attempt records go first, so a record never claims a result its task does not
    /// show. One `bulkWrite` round trip on MongoDB 8.0+ (two, `insert` then `update`, before).
    /// Err means nothing can be said of any of them: their runners record their own.
    pub async fn record_completions(self, batch: &[Completion]) -> Result<Vec<Ack>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let now = fleet_time::now();
        let bulk = match self.state.bulk_write.load(Ordering::Relaxed) {
            BULK_WRITE_MISSING => None,
            _ => self.record_in_bulk_writes(batch, now).await?,
        };
        let mut progress = match bulk {
            Some(p) => p,
            None => self.record_in_two_writes(batch, now).await?,
        };
        if !progress.unknown.is_empty() {
            let shown = self.tasks_showing(batch, &progress.unknown, now).await?;
            for i in std::mem::take(&mut progress.unknown) {
                if !shown.contains(&batch[i].record.task) {
                    progress.acks[i] = Ack::NotOurs;
                }
            }
        }
        // Stored by its runner meanwhile (it stopped waiting for this node's answer and wrote
        // the same result): the task shows this attempt's result, so the record this batch
        // inserted is right, and the runner's own write counted the move.
        let mut stored_by_runner = vec![false; batch.len()];
        for (i, c) in batch.iter().enumerate() {
            if progress.acks[i] == Ack::NotOurs && progress.inserted[i] {
                if self
                    .task_shows_result(c.record.task, c.record.id, c.end)
                    .await?
                {
                    progress.acks[i] = Ack::Recorded;
                    stored_by_runner[i] = true;
                    continue;
                }
                self.change_attempt_outcome(
                    c.record.id,
                    c.record.end.outcome,
                    disbatch_model::task::Outcome::Discarded,
                )
                .await?;
            }
        }
        let moves: Vec<crate::Moved> = batch
            .iter()
            .zip(&progress.acks)
            .zip(&stored_by_runner)
            .filter(|((_, a), by_runner)| **a == Ack::Recorded && !**by_runner)
            .filter_map(|((c, _), _)| {
                Some(crate::Moved {
                    // A task ends discarded only from running, which carries no mark.
                    discarded: i64::from(matches!(c.end, TaskEnd::Discarded(_))),
                    ..crate::Moved::new(c.record.queue?, None, Some(end_group(c.end)))
                })
            })
            .collect();
        if !moves.is_empty() {
            self.count_moves(&moves).await;
        }
        Ok(progress.acks)
    }

    /// Whether results went out in `bulkWrite` commands; None until the first batch.
    pub fn uses_bulk_write(self) -> Option<bool> {
        match self.state.bulk_write.load(Ordering::Relaxed) {
            BULK_WRITE_WORKS => Some(true),
            BULK_WRITE_MISSING => Some(false),
            _ => None,
        }
    }

    /// A store that never tries `bulkWrite`, as on a server before MongoDB 8.0 (for tests).
    pub fn without_bulk_write(self) -> Store {
        let mut store = self.store.clone();
        store.state.bulk_write = std::sync::Arc::new(AtomicU8::new(BULK_WRITE_MISSING));
        store
    }

    /// Whether the task shows `attempt` ended as `end`: a runner whose node stored its
    /// result, but whose answer never arrived, finds out here.
    pub async fn task_shows_result(
        self,
        id: ObjectId,
        attempt: ObjectId,
        end: TaskEnd,
    ) -> Result<bool> {
        let status = end.status();
        self.raw(TASKS)
            .find_one(doc! {task::ID: id, task::ATTEMPT: attempt, task::STATUS: status})
            .projection(doc! {task::ID: 1})
            .await
            .map(|d| d.is_some())
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))
    }
}

impl Store {
    /// Each completion's record insert and task update, in that order, in ordered
    /// `bulkWrite` commands: per-operation results, one round trip for the batch. An error
    /// stops an ordered command, so the rest goes again after the failed operation. None:
    /// this server has no `bulkWrite` (or refuses it to this user).
    async fn record_in_bulk_writes(
        &self,
        batch: &[Completion],
        now: DateTime,
    ) -> Result<Option<Progress>> {
        let attempts_ns = format!("{}.{ATTEMPTS}", self.db.name());
        let tasks_ns = format!("{}.{TASKS}", self.db.name());
        let mut ops: Vec<(usize, Document)> = Vec::with_capacity(batch.len() * 2);
        // Per completion: whether its task write is found by `_id` (`by_id.rs`), so that
        // `nModified`, not `n`, says whether it was still this attempt's.
        let mut by_id = Vec::with_capacity(batch.len());
        for (i, c) in batch.iter().enumerate() {
            let (filter, update) = result_write(c, now);
            let (filter, update) = match crate::conn::by_id::conditional_by_id(&filter, &update) {
                Some((filter, pipeline)) => {
                    by_id.push(true);
                    (filter, Bson::from(pipeline))
                }
                None => {
                    by_id.push(false);
                    (filter, Bson::from(update))
                }
            };
            ops.push((
                i,
                doc! {"insert": 0, "document": attempt_document(&c.record)},
            ));
            ops.push((
                i,
                doc! {"update": 1, "filter": filter, "updateMods": update, "multi": false},
            ));
        }
        let mut p = Progress {
            acks: vec![Ack::Recorded; batch.len()],
            inserted: vec![false; batch.len()],
            unknown: Vec::new(),
        };
        let mut start = 0;
        while start < ops.len() {
            let chunk = chunks_by_size(&ops[start..])[0];
            let command = doc! {
                "bulkWrite": 1,
                "ops": chunk.iter().map(|(_, op)| op.clone()).collect::<Vec<_>>(),
                "nsInfo": [{"ns": &attempts_ns}, {"ns": &tasks_ns}],
                "ordered": true,
                "errorsOnly": false,
            };
            let Some(results) = self
                .run_bulk_write(command, "recording results for runners")
                .await?
            else {
                return Ok(None);
            };
            let mut next = start + chunk.len();
            let mut seen = vec![false; chunk.len()];
            for r in results {
                let idx = crate::count_value(r.get("idx")) as usize;
                let Some((i, _)) = chunk.get(idx) else {
                    continue;
                };
                seen[idx] = true;
                let is_insert = (start + idx).is_multiple_of(2);
                let ok = crate::count_value(r.get("ok")) == 1;
                let code = r.get_i32("code").unwrap_or(0);
                match (is_insert, ok) {
                    (true, true) => p.inserted[*i] = true,
                    // Recovery closed the attempt already: the fenced result write decides.
                    (true, false) if code == 11000 => next = start + idx + 1,
                    (true, false) => {
                        p.acks[*i] = Ack::RecordYourself;
                        next = start + idx + 2;
                    }
                    (false, true)
                        if crate::count_value(r.get(match by_id[*i] {
                            true => "nModified",
                            false => "n",
                        })) == 0 =>
                    {
                        p.acks[*i] = Ack::NotOurs
                    }
                    (false, true) => {}
                    (false, false) => {
                        p.acks[*i] = Ack::RecordYourself;
                        next = start + idx + 1;
                    }
                }
            }
            // Without an error every operation reports; a reply cut short leaves the rest
            // to be read back from the tasks.
            if next == start + chunk.len() {
                for (idx, (i, _)) in chunk.iter().enumerate() {
                    if !seen[idx] && !(start + idx).is_multiple_of(2) && p.acks[*i] == Ack::Recorded
                    {
                        p.unknown.push(*i);
                    }
                }
            }
            start = next;
        }
        Ok(Some(p))
    }

    /// One unordered `insert` of the records, then one unordered `update` of the tasks.
    async fn record_in_two_writes(&self, batch: &[Completion], now: DateTime) -> Result<Progress> {
        let mut acks = vec![Ack::Recorded; batch.len()];
        let inserted = self.insert_attempt_records(batch, &mut acks).await?;
        let statements: Vec<(usize, Document)> = batch
            .iter()
            .enumerate()
            .filter(|(i, _)| acks[*i] == Ack::Recorded)
            .map(|(i, c)| {
                let (q, u) = result_write(c, now);
                (i, doc! {"q": q, "u": u, "multi": false, "upsert": false})
            })
            .collect();
        let mut unknown = Vec::new();
        for chunk in chunks_by_size(&statements) {
            let (matched, refused) = self.update_tasks(chunk).await?;
            for i in refused {
                acks[i] = Ack::RecordYourself;
            }
            // The `update` command counts matches per command, not per statement.
            if matched < chunk.len() as u64 {
                unknown.extend(
                    chunk
                        .iter()
                        .map(|(i, _)| *i)
                        .filter(|i| acks[*i] == Ack::Recorded),
                );
            }
        }
        Ok(Progress {
            acks,
            inserted,
            unknown,
        })
    }

    /// Inserts the records unordered; returns which this call inserted. A record that already
    /// exists (recovery closed the attempt as lost) does not stop the result's write, which
    /// is fenced anyway; any other refusal hands that completion back to its runner.
    async fn insert_attempt_records(
        &self,
        batch: &[Completion],
        acks: &mut [Ack],
    ) -> Result<Vec<bool>> {
        use mongodb::error::ErrorKind;
        let mut inserted = vec![true; batch.len()];
        let records: Vec<Document> = batch.iter().map(|c| attempt_document(&c.record)).collect();
        match self
            .collection(ATTEMPTS)
            .insert_many(records)
            .ordered(false)
            .await
        {
            Ok(_) => {}
            Err(e) => match e.kind.as_ref() {
                ErrorKind::InsertMany(failure) if failure.write_concern_error.is_none() => {
                    for w in failure.write_errors.iter().flatten() {
                        let Some(slot) = inserted.get_mut(w.index) else {
                            continue;
                        };
                        *slot = false;
                        if w.code != 11000 {
                            acks[w.index] = Ack::RecordYourself;
                        }
                    }
                }
                _ => return Err(Error::mongo("recording attempts for runners", e)),
            },
        }
        Ok(inserted)
    }

    /// One unordered `update` of tasks: how many statements matched, and which were refused.
    async fn update_tasks(&self, statements: &[(usize, Document)]) -> Result<(u64, Vec<usize>)> {
        let updates: Vec<Document> = statements.iter().map(|(_, s)| s.clone()).collect();
        let reply =
            self.db
                .run_command(self.with_write_concern(
                    doc! {"update": TASKS, "updates": updates, "ordered": false},
                ))
                .await
                .map_err(|e| Error::mongo("recording results for runners", e))?;
        crate::driver_error::warn_write_concern_error(&reply, "recording results for runners");
        let matched = crate::count_value(reply.get("n"));
        let mut refused = Vec::new();
        if let Ok(errors) = reply.get_array("writeErrors") {
            for e in errors.iter().filter_map(Bson::as_document) {
                let index = crate::count_value(e.get("index")) as usize;
                if let Some((i, _)) = statements.get(index) {
                    refused.push(*i);
                }
            }
        }
        if let Ok(wce) = reply.get_document("writeConcernError") {
            return Err(Error::Invalid(format!(
                "recording results for runners: write concern error {wce}"
            )));
        }
        Ok((matched, refused))
    }

    /// The tasks among `which` that show the result this batch wrote (its attempt, status and
    /// `mtime`): the rest had changed hands.
    async fn tasks_showing(
        &self,
        batch: &[Completion],
        which: &[usize],
        written_at: DateTime,
    ) -> Result<std::collections::HashSet<ObjectId>> {
        let ids: Vec<ObjectId> = which.iter().map(|i| batch[*i].record.task).collect();
        let mut expected: HashMap<ObjectId, (ObjectId, i32)> = HashMap::new();
        for i in which {
            let c = &batch[*i];
            let status = c.end.status();
            expected.insert(c.record.task, (c.record.id, status));
        }
        let cursor = self
            .raw(TASKS)
            .find(doc! {task::ID: {"$in": ids}, task::MTIME: written_at})
            .projection(doc! {task::ATTEMPT: 1, task::STATUS: 1})
            .await
            .map_err(|e| Error::mongo("reading back recorded results", e))?;
        let docs = self
            .read_all(TASKS, cursor, "reading back recorded results")
            .await?;
        Ok(docs
            .iter()
            .filter_map(|d| {
                let id = d.get_object_id(task::ID).ok()?;
                let (attempt, status) = expected.get(&id)?;
                let stored_status = match d.get(task::STATUS) {
                    Some(Bson::Int32(n)) => Some(*n as i64),
                    Some(Bson::Int64(n)) => Some(*n),
                    _ => None,
                };
                (d.get_object_id(task::ATTEMPT).ok() == Some(*attempt)
                    && stored_status == Some(*status as i64))
                .then_some(id)
            })
            .collect())
    }
}

/// The fenced task update that records one completion's result.
fn result_write(c: &Completion, now: DateTime) -> (Document, Document) {
    finish_statement(
        c.record.task,
        &c.record.node,
        c.record.id,
        c.end,
        OutputValue::Text(c.stdout.clone()),
        OutputValue::Text(c.stderr.clone()),
        now,
    )
}

/// Splits statements into runs whose encoded size stays under `MAX_COMMAND_BYTES`; a single
/// statement over it goes alone (the server then refuses it, and its runner takes over).
pub(crate) fn chunks_by_size(statements: &[(usize, Document)]) -> Vec<&[(usize, Document)]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (n, (_, s)) in statements.iter().enumerate() {
        let size = bson::to_vec(s).map_or(MAX_COMMAND_BYTES, |v| v.len());
        if n > start && bytes + size > MAX_COMMAND_BYTES {
            chunks.push(&statements[start..n]);
            start = n;
            bytes = 0;
        }
        bytes += size;
    }
    if start < statements.len() {
        chunks.push(&statements[start..]);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_by_size_and_keep_their_order() {
        let small = |i: usize| (i, doc! {"q": {"_id": i as i64}});
        let big = |i: usize| (i, doc! {"u": "x".repeat(5 * 1024 * 1024)});
        let all = vec![small(0), big(1), big(2), small(3), big(4), small(5)];
        let chunks = chunks_by_size(&all);
        let order: Vec<Vec<usize>> = chunks
            .iter()
            .map(|c| c.iter().map(|(i, _)| *i).collect())
            .collect();
        assert_eq!(order, vec![vec![0, 1, 2, 3], vec![4, 5]]);
        assert!(chunks_by_size(&[]).is_empty());
    }
}
