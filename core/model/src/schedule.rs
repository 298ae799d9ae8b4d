//! Cron schedules on queues: reading and checking the `schedule*` fields, and which ticks one
//! pass of the maintenance leader enqueues, skips or folds into one under each missed policy.

use std::time::Duration;

use bson::{Bson, Document};
use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde_json::{Map, Value};

use crate::schema::queue;

/// The queue fields a client sets.
pub const FIELDS: [&str; 4] = [
    queue::SCHEDULE,
    queue::SCHEDULE_TZ,
    queue::SCHEDULE_PARAMS,
    queue::SCHEDULE_MISSED,
];
/// The leader's own fields: removed with the schedule, so one set again later starts afresh.
pub const LEADER_FIELDS: [&str; 2] = [queue::SCHEDULE_LAST, queue::SCHEDULE_BASIS];
/// The zone of a schedule without `schedule_tz`.
pub const DEFAULT_TZ: &str = "UTC";
/// A cron pattern is a line, not a document.
const MAX_PATTERN_LEN: usize = 256;
/// Missed ticks counted one by one at most (a year-long gap of a per-second schedule would
/// otherwise be walked tick by tick); a larger gap is reported as this many.
pub const MAX_COUNTED: u64 = 10_000;
/// Ticks one pass enqueues at most; the rest wait for the next pass.
const MAX_DUE: usize = 1_000;
/// The least grace, whatever the loop interval: a pass is rarely that late on a live leader.
const MIN_GRACE: Duration = Duration::from_secs(2);
/// In loop intervals: how late a tick may still be enqueued as on time (a leader pass runs
/// every interval; a few passes of slack for a slow database). Well below the maintenance
/// lease (15 intervals), so ticks a leader gap swallowed count as missed.
const GRACE_INTERVALS: u32 = 5;

/// How late a tick may be and still be enqueued as on time, for nodes passing every
/// `loop_interval`.
pub fn grace(loop_interval: Duration) -> Duration {
    (loop_interval * GRACE_INTERVALS).max(MIN_GRACE)
}

/// What becomes of ticks missed for longer than the grace (no leader, a paused database).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missed {
    /// None is enqueued: cron's own rule.
    #[default]
    Skip,
    /// One task, for the latest missed tick, stands in for all of them.
    Once,
}

impl Missed {
    pub fn parse(value: Option<&str>) -> Result<Missed, String> {
        match value {
            None | Some("skip") => Ok(Missed::Skip),
            Some("once") => Ok(Missed::Once),
            Some(other) => Err(format!(
                "{} must be \"skip\" or \"once\", found {other:?}",
                queue::SCHEDULE_MISSED
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Missed::Skip => "skip",
            Missed::Once => "once",
        }
    }
}

/// The longest a zone's clock is set back or forward at once (double summer time was 2 h):
/// how far around a time the search looks for wall times that repeat or do not exist.
const LONGEST_CLOCK_CHANGE: chrono::TimeDelta = chrono::TimeDelta::hours(3);

/// A queue's schedule, checked.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    pattern: String,
    /// Its minute or hour field is a wildcard (`*`, `*/5`): it follows real time across a
    /// clock change, as Vixie cron's wildcard jobs do. Otherwise it names fixed wall times.
    follows_real_time: bool,
    pub tz: Tz,
    pub missed: Missed,
    /// The params of every task it makes.
    pub params: Document,
}

/// A tick to enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub tick: DateTime<Utc>,
    /// For the one task of `Missed::Once`: how many missed ticks it stands for, itself included.
    pub missed: Option<u64>,
}

/// A schedule's next tick as shown to people: `2026-12-08T03:30:00Z`, and the same instant on
/// the zone's wall clock with its offset (`2026-12-08T09:00:00+05:30`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextTick {
    pub utc: String,
    pub local: String,
    pub zone: String,
}

/// What one pass owes a schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Oldest first.
    pub due: Vec<Due>,
    /// Missed ticks the policy drops (at most `MAX_COUNTED` per gap).
    pub skipped: u64,
    /// The newest tick the plan settles: `schedule_last` moves to it once `due` is enqueued.
    /// None when no tick fell since the last one settled.
    pub through: Option<DateTime<Utc>>,
}

impl Schedule {
    /// Parses and checks a schedule: a cron pattern of 5 fields, or 6 with seconds first
    /// (`@hourly` and the other nicknames too), an IANA zone, and a missed-tick policy. A
    /// pattern that never fires (`0 0 30 2 *`) is refused too.
    pub fn new(
        pattern: &str,
        tz: Option<&str>,
        missed: Option<&str>,
        params: Document,
    ) -> Result<Schedule, String> {
        let field = queue::SCHEDULE;
        if pattern.trim().is_empty() {
            return Err(format!(
                "{field} must be a cron pattern, found an empty text"
            ));
        }
        if pattern.len() > MAX_PATTERN_LEN {
            return Err(format!(
                "{field} is {} bytes long; a cron pattern has at most {MAX_PATTERN_LEN}",
                pattern.len()
            ));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|e| format!("{field}: {pattern:?} is not a cron pattern: {e}"))?;
        let tz_name = tz.unwrap_or(DEFAULT_TZ);
        let tz: Tz = tz_name.parse().map_err(|_| {
            format!(
                "{}: unknown time zone {tz_name:?} (an IANA name such as UTC or America/New_York)",
                queue::SCHEDULE_TZ
            )
        })?;
        let schedule = Schedule {
            cron,
            follows_real_time: follows_real_time(pattern),
            pattern: pattern.to_string(),
            tz,
            missed: Missed::parse(missed)?,
            params,
        };
        let now = from_bson(crate::fleet_time::now()).unwrap_or_else(Utc::now);
        if schedule.next_after(now)?.is_none() {
            return Err(format!(
                "{field}: {pattern:?} never fires (no matching time within a year)"
            ));
        }
        Ok(schedule)
    }

    /// What the leader's `schedule_last` counts from: a change of pattern, zone or policy
    /// starts the schedule afresh, as a new one, from the moment the leader sees it.
    pub fn basis(&self) -> String {
        format!(
            "{} | {} | {}",
            self.pattern.trim(),
            self.tz.name(),
            self.missed.as_str()
        )
    }

    /// The first tick after `t`; None when there is none within croner's search (a year).
    ///
    /// The pattern is matched on the zone's wall clock (croner searches the calendar in UTC,
    /// which has no clock changes), and each wall time it names becomes instants by one rule,
    /// Vixie cron's:
    /// - a wall time that happens twice (the clock set back): a schedule that follows real
    ///   time (`*` in its minute or hour) ticks at both; one of fixed times ticks once, at
    ///   the first;
    /// - a wall time that does not happen (the clock set forward): a schedule that follows
    ///   real time has no tick then; one of fixed times ticks once, at the change.
    pub fn next_after(&self, t: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, String> {
        let t = whole_seconds(t);
        // After the clock is set back, a wall time before `t`'s may still tick after `t` (the
        // second time it happens): the search starts from `t` on the smallest offset near.
        let (least, _) = self.offsets_near(t);
        let Some(mut wall) = t.naive_utc().checked_add_signed(least) else {
            return Ok(None);
        };
        let mut best: Option<DateTime<Utc>> = None;
        while let Some(next) = self.next_wall_time(wall)? {
            wall = next;
            let Some((first, second)) = self.instants(wall) else {
                continue;
            };
            // A wall time's first instant grows with the wall time: none later is earlier.
            if best.is_some_and(|b| first >= b) {
                break;
            }
            for i in [Some(first), second].into_iter().flatten() {
                if i > t && best.is_none_or(|b| i < b) {
                    best = Some(i);
                }
            }
        }
        Ok(best)
    }

    /// The least and the greatest of the zone's offsets within `LONGEST_CLOCK_CHANGE` of `t`
    /// (the same away from a clock change).
    fn offsets_near(&self, t: DateTime<Utc>) -> (chrono::TimeDelta, chrono::TimeDelta) {
        // At the ends of chrono's range, `t` itself stands in.
        let before = t.checked_sub_signed(LONGEST_CLOCK_CHANGE).unwrap_or(t);
        let after = t.checked_add_signed(LONGEST_CLOCK_CHANGE).unwrap_or(t);
        let offsets = [before, t, after].map(|at| {
            let seconds = self
                .tz
                .offset_from_utc_datetime(&at.naive_utc())
                .fix()
                .local_minus_utc();
            chrono::TimeDelta::seconds(i64::from(seconds))
        });
        let least = offsets.iter().min().copied().unwrap_or_default();
        let most = offsets.iter().max().copied().unwrap_or_default();
        (least, most)
    }

    /// The first wall time after `wall` the pattern names (on a calendar without clock
    /// changes); None past croner's search.
    fn next_wall_time(&self, wall: NaiveDateTime) -> Result<Option<NaiveDateTime>, String> {
        match self.cron.find_next_occurrence(&wall.and_utc(), false) {
            Ok(next) => Ok(Some(next.naive_utc())),
            Err(CronError::TimeSearchLimitExceeded) => Ok(None),
            Err(e) => Err(format!("{}: {e}", queue::SCHEDULE)),
        }
    }

    fn previous_wall_time(&self, wall: NaiveDateTime) -> Result<Option<NaiveDateTime>, String> {
        match self.cron.find_previous_occurrence(&wall.and_utc(), false) {
            Ok(prev) => Ok(Some(prev.naive_utc())),
            Err(CronError::TimeSearchLimitExceeded) => Ok(None),
            Err(e) => Err(format!("{}: {e}", queue::SCHEDULE)),
        }
    }

    /// The instants a wall time ticks at, by the rule of `next_after`: the first, and the
    /// second where it happens twice and the schedule follows real time. None: no tick.
    fn instants(&self, wall: NaiveDateTime) -> Option<(DateTime<Utc>, Option<DateTime<Utc>>)> {
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(i) => Some((i.with_timezone(&Utc), None)),
            LocalResult::Ambiguous(first, second) => Some((
                first.with_timezone(&Utc),
                self.follows_real_time.then(|| second.with_timezone(&Utc)),
            )),
            LocalResult::None if self.follows_real_time => None,
            LocalResult::None => self.clock_set_forward_at(wall).map(|i| (i, None)),
        }
    }

    /// The instant the clock was set forward over `wall` (a wall time that does not happen):
    /// the first wall minute after it that does.
    fn clock_set_forward_at(&self, wall: NaiveDateTime) -> Option<DateTime<Utc>> {
        let minute = wall.date().and_time(chrono::NaiveTime::from_hms_opt(
            chrono::Timelike::hour(&wall),
            chrono::Timelike::minute(&wall),
            0,
        )?);
        (1..=24 * 60).find_map(|m| {
            self.tz
                .from_local_datetime(&minute.checked_add_signed(chrono::TimeDelta::minutes(m))?)
                .earliest()
                .map(|i| i.with_timezone(&Utc))
        })
    }

    /// The next tick after `now` (the fleet's time), for people: in UTC and in the schedule's
    /// zone. None when there is none within croner's search (a year).
    pub fn next_shown(&self, now: bson::DateTime) -> Result<Option<NextTick>, String> {
        let Some(now) = from_bson(now) else {
            return Ok(None);
        };
        Ok(self.next_after(now)?.map(|tick| NextTick {
            utc: tick.to_rfc3339_opts(SecondsFormat::Secs, true),
            local: tick
                .with_timezone(&self.tz)
                .to_rfc3339_opts(SecondsFormat::Secs, false),
            zone: self.tz.name().to_string(),
        }))
    }

    /// The last tick before `t`, by `next_after`'s rule, searched backwards.
    fn last_before(&self, t: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, String> {
        let t = whole_seconds(t);
        let (_, most) = self.offsets_near(t);
        let Some(mut wall) = t.naive_utc().checked_add_signed(most) else {
            return Ok(None);
        };
        let mut best: Option<DateTime<Utc>> = None;
        while let Some(prev) = self.previous_wall_time(wall)? {
            wall = prev;
            let Some((first, second)) = self.instants(wall) else {
                continue;
            };
            // A wall time's last instant shrinks with the wall time: none earlier is later.
            if best.is_some_and(|b| second.unwrap_or(first) <= b) {
                break;
            }
            for i in [Some(first), second].into_iter().flatten() {
                if i < t && best.is_none_or(|b| i > b) {
                    best = Some(i);
                }
            }
        }
        Ok(best)
    }

    /// The ticks in (`last`, `now`]: those within `grace` of now are each due; older ones were
    /// missed, and are skipped or (`Missed::Once`) folded into one task for the latest of them.
    pub fn plan(
        &self,
        last: DateTime<Utc>,
        now: DateTime<Utc>,
        grace: Duration,
    ) -> Result<Plan, String> {
        let (last, now) = (whole_seconds(last), whole_seconds(now));
        let mut plan = Plan::default();
        if last >= now {
            return Ok(plan);
        }
        // In whole seconds, rounded up, as ticks are; a grace beyond chrono's range misses none.
        let grace = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let cutoff = i64::try_from(grace)
            .ok()
            .and_then(chrono::TimeDelta::try_seconds)
            .and_then(|g| now.checked_sub_signed(g))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let mut next = self.next_after(last)?;
        if let Some(first) = next.filter(|t| *t < cutoff) {
            let (count, latest) = self.count_missed(first, cutoff)?;
            match self.missed {
                Missed::Skip => plan.skipped = count,
                Missed::Once => {
                    plan.due.push(Due {
                        tick: latest,
                        missed: Some(count),
                    });
                    plan.skipped = count - 1;
                }
            }
            plan.through = Some(latest);
            next = self.next_after(latest)?;
        }
        while let Some(tick) = next.filter(|t| *t <= now) {
            if plan.due.len() >= MAX_DUE {
                break;
            }
            plan.due.push(Due { tick, missed: None });
            plan.through = Some(tick);
            next = self.next_after(tick)?;
        }
        Ok(plan)
    }

    /// How many ticks from `first` fall before `cutoff` (at most `MAX_COUNTED`), and the latest.
    fn count_missed(
        &self,
        first: DateTime<Utc>,
        cutoff: DateTime<Utc>,
    ) -> Result<(u64, DateTime<Utc>), String> {
        let (mut count, mut latest) = (1, first);
        while count < MAX_COUNTED {
            match self.next_after(latest)? {
                Some(t) if t < cutoff => {
                    count += 1;
                    latest = t;
                }
                _ => return Ok((count, latest)),
            }
        }
        // Too many to walk: the latest is found from the other end.
        Ok((count, self.last_before(cutoff)?.unwrap_or(latest)))
    }
}

/// Vixie cron's test: a pattern whose minute or hour field starts with `*` follows real time
/// across clock changes. Of the nicknames only `@hourly` (`0 * * * *`) does.
fn follows_real_time(pattern: &str) -> bool {
    let pattern = pattern.trim();
    if let Some(nickname) = pattern.strip_prefix('@') {
        return nickname.eq_ignore_ascii_case("hourly");
    }
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    // Six fields: seconds first.
    let skip = usize::from(fields.len() >= 6);
    fields.iter().skip(skip).take(2).any(|f| f.starts_with('*'))
}

fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    Utc.timestamp_opt(t.timestamp(), 0).single().unwrap_or(t)
}

/// A date as stored (`bson`), as chrono's; None beyond chrono's range.
pub fn from_bson(d: bson::DateTime) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(d.timestamp_millis()).single()
}

pub fn to_bson(t: DateTime<Utc>) -> bson::DateTime {
    bson::DateTime::from_millis(t.timestamp_millis())
}

/// The queue document's schedule: None without one, Err with what is wrong with it.
pub fn read(d: &Document) -> Option<Result<Schedule, String>> {
    let pattern = match d.get(queue::SCHEDULE) {
        None | Some(Bson::Null) => return None,
        Some(Bson::String(s)) => s,
        Some(other) => {
            return Some(Err(format!(
                "{} must be a cron pattern (a string), found {other}",
                queue::SCHEDULE
            )))
        }
    };
    Some(read_rest(d).and_then(|(tz, missed, params)| {
        Schedule::new(pattern, tz.as_deref(), missed.as_deref(), params)
    }))
}

type Rest = (Option<String>, Option<String>, Document);

fn read_rest(d: &Document) -> Result<Rest, String> {
    let text = |key: &str| match d.get(key) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{key} must be a string, found {other}")),
    };
    let params = match d.get(queue::SCHEDULE_PARAMS) {
        None | Some(Bson::Null) => Document::new(),
        Some(Bson::Document(p)) => p.clone(),
        Some(other) => {
            return Err(format!(
                "{} must be an object, found {other}",
                queue::SCHEDULE_PARAMS
            ))
        }
    };
    Ok((
        text(queue::SCHEDULE_TZ)?,
        text(queue::SCHEDULE_MISSED)?,
        params,
    ))
}

/// Checks the schedule fields a client is about to write, each that is present (an update
/// may set the zone alone): the reader the leader uses must accept them.
pub fn check(d: &Document) -> Result<(), String> {
    let (tz, missed, _) = read_rest(d)?;
    if let Some(tz) = &tz {
        tz.parse::<Tz>().map_err(|_| {
            format!(
                "{}: unknown time zone {tz:?} (an IANA name such as UTC or America/New_York)",
                queue::SCHEDULE_TZ
            )
        })?;
    }
    Missed::parse(missed.as_deref())?;
    match read(d) {
        Some(Err(e)) => Err(e),
        _ => Ok(()),
    }
}

/// A work spec's schedule keys as queue fields: those to set, and those to remove (the spec
/// does not set them; without a schedule, the leader's fields go too).
pub fn spec_fields(spec: &Map<String, Value>) -> Result<(Document, Vec<&'static str>), String> {
    let mut set = Document::new();
    let mut unset = Vec::new();
    for key in FIELDS {
        let value = match spec.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) if key != queue::SCHEDULE_PARAMS => {
                Some(Bson::String(s.clone()))
            }
            Some(v @ Value::Object(_)) if key == queue::SCHEDULE_PARAMS => {
                Some(crate::text::client_json::storable(v, key)?)
            }
            Some(other) if key == queue::SCHEDULE_PARAMS => {
                return Err(format!("{key} must be an object, found {other}"))
            }
            Some(other) => return Err(format!("{key} must be a string, found {other}")),
        };
        match value {
            Some(v) => {
                set.insert(key, v);
            }
            None => unset.push(key),
        }
    }
    if !set.contains_key(queue::SCHEDULE) {
        unset.extend(LEADER_FIELDS);
    }
    check(&set)?;
    Ok((set, unset))
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
