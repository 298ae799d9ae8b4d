//! The notifier: wakes the node loop when work may have appeared, through a change stream on
//! queue documents (queue changes, and the work signals our writers and the maintenance
//! leader's probe write when tasks are queued); when the server has none, the loop's timer
//! is the fallback. The stream is open only while the node is short of tasks: a node with
//! more claimable tasks than room is woken by its own task ends and reads its queues on
//! every maintenance pass anyway, and every open stream is one more cursor the server feeds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use disbatch_core::backoff::Backoff;
use disbatch_core::store::{Store, WorkSignal};
use disbatch_core::Error;
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
}

impl Notifier {
    /// Starts watching in the background; an idle stream asks the server again every
    /// `await_time`. The stream starts open.
    pub fn start(store: Store, metrics: DenMetrics, await_time: Duration) -> Notifier {
        let notifier = Notifier {
            wake: Arc::new(Notify::new()),
            queues_changed: Arc::new(AtomicBool::new(false)),
            requeued: Arc::new(AtomicBool::new(false)),
            want_streams: Arc::new(watch::Sender::new(true)),
        };
        tokio::spawn(keep_watching(store, notifier.clone(), metrics, await_time));
        notifier
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
    /// Opening it again wakes the node once it is open, so work that came while it was
    /// closed is not left for the timer.
    pub fn watch(&self, wanted: bool) -> bool {
        self.want_streams
            .send_if_modified(|w| std::mem::replace(w, wanted) != wanted)
    }

    fn signal(&self, signal: WorkSignal, metrics: &DenMetrics) {
        match signal {
            WorkSignal::Tasks => {}
            WorkSignal::Requeued => self.requeued.store(true, Ordering::Release),
            WorkSignal::Queues => self.queues_changed.store(true, Ordering::Release),
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
    // Closed because the node had no use for it (not by a failure): what came meanwhile has
    // no event, so its reopening wakes the node.
    let mut closed_by_node = false;
    loop {
        if wanted.wait_for(|w| *w).await.is_err() {
            return;
        }
        match store.watch_queues(await_time).await {
            Ok(stream) => {
                if !opened_before || said_polling {
                    tracing::info!("watching queues for work signals (while short of tasks): claims start on their events");
                } else {
                    tracing::debug!("change stream open");
                }
                opened_before = true;
                said_polling = false;
                retry.reset();
                metrics.change_stream_open(true);
                if std::mem::take(&mut closed_by_node) {
                    notifier.wake.notify_one();
                }
                let mut stream = Box::pin(stream);
                let ended = tokio::select! {
                    ended = pass_on(&mut stream, &notifier, &metrics) => Some(ended.err()),
                    _ = wanted.wait_for(|w| !*w) => None,
                };
                metrics.change_stream_open(false);
                match ended {
                    None => {
                        closed_by_node = true;
                        tracing::debug!("change stream closed: the node has more tasks than room");
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
    stream: &mut (impl Stream<Item = Result<WorkSignal, Error>> + Unpin),
    notifier: &Notifier,
    metrics: &DenMetrics,
) -> Result<(), Error> {
    while let Some(event) = stream.next().await {
        notifier.signal(event?, metrics);
    }
    Ok(())
}
