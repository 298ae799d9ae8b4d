//! Operator actions on tasks: cancel, retry (one or a queue's), discard, delete with its output
//! files.

use crate::TaskStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};

use crate::claims::candidates::release_holds;
use crate::error::{Error, Result};
use crate::{StatusGroup, Store, WriteCounts};
use disbatch_model::fleet_time;
use disbatch_model::schema::{chunk, file, task, CHUNKS, FILES, TASKS};
use disbatch_model::status;

/// The result of an action on one task.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlOutcome {
    Done(WriteCounts),
    /// Asked of a running task's runner, which carries it out within seconds.
    Requested(WriteCounts),
    NotFound,
    /// The task is in a status the action does not apply to.
    WrongStatus(Bson),
    /// Tasks wait on it (this many, blocked; 0 while a dependent is being created or its
    /// mark is still to be settled): deleting it would leave them waiting for ever.
    WaitedOn(u64),
}

/// Statuses a task may be retried from: finished, orphaned, cancelled, terminated.
pub fn is_retryable(s: i64) -> bool {
    s >= status::SUCCEEDED as i64
        || s == status::ORPHANED as i64
        || s == status::CANCELLED as i64
        || s == status::TERMINATED as i64
}

impl TaskStore<'_> {
    /// Queued, blocked or claimed-but-unstarted → cancelled at once (a claimed task's runner
    /// then finds nothing to start); running → a cancel request its runner acts on.
    pub async fn cancel_task(self, id: ObjectId) -> Result<ControlOutcome> {
        let waiting = [status::QUEUED, status::BLOCKED, status::CLAIMED];
        let filter = doc! {task::ID: id, task::STATUS: {"$in": waiting.to_vec()}};
        let update = doc! {
            "$set": {task::STATUS: status::CANCELLED, task::MTIME: fleet_time::now()},
            "$unset": release_holds(&[task::LEASE_UNTIL, task::WAITING_ON]),
        };
        let cancelled = self
            .update_one_counted(filter, update, Some(StatusGroup::Cancelled))
            .await
            .map_err(|e| Error::mongo(format!("cancelling task {id}"), e))?;
        if cancelled {
            // What waits on it follows its policy now, not at the leader's next sweep; but
            // after the answer, as a cascade down a long chain takes a while.
            if self.is_marked_waited_for(id).await? {
                self.workflows().settle_dependents_later(vec![id]);
            }
            return Ok(ControlOutcome::Done(one_changed()));
        }
        let running = doc! {task::ID: id, task::STATUS: status::RUNNING};
        let request = doc! {"$set": {task::CANCEL_REQUESTED: fleet_time::now()}};
        let r = self
            .collection(TASKS)
            .update_one(running, request)
            .await
            .map_err(|e| Error::mongo(format!("asking to cancel task {id}"), e))?;
        if r.matched_count == 1 {
            return Ok(ControlOutcome::Requested(WriteCounts::from(r)));
        }
        self.why_not(id).await
    }

    /// A finished, orphaned, cancelled or terminated task back to queued, output cleared.
    /// Its GridFS files are kept: they still carry `metadata.task_id`.
    pub async fn retry_task(self, id: ObjectId) -> Result<ControlOutcome> {
        let filter = doc! {task::ID: id, "$or": retryable_filter()};
        self.control_one(id, filter, requeue_update(), "retrying")
            .await
    }

    /// A failed task (status ≥ 2) marked discarded by hand: given up on, as a retry policy
    /// marks one out of attempts, so it is listed and counted with them and no longer among
    /// the failures still to look at. Its status and output stay; a retry clears the mark.
    /// Already discarded is done, with nothing modified.
    pub async fn discard_task(self, id: ObjectId) -> Result<ControlOutcome> {
        let failed = doc! {task::ID: id, task::STATUS: {"$gte": status::FAILED}};
        let mut filter = failed.clone();
        filter.insert(task::DISCARDED_AT, doc! {"$exists": false});
        let marked = self
            .update_one_counted(
                filter,
                doc! {"$set": {task::DISCARDED_AT: fleet_time::now()}},
                Some(StatusGroup::Failed),
            )
            .await
            .map_err(|e| Error::mongo(format!("discarding task {id}"), e))?;
        if marked {
            return Ok(ControlOutcome::Done(one_changed()));
        }
        let already = self
            .collection(TASKS)
            .count_documents(failed)
            .await
            .map_err(|e| Error::mongo(format!("discarding task {id}"), e))?;
        if already == 1 {
            return Ok(ControlOutcome::Done(WriteCounts {
                matched: 1,
                ..Default::default()
            }));
        }
        self.why_not(id).await
    }

    /// Requeues every task of `queue` whose status is one of `statuses`: one write per
    /// status group they fall in (at most five: succeeded, failed, terminated, cancelled,
    /// orphaned), so each write's count says which group its tasks left.
    pub async fn retry_queue(self, queue: ObjectId, statuses: &[i32]) -> Result<WriteCounts> {
        let mut by_group: Vec<(StatusGroup, Vec<i32>)> = Vec::new();
        for s in statuses {
            let group = crate::group_of(*s);
            match by_group.iter_mut().find(|(g, _)| *g == group) {
                Some((_, codes)) if codes.contains(s) => {}
                Some((_, codes)) => codes.push(*s),
                None => by_group.push((group, vec![*s])),
            }
        }
        let mut total = WriteCounts::default();
        for (group, codes) in by_group {
            let filter = doc! {task::QUEUE: queue, task::STATUS: {"$in": codes}};
            let r = self.requeue_counted(queue, filter, group).await?;
            total.matched += r.matched;
            total.modified += r.modified;
        }
        Ok(total)
    }

    /// Requeues every failed task of `queue`: status 2 and the plugin-defined codes above it,
    /// all that Disbatch counts as failed (numbers only: a string status is no failure code).
    pub async fn retry_queue_failed(self, queue: ObjectId) -> Result<WriteCounts> {
        let failed = doc! {task::QUEUE: queue, task::STATUS: {"$gte": status::FAILED}};
        self.requeue_counted(queue, failed, StatusGroup::Failed)
            .await
    }

    /// Cancels every task of `queue` that waits to run: queued (-2) and blocked (-4), the
    /// statuses `cancel_task` cancels at once. Claimed and running tasks are left alone: they
    /// are cancelled one by one (a running one is stopped by its node).
    pub async fn cancel_queue(self, queue: ObjectId) -> Result<WriteCounts> {
        // One write per status, so each one's count says which group its tasks left.
        let mut total = WriteCounts::default();
        for s in [status::QUEUED, status::BLOCKED] {
            let r = self
                .collection(TASKS)
                .update_many(
                    doc! {task::QUEUE: queue, task::STATUS: s},
                    doc! {
                        "$set": {task::STATUS: status::CANCELLED, task::MTIME: fleet_time::now()},
                        "$unset": release_holds(&[task::LEASE_UNTIL, task::WAITING_ON]),
                    },
                )
                .await
                .map_err(|e| Error::mongo(format!("cancelling tasks of queue {queue}"), e))?;
            let moved = crate::Moved {
                n: r.modified_count,
                ..crate::Moved::new(
                    queue,
                    Some(crate::group_of(s)),
                    Some(StatusGroup::Cancelled),
                )
            };
            self.count_moves(&[moved]).await;
            total.matched += r.matched_count;
            total.modified += r.modified_count;
        }
        Ok(total)
    }

    /// Deletes a task that is not claimed or running, then its output files.
    ///
    /// Never a task others wait on: its `has_dependents` mark is set before any dependent is
    /// stored and cleared once its end is settled, so the delete's own filter decides. An
    /// ended task whose end is still to be settled is settled first.
    pub async fn delete_task(self, id: ObjectId) -> Result<ControlOutcome> {
        let mut deleted = self.delete_unwaited(id).await?;
        if deleted.is_none() && self.is_marked_waited_for(id).await? {
            // Settling skips a task still live, which stays marked.
            self.workflows().settle_dependents(&[id]).await?;
            deleted = self.delete_unwaited(id).await?;
            if deleted.is_none() && self.is_marked_waited_for(id).await? {
                let waiting = self
                    .collection(TASKS)
                    .count_documents(doc! {task::WAITING_ON: id, task::STATUS: status::BLOCKED})
                    .await
                    .map_err(|e| Error::mongo(format!("counting what waits on task {id}"), e))?;
                return Ok(ControlOutcome::WaitedOn(waiting));
            }
        }
        let Some(deleted) = deleted else {
            return self.why_not(id).await;
        };
        if let Ok(queue) = deleted.get_object_id(task::QUEUE) {
            let from = StatusGroup::of(deleted.get(task::STATUS));
            let moved = crate::Moved {
                discarded: -i64::from(deleted.contains_key(task::DISCARDED_AT)),
                ..crate::Moved::new(queue, Some(from), None)
            };
            self.count_moves(&[moved]).await;
        }
        self.delete_task_files(id).await?;
        Ok(ControlOutcome::Done(WriteCounts {
            deleted: 1,
            ..Default::default()
        }))
    }
}

impl Store {
    /// Requeues the tasks of `queue` that match `filter` (all in status group `from`) and
    /// counts them: discarded ones, if any (one read of the partial `{queue, discarded_at}`
    /// index says), first in a write of their own, so that the count of discarded tasks
    /// loses exactly those the requeue cleared; the rest in one write.
    async fn requeue_counted(
        &self,
        queue: ObjectId,
        filter: bson::Document,
        from: StatusGroup,
    ) -> Result<WriteCounts> {
        let mut discarded = filter.clone();
        discarded.insert(task::DISCARDED_AT, doc! {"$gte": DateTime::from_millis(0)});
        let any_discarded = self
            .collection(TASKS)
            .find_one(discarded.clone())
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo(format!("retrying tasks of queue {queue}"), e))?
            .is_some();
        let mut writes = vec![(filter, false)];
        if any_discarded {
            writes.insert(0, (discarded, true));
        }
        let mut total = WriteCounts::default();
        for (filter, marked) in writes {
            let r = self
                .collection(TASKS)
                .update_many(filter, requeue_update())
                .await
                .map_err(|e| Error::mongo(format!("retrying tasks of queue {queue}"), e))?;
            let n = i64::try_from(r.modified_count).unwrap_or(i64::MAX);
            let moved = crate::Moved {
                n: r.modified_count,
                discarded: if marked { -n } else { 0 },
                ..crate::Moved::new(queue, Some(from), Some(StatusGroup::Queued))
            };
            self.count_moves(&[moved]).await;
            total.matched += r.matched_count;
            total.modified += r.modified_count;
        }
        Ok(total)
    }

    /// Deletes task `id` unless it runs or is marked as waited for.
    async fn delete_unwaited(&self, id: ObjectId) -> Result<Option<bson::Document>> {
        let filter = doc! {
            task::ID: id, task::STATUS: {"$nin": [status::CLAIMED, status::RUNNING]},
            task::HAS_DEPENDENTS: {"$ne": true},
        };
        self.collection(TASKS)
            .find_one_and_delete(filter)
            .projection(doc! {task::QUEUE: 1, task::STATUS: 1, task::DISCARDED_AT: 1})
            .await
            .map_err(|e| Error::mongo(format!("deleting task {id}"), e))
    }

    async fn delete_task_files(&self, id: ObjectId) -> Result<()> {
        let context = format!("finding output files of task {id}");
        let cursor = self
            .raw(FILES)
            .find(doc! {file::METADATA_TASK_ID: id})
            .projection(doc! {file::ID: 1})
            .await
            .map_err(|e| Error::mongo(context.clone(), e))?;
        let files = self.read_all(FILES, cursor, &context).await?;
        let ids: Vec<ObjectId> = files
            .iter()
            .filter_map(|f| f.get_object_id(file::ID).ok())
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        self.collection(CHUNKS)
            .delete_many(doc! {chunk::FILES_ID: {"$in": ids.clone()}})
            .await
            .map_err(|e| Error::mongo(format!("deleting output chunks of task {id}"), e))?;
        self.collection(FILES)
            .delete_many(doc! {file::ID: {"$in": ids}})
            .await
            .map_err(|e| Error::mongo(format!("deleting output files of task {id}"), e))?;
        Ok(())
    }

    async fn control_one(
        &self,
        id: ObjectId,
        filter: bson::Document,
        update: Vec<bson::Document>,
        what: &str,
    ) -> Result<ControlOutcome> {
        let done = self
            .update_one_counted(filter, update, Some(StatusGroup::Queued))
            .await
            .map_err(|e| Error::mongo(format!("{what} task {id}"), e))?;
        if done {
            Ok(ControlOutcome::Done(one_changed()))
        } else {
            self.why_not(id).await
        }
    }

    async fn why_not(&self, id: ObjectId) -> Result<ControlOutcome> {
        Ok(match self.tasks().get_task(id).await? {
            None => ControlOutcome::NotFound,
            Some(t) => {
                ControlOutcome::WrongStatus(t.get(task::STATUS).cloned().unwrap_or(Bson::Null))
            }
        })
    }
}

/// What one matched and changed task reports, as `update_one` did.
fn one_changed() -> WriteCounts {
    WriteCounts {
        matched: 1,
        modified: 1,
        ..Default::default()
    }
}

fn retryable_filter() -> Vec<bson::Document> {
    vec![
        doc! {task::STATUS: {"$gte": status::SUCCEEDED}},
        doc! {task::STATUS: {"$in": [status::ORPHANED, status::CANCELLED, status::TERMINATED]}},
    ]
}

/// A pipeline, to note the attempts made so far: a task retried by hand gets its retry
/// policy's and `max_retries`' attempts again, and `attempts` still counts every start.
fn requeue_update() -> Vec<bson::Document> {
    // A discarded task retried by hand is no longer given up on.
    let unset: Vec<String> = release_holds(&[
        task::COMPLETE,
        task::LEASE_UNTIL,
        task::CANCEL_REQUESTED,
        task::LIVE_OUTPUT,
        task::DISCARDED_AT,
    ])
    .into_iter()
    .map(|(field, _)| field)
    .collect();
    vec![
        doc! {"$set": {
            task::STATUS: status::QUEUED,
            task::NODE: Bson::Null,
            task::STDOUT: Bson::Null,
            task::STDERR: Bson::Null,
            task::MTIME: fleet_time::now(),
            task::ATTEMPTS_BEFORE_RETRY: {"$ifNull": [format!("${}", task::ATTEMPTS), 0]},
        }},
        doc! {"$unset": unset},
    ]
}
