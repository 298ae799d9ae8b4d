//! Tasks: storing, starting and finishing them, reaping and giving back; in its files, their
//! creation, unique keys, queries, operator control, counts, summaries and retention.

domain_handle!(
    /// Tasks: creating, starting, querying, controlling, counting and pruning them.
    TaskStore,
    tasks
);

pub(crate) mod control;
pub(crate) mod counts;
pub(crate) mod create;
pub(crate) mod query;
pub(crate) mod retention;
pub(crate) mod summary;
pub(crate) mod unique;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use mongodb::options::ReturnDocument;

use super::tasks::create::{Created, Timing};
use super::tasks::unique::{stamp_unique_key, Fate};
use super::{StatusGroup, Store};
use crate::error::{Error, Result};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::status;

impl TaskStore<'_> {
    /// Moves a task claimed by `node` to running as attempt `attempt` (its fencing token,
    /// counted in `attempts`) and returns it; None if it is no longer ours.
    pub async fn start_task(
        self,
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

    /// Inserts queued tasks in Disbatch 4's creation shape, in one round trip. Returns per
    /// input its task: the new one, or for a queue with `unique` the existing one it
    /// duplicates (`create_tasks` says which).
    pub async fn insert_tasks(
        self,
        queue: ObjectId,
        params: Vec<Document>,
    ) -> Result<Vec<ObjectId>> {
        Ok(self.create_tasks(queue, params).await?.ids)
    }

    /// `insert_tasks`, saying which inputs were duplicates of existing tasks (`unique`).
    pub async fn create_tasks(self, queue: ObjectId, params: Vec<Document>) -> Result<Created> {
        self.create_tasks_at(queue, params, &[]).await
    }

    /// `create_tasks`, task `i` with `timings[i]`'s fields (none past the list's end).
    pub async fn create_tasks_at(
        self,
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

    /// True when a queue has a task claimable now or one claimed or running (Coordinate's
    /// "available or pending"), which keeps a continuous queue from getting a new one.
    pub async fn has_live_task(self, queue: ObjectId) -> Result<bool> {
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
    pub async fn task_exists(self, id: ObjectId) -> Result<bool> {
        self.raw(TASKS)
            .find_one(doc! {task::ID: id})
            .projection(doc! {task::ID: 1})
            .await
            .map(|found| found.is_some())
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))
    }

    pub async fn get_task(self, id: ObjectId) -> Result<Option<Document>> {
        let found = self
            .raw(TASKS)
            .find_one(doc! {task::ID: id})
            .await
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))?;
        self.decode_one(TASKS, found)
    }
}

impl Store {
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
}
