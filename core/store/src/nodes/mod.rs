//! Node queries: the heartbeat upsert, which also reads the node's `maxthreads` and takes
//! the work signal the maintenance leader left for it; the leader's fan-out of those signals;
//! in its files, the maintenance lease and the API's views.

domain_handle!(
    /// Nodes: heartbeats, the maintenance lease, the fleet's live nodes and the API's views of them.
    NodeStore,
    nodes
);

pub(crate) mod leader;
pub(crate) mod views;

use bson::doc;
use mongodb::options::ReturnDocument;

use crate::error::{Error, Result};
use disbatch_model::fleet_time;
use disbatch_model::parse_limit;
use disbatch_model::schema::{node, NODES};

/// What a DEN reports about itself on each heartbeat (beyond Disbatch's `timestamp`).
#[derive(Debug, Clone)]
pub struct Heartbeat<'a> {
    pub node: &'a str,
    pub pid: u32,
    pub version: &'a str,
    pub running: u32,
    /// The runtimes this node serves, when limited.
    pub runtimes: Option<&'a [String]>,
    /// This DEN's live task runners (task, pid): its child workers.
    pub runners: &'a [(bson::oid::ObjectId, u32)],
    /// The queues it serves, and its room (None: unlimited).
    pub serves: &'a [bson::oid::ObjectId],
    pub room: Option<u32>,
    /// Its last claim pass ran short of tasks, or it runs nothing: it starts new work on the
    /// leader's marks.
    pub waiting_for_work: bool,
    /// Its loop interval: the time between two heartbeats.
    pub interval: std::time::Duration,
}

/// A node that heartbeat lately, with the queues it serves and its room.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveNode {
    pub node: String,
    pub serves: Vec<bson::oid::ObjectId>,
    /// None: no `maxthreads`.
    pub room: Option<u32>,
    /// Its `maxthreads` (None: unlimited; an unreadable one, 0: such a node starts nothing).
    pub maxthreads: Option<u32>,
}

/// The nodes that heartbeat lately: ours, which say what they serve, and the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveFleet {
    pub ours: Vec<LiveNode>,
    /// Nodes whose `timestamp` is fresh but that say nothing of what they serve: Perl
    /// Disbatch nodes, whose claims hold no slot.
    pub others: Vec<String>,
}

/// What a heartbeat read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReply {
    pub limit: NodeLimit,
    /// The leader signalled work for a queue this node serves since its last heartbeat.
    pub work_signalled: bool,
}

/// The node's own cap (`maxthreads`) as ops set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLimit {
    Unlimited,
    Max(u32),
    /// Unreadable value: the node starts nothing until it is fixed.
    Invalid(String),
}

impl NodeStore<'_> {
    /// Upserts the node document with `$set` of our own fields only, so a `maxthreads` that
    /// ops set is never overwritten, and in the same round trip returns the node's limit and
    /// takes the leader's work signal (the document as it was: this write removes it).
    pub async fn heartbeat(self, beat: &Heartbeat<'_>) -> Result<HeartbeatReply> {
        let now = fleet_time::now();
        let before = self
            .raw(NODES)
            .find_one_and_update(
                doc! {node::NODE: beat.node},
                doc! {
                    "$set": {
                        node::TIMESTAMP: now,
                        node::PID: beat.pid as i64,
                        node::VERSION: beat.version,
                        node::RUNNING: beat.running as i64,
                        node::RUNTIMES: beat.runtimes.map_or(bson::Bson::Null, |r| r.into()),
                        node::RUNNERS: beat.runners.iter().map(|(task, pid)| doc! {"task": task, "pid": *pid as i64}).collect::<Vec<_>>(),
                        node::SERVES: beat.serves.to_vec(),
                        node::SERVES_AT: now,
                        node::ROOM: beat.room.map_or(bson::Bson::Null, |r| bson::Bson::Int64(r.into())),
                        node::WAITING_FOR_WORK: beat.waiting_for_work,
                        node::INTERVAL_MS: i64::try_from(beat.interval.as_millis()).unwrap_or(i64::MAX),
                        node::CLOCK_OFFSET_MS: fleet_time::offset_ms().map_or(bson::Bson::Null, bson::Bson::Int64),
                    },
                    "$unset": {node::WORK_SIGNALLED_AT: ""},
                },
            )
            .upsert(true)
            .return_document(ReturnDocument::Before)
            .projection(doc! {node::MAXTHREADS: 1, node::WORK_SIGNALLED_AT: 1})
            .await
            .map_err(|e| Error::mongo(format!("heartbeat of node {}", beat.node), e))?;
        let work_signalled = before
            .as_ref()
            .is_some_and(|d| matches!(d.get(node::WORK_SIGNALLED_AT), Ok(Some(_))));
        let before = match self.decode_one(NODES, before) {
            Ok(d) => d,
            Err(e) => {
                return Ok(HeartbeatReply {
                    limit: NodeLimit::Invalid(e.to_string()),
                    work_signalled,
                })
            }
        };
        // The document before this write holds the same `maxthreads`: this write never sets it.
        let limit = before.as_ref().and_then(|d| d.get(node::MAXTHREADS));
        let limit = match parse_limit(limit) {
            Ok(None) => NodeLimit::Unlimited,
            Ok(Some(n)) => NodeLimit::Max(n),
            Err(e) => NodeLimit::Invalid(format!("maxthreads: {e}")),
        };
        Ok(HeartbeatReply {
            limit,
            work_signalled,
        })
    }

    /// The leader's fan-out of work signals: marks the live nodes (ours, heartbeat within
    /// `max_age`) other than `leader` that serve one of `queues`, or every one with `all`
    /// (a queue changed: a new queue is served by no one yet). A node already marked is left
    /// alone, so signals between two of its heartbeats cost one write in all. Returns how
    /// many nodes were marked.
    pub async fn signal_nodes(
        self,
        leader: &str,
        queues: &[bson::oid::ObjectId],
        all: bool,
        max_age: std::time::Duration,
    ) -> Result<u64> {
        if queues.is_empty() && !all {
            return Ok(0);
        }
        let mut filter = doc! {
            node::SERVES_AT: {"$gte": super::recovery::leases::ago(max_age)},
            node::NODE: {"$ne": leader},
            node::WORK_SIGNALLED_AT: {"$exists": false},
        };
        if !all {
            filter.insert(node::SERVES, doc! {"$in": queues.to_vec()});
        }
        let updated = self
            .raw(NODES)
            .update_many(
                filter,
                doc! {"$set": {node::WORK_SIGNALLED_AT: fleet_time::now()}},
            )
            .await
            .map_err(|e| Error::mongo("signalling nodes of work", e))?;
        Ok(updated.modified_count)
    }
}

impl NodeStore<'_> {
    /// Whether a live node of ours other than `leader` (heartbeat within `max_age`) said at
    /// its last heartbeat that it waits for work. One indexless read of `nodes`, a document
    /// per node; made by a busy leader once per maintenance pass.
    pub async fn others_wait_for_work(
        self,
        leader: &str,
        max_age: std::time::Duration,
    ) -> Result<bool> {
        let found = self
            .raw(NODES)
            .find_one(doc! {
                node::SERVES_AT: {"$gte": super::recovery::leases::ago(max_age)},
                node::NODE: {"$ne": leader},
                node::WAITING_FOR_WORK: true,
            })
            .projection(doc! {"_id": 1})
            .await
            .map_err(|e| Error::mongo("reading which nodes wait for work", e))?;
        Ok(found.is_some())
    }

    /// A live node of ours other than `me` (heartbeat within `max_age`) whose host clock was
    /// within `bound` of the server's at its last heartbeat: the one to leave the maintenance
    /// lead to while this node's clock is off. Nodes that do not report an offset (Perl
    /// nodes, older versions) never count.
    pub async fn live_node_with_sane_clock(
        self,
        me: &str,
        max_age: std::time::Duration,
        bound: std::time::Duration,
    ) -> Result<Option<String>> {
        let bound = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX);
        let found = self
            .raw(NODES)
            .find_one(doc! {
                node::SERVES_AT: {"$gte": super::recovery::leases::ago(max_age)},
                node::NODE: {"$ne": me},
                node::CLOCK_OFFSET_MS: {"$gte": -bound, "$lte": bound},
            })
            .projection(doc! {node::NODE: 1})
            .await
            .map_err(|e| Error::mongo("reading which nodes' clocks are sane", e))?;
        Ok(found.and_then(|d| d.get_str(node::NODE).ok().map(str::to_string)))
    }

    /// The nodes that heartbeat at most `max_age` ago: ours wrote `serves` and `serves_at`
    /// then; any other with a fresh `timestamp` is a Perl node (it says nothing, claims
    /// outside the slots, and does not refresh `serves_at` on a document it takes over).
    pub async fn live_nodes(self, max_age: std::time::Duration) -> Result<LiveFleet> {
        let since = super::recovery::leases::ago(max_age);
        let context = "reading live nodes";
        let cursor = self
            .raw(NODES)
            .find(doc! {"$or": [
                {node::SERVES_AT: {"$gte": since}, node::SERVES: {"$type": "array"}},
                {node::TIMESTAMP: {"$gte": since}},
            ]})
            .projection(doc! {node::NODE: 1, node::SERVES: 1, node::SERVES_AT: 1, node::ROOM: 1, node::MAXTHREADS: 1})
            .await
            .map_err(|e| Error::mongo(context, e))?;
        let docs = self.read_all(NODES, cursor, context).await?;
        let mut fleet = LiveFleet::default();
        for d in &docs {
            let Ok(name) = d.get_str(node::NODE) else {
                continue;
            };
            let fresh = d.get_datetime(node::SERVES_AT).is_ok_and(|at| *at >= since);
            match d.get_array(node::SERVES) {
                Ok(serves) if fresh => fleet.ours.push(LiveNode {
                    node: name.to_string(),
                    serves: serves.iter().filter_map(bson::Bson::as_object_id).collect(),
                    room: match d.get(node::ROOM) {
                        Some(bson::Bson::Null) | None => None,
                        Some(v) => {
                            Some(u32::try_from(super::count_value(Some(v))).unwrap_or(u32::MAX))
                        }
                    },
                    maxthreads: parse_limit(d.get(node::MAXTHREADS)).unwrap_or(Some(0)),
                }),
                _ => fleet.others.push(name.to_string()),
            }
        }
        Ok(fleet)
    }
}
