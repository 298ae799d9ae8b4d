//! Requests and results the API's black-box tests share: raw requests, an InsertManyResult's
//! ids, GridFS files written by hand, and six tasks in known states.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use reqwest::Method;
use serde_json::{json, Value};

use super::{Dci, TestDb};

/// An id as the API writes it (`{"$oid": hex}`).
pub fn oid(id: ObjectId) -> Value {
    json!({"$oid": id.to_hex()})
}

/// The ids of an InsertManyResult, after checking its exact shape.
pub fn inserted(body: &Value) -> Vec<ObjectId> {
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
pub async fn raw(
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
    let (status, ct) = (r.status().as_u16(), content_type(&r));
    (status, ct, r.text().await.expect("body"))
}

/// A response's content type, empty when it has none.
pub fn content_type(r: &reqwest::Response) -> String {
    r.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A body that must be JSON.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A GridFS file in bucket `tasks` written by hand, chunks inserted in reverse order.
pub async fn gridfs_file(db: &TestDb, task: ObjectId, name: &str, chunks: Vec<Bson>) -> ObjectId {
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

/// A request with a raw body: (status, content type, body as JSON, or as a string if not JSON).
pub async fn raw_json(
    dci: &Dci,
    method: Method,
    path: &str,
    ct: Option<&str>,
    body: &str,
) -> (u16, String, Value) {
    let headers: Vec<(&str, &str)> = ct.map(|ct| ("content-type", ct)).into_iter().collect();
    let (status, ct, text) = raw(dci, method, path, &headers, body).await;
    (
        status,
        ct,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// The ids of an InsertManyResult, its shape unchecked.
pub fn inserted_ids(body: &Value) -> Vec<ObjectId> {
    body["MongoDB::InsertManyResult"]["inserted"]
        .as_array()
        .unwrap_or_else(|| panic!("not an InsertManyResult: {body}"))
        .iter()
        .map(|i| ObjectId::parse_str(i["_id"]["$oid"].as_str().expect("_id")).expect("oid"))
        .collect()
}

/// A queue with tasks in known states: ids by role.
pub struct SixTasks {
    pub queue: ObjectId,
    pub empty_queue: ObjectId,
    pub ids: Vec<ObjectId>,
    pub gridfs_out: ObjectId,
}

/// Six tasks: 0 queued, 1 succeeded on n1 (inline output), 2 failed on n1, 3 succeeded on n2
/// with GridFS stdout, 4 running on n2, 5 queued with empty stdout.
pub async fn six_tasks(db: &TestDb) -> SixTasks {
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
    SixTasks {
        queue,
        empty_queue,
        ids,
        gridfs_out,
    }
}
