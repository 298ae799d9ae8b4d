//! One task's run: start it as an attempt, find its plugin, run it, decide how it ends,
//! record the result and close the attempt.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document};
use disbatch_core::config::Config;
use disbatch_core::model::status;
use disbatch_core::store::{
    schema::task as field, AttemptEnd, FinishOutcome, OnConflict, Store, TaskEnd,
};
use disbatch_core::{Error, Result};

use crate::outcome::{decide, Exit, Outcome};
use crate::plugin_process::{start_plugin, PluginCall};
use crate::record::{record_result, with_retries, Captured, Finished};
use crate::supervisor::{supervise, Stopped};

/// What became of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReport {
    /// The result was recorded: a final status, or requeued for a retry.
    Recorded(TaskEnd),
    /// The task was not claimed by this node any more (given back, reaped): nothing was run.
    NotClaimed,
    /// The plugin ran but the task had changed hands; the result was discarded.
    Discarded,
}

/// How the plugin process ended and what its result file said, for the attempt record.
#[derive(Debug, Default)]
struct RunFacts {
    exit: Option<Exit>,
    result: Option<Document>,
    /// The queue to chain into and the result's `output`, when both exist.
    chain: Option<(String, serde_json::Value)>,
    /// How the supervisor ended the run, when it was not a plain exit.
    stopped: Option<Stopped>,
}

/// A run that has a result to record, or one whose task was taken away meanwhile.
enum Ran {
    Finished(Box<Finished>, RunFacts),
    LeaseLost(RunFacts),
}

/// Runs `task` as a new attempt; `wake` (SIGUSR1) makes the lease keeper look at the task
/// at once, for cancel requests.
pub async fn run_task(
    config: &Config,
    store: &Store,
    task: ObjectId,
    node: &str,
    wake: Option<tokio::signal::unix::Signal>,
) -> Result<RunReport> {
    let attempt = ObjectId::new();
    let Some(doc) = with_retries("starting the task", || {
        store.start_task(task, node, attempt)
    })
    .await?
    else {
        tracing::info!(task = %task, node, "task is not claimed by this node; nothing to run");
        return Ok(RunReport::NotClaimed);
    };
    let queue = doc.get_object_id(field::QUEUE).ok();
    with_retries("recording the attempt", || {
        store.record_attempt_start(attempt, task, queue, node, std::process::id())
    })
    .await?;
    let attempts = attempts_started(&doc);
    let unable = |reason: String| Finished {
        task,
        node: node.to_string(),
        attempt,
        end: TaskEnd::Status(status::FAILED),
        stdout: Captured::from_text("Unable to start"),
        stderr: Captured::from_text(reason),
        spool: None,
    };
    let ran = match prepare(config, store, &doc, node).await {
        Err(reason) => {
            tracing::warn!(task = %task, "{reason}");
            Ran::Finished(Box::new(unable(reason)), RunFacts::default())
        }
        // Coordinate's rule: max_retries N allows N attempts; the next one fails the task.
        Ok(p) if p.max_retries.is_some_and(|m| attempts > m as i64) => {
            let reason = format!(
                "too many retries: attempt {attempts} of a queue with max_retries {}",
                p.max_retries.unwrap_or(0)
            );
            Ran::Finished(Box::new(unable(reason)), RunFacts::default())
        }
        Ok(p) => {
            let run = Run {
                store,
                config,
                task,
                attempt,
                attempts,
                node,
            };
            run_and_capture(&doc, p, &run, wake).await?
        }
    };
    let (finished, facts) = match ran {
        Ran::Finished(f, facts) => (f, facts),
        Ran::LeaseLost(facts) => {
            close_attempt(store, task, attempt, "discarded", None, &facts).await;
            return Ok(RunReport::Discarded);
        }
    };
    let end = finished.end;
    let recorded = match record_result(store, config.gfs, &finished).await {
        Ok(r) => r,
        Err(e) => {
            // The output stays on local disk for an operator; the task's lease will pass and
            // a node will recover it.
            let mut finished = finished;
            if let Some(dir) = finished.spool.take() {
                let kept = dir.keep();
                tracing::error!(task = %task, output = %kept.display(), "could not record the result; its output is kept");
            }
            return Err(e);
        }
    };
    let (report, outcome) = match recorded {
        FinishOutcome::Recorded => {
            tracing::info!(task = %task, ?end, "task finished");
            let outcome = match (end, facts.stopped) {
                (_, Some(Stopped::TimedOut(..))) => "timed_out",
                (_, Some(Stopped::Cancelled(_))) => "cancelled",
                (TaskEnd::Status(status::SUCCEEDED), _) => "succeeded",
                (TaskEnd::Status(_), _) => "failed",
                (TaskEnd::Retry { .. }, _) => "retry",
            };
            if let (TaskEnd::Status(status::SUCCEEDED), Some((then, output))) = (end, &facts.chain)
            {
                chain_output(store, task, then, output).await;
            }
            (RunReport::Recorded(end), outcome)
        }
        FinishOutcome::NotOurs | FinishOutcome::TooLarge => {
            tracing::warn!(task = %task, "task changed hands while it ran; its result was discarded");
            (RunReport::Discarded, "discarded")
        }
    };
    let status = match end {
        TaskEnd::Status(s) => Some(s),
        TaskEnd::Retry { .. } => None,
    };
    close_attempt(store, task, attempt, outcome, status, &facts).await;
    Ok(report)
}

/// The task's own record is already written; a lost attempt record is logged, not fatal.
async fn close_attempt(
    store: &Store,
    task: ObjectId,
    attempt: ObjectId,
    outcome: &'static str,
    status: Option<i32>,
    facts: &RunFacts,
) {
    let closing = AttemptEnd {
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
    };
    if let Err(e) = with_retries("closing the attempt", || {
        store.record_attempt_end(attempt, &closing)
    })
    .await
    {
        tracing::error!(task = %task, attempt = %attempt, error = %e, "could not close the attempt record");
    }
}

/// Adds the units a succeeded task's `output` names to its queue's `then` queue. Runs only
/// after the result was recorded as this attempt's, so a superseded run chains nothing; a
/// failure here is logged and never changes the finished task.
async fn chain_output(store: &Store, task: ObjectId, then: &str, output: &serde_json::Value) {
    let units = disbatch_core::chaining::units_from_output(output, DateTime::now());
    if units.is_empty() {
        return;
    }
    let target = match store.find_queue(then).await {
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
        store.add_units(target, units.clone(), OnConflict::Update)
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

/// How many attempts have started, this one included (`attempts` is incremented on start).
fn attempts_started(doc: &Document) -> i64 {
    match doc.get(field::ATTEMPTS) {
        Some(Bson::Int32(n)) => *n as i64,
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(n)) => *n as i64,
        _ => 1,
    }
}

/// Everything needed to start the plugin, or the reason it cannot start (stored as stderr).
struct Prepared {
    executable: std::path::PathBuf,
    queue_name: String,
    queue_id: ObjectId,
    max_retries: Option<u32>,
    then: Option<String>,
    config_json: Option<String>,
    run: disbatch_core::run_policy::RunPolicy,
}

/// The attempt being run and where it is recorded.
struct Run<'a> {
    store: &'a Store,
    config: &'a Config,
    task: ObjectId,
    attempt: ObjectId,
    attempts: i64,
    node: &'a str,
}

async fn prepare(
    config: &Config,
    store: &Store,
    doc: &Document,
    node: &str,
) -> Result<Prepared, String> {
    let task = doc
        .get_object_id(field::ID)
        .map(|i| i.to_hex())
        .unwrap_or_default();
    let queue_id = doc
        .get_object_id(field::QUEUE)
        .map_err(|_| format!("task {task} has no valid queue id"))?;
    let queue = store
        .queue_by_id(queue_id)
        .await
        .map_err(|e| format!("could not read queue {queue_id} of task {task}: {e}"))?
        .ok_or_else(|| {
            format!(
                "No plugin defined for task {task} in queue {queue_id}: the queue does not exist"
            )
        })?;
    let plugin = queue.plugin.map_err(|e| {
        format!(
            "No plugin defined for task {task} in queue {}: {e}",
            queue.name
        )
    })?;
    let executable = config
        .plugins
        .resolve(&plugin)
        .map_err(|e| format!("cannot run task {task} on node {node}: {e}"))?;
    match doc
        .get(field::PARAMS)
        .or_else(|| doc.get(field::LEGACY_PARAMS))
    {
        Some(Bson::Document(_)) => {}
        Some(other) => {
            return Err(format!(
                "task {task} cannot run: params must be an object, found {}",
                bson_type_name(other)
            ))
        }
        None => return Err(format!("task {task} cannot run: it has no params object")),
    }
    Ok(Prepared {
        executable,
        queue_name: queue.name,
        queue_id,
        max_retries: queue.spec.max_retries,
        then: queue.spec.then.clone(),
        config_json: queue.spec.config_json.clone(),
        run: queue.run,
    })
}

async fn run_and_capture(
    doc: &Document,
    prepared: Prepared,
    run: &Run<'_>,
    wake: Option<tokio::signal::unix::Signal>,
) -> Result<Ran> {
    let Run {
        store,
        config,
        task,
        attempt,
        attempts,
        node,
    } = *run;
    let spool = tempfile::Builder::new()
        .prefix(&format!("disbatch-task-{task}-"))
        .tempdir()
        .map_err(|e| Error::io("creating the output spool directory", e))?;
    let task_json = serde_json::to_vec(&Bson::Document(doc.clone()).into_relaxed_extjson())
        .map_err(|e| Error::Invalid(format!("encoding task {task} as JSON: {e}")))?;
    let call = PluginCall {
        executable: &prepared.executable,
        task_json,
        task_id: task.to_hex(),
        attempt: attempt.to_hex(),
        queue_name: prepared.queue_name,
        queue_id: prepared.queue_id.to_hex(),
        queue_config: prepared.config_json.clone(),
        node: node.to_string(),
        env: &config.plugin_env,
    };
    let finished = |end, stdout, stderr, spool| Finished {
        task,
        node: node.to_string(),
        attempt,
        end,
        stdout,
        stderr,
        spool,
    };
    let mut plugin = match start_plugin(call, spool.path()) {
        Ok(p) => p,
        Err(e) => {
            let reason = format!(
                "could not start plugin {}: {e}",
                prepared.executable.display()
            );
            tracing::warn!(task = %task, "{reason}");
            let end = TaskEnd::Status(status::FAILED);
            let done = finished(
                end,
                Captured::from_text("Unable to start"),
                Captured::from_text(reason),
                None,
            );
            return Ok(Ran::Finished(Box::new(done), RunFacts::default()));
        }
    };
    let stopped = supervise(store, task, attempt, prepared.run, &mut plugin, wake)
        .await
        .map_err(|e| Error::io("waiting for the plugin", e))?;
    let paths = plugin.paths.clone();
    let exit = match stopped {
        Stopped::Exited(e) | Stopped::TimedOut(e, _) | Stopped::Cancelled(e) => e,
        Stopped::LeaseLost(e) => {
            let facts = RunFacts {
                exit: Some(e),
                stopped: Some(stopped),
                ..RunFacts::default()
            };
            return Ok(Ran::LeaseLost(facts));
        }
    };
    let result = match tokio::fs::read(&paths.result).await {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("reading the plugin's result file", e)),
    };
    let Outcome {
        status,
        mut note,
        retry,
        result,
    } = decide(exit, result.as_deref());
    // Why the runner ended the plugin comes first; the exit's own remark follows.
    let mut lead_note = |why: String| {
        note = Some(match note.take() {
            Some(n) => format!("{why}; {n}"),
            None => why,
        });
    };
    let end = match (stopped, retry) {
        (Stopped::TimedOut(_, after), _) => {
            lead_note(format!("timed out after {} s", after.as_secs_f64()));
            TaskEnd::Status(status::FAILED)
        }
        (Stopped::Cancelled(_), _) => {
            lead_note("cancelled by an operator while running".to_string());
            TaskEnd::Status(status::CANCELLED)
        }
        (_, Some(_)) if prepared.max_retries.is_some_and(|m| attempts >= m as i64) => {
            let why = format!(
                "too many retries: attempt {attempts} asked for another, max_retries is {}",
                prepared.max_retries.unwrap_or(0)
            );
            note = Some(match note.take() {
                Some(n) => format!("{n}; {why}"),
                None => why,
            });
            TaskEnd::Status(status::FAILED)
        }
        (_, Some(delay)) if delay > Duration::ZERO => TaskEnd::Retry {
            not_before: Some(DateTime::from_millis(
                DateTime::now().timestamp_millis() + delay.as_millis() as i64,
            )),
        },
        (_, Some(_)) => TaskEnd::Retry { not_before: None },
        (_, None) => TaskEnd::Status(status),
    };
    if let Some(note) = note {
        append_note(&paths.stderr, &note).await?;
    }
    let chain = match (
        &prepared.then,
        result.as_ref().and_then(|m| m.get("output")),
    ) {
        (Some(then), Some(output)) => Some((then.clone(), output.clone())),
        _ => None,
    };
    let facts = RunFacts {
        exit: Some(exit),
        result: result.and_then(|m| bson::to_document(&m).ok()),
        chain,
        stopped: (!matches!(stopped, Stopped::Exited(_))).then_some(stopped),
    };
    let done = finished(
        end,
        Captured::load(&paths.stdout).await?,
        Captured::load(&paths.stderr).await?,
        Some(spool),
    );
    Ok(Ran::Finished(Box::new(done), facts))
}

/// The runner's own remarks go at the end of the task's stderr, on a line of their own.
async fn append_note(stderr: &std::path::Path, note: &str) -> Result<()> {
    use std::io::SeekFrom;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
    let context = |e| Error::io("appending to the task's stderr", e);
    let mut file = tokio::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(stderr)
        .await
        .map_err(context)?;
    // Only the last byte decides whether the note needs its own line; stderr may be huge.
    let len = file.metadata().await.map_err(context)?.len();
    let mut last = [b'\n'];
    if len > 0 {
        file.seek(SeekFrom::Start(len - 1)).await.map_err(context)?;
        file.read_exact(&mut last).await.map_err(context)?;
    }
    let text = format!(
        "{}[disbatch] {note}\n",
        if last[0] == b'\n' { "" } else { "\n" }
    );
    file.write_all(text.as_bytes()).await.map_err(context)
}

fn bson_type_name(b: &Bson) -> &'static str {
    match b {
        Bson::String(_) => "a string",
        Bson::Array(_) => "an array",
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => "a number",
        Bson::Boolean(_) => "a boolean",
        Bson::Null => "null",
        _ => "a non-object value",
    }
}
