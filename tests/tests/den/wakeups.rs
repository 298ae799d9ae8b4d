//! Event-driven claims with a real node: a task queued into an idle fleet through our writers
//! starts on the work signal's change event, not at the next timer pass; one inserted by
//! another writer (ops, a Perl tool) starts on the signal the maintenance leader's probe
//! writes at its next pass; only the leader holds a stream, and passes its events on to the
//! followers through their node documents.
//!
//! "On the event" is read from the node itself, never from a latency: its debug log names
//! what woke the pass that claimed each task, and its change-stream wake-ups must have gone
//! up between the task's queueing and its start. The latencies are printed, as figures.

use std::path::Path;
use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use disbatch_store::Store;
use disbatch_tests::{exposition, read_lines, wait_for, write_config, Den, TestDb};
use serde_json::json;

/// What a node logs once its change stream is open.
const WATCHING: &str = "watching queues for work signals";

/// The node's pass loop logs what woke each pass that claimed tasks (at debug).
const PASS_LOG: (&str, &str) = ("RUST_LOG", "info,disbatch_den::node=debug");

/// How one task queued into the node got started.
#[derive(Debug)]
struct Start {
    /// What woke the passes that claimed it, as logged (`Change`, `Timer`, `RunnerExited`).
    woken_by: Vec<String>,
    /// Change-stream wake-ups from its queueing to its start.
    events: f64,
    /// From its queueing to its plugin's start, as the test saw it: a figure, not asserted.
    latency: Duration,
}

impl Start {
    /// Claimed by a pass a change-stream event woke, with an event counted meanwhile.
    fn on_event(&self) -> bool {
        self.woken_by == ["Change"] && self.events >= 1.0
    }
}

/// What woke each pass the node logged as having claimed tasks, in order.
fn claiming_wakes(den: &Den) -> Vec<String> {
    den.log_text()
        .lines()
        .filter(|l| l.contains("pass claimed tasks"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("wake="))
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

/// Inserts one task (`insert` returns its id), waits for it to complete and for the pass that
/// claimed it to be logged, and returns what woke that pass.
async fn woken_to_run(
    db: &TestDb,
    den: &Den,
    insert: impl std::future::Future<Output = ObjectId>,
) -> Vec<String> {
    let logged_before = claiming_wakes(den).len();
    let id = insert.await;
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    wait_for(
        "the claiming pass logged",
        Duration::from_secs(30),
        || async { claiming_wakes(den).len() > logged_before },
    )
    .await;
    claiming_wakes(den).split_off(logged_before)
}

async fn wakeups(den: &Den, source: &str) -> f64 {
    den.metric(&format!(
        "disbatch_den_wakeups_total{{source=\"{source}\"}}"
    ))
    .await
}

/// Queues one task, held once it starts until its start has been accounted for, then lets it
/// finish, and waits until the node has been woken by its runner's exit: no exit of this
/// task is left to wake a pass that could claim the next one.
async fn queue_one(db: &TestDb, store: &Store, den: &Den, queue: ObjectId, n: usize) -> Start {
    let started = db.path("started.txt");
    let gate = db.path(&format!("gate-{n}"));
    let logged_before = claiming_wakes(den).len();
    let events_before = wakeups(den, "change_stream").await;
    let queued = Instant::now();
    // The DCI's path: the tasks, then their queue's work signal.
    let id = store
        .tasks()
        .insert_tasks(queue, vec![held(&started, &gate)])
        .await
        .expect("insert through the store")[0];
    wait_for("the task to start", Duration::from_secs(30), || async {
        read_lines(&started).contains(&id.to_hex())
    })
    .await;
    let latency = queued.elapsed();
    // The pass logs its claims once it has handed them to runners.
    wait_for(
        "the claiming pass logged",
        Duration::from_secs(30),
        || async { claiming_wakes(den).len() > logged_before },
    )
    .await;
    let start = Start {
        woken_by: claiming_wakes(den).split_off(logged_before),
        events: wakeups(den, "change_stream").await - events_before,
        latency,
    };
    let exits = wakeups(den, "runner_exit").await;
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    wait_for(
        "the runner's exit seen",
        Duration::from_secs(30),
        || async { wakeups(den, "runner_exit").await > exits },
    )
    .await;
    start
}

fn held(started: &Path, gate: &Path) -> bson::Document {
    doc! {
        "append_to": started.to_string_lossy().to_string(),
        "hold_until": gate.to_string_lossy().to_string(),
    }
}

/// Queues tasks one at a time until `want` of them started on a change-stream event. A
/// pass another cause started (a timer pass, a runner's exit) that happens to claim the task
/// first proves nothing either way, and is only printed; a node that does not claim on
/// events never gets there.
async fn started_on_events(
    db: &TestDb,
    store: &Store,
    den: &Den,
    queue: ObjectId,
    want: usize,
) -> Vec<Start> {
    let mut starts: Vec<Start> = Vec::new();
    for n in 0..want + 5 {
        let start = queue_one(db, store, den, queue, n).await;
        println!("task {n}: {start:?}");
        starts.push(start);
        if starts.iter().filter(|s| s.on_event()).count() >= want {
            break;
        }
    }
    assert!(
        starts.iter().filter(|s| s.on_event()).count() >= want,
        "{want} tasks started by passes change-stream events woke: {starts:#?}"
    );
    starts
}

#[tokio::test]
async fn a_task_queued_into_an_idle_node_starts_without_waiting_for_the_timer() {
    let db = TestDb::new("wakeups").await;
    // Maintenance every 10 s, and an idle node's timer passes read its queues only every
    // tenth: polling alone would leave a task queued for tens of seconds.
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 10_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start_with_env(&config, "n1", &[PASS_LOG]);
    wait_for("the change stream", Duration::from_secs(30), || async {
        den.log_text().contains(WATCHING)
    })
    .await;
    let store = db.den_store().await;
    let starts = started_on_events(&db, &store, &den, queue, 5).await;
    let latencies: Vec<Duration> = starts.iter().map(|s| s.latency).collect();
    println!("enqueue → plugin start: {latencies:?}");
    drop(den);
    db.drop().await;
}

/// The fallback a server without change streams gets: claims on the node's timer (and on
/// runner exits). `change_streams: false` chooses it on a server that has them.
#[tokio::test]
async fn without_change_streams_a_node_claims_on_its_timer() {
    let db = TestDb::new("wakeups_polling").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"loop_interval_ms": 300, "change_streams": false}),
    );
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start(&config, "n1");
    wait_for("the node to start", Duration::from_secs(30), || async {
        den.log_text().contains("change streams are off")
    })
    .await;
    let scrape = || async {
        let text = den.scrape().await;
        let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}"));
        let wakeups = |s: &str| e.value("disbatch_den_wakeups_total", &[("source", s)]);
        let woken: f64 = ["timer", "runner_exit", "change_stream"]
            .iter()
            .map(|s| wakeups(s).unwrap_or(0.0))
            .sum();
        let passes = e.value("disbatch_den_passes_total", &[]).unwrap_or(0.0);
        // A wake-up is counted before its pass runs; the start-up pass is not a wake-up.
        let settled = passes >= woken + 1.0;
        (
            wakeups("timer").unwrap_or(0.0),
            wakeups("change_stream"),
            settled,
            text,
            wakeups("runner_exit").unwrap_or(0.0),
        )
    };
    // Begin once a timer pass has run to its end: every task below needs a wake-up of its own.
    let timer_before = std::cell::Cell::new(0.0);
    wait_for("a settled timer pass", Duration::from_secs(30), || async {
        let (timer, _, settled, _, _) = scrape().await;
        timer_before.set(timer);
        timer >= 1.0 && settled
    })
    .await;
    let timer_before = timer_before.get();
    let mut latencies = Vec::new();
    for done in 0..4 {
        // The previous task's runner exit has woken its pass and that pass has ended: with no
        // stream and no runner left, only a timer pass can claim the next task.
        wait_for(
            "the last runner exit's pass",
            Duration::from_secs(30),
            || async {
                let (_, _, settled, _, exits) = scrape().await;
                settled && exits >= f64::from(done)
            },
        )
        .await;
        let queued = Instant::now();
        let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
        db.wait_complete(&[id], Duration::from_secs(30)).await;
        latencies.push(queued.elapsed());
    }
    println!("enqueue → complete on a 300 ms timer: {latencies:?}");
    let (timer, change_stream, _, text, _) = scrape().await;
    assert_eq!(change_stream, Some(0.0), "{text}");
    assert!(
        timer - timer_before >= 4.0,
        "each task waited for a timer pass: {timer_before} → {timer}\n{text}"
    );
    assert!(!den.log_text().contains(WATCHING));
    drop(den);
    db.drop().await;
}

/// The only node serving queue `busy` (`threads` 2, plugin `busy`), started alone so it
/// leads, once its stream is open.
async fn start_leader_of_busy(db: &TestDb, loop_interval_ms: u64) -> (Den, ObjectId) {
    let config = write_config(
        db,
        "leader.json",
        json!({"loop_interval_ms": loop_interval_ms, "plugins": {"busy": disbatch_tests::echo_plugin()}}),
    );
    let busy = db.insert_queue("busy", "busy", 2).await;
    let leader = Den::start_with_env(&config, "n1", &[PASS_LOG]);
    wait_for("the leader's stream", Duration::from_secs(30), || async {
        leader.log_text().contains(WATCHING)
            && leader.metric("disbatch_den_change_streams_open").await == 1.0
    })
    .await;
    (leader, busy)
}

/// The fleet holds one change stream, the maintenance leader's, kept open while the leader
/// is busy as long as a follower waits for work; a follower holds none and starts work on
/// the mark the leader writes on its node document (read back by its heartbeat), not at its
/// own idle reading, ten passes later.
/// Here the leader does not even serve the queue, so only the mark can start its tasks
/// before that reading; a task the follower's own reading happened to claim first proves
/// nothing either way, and is only printed.
#[tokio::test]
async fn a_follower_holds_no_stream_and_starts_work_on_the_busy_leaders_mark() {
    let db = TestDb::new("wakeups_fanout").await;
    let (leader, busy) = start_leader_of_busy(&db, 2_000).await;
    let store = db.den_store().await;
    // Held until the end: the leader has more claimable tasks than room throughout.
    let gate = db.path("backlog-gate").to_string_lossy().to_string();
    let backlog = store
        .tasks()
        .insert_tasks(busy, (0..20).map(|_| doc! {"hold_until": &gate}).collect())
        .await
        .expect("insert through the store");
    let running = bson::doc! {"queue": busy, "status": 0};
    wait_for("the leader busy", Duration::from_secs(60), || async {
        db.count(running.clone()).await == 2
    })
    .await;
    let follower_config = write_config(&db, "follower.json", json!({"loop_interval_ms": 2_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let follower = Den::start_with_env(&follower_config, "n2", &[PASS_LOG]);
    let marked = || follower.metric("disbatch_den_wakeups_total{source=\"leader_signal\"}");
    let mut on_mark = 0;
    for n in 0..8 {
        let marks_before = marked().await;
        let queued = Instant::now();
        let id = store
            .tasks()
            .insert_tasks(queue, vec![doc! {"n": n}])
            .await
            .expect("insert through the store")[0];
        db.wait_complete(&[id], Duration::from_secs(60)).await;
        let marks = marked().await - marks_before;
        println!(
            "task {n}: follower marks read {marks}, {:?}",
            queued.elapsed()
        );
        if marks >= 1.0 {
            on_mark += 1;
            if on_mark == 3 {
                break;
            }
        }
    }
    assert!(on_mark >= 3, "3 tasks started on the leader's mark");
    assert!(leader.metric("disbatch_den_nodes_signalled_total").await >= 3.0);
    assert_eq!(
        leader.metric("disbatch_den_change_streams_open").await,
        1.0,
        "the busy leader kept the fleet's stream for the waiting follower"
    );
    assert_eq!(
        follower.metric("disbatch_den_change_streams_open").await,
        0.0
    );
    assert!(!follower.log_text().contains(WATCHING));
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&backlog, Duration::from_secs(120)).await;
    drop(follower);
    drop(leader);
    db.drop().await;
}

/// A busy leader drops the fleet's stream while no node waits for work (the server reads every
/// write of a busy database for an open stream: that cost bought nothing), opens it again as
/// soon as a follower's heartbeat says it waits, and keeps it while one does.
#[tokio::test]
async fn a_busy_leader_holds_the_stream_only_while_some_node_waits_for_work() {
    let db = TestDb::new("wakeups_stream_need").await;
    let (leader, busy) = start_leader_of_busy(&db, 300).await;
    let open = || leader.metric("disbatch_den_change_streams_open");
    let store = db.den_store().await;
    // More held tasks than room: the leader is full, never short of tasks, until the gate.
    let gate = db.path("backlog-gate").to_string_lossy().to_string();
    let backlog = store
        .tasks()
        .insert_tasks(busy, (0..6).map(|_| doc! {"hold_until": &gate}).collect())
        .await
        .expect("insert through the store");
    wait_for(
        "the full leader to drop its stream",
        Duration::from_secs(60),
        || async { open().await == 0.0 },
    )
    .await;
    assert_eq!(db.count(doc! {"queue": busy, "status": 0}).await, 2);
    // A follower with nothing to do: its heartbeat says it waits for work.
    let follower_config = write_config(&db, "follower.json", json!({"loop_interval_ms": 300}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let follower = Den::start_with_env(&follower_config, "n2", &[PASS_LOG]);
    wait_for(
        "the stream back for the waiting follower",
        Duration::from_secs(60),
        || async { open().await == 1.0 },
    )
    .await;
    // Still full: only the follower's waiting can have opened it.
    assert_eq!(db.count(doc! {"queue": busy, "status": 0}).await, 2);
    let marks_before = follower
        .metric("disbatch_den_wakeups_total{source=\"leader_signal\"}")
        .await;
    let id = store
        .tasks()
        .insert_tasks(queue, vec![doc! {}])
        .await
        .expect("insert through the store")[0];
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    println!(
        "follower marks read: {}",
        follower
            .metric("disbatch_den_wakeups_total{source=\"leader_signal\"}")
            .await
            - marks_before
    );
    assert_eq!(open().await, 1.0, "kept while the follower waits");
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&backlog, Duration::from_secs(120)).await;
    drop(follower);
    drop(leader);
    db.drop().await;
}

/// A task another writer inserts (ops by hand, a Perl tool, Disbatch 4's DCI: no work signal)
/// starts on the maintenance leader's stream, which sees task inserts, not at the idle node's
/// own reading, which comes only every tenth pass, and not on the leader's probe, which reads
/// created tasks only while no stream is open. A pass that also reads (every tenth) may claim
/// the task before the insert's event arrives; that proves nothing either way and is only
/// printed.
#[tokio::test]
async fn a_task_inserted_by_another_writer_starts_on_the_leaders_stream() {
    let db = TestDb::new("wakeups_outside").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 2_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start_with_env(&config, "n1", &[PASS_LOG]);
    wait_for("the change stream", Duration::from_secs(30), || async {
        den.log_text().contains(WATCHING)
    })
    .await;
    let probe_signals = || den.metric("disbatch_den_outside_inserts_signalled_total");
    let mut on_event = 0;
    for n in 0..8 {
        let events_before = wakeups(&den, "change_stream").await;
        let queued = Instant::now();
        // Straight into the collection, as ops would: no signal of ours.
        let woken = woken_to_run(&db, &den, async {
            db.insert_tasks(queue, vec![doc! {"n": n}.into()]).await[0]
        })
        .await;
        let latency = queued.elapsed();
        let events = wakeups(&den, "change_stream").await - events_before;
        println!("task {n}: woken by {woken:?}, stream events {events}, {latency:?}");
        if woken == ["Change"] && events >= 1.0 {
            on_event += 1;
            if on_event == 3 {
                break;
            }
        }
    }
    assert!(
        on_event >= 3,
        "3 tasks inserted behind the node's back started on the stream's events"
    );
    assert_eq!(
        probe_signals().await,
        0.0,
        "with the stream open, the probe signalled nothing"
    );
    drop(den);
    db.drop().await;
}

/// A delayed task another writer inserts starts once due, on the signal the leader's come-due
/// probe writes (nothing is written when a delay ends), not at the idle node's own reading:
/// the stream's insert event told the leader that delayed tasks exist, so it probes each pass
/// until they have come due. A pass that also reads (every tenth) may claim the task first;
/// that proves nothing either way and is only printed.
#[tokio::test]
async fn a_delayed_task_inserted_by_another_writer_starts_on_the_come_due_signal() {
    let db = TestDb::new("wakeups_delayed").await;
    let config = write_config(&db, "node.json", json!({"loop_interval_ms": 2_000}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let den = Den::start_with_env(&config, "n1", &[PASS_LOG]);
    wait_for("the change stream", Duration::from_secs(30), || async {
        den.log_text().contains(WATCHING)
    })
    .await;
    let probe_signals = || den.metric("disbatch_den_outside_inserts_signalled_total");
    let mut on_signal = 0;
    for n in 0..6 {
        let signals_before = probe_signals().await;
        let due = bson::DateTime::from_millis(bson::DateTime::now().timestamp_millis() + 3_000);
        // Straight into the collection, as ops would: no signal of ours.
        let woken = woken_to_run(&db, &den, async {
            let id = ObjectId::new();
            let now = bson::DateTime::now();
            db.tasks()
                .insert_one(doc! {
                    "_id": id, "queue": queue, "status": -2, "node": null, "params": {"n": n},
                    "ctime": now, "mtime": now, "stdout": null, "stderr": null, "not_before": due,
                })
                .await
                .expect("insert a delayed task");
            id
        })
        .await;
        let signals = probe_signals().await - signals_before;
        println!("task {n}: woken by {woken:?}, probe signals {signals}");
        if woken == ["Change"] && signals >= 1.0 {
            on_signal += 1;
            if on_signal == 2 {
                break;
            }
        }
    }
    assert!(
        on_signal >= 2,
        "2 delayed tasks started on the come-due probe's signal"
    );
    drop(den);
    db.drop().await;
}
