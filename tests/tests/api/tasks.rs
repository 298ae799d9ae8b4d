//! `disbatch-web` black-box: creating tasks and reading one (searches: `task_search.rs`;
//! output streams: `task_output.rs`).

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::api::error;
use disbatch_tests::api_calls::{inserted, oid, parse, raw, six_tasks};
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const NOT_ARRAY: &str = "'params' must be a JSON array of task params objects";
const EMPTY_OBJECT: &str =
    "'params' must be a JSON array of task params objects with key/value pairs";

#[tokio::test]
async fn tasks_are_created_one_many_or_from_a_collection() {
    let db = TestDb::new("api_tasks_create").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("echo", "echo", 0).await;
    db.db
        .collection::<Document>("users")
        .insert_many(vec![
            doc! {"email": "a@example.com", "n": 1, "kind": "x", "secret": "s1"},
            doc! {"email": "b@example.com", "n": 2, "kind": "x", "secret": "s2"},
            doc! {"email": "c@example.com", "kind": "y"},
        ])
        .await
        .expect("insert users");
    let dci = Dci::start(&config);

    check_one_task_is_stored_with_every_field(&db, &dci, queue).await;

    let created = check_many_tasks_and_tasks_from_a_collection(&db, &dci, queue).await;

    // An unknown queue is reported before anything else is looked at.
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "nosuch", "params": "bogus", "x": 1}),
        )
        .await;
    assert_eq!((status, body), (400, error("queue not found")));
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": ObjectId::new().to_hex(), "params": {"a": 1}}),
        )
        .await;
    assert_eq!((status, body), (400, error("queue not found")));

    check_bad_bodies_name_their_field_and_create_nothing(&db, &dci, created).await;
    drop(dci);
    db.drop().await;
}

async fn check_one_task_is_stored_with_every_field(db: &TestDb, dci: &Dci, queue: ObjectId) {
    let before = DateTime::now().timestamp_millis() / 1000 * 1000;
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "echo", "params": {"a": 1, "nested": {"b": [1, 2]}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let one = inserted(&body);
    assert_eq!(one.len(), 1);
    let t = db.task(one[0]).await;
    assert_eq!(t.get_object_id("queue").ok(), Some(queue), "{t}");
    assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED), "{t}");
    for field in ["node", "stdout", "stderr"] {
        assert_eq!(t.get(field), Some(&Bson::Null), "{field}: {t}");
    }
    assert_eq!(
        t.get_document("params").ok(),
        Some(&doc! {"a": 1, "nested": {"b": [1, 2]}}),
        "{t}"
    );
    let ctime = t
        .get_datetime("ctime")
        .expect("ctime date")
        .timestamp_millis();
    assert!(
        ctime >= before && ctime <= DateTime::now().timestamp_millis(),
        "{t}"
    );
    assert!(t.get_datetime("mtime").is_ok(), "{t}");
}

async fn check_many_tasks_and_tasks_from_a_collection(
    db: &TestDb,
    dci: &Dci,
    queue: ObjectId,
) -> u64 {
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": queue.to_hex(), "params": [{"a": 1}, {"b": 2}, {"c": 3}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let many = inserted(&body);
    assert_eq!(many.len(), 3);
    for (id, key) in many.iter().zip(["a", "b", "c"]) {
        let t = db.task(*id).await;
        assert!(
            t.get_document("params").expect("params").contains_key(key),
            "{t}"
        );
    }
    // The queue may also be given as an extended-JSON ObjectId.
    let (status, body) = dci
        .post("/tasks", json!({"queue": oid(queue), "params": {"d": 4}}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(inserted(&body).len(), 1);

    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "echo", "collection": "users", "filter": {"kind": "x"},
                   "params": {"user": "document.email", "n": "document.n", "kind": "migration", "k": 7}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let from = inserted(&body);
    assert_eq!(from.len(), 2);
    let mut params = Vec::new();
    for id in &from {
        let t = db.task(*id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED));
        params.push(t.get_document("params").expect("params").clone());
    }
    params.sort_by_key(|p| p.get_str("user").unwrap_or_default().to_string());
    assert_eq!(
        params,
        vec![
            doc! {"user": "a@example.com", "n": 1, "kind": "migration", "k": 7},
            doc! {"user": "b@example.com", "n": 2, "kind": "migration", "k": 7},
        ]
    );
    let created = db.count(doc! {}).await;
    assert_eq!(created, 7);
    created
}

async fn check_bad_bodies_name_their_field_and_create_nothing(
    db: &TestDb,
    dci: &Dci,
    created: u64,
) {
    let coll = |filter: Value, collection: Value, params: Value| json!({"queue": "echo", "collection": collection, "filter": filter, "params": params});
    let cases = [
        (json!({"queue": "echo", "params": []}), error(NOT_ARRAY)),
        (
            json!({"queue": "echo", "params": [{"a": 1}, 2]}),
            error(NOT_ARRAY),
        ),
        (json!({"queue": "echo", "params": "a=1"}), error(NOT_ARRAY)),
        (json!({"queue": "echo", "params": 5}), error(NOT_ARRAY)),
        (
            json!({"queue": "echo", "params": [{"a": 1}, {}]}),
            error(EMPTY_OBJECT),
        ),
        (json!({"queue": "echo", "params": {}}), error(EMPTY_OBJECT)),
        (
            coll(
                json!("kind=x"),
                json!("users"),
                json!({"u": "document.email"}),
            ),
            error("'filter' must be a JSON object"),
        ),
        (
            coll(json!([]), json!("users"), json!({"u": "document.email"})),
            error("'filter' must be a JSON object"),
        ),
        (
            coll(json!({}), json!(""), json!({"u": "document.email"})),
            error("'collection' required and must be a scalar (string)'"),
        ),
        (
            coll(json!({}), json!(["users"]), json!({"u": "document.email"})),
            error("'collection' required and must be a scalar (string)'"),
        ),
        // Issue 51: each refusal names the field it refuses (Disbatch said only "invalid
        // parameters passed").
        (
            json!({"queue": "echo"}),
            error("params is required: a task's params object, or an array of them (or tasks: an array of {params, not_before, delay_s, priority})"),
        ),
        (
            json!({"queue": "echo", "params": {"a": 1}, "extra": 1}),
            error("unknown field \"extra\": POST /tasks takes queue, params, tasks, collection, filter, depends_on, on_dependency_failure, not_before, delay_s, priority, answer"),
        ),
        (
            json!({"queue": "echo", "params": {"a": 1}, "collection": "users"}),
            error("collection needs filter: a JSON object choosing its documents ({} for all)"),
        ),
        (
            json!({"params": {"a": 1}}),
            error("queue is required: the id or name of the queue to add the tasks to"),
        ),
        (
            json!({}),
            error("queue is required: the id or name of the queue to add the tasks to"),
        ),
        (
            json!([{"a": 1}]),
            error("the body must be a JSON object {\"queue\": …, \"params\": …}, not an array: POST /tasks has no queue in its path"),
        ),
    ];
    for (input, expected) in cases {
        let (status, body) = dci.post("/tasks", input.clone()).await;
        assert_eq!((status, body), (400, expected), "POST /tasks {input}");
    }

    let (status, body) = dci
        .post(
            "/tasks",
            coll(
                json!({"kind": "none"}),
                json!("users"),
                json!({"u": "document.email"}),
            ),
        )
        .await;
    assert_eq!(
        (status, body),
        (
            400,
            json!({"MongoDB::InsertManyResult": {"acknowledged": 1, "inserted": [], "write_errors": [],
                   "write_concern_errors": []}, "error": "Unknown error"})
        )
    );
    assert_eq!(
        db.count(doc! {}).await,
        created,
        "failed requests created nothing"
    );
}

#[tokio::test]
async fn one_task_is_pretty_json_or_html_and_unknown_ids_are_404() {
    let db = TestDb::new("api_task_one").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = six_tasks(&db).await;
    let dci = Dci::start(&config);
    let id = f.ids[1];

    let (status, ct, text) = raw(
        &dci,
        Method::GET,
        &format!("/tasks/{}", id.to_hex()),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(ct, "application/json");
    assert!(text.contains("\n   "), "pretty-printed: {text}");
    let task = parse(&text);
    assert_eq!(task["_id"], oid(id));
    assert_eq!(task["queue"], oid(f.queue));
    assert_eq!(task["status"], status::SUCCEEDED);
    assert_eq!(task["node"], "n1");
    assert_eq!(task["params"], json!({"i": 1}));
    assert_eq!(task["stdout"], "hello\n");
    assert_eq!(task["ctime"].as_str().map(str::len), Some(19), "{task}");
    // No .full here: GridFS output stays an id.
    let (_, gridfs) = dci.get(&format!("/tasks/{}", f.ids[3].to_hex())).await;
    assert_eq!(gridfs["stdout"], oid(f.gridfs_out));

    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let (status, ct, html) = raw(
        &dci,
        Method::GET,
        &format!("/tasks/{}", id.to_hex()),
        &[("accept", browser)],
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(
        html.contains(&id.to_hex()) && html.contains("hello"),
        "{html}"
    );
    assert!(html.contains("<html"), "{html}");
    let (status, ct, _) = raw(
        &dci,
        Method::GET,
        &format!("/tasks/{}", id.to_hex()),
        &[("accept", "*/*")],
        "",
    )
    .await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));

    let unknown = ObjectId::new().to_hex();
    let (status, body) = dci.get(&format!("/tasks/{unknown}")).await;
    assert_eq!(
        (status, body),
        (404, error(&format!("no task with id {unknown}")))
    );
    let (status, ct, html) = raw(
        &dci,
        Method::GET,
        &format!("/tasks/{unknown}"),
        &[("accept", browser)],
        "",
    )
    .await;
    assert_eq!(status, 404);
    assert!(
        ct.starts_with("text/html") && html.contains("Document(s) not found."),
        "{ct}: {html}"
    );

    for bad in ["nothex", "zzzzzzzzzzzzzzzzzzzzzzzz", "1234"] {
        let (status, body) = dci.get(&format!("/tasks/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    drop(dci);
    db.drop().await;
}
