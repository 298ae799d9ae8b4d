//! Tasks: storing, starting and finishing them, reaping and giving back; in its files, their
//! creation, unique keys, queries, operator control, counts, summaries and retention.

pub(in crate::store) mod control;
pub(in crate::store) mod counts;
pub(in crate::store) mod create;
pub(in crate::store) mod query;
pub(in crate::store) mod retention;
pub(in crate::store) mod summary;
pub(in crate::store) mod unique;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::ReturnDocument;

use super::claims::candidates::release_holds;
use super::schema::{task, TASKS};
use super::tasks::create::{Created, Timing};
use super::tasks::unique::{stamp_unique_key, Fate};
use super::{StatusGroup, Store};
use crate::error::{Error, Result};
use crate::fleet_time;
use crate::model::status;

/// Running (claimed or started) tasks as one aggregate saw them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunningSnapshot {
    /// Per queue: how many tasks are claimed or running, on any node.
    pub per_queue: HashMap<ObjectId, u32>,
    /// Per queue: the slots held (tasks claimed by Perl nodes hold none).
    pub slots: HashMap<ObjectId, BTreeSet<u32>>,
    /// Tasks claimed or running on this node, in any queue.
    pub on_node: u32,
    /// Per queue: the nodes holding its claimed or running tasks.
    pub nodes: HashMap<ObjectId, Vec<String>>,
}

/// One queue's claimed and running tasks, read at once (not from the last snapshot).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct QueueRunning {
    /// On every node, Perl nodes' slotless claims included.
    pub running: u32,
    /// The slots held by our nodes' claims.
    pub slots: BTreeSet<u32>,
    /// Claims that hold no slot (a Perl node's): the slot index cannot count them.
    pub slotless: u32,
    /// The claimed and running tasks themselves, so two readings tell which arrived between.
    pub ids: HashSet<ObjectId>,
}

/// A stream's value as stored on the task: inline text, a GridFS file id, or nothing.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputValue {
    Null,
    Text(String),
    File(ObjectId),
}

impl From<OutputValue> for Bson {
    fn from(v: OutputValue) -> Bson {
        match v {
            // Disbatch's runner stores a plugin's absent output as null, and Perl tools test
            // `defined`: an empty stream is stored the same way (GridFS files stay files,
            // empty or not, as with `gfs: true` in Disbatch).
            OutputValue::Null => Bson::Null,
            OutputValue::Text(s) if s.is_empty() => Bson::Null,
            OutputValue::Text(s) => Bson::String(s),
            OutputValue::File(id) => Bson::ObjectId(id),
        }
    }
}

/// How an attempt leaves its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEnd {
    /// Finished with this status (1 succeeded, ≥ 2 failed).
    Status(i32),
    /// Back to queued for another attempt, not before the given time. `keep_key_slot`: it
    /// keeps its per-key concurrency slot meanwhile, and so its place among its key's tasks
    /// (an `ordered` queue's); otherwise the slot is free for the key's next task.
    Retry {
        not_before: Option<DateTime>,
        keep_key_slot: bool,
    },
    /// Finished with this failed status, and no retry will follow: its queue's `retry`
    /// policy is out of attempts, or the plugin refused one (`discarded_at` is set).
    Discarded(i32),
}

impl TaskEnd {
    /// This end, a retry keeping its key slot when `keep` (its queue's keys are `ordered`).
    pub fn keeping_key_slot(self, keep: bool) -> TaskEnd {
        match self {
            TaskEnd::Retry { not_before, .. } => TaskEnd::Retry {
                not_before,
                keep_key_slot: keep,
            },
            other => other,
        }
    }

    /// The status the task shows once this end is recorded.
    pub fn status(self) -> i32 {
        match self {
            TaskEnd::Status(s) | TaskEnd::Discarded(s) => s,
            TaskEnd::Retry { .. } => status::QUEUED,
        }
    }
}

/// The outcome of recording a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    Recorded,
    /// The task is no longer running on this node (given back, reaped or changed by an operator).
    NotOurs,
    /// The document would exceed 16 MiB; nothing was written.
    TooLarge,
}

const RUNNING: [i32; 2] = [status::CLAIMED, status::RUNNING];

impl Store {
    /// Counts claimed and running tasks per queue and on `node`, with the slots they hold.
    pub async fn running_snapshot(
        &self,
        node: &str,
        queues: &[ObjectId],
    ) -> Result<RunningSnapshot> {
        // One branch per queue, each an equality on the leading field of an index: SecantusDB
        // answers `status ∈ running ∧ (queue ∈ list ∨ node)` by reading every task (140 ms at
        // 100 000 queued, once a second per node) but this by index (0.6 ms); mongod plans both
        // as index scans.
        let running = doc! {"$in": RUNNING.to_vec()};
        let mut branches: Vec<Document> = queues
            .iter()
            .map(|q| doc! {task::QUEUE: q, task::STATUS: running.clone()})
            .collect();
        branches.push(doc! {task::NODE: node, task::STATUS: running});
        let pipeline = vec![
            doc! {"$match": {"$or": branches}},
            doc! {"$group": {
                "_id": format!("${}", task::QUEUE),
                "n": {"$sum": 1},
                "mine": {"$sum": {"$cond": [{"$eq": [format!("${}", task::NODE), node]}, 1, 0]}},
                "slots": {"$push": format!("${}", task::SLOT)},
                "nodes": {"$addToSet": format!("${}", task::NODE)},
            }},
        ];
        let mut snap = RunningSnapshot::default();
        for group in self
            .aggregate_all(TASKS, pipeline, "counting running tasks")
            .await?
        {
            let mine = count_field(&group, "mine");
            snap.on_node = snap.on_node.saturating_add(mine);
            let Ok(queue) = group.get_object_id("_id") else {
                continue; // tasks with a malformed queue field still count against the node
            };
            snap.per_queue.insert(queue, count_field(&group, "n"));
            let held = group
                .get_array("slots")
                .map(|slots| slots.iter().filter_map(slot_number).collect())
                .unwrap_or_default();
            snap.slots.insert(queue, held);
            let nodes = group.get_array("nodes").map_or(Vec::new(), |nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            });
            snap.nodes.insert(queue, nodes);
        }
        Ok(snap)
    }

    /// Reads one queue's claimed and running tasks now: for a queue Perl nodes also claim
    /// from, whose claims no slot index refuses, a node must count them as they stand just
    /// before it claims, or it may be the one to push the queue past `threads`.
    pub async fn queue_running(&self, queue: ObjectId) -> Result<QueueRunning> {
        let pipeline = vec![
            doc! {"$match": {task::QUEUE: queue, task::STATUS: {"$in": RUNNING.to_vec()}}},
            doc! {"$group": {
                "_id": Bson::Null,
                "n": {"$sum": 1},
                "slots": {"$push": format!("${}", task::SLOT)},
                "ids": {"$push": format!("${}", task::ID)},
            }},
        ];
        let context = "counting a queue's running tasks";
        let mut out = QueueRunning::default();
        for group in self.aggregate_all(TASKS, pipeline, context).await? {
            out.running = count_field(&group, "n");
            out.slots = group
                .get_array("slots")
                .map(|slots| slots.iter().filter_map(slot_number).collect())
                .unwrap_or_default();
            out.ids = group
                .get_array("ids")
                .map(|ids| ids.iter().filter_map(Bson::as_object_id).collect())
                .unwrap_or_default();
        }
        out.slotless = out.running.saturating_sub(out.slots.len() as u32);
        Ok(out)
    }

    /// Moves a task claimed by `node` to running as attempt `attempt` (its fencing token,
    /// counted in `attempts`) and returns it; None if it is no longer ours.
    pub async fn start_task(
        &self,
        id: ObjectId,
        node: &str,
        attempt: ObjectId,
    ) -> Result<Option<Document>> {
        let found = self
            .raw(TASKS)
            .find_one_and_update(
                doc! {task::ID: id, task::STATUS: status::CLAIMED, task::NODE: node},
                doc! {
                    "$set": {task::STATUS: status::RUNNING, task::MTIME: fleet_time::now(), task::ATTEMPT: attempt},
                    "$inc": {task::ATTEMPTS: 1},
                },
            )
            .return_document(ReturnDocument::After)
            .await
            .map_err(|e| Error::mongo(format!("starting task {id}"), e))?;
        self.decode_one(TASKS, found)
    }

    /// Records a result in one write: outputs, `mtime`, the slot and lease freed, and either a
    /// final status with `complete: true` or, for a retry, back to queued (after `not_before`).
    /// Conditional on the task still running on `node` as `attempt`: once recovery has taken
    /// a task from an attempt, that attempt's result never lands, so a task and its attempt
    /// records always agree.
    pub async fn finish_task(
        &self,
        id: ObjectId,
        node: &str,
        attempt: ObjectId,
        end: TaskEnd,
        stdout: OutputValue,
        stderr: OutputValue,
    ) -> Result<FinishOutcome> {
        let (filter, update) =
            finish_statement(id, node, attempt, end, stdout, stderr, fleet_time::now());
        let to = super::results::completions::end_group(end);
        match self.update_one_counted(filter, update, Some(to)).await {
            Ok(true) => Ok(FinishOutcome::Recorded),
            Ok(false) => Ok(FinishOutcome::NotOurs),
            Err(e) if super::is_document_too_large(&e) => Ok(FinishOutcome::TooLarge),
            Err(e) => Err(Error::mongo(
                format!("recording the result of task {id}"),
                e,
            )),
        }
    }

    /// Disbatch's orphan rule: tasks this node claimed but never started, older than `age`,
    /// become orphaned (-6). Handles BSON-date and legacy epoch-seconds `mtime`. Claims with a
    /// lease are left to lease recovery, which requeues them sooner.
    pub async fn reap_orphans(&self, node: &str, age: Duration) -> Result<u64> {
        let cutoff_ms = fleet_time::now().timestamp_millis() - age.as_millis() as i64;
        let update = doc! {
            "$set": {task::STATUS: status::ORPHANED, task::MTIME: fleet_time::now()},
            "$unset": release_holds(&[]),
        };
        // One write per `mtime` type rather than one `$or` of both: SecantusDB answers the `$or`
        // by reading every task (180 ms at 100 000 queued, against 3 ms each this way).
        let mut reaped = 0;
        for before in [
            Bson::DateTime(DateTime::from_millis(cutoff_ms)),
            Bson::Double(cutoff_ms as f64 / 1000.0),
        ] {
            let filter = doc! {
                task::NODE: node,
                task::STATUS: status::CLAIMED,
                task::LEASE_UNTIL: {"$exists": false},
                task::MTIME: {"$lt": before},
            };
            reaped += self
                .update_each_counted(filter, update.clone(), StatusGroup::Orphaned)
                .await
                .map_err(|e| Error::mongo("reaping orphaned tasks", e))?;
        }
        Ok(reaped)
    }

    /// Returns tasks claimed by `node` but not yet started to the queue (on shutdown, or
    /// `only` one task whose runner could not be spawned).
    pub async fn give_back_claimed(&self, node: &str, only: Option<ObjectId>) -> Result<u64> {
        let mut filter = doc! {task::NODE: node, task::STATUS: status::CLAIMED};
        if let Some(id) = only {
            filter.insert(task::ID, id);
        }
        let update = doc! {
            "$set": {task::NODE: Bson::Null, task::STATUS: status::QUEUED, task::MTIME: fleet_time::now()},
            "$unset": release_holds(&[task::LEASE_UNTIL]),
        };
        self.update_each_counted(filter, update, StatusGroup::Queued)
            .await
            .map_err(|e| Error::mongo("giving back claimed tasks", e))
    }

    /// Inserts queued tasks in Disbatch 4's creation shape, in one round trip. Returns per
    /// input its task: the new one, or for a queue with `unique` the existing one it
    /// duplicates (`create_tasks` says which).
    pub async fn insert_tasks(
        &self,
        queue: ObjectId,
        params: Vec<Document>,
    ) -> Result<Vec<ObjectId>> {
        Ok(self.create_tasks(queue, params).await?.ids)
    }

    /// `insert_tasks`, saying which inputs were duplicates of existing tasks (`unique`).
    pub async fn create_tasks(&self, queue: ObjectId, params: Vec<Document>) -> Result<Created> {
        self.create_tasks_at(queue, params, &[]).await
    }

    /// `create_tasks`, task `i` with `timings[i]`'s fields (none past the list's end).
    pub async fn create_tasks_at(
        &self,
        queue: ObjectId,
        params: Vec<Document>,
        timings: &[Timing],
    ) -> Result<Created> {
        let many = params.len() > 1;
        let label = |i: usize| match many {
            true => format!("params[{i}]"),
            false => "params".to_string(),
        };
        self.create_labelled(queue, params, timings, &label).await
    }

    /// `create_tasks`, naming input `i` as `label(i)` in errors.
    pub(crate) async fn create_labelled(
        &self,
        queue: ObjectId,
        params: Vec<Document>,
        timings: &[Timing],
        label: &(dyn Fn(usize) -> String + Sync),
    ) -> Result<Created> {
        let unique = self.unique_of(queue).await?;
        let now = fleet_time::now();
        let mut docs: Vec<Document> = params
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut d = doc! {
                    task::ID: ObjectId::new(), task::QUEUE: queue, task::STATUS: status::QUEUED, task::NODE: Bson::Null,
                    task::PARAMS: p, task::CTIME: now, task::MTIME: now,
                    task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
                };
                timings.get(i).copied().unwrap_or_default().stamp(&mut d);
                d
            })
            .collect();
        let ids: Vec<ObjectId> = docs
            .iter()
            .filter_map(|d| d.get_object_id(task::ID).ok())
            .collect();
        let context = || format!("inserting tasks into queue {queue}");
        let Some(unique) = unique else {
            self.collection(TASKS)
                .insert_many(&docs)
                .await
                .map_err(|e| Error::mongo(context(), e))?;
            self.count_created(queue, ids.len()).await;
            return Ok(Created {
                ids,
                ..Created::default()
            });
        };
        for (i, d) in docs.iter_mut().enumerate() {
            stamp_unique_key(&unique, d)
                .map_err(|why| Error::Invalid(format!("{}: {why}", label(i))))?;
        }
        let held = self.place_unique(queue, &unique, &mut docs).await?;
        let skipped: Vec<bool> = held.iter().map(Option::is_some).collect();
        let went_in = self.insert_unordered(&docs, &skipped, &context()).await?;
        let mut out = Created {
            ids,
            duplicates: Vec::new(),
            unique: true,
        };
        for (i, d) in docs.iter().enumerate() {
            let fate = match held[i] {
                Some(holder) => Fate::Duplicate(holder),
                None if went_in[i] => Fate::New,
                // Only the unique key's index can refuse a new task (its `_id` is fresh).
                None if !d.contains_key(task::UNIQUE_KEY) => {
                    return Err(Error::Invalid(format!(
                        "inserting tasks into queue {queue}: a unique index refused task {i}, which has no unique key"
                    )))
                }
                None => self.settle_unique(queue, &unique, d, None).await?,
            };
            if let Fate::Duplicate(holder) = fate {
                out.ids[i] = holder;
                out.duplicates.push(i);
            }
        }
        self.count_created(queue, out.ids.len() - out.duplicates.len())
            .await;
        Ok(out)
    }

    async fn count_created(&self, queue: ObjectId, n: usize) {
        if n == 0 {
            return;
        }
        let created = super::Moved {
            n: n as u64,
            ..super::Moved::new(queue, None, Some(StatusGroup::Queued))
        };
        self.count_moves(&[created]).await;
    }

    /// True when a queue has a task claimable now or one claimed or running (Coordinate's
    /// "available or pending"), which keeps a continuous queue from getting a new one.
    pub async fn has_live_task(&self, queue: ObjectId) -> Result<bool> {
        let filter = doc! {
            task::QUEUE: queue,
            "$or": [
                {task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]}},
                {task::STATUS: status::QUEUED, "$or": [{task::NOT_BEFORE: Bson::Null}, {task::NOT_BEFORE: {"$lte": fleet_time::now()}}]},
            ],
        };
        self.raw(TASKS)
            .find_one(filter)
            .projection(doc! {task::ID: 1})
            .await
            .map(|d| d.is_some())
            .map_err(|e| Error::mongo(format!("looking for live tasks of queue {queue}"), e))
    }

    /// Whether task `id` exists: one read by `_id` of that field only.
    pub async fn task_exists(&self, id: ObjectId) -> Result<bool> {
        self.raw(TASKS)
            .find_one(doc! {task::ID: id})
            .projection(doc! {task::ID: 1})
            .await
            .map(|found| found.is_some())
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))
    }

    pub async fn get_task(&self, id: ObjectId) -> Result<Option<Document>> {
        let found = self
            .raw(TASKS)
            .find_one(doc! {task::ID: id})
            .await
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))?;
        self.decode_one(TASKS, found)
    }
}

fn count_field(doc: &Document, key: &str) -> u32 {
    super::count_value(doc.get(key)).min(u32::MAX as u64) as u32
}

fn slot_number(b: &Bson) -> Option<u32> {
    match b {
        Bson::Int32(n) => u32::try_from(*n).ok(),
        Bson::Int64(n) => u32::try_from(*n).ok(),
        _ => None,
    }
}

/// The fenced result write of one attempt: its filter and update. The write matches only
/// while the task still runs as this attempt on this node.
pub(crate) fn finish_statement(
    id: ObjectId,
    node: &str,
    attempt: ObjectId,
    end: TaskEnd,
    stdout: OutputValue,
    stderr: OutputValue,
    now: DateTime,
) -> (Document, Document) {
    let filter = doc! {
        task::ID: id,
        task::STATUS: status::RUNNING,
        task::NODE: node,
        task::ATTEMPT: attempt,
    };
    let mut set = doc! {
        task::STDOUT: Bson::from(stdout),
        task::STDERR: Bson::from(stderr),
        task::MTIME: now,
    };
    // The live copy goes in the same write: the output itself is stored now.
    let mut unset = doc! {
        task::SLOT: "", task::LEASE_UNTIL: "", task::CANCEL_REQUESTED: "", task::LIVE_OUTPUT: "",
    };
    match end {
        TaskEnd::Status(s) | TaskEnd::Discarded(s) => {
            set.insert(task::STATUS, s);
            set.insert(task::COMPLETE, true);
            if matches!(end, TaskEnd::Discarded(_)) {
                set.insert(task::DISCARDED_AT, now);
            }
            unset.insert(task::CONCURRENCY_KEY, "");
            unset.insert(task::CONCURRENCY_SLOT, "");
        }
        // A task waiting for its retry in an `ordered` queue keeps its key slot, and so its
        // place among its key's tasks; its next claim holds the same slot again. Elsewhere a
        // retry's wait must not hold up the key's other tasks.
        TaskEnd::Retry {
            not_before,
            keep_key_slot,
        } => {
            if !keep_key_slot {
                unset.insert(task::CONCURRENCY_KEY, "");
                unset.insert(task::CONCURRENCY_SLOT, "");
            }
            set.insert(task::STATUS, status::QUEUED);
            set.insert(task::NODE, Bson::Null);
            unset.insert(task::COMPLETE, "");
            match not_before {
                Some(t) => set.insert(task::NOT_BEFORE, t),
                None => unset.insert(task::NOT_BEFORE, ""),
            };
        }
    }
    (filter, doc! {"$set": set, "$unset": unset})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_inline_output_is_stored_as_null_like_disbatch() {
        assert_eq!(Bson::from(OutputValue::Text(String::new())), Bson::Null);
        assert_eq!(Bson::from(OutputValue::Null), Bson::Null);
        assert_eq!(
            Bson::from(OutputValue::Text("x".into())),
            Bson::String("x".into())
        );
        let file = ObjectId::new();
        assert_eq!(Bson::from(OutputValue::File(file)), Bson::ObjectId(file));
    }
}
