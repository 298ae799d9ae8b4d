//! What is claimed and running now: per queue and on this node, with the slots held.

use crate::ClaimStore;
use std::collections::{BTreeSet, HashMap, HashSet};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};

use crate::error::Result;
use disbatch_model::schema::{task, TASKS};
use disbatch_model::status;

/// Running (claimed or started) tasks as one aggregate saw them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RunningSnapshot {
    /// Per queue: how many tasks are claimed or running, on any node.
    pub per_queue: HashMap<ObjectId, u32>,
    /// Per queue: the slots held (tasks claimed by Perl nodes hold none).
    pub slots: HashMap<ObjectId, BTreeSet<u32>>,
    /// Tasks claimed or running on this node, in any queue.
    pub on_node: u32,
    /// Per queue: the nodes holding its claimed or running tasks.
    pub nodes: HashMap<ObjectId, Vec<String>>,
}

/// One queue's claimed and running tasks, read at once (not from the last snapshot).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct QueueRunning {
    /// On every node, Perl nodes' slotless claims included.
    pub running: u32,
    /// The slots held by our nodes' claims.
    pub slots: BTreeSet<u32>,
    /// Claims that hold no slot (a Perl node's): the slot index cannot count them.
    pub slotless: u32,
    /// The claimed and running tasks themselves, so two readings tell which arrived between.
    pub ids: HashSet<ObjectId>,
}

const RUNNING: [i32; 2] = [status::CLAIMED, status::RUNNING];

impl ClaimStore<'_> {
    /// Counts claimed and running tasks per queue and on `node`, with the slots they hold.
    pub async fn running_snapshot(
        self,
        node: &str,
        queues: &[ObjectId],
    ) -> Result<RunningSnapshot> {
        // One branch per queue, each an equality on the leading field of an index: SecantusDB
        // answers `status ∈ running ∧ (queue ∈ list ∨ node)` by reading every task (140 ms at
        // 100 000 queued, once a second per node) but this by index (0.6 ms); mongod plans both
        // as index scans.
        let running = doc! {"$in": RUNNING.to_vec()};
        let mut branches: Vec<Document> = queues
            .iter()
            .map(|q| doc! {task::QUEUE: q, task::STATUS: running.clone()})
            .collect();
        branches.push(doc! {task::NODE: node, task::STATUS: running});
        let pipeline = vec![
            doc! {"$match": {"$or": branches}},
            doc! {"$group": {
                "_id": format!("${}", task::QUEUE),
                "n": {"$sum": 1},
                "mine": {"$sum": {"$cond": [{"$eq": [format!("${}", task::NODE), node]}, 1, 0]}},
                "slots": {"$push": format!("${}", task::SLOT)},
                "nodes": {"$addToSet": format!("${}", task::NODE)},
            }},
        ];
        let mut snap = RunningSnapshot::default();
        for group in self
            .aggregate_all(TASKS, pipeline, "counting running tasks")
            .await?
        {
            let mine = count_field(&group, "mine");
            snap.on_node = snap.on_node.saturating_add(mine);
            let Ok(queue) = group.get_object_id("_id") else {
                continue; // tasks with a malformed queue field still count against the node
            };
            snap.per_queue.insert(queue, count_field(&group, "n"));
            let held = group
                .get_array("slots")
                .map(|slots| slots.iter().filter_map(slot_number).collect())
                .unwrap_or_default();
            snap.slots.insert(queue, held);
            let nodes = group.get_array("nodes").map_or(Vec::new(), |nodes| {
                nodes
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_string))
                    .collect()
            });
            snap.nodes.insert(queue, nodes);
        }
        Ok(snap)
    }

    /// Reads one queue's claimed and running tasks now: for a queue Perl nodes also claim
    /// from, whose claims no slot index refuses, a node must count them as they stand just
    /// before it claims, or it may be the one to push the queue past `threads`.
    pub async fn queue_running(self, queue: ObjectId) -> Result<QueueRunning> {
        let pipeline = vec![
            doc! {"$match": {task::QUEUE: queue, task::STATUS: {"$in": RUNNING.to_vec()}}},
            doc! {"$group": {
                "_id": Bson::Null,
                "n": {"$sum": 1},
                "slots": {"$push": format!("${}", task::SLOT)},
                "ids": {"$push": format!("${}", task::ID)},
            }},
        ];
        let context = "counting a queue's running tasks";
        let mut out = QueueRunning::default();
        for group in self.aggregate_all(TASKS, pipeline, context).await? {
            out.running = count_field(&group, "n");
            out.slots = group
                .get_array("slots")
                .map(|slots| slots.iter().filter_map(slot_number).collect())
                .unwrap_or_default();
            out.ids = group
                .get_array("ids")
                .map(|ids| ids.iter().filter_map(Bson::as_object_id).collect())
                .unwrap_or_default();
        }
        out.slotless = out.running.saturating_sub(out.slots.len() as u32);
        Ok(out)
    }
}

fn count_field(doc: &Document, key: &str) -> u32 {
    crate::count_value(doc.get(key)).min(u32::MAX as u64) as u32
}

fn slot_number(b: &Bson) -> Option<u32> {
    match b {
        Bson::Int32(n) => u32::try_from(*n).ok(),
        Bson::Int64(n) => u32::try_from(*n).ok(),
        _ => None,
    }
}
