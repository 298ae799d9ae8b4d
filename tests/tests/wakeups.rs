//! Event-driven claims with a real node: a task queued into an idle fleet starts on the
//! change stream's event, not at the next timer pass.

use std::time::{Duration, Instant};

use bson::doc;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_task_queued_into_an_idle_node_starts_without_waiting_for_the_timer() {
    let db = TestDb::new("wakeups").await;
    // Maintenance every 10 s: polling alone would make a task wait 5 s on average.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 10_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start(&config, "n1");
    wait_for("the change streams", Duration::from_secs(30), || async {
        den.log_text().contains("watching tasks and queues")
    })
    .await;
    // Let the first maintenance pass go by, so only events can start the tasks below.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut latencies = Vec::new();
    for _ in 0..5 {
        let queued = Instant::now();
        let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
        db.wait_complete(&[id], Duration::from_secs(5)).await;
        latencies.push(queued.elapsed());
        let a = db.attempts(id).await;
        let start = a[0]
            .get_datetime("start")
            .expect("start")
            .timestamp_millis();
        let ctime = db
            .task(id)
            .await
            .get_datetime("ctime")
            .expect("ctime")
            .timestamp_millis();
        println!("enqueue → plugin start {} ms", start - ctime);
    }
    latencies.sort();
    println!("enqueue → complete: {latencies:?}");
    assert!(
        latencies[4] < Duration::from_secs(2),
        "each task ran within 2 s of being queued, not at the 10 s timer: {latencies:?}"
    );
    drop(den);
    db.drop().await;
}
