//! Claims on a queue Perl Disbatch nodes also claim from: counted just before, checked
//! just after, and given back when a Perl claim may have landed first.
//!
//! A Perl node counts a queue's running tasks and then claims, with no slot for an index to
//! refuse, so no claim of ours can be made atomic with its count. Ours is made visible
//! first and checked after: a Perl count after our claim sees it, and a Perl claim that
//! landed between our count and our claim shows in our check as a task that arrived.

use crate::claimer::plan::{slot_bound_beside, QueueClaims};
use bson::oid::ObjectId;
use disbatch_model::task::ClaimedTask;
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{Pick, QueueRunning};

use super::Claimer;

impl Claimer {
    /// How many of `n` claims `queue` has room for as its running tasks stand now, Perl
    /// nodes' slotless ones included, with that reading; the plan keeps only slots below
    /// `threads` less those claims, so nodes of ours claiming at once still cannot, together,
    /// pass the cap (the slot index refuses the second claim of a slot).
    pub(super) async fn room_beside_perl_claims(
        &mut self,
        queue: &Queue,
        plan: &mut QueueClaims,
        n: usize,
    ) -> Result<(usize, QueueRunning)> {
        let now = self.store.claims().queue_running(queue.id).await?;
        let threads = self
            .servable
            .iter()
            .find(|q| q.queue.id == queue.id)
            .map_or(0, |q| q.threads);
        let bound = slot_bound_beside(threads, now.slotless, &now.slots);
        plan.slots.retain(|s| *s < bound && !now.slots.contains(s));
        let room = threads.saturating_sub(now.running) as usize;
        Ok((n.min(room).min(plan.slots.len()), now))
    }

    /// Counts `queue` again after claiming `claimed` and gives back, before any runner
    /// starts, as many of them as could have landed with the queue already at `threads`;
    /// returns how many. Every task that arrived since `before` is taken to have landed
    /// ahead of ours, and none that left is credited: the server's order of the writes is
    /// not visible, so this may give back a claim that was within the cap, never keep one
    /// that was not. Their runners never start, whether or not the give-back lands.
    pub(super) async fn give_back_claims_past_cap(
        &mut self,
        queue: &Queue,
        threads: u32,
        before: &QueueRunning,
        claimed: &mut Vec<(Box<ClaimedTask>, Pick)>,
    ) -> Result<u32> {
        if claimed.is_empty() {
            return Ok(0);
        }
        let after = self.store.claims().queue_running(queue.id).await?;
        let ours: Vec<ObjectId> = claimed.iter().map(|(t, _)| t.id).collect();
        let excess = claims_past_cap(threads, before, &after, &ours);
        if excess == 0 {
            return Ok(0);
        }
        let arrived = arrivals(before, &after, &ours);
        let mut given_back = 0;
        for (task, pick) in claimed.split_off(claimed.len() - excess) {
            if self
                .store
                .claims()
                .give_back_attempt(task.id, pick.attempt, &task.raw)
                .await?
            {
                given_back += 1;
            }
            self.view.runner_exited(queue.id, Some(pick.slot));
        }
        self.metrics.claims_given_back(&queue.name, given_back);
        tracing::info!(
            queue = %queue.name,
            given_back,
            running_before = before.running,
            arrived,
            threads,
            "gave claims back: other nodes' claims (Perl nodes count, then claim) arrived between our count and our claims, and with them ours could pass the queue's threads"
        );
        Ok(excess as u32)
    }
}

/// Tasks running at `after` that were not at `before` and are not `ours`.
fn arrivals(before: &QueueRunning, after: &QueueRunning, ours: &[ObjectId]) -> usize {
    after
        .ids
        .iter()
        .filter(|id| !before.ids.contains(id) && !ours.contains(id))
        .count()
}

/// How many of `ours` (claimed after `before` was read) must go back so that, whatever order
/// the server applied them in beside the tasks that arrived by `after`, none of those kept
/// landed with `threads` already running.
pub(crate) fn claims_past_cap(
    threads: u32,
    before: &QueueRunning,
    after: &QueueRunning,
    ours: &[ObjectId],
) -> usize {
    let at_most = before.running as usize + arrivals(before, after, ours) + ours.len();
    at_most.saturating_sub(threads as usize).min(ours.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(ids: &[ObjectId]) -> QueueRunning {
        QueueRunning {
            running: ids.len() as u32,
            ids: ids.iter().copied().collect(),
            ..QueueRunning::default()
        }
    }

    fn ids(n: usize) -> Vec<ObjectId> {
        (0..n).map(|_| ObjectId::new()).collect()
    }

    #[test]
    fn claims_within_the_cap_are_kept() {
        let old = ids(4);
        let ours = ids(2);
        let after = reading(&[old.clone(), ours.clone()].concat());
        assert_eq!(claims_past_cap(6, &reading(&old), &after, &ours), 0);
    }

    #[test]
    fn a_perl_claim_that_arrived_between_sends_ours_back() {
        let old = ids(5);
        let perl = ids(1);
        let ours = ids(1);
        let after = reading(&[old.clone(), perl, ours.clone()].concat());
        assert_eq!(claims_past_cap(6, &reading(&old), &after, &ours), 1);
    }

    #[test]
    fn a_task_that_left_meanwhile_does_not_hide_the_arrival() {
        // Ours may have landed at 7 before the task left: the order is unknown.
        let old = ids(5);
        let perl = ids(1);
        let ours = ids(1);
        let after = reading(&[old[1..].to_vec(), perl, ours.clone()].concat());
        assert_eq!(after.running, 6);
        assert_eq!(claims_past_cap(6, &reading(&old), &after, &ours), 1);
    }

    #[test]
    fn never_more_than_ours_go_back() {
        let old = ids(6);
        let perl = ids(3);
        let ours = ids(2);
        let after = reading(&[old.clone(), perl, ours.clone()].concat());
        assert_eq!(claims_past_cap(6, &reading(&old), &after, &ours), 2);
        assert_eq!(claims_past_cap(6, &reading(&old), &after, &[]), 0);
    }
}
