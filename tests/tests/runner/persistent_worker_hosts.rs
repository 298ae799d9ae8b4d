//! The worker host when its node or itself is killed outright: workers finish and record, or go
//! with it and are recovered.

use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Backoff, Den, TestDb};
use serde_json::json;

use super::persistent_workers::{closed_outcome, held, persistent_queue, wait_started};
use disbatch_tests::{alive, pid_of};

/// The pid the node reports for the process running `task` (its worker host).
async fn host_pid_of(db: &TestDb, node: &str, task: ObjectId) -> u32 {
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(60));
    let mut backoff = Backoff::new();
    loop {
        let n = db.node(node).await;
        let pid = n.get_array("runners").ok().and_then(|runners| {
            runners.iter().find_map(|r| {
                let r = r.as_document()?;
                (r.get_object_id("task").ok() == Some(task)).then(|| r.get_i64("pid").ok())?
            })
        });
        if let Some(pid) = pid {
            return pid as u32;
        }
        assert!(
            Instant::now() < deadline,
            "the node never reported task {task}'s host"
        );
        backoff.wait().await;
    }
}

#[tokio::test]
async fn a_node_killed_outright_leaves_its_host_to_finish_and_record_then_no_worker_is_left() {
    let db = TestDb::new("pw_den_restart").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 2, doc! {}).await;
    // Both held in their workers until their node is dead.
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let ids = db
        .insert_tasks(
            queue,
            vec![
                held(&runs, &gate, doc! {"n": 0, "print_pid": true}),
                held(&runs, &gate, doc! {"n": 1, "print_pid": true}),
            ],
        )
        .await;
    let mut den = Den::start(&config, "n1");
    wait_started(&runs, 2).await;
    let host = host_pid_of(&db, "n1", ids[0]).await;
    assert!(alive(host), "host {host}");
    den.kill_hard();
    let running = db
        .count(doc! {"_id": {"$in": ids.clone()}, "status": 0})
        .await;
    assert_eq!(running, 2, "both ran when their node died");
    std::fs::write(&gate, "").expect("open the gate");
    // Nobody is left to hand it tasks: the host drains, recording both results itself.
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let mut workers = Vec::new();
    for id in &ids {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(closed_outcome(&db, *id).await, "succeeded");
        workers.push(pid_of(&task).expect("pid"));
    }
    wait_for(
        "the host and its workers to exit",
        Duration::from_secs(30),
        || {
            let all: Vec<u32> = workers.iter().copied().chain([host]).collect();
            async move { all.iter().all(|p| !alive(*p)) }
        },
    )
    .await;
    // A new node starts a new host for new tasks.
    let den = Den::start(&config, "n1");
    let more = db
        .insert_tasks(queue, vec![doc! {"n": 2, "print_pid": true}.into()])
        .await;
    db.wait_complete(&more, Duration::from_secs(30)).await;
    let task = db.task(more[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert!(!workers.contains(&pid_of(&task).expect("pid")));
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_host_killed_outright_takes_its_workers_with_it_and_its_tasks_are_recovered() {
    let db = TestDb::new("pw_host_kill").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = persistent_queue(&db, "q", 1, doc! {"on_lost": "requeue", "max_retries": 3}).await;
    // Sleeps only on its first attempt: the requeued attempt runs through.
    let ids = db
        .insert_tasks(
            queue,
            vec![doc! {"print_pid": true, "sleep_first_ms": 60_000}.into()],
        )
        .await;
    let den = Den::start(&config, "n1");
    let host = host_pid_of(&db, "n1", ids[0]).await;
    // The worker is the host's only child.
    let worker = wait_child_of(host).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the host");
    wait_for(
        "the worker to die with its host",
        Duration::from_secs(30),
        || async move { !alive(worker) },
    )
    .await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    let attempts = db.closed_attempts(ids[0], 2).await;
    let outcomes: Vec<&str> = attempts
        .iter()
        .filter_map(|a| a.get_str("outcome").ok())
        .collect();
    assert_eq!(outcomes, ["lost", "succeeded"], "{attempts:?}");
    assert!(
        den.log_text().contains("worker host exited holding tasks"),
        "{}",
        den.log_text()
    );
    drop(den);
    db.drop().await;
}

/// The first child process of `parent`, once it has one.
async fn wait_child_of(parent: u32) -> u32 {
    let mut child = None;
    wait_for("a child process", Duration::from_secs(30), || {
        let path = format!("/proc/{parent}/task/{parent}/children");
        child = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()));
        let found = child.is_some();
        async move { found }
    })
    .await;
    child.unwrap_or(0)
}
