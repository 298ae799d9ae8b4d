//! The DEN's start-up line on durability, against the test server as it describes itself:
//! with `w: 1` it warns on a replica set or a `mongos`, and says there is no failover on a
//! standalone server; with no write concern configured it does not warn.

use std::time::Duration;

use bson::doc;
use disbatch_store::durability::Topology;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// The line a standalone server gets, and the start of the one about a write concern.
const NO_FAILOVER: &str = "there is no failover to survive";
const WRITE_CONCERN: &str = "write concern w:";

/// What the test server says it is, read by the test itself with `hello`.
async fn server_kind(db: &TestDb) -> &'static str {
    let hello = db
        .client
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .expect("hello");
    println!("hello: {hello}");
    if hello.get_str("setName").is_ok() {
        "replica set"
    } else if hello.get_str("msg") == Ok("isdbgrid") {
        "mongos"
    } else {
        "standalone"
    }
}

/// The durability line a node logged at start, whichever it is.
async fn durability_line(den: &Den) -> String {
    let mut found = String::new();
    wait_for("the durability line", Duration::from_secs(30), || {
        let line = den
            .log_text()
            .lines()
            .find(|l| l.contains(NO_FAILOVER) || l.contains(WRITE_CONCERN))
            .map(str::to_string);
        if let Some(line) = &line {
            found = line.clone();
        }
        async move { line.is_some() }
    })
    .await;
    found
}

#[tokio::test]
async fn w_1_in_attributes_is_warned_about_where_a_failover_could_roll_it_back() {
    let db = TestDb::new("durability_w1").await;
    let kind = server_kind(&db).await;
    let config = write_config(&db, "node.json", json!({"attributes": {"w": 1}}));
    let queue = db.insert_queue("q", "echo", 4).await;
    let den = Den::start(&config, "n1");
    let line = durability_line(&den).await;
    println!("{kind}: {line}");
    match kind {
        "standalone" => {
            assert!(
                line.contains(NO_FAILOVER) && line.contains("INFO"),
                "{line}"
            );
            assert!(
                !den.log_text().contains(WRITE_CONCERN),
                "{}",
                den.log_text()
            );
        }
        _ => {
            assert!(line.contains("WARN"), "{line}");
            assert!(line.contains("write concern w: 1 (configured"), "{line}");
            assert!(line.contains("\"majority\""), "{line}");
        }
    }
    // Batched claims and results carry the configured write concern too: the server takes it.
    let params = (0..8).map(|n| doc! {"n": n}.into()).collect();
    let ids = db.insert_tasks(queue, params).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    assert!(
        !den.log_text().contains("write concern not met"),
        "{}",
        den.log_text()
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn w_1_in_the_uri_is_warned_about_as_well() {
    let db = TestDb::new("durability_uri").await;
    let kind = server_kind(&db).await;
    let uri = if db.uri.contains('?') {
        format!("{}&w=1", db.uri)
    } else {
        format!("{}/?w=1", db.uri.trim_end_matches('/'))
    };
    let config = write_config(&db, "node.json", json!({"mongohost": uri}));
    let den = Den::start(&config, "n1");
    let line = durability_line(&den).await;
    println!("{kind}: {line}");
    if kind == "standalone" {
        assert!(line.contains(NO_FAILOVER), "{line}");
    } else {
        assert!(
            line.contains("WARN") && line.contains("w: 1 (configured"),
            "{line}"
        );
    }
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn no_write_concern_configured_is_not_warned_about() {
    let db = TestDb::new("durability_default").await;
    let kind = server_kind(&db).await;
    // The store's reading of the server agrees with the test's own `hello`.
    let facts = db.den_store().await.server_facts().await;
    println!("{kind}: {facts:?}");
    match (&facts.topology, kind) {
        (Topology::ReplicaSet { .. }, "replica set")
        | (Topology::Sharded, "mongos")
        | (Topology::Standalone, "standalone") => {}
        (t, k) => panic!("the store read {t:?}, hello says {k}"),
    }
    let config = write_config(&db, "node.json", json!({}));
    let den = Den::start(&config, "n1");
    let line = durability_line(&den).await;
    println!("{line}");
    assert!(line.contains("INFO"), "{line}");
    if kind != "standalone" {
        // Either the server's default (majority), or assumed so when it cannot be read.
        assert!(line.contains("w: \"majority\""), "{line}");
        assert!(line.contains("survive a failover"), "{line}");
    }
    drop(den);
    db.drop().await;
}
