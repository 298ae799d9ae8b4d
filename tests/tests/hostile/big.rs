//! A search over a 100 000-task queue with no limit (Disbatch's `GET /tasks?queue=…`): every
//! task comes back as one valid JSON array, streamed, while the DCI's memory stays bounded,
//! also with eight large searches at once.

use std::time::Instant;

use bson::{doc, Bson};
use disbatch_tests::hostile::{crashes, LoggedDci};
use disbatch_tests::{write_config, TestDb};
use serde_json::{json, Value};

const TASKS: usize = 100_000;

/// A process's resident memory now and at its peak (VmRSS, VmHWM), in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_search_over_100000_tasks_is_streamed_in_bounded_memory() {
    let db = TestDb::new("hostile_big").await;
    let queue = db.insert_queue("big", "echo", 0).await;
    let started = Instant::now();
    for chunk in 0..TASKS / 10_000 {
        let params = (0..10_000)
            .map(|n| Bson::from(doc! {"n": (chunk * 10_000 + n) as i64, "pad": "x".repeat(100)}))
            .collect();
        db.insert_tasks(queue, params).await;
    }
    println!("{TASKS} tasks inserted in {:?}", started.elapsed());
    let config = write_config(&db, "web.json", json!({}));
    let dci = LoggedDci::start(&config, &db.path("dci.log"));
    let pid = dci.pid();
    let url = format!("{}/tasks?queue={queue}", dci.url);
    let http = reqwest::Client::new();
    // Warm up (connection pool, index sets), then the baseline.
    let r = http
        .get(format!("{url}&.limit=10"))
        .send()
        .await
        .expect("warm-up");
    assert_eq!(r.status(), 200);
    let (base_rss, _) = memory_kib(pid);

    let started = Instant::now();
    let body = http
        .get(&url)
        .send()
        .await
        .expect("search")
        .bytes()
        .await
        .expect("body");
    let took = started.elapsed();
    let tasks: Vec<Value> = serde_json::from_slice(&body).expect("one valid JSON array");
    assert_eq!(tasks.len(), TASKS);
    let mut seen: Vec<i64> = tasks
        .iter()
        .filter_map(|t| t["params"]["n"].as_i64())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), TASKS, "every task exactly once");
    let (_, peak_one) = memory_kib(pid);
    println!(
        "one search: {} bytes in {took:?}; DCI RSS {} MiB before, peak {} MiB",
        body.len(),
        base_rss / 1024,
        peak_one / 1024
    );
    drop(body);
    drop(tasks);

    // A quarter of the queue each keeps the test's time reasonable in a debug build; built
    // whole, eight of them would still take the DCI past a gigabyte.
    let searches: Vec<_> = (0..8)
        .map(|i| {
            let http = http.clone();
            let url = format!("{url}&.limit=25000&.skip={}", i * 10_000);
            tokio::spawn(async move {
                let mut r = http.get(&url).send().await.expect("search");
                let mut n = 0usize;
                while let Some(chunk) = r.chunk().await.expect("chunk") {
                    n += chunk.len();
                }
                n
            })
        })
        .collect();
    let mut sizes = Vec::new();
    for s in searches {
        sizes.push(s.await);
    }
    let (rss_after, peak_eight) = memory_kib(pid);
    println!(
        "eight at once: {:?} bytes each; DCI peak {} MiB, {} MiB after",
        sizes
            .iter()
            .map(|s| *s.as_ref().unwrap_or(&0))
            .collect::<Vec<_>>(),
        peak_eight / 1024,
        rss_after / 1024
    );
    for size in &sizes {
        let size = *size.as_ref().expect("search task");
        assert!(
            size > 25_000 * 300,
            "a search of 25 000 tasks sent {size} bytes"
        );
    }
    // A 22 MB answer built whole took the DCI to 1.5 GB (1.9 GB with eight); streamed, it
    // needs the driver's batch and one task at a time. Generous bounds: what they catch is
    // memory growing with the size of the answer.
    assert!(
        peak_one.saturating_sub(base_rss) < 100 * 1024,
        "one search took the DCI from {base_rss} KiB to {peak_one} KiB"
    );
    assert!(
        peak_eight.saturating_sub(base_rss) < 200 * 1024,
        "eight searches took the DCI from {base_rss} KiB to {peak_eight} KiB"
    );
    let log = dci.log_text();
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
    db.drop().await;
}
