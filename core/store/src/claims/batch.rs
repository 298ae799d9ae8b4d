//! Batched claims: a queue's next claimable tasks read in its claim order, then claimed by
//! `_id` together (one `bulkWrite`), each as a running attempt holding its own queue slot.

use crate::ClaimStore;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use futures::TryStreamExt;
use mongodb::options::{ReturnDocument, UpdateModifications};

use crate::claims::candidates::claimable;
use crate::error::{Error, Result};
use crate::{Moved, StatusGroup, Store, BULK_WRITE_MISSING};
use disbatch_model::fleet_time;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::task::ClaimedTask;
use disbatch_model::{status, QueueSort};

/// How many claimable tasks ahead a window reaches per node claiming from the queue: read
/// whole, with the head. Larger windows mean fewer head reads (which cost a server like
/// SecantusDB the whole backlog), smaller ones cheaper reads within the window.
const WINDOW_SIZE: i64 = 128;
/// Windows grow with the number of claimers up to this many times `WINDOW_SIZE`.
const MAX_WINDOWS: usize = 8;
/// A window is read afresh at least this often, so a task that became claimable behind it
/// (a delayed retry that came due, a task given back) waits at most this long.
const WINDOW_MAX_AGE: Duration = Duration::from_secs(5);

/// Where a node reads a queue claimed in `_id` order: the `_id` range of the claimable tasks
/// it last found at the head. A server may charge a query for every pending task it matches
/// (SecantusDB does, index or not), so reading only the window keeps a claim's cost flat
/// however deep the queue is; the head is read again once the window is drained.
#[derive(Debug, Clone, Default)]
pub struct ClaimWindow {
    range: Option<WindowRange>,
}

#[derive(Debug, Clone, PartialEq)]
struct WindowRange {
    first: ObjectId,
    /// None when the head read reached the end of the queue: tasks queued later belong in.
    last: Option<ObjectId>,
    /// Whether Disbatch 3's unclaimed marker (`node: -1`) was seen inside the range.
    legacy_nodes: bool,
    read_at: Instant,
}

impl ClaimWindow {
    /// Forgets the window: the next read starts from the queue's head.
    pub fn reset(&mut self) {
        self.range = None;
    }

    fn current(&self) -> Option<&WindowRange> {
        self.range
            .as_ref()
            .filter(|r| r.read_at.elapsed() < WINDOW_MAX_AGE)
    }
}

/// A candidate to claim, the slot it is to hold and the attempt it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub task: Document,
    pub slot: u32,
    pub attempt: ObjectId,
    /// What the queue's flow limits have the claim hold besides its slot.
    pub holds: PickHolds,
}

/// A claim's part in its queue's flow limits.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PickHolds {
    /// The task's concurrency key and the key slot to hold (unique per queue and key).
    pub key_slot: Option<(Bson, u32)>,
    /// When the rate limit granted the attempt's start (the server's time): the runner
    /// records it as the attempt's start, so the attempts' starts show the limit held.
    pub started_at: Option<DateTime>,
    /// The rate-limit partition whose window granted the start (null without partitions).
    pub partition: Option<Bson>,
    /// The grant's own time, which names it to a refund (later than `started_at` for a start
    /// granted ahead).
    pub granted_at: Option<DateTime>,
}

/// What became of one pick.
#[derive(Debug, Clone, PartialEq)]
pub enum PickOutcome {
    /// The task as it now stands: running on this node as the pick's attempt.
    Claimed(Box<ClaimedTask>),
    /// Another node claimed it first, or it changed since it was read.
    Lost,
    /// Another node holds the slot.
    SlotTaken,
    /// Another task holds the key slot (`PickHolds::key_slot`).
    KeySlotTaken,
    /// The server refused this task's claim itself (with its reason): it holds something
    /// the server cannot update, and will refuse it again.
    Refused(String),
}

/// A claim's outcome for the task document it returned: candidates are read by ObjectId
/// `_id` (`claimable`), so one without is a task changed since, not claimed.
fn claimed(doc: Document) -> PickOutcome {
    ClaimedTask::from_document(doc).map_or(PickOutcome::Lost, |t| PickOutcome::Claimed(Box::new(t)))
}

impl Pick {
    /// The picked task's id (candidates are read by ObjectId `_id`).
    pub fn task_id(&self) -> Option<ObjectId> {
        self.task.get_object_id(task::ID).ok()
    }
}

impl Candidates {
    /// Leaves out the tasks in `skip` (those found unrunnable before).
    pub fn without(mut self, skip: &std::collections::HashSet<ObjectId>) -> Candidates {
        self.tasks.retain(|t| {
            t.get_object_id(task::ID)
                .map_or(true, |id| !skip.contains(&id))
        });
        self
    }
}

/// A queue's next claimable tasks as read, and the ones among them that could not be decoded
/// (by `_id`, with the reason), which no runner could be handed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    pub tasks: Vec<Document>,
    pub unreadable: Vec<(ObjectId, String)>,
}

/// A claimable task's key for sharing work between nodes: its id's counter, which runs on
/// from one task to the next a creator makes; 0 for an id that is no ObjectId.
pub fn claim_key(task: &Document) -> u64 {
    task.get_object_id(task::ID).map_or(0, |id| {
        let b = id.bytes();
        u64::from(b[9]) << 16 | u64::from(b[10]) << 8 | u64::from(b[11])
    })
}

impl ClaimStore<'_> {
    /// Reads up to `limit` claimable tasks of `queue`, in the queue's claim order. Queues
    /// claimed in `_id` order (fifo, default) are read within `window`, which reaches as far
    /// ahead for each of the `claimers` (nodes claiming from the queue) as for one alone.
    pub async fn claim_candidates(
        self,
        queue: ObjectId,
        sort: QueueSort,
        limit: usize,
        claimers: usize,
        window: &mut ClaimWindow,
    ) -> Result<Candidates> {
        if limit == 0 {
            return Ok(Candidates::default());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        if !matches!(sort, QueueSort::Fifo | QueueSort::Default) {
            return self.read_claim_bands(queue, sort, limit, None).await;
        }
        if let Some(range) = window.current().cloned() {
            let found = self.read_in_window(queue, &range, limit).await?;
            // A window reaching the queue's end stays: tasks queued since belong in it.
            if found.read as i64 >= limit || range.last.is_none() {
                return Ok(found.candidates);
            }
        }
        // No window yet, or it is drained: read the head, which also makes the next window.
        let size = i64::try_from(claimers.clamp(1, MAX_WINDOWS))
            .map_or(WINDOW_SIZE, |n| WINDOW_SIZE * n)
            .max(limit);
        let head = self.read_head(queue, size).await?;
        window.range = window_over(&head.candidates.tasks, head.read, size);
        let mut candidates = head.candidates;
        candidates.tasks.truncate(limit as usize);
        Ok(candidates)
    }

    /// Claims each pick as a running attempt of this node with a lease of `lease`, if it is
    /// still queued as it was read. The slot's unique index refuses a claim beyond the
    /// queue's `threads`, whichever node asks. One `bulkWrite` on MongoDB 8.0+, otherwise one
    /// `findOneAndUpdate` per pick.
    pub async fn claim_picks(
        self,
        node: &str,
        lease: Duration,
        picks: &[Pick],
    ) -> Result<Vec<PickOutcome>> {
        let outcomes = self.claim_picks_uncounted(node, lease, picks).await?;
        let moves: Vec<Moved> = picks
            .iter()
            .zip(&outcomes)
            .filter(|(_, o)| matches!(o, PickOutcome::Claimed(_)))
            .filter_map(|(p, _)| {
                let queue = p.task.get_object_id(task::QUEUE).ok()?;
                Some(Moved::new(
                    queue,
                    Some(StatusGroup::Queued),
                    Some(StatusGroup::Running),
                ))
            })
            .collect();
        if !moves.is_empty() {
            self.count_moves(&moves).await;
        }
        Ok(outcomes)
    }
}

impl Store {
    async fn claim_picks_uncounted(
        &self,
        node: &str,
        lease: Duration,
        picks: &[Pick],
    ) -> Result<Vec<PickOutcome>> {
        let now = fleet_time::now();
        let deadline = crate::recovery::leases::deadline(lease);
        let writes: Vec<(Document, Document, Document)> = picks
            .iter()
            .map(|p| {
                let mut set = doc! {
                    task::NODE: node,
                    task::STATUS: status::RUNNING,
                    // A rate-limited attempt starts when its start was granted: recovery
                    // records a lost attempt as starting at its claim's `mtime`.
                    task::MTIME: p.holds.started_at.unwrap_or(now),
                    task::SLOT: p.slot as i64,
                    task::LEASE_UNTIL: deadline,
                    task::ATTEMPT: p.attempt,
                };
                if let Some((key, slot)) = &p.holds.key_slot {
                    set.insert(task::CONCURRENCY_KEY, key.clone());
                    set.insert(task::CONCURRENCY_SLOT, i64::from(*slot));
                }

                let update = doc! {"$set": set.clone(), "$inc": {task::ATTEMPTS: 1}};
                (still_as_read(&p.task), update, set)
            })
            .collect();
        if picks.len() > 1 && self.state.bulk_write.load(Ordering::Relaxed) != BULK_WRITE_MISSING {
            if let Some(outcomes) = self.claim_in_bulk_write(picks, &writes).await? {
                return Ok(outcomes);
            }
        }
        let claims = picks
            .iter()
            .zip(writes)
            .map(|(pick, (filter, update, set))| async move {
                let (filter, update) = claim_write(&pick.task, &filter, &update);
                let by_id = update.finds_by_id();
                let result = self
                    .raw(TASKS)
                    .find_one_and_update(filter, update.into_modifications())
                    .return_document(ReturnDocument::After)
                    .await;
                match result {
                    // Found by `_id`, it comes back whether or not the claim held.
                    Ok(Some(raw))
                        if by_id && raw.get_object_id(task::ATTEMPT).ok() != Some(pick.attempt) =>
                    {
                        Ok(PickOutcome::Lost)
                    }
                    Ok(Some(raw)) => Ok(match disbatch_model::text::raw_doc::from_raw(&raw) {
                        Ok(doc) => claimed(doc),
                        // Read and decoded a moment ago; keep what was read, with the claim.
                        Err(_) => claimed(claimed_document(&pick.task, &set)),
                    }),
                    Ok(None) => Ok(PickOutcome::Lost),
                    Err(e) if crate::driver_error::is_duplicate_key(&e) => {
                        Ok(duplicate_outcome(&e.to_string()))
                    }
                    Err(e) => match crate::driver_error::refusal(&e) {
                        Some(reason) => Ok(PickOutcome::Refused(reason)),
                        None => Err(Error::mongo("claiming a task", e)),
                    },
                }
            });
        futures::future::join_all(claims)
            .await
            .into_iter()
            .collect()
    }

    /// The picks' claims in one unordered `bulkWrite`; None when this server has none.
    async fn claim_in_bulk_write(
        &self,
        picks: &[Pick],
        writes: &[(Document, Document, Document)],
    ) -> Result<Option<Vec<PickOutcome>>> {
        let mut by_id = Vec::with_capacity(writes.len());
        let ops: Vec<Document> = picks
            .iter()
            .zip(writes)
            .map(|(pick, (filter, update, _))| {
                let (filter, update) = claim_write(&pick.task, filter, update);
                by_id.push(update.finds_by_id());
                let update = update.into_bson();
                doc! {"update": 0, "filter": filter, "updateMods": update, "multi": false}
            })
            .collect();
        let command = doc! {
            "bulkWrite": 1,
            "ops": ops,
            "nsInfo": [{"ns": format!("{}.{TASKS}", self.db.name())}],
            "ordered": false,
            "errorsOnly": false,
        };
        let Some(results) = self.run_bulk_write(command, "claiming tasks").await? else {
            return Ok(None);
        };
        let mut outcomes: Vec<Option<PickOutcome>> = vec![None; picks.len()];
        for r in results {
            let idx = crate::count_value(r.get("idx")) as usize;
            let (Some(pick), Some((_, _, set))) = (picks.get(idx), writes.get(idx)) else {
                continue;
            };
            let ok = crate::count_value(r.get("ok")) == 1;
            let applied = match by_id.get(idx) {
                Some(true) => r.get("nModified"),
                _ => r.get("n"),
            };
            outcomes[idx] = Some(match (ok, r.get_i32("code").unwrap_or(0)) {
                (true, _) if crate::count_value(applied) == 1 => {
                    claimed(claimed_document(&pick.task, set))
                }
                (true, _) => PickOutcome::Lost,
                (false, 11000) => duplicate_outcome(r.get_str("errmsg").unwrap_or("")),
                (false, code) if crate::driver_error::is_transient_code(code) => PickOutcome::Lost,
                (false, code) => PickOutcome::Refused(crate::driver_error::short_message(
                    r.get_str("errmsg").unwrap_or("no reason given"),
                    code,
                )),
            });
        }
        if outcomes.iter().any(Option::is_none) {
            // A reply cut short: what the missing claims did is read back by their attempts.
            let unknown: Vec<ObjectId> = picks
                .iter()
                .zip(&outcomes)
                .filter(|(_, o)| o.is_none())
                .map(|(p, _)| p.attempt)
                .collect();
            let cursor = self
                .raw(TASKS)
                .find(doc! {task::ATTEMPT: {"$in": unknown}})
                .await
                .map_err(|e| Error::mongo("reading back claimed tasks", e))?;
            let found = self
                .read_all(TASKS, cursor, "reading back claimed tasks")
                .await?;
            for (pick, outcome) in picks.iter().zip(outcomes.iter_mut()) {
                if outcome.is_none() {
                    let doc = found
                        .iter()
                        .find(|d| d.get_object_id(task::ATTEMPT).ok() == Some(pick.attempt));
                    *outcome = Some(match doc {
                        Some(d) => claimed(d.clone()),
                        None => PickOutcome::Lost,
                    });
                }
            }
        }
        Ok(Some(outcomes.into_iter().flatten().collect()))
    }

    /// The first `n` claimable tasks of `queue`, oldest first.
    async fn read_head(&self, queue: ObjectId, n: i64) -> Result<CandidateRead> {
        self.read_tasks(claimable(queue, fleet_time::now()), doc! {task::ID: 1}, n)
            .await
    }

    /// The claimable tasks of `queue` inside `range`, oldest first. The filter is
    /// `claimable`'s, shaped so a planner can bound it by `_id` (an ObjectId range instead of
    /// `$type`, and `node: null` unless the range holds Disbatch 3's `-1`).
    async fn read_in_window(
        &self,
        queue: ObjectId,
        range: &WindowRange,
        limit: i64,
    ) -> Result<CandidateRead> {
        let mut filter = claimable(queue, fleet_time::now());
        let mut ids = doc! {"$gte": range.first};
        if let Some(last) = range.last {
            ids.insert("$lte", last);
        }
        filter.insert(task::ID, ids);
        if !range.legacy_nodes {
            filter.insert(task::NODE, Bson::Null);
        }
        self.read_tasks(filter, doc! {task::ID: 1}, limit).await
    }

    /// Claimable tasks, each decoded alone: one that cannot be is set aside by `_id` (or
    /// reported and left out, without an ObjectId `_id` to name it by).
    pub(crate) async fn read_tasks(
        &self,
        filter: Document,
        order: Document,
        limit: i64,
    ) -> Result<CandidateRead> {
        let context = "reading claimable tasks";
        let mut cursor = self
            .raw(TASKS)
            .find(filter)
            .sort(order)
            .limit(limit)
            .await
            .map_err(|e| Error::mongo(context, e))?;
        let mut read = CandidateRead::default();
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(context, e))?
        {
            read.read += 1;
            match disbatch_model::text::raw_doc::from_raw(&raw) {
                Ok(d) => read.candidates.tasks.push(d),
                Err(why) => match disbatch_model::text::raw_doc::object_id(&raw) {
                    Some(id) => read.candidates.unreadable.push((id, why)),
                    None => {
                        self.decode_or_skip(TASKS, &raw);
                    }
                },
            }
        }
        Ok(read)
    }
}

/// One read of claimable tasks: what it found, and how many documents came back in all
/// (decodable or not), which is what tells whether it reached the end of the queue.
#[derive(Debug, Default)]
pub(crate) struct CandidateRead {
    pub(crate) candidates: Candidates,
    read: usize,
}

/// The window a head read of up to `asked` tasks makes: from its first task to its last, or
/// open-ended when it reached the end of the queue. None when it found nothing.
fn window_over(head: &[Document], read: usize, asked: i64) -> Option<WindowRange> {
    let ids: Vec<ObjectId> = head
        .iter()
        .filter_map(|d| d.get_object_id(task::ID).ok())
        .collect();
    let (first, last) = (ids.first()?, ids.last()?);
    Some(WindowRange {
        first: *first,
        last: (read as i64 >= asked).then_some(*last),
        legacy_nodes: head
            .iter()
            .any(|d| d.get(task::NODE) == Some(&Bson::Int32(-1))),
        read_at: Instant::now(),
    })
}

/// Which of the claim's unique holds another task has: the key slot when the server names
/// its index, otherwise the queue slot.
fn duplicate_outcome(message: &str) -> PickOutcome {
    match message.contains(task::CONCURRENCY_SLOT) {
        true => PickOutcome::KeySlotTaken,
        false => PickOutcome::SlotTaken,
    }
}

/// The claim's write, found by `_id` (`by_id.rs`) unless the task as read holds an array
/// where the claim compares (a query's equality would match it, an expression's would not).
fn claim_write(read: &Document, filter: &Document, update: &Document) -> (Document, ClaimUpdate) {
    let scalars = [task::STATUS, task::NODE, task::MTIME]
        .iter()
        .all(|f| !matches!(read.get(*f), Some(Bson::Array(_))));
    match scalars
        .then(|| crate::conn::by_id::conditional_by_id(filter, update))
        .flatten()
    {
        Some((filter, pipeline)) => (filter, ClaimUpdate::ByIdPipeline(pipeline)),
        None => (filter.clone(), ClaimUpdate::AsPlanned(update.clone())),
    }
}

/// A claim's update: the pipeline of a write found by `_id` (whose `nModified`, not `n`, says
/// whether it held), or the update document as planned, for the filter as planned.
enum ClaimUpdate {
    ByIdPipeline(Vec<Document>),
    AsPlanned(Document),
}

impl ClaimUpdate {
    fn finds_by_id(&self) -> bool {
        matches!(self, ClaimUpdate::ByIdPipeline(_))
    }

    fn into_modifications(self) -> UpdateModifications {
        match self {
            ClaimUpdate::ByIdPipeline(p) => UpdateModifications::Pipeline(p),
            ClaimUpdate::AsPlanned(d) => UpdateModifications::Document(d),
        }
    }

    /// The `updateMods` of a bulkWrite op.
    fn into_bson(self) -> Bson {
        match self {
            ClaimUpdate::ByIdPipeline(p) => Bson::from(p),
            ClaimUpdate::AsPlanned(d) => Bson::from(d),
        }
    }
}

/// The task is still queued and unclaimed exactly as read: every write to a task moves its
/// `mtime`, so a task changed since (claimed and given back, edited) is not claimed blind.
/// Each value is matched with `$eq`: a stored value shaped like an operator document
/// (`{"$date": "x"}`, written by another tool) must be compared, not run as a query.
fn still_as_read(read: &Document) -> Document {
    let field = |name: &str| doc! {"$eq": read.get(name).cloned().unwrap_or(Bson::Null)};
    doc! {
        task::ID: field(task::ID),
        task::STATUS: status::QUEUED,
        task::NODE: field(task::NODE),
        task::MTIME: field(task::MTIME),
    }
}

/// The claimed task as the claim left it: what was read, with the claim's fields set and
/// `attempts` counted up (its numeric type kept, as `$inc` keeps it).
fn claimed_document(read: &Document, set: &Document) -> Document {
    let mut doc = read.clone();
    let attempts = match read.get(task::ATTEMPTS) {
        // Claimable tasks have `attempts` below 10^9: no overflow to think of.
        Some(Bson::Int64(n)) => Bson::Int64(n.saturating_add(1)),
        Some(Bson::Double(n)) => Bson::Double(n + 1.0),
        Some(Bson::Int32(n)) => Bson::Int32(n.saturating_add(1)),
        _ => Bson::Int32(1),
    };
    for (k, v) in set {
        doc.insert(k.clone(), v.clone());
    }
    doc.insert(task::ATTEMPTS, attempts);
    doc
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
