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
    /// succeeded, failed, retry or discarded (the task had changed hands).
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
        self.collection(ATTEMPTS)
            .update_one(doc! {attempt::ID: id}, doc! {"$set": set})
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
