//! The store against a real server: indexes, and the slot index that caps a queue across nodes.

use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::QueueSort;
use disbatch_store::{ClaimWindow, LimitIndex, Pick, PickOutcome, Store};
use disbatch_tests::TestDb;

/// Reads the queue's head and claims `slots.len()` of its tasks for `node`, one slot each.
async fn claim(store: &Store, queue: ObjectId, node: &str, slots: &[u32]) -> Vec<PickOutcome> {
    let mut window = ClaimWindow::default();
    let candidates = store
        .claims()
        .claim_candidates(queue, QueueSort::Fifo, slots.len(), 1, &mut window)
        .await
        .expect("read candidates")
        .tasks;
    let picks: Vec<Pick> = candidates
        .into_iter()
        .zip(slots)
        .map(|(task, slot)| Pick {
            task,
            slot: *slot,
            attempt: ObjectId::new(),
            holds: Default::default(),
        })
        .collect();
    store
        .claims()
        .claim_picks(node, Duration::from_secs(30), &picks)
        .await
        .expect("claim")
}

fn claimed(outcome: &PickOutcome) -> &bson::Document {
    match outcome {
        PickOutcome::Claimed(task) => &task.raw,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test]
async fn a_slot_can_be_held_by_one_task_only_until_it_is_freed() {
    let db = TestDb::new("slots").await;
    let store = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 2).await;
    let other = db.insert_queue("other", "echo", 2).await;
    db.insert_tasks(queue, vec![doc! {}.into(), doc! {}.into(), doc! {}.into()])
        .await;
    db.insert_tasks(other, vec![doc! {}.into()]).await;

    let first = claim(&store, queue, "n1", &[0]).await;
    let first = claimed(&first[0]).clone();
    let first_id = first.get_object_id("_id").expect("id");
    let attempt = first.get_object_id("attempt").expect("attempt");
    assert_eq!(first.get_i32("attempts").ok(), Some(1));
    // Same slot of the same queue, from another node: the database refuses it.
    let again = claim(&store, queue, "n2", &[0]).await;
    assert_eq!(again, [PickOutcome::SlotTaken]);
    // Slot 0 of another queue is a different slot.
    let elsewhere = claim(&store, other, "n2", &[0]).await;
    claimed(&elsewhere[0]);
    // Tasks without a slot (queued, finished, Perl-claimed) never collide.
    assert_eq!(db.count(doc! {"queue": queue, "status": -2}).await, 2);

    // Finishing frees the slot for the next claim; only the current attempt may finish.
    let finish = |attempt| {
        store.results().finish_task(
            first_id,
            "n1",
            attempt,
            disbatch_store::TaskEnd::Status(1),
            disbatch_store::OutputValue::Null,
            disbatch_store::OutputValue::Null,
        )
    };
    let stale = finish(ObjectId::new()).await.expect("finish");
    assert_eq!(
        stale,
        disbatch_store::FinishOutcome::NotOurs,
        "a stale attempt is fenced off"
    );
    let outcome = finish(attempt).await.expect("finish");
    assert_eq!(outcome, disbatch_store::FinishOutcome::Recorded);
    let next = claim(&store, queue, "n2", &[0]).await;
    claimed(&next[0]);
    let finished = db.task(first_id).await;
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
    let store = db.den_store().await;
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
            "mtime_-1_failed",
            "node_1_status_1_queue_1",
            "node_1_status_1_queue_1__id_-1",
            "node_1_status_1_queue_1__id_1",
            "queue_1_discarded_at_1",
            "queue_1_key_1",
            "queue_1_not_before_1",
            "queue_1_slot_1",
            "queue_1_status_1",
            "unrecorded_attempts.attempt_1"
        ]
    );
    assert_eq!(names("queues").await, ["_id_", "name_1"]);
    assert_eq!(names("rate_limits").await, ["_id_", "queue_1_until_1"]);
    // The flow limits' own indexes come with the first queue that uses them, not before.
    store
        .limits()
        .ensure_limit_index(LimitIndex::KeySlots)
        .await
        .expect("key slots");
    store
        .limits()
        .ensure_limit_index(LimitIndex::Unique)
        .await
        .expect("unique");
    // So do workflows' (the first waiting task, graph or batch), and settling knows it.
    assert!(!store.limits().workflows_in_use().await.expect("listed"));
    store
        .limits()
        .ensure_limit_index(LimitIndex::Workflows)
        .await
        .expect("workflows");
    assert!(store.limits().workflows_in_use().await.expect("listed"));
    let tasks = names("tasks").await;
    for name in [
        "queue_1_concurrency_key_1_concurrency_slot_1",
        "queue_1_unique_key_1_unique_gen_1",
        "waiting_on_1",
        "has_dependents_1",
        "graph_1",
        "batch_1",
    ] {
        assert!(tasks.contains(&name.to_string()), "{name}: {tasks:?}");
    }
    assert_eq!(names("nodes").await, ["_id_", "node_1"]);
    assert_eq!(names("tasks.chunks").await, ["_id_", "files_id_1_n_1"]);
    assert_eq!(
        names("tasks.files").await,
        ["_id_", "filename_1_metadata.task_id_1"]
    );
    // Unique where Disbatch makes them unique: a second queue named "q" is refused.
    store
        .queues()
        .create_queue("q", "echo", None, None)
        .await
        .expect("first");
    assert!(store
        .queues()
        .create_queue("q", "echo", None, None)
        .await
        .expect_err("dup")
        .is_duplicate_key());
    db.drop().await;
}
