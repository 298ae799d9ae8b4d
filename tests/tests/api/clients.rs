//! The client libraries (issue 51 item 5) against the real DCI, DEN and database: the Rust crate
//! `disbatch-client` here, the Python package `disbatch-client` through its unittest suite;
//! REST enqueue with delay and priority, unique duplicates, graphs, batches, waiting and
//! results, and the direct path inside a transaction that aborts (no task) or commits (it runs).

use std::path::PathBuf;
use std::time::Duration;

use bson::{doc, Bson, Document};
use disbatch_client::{
    enqueue_in, server_now, Client, DirectOptions, Error, GraphTask, NewTask, Timing,
};
use disbatch_model::status;
use disbatch_tests::{scaled, wait_for, write_config, Dci, Den, TestDb};
use mongodb::ClientSession;
use serde_json::json;

/// A fleet of one node and the DCI over a database with the queues every case uses: `work`
/// runs `done` (its output names the task), `hold` and `uq` (unique on `params.id`) have no
/// threads, so their tasks stay queued (and a `uq` task keeps its key).
struct Fleet {
    db: TestDb,
    dci: Dci,
    den: Den,
    client: Client,
}

async fn fleet(name: &str) -> Fleet {
    let db = TestDb::new(name).await;
    let done = db.script(
        "done.sh",
        r#"printf '{"output":{"task":"%s"}}' "$DISBATCH_TASK_ID" > "$DISBATCH_RESULT""#,
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"echo": disbatch_tests::echo_plugin(), "done": done}}),
    );
    db.insert_queue("work", "done", 2).await;
    db.insert_queue("hold", "done", 0).await;
    let uq = db.insert_queue("uq", "done", 0).await;
    db.set_queue(uq, doc! {"unique": {"key": "params.id"}})
        .await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let client = Client::new(&dci.at(""), None).expect("client");
    Fleet {
        db,
        dci,
        den,
        client,
    }
}

/// What the maintenance leader logs once its change stream is open (den/src/node.rs).
const WATCHING: &str = "watching queues for work signals";
/// Wake-ups of a node by the leader's change stream.
const STREAM_WAKEUPS: &str = "disbatch_den_wakeups_total{source=\"change_stream\"}";

const WAIT: Duration = Duration::from_secs(90);
const POLL: Duration = Duration::from_millis(100);

/// A task's fields, but those that differ between any two new tasks: ids and times.
fn comparable(mut d: Document) -> Document {
    for f in ["_id", "ctime", "mtime", "not_before"] {
        d.remove(f);
    }
    d
}

#[tokio::test]
async fn the_rust_client_enqueues_waits_and_reads_results_over_rest() {
    let f = fleet("clients_rust_rest").await;
    let c = &f.client;

    let id = c
        .enqueue("work", json!({"n": 1}), Timing::default())
        .await
        .expect("enqueue");
    let task = c.wait(id, scaled(WAIT), POLL).await.expect("wait");
    assert!(task.succeeded(), "{:?}", task.raw);
    assert_eq!(
        c.result(id).await.expect("result"),
        json!({"task": id.to_hex()})
    );

    // Delay and priority are stored as the API stores them, the delay on the server's clock.
    let before = server_now(&f.db.db).await.expect("now");
    let later = Timing {
        delay_s: Some(3600.0),
        priority: Some(7),
        ..Timing::default()
    };
    let delayed = c
        .enqueue("hold", json!({"n": 2}), later)
        .await
        .expect("delayed");
    let stored = f.db.task(delayed).await;
    assert_eq!(stored.get("priority"), Some(&Bson::Int64(7)), "{stored}");
    let not_before = stored.get_datetime("not_before").expect("not_before");
    // The DCI reads the fleet's clock as an estimate of the server's: a second's leeway.
    assert!(
        not_before.timestamp_millis() >= before.timestamp_millis() + 3_599_000,
        "{stored}"
    );

    // A unique queue: the second input with a key duplicates the first, and so does a later
    // enqueue, which names the task it matched.
    let many = c
        .enqueue_many(
            "uq",
            vec![
                NewTask::new(json!({"id": 1})),
                NewTask::new(json!({"id": 1})),
                NewTask::new(json!({"id": 2})),
            ],
        )
        .await
        .expect("enqueue_many");
    assert_eq!(many.created, 2, "{many:?}");
    assert_eq!(many.duplicates.len(), 1, "{many:?}");
    assert_eq!(many.duplicates[0].index, 1);
    assert_eq!(many.duplicates[0].matched, many.ids[0]);
    match c.enqueue("uq", json!({"id": 1}), Timing::default()).await {
        Err(Error::DuplicateTask { matched, .. }) => assert_eq!(matched, Some(many.ids[0])),
        other => panic!("expected a duplicate, got {other:?}"),
    }

    // Refusals are errors that say why, not panics.
    match c.enqueue("nope", json!({}), Timing::default()).await {
        Err(Error::Api { status, message }) => {
            assert_eq!(status, 400);
            assert!(message.contains("queue"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(matches!(
        c.enqueue("work", json!([1]), Timing::default()).await,
        Err(Error::Invalid(_))
    ));

    // A graph runs in its order; a batch's callback runs once its members end.
    let graph = c
        .create_graph(vec![
            GraphTask {
                name: "a".into(),
                queue: "work".into(),
                ..GraphTask::default()
            },
            GraphTask {
                name: "b".into(),
                queue: "work".into(),
                depends_on: vec!["a".into()],
                ..GraphTask::default()
            },
        ])
        .await
        .expect("graph");
    let b = graph.ids["b"];
    assert!(c.wait(b, scaled(WAIT), POLL).await.expect("b").succeeded());
    assert!(c.task(graph.ids["a"]).await.expect("a").succeeded());
    let batch = c
        .create_batch(
            vec![
                ("work".into(), json!({"m": 1})),
                ("work".into(), json!({"m": 2})),
            ],
            Some(("work".into(), json!({}))),
        )
        .await
        .expect("batch");
    assert_eq!(batch.ids.len(), 2);
    let callback = batch.callback.expect("a callback id");
    let ended = c
        .wait(callback, scaled(WAIT), POLL)
        .await
        .expect("callback");
    assert!(ended.succeeded(), "{:?}", ended.raw);
    for member in batch.ids {
        assert!(c.task(member).await.expect("member").is_final());
    }
    f.db.drop().await;
}

#[tokio::test]
async fn the_rust_client_enqueues_inside_a_transaction_that_aborts_or_commits() {
    let f = fleet("clients_rust_tx").await;
    let (db, tasks) = (&f.db.db, f.db.tasks());
    let mut s = f.db.client.start_session().await.expect("session");

    // Aborted: no task.
    s.start_transaction().await.expect("start");
    let aborted = enqueue_in(
        db,
        &mut s,
        "work",
        doc! {"tx": "abort"},
        DirectOptions::default(),
    )
    .await
    .expect("enqueue_in");
    s.abort_transaction().await.expect("abort");
    assert_eq!(f.db.count(doc! {"_id": aborted}).await, 0);

    // Committed: invisible until the commit, then a node starts it within about a pass (the
    // leader's change stream or its outside-insert probe wakes the fleet), and it runs.
    s.start_transaction().await.expect("start");
    let committed = enqueue_in(
        db,
        &mut s,
        "work",
        doc! {"tx": "commit"},
        DirectOptions::default(),
    )
    .await
    .expect("enqueue_in");
    assert_eq!(
        tasks
            .count_documents(doc! {"_id": committed})
            .await
            .expect("count"),
        0,
        "not seen outside the transaction before it commits"
    );
    // Once the leader watches (a node that has just started may not lead yet), the commit's
    // insert event wakes the fleet, which claims in its next pass.
    wait_for("the leader's change stream", scaled(WAIT), || async {
        f.den.log_text().contains(WATCHING)
    })
    .await;
    let stream_wakeups = || f.den.metric(STREAM_WAKEUPS);
    let woken = stream_wakeups().await;
    let passes = f.den.passes().await;
    s.commit_transaction().await.expect("commit");
    wait_for("the committed task to start", scaled(WAIT), || async {
        f.db.count(doc! {"_id": committed, "status": {"$ne": status::QUEUED}})
            .await
            == 1
    })
    .await;
    let after = f.den.passes().await;
    // The wait reads every 200 ms at most, two of the node's 100 ms passes.
    assert!(
        after <= passes + 4.0,
        "started within about a pass: {passes} passes at the commit, {after} when seen started"
    );
    assert!(
        stream_wakeups().await > woken,
        "the leader's stream woke the node for the committed insert"
    );
    let ended = f
        .client
        .wait(committed, scaled(WAIT), POLL)
        .await
        .expect("wait");
    assert!(ended.succeeded(), "{:?}", ended.raw);
    assert_eq!(
        f.client.result(committed).await.expect("result"),
        json!({"task": committed.to_hex()})
    );

    check_direct_unique_tasks_hold_their_keys_both_ways(&f, &mut s).await;
    check_a_direct_task_is_field_by_field_the_apis(&f, &mut s).await;
    let _ = &f.dci;
    f.db.drop().await;
}

/// A duplicate of a unique queue is found by the direct path, and a directly inserted unique
/// task holds its key for the API too.
async fn check_direct_unique_tasks_hold_their_keys_both_ways(f: &Fleet, s: &mut ClientSession) {
    let db = &f.db.db;
    // A duplicate of a unique queue, found by the direct path: the caller aborts.
    let held = f
        .client
        .enqueue("uq", json!({"id": 5}), Timing::default())
        .await
        .expect("rest");
    s.start_transaction().await.expect("start");
    match enqueue_in(db, s, "uq", doc! {"id": 5}, DirectOptions::default()).await {
        Err(Error::DuplicateTask { matched, .. }) => assert_eq!(matched, Some(held)),
        other => panic!("expected a duplicate, got {other:?}"),
    }
    s.abort_transaction().await.expect("abort");
    assert_eq!(f.db.count(doc! {"params.id": 5}).await, 1);

    // A directly inserted unique task holds its key for the API too.
    s.start_transaction().await.expect("start");
    let direct = enqueue_in(db, s, "uq", doc! {"id": 6}, DirectOptions::default())
        .await
        .expect("enqueue_in");
    s.commit_transaction().await.expect("commit");
    match f
        .client
        .enqueue("uq", json!({"id": 6}), Timing::default())
        .await
    {
        Err(Error::DuplicateTask { matched, .. }) => assert_eq!(matched, Some(direct)),
        other => panic!("expected a duplicate of the direct task, got {other:?}"),
    }
}

/// Field by field, a direct task is the API's, for a plain and a unique queue.
async fn check_a_direct_task_is_field_by_field_the_apis(f: &Fleet, s: &mut ClientSession) {
    let db = &f.db.db;
    // Field by field, a direct task is the API's, for a plain and a unique queue.
    let timing = Timing {
        delay_s: Some(60.0),
        priority: Some(3),
        ..Timing::default()
    };
    let options = DirectOptions {
        delay_s: Some(60.0),
        priority: Some(3),
        ..DirectOptions::default()
    };
    for (queue, params) in [("hold", doc! {"same": 1}), ("uq", doc! {"id": 9})] {
        let api = f
            .client
            .enqueue(
                queue,
                Bson::Document(params.clone()).into_relaxed_extjson(),
                timing,
            )
            .await
            .expect("api");
        let api = f.db.task(api).await;
        f.db.tasks()
            .delete_one(doc! {"_id": api.get("_id")})
            .await
            .expect("delete");
        s.start_transaction().await.expect("start");
        let id = enqueue_in(db, s, queue, params, options)
            .await
            .expect("direct");
        s.commit_transaction().await.expect("commit");
        let direct = f.db.task(id).await;
        let keys = |d: &Document| d.keys().cloned().collect::<Vec<String>>();
        assert_eq!(
            keys(&direct),
            keys(&api),
            "the same fields, in the same order"
        );
        assert_eq!(comparable(direct.clone()), comparable(api.clone()));
        for t in ["ctime", "mtime", "not_before"] {
            assert!(direct.get_datetime(t).is_ok(), "{t} is a date: {direct}");
        }
    }
}

/// The Python package's directory, and where scripts/test installs pymongo for it.
fn python_paths() -> (PathBuf, PathBuf) {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let pylib = std::env::var_os("DISBATCH_PYLIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/disbatch-rs/pylib")
        });
    (package, pylib)
}

#[tokio::test]
async fn the_python_client_passes_its_suite_against_the_real_server() {
    let f = fleet("clients_python").await;
    let (package, pylib) = python_paths();
    let path = std::env::join_paths([package.clone(), pylib.clone()]).expect("PYTHONPATH");
    let out = tokio::process::Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s", "tests", "-t", "."])
        .current_dir(&package)
        .env("PYTHONPATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("DISBATCH_TEST_DCI", f.dci.at(""))
        .env("DISBATCH_TEST_MONGODB_URI", &f.db.uri)
        .env("DISBATCH_TEST_DATABASE", &f.db.name)
        .output()
        .await
        .expect("run python3 (scripts/test installs pymongo into ~/.cache/disbatch-rs/pylib)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the Python suite failed (pymongo from {}):\n{}\n{stderr}",
        pylib.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("OK"), "{stderr}");
    assert!(
        !stderr.contains("skipped"),
        "no case may be skipped: {stderr}"
    );
    f.db.drop().await;
}
