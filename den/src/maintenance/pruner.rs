//! The pruner: the maintenance leader deletes ended tasks past their queue's retention
//! (`retain`, over its config's), with their attempts and output files, in bounded batches in
//! the background, so a long history neither grows for ever nor holds up a pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::DateTime;
use disbatch_model::fleet_time;
use disbatch_model::retention::{Ended, Retention};
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{Pruned, Store};

use crate::maintenance::background::Background;
use crate::metrics::DenMetrics;

/// How often a run starts (when none is running).
const EVERY: Duration = Duration::from_secs(5);
/// Tasks deleted per batch: one read of their ids, three deletes. SecantusDB reads a whole
/// index range before it applies a limit, so a read of 500 ids cost as much as one of 5 000
/// (0.28 s beside 100 000 ended tasks): per task, a batch of 5 000 cost 0.095 ms and one of
/// 500 cost 0.63.
const BATCH: usize = 5_000;
/// Tasks one run deletes at most; a larger backlog is worked through run after run.
const MOST_PER_RUN: u64 = 20_000;
/// After each batch, this many times as long as it took: deletes are costly writes, and back
/// to back they took a running queue from 218 to 126 tasks/s. Pruning takes a tenth of the
/// server's time at most, so the fleet's claims and results go first.
const PAUSE_FACTOR: u32 = 9;
/// The least pause between two batches.
const MIN_PAUSE: Duration = Duration::from_millis(20);

pub struct Pruner {
    default: Retention,
    chore: Background,
    /// Queues whose `retain` could not be read, with the reason last logged.
    unreadable: Arc<Mutex<HashMap<ObjectId, String>>>,
    /// Whether this term made sure of the index pruning reads by.
    index_made: Arc<Mutex<bool>>,
    /// The last run's failure, logged when it changes (a role without `remove` on tasks
    /// fails every run alike).
    failed: Arc<Mutex<Option<String>>>,
}

impl Pruner {
    /// `default`: the retention of queues that set none (the config's `retain`).
    pub fn new(default: Retention) -> Pruner {
        Pruner {
            default,
            chore: Background::default(),
            unreadable: Arc::default(),
            index_made: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// Starts a run over `queues` when one is due and none is running (the leader calls this
    /// on each of its maintenance passes).
    pub fn tick(&mut self, store: &Store, queues: &[Queue], metrics: &DenMetrics) {
        let policies: Vec<(ObjectId, String, Retention)> = queues
            .iter()
            .filter_map(|q| self.policy(q))
            .filter(|(_, _, r)| r.prunes())
            .collect();
        if policies.is_empty() {
            return;
        }
        let (store, metrics, index_made, failed) = (
            store.clone(),
            metrics.clone(),
            self.index_made.clone(),
            self.failed.clone(),
        );
        self.chore.start_if_due(EVERY, move || async move {
            let result = prune(&store, &policies, &metrics, &index_made).await;
            let mut failed = failed.lock().unwrap_or_else(PoisonError::into_inner);
            match result {
                Ok(()) => {
                    if failed.take().is_some() {
                        tracing::info!("pruning ended tasks works again");
                    }
                }
                Err(e) => {
                    metrics.db_error("prune");
                    let text = e.to_string();
                    if failed.as_deref() != Some(text.as_str()) {
                        tracing::warn!(error = %text, "could not prune ended tasks (a role made before retention lacks `remove` on tasks, attempts, tasks.files and tasks.chunks: run create-users --drop-roles); trying again every run, logged again when the error changes");
                        *failed = Some(text);
                    }
                }
            }
        });
    }

    /// For a node that stops leading or stops: a run in flight is dropped between two
    /// writes; the next leader carries on from what is left.
    pub fn stop(&mut self) {
        self.chore.stop();
        *self
            .index_made
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = false;
    }

    /// The queue's retention; None (logged once per reason) when its `retain` is unreadable:
    /// that queue keeps everything until it is fixed.
    fn policy(&self, q: &Queue) -> Option<(ObjectId, String, Retention)> {
        let mut unreadable = self
            .unreadable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match q.retention(&self.default) {
            Ok(r) => {
                unreadable.remove(&q.id);
                Some((q.id, q.name.clone(), r))
            }
            Err(why) => {
                if unreadable.get(&q.id) != Some(&why) {
                    tracing::warn!(queue = %q.id, name = %q.name, "ended tasks are kept, not pruned: {why}");
                    unreadable.insert(q.id, why);
                }
                None
            }
        }
    }
}

async fn prune(
    store: &Store,
    policies: &[(ObjectId, String, Retention)],
    metrics: &DenMetrics,
    index_made: &Mutex<bool>,
) -> Result<()> {
    let made = *index_made.lock().unwrap_or_else(PoisonError::into_inner);
    if !made {
        store.tasks().ensure_retention_index().await?;
        *index_made.lock().unwrap_or_else(PoisonError::into_inner) = true;
    }
    let mut budget = MOST_PER_RUN;
    for (queue, name, retention) in policies {
        let mut done = Pruned::default();
        for state in Ended::ALL {
            let Some(keep) = retention.get(state) else {
                continue;
            };
            let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
            let before =
                DateTime::from_millis(fleet_time::now().timestamp_millis().saturating_sub(keep_ms));
            while budget > 0 {
                let limit = BATCH.min(usize::try_from(budget).unwrap_or(BATCH));
                let batch_started = std::time::Instant::now();
                let pruned = store
                    .tasks()
                    .prune_ended(*queue, state, before, limit)
                    .await?;
                let took = batch_started.elapsed();
                metrics.tasks_pruned(name, state.as_str(), pruned.tasks);
                budget = budget.saturating_sub(pruned.tasks);
                done.tasks += pruned.tasks;
                done.attempts += pruned.attempts;
                done.files += pruned.files;
                if pruned.tasks < limit as u64 {
                    break;
                }
                tokio::time::sleep((took * PAUSE_FACTOR).max(MIN_PAUSE)).await;
            }
        }
        if done.tasks > 0 {
            tracing::info!(
                %queue,
                name = %name,
                tasks = done.tasks,
                attempts = done.attempts,
                files = done.files,
                "pruned ended tasks past their retention"
            );
        }
        if budget == 0 {
            break;
        }
    }
    Ok(())
}
