//! Records of lost attempts. Recovery takes a task from an attempt and writes that attempt's
//! `lost` record: two writes, to two collections, on servers that may have no transactions (a
//! standalone server has none). So the first write also leaves the record's contents on the
//! task (`unrecorded_attempts`), and the entry goes only once the record is in: a node or
//! server that dies between the writes leaves an entry, from which the maintenance leader
//! writes the record later. Every write here is idempotent (an upsert by the attempt's id
//! with the same values, a removal by the attempt's id), so both may happen, in any order.

use crate::RecoveryStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::schema::{attempt, task, unrecorded, unrecorded_field, ATTEMPTS, TASKS};
use disbatch_model::task::Outcome;

/// Tasks read per look for unwritten records; the rest wait for the next look.
const REPAIR_PER_PASS: i64 = 500;

/// A lost attempt whose record is to be written: an entry of a task's `unrecorded_attempts`.
#[derive(Debug, Clone, PartialEq)]
pub struct LostAttempt {
    pub task: ObjectId,
    pub queue: Option<ObjectId>,
    pub attempt: ObjectId,
    pub node: Option<String>,
    /// When the attempt was claimed.
    pub start: Option<DateTime>,
    /// When recovery took the task from it.
    pub end: DateTime,
    pub reason: String,
}

impl LostAttempt {
    /// The entry recovery adds to the task in the write that takes the task from the attempt.
    pub(crate) fn entry(&self) -> Document {
        doc! {
            unrecorded::ATTEMPT: self.attempt,
            unrecorded::NODE: self.node.clone().map_or(Bson::Null, Bson::String),
            unrecorded::START: self.start.map_or(Bson::Null, Bson::DateTime),
            unrecorded::END: self.end,
            unrecorded::REASON: &self.reason,
        }
    }

    /// An entry as stored; None when it lacks the attempt's id (written by hand), which names
    /// the record.
    fn from_entry(task: ObjectId, queue: Option<ObjectId>, e: &Document) -> Option<LostAttempt> {
        Some(LostAttempt {
            task,
            queue,
            attempt: e.get_object_id(unrecorded::ATTEMPT).ok()?,
            node: e.get_str(unrecorded::NODE).ok().map(str::to_string),
            start: e.get_datetime(unrecorded::START).ok().copied(),
            end: e
                .get_datetime(unrecorded::END)
                .ok()
                .copied()
                .unwrap_or_else(DateTime::now),
            reason: e
                .get_str(unrecorded::REASON)
                .unwrap_or("recovered")
                .to_string(),
        })
    }
}

impl RecoveryStore<'_> {
    /// Writes a lost attempt's record, or overrules the one a runner that died before its
    /// result landed had written, then removes the task's entry for it. Returns whether the
    /// record was missing or said otherwise (this call changed it).
    pub async fn write_lost_record(self, lost: &LostAttempt) -> Result<bool> {
        self.lost_record_write(lost)
            .await
            .map_err(|e| Error::mongo(format!("closing lost attempt {}", lost.attempt), e))
    }

    /// The maintenance leader's look for lost attempts whose record a recovery left unwritten
    /// (its node or the server died between its two writes): writes each record and clears
    /// its entry. Returns the attempts whose record this call wrote or corrected; an entry
    /// whose record was already right (the recovery was only slower) is just cleared.
    pub async fn write_unrecorded_attempts(self) -> Result<Vec<LostAttempt>> {
        let context = "finding lost attempts without a record";
        let cursor = self
            .raw(TASKS)
            // A range from the least ObjectId, not `$exists`: SecantusDB reads every task for
            // `$exists` (80 ms a pass at 50 000 tasks) but this one by the sparse index (1 ms).
            // Every entry's attempt is an ObjectId.
            .find(doc! {unrecorded_field(unrecorded::ATTEMPT): {"$gte": ObjectId::from_bytes([0; 12])}})
            .projection(doc! {task::QUEUE: 1, task::UNRECORDED_ATTEMPTS: 1})
            .limit(REPAIR_PER_PASS)
            .await
            .map_err(|e| Error::mongo(context, e))?;
        let tasks = self.read_all(TASKS, cursor, context).await?;
        let mut written = Vec::new();
        for t in &tasks {
            let Ok(id) = t.get_object_id(task::ID) else {
                continue;
            };
            let queue = t.get_object_id(task::QUEUE).ok();
            let entries = t
                .get_array(task::UNRECORDED_ATTEMPTS)
                .map(|a| a.to_vec())
                .unwrap_or_default();
            for e in entries.iter().filter_map(Bson::as_document) {
                let Some(lost) = LostAttempt::from_entry(id, queue, e) else {
                    continue;
                };
                match self.lost_record_write(&lost).await {
                    Ok(true) => written.push(lost),
                    Ok(false) => {}
                    Err(e) => match crate::driver_error::refusal(&e) {
                        // This entry alone (written by hand, say): reported once, and the
                        // others are written all the same.
                        Some(why) => self.state.skips.skipped(
                            TASKS,
                            &id.to_hex(),
                            crate::SkipReason::UpdateRefused,
                            &format!(
                                "the server refused the record of lost attempt {}: {why}",
                                lost.attempt
                            ),
                        ),
                        None => {
                            return Err(Error::mongo(
                                format!("closing lost attempt {}", lost.attempt),
                                e,
                            ))
                        }
                    },
                }
            }
        }
        Ok(written)
    }
}

impl Store {
    async fn lost_record_write(&self, lost: &LostAttempt) -> mongodb::error::Result<bool> {
        let a = lost.attempt;
        let result = self
            .collection(ATTEMPTS)
            .update_one(
                doc! {attempt::ID: a},
                doc! {
                    "$set": {
                        attempt::OUTCOME: Outcome::Lost.as_str(), attempt::END: lost.end,
                        attempt::REASON: &lost.reason,
                    },
                    "$setOnInsert": {
                        attempt::TASK: lost.task,
                        attempt::QUEUE: lost.queue.map_or(Bson::Null, Bson::ObjectId),
                        attempt::NODE: lost.node.clone().map_or(Bson::Null, Bson::String),
                        attempt::START: lost.start.map_or(Bson::Null, Bson::DateTime),
                    },
                },
            )
            .upsert(true)
            .await?;
        let changed = result.upserted_id.is_some() || result.modified_count > 0;
        self.forget_unrecorded(lost.task, a).await?;
        Ok(changed)
    }

    /// Removes the task's entry for `attempt`: the whole field when it is the only one (the
    /// usual case, so the sparse index forgets the task), else just that entry.
    async fn forget_unrecorded(&self, id: ObjectId, a: ObjectId) -> mongodb::error::Result<()> {
        let only = self
            .collection(TASKS)
            .update_one(
                doc! {
                    task::ID: id,
                    task::UNRECORDED_ATTEMPTS: {"$size": 1},
                    unrecorded_field(unrecorded::ATTEMPT): a,
                },
                doc! {"$unset": {task::UNRECORDED_ATTEMPTS: ""}},
            )
            .await?;
        if only.matched_count == 0 {
            self.collection(TASKS)
                .update_one(
                    doc! {task::ID: id},
                    doc! {"$pull": {task::UNRECORDED_ATTEMPTS: {unrecorded::ATTEMPT: a}}},
                )
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_says_what_the_record_will() {
        let lost = LostAttempt {
            task: ObjectId::new(),
            queue: Some(ObjectId::new()),
            attempt: ObjectId::new(),
            node: Some("n1".into()),
            start: Some(DateTime::from_millis(1_000)),
            end: DateTime::from_millis(2_000),
            reason: "its lease passed on node n1".into(),
        };
        let back = LostAttempt::from_entry(lost.task, lost.queue, &lost.entry());
        assert_eq!(back.as_ref(), Some(&lost));
        let bare = LostAttempt::from_entry(lost.task, None, &doc! {"reason": "x"});
        assert_eq!(
            bare, None,
            "an entry without the attempt's id names no record"
        );
    }
}
