//! The releaser: settles what waits on the tasks this node's runners ended, in batches, so a
//! dependent starts at once rather than at the maintenance leader's next sweep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_store::{Settled, Store};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, Notify};

use crate::metrics::DenMetrics;

/// Ended tasks waiting to be settled, at most; past it one is left to the leader's sweep,
/// which finds it by its mark.
const MAX_WAITING: usize = 10_000;
/// Ended tasks settled together: one read of their statuses, one count-down of each task
/// that waits for them.
const BATCH: usize = 1_000;
/// Least time between two settles of this node while it runs tasks. A settle costs about
/// six round trips however many ends it takes, and rewrites each waiting task it counts
/// down: a fan-in's merge task holds thousands of ids, and the server rewrites it and its
/// index entries whole on every write (30–40 ms at 10 000 on SecantusDB). Ends that come
/// faster than this gather; an end after a quiet second, or one after which the node runs
/// nothing and finds nothing to claim, is settled at once: no more ends are coming to gather
/// then, and a waiting task (a chain's next step, a fan-in's merge) is all it could run.
const MIN_GAP: Duration = Duration::from_secs(1);
/// The gap after a settle that released and cancelled nothing: it only counted ends off
/// tasks that still wait for others (a fan-in's merge, a batch's callback), so hurrying the
/// next one would only count down sooner. The ends gather for longer: a fan-in of 10 000
/// tasks was settled 27 times at the 1 s gap, each costing the server about 110 ms
/// (BENCHMARKS.md "Workflows"). The node running dry still settles at once, and a full
/// batch is settled without waiting, so ends never pile up past a settle's reach.
const COUNTING_GAP: Duration = Duration::from_secs(5);

/// A handle on the settling task; clones share it.
#[derive(Clone, Debug)]
pub struct Releaser {
    ended: mpsc::Sender<ObjectId>,
    idle: Arc<Notify>,
    store: Store,
}

impl Releaser {
    pub fn start(store: Store, metrics: DenMetrics) -> Releaser {
        let (ended, waiting) = mpsc::channel(MAX_WAITING);
        let idle = Arc::new(Notify::new());
        tokio::spawn(settle_ended(store.clone(), waiting, idle.clone(), metrics));
        Releaser { ended, idle, store }
    }

    /// This node claimed a task others wait for: workflows are in use, and its sweep (as
    /// leader) runs even where its role cannot list indexes.
    pub fn saw_waited_for(&self) {
        self.store.limits().note_workflows_in_use();
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

    /// The node runs nothing and found nothing to claim: what is gathered is settled now, not
    /// after the gap. (A stale wake-up costs one settle sooner, no more.)
    pub fn node_idle(&self) {
        self.idle.notify_one();
    }
}

async fn settle_ended(
    store: Store,
    mut waiting: mpsc::Receiver<ObjectId>,
    idle: Arc<Notify>,
    metrics: DenMetrics,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last: Option<tokio::time::Instant> = None;
    let mut gap = MIN_GAP;
    while waiting.recv_many(&mut batch, BATCH).await > 0 {
        if let (Some(last), true) = (last, batch.len() < BATCH) {
            tokio::select! {
                () = tokio::time::sleep_until(last + gap) => {}
                () = idle.notified() => {}
            }
            while batch.len() < BATCH {
                match waiting.try_recv() {
                    Ok(task) => batch.push(task),
                    Err(_) => break,
                }
            }
        }
        last = Some(tokio::time::Instant::now());
        match store.workflows().settle_dependents(&batch).await {
            Ok(settled) => {
                metrics.dependencies_settled(&settled);
                gap = gap_after(&settled);
            }
            Err(e) => {
                // Their marks stay: the maintenance leader's sweep settles them.
                metrics.db_error("settle_dependents");
                tracing::warn!(tasks = batch.len(), error = %e, "could not settle ended tasks' dependents; the leader's sweep will");
                gap = MIN_GAP;
            }
        }
        batch.clear();
    }
}

/// The least time before the next settle, after one that did `settled`.
fn gap_after(settled: &Settled) -> Duration {
    match settled.released + settled.cancelled {
        0 => COUNTING_GAP,
        _ => MIN_GAP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_settle_that_only_counted_down_gathers_longer_and_one_that_moved_a_task_does_not() {
        let counted = Settled {
            settled: 600,
            ..Settled::default()
        };
        assert_eq!(gap_after(&counted), COUNTING_GAP);
        assert_eq!(gap_after(&Settled::default()), COUNTING_GAP);
        for moved in [
            Settled {
                released: 1,
                ..counted.clone()
            },
            Settled {
                cancelled: 1,
                ..counted.clone()
            },
        ] {
            assert_eq!(gap_after(&moved), MIN_GAP, "{moved:?}");
        }
        assert!(COUNTING_GAP > MIN_GAP);
    }
}

/// The maintenance leader's catch-all sweep of ended tasks still marked as waited for, on a
/// task of its own: a cancel cascading down a chain takes a few round trips per level (10 000
/// levels took 34 s), and the leader's pass, its claims among them, must not wait for it.
#[derive(Debug)]
pub struct DependencySweep {
    next: Instant,
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Default for DependencySweep {
    fn default() -> DependencySweep {
        DependencySweep {
            next: Instant::now(),
            running: None,
        }
    }
}

impl DependencySweep {
    /// Starts a sweep when one is due and the last has finished; the next is due `every`
    /// after this one starts.
    pub fn tick(&mut self, store: &Store, metrics: &DenMetrics, every: Duration) {
        if self.running.as_ref().is_some_and(|h| !h.is_finished()) || Instant::now() < self.next {
            return;
        }
        let (store, metrics) = (store.clone(), metrics.clone());
        self.running = Some(tokio::spawn(async move {
            match store.workflows().settle_ended_dependencies().await {
                Ok(settled) => metrics.dependencies_settled(&settled),
                Err(e) => {
                    metrics.db_error("settle_ended_dependencies");
                    tracing::warn!(error = %e, "the sweep of ended tasks others wait for failed; the next one tries again");
                }
            }
        }));
        self.next = Instant::now() + every;
    }
}

impl Drop for DependencySweep {
    fn drop(&mut self) {
        if let Some(h) = self.running.take() {
            h.abort();
        }
    }
}
