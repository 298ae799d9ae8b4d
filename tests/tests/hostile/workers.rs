//! Persistent workers that attack their worker host: a `done` line far over the result limit,
//! stderr that forges lines in the node's log, a grandchild left behind to write into later
//! tasks. The host must fail the task, stay small, log escaped text and leave no process.

use std::path::PathBuf;
use std::time::Duration;

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::status;
use disbatch_tests::alive;
use disbatch_tests::bench::procfs;
use disbatch_tests::{scaled, wait_for, write_config, Den, TestDb};
use serde_json::json;

/// A persistent queue of `plugin`, one slot, quick to give up on a worker.
async fn worker_queue(db: &TestDb, plugin: &str, more: bson::Document) -> ObjectId {
    let queue = db.insert_queue(plugin, plugin, 1).await;
    let mut set = doc! {"worker": "persistent", "worker_start_s": 5, "kill_grace": 1};
    set.extend(more);
    db.db
        .collection::<bson::Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": set})
        .await
        .expect("queue");
    queue
}

/// The node's worker host: its child started with `--worker-host`.
fn worker_host(den: &Den) -> Option<u32> {
    procfs::children(den.pid().as_raw() as u32)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"--worker-host"))
        })
}

/// The start of a worker's script: says ready, reads one task and finds its attempt.
const READY_AND_READ_TASK: &str = r#"echo '{"type":"ready","protocol":1}' >&3
read line <&3
attempt=$(printf '%s' "$line" | sed -n 's/.*"attempt":"\([0-9a-f]*\)".*/\1/p')"#;

/// A worker answering its task with a `done` that carries a member the protocol ignores: an
/// array of `elements` zeros (two bytes each), which a parse into a JSON tree turns into 32
/// bytes each.
fn junk_worker(db: &TestDb, name: &str, elements: u32) -> PathBuf {
    let body = format!(
        r#"{READY_AND_READ_TASK}
{{ printf '{{"type":"done","attempt":"%s","exit":0,"result":{{"kept":1}},"junk":[' "$attempt"; yes 0 | head -n {elements} | tr '\n' ','; printf '0]}}\n'; }} >&3
read line <&3"#
    );
    db.script(name, &body)
}

#[tokio::test]
async fn a_done_line_far_over_the_result_limit_fails_its_task_and_the_host_stays_small() {
    let db = TestDb::new("hw_big_done").await;
    // About 33 MB, under the 32 MiB line limit of the task side.
    let big = junk_worker(&db, "big.sh", 16_400_000);
    // About 16.4 MB, just under the cap on a worker's line: its junk is skipped, not built.
    let near = junk_worker(&db, "near.sh", 8_200_000);
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"big": big, "near": near}}),
    );
    let mut ids = Vec::new();
    for plugin in ["big", "near"] {
        let queue = worker_queue(&db, plugin, doc! {}).await;
        ids.push(db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await[0]);
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, scaled(Duration::from_secs(120)))
        .await;
    let host = worker_host(&den).expect("the node's worker host is running");
    let peak_kib = procfs::peak_rss_kib(host).expect("the worker host's VmHWM");
    println!("worker host peak RSS: {} MiB", peak_kib / 1024);
    let big_task = db.task(ids[0]).await;
    let stderr = big_task.get_str("stderr").unwrap_or("");
    assert_eq!(
        big_task.get_i32("status").ok(),
        Some(status::FAILED),
        "{stderr}"
    );
    assert!(
        stderr.contains("worker protocol error: a line longer than")
            && stderr.contains("16 MiB result limit"),
        "the reason names the cap: {stderr}"
    );
    let near_task = db.task(ids[1]).await;
    assert_eq!(
        near_task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{near_task}"
    );
    let attempts = db.closed_attempts(ids[1], 1).await;
    let result = attempts.last().and_then(|a| a.get_document("result").ok());
    assert!(
        result.is_some_and(|r| r.contains_key("kept") && !r.contains_key("junk")),
        "the done's result is kept: {attempts:?}"
    );
    assert!(
        peak_kib < 100 * 1024,
        "the worker host peaked at {} MiB reading two done lines",
        peak_kib / 1024
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_worker_that_cannot_start_forges_no_line_in_the_node_log() {
    let db = TestDb::new("hw_forged_log").await;
    let forger = db.script("forger.sh", r#"printf 'x\nFORGED line\n' >&2; exit 3"#);
    let config = write_config(&db, "node.json", json!({"plugins": {"forger": forger}}));
    let queue = worker_queue(&db, "forger", doc! {}).await;
    let ids = db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, scaled(Duration::from_secs(60)))
        .await;
    let task = db.task(ids[0]).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    wait_for(
        "the host to log the failed start",
        scaled(Duration::from_secs(30)),
        || {
            let logged = den.log_text().contains("could not start worker");
            async move { logged }
        },
    )
    .await;
    let log = den.log_text();
    assert!(
        !log.lines().any(|l| l.starts_with("FORGED")),
        "a worker's stderr forged a line of the node's log:\n{log}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_grandchild_a_worker_leaves_behind_dies_with_the_worker() {
    let db = TestDb::new("hw_grandchild").await;
    let pid_file = db.path("grandchild.pid");
    let gate = db.path("gate");
    // The first worker's task leaves a double-forked grandchild that waits for the gate,
    // then writes into the worker's stdout and channel; every worker exits on its next line.
    let body = format!(
        r#"{READY_AND_READ_TASK}
if [ ! -e '{pid}' ]; then
  ( sh -c 'echo $$ > "$1.tmp"; mv "$1.tmp" "$1"; while [ ! -e "$2" ]; do sleep 0.1; done
           echo CORRUPTED; echo "{{\"type\":\"done\",\"attempt\":\"$3\",\"exit\":7}}" >&3' \
      sh '{pid}' '{gate}' "$attempt" & )
  while [ ! -s '{pid}' ]; do sleep 0.05; done
fi
echo 'task ran'
printf '{{"type":"done","attempt":"%s","exit":0}}\n' "$attempt" >&3
read line <&3"#,
        pid = pid_file.display(),
        gate = gate.display()
    );
    let leaver = db.script("leaver.sh", &body);
    let config = write_config(&db, "node.json", json!({"plugins": {"leaver": leaver}}));
    // One task per worker: the first is replaced after its task.
    let queue = worker_queue(&db, "leaver", doc! {"worker_max_tasks": 1}).await;
    let first = db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&first, scaled(Duration::from_secs(60)))
        .await;
    let grandchild: u32 = std::fs::read_to_string(&pid_file)
        .expect("the grandchild's pid")
        .trim()
        .parse()
        .expect("a pid");
    wait_for(
        "the replaced worker's grandchild to be gone",
        scaled(Duration::from_secs(30)),
        || {
            let gone = !alive(grandchild);
            async move { gone }
        },
    )
    .await;
    // Were it alive, it would write now, into whatever it still holds.
    std::fs::write(&gate, b"").expect("gate");
    let second = db.insert_tasks(queue, vec![doc! {"n": 2}.into()]).await;
    db.wait_complete(&second, scaled(Duration::from_secs(60)))
        .await;
    for id in first.iter().chain(&second) {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(task.get_str("stdout").ok(), Some("task ran\n"), "{task}");
    }
    drop(den);
    db.drop().await;
}

/// A worker whose `done` result holds `member`: 16 MB of empty arrays, the shape that costs
/// most per byte as a tree (about 200 bytes each, as JSON values then as BSON).
fn arrays_worker(db: &TestDb, name: &str, member: &str) -> PathBuf {
    let body = format!(
        r#"{READY_AND_READ_TASK}
{{ printf '{{"type":"done","attempt":"%s","exit":0,"result":{{"{member}":[' "$attempt"; yes '[]' | head -n 5300000 | tr '\n' ','; printf '[]]}}}}\n'; }} >&3
read line <&3"#
    );
    db.script(name, &body)
}

#[tokio::test]
async fn a_sixteen_mb_result_of_empty_arrays_is_bounded_before_it_is_built() {
    let db = TestDb::new("hw_arrays").await;
    let member = arrays_worker(&db, "member.sh", "a");
    let output = arrays_worker(&db, "output.sh", "output");
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"member": member, "output": output}}),
    );
    let mut ids = Vec::new();
    for plugin in ["member", "output"] {
        let queue = worker_queue(&db, plugin, doc! {}).await;
        ids.push(db.insert_tasks(queue, vec![doc! {"n": 1}.into()]).await[0]);
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, scaled(Duration::from_secs(120)))
        .await;
    let host = worker_host(&den).expect("the node's worker host is running");
    let peak_kib = procfs::peak_rss_kib(host).expect("the worker host's VmHWM");
    println!("worker host peak RSS: {} MiB", peak_kib / 1024);
    // Another member that big is refused by its shape, with the reason.
    let refused = db.task(ids[0]).await;
    let stderr = refused.get_str("stderr").unwrap_or("");
    assert_eq!(
        refused.get_i32("status").ok(),
        Some(status::FAILED),
        "{stderr}"
    );
    assert!(
        stderr.contains("more than 200000 JSON values (by member \"a\")"),
        "{stderr}"
    );
    // An output that big is kept as its JSON text in GridFS, never built.
    let kept = db.task(ids[1]).await;
    assert_eq!(
        kept.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{:?}",
        kept.get_str("stderr")
    );
    let attempts = db.closed_attempts(ids[1], 1).await;
    let record = attempts.last().expect("the attempt");
    assert!(record.get_object_id("output_file").is_ok(), "{record}");
    assert!(
        peak_kib < 200 * 1024,
        "the worker host peaked at {} MiB reading two 16 MB results",
        peak_kib / 1024
    );
    drop(den);
    db.drop().await;
}
