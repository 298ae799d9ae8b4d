//! What one process's store keeps between calls, shared by its clones: what it learnt of the
//! server, and the ledgers of skipped documents, count changes, work signals and made indexes.

use std::sync::atomic::AtomicU8;
use std::sync::Arc;

use crate::conn::decode::SkipLedger;
use crate::limits::key_slots::LimitIndexes;
use crate::queues::signals::SignalLedger;
use crate::tasks::counts::CountLedger;

#[derive(Clone, Debug)]
pub(crate) struct State {
    /// Whether the server takes `bulkWrite` (BULK_WRITE_*), learnt on first use.
    pub(crate) bulk_write: Arc<AtomicU8>,
    /// Documents reads had to leave out.
    pub(crate) skips: SkipLedger,
    /// Count changes noted by writes and not yet written.
    pub(crate) counts: CountLedger,
    /// Work signals wanted and being written, per queue.
    pub(crate) signals: SignalLedger,
    /// Which flow-limit indexes this process has made sure of (`limits::key_slots::LimitIndex`).
    pub(crate) limit_indexes: Arc<LimitIndexes>,
}

impl Default for State {
    fn default() -> State {
        State {
            bulk_write: Arc::new(AtomicU8::new(crate::BULK_WRITE_UNKNOWN)),
            skips: SkipLedger::default(),
            counts: CountLedger::default(),
            signals: SignalLedger::default(),
            limit_indexes: Arc::default(),
        }
    }
}

impl State {
    /// The state of a store on another database of the same server: what was learnt of the
    /// server and the skips stay; the ledgers of one database's documents start afresh.
    pub(crate) fn for_another_database(&self) -> State {
        State {
            bulk_write: self.bulk_write.clone(),
            skips: self.skips.clone(),
            ..State::default()
        }
    }
}
