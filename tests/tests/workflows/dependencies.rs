//! Task dependencies on real DENs: a graph's tasks start only after what they wait for has
//! succeeded (from the attempt records), across three nodes and through one's SIGKILL; a
//! failure cancels what waits on it (with the reason) unless it runs anyway; bad graphs are
//! refused whole.

use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::{read_lines, wait_for, write_config, Dci, Den, TestDb, NOT_ENDED};
use serde_json::{json, Value};

pub(super) fn oid(v: &Value) -> ObjectId {
    let hex = v["$oid"].as_str().or(v.as_str()).expect("an id");
    ObjectId::parse_str(hex).expect("object id")
}

/// 50 tasks: one split fans out to 10 pieces, each piece has a follow-up, a diamond joins
/// them (top → left, right → bottom), 24 tasks fan out from the bottom and one merge fans in.
fn fifty_task_graph(queue: &str, params: &Value) -> (Vec<Value>, Vec<(String, Vec<String>)>) {
    let mut nodes: Vec<(String, Vec<String>)> = vec![("split".into(), vec![])];
    for i in 0..10 {
        nodes.push((format!("a{i}"), vec!["split".into()]));
        nodes.push((format!("b{i}"), vec![format!("a{i}")]));
    }
    nodes.push(("top".into(), (0..10).map(|i| format!("b{i}")).collect()));
    nodes.push(("left".into(), vec!["top".into()]));
    nodes.push(("right".into(), vec!["top".into()]));
    nodes.push(("bottom".into(), vec!["left".into(), "right".into()]));
    for i in 0..24 {
        nodes.push((format!("c{i}"), vec!["bottom".into()]));
    }
    nodes.push(("merge".into(), (0..24).map(|i| format!("c{i}")).collect()));
    assert_eq!(nodes.len(), 50);
    let tasks = nodes
        .iter()
        .map(|(name, deps)| json!({"name": name, "queue": queue, "params": params, "depends_on": deps}))
        .collect();
    (tasks, nodes)
}

/// Waits until none of `ids` is queued, claimed, running or blocked (cancelled tasks are not
/// `complete`).
pub async fn wait_ended(db: &TestDb, ids: &[ObjectId]) {
    let live = doc! {"_id": {"$in": ids.to_vec()}, "status": {"$in": NOT_ENDED.to_vec()}};
    wait_for("the tasks to end", Duration::from_secs(120), || async {
        db.count(live.clone()).await == 0
    })
    .await;
}

/// Every attempt of every task started at or after the end of each dependency's successful
/// attempt, and each task succeeded exactly once.
async fn check_order(
    db: &TestDb,
    nodes: &[(String, Vec<String>)],
    ids: &HashMap<String, ObjectId>,
) {
    let mut succeeded_end: HashMap<String, DateTime> = HashMap::new();
    let mut attempts: HashMap<String, Vec<Document>> = HashMap::new();
    for (name, _) in nodes {
        let records = db.closed_attempts(ids[name], 1).await;
        let ok: Vec<&Document> = records
            .iter()
            .filter(|a| a.get_str("outcome") == Ok("succeeded"))
            .collect();
        assert_eq!(ok.len(), 1, "{name} succeeded once: {records:?}");
        succeeded_end.insert(name.clone(), *ok[0].get_datetime("end").expect("end"));
        attempts.insert(name.clone(), records);
    }
    for (name, deps) in nodes {
        for a in &attempts[name] {
            let start = *a.get_datetime("start").expect("start");
            for d in deps {
                assert!(
                    start >= succeeded_end[d],
                    "{name} started at {start} before its dependency {d} ended at {}",
                    succeeded_end[d]
                );
            }
        }
    }
}

async fn graph_on_three_dens(test: &str, kill_one: bool) {
    let db = TestDb::new(test).await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("g", "echo", 6).await;
    // Lost attempts (the SIGKILLed node's) come back soon and run again.
    db.set_queue(queue, doc! {"lease": 3, "on_lost": "requeue"})
        .await;
    let dci = Dci::start(&config);
    let runs = db.path("runs.txt");
    let params = json!({"sleep_ms": 50, "append_to": runs.to_string_lossy()});
    let (tasks, nodes) = fifty_task_graph("g", &params);
    let mut dens = vec![
        Den::start(&config, "n1"),
        Den::start(&config, "n2"),
        Den::start(&config, "n3"),
    ];
    let (s, out) = dci.post("/graphs", json!({"tasks": tasks})).await;
    assert_eq!(s, 200, "{out}");
    let ids: HashMap<String, ObjectId> = out["ids"]
        .as_object()
        .expect("ids by name")
        .iter()
        .map(|(k, v)| (k.clone(), oid(v)))
        .collect();
    assert_eq!(ids.len(), 50);
    let graph = out["graph"].as_str().expect("graph id").to_string();
    // Waiting tasks say so, and on what.
    let (s, view) = dci.get(&format!("/graphs/{graph}")).await;
    assert_eq!(s, 200, "{view}");
    let merge = view["tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == "merge"))
        .expect("merge in the view")
        .clone();
    assert_eq!(
        merge["depends_on"].as_array().map(Vec::len),
        Some(24),
        "{merge}"
    );
    if kill_one {
        // In the middle: once the diamond's top has run, while the rest waits behind it.
        let top = ids["top"];
        wait_for(
            "the diamond's top to end",
            Duration::from_secs(120),
            || async { db.task(top).await.get_i32("status") == Ok(status::SUCCEEDED) },
        )
        .await;
        dens[1].kill_hard();
    }
    let all: Vec<ObjectId> = ids.values().copied().collect();
    db.wait_complete(&all, Duration::from_secs(240)).await;
    check_order(&db, &nodes, &ids).await;
    let merge_runs = read_lines(&runs)
        .iter()
        .filter(|l| l.as_str() == ids["merge"].to_hex())
        .count();
    assert_eq!(merge_runs, 1, "the fan-in ran once");
    let (s, view) = dci.get(&format!("/graphs/{graph}")).await;
    assert_eq!(s, 200);
    assert_eq!(view["state"], "succeeded", "{}", view["counts"]);
    assert_eq!(view["counts"]["succeeded"], 50);
    drop(dens);
}

#[tokio::test]
async fn a_fifty_task_graph_runs_each_task_after_its_dependencies_on_three_dens() {
    graph_on_three_dens("wf_graph3", false).await;
}

#[tokio::test]
async fn a_graph_still_runs_in_order_when_a_den_is_killed_in_the_middle() {
    graph_on_three_dens("wf_graph3_kill", true).await;
}

#[tokio::test]
async fn a_failure_cancels_what_waits_on_it_with_the_reason_unless_it_runs_anyway() {
    let db = TestDb::new("wf_failure").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("w", "echo", 4).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let ok = json!({"sleep_ms": 10});
    let (s, out) = dci
        .post(
            "/graphs",
            json!({"tasks": [
                {"name": "root", "queue": "w", "params": ok},
                {"name": "bad", "queue": "w", "params": {"exit_code": 1}, "depends_on": ["root"]},
                {"name": "good", "queue": "w", "params": ok, "depends_on": ["root"]},
                {"name": "child", "queue": "w", "params": ok, "depends_on": ["bad"]},
                {"name": "grandchild", "queue": "w", "params": ok, "depends_on": ["child", "good"]},
                {"name": "sibling", "queue": "w", "params": ok, "depends_on": ["good"]},
                {"name": "anyway", "queue": "w", "params": ok, "depends_on": ["bad"], "on_dependency_failure": "run"},
            ]}),
        )
        .await;
    assert_eq!(s, 200, "{out}");
    let id = |name: &str| oid(&out["ids"][name]);
    let ended = [
        "root",
        "bad",
        "good",
        "child",
        "grandchild",
        "sibling",
        "anyway",
    ]
    .map(id);
    wait_ended(&db, &ended).await;
    let status = |d: &Document| d.get_i32("status").expect("status");
    let child = db.task(id("child")).await;
    let grandchild = db.task(id("grandchild")).await;
    assert_eq!(status(&child), -5, "{child}");
    assert_eq!(status(&grandchild), -5, "{grandchild}");
    let reason = child.get_str("cancel_reason").expect("a reason");
    assert!(
        reason.contains(&id("bad").to_hex()) && reason.contains("failed"),
        "{reason}"
    );
    let reason = grandchild.get_str("cancel_reason").expect("a reason");
    assert!(
        reason.contains(&id("child").to_hex()) && reason.contains("cancelled"),
        "{reason}"
    );
    assert!(
        db.attempts(id("child")).await.is_empty(),
        "a cancelled dependent never ran"
    );
    for name in ["good", "sibling", "anyway"] {
        assert_eq!(status(&db.task(id(name)).await), 1, "{name} ran");
    }
    // A task created later on a failed dependency is cancelled at once; with "run", it runs.
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [ok], "depends_on": [id("bad").to_hex()]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let late = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    assert_eq!(status(&db.task(late).await), status::CANCELLED);
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [ok], "depends_on": [{"$oid": id("bad").to_hex()}], "on_dependency_failure": "run"}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let runs_anyway = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    db.wait_complete(&[runs_anyway], Duration::from_secs(60))
        .await;
    assert_eq!(status(&db.task(runs_anyway).await), status::SUCCEEDED);
    // A queue's default policy applies where the task names none.
    db.insert_queue("lenient", "echo", 4).await;
    let (s, q) = dci.get("/queues/lenient").await;
    assert_eq!(s, 200, "{q}");
    db.db
        .collection::<Document>("queues")
        .update_one(
            doc! {"name": "lenient"},
            doc! {"$set": {"on_dependency_failure": "run"}},
        )
        .await
        .expect("queue policy");
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "lenient", "params": [ok], "depends_on": [id("bad").to_hex()]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let lenient = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    db.wait_complete(&[lenient], Duration::from_secs(60)).await;
    assert_eq!(
        status(&db.task(lenient).await),
        1,
        "the queue's policy ran it"
    );
    drop(den);
}

#[tokio::test]
async fn a_waiting_task_is_blocked_until_its_dependency_succeeds_and_units_can_wait_too() {
    let db = TestDb::new("wf_wait").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("w", "echo", 4).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let gate = db.path("gate");
    let started = db.path("started.txt");
    let held =
        json!({"hold_until": gate.to_string_lossy(), "append_to": started.to_string_lossy()});
    let (s, made) = dci
        .post("/tasks", json!({"queue": "w", "params": [held]}))
        .await;
    assert_eq!(s, 200, "{made}");
    let first = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    let (s, made) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [{"n": 1}], "depends_on": [first.to_hex()]}),
        )
        .await;
    assert_eq!(s, 200, "{made}");
    let second = oid(&made["MongoDB::InsertManyResult"]["inserted"][0]["_id"]);
    let (s, units) = dci
        .post(
            "/queues/w/units",
            json!({"units": [{"key": "u", "params": {"n": 2}, "depends_on": [second.to_hex()]}]}),
        )
        .await;
    assert_eq!(s, 200, "{units}");
    let unit = oid(&units["inserted"][0]["_id"]);
    wait_for(
        "the first task to start",
        Duration::from_secs(60),
        || async { read_lines(&started).len() == 1 },
    )
    .await;
    // Updating the waiting unit leaves it waiting: queued again, it would start early.
    let (s, again) = dci
        .post(
            "/queues/w/units",
            json!({"units": [{"key": "u", "params": {"n": 3}}], "on_conflict": "update"}),
        )
        .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["busy"], json!(["u"]), "{again}");
    for waiting in [second, unit] {
        let t = db.task(waiting).await;
        assert_eq!(t.get_i32("status"), Ok(status::BLOCKED), "{t}");
        assert!(t.get_array("waiting_on").is_ok_and(|w| w.len() == 1), "{t}");
    }
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[first, second, unit], Duration::from_secs(60))
        .await;
    for t in [second, unit] {
        let t = db.task(t).await;
        assert_eq!(t.get_i32("status"), Ok(status::SUCCEEDED), "{t}");
        assert!(
            t.get("waiting_on").is_none(),
            "released tasks wait on nothing: {t}"
        );
    }
    let first_end = *db.attempts(first).await[0]
        .get_datetime("end")
        .expect("end");
    let second_start = *db.attempts(second).await[0]
        .get_datetime("start")
        .expect("start");
    assert!(second_start >= first_end);
    drop(den);
}

#[tokio::test]
async fn bad_graphs_and_dependencies_are_refused_whole_with_a_clear_error() {
    let db = TestDb::new("wf_refused").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("w", "echo", 0).await;
    let dci = Dci::start(&config);
    let before = db.count(doc! {}).await;
    let refused = [
        (
            json!({"tasks": [
            {"name": "a", "queue": "w", "depends_on": ["c"]},
            {"name": "b", "queue": "w", "depends_on": ["a"]},
            {"name": "c", "queue": "w", "depends_on": ["b"]}]}),
            "cycle",
        ),
        (
            json!({"tasks": [{"name": "a", "queue": "w", "depends_on": ["nobody"]}]}),
            "\"nobody\"",
        ),
        (
            json!({"tasks": [{"name": "a", "queue": "w"}, {"name": "a", "queue": "w"}]}),
            "already the name",
        ),
        (
            json!({"tasks": [{"name": "a", "queue": "w", "depends_on": [ObjectId::new().to_hex()]}]}),
            "no task has the id",
        ),
        (
            json!({"tasks": [{"name": "a", "queue": "nope"}]}),
            "not found",
        ),
        (
            json!({"tasks": [{"name": "a", "queue": "w", "on_dependency_failure": "maybe"}]}),
            "on_dependency_failure",
        ),
        (json!({"tasks": []}), "non-empty"),
        (
            json!({"tasks": [{"name": "a", "queue": "w", "colour": 1}]}),
            "unknown field",
        ),
    ];
    for (body, says) in refused {
        let (s, out) = dci.post("/graphs", body.clone()).await;
        assert_eq!(s, 400, "{body} → {out}");
        let error = out["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{body}: {out} should say {says}");
    }
    let (s, out) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [{}], "depends_on": ["not-an-id"]}),
        )
        .await;
    assert_eq!(s, 400, "{out}");
    let (s, out) = dci
        .post(
            "/tasks",
            json!({"queue": "w", "params": [{"x": 1}], "depends_on": [ObjectId::new().to_hex()]}),
        )
        .await;
    assert_eq!(s, 400, "{out}");
    assert!(out.to_string().contains("no task has the id"), "{out}");
    assert_eq!(db.count(doc! {}).await, before, "nothing stored");
    let graphs = db
        .db
        .collection::<Document>("graphs")
        .count_documents(doc! {})
        .await
        .expect("count");
    assert_eq!(graphs, 0);
    let (s, out) = dci
        .get(&format!("/graphs/{}", ObjectId::new().to_hex()))
        .await;
    assert_eq!(s, 404, "{out}");
    let (s, _) = dci.get("/graphs/nonsense").await;
    assert_eq!(s, 400);
}
