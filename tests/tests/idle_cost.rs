//! What an idle node costs the server, counted by a proxy in front of it per heartbeat (each
//! maintenance pass writes one; a count of passes is the cause, a clock is not): a lone node,
//! which leads the fleet's maintenance and holds its stream, with an open queue and nothing
//! queued, leased or delayed, sends at most 2 requests a pass, everything the server sees
//! included (the driver's monitoring too). Before the leader's stream saw task inserts and
//! its recovery read only when a lease could have passed, it sent 3 or more.

use std::time::Duration;

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
