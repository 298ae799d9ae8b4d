//! `disbatch-web` black-box: `/nodes`, success shapes and every documented error.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::api::{assert_sorted_keys, error, update_result};
use disbatch_tests::api_calls::raw_json;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn nodes_list_a_live_den_with_ids_millisecond_timestamps_and_running_counts() {
    let db = TestDb::new("api_nodes").await;
    let config = write_config(&db, "node.json", json!({}));
    // A node that stopped long ago, with two tasks it still holds; sorts before n1.
    let stale = db.insert_node("m0", Duration::from_secs(600)).await;
    let queue = db.insert_queue("paused", "echo", 0).await;
    let held = db
        .insert_tasks(
            queue,
            vec![
                doc! {"a": 1}.into(),
                doc! {"a": 2}.into(),
                doc! {"a": 3}.into(),
            ],
        )
        .await;
    db.set_task(held[0], doc! {"status": 0, "node": "m0"}).await;
    db.set_task(held[1], doc! {"status": -1, "node": "m0"})
        .await;
    db.set_task(held[2], doc! {"status": 1, "node": "m0"}).await;

    let den = Den::start(&config, "n1");
    let nodes = db.db.collection::<Document>("nodes");
    wait_for("the DEN's first heartbeat", Duration::from_secs(20), || {
        let nodes = nodes.clone();
        async move {
            nodes
                .count_documents(doc! {"node": "n1"})
                .await
                .unwrap_or(0)
                == 1
        }
    })
    .await;
    let n1 = db.node("n1").await;
    let n1_id = n1.get_object_id("_id").expect("node id");

    let dci = Dci::start(&config);
    let (status, list) = dci.get("/nodes").await;
    assert_eq!(status, 200, "{list}");
    assert_sorted_keys(&list);
    let list = list.as_array().expect("array").clone();
    assert_eq!(list.len(), 2, "{list:?}");
    assert_eq!(list[0]["node"], "m0", "sorted by node");
    assert_eq!(list[1]["node"], "n1");

    let m0 = &list[0];
    assert_eq!(m0["_id"], json!({"$oid": stale.to_hex()}));
    assert_eq!(m0["id"], stale.to_hex());
    assert_eq!(m0["live"], false);
    assert_eq!(m0["running"], 2, "claimed and running tasks of m0");
    let now = DateTime::now().timestamp_millis();
    let ts = m0["timestamp"].as_i64().expect("integer ms timestamp");
    assert!((now - 600_000 - ts).abs() < 30_000, "{ts} vs {now}");

    let live = &list[1];
    assert_eq!(live["_id"], json!({"$oid": n1_id.to_hex()}));
    assert_eq!(live["id"], n1_id.to_hex());
    assert_eq!(live["live"], true, "{live}");
    assert_eq!(live["running"], 0);
    let ts = live["timestamp"].as_i64().expect("integer ms timestamp");
    assert!((now - ts).abs() < 15_000, "{ts} vs {now}");
    assert!(live.get("maxthreads").is_none(), "{live}");

    let (status, by_name) = dci.get("/nodes/n1").await;
    assert_eq!(status, 200, "{by_name}");
    assert_eq!(by_name["id"], n1_id.to_hex());
    assert_eq!(by_name["node"], "n1");
    assert_eq!(by_name["live"], true);
    let (status, by_id) = dci.get(&format!("/nodes/{}", stale.to_hex())).await;
    assert_eq!(status, 200, "{by_id}");
    assert_eq!(by_id["node"], "m0");
    assert_eq!(by_id["running"], 2);

    let (status, body) = dci.get("/nodes/nosuch").await;
    assert_eq!((status, body), (404, error("no node nosuch")));
    let unknown = ObjectId::new().to_hex();
    let (status, body) = dci.get(&format!("/nodes/{unknown}")).await;
    assert_eq!((status, body), (404, error(&format!("no node {unknown}"))));

    drop(den);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn liveness_follows_the_configured_window() {
    let db = TestDb::new("api_nodes_live").await;
    db.insert_node("slow", Duration::from_secs(20)).await;
    let dci = Dci::start(&write_config(&db, "default.json", json!({})));
    let (status, node) = dci.get("/nodes/slow").await;
    assert_eq!(status, 200, "{node}");
    assert_eq!(
        node["live"], false,
        "20 s is outside the default 15 s window"
    );
    drop(dci);
    let config = write_config(&db, "wide.json", json!({"web": {"live_window_ms": 60000}}));
    let dci = Dci::start(&config);
    let (_, node) = dci.get("/nodes/slow").await;
    assert_eq!(node["live"], true, "inside a 60 s window");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn node_maxthreads_is_set_cleared_and_validated() {
    let db = TestDb::new("api_maxthreads").await;
    let config = write_config(&db, "web.json", json!({}));
    let id = db.insert_node("n0", Duration::ZERO).await;
    let dci = Dci::start(&config);
    let maxthreads = || async { db.node("n0").await.get("maxthreads").cloned() };

    let (status, body) = dci.post("/nodes/n0", json!({"maxthreads": 3})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(maxthreads().await, Some(Bson::Int64(3)));
    let (_, node) = dci.get("/nodes/n0").await;
    assert_eq!(node["maxthreads"], 3);
    // The same value again matches without modifying: still 200.
    let (status, body) = dci.post("/nodes/n0", json!({"maxthreads": 3})).await;
    assert_eq!((status, body), (200, update_result(1, 0)));

    let (status, body) = dci
        .post(
            &format!("/nodes/{}", id.to_hex()),
            json!({"maxthreads": null}),
        )
        .await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(maxthreads().await, Some(Bson::Null));

    // Form-encoded (the CLI of Disbatch): the digit string is accepted and stored as a number.
    let (status, _, body) = raw_json(
        &dci,
        Method::POST,
        "/nodes/n0",
        Some("application/x-www-form-urlencoded"),
        "maxthreads=5",
    )
    .await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(maxthreads().await, Some(Bson::Int64(5)));
    // A JSON digit string too.
    let (status, body) = dci.post("/nodes/n0", json!({"maxthreads": "0"})).await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(maxthreads().await, Some(Bson::Int64(0)));

    let (status, body) = dci.post("/nodes/n0", json!({})).await;
    assert_eq!((status, body), (400, error("No params")));
    let (status, _, body) = raw_json(
        &dci,
        Method::POST,
        "/nodes/n0",
        Some("application/json"),
        "",
    )
    .await;
    assert_eq!((status, body), (400, error("No params")));
    let (status, body) = dci
        .post("/nodes/n0", json!({"maxthreads": 1, "threads": 2}))
        .await;
    assert_eq!(
        (status, body),
        (400, json!({"error": "Invalid param", "param": "threads"}))
    );
    for bad in [
        json!(-1),
        json!("x"),
        json!(1.5),
        json!(""),
        json!("-2"),
        json!([1]),
        json!(true),
    ] {
        let (status, body) = dci.post("/nodes/n0", json!({"maxthreads": bad})).await;
        assert_eq!(
            (status, body),
            (
                400,
                error("maxthreads must be a non-negative integer or null")
            ),
            "maxthreads {bad}"
        );
    }
    assert_eq!(
        maxthreads().await,
        Some(Bson::Int64(0)),
        "errors change nothing"
    );

    let (status, body) = dci.post("/nodes/nosuch", json!({"maxthreads": 1})).await;
    assert_eq!((status, body), (404, error("no node nosuch")));
    assert_eq!(
        db.db
            .collection::<Document>("nodes")
            .count_documents(doc! {})
            .await
            .expect("count"),
        1,
        "no node was created"
    );
    drop(dci);
    db.drop().await;
}

/// A node whose loop interval is longer than the DCI's live window is live between two of
/// its heartbeats: its document records the interval, `DELETE` refuses to forget it, and the
/// `maxthreads` ops set on it stays.
#[tokio::test]
async fn a_node_with_a_long_loop_interval_is_not_forgotten_between_heartbeats() {
    let db = TestDb::new("api_nodes_interval").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 30_000}));
    let den = Den::start(&config, "slow");
    let nodes = db.db.collection::<Document>("nodes");
    wait_for("the DEN's first heartbeat", Duration::from_secs(20), || {
        let nodes = nodes.clone();
        async move {
            nodes
                .count_documents(doc! {"node": "slow"})
                .await
                .unwrap_or(0)
                == 1
        }
    })
    .await;
    let node = db.node("slow").await;
    assert_eq!(
        node.get("interval_ms"),
        Some(&Bson::Int64(30_000)),
        "{node}"
    );
    // 20 s since its last heartbeat: past the 15 s window, within its 30 s interval.
    nodes
        .update_one(
            doc! {"node": "slow"},
            doc! {"$set": {"maxthreads": 3_i64, "timestamp": DateTime::from_millis(DateTime::now().timestamp_millis() - 20_000)}},
        )
        .await
        .expect("age the heartbeat");
    let dci = Dci::start(&config);
    let (status, list) = dci.get("/nodes").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list[0]["live"], true, "{list}");
    let (status, body) = dci.send(Method::DELETE, "/nodes/slow", json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e
            .contains("it is live (heartbeat within the last 90000 ms, 3 of its loop intervals)")),
        "{body}"
    );
    assert_eq!(
        db.node("slow").await.get("maxthreads"),
        Some(&Bson::Int64(3)),
        "the node and its maxthreads are kept"
    );
    // Past three of its intervals it is stale (stopped, so no heartbeat comes meanwhile).
    drop(den);
    nodes
        .update_one(
            doc! {"node": "slow"},
            doc! {"$set": {"timestamp": DateTime::from_millis(DateTime::now().timestamp_millis() - 100_000)}},
        )
        .await
        .expect("age the heartbeat more");
    let (status, list) = dci.get("/nodes").await;
    assert_eq!((status, &list[0]["live"]), (200, &json!(false)), "{list}");
    drop(dci);
    db.drop().await;
}
