//! What an idle node costs the server, counted by a proxy in front of it per heartbeat (each
//! maintenance pass writes one; a count of passes is the cause, a clock is not): a lone node,
//! which leads the fleet's maintenance and holds its stream, with an open queue and nothing
//! queued, leased or delayed, sends at most 2 requests a pass, everything the server sees
//! included (the driver's monitoring too). Before the leader's stream saw task inserts and
//! its recovery read only when a lease could have passed, it sent 3 or more.

use std::time::Duration;

use bson::doc;
use disbatch_model::status;
use disbatch_tests::bench::proxy::{HostUri, Proxy};
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// One heartbeat per maintenance pass.
const HEARTBEAT: &str = "findAndModify nodes";

// Multi-threaded: the proxy relays on this runtime while `Den::start` blocks a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leader_sends_at_most_two_requests_a_pass() {
    let db = TestDb::new("idle_cost").await;
    let server = HostUri::parse(&db.uri).expect("the test server's URI");
    let proxy = Proxy::start(server.host.clone()).await.expect("the proxy");
    let config = write_config(
        &db,
        "node.json",
        json!({"mongohost": server.with_host(&proxy.addr.to_string())}),
    );
    db.insert_queue("open", "echo", 2).await;
    let den = Den::start(&config, "n1");
    let heartbeats = |c: &disbatch_tests::bench::proxy::Counts| -> u64 {
        c.app.values().filter_map(|by| by.get(HEARTBEAT)).sum()
    };
    // Settled: leading, its stream open, and past the first passes' readings.
    wait_for("the leader settled", Duration::from_secs(60), || async {
        den.metric("disbatch_den_change_streams_open").await == 1.0
            && heartbeats(&proxy.snapshot()) >= 30
    })
    .await;
    let start = proxy.snapshot();
    wait_for("200 more passes", Duration::from_secs(300), || async {
        heartbeats(&proxy.snapshot().since(&start)) >= 200
    })
    .await;
    let counted = proxy.snapshot().since(&start);
    let passes = heartbeats(&counted);
    let total = counted.app_total() + counted.monitoring_total();
    let per_pass = total as f64 / passes as f64;
    println!(
        "{total} requests in {passes} passes ({per_pass:.2} a pass): app {:?}, monitoring {:?}",
        counted.app, counted.monitoring
    );
    assert!(
        per_pass <= 2.0,
        "{per_pass:.2} requests a pass: app {:?}, monitoring {:?}",
        counted.app,
        counted.monitoring
    );
    drop(den);
    db.drop().await;
}

/// A busy node does not read an open queue found empty at each of its passes (SecantusDB: a
/// read of it beside a deep queue cost 191–377 ms), yet finds what comes there: a task made
/// through the API (its signal), one inserted directly (the leader's probe signals it), one
/// set back to queued by hand (no signal: the mark's age).
#[tokio::test]
async fn an_empty_queue_beside_a_busy_one_is_not_read_each_pass_and_still_finds_new_work() {
    let db = TestDb::new("empty_beside_deep").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 1000}));
    let deep = db.insert_queue("deep", "echo", 2).await;
    let empty = db.insert_queue("empty", "echo", 2).await;
    let backlog = db
        .insert_tasks(deep, (0..400).map(|i| doc! {"i": i}.into()).collect())
        .await;
    let den = disbatch_tests::Den::start(&config, "n1");
    db.wait_complete(&backlog, Duration::from_secs(300)).await;
    let passes = den.passes().await;
    let reads = den
        .metric("disbatch_den_claim_misses_total{queue=\"empty\",reason=\"empty\"}")
        .await;
    let skipped = den
        .metric("disbatch_den_claim_misses_total{queue=\"empty\",reason=\"known_empty\"}")
        .await;
    println!("{passes} passes; the empty queue read {reads} times, skipped {skipped} times");
    // Every pass of a node that runs 400 short tasks two at a time claims; the empty queue is
    // read again only when signalled (the backlog's insert) or ten intervals on.
    assert!(skipped > 0.0, "{passes} passes, {reads} reads");
    assert!(
        reads * 4.0 <= passes,
        "the empty queue was read {reads} times in {passes} passes"
    );

    let dci = disbatch_tests::Dci::start(&config);
    let (code, body) = dci
        .post(
            "/tasks",
            json!({"queue": "empty", "params": [{"via": "api"}]}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let direct = db
        .insert_tasks(empty, vec![doc! {"via": "direct"}.into()])
        .await;
    db.wait_complete(&direct, Duration::from_secs(60)).await;
    let by_api = db
        .tasks()
        .find_one(doc! {"params.via": "api", "status": 1})
        .await
        .expect("find");
    assert!(by_api.is_some(), "the API's task ran");
    // By hand, with no signal: read again once the mark is ten intervals old.
    db.set_task(
        direct[0],
        doc! {"status": -2, "node": null, "complete": null},
    )
    .await;
    disbatch_tests::wait_for(
        "the task queued again by hand to run",
        Duration::from_secs(120),
        || async { db.task(direct[0]).await.get_i32("status").ok() == Some(status::SUCCEEDED) },
    )
    .await;
    drop((dci, den));
    db.drop().await;
}
