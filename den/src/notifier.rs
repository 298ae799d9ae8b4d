//! The notifier: wakes the node loop when work may have appeared, through change streams on
//! `tasks` and `queues`; when the server has none, the loop's timer is the fallback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use disbatch_core::backoff::Backoff;
use disbatch_core::store::{Store, WorkSignal};
use futures::StreamExt;
use tokio::sync::Notify;

use crate::metrics::DenMetrics;

/// Longest wait before trying to open the streams again after they failed.
const MAX_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct Notifier {
    wake: Arc<Notify>,
    queues_changed: Arc<AtomicBool>,
    requeued: Arc<AtomicBool>,
}

impl Notifier {
    /// Starts watching in the background; an idle stream asks the server again every
    /// `await_time`.
    pub fn start(store: Store, metrics: DenMetrics, await_time: Duration) -> Notifier {
        let notifier = Notifier {
            wake: Arc::new(Notify::new()),
            queues_changed: Arc::new(AtomicBool::new(false)),
            requeued: Arc::new(AtomicBool::new(false)),
        };
        tokio::spawn(watch(store, notifier.clone(), metrics, await_time));
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

    /// True once after a task was queued again: claim windows may have passed it by.
    pub fn take_requeued(&self) -> bool {
        self.requeued.swap(false, Ordering::AcqRel)
    }
}

async fn watch(store: Store, notifier: Notifier, metrics: DenMetrics, await_time: Duration) {
    // Jittered: after an outage or a failover, a fleet's streams reopen spread over time.
    let mut retry = Backoff::new(Duration::from_secs(1), MAX_RETRY);
    let mut said_polling = false;
    loop {
        match store.watch_for_work(await_time).await {
            Ok(stream) => {
                tracing::info!("watching tasks and queues: claims start on change events");
                said_polling = false;
                retry.reset();
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(WorkSignal::Tasks) => {}
                        Ok(WorkSignal::Requeued) => {
                            notifier.requeued.store(true, Ordering::Release)
                        }
                        Ok(WorkSignal::Queues) => {
                            notifier.queues_changed.store(true, Ordering::Release)
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "change stream failed; polling until it is back");
                            metrics.db_error("change_stream");
                            break;
                        }
                    }
                    metrics.wakeup("change_stream");
                    notifier.wake.notify_one();
                }
            }
            Err(e) => {
                if !said_polling {
                    tracing::warn!(error = %e, "no change streams on this server; polling every pass");
                    said_polling = true;
                }
            }
        }
        tokio::time::sleep(retry.next_delay()).await;
    }
}
