//! The change stream that tells a node there may be work: queue documents, which carry both
//! queue changes and work signals (`work_signal`: tasks queued, tasks queued again). Tasks
//! are not watched: a stream on `tasks` makes the server deliver every insert and every
//! finish to every node, so its cost grows with nodes × tasks; signals cost one event per
//! batch per node, and a node's own runner exits wake it.

use futures::{Stream, StreamExt};
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};

use super::schema::{queue, QUEUES};
use super::Store;
use crate::error::{Error, Result};
use bson::{doc, Document};

/// What a change was about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkSignal {
    /// Tasks were queued.
    Tasks,
    /// Tasks were queued again (a retry, a task given back): possibly behind a claim window.
    Requeued,
    /// A queue document changed (threads, pause, a new queue…).
    Queues,
}

impl Store {
    /// Opens a change stream on queue documents; fails at once when the server has none (a
    /// standalone mongod), so the caller can fall back to polling. `await_time` is how long
    /// the server holds each `getMore` open without events: an event still arrives at once,
    /// so a long one costs no latency, and it sets what an idle stream costs (one request per
    /// wait).
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
                e.map(|event| signal_of(&event))
                    .map_err(|e| Error::mongo("watching queues", e))
            }),
        )
    }
}

/// A work signal alone (an update of nothing but the signal fields) or a change of the queue.
fn signal_of(event: &ChangeStreamEvent<Document>) -> WorkSignal {
    let Some(update) = event
        .update_description
        .as_ref()
        .filter(|_| event.operation_type == OperationType::Update)
    else {
        return WorkSignal::Queues;
    };
    let fields: Vec<&str> = update.updated_fields.keys().map(String::as_str).collect();
    let signal_only = !fields.is_empty()
        && update.removed_fields.is_empty()
        && fields
            .iter()
            .all(|f| *f == queue::TASKS_QUEUED_AT || *f == queue::TASKS_REQUEUED_AT);
    if !signal_only {
        WorkSignal::Queues
    } else if fields.contains(&queue::TASKS_REQUEUED_AT) {
        WorkSignal::Requeued
    } else {
        WorkSignal::Tasks
    }
}

/// The resume token, the kind of change and the names of the fields an update set (their
/// values are the signals' dates or small queue fields).
fn slim() -> Document {
    doc! {"$project": {"operationType": 1, "updateDescription": 1}}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(e: Document) -> ChangeStreamEvent<Document> {
        let mut full = doc! {"_id": {"_data": "826A"}};
        full.extend(e);
        bson::from_document(full).expect("a change event")
    }

    fn update(set: Document, removed: &[&str]) -> ChangeStreamEvent<Document> {
        event(doc! {"operationType": "update", "updateDescription": {
            "updatedFields": set, "removedFields": removed.to_vec(),
        }})
    }

    #[test]
    fn a_signal_alone_is_work_and_anything_else_a_queue_change() {
        let now = bson::DateTime::now();
        assert_eq!(
            signal_of(&update(doc! {queue::TASKS_QUEUED_AT: now}, &[])),
            WorkSignal::Tasks
        );
        assert_eq!(
            signal_of(&update(
                doc! {queue::TASKS_QUEUED_AT: now, queue::TASKS_REQUEUED_AT: now},
                &[]
            )),
            WorkSignal::Requeued
        );
        assert_eq!(
            signal_of(&update(
                doc! {queue::TASKS_QUEUED_AT: now, queue::THREADS: 4},
                &[]
            )),
            WorkSignal::Queues,
            "a signal written with a real change still makes the node read the queues"
        );
        assert_eq!(
            signal_of(&update(doc! {queue::TASKS_QUEUED_AT: now}, &["paused"])),
            WorkSignal::Queues
        );
        assert_eq!(
            signal_of(&update(doc! {}, &[])),
            WorkSignal::Queues,
            "an update that set nothing we know of is read as a change"
        );
        for op in ["insert", "replace", "delete"] {
            assert_eq!(
                signal_of(&event(doc! {"operationType": op})),
                WorkSignal::Queues,
                "{op}"
            );
        }
    }
}
