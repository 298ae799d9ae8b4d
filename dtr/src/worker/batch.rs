//! A worker host's result writer: stores the results of the tasks it runs in batches over
//! its one connection, as the node's completer does for runners.

use disbatch_core::relay::{Ack, Completion};
use tokio::sync::{mpsc, oneshot};

use crate::connection::LazyStore;

/// Most results stored by one batch; more wait for the next.
const MAX_BATCH: usize = 256;

type Pending = (Completion, oneshot::Sender<Ack>);

/// A handle on the batch writer; clones share it.
#[derive(Clone)]
pub struct BatchWriter {
    pending: mpsc::UnboundedSender<Pending>,
}

impl BatchWriter {
    pub fn start(store: LazyStore) -> BatchWriter {
        let (pending, queue) = mpsc::unbounded_channel();
        tokio::spawn(store_batches(store, queue));
        BatchWriter { pending }
    }

    /// Stores one result with whatever else is waiting. `RecordYourself`: the caller writes
    /// it alone (output too large for a batch, or the batch write failed).
    pub async fn report(&self, completion: Completion) -> Ack {
        let (reply, answer) = oneshot::channel();
        if self.pending.send((completion, reply)).is_err() {
            return Ack::RecordYourself;
        }
        answer.await.unwrap_or(Ack::RecordYourself)
    }
}

/// Waits for a result, takes every other one already waiting, and stores them together.
async fn store_batches(store: LazyStore, mut queue: mpsc::UnboundedReceiver<Pending>) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (completions, replies): (Vec<Completion>, Vec<_>) = batch.drain(..).unzip();
        let acks = match store.get().await {
            Ok(db) => db.record_completions(&completions).await,
            Err(e) => Err(e),
        };
        let acks = acks.unwrap_or_else(|e| {
            tracing::warn!(results = completions.len(), error = %e, "could not store results in a batch; storing them one by one");
            vec![Ack::RecordYourself; completions.len()]
        });
        for (reply, ack) in replies.into_iter().zip(acks) {
            let _ = reply.send(ack);
        }
    }
}
