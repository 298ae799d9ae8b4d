//! `GET /metrics` on the real `disbatch-web`: exact gauges for known states, a valid
//! exposition with escaped queue names, and the bearer token it needs.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_tests::exposition::{self, Exposition};
use disbatch_tests::restartable::RestartableServer;
use disbatch_tests::{wait_for, write_config, Dci, TestDb};
use serde_json::json;

/// Inserts tasks of `queue` with each of `statuses` (a BSON value, or none for a missing field).
async fn tasks_with(db: &TestDb, queue: ObjectId, statuses: &[Option<Bson>]) {
    let docs: Vec<Document> = statuses
        .iter()
        .map(|s| {
            let mut d = doc! {"queue": queue, "node": Bson::Null, "params": {}};
            if let Some(s) = s {
                d.insert("status", s.clone());
            }
            d
        })
        .collect();
    db.tasks().insert_many(docs).await.expect("insert tasks");
}

fn n(code: i32) -> Option<Bson> {
    Some(Bson::Int32(code))
}

/// GET /metrics: status, content type and body, with an optional bearer token.
async fn get_metrics(dci: &Dci, token: Option<&str>) -> (u16, String, String) {
    let mut request = dci.http.get(dci.at("/metrics"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let r = request.send().await.expect("request");
    let status = r.status().as_u16();
    let kind = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, kind, r.text().await.expect("body"))
}

fn checked(text: &str) -> Exposition {
    exposition::check(text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"))
}

#[tokio::test]
async fn metrics_count_tasks_by_queue_and_status_and_nodes_by_liveness() {
    let db = TestDb::new("metrics").await;
    let config = write_config(&db, "web.json", json!({}));
    let alpha = db.insert_queue("alpha", "echo", 3).await;
    let odd = db.insert_queue("a\"b\\c", "echo", "2").await;
    let lines = db.insert_queue("two\nlines", "echo", Bson::Null).await;
    let paused = db.insert_queue("paused", "echo", 0).await;
    db.insert_queue("unreadable", "echo", "many").await;
    let mut alpha_statuses = vec![n(-2), n(-2), n(-2), n(-1), n(0), n(0)];
    alpha_statuses.extend([
        n(1),
        n(1),
        n(1),
        Some(Bson::Int64(1)),
        Some(Bson::Double(1.0)),
    ]);
    alpha_statuses.extend([n(2), n(3), n(-3), n(-4), n(-5), n(-6), n(-6)]);
    alpha_statuses.extend([n(-9), Some(Bson::String("done".into())), None]);
    tasks_with(&db, alpha, &alpha_statuses).await;
    tasks_with(&db, odd, &[n(-2)]).await;
    tasks_with(&db, lines, &[n(0), n(2)]).await;
    // A deleted queue's tasks stay in the collection but belong to no queue.
    tasks_with(&db, ObjectId::new(), &[n(-2), n(-2)]).await;
    db.insert_node("fresh", Duration::from_secs(1)).await;
    db.insert_node("stale", Duration::from_secs(3600)).await;

    let dci = Dci::start(&config);
    let (status, kind, text) = get_metrics(&dci, None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(kind, "text/plain; version=0.0.4");
    let e = checked(&text);

    check_tasks_are_counted_by_queue_and_status(&e, &text);

    check_the_exact_sample_lines(&e, &text);

    check_the_figures_follow_the_database(&db, &dci, odd, paused).await;
    db.drop().await;
}

fn check_tasks_are_counted_by_queue_and_status(e: &Exposition, text: &str) {
    let expect_alpha = [
        ("queued", 3.0),
        ("claimed", 1.0),
        ("running", 2.0),
        ("succeeded", 5.0),
        ("failed", 2.0),
        ("terminated", 1.0),
        ("blocked", 1.0),
        ("cancelled", 1.0),
        ("orphaned", 2.0),
        ("other", 3.0),
    ];
    let per_queue = |queue: &str| -> BTreeMap<String, f64> {
        e.samples
            .iter()
            .filter(|s| s.name == "disbatch_queue_tasks")
            .filter(|s| s.labels.iter().any(|(k, v)| k == "queue" && v == queue))
            .filter_map(|s| {
                let status = s.labels.iter().find(|(k, _)| k == "status")?;
                Some((status.1.clone(), s.value))
            })
            .collect()
    };
    let want: BTreeMap<String, f64> = expect_alpha
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    assert_eq!(per_queue("alpha"), want, "{text}");
    let zeros = |except: &[(&str, f64)]| -> BTreeMap<String, f64> {
        expect_alpha
            .iter()
            .map(|(k, _)| {
                let v = except.iter().find(|(s, _)| s == k).map_or(0.0, |(_, v)| *v);
                (k.to_string(), v)
            })
            .collect()
    };
    assert_eq!(per_queue("a\"b\\c"), zeros(&[("queued", 1.0)]), "{text}");
    assert_eq!(
        per_queue("two\nlines"),
        zeros(&[("running", 1.0), ("failed", 1.0)]),
        "{text}"
    );
    assert_eq!(per_queue("paused"), zeros(&[]), "{text}");
    let queues_seen: std::collections::BTreeSet<&str> = e
        .samples
        .iter()
        .filter(|s| s.name == "disbatch_queue_tasks")
        .filter_map(|s| s.labels.iter().find(|(k, _)| k == "queue"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        queues_seen,
        ["a\"b\\c", "alpha", "paused", "two\nlines", "unreadable"].into(),
        "only existing queues: {text}"
    );
}

fn check_the_exact_sample_lines(e: &Exposition, text: &str) {
    // Exact sample lines: the label values escaped as the format asks, nothing else escaped.
    for line in [
        "disbatch_up 1",
        "disbatch_queues 5",
        "disbatch_nodes 2",
        "disbatch_nodes_live 1",
        "disbatch_queue_tasks{queue=\"alpha\",status=\"queued\"} 3",
        "disbatch_queue_tasks{queue=\"alpha\",status=\"succeeded\"} 5",
        "disbatch_queue_tasks{queue=\"alpha\",status=\"other\"} 3",
        "disbatch_queue_tasks{queue=\"a\\\"b\\\\c\",status=\"queued\"} 1",
        "disbatch_queue_tasks{queue=\"two\\nlines\",status=\"running\"} 1",
        "disbatch_queue_threads{queue=\"alpha\"} 3",
        "disbatch_queue_threads{queue=\"a\\\"b\\\\c\"} 2",
        "disbatch_queue_threads{queue=\"two\\nlines\"} 0",
        "disbatch_queue_threads{queue=\"paused\"} 0",
        "# TYPE disbatch_queue_tasks gauge",
        "# TYPE disbatch_nodes_live gauge",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from\n{text}"
        );
    }
    assert_eq!(
        e.value("disbatch_queue_threads", &[("queue", "unreadable")]),
        None,
        "threads that cannot be read give no sample: {text}"
    );
    let took = e
        .value("disbatch_scrape_duration_seconds", &[])
        .expect("scrape duration");
    assert!((0.0..60.0).contains(&took), "{took}");
}

async fn check_the_figures_follow_the_database(
    db: &TestDb,
    dci: &Dci,
    odd: ObjectId,
    paused: ObjectId,
) {
    // The figures follow the database: a task finishing moves between groups.
    db.tasks()
        .update_many(doc! {"queue": odd}, doc! {"$set": {"status": 1}})
        .await
        .expect("finish");
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": paused}, doc! {"$set": {"threads": 7}})
        .await
        .expect("threads");
    // Scrapes share one reading for up to a second (so every viewer costs the server one
    // reading): scrape until one shows the change, then check it whole.
    let last = std::cell::RefCell::new(String::new());
    wait_for(
        "a scrape showing the change",
        Duration::from_secs(30),
        || {
            let scraped = get_metrics(dci, None);
            let last = &last;
            async move {
                let text = scraped.await.2;
                let e = checked(&text);
                *last.borrow_mut() = text;
                e.value("disbatch_queue_threads", &[("queue", "paused")]) == Some(7.0)
                    && e.value(
                        "disbatch_queue_tasks",
                        &[("queue", "a\"b\\c"), ("status", "succeeded")],
                    ) == Some(1.0)
            }
        },
    )
    .await;
    let text = last.into_inner();
    let e = checked(&text);
    assert_eq!(
        e.value(
            "disbatch_queue_tasks",
            &[("queue", "a\"b\\c"), ("status", "succeeded")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        e.value(
            "disbatch_queue_tasks",
            &[("queue", "a\"b\\c"), ("status", "queued")]
        ),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        e.value("disbatch_queue_threads", &[("queue", "paused")]),
        Some(7.0),
        "{text}"
    );
}

#[tokio::test]
async fn an_empty_database_reports_up_and_zeros() {
    let db = TestDb::new("metrics_empty").await;
    let dci = Dci::start(&write_config(&db, "web.json", json!({})));
    let (status, _, text) = get_metrics(&dci, None).await;
    assert_eq!(status, 200, "{text}");
    let e = checked(&text);
    for (name, value) in [
        ("disbatch_up", 1.0),
        ("disbatch_queues", 0.0),
        ("disbatch_nodes", 0.0),
        ("disbatch_nodes_live", 0.0),
    ] {
        assert_eq!(e.value(name, &[]), Some(value), "{name}: {text}");
    }
    assert!(!text.contains("disbatch_queue_tasks"), "{text}");
    db.drop().await;
}

const READ: &str = "metrics-read-token-0123456789";
const ADMIN: &str = "metrics-admin-token-0123456789";

#[tokio::test]
async fn with_tokens_a_scraper_needs_a_bearer_token() {
    let db = TestDb::new("metrics_tokens").await;
    let config = write_config(
        &db,
        "web.json",
        json!({"web": {"tokens": [
            {"name": "prometheus", "role": "read", "token": READ},
            {"name": "boss", "role": "admin", "token": ADMIN},
        ]}}),
    );
    db.insert_queue("q", "echo", 1).await;
    let dci = Dci::start(&config);
    let (status, _, text) = get_metrics(&dci, None).await;
    assert_eq!(status, 401, "{text}");
    assert!(
        !text.contains("disbatch_"),
        "no figures without a token: {text}"
    );
    let (status, _, text) = get_metrics(&dci, Some("not-a-token-0123456789abc")).await;
    assert_eq!(status, 401, "{text}");
    for token in [READ, ADMIN] {
        let (status, kind, text) = get_metrics(&dci, Some(token)).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(kind, "text/plain; version=0.0.4");
        let e = checked(&text);
        assert_eq!(
            e.value("disbatch_queue_threads", &[("queue", "q")]),
            Some(1.0),
            "{text}"
        );
    }
    db.drop().await;
}

#[tokio::test]
async fn a_database_outage_is_reported_as_up_zero_not_as_a_failed_scrape() {
    let mut server = RestartableServer::start();
    let db = TestDb::on(server.uri(), "metrics_outage").await;
    db.insert_queue("q", "echo", 1).await;
    let dci = Dci::start(&write_config(&db, "web.json", json!({})));
    let (_, _, text) = get_metrics(&dci, None).await;
    assert_eq!(
        checked(&text).value("disbatch_up", &[]),
        Some(1.0),
        "{text}"
    );

    server.kill();
    let (status, kind, text) = get_metrics(&dci, None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(kind, "text/plain; version=0.0.4");
    let e = checked(&text);
    assert_eq!(e.value("disbatch_up", &[]), Some(0.0), "{text}");
    assert!(
        e.value("disbatch_scrape_duration_seconds", &[]).is_some(),
        "{text}"
    );
    assert!(!text.contains("disbatch_queue"), "no stale figures: {text}");

    server.restart();
    wait_for("the figures to return", Duration::from_secs(60), || async {
        let (_, _, text) = get_metrics(&dci, None).await;
        exposition::check(&text)
            .ok()
            .and_then(|e| e.value("disbatch_queue_threads", &[("queue", "q")]))
            == Some(1.0)
    })
    .await;
    db.drop().await;
}
