//! Identical nodes get equal shares of a capped queue's backlog of tasks inserted straight
//! into the collection (as ops and Perl tools insert them: no work signal), whether the
//! backlog comes after the nodes have read each other or is there when they all start.
//!
//! Judged by the tasks each node ran, which is what an operator sees: every node between 20%
//! and 50%. `scripts/test` runs these alone; they are meant to hold beside a busy loop too
//! (the closing note of issue 30 says how they were run that way).

use std::collections::BTreeMap;
use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::claim_order::wait_sharers;
use disbatch_tests::{write_config, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

const NODES: usize = 3;
/// The production default: the tests' usual 100 ms passes hide what a node that reads its
/// queues only now and then does to the shares.
const LOOP_MS: u64 = 1000;
const THREADS: i32 = 6;
const TASKS: usize = 300;

/// Tasks of `queue` each node ran (the tasks' `node`).
async fn ran_by_node(db: &TestDb, queue: ObjectId) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut cursor = db.tasks().find(doc! {"queue": queue}).await.expect("find");
    while let Some(t) = cursor.try_next().await.expect("next") {
        *out.entry(t.get_str("node").unwrap_or("?").to_string())
            .or_insert(0) += 1;
    }
    out
}

async fn insert_backlog(db: &TestDb, queue: ObjectId) -> Vec<ObjectId> {
    db.insert_tasks(
        queue,
        (0..TASKS)
            .map(|i| doc! {"i": i as i64, "sleep_ms": 200_i64}.into())
            .collect(),
    )
    .await
}

/// Per node, the attempts it started in each second from the first start: printed beside the
/// shares, so a failed run says when a node went without.
async fn timeline(db: &TestDb) -> BTreeMap<String, Vec<usize>> {
    let mut starts: Vec<(String, i64)> = Vec::new();
    let mut cursor = db
        .db
        .collection::<bson::Document>("attempts")
        .find(doc! {})
        .await
        .expect("find attempts");
    while let Some(a) = cursor.try_next().await.expect("next attempt") {
        if let (Ok(node), Ok(start)) = (a.get_str("node"), a.get_datetime("start")) {
            starts.push((node.to_string(), start.timestamp_millis()));
        }
    }
    let first = starts.iter().map(|(_, t)| *t).min().unwrap_or(0);
    let mut out: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (node, t) in starts {
        let second = ((t - first) / 1000) as usize;
        let row = out.entry(node).or_default();
        if row.len() <= second {
            row.resize(second + 1, 0);
        }
        row[second] += 1;
    }
    out
}

fn check(
    ran: &BTreeMap<String, usize>,
    timeline: &BTreeMap<String, Vec<usize>>,
    dens: &[Den],
    how: &str,
) {
    println!("{NODES} nodes, threads {THREADS}, {TASKS} tasks of 0.2 s, {how}: {ran:?}");
    for (node, row) in timeline {
        println!("  {node} started per second: {row:?}");
    }
    let (low, high) = (TASKS * 20 / 100, TASKS * 50 / 100);
    let fair = ran.len() == NODES && ran.values().all(|n| (low..=high).contains(n));
    if !fair {
        for den in dens {
            println!("--- log of {} ---\n{}", den.log.display(), den.log_text());
        }
    }
    assert_eq!(ran.len(), NODES, "every node ran tasks: {ran:?}");
    assert!(
        ran.values().all(|n| (low..=high).contains(n)),
        "every node ran 20–50% of the tasks ({low}–{high}): {ran:?}"
    );
}

#[tokio::test]
async fn identical_nodes_share_a_backlog_inserted_behind_their_back() {
    let db = TestDb::new("shares_inserted").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": LOOP_MS}));
    let queue = db.insert_queue("shared", "echo", THREADS).await;
    let dens: Vec<Den> = (0..NODES)
        .map(|i| Den::start(&config, &format!("n{i}")))
        .collect();
    wait_sharers(&dens.iter().collect::<Vec<_>>(), "shared", NODES).await;
    let ids = insert_backlog(&db, queue).await;
    db.wait_complete(&ids, Duration::from_secs(180)).await;
    check(
        &ran_by_node(&db, queue).await,
        &timeline(&db).await,
        &dens,
        "inserted once the nodes had read each other",
    );
    drop(dens);
    db.drop().await;
}

#[tokio::test]
async fn identical_nodes_started_together_on_a_backlog_share_it() {
    let db = TestDb::new("shares_together").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": LOOP_MS}));
    let queue = db.insert_queue("shared", "echo", THREADS).await;
    let ids = insert_backlog(&db, queue).await;
    let dens: Vec<Den> = (0..NODES)
        .map(|i| {
            Den::spawn_adjusted(
                &disbatch_tests::bin_path("disbatchd"),
                &config,
                &format!("n{i}"),
                &[("RUST_LOG", "info,disbatch_den=debug")],
                |_| {},
            )
        })
        .collect();
    db.wait_complete(&ids, Duration::from_secs(180)).await;
    check(
        &ran_by_node(&db, queue).await,
        &timeline(&db).await,
        &dens,
        "there when the nodes started together",
    );
    drop(dens);
    db.drop().await;
}
