//! The node loop: on its timer a maintenance pass (heartbeat, then the chores), and on every
//! wake-up a claim pass; on shutdown, finish the pass in flight and give back unstarted claims.

mod pass;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use disbatch_store::{Heartbeat, HeartbeatReply, NodeLimit, Result, Store};

use crate::claimer::Claimer;
use crate::count_writer::CountWriter;
use crate::maintenance::chores::{Chores, Phase};
use crate::metrics::DenMetrics;
use crate::runners::executor::Executor;
use crate::wake::notifier::Notifier;
use pass::Pacing;

/// How long a stopping node lets the pass in flight finish. Claims already sent must reach
/// their spawns: a pass dropped between the two leaves tasks marked running that no runner
/// will finish until their leases run out. Against a live server a pass takes milliseconds.
const STOPPING_PASS_GRACE: Duration = Duration::from_secs(10);

pub struct Node {
    pub store: Store,
    pub name: String,
    /// Between maintenance passes (heartbeat, chores, a fresh reading of queues).
    pub interval: Duration,
    pub claimer: Claimer,
    pub executor: Executor,
    /// The upkeep a maintenance pass runs after the heartbeat (`Chores::standard`).
    pub chores: Chores,
    /// Reported on the node document.
    pub runtimes: Option<Vec<String>>,
    pub metrics: DenMetrics,
    /// Change streams; None polls on the timer only.
    pub notifier: Option<Notifier>,
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
        let mut pacing = Pacing::new(&self);
        let count_writer = CountWriter::start(self.store.clone());
        // Set on shutdown: the pass in flight finishes but sends no new claims.
        let stopping = AtomicBool::new(false);
        loop {
            pacing.before_pass();
            if let Some(settings) = self.reloads.as_mut().and_then(crate::reload::take_new) {
                settings.apply(&mut self.claimer, &mut self.executor, &mut self.runtimes);
                // Queues this node now serves (or no longer does) are read at once.
                pacing.last_read = None;
            }
            let started = Instant::now();
            let maintenance = pacing.maintenance_due(started);
            let result = {
                let pass = self.pass(&mut pacing, maintenance, &stopping);
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
            let (wait, retry_is_next) = self.settle(&mut pacing, result, started, maintenance);
            match self
                .next_wake(shutdown.as_mut(), wait, retry_is_next, &pacing)
                .await
            {
                Some(wake) => pacing.wake = wake,
                None => break,
            }
        }
        self.chores
            .stop(Phase::BeforeClaim, &self.store, &self.name, &self.metrics)
            .await;
        self.shut_down().await;
        drop(count_writer);
        if let Some(notifier) = &self.notifier {
            notifier.stop().await;
        }
        self.store.clone().shutdown().await;
        Ok(())
    }

    /// Waits for what wakes the next pass: its time, a runner's exit, a change, a reload; None
    /// when the node stops.
    async fn next_wake(
        &self,
        shutdown: Pin<&mut impl Future<Output = ()>>,
        wait: Duration,
        retry_is_next: bool,
        pacing: &Pacing,
    ) -> Option<Wake> {
        let notifier = self.notifier.clone();
        let changed = async {
            match &notifier {
                Some(n) => n.notified().await,
                None => std::future::pending().await,
            }
        };
        let reloaded = crate::reload::changed(self.reloads.clone());
        let healthy = pacing.failures == 0;
        let wake = tokio::select! {
            _ = shutdown => return None,
            _ = reloaded => Wake::Reload,
            _ = tokio::time::sleep(wait) => if retry_is_next { Wake::RetryDue } else { Wake::Timer },
            _ = self.executor.runner_exited(), if healthy => Wake::RunnerExited,
            _ = changed, if healthy => Wake::Change,
        };
        // Change-stream wake-ups are counted per event by the notifier.
        match wake {
            Wake::Timer => self.metrics.wakeup("timer"),
            Wake::RetryDue => self.metrics.wakeup("retry_due"),
            Wake::RunnerExited => self.metrics.wakeup("runner_exit"),
            Wake::Change | Wake::Reload => {}
        }
        Some(wake)
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
            .nodes()
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

    /// Claimed-but-unstarted tasks go back to the queue; started runners keep running.
    async fn shut_down(&mut self) {
        tracing::info!(node = %self.name, "stopping: no more claims");
        for attempt in 1..=3 {
            match self
                .store
                .recovery()
                .give_back_claimed(&self.name, None)
                .await
            {
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
        self.chores
            .stop(Phase::AfterClaim, &self.store, &self.name, &self.metrics)
            .await;
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
