//! How a queue's plugin is run: a process per task (`worker: "process"`, Disbatch's way) or
//! long-lived workers handed one task at a time (`worker: "persistent"`, plugins/PROTOCOL.md),
//! and when such workers are stopped and replaced.

use std::time::Duration;

/// An idle worker is stopped after this long without a task.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(60);
/// A worker that has not said `ready` after this long is killed.
pub const DEFAULT_START: Duration = Duration::from_secs(30);
/// The protocol version a supervisor offers in `DISBATCH_WORKER_PROTOCOL`.
pub const PROTOCOL_VERSION: u32 = 1;
/// The variable that tells a dual-mode plugin it runs as a worker.
pub const PROTOCOL_ENV: &str = "DISBATCH_WORKER_PROTOCOL";
/// Variables of this prefix are the worker protocol's: a process plugin never sees them.
pub const RESERVED_ENV_PREFIX: &str = "DISBATCH_WORKER_";

/// A process per task, or persistent workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkerMode {
    #[default]
    Process,
    Persistent,
}

impl WorkerMode {
    pub fn parse(value: Option<&str>) -> Result<WorkerMode, String> {
        match value {
            None | Some("") | Some("process") => Ok(WorkerMode::Process),
            Some("persistent") => Ok(WorkerMode::Persistent),
            Some(other) => Err(format!(
                "worker must be \"process\" or \"persistent\", found {other:?}"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerMode::Process => "process",
            WorkerMode::Persistent => "persistent",
        }
    }
}

/// A queue's worker settings; the defaults describe a plain Disbatch queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerPolicy {
    pub mode: WorkerMode,
    /// An idle worker is sent `stop` after this long (`worker_idle_s`).
    pub idle: Duration,
    /// A worker is replaced after this many tasks (`worker_max_tasks`); None: never.
    pub max_tasks: Option<u64>,
    /// A worker whose resident memory passed this after a task is replaced
    /// (`worker_max_rss_mb`); None: never.
    pub max_rss_mb: Option<u64>,
    /// The most a new worker may take to say `ready` (`worker_start_s`).
    pub start: Duration,
}

impl Default for WorkerPolicy {
    fn default() -> Self {
        WorkerPolicy {
            mode: WorkerMode::Process,
            idle: DEFAULT_IDLE,
            max_tasks: None,
            max_rss_mb: None,
            start: DEFAULT_START,
        }
    }
}

impl WorkerPolicy {
    pub fn persistent(&self) -> bool {
        self.mode == WorkerMode::Persistent
    }
}

/// A count where 0 means no limit, as `threads`-style fields read elsewhere.
pub fn limit_from(value: Option<i64>, key: &str) -> Result<Option<u64>, String> {
    match value {
        None | Some(0) => Ok(None),
        Some(n) if n > 0 => Ok(Some(n as u64)),
        Some(n) => Err(format!("{key} must be 0 (no limit) or more, found {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_defaults_to_a_process_per_task_and_refuses_unknown_words() {
        assert_eq!(WorkerMode::parse(None), Ok(WorkerMode::Process));
        assert_eq!(WorkerMode::parse(Some("")), Ok(WorkerMode::Process));
        assert_eq!(
            WorkerMode::parse(Some("persistent")),
            Ok(WorkerMode::Persistent)
        );
        assert!(WorkerMode::parse(Some("pool"))
            .unwrap_err()
            .contains("\"pool\""));
    }

    #[test]
    fn zero_is_no_limit_and_negatives_are_refused() {
        assert_eq!(limit_from(None, "worker_max_tasks"), Ok(None));
        assert_eq!(limit_from(Some(0), "worker_max_tasks"), Ok(None));
        assert_eq!(limit_from(Some(5), "worker_max_tasks"), Ok(Some(5)));
        assert!(limit_from(Some(-1), "worker_max_tasks")
            .unwrap_err()
            .contains("worker_max_tasks"));
    }
}
