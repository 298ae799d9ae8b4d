//! Starts a rate limit granted ahead, per partition: this node's next claims take them until
//! the grant's horizon passes, and what is left then goes back to the window. With a limit far
//! above demand, one grant request serves many claim batches instead of each asking again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::{Bson, DateTime};
use disbatch_model::limits::RateLimit;

/// One grant's starts not yet taken.
#[derive(Debug, Clone)]
struct Held {
    partition: Bson,
    /// The grant's server time: it names the grant to a refund.
    granted_at: DateTime,
    left: u32,
    /// When the grant's reply came: a start taken later is recorded that much after
    /// `granted_at`, never past the horizon.
    received: Instant,
    /// The horizon measured from before the request was sent, so every start taken before
    /// it falls before the server's `granted_at` + horizon, the time the window counts it at.
    until: Instant,
    horizon: Duration,
}

/// A partition's reserve and how many to ask ahead next time.
#[derive(Debug, Clone)]
struct Partition {
    held: Option<Held>,
    size: u32,
}

/// Starts taken from a reserve for one claim batch.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Taken {
    pub(super) n: u32,
    pub(super) granted_at: DateTime,
    /// The attempts' recorded start: within the horizon after the grant.
    pub(super) started_at: DateTime,
}

/// Leftover starts of a reserve whose horizon passed: the window should count them no more.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Leftover {
    pub(super) partition: Bson,
    pub(super) granted_at: DateTime,
    pub(super) n: u32,
}

/// One queue's reserves, by partition (its value's key text).
#[derive(Debug, Default)]
pub(super) struct Reserves {
    partitions: HashMap<String, Partition>,
}

impl Reserves {
    /// Takes up to `n` starts from the partition's reserve, if its horizon has not passed.
    pub(super) fn take(&mut self, text: &str, n: u32, now: Instant) -> Option<Taken> {
        let p = self.partitions.get_mut(text)?;
        let held = p.held.as_mut().filter(|h| now < h.until && h.left > 0)?;
        let k = n.min(held.left);
        if k == 0 {
            return None;
        }
        held.left -= k;
        let since = now
            .saturating_duration_since(held.received)
            .min(held.horizon);
        let taken = Taken {
            n: k,
            granted_at: held.granted_at,
            started_at: DateTime::from_millis(
                held.granted_at
                    .timestamp_millis()
                    .saturating_add(since.as_millis() as i64),
            ),
        };
        if held.left == 0 {
            // Used up within its horizon: the next grant asks for more ahead.
            p.size = p.size.saturating_mul(2);
            p.held = None;
        }
        Some(taken)
    }

    /// How many starts to ask ahead for the partition: doubled each time a reserve is used
    /// up in time, halved each time one's horizon passes with starts left, at most
    /// `most_ahead`.
    pub(super) fn ahead_for(&mut self, text: &str, asked: u32, limit: &RateLimit) -> u32 {
        let most = limit.most_ahead();
        let p = self
            .partitions
            .entry(text.to_string())
            .or_insert_with(|| Partition {
                held: None,
                size: asked.saturating_mul(2),
            });
        p.size = p.size.clamp(1, most);
        p.size
    }

    /// Keeps the starts a grant gave ahead.
    pub(super) fn keep(
        &mut self,
        text: &str,
        partition: &Bson,
        granted_at: DateTime,
        ahead: u32,
        sent: Instant,
        limit: &RateLimit,
    ) {
        if ahead == 0 {
            return;
        }
        let horizon = limit.ahead_horizon();
        let p = self
            .partitions
            .entry(text.to_string())
            .or_insert_with(|| Partition {
                held: None,
                size: ahead,
            });
        p.held = Some(Held {
            partition: partition.clone(),
            granted_at,
            left: ahead,
            received: Instant::now(),
            until: sent + horizon,
            horizon,
        });
    }

    /// Puts back a start its claim did not use, if it came from the reserve still held.
    pub(super) fn put_back(&mut self, text: &str, granted_at: DateTime, now: Instant) -> bool {
        let Some(held) = self
            .partitions
            .get_mut(text)
            .and_then(|p| p.held.as_mut())
            .filter(|h| h.granted_at == granted_at && now < h.until)
        else {
            return false;
        };
        held.left += 1;
        true
    }

    /// Removes the reserves whose horizon passed, and says what they left; a partition quiet
    /// that long forgets its size too.
    pub(super) fn expire(&mut self, now: Instant) -> Vec<Leftover> {
        let mut leftovers = Vec::new();
        self.partitions.retain(|_, p| {
            let Some(held) = p.held.take_if(|h| now >= h.until) else {
                return true;
            };
            if held.left > 0 {
                p.size = (p.size / 2).max(1);
                leftovers.push(Leftover {
                    partition: held.partition,
                    granted_at: held.granted_at,
                    n: held.left,
                });
            }
            now < held.until + FORGET_SIZE
        });
        leftovers
    }

    pub(super) fn clear(&mut self) -> Vec<Leftover> {
        self.partitions
            .drain()
            .filter_map(|(_, p)| p.held)
            .filter(|h| h.left > 0)
            .map(|h| Leftover {
                partition: h.partition,
                granted_at: h.granted_at,
                n: h.left,
            })
            .collect()
    }
}

/// A partition without a reserve this long starts over at its next ask.
const FORGET_SIZE: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(starts: u32) -> RateLimit {
        RateLimit {
            starts,
            per: Duration::from_secs(1),
            partition: None,
            max_partitions: 10,
        }
    }

    #[test]
    fn a_reserve_serves_later_claims_until_it_is_used_up_and_then_asks_for_more() {
        let limit = limit(1_000);
        let mut r = Reserves::default();
        assert_eq!(r.ahead_for("a", 3, &limit), 6);
        let sent = Instant::now();
        r.keep(
            "a",
            &Bson::Null,
            DateTime::from_millis(1_000),
            6,
            sent,
            &limit,
        );
        let t = r.take("a", 4, Instant::now()).expect("taken");
        assert_eq!((t.n, t.granted_at), (4, DateTime::from_millis(1_000)));
        let ms = t.started_at.timestamp_millis();
        assert!((1_000..=1_125).contains(&ms), "within the horizon: {ms}");
        assert_eq!(r.take("a", 4, Instant::now()).map(|t| t.n), Some(2));
        assert_eq!(r.take("a", 1, Instant::now()), None, "used up");
        assert_eq!(r.ahead_for("a", 3, &limit), 12, "used up in time: doubled");
        assert_eq!(
            r.take("b", 1, Instant::now()),
            None,
            "another partition's own"
        );
    }

    #[test]
    fn a_reserve_past_its_horizon_gives_nothing_and_its_leftovers_go_back() {
        let limit = limit(1_000);
        let mut r = Reserves::default();
        r.ahead_for("a", 8, &limit);
        let sent = Instant::now();
        r.keep(
            "a",
            &Bson::Int32(7),
            DateTime::from_millis(5),
            16,
            sent,
            &limit,
        );
        assert_eq!(r.take("a", 6, sent).map(|t| t.n), Some(6));
        let after = sent + limit.ahead_horizon();
        assert_eq!(r.take("a", 1, after), None, "its horizon passed");
        assert!(!r.put_back("a", DateTime::from_millis(5), after));
        assert_eq!(
            r.expire(after),
            vec![Leftover {
                partition: Bson::Int32(7),
                granted_at: DateTime::from_millis(5),
                n: 10
            }]
        );
        assert_eq!(r.ahead_for("a", 8, &limit), 8, "left over: halved");
        assert!(r.expire(after).is_empty(), "given back once");
    }

    #[test]
    fn a_start_whose_claim_failed_goes_back_to_its_own_reserve_only() {
        let limit = limit(1_000);
        let mut r = Reserves::default();
        let now = Instant::now();
        r.keep("a", &Bson::Null, DateTime::from_millis(9), 2, now, &limit);
        assert!(r.put_back("a", DateTime::from_millis(9), now));
        assert!(
            !r.put_back("a", DateTime::from_millis(8), now),
            "another grant"
        );
        assert_eq!(r.take("a", 5, now).map(|t| t.n), Some(3));
    }

    #[test]
    fn the_ask_ahead_stays_within_an_eighth_of_the_limit() {
        let mut r = Reserves::default();
        assert_eq!(r.ahead_for("a", 100, &limit(50)), 6);
        assert_eq!(r.ahead_for("b", 100, &limit(4)), 1);
        assert_eq!(r.ahead_for("c", 0, &limit(1_000)), 1);
    }
}
