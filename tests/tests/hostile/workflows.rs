//! Graphs as a hostile client sends them: dependencies repeated hundreds of thousands of
//! times are refused or stored once each, and a graph of 20 000 tasks is stored and read back,
//! three readers at once, by a DCI whose memory stays under 200 MiB.

use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::status;
use disbatch_tests::bench::procfs::peak_rss_kib;
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

const TASKS: usize = 20_000;
/// Distinct existing tasks each graph task waits on, and how many more times it names one.
const DISTINCT: usize = 60;
const REPEATS: usize = 40;

fn peak_mib(dci: &Dci) -> u64 {
    peak_rss_kib(dci.pid()).expect("the DCI's VmHWM") / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_dependencies_are_capped_or_stored_once_and_a_big_graph_is_read_in_bounded_memory()
{
    let db = TestDb::new("hostile_graph").await;
    let queue = db.insert_queue("wfq", "echo", 0).await;
    let existing: Vec<ObjectId> = db
        .insert_tasks(
            queue,
            (0..DISTINCT).map(|i| doc! {"i": i as i32}.into()).collect(),
        )
        .await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let ex = existing[0].to_hex();
    // Past the cap, however few distinct: refused before anything is stored.
    let (s, out) = dci
        .post(
            "/graphs",
            json!({"tasks": [{"name": "a", "queue": "wfq", "depends_on": vec![ex.clone(); 300_000]}]}),
        )
        .await;
    assert_eq!(s, 400, "{out}");
    assert_eq!(
        out["error"],
        json!("tasks[0].depends_on names at most 20000 tasks, not 300000"),
    );
    assert_eq!(
        db.db
            .collection::<bson::Document>("graphs")
            .count_documents(doc! {})
            .await
            .expect("count"),
        0
    );
    // Within it, each dependency is stored once.
    let mut deps: Vec<Value> = existing.iter().map(|id| json!(id.to_hex())).collect();
    deps.extend(std::iter::repeat_n(json!(ex), REPEATS));
    let tasks: Vec<Value> = (0..TASKS)
        .map(|i| json!({"name": format!("t{i}"), "queue": "wfq", "depends_on": deps}))
        .collect();
    let (s, out) = dci.post("/graphs", json!({"tasks": tasks})).await;
    assert_eq!(s, 200, "{out}");
    let graph = out["graph"].as_str().expect("graph id").to_string();
    let first = ObjectId::parse_str(out["ids"]["t0"].as_str().expect("t0")).expect("id");
    let stored = db.task(first).await;
    let stored_deps = stored.get_array("depends_on").expect("depends_on");
    assert_eq!(stored_deps.len(), DISTINCT, "{stored_deps:?}");
    assert_eq!(
        stored.get_array("waiting_on").expect("waiting_on").len(),
        DISTINCT
    );
    let after_create = peak_mib(&dci);
    assert!(
        after_create < 200,
        "creating the graph took the DCI to {after_create} MiB"
    );
    // Three readers at once, each answer about 65 MB, streamed.
    let read = |dci_url: String, http: reqwest::Client| async move {
        let r = http.get(dci_url).send().await.expect("GET the graph");
        assert_eq!(r.status().as_u16(), 200);
        r.bytes().await.expect("the graph's answer")
    };
    let url = dci.at(&format!("/graphs/{graph}"));
    let (a, b, c) = tokio::join!(
        read(url.clone(), dci.http.clone()),
        read(url.clone(), dci.http.clone()),
        read(url, dci.http.clone()),
    );
    assert!(a.len() > 50_000_000, "{} bytes", a.len());
    assert_eq!((a.len(), a.len()), (b.len(), c.len()));
    let after_reads = peak_mib(&dci);
    assert!(
        after_reads < 200,
        "three reads of the graph took the DCI to {after_reads} MiB"
    );
    let whole: Value = serde_json::from_slice(&a).expect("the answer is JSON");
    assert_eq!(whole["size"], json!(TASKS));
    assert_eq!(whole["counts"], json!({"blocked": TASKS}));
    assert_eq!(whole["state"], json!("active"));
    let listed = whole["tasks"].as_array().expect("tasks");
    assert_eq!(listed.len(), TASKS);
    assert_eq!(
        listed[0]["waiting_on"].as_array().map(Vec::len),
        Some(DISTINCT)
    );
    drop(whole);
    eprintln!("DCI peak: {after_create} MiB after creating, {after_reads} MiB after three reads");
    drop(dci);
    db.drop().await;
}

/// A graph task's name is shown as written wherever it is shown, as a queue's is: control,
/// text-direction and invisible characters are refused, naming the character.
#[tokio::test]
async fn graph_task_names_with_hidden_characters_are_refused() {
    let db = TestDb::new("graph_names").await;
    db.insert_queue("wfq", "echo", 0).await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    for (name, code) in [
        ("a\u{1b}[31m", "U+001B"),
        ("evil\u{202e}txt", "U+202E"),
        ("t\u{200b}", "U+200B"),
        ("\u{2800}", "U+2800"),
        ("b ", "whitespace"),
    ] {
        let (s, out) = dci
            .post("/graphs", json!({"tasks": [{"name": "ok", "queue": "wfq"}, {"name": name, "queue": "wfq", "depends_on": ["ok"]}]}))
            .await;
        assert_eq!(s, 400, "{name:?}: {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("tasks[1].name") && error.contains(code),
            "{name:?}: {out}"
        );
    }
    assert_eq!(
        db.db
            .collection::<bson::Document>("graphs")
            .count_documents(doc! {})
            .await
            .expect("count"),
        0
    );
    let (s, out) = dci
        .post(
            "/graphs",
            json!({"tasks": [{"name": "résumé 履歴 👍", "queue": "wfq"}]}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    drop(dci);
    db.drop().await;
}

/// Cancelling the root of a 2 000-task chain answers before the cascade has gone far: the
/// cancel is written, the answer sent, and the chain is cancelled level by level after it,
/// each task with the reason naming its dependency.
#[tokio::test]
async fn a_deep_cancel_cascade_runs_after_the_answer() {
    const LEVELS: usize = 2_000;
    let db = TestDb::new("cascade").await;
    db.insert_queue("wfq", "echo", 0).await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let tasks: Vec<Value> = (0..LEVELS)
        .map(|i| match i {
            0 => json!({"name": "t0", "queue": "wfq"}),
            _ => json!({"name": format!("t{i}"), "queue": "wfq", "depends_on": [format!("t{}", i - 1)]}),
        })
        .collect();
    let (s, out) = dci.post("/graphs", json!({"tasks": tasks})).await;
    assert_eq!(s, 200, "{out}");
    let id = |name: &str| ObjectId::parse_str(out["ids"][name].as_str().expect("id")).expect("oid");
    let (root, first, last) = (id("t0"), id("t1"), id(&format!("t{}", LEVELS - 1)));
    let (s, body) = dci
        .post(&format!("/tasks/{}/cancel", root.to_hex()), json!({}))
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        db.task(root).await.get_i32("status").ok(),
        Some(status::CANCELLED)
    );
    // Answered with the root cancelled and the cascade still at its start: an answer after
    // the cascade would find the last level cancelled here.
    assert_eq!(
        db.task(last).await.get_i32("status").ok(),
        Some(status::BLOCKED)
    );
    disbatch_tests::wait_for(
        "the whole chain cancelled",
        std::time::Duration::from_secs(300),
        || async { db.task(last).await.get_i32("status").ok() == Some(status::CANCELLED) },
    )
    .await;
    assert_eq!(db.count(doc! {"status": -5}).await, LEVELS as u64);
    let reason = db
        .task(first)
        .await
        .get_str("cancel_reason")
        .unwrap_or_default()
        .to_string();
    assert_eq!(reason, format!("dependency \"t0\" ({root}) was cancelled"));
    drop(dci);
    db.drop().await;
}
