//! QueueBalance's queries: the lease that lets one DEN balance at a time, the loads of the
//! queues it balances, and its writes (queue `threads`, the balance document's status).

use crate::QueueStore;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};

use crate::driver_error::is_duplicate_key;
use crate::error::{Error, Result};
use crate::Store;
use disbatch_model::queue_balance::QueueState;
use disbatch_model::schema::{
    balance, lease, queue, task, BALANCE, LEASES, QUEUES, QUEUE_BALANCE_LEASE, TASKS,
};
use disbatch_model::{parse_limit, status};

impl QueueStore<'_> {
    /// Takes or renews the QueueBalance lease for `owner` until `now + duration`. False when
    /// another owner holds an unexpired lease. `now` is the fleet's time (`fleet_time`), the
    /// server's clock, so a node whose host clock is off judges the lease as the others do.
    pub async fn take_balance_lease(
        self,
        owner: &str,
        now: DateTime,
        duration: Duration,
    ) -> Result<bool> {
        self.take_lease(QUEUE_BALANCE_LEASE, owner, now, duration)
            .await
    }

    /// Lets the QueueBalance lease expire now if `owner` holds it (a stopping node hands over
    /// at once instead of after the lease runs out). True when it was held by `owner`.
    pub async fn release_balance_lease(self, owner: &str) -> Result<bool> {
        self.release_lease(QUEUE_BALANCE_LEASE, owner).await
    }

    /// The named queues that exist, each with its claimable (-2) and claimed or running (-1, 0)
    /// task counts. Only -2 is counted as queued: orphaned, cancelled, blocked and terminated
    /// tasks (≤ -3) are never claimed, so reserving threads for them would starve other queues.
    pub async fn balance_queue_states(self, names: &[String]) -> Result<Vec<QueueState>> {
        let cursor = self
            .raw(QUEUES)
            .find(doc! {queue::NAME: {"$in": names}})
            .await
            .map_err(|e| Error::mongo("reading the balanced queues", e))?;
        let docs = self
            .read_all(QUEUES, cursor, "reading the balanced queues")
            .await?;
        let states = docs.into_iter().filter_map(|d| {
            let name = d.get_str(queue::NAME).ok()?.to_string();
            let id = d.get(queue::ID)?.clone();
            Some((id, name, d))
        });
        futures::future::try_join_all(states.map(|(id, name, d)| async move {
            let threads = match parse_limit(d.get(queue::THREADS)) {
                Ok(t) => Some(i64::from(t.unwrap_or(0))),
                Err(_) => None,
            };
            let (queued, running) = futures::try_join!(
                self.count_for_balance(
                    doc! {task::QUEUE: id.clone(), task::STATUS: status::QUEUED}
                ),
                self.count_for_balance(doc! {
                    task::QUEUE: id.clone(),
                    task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
                }),
            )?;
            Ok(QueueState {
                paused: d.contains_key(queue::PAUSED_THREADS),
                id,
                name,
                threads,
                queued,
                running,
            })
        }))
        .await
    }

    /// Sets a balanced queue's `threads`, unless the queue is paused (a pause keeps `threads`
    /// at 0 and must not be undone by the balancer). False when nothing matched: paused or
    /// deleted since it was read.
    pub async fn set_balanced_threads(self, id: &Bson, threads: i64) -> Result<bool> {
        self.collection(QUEUES)
            .update_one(
                doc! {queue::ID: id.clone(), queue::PAUSED_THREADS: {"$exists": false}},
                doc! {"$set": {queue::THREADS: threads}},
            )
            .await
            .map(|r| r.matched_count == 1)
            .map_err(|e| Error::mongo(format!("setting threads of queue {id}"), e))
    }

    /// Records the balancer's health in the balance document (what `GET /monitoring` reads),
    /// creating the document in Disbatch's empty shape when there is none yet.
    pub async fn record_balance_status(
        self,
        status: &str,
        message: &str,
        timestamp: i64,
    ) -> Result<()> {
        self.collection(BALANCE)
            .update_one(
                doc! {},
                doc! {
                    "$set": {
                        balance::STATUS: status,
                        balance::MESSAGE: message,
                        balance::TIMESTAMP: timestamp,
                    },
                    "$setOnInsert": {balance::MAX_TASKS: {}, balance::QUEUES: []},
                },
            )
            .upsert(true)
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("writing the balance status", e))
    }

    /// Clears a `disabled` time that has passed, as Disbatch did. Only a numeric value at or
    /// before `now_secs` matches, so a new `disabled` set meanwhile through the DCI is kept.
    pub async fn clear_expired_balance_disabled(self, now_secs: i64) -> Result<()> {
        self.collection(BALANCE)
            .update_one(
                doc! {balance::DISABLED: {"$lte": now_secs}},
                doc! {"$set": {balance::DISABLED: Bson::Null}},
            )
            .await
            .map(|_| ())
            .map_err(|e| Error::mongo("clearing the balance document's disabled time", e))
    }
}

impl Store {
    /// Lets the named lease expire now if `owner` holds it; true when it did.
    pub(crate) async fn release_lease(&self, name: &str, owner: &str) -> Result<bool> {
        self.collection(LEASES)
            .update_one(
                doc! {lease::ID: name, lease::OWNER: owner},
                doc! {"$set": {lease::UNTIL: DateTime::from_millis(0)}},
            )
            .await
            .map(|r| r.matched_count == 1)
            .map_err(|e| Error::mongo(format!("releasing the {name} lease"), e))
    }

    /// One update: it matches when the lease is ours or has expired (or its `until` is missing
    /// or not a date, so a damaged lease cannot block everyone). When it does not match, the
    /// upsert tries to insert a second document with the same `_id` and the unique `_id` index
    /// refuses it: that refusal is the answer "someone else holds it". Two nodes racing for a
    /// missing lease end the same way, with one winner.
    pub(crate) async fn take_lease(
        &self,
        name: &str,
        owner: &str,
        now: DateTime,
        duration: Duration,
    ) -> Result<bool> {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        let until = DateTime::from_millis(now.timestamp_millis().saturating_add(millis));
        let filter = doc! {
            lease::ID: name,
            "$or": [
                {lease::OWNER: owner},
                {lease::UNTIL: {"$not": {"$gte": now}}},
            ],
        };
        let update = doc! {"$set": {lease::OWNER: owner, lease::UNTIL: until}};
        match self
            .collection(LEASES)
            .update_one(filter, update)
            .upsert(true)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_duplicate_key(&e) => Ok(false),
            Err(e) => Err(Error::mongo(format!("taking the {name} lease"), e)),
        }
    }

    async fn count_for_balance(&self, filter: Document) -> Result<i64> {
        let n = self
            .collection(TASKS)
            .count_documents(filter)
            .await
            .map_err(|e| Error::mongo("counting tasks for QueueBalance", e))?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }
}
