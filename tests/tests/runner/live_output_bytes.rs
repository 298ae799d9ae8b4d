//! Live output of bytes that are not UTF-8: each shows as a 3-byte U+FFFD, and the copy the
//! node takes still fits its 64 KiB limit, so a running task's newest output stays visible.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bson::Document;
use disbatch_model::status;
use disbatch_store::LIVE_TAIL;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// The task's live copy of stdout, when it has one.
fn live_stdout(task: &Document) -> Option<String> {
    let live = task.get_document("live_output").ok()?;
    Some(
        live.get_document("stdout")
            .ok()?
            .get_str("text")
            .ok()?
            .to_string(),
    )
}

#[tokio::test]
async fn invalid_bytes_in_live_output_keep_the_copy_within_its_limit_and_shown() {
    let db = TestDb::new("live_bytes").await;
    let gate = db.path("gate");
    // 30 000 bytes of 0xFF: 90 000 bytes once each shows as U+FFFD, over the 64 KiB a copy
    // holds. The plugin then waits at the gate, so the copies are made while it runs.
    let plugin = db.path("invalid.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nhead -c 30000 /dev/zero | tr '\\000' '\\377'\necho newest\n\
             while [ ! -e '{}' ]; do sleep 0.1; done\n",
            gate.display()
        ),
    )
    .expect("plugin");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = write_config(&db, "node.json", json!({"plugins": {"invalid": plugin}}));
    let queue = db.insert_queue("bytes", "invalid", 1).await;
    let ids = db.insert_tasks(queue, vec![bson::doc! {}.into()]).await;
    let den = Den::start(&config, "n1");
    wait_for(
        "the newest output live",
        Duration::from_secs(60),
        || async { live_stdout(&db.task(ids[0]).await).is_some_and(|t| t.ends_with("newest\n")) },
    )
    .await;
    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::RUNNING),
        "still running: {task}"
    );
    let text = live_stdout(&task).unwrap_or_default();
    assert!(
        text.len() as u64 <= LIVE_TAIL && text.len() as u64 > LIVE_TAIL - 16,
        "{} bytes live",
        text.len()
    );
    assert!(
        text.starts_with('\u{fffd}'),
        "{:?}",
        text.chars().take(4).collect::<String>()
    );
    let log = den.log_text();
    assert!(!log.contains("malformed live output"), "{log}");

    std::fs::write(&gate, b"").expect("open the gate");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    let task = db.task(ids[0]).await;
    let stdout = task.get_str("stdout").unwrap_or_default();
    assert_eq!(stdout.matches('\u{fffd}').count(), 30_000);
    assert!(stdout.ends_with("newest\n"));
    drop(den);
    db.drop().await;
}
