//! Unique tasks: the key our code stamps on new tasks of a queue with `unique`, and which task holds each key.
//
// Each key value has a line of tasks, `unique_gen` 0, 1, 2, …; the unique index on {queue,
// unique_key, unique_gen} lets one creator insert each generation, so concurrent creators get
// exactly one task and every other creator reads it back. The newest generation holds the
// key while it is in `states` or within `for_s` of its `ctime`; once it no longer holds, the
// next creator inserts the next generation. No write ever frees an index entry, which matters:
// SecantusDB 0.5.3 keeps an inserted document's entry after `$unset` of the field. Tasks
// inserted straight into MongoDB without `unique_key` (by ops, by Perl tools) are not
// constrained and hold no key.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::fleet_time;
use disbatch_model::limits::{self, Unique};
use disbatch_model::schema::{queue, task, QUEUES, TASKS};

/// Writes one creation tries before giving up: each failed try means another creator wrote
/// the key's next generation in between, so eight in a row is a storm on one key.
pub(crate) const TRIES: usize = 8;

/// What became of a task the unique index refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Inserted after all, as the key's next generation.
    New,
    /// A task that holds the key: the input is a duplicate of it.
    Duplicate(ObjectId),
    /// Refused by another unique index (a work unit's key); the caller's to settle.
    OtherIndex,
}

/// Who may write a key next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// The writer, as this generation.
    Gen(i64),
    /// Nobody: this task holds the key.
    Held(ObjectId),
    /// The work unit asking is itself the key's newest task: it keeps its place.
    Own,
}

/// A key's newest task as read: enough to judge whether it holds the key.
#[derive(Debug, Clone, PartialEq)]
struct Holder {
    id: ObjectId,
    status: Bson,
    ctime: Bson,
    gen: i64,
    /// Its work-unit key, if it is a unit.
    unit: Option<String>,
}

impl Store {
    /// The queue's `unique` as it stands now (None for a queue without one, or no queue):
    /// read on every creation, so a changed setting applies to the next task created.
    pub(crate) async fn unique_of(&self, queue_id: ObjectId) -> Result<Option<Unique>> {
        let found = self
            .collection(QUEUES)
            .find_one(doc! {queue::ID: queue_id})
            .projection(doc! {queue::UNIQUE: 1})
            .await
            .map_err(|e| Error::mongo(format!("reading queue {queue_id}"), e))?;
        let Some(d) = found else { return Ok(None) };
        let unique =
            unique_setting(&d).map_err(|m| Error::Invalid(format!("queue {queue_id}: {m}")))?;
        if unique.is_some() {
            self.limits()
                .ensure_limit_index(crate::LimitIndex::Unique)
                .await?;
        }
        Ok(unique)
    }

    /// Readies stamped documents to insert, reading each key's newest task in one aggregate:
    /// per doc, the task that holds its key (the doc is a duplicate of it and is not to be
    /// inserted), or None after setting the doc's `unique_gen` to the key's next generation.
    pub(crate) async fn place_unique(
        &self,
        queue_id: ObjectId,
        unique: &Unique,
        docs: &mut [Document],
    ) -> Result<Vec<Option<ObjectId>>> {
        let values: Vec<Bson> = docs
            .iter()
            .filter_map(|d| d.get(task::UNIQUE_KEY).cloned())
            .collect();
        let mut newest = HashMap::new();
        if !values.is_empty() {
            let pipeline = vec![
                doc! {"$match": {task::QUEUE: queue_id, task::UNIQUE_KEY: {"$in": values}}},
                doc! {"$sort": {task::UNIQUE_GEN: -1}},
                doc! {"$group": {
                    "_id": format!("${}", task::UNIQUE_KEY),
                    HOLDER: {"$first": format!("${}", task::ID)},
                    task::STATUS: {"$first": format!("${}", task::STATUS)},
                    task::CTIME: {"$first": format!("${}", task::CTIME)},
                    task::UNIQUE_GEN: {"$first": format!("${}", task::UNIQUE_GEN)},
                }},
            ];
            let context = format!("reading the holders of unique keys in queue {queue_id}");
            for group in self.aggregate_all(TASKS, pipeline, &context).await? {
                let holder = read_holder(&group, HOLDER);
                if let (Some(value), Some(holder)) = (group.get("_id"), holder) {
                    newest.insert(key_bytes(value), holder);
                }
            }
        }
        let now = fleet_time::now();
        let mut held = Vec::with_capacity(docs.len());
        for d in docs.iter_mut() {
            let Some(value) = d.get(task::UNIQUE_KEY) else {
                held.push(None);
                continue;
            };
            held.push(match newest.get(&key_bytes(value)) {
                Some(h) if still_holds(unique, h, now) => Some(h.id),
                Some(h) => {
                    d.insert(task::UNIQUE_GEN, h.gen.saturating_add(1));
                    None
                }
                None => {
                    d.insert(task::UNIQUE_GEN, 0_i64);
                    None
                }
            });
        }
        Ok(held)
    }

    /// Inserts `docs` but the `skipped` ones, unordered: every one that can goes in. Returns
    /// per doc whether it went in; a doc refused by a unique index, or held back as the repeat
    /// of an earlier doc's `unique_key` (the first of a request wins, whatever order the
    /// server writes in), did not. Any other failure is an error.
    pub(crate) async fn insert_unordered(
        &self,
        docs: &[Document],
        skipped: &[bool],
        context: &str,
    ) -> Result<Vec<bool>> {
        let repeats = repeated_keys(docs, skipped);
        let sent: Vec<usize> = (0..docs.len())
            .filter(|&i| !repeats[i] && !skipped.get(i).copied().unwrap_or(false))
            .collect();
        let mut went_in = vec![false; docs.len()];
        if sent.is_empty() {
            return Ok(went_in);
        }
        let refused: HashSet<usize> = match self
            .collection(TASKS)
            .insert_many(sent.iter().map(|&i| &docs[i]))
            .ordered(false)
            .await
        {
            Ok(_) => HashSet::new(),
            Err(e) => match e.kind.as_ref() {
                mongodb::error::ErrorKind::InsertMany(m)
                    if m.write_concern_error.is_none()
                        && m.write_errors
                            .as_ref()
                            .is_some_and(|w| w.iter().all(|w| w.code == 11000)) =>
                {
                    m.write_errors.iter().flatten().map(|w| w.index).collect()
                }
                // A server may answer a refusal as the command's own error, not per document
                // (SecantusDB does for an index entry no document shows): which went in is
                // then read back.
                _ if crate::driver_error::is_duplicate_key(&e) => {
                    let ids: Vec<Bson> = sent
                        .iter()
                        .filter_map(|&i| docs[i].get(task::ID).cloned())
                        .collect();
                    let stored = self.stored_ids(ids, context).await?;
                    sent.iter()
                        .enumerate()
                        .filter(|(_, &i)| {
                            docs[i].get(task::ID).is_none_or(|id| !stored.contains(id))
                        })
                        .map(|(at, _)| at)
                        .collect()
                }
                _ => return Err(Error::mongo(context.to_string(), e)),
            },
        };
        for (at, &i) in sent.iter().enumerate() {
            went_in[i] = !refused.contains(&at);
        }
        Ok(went_in)
    }

    /// Which of `ids` are stored tasks.
    async fn stored_ids(&self, ids: Vec<Bson>, context: &str) -> Result<Vec<Bson>> {
        let found = self
            .collection(TASKS)
            .find(doc! {task::ID: {"$in": ids}})
            .projection(doc! {task::ID: 1})
            .await
            .map_err(|e| Error::mongo(context.to_string(), e))?;
        let found: Vec<Document> = futures::TryStreamExt::try_collect(found)
            .await
            .map_err(|e| Error::mongo(context.to_string(), e))?;
        Ok(found
            .into_iter()
            .filter_map(|d| d.get(task::ID).cloned())
            .collect())
    }

    /// Settles a stamped task that did not go in (refused, or a repeat held back): the key's
    /// holder, or the task inserted as the key's next generation. `other` finds the task that
    /// blocks it on another unique index (a work unit's key): a refusal with that task
    /// present is `OtherIndex`.
    pub(crate) async fn settle_unique(
        &self,
        queue_id: ObjectId,
        unique: &Unique,
        new: &Document,
        other: Option<Document>,
    ) -> Result<Fate> {
        let value = new.get(task::UNIQUE_KEY).cloned().unwrap_or(Bson::Null);
        let mut doc = new.clone();
        // It did not go in as the generation it carries: that one is taken.
        let mut floor = match new.get(task::UNIQUE_GEN) {
            Some(Bson::Int64(g)) => g.saturating_add(1),
            _ => 0,
        };
        for _ in 0..TRIES {
            match self
                .next_turn(queue_id, unique, &value, floor, None)
                .await?
            {
                Turn::Held(holder) => return Ok(Fate::Duplicate(holder)),
                Turn::Gen(gen) => {
                    doc.insert(task::UNIQUE_GEN, gen);
                    // A refusal at `gen` means it is taken, even by an index entry no task
                    // shows any more; the next try goes past it.
                    floor = gen.saturating_add(1);
                }
                // Only a unit asking about itself is told this; a new task is no unit yet.
                Turn::Own => {}
            }
            match self.collection(TASKS).insert_one(&doc).await {
                Ok(_) => return Ok(Fate::New),
                Err(e) if crate::driver_error::is_duplicate_key(&e) => {
                    if let Some(filter) = &other {
                        if self.exists(filter.clone()).await? {
                            return Ok(Fate::OtherIndex);
                        }
                    }
                }
                Err(e) => {
                    return Err(Error::mongo(
                        format!("inserting a unique task into queue {queue_id}"),
                        e,
                    ))
                }
            }
        }
        Err(contended(queue_id, unique, &value))
    }

    /// Who may write `value` next: the holder if the key's newest task still holds it, else
    /// the writer as the next generation (at least `floor`). `unit`: the work unit asking,
    /// which may itself be the newest task.
    pub(crate) async fn next_turn(
        &self,
        queue_id: ObjectId,
        unique: &Unique,
        value: &Bson,
        floor: i64,
        unit: Option<&str>,
    ) -> Result<Turn> {
        // By queue and key, the index's own order: SecantusDB misses documents on a partial
        // index's later fields alone.
        let found = self
            .collection(TASKS)
            .find_one(doc! {task::QUEUE: queue_id, task::UNIQUE_KEY: value.clone()})
            .sort(doc! {task::UNIQUE_GEN: -1})
            .projection(doc! {
                task::ID: 1, task::STATUS: 1, task::CTIME: 1, task::UNIQUE_GEN: 1, task::KEY: 1,
            })
            .await
            .map_err(|e| {
                Error::mongo(
                    format!("reading the holder of a unique key in queue {queue_id}"),
                    e,
                )
            })?;
        let Some(newest) = found.as_ref().and_then(|d| read_holder(d, task::ID)) else {
            return Ok(Turn::Gen(floor));
        };
        if unit.is_some() && newest.unit.as_deref() == unit {
            return Ok(Turn::Own);
        }
        if still_holds(unique, &newest, fleet_time::now()) {
            return Ok(Turn::Held(newest.id));
        }
        Ok(Turn::Gen(newest.gen.saturating_add(1).max(floor)))
    }

    async fn exists(&self, filter: Document) -> Result<bool> {
        self.collection(TASKS)
            .find_one(filter)
            .projection(doc! {task::ID: 1})
            .await
            .map(|d| d.is_some())
            .map_err(|e| Error::mongo("looking for a conflicting task", e))
    }
}

/// The error after `TRIES` rounds of losing the key to other writers.
pub(crate) fn contended(queue_id: ObjectId, unique: &Unique, value: &Bson) -> Error {
    Error::Invalid(format!(
        "queue {queue_id}: other tasks kept taking unique key {}={value} over {TRIES} tries; try again",
        unique.key
    ))
}

/// Reads a queue document's `unique` alone: a bad `rate_limit` or `concurrency` stops nodes
/// from serving the queue, not clients from creating its tasks.
fn unique_setting(queue_doc: &Document) -> std::result::Result<Option<Unique>, String> {
    let only = match queue_doc.get(queue::UNIQUE) {
        Some(v) => doc! {queue::UNIQUE: v.clone()},
        None => Document::new(),
    };
    limits::parse(&only).map(|l| l.unique)
}

/// Sets `unique_key` on a task document about to be stored, from the value at the queue's
/// key path in that very document. A task without a value there is not constrained. Err
/// (for a list) says what is wrong; the caller names the input.
pub(crate) fn stamp_unique_key(
    unique: &Unique,
    new: &mut Document,
) -> std::result::Result<Option<Bson>, String> {
    let value = limits::key_value(new, &unique.key)
        .map_err(|why| format!("{why} (the queue's unique.key names it)"))?;
    new.remove(task::UNIQUE_GEN);
    if value == Bson::Null {
        new.remove(task::UNIQUE_KEY);
        return Ok(None);
    }
    new.insert(task::UNIQUE_KEY, value.clone());
    Ok(Some(value))
}

/// Per doc: whether an earlier doc of the list, not skipped, carries the same `unique_key`.
pub(crate) fn repeated_keys(docs: &[Document], skipped: &[bool]) -> Vec<bool> {
    let mut seen = HashSet::new();
    docs.iter()
        .enumerate()
        .map(|(i, d)| match d.get(task::UNIQUE_KEY) {
            _ if skipped.get(i).copied().unwrap_or(false) => false,
            None => false,
            Some(v) => !seen.insert(key_bytes(v)),
        })
        .collect()
}

/// A key value as bytes that compare equal where the index compares equal for the keys
/// people use: numbers by value (1, 1.0 and 1 as Int64 are one key), anything else as its
/// BSON. Numbers inside sub-documents compare as encoded; the server still refuses what
/// it holds equal, and the creation settles then.
fn key_bytes(v: &Bson) -> Vec<u8> {
    let number = match v {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(f) => Some(*f),
        _ => None,
    };
    let v = match number {
        Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Bson::Int64(f as i64),
        Some(f) => Bson::Double(f),
        None => v.clone(),
    };
    bson::to_vec(&doc! {"k": v}).unwrap_or_default()
}

/// The holder's id in the aggregate's groups, whose `_id` is the key.
const HOLDER: &str = "holder";

/// A holder from a task as read (its id under `id_field`).
fn read_holder(d: &Document, id_field: &str) -> Option<Holder> {
    let gen = match d.get(task::UNIQUE_GEN) {
        Some(Bson::Int64(g)) => *g,
        Some(Bson::Int32(g)) => i64::from(*g),
        _ => 0,
    };
    Some(Holder {
        id: d.get_object_id(id_field).ok()?,
        status: d.get(task::STATUS).cloned().unwrap_or(Bson::Null),
        ctime: d.get(task::CTIME).cloned().unwrap_or(Bson::Null),
        gen,
        unit: d.get_str(task::KEY).ok().map(str::to_string),
    })
}

/// Whether the holder still holds its key at `now`, by the queue's current setting.
fn still_holds(unique: &Unique, holder: &Holder, now: DateTime) -> bool {
    let status = match holder.status {
        Bson::Int32(s) => Some(s),
        Bson::Int64(s) => i32::try_from(s).ok(),
        Bson::Double(s) if s.fract() == 0.0 && s.abs() < 1e9 => Some(s as i32),
        _ => None,
    };
    let age = created_ms(&holder.ctime).map(|ms| {
        // A ctime ahead of this clock (another host's) is as young as can be.
        Duration::from_millis(u64::try_from(now.timestamp_millis() - ms).unwrap_or(0))
    });
    unique.holds(status, age)
}

/// A `ctime` in milliseconds since the epoch: a date, or Disbatch 3's epoch seconds.
fn created_ms(ctime: &Bson) -> Option<i64> {
    match ctime {
        Bson::DateTime(t) => Some(t.timestamp_millis()),
        Bson::Double(s) if s.is_finite() => Some((s * 1000.0) as i64),
        Bson::Int32(s) => Some(i64::from(*s) * 1000),
        Bson::Int64(s) => s.checked_mul(1000),
        _ => None,
    }
}

#[cfg(test)]
#[path = "unique_tests.rs"]
mod tests;
