//! The fan-out: the maintenance leader passes the fleet's change-stream events on to the
//! nodes that serve the signalled queues, by marking their node documents (their next
//! heartbeat reads the mark), so followers hold no stream of their own and still start new
//! work within a heartbeat; and whether that stream is worth holding (`StreamNeed`).

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use disbatch_store::Result;
use disbatch_store::Store;

use crate::claimer::PassReport;
use crate::metrics::DenMetrics;
use crate::wake::notifier::Signalled;

/// Maintenance passes in a row the leader must be busy, with no node waiting, before it drops
/// the stream: a queue that runs dry between two batches does not reopen it at each pass.
const BUSY_PASSES_BEFORE_CLOSING: u32 = 3;

/// At most one fan-out request this often: a node reads its mark only at its heartbeat, so
/// marking it again sooner is wasted, and a busy leader wakes on every signal.
const SPACING: Duration = Duration::from_millis(100);

/// Signals taken from the stream and not yet passed on, and where to pass them.
pub struct Fanout {
    store: Store,
    leader: String,
    /// Nodes heartbeating within this are marked; older ones are taken for dead.
    live_within: Duration,
    metrics: DenMetrics,
    pending: Signalled,
    last: Option<Instant>,
}

/// The leader's own queues at a pass, read only when there is something to pass on.
pub struct OwnQueues {
    pub served: Vec<ObjectId>,
    /// The queues that may start tasks now, when the leader's reading is fresh.
    pub open: Option<Vec<ObjectId>>,
}

impl Fanout {
    pub fn new(store: Store, leader: String, live_within: Duration, metrics: DenMetrics) -> Fanout {
        Fanout {
            store,
            leader,
            live_within,
            metrics,
            pending: Signalled::default(),
            last: None,
        }
    }

    /// After a leader's claim pass: marks the other nodes serving the queues signalled
    /// before it (`new`, taken from the notifier before the pass) and not passed on yet.
    /// Queues this node serves are left out when the pass took every task it found (it had
    /// room to spare and no queue waited for a slot), and so are queues not open (paused, or
    /// `threads` 0): the others would read for nothing.
    pub async fn after_pass(
        &mut self,
        new: Signalled,
        own: impl FnOnce() -> OwnQueues,
        report: &PassReport,
    ) -> Result<()> {
        if new.is_empty() && self.pending.is_empty() {
            return Ok(());
        }
        if !new.queues.is_empty() {
            let own = own();
            let drained =
                report.short_of_tasks == Some(true) && !report.more && !report.waiting_for_slots;
            self.pending.queues.extend(
                new.queues
                    .into_iter()
                    .filter(|q| !(drained && own.served.contains(q)))
                    .filter(|q| own.open.as_ref().is_none_or(|open| open.contains(q))),
            );
        }
        self.pending.all |= new.all;
        if self.pending.is_empty() || self.last.is_some_and(|t| t.elapsed() < SPACING) {
            return Ok(());
        }
        self.last = Some(Instant::now());
        let pending = std::mem::take(&mut self.pending);
        let queues: Vec<ObjectId> = pending.queues.into_iter().collect();
        match self
            .store
            .nodes()
            .signal_nodes(&self.leader, &queues, pending.all, self.live_within)
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
                self.metrics.nodes_signalled(marked);
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
        self.pending = Signalled::default();
        self.last = None;
    }
}

/// Whether the leader's stream is worth its cost: the server reads every write of the
/// database for an open stream (a busy fleet writes several documents per task), and a busy
/// leader reads its queues at every pass anyway, so the stream serves only nodes
/// short of tasks. The leader drops it while itself and every other node have more work than
/// room (each heartbeat says whether its node waits, `waiting_for_work`) and opens it again at
/// the first maintenance pass where one waits; work that came meanwhile is covered by the
/// marks for every node that an opening stream sends, and by the insert probe, which runs
/// while no stream sees inserts.
#[derive(Debug, Default)]
pub struct StreamNeed {
    busy_passes: u32,
}

impl StreamNeed {
    /// At a maintenance pass: whether the stream should be open now. `waiting` is whether the
    /// node itself waits for work (its last pass ran short of tasks, or it runs nothing); the
    /// other nodes are read only once it has been
    /// busy for a few passes, so an idle leader makes no extra request.
    pub async fn wanted(
        &mut self,
        store: &Store,
        leader: &str,
        leading: bool,
        waiting: bool,
        live_within: Duration,
    ) -> Result<bool> {
        if !leading || waiting {
            self.busy_passes = 0;
            return Ok(leading);
        }
        self.busy_passes = self.busy_passes.saturating_add(1);
        if self.busy_passes < BUSY_PASSES_BEFORE_CLOSING {
            return Ok(true);
        }
        store
            .nodes()
            .others_wait_for_work(leader, live_within)
            .await
    }
}
