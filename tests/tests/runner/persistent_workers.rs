//! Persistent workers (`worker: "persistent"`, plugins/PROTOCOL.md) with a real node, its
//! worker host and echo in worker mode: tasks run in few long-lived processes and keep every
//! promise of a process task — attempt records, output inline and in GridFS, timeouts, cancel,
//! lease loss — while a worker's death, hang or recycling touches only its own task (a node or
//! worker host killed outright: `persistent_worker_hosts.rs`).

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{alive, pid_of};
use disbatch_tests::{read_lines, wait_for, write_config, Dci, Den, TestDb};
use serde_json::json;

pub(super) async fn persistent_queue(
    db: &TestDb,
    name: &str,
    threads: i32,
    set: Document,
) -> ObjectId {
    let queue = db.insert_queue(name, "echo", threads).await;
    let mut fields = doc! {"worker": "persistent"};
    fields.extend(set);
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": fields})
        .await
        .expect("queue");
    queue
}

/// Params of a task that appends its id to `runs` once it runs in a worker, then waits until
/// the test creates `gate` (a gate never opened: a task that ends only when stopped).
pub(super) fn held(runs: &Path, gate: &Path, mut more: Document) -> bson::Bson {
    more.insert("append_to", runs.to_string_lossy().to_string());
    more.insert("hold_until", gate.to_string_lossy().to_string());
    more.into()
}

/// Waits until `n` tasks have started in their workers (their lines in `runs`).
pub(super) async fn wait_started(runs: &Path, n: usize) {
    wait_for("the held tasks to start", Duration::from_secs(60), || {
        let started = read_lines(runs).len() >= n;
        async move { started }
    })
    .await;
}

/// The last attempt's outcome, once closed.
pub(super) async fn closed_outcome(db: &TestDb, id: ObjectId) -> String {
    let records = db.closed_attempts(id, 1).await;
    let last = records.last().and_then(|a| a.get_str("outcome").ok());
    last.unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_persistent_queue_runs_its_tasks_in_a_few_long_lived_workers() {
    let db = TestDb::new("pw_basic").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 2, doc! {}).await;
    let params: Vec<bson::Bson> = (0..40)
        .map(|i| {
            let mut p = doc! {"i": i, "print_pid": true, "print_env": ["DISBATCH_TASK_ID", "DISBATCH_QUEUE"]};
            match i % 4 {
                1 => p.insert("exit_code", 3),
                2 => p.insert("result", doc! {"status": 1, "note": i}),
                3 => p.insert("stderr", format!("err {i}")),
                _ => None,
            };
            p.into()
        })
        .collect();
    let ids = db.insert_tasks(queue, params).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let mut pids = HashSet::new();
    for (i, id) in ids.iter().enumerate() {
        let task = db.task(*id).await;
        let stdout = task.get_str("stdout").unwrap_or("");
        // Each task's output is its own: its params first, its own facts.
        assert!(stdout.starts_with(&format!("{{\"i\":{i},")), "{task}");
        assert!(
            stdout.contains(&format!("DISBATCH_TASK_ID={}", id.to_hex())),
            "{task}"
        );
        assert!(stdout.contains("DISBATCH_QUEUE=q"), "{task}");
        let want = if i % 4 == 1 { 2 } else { 1 };
        assert_eq!(task.get_i32("status").ok(), Some(want), "{task}");
        let stderr = task.get_str("stderr").unwrap_or("");
        if i % 4 == 3 {
            assert_eq!(stderr, format!("err {i}"), "{task}");
        } else if i % 4 == 1 {
            assert!(stderr.contains("exited with code 3"), "{task}");
        } else {
            assert_eq!(stderr, "", "{task}");
        }
        pids.insert(pid_of(&task).expect("pid"));
        let attempts = db.closed_attempts(*id, 1).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        let outcome = attempts[0].get_str("outcome").unwrap_or("");
        assert_eq!(outcome, if i % 4 == 1 { "failed" } else { "succeeded" });
        if i % 4 == 2 {
            let result = attempts[0]
                .get_document("result")
                .expect("the done's result is kept");
            assert!(
                result.get("note").is_some() && result.get("status").is_some(),
                "{result}"
            );
        }
    }
    println!("40 tasks ran in {} workers", pids.len());
    assert!(
        pids.len() <= 4,
        "40 tasks on threads 2 took {} workers",
        pids.len()
    );
    assert!(
        den.log_text().contains("started a worker host"),
        "{}",
        den.log_text()
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn workers_are_replaced_after_worker_max_tasks_and_stopped_when_idle() {
    let db = TestDb::new("pw_recycle").await;
    let config = write_config(&db, "node.json", json!({}));
    // Idle for 10 minutes before stopped: a worker waiting for its next task on a loaded
    // machine is not stopped for being idle, only for its 3 tasks. Idling is shown below.
    let queue = persistent_queue(
        &db,
        "q",
        1,
        doc! {"worker_max_tasks": 3, "worker_idle_s": 600},
    )
    .await;
    let params = (0..9)
        .map(|i| doc! {"i": i, "print_pid": true}.into())
        .collect();
    let ids = db.insert_tasks(queue, params).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let mut by_pid: BTreeMap<u32, usize> = BTreeMap::new();
    for id in &ids {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        *by_pid.entry(pid_of(&task).expect("pid")).or_default() += 1;
    }
    println!("tasks by worker: {by_pid:?}");
    assert_eq!(by_pid.len(), 3, "{by_pid:?}");
    assert!(by_pid.values().all(|n| *n == 3), "{by_pid:?}");
    // Each was stopped after its third task.
    let pids: Vec<u32> = by_pid.keys().copied().collect();
    wait_for("every worker to stop", Duration::from_secs(30), || {
        let pids = pids.clone();
        async move { pids.iter().all(|p| !alive(*p)) }
    })
    .await;
    // A worker with tasks left to run (1 of 3) that gets no more is stopped after
    // worker_idle_s, now 1: nothing else would stop it while its host lives.
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"worker_idle_s": 1}})
        .await
        .expect("queue");
    // The next task carries the queue's policy as the node last read it: the node reads its
    // queues twice first, so the second reading began after the change.
    den.wait_queue_reads(2).await;
    let last = db
        .insert_tasks(queue, vec![doc! {"print_pid": true}.into()])
        .await;
    db.wait_complete(&last, Duration::from_secs(60)).await;
    let idle = pid_of(&db.task(last[0]).await).expect("pid");
    assert!(!pids.contains(&idle), "a fresh worker: {idle} {pids:?}");
    wait_for(
        "the idle worker to stop",
        Duration::from_secs(60),
        || async move { !alive(idle) },
    )
    .await;
    assert!(den.log_text().contains("started a worker host"));
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_worker_that_dies_mid_task_fails_only_that_task_and_is_replaced() {
    let db = TestDb::new("pw_crash").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {}).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"n": 0, "print_pid": true}.into(),
                doc! {"n": 1, "print_pid": true, "abort": true}.into(),
                doc! {"n": 2, "print_pid": true}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let tasks = [
        db.task(ids[0]).await,
        db.task(ids[1]).await,
        db.task(ids[2]).await,
    ];
    assert_eq!(
        tasks[0].get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{}",
        tasks[0]
    );
    assert_eq!(
        tasks[1].get_i32("status").ok(),
        Some(status::FAILED),
        "{}",
        tasks[1]
    );
    assert_eq!(
        tasks[2].get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{}",
        tasks[2]
    );
    let stderr = tasks[1].get_str("stderr").unwrap_or("");
    assert!(
        stderr.contains("the worker running this task died"),
        "{stderr}"
    );
    assert!(stderr.contains("signal 6"), "{stderr}");
    // Its output up to the abort is kept.
    assert!(
        tasks[1].get_str("stdout").unwrap_or("").contains("\"n\":1"),
        "{}",
        tasks[1]
    );
    assert_eq!(closed_outcome(&db, ids[1]).await, "failed");
    let attempt = db.attempts(ids[1]).await.remove(0);
    assert_eq!(attempt.get_i32("signal").ok(), Some(6), "{attempt}");
    assert_eq!(pid_of(&tasks[0]), pid_of(&tasks[1]));
    assert_ne!(
        pid_of(&tasks[1]),
        pid_of(&tasks[2]),
        "a fresh worker ran the next task"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn on_lost_requeue_gives_the_task_of_a_dead_worker_another_attempt() {
    let db = TestDb::new("pw_requeue").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {"on_lost": "requeue", "max_retries": 2}).await;
    let ids = db
        .insert_tasks(queue, vec![doc! {"abort": true}.into()])
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let task = db.task(ids[0]).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    let attempts = db.closed_attempts(ids[0], 2).await;
    let outcomes: Vec<&str> = attempts
        .iter()
        .filter_map(|a| a.get_str("outcome").ok())
        .collect();
    assert_eq!(outcomes, ["retry", "failed"], "{attempts:?}");
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("too many retries"),
        "{task}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_hung_worker_is_stopped_at_the_queue_timeout_and_the_next_task_gets_a_fresh_one() {
    let db = TestDb::new("pw_timeout").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {"timeout": 1, "kill_grace": 1}).await;
    // Its gate never opens and it ignores SIGTERM: only the timeout's KILL ends it, so the
    // task completing at all shows the timeout fired (no bound on the clock needed).
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let ids = db
        .insert_tasks(
            queue,
            vec![
                held(&runs, &gate, doc! {"print_pid": true, "ignore_term": true}),
                doc! {"print_pid": true}.into(),
            ],
        )
        .await;
    let started = Instant::now();
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    println!(
        "hung worker stopped, next task done {:?} after the start",
        started.elapsed()
    );
    let hung = db.task(ids[0]).await;
    assert_eq!(hung.get_i32("status").ok(), Some(status::FAILED), "{hung}");
    assert!(
        hung.get_str("stderr")
            .unwrap_or("")
            .contains("timed out after 1 s"),
        "{hung}"
    );
    assert_eq!(closed_outcome(&db, ids[0]).await, "timed_out");
    let attempt = db.attempts(ids[0]).await.remove(0);
    assert_eq!(
        attempt.get_i32("signal").ok(),
        Some(9),
        "TERM ignored, then KILL: {attempt}"
    );
    let next = db.task(ids[1]).await;
    assert_eq!(
        next.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{next}"
    );
    let hung_pid = pid_of(&hung).expect("pid");
    assert_ne!(Some(hung_pid), pid_of(&next));
    assert!(!alive(hung_pid));
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn cancelling_a_task_in_a_worker_stops_that_worker_within_seconds() {
    let db = TestDb::new("pw_cancel").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {}).await;
    // Its gate never opens: only a cancel that stops the worker ends the task.
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let id = db
        .insert_tasks(queue, vec![held(&runs, &gate, doc! {"print_pid": true})])
        .await[0];
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    wait_started(&runs, 1).await;
    let asked = Instant::now();
    let (code, body) = dci
        .post(&format!("/tasks/{}/cancel", id.to_hex()), json!({}))
        .await;
    assert_eq!(code, 202, "{body}");
    wait_for("the cancel to land", Duration::from_secs(60), || async {
        db.task(id).await.get_i32("status").ok() == Some(status::CANCELLED)
    })
    .await;
    let latency = asked.elapsed();
    println!("task in a worker cancelled {latency:?} after the request");
    let task = db.task(id).await;
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("cancelled by an operator"),
        "{task}"
    );
    assert_eq!(closed_outcome(&db, id).await, "cancelled");
    let worker = pid_of(&task).expect("pid");
    wait_for(
        "the worker to stop",
        Duration::from_secs(30),
        || async move { !alive(worker) },
    )
    .await;
    drop(dci);
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_worker_whose_task_lost_its_lease_is_stopped_and_its_result_discarded() {
    let db = TestDb::new("pw_lease").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {"lease": 3}).await;
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let id = db
        .insert_tasks(queue, vec![held(&runs, &gate, doc! {})])
        .await[0];
    let den = Den::start(&config, "n1");
    wait_started(&runs, 1).await;
    let ours = db.task(id).await.get_object_id("attempt").expect("attempt");
    // Another node recovered and re-ran it, as recovery and a runner write it: the attempt on
    // the task is not ours any more and the slot is free.
    let theirs = ObjectId::new();
    db.tasks()
        .update_one(
            doc! {"_id": id},
            doc! {"$set": {"attempt": theirs, "status": 1, "stdout": "theirs"},
            "$unset": {"slot": "", "lease_until": ""}},
        )
        .await
        .expect("recover by hand");
    // The worker is stopped: the host reports the task ended and the slot frees on the node.
    let den_log = || den.log_text();
    wait_for(
        "the worker to be stopped",
        Duration::from_secs(60),
        || async {
            std::fs::read_to_string(&den.log)
                .unwrap_or_default()
                .contains("lease lost")
        },
    )
    .await;
    let task = db.task(id).await;
    assert_eq!(task.get_object_id("attempt").ok(), Some(theirs), "{task}");
    assert_eq!(task.get_str("stdout").ok(), Some("theirs"), "{task}");
    // Its attempt record is not closed as a result: recovery owns it (here, nobody).
    let mine = db
        .attempts(id)
        .await
        .into_iter()
        .find(|a| a.get_object_id("_id").ok() == Some(ours));
    let outcome = mine
        .as_ref()
        .and_then(|a| a.get_str("outcome").ok())
        .unwrap_or("");
    assert!(
        outcome != "succeeded" && outcome != "failed",
        "{mine:?}: {}",
        den_log()
    );
    // The queue goes on with a fresh worker.
    let next = db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await;
    db.wait_complete(&next, Duration::from_secs(30)).await;
    assert_eq!(
        db.task(next[0]).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn output_over_16_mib_from_a_worker_goes_to_gridfs() {
    let db = TestDb::new("pw_gridfs").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {}).await;
    // 18 000 lines of ~1 KiB: about 18 MiB of stdout; then a small task in the same worker.
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"print_pid": true, "lines": 18_000, "line_pad": 1_000}.into(),
                doc! {"print_pid": true, "n": 2}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let big = db.task(ids[0]).await;
    assert_eq!(
        big.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "status"
    );
    let file = big
        .get_object_id("stdout")
        .expect("stdout is a GridFS file id");
    let meta = db
        .db
        .collection::<Document>("tasks.files")
        .find_one(doc! {"_id": file})
        .await
        .expect("files")
        .expect("the file");
    let length = meta
        .get_i64("length")
        .map(|l| l as u64)
        .or_else(|_| meta.get_i32("length").map(|l| l as u64))
        .unwrap_or(0);
    assert!(length > 16 * 1024 * 1024, "{meta}");
    let small = db.task(ids[1]).await;
    assert_eq!(small.get_i32("status").ok(), Some(status::SUCCEEDED));
    let stdout = small.get_str("stdout").expect("inline stdout");
    assert!(
        stdout.starts_with("{\"print_pid\":true,\"n\":2}"),
        "the next task's output is only its own: {stdout:.200}"
    );
    assert!(stdout.len() < 200, "{}", stdout.len());
    drop(den);
    db.drop().await;
}
