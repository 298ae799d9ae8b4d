//! Tasks whose runner is known gone without a lease running out: a runner its own node saw
//! exit without a result, and the lease-less claims of a node that stopped heartbeating.

use crate::RecoveryStore;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson};

use crate::error::{Error, Result};
use crate::recovery::leases::{expired_task, recovery_fields, ExpiredTask};
use disbatch_model::schema::{node, task, NODES, TASKS};
use disbatch_model::status;

impl RecoveryStore<'_> {
    /// The task `id` if it is still claimed or running as `attempt`: its runner is gone, so
    /// nothing else will end this attempt. None once a result landed (the runner stored it,
    /// or handed it to its node) or the task moved on.
    pub async fn running_attempt(
        self,
        id: ObjectId,
        attempt: ObjectId,
    ) -> Result<Option<ExpiredTask>> {
        let found = self
            .raw(TASKS)
            .find_one(doc! {
                task::ID: id,
                task::ATTEMPT: attempt,
                task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
            })
            .projection(recovery_fields())
            .await
            .map_err(|e| Error::mongo(format!("reading task {id} after its runner exited"), e))?;
        Ok(self
            .decode_one(TASKS, found)?
            .as_ref()
            .and_then(expired_task))
    }

    /// Nodes whose last heartbeat (`timestamp`) is older than `age`: Perl and Rust nodes
    /// both write it every second, so such a node is gone. Documents whose timestamp is no
    /// date (written by hand) say nothing and are left out.
    pub async fn silent_nodes(self, age: Duration) -> Result<Vec<String>> {
        let cursor = self
            .raw(NODES)
            .find(doc! {node::TIMESTAMP: {"$lt": crate::recovery::leases::ago(age)}})
            .projection(doc! {node::NODE: 1})
            .await
            .map_err(|e| Error::mongo("finding nodes that stopped heartbeating", e))?;
        let docs = self
            .read_all(NODES, cursor, "finding nodes that stopped heartbeating")
            .await?;
        Ok(docs
            .iter()
            .filter_map(|d| d.get_str(node::NODE).ok().map(str::to_string))
            .collect())
    }

    /// Claimed or running tasks without a lease (claimed by a Perl node, which keeps none)
    /// held by one of `nodes`; at most `limit`.
    pub async fn lease_less_tasks_of(
        self,
        nodes: &[String],
        limit: i64,
    ) -> Result<Vec<ExpiredTask>> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let cursor = self
            .raw(TASKS)
            .find(doc! {
                task::NODE: {"$in": nodes.iter().map(|n| Bson::String(n.clone())).collect::<Vec<_>>()},
                task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
                task::LEASE_UNTIL: {"$exists": false},
            })
            .limit(limit)
            .projection(recovery_fields())
            .await
            .map_err(|e| Error::mongo("finding tasks of nodes that stopped", e))?;
        let docs = self
            .read_all(TASKS, cursor, "finding tasks of nodes that stopped")
            .await?;
        Ok(docs.iter().filter_map(expired_task).collect())
    }
}
