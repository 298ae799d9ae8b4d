//! Attempt records: one per run of a task, written when it starts and when it ends.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;

use super::schema::{attempt, ATTEMPTS};
use super::Store;
use crate::error::{Error, Result};

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptEnd {
    /// succeeded, failed, retry, cancelled, timed_out or discarded (the task had changed hands).
    pub outcome: &'static str,
    pub status: Option<i32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// The plugin's result-file object.
    pub result: Option<Document>,
}

impl Store {
    pub async fn record_attempt_start(
        &self,
        id: ObjectId,
        task: ObjectId,
        queue: Option<ObjectId>,
        node: &str,
        pid: u32,
    ) -> Result<()> {
        let record = doc! {
            attempt::ID: id, attempt::TASK: task, attempt::QUEUE: queue.map_or(Bson::Null, Bson::ObjectId),
            attempt::NODE: node, attempt::PID: pid as i64, attempt::START: DateTime::now(),
            attempt::END: Bson::Null, attempt::OUTCOME: "running",
        };
        self.collection(ATTEMPTS)
            .insert_one(record)
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo(format!("recording attempt {id} of task {task}"), e))
    }

    pub async fn record_attempt_end(&self, id: ObjectId, end: &AttemptEnd) -> Result<()> {
        let opt = |v: Option<i32>| v.map_or(Bson::Null, Bson::Int32);
        let set = doc! {
            attempt::END: DateTime::now(), attempt::OUTCOME: end.outcome, attempt::STATUS: opt(end.status),
            attempt::EXIT_CODE: opt(end.exit_code), attempt::SIGNAL: opt(end.signal),
            attempt::RESULT: end.result.clone().map_or(Bson::Null, Bson::Document),
        };
        // A discarded result must not hide that recovery already closed the attempt as lost.
        let mut filter = doc! {attempt::ID: id};
        if end.outcome == "discarded" {
            filter.insert(attempt::OUTCOME, "running");
        }
        self.collection(ATTEMPTS)
            .update_one(filter, doc! {"$set": set})
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo(format!("closing attempt {id}"), e))
    }

    /// A task's attempts, oldest first.
    pub async fn attempts_of(&self, task: ObjectId) -> Result<Vec<Document>> {
        self.collection(ATTEMPTS)
            .find(doc! {attempt::TASK: task})
            .sort(doc! {attempt::START: 1})
            .await
            .map_err(|e| Error::mongo(format!("listing attempts of task {task}"), e))?
            .try_collect()
            .await
            .map_err(|e| Error::mongo(format!("listing attempts of task {task}"), e))
    }
}

/// What a closed-by-repair attempt is called, from its task as it stands.
fn outcome_from_task(task: Option<&Document>, attempt_id: ObjectId) -> &'static str {
    let Some(task) = task else {
        return "abandoned"; // the task was deleted
    };
    if task.get_object_id(super::schema::task::ATTEMPT).ok() != Some(attempt_id) {
        return "abandoned";
    }
    match task.get(super::schema::task::STATUS) {
        Some(Bson::Int32(1)) => "succeeded",
        Some(Bson::Int32(s)) if *s >= 2 => "failed",
        Some(Bson::Int32(-5)) => "cancelled",
        _ => "abandoned",
    }
}

impl Store {
    /// Closes attempt records left open by a runner that died after its task moved on (its
    /// result written, or the task recovered): older than `age`, and whose task no longer
    /// runs as that attempt. Returns how many were closed.
    pub async fn close_abandoned_attempts(&self, age: std::time::Duration) -> Result<u64> {
        use super::schema::{task, TASKS};
        let cutoff = DateTime::from_millis(
            DateTime::now().timestamp_millis() - age.as_millis().min(i64::MAX as u128) as i64,
        );
        let open: Vec<Document> = self
            .collection(ATTEMPTS)
            .find(doc! {attempt::OUTCOME: "running", attempt::START: {"$lt": cutoff}})
            .projection(doc! {attempt::ID: 1, attempt::TASK: 1})
            .limit(200)
            .await
            .map_err(|e| Error::mongo("finding open attempts", e))?
            .try_collect()
            .await
            .map_err(|e| Error::mongo("finding open attempts", e))?;
        let mut closed = 0;
        for a in open {
            let (Ok(id), Ok(task_id)) =
                (a.get_object_id(attempt::ID), a.get_object_id(attempt::TASK))
            else {
                continue;
            };
            let task = self
                .collection(TASKS)
                .find_one(doc! {task::ID: task_id})
                .projection(doc! {task::ATTEMPT: 1, task::STATUS: 1})
                .await
                .map_err(|e| Error::mongo(format!("reading task {task_id}"), e))?;
            let still_running = task.as_ref().is_some_and(|t| {
                t.get_object_id(task::ATTEMPT).ok() == Some(id)
                    && matches!(t.get(task::STATUS), Some(Bson::Int32(-1 | 0)))
            });
            if still_running {
                continue;
            }
            let outcome = outcome_from_task(task.as_ref(), id);
            let r = self
                .collection(ATTEMPTS)
                .update_one(
                    doc! {attempt::ID: id, attempt::OUTCOME: "running"},
                    doc! {"$set": {attempt::OUTCOME: outcome, attempt::END: DateTime::now()}},
                )
                .await
                .map_err(|e| Error::mongo(format!("closing abandoned attempt {id}"), e))?;
            closed += r.modified_count;
        }
        Ok(closed)
    }
}
