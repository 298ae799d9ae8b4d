//! disbatch-model: the schema's names and values and the rules on them, without a database.
//! The layer every other crate stands on (bson, no mongodb):
//! - the schema: collection and field names (`schema`), Disbatch status codes (`status`),
//!   queue settings and limits read leniently (this module, `queue`, `limits`, `held`),
//!   schedules, workflows and chaining, retention, retry and run policies, GridFS placement
//!   (`output`), tasks and attempts as the DEN, its runners and the store pass them (`task`);
//! - `text`: bytes and text safe to show, store and log (`printable`, `redact`, `utf8`,
//!   `client_json`, `raw_doc`);
//! - `wire`: the pipes between a DEN and its runners (`handoff`, `relay`, `result_batches`);
//! - `fleet_time`: the database server's clock as this process knows it (every time another
//!   host judges).

pub mod balance;
pub mod chaining;
pub mod held;
pub mod limits;
pub mod names;
pub mod output;
pub mod queue;
pub mod queue_balance;
pub mod retention;
pub mod retry_policy;
pub mod run_policy;
pub mod schedule;
pub mod schema;
pub mod status;
pub mod task;
pub mod work_spec;
pub mod worker_policy;
pub mod workflow;

pub mod fleet_time;
pub mod text;
pub mod wire;

use bson::oid::ObjectId;
use bson::Bson;

/// The order in which a queue's tasks are claimed (`sort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueSort {
    /// Oldest `_id` first.
    Fifo,
    /// Newest `_id` first.
    Lifo,
    /// Disbatch's default: "natural (insertion) order", which MongoDB does not define. Claimed
    /// in `_id` order, which is insertion order for tasks made by one creator, and the order
    /// an index-driven claim on mongod returns anyway.
    Default,
    /// Coordinate's order: task `priority` descending, then `key` ascending.
    Priority,
}

impl QueueSort {
    /// Reads `sort`; an unknown value falls back to `Default` with a warning, as Disbatch does.
    pub fn parse(value: Option<&Bson>) -> (QueueSort, Option<String>) {
        match value {
            None | Some(Bson::Null) => (QueueSort::Default, None),
            Some(Bson::String(s)) => match s.as_str() {
                "fifo" => (QueueSort::Fifo, None),
                "lifo" => (QueueSort::Lifo, None),
                "priority" => (QueueSort::Priority, None),
                "default" | "" => (QueueSort::Default, None),
                other => (
                    QueueSort::Default,
                    Some(format!("unknown sort {other:?}, using default order")),
                ),
            },
            Some(other) => (
                QueueSort::Default,
                Some(format!(
                    "sort must be a string, found {other}; using default order"
                )),
            ),
        }
    }
}

/// A queue as the claimer sees it. Fields that fail to parse carry the reason instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    pub id: ObjectId,
    pub name: String,
    pub plugin: Result<String, String>,
    /// The global cap on running tasks (`threads`); missing or null means 0 (paused).
    pub threads: Result<u32, String>,
    pub sort: QueueSort,
    pub sort_warning: Option<String>,
    /// The Coordinate work-spec view of the queue (defaults for a plain Disbatch queue).
    pub spec: SpecFields,
    /// Lease, on_lost, timeout and kill grace (defaults for a plain Disbatch queue).
    pub run: crate::run_policy::RunPolicy,
    /// A process per task or persistent workers, and the workers' lifecycle.
    pub worker: crate::worker_policy::WorkerPolicy,
    /// Rate limit, per-key concurrency and unique tasks (none for a plain Disbatch queue).
    pub limits: crate::limits::FlowLimits,
    /// The document as read, handed to task runners so they need not read it again.
    pub raw: bson::Document,
}

/// Coordinate work-spec fields stored additively on a queue document.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecFields {
    /// Higher runs first, across queues (default 0).
    pub priority: i64,
    /// Relative share among queues of equal priority (default 20; `nice` gives 20 − nice).
    pub weight: i64,
    /// Most tasks a node claims from this queue per pick.
    pub max_getwork: Option<u32>,
    /// `disabled` or `paused`: claim nothing, whatever `threads` says.
    pub paused: bool,
    /// Most attempts a task gets; the next one fails it with "too many retries".
    pub max_retries: Option<u32>,
    /// The queue (by name) that a succeeded task's `output` units are added to.
    pub then: Option<String>,
    /// A continuous queue gets a synthetic task when it has none, at most every `interval`.
    pub continuous: bool,
    pub interval: std::time::Duration,
    /// The runtime a node must serve to run this queue ("" when unset).
    pub runtime: String,
    /// Memory (GB) a node must have available to take this queue's tasks.
    pub min_gb: Option<f64>,
    /// The queue's `config`, as JSON, handed to its plugin.
    pub config_json: Option<String>,
}

impl Default for SpecFields {
    fn default() -> Self {
        SpecFields {
            priority: 0,
            weight: DEFAULT_WEIGHT,
            max_getwork: None,
            paused: false,
            max_retries: None,
            then: None,
            continuous: false,
            interval: std::time::Duration::ZERO,
            runtime: String::new(),
            min_gb: None,
            config_json: None,
        }
    }
}

/// Coordinate's default work-spec weight.
pub const DEFAULT_WEIGHT: i64 = 20;

/// Reads an integer stored as a number or numeric string; `None` when absent or null.
pub fn parse_integer(value: Option<&Bson>) -> Result<Option<i64>, String> {
    match value {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(n)) => Ok(Some(*n as i64)),
        Some(Bson::Int64(n)) => Ok(Some(*n)),
        Some(Bson::Double(d)) if d.fract() == 0.0 && d.abs() < 9.0e15 => Ok(Some(*d as i64)),
        Some(Bson::String(s)) => s
            .trim()
            .parse::<i64>()
            .map(Some)
            .map_err(|_| format!("{s:?} is not an integer")),
        Some(other) => Err(format!("{other} is not an integer")),
    }
}

/// Truthiness the way ops write flags by hand: true, 1, "1", "true".
pub fn parse_flag(value: Option<&Bson>) -> bool {
    match value {
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(n)) => *n != 0,
        Some(Bson::Int64(n)) => *n != 0,
        Some(Bson::Double(d)) => *d != 0.0,
        Some(Bson::String(s)) => matches!(s.trim(), "1" | "true" | "yes"),
        _ => false,
    }
}

/// Reads a thread limit stored as an integer, an integral double or a numeric string
/// (the Perl DCI stores form-encoded numbers as strings). `None` means unset.
pub fn parse_limit(value: Option<&Bson>) -> Result<Option<u32>, String> {
    let too_big = |n: &dyn std::fmt::Display| format!("{n} is too large for a thread limit");
    match value {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(n)) if *n >= 0 => Ok(Some(*n as u32)),
        Some(Bson::Int64(n)) if *n >= 0 => u32::try_from(*n).map(Some).map_err(|_| too_big(n)),
        Some(Bson::Double(d)) if *d >= 0.0 && d.fract() == 0.0 && *d <= u32::MAX as f64 => {
            Ok(Some(*d as u32))
        }
        Some(Bson::String(s)) => {
            let t = s.trim();
            if t.is_empty() {
                return Ok(None);
            }
            if !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{s:?} is not a non-negative integer"));
            }
            t.parse::<u32>().map(Some).map_err(|_| too_big(&t))
        }
        Some(other) => Err(format!("{other} is not a non-negative integer")),
    }
}

/// This build's version, reported on node documents.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit of this build (abbreviated), "unknown" when built outside a git checkout
/// without `DISBATCH_GIT_SHA` set (see `build.rs`).
pub const GIT_SHA: &str = env!("DISBATCH_GIT_SHA");

/// What `--version` prints after each program's name: `0.1.0 (git abc1234def56)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("DISBATCH_GIT_SHA"),
    ")"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_accept_numbers_and_numeric_strings() {
        assert_eq!(parse_limit(None), Ok(None));
        assert_eq!(parse_limit(Some(&Bson::Null)), Ok(None));
        assert_eq!(parse_limit(Some(&Bson::Int32(3))), Ok(Some(3)));
        assert_eq!(parse_limit(Some(&Bson::Int64(7))), Ok(Some(7)));
        assert_eq!(parse_limit(Some(&Bson::Double(2.0))), Ok(Some(2)));
        assert_eq!(parse_limit(Some(&Bson::String(" 5 ".into()))), Ok(Some(5)));
        assert_eq!(parse_limit(Some(&Bson::String("".into()))), Ok(None));
    }

    #[test]
    fn limits_refuse_garbage_with_the_value_in_the_message() {
        for bad in [
            Bson::String("abc".into()),
            Bson::String("-1".into()),
            Bson::Int32(-1),
            Bson::Double(1.5),
            Bson::Boolean(true),
            Bson::String("99999999999".into()),
        ] {
            let err = parse_limit(Some(&bad)).expect_err("must be refused");
            assert!(!err.is_empty());
        }
        let err = parse_limit(Some(&Bson::String("abc".into()))).expect_err("refused");
        assert!(err.contains("abc"), "{err}");
    }

    #[test]
    fn sort_parses_disbatch_values() {
        assert_eq!(
            QueueSort::parse(Some(&Bson::String("fifo".into()))).0,
            QueueSort::Fifo
        );
        assert_eq!(
            QueueSort::parse(Some(&Bson::String("lifo".into()))).0,
            QueueSort::Lifo
        );
        assert_eq!(QueueSort::parse(None), (QueueSort::Default, None));
        let (sort, warning) = QueueSort::parse(Some(&Bson::String("random".into())));
        assert_eq!(sort, QueueSort::Default);
        assert!(warning.is_some());
    }
}
