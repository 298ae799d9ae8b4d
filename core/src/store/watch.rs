//! Change streams that tell a node there may be work: tasks queued or requeued, queues
//! changed. Freed slots are not watched: every node would read every task's finish (one
//! getMore per task per node, measured); a node's own runner exits wake it, and other nodes'
//! freed slots show in its next reading (at most a second).

use futures::{Stream, StreamExt};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};

use super::schema::{task, QUEUES, TASKS};
use super::Store;
use crate::error::{Error, Result};
use bson::{doc, Document};

/// What a change was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkSignal {
    /// A task was queued.
    Tasks,
    /// A task was queued again (a retry, a task given back): possibly behind a claim window.
    Requeued,
    /// A queue document changed (threads, pause, a new queue…).
    Queues,
}

impl Store {
    /// Opens a change stream on tasks queued or queued again; fails at once when the server
    /// has none (a standalone mongod), so the caller can fall back to polling. `await_time`
    /// is how long the server holds each `getMore` open without events: an event still
    /// arrives at once, so a long one costs no latency, and it sets what an idle stream costs
    /// (one request per wait). While it is open the server reads every task write for it.
    pub async fn watch_tasks_for_work(
        &self,
        await_time: std::time::Duration,
    ) -> Result<impl Stream<Item = Result<WorkSignal>> + Send> {
        let claimable = doc! {"$match": {"$or": [
            {"operationType": "insert"},
            {format!("updateDescription.updatedFields.{}", task::STATUS): crate::model::status::QUEUED},
        ]}};
        let tasks = self
            .collection(TASKS)
            .watch()
            .max_await_time(await_time)
            .pipeline([claimable, slim()])
            .await
            .map_err(|e| Error::mongo("watching tasks", e))?;
        let context = "watching tasks";
        Ok(tasks.map(move |e| match e {
            Ok(event) if event.operation_type == OperationType::Insert => Ok(WorkSignal::Tasks),
            Ok(_) => Ok(WorkSignal::Requeued),
            Err(e) => Err(Error::mongo(context, e)),
        }))
    }

    /// Opens a change stream on queue documents (threads, pause, a new queue…), as
    /// `watch_tasks_for_work` does on tasks.
    pub async fn watch_queues(
        &self,
        await_time: std::time::Duration,
    ) -> Result<impl Stream<Item = Result<WorkSignal>> + Send> {
        let queues = self
            .collection(QUEUES)
            .watch()
            .max_await_time(await_time)
            .pipeline([slim()])
            .await
            .map_err(|e| Error::mongo("watching queues", e))?;
        Ok(
            queues.map(|e: std::result::Result<ChangeStreamEvent<Document>, _>| {
                e.map(|_| WorkSignal::Queues)
                    .map_err(|e| Error::mongo("watching queues", e))
            }),
        )
    }
}

/// Only the resume token travels; the event's content does not matter.
fn slim() -> Document {
    doc! {"$project": {"operationType": 1}}
}
