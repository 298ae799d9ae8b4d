//! `disbatch-web` black-box: the legacy task routes (served only when loaded), and the OpenAPI
//! document against the routes actually served.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::api::error;
use disbatch_tests::api_calls::{inserted_ids, raw_json};
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const LEGACY: &str = "Disbatch::Web::Tasks";

#[tokio::test]
async fn legacy_task_routes_answer_only_when_loaded() {
    let db = TestDb::new("api_legacy").await;
    let queue = db.insert_queue("echo", "echo", 0).await;
    db.db
        .collection::<Document>("users")
        .insert_many(vec![
            doc! {"email": "a@example.com", "kind": "x"},
            doc! {"email": "b@example.com", "kind": "x"},
            doc! {"email": "c@example.com", "kind": "y"},
        ])
        .await
        .expect("users");

    check_the_routes_are_absent_when_not_loaded(&db).await;

    let dci = Dci::start(&write_config(
        &db,
        "legacy.json",
        json!({"web_extensions": {LEGACY: {}}}),
    ));
    let first = check_legacy_task_creation_by_name_id_and_collection(&db, &dci, queue).await;

    let file = give_two_tasks_inline_and_gridfs_outputs(&db, &first).await;

    check_the_legacy_search(&db, &dci, queue, &first, file).await;
    drop(dci);
    db.drop().await;
}

async fn check_the_routes_are_absent_when_not_loaded(db: &TestDb) {
    let plain = Dci::start(&write_config(db, "plain.json", json!({})));
    for (path, body) in [
        ("/tasks/search", json!({"filter": {}})),
        ("/tasks/echo", json!([{"a": 1}])),
        (
            "/tasks/echo/users",
            json!({"filter": {}, "params": {"u": "document.email"}}),
        ),
    ] {
        let (status, reply) = plain.post(path, body).await;
        assert_eq!(status, 404, "{path}: {reply}");
        assert!(reply["error"].is_string(), "{path}: {reply}");
    }
    assert_eq!(db.count(doc! {}).await, 0, "nothing created");
    drop(plain);
}

async fn check_legacy_task_creation_by_name_id_and_collection(
    db: &TestDb,
    dci: &Dci,
    queue: ObjectId,
) -> Vec<ObjectId> {
    let (status, body) = dci
        .post(
            "/tasks/echo",
            json!([{"kind": "a", "n": 1}, {"kind": "b", "n": 2}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let first = inserted_ids(&body);
    assert_eq!(first.len(), 2);
    let (status, body) = dci
        .post(
            &format!("/tasks/{}", queue.to_hex()),
            json!([{"kind": "c"}]),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(inserted_ids(&body).len(), 1);
    let (status, body) = dci.post("/tasks/nosuch", json!([{"kind": "c"}])).await;
    assert_eq!((status, body), (400, error("queue not found")));
    let (status, body) = dci.post("/tasks/echo", json!([])).await;
    assert_eq!(
        (status, body),
        (
            400,
            error("'params' must be a JSON array of task params objects")
        )
    );
    let (status, body) = dci
        .post(
            "/tasks/echo/users",
            json!({"filter": {"kind": "x"}, "params": {"u": "document.email", "kind": "from"}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let from = inserted_ids(&body);
    assert_eq!(from.len(), 2);
    let t = db.task(from[0]).await;
    assert!(
        t.get_document("params")
            .expect("params")
            .get_str("u")
            .is_ok_and(|u| u.ends_with("@example.com")),
        "{t}"
    );
    let total = db.count(doc! {}).await;
    assert_eq!(total, 5);
    first
}

async fn give_two_tasks_inline_and_gridfs_outputs(db: &TestDb, first: &[ObjectId]) -> ObjectId {
    // Outputs for the search: inline text on one task, GridFS on another.
    db.tasks()
        .update_one(
            doc! {"_id": first[0]},
            doc! {"$set": {"status": 1, "stdout": "inline out", "stderr": ""}},
        )
        .await
        .expect("set");
    let file = ObjectId::new();
    db.db
        .collection::<Document>("tasks.chunks")
        .insert_one(doc! {"files_id": file, "n": 0, "data": "grid out"})
        .await
        .expect("chunk");
    db.db
        .collection::<Document>("tasks.files")
        .insert_one(
            doc! {"_id": file, "length": 8_i64, "chunkSize": 261120, "filename": "stdout",
            "uploadDate": DateTime::now(), "metadata": {"task_id": first[1]}},
        )
        .await
        .expect("file");
    db.tasks()
        .update_one(
            doc! {"_id": first[1]},
            doc! {"$set": {"status": 2, "stdout": file}},
        )
        .await
        .expect("set");
    file
}

async fn check_the_legacy_search(
    db: &TestDb,
    dci: &Dci,
    queue: ObjectId,
    first: &[ObjectId],
    file: ObjectId,
) {
    let search = |body: Value| {
        let dci = &dci;
        async move { dci.post("/tasks/search", body).await }
    };
    let (status, all) = search(json!({"filter": {"queue": "echo"}})).await;
    assert_eq!(status, 200, "{all}");
    let all = all.as_array().expect("array").clone();
    assert_eq!(all.len(), 5);
    let find = |list: &[Value], id: ObjectId| {
        list.iter()
            .find(|t| t["_id"]["$oid"] == id.to_hex())
            .cloned()
            .expect("listed")
    };
    let t0 = find(&all, first[0]);
    assert_eq!(t0["stdout"], "[terse mode]", "terse by default: {t0}");
    assert!(
        t0["ctime"].is_f64() || t0["ctime"].is_i64(),
        "epoch ctime: {t0}"
    );
    assert_eq!(find(&all, first[1])["stdout"]["$oid"], file.to_hex());
    let (_, full) = search(json!({"filter": {"queue": queue.to_hex()}, "terse": false})).await;
    let full = full.as_array().expect("array").clone();
    assert_eq!(find(&full, first[0])["stdout"], "inline out");
    assert_eq!(find(&full, first[1])["stdout"], "grid out");

    let (_, found) = search(json!({"filter": {"params.kind": "b"}})).await;
    assert_eq!(
        found.as_array().map(Vec::len),
        Some(1),
        "non-indexed filters are allowed: {found}"
    );
    assert_eq!(found[0]["_id"]["$oid"], first[1].to_hex());
    let (_, found) = search(json!({"filter": {"_id": {"$oid": first[0].to_hex()}}})).await;
    assert_eq!(found.as_array().map(Vec::len), Some(1), "{found}");
    let ctime = db
        .task(first[0])
        .await
        .get_datetime("ctime")
        .expect("ctime")
        .timestamp_millis();
    let (_, found) = search(json!({"filter": {"ctime": ctime}, "count": true})).await;
    assert_eq!(
        found,
        json!({"count": 2}),
        "millisecond ctime matches the first batch"
    );
    let (status, body) = search(json!({"filter": {"queue": "echo"}, "count": true})).await;
    assert_eq!((status, body), (200, json!({"count": 5})));
    let (status, body) = search(json!({"options": {"limit": 2}})).await;
    assert_eq!(status, 200);
    assert_eq!(body.as_array().map(Vec::len), Some(2), "{body}");

    let (status, body) = search(json!({"options": {"limit": 101}})).await;
    assert_eq!((status, body), (400, error("limit cannot exceed 100")));
    let (status, body) = search(json!({"filter": {"_id": {"$oid": "bad"}}})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Bad OID passed")),
        "{body}"
    );
    for bad in [json!({"filter": "x"}), json!({"options": [1]})] {
        let (status, body) = search(bad.clone()).await;
        assert_eq!(
            (status, body),
            (400, error("filter and options must be name/value objects")),
            "{bad}"
        );
    }
    let (status, body) = search(json!({"filter": {"status": {"$bogus": 1}}})).await;
    assert_eq!(
        status, 400,
        "a filter the server refuses is bad input: {body}"
    );
    assert!(body["error"].is_string(), "{body}");
}

/// Every (path, method) of the OpenAPI document, with its path parameters filled in.
fn documented(doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for method in ops.as_object().expect("operations").keys() {
            out.push((path.clone(), method.to_uppercase()));
        }
    }
    out
}

/// The routes `GET /info` lists, in OpenAPI spelling.
fn listed(info: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (method, paths) in info["routes"].as_object().expect("routes") {
        for p in paths.as_array().expect("paths") {
            let p = p.as_str().expect("path");
            let templated: Vec<String> = p
                .split('/')
                .map(|seg| match seg.strip_prefix(':') {
                    Some(name) => format!("{{{name}}}"),
                    None => seg.to_string(),
                })
                .collect();
            out.push((templated.join("/"), method.clone()));
        }
    }
    out
}

#[tokio::test]
async fn every_documented_route_exists_and_every_listed_route_is_documented() {
    let db = TestDb::new("api_openapi").await;
    let queue = db.insert_queue("q", "echo", 0).await;
    let task = db.insert_tasks(queue, vec![doc! {"a": 1}.into()]).await[0];
    db.insert_node("n0", Duration::ZERO).await;

    for legacy in [false, true] {
        let extra = if legacy {
            json!({"web_extensions": {LEGACY: {}}})
        } else {
            json!({})
        };
        let dci = Dci::start(&write_config(&db, &format!("web-{legacy}.json"), extra));
        let (status, ct, doc) = raw_json(&dci, Method::GET, "/openapi.json", None, "").await;
        assert_eq!((status, ct.as_str()), (200, "application/json"), "{doc}");
        assert!(
            doc["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.0")),
            "{doc}"
        );
        assert!(doc["info"]["title"].is_string(), "{doc}");
        let routes = documented(&doc);
        assert!(routes.len() >= 23, "{routes:?}");
        let (_, info) = dci.get("/info").await;
        let mut from_info = listed(&info);
        let mut from_doc = routes.clone();
        from_info.sort();
        from_doc.sort();
        assert_eq!(
            from_info, from_doc,
            "GET /info and /openapi.json list the same routes (legacy {legacy})"
        );
        let has_legacy = routes
            .iter()
            .any(|(p, m)| p == "/tasks/search" && m == "POST");
        assert_eq!(has_legacy, legacy, "{routes:?}");

        for (path, method) in &routes {
            for param in doc["paths"][path][method.to_lowercase()]["parameters"]
                .as_array()
                .expect("parameters")
            {
                let name = param["name"].as_str().expect("name");
                // A query parameter (`?attempt=`) is not in the path; every other one is.
                if param["in"] == "query" {
                    assert!(
                        !path.contains(&format!("{{{name}}}")),
                        "{method} {path}: {name}"
                    );
                    continue;
                }
                assert_eq!(param["in"], "path", "{method} {path}: {param}");
                assert!(
                    path.contains(&format!("{{{name}}}")),
                    "{method} {path} documents {name}"
                );
            }
            let concrete = path
                .replace("{node}", "n0")
                .replace("{queue}", "q")
                .replace("{id}", &task.to_hex())
                .replace("{collection}", "users");
            let m = Method::from_bytes(method.as_bytes()).expect("method");
            let (status, _, body) =
                raw_json(&dci, m, &concrete, Some("application/json"), "{}").await;
            assert_ne!(status, 405, "{method} {concrete}: {body}");
            assert!(status < 500, "{method} {concrete}: {status} {body}");
            let fallback = body["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("no route for"));
            assert!(
                !fallback,
                "{method} {concrete} is documented but not routed: {body}"
            );
        }
        drop(dci);
        // The DELETE routes removed the queue and the task: put them back for the next round.
        if !legacy {
            db.db
                .collection::<Document>("queues")
                .insert_one(doc! {"_id": queue, "name": "q", "plugin": "echo", "threads": 0})
                .await
                .expect("queue back");
            db.tasks()
                .insert_one(doc! {"_id": task, "queue": queue, "status": -2, "params": {"a": 1}, "node": Bson::Null})
                .await
                .expect("task back");
        }
    }
    db.drop().await;
}
