//! Results relayed through the node: runners hand their ended attempts to their DEN, which
//! stores them in batches (one insert of attempt records, one update of tasks) and answers
//! each runner; a runner whose node is gone stores its own.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};
use disbatch_model::status;
use disbatch_model::wire::relay::{Ack, Completion};
use disbatch_store::{AttemptEnd, AttemptRecord, FinishOutcome, OutputValue, Store, TaskEnd};
use disbatch_tests::scrape;
use disbatch_tests::{exposition, read_lines, wait_for, write_config, Den, TestDb};
use serde_json::json;

fn completion(
    task: ObjectId,
    attempt: ObjectId,
    end: TaskEnd,
    outcome: &'static str,
) -> Completion {
    Completion {
        record: AttemptRecord {
            id: attempt,
            task,
            queue: None,
            node: "n1".into(),
            pid: 7,
            start: DateTime::now(),
            end: AttemptEnd {
                outcome: outcome.parse().expect("an outcome"),
                status: match end {
                    TaskEnd::Status(s) | TaskEnd::Discarded(s) => Some(s),
                    TaskEnd::Retry { .. } => None,
                },
                exit_code: Some(0),
                signal: None,
                result: None,
                reason: None,
                task_discarded: false,
                output_file: None,
            },
        },
        end,
        stdout: format!("out of {task}"),
        stderr: String::new(),
    }
}

/// A task running as `attempt` on n1, as a claim leaves it.
async fn insert_running(db: &TestDb, queue: ObjectId, attempt: ObjectId) -> ObjectId {
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.set_task(
        id,
        doc! {"status": status::RUNNING, "node": "n1", "attempt": attempt, "attempts": 1},
    )
    .await;
    id
}

#[tokio::test]
async fn a_batch_stores_each_result_or_says_why_not_in_one_bulk_write() {
    let db = TestDb::new("relay_batch").await;
    let store = db.den_store().await;
    batch_answers(&db, &store).await;
    let hello = db
        .client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .expect("hello");
    // bulkWrite came with wire version 25 (MongoDB 8.0); SecantusDB has it too.
    let has_bulk_write = hello.get_i32("maxWireVersion").unwrap_or(0) >= 25;
    assert_eq!(store.results().uses_bulk_write(), Some(has_bulk_write));
    db.drop().await;
}

/// Servers before MongoDB 8.0 have no `bulkWrite`: one insert, then one update.
#[tokio::test]
async fn a_batch_stores_each_result_or_says_why_not_in_two_writes() {
    let db = TestDb::new("relay_batch2").await;
    let store = db.den_store().await.results().without_bulk_write();
    batch_answers(&db, &store).await;
    assert_eq!(store.results().uses_bulk_write(), Some(false));
    db.drop().await;
}

async fn batch_answers(db: &TestDb, store: &Store) {
    let queue = db.insert_queue("q", "echo", 4).await;
    let (a1, a2, a3, a4) = (
        ObjectId::new(),
        ObjectId::new(),
        ObjectId::new(),
        ObjectId::new(),
    );
    let ours = insert_running(db, queue, a1).await;
    // Recovered and started again elsewhere: another attempt owns it now.
    let taken = insert_running(db, queue, ObjectId::new()).await;
    // Recovery already closed this attempt's record; the task still runs as it.
    let closed = insert_running(db, queue, a3).await;
    db.db
        .collection::<bson::Document>("attempts")
        .insert_one(doc! {"_id": a3, "task": closed, "outcome": "lost"})
        .await
        .expect("lost record");
    let retried = insert_running(db, queue, a4).await;
    let batch = vec![
        completion(ours, a1, TaskEnd::Status(1), "succeeded"),
        completion(taken, a2, TaskEnd::Status(2), "failed"),
        completion(closed, a3, TaskEnd::Status(1), "succeeded"),
        completion(
            retried,
            a4,
            TaskEnd::Retry {
                not_before: None,
                keep_key_slot: false,
            },
            "retry",
        ),
    ];
    let acks = store
        .results()
        .record_completions(&batch)
        .await
        .expect("batch");
    assert_eq!(
        acks,
        vec![Ack::Recorded, Ack::NotOurs, Ack::Recorded, Ack::Recorded]
    );

    let t = db.task(ours).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
    assert_eq!(
        t.get_str("stdout").ok(),
        Some(format!("out of {ours}").as_str())
    );
    assert_eq!(t.get_bool("complete").ok(), Some(true));
    let t = db.task(closed).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
    let t = db.task(taken).await;
    assert_eq!(
        t.get_i32("status").ok(),
        Some(status::RUNNING),
        "untouched: {t}"
    );
    assert_eq!(t.get("stdout"), Some(&Bson::Null));
    let t = db.task(retried).await;
    assert_eq!(
        (t.get_i32("status").ok(), t.get("node")),
        (Some(status::QUEUED), Some(&Bson::Null)),
        "{t}"
    );

    let outcome = |attempts: Vec<bson::Document>| {
        attempts
            .iter()
            .map(|a| a.get_str("outcome").unwrap_or("?").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(outcome(db.attempts(ours).await), ["succeeded"]);
    assert_eq!(
        outcome(db.attempts(taken).await),
        ["discarded"],
        "the record says the result was not kept"
    );
    assert_eq!(
        outcome(db.attempts(closed).await),
        ["lost"],
        "recovery's record stays"
    );
    assert_eq!(outcome(db.attempts(retried).await), ["retry"]);

    // Stored twice (a runner whose answer was lost stores it again): nothing changes.
    assert!(store
        .results()
        .task_shows_result(ours, a1, TaskEnd::Status(1))
        .await
        .expect("read"));
    assert!(!store
        .results()
        .task_shows_result(ours, a1, TaskEnd::Status(2))
        .await
        .expect("read"));
    assert!(!store
        .results()
        .task_shows_result(taken, a2, TaskEnd::Status(2))
        .await
        .expect("read"));
    let again = store
        .results()
        .record_completions(&batch[..1])
        .await
        .expect("again");
    assert_eq!(again, vec![Ack::NotOurs]);
    assert_eq!(
        outcome(db.attempts(ours).await),
        ["succeeded"],
        "a stored result is never marked discarded"
    );
    assert!(store
        .results()
        .record_completions(&[])
        .await
        .expect("empty")
        .is_empty());
}

/// A runner that stopped waiting for its node's answer stores its result itself, while the
/// node's batch still holds it: the node's record insert lands first, the runner's task write
/// next, and the node's fenced task write then finds the task ended. The task shows this
/// attempt's result, so its record must still say so (chaos: a task that succeeded on an
/// attempt whose record said "discarded").
#[tokio::test]
async fn a_result_its_runner_stored_meanwhile_keeps_the_record_the_node_wrote() {
    let db = TestDb::new("relay_both_store").await;
    let bulk = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 4).await;
    for store in [bulk.clone(), bulk.results().without_bulk_write()] {
        let attempt = ObjectId::new();
        let id = insert_running(&db, queue, attempt).await;
        let finished = store
            .results()
            .finish_task(
                id,
                "n1",
                attempt,
                TaskEnd::Status(1),
                OutputValue::Text(format!("out of {id}")),
                OutputValue::Text(String::new()),
            )
            .await
            .expect("runner's write");
        assert_eq!(finished, FinishOutcome::Recorded);
        let c = completion(id, attempt, TaskEnd::Status(1), "succeeded");
        let acks = store
            .results()
            .record_completions(&[c])
            .await
            .expect("batch");
        let t = db.task(id).await;
        assert_eq!(
            (t.get_i32("status").ok(), t.get_object_id("attempt").ok()),
            (Some(status::SUCCEEDED), Some(attempt)),
            "{t}"
        );
        let outcomes: Vec<String> = db
            .attempts(id)
            .await
            .iter()
            .map(|a| a.get_str("outcome").unwrap_or("?").to_string())
            .collect();
        assert_eq!(
            outcomes,
            ["succeeded"],
            "bulk_write: {:?}",
            store.results().uses_bulk_write()
        );
        assert_eq!(acks, vec![Ack::Recorded], "the task shows this result");
    }
    db.drop().await;
}

#[tokio::test]
async fn a_node_stores_its_runners_results_and_answers_each() {
    let db = TestDb::new("relay_node").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let queue = db.insert_queue("q", "echo", 4).await;
    let mut params: Vec<Bson> = (0..12).map(|i| doc! {"n": i}.into()).collect();
    params.push(doc! {"exit_code": 3, "stderr": "broke"}.into());
    let ids = db.insert_tasks(queue, params).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    for (i, id) in ids.iter().enumerate() {
        let t = db.task(*id).await;
        let attempts = db.closed_attempts(*id, 1).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        if i < 12 {
            assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
            // The echo plugin prints its params.
            assert_eq!(
                t.get_str("stdout").ok(),
                Some(format!("{{\"n\":{i}}}\n").as_str()),
                "{t}"
            );
            assert_eq!(attempts[0].get_str("outcome").ok(), Some("succeeded"));
        } else {
            assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
            assert!(t.get_str("stderr").unwrap_or("").contains("broke"), "{t}");
            assert_eq!(attempts[0].get_str("outcome").ok(), Some("failed"));
            assert_eq!(attempts[0].get_i32("exit_code").ok(), Some(3));
        }
    }
    let base = den
        .log_text()
        .lines()
        .find_map(|l| l.strip_prefix("metrics on ").map(str::to_string))
        .expect("metrics line");
    // A runner exits once its answer arrives, so by now every answer was counted.
    let text = scrape(&base).await;
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let answers = |a: &str| e.value("disbatch_den_results_total", &[("answer", a)]);
    assert_eq!(
        answers("recorded"),
        Some(13.0),
        "every result went through the node:\n{text}"
    );
    assert_eq!(answers("not_ours"), Some(0.0));
    assert_eq!(answers("record_yourself"), Some(0.0));
    assert_eq!(
        e.value("disbatch_den_result_batch_size_sum", &[]),
        Some(13.0),
        "{text}"
    );
    assert!(
        !den.log_text().contains("recording the result here"),
        "{}",
        den.log_text()
    );
    db.drop().await;
}

#[tokio::test]
async fn a_runner_whose_node_is_gone_stores_its_own_result() {
    let db = TestDb::new("relay_orphan").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let id = db
        .insert_tasks(
            queue,
            vec![doc! {"append_to": runs.to_string_lossy().to_string(),
            "hold_until": gate.to_string_lossy().to_string()}
            .into()],
        )
        .await[0];
    let mut den = Den::start(&config, "n1");
    wait_for("the plugin to start", Duration::from_secs(60), || async {
        read_lines(&runs).len() == 1
    })
    .await;
    // The plugin ends only once its node is gone: the runner has no node to hand it to.
    den.kill_hard();
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let t = db.task(id).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
    assert!(
        t.get_str("stdout").unwrap_or("").contains("hold_until"),
        "{t}"
    );
    let attempts = db.closed_attempts(id, 1).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].get_str("outcome").ok(), Some("succeeded"));
    // The runner shares the node's log: it said why it stored the result itself.
    wait_for("the runner's note", Duration::from_secs(30), || async {
        den.log_text().contains("recording the result here")
    })
    .await;
    db.drop().await;
}

/// Stdin closes right after the handoff (answers come on their own pipe), so a runner that
/// reads stdin to its end, here a wrapper script, still gets its task, and the runner it
/// execs still hands its result to the node.
#[tokio::test]
async fn a_runner_that_reads_stdin_to_its_end_still_runs_and_relays() {
    use std::os::unix::fs::PermissionsExt;
    let db = TestDb::new("relay_stdin_eof").await;
    let wrapper = db.path("runner.sh");
    let saved = db.path("handoff.bin");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nset -e\ncat > \"{saved}.$$\"\nexec {runner} \"$@\" < \"{saved}.$$\"\n",
            saved = saved.display(),
            runner = disbatch_tests::bin_path("disbatch-task-runner").display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = write_config(
        &db,
        "node.json",
        json!({"task_runner": wrapper.to_string_lossy()}),
    );
    let queue = db.insert_queue("q", "echo", 2).await;
    let ids = db
        .insert_tasks(queue, (0..3).map(|i| doc! {"n": i}.into()).collect())
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    for id in &ids {
        let t = db.task(*id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
        assert_eq!(db.closed_attempts(*id, 1).await.len(), 1);
    }
    let log = den.log_text();
    assert!(!log.contains("recording the result here"), "{log}");
    assert!(!log.contains("answer pipe is missing"), "{log}");
    db.drop().await;
}
