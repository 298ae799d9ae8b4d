//! The claimer's view of running tasks between database readings: the last snapshot, moved
//! forward by this node's own claims and runner exits, and read again at least every second.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::claimer::lanes::LaneCache;
use crate::claimer::plan::Lane;
use bson::oid::ObjectId;
use disbatch_store::RunningSnapshot;

/// Past this age the view is read again even without a maintenance pass: other nodes' claims
/// and exits only show up in a reading.
const MAX_AGE: Duration = Duration::from_secs(1);
/// A node seen holding a queue's tasks keeps its lane this long: with short tasks a busy node
/// often holds none at the moment of a reading, and lanes that change with every reading
/// would have nodes reach for each other's slots and tasks.
const LANE_MEMORY: Duration = Duration::from_secs(5);
/// Once a slotless (Perl) claim is seen in any queue, claims count running tasks afresh for
/// this long: a Perl node serving one queue likely serves others, and it claims in bursts.
const MIXED_MEMORY: Duration = Duration::from_secs(5 * 60);

#[derive(Debug, Clone, Default)]
pub struct RunningView {
    per_queue: HashMap<ObjectId, u32>,
    slots: HashMap<ObjectId, BTreeSet<u32>>,
    /// Per queue: the slots held at any reading of the contest window.
    contested: HashMap<ObjectId, BTreeSet<u32>>,
    /// The readings' held slots within the contest window (at least the last two).
    recent: VecDeque<(Instant, HashMap<ObjectId, BTreeSet<u32>>)>,
    /// How long a slot seen held stays another lane's: long enough for its own node to read
    /// again and take it back, so a slot borrowed from a node that was slow to claim goes back
    /// to it when the borrowed task ends, instead of being borrowed again at once.
    contest_window: Duration,
    /// Per queue: the nodes seen holding its tasks, and when last.
    claimers: HashMap<ObjectId, HashMap<String, Instant>>,
    pub on_node: u32,
    /// Per queue: the live nodes that serve it and have room, by their heartbeats.
    sharers: HashMap<ObjectId, Vec<String>>,
    /// Live nodes' `maxthreads` (None: unlimited), by their heartbeats: their lanes' weights.
    capacity: HashMap<String, Option<u32>>,
    read_at: Option<Instant>,
    /// When a reading last found a claim that holds no slot.
    slotless_seen: Option<Instant>,
    lanes: LaneCache<ObjectId>,
}

impl RunningView {
    /// A view whose slots seen held stay contested for `window` (and for two readings at
    /// least).
    pub fn with_contest_window(window: Duration) -> RunningView {
        RunningView {
            contest_window: window,
            ..RunningView::default()
        }
    }

    /// `live` is how many runners this process has not yet seen exit: one may have written
    /// its result (so the snapshot no longer counts it) and still be exiting; its exit will
    /// be subtracted later, so the node count must include it now or run over `maxthreads`.
    pub fn read(&mut self, s: RunningSnapshot, live: u32) {
        let now = Instant::now();
        for (queue, nodes) in s.nodes {
            let seen = self.claimers.entry(queue).or_default();
            seen.extend(nodes.into_iter().map(|n| (n, now)));
        }
        for seen in self.claimers.values_mut() {
            seen.retain(|_, at| now.duration_since(*at) < LANE_MEMORY);
        }
        self.claimers.retain(|_, seen| !seen.is_empty());
        let slotless = s
            .per_queue
            .iter()
            .any(|(q, n)| *n as usize > s.slots.get(q).map_or(0, BTreeSet::len));
        if slotless {
            self.slotless_seen = Some(now);
        }
        self.per_queue = s.per_queue;
        self.recent.push_back((now, s.slots.clone()));
        while self.recent.len() > 2
            && self
                .recent
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > self.contest_window)
        {
            self.recent.pop_front();
        }
        let mut contested: HashMap<ObjectId, BTreeSet<u32>> = HashMap::new();
        for (_, held) in &self.recent {
            for (queue, slots) in held {
                contested.entry(*queue).or_default().extend(slots);
            }
        }
        self.contested = contested;
        self.slots = s.slots;
        self.on_node = s.on_node.max(live);
        self.read_at = Some(now);
    }

    /// A Perl node heartbeats: treat the fleet as mixed before any of its claims is seen.
    pub fn perl_nodes_live(&mut self) {
        self.slotless_seen = Some(Instant::now());
    }

    /// Whether Perl nodes claim lately: their claims hold no slot, so the slot index alone
    /// cannot keep a queue within `threads`, and a reading up to a second old is too old.
    pub fn perl_nodes_claim(&self) -> bool {
        self.slotless_seen
            .is_some_and(|t| t.elapsed() < MIXED_MEMORY)
    }

    pub fn is_stale(&self) -> bool {
        self.read_at.is_none_or(|t| t.elapsed() >= MAX_AGE)
    }

    pub fn running(&self, queue: ObjectId) -> u32 {
        self.per_queue.get(&queue).copied().unwrap_or(0)
    }

    pub fn slots(&self, queue: ObjectId) -> BTreeSet<u32> {
        self.slots.get(&queue).cloned().unwrap_or_default()
    }

    /// Slots held at any reading of the contest window, and at least of the last two.
    pub fn contested(&self, queue: ObjectId) -> BTreeSet<u32> {
        self.contested.get(&queue).cloned().unwrap_or_default()
    }

    pub fn set_sharers(
        &mut self,
        sharers: HashMap<ObjectId, Vec<String>>,
        capacity: HashMap<String, Option<u32>>,
    ) {
        self.sharers = sharers;
        self.capacity = capacity;
    }

    /// This node's lane among the nodes seen claiming from `queue` lately and the live nodes
    /// that serve it with room, each weighted by the room it can give the queue: its
    /// `maxthreads` up to the queue's `threads` (a node of unknown or no limit, `threads`).
    pub fn lane(&mut self, queue: ObjectId, threads: u32, me: &str) -> Lane {
        let capacity = &self.capacity;
        let weight = |node: &str| {
            let cap = capacity.get(node).copied().flatten();
            u64::from(cap.map_or(threads, |c| c.min(threads)))
        };
        let seen = self.claimers.get(&queue);
        let sharers = self.sharers.get(&queue);
        self.lanes.lane(
            queue,
            me,
            weight(me),
            seen.into_iter()
                .flat_map(|s| s.keys().map(String::as_str))
                .chain(sharers.into_iter().flatten().map(String::as_str))
                .map(|n| (n, weight(n))),
        )
    }

    /// This node claimed `slot`. The slot counts as seen held from now on, as if a reading
    /// had shown it: a slot borrowed from another lane whose task ends before this node's next
    /// reading must still be left to its lane's node for the window, not borrowed again.
    pub fn claimed(&mut self, queue: ObjectId, slot: u32) {
        *self.per_queue.entry(queue).or_default() += 1;
        self.slots.entry(queue).or_default().insert(slot);
        self.on_node = self.on_node.saturating_add(1);
        self.contested.entry(queue).or_default().insert(slot);
        if self.recent.is_empty() {
            self.recent.push_back((Instant::now(), HashMap::new()));
        }
        if let Some((_, held)) = self.recent.back_mut() {
            held.entry(queue).or_default().insert(slot);
        }
    }

    /// Another node holds `slot`; its task counts against the queue until the next reading.
    pub fn slot_taken(&mut self, queue: ObjectId, slot: u32) {
        if self.slots.entry(queue).or_default().insert(slot) {
            *self.per_queue.entry(queue).or_default() += 1;
        }
    }

    pub fn runner_exited(&mut self, queue: ObjectId, slot: Option<u32>) {
        if let Some(n) = self.per_queue.get_mut(&queue) {
            *n = n.saturating_sub(1);
        }
        if let (Some(slot), Some(held)) = (slot, self.slots.get_mut(&queue)) {
            held.remove(&slot);
        }
        self.on_node = self.on_node.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading in which `queue`'s held slots are `held`.
    fn reading(queue: ObjectId, held: &[u32]) -> RunningSnapshot {
        let mut s = RunningSnapshot::default();
        s.slots.insert(queue, held.iter().copied().collect());
        s
    }

    #[test]
    fn own_claims_and_exits_move_the_view() {
        let q = ObjectId::new();
        let mut v = RunningView::default();
        v.read(RunningSnapshot::default(), 0);
        assert!(!v.is_stale());
        v.claimed(q, 2);
        v.claimed(q, 0);
        assert_eq!((v.running(q), v.on_node), (2, 2));
        assert_eq!(v.slots(q), BTreeSet::from([0, 2]));
        v.runner_exited(q, Some(2));
        assert_eq!((v.running(q), v.on_node), (1, 1));
        assert_eq!(v.slots(q), BTreeSet::from([0]));
    }

    #[test]
    fn contested_slots_are_those_held_at_either_of_two_readings_or_claimed_since() {
        let q = ObjectId::new();
        let mut v = RunningView::default();
        v.read(reading(q, &[1, 2]), 0);
        v.claimed(q, 7);
        // A slot this node claims counts as seen held with the last reading.
        assert_eq!(v.contested(q), BTreeSet::from([1, 2, 7]));
        v.read(reading(q, &[2, 3]), 0);
        assert_eq!(v.contested(q), BTreeSet::from([1, 2, 3, 7]));
        v.read(reading(q, &[]), 0);
        assert_eq!(v.contested(q), BTreeSet::from([2, 3]));
        v.read(reading(q, &[]), 0);
        assert!(v.contested(q).is_empty());
    }

    #[test]
    fn within_the_contest_window_every_reading_counts() {
        let q = ObjectId::new();
        let mut v = RunningView::with_contest_window(Duration::from_secs(3600));
        v.read(reading(q, &[1]), 0);
        v.read(reading(q, &[2]), 0);
        v.read(reading(q, &[]), 0);
        v.read(reading(q, &[]), 0);
        assert_eq!(
            v.contested(q),
            BTreeSet::from([1, 2]),
            "a borrowed slot stays its owner's"
        );
    }

    #[test]
    fn a_slot_this_node_claimed_is_contested_though_no_reading_saw_it() {
        let q = ObjectId::new();
        let mut v = RunningView::with_contest_window(Duration::from_secs(3600));
        v.read(reading(q, &[]), 0);
        v.claimed(q, 3);
        v.runner_exited(q, Some(3));
        assert!(
            v.contested(q).contains(&3),
            "borrowed and ended before any reading"
        );
        v.read(reading(q, &[]), 0);
        v.read(reading(q, &[]), 0);
        assert!(v.contested(q).contains(&3), "still within the window");
    }

    #[test]
    fn a_lane_counts_this_node_and_the_others_seen() {
        let q = ObjectId::new();
        let mut s = RunningSnapshot::default();
        s.nodes.insert(q, vec!["a".into(), "c".into(), "d".into()]);
        let mut v = RunningView::default();
        v.read(s, 0);
        assert_eq!(v.lane(q, 8, "b"), Lane::striped(1, 4));
        assert_eq!(v.lane(q, 8, "c"), Lane::striped(1, 3));
        assert_eq!(v.lane(ObjectId::new(), 8, "b"), Lane::sole());
        // A node between tasks at the next reading keeps its lane.
        let mut s = RunningSnapshot::default();
        s.nodes.insert(q, vec!["a".into()]);
        v.read(s, 0);
        assert_eq!(v.lane(q, 8, "b"), Lane::striped(1, 4));
        // Forgotten once unseen for LANE_MEMORY.
        for seen in v.claimers.values_mut() {
            for at in seen.values_mut() {
                *at = Instant::now()
                    .checked_sub(LANE_MEMORY)
                    .unwrap_or_else(Instant::now);
            }
        }
        v.read(RunningSnapshot::default(), 0);
        assert_eq!(v.lane(q, 8, "b"), Lane::sole());
    }

    #[test]
    fn lanes_are_weighted_by_maxthreads_up_to_threads() {
        let q = ObjectId::new();
        let mut v = RunningView::default();
        v.set_sharers(
            HashMap::from([(q, vec!["a".into(), "b".into(), "c".into()])]),
            HashMap::from([
                ("a".into(), Some(2)),
                ("b".into(), None),
                ("c".into(), Some(100)),
            ]),
        );
        let lanes: Vec<Lane> = ["a", "b", "c"].iter().map(|n| v.lane(q, 6, n)).collect();
        let share = |l: &Lane| l.slots_below(700);
        // Weights 2, 6 (unlimited), 6 (100 capped at threads): 100, 300, 300 of 700.
        assert_eq!(lanes.iter().map(share).collect::<Vec<_>>(), [100, 300, 300]);
        // A node seen claiming but with no heartbeat weight (a Perl node) weighs `threads`.
        let mut s = RunningSnapshot::default();
        s.nodes.insert(q, vec!["perl".into()]);
        v.read(s, 0);
        assert_eq!(v.lane(q, 6, "a").slots_below(20), 2);
    }

    #[test]
    fn a_runner_still_exiting_counts_until_its_exit_is_seen() {
        let q = ObjectId::new();
        // The database no longer counts it; this process still has one live runner.
        let mut v = RunningView::default();
        v.read(RunningSnapshot::default(), 1);
        assert_eq!(v.on_node, 1);
        v.runner_exited(q, None);
        assert_eq!(v.on_node, 0);
    }

    #[test]
    fn a_slotless_claim_marks_the_fleet_mixed() {
        let q = ObjectId::new();
        let mut v = RunningView::default();
        let mut s = RunningSnapshot::default();
        s.per_queue.insert(q, 2);
        s.slots.insert(q, BTreeSet::from([0, 1]));
        v.read(s.clone(), 0);
        assert!(!v.perl_nodes_claim(), "every claim holds a slot");
        s.per_queue.insert(q, 3);
        v.read(s, 0);
        assert!(v.perl_nodes_claim());
        v.read(RunningSnapshot::default(), 0);
        assert!(v.perl_nodes_claim(), "remembered after the Perl claim ends");
    }

    #[test]
    fn a_slot_taken_elsewhere_counts_once() {
        let q = ObjectId::new();
        let mut v = RunningView::default();
        assert!(v.is_stale(), "never read");
        v.slot_taken(q, 1);
        v.slot_taken(q, 1);
        assert_eq!(v.running(q), 1);
        assert_eq!(v.on_node, 0, "not this node's");
    }
}
