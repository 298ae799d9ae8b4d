//! The worker host: the task runner in `--worker-host` mode, started by a node in its own
//! session. It takes the node's handoffs of persistent-queue tasks on stdin, runs each in a
//! worker of its pool, stores results itself (in batches), and reports each ended task on
//! stdout. At end of input (the node stopped, restarted or retired it) it drains: takes no new
//! task, finishes and records those running, stops its workers and exits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::Document;
use disbatch_config::Config;
use disbatch_model::task::Outcome;
use disbatch_model::wire::handoff::{host_frame, Handoff};
use disbatch_model::wire::relay::{read_frame, write_frames};
use tokio::io::BufReader;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::batch::BatchWriter;
use super::node_pipe;
use super::Pool;
use crate::connection::LazyStore;
use crate::runner::{run_handed_off, RunReport};
use crate::sink::ResultSink;
use crate::supervisor::Wake;

/// The node's frames are read through a buffer this large: a burst of handoffs in one read.
const FRAME_BUFFER: usize = 64 * 1024;

/// At most this many ended tasks reported in one write.
const REPORTS_PER_WRITE: usize = 64;

/// How often idle workers are looked at for `worker_idle_s`.
const IDLE_CHECK: Duration = Duration::from_secs(1);

type Wakes = Arc<Mutex<HashMap<ObjectId, mpsc::Sender<()>>>>;

/// Serves the node until its end of stdin closes, then drains. Returns the tasks run.
pub async fn serve(config: Config, store: LazyStore, node: String) -> u64 {
    // Task counts are written a few times a second, not once per result batch (as a node
    // writes its own): a busy host makes one count write per queue per period.
    let counts = tokio::spawn(write_counts(store.clone()));
    let pool = Pool::default();
    let batch = BatchWriter::start(store.clone());
    let (ended_tx, ended_rx) = mpsc::unbounded_channel::<Document>();
    let reporter = tokio::spawn(report_ended(ended_rx));
    let wakes: Wakes = Arc::default();
    let mut running = JoinSet::new();
    // Frames are read by a task of their own: a read cut short by `select!` would lose the
    // stream's place.
    let (frames_tx, mut frames) = mpsc::channel::<std::io::Result<Document>>(64);
    tokio::spawn(async move {
        let mut stdin = BufReader::with_capacity(FRAME_BUFFER, node_pipe::reader());
        loop {
            let frame = match read_frame(&mut stdin).await {
                Ok(Some(d)) => Ok(d),
                Ok(None) => return,
                Err(e) => Err(e),
            };
            let failed = frame.is_err();
            if frames_tx.send(frame).await.is_err() || failed {
                return;
            }
        }
    });
    let mut idle_check = tokio::time::interval(IDLE_CHECK);
    let mut handed = 0u64;
    let config = Arc::new(config);
    let node = Arc::new(node);
    loop {
        tokio::select! {
            frame = frames.recv() => match frame.transpose() {
                Ok(Some(d)) => {
                    if let Ok(task) = d.get_object_id(host_frame::WAKE) {
                        let waker = wakes.lock().ok().and_then(|w| w.get(&task).cloned());
                        if let Some(w) = waker {
                            let _ = w.try_send(());
                        }
                        continue;
                    }
                    let handoff = match Handoff::from_document(&d) {
                        Ok(h) => h,
                        Err(e) => {
                            tracing::warn!("worker host: skipped a frame from the node: {e}");
                            continue;
                        }
                    };
                    if let Some(anchor) = handoff.clock {
                        disbatch_model::fleet_time::adopt(anchor);
                    }
                    handed += 1;
                    let (config, store, node) = (config.clone(), store.clone(), node.clone());
                    let (pool, batch, wakes, ended) = (pool.clone(), batch.clone(), wakes.clone(), ended_tx.clone());
                    // One thread (main's runtime): every worker is started from the thread that
                    // armed its parent-death signal.
                    running.spawn(async move {
                        run_one(&config, &store, &node, handoff, &pool, &batch, &wakes, &ended).await
                    });
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("worker host: the node's stream cannot be read ({e}); draining");
                    break;
                }
            },
            _ = idle_check.tick() => pool.stop_idle(),
            Some(_) = running.join_next() => {}
        }
    }
    tracing::info!(
        running = running.len(),
        "worker host draining: no new task; finishing those running"
    );
    loop {
        tokio::select! {
            joined = running.join_next() => if joined.is_none() { break },
            _ = idle_check.tick() => pool.stop_idle(),
        }
    }
    pool.drain().await;
    counts.abort();
    if let Ok(db) = store.get().await {
        if let Err(e) = db.tasks().flush_counts().await {
            tracing::warn!(error = %e, "worker host: could not write the last task counts; the reconcile repairs them");
        }
    }
    drop(ended_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), reporter).await;
    let (started, retired) = pool.counts();
    tracing::info!(
        tasks = handed,
        workers_started = started,
        workers_stopped = retired,
        "worker host stopped"
    );
    handed
}

/// Defers the store's count writes and writes them every `DEFERRED_COUNTS_MAX_AGE`, once the
/// store is connected (the first task connects it).
async fn write_counts(store: LazyStore) {
    let db = loop {
        match store.get().await {
            Ok(db) => break db,
            Err(e) => {
                tracing::debug!(error = %e, "worker host: not connected yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    db.tasks().defer_count_writes();
    let mut every = tokio::time::interval(disbatch_store::DEFERRED_COUNTS_MAX_AGE);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        // Lost, not retried, as the node's count writer does: the reconcile repairs counts.
        if let Err(e) = db.tasks().flush_counts().await {
            tracing::warn!(error = %e, "worker host: could not write task counts");
        }
    }
}

/// Runs one handed-over task and reports its end to the node.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    config: &Config,
    store: &LazyStore,
    node: &str,
    handoff: Handoff,
    pool: &Pool,
    batch: &BatchWriter,
    wakes: &Wakes,
    ended: &mpsc::UnboundedSender<Document>,
) {
    let task = handoff.task_id();
    let attempt = handoff.attempt;
    let (wake_tx, wake_rx) = mpsc::channel(1);
    if let Ok(mut w) = wakes.lock() {
        w.insert(task, wake_tx);
    }
    let report = run_handed_off(
        config,
        store,
        handoff,
        node,
        Some(Wake::Channel(wake_rx)),
        ResultSink::Host(batch),
        Some(pool),
    )
    .await;
    if let Ok(mut w) = wakes.lock() {
        w.remove(&task);
    }
    use disbatch_store::TaskEnd;
    let task_discarded = matches!(report, Ok(RunReport::Recorded(TaskEnd::Discarded(_), _)));
    let retry_at = match report {
        Ok(RunReport::Recorded(TaskEnd::Retry { not_before, .. }, _)) => not_before,
        _ => None,
    };
    let outcome = match report {
        Ok(RunReport::Recorded(_, outcome)) => Some(outcome),
        Ok(RunReport::Discarded) => Some(Outcome::Discarded),
        Ok(RunReport::NotClaimed) => Some(Outcome::Discarded),
        Err(e) => {
            // The lease passes and recovery applies `on_lost`, as for a runner that failed.
            tracing::error!(task = %task, error = %e, "worker host: could not run or record the task");
            None
        }
    };
    let report = host_frame::Ended {
        task,
        attempt,
        outcome,
        task_discarded,
        retry_at,
    };
    let _ = ended.send(report.to_document());
}

/// Writes ended tasks to the node, those ended together in one write; a node that is gone is
/// not an error (results are stored).
async fn report_ended(mut ended: mpsc::UnboundedReceiver<Document>) {
    let mut stdout = node_pipe::writer();
    let mut listening = true;
    let mut burst = Vec::with_capacity(REPORTS_PER_WRITE);
    while ended.recv_many(&mut burst, REPORTS_PER_WRITE).await > 0 {
        if listening && write_frames(&mut stdout, &burst).await.is_err() {
            tracing::info!(
                "worker host: the node stopped listening; results are still stored here"
            );
            listening = false;
        }
        burst.clear();
    }
}
