//! Malformed documents past the API: the DEN skips or fails each, the DCI answers them, no crash.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::hostile::corpus::{
    insert_corpus, queue_problems, task_problems, Inserted, QueueExpect, TaskExpect,
};
use disbatch_tests::hostile::{
    check_get, crashes, den_survives, enc, fill, get_request, nested, openapi_routes, path_params,
    raw_http, wait_done, with_invalid_utf8, LoggedDci,
};
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

/// Every GET route, path parameters filled with the ids and names of the malformed
/// documents, plus searches for each; `true` asks for HTML.
fn get_targets(
    c: &Inserted,
    routes: &[(String, String)],
    good_task: ObjectId,
) -> Vec<(String, bool)> {
    let mut queues: Vec<String> = c.queues.iter().map(|(_, id, ..)| id.to_hex()).collect();
    queues.extend(
        c.queues
            .iter()
            .filter_map(|(_, _, d, _)| d.get_str("name").ok().map(enc)),
    );
    queues.extend([
        "queue-string-id".to_string(),
        "42".into(),
        "hq-id-null".into(),
    ]);
    let mut tasks: Vec<String> = c
        .tasks
        .iter()
        .filter_map(|t| t.doc.get_object_id("_id").ok())
        .chain(c.queues.iter().map(|(.., t)| *t))
        .chain([good_task])
        .map(|id| id.to_hex())
        .collect();
    tasks.sort();
    let mut nodes: Vec<String> = c.nodes.iter().map(|(id, _)| id.to_hex()).collect();
    nodes.extend(
        c.nodes
            .iter()
            .filter_map(|(_, d)| d.get_str("node").ok().map(enc)),
    );
    nodes.extend([
        "node-string-id".to_string(),
        "n-string-id".into(),
        "5".into(),
    ]);
    let files = vec![
        "app.js".to_string(),
        "..%2F..%2Fetc%2Fpasswd".into(),
        "%00".into(),
    ];

    let mut targets = Vec::new();
    for (method, template) in routes.iter().filter(|(m, _)| m == "GET") {
        let values = match path_params(template).as_slice() {
            [] => vec![String::new()],
            ["queue"] => queues.clone(),
            ["id"] => tasks.clone(),
            ["node"] => nodes.clone(),
            ["file"] => files.clone(),
            other => panic!("{method} {template}: no test values for {other:?}"),
        };
        for v in values {
            let path = fill(template, |_| v.clone());
            if template == "/tasks/{id}" {
                targets.push((path.clone(), true));
            }
            targets.push((path, false));
        }
    }
    // `GET /tasks` searches need an indexed term: search for each malformed document.
    for (_, id, ..) in &c.queues {
        targets.push((format!("/tasks?queue={id}&.limit=100&.epoch=1"), false));
        targets.push((format!("/tasks?queue={id}&.count=1"), false));
    }
    for id in &tasks {
        targets.push((format!("/tasks?id={id}&.full=1"), false));
        targets.push((format!("/tasks?id={id}&.terse=1&.epoch=1"), false));
    }
    for search in [
        format!("/tasks?queue={}&.limit=1000", c.taskbox),
        "/tasks?node=hostile-node&.limit=1000".into(),
        "/tasks?node=5&.limit=10".into(),
        "/tasks?.limit=100000&.full=1".into(),
    ] {
        targets.push((search, false));
    }
    targets
}

#[tokio::test]
async fn malformed_queues_tasks_and_nodes_are_skipped_or_failed_and_good_work_runs() {
    let db = TestDb::new("hostile_docs").await;
    let good = db.insert_queue("good", "echo", 4).await;
    let good_tasks = db
        .insert_tasks(good, (0..20).map(|n| Bson::from(doc! {"n": n})).collect())
        .await;
    let c = insert_corpus(&db).await;

    let config = write_config(&db, "den.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let mut den = Den::start(&config, "hostile-node");
    wait_done(&db, &mut den, &good_tasks, Duration::from_secs(120)).await;
    let ending: Vec<ObjectId> = c
        .tasks
        .iter()
        .filter(|t| matches!(t.expect, TaskExpect::Ends(..)))
        .filter_map(|t| t.doc.get_object_id("_id").ok())
        .chain(
            c.queues
                .iter()
                .filter(|(q, ..)| q.expect == QueueExpect::Runs)
                .map(|(.., t)| *t),
        )
        .collect();
    wait_done(&db, &mut den, &ending, Duration::from_secs(120)).await;
    // A task the server may refuse to update ends either way: run (status 1) or reported as
    // refused while still queued. Its claim is not always refused (one CI run found it
    // running at the check), so wait for whichever ending it gets, not for the others'.
    for case in c
        .tasks
        .iter()
        .filter(|t| t.expect == TaskExpect::RunsOrRefused)
    {
        let id = case.doc.get_object_id("_id").expect("task id");
        wait_for(
            &format!("task {} to run or be reported refused", case.label),
            Duration::from_secs(120),
            || async {
                let refused = den.log_text().lines().any(|l| {
                    l.contains("document skipped")
                        && l.contains("update_refused")
                        && l.contains(&id.to_hex())
                });
                refused || db.task(id).await.get("status") == Some(&Bson::Int32(1))
            },
        )
        .await;
    }
    check_the_den_left_odd_documents_alone_and_counted_them(&db, &mut den, &c).await;

    let web_config = write_config(
        &db,
        "web.json",
        json!({"monitoring": true, "balance": {"enabled": true},
            "web_extensions": {"Disbatch::Web::Tasks": null}}),
    );
    let mut dci = LoggedDci::start(&web_config, &db.path("dci.log"));
    check_every_get_over_the_corpus_answers_below_500(&mut dci, &c, good_tasks[0]).await;

    // Finally the DEN is still serving: a fresh good task runs.
    let late = db
        .insert_tasks(good, vec![Bson::from(doc! {"late": true})])
        .await;
    wait_done(&db, &mut den, &late, Duration::from_secs(60)).await;
    assert_eq!(crashes(&den.log_text()), Vec::<String>::new());
    den.stop();
    db.drop().await;
}

async fn check_the_den_left_odd_documents_alone_and_counted_them(
    db: &TestDb,
    den: &mut Den,
    c: &Inserted,
) {
    // Skipped queues' tasks would have been claimed in any of three more readings of the
    // queues had they been served.
    den.wait_queue_reads(3).await;
    let log = den.log_text();
    let mut problems = task_problems(db, c, &log).await;
    problems.extend(queue_problems(db, c, &log).await);
    assert!(
        problems.is_empty(),
        "DEN problems:\n{}\nDEN log:\n{log}",
        problems.join("\n")
    );
    // No odd document is an outage: not one pass failed, so every good queue ran at speed.
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("pass failed")).collect();
    assert!(failed.is_empty(), "passes failed:\n{}", failed.join("\n"));
    // What was left alone is counted, each logged once.
    let refused = log
        .lines()
        .filter(|l| l.contains("document skipped") && l.contains("update_refused"))
        .count();
    let counted = den
        .metric(
            r#"disbatch_den_documents_skipped_total{collection="tasks",reason="update_refused"}"#,
        )
        .await;
    assert!(refused <= 1, "logged more than once: {refused} lines");
    assert_eq!(
        counted > 0.0,
        refused == 1,
        "{refused} lines, counter {counted}"
    );
    let skipped_queues = c
        .queues
        .iter()
        .filter(|(q, ..)| matches!(q.expect, QueueExpect::Skip(_)))
        .count();
    assert_eq!(
        den.metric("disbatch_den_queues_skipped").await as usize,
        skipped_queues,
        "disbatch_den_queues_skipped"
    );
    assert!(den.is_running(), "the DEN exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DEN log:\n{log}");
}

async fn check_every_get_over_the_corpus_answers_below_500(
    dci: &mut LoggedDci,
    c: &Inserted,
    good_task: ObjectId,
) {
    let targets = get_targets(c, &openapi_routes(dci.addr).await, good_task);
    let mut failures = Vec::new();
    for (target, html) in &targets {
        check_get(dci, target, *html, &mut failures).await;
    }
    let dci_log = dci.log_text();
    assert!(
        failures.is_empty(),
        "{} of {} GETs failed:\n{}\nDCI log:\n{dci_log}",
        failures.len(),
        targets.len(),
        failures.join("\n")
    );
    assert!(dci.is_running(), "the DCI exited:\n{dci_log}");
    assert_eq!(
        crashes(&dci_log),
        Vec::<String>::new(),
        "DCI log:\n{dci_log}"
    );
    println!(
        "{} queues, {} tasks, {} nodes in the corpus; {} GETs, all < 500",
        c.queues.len() + 3,
        c.tasks.len(),
        c.nodes.len() + 1,
        targets.len()
    );
}

/// `nice` is read as an integer and the weight is 20 − nice: i64::MIN must not overflow.
#[tokio::test]
async fn a_queue_with_nice_i64_min_does_not_crash_the_den() {
    let db = TestDb::new("hostile_nice").await;
    let nice = ObjectId::new();
    db.db
        .collection::<Document>("queues")
        .insert_one(doc! {"_id": nice, "name": "nice-min", "plugin": "echo", "threads": 1, "nice": i64::MIN})
        .await
        .expect("insert");
    let task = db.insert_tasks(nice, vec![Bson::from(doc! {})]).await;
    let mut den = den_survives(&db, &task).await;
    den.stop();
    db.drop().await;
}

/// A continuous queue's next turn is now + interval: an interval of ~i64::MAX milliseconds
/// must not overflow the date.
#[tokio::test]
async fn a_continuous_queue_with_a_huge_interval_does_not_crash_the_den() {
    let db = TestDb::new("hostile_interval").await;
    let continuous = ObjectId::new();
    db.db
        .collection::<Document>("queues")
        .insert_one(
            doc! {"_id": continuous, "name": "continuous-huge", "plugin": "echo", "threads": 1,
            "continuous": true, "interval": Bson::Int64(9_223_372_036_854_775)},
        )
        .await
        .expect("insert");
    let den = den_survives(&db, &[]).await;
    // Its first unit is made and runs; with it done, the queue is idle and only the interval
    // holds the next one back, through three more passes.
    wait_for(
        "the first continuous unit done",
        Duration::from_secs(60),
        || async { db.count(doc! {"queue": continuous, "complete": true}).await == 1 },
    )
    .await;
    den.wait_queue_reads(3).await;
    assert_eq!(
        db.count(doc! {"queue": continuous}).await,
        1,
        "one synthetic task, then none until the interval passes"
    );
    drop(den);
    db.drop().await;
}

/// Recovery logs how late a lease is (now − lease_until): a lease dated i64::MIN
/// milliseconds must not overflow it.
#[tokio::test]
async fn an_expired_lease_dated_i64_min_does_not_crash_the_den() {
    let db = TestDb::new("hostile_lease").await;
    let leased = ObjectId::new();
    db.db
        .collection::<Document>("queues")
        .insert_one(
            doc! {"_id": leased, "name": "lease-min", "plugin": "echo", "threads": 1, "lease": 3},
        )
        .await
        .expect("insert");
    let expired = ObjectId::new();
    db.tasks()
        .insert_one(doc! {"_id": expired, "queue": leased, "status": -1, "node": "gone-node",
            "params": {}, "slot": 0, "lease_until": DateTime::MIN, "ctime": DateTime::now(), "mtime": DateTime::now()})
        .await
        .expect("insert");
    // Recovered (and run again) once the node has been connected for the 3 s lease and its
    // trust window: the recovery that meets the date.
    let mut den = den_survives(&db, &[expired]).await;
    den.stop();
    db.drop().await;
}

/// The deepest nesting the server stores for a field value, found by trying (the server
/// under test may cap it differently from MongoDB's 100 levels).
async fn deepest_accepted(db: &TestDb) -> usize {
    let scratch = db.db.collection::<Document>("scratch");
    let (mut ok, mut bad) = (1usize, 400usize);
    while bad - ok > 1 {
        let mid = (ok + bad) / 2;
        match scratch.insert_one(doc! {"v": nested(mid)}).await {
            Ok(_) => ok = mid,
            Err(_) => bad = mid,
        }
    }
    let _ = scratch.drop().await;
    ok
}

/// Documents nested as deep as the server allows, in a queue's `config` and a task's
/// `params`: decoding them must not exhaust a thread's stack in the DEN or the DCI.
#[tokio::test]
async fn documents_nested_to_the_servers_limit_crash_neither_den_nor_dci() {
    let db = TestDb::new("hostile_deep").await;
    let depth = deepest_accepted(&db).await;
    println!("the server stores field values nested {depth} levels deep");
    let deep_queue = ObjectId::new();
    db.db
        .collection::<Document>("queues")
        .insert_one(
            doc! {"_id": deep_queue, "name": "deep-config", "plugin": "echo", "threads": 1,
            "config": nested(depth)},
        )
        .await
        .expect("insert deep queue");
    let deep_config_task = db.insert_tasks(deep_queue, vec![Bson::from(doc! {})]).await;
    let params_queue = db.insert_queue("deep-params", "echo", 1).await;
    let deep_params_task = db
        .insert_tasks(params_queue, vec![Bson::from(nested(depth))])
        .await;

    let ends: Vec<ObjectId> = deep_config_task
        .iter()
        .chain(&deep_params_task)
        .copied()
        .collect();
    let mut den = den_survives(&db, &ends).await;

    let web_config = write_config(&db, "web.json", json!({}));
    let mut dci = LoggedDci::start(&web_config, &db.path("dci.log"));
    let mut failures = Vec::new();
    let task = deep_params_task[0].to_hex();
    for target in [
        "/queues".to_string(),
        format!("/queues/{deep_queue}"),
        format!("/tasks/{task}"),
        format!("/tasks?id={task}"),
        format!("/tasks?queue={params_queue}&.limit=10"),
        "/summary".into(),
    ] {
        check_get(&dci, &target, false, &mut failures).await;
    }
    let log = dci.log_text();
    assert!(
        failures.is_empty(),
        "{}\nDCI log:\n{log}",
        failures.join("\n")
    );
    assert!(dci.is_running(), "the DCI exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
    den.stop();
    db.drop().await;
}

/// A queue of one thread holding `bad` (inserted first, so claimed first) and then a normal
/// task: the normal task must still run, and `bad` must not stay claimed or running.
async fn bad_task_does_not_wedge_its_queue(label: &str, bad_id: Bson, bad_fields: Document) {
    let db = TestDb::new(label).await;
    let queue = ObjectId::new();
    db.db
        .collection::<Document>("queues")
        .insert_one(doc! {"_id": queue, "name": label, "plugin": "echo", "threads": 1, "sort": "fifo", "lease": 3})
        .await
        .expect("insert queue");
    let now = DateTime::now();
    let mut bad = doc! {"_id": bad_id.clone(), "queue": queue, "status": -2, "node": Bson::Null,
    "params": {}, "ctime": now, "mtime": now};
    bad.extend(bad_fields);
    db.tasks().insert_one(bad).await.expect("insert bad task");
    let normal = db
        .insert_tasks(queue, vec![Bson::from(doc! {"n": 1})])
        .await;
    // The normal task runs only once the queue's one thread got past `bad`.
    let mut den = den_survives(&db, &normal).await;
    let bad = db
        .tasks()
        .find_one(doc! {"_id": bad_id})
        .await
        .expect("find")
        .expect("bad task still exists");
    let status = bad.get("status").cloned().unwrap_or(Bson::Null);
    assert!(
        !matches!(status, Bson::Int32(-1) | Bson::Int32(0)),
        "the malformed task is left {status}: {bad}\nDEN log:\n{}",
        den.log_text()
    );
    den.stop();
    db.drop().await;
}

/// Claims take the next queued task of a queue whatever its `_id`; one that is not an
/// ObjectId cannot be handed to a runner or recovered by lease.
#[tokio::test]
async fn a_task_whose_id_is_a_string_does_not_wedge_its_queue() {
    bad_task_does_not_wedge_its_queue(
        "hostile_string_id",
        Bson::String("a-string-id".into()),
        doc! {},
    )
    .await;
}

#[tokio::test]
async fn a_task_whose_id_is_an_integer_does_not_wedge_its_queue() {
    bad_task_does_not_wedge_its_queue("hostile_int_id", Bson::Int32(42), doc! {}).await;
}

/// Starting a run `$inc`s `attempts`, which the server refuses on a string or at i64::MAX.
#[tokio::test]
async fn a_task_whose_attempts_is_a_string_does_not_wedge_its_queue() {
    let id = Bson::ObjectId(ObjectId::new());
    bad_task_does_not_wedge_its_queue("hostile_attempts_word", id, doc! {"attempts": "5"}).await;
}

#[tokio::test]
async fn a_task_whose_attempts_is_i64_max_does_not_wedge_its_queue() {
    let id = Bson::ObjectId(ObjectId::new());
    bad_task_does_not_wedge_its_queue("hostile_attempts_max", id, doc! {"attempts": i64::MAX})
        .await;
}

/// BSON strings must be UTF-8. The typed driver API cannot even express anything else; raw
/// bytes can. MongoDB stores them unchecked; a server that refuses them must say so, and if
/// one is stored, the DEN must keep serving its other queues.
#[tokio::test]
async fn invalid_utf8_in_a_queue_is_refused_or_survived() {
    let db = TestDb::new("hostile_utf8").await;
    let raw = with_invalid_utf8(
        &doc! {"_id": ObjectId::new(), "name": "MARKER-MARKER", "plugin": "echo", "threads": 1},
        "MARKER-MARKER",
    );
    let stored = db
        .db
        .collection::<bson::RawDocumentBuf>("queues")
        .insert_one(raw)
        .await;
    match &stored {
        Err(e) => {
            let text = e.to_string();
            println!("the server refused invalid UTF-8: {text}");
            assert!(
                text.to_lowercase().contains("utf"),
                "unclear refusal: {text}"
            );
            assert_eq!(
                db.db
                    .collection::<Document>("queues")
                    .count_documents(doc! {})
                    .await
                    .expect("count"),
                0
            );
        }
        Ok(_) => println!("the server stored invalid UTF-8"),
    }
    let mut den = den_survives(&db, &[]).await;
    den.stop();
    db.drop().await;
}

/// Task output in GridFS whose files and chunks documents are malformed or missing: reading
/// it through the DCI gets an answer below 500, never a panic or a cut connection.
#[tokio::test]
async fn corrupt_gridfs_output_is_answered_clearly() {
    let db = TestDb::new("hostile_gridfs").await;
    let queue = db.insert_queue("q", "echo", 0).await;
    let files = db.db.collection::<Document>("tasks.files");
    let chunks = db.db.collection::<Document>("tasks.chunks");
    let (bad_chunk, bad_length, missing) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
    files
        .insert_many(vec![
            doc! {"_id": bad_chunk, "filename": "stdout", "length": 5, "chunkSize": 261120},
            doc! {"_id": bad_length, "filename": "stderr", "length": "long", "chunkSize": "x"},
        ])
        .await
        .expect("files");
    chunks
        .insert_many(vec![
            doc! {"files_id": bad_chunk, "n": 0, "data": 5},
            doc! {"files_id": bad_length, "n": "zero", "data": [1, 2]},
            doc! {"files_id": bad_length, "n": 1, "data": "tail"},
        ])
        .await
        .expect("chunks");
    let mut ids = Vec::new();
    for (stdout, stderr) in [(bad_chunk, bad_length), (missing, bad_chunk)] {
        let id = ObjectId::new();
        db.tasks()
            .insert_one(
                doc! {"_id": id, "queue": queue, "status": 1, "node": "n", "params": {},
                "stdout": stdout, "stderr": stderr, "complete": true},
            )
            .await
            .expect("task");
        ids.push(id);
    }
    let web_config = write_config(&db, "web.json", json!({}));
    let mut dci = LoggedDci::start(&web_config, &db.path("dci.log"));
    let mut failures = Vec::new();
    for id in &ids {
        for target in [
            format!("/tasks/{id}"),
            format!("/tasks/{id}/stdout"),
            format!("/tasks/{id}/stderr"),
            format!("/tasks/{id}/stdout?offset=2&length=1"),
            format!("/tasks?id={id}&.full=1"),
            format!("/tasks?id={id}&.terse=1"),
        ] {
            check_get(&dci, &target, false, &mut failures).await;
        }
    }
    let log = dci.log_text();
    assert!(
        failures.is_empty(),
        "{}\nDCI log:\n{log}",
        failures.join("\n")
    );
    // The stream says why before sending anything; a search shows it in place of the text.
    let stdout = format!("/tasks/{}/stdout", ids[0]);
    let r = raw_http(dci.addr, &get_request(&stdout), Duration::from_secs(30))
        .await
        .expect("stdout answer");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(
        r.text().contains("cannot be read") && r.text().contains("Int32"),
        "{}",
        r.text()
    );
    let search = format!("/tasks?id={}&.full=1", ids[0]);
    let r = raw_http(dci.addr, &get_request(&search), Duration::from_secs(30))
        .await
        .expect("search answer");
    let v: serde_json::Value = serde_json::from_slice(&r.body).expect("JSON");
    let text = v[0]["stdout"].as_str().unwrap_or_default();
    assert!(text.starts_with("[unreadable output:"), "{v}");
    assert!(dci.is_running(), "the DCI exited:\n{log}");
    assert_eq!(crashes(&log), Vec::<String>::new(), "DCI log:\n{log}");
    db.drop().await;
}
