//! Documents no BSON reader can decode (invalid UTF-8 from an old writer; made here by a proxy
//! that corrupts a marker on the way back, since the test server refuses to store them): each
//! is left out or failed with its reason, logged once and counted, and the rest runs.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::faults::corrupting_proxy::{CorruptingProxy, MARKER};
use disbatch_tests::hostile::{crashes, get_request, raw_http, wait_done, LoggedDci};
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::{json, Value};

// Multi-threaded: the proxy runs in this runtime, and `Den::stop` blocks its thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_documents_are_skipped_or_failed_and_the_rest_runs() {
    let db = TestDb::new("hostile_undecodable").await;
    let proxy = CorruptingProxy::start(&db.uri).await;
    let good = db.insert_queue("good", "echo", 4).await;
    let bad_queue = db.insert_queue(&format!("q-{MARKER}"), "echo", 2).await;
    let waiting = db
        .insert_tasks(bad_queue, vec![Bson::from(doc! {"n": 1})])
        .await[0];
    let bad_task = db
        .insert_tasks(good, vec![Bson::from(doc! {"text": MARKER})])
        .await[0];
    let good_tasks = db
        .insert_tasks(good, (0..20).map(|n| Bson::from(doc! {"n": n})).collect())
        .await;
    db.insert_node(&format!("n-{MARKER}"), Duration::ZERO).await;

    let config = write_config(
        &db,
        "den.json",
        json!({"mongohost": proxy.uri, "metrics_listen": "127.0.0.1:0"}),
    );
    let mut den = Den::start(&config, "undecodable-node");
    wait_done(&db, &mut den, &good_tasks, Duration::from_secs(60)).await;
    wait_for(
        "the undecodable task failed",
        Duration::from_secs(30),
        || {
            let db = &db;
            async move { db.task(bad_task).await.get_i32("status") == Ok(status::FAILED) }
        },
    )
    .await;
    let task = db.task(bad_task).await;
    let stderr = task.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.contains("cannot be decoded") && stderr.contains("utf"),
        "{stderr}"
    );
    assert_eq!(task.get_bool("complete"), Ok(true));
    // The queue that cannot be read is never served: its task waits through three more
    // readings of the queues.
    den.wait_queue_reads(3).await;
    assert_eq!(db.task(waiting).await.get_i32("status"), Ok(status::QUEUED));

    check_the_den_logged_and_counted_each_once(&den, bad_queue, bad_task).await;

    // The DCI through the same proxy: lists leave the odd documents out, a lookup of one
    // says why, and nothing else is affected.
    let web = write_config(&db, "web.json", json!({"mongohost": proxy.uri}));
    let mut dci = LoggedDci::start(&web, &db.path("dci.log"));
    check_the_dci_leaves_them_out_of_lists_and_says_why(&mut dci, bad_queue, bad_task).await;
    den.stop();
    db.drop().await;
}

async fn check_the_den_logged_and_counted_each_once(
    den: &Den,
    bad_queue: ObjectId,
    bad_task: ObjectId,
) {
    let log = den.log_text();
    let lines = |id: &str| {
        log.lines()
            .filter(|l| l.contains("document skipped") && l.contains(id))
            .count()
    };
    assert_eq!(
        lines(&bad_queue.to_hex()),
        1,
        "the queue, logged once:\n{log}"
    );
    assert_eq!(
        lines(&bad_task.to_hex()),
        1,
        "the task, logged once:\n{log}"
    );
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("pass failed")).collect();
    assert!(failed.is_empty(), "passes failed:\n{}", failed.join("\n"));
    assert_eq!(crashes(&log), Vec::<String>::new(), "DEN log:\n{log}");
    let skipped = |collection: &str| {
        format!(
            r#"disbatch_den_documents_skipped_total{{collection="{collection}",reason="undecodable"}}"#
        )
    };
    assert!(den.metric(&skipped("queues")).await >= 1.0);
    assert_eq!(den.metric(&skipped("tasks")).await, 1.0);
}

async fn check_the_dci_leaves_them_out_of_lists_and_says_why(
    dci: &mut LoggedDci,
    bad_queue: ObjectId,
    bad_task: ObjectId,
) {
    let get = |target: String| {
        let addr = dci.addr;
        async move {
            raw_http(addr, &get_request(&target), Duration::from_secs(30))
                .await
                .expect("an answer")
        }
    };
    let queues = get("/queues".into()).await;
    assert_eq!(queues.status, 200, "{}", queues.text());
    let names: Vec<Value> = serde_json::from_slice::<Value>(&queues.body)
        .expect("JSON")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|q| q["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("good")]);
    for target in ["/nodes", "/summary", "/tasks?queue=good&.limit=100"] {
        let r = get(target.into()).await;
        assert_eq!(r.status, 200, "{target}: {}", r.text());
    }
    let metrics = get("/metrics".into()).await;
    assert!(
        metrics.text().contains("\ndisbatch_up 1\n"),
        "{}",
        metrics.text()
    );
    assert!(
        metrics
            .text()
            .contains("disbatch_web_documents_skipped_total{collection=\"queues\""),
        "{}",
        metrics.text()
    );
    for target in [format!("/queues/{bad_queue}"), format!("/tasks/{bad_task}")] {
        let r = get(target.clone()).await;
        assert_eq!(r.status, 409, "{target}: {}", r.text());
        assert!(
            r.text().contains("cannot be decoded"),
            "{target}: {}",
            r.text()
        );
    }
    let dci_log = dci.log_text();
    assert!(dci.is_running(), "the DCI exited:\n{dci_log}");
    assert_eq!(
        crashes(&dci_log),
        Vec::<String>::new(),
        "DCI log:\n{dci_log}"
    );
}
