//! The outside-insert probe: tasks queued by writers that send no work signal (ops by hand,
//! Perl tools, Disbatch 4's DCI), and delayed tasks whose `not_before` passed (nothing is
//! written then), are found by the maintenance leader, which reads the tasks created or come
//! due since its last pass once and signals their open queues for the whole fleet; so such a
//! task starts within about a pass, and idle nodes need not read their queues often.

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bson::oid::ObjectId;
use disbatch_core::model::Queue;
use disbatch_core::store::{Queued, Store};
use disbatch_core::Result;

use crate::metrics::DenMetrics;

/// A node that starts leading looks this far back: tasks created while no one led (a leader
/// change takes seconds) are still found, without reading a day's tasks at once.
const LOOK_BACK: Duration = Duration::from_secs(30);
/// The bound never moves more than this ahead of the leader's clock: a task whose `_id` a
/// host with a clock far ahead made would otherwise hide every task made after it by hosts
/// with a right clock.
const AHEAD: Duration = Duration::from_secs(1);

/// Where the last probe left off: tasks with a greater `_id` are new to it.
#[derive(Debug, Default)]
pub struct OutsideInserts {
    after: Option<ObjectId>,
    /// Delayed tasks that came due up to this time have been signalled.
    due_until: Option<bson::DateTime>,
}

impl OutsideInserts {
    /// Reads the tasks created since the last probe and signals each open queue where some
    /// of them are queued. A task one of our writers queued is signalled twice (by it and
    /// here); a paused queue (`threads` 0) is not signalled. Tasks whose `_id` is no ObjectId,
    /// or an ObjectId older than the bound (made on a host whose clock is behind by more than a
    /// pass), are left to the nodes' own readings.
    pub async fn probe(
        &mut self,
        store: &Store,
        queues: &[Queue],
        metrics: &DenMetrics,
    ) -> Result<()> {
        let now = SystemTime::now();
        let after = self
            .after
            .unwrap_or_else(|| id_at(now.checked_sub(LOOK_BACK).unwrap_or(UNIX_EPOCH)));
        let created = store.created_since(after).await?;
        let newest = created.iter().map(|c| c.newest).max().unwrap_or(after);
        let ceiling = id_at(now + AHEAD);
        self.after = Some(newest.min(ceiling).max(after));
        let open: Vec<ObjectId> = queues
            .iter()
            .filter(|q| q.threads.as_ref().is_ok_and(|t| *t > 0) && !q.spec.paused)
            .map(|q| q.id)
            .collect();
        let until = bson::DateTime::from_system_time(now);
        let due_after = self.due_until.unwrap_or_else(|| {
            bson::DateTime::from_system_time(now.checked_sub(LOOK_BACK).unwrap_or(UNIX_EPOCH))
        });
        let due = store.came_due(&open, due_after, until).await?;
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
                store.signal_queued(queue, Queued::New).await;
                metrics.outside_insert_signalled();
            }
        }
        Ok(())
    }

    /// Forgets where it left off: a node that leads again looks back `LOOK_BACK`.
    pub fn forget(&mut self) {
        self.after = None;
        self.due_until = None;
    }
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
