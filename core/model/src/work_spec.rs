//! Coordinate work-spec definitions as queue documents: the magic keys mapped onto queue
//! fields, and the fields a reload resets when the definition no longer sets them.

use bson::{doc, Bson, Document};
use serde_json::{Map, Value};

use crate::schema::queue;

/// The cap a spec gets without `max_running`: Coordinate's "unlimited" would be a queue with
/// `threads` missing, which Disbatch reads as paused. Node `maxthreads` still applies.
pub const DEFAULT_SPEC_THREADS: i64 = 100;

/// What loading one spec writes to its queue.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecLoad {
    pub name: String,
    pub set: Document,
    /// Fields to remove: the spec no longer sets them, so they return to their defaults.
    pub unset: Vec<&'static str>,
}

/// Maps a definition (`name` plus magic keys) to queue fields. `default_plugin` applies when
/// the spec names none. The whole definition is kept as the queue's `config`.
pub fn spec_load(
    spec: &Map<String, Value>,
    default_plugin: Option<&str>,
) -> Result<SpecLoad, String> {
    let name = match spec.get("name") {
        Some(Value::String(n)) => {
            crate::names::check_name("queue name", n)?;
            n.clone()
        }
        _ => return Err("name must be a string".into()),
    };
    let plugin = match spec.get("plugin") {
        Some(Value::String(p)) if !p.is_empty() => p.clone(),
        None => default_plugin
            .ok_or("no plugin: set `plugin` in the spec or pass a default")?
            .to_string(),
        _ => return Err("plugin must be a string".into()),
    };
    let mut f = Fields {
        spec,
        set: doc! {queue::NAME: &name, queue::PLUGIN: &plugin},
        unset: vec![queue::NEXT_CONTINUOUS, queue::NICE, queue::PAUSED_THREADS],
    };
    f.coordinate_fields()?;
    f.run_fields()?;
    let max_running = f.limit_fields()?;
    let Fields {
        mut set, mut unset, ..
    } = f;
    // Cron schedules (`schedule.rs`), checked as the leader reads them.
    let (schedule, no_schedule) = crate::schedule::spec_fields(spec)?;
    set.extend(schedule);
    unset.extend(no_schedule);
    let threads = int(spec, "threads")?
        .or(max_running)
        .unwrap_or(DEFAULT_SPEC_THREADS);
    set.insert(queue::THREADS, threads.max(0));
    // Coordinate picks units by priority, then name.
    set.insert(
        queue::SORT,
        text(spec, "sort")?.unwrap_or_else(|| "priority".into()),
    );
    let config = crate::text::client_json::storable(&Value::Object(spec.clone()), "spec")?;
    set.insert(queue::CONFIG, config);
    // What a node reads back must be what the spec meant: the node's own reader decides.
    crate::queue::check_queue_fields(&set)?;
    Ok(SpecLoad { name, set, unset })
}

/// The queue fields a spec sets, and those it leaves unset (removed from the queue).
struct Fields<'a> {
    spec: &'a Map<String, Value>,
    set: Document,
    unset: Vec<&'static str>,
}

impl Fields<'_> {
    fn put(&mut self, field: &'static str, value: Option<Bson>) {
        match value {
            Some(v) => {
                self.set.insert(field, v);
            }
            None => self.unset.push(field),
        }
    }

    /// Coordinate's own: priority, weight (or nice), disabled, continuous and interval,
    /// min_gb, max_getwork, max_retries, then and runtime.
    fn coordinate_fields(&mut self) -> Result<(), String> {
        let spec = self.spec;
        // Weight comes from `weight`, else 20 − nice, clamped to at least 1 (Coordinate's rule).
        let weight = match (int(spec, "weight")?, int(spec, "nice")?) {
            (Some(w), _) => Some(w.max(1)),
            (None, Some(n)) => Some((20 - n).max(1)),
            (None, None) => None,
        };
        self.put(queue::PRIORITY, int(spec, "priority")?.map(Bson::Int64));
        self.put(queue::WEIGHT, weight.map(Bson::Int64));
        self.put(queue::DISABLED, flag(spec, "disabled")?.map(Bson::Boolean));
        self.put(
            queue::CONTINUOUS,
            flag(spec, "continuous")?.map(Bson::Boolean),
        );
        let interval = int(spec, "interval")?.filter(|i| *i > 0);
        self.put(queue::INTERVAL, interval.map(Bson::Int64));
        let min_gb = match spec.get("min_gb") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|gb| gb.is_finite() && *gb >= 0.0)
                    .ok_or(format!("min_gb must be a number of GB, 0 or more, not {v}"))?,
            ),
        };
        self.put(queue::MIN_GB, min_gb.map(Bson::Double));
        let max_getwork = int(spec, "max_getwork")?.filter(|n| *n > 0);
        self.put(queue::MAX_GETWORK, max_getwork.map(Bson::Int64));
        let max_retries = int(spec, "max_retries")?.filter(|n| *n > 0);
        self.put(queue::MAX_RETRIES, max_retries.map(Bson::Int64));
        let then = text(spec, "then")?.filter(|t| !t.is_empty());
        self.put(queue::THEN, then.map(Bson::String));
        let runtime = text(spec, "runtime")?.filter(|t| !t.is_empty());
        self.put(queue::RUNTIME, runtime.map(Bson::String));
        Ok(())
    }

    /// How a unit runs: its lease, `on_lost`, timeouts, and the persistent worker's settings.
    /// The run policy is validated here so a bad spec is refused, not a skipped queue later.
    fn run_fields(&mut self) -> Result<(), String> {
        let spec = self.spec;
        if let Some(lease) = seconds(spec, "lease")? {
            crate::run_policy::lease_from(Some(lease))?;
        }
        self.put(queue::LEASE, seconds(spec, "lease")?.map(Bson::Double));
        let on_lost = text(spec, "on_lost")?;
        crate::run_policy::OnLost::parse(on_lost.as_deref())?;
        // Coordinate makes a unit whose attempt expired available again: a spec's queue does
        // the same unless it says otherwise (plain Disbatch queues keep `orphan`).
        let on_lost = on_lost.unwrap_or_else(|| "requeue".into());
        self.put(queue::ON_LOST, Some(Bson::String(on_lost)));
        for key in [queue::TIMEOUT, queue::KILL_GRACE] {
            let value = seconds(spec, key)?;
            crate::run_policy::parse_seconds(value, key)?;
            self.put(key, value.map(Bson::Double));
        }
        // How the plugin runs (plugins/PROTOCOL.md), checked the same way.
        let worker = text(spec, queue::WORKER)?.filter(|w| !w.is_empty());
        crate::worker_policy::WorkerMode::parse(worker.as_deref())?;
        self.put(queue::WORKER, worker.map(Bson::String));
        for key in [queue::WORKER_IDLE_S, queue::WORKER_START_S] {
            let value = seconds(spec, key)?;
            crate::run_policy::parse_seconds(value, key)?;
            self.put(key, value.map(Bson::Double));
        }
        for key in [queue::WORKER_MAX_TASKS, queue::WORKER_MAX_RSS_MB] {
            let value = limit(spec.get(key), key)?;
            self.put(key, value.map(Bson::Int64));
        }
        Ok(())
    }

    /// The flow limits (`limits.rs`), stored as given and read back by the node's own parser,
    /// and `max_running`, which it returns.
    fn limit_fields(&mut self) -> Result<Option<i64>, String> {
        let spec = self.spec;
        for key in [queue::RATE_LIMIT, queue::CONCURRENCY, queue::UNIQUE] {
            let value = match spec.get(key) {
                None | Some(Value::Null) => None,
                Some(v @ Value::Object(_)) => Some(crate::text::client_json::storable(v, key)?),
                Some(other) => {
                    return Err(format!("{key} must be an object or null, found {other}"))
                }
            };
            self.put(key, value);
        }
        let max_running = int(spec, "max_running")?.filter(|n| *n > 0);
        self.put(queue::MAX_RUNNING, max_running.map(Bson::Int64));
        Ok(max_running)
    }
}

/// A Coordinate count: a number, its fraction dropped.
fn int(spec: &Map<String, Value>, k: &str) -> Result<Option<i64>, String> {
    match spec.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite())
            .map(|f| Some(f.trunc() as i64))
            .ok_or(format!("{k} must be a number")),
    }
}

fn flag(spec: &Map<String, Value>, k: &str) -> Result<Option<bool>, String> {
    match spec.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{k} must be true or false")),
    }
}

fn text(spec: &Map<String, Value>, k: &str) -> Result<Option<String>, String> {
    match spec.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{k} must be a string")),
    }
}

fn seconds(spec: &Map<String, Value>, k: &str) -> Result<Option<f64>, String> {
    match spec.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or(format!("{k} must be a number of seconds")),
    }
}

/// A worker limit (`worker_max_tasks`, `worker_max_rss_mb`): a whole number, 0 for no limit.
/// Unlike the Coordinate counts a fraction is refused, not truncated, as a node would skip it.
fn limit(value: Option<&Value>, key: &str) -> Result<Option<i64>, String> {
    let n = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => v
            .as_i64()
            .or_else(|| {
                v.as_f64()
                    .filter(|f| f.is_finite() && f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            })
            .ok_or(format!(
                "{key} must be a whole number (0: no limit), found {v}"
            ))?,
    };
    crate::worker_policy::limit_from(Some(n), key)?;
    Ok(Some(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(v: Value) -> Result<SpecLoad, String> {
        spec_load(v.as_object().expect("object"), Some("echo"))
    }

    #[test]
    fn magic_keys_map_onto_queue_fields() {
        let l = load(json!({"name": "a", "priority": 3, "nice": 5, "max_running": 4, "max_getwork": 2,
                            "continuous": true, "interval": 60.9, "then": "b", "max_retries": 3, "runtime": "go"}))
        .expect("ok");
        assert_eq!(l.set.get_str("plugin").ok(), Some("echo"));
        assert_eq!(l.set.get_i64("weight").ok(), Some(15));
        assert_eq!(l.set.get_i64("threads").ok(), Some(4));
        assert_eq!(l.set.get_i64("interval").ok(), Some(60));
        assert_eq!(l.set.get_str("sort").ok(), Some("priority"));
        assert_eq!(
            l.set
                .get_document("config")
                .ok()
                .and_then(|c| c.get_str("then").ok()),
            Some("b")
        );
        assert!(
            l.unset.contains(&"next_continuous"),
            "a reload resets the continuous clock"
        );
        assert!(!l.unset.contains(&"priority"));
    }

    #[test]
    fn absent_keys_are_reset_and_weight_is_clamped() {
        let l = load(json!({"name": "a", "nice": 100})).expect("ok");
        assert_eq!(l.set.get_i64("weight").ok(), Some(1));
        assert_eq!(l.set.get_i64("threads").ok(), Some(DEFAULT_SPEC_THREADS));
        for field in [
            "priority",
            "disabled",
            "continuous",
            "then",
            "max_retries",
            "max_getwork",
        ] {
            assert!(l.unset.contains(&field), "{field} resets");
        }
    }

    #[test]
    fn the_run_policy_is_mapped_and_checked() {
        let l = load(json!({"name": "a", "lease": 10, "on_lost": "requeue", "timeout": 2.5}))
            .expect("ok");
        assert_eq!(l.set.get_f64("lease").ok(), Some(10.0));
        assert_eq!(l.set.get_str("on_lost").ok(), Some("requeue"));
        assert_eq!(l.set.get_f64("timeout").ok(), Some(2.5));
        assert!(l.unset.contains(&"kill_grace"));
        // Coordinate requeues a unit whose attempt expired; a spec may still ask to orphan.
        let l = load(json!({"name": "a"})).expect("ok");
        assert_eq!(l.set.get_str("on_lost").ok(), Some("requeue"));
        let l = load(json!({"name": "a", "on_lost": "orphan"})).expect("ok");
        assert_eq!(l.set.get_str("on_lost").ok(), Some("orphan"));
        for (bad, key) in [
            (json!({"name": "a", "lease": 1}), "lease"),
            (json!({"name": "a", "on_lost": "retry"}), "on_lost"),
            (json!({"name": "a", "timeout": -1}), "timeout"),
            (json!({"name": "a", "kill_grace": "soon"}), "kill_grace"),
        ] {
            assert!(load(bad).expect_err("bad").contains(key), "{key}");
        }
    }

    #[test]
    fn worker_fields_are_mapped_checked_and_reset() {
        let l = load(json!({"name": "a", "worker": "persistent", "worker_idle_s": 2.5,
                            "worker_max_tasks": 100, "worker_max_rss_mb": 512.0, "worker_start_s": 3}))
        .expect("ok");
        assert_eq!(l.set.get_str("worker").ok(), Some("persistent"));
        assert_eq!(l.set.get_f64("worker_idle_s").ok(), Some(2.5));
        assert_eq!(l.set.get_i64("worker_max_tasks").ok(), Some(100));
        assert_eq!(l.set.get_i64("worker_max_rss_mb").ok(), Some(512));
        assert_eq!(l.set.get_f64("worker_start_s").ok(), Some(3.0));
        let l = load(json!({"name": "a", "worker": "process", "worker_max_tasks": 0})).expect("ok");
        assert_eq!(l.set.get_str("worker").ok(), Some("process"));
        assert_eq!(l.set.get_i64("worker_max_tasks").ok(), Some(0));
        let l = load(json!({"name": "a", "worker": ""})).expect("ok");
        for field in [
            "worker",
            "worker_idle_s",
            "worker_max_tasks",
            "worker_max_rss_mb",
            "worker_start_s",
        ] {
            assert!(l.unset.contains(&field), "{field} resets");
            assert!(l.set.get(field).is_none(), "{field}");
        }
        for (bad, key) in [
            (json!({"name": "a", "worker": "pool"}), "worker"),
            (json!({"name": "a", "worker": 1}), "worker"),
            (json!({"name": "a", "worker_idle_s": -1}), "worker_idle_s"),
            (
                json!({"name": "a", "worker_idle_s": "soon"}),
                "worker_idle_s",
            ),
            (
                json!({"name": "a", "worker_start_s": [3]}),
                "worker_start_s",
            ),
            (
                json!({"name": "a", "worker_max_tasks": -3}),
                "worker_max_tasks",
            ),
            (
                json!({"name": "a", "worker_max_tasks": "10"}),
                "worker_max_tasks",
            ),
            (
                json!({"name": "a", "worker_max_rss_mb": 1.5}),
                "worker_max_rss_mb",
            ),
        ] {
            assert!(load(bad.clone()).expect_err("bad").contains(key), "{bad}");
        }
    }

    #[test]
    fn flow_limits_are_mapped_checked_and_reset() {
        let l = load(
            json!({"name": "a", "rate_limit": {"starts": 50, "per_s": 10},
                            "concurrency": {"key": "params.account", "ordered": true},
                            "unique": {"key": "params.id", "for_s": 60}}),
        )
        .expect("ok");
        let limits = crate::limits::parse(&l.set).expect("a node reads them");
        assert_eq!(limits.rate.map(|r| r.starts), Some(50));
        assert!(limits.concurrency.is_some_and(|c| c.ordered));
        assert!(limits.unique.is_some());
        let l = load(json!({"name": "a", "rate_limit": null})).expect("ok");
        for field in ["rate_limit", "concurrency", "unique"] {
            assert!(l.unset.contains(&field), "{field} resets");
        }
        for (bad, key) in [
            (json!({"name": "a", "rate_limit": 5}), "rate_limit"),
            (
                json!({"name": "a", "rate_limit": {"starts": 0, "per_s": 1}}),
                "rate_limit.starts",
            ),
            (
                json!({"name": "a", "concurrency": {"max": 1}}),
                "concurrency.key",
            ),
            (
                json!({"name": "a", "unique": {"key": "k", "states": ["done"]}}),
                "unique.states",
            ),
        ] {
            assert!(load(bad.clone()).expect_err("bad").contains(key), "{bad}");
        }
    }

    #[test]
    fn a_worker_limit_is_a_whole_non_negative_number() {
        assert_eq!(limit(None, "k"), Ok(None));
        assert_eq!(limit(Some(&Value::Null), "k"), Ok(None));
        assert_eq!(limit(Some(&json!(0)), "k"), Ok(Some(0)));
        assert_eq!(limit(Some(&json!(7)), "k"), Ok(Some(7)));
        assert_eq!(limit(Some(&json!(7.0)), "k"), Ok(Some(7)));
        for bad in [json!(7.5), json!(-1), json!("7"), json!(true), json!(1e300)] {
            assert!(
                limit(Some(&bad), "k").expect_err("bad").contains('k'),
                "{bad}"
            );
        }
    }

    #[test]
    fn bad_definitions_are_refused_with_the_key() {
        assert!(load(json!({"priority": 1}))
            .expect_err("no name")
            .contains("name"));
        assert!(load(json!({"name": "a", "priority": "high"}))
            .expect_err("bad")
            .contains("priority"));
        assert!(load(json!({"name": "a", "disabled": "yes"}))
            .expect_err("bad")
            .contains("disabled"));
        assert!(
            spec_load(json!({"name": "a"}).as_object().expect("o"), None)
                .expect_err("plugin")
                .contains("plugin")
        );
    }
}
