//! Disbatch 4.103's own Perl CLI (`bin/disbatch` of the shared peer) against our `disbatch-web`:
//! every command it has, its output compared with what it prints against Disbatch's web app
//! (the CLI prints what the API answers, so a difference here is a difference in the API).
//!
//! Skipped, saying so in one line, where the peer or `perl` is missing (`PerlCli::find`),
//! unless `DISBATCH_REQUIRE_PERL_PEER` is set (CI), where a missing peer fails.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_tests::peers::perl_cli::{disbatch_json, said, PerlCli};
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

async fn tasks_where(db: &TestDb, filter: Document) -> Vec<Document> {
    let mut cursor = db
        .tasks()
        .find(filter)
        .sort(doc! {"_id": 1})
        .await
        .expect("find");
    let mut out = Vec::new();
    while cursor.advance().await.expect("cursor") {
        out.push(cursor.deserialize_current().expect("task"));
    }
    out
}

async fn queue_id(db: &TestDb, name: &str) -> ObjectId {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
        .and_then(|q| q.get_object_id("_id").ok())
        .expect("queue stored")
}

fn ids_of(tasks: &[Document]) -> String {
    tasks
        .iter()
        .map(|t| format!("{}\n", t.get_object_id("_id").expect("id").to_hex()))
        .collect()
}

const TABLE_HEAD: &str = "ID                       | Plugin                 | Name  | Threads | Queued | Running | Completed | \n\
                          -------------------------+------------------------+-------+---------+--------+---------+-----------+-\n";

#[tokio::test]
async fn queue_and_task_commands_print_what_they_print_against_disbatch() {
    let db = TestDb::new("perl_cli_queues").await;
    let config = write_config(&db, "dci.json", json!({}));
    let dci = Dci::start(&config);
    let Some(cli) = PerlCli::find(&dci.url) else {
        return;
    };

    cli.prints(&["plugins"], "Disbatch::Plugin::Demo\necho\n");
    cli.prints(
        &["queues"],
        "ID | Plugin | Name | Threads | Queued | Running | Completed | \n\
         ---+--------+------+---------+--------+---------+-----------+-\n\n0 total queues.\n",
    );

    let (demo, other) = check_create_queue_and_its_refusals(&db, &cli).await;

    check_update_queue_and_its_refusals(&cli, demo).await;

    let two = check_create_tasks_and_their_refusals(&db, &cli, other).await;

    // queues / status: Text::Table over id, plugin, name, threads and the counts.
    let table = format!(
        "{TABLE_HEAD}{demo} | Disbatch::Plugin::Demo | demo  | 2       | 3      | 0       | 0         | \n\
         {other} | echo                   | other |         | 2      | 0       | 0         | \n\n2 total queues.\n"
    );
    cli.prints(&["queues"], &table);
    cli.prints(&["status"], &table);

    check_tasks_prints_what_disbatch_prints(&cli, other, &two).await;

    // delete-queue, then the unknown command.
    cli.prints(&["delete-queue", "other"], "Deleted queue other\n");
    cli.fails(
        &["delete-queue", "other"],
        &cli.http_error(
            "deleting",
            "/queues/other",
            "404 Not Found",
            r#"{"error":"no queue other"}"#,
        ),
    );
    cli.prints(
        &["delete-queue", demo.to_hex().as_str()],
        &format!("Deleted queue {demo}\n"),
    );
    cli.fails(&["bogus"], "Unknown command 'bogus'\n");
    drop(dci);
    db.drop().await;
}

async fn check_create_queue_and_its_refusals(db: &TestDb, cli: &PerlCli) -> (ObjectId, ObjectId) {
    // create-queue (a form post) and its refusals.
    let r = cli.run(&["create-queue", "demo", "Disbatch::Plugin::Demo"]);
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    let demo = queue_id(db, "demo").await;
    assert_eq!(
        (r.code, r.stdout),
        (Some(0), format!("Created queue demo: {demo}\n"))
    );
    let r = cli.run(&["create-queue", "other", "echo"]);
    let other = queue_id(db, "other").await;
    assert_eq!(
        (r.code, r.stdout),
        (Some(0), format!("Created queue other: {other}\n"))
    );
    cli.fails(
        &["create-queue"],
        &cli.http_error(
            "posting",
            "/queues",
            "400 Bad Request",
            r#"{"error":"name and plugin required"}"#,
        ),
    );
    cli.fails(
        &["create-queue", "test", "Disbatch::Plugin::Fake"],
        &cli.http_error(
            "posting",
            "/queues",
            "400 Bad Request",
            r#"{"error":"Unknown plugin","plugin":"Disbatch::Plugin::Fake"}"#,
        ),
    );
    // A duplicate name (issue 51): said in words, not the server's E11000 line; Disbatch's
    // CLI prints the body as it comes.
    let r = cli.run(&["create-queue", "demo", "echo"]);
    let prefix = cli.http_error("posting", "/queues", "400 Bad Request", "");
    let body = r
        .stderr
        .trim_end()
        .strip_prefix(prefix.trim_end())
        .unwrap_or_else(|| panic!("{}", r.stderr));
    let body: Value = serde_json::from_str(body.trim()).expect("JSON error body");
    assert_eq!(body, json!({"error": "a queue named demo already exists"}));
    (demo, other)
}

async fn check_update_queue_and_its_refusals(cli: &PerlCli, demo: ObjectId) {
    // update-queue: form posts, so Disbatch's CLI echoes the value as a string.
    cli.prints(
        &["update-queue", "demo", "threads", "2"],
        "Updated queue demo: {\"threads\":\"2\"}\n",
    );
    cli.prints(
        &["update-queue", "demo", "threads", "2"],
        "No change to queue demo: {\"threads\":\"2\"}\n",
    );
    cli.prints(
        &["update-queue", demo.to_hex().as_str(), "name", "demo"],
        &format!("No change to queue {demo}: {{\"name\":\"demo\"}}\n"),
    );
    let at_demo = "/queues/demo";
    for (args, body) in [
        (vec!["update-queue", "demo"], r#"{"error":"no params"}"#),
        (
            vec!["update-queue", "demo", "bad", "field"],
            r#"{"error":"unknown param","param":"bad"}"#,
        ),
        (
            vec!["update-queue", "demo", "threads", "zero"],
            r#"{"error":"threads must be a non-negative integer"}"#,
        ),
        (
            vec!["update-queue", "demo", "plugin", "Disbatch::Plugin::Fake"],
            r#"{"error":"unknown plugin","plugin":"Disbatch::Plugin::Fake"}"#,
        ),
    ] {
        cli.fails(
            &args,
            &cli.http_error("posting", at_demo, "400 Bad Request", body),
        );
    }
    cli.fails(
        &["update-queue", "demo", "threads"],
        "Must pass an even number of arguments as key/value pairs\n",
    );
    // Disbatch answered an unknown queue with 400 and a dump of the update result; we say 404.
    cli.fails(
        &["update-queue", "nosuch", "threads", "1"],
        &cli.http_error(
            "posting",
            "/queues/nosuch",
            "404 Not Found",
            r#"{"error":"no queue nosuch"}"#,
        ),
    );
}

async fn check_create_tasks_and_their_refusals(
    db: &TestDb,
    cli: &PerlCli,
    other: ObjectId,
) -> Vec<Document> {
    // create-task and create-tasks (JSON posts of {queue, params}).
    let r = cli.run(&["create-task", "demo", "user1", "ashley"]);
    let one = tasks_where(db, doc! {"params.user1": "ashley"}).await;
    assert_eq!(
        (r.code, r.stdout),
        (
            Some(0),
            format!("Created 1 tasks in queue demo\n{}", ids_of(&one))
        )
    );
    cli.fails(&["create-task"], "Queue name not given\n");
    cli.fails(
        &["create-task", "demo", "odd"],
        "Must pass an even number of arguments as key/value pairs\n",
    );
    let r = cli.run(&["create-tasks", "other", r#"[{"fizz":1},{"buzz":2}]"#]);
    let two = tasks_where(db, doc! {"queue": other}).await;
    assert_eq!(
        (r.code, r.stdout),
        (
            Some(0),
            format!("Created 2 tasks in queue other\n{}", ids_of(&two))
        )
    );
    let not_array = r#"{"error":"'params' must be a JSON array of task params objects"}"#;
    let empty =
        r#"{"error":"'params' must be a JSON array of task params objects with key/value pairs"}"#;
    for (args, body) in [
        (vec!["create-tasks", "other"], empty),
        (vec!["create-tasks", "other", "{}"], empty),
        (vec!["create-tasks", "other", "[]"], not_array),
        (vec!["create-tasks", "other", "[1]"], not_array),
        (
            vec!["create-tasks", "DNE", r#"[{"a":1}]"#],
            r#"{"error":"queue not found"}"#,
        ),
        (
            vec![
                "--collection",
                "DNE",
                "create-tasks",
                "other",
                r#"{"filter":{"migration":"foo"},"params":{"user":"document.username"}}"#,
            ],
            r#"{"MongoDB::InsertManyResult":{"acknowledged":1,"inserted":[],"write_concern_errors":[],"write_errors":[]},"error":"Unknown error"}"#,
        ),
    ] {
        cli.fails(
            &args,
            &cli.http_error("posting", "/tasks", "400 Bad Request", body),
        );
    }
    // --collection: one task per matching document, `document.<field>` filled in.
    db.db
        .collection::<Document>("users")
        .insert_many([
            doc! {"username": "ashley", "migration": "foo"},
            doc! {"username": "matt", "migration": "foo"},
            doc! {"username": "zed", "migration": "bar"},
        ])
        .await
        .expect("users");
    let r = cli.run(&[
        "--collection",
        "users",
        "create-tasks",
        "demo",
        r#"{"filter":{"migration":"foo"},"params":{"user":"document.username","migration":"foo"}}"#,
    ]);
    let made = tasks_where(db, doc! {"params.migration": "foo"}).await;
    assert_eq!(made.len(), 2);
    assert_eq!(
        (r.code, r.stdout),
        (
            Some(0),
            format!("Created 2 tasks in queue demo\n{}", ids_of(&made))
        )
    );
    two
}

async fn check_tasks_prints_what_disbatch_prints(cli: &PerlCli, other: ObjectId, two: &[Document]) {
    // tasks: GET /tasks with a JSON body, `.fields` null unless given.
    let filter = format!(r#"{{"queue":"{other}"}}"#);
    let expected: Vec<Value> = two
        .iter()
        .map(|t| disbatch_json(&Bson::Document(t.clone()), false))
        .collect();
    for t in &expected {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(
            keys,
            ["_id", "ctime", "mtime", "node", "params", "queue", "status", "stderr", "stdout"]
        );
    }
    cli.prints(&["tasks", &filter], &said(&Value::Array(expected.clone())));
    cli.prints(&["tasks", &filter, "--count"], "2 tasks\n");
    cli.prints(&["tasks", &filter, "--limit", "1"], &said(&expected[0]));
    let first = two[0].get_object_id("_id").expect("id").to_hex();
    cli.prints(
        &[
            "tasks",
            &filter,
            "--limit",
            "1",
            "--fields",
            r#"["status"]"#,
        ],
        &format!("{{\"_id\":{{\"$oid\":\"{first}\"}},\"status\":-2}}\n"),
    );
    cli.prints(
        &["tasks", &filter, "--limit", "1", "--epoch"],
        &said(&disbatch_json(&Bson::Document(two[0].clone()), true)),
    );
    cli.prints(
        &["tasks", &filter, "--limit", "1", "--fields", r#"{"params":1}"#, "--pretty"],
        &format!("{{\n   \"_id\" : {{\n      \"$oid\" : \"{first}\"\n   }},\n   \"params\" : {{\n      \"fizz\" : 1\n   }}\n}}\n\n"),
    );
    cli.fails(
        &["tasks", "[]"],
        "Invalid filter is not a JSON object: '[]'\n",
    );
    let r = cli.run(&["tasks", r#"{"status":-2}"#]);
    let prefix = cli.http_error("getting", "/tasks", "400 Bad Request", "");
    let body = r
        .stderr
        .trim_end()
        .strip_prefix(prefix.trim_end())
        .unwrap_or_else(|| panic!("{}", r.stderr));
    let body: Value = serde_json::from_str(body.trim()).expect("JSON error body");
    assert_eq!(
        (
            &body["error"],
            &body["invalid_params"],
            &body["path"],
            &body["title"]
        ),
        (
            &json!("non-indexed params given"),
            &json!(["status"]),
            &json!("/tasks"),
            &json!("Disbatch Tasks Query")
        )
    );
    let indexes = body["indexes"].as_array().expect("indexes");
    for disbatch_set in [
        json!(["id"]),
        json!(["node", "status", "queue", "id"]),
        json!(["queue", "status"]),
    ] {
        assert!(indexes.contains(&disbatch_set), "{body}");
    }
}

#[tokio::test]
async fn finished_tasks_and_the_legacy_search_read_as_disbatch_shows_them() {
    let db = TestDb::new("perl_cli_run").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"web_extensions": {"Disbatch::Web::Tasks": {}}}),
    );
    let dci = Dci::start(&config);
    let Some(cli) = PerlCli::find(&dci.url) else {
        return;
    };
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 2).await;
    let r = cli.run(&[
        "create-tasks",
        "demo",
        r#"[{"commands":"a"},{"commands":"b"},{"commands":"0"}]"#,
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let created = tasks_where(&db, doc! {"queue": queue}).await;
    let ids: Vec<ObjectId> = created
        .iter()
        .map(|t| t.get_object_id("_id").expect("id"))
        .collect();
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    drop(den);
    let done = tasks_where(&db, doc! {"queue": queue}).await;

    check_empty_output_is_null_and_the_tasks_views(&cli, queue, &done).await;

    check_the_legacy_search_reads_as_disbatch(&cli, &done).await;
    drop(dci);
    db.drop().await;
}

async fn check_empty_output_is_null_and_the_tasks_views(
    cli: &PerlCli,
    queue: ObjectId,
    done: &[Document],
) {
    // Empty output is stored as null, as Disbatch's runner stores a plugin's undef output.
    let streams = |t: &Document| (t.get("stdout").cloned(), t.get("stderr").cloned());
    assert_eq!(streams(&done[0]).1, Some(Bson::Null), "{}", done[0]);
    assert_eq!(streams(&done[1]).0, Some(Bson::Null), "{}", done[1]);
    assert_eq!(
        streams(&done[2]),
        (Some(Bson::Null), Some(Bson::Null)),
        "{}",
        done[2]
    );

    let filter = format!(r#"{{"queue":"{}"}}"#, queue.to_hex());
    let fields = r#"["status","stdout","stderr"]"#;
    let view = |t: &Document, terse: bool| {
        let text = |k: &str| match t.get(k) {
            Some(Bson::String(s)) if terse && !s.is_empty() => json!("[terse mode]"),
            Some(b) => disbatch_json(b, false),
            None => Value::Null,
        };
        json!({"_id": {"$oid": t.get_object_id("_id").expect("id").to_hex()}, "status": t.get_i32("status").expect("status"),
               "stdout": text("stdout"), "stderr": text("stderr")})
    };
    let plain = Value::Array(done.iter().map(|t| view(t, false)).collect());
    let terse = Value::Array(done.iter().map(|t| view(t, true)).collect());
    cli.prints(&["tasks", &filter, "--fields", fields], &said(&plain));
    cli.prints(
        &["tasks", &filter, "--fields", fields, "--noterse"],
        &said(&plain),
    );
    cli.prints(
        &["tasks", &filter, "--fields", fields, "--terse"],
        &said(&terse),
    );
    cli.prints(
        &["tasks", &filter, "--fields", fields, "--full"],
        &said(&plain),
    );
    cli.prints(&["tasks", &filter, "--count"], "3 tasks\n");
}

async fn check_the_legacy_search_reads_as_disbatch(cli: &PerlCli, done: &[Document]) {
    // search: POST /tasks/search with `"options": null` unless --options; terse by default,
    // dates as epoch seconds.
    let searched = |terse: bool, docs: &[Document]| {
        let all: Vec<Value> = docs
            .iter()
            .map(|t| {
                let mut v = disbatch_json(&Bson::Document(t.clone()), true);
                for k in ["stdout", "stderr"] {
                    if terse && v[k].as_str().is_some_and(|s| !s.is_empty()) {
                        v[k] = json!("[terse mode]");
                    }
                }
                v
            })
            .collect();
        said(&Value::Array(all))
    };
    cli.prints(&["search"], &searched(true, done));
    cli.prints(
        &["search", r#"{"params.commands":"b"}"#],
        &searched(true, &done[1..2]),
    );
    cli.prints(
        &["search", r#"{"params.commands":"b"}"#, "--noterse"],
        &searched(false, &done[1..2]),
    );
    cli.prints(
        &["search", "{}", "--options", r#"{"limit":1}"#],
        &searched(true, &done[..1]),
    );
    cli.prints(&["search", r#"{"stdout":null}"#, "--count"], "2 tasks\n");
    cli.prints(&["search", "--count"], "3 tasks\n");
    let at = "/tasks/search";
    cli.fails(
        &["search", "[]"],
        &cli.http_error(
            "posting",
            at,
            "400 Bad Request",
            r#"{"error":"filter and options must be name/value objects"}"#,
        ),
    );
    cli.fails(
        &["search", "--options", r#"{"limit":200}"#],
        &cli.http_error(
            "posting",
            at,
            "400 Bad Request",
            r#"{"error":"limit cannot exceed 100"}"#,
        ),
    );
    cli.fails(
        &["search", r#""foo""#],
        "Invalid filter is not JSON: '\"foo\"'\n",
    );
}
