//! The fleet's maintenance runs on one elected node: only the holder of the `maintenance`
//! lease recovers lost tasks, and when it dies another node takes over within a lease.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::wait_leader;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// The maintenance lease as stored: (owner, until in ms).
async fn lease(db: &TestDb) -> Option<(String, i64)> {
    let lease = db
        .db
        .collection::<Document>("leases")
        .find_one(doc! {"_id": "maintenance"})
        .await
        .expect("lease")?;
    let owner = lease.get_str("owner").ok()?.to_string();
    Some((owner, lease.get_datetime("until").ok()?.timestamp_millis()))
}

/// The maintenance lease at 100 ms passes: 15 intervals (den/src/node.rs).
const LEASE_MS: i64 = 1_500;

/// A running task whose lease passed long ago, on a node that is gone.
async fn lost_task(db: &TestDb, queue: ObjectId) -> ObjectId {
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 60_000);
    db.set_task(
        id,
        doc! {"status": 0, "node": "gone", "lease_until": past, "attempts": 1,
        "attempt": ObjectId::new(), "mtime": past},
    )
    .await;
    id
}

#[tokio::test]
async fn one_node_leads_maintenance_and_another_takes_over_when_it_dies() {
    let db = TestDb::new("maintenance_leader").await;
    let config = write_config(&db, "node.json", json!({}));
    // Lease 3 s: a node recovers only after a lease plus 5 s of its own connection.
    let queue = db.insert_queue("q", "echo", 0).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"lease": 3.0}})
        .await
        .expect("lease");
    let mut dens: Vec<Den> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| Den::start(&config, n))
        .collect();
    let first = wait_leader(&db, None, Duration::from_secs(30)).await;
    let first_task = lost_task(&db, queue).await;
    wait_for(
        "the leader to recover the task",
        Duration::from_secs(30),
        || async { db.task(first_task).await.get_i32("status").ok() == Some(status::ORPHANED) },
    )
    .await;
    let recovered_by = |den: &Den| {
        den.log_text()
            .matches("recovered a task whose lease passed")
            .count()
    };
    // The log line follows the write that recovered the task, by a moment or, on a busy
    // machine, by more.
    let leader_den = dens
        .iter()
        .position(|d| d.node == first)
        .expect("leader is one of ours");
    wait_for("the leader's log line", Duration::from_secs(30), || async {
        recovered_by(&dens[leader_den]) > 0
    })
    .await;
    let by_node: Vec<(String, usize)> = dens
        .iter()
        .map(|d| (d.node.clone(), recovered_by(d)))
        .collect();
    for (node, n) in &by_node {
        let expected = usize::from(*node == first);
        assert_eq!(
            *n, expected,
            "only the leader {first} recovers: {by_node:?}"
        );
    }
    let leading: Vec<&str> = dens
        .iter()
        .filter(|d| d.log_text().contains("leading the fleet's maintenance"))
        .map(|d| d.node.as_str())
        .collect();
    assert_eq!(leading, [first.as_str()], "one leader");

    // The leader dies without handing over: another node leads once its lease (1.5 s at
    // these 100 ms passes) has lapsed, and recovers what is lost from then on.
    dens[leader_den].kill_hard();
    let killed = Instant::now();
    let (owner, dead_until) = lease(&db).await.expect("the dead leader's lease");
    assert_eq!(owner, first);
    // The dead leader set `until` at its last renewal, before now: at most one lease ahead.
    let ahead = dead_until - DateTime::now().timestamp_millis();
    assert!(
        ahead <= LEASE_MS,
        "the lease reaches {ahead} ms ahead, longer than {LEASE_MS} ms"
    );
    let second = wait_leader(&db, Some(&first), Duration::from_secs(30)).await;
    println!(
        "maintenance leader {first} killed; {second} leads after {:?}",
        killed.elapsed()
    );
    // Taken only once the dead leader's lease had lapsed: the new one runs from then.
    let (_, new_until) = lease(&db).await.expect("the new leader's lease");
    assert!(
        new_until >= dead_until + LEASE_MS,
        "{second}'s lease (until {new_until}) was taken before {first}'s lapsed at {dead_until}"
    );
    let second_task = lost_task(&db, queue).await;
    wait_for(
        "the new leader to recover the task",
        Duration::from_secs(30),
        || async { db.task(second_task).await.get_i32("status").ok() == Some(status::ORPHANED) },
    )
    .await;
    let new_leader = dens.iter().find(|d| d.node == second).expect("new leader");
    wait_for(
        "the new leader's log line",
        Duration::from_secs(30),
        || async { recovered_by(new_leader) > 0 },
    )
    .await;
    assert_eq!(recovered_by(new_leader), 1, "{}", new_leader.log_text());
    drop(dens);
    db.drop().await;
}

/// A leader that is slow (here: stopped for longer than a schedule's grace, within its lease)
/// enqueues the ticks of its own term however late: before, it dropped those past the grace
/// as missed, with no other node to blame. Only a gap in leadership misses ticks.
#[tokio::test]
async fn a_slow_leader_drops_no_tick_of_its_own_term() {
    use futures::TryStreamExt;
    let db = TestDb::new("slow_leader_ticks").await;
    // Grace 5 s (five intervals), lease 15 s.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 1000}));
    let queue = db.insert_queue("cron", "echo", 2).await;
    db.set_queue(queue, doc! {"schedule": "* * * * * *"}).await;
    let den = Den::start(&config, "n1");
    let metric = |outcome: &str| {
        format!("disbatch_den_schedule_ticks_total{{outcome=\"{outcome}\",queue=\"cron\"}}")
    };
    wait_for("two ticks enqueued", Duration::from_secs(60), || async {
        den.metric(&metric("enqueued")).await >= 2.0
    })
    .await;
    let pid = den.pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    // The condition under test, not a bound: seven seconds without a pass, past the grace.
    std::thread::sleep(Duration::from_secs(7));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    let resumed = DateTime::now().timestamp_millis();
    let tick_times = || async {
        let tasks: Vec<Document> = db
            .tasks()
            .find(doc! {"queue": queue})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("read");
        let mut ticks: Vec<i64> = tasks
            .iter()
            .filter_map(|t| t.get_datetime("schedule_tick").ok())
            .map(|t| t.timestamp_millis())
            .collect();
        ticks.sort();
        ticks
    };
    wait_for("ticks past the stop", Duration::from_secs(60), || async {
        tick_times()
            .await
            .last()
            .is_some_and(|t| *t > resumed + 1000)
    })
    .await;
    assert_eq!(
        lease(&db).await.map(|(owner, _)| owner).as_deref(),
        Some("n1"),
        "still the leader"
    );
    let ticks = tick_times().await;
    let gaps: Vec<(i64, i64)> = ticks
        .windows(2)
        .filter(|w| w[1] - w[0] != 1000)
        .map(|w| (w[0], w[1]))
        .collect();
    assert_eq!(gaps, Vec::<(i64, i64)>::new(), "every second has its task");
    assert_eq!(
        den.metric(&metric("skipped")).await,
        0.0,
        "{}",
        den.log_text()
    );
    drop(den);
    db.drop().await;
}
