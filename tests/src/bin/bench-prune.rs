//! Benchmark: what pruning a long history costs a queue that runs. A database holds N ended
//! tasks (a day old, each with its attempt record) beside a queue of M no-op tasks; one DEN
//! works the queue, with a retention that prunes the history (A) or none (B), in alternating
//! runs. Reports when A had pruned the whole history, and the queue's throughput in both over
//! the same window: from the start to the earliest time a pruning run was done (the whole run
//! when one was not).
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
    /// Each second from the queue's start: (seconds, queue tasks done, history tasks left).
    samples: Vec<(f64, u64, u64)>,
    /// When the history was gone; None when some was left as the queue finished.
    pruned_all_s: Option<f64>,
    elapsed_s: f64,
}

impl Run {
    /// Tasks per second over the first `window` seconds (as sampled: the last sample within).
    fn per_s_within(&self, window: f64) -> f64 {
        self.samples
            .iter()
            .rev()
            .find(|(t, _, _)| *t <= window)
            .map(|(t, done, _)| *done as f64 / t.max(f64::MIN_POSITIVE))
            .unwrap_or(0.0)
    }
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
    // As a database pruned before has it (and only such a one: the cost of its upkeep is
    // pruning's). Built by the leader over the 100 000 tasks instead,
    // SecantusDB's build stalled for good in 2 of 2 runs ("create_index retrying on write
    // conflicts" for 1 000 s, every write to tasks waiting on it), which a build over the same
    // documents outside this bench did not (0.4 s).
    if prune {
        db.den_store()
            .await
            .tasks()
            .ensure_retention_index()
            .await
            .context("creating the retention index")?;
    }
    let old = db.insert_queue("history", "echo", 0).await;
    history(&db, old, o.ended).await?;
    let work = db.insert_queue("work", "echo", 0).await;
    db.insert_tasks(work, (0..o.tasks).map(|_| doc! {}.into()).collect())
        .await;
    let den = Den::start(&config, "bench");
    db.set_queue(work, doc! {"threads": o.threads as i32}).await;
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut pruned_all_s = None;
    // From the node's metrics, not the database: a count reads an index range, and reads of
    // 100 000 entries kept SecantusDB's index build (the pruner's first) retrying for minutes.
    let done_sample = "disbatch_den_tasks_finished_total{outcome=\"succeeded\",queue=\"work\"}";
    let pruned_sample = "disbatch_den_tasks_pruned_total{queue=\"history\",state=\"succeeded\"}";
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let done = den.metric(done_sample).await as u64;
        let left = (o.ended as u64).saturating_sub(den.metric(pruned_sample).await as u64);
        let t = started.elapsed().as_secs_f64();
        samples.push((t, done, left));
        if left == 0 && pruned_all_s.is_none() {
            pruned_all_s = Some(t);
        }
        if done as usize >= o.tasks {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(3600),
            "the queue did not finish in an hour"
        );
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(den);
    // The metrics' word checked against the database's, once the node is gone.
    let done = db.count(doc! {"queue": work, "status": 1}).await;
    anyhow::ensure!(
        done as usize >= o.tasks,
        "{done} of {} tasks succeeded",
        o.tasks
    );
    if prune {
        let left = db.count(doc! {"queue": old}).await;
        let said = samples.last().map_or(0, |s| s.2);
        anyhow::ensure!(
            left <= said,
            "{left} history tasks left, the metric said {said}"
        );
    }
    db.drop().await;
    Ok(Run {
        samples,
        pruned_all_s,
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
            let last = r.samples.last().copied().unwrap_or_default();
            println!(
                "round {round} {}: {} tasks in {:.1} s{}",
                if prune { "pruning" } else { "keeping" },
                last.1,
                r.elapsed_s,
                match (prune, r.pruned_all_s) {
                    (false, _) => String::new(),
                    (true, Some(t)) => format!(
                        "; all {} history tasks pruned by {t:.0} s ({:.0}/s)",
                        o.ended,
                        o.ended as f64 / t
                    ),
                    (true, None) => format!(
                        "; {} of {} history tasks left as the queue finished",
                        last.2, o.ended
                    ),
                }
            );
            if prune {
                with.push(r);
            } else {
                without.push(r);
            }
        }
    }
    // The window in which every pruning run was pruning.
    let window = with
        .iter()
        .map(|r| r.pruned_all_s.unwrap_or(r.elapsed_s))
        .fold(f64::INFINITY, f64::min);
    let a = median(with.iter().map(|r| r.per_s_within(window)).collect());
    let b = median(without.iter().map(|r| r.per_s_within(window)).collect());
    println!(
        "median throughput over the first {window:.0} s: {a:.1} tasks/s pruning, {b:.1} keeping: {:.1}% of it",
        100.0 * a / b.max(f64::MIN_POSITIVE)
    );
    Ok(())
}
