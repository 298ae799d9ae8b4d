//! The fan-out: the maintenance leader passes the fleet's change-stream events on to the
//! nodes that serve the signalled queues, by marking their node documents (their next
//! heartbeat reads the mark), so followers hold no stream of their own and still start new
//! work within a heartbeat.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_core::store::Store;
use disbatch_core::Result;

use crate::claimer::PassReport;
use crate::metrics::DenMetrics;
use crate::notifier::Signalled;

/// At most one fan-out request this often: a node reads its mark only at its heartbeat, so
/// marking it again sooner is wasted, and a busy leader wakes on every signal.
const SPACING: Duration = Duration::from_millis(100);

/// Signals taken from the stream and not yet passed on.
#[derive(Debug, Default)]
pub struct Fanout {
    pending: Signalled,
    last: Option<Instant>,
}

impl Fanout {
    /// After a leader's claim pass: marks the other nodes serving the queues signalled
    /// before it (`new`, taken from the notifier before the pass) and not passed on yet.
    /// Queues this node serves are left out when the pass took every task it found (it had
    /// room to spare and no queue waited for a slot), and so are queues `open` (when known)
    /// does not hold (paused, or `threads` 0): the others would read for nothing.
    #[allow(clippy::too_many_arguments)]
    pub async fn after_pass(
        &mut self,
        store: &Store,
        new: Signalled,
        leader: &str,
        served: &[ObjectId],
        open: Option<&[ObjectId]>,
        report: &PassReport,
        live_within: Duration,
        metrics: &DenMetrics,
    ) -> Result<()> {
        let drained =
            report.short_of_tasks == Some(true) && !report.more && !report.waiting_for_slots;
        self.pending.all |= new.all;
        self.pending.queues.extend(
            new.queues
                .into_iter()
                .filter(|q| !(drained && served.contains(q)))
                .filter(|q| open.is_none_or(|open| open.contains(q))),
        );
        if self.pending.is_empty() || self.last.is_some_and(|t| t.elapsed() < SPACING) {
            return Ok(());
        }
        self.last = Some(Instant::now());
        let pending = std::mem::take(&mut self.pending);
        let queues: Vec<ObjectId> = pending.queues.into_iter().collect();
        match store
            .signal_nodes(leader, &queues, pending.all, live_within)
            .await
        {
            Ok(marked) => {
                if marked > 0 {
                    tracing::debug!(
                        nodes = marked,
                        queues = queues.len(),
                        all = pending.all,
                        "signalled nodes of work"
                    );
                }
                metrics.nodes_signalled(marked);
                Ok(())
            }
            Err(e) => {
                // Kept for the next pass: a lost fan-out would leave idle nodes to their own
                // reading, ten passes later.
                self.pending.all |= pending.all;
                self.pending.queues.extend(queues);
                Err(e)
            }
        }
    }

    /// Drops what is pending: a node that no longer leads leaves the fan-out to the next.
    pub fn forget(&mut self) {
        *self = Fanout::default();
    }
}
