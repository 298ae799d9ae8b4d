//! Queue queries for the DCI: raw documents with their task counts, create, update, delete.

use crate::QueueStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::{Error, Result};
use crate::{GroupCounts, StatusGroup, WriteCounts};
use disbatch_model::schema::{queue, task, QUEUES, TASKS};

/// A write refused because another queue has `name` (the only unique index of queues besides
/// `_id`, which is always fresh here): said in words, not as the server's E11000 line with
/// index and collection names a person has to decode. Any other failure is given back.
fn name_taken(
    name: &str,
    e: mongodb::error::Error,
) -> std::result::Result<Error, mongodb::error::Error> {
    if crate::driver_error::is_duplicate_key(&e) {
        Ok(Error::Invalid(format!(
            "a queue named {name} already exists"
        )))
    } else {
        Err(e)
    }
}

/// Disbatch's per-queue counts: queued is every status ≤ -2 (orphaned and cancelled too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounts {
    pub queued: u64,
    pub running: u64,
    pub completed: u64,
    /// Of `completed`: status 1, and status ≥ 2.
    pub succeeded: u64,
    pub failed: u64,
    /// Every group apart (queued is -2 alone here), for readers that show them apart.
    pub by_status: GroupCounts,
}

impl From<GroupCounts> for QueueCounts {
    /// Disbatch's groups: queued is every status ≤ -2 it defines (orphaned and cancelled
    /// too); a status it does not define (-9, a string) is in no column.
    fn from(c: GroupCounts) -> QueueCounts {
        use StatusGroup as G;
        let queued = [
            G::Queued,
            G::Terminated,
            G::Blocked,
            G::Cancelled,
            G::Orphaned,
        ]
        .iter()
        .map(|g| c.get(*g))
        .sum();
        let (succeeded, failed) = (c.get(G::Succeeded), c.get(G::Failed));
        QueueCounts {
            queued,
            running: c.get(G::Claimed) + c.get(G::Running),
            completed: succeeded + failed,
            succeeded,
            failed,
            by_status: c,
        }
    }
}

impl QueueStore<'_> {
    /// Every queue document, in natural order.
    pub async fn queue_documents(self) -> Result<Vec<Document>> {
        let cursor = self
            .raw(QUEUES)
            .find(doc! {})
            .await
            .map_err(|e| Error::mongo("listing queues", e))?;
        self.read_all(QUEUES, cursor, "listing queues").await
    }

    pub async fn find_queue(self, ident: &str) -> Result<Option<Document>> {
        self.find_by_id_or_name(QUEUES, queue::NAME, ident).await
    }

    /// A queue's counts, from the kept counts (see `task_counts`).
    pub async fn queue_counts(self, id: ObjectId) -> Result<QueueCounts> {
        let groups = self.tasks().task_counts(&[id]).await?;
        Ok(QueueCounts::from(
            groups.get(&id).copied().unwrap_or_default(),
        ))
    }

    /// How many of the queue's tasks were discarded by its retry policy, counting at most
    /// `cap` (then `cap`): a range of the partial `{queue, discarded_at}` index, read as ids.
    /// A `find`, not a count: SecantusDB plans an aggregate's `$match` as a collection scan.
    pub async fn discarded_count(self, queue: ObjectId, cap: i64) -> Result<u64> {
        use futures::TryStreamExt;
        let context = format!("counting the discarded tasks of queue {queue}");
        let mut cursor = self
            .raw(TASKS)
            .find(doc! {
                task::QUEUE: queue,
                task::DISCARDED_AT: {"$gte": bson::DateTime::from_millis(0)},
            })
            .projection(doc! {task::ID: 1})
            .limit(cap)
            .batch_size(1000)
            .await
            .map_err(|e| Error::mongo(context.clone(), e))?;
        let mut n = 0u64;
        while cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(context.clone(), e))?
            .is_some()
        {
            n += 1;
        }
        Ok(n)
    }

    /// Inserts a queue document built by the caller from validated input.
    pub async fn insert_queue_document(self, fields: Document) -> Result<ObjectId> {
        let id = ObjectId::new();
        let name = fields.get_str(queue::NAME).unwrap_or_default().to_string();
        let mut d = doc! {queue::ID: id};
        d.extend(fields);
        self.collection(QUEUES).insert_one(d).await.map_err(|e| {
            name_taken(&name, e).unwrap_or_else(|e| Error::mongo("creating a queue", e))
        })?;
        Ok(id)
    }

    /// Sets `set` and removes the fields `unset` (a limit sent as null) on queue `id`.
    pub async fn update_queue(
        self,
        id: ObjectId,
        set: Document,
        unset: &[&str],
    ) -> Result<WriteCounts> {
        let name = set.get_str(queue::NAME).ok().map(str::to_string);
        let mut update = Document::new();
        // The server refuses an empty `$set` or `$unset`.
        if !set.is_empty() {
            update.insert("$set", set);
        }
        if !unset.is_empty() {
            let fields: Document = unset
                .iter()
                .map(|f| (f.to_string(), Bson::from("")))
                .collect();
            update.insert("$unset", fields);
        }
        self.collection(QUEUES)
            .update_one(doc! {queue::ID: id}, update)
            .await
            .map(WriteCounts::from)
            .map_err(|e| match &name {
                Some(name) => name_taken(name, e)
                    .unwrap_or_else(|e| Error::mongo(format!("updating queue {id}"), e)),
                None => Error::mongo(format!("updating queue {id}"), e),
            })
    }

    /// Deletes the queue document only; its tasks stay, as in Disbatch.
    pub async fn delete_queue(self, id: ObjectId) -> Result<WriteCounts> {
        self.collection(QUEUES)
            .delete_one(doc! {queue::ID: id})
            .await
            .map(WriteCounts::from)
            .map_err(|e| Error::mongo(format!("deleting queue {id}"), e))
    }

    /// Pauses a running queue: `threads` to 0, the old value kept in `paused_threads`.
    /// Returns false when the queue is already paused or has no threads to pause.
    pub async fn pause_queue(self, id: ObjectId) -> Result<bool> {
        let filter = doc! {
            queue::ID: id,
            queue::PAUSED_THREADS: {"$exists": false},
            // $nin null also excludes a missing field: nothing to pause.
            queue::THREADS: {"$nin": [0, Bson::Null, "0", ""]},
        };
        let update = vec![doc! {"$set": {
            queue::PAUSED_THREADS: format!("${}", queue::THREADS),
            queue::THREADS: 0,
        }}];
        self.collection(QUEUES)
            .update_one(filter, update)
            .await
            .map(|r| r.matched_count == 1)
            .map_err(|e| Error::mongo(format!("pausing queue {id}"), e))
    }

    /// Restores the `threads` a pause kept; false when the queue is not paused.
    pub async fn resume_queue(self, id: ObjectId) -> Result<bool> {
        let update = vec![
            doc! {"$set": {queue::THREADS: format!("${}", queue::PAUSED_THREADS)}},
            doc! {"$unset": queue::PAUSED_THREADS},
        ];
        self.collection(QUEUES)
            .update_one(
                doc! {queue::ID: id, queue::PAUSED_THREADS: {"$exists": true}},
                update,
            )
            .await
            .map(|r| r.matched_count == 1)
            .map_err(|e| Error::mongo(format!("resuming queue {id}"), e))
    }

    /// Queue names, for balance validation.
    pub async fn queue_names(self) -> Result<Vec<String>> {
        Ok(self
            .queue_documents()
            .await?
            .iter()
            .filter_map(|d| d.get_str(queue::NAME).ok().map(str::to_string))
            .collect())
    }

    /// Each queue's name by its id (queues with a string name and an ObjectId `_id`).
    pub async fn queue_names_by_id(self) -> Result<std::collections::HashMap<ObjectId, String>> {
        Ok(self
            .queue_documents()
            .await?
            .iter()
            .filter_map(|d| {
                let id = d.get_object_id(queue::ID).ok()?;
                Some((id, d.get_str(queue::NAME).ok()?.to_string()))
            })
            .collect())
    }
}

impl QueueStore<'_> {
    /// Creates or redefines the queue of a work spec by name; true when it was created.
    pub async fn upsert_spec_queue(
        self,
        load: &disbatch_model::work_spec::SpecLoad,
    ) -> Result<bool> {
        let mut update = doc! {"$set": load.set.clone()};
        if !load.unset.is_empty() {
            let unset: Document = load
                .unset
                .iter()
                .map(|f| (f.to_string(), Bson::String(String::new())))
                .collect();
            update.insert("$unset", unset);
        }
        self.collection(QUEUES)
            .update_one(doc! {queue::NAME: &load.name}, update)
            .upsert(true)
            .await
            .map(|r| r.upserted_id.is_some())
            .map_err(|e| Error::mongo(format!("loading work spec {}", load.name), e))
    }
}
