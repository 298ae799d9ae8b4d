//! What claims share: which tasks are claimable, in which order, reading them past what a
//! queue's flow limits hold, and giving a claim back.

use crate::ClaimStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::{Candidates, StatusGroup, Store};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::{status, QueueSort};

/// What a limited queue's claims leave out now, as the claimer's view of its limits has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exclusions {
    /// The rate limit's partition path, and the partitions whose window is full.
    pub full_partitions: Option<(String, Vec<Bson>)>,
    /// The concurrency key's path, and the keys at their max. A task waiting for its retry
    /// holds its key's slot: it is the one to run, and is never left out.
    pub full_keys: Option<(String, Vec<Bson>)>,
}

impl Exclusions {
    pub fn is_empty(&self) -> bool {
        self.full_partitions.is_none() && self.full_keys.is_none()
    }

    /// The filter term a claim read matches besides the queue's claimable tasks.
    fn term(&self) -> Document {
        let mut all = Vec::new();
        if let Some((path, full)) = &self.full_partitions {
            all.push(doc! {path: {"$nin": full}});
        }
        if let Some((key, full)) = &self.full_keys {
            all.push(doc! {"$or": [
                {key: {"$nin": full}},
                {task::CONCURRENCY_SLOT: {"$exists": true}},
            ]});
        }
        doc! {"$and": all}
    }
}

impl ClaimStore<'_> {
    /// Reads up to `limit` claimable tasks of `queue` but those `left_out` (what a queue's
    /// flow limits leave out now), in the queue's claim order, from its head: no window,
    /// since what is left out changes from one read to the next.
    pub async fn claim_candidates_matching(
        self,
        queue: ObjectId,
        sort: QueueSort,
        limit: usize,
        left_out: &Exclusions,
    ) -> Result<Candidates> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let also = left_out.term();
        self.read_claim_bands(queue, sort, limit, Some(&also)).await
    }

    /// Puts a task claimed by `claim_picks` back in the queue before its runner started, as
    /// it was: no slot, lease or `attempt`, and `attempts` one less, or gone when the claim
    /// was its first (`claimed` is the document the claim returned), so a Perl node that
    /// claims it next finds it as it would have. Conditional on the attempt, so it never
    /// undoes a later claim.
    pub async fn give_back_attempt(
        self,
        id: ObjectId,
        attempt: ObjectId,
        claimed: &Document,
    ) -> Result<bool> {
        let first = crate::count_value(claimed.get(task::ATTEMPTS)) <= 1;
        let mut unset = release_holds(&[task::LEASE_UNTIL, task::ATTEMPT]);
        let mut update = doc! {
            "$set": {task::NODE: Bson::Null, task::STATUS: status::QUEUED, task::MTIME: fleet_time::now()},
        };
        if first {
            unset.insert(task::ATTEMPTS, "");
        } else {
            update.insert("$inc", doc! {task::ATTEMPTS: -1});
        }
        update.insert("$unset", unset);
        self.update_one_counted(
            doc! {task::ID: id, task::ATTEMPT: attempt, task::STATUS: status::RUNNING},
            update,
            Some(StatusGroup::Queued),
        )
        .await
        .map_err(|e| Error::mongo(format!("giving back task {id}"), e))
    }

    /// Fails a queued task no runner can be handed — its document cannot be decoded, or the
    /// server refuses to claim it — with the reason in its stderr, and reports it skipped
    /// (logged once, counted). False when it is no longer queued, or when the server refuses
    /// this write too (a value it cannot update): the caller then leaves the task alone.
    pub async fn fail_unrunnable_task(
        self,
        id: ObjectId,
        node: &str,
        reason: crate::SkipReason,
        why: &str,
    ) -> Result<bool> {
        self.state.skips.skipped(TASKS, &id.to_hex(), reason, why);
        let update = doc! {
            "$set": {
                task::STATUS: status::FAILED,
                task::NODE: node,
                task::STDERR: format!("disbatch: this task cannot be run: {why}"),
                task::MTIME: fleet_time::now(),
                task::COMPLETE: true,
            },
            "$unset": release_holds(&[task::LEASE_UNTIL]),
        };
        let filter = doc! {task::ID: id, task::STATUS: status::QUEUED};
        match self
            .update_one_counted(filter, update, Some(StatusGroup::Failed))
            .await
        {
            Ok(done) => Ok(done),
            Err(e) if crate::driver_error::refusal(&e).is_some() => Ok(false),
            Err(e) => Err(Error::mongo(format!("failing task {id}"), e)),
        }
    }
}

impl Store {
    /// Reads up to `limit` claimable tasks of `queue` in its claim order, band after band
    /// (`claim_reads`), each read matching `also` as well when given.
    pub(crate) async fn read_claim_bands(
        &self,
        queue: ObjectId,
        sort: QueueSort,
        limit: i64,
        also: Option<&Document>,
    ) -> Result<Candidates> {
        let reads = claim_reads(sort).unwrap_or_else(|| vec![(doc! {}, doc! {task::ID: 1})]);
        let now = fleet_time::now();
        let mut found = Candidates::default();
        for (extra, order) in reads {
            let left = limit - (found.tasks.len() + found.unreadable.len()) as i64;
            if left <= 0 {
                break;
            }
            let mut filter = claimable(queue, now);
            match also {
                None => filter.extend(extra),
                Some(also) => {
                    // Both may name the same field (`$or`, a status): kept apart in `$and`.
                    let mut and = match filter.remove("$and") {
                        Some(Bson::Array(a)) => a,
                        _ => Vec::new(),
                    };
                    and.push(Bson::Document(extra));
                    and.push(Bson::Document(also.clone()));
                    filter.insert("$and", and);
                }
            }
            let read = self.read_tasks(filter, order, left).await?;
            found.tasks.extend(read.candidates.tasks);
            found.unreadable.extend(read.candidates.unreadable);
        }
        Ok(found)
    }
}

/// The reads, in turn, that give a queue's claims in its `sort` order: each an extra filter
/// with its order; None leaves the order to the server. A unit without a priority (chained,
/// continuous and hand-inserted ones have none) ranks as 0, as in Coordinate; sorting on the
/// field alone would put it below every negative priority, so the priority order is read in
/// three bands — above 0, none or 0, below 0 — each one an indexable sort.
pub(crate) fn claim_reads(sort: QueueSort) -> Option<Vec<(Document, Document)>> {
    let by_priority = || doc! {task::PRIORITY: -1, task::KEY: 1, task::ID: 1};
    match sort {
        QueueSort::Fifo => Some(vec![(Document::new(), doc! {task::ID: 1})]),
        QueueSort::Lifo => Some(vec![(Document::new(), doc! {task::ID: -1})]),
        QueueSort::Priority => Some(vec![
            (doc! {task::PRIORITY: {"$gt": 0}}, by_priority()),
            (
                // Missing, null, 0, and anything that is no number (comparisons match
                // numbers only): all rank as 0.
                doc! {"$nor": [{task::PRIORITY: {"$gt": 0}}, {task::PRIORITY: {"$lt": 0}}]},
                doc! {task::KEY: 1, task::ID: 1},
            ),
            (doc! {task::PRIORITY: {"$lt": 0}}, by_priority()),
        ]),
        QueueSort::Default => None,
    }
}

/// An `$unset` of what a claim holds, its queue slot and its key slot, and of `more`: a task
/// that stops running (ends, is cancelled, given back or orphaned) lets go of both at once, so
/// no path can release one and keep the other.
pub(crate) fn release_holds(more: &[&str]) -> Document {
    let mut unset = doc! {task::SLOT: "", task::CONCURRENCY_KEY: "", task::CONCURRENCY_SLOT: ""};
    for field in more {
        unset.insert(*field, "");
    }
    unset
}

/// Types that are no number: an `attempts` of one of them is not a sane count.
const NOT_NUMBERS: [&str; 9] = [
    "string",
    "object",
    "array",
    "binData",
    "objectId",
    "bool",
    "date",
    "timestamp",
    "regex",
];
/// Types that are no date: a `not_before` of one of them never comes.
const NOT_DATES: [&str; 12] = [
    "double",
    "string",
    "object",
    "array",
    "binData",
    "objectId",
    "bool",
    "int",
    "long",
    "decimal",
    "timestamp",
    "regex",
];

/// The queued tasks of `queue` a node may claim now. `node: -1` marked unclaimed tasks in
/// Disbatch 3; 4.103 still claims them. A delayed task (Coordinate's not_before) waits; a
/// missing or null `not_before` does not. Documents a runner could not be handed or the claim
/// could not count (an `_id` that is not an ObjectId, an `attempts` that is not a sane number)
/// are left queued rather than claimed and wedged.
///
/// Shaped for planners that read filters literally: `queue` first (SecantusDB takes the index
/// its first field leads: with `node` first it read the `{node, status, queue}` entries of
/// every ended task, 101 ms beside 100 000 of them), and no `$or` (each made SecantusDB read
/// the whole collection: 27 ms at 100 000 tasks, where this reads in 0.3 ms).
pub(crate) fn claimable(queue: ObjectId, now: DateTime) -> Document {
    doc! {
        task::QUEUE: queue,
        task::STATUS: status::QUEUED,
        task::NODE: {"$in": [Bson::Null, Bson::Int32(-1)]},
        task::ID: {"$type": "objectId"},
        "$and": [
            {task::NOT_BEFORE: {"$not": {"$gt": now}}},
            {task::NOT_BEFORE: {"$not": {"$type": NOT_DATES.to_vec()}}},
            {task::ATTEMPTS: {"$not": {"$gte": 1_000_000_000_i64}}},
            {task::ATTEMPTS: {"$not": {"$type": NOT_NUMBERS.to_vec()}}},
        ],
    }
}
