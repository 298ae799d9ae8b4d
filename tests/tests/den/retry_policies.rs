//! Retry policies with a real DEN: failures retried with backoff, each retry an attempt with
//! its reason, discards when attempts run out, the failures a policy names, lost attempts,
//! and a retry that starts when it comes due, woken by its own node (a queue's policy through
//! the API: `retry_policy_api.rs`).

use std::path::PathBuf;
use std::time::Duration;

use bson::{doc, Bson, Document};
use disbatch_model::status;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

/// A plugin that counts its runs per task and does what `runs` says for each run number:
/// the first entry for run 1, and so on; the last entry for every run after.
fn plugin_by_run(db: &TestDb, name: &str, runs: &[&str]) -> PathBuf {
    let dir = db.path(&format!("{name}-runs"));
    std::fs::create_dir_all(&dir).expect("runs dir");
    let mut cases = String::new();
    for (i, body) in runs.iter().enumerate() {
        let pattern = if i + 1 == runs.len() {
            "*".to_string()
        } else {
            (i + 1).to_string()
        };
        cases.push_str(&format!("  {pattern}) {body} ;;\n"));
    }
    db.script(
        &format!("{name}.sh"),
        &format!(
            "f={dir}/$DISBATCH_TASK_ID\n\
             n=$(( $(cat \"$f\" 2>/dev/null || echo 0) + 1 ))\n\
             echo $n > \"$f\"\n\
             case $n in\n{cases}esac\n",
            dir = dir.display()
        ),
    )
}

const SUCCEED: &str = "echo '{\"output\": {\"ok\": true}}' > \"$DISBATCH_RESULT\"; exit 0";

fn millis(d: &Document, key: &str) -> i64 {
    d.get_datetime(key)
        .map(|t| t.timestamp_millis())
        .unwrap_or_else(|_| panic!("{key} in {d}"))
}

fn reason(d: &Document) -> String {
    d.get_str("reason").unwrap_or("").to_string()
}

#[tokio::test]
async fn a_task_that_fails_twice_then_succeeds_is_retried_with_growing_waits() {
    let db = TestDb::new("retry_backoff").await;
    let plugin = plugin_by_run(&db, "flaky", &["exit 3", "exit 4", SUCCEED]);
    let config = write_config(&db, "node.json", json!({"plugins": {"flaky": plugin}}));
    let queue = db.insert_queue("q", "flaky", 1).await;
    db.set_queue(
        queue,
        doc! {"retry": {"max_attempts": 3, "backoff": "exponential", "base_s": 1, "jitter": 0}},
    )
    .await;
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(90)).await;
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert_eq!(task.get_i32("attempts").ok(), Some(3), "{task}");
    assert!(task.get("discarded_at").is_none(), "{task}");
    let a = db.closed_attempts(id, 3).await;
    let outcomes: Vec<&str> = a
        .iter()
        .map(|r| r.get_str("outcome").unwrap_or("?"))
        .collect();
    assert_eq!(outcomes, ["retry", "retry", "succeeded"]);
    assert!(
        reason(&a[0]).contains("plugin exited with code 3")
            && reason(&a[0]).contains("failed on attempt 1 of 3; retrying in 1.0 s"),
        "{}",
        a[0]
    );
    assert!(
        reason(&a[1]).contains("plugin exited with code 4")
            && reason(&a[1]).contains("failed on attempt 2 of 3; retrying in 2.0 s"),
        "{}",
        a[1]
    );
    assert!(
        a[2].get("reason").is_none_or(|r| *r == Bson::Null),
        "{}",
        a[2]
    );
    // Each retry waited its backoff (1 s, then 2 s) after the attempt before it ended. The
    // times are the server's, as each process knows it to within a round trip.
    let gap1 = millis(&a[1], "start") - millis(&a[0], "end");
    let gap2 = millis(&a[2], "start") - millis(&a[1], "end");
    assert!(gap1 >= 900, "first retry after {gap1} ms");
    assert!(gap2 >= 1900, "second retry after {gap2} ms");
    let stderr = task.get_str("stderr").unwrap_or("");
    assert!(stderr.is_empty() || !stderr.contains("discarded"), "{task}");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_task_out_of_attempts_or_refusing_a_retry_is_discarded_and_a_disbatch_queue_never_retries(
) {
    let db = TestDb::new("retry_discard").await;
    let always = db.script("always.sh", "echo boom >&2; exit 5");
    let refuses = db.script(
        "refuses.sh",
        "echo '{\"retry\": false, \"output\": {\"why\": \"bad input\"}}' > \"$DISBATCH_RESULT\"; exit 1",
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"always": always, "refuses": refuses}}),
    );
    let q = db.insert_queue("q", "always", 2).await;
    db.set_queue(q, doc! {"retry": {"max_attempts": 2, "base_s": 0}})
        .await;
    let permanent = db.insert_queue("permanent", "refuses", 1).await;
    db.set_queue(permanent, doc! {"retry": {"max_attempts": 5, "base_s": 0}})
        .await;
    // Disbatch 4's queue: no `retry` field.
    let plain = db.insert_queue("plain", "always", 1).await;
    // Written by hand, unreadable: that queue is skipped, with its reason; the others run.
    let garbled = db.insert_queue("garbled", "always", 1).await;
    db.set_queue(garbled, doc! {"retry": {"max_attempts": "many"}})
        .await;
    let stays = db.insert_tasks(garbled, vec![doc! {}.into()]).await[0];
    let spent = db.insert_tasks(q, vec![doc! {}.into()]).await[0];
    let refused = db.insert_tasks(permanent, vec![doc! {}.into()]).await[0];
    let failed = db.insert_tasks(plain, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[spent, refused, failed], Duration::from_secs(90))
        .await;

    let task = db.task(spent).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert_eq!(task.get_i32("attempts").ok(), Some(2), "{task}");
    assert!(task.get_datetime("discarded_at").is_ok(), "{task}");
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("failed on attempt 2 of 2: out of attempts, discarded"),
        "{task}"
    );
    let a = db.closed_attempts(spent, 2).await;
    assert_eq!(a[0].get_str("outcome").ok(), Some("retry"), "{}", a[0]);
    assert_eq!(a[1].get_str("outcome").ok(), Some("failed"), "{}", a[1]);
    assert_eq!(a[1].get_bool("task_discarded").ok(), Some(true), "{}", a[1]);
    assert!(reason(&a[1]).contains("out of attempts"), "{}", a[1]);

    let task = db.task(refused).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert_eq!(task.get_i32("attempts").ok(), Some(1), "{task}");
    assert!(task.get_datetime("discarded_at").is_ok(), "{task}");
    let a = db.closed_attempts(refused, 1).await;
    assert!(reason(&a[0]).contains("refused a retry"), "{}", a[0]);

    let task = db.task(failed).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert_eq!(task.get_i32("attempts").ok(), Some(1), "{task}");
    assert!(task.get("discarded_at").is_none(), "{task}");
    let a = db.closed_attempts(failed, 1).await;
    assert_eq!(a[0].get_str("outcome").ok(), Some("failed"), "{}", a[0]);
    assert!(a[0].get("task_discarded").is_none(), "{}", a[0]);
    assert!(reason(&a[0]).contains("code 5"), "{}", a[0]);

    assert_eq!(
        db.task(stays).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    assert_eq!(den.metric("disbatch_den_queues_skipped").await, 1.0);
    assert!(
        den.log_text()
            .contains("retry.max_attempts must be a number"),
        "{}",
        den.log_text()
    );
    let discarded =
        |queue: &str| format!("disbatch_den_tasks_discarded_total{{queue=\"{queue}\"}}");
    // Counted when the node takes its runner's exit, after the result is stored.
    disbatch_tests::wait_for("the discards counted", Duration::from_secs(30), || async {
        den.metric(&discarded("q")).await == 1.0 && den.metric(&discarded("permanent")).await == 1.0
    })
    .await;
    assert_eq!(den.metric(&discarded("plain")).await, 0.0);
    // The API counts them per queue, from the database.
    let dci = disbatch_tests::Dci::start(&config);
    for (queue, n) in [("q", 1), ("permanent", 1), ("plain", 0)] {
        let (status, body) = dci.get(&format!("/queues/{queue}")).await;
        assert_eq!((status, &body["discarded"]), (200, &json!(n)), "{body}");
    }
    drop(dci);
    assert_eq!(
        den.metric("disbatch_den_tasks_finished_total{outcome=\"retry\",queue=\"q\"}")
            .await,
        1.0
    );
    drop(den);
    db.drop().await;
}

/// Every attempt's end is counted once by the node that ran it, and every slot it held comes
/// back, even when a retry starts (in a free slot of its queue) before the runner of the
/// attempt before it has exited: both runners of one task are alive then.
#[tokio::test]
async fn retries_that_overlap_their_last_runner_are_each_counted_and_free_their_slots() {
    let db = TestDb::new("retry_overlap").await;
    let config = write_config(&db, "node.json", json!({}));
    const TASKS: usize = 40;
    const ATTEMPTS: usize = 8;
    let policy = doc! {"max_attempts": ATTEMPTS as i32, "base_s": 0, "jitter": 0};
    // Runners of their own, and the worker host's.
    let own = db.insert_queue("own", "echo", 4).await;
    db.set_queue(own, doc! {"retry": policy.clone()}).await;
    let hosted = db.insert_queue("hosted", "echo", 4).await;
    db.set_queue(hosted, doc! {"retry": policy, "worker": "persistent"})
        .await;
    let failing = || (0..TASKS).map(|_| doc! {"exit_code": 5}.into()).collect();
    let mut tasks = db.insert_tasks(own, failing()).await;
    tasks.extend(db.insert_tasks(hosted, failing()).await);
    let den = Den::start(&config, "n1");
    db.wait_complete(&tasks, Duration::from_secs(240)).await;
    for t in &tasks {
        let task = db.task(*t).await;
        assert_eq!(
            task.get_i32("attempts").ok(),
            Some(ATTEMPTS as i32),
            "{task}"
        );
        assert!(task.get_datetime("discarded_at").is_ok(), "{task}");
    }
    // The node counts an end when it takes its runner's exit; all the runners have exited
    // once the gauge of live ones is back to 0 for both queues, and no end was missed.
    let retries = ((ATTEMPTS - 1) * TASKS) as f64;
    for queue in ["own", "hosted"] {
        let metric = |name: &str| format!("{name}{{queue=\"{queue}\"}}");
        let retried =
            format!("disbatch_den_tasks_finished_total{{outcome=\"retry\",queue=\"{queue}\"}}");
        disbatch_tests::wait_for(
            &format!("every end in {queue} counted and its runners gone"),
            Duration::from_secs(60),
            || async {
                den.metric(&metric("disbatch_den_tasks_discarded_total"))
                    .await
                    == TASKS as f64
                    && den.metric(&retried).await == retries
                    && den.metric(&metric("disbatch_den_runners")).await == 0.0
            },
        )
        .await;
    }
    // Every slot came back: a new task of each queue runs.
    let again = vec![
        db.insert_tasks(own, vec![doc! {}.into()]).await[0],
        db.insert_tasks(hosted, vec![doc! {}.into()]).await[0],
    ];
    db.set_queue(own, doc! {"retry": Bson::Null}).await;
    db.set_queue(hosted, doc! {"retry": Bson::Null}).await;
    db.wait_complete(&again, Duration::from_secs(60)).await;
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_policy_retries_only_the_failures_it_names() {
    let db = TestDb::new("retry_on").await;
    // Killed by a signal it sends itself on its first run: a crash, not a failure.
    let crashy = plugin_by_run(&db, "crashy", &["kill -9 $$", SUCCEED]);
    let failing = db.script("failing.sh", "exit 3");
    let slow = plugin_by_run(&db, "slow", &["sleep 60", SUCCEED]);
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"crashy": crashy, "failing": failing, "slow": slow}}),
    );
    let on_crash = doc! {"max_attempts": 3, "base_s": 0, "on": ["crashed"]};
    let crashes = db.insert_queue("crashes", "crashy", 1).await;
    db.set_queue(crashes, doc! {"retry": on_crash.clone()})
        .await;
    let fails = db.insert_queue("fails", "failing", 1).await;
    db.set_queue(fails, doc! {"retry": on_crash}).await;
    let times_out = db.insert_queue("times_out", "slow", 1).await;
    db.set_queue(
        times_out,
        doc! {"timeout": 1, "kill_grace": 1, "retry": {"max_attempts": 2, "base_s": 0, "on": ["timeout"]}},
    )
    .await;
    let crashed = db.insert_tasks(crashes, vec![doc! {}.into()]).await[0];
    let failed = db.insert_tasks(fails, vec![doc! {}.into()]).await[0];
    let timed_out = db.insert_tasks(times_out, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[crashed, failed, timed_out], Duration::from_secs(120))
        .await;

    let task = db.task(crashed).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    let a = db.closed_attempts(crashed, 2).await;
    assert!(reason(&a[0]).contains("signal 9"), "{}", a[0]);
    assert!(
        reason(&a[0]).contains("crashed on attempt 1 of 3"),
        "{}",
        a[0]
    );

    // Not named by `on`: failed as without a policy, not discarded.
    let task = db.task(failed).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert_eq!(task.get_i32("attempts").ok(), Some(1), "{task}");
    assert!(task.get("discarded_at").is_none(), "{task}");

    let task = db.task(timed_out).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    let a = db.closed_attempts(timed_out, 2).await;
    assert_eq!(a[0].get_str("outcome").ok(), Some("timed_out"), "{}", a[0]);
    assert!(
        reason(&a[0]).contains("timeout on attempt 1 of 2"),
        "{}",
        a[0]
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_lost_attempt_is_retried_then_discarded_when_the_policy_names_lost() {
    let db = TestDb::new("retry_lost").await;
    // Kills its task runner: the node sees the runner exit without a result, and recovers
    // the task at once as lost.
    let orphaning = db.script("orphaning.sh", "kill -9 $PPID; sleep 30");
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"orphaning": orphaning}}),
    );
    let q = db.insert_queue("q", "orphaning", 1).await;
    db.set_queue(
        q,
        doc! {"retry": {"max_attempts": 2, "base_s": 0, "on": ["lost"]}},
    )
    .await;
    let id = db.insert_tasks(q, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(120)).await;
    let task = db.task(id).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert_eq!(task.get_i32("attempts").ok(), Some(2), "{task}");
    assert!(task.get_datetime("discarded_at").is_ok(), "{task}");
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("lost on attempt 2 of 2: out of attempts, discarded"),
        "{task}"
    );
    let a = db.closed_attempts(id, 2).await;
    assert!(
        a.iter().all(|r| r.get_str("outcome").ok() == Some("lost")),
        "{a:?}"
    );
    disbatch_tests::wait_for(
        "the recoveries counted",
        Duration::from_secs(30),
        || async {
            den.metric("disbatch_den_recoveries_total{how=\"requeue\"}")
                .await
                == 1.0
                && den
                    .metric("disbatch_den_recoveries_total{how=\"discard\"}")
                    .await
                    == 1.0
        },
    )
    .await;
    drop(den);
    db.drop().await;
}

/// With passes a minute apart, nothing but the wake-up its node set for the retry can start
/// it during the test: that it starts at all shows the wake-up, and it never starts early.
#[tokio::test]
async fn a_requested_retry_starts_when_it_comes_due_woken_by_its_node() {
    let db = TestDb::new("retry_due").await;
    let plugin = plugin_by_run(
        &db,
        "later",
        &[
            "echo '{\"retry\": true, \"delay\": 2}' > \"$DISBATCH_RESULT\"; exit 0",
            SUCCEED,
        ],
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"later": plugin}, "loop_interval_ms": 60_000}),
    );
    let q = db.insert_queue("q", "later", 1).await;
    let id = db.insert_tasks(q, vec![doc! {}.into()]).await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(50)).await;
    let a = db.closed_attempts(id, 2).await;
    assert_eq!(a[0].get_str("outcome").ok(), Some("retry"), "{}", a[0]);
    assert!(
        reason(&a[0]).contains("the plugin asked for a retry, not before"),
        "{}",
        a[0]
    );
    let gap = millis(&a[1], "start") - millis(&a[0], "end");
    assert!(
        gap >= 1900,
        "the retry started {gap} ms after the first attempt ended"
    );
    assert_eq!(
        den.metric("disbatch_den_wakeups_total{source=\"retry_due\"}")
            .await,
        1.0
    );
    drop(den);
    db.drop().await;
}
