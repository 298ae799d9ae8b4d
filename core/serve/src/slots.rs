//! The connection slots of one listener: who holds them, and which connection gives its slot
//! up when a new one arrives and all are taken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus::{IntGauge, Opts, Registry};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::activity::Activity;

/// How long a new connection waits for an evicted one to close before it is refused.
const EVICTION_WAIT: Duration = Duration::from_secs(1);
/// Connections evicted at once, as a share of the slots: the newcomer waits for the first to
/// close, and the next few newcomers find their slots free, so a flood is accepted at the
/// kernel's pace and does not pile up in the listen queue.
const EVICT_SHARE: usize = 16;

pub(super) struct Slots {
    max: usize,
    permits: Arc<Semaphore>,
    held: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    gauges: Option<ConnectionGauges>,
}

/// A listener's own count of its connections, for `/metrics`:
/// `disbatch_listener_connections_open` (admitted and not yet closed) and
/// `disbatch_listener_connections_open_max` (the most open at once since the listener
/// started), labelled `listener`. The high-water mark shows that the cap held through a whole
/// flood, which samples of the open count, or of the kernel's socket tables, cannot.
#[derive(Clone)]
pub struct ConnectionGauges {
    open: IntGauge,
    most: IntGauge,
}

impl ConnectionGauges {
    /// Gauges at 0 for the listener named `listener` (`web`, `metrics`), not yet registered.
    pub fn new(listener: &str) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| {
            IntGauge::with_opts(Opts::new(name, help).const_label("listener", listener))
        };
        Ok(ConnectionGauges {
            open: gauge(
                "disbatch_listener_connections_open",
                "Connections the listener has admitted and not yet closed (at most its \
                 max_connections)",
            )?,
            most: gauge(
                "disbatch_listener_connections_open_max",
                "The most connections the listener has held open at once since it started",
            )?,
        })
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.open.clone()))?;
        registry.register(Box::new(self.most.clone()))
    }

    /// Called under the slots' lock, so counts are set in the order they changed.
    fn count(&self, open: usize) {
        let open = i64::try_from(open).unwrap_or(i64::MAX);
        self.open.set(open);
        if open > self.most.get() {
            self.most.set(open);
        }
    }
}

/// A connection's slot; it frees the slot when dropped (when the connection is closed).
pub(super) struct Slot {
    id: u64,
    pub activity: Arc<Activity>,
    slots: Arc<Slots>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Before the permit goes: a connection waiting for the slot must not find this one.
        let mut held = self.slots.lock();
        held.remove(&self.id);
        self.slots.counted(held.len());
    }
}

impl Slots {
    #[cfg(test)]
    pub fn new(max: usize) -> Arc<Slots> {
        Slots::counted_by(max, None)
    }

    /// Slots whose open count `gauges` follow.
    pub fn counted_by(max: usize, gauges: Option<ConnectionGauges>) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            permits: Arc::new(Semaphore::new(max)),
            held: Mutex::new(HashMap::with_capacity(max)),
            next_id: AtomicU64::new(0),
            gauges,
        })
    }

    fn counted(&self, open: usize) {
        if let Some(gauges) = &self.gauges {
            gauges.count(open);
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Activity>>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection: a free one, or the one of the connection that has waited
    /// longest with nothing in flight, which is closed for it. None when every connection has
    /// a request in flight: the new one is then closed at once.
    pub async fn admit(self: &Arc<Self>) -> Option<Slot> {
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if !self.evict_longest_waiting() {
                    return None;
                }
                tokio::time::timeout(EVICTION_WAIT, self.permits.clone().acquire_owned())
                    .await
                    .ok()?
                    .ok()?
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new());
        {
            let mut held = self.lock();
            held.insert(id, activity.clone());
            self.counted(held.len());
        }
        Some(Slot {
            id,
            activity,
            slots: self.clone(),
            _permit: permit,
        })
    }

    /// Marks the connections waiting longest for eviction (one per `EVICT_SHARE` slots, at
    /// least one); false when none is waiting.
    fn evict_longest_waiting(&self) -> bool {
        let held = self.lock();
        let mut waiting: Vec<_> = held
            .values()
            .filter_map(|a| a.waiting_since().map(|since| (since, a)))
            .collect();
        let n = (self.max / EVICT_SHARE).max(1).min(waiting.len());
        if n == 0 {
            return false;
        }
        waiting.select_nth_unstable_by_key(n - 1, |(since, _)| *since);
        for (_, activity) in &waiting[..n] {
            activity.evict();
        }
        true
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().len()
    }

    /// Waits until every connection has closed, at most `grace`; false if some are still open.
    pub async fn drain(&self, grace: Duration) -> bool {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        tokio::time::timeout(grace, self.permits.acquire_many(all))
            .await
            .is_ok_and(|permits| permits.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_listener_evicts_the_connection_waiting_longest_and_never_a_busy_one() {
        let slots = Slots::new(2);
        let first = slots.admit().await.expect("free slot");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let second = slots.admit().await.expect("free slot");
        assert_eq!(slots.open(), 2);
        // The first connection waited longest: it is asked to close, and its slot goes to the
        // newcomer as soon as it has.
        let watch = {
            let a = first.activity.clone();
            tokio::spawn(async move {
                let t = super::super::activity::Timeouts {
                    header: Duration::from_secs(60),
                    idle: Duration::from_secs(60),
                };
                let why = a.expired(t, false).await;
                drop(first);
                why
            })
        };
        let third = slots.admit().await.expect("evicted slot");
        assert_eq!(
            watch.await.ok(),
            Some(super::super::activity::Expiry::Evicted)
        );
        assert_eq!(slots.open(), 2);
        // With every connection busy, a newcomer is refused.
        let _busy = (
            second.activity.request_started(),
            third.activity.request_started(),
        );
        assert!(slots.admit().await.is_none());
        assert!(!slots.drain(Duration::from_millis(10)).await);
        drop((second, third));
        assert!(slots.drain(Duration::from_millis(10)).await);
    }

    #[tokio::test]
    async fn the_gauges_follow_the_open_connections_and_keep_their_most() {
        let gauges = ConnectionGauges::new("test").expect("gauges");
        let slots = Slots::counted_by(3, Some(gauges.clone()));
        let (a, b) = (slots.admit().await, slots.admit().await);
        assert_eq!((gauges.open.get(), gauges.most.get()), (2, 2));
        drop(a);
        assert_eq!((gauges.open.get(), gauges.most.get()), (1, 2));
        drop(b);
        assert_eq!((gauges.open.get(), gauges.most.get()), (0, 2));
    }
}
