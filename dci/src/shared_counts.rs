//! One counts reading shared by every viewer: `/queues`, `/summary` and `/metrics` of all
//! tabs and scrapers read the same one, refreshed at most every `MAX_AGE` and at once after a
//! write through this DCI, with one read in flight per database.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use disbatch_store::{CountsReading, Store};

/// How old a shared reading may be: the console refreshes every 2 s, so each refresh sees
/// counts read since its last one, whatever the number of tabs.
pub const MAX_AGE: Duration = Duration::from_secs(1);

struct Reading {
    at: Instant,
    generation: u64,
    value: Arc<CountsReading>,
}

type Slot = Arc<tokio::sync::Mutex<Option<Reading>>>;

#[derive(Clone, Default)]
pub struct SharedCounts {
    /// One slot per database (namespace); the map holds at most the configured namespaces.
    slots: Arc<Mutex<HashMap<String, Slot>>>,
    /// Bumped by every write through this DCI: a reading from before it is not served.
    generation: Arc<AtomicU64>,
    reads: Arc<AtomicU64>,
}

impl SharedCounts {
    /// The current reading of `store`'s database, reading it if none is fresh. Callers that
    /// arrive while a read is in flight wait for it instead of starting their own.
    pub async fn get(&self, store: &Store) -> disbatch_store::error::Result<Arc<CountsReading>> {
        let slot = {
            let mut slots = match self.slots.lock() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            slots
                .entry(store.database_name().to_string())
                .or_default()
                .clone()
        };
        let mut current = slot.lock().await;
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(r) = current.as_ref() {
            if r.generation == generation && r.at.elapsed() < MAX_AGE {
                return Ok(r.value.clone());
            }
        }
        let value = Arc::new(store.stats().counts_reading().await?);
        self.reads.fetch_add(1, Ordering::Relaxed);
        *current = Some(Reading {
            at: Instant::now(),
            generation,
            value: value.clone(),
        });
        Ok(value)
    }

    /// After a write: the next request reads afresh, so a client sees its own change.
    pub fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// How many readings were made (for tests and metrics).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}
