//! The claimer's view of running tasks between database readings: the last snapshot, moved
//! forward by this node's own claims and runner exits, and read again at least every second.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_core::store::RunningSnapshot;

/// Past this age the view is read again even without a maintenance pass: other nodes' claims
/// and exits only show up in a reading.
const MAX_AGE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default)]
pub struct RunningView {
    per_queue: HashMap<ObjectId, u32>,
    slots: HashMap<ObjectId, BTreeSet<u32>>,
    other_nodes: HashMap<ObjectId, u32>,
    pub on_node: u32,
    read_at: Option<Instant>,
}

impl RunningView {
    /// `live` is how many runners this process has not yet seen exit: one may have written
    /// its result (so the snapshot no longer counts it) and still be exiting; its exit will
    /// be subtracted later, so the node count must include it now or run over `maxthreads`.
    pub fn from_snapshot(s: RunningSnapshot, live: u32) -> Self {
        RunningView {
            per_queue: s.per_queue,
            slots: s.slots,
            other_nodes: s.other_nodes,
            on_node: s.on_node.max(live),
            read_at: Some(Instant::now()),
        }
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

    /// How many nodes, this one included, were claiming from `queue` at the last reading.
    pub fn claimers(&self, queue: ObjectId) -> u32 {
        self.other_nodes
            .get(&queue)
            .copied()
            .unwrap_or(0)
            .saturating_add(1)
    }

    pub fn claimed(&mut self, queue: ObjectId, slot: u32) {
        *self.per_queue.entry(queue).or_default() += 1;
        self.slots.entry(queue).or_default().insert(slot);
        self.on_node = self.on_node.saturating_add(1);
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

    #[test]
    fn own_claims_and_exits_move_the_view() {
        let q = ObjectId::new();
        let mut v = RunningView::from_snapshot(RunningSnapshot::default(), 0);
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
    fn claimers_count_this_node_and_the_others_seen() {
        let q = ObjectId::new();
        let mut s = RunningSnapshot::default();
        s.other_nodes.insert(q, 3);
        let v = RunningView::from_snapshot(s, 0);
        assert_eq!(v.claimers(q), 4);
        assert_eq!(v.claimers(ObjectId::new()), 1);
    }

    #[test]
    fn a_runner_still_exiting_counts_until_its_exit_is_seen() {
        let q = ObjectId::new();
        // The database no longer counts it; this process still has one live runner.
        let mut v = RunningView::from_snapshot(RunningSnapshot::default(), 1);
        assert_eq!(v.on_node, 1);
        v.runner_exited(q, None);
        assert_eq!(v.on_node, 0);
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
