//! Batched claims against a real server: candidates read in claim order within a window,
//! claimed together, each returned exactly as stored; what changed since the read is left.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_model::QueueSort;
use disbatch_store::{ClaimWindow, Pick, PickOutcome, Store};
use disbatch_tests::TestDb;

/// Claims up to `n` tasks of `queue` through `window`, with slots from `next_slot` on.
async fn claim_batch(
    store: &Store,
    queue: ObjectId,
    window: &mut ClaimWindow,
    n: usize,
    next_slot: &mut u32,
) -> Vec<(Pick, PickOutcome)> {
    let candidates = store
        .claims()
        .claim_candidates(queue, QueueSort::Fifo, n, 1, window)
        .await
        .expect("read candidates")
        .tasks;
    let picks: Vec<Pick> = candidates
        .into_iter()
        .map(|task| {
            *next_slot += 1;
            Pick {
                task,
                slot: *next_slot,
                attempt: ObjectId::new(),
                holds: Default::default(),
            }
        })
        .collect();
    let outcomes = store
        .claims()
        .claim_picks("n1", Duration::from_secs(60), &picks)
        .await
        .expect("claim");
    assert_eq!(outcomes.len(), picks.len(), "one outcome per pick");
    picks.into_iter().zip(outcomes).collect()
}

fn claimed_ids(batch: &[(Pick, PickOutcome)]) -> Vec<ObjectId> {
    batch
        .iter()
        .map(|(_, o)| match o {
            PickOutcome::Claimed(t) => t.id,
            other => panic!("expected claims only, got {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_batch_is_claimed_in_order_and_each_task_comes_back_as_stored() {
    let db = TestDb::new("claims_batch").await;
    let store = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 100).await;
    let params: Vec<Bson> = (0..10).map(|i| doc! {"n": i, "s": "x"}.into()).collect();
    let ids = db.insert_tasks(queue, params).await;
    // One task already ran twice (attempts is an Int64 there): the claim counts on from it.
    db.tasks()
        .update_one(doc! {"_id": ids[1]}, doc! {"$set": {"attempts": 2_i64}})
        .await
        .expect("set attempts");

    let (mut window, mut slot) = (ClaimWindow::default(), 0);
    let batch = claim_batch(&store, queue, &mut window, 6, &mut slot).await;
    assert_eq!(claimed_ids(&batch), ids[..6], "oldest first");
    assert_eq!(
        store.results().uses_bulk_write(),
        Some(true),
        "one bulkWrite here"
    );
    for (pick, outcome) in &batch {
        let PickOutcome::Claimed(task) = outcome else {
            unreachable!()
        };
        let stored = db.task(task.id).await;
        assert_eq!(task.raw, stored, "the runner gets the task as stored");
        assert_eq!(stored.get_i32("status").ok(), Some(status::RUNNING));
        assert_eq!(stored.get_str("node").ok(), Some("n1"));
        assert_eq!(stored.get_i64("slot").ok(), Some(pick.slot as i64));
        assert_eq!(stored.get_object_id("attempt").ok(), Some(pick.attempt));
        assert!(stored.get_datetime("lease_until").is_ok());
    }
    assert_eq!(db.task(ids[1]).await.get_i64("attempts").ok(), Some(3));
    assert_eq!(db.task(ids[0]).await.get_i32("attempts").ok(), Some(1));

    // A server without bulkWrite: one findOneAndUpdate per pick, the same result.
    let older = store.results().without_bulk_write();
    let batch = claim_batch(&older, queue, &mut window, 8, &mut slot).await;
    assert_eq!(claimed_ids(&batch), ids[6..], "the rest, in order");
    for (_, outcome) in &batch {
        let PickOutcome::Claimed(task) = outcome else {
            unreachable!()
        };
        let stored = db.task(task.id).await;
        assert_eq!(task.raw, stored);
    }
    let none = claim_batch(&store, queue, &mut window, 4, &mut slot).await;
    assert!(none.is_empty(), "the queue is empty: {none:?}");
    db.drop().await;
}

#[tokio::test]
async fn a_task_changed_since_it_was_read_is_not_claimed_blind() {
    let db = TestDb::new("claims_changed").await;
    let store = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 100).await;
    let ids = db
        .insert_tasks(queue, (0..4).map(|i| doc! {"n": i}.into()).collect())
        .await;
    let candidates = store
        .claims()
        .claim_candidates(queue, QueueSort::Fifo, 4, 1, &mut ClaimWindow::default())
        .await
        .expect("read")
        .tasks;
    assert_eq!(candidates.len(), 4);
    // After the read: one task is edited (its mtime moves), one claimed by another node,
    // one deleted.
    db.tasks()
        .update_one(
            doc! {"_id": ids[0]},
            doc! {"$set": {"params": {"n": 100}, "mtime": DateTime::now()}},
        )
        .await
        .expect("edit");
    db.tasks()
        .update_one(
            doc! {"_id": ids[1]},
            doc! {"$set": {"status": 0, "node": "n2", "slot": 50_i64}},
        )
        .await
        .expect("claim elsewhere");
    db.tasks()
        .delete_one(doc! {"_id": ids[2]})
        .await
        .expect("delete");
    let picks: Vec<Pick> = candidates
        .into_iter()
        .enumerate()
        .map(|(i, task)| Pick {
            task,
            slot: i as u32,
            attempt: ObjectId::new(),
            holds: Default::default(),
        })
        .collect();
    let outcomes = store
        .claims()
        .claim_picks("n1", Duration::from_secs(60), &picks)
        .await
        .expect("claim");
    assert_eq!(outcomes[0], PickOutcome::Lost, "edited since the read");
    assert_eq!(outcomes[1], PickOutcome::Lost, "claimed elsewhere");
    assert_eq!(outcomes[2], PickOutcome::Lost, "deleted");
    assert!(matches!(outcomes[3], PickOutcome::Claimed(_)));
    let edited = db.task(ids[0]).await;
    assert_eq!(
        edited.get_i32("status").ok(),
        Some(status::QUEUED),
        "still queued"
    );
    assert_eq!(edited.get_document("params").ok(), Some(&doc! {"n": 100}));
    assert_eq!(db.task(ids[1]).await.get_str("node").ok(), Some("n2"));
    db.drop().await;
}

#[tokio::test]
async fn claims_through_a_window_miss_nothing_and_skip_what_is_not_claimable() {
    let db = TestDb::new("claims_window").await;
    let store = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 1000).await;
    let now = DateTime::now();
    let mut expected = Vec::new();
    let mut not_due = ObjectId::new();
    let mut never: Vec<Bson> = Vec::new();
    // 200 tasks, more than a window holds: every 10th Disbatch 3's unclaimed marker
    // (`node: -1`), one delayed past the test, and tasks that can never be claimed.
    for i in 0..200 {
        let id = ObjectId::new();
        let mut task = doc! {"_id": id, "queue": queue, "status": -2, "node": Bson::Null,
        "params": {"i": i}, "ctime": now, "mtime": now};
        if i % 10 == 3 {
            task.insert("node", -1);
        }
        if i == 150 {
            task.insert(
                "not_before",
                DateTime::from_millis(now.timestamp_millis() + 3_600_000),
            );
            not_due = id;
        } else {
            expected.push(id);
        }
        db.tasks().insert_one(task).await.expect("insert");
        if i % 50 == 0 {
            let bad = doc! {"_id": format!("bad-{i}"), "queue": queue, "status": -2,
            "node": Bson::Null, "params": {}, "ctime": now, "mtime": now};
            db.tasks().insert_one(bad).await.expect("insert");
            never.push(Bson::String(format!("bad-{i}")));
            let word = doc! {"_id": ObjectId::new(), "queue": queue, "status": -2, "node": Bson::Null,
            "attempts": "five", "params": {}, "ctime": now, "mtime": now};
            let word_id = word.get("_id").cloned().expect("id");
            db.tasks().insert_one(word).await.expect("insert");
            never.push(word_id);
        }
    }

    let (mut window, mut slot) = (ClaimWindow::default(), 0);
    let mut order = Vec::new();
    // Claim 140 (a window and then some), then give back the 6th: it is behind the window now.
    while order.len() < 140 {
        let batch = claim_batch(&store, queue, &mut window, 7, &mut slot).await;
        order.extend(claimed_ids(&batch));
    }
    assert_eq!(order[..], expected[..140], "oldest first, across windows");
    let given_back = order[5];
    let claimed = db.task(given_back).await;
    let attempt = claimed.get_object_id("attempt").expect("attempt");
    assert!(store
        .claims()
        .give_back_attempt(given_back, attempt, &claimed)
        .await
        .expect("give back"));
    let back = db.task(given_back).await;
    for field in ["attempt", "attempts", "slot", "lease_until", "node"] {
        assert!(
            back.get(field).is_none_or(|v| *v == Bson::Null),
            "a first claim given back leaves no {field}: {back}"
        );
    }
    order.retain(|id| *id != given_back);
    // A reset (what a node does when a change stream reports a task queued again) finds it.
    window.reset();
    let batch = claim_batch(&store, queue, &mut window, 3, &mut slot).await;
    let ids = claimed_ids(&batch);
    assert_eq!(ids[0], given_back, "the requeued task goes first");
    order.extend(ids);
    // The rest in batches; without a reset a window still ends, and the head is read again.
    loop {
        let batch = claim_batch(&store, queue, &mut window, 9, &mut slot).await;
        if batch.is_empty() {
            break;
        }
        order.extend(claimed_ids(&batch));
    }
    let unique: HashSet<ObjectId> = order.iter().copied().collect();
    assert_eq!(unique.len(), order.len(), "no task claimed twice");
    assert_eq!(
        unique,
        expected.iter().copied().collect::<HashSet<_>>(),
        "every claimable task, legacy `node: -1` ones included"
    );
    assert_eq!(
        db.task(not_due).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    let untouched = db
        .count(doc! {"_id": {"$in": never.clone()}, "status": -2, "node": Bson::Null})
        .await;
    assert_eq!(
        untouched as usize,
        never.len(),
        "unclaimable tasks are left queued"
    );

    // Once due, the delayed task is found again.
    db.tasks()
        .update_one(
            doc! {"_id": not_due},
            doc! {"$set": {"not_before": DateTime::from_millis(now.timestamp_millis() - 1)}},
        )
        .await
        .expect("make due");
    window.reset();
    let batch = claim_batch(&store, queue, &mut window, 2, &mut slot).await;
    assert_eq!(claimed_ids(&batch), [not_due]);
    db.drop().await;
}

/// A queue's `threads` across nodes is the database's decision: two claimers racing over the
/// same slots and the same head never hold more than `threads` tasks, nor a task twice.
#[tokio::test]
async fn two_claimers_at_once_never_exceed_threads_or_share_a_task() {
    let db = TestDb::new("claims_race").await;
    let a = db.den_store().await;
    let b = a.with_database(a.database_name());
    let threads = 16u32;
    let queue = db.insert_queue("q", "echo", threads as i32).await;
    db.insert_tasks(queue, (0..200).map(|i| doc! {"i": i}.into()).collect())
        .await;
    let claimer = |store: Store, node: &'static str, seed: u32| async move {
        let mut window = ClaimWindow::default();
        let mut free: BTreeSet<u32> = (0..threads).collect();
        let mut mine = Vec::new();
        let mut turn = seed;
        while !free.is_empty() {
            // Slots in a different order for each claimer, as nodes shuffle theirs.
            turn = turn.wrapping_mul(7).wrapping_add(3);
            let mut slots: Vec<u32> = free.iter().copied().collect();
            let by = (turn as usize) % slots.len();
            slots.rotate_left(by);
            slots.truncate(5);
            let candidates = store
                .claims()
                .claim_candidates(queue, QueueSort::Fifo, slots.len() * 2, 2, &mut window)
                .await
                .expect("read")
                .tasks;
            let picks: Vec<Pick> = candidates
                .into_iter()
                .step_by(2)
                .zip(&slots)
                .map(|(task, slot)| Pick {
                    task,
                    slot: *slot,
                    attempt: ObjectId::new(),
                    holds: Default::default(),
                })
                .collect();
            let outcomes = store
                .claims()
                .claim_picks(node, Duration::from_secs(60), &picks)
                .await
                .expect("claim");
            for (pick, outcome) in picks.iter().zip(outcomes) {
                match outcome {
                    PickOutcome::Claimed(task) => {
                        free.remove(&pick.slot);
                        mine.push(task.id);
                    }
                    PickOutcome::SlotTaken => {
                        free.remove(&pick.slot);
                    }
                    PickOutcome::Lost => {}
                    PickOutcome::Refused(why) => panic!("a plain task was refused: {why}"),
                    PickOutcome::KeySlotTaken => panic!("a task with no key slot lost one"),
                }
            }
        }
        mine
    };
    let (ours, theirs) = tokio::join!(claimer(a, "n1", 1), claimer(b, "n2", 2));
    let all: HashSet<ObjectId> = ours.iter().chain(&theirs).copied().collect();
    assert_eq!(all.len(), ours.len() + theirs.len(), "no task twice");
    assert_eq!(all.len(), threads as usize, "every slot used once");
    let running: Vec<Document> = {
        let mut c = db
            .tasks()
            .find(doc! {"queue": queue, "status": 0})
            .await
            .expect("find");
        let mut v = Vec::new();
        while c.advance().await.expect("next") {
            v.push(c.deserialize_current().expect("doc"));
        }
        v
    };
    assert_eq!(running.len(), threads as usize);
    let slots: BTreeSet<i64> = running
        .iter()
        .map(|t| t.get_i64("slot").expect("slot"))
        .collect();
    assert_eq!(slots, (0..threads as i64).collect());
    db.drop().await;
}
