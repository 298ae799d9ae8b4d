//! The rate-limit window against a real server: starts granted ahead only while the window is
//! under half full, counted at the end of their horizon, and refunds that reach the entry the
//! grant joined when entries counted ahead overlap the next one.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::limits::RateLimit;
use disbatch_store::{Grant, Store};
use disbatch_tests::TestDb;

fn limit(starts: u32, per_ms: u64) -> RateLimit {
    RateLimit {
        starts,
        per: Duration::from_millis(per_ms),
        partition: None,
        max_partitions: 10,
    }
}

async fn grant(
    store: &Store,
    queue: ObjectId,
    limit: &RateLimit,
    asked: u32,
    ahead: u32,
) -> (u32, u32, i64) {
    match store
        .limits()
        .grant_starts(queue, &Bson::Null, limit, asked, ahead)
        .await
        .expect("grant")
    {
        Grant::Starts { n, ahead, at, .. } => (n, ahead, at.timestamp_millis()),
        other => panic!("a grant, not {other:?}"),
    }
}

async fn window(db: &TestDb, queue: ObjectId) -> Document {
    db.db
        .collection::<Document>("rate_limits")
        .find_one(doc! {"_id": {"queue": queue, "partition": Bson::Null}})
        .await
        .expect("read")
        .expect("the window")
}

/// Every entry's `(f, t, n)`, `starts` then the open one.
fn entries(w: &Document) -> Vec<(i64, i64, i64)> {
    let starts = w.get_array("starts").cloned().unwrap_or_default();
    let open = w.get_document("open").ok().cloned().map(Bson::Document);
    starts
        .into_iter()
        .chain(open)
        .filter_map(|e| e.as_document().cloned())
        .map(|e| {
            (
                e.get_i64("f").unwrap_or(-1),
                e.get_i64("t").unwrap_or(-1),
                e.get_i64("n").unwrap_or(-1),
            )
        })
        .collect()
}

#[tokio::test]
async fn starts_ahead_come_only_under_half_full_and_count_at_their_horizon() {
    let db = TestDb::new("rate_ahead").await;
    let store = db.den_store().await;
    let queue = ObjectId::new();
    let limit = limit(20, 10_000);
    let horizon = limit.ahead_horizon().as_millis() as i64;

    let (n, ahead, at) = grant(&store, queue, &limit, 5, 10).await;
    assert_eq!(
        (n, ahead),
        (5, 5),
        "ahead up to half the limit (10), no more"
    );
    let w = window(&db, queue).await;
    assert_eq!(
        entries(&w),
        vec![(at, at + horizon, 10)],
        "counted at the horizon"
    );
    let until = w.get_datetime("until").expect("until").timestamp_millis();
    assert_eq!(until, at + horizon + 10_000);

    let (n, ahead, _) = grant(&store, queue, &limit, 3, 10).await;
    assert_eq!((n, ahead), (3, 0), "half full: only what is asked");
    let (n, ahead, _) = grant(&store, queue, &limit, 100, 10).await;
    assert_eq!(
        (n, ahead),
        (7, 0),
        "the limit holds with the ahead starts counted"
    );
    let (n, _, _) = grant(&store, queue, &limit, 1, 0).await;
    assert_eq!(n, 0, "full");
    let w = window(&db, queue).await;
    let counted: i64 = entries(&w).iter().map(|e| e.2).sum();
    assert_eq!(counted, 20);
    let newest = entries(&w).iter().map(|e| e.1).max().unwrap_or(0);
    assert_eq!(newest, at + horizon, "an entry's time never moves back");
    db.drop().await;
}

#[tokio::test]
async fn a_refund_reaches_the_entry_its_grant_joined_when_entries_overlap() {
    let db = TestDb::new("rate_refund").await;
    let store = db.den_store().await;
    // A 4 s window: entries take grants for 62 ms and starts ahead count 500 ms later, so the
    // entry of a grant ahead overlaps the one begun after it, unless this machine is so slow
    // that no grant came within those 438 ms: then it tries again on a fresh window.
    let limit = limit(100_000, 4_000);
    let mut tries = 0;
    let (queue, first_at, last_at, before) = loop {
        tries += 1;
        assert!(tries <= 20, "no two grants within 438 ms in 20 tries");
        let queue = ObjectId::new();
        let (_, first_ahead, first_at) = grant(&store, queue, &limit, 1, 4).await;
        assert_eq!(first_ahead, 4);
        let (at, e) = loop {
            let (_, _, at) = grant(&store, queue, &limit, 1, 0).await;
            let e = entries(&window(&db, queue).await);
            if e.len() >= 2 {
                break (at, e);
            }
        };
        assert_eq!(e.len(), 2, "one entry moved out, one begun: {e:?}");
        assert_eq!(e[1].0, at, "the newest entry begun by the last grant");
        if e[0].1 >= at {
            break (queue, first_at, at, e);
        }
    };
    let (first, newest) = (before[0], before[1]);
    assert_eq!(first.0, first_at, "{before:?}");
    store
        .limits()
        .refund_starts(queue, &Bson::Null, DateTime::from_millis(last_at), 1)
        .await
        .expect("refund");
    let after = entries(&window(&db, queue).await);
    assert_eq!(after[0], first, "the older entry spanning it is untouched");
    assert_eq!(after[1].2, newest.2 - 1, "the newest one gives it back");
    store
        .limits()
        .refund_starts(queue, &Bson::Null, DateTime::from_millis(first_at), 3)
        .await
        .expect("refund");
    let after = entries(&window(&db, queue).await);
    assert_eq!(
        after[0].2,
        first.2 - 3,
        "and the first grant's own entry its own"
    );
    assert_eq!(after[1], (newest.0, newest.1, newest.2 - 1));
    db.drop().await;
}
