//! Pruning: ended tasks past their queue's retention deleted with their attempts and GridFS
//! output, in bounded batches, never one that others still wait on, and counted out of
//! `task_counts`.

use crate::TaskStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::IndexOptions;
use mongodb::IndexModel;

use crate::error::{Error, Result};
use crate::{Moved, StatusGroup, Store};
use disbatch_model::retention::Ended;
use disbatch_model::schema::{attempt, chunk, file, task, ATTEMPTS, CHUNKS, FILES, TASKS};
use disbatch_model::status;

/// The index pruning reads by: a queue's tasks in one status, by age. Made when a policy is
/// first in force, not at start: a fleet that keeps everything pays nothing for it.
pub const RETENTION_INDEX: &str = "queue_1_status_1_mtime_1";

/// The GridFS files a task's output may be in: Disbatch's, and results too large for their
/// attempt record (read through Disbatch's `{filename, metadata.task_id}` index).
const OUTPUT_FILENAMES: [&str; 3] = ["stdout", "stderr", "result"];

/// The `status` condition of `state`'s tasks (numbers only: a string status is in no state).
fn status_filter(state: Ended) -> Bson {
    match state {
        Ended::Succeeded => Bson::Int32(status::SUCCEEDED),
        Ended::Failed => bson::bson!({"$gte": status::FAILED}),
        Ended::Cancelled => bson::bson!({"$in": [status::CANCELLED, status::TERMINATED]}),
    }
}

/// What one call deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub tasks: u64,
    pub attempts: u64,
    pub files: u64,
}

impl Pruned {
    fn add(&mut self, other: Pruned) {
        self.tasks += other.tasks;
        self.attempts += other.attempts;
        self.files += other.files;
    }
}

/// One status group of a state, and whether its tasks carry the discarded mark: each is
/// deleted on its own, so its deletes are counted out of the right count.
fn parts(state: Ended) -> Vec<(Bson, StatusGroup, Option<bool>)> {
    match state {
        Ended::Succeeded => vec![(Bson::Int32(status::SUCCEEDED), StatusGroup::Succeeded, None)],
        Ended::Failed => vec![
            (status_filter(state), StatusGroup::Failed, Some(true)),
            (status_filter(state), StatusGroup::Failed, Some(false)),
        ],
        Ended::Cancelled => vec![
            (Bson::Int32(status::CANCELLED), StatusGroup::Cancelled, None),
            (
                Bson::Int32(status::TERMINATED),
                StatusGroup::Terminated,
                None,
            ),
        ],
    }
}

impl TaskStore<'_> {
    pub async fn ensure_retention_index(self) -> Result<()> {
        let model = IndexModel::builder()
            .keys(doc! {task::QUEUE: 1, task::STATUS: 1, task::MTIME: 1})
            .options(
                IndexOptions::builder()
                    .name(RETENTION_INDEX.to_string())
                    .build(),
            )
            .build();
        self.collection(TASKS)
            .create_index(model)
            .await
            .map_err(|e| Error::mongo("creating the retention index on tasks", e))?;
        Ok(())
    }

    /// Deletes up to `limit` tasks of `queue` in `state` last changed before `before`, with
    /// their attempts and output files. A task others wait on (`has_dependents`) is left until
    /// its end is settled. Attempts and files go first: a call cut short leaves tasks without
    /// their history, which the next call deletes, never history without its task.
    pub async fn prune_ended(
        self,
        queue: ObjectId,
        state: Ended,
        before: DateTime,
        limit: usize,
    ) -> Result<Pruned> {
        let mut total = Pruned::default();
        for (status_filter, group, discarded) in parts(state) {
            let left = limit.saturating_sub(usize::try_from(total.tasks).unwrap_or(usize::MAX));
            if left == 0 {
                break;
            }
            let mut filter = doc! {
                task::QUEUE: queue,
                task::STATUS: status_filter,
                task::MTIME: {"$lt": before},
                task::HAS_DEPENDENTS: {"$ne": true},
            };
            if let Some(marked) = discarded {
                filter.insert(task::DISCARDED_AT, doc! {"$exists": marked});
            }
            let pruned = self
                .prune_part(queue, filter, group, discarded, left)
                .await?;
            total.add(pruned);
        }
        Ok(total)
    }
}

impl Store {
    async fn prune_part(
        &self,
        queue: ObjectId,
        filter: Document,
        group: StatusGroup,
        discarded: Option<bool>,
        limit: usize,
    ) -> Result<Pruned> {
        let context = format!("pruning ended tasks of queue {queue}");
        let ids: Vec<ObjectId> = self
            .collection(TASKS)
            .find(filter.clone())
            .projection(doc! {task::ID: 1})
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .iter()
            // A task without an ObjectId `_id` has no attempts or files of ours: left alone.
            .filter_map(|d| d.get_object_id(task::ID).ok())
            .collect();
        if ids.is_empty() {
            return Ok(Pruned::default());
        }
        let attempts = self
            .collection(ATTEMPTS)
            .delete_many(doc! {attempt::TASK: {"$in": &ids}})
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .deleted_count;
        let files: Vec<Bson> = self
            .collection(FILES)
            .find(doc! {
                file::FILENAME: {"$in": OUTPUT_FILENAMES.to_vec()},
                file::METADATA_TASK_ID: {"$in": &ids},
            })
            .projection(doc! {file::ID: 1})
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .try_collect::<Vec<Document>>()
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .into_iter()
            .filter_map(|d| d.get(file::ID).cloned())
            .collect();
        if !files.is_empty() {
            self.collection(CHUNKS)
                .delete_many(doc! {chunk::FILES_ID: {"$in": &files}})
                .await
                .map_err(|e| Error::mongo(&context, e))?;
            self.collection(FILES)
                .delete_many(doc! {file::ID: {"$in": &files}})
                .await
                .map_err(|e| Error::mongo(&context, e))?;
        }
        // The same conditions again: a task retried or waited on since the read stays. The
        // ids first: a server that plans by the first field reads only these.
        let mut delete = doc! {task::ID: {"$in": &ids}};
        delete.extend(filter);
        let tasks = self
            .collection(TASKS)
            .delete_many(delete)
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .deleted_count;
        let n = i64::try_from(tasks).unwrap_or(i64::MAX);
        self.count_moves(&[Moved {
            n: tasks,
            discarded: if discarded == Some(true) { -n } else { 0 },
            ..Moved::new(queue, Some(group), None)
        }])
        .await;
        Ok(Pruned {
            tasks,
            attempts,
            files: files.len() as u64,
        })
    }
}
