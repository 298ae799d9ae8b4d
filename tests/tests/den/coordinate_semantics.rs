//! Coordinate's unit semantics in a real DEN: missing priorities rank as 0, priorities are
//! floats, the empty key is a key, lost attempts use up retries and then fail the unit, and
//! a runner that dies is recovered at once by the node that saw it die.

use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{read_lines, wait_for, write_config, Dci, Den, TestDb};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

fn oid(v: &serde_json::Value) -> ObjectId {
    let hex = v["$oid"].as_str().or(v.as_str()).expect("an id");
    ObjectId::parse_str(hex).expect("object id")
}

#[tokio::test]
async fn a_unit_without_priority_ranks_as_zero_and_priorities_are_floats() {
    let db = TestDb::new("coord_priority").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let runs = db.path("runs.txt").to_string_lossy().to_string();
    // Paused (threads 0) while units go in, then one at a time: the run order is the claim order.
    let (s, _) = dci
        .post(
            "/queues",
            json!({"name": "q", "plugin": "echo", "threads": 0, "sort": "priority"}),
        )
        .await;
    assert_eq!(s, 200);
    let params = json!({"append_to": runs});
    let (s, out) = dci
        .post(
            "/queues/q/units",
            json!({"units": [
                {"key": "low", "params": params, "priority": -1},
                {"key": "none", "params": params},
                {"key": "zero", "params": params, "priority": 0},
                {"key": "", "params": params},
                {"key": "b", "params": params, "priority": 2.5},
                {"key": "a", "params": params, "priority": 2.7},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let id_of = |key: &str| {
        out["inserted"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["key"] == key))
            .map(|i| oid(&i["_id"]))
            .unwrap_or_else(|| panic!("unit {key:?} inserted: {out}"))
    };
    // What chained, continuous and hand-inserted tasks look like: no key, no priority.
    let queue = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"name": "q"})
        .await
        .expect("find")
        .expect("queue")
        .get_object_id("_id")
        .expect("id");
    let by_hand = db
        .insert_tasks(queue, vec![doc! {"append_to": &runs}.into()])
        .await[0];

    let a = id_of("a");
    let stored = db.task(a).await;
    assert_eq!(stored.get_f64("priority").ok(), Some(2.7), "{stored}");
    let (s, shown) = dci.get(&format!("/tasks/{a}")).await;
    assert_eq!(s, 200);
    assert_eq!(shown["priority"], json!(2.7), "{shown}");
    assert_eq!(
        db.task(id_of("zero")).await.get_i64("priority").ok(),
        Some(0),
        "a whole priority stays an integer"
    );
    let empty = db.task(id_of("")).await;
    assert_eq!(empty.get_str("key").ok(), Some(""), "{empty}");

    db.set_queue(queue, doc! {"threads": 1}).await;
    let den = Den::start(&config, "n1");
    let all = [
        a,
        id_of("b"),
        by_hand,
        id_of(""),
        id_of("none"),
        id_of("zero"),
        id_of("low"),
    ];
    db.wait_complete(&all, Duration::from_secs(60)).await;
    let order = read_lines(std::path::Path::new(&runs));
    let expected: Vec<String> = all.iter().map(|i| i.to_hex()).collect();
    assert_eq!(
        order, expected,
        "2.7, 2.5, then every unit ranking 0 (none or 0) by key (a missing key first), then -1"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn spec_queues_requeue_lost_units_and_plain_queues_orphan_them() {
    let db = TestDb::new("coord_on_lost").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let (s, out) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "spec-q"}, {"name": "spec-o", "on_lost": "orphan", "worker": "persistent",
                "worker_idle_s": 5, "worker_max_tasks": 0, "worker_max_rss_mb": 256, "worker_start_s": 0.5}],
                "plugin": "echo"}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let (s, _) = dci
        .post("/queues", json!({"name": "plain", "plugin": "echo"}))
        .await;
    assert_eq!(s, 200);
    let queues = db.db.collection::<Document>("queues");
    let on_lost = |name: &'static str| {
        let queues = queues.clone();
        async move {
            queues
                .find_one(doc! {"name": name})
                .await
                .expect("find")
                .expect(name)
                .get_str("on_lost")
                .ok()
                .map(str::to_string)
        }
    };
    assert_eq!(on_lost("spec-q").await.as_deref(), Some("requeue"));
    assert_eq!(on_lost("spec-o").await.as_deref(), Some("orphan"));
    assert_eq!(on_lost("plain").await, None, "Disbatch queues keep orphan");
    // The worker fields are stored with the types a node reads: a word, seconds as doubles,
    // limits as integers (0: no limit); a spec without them keeps a process per task.
    let spec_o = queues
        .find_one(doc! {"name": "spec-o"})
        .await
        .expect("find")
        .expect("spec-o");
    for (field, value) in [
        ("worker", Bson::String("persistent".into())),
        ("worker_idle_s", Bson::Double(5.0)),
        ("worker_max_tasks", Bson::Int64(0)),
        ("worker_max_rss_mb", Bson::Int64(256)),
        ("worker_start_s", Bson::Double(0.5)),
    ] {
        assert_eq!(spec_o.get(field), Some(&value), "{field}: {spec_o}");
    }
    let spec_q = queues
        .find_one(doc! {"name": "spec-q"})
        .await
        .expect("find")
        .expect("spec-q");
    assert!(spec_q.get("worker").is_none(), "{spec_q}");
    db.drop().await;
}

/// The pid of the runner of `task`, as its node reports it on its document.
async fn runner_pid(db: &TestDb, node: &str, task: ObjectId, not: i32) -> i32 {
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(60));
    let mut backoff = disbatch_tests::Backoff::new();
    loop {
        let n = db.node(node).await;
        let pid = n
            .get_array("runners")
            .ok()
            .and_then(|rs| {
                rs.iter().filter_map(Bson::as_document).find_map(|r| {
                    (r.get_object_id("task").ok() == Some(task))
                        .then(|| r.get_i64("pid").unwrap_or(0) as i32)
                })
            })
            .unwrap_or(0);
        if pid > 0 && pid != not {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no runner reported for {task}: {n}"
        );
        backoff.wait().await;
    }
}

/// Kills the runner of `task` and returns how long until the task no longer runs as the
/// attempt that runner had.
async fn kill_runner_and_time_recovery(
    db: &TestDb,
    node: &str,
    task: ObjectId,
    killed_before: &mut i32,
) -> Duration {
    let pid = runner_pid(db, node, task, *killed_before).await;
    *killed_before = pid;
    let attempt = db.task(task).await.get_object_id("attempt").ok();
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill the runner");
    let killed = Instant::now();
    let mut backoff = disbatch_tests::Backoff::new();
    loop {
        let t = db.task(task).await;
        if t.get_object_id("attempt").ok() != attempt
            || t.get_i32("status").ok() != Some(status::RUNNING)
        {
            return killed.elapsed();
        }
        assert!(
            killed.elapsed() < disbatch_tests::scaled(Duration::from_secs(90)),
            "never recovered: {t}"
        );
        backoff.wait().await;
    }
}

#[tokio::test]
async fn a_killed_runner_is_recovered_at_once_and_lost_attempts_use_up_retries() {
    let db = TestDb::new("coord_runner_kill").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("lossy", "echo", 1).await;
    // Default lease (30 s): only the node that saw its runner die can recover it sooner.
    db.set_queue(queue, doc! {"on_lost": "requeue", "max_retries": 2_i64})
        .await;
    // A gate that never opens: the plugin ends only with its killed runner.
    let gate = db.path("never-opened");
    let task = db
        .insert_tasks(
            queue,
            vec![doc! {"hold_until": gate.to_string_lossy().to_string()}.into()],
        )
        .await[0];
    let den = Den::start(&config, "n1");
    wait_for(
        "the first attempt to run",
        Duration::from_secs(60),
        || async { db.task(task).await.get_i32("status").ok() == Some(status::RUNNING) },
    )
    .await;
    let mut killed = 0;
    let first = kill_runner_and_time_recovery(&db, "n1", task, &mut killed).await;
    // A figure: that the node recovered it at once, not at the end of its 30 s lease, is
    // the lost attempt's reason below (a lease recovery says "its lease passed").
    println!("runner-kill recovery (first kill, requeued): {first:?}");
    let t = db.task(task).await;
    assert_eq!(
        t.get_i32("status").ok(),
        Some(status::QUEUED),
        "queued again: {t}"
    );
    assert!(
        t.get_datetime("not_before").is_ok(),
        "claimable again after a pause, so a runner that always dies cannot spin: {t}"
    );
    let lost = db.closed_attempts(task, 1).await;
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].get_str("outcome").ok(), Some("lost"));
    let reason = lost[0].get_str("reason").unwrap_or_default();
    assert!(
        reason.contains("exited without a result") && reason.contains("signal"),
        "{reason}"
    );

    // The second attempt is the last max_retries allows: losing it fails the unit.
    wait_for(
        "the second attempt to run",
        Duration::from_secs(60),
        || async {
            let t = db.task(task).await;
            t.get_i32("status").ok() == Some(status::RUNNING)
                && t.get_i32("attempts").ok() == Some(2)
        },
    )
    .await;
    let second = kill_runner_and_time_recovery(&db, "n1", task, &mut killed).await;
    println!("runner-kill recovery (second kill, failed): {second:?}");
    let t = db.task(task).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    let stderr = t.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.starts_with("too many retries: attempt 2 of 2 (max_retries) was lost")
            && stderr.contains("exited without a result"),
        "{stderr}"
    );
    assert_eq!(t.get_bool("complete").ok(), Some(true));
    assert!(
        t.get("slot").is_none() && t.get("lease_until").is_none(),
        "{t}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn retries_used_up_by_an_expired_lease_fail_the_unit() {
    let db = TestDb::new("coord_lease_retries").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("lossy", "echo", 1).await;
    db.set_queue(
        queue,
        doc! {"on_lost": "requeue", "max_retries": 3_i64, "lease": 3.0},
    )
    .await;
    let spent = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let room = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 60_000);
    for (id, attempts) in [(spent, 3_i32), (room, 1)] {
        db.set_task(
            id,
            doc! {"status": 0, "node": "gone", "lease_until": past, "attempts": attempts,
            "attempt": ObjectId::new(), "slot": i64::from(attempts), "mtime": past},
        )
        .await;
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&[spent, room], Duration::from_secs(60))
        .await;
    let t = db.task(spent).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    let stderr = t.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.starts_with("too many retries: attempt 3 of 3 (max_retries) was lost")
            && stderr.contains("lease passed on node gone"),
        "{stderr}"
    );
    let t = db.task(room).await;
    assert_eq!(
        t.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "a lost attempt with retries left runs again: {t}"
    );
    drop(den);
    db.drop().await;
}
