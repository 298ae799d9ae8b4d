//! A queue's retry policy (`retry`): which failures are retried, how often, and how long each
//! retry waits; pure decisions, the store reads and writes the field.

use std::hash::{Hash, Hasher};
use std::time::Duration;

/// Beyond this many attempts a policy is a typo, not a plan (Sidekiq's default is 25).
pub const MOST_ATTEMPTS: u32 = 1000;
/// Anything beyond a year is a typo, not a delay.
const MOST_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// Why an attempt ended without success, as a policy's `on` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The plugin exited non-zero or its result file gave a failed status.
    Failed,
    /// The plugin was killed by a signal the runner did not send.
    Crashed,
    /// The runner stopped the plugin at the queue's `timeout`.
    Timeout,
    /// The attempt's runner or node went away (its lease passed, or it exited without a result).
    Lost,
}

impl FailureKind {
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Failed,
        FailureKind::Crashed,
        FailureKind::Timeout,
        FailureKind::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Failed => "failed",
            FailureKind::Crashed => "crashed",
            FailureKind::Timeout => "timeout",
            FailureKind::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<FailureKind> {
        FailureKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// How the wait grows from one retry to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backoff {
    /// `base_s · 2^(n-1)` before retry n, at most `max_s`.
    Exponential,
    /// `base_s` before every retry.
    Constant,
}

impl Backoff {
    pub fn as_str(self) -> &'static str {
        match self {
            Backoff::Exponential => "exponential",
            Backoff::Constant => "constant",
        }
    }

    pub fn parse(s: &str) -> Option<Backoff> {
        match s {
            "exponential" => Some(Backoff::Exponential),
            "constant" => Some(Backoff::Constant),
            _ => None,
        }
    }
}

/// A queue's `retry` field, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included; 1 means never retried.
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub base: Duration,
    pub max: Duration,
    /// Each wait is moved by up to this fraction either way, so that tasks that failed
    /// together (a database restart, a bad deploy) do not all come back in the same second.
    pub jitter: f64,
    on: u8,
}

/// What becomes of an attempt that did not succeed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RetryDecision {
    /// Queued again, claimable after this wait.
    Retry(Duration),
    /// Out of attempts: the task ends, discarded (a failure no retry will follow).
    Discard,
    /// The policy does not retry this kind of failure: the task fails as it would without one.
    NotCovered,
}

impl RetryPolicy {
    /// The policy queues made by our API start with, written on the queue so that it shows
    /// and can be changed. Like Oban's (20 attempts) and River's and Sidekiq's (25), with
    /// waits growing from 15 s: a failing dependency gets some two and a half days to come
    /// back (15 s doubling to the 6 h cap, then 6 h apart), and a task that cannot succeed
    /// stops being tried after that rather than forever.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        max_attempts: 20,
        backoff: Backoff::Exponential,
        base: Duration::from_secs(15),
        max: Duration::from_secs(6 * 3600),
        jitter: 0.1,
        on: 0b1111,
    };

    /// Checks a policy's values; `on` names the failures retried (none is allowed: the
    /// policy then only counts plugin-requested retries against `max_attempts`).
    pub fn new(
        max_attempts: u32,
        backoff: Backoff,
        base_s: f64,
        max_s: f64,
        jitter: f64,
        on: &[FailureKind],
    ) -> Result<RetryPolicy, String> {
        if !(1..=MOST_ATTEMPTS).contains(&max_attempts) {
            return Err(format!(
                "retry.max_attempts must be from 1 to {MOST_ATTEMPTS}, found {max_attempts}"
            ));
        }
        let seconds = |v: f64, key: &str| {
            if v.is_finite() && (0.0..=MOST_SECONDS).contains(&v) {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(format!(
                    "retry.{key} must be a number of seconds from 0 to {MOST_SECONDS}, found {v}"
                ))
            }
        };
        let base = seconds(base_s, "base_s")?;
        let max = seconds(max_s, "max_s")?;
        if max < base {
            return Err(format!(
                "retry.max_s ({max_s}) must be at least retry.base_s ({base_s})"
            ));
        }
        if !(jitter.is_finite() && (0.0..=1.0).contains(&jitter)) {
            return Err(format!(
                "retry.jitter must be a fraction from 0 to 1, found {jitter}"
            ));
        }
        Ok(RetryPolicy {
            max_attempts,
            backoff,
            base,
            max,
            jitter,
            on: on.iter().fold(0, |bits, k| bits | k.bit()),
        })
    }

    pub fn retries(&self, kind: FailureKind) -> bool {
        self.on & kind.bit() != 0
    }

    /// The failures retried, in `FailureKind::ALL`'s order.
    pub fn on(&self) -> Vec<FailureKind> {
        FailureKind::ALL
            .into_iter()
            .filter(|k| self.retries(*k))
            .collect()
    }

    /// What follows attempt `attempt` (1 for the first) of `task` ending as `kind`. The jitter
    /// comes from the task and attempt, not a random source: the same failure always waits
    /// the same, and tasks that failed together spread out.
    pub fn decide(&self, kind: FailureKind, attempt: i64, task: &impl Hash) -> RetryDecision {
        if !self.retries(kind) {
            RetryDecision::NotCovered
        } else if attempt >= i64::from(self.max_attempts) {
            RetryDecision::Discard
        } else {
            RetryDecision::Retry(self.wait_before(attempt + 1, spread(task, attempt)))
        }
    }

    /// Whether another attempt is allowed after attempt `attempt`, whatever the failure: a
    /// retry the plugin asks for is counted against `max_attempts` too.
    pub fn allows_another(&self, attempt: i64) -> bool {
        attempt < i64::from(self.max_attempts)
    }

    /// The wait before attempt `next` (2 for the first retry); `spread` in [-1, 1] picks
    /// the jitter.
    pub fn wait_before(&self, next: i64, spread: f64) -> Duration {
        let retry = next.saturating_sub(1).max(1);
        let plain = match self.backoff {
            Backoff::Constant => self.base,
            Backoff::Exponential => {
                // 2^40 s is beyond any cap: stop doubling long before overflow.
                let doublings = (retry - 1).clamp(0, 40) as i32;
                Duration::from_secs_f64(self.base.as_secs_f64() * 2f64.powi(doublings))
                    .min(self.max)
            }
        };
        let factor = 1.0 + self.jitter * spread.clamp(-1.0, 1.0);
        Duration::from_secs_f64((plain.as_secs_f64() * factor).max(0.0)).min(self.max)
    }
}

/// A number in [-1, 1] fixed by the task and the attempt.
fn spread(task: &impl Hash, attempt: i64) -> f64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    task.hash(&mut h);
    attempt.hash(&mut h);
    (h.finish() % 2001) as f64 / 1000.0 - 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max: u32, backoff: Backoff, base: f64, cap: f64, jitter: f64) -> RetryPolicy {
        RetryPolicy::new(max, backoff, base, cap, jitter, &FailureKind::ALL).unwrap()
    }

    #[test]
    fn exponential_waits_double_up_to_the_cap() {
        let p = policy(10, Backoff::Exponential, 1.0, 5.0, 0.0);
        let waits: Vec<u64> = (2..=6).map(|n| p.wait_before(n, 0.0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5]);
        let c = policy(10, Backoff::Constant, 3.0, 60.0, 0.0);
        assert_eq!(c.wait_before(7, 0.0), Duration::from_secs(3));
        // Far past any doubling the cap holds, with no overflow.
        assert_eq!(
            policy(1000, Backoff::Exponential, 1.0, 60.0, 0.0).wait_before(999, 0.0),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn jitter_moves_a_wait_within_its_fraction_and_never_past_the_cap() {
        let p = policy(10, Backoff::Constant, 10.0, 100.0, 0.2);
        assert_eq!(p.wait_before(2, -1.0), Duration::from_secs(8));
        assert_eq!(p.wait_before(2, 1.0), Duration::from_secs(12));
        let capped = policy(10, Backoff::Constant, 10.0, 10.0, 0.5);
        assert_eq!(capped.wait_before(2, 1.0), Duration::from_secs(10));
        for attempt in 1..50 {
            let s = spread(&"task", attempt);
            assert!((-1.0..=1.0).contains(&s), "{s}");
        }
        assert_eq!(spread(&"a", 1), spread(&"a", 1));
    }

    #[test]
    fn attempts_run_out_at_max_attempts_and_only_named_failures_retry() {
        let p = RetryPolicy::new(
            3,
            Backoff::Exponential,
            1.0,
            60.0,
            0.0,
            &[FailureKind::Failed],
        )
        .unwrap();
        assert_eq!(
            p.decide(FailureKind::Failed, 1, &1),
            RetryDecision::Retry(Duration::from_secs(1))
        );
        assert_eq!(
            p.decide(FailureKind::Failed, 2, &1),
            RetryDecision::Retry(Duration::from_secs(2))
        );
        assert_eq!(p.decide(FailureKind::Failed, 3, &1), RetryDecision::Discard);
        assert_eq!(
            p.decide(FailureKind::Crashed, 1, &1),
            RetryDecision::NotCovered
        );
        assert!(p.allows_another(2) && !p.allows_another(3));
        assert_eq!(p.on(), [FailureKind::Failed]);
    }

    #[test]
    fn bad_values_are_refused_with_the_field_named() {
        let bad = [
            RetryPolicy::new(0, Backoff::Constant, 1.0, 1.0, 0.0, &[]),
            RetryPolicy::new(2, Backoff::Constant, -1.0, 1.0, 0.0, &[]),
            RetryPolicy::new(2, Backoff::Constant, 1.0, f64::NAN, 0.0, &[]),
            RetryPolicy::new(2, Backoff::Constant, 5.0, 1.0, 0.0, &[]),
            RetryPolicy::new(2, Backoff::Constant, 1.0, 1.0, 1.5, &[]),
        ];
        let fields = ["max_attempts", "base_s", "max_s", "max_s", "jitter"];
        for (r, field) in bad.iter().zip(fields) {
            let e = r.as_ref().unwrap_err();
            assert!(e.contains(field), "{e}");
        }
        assert_eq!(FailureKind::parse("timeout"), Some(FailureKind::Timeout));
        assert_eq!(FailureKind::parse("oops"), None);
        assert_eq!(Backoff::parse("linear"), None);
    }

    #[test]
    fn the_default_retries_every_failure_for_days_not_forever() {
        let p = RetryPolicy::DEFAULT;
        assert_eq!(p.on(), FailureKind::ALL);
        let total: f64 = (2..=i64::from(p.max_attempts))
            .map(|n| p.wait_before(n, 0.0).as_secs_f64())
            .sum();
        let days = total / 86_400.0;
        assert!((2.0..3.0).contains(&days), "{days} days");
    }
}
