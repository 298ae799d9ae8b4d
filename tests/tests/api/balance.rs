//! The queue balancer's settings through `/balance` (read, written, disabled and refused) and
//! the monitoring route's report of nodes and the queuebalance service.

use bson::{doc, DateTime, Document};
use disbatch_tests::api::assert_sorted_keys;
use disbatch_tests::api_calls::raw_json;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use reqwest::Method;
use serde_json::{json, Value};
use std::time::Duration;

#[tokio::test]
async fn balance_is_read_written_and_validated() {
    let db = TestDb::new("api_balance").await;
    let settings = json!({"enabled": false, "log": true, "verbose": false, "pretend": true});
    let config = write_config(&db, "web.json", json!({"balance": settings}));
    // Created out of order: Disbatch lists them sorted, as its test suite checks
    // (`["api","bulk","oneoff"]` for queues created as oneoff, bulk, api).
    for name in ["c_2", "oneoff", "bulk", "a", "b-1", "api"] {
        db.insert_queue(name, "echo", 1).await;
    }
    let dci = Dci::start(&config);

    check_balance_is_read_then_written_and_read_pretty(&dci, &settings).await;

    check_disabled_is_set_and_cleared(&dci).await;
    let (_, before) = dci.get("/balance").await;

    check_bad_balances_are_refused_and_change_nothing(&dci, before).await;
    drop(dci);
    db.drop().await;
}

async fn check_balance_is_read_then_written_and_read_pretty(dci: &Dci, settings: &Value) {
    let (status, ct, text) = raw_json(dci, Method::GET, "/balance", None, "").await;
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    assert_eq!(
        text["known_queues"],
        json!(["a", "api", "b-1", "bulk", "c_2", "oneoff"]),
        "{text}"
    );
    assert_eq!(text["notice"], "balance document not found");
    assert_eq!(text["settings"], *settings);
    assert_eq!(text.as_object().map(|m| m.len()), Some(3), "{text}");

    let good = json!({"max_tasks": {"* 07:00": 5, "1 19:30": "15", "6 23:59": 0}, "queues": [["a"], ["b-1", "c_2"]]});
    let (status, body) = dci.post("/balance", good).await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "success: queuebalance modified"}))
    );
    let (status, ct, pretty) = raw_json(dci, Method::GET, "/balance", None, "").await;
    assert_eq!(status, 200);
    assert_eq!(ct, "application/json");
    assert_sorted_keys(&pretty);
    assert!(
        pretty.get("notice").is_none() && pretty.get("_id").is_none(),
        "{pretty}"
    );
    assert_eq!(
        pretty["max_tasks"],
        json!({"* 07:00": 5, "1 19:30": 15, "6 23:59": 0})
    );
    assert_eq!(pretty["queues"], json!([["a"], ["b-1", "c_2"]]));
    assert_eq!(pretty["settings"], *settings);
    let r = dci
        .http
        .get(dci.at("/balance"))
        .send()
        .await
        .expect("request");
    assert!(
        r.text().await.expect("text").contains("\n  "),
        "pretty-printed"
    );
}

async fn check_disabled_is_set_and_cleared(dci: &Dci) {
    let later = DateTime::now().timestamp_millis() / 1000 + 3600;
    let (status, body) = dci
        .post(
            "/balance",
            json!({"max_tasks": {}, "queues": [], "disabled": later}),
        )
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "success: queuebalance modified"}))
    );
    let (_, b) = dci.get("/balance").await;
    assert_eq!(
        (b["disabled"].clone(), b["queues"].clone()),
        (json!(later), json!([]))
    );
    let (status, _) = dci
        .post(
            "/balance",
            json!({"max_tasks": {}, "queues": [], "disabled": null}),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _) = dci
        .post(
            "/balance",
            json!({"max_tasks": {}, "queues": [], "disabled": 0}),
        )
        .await;
    assert_eq!(status, 200, "0 is allowed");
}

async fn check_bad_balances_are_refused_and_change_nothing(dci: &Dci, before: Value) {
    let q = json!([["a"]]);
    let m = json!({"* 07:00": 1});
    let failures = [
        json!({"queues": q}),
        json!({"max_tasks": m}),
        json!({"max_tasks": m, "queues": q, "extra": 1}),
        json!({"max_tasks": m, "queues": q, "disabled": 100}),
        json!({"max_tasks": m, "queues": q, "disabled": "soon"}),
        json!({"max_tasks": m, "queues": q, "disabled": -5}),
        json!({"max_tasks": m, "queues": "a"}),
        json!({"max_tasks": m, "queues": ["a"]}),
        json!({"max_tasks": m, "queues": [[1]]}),
        json!({"max_tasks": m, "queues": [["nosuch"]]}),
        json!({"max_tasks": m, "queues": [["a b"]]}),
        json!({"max_tasks": m, "queues": [["a"], ["a"]]}),
        json!({"max_tasks": m, "queues": [["a", "a"]]}),
        json!({"max_tasks": [], "queues": q}),
        json!({"max_tasks": {"7 07:00": 1}, "queues": q}),
        json!({"max_tasks": {"* 24:00": 1}, "queues": q}),
        json!({"max_tasks": {"* 07:60": 1}, "queues": q}),
        json!({"max_tasks": {"*07:00": 1}, "queues": q}),
        json!({"max_tasks": {"* 07:00": 1.1}, "queues": q}),
        json!({"max_tasks": {"* 07:00": -1}, "queues": q}),
        json!({"max_tasks": {"* 07:00": "x"}, "queues": q}),
        json!([]),
    ];
    for input in failures {
        let (status, body) = dci.post("/balance", input.clone()).await;
        assert_eq!(status, 400, "{input}: {body}");
        let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
        assert_eq!(keys, ["status"], "{input}: {body}");
        let text = body["status"].as_str().expect("status text");
        assert!(
            text.starts_with("failed: invalid json passed "),
            "{input}: {text}"
        );
    }
    let (_, after) = dci.get("/balance").await;
    assert_eq!(before, after, "failed posts change nothing");
}

#[tokio::test]
async fn monitoring_reports_nodes_and_queuebalance() {
    let db = TestDb::new("api_monitoring").await;
    let disabled = json!({"status": "OK", "message": "monitoring disabled"});
    let balance_off = json!({"status": "OK", "message": "queuebalance disabled"});

    check_monitoring_is_off_by_default_and_when_set_off(&db, &disabled).await;

    check_no_stale_and_fresh_nodes_are_reported(&db, &balance_off).await;

    check_the_queuebalance_heartbeat_and_status(&db).await;
    db.drop().await;
}

async fn check_monitoring_is_off_by_default_and_when_set_off(db: &TestDb, disabled: &Value) {
    // Off by default (and explicitly), whatever the state.
    db.insert_node("old", Duration::from_secs(600)).await;
    for (file, extra) in [
        ("default.json", json!({})),
        (
            "off.json",
            json!({"monitoring": false, "balance": {"enabled": true}}),
        ),
    ] {
        let dci = Dci::start(&write_config(db, file, extra));
        let (status, body) = dci.get("/monitoring").await;
        assert_eq!(
            (status, body),
            (200, json!({"disbatch": disabled, "queuebalance": disabled})),
            "{file}"
        );
    }
    db.db
        .collection::<Document>("nodes")
        .delete_many(doc! {})
        .await
        .expect("clear nodes");
}

async fn check_no_stale_and_fresh_nodes_are_reported(db: &TestDb, balance_off: &Value) {
    let on = write_config(db, "on.json", json!({"monitoring": true}));
    let dci = Dci::start(&on);
    let (status, body) = dci.get("/monitoring").await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"disbatch": {"status": "WARNING", "message": "No Disbatch nodes found"}, "queuebalance": balance_off})
        )
    );

    db.insert_node("old", Duration::from_secs(600)).await;
    let (status, body) = dci.get("/monitoring").await;
    assert_eq!(status, 200);
    assert_eq!(body["queuebalance"], *balance_off);
    let d = &body["disbatch"];
    assert_eq!(
        (d["status"].clone(), d["message"].clone()),
        (json!("CRITICAL"), json!("No active Disbatch nodes found")),
        "{body}"
    );
    assert_eq!(d["nodes"]["fresh"], json!({}), "{body}");
    let age = d["nodes"]["stale"]["old"].as_i64().expect("stale age");
    assert!((599..=630).contains(&age), "{body}");

    let den = Den::start(&on, "n1");
    let nodes = db.db.collection::<Document>("nodes");
    wait_for("the DEN's heartbeat", Duration::from_secs(20), || {
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
    let (status, body) = dci.get("/monitoring").await;
    assert_eq!(status, 200);
    let d = &body["disbatch"];
    assert_eq!(
        (d["status"].clone(), d["message"].clone()),
        (
            json!("OK"),
            json!("Disbatch is running on one or more nodes")
        ),
        "{body}"
    );
    assert!(
        d["nodes"]["fresh"]["n1"]
            .as_i64()
            .is_some_and(|a| (0..=15).contains(&a)),
        "{body}"
    );
    assert!(d["nodes"]["stale"]["old"].is_i64(), "{body}");
    drop(den);
    drop(dci);
}

async fn check_the_queuebalance_heartbeat_and_status(db: &TestDb) {
    // QueueBalance enabled: its heartbeat (`timestamp`, epoch seconds) must be under 60 s old.
    let balanced = write_config(
        db,
        "balance.json",
        json!({"monitoring": true, "balance": {"enabled": true}}),
    );
    let dci = Dci::start(&balanced);
    let (status, body) = dci.get("/monitoring").await;
    assert_eq!(status, 200);
    let qb = &body["queuebalance"];
    assert_eq!(qb["status"], "CRITICAL", "{body}");
    assert!(
        qb["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("queuebalanced not running for ")),
        "{body}"
    );

    let balance = db.db.collection::<Document>("balance");
    let now = DateTime::now().timestamp_millis() / 1000;
    balance
        .insert_one(doc! {"max_tasks": {}, "queues": [], "status": "OK", "message": "QueueBalance is running", "timestamp": now})
        .await
        .expect("balance doc");
    let (_, body) = dci.get("/monitoring").await;
    assert_eq!(
        body["queuebalance"],
        json!({"status": "OK", "message": "QueueBalance is running"})
    );

    balance
        .update_one(doc! {}, doc! {"$set": {"timestamp": now - 300}})
        .await
        .expect("age");
    let (_, body) = dci.get("/monitoring").await;
    let qb = &body["queuebalance"];
    assert_eq!(qb["status"], "CRITICAL", "{body}");
    let message = qb["message"].as_str().expect("message");
    assert!(
        message.starts_with("queuebalanced not running for 30"),
        "{message}"
    );

    balance
        .update_one(
            doc! {},
            doc! {"$set": {"timestamp": now, "status": "CONFUSED"}},
        )
        .await
        .expect("status");
    let (_, body) = dci.get("/monitoring").await;
    assert_eq!(body["queuebalance"]["status"], "CRITICAL", "{body}");
    assert_eq!(
        body["queuebalance"]["message"], "queuebalanced unknown status",
        "{body}"
    );
    drop(dci);
}
