//! The node loop: maintenance passes (heartbeat, recovery) on a timer, claim passes on every
//! wake-up; on shutdown, finish the pass in flight and give back unstarted claims.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use disbatch_config::process::backoff::Backoff;
use disbatch_model::run_policy::MIN_LEASE;
use disbatch_store::Result;
use disbatch_store::{Heartbeat, HeartbeatReply, NodeLimit, Store};

use crate::claimer::{Claimer, PassReport, Reading};
use crate::count_writer::CountWriter;
use crate::maintenance::balancer::Balancer;
use crate::maintenance::continuous::{continuous_queues, make_continuous_units};
use crate::maintenance::count_keeper::CountKeeper;
use crate::maintenance::elector::Elector;
use crate::maintenance::outside_inserts::{open_queues, OutsideInserts};
use crate::maintenance::reaper::{
    reap_orphans, recover_expired_leases, recover_silent_nodes, write_unrecorded_attempts,
};
use crate::maintenance::schedules::Schedules;
use crate::maintenance::stats_keeper::StatsKeeper;
use crate::metrics::DenMetrics;
use crate::runners::executor::Executor;
use crate::wake::fanout::{Fanout, OwnQueues, StreamNeed};
use crate::wake::notifier::Notifier;

/// Longest wait between passes while the database keeps failing (before jitter, which may
/// double it): short, so a node is back at work within seconds of the server's return.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long a stopping node lets the pass in flight finish. Claims already sent must reach
/// their spawns: a pass dropped between the two leaves tasks marked running that no runner
/// will finish until their leases run out. Against a live server a pass takes milliseconds.
const STOPPING_PASS_GRACE: Duration = Duration::from_secs(10);
/// In loop intervals: how long the maintenance lease lasts, and how often it is tried.
const LEADER_LEASE_INTERVALS: u32 = 15;
const LEADER_TRY_INTERVALS: u32 = 5;
/// In loop intervals: how often an idle node (no runners, nothing claimed by its last pass,
/// no queue waiting for a slot) reads queues and running counts on its timer. Work signals
/// wake it for new, requeued and come-due tasks (the leader at once, through its stream; the
/// others at their next heartbeat, through the leader's fan-out); this reading catches
/// whatever no signal reported (a signal lost to an outage or a leader change, a task whose
/// `_id` is older than the probe's bound) at a cost of 0.3 requests/s per idle node at the
/// default interval.
const IDLE_READ_INTERVALS: u32 = 10;
/// The leader writes the attempt records recoveries left unwritten every this many passes (and
/// when it takes the lead): a recovery writes its own record at once, so this repairs only a
/// node or server that died between the two writes, and need not cost an idle fleet more
/// than a request a minute at the default interval.
const REPAIR_INTERVALS: u32 = 60;
/// The leader sweeps for ended tasks whose dependents no node settled every this many passes.
const SWEEP_INTERVALS: u32 = 10;
/// How often a node applies Disbatch's orphan rule to its own lease-less claims (only older
/// versions made them): the rule waits 5 minutes anyway.
const OWN_ORPHANS_EVERY: Duration = Duration::from_secs(60);
/// How often a node reads the server's clock (`fleet_time`), one `hello`. Between readings
/// the server's time runs on the host's boot clock, which drifts from it by about a
/// millisecond in 10 s at worst; each pass also compares the host's wall clock with it (no
/// round trip) and reads again at once when the wall clock stepped, so the offset reported
/// follows within a pass. Every second, it would add half to an idle node's requests.
const CLOCK_READING_EVERY: Duration = Duration::from_secs(10);
/// In loop intervals: a node whose heartbeat is older than this gets no fan-out.
const FANOUT_LIVE_INTERVALS: u32 = 5;

pub struct Node {
    pub store: Store,
    pub name: String,
    /// Between maintenance passes (heartbeat, recovery, a fresh reading of queues).
    pub interval: Duration,
    pub claimer: Claimer,
    pub executor: Executor,
    /// Runs QueueBalance when enabled and this node holds its lease.
    pub balancer: Balancer,
    /// Reported on the node document.
    pub runtimes: Option<Vec<String>>,
    pub metrics: DenMetrics,
    /// Change streams; None polls on the timer only.
    pub notifier: Option<Notifier>,
    /// Silent this long, a node's lease-less (Perl) claims are recovered.
    pub dead_node_after: Duration,
    /// How often the leader checks kept task counts against the tasks.
    pub counts_reconcile: Duration,
    /// The width of a statistics bucket (a minute unless testing).
    pub stats_interval: Duration,
    /// Deletes ended tasks past their retention, while this node leads.
    pub pruner: crate::maintenance::pruner::Pruner,
    /// Settings from config reloads (SIGHUP); None: never reloaded.
    pub reloads: Option<crate::reload::Receiver>,
}

/// Why the loop woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    Timer,
    RunnerExited,
    Change,
    /// A config reload (SIGHUP) changed what this node serves.
    Reload,
    /// A retry this node's runners queued came due.
    RetryDue,
}

impl Node {
    /// Runs passes until `shutdown` resolves: a maintenance pass every `interval`, and claim
    /// passes in between whenever a runner exits or a change stream reports work. A failed
    /// pass is logged and retried with backoff.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        let mut failures: u32 = 0;
        let mut retry = Backoff::new(self.interval * 2, MAX_BACKOFF);
        let mut connected_since = Instant::now();
        let mut limit = NodeLimit::Unlimited;
        let mut next_maintenance = Instant::now();
        // Not at start: a fleet restarted together would all look for dead nodes at once.
        let mut next_silent_check = Instant::now() + self.silent_check_every();
        let mut elector = Elector::new(
            self.interval * LEADER_LEASE_INTERVALS,
            self.interval * LEADER_TRY_INTERVALS,
        );
        let mut count_keeper = CountKeeper::new(self.counts_reconcile);
        let mut outside_inserts = OutsideInserts::default();
        let mut schedules = Schedules::new(self.interval);
        let mut fanout = Fanout::new(
            self.store.clone(),
            self.name.clone(),
            self.interval * FANOUT_LIVE_INTERVALS,
            self.metrics.clone(),
        );
        let mut stream_need = StreamNeed::default();
        // Whether this node leads the fleet's maintenance (and so holds its change stream).
        let mut leading = false;
        let mut next_repair = Instant::now();
        let mut sweep = crate::runners::releaser::DependencySweep::default();
        // When a lease may next pass (the leader recovers only then, not on every pass).
        let mut next_recovery = Instant::now();
        let mut stats_keeper = StatsKeeper::new(self.stats_interval, &self.name);
        let count_writer = CountWriter::start(self.store.clone());
        let mut next_own_orphans = Instant::now();
        let mut next_stale_check = Instant::now();
        let mut last_read: Option<Instant> = None;
        // Whether the last claim pass claimed anything: a busy node reads every pass.
        let mut claimed_lately = false;
        // Whether the last claim pass ran short of claimable tasks (or none has run).
        let mut short_lately = true;
        // Whether the last claim pass found a queue with no slot for this node: it reads
        // every pass too, to take its lane back as soon as a slot frees.
        let mut waiting_for_slots = false;
        // Refusals already logged, so a lasting one is logged once.
        let mut reported: HashSet<String> = HashSet::new();
        let mut wake = Wake::Timer;
        // Set on shutdown: the pass in flight finishes but sends no new claims.
        let stopping = AtomicBool::new(false);
        // Logged once: operators and the test harness read it as "this node has sent its
        // first heartbeat and read its queues", which a process start alone does not say.
        let mut first_pass_done = false;
        loop {
            if failures > 0 {
                connected_since = Instant::now();
            }
            if let Some(settings) = self.reloads.as_mut().and_then(crate::reload::take_new) {
                settings.apply(&mut self.claimer, &mut self.executor, &mut self.runtimes);
                // Queues this node now serves (or no longer does) are read at once.
                last_read = None;
            }
            let started = Instant::now();
            let maintenance = failures > 0 || started >= next_maintenance;
            let result = {
                let pass = async {
                    // The leader's fan-out, read back by this pass's heartbeat.
                    let mut work_signalled = false;
                    if maintenance {
                        // Short of tasks, or running nothing (its queues may all be closed:
                        // opening one is work too): it starts new work on the leader's marks.
                        let waiting_for_work = short_lately || self.executor.live_runners() == 0;
                        // Before the heartbeat: its `timestamp` is the server's time as read.
                        self.store.keep_clock(CLOCK_READING_EVERY).await?;
                        let beat = self.heartbeat(&limit, waiting_for_work).await?;
                        limit = beat.limit;
                        work_signalled = beat.work_signalled;
                        if Instant::now() >= next_own_orphans {
                            reap_orphans(&self.store, &self.name).await?;
                            next_own_orphans = Instant::now() + OWN_ORPHANS_EVERY;
                        }
                        if Instant::now() >= next_stale_check && self.executor.live_runners() > 0 {
                            let killed = crate::runners::runner_deaths::kill_stale_runners(
                                &self.store,
                                self.executor.own_runners(),
                            )
                            .await?;
                            self.metrics.stale_runners_killed(killed);
                            next_stale_check =
                                Instant::now() + crate::runners::runner_deaths::STALE_CHECK_EVERY;
                        }
                        leading = elector
                            .leads(
                                &self.store,
                                &self.name,
                                self.interval * LEADER_LEASE_INTERVALS,
                            )
                            .await;
                        self.claimer.lead(leading);
                        if let Some(n) = &self.notifier {
                            let wanted = stream_need
                                .wanted(
                                    &self.store,
                                    &self.name,
                                    leading,
                                    waiting_for_work,
                                    self.interval * FANOUT_LIVE_INTERVALS,
                                )
                                .await?;
                            if n.watch(wanted) && leading {
                                tracing::debug!(
                                    open = wanted,
                                    "the fleet's stream: this node or another waits for work (open), or none does (closed)"
                                );
                            }
                        }
                        if leading {
                            count_keeper.tick(&self.store);
                            stats_keeper.tick(&self.store);
                            self.lead_maintenance(
                                connected_since.elapsed(),
                                &mut reported,
                                &mut outside_inserts,
                                &mut next_repair,
                                &mut sweep,
                                &mut next_recovery,
                            )
                            .await?;
                            let reading = self
                                .claimer
                                .queues_read_within(self.interval * (IDLE_READ_INTERVALS + 2));
                            schedules.pass(&self.store, reading, &self.metrics).await?;
                            if Instant::now() >= next_silent_check {
                                self.recover_silent_nodes().await?;
                                next_silent_check = Instant::now() + self.silent_check_every();
                            }
                        } else {
                            count_keeper.stop();
                            stats_keeper.stop();
                            self.pruner.stop();
                            outside_inserts.forget();
                            schedules.forget(&self.metrics);
                            fanout.forget();
                            next_recovery = Instant::now();
                        }
                        self.forward_cancel_requests().await?;
                    }
                    let queues_changed = self
                        .notifier
                        .as_ref()
                        .is_some_and(Notifier::take_queues_changed);
                    let idle =
                        !claimed_lately && !waiting_for_slots && self.executor.live_runners() == 0;
                    let read_due = last_read
                        .is_none_or(|t| t.elapsed() >= self.interval * IDLE_READ_INTERVALS);
                    if work_signalled {
                        self.metrics.wakeup("leader_signal");
                    }
                    if maintenance
                        && wake == Wake::Timer
                        && idle
                        && !read_due
                        && !queues_changed
                        && !work_signalled
                    {
                        // An idle node's timer pass: its heartbeat was all it owed.
                        return Ok(PassReport::default());
                    }
                    let read = if maintenance || queues_changed {
                        Reading::Now
                    } else if idle && wake == Wake::Change {
                        Reading::Last
                    } else {
                        Reading::IfStale
                    };
                    // Tasks queued again may sit behind the claim windows (the leader's mark
                    // does not say whether they were new or queued again). Only a node short of
                    // tasks reads from the heads again for them: with a backlog beyond its room
                    // it has work in its windows, a head read matches the whole backlog on some
                    // servers (SecantusDB: ~700 ms at 100 000 queued, each), and windows are
                    // read afresh every 5 s anyway.
                    let requeued = self.notifier.as_ref().is_some_and(Notifier::take_requeued);
                    if (work_signalled || requeued) && short_lately {
                        self.claimer.reset_windows();
                    }
                    // Taken before the pass: events that come during it wake another one.
                    let signalled = match (leading, &self.notifier) {
                        (true, Some(n)) => Some(n.take_signalled()),
                        _ => None,
                    };
                    // Queues found empty are read again once anything says tasks may have
                    // come there; the leader's own events name their queues.
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
                        .claim_tasks(&limit, &self.executor, read, &stopping)
                        .await?;
                    if read == Reading::Now {
                        last_read = Some(Instant::now());
                        self.metrics.queue_read();
                    }
                    claimed_lately = report.claimed > 0;
                    if !claimed_lately {
                        self.executor.claim_pass_found_nothing();
                    }
                    short_lately = report.short_of_tasks != Some(false);
                    waiting_for_slots = report.waiting_for_slots;
                    if let Some(signalled) = signalled {
                        let own = || OwnQueues {
                            served: self.claimer.served(),
                            open: self
                                .claimer
                                .queues_read_within(self.interval * IDLE_READ_INTERVALS)
                                .map(open_queues),
                        };
                        fanout.after_pass(signalled, own, &report).await?;
                    }
                    if maintenance && !stopping.load(Ordering::Relaxed) {
                        // After claiming, so balancing never delays a claim; new threads apply
                        // at the next reading.
                        self.balancer.tick(&self.store, &self.name).await;
                    }
                    Ok::<_, disbatch_store::Error>(report)
                };
                tokio::pin!(pass);
                tokio::select! {
                    result = &mut pass => result,
                    _ = &mut shutdown => {
                        stopping.store(true, Ordering::Relaxed);
                        finish_pass_in_flight(pass).await;
                        break;
                    }
                }
            };
            self.metrics.pass(started.elapsed());
            let mut retry_is_next = false;
            let wait = match result {
                Ok(report) => {
                    if !first_pass_done && maintenance {
                        first_pass_done = true;
                        tracing::info!(node = %self.name, "first pass done: heartbeat written and queues read");
                    }
                    if failures > 0 {
                        tracing::info!(failures, "database reachable again; passes resumed");
                    }
                    failures = 0;
                    retry.reset();
                    if maintenance {
                        next_maintenance = started + self.interval;
                    }
                    if report.claimed > 0 {
                        tracing::debug!(
                            claimed = report.claimed,
                            on_node = report.on_node,
                            ?wake,
                            "pass claimed tasks"
                        );
                    }
                    if report.more {
                        Duration::ZERO
                    } else {
                        let next = next_maintenance.saturating_duration_since(Instant::now());
                        // A flow limit frees before the next pass: claim then, not a pass late.
                        let next = report.held_until.map_or(next, |t| {
                            next.min(t.saturating_duration_since(Instant::now()))
                        });
                        // So does a retry this node's runners queued.
                        let retry = self
                            .claimer
                            .next_retry_due()
                            .map(|t| t.saturating_duration_since(Instant::now()));
                        retry_is_next = retry.is_some_and(|r| r < next);
                        retry.map_or(next, |r| next.min(r))
                    }
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.metrics.db_error("pass");
                    let wait = retry.next_delay();
                    tracing::error!(error = %e, failures, retry_in = ?wait, "pass failed");
                    wait
                }
            };
            let notifier = self.notifier.clone();
            let changed = async {
                match &notifier {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            };
            let reloaded = crate::reload::changed(self.reloads.clone());
            wake = tokio::select! {
                _ = &mut shutdown => break,
                _ = reloaded => Wake::Reload,
                _ = tokio::time::sleep(wait) => if retry_is_next { Wake::RetryDue } else { Wake::Timer },
                _ = self.executor.runner_exited(), if failures == 0 => Wake::RunnerExited,
                _ = changed, if failures == 0 => Wake::Change,
            };
            // Change-stream wake-ups are counted per event by the notifier.
            match wake {
                Wake::Timer => self.metrics.wakeup("timer"),
                Wake::RetryDue => self.metrics.wakeup("retry_due"),
                Wake::RunnerExited => self.metrics.wakeup("runner_exit"),
                Wake::Change | Wake::Reload => {}
            }
        }
        count_keeper.stop();
        stats_keeper.stop();
        self.pruner.stop();
        elector.release(&self.store, &self.name).await;
        self.shut_down().await;
        drop(count_writer);
        if let Some(notifier) = &self.notifier {
            notifier.stop().await;
        }
        self.store.clone().shutdown().await;
        Ok(())
    }

    /// The heartbeat; returns the node's `maxthreads` and the leader's mark, as read back.
    async fn heartbeat(
        &mut self,
        limit: &NodeLimit,
        waiting_for_work: bool,
    ) -> Result<HeartbeatReply> {
        self.claimer.read_queues_first(&self.executor).await?;
        let runners = self.executor.runners();
        let serves = self.claimer.served();
        let running = runners.len() as u32;
        let room = match limit {
            NodeLimit::Unlimited => None,
            NodeLimit::Max(n) => Some(n.saturating_sub(running)),
            NodeLimit::Invalid(_) => Some(0),
        };
        self.store
            .heartbeat(&Heartbeat {
                node: &self.name,
                pid: std::process::id(),
                version: disbatch_model::VERSION,
                running: runners.len() as u32,
                runtimes: self.runtimes.as_deref(),
                runners: &runners,
                serves: &serves,
                room,
                waiting_for_work,
                interval: self.interval,
            })
            .await
    }

    /// The leader's share of maintenance: tasks whose lease passed, continuous queues'
    /// synthetic tasks, and tasks queued without a work signal, for the whole fleet.
    async fn lead_maintenance(
        &mut self,
        connected_for: Duration,
        reported: &mut HashSet<String>,
        outside_inserts: &mut OutsideInserts,
        next_repair: &mut Instant,
        sweep: &mut crate::runners::releaser::DependencySweep,
        next_recovery: &mut Instant,
    ) -> Result<()> {
        if Instant::now() >= *next_repair {
            let repaired = write_unrecorded_attempts(&self.store).await?;
            self.metrics.attempt_records_repaired(repaired);
            // Rate-limit windows of partitions gone quiet (one per customer ever seen, else).
            let removed = self.store.remove_expired_rate_windows().await?;
            if removed > 0 {
                tracing::debug!(removed, "removed rate-limit windows of quiet partitions");
            }
            *next_repair = Instant::now() + self.interval * REPAIR_INTERVALS;
        }
        // The claimer's reading, kept fresh by queue changes' events and an idle node's
        // periodic reading: one request less on each of the leader's passes. Two intervals
        // of slack: a reading due every tenth pass is a little more than ten intervals old
        // just before it is made.
        let queues = match self
            .claimer
            .queues_read_within(self.interval * (IDLE_READ_INTERVALS + 2))
        {
            Some(queues) => queues.to_vec(),
            None => self.store.list_queues().await?.0,
        };
        self.pruner.tick(&self.store, &queues, &self.metrics);
        if Instant::now() >= *next_recovery {
            // Read again at least every idle reading's span: a queue made since, or one whose
            // lease was shortened, may write leases shorter than those read here.
            let shortest_lease = queues
                .iter()
                .map(|q| q.run.lease)
                .min()
                .unwrap_or(MIN_LEASE)
                .min(self.interval * IDLE_READ_INTERVALS);
            let reaped = recover_expired_leases(&self.store, connected_for, shortest_lease).await?;
            self.count_recoveries(&reaped);
            *next_recovery = Instant::now() + reaped.next_check_in;
        }
        let inserts_watched = self.notifier.as_ref().is_some_and(Notifier::sees_inserts);
        let delays_changed = self
            .notifier
            .as_ref()
            .is_some_and(Notifier::take_delays_changed);
        outside_inserts
            .probe(
                &self.store,
                &queues,
                inserts_watched,
                delays_changed,
                &self.metrics,
            )
            .await?;
        // Ends no node settled (a Perl node's, a hand edit's, a node that died first): every
        // tenth pass, so an idle fleet pays 0.1 reads a pass for it. The node that runs a
        // task settles its end at once; this is the catch-all.
        sweep.tick(&self.store, &self.metrics, self.interval * SWEEP_INTERVALS);
        let continuous = continuous_queues(&queues);
        if !continuous.is_empty() {
            let report = make_continuous_units(&self.store, &continuous).await?;
            for (queue, why) in report.refused {
                let message =
                    format!("continuous queue {queue}: the server refused its next task: {why}");
                if reported.len() < 10_000 && reported.insert(message.clone()) {
                    tracing::warn!("{message}");
                }
            }
        }
        Ok(())
    }

    fn count_recoveries(&self, report: &crate::maintenance::reaper::ReapReport) {
        for (how, n) in report.by_name() {
            for _ in 0..n {
                self.metrics.recovered(how);
            }
        }
    }

    /// How often to look for nodes that stopped heartbeating: a fraction of the limit, so a
    /// dead node's tasks wait little past it, but never every pass (it reads `nodes`).
    fn silent_check_every(&self) -> Duration {
        (self.dead_node_after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
    }

    async fn recover_silent_nodes(&self) -> Result<()> {
        let report = recover_silent_nodes(&self.store, self.dead_node_after).await?;
        self.count_recoveries(&report);
        Ok(())
    }

    /// Wakes the runners of tasks an operator asked to cancel, so they stop within a pass
    /// rather than at their next lease renewal.
    async fn forward_cancel_requests(&self) -> Result<()> {
        if self.executor.live_runners() == 0 {
            return Ok(());
        }
        for task in self.store.cancel_requests(&self.name).await? {
            self.executor.wake_runner(task);
        }
        Ok(())
    }

    /// Claimed-but-unstarted tasks go back to the queue; started runners keep running.
    async fn shut_down(&self) {
        tracing::info!(node = %self.name, "stopping: no more claims");
        for attempt in 1..=3 {
            match self.store.give_back_claimed(&self.name, None).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(tasks = n, "gave back claimed tasks that had not started");
                    }
                    break;
                }
                Err(e) if attempt < 3 => {
                    tracing::warn!(error = %e, "could not give back claimed tasks; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => tracing::error!(
                    error = %e,
                    "could not give back claimed tasks; they become orphaned after 5 minutes"
                ),
            }
        }
        self.balancer.release(&self.store, &self.name).await;
        let live = self.executor.live_runners();
        if live > 0 {
            tracing::info!(
                runners = live,
                "running tasks continue in their own sessions"
            );
        }
    }
}

/// Lets a pass cut short by shutdown reach the spawns of the claims it already sent.
async fn finish_pass_in_flight<T>(pass: impl Future<Output = Result<T>>) {
    match tokio::time::timeout(STOPPING_PASS_GRACE, pass).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the pass in flight at shutdown failed"),
        Err(_) => tracing::warn!(
            grace = ?STOPPING_PASS_GRACE,
            "the pass in flight at shutdown did not finish; tasks it claimed are recovered when their leases run out"
        ),
    }
}
