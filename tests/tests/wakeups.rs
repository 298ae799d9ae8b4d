//! Event-driven claims with a real node: a task queued into an idle fleet starts on the
//! change stream's event, not at the next timer pass; a busy node closes its streams.

use std::time::{Duration, Instant};

use bson::doc;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_task_queued_into_an_idle_node_starts_without_waiting_for_the_timer() {
    let db = TestDb::new("wakeups").await;
    // Maintenance every 10 s: polling alone would make a task wait 5 s on average.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 10_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start(&config, "n1");
    wait_for("the change streams", Duration::from_secs(30), || async {
        den.log_text().contains("watching tasks and queues")
    })
    .await;
    // Let the first maintenance pass go by, so only events can start the tasks below.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let queued = Instant::now();
        let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
        db.wait_complete(&[id], Duration::from_secs(5)).await;
        latencies.push(queued.elapsed());
        let a = db.attempts(id).await;
        let start = a[0]
            .get_datetime("start")
            .expect("start")
            .timestamp_millis();
        let ctime = db
            .task(id)
            .await
            .get_datetime("ctime")
            .expect("ctime")
            .timestamp_millis();
        println!("enqueue → plugin start {} ms", start - ctime);
    }
    latencies.sort();
    println!("enqueue → complete: {latencies:?}");
    assert!(
        latencies[4] < Duration::from_secs(2),
        "each task ran within 2 s of being queued, not at the 10 s timer: {latencies:?}"
    );
    drop(den);
    db.drop().await;
}

/// The fallback a server without change streams gets: claims on the node's timer (and on
/// runner exits). `change_streams: false` chooses it on a server that has them.
#[tokio::test]
async fn without_change_streams_a_node_claims_on_its_timer() {
    let db = TestDb::new("wakeups_polling").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"loop_interval_ms": 300, "change_streams": false, "metrics_listen": "127.0.0.1:0"}),
    );
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start(&config, "n1");
    wait_for("the node to start", Duration::from_secs(30), || async {
        den.log_text().contains("change streams are off")
    })
    .await;
    let base = den
        .log_text()
        .lines()
        .find_map(|l| l.strip_prefix("metrics on ").map(str::to_string))
        .expect("metrics line");
    let scrape = || async {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body");
        let e = disbatch_tests::exposition::check(&text).unwrap_or_else(|err| panic!("{err}"));
        let wakeups = |s: &str| e.value("disbatch_den_wakeups_total", &[("source", s)]);
        let woken: f64 = ["timer", "runner_exit", "change_stream"]
            .iter()
            .map(|s| wakeups(s).unwrap_or(0.0))
            .sum();
        let passes = e.value("disbatch_den_passes_total", &[]).unwrap_or(0.0);
        // A wake-up is counted before its pass runs; the start-up pass is not a wake-up.
        let settled = passes >= woken + 1.0;
        (
            wakeups("timer").unwrap_or(0.0),
            wakeups("change_stream"),
            settled,
            text,
        )
    };
    // Begin once a timer pass has run to its end: every task below needs a wake-up of its own.
    let deadline = Instant::now() + Duration::from_secs(10);
    let timer_before = loop {
        let (timer, _, settled, _) = scrape().await;
        if timer >= 1.0 && settled {
            break timer;
        }
        assert!(
            Instant::now() < deadline,
            "no settled timer pass within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut latencies = Vec::new();
    for _ in 0..4 {
        let queued = Instant::now();
        let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
        db.wait_complete(&[id], Duration::from_secs(10)).await;
        latencies.push(queued.elapsed());
        // Queue the next one at another point of the timer's cycle.
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    latencies.sort();
    assert!(
        latencies[3] < Duration::from_secs(3),
        "each task ran within a few timer passes: {latencies:?}"
    );
    let (timer, change_stream, _, text) = scrape().await;
    assert_eq!(change_stream, Some(0.0), "{text}");
    assert!(
        timer - timer_before >= 4.0,
        "each task waited for a timer pass: {timer_before} → {timer}\n{text}"
    );
    assert!(!den.log_text().contains("watching tasks and queues"));
    drop(den);
    db.drop().await;
}

/// A node with more claimable tasks than room closes its change streams (the server reads
/// every write for an open stream; its own runners' exits wake it), and opens them again once
/// it runs short: a task queued after the backlog still starts on its event, not at the 10 s
/// timer.
#[tokio::test]
async fn a_busy_node_closes_its_change_streams_and_opens_them_when_it_runs_short() {
    let db = TestDb::new("wakeups_busy").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"loop_interval_ms": 10_000, "metrics_listen": "127.0.0.1:0"}),
    );
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start(&config, "n1");
    wait_for("the change streams", Duration::from_secs(30), || async {
        den.log_text().contains("watching tasks and queues")
    })
    .await;
    let scrape = || async {
        let text = den.scrape().await;
        let e = disbatch_tests::exposition::check(&text).unwrap_or_else(|err| panic!("{err}"));
        (
            e.value("disbatch_den_change_streams_open", &[])
                .unwrap_or(-1.0),
            e.value("disbatch_den_wakeups_total", &[("source", "change_stream")])
                .unwrap_or(0.0),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape().await.0 != 2.0 {
        assert!(
            Instant::now() < deadline,
            "both streams open on an idle node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 2 at a time, 200 ms each: about 2 s of backlog.
    let backlog = db
        .insert_tasks(
            queue,
            (0..20).map(|_| doc! {"sleep_ms": 200}.into()).collect(),
        )
        .await;
    let mut closed = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !closed && Instant::now() < deadline {
        closed = scrape().await.0 == 0.0;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        closed,
        "the streams closed while the node had more tasks than room"
    );
    db.wait_complete(&backlog, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while scrape().await.0 != 2.0 {
        assert!(
            Instant::now() < deadline,
            "the streams opened again once the node ran short"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let events_before = scrape().await.1;
    let queued = Instant::now();
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.wait_complete(&[id], Duration::from_secs(5)).await;
    assert!(
        queued.elapsed() < Duration::from_secs(2),
        "a task queued after the backlog ran on its event, not at the 10 s timer: {:?}",
        queued.elapsed()
    );
    assert!(
        scrape().await.1 > events_before,
        "woken by the change stream"
    );
    drop(den);
    db.drop().await;
}
