//! A graph on a mixed fleet: the real Disbatch 4.103 Perl DEN beside one of ours. The Perl
//! node claims only queued (-2) tasks, so it never starts a waiting (-4) one; the ends it
//! writes (a bare status, no settling) are settled by our maintenance leader's sweep. Judged
//! in the server's order of writes, from a change stream. That the Perl node takes part is
//! made certain, not left to who polls first: ours runs one task at a time (`maxthreads` 1)
//! and holds the first piece it gets on a gate that opens only once the Perl node has claimed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bson::doc;
use bson::oid::ObjectId;
use bson::Document;
use disbatch_tests::claim_order::{Change, Recording};
use disbatch_tests::peers::perl_den::PerlDen;
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb, NOT_ENDED};
use serde_json::{json, Value};

const DEMO: &str = "Disbatch::Plugin::Demo";

#[tokio::test]
async fn a_perl_node_never_starts_a_waiting_task_and_its_ends_release_dependents() {
    if !disbatch_tests::peers::perl_den::available("mixed_fleet_workflows") {
        return;
    }
    let db = TestDb::new("mixed_workflows").await;
    // Ours runs the Perl plugin's queue with the echo plugin (it ignores `commands`).
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {DEMO: disbatch_tests::echo_plugin()}}),
    );
    db.insert_queue("mixed", DEMO, 4).await;
    let perl_node = format!("perl-wf-{}", std::process::id());
    let perl = PerlDen::start(&db, &perl_node);
    let deadline = Instant::now() + Duration::from_secs(60);
    while db
        .db
        .collection::<Document>("nodes")
        .count_documents(doc! {"node": &perl_node})
        .await
        .expect("count")
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the Perl DEN never heartbeat: {}",
            perl.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.db
        .collection::<Document>("nodes")
        .insert_one(doc! {"node": "rust-a", "maxthreads": 1})
        .await
        .expect("node doc");
    let dci = Dci::start(&config);
    let ours = Den::start(&config, "rust-a");
    let recording = Recording::start(db.tasks()).await;
    // root → 12 pieces → 12 follow-ups → merge: 26 tasks, three levels of waiting.
    let params = json!({"commands": "a", "sleep_ms": 100});
    // The Perl plugin ignores `hold_until`; ours waits on it, so while ours holds a piece the
    // other eleven are queued and only the Perl node (the queue has 3 threads left) can run them.
    let gate = db.path("perl-claimed");
    let held = json!({"commands": "a", "hold_until": gate.to_string_lossy()});
    let mut tasks = vec![json!({"name": "root", "queue": "mixed", "params": params})];
    for i in 0..12 {
        tasks.push(json!({"name": format!("p{i}"), "queue": "mixed", "params": held, "depends_on": ["root"]}));
        tasks.push(json!({"name": format!("f{i}"), "queue": "mixed", "params": params, "depends_on": [format!("p{i}")]}));
    }
    let fans: Vec<String> = (0..12).map(|i| format!("f{i}")).collect();
    tasks.push(json!({"name": "merge", "queue": "mixed", "params": params, "depends_on": fans}));
    let (s, out) = dci.post("/graphs", json!({"tasks": tasks.clone()})).await;
    assert_eq!(s, 200, "{out}");
    let ids: HashMap<String, ObjectId> = out["ids"]
        .as_object()
        .expect("ids")
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                ObjectId::parse_str(v.as_str().expect("hex")).expect("id"),
            )
        })
        .collect();
    let all: Vec<ObjectId> = ids.values().copied().collect();
    wait_for(
        "the Perl node to claim a piece",
        Duration::from_secs(240),
        || async {
            db.count(doc! {"_id": {"$in": all.clone()}, "node": &perl_node})
                .await
                > 0
        },
    )
    .await;
    std::fs::write(&gate, b"open").expect("open the gate");
    let live = doc! {"_id": {"$in": all.clone()}, "status": {"$in": NOT_ENDED.to_vec()}};
    wait_for("the graph to end", Duration::from_secs(240), || async {
        db.count(live.clone()).await == 0
    })
    .await;
    let changes = recording.finish().await;
    drop(ours);
    drop(perl);

    check_no_claim_came_before_its_dependencies_succeeded(&ids, &tasks, &changes, &perl_node);
}

fn check_no_claim_came_before_its_dependencies_succeeded(
    ids: &HashMap<String, ObjectId>,
    tasks: &[Value],
    changes: &[Change],
    perl_node: &str,
) {
    let name_of: HashMap<ObjectId, &str> = ids.iter().map(|(k, v)| (*v, k.as_str())).collect();
    let deps: HashMap<&str, Vec<String>> = tasks
        .iter()
        .filter_map(|t| {
            let name = t["name"].as_str()?;
            let d = t["depends_on"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            Some((name, d))
        })
        .collect();
    // Position of each task's success, and of each claim (by which node).
    let mut succeeded: HashMap<&str, usize> = HashMap::new();
    let mut claims: Vec<(usize, &str, String)> = Vec::new();
    for (at, c) in changes.iter().enumerate() {
        let Some(name) = name_of.get(&c.task()) else {
            continue;
        };
        match c.status() {
            Some(1) => {
                succeeded.entry(name).or_insert(at);
            }
            Some(-1) | Some(0) if c.node().is_some() => {
                claims.push((at, name, c.node().unwrap_or_default().to_string()))
            }
            _ => {}
        }
    }
    assert_eq!(succeeded.len(), 26, "every task succeeded");
    let perl_claims = claims.iter().filter(|(_, _, n)| *n == perl_node).count();
    assert!(perl_claims > 0, "the Perl node took part: {claims:?}");
    assert!(claims.len() > perl_claims, "ours took part: {claims:?}");
    for (at, name, node) in &claims {
        for d in &deps[name] {
            assert!(
                succeeded[d.as_str()] < *at,
                "{name} claimed by {node} at change {at}, before its dependency {d} succeeded (change {})",
                succeeded[d.as_str()]
            );
        }
    }
    eprintln!(
        "mixed fleet graph: {} claims, {perl_claims} by the Perl node",
        claims.len()
    );
}
