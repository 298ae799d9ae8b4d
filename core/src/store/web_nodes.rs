//! Node queries for the DCI: listing nodes with their running counts, setting `maxthreads`.

use std::collections::HashMap;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use super::schema::{node, task, NODES, TASKS};
use super::{Store, WriteCounts};
use crate::error::{Error, Result};
use crate::model::status;

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
        let cursor = self
            .collection(TASKS)
            .aggregate(pipeline)
            .with_type::<bson::RawDocumentBuf>()
            .await
            .map_err(|e| Error::mongo("counting running tasks per node", e))?;
        let mut out = HashMap::new();
        for d in self
            .read_all(TASKS, cursor, "counting running tasks per node")
            .await?
        {
            if let Ok(name) = d.get_str("_id") {
                out.insert(name.to_string(), super::count_value(d.get("n")));
            }
        }
        Ok(out)
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
