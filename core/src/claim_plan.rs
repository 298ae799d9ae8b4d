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
pub fn plan_claims<R: Rng + ?Sized>(queues: &[QueueState], rng: &mut R) -> Vec<QueueClaims> {
    queues
        .iter()
        .filter_map(|q| {
            let mut slots: Vec<u32> = (0..q.threads)
                .filter(|s| !q.held_slots.contains(s))
                .collect();
            let by_count = q.threads.saturating_sub(q.running);
            let wanted = by_count.min(slots.len() as u32);
            if wanted == 0 {
                return None;
            }
            slots.shuffle(rng);
            Some(QueueClaims {
                queue: q.id,
                wanted,
                slots,
            })
        })
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
        let plan = plan_claims(&qs, &mut rng);
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
        let plan = plan_claims(&[queue(2, 3, &[3, 4, 5])], &mut rng);
        assert!(plan.is_empty());
    }

    #[test]
    fn node_room_honours_maxthreads() {
        assert_eq!(node_room(None, 50), u32::MAX);
        assert_eq!(node_room(Some(2), 0), 2);
        assert_eq!(node_room(Some(2), 5), 0);
    }
}
