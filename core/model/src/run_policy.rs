//! How a queue's tasks run and end when things go wrong: lease length, what happens to a
//! task whose lease ran out (`on_lost`), the run time limit and the kill grace period.

use std::time::Duration;

/// Disbatch has no lease; ours defaults to 30 s, renewed every third of that.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Shortest lease accepted: renewals every third of it must fit in a few round trips.
pub const MIN_LEASE: Duration = Duration::from_secs(3);
/// Between SIGTERM and SIGKILL when a plugin is stopped (timeout, cancel, lost lease).
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Anything beyond a year is a typo, not a limit.
const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// What recovery does with a running task whose lease has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnLost {
    /// Status -6, Disbatch's orphan: an operator decides.
    #[default]
    Orphan,
    /// Back to queued while `max_retries` allows, else orphaned.
    Requeue,
}

impl OnLost {
    pub fn parse(value: Option<&str>) -> Result<OnLost, String> {
        match value {
            None | Some("") | Some("orphan") => Ok(OnLost::Orphan),
            Some("requeue") => Ok(OnLost::Requeue),
            Some(other) => Err(format!(
                "on_lost must be \"orphan\" or \"requeue\", found {other:?}"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OnLost::Orphan => "orphan",
            OnLost::Requeue => "requeue",
        }
    }
}

/// A queue's run policy; the defaults describe a plain Disbatch queue.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunPolicy {
    pub lease: Duration,
    pub on_lost: OnLost,
    /// Most time a plugin may run; None: no limit (Disbatch's behaviour).
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    /// Automatic retries (`retry`); None: a Disbatch queue, whose failures stay failed.
    pub retry: Option<crate::retry_policy::RetryPolicy>,
}

impl Default for RunPolicy {
    fn default() -> Self {
        RunPolicy {
            lease: DEFAULT_LEASE,
            on_lost: OnLost::Orphan,
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
            retry: None,
        }
    }
}

impl RunPolicy {
    /// How often a runner renews its lease: three chances before it passes.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }
}

/// Reads a number of seconds (integer or fractional, ≥ 0, at most a year); None when unset.
pub fn parse_seconds(value: Option<f64>, key: &str) -> Result<Option<Duration>, String> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && (0.0..=MAX_SECONDS).contains(&s) => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        Some(s) => Err(format!(
            "{key} must be a number of seconds between 0 and {MAX_SECONDS}, found {s}"
        )),
    }
}

/// The lease, at least MIN_LEASE, so a typo of 0 cannot make every task look lost.
pub fn lease_from(value: Option<f64>) -> Result<Duration, String> {
    match parse_seconds(value, "lease")? {
        None => Ok(DEFAULT_LEASE),
        Some(d) if d < MIN_LEASE => Err(format!(
            "lease must be at least {} s, found {} s",
            MIN_LEASE.as_secs(),
            d.as_secs_f64()
        )),
        Some(d) => Ok(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_lost_defaults_to_orphan_and_refuses_unknown_words() {
        assert_eq!(OnLost::parse(None), Ok(OnLost::Orphan));
        assert_eq!(OnLost::parse(Some("requeue")), Ok(OnLost::Requeue));
        assert!(OnLost::parse(Some("retry"))
            .unwrap_err()
            .contains("\"retry\""));
    }

    #[test]
    fn seconds_must_be_finite_and_in_range() {
        assert_eq!(parse_seconds(None, "timeout"), Ok(None));
        assert_eq!(
            parse_seconds(Some(1.5), "timeout"),
            Ok(Some(Duration::from_millis(1500)))
        );
        assert!(parse_seconds(Some(-1.0), "timeout").is_err());
        assert!(parse_seconds(Some(f64::NAN), "timeout").is_err());
        assert!(parse_seconds(Some(1e12), "timeout")
            .unwrap_err()
            .contains("timeout"));
    }

    #[test]
    fn lease_has_a_floor_and_a_default() {
        assert_eq!(lease_from(None), Ok(DEFAULT_LEASE));
        assert_eq!(lease_from(Some(10.0)), Ok(Duration::from_secs(10)));
        assert!(lease_from(Some(0.5)).is_err());
        let p = RunPolicy::default();
        assert_eq!(p.renew_every(), Duration::from_secs(10));
    }
}
