//! Graphs and batches: creating a set of tasks in one request, reading it back with each
//! task's status, cancelling it as a whole.
//!
//! A graph's tasks are all inserted blocked, then its roots are released, so no task of a
//! graph starts before the whole graph is stored (and a failed insert leaves none behind).
//! A batch's callback is inserted before its members, waiting on all of them under the "run"
//! policy: the settler that pulls the last member releases it, once (`store::dependencies`).

use crate::WorkflowStore;
use std::collections::{BTreeMap, HashSet};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::claims::candidates::release_holds;
use crate::error::{Error, Result};
use crate::{LimitIndex, Moved, StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, workflow, BATCHES, GRAPHS, TASKS};
use disbatch_model::status;
use disbatch_model::workflow::{OnDependencyFailure, MAX_WORKFLOW_TASKS};

/// Tasks of a graph inserted per write.
const GRAPH_INSERT_CHUNK: usize = 1_000;

/// Members a batch view lists (its counts cover them all).
pub const BATCH_MEMBERS_SHOWN: i64 = 1_000;

/// One task of a checked graph request.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphTask {
    pub name: String,
    pub queue: ObjectId,
    pub params: Document,
    /// Indexes of the request's tasks it waits for.
    pub waits_for: Vec<usize>,
    /// Tasks that already exist which it waits for.
    pub existing: Vec<ObjectId>,
    /// None: the queue's `on_dependency_failure`.
    pub on_failure: Option<OnDependencyFailure>,
}

/// One task of a batch request.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchTask {
    pub queue: ObjectId,
    pub params: Document,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewBatch {
    pub id: ObjectId,
    pub members: Vec<ObjectId>,
    pub callback: Option<ObjectId>,
}

/// A task of a graph or batch as its views show it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowTask {
    pub id: ObjectId,
    pub queue: Option<ObjectId>,
    pub name: Option<String>,
    /// As stored (any type a hand edit left).
    pub status: Option<Bson>,
    pub depends_on: Vec<ObjectId>,
    pub waiting_on: Vec<ObjectId>,
    pub cancel_reason: Option<String>,
}

/// A graph or a batch, as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowSummary {
    pub id: ObjectId,
    pub ctime: Option<DateTime>,
    pub size: u64,
    pub callback_task: Option<ObjectId>,
    pub cancelled: Option<DateTime>,
    pub done: Option<DateTime>,
}

/// What cancelling a graph or batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WholeCancel {
    pub cancelled: u64,
    /// Running tasks asked to stop (their runners do within seconds).
    pub requested: u64,
}

/// Counts by status group, named as the API names them.
pub type StatusCounts = BTreeMap<&'static str, u64>;

/// The tasks `t` depends on, in the graph (`ids` by request index) and outside it, once each.
/// Made again where needed rather than kept: a graph's lists are most of its size.
fn deps_of(t: &GraphTask, ids: &[ObjectId]) -> Vec<ObjectId> {
    let mut deps: Vec<ObjectId> = t
        .waits_for
        .iter()
        .filter_map(|&j| ids.get(j).copied())
        .collect();
    deps.extend(t.existing.iter().copied());
    let mut seen = HashSet::with_capacity(deps.len());
    deps.retain(|d| seen.insert(*d));
    deps
}

/// Which of `tasks` another task of the graph waits for; Err when one depends on more than
/// `MAX_WORKFLOW_TASKS` tasks.
fn waited_for(tasks: &[GraphTask], ids: &[ObjectId]) -> Result<Vec<bool>> {
    let mut waited_for = vec![false; tasks.len()];
    for t in tasks {
        for &i in &t.waits_for {
            if let Some(w) = waited_for.get_mut(i) {
                *w = true;
            }
        }
    }
    if let Some((t, n)) = tasks
        .iter()
        .map(|t| (t, deps_of(t, ids).len()))
        .find(|(_, n)| *n > MAX_WORKFLOW_TASKS)
    {
        return Err(Error::Invalid(format!(
            "task {:?} depends on at most {MAX_WORKFLOW_TASKS} tasks, not {n}",
            t.name
        )));
    }
    Ok(waited_for)
}

impl WorkflowStore<'_> {
    /// Stores a checked graph (`workflow::check_graph`) and returns its id and its tasks' ids,
    /// in request order.
    pub async fn create_graph(self, tasks: &[GraphTask]) -> Result<(ObjectId, Vec<ObjectId>)> {
        if tasks.is_empty() || tasks.len() > MAX_WORKFLOW_TASKS {
            return Err(Error::Invalid(format!(
                "a graph holds 1 to {MAX_WORKFLOW_TASKS} tasks, not {}",
                tasks.len()
            )));
        }
        let queues: HashSet<ObjectId> = tasks.iter().map(|t| t.queue).collect();
        self.refuse_unique_queues(&queues, "a graph").await?;
        let existing: Vec<ObjectId> = {
            let mut seen = HashSet::new();
            tasks
                .iter()
                .flat_map(|t| t.existing.iter().copied())
                .filter(|id| seen.insert(*id))
                .collect()
        };
        self.check_tasks_exist(&existing, "depends_on").await?;
        self.limits()
            .ensure_limit_index(LimitIndex::Workflows)
            .await?;
        let mut defaults = BTreeMap::new();
        for q in &queues {
            defaults.insert(*q, self.dependency_policy_of(*q).await?);
        }
        let graph = ObjectId::new();
        let ids: Vec<ObjectId> = tasks.iter().map(|_| ObjectId::new()).collect();
        let waited_for = waited_for(tasks, &ids)?;
        let deps_of = |t: &GraphTask| deps_of(t, &ids);
        let now = fleet_time::now();
        let mut roots: BTreeMap<ObjectId, Vec<ObjectId>> = BTreeMap::new();
        self.mark_dependencies(&existing).await?;
        self.collection(GRAPHS)
            .insert_one(doc! {workflow::ID: graph, workflow::CTIME: now, workflow::SIZE: tasks.len() as i64})
            .await
            .map_err(|e| Error::mongo("storing a graph", e))?;
        // In chunks: a graph's documents, each with its lists as BSON values, are several times
        // its request's size, and all are blocked until the last chunk is in.
        for (c, chunk) in tasks.chunks(GRAPH_INSERT_CHUNK).enumerate() {
            let mut docs = Vec::with_capacity(chunk.len());
            for (k, t) in chunk.iter().enumerate() {
                let i = c * GRAPH_INSERT_CHUNK + k;
                let deps = deps_of(t);
                let mut d = doc! {
                    task::ID: ids[i], task::QUEUE: t.queue, task::STATUS: status::BLOCKED,
                    task::NODE: Bson::Null, task::PARAMS: t.params.clone(), task::CTIME: now, task::MTIME: now,
                    task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
                    task::GRAPH: graph, task::GRAPH_NAME: &t.name,
                    task::ON_DEPENDENCY_FAILURE: t.on_failure.or(defaults.get(&t.queue).copied()).unwrap_or_default().name(),
                };
                if deps.is_empty() {
                    roots.entry(t.queue).or_default().push(ids[i]);
                } else {
                    d.insert(task::DEPENDS_ON, &deps);
                    d.insert(task::WAITING_ON, &deps);
                }
                if waited_for[i] {
                    d.insert(task::HAS_DEPENDENTS, true);
                }
                docs.push(d);
            }
            if let Err(e) = self.collection(TASKS).insert_many(&docs).await {
                // Nothing of it has started (all blocked): take back what went in.
                let _ = self
                    .collection(TASKS)
                    .delete_many(doc! {task::GRAPH: graph})
                    .await;
                let _ = self
                    .collection(GRAPHS)
                    .delete_one(doc! {workflow::ID: graph})
                    .await;
                return Err(Error::mongo("storing a graph's tasks", e));
            }
        }
        let mut made: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for t in tasks {
            *made.entry(t.queue).or_default() += 1;
        }
        let moves: Vec<Moved> = made
            .into_iter()
            .map(|(queue, n)| Moved {
                n,
                ..Moved::new(queue, None, Some(StatusGroup::Blocked))
            })
            .collect();
        self.count_moves(&moves).await;
        for (queue, roots) in roots {
            let mut released = crate::Settled::default();
            self.release_where(queue, doc! {task::ID: {"$in": &roots}}, &mut released)
                .await?;
        }
        // Tasks outside the graph may have ended before the graph was there to see it.
        self.settle_dependents(&existing).await?;
        Ok((graph, ids))
    }

    /// Stores a batch: its callback (if any) waiting on every member, then the members.
    pub async fn create_batch(
        self,
        members: &[BatchTask],
        callback: Option<&BatchTask>,
    ) -> Result<NewBatch> {
        if members.is_empty() || members.len() > MAX_WORKFLOW_TASKS {
            return Err(Error::Invalid(format!(
                "a batch holds 1 to {MAX_WORKFLOW_TASKS} tasks, not {}",
                members.len()
            )));
        }
        let mut queues: HashSet<ObjectId> = members.iter().map(|t| t.queue).collect();
        queues.extend(callback.map(|c| c.queue));
        self.refuse_unique_queues(&queues, "a batch").await?;
        self.limits()
            .ensure_limit_index(LimitIndex::Workflows)
            .await?;
        let batch = ObjectId::new();
        let now = fleet_time::now();
        let ids: Vec<ObjectId> = members.iter().map(|_| ObjectId::new()).collect();
        let callback_id = callback.map(|_| ObjectId::new());
        let callback_field = match callback {
            Some(c) => Bson::Document(doc! {task::QUEUE: c.queue, task::PARAMS: c.params.clone()}),
            None => Bson::Null,
        };
        self.collection(BATCHES)
            .insert_one(doc! {
                workflow::ID: batch, workflow::CTIME: now, workflow::SIZE: members.len() as i64,
                workflow::CALLBACK: callback_field,
                workflow::CALLBACK_TASK: callback_id.map_or(Bson::Null, Bson::ObjectId),
            })
            .await
            .map_err(|e| Error::mongo("storing a batch", e))?;
        let undo = || async {
            let _ = self
                .collection(TASKS)
                .delete_many(doc! {task::BATCH: batch})
                .await;
            let _ = self
                .collection(TASKS)
                .delete_many(doc! {task::BATCH_CALLBACK: batch})
                .await;
            let _ = self
                .collection(BATCHES)
                .delete_one(doc! {workflow::ID: batch})
                .await;
        };
        if let (Some(c), Some(id)) = (callback, callback_id) {
            let d = doc! {
                task::ID: id, task::QUEUE: c.queue, task::STATUS: status::BLOCKED,
                task::NODE: Bson::Null, task::PARAMS: c.params.clone(), task::CTIME: now, task::MTIME: now,
                task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
                task::WAITING_ON: &ids, task::BATCH_CALLBACK: batch,
                task::ON_DEPENDENCY_FAILURE: OnDependencyFailure::Run.name(),
            };
            if let Err(e) = self.collection(TASKS).insert_one(d).await {
                undo().await;
                return Err(Error::mongo("storing a batch's callback", e));
            }
            self.count_moves(&[Moved::new(c.queue, None, Some(StatusGroup::Blocked))])
                .await;
        }
        let docs: Vec<Document> = members
            .iter()
            .zip(&ids)
            .map(|(m, id)| {
                let mut d = doc! {
                    task::ID: id, task::QUEUE: m.queue, task::STATUS: status::QUEUED,
                    task::NODE: Bson::Null, task::PARAMS: m.params.clone(), task::CTIME: now, task::MTIME: now,
                    task::STDOUT: Bson::Null, task::STDERR: Bson::Null, task::BATCH: batch,
                };
                if callback.is_some() {
                    d.insert(task::HAS_DEPENDENTS, true);
                }
                d
            })
            .collect();
        if let Err(e) = self.collection(TASKS).insert_many(&docs).await {
            // Members that went in may be running already: cancel rather than delete them.
            let _ = self
                .cancel_whole(
                    doc! {task::BATCH: batch},
                    callback_id,
                    "the batch could not be stored",
                )
                .await;
            let _ = self
                .collection(BATCHES)
                .update_one(
                    doc! {workflow::ID: batch},
                    doc! {"$set": {workflow::CANCELLED: fleet_time::now()}},
                )
                .await;
            return Err(Error::mongo("storing a batch's tasks", e));
        }
        let mut made: BTreeMap<ObjectId, u64> = BTreeMap::new();
        for m in members {
            *made.entry(m.queue).or_default() += 1;
        }
        let moves: Vec<Moved> = made
            .into_iter()
            .map(|(queue, n)| Moved {
                n,
                ..Moved::new(queue, None, Some(StatusGroup::Queued))
            })
            .collect();
        self.count_moves(&moves).await;
        Ok(NewBatch {
            id: batch,
            members: ids,
            callback: callback_id,
        })
    }

    /// Cancels a graph's or batch's tasks that have not ended (queued, blocked and claimed at
    /// once, running ones by request), and what outside waits on them as its policy says.
    pub async fn cancel_graph(self, id: ObjectId) -> Result<Option<WholeCancel>> {
        if self.workflow_summary(GRAPHS, id).await?.is_none() {
            return Ok(None);
        }
        self.collection(GRAPHS)
            .update_one(
                doc! {workflow::ID: id},
                doc! {"$set": {workflow::CANCELLED: fleet_time::now()}},
            )
            .await
            .map_err(|e| Error::mongo(format!("cancelling graph {id}"), e))?;
        self.cancel_whole(doc! {task::GRAPH: id}, None, "its graph was cancelled")
            .await
            .map(Some)
    }

    pub async fn cancel_batch(self, id: ObjectId) -> Result<Option<WholeCancel>> {
        let Some(summary) = self.workflow_summary(BATCHES, id).await? else {
            return Ok(None);
        };
        self.collection(BATCHES)
            .update_one(
                doc! {workflow::ID: id},
                doc! {"$set": {workflow::CANCELLED: fleet_time::now()}},
            )
            .await
            .map_err(|e| Error::mongo(format!("cancelling batch {id}"), e))?;
        self.cancel_whole(
            doc! {task::BATCH: id},
            summary.callback_task,
            "its batch was cancelled",
        )
        .await
        .map(Some)
    }
}

impl Store {
    async fn refuse_unique_queues(&self, queues: &HashSet<ObjectId>, what: &str) -> Result<()> {
        for q in queues {
            if self.unique_of(*q).await?.is_some() {
                return Err(Error::Invalid(format!(
                    "{what} cannot hold tasks of queue {q}: it has `unique`, and a duplicate would not take part"
                )));
            }
        }
        Ok(())
    }

    async fn cancel_whole(
        &self,
        members: Document,
        also: Option<ObjectId>,
        reason: &str,
    ) -> Result<WholeCancel> {
        let mut out = WholeCancel::default();
        let mut ended = Vec::new();
        let waiting = [status::QUEUED, status::BLOCKED, status::CLAIMED];
        let mut scopes = vec![members.clone()];
        scopes.extend(also.map(|id| doc! {task::ID: id}));
        for scope in &scopes {
            for code in waiting {
                let mut filter = scope.clone();
                filter.insert(task::STATUS, code);
                let found = self
                    .workflow_tasks(filter.clone(), MAX_WORKFLOW_TASKS as i64)
                    .await?;
                let mut by_queue: BTreeMap<ObjectId, Vec<ObjectId>> = BTreeMap::new();
                for t in &found {
                    if let Some(q) = t.queue {
                        by_queue.entry(q).or_default().push(t.id);
                    }
                }
                for (queue, ids) in by_queue {
                    let n = self.cancel_waiting(&ids, code, reason).await?;
                    let moved = Moved {
                        n,
                        ..Moved::new(
                            queue,
                            Some(crate::group_of(code)),
                            Some(StatusGroup::Cancelled),
                        )
                    };
                    self.count_moves(&[moved]).await;
                    out.cancelled += n;
                    ended.extend(ids);
                }
            }
        }
        let mut running = members;
        running.insert(task::STATUS, status::RUNNING);
        let r = self
            .collection(TASKS)
            .update_many(
                running,
                doc! {"$set": {task::CANCEL_REQUESTED: fleet_time::now()}},
            )
            .await
            .map_err(|e| Error::mongo("asking a graph's or batch's running tasks to stop", e))?;
        out.requested = r.modified_count;
        self.workflows().settle_dependents(&ended).await?;
        Ok(out)
    }

    /// Cancels the tasks `ids` still at status `code`, with `reason`; returns how many. A
    /// document too large to take the reason (params grown by hand) is cancelled by a write
    /// that grows nothing, so one such task neither fails the cancel nor is left running.
    async fn cancel_waiting(&self, ids: &[ObjectId], code: i32, reason: &str) -> Result<u64> {
        let set = |with_reason: bool| {
            let mut set = doc! {task::STATUS: status::CANCELLED, task::MTIME: fleet_time::now()};
            if with_reason {
                set.insert(task::CANCEL_REASON, reason);
            }
            doc! {"$set": set, "$unset": release_holds(&[task::LEASE_UNTIL, task::WAITING_ON])}
        };
        let all = self
            .collection(TASKS)
            .update_many(doc! {task::ID: {"$in": ids}, task::STATUS: code}, set(true))
            .await;
        match all {
            Ok(r) => return Ok(r.modified_count),
            Err(e) if !crate::driver_error::is_document_too_large(&e) => {
                return Err(Error::mongo("cancelling a graph's or batch's tasks", e))
            }
            // Some may have been written before the one too large: one by one from here.
            Err(_) => {}
        }
        let mut n = self
            .collection(TASKS)
            .count_documents(doc! {
                task::ID: {"$in": ids}, task::STATUS: status::CANCELLED, task::CANCEL_REASON: reason,
            })
            .await
            .map_err(|e| Error::mongo("counting a graph's or batch's cancelled tasks", e))?;
        for id in ids {
            let filter = doc! {task::ID: id, task::STATUS: code};
            let r = match self
                .collection(TASKS)
                .update_one(filter.clone(), set(true))
                .await
            {
                Err(e) if crate::driver_error::is_document_too_large(&e) => {
                    tracing::warn!(task = %id, "cancelled a task without its reason: its document is too large to take one");
                    self.collection(TASKS).update_one(filter, set(false)).await
                }
                other => other,
            };
            n += r
                .map_err(|e| Error::mongo("cancelling a graph's or batch's tasks", e))?
                .modified_count;
        }
        Ok(n)
    }

    /// A batch's outcome, as its callback's params carry it: `{id, size, succeeded, failed,
    /// cancelled, other}` (terminated and orphaned members count as failed).
    pub(crate) async fn batch_outcome(&self, batch: ObjectId) -> Result<Document> {
        let counts = self.member_counts(batch).await?;
        let n = |k: &str| counts.get(k).copied().unwrap_or(0) as i64;
        let size: i64 = counts.values().sum::<u64>() as i64;
        Ok(doc! {
            "id": batch, "size": size, "succeeded": n("succeeded"),
            "failed": n("failed") + n("terminated") + n("orphaned"),
            "cancelled": n("cancelled"),
            "other": size - n("succeeded") - n("failed") - n("terminated") - n("orphaned") - n("cancelled"),
        })
    }
}
