//! The maintenance leader's probes against a real server: tasks created since a bound,
//! delayed tasks come due in a window or still to come, and leases ending before a horizon.

use std::collections::BTreeMap;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::TestDb;

fn at(ms_from: DateTime, ms: i64) -> DateTime {
    DateTime::from_millis(ms_from.timestamp_millis() + ms)
}

/// A task as Disbatch's writers leave it, delayed until `not_before` when given.
fn task(queue: ObjectId, status: i32, not_before: Option<DateTime>) -> Document {
    let mut d = doc! {"queue": queue, "status": status, "node": null};
    if let Some(t) = not_before {
        d.insert("not_before", t);
    }
    d
}

/// `n` queued tasks without delays: the backlog a probe meets on a busy queue.
fn backlog(queue: ObjectId, n: usize) -> Vec<Document> {
    (0..n).map(|_| task(queue, -2, None)).collect()
}

#[tokio::test]
async fn came_due_counts_queued_tasks_whose_delay_ended_in_the_window_per_probed_queue() {
    let db = TestDb::new("probe_due").await;
    let store = db.den_store().await;
    let (a, b, unprobed) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
    let now = DateTime::now();
    let mut docs = backlog(a, 2000);
    docs.extend([
        task(a, -2, Some(at(now, -500))),
        task(a, -2, Some(at(now, -100))),
        task(a, 1, Some(at(now, -200))), // came due but no longer queued
        task(a, -2, Some(at(now, -5000))), // came due before the window
        task(a, -2, Some(at(now, 60_000))), // not due yet
        task(b, -2, Some(at(now, -300))),
        task(unprobed, -2, Some(at(now, -300))),
        // Another tool's numbers: a double status still counts as queued.
        doc! {"queue": b, "status": -2.0_f64, "node": null, "not_before": at(now, -10)},
    ]);
    db.tasks().insert_many(docs).await.expect("insert");
    let due: BTreeMap<ObjectId, u64> = store
        .queues()
        .came_due(&[a, b], at(now, -1000), now)
        .await
        .expect("came_due")
        .into_iter()
        .collect();
    assert_eq!(due, BTreeMap::from([(a, 2), (b, 2)]));
    assert!(store
        .queues()
        .came_due(&[a, b], now, now)
        .await
        .expect("empty window")
        .is_empty());
    assert!(store
        .queues()
        .came_due(&[], at(now, -1000), now)
        .await
        .expect("no queue")
        .is_empty());
    db.drop().await;
}

#[tokio::test]
async fn created_since_reads_only_tasks_made_after_the_bound() {
    let db = TestDb::new("probe_created").await;
    let store = db.den_store().await;
    let (a, b) = (ObjectId::new(), ObjectId::new());
    db.tasks()
        .insert_many(backlog(a, 500))
        .await
        .expect("insert old");
    let bound = ObjectId::new();
    let new: Vec<Document> = [(a, -2), (a, 1), (b, -2)]
        .into_iter()
        .map(|(queue, status)| {
            let mut d = task(queue, status, None);
            d.insert("_id", ObjectId::new());
            d
        })
        .collect();
    let newest_a = new[1].get_object_id("_id").expect("id");
    db.tasks().insert_many(new).await.expect("insert new");
    let mut seen = store
        .queues()
        .created_since(bound)
        .await
        .expect("created_since");
    seen.sort_by_key(|c| c.queue != a);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (seen[0].queue, seen[0].queued, seen[0].newest),
        (a, 1, newest_a)
    );
    assert_eq!((seen[1].queue, seen[1].queued), (b, 1));
    db.drop().await;
}

#[tokio::test]
async fn any_delayed_after_sees_only_the_probed_queues_delays_past_the_bound() {
    let db = TestDb::new("probe_delayed").await;
    let store = db.den_store().await;
    let (a, b, unprobed) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
    let now = DateTime::now();
    let mut docs = backlog(a, 1000);
    docs.push(task(a, -2, Some(at(now, -5000))));
    docs.push(task(unprobed, -2, Some(at(now, 60_000))));
    db.tasks().insert_many(docs).await.expect("insert");
    let delayed = |queues: Vec<ObjectId>, after: DateTime| {
        let store = store.clone();
        async move {
            store
                .queues()
                .any_delayed_after(&queues, after)
                .await
                .expect("any_delayed_after")
        }
    };
    assert!(
        !delayed(vec![a, b], at(now, -1000)).await,
        "a's delay ended before the bound"
    );
    assert!(
        delayed(vec![a, b], at(now, -10_000)).await,
        "a's delay ended after it"
    );
    assert!(!delayed(vec![], at(now, -10_000)).await, "no queue probed");
    db.tasks()
        .insert_one(task(b, -2, Some(at(now, 60_000))))
        .await
        .expect("insert");
    assert!(
        delayed(vec![a, b], now).await,
        "b holds a task still delayed"
    );
    db.drop().await;
}

#[tokio::test]
async fn leases_ending_before_a_horizon_come_earliest_first_and_only_while_held() {
    let db = TestDb::new("probe_leases").await;
    let store = db.den_store().await;
    let queue = ObjectId::new();
    let now = DateTime::now();
    let task = |status: i32, lease_ms: i64| {
        doc! {"_id": ObjectId::new(), "queue": queue, "status": status, "node": "n",
        "lease_until": at(now, lease_ms)}
    };
    let docs = vec![
        task(0, 2_000),
        task(-1, -1_000),
        task(0, 60_000),
        task(1, -5_000), // finished: its lease no longer matters
        task(0, -3_000),
    ];
    let ids: Vec<ObjectId> = docs
        .iter()
        .map(|d| d.get_object_id("_id").expect("id"))
        .collect();
    db.tasks().insert_many(docs).await.expect("insert");
    let ending = store
        .recovery()
        .leases_ending_before(at(now, 10_000), 100)
        .await
        .expect("leases_ending_before");
    let seen: Vec<ObjectId> = ending.iter().map(|t| t.id).collect();
    assert_eq!(seen, vec![ids[4], ids[1], ids[0]]);
    let expired = store
        .recovery()
        .expired_leases(100)
        .await
        .expect("expired_leases");
    assert_eq!(
        expired.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![ids[4], ids[1]]
    );
    db.drop().await;
}
