//! Work units: tasks with a key unique in their queue, added or updated as the caller asks.

use crate::WorkflowStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::claims::candidates::release_holds;
use crate::error::{Error, Result};
use crate::tasks::unique::{contended, stamp_unique_key, Fate, Turn, TRIES};
use crate::{Store, Waits};
use disbatch_model::fleet_time;
use disbatch_model::limits::Unique;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::status;
use disbatch_model::task::Unit;
use disbatch_model::workflow::OnDependencyFailure;

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
    /// Units of a queue with `unique` not added (or not updated) because another task holds
    /// their unique key: the unit's key and that task's id.
    pub duplicates: Vec<(String, ObjectId)>,
}

impl WorkflowStore<'_> {
    pub async fn add_units(
        self,
        queue: ObjectId,
        units: Vec<Unit>,
        on_conflict: OnConflict,
    ) -> Result<UnitsOutcome> {
        self.add_waiting_units(queue, units, &[], on_conflict).await
    }

    /// `add_units`, unit `i` waiting for `waits[i]` (missing or empty: for nothing). What a
    /// unit waits for is set when it is inserted; an update does not change it.
    pub async fn add_waiting_units(
        self,
        queue: ObjectId,
        units: Vec<Unit>,
        waits: &[Waits],
        on_conflict: OnConflict,
    ) -> Result<UnitsOutcome> {
        let unique = self.unique_of(queue).await?;
        let (deps, default_policy) = self
            .prepare_dependencies(queue, waits, unique.is_some())
            .await?;
        let now = fleet_time::now();
        let ids: Vec<ObjectId> = units.iter().map(|_| ObjectId::new()).collect();
        let mut docs = unit_documents(queue, &units, waits, &ids, now, default_policy);
        if let Some(unique) = &unique {
            for (d, u) in docs.iter_mut().zip(&units) {
                stamp_unique_key(unique, d)
                    .map_err(|why| Error::Invalid(format!("unit {:?}: {why}", u.key)))?;
            }
        }
        let held = match &unique {
            Some(unique) => self.place_unique(queue, unique, &mut docs).await?,
            None => vec![None; docs.len()],
        };
        let skipped: Vec<bool> = held.iter().map(Option::is_some).collect();
        // Unordered: every new key goes in even when some already exist.
        let went_in = self
            .insert_unordered(&docs, &skipped, &format!("adding units to queue {queue}"))
            .await?;
        let mut out = UnitsOutcome::default();
        let mut created = 0;
        let mut blocked = 0;
        let each = units.into_iter().zip(&docs).zip(went_in).zip(ids).zip(held);
        for ((((unit, d), went_in), id), held) in each {
            if went_in {
                match d.get(task::WAITING_ON) {
                    Some(_) => blocked += 1,
                    None => created += 1,
                }
                out.inserted.push((unit.key, id));
                continue;
            }
            // A unit whose key the queue already has is that unit's to settle (reject or
            // update) before its unique key is looked at: re-adding a unit is no duplicate.
            if let (Some(unique), Some(_)) = (&unique, d.get(task::UNIQUE_KEY)) {
                let same_key = doc! {task::QUEUE: queue, task::KEY: &unit.key};
                if !self.unit_exists(queue, &unit.key).await? {
                    let fate = match held {
                        Some(holder) => Fate::Duplicate(holder),
                        None => self.settle_unique(queue, unique, d, Some(same_key)).await?,
                    };
                    match fate {
                        Fate::New => {
                            created += 1;
                            out.inserted.push((unit.key, id));
                            continue;
                        }
                        Fate::Duplicate(holder) => {
                            out.duplicates.push((unit.key, holder));
                            continue;
                        }
                        Fate::OtherIndex => {}
                    }
                }
            }
            if on_conflict == OnConflict::Reject {
                out.rejected.push(unit.key);
                continue;
            }
            // The unit takes the unique key its new params give; without a value at the
            // queue's unique key path (null), it holds none.
            let change = unique.as_ref().map(|u| {
                let value = d.get(task::UNIQUE_KEY).cloned().unwrap_or(Bson::Null);
                (u, value)
            });
            match self.requeue_unit(queue, &unit, change).await? {
                Requeue::Done => out.updated.push(unit.key),
                Requeue::Busy => out.busy.push(unit.key),
                Requeue::Duplicate(holder) => out.duplicates.push((unit.key, holder)),
            }
        }
        if created > 0 {
            let created = crate::Moved {
                n: created,
                ..crate::Moved::new(queue, None, Some(crate::StatusGroup::Queued))
            };
            self.count_moves(&[created]).await;
        }
        if blocked > 0 {
            let blocked = crate::Moved {
                n: blocked,
                ..crate::Moved::new(queue, None, Some(crate::StatusGroup::Blocked))
            };
            self.count_moves(&[blocked]).await;
        }
        // A dependency may have ended before the new units were there to see it.
        self.settle_dependents(&deps).await?;
        Ok(out)
    }
}

impl Store {
    /// The tasks `waits` names, each once, after checking they exist and marking them as
    /// waited for (with the workflows' index made); and the queue's `on_dependency_failure`
    /// for units that name none. A queue with `unique` takes no waiting units.
    async fn prepare_dependencies(
        &self,
        queue: ObjectId,
        waits: &[Waits],
        unique: bool,
    ) -> Result<(Vec<ObjectId>, OnDependencyFailure)> {
        let deps: Vec<ObjectId> = {
            let mut seen = std::collections::HashSet::new();
            waits
                .iter()
                .flat_map(|w| w.depends_on.iter().copied())
                .filter(|id| seen.insert(*id))
                .collect()
        };
        if !deps.is_empty() {
            if unique {
                return Err(Error::Invalid(
                    "depends_on: units of a queue with `unique` cannot wait for others (a duplicate would not wait)".into(),
                ));
            }
            self.check_tasks_exist(&deps, "depends_on").await?;
            self.limits()
                .ensure_limit_index(crate::LimitIndex::Workflows)
                .await?;
            self.mark_dependencies(&deps).await?;
        }
        let default_policy = match waits.iter().any(|w| w.on_failure.is_none()) && !deps.is_empty()
        {
            true => self.workflows().dependency_policy_of(queue).await?,
            false => Default::default(),
        };
        Ok((deps, default_policy))
    }

    async fn unit_exists(&self, queue: ObjectId, key: &str) -> Result<bool> {
        self.collection(TASKS)
            .find_one(doc! {task::QUEUE: queue, task::KEY: key})
            .projection(doc! {task::ID: 1})
            .await
            .map(|d| d.is_some())
            .map_err(|e| Error::mongo(format!("reading unit {key} of queue {queue}"), e))
    }

    /// New params for an existing unit, back to queued; Busy when it is claimed or running.
    /// For a queue with `unique`, `unique` gives its setting and the unit's new key value
    /// (null: none): the unit takes that key, unless another task holds it.
    async fn requeue_unit(
        &self,
        queue: ObjectId,
        unit: &Unit,
        unique: Option<(&Unique, Bson)>,
    ) -> Result<Requeue> {
        let mut set = doc! {
            task::PARAMS: unit.params.clone(), task::STATUS: status::QUEUED, task::NODE: Bson::Null,
            task::STDOUT: Bson::Null, task::STDERR: Bson::Null, task::MTIME: fleet_time::now(),
        };
        let mut unset = release_holds(&[task::COMPLETE]);
        match unit.priority {
            Some(p) => set.insert(task::PRIORITY, priority_value(p)),
            None => unset.insert(task::PRIORITY, ""),
        };
        match unit.not_before {
            Some(nb) => set.insert(task::NOT_BEFORE, nb),
            None => unset.insert(task::NOT_BEFORE, ""),
        };
        // A waiting unit is left alone too: queued again, it would start before what it
        // waits for has ended.
        let filter = doc! {
            task::QUEUE: queue, task::KEY: &unit.key,
            task::STATUS: {"$nin": [status::CLAIMED, status::RUNNING, status::BLOCKED]},
        };
        let context = || format!("updating unit {} of queue {queue}", unit.key);
        let mut floor = 0;
        for _ in 0..TRIES {
            let (mut set, mut unset) = (set.clone(), unset.clone());
            match &unique {
                None => {}
                Some((_, Bson::Null)) => {
                    unset.insert(task::UNIQUE_KEY, "");
                    unset.insert(task::UNIQUE_GEN, "");
                }
                Some((u, value)) => match self
                    .next_turn(queue, u, value, floor, Some(&unit.key))
                    .await?
                {
                    Turn::Held(holder) => return Ok(Requeue::Duplicate(holder)),
                    Turn::Own => {}
                    Turn::Gen(gen) => {
                        set.insert(task::UNIQUE_KEY, value.clone());
                        set.insert(task::UNIQUE_GEN, gen);
                        floor = gen.saturating_add(1);
                    }
                },
            }
            match self
                .update_one_counted(
                    filter.clone(),
                    doc! {"$set": set, "$unset": unset},
                    Some(crate::StatusGroup::Queued),
                )
                .await
            {
                Ok(true) => return Ok(Requeue::Done),
                Ok(false) => return Ok(Requeue::Busy),
                // Only the unique key can collide: the unit keeps its own key and no slot.
                Err(e) if crate::driver_error::is_duplicate_key(&e) && unique.is_some() => {}
                Err(e) => return Err(Error::mongo(context(), e)),
            }
        }
        match &unique {
            Some((unique, value)) => Err(contended(queue, unique, value)),
            None => Err(Error::Invalid(context())),
        }
    }
}

/// What became of an existing unit asked to take new params.
enum Requeue {
    Done,
    /// Claimed or running: Coordinate changes a unit's data only when its attempt ends.
    Busy,
    /// Another task holds the unique key the new params give: the unit is left as it was.
    Duplicate(ObjectId),
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

/// The new tasks of `units` (with `ids`): queued, or blocked on what `waits` names.
fn unit_documents(
    queue: ObjectId,
    units: &[Unit],
    waits: &[Waits],
    ids: &[ObjectId],
    now: DateTime,
    default_policy: OnDependencyFailure,
) -> Vec<Document> {
    units
        .iter()
        .zip(ids)
        .enumerate()
        .map(|(i, (u, id))| {
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
            if let Some(w) = waits.get(i).filter(|w| !w.depends_on.is_empty()) {
                d.insert(task::STATUS, status::BLOCKED);
                d.insert(task::DEPENDS_ON, &w.depends_on);
                d.insert(task::WAITING_ON, &w.depends_on);
                d.insert(task::ON_DEPENDENCY_FAILURE, w.on_failure.unwrap_or(default_policy).name());
            }
            d
        })
        .collect()
}
