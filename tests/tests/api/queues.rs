//! `disbatch-web` black-box: `/queues`, success shapes and every documented error.

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_tests::api::{assert_sorted_keys, error, update_result};
use disbatch_tests::api_calls::raw_json;
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

async fn queue_doc(db: &TestDb, name: &str) -> Option<Document> {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
}

#[tokio::test]
async fn queues_list_counts_by_status_and_are_found_by_name_or_id() {
    let db = TestDb::new("api_queues_list").await;
    let config = write_config(&db, "web.json", json!({}));
    let alpha = db.insert_queue("alpha", "echo", 2).await;
    let beta = db
        .insert_queue("beta", "Disbatch::Plugin::Demo", Bson::Null)
        .await;
    let statuses = [-6, -5, -4, -3, -2, -1, 0, 1, 2, 3];
    let ids = db
        .insert_tasks(
            alpha,
            statuses.iter().map(|s| doc! {"s": *s}.into()).collect(),
        )
        .await;
    for (id, s) in ids.iter().zip(statuses) {
        db.set_task(*id, doc! {"status": s}).await;
    }
    // Of the failed, status 3 was given up on; of the queued, -2 waits out a retry's backoff.
    db.set_task(ids[9], doc! {"discarded_at": bson::DateTime::now()})
        .await;
    let in_an_hour =
        bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_600_000);
    db.set_task(
        ids[4],
        doc! {"attempt": ObjectId::new(), "not_before": in_an_hour},
    )
    .await;
    // A task of another queue is not counted for alpha.
    db.insert_tasks(beta, vec![doc! {"x": 1}.into()]).await;

    let dci = Dci::start(&config);
    let (status, list) = dci.get("/queues").await;
    assert_eq!(status, 200, "{list}");
    assert_sorted_keys(&list);
    let list = list.as_array().expect("array").clone();
    assert_eq!(list.len(), 2, "{list:?}");
    let find = |name: &str| {
        list.iter()
            .find(|q| q["name"] == name)
            .cloned()
            .expect("queue listed")
    };
    assert_eq!(
        find("alpha"),
        json!({"completed": 3, "failed": 2, "discarded": 1, "retrying": 1,
               "id": alpha.to_hex(), "name": "alpha", "paused_threads": null,
               "plugin": "echo", "queued": 5, "running": 2, "sort": null, "succeeded": 1, "threads": 2,
               "by_status": {"queued": 1, "claimed": 1, "running": 1, "succeeded": 1, "failed": 2,
                             "terminated": 1, "blocked": 1, "cancelled": 1, "orphaned": 1, "other": 0}}),
        "Disbatch's fields keep their meaning (queued: every status <= -2); by_status splits them"
    );
    assert_eq!(
        find("beta"),
        json!({"completed": 0, "failed": 0, "discarded": 0, "retrying": 0,
               "id": beta.to_hex(), "name": "beta", "paused_threads": null,
               "plugin": "Disbatch::Plugin::Demo", "queued": 1, "running": 0, "sort": null, "succeeded": 0,
               "threads": null,
               "by_status": {"queued": 1, "claimed": 0, "running": 0, "succeeded": 0, "failed": 0,
                             "terminated": 0, "blocked": 0, "cancelled": 0, "orphaned": 0, "other": 0}})
    );

    // One queue's view is its list row.
    let (status, by_name) = dci.get("/queues/alpha").await;
    assert_eq!(status, 200);
    assert_eq!(by_name, find("alpha"));
    let (status, by_id) = dci.get(&format!("/queues/{}", beta.to_hex())).await;
    assert_eq!(status, 200);
    assert_eq!(by_id, find("beta"));

    let (status, body) = dci.get("/queues/nosuch").await;
    assert_eq!((status, body), (404, error("no queue nosuch")));
    let unknown = ObjectId::new().to_hex();
    let (status, body) = dci.get(&format!("/queues/{unknown}")).await;
    assert_eq!((status, body), (404, error(&format!("no queue {unknown}"))));
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn queues_are_created_with_the_insert_envelope_and_validated() {
    let db = TestDb::new("api_queues_create").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);

    check_queues_are_created_with_the_envelope_threads_and_sort(&db, &dci).await;

    check_bad_queues_are_refused_and_not_stored(&db, &dci).await;

    let (status, body) = dci
        .post("/queues", json!({"name": "q1", "plugin": "echo"}))
        .await;
    // Issue 51: the taken name in words, not the server's E11000 line.
    assert_eq!(
        (status, body),
        (400, json!({"error": "a queue named q1 already exists"}))
    );
    let n = db
        .db
        .collection::<Document>("queues")
        .count_documents(doc! {"name": "q1"})
        .await
        .expect("count");
    assert_eq!(n, 1);
    drop(dci);
    db.drop().await;
}

async fn check_queues_are_created_with_the_envelope_threads_and_sort(db: &TestDb, dci: &Dci) {
    let (status, body) = dci
        .post("/queues", json!({"name": "q1", "plugin": "echo"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let id = body["id"]["$oid"].as_str().expect("id").to_string();
    assert_eq!(
        body,
        json!({"MongoDB::InsertOneResult": {"acknowledged": 1, "inserted_id": {"$oid": id},
               "write_errors": [], "write_concern_errors": []}, "id": {"$oid": id}})
    );
    let q1 = queue_doc(db, "q1").await.expect("q1 stored");
    assert_eq!(q1.get_object_id("_id").expect("_id").to_hex(), id);
    assert_eq!(q1.get_str("plugin").ok(), Some("echo"));
    assert!(
        q1.get("threads").is_none(),
        "a new queue has no threads: {q1}"
    );
    let (status, listed) = dci.get("/queues/q1").await;
    assert_eq!(status, 200);
    assert_eq!(listed["threads"], Value::Null);

    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "q2", "plugin": "Disbatch::Plugin::Demo", "threads": 3, "sort": "lifo"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let q2 = queue_doc(db, "q2").await.expect("q2 stored");
    assert_eq!(q2.get("threads"), Some(&Bson::Int64(3)));
    assert_eq!(q2.get_str("sort").ok(), Some("lifo"));
    let (_, listed) = dci.get("/queues/q2").await;
    assert_eq!(
        (listed["threads"].clone(), listed["sort"].clone()),
        (json!(3), json!("lifo"))
    );

    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "q3", "plugin": "echo", "threads": null}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        queue_doc(db, "q3").await.expect("q3").get("threads"),
        Some(&Bson::Null)
    );

    let (status, _, body) = raw_json(
        dci,
        Method::POST,
        "/queues",
        Some("application/x-www-form-urlencoded"),
        "name=q4&plugin=echo&threads=2",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        queue_doc(db, "q4").await.expect("q4").get("threads"),
        Some(&Bson::Int64(2))
    );
}

async fn check_bad_queues_are_refused_and_not_stored(db: &TestDb, dci: &Dci) {
    let cases = [
        (json!({"plugin": "echo"}), error("name and plugin required")),
        (json!({"name": "x"}), error("name and plugin required")),
        (
            json!({"name": "", "plugin": "echo"}),
            error("name and plugin required"),
        ),
        (
            json!({"name": "x", "plugin": ""}),
            error("name and plugin required"),
        ),
        (json!({}), error("name and plugin required")),
        (
            json!({"name": "x", "plugin": "echo", "constructor": "y"}),
            json!({"error": "Invalid param", "param": "constructor"}),
        ),
        (
            json!({"name": "x", "plugin": "Nope"}),
            json!({"error": "Unknown plugin", "plugin": "Nope"}),
        ),
        (
            json!({"name": "x", "plugin": "echo", "threads": -1}),
            error("threads must be a non-negative integer or null"),
        ),
        (
            json!({"name": "x", "plugin": "echo", "threads": "many"}),
            error("threads must be a non-negative integer or null"),
        ),
        (
            json!({"name": "x", "plugin": "echo", "threads": 1.5}),
            error("threads must be a non-negative integer or null"),
        ),
        (
            json!({"name": "x", "plugin": "echo", "sort": "random"}),
            error("sort must be fifo, lifo, default or priority"),
        ),
        (
            json!({"name": "x", "plugin": "echo", "sort": 1}),
            error("sort must be fifo, lifo, default or priority"),
        ),
    ];
    for (input, expected) in cases {
        let (status, body) = dci.post("/queues", input.clone()).await;
        assert_eq!((status, body), (400, expected), "POST /queues {input}");
    }
    assert!(
        queue_doc(db, "x").await.is_none(),
        "no invalid queue was stored"
    );
}

#[tokio::test]
async fn queues_are_updated_field_by_field_and_validated() {
    let db = TestDb::new("api_queues_update").await;
    let config = write_config(&db, "web.json", json!({}));
    let id = db.insert_queue("old", "echo", 1).await;
    db.insert_queue("taken", "echo", 1).await;
    let dci = Dci::start(&config);
    let stored = || async {
        db.db
            .collection::<Document>("queues")
            .find_one(doc! {"_id": id})
            .await
            .expect("find")
            .expect("queue exists")
    };

    let (status, body) = dci.post("/queues/old", json!({"name": "new"})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(stored().await.get_str("name").ok(), Some("new"));
    let (status, body) = dci
        .post("/queues/new", json!({"plugin": "Disbatch::Plugin::Demo"}))
        .await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(
        stored().await.get_str("plugin").ok(),
        Some("Disbatch::Plugin::Demo")
    );
    let path = format!("/queues/{}", id.to_hex());
    let (status, body) = dci.post(&path, json!({"threads": 7})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(stored().await.get("threads"), Some(&Bson::Int64(7)));
    let (status, _, body) = raw_json(
        &dci,
        Method::POST,
        &path,
        Some("application/x-www-form-urlencoded"),
        "threads=4",
    )
    .await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(
        stored().await.get("threads"),
        Some(&Bson::Int64(4)),
        "digit strings are stored as numbers"
    );
    // null pauses a queue (the CLI's `queue set threads null`).
    let (status, body) = dci.post(&path, json!({"threads": null})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(stored().await.get("threads"), Some(&Bson::Null));
    let (status, body) = dci.post(&path, json!({"sort": "fifo", "threads": 2})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    let doc = stored().await;
    assert_eq!(
        (doc.get_str("sort").ok(), doc.get("threads")),
        (Some("fifo"), Some(&Bson::Int64(2)))
    );
    let (_, listed) = dci.get("/queues/new").await;
    assert_eq!(
        (listed["sort"].clone(), listed["threads"].clone()),
        (json!("fifo"), json!(2))
    );

    let cases = [
        (json!({}), error("no params")),
        (
            json!({"colour": "red"}),
            json!({"error": "unknown param", "param": "colour"}),
        ),
        (
            json!({"plugin": "Nope"}),
            json!({"error": "unknown plugin", "plugin": "Nope"}),
        ),
        (
            json!({"threads": -1}),
            error("threads must be a non-negative integer"),
        ),
        (
            json!({"threads": "x"}),
            error("threads must be a non-negative integer"),
        ),
        (json!({"name": ""}), error("name must be a string")),
        (json!({"name": 5}), error("name must be a string")),
        (
            json!({"sort": "backwards"}),
            error("sort must be fifo, lifo, default or priority"),
        ),
    ];
    for (input, expected) in cases {
        let (status, body) = dci.post("/queues/new", input.clone()).await;
        assert_eq!((status, body), (400, expected), "POST /queues/new {input}");
    }
    let doc = stored().await;
    assert_eq!(
        (
            doc.get_str("name").ok(),
            doc.get_str("plugin").ok(),
            doc.get("threads")
        ),
        (
            Some("new"),
            Some("Disbatch::Plugin::Demo"),
            Some(&Bson::Int64(2))
        ),
        "errors change nothing"
    );

    let (status, body) = dci.post("/queues/nosuch", json!({"threads": 1})).await;
    assert_eq!((status, body), (404, error("no queue nosuch")));

    let (status, body) = dci.post("/queues/new", json!({"name": "taken"})).await;
    // Issue 51: the taken name in words, not the server's E11000 line.
    assert_eq!(
        (status, body),
        (400, json!({"error": "a queue named taken already exists"}))
    );
    assert_eq!(stored().await.get_str("name").ok(), Some("new"));
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn deleting_a_queue_keeps_its_tasks() {
    let db = TestDb::new("api_queues_delete").await;
    let config = write_config(&db, "web.json", json!({}));
    let first = db.insert_queue("first", "echo", 0).await;
    let second = db.insert_queue("second", "echo", 0).await;
    db.insert_tasks(first, vec![doc! {"a": 1}.into(), doc! {"a": 2}.into()])
        .await;
    let dci = Dci::start(&config);
    let deleted = json!({"MongoDB::DeleteResult": {"acknowledged": 1, "deleted_count": 1,
                        "write_errors": [], "write_concern_errors": []}});

    let (status, body) = dci.send(Method::DELETE, "/queues/first", json!({})).await;
    assert_eq!((status, body), (200, deleted.clone()));
    assert!(queue_doc(&db, "first").await.is_none());
    assert_eq!(db.count(doc! {"queue": first}).await, 2, "tasks are kept");
    let (status, body) = dci.send(Method::DELETE, "/queues/first", json!({})).await;
    assert_eq!((status, body), (404, error("no queue first")));

    let path = format!("/queues/{}", second.to_hex());
    let (status, body) = dci.send(Method::DELETE, &path, json!({})).await;
    assert_eq!((status, body), (200, deleted));
    let (status, body) = dci.get("/queues").await;
    assert_eq!((status, body), (200, json!([])));
    drop(dci);
    db.drop().await;
}

/// Invisible characters (a zero-width space, a BOM, a no-break space) cannot make a queue
/// name that looks like another, on create or on rename; a queue already stored with one
/// stays readable and deletable.
#[tokio::test]
async fn queue_names_with_invisible_characters_are_refused_but_stored_ones_stay_usable() {
    let db = TestDb::new("api_queues_invisible").await;
    let config = write_config(&db, "web.json", json!({}));
    db.insert_queue("demo", "echo", 0).await;
    let stored = db.insert_queue("old\u{200b}", "echo", 0).await;
    let dci = Dci::start(&config);
    for (name, code) in [
        ("demo\u{200b}", "U+200B"),
        ("\u{feff}demo", "U+FEFF"),
        ("de\u{a0}mo", "U+00A0"),
        ("demo\u{2060}", "U+2060"),
        ("\u{2800}", "U+2800"),
    ] {
        let (status, body) = dci
            .post("/queues", json!({"name": name, "plugin": "echo"}))
            .await;
        assert_eq!(status, 400, "{name:?}: {body}");
        assert!(
            body["error"].as_str().is_some_and(
                |e| e.contains(code) && e.contains("invisible characters are not allowed")
            ),
            "{name:?}: {body}"
        );
        let (status, body) = dci.post("/queues/demo", json!({"name": name})).await;
        assert_eq!(status, 400, "rename to {name:?}: {body}");
    }
    let (status, list) = dci.get("/queues").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = list
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|q| q["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "nothing was created: {names:?}");
    let path = format!("/queues/{}", stored.to_hex());
    let (status, body) = dci.get(&path).await;
    assert_eq!(
        (status, &body["name"]),
        (200, &json!("old\u{200b}")),
        "{body}"
    );
    let (status, body) = dci.send(Method::DELETE, &path, json!({})).await;
    assert_eq!(
        status, 200,
        "a stored odd name can still be deleted: {body}"
    );
    drop(dci);
    db.drop().await;
}
