//! Reading graphs and batches back: their records, their tasks' counts by status group (on
//! the server), and their tasks as a stream, so no view of a big graph is built whole.

use crate::WorkflowStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::error::{Error, Result};
use crate::workflows::graphs::{StatusCounts, WorkflowSummary, WorkflowTask, BATCH_MEMBERS_SHOWN};
use crate::{StatusGroup, Store};
use disbatch_model::schema::{task, workflow, BATCHES, GRAPHS, TASKS};
use disbatch_model::workflow::MAX_WORKFLOW_TASKS;

/// A graph's tasks as they are read, in creation order.
pub type WorkflowTaskStream = BoxStream<'static, Result<WorkflowTask>>;

/// Ids a view lists of one task's `depends_on` or `waiting_on`: what creation allows, so a
/// list grown by hand costs no more than the longest a request can make.
const LISTED_IDS: i64 = MAX_WORKFLOW_TASKS as i64;

/// Tasks per batch a graph's stream reads from the server.
const STREAM_BATCH: u32 = 64;

impl WorkflowStore<'_> {
    /// A graph's record and its tasks' counts by status group, or None if there is none;
    /// its tasks come from `graph_tasks`.
    pub async fn graph_view(self, id: ObjectId) -> Result<Option<(WorkflowSummary, StatusCounts)>> {
        let Some(summary) = self.workflow_summary(GRAPHS, id).await? else {
            return Ok(None);
        };
        let counts = self.workflow_counts(task::GRAPH, id).await?;
        Ok(Some((summary, counts)))
    }

    /// A graph's tasks (at most `MAX_WORKFLOW_TASKS`), streamed from the server.
    pub async fn graph_tasks(self, id: ObjectId) -> Result<WorkflowTaskStream> {
        let cursor = self
            .raw(TASKS)
            .find(doc! {task::GRAPH: id})
            .projection(view_fields())
            .sort(doc! {task::ID: 1})
            .limit(MAX_WORKFLOW_TASKS as i64)
            // Small batches: a reader holds one, whatever the size of the graph.
            .batch_size(STREAM_BATCH)
            .await
            .map_err(|e| Error::mongo("reading a graph's tasks", e))?;
        let store = self.store.clone();
        let tasks = cursor.filter_map(move |raw| {
            let task = match raw {
                Ok(raw) => store
                    .decode_or_skip(TASKS, &raw)
                    .and_then(|d| workflow_task(&d))
                    .map(Ok),
                Err(e) => Some(Err(Error::mongo("reading a graph's tasks", e))),
            };
            std::future::ready(task)
        });
        Ok(Box::pin(tasks))
    }

    /// A batch's record, its members' counts by status group, its first members and its
    /// callback task, or None if there is none.
    pub async fn batch_view(
        self,
        id: ObjectId,
    ) -> Result<
        Option<(
            WorkflowSummary,
            StatusCounts,
            Vec<WorkflowTask>,
            Option<WorkflowTask>,
        )>,
    > {
        let Some(summary) = self.workflow_summary(BATCHES, id).await? else {
            return Ok(None);
        };
        let counts = self.member_counts(id).await?;
        let members = self
            .workflow_tasks(doc! {task::BATCH: id}, BATCH_MEMBERS_SHOWN)
            .await?;
        let callback = match summary.callback_task {
            Some(c) => self
                .workflow_tasks(doc! {task::ID: c}, 1)
                .await?
                .into_iter()
                .next(),
            None => None,
        };
        Ok(Some((summary, counts, members, callback)))
    }

    /// The newest graphs (`batches: false`) or batches, at most `limit`.
    pub async fn list_workflows(self, batches: bool, limit: i64) -> Result<Vec<WorkflowSummary>> {
        let collection = if batches { BATCHES } else { GRAPHS };
        let mut cursor = self
            .raw(collection)
            .find(doc! {})
            .sort(doc! {workflow::ID: -1})
            .limit(limit)
            .await
            .map_err(|e| Error::mongo(format!("listing {collection}"), e))?;
        let mut out = Vec::new();
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(format!("listing {collection}"), e))?
        {
            if let Some(d) = self.decode_or_skip(collection, &raw) {
                out.extend(summary_of(&d));
            }
        }
        Ok(out)
    }
}

impl Store {
    pub(crate) async fn member_counts(&self, batch: ObjectId) -> Result<StatusCounts> {
        self.workflow_counts(task::BATCH, batch).await
    }

    /// Counts by status group of the tasks whose `field` is `id`, grouped on the server.
    async fn workflow_counts(&self, field: &str, id: ObjectId) -> Result<StatusCounts> {
        let pipeline = vec![
            doc! {"$match": {field: id}},
            doc! {"$group": {"_id": format!("${}", task::STATUS), "n": {"$sum": 1}}},
        ];
        let what = || format!("counting the tasks of {field} {id}");
        let mut cursor = self
            .raw(TASKS)
            .aggregate(pipeline)
            .await
            .map_err(|e| Error::mongo(what(), e))?;
        let mut counts = StatusCounts::new();
        while let Some(d) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(what(), e))?
        {
            let group = StatusGroup::of(d.get("_id"));
            *counts.entry(group.as_str()).or_default() += crate::count_value(d.get("n"));
        }
        Ok(counts)
    }

    pub(crate) async fn workflow_summary(
        &self,
        collection: &'static str,
        id: ObjectId,
    ) -> Result<Option<WorkflowSummary>> {
        let found = self
            .raw(collection)
            .find_one(doc! {workflow::ID: id})
            .await
            .map_err(|e| Error::mongo(format!("reading {collection} {id}"), e))?;
        Ok(self
            .decode_one(collection, found)?
            .and_then(|d| summary_of(&d)))
    }

    /// The first `limit` tasks `filter` names, in creation order.
    pub(crate) async fn workflow_tasks(
        &self,
        filter: Document,
        limit: i64,
    ) -> Result<Vec<WorkflowTask>> {
        let mut cursor = self
            .raw(TASKS)
            .find(filter)
            .projection(view_fields())
            .sort(doc! {task::ID: 1})
            .limit(limit)
            .await
            .map_err(|e| Error::mongo("reading a graph's or batch's tasks", e))?;
        let mut out = Vec::new();
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo("reading a graph's or batch's tasks", e))?
        {
            if let Some(t) = self
                .decode_or_skip(TASKS, &raw)
                .and_then(|d| workflow_task(&d))
            {
                out.push(t);
            }
        }
        Ok(out)
    }
}

/// What a view reads of a task: its lists cut at `LISTED_IDS`.
fn view_fields() -> Document {
    doc! {
        task::ID: 1, task::QUEUE: 1, task::STATUS: 1, task::GRAPH_NAME: 1,
        task::DEPENDS_ON: {"$slice": LISTED_IDS}, task::WAITING_ON: {"$slice": LISTED_IDS},
        task::CANCEL_REASON: 1,
    }
}

fn workflow_task(d: &Document) -> Option<WorkflowTask> {
    let ids = |field: &str| -> Vec<ObjectId> {
        d.get_array(field)
            .map(|a| a.iter().filter_map(Bson::as_object_id).collect())
            .unwrap_or_default()
    };
    Some(WorkflowTask {
        id: d.get_object_id(task::ID).ok()?,
        queue: d.get_object_id(task::QUEUE).ok(),
        name: d.get_str(task::GRAPH_NAME).ok().map(str::to_string),
        status: d.get(task::STATUS).cloned(),
        depends_on: ids(task::DEPENDS_ON),
        waiting_on: ids(task::WAITING_ON),
        cancel_reason: d.get_str(task::CANCEL_REASON).ok().map(str::to_string),
    })
}

pub(crate) fn summary_of(d: &Document) -> Option<WorkflowSummary> {
    Some(WorkflowSummary {
        id: d.get_object_id(workflow::ID).ok()?,
        ctime: d.get_datetime(workflow::CTIME).ok().copied(),
        size: crate::count_value(d.get(workflow::SIZE)),
        callback_task: d.get_object_id(workflow::CALLBACK_TASK).ok(),
        cancelled: d.get_datetime(workflow::CANCELLED).ok().copied(),
        done: d.get_datetime(workflow::DONE).ok().copied(),
    })
}
