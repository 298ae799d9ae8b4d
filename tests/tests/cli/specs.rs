//! `disbatch spec load`: Coordinate work-spec files become queues; a reload resets them.

use std::process::Command;
use std::time::Duration;

use bson::{doc, Document};
use disbatch_tests::{bin_path, wait_for, write_config, Dci, Den, TestDb};
use serde_json::json;

async fn queue(db: &TestDb, name: &str) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find")
        .expect(name)
}

fn spec_load(dci: &Dci, file: &std::path::Path) -> std::process::Output {
    Command::new(bin_path("disbatch"))
        .args(["--url", &dci.url, "spec", "load"])
        .arg(file)
        .args(["--plugin", "echo"])
        .output()
        .expect("run disbatch")
}

#[tokio::test]
async fn a_flows_file_becomes_chained_queues_and_a_reload_resets_them() {
    let db = TestDb::new("specs").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let file = db.path("flows.yaml");
    std::fs::write(&file, "flows:\n  a:\n    weight: 1000\n    then: b\n    max_running: 2\n  b:\n    weight: 1\n    disabled: true\n    worker: persistent\n    worker_idle_s: 2.5\n    worker_max_tasks: 100\n    worker_max_rss_mb: 512\n    worker_start_s: 3\n")
        .expect("write");
    let out = spec_load(&dci, &file);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout)
        .starts_with("Loaded 2 work specs: 2 created, 0 updated."));
    let a = queue(&db, "a").await;
    assert_eq!(a.get_str("plugin").ok(), Some("echo"));
    assert_eq!(a.get_i64("weight").ok(), Some(1000));
    assert_eq!(a.get_i64("threads").ok(), Some(2));
    assert_eq!(a.get_str("then").ok(), Some("b"));
    assert_eq!(a.get_str("sort").ok(), Some("priority"));
    // The worker fields keep their types: a word, seconds as doubles, limits as integers.
    let b = queue(&db, "b").await;
    assert_eq!(
        b.get("worker"),
        Some(&bson::Bson::String("persistent".into())),
        "{b}"
    );
    assert_eq!(
        b.get("worker_idle_s"),
        Some(&bson::Bson::Double(2.5)),
        "{b}"
    );
    assert_eq!(
        b.get("worker_max_tasks"),
        Some(&bson::Bson::Int64(100)),
        "{b}"
    );
    assert_eq!(
        b.get("worker_max_rss_mb"),
        Some(&bson::Bson::Int64(512)),
        "{b}"
    );
    assert_eq!(
        b.get("worker_start_s"),
        Some(&bson::Bson::Double(3.0)),
        "{b}"
    );
    assert!(
        a.get("worker").is_none(),
        "a spec without `worker` runs a process per task"
    );
    let config_weight = a
        .get_document("config")
        .ok()
        .and_then(|c| c.get("weight").cloned());
    assert!(
        matches!(
            config_weight,
            Some(bson::Bson::Int32(1000)) | Some(bson::Bson::Int64(1000))
        ),
        "{a}"
    );

    // The flow runs: a's output becomes a unit of b (paused, so it stays queued).
    let a_id = a.get_object_id("_id").expect("id");
    let b_id = queue(&db, "b").await.get_object_id("_id").expect("id");
    let ids = db
        .insert_tasks(
            a_id,
            vec![doc! {"result": {"output": {"next": {"from": "a"}}}}.into()],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    wait_for("the chained unit", Duration::from_secs(10), || async {
        db.count(doc! {"queue": b_id, "key": "next"}).await == 1
    })
    .await;
    drop(den);

    // Reload: `then` is gone and priority is new; the continuous clock is reset.
    db.db
        .collection::<Document>("queues")
        .update_one(
            doc! {"_id": a_id},
            doc! {"$set": {"next_continuous": bson::DateTime::now()}},
        )
        .await
        .expect("u");
    std::fs::write(&file, "name: a\npriority: 4\n").expect("write");
    let out = spec_load(&dci, &file);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .starts_with("Loaded 1 work specs: 0 created, 1 updated."),
        "{out:?}"
    );
    let a = queue(&db, "a").await;
    assert_eq!(
        a.get_object_id("_id").ok(),
        Some(a_id),
        "same queue, redefined"
    );
    assert_eq!(a.get_i64("priority").ok(), Some(4));
    for reset in ["then", "weight", "max_running", "next_continuous"] {
        assert!(a.get(reset).is_none(), "{reset} was reset: {a}");
    }
    db.drop().await;
}

#[tokio::test]
async fn bad_specs_are_refused_and_nothing_is_written() {
    let db = TestDb::new("specs_bad").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let (s, out) = dci.post("/specs", json!({"specs": [{"name": "ok"}, {"name": "bad", "priority": "high"}], "plugin": "echo"})).await;
    assert_eq!(s, 400, "{out}");
    assert!(
        out["error"]
            .as_str()
            .unwrap_or("")
            .starts_with("specs[1]: priority"),
        "{out}"
    );
    for (bad, field) in [
        (json!({"worker": "pool"}), "worker"),
        (json!({"worker": 1}), "worker"),
        (json!({"worker_idle_s": -1}), "worker_idle_s"),
        (json!({"worker_idle_s": "soon"}), "worker_idle_s"),
        (json!({"worker_max_tasks": -3}), "worker_max_tasks"),
        (json!({"worker_max_rss_mb": 1.5}), "worker_max_rss_mb"),
        (json!({"worker_start_s": [3]}), "worker_start_s"),
        (json!({"min_gb": "lots"}), "min_gb must be a number of GB"),
        (json!({"min_gb": -1}), "min_gb"),
    ] {
        let mut spec = bad.clone();
        spec["name"] = json!("w");
        let (s, out) = dci
            .post(
                "/specs",
                json!({"specs": [{"name": "ok"}, spec], "plugin": "echo"}),
            )
            .await;
        assert_eq!(s, 400, "{bad}: {out}");
        let error = out["error"].as_str().unwrap_or("");
        assert!(
            error.starts_with("specs[1]: ") && error.contains(field),
            "{bad}: {out}"
        );
    }
    let (s, out) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "x", "plugin": "nope"}]}),
        )
        .await;
    assert_eq!((s, out["plugin"].clone()), (400, json!("nope")), "{out}");
    let (s, _) = dci.post("/specs", json!({"specs": [{"name": "y"}]})).await;
    assert_eq!(s, 400, "no plugin anywhere");
    assert_eq!(
        db.db
            .collection::<Document>("queues")
            .count_documents(doc! {})
            .await
            .expect("count"),
        0
    );
    let bad_worker = db.path("bad_worker.yaml");
    std::fs::write(&bad_worker, "name: w\nworker: pool\n").expect("write");
    let out = spec_load(&dci, &bad_worker);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("worker must be"),
        "{out:?}"
    );
    let bad_file = db.path("bad.yaml");
    std::fs::write(&bad_file, "flows: [1, 2]\n").expect("write");
    let out = spec_load(&dci, &bad_file);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("flows"),
        "{out:?}"
    );
    db.drop().await;
}
