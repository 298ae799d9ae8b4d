//! The MongoDB connection string and passwords need not be in the config: a DEN takes them
//! from files beside it (`mongohost_file`, `auth_files`) or from the environment, hands its
//! task runners theirs, and never shows them.

use std::time::Duration;

use bson::doc;
use disbatch_model::status;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::{json, Value};

/// Writes the node config, then takes `mongohost` out of it.
fn config_without_mongohost(db: &TestDb, file: &str, extra: Value) -> std::path::PathBuf {
    let path = write_config(db, file, extra);
    let text = std::fs::read_to_string(&path).expect("read config");
    let mut value: Value = serde_json::from_str(&text).expect("config json");
    if let Some(map) = value.as_object_mut() {
        map.remove("mongohost");
    }
    std::fs::write(&path, value.to_string()).expect("write config");
    path
}

async fn runs_a_task(db: &TestDb, den: &Den) {
    let queue = db.insert_queue("q", "echo", 2).await;
    let ids = db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let task = db
        .tasks()
        .find_one(doc! {"_id": ids[0]})
        .await
        .expect("read task")
        .expect("task");
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task} {}",
        den.log_text()
    );
}

#[tokio::test]
async fn the_connection_string_may_come_from_a_file() {
    let db = TestDb::new("creds_file").await;
    // Relative to the config's directory, as other paths in it are.
    std::fs::write(db.path("mongohost.secret"), format!("{}\n", db.uri)).expect("write");
    let config = config_without_mongohost(
        &db,
        "node.json",
        json!({"mongohost_file": "mongohost.secret"}),
    );
    let den = Den::start(&config, "n1");
    runs_a_task(&db, &den).await;
    db.drop().await;
}

#[tokio::test]
async fn the_connection_string_may_come_from_the_environment_and_reaches_the_runners() {
    let db = TestDb::new("creds_env").await;
    let config = config_without_mongohost(&db, "node.json", json!({}));
    // The runner reads the config too: without DISBATCH_MONGOHOST passed on it could not
    // record the task's result.
    let den = Den::start_with_env(&config, "n1", &[("DISBATCH_MONGOHOST", &db.uri)]);
    runs_a_task(&db, &den).await;
    db.drop().await;
}

#[tokio::test]
async fn a_missing_or_doubled_secret_is_refused_naming_the_key() {
    let db = TestDb::new("creds_bad").await;
    let both = write_config(&db, "both.json", json!({"mongohost_file": "x"}));
    let missing = config_without_mongohost(
        &db,
        "missing.json",
        json!({"mongohost_file": "nowhere.secret", "auth_files": {"disbatchd": "none.pw"}}),
    );
    let none = config_without_mongohost(&db, "none.json", json!({}));
    for (config, wants) in [
        (&both, vec!["not both"]),
        (
            &missing,
            vec![
                "`mongohost_file`",
                "nowhere.secret",
                "`auth_files.disbatchd`",
            ],
        ),
        (&none, vec!["`mongohost` is required", "DISBATCH_MONGOHOST"]),
    ] {
        let out = std::process::Command::new(disbatch_tests::bin_path("disbatchd"))
            .arg("--check-config")
            .arg(config)
            .env_remove("DISBATCH_MONGOHOST")
            .output()
            .expect("run disbatchd");
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{text}");
        for want in wants {
            assert!(text.contains(want), "{want:?} in {text}");
        }
    }
    db.drop().await;
}
