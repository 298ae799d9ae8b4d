//! Reads that show a queue's flow limits at work: why a queued task is held back, and a
//! queue's budget now (starts used and left, keys at their max, held tasks by limit).

use crate::LimitStore;
use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::claims::candidates::claimable;
use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::held::{self, key_text, FlowState, Held, HeldCounts, TaskFacts, Window};
use disbatch_model::limits::{self, FlowLimits};
use disbatch_model::schema::rate::OPEN;
use disbatch_model::schema::{rate, task, RATE_LIMITS, TASKS};
use disbatch_model::status;

/// The oldest claimable tasks a queue's held counts judge: bounds the read on a big backlog.
pub const HELD_SCAN: u64 = 2_000;
/// The most used partitions and the keys at their max a queue's view lists.
pub const BUSIEST: i64 = 5;

/// A queue's limits at work now (its `rate_limit` and `concurrency`).
#[derive(Debug, Clone, PartialEq)]
pub struct QueueFlow {
    pub now: DateTime,
    pub rate: Option<RateBudget>,
    pub concurrency: Option<KeyBudget>,
    pub held: HeldCounts,
}

/// Its rate limit's windows: partitions with starts in their window, and the busiest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateBudget {
    pub live_partitions: u64,
    /// Live partitions with no start left.
    pub exhausted_partitions: u64,
    /// The most used windows, most used first (the queue's one window without a partition).
    pub busiest: Vec<PartitionUse>,
    /// When the soonest live partition stops being live.
    pub next_partition_free: Option<DateTime>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PartitionUse {
    pub partition: Bson,
    pub used: u64,
    pub left: u64,
    /// When the next start frees, if any is used.
    pub next_free: Option<DateTime>,
}

/// Its key slots: how many are held, by how many keys, and the keys at their max.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyBudget {
    pub holding: u64,
    pub keys: u64,
    pub keys_at_max: u64,
    /// Keys at their max (up to `BUSIEST`), with the slots they hold.
    pub at_max: Vec<(Bson, u64)>,
}

impl LimitStore<'_> {
    /// A queue's budget and held tasks now; None (and no read) for a queue whose claims no
    /// limit holds. Bounded reads: the live windows, the key slots held, the oldest
    /// `HELD_SCAN` claimable tasks and their partitions' windows.
    pub async fn queue_flow(
        self,
        queue: ObjectId,
        limits: &FlowLimits,
        now: DateTime,
    ) -> Result<Option<QueueFlow>> {
        if !limits.limits_claims() {
            return Ok(None);
        }
        let now_ms = now.timestamp_millis();
        let mut state = FlowState {
            now_ms,
            ..Default::default()
        };
        let rate = match &limits.rate {
            Some(r) => {
                let budget = self.rate_budget(queue, r, now).await?;
                state.live_partitions = budget.live_partitions;
                state.next_partition_free_ms =
                    budget.next_partition_free.map(|d| d.timestamp_millis());
                Some(budget)
            }
            None => None,
        };
        let concurrency = match &limits.concurrency {
            Some(c) => {
                let held_keys = self.key_holders(queue).await?;
                let budget = key_budget(&held_keys, c.max);
                state.holders = held_keys.iter().map(|(k, n)| (key_text(k), *n)).collect();
                Some(budget)
            }
            None => None,
        };
        let held = self.held_counts(queue, limits, &mut state, now).await?;
        Ok(Some(QueueFlow {
            now,
            rate,
            concurrency,
            held,
        }))
    }
}

impl Store {
    /// Why queued task `t` of a queue with `limits` is held back now, or None (it is not
    /// queued and claimable, or no limit stops it). A few reads by index.
    pub(crate) async fn task_held(
        &self,
        t: &Document,
        limits: &FlowLimits,
        now: DateTime,
    ) -> Result<Option<Held>> {
        if !limits.limits_claims() || !is_claimable(t, now) {
            return Ok(None);
        }
        let (Ok(id), Ok(queue)) = (t.get_object_id(task::ID), t.get_object_id(task::QUEUE)) else {
            return Ok(None);
        };
        let mut facts = facts_of(t, limits);
        let mut state = FlowState {
            now_ms: now.timestamp_millis(),
            ..Default::default()
        };
        if let (Some(c), Some(key), false) = (&limits.concurrency, &facts.key, facts.holds_slot) {
            if c.ordered {
                facts.older_of_key = self.older_of_key(queue, id, &c.key, key).await?;
            }
            // Slots are whole numbers from 0: a range takes the key-slot index on SecantusDB,
            // where `$exists` read every task of the queue (1 ms against 450–670 ms at 100 000
            // queued, pymongo).
            let filter = doc! {task::QUEUE: queue, task::CONCURRENCY_KEY: key.clone(), task::CONCURRENCY_SLOT: {"$gte": 0}};
            let n = self
                .raw(TASKS)
                .count_documents(filter)
                .limit(u64::from(c.max))
                .await
                .map_err(|e| Error::mongo(format!("counting the key slots of task {id}"), e))?;
            state.holders.insert(key_text(key), n);
        }
        if let (Some(r), Some(partition)) = (&limits.rate, &facts.partition) {
            let window = self.windows(queue, std::slice::from_ref(partition)).await?;
            let live = window.values().any(|w| w.is_live(state.now_ms));
            state.windows = window;
            if r.partition.is_some() && !live {
                let (n, soonest) = self
                    .live_partitions_now(queue, now, r.max_partitions)
                    .await?;
                state.live_partitions = n;
                state.next_partition_free_ms = soonest.map(|d| d.timestamp_millis());
            }
        }
        Ok(held::held(limits, &facts, &state))
    }

    /// The `_id` of an older queued task of `queue` whose `path` holds `key`.
    async fn older_of_key(
        &self,
        queue: ObjectId,
        id: ObjectId,
        path: &str,
        key: &Bson,
    ) -> Result<Option<ObjectId>> {
        let filter = doc! {task::QUEUE: queue, task::STATUS: status::QUEUED, task::ID: {"$lt": id}, path: key.clone()};
        let found = self
            .raw(TASKS)
            .find_one(filter)
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo(format!("looking for older tasks of task {id}'s key"), e))?;
        Ok(found.and_then(|d| disbatch_model::text::raw_doc::object_id(&d)))
    }

    /// The windows of `queue`'s `partitions` that exist, by partition (`key_text`).
    async fn windows(
        &self,
        queue: ObjectId,
        partitions: &[Bson],
    ) -> Result<HashMap<String, Window>> {
        let ids: Vec<Document> = partitions
            .iter()
            .map(|p| doc! {rate::QUEUE: queue, rate::PARTITION: p.clone()})
            .collect();
        let context = format!("reading the rate windows of queue {queue}");
        let cursor = self
            .raw(RATE_LIMITS)
            .find(doc! {rate::ID: {"$in": ids}})
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let docs = self.read_all(RATE_LIMITS, cursor, &context).await?;
        Ok(docs
            .iter()
            .map(|d| {
                let partition = d
                    .get_document(rate::ID)
                    .ok()
                    .and_then(|i| i.get(rate::PARTITION))
                    .cloned()
                    .unwrap_or(Bson::Null);
                (key_text(&partition), window_of(d))
            })
            .collect())
    }

    /// How many of `queue`'s partitions are live (counting up to `max`), and when the
    /// soonest of them stops being live.
    async fn live_partitions_now(
        &self,
        queue: ObjectId,
        now: DateTime,
        max: u32,
    ) -> Result<(u64, Option<DateTime>)> {
        let filter = doc! {rate::QUEUE: queue, rate::UNTIL: {"$gt": now}};
        let context = format!("counting the live partitions of queue {queue}");
        let n = self
            .raw(RATE_LIMITS)
            .count_documents(filter.clone())
            .limit(u64::from(max))
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let soonest = self
            .raw(RATE_LIMITS)
            .find_one(filter)
            .sort(doc! {rate::UNTIL: 1})
            .projection(doc! {rate::UNTIL: 1})
            .await
            .map_err(|e| Error::mongo(&context, e))?
            .and_then(|d| d.get_datetime(rate::UNTIL).ok());
        Ok((n, soonest))
    }

    /// The live windows of `queue` summed on the server: how many, how many spent, the
    /// busiest, and the soonest to stop being live.
    async fn rate_budget(
        &self,
        queue: ObjectId,
        r: &limits::RateLimit,
        now: DateTime,
    ) -> Result<RateBudget> {
        let per_ms = i64::try_from(r.per.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now.timestamp_millis().saturating_sub(per_ms);
        let starts = i64::from(r.starts);
        let entries = doc! {"$concatArrays": [
            {"$cond": [{"$isArray": format!("${}", rate::STARTS)}, format!("${}", rate::STARTS), []]},
            {"$cond": [{"$eq": [{"$type": format!("${OPEN}")}, "object"]}, [format!("${OPEN}")], []]},
        ]};
        let pipeline = vec![
            doc! {"$match": {rate::QUEUE: queue, rate::UNTIL: {"$gt": now}}},
            doc! {"$project": {
                "_id": 0,
                "partition": {"$ifNull": [format!("${}.{}", rate::ID, rate::PARTITION), Bson::Null]},
                rate::UNTIL: 1,
                "live": {"$filter": {"input": entries, "as": "e", "cond": {"$gt": [format!("$$e.{}", rate::T), cutoff]}}},
            }},
            doc! {"$project": {
                "partition": 1,
                rate::UNTIL: 1,
                // `$reduce` and `$map` rather than `$sum: "$live.n"`: not every server of
                // the wire protocol reads a path through an array of documents there.
                "used": {"$reduce": {"input": "$live", "initialValue": 0_i64, "in": {"$add": ["$$value", format!("$$this.{}", rate::N)]}}},
                "oldest": {"$min": {"$map": {"input": "$live", "as": "e", "in": format!("$$e.{}", rate::T)}}},
            }},
            doc! {"$facet": {
                "live": [{"$count": "n"}],
                "exhausted": [{"$match": {"used": {"$gte": starts}}}, {"$count": "n"}],
                "busiest": [{"$sort": {"used": -1, "oldest": 1}}, {"$limit": BUSIEST}],
                "soonest": [{"$sort": {rate::UNTIL: 1}}, {"$limit": 1}],
            }},
        ];
        let context = format!("reading the rate budget of queue {queue}");
        let out = self.aggregate_all(RATE_LIMITS, pipeline, &context).await?;
        let Some(facets) = out.first() else {
            return Ok(RateBudget::default());
        };
        let count = |name: &str| {
            facets
                .get_array(name)
                .ok()
                .and_then(|a| a.first())
                .and_then(Bson::as_document)
                .map_or(0, |d| crate::count_value(d.get("n")))
        };
        let docs = |name: &str| -> Vec<Document> {
            facets
                .get_array(name)
                .map(|a| a.iter().filter_map(Bson::as_document).cloned().collect())
                .unwrap_or_default()
        };
        let busiest = docs("busiest")
            .iter()
            .map(|d| {
                let used = crate::count_value(d.get("used"));
                PartitionUse {
                    partition: d.get("partition").cloned().unwrap_or(Bson::Null),
                    used,
                    left: u64::from(r.starts).saturating_sub(used),
                    next_free: millis(d.get("oldest"))
                        .map(|t| DateTime::from_millis(t.saturating_add(per_ms))),
                }
            })
            .collect();
        Ok(RateBudget {
            live_partitions: count("live"),
            exhausted_partitions: count("exhausted"),
            busiest,
            next_partition_free: docs("soonest")
                .first()
                .and_then(|d| d.get_datetime(rate::UNTIL).ok().copied()),
        })
    }

    /// The key slots held in `queue`, by key: bounded by its running tasks (and an ordered
    /// queue's tasks waiting for their retry).
    async fn key_holders(&self, queue: ObjectId) -> Result<Vec<(Bson, u64)>> {
        let pipeline = vec![
            doc! {"$match": {task::QUEUE: queue, task::CONCURRENCY_SLOT: {"$exists": true}}},
            doc! {"$group": {"_id": format!("${}", task::CONCURRENCY_KEY), "n": {"$sum": 1}}},
        ];
        let context = format!("reading the key slots of queue {queue}");
        let out = self.aggregate_all(TASKS, pipeline, &context).await?;
        Ok(out
            .iter()
            .map(|d| {
                let key = d.get("_id").cloned().unwrap_or(Bson::Null);
                (key, crate::count_value(d.get("n")))
            })
            .collect())
    }

    /// Judges the oldest `HELD_SCAN` claimable tasks of `queue` as `task_held` would, with
    /// the windows of their partitions read at once.
    async fn held_counts(
        &self,
        queue: ObjectId,
        limits: &FlowLimits,
        state: &mut FlowState,
        now: DateTime,
    ) -> Result<HeldCounts> {
        let mut projection = doc! {task::ID: 1, task::CONCURRENCY_SLOT: 1};
        for path in projected_paths(limits) {
            projection.insert(path, 1);
        }
        let context = format!("reading the claimable tasks of queue {queue}");
        let cursor = self
            .raw(TASKS)
            .find(claimable(queue, now))
            .sort(doc! {task::ID: 1})
            .limit(HELD_SCAN as i64 + 1)
            .projection(projection)
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let mut tasks = self.read_all(TASKS, cursor, &context).await?;
        let capped = tasks.len() as u64 > HELD_SCAN;
        tasks.truncate(HELD_SCAN as usize);
        let facts: Vec<(ObjectId, TaskFacts)> = tasks
            .iter()
            .filter_map(|t| Some((t.get_object_id(task::ID).ok()?, facts_of(t, limits))))
            .collect();
        if limits.rate.is_some() {
            let mut partitions: HashMap<String, Bson> = HashMap::new();
            for (_, f) in &facts {
                if let Some(p) = &f.partition {
                    partitions.entry(key_text(p)).or_insert_with(|| p.clone());
                }
            }
            let partitions: Vec<Bson> = partitions.into_values().collect();
            state.windows = self.windows(queue, &partitions).await?;
        }
        let ordered = limits.concurrency.as_ref().is_some_and(|c| c.ordered);
        let mut first_of_key: HashMap<String, ObjectId> = HashMap::new();
        let mut counts = HeldCounts {
            capped,
            ..Default::default()
        };
        for (id, mut f) in facts {
            if let Some(key) = &f.key {
                let first = *first_of_key.entry(key_text(key)).or_insert(id);
                if ordered && first != id {
                    f.older_of_key = Some(first);
                }
            }
            counts.add(held::held(limits, &f, state).as_ref());
        }
        Ok(counts)
    }
}

/// Whether task `t` is queued and a node may claim it now (the claim's own filter, read
/// on the document).
fn is_claimable(t: &Document, now: DateTime) -> bool {
    let queued = matches!(t.get(task::STATUS), Some(Bson::Int32(s)) if *s == status::QUEUED)
        || matches!(t.get(task::STATUS), Some(Bson::Int64(s)) if *s == i64::from(status::QUEUED));
    let unclaimed = matches!(
        t.get(task::NODE),
        None | Some(Bson::Null) | Some(Bson::Int32(-1))
    );
    let due = match t.get(task::NOT_BEFORE) {
        None | Some(Bson::Null) => true,
        Some(Bson::DateTime(at)) => *at <= now,
        Some(_) => false,
    };
    queued && unclaimed && due
}

/// A task's values at its queue's limit paths.
fn facts_of(t: &Document, limits: &FlowLimits) -> TaskFacts {
    TaskFacts {
        partition: limits.rate.as_ref().and_then(|r| match &r.partition {
            Some(path) => limits::key_value(t, path).ok(),
            None => Some(Bson::Null),
        }),
        key: limits
            .concurrency
            .as_ref()
            .and_then(|c| limits::key_value(t, &c.key).ok()),
        holds_slot: t.contains_key(task::CONCURRENCY_SLOT),
        older_of_key: None,
    }
}

/// The task paths to project for the held counts: one of two paths where one holds the
/// other (the server refuses both in one projection).
fn projected_paths(limits: &FlowLimits) -> Vec<String> {
    let mut paths: Vec<String> = [
        limits.rate.as_ref().and_then(|r| r.partition.clone()),
        limits.concurrency.as_ref().map(|c| c.key.clone()),
    ]
    .into_iter()
    .flatten()
    .collect();
    paths.sort_by_key(String::len);
    let mut kept: Vec<String> = Vec::new();
    for p in paths {
        let covered = kept
            .iter()
            .any(|k| p == *k || p.starts_with(&format!("{k}.")));
        if !covered {
            kept.push(p);
        }
    }
    kept
}

/// A window document's entries: `starts` and the open one.
fn window_of(d: &Document) -> Window {
    let starts = d
        .get_array(rate::STARTS)
        .map(|a| a.iter().filter_map(Bson::as_document).collect::<Vec<_>>())
        .unwrap_or_default();
    let open = d.get_document(OPEN).ok();
    Window {
        entries: starts
            .into_iter()
            .chain(open)
            .filter_map(|e| Some((millis(e.get(rate::T))?, crate::count_value(e.get(rate::N)))))
            .collect(),
        until_ms: d
            .get_datetime(rate::UNTIL)
            .ok()
            .map(|u| u.timestamp_millis()),
    }
}

/// A whole number of milliseconds as stored (Int64 from the grant, another type from
/// another writer); None when it is no number.
fn millis(v: Option<&Bson>) -> Option<i64> {
    match v {
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        Some(Bson::Double(f)) if f.is_finite() => Some(*f as i64),
        _ => None,
    }
}

/// The key slots held, summed: keys at `max` listed, fullest first.
fn key_budget(held: &[(Bson, u64)], max: u32) -> KeyBudget {
    let mut at_max: Vec<(Bson, u64)> = held
        .iter()
        .filter(|(_, n)| *n >= u64::from(max))
        .cloned()
        .collect();
    let keys_at_max = at_max.len() as u64;
    at_max.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| key_text(&a.0).cmp(&key_text(&b.0)))
    });
    at_max.truncate(BUSIEST as usize);
    KeyBudget {
        holding: held.iter().map(|(_, n)| n).sum(),
        keys: held.len() as u64,
        keys_at_max,
        at_max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(d: Document) -> FlowLimits {
        limits::parse(&d).expect("limits")
    }

    #[test]
    fn a_claimable_task_is_queued_unclaimed_and_due() {
        let now = DateTime::from_millis(10_000);
        assert!(is_claimable(&doc! {"status": -2, "node": null}, now));
        assert!(is_claimable(
            &doc! {"status": -2_i64, "node": -1, "not_before": DateTime::from_millis(9_000)},
            now
        ));
        assert!(!is_claimable(
            &doc! {"status": -2, "not_before": DateTime::from_millis(11_000)},
            now
        ));
        assert!(!is_claimable(&doc! {"status": 0, "node": null}, now));
        assert!(!is_claimable(&doc! {"status": -2, "node": "n1"}, now));
    }

    #[test]
    fn facts_read_the_limit_paths_of_a_task() {
        let l = limits(doc! {
            "rate_limit": {"starts": 1, "per_s": 1, "partition": "params.c"},
            "concurrency": {"key": "params.a"},
        });
        let f = facts_of(
            &doc! {"params": {"c": "x", "a": 3}, "concurrency_slot": 0},
            &l,
        );
        assert_eq!(
            (f.partition, f.key, f.holds_slot),
            (Some(Bson::from("x")), Some(Bson::Int32(3)), true)
        );
        let f = facts_of(&doc! {"params": {"c": [1, 2]}}, &l);
        assert_eq!(
            (f.partition, f.key),
            (None, Some(Bson::Null)),
            "a list is no partition"
        );
        let unpartitioned = limits(doc! {"rate_limit": {"starts": 1, "per_s": 1}});
        assert_eq!(
            facts_of(&doc! {}, &unpartitioned).partition,
            Some(Bson::Null)
        );
    }

    #[test]
    fn nested_paths_are_projected_once() {
        let l = limits(doc! {
            "rate_limit": {"starts": 1, "per_s": 1, "partition": "params"},
            "concurrency": {"key": "params.a"},
        });
        assert_eq!(projected_paths(&l), vec!["params".to_string()]);
        let l = limits(doc! {
            "rate_limit": {"starts": 1, "per_s": 1, "partition": "params.ab"},
            "concurrency": {"key": "params.a"},
        });
        assert_eq!(
            projected_paths(&l).len(),
            2,
            "a prefix of the text is not a parent"
        );
    }

    #[test]
    fn a_window_reads_its_starts_and_open_entry() {
        let w = window_of(&doc! {
            "starts": [{"t": 1_000_i64, "n": 2_i64}, {"t": "bad", "n": 1}],
            "open": {"t": 3_000_i64, "n": 4_i32},
            "until": DateTime::from_millis(13_000),
        });
        assert_eq!(w.entries, vec![(1_000, 2), (3_000, 4)]);
        assert_eq!(w.until_ms, Some(13_000));
    }

    #[test]
    fn keys_at_max_are_listed_fullest_first() {
        let held = vec![
            (Bson::from("a"), 1),
            (Bson::from("b"), 3),
            (Bson::from("c"), 2),
        ];
        let b = key_budget(&held, 2);
        assert_eq!((b.holding, b.keys, b.keys_at_max), (6, 3, 2));
        assert_eq!(b.at_max, vec![(Bson::from("b"), 3), (Bson::from("c"), 2)]);
    }
}
