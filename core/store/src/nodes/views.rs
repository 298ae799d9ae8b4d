//! Node queries for the DCI: listing nodes with their running counts, setting `maxthreads`.

use crate::NodeStore;
use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::{Error, Result};
use crate::WriteCounts;
use disbatch_config::MAX_LOOP_INTERVAL;
use disbatch_model::schema::{node, task, NODES, TASKS};
use disbatch_model::{fleet_time, status};

impl NodeStore<'_> {
    /// Every node document, sorted by name.
    pub async fn list_nodes(self) -> Result<Vec<Document>> {
        let cursor = self
            .raw(NODES)
            .find(doc! {})
            .sort(doc! {node::NODE: 1})
            .await
            .map_err(|e| Error::mongo("listing nodes", e))?;
        self.read_all(NODES, cursor, "listing nodes").await
    }

    pub async fn find_node(self, ident: &str) -> Result<Option<Document>> {
        self.find_by_id_or_name(NODES, node::NODE, ident).await
    }

    /// Claimed or running tasks per node name.
    pub async fn running_per_node(self) -> Result<HashMap<String, u64>> {
        let pipeline = vec![
            doc! {"$match": {task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]}}},
            doc! {"$group": {"_id": format!("${}", task::NODE), "n": {"$sum": 1}}},
        ];
        let mut out = HashMap::new();
        for d in self
            .aggregate_all(TASKS, pipeline, "counting running tasks per node")
            .await?
        {
            if let Ok(name) = d.get_str("_id") {
                out.insert(name.to_string(), crate::count_value(d.get("n")));
            }
        }
        Ok(out)
    }

    /// Deletes node `id`'s document unless it heartbeated within `live` (checked in the same
    /// write, so a node that comes back meanwhile is kept). A node's name is reused by the
    /// next heartbeat of a node with that name, which writes a fresh document.
    pub async fn forget_node(self, id: ObjectId, live: std::time::Duration) -> Result<bool> {
        let filter = doc! {
            node::ID: id,
            "$or": [
                {node::TIMESTAMP: {"$lt": crate::recovery::leases::ago(live)}},
                {node::TIMESTAMP: {"$exists": false}},
                {node::TIMESTAMP: {"$not": {"$type": "date"}}},
            ],
        };
        self.collection(NODES)
            .delete_one(filter)
            .await
            .map(|r| r.deleted_count == 1)
            .map_err(|e| Error::mongo(format!("deleting node {id}"), e))
    }

    /// Claimed or running tasks held by node `name` (index node+status+queue).
    pub async fn tasks_held_by(self, name: &str) -> Result<u64> {
        self.collection(TASKS)
            .count_documents(doc! {
                task::NODE: name,
                task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
            })
            .await
            .map_err(|e| Error::mongo(format!("counting the tasks of node {name}"), e))
    }

    /// Sets (or with `Bson::Null`, clears the limit of) a node's `maxthreads`.
    pub async fn set_node_maxthreads(self, id: ObjectId, value: Bson) -> Result<WriteCounts> {
        self.collection(NODES)
            .update_one(doc! {"_id": id}, doc! {"$set": {node::MAXTHREADS: value}})
            .await
            .map(WriteCounts::from)
            .map_err(|e| Error::mongo(format!("setting maxthreads of node {id}"), e))
    }
}

/// A node is live while its last heartbeat is younger than the longer of the API's live
/// window and this many of its own loop intervals, as its document records them: a node
/// whose interval exceeds the window is not dead between two beats.
pub const LIVE_INTERVALS: u32 = 3;

/// What the API judges a node document by: its name, id and liveness.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a>(pub &'a Document);

impl<'a> NodeView<'a> {
    /// Its name; empty when not a string.
    pub fn name(&self) -> &'a str {
        self.0.get_str(node::NODE).unwrap_or_default()
    }

    pub fn id(&self) -> Option<ObjectId> {
        self.0.get_object_id(node::ID).ok()
    }

    /// How long after its last heartbeat it still counts as live: `web_window`, or more for a
    /// node that says it heartbeats less often (read up to the longest interval a node may
    /// have).
    pub fn live_window(&self, web_window: Duration) -> Duration {
        let interval_ms = match self.0.get(node::INTERVAL_MS) {
            Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
            Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
            _ => 0,
        };
        let interval = Duration::from_millis(interval_ms).min(MAX_LOOP_INTERVAL);
        web_window.max(interval * LIVE_INTERVALS)
    }

    /// Whether it heartbeated within its live window: what `GET /nodes` says and `DELETE`
    /// refuses on.
    pub fn is_live(&self, web_window: Duration) -> bool {
        let window = i64::try_from(self.live_window(web_window).as_millis()).unwrap_or(i64::MAX);
        // Saturating: ops can store any date, even i64::MIN milliseconds.
        let age = self.0.get_datetime(node::TIMESTAMP).ok().map(|t| {
            fleet_time::now()
                .timestamp_millis()
                .saturating_sub(t.timestamp_millis())
        });
        age.is_some_and(|a| a <= window)
    }
}
