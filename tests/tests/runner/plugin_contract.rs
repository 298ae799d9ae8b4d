//! The plugin contract as a plugin sees it: stdin, environment, queue order and queue filters.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bson::{doc, Binary, Document};
use disbatch_config::{Component, Config};
use disbatch_model::status;
use disbatch_store::Store;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::{json, Value};

#[tokio::test]
async fn a_plugin_gets_the_task_on_stdin_and_disbatch_variables() {
    let db = TestDb::new("contract").await;
    // Any executable is a plugin; this one happens to be a script.
    let plugin = db.path("env-plugin");
    std::fs::write(
        &plugin,
        "#!/bin/sh\nenv | grep '^DISBATCH_' | sort >&2\ncat\n",
    )
    .expect("write");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = write_config(&db, "node.json", json!({"plugins": {"env": plugin}}));
    let queue = db.insert_queue("envq", "env", 1).await;
    let id = db
        .insert_tasks(queue, vec![doc! {"user": "ashley", "n": 7}.into()])
        .await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );

    let stdin: Value =
        serde_json::from_str(task.get_str("stdout").unwrap_or_default()).expect("stdin was JSON");
    assert_eq!(stdin["_id"]["$oid"], json!(id.to_hex()));
    assert_eq!(stdin["queue"]["$oid"], json!(queue.to_hex()));
    assert_eq!(stdin["params"], json!({"user": "ashley", "n": 7}));
    assert_eq!(
        stdin["status"],
        json!(status::RUNNING),
        "the plugin sees the task running"
    );

    let env = task.get_str("stderr").unwrap_or_default();
    assert!(
        env.contains(&format!("DISBATCH_TASK_ID={}\n", id.to_hex())),
        "{env}"
    );
    assert!(env.contains("DISBATCH_QUEUE=envq\n"), "{env}");
    assert!(
        env.contains(&format!("DISBATCH_QUEUE_ID={}\n", queue.to_hex())),
        "{env}"
    );
    assert!(env.contains("DISBATCH_NODE=n1\n"), "{env}");
    assert!(env.contains("DISBATCH_RESULT=/"), "{env}");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn lifo_queues_run_newest_first_and_activequeues_limit_a_node() {
    let db = TestDb::new("order").await;
    let lifo = db.insert_queue("lifo", "echo", 1).await;
    let other = db.insert_queue("other", "echo", 1).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": lifo}, doc! {"$set": {"sort": "lifo"}})
        .await
        .expect("sort");
    let runs = db.path("runs.txt");
    let params: Vec<bson::Bson> = (0..5)
        .map(|i| doc! {"i": i, "append_to": runs.to_string_lossy().to_string()}.into())
        .collect();
    let ids = db.insert_tasks(lifo, params).await;
    let untouched = db.insert_tasks(other, vec![doc! {}.into()]).await[0];
    let config = write_config(&db, "node.json", json!({"activequeues": [lifo.to_hex()]}));
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    let order = disbatch_tests::read_lines(&runs);
    let expected: Vec<String> = ids.iter().rev().map(|id| id.to_hex()).collect();
    assert_eq!(order, expected, "threads 1 + lifo: newest task first");
    // Had the node served `other`, any of three more readings of its queues would claim it.
    den.wait_queue_reads(3).await;
    assert_eq!(
        db.task(untouched).await.get_i32("status").ok(),
        Some(status::QUEUED),
        "not in activequeues"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn gridfs_reader_accepts_binary_chunks_from_standard_writers() {
    let db = TestDb::new("binchunks").await;
    let config = write_config(&db, "node.json", json!({}));
    let store = Store::connect(
        &Config::load(&config).expect("config").config,
        Component::Web,
    )
    .await
    .expect("store");
    let file = bson::oid::ObjectId::new();
    let chunks = db.db.collection::<Document>("tasks.chunks");
    let part = |n: i32, bytes: &[u8]| doc! {"files_id": file, "n": n, "data": Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: bytes.to_vec() }};
    // Inserted out of order, and mixing the two chunk types.
    chunks
        .insert_many([
            part(1, b" world"),
            doc! {"files_id": file, "n": 2, "data": "!"},
            part(0, b"hello"),
        ])
        .await
        .expect("chunks");
    assert_eq!(
        store.results().read_output_file(file).await.expect("read"),
        b"hello world!"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_plugin_gets_its_queue_config_as_json() {
    let db = TestDb::new("queue_config").await;
    let plugin = db.path("env-plugin");
    std::fs::write(
        &plugin,
        "#!/bin/sh\nprintf '%s' \"$DISBATCH_QUEUE_CONFIG\"\n",
    )
    .expect("write");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = write_config(&db, "node.json", json!({"plugins": {"env": plugin}}));
    let queue = db.insert_queue("cfg", "env", 1).await;
    db.db
        .collection::<Document>("queues")
        .update_one(
            doc! {"_id": queue},
            doc! {"$set": {"config": {"a": 1, "nested": {"b": "x"}}}},
        )
        .await
        .expect("config");
    let bare = db.insert_queue("bare", "env", 1).await;
    let ids = db.insert_tasks(queue, vec![doc! {}.into()]).await;
    let bare_ids = db.insert_tasks(bare, vec![doc! {}.into()]).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&[ids[0], bare_ids[0]], Duration::from_secs(30))
        .await;
    let out = db.task(ids[0]).await;
    let seen: Value =
        serde_json::from_str(out.get_str("stdout").unwrap_or("")).expect("JSON config");
    assert_eq!(seen, json!({"a": 1, "nested": {"b": "x"}}));
    // Empty output is stored as null, as Disbatch's runner stores it.
    assert_eq!(
        db.task(bare_ids[0]).await.get("stdout"),
        Some(&bson::Bson::Null),
        "no config, no variable"
    );
    drop(den);
    db.drop().await;
}
