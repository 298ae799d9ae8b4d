//! Per-key concurrency as the database holds it: which key slots a queue's running tasks hold,
//! and, for an `ordered` queue, the oldest queued task of each key (the only one that may start).

use crate::LimitStore;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use futures::TryStreamExt;

use crate::error::{Error, Result};
use disbatch_model::schema::{task, TASKS};
use disbatch_model::status;

/// The key slots held in one queue, by key (the key's canonical text: see `key_text`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeldKeys {
    held: HashMap<String, (Bson, Vec<u32>)>,
}

impl HeldKeys {
    /// A slot below `max` that `key` has free and `taken` does not hold: the first from
    /// `from` on, round to `from` again. Nodes that start their search at random places
    /// seldom reach for the same slot of a key with many.
    pub fn free_slot(&self, key: &Bson, max: u32, taken: &[u32], from: u32) -> Option<u32> {
        let held = self
            .held
            .get(&key_text(key))
            .map_or(&[][..], |(_, s)| s.as_slice());
        let from = if max == 0 { 0 } else { from % max };
        (from..max)
            .chain(0..from)
            .find(|s| !held.contains(s) && !taken.contains(s))
    }

    /// The keys holding `max` slots or more: none of their tasks can start now.
    pub fn full_keys(&self, max: u32) -> Vec<Bson> {
        self.held
            .values()
            .filter(|(_, s)| s.len() >= max as usize)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub fn hold(&mut self, key: &Bson, slot: u32) {
        let entry = self
            .held
            .entry(key_text(key))
            .or_insert_with(|| (key.clone(), Vec::new()));
        if !entry.1.contains(&slot) {
            entry.1.push(slot);
        }
    }

    /// Whether some key holds half its `max` slots or more: a reading this close to full may
    /// be wrong about which of its keys can start, so it is read again rather than reused.
    pub fn near_full(&self, max: u32) -> bool {
        self.held
            .values()
            .any(|(_, s)| s.len().saturating_mul(2) >= max as usize)
    }

    /// How many tasks hold a slot of `key`.
    pub fn running(&self, key: &Bson) -> usize {
        self.held.get(&key_text(key)).map_or(0, |(_, s)| s.len())
    }
}

pub use disbatch_model::limits::key_text;

/// A flow limit's unique index on tasks (`indexes::limit_indexes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitIndex {
    Unique = 0,
    KeySlots = 1,
    /// Workflows' four (`indexes::workflow_indexes`).
    Workflows = 2,
}

/// Which limit indexes this process has made sure of.
#[derive(Debug, Default)]
pub struct LimitIndexes([AtomicBool; 3]);

impl LimitStore<'_> {
    /// Makes sure the limit's index exists before the first write that relies on it (a claim
    /// holding a key slot, a task holding a unique key): once per process and database, then
    /// free. Creating an index that exists is a no-op on the server.
    pub async fn ensure_limit_index(self, which: LimitIndex) -> Result<()> {
        let made = &self.state.limit_indexes.0[which as usize];
        if made.load(Ordering::Relaxed) {
            return Ok(());
        }
        let [unique, key_slots] = crate::conn::indexes::limit_indexes();
        let models = match which {
            LimitIndex::Unique => vec![unique],
            LimitIndex::KeySlots => vec![key_slots],
            LimitIndex::Workflows => crate::conn::indexes::workflow_indexes(),
        };
        for model in models {
            let keys = model.keys.clone();
            self.collection(TASKS)
                .create_index(model)
                .await
                .map_err(|e| Error::mongo(format!("creating index {keys} on {TASKS}"), e))?;
        }
        made.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether any task may wait for another here: the workflows' indexes exist (made by
    /// whoever stored the first waiting task), or this process has seen a task others wait
    /// for. Until then the leader's sweep has nothing to settle and no index to read by: one
    /// `listIndexes` a call, then, once seen, free. A role without `listIndexes` (made
    /// before this version) answers false until this process sees such a task.
    pub async fn workflows_in_use(self) -> Result<bool> {
        let made = &self.state.limit_indexes.0[LimitIndex::Workflows as usize];
        if made.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let names = match self.collection(TASKS).list_index_names().await {
            Ok(names) => names,
            Err(e) if crate::driver_error::refusal(&e).is_some() || is_unauthorized(&e) => {
                tracing::debug!(error = %e, "cannot list the tasks' indexes: workflows are in use once a waited-for task is seen");
                return Ok(false);
            }
            Err(e) => return Err(Error::mongo(format!("listing the indexes of {TASKS}"), e)),
        };
        let in_use = names.contains(&crate::conn::indexes::workflows_index_name());
        if in_use {
            made.store(true, Ordering::Relaxed);
        }
        Ok(in_use)
    }

    /// This process has seen a task others wait for: workflows are in use here.
    pub fn note_workflows_in_use(self) {
        self.state.limit_indexes.0[LimitIndex::Workflows as usize].store(true, Ordering::Relaxed);
    }

    /// The key slots held by `queue`'s claimed and running tasks. Not those of tasks waiting
    /// for a retry (whose slots the key index keeps from other claims anyway): a read by
    /// status takes the `{queue, status}` index, where one for the slot field (`$exists`) had
    /// SecantusDB read every task of the queue (0.9 against 11.5 ms at 1 000 queued).
    pub async fn held_key_slots(self, queue: ObjectId) -> Result<HeldKeys> {
        let context = format!("reading the key slots of queue {queue}");
        let running = [status::CLAIMED, status::RUNNING];
        let mut cursor = self
            .raw(TASKS)
            .find(doc! {task::QUEUE: queue, task::STATUS: {"$in": running.to_vec()}})
            .projection(doc! {task::ID: 0, task::CONCURRENCY_KEY: 1, task::CONCURRENCY_SLOT: 1})
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let mut held = HeldKeys::default();
        while let Some(raw) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(&context, e))?
        {
            let Ok(d) = disbatch_model::text::raw_doc::from_raw(&raw) else {
                continue;
            };
            let Some(slot) = d.get(task::CONCURRENCY_SLOT) else {
                continue;
            };
            let key = d.get(task::CONCURRENCY_KEY).cloned().unwrap_or(Bson::Null);
            let slot = crate::count_value(Some(slot));
            held.hold(&key, u32::try_from(slot).unwrap_or(u32::MAX));
        }
        Ok(held)
    }

    /// For each of `keys`, the `_id` of the oldest queued task of `queue` whose `path` holds
    /// it, delayed or not: in an ordered queue only that one may start.
    pub async fn oldest_queued_by_key(
        self,
        queue: ObjectId,
        path: &str,
        keys: &[Bson],
    ) -> Result<HashMap<String, ObjectId>> {
        let context = format!("reading the oldest task of each key in queue {queue}");
        let mut cursor = self
            .raw(TASKS)
            .aggregate([
                doc! {"$match": {task::QUEUE: queue, task::STATUS: status::QUEUED, path: {"$in": keys}}},
                doc! {"$group": {"_id": format!("${path}"), "first": {"$min": format!("${}", task::ID)}}},
            ])
            .await
            .map_err(|e| Error::mongo(&context, e))?;
        let mut oldest = HashMap::new();
        while let Some(d) = cursor
            .try_next()
            .await
            .map_err(|e| Error::mongo(&context, e))?
        {
            let d: Document = d;
            if let Ok(first) = d.get_object_id("first") {
                let key = d.get("_id").cloned().unwrap_or(Bson::Null);
                oldest.insert(key_text(&key), first);
            }
        }
        Ok(oldest)
    }
}

/// The server refused the command for want of a privilege (code 13).
fn is_unauthorized(e: &mongodb::error::Error) -> bool {
    matches!(e.kind.as_ref(), mongodb::error::ErrorKind::Command(c) if c.code == 13)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_slots_and_full_keys_follow_what_is_held() {
        let mut h = HeldKeys::default();
        let a = Bson::from("a");
        h.hold(&a, 0);
        h.hold(&a, 2);
        assert_eq!(h.free_slot(&a, 3, &[], 0), Some(1));
        assert_eq!(h.free_slot(&a, 3, &[1], 0), None);
        assert_eq!(h.free_slot(&Bson::from("b"), 2, &[], 0), Some(0));
        assert_eq!(h.free_slot(&Bson::from("b"), 2, &[0], 0), Some(1));
        // From a later place, round to the start.
        assert_eq!(h.free_slot(&Bson::from("b"), 4, &[], 2), Some(2));
        assert_eq!(h.free_slot(&Bson::from("b"), 4, &[2, 3], 2), Some(0));
        assert_eq!(h.free_slot(&a, 3, &[], 7), Some(1));
        assert_eq!(h.full_keys(2), vec![a.clone()]);
        assert!(h.full_keys(3).is_empty());
        assert_eq!(h.running(&a), 2);
        // A max lowered below what is held: the key is full.
        assert_eq!(h.full_keys(1), vec![a]);
    }
}
