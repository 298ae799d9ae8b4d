//! Why a task is held, as the API shows it: the limit (rate window, partition, concurrency key or
//! an older task of its ordered key), the reason and until when.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

use super::flow_limits_view::{output, shown};

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
