//! Work units: tasks with a key unique in their queue, added or updated as the caller asks.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use super::schema::{task, TASKS};
use super::Store;
use crate::error::{Error, Result};
use crate::model::status;

/// A unit to add: its key, its params (Coordinate's data), and optional scheduling fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub key: String,
    pub params: Document,
    /// Coordinate's priorities are floats: 2.7 is stored and ordered as 2.7.
    pub priority: Option<f64>,
    pub not_before: Option<DateTime>,
}

/// What to do with a key the queue already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnConflict {
    Reject,
    /// Replace its params and requeue it, unless it is claimed or running: Coordinate changes
    /// a unit's data only when its attempt ends.
    Update,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct UnitsOutcome {
    pub inserted: Vec<(String, ObjectId)>,
    pub updated: Vec<String>,
    pub rejected: Vec<String>,
    /// Existing units left alone because they are claimed or running.
    pub busy: Vec<String>,
}

impl Store {
    pub async fn add_units(
        &self,
        queue: ObjectId,
        units: Vec<Unit>,
        on_conflict: OnConflict,
    ) -> Result<UnitsOutcome> {
        let now = DateTime::now();
        let ids: Vec<ObjectId> = units.iter().map(|_| ObjectId::new()).collect();
        let docs: Vec<Document> = units
            .iter()
            .zip(&ids)
            .map(|(u, id)| {
                let mut d = doc! {
                    task::ID: *id, task::QUEUE: queue, task::KEY: &u.key, task::STATUS: status::QUEUED,
                    task::NODE: Bson::Null, task::PARAMS: u.params.clone(), task::CTIME: now, task::MTIME: now,
                    task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
                };
                if let Some(p) = u.priority {
                    d.insert(task::PRIORITY, priority_value(p));
                }
                if let Some(nb) = u.not_before {
                    d.insert(task::NOT_BEFORE, nb);
                }
                d
            })
            .collect();
        // Unordered: every new key goes in even when some already exist.
        let duplicates: Vec<usize> = match self
            .collection(TASKS)
            .insert_many(docs)
            .ordered(false)
            .await
        {
            Ok(_) => Vec::new(),
            Err(e) => match e.kind.as_ref() {
                mongodb::error::ErrorKind::InsertMany(m)
                    if m.write_concern_error.is_none()
                        && m.write_errors
                            .as_ref()
                            .is_some_and(|w| w.iter().all(|w| w.code == 11000)) =>
                {
                    m.write_errors.iter().flatten().map(|w| w.index).collect()
                }
                _ => return Err(Error::mongo(format!("adding units to queue {queue}"), e)),
            },
        };
        let created = super::Moved {
            n: (ids.len() - duplicates.len()) as u64,
            ..super::Moved::new(queue, None, Some(super::StatusGroup::Queued))
        };
        self.count_moves(&[created]).await;
        let mut out = UnitsOutcome::default();
        for (i, (unit, id)) in units.into_iter().zip(ids).enumerate() {
            if !duplicates.contains(&i) {
                out.inserted.push((unit.key, id));
            } else if on_conflict == OnConflict::Reject {
                out.rejected.push(unit.key);
            } else if self.requeue_unit(queue, &unit).await? {
                out.updated.push(unit.key);
            } else {
                out.busy.push(unit.key);
            }
        }
        Ok(out)
    }

    /// New params for an existing unit, back to queued; false when it is claimed or running.
    async fn requeue_unit(&self, queue: ObjectId, unit: &Unit) -> Result<bool> {
        let mut set = doc! {
            task::PARAMS: unit.params.clone(), task::STATUS: status::QUEUED, task::NODE: Bson::Null,
            task::STDOUT: Bson::Null, task::STDERR: Bson::Null, task::MTIME: DateTime::now(),
        };
        let mut unset = doc! {task::COMPLETE: "", task::SLOT: ""};
        match unit.priority {
            Some(p) => set.insert(task::PRIORITY, priority_value(p)),
            None => unset.insert(task::PRIORITY, ""),
        };
        match unit.not_before {
            Some(nb) => set.insert(task::NOT_BEFORE, nb),
            None => unset.insert(task::NOT_BEFORE, ""),
        };
        let filter = doc! {
            task::QUEUE: queue, task::KEY: &unit.key,
            task::STATUS: {"$nin": [status::CLAIMED, status::RUNNING]},
        };
        self.update_one_counted(
            filter,
            doc! {"$set": set, "$unset": unset},
            Some(super::StatusGroup::Queued),
        )
        .await
        .map_err(|e| Error::mongo(format!("updating unit {} of queue {queue}", unit.key), e))
    }
}

/// A whole priority is stored as an integer, as before priorities could be fractions, so
/// documents and API replies keep showing `5`, not `5.0`; others as a double.
fn priority_value(p: f64) -> Bson {
    if p.fract() == 0.0 && p.abs() < 9.0e15 {
        Bson::Int64(p as i64)
    } else {
        Bson::Double(p)
    }
}
