//! Claims in the server's order of writes, from a change stream: which claims landed with a
//! queue already at its `threads`, ours (holding a slot) or a Perl node's (holding none).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{Bson, Document};
use futures::StreamExt;
use mongodb::change_stream::event::ChangeStreamEvent;
use mongodb::change_stream::ChangeStream;
use mongodb::Collection;

/// A field only the recorder's markers carry: no task has it, and no node reads a document
/// without a queue and a status as a task.
const MARKER: &str = "claim_order_marker";
/// The value of the last marker, at which the recorder stops.
const END: &str = "end";

/// One change to a task, in the order the server applied it.
#[derive(Debug, Clone)]
pub struct Change {
    task: ObjectId,
    /// The status it set, if it set one.
    status: Option<i64>,
    /// It set a queue slot: a claim by one of our nodes (a Perl claim holds none).
    slot: bool,
    /// The node it set, if it set one (`Some(None)` when it cleared it).
    node: Option<Option<String>>,
}

impl Change {
    pub fn task(&self) -> ObjectId {
        self.task
    }

    /// The status the change set, if it set one.
    pub fn status(&self) -> Option<i64> {
        self.status
    }

    /// The node the change set, if it set one.
    pub fn node(&self) -> Option<&str> {
        self.node.as_ref().and_then(|n| n.as_deref())
    }
}

/// A recording of the tasks collection's changes, in server order, between its start and its
/// `finish`. It ends at a marker it writes itself, so the last change before `finish` is in
/// it however late the stream delivers it (a recorder that stops at a quiet moment may not).
pub struct Recording {
    tasks: Collection<Document>,
    recorder: tokio::task::JoinHandle<Vec<Change>>,
    markers: Vec<ObjectId>,
}

impl Recording {
    /// Opens the stream before returning: every change the caller makes from now on is in it.
    pub async fn start(tasks: Collection<Document>) -> Recording {
        let stream = tasks.watch().await.expect("watch the tasks");
        // Never set: the recorder stops at the marker `finish` writes.
        let stop = Arc::new(AtomicBool::new(false));
        let recorder = tokio::spawn(record_changes(stream, stop));
        Recording {
            tasks,
            recorder,
            markers: Vec::new(),
        }
    }

    /// Writes a marker: changes after it in the recording were applied after this call.
    pub async fn mark(&mut self) -> ObjectId {
        self.write_marker(false).await
    }

    async fn write_marker(&mut self, last: bool) -> ObjectId {
        let id = ObjectId::new();
        self.tasks
            .insert_one(bson::doc! {"_id": id, MARKER: if last { END } else { "mark" }})
            .await
            .expect("insert a marker");
        self.markers.push(id);
        id
    }

    /// Every change up to now, the markers among them (find them with `position`).
    pub async fn finish(mut self) -> Vec<Change> {
        let end = self.write_marker(true).await;
        let wait = super::scaled(Duration::from_secs(60));
        let changes = tokio::time::timeout(wait, &mut self.recorder)
            .await
            .unwrap_or_else(|_| {
                panic!("the change stream did not deliver the end marker within {wait:?}")
            })
            .expect("recorder");
        assert!(
            position(&changes, end).is_some(),
            "the change stream ended before the recording's last marker"
        );
        self.tasks
            .delete_many(bson::doc! {"_id": {"$in": &self.markers}})
            .await
            .expect("remove the markers");
        changes
    }
}

/// Where `marker` is in `changes`.
pub fn position(changes: &[Change], marker: ObjectId) -> Option<usize> {
    changes.iter().position(|c| c.task == marker)
}

/// Records every change to the tasks collection, in server order, until `stop`, or up to
/// the marker `Recording::finish` writes.
pub async fn record_changes(
    mut stream: ChangeStream<ChangeStreamEvent<Document>>,
    stop: Arc<AtomicBool>,
) -> Vec<Change> {
    let mut changes = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
        let event = match next {
            Ok(Some(event)) => event.expect("change event"),
            Ok(None) => break,
            Err(_) if stop.load(Ordering::Relaxed) => break,
            Err(_) => continue,
        };
        let Some(task) = event
            .document_key
            .as_ref()
            .and_then(|k| k.get_object_id("_id").ok())
        else {
            continue;
        };
        let set = event
            .update_description
            .map(|u| u.updated_fields)
            .or(event.full_document)
            .unwrap_or_default();
        let status = match set.get("status") {
            Some(Bson::Int32(n)) => Some(i64::from(*n)),
            Some(Bson::Int64(n)) => Some(*n),
            Some(Bson::Double(n)) => Some(*n as i64),
            _ => None,
        };
        let slot = set.get("slot").is_some_and(|s| !matches!(s, Bson::Null));
        let node = set.get("node").map(|n| n.as_str().map(str::to_string));
        let last = set.get_str(MARKER) == Ok(END);
        changes.push(Change {
            task,
            status,
            slot,
            node,
        });
        // The recording's last marker: everything before it in server order has been seen.
        if last {
            break;
        }
    }
    changes
}

/// Tasks `node` held that were queued again before it finished them: what recovery took back
/// from it (a Perl node never gives a task back itself). Judged from the server's order of
/// writes, so a result of `node`'s that landed late is never mistaken for one it lost.
pub fn requeued_from(changes: &[Change], node: &str) -> HashSet<ObjectId> {
    let mut holder = std::collections::HashMap::<ObjectId, Option<String>>::new();
    let mut out = HashSet::new();
    for c in changes {
        let held = holder.get(&c.task).cloned().flatten();
        if c.status == Some(-2) && held.as_deref() == Some(node) {
            out.insert(c.task);
        }
        if let Some(set) = &c.node {
            holder.insert(c.task, set.clone());
        }
    }
    out
}

/// After one claim or release of a task, in server order: what each node held then.
#[derive(Debug, Clone)]
pub struct Step {
    /// Its index in the recorded changes (compare with `position` of a marker).
    pub at: usize,
    /// A claim (true) or a release (false).
    pub claim: bool,
    /// The node that claimed or released.
    pub node: String,
    /// Tasks each node holds (claimed or running) after it; a node holding none is absent.
    pub held: BTreeMap<String, usize>,
}

impl Step {
    pub fn of(&self, node: &str) -> usize {
        self.held.get(node).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.held.values().sum()
    }
}

/// Replays `changes` to `tasks` in server order: every claim and release, with what each
/// node held at once after it. These are the product's decisions, how the slots were divided,
/// whatever the speed of each node's runners.
pub fn holdings(changes: &[Change], tasks: &HashSet<ObjectId>) -> Vec<Step> {
    let mut node_of = HashMap::<ObjectId, String>::new();
    let mut holder = HashMap::<ObjectId, String>::new();
    let mut held = BTreeMap::<String, usize>::new();
    let mut steps = Vec::new();
    for (at, c) in changes.iter().enumerate() {
        if !tasks.contains(&c.task) {
            continue;
        }
        match &c.node {
            Some(Some(n)) => {
                node_of.insert(c.task, n.clone());
            }
            Some(None) => {
                node_of.remove(&c.task);
            }
            None => {}
        }
        let Some(status) = c.status else { continue };
        let holds = status == -1 || status == 0;
        let now = node_of.get(&c.task).filter(|_| holds).cloned();
        let before = holder.get(&c.task).cloned();
        if now == before {
            continue;
        }
        if let Some(n) = &before {
            holder.remove(&c.task);
            if let Some(k) = held.get_mut(n) {
                *k -= 1;
                if *k == 0 {
                    held.remove(n);
                }
            }
            if now.is_none() {
                steps.push(Step {
                    at,
                    claim: false,
                    node: n.clone(),
                    held: held.clone(),
                });
            }
        }
        if let Some(n) = now {
            holder.insert(c.task, n.clone());
            *held.entry(n.clone()).or_default() += 1;
            steps.push(Step {
                at,
                claim: true,
                node: n,
                held: held.clone(),
            });
        }
    }
    steps
}

/// Each node's share of the slots held: its mean holding over `steps` over the mean total.
pub fn slot_shares(steps: &[Step]) -> BTreeMap<String, f64> {
    let mut sum = BTreeMap::<String, usize>::new();
    for s in steps {
        for (n, k) in &s.held {
            *sum.entry(n.clone()).or_default() += k;
        }
    }
    let total: usize = sum.values().sum();
    sum.into_iter()
        .map(|(n, k)| (n, k as f64 / total.max(1) as f64))
        .collect()
}

/// The steps while the queue had tasks left to claim: from its first claim to its last, when
/// it stops being shared and drains.
pub fn while_queued(steps: &[Step]) -> &[Step] {
    let first = steps.iter().position(|s| s.claim).unwrap_or(0);
    let last = steps.iter().rposition(|s| s.claim).map_or(0, |i| i + 1);
    steps.get(first..last.max(first)).unwrap_or(&[])
}

/// What replaying the queue's changes in server order shows.
#[derive(Debug, Default)]
pub struct Replay {
    pub claims_ours: usize,
    pub claims_perl: usize,
    /// Our claims given back before they ran.
    pub given_back: usize,
    /// Perl claims that landed with `threads` tasks already running.
    pub perl_past_cap: usize,
    /// Our kept claims that landed with `threads` tasks already running (must be 0).
    pub ours_past_cap: usize,
}

/// Replays `changes` to `tasks` in server order. A claim of ours that was given back (its
/// next status is queued again) never ran and holds no place; every other claim does until
/// its task leaves running.
pub fn replay(changes: &[Change], tasks: &HashSet<ObjectId>, threads: usize) -> Replay {
    let changes: Vec<&Change> = changes.iter().filter(|c| tasks.contains(&c.task)).collect();
    let given_back_at: HashSet<usize> = changes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.slot && c.status == Some(0))
        .filter(|(i, c)| {
            changes[i + 1..]
                .iter()
                .find(|n| n.task == c.task && n.status.is_some())
                .is_some_and(|n| n.status == Some(-2))
        })
        .map(|(i, _)| i)
        .collect();
    let mut out = Replay {
        given_back: given_back_at.len(),
        ..Replay::default()
    };
    let mut running = HashSet::new();
    for (i, c) in changes.iter().enumerate() {
        let Some(status) = c.status else { continue };
        match status {
            0 if c.slot => {
                out.claims_ours += 1;
                if given_back_at.contains(&i) {
                    continue;
                }
                if running.len() >= threads {
                    out.ours_past_cap += 1;
                }
                running.insert(c.task);
            }
            -1 => {
                out.claims_perl += 1;
                if running.len() >= threads {
                    out.perl_past_cap += 1;
                }
                running.insert(c.task);
            }
            // A Perl runner starting a task its node claimed.
            0 => {}
            _ => {
                running.remove(&c.task);
            }
        }
    }
    out
}

/// Disbatch 4's claim loop (`process_queues` in Disbatch.pm) on one queue, run by `workers`
/// concurrent clients as nodes `perl-sim-N`, with `pause` between passes instead of Perl's
/// second, so a test sees many of its count-then-claim races in seconds. Each task it claims is
/// "run" for `hold` (status 0, then 1), as Perl's task runner would. Each heartbeats as a
/// Perl node does, a `nodes` document with `node` and `timestamp` alone.
pub fn claim_like_perl(
    db: mongodb::Database,
    queue: ObjectId,
    threads: u64,
    workers: usize,
    hold: Duration,
    pause: Duration,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..workers)
        .map(|w| {
            let tasks = db.collection::<Document>("tasks");
            let nodes = db.collection::<Document>("nodes");
            let stop = stop.clone();
            tokio::spawn(async move {
                let node = format!("perl-sim-{w}");
                let mut claimed = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = nodes
                        .update_one(
                            bson::doc! {"node": &node},
                            bson::doc! {"$set": {"node": &node, "timestamp": bson::DateTime::now()}},
                        )
                        .upsert(true)
                        .await;
                    let running = || {
                        tasks.count_documents(
                            bson::doc! {"queue": queue, "status": {"$in": [-1, 0]}},
                        )
                    };
                    let mut now = running().await.unwrap_or(threads);
                    while now < threads {
                        let task = tasks
                            .find_one_and_update(
                                bson::doc! {"$or": [{"node": Bson::Null}, {"node": -1}], "status": -2, "queue": queue},
                                bson::doc! {"$set": {"node": &node, "status": -1, "mtime": bson::DateTime::now()}},
                            )
                            .await;
                        let Ok(Some(task)) = task else { break };
                        let Ok(id) = task.get_object_id("_id") else { break };
                        claimed += 1;
                        let tasks = tasks.clone();
                        let node = node.clone();
                        tokio::spawn(async move {
                            let mine = bson::doc! {"_id": id, "node": &node};
                            let _ = tasks
                                .update_one(mine.clone(), bson::doc! {"$set": {"status": 0}})
                                .await;
                            tokio::time::sleep(hold).await;
                            let _ = tasks
                                .update_one(
                                    mine,
                                    bson::doc! {"$set": {"status": 1, "complete": true, "mtime": bson::DateTime::now()}},
                                )
                                .await;
                        });
                        now = running().await.unwrap_or(threads);
                    }
                    tokio::time::sleep(pause).await;
                }
                claimed
            })
        })
        .collect()
}

/// Waits until each of `dens` has read `n` nodes serving queue `queue` (its name) with room
/// (`disbatch_den_sharers`): from then on each lays out its lane among all of them, so a
/// queue opened now is divided from its first claim.
pub async fn wait_sharers(dens: &[&super::Den], queue: &str, n: usize) {
    let sample = format!("disbatch_den_sharers{{queue=\"{queue}\"}}");
    super::wait_for(
        &format!("{} nodes to read {n} sharers of {queue}", dens.len()),
        Duration::from_secs(60),
        || {
            let sample = &sample;
            async move {
                for den in dens {
                    if den.metric(sample).await != n as f64 {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
}
