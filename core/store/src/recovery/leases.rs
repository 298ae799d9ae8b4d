//! Task leases: renewal by the runner, recovery of tasks whose lease passed, and the
//! cancel requests a runner must notice.

use crate::RecoveryStore;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::recovery::lost_records::LostAttempt;
use crate::StatusGroup;
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::status;

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Still this attempt's; `cancel_requested` when an operator asked it to stop.
    Held { cancel_requested: bool },
    /// The task no longer runs as this attempt (recovered, deleted or changed by hand).
    Lost,
}

/// A claimed or running task whose lease has passed, as recovery read it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredTask {
    pub id: ObjectId,
    pub queue: Option<ObjectId>,
    pub status: i32,
    pub node: Option<String>,
    pub attempt: Option<ObjectId>,
    /// Attempts started since an operator last retried the task (this one included): what
    /// its retry policy and `max_retries` count.
    pub attempts: i64,
    pub cancel_requested: bool,
    /// None for a lease-less claim (a Perl node's), which is matched by its `mtime` instead.
    pub lease_until: Option<DateTime>,
    /// When the attempt was claimed (`mtime`, unchanged while a task runs).
    pub started: Option<DateTime>,
}

/// Where recovery sends an expired task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Queued again for any node; `keep_key_slot` in an `ordered` queue, whose tasks of a key
    /// keep their places (else a requeued task's wait would hold up its key's others).
    Requeue { keep_key_slot: bool },
    /// Orphaned (-6), Disbatch's terminal state for a lost task.
    Orphan,
    /// Cancelled (-5): an operator had asked, and the runner is gone.
    Cancel,
    /// Failed (2) with "too many retries": the queue would requeue it, but the lost attempt
    /// was the last one `max_retries` allows (Coordinate's rule).
    Fail { max_retries: u32 },
    /// Failed (2) and discarded: the queue's retry policy covers lost attempts, and the lost
    /// one was the last `max_attempts` allows.
    Discard { max_attempts: u32 },
}

/// The fleet's time `age` ago.
pub(crate) fn ago(age: Duration) -> DateTime {
    disbatch_model::fleet_time::ago(age)
}

/// The fleet's time `lease` from now: when a lease taken now ends.
pub fn deadline(lease: Duration) -> DateTime {
    disbatch_model::fleet_time::after(lease)
}

impl RecoveryStore<'_> {
    /// Moves the lease of `id` forward while it still runs as `attempt`, and reports whether
    /// an operator asked to cancel it.
    pub async fn renew_lease(
        self,
        id: ObjectId,
        attempt: ObjectId,
        lease: Duration,
    ) -> Result<LeaseState> {
        let found = self
            .raw(TASKS)
            .find_one_and_update(
                doc! {task::ID: id, task::ATTEMPT: attempt, task::STATUS: status::RUNNING},
                doc! {"$set": {task::LEASE_UNTIL: deadline(lease)}},
            )
            .projection(doc! {task::CANCEL_REQUESTED: 1})
            .await
            .map_err(|e| Error::mongo(format!("renewing the lease of task {id}"), e))?;
        Ok(match found {
            Some(d) => LeaseState::Held {
                cancel_requested: d.get(task::CANCEL_REQUESTED).ok().flatten().is_some(),
            },
            None => LeaseState::Lost,
        })
    }

    /// Claimed or running tasks, on any node, whose lease passed before now; at most `limit`,
    /// longest expired first.
    pub async fn expired_leases(self, limit: i64) -> Result<Vec<ExpiredTask>> {
        self.leases_ending_before(fleet_time::now(), limit).await
    }

    /// Claimed or running tasks, on any node, whose lease ends before `horizon`; at most
    /// `limit`, earliest end first: the expired ones, then when the next may expire.
    pub async fn leases_ending_before(
        self,
        horizon: DateTime,
        limit: i64,
    ) -> Result<Vec<ExpiredTask>> {
        let filter = doc! {
            task::LEASE_UNTIL: {"$lt": horizon},
            task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
        };
        let cursor = self
            .raw(TASKS)
            .find(filter)
            .sort(doc! {task::LEASE_UNTIL: 1})
            .limit(limit)
            .projection(recovery_fields())
            .await
            .map_err(|e| Error::mongo("finding tasks whose lease passed", e))?;
        let docs = self
            .read_all(TASKS, cursor, "finding tasks whose lease passed")
            .await?;
        Ok(docs
            .iter()
            .filter_map(expired_task)
            .filter(|t| t.lease_until.is_some())
            .collect())
    }

    /// Recovers one lost task, unless it changed since it was read (renewed, finished, or
    /// recovered by another node). Returns whether this call recovered it; the attempt it
    /// lost is closed as `lost`, with `why` (how it was lost) as its reason.
    pub async fn recover_task(self, t: &ExpiredTask, how: Recovery, why: &str) -> Result<bool> {
        self.recover_task_after(t, how, why, Duration::ZERO).await
    }

    /// `recover_task`, with a requeued task claimable again only after `delay`.
    pub async fn recover_task_after(
        self,
        t: &ExpiredTask,
        how: Recovery,
        why: &str,
        delay: Duration,
    ) -> Result<bool> {
        let filter = recovery_filter(t);
        let now = fleet_time::now();
        // The runner writes its attempt's record when it ends; recovery writes it instead, or
        // overrules one written by a runner that died before its result landed.
        let lost = t
            .attempt
            .filter(|_| t.status == status::RUNNING)
            .map(|a| LostAttempt {
                task: t.id,
                queue: t.queue,
                attempt: a,
                node: t.node.clone(),
                start: t.started,
                end: now,
                reason: why.to_string(),
            });
        let update = recovery_update(t, how, why, delay, now, lost.as_ref());
        let to = match how {
            Recovery::Requeue { .. } => StatusGroup::Queued,
            Recovery::Orphan => StatusGroup::Orphaned,
            Recovery::Cancel => StatusGroup::Cancelled,
            Recovery::Fail { .. } | Recovery::Discard { .. } => StatusGroup::Failed,
        };
        // Claimed and running are counted live: only where the task goes is counted.
        let moved = match self.collection(TASKS).update_one(filter, update).await {
            Ok(r) => r.modified_count == 1,
            Err(e) => match crate::driver_error::refusal(&e) {
                // This task alone: the others are recovered all the same.
                Some(why) => {
                    let id = t.id.to_hex();
                    let why = format!("the server refused to recover it: {why}");
                    self.state
                        .skips
                        .skipped(TASKS, &id, crate::SkipReason::UpdateRefused, &why);
                    return Ok(false);
                }
                None => return Err(Error::mongo(format!("recovering task {}", t.id), e)),
            },
        };
        if !moved {
            return Ok(false);
        }
        if let Some(lost) = &lost {
            // The task moved: failing here leaves its entry, and the leader writes the record.
            if let Err(e) = self.write_lost_record(lost).await {
                tracing::warn!(
                    task = %t.id, attempt = %lost.attempt, error = %e,
                    "recovered a task but could not write its lost attempt's record yet; the maintenance leader will"
                );
            }
        }
        // Counted after the attempt record, which readers of the task expect beside it.
        if let Some(queue) = t.queue {
            let moved = crate::Moved {
                discarded: i64::from(matches!(how, Recovery::Discard { .. })),
                ..crate::Moved::new(queue, None, Some(to))
            };
            self.count_moves(&[moved]).await;
        }
        Ok(true)
    }

    /// Running tasks on `node` that an operator asked to cancel.
    pub async fn cancel_requests(self, node: &str) -> Result<Vec<ObjectId>> {
        let cursor = self
            .raw(TASKS)
            .find(doc! {
                task::NODE: node,
                task::STATUS: status::RUNNING,
                task::CANCEL_REQUESTED: {"$exists": true},
            })
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo("finding cancel requests", e))?;
        let docs = self
            .read_all(TASKS, cursor, "finding cancel requests")
            .await?;
        Ok(docs
            .iter()
            .filter_map(|d| d.get_object_id(task::ID).ok())
            .collect())
    }
}

/// A claimed or running task as recovery reads it; None when it lacks what recovery matches on.
pub(crate) fn expired_task(d: &Document) -> Option<ExpiredTask> {
    let status = match d.get(task::STATUS)? {
        Bson::Int32(n) => *n,
        Bson::Int64(n) => i32::try_from(*n).ok()?,
        Bson::Double(f) => *f as i32,
        _ => return None,
    };
    Some(ExpiredTask {
        id: d.get_object_id(task::ID).ok()?,
        queue: d.get_object_id(task::QUEUE).ok(),
        status,
        node: d.get_str(task::NODE).ok().map(str::to_string),
        attempt: d.get_object_id(task::ATTEMPT).ok(),
        attempts: crate::attempts_counted(d),
        cancel_requested: d.get(task::CANCEL_REQUESTED).is_some(),
        lease_until: d.get_datetime(task::LEASE_UNTIL).ok().copied(),
        started: d.get_datetime(task::MTIME).ok().copied(),
    })
}

/// The fields recovery reads of a task.
pub(crate) fn recovery_fields() -> Document {
    doc! {
        task::QUEUE: 1, task::STATUS: 1, task::NODE: 1, task::ATTEMPT: 1,
        task::ATTEMPTS: 1, task::ATTEMPTS_BEFORE_RETRY: 1, task::CANCEL_REQUESTED: 1,
        task::LEASE_UNTIL: 1, task::MTIME: 1,
    }
}

/// The task as its expired lease found it: a write matches only if nothing moved it since.
fn recovery_filter(t: &ExpiredTask) -> Document {
    let mut filter = doc! {
        task::ID: t.id,
        task::STATUS: t.status,
    };
    match t.lease_until {
        Some(until) => filter.insert(task::LEASE_UNTIL, until),
        None => {
            filter.insert(task::LEASE_UNTIL, doc! {"$exists": false});
            filter.insert(
                task::MTIME,
                doc! {"$eq": t.started.map_or(Bson::Null, Bson::DateTime)},
            )
        }
    };
    filter.insert(task::ATTEMPT, t.attempt.map_or(Bson::Null, Bson::ObjectId));
    filter
}

/// The write that recovers `t` as `how` says, at `now` (the fleet's time), with its lost
/// attempt's entry (`lost`) pushed in the same write.
fn recovery_update(
    t: &ExpiredTask,
    how: Recovery,
    why: &str,
    delay: Duration,
    now: DateTime,
    lost: Option<&LostAttempt>,
) -> Document {
    let mut set = doc! {task::MTIME: now};
    match how {
        Recovery::Requeue { .. } => {
            set.insert(task::STATUS, status::QUEUED);
            set.insert(task::NODE, Bson::Null);
            if delay > Duration::ZERO {
                set.insert(task::NOT_BEFORE, deadline(delay));
            }
        }
        Recovery::Orphan => {
            set.insert(task::STATUS, status::ORPHANED);
        }
        Recovery::Cancel => {
            set.insert(task::STATUS, status::CANCELLED);
        }
        Recovery::Discard { max_attempts } => {
            set.insert(task::STATUS, status::FAILED);
            set.insert(task::COMPLETE, true);
            set.insert(task::DISCARDED_AT, now);
            set.insert(
                task::STDERR,
                format!(
                    "lost on attempt {} of {max_attempts}: out of attempts, discarded: {why}",
                    t.attempts
                ),
            );
        }
        Recovery::Fail { max_retries } => {
            set.insert(task::STATUS, status::FAILED);
            set.insert(task::COMPLETE, true);
            set.insert(
                task::STDERR,
                format!(
                    "too many retries: attempt {} of {max_retries} (max_retries) was lost: {why}",
                    t.attempts
                ),
            );
        }
    }
    let mut unset = doc! {
        task::SLOT: "", task::LEASE_UNTIL: "", task::CANCEL_REQUESTED: "",
        task::LIVE_OUTPUT: "",
    };
    // Requeued in an ordered queue, it keeps its key slot as a retry does (its place);
    // otherwise the slot goes.
    if !matches!(
        how,
        Recovery::Requeue {
            keep_key_slot: true
        }
    ) {
        unset.insert(task::CONCURRENCY_KEY, "");
        unset.insert(task::CONCURRENCY_SLOT, "");
    }
    let mut update = doc! {"$set": set, "$unset": unset};
    // In the same write as the move, so that no crash leaves a moved task without either
    // its lost attempt's record or what that record is to say (`lost_records.rs`).
    if let Some(lost) = lost {
        update.insert("$push", doc! {task::UNRECORDED_ATTEMPTS: lost.entry()});
    }
    update
}
