//! Finding tasks: status words, time ranges and the fleet-wide failures listing.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use super::Store;
use crate::error::{Error, Result};
use disbatch_model::schema::{attempt, queue, task, ATTEMPTS, TASKS};
use disbatch_model::status;

/// The most failures one listing returns.
pub const MAX_FAILURES: i64 = 1000;
/// The failures listed when no limit is given.
pub const DEFAULT_FAILURES: i64 = 50;
/// The largest `limit` (the new syntax's, not Disbatch's `.limit`) a bounded search takes.
pub const MAX_SCAN_LIMIT: i64 = 1000;

/// A status group a search may name as a word instead of codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWord {
    /// Every status ≥ 2: Disbatch's failed (2) and a plugin's own failure codes.
    Failed,
    /// Failed tasks no retry will follow (they carry `discarded_at`).
    Discarded,
    /// Queued tasks waiting out a retry's backoff: they ran before (`attempt`) and their
    /// `not_before` is ahead, as `Store::retrying_counts` counts them.
    Retrying,
    Code(i32),
}

impl StatusWord {
    pub const WORDS: [&'static str; 11] = [
        "queued",
        "retrying",
        "claimed",
        "running",
        "succeeded",
        "failed",
        "discarded",
        "terminated",
        "blocked",
        "cancelled",
        "orphaned",
    ];

    pub fn parse(word: &str) -> Option<StatusWord> {
        Some(match word {
            "failed" => StatusWord::Failed,
            "discarded" => StatusWord::Discarded,
            "retrying" => StatusWord::Retrying,
            "queued" => StatusWord::Code(status::QUEUED),
            "claimed" => StatusWord::Code(status::CLAIMED),
            "running" => StatusWord::Code(status::RUNNING),
            "succeeded" => StatusWord::Code(status::SUCCEEDED),
            "terminated" => StatusWord::Code(status::TERMINATED),
            "blocked" => StatusWord::Code(status::BLOCKED),
            "cancelled" => StatusWord::Code(status::CANCELLED),
            "orphaned" => StatusWord::Code(status::ORPHANED),
            _ => return None,
        })
    }

    /// The filter term. Discarded tasks are failed ones too, so both words are served by the
    /// failures index (`mtime_-1_failed`, `conn/indexes.rs`) without a queue.
    pub fn term(self) -> Document {
        let failed = doc! {task::STATUS: {"$gte": status::FAILED}};
        match self {
            StatusWord::Failed => failed,
            StatusWord::Discarded => {
                doc! {task::STATUS: {"$gte": status::FAILED}, task::DISCARDED_AT: {"$exists": true}}
            }
            StatusWord::Retrying => doc! {
                task::STATUS: status::QUEUED,
                task::NOT_BEFORE: {"$gt": disbatch_model::fleet_time::now()},
                task::ATTEMPT: {"$exists": true},
            },
            StatusWord::Code(c) => doc! {task::STATUS: c},
        }
    }
}

/// A range on `mtime`, the last change of a task (its end, for an ended one).
pub fn mtime_range(since: Option<DateTime>, until: Option<DateTime>) -> Option<Document> {
    let mut range = Document::new();
    if let Some(s) = since {
        range.insert("$gte", s);
    }
    if let Some(u) = until {
        range.insert("$lt", u);
    }
    (!range.is_empty()).then(|| doc! {task::MTIME: range})
}

/// One row of the failures listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub task: ObjectId,
    pub queue: Option<ObjectId>,
    /// The queue's name; `None` for a task whose queue is gone.
    pub queue_name: Option<String>,
    pub status: Bson,
    pub mtime: Option<DateTime>,
    pub discarded_at: Option<DateTime>,
    pub params: Option<Bson>,
    /// The last attempt's reason and end, when an attempt was recorded.
    pub reason: Option<String>,
    pub attempt_end: Option<DateTime>,
    pub attempts: Option<i64>,
}

impl Store {
    /// The newest failed tasks (status ≥ 2, discarded ones among them), newest change first,
    /// read through the failures index: at most `limit` index entries past the filter.
    pub async fn failures(
        &self,
        queue_filter: Option<ObjectId>,
        limit: i64,
    ) -> Result<Vec<Failure>> {
        let limit = limit.clamp(1, MAX_FAILURES);
        let mut filter = StatusWord::Failed.term();
        if let Some(q) = queue_filter {
            filter.insert(task::QUEUE, q);
        }
        let cursor = self
            .raw(TASKS)
            .find(filter)
            .sort(doc! {task::MTIME: -1})
            .projection(doc! {
                task::QUEUE: 1, task::STATUS: 1, task::MTIME: 1, task::DISCARDED_AT: 1,
                task::PARAMS: 1, task::ATTEMPTS: 1,
            })
            .limit(limit)
            .await
            .map_err(|e| Error::mongo("listing failures", e))?;
        let tasks = self.read_all(TASKS, cursor, "listing failures").await?;
        let names: HashMap<ObjectId, String> = self
            .queues()
            .queue_documents()
            .await?
            .iter()
            .filter_map(|q| {
                Some((
                    q.get_object_id(queue::ID).ok()?,
                    q.get_str(queue::NAME).ok()?.to_string(),
                ))
            })
            .collect();
        let ids: Vec<ObjectId> = tasks
            .iter()
            .filter_map(|t| t.get_object_id(task::ID).ok())
            .collect();
        let last = self.last_attempts(&ids).await?;
        Ok(tasks
            .iter()
            .filter_map(|t| {
                let id = t.get_object_id(task::ID).ok()?;
                let queue = t.get_object_id(task::QUEUE).ok();
                let rec = last.get(&id);
                Some(Failure {
                    task: id,
                    queue,
                    queue_name: queue.and_then(|q| names.get(&q).cloned()),
                    status: t.get(task::STATUS).cloned().unwrap_or(Bson::Null),
                    mtime: t.get_datetime(task::MTIME).ok().copied(),
                    discarded_at: t.get_datetime(task::DISCARDED_AT).ok().copied(),
                    params: t.get(task::PARAMS).cloned(),
                    reason: rec.and_then(|r| r.get_str(attempt::REASON).ok().map(str::to_string)),
                    attempt_end: rec.and_then(|r| r.get_datetime(attempt::END).ok().copied()),
                    attempts: match t.get(task::ATTEMPTS) {
                        Some(Bson::Int32(n)) => Some(i64::from(*n)),
                        Some(Bson::Int64(n)) => Some(*n),
                        _ => None,
                    },
                })
            })
            .collect())
    }

    /// Each task's newest attempt record (by start), read through `{task, start}`.
    async fn last_attempts(&self, ids: &[ObjectId]) -> Result<HashMap<ObjectId, Document>> {
        let mut last: HashMap<ObjectId, Document> = HashMap::new();
        if ids.is_empty() {
            return Ok(last);
        }
        let cursor = self
            .raw(ATTEMPTS)
            .find(doc! {attempt::TASK: {"$in": ids}})
            .projection(
                doc! {attempt::TASK: 1, attempt::START: 1, attempt::END: 1, attempt::REASON: 1},
            )
            .await
            .map_err(|e| Error::mongo("reading failures' attempts", e))?;
        for rec in self
            .read_all(ATTEMPTS, cursor, "reading failures' attempts")
            .await?
        {
            let Ok(task) = rec.get_object_id(attempt::TASK) else {
                continue;
            };
            let start = |d: &Document| d.get_datetime(attempt::START).ok().copied();
            let newer = match last.get(&task) {
                Some(old) => start(&rec) >= start(old),
                None => true,
            };
            if newer {
                last.insert(task, rec);
            }
        }
        Ok(last)
    }
}
