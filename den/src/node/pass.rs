//! One pass of the node loop: on a maintenance pass the heartbeat and the chores, then the
//! claim pass (what to read, which empty queues to look at again, the leader's fan-out), and
//! how long to wait for the next.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use disbatch_config::process::backoff::Backoff;
use disbatch_store::{NodeLimit, Result};

use super::{Node, Wake};
use crate::claimer::{PassReport, Reading};
use crate::maintenance::chores::{Cx, Phase, FANOUT_LIVE_INTERVALS, IDLE_READ_INTERVALS};
use crate::maintenance::outside_inserts::open_queues;
use crate::wake::fanout::{Fanout, OwnQueues};
use crate::wake::notifier::Notifier;

/// Longest wait between passes while the database keeps failing (before jitter, which may
/// double it): short, so a node is back at work within seconds of the server's return.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a node reads the server's clock (`fleet_time`), one `hello`. Between readings
/// the server's time runs on the host's boot clock, which drifts from it by about a
/// millisecond in 10 s at worst; each pass also compares the host's wall clock with it (no
/// round trip) and reads again at once when the wall clock stepped, so the offset reported
/// follows within a pass. Every second, it would add half to an idle node's requests.
const CLOCK_READING_EVERY: Duration = Duration::from_secs(10);

/// What the loop carries from pass to pass.
pub(super) struct Pacing {
    pub failures: u32,
    retry: Backoff,
    connected_since: Instant,
    limit: NodeLimit,
    next_maintenance: Instant,
    pub last_read: Option<Instant>,
    /// Whether the last claim pass claimed anything: a busy node reads every pass.
    claimed_lately: bool,
    /// Whether the last claim pass ran short of claimable tasks (or none has run).
    short_lately: bool,
    /// Whether the last claim pass found a queue with no slot for this node: it reads every
    /// pass too, to take its lane back as soon as a slot frees.
    waiting_for_slots: bool,
    /// Whether this node leads the fleet's maintenance (and so holds its change stream).
    leading: bool,
    pub wake: Wake,
    /// Logged once: operators and the test harness read it as "this node has sent its first
    /// heartbeat and read its queues", which a process start alone does not say.
    first_pass_done: bool,
    fanout: Fanout,
}

impl Pacing {
    pub fn new(node: &Node) -> Pacing {
        Pacing {
            failures: 0,
            retry: Backoff::new(node.interval * 2, MAX_BACKOFF),
            connected_since: Instant::now(),
            limit: NodeLimit::Unlimited,
            next_maintenance: Instant::now(),
            last_read: None,
            claimed_lately: false,
            short_lately: true,
            waiting_for_slots: false,
            leading: false,
            wake: Wake::Timer,
            first_pass_done: false,
            fanout: Fanout::new(
                node.store.clone(),
                node.name.clone(),
                node.interval * FANOUT_LIVE_INTERVALS,
                node.metrics.clone(),
            ),
        }
    }

    pub fn before_pass(&mut self) {
        if self.failures > 0 {
            self.connected_since = Instant::now();
        }
    }

    /// A maintenance pass is due on the timer, and after every failure.
    pub fn maintenance_due(&self, now: Instant) -> bool {
        self.failures > 0 || now >= self.next_maintenance
    }
}

impl Node {
    /// One pass: heartbeat and chores when `maintenance`, then the claim pass.
    pub(super) async fn pass(
        &mut self,
        pacing: &mut Pacing,
        maintenance: bool,
        stopping: &AtomicBool,
    ) -> Result<PassReport> {
        // The leader's fan-out, read back by this pass's heartbeat.
        let mut work_signalled = false;
        if maintenance {
            // Short of tasks, or running nothing (its queues may all be closed: opening one
            // is work too): it starts new work on the leader's marks.
            let waiting_for_work = pacing.short_lately || self.executor.live_runners() == 0;
            // Before the heartbeat: its `timestamp` is the server's time as read.
            self.store.keep_clock(CLOCK_READING_EVERY).await?;
            let beat = self.heartbeat(&pacing.limit, waiting_for_work).await?;
            pacing.limit = beat.limit;
            work_signalled = beat.work_signalled;
            let connected_for = pacing.connected_since.elapsed();
            let (leading, ran) = self
                .run_chores(
                    Phase::BeforeClaim,
                    connected_for,
                    pacing.leading,
                    waiting_for_work,
                    false,
                )
                .await;
            pacing.leading = leading;
            ran?;
            if !pacing.leading {
                pacing.fanout.forget();
            }
        }
        let Some(report) = self
            .claim_pass(pacing, maintenance, work_signalled, stopping)
            .await?
        else {
            // An idle node's timer pass: its heartbeat was all it owed.
            return Ok(PassReport::default());
        };
        if maintenance {
            let connected_for = pacing.connected_since.elapsed();
            let stopping = stopping.load(Ordering::Relaxed);
            let (_, ran) = self
                .run_chores(
                    Phase::AfterClaim,
                    connected_for,
                    pacing.leading,
                    false,
                    stopping,
                )
                .await;
            ran?;
        }
        Ok(report)
    }

    /// Runs the chores of `phase` that are due; returns whether this node leads (as the
    /// `lead` chore found, else as it was) with the outcome.
    async fn run_chores(
        &mut self,
        phase: Phase,
        connected_for: Duration,
        leading: bool,
        waiting_for_work: bool,
        stopping: bool,
    ) -> (bool, Result<()>) {
        let mut cx = Cx::new(
            &self.store,
            &self.name,
            self.interval,
            &self.metrics,
            &self.executor,
            &mut self.claimer,
            self.notifier.as_ref(),
            connected_for,
        );
        cx.leading = leading;
        cx.waiting_for_work = waiting_for_work;
        cx.stopping = stopping;
        let ran = self.chores.run_due(phase, &mut cx).await;
        (cx.leading, ran)
    }

    /// Claims what this node has room for; None for an idle node's timer pass, which owes
    /// nothing but its heartbeat.
    async fn claim_pass(
        &mut self,
        pacing: &mut Pacing,
        maintenance: bool,
        work_signalled: bool,
        stopping: &AtomicBool,
    ) -> Result<Option<PassReport>> {
        let queues_changed = self
            .notifier
            .as_ref()
            .is_some_and(Notifier::take_queues_changed);
        let idle = !pacing.claimed_lately
            && !pacing.waiting_for_slots
            && self.executor.live_runners() == 0;
        let read_due = pacing
            .last_read
            .is_none_or(|t| t.elapsed() >= self.interval * IDLE_READ_INTERVALS);
        if work_signalled {
            self.metrics.wakeup("leader_signal");
        }
        let wake = pacing.wake;
        if maintenance
            && wake == Wake::Timer
            && idle
            && !read_due
            && !queues_changed
            && !work_signalled
        {
            return Ok(None);
        }
        let read = if maintenance || queues_changed {
            Reading::Now
        } else if idle && wake == Wake::Change {
            Reading::Last
        } else {
            Reading::IfStale
        };
        // Tasks queued again may sit behind the claim windows (the leader's mark does not say
        // whether they were new or queued again). Only a node short of tasks reads from the
        // heads again for them: with a backlog beyond its room it has work in its windows, a
        // head read matches the whole backlog on some servers (SecantusDB: ~700 ms at 100 000
        // queued, each), and windows are read afresh every 5 s anyway.
        let requeued = self.notifier.as_ref().is_some_and(Notifier::take_requeued);
        if (work_signalled || requeued) && pacing.short_lately {
            self.claimer.reset_windows();
        }
        // Taken before the pass: events that come during it wake another one.
        let signalled = match (pacing.leading, &self.notifier) {
            (true, Some(n)) => Some(n.take_signalled()),
            _ => None,
        };
        // Queues found empty are read again once anything says tasks may have come there;
        // the leader's own events name their queues.
        if work_signalled
            || requeued
            || queues_changed
            || wake == Wake::RetryDue
            || signalled.as_ref().is_some_and(|s| s.all)
        {
            self.claimer.forget_empty_queues();
        } else if let Some(s) = &signalled {
            s.queues
                .iter()
                .for_each(|q| self.claimer.forget_empty_queue(*q));
        }
        let report = self
            .claimer
            .claim_tasks(&pacing.limit, &self.executor, read, stopping)
            .await?;
        if read == Reading::Now {
            pacing.last_read = Some(Instant::now());
            self.metrics.queue_read();
        }
        pacing.claimed_lately = report.claimed > 0;
        if !pacing.claimed_lately {
            self.executor.claim_pass_found_nothing();
        }
        pacing.short_lately = report.short_of_tasks != Some(false);
        pacing.waiting_for_slots = report.waiting_for_slots;
        if let Some(signalled) = signalled {
            let own = || OwnQueues {
                served: self.claimer.served(),
                open: self
                    .claimer
                    .queues_read_within(self.interval * IDLE_READ_INTERVALS)
                    .map(open_queues),
            };
            pacing.fanout.after_pass(signalled, own, &report).await?;
        }
        Ok(Some(report))
    }

    /// Takes a pass's outcome: logs, backoff, the next maintenance time; returns how long to
    /// wait for the next pass, and whether a retry this node queued is what it waits for.
    pub(super) fn settle(
        &mut self,
        pacing: &mut Pacing,
        result: Result<PassReport>,
        started: Instant,
        maintenance: bool,
    ) -> (Duration, bool) {
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                pacing.failures = pacing.failures.saturating_add(1);
                self.metrics.db_error("pass");
                let wait = pacing.retry.next_delay();
                tracing::error!(error = %e, failures = pacing.failures, retry_in = ?wait, "pass failed");
                return (wait, false);
            }
        };
        if !pacing.first_pass_done && maintenance {
            pacing.first_pass_done = true;
            tracing::info!(node = %self.name, "first pass done: heartbeat written and queues read");
        }
        if pacing.failures > 0 {
            tracing::info!(
                failures = pacing.failures,
                "database reachable again; passes resumed"
            );
        }
        pacing.failures = 0;
        pacing.retry.reset();
        if maintenance {
            pacing.next_maintenance = started + self.interval;
        }
        if report.claimed > 0 {
            tracing::debug!(
                claimed = report.claimed,
                on_node = report.on_node,
                wake = ?pacing.wake,
                "pass claimed tasks"
            );
        }
        if report.more {
            return (Duration::ZERO, false);
        }
        let next = pacing
            .next_maintenance
            .saturating_duration_since(Instant::now());
        // A flow limit frees before the next pass: claim then, not a pass late.
        let next = report.held_until.map_or(next, |t| {
            next.min(t.saturating_duration_since(Instant::now()))
        });
        // So does a retry this node's runners queued.
        let retry = self
            .claimer
            .next_retry_due()
            .map(|t| t.saturating_duration_since(Instant::now()));
        let retry_is_next = retry.is_some_and(|r| r < next);
        (retry.map_or(next, |r| next.min(r)), retry_is_next)
    }
}
