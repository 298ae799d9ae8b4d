//! The hot path's store side: claiming a task straight into running as a new attempt, in
//! one round trip that also returns the whole task for its runner.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::ReturnDocument;

use super::schema::{task, TASKS};
use super::Store;
use crate::error::{Error, Result};
use crate::model::{status, QueueSort};

/// The outcome of one claim.
#[derive(Debug, Clone, PartialEq)]
pub enum RunClaim {
    /// The task, after the claim: running on this node as the given attempt.
    Claimed(Box<Document>),
    /// No claimable task in the queue.
    Empty,
    /// Another node holds the slot: the queue may be full.
    SlotTaken,
}

impl Store {
    /// Claims the next queued task of `queue` for `node` as running attempt `attempt`,
    /// holding `slot` (the unique `{queue, slot}` index makes the database refuse a claim
    /// beyond the queue's `threads`) and a lease of `lease`. Disbatch's `-1` claimed state is
    /// skipped: the runner is started at once, and a task whose runner never starts is
    /// recovered by lease like any other.
    pub async fn claim_task_to_run(
        &self,
        queue: ObjectId,
        node: &str,
        sort: QueueSort,
        slot: u32,
        lease: Duration,
        attempt: ObjectId,
    ) -> Result<RunClaim> {
        let now = DateTime::now();
        let filter = claimable(queue, now);
        let update = doc! {
            "$set": {
                task::NODE: node,
                task::STATUS: status::RUNNING,
                task::MTIME: now,
                task::SLOT: slot as i64,
                task::LEASE_UNTIL: super::leases::deadline(lease),
                task::ATTEMPT: attempt,
            },
            "$inc": {task::ATTEMPTS: 1},
        };
        let tasks = self.collection(TASKS);
        let mut action = tasks
            .find_one_and_update(filter, update)
            .return_document(ReturnDocument::After);
        if let Some(order) = claim_order(sort) {
            action = action.sort(order);
        }
        match action.await {
            Ok(Some(doc)) => Ok(RunClaim::Claimed(Box::new(doc))),
            Ok(None) => Ok(RunClaim::Empty),
            Err(e) if super::is_duplicate_key(&e) => Ok(RunClaim::SlotTaken),
            Err(e) => Err(Error::mongo(format!("claiming a task of queue {queue}"), e)),
        }
    }

    /// Puts a task claimed by `claim_task_to_run` back in the queue when its runner could not
    /// be started; conditional on the attempt, so it never undoes a later claim.
    pub async fn give_back_attempt(&self, id: ObjectId, attempt: ObjectId) -> Result<bool> {
        self.collection(TASKS)
            .update_one(
                doc! {task::ID: id, task::ATTEMPT: attempt, task::STATUS: status::RUNNING},
                doc! {
                    "$set": {task::NODE: Bson::Null, task::STATUS: status::QUEUED, task::MTIME: DateTime::now()},
                    "$unset": {task::SLOT: "", task::LEASE_UNTIL: ""},
                    "$inc": {task::ATTEMPTS: -1},
                },
            )
            .await
            .map(|r| r.modified_count == 1)
            .map_err(|e| Error::mongo(format!("giving back task {id}"), e))
    }
}

/// The order a queue's `sort` gives its claims; None is the server's natural order.
pub(crate) fn claim_order(sort: QueueSort) -> Option<Document> {
    match sort {
        QueueSort::Fifo => Some(doc! {task::ID: 1}),
        QueueSort::Lifo => Some(doc! {task::ID: -1}),
        QueueSort::Priority => Some(doc! {task::PRIORITY: -1, task::KEY: 1, task::ID: 1}),
        QueueSort::Default => None,
    }
}

/// The queued tasks of `queue` a node may claim now. `node: -1` marked unclaimed tasks in
/// Disbatch 3; 4.103 still claims them. A delayed task (Coordinate's not_before) waits; `null`
/// also matches a missing field. Documents a runner could not be handed or the claim could not
/// count (an `_id` that is not an ObjectId, an `attempts` that is not a sane number) are left
/// queued rather than claimed and wedged.
pub(crate) fn claimable(queue: ObjectId, now: DateTime) -> Document {
    doc! {
        task::NODE: {"$in": [Bson::Null, Bson::Int32(-1)]},
        task::STATUS: status::QUEUED,
        task::QUEUE: queue,
        task::ID: {"$type": "objectId"},
        "$and": [
            {"$or": [{task::NOT_BEFORE: Bson::Null}, {task::NOT_BEFORE: {"$lte": now}}]},
            // Comparison only matches numbers, so a string `attempts` is excluded too.
            {"$or": [{task::ATTEMPTS: Bson::Null}, {task::ATTEMPTS: {"$lt": 1_000_000_000_i64}}]},
        ],
    }
}
