//! A database outage mid-run with a real node and runners: nobody crashes, results made
//! during the outage are written when the server is back, no task is lost or run twice.

use std::time::{Duration, Instant};

use bson::doc;
use disbatch_model::status;
use disbatch_tests::processes_of_attempt;
use disbatch_tests::restartable::RestartableServer;
use disbatch_tests::{read_lines, wait_for, write_config, Den, TestDb};
use serde_json::json;

/// 20 s by default; DISBATCH_OUTAGE_SECS=60 runs the full minute.
fn outage() -> Duration {
    let secs = std::env::var("DISBATCH_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

#[tokio::test]
async fn a_server_outage_mid_run_loses_no_result_and_runs_nothing_twice() {
    let mut server = RestartableServer::start();
    let db = TestDb::on(server.uri(), "outage").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 3).await;
    db.db
        .collection::<bson::Document>("queues")
        .update_one(
            doc! {"_id": queue},
            doc! {"$set": {"lease": 3, "on_lost": "requeue"}},
        )
        .await
        .expect("queue");
    let runs = db.path("runs.txt");
    let append = runs.to_string_lossy().to_string();
    let outage = outage();
    // One plugin ends during the outage, one after it, each when the test opens its gate;
    // the rest are queued behind them.
    let (during, after) = (db.path("gate-during"), db.path("gate-after"));
    let held = |gate: &std::path::Path| {
        doc! {"append_to": &append, "hold_until": gate.to_string_lossy().to_string()}.into()
    };
    let mut params = vec![held(&during), held(&after)];
    params.extend((0..8).map(|_| doc! {"append_to": &append}.into()));
    let slow = db.insert_tasks(queue, params[..2].to_vec()).await;
    let mut den = Den::start(&config, "n1");
    wait_for(
        "both slow plugins to start",
        Duration::from_secs(60),
        || {
            let started = read_lines(&runs).len() == 2;
            async move { started }
        },
    )
    .await;
    let first_attempt = db
        .task(slow[0])
        .await
        .get_object_id("attempt")
        .expect("attempt");
    let quick = db.insert_tasks(queue, params[2..].to_vec()).await;

    server.kill();
    let down = Instant::now();
    std::fs::write(&during, "").expect("open the first gate");
    // Its plugin has exited while the server is down: its result has nowhere to go yet.
    wait_for("the first plugin to end", Duration::from_secs(60), || {
        let ended = processes_of_attempt(first_attempt).is_empty();
        async move { ended }
    })
    .await;
    // The outage itself, deliberately longer than the lease (3 s) and server selection; on a
    // slow machine it lasts at least until the first plugin has ended.
    tokio::time::sleep(outage.saturating_sub(down.elapsed())).await;
    assert!(den.is_running(), "the node survived the outage");
    // Nothing can be stored before this moment: the server is down until restart() begins.
    let back = bson::DateTime::now();
    server.restart();
    println!("server down for {:?}", down.elapsed());
    std::fs::write(&after, "").expect("open the second gate");

    let mut all = slow.clone();
    all.extend(&quick);
    db.wait_complete(&all, Duration::from_secs(90)).await;
    for id in &all {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(task.get_i32("attempts").ok(), Some(1), "ran once: {task}");
    }
    let lines = read_lines(&runs);
    assert_eq!(lines.len(), all.len(), "each plugin ran once: {lines:?}");
    assert!(den.is_running());
    let log = den.log_text();
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("pass failed"), "the node logged the outage");
    assert!(log.contains("database reachable again"), "and the return");
    // The first plugin ended during the outage: its result was held (by its runner, which
    // waits through server selection and retries) and landed once the server was back.
    let first = db.task(slow[0]).await;
    let stored = first.get_datetime("mtime").expect("mtime");
    assert!(
        *stored >= back,
        "stored at {stored}, before the server was back at {back}: {log}"
    );
    den.stop();
    drop(db);
    drop(server);
}
