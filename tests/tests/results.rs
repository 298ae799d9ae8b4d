//! A plugin's result file `output`, read back: `GET /tasks/:id` (the newest), `GET
//! /tasks/:id/attempts` (per attempt), `GET /tasks/:id/result` (the last success's, whole,
//! and its 404s and 400s), an output too large to inline, `disbatch task`, `disbatch
//! attempts` and `disbatch result`, and the console's result panel.

use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_tests::{write_config, Browser, Dci, Den, TestDb};
use serde_json::{json, Value};

/// Bytes of the string a `big` task's output holds: past the 4 MiB an answer inlines.
const BIG: usize = 5 * 1024 * 1024;

/// Queues and tasks for every case: `twice` fails once with an output (asking for a retry)
/// and succeeds with another; `big` succeeds with a `BIG`-byte string; `silent` succeeds
/// without a result file; `failing` fails with an output.
struct Fixture {
    db: TestDb,
    config: std::path::PathBuf,
    twice: ObjectId,
    big: ObjectId,
    silent: ObjectId,
    failing: ObjectId,
}

async fn fixture(name: &str) -> (Fixture, Den) {
    let db = TestDb::new(name).await;
    let ran = db.path("ran");
    let twice = db.script(
        "twice.sh",
        &format!(
            r#"if [ -e {ran} ]; then
  printf '{{"output":{{"greeted":"Ada","try":2,"list":[1,2,3]}}}}' > "$DISBATCH_RESULT"
else
  : > {ran}
  printf '{{"retry":true,"output":{{"greeted":"nobody","try":1}}}}' > "$DISBATCH_RESULT"
fi"#,
            ran = ran.display()
        ),
    );
    let big = db.script(
        "big.sh",
        &format!(
            r#"printf '{{"output":"' > "$DISBATCH_RESULT"
head -c {BIG} /dev/zero | tr '\0' a >> "$DISBATCH_RESULT"
printf '"}}' >> "$DISBATCH_RESULT""#
        ),
    );
    let silent = db.script("silent.sh", "exit 0");
    let failing = db.script(
        "failing.sh",
        r#"printf '{"status":2,"output":{"why":"no"}}' > "$DISBATCH_RESULT""#,
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"twice": twice, "big": big, "silent": silent, "failing": failing}}),
    );
    let mut ids = Vec::new();
    for plugin in ["twice", "big", "silent", "failing"] {
        let queue = db.insert_queue(plugin, plugin, 1).await;
        db.set_queue(queue, doc! {"max_retries": 3}).await;
        ids.push(db.insert_tasks(queue, vec![doc! {}.into()]).await[0]);
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    let f = Fixture {
        db,
        config,
        twice: ids[0],
        big: ids[1],
        silent: ids[2],
        failing: ids[3],
    };
    (f, den)
}

fn hex(v: &Value) -> String {
    v.get("$oid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

async fn result_of(dci: &Dci, path: &str) -> (u16, Option<String>, Value) {
    let r = dci.http.get(dci.at(path)).send().await.expect("request");
    let status = r.status().as_u16();
    let attempt = r
        .headers()
        .get("x-disbatch-attempt")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = r.json().await.unwrap_or(Value::Null);
    (status, attempt, body)
}

fn stdout(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "disbatch failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn the_result_output_is_read_back_by_the_api_and_the_cli() {
    let (f, den) = fixture("results_api_cli").await;
    let dci = Dci::start(&f.config);
    let (twice, big) = (f.twice.to_hex(), f.big.to_hex());

    // Per attempt: each one's output, oldest first.
    let (status, attempts) = dci.get(&format!("/tasks/{twice}/attempts")).await;
    assert_eq!(status, 200, "{attempts}");
    let rows = attempts.as_array().cloned().unwrap_or_default();
    assert_eq!(rows.len(), 2, "{attempts}");
    assert_eq!(rows[0]["outcome"], json!("retry"));
    assert_eq!(rows[0]["output"], json!({"greeted": "nobody", "try": 1}));
    assert_eq!(rows[1]["outcome"], json!("succeeded"));
    assert_eq!(
        rows[1]["output"],
        json!({"greeted": "Ada", "try": 2, "list": [1, 2, 3]})
    );
    let (first, last) = (hex(&rows[0]["_id"]), hex(&rows[1]["_id"]));

    // The task: the newest output and its attempt, beside the fields it always had.
    let (status, task) = dci.get(&format!("/tasks/{twice}")).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["output"]["greeted"], json!("Ada"), "{task}");
    assert_eq!(task["output_attempt"], json!(last), "{task}");
    assert_eq!(task["status"], json!(1));
    assert!(task.get("output_omitted").is_none(), "{task}");
    let (_, failed) = dci.get(&format!("/tasks/{}", f.failing.to_hex())).await;
    assert_eq!(failed["output"], json!({"why": "no"}), "{failed}");
    let (_, silent) = dci.get(&format!("/tasks/{}", f.silent.to_hex())).await;
    assert!(silent.get("output").is_none(), "{silent}");

    // The result alone: the last success's; any attempt's by id.
    let (status, attempt, body) = result_of(&dci, &format!("/tasks/{twice}/result")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"greeted": "Ada", "try": 2, "list": [1, 2, 3]}));
    assert_eq!(attempt.as_deref(), Some(last.as_str()));
    let (status, _, body) =
        result_of(&dci, &format!("/tasks/{twice}/result?attempt={first}")).await;
    assert_eq!(
        (status, body),
        (200, json!({"greeted": "nobody", "try": 1}))
    );

    // What has no result, and what is not asked well.
    let unknown = ObjectId::new().to_hex();
    for (path, want, says) in [
        (format!("/tasks/{unknown}/result"), 404, "no task with id"),
        (
            format!("/tasks/{}/result", f.failing.to_hex()),
            404,
            "no attempt of it succeeded",
        ),
        (
            format!("/tasks/{}/result", f.silent.to_hex()),
            404,
            "wrote no output",
        ),
        (
            format!("/tasks/{twice}/result?attempt={unknown}"),
            404,
            "has no attempt",
        ),
        ("/tasks/nothex/result".to_string(), 400, "invalid task id"),
        (
            format!("/tasks/{twice}/result?attempt=nothex"),
            400,
            "invalid attempt id",
        ),
    ] {
        let (status, _, body) = result_of(&dci, &path).await;
        assert_eq!(status, want, "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{path}: {body}"
        );
    }

    // Too large to inline: its size and a link, on both routes; the link answers it whole.
    let (_, task) = dci.get(&format!("/tasks/{big}")).await;
    assert_eq!(task["output"], Value::Null, "output inlined");
    let omitted = &task["output_omitted"];
    assert_eq!(omitted["bytes"], json!(BIG + 2), "{omitted}");
    let url = omitted["url"].as_str().unwrap_or_default().to_string();
    assert!(
        url.starts_with(&format!("/tasks/{big}/result?attempt=")),
        "{omitted}"
    );
    let (_, rows) = dci.get(&format!("/tasks/{big}/attempts")).await;
    assert_eq!(rows[0]["output"], Value::Null);
    assert_eq!(rows[0]["output_omitted"]["url"], json!(url));
    let (status, _, body) = result_of(&dci, &url).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_str().map(str::len), Some(BIG));
    let (_, _, whole) = result_of(&dci, &format!("/tasks/{big}/result")).await;
    assert_eq!(whole, body);

    // The CLI: pretty output under the task's fields and each attempt; ids as hex.
    let text = stdout(&dci.cli(&["task", &twice]));
    assert!(
        text.contains(&format!("output (of attempt {last}):")),
        "{text}"
    );
    assert!(text.contains("    \"greeted\": \"Ada\","), "{text}");
    assert!(!text.contains("$oid"), "{text}");
    assert!(text.contains(&last), "the attempt field, as hex: {text}");
    let text = stdout(&dci.cli(&["attempts", &twice]));
    assert!(
        text.contains(&format!("output of attempt 1 ({first}):")),
        "{text}"
    );
    assert!(text.contains("\"greeted\": \"nobody\""), "{text}");
    assert!(
        text.contains(&format!("output of attempt 2 ({last}):")),
        "{text}"
    );
    let text = stdout(&dci.cli(&["task", &big]));
    assert!(
        text.contains(&format!("{} bytes of JSON, too large", BIG + 2)),
        "{text}"
    );
    assert!(
        text.contains(&format!("disbatch result {big} --attempt ")),
        "{text}"
    );
    assert!(text.len() < 64 * 1024, "bounded: {} bytes", text.len());
    let text = stdout(&dci.cli(&["result", &twice]));
    assert_eq!(
        serde_json::from_str::<Value>(&text).ok(),
        Some(json!({"greeted": "Ada", "try": 2, "list": [1, 2, 3]})),
        "{text}"
    );
    let text = stdout(&dci.cli(&["result", &twice, "--attempt", &first]));
    assert_eq!(
        serde_json::from_str::<Value>(&text).ok(),
        Some(json!({"greeted": "nobody", "try": 1}))
    );
    let failed = dci.cli(&["result", &f.failing.to_hex()]);
    assert_eq!(failed.status.code(), Some(3), "not found");
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("no attempt of it succeeded"), "{said}");

    drop(den);
    f.db.drop().await;
}

#[tokio::test]
async fn the_console_shows_the_result_output_on_the_task_page() {
    let (f, den) = fixture("results_console").await;
    let dci = Dci::start(&f.config);
    let b = Browser::start(1280, 900).await;
    b.record_csp_violations().await;
    b.open(&format!("{}/#/task/{}", dci.url, f.twice.to_hex()), "task")
        .await;
    let shown = b
        .wait_text("#task-result", "result panel", |t| t.contains("\"Ada\""))
        .await;
    assert!(shown.contains("\"greeted\""), "{shown}");
    b.screenshot("console-task-result").await;
    b.open(&format!("{}/#/task/{}", dci.url, f.big.to_hex()), "task")
        .await;
    let shown = b
        .wait_text("#task-result", "omitted result", |t| t.contains("bytes"))
        .await;
    assert!(shown.contains(&(BIG + 2).to_string()), "{shown}");
    let link = b.find("#task-result a").await;
    let href = link.attr("href").await.ok().flatten().unwrap_or_default();
    assert!(
        href.contains(&format!("tasks/{}/result?attempt=", f.big.to_hex())),
        "{href}"
    );
    b.open(&format!("{}/#/task/{}", dci.url, f.silent.to_hex()), "task")
        .await;
    let shown = b
        .wait_text("#task-result", "no result", |t| !t.is_empty())
        .await;
    assert!(shown.contains("no output"), "{shown}");
    assert_eq!(b.csp_violations().await, Vec::<String>::new());
    b.close().await;
    drop(den);
    f.db.drop().await;
}

#[tokio::test]
async fn a_hand_edited_attempt_costs_its_output_not_the_task() {
    let db = TestDb::new("results_hand_edited").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("q", "echo", 0).await;
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.set_task(id, doc! {"status": 1}).await;
    db.db
        .collection::<bson::Document>("attempts")
        .insert_one(doc! {
            "_id": "made by hand", "task": id, "outcome": "succeeded",
            "start": bson::DateTime::from_millis(1_000), "end": bson::DateTime::from_millis(2_000),
            "result": {"output": {"by": "hand"}},
        })
        .await
        .expect("attempt");
    let dci = Dci::start(&config);
    let (status, task) = dci.get(&format!("/tasks/{}", id.to_hex())).await;
    assert_eq!(status, 200, "{task}");
    assert!(task.get("output").is_none(), "{task}");
    let (status, rows) = dci.get(&format!("/tasks/{}/attempts", id.to_hex())).await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows[0]["output"], json!({"by": "hand"}), "{rows}");
    let (status, body) = dci.get(&format!("/tasks/{}/result", id.to_hex())).await;
    assert_eq!(status, 409, "that record's answer: {body}");
    drop(dci);
    db.drop().await;
}
