//! One queue's batch: its candidates read (or taken from the spares of the last read), picked
//! by lane, claimed together and handed to runners.

use std::time::Instant;

use crate::claimer::plan::{lane_split, QueueClaims};
use bson::oid::ObjectId;
use bson::Document;
use disbatch_model::fleet_time;
use disbatch_model::task::ClaimedTask;
use disbatch_model::wire::handoff::Handoff;
use disbatch_model::{Queue, QueueSort};
use disbatch_store::Result;
use disbatch_store::{
    claim_key, last_signal, Candidates, Exclusions, Pick, PickHolds, PickOutcome, SkipReason,
};

use super::limits::BeforeRead;
use super::{earliest, spare, Claimer, MAX_CANDIDATES};
use crate::runners::executor::Executor;

/// What one queue's batch did.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct BatchReport {
    pub(super) claimed: u32,
    /// Picks another node took first (the task or the slot).
    pub(super) lost: u32,
    /// Fewer claimable tasks than wanted.
    pub(super) ran_dry: bool,
    /// Fewer claimable tasks than there was room for (not fewer slots).
    pub(super) out_of_tasks: bool,
    /// A runner could not be started; the batch's unstarted tasks were given back.
    pub(super) spawn_failed: bool,
    /// The queue's flow limits held tasks back, or left some out of the read: the node
    /// reads again every pass, not at an idle node's pace.
    pub(super) held: bool,
    /// When the first of them may start (a rate-limit window frees), if known.
    pub(super) held_until: Option<Instant>,
    /// Tasks were held back by a window that filled during this batch: a read now leaves
    /// that partition out and may find others', so the queue is worth another round.
    pub(super) fresh_exclusions: bool,
}

impl Claimer {
    /// Claims up to `n` tasks of `queue` in one batch and starts their runners.
    pub(super) async fn claim_batch(
        &mut self,
        queue: &Queue,
        plan: &mut QueueClaims,
        n: u32,
        executor: &Executor,
    ) -> Result<BatchReport> {
        let mut report = BatchReport::default();
        let n = n.min(plan.slots.len() as u32) as usize;
        if n == 0 {
            report.ran_dry = true;
            return Ok(report);
        }
        let asked = Instant::now();
        if self
            .empty
            .still_empty(queue.id, last_signal(&queue.raw), asked)
        {
            report.ran_dry = true;
            report.out_of_tasks = true;
            self.metrics.claim_missed(&queue.name, "known_empty");
            return Ok(report);
        }
        let threads = self
            .servable
            .iter()
            .find(|q| q.queue.id == queue.id)
            .map_or(0, |q| q.threads);
        let lane = self.view.lane(queue.id, threads, &self.node);
        let limits = match queue.limits.limits_claims() {
            true => Some(self.limits_before_read(queue).await?),
            false => None,
        };
        if let Some(limits) = &limits {
            report.held = limits.left_out.is_some() || limits.blocked_until.is_some();
            report.held_until = limits.blocked_until.or(limits.frees_at);
        }
        if limits.as_ref().is_some_and(|l| l.blocked_until.is_some()) {
            report.ran_dry = true;
            return Ok(report);
        }
        let left_out = limits.as_ref().and_then(|l| l.left_out.clone());
        let read = n
            .saturating_mul(lane.spread() as usize)
            .min(MAX_CANDIDATES)
            .max(n);
        // Queues claimed in `_id` order keep what a read found beyond the batch: tasks
        // queued since come after them, and one queued again resets them with the window.
        // While a limited queue's read leaves partitions or keys out, spares read before may
        // be of one that filled up since: read afresh. (Otherwise a spare that cannot start
        // now is held back when the batch asks its limits, as a read one would be.)
        let in_id_order = matches!(queue.sort, QueueSort::Fifo | QueueSort::Default);
        let keep_spares = in_id_order && left_out.is_none();
        if left_out.is_some() {
            self.spares.forget(queue.id);
        }
        let lane_nodes = lane.nodes() as usize;
        let (candidates, read_at) = self
            .candidates(queue, n, read, lane_nodes, keep_spares, left_out.as_ref())
            .await?;
        report.ran_dry = candidates.len() < n;
        report.out_of_tasks = report.ran_dry;
        let before = match self.view.perl_nodes_claim() {
            // Counted last, just before the claims: the window for a Perl claim to slip in
            // between is one round trip, not the age of the last reading.
            true => Some(self.room_beside_perl_claims(queue, plan, n).await?),
            false => None,
        };
        let n = before.as_ref().map_or(n, |(room, _)| *room);
        if n == 0 {
            self.metrics.claim_missed(&queue.name, "full");
            return Ok(report);
        }
        let (chosen, rest) = lane_split(candidates, n, &lane, claim_key);
        if keep_spares {
            // Only this node's lane: another's tasks are the ones its node is claiming.
            let own: Vec<_> = rest
                .into_iter()
                .filter(|t| lane.owns(claim_key(t)))
                .collect();
            self.spares.keep(queue.id, own, read_at);
        }
        let picks = self
            .pick(queue, plan, limits.as_ref(), chosen, &mut report)
            .await?;
        if picks.is_empty() {
            self.metrics.claim_missed(&queue.name, "empty");
            return Ok(report);
        }
        let outcomes = self
            .store
            .claims()
            .claim_picks(&self.node, queue.run.lease, &picks)
            .await?;
        let mut claimed = self
            .take_outcomes(queue, plan, picks, outcomes, asked.elapsed(), &mut report)
            .await?;
        if let Some((_, before)) = &before {
            report.claimed -= self
                .give_back_claims_past_cap(queue, threads, before, &mut claimed)
                .await?;
        }
        self.hand_to_runners(queue, claimed, executor, &mut report)
            .await?;
        Ok(report)
    }

    /// Up to `n` tasks of `queue` to pick from (`read` of them when read afresh), with when
    /// they were read: the spares of the last read when it kept some, else a read; tasks whose
    /// documents cannot be decoded are marked unrunnable and left out.
    async fn candidates(
        &mut self,
        queue: &Queue,
        n: usize,
        read: usize,
        lane_nodes: usize,
        keep_spares: bool,
        left_out: Option<&Exclusions>,
    ) -> Result<(Vec<Document>, Instant)> {
        let in_id_order = matches!(queue.sort, QueueSort::Fifo | QueueSort::Default);
        let spares = match keep_spares {
            true => self.spares.take(queue.id, n),
            false => None,
        };
        let (mut found, read_at) = match spares {
            Some((tasks, read_at)) => (
                Candidates {
                    tasks,
                    unreadable: Vec::new(),
                },
                read_at,
            ),
            None => {
                let read = match in_id_order {
                    true => read.clamp(spare::READ_AT_LEAST, MAX_CANDIDATES),
                    false => read,
                };
                let read_at = Instant::now();
                let found = self.read_candidates(queue, read, lane_nodes, left_out, read_at);
                (found.await?, read_at)
            }
        };
        for (id, why) in std::mem::take(&mut found.unreadable) {
            let why = format!("its document cannot be decoded: {why}");
            self.set_unrunnable(id, SkipReason::Undecodable, &why)
                .await?;
        }
        Ok((found.without(&self.unrunnable).tasks, read_at))
    }

    /// The picks of `chosen`: those `limits` allow now (the rest held back, as `report` says),
    /// each with a slot of the plan and a new attempt.
    async fn pick(
        &mut self,
        queue: &Queue,
        plan: &mut QueueClaims,
        limits: Option<&BeforeRead>,
        chosen: Vec<Document>,
        report: &mut BatchReport,
    ) -> Result<Vec<Pick>> {
        let chosen: Vec<(Document, PickHolds)> = match limits {
            Some(limits) => {
                let allowed = self.limits_allow(queue, limits, chosen).await?;
                if allowed.held_back > 0 {
                    // Claimable tasks are left, but not for now: not a queue run dry of tasks.
                    report.held = true;
                    report.out_of_tasks = false;
                    report.held_until = earliest(report.held_until, allowed.wait_until);
                    report.fresh_exclusions = allowed.fresh_exclusions;
                    report.ran_dry = !allowed.fresh_exclusions;
                }
                allowed.tasks
            }
            None => chosen
                .into_iter()
                .map(|t| (t, PickHolds::default()))
                .collect(),
        };
        let picks: Vec<Pick> = chosen
            .into_iter()
            .filter_map(|(task, holds)| {
                plan.slots.pop().map(|slot| Pick {
                    task,
                    slot,
                    attempt: ObjectId::new(),
                    holds,
                })
            })
            .collect();
        Ok(picks)
    }

    /// Reads up to `read` candidates of `queue` from the database: those of the partitions and
    /// keys `left_out` leaves room for, else from the queue's claim window (`nodes`: how many
    /// nodes share its lanes). An empty read with nothing left out marks the queue empty.
    async fn read_candidates(
        &mut self,
        queue: &Queue,
        read: usize,
        nodes: usize,
        left_out: Option<&Exclusions>,
        read_at: Instant,
    ) -> Result<Candidates> {
        let window = self.windows.entry(queue.id).or_default();
        let fleet_read_at = fleet_time::now();
        if let Some(left_out) = left_out {
            window.reset();
            return self
                .store
                .claims()
                .claim_candidates_matching(queue.id, queue.sort, read, left_out)
                .await;
        }
        let found = self
            .store
            .claims()
            .claim_candidates(queue.id, queue.sort, read, nodes, window)
            .await?;
        // Empty with no flow limit leaving tasks out: nothing to read until a signal. A
        // continuous queue is read to make its next unit. The next read is of the head, so
        // tasks queued again behind the window count.
        if found.tasks.is_empty() && found.unreadable.is_empty() && !queue.spec.continuous {
            window.reset();
            self.empty.found_empty(queue.id, read_at, fleet_read_at);
        }
        Ok(found)
    }

    /// Takes each pick's outcome: a claim is counted and kept, a pick another node took
    /// first gives its slot back to the plan, a refused one marks its task unrunnable; grants
    /// of rate limits no claim used are refunded. Returns the claimed tasks with their picks.
    async fn take_outcomes(
        &mut self,
        queue: &Queue,
        plan: &mut QueueClaims,
        picks: Vec<Pick>,
        outcomes: Vec<PickOutcome>,
        latency: std::time::Duration,
        report: &mut BatchReport,
    ) -> Result<Vec<(Box<ClaimedTask>, Pick)>> {
        let mut claimed = Vec::new();
        let unused: Vec<&PickHolds> = picks
            .iter()
            .zip(&outcomes)
            .filter(|(p, o)| p.holds.granted_at.is_some() && !matches!(o, PickOutcome::Claimed(_)))
            .map(|(p, _)| &p.holds)
            .collect();
        if !unused.is_empty() {
            self.metrics
                .limit_held(&queue.name, "unused_grant", unused.len() as u64);
            self.refund_unused_starts(queue, &unused).await?;
        }
        for (pick, outcome) in picks.into_iter().zip(outcomes) {
            match outcome {
                PickOutcome::Claimed(task) => {
                    if let Some((key, slot)) = &pick.holds.key_slot {
                        self.limits.key_slot_claimed(queue.id, key, *slot);
                    }
                    self.metrics.claimed(&queue.name, latency);
                    self.view.claimed(queue.id, pick.slot);
                    report.claimed += 1;
                    claimed.push((task, pick));
                }
                PickOutcome::Lost => {
                    self.metrics.claim_missed(&queue.name, "lost");
                    report.lost += 1;
                    plan.slots.push(pick.slot);
                    // Another node claims near them: the spares are likely gone as well.
                    self.spares.forget(queue.id);
                }
                PickOutcome::SlotTaken => {
                    // Another node holds it: remember, so later passes skip it too.
                    self.metrics.claim_missed(&queue.name, "slot_taken");
                    report.lost += 1;
                    self.view.slot_taken(queue.id, pick.slot);
                }
                PickOutcome::KeySlotTaken => {
                    // Another node's claim of the same key came first: the next read sees it.
                    self.metrics.claim_missed(&queue.name, "key_slot_taken");
                    self.limits.key_slots_stale(queue.id);
                    report.lost += 1;
                    plan.slots.push(pick.slot);
                }
                PickOutcome::Refused(why) => {
                    self.metrics.claim_missed(&queue.name, "refused");
                    plan.slots.push(pick.slot);
                    if let Some(id) = pick.task_id() {
                        let why = format!("the server refused to claim it: {why}");
                        self.set_unrunnable(id, SkipReason::UpdateRefused, &why)
                            .await?;
                    }
                }
            }
        }
        Ok(claimed)
    }

    /// Hands the claimed tasks to runners; when one cannot be started, the batch's unstarted
    /// tasks are given back.
    async fn hand_to_runners(
        &mut self,
        queue: &Queue,
        claimed: Vec<(Box<ClaimedTask>, Pick)>,
        executor: &Executor,
        report: &mut BatchReport,
    ) -> Result<()> {
        let relay = executor.relays();
        let mut handoffs = claimed.into_iter().map(|(task, pick)| {
            let handoff = Handoff {
                task: *task,
                attempt: pick.attempt,
                queue: queue.raw.clone(),
                relay,
                live: relay,
                started_at: pick.holds.started_at,
                clock: disbatch_model::fleet_time::anchor(),
            };
            (handoff, pick.slot)
        });
        while let Some((handoff, slot)) = handoffs.next() {
            let Err(e) = executor.spawn_runner(&handoff, Some(slot)) else {
                self.metrics.runner_started(&queue.name);
                continue;
            };
            tracing::error!(task = %handoff.task_id(), error = %e, "could not start the task runner; giving the batch's unstarted tasks back");
            report.spawn_failed = true;
            for (handoff, slot) in std::iter::once((handoff, slot)).chain(handoffs) {
                self.store
                    .claims()
                    .give_back_attempt(handoff.task_id(), handoff.attempt, &handoff.task.raw)
                    .await?;
                self.view.runner_exited(queue.id, Some(slot));
            }
            break;
        }
        Ok(())
    }
}
