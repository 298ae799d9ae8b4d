//! Two DENs on one queue: the global `threads` holds across nodes, each task runs once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::doc;
use disbatch_tests::{read_lines, write_config, Den, TestDb};
use serde_json::json;

/// Samples running (-1/0) counts until stopped; returns (max overall, max on `node`).
fn spawn_sampler(
    db: &TestDb,
    queue: bson::oid::ObjectId,
    node: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, u64, u32)> {
    let tasks = db.tasks();
    tokio::spawn(async move {
        let (mut max_all, mut max_node, mut samples) = (0, 0, 0);
        while !stop.load(Ordering::Relaxed) {
            let running = doc! {"queue": queue, "status": {"$in": [-1, 0]}};
            let all = tasks.count_documents(running.clone()).await.unwrap_or(0);
            let mut on_node = running;
            on_node.insert("node", node);
            let mine = tasks.count_documents(on_node).await.unwrap_or(0);
            max_all = max_all.max(all);
            max_node = max_node.max(mine);
            samples += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (max_all, max_node, samples)
    })
}

#[tokio::test]
async fn two_nodes_share_a_queue_within_its_global_threads() {
    let db = TestDb::new("twonodes").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("shared", "echo", 3).await;
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
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(&db, queue, "n1", stop.clone());
    let n1 = Den::start(&config, "n1");
    let n2 = Den::start(&config, "n2");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    stop.store(true, Ordering::Relaxed);
    let (max_running, _, samples) = sampler.await.expect("sampler");

    assert!(samples > 20, "sampler took only {samples} samples");
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
    drop((n1, n2));
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
    let queue = db.insert_queue("capped", "echo", 4).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..40)
                .map(|i| doc! {"i": i, "sleep_ms": 60}.into())
                .collect(),
        )
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = spawn_sampler(&db, queue, "n1", stop.clone());
    let n1 = Den::start(&config, "n1");
    let n2 = Den::start(&config, "n2");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    stop.store(true, Ordering::Relaxed);
    let (max_all, max_n1, _) = sampler.await.expect("sampler");
    assert!(
        max_n1 <= 1,
        "n1 has maxthreads \"1\" but ran {max_n1} at once"
    );
    assert!(max_all <= 4, "queue threads 4 exceeded: {max_all}");
    assert!(
        db.count(doc! {"node": "n1"}).await > 0,
        "n1 still takes part"
    );
    let node = db
        .db
        .collection::<bson::Document>("nodes")
        .find_one(doc! {"node": "n1"})
        .await
        .expect("find")
        .expect("node");
    assert_eq!(
        node.get_str("maxthreads").ok(),
        Some("1"),
        "heartbeat kept maxthreads: {node}"
    );
    drop((n1, n2));
    db.drop().await;
}
