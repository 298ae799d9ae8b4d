//! The completer: stores the results runners hand to this node, in batches over the node's
//! pooled connections, and answers each runner once its result is stored.

use disbatch_core::relay::{Ack, Completion};
use disbatch_core::store::Store;
use tokio::sync::{mpsc, oneshot};

use crate::metrics::DenMetrics;

/// Most results stored by one batch; more wait for the next.
const MAX_BATCH: usize = 256;

type Pending = (Completion, oneshot::Sender<Ack>);

/// A handle on the batch writer; clones share it.
#[derive(Clone, Debug)]
pub struct Completer {
    pending: mpsc::UnboundedSender<Pending>,
}

impl Completer {
    pub fn start(store: Store, metrics: DenMetrics) -> Completer {
        let (pending, queue) = mpsc::unbounded_channel();
        tokio::spawn(store_batches(store, queue, metrics));
        Completer { pending }
    }

    /// Stores one result with whatever else is waiting, and returns the runner's answer.
    pub async fn store_result(&self, completion: Completion) -> Ack {
        let (reply, answer) = oneshot::channel();
        if self.pending.send((completion, reply)).is_err() {
            return Ack::RecordYourself;
        }
        answer.await.unwrap_or(Ack::RecordYourself)
    }
}

/// Waits for a result, takes every other result already waiting, and stores them together:
/// batches grow with load without ever holding a result back for company.
async fn store_batches(
    store: Store,
    mut queue: mpsc::UnboundedReceiver<Pending>,
    metrics: DenMetrics,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (completions, replies): (Vec<Completion>, Vec<_>) = batch.drain(..).unzip();
        let acks = match store.record_completions(&completions).await {
            Ok(acks) => acks,
            Err(e) => {
                // Each runner then writes its own, with its own patience through an outage.
                metrics.db_error("store_results");
                tracing::warn!(results = completions.len(), error = %e, "could not store runners' results; they will store them");
                vec![Ack::RecordYourself; completions.len()]
            }
        };
        let answers: Vec<&'static str> = acks.iter().map(|a| a.name()).collect();
        metrics.results_stored(&answers);
        for (reply, ack) in replies.into_iter().zip(acks) {
            let _ = reply.send(ack);
        }
    }
}
