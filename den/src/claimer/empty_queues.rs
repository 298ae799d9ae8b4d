//! Queues a read found with no claimable task, left unread until something says tasks may have
//! come: a read of an empty queue beside a deep one is not free (SecantusDB: 191–377 ms with
//! 100 000 tasks in the other queue), and a busy node would make it at every pass.
//!
//! What clears a mark, so a task is found as soon as before:
//! - a signal (a wake-up by the fleet's stream, the leader's mark, tasks queued again, a retry
//!   of this node's coming due): every mark, since not every signal names its queue;
//! - the queue's own signal on its document (`tasks_queued_at`, `tasks_requeued_at`), newer
//!   than the read less `CLOCK_MARGIN`: our writers, and the leader's probe for every other
//!   writer, set it, and a node reads it with its queues, stream or not;
//! - age: after `max_age` the queue is read again, for what no one signals (a task set back
//!   to queued by hand).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::DateTime;

/// Signals are stamped on the writer's estimate of the database's clock, the read on this
/// node's: a signal this close before the read may still be for a task the read missed.
const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// When a queue was found empty: on this host's monotonic clock (for `max_age`) and on the
/// fleet's clock (to compare with the queue's signals).
#[derive(Debug, Clone, Copy)]
struct FoundEmpty {
    at: Instant,
    fleet_at: DateTime,
}

#[derive(Debug)]
pub(super) struct EmptyQueues {
    found: HashMap<ObjectId, FoundEmpty>,
    max_age: Duration,
}

impl EmptyQueues {
    pub(super) fn new(max_age: Duration) -> Self {
        EmptyQueues {
            found: HashMap::new(),
            max_age,
        }
    }

    /// `queue` had no claimable task in a read that started at `fleet_at`.
    pub(super) fn found_empty(&mut self, queue: ObjectId, at: Instant, fleet_at: DateTime) {
        self.found.insert(queue, FoundEmpty { at, fleet_at });
    }

    /// Whether `queue` may be left unread now: found empty less than `max_age` ago, and not
    /// signalled since (`signalled_at`: the newest signal on its document as last read).
    pub(super) fn still_empty(
        &self,
        queue: ObjectId,
        signalled_at: Option<DateTime>,
        now: Instant,
    ) -> bool {
        let Some(found) = self.found.get(&queue) else {
            return false;
        };
        if now.saturating_duration_since(found.at) >= self.max_age {
            return false;
        }
        let margin = i64::try_from(CLOCK_MARGIN.as_millis()).unwrap_or(i64::MAX);
        signalled_at.is_none_or(|s| {
            s.timestamp_millis() < found.fleet_at.timestamp_millis().saturating_sub(margin)
        })
    }

    pub(super) fn forget(&mut self, queue: ObjectId) {
        self.found.remove(&queue);
    }

    pub(super) fn forget_all(&mut self) {
        self.found.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    #[test]
    fn a_queue_found_empty_stays_unread_until_signalled_aged_or_forgotten() {
        let q = ObjectId::new();
        let other = ObjectId::new();
        let start = Instant::now();
        let mut e = EmptyQueues::new(Duration::from_secs(10));
        assert!(!e.still_empty(q, None, start), "never read");
        e.found_empty(q, start, at(100_000));
        assert!(e.still_empty(q, None, start));
        assert!(!e.still_empty(other, None, start));
        // A signal from well before the read is one the read already saw.
        assert!(e.still_empty(q, Some(at(50_000)), start));
        // One within the clock margin, or after, may be for a task the read missed.
        assert!(!e.still_empty(q, Some(at(99_500)), start));
        assert!(!e.still_empty(q, Some(at(100_001)), start));
        assert!(!e.still_empty(q, None, start + Duration::from_secs(10)));
        assert!(e.still_empty(q, None, start + Duration::from_secs(9)));
        e.forget(q);
        assert!(!e.still_empty(q, None, start));
        e.found_empty(q, start, at(100_000));
        e.found_empty(other, start, at(100_000));
        e.forget_all();
        assert!(!e.still_empty(q, None, start) && !e.still_empty(other, None, start));
    }
}
