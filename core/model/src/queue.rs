//! A queue document read into the claimer's view of it (`parse_queue`), and the checks a
//! queue's settings pass before they are stored (`check_queue_fields`).

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::retry_policy::{Backoff, FailureKind, RetryPolicy};
use crate::run_policy::{self, OnLost, RunPolicy};
use crate::schema::queue;
use crate::worker_policy::{self, WorkerMode, WorkerPolicy};
use crate::{parse_flag, parse_integer, parse_limit, Queue, QueueSort, SpecFields, DEFAULT_WEIGHT};

/// Reads a queue document as the claimer and runner see it; Err names the skip reason.
pub fn parse_queue(d: &Document) -> Result<Queue, String> {
    let id = d.get_object_id(queue::ID).map_err(|_| {
        format!(
            "queue document with _id {:?} is skipped: _id is not an ObjectId",
            d.get(queue::ID)
        )
    })?;
    let name = match d.get(queue::NAME) {
        Some(Bson::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    let plugin = match d.get(queue::PLUGIN).or_else(|| d.get(queue::LEGACY_PLUGIN)) {
        Some(Bson::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Bson::String(_)) | None | Some(Bson::Null) => Err("no plugin is set".to_string()),
        Some(other) => Err(format!("plugin must be a string, found {other}")),
    };
    // `max_running` is Coordinate's name for the global cap; `threads` wins when both exist.
    let cap = d.get(queue::THREADS).or_else(|| d.get(queue::MAX_RUNNING));
    let spec = spec_fields(d);
    let run = run_policy(d);
    let worker = worker_fields(d);
    let limits = crate::limits::parse(d);
    // An unreadable work-spec, run-policy, worker or limit field makes the queue unservable,
    // reported like bad threads: a limit a node cannot read is one it cannot hold.
    let threads = match (parse_limit(cap), &spec, &run, &worker, &limits) {
        (Ok(t), Ok(_), Ok(_), Ok(_), Ok(_)) => Ok(t.unwrap_or(0)),
        (Err(e), ..) => Err(format!("threads: {e}")),
        (_, Err(e), ..) | (_, _, Err(e), ..) | (_, _, _, Err(e), _) | (.., Err(e)) => {
            Err(e.clone())
        }
    };
    let (sort, sort_warning) = QueueSort::parse(d.get(queue::SORT));
    Ok(Queue {
        id,
        name,
        plugin,
        threads,
        sort,
        sort_warning,
        spec: spec.unwrap_or_default(),
        run: run.unwrap_or_default(),
        worker: worker.unwrap_or_default(),
        limits: limits.unwrap_or_default(),
        raw: d.clone(),
    })
}

/// Readings of the queue document's fields that only some services use, kept beside the
/// parse so the services never name a field.
impl Queue {
    /// When the queue's next continuous unit may be made (`next_continuous`), if set.
    pub fn next_continuous(&self) -> Option<bson::DateTime> {
        self.raw.get_datetime(queue::NEXT_CONTINUOUS).ok().copied()
    }

    /// The queue's `retain` over `default` (`Retention::for_queue`).
    pub fn retention(
        &self,
        default: &crate::retention::Retention,
    ) -> Result<crate::retention::Retention, String> {
        crate::retention::Retention::for_queue(&self.raw, queue::RETAIN, default)
    }

    /// Whether the queue has a `schedule` (readable or not).
    pub fn has_schedule(&self) -> bool {
        self.raw.contains_key(queue::SCHEDULE)
    }

    /// The schedule its last tick was counted under (`schedule_basis`), when a string.
    pub fn schedule_basis(&self) -> Option<&str> {
        match self.raw.get(queue::SCHEDULE_BASIS) {
            Some(Bson::String(b)) => Some(b),
            _ => None,
        }
    }

    /// Its schedule's last enqueued tick (`schedule_last`), when a date.
    pub fn schedule_last(&self) -> Option<bson::DateTime> {
        match self.raw.get(queue::SCHEDULE_LAST) {
            Some(Bson::DateTime(last)) => Some(*last),
            _ => None,
        }
    }
}

/// Checks fields a client is about to write to a queue with the reader every node uses
/// (`parse_queue`), so the API never stores a value a node would then skip the queue for;
/// names must also pass `names::check_name`. Err names the field and what is wrong.
pub fn check_queue_fields(set: &Document) -> Result<(), String> {
    for key in [queue::NAME, queue::THEN] {
        match set.get(key) {
            None | Some(Bson::Null) => {}
            Some(Bson::String(s)) if key == queue::THEN && s.is_empty() => {}
            Some(Bson::String(s)) => crate::names::check_name(&format!("queue {key}"), s)?,
            Some(other) => return Err(format!("{key} must be a string, not {other}")),
        }
    }
    let mut d = doc! {queue::ID: ObjectId::new(), queue::NAME: "q", queue::PLUGIN: "p"};
    d.extend(set.clone());
    retry_policy(set.get(queue::RETRY), true)?;
    // Read by the maintenance leader's pruner alone, which skips a queue it cannot read.
    crate::retention::Retention::for_queue(
        set,
        queue::RETAIN,
        &crate::retention::Retention::default(),
    )?;
    // Read where tasks are created, not by `parse_queue`: checked here so none is refused later.
    match set.get(queue::ON_DEPENDENCY_FAILURE) {
        None | Some(Bson::Null) => {}
        Some(Bson::String(s)) => {
            crate::workflow::OnDependencyFailure::parse(s)?;
        }
        Some(other) => {
            return Err(format!(
                "on_dependency_failure must be \"cancel\" or \"run\", not {other}"
            ))
        }
    }
    if let Some(config) = set.get(queue::CONFIG) {
        if !matches!(config, Bson::Document(_) | Bson::Null) {
            return Err(format!("config must be an object, found {config}"));
        }
    }
    let q = parse_queue(&d)?;
    q.plugin?;
    // The leader skips a schedule it cannot read: it is refused here instead.
    crate::schedule::check(&d)?;
    q.threads
        .map_err(|e| format!("a node would skip this queue: {e}"))?;
    match q.sort_warning {
        Some(warning) if set.contains_key(queue::SORT) => Err(warning),
        _ => Ok(()),
    }
}

/// Lease, on_lost, timeout and kill grace; a value that cannot be read is the skip reason.
fn run_policy(d: &Document) -> Result<RunPolicy, String> {
    let seconds = |key: &str| -> Result<Option<f64>, String> {
        match d.get(key) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Int32(n)) => Ok(Some(*n as f64)),
            Some(Bson::Int64(n)) => Ok(Some(*n as f64)),
            Some(Bson::Double(f)) => Ok(Some(*f)),
            Some(Bson::String(s)) => s
                .trim()
                .parse::<f64>()
                .map(Some)
                .map_err(|_| format!("{key} must be a number of seconds, found {s:?}")),
            Some(other) => Err(format!("{key} must be a number of seconds, found {other}")),
        }
    };
    let on_lost = match d.get(queue::ON_LOST) {
        None | Some(Bson::Null) => OnLost::default(),
        Some(Bson::String(s)) => OnLost::parse(Some(s))?,
        Some(other) => return Err(format!("on_lost must be a string, found {other}")),
    };
    Ok(RunPolicy {
        retry: retry_policy(d.get(queue::RETRY), false)?,
        lease: run_policy::lease_from(seconds(queue::LEASE)?)?,
        on_lost,
        // A timeout of 0 means none, as an unset one does.
        timeout: run_policy::parse_seconds(seconds(queue::TIMEOUT)?, queue::TIMEOUT)?
            .filter(|t| !t.is_zero()),
        kill_grace: run_policy::parse_seconds(seconds(queue::KILL_GRACE)?, queue::KILL_GRACE)?
            .unwrap_or(run_policy::DEFAULT_KILL_GRACE),
    })
}

/// `retry`: absent, null or false for none; a document whose missing fields take
/// `RetryPolicy::DEFAULT`'s. `strict` (a client's write) also refuses fields it does not
/// know, a typo such as `max_attempt` that would otherwise pass silently; nodes reading the
/// queue ignore them, so a field a newer version adds does not stop older nodes.
pub fn retry_policy(value: Option<&Bson>, strict: bool) -> Result<Option<RetryPolicy>, String> {
    use crate::schema::queue::retry as key;
    let d = match value {
        None | Some(Bson::Null) | Some(Bson::Boolean(false)) => return Ok(None),
        Some(Bson::Document(d)) => d,
        Some(other) => {
            return Err(format!(
                "retry must be a document such as {{\"max_attempts\": 5}}, or null for none, found {other}"
            ))
        }
    };
    if strict {
        if let Some(unknown) = d.keys().find(|k| !key::ALL.contains(&k.as_str())) {
            return Err(format!(
                "retry.{unknown} is not a retry field; they are {}",
                key::ALL.join(", ")
            ));
        }
    }
    let defaults = RetryPolicy::DEFAULT;
    let number = |k: &str| -> Result<Option<f64>, String> {
        match d.get(k) {
            None | Some(Bson::Null) => Ok(None),
            Some(Bson::Int32(n)) => Ok(Some(f64::from(*n))),
            Some(Bson::Int64(n)) => Ok(Some(*n as f64)),
            Some(Bson::Double(f)) => Ok(Some(*f)),
            Some(other) => Err(format!("retry.{k} must be a number, found {other}")),
        }
    };
    let max_attempts = match number(key::MAX_ATTEMPTS)? {
        None => defaults.max_attempts,
        Some(n) if n.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&n) => n as u32,
        Some(n) => {
            return Err(format!(
                "retry.max_attempts must be a whole number, found {n}"
            ))
        }
    };
    let backoff = match d.get(key::BACKOFF) {
        None | Some(Bson::Null) => defaults.backoff,
        Some(Bson::String(s)) => Backoff::parse(s).ok_or_else(|| {
            format!("retry.backoff must be \"exponential\" or \"constant\", found {s:?}")
        })?,
        Some(other) => return Err(format!("retry.backoff must be a string, found {other}")),
    };
    let on = match d.get(key::ON) {
        None | Some(Bson::Null) => FailureKind::ALL.to_vec(),
        Some(Bson::Array(items)) => items
            .iter()
            .map(|b| match b {
                Bson::String(s) => FailureKind::parse(s).ok_or_else(|| {
                    format!("retry.on: {s:?} is not one of \"failed\", \"crashed\", \"timeout\", \"lost\"")
                }),
                other => Err(format!("retry.on must list strings, found {other}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(format!("retry.on must be a list, found {other}")),
    };
    let base_s = number(key::BASE_S)?.unwrap_or(defaults.base.as_secs_f64());
    // A base above the default cap, with no cap given, raises the cap to it.
    let max_s = number(key::MAX_S)?.unwrap_or(defaults.max.as_secs_f64().max(base_s));
    let jitter = number(key::JITTER)?.unwrap_or(defaults.jitter);
    RetryPolicy::new(max_attempts, backoff, base_s, max_s, jitter, &on).map(Some)
}

/// A retry policy as the queue document holds it, every field written out.
pub fn retry_document(p: &RetryPolicy) -> Document {
    use crate::schema::queue::retry as key;
    doc! {
        key::MAX_ATTEMPTS: p.max_attempts as i32,
        key::BACKOFF: p.backoff.as_str(),
        key::BASE_S: p.base.as_secs_f64(),
        key::MAX_S: p.max.as_secs_f64(),
        key::JITTER: p.jitter,
        key::ON: p.on().iter().map(|k| k.as_str()).collect::<Vec<_>>(),
    }
}

/// Whether a queue document (as handed to a runner) asks for persistent workers: the one
/// field a node reads per task to route it, without decoding the rest.
pub fn runs_persistent(d: &Document) -> bool {
    matches!(d.get(queue::WORKER), Some(Bson::String(s)) if s == WorkerMode::Persistent.as_str())
}

/// `worker` and its lifecycle fields; a value that cannot be read is the queue's skip reason.
fn worker_fields(d: &Document) -> Result<WorkerPolicy, String> {
    let mode = match d.get(queue::WORKER) {
        None | Some(Bson::Null) => WorkerMode::default(),
        Some(Bson::String(s)) => WorkerMode::parse(Some(s))?,
        Some(other) => return Err(format!("worker must be a string, found {other}")),
    };
    let seconds = |key: &str, default| -> Result<std::time::Duration, String> {
        let value = match d.get(key) {
            None | Some(Bson::Null) => None,
            Some(Bson::Int32(n)) => Some(*n as f64),
            Some(Bson::Int64(n)) => Some(*n as f64),
            Some(Bson::Double(f)) => Some(*f),
            Some(other) => return Err(format!("{key} must be a number of seconds, found {other}")),
        };
        Ok(run_policy::parse_seconds(value, key)?.unwrap_or(default))
    };
    let count = |key: &str| -> Result<Option<u64>, String> {
        let n = parse_integer(d.get(key)).map_err(|e| format!("{key}: {e}"))?;
        worker_policy::limit_from(n, key)
    };
    Ok(WorkerPolicy {
        mode,
        idle: seconds(queue::WORKER_IDLE_S, worker_policy::DEFAULT_IDLE)?,
        max_tasks: count(queue::WORKER_MAX_TASKS)?,
        max_rss_mb: count(queue::WORKER_MAX_RSS_MB)?,
        start: seconds(queue::WORKER_START_S, worker_policy::DEFAULT_START)?
            .max(std::time::Duration::from_millis(100)),
    })
}

/// The work-spec fields; a value that cannot be read is the queue's skip reason.
fn spec_fields(d: &Document) -> Result<SpecFields, String> {
    let priority = parse_integer(d.get(queue::PRIORITY)).map_err(|e| format!("priority: {e}"))?;
    let weight = parse_integer(d.get(queue::WEIGHT)).map_err(|e| format!("weight: {e}"))?;
    let nice = parse_integer(d.get(queue::NICE)).map_err(|e| format!("nice: {e}"))?;
    let max_getwork =
        parse_limit(d.get(queue::MAX_GETWORK)).map_err(|e| format!("max_getwork: {e}"))?;
    Ok(SpecFields {
        priority: priority.unwrap_or(0),
        weight: weight
            .or(nice.map(|n| DEFAULT_WEIGHT.saturating_sub(n)))
            .unwrap_or(DEFAULT_WEIGHT),
        max_getwork,
        paused: parse_flag(d.get(queue::DISABLED)) || parse_flag(d.get(queue::PAUSED)),
        max_retries: parse_limit(d.get(queue::MAX_RETRIES))
            .map_err(|e| format!("max_retries: {e}"))?
            .filter(|n| *n > 0),
        then: match d.get(queue::THEN) {
            None | Some(Bson::Null) => None,
            Some(Bson::String(s)) if s.is_empty() => None,
            Some(Bson::String(s)) => Some(s.clone()),
            Some(other) => return Err(format!("then must be a queue name, found {other}")),
        },
        continuous: parse_flag(d.get(queue::CONTINUOUS)),
        interval: match d.get(queue::INTERVAL) {
            None | Some(Bson::Null) => std::time::Duration::ZERO,
            Some(Bson::Int32(n)) if *n >= 0 => std::time::Duration::from_secs(*n as u64),
            Some(Bson::Int64(n)) if *n >= 0 => std::time::Duration::from_secs(*n as u64),
            Some(Bson::Double(f)) if f.is_finite() && *f >= 0.0 && *f < 1.0e9 => {
                std::time::Duration::from_secs_f64(*f)
            }
            Some(other) => {
                return Err(format!(
                    "interval must be non-negative seconds, found {other}"
                ))
            }
        },
        runtime: match d.get(queue::RUNTIME) {
            None | Some(Bson::Null) => String::new(),
            Some(Bson::String(s)) => s.clone(),
            Some(other) => return Err(format!("runtime must be a string, found {other}")),
        },
        min_gb: match d.get(queue::MIN_GB) {
            None | Some(Bson::Null) => None,
            Some(Bson::Int32(n)) => Some(*n as f64),
            Some(Bson::Int64(n)) => Some(*n as f64),
            Some(Bson::Double(f)) if f.is_finite() => Some(*f),
            Some(other) => return Err(format!("min_gb must be a number, found {other}")),
        },
        config_json: match d.get(queue::CONFIG) {
            None | Some(Bson::Null) => None,
            Some(c) => Some(c.clone().into_relaxed_extjson().to_string()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_with(fields: Document) -> Result<Queue, String> {
        let mut d = doc! {queue::ID: ObjectId::new(), queue::NAME: "q", queue::PLUGIN: "p"};
        d.extend(fields);
        parse_queue(&d)
    }

    #[test]
    fn a_queue_without_worker_fields_runs_a_process_per_task() {
        let q = queue_with(doc! {}).unwrap();
        assert_eq!(q.worker, WorkerPolicy::default());
        assert!(!q.worker.persistent());
    }

    #[test]
    fn worker_fields_are_read_with_their_units() {
        let q = queue_with(doc! {
            queue::WORKER: "persistent", queue::WORKER_IDLE_S: 2.5, queue::WORKER_MAX_TASKS: 100_i64,
            queue::WORKER_MAX_RSS_MB: 512, queue::WORKER_START_S: 3,
        })
        .unwrap();
        assert!(q.worker.persistent());
        assert_eq!(q.worker.idle, std::time::Duration::from_millis(2500));
        assert_eq!(q.worker.max_tasks, Some(100));
        assert_eq!(q.worker.max_rss_mb, Some(512));
        assert_eq!(q.worker.start, std::time::Duration::from_secs(3));
        assert!(q.threads.is_ok());
    }

    #[test]
    fn an_unreadable_worker_field_makes_the_queue_unservable_with_its_reason() {
        for (fields, needle) in [
            (doc! {queue::WORKER: "pool"}, "\"pool\""),
            (doc! {queue::WORKER: 1}, "worker must be a string"),
            (doc! {queue::WORKER_MAX_TASKS: -3}, "worker_max_tasks"),
            (doc! {queue::WORKER_IDLE_S: "soon"}, "worker_idle_s"),
            (doc! {queue::WORKER_MAX_RSS_MB: 1.5}, "worker_max_rss_mb"),
        ] {
            let q = queue_with(fields.clone()).unwrap();
            let e = q.threads.unwrap_err();
            assert!(e.contains(needle), "{fields}: {e}");
            assert!(check_queue_fields(&fields).is_err(), "{fields}");
        }
    }
}
