//! Flow limits in the claimer: which of a limited queue's tasks a read leaves out (full
//! partitions, keys at their max), and what each chosen claim holds (a start the rate limit
//! granted, a key slot). The database decides both; this only asks for what can be had.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{Bson, Document};
use disbatch_model::limits::{key_value, Concurrency, RateLimit};
use disbatch_model::task::{held_key_slot, task_id};
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{key_text, Exclusions, Grant, HeldKeys, LimitIndex, PickHolds, SkipReason};

use rand::Rng;

use super::reserve::{Leftover, Reserves};
use super::Claimer;

/// A partition's window that was too full to grant is asked again after at most this long,
/// even if it said it frees later: its limit may have been raised.
const FULL_RECHECK: Duration = Duration::from_secs(5);
/// A partition refused for `max_partitions` is asked again after this long.
const PARTITIONS_RECHECK: Duration = Duration::from_secs(1);
/// The key slots a queue's tasks hold are read again after this long, or at once when a key
/// is near its max or another node's claim took a slot this node thought free. The key index
/// decides every claim; a reading only spares claims that would fail.
const KEYS_FRESH: Duration = Duration::from_secs(1);

/// What the claimer knows of one queue's rate-limit windows.
#[derive(Debug, Default)]
pub(super) struct QueueWindows {
    /// Full partitions, by key text: their value, and when to ask again.
    full: HashMap<String, (Bson, Instant)>,
    /// The limit they were full under: a changed limit is asked again at once.
    limit: Option<RateLimit>,
    /// Starts granted ahead, not yet taken.
    reserves: Reserves,
}

impl QueueWindows {
    fn prune(&mut self) {
        let now = Instant::now();
        self.full.retain(|_, (_, until)| *until > now);
    }

    fn earliest(&self) -> Option<Instant> {
        self.full.values().map(|(_, t)| *t).min()
    }
}

/// Per queue: the windows' state and the last reading of its key slots.
#[derive(Debug, Default)]
pub(super) struct LimitViews {
    windows: HashMap<ObjectId, QueueWindows>,
    keys: HashMap<ObjectId, (HeldKeys, Instant)>,
}

impl LimitViews {
    pub(super) fn retain(&mut self, queues: &HashSet<ObjectId>) {
        self.windows.retain(|q, _| queues.contains(q));
        self.keys.retain(|q, _| queues.contains(q));
    }

    /// This node's claim now holds the slot: later passes reading the cached slots skip it.
    pub(super) fn key_slot_claimed(&mut self, queue: ObjectId, key: &Bson, slot: u32) {
        if let Some((held, _)) = self.keys.get_mut(&queue) {
            held.hold(key, slot);
        }
    }

    /// Another node holds a slot this node thought free: read the slots afresh.
    pub(super) fn key_slots_stale(&mut self, queue: ObjectId) {
        self.keys.remove(&queue);
    }

    /// The queue's key slots as last read, if that reading can still serve.
    fn fresh_keys(&self, queue: ObjectId, max: u32) -> Option<HeldKeys> {
        let (held, read) = self.keys.get(&queue)?;
        (read.elapsed() < KEYS_FRESH && !held.near_full(max)).then(|| held.clone())
    }
}

/// A limited queue's state before its read.
pub(super) struct BeforeRead {
    /// What the read leaves out; None when nothing is (read as usual).
    pub(super) left_out: Option<Exclusions>,
    pub(super) held: Option<HeldKeys>,
    /// Nothing can start before then (a rate limit without partitions whose window is full).
    pub(super) blocked_until: Option<Instant>,
    /// When the first partition left out of the read frees.
    pub(super) frees_at: Option<Instant>,
}

/// The chosen tasks the limits let start, each with its holds, and until when (at the
/// earliest) the others wait.
pub(super) struct Allowed {
    pub(super) tasks: Vec<(Document, PickHolds)>,
    pub(super) held_back: u32,
    pub(super) wait_until: Option<Instant>,
    /// A partition's window filled in this batch: a read now would leave it out.
    pub(super) fresh_exclusions: bool,
}

impl Claimer {
    /// Gives back the starts granted to picks whose claims came to nothing, per partition
    /// and grant, so the window counts only starts that happened: to the reserve they came
    /// from while it holds, else to the window.
    pub(super) async fn refund_unused_starts(
        &mut self,
        queue: &Queue,
        unused: &[&PickHolds],
    ) -> Result<()> {
        let now = Instant::now();
        let windows = self.limits.windows.entry(queue.id).or_default();
        let mut grants: Vec<(&Bson, bson::DateTime, u32)> = Vec::new();
        for h in unused {
            let (Some(partition), Some(at)) = (&h.partition, h.granted_at) else {
                continue;
            };
            if windows.reserves.put_back(&key_text(partition), at, now) {
                continue;
            }
            match grants
                .iter_mut()
                .find(|(p, a, _)| *a == at && key_text(p) == key_text(partition))
            {
                Some((_, _, n)) => *n += 1,
                None => grants.push((partition, at, 1)),
            }
        }
        for (partition, at, n) in grants {
            self.store
                .limits()
                .refund_starts(queue.id, partition, at, n)
                .await?;
        }
        Ok(())
    }

    /// Gives back to their windows the starts reserves left unused.
    async fn refund_leftovers(&self, queue: &Queue, leftovers: Vec<Leftover>) -> Result<()> {
        if leftovers.is_empty() {
            return Ok(());
        }
        let n: u64 = leftovers.iter().map(|l| u64::from(l.n)).sum();
        self.metrics.limit_held(&queue.name, "unused_ahead", n);
        let refunds = futures::future::join_all(leftovers.iter().map(|l| {
            self.store
                .limits()
                .refund_starts(queue.id, &l.partition, l.granted_at, l.n)
        }))
        .await;
        refunds.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(())
    }

    /// Reads what a limited queue's claims must leave out now.
    pub(super) async fn limits_before_read(&mut self, queue: &Queue) -> Result<BeforeRead> {
        let windows = self.limits.windows.entry(queue.id).or_default();
        let leftovers = match windows.limit != queue.limits.rate {
            true => {
                windows.full.clear();
                windows.limit.clone_from(&queue.limits.rate);
                windows.reserves.clear()
            }
            false => windows.reserves.expire(Instant::now()),
        };
        windows.prune();
        let mut left_out = Exclusions::default();
        let mut blocked_until = None;
        if let Some(rate) = &queue.limits.rate {
            match &rate.partition {
                None => blocked_until = windows.earliest(),
                Some(path) if !windows.full.is_empty() => {
                    let full: Vec<Bson> = windows.full.values().map(|(v, _)| v.clone()).collect();
                    left_out.full_partitions = Some((path.clone(), full));
                }
                Some(_) => {}
            }
        }
        self.refund_leftovers(queue, leftovers).await?;
        let mut held = None;
        if let Some(c) = &queue.limits.concurrency {
            let keys = match self.limits.fresh_keys(queue.id, c.max) {
                Some(keys) => keys,
                None => {
                    self.store
                        .limits()
                        .ensure_limit_index(LimitIndex::KeySlots)
                        .await?;
                    let keys = self.store.limits().held_key_slots(queue.id).await?;
                    self.limits
                        .keys
                        .insert(queue.id, (keys.clone(), Instant::now()));
                    keys
                }
            };
            let full = keys.full_keys(c.max);
            if !full.is_empty() {
                left_out.full_keys = Some((c.key.clone(), full));
            }
            held = Some(keys);
        }
        Ok(BeforeRead {
            left_out: (!left_out.is_empty()).then_some(left_out),
            held,
            blocked_until,
            frees_at: self
                .limits
                .windows
                .get(&queue.id)
                .and_then(QueueWindows::earliest),
        })
    }

    /// Takes the chosen tasks through the queue's limits: each gets a key slot and a granted
    /// start, or waits.
    pub(super) async fn limits_allow(
        &mut self,
        queue: &Queue,
        before: &BeforeRead,
        chosen: Vec<Document>,
    ) -> Result<Allowed> {
        let mut allowed = Allowed {
            tasks: Vec::with_capacity(chosen.len()),
            held_back: 0,
            wait_until: None,
            fresh_exclusions: false,
        };
        let mut tasks: Vec<(Document, PickHolds)> = Vec::with_capacity(chosen.len());
        for t in chosen {
            tasks.push((t, PickHolds::default()));
        }
        if let (Some(c), Some(held)) = (&queue.limits.concurrency, &before.held) {
            tasks = self.take_key_slots(queue, c, held, tasks).await?;
        }
        let before_rate = tasks.len();
        if let Some(rate) = &queue.limits.rate {
            let (granted, wait, fresh) = self.grant_starts(queue, rate, tasks).await?;
            tasks = granted;
            allowed.wait_until = wait;
            // Without partitions a full window holds every task alike: nothing else to find.
            allowed.fresh_exclusions = fresh && rate.partition.is_some();
        }
        allowed.held_back = (before_rate - tasks.len()) as u32;
        allowed.tasks = tasks;
        Ok(allowed)
    }

    /// Gives each task a free slot of its key (its own, for a task that kept one waiting for
    /// its retry); in an ordered queue only the oldest queued task of each key goes.
    async fn take_key_slots(
        &mut self,
        queue: &Queue,
        c: &Concurrency,
        held: &HeldKeys,
        tasks: Vec<(Document, PickHolds)>,
    ) -> Result<Vec<(Document, PickHolds)>> {
        let mut keyed = Vec::with_capacity(tasks.len());
        for (t, holds) in tasks {
            match key_value(&t, &c.key) {
                Ok(key) => keyed.push((t, holds, key)),
                Err(why) => {
                    if let Some(id) = task_id(&t) {
                        let why = format!("its queue's concurrency key: {why}");
                        self.set_unrunnable(id, SkipReason::BadLimitKey, &why)
                            .await?;
                    }
                }
            }
        }
        let oldest = match c.ordered {
            true => {
                let mut keys: Vec<Bson> = Vec::new();
                let mut seen = HashSet::new();
                for (_, _, k) in &keyed {
                    if seen.insert(key_text(k)) {
                        keys.push(k.clone());
                    }
                }
                Some(
                    self.store
                        .limits()
                        .oldest_queued_by_key(queue.id, &c.key, &keys)
                        .await?,
                )
            }
            false => None,
        };
        let mut taken: HashMap<String, Vec<u32>> = HashMap::new();
        let (mut by_max, mut by_order) = (0u64, 0u64);
        let mut out = Vec::with_capacity(keyed.len());
        for (t, mut holds, key) in keyed {
            let text = key_text(&key);
            if let Some(oldest) = &oldest {
                let first = task_id(&t) == oldest.get(&text).copied();
                // One per key and batch: the next one is the oldest only once this one runs.
                if !first || taken.contains_key(&text) {
                    by_order += 1;
                    continue;
                }
            }
            let own = held_key_slot(&t)
                .filter(|(k, _)| key_text(k) == text)
                .map(|(_, slot)| slot);
            let mine = taken.entry(text).or_default();
            let from = self.rng.random_range(0..c.max.max(1));
            let slot = own.or_else(|| held.free_slot(&key, c.max, mine, from));
            let Some(slot) = slot else {
                by_max += 1;
                continue;
            };
            mine.push(slot);
            holds.key_slot = Some((key, slot));
            out.push((t, holds));
        }
        if by_max > 0 {
            self.metrics.limit_held(&queue.name, "concurrency", by_max);
        }
        if by_order > 0 {
            self.metrics.limit_held(&queue.name, "ordered", by_order);
        }
        Ok(out)
    }

    /// Asks each partition's window for starts for its tasks; the tasks it has none for wait,
    /// and their partition is left out of reads until its window frees.
    async fn grant_starts(
        &mut self,
        queue: &Queue,
        rate: &RateLimit,
        tasks: Vec<(Document, PickHolds)>,
    ) -> Result<(Vec<(Document, PickHolds)>, Option<Instant>, bool)> {
        let mut partitions: Vec<(Bson, Vec<(Document, PickHolds)>)> = Vec::new();
        for (t, holds) in tasks {
            let value = match &rate.partition {
                None => Ok(Bson::Null),
                Some(path) => key_value(&t, path),
            };
            let value = match value {
                Ok(v) => v,
                Err(why) => {
                    if let Some(id) = task_id(&t) {
                        let why = format!("its queue's rate-limit partition: {why}");
                        self.set_unrunnable(id, SkipReason::BadLimitKey, &why)
                            .await?;
                    }
                    continue;
                }
            };
            match partitions
                .iter_mut()
                .find(|(p, _)| key_text(p) == key_text(&value))
            {
                Some((_, list)) => list.push((t, holds)),
                None => partitions.push((value, vec![(t, holds)])),
            }
        }
        let mut out = Vec::new();
        let (mut by_rate, mut by_partitions) = (0u64, 0u64);
        let mut fresh = false;
        // Starts granted ahead serve first; the partitions they do not cover ask their window.
        let now = Instant::now();
        let windows = self.limits.windows.entry(queue.id).or_default();
        let mut asks = Vec::with_capacity(partitions.len());
        for (partition, mut list) in partitions {
            let text = key_text(&partition);
            if let Some(taken) = windows.reserves.take(&text, list.len() as u32, now) {
                for (t, mut holds) in list.drain(..taken.n as usize) {
                    holds.started_at = Some(taken.started_at);
                    holds.granted_at = Some(taken.granted_at);
                    holds.partition = Some(partition.clone());
                    out.push((t, holds));
                }
            }
            if !list.is_empty() {
                let ahead = windows.reserves.ahead_for(&text, list.len() as u32, rate);
                asks.push((partition, text, list, ahead));
            }
        }
        // Each partition's window is its own document: asked all at once.
        let sent = Instant::now();
        let grants = futures::future::join_all(asks.iter().map(|(partition, _, list, ahead)| {
            self.store
                .limits()
                .grant_starts(queue.id, partition, rate, list.len() as u32, *ahead)
        }))
        .await;
        for ((partition, text, mut list, _), grant) in asks.into_iter().zip(grants) {
            let grant = grant?;
            let windows = self.limits.windows.entry(queue.id).or_default();
            match grant {
                Grant::Starts {
                    n,
                    ahead,
                    at,
                    free_in,
                } => {
                    windows
                        .reserves
                        .keep(&text, &partition, at, ahead, sent, rate);
                    if let Some(free_in) = free_in {
                        let until = Instant::now() + free_in.min(FULL_RECHECK);
                        windows
                            .full
                            .insert(key_text(&partition), (partition.clone(), until));
                    }
                    let short = list.len().saturating_sub(n as usize);
                    fresh |= short > 0;
                    by_rate += short as u64;
                    list.truncate(n as usize);
                    for (t, mut holds) in list {
                        holds.started_at = Some(at);
                        holds.granted_at = Some(at);
                        holds.partition = Some(partition.clone());
                        out.push((t, holds));
                    }
                }
                Grant::TooManyPartitions { live } => {
                    by_partitions += list.len() as u64;
                    fresh = true;
                    let until = Instant::now() + PARTITIONS_RECHECK;
                    windows.full.insert(text, (partition, until));
                    self.report_once(format!(
                        "queue {} ({}): {live} rate-limit partitions are live, its max_partitions is {}: tasks of new partitions wait until one expires",
                        queue.name, queue.id, rate.max_partitions
                    ));
                }
            }
        }
        if by_rate > 0 {
            self.metrics.limit_held(&queue.name, "rate_limit", by_rate);
        }
        if by_partitions > 0 {
            self.metrics
                .limit_held(&queue.name, "partition_limit", by_partitions);
        }
        let wait = self
            .limits
            .windows
            .get(&queue.id)
            .and_then(QueueWindows::earliest);
        Ok((out, wait, fresh))
    }
}
