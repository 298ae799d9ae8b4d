//! Quick-start driver: creates a demo queue and tasks, waits for them, prints the results.

use std::time::{Duration, Instant};

use anyhow::Context;
use bson::doc;
use disbatch_core::config::{Component, Config};
use disbatch_core::store::Store;

/// The Demo plugin's `commands` for each demo task: output, warnings, a failure, big output.
const DEMO_COMMANDS: &[&str] = &["a", "ab", "abc", "aa", "*", "a1", "b", "a", "ea", "a"];

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Config errors are printed redacted, as the real binaries print them.
    disbatch_core::logging::exit_status(run().await)
}

async fn run() -> anyhow::Result<()> {
    let config_path = std::env::args()
        .nth(1)
        .context("usage: disbatch-demo CONFIG")?;
    let config = Config::load(&config_path)?.config;
    let store = Store::connect(&config, Component::Web).await?;
    store.ensure_indexes().await?;
    let queue_name = format!("demo-{}", std::process::id());
    let queue = store
        .create_queue(&queue_name, "Disbatch::Plugin::Demo", Some(3), Some("fifo"))
        .await?;
    let params = DEMO_COMMANDS
        .iter()
        .map(|c| doc! {"commands": *c, "user1": "ashley@example.com"})
        .collect();
    let ids = store.insert_tasks(queue, params).await?;
    println!(
        "created queue {queue_name} ({queue}) with threads 3 and {} tasks",
        ids.len()
    );

    let started = Instant::now();
    let mut done = Vec::new();
    while started.elapsed() < Duration::from_secs(120) {
        done.clear();
        for id in &ids {
            match store.get_task(*id).await? {
                Some(t) if t.get_bool("complete").unwrap_or(false) => done.push(t),
                _ => {}
            }
        }
        if done.len() == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "{} of {} tasks finished in {:.1} s\n",
        done.len(),
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<26} {:<9} {:>6} {:<5} {:<40}",
        "task", "commands", "status", "node", "stdout"
    );
    for t in &done {
        let id = t
            .get_object_id("_id")
            .map(|i| i.to_hex())
            .unwrap_or_default();
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
            id,
            commands,
            t.get_i32("status").unwrap_or(-99),
            t.get_str("node").unwrap_or(""),
            stdout
        );
    }
    // Closed while the runtime runs: a client dropped as the runtime shuts down ends its
    // sessions on a pool already gone, and the driver panics in a worker thread.
    store.shutdown().await;
    anyhow::ensure!(
        done.len() == ids.len(),
        "not every demo task finished within 120 s"
    );
    Ok(())
}
