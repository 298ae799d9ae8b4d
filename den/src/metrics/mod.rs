//! The node's own counters and histograms (`metrics_http` serves them to Prometheus).
//!
//! Queue names come from the database unchecked: each is recorded as its `metric_label` (control
//! and bidi characters escaped, absurd lengths cut), so no scrape carries NUL or ESC.

pub mod http;

use std::sync::Arc;
use std::time::Duration;

use disbatch_model::text::printable::metric_label;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

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
/// How a task runner's attempt ended, as its attempt record (collection `attempts`) says,
/// plus `unknown` when this node could not learn it; every runner exit is one of these.
pub const TASK_OUTCOMES: &[&str] = &[
    "succeeded",
    "failed",
    "retry",
    "cancelled",
    "timed_out",
    "discarded",
    "lost",
    "unknown",
];
/// Results stored per batch: one when the node is quiet, tens under load.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// `outcome` as its `TASK_OUTCOMES` label: a stored value outside the list is `unknown`.
pub fn outcome_label(outcome: &str) -> &'static str {
    TASK_OUTCOMES
        .iter()
        .find(|o| **o == outcome)
        .copied()
        .unwrap_or("unknown")
}

/// The node's metrics; clones share them. Recording is a hash lookup under a read lock and an
/// atomic add: a label value allocates only the first time it is seen.
#[derive(Clone, Default)]
pub struct DenMetrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    claims: IntCounterVec,
    claim_misses: IntCounterVec,
    claims_given_back: IntCounterVec,
    limit_holds: IntCounterVec,
    claim_latency: Histogram,
    claims_per_pass: HistogramVec,
    passes: IntCounter,
    queue_reads: IntCounter,
    pass_duration: Histogram,
    wakeups: IntCounterVec,
    runners_started: IntCounterVec,
    runner_exits: IntCounterVec,
    tasks_finished: IntCounterVec,
    tasks_discarded: IntCounterVec,
    tasks_pruned: IntCounterVec,
    task_duration: HistogramVec,
    runners: IntGaugeVec,
    sharers: IntGaugeVec,
    db_errors: IntCounterVec,
    recoveries: IntCounterVec,
    attempt_records_repaired: IntCounter,
    stale_runners_killed: IntCounter,
    outside_inserts_signalled: IntCounter,
    nodes_signalled: IntCounter,
    dependencies: IntCounterVec,
    results: IntCounterVec,
    result_batch: Histogram,
    live_copies: IntCounterVec,
    documents_skipped: IntCounterVec,
    queues_skipped: prometheus::IntGauge,
    change_streams_open: prometheus::IntGauge,
    schedule_ticks: IntCounterVec,
    schedules_invalid: prometheus::IntGauge,
}

impl Default for Inner {
    fn default() -> Self {
        let registry = Registry::new();
        let inner = Inner {
            claims: counter_vec(
                &registry,
                "disbatch_den_claims_total",
                "Tasks this node claimed",
                &["queue"],
            ),
            claim_misses: counter_vec(
                &registry,
                "disbatch_den_claim_misses_total",
                "Claims that came to nothing, by reason: empty (the read found no task), known_empty (not read: found empty before and not signalled since), lost (another node claimed the task first, or it changed since the read) or slot_taken (another node holds the slot)",
                &["queue", "reason"],
            ),
            claims_given_back: counter_vec(
                &registry,
                "disbatch_den_claims_given_back_total",
                "Claims given back before their runner started: on a queue Perl nodes also claim from, other nodes' claims arrived between this node's count and its claims, and with them the queue could have passed its threads",
                &["queue"],
            ),
            limit_holds: counter_vec(
                &registry,
                "disbatch_den_limit_holds_total",
                "Claimable tasks a claim left queued because a flow limit of their queue held them back, by limit: rate_limit (no start left in the window), partition_limit (max_partitions live partitions), concurrency (the key at its max), ordered (an older task of the key waits), unused_grant (a start granted whose claim then went to another node: given back), or unused_ahead (starts granted ahead that this node did not take within their horizon: given back to the window)",
                &["queue", "limit"],
            ),
            claim_latency: histogram(
                &registry,
                "disbatch_den_claim_latency_seconds",
                "Time to claim a batch (its read and its claim), once per task claimed",
                ROUND_TRIP_BUCKETS,
            ),
            claims_per_pass: histogram_vec(
                &registry,
                "disbatch_den_claims_per_pass",
                "Tasks one pass claimed from a queue, once per pass and queue it claimed from: a queue's max_getwork bounds it",
                &["queue"],
                BATCH_BUCKETS,
            ),
            passes: counter(&registry, "disbatch_den_passes_total", "Node passes run"),
            queue_reads: counter(
                &registry,
                "disbatch_den_queue_reads_total",
                "Passes that read every queue this node serves and tried to claim from each (an idle node's timer passes skip the reading)",
            ),
            pass_duration: histogram(
                &registry,
                "disbatch_den_pass_duration_seconds",
                "Duration of a node pass (heartbeat, recovery, claims)",
                ROUND_TRIP_BUCKETS,
            ),
            wakeups: counter_vec(
                &registry,
                "disbatch_den_wakeups_total",
                "What started a pass: timer, change_stream, runner_exit or retry_due (a retry this node queued came due)",
                &["source"],
            ),
            runners_started: counter_vec(
                &registry,
                "disbatch_den_runners_started_total",
                "Task runners started",
                &["queue"],
            ),
            runner_exits: counter_vec(
                &registry,
                "disbatch_den_runner_exits_total",
                "Task runners that exited, by the runner process's exit status: success means the runner exited 0 having recorded the task's result, which may be a failure; count task outcomes with disbatch_den_tasks_finished_total",
                &["queue", "result"],
            ),
            tasks_finished: counter_vec(
                &registry,
                "disbatch_den_tasks_finished_total",
                "Attempts of this node's task runners that ended, by the outcome recorded for them: succeeded, failed, retry, cancelled, timed_out, discarded (the task had changed hands), lost (the runner died; the task was recovered) or unknown",
                &["queue", "outcome"],
            ),
            tasks_discarded: counter_vec(
                &registry,
                "disbatch_den_tasks_discarded_total",
                "Tasks this node's runners ended for good under their queue's retry policy: out of attempts, or the plugin refused a retry (\"retry\": false). Retries are disbatch_den_tasks_finished_total{outcome=\"retry\"}; lost attempts the leader discarded are disbatch_den_recoveries_total{how=\"discard\"}",
                &["queue"],
            ),
            tasks_pruned: counter_vec(
                &registry,
                "disbatch_den_tasks_pruned_total",
                "Ended tasks this node deleted as maintenance leader, past their queue's retention (retain), with their attempts and output files, by the state they ended in: succeeded, failed or cancelled",
                &["queue", "state"],
            ),
            task_duration: histogram_vec(
                &registry,
                "disbatch_den_task_duration_seconds",
                "Time from a task runner's start to its exit",
                &["queue"],
                TASK_BUCKETS,
            ),
            runners: gauge_vec(
                &registry,
                "disbatch_den_runners",
                "Task runners alive now",
                &["queue"],
            ),
            sharers: gauge_vec(
                &registry,
                "disbatch_den_sharers",
                "Live nodes this node last read as serving the queue with room (itself included once its heartbeat says it serves it): the nodes its lane of the queue's slots is laid out among, beside those seen holding its tasks. Read from the heartbeats every 2 s",
                &["queue"],
            ),
            db_errors: counter_vec(
                &registry,
                "disbatch_den_db_errors_total",
                "Database operations that failed, by operation",
                &["operation"],
            ),
            recoveries: counter_vec(
                &registry,
                "disbatch_den_recoveries_total",
                "Lost tasks recovered (lease passed, runner died, node silent): requeue, orphan, cancel or fail",
                &["how"],
            ),
            attempt_records_repaired: counter(
                &registry,
                "disbatch_den_attempt_records_repaired_total",
                "Records of lost attempts this node, as maintenance leader, wrote or corrected because the recovery that took their task had not (its node or the server died between moving the task and writing the record); each is logged",
            ),
            stale_runners_killed: counter(
                &registry,
                "disbatch_den_stale_runners_killed_total",
                "Runners this node killed because their attempt was closed as lost while they hung or were stopped past their lease (their task recovered); each frees its slot and is logged",
            ),
            outside_inserts_signalled: counter(
                &registry,
                "disbatch_den_outside_inserts_signalled_total",
                "Work signals this node, as maintenance leader, wrote for tasks another writer queued without one (ops by hand, Perl tools): its probe found a newer queued task",
            ),
            nodes_signalled: counter(
                &registry,
                "disbatch_den_nodes_signalled_total",
                "Nodes this node, as maintenance leader (the holder of the fleet's change stream), marked to read their queues at their next heartbeat, for work signalled on queues they serve",
            ),
            dependencies: counter_vec(
                &registry,
                "disbatch_den_dependencies_total",
                "Workflow dependencies this node settled (for its runners' ends, or as leader for any end still marked), by what came of it: settled (ends looked at), released (waiting tasks queued), cancelled (by a failed or cancelled dependency), callbacks (batch callbacks released, once each), callbacks_failed (failed: too large to take the batch's outcome), errors (writes that failed, logged, left to the next settle). Waiting now: disbatch_queue_tasks{status=\"blocked\"} on the DCI",
                &["how"],
            ),
            results: counter_vec(
                &registry,
                "disbatch_den_results_total",
                "Results runners handed to this node, by answer: recorded, not_ours (the task had changed hands) or record_yourself (left to the runner)",
                &["answer"],
            ),
            result_batch: histogram(
                &registry,
                "disbatch_den_result_batch_size",
                "Results stored per batch (one insert of attempt records, one update of tasks)",
                BATCH_BUCKETS,
            ),
            live_copies: counter_vec(
                &registry,
                "disbatch_den_live_copies_total",
                "Live output copies runners handed to this node, by what became of them: written, not_written (the attempt was over, or the task had no room) or dropped (too many waiting, or the write failed; the runner's next copy replaces it)",
                &["result"],
            ),
            documents_skipped: counter_vec(
                &registry,
                "disbatch_den_documents_skipped_total",
                "Documents this node's reads left out or the server would not let it update, by collection and reason: undecodable (its bytes cannot be decoded) or update_refused; each is logged the first time",
                &["collection", "reason"],
            ),
            queues_skipped: gauge(
                &registry,
                "disbatch_den_queues_skipped",
                "Queues this node skips now for a value it cannot use (each logged with its reason when it starts being skipped)",
            ),
            change_streams_open: gauge(
                &registry,
                "disbatch_den_change_streams_open",
                "The fleet's change stream (queues and task inserts) open on this node now (0 or 1): only the maintenance leader holds it, and passes its events on to the other nodes through their node documents, since the server reads every write once for each open stream",
            ),
            schedule_ticks: counter_vec(
                &registry,
                "disbatch_den_schedule_ticks_total",
                "Ticks of queues' cron schedules this node settled as maintenance leader, by outcome: enqueued (its task queued on time), already (its task was there: another leader made it), missed_once (the one task schedule_missed \"once\" makes for the latest tick missed past the grace), skipped (missed past the grace, not enqueued), paused (passed while the queue was paused)",
                &["queue", "outcome"],
            ),
            schedules_invalid: gauge(
                &registry,
                "disbatch_den_schedules_invalid",
                "Queues whose schedule this node, as maintenance leader, skips now because it cannot read it or the server refuses its task (each logged with its reason when skipping starts)",
            ),
            registry,
        };
        if let Err(e) = disbatch_serve::ops_metrics::register(&inner.registry) {
            tracing::warn!(error = %e, "build and process metrics unavailable");
        }
        // Known label values start at 0, so rates work from the first scrape.
        for source in WAKEUP_SOURCES {
            let _ = inner.wakeups.get_metric_with_label_values(&[source]);
        }
        for answer in RESULT_ANSWERS {
            let _ = inner.results.get_metric_with_label_values(&[answer]);
        }
        for result in LIVE_COPY_RESULTS {
            let _ = inner.live_copies.get_metric_with_label_values(&[result]);
        }
        for how in RECOVERIES {
            let _ = inner.recoveries.get_metric_with_label_values(&[how]);
        }
        for how in DEPENDENCY_SETTLEMENTS {
            let _ = inner.dependencies.get_metric_with_label_values(&[how]);
        }
        inner
    }
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
        for outcome in TASK_OUTCOMES {
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

    /// A runner's attempt ended with `outcome`, one of `TASK_OUTCOMES`.
    pub fn task_finished(&self, queue: &str, outcome: &'static str) {
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

// The definitions below are constants of this file: a failure is a bug the unit tests catch,
// never something input or the database can cause.

fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::with_opts(Opts::new(name, help)).expect("static counter definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static counter definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str) -> prometheus::IntGauge {
    let g =
        prometheus::IntGauge::with_opts(Opts::new(name, help)).expect("static gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric names are unique");
    g
}

fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static gauge definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric names are unique");
    g
}

fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
        .expect("static histogram definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric names are unique");
    h
}

fn histogram_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("static histogram definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric names are unique");
    h
}

// The integration tests' checker, shared rather than copied; den uses only part of it.
#[cfg(test)]
#[allow(dead_code)]
#[path = "../../../tests/src/exposition.rs"]
mod exposition;

#[cfg(test)]
mod tests {
    use super::*;

    fn has(text: &str, line: &str) -> bool {
        text.lines().any(|l| l == line)
    }

    #[test]
    fn a_new_node_renders_its_unlabelled_and_known_label_families() {
        let text = DenMetrics::new().render();
        exposition::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for line in [
            "# TYPE disbatch_den_passes_total counter",
            "disbatch_den_passes_total 0",
            "disbatch_den_claim_latency_seconds_count 0",
            "disbatch_den_pass_duration_seconds_bucket{le=\"+Inf\"} 0",
            "disbatch_den_wakeups_total{source=\"change_stream\"} 0",
            "disbatch_den_recoveries_total{how=\"orphan\"} 0",
            "disbatch_den_attempt_records_repaired_total 0",
            "disbatch_den_stale_runners_killed_total 0",
            "disbatch_den_outside_inserts_signalled_total 0",
            "disbatch_den_nodes_signalled_total 0",
            "disbatch_build_info{git_sha=\"GIT\",version=\"VERSION\"} 1",
        ] {
            let line = line
                .replace("GIT", disbatch_model::GIT_SHA)
                .replace("VERSION", disbatch_model::VERSION);
            let line = line.as_str();
            assert!(has(&text, line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn every_call_shows_in_its_family() {
        let m = DenMetrics::new();
        let clone = m.clone();
        m.claimed("q1", Duration::from_millis(3));
        clone.claimed("q1", Duration::from_millis(30));
        m.claim_missed("q\"2\\\nx", "lost");
        m.claimed_in_pass("q1", 2);
        m.pass(Duration::from_millis(20));
        m.wakeup("timer");
        m.wakeup("timer");
        m.runner_started("q1");
        m.runner_started("q1");
        m.runner_exited("q1", Duration::from_secs(2), true);
        m.task_finished("q1", "failed");
        m.db_error("claim");
        m.recovered("requeue");
        m.schedule_ticks("q1", "enqueued", 2);
        m.schedules_invalid(1);
        let text = m.render();
        exposition::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for line in [
            "disbatch_den_claims_total{queue=\"q1\"} 2",
            "disbatch_den_claim_latency_seconds_count 2",
            "disbatch_den_claim_latency_seconds_bucket{le=\"0.005\"} 1",
            "disbatch_den_claim_latency_seconds_bucket{le=\"0.05\"} 2",
            "disbatch_den_claims_per_pass_bucket{queue=\"q1\",le=\"1\"} 0",
            "disbatch_den_claims_per_pass_bucket{queue=\"q1\",le=\"2\"} 1",
            "disbatch_den_claim_misses_total{queue=\"q\\\"2\\\\\\nx\",reason=\"lost\"} 1",
            "disbatch_den_passes_total 1",
            "disbatch_den_pass_duration_seconds_count 1",
            "disbatch_den_wakeups_total{source=\"timer\"} 2",
            "disbatch_den_runners_started_total{queue=\"q1\"} 2",
            "disbatch_den_runners{queue=\"q1\"} 1",
            "disbatch_den_runner_exits_total{queue=\"q1\",result=\"success\"} 1",
            "disbatch_den_task_duration_seconds_bucket{queue=\"q1\",le=\"1\"} 0",
            "disbatch_den_task_duration_seconds_bucket{queue=\"q1\",le=\"5\"} 1",
            "disbatch_den_task_duration_seconds_sum{queue=\"q1\"} 2",
            "disbatch_den_db_errors_total{operation=\"claim\"} 1",
            "disbatch_den_recoveries_total{how=\"requeue\"} 1",
            "disbatch_den_schedule_ticks_total{outcome=\"enqueued\",queue=\"q1\"} 2",
            "disbatch_den_schedules_invalid 1",
            "disbatch_den_tasks_finished_total{outcome=\"failed\",queue=\"q1\"} 1",
            "disbatch_den_tasks_finished_total{outcome=\"succeeded\",queue=\"q1\"} 0",
            "disbatch_den_tasks_finished_total{outcome=\"lost\",queue=\"q1\"} 0",
        ] {
            assert!(has(&text, line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn stored_queue_names_are_escaped_and_cut_in_labels() {
        let m = DenMetrics::new();
        let long = "q".repeat(100_000);
        let names = [
            "red\x1b[31m",
            "nul\0",
            "two\nlines",
            "rtl\u{202e}x",
            "trail ",
            &long,
        ];
        for name in names {
            m.claimed(name, Duration::from_millis(1));
            m.claim_missed(name, "empty");
            m.runner_started(name);
            m.runner_exited(name, Duration::from_secs(1), false);
        }
        let text = m.render();
        let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
        assert!(
            !text
                .chars()
                .any(|c| c != '\n' && disbatch_model::text::printable::is_hidden(c)),
            "{text:?}"
        );
        assert!(text.lines().all(|l| l.chars().count() < 600), "{text}");
        for (label, claims) in [
            ("red\\u{1b}[31m", 1.0),
            ("nul\\u{0}", 1.0),
            ("two\nlines", 1.0),
            ("rtl\\u{202e}x", 1.0),
            ("trail\\u{20}", 1.0),
        ] {
            assert_eq!(
                e.value("disbatch_den_claims_total", &[("queue", label)]),
                Some(claims),
                "{label:?} in\n{text}"
            );
            assert_eq!(
                e.value("disbatch_den_runners", &[("queue", label)]),
                Some(0.0),
                "{label:?} in\n{text}"
            );
        }
        assert!(text.contains("…[+99744 chars #"), "{text}");
    }
}
