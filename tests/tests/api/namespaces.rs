//! Namespaces (databases) through the API and CLI: only those the config lists.

use std::process::Command;

use bson::{doc, Document};
use disbatch_tests::{bin_path, write_config, Dci, TestDb};
use serde_json::json;

#[tokio::test]
async fn requests_work_in_the_namespace_they_name_and_only_allowed_ones() {
    let db = TestDb::new("ns").await;
    let other = format!("{}_b", db.name);
    let config = write_config(&db, "node.json", json!({"web": {"namespaces": [other]}}));
    let dci = Dci::start(&config);
    let out = Command::new(bin_path("disbatch"))
        .args([
            "--url",
            &dci.url,
            "--namespace",
            &other,
            "create-queue",
            "elsewhere",
            "echo",
        ])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let other_db = db.client.database(&other);
    let in_other = other_db
        .collection::<Document>("queues")
        .count_documents(doc! {"name": "elsewhere"})
        .await
        .expect("count");
    let in_main = db
        .db
        .collection::<Document>("queues")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(
        (in_other, in_main),
        (1, 0),
        "the queue lives in the named namespace only"
    );

    let listed = |ns: Option<&str>| {
        let mut r = dci.http.get(dci.at("/queues"));
        if let Some(ns) = ns {
            r = r.header("X-Disbatch-Namespace", ns);
        }
        r
    };
    let names: serde_json::Value = listed(Some(&other))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(names[0]["name"], json!("elsewhere"));
    let main: serde_json::Value = listed(None)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(main, json!([]));
    let refused = listed(Some("admin")).send().await.expect("get");
    assert_eq!(
        refused.status().as_u16(),
        404,
        "unlisted databases stay out of reach"
    );
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["error"], json!("no namespace admin"));
    let _ = other_db.drop().await;
    db.drop().await;
}
