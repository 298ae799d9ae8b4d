//! QueueBalance, as Disbatch meant it: a total cap on tasks across named queues that depends on
//! the local day of week and time of day, shared out by priority tiers.
//!
//! Everything here is pure (no clock, no database) so the rules can be tested by hand; the DEN's
//! balancer reads the database, calls these and writes the result.
//!
//! Where this differs from Disbatch 4's `QueueBalance.pm`, on purpose:
//! - The `max_tasks` entry in force is the most recent one at or before now, across days and
//!   around the week. Disbatch's lookup fell back within the day or hour and wrapped there, so at
//!   Saturday 01:00 it picked Saturday 19:00's value instead of Friday 19:00's.
//! - Results are queue `threads` (what the DEN reads), not `maxthreads`.
//! - A tier's leftover goes to its queues in order, each up to its queued count, so no queue is
//!   given more than it can use; Disbatch gave it all to the first queue under its cap, past that
//!   cap. Capacity a tier cannot use is left to the higher tiers, as the tier budgets intend.

use std::collections::BTreeMap;
use std::fmt;

use bson::{Bson, Document};

use crate::balance::is_valid_slot_key;
use crate::schema::balance as field;

/// Minutes in a day and in a week, for the `max_tasks` schedule.
const DAY_MINUTES: u32 = 24 * 60;
const WEEK_MINUTES: u32 = 7 * DAY_MINUTES;

/// The health the balancer reports in the balance document (what `GET /monitoring` reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Ok,
    Warning,
    Critical,
}

impl Health {
    /// The Nagios-style word stored in the balance document's `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "OK",
            Health::Warning => "WARNING",
            Health::Critical => "CRITICAL",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses a `max_tasks` key `"D HH:MM"` into (day, minute of the day); day `None` is `*`
/// (every day). `None` when the key is not in that form.
pub fn parse_slot_key(key: &str) -> Option<(Option<u8>, u32)> {
    if !is_valid_slot_key(key) {
        return None;
    }
    let b = key.as_bytes();
    let digit = |i: usize| u32::from(b[i] - b'0');
    let day = (b[0] != b'*').then(|| b[0] - b'0');
    let minute = (digit(2) * 10 + digit(3)) * 60 + digit(5) * 10 + digit(6);
    Some((day, minute))
}

/// The `max_tasks` value in force at `now` = (weekday 0–6 with 0 = Sunday, hour, minute), local
/// time: the entry at or most recently before `now`, looking back across days and, before the
/// week's first entry, around to the end of the previous week. `*` entries apply to every day;
/// a specific day's entry wins over a `*` entry at the same time. Keys that are not `"D HH:MM"`
/// are ignored (the balancer refuses such documents before calling this). `None` when there is
/// no entry at all.
pub fn max_tasks_at(max_tasks: &BTreeMap<String, i64>, now: (u8, u8, u8)) -> Option<i64> {
    // Minute of the week -> (entry is for a specific day, value).
    let mut schedule: BTreeMap<u32, (bool, i64)> = BTreeMap::new();
    for (key, &value) in max_tasks {
        let Some((day, minute)) = parse_slot_key(key) else {
            continue;
        };
        match day {
            Some(d) => {
                schedule.insert(u32::from(d) * DAY_MINUTES + minute, (true, value));
            }
            None => {
                for d in 0..7 {
                    // Never replace a specific day's entry with the `*` one.
                    schedule
                        .entry(d * DAY_MINUTES + minute)
                        .or_insert((false, value));
                }
            }
        }
    }
    let (weekday, hour, minute) = now;
    let at = (u32::from(weekday) * DAY_MINUTES + u32::from(hour) * 60 + u32::from(minute))
        % WEEK_MINUTES;
    schedule
        .range(..=at)
        .next_back()
        // Nothing earlier this week: the last entry of the week is still in force.
        .or_else(|| schedule.iter().next_back())
        .map(|(_, &(_, value))| value)
}

/// One queue's current load, as the balancer counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueLoad {
    pub name: String,
    /// Tasks that could be claimed now (status -2).
    pub queued: i64,
    /// Tasks claimed or running (status -1 or 0).
    pub running: i64,
}

impl QueueLoad {
    pub fn new(name: impl Into<String>, queued: i64, running: i64) -> QueueLoad {
        QueueLoad {
            name: name.into(),
            queued,
            running,
        }
    }
}

/// Per-queue `threads` for a total of `max_tasks`, with `tiers[0]` the default (lowest) tier and
/// each later tier a higher priority:
///
/// 1. The default tier gives way to waiting higher-tier work: its budget is `max_tasks` less
///    the tasks queued in all higher tiers (never below 0).
/// 2. Every higher tier gets what the tiers before it do not hold: `max_tasks` less, for each
///    queue of an earlier tier, the larger of its running tasks and its new limit. Running
///    tasks are not stopped, so a tier that is over its new limit still occupies what it runs.
/// 3. Within a tier the budget is split evenly, each queue capped at its queued count (more
///    threads than work would only hold back capacity from other tiers until the next pass);
///    the remainder goes to the queues still under their cap, in tier order.
///
/// A queue named twice keeps its first limit. Negative inputs count as 0.
pub fn effective_threads(max_tasks: i64, tiers: &[Vec<QueueLoad>]) -> BTreeMap<String, i64> {
    let max_tasks = max_tasks.max(0);
    let waiting_above_default: i64 = tiers
        .iter()
        .skip(1)
        .flatten()
        .fold(0i64, |sum, q| sum.saturating_add(q.queued.max(0)));
    let default_budget = max_tasks - waiting_above_default.min(max_tasks);

    let mut limits = BTreeMap::new();
    // What the tiers already handled occupy: Σ max(running, limit).
    let mut occupied: i64 = 0;
    for (i, tier) in tiers.iter().enumerate() {
        let budget = if i == 0 {
            default_budget
        } else {
            max_tasks.saturating_sub(occupied).max(0)
        };
        let tier_limits = split_tier(budget, tier);
        for (q, limit) in tier.iter().zip(tier_limits) {
            occupied = occupied.saturating_add(q.running.max(0).max(limit));
            limits.entry(q.name.clone()).or_insert(limit);
        }
    }
    limits
}

/// Splits `budget` evenly over `tier`, each queue capped at its queued count; what is left (the
/// division's remainder, and shares that capped queues could not use) goes to the queues still
/// under their cap, first queue first.
fn split_tier(budget: i64, tier: &[QueueLoad]) -> Vec<i64> {
    let Ok(n) = i64::try_from(tier.len()) else {
        return vec![0; tier.len()];
    };
    if n == 0 {
        return Vec::new();
    }
    let budget = budget.max(0);
    let share = budget / n;
    let mut limits: Vec<i64> = tier.iter().map(|q| share.min(q.queued.max(0))).collect();
    let mut left = budget - limits.iter().sum::<i64>();
    for (limit, q) in limits.iter_mut().zip(tier) {
        if left == 0 {
            break;
        }
        let room = q.queued.max(0) - *limit;
        if room > 0 {
            let more = room.min(left);
            *limit += more;
            left -= more;
        }
    }
    limits
}

/// A calendar time at a fixed UTC offset, computed from a Unix time without a time-zone
/// library. Disbatch read `max_tasks` in the server's local time; the offset stands in for the
/// zone (it does not follow daylight-saving changes by itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalTime {
    pub year: i64,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
    /// 0 = Sunday … 6 = Saturday, as `max_tasks` keys number them.
    pub weekday: u8,
    pub utc_offset_secs: i32,
}

impl LocalTime {
    pub fn from_unix(unix_secs: i64, utc_offset_secs: i32) -> LocalTime {
        let local = unix_secs.saturating_add(i64::from(utc_offset_secs));
        let days = local.div_euclid(86_400);
        let secs = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        LocalTime {
            year,
            month,
            day,
            // All below are bounded by the rem_euclid above, so the narrowing is exact.
            hour: (secs / 3600) as u8,
            minute: (secs % 3600 / 60) as u8,
            second: (secs % 60) as u8,
            // 1970-01-01 (day 0) was a Thursday (4).
            weekday: (days + 4).rem_euclid(7) as u8,
            utc_offset_secs,
        }
    }

    /// (weekday, hour, minute): the argument `max_tasks_at` takes.
    pub fn week_time(&self) -> (u8, u8, u8) {
        (self.weekday, self.hour, self.minute)
    }
}

impl fmt::Display for LocalTime {
    /// `2024-05-03 19:00:00 +02:00`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.utc_offset_secs < 0 { '-' } else { '+' };
        let off = self.utc_offset_secs.unsigned_abs();
        write!(
            f,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} {sign}{:02}:{:02}",
            self.year,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            off / 3600,
            off % 3600 / 60
        )
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March = 0
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The balance document's settings, as the balancer needs them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BalancePlan {
    pub max_tasks: BTreeMap<String, i64>,
    /// Queue names by tier, tier 0 the default (lowest) priority.
    pub tiers: Vec<Vec<String>>,
    /// Epoch seconds until which balancing is off; `None` when not set.
    pub disabled: Option<i64>,
}

/// Reads the balance document (missing: nothing to balance yet). The error says what is wrong,
/// for a CRITICAL status: the DCI validates what it stores, so this catches direct edits.
pub fn parse_balance_document(doc: Option<&Document>) -> Result<BalancePlan, String> {
    let Some(doc) = doc else {
        return Ok(BalancePlan::default());
    };
    let max_tasks = match doc.get(field::MAX_TASKS) {
        Some(Bson::Document(m)) => {
            let mut out = BTreeMap::new();
            for (key, value) in m {
                if parse_slot_key(key).is_none() {
                    return Err(format!(
                        "max_tasks key {key:?} must look like \"* 07:00\" or \"1 19:30\""
                    ));
                }
                let n = whole_number(value)
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| format!("max_tasks {key:?} must be a non-negative integer"))?;
                out.insert(key.clone(), n);
            }
            out
        }
        None => return Err("the balance document has no max_tasks".into()),
        Some(_) => return Err("max_tasks must be an object".into()),
    };
    let tiers = match doc.get(field::QUEUES) {
        Some(Bson::Array(tiers)) => {
            let mut out: Vec<Vec<String>> = Vec::with_capacity(tiers.len());
            for tier in tiers {
                let Bson::Array(names) = tier else {
                    return Err("queues must be an array of arrays of queue names".into());
                };
                let mut tier_out = Vec::with_capacity(names.len());
                for name in names {
                    let Bson::String(name) = name else {
                        return Err(format!("queue names must be strings, found {name}"));
                    };
                    if out.iter().chain([&tier_out]).flatten().any(|n| n == name) {
                        return Err(format!("queue {name} appears more than once"));
                    }
                    tier_out.push(name.clone());
                }
                out.push(tier_out);
            }
            out
        }
        None => return Err("the balance document has no queues".into()),
        Some(_) => return Err("queues must be an array of arrays of queue names".into()),
    };
    let disabled = match doc.get(field::DISABLED) {
        None | Some(Bson::Null) => None,
        Some(Bson::DateTime(t)) => Some(t.timestamp_millis().div_euclid(1000)),
        Some(other) => Some(
            whole_number(other)
                .ok_or_else(|| "disabled must be null or epoch seconds".to_string())?,
        ),
    };
    Ok(BalancePlan {
        max_tasks,
        tiers,
        disabled,
    })
}

/// An integer however it was stored: Int32, Int64, a whole Double, or a string of digits (the
/// Perl web app could store any of them).
fn whole_number(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        Bson::Double(d) if d.fract() == 0.0 && d.abs() < 9.0e15 => Some(*d as i64),
        Bson::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        _ => None,
    }
}

/// A named queue as the balancer found it: its id, current `threads` and load.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueState {
    pub id: Bson,
    pub name: String,
    /// The stored `threads` (missing = 0); `None` when it is not a readable limit, so it is
    /// always rewritten.
    pub threads: Option<i64>,
    /// Paused queues (`paused_threads` set) keep `threads` 0 until resumed: the balancer does
    /// not write them and does not reserve capacity for their queued tasks.
    pub paused: bool,
    pub queued: i64,
    pub running: i64,
}

#[cfg(test)]
mod tests;
