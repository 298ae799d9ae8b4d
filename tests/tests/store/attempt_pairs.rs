//! A task write and its attempt record are two writes: a node or server that dies between them
//! must not leave the attempt history short. A proxy between the node and the server lets the
//! first write of the pair through, then cuts the node off before the second.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_model::status;
use disbatch_tests::faults::cutting_proxy::{After, CuttingProxy};
use disbatch_tests::runner_of;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

const RECOVERED: &str = "the recovery's task write";
/// When to give up waiting for the cut: a deadline, never a bound on the product.
const CUT_WITHIN: Duration = Duration::from_secs(120);

/// Recovery's write of a task: the one `update` of `tasks` that matches a task by the lease it
/// had and removes it (claims match by `mtime`, results and give-backs by attempt).
fn is_recovery_write(c: &Document) -> bool {
    let first = c
        .get_array("updates")
        .ok()
        .and_then(|u| u.first())
        .and_then(Bson::as_document);
    c.get_str("update") == Ok("tasks")
        && first.is_some_and(|s| {
            s.get_document("q")
                .is_ok_and(|q| q.contains_key("lease_until"))
                && s.get_document("u")
                    .and_then(|u| u.get_document("$unset"))
                    .is_ok_and(|u| u.contains_key("lease_until"))
        })
}

/// A node through `proxy` (with driver `attributes`) serving a requeue queue with one task,
/// whose first run has started and holds until `gate` exists. Returns the node, the task and
/// its runner's pid.
async fn one_task_running(
    db: &TestDb,
    proxy: &CuttingProxy,
    attributes: serde_json::Value,
) -> (Den, ObjectId, Pid) {
    let config = write_config(
        db,
        "node.json",
        json!({
            "mongohost": proxy.uri, "metrics_listen": "127.0.0.1:0", "attributes": attributes,
        }),
    );
    let queue = db.insert_queue("pairs", "echo", 1).await;
    db.db
        .collection::<Document>("queues")
        .update_one(
            doc! {"_id": queue},
            doc! {"$set": {"on_lost": "requeue", "max_retries": 5}},
        )
        .await
        .expect("queue");
    let started = db.path("started");
    let gate = db.path("gate");
    let ids = db
        .insert_tasks(
            queue,
            vec![doc! {
                "append_to": started.to_str().expect("path"),
                "hold_until": gate.to_str().expect("path"),
            }
            .into()],
        )
        .await;
    let den = Den::start(&config, "pairs1");
    let task = ids[0];
    wait_for(
        "the task's runner in the node's heartbeat",
        Duration::from_secs(60),
        || async { runner_of(db, "pairs1", task).await.is_some() },
    )
    .await;
    wait_for("the task's plugin to start", Duration::from_secs(60), || {
        let started = started.clone();
        async move { std::fs::read_to_string(&started).is_ok_and(|s| s.contains(&task.to_hex())) }
    })
    .await;
    let pid = runner_of(db, "pairs1", task)
        .await
        .expect("listed a moment ago");
    (den, task, pid)
}

/// The task's attempts as its records tell them, oldest first: (attempt, outcome).
async fn history(db: &TestDb, task: ObjectId) -> Vec<(ObjectId, String)> {
    db.attempts(task)
        .await
        .iter()
        .map(|a| {
            (
                a.get_object_id("_id").expect("record id"),
                a.get_str("outcome").unwrap_or("?").to_string(),
            )
        })
        .collect()
}

/// Once the task has succeeded: every attempt it went through has exactly one record, the
/// first `lost` and the last `succeeded`, the one the task names.
async fn assert_history_complete(db: &TestDb, task: ObjectId, lost: ObjectId) {
    db.wait_complete(&[task], Duration::from_secs(60)).await;
    let t = db.task(task).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t:?}");
    let attempts = t.get_i32("attempts").expect("attempts") as usize;
    assert_eq!(
        attempts, 2,
        "one lost attempt, then one that succeeded: {t:?}"
    );
    // The repair is the maintenance leader's; a deadline, not a bound on when it happens.
    wait_for(
        "a record for each of the task's attempts",
        Duration::from_secs(60),
        || async { history(db, task).await.len() >= attempts },
    )
    .await;
    let records = history(db, task).await;
    let winner = t.get_object_id("attempt").expect("attempt");
    assert_eq!(
        records,
        vec![
            (lost, "lost".to_string()),
            (winner, "succeeded".to_string())
        ],
        "the task: {t:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_between_recovering_a_task_and_recording_its_lost_attempt() {
    let db = TestDb::new("pairs_kill").await;
    let proxy = CuttingProxy::start(&db.uri);
    let (mut den, task, runner) = one_task_running(&db, &proxy, json!({})).await;
    let lost = db
        .task(task)
        .await
        .get_object_id("attempt")
        .expect("attempt");
    proxy.arm(is_recovery_write, After::Hold);
    // The node sees its runner die without a result and recovers the task at once.
    kill(runner, Signal::SIGKILL).expect("kill the runner");
    let cut = tokio::time::timeout(CUT_WITHIN, proxy.wait_cut())
        .await
        .unwrap_or_else(|_| panic!("{RECOVERED} never came:\n{}", den.log_text()));
    // The node dies between the two writes: the task has moved, the record is not written.
    den.kill_hard();
    let moved = db.task(task).await;
    assert_eq!(
        moved.get_i32("status").ok(),
        Some(status::QUEUED),
        "requeued: {moved:?}\n{cut:?}"
    );
    assert!(
        history(&db, task).await.is_empty(),
        "the proxy cut the node off before the record: {:?}",
        history(&db, task).await
    );
    std::fs::write(db.path("gate"), "").expect("open the gate");
    proxy.release();
    let den = Den::start(&db.path("node.json"), "pairs1");
    assert_history_complete(&db, task, lost).await;
    assert_eq!(
        den.metric("disbatch_den_attempt_records_repaired_total")
            .await,
        1.0,
        "the record written late is counted\n{}",
        den.log_text()
    );
    assert!(
        den.log_text()
            .contains("wrote the record of a lost attempt that its recovery had left unwritten"),
        "and logged:\n{}",
        den.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_lost_between_recovering_a_task_and_recording_its_lost_attempt() {
    let db = TestDb::new("pairs_lost").await;
    let proxy = CuttingProxy::start(&db.uri);
    // The driver gives up on an unreachable server after 2 s instead of 30.
    let quick = json!({"server_selection_timeout_ms": 2000});
    let (den, task, runner) = one_task_running(&db, &proxy, quick).await;
    let lost = db
        .task(task)
        .await
        .get_object_id("attempt")
        .expect("attempt");
    proxy.arm(is_recovery_write, After::Hold);
    kill(runner, Signal::SIGKILL).expect("kill the runner");
    tokio::time::timeout(CUT_WITHIN, proxy.wait_cut())
        .await
        .unwrap_or_else(|_| panic!("{RECOVERED} never came:\n{}", den.log_text()));
    // The server stays out of reach until the node has given the recovery up: its write's
    // reply never came, and its retry found no server.
    wait_for(
        "the node to give up the recovery",
        Duration::from_secs(60),
        || async {
            den.log_text()
                .contains("could not recover the task of a runner that died")
        },
    )
    .await;
    std::fs::write(db.path("gate"), "").expect("open the gate");
    proxy.release();
    assert_history_complete(&db, task, lost).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_between_recovering_a_task_and_recording_its_lost_attempt() {
    let db = TestDb::new("pairs_cut").await;
    let proxy = CuttingProxy::start(&db.uri);
    let (den, task, runner) = one_task_running(&db, &proxy, json!({})).await;
    let lost = db
        .task(task)
        .await
        .get_object_id("attempt")
        .expect("attempt");
    proxy.arm(is_recovery_write, After::Reconnect);
    kill(runner, Signal::SIGKILL).expect("kill the runner");
    tokio::time::timeout(CUT_WITHIN, proxy.wait_cut())
        .await
        .unwrap_or_else(|_| panic!("{RECOVERED} never came:\n{}", den.log_text()));
    // The node reconnects at once (its write is retried, and the server answers the retry
    // with the first try's result); its next run of the task goes through.
    std::fs::write(db.path("gate"), "").expect("open the gate");
    assert_history_complete(&db, task, lost).await;
}
