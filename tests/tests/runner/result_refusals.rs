//! Results a plugin returns that cannot stand: one the database cannot store (a field name
//! with a NUL byte), from a result file or a persistent worker's `done`, and a `status` that
//! is not a positive whole number. Each fails its task at once with the reason in stderr.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::cleanup::descendants_of;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// The per-task runners (not worker hosts) still running under this test.
fn task_runners() -> Vec<String> {
    descendants_of(std::process::id() as i32)
        .into_iter()
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let runner = args.iter().any(|a| a.ends_with("disbatch-task-runner"))
                && args.iter().any(|a| a == "--task");
            runner.then(|| format!("{pid}: {}", args.join(" ")))
        })
        .collect()
}

#[tokio::test]
async fn a_result_the_database_cannot_store_fails_the_task_with_the_reason() {
    let db = TestDb::new("result_unstorable").await;
    // Valid JSON and UTF-8, not storable: a field name with a NUL byte.
    let file = db.script(
        "nul_file.sh",
        r#"printf '{"output":{"a\\u0000":{}}}' > "$DISBATCH_RESULT""#,
    );
    let worker = db.script("nul_worker.sh",
        r#"echo '{"type":"ready","protocol":1}' >&3
while read -r line <&3; do
  case "$line" in *'"type":"stop"'*) exit 0;; esac
  attempt=$(printf '%s' "$line" | sed 's/.*"attempt":"\([0-9a-f]*\)".*/\1/')
  printf '{"type":"done","attempt":"%s","exit":0,"result":{"output":{"a\\u0000":{}}}}\n' "$attempt" >&3
done"#,
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"nul_file": file, "nul_worker": worker}}),
    );
    let by_file = db.insert_queue("by_file", "nul_file", 1).await;
    // Requeued on a lost lease, each attempt would have left one more runner retrying.
    db.set_queue(by_file, doc! {"on_lost": "requeue"}).await;
    let by_worker = db.insert_queue("by_worker", "nul_worker", 1).await;
    db.set_queue(by_worker, doc! {"worker": "persistent"}).await;
    let mut ids = db.insert_tasks(by_file, vec![doc! {}.into()]).await;
    ids.extend(db.insert_tasks(by_worker, vec![doc! {}.into()]).await);
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    for id in &ids {
        let task = db.task(*id).await;
        assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
        let stderr = task.get_str("stderr").unwrap_or_default();
        assert!(
            stderr.contains("the database cannot store it: result.output: field name")
                && stderr.contains("NUL"),
            "{stderr}"
        );
        let attempts = db.closed_attempts(*id, 1).await;
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(attempts[0].get_str("outcome").ok(), Some("failed"));
        assert!(attempts[0].get_document("result").is_err(), "{attempts:?}");
    }
    wait_for("no task runner left", Duration::from_secs(30), || async {
        task_runners().is_empty()
    })
    .await;
    let log = den.log_text();
    assert!(!log.contains("failed; retrying"), "{log}");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_status_that_is_not_a_positive_whole_number_fails_the_task() {
    let db = TestDb::new("result_status").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("statuses", "echo", 4).await;
    let refused: Vec<Bson> = vec![
        "2".into(),
        0.into(),
        (-3).into(),
        1.5.into(),
        (1_i64 << 40).into(),
        true.into(),
    ];
    let mut params: Vec<Bson> = refused
        .iter()
        .map(|s| doc! {"result": {"status": s.clone()}}.into())
        .collect();
    // Valid statuses keep their meaning: the result's status wins over the exit code.
    params.push(doc! {"result": {"status": 7}}.into());
    params.push(doc! {"exit_code": 1, "result": {"status": 1}}.into());
    params.push(doc! {"result": {"status": 2.0}}.into());
    let ids = db.insert_tasks(queue, params).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    for (id, status) in ids.iter().zip(&refused) {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::FAILED),
            "{status}: {task}"
        );
        let stderr = task.get_str("stderr").unwrap_or_default();
        assert!(
            stderr.contains("\"status\" must be a whole number from 1 (succeeded)"),
            "{status}: {stderr}"
        );
    }
    let kept: Vec<Option<i32>> = statuses(&db, &ids[refused.len()..]).await;
    assert_eq!(
        kept,
        [Some(7), Some(status::SUCCEEDED), Some(status::FAILED)]
    );
    drop(den);
    db.drop().await;
}

async fn statuses(db: &TestDb, ids: &[ObjectId]) -> Vec<Option<i32>> {
    let mut out = Vec::new();
    for id in ids {
        out.push(db.task(*id).await.get_i32("status").ok());
    }
    out
}
