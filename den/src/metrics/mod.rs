//! The node's own counters and histograms (`metrics_http` serves them to Prometheus).
//!
//! Queue names come from the database unchecked: each is recorded as its `metric_label` (control
//! and bidi characters escaped, absurd lengths cut), so no scrape carries NUL or ESC.

mod families;
pub mod http;

use std::sync::Arc;
use std::time::Duration;

use disbatch_model::task::Outcome;
use disbatch_model::text::printable::metric_label;
use prometheus::{Encoder, IntCounterVec, TextEncoder};

/// A claim is one or two database round trips: milliseconds normally, seconds when it struggles.
const ROUND_TRIP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Tasks run from well under a second to hours.
const TASK_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0,
];
const WAKEUP_SOURCES: &[&str] = &["timer", "change_stream", "runner_exit", "retry_due"];
const RECOVERIES: &[&str] = &["requeue", "orphan", "cancel", "fail", "discard"];
const DEPENDENCY_SETTLEMENTS: [&str; 6] = [
    "settled",
    "released",
    "cancelled",
    "callbacks",
    "callbacks_failed",
    "errors",
];
const RESULT_ANSWERS: &[&str] = &["recorded", "not_ours", "record_yourself"];
const LIVE_COPY_RESULTS: &[&str] = &["written", "not_written", "dropped"];
/// Results stored per batch: one when the node is quiet, tens under load.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// The `outcome` labels of `disbatch_den_tasks_finished_total`: how a task runner's attempt
/// ended, as its attempt record (collection `attempts`) says, plus `unknown` when this node
/// could not learn it; every runner exit is one of these.
fn task_outcome_labels() -> impl Iterator<Item = &'static str> {
    Outcome::ALL
        .map(Some)
        .into_iter()
        .chain([None])
        .map(Outcome::label)
}

/// The node's metrics; clones share them. Recording is a hash lookup under a read lock and an
/// atomic add: a label value allocates only the first time it is seen.
#[derive(Clone, Default)]
pub struct DenMetrics {
    inner: Arc<families::Inner>,
}

impl DenMetrics {
    pub fn new() -> Self {
        Self::default()
    }

    /// One task claimed; `latency` is its batch's read and claim.
    pub fn claimed(&self, queue: &str, latency: Duration) {
        inc(&self.inner.claims, &[&metric_label(queue)]);
        self.inner.claim_latency.observe(latency.as_secs_f64());
    }

    /// One pass claimed `n` tasks of `queue` (kept after any given back).
    pub fn claimed_in_pass(&self, queue: &str, n: u32) {
        if let Ok(h) = self
            .inner
            .claims_per_pass
            .get_metric_with_label_values(&[&metric_label(queue)])
        {
            h.observe(f64::from(n));
        }
    }

    /// A claim that came to nothing: `reason` is "empty", "lost", "slot_taken", "refused", or
    /// "full" (Perl nodes' claims, counted just before, left the queue no room).
    pub fn claim_missed(&self, queue: &str, reason: &'static str) {
        inc(&self.inner.claim_misses, &[&metric_label(queue), reason]);
    }

    /// `n` claimable tasks held back by `limit` (see the metric's help).
    pub fn limit_held(&self, queue: &str, limit: &'static str, n: u64) {
        if let Ok(c) = self
            .inner
            .limit_holds
            .get_metric_with_label_values(&[&metric_label(queue), limit])
        {
            c.inc_by(n);
        }
    }

    /// Claims given back unstarted because, beside Perl nodes' claims, they could have
    /// pushed the queue past its threads.
    pub fn claims_given_back(&self, queue: &str, n: u64) {
        if let Ok(c) = self
            .inner
            .claims_given_back
            .get_metric_with_label_values(&[&metric_label(queue)])
        {
            c.inc_by(n);
        }
    }

    /// One node pass.
    pub fn pass(&self, duration: Duration) {
        self.inner.passes.inc();
        self.inner.pass_duration.observe(duration.as_secs_f64());
    }

    /// A pass that read every queue it serves, so a queue that got no claim in it was
    /// looked at and passed over.
    pub fn queue_read(&self) {
        self.inner.queue_reads.inc();
    }

    /// `source`: "timer", "change_stream", "runner_exit" or "retry_due".
    pub fn wakeup(&self, source: &'static str) {
        inc(&self.inner.wakeups, &[source]);
    }

    pub fn runner_started(&self, queue: &str) {
        let queue = &*metric_label(queue);
        inc(&self.inner.runners_started, &[queue]);
        // A queue's outcomes start at 0 with its first runner, so a rate of failures works
        // before the first failure.
        for outcome in task_outcome_labels() {
            let _ = self
                .inner
                .tasks_finished
                .get_metric_with_label_values(&[queue, outcome]);
        }
        let _ = self
            .inner
            .tasks_discarded
            .get_metric_with_label_values(&[queue]);
        if let Ok(g) = self.inner.runners.get_metric_with_label_values(&[queue]) {
            g.inc();
        }
    }

    pub fn runner_exited(&self, queue: &str, duration: Duration, success: bool) {
        let result = if success { "success" } else { "failure" };
        let queue = &*metric_label(queue);
        inc(&self.inner.runner_exits, &[queue, result]);
        if let Ok(h) = self
            .inner
            .task_duration
            .get_metric_with_label_values(&[queue])
        {
            h.observe(duration.as_secs_f64());
        }
        if let Ok(g) = self.inner.runners.get_metric_with_label_values(&[queue]) {
            g.dec();
        }
    }

    /// A runner's attempt ended with `outcome`; None: this node could not learn how.
    pub fn task_finished(&self, queue: &str, outcome: Option<Outcome>) {
        let outcome = Outcome::label(outcome);
        inc(&self.inner.tasks_finished, &[&metric_label(queue), outcome]);
    }

    /// A task ended for good under its queue's retry policy.
    pub fn task_discarded(&self, queue: &str) {
        inc(&self.inner.tasks_discarded, &[&metric_label(queue)]);
    }

    pub fn tasks_pruned(&self, queue: &str, state: &'static str, n: u64) {
        if let Ok(c) = self
            .inner
            .tasks_pruned
            .get_metric_with_label_values(&[&metric_label(queue), state])
        {
            c.inc_by(n);
        }
    }

    pub fn db_error(&self, operation: &'static str) {
        inc(&self.inner.db_errors, &[operation]);
    }

    /// One batch of runners' results stored, with the answer each runner got.
    pub fn results_stored(&self, answers: &[&'static str]) {
        self.inner.result_batch.observe(answers.len() as f64);
        for answer in answers {
            inc(&self.inner.results, &[answer]);
        }
    }

    /// `n` live output copies ended as `result` (one of `LIVE_COPY_RESULTS`).
    pub fn live_copies(&self, result: &'static str, n: u64) {
        if let Ok(c) = self
            .inner
            .live_copies
            .get_metric_with_label_values(&[result])
        {
            c.inc_by(n);
        }
    }

    /// A document a read left out, or one the server would not let this node update.
    pub fn document_skipped(&self, collection: &str, reason: &'static str) {
        inc(&self.inner.documents_skipped, &[collection, reason]);
    }

    /// How many queues this node skips now.
    pub fn queues_skipped(&self, n: usize) {
        self.inner
            .queues_skipped
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Each served queue's sharers as just read (`queue` name, nodes); queues no longer
    /// served drop out.
    pub fn sharers<'a>(&self, read: impl IntoIterator<Item = (&'a str, usize)>) {
        self.inner.sharers.reset();
        for (queue, n) in read {
            if let Ok(g) = self
                .inner
                .sharers
                .get_metric_with_label_values(&[&metric_label(queue)])
            {
                g.set(i64::try_from(n).unwrap_or(i64::MAX));
            }
        }
    }

    /// A change stream opened (true) or closed (false).
    pub fn change_stream_open(&self, open: bool) {
        match open {
            true => self.inner.change_streams_open.inc(),
            false => self.inner.change_streams_open.dec(),
        }
    }

    /// `how`: "requeue", "orphan", "cancel", "fail" or "discard".
    pub fn recovered(&self, how: &'static str) {
        inc(&self.inner.recoveries, &[how]);
    }

    /// Runners killed because their attempts were lost while they hung.
    pub fn stale_runners_killed(&self, n: usize) {
        self.inner.stale_runners_killed.inc_by(n as u64);
    }

    /// Lost attempts' records written by the leader after their recovery was cut short.
    pub fn attempt_records_repaired(&self, n: u64) {
        self.inner.attempt_records_repaired.inc_by(n);
    }

    /// A work signal written for tasks queued by a writer that sends none.
    pub fn outside_insert_signalled(&self) {
        self.inner.outside_inserts_signalled.inc();
    }

    pub fn nodes_signalled(&self, n: u64) {
        self.inner.nodes_signalled.inc_by(n);
    }

    /// What settling ended tasks' dependents did.
    pub fn dependencies_settled(&self, s: &disbatch_store::Settled) {
        let counts = [
            s.settled,
            s.released,
            s.cancelled,
            s.callbacks,
            s.callbacks_failed,
            s.errors,
        ];
        for (how, n) in DEPENDENCY_SETTLEMENTS.iter().zip(counts) {
            if n > 0 {
                if let Ok(c) = self.inner.dependencies.get_metric_with_label_values(&[how]) {
                    c.inc_by(n);
                }
            }
        }
    }

    /// `n` ticks of queue `queue`'s schedule came to `outcome` (see the metric's help).
    pub fn schedule_ticks(&self, queue: &str, outcome: &'static str, n: u64) {
        if let Ok(c) = self
            .inner
            .schedule_ticks
            .get_metric_with_label_values(&[&metric_label(queue), outcome])
        {
            c.inc_by(n);
        }
    }

    /// How many queues' schedules the leader skips now.
    pub fn schedules_invalid(&self, n: usize) {
        self.inner
            .schedules_invalid
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric recorded so far.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding into memory fails only for a family without samples, which gather() drops.
        if let Err(e) = TextEncoder::new().encode(&self.inner.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

fn inc(counters: &IntCounterVec, labels: &[&str]) {
    // Fails only on a wrong label count, which the callers here fix at compile time.
    if let Ok(c) = counters.get_metric_with_label_values(labels) {
        c.inc();
    }
}

// The integration tests' checker, shared rather than copied; den uses only part of it.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../../tests/src/exposition.rs"]
mod exposition;

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
