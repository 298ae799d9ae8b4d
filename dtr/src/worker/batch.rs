//! A worker host's result writer: stores the results of the tasks it runs in batches over
//! its one connection, as the node's completer does for runners.

use disbatch_model::wire::relay::{Ack, Completion};
use disbatch_model::wire::result_batches::ResultBatches;

use crate::connection::LazyStore;

/// A handle on the batch writer; clones share it.
#[derive(Clone)]
pub struct BatchWriter {
    results: ResultBatches,
}

impl BatchWriter {
    pub fn start(store: LazyStore) -> BatchWriter {
        let results = ResultBatches::start(move |batch| store_batch(store.clone(), batch));
        BatchWriter { results }
    }

    /// Stores one result with whatever else is waiting. `RecordYourself`: the caller writes
    /// it alone (output too large for a batch, or the batch write failed).
    pub async fn report(&self, completion: Completion) -> Ack {
        self.results.store(completion).await
    }
}

async fn store_batch(store: LazyStore, completions: Vec<Completion>) -> Vec<Ack> {
    let acks = match store.get().await {
        Ok(db) => db.results().record_completions(&completions).await,
        Err(e) => Err(e),
    };
    acks.unwrap_or_else(|e| {
        tracing::warn!(results = completions.len(), error = %e, "could not store results in a batch; storing them one by one");
        vec![Ack::RecordYourself; completions.len()]
    })
}
