//! Queues: reading queue documents (parsed by `model::queue`) and writing them; in its files, the API's
//! views, work signals, change streams, schedules and the balancer's lease.

domain_handle!(
    /// Queues: their documents, work signals, change streams, schedules and the balancer's lease.
    QueueStore,
    queues
);

pub(crate) mod balance;
pub(crate) mod balance_lease;
pub(crate) mod schedules;
pub(crate) mod signals;
pub(crate) mod views;
pub(crate) mod watch;

use bson::oid::ObjectId;
use bson::{doc, Bson};

use crate::error::{Error, Result};
use disbatch_model::fleet_time;
use disbatch_model::queue::parse_queue;
use disbatch_model::schema::{queue, QUEUES};
use disbatch_model::Queue;

impl QueueStore<'_> {
    /// All queues in natural order. A document without an ObjectId `_id` or that cannot be
    /// decoded is reported, not fatal: the others are served.
    pub async fn list_queues(self) -> Result<(Vec<Queue>, Vec<String>)> {
        let cursor = self
            .raw(QUEUES)
            .find(doc! {})
            .await
            .map_err(|e| Error::mongo("listing queues", e))?;
        let mut queues = Vec::new();
        let mut problems = Vec::new();
        for d in self.read_all(QUEUES, cursor, "listing queues").await? {
            match parse_queue(&d) {
                Ok(q) => queues.push(q),
                Err(message) => problems.push(message),
            }
        }
        Ok((queues, problems))
    }

    pub async fn queue_by_id(self, id: ObjectId) -> Result<Option<Queue>> {
        let found = self
            .raw(QUEUES)
            .find_one(doc! {queue::ID: id})
            .await
            .map_err(|e| Error::mongo(format!("reading queue {id}"), e))?;
        self.decode_one(QUEUES, found)?
            .map(|d| parse_queue(&d))
            .transpose()
            .map_err(|message| Error::BadDocument {
                collection: QUEUES,
                id: id.to_hex(),
                message,
            })
    }
}

impl QueueStore<'_> {
    /// Creates a queue document in Disbatch's shape; a duplicate name is refused by the
    /// unique index (call `ensure_indexes` first).
    pub async fn create_queue(
        self,
        name: &str,
        plugin: &str,
        threads: Option<u32>,
        sort: Option<&str>,
    ) -> Result<ObjectId> {
        let id = ObjectId::new();
        let mut d = doc! {queue::ID: id, queue::NAME: name, queue::PLUGIN: plugin};
        if let Some(t) = threads {
            d.insert(queue::THREADS, t as i64);
        }
        if let Some(s) = sort {
            d.insert(queue::SORT, s);
        }
        self.collection(QUEUES)
            .insert_one(d)
            .await
            .map_err(|e| Error::mongo(format!("creating queue {name}"), e))?;
        Ok(id)
    }
}

impl QueueStore<'_> {
    /// Takes the turn to make a continuous queue's next synthetic task: true for exactly one
    /// caller per interval, however many nodes ask (the database decides).
    pub async fn take_continuous_turn(
        self,
        id: ObjectId,
        interval: std::time::Duration,
    ) -> Result<bool> {
        let now = fleet_time::now();
        // saturating: a huge interval means "not again", not an overflow.
        let millis = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
        let next = bson::DateTime::from_millis(now.timestamp_millis().saturating_add(millis));
        let filter = doc! {
            queue::ID: id,
            "$or": [{queue::NEXT_CONTINUOUS: Bson::Null}, {queue::NEXT_CONTINUOUS: {"$lte": now}}],
        };
        self.collection(QUEUES)
            .update_one(filter, doc! {"$set": {queue::NEXT_CONTINUOUS: next}})
            .await
            .map(|r| r.modified_count == 1)
            .map_err(|e| Error::mongo(format!("taking the continuous turn of queue {id}"), e))
    }
}
