//! The fleet's one change stream, held by the maintenance leader: queue documents, which
//! carry both queue changes and work signals (`work_signal`: tasks queued, tasks queued
//! again), and task inserts, whoever made them (ops by hand, Perl tools: they write no
//! signal). Task updates are not watched: every claim and finish would reach the leader.
//! One stream on the database, not one per collection: the server reads its whole log once
//! per open stream.

use crate::QueueStore;
use futures::stream::BoxStream;
use futures::StreamExt;
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType};

use crate::error::{Error, Result};
use crate::StatusGroup;
use bson::{doc, Document};
use disbatch_model::schema::{queue, task, QUEUES, TASKS};

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

/// One event of the stream: which queue, and what about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueEvent {
    /// The queue document's `_id` (None: not an ObjectId, a document made by hand).
    pub queue: Option<bson::oid::ObjectId>,
    pub signal: WorkSignal,
}

/// One event of the leader's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkEvent {
    Queue(QueueEvent),
    Inserted(InsertedTask),
}

/// A task inserted, by any writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertedTask {
    pub queue: Option<bson::oid::ObjectId>,
    /// Inserted in the queued group (claimable once due).
    pub queued: bool,
    /// When a delayed task becomes claimable.
    pub not_before: Option<bson::DateTime>,
}

/// The leader's stream, and whether it carries task inserts.
pub struct WorkStream {
    pub events: BoxStream<'static, Result<WorkEvent>>,
    /// False when only queue documents are watched (a role from before this stream, granting
    /// `changeStream` on `queues` alone): the leader's probe then looks for inserts.
    pub sees_inserts: bool,
}

impl QueueStore<'_> {
    /// Opens the fleet's stream (queue changes and task inserts); fails at once when the
    /// server has none (a standalone mongod), so the caller can fall back to polling. A user
    /// refused a stream on the database (code 13) gets one on `queues` alone.
    /// `await_time` is how long the server holds each `getMore` open without events: an event
    /// still arrives at once, so a long one costs no latency, and it sets what an idle stream
    /// costs (one request per wait).
    pub async fn watch_work(self, await_time: std::time::Duration) -> Result<WorkStream> {
        let context = "watching queues and task inserts";
        let opened = self
            .db
            .watch()
            .max_await_time(await_time)
            .pipeline([
                doc! {"$match": {"$or": [
                    {"ns.coll": QUEUES},
                    {"ns.coll": TASKS, "operationType": "insert"},
                ]}},
                slim(),
            ])
            .await;
        let (events, sees_inserts, context) = match opened {
            Ok(events) => (events, true, context),
            Err(e) if is_unauthorized(&e) => {
                let context = "watching queues (this user may not watch the database)";
                let events = self
                    .collection(QUEUES)
                    .watch()
                    .max_await_time(await_time)
                    .pipeline([slim()])
                    .await
                    .map_err(|e| Error::mongo(context, e))?;
                (events, false, context)
            }
            Err(e) => return Err(Error::mongo(context, e)),
        };
        Ok(WorkStream {
            events: events
                .map(
                    move |e: std::result::Result<ChangeStreamEvent<Document>, _>| {
                        e.map(|event| event_of(&event))
                            .map_err(|e| Error::mongo(context, e))
                    },
                )
                .boxed(),
            sees_inserts,
        })
    }
}

fn is_unauthorized(e: &mongodb::error::Error) -> bool {
    matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 13)
}

/// A collection stream on `queues` names no collection in its events' `ns`: they are queue
/// events.
fn event_of(event: &ChangeStreamEvent<Document>) -> WorkEvent {
    let on_tasks = event.ns.as_ref().and_then(|ns| ns.coll.as_deref()) == Some(TASKS);
    if on_tasks && event.operation_type == OperationType::Insert {
        let task = event.full_document.as_ref();
        return WorkEvent::Inserted(InsertedTask {
            queue: task.and_then(|d| d.get_object_id(task::QUEUE).ok()),
            queued: task
                .is_some_and(|d| StatusGroup::of(d.get(task::STATUS)) == StatusGroup::Queued),
            not_before: task.and_then(|d| d.get_datetime(task::NOT_BEFORE).ok().copied()),
        });
    }
    WorkEvent::Queue(QueueEvent {
        queue: event
            .document_key
            .as_ref()
            .and_then(|k| k.get_object_id(queue::ID).ok()),
        signal: signal_of(event),
    })
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

/// The resume token, the kind of change, the collection, the document's `_id`, the names of
/// the fields a queue update set (their values are the signals' dates or small queue fields)
/// and of an inserted task only what says whether it can be claimed, not its params.
fn slim() -> Document {
    doc! {"$project": {
        "operationType": 1,
        "ns": 1,
        "documentKey": 1,
        "updateDescription": 1,
        "fullDocument.queue": 1,
        "fullDocument.status": 1,
        "fullDocument.not_before": 1,
    }}
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
