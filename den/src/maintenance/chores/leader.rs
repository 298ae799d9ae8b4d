//! The chores only the maintenance leader runs, for the whole fleet: kept counts and
//! statistics, attempt records left unwritten, retention, leases that passed, tasks queued
//! without a signal, dependents no node settled, continuous queues' units, cron schedules and
//! silent nodes.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use disbatch_model::run_policy::MIN_LEASE;
use disbatch_store::Result;
use futures::future::BoxFuture;

use super::{Chore, Cx, Every, Next, Registered, Spec, IDLE_READ_INTERVALS};
use crate::maintenance::continuous::{continuous_queues, make_continuous_units};
use crate::maintenance::count_keeper::CountKeeper;
use crate::maintenance::outside_inserts::OutsideInserts;
use crate::maintenance::pruner::Pruner;
use crate::maintenance::reaper::{
    recover_expired_leases, recover_silent_nodes, write_unrecorded_attempts, ReapReport,
};
use crate::maintenance::schedules::Schedules;
use crate::maintenance::stats_keeper::StatsKeeper;
use crate::metrics::DenMetrics;
use crate::runners::releaser::DependencySweep;

/// In loop intervals: how often the leader writes the attempt records recoveries left
/// unwritten. A recovery writes its own record at once, so this repairs only a node or server
/// that died between the two writes, and need not cost an idle fleet more than a request a
/// minute at the default interval.
const REPAIR_INTERVALS: u32 = 60;
/// In loop intervals: how often the leader sweeps for ended tasks whose dependents no node
/// settled.
const SWEEP_INTERVALS: u32 = 10;
/// Distinct refusals of continuous queues' units logged, at most: a lasting one is logged once.
const MOST_REPORTED: usize = 10_000;

/// The leader's chores, in the order a pass runs them.
pub(super) fn chores(
    name: &str,
    interval: Duration,
    dead_node_after: Duration,
    counts_reconcile: Duration,
    stats_interval: Duration,
    pruner: Pruner,
) -> Vec<Registered> {
    let silent_period = silent_nodes_period(dead_node_after);
    let sweep = Sweep {
        sweep: DependencySweep::default(),
        every: interval * SWEEP_INTERVALS,
    };
    vec![
        Spec::leader("count_keeper", Every::Pass).runs(Counts(CountKeeper::new(counts_reconcile))),
        Spec::leader("stats_keeper", Every::Pass)
            .runs(Stats(StatsKeeper::new(stats_interval, name))),
        Spec::leader("repair", Every::Period(interval * REPAIR_INTERVALS)).runs(Repair),
        Spec::leader("pruner", Every::Pass).runs(Prune(pruner)),
        Spec::leader("lease_recovery", Every::AsItSays).runs(LeaseRecovery),
        Spec::leader("outside_inserts", Every::Pass).runs(Inserts(OutsideInserts::default())),
        Spec::leader("dependency_sweep", Every::Pass).runs(sweep),
        Spec::leader("continuous_units", Every::Pass).runs(ContinuousUnits {
            reported: HashSet::new(),
        }),
        Spec::leader("schedules", Every::Pass).runs(Cron(Schedules::new(interval))),
        // Not at start: a fleet restarted together would all look for dead nodes at once.
        Spec::leader("silent_nodes", Every::Period(silent_period))
            .first_after(silent_period)
            .runs(SilentNodes {
                dead_after: dead_node_after,
            }),
    ]
}

/// How often the leader looks for silent nodes: a fraction of the limit, so a dead node's
/// tasks wait little past it, but never every pass (it reads `nodes`).
fn silent_nodes_period(dead_node_after: Duration) -> Duration {
    (dead_node_after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

fn count_recoveries(metrics: &DenMetrics, report: &ReapReport) {
    for (how, n) in report.by_name() {
        for _ in 0..n {
            metrics.recovered(how);
        }
    }
}

/// Checks kept task counts against the tasks, in the background, every `counts_reconcile`.
struct Counts(CountKeeper);

impl Chore for Counts {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        self.0.tick(cx.store);
        Box::pin(async { Ok(Next::Period) })
    }
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        self.0.stop();
        false
    }
}

/// Writes the per-minute statistics, in the background.
struct Stats(StatsKeeper);

impl Chore for Stats {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        self.0.tick(cx.store);
        Box::pin(async { Ok(Next::Period) })
    }
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        self.0.stop();
        false
    }
}

/// Writes the attempt records recoveries left unwritten, and removes the rate-limit windows
/// of partitions gone quiet (one per customer ever seen, else).
struct Repair;

impl Chore for Repair {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let repaired = write_unrecorded_attempts(cx.store).await?;
            cx.metrics.attempt_records_repaired(repaired);
            let removed = cx.store.limits().remove_expired_rate_windows().await?;
            if removed > 0 {
                tracing::debug!(removed, "removed rate-limit windows of quiet partitions");
            }
            Ok(Next::Period)
        })
    }
}

/// Deletes ended tasks past their retention, in the background.
struct Prune(Pruner);

impl Chore for Prune {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let (store, metrics) = (cx.store, cx.metrics);
            self.0.tick(store, cx.queues().await?, metrics);
            Ok(Next::Period)
        })
    }
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        self.0.stop();
        false
    }
}

/// Recovers tasks whose lease passed, when the next lease may have: not on every pass.
struct LeaseRecovery;

impl Chore for LeaseRecovery {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let (store, metrics, connected_for) = (cx.store, cx.metrics, cx.connected_for);
            let idle_reading = cx.interval * IDLE_READ_INTERVALS;
            // Read again at least every idle reading's span: a queue made since, or one whose
            // lease was shortened, may write leases shorter than those read here.
            let shortest_lease = cx
                .queues()
                .await?
                .iter()
                .map(|q| q.run.lease)
                .min()
                .unwrap_or(MIN_LEASE)
                .min(idle_reading);
            let reaped = recover_expired_leases(store, connected_for, shortest_lease).await?;
            count_recoveries(metrics, &reaped);
            Ok(Next::At(Instant::now() + reaped.next_check_in))
        })
    }
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        true
    }
}

/// Finds tasks queued without a work signal (by hand, by a Perl node, by a client library)
/// and signals their queues.
struct Inserts(OutsideInserts);

impl Chore for Inserts {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let (store, metrics) = (cx.store, cx.metrics);
            let inserts_watched = cx.notifier.is_some_and(|n| n.sees_inserts());
            let delays_changed = cx.notifier.is_some_and(|n| n.take_delays_changed());
            let queues = cx.queues().await?;
            self.0
                .probe(store, queues, inserts_watched, delays_changed, metrics)
                .await?;
            Ok(Next::Period)
        })
    }
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        self.0.forget();
        false
    }
}

/// Settles ends no node settled (a Perl node's, a hand edit's, a node that died first), in
/// the background every tenth pass: the node that runs a task settles its end at once, and
/// this is the catch-all.
struct Sweep {
    sweep: DependencySweep,
    every: Duration,
}

impl Chore for Sweep {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        self.sweep.tick(cx.store, cx.metrics, self.every);
        Box::pin(async { Ok(Next::Period) })
    }
}

/// Makes the next synthetic unit of each continuous queue that has none.
struct ContinuousUnits {
    reported: HashSet<String>,
}

impl Chore for ContinuousUnits {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let store = cx.store;
            let continuous = continuous_queues(cx.queues().await?);
            if continuous.is_empty() {
                return Ok(Next::Period);
            }
            let report = make_continuous_units(store, &continuous).await?;
            for (queue, why) in report.refused {
                let message =
                    format!("continuous queue {queue}: the server refused its next task: {why}");
                if self.reported.len() < MOST_REPORTED && self.reported.insert(message.clone()) {
                    tracing::warn!("{message}");
                }
            }
            Ok(Next::Period)
        })
    }
}

/// Enqueues the ticks of queues' cron schedules.
struct Cron(Schedules);

impl Chore for Cron {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let reading = cx
                .claimer
                .queues_read_within(cx.interval * (IDLE_READ_INTERVALS + 2));
            self.0.pass(cx.store, reading, cx.metrics).await?;
            Ok(Next::Period)
        })
    }
    fn stop(&mut self, metrics: &DenMetrics) -> bool {
        self.0.forget(metrics);
        false
    }
}

/// Recovers the lease-less (Perl) claims of nodes silent for `dead_node_after`.
struct SilentNodes {
    dead_after: Duration,
}

impl Chore for SilentNodes {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>> {
        Box::pin(async move {
            let report = recover_silent_nodes(cx.store, self.dead_after).await?;
            count_recoveries(cx.metrics, &report);
            Ok(Next::Period)
        })
    }
}
