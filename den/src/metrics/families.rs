//! The DEN's metric families: each one's name, help text, labels and buckets, registered
//! once per process.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use super::*;

pub struct Inner {
    pub(super) registry: Registry,
    pub(super) claims: IntCounterVec,
    pub(super) claim_misses: IntCounterVec,
    pub(super) claims_given_back: IntCounterVec,
    pub(super) limit_holds: IntCounterVec,
    pub(super) claim_latency: Histogram,
    pub(super) claims_per_pass: HistogramVec,
    pub(super) passes: IntCounter,
    pub(super) queue_reads: IntCounter,
    pub(super) pass_duration: Histogram,
    pub(super) wakeups: IntCounterVec,
    pub(super) runners_started: IntCounterVec,
    pub(super) runner_exits: IntCounterVec,
    pub(super) tasks_finished: IntCounterVec,
    pub(super) tasks_discarded: IntCounterVec,
    pub(super) tasks_pruned: IntCounterVec,
    pub(super) task_duration: HistogramVec,
    pub(super) runners: IntGaugeVec,
    pub(super) sharers: IntGaugeVec,
    pub(super) db_errors: IntCounterVec,
    pub(super) recoveries: IntCounterVec,
    pub(super) attempt_records_repaired: IntCounter,
    pub(super) stale_runners_killed: IntCounter,
    pub(super) outside_inserts_signalled: IntCounter,
    pub(super) nodes_signalled: IntCounter,
    pub(super) dependencies: IntCounterVec,
    pub(super) results: IntCounterVec,
    pub(super) result_batch: Histogram,
    pub(super) live_copies: IntCounterVec,
    pub(super) documents_skipped: IntCounterVec,
    pub(super) queues_skipped: prometheus::IntGauge,
    pub(super) change_streams_open: prometheus::IntGauge,
    pub(super) schedule_ticks: IntCounterVec,
    pub(super) schedules_invalid: prometheus::IntGauge,
}

impl Default for Inner {
    fn default() -> Self {
        let registry = Registry::new();
        let ClaimFamilies {
            claims,
            claim_misses,
            claims_given_back,
            limit_holds,
            claim_latency,
            claims_per_pass,
            passes,
            queue_reads,
            pass_duration,
            wakeups,
        } = ClaimFamilies::register(&registry);
        let RunFamilies {
            runners_started,
            runner_exits,
            tasks_finished,
            tasks_discarded,
            tasks_pruned,
            task_duration,
            runners,
            sharers,
        } = RunFamilies::register(&registry);
        let UpkeepFamilies {
            db_errors,
            recoveries,
            attempt_records_repaired,
            stale_runners_killed,
            outside_inserts_signalled,
            nodes_signalled,
        } = UpkeepFamilies::register(&registry);
        let ReportFamilies {
            dependencies,
            results,
            result_batch,
            live_copies,
        } = ReportFamilies::register(&registry);
        let SkipStreamAndScheduleFamilies {
            documents_skipped,
            queues_skipped,
            change_streams_open,
            schedule_ticks,
            schedules_invalid,
        } = SkipStreamAndScheduleFamilies::register(&registry);
        let inner = Inner {
            claims,
            claim_misses,
            claims_given_back,
            limit_holds,
            claim_latency,
            claims_per_pass,
            passes,
            queue_reads,
            pass_duration,
            wakeups,
            runners_started,
            runner_exits,
            tasks_finished,
            tasks_discarded,
            tasks_pruned,
            task_duration,
            runners,
            sharers,
            db_errors,
            recoveries,
            attempt_records_repaired,
            stale_runners_killed,
            outside_inserts_signalled,
            nodes_signalled,
            dependencies,
            results,
            result_batch,
            live_copies,
            documents_skipped,
            queues_skipped,
            change_streams_open,
            schedule_ticks,
            schedules_invalid,
            registry,
        };
        if let Err(e) = disbatch_serve::ops_metrics::register(&inner.registry) {
            tracing::warn!(error = %e, "build and process metrics unavailable");
        }
        inner.start_known_labels_at_zero();
        inner
    }
}

impl Inner {
    /// Known label values start at 0, so rates work from the first scrape.
    fn start_known_labels_at_zero(&self) {
        for source in WAKEUP_SOURCES {
            let _ = self.wakeups.get_metric_with_label_values(&[source]);
        }
        for answer in RESULT_ANSWERS {
            let _ = self.results.get_metric_with_label_values(&[answer]);
        }
        for result in LIVE_COPY_RESULTS {
            let _ = self.live_copies.get_metric_with_label_values(&[result]);
        }
        for how in RECOVERIES {
            let _ = self.recoveries.get_metric_with_label_values(&[how]);
        }
        for how in DEPENDENCY_SETTLEMENTS {
            let _ = self.dependencies.get_metric_with_label_values(&[how]);
        }
    }
}

// Registered group by group, then kept flat in `Inner`: each recording method reads one field.
struct ClaimFamilies {
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
}

impl ClaimFamilies {
    fn register(registry: &Registry) -> Self {
        Self {
            claims: counter_vec(
                registry,
                "disbatch_den_claims_total",
                "Tasks this node claimed",
                &["queue"],
            ),
            claim_misses: counter_vec(
                registry,
                "disbatch_den_claim_misses_total",
                "Claims that came to nothing, by reason: empty (the read found no task), known_empty (not read: found empty before and not signalled since), lost (another node claimed the task first, or it changed since the read) or slot_taken (another node holds the slot)",
                &["queue", "reason"],
            ),
            claims_given_back: counter_vec(
                registry,
                "disbatch_den_claims_given_back_total",
                "Claims given back before their runner started: on a queue Perl nodes also claim from, other nodes' claims arrived between this node's count and its claims, and with them the queue could have passed its threads",
                &["queue"],
            ),
            limit_holds: counter_vec(
                registry,
                "disbatch_den_limit_holds_total",
                "Claimable tasks a claim left queued because a flow limit of their queue held them back, by limit: rate_limit (no start left in the window), partition_limit (max_partitions live partitions), concurrency (the key at its max), ordered (an older task of the key waits), unused_grant (a start granted whose claim then went to another node: given back), or unused_ahead (starts granted ahead that this node did not take within their horizon: given back to the window)",
                &["queue", "limit"],
            ),
            claim_latency: histogram(
                registry,
                "disbatch_den_claim_latency_seconds",
                "Time to claim a batch (its read and its claim), once per task claimed",
                ROUND_TRIP_BUCKETS,
            ),
            claims_per_pass: histogram_vec(
                registry,
                "disbatch_den_claims_per_pass",
                "Tasks one pass claimed from a queue, once per pass and queue it claimed from: a queue's max_getwork bounds it",
                &["queue"],
                BATCH_BUCKETS,
            ),
            passes: counter(registry, "disbatch_den_passes_total", "Node passes run"),
            queue_reads: counter(
                registry,
                "disbatch_den_queue_reads_total",
                "Passes that read every queue this node serves and tried to claim from each (an idle node's timer passes skip the reading)",
            ),
            pass_duration: histogram(
                registry,
                "disbatch_den_pass_duration_seconds",
                "Duration of a node pass (heartbeat, recovery, claims)",
                ROUND_TRIP_BUCKETS,
            ),
            wakeups: counter_vec(
                registry,
                "disbatch_den_wakeups_total",
                "What started a pass: timer, change_stream, runner_exit or retry_due (a retry this node queued came due)",
                &["source"],
            ),
        }
    }
}

struct RunFamilies {
    runners_started: IntCounterVec,
    runner_exits: IntCounterVec,
    tasks_finished: IntCounterVec,
    tasks_discarded: IntCounterVec,
    tasks_pruned: IntCounterVec,
    task_duration: HistogramVec,
    runners: IntGaugeVec,
    sharers: IntGaugeVec,
}

impl RunFamilies {
    fn register(registry: &Registry) -> Self {
        Self {
            runners_started: counter_vec(
                registry,
                "disbatch_den_runners_started_total",
                "Task runners started",
                &["queue"],
            ),
            runner_exits: counter_vec(
                registry,
                "disbatch_den_runner_exits_total",
                "Task runners that exited, by the runner process's exit status: success means the runner exited 0 having recorded the task's result, which may be a failure; count task outcomes with disbatch_den_tasks_finished_total",
                &["queue", "result"],
            ),
            tasks_finished: counter_vec(
                registry,
                "disbatch_den_tasks_finished_total",
                "Attempts of this node's task runners that ended, by the outcome recorded for them: succeeded, failed, retry, cancelled, timed_out, discarded (the task had changed hands), lost (the runner died; the task was recovered) or unknown",
                &["queue", "outcome"],
            ),
            tasks_discarded: counter_vec(
                registry,
                "disbatch_den_tasks_discarded_total",
                "Tasks this node's runners ended for good under their queue's retry policy: out of attempts, or the plugin refused a retry (\"retry\": false). Retries are disbatch_den_tasks_finished_total{outcome=\"retry\"}; lost attempts the leader discarded are disbatch_den_recoveries_total{how=\"discard\"}",
                &["queue"],
            ),
            tasks_pruned: counter_vec(
                registry,
                "disbatch_den_tasks_pruned_total",
                "Ended tasks this node deleted as maintenance leader, past their queue's retention (retain), with their attempts and output files, by the state they ended in: succeeded, failed or cancelled",
                &["queue", "state"],
            ),
            task_duration: histogram_vec(
                registry,
                "disbatch_den_task_duration_seconds",
                "Time from a task runner's start to its exit",
                &["queue"],
                TASK_BUCKETS,
            ),
            runners: gauge_vec(
                registry,
                "disbatch_den_runners",
                "Task runners alive now",
                &["queue"],
            ),
            sharers: gauge_vec(
                registry,
                "disbatch_den_sharers",
                "Live nodes this node last read as serving the queue with room (itself included once its heartbeat says it serves it): the nodes its lane of the queue's slots is laid out among, beside those seen holding its tasks. Read from the heartbeats every 2 s",
                &["queue"],
            ),
        }
    }
}

/// Failures, their repairs, and the signals the maintenance leader writes.
struct UpkeepFamilies {
    db_errors: IntCounterVec,
    recoveries: IntCounterVec,
    attempt_records_repaired: IntCounter,
    stale_runners_killed: IntCounter,
    outside_inserts_signalled: IntCounter,
    nodes_signalled: IntCounter,
}

impl UpkeepFamilies {
    fn register(registry: &Registry) -> Self {
        Self {
            db_errors: counter_vec(
                registry,
                "disbatch_den_db_errors_total",
                "Database operations that failed, by operation",
                &["operation"],
            ),
            recoveries: counter_vec(
                registry,
                "disbatch_den_recoveries_total",
                "Lost tasks recovered (lease passed, runner died, node silent): requeue, orphan, cancel or fail",
                &["how"],
            ),
            attempt_records_repaired: counter(
                registry,
                "disbatch_den_attempt_records_repaired_total",
                "Records of lost attempts this node, as maintenance leader, wrote or corrected because the recovery that took their task had not (its node or the server died between moving the task and writing the record); each is logged",
            ),
            stale_runners_killed: counter(
                registry,
                "disbatch_den_stale_runners_killed_total",
                "Runners this node killed because their attempt was closed as lost while they hung or were stopped past their lease (their task recovered); each frees its slot and is logged",
            ),
            outside_inserts_signalled: counter(
                registry,
                "disbatch_den_outside_inserts_signalled_total",
                "Work signals this node, as maintenance leader, wrote for tasks another writer queued without one (ops by hand, Perl tools): its probe found a newer queued task",
            ),
            nodes_signalled: counter(
                registry,
                "disbatch_den_nodes_signalled_total",
                "Nodes this node, as maintenance leader (the holder of the fleet's change stream), marked to read their queues at their next heartbeat, for work signalled on queues they serve",
            ),
        }
    }
}

/// What comes of runners' ends and of what they hand to this node.
struct ReportFamilies {
    dependencies: IntCounterVec,
    results: IntCounterVec,
    result_batch: Histogram,
    live_copies: IntCounterVec,
}

impl ReportFamilies {
    fn register(registry: &Registry) -> Self {
        Self {
            dependencies: counter_vec(
                registry,
                "disbatch_den_dependencies_total",
                "Workflow dependencies this node settled (for its runners' ends, or as leader for any end still marked), by what came of it: settled (ends looked at), released (waiting tasks queued), cancelled (by a failed or cancelled dependency), callbacks (batch callbacks released, once each), callbacks_failed (failed: too large to take the batch's outcome), errors (writes that failed, logged, left to the next settle). Waiting now: disbatch_queue_tasks{status=\"blocked\"} on the DCI",
                &["how"],
            ),
            results: counter_vec(
                registry,
                "disbatch_den_results_total",
                "Results runners handed to this node, by answer: recorded, not_ours (the task had changed hands) or record_yourself (left to the runner)",
                &["answer"],
            ),
            result_batch: histogram(
                registry,
                "disbatch_den_result_batch_size",
                "Results stored per batch (one insert of attempt records, one update of tasks)",
                BATCH_BUCKETS,
            ),
            live_copies: counter_vec(
                registry,
                "disbatch_den_live_copies_total",
                "Live output copies runners handed to this node, by what became of them: written, not_written (the attempt was over, or the task had no room) or dropped (too many waiting, or the write failed; the runner's next copy replaces it)",
                &["result"],
            ),
        }
    }
}

struct SkipStreamAndScheduleFamilies {
    documents_skipped: IntCounterVec,
    queues_skipped: prometheus::IntGauge,
    change_streams_open: prometheus::IntGauge,
    schedule_ticks: IntCounterVec,
    schedules_invalid: prometheus::IntGauge,
}

impl SkipStreamAndScheduleFamilies {
    fn register(registry: &Registry) -> Self {
        Self {
            documents_skipped: counter_vec(
                registry,
                "disbatch_den_documents_skipped_total",
                "Documents this node's reads left out or the server would not let it update, by collection and reason: undecodable (its bytes cannot be decoded) or update_refused; each is logged the first time",
                &["collection", "reason"],
            ),
            queues_skipped: gauge(
                registry,
                "disbatch_den_queues_skipped",
                "Queues this node skips now for a value it cannot use (each logged with its reason when it starts being skipped)",
            ),
            change_streams_open: gauge(
                registry,
                "disbatch_den_change_streams_open",
                "The fleet's change stream (queues and task inserts) open on this node now (0 or 1): only the maintenance leader holds it, and passes its events on to the other nodes through their node documents, since the server reads every write once for each open stream",
            ),
            schedule_ticks: counter_vec(
                registry,
                "disbatch_den_schedule_ticks_total",
                "Ticks of queues' cron schedules this node settled as maintenance leader, by outcome: enqueued (its task queued on time), already (its task was there: another leader made it), missed_once (the one task schedule_missed \"once\" makes for the latest tick missed past the grace), skipped (missed past the grace, not enqueued), paused (passed while the queue was paused)",
                &["queue", "outcome"],
            ),
            schedules_invalid: gauge(
                registry,
                "disbatch_den_schedules_invalid",
                "Queues whose schedule this node, as maintenance leader, skips now because it cannot read it or the server refuses its task (each logged with its reason when skipping starts)",
            ),
        }
    }
}

// The definitions below are constants of this module: a failure is a bug the unit tests catch,
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
