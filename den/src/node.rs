//! The node loop: heartbeat, reap, claim each pass; on shutdown, give back unstarted claims.

use std::future::Future;
use std::time::{Duration, Instant};

use disbatch_core::store::{Heartbeat, Store};
use disbatch_core::Result;

use crate::balancer::Balancer;
use crate::claimer::Claimer;
use crate::executor::Executor;
use crate::reaper::reap;

/// How often a node looks for attempt records that a dead runner left open.
const ATTEMPT_REPAIR_EVERY: Duration = Duration::from_secs(10);

/// Longest wait between passes while the database keeps failing: short, so a node is back
/// at work within seconds of the server's return.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub struct Node {
    pub store: Store,
    pub name: String,
    pub interval: Duration,
    pub claimer: Claimer,
    pub executor: Executor,
    /// Runs QueueBalance when enabled and this node holds its lease.
    pub balancer: Balancer,
    /// Reported on the node document.
    pub runtimes: Option<Vec<String>>,
    /// When this node last closed abandoned attempt records.
    pub attempts_repaired: Instant,
}

impl Node {
    /// Runs passes until `shutdown` resolves; a failed pass is logged and retried with backoff.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        let mut on_node = 0;
        let mut failures: u32 = 0;
        let mut connected_since = Instant::now();
        loop {
            if failures > 0 {
                connected_since = Instant::now();
            }
            let connected_for = connected_since.elapsed();
            let wait = tokio::select! {
                _ = &mut shutdown => break,
                result = self.run_pass(on_node, connected_for) => match result {
                    Ok(now_on_node) => {
                        if failures > 0 {
                            tracing::info!(failures, "database reachable again; passes resumed");
                        }
                        failures = 0;
                        on_node = now_on_node;
                        self.interval
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        let wait = backoff(self.interval, failures);
                        tracing::error!(error = %e, failures, retry_in = ?wait, "pass failed");
                        wait
                    }
                },
            };
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(wait) => {}
                _ = self.executor.runner_exited(), if failures == 0 => {}
            }
        }
        self.shut_down().await;
        Ok(())
    }

    async fn run_pass(&mut self, on_node: u32, connected_for: Duration) -> Result<u32> {
        let runners = self.executor.runners();
        let limit = self
            .store
            .heartbeat(&Heartbeat {
                node: &self.name,
                pid: std::process::id(),
                version: disbatch_core::VERSION,
                running: on_node,
                runtimes: self.runtimes.as_deref(),
                runners: &runners,
            })
            .await?;
        reap(&self.store, &self.name, connected_for).await?;
        if self.attempts_repaired.elapsed() >= ATTEMPT_REPAIR_EVERY {
            let closed = self
                .store
                .close_abandoned_attempts(ATTEMPT_REPAIR_EVERY)
                .await?;
            if closed > 0 {
                tracing::info!(
                    closed,
                    "closed attempt records left open by runners that died"
                );
            }
            self.attempts_repaired = Instant::now();
        }
        self.forward_cancel_requests().await?;
        let report = self.claimer.claim_tasks(&limit, &self.executor).await?;
        // After claiming, so balancing never delays a claim; new threads apply next pass.
        self.balancer.tick(&self.store, &self.name).await;
        if report.claimed > 0 {
            tracing::debug!(
                claimed = report.claimed,
                on_node = report.on_node,
                "pass claimed tasks"
            );
        }
        Ok(report.on_node)
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

fn backoff(interval: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.min(8);
    (interval * factor).min(MAX_BACKOFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        let i = Duration::from_millis(100);
        assert_eq!(backoff(i, 1), Duration::from_millis(200));
        assert_eq!(backoff(i, 3), Duration::from_millis(800));
        assert_eq!(backoff(i, 50), MAX_BACKOFF);
        assert_eq!(backoff(Duration::from_secs(1), 50), MAX_BACKOFF);
    }
}
