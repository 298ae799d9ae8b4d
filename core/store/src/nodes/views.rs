//! Node queries for the DCI: listing nodes with their running counts, setting `maxthreads`.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::{Error, Result};
use crate::{Store, WriteCounts};
use disbatch_model::schema::{node, task, NODES, TASKS};
use disbatch_model::status;

impl Store {
    /// Every node document, sorted by name.
    pub async fn list_nodes(&self) -> Result<Vec<Document>> {
        let cursor = self
            .raw(NODES)
            .find(doc! {})
            .sort(doc! {node::NODE: 1})
            .await
            .map_err(|e| Error::mongo("listing nodes", e))?;
        self.read_all(NODES, cursor, "listing nodes").await
    }

    pub async fn find_node(&self, ident: &str) -> Result<Option<Document>> {
        self.find_by_id_or_name(NODES, node::NODE, ident).await
    }

    /// Claimed or running tasks per node name.
    pub async fn running_per_node(&self) -> Result<HashMap<String, u64>> {
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
    pub async fn forget_node(&self, id: ObjectId, live: std::time::Duration) -> Result<bool> {
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
    pub async fn tasks_held_by(&self, name: &str) -> Result<u64> {
        self.collection(TASKS)
            .count_documents(doc! {
                task::NODE: name,
                task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]},
            })
            .await
            .map_err(|e| Error::mongo(format!("counting the tasks of node {name}"), e))
    }

    /// Sets (or with `Bson::Null`, clears the limit of) a node's `maxthreads`.
    pub async fn set_node_maxthreads(&self, id: ObjectId, value: Bson) -> Result<WriteCounts> {
        self.collection(NODES)
            .update_one(doc! {"_id": id}, doc! {"$set": {node::MAXTHREADS: value}})
            .await
            .map(WriteCounts::from)
            .map_err(|e| Error::mongo(format!("setting maxthreads of node {id}"), e))
    }
}
