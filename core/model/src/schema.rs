//! Collection and field names: the MongoDB schema, a public interface (its indexes are in
//! the store, `store/conn/indexes.rs`).

pub const NODES: &str = "nodes";
pub const QUEUES: &str = "queues";
pub const TASKS: &str = "tasks";
/// Disbatch keeps task output in GridFS bucket `tasks`, not the default `fs`.
pub const GRIDFS_BUCKET: &str = "tasks";
pub const FILES: &str = "tasks.files";
pub const CHUNKS: &str = "tasks.chunks";

/// Task fields. Disbatch 4's own, then ours (additive).
pub mod task {
    pub const ID: &str = "_id";
    pub const QUEUE: &str = "queue";
    pub const STATUS: &str = "status";
    pub const NODE: &str = "node";
    pub const PARAMS: &str = "params";
    /// Disbatch 3's name for `params`, still read.
    pub const LEGACY_PARAMS: &str = "parameters";
    pub const CTIME: &str = "ctime";
    pub const MTIME: &str = "mtime";
    pub const STDOUT: &str = "stdout";
    pub const STDERR: &str = "stderr";
    pub const COMPLETE: &str = "complete";
    /// Ours: the queue slot a claimed or running task holds; unique per queue, so the
    /// database itself enforces the queue's global `threads`.
    pub const SLOT: &str = "slot";
    /// Coordinate work-unit fields, additive.
    pub const KEY: &str = "key";
    pub const PRIORITY: &str = "priority";
    /// Not claimable before this date.
    pub const NOT_BEFORE: &str = "not_before";
    /// Ours: when a failed task was discarded, its queue's `retry` policy out of attempts (or
    /// the plugin refusing a retry): a failure no retry will follow. The status stays
    /// Disbatch's failed status.
    pub const DISCARDED_AT: &str = "discarded_at";
    /// How many attempts have started, and the current one's id (its fencing token).
    pub const ATTEMPTS: &str = "attempts";
    pub const ATTEMPT: &str = "attempt";
    /// Ours: `attempts` when an operator last retried the task. Retry policies and
    /// `max_retries` count the attempts since then, so a retried task gets its attempts again;
    /// `attempts` itself keeps counting every start.
    pub const ATTEMPTS_BEFORE_RETRY: &str = "attempts_before_retry";
    /// Ours: a claimed or running task is recovered by any node once this date passes;
    /// its runner keeps moving it forward. Unset when the task ends.
    pub const LEASE_UNTIL: &str = "lease_until";
    /// Ours: when an operator asked to cancel a running task; its runner stops the plugin.
    pub const CANCEL_REQUESTED: &str = "cancel_requested";
    /// Ours: a running task's output so far, written by its runner about once a second while
    /// the plugin runs and unset in the write that records the result (see `live`).
    pub const LIVE_OUTPUT: &str = "live_output";
    /// Ours: lost attempts whose record is not written yet, `[{attempt, node, start, end,
    /// reason}]` (see `unrecorded`). Recovery adds one in the very write that takes the task
    /// from the attempt and removes it once the record is in, so a node or server that dies
    /// between the two writes leaves the record to be written by the maintenance leader.
    /// Absent otherwise.
    pub const UNRECORDED_ATTEMPTS: &str = "unrecorded_attempts";
    /// Ours: a claimed or running task of a queue with `concurrency`: its key's value (copied
    /// from the task field the queue names) and the key slot it holds, below the key's `max`.
    /// Unique per queue, key and slot, so the database itself holds the per-key limit across
    /// nodes. Unset when the task ends; kept by a task of an `ordered` queue waiting for its
    /// retry, which so keeps its place.
    pub const CONCURRENCY_KEY: &str = "concurrency_key";
    pub const CONCURRENCY_SLOT: &str = "concurrency_slot";
    /// Ours: a task of a queue with `unique` (created by our code): its key's value, and its
    /// place in the key's line of tasks, unique per queue and key. The newest (highest
    /// `unique_gen`) holds the key while `limits::Unique::holds`; a creator then gets it as
    /// the task, or inserts the next generation when it no longer holds (`unique_tasks`).
    pub const UNIQUE_KEY: &str = "unique_key";
    pub const UNIQUE_GEN: &str = "unique_gen";
    /// Ours, workflows (`store::dependencies`): the tasks a task waits for, as created
    /// (`depends_on`, ids), and those of them that have not ended yet (`waiting_on`, shrinking,
    /// unset when the task is released or cancelled). A task with `waiting_on` has status
    /// blocked (-4), which no node, ours or Perl, claims.
    pub const DEPENDS_ON: &str = "depends_on";
    pub const WAITING_ON: &str = "waiting_on";
    /// `"cancel"` or `"run"`: what a failed or cancelled dependency does to this task.
    pub const ON_DEPENDENCY_FAILURE: &str = "on_dependency_failure";
    /// `true` on a task that others may wait for and whose end has not been settled yet:
    /// the maintenance leader's sweep finds ended ones by it (a Perl node ends tasks too).
    pub const HAS_DEPENDENTS: &str = "has_dependents";
    /// Why a task was cancelled without running (a dependency failed), for people to read.
    pub const CANCEL_REASON: &str = "cancel_reason";
    /// The graph (`graphs._id`) a task was created in, and its name there.
    pub const GRAPH: &str = "graph";
    pub const GRAPH_NAME: &str = "graph_name";
    /// The batch (`batches._id`) a task is a member of; on the callback, `batch_callback`.
    pub const BATCH: &str = "batch";
    pub const BATCH_CALLBACK: &str = "batch_callback";
    /// Ours, cron schedules (`schedule`): the tick a scheduled task was made for, unique per
    /// queue (`schedule_index`), so two leaders never both enqueue one tick.
    pub const SCHEDULE_TICK: &str = "schedule_tick";
    /// On the one task `schedule_missed: "once"` makes after a gap: how many missed ticks it
    /// stands for, itself included.
    pub const SCHEDULE_MISSED_TICKS: &str = "schedule_missed_ticks";
}

/// Fields of an entry of a task's `unrecorded_attempts`: what the lost attempt's record says.
pub mod unrecorded {
    /// The attempt's id: the `_id` of its record.
    pub const ATTEMPT: &str = "attempt";
    pub const NODE: &str = "node";
    pub const START: &str = "start";
    /// When recovery took the task from the attempt.
    pub const END: &str = "end";
    pub const REASON: &str = "reason";
}

/// Fields of a task's `live_output`: `{attempt, at, stdout: {text, from, bytes}, stderr: …}`.
pub mod live {
    /// The attempt whose runner wrote it; any other attempt's copy is stale.
    pub const ATTEMPT: &str = "attempt";
    /// When it was written.
    pub const AT: &str = "at";
    pub const STDOUT: &str = "stdout";
    pub const STDERR: &str = "stderr";
    /// The stream's last bytes (at most `LIVE_TAIL`), as UTF-8 text.
    pub const TEXT: &str = "text";
    /// Where `text` starts in the stream, in bytes: what came before is not kept.
    pub const FROM: &str = "from";
    /// How many bytes the stream had when it was read: where `text` ends.
    pub const BYTES: &str = "bytes";
}

/// Ours: one record per run of a task.
pub const ATTEMPTS: &str = "attempts";

pub mod attempt {
    pub const ID: &str = "_id";
    pub const TASK: &str = "task";
    pub const QUEUE: &str = "queue";
    pub const NODE: &str = "node";
    pub const PID: &str = "pid";
    pub const START: &str = "start";
    pub const END: &str = "end";
    /// running, succeeded, failed, retry, cancelled, timed_out, discarded, or lost (its lease
    /// passed and another node recovered the task).
    pub const OUTCOME: &str = "outcome";
    pub const STATUS: &str = "status";
    pub const EXIT_CODE: &str = "exit_code";
    pub const SIGNAL: &str = "signal";
    pub const RESULT: &str = "result";
    /// Ours: true on the attempt whose end discarded its task (out of retries).
    pub const TASK_DISCARDED: &str = "task_discarded";
    /// The result file's `output` inside `result`: what the plugin gives its users.
    pub const RESULT_OUTPUT: &str = "result.output";
    /// Ours: the GridFS file (`tasks.files`, filename `result`) holding the result's
    /// `output` as JSON text, when it was too large to keep inline; `result` then has none.
    pub const OUTPUT_FILE: &str = "output_file";
    /// Ours: that file's length in bytes.
    pub const OUTPUT_BYTES: &str = "output_bytes";
    /// Ours: why a lost attempt was lost (its lease passed, its runner died, its node died),
    /// or why a failed one failed and what follows (its retry, or the task discarded).
    pub const REASON: &str = "reason";
}

pub mod queue {
    pub const ID: &str = "_id";
    pub const NAME: &str = "name";
    pub const PLUGIN: &str = "plugin";
    /// Disbatch 3's name for `plugin`, still read.
    pub const LEGACY_PLUGIN: &str = "constructor";
    pub const THREADS: &str = "threads";
    pub const SORT: &str = "sort";
    /// Ours: the `threads` a pause set aside (threads is 0 while paused, as Disbatch reads it).
    pub const PAUSED_THREADS: &str = "paused_threads";
    // Coordinate work-spec fields, additive.
    pub const PRIORITY: &str = "priority";
    pub const WEIGHT: &str = "weight";
    pub const NICE: &str = "nice";
    pub const MAX_RUNNING: &str = "max_running";
    pub const MAX_GETWORK: &str = "max_getwork";
    pub const DISABLED: &str = "disabled";
    pub const PAUSED: &str = "paused";
    pub const MAX_RETRIES: &str = "max_retries";
    pub const THEN: &str = "then";
    pub const CONTINUOUS: &str = "continuous";
    /// Seconds between a continuous queue's synthetic tasks.
    pub const INTERVAL: &str = "interval";
    /// Ours: when the next synthetic task may be made; the guard between nodes.
    pub const NEXT_CONTINUOUS: &str = "next_continuous";
    pub const RUNTIME: &str = "runtime";
    pub const MIN_GB: &str = "min_gb";
    /// Handed to the plugin as JSON (`DISBATCH_QUEUE_CONFIG`).
    pub const CONFIG: &str = "config";
    /// Ours, seconds: a running task's lease (default 30).
    pub const LEASE: &str = "lease";
    /// Ours: "orphan" (default) or "requeue", for a task whose lease passed.
    pub const ON_LOST: &str = "on_lost";
    /// Ours: how long ended tasks are kept, `{succeeded_s, failed_s, cancelled_s}`
    /// (`model::retention`), over the maintenance leader's config default; absent keeps them
    /// for ever, as Disbatch does.
    pub const RETAIN: &str = "retain";
    /// Ours: automatic retries, `{max_attempts, backoff, base_s, max_s, jitter, on}`
    /// (`model::retry_policy`); absent on a Disbatch queue, whose failures stay failed.
    pub const RETRY: &str = "retry";
    /// The fields of `retry`.
    pub mod retry {
        pub const MAX_ATTEMPTS: &str = "max_attempts";
        pub const BACKOFF: &str = "backoff";
        pub const BASE_S: &str = "base_s";
        pub const MAX_S: &str = "max_s";
        pub const JITTER: &str = "jitter";
        pub const ON: &str = "on";
        pub const ALL: [&str; 6] = [MAX_ATTEMPTS, BACKOFF, BASE_S, MAX_S, JITTER, ON];
    }
    /// Ours, seconds: the most a plugin may run before it is stopped and the task fails.
    pub const TIMEOUT: &str = "timeout";
    /// Ours, seconds between SIGTERM and SIGKILL when a plugin is stopped (default 5).
    pub const KILL_GRACE: &str = "kill_grace";
    /// Ours: "process" (default: a plugin process per task) or "persistent" (workers).
    pub const WORKER: &str = "worker";
    /// Ours, seconds an idle persistent worker is kept (default 60).
    pub const WORKER_IDLE_S: &str = "worker_idle_s";
    /// Ours: tasks after which a persistent worker is replaced (default 0: no limit).
    pub const WORKER_MAX_TASKS: &str = "worker_max_tasks";
    /// Ours: resident MiB past which a persistent worker is replaced (default 0: no limit).
    pub const WORKER_MAX_RSS_MB: &str = "worker_max_rss_mb";
    /// Ours, seconds a new persistent worker has to say `ready` (default 30).
    pub const WORKER_START_S: &str = "worker_start_s";
    /// Ours: when our code last queued new tasks in this queue (the DCI, units, chaining,
    /// continuous queues), or the maintenance leader found some queued by another writer. A
    /// work signal: nodes watch queue documents, not every task insert.
    pub const TASKS_QUEUED_AT: &str = "tasks_queued_at";
    /// Ours: when our code last queued tasks of this queue again (a retry, a give-back, a
    /// recovered lease): nodes read past their claim windows.
    pub const TASKS_REQUEUED_AT: &str = "tasks_requeued_at";
    /// Ours, flow limits (`limits.rs`): `{starts, per_s, partition, max_partitions}`,
    /// `{key, max, ordered}` and `{key, states, for_s}`.
    pub const RATE_LIMIT: &str = "rate_limit";
    pub const CONCURRENCY: &str = "concurrency";
    pub const UNIQUE: &str = "unique";
    /// Ours: the default `on_dependency_failure` of tasks created in the queue.
    pub const ON_DEPENDENCY_FAILURE: &str = "on_dependency_failure";
    /// Ours, cron schedules (`schedule.rs`): the pattern, its IANA zone (default UTC), the
    /// params of each task, and `"skip"` or `"once"` for ticks missed past the grace.
    pub const SCHEDULE: &str = "schedule";
    pub const SCHEDULE_TZ: &str = "schedule_tz";
    pub const SCHEDULE_PARAMS: &str = "schedule_params";
    pub const SCHEDULE_MISSED: &str = "schedule_missed";
    /// Written by the maintenance leader: the newest tick settled (enqueued, skipped, or
    /// passed while paused; only ever moved forward, `$max`), and the schedule it counts
    /// for (pattern, zone, policy): a schedule whose basis differs starts afresh from now.
    pub const SCHEDULE_LAST: &str = "schedule_last";
    pub const SCHEDULE_BASIS: &str = "schedule_basis";
}

/// Ours: one document per graph created by `POST /graphs`: `{_id, ctime, size}`; its tasks
/// carry `graph` and `graph_name`.
pub const GRAPHS: &str = "graphs";
/// Ours: one document per batch: `{_id, ctime, size, callback: {queue, params} | null,
/// callback_task: id | null, cancelled: date?, done: date?}`; its members carry `batch`.
pub const BATCHES: &str = "batches";

pub mod workflow {
    pub const ID: &str = "_id";
    pub const CTIME: &str = "ctime";
    pub const SIZE: &str = "size";
    pub const CALLBACK: &str = "callback";
    pub const CALLBACK_TASK: &str = "callback_task";
    pub const CANCELLED: &str = "cancelled";
    pub const DONE: &str = "done";
}

/// Ours: one document per rate-limited queue and partition, the starts its limit granted
/// within the last period: `{_id: {queue, partition}, queue, starts: [{t, n, f}], open: {t, n,
/// f}, granted: {id, n, a, at}, until}` (`store::rate_limits`). Times are the server's, in milliseconds.
pub const RATE_LIMITS: &str = "rate_limits";

pub mod rate {
    pub const ID: &str = "_id";
    /// Inside `_id`: the queue's `_id` and the partition's value (null without a partition).
    pub const QUEUE: &str = "queue";
    pub const PARTITION: &str = "partition";
    /// `[{t, n}]`, oldest first: `n` starts granted at server time `t` (ms since the epoch);
    /// an entry leaves the window `per_s` after its `t`.
    pub const STARTS: &str = "starts";
    pub const T: &str = "t";
    pub const N: &str = "n";
    /// The newest entry, `{t, n, f}`, apart from `starts` while it still takes grants: those
    /// within `per / 64` of its first (`f`) join it and move its `t` to theirs.
    pub const OPEN: &str = "open";
    pub const FIRST: &str = "f";
    /// The last grant: `{id, n, a, at}`, how a node reads back what its own write granted
    /// (`a`: the starts granted ahead, counted at the end of their horizon).
    pub const GRANTED: &str = "granted";
    pub const GRANT_ID: &str = "id";
    pub const AHEAD: &str = "a";
    pub const AT: &str = "at";
    /// When the newest entry leaves the window (a date): the partition is live until then,
    /// and its document can be removed after.
    pub const UNTIL: &str = "until";
}

pub mod node {
    pub const ID: &str = "_id";
    pub const NODE: &str = "node";
    pub const TIMESTAMP: &str = "timestamp";
    pub const MAXTHREADS: &str = "maxthreads";
    /// Ours: the node's loop interval in milliseconds, how often it heartbeats; a reader
    /// judges the node alive by it (a node with a long interval is not dead between beats).
    pub const INTERVAL_MS: &str = "interval_ms";
    /// Ours, informational: what the DEN reports about itself on each heartbeat.
    pub const PID: &str = "pid";
    pub const VERSION: &str = "version";
    pub const RUNNING: &str = "running";
    pub const RUNTIMES: &str = "runtimes";
    /// Ours: live task runners `[{task, pid}]`, the node's child workers.
    pub const RUNNERS: &str = "runners";
    /// Ours: the queues (ids) the node serves, and how many more tasks it may start (null:
    /// no `maxthreads`), so nodes can share a queue's slots among all that want them.
    pub const SERVES: &str = "serves";
    pub const ROOM: &str = "room";
    /// Ours: when our DEN last wrote `serves`. Not `timestamp`: a Perl DEN that takes over
    /// the document rewrites it whole with a new `timestamp`, keeping our stale `serves`.
    pub const SERVES_AT: &str = "serves_at";
    /// Ours: set by the maintenance leader when work came for a queue this node serves (the
    /// leader holds the fleet's one change stream); the node's next heartbeat reads and
    /// removes it, and the node reads its queues at once.
    pub const WORK_SIGNALLED_AT: &str = "work_signalled_at";
    /// Ours: whether the node waits for work (its last claim pass ran short of tasks, or it
    /// runs nothing), so it starts work on the leader's marks; the leader holds the fleet's
    /// stream while itself or any node does.
    pub const WAITING_FOR_WORK: &str = "waiting_for_work";
    /// Ours: how far the node's host clock is ahead of the database server's (host minus
    /// server, in ms; negative: behind), as last measured. Every time a node writes for
    /// others to judge comes from the server's clock; this says how far off the host's is.
    pub const CLOCK_OFFSET_MS: &str = "clock_offset_ms";
}

pub mod file {
    pub const ID: &str = "_id";
    pub const FILENAME: &str = "filename";
    pub const LENGTH: &str = "length";
    pub const CHUNK_SIZE: &str = "chunkSize";
    pub const UPLOAD_DATE: &str = "uploadDate";
    pub const MD5: &str = "md5";
    pub const METADATA: &str = "metadata";
    pub const TASK_ID: &str = "task_id";
    pub const METADATA_TASK_ID: &str = "metadata.task_id";
}

pub mod chunk {
    pub const FILES_ID: &str = "files_id";
    pub const N: &str = "n";
    pub const DATA: &str = "data";
}

/// `unrecorded_attempts.<field>`, for queries into the array's entries.
pub fn unrecorded_field(field: &str) -> String {
    format!("{}.{field}", task::UNRECORDED_ATTEMPTS)
}

/// Ours: one document per queue, `{_id: <queue id>, queued: n, succeeded: n, …, seq: n,
/// reconciled_at: date}`: the queue's tasks by status group (not claimed and running, which are
/// counted live), kept by the writes that change a status. Readers trust a document only once
/// `reconciled_at` is set; `seq` grows with every write of counts.
pub const TASK_COUNTS: &str = "task_counts";

pub mod counts {
    pub const ID: &str = "_id";
    pub const SEQ: &str = "seq";
    pub const RECONCILED_AT: &str = "reconciled_at";
    /// Of the failed tasks, those that carry `discarded_at`.
    pub const DISCARDED: &str = "discarded";
}

pub const BALANCE: &str = "balance";
/// Ours: one document per singleton job, `{_id: <job>, owner: <node>, until: <date>}`.
pub const LEASES: &str = "leases";
/// The lease `_id` of the QueueBalance job.
pub const QUEUE_BALANCE_LEASE: &str = "queuebalance";
/// The lease `_id` of the fleet's maintenance (recovery, continuous units): its owner leads.
pub const MAINTENANCE_LEASE: &str = "maintenance";

pub mod lease {
    pub const ID: &str = "_id";
    pub const OWNER: &str = "owner";
    pub const UNTIL: &str = "until";
}

pub mod balance {
    pub const MAX_TASKS: &str = "max_tasks";
    pub const QUEUES: &str = "queues";
    pub const DISABLED: &str = "disabled";
    pub const STATUS: &str = "status";
    pub const MESSAGE: &str = "message";
    pub const TIMESTAMP: &str = "timestamp";
}

/// Ours: per-minute statistics, one document per minute and queue (`queue: null`: the whole
/// fleet's totals, written for every minute, so it also marks how far the keeper got), kept by
/// the maintenance leader and expired after `STATS_RETENTION`.
pub const STATS_MINUTELY: &str = "stats_minutely";
/// How long statistics are kept (the TTL on `minute`): a week of per-minute charts.
pub const STATS_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

pub mod stats {
    /// The start of the bucket (a date; the TTL index reads it).
    pub const MINUTE: &str = "minute";
    /// The queue's `_id`, or null for the fleet's totals.
    pub const QUEUE: &str = "queue";
    pub const SUCCEEDED: &str = "succeeded";
    /// Attempts that failed, will be retried, or timed out.
    pub const FAILED: &str = "failed";
    /// Attempts recovery closed as lost (their queue's `on_lost` then requeued or orphaned).
    pub const LOST: &str = "lost";
    pub const CANCELLED: &str = "cancelled";
    /// Any other outcome (`discarded`, or one this version does not know).
    pub const OTHER: &str = "other";
    /// Tasks queued and running when the bucket was written; null for buckets written late,
    /// after a gap, when only the present is known.
    pub const QUEUED: &str = "queued";
    pub const RUNNING: &str = "running";
    /// Of the attempts that ran to an end in the bucket (not lost ones, whose end is when
    /// recovery noticed); null when none did.
    pub const MEAN_MS: &str = "mean_ms";
    pub const P95_MS: &str = "p95_ms";
    /// `[{node, succeeded, failed, lost}]`: the same counts per node (an array, not a
    /// subdocument keyed by node, since node names may hold `.` or `$`).
    pub const NODES: &str = "nodes";
    pub const NODE: &str = "node";
    /// The node that wrote the document.
    pub const WRITER: &str = "writer";
}
