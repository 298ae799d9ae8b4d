//! Enqueueing from code (issue 51): `POST /tasks` with `not_before`, `delay_s` and `priority`,
//! refusals that name their field, the `ids` answer with duplicates, the CLI's duplicates and
//! exit status, `create-task` KEY=VALUE values as JSON, and names instead of ids (queue names
//! in `disbatch tasks`, a dependency's name in a cancel reason, a taken queue name).

use std::process::Output;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

/// Exit status of `create-task`/`create-tasks` when inputs were duplicates (cli/src/exit.rs).
pub(super) const DUPLICATES: i32 = 10;

/// The server's own time, as the fleet reads it (`hello`'s `localTime`).
pub(super) async fn server_now(db: &TestDb) -> DateTime {
    let reply = db.db.run_command(doc! {"hello": 1}).await.expect("hello");
    *reply
        .get_datetime("localTime")
        .expect("the server says its time")
}

fn hex_id(v: &Value) -> ObjectId {
    ObjectId::parse_str(v.as_str().unwrap_or_default()).unwrap_or_else(|_| panic!("no id: {v}"))
}

pub(super) fn out(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub(super) async fn only_task(db: &TestDb, filter: Document) -> Document {
    let mut found: Vec<Document> =
        futures::TryStreamExt::try_collect(db.tasks().find(filter.clone()).await.expect("find"))
            .await
            .expect("read");
    assert_eq!(found.len(), 1, "one task for {filter}: {found:?}");
    found.remove(0)
}

#[tokio::test]
async fn delays_and_priorities_are_stored_and_a_delayed_task_is_not_claimed() {
    let db = TestDb::new("enqueue_timing").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("later", "echo", 2).await;
    let dci = Dci::start(&config);

    let delayed = check_a_delay_counts_on_the_server_clock(&db, &dci).await;

    check_not_before_forms_and_per_task_values(&db, &dci).await;

    // Digits as text, as a form body sends every value.
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "later", "params": {"form": "x"}, "delay_s": "60", "priority": "2"}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let task = only_task(&db, doc! {"params.form": "x"}).await;
    assert_eq!(task.get("priority"), Some(&Bson::Int64(2)), "{task}");
    assert!(task.get_datetime("not_before").is_ok(), "{task}");

    // With a node claiming: a task made after the delayed one, and one whose delay is 0, run;
    // the delayed one, first in the queue, stays queued while its time is ahead.
    db.tasks()
        .delete_many(doc! {"_id": {"$ne": delayed}})
        .await
        .expect("clear");
    let _den = Den::start(&config, "n1");
    let (s, now) = dci
        .post(
            "/tasks",
            json!({"queue": "later", "params": [{"n": "now"}, {"n": "zero"}], "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{now}");
    let (s, zero) = dci
        .post(
            "/tasks",
            json!({"queue": "later", "params": {"n": "zero"}, "delay_s": 0, "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{zero}");
    let ran = [hex_id(&now["ids"][0]), hex_id(&zero["ids"][0])];
    db.wait_complete(&ran, Duration::from_secs(60)).await;
    let task = db.task(delayed).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::QUEUED),
        "still queued: {task}"
    );
    assert!(
        task.get_datetime("not_before").expect("not_before") > &server_now(&db).await,
        "its time is still ahead on the server's clock"
    );
    db.drop().await;
}

async fn check_a_delay_counts_on_the_server_clock(db: &TestDb, dci: &Dci) -> ObjectId {
    // delay_s counts on the server's clock: the stored time is within the request's span.
    let before = server_now(db).await;
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "later", "params": {"n": "delayed"}, "delay_s": 3600, "priority": 7, "answer": "ids"}),
        )
        .await;
    let after = server_now(db).await;
    assert_eq!(s, 200, "{made}");
    let delayed = hex_id(&made["ids"][0]);
    let task = db.task(delayed).await;
    let not_before = task.get_datetime("not_before").expect("not_before stored");
    // The DCI's reading of the server's clock may be a little off between its readings: a
    // minute of slack each way, nowhere near the hour asked for (nor a host clock an hour off).
    let (hour, slack) = (3_600_000, 60_000);
    assert!(
        not_before.timestamp_millis() >= before.timestamp_millis() + hour - slack
            && not_before.timestamp_millis() <= after.timestamp_millis() + hour + slack,
        "not_before {not_before} is an hour after the server's {before}..{after}"
    );
    assert_eq!(task.get("priority"), Some(&Bson::Int64(7)), "{task}");
    assert!(
        task.get_document("params")
            .expect("params")
            .get("priority")
            .is_none(),
        "task fields, not params: {task}"
    );
    delayed
}

async fn check_not_before_forms_and_per_task_values(db: &TestDb, dci: &Dci) {
    // not_before in each of its forms, stored as the same date.
    let at = DateTime::parse_rfc3339_str("2031-02-03T04:05:06Z").expect("date");
    for (n, form) in [
        json!("2031-02-03T04:05:06Z"),
        json!("2031-02-03T04:05:06.000Z"),
        json!("2031-02-03T05:05:06+01:00"),
        json!("2031-02-03T04:05:06"),
        json!({"$date": "2031-02-03T04:05:06Z"}),
        json!({"$date": {"$numberLong": at.timestamp_millis().to_string()}}),
    ]
    .into_iter()
    .enumerate()
    {
        let (s, made) = dci
            .post(
                "/tasks",
                json!({"queue": "later", "params": {"form": n}, "not_before": form, "priority": -3}),
            )
            .await;
        assert_eq!(s, 200, "{form}: {made}");
        let task = only_task(db, doc! {"params.form": n as i64}).await;
        assert_eq!(task.get_datetime("not_before").ok(), Some(&at), "{form}");
        assert_eq!(task.get("priority"), Some(&Bson::Int64(-3)), "{form}");
    }
    // Per task: each entry of `tasks` its own time and priority, the request's the default.
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "later", "priority": 1, "delay_s": 7200, "answer": "ids", "tasks": [
                {"params": {"each": 0}, "not_before": "2031-02-03T04:05:06Z", "priority": 9},
                {"params": {"each": 1}, "delay_s": 0},
                {"params": {"each": 2}},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let each: Vec<Document> =
        futures::future::join_all((0..3).map(|n| only_task(db, doc! {"params.each": n}))).await;
    assert_eq!(each[0].get_datetime("not_before").ok(), Some(&at));
    assert_eq!(each[0].get("priority"), Some(&Bson::Int64(9)));
    assert!(
        each[1].get_datetime("not_before").expect("not_before")
            < each[2].get_datetime("not_before").expect("not_before"),
        "delay_s 0 is before the request's two hours: {each:?}"
    );
    assert_eq!(
        each[1].get("priority"),
        Some(&Bson::Int64(1)),
        "the default"
    );
    for (d, n) in each.iter().zip(0..) {
        assert_eq!(d.get_document("params").ok(), Some(&doc! {"each": n}));
    }
}

#[tokio::test]
async fn every_refusal_names_its_field_and_stores_nothing() {
    let db = TestDb::new("enqueue_refusals").await;
    let config = write_config(&db, "web.json", json!({}));
    db.insert_queue("q", "echo", 0).await;
    let dci = Dci::start(&config);
    let p = json!({"a": 1});
    let with = |extra: Value| {
        let mut body = json!({"queue": "q", "params": p});
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        body
    };
    // (body, the field the error starts by naming)
    let cases = [
        (with(json!({"not_before": "tomorrow"})), "not_before"),
        (with(json!({"not_before": 1_900_000_000})), "not_before"),
        (with(json!({"not_before": {"$date": "x"}})), "not_before"),
        (with(json!({"not_before": {"when": 1}})), "not_before"),
        (with(json!({"delay_s": -1})), "delay_s"),
        (with(json!({"delay_s": "soon"})), "delay_s"),
        (with(json!({"delay_s": 1e12})), "delay_s"),
        (with(json!({"delay_s": [5]})), "delay_s"),
        (
            with(json!({"delay_s": 5, "not_before": "2031-01-01T00:00:00Z"})),
            "not_before and delay_s",
        ),
        (with(json!({"priority": 1.5})), "priority"),
        (with(json!({"priority": "high"})), "priority"),
        (with(json!({"priority": true})), "priority"),
        (with(json!({"answer": "xml"})), "answer"),
        (with(json!({"colour": "red"})), "unknown field \"colour\""),
        (json!({"params": p}), "queue is required"),
        (json!({"queue": "q"}), "params is required"),
        (
            with(json!({"collection": "users"})),
            "collection needs filter",
        ),
        (with(json!({"filter": {}})), "filter needs collection"),
        (
            with(json!({"tasks": [{"params": {"a": 1}}]})),
            "tasks and params cannot both be given",
        ),
        (json!({"queue": "q", "tasks": []}), "tasks must be"),
        (
            json!({"queue": "q", "tasks": [5]}),
            "tasks[0] must be an object",
        ),
        (
            json!({"queue": "q", "tasks": [{"params": {"a": 1}}, {"params": {}}]}),
            "tasks[1].params",
        ),
        (
            json!({"queue": "q", "tasks": [{"params": {"a": 1}, "colour": 1}]}),
            "tasks[0]: unknown field \"colour\"",
        ),
        (
            json!({"queue": "q", "tasks": [{"params": {"a": 1}}, {"params": {"a": 2}, "priority": 0.5}]}),
            "tasks[1].priority",
        ),
        (
            json!({"queue": "q", "tasks": [{"params": {"a": 1}, "delay_s": -5}]}),
            "tasks[0].delay_s",
        ),
        (
            json!({"queue": "q", "tasks": [{"params": {"a": 1}, "not_before": "soon"}]}),
            "tasks[0].not_before",
        ),
    ];
    for (body, field) in cases {
        let (s, reply) = dci.post("/tasks", body.clone()).await;
        let error = reply["error"].as_str().unwrap_or_default();
        assert!(
            s == 400 && error.starts_with(field),
            "POST /tasks {body}: {s} {reply}, expected an error naming {field}"
        );
    }
    let (s, reply) = dci.post("/tasks", json!([{"a": 1}])).await;
    assert_eq!(s, 400, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not an array"),
        "{reply}"
    );
    assert_eq!(db.count(doc! {}).await, 0, "no refused task was stored");
    db.drop().await;
}

#[tokio::test]
async fn the_ids_answer_gives_every_input_its_task_and_names_duplicates() {
    let db = TestDb::new("enqueue_ids").await;
    let config = write_config(&db, "web.json", json!({}));
    let uq = db.insert_queue("uq", "echo", 0).await;
    db.set_queue(uq, doc! {"unique": {"key": "params.id"}})
        .await;
    db.insert_queue("plain", "echo", 0).await;
    let dci = Dci::start(&config);

    let (s, first) = dci
        .post(
            "/tasks",
            json!({"queue": "uq", "params": {"id": 1}, "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["duplicates"], json!([]), "{first}");
    assert_eq!(first["created"], json!(1), "{first}");
    let one = hex_id(&first["ids"][0]);

    let (s, reply) = dci
        .post(
            "/tasks",
            json!({"queue": "uq", "params": [{"id": 1}, {"id": 2}, {"id": 2}], "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{reply}");
    let ids: Vec<ObjectId> = reply["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("ids: {reply}"))
        .iter()
        .map(hex_id)
        .collect();
    assert_eq!(ids.len(), 3, "one id per input: {reply}");
    assert_eq!(ids[0], one, "a duplicate's id is the task it matched");
    assert_eq!(ids[2], ids[1], "{reply}");
    assert_eq!(
        reply["duplicates"],
        json!([{"index": 0, "matched": one.to_hex()}, {"index": 2, "matched": ids[1].to_hex()}])
    );
    assert_eq!(reply["created"], json!(1), "{reply}");
    assert_eq!(db.count(doc! {"queue": uq}).await, 2);

    // Disbatch's answer stays the default, and "disbatch" asks for it by name.
    for extra in [json!({}), json!({"answer": "disbatch"})] {
        let mut body = json!({"queue": "plain", "params": [{"x": 1}]});
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        let (s, reply) = dci.post("/tasks", body).await;
        assert_eq!(s, 200, "{reply}");
        assert!(reply.get("MongoDB::InsertManyResult").is_some(), "{reply}");
        assert!(reply.get("ids").is_none(), "{reply}");
    }
    let (s, reply) = dci
        .post(
            "/tasks",
            json!({"queue": "plain", "params": [{"x": 1}, {"x": 1}], "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{reply}");
    assert_eq!(reply["duplicates"], json!([]), "a plain queue has none");
    assert_eq!(reply["ids"].as_array().map(Vec::len), Some(2), "{reply}");
    db.drop().await;
}

#[tokio::test]
async fn names_not_ids_in_tasks_cancel_reasons_and_taken_queue_names() {
    let db = TestDb::new("enqueue_names").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let (code, stdout, stderr) = out(&dci.cli(&["create-queue", "reports", "echo"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let reports = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"name": "reports"})
        .await
        .expect("find")
        .and_then(|q| q.get_object_id("_id").ok())
        .expect("queue");

    // disbatch tasks: the queue's name, not its id.
    let (code, stdout, stderr) = out(&dci.cli(&["create-task", "reports", "n=1"]));
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let (code, table, stderr) = out(&dci.cli(&["tasks", r#"{"queue":"reports"}"#]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        table.contains(" reports ") && !table.contains(&reports.to_hex()),
        "{table}"
    );

    // A graph's cancel reason names the dependency first, its id beside it.
    let (s, graph) = dci
        .post(
            "/graphs",
            json!({"tasks": [
                {"name": "fetch", "queue": "reports", "params": {"n": 1}},
                {"name": "render", "queue": "reports", "params": {"n": 2}, "depends_on": ["fetch"]},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{graph}");
    let fetch = hex_id(&graph["ids"]["fetch"]);
    let render = hex_id(&graph["ids"]["render"]);
    // A task without a name (made by POST /tasks) is named by its id alone.
    let (s, plain) = dci
        .post(
            "/tasks",
            json!({"queue": "reports", "params": {"n": 3}, "depends_on": [render.to_hex()], "answer": "ids"}),
        )
        .await;
    assert_eq!(s, 200, "{plain}");
    let last = hex_id(&plain["ids"][0]);
    let (s, cancelled) = dci
        .post(&format!("/tasks/{}/cancel", fetch.to_hex()), json!({}))
        .await;
    assert_eq!(s, 200, "{cancelled}");
    wait_for(
        "the dependents cancelled",
        Duration::from_secs(30),
        || async {
            db.count(doc! {"_id": {"$in": [render, last]}, "status": -5})
                .await
                == 2
        },
    )
    .await;
    let reason = |d: Document| d.get_str("cancel_reason").unwrap_or_default().to_string();
    assert_eq!(
        reason(db.task(render).await),
        format!("dependency \"fetch\" ({fetch}) was cancelled")
    );
    assert_eq!(
        reason(db.task(last).await),
        format!("dependency \"render\" ({render}) was cancelled")
    );

    // A taken name, on create and on rename, in words; the CLI shows them.
    let taken = json!({"error": "a queue named reports already exists"});
    let (s, reply) = dci
        .post("/queues", json!({"name": "reports", "plugin": "echo"}))
        .await;
    assert_eq!((s, reply), (400, taken.clone()));
    let (s, _) = dci
        .post("/queues", json!({"name": "other", "plugin": "echo"}))
        .await;
    assert_eq!(s, 200);
    let (s, reply) = dci.post("/queues/other", json!({"name": "reports"})).await;
    assert_eq!((s, reply), (400, taken));
    let (code, stdout, stderr) = out(&dci.cli(&["create-queue", "reports", "echo"]));
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("a queue named reports already exists") && !stderr.contains("E11000"),
        "{stderr}"
    );
    db.drop().await;
}
