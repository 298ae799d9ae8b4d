//! Recording one attempt's result on its task: the fenced write, and where the task goes.

use crate::ResultStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::StatusGroup;
use disbatch_model::fleet_time;
use disbatch_model::schema::task;
use disbatch_model::status;
use disbatch_model::task::{OutputValue, TaskEnd};

/// The outcome of recording a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishOutcome {
    Recorded,
    /// The task is no longer running on this node (given back, reaped or changed by an operator).
    NotOurs,
    /// The document would exceed 16 MiB; nothing was written.
    TooLarge,
}

/// The group a task ends in; running tasks are counted live, so only where it goes counts.
pub(crate) fn end_group(end: TaskEnd) -> StatusGroup {
    crate::group_of(end.status())
}

impl ResultStore<'_> {
    /// Records a result in one write: outputs, `mtime`, the slot and lease freed, and either a
    /// final status with `complete: true` or, for a retry, back to queued (after `not_before`).
    /// Conditional on the task still running on `node` as `attempt`: once recovery has taken
    /// a task from an attempt, that attempt's result never lands, so a task and its attempt
    /// records always agree.
    pub async fn finish_task(
        self,
        id: ObjectId,
        node: &str,
        attempt: ObjectId,
        end: TaskEnd,
        stdout: OutputValue,
        stderr: OutputValue,
    ) -> Result<FinishOutcome> {
        let (filter, update) =
            finish_statement(id, node, attempt, end, stdout, stderr, fleet_time::now());
        let to = end_group(end);
        match self.update_one_counted(filter, update, Some(to)).await {
            Ok(true) => Ok(FinishOutcome::Recorded),
            Ok(false) => Ok(FinishOutcome::NotOurs),
            Err(e) if crate::driver_error::is_document_too_large(&e) => Ok(FinishOutcome::TooLarge),
            Err(e) => Err(Error::mongo(
                format!("recording the result of task {id}"),
                e,
            )),
        }
    }
}

/// The fenced result write of one attempt: its filter and update. The write matches only
/// while the task still runs as this attempt on this node.
pub(crate) fn finish_statement(
    id: ObjectId,
    node: &str,
    attempt: ObjectId,
    end: TaskEnd,
    stdout: OutputValue,
    stderr: OutputValue,
    now: DateTime,
) -> (Document, Document) {
    let filter = doc! {
        task::ID: id,
        task::STATUS: status::RUNNING,
        task::NODE: node,
        task::ATTEMPT: attempt,
    };
    let mut set = doc! {
        task::STDOUT: Bson::from(stdout),
        task::STDERR: Bson::from(stderr),
        task::MTIME: now,
    };
    // The live copy goes in the same write: the output itself is stored now.
    let mut unset = doc! {
        task::SLOT: "", task::LEASE_UNTIL: "", task::CANCEL_REQUESTED: "", task::LIVE_OUTPUT: "",
    };
    match end {
        TaskEnd::Status(s) | TaskEnd::Discarded(s) => {
            set.insert(task::STATUS, s);
            set.insert(task::COMPLETE, true);
            if matches!(end, TaskEnd::Discarded(_)) {
                set.insert(task::DISCARDED_AT, now);
            }
            unset.insert(task::CONCURRENCY_KEY, "");
            unset.insert(task::CONCURRENCY_SLOT, "");
        }
        // A task waiting for its retry in an `ordered` queue keeps its key slot, and so its
        // place among its key's tasks; its next claim holds the same slot again. Elsewhere a
        // retry's wait must not hold up the key's other tasks.
        TaskEnd::Retry {
            not_before,
            keep_key_slot,
        } => {
            if !keep_key_slot {
                unset.insert(task::CONCURRENCY_KEY, "");
                unset.insert(task::CONCURRENCY_SLOT, "");
            }
            set.insert(task::STATUS, status::QUEUED);
            set.insert(task::NODE, Bson::Null);
            unset.insert(task::COMPLETE, "");
            match not_before {
                Some(t) => set.insert(task::NOT_BEFORE, t),
                None => unset.insert(task::NOT_BEFORE, ""),
            };
        }
    }
    (filter, doc! {"$set": set, "$unset": unset})
}
