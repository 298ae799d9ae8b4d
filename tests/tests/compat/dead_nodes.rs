//! Lease-less claims (a Perl node's) of a node that stopped heartbeating are recovered by
//! their queue's `on_lost`; a live node's, and a silent node's leased ones, are left alone.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// How often the leader looks for silent nodes: dead_node_after_s (10 s here) / 4.
const SILENT_CHECK_EVERY: Duration = Duration::from_millis(2_500);

fn ago(secs: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - secs * 1000)
}

async fn heartbeat(db: &TestDb, node: &str, at: DateTime) {
    db.db
        .collection::<Document>("nodes")
        .update_one(
            doc! {"node": node},
            doc! {"$set": {"node": node, "timestamp": at}},
        )
        .upsert(true)
        .await
        .expect("node");
}

// Multi-threaded: the heartbeat of perl-live must keep beating while `Den::start` blocks its
// thread waiting for the node to be ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_nodes_lease_less_tasks_follow_on_lost_and_others_are_left_alone() {
    let db = TestDb::new("dead_nodes").await;
    let config = write_config(&db, "node.json", json!({"dead_node_after_s": 10}));
    let plain = db.insert_queue("plain", "echo", 4).await;
    let lossy = db.insert_queue("lossy", "echo", 4).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": lossy}, doc! {"$set": {"on_lost": "requeue"}})
        .await
        .expect("on_lost");
    heartbeat(&db, "perl-dead", ago(20 * 60)).await;
    heartbeat(&db, "perl-live", DateTime::now()).await;
    let task = |queue: ObjectId, status: i32, node: &str| {
        doc! {"_id": ObjectId::new(), "queue": queue, "status": status, "node": node,
        "params": {}, "ctime": ago(1200), "mtime": ago(1200),
        "stdout": Bson::Null, "stderr": Bson::Null}
    };
    let claimed = task(plain, -1, "perl-dead");
    let started = task(plain, 0, "perl-dead");
    let requeued = task(lossy, 0, "perl-dead");
    let live = task(plain, 0, "perl-live");
    let mut leased = task(plain, 0, "perl-dead");
    // Ours carry a lease; recovering those is the lease's business, not the silence's.
    leased.insert("lease_until", DateTime::from_millis(i64::MAX / 2));
    let id = |d: &Document| d.get_object_id("_id").expect("id");
    let ids = [&claimed, &started, &requeued, &live, &leased].map(id);
    db.tasks()
        .insert_many([&claimed, &started, &requeued, &live, &leased])
        .await
        .expect("tasks");

    // Keeps perl-live alive while the test runs, from before our node's first pass.
    let live_db = db.db.clone();
    let beat = tokio::spawn(async move {
        loop {
            let _ = live_db
                .collection::<Document>("nodes")
                .update_one(
                    doc! {"node": "perl-live"},
                    doc! {"$set": {"timestamp": DateTime::now()}},
                )
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let den = Den::start(&config, "rust-1");
    db.wait_complete(&[ids[0], ids[2]], Duration::from_secs(60))
        .await;
    wait_for(
        "the started task orphaned",
        Duration::from_secs(30),
        || async { db.task(ids[1]).await.get_i32("status").ok() == Some(status::ORPHANED) },
    )
    .await;
    for (i, what) in [(0, "the claim that never started"), (2, "the requeued run")] {
        let t = db.task(ids[i]).await;
        assert_eq!(
            t.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{what} ran again: {t}"
        );
        assert_eq!(t.get_str("node").ok(), Some("rust-1"), "{t}");
    }
    // Still untouched at the next check for silent nodes. Those checks come every
    // dead_node_after / 4 (2.5 s), not every pass, so that much time must pass (a lower
    // bound: load only lengthens it) since the check that recovered the others; then two
    // more readings of the queues mean a maintenance pass, and in it that check, ran since.
    tokio::time::sleep(SILENT_CHECK_EVERY).await;
    den.wait_queue_reads(2).await;
    for (i, what) in [(3, "a live node's run"), (4, "a leased run")] {
        let t = db.task(ids[i]).await;
        assert_eq!(
            t.get_i32("status").ok(),
            Some(status::RUNNING),
            "{what} left alone: {t}"
        );
        assert_eq!(
            t.get_str("node").ok(),
            Some(if i == 3 { "perl-live" } else { "perl-dead" })
        );
    }
    beat.abort();
    drop(den);
    db.drop().await;
}
