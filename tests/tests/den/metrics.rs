//! A DEN's `metrics_listen`: the node serves its own counters while it runs tasks, and a
//! taken address stops it at start.

use std::time::Duration;

use bson::doc;
use disbatch_tests::{exposition, wait_for, write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_node_serves_its_metrics_while_it_runs_tasks() {
    let db = TestDb::new("den_metrics").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let queue = db.insert_queue("echoes", "echo", 2).await;
    let ids = db
        .insert_tasks(queue, (0..4).map(|_| doc! {}.into()).collect())
        .await;
    let den = Den::start(&config, "m1");
    let base = den.metrics_url().await;
    assert!(
        base.starts_with("http://127.0.0.1:") && !base.ends_with(":0"),
        "the bound port, not the configured 0: {base}"
    );
    db.wait_complete(&ids, Duration::from_secs(60)).await;

    let http = reqwest::Client::new();
    let r = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/plain; version=0.0.4")
    );
    let text = r.text().await.expect("body");
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let passes = e
        .value("disbatch_den_passes_total", &[])
        .unwrap_or_else(|| panic!("no passes counter in\n{text}"));
    assert!(passes > 0.0, "{text}");
    for family in [
        "disbatch_den_passes_total",
        "disbatch_den_claim_latency_seconds",
        "disbatch_den_pass_duration_seconds",
    ] {
        assert!(e.types.contains_key(family), "{family} in\n{text}");
    }
    // Passes keep counting while the node runs.
    wait_for("more passes", Duration::from_secs(10), || {
        let http = http.clone();
        let url = format!("{base}/metrics");
        async move {
            let Ok(r) = http.get(url).send().await else {
                return false;
            };
            let text = r.text().await.unwrap_or_default();
            exposition::check(&text)
                .ok()
                .and_then(|e| e.value("disbatch_den_passes_total", &[]))
                .is_some_and(|n| n > passes)
        }
    })
    .await;

    let r = http
        .get(format!("{base}/other"))
        .send()
        .await
        .expect("other path");
    assert_eq!(r.status().as_u16(), 404);
    let r = http
        .post(format!("{base}/metrics"))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 405);

    // A second node on the same address refuses to start, naming the key.
    let taken = base.trim_start_matches("http://").to_string();
    let config2 = write_config(&db, "node2.json", json!({"metrics_listen": taken}));
    let mut second = Den::start(&config2, "m2");
    wait_for("the second node to exit", Duration::from_secs(30), || {
        let running = second.is_running();
        async move { !running }
    })
    .await;
    let log = second.log_text();
    assert!(log.contains("`metrics_listen`"), "{log}");
    drop(den);
    db.drop().await;
}
