//! The chores every node runs, leader or not: its own lease-less orphans, runners whose
//! attempts were lost, the maintenance lease, the fleet's change stream, cancel requests, and
//! the balancer (which holds a lease of its own).

use std::time::Duration;

use disbatch_store::Store;
use futures::future::BoxFuture;

use super::{Chore, Cx, Every, Next, Registered, Spec, FANOUT_LIVE_INTERVALS};
use crate::maintenance::balancer::Balancer;
use crate::maintenance::elector::Elector;
use crate::maintenance::reaper::reap_orphans;
use crate::runners::runner_deaths::{kill_stale_runners, STALE_CHECK_EVERY};
use crate::wake::fanout::StreamNeed;

/// In loop intervals: how long the maintenance lease lasts, and how often it is tried.
const LEADER_LEASE_INTERVALS: u32 = 15;
const LEADER_TRY_INTERVALS: u32 = 5;
/// How often a node applies Disbatch's orphan rule to its own lease-less claims (only older
/// versions made them): the rule waits 5 minutes anyway.
const OWN_ORPHANS_EVERY: Duration = Duration::from_secs(60);

/// The chores before the leader's: a node's own upkeep, then whether it leads.
pub(super) fn before_leading(interval: Duration) -> Vec<Registered> {
    let elector = Elector::new(
        interval * LEADER_LEASE_INTERVALS,
        interval * LEADER_TRY_INTERVALS,
    );
    vec![
        Spec::on_every_node("own_orphans", Every::Period(OWN_ORPHANS_EVERY)).runs(OwnOrphans),
        Spec::on_every_node("stale_runners", Every::Period(STALE_CHECK_EVERY)).runs(StaleRunners),
        Spec::on_every_node("lead", Every::Pass).runs(Lead { elector }),
        Spec::on_every_node("stream", Every::Pass).runs(Stream(StreamNeed::default())),
    ]
}

/// The chores after the leader's.
pub(super) fn after_leading(balancer: Balancer) -> Vec<Registered> {
    vec![
        Spec::on_every_node("cancel_requests", Every::Pass).runs(CancelRequests),
        Spec::on_every_node("balancer", Every::Pass)
            .after_claim()
            .runs(Balance(balancer)),
    ]
}

struct OwnOrphans;

impl Chore for OwnOrphans {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            reap_orphans(cx.store, cx.name).await?;
            Ok(Next::Period)
        })
    }
}

/// Kills this node's runners whose attempts were closed as lost (`kill_stale_runners`).
struct StaleRunners;

impl Chore for StaleRunners {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            if cx.executor.live_runners() == 0 {
                return Ok(Next::NextPass);
            }
            let killed = kill_stale_runners(cx.store, cx.executor.own_runners()).await?;
            cx.metrics.stale_runners_killed(killed);
            Ok(Next::Period)
        })
    }
}

/// Takes or keeps the maintenance lease: the chores after it that only a leader runs follow.
struct Lead {
    elector: Elector,
}

impl Chore for Lead {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            cx.leading = self
                .elector
                .leads(cx.store, cx.name, cx.interval * LEADER_LEASE_INTERVALS)
                .await;
            cx.claimer.lead(cx.leading);
            Ok(Next::Period)
        })
    }
    fn release<'a>(&'a mut self, store: &'a Store, node: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.elector.release(store, node))
    }
}

/// Opens the fleet's change stream on the leader while some node waits for work, and closes
/// it while none does.
struct Stream(StreamNeed);

impl Chore for Stream {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            let Some(n) = cx.notifier else {
                return Ok(Next::Period);
            };
            let wanted = self
                .0
                .wanted(
                    cx.store,
                    cx.name,
                    cx.leading,
                    cx.waiting_for_work,
                    cx.interval * FANOUT_LIVE_INTERVALS,
                )
                .await?;
            if n.watch(wanted) && cx.leading {
                tracing::debug!(
                    open = wanted,
                    "the fleet's stream: this node or another waits for work (open), or none does (closed)"
                );
            }
            Ok(Next::Period)
        })
    }
}

/// Wakes the runners of tasks an operator asked to cancel, so they stop within a pass rather
/// than at their next lease renewal.
struct CancelRequests;

impl Chore for CancelRequests {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            if cx.executor.live_runners() > 0 {
                for task in cx.store.recovery().cancel_requests(cx.name).await? {
                    cx.executor.wake_runner(task);
                }
            }
            Ok(Next::Period)
        })
    }
}

/// QueueBalance, when enabled and this node holds its lease: after claiming, so balancing
/// never delays a claim; new threads apply at the next reading.
struct Balance(Balancer);

impl Chore for Balance {
    fn run<'a, 'b: 'a>(
        &'a mut self,
        cx: &'a mut Cx<'b>,
    ) -> BoxFuture<'a, disbatch_store::Result<Next>> {
        Box::pin(async move {
            if !cx.stopping {
                self.0.tick(cx.store, cx.name).await;
            }
            Ok(Next::Period)
        })
    }
    fn release<'a>(&'a mut self, store: &'a Store, node: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.0.release(store, node))
    }
}
