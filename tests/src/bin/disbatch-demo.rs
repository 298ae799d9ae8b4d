//! Quick-start driver: creates a demo queue and a fleet queue, waits until every DEN named
//! by its metrics URL has read the others as sharers, then creates tasks, waits for them and
//! prints the results and how many tasks each node ran.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_config::{Component, Config};
use disbatch_store::Store;

/// The Demo plugin's `commands` for each demo task: output, warnings, a failure, big output.
const DEMO_COMMANDS: &[&str] = &["a", "ab", "abc", "aa", "*", "a1", "b", "a", "ea", "a"];

/// The fleet queue: tasks long enough that every node claims in its lane before the queue
/// drains (a node borrows another's idle lane only after three of its intervals).
const FLEET_TASKS: usize = 16;
const FLEET_TASK_MS: u64 = 500;
const FLEET_THREADS: u32 = 4;

/// How long every part of the demo may take.
const PATIENCE: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Config errors are printed redacted, as the real binaries print them.
    disbatch_config::process::logging::exit_status(run().await)
}

async fn run() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let config_path = args
        .next()
        .context("usage: disbatch-demo CONFIG [DEN_METRICS_URL...]")?;
    let dens: Vec<String> = args.collect();
    let config = Config::load(&config_path)?.config;
    let store = Store::connect(&config, Component::Web).await?;
    let outcome = demo(&store, &dens).await;
    // Closed while the runtime runs: a client dropped as the runtime shuts down ends its
    // sessions on a pool already gone, and the driver panics in a worker thread.
    store.shutdown().await;
    outcome
}

async fn demo(store: &Store, dens: &[String]) -> anyhow::Result<()> {
    store.ensure_indexes().await?;
    let pid = std::process::id();
    let demo_name = format!("demo-{pid}");
    let demo_queue = store
        .queues()
        .create_queue(&demo_name, "Disbatch::Plugin::Demo", Some(3), Some("fifo"))
        .await?;
    let fleet_name = format!("demo-fleet-{pid}");
    let fleet_queue = store
        .queues()
        .create_queue(&fleet_name, "echo", Some(FLEET_THREADS), Some("fifo"))
        .await?;
    if !dens.is_empty() {
        let started = Instant::now();
        wait_for_sharers(dens, &fleet_name).await?;
        println!(
            "{} DENs have read each other as sharers of {fleet_name} ({:.1} s)",
            dens.len(),
            started.elapsed().as_secs_f64()
        );
    }

    let params = DEMO_COMMANDS
        .iter()
        .map(|c| doc! {"commands": *c, "user1": "ashley@example.com"})
        .collect();
    let mut ids = store.tasks().insert_tasks(demo_queue, params).await?;
    println!(
        "created queue {demo_name} ({demo_queue}) with threads 3 and {} tasks",
        ids.len()
    );
    let params = (0..FLEET_TASKS)
        .map(|i| doc! {"text": format!("fleet task {i}"), "sleep_ms": FLEET_TASK_MS as i64})
        .collect();
    let fleet_ids = store.tasks().insert_tasks(fleet_queue, params).await?;
    println!(
        "created queue {fleet_name} ({fleet_queue}) with threads {FLEET_THREADS} and {} tasks of {FLEET_TASK_MS} ms",
        fleet_ids.len()
    );
    let demo_count = ids.len();
    ids.extend(fleet_ids);

    let started = Instant::now();
    let done = wait_for_tasks(store, &ids).await?;
    println!(
        "{} of {} tasks finished in {:.1} s\n",
        done.len(),
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    print_table(
        done.iter()
            .filter(|t| ids[..demo_count].contains(&id_of(t))),
    );
    anyhow::ensure!(
        done.len() == ids.len(),
        "not every demo task finished within {} s",
        PATIENCE.as_secs()
    );
    per_node(&done, dens.len())
}

/// Waits until every DEN's `disbatch_den_sharers` for `queue` counts all of them.
async fn wait_for_sharers(dens: &[String], queue: &str) -> anyhow::Result<()> {
    let sample = format!("disbatch_den_sharers{{queue=\"{queue}\"}} ");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .context("building an HTTP client")?;
    let started = Instant::now();
    loop {
        let mut seen = Vec::new();
        for url in dens {
            let text = match http.get(format!("{url}/metrics")).send().await {
                Ok(r) => r.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let n: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(&sample))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0);
            seen.push(n);
        }
        if seen.iter().all(|n| *n as usize == dens.len()) {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < PATIENCE,
            "the DENs did not read each other as sharers of {queue} within {} s (sharers seen: {seen:?})",
            PATIENCE.as_secs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The tasks that completed, read until all have or `PATIENCE` passed.
async fn wait_for_tasks(store: &Store, ids: &[ObjectId]) -> anyhow::Result<Vec<Document>> {
    let started = Instant::now();
    let mut done = Vec::new();
    while started.elapsed() < PATIENCE {
        done.clear();
        for id in ids {
            match store.tasks().get_task(*id).await? {
                Some(t) if t.get_bool("complete").unwrap_or(false) => done.push(t),
                _ => {}
            }
        }
        if done.len() == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(done)
}

fn id_of(t: &Document) -> ObjectId {
    t.get_object_id("_id")
        .unwrap_or_else(|_| ObjectId::from_bytes([0; 12]))
}

fn print_table<'a>(tasks: impl Iterator<Item = &'a Document>) {
    println!(
        "{:<26} {:<9} {:>6} {:<5} {:<40}",
        "task", "commands", "status", "node", "stdout"
    );
    for t in tasks {
        let commands = t
            .get_document("params")
            .ok()
            .and_then(|p| p.get_str("commands").ok())
            .unwrap_or("");
        let stdout = match t.get("stdout") {
            Some(bson::Bson::String(s)) if s.len() > 38 => format!("{} bytes inline", s.len()),
            Some(bson::Bson::String(s)) => s.trim_end().replace('\n', " | "),
            Some(bson::Bson::ObjectId(f)) => format!("GridFS file {f}"),
            _ => String::new(),
        };
        println!(
            "{:<26} {:<9} {:>6} {:<5} {:<40}",
            id_of(t).to_hex(),
            commands,
            t.get_i32("status").unwrap_or(-99),
            t.get_str("node").unwrap_or(""),
            stdout
        );
    }
}

/// Prints how many tasks each node ran; with `dens` DENs, every one of them must have run some.
fn per_node(done: &[Document], dens: usize) -> anyhow::Result<()> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in done {
        *counts
            .entry(t.get_str("node").unwrap_or("(none)"))
            .or_default() += 1;
    }
    let line: Vec<String> = counts.iter().map(|(n, c)| format!("{n} ran {c}")).collect();
    println!("\ntasks per node: {}", line.join(", "));
    anyhow::ensure!(
        counts.len() >= dens,
        "{dens} DENs share the demo queues, but only {} ran tasks",
        counts.len()
    );
    Ok(())
}
