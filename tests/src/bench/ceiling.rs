//! The server's raw claim rate: concurrent `findOneAndUpdate` claims with the same driver on
//! the same machine, against a scratch `tasks` collection with Disbatch's own indexes.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_config::{Component, Config};
use disbatch_model::schema::{task, TASKS};
use disbatch_model::wire::relay::Completion;
use disbatch_model::{status, QueueSort};
use disbatch_store::{AttemptEnd, AttemptRecord, ClaimWindow, Pick, PickOutcome, Store, TaskEnd};
use mongodb::{Client, Collection};
use serde::Serialize;

use super::procfs;
use super::proxy::HostUri;
use super::stats::Latency;

/// Which claim a measurement makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimPath {
    /// The plain `findOneAndUpdate` the issue names: the server's ceiling.
    Raw,
    /// The DEN's own claim (`Store::claim_candidates` then `Store::claim_picks`: its full
    /// filter and claim window, slots and attempts), alone: what our claim costs on this
    /// server, without a fleet competing for the CPU.
    Disbatch,
    /// A whole task's database work alone: the DEN's claim of a batch, then the batch's
    /// results recorded as a worker host records them (`Store::record_completions`: attempt
    /// records and fenced results in one `bulkWrite`), counts deferred as both defer them.
    /// No process runs: the most tasks/s any executor could reach on this server.
    Cycle,
}

/// One measurement: `concurrency` claimers against a queue `depth` deep.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingPoint {
    pub path: ClaimPath,
    pub depth: usize,
    pub concurrency: usize,
    /// Tasks each claim asks for (the DEN's claim takes a batch; the raw one takes 1).
    pub batch: usize,
    /// Tasks claimed.
    pub claims: usize,
    pub secs: f64,
    pub claims_per_sec: f64,
    pub latency: Latency,
    /// The server's CPU time over the run ÷ claims, when it runs on this machine.
    pub server_cpu_ms_per_claim: Option<f64>,
    /// True when the claimers emptied the queue; false when the claim or time budget ended
    /// the measurement first (deep queues are sampled, not drained).
    pub drained: bool,
}

/// Inserts `n` queued tasks of `queue` in batches, in the creation shape Disbatch uses.
pub async fn enqueue(coll: &Collection<Document>, queue: ObjectId, n: usize) -> anyhow::Result<()> {
    let mut left = n;
    while left > 0 {
        let batch = left.min(10_000);
        let now = DateTime::now();
        let docs: Vec<Document> = (0..batch)
            .map(|_| {
                doc! {task::QUEUE: queue, task::STATUS: status::QUEUED, task::NODE: Bson::Null,
                task::PARAMS: {}, task::CTIME: now, task::MTIME: now,
                task::STDOUT: Bson::Null, task::STDERR: Bson::Null}
            })
            .collect();
        coll.insert_many(docs)
            .await
            .context("inserting queued tasks")?;
        left -= batch;
    }
    Ok(())
}

/// A Store on `database`, for its `ensure_indexes`.
pub async fn store_for(uri: &str, database: &str) -> anyhow::Result<Store> {
    let text = serde_json::json!({"mongohost": uri, "database": database}).to_string();
    let loaded = Config::parse(std::path::Path::new("bench.json"), &text)?;
    Ok(Store::connect(&loaded.config, Component::Den).await?)
}

/// Measures claims at each depth (each drained queue is restored between concurrencies), then
/// the DEN's own claim with one claimer.
/// A queue deeper than `drain_limit` is sampled: `sample_claims` claims or `sample_time`.
pub async fn measure(
    uri: &str,
    depths: &[usize],
    concurrencies: &[usize],
    drain_limit: usize,
    sample_claims: usize,
    sample_time: Duration,
) -> anyhow::Result<Vec<CeilingPoint>> {
    let client = Client::with_uri_str(uri).await.context("connecting")?;
    let name = format!("bench_ceiling_{}", std::process::id());
    let store = store_for(uri, &name).await?;
    store.ensure_indexes().await?;
    let coll: Collection<Document> = client.database(&name).collection(TASKS);
    let server_pid = HostUri::parse(uri)
        .ok()
        .and_then(|h| super::fleet::local_server_pid(&h));
    // The node and its worker host write task counts every 250 ms, not with each batch.
    let deferred = store_for(uri, &name).await?;
    deferred.tasks().defer_count_writes();
    let scratch = Scratch {
        coll,
        store,
        deferred,
        server_pid,
    };
    let result = measure_in(
        &scratch,
        depths,
        concurrencies,
        drain_limit,
        sample_claims,
        sample_time,
    )
    .await;
    let _ = client.database(&name).drop().await;
    result
}

/// Where claims are measured: the scratch collection, a Store on its database for the DEN's
/// claim, and the server's process when it is local.
struct Scratch {
    coll: Collection<Document>,
    store: Store,
    /// The same database with count writes deferred (the whole-task cycle).
    deferred: Store,
    server_pid: Option<u32>,
}

async fn measure_in(
    scratch: &Scratch,
    depths: &[usize],
    concurrencies: &[usize],
    drain_limit: usize,
    sample_claims: usize,
    sample_time: Duration,
) -> anyhow::Result<Vec<CeilingPoint>> {
    let Scratch {
        coll,
        store,
        deferred,
        server_pid,
    } = scratch;
    let mut points = Vec::new();
    for &depth in depths {
        let queue = ObjectId::new();
        enqueue(coll, queue, depth).await?;
        let drain = depth <= drain_limit;
        let (budget, time) = if drain {
            (depth, Duration::from_secs(120))
        } else {
            (sample_claims, sample_time)
        };
        let runs = concurrencies
            .iter()
            .map(|&k| (ClaimPath::Raw, k.max(1), 1))
            .chain(DEN_BATCHES.iter().map(|&b| (ClaimPath::Disbatch, 1, b)))
            .chain(std::iter::once((ClaimPath::Cycle, 1, CYCLE_BATCH)));
        for (path, k, batch) in runs {
            let claimer = match path {
                ClaimPath::Raw => None,
                ClaimPath::Disbatch => Some(store),
                ClaimPath::Cycle => Some(deferred),
            };
            let cpu0 = server_pid.and_then(procfs::cpu_ticks);
            let run = ClaimRun {
                path,
                queue,
                depth,
                concurrency: k,
                batch,
                budget,
                time,
            };
            let mut point = claim_run(coll, claimer, &run).await?;
            if let (Some(a), Some(b)) = (cpu0, server_pid.and_then(procfs::cpu_ticks)) {
                let ms = b.own.saturating_sub(a.own) as f64 / procfs::clock_ticks() * 1000.0;
                point.server_cpu_ms_per_claim = Some(ms / point.claims.max(1) as f64);
            }
            let what = match path {
                ClaimPath::Raw => "ceiling",
                ClaimPath::Disbatch => "DEN claim alone",
                ClaimPath::Cycle => "claim and result alone",
            };
            crate::bench::progress(&format!(
                "{what} depth {depth} ×{k}, batch {batch}: {:.0} claims/s, p50 {:.2} ms",
                point.claims_per_sec, point.latency.p50_ms
            ));
            points.push(point);
            // Back to full depth for the next run.
            coll.update_many(
                doc! {task::QUEUE: queue},
                doc! {
                    "$set": {task::STATUS: status::QUEUED, task::NODE: Bson::Null,
                        task::STDOUT: Bson::Null, task::STDERR: Bson::Null},
                    "$unset": {task::SLOT: "", task::LEASE_UNTIL: "", task::ATTEMPT: "", task::ATTEMPTS: "",
                        task::COMPLETE: ""},
                },
            )
            .await
            .context("restoring the scratch queue")?;
        }
        coll.delete_many(doc! {task::QUEUE: queue})
            .await
            .context("clearing the scratch queue")?;
    }
    Ok(points)
}

/// The batches the DEN's own claim is measured at: one task (an idle node), and a node's
/// default share of the bench's queue (8 threads).
const DEN_BATCHES: [usize; 2] = [1, 8];

/// The batch of the whole-task cycle: the bench's `threads` per DEN.
const CYCLE_BATCH: usize = 8;

/// One claim measurement's shape.
struct ClaimRun {
    path: ClaimPath,
    queue: ObjectId,
    depth: usize,
    concurrency: usize,
    /// Tasks per claim (the DEN's claim only).
    batch: usize,
    /// Most tasks claimed, and the time allowed.
    budget: usize,
    time: Duration,
}

/// Claims with `concurrency` workers; `store` set makes them DEN claims (each task its own
/// slot, `batch` tasks per claim). Latencies are per claim call.
async fn claim_run(
    coll: &Collection<Document>,
    store: Option<&Store>,
    run: &ClaimRun,
) -> anyhow::Result<CeilingPoint> {
    let remaining = Arc::new(AtomicUsize::new(run.budget));
    let next_slot = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let deadline = started + run.time;
    let cycle = run.path == ClaimPath::Cycle;
    let mut workers = Vec::new();
    for i in 0..run.concurrency {
        let coll = coll.clone();
        let store = store.cloned();
        let remaining = remaining.clone();
        let next_slot = next_slot.clone();
        let node = format!("ceiling-{i}");
        let (queue, batch) = (run.queue, run.batch);
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut claimed_tasks = 0;
            let mut emptied = false;
            let mut window = ClaimWindow::default();
            while Instant::now() < deadline {
                let Ok(before) = remaining.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(batch.min(n).max(1))) else {
                    break;
                };
                let want = batch.min(before).max(1);
                let t = Instant::now();
                let claimed = match &store {
                    None => usize::from(coll
                        .find_one_and_update(
                            doc! {task::STATUS: status::QUEUED, task::NODE: Bson::Null, task::QUEUE: queue},
                            doc! {"$set": {task::STATUS: status::CLAIMED, task::NODE: &node,
                            task::MTIME: DateTime::now()}},
                        )
                        .sort(doc! {task::ID: 1})
                        .projection(doc! {task::ID: 1})
                        .await
                        .context("claiming")?
                        .is_some()),
                    Some(store) => {
                        let candidates = store
                            .claims().claim_candidates(queue, QueueSort::Fifo, want, 1, &mut window)
                            .await?;
                        let picks: Vec<Pick> = candidates
                            .tasks
                            .into_iter()
                            .map(|task| Pick {
                                task,
                                slot: next_slot.fetch_add(1, SeqCst),
                                attempt: ObjectId::new(),
                                holds: Default::default(),
                            })
                            .collect();
                        let outcomes = store
                            .claims().claim_picks(&node, Duration::from_secs(60), &picks)
                            .await?;
                        let claimed: Vec<Completion> = picks
                            .iter()
                            .zip(&outcomes)
                            .filter(|(_, o)| matches!(o, PickOutcome::Claimed(_)))
                            .filter_map(|(p, _)| succeeded(p, queue, &node))
                            .collect();
                        if cycle && !claimed.is_empty() {
                            store.results().record_completions(&claimed).await?;
                        }
                        claimed.len()
                    }
                };
                if claimed == 0 {
                    emptied = true;
                    break;
                }
                claimed_tasks += claimed;
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>((latencies, claimed_tasks, emptied))
        }));
    }
    let mut all = Vec::new();
    let mut claims = 0;
    let mut drained = false;
    for w in workers {
        let (lat, n, emptied) = w.await.context("claimer task")??;
        all.extend(lat);
        claims += n;
        drained |= emptied;
    }
    let secs = started.elapsed().as_secs_f64();
    drained |= run.depth <= run.budget && claims >= run.depth;
    Ok(CeilingPoint {
        path: run.path,
        depth: run.depth,
        concurrency: run.concurrency,
        batch: run.batch,
        claims,
        secs,
        claims_per_sec: claims as f64 / secs.max(1e-9),
        latency: Latency::of(&all),
        server_cpu_ms_per_claim: None,
        drained,
    })
}

/// A no-op task's result for a claimed pick, as a worker host reports it.
fn succeeded(pick: &Pick, queue: ObjectId, node: &str) -> Option<Completion> {
    Some(Completion {
        record: AttemptRecord {
            id: pick.attempt,
            task: pick.task.get_object_id(task::ID).ok()?,
            queue: Some(queue),
            node: node.to_string(),
            pid: std::process::id(),
            start: DateTime::now(),
            end: AttemptEnd {
                outcome: disbatch_model::task::Outcome::Succeeded,
                status: Some(status::SUCCEEDED),
                exit_code: None,
                signal: None,
                result: None,
                reason: None,
                task_discarded: false,
                output_file: None,
            },
        },
        end: TaskEnd::Status(status::SUCCEEDED),
        stdout: String::new(),
        stderr: String::new(),
    })
}
