//! Runner deaths: the task of a runner this node saw exit without a result is recovered at
//! once, by its queue's `on_lost`, rather than a whole lease later by whichever node looks.

use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_store::Store;
use tokio::task::JoinHandle;

use crate::maintenance::reaper::{recover_runner_death, recovery_label};
use crate::metrics::DenMetrics;
use crate::runners::live::LearnedEnd;
use disbatch_model::task::Outcome;

/// How long a dead runner's result relay may still be storing a result it handed over
/// before dying; past it the task is left to its lease, never recovered over a result.
const RELAY_GRACE: Duration = Duration::from_secs(5);
/// How long the outcome of a runner that stored its own result may take to read, for the
/// outcome metric; past it the outcome is counted as unknown rather than holding the exit.
const OUTCOME_READ: Duration = Duration::from_secs(2);

#[derive(Clone)]
pub struct RunnerDeaths {
    store: Store,
    metrics: DenMetrics,
}

impl std::fmt::Debug for RunnerDeaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunnerDeaths")
    }
}

impl RunnerDeaths {
    pub fn new(store: Store, metrics: DenMetrics) -> Self {
        RunnerDeaths { store, metrics }
    }

    /// Called when the runner of `task` (as `attempt`) exited abnormally (`exit` says how).
    /// `relay` is the task storing what the runner handed this node, if any: a result it
    /// sent before dying lands first, and the recovery then finds the attempt ended.
    /// Returns the attempt's outcome when it is known: the relayed result's, or `lost` once
    /// recovered.
    pub async fn runner_died(
        &self,
        task: ObjectId,
        attempt: ObjectId,
        exit: &str,
        relay: Option<JoinHandle<Option<LearnedEnd>>>,
    ) -> Option<LearnedEnd> {
        if let Some(relay) = relay {
            match tokio::time::timeout(RELAY_GRACE, relay).await {
                Err(_) => {
                    tracing::warn!(task = %task, "the dead runner's relayed result is still being stored; its task is left to its lease");
                    return None;
                }
                Ok(Ok(Some(outcome))) => return Some(outcome),
                Ok(_) => {}
            }
        }
        match recover_runner_death(&self.store, task, attempt, exit).await {
            Ok(Some(how)) => {
                self.metrics.recovered(recovery_label(how));
                Some(LearnedEnd::plain(Outcome::Lost))
            }
            Ok(None) => None,
            Err(e) => {
                self.metrics.db_error("recover_runner_death");
                tracing::warn!(task = %task, error = %e, "could not recover the task of a runner that died; its lease will");
                None
            }
        }
    }

    /// The outcome recorded for `attempt` by a runner that stored its own result (too much
    /// output to relay, or this node could not store it): one read by `_id`, at most
    /// `OUTCOME_READ`.
    pub async fn recorded_outcome(&self, attempt: ObjectId) -> Option<LearnedEnd> {
        match tokio::time::timeout(OUTCOME_READ, self.store.results().attempt_outcome(attempt))
            .await
        {
            Ok(Ok(outcome)) => outcome.map(|(o, task_discarded)| LearnedEnd {
                outcome: o,
                task_discarded,
                // A runner that stored its own result: the leader's probe signals its retry.
                retry_at: None,
            }),
            Ok(Err(e)) => {
                self.metrics.db_error("read_outcome");
                tracing::debug!(attempt = %attempt, error = %e, "could not read the attempt's outcome");
                None
            }
            Err(_) => None,
        }
    }
}

/// How often a node looks for runners whose attempts were lost, while it has any.
pub const STALE_CHECK_EVERY: Duration = Duration::from_secs(5);

/// Kills this node's runners whose attempts were closed as lost: a runner that hangs or is
/// stopped (SIGSTOP) past its lease never learns that its task was recovered, and would hold
/// its slot, and so the node's room, for as long as it hangs. Its end then frees the slot as
/// any runner's death does; its plugin dies with it (its parent-death signal), and whatever
/// it would still write is fenced off by its attempt. Returns how many were killed.
/// `runners`: this node's own, as `Executor::own_runners` lists them (task, attempt, pid).
pub async fn kill_stale_runners(
    store: &Store,
    runners: Vec<(ObjectId, ObjectId, u32)>,
) -> disbatch_store::Result<usize> {
    let attempts: Vec<ObjectId> = runners.iter().map(|(_, a, _)| *a).collect();
    let lost = store.results().lost_attempts(&attempts).await?;
    let mut killed = 0;
    for (task, attempt, pid) in runners.into_iter().filter(|(_, a, _)| lost.contains(a)) {
        if pid <= 1 {
            continue;
        }
        let target = nix::unistd::Pid::from_raw(pid as i32);
        match nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL) {
            Ok(()) => {
                killed += 1;
                tracing::warn!(task = %task, attempt = %attempt, pid, "killed a runner whose attempt was lost (its task was recovered while it hung); its slot is free");
            }
            Err(e) => {
                tracing::debug!(task = %task, pid, error = %e, "could not kill a runner whose attempt was lost")
            }
        }
    }
    Ok(killed)
}
