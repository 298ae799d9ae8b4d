//! The outside-insert probe: tasks queued by writers that send no work signal (ops by hand,
//! Perl tools, Disbatch 4's DCI), and delayed tasks whose `not_before` passed (nothing is
//! written then), are found by the maintenance leader, which reads the tasks created or come
//! due since its last pass once and signals their open queues for the whole fleet; so such a
//! task starts within about a pass, and idle nodes need not read their queues often. While
//! the leader's stream sees every insert, it reads created tasks only once on taking the
//! lead (those created while no one led).

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bson::oid::ObjectId;
use disbatch_model::fleet_time;
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{Queued, Store};

use crate::metrics::DenMetrics;

/// A node that starts leading looks this far back: tasks created while no one led (a leader
/// change takes seconds) are still found, without reading a day's tasks at once.
const LOOK_BACK: Duration = Duration::from_secs(30);
/// The bound never moves more than this ahead of the leader's clock: a task whose `_id` a
/// host with a clock far ahead made would otherwise hide every task made after it by hosts
/// with a right clock.
const AHEAD: Duration = Duration::from_secs(1);

/// In probes: how often whether delayed tasks exist is read again without an event saying
/// so (ops may set a `not_before` by hand, which no event shows; the nodes' own readings,
/// every tenth pass when idle, claim such a task once due meanwhile).
const DELAYED_RECHECK: u32 = 60;

/// Where the last probe left off: tasks with a greater `_id` are new to it.
#[derive(Debug, Default)]
pub struct OutsideInserts {
    after: Option<ObjectId>,
    /// Delayed tasks that came due up to this time have been signalled.
    due_until: Option<bson::DateTime>,
    /// Whether open queues hold delayed tasks (None: to be read). While they hold none, no
    /// pass looks for tasks coming due: an idle fleet's leader would spend a request a pass.
    delayed: Option<bool>,
    /// Probes until `delayed` is read again.
    delayed_recheck_in: u32,
}

impl OutsideInserts {
    /// Reads the tasks created since the last probe and signals each open queue where some
    /// of them are queued. A task one of our writers queued is signalled twice (by it and
    /// here); a paused queue (`threads` 0) is not signalled. Tasks whose `_id` is no ObjectId,
    /// or an ObjectId older than the bound (made on a host whose clock is behind by more than a
    /// pass), are left to the nodes' own readings.
    /// `inserts_watched`: the leader's stream is open, so created tasks need reading only
    /// once, after taking the lead; `delays_changed`: its events saw a delayed task inserted,
    /// tasks queued again (perhaps with a delay) or a queue changed.
    pub async fn probe(
        &mut self,
        store: &Store,
        queues: &[Queue],
        inserts_watched: bool,
        delays_changed: bool,
        metrics: &DenMetrics,
    ) -> Result<()> {
        // The fleet's time: `not_before` and the ids' times are judged against the server's.
        let now = fleet_time::now().to_system_time();
        let created = match (self.after, inserts_watched) {
            (Some(after), true) => {
                // Kept near the present: if the stream closes, probing resumes from here
                // rather than reading every task made while it was open.
                let recent = id_at(now.checked_sub(AHEAD).unwrap_or(UNIX_EPOCH));
                self.after = Some(after.max(recent));
                Vec::new()
            }
            (after, _) => {
                let after = after
                    .unwrap_or_else(|| id_at(now.checked_sub(LOOK_BACK).unwrap_or(UNIX_EPOCH)));
                let created = store.queues().created_since(after).await?;
                let newest = created.iter().map(|c| c.newest).max().unwrap_or(after);
                let ceiling = id_at(now + AHEAD);
                self.after = Some(newest.min(ceiling).max(after));
                created
            }
        };
        let open = open_queues(queues);
        let until = bson::DateTime::from_system_time(now);
        let due_after = self.due_until.unwrap_or_else(|| {
            bson::DateTime::from_system_time(now.checked_sub(LOOK_BACK).unwrap_or(UNIX_EPOCH))
        });
        if !inserts_watched || delays_changed || self.delayed_recheck_in == 0 {
            self.delayed = None;
        }
        self.delayed_recheck_in = self.delayed_recheck_in.saturating_sub(1);
        if self.delayed.is_none() && inserts_watched {
            self.delayed = Some(store.queues().any_delayed_after(&open, due_after).await?);
            self.delayed_recheck_in = DELAYED_RECHECK;
        }
        let due = match self.delayed {
            Some(false) => Vec::new(),
            _ => store.queues().came_due(&open, due_after, until).await?,
        };
        self.due_until = Some(until.max(due_after));
        let mut signalled = HashSet::new();
        let found = created
            .iter()
            .filter(|c| c.queued > 0)
            .map(|c| (c.queue, c.queued))
            .chain(due);
        for (queue, n) in found {
            if open.contains(&queue) && signalled.insert(queue) {
                tracing::debug!(%queue, tasks = n, "signalling tasks queued or come due since the last probe");
                store.queues().signal_queued(queue, Queued::New).await;
                metrics.outside_insert_signalled();
            }
        }
        Ok(())
    }

    /// Forgets where it left off: a node that leads again looks back `LOOK_BACK`.
    pub fn forget(&mut self) {
        *self = OutsideInserts::default();
    }
}

/// The queues that may start tasks now (`threads` above 0, not paused).
pub fn open_queues(queues: &[Queue]) -> Vec<ObjectId> {
    queues
        .iter()
        .filter(|q| q.threads.as_ref().is_ok_and(|t| *t > 0) && !q.spec.paused)
        .map(|q| q.id)
        .collect()
}

/// The least ObjectId made at `t` (its first four bytes are seconds since the epoch).
fn id_at(t: SystemTime) -> ObjectId {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
    let mut bytes = [0u8; 12];
    bytes[..4].copy_from_slice(&secs.to_be_bytes());
    ObjectId::from_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_at_a_time_order_with_the_ids_made_then() {
        let made = ObjectId::new();
        let secs = made.timestamp().timestamp_millis() as u64 / 1000;
        let at = UNIX_EPOCH + Duration::from_secs(secs);
        assert!(id_at(at) <= made);
        assert!(made < id_at(at + Duration::from_secs(1)));
        assert_eq!(id_at(UNIX_EPOCH), ObjectId::from_bytes([0; 12]));
    }
}
