//! The fleet's time: the database server's clock as this process knows it. Every time that
//! another host judges (heartbeats, leases, leadership, `not_before`, cron ticks, `mtime`)
//! comes from here, so one host's wrong clock cannot make the others look dead or their
//! leases passed.
//!
//! Where each kind of time comes from:
//! - [`now`]: a time written to the database, or compared with one another host wrote. It is
//!   the server's `localTime` at the last reading ([`Store::keep_clock`]), plus the time since
//!   on this host's boot clock (`CLOCK_BOOTTIME`: it never steps with the wall clock, and it
//!   counts a suspend, which `Instant` does not). A task runner takes its node's reading with
//!   its handoff, so it needs no round trip of its own.
//! - `std::time::Instant`: a local duration (pass intervals, timeouts, backoff), which no other
//!   host judges.
//! - The host's wall clock: only to report how far off it is ([`offset_ms`]), never to decide.
//!   Before the first reading (a process that could not reach the server yet) [`now`] is the
//!   wall clock, the best there is.
//!
//! [`Store::keep_clock`]: crate::store::Store::keep_clock

use std::sync::RwLock;
use std::time::Duration;

use bson::DateTime;

/// Past this, a host's clock counts as off: it is logged (once, and again when it is back
/// within), and such a node leaves the maintenance lead to a node whose clock is not off.
/// Far above what a round trip to the server blurs a reading by, far below any lease.
pub const SKEW_BOUND: Duration = Duration::from_secs(2);

/// A host wall clock that moved this far against the server's time since the last reading
/// (stepped by NTP or by hand, or the host resumed) makes the next reading due at once, so
/// the offset reported follows it within a pass. The server's time itself does not need it:
/// it runs on the boot clock, which no step moves.
const WALL_STEP_MS: i64 = 250;

/// A reading whose round trip took longer than this is blurred by up to half of it: while
/// the last good reading is younger than `KEEP_GOOD_READING`, it is not replaced by one.
const SLOW_READING: Duration = Duration::from_millis(500);
const KEEP_GOOD_READING: Duration = Duration::from_secs(60);

/// The server's time pinned to this host's boot clock: what a node hands its runners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// The server's time, in ms since the epoch ...
    pub server_ms: i64,
    /// ... when this host's boot clock read this many ns.
    pub boot_ns: i64,
}

impl Anchor {
    /// The server's time when the boot clock reads `boot_ns`.
    pub fn at(&self, boot_ns: i64) -> DateTime {
        let elapsed_ms = boot_ns.saturating_sub(self.boot_ns) / 1_000_000;
        DateTime::from_millis(self.server_ms.saturating_add(elapsed_ms))
    }
}

/// One reading of the server's clock, between two readings of this host's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The boot clock when the request left and when the answer came.
    pub sent_boot_ns: i64,
    pub received_boot_ns: i64,
    /// The server's time in its answer.
    pub server: DateTime,
    /// This host's wall clock when the answer came (ms since the epoch).
    pub received_wall_ms: i64,
}

impl Reading {
    fn round_trip_ns(&self) -> i64 {
        self.received_boot_ns
            .saturating_sub(self.sent_boot_ns)
            .max(0)
    }

    /// The server answered, at best guess, halfway through the round trip.
    fn anchor(&self) -> Anchor {
        Anchor {
            server_ms: self.server.timestamp_millis(),
            boot_ns: self.sent_boot_ns.saturating_add(self.round_trip_ns() / 2),
        }
    }
}

/// What a reading changed about this host's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Unchanged,
    /// The host's clock went off by more than `SKEW_BOUND`.
    WentOff,
    /// It is back within `SKEW_BOUND`.
    CameBack,
}

/// The process's knowledge of the server's clock (one per process, in [`CLOCK`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Clock {
    anchor: Option<Anchor>,
    round_trip_ns: i64,
    /// This host's wall clock minus the server's, in ms, at the last reading.
    offset_ms: Option<i64>,
    off: bool,
}

impl Clock {
    pub const fn new() -> Clock {
        Clock {
            anchor: None,
            round_trip_ns: 0,
            offset_ms: None,
            off: false,
        }
    }

    /// The server's time at boot clock `boot_ns`; the wall clock `wall_ms` before any reading.
    pub fn now_at(&self, boot_ns: i64, wall_ms: i64) -> DateTime {
        match &self.anchor {
            Some(a) => a.at(boot_ns),
            None => DateTime::from_millis(wall_ms),
        }
    }

    pub fn anchor(&self) -> Option<Anchor> {
        self.anchor
    }

    /// This host's wall clock minus the server's, in ms (positive: the host is ahead).
    pub fn offset_ms(&self) -> Option<i64> {
        self.offset_ms
    }

    /// Whether the offset is past `SKEW_BOUND`.
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// Takes a reading, unless it is much blurrier than a recent good one.
    pub fn observe(&mut self, r: Reading) -> Standing {
        let rtt = r.round_trip_ns();
        if let Some(last) = self.anchor {
            let slow = rtt > nanos(SLOW_READING) && rtt > self.round_trip_ns.saturating_mul(2);
            let recent = r.received_boot_ns.saturating_sub(last.boot_ns) < nanos(KEEP_GOOD_READING);
            if slow && recent {
                return Standing::Unchanged;
            }
        }
        let anchor = r.anchor();
        self.round_trip_ns = rtt;
        let wall_then = r
            .received_wall_ms
            .saturating_sub(r.received_boot_ns.saturating_sub(anchor.boot_ns) / 1_000_000);
        self.set(anchor, wall_then.saturating_sub(anchor.server_ms))
    }

    /// Takes another process's anchor (a node's, handed to its runner on the same host):
    /// `boot_ns` and `wall_ms` are this host's clocks now, for the offset.
    pub fn adopt(&mut self, anchor: Anchor, boot_ns: i64, wall_ms: i64) -> Standing {
        let offset = wall_ms.saturating_sub(anchor.at(boot_ns).timestamp_millis());
        self.round_trip_ns = 0;
        self.set(anchor, offset)
    }

    fn set(&mut self, anchor: Anchor, offset_ms: i64) -> Standing {
        self.anchor = Some(anchor);
        self.offset_ms = Some(offset_ms);
        let bound = i64::try_from(SKEW_BOUND.as_millis()).unwrap_or(i64::MAX);
        let off = offset_ms.saturating_abs() > bound;
        let was = std::mem::replace(&mut self.off, off);
        match (was, off) {
            (false, true) => Standing::WentOff,
            (true, false) => Standing::CameBack,
            _ => Standing::Unchanged,
        }
    }

    /// How long ago, on the boot clock, the anchor was taken (None: never).
    pub fn age(&self, boot_ns: i64) -> Option<Duration> {
        self.anchor.map(|a| {
            Duration::from_nanos(u64::try_from(boot_ns.saturating_sub(a.boot_ns)).unwrap_or(0))
        })
    }

    /// Whether a new reading is due: none yet, the last is `max_age` old, or the host's wall
    /// clock (`wall_ms` now) moved by more than `WALL_STEP_MS` against the server's time
    /// since it (a step, which a reading then reports).
    pub fn reading_due(&self, max_age: Duration, boot_ns: i64, wall_ms: i64) -> bool {
        let (Some(age), Some(offset)) = (self.age(boot_ns), self.offset_ms) else {
            return true;
        };
        let offset_now = wall_ms.saturating_sub(self.now_at(boot_ns, wall_ms).timestamp_millis());
        age >= max_age || offset_now.saturating_sub(offset).saturating_abs() > WALL_STEP_MS
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// The process's clock: a node, its runners and the DCI each keep one.
static CLOCK: RwLock<Clock> = RwLock::new(Clock::new());

fn read<T>(f: impl FnOnce(&Clock) -> T) -> T {
    // A panic while holding the lock leaves a whole `Clock` behind: still usable.
    f(&CLOCK.read().unwrap_or_else(|e| e.into_inner()))
}

fn write<T>(f: impl FnOnce(&mut Clock) -> T) -> T {
    f(&mut CLOCK.write().unwrap_or_else(|e| e.into_inner()))
}

/// The fleet's time now: the server's clock, as this process last read it.
pub fn now() -> DateTime {
    let boot = boot_ns();
    read(|c| c.now_at(boot, DateTime::now().timestamp_millis()))
}

/// The fleet's time `d` from now.
pub fn after(d: Duration) -> DateTime {
    shifted(now(), millis(d))
}

/// The fleet's time `d` ago.
pub fn ago(d: Duration) -> DateTime {
    shifted(now(), -millis(d))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn shifted(t: DateTime, ms: i64) -> DateTime {
    DateTime::from_millis(t.timestamp_millis().saturating_add(ms))
}

/// What to hand a runner: the last reading, pinned to this host's boot clock.
pub fn anchor() -> Option<Anchor> {
    read(Clock::anchor)
}

/// This host's wall clock minus the server's, in ms, at the last reading (None: none yet).
pub fn offset_ms() -> Option<i64> {
    read(Clock::offset_ms)
}

/// Whether this host's clock is off by more than `SKEW_BOUND`.
pub fn is_off() -> bool {
    read(Clock::is_off)
}

/// Whether a reading is due: none yet, the last one `max_age` old, or the host's wall clock
/// stepped since (`Clock::reading_due`).
pub fn reading_due(max_age: Duration) -> bool {
    let (boot, wall) = (boot_ns(), DateTime::now().timestamp_millis());
    read(|c| c.reading_due(max_age, boot, wall))
}

/// Takes a reading of the server's clock, and logs when this host's clock goes off or back.
pub fn observe(r: Reading) {
    let standing = write(|c| c.observe(r));
    report(standing);
}

/// Takes the anchor a node handed this runner. Quietly: the node has said already whether
/// the host's clock is off, and a line from each runner would only repeat it.
pub fn adopt(anchor: Anchor) {
    let (boot, wall) = (boot_ns(), DateTime::now().timestamp_millis());
    write(|c| c.adopt(anchor, boot, wall));
}

fn report(standing: Standing) {
    let offset_ms = offset_ms().unwrap_or(0);
    let offset_s = offset_ms as f64 / 1000.0;
    match standing {
        Standing::WentOff => tracing::warn!(
            offset_s,
            bound_s = SKEW_BOUND.as_secs(),
            "this host's clock is off from the database server's by {offset_s:+.3} s (host minus server); \
             every time other hosts judge is taken from the server's clock, but a node whose clock \
             is off does not lead the fleet's maintenance while another node's is not: fix its time sync"
        ),
        Standing::CameBack => tracing::info!(
            offset_s,
            "this host's clock is back within {} s of the database server's",
            SKEW_BOUND.as_secs()
        ),
        Standing::Unchanged => {}
    }
}

/// This host's boot clock, in ns: `CLOCK_BOOTTIME`, which counts a suspend and never steps.
/// Where it cannot be read, the monotonic clock (`Instant`'s) since the first call.
pub fn boot_ns() -> i64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) {
        Ok(t) => t
            .tv_sec()
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec()),
        Err(_) => {
            static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            nanos(START.get_or_init(std::time::Instant::now).elapsed())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn reading(sent_s: i64, rtt_ms: i64, server_ms: i64, wall_ms: i64) -> Reading {
        Reading {
            sent_boot_ns: sent_s * S,
            received_boot_ns: sent_s * S + rtt_ms * 1_000_000,
            server: DateTime::from_millis(server_ms),
            received_wall_ms: wall_ms,
        }
    }

    #[test]
    fn before_any_reading_the_wall_clock_is_the_best_there_is() {
        let c = Clock::new();
        assert_eq!(c.now_at(5 * S, 1_000).timestamp_millis(), 1_000);
        assert_eq!(c.offset_ms(), None);
        assert!(!c.is_off());
    }

    #[test]
    fn the_servers_time_runs_on_the_boot_clock_whatever_the_wall_clock_does() {
        let mut c = Clock::new();
        // Sent at boot 10 s, answered in 20 ms: the server said 1 000 000 at boot 10.010 s.
        c.observe(reading(10, 20, 1_000_000, 1_090_020));
        assert_eq!(
            c.now_at(10 * S + 10_000_000, 0).timestamp_millis(),
            1_000_000
        );
        // 5 s later on the boot clock, whatever the wall clock says then.
        assert_eq!(
            c.now_at(15 * S + 10_000_000, -77).timestamp_millis(),
            1_005_000
        );
        // The host's wall clock read 1 090 010 when the server read 1 000 000: 90 s ahead.
        assert_eq!(c.offset_ms(), Some(90_010));
        assert!(c.is_off());
    }

    #[test]
    fn going_off_and_coming_back_are_reported_once_each() {
        let mut c = Clock::new();
        assert_eq!(c.observe(reading(1, 0, 1_000, 1_500)), Standing::Unchanged);
        assert_eq!(
            c.observe(reading(2, 0, 2_000, 2_000 - 2_001)),
            Standing::WentOff
        );
        assert_eq!(
            c.observe(reading(3, 0, 3_000, 3_000 - 90_000)),
            Standing::Unchanged
        );
        assert_eq!(c.offset_ms(), Some(-90_000));
        assert_eq!(
            c.observe(reading(4, 0, 4_000, 4_000 + 2_000)),
            Standing::CameBack
        );
        assert!(!c.is_off(), "2 s exactly is within the bound");
    }

    #[test]
    fn a_slow_reading_does_not_replace_a_recent_good_one_but_an_old_one() {
        let mut c = Clock::new();
        c.observe(reading(10, 4, 100_000, 100_002));
        // 3 s later, an answer that took 2 s: its server time is blurred by up to 1 s.
        c.observe(reading(13, 2_000, 104_500, 104_000));
        assert_eq!(c.now_at(13 * S + 2 * S, 0).timestamp_millis(), 105_000 - 2);
        assert_eq!(c.offset_ms(), Some(0));
        // A minute on, it is the best there is.
        c.observe(reading(80, 2_000, 171_000, 171_000));
        assert_eq!(c.anchor().map(|a| a.boot_ns), Some(81 * S));
        assert_eq!(c.now_at(81 * S, 0).timestamp_millis(), 171_000);
    }

    #[test]
    fn a_runner_takes_its_nodes_anchor_and_measures_its_own_offset_from_it() {
        let mut c = Clock::new();
        let anchor = Anchor {
            server_ms: 50_000,
            boot_ns: 7 * S,
        };
        // 3 s after the node's reading, on a host whose wall clock is 10 min behind.
        let standing = c.adopt(anchor, 10 * S, 53_000 - 600_000);
        assert_eq!(standing, Standing::WentOff);
        assert_eq!(c.offset_ms(), Some(-600_000));
        assert_eq!(c.now_at(10 * S, 0).timestamp_millis(), 53_000);
    }

    #[test]
    fn a_reading_is_due_by_age_or_at_once_when_the_wall_clock_steps() {
        let mut c = Clock::new();
        assert!(c.reading_due(Duration::from_secs(10), S, 0), "none yet");
        // At boot 10 s the server read 100 000 and the wall clock 100 000.
        c.observe(reading(10, 0, 100_000, 100_000));
        let wall_then = |boot_s: i64| 100_000 + (boot_s - 10) * 1_000;
        let ten = Duration::from_secs(10);
        assert!(!c.reading_due(ten, 15 * S, wall_then(15)));
        assert!(c.reading_due(ten, 20 * S, wall_then(20)), "10 s old");
        // The wall clock runs 0.2 s off: within the step; 90 s off: due at once.
        assert!(!c.reading_due(ten, 15 * S, wall_then(15) + 200));
        assert!(c.reading_due(ten, 15 * S, wall_then(15) + 90_000));
        assert!(c.reading_due(ten, 15 * S, wall_then(15) - 90_000));
    }

    #[test]
    fn the_boot_clock_moves_forward() {
        let a = boot_ns();
        std::thread::sleep(Duration::from_millis(2));
        assert!(boot_ns() > a);
    }
}
