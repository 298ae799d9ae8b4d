//! One task's run as an attempt: get the task (claimed for us, or started here), run its
//! plugin, then record the attempt and the task's result, fenced on the attempt.

use bson::oid::ObjectId;
use bson::{DateTime, Document};
use disbatch_config::Config;
use disbatch_model::fleet_time;
use disbatch_model::output::{plan_output, GfsMode, Placement};
use disbatch_model::run_policy::DEFAULT_LEASE;
use disbatch_model::status;
use disbatch_model::task::ClaimedTask;
use disbatch_model::task::Outcome;
use disbatch_model::wire::handoff::Handoff;
use disbatch_model::wire::relay::{Ack, Completion, MAX_RELAYED_OUTPUT};
use disbatch_store::Result;
use disbatch_store::{
    parse_queue, AttemptEnd, AttemptRecord, FinishOutcome, OnConflict, StoredOutput, TaskEnd,
};

use crate::attempt::{Ran, Run, RunFacts};
use crate::connection::LazyStore;
use crate::launch::{run_plugin, NewProcess};
use crate::outcome::Exit;
use crate::prepare::{prepare, QueueLookup};
use crate::record::{record_result, with_retries, Captured, Finished};
use crate::sink::ResultSink;
use crate::supervisor::{Stopped, Wake};
use crate::worker::launch::LendWorker;
use crate::worker::Pool;

/// What became of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReport {
    /// The result was recorded: a final status, or requeued for a retry; and the attempt's
    /// outcome as its record names it.
    Recorded(TaskEnd, Outcome),
    /// The task was not claimed by this node any more (given back, reaped): nothing was run.
    NotClaimed,
    /// The plugin ran but the task had changed hands; the result was discarded.
    Discarded,
}

/// Runs a task its node claimed and handed over (the common case): no database round trip
/// before the plugin starts. `sink` stores the attempt record and the result first (the
/// node, the worker host's batches), else they are this runner's only writes; a worker host
/// lends persistent queues' tasks its `workers`.
pub async fn run_handed_off(
    config: &Config,
    store: &LazyStore,
    handoff: Handoff,
    node: &str,
    wake: Option<Wake>,
    sink: ResultSink<'_>,
    workers: Option<&Pool>,
) -> Result<RunReport> {
    // The fleet's time (the handoff brought the node's reading of it): the record is judged
    // beside times other hosts wrote, and its end is the fleet's too.
    let started = handoff.started_at.unwrap_or_else(fleet_time::now);
    let task = handoff.task.id;
    let queue: QueueLookup = Ok(parse_queue(&handoff.queue).ok());
    let relay = sink.live_relay(handoff.live);
    let run = Run {
        store,
        config,
        task,
        attempt: handoff.attempt,
        attempts: attempts_started(&handoff.task.raw),
        node,
        live_relay: relay.as_ref(),
        workers,
    };
    run_attempt(&run, &handoff.task, queue, started, wake, sink).await
}

/// Starts a task this node claimed (`-1`) as a new attempt and runs it: for a runner started
/// by hand or by a Disbatch-style node.
pub async fn run_task(
    config: &Config,
    store: &LazyStore,
    task: ObjectId,
    node: &str,
    wake: Option<Wake>,
) -> Result<RunReport> {
    let attempt = ObjectId::new();
    let started = fleet_time::now();
    let Some(doc) = with_retries("starting the task", || async {
        store
            .get()
            .await?
            .tasks()
            .start_task(task, node, attempt)
            .await
    })
    .await?
    else {
        tracing::info!(task = %task, node, "task is not claimed by this node; nothing to run");
        return Ok(RunReport::NotClaimed);
    };
    // Read by its `_id`, which is `task`: a claimed task.
    let Some(claimed) = ClaimedTask::from_document(doc) else {
        return Err(disbatch_store::Error::Invalid(format!(
            "task {task} was read back without its ObjectId _id"
        )));
    };
    let queue: QueueLookup = match claimed.queue {
        Some(q) => with_retries("reading the queue", || async {
            store.get().await?.queues().queue_by_id(q).await
        })
        .await
        .map_err(|e| e.to_string()),
        None => Ok(None),
    };
    let run = Run {
        store,
        config,
        task,
        attempt,
        attempts: attempts_started(&claimed.raw),
        node,
        live_relay: None,
        workers: None,
    };
    run_attempt(&run, &claimed, queue, started, wake, ResultSink::Direct).await
}

async fn run_attempt(
    run: &Run<'_>,
    claimed: &ClaimedTask,
    queue: QueueLookup,
    started: DateTime,
    wake: Option<Wake>,
    sink: ResultSink<'_>,
) -> Result<RunReport> {
    let Run {
        store,
        config,
        task,
        attempt,
        node,
        ..
    } = *run;
    let (ran, patience) = run_prepared(run, claimed, queue, wake).await?;
    let queue_id = claimed.queue;
    let record = |end: AttemptEnd| AttemptRecord {
        id: attempt,
        task,
        queue: queue_id,
        node: node.to_string(),
        pid: std::process::id(),
        start: started,
        end,
    };
    let (finished, mut facts) = match ran {
        Ran::Finished(f, facts) => (f, facts),
        Ran::LeaseLost(facts) => {
            // Recovery has already recorded this attempt as lost; this only fills a gap.
            let discarded = record(attempt_end(Outcome::Discarded, None, &facts));
            let _ = with_retries("recording the attempt", || async {
                store
                    .get()
                    .await?
                    .results()
                    .insert_attempt(&discarded)
                    .await
            })
            .await;
            return Ok(RunReport::Discarded);
        }
    };
    // Before the record that names it: a record never names a file that is not there.
    if let Some(json) = facts.spilled_output.take() {
        facts.output_file = Some(store_result_output(store, task, &json).await?);
    }
    let end = finished.end;
    let outcome = match (end, facts.stopped) {
        (_, Some(Stopped::TimedOut(..))) => Outcome::TimedOut,
        (_, Some(Stopped::Cancelled(_))) => Outcome::Cancelled,
        (TaskEnd::Status(status::SUCCEEDED), _) => Outcome::Succeeded,
        (TaskEnd::Status(_) | TaskEnd::Discarded(_), _) => Outcome::Failed,
        (TaskEnd::Retry { .. }, _) => Outcome::Retry,
    };
    let final_status = match end {
        TaskEnd::Status(s) | TaskEnd::Discarded(s) => Some(s),
        TaskEnd::Retry { .. } => None,
    };
    // The attempt record goes first: if this runner dies before the result lands, recovery
    // marks the record lost, so a record never claims a result the task does not show.
    let closing = record(attempt_end(outcome, final_status, &facts));
    let completion = relayable(&finished, &closing, config.gfs);
    match sink.offer(completion, patience).await {
        Ack::Recorded => Ok(recorded(store, task, end, outcome, &facts).await),
        Ack::NotOurs => {
            tracing::warn!(task = %task, "task changed hands while it ran; its result was discarded");
            Ok(RunReport::Discarded)
        }
        Ack::RecordYourself => record_yourself(run, finished, &closing, outcome, &facts).await,
    }
}

/// Prepares the attempt and runs its plugin (in a lent worker when the queue's workers are
/// persistent and the run has `workers`); a task that cannot start fails with the reason.
/// Returns how it ran, and how long the node may take to answer (a third of the lease).
async fn run_prepared(
    run: &Run<'_>,
    claimed: &ClaimedTask,
    queue: QueueLookup,
    wake: Option<Wake>,
) -> Result<(Ran, std::time::Duration)> {
    let Run {
        config,
        task,
        attempt,
        attempts,
        node,
        ..
    } = *run;
    let unable = |reason: String| Finished {
        task,
        node: node.to_string(),
        attempt,
        end: TaskEnd::Status(status::FAILED),
        stdout: Captured::from_text("Unable to start"),
        stderr: Captured::from_text(reason),
        spool: None,
    };
    let prepared = prepare(config, queue, claimed, node);
    // A third of the lease: the node answers long before the task could be recovered.
    let patience = prepared.as_ref().map_or(DEFAULT_LEASE, |p| p.run.lease) / 3;
    let ran = match prepared {
        Err(reason) => {
            tracing::warn!(task = %task, "{reason}");
            Ran::Finished(Box::new(unable(reason.clone())), RunFacts::because(reason))
        }
        // Coordinate's rule: max_retries N allows N attempts; the next one fails the task.
        Ok(p) if p.max_retries.is_some_and(|m| attempts > m as i64) => {
            let reason = format!(
                "too many retries: attempt {attempts} of a queue with max_retries {}",
                p.max_retries.unwrap_or(0)
            );
            Ran::Finished(Box::new(unable(reason.clone())), RunFacts::because(reason))
        }
        Ok(p) => match run.workers {
            Some(pool) if p.worker.persistent() => {
                run_plugin(LendWorker(pool), &claimed.raw, p, run, wake).await?
            }
            _ => run_plugin(NewProcess, &claimed.raw, p, run, wake).await?,
        },
    };
    Ok((ran, patience))
}

/// Records the attempt and the result with this runner's own writes (the node did not take
/// them): the record first, so a record never claims a result the task does not show.
async fn record_yourself(
    run: &Run<'_>,
    finished: Box<Finished>,
    closing: &AttemptRecord,
    outcome: Outcome,
    facts: &RunFacts,
) -> Result<RunReport> {
    let Run {
        store,
        config,
        task,
        attempt,
        ..
    } = *run;
    let end = finished.end;
    let db = store.get().await?;
    let inserted = with_retries("recording the attempt", || {
        db.results().insert_attempt(closing)
    })
    .await?;
    let outcome_of_write = match record_result(db, config.gfs, &finished).await {
        Ok(r) => r,
        Err(e) => {
            // The output stays on local disk for an operator; the task's lease will pass and
            // a node will recover it.
            let mut finished = finished;
            if let Some(spool) = finished.spool.take() {
                let kept = spool.keep();
                tracing::error!(task = %task, output = %kept.display(), "could not record the result; its output is kept");
            }
            return Err(e);
        }
    };
    let stored_by_node = || async {
        // The node may have stored it after all, and only its answer was lost; or this
        // runner's own write landed and only its reply was lost (a server restart), so the
        // retry found the task ended.
        with_retries("reading the task back", || {
            db.results().task_shows_result(task, attempt, end)
        })
        .await
        .unwrap_or(false)
    };
    match outcome_of_write {
        FinishOutcome::Recorded => Ok(recorded(store, task, end, outcome, facts).await),
        FinishOutcome::NotOurs if stored_by_node().await => {
            Ok(recorded(store, task, end, outcome, facts).await)
        }
        FinishOutcome::NotOurs | FinishOutcome::TooLarge => {
            tracing::warn!(task = %task, "task changed hands while it ran; its result was discarded");
            if inserted {
                if let Err(e) = with_retries("updating the attempt", || {
                    db.results()
                        .change_attempt_outcome(attempt, outcome, Outcome::Discarded)
                })
                .await
                {
                    tracing::error!(task = %task, attempt = %attempt, error = %e, "could not mark the attempt discarded");
                }
            }
            Ok(RunReport::Discarded)
        }
    }
}

/// A result the node can store for this runner: inline output of modest size. Anything
/// else (GridFS, dropped output) stays with the runner, which holds the spooled files.
fn relayable(finished: &Finished, record: &AttemptRecord, gfs: GfsMode) -> Option<Completion> {
    let (Captured::Text(stdout), Captured::Text(stderr)) = (&finished.stdout, &finished.stderr)
    else {
        return None;
    };
    let (out, err) = (stdout.len() as u64, stderr.len() as u64);
    let plan = plan_output(gfs, out, err);
    let inline = plan.stdout == Placement::Inline && plan.stderr == Placement::Inline;
    (inline && out + err <= MAX_RELAYED_OUTPUT).then(|| Completion {
        record: record.clone(),
        end: finished.end,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
    })
}

/// The result is stored as this attempt's: chain its output, if its queue chains.
async fn recorded(
    store: &LazyStore,
    task: ObjectId,
    end: TaskEnd,
    outcome: Outcome,
    facts: &RunFacts,
) -> RunReport {
    tracing::info!(task = %task, ?end, "task finished");
    if let (TaskEnd::Status(status::SUCCEEDED), Some((then, units))) = (end, &facts.chain) {
        match store.get().await {
            Ok(db) => chain_output(db, task, then, units).await,
            Err(e) => {
                tracing::error!(task = %task, then, error = %e, "could not connect; output not chained")
            }
        }
    }
    RunReport::Recorded(end, outcome)
}

fn attempt_end(outcome: Outcome, status: Option<i32>, facts: &RunFacts) -> AttemptEnd {
    AttemptEnd {
        outcome,
        status,
        exit_code: match facts.exit {
            Some(Exit::Code(c)) => Some(c),
            _ => None,
        },
        signal: match facts.exit {
            Some(Exit::Signal(s)) => Some(s),
            _ => None,
        },
        result: facts.result.clone(),
        reason: facts.reason.clone(),
        task_discarded: facts.task_discarded,
        output_file: facts.output_file,
    }
}

/// Writes a result's `output` too large for its attempt record to GridFS (`tasks.files`,
/// filename `result`, `metadata.task_id` as for stdout), so it goes with its task.
async fn store_result_output(
    store: &LazyStore,
    task: ObjectId,
    json: &[u8],
) -> Result<StoredOutput> {
    let db = store.get().await?;
    with_retries("writing the result's output to GridFS", || {
        db.results().write_result_output(task, json)
    })
    .await
}

/// Adds the units a succeeded task's `output` names to its queue's `then` queue. Runs only
/// after the result was recorded as this attempt's, so a superseded run chains nothing; a
/// failure here is logged and never changes the finished task.
async fn chain_output(
    store: &disbatch_store::Store,
    task: ObjectId,
    then: &str,
    units: &[disbatch_store::Unit],
) {
    if units.is_empty() {
        return;
    }
    let target = match store.queues().find_queue(then).await {
        Ok(Some(q)) => q.get_object_id("_id").ok(),
        Ok(None) => None,
        Err(e) => {
            tracing::error!(task = %task, then, error = %e, "could not read the `then` queue; output not chained");
            return;
        }
    };
    let Some(target) = target else {
        tracing::warn!(task = %task, then, "the `then` queue does not exist; output not chained");
        return;
    };
    match with_retries("chaining output", || {
        store
            .workflows()
            .add_units(target, units.to_vec(), OnConflict::Update)
    })
    .await
    {
        Ok(out) => tracing::info!(
            task = %task, then, added = out.inserted.len(), updated = out.updated.len(), busy = out.busy.len(),
            "chained output"
        ),
        Err(e) => tracing::error!(task = %task, then, error = %e, "could not chain output"),
    }
}

/// How many attempts have started since an operator last retried the task, this one
/// included (`attempts` is incremented on start): what its policy and `max_retries` count.
fn attempts_started(doc: &Document) -> i64 {
    disbatch_store::attempts_counted(doc)
}
