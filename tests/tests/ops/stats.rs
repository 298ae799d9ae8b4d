//! Per-minute statistics: the maintenance leader writes correct buckets for a known workload,
//! one node writes them however many run, a leader change writes no minute twice, `GET /stats`
//! serves them, and the collection expires. Buckets are 1–2 s wide here (`stats_interval_s`),
//! so no test waits real minutes.

use std::collections::HashSet;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Browser, Dci, Den, TestDb};
use futures::TryStreamExt;
use serde_json::{json, Value};

async fn buckets(db: &TestDb, filter: Document) -> Vec<Document> {
    db.db
        .collection::<Document>("stats_minutely")
        .find(filter)
        .sort(doc! {"minute": 1})
        .await
        .expect("find stats")
        .try_collect()
        .await
        .expect("read stats")
}

fn count(d: &Document, k: &str) -> i64 {
    d.get_i64(k).unwrap_or_else(|_| panic!("{k} in {d}"))
}

/// The latest minute the keeper finished, in ms.
async fn written_until(db: &TestDb) -> i64 {
    buckets(db, doc! {"queue": Bson::Null})
        .await
        .last()
        .and_then(|d| d.get_datetime("minute").ok())
        .map_or(0, |t| t.timestamp_millis())
}

/// Waits until every attempt so far ended in a minute the keeper finished.
async fn wait_counted(db: &TestDb, width_ms: i64) {
    let attempts: Vec<Document> = db
        .db
        .collection::<Document>("attempts")
        .find(doc! {})
        .await
        .expect("attempts")
        .try_collect()
        .await
        .expect("attempts");
    let last_end = attempts
        .iter()
        .filter_map(|a| a.get_datetime("end").ok())
        .map(|t| t.timestamp_millis())
        .max()
        .unwrap_or(0);
    let minute = last_end.div_euclid(width_ms) * width_ms;
    wait_for(
        "the keeper to count every attempt",
        Duration::from_secs(30),
        || async { written_until(db).await >= minute },
    )
    .await;
}

#[tokio::test]
async fn the_leader_counts_a_known_workload_and_get_stats_serves_it() {
    let db = TestDb::new("stats_workload").await;
    let config = write_config(&db, "node.json", json!({"stats_interval_s": 2}));
    let work = db.insert_queue("work", "echo", 4).await;
    // Never served (threads 0): its depth stays 2.
    let idle = db.insert_queue("idle", "echo", 0).await;
    db.insert_tasks(idle, vec![doc! {}.into(), doc! {}.into()])
        .await;
    // A running task of a node that is gone, whose lease passed: recovery closes its attempt
    // as lost (and orphans it, the default `on_lost`).
    // A node recovers only after a lease plus 5 s of its own connection: a 3 s lease.
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": work}, doc! {"$set": {"lease": 3.0}})
        .await
        .expect("lease");
    let lost = db.insert_tasks(work, vec![doc! {}.into()]).await[0];
    let past = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() - 60_000);
    db.set_task(
        lost,
        doc! {"status": 0, "node": "gone", "lease_until": past, "attempts": 1,
        "attempt": ObjectId::new(), "mtime": past},
    )
    .await;
    let den = Den::start(&config, "n1");
    let mut params: Vec<Bson> = (0..5).map(|_| doc! {"sleep_ms": 300}.into()).collect();
    params.extend((0..3).map(|_| Bson::from(doc! {"exit_code": 3})));
    let ids = db.insert_tasks(work, params).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    // Recovery changes the task first and writes its lost attempt's record after: the record,
    // not the task's status, is what the keeper counts and `wait_counted` reads.
    wait_for(
        "the lost task's recovery and its attempt record",
        Duration::from_secs(30),
        || async {
            db.task(lost).await.get_i32("status").ok() == Some(status::ORPHANED)
                && db
                    .db
                    .collection::<Document>("attempts")
                    .find_one(doc! {"task": lost, "outcome": "lost"})
                    .await
                    .expect("read attempts")
                    .is_some()
        },
    )
    .await;
    wait_counted(&db, 2_000).await;

    check_the_buckets_count_the_workload(&db, work, idle).await;

    check_the_ttl_and_unique_indexes(&db).await;

    // GET /stats, by name and by id, and with bad parameters.
    let dci = Dci::start(&config);
    check_get_stats_by_name_by_id_and_with_bad_parameters(&dci, work).await;
    drop(den);
    drop(dci);
    db.drop().await;
}

async fn check_the_buckets_count_the_workload(db: &TestDb, work: ObjectId, idle: ObjectId) {
    let of_work = buckets(db, doc! {"queue": work}).await;
    let sum = |k: &str| of_work.iter().map(|d| count(d, k)).sum::<i64>();
    assert_eq!(
        (sum("succeeded"), sum("failed"), sum("lost")),
        (5, 3, 1),
        "{of_work:?}"
    );
    let node_sum: i64 = of_work
        .iter()
        .flat_map(|d| d.get_array("nodes").expect("nodes").clone())
        .map(|n| {
            let n = n.as_document().expect("node doc").clone();
            match n.get_str("node") {
                Ok("n1") => count(&n, "succeeded") + count(&n, "failed"),
                // The lost attempt counts for the node that ran it.
                Ok("gone") => 100 * count(&n, "lost"),
                other => panic!("node {other:?}"),
            }
        })
        .sum();
    assert_eq!(node_sum, 108);
    // The sleeping attempts took 300 ms or more; some bucket holds one as its p95.
    let p95s: Vec<f64> = of_work
        .iter()
        .filter_map(|d| d.get_f64("p95_ms").ok())
        .collect();
    assert!(p95s.iter().any(|p| *p >= 300.0), "{of_work:?}");
    assert!(of_work.iter().all(|d| d.get_str("writer") == Ok("n1")));
    // The fleet's buckets hold the same totals.
    let fleet = buckets(db, doc! {"queue": Bson::Null}).await;
    assert_eq!(fleet.iter().map(|d| count(d, "succeeded")).sum::<i64>(), 5);
    // The idle queue's depth shows in the buckets written since it had tasks.
    wait_for(
        "the idle queue's depth",
        Duration::from_secs(20),
        || async {
            !buckets(db, doc! {"queue": idle, "queued": 2_i64})
                .await
                .is_empty()
        },
    )
    .await;
}

async fn check_the_ttl_and_unique_indexes(db: &TestDb) {
    // The retention is a TTL index; the minute and queue are unique.
    let indexes: Vec<Document> = db
        .db
        .collection::<Document>("stats_minutely")
        .list_indexes()
        .await
        .expect("indexes")
        .try_collect::<Vec<_>>()
        .await
        .expect("indexes")
        .into_iter()
        .map(|m| bson::to_document(&m).expect("index doc"))
        .collect();
    let ttl = indexes
        .iter()
        .find(|i| i.get_document("key").ok() == Some(&doc! {"minute": 1}))
        .expect("TTL index");
    let expire = ttl
        .get_document("options")
        .ok()
        .and_then(|o| o.get("expireAfterSeconds").cloned())
        .or_else(|| ttl.get("expireAfterSeconds").cloned());
    assert_eq!(
        expire.and_then(|e| e.as_i64().or(e.as_i32().map(i64::from))),
        Some(7 * 24 * 3600),
        "{indexes:?}"
    );
    assert!(
        indexes.iter().any(|i| {
            i.get_document("key").ok() == Some(&doc! {"minute": 1, "queue": 1})
                && (i.get_bool("unique") == Ok(true)
                    || i.get_document("options").and_then(|o| o.get_bool("unique")) == Ok(true))
        }),
        "{indexes:?}"
    );
}

async fn check_get_stats_by_name_by_id_and_with_bad_parameters(dci: &Dci, work: ObjectId) {
    let (status, by_name) = dci.get("/stats?minutes=10&queue=work").await;
    assert_eq!(status, 200, "{by_name}");
    let rows = by_name.as_array().expect("array");
    let total =
        |rows: &[Value], k: &str| rows.iter().map(|r| r[k].as_i64().unwrap_or(0)).sum::<i64>();
    assert_eq!((total(rows, "succeeded"), total(rows, "failed")), (5, 3));
    assert!(rows
        .iter()
        .all(|r| r["queue"] == "work" && r["queue_id"] == work.to_hex()));
    let minutes: Vec<i64> = rows
        .iter()
        .map(|r| r["minute"].as_i64().expect("minute"))
        .collect();
    assert!(
        minutes.windows(2).all(|w| w[0] <= w[1]),
        "sorted: {minutes:?}"
    );
    assert!(rows
        .iter()
        .any(|r| r["p95_ms"].as_f64().is_some_and(|p| p >= 300.0)));
    let (status, by_id) = dci
        .get(&format!("/stats?minutes=10&queue={}", work.to_hex()))
        .await;
    assert_eq!(status, 200);
    assert_eq!(by_id, by_name);
    let (status, all) = dci.get("/stats").await;
    assert_eq!(status, 200);
    let all = all.as_array().expect("array");
    assert!(all.iter().any(|r| r["queue"].is_null()), "fleet rows");
    assert!(all.iter().any(|r| r["queue"] == "idle"));
    assert_eq!(
        total(
            all.iter()
                .filter(|r| r["queue"].is_null())
                .cloned()
                .collect::<Vec<_>>()
                .as_slice(),
            "failed"
        ),
        3
    );
    for bad in [
        "minutes=0",
        "minutes=10081",
        "minutes=ten",
        "minutes=-5",
        "queue=",
    ] {
        let (status, body) = dci.get(&format!("/stats?{bad}")).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].is_string() || body.is_string() || body.is_object(),
            "{body}"
        );
    }
    let (status, _) = dci.get("/stats?queue=nope").await;
    assert_eq!(status, 404);
    let (status, _) = dci
        .get(&format!("/stats?queue={}", ObjectId::new().to_hex()))
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn one_node_writes_and_a_leader_change_writes_no_minute_twice() {
    let db = TestDb::new("stats_leader").await;
    let config = write_config(&db, "node.json", json!({"stats_interval_s": 1}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let mut dens = vec![Den::start(&config, "n1"), Den::start(&config, "n2")];
    let ids = db
        .insert_tasks(queue, (0..4).map(|_| doc! {}.into()).collect())
        .await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    wait_counted(&db, 1_000).await;
    let before = buckets(&db, doc! {}).await;
    let writers: HashSet<&str> = before
        .iter()
        .map(|d| d.get_str("writer").expect("writer"))
        .collect();
    assert_eq!(writers.len(), 1, "one writer while both run: {writers:?}");
    let first = writers.into_iter().next().expect("writer").to_string();

    // The leader dies without handing over; the other takes over and fills the gap.
    let at = dens.iter().position(|d| d.node == first).expect("leader");
    dens[at].kill_hard();
    let second = if first == "n1" { "n2" } else { "n1" };
    wait_for(
        "the other node to write statistics",
        Duration::from_secs(30),
        || async { !buckets(&db, doc! {"writer": second}).await.is_empty() },
    )
    .await;
    let ids = db
        .insert_tasks(queue, (0..3).map(|_| doc! {}.into()).collect())
        .await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    wait_counted(&db, 1_000).await;

    let after = buckets(&db, doc! {}).await;
    let mut seen = HashSet::new();
    for d in &after {
        let key = (
            d.get_datetime("minute").expect("minute").timestamp_millis(),
            d.get("queue").cloned().map(|q| q.to_string()),
        );
        assert!(seen.insert(key.clone()), "written twice: {key:?}");
    }
    // No minute is missing between the first and the last: the new leader filled the gap.
    let fleet: Vec<i64> = after
        .iter()
        .filter(|d| d.get("queue") == Some(&Bson::Null))
        .map(|d| d.get_datetime("minute").expect("minute").timestamp_millis())
        .collect();
    assert!(fleet.windows(2).all(|w| w[1] - w[0] == 1_000), "{fleet:?}");
    let succeeded: i64 = after
        .iter()
        .filter(|d| d.get("queue") == Some(&Bson::ObjectId(queue)))
        .map(|d| count(d, "succeeded"))
        .sum();
    assert_eq!(succeeded, 7);
    // Buckets the first leader wrote were kept, not rewritten by the second.
    for d in &before {
        let same = after
            .iter()
            .find(|a| a.get("_id") == d.get("_id"))
            .expect("kept");
        assert_eq!(same.get_str("writer"), Ok(first.as_str()));
    }
    drop(dens);
    db.drop().await;
}

/// [buckets drawn, lines, canvas width, canvas height, legend text] of one uPlot chart.
async fn chart(b: &Browser, id: &'static str) -> Value {
    b.client
        .execute(
            &format!(
                "const box = document.getElementById('{id}'); \
                 const c = box && box.querySelector('.uplot canvas'); \
                 if (!c) return null; \
                 const r = c.getBoundingClientRect(); \
                 return [Number(box.dataset.points), Number(box.dataset.series), \
                 r.width, r.height, box.querySelector('.u-legend').textContent]"
            ),
            vec![],
        )
        .await
        .expect("chart")
}

/// The Charts page draws the stored buckets with the vendored uPlot: a canvas per chart with
/// every bucket of the range for throughput, depth, durations and each node, at desktop and at
/// phone width, with nothing blocked by the CSP.
#[tokio::test]
async fn the_charts_page_draws_the_statistics() {
    let db = TestDb::new("stats_charts").await;
    let config = write_config(&db, "node.json", json!({"stats_interval_s": 2}));
    let queue = db.insert_queue("busy <b>queue</b>", "echo", 4).await;
    let dens = vec![Den::start(&config, "n1"), Den::start(&config, "n2")];
    let mut params: Vec<Bson> = (0..12).map(|_| doc! {"sleep_ms": 100}.into()).collect();
    params.extend((0..4).map(|_| Bson::from(doc! {"exit_code": 1})));
    let ids = db.insert_tasks(queue, params).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    wait_counted(&db, 2_000).await;
    let dci = Dci::start(&config);

    let fleet_before = buckets(&db, doc! {"queue": Bson::Null}).await.len() as u64;
    let b = Browser::start(1280, 900).await;
    b.record_csp_violations().await;
    b.open(&format!("{}/#/charts?minutes=60", dci.url), "charts")
        .await;
    check_each_chart_draws_every_fleet_bucket(&db, &b, fleet_before).await;

    check_one_queue_chosen_by_the_selector_is_named_as_text(&dci, &b, queue).await;

    check_the_charts_fit_a_phone(&dci, &b).await;
    b.close().await;
    drop(dens);
    drop(dci);
    db.drop().await;
}

async fn check_each_chart_draws_every_fleet_bucket(db: &TestDb, b: &Browser, fleet_before: u64) {
    let fleet_after = buckets(db, doc! {"queue": Bson::Null}).await.len() as u64;
    for id in [
        "chart-throughput",
        "chart-depth",
        "chart-duration",
        "chart-nodes",
    ] {
        let c = chart(b, id).await;
        assert!(c.is_array(), "{id} has a uPlot canvas");
        // Every fleet bucket of the hour is drawn (more may be written while the page loads).
        let drawn = c[0].as_u64().unwrap_or(0);
        assert!(
            drawn > 0 && drawn >= fleet_before && drawn <= fleet_after,
            "{id}: {c}, buckets {fleet_before}..{fleet_after}"
        );
        assert!(c[2].as_f64() > Some(200.0), "{id} canvas width: {c}");
        assert!(c[3].as_f64() > Some(100.0), "{id} canvas height: {c}");
    }
    let throughput = chart(b, "chart-throughput").await;
    assert_eq!(throughput[1], 3, "succeeded, failed and lost lines");
    let legend = throughput[4].as_str().unwrap_or("");
    for name in ["succeeded", "failed", "lost"] {
        assert!(legend.contains(name), "{legend}");
    }
    let nodes = chart(b, "chart-nodes").await;
    assert!(
        nodes[1].as_u64() >= Some(1),
        "a line per node that ran tasks: {nodes}"
    );
    let legend = nodes[4].as_str().unwrap_or("");
    assert!(legend.contains("n1") || legend.contains("n2"), "{legend}");
    b.screenshot("charts").await;
}

async fn check_one_queue_chosen_by_the_selector_is_named_as_text(
    dci: &Dci,
    b: &Browser,
    queue: ObjectId,
) {
    // One queue, chosen from the selector: its name is text, never markup.
    b.open(
        &format!("{}/#/charts?minutes=60&queue={}", dci.url, queue.to_hex()),
        "charts",
    )
    .await;
    let option = b
        .find(&format!(
            "#charts-queue option[value=\"{}\"]",
            queue.to_hex()
        ))
        .await;
    assert_eq!(option.text().await.expect("text"), "busy <b>queue</b>");
    let one = chart(b, "chart-throughput").await;
    assert!(one[0].as_u64() > Some(0), "{one}");
    assert!(b
        .client
        .execute(
            "return document.querySelector('#charts b') === null",
            vec![]
        )
        .await
        .expect("no markup")
        .as_bool()
        .unwrap_or(false));
    assert_eq!(b.csp_violations().await, Vec::<String>::new());
}

async fn check_the_charts_fit_a_phone(dci: &Dci, b: &Browser) {
    // At phone width the charts fit the screen.
    b.emulate_phone(390, 844).await;
    b.open(&format!("{}/#/charts", dci.url), "charts").await;
    let fits = b
        .client
        .execute(
            "return [document.documentElement.scrollWidth, \
             document.querySelector('#chart-throughput .uplot canvas').getBoundingClientRect().width]",
            vec![],
        )
        .await
        .expect("widths");
    assert!(
        fits[0].as_f64() <= Some(390.0),
        "no sideways scrolling: {fits}"
    );
    assert!(
        fits[1].as_f64() > Some(250.0),
        "the chart uses the width: {fits}"
    );
    b.screenshot("charts-phone").await;
}
