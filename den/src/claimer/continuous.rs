//! Continuous queues in the claim pass: a claimer that picks an idle continuous queue makes its
//! synthetic task on the spot and claims it. The leader alone, once a maintenance pass, made
//! one task per pass, so a continuous spec beside a backlog got a fraction of its weight's
//! share (measured: 0.18–0.21 of the runs for 0.50, 0.04 at a 1 s loop interval); made
//! when picked, it runs as often as the scheduler's draw gives it the turn.
//!
//! The database's turn keeps makers apart only for an interval: with none (the default),
//! two nodes that look for live tasks before either's insert lands would both make one. So
//! a queue whose interval is under `SHARED_TURN` gets its units from the maintenance leader
//! alone, in its passes and its claims, one maker as before; longer ones from any node.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use crate::claimer::plan::QueueClaims;
use bson::oid::ObjectId;
use disbatch_model::fleet_time;
use disbatch_model::Queue;
use disbatch_store::Result;

use super::batch::BatchReport;
use super::{earliest, Claimer};
use crate::maintenance::continuous::{take_turn, ContinuousQueue, Turn};
use crate::runners::executor::Executor;

/// Shortest interval whose turn any node may take in its claims: a maker's look for live
/// tasks, turn and insert take a few round trips, far less than this.
const SHARED_TURN: std::time::Duration = std::time::Duration::from_secs(1);

/// When this node next asks for each continuous queue's turn: the database decides whose
/// turn it is, this only spares asking it when the answer is known to be no.
#[derive(Debug, Default)]
pub(super) struct TurnClock {
    waits: HashMap<ObjectId, Wait>,
    /// This node leads maintenance (as of its last maintenance pass).
    leading: bool,
}

#[derive(Debug, Clone, Copy)]
enum Wait {
    /// This node took the turn: the next is an interval later.
    Until(Instant),
    /// Another node had it (or the server refused): the next reading of the queues says
    /// when the next turn is.
    NextReading(Instant),
}

impl TurnClock {
    fn due(&self, queue: ObjectId, read_at: Instant) -> bool {
        match self.waits.get(&queue) {
            None => true,
            Some(Wait::Until(t)) => Instant::now() >= *t,
            Some(Wait::NextReading(asked)) => read_at > *asked,
        }
    }

    fn taken(&mut self, queue: ObjectId, interval: std::time::Duration) {
        let now = Instant::now();
        // An interval too long for the clock: the reading's next turn, far off, holds it.
        let wait = now
            .checked_add(interval)
            .map_or(Wait::NextReading(now), Wait::Until);
        self.waits.insert(queue, wait);
    }

    fn not_ours(&mut self, queue: ObjectId) {
        self.waits.insert(queue, Wait::NextReading(Instant::now()));
    }

    pub(super) fn retain(&mut self, queues: &HashSet<ObjectId>) {
        self.waits.retain(|q, _| queues.contains(q));
    }
}

impl Claimer {
    /// Whether this node leads maintenance: the leader makes every continuous queue's units,
    /// the others only those of queues with an interval of `SHARED_TURN` or more.
    pub fn lead(&mut self, leading: bool) {
        self.turns.leading = leading;
    }

    /// Claims up to `n` tasks of `queue`; a continuous queue found idle gets its synthetic
    /// task made now, if its turn is free, and claimed in the same pick.
    pub(super) async fn claim_or_make(
        &mut self,
        queue: &Queue,
        plan: &mut QueueClaims,
        n: u32,
        executor: &Executor,
    ) -> Result<BatchReport> {
        let first = self.claim_batch(queue, plan, n, executor).await?;
        // Held back by flow limits, or tasks found (claimed or lost to another node): not idle.
        if first.claimed > 0 || first.lost > 0 || !first.out_of_tasks || !self.turn_due(queue) {
            return Ok(first);
        }
        let q = ContinuousQueue {
            id: queue.id,
            interval: queue.spec.interval,
        };
        match take_turn(&self.store, &q).await {
            Ok(Turn::Made(made)) => {
                self.turns.taken(queue.id, q.interval);
                if made == 0 {
                    return Ok(first);
                }
            }
            Ok(Turn::Live) => return Ok(first),
            Ok(Turn::NotYours) => {
                self.turns.not_ours(queue.id);
                return Ok(first);
            }
            Err(e) => {
                let Some(why) = e.refusal() else {
                    return Err(e);
                };
                self.turns.not_ours(queue.id);
                self.report_once(format!(
                    "continuous queue {} ({}): the server refused its next task: {why}",
                    queue.name, queue.id
                ));
                return Ok(first);
            }
        }
        // The task's `_id` is this process's: it may sort before a window the empty read just
        // laid from another process's ids of the same second.
        if let Some(window) = self.windows.get_mut(&queue.id) {
            window.reset();
        }
        self.spares.forget(queue.id);
        let again = self.claim_batch(queue, plan, n, executor).await?;
        Ok(BatchReport {
            held: first.held || again.held,
            held_until: earliest(first.held_until, again.held_until),
            ..again
        })
    }

    /// Whether to ask for the queue's turn: continuous, this node one that makes its units,
    /// nothing of it claimed or running as far as this node knows, and its turn neither known
    /// to be an interval off nor refused since the last reading.
    fn turn_due(&self, queue: &Queue) -> bool {
        if !queue.spec.continuous || queue.spec.paused || self.view.running(queue.id) > 0 {
            return false;
        }
        if !self.turns.leading && queue.spec.interval < SHARED_TURN {
            return false;
        }
        let read_at = self.all_queues.0;
        if !self.turns.due(queue.id, read_at) {
            return false;
        }
        // The reading's next turn: ahead of now, asking is a write the filter refuses.
        queue
            .next_continuous()
            .is_none_or(|next| next <= fleet_time::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_taken_turn_waits_its_interval_and_a_refused_one_the_next_reading() {
        let q = ObjectId::new();
        let mut clock = TurnClock::default();
        let read = Instant::now();
        assert!(clock.due(q, read), "never asked");
        clock.taken(q, Duration::ZERO);
        assert!(clock.due(q, read), "interval 0: due again at once");
        clock.taken(q, Duration::from_secs(3600));
        assert!(!clock.due(q, read), "an interval off");
        clock.taken(q, Duration::MAX);
        assert!(
            !clock.due(q, read),
            "an interval past the clock's end is not due"
        );
        clock.not_ours(q);
        assert!(!clock.due(q, read), "a reading older than the refusal");
        assert!(clock.due(q, Instant::now() + Duration::from_millis(1)));
        clock.retain(&HashSet::new());
        assert!(clock.waits.is_empty());
    }
}
