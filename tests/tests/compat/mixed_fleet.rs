//! A mixed fleet: the real Disbatch 4.103 Perl DEN beside two of ours on one database. Every
//! task runs once, both kinds of node take part, no claim of ours that runs lands with the
//! queue already at its `threads` (judged in the server's order of writes, from a change
//! stream), and a dead Perl host's tasks are recovered by ours.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::claim_order::{replay, requeued_from, Change, Recording};
use disbatch_tests::peers::perl_den::PerlDen;
use disbatch_tests::{read_lines, write_config, Den, TestDb};
use futures::TryStreamExt;
use serde_json::json;

const DEMO: &str = "Disbatch::Plugin::Demo";

#[tokio::test]
async fn perl_and_rust_nodes_share_a_queue_within_its_cap_and_a_dead_perl_host_is_recovered() {
    if !disbatch_tests::peers::perl_den::available("mixed_fleet") {
        return;
    }
    let db = TestDb::new("mixed_fleet").await;
    let runs = db.path("runs.txt").to_string_lossy().to_string();
    // Our nodes map the Perl plugin's name onto the echo plugin, which ignores `commands`
    // and honours `sleep_ms` and `append_to` (the Perl Demo ignores those two).
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {DEMO: disbatch_tests::echo_plugin()}, "dead_node_after_s": 10}),
    );
    let threads = 6;
    let queue = db.insert_queue("mixed", DEMO, threads as i32).await;
    let params = || Bson::from(doc! {"commands": "a", "sleep_ms": 700_i64, "append_to": &runs});
    let perl_node = format!("perl-{}", std::process::id());
    let mut perl = PerlDen::start(&db, &perl_node);
    // Perl takes seconds to start: it is in the fleet once it heartbeats.
    let deadline = Instant::now() + Duration::from_secs(60);
    let nodes = db.db.collection::<Document>("nodes");
    while nodes
        .count_documents(doc! {"node": &perl_node})
        .await
        .expect("count")
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the Perl DEN never heartbeat: {}",
            perl.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Opened before the tasks exist, so it sees every claim, in the server's order.
    let recording = Recording::start(db.tasks()).await;
    let ids = db
        .insert_tasks(queue, (0..48).map(|_| params()).collect())
        .await;
    // Ours join a queue the Perl node is busy on: its slotless claims are there from the
    // first reading, and it claims again whenever it finds the queue below its cap.
    wait_for_perl_claims(&db, queue, &perl_node).await;
    let ours = [Den::start(&config, "rust-a"), Den::start(&config, "rust-b")];
    db.wait_complete(&ids, Duration::from_secs(180)).await;
    let changes = recording.finish().await;

    check_each_task_ran_once_on_both_kinds_within_the_cap(
        &db, queue, &perl_node, &runs, &ids, &changes, threads,
    )
    .await;

    // The Perl host dies holding tasks: they keep their queue's threads until its node has
    // been silent for dead_node_after_s, then a node of ours recovers them by on_lost.
    drop(ours);
    let lossy = db.insert_queue("lossy", DEMO, 4).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": lossy}, doc! {"$set": {"on_lost": "requeue"}})
        .await
        .expect("on_lost");
    // Which tasks the dead host left unfinished is read from the server's order of writes, not
    // from a snapshot after the kill: that races any write still landing from the host (CI saw
    // a task it held at the snapshot finished by its Perl runner afterwards).
    let recording = Recording::start(db.tasks()).await;
    let lossy_ids = db
        .insert_tasks(lossy, (0..8).map(|_| params()).collect())
        .await;
    wait_for_perl_claims(&db, lossy, &perl_node).await;
    perl.kill_host();
    let killed = Instant::now();
    // Its last heartbeat: the node is silent from then, not from the kill (up to a Perl
    // loop earlier, longer on a loaded machine).
    let last_beat = nodes
        .find_one(doc! {"node": &perl_node})
        .await
        .expect("read the Perl node")
        .and_then(|n| n.get_datetime("timestamp").ok().copied())
        .expect("the Perl node's last heartbeat");
    let rescuer = Den::start(&config, "rust-c");
    // Perl's runner sets the status, then `complete`: one killed between the two leaves a
    // task ended but never complete, which is Disbatch 4's own behaviour.
    wait_ended(&db, &lossy_ids, Duration::from_secs(120)).await;
    let done_after = killed.elapsed();
    let silent_for = Duration::from_millis(
        u64::try_from(DateTime::now().timestamp_millis() - last_beat.timestamp_millis())
            .unwrap_or(0),
    );
    check_the_dead_hosts_tasks_are_recovered_once_it_is_silent(
        &db, recording, &perl_node, &lossy_ids, done_after, silent_for,
    )
    .await;
    ran_once_each_on_ours(&runs);
    drop(rescuer);
    db.drop().await;
}

async fn check_each_task_ran_once_on_both_kinds_within_the_cap(
    db: &TestDb,
    queue: ObjectId,
    perl_node: &str,
    runs: &str,
    ids: &[ObjectId],
    changes: &[Change],
    threads: usize,
) {
    // Every task ran once, successfully, and both kinds of node took part.
    let tasks: Vec<Document> = db
        .tasks()
        .find(doc! {"queue": queue})
        .await
        .expect("find")
        .try_collect()
        .await
        .expect("tasks");
    let mut by_node = std::collections::BTreeMap::<String, usize>::new();
    for t in &tasks {
        assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
        *by_node
            .entry(t.get_str("node").unwrap_or("?").to_string())
            .or_default() += 1;
        if t.get_str("node").ok() == Some(perl_node) {
            assert!(
                t.get("attempts").is_none(),
                "a Perl claim keeps no attempts: {t}"
            );
        } else {
            assert_eq!(t.get_i32("attempts").ok(), Some(1), "run once: {t}");
        }
    }
    let ran_by_ours = ran_once_each_on_ours(runs);
    let perl_ran = by_node.get(perl_node).copied().unwrap_or(0);
    assert_eq!(perl_ran + ran_by_ours.len(), ids.len(), "{by_node:?}");
    println!("tasks by node: {by_node:?}");
    assert!(perl_ran > 0, "the Perl node took part: {by_node:?}");
    assert!(!ran_by_ours.is_empty(), "our nodes took part: {by_node:?}");

    let seen = replay(changes, &ids.iter().copied().collect(), threads);
    println!("mixed fleet, threads {threads}, in server order: {seen:?}");
    assert!(
        seen.claims_ours + seen.claims_perl >= ids.len(),
        "the change stream saw every claim: {seen:?}"
    );
    assert_eq!(
        seen.ours_past_cap, 0,
        "no claim of ours that ran landed with the queue at its threads: {seen:?}"
    );
}

async fn check_the_dead_hosts_tasks_are_recovered_once_it_is_silent(
    db: &TestDb,
    recording: Recording,
    perl_node: &str,
    lossy_ids: &[ObjectId],
    done_after: Duration,
    silent_for: Duration,
) {
    let changes = recording.finish().await;
    let lossy_set: std::collections::HashSet<ObjectId> = lossy_ids.iter().copied().collect();
    let recovered: Vec<ObjectId> = requeued_from(&changes, perl_node)
        .into_iter()
        .filter(|id| lossy_set.contains(id))
        .collect();
    println!(
        "a dead Perl host's {} tasks done by our node {done_after:?} after the kill, {silent_for:?} after its last heartbeat",
        recovered.len()
    );
    assert!(!recovered.is_empty(), "the Perl host died holding tasks");
    for id in lossy_ids {
        let t = db.task(*id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
    }
    for id in &recovered {
        let t = db.task(*id).await;
        assert_eq!(
            t.get_str("node").ok(),
            Some("rust-c"),
            "run again by ours: {t}"
        );
        assert_eq!(t.get_i32("attempts").ok(), Some(1), "run once by ours: {t}");
    }
    // A lower bound, and the property itself: done (recovered, then run) no sooner than
    // dead_node_after_s (10 s) after the node's last heartbeat.
    assert!(
        silent_for >= Duration::from_secs(10),
        "not before its node is silent for dead_node_after_s: done {silent_for:?} after its last heartbeat"
    );
}

/// Waits until the Perl node holds some of `queue`'s tasks.
async fn wait_for_perl_claims(db: &TestDb, queue: ObjectId, node: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = db
            .count(doc! {"queue": queue, "node": node, "status": {"$in": [status::CLAIMED, status::RUNNING]}})
            .await;
        if n > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the Perl node never claimed from {queue} (recent: {})",
            DateTime::now()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every task of `ids` has left queued, claimed and running.
async fn wait_ended(db: &TestDb, ids: &[ObjectId], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let open = db
            .count(doc! {"_id": {"$in": ids.to_vec()}, "status": {"$in": [status::QUEUED, status::CLAIMED, status::RUNNING]}})
            .await;
        if open == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{open} of {} tasks not ended after {timeout:?}; statuses: {:?}",
            ids.len(),
            db.status_histogram().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The tasks our nodes ran (the echo plugin appends each to `runs`), each at most once.
fn ran_once_each_on_ours(runs: &str) -> Vec<String> {
    let ran = read_lines(std::path::Path::new(runs));
    let distinct: std::collections::BTreeSet<&String> = ran.iter().collect();
    assert_eq!(distinct.len(), ran.len(), "no task ran twice on our nodes");
    ran
}
