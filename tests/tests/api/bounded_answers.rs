//! Answers built from big stored data stay small in the DCI's memory: a task's attempts with
//! 12 MB plugin results (the listing reads only the fields it shows), a week of statistics
//! with a line per node (streamed, bounded in bytes) and `.full` GridFS outputs (a prefix of
//! each, within a budget per answer). The DCI's peak RSS (VmHWM) is the measure.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::bench::procfs;
use disbatch_tests::hostile::LoggedDci;
use disbatch_tests::{write_config, TestDb};
use serde_json::{json, Value};

/// The DCI's peak resident memory must stay under this while it answers.
const PEAK_LIMIT_KIB: u64 = 100 * 1024;

/// A process's peak resident memory (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    procfs::peak_rss_kib(pid).expect("VmHWM in /proc/PID/status")
}

async fn get(dci: &LoggedDci, path: &str) -> (u16, Option<String>, Vec<u8>) {
    let r = reqwest::get(format!("{}{path}", dci.url))
        .await
        .expect("request");
    let status = r.status().as_u16();
    let truncated = r
        .headers()
        .get("x-disbatch-truncated")
        .or_else(|| r.headers().get("x-attempts-truncated"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, truncated, r.bytes().await.expect("body").to_vec())
}

/// The DCI's peak so far, printed (before the answer is checked, so a wrong answer still
/// shows what it cost).
fn print_peak(dci: &LoggedDci, what: &str) -> u64 {
    let peak = peak_kib(dci.pid());
    println!("{what}: DCI peak RSS {} MiB", peak / 1024);
    peak
}

fn assert_peak(peak: u64, what: &str) {
    assert!(
        peak < PEAK_LIMIT_KIB,
        "{what}: the DCI's peak RSS was {} MiB (VmHWM {peak} KiB), over {} MiB",
        peak / 1024,
        PEAK_LIMIT_KIB / 1024
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_with_12_mb_results_are_listed_without_reading_the_results() {
    const ATTEMPTS: i64 = 12;
    let db = TestDb::new("bounded_attempts").await;
    let queue = db.insert_queue("big-results", "echo", 0).await;
    let task = db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await[0];
    let blob = "r".repeat(12_000_000);
    let attempts = db.db.collection::<Document>("attempts");
    for i in 0..ATTEMPTS {
        attempts
            .insert_one(doc! {
                "_id": ObjectId::new(), "task": task, "queue": queue, "node": "n1", "pid": i,
                "start": DateTime::from_millis(1_000_000 + i * 1000),
                "end": DateTime::from_millis(1_000_500 + i * 1000), "outcome": "failed",
                "status": 2, "exit_code": 1, "signal": Bson::Null,
                "result": {"blob": &blob},
            })
            .await
            .expect("insert an attempt");
    }
    drop(blob);
    let config = write_config(&db, "web.json", json!({}));
    let dci = LoggedDci::start(&config, &db.path("dci.log"));
    let (status, truncated, body) = get(&dci, &format!("/tasks/{task}/attempts")).await;
    let peak = print_peak(&dci, "12 attempts with 12 MB results");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(truncated, None);
    let rows: Vec<Value> = serde_json::from_slice(&body).expect("a JSON array");
    assert_eq!(rows.len(), ATTEMPTS as usize);
    let pids: Vec<i64> = rows.iter().filter_map(|r| r["pid"].as_i64()).collect();
    assert_eq!(pids, (0..ATTEMPTS).collect::<Vec<_>>(), "oldest first");
    for r in &rows {
        assert_eq!(r["outcome"], "failed");
        assert_eq!(r["task"], json!({"$oid": task.to_hex()}));
        assert!(r.get("result").is_none(), "{r}");
    }
    println!("{} bytes answered", body.len());
    assert_peak(peak, "12 attempts with 12 MB results");
    db.drop().await;
}

/// Long names make big buckets from few nodes (fewer documents to insert and read).
fn node_name(n: usize) -> String {
    format!("node-{n:04}-{}", "h".repeat(400))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_week_of_statistics_is_streamed_and_bounded_in_bytes() {
    const MINUTES: i64 = 1400;
    const NODES: usize = 30;
    let db = TestDb::new("bounded_stats").await;
    let now_minute = DateTime::now().timestamp_millis() / 60_000 * 60_000;
    let nodes: Vec<Bson> = (0..NODES)
        .map(|n| {
            Bson::Document(doc! {
                "node": node_name(n),
                "succeeded": 7_i64, "failed": 1_i64, "lost": 0_i64,
            })
        })
        .collect();
    let stats = db.db.collection::<Document>("stats_minutely");
    for batch in 0..MINUTES / 100 {
        let docs: Vec<Document> = (batch * 100..(batch + 1) * 100)
            .map(|i| {
                doc! {
                    "minute": DateTime::from_millis(now_minute - i * 60_000), "queue": Bson::Null,
                    "succeeded": 7 * NODES as i64, "failed": NODES as i64, "lost": 0_i64,
                    "cancelled": 0_i64, "other": 0_i64, "queued": 5_i64, "running": 2_i64,
                    "mean_ms": 12.5, "p95_ms": 40.0, "nodes": nodes.clone(), "writer": "n1",
                }
            })
            .collect();
        stats.insert_many(docs).await.expect("insert buckets");
    }
    let config = write_config(&db, "web.json", json!({}));
    let dci = LoggedDci::start(&config, &db.path("dci.log"));

    // The week holds more than an answer may: the newest whole minutes that fit, oldest first.
    let (status, truncated, body) = get(&dci, "/stats?minutes=10080").await;
    let peak = print_peak(&dci, "a week of statistics");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    println!("a week: {} bytes answered", body.len());
    assert!(body.len() <= 16 * 1024 * 1024, "{} bytes", body.len());
    assert_eq!(truncated.as_deref(), Some("true"), "the cut is said");
    let rows: Vec<Value> = serde_json::from_slice(&body).expect("a JSON array");
    let minutes: Vec<i64> = rows.iter().filter_map(|r| r["minute"].as_i64()).collect();
    assert_eq!(minutes.len(), rows.len());
    assert!(
        rows.len() > 1000 && rows.len() < MINUTES as usize,
        "{} rows",
        rows.len()
    );
    assert_eq!(
        minutes.last(),
        Some(&(now_minute / 1000)),
        "the newest is kept"
    );
    assert!(
        minutes.windows(2).all(|w| w[1] - w[0] == 60),
        "consecutive, oldest first"
    );
    for r in [&rows[0], &rows[rows.len() - 1]] {
        assert_eq!(r["queue"], Value::Null);
        assert_eq!(r["succeeded"], 7 * NODES as i64);
        assert_eq!(
            r["nodes"].as_array().map(Vec::len),
            Some(NODES),
            "{}",
            r["nodes"][0]
        );
        assert_eq!(
            r["nodes"][0],
            json!({"node": node_name(0), "succeeded": 7, "failed": 1, "lost": 0})
        );
        assert!(r.get("writer").is_none());
    }
    drop(rows);
    assert_peak(peak, "a week of statistics");

    // Ten hours fit whole.
    let (status, truncated, body) = get(&dci, "/stats?minutes=600").await;
    assert_eq!(status, 200);
    assert_eq!(truncated, None);
    let rows: Vec<Value> = serde_json::from_slice(&body).expect("a JSON array");
    assert!((590..=600).contains(&rows.len()), "{} rows", rows.len());
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_outputs_are_cut_per_output_and_per_answer() {
    const BIG: usize = 48 * 1024 * 1024;
    const MEDIUM: usize = 1_200_000;
    const SHARERS: usize = 18;
    let db = TestDb::new("bounded_full").await;
    let queue = db.insert_queue("outputs", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..=SHARERS as i64).map(|n| doc! {"n": n}.into()).collect(),
        )
        .await;
    let store = db.den_store().await;
    let big = store
        .results()
        .write_output_file(ids[0], "stdout", "e".repeat(BIG).as_bytes())
        .await
        .expect("write the big output");
    let medium = store
        .results()
        .write_output_file(ids[1], "stdout", "m".repeat(MEDIUM).as_bytes())
        .await
        .expect("write a medium output");
    let small = store
        .results()
        .write_output_file(ids[0], "stderr", &b"oops"[..])
        .await
        .expect("write a small output");
    db.set_task(ids[0], doc! {"stdout": big.id, "stderr": small.id})
        .await;
    for id in &ids[1..] {
        db.set_task(*id, doc! {"stdout": medium.id}).await;
    }
    let config = write_config(&db, "web.json", json!({}));
    let dci = LoggedDci::start(&config, &db.path("dci.log"));

    let (status, _, body) = get(&dci, &format!("/tasks?queue={queue}&.full=1")).await;
    let peak = print_peak(&dci, "a .full search over a 48 MiB output");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    println!("{} bytes answered", body.len());
    let tasks: Vec<Value> = serde_json::from_slice(&body).expect("a JSON array");
    assert_eq!(tasks.len(), SHARERS + 1);
    let first = &tasks[0];
    let stdout = first["stdout"].as_str().expect("the big output as text");
    let shown = 4 * 1024 * 1024;
    let marker = format!(
        "\n[output truncated: the first {shown} bytes are shown; GET /tasks/{}/stdout has all of it]",
        ids[0]
    );
    assert!(
        stdout.ends_with(&marker),
        "{}",
        &stdout[stdout.len().saturating_sub(200)..]
    );
    assert_eq!(stdout.len(), shown + marker.len());
    assert!(stdout[..shown].bytes().all(|b| b == b'e'));
    assert_eq!(first["stderr"], "oops", "a small output is whole");
    // 16 MiB in all: the big one's first 4 MiB, then whole medium ones while they fit, the
    // first that does not fit cut, and none of the others.
    let budget = 16 * 1024 * 1024 - shown - 4;
    let whole = budget / MEDIUM;
    let texts: Vec<&str> = tasks[1..]
        .iter()
        .map(|t| t["stdout"].as_str().expect("text"))
        .collect();
    let tails: Vec<&str> = texts
        .iter()
        .map(|t| &t[t.len().saturating_sub(120)..])
        .collect();
    for t in &texts[..whole] {
        assert!(
            t.len() == MEDIUM && t.bytes().all(|b| b == b'm'),
            "{tails:?}"
        );
    }
    let cut_at = budget - whole * MEDIUM;
    assert!(
        texts[whole].ends_with(&format!(
            "\n[output truncated: the first {cut_at} bytes are shown; GET /tasks/{}/stdout has all of it]",
            ids[whole + 1]
        )),
        "{tails:?}"
    );
    for t in &texts[whole + 1..] {
        assert!(
            t.starts_with("[output not included: this answer already holds 16777216 bytes of output; GET /tasks/"),
            "{tails:?}"
        );
    }
    drop(tasks);
    assert_peak(peak, "a .full search over a 48 MiB output");
    db.drop().await;
}
