//! A plugin's result file `output`, read back: `GET /tasks/:id` (the newest), `GET
//! /tasks/:id/attempts` (per attempt), `GET /tasks/:id/result` (the last success's, whole,
//! and its 404s and 400s), an output too large to inline, `disbatch task`, `disbatch
//! attempts` and `disbatch result`, and the console's result panel.

use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::status;
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

    check_the_task_and_its_result_by_attempt(&dci, &f, &twice, &first, &last).await;

    check_what_has_no_result_or_is_not_asked_well(&dci, &f, &twice).await;

    check_a_result_too_large_to_inline_is_linked(&dci, &big).await;

    check_the_cli_prints_the_output_and_the_result(&dci, &f, &twice, &big, &first, &last).await;

    drop(den);
    f.db.drop().await;
}

async fn check_the_task_and_its_result_by_attempt(
    dci: &Dci,
    f: &Fixture,
    twice: &str,
    first: &str,
    last: &str,
) {
    // The task: the newest output and its attempt, beside the fields it always had.
    let (status, task) = dci.get(&format!("/tasks/{twice}")).await;
    assert_eq!(status, 200, "{task}");
    assert_eq!(task["output"]["greeted"], json!("Ada"), "{task}");
    assert_eq!(task["output_attempt"], json!(last), "{task}");
    assert_eq!(task["status"], json!(status::SUCCEEDED));
    assert!(task.get("output_omitted").is_none(), "{task}");
    let (_, failed) = dci.get(&format!("/tasks/{}", f.failing.to_hex())).await;
    assert_eq!(failed["output"], json!({"why": "no"}), "{failed}");
    let (_, silent) = dci.get(&format!("/tasks/{}", f.silent.to_hex())).await;
    assert!(silent.get("output").is_none(), "{silent}");

    // The result alone: the last success's; any attempt's by id.
    let (status, attempt, body) = result_of(dci, &format!("/tasks/{twice}/result")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"greeted": "Ada", "try": 2, "list": [1, 2, 3]}));
    assert_eq!(attempt.as_deref(), Some(last));
    let (status, _, body) = result_of(dci, &format!("/tasks/{twice}/result?attempt={first}")).await;
    assert_eq!(
        (status, body),
        (200, json!({"greeted": "nobody", "try": 1}))
    );
}

async fn check_what_has_no_result_or_is_not_asked_well(dci: &Dci, f: &Fixture, twice: &str) {
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
        let (status, _, body) = result_of(dci, &path).await;
        assert_eq!(status, want, "{path}: {body}");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{path}: {body}"
        );
    }
}

async fn check_a_result_too_large_to_inline_is_linked(dci: &Dci, big: &str) {
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
    let (status, _, body) = result_of(dci, &url).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_str().map(str::len), Some(BIG));
    let (_, _, whole) = result_of(dci, &format!("/tasks/{big}/result")).await;
    assert_eq!(whole, body);
}

async fn check_the_cli_prints_the_output_and_the_result(
    dci: &Dci,
    f: &Fixture,
    twice: &str,
    big: &str,
    first: &str,
    last: &str,
) {
    // The CLI: pretty output under the task's fields and each attempt; ids as hex.
    let text = stdout(&dci.cli(&["task", twice]));
    assert!(
        text.contains(&format!("output (of attempt {last}):")),
        "{text}"
    );
    assert!(text.contains("    \"greeted\": \"Ada\","), "{text}");
    assert!(!text.contains("$oid"), "{text}");
    assert!(text.contains(last), "the attempt field, as hex: {text}");
    let text = stdout(&dci.cli(&["attempts", twice]));
    assert!(
        text.contains(&format!("output of attempt 1 ({first}):")),
        "{text}"
    );
    assert!(text.contains("\"greeted\": \"nobody\""), "{text}");
    assert!(
        text.contains(&format!("output of attempt 2 ({last}):")),
        "{text}"
    );
    let text = stdout(&dci.cli(&["task", big]));
    assert!(
        text.contains(&format!("{} bytes of JSON, too large", BIG + 2)),
        "{text}"
    );
    assert!(
        text.contains(&format!("disbatch result {big} --attempt ")),
        "{text}"
    );
    assert!(text.len() < 64 * 1024, "bounded: {} bytes", text.len());
    let text = stdout(&dci.cli(&["result", twice]));
    assert_eq!(
        serde_json::from_str::<Value>(&text).ok(),
        Some(json!({"greeted": "Ada", "try": 2, "list": [1, 2, 3]})),
        "{text}"
    );
    let text = stdout(&dci.cli(&["result", twice, "--attempt", first]));
    assert_eq!(
        serde_json::from_str::<Value>(&text).ok(),
        Some(json!({"greeted": "nobody", "try": 1}))
    );
    let failed = dci.cli(&["result", &f.failing.to_hex()]);
    assert_eq!(failed.status.code(), Some(3), "not found");
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("no attempt of it succeeded"), "{said}");
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

/// An output whose attempt record would pass the 15 MiB bound (here 1.4 million zeros: under
/// 3 MB of JSON, over 16 MB as BSON) is kept in GridFS beside the task's stdout, the record
/// names the file, every reader answers it whole or links it, and it goes with its task.
#[tokio::test]
async fn an_output_too_large_for_its_record_is_kept_in_gridfs_and_read_back_whole() {
    const ZEROS: usize = 1_400_000;
    let db = TestDb::new("results_gridfs").await;
    let huge = db.script(
        "huge.sh",
        &format!(
            r#"{{ printf '{{"note":"kept","output":['; yes 0 | head -n {ZEROS} | paste -sd, -; printf ']}}'; }} > "$DISBATCH_RESULT""#
        ),
    );
    let config = write_config(&db, "node.json", json!({"plugins": {"huge": huge}}));
    let queue = db.insert_queue("huge", "huge", 1).await;
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(120)).await;
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );

    let record = db
        .db
        .collection::<bson::Document>("attempts")
        .find_one(doc! {"task": id})
        .await
        .expect("read attempts")
        .expect("an attempt record");
    let file = record
        .get_object_id("output_file")
        .unwrap_or_else(|_| panic!("no output_file: {record:?}"));
    let bytes = record.get_i64("output_bytes").expect("output_bytes");
    assert_eq!(
        record.get_document("result").ok(),
        Some(&doc! {"note": "kept"}),
        "the record keeps the rest of the result"
    );
    let stored = db
        .db
        .collection::<bson::Document>("tasks.files")
        .find_one(doc! {"_id": file})
        .await
        .expect("read files")
        .expect("the GridFS file");
    assert_eq!(stored.get_str("filename").ok(), Some("result"));
    assert_eq!(
        stored.get_document("metadata").ok(),
        Some(&doc! {"task_id": id})
    );
    assert_eq!(stored.get_i64("length").ok(), Some(bytes));

    let dci = Dci::start(&config);
    let hex_id = id.to_hex();
    let (_, shown) = dci.get(&format!("/tasks/{hex_id}")).await;
    assert_eq!(shown["output"], Value::Null, "{}", shown["output_omitted"]);
    let omitted = &shown["output_omitted"];
    assert_eq!(omitted["bytes"], json!(bytes), "{omitted}");
    assert!(
        omitted["reason"]
            .as_str()
            .is_some_and(|r| r.contains("kept in GridFS")),
        "{omitted}"
    );
    let url = omitted["url"].as_str().unwrap_or_default().to_string();
    let (_, rows) = dci.get(&format!("/tasks/{hex_id}/attempts")).await;
    assert_eq!(rows[0]["output"], Value::Null);
    assert_eq!(rows[0]["output_omitted"]["url"], json!(url), "{rows}");
    for path in [url.as_str(), &format!("/tasks/{hex_id}/result")] {
        let (status, attempt, body) = result_of(&dci, path).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(
            attempt,
            record.get_object_id("_id").ok().map(|a| a.to_hex())
        );
        let all = body.as_array().map(|a| a.iter().all(|v| v == &json!(0)));
        assert_eq!(
            (body.as_array().map(Vec::len), all),
            (Some(ZEROS), Some(true))
        );
    }
    let printed = stdout(&dci.cli(&["result", &hex_id]));
    let back: Value = serde_json::from_str(&printed).expect("disbatch result prints JSON");
    assert_eq!(back.as_array().map(Vec::len), Some(ZEROS));
    let text = stdout(&dci.cli(&["task", &hex_id]));
    assert!(
        text.contains(&format!("huge ({})", queue.to_hex())),
        "the queue by name: {text}"
    );
    assert!(
        text.contains(&format!(
            "({bytes} bytes of JSON, too large to show here; disbatch result {hex_id} --attempt "
        )),
        "{text}"
    );

    // Deleted with its task.
    let (status, body) = dci
        .send(
            reqwest::Method::DELETE,
            &format!("/tasks/{hex_id}"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let left = db
        .db
        .collection::<bson::Document>("tasks.files")
        .count_documents(doc! {"_id": file})
        .await
        .expect("count files");
    assert_eq!(left, 0, "the result's file goes with its task");
    drop(dci);
    drop(den);
    db.drop().await;
}

/// A result file of 16 MB of empty arrays in a member besides `output`: refused by its shape
/// before anything is built, the task failed with the reason. The runner's peak memory, as
/// the kernel counts it for the node's reaped children, stays under 200 MiB (it was 1 GB).
#[tokio::test]
async fn a_sixteen_mb_result_file_of_empty_arrays_is_refused_in_bounded_memory() {
    use nix::sys::resource::{getrusage, UsageWho};
    let db = TestDb::new("result_arrays").await;
    let file = db.path("arrays.json");
    let arrays = vec!["[]"; 5_300_000].join(",");
    std::fs::write(&file, format!(r#"{{"a": [{arrays}]}}"#)).expect("the result file");
    let plugin = db.script(
        "arrays.sh",
        &format!("cp '{}' \"$DISBATCH_RESULT\"", file.display()),
    );
    let config = write_config(&db, "node.json", json!({"plugins": {"arrays": plugin}}));
    let queue = db.insert_queue("arrays", "arrays", 1).await;
    let task = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[task], Duration::from_secs(120)).await;
    let done = db.task(task).await;
    let stderr = done.get_str("stderr").unwrap_or("").to_string();
    assert_eq!(
        done.get_i32("status").ok(),
        Some(status::FAILED),
        "{stderr}"
    );
    assert!(
        stderr.contains("more than 200000 JSON values (by member \"a\")"),
        "{stderr}"
    );
    // The node has reaped its runner once it counts the exit; the node, reaped in turn when
    // dropped, hands its children's peak to this test's process.
    disbatch_tests::wait_for("the runner reaped", Duration::from_secs(60), || async {
        den.metric("disbatch_den_runner_exits_total{queue=\"arrays\",result=\"success\"}")
            .await
            == 1.0
    })
    .await;
    drop(den);
    let peak_kib = getrusage(UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage")
        .max_rss();
    println!("largest reaped child: {} MiB", peak_kib / 1024);
    assert!(
        peak_kib < 200 * 1024,
        "a process of the node's peaked at {} MiB",
        peak_kib / 1024
    );
    db.drop().await;
}
