//! Benchmark: what a long history costs the present. In a fresh database (A) and in one holding
//! N ended graph and batch tasks inserted directly (B), in alternating runs: a chain of S no-op
//! steps made as one graph through the API, timed from its creation to its last step's end, and
//! then the server's CPU while one idle DEN leads the fleet.
//!
//! Usage: bench-history [--ended N] [--steps S] [--rounds R] [--idle-secs T]
//! Server: $DISBATCH_TEST_MONGODB_URI, on this machine (its CPU is read from /proc).

use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::bench::proxy::{HostUri, Proxy};
use disbatch_tests::bench::{flags, procfs};
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::json;

struct Options {
    ended: usize,
    steps: usize,
    rounds: usize,
    idle_secs: u64,
}

fn parse() -> anyhow::Result<Options> {
    let given = flags::whole_numbers(&["--ended", "--steps", "--rounds", "--idle-secs"])?;
    let n = |flag: &str, default: u64| given.get(flag).copied().unwrap_or(default);
    Ok(Options {
        ended: n("--ended", 100_000) as usize,
        steps: n("--steps", 30).max(2) as usize,
        rounds: n("--rounds", 3).max(1) as usize,
        idle_secs: n("--idle-secs", 20).max(1),
    })
}

/// `n` ended tasks a day old, half succeeded in graphs of 100 tasks (all settled), half in
/// batches of 100 members cancelled before they ran (`node: null`, as a cancel leaves a queued
/// task), with their graph and batch documents.
async fn history(db: &TestDb, queue: ObjectId, n: usize) -> anyhow::Result<()> {
    let day_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 86_400_000);
    let mut made = 0;
    while made < n {
        let group = ObjectId::new();
        let in_graph = (made / 100) % 2 == 0;
        let tasks: Vec<Document> = (0..100.min(n - made))
            .map(|i| {
                let mut t = doc! {"_id": ObjectId::new(), "queue": queue, "status": 1,
                "node": "old", "params": {"i": i as i64}, "ctime": day_ago, "mtime": day_ago,
                "stdout": "", "stderr": "", "complete": true, "attempts": 1};
                if in_graph {
                    t.insert("graph", group);
                    t.insert("graph_name", format!("step{i}"));
                } else {
                    t.insert("batch", group);
                    t.insert("status", -5);
                    t.insert("node", bson::Bson::Null);
                    t.remove("attempts");
                }
                t
            })
            .collect();
        made += tasks.len();
        db.tasks().insert_many(tasks).await.context("history")?;
        let (collection, d) = if in_graph {
            (
                "graphs",
                doc! {"_id": group, "ctime": day_ago, "tasks": 100},
            )
        } else {
            (
                "batches",
                doc! {"_id": group, "ctime": day_ago, "members": 100, "status": "done"},
            )
        };
        db.db
            .collection::<Document>(collection)
            .insert_one(d)
            .await
            .context("graph or batch")?;
    }
    Ok(())
}

struct Run {
    per_step_s: f64,
    idle_cpu: f64,
}

async fn run(o: &Options, with_history: bool, round: usize, server: u32) -> anyhow::Result<Run> {
    let db = TestDb::new(&format!("bench_history_{round}_{}", u8::from(with_history))).await;
    // The node and its runners talk through a proxy that times each request by kind: where
    // the server's time per step goes.
    let upstream = HostUri::parse(&db.uri).map_err(anyhow::Error::msg)?;
    let proxy = Proxy::start(upstream.host.clone())
        .await
        .context("the proxy")?;
    let config = write_config(
        &db,
        "bench.json",
        json!({"loop_interval_ms": 1000, "mongohost": upstream.with_host(&proxy.addr.to_string())}),
    );
    db.den_store()
        .await
        .ensure_indexes()
        .await
        .context("creating indexes")?;
    let old = db.insert_queue("old", "echo", 0).await;
    if with_history {
        history(&db, old, o.ended).await?;
    }
    db.insert_queue("chain", "echo", 2).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "bench");
    let steps: Vec<serde_json::Value> = (0..o.steps)
        .map(|i| {
            let mut t = json!({"name": format!("s{i}"), "queue": "chain", "params": {}});
            if i > 0 {
                t["depends_on"] = json!([format!("s{}", i - 1)]);
            }
            t
        })
        .collect();
    // A graph of one task first, in both databases: the first graph makes the workflow
    // indexes (over the whole history: 0.8 s at 100 000 tasks), which a database whose
    // history came from graphs has already. And the node settles: its start (a first
    // reconcile of the history's counts) is not the chain's.
    let (status, body) = dci
        .post(
            "/graphs",
            json!({"tasks": [{"name": "warm", "queue": "chain", "params": {}}]}),
        )
        .await;
    anyhow::ensure!(status == 200, "POST /graphs: {status} {body}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = proxy.snapshot().reply_ms;
    let started = Instant::now();
    let (status, body) = dci.post("/graphs", json!({"tasks": steps})).await;
    anyhow::ensure!(status == 200, "POST /graphs: {status} {body}");
    let graph = body["graph"]
        .as_str()
        .or_else(|| body["id"].as_str())
        .and_then(|h| ObjectId::parse_str(h).ok())
        .with_context(|| format!("no graph id in {body}"))?;
    loop {
        let done = db.count(doc! {"graph": graph, "status": 1}).await as usize;
        if done >= o.steps {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(1800),
            "the chain did not end in 30 min"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let per_step_s = started.elapsed().as_secs_f64() / o.steps as f64;
    let mut spent: Vec<(f64, usize, String)> = proxy
        .snapshot()
        .reply_ms
        .into_iter()
        .flat_map(|(who, by)| {
            let before = before.get(&who).cloned().unwrap_or_default();
            by.into_iter().map(move |(label, ms)| {
                let skip = before.get(&label).map_or(0, Vec::len);
                let ms = &ms[skip.min(ms.len())..];
                (ms.iter().sum::<f64>(), ms.len(), format!("{who} {label}"))
            })
        })
        .filter(|(_, n, _)| *n > 0)
        .filter(|(_, _, label)| !label.contains("getMore"))
        .collect();
    spent.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (ms, n, label) in spent.iter().take(6) {
        println!(
            "    {label}: {n} requests, {ms:.0} ms in all, {:.1} ms each",
            ms / *n as f64
        );
    }
    drop(dci);
    // Idle: the chain is over, the DCI gone; what the leader alone costs the server.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = procfs::cpu_ticks(server).context("server CPU")?;
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(o.idle_secs)).await;
    let after = procfs::cpu_ticks(server).context("server CPU")?;
    let idle_cpu = after.own.saturating_sub(before.own) as f64
        / procfs::clock_ticks()
        / window.elapsed().as_secs_f64();
    drop(den);
    // BENCH_KEEP_DB=1 leaves the database for a look afterwards.
    if std::env::var_os("BENCH_KEEP_DB").is_none() {
        db.drop().await;
    } else {
        println!("    kept database {}", db.name);
    }
    Ok(Run {
        per_step_s,
        idle_cpu,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let o = parse()?;
    let probe = TestDb::new("bench_history_probe").await;
    let server =
        procfs::server_pid(&probe.uri).context("the server does not run on this machine")?;
    probe.drop().await;
    println!(
        "a {}-step graph chain and an idle leader, in an empty database and beside {} ended graph and batch tasks; {} alternating rounds",
        o.steps, o.ended, o.rounds
    );
    let (mut empty, mut full) = (Vec::new(), Vec::new());
    for round in 0..o.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_history in order {
            let r = run(&o, with_history, round, server).await?;
            println!(
                "round {round} {}: {:.3} s per step; idle leader: server {:.3} CPU-s/s",
                if with_history { "history" } else { "empty" },
                r.per_step_s,
                r.idle_cpu
            );
            if with_history {
                full.push(r);
            } else {
                empty.push(r);
            }
        }
    }
    // A ratio to nothing (an idle server measured at 0 CPU) is no figure.
    let ratio = |a: f64, b: f64| match b > 0.0 {
        true => format!("{:.2}×", a / b),
        false => "n/a".to_string(),
    };
    let step = |v: &[Run]| median(v.iter().map(|r| r.per_step_s).collect());
    let cpu = |v: &[Run]| median(v.iter().map(|r| r.idle_cpu).collect());
    println!(
        "median: {:.3} s per step empty, {:.3} with history ({}); idle server CPU {:.3} empty, {:.3} with history ({})",
        step(&empty),
        step(&full),
        ratio(step(&full), step(&empty)),
        cpu(&empty),
        cpu(&full),
        ratio(cpu(&full), cpu(&empty))
    );
    Ok(())
}
