//! Per-pass claim decisions: how many tasks each queue may take, which slots to try and which
//! of the tasks read to claim. Nodes claiming from one queue keep to lanes of their own
//! (their share of the slots and candidates), so they rarely reach for the same slot or task.

use std::collections::BTreeSet;

use bson::oid::ObjectId;
use rand::seq::SliceRandom;
use rand::Rng;

pub use crate::claimer::lanes::Lane;

/// One queue's state at the start of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    pub id: ObjectId,
    /// The global cap (`threads`).
    pub threads: u32,
    /// Claimed or running tasks on every node, including Perl nodes' slotless ones.
    pub running: u32,
    pub held_slots: BTreeSet<u32>,
    pub lane: Lane,
    /// Slots held at either of the last two readings. A node sharing the queue tries another
    /// lane's slot only if it is in none of them: free for a second and more, its node is not
    /// using it, while a slot that was just freed is likely taken again by its own node by
    /// now (a refused slot costs the database a write).
    pub contested: BTreeSet<u32>,
}

/// What the claimer may try for one queue this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClaims {
    pub queue: ObjectId,
    /// Most tasks to claim.
    pub wanted: u32,
    /// Free slots, in the order to try them (popped from the end): this node's lane first,
    /// each part in random order. A slot another node takes first costs one refused claim.
    pub slots: Vec<u32>,
}

/// Plans claims for queues that have room; which queue goes first is the scheduler's call.
/// At most `most` slots are planned per queue, so a queue whose `threads` runs to millions
/// costs a pass no more than one that fits the node.
pub fn plan_claims<R: Rng + ?Sized>(
    queues: &[QueueState],
    most: u32,
    rng: &mut R,
) -> Vec<QueueClaims> {
    queues
        .iter()
        .filter_map(|q| {
            let by_count = q.threads.saturating_sub(q.running);
            let slots = Slots {
                threads: q.threads,
                held: &q.held_slots,
                contested: &q.contested,
                lane: &q.lane,
            };
            let usable = slots.usable_count();
            // Other lanes' slots only once its own are full: a node that can still grow in its
            // lane leaves the others to their nodes.
            let own_free = slots.own_free();
            let reach = if own_free > 0 { own_free } else { usable };
            let wanted = by_count.min(reach).min(most);
            if wanted == 0 {
                return None;
            }
            // Spare usable slots beyond `wanted`: a slot another node took is replaced at once.
            Some(QueueClaims {
                queue: q.id,
                wanted,
                slots: slots.pick(usable.min(most), rng),
            })
        })
        .collect()
}

/// A queue's slots as one node may use them: free ones of its lane, and free ones of other
/// lanes that no reading lately saw held.
struct Slots<'a> {
    threads: u32,
    held: &'a BTreeSet<u32>,
    contested: &'a BTreeSet<u32>,
    lane: &'a Lane,
}

impl Slots<'_> {
    fn usable(&self, s: u32) -> bool {
        s < self.threads
            && !self.held.contains(&s)
            && (self.lane.owns(u64::from(s)) || !self.contested.contains(&s))
    }

    /// Free slots of this node's lane.
    fn own_free(&self) -> u32 {
        let lane = self.lane;
        let stripe = lane.slots_below(self.threads);
        let held = self
            .held
            .range(..self.threads)
            .filter(|s| lane.owns(u64::from(**s)))
            .count() as u64;
        u32::try_from(stripe.saturating_sub(held)).unwrap_or(u32::MAX)
    }

    fn usable_count(&self) -> u32 {
        let held = self.held.range(..self.threads).count();
        let shunned = self
            .contested
            .range(..self.threads)
            .filter(|s| !self.held.contains(s) && !self.lane.owns(u64::from(**s)))
            .count();
        let taken = u32::try_from(held + shunned).unwrap_or(u32::MAX);
        self.threads.saturating_sub(taken)
    }

    /// `n` distinct usable slots, to be popped from the end: the lane's last (so first), each
    /// part in random order. `n` must not exceed the usable count.
    fn pick<R: Rng + ?Sized>(&self, n: u32, rng: &mut R) -> Vec<u32> {
        let usable = self.usable_count();
        if usable <= n.saturating_mul(4).max(1024) {
            let (mut own, mut other): (Vec<u32>, Vec<u32>) = (0..self.threads)
                .filter(|s| self.usable(*s))
                .partition(|s| self.lane.owns(u64::from(*s)));
            own.shuffle(rng);
            other.shuffle(rng);
            own.truncate(n as usize);
            other.truncate((n as usize).saturating_sub(own.len()));
            other.extend(own);
            return other;
        }
        // Mostly usable: draw until `n` distinct ones (each draw succeeds with odds > 3/4),
        // from the lane's stripe while it has them.
        let lane = self.lane;
        let stripe = lane.slots_below(self.threads);
        let mut chosen = BTreeSet::new();
        let mut slots = Vec::with_capacity(n as usize);
        let mut misses = 0usize;
        while slots.len() < n as usize {
            let s = if misses < 4 * n as usize && stripe > 0 {
                let k = rng.random_range(0..stripe);
                lane.nth_slot(k)
                    .and_then(|s| u32::try_from(s).ok())
                    .unwrap_or(0)
            } else {
                rng.random_range(0..self.threads)
            };
            if self.usable(s) && chosen.insert(s) {
                slots.push(s);
            } else {
                misses += 1;
            }
        }
        slots.reverse();
        slots
    }
}

/// Which of `candidates` (read `lane.spread()` per task wanted, in claim order) this node claims:
/// those whose `key` falls in its lane first, then any others, `n` in all, kept in claim
/// order. The key is the task's own (its id), not its place in a read, so nodes whose reads
/// of the head differ still reach for different tasks.
pub fn lane_picks<T>(candidates: Vec<T>, n: usize, lane: &Lane, key: impl Fn(&T) -> u64) -> Vec<T> {
    lane_split(candidates, n, lane, key).0
}

/// As `lane_picks`, with the candidates not picked as well (in their order).
pub fn lane_split<T>(
    candidates: Vec<T>,
    n: usize,
    lane: &Lane,
    key: impl Fn(&T) -> u64,
) -> (Vec<T>, Vec<T>) {
    if candidates.len() <= n {
        return (candidates, Vec::new());
    }
    let owned: Vec<bool> = candidates.iter().map(|c| lane.owns(key(c))).collect();
    let own = (0..candidates.len()).filter(|i| owned[*i]);
    let other = (0..candidates.len()).filter(|i| !owned[*i]);
    let mut chosen: Vec<usize> = own.chain(other).take(n).collect();
    chosen.sort_unstable();
    let mut chosen = chosen.into_iter().peekable();
    let (mut picked, mut rest) = (Vec::with_capacity(n), Vec::new());
    for (i, c) in candidates.into_iter().enumerate() {
        match chosen.next_if_eq(&i) {
            Some(_) => picked.push(c),
            None => rest.push(c),
        }
    }
    (picked, rest)
}

/// The slots below which a node may claim in a queue where `slotless` claims (Perl nodes')
/// hold no slot: the largest bound `b` such that `b` slots plus those held at or above it
/// fit in `threads - slotless`. Nodes of ours that claim at once then hold, together, no
/// more than that, however their claims interleave: each new claim needs a free slot below
/// `b`, and the slot index lets one claim hold each.
pub fn slot_bound_beside(threads: u32, slotless: u32, held: &BTreeSet<u32>) -> u32 {
    let cap = threads.saturating_sub(slotless);
    (0..=cap)
        .rev()
        .find(|b| b + held.range(b..).count() as u32 <= cap)
        .unwrap_or(0)
}

/// How many more tasks the node may start under its `maxthreads` (None = unlimited).
pub fn node_room(maxthreads: Option<u32>, running_on_node: u32) -> u32 {
    match maxthreads {
        None => u32::MAX,
        Some(max) => max.saturating_sub(running_on_node),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn queue(threads: u32, running: u32, held: &[u32]) -> QueueState {
        QueueState {
            id: ObjectId::new(),
            threads,
            running,
            held_slots: held.iter().copied().collect(),
            lane: Lane::sole(),
            contested: BTreeSet::new(),
        }
    }

    #[test]
    fn wanted_is_bounded_by_threads_running_and_free_slots() {
        let mut rng = StdRng::seed_from_u64(7);
        let qs = [
            queue(3, 1, &[0]),
            queue(0, 0, &[]),
            queue(2, 2, &[0, 1]),
            queue(4, 3, &[]),
        ];
        let plan = plan_claims(&qs, u32::MAX, &mut rng);
        assert_eq!(plan.len(), 2, "paused and full queues are left out");
        assert_eq!(plan[0].queue, qs[0].id);
        assert_eq!(plan[0].wanted, 2);
        let mut slots = plan[0].slots.clone();
        slots.sort();
        assert_eq!(slots, vec![1, 2]);
        // Slotless (Perl-claimed) running tasks still count against threads.
        assert_eq!(plan[1].wanted, 1);
        assert_eq!(plan[1].slots.len(), 4);
    }

    #[test]
    fn slots_held_beyond_a_lowered_threads_leave_no_room() {
        let mut rng = StdRng::seed_from_u64(1);
        // threads lowered from 6 to 2 while slots 3,4,5 still run: count says full.
        let plan = plan_claims(&[queue(2, 3, &[3, 4, 5])], u32::MAX, &mut rng);
        assert!(plan.is_empty());
    }

    #[test]
    fn huge_threads_plan_only_what_a_pass_can_use() {
        let mut rng = StdRng::seed_from_u64(3);
        let plan = plan_claims(&[queue(u32::MAX, 5, &[0, 7, 9])], 256, &mut rng);
        assert_eq!(plan[0].wanted, 256);
        assert_eq!(plan[0].slots.len(), 256);
        let distinct: BTreeSet<u32> = plan[0].slots.iter().copied().collect();
        assert_eq!(distinct.len(), 256, "slots are distinct");
        assert!(
            distinct.iter().all(|s| ![0, 7, 9].contains(s)),
            "held slots are skipped"
        );
        // Nearly full: every free slot is found, none twice.
        let held: Vec<u32> = (0..2000).filter(|s| s % 1000 != 0).collect();
        let plan = plan_claims(&[queue(2000, 1998, &held)], 256, &mut rng);
        let mut slots = plan[0].slots.clone();
        slots.sort();
        assert_eq!(slots, vec![0, 1000]);
    }

    #[test]
    fn slots_beside_perl_claims_leave_room_for_slots_held_high() {
        let held = |s: &[u32]| s.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(slot_bound_beside(6, 0, &held(&[])), 6);
        assert_eq!(slot_bound_beside(6, 2, &held(&[])), 4);
        // Two Perl claims, ours hold 0, 4 and 5: only slot 1 may still be taken (3 + 1 = 4).
        assert_eq!(slot_bound_beside(6, 2, &held(&[0, 4, 5])), 2);
        // Held high slots alone fill what is left: nothing below 0.
        assert_eq!(slot_bound_beside(6, 3, &held(&[3, 4, 5])), 0);
        assert_eq!(slot_bound_beside(6, 9, &held(&[0])), 0);
        // Every bound keeps held + new within threads - slotless, for any claims below it.
        for slotless in 0..6 {
            for mask in 0u32..64 {
                let h: BTreeSet<u32> = (0..6).filter(|s| mask & (1 << s) != 0).collect();
                let b = slot_bound_beside(6, slotless, &h);
                let most = h.len() as u32 + (0..b).filter(|s| !h.contains(s)).count() as u32;
                let cap = 6u32.saturating_sub(slotless);
                assert!(most <= cap.max(h.len() as u32), "{h:?} {slotless} {b}");
            }
        }
    }

    #[test]
    fn lanes_are_agreed_from_the_nodes_seen() {
        let equal =
            |me: &str, seen: &[&'static str]| Lane::weighted(me, 1, seen.iter().map(|n| (*n, 1)));
        assert_eq!(equal("b", &["a", "c"]), Lane::striped(1, 3));
        assert_eq!(equal("b", &["b", "a"]), Lane::striped(1, 2));
        assert_eq!(equal("a", &[]), Lane::sole());
        // Every node of a set gets its own lane.
        let nodes = ["n3", "n1", "n2", "n4"];
        let lanes: Vec<Lane> = nodes.iter().map(|me| equal(me, &nodes)).collect();
        for s in 0..16u64 {
            assert_eq!(lanes.iter().filter(|l| l.owns(s)).count(), 1, "slot {s}");
        }
        assert_eq!(lanes[1], Lane::striped(0, 4), "n1 is first by name");
    }

    #[test]
    fn picks_keep_to_the_lane_and_to_claim_order() {
        let lane = Lane::striped(1, 3);
        let key = |c: &u32| u64::from(*c);
        assert_eq!(lane_picks(vec![1, 2, 3], 5, &lane, key), vec![1, 2, 3]);
        assert_eq!(
            lane_picks((0..12).collect(), 4, &lane, key),
            vec![1, 4, 7, 10]
        );
        // Too few in the lane: the rest comes from the others, still in claim order.
        assert_eq!(
            lane_picks((0..6).collect(), 4, &lane, key),
            vec![0, 1, 2, 4]
        );
        assert_eq!(
            lane_picks((0..10).collect(), 3, &Lane::sole(), key),
            vec![0, 1, 2]
        );
        // Nodes of one set pick disjoint tasks even when their reads differ.
        let all: Vec<Vec<u32>> = (0..4)
            .map(|index| {
                let read: Vec<u32> = (index..index + 40).collect();
                lane_picks(read, 8, &Lane::striped(index, 4), key)
            })
            .collect();
        let union: BTreeSet<u32> = all.iter().flatten().copied().collect();
        assert_eq!(union.len(), 32);
        assert!(lane_picks(Vec::<u32>::new(), 3, &lane, key).is_empty());
        // What is not picked is left over, in claim order.
        assert_eq!(
            lane_split((0..8).collect(), 3, &lane, key),
            (vec![1, 4, 7], vec![0, 2, 3, 5, 6])
        );
        assert_eq!(lane_split(vec![1, 2], 3, &lane, key), (vec![1, 2], vec![]));
    }

    #[test]
    fn slots_are_tried_in_the_lane_first() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut q = queue(12, 0, &[4]);
        q.lane = Lane::striped(1, 3);
        let plan = plan_claims(&[q.clone()], 100, &mut rng);
        let order: Vec<u32> = plan[0].slots.iter().rev().copied().collect();
        let (first, rest) = order.split_at(3);
        let mut first = first.to_vec();
        first.sort();
        assert_eq!(first, vec![1, 7, 10], "the lane's free slots first");
        assert!(rest.iter().all(|s| s % 3 != 1), "{rest:?}");
        // Another lane's slot held at a recent reading is left to its node.
        let mut shared = queue(12, 4, &[1, 4, 7, 10]);
        shared.lane = Lane::striped(1, 3);
        shared.contested = BTreeSet::from([0, 2, 3, 5, 6, 8, 9, 1, 40]);
        let plan = plan_claims(&[shared.clone()], 100, &mut rng);
        let mut slots = plan[0].slots.clone();
        slots.sort();
        assert_eq!(
            slots,
            vec![11],
            "free at the last two readings: unused by its node"
        );
        assert_eq!(plan[0].wanted, 1);
        shared.contested.insert(11);
        assert!(
            plan_claims(&[shared], 100, &mut rng).is_empty(),
            "nothing usable"
        );
        // Its own lane's slots are usable whatever the readings said, and while it has free
        // ones, a node takes no more than those.
        let mut own = queue(6, 0, &[]);
        own.lane = Lane::striped(0, 2);
        own.contested = (0..6).collect();
        let plan = plan_claims(&[own.clone()], 100, &mut rng);
        let mut slots = plan[0].slots.clone();
        slots.sort();
        assert_eq!(slots, vec![0, 2, 4]);
        own.contested.clear();
        assert_eq!(plan_claims(&[own], 100, &mut rng)[0].wanted, 3);
        let slots = |threads, held: &[u32], lane| {
            let held: BTreeSet<u32> = held.iter().copied().collect();
            let none = BTreeSet::new();
            Slots {
                threads,
                held: &held,
                contested: &none,
                lane: &lane,
            }
            .own_free()
        };
        assert_eq!(slots(12, &[], Lane::striped(2, 5)), 2);
        // Slots 3, 7, … below u32::MAX: 2^30 − 1 of them, one held.
        assert_eq!(slots(u32::MAX, &[3], Lane::striped(3, 4)), (1 << 30) - 2);
        // A huge queue draws from its lane too.
        q.threads = u32::MAX;
        let plan = plan_claims(&[q], 64, &mut rng);
        assert_eq!(plan[0].slots.len(), 64);
        assert!(
            plan[0].slots.iter().all(|s| s % 3 == 1),
            "{:?}",
            plan[0].slots
        );
    }

    #[test]
    fn node_room_honours_maxthreads() {
        assert_eq!(node_room(None, 50), u32::MAX);
        assert_eq!(node_room(Some(2), 0), 2);
        assert_eq!(node_room(Some(2), 5), 0);
    }
}
