//! Per-pass claim decisions: how many tasks each queue may take and which slots to try.

use std::collections::BTreeSet;

use bson::oid::ObjectId;
use rand::seq::SliceRandom;
use rand::Rng;

/// One queue's state at the start of a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueState {
    pub id: ObjectId,
    /// The global cap (`threads`).
    pub threads: u32,
    /// Claimed or running tasks on every node, including Perl nodes' slotless ones.
    pub running: u32,
    pub held_slots: BTreeSet<u32>,
}

/// What the claimer may try for one queue this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClaims {
    pub queue: ObjectId,
    /// Most tasks to claim.
    pub wanted: u32,
    /// Free slots, in the order to try them. A slot another node takes first costs one
    /// refused claim, so nodes try free slots in different (random) orders.
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
            let free = q
                .threads
                .saturating_sub(held_below(&q.held_slots, q.threads));
            let wanted = by_count.min(free).min(most);
            if wanted == 0 {
                return None;
            }
            // Spare free slots beyond `wanted`: a slot another node took is replaced at once.
            Some(QueueClaims {
                queue: q.id,
                wanted,
                slots: free_slots(q.threads, &q.held_slots, free.min(most), rng),
            })
        })
        .collect()
}

/// How many held slots lie below `threads` (slots above it are left from a lowered limit).
fn held_below(held: &BTreeSet<u32>, threads: u32) -> u32 {
    u32::try_from(held.range(..threads).count()).unwrap_or(u32::MAX)
}

/// `n` distinct free slots below `threads`, in random order; `n` must not exceed the free count.
fn free_slots<R: Rng + ?Sized>(
    threads: u32,
    held: &BTreeSet<u32>,
    n: u32,
    rng: &mut R,
) -> Vec<u32> {
    let free = threads.saturating_sub(held_below(held, threads));
    if free <= n.saturating_mul(4).max(1024) {
        let mut slots: Vec<u32> = (0..threads).filter(|s| !held.contains(s)).collect();
        slots.shuffle(rng);
        slots.truncate(n as usize);
        return slots;
    }
    // Mostly free: draw until `n` distinct free ones (each draw succeeds with odds > 3/4).
    let mut chosen = BTreeSet::new();
    let mut slots = Vec::with_capacity(n as usize);
    while slots.len() < n as usize {
        let s = rng.random_range(0..threads);
        if !held.contains(&s) && chosen.insert(s) {
            slots.push(s);
        }
    }
    slots
}

/// Which of `candidates` (read `spread` per task wanted, in claim order) this node claims:
/// `n` of them at random, kept in claim order. Nodes reading the same head then mostly claim
/// different tasks instead of all racing for the first ones; alone, a node takes the first `n`.
pub fn spread_picks<T, R: Rng + ?Sized>(candidates: Vec<T>, n: usize, rng: &mut R) -> Vec<T> {
    if candidates.len() <= n {
        return candidates;
    }
    let mut chosen = rand::seq::index::sample(rng, candidates.len(), n).into_vec();
    chosen.sort_unstable();
    let mut chosen = chosen.into_iter().peekable();
    candidates
        .into_iter()
        .enumerate()
        .filter_map(|(i, c)| chosen.next_if_eq(&i).map(|_| c))
        .collect()
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
    fn picks_spread_over_the_candidates_in_claim_order() {
        let mut rng = StdRng::seed_from_u64(11);
        assert_eq!(spread_picks(vec![1, 2, 3], 5, &mut rng), vec![1, 2, 3]);
        assert_eq!(spread_picks(vec![1, 2, 3], 3, &mut rng), vec![1, 2, 3]);
        let mut seen = BTreeSet::new();
        for _ in 0..200 {
            let picks = spread_picks((0..32).collect::<Vec<u32>>(), 8, &mut rng);
            assert_eq!(picks.len(), 8);
            assert!(
                picks.windows(2).all(|w| w[0] < w[1]),
                "in order, distinct: {picks:?}"
            );
            seen.extend(picks);
        }
        assert_eq!(seen.len(), 32, "every candidate can be picked");
        assert!(spread_picks(Vec::<u32>::new(), 3, &mut rng).is_empty());
    }

    #[test]
    fn node_room_honours_maxthreads() {
        assert_eq!(node_room(None, 50), u32::MAX);
        assert_eq!(node_room(Some(2), 0), 2);
        assert_eq!(node_room(Some(2), 5), 0);
    }
}
