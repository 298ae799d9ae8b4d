//! Nodes sharing a capped queue each get a share of its slots: every live node that serves
//! the queue and has room gets a lane, weighted by its room, so the node that frees a slot does
//! not keep refilling it while the others idle.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{doc, Document};
use disbatch_tests::{write_config, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

/// `dens` equal nodes, `n0`, `n1`, …, with no `maxthreads`.
async fn share_by_node(
    db: &TestDb,
    dens: usize,
    threads: i32,
    tasks: usize,
) -> BTreeMap<String, usize> {
    let names: Vec<String> = (0..dens).map(|i| format!("n{i}")).collect();
    let nodes: Vec<(&str, Option<i32>)> = names.iter().map(|n| (n.as_str(), None)).collect();
    share_by_maxthreads(db, &nodes, threads, tasks).await
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

/// How many of the tasks matching `filter` each node holds (by the tasks' `node`).
async fn tasks_by_node(db: &TestDb, filter: Document) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut cursor = db.tasks().find(filter).await.expect("find");
    while let Some(t) = cursor.try_next().await.expect("next") {
        *out.entry(t.get_str("node").unwrap_or("?").to_string())
            .or_insert(0) += 1;
    }
    out
}

/// Claimed or running tasks of `queue` on each node now.
async fn holding(db: &TestDb, queue: bson::oid::ObjectId) -> BTreeMap<String, usize> {
    tasks_by_node(db, doc! {"queue": queue, "status": {"$in": [-1, 0]}}).await
}

#[tokio::test]
async fn a_node_that_joins_later_gets_its_share_within_seconds() {
    let db = TestDb::new("fair_join").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("shared", "echo", 6).await;
    db.insert_tasks(
        queue,
        (0..600)
            .map(|_| doc! {"sleep_ms": 200_i64}.into())
            .collect(),
    )
    .await;
    let _first: Vec<Den> = (0..2)
        .map(|i| Den::start(&config, &format!("n{i}")))
        .collect();
    // The two share the queue's 6 slots between them before the third arrives.
    disbatch_tests::wait_for(
        "two nodes to fill the queue",
        Duration::from_secs(20),
        || async { holding(&db, queue).await.values().sum::<usize>() == 6 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let joined = std::time::Instant::now();
    let _late = Den::start(&config, "n2");
    let mut share_at = None;
    let mut first_at = None;
    while joined.elapsed() < Duration::from_secs(30) {
        let now = holding(&db, queue).await;
        let late = now.get("n2").copied().unwrap_or(0);
        if late >= 1 && first_at.is_none() {
            first_at = Some(joined.elapsed());
        }
        // Its share of 6 slots among 3 nodes.
        if late >= 2 {
            share_at = Some(joined.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("the late node ran its first task after {first_at:?} and held its share (2 of 6) after {share_at:?}, process start included");
    let share_at = share_at.expect("the late node never held its share of the queue");
    assert!(share_at < Duration::from_secs(10), "{share_at:?}");

    // Starvation: how long a node holds less than its share (2) while another holds more.
    let (mut longest, mut since, mut readings) = (Duration::ZERO, None, 0);
    let watch = std::time::Instant::now();
    while watch.elapsed() < Duration::from_secs(15) {
        let now = holding(&db, queue).await;
        let held = |n: &str| now.get(n).copied().unwrap_or(0);
        let nodes = ["n0", "n1", "n2"];
        let starved = nodes.iter().any(|n| held(n) < 2) && nodes.iter().any(|n| held(n) > 2);
        match (starved, since) {
            (true, None) => since = Some(std::time::Instant::now()),
            (false, Some(t)) => {
                longest = longest.max(t.elapsed());
                since = None;
            }
            _ => {}
        }
        readings += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Some(t) = since {
        longest = longest.max(t.elapsed());
    }
    println!("longest time a node held less than its share while another held more: {longest:?} ({readings} readings over 15 s)");
    assert!(longest < Duration::from_secs(3), "{longest:?}");
    db.drop().await;
}

/// Runs `tasks` 50 ms tasks on a queue of `threads` over nodes with the given `maxthreads`
/// (None: no limit), set as ops set them on the node documents; returns the tasks by node.
/// Runs `tasks` 50 ms tasks on a queue of `threads` shared by `nodes` (name, `maxthreads`),
/// opened once every node has registered and read the others: tasks run by each node.
async fn share_by_maxthreads(
    db: &TestDb,
    nodes: &[(&str, Option<i32>)],
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
    let dens: Vec<Den> = nodes.iter().map(|(n, _)| Den::start(&config, n)).collect();
    let names: Vec<&str> = nodes.iter().map(|(n, _)| *n).collect();
    disbatch_tests::wait_for(
        "every node to register",
        // A loaded machine can take seconds to start a node; a late one would get less.
        Duration::from_secs(60),
        || async {
            db.db
                .collection::<Document>("nodes")
                .count_documents(doc! {"node": {"$in": &names}})
                .await
                .expect("count")
                == names.len() as u64
        },
    )
    .await;
    for (node, max) in nodes {
        if let Some(max) = max {
            db.db
                .collection::<Document>("nodes")
                .update_one(doc! {"node": node}, doc! {"$set": {"maxthreads": max}})
                .await
                .expect("maxthreads");
        }
    }
    // Every node has read its limit and the others' before the queue opens.
    tokio::time::sleep(Duration::from_secs(3)).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"threads": threads}})
        .await
        .expect("open the queue");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let by_node = tasks_by_node(db, doc! {"queue": queue}).await;
    drop(dens);
    by_node
}

#[tokio::test]
async fn a_node_with_less_room_leaves_the_rest_to_the_others() {
    let db = TestDb::new("fair_room").await;
    let by_node = share_by_maxthreads(&db, &[("small", Some(1)), ("big", None)], 6, 120).await;
    println!("maxthreads 1 beside unlimited, threads 6, 120 tasks: {by_node:?}");
    let small_n = by_node.get("small").copied().unwrap_or(0);
    let big_n = by_node.get("big").copied().unwrap_or(0);
    // Room 1 of 6: about a sixth; the rest goes to the node that has room for it.
    assert!((5..=36).contains(&small_n), "{by_node:?}");
    assert!(big_n >= 84, "{by_node:?}");
    db.drop().await;
}

#[tokio::test]
async fn shares_follow_the_room_each_node_has() {
    let db = TestDb::new("fair_weights").await;
    // Both nodes could hold 3 of the 6 slots, which equal shares would give them. By room
    // (3 and 9, that is 3 and 6 on a queue of 6) the first gets a third and the second two.
    let by_node = share_by_maxthreads(&db, &[("a", Some(3)), ("b", Some(9))], 6, 150).await;
    println!("maxthreads 3 and 9, threads 6, 150 tasks: {by_node:?}");
    let a = by_node.get("a").copied().unwrap_or(0);
    let b = by_node.get("b").copied().unwrap_or(0);
    assert_eq!(a + b, 150, "{by_node:?}");
    assert!((30..=65).contains(&a), "a third, not a half: {by_node:?}");
    assert!(b >= 85, "two thirds: {by_node:?}");
    db.drop().await;
}
