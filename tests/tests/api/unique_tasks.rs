//! Unique tasks (`unique` on a queue) through a real `disbatch-web`: the unique index decides
//! between concurrent creators, and replies name the task each input stands for.

use std::collections::HashSet;
use std::sync::Arc;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

/// The id a reply entry (`{"_id": {"$oid": …}}`) or an `id` field names.
fn id_of(v: &Value) -> ObjectId {
    let hex = v["$oid"].as_str().or(v["_id"]["$oid"].as_str());
    ObjectId::parse_str(hex.unwrap_or_default()).unwrap_or_else(|_| panic!("no id in {v}"))
}

/// (index, id) of each entry of a reply's list.
fn indexed(reply: &Value, list: &str) -> Vec<(u64, ObjectId)> {
    let entries = match reply.pointer(list) {
        Some(Value::Array(a)) => a.clone(),
        _ => panic!("no {list} in {reply}"),
    };
    entries
        .iter()
        .map(|e| (e["index"].as_u64().unwrap_or(u64::MAX), id_of(e)))
        .collect()
}

fn inserted(reply: &Value) -> Vec<(u64, ObjectId)> {
    indexed(reply, "/MongoDB::InsertManyResult/inserted")
}

async fn unique_queue(db: &TestDb, name: &str, unique: Document) -> ObjectId {
    let queue = db.insert_queue(name, "echo", 0).await;
    db.set_queue(queue, doc! {"unique": unique}).await;
    queue
}

async fn start(db: &TestDb) -> Dci {
    let config = write_config(db, "web.json", json!({}));
    Dci::start(&config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_creators_get_one_task() {
    let db = TestDb::new("unique_sixteen").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let dci = Arc::new(start(&db).await);
    let mut clients = Vec::new();
    for n in 0..16 {
        let dci = dci.clone();
        clients.push(tokio::spawn(async move {
            let body = json!({"queue": "sync", "params": {"id": "acct-7", "client": n}});
            dci.post("/tasks", body).await
        }));
    }
    let mut ids = HashSet::new();
    let mut duplicates = 0;
    for c in clients {
        let (status, reply) = c.await.expect("client");
        assert_eq!(status, 200, "{reply}");
        ids.insert(id_of(&reply["id"]));
        match reply["duplicate"].as_bool() {
            Some(true) => {
                duplicates += 1;
                assert!(inserted(&reply).is_empty(), "{reply}");
                assert_eq!(reply["counts"], json!({"created": 0, "duplicates": 1}));
                assert_eq!(indexed(&reply, "/duplicates"), [(0, id_of(&reply["id"]))]);
            }
            Some(false) => assert_eq!(inserted(&reply), [(0, id_of(&reply["id"]))]),
            None => panic!("no duplicate flag: {reply}"),
        }
    }
    assert_eq!(duplicates, 15);
    assert_eq!(ids.len(), 1, "every reply names the one task: {ids:?}");
    let stored = db.tasks().find(doc! {"queue": queue}).await.expect("find");
    let stored: Vec<Document> = futures::TryStreamExt::try_collect(stored)
        .await
        .expect("read");
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].get_object_id("_id").ok(), ids.into_iter().next());
    assert_eq!(stored[0].get_str("unique_key"), Ok("acct-7"));
}

#[tokio::test]
async fn a_bulk_create_of_1000_with_100_duplicates_creates_900() {
    let db = TestDb::new("unique_bulk").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let dci = start(&db).await;
    // 50 tasks exist before the bulk create; the bulk repeats their keys and 50 of its own.
    let existing: Vec<Value> = (0..50).map(|i| json!({"id": format!("old-{i}")})).collect();
    let (s, reply) = dci
        .post("/tasks", json!({"queue": "sync", "params": existing}))
        .await;
    assert_eq!(s, 200, "{reply}");
    let old: Vec<ObjectId> = inserted(&reply).into_iter().map(|(_, id)| id).collect();
    assert_eq!(old.len(), 50);
    let mut params: Vec<Value> = (0..900)
        .map(|i| json!({"id": format!("new-{i}")}))
        .collect();
    let mut expected = Vec::new();
    for i in 0..50 {
        // Spread through the list: an old key, then a repeat of a key earlier in this list.
        let at = 100 + i * 17;
        params.insert(at, json!({"id": format!("old-{i}")}));
        expected.push((at, Err(i)));
    }
    for i in 0..50 {
        params.push(json!({"id": format!("new-{}", i * 3)}));
        expected.push((params.len() - 1, Ok(i * 3)));
    }
    assert_eq!(params.len(), 1000);
    let (s, reply) = dci
        .post("/tasks", json!({"queue": "sync", "params": params.clone()}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(reply["counts"], json!({"created": 900, "duplicates": 100}));
    assert!(
        reply.get("duplicate").is_none(),
        "a bulk reply has no single flag"
    );
    let new = inserted(&reply);
    assert_eq!(new.len(), 900);
    let by_key: std::collections::HashMap<String, ObjectId> = new
        .iter()
        .map(|(i, id)| {
            (
                params[*i as usize]["id"].as_str().unwrap_or("").to_string(),
                *id,
            )
        })
        .collect();
    assert_eq!(by_key.len(), 900, "every new task has its own key");
    let dups = indexed(&reply, "/duplicates");
    assert_eq!(dups.len(), 100);
    expected.sort_by_key(|(at, _)| *at);
    for ((index, id), (at, of)) in dups.iter().zip(&expected) {
        assert_eq!(*index as usize, *at);
        let want = match of {
            Err(old_i) => old[*old_i],
            Ok(new_i) => by_key[&format!("new-{new_i}")],
        };
        assert_eq!(*id, want, "input {at}");
    }
    assert_eq!(db.count(doc! {"queue": queue}).await, 950);
    assert_eq!(
        db.count(doc! {"queue": queue, "unique_key": {"$exists": true}})
            .await,
        950
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_bulk_creates_make_one_task_per_key() {
    let db = TestDb::new("unique_bulk_race").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let dci = Arc::new(start(&db).await);
    let mut clients = Vec::new();
    for c in 0..6_u64 {
        let dci = dci.clone();
        // Each client's own order of the same 200 keys, so the clients collide everywhere.
        let params: Vec<Value> = (0..200_u64)
            .map(|i| json!({"id": (i * 7 + c * 31) % 200, "client": c}))
            .collect();
        clients.push(tokio::spawn(async move {
            let reply = dci
                .post("/tasks", json!({"queue": "sync", "params": params.clone()}))
                .await;
            (params, reply)
        }));
    }
    let mut holder_of: std::collections::HashMap<i64, ObjectId> = Default::default();
    let mut created = 0;
    for c in clients {
        let (params, (s, reply)) = c.await.expect("client");
        assert_eq!(s, 200, "{reply}");
        let new = inserted(&reply);
        let dups = indexed(&reply, "/duplicates");
        assert_eq!(new.len() + dups.len(), 200);
        created += new.len();
        for (i, id) in new.into_iter().chain(dups) {
            let key = params[i as usize]["id"].as_i64().unwrap_or(-1);
            let seen = *holder_of.entry(key).or_insert(id);
            assert_eq!(seen, id, "key {key}: two replies name different tasks");
        }
    }
    assert_eq!(created, 200, "one creator made each key's task");
    assert_eq!(holder_of.len(), 200);
    assert_eq!(db.count(doc! {"queue": queue}).await, 200);
}

#[tokio::test]
async fn a_holder_that_left_its_states_blocks_only_within_for_s() {
    let db = TestDb::new("unique_states").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let dci = start(&db).await;
    let create = |id: &str| dci.post("/tasks", json!({"queue": "sync", "params": {"id": id}}));
    let (_, first) = create("a").await;
    let first_id = id_of(&first["id"]);
    assert_eq!(first["duplicate"], json!(false));
    // Running (claimed) still holds; succeeded, as a node records it, does not.
    db.set_task(first_id, doc! {"status": 0, "node": "n1"})
        .await;
    let (_, again) = create("a").await;
    assert_eq!(
        (again["duplicate"].clone(), id_of(&again["id"])),
        (json!(true), first_id)
    );
    db.set_task(first_id, doc! {"status": 1, "complete": true})
        .await;
    let (_, second) = create("a").await;
    assert_eq!(second["duplicate"], json!(false), "{second}");
    let second_id = id_of(&second["id"]);
    assert_ne!(second_id, first_id);
    // The key's line: the new task is its next generation, the old one keeps its place.
    let gen = |d: Document| {
        (
            d.get_str("unique_key").ok().map(str::to_string),
            d.get_i64("unique_gen").ok(),
        )
    };
    assert_eq!(gen(db.task(first_id).await), (Some("a".into()), Some(0)));
    assert_eq!(gen(db.task(second_id).await), (Some("a".into()), Some(1)));

    // With for_s the finished holder blocks until its ctime + for_s (the queue's setting as
    // it is now, changed without a restart).
    db.set_queue(queue, doc! {"unique": {"key": "params.id", "for_s": 3600}})
        .await;
    db.set_task(second_id, doc! {"status": 1}).await;
    let (_, blocked) = create("a").await;
    assert_eq!(
        (blocked["duplicate"].clone(), id_of(&blocked["id"])),
        (json!(true), second_id)
    );
    let long_ago = DateTime::from_millis(DateTime::now().timestamp_millis() - 3_601_000);
    db.set_task(second_id, doc! {"ctime": long_ago}).await;
    let (_, third) = create("a").await;
    assert_eq!(third["duplicate"], json!(false), "{third}");
    assert_eq!(db.count(doc! {"queue": queue}).await, 3);
    assert_eq!(
        gen(db.task(id_of(&third["id"])).await),
        (Some("a".into()), Some(2))
    );

    // Only states named hold: a failed task holds its key when `failed` is listed.
    db.set_queue(
        queue,
        doc! {"unique": {"key": "params.id", "states": ["failed"]}},
    )
    .await;
    let (_, b) = create("b").await;
    let b_id = id_of(&b["id"]);
    let (_, b_again) = create("b").await;
    assert_eq!(
        b_again["duplicate"],
        json!(false),
        "queued does not hold now: {b_again}"
    );
    db.set_task(id_of(&b_again["id"]), doc! {"status": 2}).await;
    let (_, b_third) = create("b").await;
    assert_eq!(id_of(&b_third["id"]), id_of(&b_again["id"]));
    assert_ne!(b_id, id_of(&b_again["id"]));
}

#[tokio::test]
async fn bad_keys_are_refused_and_keyless_tasks_are_free() {
    let db = TestDb::new("unique_bad").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let plain = db.insert_queue("plain", "echo", 0).await;
    let dci = start(&db).await;
    let (s, reply) = dci
        .post("/tasks", json!({"queue": "sync", "params": {"id": [1, 2]}}))
        .await;
    assert_eq!(s, 400);
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("params.id") && error.contains("list"),
        "{reply}"
    );
    let (s, reply) = dci
        .post("/tasks", json!({"queue": "sync", "params": [{"id": 1}, {"id": {"$oid": ObjectId::new().to_hex()}}, {"id": [3]}]}))
        .await;
    assert_eq!(s, 400);
    assert!(
        reply["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("params[2]: "),
        "{reply}"
    );
    assert_eq!(
        db.count(doc! {"queue": queue}).await,
        0,
        "a refused request creates nothing"
    );

    // No value at the path: not constrained, no unique_key.
    let (s, reply) = dci
        .post(
            "/tasks",
            json!({"queue": "sync", "params": [{"other": 1}, {"other": 1}, {"id": null}]}),
        )
        .await;
    assert_eq!(s, 200, "{reply}");
    assert_eq!(reply["counts"], json!({"created": 3, "duplicates": 0}));
    assert_eq!(
        db.count(doc! {"queue": queue, "unique_key": {"$exists": true}})
            .await,
        0
    );

    // Numbers and sub-documents are keys too.
    let (_, reply) = dci
        .post("/tasks", json!({"queue": "sync", "params": [{"id": 5}, {"id": 5}, {"id": {"a": 1}}, {"id": {"a": 1}}]}))
        .await;
    assert_eq!(
        reply["counts"],
        json!({"created": 2, "duplicates": 2}),
        "{reply}"
    );

    // A plain queue's reply is Disbatch's, and repeats are separate tasks.
    let (_, reply) = dci
        .post(
            "/tasks",
            json!({"queue": "plain", "params": [{"id": 1}, {"id": 1}]}),
        )
        .await;
    assert_eq!(reply.as_object().map(|o| o.len()), Some(1), "{reply}");
    assert_eq!(inserted(&reply).len(), 2);
    assert_eq!(db.count(doc! {"queue": plain}).await, 2);

    // Tasks ops insert straight into MongoDB carry no unique_key and are not constrained.
    db.tasks()
        .insert_one(doc! {"queue": queue, "status": -2, "params": {"id": "direct"}, "ctime": DateTime::now()})
        .await
        .expect("insert");
    let (_, reply) = dci
        .post(
            "/tasks",
            json!({"queue": "sync", "params": {"id": "direct"}}),
        )
        .await;
    assert_eq!(reply["duplicate"], json!(false), "{reply}");
}

#[tokio::test]
async fn tasks_from_a_collection_report_their_duplicates() {
    let db = TestDb::new("unique_collection").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.user"}).await;
    let dci = start(&db).await;
    db.db
        .collection::<Document>("users")
        .insert_many(vec![
            doc! {"_id": 1, "email": "a@example.com"},
            doc! {"_id": 2, "email": "b@example.com"},
            doc! {"_id": 3, "email": "a@example.com"},
        ])
        .await
        .expect("users");
    let body = json!({"queue": "sync", "collection": "users", "filter": {},
                      "params": {"user": "document.email"}});
    let (s, reply) = dci.post("/tasks", body.clone()).await;
    assert_eq!(s, 200, "{reply}");
    assert_eq!(reply["counts"], json!({"created": 2, "duplicates": 1}));
    let new = inserted(&reply);
    assert_eq!(indexed(&reply, "/duplicates"), [(2, new[0].1)]);
    // Everything matched is a duplicate the second time: a reply, not "Unknown error".
    let (s, reply) = dci.post("/tasks", body).await;
    assert_eq!(s, 200, "{reply}");
    assert_eq!(reply["counts"], json!({"created": 0, "duplicates": 3}));
    assert_eq!(db.count(doc! {"queue": queue}).await, 2);
}

#[tokio::test]
async fn coordinate_units_of_a_unique_queue_report_duplicates() {
    let db = TestDb::new("unique_units").await;
    let queue = unique_queue(&db, "sync", doc! {"key": "params.id"}).await;
    let dci = start(&db).await;
    let units = json!([{"key": "u1", "params": {"id": "x"}}, {"key": "u2", "params": {"id": "x"}},
                       {"key": "u3", "params": {"id": "y"}}, {"key": "u4"}]);
    let (s, out) = dci
        .post("/queues/sync/units", json!({"units": units}))
        .await;
    assert_eq!(s, 200, "{out}");
    let keys = |field: &str| -> Vec<String> {
        out[field]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|u| u["key"].as_str().or(u.as_str()).unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(keys("inserted"), ["u1", "u3", "u4"]);
    assert_eq!(keys("duplicates"), ["u2"]);
    let u1 = db.unit(queue, "u1").await.expect("u1");
    assert_eq!(
        id_of(&out["duplicates"][0]),
        u1.get_object_id("_id").expect("id")
    );
    assert!(
        db.unit(queue, "u2").await.is_none(),
        "a duplicate unit is not added"
    );
    assert!(!db
        .unit(queue, "u4")
        .await
        .expect("u4")
        .contains_key("unique_key"));

    // Re-adding a unit is Coordinate's conflict, not a duplicate; a unit under a new key with
    // a held unique key is a duplicate, whichever on_conflict.
    let again = json!({"units": [{"key": "u1", "params": {"id": "x"}}, {"key": "u5", "params": {"id": "y"}}]});
    let (_, out) = dci.post("/queues/sync/units", again.clone()).await;
    assert_eq!(out["rejected"], json!(["u1"]), "{out}");
    assert_eq!(out["duplicates"][0]["key"], json!("u5"), "{out}");
    let mut update = again;
    update["on_conflict"] = json!("update");
    let (_, out) = dci.post("/queues/sync/units", update).await;
    assert_eq!(
        (out["updated"].clone(), out["duplicates"][0]["key"].clone()),
        (json!(["u1"]), json!("u5")),
        "{out}"
    );

    // Updating a unit to params whose key another task holds leaves it as it was.
    let clash = json!({"on_conflict": "update", "units": [{"key": "u1", "params": {"id": "y"}}]});
    let (_, out) = dci.post("/queues/sync/units", clash).await;
    let u3 = db.unit(queue, "u3").await.expect("u3");
    assert_eq!(
        out["duplicates"],
        json!([{"key": "u1", "_id": {"$oid": u3.get_object_id("_id").expect("id").to_hex()}}]),
        "{out}"
    );
    let u1_now = db.unit(queue, "u1").await.expect("u1");
    assert_eq!(u1_now.get_document("params").ok(), Some(&doc! {"id": "x"}));
    // Once u3 succeeded, u1 may take its key.
    db.set_task(u3.get_object_id("_id").expect("id"), doc! {"status": 1})
        .await;
    let (_, out) = dci
        .post(
            "/queues/sync/units",
            json!({"on_conflict": "update", "units": [{"key": "u1", "params": {"id": "y"}}]}),
        )
        .await;
    assert_eq!(out["updated"], json!(["u1"]), "{out}");
    let u1_now = db.unit(queue, "u1").await.expect("u1");
    // u1 is y's next generation after u3.
    assert_eq!(u1_now.get("unique_key"), Some(&Bson::from("y")));
    assert_eq!(u1_now.get_i64("unique_gen"), Ok(1));
    assert_eq!(
        db.unit(queue, "u3")
            .await
            .expect("u3")
            .get_i64("unique_gen"),
        Ok(0)
    );
    // And "x", which u1 held, is free for another unit.
    let (_, out) = dci
        .post(
            "/queues/sync/units",
            json!({"units": [{"key": "u6", "params": {"id": "x"}}]}),
        )
        .await;
    assert_eq!(keys_of(&out["inserted"]), ["u6"], "{out}");
}

fn keys_of(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|u| u["key"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}
