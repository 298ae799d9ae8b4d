//! QueueBalance in the DEN against a real server: the lease, the threads it writes per tier,
//! pretend and disabled modes, and the status `GET /monitoring` reads. Drives
//! `Balancer::run_once` directly with chosen clock values, so no test waits for real time.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_config::{Component, Config};
use disbatch_den::maintenance::balancer::{BalanceReport, BalanceRun, Balancer, ThreadChange};
use disbatch_model::queue_balance::{Health, LocalTime};
use disbatch_store::Store;
use disbatch_tests::{write_config, TestDb};
use serde_json::{json, Value};

/// A store and a balancer for `db`, with the config's `balance` section set to `balance`.
async fn setup(db: &TestDb, balance: Value) -> (Store, Config) {
    let path = write_config(db, "den.json", json!({ "balance": balance }));
    let loaded = Config::load(&path).expect("config");
    let store = Store::connect(&loaded.config, Component::Den)
        .await
        .expect("connect");
    store.ensure_indexes().await.expect("indexes");
    (store, loaded.config)
}

/// No rate limit, the default 30 s lease: each call is an attempt.
fn balancer(config: &Config) -> Balancer {
    Balancer::new(&config.balance).with_timing(Duration::ZERO, Duration::from_secs(30))
}

fn plus(t: DateTime, millis: i64) -> DateTime {
    DateTime::from_millis(t.timestamp_millis() + millis)
}

fn secs(t: DateTime) -> i64 {
    t.timestamp_millis().div_euclid(1000)
}

async fn set_balance_document(db: &TestDb, d: Document) {
    let balance = db.db.collection::<Document>("balance");
    balance.delete_many(doc! {}).await.expect("clear balance");
    balance.insert_one(d).await.expect("insert balance");
}

async fn balance_document(db: &TestDb) -> Document {
    db.db
        .collection::<Document>("balance")
        .find_one(doc! {})
        .await
        .expect("read balance")
        .expect("balance document exists")
}

async fn threads(db: &TestDb, name: &str) -> Option<Bson> {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("read queue")
        .expect("queue exists")
        .get("threads")
        .cloned()
}

async fn set_threads(db: &TestDb, name: &str, threads: i64) {
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"name": name}, doc! {"$set": {"threads": threads}})
        .await
        .expect("set threads");
}

/// `n` tasks of `queue` in `status`, in Disbatch 4's shape.
async fn add_tasks(db: &TestDb, queue: ObjectId, status: i32, n: usize) {
    let now = DateTime::now();
    let docs: Vec<Document> = (0..n)
        .map(|_| {
            doc! {"queue": queue, "status": status, "node": Bson::Null, "params": {},
            "ctime": now, "mtime": now, "stdout": Bson::Null, "stderr": Bson::Null}
        })
        .collect();
    db.tasks().insert_many(docs).await.expect("insert tasks");
}

fn ran(report: BalanceReport) -> BalanceRun {
    match report {
        BalanceReport::Ran(run) => run,
        other => panic!("expected a run as lease holder, got {other:?}"),
    }
}

fn change(queue: &str, from: i64, to: i64) -> ThreadChange {
    ThreadChange {
        queue: queue.to_string(),
        from: Some(from),
        to,
    }
}

#[tokio::test]
async fn one_of_two_nodes_balances_and_threads_follow_the_tiers() {
    let db = TestDb::new("qb_tiers").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let a = db.insert_queue("a", "echo", 1).await;
    let b = db.insert_queue("b", "echo", 1).await;
    let c = db.insert_queue("c", "echo", 0).await;
    add_tasks(&db, a, -2, 10).await;
    add_tasks(&db, b, -2, 1).await;
    add_tasks(&db, b, 0, 1).await;
    add_tasks(&db, c, -2, 3).await;
    // Never claimable: must not count as waiting (else a 3 and c 4 below).
    add_tasks(&db, c, -5, 1).await;
    add_tasks(&db, c, 1, 4).await;
    set_balance_document(
        &db,
        doc! {"max_tasks": {"* 00:00": 8}, "queues": [["a", "b"], ["c"]]},
    )
    .await;

    let mut n1 = balancer(&config);
    let mut n2 = balancer(&config);
    let now = DateTime::now();
    let run = ran(n1.run_once(&store, "n1", now).await.expect("n1"));
    // Total 8. The default tier (a, b) gives way to the 3 waiting in c: budget 5, split
    // 2 / 2, b capped at its 1 queued, the 2 left to a: a 4, b 1. Tier 1 gets
    // 8 - (max(0 running, 4) + max(1 running, 1)) = 3: c 3.
    assert_eq!(run.health, Health::Ok);
    assert_eq!(run.message, "QueueBalance is running");
    assert_eq!(run.max_tasks, Some(8));
    assert_eq!(run.changes, vec![change("a", 1, 4), change("c", 0, 3)]);
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(4)));
    assert_eq!(threads(&db, "b").await, Some(Bson::Int32(1)), "unchanged");
    assert_eq!(threads(&db, "c").await, Some(Bson::Int64(3)));
    let status = balance_document(&db).await;
    assert_eq!(status.get_str("status").ok(), Some("OK"));
    assert_eq!(
        status.get_str("message").ok(),
        Some("QueueBalance is running")
    );
    assert_eq!(status.get_i64("timestamp").ok(), Some(secs(now)));

    // The second node is refused the lease and writes nothing, not even over a change.
    assert_eq!(
        n2.run_once(&store, "n2", now).await.expect("n2"),
        BalanceReport::NotLeaseHolder
    );
    set_threads(&db, "a", 99).await;
    assert_eq!(
        n2.run_once(&store, "n2", plus(now, 1000))
            .await
            .expect("n2"),
        BalanceReport::NotLeaseHolder
    );
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(99)));
    assert_eq!(
        balance_document(&db).await.get_i64("timestamp").ok(),
        Some(secs(now))
    );
    // The holder renews and corrects it.
    let run = ran(n1
        .run_once(&store, "n1", plus(now, 1000))
        .await
        .expect("n1"));
    assert_eq!(run.changes, vec![change("a", 99, 4)]);
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(4)));
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "queuebalance"})
        .await
        .expect("read lease")
        .expect("lease exists");
    assert_eq!(lease.get_str("owner").ok(), Some("n1"));
    db.drop().await;
}

#[tokio::test]
async fn the_lease_moves_when_its_holder_stops_renewing_or_releases_it() {
    let db = TestDb::new("qb_lease").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    set_balance_document(&db, doc! {"max_tasks": {}, "queues": []}).await;
    let lease = Duration::from_secs(2);
    let mut n1 = Balancer::new(&config.balance).with_timing(Duration::ZERO, lease);
    let mut n2 = Balancer::new(&config.balance).with_timing(Duration::ZERO, lease);
    let t0 = DateTime::now();

    assert!(matches!(
        n1.run_once(&store, "n1", t0).await.expect("n1"),
        BalanceReport::Ran(_)
    ));
    assert_eq!(
        n2.run_once(&store, "n2", plus(t0, 1900)).await.expect("n2"),
        BalanceReport::NotLeaseHolder,
        "n1's lease runs until t0 + 2 s"
    );
    // n1 stops renewing; after its lease lapses n2 takes over and n1 is shut out.
    let run = ran(n2.run_once(&store, "n2", plus(t0, 2500)).await.expect("n2"));
    assert_eq!(run.health, Health::Ok);
    assert_eq!(
        balance_document(&db).await.get_i64("timestamp").ok(),
        Some(secs(plus(t0, 2500)))
    );
    assert_eq!(
        n1.run_once(&store, "n1", plus(t0, 3000)).await.expect("n1"),
        BalanceReport::NotLeaseHolder
    );
    // A holder that stops hands over at once.
    n2.release(&store, "n2").await;
    assert!(matches!(
        n1.run_once(&store, "n1", plus(t0, 3100)).await.expect("n1"),
        BalanceReport::Ran(_)
    ));
    assert_eq!(
        n2.run_once(&store, "n2", plus(t0, 3200)).await.expect("n2"),
        BalanceReport::NotLeaseHolder
    );
    db.drop().await;
}

#[tokio::test]
async fn pretend_mode_writes_only_the_status() {
    let db = TestDb::new("qb_pretend").await;
    let (store, config) = setup(&db, json!({"enabled": true, "pretend": true})).await;
    let a = db.insert_queue("a", "echo", 1).await;
    add_tasks(&db, a, -2, 5).await;
    let now = DateTime::now();
    let expired = secs(now) - 100;
    set_balance_document(
        &db,
        doc! {"max_tasks": {"* 00:00": 3}, "queues": [["a"]], "disabled": expired},
    )
    .await;

    let run = ran(balancer(&config)
        .run_once(&store, "n1", now)
        .await
        .expect("run"));
    assert_eq!(run.health, Health::Ok);
    assert_eq!(run.message, "QueueBalance is running (pretend)");
    assert_eq!(
        run.changes,
        vec![change("a", 1, 3)],
        "reported, not written"
    );
    assert_eq!(threads(&db, "a").await, Some(Bson::Int32(1)));
    let d = balance_document(&db).await;
    assert_eq!(d.get_str("status").ok(), Some("OK"));
    assert_eq!(
        d.get_str("message").ok(),
        Some("QueueBalance is running (pretend)")
    );
    assert_eq!(d.get_i64("timestamp").ok(), Some(secs(now)));
    assert_eq!(
        d.get_i64("disabled").ok(),
        Some(expired),
        "pretend does not clear it"
    );
    db.drop().await;
}

#[tokio::test]
async fn disabled_until_a_future_time_leaves_queues_alone_then_resumes() {
    let db = TestDb::new("qb_disabled").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let a = db.insert_queue("a", "echo", 1).await;
    add_tasks(&db, a, -2, 5).await;
    let now = DateTime::now();
    let until = secs(now) + 3600;
    set_balance_document(
        &db,
        doc! {"max_tasks": {"* 00:00": 3}, "queues": [["a"]], "disabled": until},
    )
    .await;
    let mut b = balancer(&config).with_utc_offset(2 * 3600);

    let run = ran(b.run_once(&store, "n1", now).await.expect("run"));
    let expected = format!(
        "QueueBalance disabled until {}",
        LocalTime::from_unix(until, 2 * 3600)
    );
    assert!(expected.ends_with("+02:00"), "{expected}");
    assert_eq!(run.health, Health::Ok);
    assert_eq!(run.message, expected);
    assert!(run.changes.is_empty());
    assert_eq!(threads(&db, "a").await, Some(Bson::Int32(1)));
    let d = balance_document(&db).await;
    assert_eq!(d.get_str("status").ok(), Some("OK"));
    assert_eq!(d.get_str("message").ok(), Some(expected.as_str()));

    // Once the time has passed, balancing resumes and the setting is cleared.
    let later = plus(now, 3601 * 1000);
    let run = ran(b.run_once(&store, "n1", later).await.expect("run"));
    assert_eq!(run.message, "QueueBalance is running");
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(3)));
    assert_eq!(
        balance_document(&db).await.get("disabled"),
        Some(&Bson::Null)
    );
    db.drop().await;
}

#[tokio::test]
async fn unknown_queues_warn_and_the_others_are_still_balanced() {
    let db = TestDb::new("qb_unknown").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let a = db.insert_queue("a", "echo", 0).await;
    add_tasks(&db, a, -2, 5).await;
    set_balance_document(
        &db,
        doc! {"max_tasks": {"* 00:00": 2}, "queues": [["a", "ghost"], ["phantom"]]},
    )
    .await;

    let run = ran(balancer(&config)
        .run_once(&store, "n1", DateTime::now())
        .await
        .expect("run"));
    assert_eq!(run.health, Health::Warning);
    assert_eq!(
        run.message,
        "QueueBalance is running; unknown queues in the balance document were skipped: ghost, phantom"
    );
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(2)));
    let d = balance_document(&db).await;
    assert_eq!(d.get_str("status").ok(), Some("WARNING"));
    assert_eq!(d.get_str("message").ok(), Some(run.message.as_str()));
    db.drop().await;
}

#[tokio::test]
async fn a_misconfigured_document_is_critical_and_changes_nothing() {
    let db = TestDb::new("qb_critical").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    db.insert_queue("a", "echo", 1).await;
    set_balance_document(&db, doc! {"max_tasks": {"* 00:00": 2}, "queues": ["a"]}).await;

    let run = ran(balancer(&config)
        .run_once(&store, "n1", DateTime::now())
        .await
        .expect("a bad document is a status, not an error"));
    assert_eq!(run.health, Health::Critical);
    assert_eq!(
        run.message,
        "QueueBalance: queues must be an array of arrays of queue names"
    );
    assert_eq!(threads(&db, "a").await, Some(Bson::Int32(1)));
    assert_eq!(
        balance_document(&db).await.get_str("status").ok(),
        Some("CRITICAL")
    );
    db.drop().await;
}

#[tokio::test]
async fn paused_queues_keep_their_pause() {
    let db = TestDb::new("qb_paused").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let a = db.insert_queue("a", "echo", 5).await;
    let b = db.insert_queue("b", "echo", 1).await;
    add_tasks(&db, a, -2, 5).await;
    add_tasks(&db, b, -2, 5).await;
    assert!(store.queues().pause_queue(a).await.expect("pause"));
    set_balance_document(
        &db,
        doc! {"max_tasks": {"* 00:00": 6}, "queues": [["a", "b"]]},
    )
    .await;

    let run = ran(balancer(&config)
        .run_once(&store, "n1", DateTime::now())
        .await
        .expect("run"));
    // a waits for nothing while paused: 6 over a and b, a capped at 0, b at its 5 queued.
    assert_eq!(run.paused, vec!["a".to_string()]);
    assert_eq!(run.changes, vec![change("b", 1, 5)]);
    assert_eq!(threads(&db, "a").await, Some(Bson::Int32(0)));
    assert_eq!(threads(&db, "b").await, Some(Bson::Int64(5)));
    let queue_a = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"_id": a})
        .await
        .expect("read a")
        .expect("a exists");
    assert_eq!(queue_a.get_i32("paused_threads").ok(), Some(5));
    db.drop().await;
}

#[tokio::test]
async fn off_in_the_config_does_nothing_and_on_is_rate_limited() {
    let db = TestDb::new("qb_off").await;
    let (store, config) = setup(&db, json!({"enabled": false})).await;
    let now = DateTime::now();
    assert_eq!(
        Balancer::new(&config.balance)
            .run_once(&store, "n1", now)
            .await
            .expect("off"),
        BalanceReport::Off
    );
    for collection in ["balance", "leases"] {
        let n = db
            .db
            .collection::<Document>(collection)
            .count_documents(doc! {})
            .await
            .expect("count");
        assert_eq!(n, 0, "nothing written to {collection}");
    }

    // Enabled with the default interval (10 s): one attempt per interval. With no balance
    // document yet, the first run creates it in Disbatch's empty shape.
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let mut b = Balancer::new(&config.balance);
    assert!(matches!(
        b.run_once(&store, "n1", now).await.expect("run"),
        BalanceReport::Ran(_)
    ));
    let d = balance_document(&db).await;
    assert_eq!(d.get_document("max_tasks").ok(), Some(&doc! {}));
    assert_eq!(d.get_array("queues").map(Vec::len).ok(), Some(0));
    assert_eq!(d.get_str("status").ok(), Some("OK"));
    assert_eq!(
        b.run_once(&store, "n1", plus(now, 9_000))
            .await
            .expect("run"),
        BalanceReport::NotDue
    );
    assert!(matches!(
        b.run_once(&store, "n1", plus(now, 10_000))
            .await
            .expect("run"),
        BalanceReport::Ran(_)
    ));
    db.drop().await;
}

#[tokio::test]
async fn tick_balances_now_for_the_node_loop() {
    let db = TestDb::new("qb_tick").await;
    let (store, config) = setup(&db, json!({"enabled": true})).await;
    let a = db.insert_queue("a", "echo", 0).await;
    add_tasks(&db, a, -2, 2).await;
    set_balance_document(&db, doc! {"max_tasks": {"* 00:00": 7}, "queues": [["a"]]}).await;
    let mut b = Balancer::new(&config.balance);
    let before = secs(DateTime::now());
    b.tick(&store, "n1").await;
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(2)));
    let d = balance_document(&db).await;
    assert_eq!(d.get_str("status").ok(), Some("OK"));
    let stamp = d.get_i64("timestamp").expect("timestamp");
    assert!(
        stamp >= before && stamp <= before + 5,
        "{stamp} vs {before}"
    );
    // The next pass (a second later in the node loop) is not due: nothing is written.
    set_threads(&db, "a", 50).await;
    b.tick(&store, "n1").await;
    assert_eq!(threads(&db, "a").await, Some(Bson::Int64(50)));
    b.release(&store, "n1").await;
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "queuebalance"})
        .await
        .expect("read lease")
        .expect("lease exists");
    assert_eq!(
        lease.get_datetime("until").ok(),
        Some(&DateTime::from_millis(0))
    );
    db.drop().await;
}

/// The whole path: a DEN with balancing enabled writes the queue's threads and a fresh status.
#[tokio::test]
async fn a_den_with_balancing_enabled_balances_its_queues() {
    let db = TestDb::new("bal_den").await;
    let config = disbatch_tests::write_config(
        &db,
        "node.json",
        serde_json::json!({"balance": {"enabled": true}, "monitoring": true}),
    );
    let queue = db.insert_queue("bq", "echo", 0).await;
    db.insert_tasks(
        queue,
        (0..10)
            .map(|_| bson::doc! {"sleep_ms": 100}.into())
            .collect(),
    )
    .await;
    db.db
        .collection::<bson::Document>("balance")
        .insert_one(bson::doc! {"max_tasks": {"* 00:00": 3}, "queues": [["bq"]]})
        .await
        .expect("balance doc");
    let den = disbatch_tests::Den::start(&config, "n1");
    disbatch_tests::wait_for(
        "the balancer to set threads",
        std::time::Duration::from_secs(30),
        || async {
            let q = db
                .db
                .collection::<bson::Document>("queues")
                .find_one(bson::doc! {"_id": queue})
                .await
                .ok()
                .flatten();
            q.and_then(|q| {
                q.get_i64("threads")
                    .ok()
                    .or(q.get_i32("threads").ok().map(i64::from))
            }) == Some(3)
        },
    )
    .await;
    let dci = disbatch_tests::Dci::start(&config);
    let (_, monitoring) = dci.get("/monitoring").await;
    assert_eq!(
        monitoring["queuebalance"]["status"],
        serde_json::json!("OK"),
        "{monitoring}"
    );
    drop(den);
    db.drop().await;
}
