//! The stats keeper: the maintenance leader's per-minute statistics (attempts ended per
//! queue and node, durations, queue depth), written in the background once a minute is over.

use std::collections::BTreeMap;
use std::time::Duration;

use disbatch_model::fleet_time;
use disbatch_store::Result;
use disbatch_store::{add_depths, bucket_attempts, StatusGroup, Store};

use crate::maintenance::background::Background;

/// How long after a minute ends it is counted: an attempt that ended in its last moments has
/// its record written by then (records are written right after the attempt ends).
const GRACE: Duration = Duration::from_secs(2);
/// After a gap (no leader, a database outage) at most this many missed minutes are filled
/// in, so a new leader's first pass stays short; older minutes stay missing.
const MAX_CATCH_UP: i64 = 60;

pub struct StatsKeeper {
    /// The bucket width (`stats_interval_s`: a minute unless testing).
    width: Duration,
    node: String,
    chore: Background,
}

impl StatsKeeper {
    pub fn new(width: Duration, node: &str) -> StatsKeeper {
        StatsKeeper {
            width,
            node: node.to_string(),
            chore: Background::default(),
        }
    }

    /// Writes the buckets of the minutes that ended since the last written, when a check is
    /// due and none is running (the leader calls this on each of its maintenance passes).
    pub fn tick(&mut self, store: &Store) {
        // A fraction of a bucket: a minute is written within seconds of its grace passing.
        let every = (self.width / 4).max(Duration::from_millis(250));
        self.chore.start_if_due(every, || {
            let (store, width, node) = (store.clone(), self.width, self.node.clone());
            async move {
                if let Err(e) = keep(&store, width, &node).await {
                    tracing::warn!(error = %e, "could not write statistics; trying again later");
                }
            }
        });
    }

    /// For a node that stops leading or stops: a pass in flight is dropped; what it wrote is
    /// kept, and the next leader continues after the last minute finished.
    pub fn stop(&mut self) {
        self.chore.stop();
    }
}

/// The minutes due: after the last written (at most `MAX_CATCH_UP` of them) up to the last
/// that ended `GRACE` ago, as bucket starts in milliseconds.
pub fn minutes_due(now_ms: i64, written_until: Option<i64>, width_ms: i64) -> Vec<i64> {
    let grace = GRACE.as_millis() as i64;
    let last = (now_ms - grace).div_euclid(width_ms) * width_ms - width_ms;
    let earliest = last - (MAX_CATCH_UP - 1) * width_ms;
    let first = written_until.map_or(earliest, |w| (w + width_ms).max(earliest));
    (0..)
        .map(|i| first + i * width_ms)
        .take_while(|m| *m <= last)
        .collect()
}

async fn keep(store: &Store, width: Duration, node: &str) -> Result<()> {
    let width_ms = i64::try_from(width.as_millis()).unwrap_or(60_000).max(1);
    let now_ms = fleet_time::now().timestamp_millis();
    let due = minutes_due(now_ms, store.stats().stats_written_until().await?, width_ms);
    let Some(&latest) = due.last() else {
        return Ok(());
    };
    for minute in due {
        let attempts = store
            .stats()
            .ended_attempts(minute, minute + width_ms)
            .await?;
        let mut buckets = bucket_attempts(&attempts, minute, width_ms);
        // Depth is known only now: only the minute just ended gets it.
        if minute == latest {
            add_depths(&mut buckets, &depths(store).await?);
        }
        store.stats().write_stats(&buckets, node).await?;
    }
    Ok(())
}

/// Every queue's `(queued, running)` now, running counting claimed tasks too.
async fn depths(store: &Store) -> Result<BTreeMap<bson::oid::ObjectId, (u64, u64)>> {
    let reading = store.stats().counts_reading().await?;
    Ok(reading
        .groups
        .iter()
        .map(|(id, g)| {
            let running = g.get(StatusGroup::Running) + g.get(StatusGroup::Claimed);
            (*id, (g.get(StatusGroup::Queued), running))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minute_that_just_ended_is_due_once_its_grace_passed() {
        // 12:01:01: the grace of 12:00 has not passed.
        let m = 60_000;
        assert_eq!(
            minutes_due(721 * m + 1_000, Some(719 * m), m),
            Vec::<i64>::new()
        );
        assert_eq!(minutes_due(721 * m + 2_000, Some(719 * m), m), [720 * m]);
        assert_eq!(
            minutes_due(721 * m + 2_000, Some(720 * m), m),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn a_gap_is_filled_up_to_a_bound() {
        let m = 60_000;
        let due = minutes_due(1000 * m + 5_000, Some(990 * m), m);
        assert_eq!(due, (991..=999).map(|i| i * m).collect::<Vec<_>>());
        let due = minutes_due(1000 * m + 5_000, Some(10 * m), m);
        assert_eq!(due.len(), MAX_CATCH_UP as usize);
        assert_eq!(due.last(), Some(&(999 * m)));
        assert_eq!(
            minutes_due(1000 * m + 5_000, None, m).len(),
            MAX_CATCH_UP as usize
        );
    }

    #[test]
    fn short_buckets_for_tests_tile_the_same_way() {
        let s = 2_000;
        assert_eq!(minutes_due(10_000 + 2_000, Some(6_000), s), [8_000]);
    }
}
