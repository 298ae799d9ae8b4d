//! Two DENs on one queue: the global `threads` holds across nodes, each task runs once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::path::Path;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::{read_lines, write_config, Den, TestDb};
use serde_json::json;

/// The highest running (-1/0) counts sampled while two DENs drain a queue.
struct Sampled {
    max_all: u64,
    max_n1: u64,
    samples: u32,
}

/// Starts DENs `n1` and `n2` on a queue inserted with `threads` 0, opens it to `threads` once
/// both have registered and read each other, samples the queue's running counts every few ms
/// until every task is complete, then stops the DENs.
///
/// Opening late matters: on a loaded machine one node can start a second or more after the
/// other, which alone could drain a short queue before the late one claims anything.
async fn drain_with_two_nodes(
    db: &TestDb,
    config: &Path,
    queue: ObjectId,
    threads: i32,
    ids: &[ObjectId],
) -> Sampled {
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = db.tasks();
    let stop_flag = stop.clone();
    let sampler = tokio::spawn(async move {
        let mut s = Sampled {
            max_all: 0,
            max_n1: 0,
            samples: 0,
        };
        while !stop_flag.load(Ordering::Relaxed) {
            let running = doc! {"queue": queue, "status": {"$in": [-1, 0]}};
            let all = tasks.count_documents(running.clone()).await.unwrap_or(0);
            let mut on_n1 = running;
            on_n1.insert("node", "n1");
            let mine = tasks.count_documents(on_n1).await.unwrap_or(0);
            s.max_all = s.max_all.max(all);
            s.max_n1 = s.max_n1.max(mine);
            s.samples += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        s
    });
    let nodes = (Den::start(config, "n1"), Den::start(config, "n2"));
    disbatch_tests::wait_for(
        "both nodes to register",
        Duration::from_secs(60),
        || async {
            db.db
                .collection::<bson::Document>("nodes")
                // A heartbeat writes `timestamp`; a document ops inserted beforehand has none.
                .count_documents(
                    doc! {"node": {"$in": ["n1", "n2"]}, "timestamp": {"$exists": true}},
                )
                .await
                .unwrap_or(0)
                == 2
        },
    )
    .await;
    // Each node reads the fleet every 2 s; past that, both know they share the queue.
    tokio::time::sleep(Duration::from_secs(3)).await;
    db.db
        .collection::<bson::Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"threads": threads}})
        .await
        .expect("open the queue");
    db.wait_complete(ids, Duration::from_secs(120)).await;
    stop.store(true, Ordering::Relaxed);
    drop(nodes);
    sampler.await.expect("sampler")
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
    let Sampled {
        max_all: max_running,
        samples,
        ..
    } = drain_with_two_nodes(&db, &config, queue, 3, &ids).await;

    eprintln!("two nodes, threads 3, 100 tasks: max running {max_running} over {samples} samples");
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
    let Sampled {
        max_all, max_n1, ..
    } = drain_with_two_nodes(&db, &config, queue, 4, &ids).await;
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
