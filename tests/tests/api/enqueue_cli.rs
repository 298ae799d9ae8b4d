//! The CLI's task creation: values read as JSON, each JSON type and the task field flags, and
//! duplicates listed with exit code 10.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

use super::enqueue::{only_task, out, server_now, DUPLICATES};

#[tokio::test]
async fn the_cli_reads_values_as_json_and_lists_duplicates_with_exit_10() {
    let db = TestDb::new("enqueue_cli").await;
    let config = write_config(&db, "web.json", json!({}));
    let uq = db.insert_queue("uq", "echo", 0).await;
    db.set_queue(uq, doc! {"unique": {"key": "params.id"}})
        .await;
    let plain = db.insert_queue("plain", "echo", 0).await;
    let dci = Dci::start(&config);

    let (code, stdout, stderr) = out(&dci.cli(&["create-task", "uq", "id=1"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Created 1 task in queue uq\n"),
        "{stdout}"
    );
    let first = only_task(&db, doc! {"queue": uq}).await;
    assert_eq!(
        first.get_document("params").ok(),
        Some(&doc! {"id": 1_i32}),
        "id=1 is the number 1: {first}"
    );
    let first_id = first.get_object_id("_id").expect("id").to_hex();

    check_duplicates_are_named_with_exit_10(&db, &dci, uq, &first_id).await;

    check_each_json_type_and_the_task_field_flags(&db, &dci, plain).await;
    let (code, _, stderr) = out(&dci.cli(&["create-task", "plain", "n=1", "name"]));
    assert_eq!(code, Some(2), "a mixed form is a usage error: {stderr}");
    let (_, help, _) = out(&dci.cli(&["create-task", "--help"]));
    assert!(
        help.contains("jq --argjson") && help.contains("Exits 10"),
        "{help}"
    );
    db.drop().await;
}

async fn check_duplicates_are_named_with_exit_10(
    db: &TestDb,
    dci: &Dci,
    uq: ObjectId,
    first_id: &str,
) {
    // The same key again: nothing made, the task it matched named, exit 10.
    let (code, stdout, stderr) = out(&dci.cli(&["create-task", "uq", "id=1"]));
    assert_eq!(code, Some(DUPLICATES), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Created 0 tasks in queue uq\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("params {{\"id\":1}} matched task {first_id}")),
        "{stdout}"
    );
    assert!(stderr.contains("1 of 1 task not created"), "{stderr}");
    // --json: Disbatch's answer, and the same exit status.
    let (code, stdout, _) = out(&dci.cli(&["--json", "create-task", "uq", "id=1"]));
    assert_eq!(code, Some(DUPLICATES), "{stdout}");
    let reply: Value = serde_json::from_str(&stdout).expect("--json is JSON");
    assert_eq!(reply["duplicates"][0]["_id"]["$oid"], json!(first_id));

    // Disbatch's KEY VALUE pairs keep their strings: "1" is another key than 1.
    let (code, stdout, stderr) = out(&dci.cli(&["create-task", "uq", "id", "1"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert_eq!(
        db.count(doc! {"queue": uq, "params.id": "1"}).await,
        1,
        "the pair form stores the string"
    );

    // Many: the new ones listed, each duplicate by its input.
    let (code, stdout, stderr) = out(&dci.cli(&["create-tasks", "uq", r#"[{"id":1},{"id":3}]"#]));
    assert_eq!(code, Some(DUPLICATES), "{stdout}{stderr}");
    assert!(
        stdout.starts_with("Created 1 task in queue uq\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("params[0] {{\"id\":1}} matched task {first_id}")),
        "{stdout}"
    );
    assert!(stderr.contains("1 of 2 tasks not created"), "{stderr}");
    // From a file: by line.
    let file = db.path("tasks.jsonl");
    std::fs::write(&file, "{\"id\":4}\n\n{\"id\":1}\n").expect("write");
    let file = file.to_string_lossy().into_owned();
    let (code, stdout, stderr) = out(&dci.cli(&["create-tasks", "uq", "--file", &file]));
    assert_eq!(code, Some(DUPLICATES), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("line 3 matched task {first_id}")),
        "{stdout}"
    );
    assert_eq!(db.count(doc! {"queue": uq}).await, 4);
}

async fn check_each_json_type_and_the_task_field_flags(db: &TestDb, dci: &Dci, plain: ObjectId) {
    // Values of each JSON type, and text where JSON does not parse.
    let (code, stdout, stderr) = out(&dci.cli(&[
        "create-task",
        "plain",
        "n=1",
        "flag=true",
        "name=Ada",
        r#"quoted="1""#,
        "tags=[1,\"a\"]",
        "cmd=a=b",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let task = only_task(db, doc! {"queue": plain, "params.n": 1}).await;
    assert_eq!(
        task.get_document("params").ok(),
        Some(
            &doc! {"n": 1_i32, "flag": true, "name": "Ada", "quoted": "1", "tags": [1_i32, "a"], "cmd": "a=b"}
        ),
        "{task}"
    );
    // --delay-s, --not-before and --priority set the task fields, not params.
    let before = server_now(db).await;
    let (code, stdout, stderr) = out(&dci.cli(&[
        "create-task",
        "plain",
        "timed=1",
        "--delay-s",
        "3600",
        "--priority",
        "-4",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let task = only_task(db, doc! {"params.timed": 1}).await;
    assert_eq!(
        task.get_document("params").ok(),
        Some(&doc! {"timed": 1_i32})
    );
    assert_eq!(task.get("priority"), Some(&Bson::Int64(-4)), "{task}");
    assert!(
        task.get_datetime("not_before")
            .expect("not_before")
            .timestamp_millis()
            >= before.timestamp_millis() + 3_540_000,
        "{task}"
    );
    let (code, stdout, stderr) = out(&dci.cli(&[
        "create-tasks",
        "plain",
        r#"[{"timed":2}]"#,
        "--not-before",
        "2031-02-03T04:05:06Z",
    ]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let task = only_task(db, doc! {"params.timed": 2}).await;
    assert_eq!(
        task.get_datetime("not_before").ok(),
        DateTime::parse_rfc3339_str("2031-02-03T04:05:06Z")
            .ok()
            .as_ref()
    );
}
