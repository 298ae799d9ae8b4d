//! `disbatch-web` black-box: creating tasks, searching them, one task, and its output streams.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, DateTime, Document};
use disbatch_tests::api::error;
use disbatch_tests::{write_config, Dci, Den, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const NOT_ARRAY: &str = "'params' must be a JSON array of task params objects";
const EMPTY_OBJECT: &str =
    "'params' must be a JSON array of task params objects with key/value pairs";

fn oid(id: ObjectId) -> Value {
    json!({"$oid": id.to_hex()})
}

/// The ids of an InsertManyResult, after checking its exact shape.
fn inserted(body: &Value) -> Vec<ObjectId> {
    let result = &body["MongoDB::InsertManyResult"];
    assert_eq!(result["acknowledged"], 1, "{body}");
    assert_eq!(result["write_errors"], json!([]), "{body}");
    assert_eq!(result["write_concern_errors"], json!([]), "{body}");
    let items = result["inserted"].as_array().expect("inserted array");
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i, "{body}");
            let hex = item["_id"]["$oid"].as_str().expect("_id $oid");
            ObjectId::parse_str(hex).expect("ObjectId")
        })
        .collect()
}

/// A request with a raw body and content type: (status, content type, body text).
async fn raw(
    dci: &Dci,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut req = dci
        .http
        .request(method, dci.at(path))
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, ct, r.text().await.expect("body"))
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

async fn bytes(dci: &Dci, path: &str) -> (u16, String, Vec<u8>) {
    let r = dci.http.get(dci.at(path)).send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, ct, r.bytes().await.expect("body").to_vec())
}

/// A GridFS file in bucket `tasks` written by hand, chunks inserted in reverse order.
async fn gridfs_file(db: &TestDb, task: ObjectId, name: &str, chunks: Vec<Bson>) -> ObjectId {
    let id = ObjectId::new();
    let length: usize = chunks
        .iter()
        .map(|c| match c {
            Bson::String(s) => s.len(),
            Bson::Binary(b) => b.bytes.len(),
            _ => 0,
        })
        .sum();
    let docs: Vec<Document> = chunks
        .into_iter()
        .enumerate()
        .map(|(n, data)| doc! {"files_id": id, "n": n as i32, "data": data})
        .rev()
        .collect();
    db.db
        .collection::<Document>("tasks.chunks")
        .insert_many(docs)
        .await
        .expect("insert chunks");
    db.db
        .collection::<Document>("tasks.files")
        .insert_one(
            doc! {"_id": id, "filename": name, "length": length as i64, "chunkSize": 4,
            "uploadDate": DateTime::now(), "metadata": {"task_id": task}},
        )
        .await
        .expect("insert file");
    id
}

fn binary(b: &[u8]) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::Generic,
        bytes: b.to_vec(),
    })
}

fn ids_of(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("expected an array: {v}"))
        .iter()
        .map(|t| t["_id"]["$oid"].as_str().expect("_id").to_string())
        .collect();
    ids.sort();
    ids
}

fn hexes(ids: &[ObjectId]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|id| id.to_hex()).collect();
    out.sort();
    out
}

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
    assert_eq!(t.get_i32("status").ok(), Some(-2), "{t}");
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
        assert_eq!(t.get_i32("status").ok(), Some(-2));
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
        (json!({"queue": "echo"}), error("invalid parameters passed")),
        (
            json!({"queue": "echo", "params": {"a": 1}, "extra": 1}),
            error("invalid parameters passed"),
        ),
        (
            json!({"queue": "echo", "params": {"a": 1}, "collection": "users"}),
            error("invalid parameters passed"),
        ),
        (
            json!({"params": {"a": 1}}),
            error("invalid parameters passed"),
        ),
        (json!({}), error("invalid parameters passed")),
        (json!([{"a": 1}]), error("invalid parameters passed")),
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
    drop(dci);
    db.drop().await;
}

/// A queue with tasks in known states: ids by role.
struct Fixture {
    queue: ObjectId,
    empty_queue: ObjectId,
    ids: Vec<ObjectId>,
    gridfs_out: ObjectId,
}

/// Six tasks: 0 queued, 1 succeeded on n1 (inline output), 2 failed on n1, 3 succeeded on n2
/// with GridFS stdout, 4 running on n2, 5 queued with empty stdout.
async fn fixture(db: &TestDb) -> Fixture {
    let queue = db.insert_queue("work", "echo", 0).await;
    let empty_queue = db.insert_queue("idle", "echo", 0).await;
    let ids = db
        .insert_tasks(queue, (0..6).map(|i| doc! {"i": i}.into()).collect())
        .await;
    db.set_task(
        ids[1],
        doc! {"status": 1, "node": "n1", "stdout": "hello\n", "stderr": ""},
    )
    .await;
    db.set_task(
        ids[2],
        doc! {"status": 2, "node": "n1", "stdout": "", "stderr": "boom"},
    )
    .await;
    let gridfs_out = gridfs_file(
        db,
        ids[3],
        "stdout",
        vec![Bson::String("from ".into()), Bson::String("gridfs".into())],
    )
    .await;
    db.set_task(
        ids[3],
        doc! {"status": 1, "node": "n2", "stdout": gridfs_out, "stderr": ""},
    )
    .await;
    db.set_task(ids[4], doc! {"status": 0, "node": "n2"}).await;
    db.set_task(ids[5], doc! {"stdout": ""}).await;
    Fixture {
        queue,
        empty_queue,
        ids,
        gridfs_out,
    }
}

#[tokio::test]
async fn searches_allow_only_indexed_prefixes_and_convert_values() {
    let db = TestDb::new("api_tasks_search").await;
    let config = write_config(&db, "web.json", json!({}));
    let other = db.insert_queue("other", "echo", 0).await;
    let foreign = db.insert_tasks(other, vec![doc! {"x": 1}.into()]).await[0];
    db.set_task(foreign, doc! {"status": 1, "node": "n1"}).await;
    let f = fixture(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let ids = &f.ids;

    let (status, body) = dci.get(&format!("/tasks?queue={q}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(ids));
    let (status, body) = dci.get("/tasks?queue=work").await;
    assert_eq!(status, 200, "a queue name is resolved: {body}");
    assert_eq!(ids_of(&body), hexes(ids));
    let (status, body) = dci.get("/tasks?queue=nosuch").await;
    assert_eq!((status, body), (400, error("queue not found")));

    // Numeric strings become numbers: "1" finds status 1.
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=1")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[3]]));
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=-2")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[0], ids[5]]), "{status}");
    // Repeated keys and arrays become alternatives.
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=2&status=0"))
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[2], ids[4]]), "{status}");
    let (status, body) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, "status": [1, "2"]}),
        )
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[2], ids[3]]), "{status}");
    let (status, body) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"id": [ids[0].to_hex(), oid(ids[4])]}),
        )
        .await;
    assert_eq!(ids_of(&body), hexes(&[ids[0], ids[4]]), "{status}");

    let (status, body) = dci.get("/tasks?node=n1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[2], foreign]));
    let (status, body) = dci.get(&format!("/tasks?node=n2&status=1&queue={q}")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[3]]), "{status}");
    let (status, body) = dci.get(&format!("/tasks?id={}", ids[2].to_hex())).await;
    assert_eq!(ids_of(&body), hexes(&[ids[2]]), "{status}");
    // Empty values are skipped.
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=")).await;
    assert_eq!(ids_of(&body), hexes(ids), "{status}");

    let (status, body) = dci.get("/tasks?status=1").await;
    assert_eq!(status, 400, "{body}");
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["error", "indexes", "invalid_params", "path", "title"],
        "{body}"
    );
    assert_eq!(body["error"], "non-indexed params given");
    assert_eq!(body["path"], "/tasks");
    assert!(body["title"].is_string(), "{body}");
    assert_eq!(body["invalid_params"], json!(["status"]));
    let indexes = body["indexes"].as_array().expect("indexes");
    for set in [
        json!(["id"]),
        json!(["queue", "status"]),
        json!(["node", "status", "queue", "id"]),
    ] {
        assert!(indexes.contains(&set), "{set} in {body}");
    }
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&params.i=1&stdout=x"))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["invalid_params"], json!(["params.i", "stdout"]));
    let (status, body) = dci.get("/tasks?status=1&queue=").await;
    assert_eq!(status, 400, "a blank queue does not unlock status: {body}");

    // Bad ObjectIds are 400, never 500.
    for path in [
        "/tasks?id=nothex".to_string(),
        "/tasks?id=zzzzzzzzzzzzzzzzzzzzzzzz".to_string(),
        format!("/tasks?id={}&id=123", ids[0].to_hex()),
    ] {
        let (status, body) = dci.get(&path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let (status, body) = dci
        .send(Method::GET, "/tasks", json!({"queue": ["nothex"]}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");

    let (status, body) = dci.get("/tasks").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "refusing to return everything - include one or more indexed search restrictions"
    );
    let (status, body) = dci.get("/tasks?.limit=3").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.as_array().map(Vec::len), Some(3), "{body}");
    let (status, body) = dci.get("/tasks?.limit=0").await;
    assert_eq!(status, 400, "limit 0 is no limit: {body}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn search_options_count_page_project_and_render() {
    let db = TestDb::new("api_tasks_options").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let ids = &f.ids;

    let (status, body) = dci.get(&format!("/tasks?queue={q}&.count=1")).await;
    assert_eq!((status, body), (200, json!({"count": 6})));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=1&.count=true"))
        .await;
    assert_eq!((status, body), (200, json!({"count": 2})));
    let (status, body) = dci
        .send(Method::GET, "/tasks", json!({"node": "n2", ".count": 1}))
        .await;
    assert_eq!((status, body), (200, json!({"count": 2})));

    let (_, all) = dci.get(&format!("/tasks?queue={q}")).await;
    let all = all.as_array().expect("array").clone();
    assert_eq!(all.len(), 6);
    let (status, page) = dci.get(&format!("/tasks?queue={q}&.limit=2&.skip=1")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page, Value::Array(all[1..3].to_vec()));
    let (_, rest) = dci.get(&format!("/tasks?queue={q}&.skip=4")).await;
    assert_eq!(rest, Value::Array(all[4..].to_vec()));

    // .limit 1 gives the object itself, as Disbatch did.
    let (status, single) = dci
        .get(&format!("/tasks?id={}&.limit=1", ids[1].to_hex()))
        .await;
    assert_eq!(status, 200, "{single}");
    assert_eq!(single["_id"], oid(ids[1]), "{single}");
    assert_eq!(single["stdout"], "hello\n");

    // Plain rendering: ObjectIds as {"$oid"}, dates as YYYY-MM-DDTHH:MM:SS.
    let (_, one) = dci.get(&format!("/tasks?id={}", ids[3].to_hex())).await;
    let one = &one[0];
    assert_eq!(one["queue"], oid(f.queue));
    assert_eq!(one["stdout"], oid(f.gridfs_out));
    let ctime = one["ctime"].as_str().expect("ctime text");
    assert_eq!(ctime.len(), 19, "{ctime}");
    assert_eq!(&ctime[4..5], "-");
    assert_eq!(&ctime[10..11], "T");
    assert_eq!(&ctime[16..17], ":");
    let t = db.task(ids[3]).await;
    let expected = t
        .get_datetime("ctime")
        .expect("ctime")
        .try_to_rfc3339_string()
        .expect("rfc3339");
    assert_eq!(ctime, &expected[..19]);

    let (_, projected) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, ".fields": {"status": 1, "node": 1}}),
        )
        .await;
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "node", "status"], "{t}");
    }
    let (_, projected) = dci
        .send(
            Method::GET,
            "/tasks",
            json!({"queue": q, ".fields": ["params"]}),
        )
        .await;
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "params"], "{t}");
    }
    let fields = "%5B%22status%22%5D"; // ["status"] as a JSON string in the query
    let (status, projected) = dci.get(&format!("/tasks?queue={q}&.fields={fields}")).await;
    assert_eq!(status, 200, "{projected}");
    for t in projected.as_array().expect("array") {
        let keys: Vec<&String> = t.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["_id", "status"], "{t}");
    }
    let (status, body) = dci.get(&format!("/tasks?queue={q}&.fields=notjson")).await;
    assert_eq!(status, 400, "{body}");

    let by_id = |v: &Value, id: ObjectId| -> Value {
        v.as_array()
            .expect("array")
            .iter()
            .find(|t| t["_id"] == oid(id))
            .cloned()
            .expect("task present")
    };
    let (_, terse) = dci.get(&format!("/tasks?queue={q}&.terse=1")).await;
    assert_eq!(by_id(&terse, ids[1])["stdout"], "[terse mode]");
    assert_eq!(by_id(&terse, ids[1])["stderr"], "", "empty strings stay");
    assert_eq!(by_id(&terse, ids[2])["stderr"], "[terse mode]");
    assert_eq!(
        by_id(&terse, ids[3])["stdout"],
        oid(f.gridfs_out),
        "ids stay"
    );
    assert_eq!(by_id(&terse, ids[0])["stdout"], Value::Null, "null stays");

    let (_, full) = dci.get(&format!("/tasks?queue={q}&.full=1")).await;
    assert_eq!(by_id(&full, ids[3])["stdout"], "from gridfs");
    assert_eq!(by_id(&full, ids[1])["stdout"], "hello\n");

    let (_, epoch) = dci.get(&format!("/tasks?queue={q}&.epoch=1")).await;
    let task = by_id(&epoch, ids[1]);
    let ctime = task["ctime"].as_f64().expect("float ctime");
    let stored = db
        .task(ids[1])
        .await
        .get_datetime("ctime")
        .expect("ctime")
        .timestamp_millis();
    assert!(
        (ctime - stored as f64 / 1000.0).abs() < 0.0015,
        "{ctime} vs {stored}"
    );
    assert!(task["mtime"].is_f64(), "{task}");

    let (status, _, text) = raw(
        &dci,
        Method::GET,
        &format!("/tasks?queue={q}&.pretty=1"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains("\n  "), "pretty output is indented: {text}");
    assert_eq!(ids_of(&parse(&text)), hexes(ids));
    let (_, ct, text) = raw(&dci, Method::GET, &format!("/tasks?queue={q}"), &[], "").await;
    assert!(!text.contains('\n'), "compact by default");
    assert_eq!(ct, "application/json");

    // No match is an empty array.
    let (status, body) = dci
        .get(&format!("/tasks?queue={}", f.empty_queue.to_hex()))
        .await;
    assert_eq!((status, body), (200, json!([])));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=3&.limit=1"))
        .await;
    assert_eq!((status, body), (200, json!([])));
    let (status, body) = dci
        .get(&format!("/tasks?queue={q}&status=3&.count=1"))
        .await;
    assert_eq!((status, body), (200, json!({"count": 0})));

    for bad in [".limit=-1", ".limit=x", ".skip=-3", ".nosuch=1"] {
        let (status, body) = dci.get(&format!("/tasks?queue={q}&{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body["error"].is_string(), "{bad}: {body}");
    }
    drop(dci);

    // Disbatch's `{}` for no match, when the config asks for it.
    let config = write_config(
        &db,
        "web-compat.json",
        json!({"web": {"empty_tasks_object": true}}),
    );
    let dci = Dci::start(&config);
    let (status, body) = dci
        .get(&format!("/tasks?queue={}", f.empty_queue.to_hex()))
        .await;
    assert_eq!((status, body), (200, json!({})));
    let (status, body) = dci.get(&format!("/tasks?queue={q}&status=1")).await;
    assert_eq!(ids_of(&body), hexes(&[ids[1], ids[3]]), "{status}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn search_parameters_come_from_json_bodies_forms_or_the_query() {
    let db = TestDb::new("api_tasks_inputs").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);
    let q = f.queue.to_hex();
    let count = json!({"count": 2});

    let body = json!({"queue": q, "status": "1", ".count": 1}).to_string();
    for ct in [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
    ] {
        let (status, _, text) =
            raw(&dci, Method::GET, "/tasks", &[("content-type", ct)], &body).await;
        assert_eq!(
            (status, parse(&text)),
            (200, count.clone()),
            "GET with a {ct} body"
        );
    }
    let form = format!("queue={q}&status=1&.count=1");
    let (status, _, text) = raw(
        &dci,
        Method::GET,
        "/tasks",
        &[("content-type", "application/x-www-form-urlencoded")],
        &form,
    )
    .await;
    assert_eq!((status, parse(&text)), (200, count.clone()), "form body");
    let (status, _, text) = raw(&dci, Method::GET, &format!("/tasks?{form}"), &[], "").await;
    assert_eq!((status, parse(&text)), (200, count.clone()), "query string");
    // A body of another type is ignored in favour of the query string.
    let (status, _, text) = raw(
        &dci,
        Method::GET,
        &format!("/tasks?{form}"),
        &[("content-type", "text/plain")],
        "queue=nonsense",
    )
    .await;
    assert_eq!(
        (status, parse(&text)),
        (200, count),
        "text/plain body ignored"
    );

    let (status, _, text) = raw(
        &dci,
        Method::GET,
        "/tasks",
        &[("content-type", "application/json")],
        "{\"queue\": ",
    )
    .await;
    assert_eq!(status, 400, "{text}");
    let body = parse(&text);
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("invalid JSON body")),
        "{body}"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn one_task_is_pretty_json_or_html_and_unknown_ids_are_404() {
    let db = TestDb::new("api_task_one").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
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
    assert_eq!(task["status"], 1);
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

#[tokio::test]
async fn output_streams_come_from_inline_text_and_gridfs_string_or_binary_chunks() {
    let db = TestDb::new("api_task_output").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("q", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"a": 1}.into(),
                doc! {"a": 2}.into(),
                doc! {"a": 3}.into(),
            ],
        )
        .await;
    db.set_task(
        ids[0],
        doc! {"status": 1, "stdout": "line one\nline two\n", "stderr": "warn é\n"},
    )
    .await;
    let raw_bytes: Vec<u8> = b"bin\x00ary\xff\xfe"
        .iter()
        .copied()
        .chain((0..=255u8).cycle().take(3000))
        .collect();
    let pieces: Vec<Bson> = raw_bytes.chunks(1000).map(binary).collect();
    let bin_file = gridfs_file(&db, ids[1], "stdout", pieces).await;
    let text_file = gridfs_file(
        &db,
        ids[1],
        "stderr",
        vec![
            Bson::String("part 1, ".into()),
            Bson::String("part 2".into()),
        ],
    )
    .await;
    db.set_task(
        ids[1],
        doc! {"status": 2, "stdout": bin_file, "stderr": text_file},
    )
    .await;
    let dci = Dci::start(&config);
    let text_plain = "text/plain; charset=utf-8";

    let path = |id: ObjectId, s: &str| format!("/tasks/{}/{s}", id.to_hex());
    assert_eq!(
        bytes(&dci, &path(ids[0], "stdout")).await,
        (
            200,
            text_plain.to_string(),
            b"line one\nline two\n".to_vec()
        )
    );
    assert_eq!(
        bytes(&dci, &path(ids[0], "stderr")).await,
        (200, text_plain.to_string(), "warn é\n".as_bytes().to_vec())
    );
    assert_eq!(
        bytes(&dci, &path(ids[1], "stdout")).await,
        (200, text_plain.to_string(), raw_bytes)
    );
    assert_eq!(
        bytes(&dci, &path(ids[1], "stderr")).await,
        (200, text_plain.to_string(), b"part 1, part 2".to_vec())
    );
    // Null output is empty.
    assert_eq!(
        bytes(&dci, &path(ids[2], "stdout")).await,
        (200, text_plain.to_string(), Vec::new())
    );

    let unknown = ObjectId::new();
    let (status, body) = dci.get(&path(unknown, "stdout")).await;
    assert_eq!(
        (status, body),
        (404, error(&format!("no task with id {}", unknown.to_hex())))
    );
    let (status, body) = dci.get(&path(unknown, "stderr")).await;
    assert_eq!(status, 404, "{body}");
    let (status, body) = dci.get("/tasks/nothex/stdout").await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");

    // .full reads binary chunks too.
    let (status, full) = dci
        .get(&format!("/tasks?id={}&.full=1&.limit=1", ids[1].to_hex()))
        .await;
    assert_eq!(status, 200, "{full}");
    assert_eq!(full["stderr"], "part 1, part 2");
    assert!(
        full["stdout"]
            .as_str()
            .is_some_and(|s| s.starts_with("bin\u{0}ary")),
        "{full}"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_real_tasks_gridfs_output_streams_byte_for_byte() {
    let db = TestDb::new("api_task_gridfs").await;
    let config = write_config(&db, "node.json", json!({"gfs": true}));
    db.insert_queue("demo", "Disbatch::Plugin::Demo", 1).await;
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "demo", "params": {"commands": "a1bA"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let id = inserted(&body)[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let task = db.task(id).await;
    let (Some(Bson::ObjectId(out)), Some(Bson::ObjectId(err))) =
        (task.get("stdout"), task.get("stderr"))
    else {
        panic!("gfs: true puts output in GridFS: {task}");
    };
    let mib = 1024 * 1024;
    let mut want_out = b"This is command 'a' for apple.\n".to_vec();
    want_out.extend(std::iter::repeat_n(b'1', mib));
    let mut want_err =
        b"This is command 'b' for banana: an error that does not fail the task.\n".to_vec();
    want_err.extend(std::iter::repeat_n(b'A', mib));

    let (status, ct, got) = bytes(&dci, &format!("/tasks/{}/stdout", id.to_hex())).await;
    assert_eq!((status, ct.as_str()), (200, "text/plain; charset=utf-8"));
    assert!(
        got == want_out,
        "stdout differs: {} bytes, want {}",
        got.len(),
        want_out.len()
    );
    let (status, _, got) = bytes(&dci, &format!("/tasks/{}/stderr", id.to_hex())).await;
    assert_eq!(status, 200);
    assert!(
        got == want_err,
        "stderr differs: {} bytes, want {}",
        got.len(),
        want_err.len()
    );

    let (_, plain) = dci.get(&format!("/tasks/{}", id.to_hex())).await;
    assert_eq!(
        (plain["stdout"].clone(), plain["stderr"].clone()),
        (oid(*out), oid(*err))
    );
    let (_, full) = dci
        .get(&format!("/tasks?id={}&.full=1&.limit=1", id.to_hex()))
        .await;
    assert!(
        full["stdout"].as_str().map(str::as_bytes) == Some(&want_out[..]),
        "full stdout"
    );
    assert!(
        full["stderr"].as_str().map(str::as_bytes) == Some(&want_err[..]),
        "full stderr"
    );
    drop(den);
    drop(dci);
    db.drop().await;
}
