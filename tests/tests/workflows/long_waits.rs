//! Long dependency lists (a fan-in's merge, a big batch's callback), counted down by a read
//! and a write conditioned on the list's length: settlers racing on different nodes release
//! each waiting task exactly once, never before its last dependency ended, and a failure deep
//! in a long list cancels with that dependency named.

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_model::workflow::OnDependencyFailure;
use disbatch_store::{BatchTask, Settled, Store, Waits};
use disbatch_tests::TestDb;

/// More than a round reads of a list (`SHORT`, 64), so the long path counts them down.
const LONG: usize = 300;

async fn paused_tasks(store: &Store, queue: ObjectId, n: usize) -> Vec<ObjectId> {
    let params: Vec<Document> = (0..n).map(|i| doc! {"i": i as i64}).collect();
    store
        .tasks()
        .create_tasks(queue, params)
        .await
        .expect("tasks")
        .ids
}

async fn end(db: &TestDb, ids: &[ObjectId], status: i32) {
    db.tasks()
        .update_many(
            doc! {"_id": {"$in": ids.to_vec()}},
            doc! {"$set": {"status": status, "complete": true}},
        )
        .await
        .expect("ending tasks by hand");
}

/// Settles `ids` from `stores.len()` settlers at once, each in its own order and rounds, as
/// the DENs that ran them, the DCI and the leader's sweep may; returns what they did together.
async fn settle_racing(stores: &[Store], ids: &[ObjectId]) -> Settled {
    let runs = stores.iter().enumerate().map(|(k, store)| {
        let mut mine = ids.to_vec();
        mine.rotate_left(k * ids.len() / stores.len().max(1));
        if k % 2 == 1 {
            mine.reverse();
        }
        async move {
            let mut done = Settled::default();
            for part in mine.chunks(37 + k * 11) {
                done.add(
                    store
                        .workflows()
                        .settle_dependents(part)
                        .await
                        .expect("settle"),
                );
            }
            done
        }
    });
    let mut total = Settled::default();
    for s in futures::future::join_all(runs).await {
        total.add(s);
    }
    total
}

async fn stores(db: &TestDb, n: usize) -> Vec<Store> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(db.den_store().await);
    }
    out
}

#[tokio::test]
async fn a_long_fan_in_is_released_once_and_only_after_its_last_dependency_by_racing_settlers() {
    let db = TestDb::new("long_fan_in").await;
    let settlers = stores(&db, 3).await;
    let store = &settlers[0];
    let held = db.insert_queue("held", "echo", 0).await;
    let merge_q = db.insert_queue("merge", "echo", 0).await;
    let deps = paused_tasks(store, held, LONG).await;
    let waits = Waits {
        depends_on: deps.clone(),
        on_failure: None,
    };
    let merge = store
        .workflows()
        .create_waiting_tasks(merge_q, vec![doc! {"merge": true}], &waits)
        .await
        .expect("merge")
        .ids[0];
    // A short waiter on two of the same, beside it: its own path, the same ends.
    let pair = Waits {
        depends_on: vec![deps[5], deps[250]],
        on_failure: None,
    };
    let short = store
        .workflows()
        .create_waiting_tasks(merge_q, vec![doc! {"short": true}], &pair)
        .await
        .expect("short waiter")
        .ids[0];

    let (last, most) = deps.split_last().expect("dependencies");
    end(&db, most, 1).await;
    let first = settle_racing(&settlers, most).await;
    assert_eq!(first.released, 1, "only the short waiter: {first:?}");
    assert_eq!(db.task(short).await.get_i32("status"), Ok(status::QUEUED));
    let m = db.task(merge).await;
    let waits = m.get_array("waiting_on").map(|a| a.len());
    assert_eq!(
        m.get_i32("status"),
        Ok(status::BLOCKED),
        "still waiting ({waits:?} left)"
    );
    let left: Vec<ObjectId> = m
        .get_array("waiting_on")
        .expect("waiting_on")
        .iter()
        .filter_map(|v| v.as_object_id())
        .collect();
    assert_eq!(left, vec![*last], "only the last is left");
    assert_eq!(
        m.get_array("depends_on").map(|a| a.len()),
        Ok(LONG),
        "depends_on keeps every dependency"
    );

    end(&db, &[*last], 1).await;
    let second = settle_racing(&settlers, &[*last]).await;
    assert_eq!(second.released, 1, "released exactly once: {second:?}");
    let m = db.task(merge).await;
    assert_eq!(m.get_i32("status"), Ok(status::QUEUED));
    assert!(
        m.get("waiting_on").is_none(),
        "released: nothing left to wait on"
    );
    // Settling the same ends again changes nothing.
    let again = settle_racing(&settlers, &deps).await;
    assert_eq!((again.released, again.cancelled), (0, 0), "{again:?}");
}

#[tokio::test]
async fn a_failure_deep_in_a_long_list_cancels_the_waiter_naming_that_dependency() {
    let db = TestDb::new("long_fail").await;
    let settlers = stores(&db, 2).await;
    let store = &settlers[0];
    let held = db.insert_queue("held", "echo", 0).await;
    // Fails in the same settle, first by id, but nothing here waits on it: a reason naming
    // it would be wrong.
    let other = paused_tasks(store, held, 1).await[0];
    let deps = paused_tasks(store, held, LONG).await;
    let cancel = Waits {
        depends_on: deps.clone(),
        on_failure: Some(OnDependencyFailure::Cancel),
    };
    let run = Waits {
        depends_on: deps.clone(),
        on_failure: Some(OnDependencyFailure::Run),
    };
    let cancelled = store
        .workflows()
        .create_waiting_tasks(held, vec![doc! {"policy": "cancel"}], &cancel)
        .await
        .expect("cancelling waiter")
        .ids[0];
    let runs = store
        .workflows()
        .create_waiting_tasks(held, vec![doc! {"policy": "run"}], &run)
        .await
        .expect("running waiter")
        .ids[0];
    // Past the part of the list a round reads, while the whole list is still waited on.
    let failing = deps[LONG - 10];
    end(&db, &[other, failing], 2).await;
    let s = settle_racing(&settlers, &[other, failing]).await;
    assert_eq!(s.cancelled, 1, "{s:?}");
    let c = db.task(cancelled).await;
    assert_eq!(c.get_i32("status"), Ok(status::CANCELLED), "cancelled");
    let reason = c.get_str("cancel_reason").unwrap_or_default().to_string();
    assert!(
        reason.contains(&failing.to_hex())
            && reason.contains("failed")
            && !reason.contains(&other.to_hex()),
        "the reason names the failed dependency: {reason}"
    );
    // "run" keeps waiting for the rest, then runs.
    let rest: Vec<ObjectId> = deps.iter().copied().filter(|d| *d != failing).collect();
    let r = db.task(runs).await;
    assert_eq!(r.get_i32("status"), Ok(status::BLOCKED));
    assert_eq!(r.get_array("waiting_on").map(|a| a.len()), Ok(LONG - 1));
    end(&db, &rest, 1).await;
    let s = settle_racing(&settlers, &rest).await;
    assert_eq!(s.released, 1, "{s:?}");
    assert_eq!(db.task(runs).await.get_i32("status"), Ok(status::QUEUED));
}

#[tokio::test]
async fn a_big_batch_releases_its_callback_once_with_the_outcome_when_settlers_race() {
    let db = TestDb::new("long_batch").await;
    let settlers = stores(&db, 3).await;
    let store = &settlers[0];
    let held = db.insert_queue("held", "echo", 0).await;
    let after = db.insert_queue("after", "echo", 0).await;
    let members: Vec<BatchTask> = (0..LONG)
        .map(|i| BatchTask {
            queue: held,
            params: doc! {"i": i as i64},
        })
        .collect();
    let callback = BatchTask {
        queue: after,
        params: doc! {"report": true},
    };
    let batch = store
        .workflows()
        .create_batch(&members, Some(&callback))
        .await
        .expect("batch");
    let cb = batch.callback.expect("a callback");
    let (failed, ok) = batch.members.split_at(3);
    end(&db, ok, 1).await;
    end(&db, failed, 2).await;
    let s = settle_racing(&settlers, &batch.members).await;
    assert_eq!((s.callbacks, s.released), (1, 1), "{s:?}");
    let t = db.task(cb).await;
    assert_eq!(
        t.get_i32("status"),
        Ok(status::QUEUED),
        "the callback is queued"
    );
    let outcome = t
        .get_document("params")
        .and_then(|p| p.get_document("batch"))
        .expect("the batch's outcome in params")
        .clone();
    assert_eq!(outcome.get_object_id("id"), Ok(batch.id), "{outcome:?}");
    assert_eq!(
        outcome.get_i64("succeeded"),
        Ok((LONG - 3) as i64),
        "{outcome:?}"
    );
    assert_eq!(outcome.get_i64("failed"), Ok(3), "{outcome:?}");
    let again = settle_racing(&settlers, &batch.members).await;
    assert_eq!(again.callbacks, 0, "{again:?}");
}

#[tokio::test]
async fn waits_written_by_hand_in_odd_shapes_never_stop_the_others_from_being_released() {
    let db = TestDb::new("long_odd").await;
    let store = db.den_store().await;
    let held = db.insert_queue("held", "echo", 0).await;
    let dep = paused_tasks(&store, held, 1).await[0];
    let waits = Waits {
        depends_on: vec![dep],
        on_failure: None,
    };
    let params: Vec<Document> = (0..4).map(|i| doc! {"i": i}).collect();
    let ids = store
        .workflows()
        .create_waiting_tasks(held, params, &waits)
        .await
        .expect("waiting tasks")
        .ids;
    // By hand: a lone id for a list, a list with a value that is no task's id, and a lone
    // value no list can be pulled from on a batch's callback.
    db.set_task(ids[0], doc! {"waiting_on": dep}).await;
    db.set_task(ids[1], doc! {"waiting_on": [dep, "not an id"]})
        .await;
    db.set_task(
        ids[2],
        doc! {"waiting_on": dep, "batch_callback": ObjectId::new()},
    )
    .await;
    end(&db, &[dep], 1).await;
    let s = store
        .workflows()
        .settle_dependents(&[dep])
        .await
        .expect("settle");
    assert_eq!(
        s.released, 2,
        "the lone id's task and the untouched one: {s:?}"
    );
    assert_eq!(db.task(ids[0]).await.get_i32("status"), Ok(status::QUEUED));
    assert_eq!(db.task(ids[3]).await.get_i32("status"), Ok(status::QUEUED));
    let odd = db.task(ids[1]).await;
    assert_eq!(
        odd.get_i32("status"),
        Ok(status::BLOCKED),
        "waits on what never ends"
    );
    assert_eq!(
        odd.get_array("waiting_on").map(|a| a.len()),
        Ok(1),
        "the ended id is counted off, the odd value stays"
    );
    assert_eq!(db.task(ids[2]).await.get_i32("status"), Ok(status::BLOCKED));
}
