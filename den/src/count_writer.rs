//! The count writer: writes the task-count changes this node's claims and results noted, a few
//! times a second, so a busy node makes one count write per queue per period instead of one
//! per batch.

use disbatch_store::{Store, DEFERRED_COUNTS_MAX_AGE};
use tokio::task::JoinHandle;

/// Runs until dropped; the store's `shutdown` writes what is left after it.
pub struct CountWriter(JoinHandle<()>);

impl CountWriter {
    /// Switches `store` (and every clone of it) to deferred count writes and starts writing
    /// them every `DEFERRED_COUNTS_MAX_AGE`.
    pub fn start(store: Store) -> CountWriter {
        store.tasks().defer_count_writes();
        CountWriter(tokio::spawn(async move {
            let mut every = tokio::time::interval(DEFERRED_COUNTS_MAX_AGE);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                // Failed changes are lost, not retried: the reconcile repairs the counts, and
                // a retry could write a change twice when only the reply was lost.
                if let Err(e) = store.tasks().flush_counts().await {
                    tracing::warn!(error = %e, "could not write task counts; the maintenance leader's reconcile will repair them");
                }
            }
        }))
    }
}

impl Drop for CountWriter {
    fn drop(&mut self) {
        self.0.abort();
    }
}
