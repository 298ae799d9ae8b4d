//! Batches on real DENs: the callback is released exactly once even when the last two members
//! end at the same moment on two nodes; its params carry the outcome; a batch is listed,
//! watched and cancelled as a whole.

use std::collections::HashSet;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{read_lines, wait_for, write_config, Dci, Den, TestDb, NOT_ENDED};
use serde_json::{json, Value};

fn oid(v: &Value) -> ObjectId {
    ObjectId::parse_str(v.as_str().expect("a hex id")).expect("object id")
}

/// Gives each node room for one task at a time, and waits until each has read it back.
async fn one_task_per_node(dci: &Dci, dens: &[&Den]) {
    for den in dens {
        let (s, out) = dci
            .post(&format!("/nodes/{}", den.node), json!({"maxthreads": 1}))
            .await;
        assert_eq!(s, 200, "{out}");
    }
    for den in dens {
        let seen = den.passes().await;
        wait_for(
            "two passes after maxthreads",
            Duration::from_secs(60),
            || async { den.passes().await >= seen + 2.0 },
        )
        .await;
    }
}

#[tokio::test]
async fn a_batch_callback_runs_exactly_once_when_its_last_two_members_end_together_on_two_dens() {
    let db = TestDb::new("batch_once").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("members", "echo", 2).await;
    db.insert_queue("cb", "echo", 2).await;
    let dci = Dci::start(&config);
    let dens = [Den::start(&config, "n1"), Den::start(&config, "n2")];
    one_task_per_node(&dci, &dens.iter().collect::<Vec<_>>()).await;
    let callbacks_ran = db.path("callbacks.txt");
    let mut callbacks = Vec::new();
    for rep in 0..20 {
        let gate = db.path(&format!("gate{rep}"));
        let started = db.path(&format!("started{rep}.txt"));
        let member = json!({"queue": "members", "params": {
            "hold_until": gate.to_string_lossy(), "append_to": started.to_string_lossy()}});
        let (s, out) = dci
            .post(
                "/batches",
                json!({"tasks": [member, member], "callback": {"queue": "cb",
                    "params": {"rep": rep, "append_to": callbacks_ran.to_string_lossy()}}}),
            )
            .await;
        assert_eq!(s, 200, "{out}");
        let members: Vec<ObjectId> = out["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(oid)
            .collect();
        let callback = oid(&out["callback"]);
        wait_for("both members to run", Duration::from_secs(60), || async {
            read_lines(&started).len() == 2
        })
        .await;
        let mut nodes = HashSet::new();
        for m in &members {
            nodes.insert(db.task(*m).await.get_str("node").expect("node").to_string());
        }
        assert_eq!(
            nodes.len(),
            2,
            "rep {rep}: the last two members run on two nodes"
        );
        assert_eq!(
            db.task_status(callback).await,
            Some(status::BLOCKED),
            "rep {rep}: waiting"
        );
        // Both end together: one gate.
        std::fs::write(&gate, "").expect("open the gate");
        wait_for("the callback to end", Duration::from_secs(60), || async {
            db.task_status(callback).await == Some(status::SUCCEEDED)
        })
        .await;
        callbacks.push(callback);
    }
    let ran = read_lines(&callbacks_ran);
    assert_eq!(ran.len(), 20, "one callback run per batch: {ran:?}");
    let distinct: HashSet<&String> = ran.iter().collect();
    assert_eq!(distinct.len(), 20);
    for c in &callbacks {
        assert_eq!(db.attempts(*c).await.len(), 1, "callback {c} started once");
        let task = db.task(*c).await;
        let outcome = task
            .get_document("params")
            .and_then(|p| p.get_document("batch"))
            .expect("outcome");
        assert_eq!(outcome.get_i64("succeeded"), Ok(2), "{outcome}");
        assert_eq!(outcome.get_i64("failed").unwrap_or(-1), 0, "{outcome}");
    }
    let callback_tasks = db.count(doc! {"batch_callback": {"$exists": true}}).await;
    assert_eq!(callback_tasks, 20);
    drop(dens);
}

#[tokio::test]
async fn a_callback_carries_the_outcome_and_a_batch_is_listed_watched_and_cancelled() {
    let db = TestDb::new("batch_whole").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("b", "echo", 4).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let batch = check_a_callback_carries_the_outcome(&db, &dci).await;

    check_a_held_batch_is_listed_watched_and_cancelled_whole(&db, &dci, &batch).await;
    for bad in [
        json!({"tasks": []}),
        json!({"tasks": [{"queue": "nope"}]}),
        json!({"tasks": [{"queue": "b"}], "callback": {"queue": "b", "x": 1}}),
    ] {
        let (s, out) = dci.post("/batches", bad.clone()).await;
        assert_eq!(s, 400, "{bad}: {out}");
    }
    let stored = db
        .db
        .collection::<Document>("batches")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(stored, 2, "refused batches store nothing");
    drop(den);
}

async fn check_a_callback_carries_the_outcome(db: &TestDb, dci: &Dci) -> String {
    // Two succeed, one fails: the callback runs anyway, with the counts.
    let (s, out) = dci
        .post(
            "/batches",
            json!({"tasks": [{"queue": "b", "params": {"n": 1}}, {"queue": "b", "params": {"n": 2}},
                             {"queue": "b", "params": {"exit_code": 3}}],
                   "callback": {"queue": "b", "params": {"report": true}}}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let batch = out["batch"].as_str().expect("batch").to_string();
    let callback = oid(&out["callback"]);
    wait_for("the callback to end", Duration::from_secs(60), || async {
        db.task_status(callback).await == Some(status::SUCCEEDED)
    })
    .await;
    let params = db
        .task(callback)
        .await
        .get_document("params")
        .expect("params")
        .clone();
    let outcome = params.get_document("batch").expect("outcome");
    assert_eq!(
        outcome.get_str("id").ok(),
        None,
        "the id is an ObjectId: {outcome}"
    );
    assert_eq!(
        outcome.get_object_id("id").map(|i| i.to_hex()),
        Ok(batch.clone())
    );
    assert_eq!(outcome.get_i64("size"), Ok(3), "{outcome}");
    assert_eq!(outcome.get_i64("succeeded"), Ok(2), "{outcome}");
    assert_eq!(outcome.get_i64("failed"), Ok(1), "{outcome}");
    assert_eq!(
        params.get_bool("report"),
        Ok(true),
        "its own params are kept"
    );
    let (s, view) = dci.get(&format!("/batches/{batch}")).await;
    assert_eq!(s, 200, "{view}");
    assert_eq!(view["state"], "failed", "{view}");
    assert_eq!(view["counts"]["succeeded"], 2, "{view}");
    assert_eq!(view["callback"]["state"], "succeeded", "{view}");
    assert!(view["done"].is_string(), "{view}");
    batch
}

async fn check_a_held_batch_is_listed_watched_and_cancelled_whole(
    db: &TestDb,
    dci: &Dci,
    batch: &str,
) {
    // A batch held at a gate: listed, watched, then cancelled whole.
    let gate = db.path("never");
    let started = db.path("started.txt");
    let held = json!({"queue": "b", "params": {"hold_until": gate.to_string_lossy(), "append_to": started.to_string_lossy()}});
    let (s, out) = dci
        .post(
            "/batches",
            json!({"tasks": [held, held, held, held, held, held], "callback": {"queue": "b"}}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let held_batch = out["batch"].as_str().expect("batch").to_string();
    let held_callback = oid(&out["callback"]);
    let members: Vec<ObjectId> = out["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(oid)
        .collect();
    wait_for("members to run", Duration::from_secs(60), || async {
        !read_lines(&started).is_empty()
    })
    .await;
    let (s, list) = dci.get("/batches").await;
    assert_eq!(s, 200, "{list}");
    let listed: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|b| b["id"].as_str())
        .collect();
    assert_eq!(listed, vec![held_batch.as_str(), batch], "newest first");
    let (s, view) = dci.get(&format!("/batches/{held_batch}")).await;
    assert_eq!(s, 200);
    assert_eq!(view["state"], "active", "{view}");
    assert_eq!(view["callback"]["state"], "blocked", "{view}");
    let (s, cancelled) = dci
        .post(&format!("/batches/{held_batch}/cancel"), json!({}))
        .await;
    assert_eq!(s, 200, "{cancelled}");
    let all: Vec<ObjectId> = members.iter().copied().chain([held_callback]).collect();
    let live = doc! {"_id": {"$in": all}, "status": {"$in": NOT_ENDED.to_vec()}};
    wait_for("the batch to end", Duration::from_secs(60), || async {
        db.count(live.clone()).await == 0
    })
    .await;
    assert_eq!(
        db.task_status(held_callback).await,
        Some(status::CANCELLED),
        "the callback is cancelled"
    );
    assert!(db.attempts(held_callback).await.is_empty(), "and never ran");
    let (s, view) = dci.get(&format!("/batches/{held_batch}")).await;
    assert_eq!(s, 200);
    assert_eq!(view["state"], "cancelled", "{view}");
    assert!(view["cancelled"].is_string(), "{view}");
    let (s, _) = dci
        .post(
            &format!("/batches/{}/cancel", ObjectId::new().to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(s, 404);
}

/// Peak resident memory (VmHWM) of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    disbatch_tests::bench::procfs::peak_rss_kib(pid).expect("VmHWM") / 1024
}

/// Grows a task's params by hand (as ops might) until its document is `room` bytes short of
/// the server's 16 MiB: it is stored, but no write that adds to it can be.
async fn grow_to_the_limit(db: &TestDb, id: ObjectId, room: usize) {
    let tasks = db.db.collection::<Document>("tasks");
    tasks
        .update_one(doc! {"_id": id}, doc! {"$set": {"params.pad": ""}})
        .await
        .expect("pad");
    let raw = db
        .db
        .collection::<bson::RawDocumentBuf>("tasks")
        .find_one(doc! {"_id": id})
        .await
        .expect("read")
        .expect("the task");
    let pad = 16 * 1024 * 1024 - raw.as_bytes().len() - room;
    tasks
        .update_one(
            doc! {"_id": id},
            doc! {"$set": {"params.pad": "x".repeat(pad)}},
        )
        .await
        .expect("grow the task to the limit");
}

/// A batch of one member of `bqp` whose callback on `cbq` has `params`.
fn batch(params: Value) -> Value {
    json!({"tasks": [{"queue": "bqp", "params": {"m": 1}}],
           "callback": {"queue": "cbq", "params": params}})
}

/// One batch whose callback cannot be written never strands another's: a callback too large
/// is refused at creation with its size; one grown by hand past what a release can write is
/// failed, counted and logged while the 20 healthy batches around it complete; a batch whose
/// member was grown so is still cancelled whole; and a callback at the limit runs.
#[tokio::test]
async fn a_callback_too_large_is_refused_or_failed_and_strands_no_other_batch() {
    let db = TestDb::new("batch_big").await;
    let quiet = db.script("quiet.sh", "exit 0");
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"quiet": quiet, "echo": disbatch_tests::echo_plugin()}}),
    );
    let members = db.insert_queue("bqp", "echo", 0).await;
    db.insert_queue("cbq", "quiet", 2).await;
    let dci = Dci::start(&config);
    let mut healthy = Vec::new();
    for k in 0..10 {
        let (s, out) = dci.post("/batches", batch(json!({"healthy": k}))).await;
        assert_eq!(s, 200, "{out}");
        healthy.push(oid(&out["callback"]));
    }
    check_a_callback_too_large_is_refused_whole(&db, &dci).await;
    // Just under the limit: stored, and it runs.
    let (s, out) = dci
        .post(
            "/batches",
            batch(json!({"pad": "x".repeat(15 * 1024 * 1024 - 100)})),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let at_limit = oid(&out["callback"]);
    let peak = peak_rss_mib(dci.pid());
    assert!(peak < 200, "the DCI peaked at {peak} MiB");
    // Grown by hand after creation: no room for the batch's outcome.
    let (s, out) = dci.post("/batches", batch(json!({"grown": true}))).await;
    assert_eq!(s, 200, "{out}");
    let grown = oid(&out["callback"]);
    grow_to_the_limit(&db, grown, 30).await;
    check_a_batch_with_a_grown_member_is_cancelled_whole(&db, &dci).await;
    for k in 10..20 {
        let (s, out) = dci.post("/batches", batch(json!({"healthy": k}))).await;
        assert_eq!(s, 200, "{out}");
        healthy.push(oid(&out["callback"]));
    }
    let den = Den::start(&config, "n1");
    db.set_threads(members, 4).await;
    let mut ran = healthy.clone();
    ran.push(at_limit);
    wait_for(
        "every healthy callback to run",
        Duration::from_secs(120),
        || async {
            for id in &ran {
                if db.task_status(*id).await != Some(status::SUCCEEDED) {
                    return false;
                }
            }
            true
        },
    )
    .await;
    wait_for(
        "the grown callback failed",
        Duration::from_secs(60),
        || async { db.task_status(grown).await == Some(status::FAILED) },
    )
    .await;
    check_the_grown_callback_is_failed_counted_and_logged(&db, &dci, &den, grown).await;
    drop(den);
    drop(dci);
    db.drop().await;
}

async fn check_a_callback_too_large_is_refused_whole(db: &TestDb, dci: &Dci) {
    // Creation refuses it whole, naming the size; nothing of it is stored.
    let (s, out) = dci
        .post("/batches", batch(json!({"pad": "x".repeat(16_776_990)})))
        .await;
    assert_eq!(s, 400, "{out}");
    let error = out["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with(
            "callback.params is 16777005 bytes as BSON; a task's params hold at most 15728640"
        ),
        "{out}"
    );
    assert_eq!(
        db.db
            .collection::<Document>("batches")
            .count_documents(doc! {})
            .await
            .expect("count"),
        10
    );
}

async fn check_a_batch_with_a_grown_member_is_cancelled_whole(db: &TestDb, dci: &Dci) {
    // A member grown so: its batch is still cancelled whole, the member without its reason.
    let (s, out) = dci
        .post("/batches", batch(json!({"cancelled": true})))
        .await;
    assert_eq!(s, 200, "{out}");
    let (doomed, doomed_member) = (oid(&out["batch"]), oid(&out["ids"][0]));
    let doomed_callback = oid(&out["callback"]);
    grow_to_the_limit(db, doomed_member, 30).await;
    let (s, out) = dci
        .post(&format!("/batches/{}/cancel", doomed.to_hex()), json!({}))
        .await;
    assert_eq!((s, &out["cancelled"]), (200, &json!(2)), "{out}");
    assert_eq!(db.task_status(doomed_member).await, Some(status::CANCELLED));
    assert_eq!(
        db.task_status(doomed_callback).await,
        Some(status::CANCELLED)
    );
}

async fn check_the_grown_callback_is_failed_counted_and_logged(
    db: &TestDb,
    dci: &Dci,
    den: &Den,
    grown: ObjectId,
) {
    let task = db.task(grown).await;
    assert!(
        task.get("waiting_on").is_none(),
        "{}",
        task.get_i32("status").unwrap_or(0)
    );
    assert_eq!(
        den.metric("disbatch_den_dependencies_total{how=\"callbacks_failed\"}")
            .await,
        1.0
    );
    assert!(
        den.log_text()
            .contains("too large to carry the batch's outcome"),
        "{}",
        den.log_text()
    );
    let (s, out) = dci
        .get(&format!(
            "/batches/{}",
            task.get_object_id("batch_callback")
                .map(|b| b.to_hex())
                .unwrap_or_default()
        ))
        .await;
    assert_eq!((s, &out["state"]), (200, &json!("failed")), "{out}");
}
