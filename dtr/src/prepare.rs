//! Everything a plugin needs before it starts — its executable, its queue's settings, a valid
//! `params` — or the reason the task cannot run, which becomes its stderr.

use bson::oid::ObjectId;
use bson::Bson;
use disbatch_config::Config;
use disbatch_model::run_policy::RunPolicy;
use disbatch_model::task::ClaimedTask;
use disbatch_model::worker_policy::WorkerPolicy;
use disbatch_model::Queue;

/// A task ready to run.
pub struct Prepared {
    pub executable: std::path::PathBuf,
    pub queue_name: String,
    pub queue_id: ObjectId,
    pub max_retries: Option<u32>,
    pub then: Option<String>,
    pub config_json: Option<String>,
    pub run: RunPolicy,
    pub worker: WorkerPolicy,
    /// Its queue's per-key concurrency is `ordered`: a retry keeps its key slot.
    pub ordered_keys: bool,
}

/// The queue as the runner found it: read, missing, or unreadable (with the reason).
pub type QueueLookup = Result<Option<Queue>, String>;

pub fn prepare(
    config: &Config,
    queue: QueueLookup,
    claimed: &ClaimedTask,
    node: &str,
) -> Result<Prepared, String> {
    let task = claimed.id.to_hex();
    let queue_id = claimed
        .queue
        .ok_or_else(|| format!("task {task} has no valid queue id"))?;
    let queue = queue
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
    match claimed.params() {
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
        worker: queue.worker,
        ordered_keys: queue.limits.concurrency.as_ref().is_some_and(|c| c.ordered),
    })
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
