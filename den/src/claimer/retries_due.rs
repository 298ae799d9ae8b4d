//! When retries this node's runners queued come due: the node reads their queues then, rather
//! than waiting for the maintenance leader's come-due probe.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_model::fleet_time;

/// Retries due later than this are left to the leader's come-due probe.
const HORIZON: Duration = Duration::from_secs(3600);
/// Due retries one node keeps timers for; past it the leader's probe finds the rest.
const MOST: usize = 10_000;
/// How long after a retry's `not_before` its node looks: the claim judges `not_before` on
/// the server's clock, which this process knows to within a round trip.
const SLACK_MS: i64 = 20;

/// The retries this node's runners queued, by when (local time) their queue is to be read.
#[derive(Debug, Default)]
pub(super) struct RetriesDue(Vec<(Instant, ObjectId)>);

impl RetriesDue {
    /// Notes a retry of `queue` claimable from `at` (the fleet's time).
    pub(super) fn note(&mut self, at: bson::DateTime, queue: ObjectId) {
        let wait = at
            .timestamp_millis()
            .saturating_sub(fleet_time::now().timestamp_millis())
            .saturating_add(SLACK_MS);
        let wait = Duration::from_millis(u64::try_from(wait).unwrap_or(0));
        if wait <= HORIZON && self.0.len() < MOST {
            self.0.push((Instant::now() + wait, queue));
        }
    }

    /// When the next one comes due, if one does.
    pub(super) fn next(&self) -> Option<Instant> {
        self.0.iter().map(|(at, _)| *at).min()
    }

    /// The queues whose retries came due by `now`, forgotten here.
    pub(super) fn take_due(&mut self, now: Instant) -> Vec<ObjectId> {
        let mut due = Vec::new();
        self.0.retain(|(at, queue)| {
            let is_due = *at <= now;
            if is_due {
                due.push(*queue);
            }
            !is_due
        });
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_comes_due_once_at_its_time_and_far_ones_are_left_to_the_leader() {
        let mut due = RetriesDue::default();
        let (q1, q2) = (ObjectId::new(), ObjectId::new());
        let now = fleet_time::now().timestamp_millis();
        due.note(bson::DateTime::from_millis(now - 5_000), q1);
        due.note(bson::DateTime::from_millis(now + 60_000), q2);
        due.note(bson::DateTime::from_millis(now + 7_200_000), q2);
        assert_eq!(due.0.len(), 2, "two hours away is the leader's");
        let first = due.next().unwrap();
        assert!(first <= Instant::now() + Duration::from_millis(SLACK_MS as u64));
        assert_eq!(due.take_due(Instant::now()), [q1]);
        assert!(due.take_due(Instant::now()).is_empty());
        assert_eq!(due.take_due(Instant::now() + Duration::from_secs(61)), [q2]);
        assert_eq!(due.next(), None);
    }
}
