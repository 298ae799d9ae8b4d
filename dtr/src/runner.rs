//! One task's run: start it, find its plugin, run it, decide its status, record the result.

use bson::oid::ObjectId;
use bson::{Bson, Document};
use disbatch_core::config::Config;
use disbatch_core::model::status;
use disbatch_core::store::{schema::task as field, FinishOutcome, Store};
use disbatch_core::{Error, Result};

use crate::outcome::{decide, Outcome};
use crate::plugin_process::{run_plugin, PluginCall};
use crate::record::{record_result, with_retries, Captured, Finished};

/// What became of the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReport {
    /// The result was recorded with this status.
    Recorded(i32),
    /// The task was not claimed by this node any more (given back, reaped): nothing was run.
    NotClaimed,
    /// The plugin ran but the task had changed hands; the result was discarded.
    Discarded,
}

pub async fn run_task(
    config: &Config,
    store: &Store,
    task: ObjectId,
    node: &str,
) -> Result<RunReport> {
    let Some(doc) = with_retries("starting the task", || store.start_task(task, node)).await?
    else {
        tracing::info!(task = %task, node, "task is not claimed by this node; nothing to run");
        return Ok(RunReport::NotClaimed);
    };
    let finished = match prepare(config, store, &doc, node).await {
        Ok(call) => run_and_capture(&doc, call, task, node).await?,
        Err(reason) => {
            tracing::warn!(task = %task, "{reason}");
            Finished {
                task,
                node: node.to_string(),
                status: status::FAILED,
                stdout: Captured::from_text("Unable to start"),
                stderr: Captured::from_text(reason),
            }
        }
    };
    let final_status = finished.status;
    match record_result(store, config.gfs, &finished).await? {
        FinishOutcome::Recorded => {
            tracing::info!(task = %task, status = final_status, "task finished");
            Ok(RunReport::Recorded(final_status))
        }
        FinishOutcome::NotOurs | FinishOutcome::TooLarge => {
            tracing::warn!(task = %task, "task changed hands while it ran; its result was discarded");
            Ok(RunReport::Discarded)
        }
    }
}

/// Everything needed to start the plugin, or the reason it cannot start (stored as stderr).
struct Prepared {
    executable: std::path::PathBuf,
    queue_name: String,
    queue_id: ObjectId,
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
    })
}

async fn run_and_capture(
    doc: &Document,
    prepared: Prepared,
    task: ObjectId,
    node: &str,
) -> Result<Finished> {
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
        queue_name: prepared.queue_name,
        queue_id: prepared.queue_id.to_hex(),
        node: node.to_string(),
    };
    let spooled = match run_plugin(call, spool.path()).await {
        Ok(s) => s,
        Err(e) => {
            let reason = format!(
                "could not start plugin {}: {e}",
                prepared.executable.display()
            );
            tracing::warn!(task = %task, "{reason}");
            return Ok(Finished {
                task,
                node: node.to_string(),
                status: status::FAILED,
                stdout: Captured::from_text("Unable to start"),
                stderr: Captured::from_text(reason),
            });
        }
    };
    let result = match tokio::fs::read(&spooled.result).await {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("reading the plugin's result file", e)),
    };
    let Outcome { status, note } = decide(spooled.exit, result.as_deref());
    if let Some(note) = note {
        append_note(&spooled.stderr, &note).await?;
    }
    Ok(Finished {
        task,
        node: node.to_string(),
        status,
        stdout: Captured::load(&spooled.stdout).await?,
        stderr: Captured::load(&spooled.stderr).await?,
    })
}

/// The runner's own remarks go at the end of the task's stderr, on a line of their own.
async fn append_note(stderr: &std::path::Path, note: &str) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let needs_newline = match tokio::fs::read(stderr).await {
        Ok(bytes) => bytes.last().is_some_and(|b| *b != b'\n'),
        Err(_) => false,
    };
    let mut file = tokio::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(stderr)
        .await
        .map_err(|e| Error::io("appending to the task's stderr", e))?;
    let text = format!(
        "{}[disbatch] {note}\n",
        if needs_newline { "\n" } else { "" }
    );
    file.write_all(text.as_bytes())
        .await
        .map_err(|e| Error::io("appending to the task's stderr", e))
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
