//! The releaser: settles what waits on the tasks this node's runners ended, in batches, so a
//! dependent starts at once rather than at the maintenance leader's next sweep.

use bson::oid::ObjectId;
use disbatch_core::store::Store;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::metrics::DenMetrics;

/// Ended tasks waiting to be settled, at most; past it one is left to the leader's sweep,
/// which finds it by its mark.
const MAX_WAITING: usize = 10_000;
/// Ended tasks settled together: one read of their statuses, one pull from their dependents.
const BATCH: usize = 1_000;
/// Least time between two settles of this node. A settle costs about five round trips
/// however many ends it takes, and rewrites each waiting task it counts down: a fan-in's
/// merge task holds thousands of ids, and the server rewrites it and its index entries whole
/// on every write (70 ms at 10 000 on SecantusDB). Ends that come faster than this gather;
/// an end after a quiet second is settled at once, so a chain of tasks waits no longer.
const MIN_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// A handle on the settling task; clones share it.
#[derive(Clone, Debug)]
pub struct Releaser {
    ended: mpsc::Sender<ObjectId>,
    store: Store,
}

impl Releaser {
    pub fn start(store: Store, metrics: DenMetrics) -> Releaser {
        let (ended, waiting) = mpsc::channel(MAX_WAITING);
        tokio::spawn(settle_ended(store.clone(), waiting, metrics));
        Releaser { ended, store }
    }

    /// This node claimed a task others wait for: workflows are in use, and its sweep (as
    /// leader) runs even where its role cannot list indexes.
    pub fn saw_waited_for(&self) {
        self.store.note_workflows_in_use();
    }

    /// A task others wait for has ended here (its result is stored): settle it soon. Never
    /// waits.
    pub fn task_ended(&self, task: ObjectId) {
        match self.ended.try_send(task) {
            Ok(()) => {}
            Err(TrySendError::Full(t)) | Err(TrySendError::Closed(t)) => {
                tracing::debug!(task = %t, "ended task left to the leader's sweep: too many waiting");
            }
        }
    }
}

async fn settle_ended(store: Store, mut waiting: mpsc::Receiver<ObjectId>, metrics: DenMetrics) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last: Option<tokio::time::Instant> = None;
    while waiting.recv_many(&mut batch, BATCH).await > 0 {
        if let Some(last) = last {
            tokio::time::sleep_until(last + MIN_GAP).await;
            while batch.len() < BATCH {
                match waiting.try_recv() {
                    Ok(task) => batch.push(task),
                    Err(_) => break,
                }
            }
        }
        last = Some(tokio::time::Instant::now());
        match store.settle_dependents(&batch).await {
            Ok(settled) => metrics.dependencies_settled(&settled),
            Err(e) => {
                // Their marks stay: the maintenance leader's sweep settles them.
                metrics.db_error("settle_dependents");
                tracing::warn!(tasks = batch.len(), error = %e, "could not settle ended tasks' dependents; the leader's sweep will");
            }
        }
        batch.clear();
    }
}
