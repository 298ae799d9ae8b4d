//! Two DENs on one queue: the global `threads` holds across nodes, each task runs once.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::claim_order::{holdings, wait_sharers, Recording};
use disbatch_tests::{read_lines, write_config, Den, TestDb};
use serde_json::json;

/// The most the queue's tasks and `n1` held at once, replayed from every claim and release in
/// the server's order: exact, with no sampler to miss a moment or to load the server.
struct Held {
    max_all: usize,
    max_n1: usize,
    claims: usize,
}

/// Starts DENs `n1` and `n2` on a queue inserted with `threads` 0, opens it to `threads` once
/// both have read each other as sharers of it, records every change to the tasks until each
/// is complete, then stops the DENs.
///
/// Opening late matters: on a loaded machine one node can start a second or more after the
/// other, which alone could drain a short queue before the late one claims anything.
async fn drain_with_two_nodes(
    db: &TestDb,
    config: &Path,
    (queue, name): (ObjectId, &str),
    threads: i32,
    ids: &[ObjectId],
) -> Held {
    let recording = Recording::start(db.tasks()).await;
    let nodes = [Den::start(config, "n1"), Den::start(config, "n2")];
    wait_sharers(&nodes.iter().collect::<Vec<_>>(), name, 2).await;
    db.set_threads(queue, threads).await;
    db.wait_complete(ids, Duration::from_secs(120)).await;
    let changes = recording.finish().await;
    drop(nodes);
    let steps = holdings(&changes, &ids.iter().copied().collect());
    Held {
        max_all: steps.iter().map(|s| s.total()).max().unwrap_or(0),
        max_n1: steps.iter().map(|s| s.of("n1")).max().unwrap_or(0),
        claims: steps.iter().filter(|s| s.claim).count(),
    }
}

#[tokio::test]
async fn two_nodes_share_a_queue_within_its_global_threads() {
    let db = TestDb::new("twonodes").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("shared", "echo", 0).await;
    let runs = db.path("runs.txt");
    let runs_path = runs.to_string_lossy().to_string();
    let ids = db
        .insert_tasks(
            queue,
            (0..100)
                .map(|i| doc! {"i": i, "sleep_ms": 40, "append_to": &runs_path}.into())
                .collect(),
        )
        .await;
    let Held {
        max_all: max_running,
        claims,
        ..
    } = drain_with_two_nodes(&db, &config, (queue, "shared"), 3, &ids).await;

    eprintln!(
        "two nodes, threads 3, 100 tasks: max running {max_running}, {claims} claims replayed"
    );
    assert_eq!(claims, 100, "the replay saw each task claimed once");
    assert!(
        max_running <= 3,
        "queue threads 3 exceeded: {max_running} running at once"
    );
    assert!(
        max_running >= 2,
        "the queue never ran in parallel (max {max_running})"
    );
    let lines = read_lines(&runs);
    let distinct: HashSet<&String> = lines.iter().collect();
    assert_eq!(lines.len(), 100, "each task runs exactly once");
    assert_eq!(distinct.len(), 100);
    assert_eq!(db.count(doc! {"queue": queue, "status": 1}).await, 100);
    let by_n1 = db.count(doc! {"queue": queue, "node": "n1"}).await;
    let by_n2 = db.count(doc! {"queue": queue, "node": "n2"}).await;
    assert!(
        by_n1 > 0 && by_n2 > 0,
        "both nodes take part: n1 {by_n1}, n2 {by_n2}"
    );
    db.drop().await;
}

#[tokio::test]
async fn node_maxthreads_caps_one_node_while_the_other_fills_the_queue() {
    let db = TestDb::new("maxthreads").await;
    let config = write_config(&db, "node.json", json!({}));
    // Ops set maxthreads before the node's first heartbeat; the heartbeat must keep it.
    db.db
        .collection::<bson::Document>("nodes")
        .insert_one(doc! {"node": "n1", "maxthreads": "1"})
        .await
        .expect("node doc");
    let queue = db.insert_queue("capped", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..40)
                .map(|i| doc! {"i": i, "sleep_ms": 60}.into())
                .collect(),
        )
        .await;
    let Held {
        max_all,
        max_n1,
        claims,
    } = drain_with_two_nodes(&db, &config, (queue, "capped"), 4, &ids).await;
    assert_eq!(claims, 40, "the replay saw each task claimed once");
    assert!(
        max_n1 <= 1,
        "n1 has maxthreads \"1\" but ran {max_n1} at once"
    );
    assert!(max_all <= 4, "queue threads 4 exceeded: {max_all}");
    assert!(
        db.count(doc! {"node": "n1"}).await > 0,
        "n1 still takes part"
    );
    let node = db.node("n1").await;
    assert_eq!(
        node.get_str("maxthreads").ok(),
        Some("1"),
        "heartbeat kept maxthreads: {node}"
    );
    db.drop().await;
}
