//! Flow limits a queue sets for the whole fleet: its rate limit (`rate_limit`), per-key
//! concurrency (`concurrency`) and unique tasks (`unique`), as read from the queue document,
//! and the key each task gives them.

use std::time::Duration;

use bson::{Bson, Document};

use crate::status;

use crate::schema::queue::{CONCURRENCY, RATE_LIMIT, UNIQUE};

/// Most starts a rate limit may allow per period: each live partition keeps at most about
/// this many entries' worth of history (see `store::rate_limits`), and more is no limit.
pub const MAX_STARTS: u32 = 1_000_000;
/// Live partitions of one queue's rate limit unless the queue says otherwise.
pub const DEFAULT_MAX_PARTITIONS: u32 = 10_000;
/// Most live partitions a queue may ask for: nodes hold the exhausted ones in their claim
/// reads, so the bound is one on every claim read's size.
pub const MAX_PARTITIONS: u32 = 100_000;
/// Most concurrent tasks per key: past it a key limit is no limit, and each key's slots are
/// tried one by one.
pub const MAX_PER_KEY: u32 = 10_000;
/// Anything beyond a day is a typo, not a period.
const MAX_PERIOD: Duration = Duration::from_secs(24 * 3600);
/// Anything beyond a year is a typo, not a window for duplicates.
const MAX_UNIQUE_FOR: Duration = Duration::from_secs(365 * 24 * 3600);

/// A queue's flow limits; all None for a plain Disbatch queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowLimits {
    pub rate: Option<RateLimit>,
    pub concurrency: Option<Concurrency>,
    pub unique: Option<Unique>,
}

impl FlowLimits {
    /// Whether claims must ask the database for a start or a key slot.
    pub fn limits_claims(&self) -> bool {
        self.rate.is_some() || self.concurrency.is_some()
    }
}

/// At most `starts` task starts in any `per` long stretch of time (a sliding window, exact:
/// never more, at the edges either), across all nodes; per value of `partition` when set.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimit {
    pub starts: u32,
    pub per: Duration,
    /// A task field path (`params.customer`): each of its values has its own budget.
    pub partition: Option<String>,
    /// Most partitions with starts in their window at once; a task of a further one waits.
    pub max_partitions: u32,
}

impl RateLimit {
    /// How long a node may hold starts granted ahead of its claims (`Grant::Starts::ahead`):
    /// an eighth of the period, at most half a second. Such starts are counted at the end of
    /// it, so every start they allow falls before the time the window counts it at.
    pub fn ahead_horizon(&self) -> Duration {
        (self.per / 8).min(Duration::from_millis(500))
    }

    /// Most starts one grant gives ahead: an eighth of the limit, so a few nodes' reserves
    /// never take what the others need.
    pub fn most_ahead(&self) -> u32 {
        (self.starts / 8).clamp(1, 1024)
    }
}

/// At most `max` running tasks per value of the task field `key`, across all nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Concurrency {
    pub key: String,
    pub max: u32,
    /// Tasks of one key start in the order they were queued (`_id` order); a task waiting
    /// for its retry keeps its place.
    pub ordered: bool,
}

/// Creating a task whose `key` value matches a task in one of `states`, or one created within
/// `window`, gives the existing task instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Unique {
    pub key: String,
    /// Task statuses (`model::status`) in which a task holds its key.
    pub states: Vec<i32>,
    pub window: Duration,
}

impl Unique {
    /// Whether a task of `status`, created `age` ago, still holds its key.
    pub fn holds(&self, status: Option<i32>, age: Option<Duration>) -> bool {
        status.is_some_and(|s| self.states.contains(&s))
            || age.is_some_and(|a| !self.window.is_zero() && a < self.window)
    }
}

/// The names `unique.states` takes, and the statuses each stands for.
pub const STATE_NAMES: [(&str, &[i32]); 8] = [
    ("queued", &[status::QUEUED]),
    ("running", &[status::CLAIMED, status::RUNNING]),
    ("succeeded", &[status::SUCCEEDED]),
    ("failed", &[status::FAILED]),
    ("cancelled", &[status::CANCELLED]),
    ("terminated", &[status::TERMINATED]),
    ("blocked", &[status::BLOCKED]),
    ("orphaned", &[status::ORPHANED]),
];

/// Reads the three limit fields of a queue document; Err names the field and what is wrong
/// (the queue is then skipped, as for a bad `threads`, and the API refuses to store it).
pub fn parse(d: &Document) -> Result<FlowLimits, String> {
    Ok(FlowLimits {
        rate: sub_document(d, RATE_LIMIT)?.map(parse_rate).transpose()?,
        concurrency: sub_document(d, CONCURRENCY)?
            .map(parse_concurrency)
            .transpose()?,
        unique: sub_document(d, UNIQUE)?.map(parse_unique).transpose()?,
    })
}

fn sub_document<'a>(d: &'a Document, field: &str) -> Result<Option<&'a Document>, String> {
    match d.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(sub)) => Ok(Some(sub)),
        Some(other) => Err(format!("{field} must be a document or null, found {other}")),
    }
}

fn parse_rate(d: &Document) -> Result<RateLimit, String> {
    only_fields(
        d,
        RATE_LIMIT,
        &["starts", "per_s", "partition", "max_partitions"],
    )?;
    let starts = whole(d, RATE_LIMIT, "starts", 1, u64::from(MAX_STARTS))?
        .ok_or("rate_limit.starts is required (most task starts per period)")?;
    let per_s = number(d, RATE_LIMIT, "per_s")?.ok_or("rate_limit.per_s is required")?;
    let per = seconds(per_s, "rate_limit.per_s", MAX_PERIOD)?;
    if per < Duration::from_millis(1) {
        return Err(format!(
            "rate_limit.per_s must be at least 0.001, found {per_s}"
        ));
    }
    let partition = path(d, RATE_LIMIT, "partition")?;
    let max_partitions = whole(
        d,
        RATE_LIMIT,
        "max_partitions",
        1,
        u64::from(MAX_PARTITIONS),
    )?
    .unwrap_or(u64::from(DEFAULT_MAX_PARTITIONS));
    Ok(RateLimit {
        starts: starts as u32,
        per,
        partition,
        max_partitions: max_partitions as u32,
    })
}

fn parse_concurrency(d: &Document) -> Result<Concurrency, String> {
    only_fields(d, CONCURRENCY, &["key", "max", "ordered"])?;
    let key = path(d, CONCURRENCY, "key")?.ok_or("concurrency.key is required (a task field)")?;
    let max = whole(d, CONCURRENCY, "max", 1, u64::from(MAX_PER_KEY))?.unwrap_or(1);
    let ordered = match d.get("ordered") {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(other) => {
            return Err(format!(
                "concurrency.ordered must be true or false, found {other}"
            ))
        }
    };
    Ok(Concurrency {
        key,
        max: max as u32,
        ordered,
    })
}

fn parse_unique(d: &Document) -> Result<Unique, String> {
    only_fields(d, UNIQUE, &["key", "states", "for_s"])?;
    let key = path(d, UNIQUE, "key")?.ok_or("unique.key is required (a task field)")?;
    let states = match d.get("states") {
        None | Some(Bson::Null) => vec!["queued".to_string(), "running".to_string()],
        Some(Bson::Array(a)) => a
            .iter()
            .map(|s| match s {
                Bson::String(s) => Ok(s.clone()),
                other => Err(format!("unique.states holds names, found {other}")),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(format!(
                "unique.states must be a list of names, found {other}"
            ))
        }
    };
    let mut codes = Vec::new();
    for name in &states {
        let Some((_, statuses)) = STATE_NAMES.iter().find(|(n, _)| n == name) else {
            let known: Vec<&str> = STATE_NAMES.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unique.states: unknown state {name:?} (known: {})",
                known.join(", ")
            ));
        };
        codes.extend_from_slice(statuses);
    }
    let window = match number(d, UNIQUE, "for_s")? {
        None => Duration::ZERO,
        Some(s) => seconds(s, "unique.for_s", MAX_UNIQUE_FOR)?,
    };
    if codes.is_empty() && window.is_zero() {
        return Err("unique: with no states and for_s 0 no task would ever hold its key".into());
    }
    Ok(Unique {
        key,
        states: codes,
        window,
    })
}

fn only_fields(d: &Document, field: &str, known: &[&str]) -> Result<(), String> {
    match d.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(format!(
            "{field}: unknown field {k:?} (known: {})",
            known.join(", ")
        )),
        None => Ok(()),
    }
}

fn number(d: &Document, field: &str, name: &str) -> Result<Option<f64>, String> {
    match d.get(name) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(n)) => Ok(Some(f64::from(*n))),
        Some(Bson::Int64(n)) => Ok(Some(*n as f64)),
        Some(Bson::Double(f)) if f.is_finite() => Ok(Some(*f)),
        Some(other) => Err(format!("{field}.{name} must be a number, found {other}")),
    }
}

fn whole(d: &Document, field: &str, name: &str, min: u64, max: u64) -> Result<Option<u64>, String> {
    let Some(n) = number(d, field, name)? else {
        return Ok(None);
    };
    if n.fract() != 0.0 || n < min as f64 || n > max as f64 {
        return Err(format!(
            "{field}.{name} must be a whole number from {min} to {max}, found {n}"
        ));
    }
    Ok(Some(n as u64))
}

fn seconds(s: f64, name: &str, max: Duration) -> Result<Duration, String> {
    if !(0.0..=max.as_secs_f64()).contains(&s) {
        return Err(format!(
            "{name} must be from 0 to {} seconds, found {s}",
            max.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(s))
}

/// A task field path: dotted names, none empty or starting with `$`.
fn path(d: &Document, field: &str, name: &str) -> Result<Option<String>, String> {
    match d.get(name) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::String(p))
            if !p.is_empty()
                && p.split('.').all(|s| !s.is_empty() && !s.starts_with('$'))
                && !p.contains('\0') =>
        {
            Ok(Some(p.clone()))
        }
        Some(other) => Err(format!(
            "{field}.{name} must be a task field path like \"params.account\", found {other}"
        )),
    }
}

/// A key's text for maps: its relaxed extended JSON, which tells types apart as an index
/// does not (1 and 1.0 are one key there): the index stays the judge, maps only plan.
pub fn key_text(key: &Bson) -> String {
    key.clone().into_relaxed_extjson().to_string()
}

/// The value a task has at `path` (dotted, through sub-documents), null when it has none.
/// Err when the value is an array or the path crosses one: one task would stand for several
/// keys, and an index would file it under each element.
pub fn key_value(task: &Document, path: &str) -> Result<Bson, String> {
    let mut at = Some(task);
    let mut value = Bson::Null;
    for name in path.split('.') {
        let Some(doc) = at else {
            return Ok(Bson::Null);
        };
        value = doc.get(name).cloned().unwrap_or(Bson::Null);
        at = match &value {
            Bson::Document(d) => Some(d),
            Bson::Array(_) => return Err(format!("the task's {path} is a list, not one key")),
            _ => None,
        };
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_plain_queue_has_no_limits() {
        let l = parse(&doc! {"name": "q"}).expect("parses");
        assert_eq!(l, FlowLimits::default());
        assert!(!l.limits_claims());
        assert_eq!(parse(&doc! {"rate_limit": null}), Ok(FlowLimits::default()));
    }

    #[test]
    fn the_three_limits_parse_with_their_defaults() {
        let l = parse(&doc! {
            "rate_limit": {"starts": 50, "per_s": 10, "partition": "params.customer"},
            "concurrency": {"key": "params.account", "max": 1, "ordered": true},
            "unique": {"key": "params.id"},
        })
        .expect("parses");
        let rate = l.rate.expect("rate");
        assert_eq!((rate.starts, rate.per), (50, Duration::from_secs(10)));
        assert_eq!(rate.partition.as_deref(), Some("params.customer"));
        assert_eq!(rate.max_partitions, DEFAULT_MAX_PARTITIONS);
        let c = l.concurrency.expect("concurrency");
        assert_eq!(
            (c.key.as_str(), c.max, c.ordered),
            ("params.account", 1, true)
        );
        let u = l.unique.expect("unique");
        assert_eq!(
            u.states,
            vec![status::QUEUED, status::CLAIMED, status::RUNNING]
        );
        assert_eq!(u.window, Duration::ZERO);
        let half = parse(&doc! {"rate_limit": {"starts": 3_i64, "per_s": 0.5}}).expect("parses");
        assert_eq!(half.rate.expect("rate").per, Duration::from_millis(500));
    }

    #[test]
    fn bad_limits_say_which_field_and_why() {
        let cases = [
            (doc! {"rate_limit": 5}, "rate_limit must be a document"),
            (
                doc! {"rate_limit": {"per_s": 1}},
                "rate_limit.starts is required",
            ),
            (doc! {"rate_limit": {"starts": 0, "per_s": 1}}, "from 1 to"),
            (
                doc! {"rate_limit": {"starts": 1.5, "per_s": 1}},
                "whole number",
            ),
            (doc! {"rate_limit": {"starts": 5}}, "per_s is required"),
            (doc! {"rate_limit": {"starts": 5, "per_s": -1}}, "from 0 to"),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": 0}},
                "at least 0.001",
            ),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": "10"}},
                "must be a number",
            ),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": 1, "burst": 3}},
                "unknown field \"burst\"",
            ),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": 1, "partition": ""}},
                "task field path",
            ),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": 1, "partition": "a..b"}},
                "task field path",
            ),
            (
                doc! {"rate_limit": {"starts": 5, "per_s": 1, "partition": "$x"}},
                "task field path",
            ),
            (
                doc! {"concurrency": {"max": 1}},
                "concurrency.key is required",
            ),
            (doc! {"concurrency": {"key": "k", "max": 0}}, "from 1 to"),
            (
                doc! {"concurrency": {"key": "k", "ordered": 1}},
                "true or false",
            ),
            (
                doc! {"unique": {"key": "k", "states": ["done"]}},
                "unknown state \"done\"",
            ),
            (
                doc! {"unique": {"key": "k", "states": "queued"}},
                "list of names",
            ),
            (
                doc! {"unique": {"key": "k", "states": []}},
                "would ever hold",
            ),
            (
                doc! {"unique": {"states": ["queued"]}},
                "unique.key is required",
            ),
        ];
        for (d, want) in cases {
            let err = parse(&d).expect_err("refused");
            assert!(err.contains(want), "{d}: {err}");
        }
        let window_only = parse(&doc! {"unique": {"key": "k", "states": [], "for_s": 60}});
        assert_eq!(
            window_only.expect("parses").unique.expect("unique").window,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_key_is_read_through_sub_documents() {
        let t = doc! {"params": {"account": "a1", "n": {"deep": 3}, "list": [1, 2]}, "key": "k"};
        assert_eq!(key_value(&t, "params.account"), Ok(Bson::from("a1")));
        assert_eq!(key_value(&t, "params.n.deep"), Ok(Bson::Int32(3)));
        assert_eq!(key_value(&t, "key"), Ok(Bson::from("k")));
        assert_eq!(key_value(&t, "params.missing"), Ok(Bson::Null));
        assert_eq!(key_value(&t, "params.account.below"), Ok(Bson::Null));
        assert_eq!(key_value(&t, "params.n"), Ok(Bson::from(doc! {"deep": 3})));
        assert!(key_value(&t, "params.list").is_err());
        assert!(key_value(&t, "params.list.0").is_err());
    }

    #[test]
    fn a_unique_task_holds_its_key_in_its_states_or_its_window() {
        let u = Unique {
            key: "k".into(),
            states: vec![status::QUEUED],
            window: Duration::from_secs(60),
        };
        assert!(u.holds(Some(status::QUEUED), None));
        assert!(u.holds(Some(status::SUCCEEDED), Some(Duration::from_secs(5))));
        assert!(!u.holds(Some(status::SUCCEEDED), Some(Duration::from_secs(61))));
        assert!(!u.holds(None, None));
        let no_window = Unique {
            window: Duration::ZERO,
            ..u
        };
        assert!(!no_window.holds(Some(status::FAILED), Some(Duration::ZERO)));
    }
}
