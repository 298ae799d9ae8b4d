//! A plugin's chained `output` holding values that cannot be stored (Extended-JSON-shaped
//! objects that are not valid Extended JSON, BSON-only types): the result stands, the good
//! units are chained, the rest is said in the task's stderr, and the node stores the result;
//! and a map output that chains nothing because one value is not an object says so.

use std::time::Duration;

use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::hostile::crashes;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn output_that_cannot_be_stored_is_reported_on_the_task_and_the_rest_is_chained() {
    let db = TestDb::new("hostile_chaining").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let first = db.insert_queue("first", "echo", 2).await;
    // Paused, so chained units stay visible as queued.
    let next = db.insert_queue("next", "echo", 0).await;
    db.set_queue(first, doc! {"then": "next"}).await;
    // Stored as plain sub-documents; the plugin gets them back as the same JSON and returns
    // them in its output, as a plugin passing its params through would.
    let map_form = doc! {"result": {"output": {
        "good": {"n": {"$numberLong": "5"}},
        "bad": {"n": {"$numberLong": "x"}},
    }}};
    let list_form = doc! {"result": {"output": [
        ["fine", {"when": {"$date": "2020-01-01T00:00:00Z"}}],
        ["undef", {"u": {"$undefined": true}}],
        ["baddate", {"d": {"$date": "x"}}],
    ]}};
    let ids = db
        .insert_tasks(first, vec![Bson::from(map_form), Bson::from(list_form)])
        .await;
    let den = Den::start(&config, "chain-node");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    wait_for("chained units", Duration::from_secs(10), || async {
        db.count(doc! {"queue": next}).await == 2
    })
    .await;

    let map_task = db.task(ids[0]).await;
    assert_eq!(
        map_task.get_i32("status"),
        Ok(status::SUCCEEDED),
        "the result stands"
    );
    let stderr = map_task.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.contains(r#"chaining to queue "next": unit "bad" not chained: output.bad.n is not a valid Extended JSON value"#),
        "{stderr}"
    );
    let good = db.unit(next, "good").await.expect("good");
    assert_eq!(good.get_document("params").ok(), Some(&doc! {"n": 5_i64}));
    assert!(db.unit(next, "bad").await.is_none());

    let list_task = db.task(ids[1]).await;
    assert_eq!(list_task.get_i32("status"), Ok(status::SUCCEEDED));
    let stderr = list_task.get_str("stderr").unwrap_or_default();
    for said in [
        r#"unit "undef" not chained: output[1][1].u: BSON type undefined"#,
        r#"unit "baddate" not chained: output[2][1].d is not a valid Extended JSON value"#,
    ] {
        assert!(stderr.contains(said), "{said} in {stderr}");
    }
    let fine = db.unit(next, "fine").await.expect("fine");
    assert!(matches!(
        fine.get_document("params").ok().and_then(|p| p.get("when")),
        Some(Bson::DateTime(_))
    ));
    for key in ["undef", "baddate"] {
        assert!(db.unit(next, key).await.is_none(), "{key}");
    }

    // The node took both results: the runner had no reason to think it gone.
    let log = den.log_text();
    assert!(!log.contains("went away"), "{log}");
    assert!(!log.contains("malformed result"), "{log}");
    assert_eq!(
        den.metric(r#"disbatch_den_results_total{answer="recorded"}"#)
            .await,
        2.0
    );
    assert_eq!(crashes(&log), Vec::<String>::new(), "{log}");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_map_output_with_a_value_that_is_not_an_object_says_why_nothing_was_chained() {
    let db = TestDb::new("hostile_chaining_map").await;
    let config = write_config(&db, "node.json", json!({}));
    let first = db.insert_queue("first", "echo", 1).await;
    let next = db.insert_queue("next", "echo", 0).await;
    db.set_queue(first, doc! {"then": "next"}).await;
    let params = doc! {"result": {"output": {"good": {"n": 1}, "bad": 5, "worse": "x"}}};
    let ids = db.insert_tasks(first, vec![params.into()]).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;

    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status"),
        Ok(status::SUCCEEDED),
        "the result stands"
    );
    let stderr = task.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.contains(r#"chaining to queue "next": output not chained: a map chains only when every value is an object (the unit's params), and "bad" is a number, "worse" is a string"#),
        "{stderr}"
    );
    // Coordinate's rule: such a map names no unit at all, not even the good one.
    assert_eq!(db.count(doc! {"queue": next}).await, 0);
    drop(den);
    db.drop().await;
}
