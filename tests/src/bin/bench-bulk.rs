//! Benchmark: what a bulk insert into a paused queue costs the server afterwards, in a fresh
//! database (A) and in one some work ran in first (B): 3 DENs shared 3 queues of 300 short
//! tasks one after another, stopped between queues alternately by SIGTERM and SIGKILL. Then
//! K idle DENs start, N tasks are inserted directly into a paused queue, and the server's
//! share of a core is read in 5-s windows.
//!
//! Usage: bench-bulk [--tasks N] [--dens K] [--windows W]
//! Server: $DISBATCH_TEST_MONGODB_URI, on this machine (its CPU is read from /proc).

use std::time::{Duration, Instant};

use anyhow::Context;
use bson::{doc, DateTime, Document};
use disbatch_tests::bench::{flags, procfs};
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

struct Options {
    tasks: usize,
    dens: usize,
    windows: usize,
}

fn parse() -> anyhow::Result<Options> {
    let given = flags::whole_numbers(&["--tasks", "--dens", "--windows"])?;
    let n = |flag: &str, default: u64| given.get(flag).copied().unwrap_or(default);
    Ok(Options {
        tasks: n("--tasks", 100_000) as usize,
        dens: n("--dens", 10).max(1) as usize,
        windows: n("--windows", 8).max(1) as usize,
    })
}

/// Three queues of 300 short tasks, each worked by 3 DENs that are then stopped (SIGTERM for
/// the first and last queue, SIGKILL for the second).
async fn earlier_work(db: &TestDb, config: &std::path::Path) -> anyhow::Result<()> {
    for (i, name) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let q = db.insert_queue(name, "echo", 6).await;
        let ids = db
            .insert_tasks(q, (0..300).map(|_| doc! {"sleep_ms": 10}.into()).collect())
            .await;
        let mut dens: Vec<Den> = (0..3)
            .map(|n| Den::start(config, &format!("worker{n}")))
            .collect();
        db.wait_complete(&ids, Duration::from_secs(600)).await;
        for den in &mut dens {
            if i == 1 {
                den.kill_hard();
            } else {
                den.stop();
            }
        }
    }
    Ok(())
}

async fn run(o: &Options, earlier: bool, round: usize, server: u32) -> anyhow::Result<Vec<f64>> {
    let db = TestDb::new(&format!("bench_bulk_{round}_{}", u8::from(earlier))).await;
    let config = write_config(&db, "bench.json", json!({"loop_interval_ms": 1000}));
    db.den_store()
        .await
        .ensure_indexes()
        .await
        .context("creating indexes")?;
    if earlier {
        earlier_work(&db, &config).await?;
    }
    let paused = db.insert_queue("paused", "echo", 0).await;
    let dens: Vec<Den> = (0..o.dens)
        .map(|n| Den::start(&config, &format!("idle{n}")))
        .collect();
    let now = DateTime::now();
    let mut left = o.tasks;
    while left > 0 {
        let batch = left.min(10_000);
        let docs: Vec<Document> = (0..batch)
            .map(|i| {
                doc! {"queue": paused, "status": -2, "node": null, "params": {"i": i as i64},
                "ctime": now, "mtime": now, "stdout": null, "stderr": null}
            })
            .collect();
        db.tasks().insert_many(docs).await.context("bulk insert")?;
        left -= batch;
    }
    let mut shares = Vec::new();
    for _ in 0..o.windows {
        let before = procfs::cpu_ticks(server).context("server CPU")?;
        let window = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = procfs::cpu_ticks(server).context("server CPU")?;
        shares.push(
            after.own.saturating_sub(before.own) as f64
                / procfs::clock_ticks()
                / window.elapsed().as_secs_f64(),
        );
    }
    drop(dens);
    db.drop().await;
    Ok(shares)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    let probe = TestDb::new("bench_bulk_probe").await;
    let server =
        procfs::server_pid(&probe.uri).context("the server does not run on this machine")?;
    probe.drop().await;
    println!(
        "{} tasks inserted into a paused queue beside {} idle DENs; the server's share of a core in 5-s windows after",
        o.tasks, o.dens
    );
    for (round, earlier) in [false, true].into_iter().enumerate() {
        let shares = run(&o, earlier, round, server).await?;
        let shown: Vec<String> = shares
            .iter()
            .map(|s| format!("{:.0}%", s * 100.0))
            .collect();
        println!(
            "{}: {}",
            if earlier {
                "after earlier work"
            } else {
                "fresh database"
            },
            shown.join(", ")
        );
    }
    Ok(())
}
