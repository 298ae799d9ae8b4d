//! The store against a real server: indexes, and the slot index that caps a queue across nodes.

use bson::doc;
use disbatch_core::config::{Component, Config};
use disbatch_core::model::QueueSort;
use disbatch_core::store::{ClaimOutcome, Store};
use disbatch_tests::{write_config, TestDb};
use serde_json::json;

async fn store_for(db: &TestDb) -> Store {
    let path = write_config(db, "store.json", json!({}));
    let loaded = Config::load(&path).expect("config");
    let store = Store::connect(&loaded.config, Component::Den)
        .await
        .expect("connect");
    store.ensure_indexes().await.expect("indexes");
    store
}

#[tokio::test]
async fn a_slot_can_be_held_by_one_task_only_until_it_is_freed() {
    let db = TestDb::new("slots").await;
    let store = store_for(&db).await;
    let queue = db.insert_queue("q", "echo", 2).await;
    let other = db.insert_queue("other", "echo", 2).await;
    db.insert_tasks(queue, vec![doc! {}.into(), doc! {}.into(), doc! {}.into()])
        .await;
    db.insert_tasks(other, vec![doc! {}.into()]).await;

    let first = store
        .claim_next_task(
            queue,
            "n1",
            QueueSort::Fifo,
            0,
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("claim");
    let ClaimOutcome::Claimed(first) = first else {
        panic!("expected a claim, got {first:?}")
    };
    // Same slot of the same queue, from another node: the database refuses it.
    let again = store
        .claim_next_task(
            queue,
            "n2",
            QueueSort::Fifo,
            0,
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("claim");
    assert_eq!(again, ClaimOutcome::SlotTaken);
    // Slot 0 of another queue is a different slot.
    let elsewhere = store
        .claim_next_task(
            other,
            "n2",
            QueueSort::Fifo,
            0,
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("claim");
    assert!(matches!(elsewhere, ClaimOutcome::Claimed(_)));
    // Tasks without a slot (queued, finished, Perl-claimed) never collide.
    assert_eq!(db.count(doc! {"queue": queue, "status": -2}).await, 2);

    // Finishing frees the slot for the next claim; only the current attempt may finish.
    let attempt = bson::oid::ObjectId::new();
    let started = store
        .start_task(first, "n1", attempt)
        .await
        .expect("start")
        .expect("started");
    assert_eq!(started.get_i32("attempts").ok(), Some(1));
    let finish = |attempt| {
        store.finish_task(
            first,
            "n1",
            attempt,
            disbatch_core::store::TaskEnd::Status(1),
            disbatch_core::store::OutputValue::Null,
            disbatch_core::store::OutputValue::Null,
        )
    };
    let stale = finish(bson::oid::ObjectId::new()).await.expect("finish");
    assert_eq!(
        stale,
        disbatch_core::store::FinishOutcome::NotOurs,
        "a stale attempt is fenced off"
    );
    let outcome = finish(attempt).await.expect("finish");
    assert_eq!(outcome, disbatch_core::store::FinishOutcome::Recorded);
    let next = store
        .claim_next_task(
            queue,
            "n2",
            QueueSort::Fifo,
            0,
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("claim");
    assert!(matches!(next, ClaimOutcome::Claimed(_)), "{next:?}");
    let finished = db.task(first).await;
    assert!(
        finished.get("slot").is_none(),
        "slot is unset on completion: {finished}"
    );
    assert_eq!(finished.get_bool("complete").ok(), Some(true));
    db.drop().await;
}

#[tokio::test]
async fn ensure_indexes_creates_disbatch_indexes_exactly_plus_the_slot_index() {
    let db = TestDb::new("indexes").await;
    let store = store_for(&db).await;
    store.ensure_indexes().await.expect("idempotent");
    let names = |coll: &'static str| {
        let db = db.db.clone();
        async move {
            let mut names = db
                .collection::<bson::Document>(coll)
                .list_index_names()
                .await
                .expect("list");
            names.sort();
            names
        }
    };
    assert_eq!(
        names("tasks").await,
        [
            "_id_",
            "lease_until_1",
            "node_1_status_1_queue_1",
            "node_1_status_1_queue_1__id_-1",
            "node_1_status_1_queue_1__id_1",
            "queue_1_key_1",
            "queue_1_slot_1",
            "queue_1_status_1"
        ]
    );
    assert_eq!(names("queues").await, ["_id_", "name_1"]);
    assert_eq!(names("nodes").await, ["_id_", "node_1"]);
    assert_eq!(names("tasks.chunks").await, ["_id_", "files_id_1_n_1"]);
    assert_eq!(
        names("tasks.files").await,
        ["_id_", "filename_1_metadata.task_id_1"]
    );
    // Unique where Disbatch makes them unique: a second queue named "q" is refused.
    store
        .create_queue("q", "echo", None, None)
        .await
        .expect("first");
    assert!(store
        .create_queue("q", "echo", None, None)
        .await
        .expect_err("dup")
        .is_duplicate_key());
    db.drop().await;
}
