//! The server's raw claim rate: concurrent `findOneAndUpdate` claims with the same driver on
//! the same machine, against a scratch `tasks` collection with Disbatch's own indexes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_core::config::{Component, Config};
use disbatch_core::model::status;
use disbatch_core::store::schema::{task, TASKS};
use disbatch_core::store::Store;
use mongodb::{Client, Collection};
use serde::Serialize;

use super::stats::Latency;

/// One measurement: `concurrency` claimers against a queue `depth` deep.
#[derive(Debug, Clone, Serialize)]
pub struct CeilingPoint {
    pub depth: usize,
    pub concurrency: usize,
    pub claims: usize,
    pub secs: f64,
    pub claims_per_sec: f64,
    pub latency: Latency,
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

/// Measures claims at each depth (each drained queue is restored between concurrencies).
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
    let result = measure_in(
        &coll,
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

async fn measure_in(
    coll: &Collection<Document>,
    depths: &[usize],
    concurrencies: &[usize],
    drain_limit: usize,
    sample_claims: usize,
    sample_time: Duration,
) -> anyhow::Result<Vec<CeilingPoint>> {
    let mut points = Vec::new();
    for &depth in depths {
        let queue = ObjectId::new();
        enqueue(coll, queue, depth).await?;
        let drain = depth <= drain_limit;
        for &k in concurrencies {
            let (budget, time) = if drain {
                (depth, Duration::from_secs(120))
            } else {
                (sample_claims, sample_time)
            };
            let point = claim_run(coll, queue, depth, k.max(1), budget, time).await?;
            crate::bench::progress(&format!(
                "ceiling depth {depth} ×{k}: {:.0} claims/s, p50 {:.2} ms",
                point.claims_per_sec, point.latency.p50_ms
            ));
            points.push(point);
            // Back to full depth for the next concurrency.
            coll.update_many(
                doc! {task::QUEUE: queue},
                doc! {"$set": {task::STATUS: status::QUEUED, task::NODE: Bson::Null}},
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

async fn claim_run(
    coll: &Collection<Document>,
    queue: ObjectId,
    depth: usize,
    concurrency: usize,
    budget: usize,
    time: Duration,
) -> anyhow::Result<CeilingPoint> {
    let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(budget));
    let started = Instant::now();
    let deadline = started + time;
    let mut workers = Vec::new();
    for i in 0..concurrency {
        let coll = coll.clone();
        let remaining = remaining.clone();
        let node = format!("ceiling-{i}");
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut emptied = false;
            while Instant::now() < deadline
                && remaining
                    .fetch_update(
                        std::sync::atomic::Ordering::SeqCst,
                        std::sync::atomic::Ordering::SeqCst,
                        |n| n.checked_sub(1),
                    )
                    .is_ok()
            {
                let t = Instant::now();
                let claimed = coll
                    .find_one_and_update(
                        doc! {task::STATUS: status::QUEUED, task::NODE: Bson::Null, task::QUEUE: queue},
                        doc! {"$set": {task::STATUS: status::CLAIMED, task::NODE: &node,
                        task::MTIME: DateTime::now()}},
                    )
                    .sort(doc! {task::ID: 1})
                    .projection(doc! {task::ID: 1})
                    .await?;
                if claimed.is_none() {
                    emptied = true;
                    break;
                }
                latencies.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, mongodb::error::Error>((latencies, emptied))
        }));
    }
    let mut all = Vec::new();
    let mut drained = false;
    for w in workers {
        let (lat, emptied) = w.await.context("claimer task")?.context("claiming")?;
        all.extend(lat);
        drained |= emptied;
    }
    let secs = started.elapsed().as_secs_f64();
    drained |= depth <= budget && all.len() >= depth;
    Ok(CeilingPoint {
        depth,
        concurrency,
        claims: all.len(),
        secs,
        claims_per_sec: all.len() as f64 / secs.max(1e-9),
        latency: Latency::of(&all),
        drained,
    })
}
