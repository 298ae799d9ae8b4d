//! `GET /summary` and `disbatch summary`: counts per queue in Coordinate's unit states.

use std::process::Command;

use bson::doc;
use disbatch_tests::{bin_path, write_config, Dci, TestDb};
use serde_json::json;

#[tokio::test]
async fn summary_counts_units_by_coordinate_state() {
    let db = TestDb::new("summary").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("sq", "echo", 0).await;
    let empty = db.insert_queue("empty", "echo", 0).await;
    let ids = db
        .insert_tasks(queue, (0..8).map(|_| doc! {}.into()).collect())
        .await;
    let future = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_600_000);
    let past = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 1000);
    let sets = [
        doc! {"not_before": future}, // delayed
        doc! {"not_before": past},   // available
        doc! {"status": -1},         // pending
        doc! {"status": 0},          // pending
        doc! {"status": 1},          // finished
        doc! {"status": 2},          // failed
        doc! {"status": -6},         // other (orphaned)
    ];
    for (id, set) in ids.iter().zip(sets) {
        db.tasks()
            .update_one(doc! {"_id": id}, doc! {"$set": set})
            .await
            .expect("set");
    }
    let dci = Dci::start(&config);
    let (s, rows) = dci.get("/summary").await;
    assert_eq!(s, 200, "{rows}");
    let row = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["queue"] == "sq"))
        .cloned()
        .expect("sq row");
    assert_eq!(
        row,
        json!({"id": queue.to_hex(), "queue": "sq", "available": 2, "delayed": 1, "pending": 2,
               "finished": 1, "failed": 1, "other": 1})
    );
    let none = rows
        .as_array()
        .and_then(|r| r.iter().find(|r| r["queue"] == "empty"))
        .cloned()
        .expect("empty row");
    assert_eq!(none["id"], json!(empty.to_hex()));
    assert_eq!(none["available"], json!(0));

    let out = Command::new(bin_path("disbatch"))
        .args(["--url", &dci.url, "summary"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let header: Vec<&str> = text
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "Queue",
            "Available",
            "Delayed",
            "Pending",
            "Finished",
            "Failed",
            "Other"
        ]
    );
    let sq: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("sq "))
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(sq, ["sq", "2", "1", "2", "1", "1", "1"], "{text}");
    db.drop().await;
}
