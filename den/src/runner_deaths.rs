//! Runner deaths: the task of a runner this node saw exit without a result is recovered at
//! once, by its queue's `on_lost`, rather than a whole lease later by whichever node looks.

use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_core::store::Store;
use tokio::task::JoinHandle;

use crate::metrics::DenMetrics;
use crate::reaper::{recover_runner_death, recovery_label};

/// How long a dead runner's result relay may still be storing a result it handed over
/// before dying; past it the task is left to its lease, never recovered over a result.
const RELAY_GRACE: Duration = Duration::from_secs(5);

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
    pub async fn runner_died(
        &self,
        task: ObjectId,
        attempt: ObjectId,
        exit: &str,
        relay: Option<JoinHandle<()>>,
    ) {
        if let Some(relay) = relay {
            if tokio::time::timeout(RELAY_GRACE, relay).await.is_err() {
                tracing::warn!(task = %task, "the dead runner's relayed result is still being stored; its task is left to its lease");
                return;
            }
        }
        match recover_runner_death(&self.store, task, attempt, exit).await {
            Ok(Some(how)) => self.metrics.recovered(recovery_label(how)),
            Ok(None) => {}
            Err(e) => {
                self.metrics.db_error("recover_runner_death");
                tracing::warn!(task = %task, error = %e, "could not recover the task of a runner that died; its lease will");
            }
        }
    }
}
