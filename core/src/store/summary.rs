//! Counts per queue in Coordinate's unit states (available, delayed, pending, finished, failed).

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};

use super::schema::{task, TASKS};
use super::Store;
use crate::error::{Error, Result};
use crate::model::status;

/// One queue's units by state. `other` holds Disbatch's orphaned, cancelled, blocked and
/// terminated tasks, which Coordinate has no name for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    pub available: u64,
    pub delayed: u64,
    pub pending: u64,
    pub finished: u64,
    pub failed: u64,
    pub other: u64,
}

impl Store {
    /// One aggregation over the tasks (it reads every task; meant for operators, not loops).
    pub async fn summary(&self) -> Result<HashMap<ObjectId, StateCounts>> {
        let now = DateTime::now();
        let st = format!("${}", task::STATUS);
        let nb = format!("${}", task::NOT_BEFORE);
        let count_if = |cond: bson::Document| doc! {"$sum": {"$cond": [cond, 1, 0]}};
        let queued = doc! {"$eq": [&st, status::QUEUED]};
        let delayed = doc! {"$gt": [{"$ifNull": [&nb, Bson::Null]}, now]};
        let pipeline = vec![doc! {"$group": {
            "_id": format!("${}", task::QUEUE),
            "available": count_if(doc! {"$and": [queued.clone(), {"$not": [delayed.clone()]}]}),
            "delayed": count_if(doc! {"$and": [queued, delayed]}),
            "pending": count_if(doc! {"$in": [&st, [status::CLAIMED, status::RUNNING]]}),
            "finished": count_if(doc! {"$eq": [&st, status::SUCCEEDED]}),
            "failed": count_if(doc! {"$gte": [&st, status::FAILED]}),
            "total": {"$sum": 1},
        }}];
        let cursor = self
            .collection(TASKS)
            .aggregate(pipeline)
            .with_type::<bson::RawDocumentBuf>()
            .await
            .map_err(|e| Error::mongo("summarising tasks", e))?;
        let mut out = HashMap::new();
        for d in self.read_all(TASKS, cursor, "summarising tasks").await? {
            let Ok(queue) = d.get_object_id("_id") else {
                continue;
            };
            let n = |k: &str| super::count_value(d.get(k));
            let c = StateCounts {
                available: n("available"),
                delayed: n("delayed"),
                pending: n("pending"),
                finished: n("finished"),
                failed: n("failed"),
                other: 0,
            };
            let known = c.available + c.delayed + c.pending + c.finished + c.failed;
            out.insert(
                queue,
                StateCounts {
                    other: n("total").saturating_sub(known),
                    ..c
                },
            );
        }
        Ok(out)
    }
}
