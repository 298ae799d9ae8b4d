//! Waiting tasks: created blocked on the tasks they name, released when those have ended, and
//! cancelled (with the reason, and onwards) when one fails under the "cancel" policy.
//!
//! Every step is a conditional write that can be repeated: an ended dependency is taken out
//! of `waiting_on` (so it counts once however many settlers see it end; how, in
//! `store::releases`), a task is released or cancelled only from blocked. So the DEN that ran a task, the DCI that cancelled it, the
//! creator that found a dependency already ended and the leader's sweep may all settle the
//! same end, and a waiting task still starts exactly once, never before its last dependency
//! ended. Work is by index (`waiting_on`, `has_dependents`), in rounds of `CHUNK` dependents.

use crate::WorkflowStore;
use std::collections::{BTreeMap, HashMap, HashSet};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::error::{Error, Result};
use crate::workflows::releases::{list_len, object_ids, short_waits, SHORT};
use crate::{Created, LimitIndex, Moved, StatusGroup, Store, Timing};
use disbatch_model::fleet_time;
use disbatch_model::schema::{queue as queue_field, task, QUEUES, TASKS};
use disbatch_model::status;
use disbatch_model::workflow::{OnDependencyFailure, MAX_WORKFLOW_TASKS};

/// Dependents handled per round: bounded memory whatever a task's fan-out. Each round's
/// writes name its tasks by `_id: {$in}`, which SecantusDB 0.5.3 matches in time that grows
/// faster than the list: releasing 9 998 dependents took 4.9 s of server CPU in one round of
/// 9 998 and 1.3 s in rounds of 1 000 (pymongo, BENCHMARKS.md "Workflows").
const CHUNK: i64 = 1_000;
/// Ended tasks the sweep settles per round, and rounds per sweep.
const SWEEP: i64 = 1_000;
const SWEEP_ROUNDS: usize = 20;
/// Statuses from which a task has not ended yet (others have, or are no status we know).
const LIVE: [i32; 4] = [
    status::QUEUED,
    status::CLAIMED,
    status::RUNNING,
    status::BLOCKED,
];

/// What a set of new tasks waits for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    pub depends_on: Vec<ObjectId>,
    /// None: the queue's `on_dependency_failure`, else "cancel".
    pub on_failure: Option<OnDependencyFailure>,
}

/// What settling some ends did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// Ended tasks whose dependents were settled.
    pub settled: u64,
    /// Waiting tasks that became queued.
    pub released: u64,
    /// Waiting tasks cancelled because a dependency failed or was cancelled.
    pub cancelled: u64,
    /// Batch callbacks released (each exactly once).
    pub callbacks: u64,
    /// Batch callbacks failed instead: their documents could not take the batch's outcome.
    pub callbacks_failed: u64,
    /// Writes that failed and were skipped, for the next settle to try again.
    pub errors: u64,
}

impl Settled {
    /// Adds what another settle did.
    pub fn add(&mut self, other: Settled) {
        self.settled += other.settled;
        self.released += other.released;
        self.cancelled += other.cancelled;
        self.callbacks += other.callbacks;
        self.callbacks_failed += other.callbacks_failed;
        self.errors += other.errors;
    }
}

/// How a dependency ended, for the reason a dependent is cancelled with.
fn ending(group: StatusGroup, code: Option<&Bson>) -> Option<String> {
    match group {
        StatusGroup::Succeeded => None,
        StatusGroup::Failed => Some(match code {
            Some(c) => format!("failed (status {c})"),
            None => "failed".into(),
        }),
        other => Some(format!("was {}", other.as_str())),
    }
}

/// Why a dependent of task `id` is cancelled. A graph task is led by its name, which is what
/// its author wrote and reads; the id stays beside it for the API and the database.
fn cancel_reason(id: ObjectId, name: Option<&str>, how: &str) -> String {
    match name {
        Some(name) => format!("dependency {name:?} ({id}) {how}"),
        None => format!("dependency {id} {how}"),
    }
}

fn ended(group: StatusGroup) -> bool {
    matches!(
        group,
        StatusGroup::Succeeded
            | StatusGroup::Failed
            | StatusGroup::Terminated
            | StatusGroup::Cancelled
            | StatusGroup::Orphaned
    )
}

impl WorkflowStore<'_> {
    /// Inserts tasks that wait for `waits.depends_on` (blocked until all have ended). Each
    /// named task must exist. A dependency that has already ended counts at once.
    pub async fn create_waiting_tasks(
        self,
        queue: ObjectId,
        params: Vec<Document>,
        waits: &Waits,
    ) -> Result<Created> {
        self.create_waiting_tasks_at(queue, params, waits, &[])
            .await
    }

    /// `create_waiting_tasks`, task `i` with `timings[i]`'s fields. `not_before` is a time, not a
    /// delay from the release: a task released after it may be claimed at once.
    pub async fn create_waiting_tasks_at(
        self,
        queue: ObjectId,
        params: Vec<Document>,
        waits: &Waits,
        timings: &[Timing],
    ) -> Result<Created> {
        let mut deps = waits.depends_on.clone();
        let mut seen = HashSet::new();
        deps.retain(|d| seen.insert(*d));
        if deps.is_empty() {
            return self.tasks().create_tasks_at(queue, params, timings).await;
        }
        if deps.len() > MAX_WORKFLOW_TASKS {
            return Err(Error::Invalid(format!(
                "depends_on names at most {MAX_WORKFLOW_TASKS} tasks, not {}",
                deps.len()
            )));
        }
        if self.unique_of(queue).await?.is_some() {
            return Err(Error::Invalid(
                "depends_on: tasks of a queue with `unique` cannot wait for others (a duplicate would not wait)".into(),
            ));
        }
        self.check_tasks_exist(&deps, "depends_on").await?;
        self.limits()
            .ensure_limit_index(LimitIndex::Workflows)
            .await?;
        let on_failure = match waits.on_failure {
            Some(p) => p,
            None => self.dependency_policy_of(queue).await?,
        };
        self.mark_dependencies(&deps).await?;
        let now = fleet_time::now();
        let docs: Vec<Document> = params
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut d = doc! {
                    task::ID: ObjectId::new(), task::QUEUE: queue, task::STATUS: status::BLOCKED,
                    task::NODE: Bson::Null, task::PARAMS: p, task::CTIME: now, task::MTIME: now,
                    task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
                    task::DEPENDS_ON: &deps, task::WAITING_ON: &deps,
                    task::ON_DEPENDENCY_FAILURE: on_failure.name(),
                };
                timings.get(i).copied().unwrap_or_default().stamp(&mut d);
                d
            })
            .collect();
        let ids: Vec<ObjectId> = docs
            .iter()
            .filter_map(|d| d.get_object_id(task::ID).ok())
            .collect();
        self.collection(TASKS)
            .insert_many(&docs)
            .await
            .map_err(|e| Error::mongo(format!("inserting waiting tasks into queue {queue}"), e))?;
        let made = Moved {
            n: ids.len() as u64,
            ..Moved::new(queue, None, Some(StatusGroup::Blocked))
        };
        self.count_moves(&[made]).await;
        // A dependency may have ended before the new tasks were there to see it.
        self.settle_dependents(&deps).await?;
        Ok(Created {
            ids,
            ..Created::default()
        })
    }

    /// A queue's default `on_dependency_failure`: "cancel" unless it says "run" (a value
    /// that is neither, written by hand, reads as "cancel", the safe side).
    pub async fn dependency_policy_of(self, queue: ObjectId) -> Result<OnDependencyFailure> {
        let found = self
            .raw(QUEUES)
            .find_one(doc! {queue_field::ID: queue})
            .projection(doc! {queue_field::ON_DEPENDENCY_FAILURE: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading queue {queue}"), e))?;
        let policy = found
            .as_ref()
            .and_then(|d| d.get_str(queue_field::ON_DEPENDENCY_FAILURE).ok())
            .and_then(|s| OnDependencyFailure::parse(s).ok());
        Ok(policy.unwrap_or_default())
    }

    /// Settles what waits for `ids`, those of them that have ended: pulls them from their
    /// dependents' `waiting_on`, cancels the dependents a failure cancels (and onwards),
    /// releases the dependents left waiting on nothing. Tasks of `ids` still live are skipped.
    pub async fn settle_dependents(self, ids: &[ObjectId]) -> Result<Settled> {
        let mut out = Settled::default();
        if ids.is_empty() {
            return Ok(out);
        }
        // A cascade of cancellations can name more than a round's worth: every write below
        // names its tasks by `$in`, so each goes in rounds of `CHUNK`, like the dependents.
        let mut round: Vec<ObjectId> = ids.to_vec();
        while !round.is_empty() {
            let mut next = Vec::new();
            for part in round.chunks(CHUNK as usize) {
                next.extend(self.settle_round(part, &mut out).await?);
            }
            round = next;
        }
        Ok(out)
    }

    /// `settle_dependents` on a task of its own, for a caller that answers first: a cancel
    /// cascading down a chain takes a few round trips per level. What it leaves undone (its
    /// process stopped) the maintenance leader's sweep finds by the ended tasks' marks.
    pub fn settle_dependents_later(self, ids: Vec<ObjectId>) {
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.workflows().settle_dependents(&ids).await {
                tracing::warn!(error = %e, "could not settle what waits on a cancelled task; the leader's sweep will");
            }
        });
    }

    /// The maintenance leader's catch-all: ended tasks still marked as waited for (ended by a
    /// Perl node, by hand, or by a node that died before settling), settled in rounds.
    pub async fn settle_ended_dependencies(self) -> Result<Settled> {
        let mut out = Settled::default();
        if !self.limits().workflows_in_use().await? {
            return Ok(out);
        }
        for _ in 0..SWEEP_ROUNDS {
            let mut ids = Vec::new();
            let mut cursor = self
                .raw(TASKS)
                .find(doc! {task::HAS_DEPENDENTS: true, task::STATUS: {"$nin": LIVE.to_vec()}})
                .projection(doc! {task::ID: 1})
                .limit(SWEEP)
                .await
                .map_err(|e| Error::mongo("looking for ended tasks others wait for", e))?;
            while let Some(d) = cursor
                .try_next()
                .await
                .map_err(|e| Error::mongo("looking for ended tasks others wait for", e))?
            {
                if let Some(Some(id)) = d.get(task::ID).ok().flatten().map(|v| v.as_object_id()) {
                    ids.push(id);
                }
            }
            let full = ids.len() as i64 == SWEEP;
            if !ids.is_empty() {
                out.add(self.settle_dependents(&ids).await?);
            }
            if !full {
                break;
            }
        }
        Ok(out)
    }
}

impl Store {
    /// Refuses ids of tasks that do not exist, naming up to five of them.
    pub(crate) async fn check_tasks_exist(&self, ids: &[ObjectId], field: &str) -> Result<()> {
        let mut found: HashSet<ObjectId> = HashSet::with_capacity(ids.len());
        let mut cursor = self
            .raw(TASKS)
            .find(doc! {task::ID: {"$in": ids}})
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo("reading the tasks named as dependencies", e))?;
        while let Some(d) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo("reading the tasks named as dependencies", e))?
        {
            if let Some(Some(id)) = d.get(task::ID).ok().flatten().map(|v| v.as_object_id()) {
                found.insert(id);
            }
        }
        let missing: Vec<String> = ids
            .iter()
            .filter(|i| !found.contains(i))
            .map(|i| i.to_hex())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let shown = missing
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        let more = match missing.len() {
            n if n > 5 => format!(" and {} more", n - 5),
            _ => String::new(),
        };
        Err(Error::Invalid(format!(
            "{field}: no task has the id {shown}{more}"
        )))
    }

    /// Whether task `id` is marked as waited for (one read of that field by `_id`).
    pub(crate) async fn is_marked_waited_for(&self, id: ObjectId) -> Result<bool> {
        let found = self
            .raw(TASKS)
            .find_one(doc! {task::ID: id})
            .projection(doc! {task::HAS_DEPENDENTS: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading task {id}"), e))?;
        Ok(found.is_some_and(|d| d.get_bool(task::HAS_DEPENDENTS).unwrap_or(false)))
    }

    /// Marks tasks as waited for, before their dependents are inserted: whoever settles their
    /// end from then on looks for dependents (the sweep finds ended ones by this mark).
    pub(crate) async fn mark_dependencies(&self, ids: &[ObjectId]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.collection(TASKS)
            .update_many(
                doc! {task::ID: {"$in": ids}},
                doc! {"$set": {task::HAS_DEPENDENTS: true}},
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("marking the tasks others wait for", e))
    }

    /// Settles the ended tasks of `ids` (at most `CHUNK`); returns the dependents it cancelled,
    /// which have ended too and may have dependents of their own.
    async fn settle_round(&self, ids: &[ObjectId], out: &mut Settled) -> Result<Vec<ObjectId>> {
        let ended = self.ended_of(ids).await?;
        if ended.is_empty() {
            return Ok(Vec::new());
        }
        let failed: Vec<(ObjectId, String)> = ended
            .iter()
            .filter_map(|(id, how)| how.clone().map(|h| (*id, h)))
            .collect();
        let all: Vec<ObjectId> = ended.iter().map(|(id, _)| *id).collect();
        let cancelled = self.cancel_dependents_of(&failed, out).await?;
        self.pull_and_release(&all, out).await?;
        self.collection(TASKS)
            .update_many(
                doc! {task::ID: {"$in": &all}, task::STATUS: {"$nin": LIVE.to_vec()}},
                doc! {"$unset": {task::HAS_DEPENDENTS: ""}},
            )
            .await
            .map_err(|e| Error::mongo("clearing settled tasks' marks", e))?;
        out.settled += all.len() as u64;
        Ok(cancelled)
    }

    /// Of `ids`, those that have ended, each with the reason its dependents are cancelled for
    /// (None: it succeeded).
    async fn ended_of(&self, ids: &[ObjectId]) -> Result<Vec<(ObjectId, Option<String>)>> {
        let mut out = Vec::new();
        let mut cursor = self
            .raw(TASKS)
            .find(doc! {task::ID: {"$in": ids}})
            .projection(doc! {task::ID: 1, task::STATUS: 1, task::GRAPH_NAME: 1})
            .await
            .map_err(|e| Error::mongo("reading the statuses of ended tasks", e))?;
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo("reading the statuses of ended tasks", e))?
        {
            let Some(d) = self.decode_or_skip(TASKS, &raw) else {
                continue;
            };
            let Ok(id) = d.get_object_id(task::ID) else {
                continue;
            };
            let group = StatusGroup::of(d.get(task::STATUS));
            if ended(group) {
                let how = ending(group, d.get(task::STATUS));
                let name = d.get_str(task::GRAPH_NAME).ok();
                out.push((id, how.map(|how| cancel_reason(id, name, &how))));
            }
        }
        Ok(out)
    }

    /// Cancels the blocked dependents of failed tasks (each with the reason its dependents are
    /// cancelled for) that cancel on failure; returns them (they have ended too, and may have
    /// dependents of their own).
    async fn cancel_dependents_of(
        &self,
        failed: &[(ObjectId, String)],
        out: &mut Settled,
    ) -> Result<Vec<ObjectId>> {
        let mut cancelled = Vec::new();
        if failed.is_empty() {
            return Ok(cancelled);
        }
        let failed_ids: Vec<ObjectId> = failed.iter().map(|(id, _)| *id).collect();
        let filter = doc! {
            task::WAITING_ON: {"$in": &failed_ids},
            task::STATUS: status::BLOCKED,
            task::ON_DEPENDENCY_FAILURE: {"$ne": OnDependencyFailure::Run.name()},
        };
        let position: HashMap<ObjectId, usize> = failed
            .iter()
            .enumerate()
            .map(|(i, (id, _))| (*id, i))
            .collect();
        loop {
            let (found, _) = self.dependents(filter.clone(), short_waits()).await?;
            if found.is_empty() {
                break;
            }
            // By queue and by the dependency named in the reason: one write each.
            let mut groups: BTreeMap<(ObjectId, usize), Vec<ObjectId>> = BTreeMap::new();
            for (id, queue, d) in &found {
                let mut waits = object_ids(d.get(task::WAITING_ON));
                let long = list_len(d.get(task::WAITING_ON)) > SHORT;
                if long && !waits.iter().any(|w| position.contains_key(w)) {
                    waits = self.all_waits(*id).await?;
                }
                let first = waits
                    .iter()
                    .find_map(|f| position.get(f))
                    .copied()
                    .unwrap_or(0);
                groups.entry((*queue, first)).or_default().push(*id);
            }
            let mut progress = 0;
            for ((queue, which), ids) in groups {
                let (_, reason) = &failed[which];
                let r = self
                    .collection(TASKS)
                    .update_many(
                        doc! {task::ID: {"$in": &ids}, task::STATUS: status::BLOCKED},
                        doc! {
                            "$set": {task::STATUS: status::CANCELLED, task::MTIME: fleet_time::now(), task::CANCEL_REASON: reason},
                            "$unset": {task::WAITING_ON: ""},
                        },
                    )
                    .await
                    .map_err(|e| Error::mongo("cancelling the dependents of a failed task", e))?;
                let moved = Moved {
                    n: r.modified_count,
                    ..Moved::new(
                        queue,
                        Some(StatusGroup::Blocked),
                        Some(StatusGroup::Cancelled),
                    )
                };
                self.count_moves(&[moved]).await;
                out.cancelled += r.modified_count;
                progress += r.matched_count;
                cancelled.extend(ids);
            }
            // Nothing matched again: what the read found was changed by another settler (or
            // cannot be changed); reading it again would find the same.
            if progress == 0 {
                break;
            }
        }
        Ok(cancelled)
    }

    /// Everything task `id` still waits on (a long list, read alone).
    async fn all_waits(&self, id: ObjectId) -> Result<Vec<ObjectId>> {
        let found = self
            .raw(TASKS)
            .find_one(doc! {task::ID: id})
            .projection(doc! {task::WAITING_ON: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading task {id}'s dependencies"), e))?;
        Ok(found
            .and_then(|raw| self.decode_or_skip(TASKS, &raw))
            .map(|d| object_ids(d.get(task::WAITING_ON)))
            .unwrap_or_default())
    }

    /// Blocked dependents matching `filter`, a round of them: (id, queue, the fields asked),
    /// and whether the round was full (more may match).
    pub(crate) async fn dependents(
        &self,
        filter: Document,
        mut fields: Document,
    ) -> Result<(Vec<(ObjectId, ObjectId, Document)>, bool)> {
        fields.insert(task::ID, 1);
        fields.insert(task::QUEUE, 1);
        let mut cursor = self
            .raw(TASKS)
            .find(filter)
            .projection(fields)
            .limit(CHUNK)
            .await
            .map_err(|e| Error::mongo("reading waiting tasks", e))?;
        let mut out = Vec::new();
        let mut read = 0;
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo("reading waiting tasks", e))?
        {
            read += 1;
            let Some(d) = self.decode_or_skip(TASKS, &raw) else {
                continue;
            };
            if let (Ok(id), Ok(queue)) = (d.get_object_id(task::ID), d.get_object_id(task::QUEUE)) {
                out.push((id, queue, d));
            }
        }
        Ok((out, read >= CHUNK))
    }
}

/// Whether a claimed task is marked as waited for: its node then settles its end at once.
pub fn is_waited_for(task: &Document) -> bool {
    task.get_bool(task::HAS_DEPENDENTS).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_leads_with_the_dependency_name_and_keeps_its_id() {
        let id = ObjectId::new();
        assert_eq!(
            cancel_reason(id, Some("fetch"), "failed (status 2)"),
            format!("dependency \"fetch\" ({id}) failed (status 2)")
        );
        assert_eq!(
            cancel_reason(id, None, "was cancelled"),
            format!("dependency {id} was cancelled")
        );
    }
}
