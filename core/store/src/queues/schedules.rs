//! Cron schedules in the database: the scheduled queues, one task per tick (unique per queue
//! and tick), and each queue's record of the newest tick settled.

use crate::QueueStore;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};

use crate::error::{Error, Result};
use crate::{Moved, StatusGroup};
use disbatch_model::fleet_time;
use disbatch_model::schema::{queue, task, QUEUES, TASKS};
use disbatch_model::status;

impl QueueStore<'_> {
    /// Makes sure the schedules' unique index exists (`indexes::schedule_index`): the leader
    /// calls it before its first scheduled task. Creating an index that exists is a no-op.
    pub async fn ensure_schedule_index(self) -> Result<()> {
        self.collection(TASKS)
            .create_index(crate::conn::indexes::schedule_index())
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo(format!("creating the schedules' index on {TASKS}"), e))
    }

    /// The queue documents with a `schedule`, read now (not from a reading that may predate a
    /// pause or the leader's last settled tick). Undecodable ones are reported and left out.
    pub async fn scheduled_queues(self) -> Result<Vec<Document>> {
        let context = "listing the scheduled queues";
        let cursor = self
            .raw(QUEUES)
            .find(doc! {queue::SCHEDULE: {"$exists": true, "$ne": Bson::Null}})
            .await
            .map_err(|e| Error::mongo(context, e))?;
        self.read_all(QUEUES, cursor, context).await
    }

    /// Starts a schedule afresh for `basis` (a new one, or one whose pattern, zone or policy
    /// changed): settled through `now`, so no tick before it is owed. False when the queue
    /// already counts for `basis` (another leader started it) or is gone. `unreadable`: it
    /// counts for `basis` but its `schedule_last` is not a date (edited by hand), restarted too.
    pub async fn start_schedule(
        self,
        id: ObjectId,
        basis: &str,
        now: DateTime,
        unreadable: bool,
    ) -> Result<bool> {
        let filter = match unreadable {
            true => doc! {queue::ID: id, queue::SCHEDULE_BASIS: basis},
            false => doc! {queue::ID: id, queue::SCHEDULE_BASIS: {"$ne": basis}},
        };
        self.collection(QUEUES)
            .update_one(
                filter,
                doc! {"$set": {queue::SCHEDULE_BASIS: basis, queue::SCHEDULE_LAST: now}},
            )
            .await
            .map(|r| r.modified_count == 1)
            .map_err(|e| Error::mongo(format!("starting the schedule of queue {id}"), e))
    }

    /// Moves the queue's newest settled tick forward to `through` (never back: two leaders
    /// may settle out of order), if it still counts for `basis`.
    pub async fn settle_schedule(self, id: ObjectId, basis: &str, through: DateTime) -> Result<()> {
        self.collection(QUEUES)
            .update_one(
                doc! {queue::ID: id, queue::SCHEDULE_BASIS: basis},
                doc! {"$max": {queue::SCHEDULE_LAST: through}},
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo(format!("settling the schedule of queue {id}"), e))
    }

    /// Queues the task of one tick, in Disbatch 4's creation shape plus `schedule_tick`
    /// (and, for the one task standing for missed ticks, how many). False when the queue has
    /// that tick's task already: the unique index refused it, whoever made the first.
    pub async fn insert_scheduled_task(
        self,
        id: ObjectId,
        tick: DateTime,
        params: &Document,
        missed_ticks: Option<u64>,
    ) -> Result<bool> {
        let now = fleet_time::now();
        let mut d = doc! {
            task::ID: ObjectId::new(), task::QUEUE: id, task::STATUS: status::QUEUED,
            task::NODE: Bson::Null, task::PARAMS: params.clone(), task::CTIME: now,
            task::MTIME: now, task::STDOUT: Bson::Null, task::STDERR: Bson::Null,
            task::SCHEDULE_TICK: tick,
        };
        if let Some(n) = missed_ticks {
            d.insert(
                task::SCHEDULE_MISSED_TICKS,
                i64::try_from(n).unwrap_or(i64::MAX),
            );
        }
        match self.collection(TASKS).insert_one(d).await {
            Ok(_) => {
                self.count_moves(&[Moved::new(id, None, Some(StatusGroup::Queued))])
                    .await;
                Ok(true)
            }
            Err(e) if crate::driver_error::is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(Error::mongo(
                format!("queueing the scheduled task of queue {id} for {tick}"),
                e,
            )),
        }
    }
}
