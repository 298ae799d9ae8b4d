//! Why a queued task of a flow-limited queue waits now (`held`): the decision, from what the
//! store read about its queue's windows and key slots, apart from the reads.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::limits::FlowLimits;

/// The limit that holds a task back, by its public name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HeldLimit {
    /// Its partition's (or the queue's) window has no start left.
    RateLimit,
    /// Its partition has no window and the queue has `max_partitions` live ones.
    PartitionLimit,
    /// Its key holds `max` slots.
    Concurrency,
    /// An older queued task of its key starts first.
    Ordered,
}

impl HeldLimit {
    pub const ALL: [HeldLimit; 4] = [
        HeldLimit::RateLimit,
        HeldLimit::PartitionLimit,
        HeldLimit::Concurrency,
        HeldLimit::Ordered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeldLimit::RateLimit => "rate_limit",
            HeldLimit::PartitionLimit => "partition_limit",
            HeldLimit::Concurrency => "concurrency",
            HeldLimit::Ordered => "ordered",
        }
    }
}

/// A task held back: which limit, a sentence for people, and when it may start (None: when
/// something else happens, a running task of its key ending).
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub limit: HeldLimit,
    pub reason: String,
    pub until: Option<DateTime>,
}

impl Held {
    /// `{limit, reason, until}` as the API shows it.
    pub fn to_document(&self) -> Document {
        doc! {
            "limit": self.limit.as_str(),
            "reason": &self.reason,
            "until": self.until.map_or(Bson::Null, Bson::DateTime),
        }
    }
}

/// One partition's window as read: its entries `(t, n)` (server ms) and its `until`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    pub entries: Vec<(i64, u64)>,
    pub until_ms: Option<i64>,
}

impl Window {
    /// Starts counted now: the entries still inside the `per_ms` window.
    pub fn used(&self, per_ms: i64, now_ms: i64) -> u64 {
        self.live(per_ms, now_ms).map(|(_, n)| n).sum()
    }

    /// When a start frees: the oldest counted entry leaves the window.
    pub fn frees_at(&self, per_ms: i64, now_ms: i64) -> Option<i64> {
        self.live(per_ms, now_ms)
            .map(|(t, _)| t.saturating_add(per_ms))
            .min()
    }

    /// Whether the partition counts as live (one of the queue's `max_partitions`).
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.until_ms.is_some_and(|u| u > now_ms)
    }

    fn live(&self, per_ms: i64, now_ms: i64) -> impl Iterator<Item = (i64, u64)> + '_ {
        self.entries
            .iter()
            .copied()
            .filter(move |(t, _)| t.saturating_add(per_ms) > now_ms)
    }
}

/// What the store read about one queue's limits, for judging its queued tasks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowState {
    pub now_ms: i64,
    /// Windows by partition (`key_text`); a partition without one is absent.
    pub windows: HashMap<String, Window>,
    /// Live partitions of the queue (counted only when the limit may be reached).
    pub live_partitions: u64,
    /// When the soonest live partition stops being live.
    pub next_partition_free_ms: Option<i64>,
    /// Key slots held, by key (`key_text`).
    pub holders: HashMap<String, u64>,
}

/// What a queued task brings to the decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskFacts {
    /// Its value at `rate_limit.partition` (Null without a partition); None when it has no
    /// readable value (a list) or the queue has no rate limit.
    pub partition: Option<Bson>,
    /// Its value at `concurrency.key`; None as for `partition`.
    pub key: Option<Bson>,
    /// It holds a key slot already (an ordered queue's task waiting for its retry).
    pub holds_slot: bool,
    /// An older queued task of its key (ordered queues).
    pub older_of_key: Option<ObjectId>,
}

pub use crate::limits::key_text;

/// Whether and why the task waits now. Per-key limits are judged first: a task that cannot
/// start for its key would not start when its window frees either.
pub fn held(limits: &FlowLimits, task: &TaskFacts, state: &FlowState) -> Option<Held> {
    if let (Some(c), Some(key), false) = (&limits.concurrency, &task.key, task.holds_slot) {
        let shown = format!("{} {}", c.key, key_text(key));
        if let (true, Some(older)) = (c.ordered, task.older_of_key) {
            return Some(Held {
                limit: HeldLimit::Ordered,
                reason: format!(
                    "tasks of one key start in the order they were queued, and an older task of {shown} ({older}) waits"
                ),
                until: None,
            });
        }
        let holding = state.holders.get(&key_text(key)).copied().unwrap_or(0);
        if holding >= u64::from(c.max) {
            return Some(Held {
                limit: HeldLimit::Concurrency,
                reason: format!(
                    "{shown} already has {holding} running task(s), its max of {}; it starts when one of them ends",
                    c.max
                ),
                until: None,
            });
        }
    }
    let (Some(rate), Some(partition)) = (&limits.rate, &task.partition) else {
        return None;
    };
    let per_ms = i64::try_from(rate.per.as_millis()).unwrap_or(i64::MAX);
    let of = match &rate.partition {
        Some(path) => format!(" of {path} {}", key_text(partition)),
        None => String::new(),
    };
    let now = state.now_ms;
    let window = state.windows.get(&key_text(partition));
    if let Some(w) = window {
        let used = w.used(per_ms, now);
        if used >= u64::from(rate.starts) {
            return Some(Held {
                limit: HeldLimit::RateLimit,
                reason: format!(
                    "the rate limit{of} is used up: {used} of {} starts in the last {}; it starts when the oldest leaves the window",
                    rate.starts,
                    seconds(per_ms)
                ),
                until: w.frees_at(per_ms, now).map(DateTime::from_millis),
            });
        }
    }
    let has_window = window.is_some_and(|w| w.is_live(now));
    if rate.partition.is_some()
        && !has_window
        && state.live_partitions >= u64::from(rate.max_partitions)
    {
        return Some(Held {
            limit: HeldLimit::PartitionLimit,
            reason: format!(
                "the partition{of} has no budget yet and the queue already has {} live partitions, its max_partitions of {}; it starts when one of them expires",
                state.live_partitions, rate.max_partitions
            ),
            until: state.next_partition_free_ms.map(DateTime::from_millis),
        });
    }
    None
}

/// A period for people: `10 s`, `0.5 s`.
fn seconds(ms: i64) -> String {
    if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{} s", ms as f64 / 1000.0)
    }
}

/// How many of a queue's claimable tasks each limit holds back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeldCounts {
    pub by_limit: HashMap<HeldLimit, u64>,
    /// The claimable tasks judged (the oldest ones, up to a bound).
    pub scanned: u64,
    /// More claimable tasks exist than were judged: the counts are of the oldest `scanned`.
    pub capped: bool,
}

impl HeldCounts {
    pub fn add(&mut self, held: Option<&Held>) {
        self.scanned += 1;
        if let Some(h) = held {
            *self.by_limit.entry(h.limit).or_default() += 1;
        }
    }

    pub fn get(&self, limit: HeldLimit) -> u64 {
        self.by_limit.get(&limit).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::parse;

    fn limits(d: Document) -> FlowLimits {
        parse(&d).expect("limits")
    }

    fn state(now_ms: i64) -> FlowState {
        FlowState {
            now_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_window_counts_only_its_live_entries() {
        let w = Window {
            entries: vec![(1_000, 2), (5_000, 3), (9_000, 1)],
            until_ms: Some(19_000),
        };
        assert_eq!(w.used(10_000, 10_500), 6);
        assert_eq!(
            w.used(10_000, 11_000),
            4,
            "an entry leaves at exactly t + per"
        );
        assert_eq!(w.frees_at(10_000, 11_000), Some(15_000));
        assert_eq!(w.used(10_000, 19_000), 0);
        assert_eq!(w.frees_at(10_000, 19_000), None);
        assert!(w.is_live(18_999) && !w.is_live(19_000));
    }

    #[test]
    fn a_spent_window_holds_until_its_oldest_entry_leaves() {
        let l = limits(doc! {"rate_limit": {"starts": 3, "per_s": 10}});
        let mut s = state(12_000);
        s.windows.insert(
            key_text(&Bson::Null),
            Window {
                entries: vec![(1_000, 1), (4_000, 2), (6_000, 1)],
                until_ms: Some(16_000),
            },
        );
        let task = TaskFacts {
            partition: Some(Bson::Null),
            ..Default::default()
        };
        let h = held(&l, &task, &s).expect("held");
        assert_eq!(h.limit, HeldLimit::RateLimit);
        assert_eq!(h.until, Some(DateTime::from_millis(14_000)));
        assert!(
            h.reason.contains("3 of 3 starts in the last 10 s"),
            "{}",
            h.reason
        );
        s.now_ms = 14_000;
        assert_eq!(held(&l, &task, &s), None, "the oldest live entry left");
    }

    #[test]
    fn a_new_partition_waits_while_the_queue_has_its_max_of_live_ones() {
        let l = limits(
            doc! {"rate_limit": {"starts": 5, "per_s": 1, "partition": "params.c", "max_partitions": 2}},
        );
        let mut s = state(100);
        s.live_partitions = 2;
        s.next_partition_free_ms = Some(700);
        s.windows.insert(
            key_text(&Bson::from("a")),
            Window {
                entries: vec![(50, 1)],
                until_ms: Some(1_050),
            },
        );
        let new = TaskFacts {
            partition: Some(Bson::from("z")),
            ..Default::default()
        };
        let h = held(&l, &new, &s).expect("held");
        assert_eq!(h.limit, HeldLimit::PartitionLimit);
        assert_eq!(h.until, Some(DateTime::from_millis(700)));
        assert!(h.reason.contains("params.c \"z\""), "{}", h.reason);
        let live = TaskFacts {
            partition: Some(Bson::from("a")),
            ..Default::default()
        };
        assert_eq!(
            held(&l, &live, &s),
            None,
            "a live partition with room starts"
        );
        s.live_partitions = 1;
        assert_eq!(held(&l, &new, &s), None, "room for another partition");
    }

    #[test]
    fn keys_at_their_max_and_older_tasks_of_an_ordered_key_hold() {
        let l = limits(doc! {"concurrency": {"key": "params.a", "max": 2, "ordered": true}});
        let mut s = state(0);
        s.holders.insert(key_text(&Bson::from("k")), 2);
        let mut task = TaskFacts {
            key: Some(Bson::from("k")),
            ..Default::default()
        };
        let h = held(&l, &task, &s).expect("held");
        assert_eq!((h.limit, h.until), (HeldLimit::Concurrency, None));
        assert!(h.reason.contains("its max of 2"), "{}", h.reason);
        let older = ObjectId::new();
        task.older_of_key = Some(older);
        let h = held(&l, &task, &s).expect("held");
        assert_eq!(h.limit, HeldLimit::Ordered);
        assert!(h.reason.contains(&older.to_hex()), "{}", h.reason);
        task.holds_slot = true;
        assert_eq!(
            held(&l, &task, &s),
            None,
            "a task holding its slot keeps its place"
        );
        let unordered = limits(doc! {"concurrency": {"key": "params.a", "max": 3}});
        task.holds_slot = false;
        assert_eq!(
            held(&unordered, &task, &s),
            None,
            "order only matters when ordered"
        );
    }

    #[test]
    fn a_task_without_a_readable_value_or_limit_is_not_held() {
        let s = state(0);
        assert_eq!(
            held(&FlowLimits::default(), &TaskFacts::default(), &s),
            None
        );
        let l = limits(doc! {"rate_limit": {"starts": 1, "per_s": 1}, "concurrency": {"key": "k"}});
        assert_eq!(held(&l, &TaskFacts::default(), &s), None);
    }

    #[test]
    fn counts_add_up_by_limit() {
        let mut c = HeldCounts::default();
        let h = Held {
            limit: HeldLimit::Ordered,
            reason: String::new(),
            until: None,
        };
        c.add(Some(&h));
        c.add(None);
        assert_eq!(
            (
                c.get(HeldLimit::Ordered),
                c.get(HeldLimit::RateLimit),
                c.scanned
            ),
            (1, 0, 2)
        );
        assert_eq!(seconds(500), "0.5 s");
        assert_eq!(h.to_document().get("until"), Some(&Bson::Null));
    }
}
