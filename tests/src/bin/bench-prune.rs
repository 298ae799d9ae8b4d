//! Benchmark: what pruning a long history costs a queue that runs. A database holds N ended
//! tasks (a day old, each with its attempt record) beside a queue of M no-op tasks; one DEN
//! works the queue, with a retention that prunes the history (A) or none (B), in alternating
//! runs. Reports each run's throughput, and for A how much of the history was pruned while
//! the queue ran, and at what rate.
//!
//! Usage: bench-prune [--ended N] [--tasks M] [--rounds R] [--threads T]
//! Server: $DISBATCH_TEST_MONGODB_URI (else a private one, as the tests start it).

use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::bench::flags;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

struct Options {
    ended: usize,
    tasks: usize,
    rounds: usize,
    threads: u32,
}

fn parse() -> anyhow::Result<Options> {
    let given = flags::whole_numbers(&["--ended", "--tasks", "--rounds", "--threads"])?;
    let n = |flag: &str, default: u64| given.get(flag).copied().unwrap_or(default);
    Ok(Options {
        ended: n("--ended", 100_000) as usize,
        tasks: n("--tasks", 4_000) as usize,
        rounds: n("--rounds", 3).max(1) as usize,
        threads: n("--threads", 8).clamp(1, u64::from(u32::MAX)) as u32,
    })
}

/// `n` succeeded tasks of `queue`, a day old, each with one attempt record.
async fn history(db: &TestDb, queue: ObjectId, n: usize) -> anyhow::Result<()> {
    let day_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 86_400_000);
    let mut left = n;
    while left > 0 {
        let batch = left.min(10_000);
        let ids: Vec<ObjectId> = (0..batch).map(|_| ObjectId::new()).collect();
        let tasks: Vec<Document> = ids
            .iter()
            .map(|id| {
                doc! {"_id": id, "queue": queue, "status": 1, "node": "old", "params": {},
                "ctime": day_ago, "mtime": day_ago, "stdout": "", "stderr": "", "complete": true}
            })
            .collect();
        let attempts: Vec<Document> = ids
            .iter()
            .map(|id| {
                doc! {"_id": ObjectId::new(), "task": id, "queue": queue, "node": "old",
                "start": day_ago, "end": day_ago, "outcome": "succeeded", "status": 1}
            })
            .collect();
        db.tasks().insert_many(tasks).await.context("history")?;
        db.db
            .collection::<Document>("attempts")
            .insert_many(attempts)
            .await
            .context("attempts")?;
        left -= batch;
    }
    Ok(())
}

struct Run {
    per_s: f64,
    /// Of the history, the tasks deleted by the time the queue's last task ended.
    pruned_during: u64,
    /// Over the queue's run.
    elapsed_s: f64,
}

async fn run(o: &Options, prune: bool, round: usize) -> anyhow::Result<Run> {
    let db = TestDb::new(&format!("bench_prune_{round}_{}", u8::from(prune))).await;
    let retain = if prune {
        json!({"succeeded_s": 3600})
    } else {
        json!(null)
    };
    let config = write_config(&db, "bench.json", json!({"retain": retain}));
    db.den_store()
        .await
        .ensure_indexes()
        .await
        .context("creating indexes")?;
    let old = db.insert_queue("history", "echo", 0).await;
    history(&db, old, o.ended).await?;
    let work = db.insert_queue("work", "echo", 0).await;
    db.insert_tasks(work, (0..o.tasks).map(|_| doc! {}.into()).collect())
        .await;
    let den = Den::start(&config, "bench");
    db.set_queue(work, doc! {"threads": o.threads as i32}).await;
    let started = Instant::now();
    loop {
        let done = db.count(doc! {"queue": work, "status": 1}).await;
        if done as usize >= o.tasks {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the queue did not finish in 30 min"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let left = db.count(doc! {"queue": old}).await;
    drop(den);
    db.drop().await;
    Ok(Run {
        per_s: o.tasks as f64 / elapsed,
        pruned_during: (o.ended as u64).saturating_sub(left),
        elapsed_s: elapsed,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    println!(
        "{} ended tasks beside a queue of {} no-op tasks ({} threads), one DEN, {} alternating rounds",
        o.ended, o.tasks, o.threads, o.rounds
    );
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..o.rounds {
        // Alternated, and the order swapped each round, so drift favours neither.
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for prune in order {
            let r = run(&o, prune, round).await?;
            println!(
                "round {round} {}: {:.1} tasks/s over {:.1} s{}",
                if prune { "pruning" } else { "keeping" },
                r.per_s,
                r.elapsed_s,
                if prune {
                    format!(
                        "; {} history tasks pruned meanwhile ({:.0}/s)",
                        r.pruned_during,
                        r.pruned_during as f64 / r.elapsed_s
                    )
                } else {
                    String::new()
                }
            );
            if prune {
                with.push(r.per_s);
            } else {
                without.push(r.per_s);
            }
        }
    }
    let (a, b) = (median(with), median(without));
    println!(
        "median throughput: {a:.1} tasks/s pruning, {b:.1} keeping: {:.1}% of it",
        100.0 * a / b.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
