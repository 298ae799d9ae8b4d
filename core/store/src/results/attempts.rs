//! Attempt records: one per run of a task, written when it starts and when it ends.

use crate::ResultStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::conn::decode::DocumentStream;
use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::fleet_time;
use disbatch_model::schema::{attempt, ATTEMPTS};
use disbatch_model::task::{AttemptRecord, Outcome, ResultOutput, StoredOutput};

/// Attempt records per batch of a listing: the fields listed are small, but a hand-edited
/// record's may not be.
const ATTEMPTS_BATCH: u32 = 100;

/// One attempt as `newest_attempt` reads it.
struct Newest {
    id: ObjectId,
    start: Option<DateTime>,
    output: Option<ResultOutput>,
}

impl ResultStore<'_> {
    /// Writes an ended attempt's record in one round trip. Returns false when a record already
    /// exists: recovery closed the attempt as lost, so its result will not count either.
    pub async fn insert_attempt(self, r: &AttemptRecord) -> Result<bool> {
        let record = attempt_document(r);
        match self.collection(ATTEMPTS).insert_one(record).await {
            Ok(_) => Ok(true),
            Err(e) if crate::driver_error::is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(Error::mongo(
                format!("recording attempt {} of task {}", r.id, r.task),
                e,
            )),
        }
    }

    /// Changes an attempt's outcome from `from` to `to`; a record recovery marked `lost`
    /// stays lost.
    pub async fn change_attempt_outcome(
        self,
        id: ObjectId,
        from: Outcome,
        to: Outcome,
    ) -> Result<()> {
        self.collection(ATTEMPTS)
            .update_one(
                doc! {attempt::ID: id, attempt::OUTCOME: from.as_str()},
                doc! {"$set": {attempt::OUTCOME: to.as_str()}},
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo(format!("updating attempt {id}"), e))
    }

    /// The outcome an ended attempt's record carries (None for one no runner writes), and
    /// whether its task was discarded with it; None while it has no record (the record is
    /// written when the attempt ends). One read by `_id`, of those fields only.
    pub async fn attempt_outcome(self, id: ObjectId) -> Result<Option<(Option<Outcome>, bool)>> {
        let found = self
            .collection(ATTEMPTS)
            .find_one(doc! {attempt::ID: id})
            .projection(doc! {attempt::OUTCOME: 1, attempt::TASK_DISCARDED: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading attempt {id}"), e))?;
        Ok(found.and_then(|d| {
            let outcome = Outcome::parse(d.get_str(attempt::OUTCOME).ok()?);
            Some((
                outcome,
                d.get_bool(attempt::TASK_DISCARDED).unwrap_or(false),
            ))
        }))
    }

    /// Of `ids`, the attempts closed as lost: their tasks were recovered (their lease passed,
    /// their node was taken for dead), whatever their runners still think.
    pub async fn lost_attempts(self, ids: &[ObjectId]) -> Result<Vec<ObjectId>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let cursor = self
            .raw(ATTEMPTS)
            .find(doc! {attempt::ID: {"$in": ids}, attempt::OUTCOME: "lost"})
            .projection(doc! {attempt::ID: 1})
            .await
            .map_err(|e| Error::mongo("reading which attempts were lost", e))?;
        let found = self
            .read_all(ATTEMPTS, cursor, "reading which attempts were lost")
            .await?;
        Ok(found
            .iter()
            .filter_map(|d| d.get_object_id(attempt::ID).ok())
            .collect())
    }

    /// A task's newest `limit` attempts, oldest first, with only the `fields` asked for (an
    /// attempt's plugin result may be 16 MiB: a listing must not read it), one at a time as
    /// the caller takes them; and whether older ones were left out. Counted first (index
    /// `{task, start}`), so the answer's header can say so before the first record is sent.
    pub async fn recent_attempts(
        self,
        task: ObjectId,
        limit: usize,
        fields: &[&str],
    ) -> Result<(DocumentStream, bool)> {
        let context = format!("listing attempts of task {task}");
        let filter = doc! {attempt::TASK: task};
        let total = self
            .collection(ATTEMPTS)
            .count_documents(filter.clone())
            .await
            .map_err(|e| Error::mongo(context.clone(), e))?;
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let older = total.saturating_sub(limit);
        let projection: Document = fields
            .iter()
            .map(|f| (f.to_string(), Bson::Int32(1)))
            .collect();
        let cursor = self
            .raw(ATTEMPTS)
            .find(filter)
            .sort(doc! {attempt::START: 1, attempt::ID: 1})
            .skip(older)
            .limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .projection(projection)
            .batch_size(ATTEMPTS_BATCH)
            .await
            .map_err(|e| Error::mongo(context.clone(), e))?;
        Ok((self.decoded_stream(ATTEMPTS, cursor, context), older > 0))
    }

    /// The `output` of the task's newest attempt that wrote one, with that attempt's id.
    /// Only the output and the id are read: one read for outputs kept inline and one for
    /// those kept in GridFS, each a range of the `{task, start}` index (an `$or` of both
    /// may be answered by reading every attempt).
    pub async fn latest_output(self, task: ObjectId) -> Result<Option<(ObjectId, ResultOutput)>> {
        let (inline, file) = futures::try_join!(
            self.newest_attempt(
                task,
                doc! {attempt::TASK: task, attempt::RESULT_OUTPUT: {"$exists": true}},
            ),
            self.newest_attempt(
                task,
                doc! {attempt::TASK: task, attempt::OUTPUT_FILE: {"$exists": true}},
            ),
        )?;
        let newest = match (inline, file) {
            (Some(a), Some(b)) => Some(if (b.start, b.id) > (a.start, a.id) {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        };
        Ok(newest.and_then(|n| n.output.map(|o| (n.id, o))))
    }

    /// The task's newest succeeded attempt: its id and its `output`, None when it wrote none.
    pub async fn last_success_output(
        self,
        task: ObjectId,
    ) -> Result<Option<(ObjectId, Option<ResultOutput>)>> {
        let found = self
            .newest_attempt(
                task,
                doc! {attempt::TASK: task, attempt::OUTCOME: Outcome::Succeeded.as_str()},
            )
            .await?;
        Ok(found.map(|n| (n.id, n.output)))
    }

    /// The `output` of attempt `id` of `task`: None when the task has no such attempt,
    /// Some(None) when that attempt wrote none.
    pub async fn attempt_output(
        self,
        task: ObjectId,
        id: ObjectId,
    ) -> Result<Option<Option<ResultOutput>>> {
        let found = self
            .newest_attempt(task, doc! {attempt::ID: id, attempt::TASK: task})
            .await?;
        Ok(found.map(|n| n.output))
    }
}

impl Store {
    /// The newest attempt matching `filter` (index `{task, start}`): its id, start and
    /// result's `output`, the only fields read.
    async fn newest_attempt(&self, task: ObjectId, filter: Document) -> Result<Option<Newest>> {
        let found = self
            .collection(ATTEMPTS)
            .find_one(filter)
            .sort(doc! {attempt::START: -1, attempt::ID: -1})
            .projection(doc! {
                attempt::ID: 1, attempt::START: 1, attempt::RESULT_OUTPUT: 1,
                attempt::OUTPUT_FILE: 1, attempt::OUTPUT_BYTES: 1,
            })
            .await
            .map_err(|e| Error::mongo(format!("reading the result of task {task}"), e))?;
        let Some(d) = found else {
            return Ok(None);
        };
        let id = d
            .get_object_id(attempt::ID)
            .map_err(|_| Error::BadDocument {
                collection: ATTEMPTS,
                id: format!("{:?}", d.get(attempt::ID)),
                message: "its _id is not an ObjectId".into(),
            })?;
        Ok(Some(Newest {
            id,
            start: d.get_datetime(attempt::START).ok().copied(),
            output: result_output(&d),
        }))
    }
}

/// The result file's `output` in an attempt record, if it wrote one: inline, or the GridFS
/// file it was moved to.
pub fn result_output(record: &Document) -> Option<ResultOutput> {
    if let Ok(file) = record.get_object_id(attempt::OUTPUT_FILE) {
        let bytes = match record.get(attempt::OUTPUT_BYTES) {
            Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
            Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        };
        return Some(ResultOutput::File(StoredOutput { file, bytes }));
    }
    record
        .get_document(attempt::RESULT)
        .ok()
        .and_then(|r| r.get(output_key()))
        .cloned()
        .map(ResultOutput::Inline)
}

/// `output`, the last part of `attempt::RESULT_OUTPUT`.
fn output_key() -> &'static str {
    attempt::RESULT_OUTPUT
        .rsplit('.')
        .next()
        .unwrap_or(attempt::RESULT_OUTPUT)
}

/// An ended attempt's record as stored.
pub(crate) fn attempt_document(r: &AttemptRecord) -> Document {
    let opt = |v: Option<i32>| v.map_or(Bson::Null, Bson::Int32);
    let mut d = doc! {
        attempt::ID: r.id, attempt::TASK: r.task,
        attempt::QUEUE: r.queue.map_or(Bson::Null, Bson::ObjectId),
        attempt::NODE: &r.node, attempt::PID: r.pid as i64, attempt::START: r.start,
        attempt::END: fleet_time::now(), attempt::OUTCOME: r.end.outcome,
        attempt::STATUS: opt(r.end.status), attempt::EXIT_CODE: opt(r.end.exit_code),
        attempt::SIGNAL: opt(r.end.signal),
        attempt::RESULT: r.end.result.clone().map_or(Bson::Null, Bson::Document),
        attempt::REASON: r.end.reason.clone().map_or(Bson::Null, Bson::String),
    };
    if r.end.task_discarded {
        d.insert(attempt::TASK_DISCARDED, true);
    }
    if let Some(o) = r.end.output_file {
        d.insert(attempt::OUTPUT_FILE, o.file);
        d.insert(
            attempt::OUTPUT_BYTES,
            i64::try_from(o.bytes).unwrap_or(i64::MAX),
        );
    }
    d
}
