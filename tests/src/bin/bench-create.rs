//! Benchmark: creating 100 000 tasks through `POST /tasks` (one request, chunks, from a
//! collection) against a real server. Run with `cargo run --release -p disbatch-tests --bin bench-create`.

use std::time::Instant;

use bson::{doc, Document};
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

const TASKS: usize = 100_000;
const CHUNK: usize = 5_000;

fn params(i: usize) -> Value {
    json!({"migration": "bench", "user1": format!("user{i}@example.com"), "commands": "a"})
}

async fn post(dci: &Dci, body: &Value) -> anyhow::Result<usize> {
    let (status, reply) = dci.post("/tasks", body.clone()).await;
    anyhow::ensure!(status == 200, "POST /tasks gave {status}: {reply}");
    let inserted = reply["MongoDB::InsertManyResult"]["inserted"]
        .as_array()
        .map_or(0, Vec::len);
    Ok(inserted)
}

fn report(what: &str, n: usize, started: Instant) {
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{what:<34} {n:>7} tasks  {secs:>6.2} s  {:>8.0} tasks/s",
        n as f64 / secs
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let db = TestDb::new("bench_create").await;
    let config = write_config(
        &db,
        "bench.json",
        json!({"web": {"max_body_bytes": 268_435_456}}),
    );
    let dci = Dci::start(&config);
    let (status, _) = dci
        .post("/queues", json!({"name": "bench", "plugin": "echo"}))
        .await;
    anyhow::ensure!(status == 200, "creating the queue gave {status}");
    println!("server: {}  database: {}", db.uri, db.name);

    let all: Vec<Value> = (0..TASKS).map(params).collect();
    let started = Instant::now();
    let n = post(&dci, &json!({"queue": "bench", "params": all})).await?;
    report("one POST of 100000", n, started);

    let started = Instant::now();
    let mut n = 0;
    for chunk in all.chunks(CHUNK) {
        n += post(&dci, &json!({"queue": "bench", "params": chunk})).await?;
    }
    report(&format!("{} POSTs of {CHUNK}", TASKS / CHUNK), n, started);

    let users = db.db.collection::<Document>("users");
    let docs: Vec<Document> = (0..TASKS)
        .map(|i| doc! {"email": format!("user{i}@example.com"), "plan": "basic", "n": i as i64})
        .collect();
    users.insert_many(docs).await?;
    let started = Instant::now();
    let n = post(
        &dci,
        &json!({"queue": "bench", "collection": "users", "filter": {"plan": "basic"},
                "params": {"user1": "document.email", "migration": "bench"}}),
    )
    .await?;
    report("from a collection of 100000", n, started);

    let stored = db.count(doc! {}).await;
    anyhow::ensure!(
        stored as usize == 3 * TASKS,
        "expected {} tasks stored, found {stored}",
        3 * TASKS
    );
    println!("stored: {stored} tasks");
    db.drop().await;
    Ok(())
}
