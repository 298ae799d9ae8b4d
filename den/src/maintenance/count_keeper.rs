//! The count keeper: the maintenance leader's reconcile of the kept task counts with the
//! tasks, run in the background so a slow count never holds up a pass.

use std::time::Duration;

use disbatch_store::Store;

use crate::maintenance::background::Background;

/// How often the leader looks for queues due (a new queue is counted within this).
const CHECK_EVERY: Duration = Duration::from_secs(30);
/// How long after counting a queue's tasks its kept counts must stay unchanged to be
/// replaced: longer than any write takes to follow its task write with its count.
const GRACE: Duration = Duration::from_secs(3);

pub struct CountKeeper {
    /// How often a queue's kept counts are checked against its tasks (`counts_reconcile_s`):
    /// writers that keep no counts (Perl nodes, hand edits) are corrected within this, and an
    /// idle backlog is read once per period rather than on every console refresh.
    every: Duration,
    chore: Background,
}

impl CountKeeper {
    pub fn new(every: Duration) -> CountKeeper {
        CountKeeper {
            every,
            chore: Background::default(),
        }
    }

    /// Starts a reconcile when one is due and none is running (the leader calls this on each
    /// of its maintenance passes).
    pub fn tick(&mut self, store: &Store) {
        let every = self.every;
        self.chore
            .start_if_due(CHECK_EVERY.min(every), || reconcile(store.clone(), every));
    }

    /// For a node that stops leading or stops: a reconcile in flight is dropped; the next
    /// leader's finds the same queues due.
    pub fn stop(&mut self) {
        self.chore.stop();
    }
}

/// One reconcile of every queue due, with what it found in the log.
async fn reconcile(store: Store, every: Duration) {
    match store.tasks().reconcile_task_counts(every, GRACE).await {
        Ok(r) if r.corrected > 0 => tracing::info!(
            queues = r.corrected,
            tasks = r.drift,
            "task counts were off (tasks changed by writers that keep no counts: Perl nodes, hand edits, a process killed mid-write); corrected"
        ),
        Ok(r) if r.reconciled + r.busy > 0 => {
            tracing::debug!(reconciled = r.reconciled, busy = r.busy, "task counts reconciled")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not reconcile task counts; trying again later"),
    }
}
