//! The command line: global options and every subcommand, as clap derive types.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

/// Command-line client for the Disbatch Command Interface (disbatch-web REST API).
///
/// Credentials: `--username NAME` sends HTTP Basic auth with the password taken from
/// DISBATCH_PASSWORD; `--token-file PATH` (or DISBATCH_TOKEN) sends a Bearer token.
/// Neither is ever printed.
#[derive(Parser, Debug)]
#[command(name = "disbatch", version = disbatch_model::LONG_VERSION, about)]
pub struct Args {
    /// Base URL of disbatch-web.
    #[arg(
        long,
        short = 'u',
        env = "DISBATCH_URL",
        // The URL may carry user:password@, and help must never show credentials.
        hide_env_values = true,
        default_value = "http://localhost:8080",
        global = true
    )]
    pub url: String,
    /// Print the server's JSON response instead of human output (for scripts); control and
    /// bidi characters in it are written as \uXXXX escapes, which parse to the same value.
    #[arg(long, global = true)]
    pub json: bool,
    /// HTTP Basic user name; the password is read from DISBATCH_PASSWORD.
    #[arg(long, short = 'n', global = true, conflicts_with = "token_file")]
    pub username: Option<String>,
    /// File holding a Bearer token (DISBATCH_TOKEN is used when neither this nor --username is given).
    #[arg(long, value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// Namespace (database) to work in, when the server allows more than its own.
    #[arg(long, env = "DISBATCH_NAMESPACE", global = true)]
    pub namespace: Option<String>,
    /// PEM file of the CA (or self-signed certificate) an https --url is signed by, when it
    /// is not a public one.
    #[arg(long, value_name = "FILE", env = "DISBATCH_CACERT", global = true)]
    pub cacert: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// When the tasks a command creates may first run, and their claim priority: `POST /tasks`'s
/// `not_before`, `delay_s` and `priority`, the same for every task of the command.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct TaskTiming {
    /// Not claimed before this time: ISO-8601 UTC, e.g. 2030-01-01T00:00:00Z.
    #[arg(long, value_name = "TIME", conflicts_with = "delay_s")]
    pub not_before: Option<String>,
    /// Not claimed before this many seconds from now, on the fleet's clock (the database
    /// server's), whatever this host's clock says.
    #[arg(long, value_name = "SECONDS")]
    pub delay_s: Option<f64>,
    /// Claim order in a queue with sort priority: higher first.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub priority: Option<i64>,
}

/// Queue claim order (`sort` on the queue document).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sort {
    Fifo,
    Lifo,
    Default,
}

impl Sort {
    pub fn as_str(self) -> &'static str {
        match self {
            Sort::Fifo => "fifo",
            Sort::Lifo => "lifo",
            Sort::Default => "default",
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the allowed plugin names.
    Plugins,
    /// List queues with their task counts.
    #[command(alias = "status")]
    Queues,
    /// Create a queue.
    CreateQueue {
        name: String,
        plugin: String,
        /// How many of its tasks may run at once across all nodes.
        #[arg(long)]
        threads: Option<u64>,
        /// Claim order.
        #[arg(long, value_enum)]
        sort: Option<Sort>,
        /// The retry policy, as JSON: `{"max_attempts": 3, "backoff": "exponential",
        /// "base_s": 15, "max_s": 21600, "jitter": 0.1, "on": ["failed", "crashed", "timeout",
        /// "lost"]}` (fields left out take these defaults), or `null` for no retries. Without
        /// it the queue gets the default policy, 20 attempts.
        #[arg(long, value_name = "JSON")]
        retry: Option<String>,
    },
    /// Change fields of a queue: name, plugin (admin); threads, sort; the retry policy retry;
    /// timeout, kill_grace, lease, on_lost, max_retries, on_dependency_failure, priority,
    /// weight, max_getwork; worker (admin) and worker_idle_s, worker_max_tasks,
    /// worker_max_rss_mb, worker_start_s; config, then, continuous, interval, runtime, min_gb
    /// (admin); the flow limits rate_limit, concurrency and unique; and the cron schedule
    /// schedule, schedule_tz, schedule_params, schedule_missed. Values are read as JSON where
    /// they parse (`30`, `true`, `{"max_attempts": 3}`), else as text (`persistent`,
    /// `"*/5 * * * *"`); `null` removes a field. Example: `update-queue words worker
    /// persistent timeout 30 retry '{"max_attempts": 3}'`.
    UpdateQueue {
        /// Queue id or name.
        queue: String,
        /// FIELD VALUE pairs; `threads` takes digits or `null`.
        #[arg(value_name = "FIELD VALUE", num_args = 1.., required = true, allow_negative_numbers = true)]
        pairs: Vec<String>,
    },
    /// Show a queue's flow limits and their budget now (starts left, keys at their max,
    /// held tasks), or set them: `limits q --rate 50/10s --partition params.customer`,
    /// `--concurrency-key params.account --max 1 --ordered`, `--unique-key params.id`;
    /// `none` as the value of --rate, --concurrency-key or --unique-key removes that limit.
    Limits {
        /// Queue id or name.
        queue: String,
        #[command(flatten)]
        options: LimitOptions,
    },
    /// Delete a queue (its tasks are kept).
    DeleteQueue {
        /// Queue id or name.
        queue: String,
    },
    /// Create one task from KEY=VALUE arguments (values read as JSON where they parse), or
    /// from Disbatch's KEY VALUE pairs (string values).
    ///
    /// KEY=VALUE reads each value as JSON where it parses, as `jq --argjson` does, and as a
    /// string where it does not: `id=1` is the number 1, `flag=true` a boolean, `tags=[1,2]`
    /// an array, `name=Ada` the string "Ada", and `name='"1"'` the string "1". So a task
    /// made with `id=1` matches a queue's `unique` on `{"id": 1}`.
    ///
    /// When the first argument has no `=`, the arguments are Disbatch's KEY VALUE pairs and
    /// every value stays a string, as Disbatch's CLI sent it (`create-task q id 1` stores
    /// "1").
    ///
    /// Exits 10 when the task was not created because the queue's `unique` found a live
    /// task with the same key; the output names that task.
    CreateTask {
        /// Queue id or name.
        queue: String,
        /// KEY=VALUE arguments, or KEY VALUE pairs.
        #[arg(value_name = "KEY=VALUE | KEY VALUE")]
        pairs: Vec<String>,
        #[command(flatten)]
        timing: TaskTiming,
    },
    /// Create tasks from a JSON array, a collection query, or a JSON-lines file.
    ///
    /// Exits 10 when some inputs were not created because the queue's `unique` found live
    /// tasks with the same keys (the others are created); the output lists each with the
    /// task it matched.
    CreateTasks {
        /// Queue id or name.
        queue: String,
        /// JSON array of params objects; with --collection, `{"filter":{…},"params":{…}}`.
        #[arg(
            value_name = "JSON",
            required_unless_present = "file",
            conflicts_with = "file"
        )]
        data: Option<String>,
        /// One task per document of this collection matching the filter.
        #[arg(long, conflicts_with = "file")]
        collection: Option<String>,
        /// JSON-lines file, one params object per line (`-` for stdin).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Tasks per POST /tasks request when reading --file.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
        chunk_size: u64,
        #[command(flatten)]
        timing: TaskTiming,
    },
    /// Query tasks by indexed fields, status words, time ranges and params; prints a table
    /// (the server's JSON with --json or a shaping option).
    ///
    /// Examples: `disbatch tasks --status failed --since 1h`; `disbatch tasks --queue words
    /// --param text='"a b"' --bound 100`; `disbatch tasks '{"queue":"demo","status":-2}'`.
    Tasks {
        /// JSON object of indexed fields, e.g. '{"queue":"demo","status":-2}' (Disbatch's
        /// form; the flags below add keys to it).
        filter: Option<String>,
        #[command(flatten)]
        search: TaskSearch,
        /// Print only the number of matching tasks.
        #[arg(long)]
        count: bool,
        /// At most this many tasks.
        #[arg(long, default_value_t = 20)]
        limit: u64,
        /// Skip this many tasks.
        #[arg(long)]
        skip: Option<u64>,
        /// Projection as JSON, e.g. '["status","node"]'.
        #[arg(long, value_name = "JSON")]
        fields: Option<String>,
        /// Replace string stdout/stderr with "[terse mode]".
        #[arg(long)]
        terse: bool,
        /// Replace GridFS stdout/stderr ids with their text.
        #[arg(long)]
        full: bool,
        /// ctime and mtime as epoch seconds.
        #[arg(long)]
        epoch: bool,
        /// Pretty-printed JSON.
        #[arg(long)]
        pretty: bool,
    },
    /// List nodes with their heartbeat and running tasks.
    Nodes,
    /// Show one task, field by field (`--json` for the server's JSON).
    Task { task_id: String },
    /// List a task's attempts, oldest first: node, runner pid, start, end, outcome, exit
    /// code or signal, and why it was lost or retried.
    Attempts { task_id: String },
    /// Print the output of a task's last successful attempt (its result file's `output`),
    /// whole, as JSON: `disbatch result ID | jq`.
    Result {
        task_id: String,
        /// That attempt's output instead, whatever its outcome (the id `task` and `attempts`
        /// print).
        #[arg(long, value_name = "ATTEMPT_ID")]
        attempt: Option<String>,
    },
    /// Pause a queue: no node starts its tasks (threads 0, the old value kept).
    Pause {
        /// Queue id or name.
        queue: String,
    },
    /// Resume a paused queue (threads back to what they were).
    Resume {
        /// Queue id or name.
        queue: String,
    },
    /// Add Coordinate work units (tasks with a key unique in their queue).
    Units {
        /// Queue id or name.
        queue: String,
        /// JSON array of `{"key": "...", "params"?: {...}, "priority"?: n, "not_before"?: t}`.
        #[arg(
            value_name = "JSON",
            required_unless_present = "file",
            conflicts_with = "file"
        )]
        data: Option<String>,
        /// JSON-lines file, one unit per line (`-` for stdin).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Update the params of units whose key is taken (and requeue them) instead of
        /// rejecting them; claimed, running or blocked ones are left alone.
        #[arg(long)]
        update: bool,
    },
    /// Show the queue balancer's settings, or replace them with --set JSON.
    Balance {
        /// `{"max_tasks": {"D HH:MM": n}, "queues": [[names], ...], "disabled"?: epoch|null}`.
        #[arg(long, value_name = "JSON")]
        set: Option<String>,
    },
    /// A live view of queues and nodes, redrawn every --interval seconds (Ctrl-C quits).
    Top {
        /// Seconds between redraws.
        #[arg(long, default_value_t = 2.0, value_parser = parse_interval)]
        interval: f64,
        /// Stop after this many redraws (0: until interrupted).
        #[arg(long, default_value_t = 0)]
        iterations: u64,
    },
    /// Task counts per queue in Coordinate's states (available, delayed, pending, finished, failed)
    Summary,
    /// Coordinate work specs: `spec load FILE` creates or redefines their queues.
    Spec {
        #[command(subcommand)]
        action: SpecAction,
    },
    /// Set or clear a node's maxthreads.
    SetMaxthreads {
        /// Node name or id.
        node: String,
        /// A non-negative integer, or `null` for no limit.
        #[arg(value_name = "N|null", value_parser = parse_maxthreads, allow_negative_numbers = true)]
        maxthreads: MaxThreads,
    },
    /// Cancel a task: a queued or blocked one never runs; a claimed or running one is
    /// stopped (its runner stops the plugin's process group) and ends cancelled.
    Cancel { task_id: String },
    /// List the newest failed (status >= 2) and discarded tasks of every queue, newest first,
    /// with queue name, status, attempts, end and the last attempt's reason.
    Failures {
        /// Only this queue's (id or name).
        #[arg(long)]
        queue: Option<String>,
        /// How many (1 to 1000; the server's default is 50).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: Option<u64>,
        /// Requeue each task listed (as `disbatch retry ID` does), instead of printing them.
        #[arg(long)]
        retry: bool,
        /// Mark each task listed discarded (as `disbatch discard ID` does), instead of
        /// printing them.
        #[arg(long, conflicts_with = "retry")]
        discard: bool,
    },
    /// Mark a failed task (status >= 2) discarded: given up on, listed and counted with those
    /// a retry policy discarded. Its status and output stay; `disbatch retry` clears the mark.
    Discard { task_id: String },
    /// Requeue a finished task, or (with --queue) every failed/orphaned task of a queue.
    Retry {
        #[arg(required_unless_present = "queue", conflicts_with = "queue")]
        task_id: Option<String>,
        /// Queue id or name.
        #[arg(long)]
        queue: Option<String>,
        /// Status codes to requeue (server default: every failed status, 2 and above, and
        /// orphaned -6).
        #[arg(
            long,
            value_name = "CODE",
            requires = "queue",
            num_args = 1..,
            allow_negative_numbers = true
        )]
        status: Vec<i64>,
    },
    /// Delete a task that is not running, with its output files.
    DeleteTask { task_id: String },
    /// Stream a task's stdout, raw: control characters included, as the plugin wrote it.
    Stdout {
        task_id: String,
        /// Print the output as it comes while the task runs (polling about twice a second);
        /// exit when the task has ended, after the rest of its output.
        #[arg(long, short)]
        follow: bool,
    },
    /// Stream a task's stderr, raw: control characters included, as the plugin wrote it.
    Stderr {
        task_id: String,
        /// Print the output as it comes while the task runs (polling about twice a second);
        /// exit when the task has ended, after the rest of its output.
        #[arg(long, short)]
        follow: bool,
    },
    /// Create the MongoDB roles and users of the five components (talks to MongoDB, not the
    /// DCI). The root password is read from stdin, without echo on a terminal.
    CreateUsers {
        /// Node config: `mongohost`, `database`, and `auth` with all five passwords.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// MongoDB user (auth database `admin`) allowed to create roles and users.
        #[arg(long, alias = "root_user", value_name = "NAME")]
        root_user: String,
        /// `{collection: [actions]}` for the `plugin` role [default:
        /// /etc/disbatch/plugin-permissions.json when it exists, else none].
        #[arg(long, alias = "plugin_perms", value_name = "FILE")]
        plugin_perms: Option<PathBuf>,
        /// `{role: {collection: [actions]}}` added to the built-in roles.
        #[arg(long, alias = "additional_perms", value_name = "FILE")]
        additional_perms: Option<PathBuf>,
        /// First create the root user in `admin` (works only while the server has no users).
        #[arg(long, alias = "create_root")]
        create_root: bool,
        /// First drop the five roles and users (those that do not exist are skipped).
        #[arg(long, alias = "drop_roles")]
        drop_roles: bool,
    },
    /// A task graph: show one, create one from a file, cancel it, or wait for it to end.
    ///
    /// `graph ID` shows its state, counts and each task (name, id, state, what it still waits
    /// on, why it was cancelled); `graph --create FILE` makes one from
    /// `{"tasks": [{"name", "queue", "params"?, "depends_on"?: [names or task ids],
    /// "on_dependency_failure"?: "cancel"|"run"}]}` (or just that array); `graph ID --cancel`
    /// cancels what has not ended. `--wait` exits 0 if every task succeeded, 8 if one did
    /// not, 9 if it was cancelled.
    Graph {
        #[command(flatten)]
        options: WorkflowArgs,
    },
    /// The newest task graphs: id, creation time, size, when cancelled.
    Graphs {
        /// At most this many (the server's cap is 1000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
    },
    /// A batch of tasks and its callback: show one, create one from a file, cancel it, or wait
    /// for it (and its callback) to end.
    ///
    /// The callback runs once every member has ended, told how they ended. `batch ID` shows
    /// its state, counts, callback and members; `batch --create FILE` makes one from
    /// `{"tasks": [{"queue", "params"?}], "callback"?: {"queue", "params"?}}` (or just the
    /// tasks array); `batch ID --cancel` cancels its members and callback. `--wait` (also for
    /// the callback to end) exits 0 if all succeeded, 8 if one did not, 9 if cancelled.
    Batch {
        #[command(flatten)]
        options: WorkflowArgs,
    },
    /// The newest batches: id, creation time, size, when done, callback task, when cancelled.
    Batches {
        /// At most this many (the server's cap is 1000).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
    },
    /// Print a shell completion script.
    Completions { shell: Shell },
}

/// The options of `limits` that set a queue's flow limits (none given: show them).
#[derive(clap::Args, Debug, Default, Clone, PartialEq)]
pub struct LimitOptions {
    /// Rate limit, STARTS/PERIOD: at most STARTS task starts in any PERIOD (50/10s, 5/500ms,
    /// 100/1m), across all nodes; `none` removes it.
    #[arg(long, value_name = "N/PERIOD|none")]
    pub rate: Option<String>,
    /// With --rate: a task field (params.customer) whose every value has its own budget.
    #[arg(long, value_name = "PATH", requires = "rate")]
    pub partition: Option<String>,
    /// With --partition: the most partitions with starts in their window at once.
    #[arg(long, value_name = "N", requires = "partition")]
    pub max_partitions: Option<u64>,
    /// Per-key concurrency: a task field (params.account); `none` removes it.
    #[arg(long, value_name = "PATH|none")]
    pub concurrency_key: Option<String>,
    /// With --concurrency-key: the most running tasks per key [server default: 1].
    #[arg(long, value_name = "N", requires = "concurrency_key")]
    pub max: Option<u64>,
    /// With --concurrency-key: tasks of one key start in the order they were queued.
    #[arg(long, requires = "concurrency_key")]
    pub ordered: bool,
    /// Unique tasks: a task field (params.id); creating a task whose value a live one has
    /// gives that task instead; `none` removes it.
    #[arg(long, value_name = "PATH|none")]
    pub unique_key: Option<String>,
    /// With --unique-key: the states in which a task keeps its key [server default:
    /// queued,running].
    #[arg(
        long,
        value_name = "STATE,…",
        value_delimiter = ',',
        requires = "unique_key"
    )]
    pub unique_states: Option<Vec<String>>,
    /// With --unique-key: a task also keeps its key this many seconds after it was created.
    #[arg(long, value_name = "SECONDS", requires = "unique_key")]
    pub unique_for: Option<f64>,
    /// Set a rate limit or concurrency even while live Perl Disbatch nodes serve (they claim
    /// past both).
    #[arg(long)]
    pub force: bool,
}

/// What `graph` and `batch` take: an id to show (and cancel, or wait for), or a file to create
/// one from.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct WorkflowArgs {
    /// Its id, as `--create` or the list printed it.
    #[arg(required_unless_present = "create", conflicts_with = "create")]
    pub id: Option<String>,
    /// Create one from this JSON file (`-` for stdin) and print its ids.
    #[arg(long, value_name = "FILE")]
    pub create: Option<PathBuf>,
    /// Cancel its tasks that have not ended (queued and blocked ones never run; running
    /// ones are stopped).
    #[arg(long, conflicts_with = "create")]
    pub cancel: bool,
    /// Poll until it has ended, then print it and exit by its outcome: 0 succeeded, 8
    /// failed, 9 cancelled (`--json` prints its last state only).
    #[arg(long)]
    pub wait: bool,
    /// Seconds between polls with --wait.
    #[arg(long, default_value_t = 1.0, value_parser = parse_interval, requires = "wait")]
    pub interval: f64,
}

/// `top --interval`: from a tenth of a second to a day.
fn parse_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.1..=86_400.0).contains(&x) => Ok(x),
        _ => Err(format!("expected seconds between 0.1 and 86400, got {s:?}")),
    }
}

/// `set-maxthreads` value: `None` clears the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxThreads(pub Option<u64>);

fn parse_maxthreads(s: &str) -> Result<MaxThreads, String> {
    if s == "null" {
        return Ok(MaxThreads(None));
    }
    s.parse::<u64>()
        .map(|n| MaxThreads(Some(n)))
        .map_err(|_| format!("expected a non-negative integer or null, got {s:?}"))
}

#[derive(Debug, Subcommand)]
pub enum SpecAction {
    /// Load work specs (YAML or JSON: one spec, a list, several documents, or a `flows:` map).
    /// Reloading a spec resets the queue fields it no longer sets, as Coordinate does; each
    /// field it changes on an existing queue is printed, old → new.
    Load {
        /// The spec file, or - for stdin.
        file: String,
        /// Plugin for specs that do not name one.
        #[arg(long)]
        plugin: Option<String>,
        /// Print what loading would create and change, field by field, without writing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// What `tasks` searches for, beside (or instead of) a filter's JSON: each flag one key of
/// `GET /tasks`' filter, checked by the server as if written in the JSON.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct TaskSearch {
    /// Tasks of this queue (name or id).
    #[arg(long, value_name = "QUEUE")]
    pub queue: Option<String>,
    /// A status code (-2, 1, …) or word: queued, retrying, claimed, running, succeeded,
    /// failed (every status >= 2), discarded, terminated, blocked, cancelled, orphaned.
    #[arg(long, value_name = "STATUS", allow_hyphen_values = true)]
    pub status: Option<String>,
    /// Tasks claimed or run by this node.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Changed (mtime) at or after: ISO-8601 UTC, epoch seconds, or a span back from now on
    /// the fleet's clock (the database server's): 90s, 30m, 2h, 7d.
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Changed before; the same forms as --since.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// params.PATH equal to VALUE (JSON where it parses, else text, as create-task reads
    /// values), within one --queue; repeatable. A search no index serves needs --since or
    /// --bound.
    #[arg(long = "param", value_name = "PATH=VALUE")]
    pub params: Vec<String>,
    /// Read at most this many tasks in a search no index serves (at most 1000): the server's
    /// `limit`, where --limit is Disbatch's `.limit`, a page size.
    #[arg(long, value_name = "N")]
    pub bound: Option<u64>,
}

#[cfg(test)]
#[path = "args_tests.rs"]
mod tests;
