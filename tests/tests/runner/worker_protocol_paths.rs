//! Persistent workers with a real node, beyond echo's happy paths: workers that break the
//! protocol or never start, the Python helper as a real queue's plugin (chaining, retries,
//! an exception), and a leaking worker replaced by `worker_max_rss_mb`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::pid_of;
use disbatch_tests::{echo_plugin, scaled, wait_for, write_config, Backoff, Den, TestDb};
use serde_json::json;

async fn outcomes(db: &TestDb, id: ObjectId, count: usize) -> Vec<String> {
    db.closed_attempts(id, count)
        .await
        .iter()
        .filter_map(|a| a.get_str("outcome").ok().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_worker_that_breaks_the_protocol_or_never_says_ready_fails_its_task_with_the_reason() {
    let db = TestDb::new("pw_protocol").await;
    // Says ready, then answers the task with a line that is not JSON.
    let garbled = db.script("garbled.sh",
        r#"echo '{"type":"ready","protocol":1}' >&3; read line <&3; echo 'this is not json' >&3; sleep 30"#,
    );
    // Answers for another attempt.
    let wrong = db.script("wrong.sh",
        r#"echo '{"type":"ready","protocol":1}' >&3; read line <&3; echo '{"type":"done","attempt":"nope","exit":0}' >&3; sleep 30"#,
    );
    // Never says ready; says why on stderr.
    let silent = db.script("silent.sh", "echo 'warming up forever' >&2; sleep 30");
    // A process plugin, not a worker: exits at once without a word on the channel.
    let process_only = db.script("process.sh", "echo hello");
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"garbled": garbled, "wrong": wrong, "silent": silent,
                            "process_only": process_only, "echo": echo_plugin()}}),
    );
    let mut ids = Vec::new();
    for plugin in ["garbled", "wrong", "silent", "process_only"] {
        let queue = db.insert_queue(plugin, plugin, 1).await;
        db.set_queue(
            queue,
            doc! {"worker": "persistent", "worker_start_s": 1, "kill_grace": 1},
        )
        .await;
        ids.push(db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await[0]);
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let expect = [
        "worker protocol error: a line that is not JSON",
        "worker protocol error: done for attempt \"nope\"",
        "did not say ready within 1 s",
        "exited before it said ready",
    ];
    for (id, needle) in ids.iter().zip(expect) {
        let task = db.task(*id).await;
        assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
        let stderr = task.get_str("stderr").unwrap_or("");
        assert!(
            stderr.contains(needle),
            "{needle:?} not in {stderr:?}: {}",
            den.log_text()
        );
    }
    // The silent worker's own words reach the task's stderr.
    let silent_task = db.task(ids[2]).await;
    assert!(
        silent_task
            .get_str("stderr")
            .unwrap_or("")
            .contains("warming up forever"),
        "{silent_task}"
    );
    assert_eq!(silent_task.get_str("stdout").ok(), Some("Unable to start"));
    drop(den);
    db.drop().await;
}

fn python_example() -> Option<PathBuf> {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/python/example_worker.py");
    if !found {
        eprintln!("SKIPPED: no python3 on this machine");
        return None;
    }
    Some(path)
}

#[tokio::test]
async fn the_python_helper_runs_a_real_queue_with_chaining_retries_and_exceptions() {
    let Some(example) = python_example() else {
        return;
    };
    let db = TestDb::new("pw_python").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"py": example, "echo": echo_plugin()}}),
    );
    let queue = db.insert_queue("py", "py", 2).await;
    let next = db.insert_queue("next", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {"worker": "persistent", "then": "next", "max_retries": 2},
    )
    .await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"n": 1}.into(),
                doc! {"fail": true}.into(),
                doc! {"raise": true}.into(),
                doc! {"retry": 0}.into(),
                doc! {"n": 5}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let statuses: Vec<Option<i32>> = {
        let mut v = Vec::new();
        for id in &ids {
            v.push(db.task(*id).await.get_i32("status").ok());
        }
        v
    };
    assert_eq!(
        statuses,
        [Some(1), Some(2), Some(2), Some(2), Some(1)],
        "{}",
        den.log_text()
    );
    let first = db.task(ids[0]).await;
    assert!(
        first
            .get_str("stdout")
            .unwrap_or("")
            .starts_with(&ids[0].to_hex()),
        "{first}"
    );
    let raised = db.task(ids[2]).await;
    assert!(
        raised
            .get_str("stderr")
            .unwrap_or("")
            .contains("asked to raise"),
        "{raised}"
    );
    assert_eq!(outcomes(&db, ids[3], 2).await, ["retry", "failed"]);
    assert!(db
        .task(ids[3])
        .await
        .get_str("stderr")
        .unwrap_or("")
        .contains("too many retries"));
    // A succeeded task's output is chained to the `then` queue as unit "echo".
    let unit = db.unit(next, "echo").await.expect("the chained unit");
    assert!(
        unit.get_document("params")
            .is_ok_and(|p| p.contains_key("n")),
        "{unit}"
    );
    drop(den);
    db.drop().await;
}

/// Waits until the node has heard that `n` tasks succeeded (for a worker host's task: that it
/// reported the task's end, which it does once the task's worker is back in its pool or
/// retired).
async fn heard_ended(den: &Den, n: u64) {
    wait_for(
        "the node to hear the task ended",
        Duration::from_secs(60),
        || async {
            let text = den.scrape().await;
            let succeeded: f64 = text
                .lines()
                .filter(|l| {
                    l.starts_with("disbatch_den_tasks_finished_total{")
                        && l.contains(r#"outcome="succeeded""#)
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            succeeded >= n as f64
        },
    )
    .await;
}

/// Runs `params` as one task of `queue` and returns it once the node has heard that it ended:
/// the worker host reports a task's end after it gave the task's worker back to its pool (or
/// retired it), so whatever task comes next finds the pool as this one left it. One task at a
/// time, the order tasks run in is the test's, not the claim order.
async fn run_alone(db: &TestDb, den: &Den, queue: ObjectId, params: Document) -> Document {
    let id = db.insert_tasks(queue, vec![params.into()]).await[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    heard_ended(den, db.count(doc! {"queue": queue, "complete": true}).await).await;
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    task
}

#[tokio::test]
async fn a_leaking_worker_is_replaced_once_past_worker_max_rss_mb() {
    let db = TestDb::new("pw_rss").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    db.set_queue(
        queue,
        doc! {"worker": "persistent", "worker_max_rss_mb": 40},
    )
    .await;
    let den = Den::start(&config, "n1");
    let mut pids = Vec::new();
    for params in [
        doc! {"n": 0, "print_pid": true},
        doc! {"n": 1, "print_pid": true},
        doc! {"n": 2, "print_pid": true, "leak_mb": 64},
        doc! {"n": 3, "print_pid": true},
    ] {
        let task = run_alone(&db, &den, queue, params).await;
        pids.push(pid_of(&task).expect("pid"));
    }
    assert_eq!(
        pids[0], pids[1],
        "below the limit the worker is kept: {pids:?}"
    );
    assert_eq!(
        pids[1], pids[2],
        "the limit applies after a task, not during it: {pids:?}"
    );
    assert_ne!(
        pids[2], pids[3],
        "past the limit the worker is replaced: {pids:?}"
    );
    assert_eq!(pids.iter().collect::<HashSet<_>>().len(), 2);
    drop(den);
    db.drop().await;
}

/// Reads the task's live stdout copy until it shows `want`, keeping every distinct copy seen
/// on the way. The task is held at a gate meanwhile, so it must still be running then.
async fn live_until(db: &TestDb, id: ObjectId, want: &str, seen: &mut Vec<String>) {
    let deadline = Instant::now() + scaled(Duration::from_secs(60));
    let mut backoff = Backoff::new();
    loop {
        let task = db.task(id).await;
        let text = task
            .get_document("live_output")
            .and_then(|l| l.get_document("stdout"))
            .and_then(|s| s.get_str("text"))
            .map(str::to_string);
        if let Ok(text) = text {
            if seen.last() != Some(&text) {
                seen.push(text.clone());
            }
            if text.contains(want) {
                assert_eq!(
                    task.get_i32("status").ok(),
                    Some(status::RUNNING),
                    "{want:?} live: {task}"
                );
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no live copy showed {want:?}: {seen:?}; {task}"
        );
        backoff.wait().await;
    }
}

fn open(gate: &Path) {
    std::fs::write(gate, b"").expect("open the gate");
}

#[tokio::test]
async fn a_task_in_a_worker_shows_live_output_while_it_runs_and_the_next_task_starts_clean() {
    let db = TestDb::new("pw_live").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    db.set_queue(queue, doc! {"worker": "persistent"}).await;
    let den = Den::start(&config, "n1");
    // Each task prints two lines and waits at a gate, two more and waits at another: its live
    // copy must show lines 2 and then 4 while it waits, so it grows while the task runs.
    let mut seen: Vec<Vec<String>> = vec![Vec::new(), Vec::new()];
    let mut tasks = Vec::new();
    for (n, seen) in seen.iter_mut().enumerate() {
        let gates = [
            db.path(&format!("gate-{n}-a")),
            db.path(&format!("gate-{n}-b")),
        ];
        let hold: Vec<String> = gates.iter().map(|g| g.display().to_string()).collect();
        let params = doc! {"n": n as i32, "print_pid": true, "lines": 2, "hold_until": hold};
        let id = db.insert_tasks(queue, vec![params.into()]).await[0];
        live_until(&db, id, "line 2 ", seen).await;
        open(&gates[0]);
        live_until(&db, id, "line 4 ", seen).await;
        open(&gates[1]);
        db.wait_complete(&[id], Duration::from_secs(60)).await;
        heard_ended(&den, n as u64 + 1).await;
        tasks.push(db.task(id).await);
    }
    assert_eq!(pid_of(&tasks[0]), pid_of(&tasks[1]), "one worker ran both");
    for (i, task) in tasks.iter().enumerate() {
        assert!(seen[i].len() >= 2, "task {i}'s copies: {:?}", seen[i]);
        // Each copy is the start of that task's own output, never the other task's.
        let stdout = task.get_str("stdout").unwrap_or("");
        for text in &seen[i] {
            assert!(
                stdout.starts_with(text.as_str()),
                "task {i}: {text:?} is not the start of {stdout:?}"
            );
        }
        assert!(
            task.get("live_output").is_none(),
            "the live copy is gone once stored: {task}"
        );
    }
    drop(den);
    db.drop().await;
}
