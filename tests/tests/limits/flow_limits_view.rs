//! Flow limits through the DCI, its work-spec API and the CLI: setting and clearing them, bad
//! values refused with the field named, why a queued task is held and until when, a queue's
//! budget and held counts (the state written as nodes would), and the refusal beside Perl nodes.

use std::time::Duration;

use bson::{doc, DateTime, Document};
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

async fn queue_doc(db: &TestDb, name: &str) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("find queue")
        .expect("queue stored")
}

/// A date as the DCI shows it (UTC, to the second).
pub(super) fn shown(ms: i64) -> Value {
    let text = DateTime::from_millis(ms)
        .try_to_rfc3339_string()
        .expect("date");
    json!(text.chars().take(19).collect::<String>())
}

fn refused(status: u16, body: &Value, field: &str) {
    assert_eq!(status, 400, "{body}");
    let e = body["error"].as_str().unwrap_or_default();
    assert!(e.contains(field), "the error names {field}: {body}");
}

/// The CLI run with `line`'s words as its arguments.
fn run(dci: &Dci, line: &str) -> (bool, String) {
    output(&dci.cli(&line.split_whitespace().collect::<Vec<_>>()))
}

pub(super) fn output(out: &std::process::Output) -> (bool, String) {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn limits_are_set_and_cleared_through_the_api_and_bad_ones_name_their_field() {
    let db = TestDb::new("flow_view_api").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    check_limits_set_at_creation_are_stored_and_shown(&db, &dci).await;

    let stored = check_limits_change_and_clear_one_at_a_time(&db, &dci).await;

    for (body, field) in [
        (
            json!({"rate_limit": {"starts": 0, "per_s": 1}}),
            "rate_limit.starts",
        ),
        (json!({"rate_limit": {"starts": 5}}), "rate_limit.per_s"),
        (json!({"rate_limit": 5}), "rate_limit must be"),
        (
            json!({"rate_limit": {"starts": 5, "per_s": 1, "burst": 2}}),
            "burst",
        ),
        (json!({"concurrency": {"max": 1}}), "concurrency.key"),
        (
            json!({"concurrency": {"key": "k", "ordered": "yes"}}),
            "concurrency.ordered",
        ),
        (
            json!({"unique": {"key": "k", "states": ["done"]}}),
            "unique.states",
        ),
        (json!({"unique": "params.id"}), "unique must be"),
    ] {
        let (s, answer) = dci.post("/queues/q", body.clone()).await;
        refused(s, &answer, field);
        let mut create = body.clone();
        create["name"] = json!("new");
        create["plugin"] = json!("echo");
        let (s, answer) = dci.post("/queues", create).await;
        refused(s, &answer, field);
    }
    assert_eq!(
        queue_doc(&db, "q").await,
        stored,
        "nothing refused was stored"
    );
    drop(dci);
    db.drop().await;
}

async fn check_limits_set_at_creation_are_stored_and_shown(db: &TestDb, dci: &Dci) {
    let (s, body) = dci
        .post(
            "/queues",
            json!({"name": "q", "plugin": "echo",
                   "rate_limit": {"starts": 50, "per_s": 10},
                   "concurrency": {"key": "params.account", "max": 2, "ordered": true},
                   "unique": {"key": "params.id", "for_s": 60}}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let stored = queue_doc(db, "q").await;
    let limits = disbatch_model::limits::parse(&stored).expect("a node reads them");
    assert_eq!(
        limits.rate.map(|r| (r.starts, r.per)),
        Some((50, Duration::from_secs(10)))
    );
    assert_eq!(
        limits.concurrency.map(|c| (c.max, c.ordered)),
        Some((2, true))
    );
    assert!(limits.unique.is_some());

    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(q["rate_limit"], json!({"starts": 50, "per_s": 10}));
    assert_eq!(q["concurrency"]["key"], json!("params.account"));
    assert_eq!(q["unique"]["for_s"], json!(60));
    assert_eq!(
        q["flow"]["rate_limit"],
        json!({"used": 0, "left": 50, "next_free": null})
    );
    assert_eq!(
        q["flow"]["held"],
        json!({"rate_limit": 0, "partition_limit": 0, "concurrency": 0, "ordered": 0, "scanned": 0, "capped": false})
    );
    dci.post("/queues", json!({"name": "plain", "plugin": "echo"}))
        .await;
    let (_, plain) = dci.get("/queues/plain").await;
    for k in ["rate_limit", "concurrency", "unique", "flow"] {
        assert!(
            plain.get(k).is_none(),
            "a plain queue shows no {k}: {plain}"
        );
    }
    let (_, list) = dci.get("/queues").await;
    let listed = list
        .as_array()
        .and_then(|l| l.iter().find(|x| x["name"] == "q"))
        .cloned()
        .expect("listed");
    assert_eq!(
        listed["rate_limit"], q["rate_limit"],
        "the list shows the limits as set"
    );
}

async fn check_limits_change_and_clear_one_at_a_time(db: &TestDb, dci: &Dci) -> Document {
    // Changed and removed (null) one at a time; the others stay.
    let (s, body) = dci
        .post(
            "/queues/q",
            json!({"rate_limit": {"starts": 5, "per_s": 0.5, "partition": "params.c"}}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = dci
        .post("/queues/q", json!({"concurrency": null, "unique": null}))
        .await;
    assert_eq!(s, 200, "{body}");
    let stored = queue_doc(db, "q").await;
    assert!(
        stored.get("concurrency").is_none() && stored.get("unique").is_none(),
        "{stored}"
    );
    assert_eq!(
        stored
            .get_document("rate_limit")
            .ok()
            .and_then(|r| r.get_str("partition").ok()),
        Some("params.c")
    );
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(q["flow"]["rate_limit"]["live_partitions"], json!(0), "{q}");
    assert!(q["flow"].get("concurrency").is_none(), "{q}");
    stored
}

#[tokio::test]
async fn work_specs_set_limits_and_a_reload_without_them_removes_them() {
    let db = TestDb::new("flow_view_specs").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let spec = json!({"name": "s", "plugin": "echo",
        "rate_limit": {"starts": 10, "per_s": 1, "partition": "params.customer", "max_partitions": 50},
        "concurrency": {"key": "params.account"},
        "unique": {"key": "params.id", "states": ["queued"]}});
    let (s, body) = dci.post("/specs", json!({"specs": [spec]})).await;
    assert_eq!(s, 200, "{body}");
    let limits = disbatch_model::limits::parse(&queue_doc(&db, "s").await).expect("limits");
    assert_eq!(limits.rate.map(|r| r.max_partitions), Some(50));
    assert_eq!(limits.concurrency.map(|c| c.max), Some(1));
    assert!(limits.unique.is_some());

    let (s, body) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "s", "plugin": "echo"}]}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let stored = queue_doc(&db, "s").await;
    for k in ["rate_limit", "concurrency", "unique"] {
        assert!(
            stored.get(k).is_none(),
            "a reload without {k} removes it: {stored}"
        );
    }
    let (s, body) = dci
        .post("/specs", json!({"specs": [{"name": "s", "plugin": "echo", "concurrency": {"key": "k", "max": 0}}]}))
        .await;
    refused(s, &body, "concurrency.max");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .starts_with("specs[0]: "),
        "{body}"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn the_cli_sets_shows_and_clears_limits() {
    let db = TestDb::new("flow_view_cli").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    dci.post("/queues", json!({"name": "q", "plugin": "echo"}))
        .await;
    let (ok, text) = run(
        &dci,
        "limits q --rate 5/500ms --partition params.c --max-partitions 7 \
         --concurrency-key params.a --max 2 --ordered \
         --unique-key params.id --unique-states queued --unique-for 60",
    );
    assert!(ok, "{text}");
    assert!(text.starts_with("Set the limits of queue q"), "{text}");
    let limits = disbatch_model::limits::parse(&queue_doc(&db, "q").await).expect("limits");
    let rate = limits.rate.expect("rate");
    assert_eq!(
        (
            rate.starts,
            rate.per,
            rate.partition.as_deref(),
            rate.max_partitions
        ),
        (5, Duration::from_millis(500), Some("params.c"), 7)
    );
    let c = limits.concurrency.expect("concurrency");
    assert_eq!((c.key.as_str(), c.max, c.ordered), ("params.a", 2, true));
    let u = limits.unique.expect("unique");
    assert_eq!((u.states.len(), u.window), (1, Duration::from_secs(60)));

    let (ok, text) = output(&dci.cli(&["limits", "q"]));
    assert!(ok, "{text}");
    for want in [
        "rate_limit   5 starts per 0.5 s, per value of params.c (at most 7 live)",
        "  now        0 live partition(s), 0 with no start left",
        "concurrency  at most 2 running per value of params.a, ordered",
        "unique       per value of params.id, states [\"queued\"], for_s 60",
        "held         rate_limit 0, partition_limit 0, concurrency 0, ordered 0 (of 0 claimable",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }

    let (ok, text) = output(&dci.cli(&["limits", "q", "--rate", "none", "--unique-key", "none"]));
    assert!(ok, "{text}");
    let stored = queue_doc(&db, "q").await;
    assert!(
        stored.get("rate_limit").is_none() && stored.get("unique").is_none(),
        "{stored}"
    );
    assert!(stored.get("concurrency").is_some(), "{stored}");
    let (ok, text) =
        output(&dci.cli(&["update-queue", "q", "concurrency", r#"{"key": "params.b"}"#]));
    assert!(ok, "{text}");
    let limits = disbatch_model::limits::parse(&queue_doc(&db, "q").await).expect("limits");
    assert_eq!(
        limits.concurrency.map(|c| c.key),
        Some("params.b".to_string())
    );

    let (ok, text) = run(&dci, "limits q --unique-key params.id --unique-states done");
    assert!(!ok && text.contains("unique.states"), "{text}");
    let (ok, text) = output(&dci.cli(&["limits", "q", "--rate", "fast"]));
    assert!(!ok && text.contains("--rate takes STARTS/PERIOD"), "{text}");
    // A period as people write it.
    let (ok, text) = output(&dci.cli(&["limits", "q", "--rate", "5/min"]));
    assert!(ok, "{text}");
    let limits = disbatch_model::limits::parse(&queue_doc(&db, "q").await).expect("limits");
    let rate = limits.rate.expect("a rate limit");
    assert_eq!((rate.starts, rate.per.as_secs()), (5, 60), "{rate:?}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn claim_limits_are_refused_while_a_perl_node_serves_unless_forced() {
    let db = TestDb::new("flow_view_perl").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    // A stale Perl node is no reason to refuse; a live one is.
    db.insert_node("perl-old", Duration::from_secs(3600)).await;
    let (s, body) = dci
        .post(
            "/queues",
            json!({"name": "early", "plugin": "echo", "rate_limit": {"starts": 5, "per_s": 1}}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    db.insert_node("perl-live", Duration::ZERO).await;

    let (s, body) = dci
        .post(
            "/queues",
            json!({"name": "q", "plugin": "echo", "rate_limit": {"starts": 5, "per_s": 1}}),
        )
        .await;
    assert_eq!(s, 409, "{body}");
    let e = body["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("perl-live") && e.contains("rate_limit") && !e.contains("perl-old"),
        "{e}"
    );
    assert!(e.contains("\"force\": true"), "the way out is named: {e}");
    let (s, body) = dci
        .post(
            "/queues",
            json!({"name": "q", "plugin": "echo", "unique": {"key": "params.id"}}),
        )
        .await;
    assert_eq!(
        s, 200,
        "unique holds at creation, beside Perl nodes too: {body}"
    );
    let (s, body) = dci
        .post("/queues/q", json!({"concurrency": {"key": "params.a"}}))
        .await;
    assert_eq!(s, 409, "{body}");
    assert!(queue_doc(&db, "q").await.get("concurrency").is_none());
    let (s, body) = dci
        .post(
            "/queues/q",
            json!({"concurrency": {"key": "params.a"}, "force": true}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert!(queue_doc(&db, "q").await.get("concurrency").is_some());
    let (s, body) = dci.post("/queues/q", json!({"concurrency": null})).await;
    assert_eq!(s, 200, "removing a limit is never refused: {body}");

    let spec = json!({"name": "s", "plugin": "echo", "rate_limit": {"starts": 1, "per_s": 1}});
    let (s, body) = dci.post("/specs", json!({"specs": [spec.clone()]})).await;
    assert_eq!(s, 409, "{body}");
    let (s, body) = dci
        .post("/specs", json!({"specs": [spec], "force": true}))
        .await;
    assert_eq!(s, 200, "{body}");

    let (ok, text) = output(&dci.cli(&["limits", "q", "--rate", "5/1s"]));
    assert!(!ok && text.contains("perl-live"), "{text}");
    let (ok, text) = output(&dci.cli(&["limits", "q", "--rate", "5/1s", "--force"]));
    assert!(ok, "{text}");
    drop(dci);
    db.drop().await;
}
