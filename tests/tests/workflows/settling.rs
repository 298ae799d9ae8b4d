//! Settling what waits on an ended task: an end written by hand is found by the leader's
//! sweep, ten thousand dependents are released in one settle, and a task others wait on can't
//! be deleted until its end is settled.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use serde_json::json;

use super::dependencies::oid;

#[tokio::test]
async fn an_end_written_by_hand_is_settled_by_the_leaders_sweep_and_counted() {
    let db = TestDb::new("wf_sweep").await;
    let config = write_config(&db, "node.json", json!({}));
    // Nothing claims from "held": its task ends only by hand, as a Perl node or ops end one.
    db.insert_queue("held", "echo", 0).await;
    db.insert_queue("w", "echo", 2).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let (s, made) = dci
        .post("/tasks", json!({"queue": "held", "params": [{"n": 0}]}))
        .await;
    assert_eq!(s, 200, "{made}");
    let first = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [{"n": 1}, {"n": 2}], "depends_on": [first.to_hex()]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let waiting: Vec<ObjectId> = (0..2)
        .map(|i| oid(&made["MongoDB::InsertManyResult"]["inserted"][i]["_id"]))
        .collect();
    assert_eq!(db.task(first).await.get_bool("has_dependents"), Ok(true));
    let released = "disbatch_den_dependencies_total{how=\"released\"}";
    let before = den.metric(released).await;
    db.set_task(
        first,
        doc! {"status": 1, "complete": true, "mtime": DateTime::now()},
    )
    .await;
    db.wait_complete(&waiting, Duration::from_secs(60)).await;
    wait_for("the release counted", Duration::from_secs(30), || async {
        den.metric(released).await >= before + 2.0
    })
    .await;
    assert!(
        db.task(first).await.get("has_dependents").is_none(),
        "settled: the mark is gone"
    );
    drop(den);
}

#[tokio::test]
async fn ten_thousand_dependents_of_one_task_are_released_in_one_settle() {
    let db = TestDb::new("wf_fanout").await;
    let store = db.den_store().await;
    // Paused: nothing runs, the test ends the dependency itself.
    let queue = db.insert_queue("fan", "echo", 0).await;
    let root = store
        .tasks()
        .create_tasks(queue, vec![doc! {"root": true}])
        .await
        .expect("root")
        .ids[0];
    let waits = disbatch_store::Waits {
        depends_on: vec![root],
        on_failure: None,
    };
    let params: Vec<Document> = (0..10_000).map(|i| doc! {"i": i}).collect();
    let made = store
        .workflows()
        .create_waiting_tasks(queue, params, &waits)
        .await
        .expect("dependents");
    assert_eq!(made.ids.len(), 10_000);
    assert_eq!(db.count(doc! {"queue": queue, "status": -4}).await, 10_000);
    db.set_task(root, doc! {"status": 1, "complete": true})
        .await;
    let settled = store
        .workflows()
        .settle_dependents(&[root])
        .await
        .expect("settle");
    assert_eq!(settled.released, 10_000, "{settled:?}");
    assert_eq!(settled.settled, 1);
    assert_eq!(db.count(doc! {"queue": queue, "status": -2}).await, 10_000);
    assert_eq!(db.count(doc! {"waiting_on": {"$exists": true}}).await, 0);
    // Settling again finds nothing to do: a repeated settle changes nothing.
    let again = store
        .workflows()
        .settle_dependents(&[root])
        .await
        .expect("settle again");
    assert_eq!((again.released, again.cancelled), (0, 0), "{again:?}");
}

/// A task others wait on is never deleted out from under them: the delete is refused with
/// how many wait and what to do instead, until the task has ended and its end is settled. An
/// end written by hand (a Perl node's) is settled by the delete itself.
#[tokio::test]
async fn a_task_others_wait_on_cannot_be_deleted_until_its_end_is_settled() {
    use reqwest::Method;
    let db = TestDb::new("wf_delete").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("w", "echo", 0).await;
    let dci = Dci::start(&config);
    let dependency = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let (s, out) = dci
        .post("/tasks", json!({"queue": "w", "params": [{"x": 1}], "depends_on": [dependency.to_hex()], "answer": "ids"}))
        .await;
    assert_eq!(s, 200, "{out}");
    let dependent = oid(&out["ids"][0]);
    let (s, out) = dci
        .post(
            "/batches",
            json!({"tasks": [{"queue": "w"}], "callback": {"queue": "w"}}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let (member, callback) = (oid(&out["ids"][0]), oid(&out["callback"]));
    for (id, waiting) in [(dependency, 1), (member, 1)] {
        let (s, out) = dci
            .send(
                Method::DELETE,
                &format!("/tasks/{}", id.to_hex()),
                json!({}),
            )
            .await;
        assert_eq!(s, 409, "{out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("{waiting} task(s) wait on it"))
                && error.contains("cancel it instead"),
            "{out}"
        );
        assert!(db.task(id).await.get_i32("status").is_ok(), "still stored");
    }
    assert_eq!(
        db.task(dependent).await.get_i32("status").ok(),
        Some(status::BLOCKED)
    );
    // Cancelled, its dependents are settled by their policy; then it goes.
    for id in [dependency, member] {
        let (s, out) = dci
            .post(&format!("/tasks/{}/cancel", id.to_hex()), json!({}))
            .await;
        assert_eq!(s, 200, "{out}");
    }
    // Settled just after each answer.
    wait_for(
        "the dependents settled",
        Duration::from_secs(60),
        || async {
            db.task(dependent).await.get_i32("status").ok() == Some(status::CANCELLED)
                && db.task(callback).await.get_i32("status").ok() == Some(status::QUEUED)
        },
    )
    .await;
    for id in [dependency, member, dependent] {
        let (s, out) = dci
            .send(
                Method::DELETE,
                &format!("/tasks/{}", id.to_hex()),
                json!({}),
            )
            .await;
        assert_eq!(s, 200, "{}: {out}", id.to_hex());
    }
    // Ended by hand, its end not settled yet: the delete settles it, then deletes it.
    let ended = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let (s, out) = dci
        .post("/tasks", json!({"queue": "w", "params": [{"x": 2}], "depends_on": [ended.to_hex()], "answer": "ids"}))
        .await;
    assert_eq!(s, 200, "{out}");
    let released = oid(&out["ids"][0]);
    db.db
        .collection::<Document>("tasks")
        .update_one(doc! {"_id": ended}, doc! {"$set": {"status": 1}})
        .await
        .expect("end it by hand");
    let (s, out) = dci
        .send(
            Method::DELETE,
            &format!("/tasks/{}", ended.to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    assert_eq!(
        db.task(released).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    drop(dci);
    db.drop().await;
}
