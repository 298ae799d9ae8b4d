//! The Coordinate scheduler in a real DEN: priority first, weights, max_getwork, paused queues.

use std::time::Duration;

use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{exposition, read_lines, wait_for, write_config, Den, TestDb};
use futures::StreamExt;
use serde_json::json;

async fn cap_node(db: &TestDb, node: &str, maxthreads: i32) {
    db.db
        .collection::<Document>("nodes")
        .insert_one(doc! {"node": node, "maxthreads": maxthreads})
        .await
        .expect("node doc");
}

async fn claimed_or_running(db: &TestDb, queue: bson::oid::ObjectId) -> u64 {
    db.count(doc! {"queue": queue, "status": {"$in": [status::CLAIMED, status::RUNNING]}})
        .await
}

#[tokio::test]
async fn higher_priority_queues_run_before_lower_ones() {
    let db = TestDb::new("sched_priority").await;
    let config = write_config(&db, "node.json", json!({}));
    cap_node(&db, "n1", 1).await;
    let runs = db.path("runs.txt").to_string_lossy().to_string();
    let low = db.insert_queue("low", "echo", 5).await;
    let high = db.insert_queue("high", "echo", 5).await;
    db.set_queue(high, doc! {"priority": 10}).await;
    // Low-priority tasks are older: without priorities they would run first.
    let low_ids = db
        .insert_tasks(
            low,
            (0..4).map(|_| doc! {"append_to": &runs}.into()).collect(),
        )
        .await;
    let high_ids = db
        .insert_tasks(
            high,
            (0..4).map(|_| doc! {"append_to": &runs}.into()).collect(),
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(
        &[low_ids.clone(), high_ids.clone()].concat(),
        Duration::from_secs(60),
    )
    .await;
    let order = read_lines(std::path::Path::new(&runs));
    let high_hex: Vec<String> = high_ids.iter().map(|i| i.to_hex()).collect();
    assert!(
        order[..4].iter().all(|id| high_hex.contains(id)),
        "high priority first: {order:?}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn max_getwork_limits_what_one_pass_claims_from_a_queue() {
    let db = TestDb::new("sched_getwork").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 10).await;
    db.set_queue(queue, doc! {"max_getwork": 2}).await;
    // All six are claimable at the node's first pass, with room for all: only max_getwork
    // stops that pass from taking them at once. Whatever wakes the node (timer, events,
    // runner exits), no pass may take more than two.
    let ids = db
        .insert_tasks(queue, (0..6).map(|_| doc! {}.into()).collect())
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    // A pass records its claims after it has handed them to runners.
    wait_for(
        "the claiming passes recorded",
        Duration::from_secs(30),
        || async { per_pass(&den.scrape().await, "sum") >= 6.0 },
    )
    .await;
    let text = den.scrape().await;
    let passes = per_pass(&text, "count");
    let at_most_two = per_pass(&text, "bucket");
    assert_eq!(per_pass(&text, "sum"), 6.0, "six claims\n{text}");
    assert_eq!(
        at_most_two, passes,
        "a pass claimed more than max_getwork 2 from the queue\n{text}"
    );
    assert!(passes >= 3.0, "{text}");
    drop(den);
    db.drop().await;
}

/// `disbatch_den_claims_per_pass` of queue "q": its `_sum`, `_count`, or `_bucket` le 2.
fn per_pass(text: &str, part: &str) -> f64 {
    let e = exposition::check(text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let name = format!("disbatch_den_claims_per_pass_{part}");
    let labels: &[(&str, &str)] = match part {
        "bucket" => &[("queue", "q"), ("le", "2")],
        _ => &[("queue", "q")],
    };
    e.value(&name, labels).unwrap_or(0.0)
}

#[tokio::test]
async fn paused_queues_are_skipped_until_resumed() {
    let db = TestDb::new("sched_paused").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 2).await;
    db.set_queue(queue, doc! {"disabled": true}).await;
    let ids = db.insert_tasks(queue, vec![doc! {}.into()]).await;
    let den = Den::start(&config, "n1");
    den.wait_queue_reads(3).await;
    assert_eq!(
        db.task(ids[0]).await.get_i32("status").ok(),
        Some(status::QUEUED),
        "a disabled queue runs nothing"
    );
    db.set_queue(queue, doc! {"disabled": false}).await;
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn weights_split_a_node_between_queues_of_equal_priority() {
    let db = TestDb::new("sched_weights").await;
    let config = write_config(&db, "node.json", json!({}));
    cap_node(&db, "n1", 11).await;
    let light = db.insert_queue("light", "echo", 50).await;
    let heavy = db.insert_queue("heavy", "echo", 50).await;
    db.set_queue(light, doc! {"weight": 1}).await;
    db.set_queue(heavy, doc! {"nice": 10}).await; // weight 20 - 10 = 10
                                                  // Held until the counts are read: no task ends and hands its slot on meanwhile.
    let gate = db.path("gate").to_string_lossy().to_string();
    for q in [light, heavy] {
        db.insert_tasks(
            q,
            (0..20).map(|_| doc! {"hold_until": &gate}.into()).collect(),
        )
        .await;
    }
    let den = Den::start(&config, "n1");
    wait_for("the node to fill", Duration::from_secs(60), || async {
        claimed_or_running(&db, light).await + claimed_or_running(&db, heavy).await == 11
    })
    .await;
    let (l, h) = (
        claimed_or_running(&db, light).await,
        claimed_or_running(&db, heavy).await,
    );
    assert!(
        (1..=3).contains(&l) && h >= 8,
        "weights 1 : 10 over 11 slots gave {l} : {h}"
    );
    std::fs::write(&gate, "").expect("open the gate");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn delayed_tasks_wait_for_not_before_and_priority_sort_orders_by_priority_then_key() {
    let db = TestDb::new("sched_units").await;
    let config = write_config(&db, "node.json", json!({}));
    let runs = db.path("runs.txt").to_string_lossy().to_string();
    let queue = db.insert_queue("q", "echo", 1).await;
    db.set_queue(queue, doc! {"sort": "priority"}).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..4).map(|_| doc! {"append_to": &runs}.into()).collect(),
        )
        .await;
    // Far ahead, so no start-up or runner on a loaded machine outlasts it: the test brings
    // it forward itself once the others have run.
    let later = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_600_000);
    let units = [
        (ids[0], doc! {"key": "b", "priority": 1}),
        (ids[1], doc! {"key": "a", "priority": 1}),
        (ids[2], doc! {"key": "z", "priority": 5}),
        (
            ids[3],
            doc! {"key": "0", "priority": 9, "not_before": later},
        ),
    ];
    for (id, set) in units {
        db.tasks()
            .update_one(doc! {"_id": id}, doc! {"$set": set})
            .await
            .expect("unit");
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids[..3], Duration::from_secs(30)).await;
    den.wait_queue_reads(3).await;
    assert_eq!(
        db.task(ids[3]).await.get_i32("status").ok(),
        Some(status::QUEUED),
        "not before its time"
    );
    db.set_task(ids[3], doc! {"not_before": bson::DateTime::now()})
        .await;
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    let order = read_lines(std::path::Path::new(&runs));
    let expected: Vec<String> = [ids[2], ids[1], ids[0], ids[3]]
        .iter()
        .map(|i| i.to_hex())
        .collect();
    assert_eq!(
        order, expected,
        "priority desc, then key asc; the delayed one last"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_continuous_queue_gets_exactly_one_unit_per_interval_across_two_nodes() {
    let db = TestDb::new("sched_continuous").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("tick", "echo", 2).await;
    db.set_queue(queue, doc! {"continuous": true, "interval": 1})
        .await;
    // Every turn a node takes, in server order: the turns are what the nodes agree on, and
    // reading them needs no guess at how late a unit's own timestamp was taken.
    let queues = db.db.collection::<Document>("queues");
    let mut stream = queues.watch().await.expect("watch the queues");
    let turns = tokio::spawn(async move {
        let mut next_turns = Vec::new();
        while let Some(event) = stream.next().await {
            let set = event
                .expect("queue change")
                .update_description
                .map(|u| u.updated_fields)
                .unwrap_or_default();
            if set.contains_key("test_end") {
                break;
            }
            if let Ok(next) = set.get_datetime("next_continuous") {
                next_turns.push(next.timestamp_millis());
            }
        }
        next_turns
    });
    let (n1, n2) = (Den::start(&config, "n1"), Den::start(&config, "n2"));
    wait_for("five units", Duration::from_secs(60), || async {
        db.count(doc! {"queue": queue}).await >= 5
    })
    .await;
    // No node left to make a unit: what is read below only changes by units finishing.
    drop((n1, n2));
    queues
        .update_one(doc! {"_id": queue}, doc! {"$set": {"test_end": true}})
        .await
        .expect("end marker");
    let next_turns = tokio::time::timeout(Duration::from_secs(60), turns)
        .await
        .expect("the change stream delivers the end marker")
        .expect("turn recorder");
    let mut cursor = db
        .tasks()
        .find(doc! {"queue": queue})
        .sort(doc! {"ctime": 1})
        .await
        .expect("find");
    let mut made = Vec::new();
    while cursor.advance().await.expect("advance") {
        made.push(cursor.deserialize_current().expect("task"));
    }
    // A turn is taken in the database only once the last one's interval has passed (both
    // nodes read one clock here), so each turn's next time is a full interval after the last.
    for pair in next_turns.windows(2) {
        assert!(
            pair[1] - pair[0] >= 1000,
            "two turns within one interval: {next_turns:?}"
        );
    }
    // A unit only with a turn of its own: two nodes making units for one turn would make
    // more units than turns (a turn taken just before the nodes died may have none yet).
    assert!(
        made.len() <= next_turns.len(),
        "{} units from {} turns: {next_turns:?}",
        made.len(),
        next_turns.len()
    );
    let mut keys = std::collections::HashSet::new();
    for t in &made {
        let key = t.get_str("key").expect("key");
        let (secs, ms) = key.split_once('.').expect("secs.ms");
        assert!(secs.parse::<i64>().is_ok() && ms.len() == 3, "{key}");
        assert!(keys.insert(key.to_string()), "two units named {key}");
    }
    // A new unit only once the last is done: at most one is not.
    let finished = made
        .iter()
        .filter(|t| t.get_i32("status").ok() == Some(status::SUCCEEDED))
        .count();
    assert!(
        finished + 1 >= made.len(),
        "the units ran: {finished} of {}",
        made.len()
    );
    db.drop().await;
}

#[tokio::test]
async fn a_node_serves_only_its_runtimes_and_queues_within_its_memory() {
    let db = TestDb::new("sched_runtimes").await;
    let config = write_config(&db, "node.json", json!({"runtimes": ["go"]}));
    let go = db.insert_queue("go", "echo", 2).await;
    let plain = db.insert_queue("plain", "echo", 2).await;
    let huge = db.insert_queue("huge", "echo", 2).await;
    db.set_queue(go, doc! {"runtime": "go"}).await;
    db.set_queue(huge, doc! {"runtime": "go", "min_gb": 1.0e6})
        .await;
    let ran = db.insert_tasks(go, vec![doc! {}.into()]).await;
    let skipped = [
        db.insert_tasks(plain, vec![doc! {}.into()]).await[0],
        db.insert_tasks(huge, vec![doc! {}.into()]).await[0],
    ];
    let den = Den::start(&config, "n1");
    db.wait_complete(&ran, Duration::from_secs(30)).await;
    den.wait_queue_reads(3).await;
    for id in skipped {
        assert_eq!(
            db.task(id).await.get_i32("status").ok(),
            Some(status::QUEUED)
        );
    }
    let log = den.log_text();
    assert!(
        log.contains("runtime \\\"\\\" is not one this node serves")
            || log.contains("runtime \"\" is not one this node serves"),
        "{log}"
    );
    assert!(log.contains("needs 1000000 GB"), "{log}");
    let node = db.node("n1").await;
    assert_eq!(
        node.get_array("runtimes").map(|r| r.len()).ok(),
        Some(1),
        "{node}"
    );
    drop(den);
    db.drop().await;
}
