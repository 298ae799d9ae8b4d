//! Flow limits through the DCI, its work-spec API and the CLI: setting and clearing them, bad
//! values refused with the field named, why a queued task is held and until when, a queue's
//! budget and held counts (the state written as nodes would), and the refusal beside Perl nodes.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
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
fn shown(ms: i64) -> Value {
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

fn output(out: &std::process::Output) -> (bool, String) {
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

/// A window document as a node's grants leave it.
async fn held_of(dci: &Dci, id: ObjectId) -> Value {
    let (s, t) = dci.get(&format!("/tasks/{}", id.to_hex())).await;
    assert_eq!(s, 200, "{t}");
    t.get("held").cloned().unwrap_or(Value::Null)
}

#[tokio::test]
async fn a_held_task_says_which_limit_why_and_until_when() {
    let db = TestDb::new("flow_view_held").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let now = DateTime::now().timestamp_millis();

    check_a_task_held_by_a_spent_rate_limit(&db, &dci, now).await;

    check_tasks_held_by_a_spent_partition_or_the_partition_limit(&db, &dci, now).await;

    check_a_task_held_by_its_concurrency_key(&db, &dci).await;

    check_a_task_held_behind_an_older_one_of_its_ordered_key(&db, &dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_a_task_held_by_a_spent_rate_limit(db: &TestDb, dci: &Dci, now: i64) {
    // Rate limit, no partition: 3 starts used of 3 in the last minute (and an old entry).
    let rated = db.insert_queue("rated", "echo", 4).await;
    db.set_queue(rated, doc! {"rate_limit": {"starts": 3, "per_s": 60}})
        .await;
    db.insert_rate_window(
        rated,
        Bson::Null,
        vec![(now - 120_000, 9), (now - 10_000, 2), (now - 5_000, 1)],
        now + 55_000,
    )
    .await;
    let r = db
        .insert_tasks(rated, vec![doc! {}.into(), doc! {}.into()])
        .await;
    let held = held_of(dci, r[0]).await;
    assert_eq!(held["limit"], json!("rate_limit"), "{held}");
    assert_eq!(
        held["until"],
        shown(now - 10_000 + 60_000),
        "the oldest live entry leaves"
    );
    assert!(
        held["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("3 of 3 starts in the last 60 s"),
        "{held}"
    );
    let (_, q) = dci.get("/queues/rated").await;
    assert_eq!(
        q["flow"]["rate_limit"],
        json!({"used": 3, "left": 0, "next_free": shown(now + 50_000)})
    );
    assert_eq!(q["flow"]["held"]["rate_limit"], json!(2), "{q}");
    // Neither a finished task nor a delayed one is held: they wait on nothing.
    db.set_task(r[1], doc! {"status": 1}).await;
    assert_eq!(held_of(dci, r[1]).await, Value::Null);
    db.set_task(
        r[1],
        doc! {"status": -2, "not_before": DateTime::from_millis(now + 3_600_000)},
    )
    .await;
    assert_eq!(held_of(dci, r[1]).await, Value::Null);
    let (ok, text) = output(&dci.cli(&["task", &r[0].to_hex()]));
    assert!(
        ok && text.contains("held") && text.contains("rate_limit: the rate limit is used up"),
        "{text}"
    );
    let (ok, text) = output(&dci.cli(&["limits", "rated"]));
    assert!(
        ok && text.contains("3 used, 0 left in the window; next start frees at"),
        "{text}"
    );
}

async fn check_tasks_held_by_a_spent_partition_or_the_partition_limit(
    db: &TestDb,
    dci: &Dci,
    now: i64,
) {
    // Partitioned: "a" spent, "b" has room, "z" has no window while 2 of 2 are live.
    let parts = db.insert_queue("parts", "echo", 4).await;
    db.set_queue(parts, doc! {"rate_limit": {"starts": 2, "per_s": 60, "partition": "params.c", "max_partitions": 2}}).await;
    db.insert_rate_window(
        parts,
        Bson::from("a"),
        vec![(now - 20_000, 2)],
        now + 40_000,
    )
    .await;
    db.insert_rate_window(
        parts,
        Bson::from("b"),
        vec![(now - 30_000, 1)],
        now + 30_000,
    )
    .await;
    let p = db
        .insert_tasks(
            parts,
            vec![
                doc! {"c": "a"}.into(),
                doc! {"c": "b"}.into(),
                doc! {"c": "z"}.into(),
            ],
        )
        .await;
    let held = held_of(dci, p[0]).await;
    assert_eq!(
        (held["limit"].clone(), held["until"].clone()),
        (json!("rate_limit"), shown(now + 40_000))
    );
    assert!(
        held["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("params.c \"a\""),
        "{held}"
    );
    assert_eq!(held_of(dci, p[1]).await, Value::Null, "b has a start left");
    let held = held_of(dci, p[2]).await;
    assert_eq!(held["limit"], json!("partition_limit"), "{held}");
    assert_eq!(
        held["until"],
        shown(now + 30_000),
        "when the soonest live partition expires"
    );
    let (_, q) = dci.get("/queues/parts").await;
    let budget = &q["flow"]["rate_limit"];
    assert_eq!(
        (
            budget["live_partitions"].clone(),
            budget["exhausted_partitions"].clone(),
            budget["max_partitions"].clone()
        ),
        (json!(2), json!(1), json!(2)),
        "{q}"
    );
    assert_eq!(
        budget["busiest"][0],
        json!({"partition": "a", "used": 2, "left": 0, "next_free": shown(now + 40_000)})
    );
    let held = &q["flow"]["held"];
    assert_eq!(
        (
            held["rate_limit"].clone(),
            held["partition_limit"].clone(),
            held["scanned"].clone()
        ),
        (json!(1), json!(1), json!(3))
    );
}

async fn check_a_task_held_by_its_concurrency_key(db: &TestDb, dci: &Dci) {
    // Concurrency: key "x" holds its one slot (a running task), "y" holds none.
    let keyed = db.insert_queue("keyed", "echo", 4).await;
    db.set_queue(keyed, doc! {"concurrency": {"key": "params.a", "max": 1}})
        .await;
    let k = db
        .insert_tasks(
            keyed,
            vec![
                doc! {"a": "x"}.into(),
                doc! {"a": "x"}.into(),
                doc! {"a": "y"}.into(),
            ],
        )
        .await;
    db.set_task(
        k[0],
        doc! {"status": 0, "node": "n1", "concurrency_key": "x", "concurrency_slot": 0},
    )
    .await;
    let held = held_of(dci, k[1]).await;
    assert_eq!(
        (held["limit"].clone(), held["until"].clone()),
        (json!("concurrency"), Value::Null),
        "{held}"
    );
    assert!(
        held["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("params.a \"x\" already has 1 running task(s)"),
        "{held}"
    );
    assert_eq!(held_of(dci, k[2]).await, Value::Null);
    let (_, q) = dci.get("/queues/keyed").await;
    assert_eq!(
        q["flow"]["concurrency"],
        json!({"holding": 1, "keys": 1, "keys_at_max": 1, "at_max": [{"key": "x", "holding": 1}]})
    );
    assert_eq!(q["flow"]["held"]["concurrency"], json!(1), "{q}");
    assert!(q["flow"].get("rate_limit").is_none(), "{q}");
}

async fn check_a_task_held_behind_an_older_one_of_its_ordered_key(db: &TestDb, dci: &Dci) {
    // Ordered: the older queued task of "k" starts first, though the key has room.
    let ordered = db.insert_queue("ordered", "echo", 4).await;
    db.set_queue(
        ordered,
        doc! {"concurrency": {"key": "params.a", "max": 2, "ordered": true}},
    )
    .await;
    let o = db
        .insert_tasks(
            ordered,
            vec![
                doc! {"a": "k"}.into(),
                doc! {"a": "k"}.into(),
                doc! {"a": "m"}.into(),
            ],
        )
        .await;
    assert_eq!(
        held_of(dci, o[0]).await,
        Value::Null,
        "the oldest of its key"
    );
    let held = held_of(dci, o[1]).await;
    assert_eq!(held["limit"], json!("ordered"), "{held}");
    assert!(
        held["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(&o[0].to_hex()),
        "{held}"
    );
    assert_eq!(held_of(dci, o[2]).await, Value::Null);
    let (_, q) = dci.get("/queues/ordered").await;
    assert_eq!(q["flow"]["held"]["ordered"], json!(1), "{q}");
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
