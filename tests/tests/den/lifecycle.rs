//! DEN start-up, shutdown, crash and orphan handling.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{bin_path, read_lines, wait_for, write_config, Den, TestDb};
use serde_json::json;

/// A task that appends its id to `runs` once its plugin runs, then waits until the test
/// creates `gate`: the test acts while the task provably runs, however slow the machine.
fn held(runs: &Path, gate: &Path) -> Document {
    doc! {"append_to": runs.to_string_lossy().to_string(), "hold_until": gate.to_string_lossy().to_string()}
}

/// Lets the held tasks finish.
fn open(gate: &Path) {
    std::fs::write(gate, "").expect("open the gate");
}

#[tokio::test]
async fn a_bad_config_is_refused_at_start_naming_the_file_and_key() {
    let db = TestDb::new("badconfig").await;
    let path = db.path("bad.json");
    std::fs::write(&path, r#"{"mongohost": "mongodb://127.0.0.1:1", "database": "d", "gfs": "sometimes", "colour": 1,}"#)
        .expect("write");
    let out = Command::new(bin_path("disbatchd"))
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run disbatchd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&*path.to_string_lossy()), "{stderr}");
    assert!(
        stderr.contains("`gfs`") && stderr.contains("sometimes"),
        "{stderr}"
    );

    std::fs::write(
        &path,
        r#"{"mongohost": "mongodb://127.0.0.1:1", "database": ["d"]}"#,
    )
    .expect("write");
    let out = Command::new(bin_path("disbatchd"))
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`database`") && stderr.contains("expected a string"),
        "{stderr}"
    );

    let missing = db.path("missing.json");
    let out = Command::new(bin_path("disbatchd"))
        .arg("--config")
        .arg(&missing)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read it"));
    db.drop().await;
}

#[tokio::test]
async fn unknown_config_keys_are_warned_about_but_the_node_runs() {
    let db = TestDb::new("unknownkeys").await;
    let config = write_config(&db, "node.json", json!({"colour": "blue"}));
    let queue = db.insert_queue("q", "echo", 1).await;
    let ids = db.insert_tasks(queue, vec![doc! {}.into()]).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    assert!(den.log_text().contains("unknown key `colour` is ignored"));
    db.drop().await;
}

#[tokio::test]
async fn sigterm_gives_back_claimed_tasks_and_leaves_running_ones_running() {
    let db = TestDb::new("sigterm").await;
    let config = write_config(&db, "node.json", json!({}));
    // Two threads: the hand-made claim below counts as running and holds one.
    let queue = db.insert_queue("q", "echo", 2).await;
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let running = db
        .insert_tasks(queue, vec![held(&runs, &gate).into()])
        .await[0];
    // A claim whose runner never started (e.g. the node died between claim and spawn).
    let claimed = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.tasks()
        .update_one(
            doc! {"_id": claimed},
            doc! {"$set": {"status": -1, "node": "n1", "mtime": DateTime::now()}},
        )
        .await
        .expect("claim by hand");
    let mut den = Den::start(&config, "n1");
    // Its plugin has started, so the SIGTERM below meets a task that runs, not a claim.
    wait_for(
        "the held task to start",
        Duration::from_secs(60),
        || async { read_lines(&runs).len() == 1 },
    )
    .await;
    assert_eq!(den.stop(), Some(0), "clean exit on SIGTERM");
    let given_back = db.task(claimed).await;
    assert_eq!(
        given_back.get_i32("status").ok(),
        Some(status::QUEUED),
        "{given_back}"
    );
    assert_eq!(given_back.get("node"), Some(&Bson::Null));
    assert!(den.log_text().contains("gave back claimed tasks"));
    let still = db.task(running).await;
    assert_eq!(
        still.get_i32("status").ok(),
        Some(status::RUNNING),
        "left running: {still}"
    );
    // The runner lives in its own session: it finishes although its node is gone.
    open(&gate);
    db.wait_complete(&[running], Duration::from_secs(60)).await;
    assert_eq!(
        db.task(running).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    db.drop().await;
}

/// The leader's open change stream once held the database client open at shutdown: SIGTERM
/// took the full 5 s grace and logged that the client did not close.
#[tokio::test]
async fn sigterm_closes_the_change_stream_and_the_database_client_at_once() {
    let db = TestDb::new("sigterm_stream").await;
    // The default interval: an idle stream's wait on the server (ten passes, 10 s) outlasts
    // the client's 5 s grace, as on a production node.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 1000}));
    let mut den = Den::start(&config, "n1");
    wait_for(
        "the leader's change stream",
        Duration::from_secs(60),
        || {
            let open = den.metric("disbatch_den_change_streams_open");
            async move { open.await == 1.0 }
        },
    )
    .await;
    assert_eq!(den.stop(), Some(0), "clean exit on SIGTERM");
    let log = den.log_text();
    assert!(log.contains("INFO disbatchd: stopped"), "{log}");
    assert!(
        !log.contains("did not close"),
        "the client waited for the stream: {log}"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_killed_and_restarted_den_completes_a_running_task_exactly_once() {
    let db = TestDb::new("restart").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let id = db
        .insert_tasks(queue, vec![held(&runs, &gate).into()])
        .await[0];
    let mut den = Den::start(&config, "n1");
    // The plugin writes its line before it waits at the gate. A task's status turns 0 at
    // the claim, before its runner exists: a node killed in that window leaves the task to
    // lease recovery (tests/leases.rs), which is not what this test is about.
    wait_for("the plugin to start", Duration::from_secs(60), || async {
        read_lines(&runs).len() == 1
    })
    .await;
    den.kill_hard();
    let restarted = Den::start(&config, "n1");
    // The restarted node reads its queues while the old runner still runs the task, and
    // again once it is complete: neither time may it run the task again.
    restarted.wait_queue_reads(3).await;
    assert_eq!(read_lines(&runs).len(), 1, "run again while it ran");
    open(&gate);
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    restarted.wait_queue_reads(3).await;
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert_eq!(read_lines(&runs).len(), 1, "the plugin ran exactly once");
    drop(restarted);
    db.drop().await;
}

#[tokio::test]
async fn stale_claims_become_orphaned_and_fresh_ones_are_left_alone() {
    let db = TestDb::new("orphans").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("paused", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {}.into(),
                doc! {}.into(),
                doc! {}.into(),
                doc! {}.into(),
            ],
        )
        .await;
    let old = DateTime::from_millis(DateTime::now().timestamp_millis() - 6 * 60 * 1000);
    let old_epoch = (DateTime::now().timestamp_millis() / 1000 - 400) as f64;
    let tasks = db.tasks();
    tasks
        .update_one(
            doc! {"_id": ids[0]},
            doc! {"$set": {"status": -1, "node": "n1", "mtime": old}},
        )
        .await
        .expect("u");
    tasks
        .update_one(
            doc! {"_id": ids[1]},
            doc! {"$set": {"status": -1, "node": "n1", "mtime": old_epoch}},
        )
        .await
        .expect("u");
    tasks
        .update_one(
            doc! {"_id": ids[2]},
            doc! {"$set": {"status": -1, "node": "n1", "mtime": DateTime::now()}},
        )
        .await
        .expect("u");
    tasks
        .update_one(
            doc! {"_id": ids[3]},
            doc! {"$set": {"status": -1, "node": "other", "mtime": old}},
        )
        .await
        .expect("u");
    let den = Den::start(&config, "n1");
    wait_for("orphans to be reaped", Duration::from_secs(30), || async {
        db.count(doc! {"status": -6}).await == 2
    })
    .await;
    assert_eq!(
        db.task(ids[0]).await.get_i32("status").ok(),
        Some(status::ORPHANED)
    );
    assert_eq!(
        db.task(ids[1]).await.get_i32("status").ok(),
        Some(status::ORPHANED),
        "legacy epoch mtime"
    );
    assert_eq!(
        db.task(ids[2]).await.get_i32("status").ok(),
        Some(status::CLAIMED),
        "fresh claim kept"
    );
    assert_eq!(
        db.task(ids[3]).await.get_i32("status").ok(),
        Some(status::CLAIMED),
        "another node's claim kept"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn sigterm_during_a_claim_batch_leaves_no_claimed_task_without_its_runner() {
    let db = TestDb::new("sigtermbatch").await;
    let config = write_config(&db, "node.json", json!({}));
    for round in 0..4 {
        let queue = db.insert_queue(&format!("q{round}"), "echo", 64).await;
        let tasks = (0..64).map(|_| doc! {"sleep_ms": 200}.into()).collect();
        db.insert_tasks(queue, tasks).await;
        let mut den = Den::start(&config, &format!("n{round}"));
        // The first pass claims the 64 tasks in one batch: stop the node as soon as one of
        // those claims is stored, while the others are still on their way.
        wait_for("the first claim", Duration::from_secs(30), || async {
            db.count(doc! {"queue": queue, "status": 0}).await > 0
        })
        .await;
        assert_eq!(den.stop(), Some(0), "clean exit on SIGTERM");
        // A claim the node stored must have its runner, which completes it; any other task
        // is still queued. A claim without a runner would stay at 0 with no node left.
        wait_for(
            "every claimed task's runner to finish",
            Duration::from_secs(60),
            || async { db.count(doc! {"queue": queue, "status": 0}).await == 0 },
        )
        .await;
        let done = db.count(doc! {"queue": queue, "status": 1}).await;
        let queued = db
            .count(doc! {"queue": queue, "status": -2, "node": Bson::Null})
            .await;
        assert_eq!(
            done + queued,
            64,
            "round {round}: {done} done, {queued} queued"
        );
        // How many claims the SIGTERM cut off: a round where none was (all 64 stored
        // first) still passes, but says so.
        println!("round {round}: {done} claims stored and run, {queued} given back");
        assert!(done > 0, "round {round}: the stored claims ran");
    }
    db.drop().await;
}

#[tokio::test]
async fn an_unreachable_database_is_reported_in_one_readable_line() {
    let db = TestDb::new("unreachable").await;
    // A port nothing listens on: taken, then given back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let path = db.path("unreachable.json");
    let config = json!({
        "mongohost": format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        "database": "d",
        "attributes": {"server_selection_timeout_ms": 500},
    });
    std::fs::write(&path, config.to_string()).expect("write");
    let out = Command::new(bin_path("disbatchd"))
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run disbatchd");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("Error: "))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(
        error.contains("no server reachable") && error.contains(&format!("127.0.0.1:{port}")),
        "{error}"
    );
    assert!(error.contains("Connection refused"), "{error}");
    // The driver's debug form is not what an operator reads.
    for dump in ["Kind:", "labels:", "source: None", "server response"] {
        assert!(!error.contains(dump), "{dump:?} in {error}");
    }
    db.drop().await;
}
