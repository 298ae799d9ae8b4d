//! The notifier: the fleet's one change stream, on queue documents (queue changes, and the
//! work signals our writers write when tasks are queued) and task inserts (whoever made
//! them), held by the maintenance leader, which claims on its events and passes them on to the other
//! nodes through their node documents (`Store::signal_nodes`, read back by their heartbeats).
//! One stream, not one per node: the server reads every write of the database once for each
//! open stream (SecantusDB, measured: 50 streams kept it at a full core for 13 s after a bulk
//! insert into another collection), and an idle fleet's heartbeats are writes too. When the
//! server has no change streams, the loop's timer is the fallback.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bson::oid::ObjectId;

use disbatch_config::process::backoff::Backoff;
use disbatch_model::fleet_time;
use disbatch_store::Error;
use disbatch_store::{InsertedTask, QueueEvent, Store, WorkEvent, WorkSignal};
use futures::{Stream, StreamExt};
use tokio::sync::{watch, Notify};

use crate::metrics::DenMetrics;

/// Longest wait before trying to open the streams again after they failed.
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct Notifier {
    wake: Arc<Notify>,
    queues_changed: Arc<AtomicBool>,
    requeued: Arc<AtomicBool>,
    /// Whether the stream should be open.
    want_streams: Arc<watch::Sender<bool>>,
    /// What the events reported since the last `take_signalled`, for the other nodes.
    signalled: Arc<Mutex<Signalled>>,
    /// Whether the stream is open now and carries task inserts (every insert is seen while it
    /// is).
    sees_inserts: Arc<AtomicBool>,
    /// Since the last `take_delays_changed`: a delayed task was inserted, tasks were queued
    /// again or a queue changed, so delayed tasks may exist that the leader did not know of.
    delays_changed: Arc<AtomicBool>,
    /// The watcher, taken by `stop`.
    watcher: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

/// The queues the stream's events named since they were last taken.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Signalled {
    /// Queues where tasks were queued (or queued again).
    pub queues: HashSet<ObjectId>,
    /// A queue document changed (or one without an ObjectId `_id` signalled): every node
    /// reads its queues, since a new queue is in no node's `serves` yet.
    pub all: bool,
}

impl Signalled {
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty() && !self.all
    }
}

impl Notifier {
    /// Starts the watcher in the background; an idle stream asks the server again every
    /// `await_time`. The stream starts closed: it opens when the node leads (`watch`).
    pub fn start(store: Store, metrics: DenMetrics, await_time: Duration) -> Notifier {
        let notifier = Notifier {
            wake: Arc::new(Notify::new()),
            queues_changed: Arc::new(AtomicBool::new(false)),
            requeued: Arc::new(AtomicBool::new(false)),
            want_streams: Arc::new(watch::Sender::new(false)),
            signalled: Arc::new(Mutex::new(Signalled::default())),
            sees_inserts: Arc::new(AtomicBool::new(false)),
            delays_changed: Arc::new(AtomicBool::new(true)),
            watcher: Arc::default(),
        };
        let watcher = tokio::spawn(keep_watching(store, notifier.clone(), metrics, await_time));
        *notifier
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(watcher);
        notifier
    }

    /// Ends the watcher and drops its stream, for a node about to close its database client:
    /// an open change stream's cursor keeps the client from closing (it waited the full 5 s).
    pub async fn stop(&self) {
        let watcher = self
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(watcher) = watcher {
            watcher.abort();
            // Cancelled is the expected end; a panic in it was already reported by its hook.
            let _ = watcher.await;
        }
        self.sees_inserts.store(false, Ordering::Release);
    }

    /// Resolves at the next signal (or at once if one came since the last call).
    pub async fn notified(&self) {
        self.wake.notified().await
    }

    /// True once after a queue document changed: the claimer must read queues again.
    pub fn take_queues_changed(&self) -> bool {
        self.queues_changed.swap(false, Ordering::AcqRel)
    }

    /// True once after tasks were queued again: claim windows may have passed them by.
    pub fn take_requeued(&self) -> bool {
        self.requeued.swap(false, Ordering::AcqRel)
    }

    /// Opens (true) or closes (false) the stream; true if that changed what was asked.
    /// Opening it wakes the node once it is open, so work that came while it was closed is
    /// not left for the timer.
    pub fn watch(&self, wanted: bool) -> bool {
        self.want_streams
            .send_if_modified(|w| std::mem::replace(w, wanted) != wanted)
    }

    /// Whether the stream is open and carries task inserts: none goes unseen meanwhile.
    pub fn sees_inserts(&self) -> bool {
        self.sees_inserts.load(Ordering::Acquire)
    }

    /// True once after delayed tasks may have appeared (see `delays_changed`).
    pub fn take_delays_changed(&self) -> bool {
        self.delays_changed.swap(false, Ordering::AcqRel)
    }

    /// The queues signalled since the last call.
    pub fn take_signalled(&self) -> Signalled {
        std::mem::take(
            &mut *self
                .signalled
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    fn pass_on(&self, event: WorkEvent, metrics: &DenMetrics) {
        match event {
            WorkEvent::Queue(e) => self.signal(e, metrics),
            WorkEvent::Inserted(t) => self.inserted(t, metrics),
        }
    }

    /// A task inserted and claimable now wakes the node and its queue's nodes; a delayed one
    /// is left to the leader's come-due probe, and one inserted in another state to no one.
    fn inserted(&self, task: InsertedTask, metrics: &DenMetrics) {
        let due = task.not_before.is_none_or(|at| at <= fleet_time::now());
        if task.queued && !due {
            self.delays_changed.store(true, Ordering::Release);
        }
        let (true, true, Some(queue)) = (task.queued, due, task.queue) else {
            return;
        };
        let new = self
            .signalled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .queues
            .insert(queue);
        // A bulk insert is one wake-up per queue until the node takes the signals.
        if new {
            metrics.wakeup("change_stream");
            self.wake.notify_one();
        }
    }

    fn signal(&self, event: QueueEvent, metrics: &DenMetrics) {
        match event.signal {
            WorkSignal::Tasks => {}
            WorkSignal::Requeued => {
                self.requeued.store(true, Ordering::Release);
                self.delays_changed.store(true, Ordering::Release);
            }
            WorkSignal::Queues => {
                self.queues_changed.store(true, Ordering::Release);
                self.delays_changed.store(true, Ordering::Release);
            }
        }
        {
            let mut signalled = self
                .signalled
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match (event.signal, event.queue) {
                (WorkSignal::Tasks | WorkSignal::Requeued, Some(queue)) => {
                    // Bounded by the fleet's queues; taken at every pass.
                    signalled.queues.insert(queue);
                }
                _ => signalled.all = true,
            }
        }
        metrics.wakeup("change_stream");
        self.wake.notify_one();
    }
}

/// Keeps the change stream open while the node wants it, passing its signals on; reopens it
/// after a failure with a jittered backoff (after an outage or a failover, a fleet's streams
/// reopen spread over time).
async fn keep_watching(
    store: Store,
    notifier: Notifier,
    metrics: DenMetrics,
    await_time: Duration,
) {
    let mut retry = Backoff::new(Duration::from_secs(1), MAX_RETRY);
    let mut wanted = notifier.want_streams.subscribe();
    let mut said_polling = false;
    let mut opened_before = false;
    loop {
        if wanted.wait_for(|w| *w).await.is_err() {
            return;
        }
        match store.queues().watch_work(await_time).await {
            Ok(stream) => {
                if !stream.sees_inserts {
                    tracing::warn!("watching queues only: this user may not watch the database (grant `changeStream` on it: see the book's operating/mongodb.md, Roles and privileges), so tasks other writers insert are found by a probe on each of the leader's passes");
                } else if !opened_before || said_polling {
                    tracing::info!("watching queues for work signals and task inserts (for the fleet, while leading): claims start on their events");
                } else {
                    tracing::debug!("change stream open");
                }
                opened_before = true;
                said_polling = false;
                retry.reset();
                metrics.change_stream_open(true);
                notifier
                    .sees_inserts
                    .store(stream.sees_inserts, Ordering::Release);
                // What came while it was closed has no event, queue changes included (a
                // queue closed meanwhile must not be claimed from on an old reading): a claim
                // pass on a fresh reading, and signals for every node, cover it.
                notifier.queues_changed.store(true, Ordering::Release);
                notifier
                    .signalled
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .all = true;
                notifier.delays_changed.store(true, Ordering::Release);
                notifier.wake.notify_one();
                let mut stream = stream.events;
                let ended = tokio::select! {
                    ended = pass_on(&mut stream, &notifier, &metrics) => Some(ended.err()),
                    _ = wanted.wait_for(|w| !*w) => None,
                };
                metrics.change_stream_open(false);
                notifier.sees_inserts.store(false, Ordering::Release);
                match ended {
                    None => {
                        tracing::debug!(
                            "change stream closed: the node no longer leads, or no node waits for work"
                        );
                        continue;
                    }
                    Some(Some(e)) => {
                        tracing::warn!(error = %e, "change stream failed; polling until it is back");
                        metrics.db_error("change_stream");
                    }
                    Some(None) => tracing::info!("change stream ended; opening it again"),
                }
            }
            Err(e) => {
                if !said_polling {
                    tracing::warn!(error = %e, "no change streams on this server; polling every pass");
                }
                said_polling = true;
            }
        }
        tokio::time::sleep(retry.next_delay()).await;
    }
}

/// Passes a stream's signals on until it ends (Ok) or fails.
async fn pass_on(
    stream: &mut (impl Stream<Item = Result<WorkEvent, Error>> + Unpin),
    notifier: &Notifier,
    metrics: &DenMetrics,
) -> Result<(), Error> {
    while let Some(event) = stream.next().await {
        notifier.pass_on(event?, metrics);
    }
    Ok(())
}
