//! Benchmark: what a backlog costs the readers of counts. Fills a paused queue with N tasks,
//! starts a real `disbatch-web` and idle DENs, then times `GET /queues`, `/summary` and
//! `/metrics` (each a fresh reading, not a shared one) and measures the server's CPU while
//! simulated console tabs poll every 2 s.
//!
//! Usage: bench-counts [--tasks N] [--dens K] [--tabs T] [--cpu-secs S]
//! Server: $DISBATCH_TEST_MONGODB_URI (on this machine, for its CPU). `DISBATCH_WEB_BIN` and
//! `DISBATCH_DEN_BIN` run other builds of the binaries (to compare before and after).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::bench::stats::Latency;
use disbatch_tests::bench::{flags, procfs};
use disbatch_tests::{write_config, Dci, Den, Launch, TestDb};
use serde_json::json;

struct Options {
    tasks: usize,
    dens: usize,
    tabs: usize,
    cpu_secs: u64,
}

fn parse() -> anyhow::Result<Options> {
    let given = flags::whole_numbers(&["--tasks", "--dens", "--tabs", "--cpu-secs"])?;
    let n = |flag: &str, default: u64| given.get(flag).copied().unwrap_or(default);
    Ok(Options {
        tasks: n("--tasks", 1_000_000) as usize,
        dens: n("--dens", 2) as usize,
        tabs: n("--tabs", 5) as usize,
        cpu_secs: n("--cpu-secs", 30).max(1),
    })
}

fn override_bin(var: &str) -> Option<PathBuf> {
    std::env::var_os(var).map(PathBuf::from)
}

async fn fill(db: &TestDb, queue: ObjectId, n: usize) -> anyhow::Result<()> {
    let now = DateTime::now();
    let mut left = n;
    while left > 0 {
        let batch = left.min(10_000);
        let docs: Vec<Document> = (0..batch)
            .map(|i| {
                doc! {"queue": queue, "status": -2, "node": null, "params": {"i": i as i64},
                "ctime": now, "mtime": now, "stdout": null, "stderr": null}
            })
            .collect();
        db.tasks()
            .insert_many(docs)
            .await
            .context("inserting tasks")?;
        left -= batch;
    }
    Ok(())
}

async fn time_route(dci: &Dci, path: &str, runs: usize) -> anyhow::Result<Latency> {
    let client = reqwest::Client::new();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        // Past the shared reading's age, so each request makes a reading of its own.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let started = Instant::now();
        let r = client.get(dci.at(path)).send().await?;
        anyhow::ensure!(r.status().is_success(), "GET {path}: {}", r.status());
        r.bytes().await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Latency::of(&samples))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    let db = TestDb::new("bench_counts").await;
    let server = procfs::server_pid(&db.uri).context("the server does not run on this machine")?;
    let config = write_config(&db, "bench.json", json!({"loop_interval_ms": 1000}));
    // Indexes first, as in a deployment: built over a million tasks they take SecantusDB many
    // minutes, which the DCI's start would otherwise wait for.
    db.den_store()
        .await
        .ensure_indexes()
        .await
        .context("creating indexes")?;
    let queue = db.insert_queue("backlog", "echo", 0).await;
    let started = Instant::now();
    fill(&db, queue, o.tasks).await?;
    println!(
        "filled a paused queue with {} tasks in {:.1} s",
        o.tasks,
        started.elapsed().as_secs_f64()
    );
    let dci = match override_bin("DISBATCH_WEB_BIN") {
        Some(bin) => Dci::launch(
            &config,
            Launch {
                binary: Some(bin),
                ..Launch::default()
            },
        ),
        None => Dci::start(&config),
    };
    let den_bin = override_bin("DISBATCH_DEN_BIN");
    let _dens: Vec<Den> = (0..o.dens)
        .map(|i| match &den_bin {
            Some(bin) => Den::start_adjusted(bin, &config, &format!("idle{i}"), &[], |_| {}),
            None => Den::start(&config, &format!("idle{i}")),
        })
        .collect();
    // The maintenance leader counts a queue it has not counted before once, then keeps it
    // (a build without kept counts never makes the document: the wait then runs out).
    let counted = Instant::now();
    let counts = db.db.collection::<Document>("task_counts");
    let mut kept = false;
    while counted.elapsed() < Duration::from_secs(120) {
        let found = counts
            .find_one(doc! {"_id": queue, "reconciled_at": {"$type": "date"}})
            .await
            .context("reading task_counts")?;
        if found.is_some() {
            kept = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "kept counts: {}",
        if kept {
            format!(
                "made by the first reconcile {:.1} s after the DENs started",
                counted.elapsed().as_secs_f64()
            )
        } else {
            "none (counted from the tasks on every reading)".to_string()
        }
    );

    for path in ["/queues", "/summary", "/metrics"] {
        let l = time_route(&dci, path, 7).await?;
        println!(
            "GET {path:<9} at {} tasks: p50 {:>8.1} ms  max {:>8.1} ms",
            o.tasks, l.p50_ms, l.max_ms
        );
    }

    let tabs: Vec<_> = (0..o.tabs)
        .map(|i| {
            let (queues, summary) = (dci.at("/queues"), dci.at("/summary"));
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                tokio::time::sleep(Duration::from_millis(400 * i as u64)).await;
                loop {
                    let _ = client.get(&queues).send().await;
                    let _ = client.get(&summary).send().await;
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = procfs::cpu_ticks(server).context("server CPU")?;
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.cpu_secs)).await;
    let after = procfs::cpu_ticks(server).context("server CPU")?;
    let secs = window.elapsed().as_secs_f64();
    for t in tabs {
        t.abort();
    }
    let used = after.own.saturating_sub(before.own) as f64 / procfs::clock_ticks();
    println!(
        "server CPU over {secs:.0} s with {} idle DENs and {} console tabs (each /queues + /summary every 2 s): {:.1}% of a core",
        o.dens,
        o.tabs,
        100.0 * used / secs
    );
    db.drop().await;
    Ok(())
}
