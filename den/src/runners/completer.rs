//! The completer: stores the results runners hand to this node, in batches over the node's
//! pooled connections, and answers each runner once its result is stored; and writes the
//! live output copies runners hand it while their tasks run, so no runner connects for them.

use std::collections::HashMap;

use bson::oid::ObjectId;
use disbatch_model::wire::relay::{Ack, Completion, LiveCopy};
use disbatch_model::wire::result_batches::ResultBatches;
use disbatch_store::{LiveOutput, Store};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::metrics::DenMetrics;

/// Live copies waiting for their write, at most (each up to two 64 KiB tails, so this bounds
/// the memory they hold to ~32 MiB); past it a copy is dropped, and its runner's next one,
/// a second later, holds all it held.
const MAX_LIVE_WAITING: usize = 256;

/// A handle on the batch writers; clones share them.
#[derive(Clone)]
pub struct Completer {
    results: ResultBatches,
    live: mpsc::Sender<LiveCopy>,
    metrics: DenMetrics,
}

impl std::fmt::Debug for Completer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Completer")
    }
}

impl Completer {
    pub fn start(store: Store, metrics: DenMetrics) -> Completer {
        let results = {
            let (store, metrics) = (store.clone(), metrics.clone());
            ResultBatches::start(move |batch| store_batch(store.clone(), batch, metrics.clone()))
        };
        let (live, copies) = mpsc::channel(MAX_LIVE_WAITING);
        tokio::spawn(write_live_copies(store, copies, metrics.clone()));
        Completer {
            results,
            live,
            metrics,
        }
    }

    /// Takes a running task's live copy for the next write; never waits.
    pub fn offer_live(&self, copy: LiveCopy) {
        match self.live.try_send(copy) {
            Ok(()) => {}
            Err(TrySendError::Full(c)) | Err(TrySendError::Closed(c)) => {
                self.metrics.live_copies("dropped", 1);
                tracing::debug!(task = %c.task, "live output copy dropped: too many waiting");
            }
        }
    }

    /// Stores one result with whatever else is waiting, and returns the runner's answer.
    pub async fn store_result(&self, completion: Completion) -> Ack {
        self.results.store(completion).await
    }
}

/// Stores one batch of runners' results and counts the answers.
async fn store_batch(store: Store, completions: Vec<Completion>, metrics: DenMetrics) -> Vec<Ack> {
    let acks = match store.results().record_completions(&completions).await {
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
    acks
}

/// Writes the live copies waiting, the newest of each task's, in one command per batch.
async fn write_live_copies(
    store: Store,
    mut copies: mpsc::Receiver<LiveCopy>,
    metrics: DenMetrics,
) {
    let mut batch = Vec::new();
    while copies.recv_many(&mut batch, MAX_LIVE_WAITING).await > 0 {
        let received = batch.len() as u64;
        let mut newest: HashMap<ObjectId, LiveOutput> = HashMap::new();
        for c in batch.drain(..) {
            newest.insert(c.task, c.output);
        }
        let newest: Vec<(ObjectId, LiveOutput)> = newest.into_iter().collect();
        let superseded = received - newest.len() as u64;
        if superseded > 0 {
            metrics.live_copies("dropped", superseded);
        }
        match store.results().write_live_outputs(&newest).await {
            Ok(written) => {
                let written = written.min(newest.len() as u64);
                metrics.live_copies("written", written);
                metrics.live_copies("not_written", newest.len() as u64 - written);
            }
            Err(e) => {
                metrics.live_copies("dropped", newest.len() as u64);
                metrics.db_error("write_live_output");
                tracing::warn!(copies = newest.len(), error = %e, "could not write live output copies; the next ones replace them");
            }
        }
    }
}
