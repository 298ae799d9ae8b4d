//! Nodes sharing a capped queue each get a share of its slots: every live node that serves
//! the queue and has room gets a lane, so the node that frees a slot does not keep refilling
//! it while the others idle.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use disbatch_tests::{write_config, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

async fn share_by_node(
    db: &TestDb,
    dens: usize,
    threads: i32,
    tasks: usize,
) -> BTreeMap<String, usize> {
    let config = write_config(db, "node.json", json!({}));
    let queue = db.insert_queue("shared", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..tasks)
                .map(|_| doc! {"sleep_ms": 50_i64}.into())
                .collect(),
        )
        .await;
    let nodes: Vec<Den> = (0..dens)
        .map(|i| Den::start(&config, &format!("n{i}")))
        .collect();
    // Every node is up and has said what it serves before the queue opens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"threads": threads}})
        .await
        .expect("open the queue");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let done: Vec<Document> = db
        .tasks()
        .find(doc! {"queue": queue})
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("tasks");
    let mut by_node = BTreeMap::new();
    for t in done {
        *by_node
            .entry(t.get_str("node").unwrap_or("?").to_string())
            .or_insert(0) += 1;
    }
    drop(nodes);
    by_node
}

#[tokio::test]
async fn two_nodes_share_a_capped_queue() {
    let db = TestDb::new("fair_two").await;
    let by_node = share_by_node(&db, 2, 4, 100).await;
    println!("2 nodes, threads 4, 100 tasks: {by_node:?}");
    assert_eq!(by_node.len(), 2, "{by_node:?}");
    assert!(
        by_node.values().all(|n| *n >= 30),
        "each node runs at least 30%: {by_node:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn three_nodes_share_a_capped_queue() {
    let db = TestDb::new("fair_three").await;
    let by_node = share_by_node(&db, 3, 6, 150).await;
    println!("3 nodes, threads 6, 150 tasks: {by_node:?}");
    assert_eq!(by_node.len(), 3, "{by_node:?}");
    assert!(
        by_node.values().all(|n| *n >= 30 && *n <= 70),
        "each node runs 20–47% of the tasks: {by_node:?}"
    );
    db.drop().await;
}
